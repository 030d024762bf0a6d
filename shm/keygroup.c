/* SPDX-License-Identifier: MIT */
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
    return shm_null_bytes(key, len) ? 0 : shm_key_hash(key, len);
}

STASH_API uint32_t stash_key_group(const void *key, size_t len, uint32_t max_parallelism)
{
    if (max_parallelism == 0 || max_parallelism > STASH_MAX_MAX_PARALLELISM) {
        shm_fail(-EINVAL, "%s: a max parallelism of %u (1 .. %u)", __func__, max_parallelism,
                 STASH_MAX_MAX_PARALLELISM);
        return UINT32_MAX;
    }
    if (shm_null_bytes(key, len)) {
        shm_refuse_null(__func__, "key");
        return UINT32_MAX;
    }
    return (uint32_t)(shm_key_hash(key, len) % max_parallelism);
}

STASH_API int stash_kg_range_is_empty(stash_kg_range range)
{
    return range.first > range.last;
}

STASH_API uint32_t stash_kg_range_size(stash_kg_range range)
{
    return range.first > range.last ? 0 : range.last - range.first + 1;
}

STASH_API int stash_kg_range_contains(stash_kg_range range, uint32_t kg)
{
    return kg >= range.first && kg <= range.last;
}

STASH_API stash_kg_range stash_kg_range_intersect(stash_kg_range a, stash_kg_range b)
{
    stash_kg_range r = {a.first > b.first ? a.first : b.first, a.last < b.last ? a.last : b.last};
    return r.first <= r.last ? r : STASH_KG_RANGE_EMPTY;
}

/* 0, or -EINVAL naming fn and the bound a parallelism breaks. */
static int check(const char *fn, uint32_t max_parallelism, uint32_t parallelism)
{
    if (max_parallelism < 1 || max_parallelism > STASH_MAX_MAX_PARALLELISM)
        return shm_fail(-EINVAL, "%s: a max parallelism of %u (1 .. %u)", fn, max_parallelism,
                        STASH_MAX_MAX_PARALLELISM);
    if (parallelism < 1 || parallelism > max_parallelism)
        return shm_fail(-EINVAL, "%s: a parallelism of %u (1 .. max parallelism %u)", fn,
                        parallelism, max_parallelism);
    return 0;
}

STASH_API int stash_kg_owner(uint32_t kg, uint32_t max_parallelism, uint32_t parallelism)
{
    int rc = check(__func__, max_parallelism, parallelism);
    if (rc) return rc;
    if (kg >= max_parallelism)
        return shm_fail(-EINVAL, "%s: key group %u of %u", __func__, kg, max_parallelism);
    return (int)((uint64_t)kg * parallelism / max_parallelism);
}

STASH_API int stash_kg_range_of(uint32_t max_parallelism, uint32_t parallelism, uint32_t index,
                                stash_kg_range *out)
{
    if (!out) return shm_refuse_null(__func__, "out");
    int rc = check(__func__, max_parallelism, parallelism);
    if (rc) return rc;
    if (index >= parallelism)
        return shm_fail(-EINVAL, "%s: worker %u of %u", __func__, index, parallelism);
    uint64_t maxp = max_parallelism, p = parallelism, i = index;
    out->first = (uint32_t)((i * maxp + p - 1) / p);
    out->last = (uint32_t)(((i + 1) * maxp - 1) / p);
    return 0;
}
