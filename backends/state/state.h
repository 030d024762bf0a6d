/* SPDX-License-Identifier: MIT */
/*
 * backends.h: the internal interface of the keyed-state backend: workers,
 * state handles, and the helpers every state kind shares (lookups, reads,
 * copy-on-write writes, TTL) over the keyed store of the arena's backend
 * (backends/store/store.h).
 */
#ifndef STASH_BACKENDS_H
#define STASH_BACKENDS_H

#include "backends/store/store.h"
#include "shm/hash.h"

/* Bytes in memory someone else owns: an operator-state blob. */
typedef struct ckpt_blob {
    const uint8_t *data;
    uint64_t len;
} ckpt_blob;

/* A worker: one process's membership of an arena's registry, its current
 * key, and the state handles it was given. */
struct stash_worker {
    stash_arena *arena;
    uint32_t slot;
    stash_kg_range range;
    uint32_t max_parallelism;
    stash_clock_fn *clock;
    void *clock_ctx;
    stash_cut_fn *on_cut;
    void *cut_ctx;
    uint8_t *key;
    size_t key_cap;
    uint16_t klen;
    bool has_key;
    uint32_t kg;       /* of the current key */
    uint64_t key_hash; /* of the current key */
    /* While the arena is restored lazily: returns once key group kg is in
     * the arena, or an error; NULL once it all is (worker.c sets it). */
    int (*kg_await)(struct stash_worker *w, uint32_t kg);
    /* The seed of the worker's last lookup, and the current key's lookup
     * hash under it: stash_key_set computes it and prefetches its entry,
     * which the next access most likely looks up again. */
    uint64_t last_seed;
    uint32_t last_hash;
    /* The current key may take the one-step accesses of value.c (of a
     * one-step state, which only a store with records in the arena has): 8
     * to 16 bytes long, in a key group the worker owns. */
    bool one_step_key;
    uint64_t writes;  /* every write by this worker: invalidates its iterators */
    shm_ctl_ops *ops; /* its index's operation counters; NULL for a reader */
    struct stash_state *states;
    struct stash_timers *timers; /* the worker's timer services (timers.c) */
    uint64_t watermark;          /* the highest of its services' watermarks */
    uint32_t parallelism;
    uint64_t cut_id;       /* the newest checkpoint this worker cut */
    uint64_t seen_done;    /* the newest completion reported by stash_barrier */
    uint64_t seen_aborted; /* the newest abort reported */
    /* A rollback's outcome, reported once by the next barrier: the
     * checkpoint restored, and why newer ones were passed over ("" none). */
    uint64_t rolled_back_to;
    char rollback_why[640];
    /* After a rollback: the operator state of the restored checkpoint, which
     * the worker's operator states load from when registered (op_blobs set;
     * op_p 0 when the checkpoint was taken before any worker joined). */
    uint32_t op_p;
    ckpt_blob *op_blobs;
    uint8_t *op_mem;
    store *store; /* the keyed store of the arena's backend */
    /* store->ops->in_arena, at hand for the hot paths: lookups prefetch,
     * values may take the one-step paths. */
    bool records_in_arena;
    /* The handle was inherited through a fork: it is its opener's, and this
     * process may only close it (worker.c). */
    bool forked;
    bool in_batch; /* a batch's handlers run (batch.c): no barrier */
    /* A reader (stash_reader_open): no registry slot, no key group, no
     * barrier; slot is STASH_MAX_WORKERS + its reader slot (shm_ebr_enter). */
    bool reader;
    struct stash_worker *next_open; /* the process's open workers */
    bool has_ttl;                   /* a state of this worker expires entries */
    bool ttl_every_record;          /* a state of it cleans at every stash_key_set */
    uint64_t ttl_swept_ns;          /* when barriers last cleaned expired entries */
    uint32_t ttl_sweep_kg;          /* the key group they clean next, from the worker's range */
};

/* Operator state held by a worker: copies of its elements (lists) or
 * entries (broadcast maps; keys unused for lists). */
typedef struct op_entries {
    uint8_t **mem;
    stash_bytes *keys;
    stash_bytes *values;
    size_t n, cap;
} op_entries;

/* Returns once key group kg is in the arena (a lazy restore may still be
 * bringing it), or an error naming it. */
static inline int state_kg_ready(struct stash_worker *w, uint32_t kg)
{
    return __builtin_expect(w->kg_await != NULL, 0) ? w->kg_await(w, kg) : 0;
}

/* The counter kind (SHM_OPS_*) of a keyed state kind. */
static inline int state_ops_kind(stash_kind k)
{
    return k == STASH_LIST                                 ? SHM_OPS_LIST
           : k == STASH_MAP                                ? SHM_OPS_MAP
           : k == STASH_REDUCING || k == STASH_AGGREGATING ? SHM_OPS_MERGING
                                                           : SHM_OPS_VALUE;
}

/* Counts one state operation of the worker's: kind SHM_OPS_*, a read or a
 * write. Only the worker writes its line; relaxed, no locked instruction. */
static inline void state_count(const stash_worker *w, int kind, bool write)
{
    if (!w->ops) return;
    _Atomic uint64_t *c = write ? &w->ops->writes[kind] : &w->ops->reads[kind];
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

static inline bool opstate_kind(stash_kind k)
{
    return k == STASH_OP_LIST || k == STASH_OP_UNION || k == STASH_OP_BROADCAST;
}

/* Whether the operator-state blob records a state of kind k: operator
 * state, and a timer service's watermark. */
static inline bool opstate_recorded(stash_kind k)
{
    return opstate_kind(k) || k == STASH_TIMERS;
}

/* A process's handle on a registered state. */
struct stash_state {
    stash_worker *w;
    struct stash_state *next;
    uint16_t id;
    stash_kind kind;
    stash_ttl ttl;
    stash_combine_fn *reduce;
    stash_aggregate_fns agg;
    void *ctx;
    uint8_t *defval;
    size_t deflen;
    uint8_t *ns;
    size_t ns_cap;
    uint16_t nslen;
    uint64_t seed; /* the id and the namespace's part of lookup hashes (shm/hash.h) */
    /* A ValueState without TTL in an empty namespace or one of 8 to 16
     * bytes, its records in the arena: its gets and puts may take the
     * one-step paths of value.c, which find records by name, its records'
     * shm_name_word but for the key length. */
    bool one_step;
    uint64_t name;
    /* The size class of the record its last one-step access found, and the
     * bytes of that class: what the next one fetches with a record's header. */
    uint8_t fetch_class;
    uint32_t fetch_bytes;
    uint8_t *scratch; /* copies of other workers' values, function results */
    size_t scratch_cap;
    uint8_t *scratch2; /* a second buffer for combining functions */
    size_t scratch2_cap;
    uint32_t map_layouts; /* rebuilds of this state's maps (map.c): map iterators go stale */
    uint32_t keys_iters;  /* keys iterations started; the newest owns keys_after */
    uint8_t
        *keys_after; /* the resume bytes of the entry it returned last, for stores that need them */
    size_t keys_after_cap;
    uint8_t *scan; /* the keys and namespaces the newest keys iteration copied out of a key group */
    size_t scan_cap;
    op_entries op;      /* operator state kinds */
    uint64_t watermark; /* a timer service's */
};

/* TTL timestamps are stored as 8 bytes before a value or element. */
#define TTL_BYTES 8u
/* A state's options in the catalog: the TTL (8 bytes), its update and
 * visibility, and the byte that asks full snapshots to leave out what
 * expired. */
#define STATE_OPT_CLEANUP_FULL_SNAPSHOT 10
#define STATE_OPT_EVENT_TIME 11 /* the TTL's time is the worker's watermark */

/* Stores value as the current key's value of a value, reducing or
 * aggregating state s as it is (an accumulator is not combined), stamped
 * with the worker's clock where s has a TTL; an empty value removes the
 * entry (value.c). */
int state_put_raw(stash_state *s, const void *value, size_t len);

/* The TTL a state's options (catalog or checkpoint metadata) describe (register.c). */
void state_ttl_of_options(const uint8_t options[32], stash_ttl *out);
/* The inverse: a TTL setting as the catalog's and the metadata's options. */
void state_options_of_ttl(const stash_ttl *ttl, uint8_t out[32]);
/* Whether ttl is a setting state name of kind may have (no TTL for
 * operator state or timers). Returns 0 or -EINVAL naming the state. */
int state_ttl_check(const char *name, stash_kind kind, const stash_ttl *ttl);

static inline bool state_has_ttl(const stash_state *s)
{
    return s->ttl.ttl_ms > 0;
}
static inline size_t state_ts_bytes(const stash_state *s)
{
    return state_has_ttl(s) ? TTL_BYTES : 0;
}

/* The current key's lookup hash under seed, kept for the next access. */
static inline __attribute__((always_inline)) uint32_t worker_lookup_hash(stash_worker *w,
                                                                         uint64_t seed)
{
    if (__builtin_expect(seed != w->last_seed, 0)) {
        w->last_seed = seed;
        w->last_hash = shm_lookup_hash(w->key_hash, seed);
    }
    return w->last_hash;
}

/* Fills l with the current key and the namespace (ns, nslen) whose part of
 * the lookup hash is seed; STASH_ENOKEY without a current key. */
static inline int state_lookup_seeded(const stash_state *s, const void *ns, uint16_t nslen,
                                      uint64_t seed, shm_lookup *l)
{
    stash_worker *w = s->w;
    if (!w->has_key) return shm_fail(STASH_ENOKEY, "state access without a current key");
    l->kg = w->kg;
    l->hash = worker_lookup_hash(w, seed);
    l->state = s->id;
    l->klen = w->klen;
    l->nslen = nslen;
    l->key = w->key;
    l->ns = nslen ? ns : ""; /* never NULL: memcmp and memcpy take it */
    return 0;
}
/* Fills l with the current key and the namespace (ns, nslen). */
static inline int state_lookup_ns(const stash_state *s, const void *ns, uint16_t nslen,
                                  shm_lookup *l)
{
    return state_lookup_seeded(s, ns, nslen, shm_lookup_seed(s->id, shm_ns_hash(ns, nslen)), l);
}
/* Fills l with the current key and the state's namespace. */
static inline int state_lookup(const stash_state *s, shm_lookup *l)
{
    return state_lookup_seeded(s, s->ns, s->nslen, s->seed, l);
}
/* Sets what follows from s's namespace (of hash ns_hash): its part of
 * lookup hashes, and whether its values may take the one-step paths. */
void state_namespace_set(stash_state *s, uint64_t ns_hash);
/* Whether the worker owns key group kg. */
static inline bool state_owns(const stash_state *s, uint32_t kg)
{
    return kg >= s->w->range.first && kg <= s->w->range.last;
}
/* -EINVAL naming fn if values[0 .. n-1] is NULL (with n > 0) or holds NULL
 * bytes with a length, STASH_ETOOBIG if one is longer than a record holds. */
int state_check_array(const stash_bytes *values, size_t n, const char *fn, const char *what);

/* Leaves the worker without a current key: every access fails with
 * STASH_ENOKEY until one is set (the one-step paths too, which never look
 * at has_key). */
static inline void worker_drop_key(stash_worker *w)
{
    w->has_key = false;
    w->one_step_key = false;
}

/* Makes key (len bytes, at most 65535, its stash_hash hash) the worker's
 * current key, as stash_key_set() does. */
int worker_key_set_hashed(stash_worker *worker, const void *key, size_t len, uint64_t hash);

/* Flink's cleanup for every record, run by a key's change for the states
 * whose TTL asks for it (state.c). */
void worker_clean_on_record(stash_worker *w);

/* The rest of setting the current key, its len bytes in the worker's
 * buffer: its hash (given), its key group, and the lookup hash under the
 * seed of the worker's last lookup, whose home group it prefetches. */
static inline __attribute__((always_inline)) int worker_key_use(stash_worker *worker, size_t len,
                                                                uint64_t hash, bool short_key)
{
    worker->klen = (uint16_t)len;
    worker->key_hash = hash;
    uint32_t kg = shm_key_group_of(hash, worker->max_parallelism);
    int rc = state_kg_ready(worker, kg);
    if (__builtin_expect(rc != 0, 0)) {
        worker_drop_key(worker);
        return rc;
    }
    worker->kg = kg;
    worker->has_key = true;
    worker->last_hash = shm_lookup_hash(worker->key_hash, worker->last_seed);
    worker->one_step_key = short_key && kg >= worker->range.first && kg <= worker->range.last;
    if (worker->records_in_arena) shm_table_prefetch(worker->arena, kg, worker->last_hash);
    if (__builtin_expect(worker->ttl_every_record, 0)) worker_clean_on_record(worker);
    return 0;
}

/* Whether stash_key_set's common path takes key: 8 to 16 bytes, the
 * usual, that fit the worker's buffer. */
static inline __attribute__((always_inline)) bool worker_key_short(const stash_worker *worker,
                                                                   const void *key, size_t len)
{
    return len >= 8 && len <= 16 && worker && len <= worker->key_cap && key;
}

/* stash_key_set for a key worker_key_short takes: copied in two stores
 * and hashed inline. */
static inline __attribute__((always_inline)) int worker_key_set_short(stash_worker *worker,
                                                                      const void *key, size_t len)
{
    uint64_t head, tail;
    memcpy(&head, key, 8);
    memcpy(&tail, (const uint8_t *)key + len - 8, 8);
    memcpy(worker->key, &head, 8);
    memcpy(worker->key + len - 8, &tail, 8);
    return worker_key_use(worker, len, shm_key_hash(key, len), true);
}

/* STASH_EFORK with a message, for a handle inherited through a fork. */
int worker_refuse_forked(const stash_worker *w, const char *fn);

/* STASH_EKEYGROUP with a message, for a write outside the worker's range. */
int state_refuse_write(const stash_state *s, uint32_t kg);

/* The record operations of the worker's store (backends/store/store.h). */
static inline int state_find(stash_state *s, const shm_lookup *l, shm_cursor *c)
{
    store *st = s->w->store;
    return st->ops->find(st, l, c, false);
}
static inline bool state_rec_mutable(const stash_state *s, uint32_t kg, const shm_rec *rec)
{
    store *st = s->w->store;
    return st->ops->rec_mutable(st, kg, rec);
}
static inline uint64_t state_rec_capacity(const stash_state *s, const shm_rec *rec)
{
    const store *st = s->w->store;
    return st->ops->rec_capacity(st, rec);
}
static inline int state_rec_new(stash_state *s, const shm_lookup *l, size_t cap, shm_rec **rec)
{
    store *st = s->w->store;
    return st->ops->rec_new(st, l, cap, rec);
}
static inline bool state_rec_write_begin(stash_state *s, uint32_t kg, shm_rec *rec,
                                         const shm_region *r, unsigned n)
{
    store *st = s->w->store;
    return st->ops->write_begin(st, kg, rec, r, n);
}
static inline int state_rec_write_end(stash_state *s, uint32_t kg, shm_rec *rec)
{
    store *st = s->w->store;
    return st->ops->write_end(st, kg, rec);
}

/* Finds l's entry for a write, counting it (iterators of this worker go
 * stale), and returns a cursor for it. */
static inline int state_find_write(stash_state *s, const shm_lookup *l, shm_cursor *c)
{
    store *st = s->w->store;
    s->w->writes++;
    return st->ops->find(st, l, c, true);
}

/* As state_find_write, for a write that replaces the whole value and reads
 * nothing of the old one: a store whose publish needs no find skips it. */
static inline int state_find_overwrite(stash_state *s, const shm_lookup *l, shm_cursor *c)
{
    if (!s->w->store->ops->blind_put) return state_find_write(s, l, c);
    s->w->writes++;
    *c = (shm_cursor){0};
    return 0;
}

/* The value bytes of an owned record, in place. */
static inline stash_bytes state_rec_view(shm_rec *rec)
{
    return (stash_bytes){shm_rec_value(rec),
                         atomic_load_explicit(&rec->vlen, memory_order_relaxed)};
}
/* state_read for a key group the worker does not own: a private copy. */
int state_read_copy(stash_state *s, const shm_lookup *l, shm_cursor *c, stash_bytes *out);
/* Reads the value bytes of l's entry: a view for an owned key group, with c
 * filled for a following write (for a store of private copies only for
 * states with TTL and maps, the reads that may write next), a private copy
 * otherwise. Returns 0 or STASH_ENOTFOUND. */
static inline int state_read(stash_state *s, const shm_lookup *l, shm_cursor *c, stash_bytes *out)
{
    if (!state_owns(s, l->kg)) return state_read_copy(s, l, c, out);
    store *st = s->w->store;
    return st->ops->read_owned(st, l, c, out, state_has_ttl(s) || s->kind == STASH_MAP);
}

/* Starts a write of len value bytes to c's entry that overwrites the first
 * dirty bytes of the old value: the record itself when it may change in
 * place (its old bytes stay), else a new record of capacity at least cap
 * holding the first preserve bytes of the old value. Returns 1 for in place,
 * 0 for a new record, or a negative error. */
int state_write_begin(stash_state *s, const shm_lookup *l, shm_cursor *c, size_t len,
                      size_t preserve, size_t dirty, size_t cap, shm_rec **rec);
/* Finishes it: sets the value's length and publishes. Returns 0 or the
 * store's error. */
int state_write_end(stash_state *s, const shm_lookup *l, shm_cursor *c, shm_rec *rec, size_t len,
                    int in_place);
/* Replaces c's value with bytes (one call of begin and end). */
int state_write(stash_state *s, const shm_lookup *l, shm_cursor *c, const void *bytes, size_t len);
/* Deletes c's entry and counts the write. */
int state_delete(stash_state *s, const shm_lookup *l, shm_cursor *c);

/* Makes the worker's writes visible to other processes and to the cuts of
 * checkpoints (a barrier); with due, only where the store asks for it
 * between barriers. Returns 0 or the store's error. */
static inline int worker_commit(stash_worker *w, bool due)
{
    store *st = w->store;
    int (*commit)(store *) = due ? st->ops->commit_due : st->ops->commit;
    return commit ? commit(st) : 0;
}

/* Entries (of every state) in key group kg, as worker w sees them: its own
 * writes not yet committed included. Returns the count or an error. */
int64_t worker_kg_entries(stash_worker *w, uint32_t kg);

/* After a write to the owned entry l: out views its stored value again (in
 * the store rather than in a private copy). */
static inline int state_view(stash_state *s, const shm_lookup *l, shm_cursor *c, stash_bytes *out)
{
    store *st = s->w->store;
    return st->ops->view(st, l, c, out);
}

/* The TTL clock now, in milliseconds: the worker's, the state's. */
uint64_t worker_clock_ms(const stash_worker *w);
uint64_t state_now(const stash_state *s);
/* Whether a value written at ts has expired now: ts + ttl <= now, saturating. */
bool state_expired(const stash_state *s, uint64_t ts, uint64_t now);
/* Reads and writes an 8-byte timestamp at p (unaligned). */
uint64_t state_ts_get(const uint8_t *p);
void state_ts_put(uint8_t *p, uint64_t ts);
/* Examines a few records of the current key group for expired values
 * (Flink's incremental cleanup). */
void state_ttl_cleanup(stash_state *s, uint32_t kg);

/* Calls a combining function into s->scratch, growing it on -ENOSPC; *out views the result. */
int state_combine(stash_state *s, stash_combine_fn *fn, const stash_bytes *acc,
                  const stash_bytes *in, stash_bytes *out);

/* Namespace merges: folds a source namespace's stored bytes (timestamps
 * included) into the target entry, per kind (list.c, value.c). */
typedef int merge_into_fn(stash_state *s, const shm_lookup *target, const stash_bytes *raw);
merge_into_fn list_merge_into;
merge_into_fn merging_merge_into;

/* Calls a producing function into *buf, growing it on -ENOSPC; *out views the result. */
int state_produce(stash_state *s, stash_produce_fn *fn, const stash_bytes *acc, uint8_t **buf,
                  size_t *cap, stash_bytes *out);

/* Whether a value written at ts with a TTL of ttl_ms has expired at now:
 * ts + ttl <= now, saturating. */
static inline bool ttl_expired(uint64_t ts, uint64_t ttl_ms, uint64_t now)
{
    uint64_t expires = ts + ttl_ms;
    if (expires < ts) expires = UINT64_MAX; /* saturate: never wrap into the past */
    return expires <= now;
}

/* Full snapshots under cleanupFullSnapshot: copies the elements of a stored
 * list (with timestamps) that have not expired at now into out (len bytes
 * of room); returns the bytes kept (list.c). Marks the expired entries of
 * a stored map (a copy) gone; returns whether any is left (map.c). */
size_t list_keep_unexpired(const uint8_t *v, size_t len, uint64_t ttl_ms, uint64_t now,
                           uint8_t *out);
bool map_drop_expired(uint8_t *m, size_t len, uint64_t ttl_ms, uint64_t now);

/* Whether bytes are a well-formed stored list or map (with TTL timestamps
 * if ttl): what a restore checks before it trusts a checkpoint's values. */
bool list_bytes_valid(const uint8_t *v, size_t len, bool ttl);
bool map_bytes_valid(const uint8_t *v, size_t len, bool ttl);

/* One element of a stored list (key NULL, i its position) or entry of a
 * stored map (i its slot), with its timestamp (0 without TTL). */
typedef int state_item_fn(void *ctx, uint32_t i, const stash_bytes *key, const stash_bytes *value,
                          uint64_t ts);
/* Calls fn for each element of a well-formed stored list (list.c) or each
 * live entry of a stored map (map.c), in order; stops at fn's non-zero and
 * returns it, else 0. */
int list_bytes_each(const uint8_t *v, size_t len, bool ttl, state_item_fn *fn, void *ctx);
int map_bytes_each(const uint8_t *v, size_t len, bool ttl, state_item_fn *fn, void *ctx);

/* A well-formed stored list or map rewritten into out for a state whose
 * TTL is switched on or off: every element or entry given a timestamp (its
 * own if it had one, else now) if to_ttl, none if not; a map keeps its
 * slots and loses its dead bytes. out has room for 3 * len bytes; returns
 * the bytes written. */
size_t list_bytes_retime(const uint8_t *v, size_t len, bool from_ttl, bool to_ttl, uint64_t now,
                         uint8_t *out);
size_t map_bytes_retime(const uint8_t *v, size_t len, bool from_ttl, bool to_ttl, uint64_t now,
                        uint8_t *out);

/* Timers (timers.c): a timer is a record of its service's state (kind
 * STASH_TIMERS) under the timer's key, its namespace the domain (1 byte)
 * and the timestamp (8, big-endian) before the user's, its value empty. */
#define TIMER_NS_PREFIX 9u

/* The state a timer service's timers are records of (timers.c). */
stash_state *timers_state(const stash_timers *t);
/* Whether a record's namespace and value length are a timer's. */
bool timer_record_valid(const uint8_t *ns, size_t nslen, uint32_t vlen);
/* The worker's handle on the timer service name's state (register.c). */
int state_get_timers(stash_worker *worker, const char *name, stash_state **out);
/* Frees the worker's timer services. */
void timers_free_all(stash_worker *w);
/* Builds each timer service's heaps again from its key groups' records
 * (they changed under it: a fallback to an older checkpoint). */
int timers_rebuild_all(stash_worker *w);

/* Iterators (iter.c): the layout behind stash_iter. */
enum { ITER_LIST = 1, ITER_MAP = 2, ITER_KEYS = 3, ITER_TIMERS = 4, ITER_SCAN = 5 };
typedef struct iter_impl {
    uint8_t type;
    uint8_t filter_ns;
    uint16_t nslen;
    uint32_t pos; /* list: byte offset; map: slot; keys: scan position in the key group */
    stash_state *state;
    const uint8_t *blob; /* list, map: the bytes iterated */
    uint32_t blob_len;
    uint32_t last;   /* map: slot of the last entry returned, UINT32_MAX none */
    uint64_t writes; /* the worker's write count when it started */
    union {
        shm_rec *rec;     /* map over an owned key group: the record, for removals */
        uint32_t kg_last; /* keys: the last key group walked */
    };
    uint32_t kg;    /* keys: the key group walked */
    bool entered;   /* keys: the store's walk of kg has begun */
    const void *ns; /* keys: the namespace filter */
    uint64_t now;   /* TTL clock when it started */
    /* map: the key and namespace iterated and the state's map rebuilds when
     * the iterator last looked at its map (and the worker's writes then, in
     * writes): a write since then that rebuilt no map leaves its slots where
     * they were, and the iterator views the map again; keys: seed is the
     * number of the state's keys iteration it is, layout the key group's
     * layout when the walk entered it (store_walk) */
    uint64_t key_hash;
    uint64_t seed;
    uint32_t layout;
} iter_impl;
_Static_assert(sizeof(iter_impl) <= sizeof(stash_iter), "the iterator fits its public shell");

int list_iter_next(iter_impl *it, stash_bytes *value);
int map_iter_next(iter_impl *it, stash_bytes *key, stash_bytes *value);
int map_iter_remove(iter_impl *it);
/* After writes of the worker since the map iterator last looked: views the
 * map again if no rebuild of the state's maps moved its slots and the
 * current key and namespace are the iterator's, else STASH_ESTALE. */
int map_iter_sync(iter_impl *it);

#endif /* STASH_BACKENDS_H */
