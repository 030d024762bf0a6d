/* SPDX-License-Identifier: MIT */
/*
 * index.h: a key group's index (index.c): where each entry's newest
 * version is, probed by lookup hash, grown without stopping the owner, and
 * walked in place.
 */
#ifndef STASH_SHM_INDEX_H
#define STASH_SHM_INDEX_H

#include "shm/hash.h"
#include "shm/record.h"

/* One array of an index: its groups, their count, and the first group not
 * moved yet (0 for the current array). */
typedef struct index_part {
    shm_group *g;
    uint32_t n;
    uint32_t from;
} index_part;

/* A reader's view of the index: both arrays as of one even shape. */
typedef struct index_view {
    index_part old, cur;
    uint32_t shape;
    bool any; /* the table has an index */
} index_view;

/* The lookup hash of the entry r holds, as its key group's index keys it: a
 * slot keeps only its tag, so moving an entry reads its record. */
static inline uint32_t shm_rec_hash(const shm_rec *r)
{
    uint64_t seed = shm_lookup_seed(r->state, shm_ns_hash(shm_rec_ns(r), r->nslen));
    return shm_lookup_hash(shm_key_hash(shm_rec_key(r), r->klen), seed);
}

/* Waits for an even value of seq (no change under way) into *out. Returns
 * false if kg's owner died in the middle of its change. */
bool shm_wait_even(const stash_arena *a, uint32_t kg, _Atomic uint32_t *seq, uint32_t *out);
/* -EAGAIN with a message: kg's owner died in the middle of a change. */
int shm_owner_died(const stash_arena *a, uint32_t kg);

/* Any process: takes a view of kg's index. Returns false if the owner died
 * in the middle of a move. */
bool shm_index_view(const stash_arena *a, uint32_t kg, index_view *v);
/* The newest version of l's entry in a view (a tombstone included), or NULL. */
shm_rec *shm_index_view_find(const stash_arena *a, const index_view *v, const shm_lookup *l);

/* Owner: puts a new entry of l, its record at ref, into c's free slot, or
 * finds one. Returns 0, or STASH_EFULL if the index has no free slot. */
int shm_index_insert(stash_arena *a, const shm_lookup *l, shm_cursor *c, shm_ref ref);
/* Owner: marks c's slot DELETED: the entry is gone from the index. */
void shm_index_clear(shm_table *t, const shm_cursor *c);
/* Owner: the slot at scan position *pos of kg or after it (moved groups are
 * skipped, moving *pos), in c, with its record if it holds an entry; false
 * past the end. */
bool shm_index_at(const stash_arena *a, uint32_t kg, uint32_t *pos, shm_cursor *c);

/* Owner: keeps room for the next insert (grows the index, or finishes a move
 * walkers held back). Returns an old array emptied on the way, for the
 * caller to retire, or 0. */
shm_off shm_index_make_room(stash_arena *a, uint32_t kg);
/* Owner: moves up to groups groups of the old array, unless a walker walks
 * kg; *moved says whether any moved. Returns the old array once it is
 * empty, for the caller to retire, or 0. */
shm_off shm_index_migrate(stash_arena *a, uint32_t kg, uint32_t groups, bool *moved);
/* After the owner died: finishes a switch or a group move it left half
 * done, and recounts the index. */
void shm_index_recover(stash_arena *a, uint32_t kg);

/* Calls each(a, head, ctx) for the newest version of every entry of kg, from
 * a view taken after a move under way ended; stops at the first non-zero
 * result, which it returns. */
typedef int shm_head_fn(stash_arena *a, shm_rec *head, void *ctx);
int shm_index_walk(stash_arena *a, uint32_t kg, shm_head_fn *each, void *ctx);

/* Owner: shm_table_find past its first look (index.c). */
int shm_table_find_probe(stash_arena *a, const shm_lookup *l, shm_cursor *c);

/* Owner: sizes an empty table for about n records, so that filling it (a
 * restore) moves nothing. Returns 0 or an allocation error. */
int shm_table_reserve(stash_arena *a, uint32_t kg, uint64_t n);

/* A process walking key group kg while its owner writes announces itself
 * for reclamation (slot as for shm_ebr_enter) and, from a reader slot, as a
 * walker of kg: the owner then moves no entry of kg, so the walk meets each
 * once. Growth waits for the walk only when the index is nearly full. */
void shm_table_walk_enter(stash_arena *a, uint32_t kg, uint32_t slot);
void shm_table_walk_exit(stash_arena *a, uint32_t kg, uint32_t slot);

/* Owner: the entries of kg one after another: the newest version of the
 * entry at scan position *pos or after (tombstones included), and, unless
 * hash is NULL, its lookup hash (computed from the record), advancing *pos
 * past it; NULL at the end. Start at 0. The owner may delete or replace
 * entries between calls (nothing moves), but not tend the table. */
shm_rec *shm_table_next(const stash_arena *a, uint32_t kg, uint32_t *pos, uint32_t *hash);

#endif /* STASH_SHM_INDEX_H */
