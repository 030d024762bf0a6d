/* SPDX-License-Identifier: MIT */
/*
 * table.h: the keyed tables (table.c): one per key group, written by its
 * owner only and read lock-free by any process; new records and their
 * versions, the lookups of the hot path (inline, over index.h) and the pins
 * that snapshots take. The structures they live in are shm/shm.h's.
 */
#ifndef STASH_SHM_TABLE_H
#define STASH_SHM_TABLE_H

#include "shm/index.h"

/* Any process: starts loading the home group of lookup hash h in key group
 * kg's index, so that a lookup soon after finds it in cache. */
static inline void shm_table_prefetch(const stash_arena *a, uint32_t kg, uint32_t h)
{
    const shm_table *t = &a->tables[kg];
    shm_off index = atomic_load_explicit(&t->index, memory_order_relaxed);
    uint32_t mask = (1u << atomic_load_explicit(&t->log2, memory_order_relaxed)) - 1;
    if (index) __builtin_prefetch((const shm_group *)(a->base + index) + (h & mask));
}

/* Owner: the record of the first slot with the tag of lookup hash h in its
 * home group of the index of table t, fetched as a block of span bytes, and
 * that group and slot; NULL if the group has no such slot or the index is
 * growing (an entry may then be in either array). The first look of every
 * owner's lookup, inline. */
static inline __attribute__((always_inline)) shm_rec *shm_table_home(const stash_arena *a,
                                                                     const shm_table *t, uint32_t h,
                                                                     uint32_t span, shm_group **grp,
                                                                     unsigned *slot)
{
    shm_off index = atomic_load_explicit(&t->index, memory_order_relaxed);
    if (__builtin_expect(!index || atomic_load_explicit(&t->old_index, memory_order_relaxed), 0))
        return NULL;
    uint32_t mask = (1u << atomic_load_explicit(&t->log2, memory_order_relaxed)) - 1;
    *grp = (shm_group *)(a->base + index) + (h & mask);
    unsigned m = shm_group_match(*grp, shm_slot_tag(h));
    if (__builtin_expect(m == 0, 0)) return NULL;
    *slot = shm_group_next(&m);
    /* A slot takes its reference before its tag and keeps it: the owner's
     * matched slot has one. */
    shm_rec *r = (shm_rec *)(a->base + shm_ref_off(atomic_load_explicit(&(*grp)->ref[*slot],
                                                                        memory_order_relaxed)));
    shm_rec_fetch(r, span);
    return r;
}

/* Owner: starts loading the record that group `step` of lookup hash h's
 * probe (0: its home group, 1: the next) in key group kg's index names
 * first under h's tag: a lookup fetched ahead in steps, shm_table_prefetch()
 * and, once its group is near, this. Reads the group, not the record.
 * Returns false if the group has no slot of that tag, having started on
 * the next group when step is 0 (an entry that found its home group full
 * is there most likely); true otherwise. */
static inline bool shm_table_prefetch_record(const stash_arena *a, uint32_t kg, uint32_t h,
                                             unsigned step)
{
    const shm_table *t = &a->tables[kg];
    shm_off index = atomic_load_explicit(&t->index, memory_order_relaxed);
    if (!index || atomic_load_explicit(&t->old_index, memory_order_relaxed)) return true;
    uint32_t mask = (1u << atomic_load_explicit(&t->log2, memory_order_relaxed)) - 1;
    const shm_group *groups = (const shm_group *)(a->base + index);
    const shm_group *g = groups + ((h + step) & mask);
    unsigned m = shm_group_match(g, shm_slot_tag(h));
    if (m) {
        unsigned slot = shm_group_next(&m);
        shm_off off = shm_ref_off(atomic_load_explicit(&g->ref[slot], memory_order_relaxed));
        const char *r = (const char *)(a->base + off);
        __builtin_prefetch(r);
        __builtin_prefetch(r + 64);
        return true;
    }
    if (step == 0) __builtin_prefetch(groups + ((h + 1) & mask));
    return false;
}

/* Owner: shm_table_find's first look: the entry in its home group. Returns
 * whether it found the entry there, and c. */
static inline __attribute__((always_inline)) bool
shm_table_find_home(stash_arena *a, const shm_lookup *l, shm_cursor *c)
{
    shm_group *grp;
    unsigned i;
    shm_rec *r = shm_table_home(a, &a->tables[l->kg], l->hash, SHM_FETCH_ANY, &grp, &i);
    if (__builtin_expect(!r || !shm_rec_matches(r, l), 0)) return false;
    *c = (shm_cursor){.group = grp, .slot = i, .in_old = false, .rec = r};
    return true;
}

/* Owner: the live record in table t of the entry named by name
 * (shm_name_word) with a key of 8 to 16 bytes and an empty namespace or one
 * of 8 to 16 bytes, if it is in its home group (fetched as a block of span
 * bytes); NULL otherwise, and shm_table_find decides. The common lookup,
 * compared with few instructions and no branch on lengths. */
static inline __attribute__((always_inline)) shm_rec *
shm_table_find_short(const stash_arena *a, const shm_table *t, uint32_t h, uint32_t span,
                     uint64_t name, const uint8_t *key, size_t klen, const uint8_t *ns,
                     size_t nslen)
{
    shm_group *grp;
    unsigned i;
    shm_rec *r = shm_table_home(a, t, h, span, &grp, &i);
    if (__builtin_expect(!r, 0)) return NULL;
    const uint8_t *k = shm_rec_key(r);
    uint64_t differ =
        ((shm_rec_name(r) ^ name) & SHM_LIVE_NAME_BITS) | shm_words_differ(k, key, klen);
    if (nslen) differ |= shm_words_differ(k + klen, ns, nslen);
    return __builtin_expect(differ == 0, 1) ? r : NULL;
}

/* Owner: finds the entry of l (cursor->rec NULL if absent). Returns 0 or an
 * allocation error. */
static inline __attribute__((always_inline)) int shm_table_find(stash_arena *a, const shm_lookup *l,
                                                                shm_cursor *c)
{
    return shm_table_find_home(a, l, c) ? 0 : shm_table_find_probe(a, l, c);
}

/* Owner: whether rec, in table t, may be changed in place (no pinned
 * reader can see it). */
static inline bool shm_rec_mutable(const shm_table *t, const shm_rec *rec)
{
    return rec->version >= atomic_load_explicit(&t->mutable_from, memory_order_relaxed);
}
/* The bytes the value of rec, whose key and namespace take keys bytes, may
 * grow to in place. */
static inline __attribute__((always_inline)) uint64_t shm_rec_room(const stash_arena *a,
                                                                   const shm_rec *rec, size_t keys)
{
    return shm_rec_block_bytes(a, rec) - shm_rec_link_bytes(rec) - sizeof *rec - keys;
}
/* The bytes the value of rec may grow to in place. */
static inline __attribute__((always_inline)) uint64_t shm_rec_capacity(const stash_arena *a,
                                                                       const shm_rec *rec)
{
    return shm_rec_room(a, rec, (size_t)rec->klen + rec->nslen);
}
/* Owner: makes a record that a pin sees mutable, if every pin is a walk's
 * and it keeps no older version: its bytes go to the key group's pre-image
 * log, where walks of those pins find them, and it takes the current
 * version. Returns whether it did (else the caller copies on write). */
bool shm_rec_save(stash_arena *a, uint32_t kg, shm_rec *rec);
/* Owner: a new, unpublished record for l with room for cap value bytes. */
int shm_rec_new(stash_arena *a, const shm_lookup *l, size_t cap, shm_rec **out);
/* Owner: makes rec the entry of c (found for l), replacing the old version,
 * which is retired or, if a pinned reader needs it, kept behind rec. Returns
 * 0, or STASH_EFULL for a new entry when the index is full and the arena has
 * no room to grow it. */
int shm_table_publish(stash_arena *a, const shm_lookup *l, shm_cursor *c, shm_rec *rec);
/* Owner: deletes the entry of c (a tombstone if a pinned reader needs it). */
int shm_table_delete(stash_arena *a, const shm_lookup *l, shm_cursor *c);
/* Owner: brackets an in-place change of a mutable record's value that
 * overwrites the n regions (bytes past the old length need none). Saves
 * their bytes for a crash's undo; returns false, changing nothing, if they
 * exceed SHM_UNDO_BYTES (the caller then writes a new record instead). */
bool shm_rec_write_begin(stash_arena *a, uint32_t kg, shm_rec *rec, const shm_region *r,
                         unsigned n);
static inline __attribute__((always_inline)) void shm_rec_write_end(shm_table *t, shm_rec *rec)
{
    /* Changed in the current version: a delta from an older base finds it. */
    rec->version = atomic_load_explicit(&t->epoch, memory_order_relaxed);
    atomic_store_explicit(&rec->seq, atomic_load_explicit(&rec->seq, memory_order_relaxed) + 1,
                          memory_order_release);
    atomic_store_explicit(&t->undo.rec, 0, memory_order_release);
}
/* Owner: names rec in the undo record u as changed in place, with the n
 * regions u holds (0: a redo, u holding the whole new value) and a value of
 * vlen bytes (before the change, or with a redo after it), then makes rec's
 * sequence odd: from here a crash's recovery finishes or undoes it. */
static inline __attribute__((always_inline)) void
shm_undo_open(const stash_arena *a, shm_undo *u, shm_rec *rec, unsigned n, uint32_t vlen)
{
    u->nregions = n;
    u->vlen = vlen;
    atomic_store_explicit(&u->rec, shm_ref_of(shm_off_of(a, rec)), memory_order_release);
    /* Odd only after the undo names the record (recovery looks there). */
    atomic_store_explicit(&rec->seq, atomic_load_explicit(&rec->seq, memory_order_relaxed) + 1,
                          memory_order_release);
    atomic_thread_fence(memory_order_release);
}
/* Owner: replaces the whole value of a mutable record in table t, which
 * starts at dst and has room for len bytes, in place, under its sequence
 * lock. The new value is saved first for a crash's redo, so the old one
 * need not be read. Returns false, changing nothing, if it is longer than
 * SHM_UNDO_BYTES. */
static inline __attribute__((always_inline)) bool shm_rec_overwrite(const stash_arena *a,
                                                                    shm_table *t, shm_rec *rec,
                                                                    uint8_t *dst, const void *value,
                                                                    size_t len)
{
    if (len > SHM_UNDO_BYTES) return false;
    shm_undo *u = &t->undo;
    if (len >= 16 && len <= SHM_HELD_MAX) {
        /* Loaded once for both copies. */
        shm_held h = shm_hold(value, len);
        shm_unhold(u->bytes, &h, len);
        shm_undo_open(a, u, rec, 0, (uint32_t)len);
        shm_unhold(dst, &h, len);
    } else {
        shm_copy_small(u->bytes, value, len);
        shm_undo_open(a, u, rec, 0, (uint32_t)len);
        shm_copy_small(dst, value, len);
    }
    atomic_store_explicit(&rec->vlen, (uint32_t)len, memory_order_relaxed);
    shm_rec_write_end(t, rec);
    return true;
}
/* Whether t is pinned, by walks and bases only. */
static inline bool shm_table_walks_only(const shm_table *t)
{
    unsigned held = 0;
    for (unsigned i = 0; i < SHM_MAX_PINS; i++)
        held |= (unsigned)(atomic_load_explicit(&t->pins[i], memory_order_relaxed) != 0) << i;
    return held && !(held & ~(atomic_load_explicit(&t->pin_walk, memory_order_relaxed) |
                              atomic_load_explicit(&t->pin_base, memory_order_relaxed)));
}
/* The bytes an entry of a record of rbytes bytes takes in the pre-image log. */
static inline uint32_t shm_prelog_entry_bytes(uint32_t rbytes)
{
    return (uint32_t)sizeof(shm_prelog_entry) + ((rbytes + 7u) & ~7u);
}
/* Owner: shm_rec_save, then an overwrite of the value with len <=
 * SHM_UNDO_BYTES bytes at dst, which has room for them: in one bracket,
 * with no redo copy, where the log's newest chunk has room and rec keeps
 * no older version; otherwise shm_rec_save and shm_rec_overwrite. Returns
 * false, changing nothing, if rec cannot be saved (the caller then copies
 * on write). */
static inline __attribute__((always_inline)) bool
shm_rec_save_overwrite(stash_arena *a, shm_table *t, shm_rec *rec, uint8_t *dst, const void *value,
                       size_t len)
{
    uint32_t rbytes =
        (uint32_t)(dst - (uint8_t *)rec) + atomic_load_explicit(&rec->vlen, memory_order_relaxed);
    uint32_t n = shm_prelog_entry_bytes(rbytes);
    shm_off off = atomic_load_explicit(&t->prelog, memory_order_relaxed);
    shm_prelog_chunk *c = (shm_prelog_chunk *)(a->base + off);
    if (!off || (rec->flags & (SHM_REC_LINKED | SHM_REC_TOMBSTONE)) || rbytes > SHM_UNDO_BYTES ||
        c->cap - atomic_load_explicit(&c->used, memory_order_relaxed) < n ||
        !shm_table_walks_only(t))
        return shm_rec_save(a, (uint32_t)(t - a->tables), rec) &&
               shm_rec_overwrite(a, t, rec, dst, value, len);
    /* The value is written only once the old record is whole in the log,
     * where a crash's recovery finds it to undo the change. */
    shm_undo_open(a, &t->undo, rec, SHM_UNDO_SAVE_PUT, rec->version);
    uint32_t used = atomic_load_explicit(&c->used, memory_order_relaxed);
    shm_prelog_entry *e = (shm_prelog_entry *)(void *)(c->bytes + used);
    uint32_t until = atomic_load_explicit(&t->epoch, memory_order_relaxed);
    *e = (shm_prelog_entry){shm_ref_of(shm_off_of(a, rec)), until, rbytes, 0};
    shm_rec *copy = (shm_rec *)(e + 1);
    shm_copy_small((uint8_t *)copy, (const uint8_t *)rec, rbytes);
    atomic_store_explicit(&copy->seq, 0, memory_order_relaxed);
    atomic_store_explicit(&c->used, used + n, memory_order_release);
    atomic_store_explicit(&t->prelog_end, c->start + used + n, memory_order_release);
    /* The record changes only after the entry is whole, for recovery. */
    atomic_thread_fence(memory_order_release);
    shm_copy_small(dst, value, len);
    atomic_store_explicit(&rec->vlen, (uint32_t)len, memory_order_relaxed);
    shm_rec_write_end(t, rec); /* the new version: until */
    return true;
}
/* After the owner died: finishes a move between index arrays and undoes a
 * half-done in-place change, so the table is whole again, and releases every
 * pin (a checkpoint in flight when an owner of its key groups dies fails with it). */
void shm_table_recover(stash_arena *a, uint32_t kg);
/* Owner: a step of background work (growth, pruning, reclamation), bounded by budget. */
void shm_table_maintain(stash_arena *a, uint32_t kg, uint32_t budget);
#define SHM_TEND_BUDGET 2u /* groups a write moves or sweeps */
/* Whether table t has background work pending (a sweep, a growth, a
 * prune after an unpin). */
static inline bool shm_table_untended(const shm_table *t)
{
    return t->sweep_pos != UINT32_MAX ||
           atomic_load_explicit(&t->pins_gen, memory_order_relaxed) != t->swept_gen ||
           atomic_load_explicit(&t->old_index, memory_order_relaxed) ||
           atomic_load_explicit(&t->used, memory_order_relaxed) > t->grow_at;
}
/* Owner: a small step of pending background work, if any; call it before a
 * write's lookup (never between a lookup and the change that uses its cursor:
 * the step may move entries). Every write calls it, so pruning and growth go
 * on under any write load. */
static inline void shm_table_tend(stash_arena *a, uint32_t kg)
{
    if (shm_table_untended(&a->tables[kg])) shm_table_maintain(a, kg, SHM_TEND_BUDGET);
}

/* Owner: pins the current version of key group kg for a reader and starts a
 * new one; returns the pinned version (> 0) or -EBUSY if all pins are taken. */
int64_t shm_table_pin(stash_arena *a, uint32_t kg);
/* Owner: pins as shm_table_pin() does, for holder (1 + a reader slot's
 * index): the pin then outlives the owner while the holder's process lives.
 * A walk's pin (walk) is only ever walked (shm_table_walk_at), never looked
 * up in nor used as a delta's base: while every pin is a walk's, a record
 * they see is saved to the pre-image log and changed in place instead of
 * being copied (shm_rec_save). */
int64_t shm_table_pin_for(stash_arena *a, uint32_t kg, uint32_t holder, bool walk);
/* Any process: makes the pin of version a delta's base, once a walk of it
 * is done: it sees no version any more (records it saw change in place,
 * neither saved nor copied), and while it stays every entry deleted after
 * it keeps a tombstone, so that shm_table_walk_delta() from it finds every
 * change by the versions records carry. While the engine keeps deltas
 * (hdr->change_track), every pin keeps the tombstones of later deletes,
 * so that a walk's pin, rebased, misses none made before. */
void shm_table_pin_rebase(stash_arena *a, uint32_t kg, uint32_t version);
/* Any process: releases a pin; the owner prunes what only it kept. */
void shm_table_unpin(stash_arena *a, uint32_t kg, uint32_t version);
/* Any process: releases every pin held for holder in every key group (its
 * process died, or a new process took its reader slot over), and forgets
 * any walk its process had announced. With keep, the pin of version
 * keep[kg] (0: none) stays: pins a worker died taking for the holder before
 * it could say so go, the holder's own stay. */
void shm_table_release_holder(stash_arena *a, uint32_t holder, const uint32_t *keep);
/* The record of l as of a pinned version (NULL if absent then, or if the
 * owner died in the middle of a move). The caller holds the pin, so the
 * versions it sees do not change, and is the owner or reads inside
 * shm_ebr_enter/exit, so that the heads it passes stay allocated. */
shm_rec *shm_table_get_at(stash_arena *a, const shm_lookup *l, uint32_t version);

/* Visits every live record of key group kg as of a pinned version (the
 * newest version at or below it, tombstones left out, and the pre-image
 * log's records of that version), calling fn(rec, ctx) until it returns
 * non-zero, which is returned. rec may be a copy, valid during the call. The caller holds the pin
 * and, in another process than the owner, walks inside shm_table_walk_enter/exit. -EAGAIN if the
 * owner died in the middle of a move. */
typedef int shm_visit_fn(const shm_rec *rec, void *ctx);
int shm_table_walk_at(stash_arena *a, uint32_t kg, uint32_t version, shm_visit_fn *fn, void *ctx);

/* Visits what changed in key group kg between two pinned versions base <
 * version: every entry whose newest version at or below version was
 * written after base, fn(rec, deleted, ctx) with that record (a tombstone,
 * deleted set, if the entry was deleted), the pre-image log's included, as
 * shm_table_walk_at() meets them. An entry written after base may be met
 * though its value is the base's again, and one deleted may be absent at
 * base; never is a change missed, so long as base kept the tombstones of
 * the deletes after it: a reader's pin, a base's (shm_table_pin_rebase()),
 * or any pin while hdr->change_track is set. The caller holds both pins
 * and walks as for shm_table_walk_at(). Returns the first non-zero fn
 * result, or 0. */
typedef int shm_delta_fn(const shm_rec *rec, bool deleted, void *ctx);
int shm_table_walk_delta(stash_arena *a, uint32_t kg, uint32_t base, uint32_t version,
                         shm_delta_fn *fn, void *ctx);

/* A reader (reader_slot: STASH_MAX_WORKERS + its reader slot): calls
 * fn(rec, value, ctx) for every live entry of key group kg, rec its newest
 * record and value a copy of rec's value taken under its sequence lock
 * (never torn), until fn returns non-zero, which is returned. No pin: the
 * owner goes on writing meanwhile (it moves no entry while the walk lasts),
 * so an entry written during the walk is met as before or after the write,
 * and one added during it may be missed. Returns 0 or an error. */
typedef int shm_scan_fn(const shm_rec *rec, stash_bytes value, void *ctx);
int shm_table_scan(stash_arena *a, uint32_t kg, uint32_t reader_slot, shm_scan_fn *fn, void *ctx);

/* Any process: copies the value of l's entry into *buf (grown with realloc as
 * needed) under the record's sequence lock, so the copy is never torn.
 * Returns the value's length, STASH_ENOTFOUND, or -ENOMEM. */
int64_t shm_table_read_copy(stash_arena *a, uint32_t reader_slot, const shm_lookup *l,
                            uint8_t **buf, size_t *cap);

#endif
