/* SPDX-License-Identifier: MIT */
/*
 * lmdb.h: the lmdb keyed backend: every key group's records in an LMDB
 * environment of its own on disk, under the arena's directory. The state
 * kinds (value.c, list.c, map.c) work on records as they do in the heap
 * backend; for lmdb a record is a private copy (a shadow) that a write puts
 * back. The owner of a key group writes in one transaction, committed at
 * each barrier, when it closes, and early when the transaction grows big;
 * other processes read what was last committed.
 */
#ifndef STASH_BACKENDS_LMDB_H
#define STASH_BACKENDS_LMDB_H

#include "backends/checkpoint/snapshot.h"

/* A store: one user's transactions on an lmdb arena's environments (each
 * taken on first use from the process's one handle per file, lmdb_env.h). */
int lmdb_store_new(stash_arena *a, lmdb_store **out);
/* Commits what is open and closes every environment. Accepts NULL. */
void lmdb_store_free(lmdb_store *st);
/* Opens the worker's store. Returns 0 or an error. */
int lmdb_store_open(stash_worker *w);
/* Commits what the worker wrote and closes every environment. */
void lmdb_store_close(stash_worker *w);
/* Commits every open transaction of the worker (a barrier). Returns 0 or
 * the first failure, naming the key group. */
int lmdb_store_commit(stash_worker *w);

/* A worker's open transactions, charged their values and the pages each
 * change may copy, commit before their charges together pass this: a
 * bound on the dirty pages they hold in memory. */
#define LMDB_STORE_MAX_BYTES (256ull << 20)

/* Commits if the last commit is LMDB_COMMIT_MS old or more. */
#define LMDB_COMMIT_MS 50u
int lmdb_store_commit_due(stash_worker *w);

/* The heap backend's record operations, for lmdb (see shm/shm.h). */
int lmdb_find(stash_worker *w, const shm_lookup *l, shm_cursor *c);
/* Owned key groups: a view of the stored bytes (valid until the worker's
 * next write) in out, and with shadow a private copy of the record in c for
 * a write that follows (else c->rec is NULL). */
int lmdb_read_owned(stash_worker *w, const shm_lookup *l, shm_cursor *c, stash_bytes *out,
                    bool shadow);
/* Any key group: a copy of the value last committed, into *buf. Returns its
 * length or an error (STASH_ENOTFOUND). */
int64_t lmdb_read_copy(stash_worker *w, const shm_lookup *l, uint8_t **buf, size_t *cap);
int lmdb_rec_new(stash_worker *w, const shm_lookup *l, size_t cap, shm_rec **out);
/* Puts rec (a shadow, which names its own key) into the store and, if c,
 * makes it c's. */
int lmdb_publish(stash_worker *w, shm_cursor *c, shm_rec *rec);
int lmdb_delete(stash_worker *w, const shm_lookup *l, shm_cursor *c);

/* Keys of state in an owned key group, in key order: fills *r with a
 * shadow header (key and namespace views, the value's bytes) of the first
 * record after (after, after_len) (NULL: the first). Returns 1, 0 at the
 * end of the key group, or an error. */
typedef struct lmdb_entry {
    uint16_t state;
    stash_bytes key;
    stash_bytes ns;
    stash_bytes value;
    stash_bytes raw_key; /* the whole stored key, to go on from */
} lmdb_entry;
int lmdb_next(stash_worker *w, uint32_t kg, uint16_t state, const void *after, size_t after_len,
              lmdb_entry *out);
/* Records in kg: through the worker's transaction where it has one. */
int64_t lmdb_kg_entries(stash_worker *w, uint32_t kg);
/* Removes expired records of s from kg: a few at a time, going on where the
 * last call stopped (Flink's incremental cleanup). */
void lmdb_ttl_cleanup(stash_state *s, uint32_t kg);

/* Checkpoints. The engine opens a snapshot (a read transaction) of every
 * key group while its cut holds the owner's commits back; serializes each
 * into the canonical block (lmdb_snap_write_kg, a ckpt_opts.serialize_kg):
 * all of it, or with base_id the keys the change log (as pinned at pin)
 * names since that checkpoint, deletions included; then closes them all. */
int lmdb_snap_open(lmdb_store *st, uint32_t kg);
int64_t lmdb_snap_write_kg(void *store, uint32_t kg, uint64_t base_id, uint32_t pin, bool lz4,
                           const snap_filter *filter, snap_buf *out);
/* Closes kg's snapshot (a cut it was opened for went away), or every one. */
void lmdb_snap_close_kg(lmdb_store *st, uint32_t kg);
void lmdb_snap_close(lmdb_store *st);

/* Restoring into key groups nobody writes meanwhile: begin notes which are
 * empty (records in key order then append), each record is put or deleted
 * in its key group's transaction, which the end of the key group commits
 * (or, after a failure, aborts). */
typedef struct lmdb_restorer {
    lmdb_store *store;
    const snap_id_map *map;
} lmdb_restorer;
int lmdb_restore_begin(lmdb_store *st, stash_kg_range range);
int lmdb_restore_record(void *restorer, uint32_t kg, const snap_record *r);
int lmdb_restore_kg_done(void *restorer, uint32_t kg, int rc);
/* Empties key groups range (a rollback's first step). */
int lmdb_clear(lmdb_store *st, stash_kg_range range);

#endif /* STASH_BACKENDS_LMDB_H */
