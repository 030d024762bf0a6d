/* SPDX-License-Identifier: MIT */
/*
 * table.h: the keyed tables (table.c, index.c): one per key group, written
 * by its owner only and read lock-free by any process; records, their
 * versions, the index's lookups (the hot path, inline) and the pins that
 * snapshots take. The structures they live in are shm/shm.h's.
 */
#ifndef STASH_SHM_TABLE_H
#define STASH_SHM_TABLE_H

#include "shm/shm.h"

/* What identifies an entry: state, key and namespace, with their hash. */
typedef struct shm_lookup {
    uint32_t kg;
    uint32_t hash;
    uint16_t state;
    uint16_t klen;
    uint16_t nslen;
    const void *key;
    const void *ns;
} shm_lookup;

/* Where an entry lives: its slot in the index (or the free slot a new entry
 * of it takes) and its record. Valid until the owner's next change. */
typedef struct shm_cursor {
    shm_group *group; /* NULL: no slot (the entry is absent and the index full) */
    uint32_t slot;
    bool in_old;  /* the slot is in the index being emptied */
    shm_rec *rec; /* the newest version, tombstones included; NULL if none */
} shm_cursor;

static inline const uint8_t *shm_rec_key(const shm_rec *r)
{
    return (const uint8_t *)(r + 1);
}
static inline const uint8_t *shm_rec_ns(const shm_rec *r)
{
    return shm_rec_key(r) + r->klen;
}
static inline uint8_t *shm_rec_value(shm_rec *r)
{
    return (uint8_t *)(r + 1) + r->klen + r->nslen;
}
static inline bool shm_rec_live(const shm_rec *r)
{
    return r && !(r->flags & SHM_REC_TOMBSTONE);
}
/* The bytes of rec's block. */
static inline __attribute__((always_inline)) uint64_t shm_rec_block_bytes(const stash_arena *a,
                                                                          const shm_rec *rec)
{
    /* The class in the header spares a look at the span descriptors. */
    return rec->size_class == SHM_CLASS_LARGE ? shm_block_size(a, shm_off_of(a, rec))
                                              : shm_class_bytes(rec->size_class);
}
/* The bytes at the end of rec's block that hold its link, 0 if unlinked. */
static inline uint64_t shm_rec_link_bytes(const shm_rec *rec)
{
    return rec->flags & SHM_REC_LINKED ? sizeof(shm_ref) : 0;
}
/* The older version's link of a LINKED record. */
static inline _Atomic shm_ref *shm_rec_link(const stash_arena *a, shm_rec *r)
{
    return (_Atomic shm_ref *)(void *)((uint8_t *)r + shm_rec_block_bytes(a, r) - sizeof(shm_ref));
}
/* The older version r keeps for a pinned reader, 0 if none. */
static inline shm_ref shm_rec_older(const stash_arena *a, const shm_rec *r)
{
    return (r->flags & SHM_REC_LINKED)
               ? atomic_load_explicit(shm_rec_link(a, (shm_rec *)r), memory_order_acquire)
               : 0;
}

/* The tag a slot keeps for an entry of lookup hash h. */
static inline uint16_t shm_slot_tag(uint32_t h)
{
    return (uint16_t)(h >> 16);
}

/* The slots of g whose tag is tag: bit 2i for slot i. */
static inline unsigned shm_group_match(const shm_group *g, uint16_t tag)
{
#ifdef SHM_GROUP_SIMD
    /* Tags 0 to 7, then 2 to 9: each 2-byte tag read whole, within the line. */
    const uint8_t *p = (const uint8_t *)(const void *)g->tag;
    __m128i want = _mm_set1_epi16((short)tag);
    unsigned lo = (unsigned)_mm_movemask_epi8(
        _mm_cmpeq_epi16(_mm_load_si128((const __m128i *)(const void *)p), want));
    unsigned hi = (unsigned)_mm_movemask_epi8(
        _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)(const void *)(p + 4)), want));
    return (lo | hi << 4) & 0x55555u;
#else
    unsigned m = 0;
    for (unsigned i = 0; i < SHM_GROUP_SLOTS; i++)
        m |= (unsigned)(atomic_load_explicit(&g->tag[i], memory_order_relaxed) == tag) << (2 * i);
    return m;
#endif
}

/* The slot of the lowest bit of a match mask, taken off the mask. */
static inline unsigned shm_group_next(unsigned *mask)
{
    unsigned i = (unsigned)__builtin_ctz(*mask) >> 1;
    *mask &= *mask - 1;
    return i;
}

/* Non-zero unless the n bytes at x and y, 8 <= n <= 16, are equal: their
 * first and last 8 bytes compared, with no branch. */
static inline __attribute__((always_inline)) uint64_t shm_words_differ(const uint8_t *x,
                                                                       const uint8_t *y, size_t n)
{
    uint64_t a0, a1, b0, b1;
    __builtin_memcpy(&a0, x, 8), __builtin_memcpy(&a1, x + n - 8, 8);
    __builtin_memcpy(&b0, y, 8), __builtin_memcpy(&b1, y + n - 8, 8);
    return (a0 ^ b0) | (a1 ^ b1);
}

/* Byte equality without a call for keys and namespaces of at most 16
 * bytes, the usual: two overlapping loads from each. */
static inline __attribute__((always_inline)) bool shm_bytes_equal(const uint8_t *x,
                                                                  const uint8_t *y, size_t n)
{
    if (n > 16) return __builtin_memcmp(x, y, n) == 0;
    if (n >= 8) return shm_words_differ(x, y, n) == 0;
    if (n >= 4) {
        uint32_t c0, c1, d0, d1;
        __builtin_memcpy(&c0, x, 4), __builtin_memcpy(&c1, x + n - 4, 4);
        __builtin_memcpy(&d0, y, 4), __builtin_memcpy(&d1, y + n - 4, 4);
        return ((c0 ^ d0) | (c1 ^ d1)) == 0;
    }
    return n == 0 || (x[0] == y[0] && x[n / 2] == y[n / 2] && x[n - 1] == y[n - 1]);
}

/* 16 bytes at any alignment, moved as one vector where the target has them. */
typedef uint8_t shm_bytes16 __attribute__((vector_size(16), aligned(1), may_alias));

static inline __attribute__((always_inline)) shm_bytes16 shm_load16(const uint8_t *s)
{
    return *(const shm_bytes16 *)(const void *)s;
}
static inline __attribute__((always_inline)) void shm_store16(uint8_t *d, shm_bytes16 v)
{
    *(shm_bytes16 *)(void *)d = v;
}
static inline void shm_move16(uint8_t *d, const uint8_t *s)
{
    shm_store16(d, shm_load16(s));
}

static inline void shm_move64(uint8_t *d, const uint8_t *s)
{
    shm_move16(d, s), shm_move16(d + 16, s + 16);
    shm_move16(d + 32, s + 32), shm_move16(d + 48, s + 48);
}

/* Copies n <= SHM_UNDO_BYTES bytes between buffers that do not overlap,
 * without a call: moves of 64, 16, 8, 4 or 1 bytes, the last one
 * overlapping the one before it. */
static inline __attribute__((always_inline)) void shm_copy_small(uint8_t *d, const uint8_t *s,
                                                                 size_t n)
{
    if (n >= 64) {
        for (size_t i = 0; i + 64 < n; i += 64) shm_move64(d + i, s + i);
        shm_move64(d + n - 64, s + n - 64);
    } else if (n >= 16) {
        for (size_t i = 0; i + 16 < n; i += 16) shm_move16(d + i, s + i);
        shm_move16(d + n - 16, s + n - 16);
    } else if (n >= 8) {
        __builtin_memcpy(d, s, 8), __builtin_memcpy(d + n - 8, s + n - 8, 8);
    } else if (n >= 4) {
        __builtin_memcpy(d, s, 4), __builtin_memcpy(d + n - 4, s + n - 4, 4);
    } else if (n) {
        d[0] = s[0], d[n / 2] = s[n / 2], d[n - 1] = s[n - 1];
    }
}

/* 16 to 128 bytes held in vector registers, to be stored more than once
 * after one load: the first and last 16, 32 or 64 bytes, which overlap. */
#define SHM_HELD_MAX 128u
typedef struct shm_held {
    shm_bytes16 head[4], tail[4];
} shm_held;

static inline __attribute__((always_inline)) shm_held shm_hold(const uint8_t *s, size_t n)
{
    shm_held h;
    const uint8_t *e = s + n;
    if (n >= 64) {
        h.head[0] = shm_load16(s), h.head[1] = shm_load16(s + 16);
        h.head[2] = shm_load16(s + 32), h.head[3] = shm_load16(s + 48);
        h.tail[0] = shm_load16(e - 64), h.tail[1] = shm_load16(e - 48);
    } else if (n >= 32) {
        h.head[0] = shm_load16(s), h.head[1] = shm_load16(s + 16);
    } else {
        h.head[0] = shm_load16(s);
    }
    if (n >= 32) h.tail[2] = shm_load16(e - 32);
    h.tail[3] = shm_load16(e - 16);
    return h;
}

static inline __attribute__((always_inline)) void shm_unhold(uint8_t *d, const shm_held *h,
                                                             size_t n)
{
    uint8_t *e = d + n;
    if (n >= 64) {
        shm_store16(d, h->head[0]), shm_store16(d + 16, h->head[1]);
        shm_store16(d + 32, h->head[2]), shm_store16(d + 48, h->head[3]);
        shm_store16(e - 64, h->tail[0]), shm_store16(e - 48, h->tail[1]);
    } else if (n >= 32) {
        shm_store16(d, h->head[0]), shm_store16(d + 16, h->head[1]);
    } else {
        shm_store16(d, h->head[0]);
    }
    if (n >= 32) shm_store16(e - 32, h->tail[2]);
    shm_store16(e - 16, h->tail[3]);
}

/* State, key length and namespace length lie side by side in both. */
_Static_assert(offsetof(shm_rec, klen) == offsetof(shm_rec, state) + 2 &&
                   offsetof(shm_rec, nslen) == offsetof(shm_rec, state) + 4 &&
                   offsetof(shm_lookup, klen) == offsetof(shm_lookup, state) + 2 &&
                   offsetof(shm_lookup, nslen) == offsetof(shm_lookup, state) + 4,
               "state, klen and nslen are compared as one word");

/* A record's state, key length, namespace length and flags as one
 * (little-endian) word; the bits of it that name an entry, and those and
 * TOMBSTONE, which a live version of the entry has clear. */
_Static_assert(offsetof(shm_rec, flags) == offsetof(shm_rec, state) + 6,
               "the flags follow the lengths in the name word");
#define SHM_NAME_BITS 0xffffffffffffull
#define SHM_LIVE_NAME_BITS (SHM_NAME_BITS | (uint64_t)SHM_REC_TOMBSTONE << 48)
static inline uint64_t shm_rec_name(const shm_rec *r)
{
    uint64_t x;
    __builtin_memcpy(&x, &r->state, 8);
    return x;
}
/* The name word of the entries of state with keys of klen bytes in
 * namespaces of nslen bytes. */
static inline uint64_t shm_name_word(uint16_t state, uint16_t klen, uint16_t nslen)
{
    return state | (uint64_t)klen << 16 | (uint64_t)nslen << 32;
}

/* Whether r is a version of l's entry. */
static inline __attribute__((always_inline)) bool shm_rec_matches(const shm_rec *r,
                                                                  const shm_lookup *l)
{
    uint64_t y;
    __builtin_memcpy(&y, &l->state, 8);
    return ((shm_rec_name(r) ^ y) & SHM_NAME_BITS) == 0 &&
           shm_bytes_equal(shm_rec_key(r), l->key, l->klen) &&
           shm_bytes_equal(shm_rec_ns(r), l->ns, l->nslen);
}

/* Starts loading the lines past its first that record r covers if its
 * block spans span bytes, up to two, so that a value arrives with its
 * header. A lookup that cannot guess the block's size fetches two. */
#define SHM_FETCH_ANY 192u
static inline void shm_rec_fetch(const shm_rec *r, uint32_t span)
{
    uint64_t end = ((uintptr_t)r & 63) + span;
    if (end > 64) __builtin_prefetch((const char *)r + 64);
    if (end > 128) __builtin_prefetch((const char *)r + 128);
}
/* The record of slot i of g whose tag matched, fetched whole. */
static inline shm_rec *shm_group_rec(const stash_arena *a, const shm_group *g, unsigned i)
{
    shm_rec *r = shm_rec_at(a, atomic_load_explicit(&g->ref[i], memory_order_acquire));
    if (r) shm_rec_fetch(r, SHM_FETCH_ANY);
    return r;
}

/* Owner: shm_table_find past its first look (index.c). */
int shm_table_find_probe(stash_arena *a, const shm_lookup *l, shm_cursor *c);

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

/* Owner: sizes an empty table for about n records, so that filling it (a
 * restore) moves nothing. Returns 0 or an allocation error. */
int shm_table_reserve(stash_arena *a, uint32_t kg, uint64_t n);

/* Owner: whether rec, in table t, may be changed in place (no pinned
 * reader can see it). */
static inline bool shm_rec_mutable(const shm_table *t, const shm_rec *rec)
{
    return rec->version == atomic_load_explicit(&t->epoch, memory_order_relaxed);
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
 * index): the pin then outlives the owner while the holder's process lives. */
int64_t shm_table_pin_for(stash_arena *a, uint32_t kg, uint32_t holder);
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

/* A process walking key group kg while its owner writes announces itself
 * for reclamation (slot as for shm_ebr_enter) and, from a reader slot, as a
 * walker of kg: the owner then moves no entry of kg, so the walk meets each
 * once. Growth waits for the walk only when the index is nearly full. */
void shm_table_walk_enter(stash_arena *a, uint32_t kg, uint32_t slot);
void shm_table_walk_exit(stash_arena *a, uint32_t kg, uint32_t slot);

/* Visits every live record of key group kg as of a pinned version (the
 * newest version at or below it, tombstones left out), calling fn(rec, ctx)
 * until it returns non-zero, which is returned. The caller holds the pin and,
 * in another process than the owner, walks inside shm_table_walk_enter/exit.
 * -EAGAIN if the owner died in the middle of a move. */
typedef int shm_visit_fn(const shm_rec *rec, void *ctx);
int shm_table_walk_at(stash_arena *a, uint32_t kg, uint32_t version, shm_visit_fn *fn, void *ctx);

/* Visits what changed in key group kg between two pinned versions base <
 * version: for every entry whose newest version at or below version differs
 * from its newest at or below base, fn(rec, ctx) with that record, or with
 * the base's record and deleted set if the entry is gone by version. The
 * caller holds both pins. Returns the first non-zero fn result, or 0. */
typedef int shm_delta_fn(const shm_rec *rec, bool deleted, void *ctx);
int shm_table_walk_delta(stash_arena *a, uint32_t kg, uint32_t base, uint32_t version,
                         shm_delta_fn *fn, void *ctx);

/* Any process: copies the value of l's entry into *buf (grown with realloc as
 * needed) under the record's sequence lock, so the copy is never torn.
 * Returns the value's length, STASH_ENOTFOUND, or -ENOMEM. */
int64_t shm_table_read_copy(stash_arena *a, uint32_t reader_slot, const shm_lookup *l,
                            uint8_t **buf, size_t *cap);

/* Owner: the entries of kg one after another: the newest version of the
 * entry at scan position *pos or after (tombstones included), and, unless
 * hash is NULL, its lookup hash (computed from the record), advancing *pos
 * past it; NULL at the end. Start at 0. The owner may delete or replace
 * entries between calls (nothing moves), but not tend the table. */
shm_rec *shm_table_next(const stash_arena *a, uint32_t kg, uint32_t *pos, uint32_t *hash);

#endif
