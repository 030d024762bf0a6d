/* SPDX-License-Identifier: MIT */
/*
 * test_ttl.c: Flink's TTL semantics with an injected clock: expiry at
 * ts + ttl inclusive and saturating, the two update types, the two
 * visibilities, per element for lists and per user key for maps, removal on
 * read, incremental cleanup on writes and at barriers, and keys iteration.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/checkpoint/checkpoints.h"
#include "backends/lmdb/lmdb.h"
#include "tests/helpers.h"

static uint64_t fake_now;
static uint64_t fake_clock(void *ctx)
{
    (void)ctx;
    return fake_now;
}

static char arena_name[96];
static stash_arena *arena;
static stash_worker *w;

static void setup(void)
{
    fake_now = 1000;
    arena = test_arena_create("ttl", 32u << 20, 4, arena_name);
    cr_assert_eq(stash_worker_open(arena_name,
                                   &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                        .parallelism = 1,
                                                        .clock = fake_clock},
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

TestSuite(ttl, .init = setup, .fini = teardown);

static stash_state *ttl_state(const char *name, stash_kind kind, uint64_t ttl, int update,
                              int visibility)
{
    stash_state *s;
    stash_state_desc d = {.sz = sizeof(stash_state_desc),
                          .name = name,
                          .kind = kind,
                          .ttl = {.ttl_ms = ttl, .update = update, .visibility = visibility}};
    cr_assert_eq(stash_state_get(w, &d, &s), 0, "%s", stash_errmsg());
    return s;
}

Test(ttl, a_value_expires_at_ts_plus_ttl_inclusive)
{
    stash_state *s = ttl_state("v", STASH_VALUE, 100, 0, 0);
    stash_key_set(w, "k", 1);
    stash_value_put(s, "x", 1);
    stash_bytes v;
    fake_now = 1099;
    cr_assert_eq(stash_value_get(s, &v), 0);
    cr_assert(v.len == 1 && *(const char *)v.data == 'x');
    fake_now = 1100;
    cr_assert_eq(stash_value_get(s, &v), STASH_ENOTFOUND, "expired at exactly ts + ttl");
    fake_now = 1000;
    cr_assert_eq(stash_value_get(s, &v), STASH_ENOTFOUND, "a read of an expired entry removed it");
}

Test(ttl, writes_refresh_and_reads_refresh_only_when_asked)
{
    stash_state *cw = ttl_state("cw", STASH_VALUE, 100, STASH_TTL_ON_CREATE_AND_WRITE, 0);
    stash_state *rw = ttl_state("rw", STASH_VALUE, 100, STASH_TTL_ON_READ_AND_WRITE, 0);
    stash_key_set(w, "k", 1);
    stash_value_put(cw, "a", 1);
    stash_value_put(rw, "a", 1);
    stash_bytes v;
    fake_now = 1050;
    cr_assert_eq(stash_value_get(cw, &v), 0);
    cr_assert_eq(stash_value_get(rw, &v), 0);
    fake_now = 1120;
    cr_assert_eq(stash_value_get(cw, &v), STASH_ENOTFOUND, "a read did not extend it");
    cr_assert_eq(stash_value_get(rw, &v), 0, "the read at 1050 extended it to 1150");
    stash_value_put(cw, "b", 1);
    fake_now = 1219;
    cr_assert_eq(stash_value_get(cw, &v), 0, "the write at 1120 extended it");
}

Test(ttl, expired_values_are_returned_only_if_asked_and_not_cleaned)
{
    stash_state *s = ttl_state("ret", STASH_VALUE, 10, 0, STASH_TTL_RETURN_EXPIRED_IF_NOT_CLEANED);
    stash_key_set(w, "k", 1);
    stash_value_put(s, "stale", 5);
    fake_now = 2000;
    stash_bytes v;
    cr_assert_eq(stash_value_get(s, &v), 0, "returned once, as not cleaned up yet");
    cr_assert(v.len == 5 && memcmp(v.data, "stale", 5) == 0);
    cr_assert_eq(stash_value_get(s, &v), STASH_ENOTFOUND, "then it is gone");
}

Test(ttl, timestamps_saturate_instead_of_wrapping)
{
    stash_state *s = ttl_state("sat", STASH_VALUE, UINT64_MAX - 10, 0, 0);
    stash_key_set(w, "k", 1);
    fake_now = UINT64_MAX - 5;
    stash_value_put(s, "x", 1);
    stash_bytes v;
    fake_now = UINT64_MAX - 1;
    cr_assert_eq(stash_value_get(s, &v), 0, "ts + ttl would wrap: it saturates instead");
}

Test(ttl, list_elements_expire_one_by_one)
{
    stash_state *s = ttl_state("l", STASH_LIST, 100, 0, 0);
    stash_key_set(w, "k", 1);
    stash_list_add(s, "old", 3);
    fake_now = 1060;
    stash_list_add(s, "new", 3);
    fake_now = 1120;
    stash_iter it;
    stash_bytes v;
    cr_assert_eq(stash_list_get(s, &it), 0);
    cr_assert_eq(stash_iter_next(&it, NULL, &v), 1);
    cr_assert(v.len == 3 && memcmp(v.data, "new", 3) == 0);
    cr_assert_eq(stash_iter_next(&it, NULL, &v), 0);
    fake_now = 1200;
    cr_assert_eq(stash_list_get(s, &it), STASH_ENOTFOUND, "all expired: the list is gone");
}

Test(ttl, map_entries_expire_per_user_key)
{
    stash_state *s = ttl_state("m", STASH_MAP, 100, 0, 0);
    stash_key_set(w, "k", 1);
    stash_map_put(s, "a", 1, "1", 1);
    fake_now = 1050;
    stash_map_put(s, "b", 1, "2", 1);
    fake_now = 1100;
    stash_bytes v;
    cr_assert_eq(stash_map_get(s, "a", 1, &v), STASH_ENOTFOUND);
    cr_assert_eq(stash_map_get(s, "b", 1, &v), 0);
    cr_assert_eq(stash_map_contains(s, "a", 1), 0);
    stash_iter it;
    stash_bytes k;
    int n = 0;
    cr_assert_eq(stash_map_iter(s, &it), 0);
    while (stash_iter_next(&it, &k, &v) == 1) n++;
    cr_assert_eq(n, 1);
    fake_now = 1150;
    cr_assert_eq(stash_map_is_empty(s), 1);
}

Test(ttl, incremental_cleanup_removes_untouched_entries)
{
    stash_state *s = ttl_state("inc", STASH_VALUE, 10, 0, 0);
    for (uint32_t i = 0; i < 500; i++) {
        stash_key_set(w, &i, sizeof i);
        stash_value_put(s, "x", 1);
    }
    uint64_t before = 0, after = 0;
    for (uint32_t kg = 0; kg < 4; kg++) before += (uint64_t)worker_kg_entries(w, kg);
    fake_now = 5000;
    /* Writes to other keys examine a few entries each and drop the expired. */
    for (uint32_t i = 1000; i < 1400; i++) {
        stash_key_set(w, &i, sizeof i);
        stash_value_put(s, "y", 1);
    }
    for (uint32_t kg = 0; kg < 4; kg++) after += (uint64_t)worker_kg_entries(w, kg);
    cr_assert_eq(before, 500);
    cr_assert_lt(after, 500 + 400 - 200, "cleanup removed expired entries nobody read");
}

Test(ttl, keys_iteration_skips_expired_entries)
{
    stash_state *s = ttl_state("keys", STASH_VALUE, 100, 0, 0);
    for (uint32_t i = 0; i < 10; i++) {
        stash_key_set(w, &i, sizeof i);
        stash_value_put(s, "x", 1);
        fake_now += 20;
    }
    stash_iter it;
    int n = 0;
    cr_assert_eq(stash_keys_iter(s, NULL, 0, &it), 0);
    while (stash_iter_next(&it, NULL, NULL) == 1) n++;
    cr_assert_eq(n, 4, "entries written at 1000..1100 expired by 1200");
}

Test(ttl, barriers_clean_expired_entries_nobody_touches)
{
    stash_state *s;
    stash_state_desc d = {.sz = sizeof(stash_state_desc),
                          .name = "bg",
                          .kind = STASH_VALUE,
                          .ttl = {.ttl_ms = 10, .cleanup_entries = 100}};
    cr_assert_eq(stash_state_get(w, &d, &s), 0, "%s", stash_errmsg());
    for (uint32_t i = 0; i < 200; i++) {
        stash_key_set(w, &i, sizeof i);
        stash_value_put(s, "x", 1);
    }
    uint64_t left = 0;
    for (uint32_t kg = 0; kg < 4; kg++) left += (uint64_t)worker_kg_entries(w, kg);
    cr_assert_eq(left, 200);
    fake_now = 5000;
    /* No reads, no writes: barriers alone, each sweeping one key group at
     * most every 50 ms. */
    for (int round = 0; round < 40 && left > 0; round++) {
        usleep(60000);
        stash_event ev;
        cr_assert_geq(stash_barrier(w, &ev), 0, "%s", stash_errmsg());
        left = 0;
        for (uint32_t kg = 0; kg < 4; kg++) left += (uint64_t)worker_kg_entries(w, kg);
    }
    cr_assert_eq(left, 0, "%llu expired entries left", (unsigned long long)left);
}

/* Every update type and visibility, with values, elements and map values
 * of length 0: read before and after expiry (the sanitizers watch). */
static int sum_empty(const stash_bytes *acc, const stash_bytes *in, void *out, size_t cap,
                     size_t *len, void *ctx)
{
    (void)acc, (void)in, (void)out, (void)cap, (void)ctx;
    *len = 0;
    return 0;
}

Test(ttl, empty_values_in_every_mode_read_before_and_after_expiry)
{
    for (int update = 0; update < 2; update++)
        for (int vis = 0; vis < 2; vis++) {
            char name[4][16];
            const stash_kind kinds[] = {STASH_VALUE, STASH_LIST, STASH_MAP, STASH_REDUCING};
            stash_state *s[4];
            for (int k = 0; k < 4; k++) {
                snprintf(name[k], sizeof name[k], "e%d%d%d", update, vis, k);
                stash_state_desc d = {.sz = sizeof(stash_state_desc),
                                      .name = name[k],
                                      .kind = kinds[k],
                                      .reduce = sum_empty,
                                      .ttl = {.ttl_ms = 100, .update = update, .visibility = vis}};
                cr_assert_eq(stash_state_get(w, &d, &s[k]), 0, "%s", stash_errmsg());
            }
            fake_now = 1000;
            stash_key_set(w, "k", 1);
            cr_assert_eq(stash_value_put(s[0], "", 0), 0);
            cr_assert_eq(stash_list_add(s[1], "", 0), 0);
            cr_assert_eq(stash_map_put(s[2], "u", 1, "", 0), 0);
            cr_assert_eq(stash_merging_add(s[3], "", 0), 0);
            stash_bytes b;
            stash_iter it;
            cr_assert_eq(stash_map_get(s[2], "u", 1, &b), 0);
            cr_assert_eq(b.len, 0);
            cr_assert_eq(stash_list_get(s[1], &it), 0);
            cr_assert_eq(stash_iter_next(&it, NULL, &b), 1);
            cr_assert_eq(b.len, 0);
            fake_now = 1000 + 100;
            int want = vis == STASH_TTL_RETURN_EXPIRED_IF_NOT_CLEANED ? 0 : STASH_ENOTFOUND;
            int rc = stash_map_get(s[2], "u", 1, &b);
            cr_assert_eq(rc, want, "map, update %d, visibility %d", update, vis);
            if (rc == 0) cr_assert_eq(b.len, 0);
            cr_assert_eq(stash_map_get(s[2], "u", 1, &b), STASH_ENOTFOUND, "the read removed it");
            rc = stash_merging_get(s[3], &b);
            cr_assert(rc == 0 || rc == STASH_ENOTFOUND, "%d", rc);
            rc = stash_list_get(s[1], &it);
            cr_assert(rc == 0 || rc == STASH_ENOTFOUND, "%d", rc);
            stash_value_get(s[0], &b);
        }
}

/* Reopens the suite's worker: a new registration of the arena's states. */
static void reopen_worker(void)
{
    stash_worker_close(w);
    cr_assert_eq(stash_worker_open(arena_name,
                                   &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                        .parallelism = 1,
                                                        .clock = fake_clock},
                                   &w),
                 0);
}

Test(ttl, a_state_registered_again_with_another_duration_keeps_its_timestamps)
{
    stash_state *s = ttl_state("d", STASH_VALUE, 100, 0, 0);
    stash_key_set(w, "k", 1);
    cr_assert_eq(stash_value_put(s, "x", 1), 0);
    reopen_worker();
    /* From 100 ms to 1000 ms: the stored timestamp (1000) stays. */
    s = ttl_state("d", STASH_VALUE, 1000, 0, 0);
    stash_key_set(w, "k", 1);
    stash_bytes v;
    fake_now = 1500;
    cr_assert_eq(stash_value_get(s, &v), 0, "alive under the new duration");
    fake_now = 2000;
    cr_assert_eq(stash_value_get(s, &v), STASH_ENOTFOUND, "expired at 1000 + 1000");
    /* Switching TTL off (or on) is another state. */
    reopen_worker();
    stash_state *off;
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "d", .kind = STASH_VALUE},
            &off),
        STASH_EKIND);
    cr_assert(strstr(stash_errmsg(), "with TTL"), "%s", stash_errmsg());
    stash_state_desc on = {.sz = sizeof(stash_state_desc), .name = "plain", .kind = STASH_VALUE};
    cr_assert_eq(stash_state_get(w, &on, &off), 0);
    reopen_worker();
    on.ttl.ttl_ms = 10;
    cr_assert_eq(stash_state_get(w, &on, &off), STASH_EKIND);
}

Test(ttl, a_checkpoint_restores_under_another_duration, .timeout = 60)
{
    stash_state *s = ttl_state("r", STASH_MAP, 100, 0, 0);
    stash_key_set(w, "k", 1);
    cr_assert_eq(stash_map_put(s, "u", 1, "x", 1), 0);
    char dir[] = "/var/tmp/stash-ttl-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    ioe_engine *e;
    cr_assert_eq(ioe_engine_open(&(ioe_opts){0}, &e), 0);
    uint32_t pins[4] = {0};
    stash_worker_close(w);
    ckpt_opts o = {.dir = test_ckpt_dir(dir), .id = 1, .engine = e};
    for (uint32_t kg = 0; kg < 4; kg++) pins[kg] = (uint32_t)shm_table_pin(arena, kg);
    cr_assert_eq(ckpt_write(arena, pins, &o, NULL), 0, "%s", stash_errmsg());
    for (uint32_t kg = 0; kg < 4; kg++) shm_table_unpin(arena, kg, pins[kg]);
    /* A new arena restores it; its job asks for 1000 ms. */
    char name2[96];
    stash_arena *b = test_arena_create("ttl2", 32u << 20, 4, name2);
    ckpt_restored out;
    cr_assert_eq(ckpt_restore(b, test_ckpt_dir(dir), 0, (stash_kg_range){0, 3}, e, &out), 0, "%s",
                 stash_errmsg());
    ckpt_restored_free(&out);
    cr_assert_eq(stash_worker_open(name2,
                                   &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                        .parallelism = 1,
                                                        .clock = fake_clock},
                                   &w),
                 0);
    s = ttl_state("r", STASH_MAP, 1000, 0, 0);
    stash_key_set(w, "k", 1);
    stash_bytes v;
    fake_now = 1500;
    cr_assert_eq(stash_map_get(s, "u", 1, &v), 0, "%s", stash_errmsg());
    fake_now = 2000;
    cr_assert_eq(stash_map_get(s, "u", 1, &v), STASH_ENOTFOUND);
    stash_worker_close(w);
    stash_arena_close(b);
    stash_arena_destroy(name2, NULL);
    ioe_engine_close(e);
    cr_assert_eq(stash_worker_open(arena_name,
                                   &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                        .parallelism = 1,
                                                        .clock = fake_clock},
                                   &w),
                 0);
    test_remove_dir(dir);
}

Test(ttl, cleanup_for_every_record_empties_a_state_whose_keys_are_each_set_once)
{
    stash_state_desc d = {.sz = sizeof(stash_state_desc),
                          .name = "every",
                          .kind = STASH_VALUE,
                          .ttl = {.ttl_ms = 100, .cleanup_every_record = 1}};
    stash_state *s;
    cr_assert_eq(stash_state_get(w, &d, &s), 0, "%s", stash_errmsg());
    for (uint32_t k = 0; k < 970; k++) {
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_put(s, &k, sizeof k), 0);
    }
    fake_now = 5000;
    /* Each key is the current key once, as a record of it passes; nothing
     * reads or writes the state. */
    for (uint32_t k = 0; k < 970; k++) cr_assert_eq(stash_key_set(w, &k, sizeof k), 0);
    int64_t left = 0;
    for (uint32_t kg = 0; kg < 4; kg++) left += worker_kg_entries(w, kg);
    cr_assert_eq(left, 0, "%lld entries left", (long long)left);
    stash_iter it;
    cr_assert_eq(stash_keys_iter(s, NULL, 0, &it), 0);
    cr_assert_eq(stash_iter_next(&it, NULL, NULL), 0);
}

/* The user keys an iteration of map s returns, as a string of their bytes. */
static void iterate_map(stash_state *s, char *out, size_t cap)
{
    stash_iter it;
    size_t n = 0;
    out[0] = 0;
    int rc = stash_map_iter(s, &it);
    if (rc == STASH_ENOTFOUND) return;
    cr_assert_eq(rc, 0, "%s", stash_errmsg());
    stash_bytes k, v;
    while ((rc = stash_iter_next(&it, &k, &v)) == 1) {
        cr_assert_eq(k.len, 1);
        cr_assert_lt(n + 1, cap);
        out[n++] = *(const char *)k.data;
        out[n] = 0;
    }
    cr_assert_eq(rc, 0, "%s", stash_errmsg());
}

static stash_state *three_entries(const char *name, int update, int visibility)
{
    stash_state *s = ttl_state(name, STASH_MAP, 100, update, visibility);
    stash_key_set(w, "k", 1);
    const char *keys = "abc";
    const uint64_t at[] = {1000, 1050, 1090};
    for (int i = 0; i < 3; i++) {
        fake_now = at[i];
        cr_assert_eq(stash_map_put(s, &keys[i], 1, "v", 1), 0);
    }
    return s;
}

/* Sorted, since a map's iteration order is unspecified. */
static void sort_chars(char *s)
{
    for (size_t i = 1; s[i]; i++)
        for (size_t j = i; j > 0 && s[j - 1] > s[j]; j--) {
            char t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
}

Test(ttl, map_iteration_never_returns_expired_entries_and_removes_them)
{
    stash_state *s =
        three_entries("mi1", STASH_TTL_ON_CREATE_AND_WRITE, STASH_TTL_NEVER_RETURN_EXPIRED);
    char got[8];
    fake_now = 1120;
    iterate_map(s, got, sizeof got);
    sort_chars(got);
    cr_assert_str_eq(got, "bc");
    /* Gone for good: with the clock set back it stays gone. */
    fake_now = 1000;
    iterate_map(s, got, sizeof got);
    sort_chars(got);
    cr_assert_str_eq(got, "bc");
    /* Once every entry expired, the key has no map left (getKeys). */
    fake_now = 5000;
    iterate_map(s, got, sizeof got);
    cr_assert_str_eq(got, "");
    fake_now = 1000;
    stash_iter it;
    cr_assert_eq(stash_keys_iter(s, NULL, 0, &it), 0);
    cr_assert_eq(stash_iter_next(&it, NULL, NULL), 0, "no key is left behind");
}

Test(ttl, map_iteration_returns_an_expired_entry_once_if_asked)
{
    stash_state *s = three_entries("mi2", STASH_TTL_ON_CREATE_AND_WRITE,
                                   STASH_TTL_RETURN_EXPIRED_IF_NOT_CLEANED);
    char got[8];
    fake_now = 1120;
    iterate_map(s, got, sizeof got);
    sort_chars(got);
    cr_assert_str_eq(got, "abc", "the expired entry, this once");
    iterate_map(s, got, sizeof got);
    sort_chars(got);
    cr_assert_str_eq(got, "bc", "then cleaned up");
}

Test(ttl, map_iteration_refreshes_entries_when_reads_do)
{
    stash_state *s =
        three_entries("mi3", STASH_TTL_ON_READ_AND_WRITE, STASH_TTL_NEVER_RETURN_EXPIRED);
    char got[8];
    fake_now = 1095;
    iterate_map(s, got, sizeof got);
    sort_chars(got);
    cr_assert_str_eq(got, "abc");
    /* Read at 1095, each lives to 1195. */
    fake_now = 1180;
    stash_bytes v;
    cr_assert_eq(stash_map_get(s, "a", 1, &v), 0, "the iteration refreshed it");
    cr_assert_eq(stash_map_get(s, "b", 1, &v), 0);
}

/* The newest checkpoint in dir restored into a new arena (in *b, named
 * name2), and a worker of it on the fake clock. */
static stash_worker *restored_worker(const char *dir, stash_arena **b, char *name2)
{
    *b = test_arena_create("ttlfull", 32u << 20, 4, name2);
    ioe_engine *e;
    cr_assert_eq(ioe_engine_open(&(ioe_opts){0}, &e), 0);
    ckpt_restored out;
    cr_assert_eq(ckpt_restore(*b, test_ckpt_dir(dir), 0, (stash_kg_range){0, 3}, e, &out), 0, "%s",
                 stash_errmsg());
    ckpt_restored_free(&out);
    ioe_engine_close(e);
    stash_worker *r;
    cr_assert_eq(stash_worker_open(name2,
                                   &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                        .parallelism = 1,
                                                        .clock = fake_clock},
                                   &r),
                 0);
    return r;
}

/* Flink's TtlStateTestBase snapshots with a manual clock that starts at 0:
 * a clock that reads 0 is the cut's time like any other, not "no clock"
 * (which would cut by the real time and leave out what is alive). */
Test(ttl, a_clock_that_reads_zero_is_the_time_of_the_cut, .timeout = 120)
{
    char dir[] = "/var/tmp/stash-ttl-zero-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    stash_service *svc;
    cr_assert_eq(
        stash_service_start(
            arena_name, &(stash_service_opts){.sz = sizeof(stash_service_opts), .dir = dir}, &svc),
        0, "%s", stash_errmsg());
    stash_state_desc d = {.sz = sizeof(stash_state_desc),
                          .name = "zero",
                          .kind = STASH_VALUE,
                          .ttl = {.ttl_ms = 100, .cleanup_full_snapshot = 1}};
    stash_state *v;
    cr_assert_eq(stash_state_get(w, &d, &v), 0, "%s", stash_errmsg());
    fake_now = 0; /* written at 0 and cut at 0: alive until 100 */
    stash_key_set(w, "k", 1);
    cr_assert_eq(stash_value_put(v, "x", 1), 0);
    stash_checkpoint_info info;
    cr_assert_eq(test_checkpoint_at_barriers(arena, &w, 1, &info), 0, "%s", info.detail);
    stash_service_stop(svc);
    char name2[96];
    stash_arena *b;
    stash_worker *r = restored_worker(dir, &b, name2);
    cr_assert_eq(stash_state_get(r, &d, &v), 0);
    stash_bytes got;
    stash_key_set(r, "k", 1);
    cr_assert_eq(stash_value_get(v, &got), 0, "alive at the cut, so in the checkpoint");
    cr_assert(got.len == 1 && *(const char *)got.data == 'x');
    stash_worker_close(r);
    stash_arena_close(b);
    stash_arena_destroy(name2, NULL);
    test_remove_dir(dir);
}

/* Flink's cleanupFullSnapshot: a checkpoint leaves out what expired at its
 * cut; restored with the clock set back, it stays gone. */
Test(ttl, a_full_checkpoint_leaves_out_what_expired_at_the_cut, .timeout = 120)
{
    char dir[] = "/var/tmp/stash-ttl-full-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    stash_service *svc;
    cr_assert_eq(
        stash_service_start(
            arena_name, &(stash_service_opts){.sz = sizeof(stash_service_opts), .dir = dir}, &svc),
        0, "%s", stash_errmsg());
    stash_state_desc d = {.sz = sizeof(stash_state_desc), .name = "full", .kind = STASH_VALUE};
    d.ttl = (stash_ttl){.ttl_ms = 100, .cleanup_full_snapshot = 1};
    stash_state *v, *l, *m;
    cr_assert_eq(stash_state_get(w, &d, &v), 0, "%s", stash_errmsg());
    d.name = "fulllist", d.kind = STASH_LIST;
    cr_assert_eq(stash_state_get(w, &d, &l), 0);
    d.name = "fullmap", d.kind = STASH_MAP;
    cr_assert_eq(stash_state_get(w, &d, &m), 0);
    fake_now = 1000; /* old: expired at the cut */
    stash_key_set(w, "old", 3);
    cr_assert_eq(stash_value_put(v, "o", 1), 0);
    stash_key_set(w, "mix", 3);
    cr_assert_eq(stash_list_add(l, "a", 1), 0);
    cr_assert_eq(stash_map_put(m, "a", 1, "1", 1), 0);
    fake_now = 1150; /* new: alive at the cut */
    cr_assert_eq(stash_list_add(l, "b", 1), 0);
    cr_assert_eq(stash_map_put(m, "b", 1, "2", 1), 0);
    stash_key_set(w, "new", 3);
    cr_assert_eq(stash_value_put(v, "n", 1), 0);
    fake_now = 1200; /* the cut */
    stash_arena *a;
    cr_assert_eq(stash_arena_open(arena_name, NULL, &a), 0);
    stash_checkpoint_info info;
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
    stash_arena_close(a);
    stash_service_stop(svc);
    /* Restored into a new arena, read with the clock set back to 1000. */
    char name2[96];
    stash_arena *b;
    stash_worker *r = restored_worker(dir, &b, name2);
    d.name = "full", d.kind = STASH_VALUE;
    cr_assert_eq(stash_state_get(r, &d, &v), 0);
    d.name = "fulllist", d.kind = STASH_LIST;
    cr_assert_eq(stash_state_get(r, &d, &l), 0);
    d.name = "fullmap", d.kind = STASH_MAP;
    cr_assert_eq(stash_state_get(r, &d, &m), 0);
    fake_now = 1000;
    stash_bytes b1;
    stash_key_set(r, "old", 3);
    cr_assert_eq(stash_value_get(v, &b1), STASH_ENOTFOUND, "left out of the checkpoint");
    stash_key_set(r, "new", 3);
    cr_assert_eq(stash_value_get(v, &b1), 0);
    stash_key_set(r, "mix", 3);
    stash_iter it;
    cr_assert_eq(stash_list_get(l, &it), 0);
    cr_assert_eq(stash_iter_next(&it, NULL, &b1), 1);
    cr_assert(b1.len == 1 && *(const char *)b1.data == 'b', "only the element alive at the cut");
    cr_assert_eq(stash_iter_next(&it, NULL, &b1), 0);
    cr_assert_eq(stash_map_get(m, "a", 1, &b1), STASH_ENOTFOUND);
    cr_assert_eq(stash_map_get(m, "b", 1, &b1), 0);
    stash_worker_close(r);
    stash_arena_close(b);
    stash_arena_destroy(name2, NULL);
    test_remove_dir(dir);
}

static int no_timer(const stash_timer *t, void *ctx)
{
    (void)t, (void)ctx;
    return 0;
}

Test(ttl, an_event_time_ttl_expires_by_the_watermark_not_the_clock)
{
    stash_state *s;
    stash_state_desc d = {.sz = sizeof(stash_state_desc),
                          .name = "et",
                          .kind = STASH_VALUE,
                          .ttl = {.ttl_ms = 100, .time = STASH_TTL_EVENT_TIME}};
    cr_assert_eq(stash_state_get(w, &d, &s), 0, "%s", stash_errmsg());
    stash_timers *t;
    cr_assert_eq(stash_timers_get(w, "wm", &t), 0);
    cr_assert_eq(stash_timers_advance(t, 5000, no_timer, NULL), 0);
    stash_key_set(w, "k", 1);
    cr_assert_eq(stash_value_put(s, "x", 1), 0); /* written at watermark 5000 */
    stash_bytes v;
    fake_now = 1000000; /* the clock moves far: nothing expires by it */
    cr_assert_eq(stash_value_get(s, &v), 0);
    cr_assert_eq(stash_timers_advance(t, 5099, no_timer, NULL), 0);
    cr_assert_eq(stash_value_get(s, &v), 0);
    cr_assert_eq(stash_timers_advance(t, 5100, no_timer, NULL), 0);
    cr_assert_eq(stash_value_get(s, &v), STASH_ENOTFOUND, "expired at 5000 + 100");
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "bad",
                                                     .kind = STASH_VALUE,
                                                     .ttl = {.ttl_ms = 1, .time = 7}},
                                 &s),
                 -EINVAL);
}
