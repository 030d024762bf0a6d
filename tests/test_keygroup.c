/* SPDX-License-Identifier: MIT */
/*
 * test_keygroup.c: the key-group formulas against Flink's values, including
 * range bounds and max parallelism 32768, and key hashing through XXH3.
 */
#include <criterion/criterion.h>
#include <string.h>
#include <xxhash.h>

#include "tests/helpers.h"

typedef struct expected_range {
    uint32_t maxp, p, index, first, last;
} expected_range;

/* Values of Flink's KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex. */
static const expected_range flink_ranges[] = {
    {128, 1, 0, 0, 127},       {128, 2, 0, 0, 63},
    {128, 2, 1, 64, 127},      {128, 3, 0, 0, 42},
    {128, 3, 1, 43, 85},       {128, 3, 2, 86, 127},
    {10, 3, 0, 0, 3},          {10, 3, 1, 4, 6},
    {10, 3, 2, 7, 9},          {128, 128, 77, 77, 77},
    {4, 3, 1, 2, 2},           {32768, 7, 0, 0, 4681},
    {32768, 7, 1, 4682, 9362}, {32768, 7, 6, 28087, 32767},
    {32768, 1, 0, 0, 32767},   {32768, 32768, 32767, 32767, 32767},
};

Test(keygroup, ranges_match_flink)
{
    for (size_t i = 0; i < sizeof flink_ranges / sizeof flink_ranges[0]; i++) {
        const expected_range *e = &flink_ranges[i];
        stash_kg_range r;
        cr_assert_eq(stash_kg_range_of(e->maxp, e->p, e->index, &r), 0);
        cr_assert_eq(r.first, e->first, "maxP %u p %u index %u", e->maxp, e->p, e->index);
        cr_assert_eq(r.last, e->last, "maxP %u p %u index %u", e->maxp, e->p, e->index);
    }
}

Test(keygroup, ranges_tile_the_key_groups_and_agree_with_the_owner_formula)
{
    const uint32_t maxps[] = {1, 2, 10, 128, 129, 1000, 32768};
    const uint32_t ps[] = {1, 2, 3, 5, 7, 16, 100, 128};
    for (size_t m = 0; m < sizeof maxps / sizeof maxps[0]; m++) {
        for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
            uint32_t maxp = maxps[m], p = ps[k];
            if (p > maxp) continue;
            uint32_t next = 0;
            for (uint32_t i = 0; i < p; i++) {
                stash_kg_range r;
                cr_assert_eq(stash_kg_range_of(maxp, p, i, &r), 0);
                cr_assert_eq(r.first, next, "ranges are contiguous (maxP %u p %u)", maxp, p);
                cr_assert_geq(r.last, r.first);
                for (uint32_t kg = r.first; kg <= r.last; kg++)
                    cr_assert_eq(stash_kg_owner(kg, maxp, p), (int)i);
                next = r.last + 1;
            }
            cr_assert_eq(next, maxp, "ranges cover every key group");
        }
    }
}

Test(keygroup, bad_arguments_are_refused)
{
    stash_kg_range r;
    cr_assert_eq(stash_kg_range_of(128, 0, 0, &r), -EINVAL);
    cr_assert_eq(stash_kg_range_of(128, 3, 3, &r), -EINVAL);
    cr_assert_eq(stash_kg_range_of(128, 129, 0, &r), -EINVAL);
    cr_assert_eq(stash_kg_range_of(32769, 1, 0, &r), -EINVAL);
    cr_assert_eq(stash_kg_range_of(0, 1, 0, &r), -EINVAL);
    cr_assert_eq(stash_kg_owner(128, 128, 2), -EINVAL);
    /* A key group of max parallelism 0 would divide by zero. */
    cr_assert_eq(stash_key_group("k", 1, 0), UINT32_MAX);
    cr_assert_eq(stash_key_group("k", 1, 32769), UINT32_MAX);
    cr_assert_eq(stash_key_group(NULL, 4, 128), UINT32_MAX);
    cr_assert_eq(stash_key_group(NULL, 0, 128), stash_key_group("", 0, 128));
}

/* Each refusal says its own why, never the failure before it. */
static void says(const char *what)
{
    cr_assert(strstr(stash_errmsg(), what), "'%s' says '%s'", stash_errmsg(), what);
}

Test(keygroup, each_refusal_names_its_function_and_argument)
{
    stash_kg_range r;
    cr_assert_eq(stash_kg_range_of(128, 3, 3, &r), -EINVAL);
    says("stash_kg_range_of: worker 3 of 3");
    cr_assert_eq(stash_kg_owner(128, 128, 2), -EINVAL);
    says("stash_kg_owner: key group 128 of 128");
    cr_assert_eq(stash_kg_range_of(128, 129, 0, &r), -EINVAL);
    says("stash_kg_range_of: a parallelism of 129");
    cr_assert_eq(stash_key_group("k", 1, 0), UINT32_MAX);
    says("stash_key_group: a max parallelism of 0");
    cr_assert_eq(stash_key_group(NULL, 4, 128), UINT32_MAX);
    says("stash_key_group: key is NULL");
}

/* As Flink's KeyGroupRangeTest. */
Test(keygroup, ranges_tell_their_size_what_they_contain_and_their_intersection)
{
    stash_kg_range empty = STASH_KG_RANGE_EMPTY;
    cr_assert(stash_kg_range_is_empty(empty));
    cr_assert_eq(stash_kg_range_size(empty), 0);
    for (uint32_t kg = 0; kg < 4; kg++) cr_assert(!stash_kg_range_contains(empty, kg));
    stash_kg_range one = {0, 0}, top = {32767, 32767}, low = {0, 10}, mid = {5, 20},
                   high = {11, 32767};
    cr_assert(!stash_kg_range_is_empty(one));
    cr_assert_eq(stash_kg_range_size(one), 1);
    cr_assert_eq(stash_kg_range_size(top), 1);
    cr_assert_eq(stash_kg_range_size(low), 11);
    cr_assert_eq(stash_kg_range_size(high), 32757);
    cr_assert_eq(stash_kg_range_size((stash_kg_range){0, 32767}), 32768);
    cr_assert(stash_kg_range_contains(one, 0));
    cr_assert(!stash_kg_range_contains(one, 1));
    cr_assert(stash_kg_range_contains(top, 32767));
    cr_assert(stash_kg_range_contains(low, 10) && !stash_kg_range_contains(low, 11));
    stash_kg_range r = stash_kg_range_intersect(low, mid); /* overlapping */
    cr_assert(r.first == 5 && r.last == 10);
    r = stash_kg_range_intersect(mid, low); /* either order */
    cr_assert(r.first == 5 && r.last == 10);
    r = stash_kg_range_intersect(low, high); /* disjoint, adjacent */
    cr_assert(stash_kg_range_is_empty(r));
    cr_assert_eq(stash_kg_range_size(r), 0);
    r = stash_kg_range_intersect((stash_kg_range){0, 32767}, mid); /* nested */
    cr_assert(r.first == 5 && r.last == 20);
    r = stash_kg_range_intersect(top, high); /* at the top end */
    cr_assert(r.first == 32767 && r.last == 32767);
    cr_assert(stash_kg_range_is_empty(stash_kg_range_intersect(empty, low)));
    cr_assert(stash_kg_range_is_empty(stash_kg_range_intersect(one, (stash_kg_range){1, 1})));
}

Test(keygroup, keys_hash_with_xxh3_into_their_group)
{
    const char *keys[] = {"", "a", "user-42", "a somewhat longer key of many bytes"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        size_t n = strlen(keys[i]);
        uint64_t h = XXH3_64bits(keys[i], n);
        cr_assert_eq(stash_hash(keys[i], n), h);
        cr_assert_eq(stash_key_group(keys[i], n, 128), h % 128);
        cr_assert_eq(stash_key_group(keys[i], n, 32768), h % 32768);
    }
}

Test(keygroup, keys_spread_over_the_groups)
{
    uint32_t count[128] = {0};
    for (uint32_t i = 0; i < 128000; i++) count[stash_key_group(&i, sizeof i, 128)]++;
    for (int kg = 0; kg < 128; kg++) cr_assert(count[kg] > 800 && count[kg] < 1200, "kg %d", kg);
}

/* The keys of one key group share the low bits of their hash; their lookup
 * hashes must still spread over the key group's index groups, under every
 * state and namespace. A seed moves every key's home group by the same
 * XOR, so the entries of one key under two seeds share their home for
 * every key or for none: here, for none. */
Test(keygroup, lookup_hashes_of_one_key_group_spread_over_its_index)
{
    enum { MAXP = 128, GROUPS = 1024, KEYS = 8 * GROUPS };
    static uint32_t count[GROUPS];
    const uint64_t seeds[] = {shm_lookup_seed(1, 0), shm_lookup_seed(2, 0),
                              shm_lookup_seed(1, shm_ns_hash("window-7", 8))};
    for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
        memset(count, 0, sizeof count);
        uint32_t same_home = 0, n = 0;
        for (uint64_t i = 0; n < KEYS; i++) {
            uint64_t h = shm_key_hash(&i, sizeof i);
            if (h % MAXP != 5) continue;
            n++;
            uint32_t home = shm_lookup_hash(h, seeds[s]) % GROUPS;
            count[home]++;
            same_home += home == shm_lookup_hash(h, seeds[(s + 1) % 3]) % GROUPS;
        }
        uint32_t most = 0;
        for (uint32_t g = 0; g < GROUPS; g++) most = count[g] > most ? count[g] : most;
        cr_assert_leq(most, 32u, "seed %zu: %u of %u keys in one group", s, most, KEYS);
        cr_assert_eq(same_home, 0u, "seed %zu: %u keys share their home under two seeds", s,
                     same_home);
    }
}
