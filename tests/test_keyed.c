/* SPDX-License-Identifier: MIT */
/*
 * test_keyed.c: every operation of every keyed state kind, with namespaces:
 * value, list, map, reducing, aggregating; getKeys; namespace merges;
 * registration rules; writes outside the worker's key groups.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/helpers.h"

static char arena_name[96];
static stash_arena *arena;
static stash_worker *w;

static void setup(void)
{
    arena = test_arena_create("keyed", 64u << 20, 128, arena_name);
    cr_assert_eq(
        stash_worker_open(
            arena_name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 1},
            &w),
        0);
}

static void teardown(void)
{
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
    stash_worker_close(w);
    stash_arena_close(arena);
    stash_arena_destroy(arena_name, NULL);
}

TestSuite(keyed, .init = setup, .fini = teardown);

static stash_state *state(const char *name, stash_kind kind)
{
    stash_state *s;
    int rc = stash_state_get(
        w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = name, .kind = kind}, &s);
    cr_assert_eq(rc, 0, "%s: %s", name, stash_errmsg());
    return s;
}

static void key(const char *k)
{
    cr_assert_eq(stash_key_set(w, k, strlen(k)), 0);
}

static void expect_value(stash_state *s, const char *want)
{
    stash_bytes v;
    int rc = stash_value_get(s, &v);
    if (!want) {
        cr_assert_eq(rc, STASH_ENOTFOUND);
        return;
    }
    cr_assert_eq(rc, 0, "%s", stash_strerror(rc));
    cr_assert_eq(v.len, strlen(want));
    cr_assert_eq(memcmp(v.data, want, v.len), 0);
}

Test(keyed, value_put_get_clear_per_key_and_namespace)
{
    stash_state *s = state("v", STASH_VALUE);
    cr_assert_eq(stash_value_get(s, &(stash_bytes){0}), STASH_ENOKEY);
    key("alice");
    expect_value(s, NULL);
    cr_assert_eq(stash_value_put(s, "one", 3), 0);
    expect_value(s, "one");
    cr_assert_eq(stash_value_put(s, "a longer second value", 21), 0);
    expect_value(s, "a longer second value");
    key("bob");
    expect_value(s, NULL);
    cr_assert_eq(stash_value_put(s, "b", 1), 0);
    stash_state_namespace(s, "window-1", 8);
    expect_value(s, NULL);
    cr_assert_eq(stash_value_put(s, "in window", 9), 0);
    expect_value(s, "in window");
    stash_state_namespace(s, NULL, 0);
    expect_value(s, "b");
    key("alice");
    expect_value(s, "a longer second value");
    cr_assert_eq(stash_state_clear(s), 0);
    expect_value(s, NULL);
    cr_assert_eq(stash_value_put(s, "x", 1), 0);
    cr_assert_eq(stash_value_put(s, NULL, 0), 0, "putting nothing clears");
    expect_value(s, NULL);
}

Test(keyed, value_default_is_a_copy)
{
    char def[] = "default";
    stash_state *s;
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "d",
                                                     .kind = STASH_VALUE,
                                                     .default_value = {def, 7}},
                                 &s),
                 0);
    def[0] = 'X';
    key("k");
    expect_value(s, "default");
    stash_value_put(s, "set", 3);
    expect_value(s, "set");
}

/* The comparisons and copies a lookup and an in-place put make without a
 * call agree with memcmp and memcpy at every length they treat apart, and a
 * copy writes no byte past its end. */
Test(keyed, short_comparisons_and_copies_agree_with_memcmp_and_memcpy)
{
    uint8_t x[48], y[48], d[SHM_UNDO_BYTES + 8], src[SHM_UNDO_BYTES];
    for (size_t i = 0; i < sizeof x; i++) x[i] = (uint8_t)(i * 37 + 1);
    for (size_t n = 0; n <= sizeof x; n++) {
        memcpy(y, x, n);
        cr_assert(shm_bytes_equal(x, y, n), "%zu equal bytes", n);
        for (size_t at = 0; at < n; at++) {
            y[at] ^= 0x40;
            cr_assert(!shm_bytes_equal(x, y, n), "%zu bytes, byte %zu differs", n, at);
            y[at] ^= 0x40;
        }
    }
    for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(i * 13 + 7);
    for (size_t n = 0; n <= SHM_UNDO_BYTES; n++) {
        for (int held = 0; held < 2; held++) {
            if (held && (n < 16 || n > SHM_HELD_MAX)) continue;
            memset(d, 0xee, sizeof d);
            if (held) {
                shm_held h = shm_hold(src, n);
                shm_unhold(d, &h, n);
            } else {
                shm_copy_small(d, src, n);
            }
            cr_assert_eq(memcmp(d, src, n), 0, "a copy of %zu bytes (held: %d)", n, held);
            for (size_t i = n; i < sizeof d; i++)
                cr_assert_eq(d[i], 0xee, "a copy of %zu bytes wrote byte %zu (held: %d)", n, i,
                             held);
        }
    }
    /* Keys and namespaces of 8 to 16 bytes compared by their first and last
     * 8 bytes, as the one-step lookup does. */
    for (size_t n = 8; n <= 16; n++) {
        memcpy(y, x, n);
        cr_assert_eq(shm_words_differ(x, y, n), 0, "%zu equal bytes", n);
        for (size_t at = 0; at < n; at++) {
            y[at] ^= 0x01;
            cr_assert_neq(shm_words_differ(x, y, n), 0, "%zu bytes, byte %zu differs", n, at);
            y[at] ^= 0x01;
        }
    }
}

/* Keys, namespaces and values of the lengths that short comparisons and
 * copies treat apart: keys that differ in one byte only stay apart, and a
 * value rewritten in place reads back whole. */
Test(keyed, keys_namespaces_and_values_of_every_short_length)
{
    stash_state *s = state("short", STASH_VALUE);
    uint8_t k[40], v[140];
    /* Everything is written first, then read: a key taken for another
     * overwrites its value. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t len = 1; len <= sizeof k; len++) {
            for (size_t at = 0; at < len; at++) {
                memset(k, 'k', len);
                k[at] = (uint8_t)('A' + at % 26);
                for (int ns = 0; ns < 2; ns++) {
                    /* With a namespace, the key takes the one-step lookup. */
                    cr_assert_eq(stash_key_set(w, ns ? "one-step" : (const char *)k, ns ? 8 : len),
                                 0);
                    cr_assert_eq(stash_state_namespace(s, ns ? k : NULL, ns ? len : 0), 0);
                    size_t vlen = (len * 7 + at) % sizeof v + 1;
                    /* A longer value first, then the one kept, in its place. */
                    for (int round = pass; round < 2; round++) {
                        size_t n = round ? vlen : vlen + 13 < sizeof v ? vlen + 13 : sizeof v;
                        for (size_t i = 0; i < n; i++) v[i] = (uint8_t)(len + at * 3 + i + round);
                        if (pass == 0) cr_assert_eq(stash_value_put(s, v, n), 0);
                    }
                    if (pass == 0) continue;
                    stash_bytes out;
                    cr_assert_eq(stash_value_get(s, &out), 0, "key of %zu bytes, byte %zu differs",
                                 len, at);
                    cr_assert_eq(out.len, vlen, "key of %zu bytes, byte %zu differs", len, at);
                    cr_assert_eq(memcmp(out.data, v, vlen), 0, "key of %zu bytes, byte %zu differs",
                                 len, at);
                }
            }
        }
    }
}

/* A pair (hash, index) of a collision search. */
typedef struct hashed {
    uint64_t hash;
    uint64_t i;
} hashed;

static int by_hash(const void *x, const void *y)
{
    const hashed *a = x, *b = y;
    return a->hash < b->hash ? -1 : a->hash > b->hash;
}

/* Two of 0 .. n-1 whose hash (by fn) is the same: the first such pair in
 * hash order. */
static void find_collision(uint64_t n, uint64_t (*fn)(uint64_t i, void *ctx), void *ctx,
                           uint64_t pair[2])
{
    hashed *h = malloc(n * sizeof *h);
    cr_assert_not_null(h);
    for (uint64_t i = 0; i < n; i++) h[i] = (hashed){fn(i, ctx), i};
    qsort(h, n, sizeof *h, by_hash);
    for (uint64_t i = 1; i < n; i++) {
        if (h[i].hash == h[i - 1].hash) {
            pair[0] = h[i - 1].i, pair[1] = h[i].i;
            free(h);
            return;
        }
    }
    cr_assert_fail("no collision among %llu", (unsigned long long)n);
}

/* The lookup hash of the namespace of 8 bytes i under key "one-step" and
 * state s: what places an entry in its key group's index. */
static uint64_t ns_lookup_hash(uint64_t i, void *ctx)
{
    stash_state *s = ctx;
    uint64_t seed = shm_lookup_seed(s->id, shm_ns_hash(&i, sizeof i));
    return shm_lookup_hash(stash_hash("one-step", 8), seed);
}

/* The key group and lookup hash of the key of 8 bytes i in state s's empty
 * namespace. */
static uint64_t key_place(uint64_t i, void *ctx)
{
    stash_state *s = ctx;
    uint64_t h = stash_hash(&i, sizeof i);
    return (uint64_t)shm_lookup_hash(h, s->seed) << 16 |
           stash_key_group(&i, sizeof i, arena->hdr->max_parallelism);
}

/* Entries whose lookup hashes collide in one key group share their home
 * group: a lookup tells them apart by the namespace's or the key's bytes,
 * whichever of them it finds first. */
Test(keyed, entries_whose_lookup_hashes_collide_stay_apart)
{
    stash_state *s = state("collide", STASH_VALUE);
    uint64_t ns[2], keys[2];
    find_collision(1u << 19, ns_lookup_hash, s, ns);
    find_collision(3u << 20, key_place, s, keys);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < 4; i++) {
            bool by_ns = i < 2;
            uint64_t k = by_ns ? 0 : keys[i % 2];
            cr_assert_eq(stash_key_set(w, by_ns ? "one-step" : (const void *)&k, 8), 0);
            cr_assert_eq(stash_state_namespace(s, by_ns ? &ns[i] : NULL, by_ns ? 8 : 0), 0);
            char want[32];
            snprintf(want, sizeof want, "entry %d", i);
            if (pass == 0)
                cr_assert_eq(stash_value_put(s, want, strlen(want)), 0);
            else
                expect_value(s, want);
        }
    }
}

/* A worker keeps the lookup hash of its last state and namespace for the
 * current key: every change of key, state or namespace must renew it. */
Test(keyed, values_of_states_and_namespaces_interleaved_stay_apart)
{
    stash_state *s[2] = {state("x", STASH_VALUE), state("y", STASH_VALUE)};
    const char *ns[2] = {"", "window"};
    char want[64];
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < 8 * 2 * 2; i++) {
            /* The writes walk keys outermost, the reads states. */
            int k = pass ? i % 8 : i / 4, st = pass ? i / 16 : i % 2,
                n = pass ? i / 8 % 2 : i / 2 % 2;
            char kbuf[16];
            snprintf(kbuf, sizeof kbuf, "key-%d", k);
            key(kbuf);
            cr_assert_eq(stash_state_namespace(s[st], ns[n], strlen(ns[n])), 0);
            snprintf(want, sizeof want, "%d/%d/%d", k, st, n);
            if (pass == 0)
                cr_assert_eq(stash_value_put(s[st], want, strlen(want)), 0);
            else
                expect_value(s[st], want);
        }
    }
}
Test(keyed, many_keys_survive_growth)
{
    stash_state *s = state("grow", STASH_VALUE);
    for (uint32_t i = 0; i < 200000; i++) {
        cr_assert_eq(stash_key_set(w, &i, sizeof i), 0);
        uint64_t v = (uint64_t)i * 7;
        cr_assert_eq(stash_value_put(s, &v, sizeof v), 0);
    }
    for (uint32_t i = 0; i < 200000; i++) {
        stash_key_set(w, &i, sizeof i);
        stash_bytes v;
        cr_assert_eq(stash_value_get(s, &v), 0, "key %u", i);
        cr_assert_eq(test_u64(v.data), (uint64_t)i * 7);
    }
    uint64_t n = 0;
    for (uint32_t kg = 0; kg < 128; kg++) n += (uint64_t)worker_kg_entries(w, kg);
    cr_assert_eq(n, 200000);
}

static void expect_list(stash_state *s, const char *const *want, size_t n)
{
    stash_iter it;
    int rc = stash_list_get(s, &it);
    if (n == 0) {
        cr_assert_eq(rc, STASH_ENOTFOUND);
        return;
    }
    cr_assert_eq(rc, 0);
    stash_bytes v;
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(stash_iter_next(&it, NULL, &v), 1, "element %zu", i);
        cr_assert_eq(v.len, strlen(want[i]));
        cr_assert_eq(memcmp(v.data, want[i], v.len), 0, "element %zu", i);
    }
    cr_assert_eq(stash_iter_next(&it, NULL, &v), 0);
}

Test(keyed, list_add_add_all_update_clear_in_order)
{
    stash_state *s = state("l", STASH_LIST);
    key("k");
    expect_list(s, NULL, 0);
    stash_list_add(s, "a", 1);
    stash_list_add(s, "bb", 2);
    stash_bytes more[] = {{"ccc", 3}, {"", 0}, {"dddd", 4}};
    cr_assert_eq(stash_list_add_all(s, more, 3), 0);
    expect_list(s, (const char *[]){"a", "bb", "ccc", "", "dddd"}, 5);
    stash_bytes repl[] = {{"x", 1}, {"y", 1}};
    cr_assert_eq(stash_list_update(s, repl, 2), 0);
    expect_list(s, (const char *[]){"x", "y"}, 2);
    cr_assert_eq(stash_list_update(s, NULL, 0), 0, "an empty update deletes");
    expect_list(s, NULL, 0);
    for (int i = 0; i < 1000; i++) stash_list_add(s, &i, sizeof i);
    stash_iter it;
    stash_bytes v;
    stash_list_get(s, &it);
    for (int i = 0; i < 1000; i++) {
        cr_assert_eq(stash_iter_next(&it, NULL, &v), 1);
        cr_assert_eq(test_int(v.data), i);
    }
    stash_state_clear(s);
    expect_list(s, NULL, 0);
}

Test(keyed, iterators_are_invalidated_by_writes)
{
    stash_state *s = state("inv", STASH_LIST);
    key("k");
    stash_list_add(s, "a", 1);
    stash_iter it;
    cr_assert_eq(stash_list_get(s, &it), 0);
    stash_list_add(s, "b", 1);
    cr_assert_eq(stash_iter_next(&it, NULL, NULL), STASH_ESTALE);
}

Test(keyed, map_put_get_remove_contains_iterate)
{
    stash_state *s = state("m", STASH_MAP);
    key("k");
    cr_assert_eq(stash_map_is_empty(s), 1);
    cr_assert_eq(stash_map_contains(s, "a", 1), 0);
    char kbuf[16], vbuf[32];
    for (int i = 0; i < 100; i++) {
        snprintf(kbuf, sizeof kbuf, "k%d", i);
        snprintf(vbuf, sizeof vbuf, "value-%d", i * i);
        cr_assert_eq(stash_map_put(s, kbuf, strlen(kbuf), vbuf, strlen(vbuf)), 0);
    }
    cr_assert_eq(stash_map_is_empty(s), 0);
    stash_map_put(s, "k7", 2, "seven", 5);
    stash_map_put(s, "k8", 2, "a much longer value for eight", 29);
    stash_bytes v;
    cr_assert_eq(stash_map_get(s, "k7", 2, &v), 0);
    cr_assert(v.len == 5 && memcmp(v.data, "seven", 5) == 0);
    cr_assert_eq(stash_map_get(s, "k8", 2, &v), 0);
    cr_assert_eq(v.len, 29);
    cr_assert_eq(stash_map_remove(s, "k9", 2), 0);
    cr_assert_eq(stash_map_contains(s, "k9", 2), 0);
    cr_assert_eq(stash_map_remove(s, "absent", 6), 0);
    stash_bytes keys[] = {{"p", 1}, {"q", 1}}, vals[] = {{"1", 1}, {"2", 1}};
    cr_assert_eq(stash_map_put_all(s, keys, vals, 2), 0);

    stash_iter it;
    stash_bytes k;
    int n = 0, seen7 = 0;
    cr_assert_eq(stash_map_iter(s, &it), 0);
    while (stash_iter_next(&it, &k, &v) == 1) {
        n++;
        if (k.len == 2 && memcmp(k.data, "k7", 2) == 0) seen7 = 1;
    }
    cr_assert_eq(n, 101);
    cr_assert(seen7);
}

Test(keyed, map_iterator_removes_the_last_returned_entry)
{
    stash_state *s = state("mi", STASH_MAP);
    key("k");
    for (int i = 0; i < 50; i++) stash_map_put(s, &i, sizeof i, &i, sizeof i);
    stash_iter it;
    stash_bytes k, v;
    cr_assert_eq(stash_map_iter(s, &it), 0);
    cr_assert_eq(stash_iter_remove(&it), -EINVAL, "nothing returned yet");
    int removed = 0;
    while (stash_iter_next(&it, &k, &v) == 1) {
        if (test_int(k.data) % 2 == 0) {
            cr_assert_eq(stash_iter_remove(&it), 0, "%s", stash_errmsg());
            removed++;
        }
    }
    cr_assert_eq(removed, 25);
    for (int i = 0; i < 50; i++) cr_assert_eq(stash_map_contains(s, &i, sizeof i), i % 2);
    cr_assert_eq(stash_map_iter(s, &it), 0);
    while (stash_iter_next(&it, &k, &v) == 1) cr_assert_eq(stash_iter_remove(&it), 0);
    cr_assert_eq(stash_map_is_empty(s), 1, "removing every entry deletes the map");
}

static int sum_reduce(const stash_bytes *acc, const stash_bytes *in, void *out, size_t cap,
                      size_t *len, void *ctx)
{
    (void)ctx;
    *len = sizeof(int64_t);
    if (cap < *len) return -ENOSPC;
    int64_t a = (int64_t)test_u64(acc->data), b = (int64_t)test_u64(in->data), r = a + b;
    memcpy(out, &r, sizeof r);
    return 0;
}

Test(keyed, reducing_state_reduces)
{
    stash_state *s;
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "r",
                                                     .kind = STASH_REDUCING,
                                                     .reduce = sum_reduce},
                                 &s),
                 0);
    key("k");
    stash_bytes v;
    cr_assert_eq(stash_merging_get(s, &v), STASH_ENOTFOUND);
    for (int64_t i = 1; i <= 10; i++) cr_assert_eq(stash_merging_add(s, &i, sizeof i), 0);
    cr_assert_eq(stash_merging_get(s, &v), 0);
    cr_assert_eq((int64_t)test_u64(v.data), 55);
    stash_state_clear(s);
    cr_assert_eq(stash_merging_get(s, &v), STASH_ENOTFOUND);
}

/* An average: the accumulator is (sum, count); the result is the mean as a double. */
static int avg_create(const stash_bytes *acc, void *out, size_t cap, size_t *len, void *ctx)
{
    (void)acc, (void)ctx;
    *len = 16;
    if (cap < 16) return -ENOSPC;
    memset(out, 0, 16);
    return 0;
}
static int avg_add(const stash_bytes *acc, const stash_bytes *in, void *out, size_t cap,
                   size_t *len, void *ctx)
{
    (void)ctx;
    *len = 16;
    if (cap < 16) return -ENOSPC;
    int64_t a[2];
    memcpy(a, acc->data, 16);
    a[0] += (int64_t)test_u64(in->data);
    a[1] += 1;
    memcpy(out, a, 16);
    return 0;
}
static int avg_merge(const stash_bytes *x, const stash_bytes *y, void *out, size_t cap, size_t *len,
                     void *ctx)
{
    (void)ctx;
    *len = 16;
    if (cap < 16) return -ENOSPC;
    int64_t a[2], b[2];
    memcpy(a, x->data, 16);
    memcpy(b, y->data, 16);
    a[0] += b[0], a[1] += b[1];
    memcpy(out, a, 16);
    return 0;
}
static int avg_result(const stash_bytes *acc, void *out, size_t cap, size_t *len, void *ctx)
{
    (void)ctx;
    *len = sizeof(double);
    if (cap < *len) return -ENOSPC;
    int64_t a[2];
    memcpy(a, acc->data, 16);
    double r = a[1] ? (double)a[0] / (double)a[1] : 0;
    memcpy(out, &r, sizeof r);
    return 0;
}
static const stash_aggregate_fns avg_fns = {
    .sz = sizeof(stash_aggregate_fns), avg_create, avg_add, avg_result, avg_merge};

Test(keyed, aggregating_state_aggregates_and_merges_namespaces)
{
    stash_state *s;
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "avg",
                                                     .kind = STASH_AGGREGATING,
                                                     .aggregate = &avg_fns},
                                 &s),
                 0);
    key("k");
    stash_state_namespace(s, "w1", 2);
    for (int64_t i = 1; i <= 4; i++) stash_merging_add(s, &i, sizeof i);
    stash_state_namespace(s, "w2", 2);
    int64_t ten = 10;
    stash_merging_add(s, &ten, sizeof ten);
    stash_bytes v;
    cr_assert_eq(stash_merging_get(s, &v), 0);
    cr_assert_eq(test_double(v.data), 10.0);
    stash_bytes sources[] = {{"w1", 2}, {"w2", 2}};
    cr_assert_eq(stash_merge_namespaces(s, "w3", 2, sources, 2), 0);
    cr_assert_eq(stash_merging_get(s, &v), STASH_ENOTFOUND, "sources are deleted");
    stash_state_namespace(s, "w3", 2);
    cr_assert_eq(stash_merging_get(s, &v), 0);
    cr_assert_eq(test_double(v.data), 20.0 / 5.0);
}

Test(keyed, list_merge_namespaces_appends_in_order)
{
    stash_state *s = state("lm", STASH_LIST);
    key("k");
    stash_state_namespace(s, "a", 1);
    stash_list_add(s, "1", 1);
    stash_state_namespace(s, "b", 1);
    stash_list_add(s, "2", 1);
    stash_list_add(s, "3", 1);
    stash_state_namespace(s, "t", 1);
    stash_list_add(s, "0", 1);
    stash_bytes sources[] = {{"a", 1}, {"b", 1}, {"missing", 7}};
    cr_assert_eq(stash_merge_namespaces(s, "t", 1, sources, 3), 0);
    expect_list(s, (const char *[]){"0", "1", "2", "3"}, 4);
    stash_state_namespace(s, "a", 1);
    expect_list(s, NULL, 0);
    stash_state *v = state("not-mergeable", STASH_VALUE);
    cr_assert_eq(stash_merge_namespaces(v, "t", 1, sources, 1), STASH_EKIND);
}

Test(keyed, keys_of_a_state_in_one_or_all_namespaces)
{
    stash_state *s = state("ks", STASH_VALUE), *other = state("other", STASH_VALUE);
    for (int i = 0; i < 300; i++) {
        stash_key_set(w, &i, sizeof i);
        stash_state_namespace(s, i % 3 ? "odd" : "even", i % 3 ? 3 : 4);
        stash_value_put(s, "v", 1);
        stash_value_put(other, "o", 1);
    }
    uint8_t seen[300] = {0};
    stash_iter it;
    stash_bytes k;
    int n = 0;
    cr_assert_eq(stash_keys_iter(s, NULL, 0, &it), 0);
    while (stash_iter_next(&it, &k, NULL) == 1) {
        int i = test_int(k.data);
        cr_assert(!seen[i]++, "key %d once", i);
        n++;
    }
    cr_assert_eq(n, 300);
    n = 0;
    cr_assert_eq(stash_keys_iter(s, "even", 4, &it), 0);
    while (stash_iter_next(&it, &k, NULL) == 1) {
        cr_assert_eq(test_int(k.data) % 3, 0);
        n++;
    }
    cr_assert_eq(n, 100);
}

Test(keyed, registration_is_shared_and_kinds_must_agree)
{
    stash_state *a = state("shared", STASH_MAP), *b;
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "shared",
                                                     .kind = STASH_VALUE},
                                 &b),
                 STASH_EKIND);
    cr_assert(strstr(stash_errmsg(), "shared"));
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "shared",
                                                     .kind = STASH_MAP,
                                                     .ttl = {.ttl_ms = 5}},
                                 &b),
                 STASH_EKIND, "other TTL options are another state");
    b = state("shared", STASH_MAP);
    key("k");
    stash_map_put(a, "x", 1, "y", 1);
    cr_assert_eq(stash_map_contains(b, "x", 1), 1, "both handles see the same state");
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "r",
                                                     .kind = STASH_REDUCING},
                                 &b),
                 -EINVAL, "a reducing state needs its function");
    cr_assert_eq(stash_value_put(a, "v", 1), STASH_EKIND, "a map is not a value");
}

Test(keyed, writes_to_foreign_key_groups_are_refused)
{
    stash_worker_close(w);
    cr_assert_eq(
        stash_worker_open(
            arena_name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 2},
            &w),
        0);
    stash_state *s = state("own", STASH_VALUE), *l = state("ownl", STASH_LIST),
                *m = state("ownm", STASH_MAP);
    int foreign = -1;
    for (int i = 0; foreign < 0; i++) {
        stash_key_set(w, &i, sizeof i);
        if (stash_key_group_current(w) >= 64) foreign = i;
    }
    cr_assert_eq(stash_value_put(s, "x", 1), STASH_EKEYGROUP);
    cr_assert(strstr(stash_errmsg(), "0..63"), "%s", stash_errmsg());
    cr_assert_eq(stash_list_add(l, "x", 1), STASH_EKEYGROUP);
    cr_assert_eq(stash_map_put(m, "x", 1, "y", 1), STASH_EKEYGROUP);
    cr_assert_eq(stash_state_clear(s), STASH_EKEYGROUP);
    stash_bytes v;
    cr_assert_eq(stash_value_get(s, &v), STASH_ENOTFOUND, "reads of any key group work");
}

/* Flink's StateBackendTestBase#testApplyToAllKeysLambdaFunction: a function
 * applied to every key through getKeys clears (or updates) each one. */
Test(keyed, a_keys_iteration_survives_clearing_and_updating_the_keys_it_returned)
{
    stash_state *v = state("all", STASH_VALUE), *other = state("other", STASH_LIST);
    enum { N = 2000 };
    static uint8_t seen[N];
    for (int round = 0; round < 2; round++) {
        for (uint32_t k = 0; k < N; k++) {
            stash_key_set(w, &k, sizeof k);
            uint32_t x = k;
            cr_assert_eq(stash_value_put(v, &x, sizeof x), 0);
            cr_assert_eq(stash_list_add(other, &x, sizeof x), 0);
        }
        memset(seen, 0, sizeof seen);
        stash_iter it;
        stash_bytes kb;
        cr_assert_eq(stash_keys_iter(v, NULL, 0, &it), 0);
        int rc, n = 0;
        while ((rc = stash_iter_next(&it, &kb, NULL)) == 1) {
            uint32_t k = (uint32_t)test_int(kb.data);
            cr_assert_lt(k, N);
            cr_assert_eq(seen[k]++, 0, "key %u met twice", k);
            n++;
            cr_assert_eq(stash_key_set(w, &k, sizeof k), 0);
            if (round == 0) {
                cr_assert_eq(stash_state_clear(v), 0);
                cr_assert_eq(stash_state_clear(other), 0);
            } else {
                uint32_t x = k + 1000000;
                cr_assert_eq(stash_value_put(v, &x, sizeof x), 0);
                cr_assert_eq(stash_list_add(other, &x, sizeof x), 0);
            }
        }
        cr_assert_eq(rc, 0, "round %d: %s", round, stash_errmsg());
        cr_assert_eq(n, N, "round %d: every key once", round);
        for (uint32_t k = 0; k < N; k += 97) {
            stash_key_set(w, &k, sizeof k);
            stash_bytes b;
            if (round == 0) {
                cr_assert_eq(stash_value_get(v, &b), STASH_ENOTFOUND);
            } else {
                cr_assert_eq(stash_value_get(v, &b), 0);
                cr_assert_eq((uint32_t)test_int(b.data), k + 1000000);
            }
        }
    }
    /* An entry of a new key grows the heap's index at some point: then it is
     * stale. LMDB's walk goes on after the key returned last, whatever the
     * worker writes. */
    stash_iter it;
    stash_bytes kb;
    cr_assert_eq(stash_keys_iter(v, NULL, 0, &it), 0);
    int rc = stash_iter_next(&it, &kb, NULL);
    cr_assert_eq(rc, 1);
    for (uint32_t k = N; k < 50 * N; k++) {
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_put(v, &k, sizeof k), 0);
    }
    rc = stash_iter_next(&it, &kb, NULL);
    if (test_backend() == STASH_BACKEND_HEAP)
        cr_assert_eq(rc, STASH_ESTALE, "%d", rc);
    else
        cr_assert_geq(rc, 0, "%s", stash_errmsg());
}

Test(keyed, a_map_iteration_sets_values_and_survives_puts_to_keys_the_map_has)
{
    stash_state *m = state("mi", STASH_MAP);
    key("k");
    enum { N = 200 };
    for (uint32_t u = 0; u < N; u++) cr_assert_eq(stash_map_put(m, &u, sizeof u, "v", 1), 0);
    static uint8_t seen[N];
    stash_iter it;
    stash_bytes kb, vb;
    cr_assert_eq(stash_map_iter(m, &it), 0);
    int rc, n = 0;
    char big[64];
    memset(big, 'x', sizeof big);
    while ((rc = stash_iter_next(&it, &kb, &vb)) == 1) {
        uint32_t u = (uint32_t)test_int(kb.data);
        cr_assert_lt(u, N);
        cr_assert_eq(seen[u]++, 0, "user key %u met twice", u);
        n++;
        /* Longer values: appended, the map grown, its slots kept. */
        if (u % 2)
            cr_assert_eq(stash_iter_set_value(&it, big, 10 + u % 50), 0, "%s", stash_errmsg());
        else
            cr_assert_eq(stash_map_put(m, &u, sizeof u, big, 10 + u % 50), 0);
        /* A put to another key the map has, and a write to another state. */
        uint32_t other = (u + 7) % N;
        cr_assert_eq(stash_map_put(m, &other, sizeof other, "w", 1), 0);
    }
    cr_assert_eq(rc, 0, "%s", stash_errmsg());
    cr_assert_eq(n, N, "every entry once");
    for (uint32_t u = 0; u < N; u++) {
        cr_assert_eq(stash_map_get(m, &u, sizeof u, &vb), 0);
        /* The last write to u: its own (10 + u % 50 bytes), unless the put to
         * another key the iteration met later was u's. */
        cr_assert(vb.len == 10 + u % 50 || vb.len == 1, "user key %u: %zu bytes", u, vb.len);
    }
    /* A new user key moves slots: stale. */
    cr_assert_eq(stash_map_iter(m, &it), 0);
    cr_assert_eq(stash_iter_next(&it, &kb, &vb), 1);
    uint32_t fresh = N + 1;
    cr_assert_eq(stash_map_put(m, &fresh, sizeof fresh, "n", 1), 0);
    int stale = 0;
    for (int i = 0; i < 4 * N && (rc = stash_iter_next(&it, &kb, &vb)) == 1; i++) {
        uint32_t more = N + 2 + (uint32_t)i;
        cr_assert_eq(stash_map_put(m, &more, sizeof more, "n", 1), 0);
    }
    stale = rc == STASH_ESTALE;
    cr_assert(stale, "%d", rc);
}

/* The bytes the current key's map of m takes, dead ones included. */
static uint32_t map_bytes(stash_state *m)
{
    stash_iter it;
    cr_assert_eq(stash_map_iter(m, &it), 0);
    iter_impl x;
    memcpy(&x, &it, sizeof x);
    return x.blob_len;
}

Test(keyed, a_map_rewritten_under_pins_stays_compact)
{
    stash_state *m = state("compact", STASH_MAP);
    key("k");
    static char big[200];
    memset(big, 'x', sizeof big);
    for (uint32_t u = 0; u < 50; u++) cr_assert_eq(stash_map_put(m, &u, sizeof u, big, 10), 0);
    uint32_t kg = (uint32_t)stash_key_group_current(w), most = 0;
    /* Each rewrite changes a value's length while a version is pinned: the
     * map is copied, and the copy must drop what is dead. */
    for (uint32_t i = 0; i < 2000; i++) {
        int64_t pin = test_backend() == STASH_BACKEND_HEAP ? shm_table_pin(arena, kg) : 0;
        uint32_t u = i % 50;
        cr_assert_eq(stash_map_put(m, &u, sizeof u, big, 10 + i % 100), 0);
        if (pin > 0) shm_table_unpin(arena, kg, (uint32_t)pin);
        uint32_t n = map_bytes(m);
        if (n > most) most = n;
    }
    /* 50 entries of at most 110 bytes of value, and their slots: a few KiB. */
    cr_assert_lt(most, 24 * 1024, "the map grew to %u bytes", most);
}

/* The bytes a one-call test writes for (key k, round r): their length
 * varies with both, 0 meaning a clear. */
static size_t one_call_value(unsigned k, unsigned r, uint8_t *v)
{
    size_t n = (k * 31u + r * 7u) % 90u;
    for (size_t i = 0; i < n; i++) v[i] = (uint8_t)(k + r * 3u + i);
    return n;
}

/* A get answered rc and got where the entry holds want (wlen bytes, 0 for
 * none) and the state reads dflt (or nothing) when it is absent. */
static void expect_read(int rc, stash_bytes got, const uint8_t *want, size_t wlen, const char *dflt,
                        unsigned seed, unsigned step)
{
    if (wlen == 0 && !dflt) {
        cr_assert_eq(rc, STASH_ENOTFOUND, "seed %u step %u", seed, step);
        return;
    }
    cr_assert_eq(rc, 0, "seed %u step %u: %s", seed, step, stash_strerror(rc));
    if (wlen == 0) want = (const uint8_t *)dflt, wlen = strlen(dflt);
    cr_assert(got.len == wlen && memcmp(got.data, want, wlen) == 0, "seed %u step %u: the value",
              seed, step);
}

/* stash_value_get_key and stash_value_put_key do what stash_key_set and
 * then stash_value_get or stash_value_put do: the same entries, for keys of
 * every length (the one-step path and the others), in a namespace and not,
 * on a plain state and one with a default and TTL; the key stays current. */
Test(keyed, one_call_accesses_agree_with_key_set_then_access)
{
    unsigned seed = test_seed("one_call_accesses_agree_with_key_set_then_access");
    stash_state *states[2] = {state("one-call", STASH_VALUE), NULL};
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "one-call-ttl",
                                                     .kind = STASH_VALUE,
                                                     .ttl = {.ttl_ms = 3600000},
                                                     .default_value = {"dflt", 4}},
                                 &states[1]),
                 0, "%s", stash_errmsg());
    const char *dflt[2] = {NULL, "dflt"};
    enum { KEYS = 48 };
    uint8_t keys[KEYS][24], want[2][2][KEYS][96];
    size_t klen[KEYS], wlen[2][2][KEYS] = {{{0}}};
    for (unsigned k = 0; k < KEYS; k++) {
        klen[k] = k < 24 ? k : k - 23; /* 0 .. 24 bytes: short keys and others */
        for (size_t i = 0; i < klen[k]; i++) keys[k][i] = (uint8_t)(k * 5 + i);
    }
    srand(seed);
    for (unsigned step = 0; step < 4000; step++) {
        unsigned k = (unsigned)rand() % KEYS, st = (unsigned)rand() % 2, ns = (unsigned)rand() % 2;
        unsigned how = (unsigned)rand() % 4;
        stash_state *s = states[st];
        cr_assert_eq(stash_state_namespace(s, ns ? "namespace" : NULL, ns ? 9 : 0), 0);
        uint8_t v[96];
        size_t n = one_call_value(k, step, v);
        stash_bytes got;
        if (how == 0) {
            cr_assert_eq(stash_value_put_key(s, keys[k], klen[k], n ? v : NULL, n), 0,
                         "seed %u step %u: %s", seed, step, stash_errmsg());
        } else if (how == 1) {
            cr_assert_eq(stash_key_set(w, keys[k], klen[k]), 0);
            cr_assert_eq(stash_value_put(s, n ? v : NULL, n), 0);
        } else {
            int rc = how == 2 ? stash_value_get_key(s, keys[k], klen[k], &got)
                              : (stash_key_set(w, keys[k], klen[k]), stash_value_get(s, &got));
            expect_read(rc, got, want[st][ns][k], wlen[st][ns][k], dflt[st], seed, step);
        }
        if (how < 2) {
            memcpy(want[st][ns][k], v, n);
            wlen[st][ns][k] = n;
        }
        /* Either way the key is current: a get in two calls reads the same. */
        cr_assert_eq(stash_key_group_current(w),
                     (int)stash_key_group(keys[k], klen[k], arena->hdr->max_parallelism));
        int rc = stash_value_get(s, &got);
        expect_read(rc, got, want[st][ns][k], wlen[st][ns][k], dflt[st], seed, step);
    }
}

/* The one-call accesses refuse what stash_key_set and the accesses refuse:
 * a write to a key group the worker does not own, and a key of NULL bytes
 * (leaving no key current). */
Test(keyed, one_call_accesses_refuse_foreign_key_groups_and_null_keys)
{
    stash_worker_close(w);
    cr_assert_eq(
        stash_worker_open(
            arena_name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 2},
            &w),
        0);
    stash_state *s = state("one-call-own", STASH_VALUE);
    uint64_t foreign = 0;
    for (;; foreign++)
        if (stash_key_group(&foreign, sizeof foreign, arena->hdr->max_parallelism) >= 64) break;
    cr_assert_eq(stash_value_put_key(s, &foreign, sizeof foreign, "x", 1), STASH_EKEYGROUP);
    stash_bytes v;
    cr_assert_eq(stash_value_get_key(s, &foreign, sizeof foreign, &v), STASH_ENOTFOUND,
                 "reads of any key group work");
    uint64_t own = 0;
    for (;; own++)
        if (stash_key_group(&own, sizeof own, arena->hdr->max_parallelism) < 64) break;
    cr_assert_eq(stash_value_put_key(s, &own, sizeof own, "x", 1), 0);
    cr_assert_eq(stash_value_get_key(s, NULL, 8, &v), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "stash_value_get_key"), "%s", stash_errmsg());
    cr_assert_eq(stash_value_get(s, &v), STASH_ENOKEY, "the refused key left none current");
    cr_assert_eq(stash_value_get_key(s, &own, sizeof own, &v), 0);
    cr_assert(v.len == 1 && memcmp(v.data, "x", 1) == 0);
}
