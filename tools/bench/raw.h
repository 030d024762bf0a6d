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

typedef struct raw_sys {
    kv_sys base;
    uint8_t *slots;
    uint64_t nslots, used;
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

/* The home slot of (key, ukey) in raw-lp: XXH3 of its bytes. */
static inline uint64_t raw_lp_home(const raw_sys *t, uint64_t key, uint64_t ukey)
{
    uint64_t k[2] = {key, ukey};
    uint64_t h = XXH3_64bits(k, t->subkeys > 1 ? 16 : 8);
    return (uint64_t)(((unsigned __int128)h * t->nslots) >> 64);
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

static inline __attribute__((always_inline)) int
raw_get(raw_sys *t, bool direct, uint64_t key, uint64_t ukey, void *out, size_t cap, size_t *len)
{
    size_t koff = direct ? 8 : t->subkeys > 1 ? 16 : 8;
    uint8_t *slot = direct ? raw_direct_slot(t, key, ukey) : raw_lp_slot(t, key, ukey, false);
    uint64_t k = 0;
    if (slot) memcpy(&k, slot, 8);
    if (!slot || k == 0) return -ENOENT;
    return copy_out(slot + koff, t->value_len, out, cap, len);
}

static inline __attribute__((always_inline)) int raw_put(raw_sys *t, bool direct, uint64_t key,
                                                         uint64_t ukey, const void *v, size_t len)
{
    if (len != t->value_len || key == (1ull << 63)) {
        snprintf(t->base.error, sizeof t->base.error, "slots hold %zu-byte values", t->value_len);
        return -EINVAL;
    }
    size_t koff = direct ? 8 : t->subkeys > 1 ? 16 : 8;
    uint8_t *slot = direct ? raw_direct_slot(t, key, ukey) : raw_lp_slot(t, key, ukey, true);
    if (!slot) {
        snprintf(t->base.error, sizeof t->base.error, "table full");
        return -ENOSPC;
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

/* A batch: every key's home slot fetched first (the value is inline),
 * then the operations in order. */
static inline int raw_batch(raw_sys *t, bool direct, const uint64_t *keys, size_t n,
                            kv_batch_fn *fn, void *ctx)
{
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = direct ? raw_direct_slot(t, keys[i], 0)
                                  : t->slots + raw_lp_home(t, keys[i], 0) * t->slot_size;
        if (!p) continue;
        __builtin_prefetch(p);
        __builtin_prefetch(p + t->slot_size - 1);
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) rc = fn(&t->base, i, ctx);
    return rc;
}

#define RAW_OPS(NAME, DIRECT)                                                                      \
    static int NAME##_value_get(kv_sys *s, uint64_t key, void *out, size_t cap, size_t *len)       \
    {                                                                                              \
        return raw_get((raw_sys *)s, DIRECT, key, 0, out, cap, len);                               \
    }                                                                                              \
    static int NAME##_value_put(kv_sys *s, uint64_t key, const void *v, size_t len)                \
    {                                                                                              \
        return raw_put((raw_sys *)s, DIRECT, key, 0, v, len);                                      \
    }                                                                                              \
    static int NAME##_map_get(kv_sys *s, uint64_t key, uint64_t ukey, void *out, size_t cap,       \
                              size_t *len)                                                         \
    {                                                                                              \
        return raw_get((raw_sys *)s, DIRECT, key, ukey, out, cap, len);                            \
    }                                                                                              \
    static int NAME##_map_put(kv_sys *s, uint64_t key, uint64_t ukey, const void *v, size_t len)   \
    {                                                                                              \
        return raw_put((raw_sys *)s, DIRECT, key, ukey, v, len);                                   \
    }                                                                                              \
    static int NAME##_run_batch(kv_sys *s, const uint64_t *keys, size_t n, kv_batch_fn *fn,        \
                                void *ctx)                                                         \
    {                                                                                              \
        return raw_batch((raw_sys *)s, DIRECT, keys, n, fn, ctx);                                  \
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
    munmap(t->slots, t->map_len);
    free(t);
}

RAW_OPS(raw_direct, true)
RAW_OPS(raw_lp, false)

static const kv_ops raw_direct_ops = {
    .value_get = raw_direct_value_get,
    .value_put = raw_direct_value_put,
    .map_put = raw_direct_map_put,
    .map_get = raw_direct_map_get,
    .run_batch = raw_direct_run_batch,
    .sync = raw_sync,
    .footprint = raw_footprint,
    .close = raw_close,
};

static const kv_ops raw_lp_ops = {
    .value_get = raw_lp_value_get,
    .value_put = raw_lp_value_put,
    .map_put = raw_lp_map_put,
    .map_get = raw_lp_map_get,
    .run_batch = raw_lp_run_batch,
    .sync = raw_sync,
    .footprint = raw_footprint,
    .close = raw_close,
};

/* Opens raw-table (direct) or raw-lp for plan: plan->entries entries of
 * keys 0 .. plan->entries / subkeys - 1, subkeys user keys each. */
static inline int raw_open(const kv_plan *plan, bool direct, unsigned subkeys, kv_sys **out,
                           char *why, size_t whylen)
{
    raw_sys *t = calloc(1, sizeof *t);
    if (!t) return WHY("out of memory");
    t->base = (kv_sys){.ops = direct ? &raw_direct_ops : &raw_lp_ops,
                       .name = direct ? "raw-table" : "raw-lp",
                       .batch = 1};
    t->value_len = plan->value_len;
    t->subkeys = subkeys;
    if (direct) {
        t->slot_size = RAW_DIRECT_SLOT;
        t->nslots = plan->entries;
        if (8 + plan->value_len > RAW_DIRECT_SLOT) {
            free(t);
            return WHY("slots hold %u bytes", RAW_DIRECT_SLOT);
        }
    } else {
        t->slot_size = ((subkeys > 1 ? 16 : 8) + plan->value_len + 7) & ~(size_t)7;
        t->nslots = 64;
        while (plan->entries > t->nslots - t->nslots / 8) t->nslots *= 2;
    }
    t->map_len = t->nslots * t->slot_size;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", plan->dir, t->base.name);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int rc = fd < 0 ? errno : posix_fallocate(fd, 0, (off_t)t->map_len);
    if (rc == 0) {
        t->slots = mmap(NULL, t->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (t->slots == MAP_FAILED) rc = errno;
    }
    if (fd >= 0) close(fd);
    if (rc) {
        free(t);
        return WHY("%.250s: %s", path, strerror(rc));
    }
    *out = &t->base;
    return 0;
}

#endif /* STASH_TOOLS_BENCH_RAW_H */
