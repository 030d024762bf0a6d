/*
 * keygroup.c: Flink's key-group arithmetic, with keys hashed by XXH3.
 * A key's group is hash mod max parallelism; worker i of p owns a contiguous
 * range, and every worker computes the same ranges without talking.
 */
#include <errno.h>

#include "shm/hash.h"
#include "shm/shm.h"

STASH_API uint64_t stash_hash(const void *key, size_t len)
{
    return shm_key_hash(key, len);
}

STASH_API uint32_t stash_key_group(const void *key, size_t len, uint32_t max_parallelism)
{
    return (uint32_t)(shm_key_hash(key, len) % max_parallelism);
}

static bool valid(uint32_t max_parallelism, uint32_t parallelism)
{
    return max_parallelism >= 1 && max_parallelism <= STASH_MAX_MAX_PARALLELISM &&
           parallelism >= 1 && parallelism <= max_parallelism;
}

STASH_API int stash_kg_owner(uint32_t kg, uint32_t max_parallelism, uint32_t parallelism)
{
    if (!valid(max_parallelism, parallelism) || kg >= max_parallelism) return -EINVAL;
    return (int)((uint64_t)kg * parallelism / max_parallelism);
}

STASH_API int stash_kg_range_of(uint32_t max_parallelism, uint32_t parallelism, uint32_t index,
                                stash_kg_range *out)
{
    if (!valid(max_parallelism, parallelism) || index >= parallelism) return -EINVAL;
    uint64_t maxp = max_parallelism, p = parallelism, i = index;
    out->first = (uint32_t)((i * maxp + p - 1) / p);
    out->last = (uint32_t)(((i + 1) * maxp - 1) / p);
    return 0;
}
