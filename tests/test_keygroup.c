/*
 * test_keygroup.c: the key-group formulas against Flink's values, including
 * range bounds and max parallelism 32768, and key hashing through XXH3.
 */
#include <criterion/criterion.h>
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
