/* SPDX-License-Identifier: MIT */
/*
 * test_reader.c: readers that are not workers. A reader reads every keyed
 * state kind of any key group as a worker wrote it, writes nothing, joins
 * no barrier and finds only what workers registered; a checkpoint
 * completes with readers attached; a reader in another process never reads
 * a torn value while the owner writes, and one killed with SIGKILL leaves
 * its slot to the next. Runs on both backends.
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
    cr_assert_eq(stash_worker_open(name, &(stash_worker_opts){.parallelism = 1}, &w), 0, "%s",
                 stash_errmsg());
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
    int rc = stash_state_get(h, &(stash_state_desc){.name = n, .kind = kind, .reduce = NULL}, &s);
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
    cr_assert_eq(
        stash_state_get(
            w, &(stash_state_desc){.name = "sum", .kind = STASH_REDUCING, .reduce = sum}, &s),
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
    cr_assert_eq(
        stash_state_get(
            r, &(stash_state_desc){.name = "sum", .kind = STASH_REDUCING, .reduce = sum}, &rs),
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
    cr_assert_eq(stash_state_get(r, &(stash_state_desc){.name = "nope", .kind = STASH_VALUE}, &s),
                 STASH_ENOTFOUND);
    cr_assert(strstr(stash_errmsg(), "nope"), "%s", stash_errmsg());
    cr_assert_eq(stash_state_get(r, &(stash_state_desc){.name = "v", .kind = STASH_LIST}, &s),
                 STASH_EKIND);
    cr_assert_eq(stash_state_get(
                     r, &(stash_state_desc){.name = "v", .kind = STASH_VALUE, .ttl.ttl_ms = 5}, &s),
                 STASH_EKIND);
    cr_assert_eq(stash_state_get(r, &(stash_state_desc){.name = "o", .kind = STASH_OP_LIST}, &s),
                 -EINVAL);
    stash_timers *t;
    cr_assert_eq(stash_timers_get(r, "t", &t), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "timer"), "%s", stash_errmsg());
    /* Nothing of the reader's asking reached the catalog. */
    cr_assert_eq(stash_state_get(w, &(stash_state_desc){.name = "nope", .kind = STASH_LIST}, &s), 0,
                 "a worker registers 'nope' with any kind: %s", stash_errmsg());
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
    cr_assert_eq(stash_service_start(name, &(stash_service_opts){.dir = dir}, &svc), 0, "%s",
                 stash_errmsg());
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

/* ------------------------------------------------------------------------ */
/* Another process.                                                          */

typedef struct watch_args {
    const char *name;
    int ready[2];
} watch_args;

/* Reads every key over and over; exits 3 on a torn value. */
static int watch(void *arg)
{
    watch_args *a = arg;
    stash_worker *r;
    if (stash_reader_open(a->name, NULL, &r)) return 1;
    stash_state *v;
    if (stash_state_get(r, &(stash_state_desc){.name = "v", .kind = STASH_VALUE}, &v)) return 2;
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
