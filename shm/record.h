/* SPDX-License-Identifier: MIT */
/*
 * record.h: a keyed record as the arena holds it (shm/shm.h's shm_rec): the
 * lookup that names its entry, its key, namespace and value, the link to
 * its older version, and how an index group's slots find it.
 */
#ifndef STASH_SHM_RECORD_H
#define STASH_SHM_RECORD_H

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
/* Owner: marks slot i of g, an index group of table t, as one the prune
 * sweep must read (on), or not; a mark set is counted in t->marked. */
static inline void shm_group_keep(shm_table *t, shm_group *g, unsigned i, bool on)
{
    uint32_t m = atomic_load_explicit(&g->kept, memory_order_relaxed);
    m = on ? m | 1u << i : m & ~(1u << i);
    atomic_store_explicit(&g->kept, m, memory_order_relaxed);
    if (on && t->marked != UINT32_MAX) t->marked++;
}

static inline bool shm_group_kept(const shm_group *g, unsigned i)
{
    return atomic_load_explicit(&g->kept, memory_order_relaxed) >> i & 1u;
}

/* The record of slot i of g whose tag matched, fetched whole. */
static inline shm_rec *shm_group_rec(const stash_arena *a, const shm_group *g, unsigned i)
{
    shm_rec *r = shm_rec_at(a, atomic_load_explicit(&g->ref[i], memory_order_acquire));
    if (r) shm_rec_fetch(r, SHM_FETCH_ANY);
    return r;
}

#endif /* STASH_SHM_RECORD_H */
