/* SPDX-License-Identifier: MIT */
/*
 * raw.h: the keyed bench's raw tables in a shared mapping of a /dev/shm
 * file, values inline in fixed slots, no versions, no locks, no
 * reclamation: what a table in shared memory costs when it does nothing
 * else. Defined here, inline, so that the bench's pass over each one is a
 * loop of its own with no call through a pointer (keyed.c).
 *
 * - raw-table, the one-miss limit: the bench's keys are a bijective mix of
 *   dense indices (bench_key), and this table inverts the mix, so a key's
 *   slot is its index: one 128-byte slot, aligned (one pair of cache lines,
 *   which the adjacent-line prefetcher fetches as one), no probing. No table
 *   for arbitrary keys reaches a value with less.
 * - raw-lp: linear probing over the key's XXH3 hash (the hash stash gives
 *   keys), slots of key and value, sized as stash sizes a key group's index
 *   (doubled when 7/8 full): what a plain table of arbitrary keys costs.
 * - raw-index: stash's two steps with nothing else: an index of one-line
 *   groups of ten (16-bit tag, 32-bit reference) over the key's XXH3 hash,
 *   probed group by group, sized as raw-lp, naming records of key and value
 *   that lie in an array of their own in the order they were written: two
 *   dependent misses a lookup, where the tables above take one.
 *
 * A map entry is a slot of its own under (key, user key).
 */
#ifndef STASH_TOOLS_BENCH_RAW_H
#define STASH_TOOLS_BENCH_RAW_H

#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "tools/bench/peers.h"

#define RAW_DIRECT_SLOT 128u
#define RAW_GROUP_SLOTS 10u

enum { RAW_DIRECT, RAW_LP, RAW_INDEX };

/* A group of raw-index: tags (0 empty, else the hash's top bits with bit 0
 * set) and the references of their records. */
typedef struct raw_group {
    uint16_t tag[RAW_GROUP_SLOTS];
    uint32_t ref[RAW_GROUP_SLOTS];
    uint32_t pad;
} raw_group;
_Static_assert(sizeof(raw_group) == 64, "a raw-index group is a cache line");

typedef struct raw_sys {
    kv_sys base;
    uint8_t *slots;    /* raw-index: its records */
    raw_group *groups; /* raw-index */
    uint64_t nslots, used, ngroups;
    size_t slot_size, value_len, map_len;
    unsigned subkeys; /* raw-table: user keys per key (1 for values) */
} raw_sys;

/* The key stored in a raw-lp slot: 0 marks an empty one, so keys are
 * stored with their top bit flipped and key 2^63 is refused. */
static inline uint64_t raw_lp_stored(uint64_t key)
{
    return key ^ (1ull << 63);
}

static inline __attribute__((always_inline)) uint8_t *raw_direct_slot(raw_sys *t, uint64_t key,
                                                                      uint64_t ukey)
{
    uint64_t i = bench_key_index(key) * t->subkeys + ukey;
    return i < t->nslots ? t->slots + i * RAW_DIRECT_SLOT : NULL;
}

/* The XXH3 hash of (key, ukey), as raw-lp and raw-index take it. */
static inline uint64_t raw_hash(const raw_sys *t, uint64_t key, uint64_t ukey)
{
    uint64_t k[2] = {key, ukey};
    return XXH3_64bits(k, t->subkeys > 1 ? 16 : 8);
}

/* The home slot of (key, ukey) in raw-lp: XXH3 of its bytes. */
static inline uint64_t raw_lp_home(const raw_sys *t, uint64_t key, uint64_t ukey)
{
    return (uint64_t)(((unsigned __int128)raw_hash(t, key, ukey) * t->nslots) >> 64);
}

/* raw-lp's slot of (key, ukey), or NULL; with add, a free slot for it if
 * absent. A map entry's slot keeps the user key after the key. */
static inline __attribute__((always_inline)) uint8_t *raw_lp_slot(raw_sys *t, uint64_t key,
                                                                  uint64_t ukey, bool add)
{
    uint64_t stored = raw_lp_stored(key), i = raw_lp_home(t, key, ukey);
    size_t koff = t->subkeys > 1 ? 16 : 8;
    for (;;) {
        uint8_t *slot = t->slots + i * t->slot_size;
        uint64_t k, u = 0;
        memcpy(&k, slot, 8);
        if (koff > 8) memcpy(&u, slot + 8, 8);
        if (k == stored && u == ukey) return slot;
        if (k == 0) return add && t->used < t->nslots - t->nslots / 8 ? slot : NULL;
        if (++i == t->nslots) i = 0;
    }
}

static inline uint16_t raw_index_tag(uint64_t h)
{
    return (uint16_t)(h >> 48) | 1u;
}

/* The slots of g whose tag is tag, a bit each. */
static inline unsigned raw_group_match(const raw_group *g, uint16_t tag)
{
    unsigned m = 0;
    for (unsigned i = 0; i < RAW_GROUP_SLOTS; i++) m |= (unsigned)(g->tag[i] == tag) << i;
    return m;
}

/* raw-index's record of (key, ukey), or NULL; with add, a new one for it if
 * absent, named by the first empty slot of its probe. */
static inline __attribute__((always_inline)) uint8_t *raw_index_slot(raw_sys *t, uint64_t key,
                                                                     uint64_t ukey, bool add)
{
    uint64_t h = raw_hash(t, key, ukey), g = h & (t->ngroups - 1);
    uint16_t tag = raw_index_tag(h);
    for (;;) {
        raw_group *grp = &t->groups[g];
        for (unsigned m = raw_group_match(grp, tag); m; m &= m - 1) {
            uint8_t *r = t->slots + (uint64_t)grp->ref[__builtin_ctz(m)] * t->slot_size;
            uint64_t k, u = 0;
            memcpy(&k, r, 8);
            if (t->subkeys > 1) memcpy(&u, r + 8, 8);
            if (k == key && u == ukey) return r;
        }
        unsigned empty = raw_group_match(grp, 0);
        if (empty) {
            if (!add || t->used == t->nslots) return NULL;
            unsigned i = (unsigned)__builtin_ctz(empty);
            uint8_t *r = t->slots + t->used * t->slot_size;
            memcpy(r, &key, 8);
            if (t->subkeys > 1) memcpy(r + 8, &ukey, 8);
            grp->ref[i] = (uint32_t)t->used++;
            grp->tag[i] = tag;
            return r;
        }
        g = (g + 1) & (t->ngroups - 1);
    }
}

static inline __attribute__((always_inline)) int
raw_get(raw_sys *t, int kind, uint64_t key, uint64_t ukey, void *out, size_t cap, size_t *len)
{
    bool direct = kind == RAW_DIRECT;
    size_t koff = direct ? 8 : t->subkeys > 1 ? 16 : 8;
    uint8_t *slot = direct           ? raw_direct_slot(t, key, ukey)
                    : kind == RAW_LP ? raw_lp_slot(t, key, ukey, false)
                                     : raw_index_slot(t, key, ukey, false);
    uint64_t k = 0;
    if (slot) memcpy(&k, slot, 8);
    if (!slot || (kind != RAW_INDEX && k == 0)) return -ENOENT;
    return copy_out(slot + koff, t->value_len, out, cap, len);
}

static inline __attribute__((always_inline)) int raw_put(raw_sys *t, int kind, uint64_t key,
                                                         uint64_t ukey, const void *v, size_t len)
{
    bool direct = kind == RAW_DIRECT;
    if (len != t->value_len || key == (1ull << 63)) {
        snprintf(t->base.error, sizeof t->base.error, "slots hold %zu-byte values", t->value_len);
        return -EINVAL;
    }
    size_t koff = direct ? 8 : t->subkeys > 1 ? 16 : 8;
    uint8_t *slot = direct           ? raw_direct_slot(t, key, ukey)
                    : kind == RAW_LP ? raw_lp_slot(t, key, ukey, true)
                                     : raw_index_slot(t, key, ukey, true);
    if (!slot) {
        snprintf(t->base.error, sizeof t->base.error, "table full");
        return -ENOSPC;
    }
    if (kind == RAW_INDEX) {
        memcpy(slot + koff, v, len);
        return 0;
    }
    uint64_t k;
    memcpy(&k, slot, 8);
    if (k == 0) {
        t->used++;
        k = direct ? 1 : raw_lp_stored(key);
        memcpy(slot, &k, 8);
        if (koff > 8) memcpy(slot + 8, &ukey, 8);
    }
    memcpy(slot + koff, v, len);
    return 0;
}

/* raw-index's fetch ahead of a batch, as stash's: every key's home group,
 * then the record its first slot of the key's tag names. */
static inline void raw_index_fetch(const raw_sys *t, const uint64_t *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        __builtin_prefetch(&t->groups[raw_hash(t, keys[i], 0) & (t->ngroups - 1)]);
    for (size_t i = 0; i < n; i++) {
        uint64_t h = raw_hash(t, keys[i], 0);
        const raw_group *g = &t->groups[h & (t->ngroups - 1)];
        unsigned m = raw_group_match(g, raw_index_tag(h));
        if (!m) continue;
        const uint8_t *r = t->slots + (uint64_t)g->ref[__builtin_ctz(m)] * t->slot_size;
        __builtin_prefetch(r);
        __builtin_prefetch(r + t->slot_size - 1);
    }
}

/* A batch: what its keys touch fetched first (the home slot, where the
 * value is inline; raw-index's two steps), then the operations in order. */
static inline int raw_batch(raw_sys *t, int kind, const uint64_t *keys, size_t n, kv_batch_fn *fn,
                            void *ctx)
{
    if (kind == RAW_INDEX) raw_index_fetch(t, keys, n);
    for (size_t i = 0; i < n && kind != RAW_INDEX; i++) {
        const uint8_t *p = kind == RAW_DIRECT
                               ? raw_direct_slot(t, keys[i], 0)
                               : t->slots + raw_lp_home(t, keys[i], 0) * t->slot_size;
        if (!p) continue;
        __builtin_prefetch(p);
        __builtin_prefetch(p + t->slot_size - 1);
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) rc = fn(&t->base, i, ctx);
    return rc;
}

#define RAW_OPS(NAME, KIND)                                                                        \
    static int NAME##_value_get(kv_sys *s, uint64_t key, void *out, size_t cap, size_t *len)       \
    {                                                                                              \
        return raw_get((raw_sys *)s, KIND, key, 0, out, cap, len);                                 \
    }                                                                                              \
    static int NAME##_value_put(kv_sys *s, uint64_t key, const void *v, size_t len)                \
    {                                                                                              \
        return raw_put((raw_sys *)s, KIND, key, 0, v, len);                                        \
    }                                                                                              \
    static int NAME##_map_get(kv_sys *s, uint64_t key, uint64_t ukey, void *out, size_t cap,       \
                              size_t *len)                                                         \
    {                                                                                              \
        return raw_get((raw_sys *)s, KIND, key, ukey, out, cap, len);                              \
    }                                                                                              \
    static int NAME##_map_put(kv_sys *s, uint64_t key, uint64_t ukey, const void *v, size_t len)   \
    {                                                                                              \
        return raw_put((raw_sys *)s, KIND, key, ukey, v, len);                                     \
    }                                                                                              \
    static int NAME##_run_batch(kv_sys *s, const uint64_t *keys, size_t n, kv_batch_fn *fn,        \
                                void *ctx)                                                         \
    {                                                                                              \
        return raw_batch((raw_sys *)s, KIND, keys, n, fn, ctx);                                    \
    }

static int raw_sync(kv_sys *s)
{
    (void)s;
    return 0;
}

static int raw_footprint(kv_sys *s, uint64_t *bytes)
{
    *bytes = ((raw_sys *)s)->map_len;
    return 0;
}

static void raw_close(kv_sys *s)
{
    raw_sys *t = (raw_sys *)s;
    munmap(t->groups ? (void *)t->groups : t->slots, t->map_len);
    free(t);
}

RAW_OPS(raw_direct, RAW_DIRECT)
RAW_OPS(raw_lp, RAW_LP)
RAW_OPS(raw_index, RAW_INDEX)

#define RAW_KV_OPS(NAME)                                                                           \
    static const kv_ops NAME##_ops = {                                                             \
        .value_get = NAME##_value_get,                                                             \
        .value_put = NAME##_value_put,                                                             \
        .map_put = NAME##_map_put,                                                                 \
        .map_get = NAME##_map_get,                                                                 \
        .run_batch = NAME##_run_batch,                                                             \
        .sync = raw_sync,                                                                          \
        .footprint = raw_footprint,                                                                \
        .close = raw_close,                                                                        \
    };
RAW_KV_OPS(raw_direct)
RAW_KV_OPS(raw_lp)
RAW_KV_OPS(raw_index)

/* Sizes t, of kind, for plan's entries: its slots (raw-index: its records)
 * and raw-index's groups. Returns the bytes to map, 0 if the values do
 * not fit raw-table's slots. */
static inline uint64_t raw_size(raw_sys *t, int kind, const kv_plan *plan)
{
    size_t koff = t->subkeys > 1 ? 16 : 8;
    if (kind == RAW_DIRECT) {
        t->slot_size = RAW_DIRECT_SLOT;
        t->nslots = plan->entries;
        return 8 + plan->value_len > RAW_DIRECT_SLOT ? 0 : t->nslots * t->slot_size;
    }
    if (kind == RAW_LP) {
        t->slot_size = (koff + plan->value_len + 7) & ~(size_t)7;
        t->nslots = 64;
        while (plan->entries > t->nslots - t->nslots / 8) t->nslots *= 2;
        return t->nslots * t->slot_size;
    }
    /* Records in whole lines, as a record of stash's header, key and value
     * fills a block of 128 bytes; groups doubled when 7/8 full. */
    t->slot_size = (koff + plan->value_len + 63) & ~(size_t)63;
    t->nslots = plan->entries;
    t->ngroups = 1;
    while (plan->entries > (t->ngroups * RAW_GROUP_SLOTS) / 8 * 7) t->ngroups *= 2;
    return t->ngroups * sizeof(raw_group) + t->nslots * t->slot_size;
}

/* Opens raw-table, raw-lp or raw-index (kind RAW_*) for plan:
 * plan->entries entries of keys 0 .. plan->entries / subkeys - 1, subkeys
 * user keys each. */
static inline int raw_open(const kv_plan *plan, int kind, unsigned subkeys, kv_sys **out, char *why,
                           size_t whylen)
{
    static const kv_ops *const ops[] = {&raw_direct_ops, &raw_lp_ops, &raw_index_ops};
    static const char *const names[] = {"raw-table", "raw-lp", "raw-index"};
    raw_sys *t = calloc(1, sizeof *t);
    if (!t) return WHY("out of memory");
    t->base = (kv_sys){.ops = ops[kind], .name = names[kind], .batch = 1};
    t->value_len = plan->value_len;
    t->subkeys = subkeys;
    t->map_len = raw_size(t, kind, plan);
    if (!t->map_len) {
        free(t);
        return WHY("slots hold %u bytes", RAW_DIRECT_SLOT);
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", plan->dir, t->base.name);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int rc = fd < 0 ? errno : posix_fallocate(fd, 0, (off_t)t->map_len);
    uint8_t *map = NULL;
    if (rc == 0) {
        map = mmap(NULL, t->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) rc = errno;
    }
    if (fd >= 0) close(fd);
    if (rc) {
        free(t);
        return WHY("%.250s: %s", path, strerror(rc));
    }
    t->slots = map;
    if (kind == RAW_INDEX) {
        t->groups = (raw_group *)(void *)map;
        t->slots = map + t->ngroups * sizeof(raw_group);
    }
    *out = &t->base;
    return 0;
}

#endif /* STASH_TOOLS_BENCH_RAW_H */
