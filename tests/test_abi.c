/* SPDX-License-Identifier: MIT */
/*
 * test_abi.c: the size every options struct carries (include/stash.h, "A
 * stable ABI"). A struct without its size is refused naming it; an older
 * program's smaller struct reads the members it lacks as zero; a newer
 * program's larger one is taken when what it adds is zero and refused,
 * naming the byte, when it is not.
 */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/helpers.h"

static char name[96];
static stash_arena *arena;
static stash_worker *w;

static void setup(void)
{
    arena = test_arena_create("abi", 0, 8, name);
    cr_assert_eq(
        stash_worker_open(
            name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 2}, &w),
        0, "%s", stash_errmsg());
}

static void teardown(void)
{
    stash_worker_close(w);
    stash_arena_close(arena);
    stash_arena_destroy(name, NULL);
}

TestSuite(abi, .init = setup, .fini = teardown);

/* rc is -EINVAL and stash_errmsg() names the struct and its sz. */
static void refused(int rc, const char *type)
{
    char want[96];
    snprintf(want, sizeof want, "%s.sz is 0", type);
    cr_assert_eq(rc, -EINVAL, "%s without its size: %d", type, rc);
    cr_assert(strstr(stash_errmsg(), want), "'%s' names %s", stash_errmsg(), want);
}

static int produce(const stash_bytes *acc, void *out, size_t cap, size_t *len, void *ctx)
{
    (void)acc, (void)out, (void)cap, (void)ctx;
    *len = 0;
    return 0;
}

static int combine(const stash_bytes *acc, const stash_bytes *in, void *out, size_t cap,
                   size_t *len, void *ctx)
{
    (void)acc, (void)in, (void)out, (void)cap, (void)ctx;
    *len = 0;
    return 0;
}

Test(abi, every_struct_without_its_size_is_refused_naming_it)
{
    stash_arena *a = NULL;
    refused(stash_arena_create("abi-none", &(stash_arena_opts){.size = 1u << 20}, &a),
            "stash_arena_opts");
    refused(stash_arena_open(name, &(stash_arena_opts){0}, &a), "stash_arena_opts");
    refused(stash_arena_destroy(name, &(stash_arena_opts){0}), "stash_arena_opts");
    cr_assert_null(a);
    stash_worker *other = NULL;
    refused(stash_worker_open(name, &(stash_worker_opts){.index = 1, .parallelism = 2}, &other),
            "stash_worker_opts");
    refused(stash_worker_open(name,
                              &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                   .arena = &(stash_arena_opts){0}},
                              &other),
            "stash_arena_opts");
    refused(stash_reader_open(name, &(stash_reader_opts){0}, &other), "stash_reader_opts");
    cr_assert_null(other);

    stash_state *s = NULL;
    refused(stash_state_get(w, &(stash_state_desc){.name = "v", .kind = STASH_VALUE}, &s),
            "stash_state_desc");
    stash_aggregate_fns fns = {.create = produce, .add = combine, .result = produce};
    refused(stash_state_get(w,
                            &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                .name = "agg",
                                                .kind = STASH_AGGREGATING,
                                                .aggregate = &fns},
                            &s),
            "stash_aggregate_fns");
    cr_assert_null(s);
    stash_batch *b = NULL;
    refused(stash_batch_create(w, &(stash_batch_opts){.capacity = 8}, &b), "stash_batch_opts");
    cr_assert_null(b);
    stash_service *svc = NULL;
    refused(stash_service_start(name, &(stash_service_opts){.dir = "/tmp"}, &svc),
            "stash_service_opts");
    refused(stash_service_start(name,
                                &(stash_service_opts){.sz = sizeof(stash_service_opts),
                                                      .dir = "/tmp",
                                                      .storage_url = "s3://bucket/job",
                                                      .storage_opts = &(stash_storage_opts){0}},
                                &svc),
            "stash_storage_opts");
    cr_assert_null(svc);

    char dir[96], path[128];
    snprintf(dir, sizeof dir, "/tmp/stash-test-abi-%d", (int)getpid());
    test_remove_dir(dir);
    cr_assert_eq(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/sp", dir);
    stash_snapshot_writer *sw = NULL;
    refused(stash_snapshot_writer_open(path, &(stash_snapshot_writer_opts){.id = 2}, &sw),
            "stash_snapshot_writer_opts");
    cr_assert_eq(stash_snapshot_writer_open(path, NULL, &sw), 0, "%s", stash_errmsg());
    refused(stash_snapshot_writer_state(sw, &(stash_state_desc){.name = "v", .kind = STASH_VALUE}),
            "stash_state_desc");
    cr_assert_eq(stash_snapshot_writer_commit(sw, NULL), 0, "%s", stash_errmsg());
    stash_snapshot *snap;
    cr_assert_eq(stash_snapshot_open(path, &snap), 0, "%s", stash_errmsg());
    snprintf(path, sizeof path, "%s/copy", dir);
    refused(stash_snapshot_rewrite(snap, path, &(stash_snapshot_rewrite_opts){.id = 3}, NULL),
            "stash_snapshot_rewrite_opts");
    cr_assert_eq(access(path, F_OK), -1, "a refused rewrite writes nothing");
    stash_snapshot_close(snap);
    test_remove_dir(dir);
}

Test(abi, an_older_programs_smaller_struct_reads_what_it_lacks_as_zero)
{
    /* Built when the worker's options ended before rollback: the bytes
     * after its size are not its, whatever they hold. */
    stash_worker_opts o = {
        .sz = offsetof(stash_worker_opts, rollback), .index = 1, .parallelism = 2, .rollback = 1};
    stash_worker *other;
    cr_assert_eq(stash_worker_open(name, &o, &other), 0,
                 "rollback past the size is not read (it would need a service): %s",
                 stash_errmsg());
    stash_worker_info info;
    cr_assert_eq(stash_worker_info_get(other, &info), 0);
    cr_assert_eq(info.index, 1u);
    stash_worker_close(other);

    stash_batch *b;
    cr_assert_eq(
        stash_batch_create(
            w, &(stash_batch_opts){.sz = offsetof(stash_batch_opts, states), .capacity = 8}, &b),
        0, "%s", stash_errmsg());
    stash_batch_destroy(b);
}

/* A worker's options as a later release might have them: one more member. */
typedef struct newer_worker_opts {
    stash_worker_opts o;
    uint64_t added;
} newer_worker_opts;

Test(abi, a_newer_programs_larger_struct_is_taken_only_if_what_it_adds_is_zero)
{
    newer_worker_opts n = {.o = {.sz = sizeof n, .index = 1, .parallelism = 2}};
    stash_worker *other = NULL;
    cr_assert_eq(stash_worker_open(name, &n.o, &other), 0, "%s", stash_errmsg());
    stash_worker_close(other);
    other = NULL;

    n.added = 1;
    cr_assert_eq(stash_worker_open(name, &n.o, &other), -EINVAL);
    cr_assert_null(other);
    char want[64];
    snprintf(want, sizeof want, "sets byte %zu", offsetof(newer_worker_opts, added));
    cr_assert(strstr(stash_errmsg(), "stash_worker_opts") && strstr(stash_errmsg(), want),
              "'%s' names the struct and the byte", stash_errmsg());
}
