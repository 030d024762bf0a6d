/* SPDX-License-Identifier: MIT */
/*
 * store.h: the keyed store interface. A store keeps an arena's keyed
 * records, each named by a lookup (key group, state, key, namespace). The
 * state kinds (backends/state/) read and write records through these
 * operations alone, and checkpoints walk and refill key groups through
 * them; backends/store/stores.c lists the stores, one per backend.
 */
#ifndef STASH_STORE_H
#define STASH_STORE_H

#include "shm/table.h"

/* One record as a snapshot carries it. */
#define STORE_REC_DELETED 1u /* a delta's record: the entry is gone */
typedef struct store_record {
    uint16_t state; /* a state id: the snapshot's while read, the arena's when restored */
    uint16_t klen;
    uint16_t nslen;
    uint16_t flags; /* STORE_REC_DELETED */
    uint32_t vlen;
    const uint8_t *key;
    const uint8_t *ns;
    const uint8_t *value;
    uint64_t key_hash; /* stash_hash() of the key */
} store_record;

/* Receives the records of a key group's snapshot; a negative return stops
 * the walk and is returned by it. */
typedef int store_emit_fn(void *ctx, const store_record *r);

/* A checkpoint's cut of a key group: the version its writers pinned, and
 * for a delta the base checkpoint's id and pinned version (0: full). */
typedef struct store_cut {
    uint32_t pin;
    uint32_t base_pin;
    uint64_t base_id;
} store_cut;

/* An entry met by a walk of a key group's records of one state: views
 * valid until the store's next operation. resume holds the bytes the next
 * step goes on after where the store needs them back (empty otherwise):
 * the caller keeps a copy and passes it as the walk's after. */
typedef struct store_entry {
    stash_bytes key;
    stash_bytes ns;
    stash_bytes value;
    stash_bytes resume;
} store_entry;

/* Where a walk of one key group stands; zeroed to start it. */
typedef struct store_walk {
    uint32_t pos;         /* a position in the key group */
    uint32_t layout;      /* the key group's layout when the walk entered it */
    bool entered;         /* the walk has begun */
    const uint8_t *after; /* the resume bytes of the entry returned last, or NULL */
    size_t after_len;
} store_walk;

/* Whether a stored value (timestamps included) has expired. */
typedef bool store_expired_fn(void *ctx, const uint8_t *value, size_t len);

typedef struct store store;

/* The steps of fetching lookups ahead: the heap's index groups, then the
 * records they name; lmdb's look-ups on reader threads, then nothing. */
enum { STORE_FETCH_FIRST = 1, STORE_FETCH_SECOND = 2 };

/* A store's operations. Records handed out (finds, reads, new records) are
 * the caller's to fill until the next operation. commit, commit_due,
 * fetch_ahead, cut_open, cut_close and restore_end may be NULL: nothing to
 * do. Each that can fail returns 0 or a negative error naming the key
 * group. */
typedef struct store_ops {
    const char *name;
    /* Records are the arena's own: an address names one record until it is
     * rewritten, and lookups may be prefetched and take value.c's one-step
     * paths. Otherwise records handed out are private copies. */
    bool in_arena;
    /* A publish needs no find first: a put of a whole value skips it. */
    bool blind_put;

    /* A handle for one user (a worker, the engine, a restore), opened on
     * the arena a. close commits what is open and accepts NULL. */
    int (*open)(stash_arena *a, store **out);
    void (*close)(store *st);
    /* Frees a handle a forked child inherited, leaving what it shares with
     * its opener (transactions, environments) alone. */
    void (*forget)(store *st);
    /* Makes the user's writes visible to other processes (a barrier). */
    int (*commit)(store *st);
    /* As commit, where the store asks for it between barriers. */
    int (*commit_due)(store *st);
    /* Empties the key groups of range (a rollback's first step). */
    int (*clear)(store *st, stash_kg_range range);
    /* Entries (of every state) in key group kg, the user's own writes
     * included. Returns the count or an error. */
    int64_t (*kg_entries)(store *st, uint32_t kg);

    /* Finds l's entry in an owned key group: c->rec is its record
     * (possibly a tombstone) or NULL. for_write: a write follows, and the
     * store may first tend the key group (which moves no record). */
    int (*find)(store *st, const shm_lookup *l, shm_cursor *c, bool for_write);
    /* Reads l's value in an owned key group: a view in out, and with
     * for_write its record in c for a write that follows. STASH_ENOTFOUND
     * if there is none. */
    int (*read_owned)(store *st, const shm_lookup *l, shm_cursor *c, stash_bytes *out,
                      bool for_write);
    /* Copies l's value, of any key group, into *buf as last published.
     * Returns its length or an error (STASH_ENOTFOUND). */
    int64_t (*read_copy)(store *st, const shm_lookup *l, uint8_t **buf, size_t *cap);
    /* Starts fetching what finds of l[0 .. n-1] touch, so that they find
     * it near; changes nothing. In two steps (STORE_FETCH_*): the first as
     * early as the lookups are known, the second just before the finds.
     * The lookups stay the caller's: a store that fetches after returning
     * copies them. */
    void (*fetch_ahead)(store *st, const shm_lookup *l, size_t n, int step);
    /* A new record for l with room for cap value bytes. */
    int (*rec_new)(store *st, const shm_lookup *l, size_t cap, shm_rec **out);
    /* Whether rec may be written in place, and the value bytes it holds. */
    bool (*rec_mutable)(store *st, uint32_t kg, const shm_rec *rec);
    uint64_t (*rec_capacity)(const store *st, const shm_rec *rec);
    /* Starts a write in place of the regions r[0 .. n-1] of rec's value;
     * false if it cannot be made in place. */
    bool (*write_begin)(store *st, uint32_t kg, shm_rec *rec, const shm_region *r, unsigned n);
    /* Ends it: the record's new bytes are what readers see. */
    int (*write_end)(store *st, uint32_t kg, shm_rec *rec);
    /* Makes a new record l's entry (c as find left it); c->rec is then it. */
    int (*publish)(store *st, const shm_lookup *l, shm_cursor *c, shm_rec *rec);
    int (*delete)(store *st, const shm_lookup *l, shm_cursor *c);
    /* After a write to l's entry: views its value as stored. */
    int (*view)(store *st, const shm_lookup *l, shm_cursor *c, stash_bytes *out);
    /* The next live entry of state in key group kg after w. Returns 1 with
     * out filled, 0 at the end, or an error (STASH_ESTALE if the key
     * group's layout changed since the walk entered it). */
    int (*next)(store *st, uint32_t kg, uint16_t state, store_walk *w, store_entry *out);
    /* A user that does not own kg (a reader): emits the live entries of
     * state in key group kg, each value whole (never torn by the owner's
     * writes going on meanwhile): the heap's as the walk meets them, an
     * entry written during it as before or after the write; lmdb's as of
     * the key group's last commit. The records' views last until emit
     * returns. */
    int (*scan)(store *st, uint32_t kg, uint16_t state, store_emit_fn *emit, void *ctx);
    /* Examines up to budget records of state in kg, going on where the
     * last call stopped, and deletes those expired says have expired. */
    void (*ttl_cleanup)(store *st, uint32_t kg, uint16_t state, uint32_t budget,
                        store_expired_fn *expired, void *ctx);

    /* Checkpoints. cut_open holds key group kg's state as its cut left it
     * while the owner goes on (NULL: the cut's pin alone holds it);
     * cut_close lets it go. snapshot emits kg's records as of cut: all
     * live ones, or with a base the changes since it, deletions flagged.
     * Called from two threads at once for different key groups. */
    int (*cut_open)(store *st, uint32_t kg);
    void (*cut_close)(store *st, uint32_t kg);
    int (*snapshot)(store *st, uint32_t kg, const store_cut *cut, store_emit_fn *emit, void *ctx);
    /* Restoring into key groups nobody writes meanwhile: restore_begin
     * hears how many records kg is about to receive, restore puts a record
     * in (replacing the entry it names) or, flagged deleted, removes it,
     * and restore_end ends kg's records (rc: 0, or the error that stopped
     * them, which it returns). Different key groups from two threads. */
    int (*restore_begin)(store *st, uint32_t kg, uint64_t records);
    int (*restore)(store *st, const shm_lookup *l, const store_record *r);
    int (*restore_end)(store *st, uint32_t kg, int rc);
} store_ops;

/* What every store's handle starts with. */
struct store {
    const store_ops *ops;
    stash_arena *arena;
    uint32_t slot;        /* the user's slot, announcing its copies out of key groups */
    stash_kg_range range; /* the key groups the user owns */
    /* Bumped whenever records or views the store handed out move without a
     * write of the user's (a commit, a cleanup): what the user's
     * iterators check. Points at own_moves unless the user sets it. */
    uint64_t *moves;
    uint64_t own_moves;
};

/* The store of backend (STASH_BACKEND_*), or NULL for an unknown one. */
const store_ops *store_ops_of(uint32_t backend);

/* Opens a store handle of arena a's backend for a user that owns range
 * and holds slot. Returns 0 or an error. */
int store_open(stash_arena *a, uint32_t slot, stash_kg_range range, store **out);

/* Sets up the common part of a handle a store's open allocated. */
static inline void store_init(store *st, const store_ops *ops, stash_arena *a)
{
    st->ops = ops;
    st->arena = a;
    st->range = (stash_kg_range){0, a->hdr->max_parallelism - 1};
    st->moves = &st->own_moves;
}

/* The stores (backends/heap/, backends/lmdb/). */
extern const store_ops heap_store_ops;
extern const store_ops lmdb_store_ops;

/* Closes st; accepts NULL. */
void store_close(store *st);

#endif /* STASH_STORE_H */
