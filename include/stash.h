/* SPDX-License-Identifier: MIT */
/*
 * stash.h: the public API of stash, a keyed-state service for co-located
 * worker processes that share one memory arena.
 *
 * Conventions: every function that can fail returns int, 0 on success and a
 * negative code otherwise (-errno for system errors, STASH_E* for ours);
 * stash_strerror() turns a code into words and stash_errmsg() gives the detail
 * of the last failure in the calling thread (which file, which worker).
 * Options are structs whose zero value means "default", except their first
 * member, sz (see "A stable ABI" below). Out-parameters come
 * last. Every object has an open/close or create/destroy pair, and the close
 * functions accept NULL. A NULL handle or out-parameter, and bytes given as
 * NULL with a non-zero length, are refused with -EINVAL (stash_errmsg()
 * names the argument) and change nothing; NULL with length 0 is the empty
 * byte string. Options and the arguments documented as optional may be NULL.
 * docs/architecture.md explains the model.
 */
#ifndef STASH_H
#define STASH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STASH_API __attribute__((visibility("default")))

#define STASH_VERSION_MAJOR 0
#define STASH_VERSION_MINOR 2
#define STASH_VERSION_PATCH 0

/*
 * A stable ABI. A program built against this header runs against any later
 * libstash.so.0: the soname's number changes only when a function is
 * removed or changes its meaning, and every function is exported under the
 * version node of the release that added it (STASH_0.1 for this one), so a
 * program needing a newer function fails at load time, not at the call.
 *
 * Every struct a caller fills and passes by pointer (the *_opts structs,
 * stash_state_desc, stash_aggregate_fns) starts with size_t sz, which the
 * caller sets to the struct's size as it was built:
 *
 *     stash_worker_opts o = {.sz = sizeof(stash_worker_opts), .parallelism = 4};
 *
 * A later release adds members only at a struct's end. The library reads a
 * smaller struct (an older program's) as if the members it lacks were zero,
 * and refuses a larger one (a newer program's) with -EINVAL if a member it
 * does not know is non-zero. sz 0 is refused with -EINVAL (stash_errmsg()
 * names the struct). Structs embedded by value (stash_ttl, stash_bytes) and
 * the elements of arrays (stash_snapshot_change, stash_kg_range) never
 * change. Structs without sz (the *_info structs, stash_kg_usage,
 * stash_op_counts, stash_snapshot_entry, stash_timer, stash_event), and
 * stash_state_desc as stash_state_describe() and stash_snapshot_state()
 * fill it, change only with a new version of each function that reads or
 * fills them; the old version, still exported, keeps the old layout.
 */

/* The version of the library linked, "MAJOR.MINOR.PATCH" (the macros above
 * are the header's): a program can compare the two at start. */
STASH_API const char *stash_version(void);

/* Flink's bounds: a key group is the unit of ownership, snapshot and rescale. */
#define STASH_DEFAULT_MAX_PARALLELISM 128u
#define STASH_MAX_MAX_PARALLELISM 32768u
/* Worker processes per arena (indices 0 .. STASH_MAX_WORKERS-1). */
#define STASH_MAX_WORKERS 1024u

/* Error codes of stash itself; system errors are returned as -errno. */
enum {
    STASH_ENOTARENA = -1000,    /* the file is not a stash arena (bad magic) */
    STASH_EVERSION = -1001,     /* the arena has another layout version */
    STASH_ETRUNCATED = -1002,   /* the arena file is shorter than its header says */
    STASH_EINCOMPLETE = -1003,  /* the arena's creation never finished */
    STASH_EFULL = -1004,        /* the arena has no memory left for this allocation */
    STASH_ETOOBIG = -1005,      /* the record is larger than the largest allocation */
    STASH_EBUSY = -1006,        /* the worker index is held by a live process */
    STASH_EPARALLELISM = -1007, /* the parallelism differs from the live workers' */
    STASH_ENOTFOUND = -1008,    /* no value for this key and namespace */
    STASH_EKEYGROUP = -1009,    /* a write to a key group this worker does not own */
    STASH_EKIND = -1010,        /* the state is registered with another kind or options */
    STASH_ESTALE = -1011,       /* the iterator was invalidated by a write */
    STASH_ENOKEY = -1012,       /* no current key is set */
    STASH_ECORRUPT = -1013,     /* a snapshot's bytes fail a check (checksum, length, magic) */
    STASH_EFORMAT = -1014,      /* a snapshot of another format version */
    STASH_ENOSERVICE = -1015,   /* no live service serves the arena */
    STASH_EABORTED = -1016,     /* the checkpoint failed; stash_errmsg() says why */
    STASH_EFORK = -1017,        /* a worker handle used in a process forked from its opener */
    STASH_EFENCED = -1018,      /* the arena's host lost its place in its job to another */
};

/* Words for an error code; never NULL, never to be freed. */
STASH_API const char *stash_strerror(int err);

/* The detailed message of the last error returned to this thread (names the
 * file, offset, key group or worker concerned); "" if none. Thread-local,
 * valid until the thread's next call into stash. */
STASH_API const char *stash_errmsg(void);

/* ------------------------------------------------------------------------ */
/* Key groups: Flink's formulas over xxHash's XXH3.                          */

/* An inclusive range of key groups; empty when first > last. */
typedef struct stash_kg_range {
    uint32_t first;
    uint32_t last;
} stash_kg_range;

/* The 64-bit XXH3 hash of a key's bytes (key NULL with a length: 0). */
STASH_API uint64_t stash_hash(const void *key, size_t len);

/* The key group of a key: stash_hash(key) mod max_parallelism; UINT32_MAX
 * if max_parallelism is outside 1 .. STASH_MAX_MAX_PARALLELISM or key is
 * NULL with a length. */
STASH_API uint32_t stash_key_group(const void *key, size_t len, uint32_t max_parallelism);

/* The index of the worker that owns key group kg: kg * parallelism / max_parallelism.
 * Returns it, or -EINVAL if the arguments are out of range. */
STASH_API int stash_kg_owner(uint32_t kg, uint32_t max_parallelism, uint32_t parallelism);

/* The empty range, which holds no key group (Flink's EMPTY_KEY_GROUP_RANGE). */
#define STASH_KG_RANGE_EMPTY ((stash_kg_range){1, 0})

/* 1 if range holds no key group, else 0. */
STASH_API int stash_kg_range_is_empty(stash_kg_range range);
/* How many key groups range holds (0 for an empty one). */
STASH_API uint32_t stash_kg_range_size(stash_kg_range range);
/* 1 if range holds key group kg, else 0. */
STASH_API int stash_kg_range_contains(stash_kg_range range, uint32_t kg);
/* The key groups a and b both hold: STASH_KG_RANGE_EMPTY if none. */
STASH_API stash_kg_range stash_kg_range_intersect(stash_kg_range a, stash_kg_range b);

/* The key-group range of worker index of parallelism:
 * [ceil(index * maxP / p), floor(((index + 1) * maxP - 1) / p)].
 * Returns 0, or -EINVAL if the arguments are out of range. */
STASH_API int stash_kg_range_of(uint32_t max_parallelism, uint32_t parallelism, uint32_t index,
                                stash_kg_range *out);

/* ------------------------------------------------------------------------ */
/* The arena: a named shared-memory file every worker maps.                  */

typedef struct stash_arena stash_arena;

enum {
    STASH_ARENA_REPLACE = 1u << 0, /* create: remove an existing arena of that name first */
    STASH_ARENA_GROUP = 1u << 1,   /* create: mode 0660 instead of 0600 */
};

/* Where an arena keeps keyed state (Flink's state backends). Operator state,
 * the registry and the control block are in the arena with either. */
typedef enum stash_backend {
    STASH_BACKEND_HEAP = 0, /* in the arena's own memory */
    STASH_BACKEND_LMDB = 1, /* in LMDB environments on disk, one per key group: larger than RAM */
} stash_backend;

typedef struct stash_arena_opts {
    size_t sz;        /* sizeof(stash_arena_opts) */
    const char *path; /* the backing file; NULL: /dev/shm/stash.NAME (may be on hugetlbfs) */
    uint64_t size;    /* create: bytes, fixed for the arena's life; 0: 64 MiB */
    uint32_t max_parallelism; /* create: key groups; 0: 128; at most 32768 */
    uint32_t flags;           /* STASH_ARENA_* */
    stash_backend backend;    /* create: where keyed state lives */
    /* create, lmdb: the directory of the environments (created if missing,
     * at most 255 bytes; this user's own, writable by no other user); NULL:
     * NAME.lmdb in this user's private state directory (/var/lib/stash for
     * root, $STATE_DIRECTORY, else /var/tmp/stash-UID) */
    const char *lmdb_dir;
} stash_arena_opts;

/* Creates the arena NAME and maps it. Fails with -EEXIST if it exists
 * (unless STASH_ARENA_REPLACE) and -EINVAL on a bad name or size. The caller
 * owns *out and releases it with stash_arena_close(). */
STASH_API int stash_arena_create(const char *name, const stash_arena_opts *opts, stash_arena **out);

/* Maps the existing arena NAME (opts may be NULL). Fails with -ENOENT,
 * STASH_ENOTARENA, STASH_EVERSION, STASH_ETRUNCATED or STASH_EINCOMPLETE and
 * changes nothing in the file. The caller owns *out. */
STASH_API int stash_arena_open(const char *name, const stash_arena_opts *opts, stash_arena **out);

/* Unmaps the arena; its contents stay. Accepts NULL. */
STASH_API void stash_arena_close(stash_arena *arena);

/* Removes the arena NAME's file. Processes that have it mapped keep their
 * mapping until they close it. Returns 0, -ENOENT or another -errno. */
STASH_API int stash_arena_destroy(const char *name, const stash_arena_opts *opts);

typedef struct stash_arena_info {
    char path[256];           /* the backing file */
    uint32_t layout_version;  /* of the arena's header and structures */
    uint32_t page_size;       /* of the mapping: 4 KiB, or the huge page size on hugetlbfs */
    uint64_t size;            /* bytes of the arena */
    uint64_t data_bytes;      /* bytes available to key-group heaps */
    uint64_t pool_free_bytes; /* of data_bytes, not yet given to any key group */
    uint32_t max_parallelism; /* number of key groups */
    int32_t creator_pid;      /* the process that created the arena */
    uint64_t created_ns;      /* creation time, ns since the epoch */
    int huge_pages;           /* 1 on hugetlbfs, 2 with transparent huge pages advised, 0 none */
    stash_backend backend;    /* where keyed state lives */
    char lmdb_dir[256];       /* lmdb: the environments' directory */
} stash_arena_info;

/* Fills *out with the arena's header facts. Returns 0. */
STASH_API int stash_arena_info_get(const stash_arena *arena, stash_arena_info *out);

typedef struct stash_kg_usage {
    uint64_t used_bytes; /* handed out to records (rounded up to the size class) */
    uint64_t free_bytes; /* held by the key group's heap, ready for reuse */
} stash_kg_usage;

/* Memory accounting of key group kg. Returns 0, or -EINVAL if kg is out of range. */
STASH_API int stash_kg_usage_get(const stash_arena *arena, uint32_t kg, stash_kg_usage *out);

/* ------------------------------------------------------------------------ */
/* Workers: processes that join the arena's registry as index i of p.        */

typedef struct stash_worker stash_worker;

/* A clock in milliseconds, for TTL; tests inject their own. */
typedef uint64_t stash_clock_fn(void *ctx);

/* Called at the barrier that cuts checkpoint_id for the worker, before its
 * state is cut (Flink's snapshotState): what it writes to keyed or operator
 * state is in the checkpoint, e.g. a sink's output staged for commit when
 * the checkpoint completes. It may not call stash_barrier(). A negative
 * return fails the checkpoint and is what that stash_barrier() returns. */
typedef int stash_cut_fn(stash_worker *worker, uint64_t checkpoint_id, void *ctx);

typedef struct stash_worker_opts {
    size_t sz;                     /* sizeof(stash_worker_opts) */
    uint32_t index;                /* this worker's index, 0 .. parallelism-1 */
    uint32_t parallelism;          /* number of workers; 0: 1 */
    const stash_arena_opts *arena; /* where the arena lives; NULL: defaults */
    stash_clock_fn *clock;         /* TTL clock; NULL: CLOCK_REALTIME in ms */
    void *clock_ctx;
    int rollback;         /* non-zero: restore this worker's key groups and operator state from the
                             service's newest complete checkpoint (a replacement after a failure) */
    stash_cut_fn *on_cut; /* called at each cut of this worker; NULL: none */
    void *cut_ctx;
} stash_worker_opts;

/* Attaches to the arena NAME and joins its registry as index i of p, taking
 * Flink's key-group range for it. Refused with STASH_EBUSY if a live process
 * holds that index and with STASH_EPARALLELISM if live workers run at another
 * parallelism; the slot of a dead worker is taken over and the worker goes
 * on from the live state it left, or, with rollback, from the newest
 * complete checkpoint once one the dead worker cut has ended
 * (STASH_ENOSERVICE without a service, -ENOENT without a checkpoint). The
 * caller owns *out. */
STASH_API int stash_worker_open(const char *name, const stash_worker_opts *opts,
                                stash_worker **out);

/* Records the worker's final operator state (after a checkpoint it cut has
 * ended), leaves the registry and detaches from the arena. Accepts NULL.
 * A handle belongs to the process that opened it: in a process forked after
 * the open, every call with it fails with STASH_EFORK (accesses with
 * STASH_ENOKEY) and close only frees the child's copy. */
STASH_API void stash_worker_close(stash_worker *worker);

typedef struct stash_reader_opts {
    size_t sz;                     /* sizeof(stash_reader_opts) */
    const stash_arena_opts *arena; /* where the arena lives; NULL: defaults */
    stash_clock_fn *clock;         /* the TTL clock its reads expire by; NULL: CLOCK_REALTIME */
    void *clock_ctx;
    /* non-zero: read the state as of the newest complete checkpoint of the
     * service serving the arena, not as it is now: one consistent view
     * across every key, fixed for the reader's life (STASH_ENOSERVICE if no
     * service ever wrote checkpoints of it, -ENOENT if none is complete) */
    int at_checkpoint;
    /* a checkpoint or savepoint directory to read instead of any arena
     * (NAME is then unused and may be NULL) */
    const char *checkpoint_dir;
} stash_reader_opts;

/* Attaches to the arena NAME as a reader: a worker handle that takes no
 * worker slot, owns no key group and joins no barrier, so it never blocks
 * or fails a checkpoint. Through it, stash_state_get() finds states workers
 * registered (STASH_ENOTFOUND if none has; no operator state or timer
 * service), and every keyed read works on any key of any key group, as a
 * copy (never torn, never blocking the owner); writes fail with
 * STASH_EKEYGROUP and stash_barrier() with -EINVAL. A reader that dies
 * leaves nothing behind. STASH_EBUSY if every reader slot (eight an arena,
 * two of them the persistence engine's) is held by a live process.
 * Reading a checkpoint (opts->at_checkpoint, opts->checkpoint_dir), the
 * reader reads a copy of it in this process's own memory, loaded at the
 * open (checked as a restore checks it: a damaged checkpoint is refused
 * naming its file and offset); stash_worker_arena() is then that copy's.
 * The caller owns *out and closes it with stash_worker_close(). */
STASH_API int stash_reader_open(const char *name, const stash_reader_opts *opts,
                                stash_worker **out);

/* The arena a worker is attached to; owned by the worker. */
STASH_API stash_arena *stash_worker_arena(const stash_worker *worker);

enum {
    STASH_WORKER_FREE = 0, /* the slot is unused */
    STASH_WORKER_LIVE = 1, /* a live process holds the slot */
    STASH_WORKER_DEAD = 2, /* the holder died without leaving: the slot can be taken over */
};

/* The state operations of a worker index since the arena was created (every
 * worker that held the index), by kind; each worker counts its own on a
 * cache line no other process writes. A read is a get, an iteration or a
 * contains; a write a put, an add, a remove or a clear. */
typedef struct stash_op_counts {
    uint64_t value_reads, value_writes;
    uint64_t list_reads, list_writes;
    uint64_t map_reads, map_writes;
    uint64_t merging_reads, merging_writes; /* reducing and aggregating states */
    uint64_t rollbacks;                     /* rollbacks to a checkpoint (a replacement's) */
} stash_op_counts;

typedef struct stash_worker_info {
    uint32_t index;
    uint32_t parallelism;
    int32_t pid;
    int state;             /* STASH_WORKER_* */
    stash_kg_range range;  /* the key groups it owns */
    uint64_t joined_ns;    /* when it joined, ns since the epoch */
    uint64_t heartbeat_ns; /* last sign of life, ns since the epoch */
    uint32_t generation;   /* how many times the slot was joined */
    int32_t previous_pid;  /* the dead worker this one took over from, or 0 */
} stash_worker_info;

/* Facts about this worker's own registry slot. Returns 0. */
STASH_API int stash_worker_info_get(const stash_worker *worker, stash_worker_info *out);

/* The state operations of worker index (< STASH_MAX_WORKERS) so far, also
 * once its worker left. Returns 0, or -EINVAL (NULL, index out of range). */
STASH_API int stash_op_counts_get(stash_arena *arena, uint32_t index, stash_op_counts *out);

/* Lists the registry's occupied slots (live or dead) into out[0 .. cap-1]
 * and sets *n to how many there are (which may exceed cap). Returns 0. */
STASH_API int stash_registry_list(stash_arena *arena, stash_worker_info *out, size_t cap,
                                  size_t *n);

/* ------------------------------------------------------------------------ */
/* Keyed state: Flink's state kinds, per (current key, namespace).           */

/* A byte string: a view, never owned by the receiver. */
typedef struct stash_bytes {
    const void *data;
    size_t len;
} stash_bytes;

typedef enum stash_kind {
    STASH_VALUE = 1,
    STASH_LIST = 2,
    STASH_MAP = 3,
    STASH_REDUCING = 4,
    STASH_AGGREGATING = 5,
    STASH_OP_LIST = 6,      /* operator ListState: split evenly on restore at another parallelism */
    STASH_OP_UNION = 7,     /* operator UnionListState: every worker gets the whole list */
    STASH_OP_BROADCAST = 8, /* BroadcastState: a map, the same on every worker */
    STASH_TIMERS = 9,       /* a timer service's timers (stash_timers_get), keyed state */
} stash_kind;

/* TTL, as Flink's StateTtlConfig. */
enum {
    STASH_TTL_ON_CREATE_AND_WRITE = 0, /* the timestamp moves on writes */
    STASH_TTL_ON_READ_AND_WRITE = 1,   /* ... and on reads */
};
enum {
    STASH_TTL_NEVER_RETURN_EXPIRED = 0,
    STASH_TTL_RETURN_EXPIRED_IF_NOT_CLEANED = 1,
};
enum {
    STASH_TTL_PROCESSING_TIME = 0, /* timestamps and expiry by the worker's clock */
    STASH_TTL_EVENT_TIME = 1,      /* ... by the worker's watermark (stash_timers_advance) */
};

typedef struct stash_ttl {
    uint64_t ttl_ms; /* 0: entries never expire */
    int update;      /* STASH_TTL_ON_* */
    int visibility;  /* STASH_TTL_NEVER_RETURN_EXPIRED or _RETURN_EXPIRED_IF_NOT_CLEANED */
    /* entries examined for expiry per write, and per key group at a barrier
     * (at most every 50 ms) even where nothing is written; 0: 5 */
    uint32_t cleanup_entries;
    /* non-zero: each stash_key_set also examines cleanup_entries entries of
     * the key's key group, when the worker owns it (Flink's
     * cleanupIncrementally with runCleanupForEveryRecord): entries of keys
     * that are never written again still go; stash_key_set then counts as a
     * write for the worker's views and iterators */
    int cleanup_every_record;
    /* non-zero: full checkpoints and savepoints leave out the entries (list
     * elements, map entries) expired at the cut, by the TTL clock of the
     * worker that cut them (Flink's cleanupFullSnapshot); incremental ones
     * keep them, as Flink's incremental RocksDB checkpoints do */
    int cleanup_full_snapshot;
    /* STASH_TTL_PROCESSING_TIME (Flink's only one) or STASH_TTL_EVENT_TIME:
     * entries written at the worker's watermark, expired when it passes
     * their time plus ttl_ms (full snapshots then leave nothing out) */
    int time;
} stash_ttl;

/* A combining function: writes the result of combining acc (absent: len 0,
 * data NULL) with in into out (cap bytes), sets *len, returns 0. If cap is too
 * small it sets *len to the size needed and returns -ENOSPC; stash calls it
 * again with room. Any other negative return is passed to the caller. */
typedef int stash_combine_fn(const stash_bytes *acc, const stash_bytes *in, void *out, size_t cap,
                             size_t *len, void *ctx);
/* Produces the bytes of one accumulator (create) or a result (result from acc). */
typedef int stash_produce_fn(const stash_bytes *acc, void *out, size_t cap, size_t *len, void *ctx);

/* Flink's AggregateFunction: IN, ACC and OUT as bytes. */
typedef struct stash_aggregate_fns {
    size_t sz;                /* sizeof(stash_aggregate_fns) */
    stash_produce_fn *create; /* a new accumulator (acc is NULL) */
    stash_combine_fn *add;    /* accumulator + input -> accumulator */
    stash_produce_fn *result; /* accumulator -> result */
    stash_combine_fn *merge;  /* accumulator + accumulator -> accumulator (namespace merge) */
} stash_aggregate_fns;

typedef struct stash_state_desc {
    size_t sz;        /* sizeof(stash_state_desc) */
    const char *name; /* unique per arena, at most 63 bytes */
    stash_kind kind;
    stash_ttl ttl;                        /* zero: no TTL */
    stash_combine_fn *reduce;             /* STASH_REDUCING: reduce(acc, value) */
    const stash_aggregate_fns *aggregate; /* STASH_AGGREGATING */
    void *ctx;                            /* passed to the functions */
    stash_bytes default_value;            /* STASH_VALUE: read when absent (copied) */
} stash_state_desc;

typedef struct stash_state stash_state;

/* Registers the state desc->name in the arena, or finds it if another process
 * did: every process gets the same state. Registering a name with another
 * kind or TTL is refused with STASH_EKIND. Functions and the default value are
 * per process. A worker that registers a name again gets the handle it got
 * the first time (its functions, default value and namespace; those of the
 * second desc are not used), as Flink gives one state object per name. The
 * worker owns *out until stash_worker_close(). */
STASH_API int stash_state_get(stash_worker *worker, const stash_state_desc *desc,
                              stash_state **out);

/* What the catalog of arena says of the state called name: its kind and
 * TTL options in *out (name pointing at the argument; functions, context
 * and default value empty: they are the registering process's). A tool
 * that reads state it did not register starts from it. STASH_ENOTFOUND if
 * no process registered name. */
STASH_API int stash_state_describe(stash_arena *arena, const char *name, stash_state_desc *out);

/* Sets the worker's current key: hashes it once; every access until the next
 * call uses it. The key is copied (at most 65535 bytes). Returns 0, or
 * -EINVAL (a longer key, NULL with a length), after which no key is current
 * and accesses fail with STASH_ENOKEY until a key is set. */
STASH_API int stash_key_set(stash_worker *worker, const void *key, size_t len);

/* The key group of the current key (STASH_ENOKEY if none is set). */
STASH_API int stash_key_group_current(const stash_worker *worker);

/* Sets the namespace of a state's accesses (copied, at most 65535 bytes);
 * len 0 is the default, empty namespace. Returns 0, or -EINVAL (a longer
 * namespace, NULL with a length), which leaves the namespace as it was. */
STASH_API int stash_state_namespace(stash_state *state, const void *ns, size_t len);

/* Removes the current key's entry of any keyed state kind in the current
 * namespace (STASH_EKIND for operator state). */
STASH_API int stash_state_clear(stash_state *state);

/* Reads and writes below act on the worker's current key and the state's
 * namespace. Writes to a key group the worker does not own return
 * STASH_EKEYGROUP; reads of any key group work. A read's view points into the
 * arena (or, for another worker's key group, a private copy) and stays valid
 * until this worker's next write or barrier. Views are bytes with no
 * alignment: copy typed values out with memcpy. A read of another worker's
 * key group whose owner died in the middle of a change answers -EAGAIN until
 * a new owner has recovered it. */

/* ValueState: the value, or the default, or STASH_ENOTFOUND. */
STASH_API int stash_value_get(stash_state *state, stash_bytes *out);
/* ValueState: stores a copy of the bytes; putting NULL with len 0 clears. */
STASH_API int stash_value_put(stash_state *state, const void *value, size_t len);
/* ValueState in one call, as stash_key_set() then stash_value_get(): key
 * (klen bytes) becomes the worker's current key, for this and later
 * accesses; returns what either would. */
STASH_API int stash_value_get_key(stash_state *state, const void *key, size_t klen,
                                  stash_bytes *out);
/* ValueState in one call, as stash_key_set() then stash_value_put(). */
STASH_API int stash_value_put_key(stash_state *state, const void *key, size_t klen,
                                  const void *value, size_t len);

/* An iterator over list elements, map entries or keys; caller-allocated. */
typedef struct stash_iter {
    uint64_t opaque[12];
} stash_iter;

/* ListState: starts iterating the elements in insertion order; 0 or
 * STASH_ENOTFOUND for an absent (empty) list. */
STASH_API int stash_list_get(stash_state *state, stash_iter *it);
/* ListState: appends one element. */
STASH_API int stash_list_add(stash_state *state, const void *value, size_t len);
/* ListState: appends n elements. */
STASH_API int stash_list_add_all(stash_state *state, const stash_bytes *values, size_t n);
/* ListState: replaces the list; n == 0 deletes it. */
STASH_API int stash_list_update(stash_state *state, const stash_bytes *values, size_t n);

/* MapState: the value of user key k, or STASH_ENOTFOUND. */
STASH_API int stash_map_get(stash_state *state, const void *k, size_t klen, stash_bytes *out);
/* MapState: puts a copy of (k, value). */
STASH_API int stash_map_put(stash_state *state, const void *k, size_t klen, const void *value,
                            size_t len);
/* MapState: puts n entries. */
STASH_API int stash_map_put_all(stash_state *state, const stash_bytes *keys,
                                const stash_bytes *values, size_t n);
/* MapState: removes user key k (absent is not an error). */
STASH_API int stash_map_remove(stash_state *state, const void *k, size_t klen);
/* MapState: 1 if user key k is present, 0 if not, or a negative error. */
STASH_API int stash_map_contains(stash_state *state, const void *k, size_t klen);
/* MapState: 1 if the map is empty (absent), 0 if not, or a negative error. */
STASH_API int stash_map_is_empty(stash_state *state);
/* MapState: starts iterating the entries (order unspecified); 0 or STASH_ENOTFOUND. */
STASH_API int stash_map_iter(stash_state *state, stash_iter *it);

/* ReducingState and AggregatingState: adds a value through the registered
 * function. */
STASH_API int stash_merging_add(stash_state *state, const void *value, size_t len);
/* ReducingState: the reduced value; AggregatingState: result(accumulator);
 * STASH_ENOTFOUND if nothing was added. */
STASH_API int stash_merging_get(stash_state *state, stash_bytes *out);

/* ListState, ReducingState, AggregatingState: merges the current key's
 * entries in the source namespaces into the target namespace (list: appended
 * in order; reducing: reduce; aggregating: merge) and deletes the sources
 * (Flink's mergeNamespaces, for session windows). */
STASH_API int stash_merge_namespaces(stash_state *state, const void *target, size_t tlen,
                                     const stash_bytes *sources, size_t n);

/* Starts iterating the keys of a state in the worker's key groups (Flink's
 * getKeys, and with the namespaces its getKeysAndNamespaces): in one
 * namespace, or in all when ns is NULL. */
STASH_API int stash_keys_iter(stash_state *state, const void *ns, size_t nslen, stash_iter *it);

/* As stash_keys_iter(), over key group kg alone. A worker walks one it
 * owns (others: STASH_EKEYGROUP); a reader walks any, as a copy of the
 * key group's keys taken at this call while the owner goes on: what the
 * owner wrote before it is in it, what it writes after is not, a key it
 * adds or removes meanwhile may or may not be (a reader of a checkpoint
 * sees one version of every key group). A newer keys iteration of the same
 * state handle makes the copy STASH_ESTALE. -EINVAL if kg is out of range. */
STASH_API int stash_kg_keys_iter(stash_state *state, uint32_t kg, const void *ns, size_t nslen,
                                 stash_iter *it);

/* The next element (list: *value), entry (map: *key, *value) or key (keys:
 * *key, and its namespace in *value). Returns 1 with the views set, 0 at the end, STASH_ESTALE if a
 * write by this worker since the iterator started invalidated it. A list iterator is invalidated by
 * any write of the worker (a barrier that cleaned expired entries or, with lmdb, committed counts
 * as one). A map iterator survives its own removals and set values, and the worker's writes that
 * change no map of the state but in place (puts to keys the map has, removals, other states); a put
 * of a new user key to a map of the state, or another current key, invalidates it. A keys iterator
 * survives the worker's clears and updates of existing entries (Flink's applyToAllKeys); an entry
 * of a new key or namespace that grows the index invalidates it, and with lmdb a newer keys
 * iteration of the same state handle does. Views stay valid until the worker's next write. key or
 * value may be NULL. */
STASH_API int stash_iter_next(stash_iter *it, stash_bytes *key, stash_bytes *value);

/* MapState iterator: removes the entry last returned by stash_iter_next. */
STASH_API int stash_iter_remove(stash_iter *it);
/* MapState iterator: sets the value of the entry last returned by
 * stash_iter_next (Flink's entry.setValue); the iteration goes on. */
STASH_API int stash_iter_set_value(stash_iter *it, const void *value, size_t len);

/* ------------------------------------------------------------------------ */
/* Batches: events of many keys, their state fetched ahead, then run in      */
/* order (Flink's asynchronous state access, done in one thread).            */

typedef struct stash_batch stash_batch;

/* Runs one event of a batch: its key is the worker's current key, event the
 * pointer given to stash_batch_add(). It uses the ordinary state calls. A
 * negative return is that event's result; the batch goes on. */
typedef int stash_batch_fn(stash_worker *worker, void *event, void *ctx);

typedef struct stash_batch_opts {
    size_t sz;         /* sizeof(stash_batch_opts) */
    uint32_t capacity; /* events a batch holds; 0: 32; at most 4096 */
    /* the states whose entries the handler reads or writes, fetched ahead
     * in the namespace each has when the batch runs (at most 8); NULL:
     * every keyed state the worker has registered, the first 8 */
    stash_state *const *states;
    uint32_t nstates;
} stash_batch_opts;

/* A batch of the worker's (opts may be NULL). The caller owns *out and
 * frees it with stash_batch_destroy() before closing the worker. */
STASH_API int stash_batch_create(stash_worker *worker, const stash_batch_opts *opts,
                                 stash_batch **out);

/* Frees a batch and its queued events. Accepts NULL. */
STASH_API void stash_batch_destroy(stash_batch *batch);

/* Queues an event of key (copied, at most 65535 bytes); event is the
 * caller's, handed to the handler. -ENOSPC when the batch is full. */
STASH_API int stash_batch_add(stash_batch *batch, const void *key, size_t len, void *event);

/* The events queued and not yet run. */
STASH_API uint32_t stash_batch_size(const stash_batch *batch);

/* Runs the queued events and empties the batch: hashes their keys, fetches
 * ahead the index groups and records the states' accesses will touch (on
 * lmdb, reads their pages on reader threads), then calls fn once per event
 * in the order they were added, each with its key current. The outcome is
 * that of setting each key and calling fn one event at a time. An event of
 * a key in a key group the worker does not own fails alone with
 * STASH_EKEYGROUP, fn not called. No barrier falls inside a batch:
 * stash_barrier() from fn is refused. results, if given, receives each
 * event's result (0, fn's error or STASH_EKEYGROUP). Returns how many
 * events failed, or a negative error (none ran). The last event's key stays
 * current (none if its key group is another worker's). */
STASH_API int stash_batch_run(stash_batch *batch, stash_batch_fn *fn, void *ctx, int *results);

/* A hint for a worker that keeps its own pipeline: starts fetching what an
 * access of state to key (in the state's namespace) will touch, so that
 * one a few events later finds it near. Changes nothing; returns 0 or
 * -EINVAL. */
STASH_API int stash_prefetch(stash_state *state, const void *key, size_t len);

/* ------------------------------------------------------------------------ */
/* Timers (Flink's InternalTimerService): per key and namespace, in event
 * time (fired as a watermark passes them) or processing time (fired as the
 * worker's clock does). A timer is keyed state of its key's key group: the
 * key group's owner registers and fires it, checkpoints and restores carry
 * it as they carry state. */

typedef struct stash_timers stash_timers;

typedef enum stash_time_domain {
    STASH_EVENT_TIME = 0,
    STASH_PROCESSING_TIME = 1,
} stash_time_domain;

/* A timer: its domain, time, key and namespace. */
typedef struct stash_timer {
    stash_time_domain domain;
    uint64_t timestamp;
    stash_bytes key;
    stash_bytes ns;
} stash_timer;

/* Called for each timer that fires, with its key the worker's current key
 * (the handler reads and clears state through it, and may register
 * timers); the views last until it returns. A negative return stops the
 * firing and is returned. */
typedef int stash_timer_fn(const stash_timer *timer, void *ctx);

/* The worker's timer service called name, registered in the arena's
 * catalog on first use (a state of kind STASH_TIMERS: no state may take its
 * name); the same handle for the same name. Its timers are those of the
 * worker's key groups. */
STASH_API int stash_timers_get(stash_worker *worker, const char *name, stash_timers **out);

/* Registers a timer for the current key in namespace ns at timestamp. The
 * same (domain, key, namespace, timestamp) registered twice is one timer. */
STASH_API int stash_timer_register(stash_timers *timers, stash_time_domain domain, const void *ns,
                                   size_t nslen, uint64_t timestamp);

/* Deletes the current key's timer in namespace ns at timestamp; an absent
 * one is no error. */
STASH_API int stash_timer_delete(stash_timers *timers, stash_time_domain domain, const void *ns,
                                 size_t nslen, uint64_t timestamp);

/* Event time: raises the service's watermark to watermark (it never goes
 * back) and fires, in timestamp order, every event-time timer at or before
 * it, those the handler registers meanwhile included. Timers of one
 * timestamp fire in the order of their key group, key and namespace.
 * Returns the timers fired or the first error. */
STASH_API int64_t stash_timers_advance(stash_timers *timers, uint64_t watermark, stash_timer_fn *fn,
                                       void *ctx);

/* Processing time: fires, as stash_timers_advance() does, every
 * processing-time timer at or before the worker's clock now
 * (stash_worker_opts.clock, milliseconds). */
STASH_API int64_t stash_timers_poll(stash_timers *timers, stash_timer_fn *fn, void *ctx);

/* Starts iterating the timers of key group kg, one the worker owns, or with
 * kg -1 those of the current key (for tests and tools; order unspecified).
 * A newer iteration of the same service, or a write of the worker that
 * moves entries, makes it STASH_ESTALE. */
STASH_API int stash_timers_iter(stash_timers *timers, int32_t kg, stash_iter *it);
/* The next timer of the iteration: 1 with *out set (its views valid until
 * the worker's next write), 0 at the end, or an error. */
STASH_API int stash_timers_next(stash_iter *it, stash_timer *out);

/* The service's watermark: the highest stash_timers_advance() was given,
 * 0 before the first. The worker's watermark, by which event-time TTL
 * expires entries, is the highest of its services'. */
STASH_API uint64_t stash_timers_watermark(const stash_timers *timers);

/* ------------------------------------------------------------------------ */
/* Operator state: per worker, not per key (Flink's operator state). A worker
 * registers it with stash_state_get() and one of the STASH_OP_* kinds; it
 * lives in the worker's memory, is recorded at every checkpoint's barrier,
 * and a worker that starts (or rolls back) gets it as of the newest complete
 * checkpoint, redistributed if the parallelism changed (split lists in
 * contiguous chunks, the first workers one element more; union lists whole;
 * broadcast state from old worker index mod old parallelism, or any old
 * worker that has it). Views stay valid until the state's next change. */

/* Operator list or union list state: its elements, in order. */
STASH_API int stash_op_list_get(stash_state *state, const stash_bytes **elements, size_t *n);
/* Appends a copy of one element. */
STASH_API int stash_op_list_add(stash_state *state, const void *value, size_t len);
/* Replaces the list with copies of n elements (n == 0 empties it). */
STASH_API int stash_op_list_update(stash_state *state, const stash_bytes *values, size_t n);

/* Broadcast state: the value of key k, or STASH_ENOTFOUND. */
STASH_API int stash_broadcast_get(stash_state *state, const void *k, size_t klen, stash_bytes *out);
/* Puts a copy of (k, value). */
STASH_API int stash_broadcast_put(stash_state *state, const void *k, size_t klen, const void *value,
                                  size_t len);
/* Removes key k (absent is not an error). */
STASH_API int stash_broadcast_remove(stash_state *state, const void *k, size_t klen);
/* All entries: keys[i] maps to values[i], in no particular order. */
STASH_API int stash_broadcast_entries(stash_state *state, const stash_bytes **keys,
                                      const stash_bytes **values, size_t *n);

/* ------------------------------------------------------------------------ */
/* Checkpoints: the persistence engine and the barrier between records.      */

typedef enum stash_event_kind {
    STASH_CHECKPOINT_COMPLETE = 1, /* every file of checkpoint_id is durable and committed */
    STASH_CHECKPOINT_ABORTED = 2,  /* checkpoint_id failed: it will never complete */
    STASH_ROLLED_BACK = 3,         /* this worker's rollback restored checkpoint_id; detail says
                                      why newer complete ones were passed over ("" if none was) */
} stash_event_kind;

typedef struct stash_event {
    stash_event_kind kind;
    uint64_t checkpoint_id;
    const char *detail; /* never NULL; owned by the worker, valid until its next barrier */
} stash_event;

/* Call between records. If the engine requested a checkpoint this worker has
 * not cut yet, cuts it here: the worker's key groups are pinned as they are
 * now (O(1) in state size) and its operator state recorded; the engine
 * writes them while the worker goes on. Returns 1 with *event set when a
 * checkpoint completed or was aborted since the last event (Flink's
 * notifyCheckpointComplete: commit side effects up to it), or, at the first
 * barrier after a rollback, which checkpoint it restored (STASH_ROLLED_BACK:
 * a sink that committed up to a newer id learns that it went back); 0 if
 * nothing happened, or a negative error. STASH_EFENCED when the arena's
 * service, a host of a job that spans hosts, lost its place in the job
 * (another service serves this worker's index now): the worker should stop
 * and let that one's worker go on; opening a worker on such an arena fails
 * the same way. No syscall unless a checkpoint is pending. */
STASH_API int stash_barrier(stash_worker *worker, stash_event *event);

typedef enum stash_storage {
    STASH_STORAGE_FS = 0,     /* checkpoints in a directory on disk */
    STASH_STORAGE_MEMORY = 1, /* in shared memory (tmpfs), each capped in size */
    STASH_STORAGE_RADOS = 2,  /* in a pool of a Ceph cluster, with a copy in a directory */
} stash_storage;

/* Options of the remote storage a service's storage_url names, each read
 * by the storages it names; zero means the default. Credentials are never
 * taken here: they come from the environment or a file. */
typedef struct stash_storage_opts {
    size_t sz;               /* sizeof(stash_storage_opts) */
    uint32_t timeout_ms;     /* of connecting and of each call (rados: whole seconds,
                                rounded up); 0: 10 s */
    uint32_t depth;          /* objects or parts in flight at once; 0: 8 */
    const char *ceph_conf;   /* rados: the cluster's ceph.conf; NULL: Ceph's search
                                ($CEPH_CONF, then /etc/ceph/ceph.conf) */
    const char *ceph_id;     /* rados: the client's id; NULL: admin (client.admin) */
    const char *endpoint;    /* s3: http[s]://HOST[:PORT] of the service; NULL:
                                $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, else
                                https://s3.REGION.amazonaws.com */
    const char *region;      /* s3: NULL: $AWS_REGION, $AWS_DEFAULT_REGION, else us-east-1 */
    const char *credentials; /* s3: a credentials file of the AWS form; NULL:
                                $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY if set, else
                                $AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials */
    const char *profile;     /* s3: the file's section; NULL: $AWS_PROFILE, else default */
    uint64_t part_bytes;     /* s3: bytes of each part of a multipart upload (at least
                                5 MiB); 0: 8 MiB */
} stash_storage_opts;

/* How much an event of the persistence engine matters. */
typedef enum stash_log_level {
    STASH_LOG_INFO = 0,  /* what it did: a checkpoint complete, a worker joined */
    STASH_LOG_WARN = 1,  /* what went wrong and was dealt with: a worker died, a retry */
    STASH_LOG_ERROR = 2, /* what failed: a checkpoint, retention */
} stash_log_level;

/* One event of the persistence engine, for a log of the caller's. */
typedef struct stash_log_record {
    uint64_t time_ns; /* when, ns since the epoch */
    stash_log_level level;
    const char *subject; /* what it is about: "checkpoint 12", "savepoint 13", "worker 3",
                            "service", "restore", "retention", "io"; never NULL */
    const char *message; /* the rest, never NULL */
} stash_log_record;

typedef struct stash_service_opts {
    size_t sz;                     /* sizeof(stash_service_opts) */
    const stash_arena_opts *arena; /* where the arena lives; its size and max parallelism
                                      if the service creates it */
    stash_storage storage;
    const char *dir;       /* fs and rados: the checkpoint directory (required); memory:
                              NULL is NAME.checkpoints in this user's private directory
                              in memory (/run/stash for root, $RUNTIME_DIRECTORY,
                              $XDG_RUNTIME_DIR/stash, else /dev/shm/stash-UID) */
    uint64_t memory_cap;   /* memory: bytes a checkpoint may take; 0: 5 MiB */
    uint64_t interval_ms;  /* a checkpoint this often; 0: only when requested. From the
                              third failure in a row the wait doubles with each failure
                              (at most 64 intervals) until one completes */
    uint64_t min_pause_ms; /* at least this long between one's end and the next start */
    uint64_t timeout_ms;   /* a checkpoint not cut by every worker in time fails; 0: 60 s */
    uint32_t retain;       /* complete checkpoints kept; 0: 3 */
    int incremental;       /* non-zero: write only the changes since the previous one */
    uint32_t full_every;   /* incremental: a full checkpoint after this many; 0: 10 */
    int lz4;               /* non-zero: compress each key group's block */
    const char *restore;   /* a new arena: restore this checkpoint or savepoint directory
                              instead of the newest complete checkpoint of dir */
    int start_empty;       /* a new arena starts empty even when dir holds checkpoints none of
                              which restores (without it the start fails, naming each one) */
    int lazy_restore;      /* a new arena serves at once: each key group is
                              restored when first touched (its toucher waits for it alone)
                              or when a background pass reaches it; a checkpoint taken
                              meanwhile copies the blocks of those not back at its cut.
                              A damaged block then fails its key group (STASH_ECORRUPT
                              for whoever touches it) instead of the start */
    /* one line per event: local date, time with milliseconds, level,
     * subject and message ("2026-12-04 10:15:02.345 INFO checkpoint 12:
     * complete: ..."); NULL: none */
    void (*log)(void *ctx, const char *line);
    void *log_ctx; /* given to log and log_record */
    /* the same events as records (for a log of another format); NULL: none */
    void (*log_record)(void *ctx, const stash_log_record *record);
    /* rados: checkpoints in this pool (required), as objects named JOB/ and the
     * file's path in dir (which keeps a copy of the retained ones); a checkpoint
     * is complete once JOB/latest names it. A new arena restores the one it names. */
    const char *pool;
    const char *ceph_conf;    /* the cluster's ceph.conf; NULL: Ceph's default search */
    const char *ceph_id;      /* the client's id; NULL: admin (client.admin) */
    const char *job;          /* the objects' prefix; NULL: the arena's name */
    uint32_t ceph_timeout_ms; /* of every call to the cluster (whole seconds); 0: 10 s */
    /* rados, a job that spans hosts: this service is host `host` of job JOB
     * (NULL: the job's only host), serving the key groups of `workers`
     * ("A-B[,C-D...]", indices of job_parallelism). Its checkpoints are its
     * parts of the job's: the host whose lease on JOB/leader holds triggers
     * each one on every host (interval_ms is its interval), commits it when
     * parts serving every worker are in, or aborts it after timeout_ms; each
     * worker gets the job's verdict. A host whose lease lapses is lost: a
     * live one takes its workers over from the newest job checkpoint. A new
     * arena restores its workers' key groups from the job's newest one, of
     * any number of hosts and workers. Each part is a full checkpoint. */
    const char *host;
    const char *workers;
    uint32_t job_parallelism;
    uint32_t lease_ms; /* of the leader and of each host; 0: 10 s */
    /* The checkpoints' storage as a URL (storage, pool, job, ceph_conf, ceph_id
     * and ceph_timeout_ms are its older form, read only while it is NULL):
     * file:DIR (the fs storage, dir DIR), memory: (the memory storage),
     * rados://POOL/JOB or s3://BUCKET/PREFIX: in that pool or bucket, as objects
     * named JOB/ (PREFIX/) and the file's path in dir, which keeps a copy of the
     * retained ones; a checkpoint is complete once JOB/latest names it, and a new
     * arena restores the one it names. A job that spans hosts needs rados. */
    const char *storage_url;
    const stash_storage_opts *storage_opts; /* its options; NULL: defaults */
} stash_service_opts;

typedef struct stash_service stash_service;

/* The name of a log level: "INFO", "WARN" or "ERROR". */
STASH_API const char *stash_log_level_name(stash_log_level level);

/* Starts the persistence engine of arena NAME in a thread of this process.
 * An existing arena is reattached (its engine may have died: pins and
 * requests it left are released); a missing one is created, restored from
 * the newest complete checkpoint in the directory if there is one (falling
 * back past damaged ones; STASH_ECORRUPT naming each one if none restores,
 * unless opts->start_empty). The checkpoint directory must be writable
 * (-ENOTDIR, -EROFS, -EACCES naming it). STASH_EBUSY if a live engine
 * serves the arena.
 * The caller owns *out and ends it with stash_service_stop(). */
STASH_API int stash_service_start(const char *name, const stash_service_opts *opts,
                                  stash_service **out);

/* Lets the checkpoint in flight finish, stops the engine and frees it; the
 * arena stays. Accepts NULL. */
STASH_API void stash_service_stop(stash_service *service);

/* Whether the engine has stopped by itself: 1 on a `stash stop` request, a
 * negative error if a failure it could not get past stopped it (its log
 * says which: a lazy restore's damaged checkpoint with none to fall back
 * to), 0 while it runs. */
STASH_API int stash_service_stopped(const stash_service *service);

/* A finished checkpoint. */
typedef struct stash_checkpoint_info {
    uint64_t id;
    int status;          /* 0, or the error that failed it */
    int incremental;     /* written as changes since an earlier checkpoint */
    int savepoint;       /* a savepoint: self-contained, relocatable, never retired */
    uint64_t started_ns; /* when it was requested, ns since the epoch */
    uint64_t duration_ns;
    uint64_t bytes;    /* written into its own data file */
    uint64_t pause_ns; /* the longest synchronous cut of a worker */
    char detail[256];  /* its directory, or why it failed */
} stash_checkpoint_info;

/* Asks the engine serving arena for a checkpoint and waits until one that
 * started after the request has finished (at most timeout_ms; 0: no limit).
 * Returns 0 with *out describing it, STASH_EABORTED with *out saying why it
 * failed, STASH_ENOSERVICE, or -ETIMEDOUT. */
STASH_API int stash_checkpoint(stash_arena *arena, uint64_t timeout_ms, stash_checkpoint_info *out);

/* As stash_checkpoint(), for a savepoint: DIR/savepoint-ID, full and
 * self-contained (it restores wherever it is moved), never removed by
 * retention, and not the base of incremental checkpoints. */
STASH_API int stash_savepoint(stash_arena *arena, uint64_t timeout_ms, stash_checkpoint_info *out);

/* Asks the engine serving arena to stop and waits for it (at most
 * timeout_ms; 0: no limit). Returns 0, STASH_ENOSERVICE or -ETIMEDOUT. */
STASH_API int stash_service_request_stop(stash_arena *arena, uint64_t timeout_ms);

/* Stops with a savepoint, as one step: the engine serving arena takes a
 * savepoint (as stash_savepoint()) and stops once it is complete, with no
 * checkpoint between. The engine of a job's host takes a savepoint of the
 * whole job (*out's detail: rados://POOL/JOB/job-ID, what restores it), and
 * every host's engine stops once it is committed. If the savepoint fails,
 * nothing stops. Waits (at most timeout_ms; 0: no limit) for the savepoint
 * and then for this engine to stop. Returns as stash_savepoint() does. */
STASH_API int stash_stop_with_savepoint(stash_arena *arena, uint64_t timeout_ms,
                                        stash_checkpoint_info *out);

typedef struct stash_service_info {
    int32_t pid;                     /* of the live engine; 0 if none */
    uint64_t since_ns;               /* when it started */
    char dir[256];                   /* where it writes checkpoints */
    uint64_t pending;                /* the checkpoint being cut, 0 none */
    uint64_t completed;              /* the newest complete checkpoint, 0 none */
    uint32_t failing;                /* checkpoints failed in a row (the interval backs off
                                        from the third: see stash_service_opts) */
    uint64_t next_ns;                /* when the next checkpoint of the interval is due, ns
                                        since the epoch; 0 if the engine has no interval */
    uint32_t nrecent;                /* entries in recent */
    stash_checkpoint_info recent[8]; /* the last finished checkpoints, newest first */
    /* Totals since the arena was created. */
    uint64_t completed_total; /* checkpoints and savepoints committed */
    uint64_t failed_total;    /* checkpoints and savepoints failed */
    /* The restore that filled the arena when a service created it (0s if none). */
    uint64_t restored_id;      /* the checkpoint or savepoint's id */
    uint64_t restored_ns;      /* how long it took */
    uint64_t restored_at_ns;   /* when it ended, ns since the epoch */
    uint64_t restored_records; /* the records it restored */
    /* The engine's I/O, over every engine that served the arena. */
    char io_backend[16];       /* "io_uring" or "threads" of the newest; "" before any */
    uint64_t io_bytes_written; /* bytes its writes moved */
    uint64_t io_bytes_read;    /* bytes its reads moved */
    uint64_t io_errors;        /* requests that failed */
} stash_service_info;

/* What the control block says about the engine and recent checkpoints. Returns 0. */
STASH_API int stash_service_info_get(stash_arena *arena, stash_service_info *out);

/* ------------------------------------------------------------------------ */
/* Snapshots offline: a checkpoint or savepoint directory read without an   */
/* arena or a service, as Flink's State Processor API reads a savepoint.    */

typedef struct stash_snapshot stash_snapshot;

typedef struct stash_snapshot_info {
    uint64_t id;
    uint64_t created_ns;      /* when it was committed, ns since the epoch */
    uint64_t base_id;         /* an incremental checkpoint's base; 0 for a full one */
    uint32_t max_parallelism; /* its key groups */
    uint32_t nstates;         /* the states its metadata names */
    uint32_t op_parallelism;  /* the workers whose operator state it holds */
    uint64_t data_bytes;      /* of its data files (an incremental one's whole chain) */
} stash_snapshot_info;

/* Opens the checkpoint or savepoint directory at path (the one holding
 * _metadata, wherever it was moved) with the checks a restore makes: its
 * metadata and every data file's checksums. Returns 0, -ENOENT, or
 * STASH_ECORRUPT naming the file and offset (stash_errmsg()). */
STASH_API int stash_snapshot_open(const char *path, stash_snapshot **out);
/* Releases what stash_snapshot_open() took. Accepts NULL. */
STASH_API void stash_snapshot_close(stash_snapshot *snap);
/* The snapshot's id, time, base, key groups, states and workers. Returns 0. */
STASH_API int stash_snapshot_info_get(const stash_snapshot *snap, stash_snapshot_info *out);
/* State i (< nstates): its name (valid until the close), kind and TTL; the
 * functions and default value are the job's, not the snapshot's, and are
 * left NULL. Returns 0 or -EINVAL. */
STASH_API int stash_snapshot_state(const stash_snapshot *snap, uint32_t i, stash_state_desc *out);

/* One keyed entry of a snapshot: a value (the accumulator of a reducing or
 * aggregating state), one element of a list, one entry of a map, or a
 * timer. Bytes are valid during the call only. */
typedef struct stash_snapshot_entry {
    uint32_t kg;
    const char *state;
    stash_kind kind;
    stash_bytes key;
    stash_bytes ns;           /* its namespace (a timer's: the user's) */
    stash_bytes map_key;      /* STASH_MAP: the entry's key */
    stash_bytes value;        /* the value, element or map value; empty for a timer */
    uint32_t index;           /* STASH_LIST: the element's position in its list */
    uint64_t ttl_ms;          /* with TTL: when it was written, ms of the TTL's clock; else 0 */
    stash_time_domain domain; /* STASH_TIMERS: the timer's domain and time (ms); of a
                                 timer service's operator entry: its watermark */
    uint64_t timestamp;
    uint32_t worker; /* operator state: the worker index that held it */
} stash_snapshot_entry;

/* Returns 0 to go on, anything else to stop the scan with it. */
typedef int stash_snapshot_fn(void *ctx, const stash_snapshot_entry *e);

/* Calls fn for every keyed entry of the key groups in range as of the
 * snapshot (of an incremental checkpoint, each entry's newest version in
 * its chain; none for one it deleted), key group by key group. Returns 0,
 * fn's non-zero return, -EINVAL for a range beyond the key groups, or the
 * first damage found, naming file and offset. */
STASH_API int stash_snapshot_scan(stash_snapshot *snap, stash_kg_range range, stash_snapshot_fn *fn,
                                  void *ctx);

/* Calls fn for every operator-state entry of the snapshot, worker by
 * worker (e->worker): an element of a list or union list (e->index, value),
 * an entry of broadcast state (map_key, value), and a timer service's
 * watermark (kind STASH_TIMERS, timestamp). Returns 0, fn's non-zero
 * return, or STASH_ECORRUPT naming the metadata. */
STASH_API int stash_snapshot_op_scan(stash_snapshot *snap, stash_snapshot_fn *fn, void *ctx);

/* A savepoint written offline, from scratch (bootstrap) or from a snapshot
 * read with changes: its entries are built in a heap of the writer's own
 * (in /dev/shm, removed once mapped), then written and committed as a
 * checkpoint is (docs/format.md), and the directory moved into place: the
 * path holds a whole savepoint or nothing. */
typedef struct stash_snapshot_writer stash_snapshot_writer;

typedef struct stash_snapshot_writer_opts {
    size_t sz;                /* sizeof(stash_snapshot_writer_opts) */
    uint32_t max_parallelism; /* its key groups; 0: STASH_DEFAULT_MAX_PARALLELISM */
    uint64_t size;            /* bytes of the heap it builds in; 0: 256M */
    uint64_t id;              /* the savepoint's id; 0: 1 */
    uint32_t op_parallelism;  /* the workers its operator state is of; 0: none */
} stash_snapshot_writer_opts;

/* Starts a savepoint to be committed at path, which must not exist (its
 * parent must). Returns 0, -EEXIST, -ENOENT, or another error naming path. */
STASH_API int stash_snapshot_writer_open(const char *path, const stash_snapshot_writer_opts *opts,
                                         stash_snapshot_writer **out);
/* Declares a state of the savepoint: its name, kind (STASH_TIMERS too: a
 * timer service) and TTL; functions and default values are not needed.
 * Returns 0, STASH_EKIND if the name was declared with another kind, or
 * -EINVAL for no name, no kind, or TTL options its kind cannot have. */
STASH_API int stash_snapshot_writer_state(stash_snapshot_writer *w, const stash_state_desc *desc);
/* Adds one keyed entry to its declared state e->state (e->kg is computed
 * from the key): a value, reducing or aggregating state's value or
 * accumulator (replacing one there), an element appended to a list, a map
 * entry (replacing one with its map key), or a timer (domain, timestamp,
 * ns). An entry of a TTL state keeps e->ttl_ms as the time it was written
 * (0: now). Returns 0, STASH_ENOTFOUND for an undeclared state, STASH_EKIND
 * for operator state, STASH_EFULL when the heap is full (give opts.size). */
STASH_API int stash_snapshot_writer_put(stash_snapshot_writer *w, const stash_snapshot_entry *e);
/* Removes what e names from its declared keyed state: the value or
 * accumulator of (key, ns), the whole list, the map entry of e->map_key
 * (the whole map if map_key is empty), or the timer (domain, timestamp,
 * ns). Removing what is absent is no error. Returns 0, STASH_ENOTFOUND for
 * an undeclared state, STASH_EKIND for operator state. */
STASH_API int stash_snapshot_writer_delete(stash_snapshot_writer *w, const stash_snapshot_entry *e);
/* Adds one operator-state entry, as stash_snapshot_op_scan gives them, to
 * worker e->worker (< opts.op_parallelism): an element appended to a list
 * or union list, a broadcast entry (map_key, value), or a timer service's
 * watermark (timestamp). Returns 0, STASH_ENOTFOUND, STASH_EKIND for keyed
 * state, -EINVAL for a worker beyond the operator state's parallelism. */
STASH_API int stash_snapshot_writer_op_put(stash_snapshot_writer *w, const stash_snapshot_entry *e);
/* Writes and commits the savepoint at path and ends the writer (also on
 * failure, which leaves nothing at path). out (may be NULL) gets what was
 * written. Returns 0, -EINVAL for an id past 2^53 or operator state of
 * more than STASH_MAX_WORKERS workers, -EFBIG for metadata (operator state
 * included) past 64 MiB, or the error, naming file and offset. */
STASH_API int stash_snapshot_writer_commit(stash_snapshot_writer *w, stash_snapshot_info *out);
/* Ends the writer without writing anything. Accepts NULL. */
STASH_API void stash_snapshot_writer_abort(stash_snapshot_writer *w);

/* One change stash_snapshot_rewrite makes to a state of its source. */
typedef struct stash_snapshot_change {
    const char *state;  /* the source's state it changes */
    int drop;           /* non-zero: the state goes, its entries and operator state too */
    const char *rename; /* its new name, or NULL */
    int set_ttl;        /* non-zero: its TTL setting becomes ttl (ttl_ms 0: none) */
    stash_ttl ttl;
} stash_snapshot_change;

typedef struct stash_snapshot_rewrite_opts {
    size_t sz;                /* sizeof(stash_snapshot_rewrite_opts) */
    uint32_t max_parallelism; /* 0: the source's; else every entry goes to its key group of these */
    uint64_t id;              /* the savepoint's id; 0: the source's */
    const stash_snapshot_change *changes; /* each names a state by its name in the source */
    uint32_t nchanges;
    /* If set, called as key groups are written: done of total. */
    void (*progress)(void *ctx, uint32_t done, uint32_t total);
    void *progress_ctx;
} stash_snapshot_rewrite_opts;

/* Writes snap, changed as opts says, as a new savepoint at path (which must
 * not exist; its parent must), committed as stash_snapshot_writer_commit
 * does: path holds a whole savepoint or nothing. Records are copied from
 * the source's blocks into the new ones without being built anywhere else;
 * a state given a TTL has its values, elements and entries stamped with the
 * time of the rewrite, one losing it has their times taken out, one keeping
 * it keeps them. out (may be NULL) gets what was written. Returns 0,
 * -EEXIST, -ENOENT, STASH_ENOTFOUND (a change names no state of snap),
 * -EINVAL (a max parallelism beyond STASH_MAX_MAX_PARALLELISM, a TTL for
 * operator state or timers, two states left with one name), or an I/O
 * error naming the file. */
STASH_API int stash_snapshot_rewrite(stash_snapshot *snap, const char *path,
                                     const stash_snapshot_rewrite_opts *opts,
                                     stash_snapshot_info *out);

#ifdef __cplusplus
}
#endif

#endif /* STASH_H */
