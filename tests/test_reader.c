/* SPDX-License-Identifier: MIT */
/*
 * test_reader.c: readers that are not workers. A reader reads every keyed
 * state kind of any key group as a worker wrote it, writes nothing, joins
 * no barrier and finds only what workers registered; a checkpoint
 * completes with readers attached; a reader walks the keys of any key
 * group, reads as of the newest complete checkpoint or a checkpoint
 * directory alone; a reader in another process never reads a torn value
 * while the owner writes, and one killed with SIGKILL, reading or walking,
 * leaves its slot to the next and never stops the owner. Runs on both
 * backends.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/lmdb/lmdb.h"
#include "tests/helpers.h"

#define KGS 16u

static char name[96];
static stash_arena *arena;
static stash_worker *w;

static void setup(void)
{
    arena = test_arena_create("reader", 32u << 20, KGS, name);
    cr_assert_eq(
        stash_worker_open(
            name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w),
        0, "%s", stash_errmsg());
}

static void teardown(void)
{
    stash_worker_close(w);
    stash_arena_close(arena);
    stash_arena_destroy(name, NULL);
}

TestSuite(reader, .init = setup, .fini = teardown);

static stash_state *state_of(stash_worker *h, const char *n, stash_kind kind)
{
    stash_state *s = NULL;
    int rc = stash_state_get(
        h,
        &(stash_state_desc){
            .sz = sizeof(stash_state_desc), .name = n, .kind = kind, .reduce = NULL},
        &s);
    cr_assert_eq(rc, 0, "%s: %s", n, stash_errmsg());
    return s;
}

static int sum(const stash_bytes *acc, const stash_bytes *in, void *out, size_t cap, size_t *len,
               void *ctx)
{
    (void)ctx;
    if (cap < 8) return *len = 8, -ENOSPC;
    uint64_t a = acc->len ? test_u64(acc->data) : 0;
    a += test_u64(in->data);
    memcpy(out, &a, 8);
    *len = 8;
    return 0;
}

/* Makes the worker's writes visible to other processes: a barrier, which
 * on lmdb commits once LMDB_COMMIT_MS has passed since the last commit. */
static void publish(void)
{
    stash_event ev;
    if (test_backend() == STASH_BACKEND_LMDB) usleep(2 * LMDB_COMMIT_MS * 1000);
    cr_assert_geq(stash_barrier(w, &ev), 0, "%s", stash_errmsg());
}

static stash_worker *open_reader(void)
{
    stash_worker *r;
    int rc = stash_reader_open(name, NULL, &r);
    cr_assert_eq(rc, 0, "reader: %s", stash_errmsg());
    return r;
}

Test(reader, reads_every_keyed_kind_as_the_worker_wrote_it_and_writes_nothing)
{
    stash_state *v = state_of(w, "v", STASH_VALUE), *l = state_of(w, "l", STASH_LIST),
                *m = state_of(w, "m", STASH_MAP), *s, *ops = state_of(w, "ops", STASH_OP_LIST);
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "sum",
                                                     .kind = STASH_REDUCING,
                                                     .reduce = sum},
                                 &s),
                 0);
    (void)ops;
    for (uint64_t k = 0; k < 200; k++) {
        stash_key_set(w, &k, sizeof k);
        uint64_t x = k * 3;
        cr_assert_eq(stash_state_namespace(v, "n", 1), 0);
        cr_assert_eq(stash_value_put(v, &x, sizeof x), 0);
        cr_assert_eq(stash_list_add(l, &k, sizeof k), 0);
        cr_assert_eq(stash_list_add(l, &x, sizeof x), 0);
        cr_assert_eq(stash_map_put(m, "a", 1, &x, sizeof x), 0);
        cr_assert_eq(stash_merging_add(s, &k, sizeof k), 0);
        cr_assert_eq(stash_merging_add(s, &k, sizeof k), 0);
    }
    publish();

    stash_worker *r = open_reader();
    stash_state *rv = state_of(r, "v", STASH_VALUE), *rl = state_of(r, "l", STASH_LIST),
                *rm = state_of(r, "m", STASH_MAP), *rs;
    cr_assert_eq(stash_state_get(r,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "sum",
                                                     .kind = STASH_REDUCING,
                                                     .reduce = sum},
                                 &rs),
                 0);
    cr_assert_eq(stash_state_namespace(rv, "n", 1), 0);
    for (uint64_t k = 0; k < 200; k++) {
        stash_bytes b, key;
        stash_iter it;
        cr_assert_eq(stash_key_set(r, &k, sizeof k), 0);
        cr_assert_eq(stash_value_get(rv, &b), 0, "key %llu: %s", (unsigned long long)k,
                     stash_errmsg());
        cr_assert_eq(test_u64(b.data), k * 3);
        cr_assert_eq(stash_list_get(rl, &it), 0);
        cr_assert_eq(stash_iter_next(&it, NULL, &b), 1);
        cr_assert_eq(test_u64(b.data), k);
        cr_assert_eq(stash_iter_next(&it, NULL, &b), 1);
        cr_assert_eq(test_u64(b.data), k * 3);
        cr_assert_eq(stash_iter_next(&it, NULL, &b), 0);
        cr_assert_eq(stash_map_get(rm, "a", 1, &b), 0);
        cr_assert_eq(test_u64(b.data), k * 3);
        cr_assert_eq(stash_map_iter(rm, &it), 0);
        cr_assert_eq(stash_iter_next(&it, &key, &b), 1);
        cr_assert_eq(key.len, 1u);
        cr_assert_eq(stash_merging_get(rs, &b), 0);
        cr_assert_eq(test_u64(b.data), 2 * k);
    }
    /* It writes nothing and joins no barrier. */
    uint64_t x = 7;
    cr_assert_eq(stash_value_put(rv, &x, sizeof x), STASH_EKEYGROUP);
    cr_assert(strstr(stash_errmsg(), "reader"), "%s", stash_errmsg());
    cr_assert_eq(stash_list_add(rl, &x, sizeof x), STASH_EKEYGROUP);
    cr_assert_eq(stash_map_remove(rm, "a", 1), STASH_EKEYGROUP);
    stash_event ev;
    cr_assert_eq(stash_barrier(r, &ev), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "reader"), "%s", stash_errmsg());
    stash_worker_info info;
    cr_assert_eq(stash_worker_info_get(r, &info), -EINVAL);
    /* The worker's values are as it left them. */
    uint64_t k = 5;
    stash_key_set(w, &k, sizeof k);
    stash_bytes b;
    cr_assert_eq(stash_value_get(v, &b), 0);
    cr_assert_eq(test_u64(b.data), 15u);
    stash_worker_close(r);
}

Test(reader, finds_only_what_workers_registered)
{
    state_of(w, "v", STASH_VALUE);
    stash_worker *r = open_reader();
    stash_state *s;
    cr_assert_eq(stash_state_get(r,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "nope",
                                                     .kind = STASH_VALUE},
                                 &s),
                 STASH_ENOTFOUND);
    cr_assert(strstr(stash_errmsg(), "nope"), "%s", stash_errmsg());
    cr_assert_eq(
        stash_state_get(
            r, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_LIST},
            &s),
        STASH_EKIND);
    cr_assert_eq(stash_state_get(r,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "v",
                                                     .kind = STASH_VALUE,
                                                     .ttl.ttl_ms = 5},
                                 &s),
                 STASH_EKIND);
    cr_assert_eq(
        stash_state_get(
            r,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "o", .kind = STASH_OP_LIST},
            &s),
        -EINVAL);
    stash_timers *t;
    cr_assert_eq(stash_timers_get(r, "t", &t), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "timer"), "%s", stash_errmsg());
    /* Nothing of the reader's asking reached the catalog. */
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "nope", .kind = STASH_LIST},
            &s),
        0, "a worker registers 'nope' with any kind: %s", stash_errmsg());
    /* What the catalog says of a state, for a tool that did not register it. */
    stash_state *ts;
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "t",
                                                     .kind = STASH_MAP,
                                                     .ttl = {.ttl_ms = 5000,
                                                             .update = STASH_TTL_ON_READ_AND_WRITE,
                                                             .time = STASH_TTL_EVENT_TIME}},
                                 &ts),
                 0);
    stash_state_desc d;
    cr_assert_eq(stash_state_describe(stash_worker_arena(r), "t", &d), 0);
    cr_assert_eq(d.kind, STASH_MAP);
    cr_assert_eq(d.ttl.ttl_ms, 5000u);
    cr_assert_eq(d.ttl.update, STASH_TTL_ON_READ_AND_WRITE);
    cr_assert_eq(d.ttl.time, STASH_TTL_EVENT_TIME);
    cr_assert_eq(stash_state_get(r, &d, &s), 0, "a reader takes the state as described: %s",
                 stash_errmsg());
    cr_assert_eq(stash_state_describe(stash_worker_arena(r), "nope2", &d), STASH_ENOTFOUND);
    cr_assert(strstr(stash_errmsg(), "nope2"), "%s", stash_errmsg());
    cr_assert_eq(stash_state_describe(NULL, "t", &d), -EINVAL);
    cr_assert_eq(stash_state_describe(stash_worker_arena(r), "t", NULL), -EINVAL);
    cr_assert_eq(stash_reader_open(NULL, NULL, &r), -EINVAL);
    cr_assert_eq(stash_reader_open(name, NULL, NULL), -EINVAL);
    stash_worker *none;
    cr_assert_eq(stash_reader_open("t-reader-no-such-arena", NULL, &none), -ENOENT);
    stash_worker_close(r);
}

Test(reader, a_checkpoint_completes_with_readers_attached, .timeout = 120)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/stash-test-reader-%d", (int)getpid());
    mkdir(dir, 0700);
    stash_service *svc;
    cr_assert_eq(
        stash_service_start(
            name, &(stash_service_opts){.sz = sizeof(stash_service_opts), .dir = dir}, &svc),
        0, "%s", stash_errmsg());
    stash_state *v = state_of(w, "v", STASH_VALUE);
    uint64_t k = 1;
    stash_key_set(w, &k, sizeof k);
    cr_assert_eq(stash_value_put(v, &k, sizeof k), 0);
    stash_worker *r1 = open_reader(), *r2 = open_reader();
    stash_checkpoint_info info;
    cr_assert_eq(test_checkpoint_at_barriers(arena, &w, 1, &info), 0, "%s", info.detail);
    stash_worker_close(r1);
    stash_worker_close(r2);
    stash_service_stop(svc);
    test_remove_dir(dir);
}

/* Walks key group kg's keys of s with namespace filter ns (NULL: all),
 * marking each key (a uint64_t below 400) in seen and checking its key
 * group; returns how many it met. */
static int walk_kg(stash_state *s, uint32_t kg, const char *ns, int *seen)
{
    stash_iter it;
    int rc = stash_kg_keys_iter(s, kg, ns, ns ? strlen(ns) : 0, &it);
    cr_assert_eq(rc, 0, "key group %u: %s", kg, stash_errmsg());
    stash_bytes key, kns;
    int n = 0;
    while ((rc = stash_iter_next(&it, &key, &kns)) == 1) {
        cr_assert_eq(key.len, 8u);
        uint64_t k = test_u64(key.data);
        cr_assert_lt(k, 400u);
        cr_assert_eq(stash_key_group(key.data, key.len, KGS), kg, "key %llu in key group %u",
                     (unsigned long long)k, kg);
        cr_assert_eq(kns.len, 1u, "its namespace comes with it");
        cr_assert(!ns || memcmp(kns.data, ns, 1) == 0);
        seen[k] += *(const char *)kns.data == 'a' ? 1 : 2;
        n++;
    }
    cr_assert_eq(rc, 0, "%s", stash_errmsg());
    return n;
}

Test(reader, walks_the_keys_of_any_key_group_as_a_copy_taken_at_the_start)
{
    stash_state *v = state_of(w, "v", STASH_VALUE);
    for (uint64_t k = 0; k < 300; k++) {
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_state_namespace(v, "a", 1), 0);
        cr_assert_eq(stash_value_put(v, &k, sizeof k), 0);
        if (k % 3) continue;
        cr_assert_eq(stash_state_namespace(v, "b", 1), 0);
        cr_assert_eq(stash_value_put(v, &k, sizeof k), 0);
    }
    publish();
    stash_worker *r = open_reader();
    stash_state *rv = state_of(r, "v", STASH_VALUE);
    int seen[400] = {0}, owner_seen[400] = {0};
    for (uint32_t kg = 0; kg < KGS; kg++) {
        walk_kg(rv, kg, NULL, seen);
        walk_kg(v, kg, NULL, owner_seen); /* the owner walks its own */
    }
    for (uint64_t k = 0; k < 400; k++) {
        int want = k >= 300 ? 0 : k % 3 ? 1 : 3;
        cr_assert_eq(seen[k], want, "key %llu", (unsigned long long)k);
        cr_assert_eq(owner_seen[k], want, "key %llu", (unsigned long long)k);
    }
    memset(seen, 0, sizeof seen);
    for (uint32_t kg = 0; kg < KGS; kg++) walk_kg(rv, kg, "b", seen);
    for (uint64_t k = 0; k < 400; k++) cr_assert_eq(seen[k], k < 300 && k % 3 == 0 ? 2 : 0);

    /* The copy is taken when the walk starts: what the owner writes after
     * is not in it. */
    uint64_t k0 = 0;
    uint32_t kg0 = stash_key_group(&k0, sizeof k0, KGS);
    stash_iter it;
    cr_assert_eq(stash_kg_keys_iter(rv, kg0, "a", 1, &it), 0);
    for (uint64_t k = 0; k < 400; k++) {
        if (stash_key_group(&k, sizeof k, KGS) != kg0) continue;
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_state_namespace(v, "a", 1), 0);
        cr_assert_eq(k < 300 ? stash_state_clear(v) : stash_value_put(v, &k, sizeof k), 0);
    }
    publish();
    int before = 0;
    stash_bytes key;
    while (stash_iter_next(&it, &key, NULL) == 1) {
        cr_assert_lt(test_u64(key.data), 300u, "a key written after the walk started");
        before++;
    }
    cr_assert_gt(before, 0);
    memset(seen, 0, sizeof seen);
    walk_kg(rv, kg0, "a", seen);
    for (uint64_t k = 0; k < 400; k++)
        if (stash_key_group(&k, sizeof k, KGS) == kg0) cr_assert_eq(seen[k], k >= 300 ? 1 : 0);

    /* A newer walk of the same handle takes the copy over. */
    stash_iter first, second;
    cr_assert_eq(stash_kg_keys_iter(rv, 1, NULL, 0, &first), 0);
    cr_assert_eq(stash_kg_keys_iter(rv, 2, NULL, 0, &second), 0);
    cr_assert_eq(stash_iter_next(&first, NULL, NULL), STASH_ESTALE);
    cr_assert_eq(stash_kg_keys_iter(rv, KGS, NULL, 0, &it), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "key group 16"), "%s", stash_errmsg());
    cr_assert_eq(stash_kg_keys_iter(NULL, 0, NULL, 0, &it), -EINVAL);
    cr_assert_eq(stash_kg_keys_iter(rv, 0, NULL, 0, NULL), -EINVAL);
    cr_assert_eq(stash_kg_keys_iter(rv, 0, NULL, 2, &it), -EINVAL);
    stash_worker_close(r);
}

Test(reader, a_worker_walks_only_the_key_groups_it_owns)
{
    stash_worker_close(w);
    w = NULL;
    stash_worker *w0, *w1;
    cr_assert_eq(
        stash_worker_open(
            name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 2}, &w0),
        0);
    cr_assert_eq(
        stash_worker_open(
            name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 1, .parallelism = 2},
            &w1),
        0);
    stash_state *v = state_of(w0, "v", STASH_VALUE);
    stash_iter it;
    cr_assert_eq(stash_kg_keys_iter(v, 0, NULL, 0, &it), 0);
    cr_assert_eq(stash_iter_next(&it, NULL, NULL), 0);
    cr_assert_eq(stash_kg_keys_iter(v, KGS - 1, NULL, 0, &it), STASH_EKEYGROUP);
    cr_assert(strstr(stash_errmsg(), "reader"), "%s", stash_errmsg());
    cr_assert_eq(stash_iter_next(&it, NULL, NULL), -EINVAL, "a refused start leaves no iterator");
    stash_worker_close(w1);
    stash_worker_close(w0);
}

/* ------------------------------------------------------------------------ */
/* Reading a checkpoint.                                                     */

static uint64_t read_value(stash_worker *r, uint64_t k)
{
    stash_state *s = state_of(r, "v", STASH_VALUE);
    stash_bytes b;
    cr_assert_eq(stash_key_set(r, &k, sizeof k), 0);
    int rc = stash_value_get(s, &b);
    cr_assert_eq(rc, 0, "key %llu: %s", (unsigned long long)k, stash_errmsg());
    return test_u64(b.data);
}

Test(reader, reads_as_of_the_newest_complete_checkpoint_or_a_checkpoint_directory, .timeout = 120)
{
    char dir[128], chk[192], path[256];
    snprintf(dir, sizeof dir, "/tmp/stash-test-reader-chk-%d", (int)getpid());
    mkdir(dir, 0700);
    stash_worker *r;
    cr_assert_eq(
        stash_reader_open(
            name, &(stash_reader_opts){.sz = sizeof(stash_reader_opts), .at_checkpoint = 1}, &r),
        STASH_ENOSERVICE, "no service has written checkpoints");
    stash_service *svc;
    cr_assert_eq(
        stash_service_start(
            name,
            &(stash_service_opts){.sz = sizeof(stash_service_opts), .dir = dir, .incremental = 1},
            &svc),
        0, "%s", stash_errmsg());
    cr_assert_eq(
        stash_reader_open(
            name, &(stash_reader_opts){.sz = sizeof(stash_reader_opts), .at_checkpoint = 1}, &r),
        -ENOENT, "no checkpoint is complete yet");
    stash_state *v = state_of(w, "v", STASH_VALUE);
    stash_checkpoint_info info;
    for (uint64_t round = 1; round <= 3; round++) {
        for (uint64_t k = 0; k < 100; k++) {
            stash_key_set(w, &k, sizeof k);
            uint64_t x = k * 10 + round;
            cr_assert_eq(stash_value_put(v, &x, sizeof x), 0);
        }
        if (round < 3) cr_assert_eq(test_checkpoint_at_barriers(arena, &w, 1, &info), 0);
    }
    publish();
    stash_worker *live = open_reader(), *pinned;
    cr_assert_eq(
        stash_reader_open(name,
                          &(stash_reader_opts){.sz = sizeof(stash_reader_opts), .at_checkpoint = 1},
                          &pinned),
        0, "%s", stash_errmsg());
    /* The checkpoint directory alone, without an arena. */
    uint64_t id = info.id;
    snprintf(chk, sizeof chk, "%s/chk-%llu", dir, (unsigned long long)id);
    stash_worker *offline;
    cr_assert_eq(stash_reader_open(
                     NULL,
                     &(stash_reader_opts){.sz = sizeof(stash_reader_opts), .checkpoint_dir = chk},
                     &offline),
                 0, "%s", stash_errmsg());
    for (uint64_t k = 0; k < 100; k++) {
        cr_assert_eq(read_value(live, k), k * 10 + 3);
        cr_assert_eq(read_value(pinned, k), k * 10 + 2, "as of checkpoint %llu",
                     (unsigned long long)info.id);
        cr_assert_eq(read_value(offline, k), k * 10 + 2);
    }
    /* The view stays as it was while the arena goes on, and is no file. */
    cr_assert_eq(test_checkpoint_at_barriers(arena, &w, 1, &info), 0);
    cr_assert_eq(read_value(pinned, 7), 72u);
    stash_arena_info ai;
    stash_arena_info_get(stash_worker_arena(offline), &ai);
    cr_assert_eq(access(ai.path, F_OK), -1, "%s is removed once mapped", ai.path);
    stash_state *ov = state_of(offline, "v", STASH_VALUE);
    uint64_t k = 1;
    stash_key_set(offline, &k, sizeof k);
    cr_assert_eq(stash_value_put(ov, &k, sizeof k), STASH_EKEYGROUP);
    int n = 0;
    for (uint32_t kg = 0; kg < KGS; kg++) {
        stash_iter it;
        cr_assert_eq(stash_kg_keys_iter(ov, kg, NULL, 0, &it), 0, "%s", stash_errmsg());
        while (stash_iter_next(&it, NULL, NULL) == 1) n++;
    }
    cr_assert_eq(n, 100, "the view's key groups hold every key");
    stash_worker_close(offline);
    stash_worker_close(pinned);
    stash_worker_close(live);

    /* A damaged checkpoint is refused, naming the file: the delta it wrote. */
    snprintf(path, sizeof path, "%s/shared/%llu.dat", dir, (unsigned long long)id);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    {
        cr_assert_eq(truncate(path, st.st_size / 2), 0);
        int rc = stash_reader_open(
            NULL, &(stash_reader_opts){.sz = sizeof(stash_reader_opts), .checkpoint_dir = chk},
            &offline);
        cr_assert(rc == STASH_ECORRUPT || rc == STASH_ETRUNCATED, "rc %d: %s", rc, stash_errmsg());
        char file[32];
        snprintf(file, sizeof file, "shared/%llu.dat", (unsigned long long)id);
        cr_assert(strstr(stash_errmsg(), file) && strstr(stash_errmsg(), "offset"), "%s",
                  stash_errmsg());
    }
    cr_assert_eq(stash_reader_open(NULL,
                                   &(stash_reader_opts){.sz = sizeof(stash_reader_opts),
                                                        .checkpoint_dir = "/nonexistent"},
                                   &offline),
                 -ENOENT, "%s", stash_errmsg());
    cr_assert(strstr(stash_errmsg(), "/nonexistent"), "%s", stash_errmsg());
    stash_service_stop(svc);
    test_remove_dir(dir);
}

/* ------------------------------------------------------------------------ */
/* Another process.                                                          */

typedef struct watch_args {
    const char *name;
    int ready[2];
} watch_args;

/* A child's reader of arena name and its handle on the value state "v";
 * NULL if either fails. */
static stash_state *child_reader(const char *arena_name, stash_worker **r)
{
    stash_state *v;
    if (stash_reader_open(arena_name, NULL, r)) return NULL;
    if (stash_state_get(
            *r,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &v))
        return NULL;
    return v;
}

/* Reads every key over and over; exits 3 on a torn value. */
static int watch(void *arg)
{
    watch_args *a = arg;
    stash_worker *r;
    stash_state *v = child_reader(a->name, &r);
    if (!v) return 2;
    bool told = false;
    for (;;)
        for (uint32_t k = 0; k < 500; k++) {
            stash_key_set(r, &k, sizeof k);
            stash_bytes b;
            if (stash_value_get(v, &b) != 0) continue;
            if (!test_sealed(b.data, b.len)) return 3;
            if (!told && write(a->ready[1], "x", 1) == 1) told = true;
        }
}

Test(reader, another_process_reads_whole_values_while_the_owner_writes_and_dies_without_a_trace,
     .timeout = 120)
{
    stash_state *v = state_of(w, "v", STASH_VALUE);
    static uint8_t buf[600];
    for (uint32_t k = 0; k < 500; k++) {
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_put(v, buf, test_seal(buf, 24 + k % 500, k)), 0);
    }
    publish();
    stash_event ev;
    watch_args a = {.name = name};
    cr_assert_eq(pipe(a.ready), 0);
    for (int round = 0; round < 3; round++) {
        pid_t pid = test_fork(watch, &a);
        char c;
        cr_assert_eq(read(a.ready[0], &c, 1), 1, "the reader read a value");
        for (uint64_t i = 0; i < 20000; i++) {
            uint32_t k = (uint32_t)(i * 7919 % 500);
            stash_key_set(w, &k, sizeof k);
            cr_assert_eq(stash_value_put(v, buf, test_seal(buf, 24 + (i * 13) % 570, i)), 0);
            if (i % 1000 == 0) cr_assert_geq(stash_barrier(w, &ev), 0);
        }
        kill(pid, SIGKILL);
        cr_assert_eq(test_wait(pid), 128 + SIGKILL, "the reader never read a torn value");
    }
    /* The dead readers' slots are free again: every slot opens. */
    stash_worker *r[8];
    for (int i = 0; i < 8; i++) {
        int rc = stash_reader_open(name, NULL, &r[i]);
        cr_assert_eq(rc, 0, "reader %d: %s", i, stash_errmsg());
    }
    stash_worker *one_more;
    cr_assert_eq(stash_reader_open(name, NULL, &one_more), STASH_EBUSY);
    for (int i = 0; i < 8; i++) stash_worker_close(r[i]);
}

/* Walks every key group's keys over and over. */
static int scan_forever(void *arg)
{
    watch_args *a = arg;
    stash_worker *r;
    stash_state *v = child_reader(a->name, &r);
    if (!v) return 2;
    bool told = false;
    for (;;)
        for (uint32_t kg = 0; kg < KGS; kg++) {
            stash_iter it;
            if (stash_kg_keys_iter(v, kg, NULL, 0, &it)) return 3;
            if (!told && write(a->ready[1], "x", 1) == 1) told = true;
        }
}

Test(reader, a_reader_killed_in_the_middle_of_walks_never_stops_the_owner, .timeout = 120)
{
    stash_state *v = state_of(w, "v", STASH_VALUE);
    for (uint64_t k = 0; k < 20000; k++) {
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_put(v, &k, sizeof k), 0);
    }
    publish();
    watch_args a = {.name = name};
    cr_assert_eq(pipe(a.ready), 0);
    uint64_t next = 20000;
    for (int round = 0; round < 3; round++) {
        pid_t pid = test_fork(scan_forever, &a);
        char c;
        cr_assert_eq(read(a.ready[0], &c, 1), 1, "the reader walked a key group");
        /* The owner rewrites its keys and adds as many, growing and moving
         * its indexes, while the walks go on. */
        for (uint64_t i = 0; i < 40000; i++) {
            uint64_t k = i % 2 ? next++ : i / 2, x = k + (uint64_t)round;
            stash_key_set(w, &k, sizeof k);
            cr_assert_eq(stash_value_put(v, &x, sizeof x), 0, "%s", stash_errmsg());
        }
        kill(pid, SIGKILL);
        cr_assert_eq(test_wait(pid), 128 + SIGKILL);
    }
    /* The dead readers' walks hold nothing back: a reader sees every key
     * the owner wrote, as it wrote it. */
    publish();
    stash_worker *r = open_reader();
    stash_state *rv = state_of(r, "v", STASH_VALUE);
    uint64_t n = 0;
    for (uint32_t kg = 0; kg < KGS; kg++) {
        stash_iter it;
        stash_bytes key;
        cr_assert_eq(stash_kg_keys_iter(rv, kg, NULL, 0, &it), 0, "%s", stash_errmsg());
        while (stash_iter_next(&it, &key, NULL) == 1) n++;
    }
    cr_assert_eq(n, next);
    cr_assert_eq(read_value(r, 5), 7u);
    cr_assert_eq(read_value(r, next - 1), next + 1);
    stash_worker_close(r);
}
