/* SPDX-License-Identifier: MIT */
/*
 * hash.h: the hashes of keyed state. A key's hash is XXH3 of its bytes,
 * inlined because every state access begins with it; an entry's lookup hash
 * in its key group's index mixes the key's hash with a seed made of the
 * state id and the namespace's hash, computed once per namespace.
 */
#ifndef STASH_SHM_HASH_H
#define STASH_SHM_HASH_H

#include <stddef.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* The hash of a key's (or a namespace's) bytes. */
static inline uint64_t shm_key_hash(const void *key, size_t len)
{
    return XXH3_64bits(key, len);
}

/* The key group of a key by its hash: the hash mod maxp (Flink's formula
 * over XXH3), a mask when maxp is a power of two. */
static inline uint32_t shm_key_group_of(uint64_t hash, uint32_t maxp)
{
    return (uint32_t)((maxp & (maxp - 1)) == 0 ? hash & (maxp - 1) : hash % maxp);
}

/* The hash of a namespace: 0 for the empty one. */
static inline uint64_t shm_ns_hash(const void *ns, size_t len)
{
    return len ? XXH3_64bits(ns, len) : 0;
}

/* What the state and the namespace add to a key's hash. */
static inline uint64_t shm_lookup_seed(uint16_t state, uint64_t ns_hash)
{
    return (state * 0x9e3779b97f4a7c15ull) ^ (ns_hash * 0xc2b2ae3d27d4eb4full);
}

/* The lookup hash of the entry of a key (by its hash) under seed. Its high
 * half, the entry's tag in the index, is at least 2, since the index keeps
 * tags 0 and 1 for its empty and deleted slots. The key's hash is XXH3's,
 * already mixed, so its high half serves as it is: the key group comes from
 * the low bits, which every entry of a key group shares. No multiply lies
 * between the key's hash and the first load of a lookup. */
static inline uint32_t shm_lookup_hash(uint64_t key_hash, uint64_t seed)
{
    uint32_t x = (uint32_t)((key_hash ^ seed) >> 32);
    return x < 0x20000u ? x + 0x20000u : x;
}

#endif /* STASH_SHM_HASH_H */
