/* SPDX-License-Identifier: MIT */
/*
 * test_rados.c: checkpoint files as RADOS objects (backends/checkpoint/
 * rados.c) against a real single-node Ceph cluster (one monitor, one OSD
 * on bluestore in a sparse file, so that it keeps its data when it
 * restarts) that each test starts on a port of its own and stops:
 * striped files round-trip, a pointer moves only from the value it holds,
 * listing by prefix, a cluster whose OSD is down fails calls within their
 * timeout instead of hanging them, and a full pool says so at once.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/checkpoint/checkpoints.h"
#include "include/stash.h"
#include "tests/helpers.h"

static const char *const dir = test_ceph_dir, *const conf = test_ceph_conf;

/* Runs tests/ceph/cluster.sh with args; returns its exit code. */
TestSuite(rados, .init = test_ceph_start, .fini = test_ceph_stop, .timeout = 180);

static ckpt_rados *connect_to(const char *pool, uint32_t timeout_ms)
{
    ckpt_rados *r;
    cr_assert_eq(ckpt_rados_open(
                     &(ckpt_rados_opts){.conf = conf, .pool = pool, .timeout_ms = timeout_ms}, &r),
                 0, "%s", stash_errmsg());
    return r;
}

static int count_name(void *ctx, const char *name)
{
    (void)name;
    (*(unsigned *)ctx)++;
    return 0;
}

static unsigned count_prefix(ckpt_rados *r, const char *prefix)
{
    unsigned n = 0;
    cr_assert_eq(ckpt_rados_list(r, prefix, count_name, &n), 0, "%s", stash_errmsg());
    return n;
}

/* The objects under prefix once retention, which follows a checkpoint's
 * completion, has left want of them (or ten seconds passed). */
static unsigned retained(ckpt_rados *r, const char *prefix, unsigned want)
{
    unsigned n = count_prefix(r, prefix);
    for (int tries = 0; n != want && tries < 200; tries++) {
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
        n = count_prefix(r, prefix);
    }
    return n;
}

Test(rados, files_pointers_and_listing)
{
    ckpt_rados *r = connect_to("stash", 0);
    cr_assert_str_eq(ckpt_rados_pool(r), "stash");
    /* Three stripes, the last of one byte, with their bytes in place. */
    size_t len = 2 * CKPT_RADOS_STRIPE + 1;
    uint8_t *data = malloc(len);
    for (size_t i = 0; i < len; i++) data[i] = (uint8_t)(i * 131 + i / 4096);
    cr_assert_eq(ckpt_rados_write_file(r, "job/chk-1/kg-data.dat", data, len), 0, "%s",
                 stash_errmsg());
    uint8_t *back;
    size_t got;
    cr_assert_eq(ckpt_rados_read_file(r, "job/chk-1/kg-data.dat", len, &back, &got), 0, "%s",
                 stash_errmsg());
    cr_assert_eq(got, len);
    cr_assert_eq(memcmp(back, data, len), 0, "the bytes read are the bytes written");
    free(back);
    cr_assert_eq(count_prefix(r, "job/chk-1/kg-data.dat."), 3, "a stripe an object");
    cr_assert_eq(ckpt_rados_read_file(r, "job/chk-1/kg-data.dat", len - 1, &back, &got), -EFBIG);
    /* An empty file, and one that is not there. */
    cr_assert_eq(ckpt_rados_write_file(r, "job/chk-1/_metadata", "", 0), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_rados_read_file(r, "job/chk-1/_metadata", 16, &back, &got), 0);
    cr_assert_eq(got, 0);
    free(back);
    cr_assert_eq(ckpt_rados_read_file(r, "job/chk-2/_metadata", 16, &back, &got), -ENOENT);
    cr_assert(strstr(stash_errmsg(), "rados://stash/job/chk-2/_metadata"), "%s", stash_errmsg());
    /* A stripe lost is damage, named. */
    cr_assert_eq(ckpt_rados_write_file(r, "job/lost", data, len), 0);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "timeout 20 rados -c %s -p stash rm job/lost.1", conf);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    cr_assert_eq(ckpt_rados_read_file(r, "job/lost", len, &back, &got), STASH_ECORRUPT);
    cr_assert(strstr(stash_errmsg(), "job/lost.1"), "%s", stash_errmsg());
    ckpt_rados *other = connect_to("stash", 0);
    /* Removal takes every stripe. */
    cr_assert_eq(ckpt_rados_remove_file(r, "job/chk-1/kg-data.dat"), 0, "%s", stash_errmsg());
    cr_assert_eq(count_prefix(r, "job/chk-1/kg-data.dat."), 0);
    cr_assert_eq(ckpt_rados_remove_file(r, "job/chk-1/kg-data.dat"), 0, "absent: no error");
    cr_assert_eq(count_prefix(r, "job/"), 3, "_metadata.0, lost.0 and lost.2");
    /* The pointer moves only from what it holds. */
    char buf[64];
    cr_assert_eq(ckpt_rados_pointer(r, "job/latest", buf, sizeof buf), -ENOENT);
    cr_assert_eq(ckpt_rados_swap(r, "job/latest", NULL, "1"), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_rados_swap(other, "job/latest", NULL, "9"), -ECANCELED, "exists");
    cr_assert_eq(ckpt_rados_swap(r, "job/latest", "1", "2"), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_rados_swap(other, "job/latest", "1", "3"), -ECANCELED,
                 "a stale writer cannot move it back");
    cr_assert_eq(ckpt_rados_swap(other, "job/latest", "", "3"), -ECANCELED);
    cr_assert_eq(ckpt_rados_swap(other, "job/none", "1", "3"), -ECANCELED);
    cr_assert_eq(ckpt_rados_pointer(other, "job/latest", buf, sizeof buf), 0);
    cr_assert_str_eq(buf, "2");
    cr_assert_eq(ckpt_rados_swap(other, "job/latest", "2", "12"), 0);
    cr_assert_eq(ckpt_rados_pointer(r, "job/latest", buf, sizeof buf), 0);
    cr_assert_str_eq(buf, "12");
    ckpt_rados_close(other);
    ckpt_rados_close(r);
    free(data);
    ckpt_rados_close(NULL);
}

Test(rados, calls_fail_within_their_timeout_while_the_osd_is_down)
{
    ckpt_rados *r = connect_to("stash", 2000);
    cr_assert_eq(ckpt_rados_write_file(r, "job/before", "x", 1), 0, "%s", stash_errmsg());
    cr_assert_eq(test_ceph("osd-stop"), 0);
    /* It returns (an unbounded call would wait for the OSD forever). */
    int rc = ckpt_rados_write_file(r, "job/during", "y", 1);
    cr_assert_eq(rc, -ETIMEDOUT, "%d: %s", rc, stash_errmsg());
    cr_assert(strstr(stash_errmsg(), "rados://stash/job/during"), "%s", stash_errmsg());
    char buf[16];
    cr_assert_eq(ckpt_rados_pointer(r, "job/latest", buf, sizeof buf), -ETIMEDOUT);
    /* Back, the next calls work, and what was there before still is. */
    cr_assert_eq(test_ceph("osd-start"), 0);
    rc = -ETIMEDOUT;
    for (int tries = 0; rc == -ETIMEDOUT && tries < 30; tries++)
        rc = ckpt_rados_write_file(r, "job/after", "z", 1);
    cr_assert_eq(rc, 0, "%s", stash_errmsg());
    uint8_t *back;
    size_t got;
    cr_assert_eq(ckpt_rados_read_file(r, "job/before", 16, &back, &got), 0, "%s", stash_errmsg());
    cr_assert(got == 1 && back[0] == 'x');
    free(back);
    ckpt_rados_close(r);
    /* No cluster where the conf points, and a pool that is not there. */
    ckpt_rados *none;
    cr_assert_eq(ckpt_rados_open(&(ckpt_rados_opts){.conf = conf, .pool = "nosuch"}, &none),
                 -ENOENT);
    cr_assert(strstr(stash_errmsg(), "rados://nosuch"), "%s", stash_errmsg());
    cr_assert_eq(test_ceph("stop"), 0);
    cr_assert_eq(ckpt_rados_open(
                     &(ckpt_rados_opts){.conf = conf, .pool = "stash", .timeout_ms = 1000}, &none),
                 -ETIMEDOUT, "%s", stash_errmsg());
    cr_assert(strstr(stash_errmsg(), conf), "%s", stash_errmsg());
    cr_assert_eq(ckpt_rados_open(&(ckpt_rados_opts){.conf = conf}, &none), -EINVAL);
}

/* Puts value k * mult for every key k < n in state v of the job's worker. */
static void put_all(stash_worker *w, uint64_t n, uint64_t mult)
{
    stash_state *v;
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &v),
        0);
    for (uint64_t k = 0; k < n; k++) {
        uint64_t x = k * mult;
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_put(v, &x, sizeof x), 0);
    }
}

/* Asserts value k * mult for every key k < n in state v of the worker. */
static void check_all(stash_worker *w, uint64_t n, uint64_t mult)
{
    stash_state *v;
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &v),
        0);
    for (uint64_t k = 0; k < n; k++) {
        stash_bytes b;
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_get(v, &b), 0, "key %llu", (unsigned long long)k);
        cr_assert_eq(test_u64(b.data), k * mult, "key %llu", (unsigned long long)k);
    }
}

static uint64_t latest_of(const char *job)
{
    ckpt_rados *r = connect_to("stash", 0);
    uint64_t id = 0;
    cr_assert_eq(ckpt_rados_latest(r, job, &id), 0, "%s", stash_errmsg());
    ckpt_rados_close(r);
    return id;
}

/* The machine lost: the worker, the service, the arena and the local
 * copies of its checkpoints gone; the pool holds what is left. */
static void lose_all(const char *name, stash_arena *a, stash_worker *w, stash_service *svc,
                     const char *local)
{
    stash_worker_close(w);
    stash_service_stop(svc);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    test_remove_dir(local);
}

/* A service's options for the rados storage of job, its copy in local. */
static stash_service_opts rados_opts(const char *local, const char *job)
{
    return (stash_service_opts){.sz = sizeof(stash_service_opts),
                                .storage = STASH_STORAGE_RADOS,
                                .dir = local,
                                .pool = "stash",
                                .ceph_conf = conf,
                                .job = job,
                                .ceph_timeout_ms = 2000};
}

Test(rados, a_service_checkpoints_into_the_pool_and_a_lost_arena_comes_back_from_it)
{
    char name[96], local[256];
    snprintf(local, sizeof local, "%s/local", dir);
    stash_arena *a = test_arena_create("rados", 16u << 20, 32, name);
    stash_service_opts so = rados_opts(local, "wordcount");
    so.retain = 2;
    stash_service *svc;
    cr_assert_eq(stash_service_start(name, &so, &svc), 0, "%s", stash_errmsg());
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    stash_checkpoint_info info;
    for (uint64_t mult = 1; mult <= 3; mult++) {
        put_all(w, 1000, mult);
        cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
    }
    uint64_t third = info.id;
    cr_assert_eq(latest_of("wordcount"), third, "the pointer names the newest");
    ckpt_rados *r = connect_to("stash", 0);
    cr_assert_eq(retained(r, "wordcount/chk-", 6), 6,
                 "two kept, each its claim, metadata and data");
    /* The OSD down: the checkpoint fails, the pointer stays, nothing is
     * left of it locally; back up, the next one completes. */
    cr_assert_eq(test_ceph("osd-stop"), 0);
    put_all(w, 1000, 4);
    cr_assert_neq(test_checkpoint_at_barriers(a, &w, 1, &info), 0);
    cr_assert(strstr(info.detail, "RADOS"), "%s", info.detail);
    char failed[300];
    snprintf(failed, sizeof failed, "%s/chk-%llu", local, (unsigned long long)info.id);
    cr_assert_eq(access(failed, F_OK), -1, "%s left", failed);
    cr_assert_eq(test_ceph("osd-start"), 0);
    int rc = -1;
    for (int tries = 0; rc != 0 && tries < 30; tries++)
        rc = test_checkpoint_at_barriers(a, &w, 1, &info);
    cr_assert_eq(rc, 0, "%s", info.detail);
    cr_assert_eq(latest_of("wordcount"), info.id);
    cr_assert_gt(info.id, third);
    /* A worker's replacement rolls its key groups back to the newest
     * checkpoint in the pool (from the directory's copy of it). */
    put_all(w, 1000, 5);
    stash_worker_close(w);
    cr_assert_eq(
        stash_worker_open(name,
                          &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .rollback = 1}, &w),
        0, "%s", stash_errmsg());
    check_all(w, 1000, 4);
    /* The arena and its local copies lost: a new one comes back from RADOS. */
    lose_all(name, a, w, svc, local);
    cr_assert_eq(stash_service_start(name, &so, &svc), 0, "%s", stash_errmsg());
    /* At another parallelism: three workers, each finding its own keys. */
    unsigned found = 0;
    for (uint32_t i = 0; i < 3; i++) {
        cr_assert_eq(
            stash_worker_open(
                name,
                &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = i, .parallelism = 3},
                &w),
            0, "%s", stash_errmsg());
        stash_state *v;
        cr_assert_eq(stash_state_get(w,
                                     &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                         .name = "v",
                                                         .kind = STASH_VALUE},
                                     &v),
                     0);
        stash_worker_info me;
        stash_worker_info_get(w, &me);
        for (uint64_t k = 0; k < 1000; k++) {
            stash_bytes b;
            stash_key_set(w, &k, sizeof k);
            if (!stash_kg_range_contains(me.range, (uint32_t)stash_key_group_current(w))) continue;
            cr_assert_eq(stash_value_get(v, &b), 0, "key %llu", (unsigned long long)k);
            cr_assert_eq(test_u64(b.data), 4 * k, "key %llu", (unsigned long long)k);
            found++;
        }
        stash_worker_close(w);
    }
    cr_assert_eq(found, 1000, "every key, by the worker of its key group");
    stash_service_stop(svc);
    stash_arena_destroy(name, NULL);
    /* Bad options, named. */
    so.pool = NULL;
    cr_assert_eq(stash_service_start(name, &so, &svc), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "pool"), "%s", stash_errmsg());
    so.pool = "nosuch";
    rc = stash_service_start(name, &so, &svc);
    cr_assert_eq(rc, -ENOENT, "%d %s", rc, stash_errmsg());
    cr_assert(strstr(stash_errmsg(), "rados://nosuch"), "%s", stash_errmsg());
    ckpt_rados_close(r);
}

Test(rados, the_snapshot_tool_reads_and_writes_rados_urls)
{
    char name[96], local[256], args[1024], sp[300];
    static char out[65536];
    setenv("CEPH_CONF", conf, 1);
    snprintf(local, sizeof local, "%s/local", dir);
    stash_arena *a = test_arena_create("radosurl", 16u << 20, 16, name);
    stash_service_opts so = rados_opts(local, "urls");
    stash_service *svc;
    cr_assert_eq(stash_service_start(name, &so, &svc), 0, "%s", stash_errmsg());
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    put_all(w, 100, 7);
    stash_checkpoint_info info;
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
    stash_worker_close(w);
    stash_service_stop(svc);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    /* ls, verify, info and dump of what is in the pool. */
    cr_assert_eq(test_run_stash("snapshot ls rados://stash/urls --json", out, sizeof out), 0, "%s",
                 out);
    char want[128];
    snprintf(want, sizeof want, "{\"id\": %llu, \"state\": \"complete\", \"latest\": true",
             (unsigned long long)info.id);
    cr_assert(strstr(out, want), "%s", out);
    cr_assert_eq(test_run_stash("snapshot verify rados://stash/urls", out, sizeof out), 0, "%s",
                 out);
    cr_assert(strstr(out, "100 records"), "%s", out);
    snprintf(args, sizeof args, "snapshot dump rados://stash/urls/chk-%llu",
             (unsigned long long)info.id);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    unsigned lines = 0;
    for (char *p = out; (p = strstr(p, "{\"kg\": ")); p++) lines++;
    cr_assert_eq(lines, 100);
    cr_assert_eq(test_run_stash("snapshot info rados://stash/nosuch", out, sizeof out), 1);
    cr_assert(strstr(out, "rados://stash/nosuch/latest"), "%s", out);
    /* A savepoint copied down to a directory and up into the pool again. */
    snprintf(sp, sizeof sp, "%s/savepoint-%llu", dir, (unsigned long long)info.id);
    snprintf(args, sizeof args, "snapshot rewrite rados://stash/urls %s", sp);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    snprintf(args, sizeof args, "snapshot rewrite %s rados://stash/moved/savepoint-%llu", sp,
             (unsigned long long)info.id);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "exists already"), "%s", out);
    /* A job starts from the savepoint in the pool. */
    char restore[300];
    snprintf(restore, sizeof restore, "rados://stash/moved/savepoint-%llu",
             (unsigned long long)info.id);
    test_remove_dir(local);
    stash_service_opts fs = {.sz = sizeof(stash_service_opts), .dir = local, .restore = restore};
    cr_assert_eq(stash_service_start(name, &fs, &svc), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    check_all(w, 100, 7);
    stash_worker_close(w);
    stash_service_stop(svc);
    stash_arena_destroy(name, NULL);
    cr_assert_eq(test_run_stash("snapshot rewrite rados://stash/urls rados://stash/urls/chk-99",
                                out, sizeof out),
                 1, "%s", out);
    cr_assert(strstr(out, "savepoint"), "%s", out);
}

Test(rados, the_bench_measures_the_pool_beside_rados_bench)
{
    static char out[65536];
    setenv("CEPH_CONF", conf, 1);
    int rc = test_run_stash("bench checkpoint --storage rados --pool stash --quick --reps 1 --json",
                            out, sizeof out);
    cr_assert_eq(rc, 0, "%s", out);
    const char *want[] = {"\"case\": \"rados/write\", \"system\": \"stash\"",
                          "\"case\": \"rados/restore\", \"system\": \"stash\"",
                          "\"case\": \"rados/write\", \"system\": \"rados-bench\"",
                          "\"case\": \"rados/restore\", \"system\": \"stash/rados-bench\"",
                          "\"case\": \"rados/write\", \"system\": \"stash-upload\"",
                          "\"case\": \"rados/write\", \"system\": \"stash-local-write\"",
                          "\"case\": \"rados/restore\", \"system\": \"stash-fetch\"",
                          "\"case\": \"rados/restore\", \"system\": \"stash-local-restore\""};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert(strstr(out, want[i]), "%s not in %s", want[i], out);
    /* The job's objects are gone, and the pool holds what it held. */
    ckpt_rados *r = connect_to("stash", 0);
    unsigned left = count_prefix(r, "stash-bench-");
    if (left) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rados -c %s -p stash ls | grep stash-bench- | head >&2", conf);
        system(cmd);
    }
    cr_assert_eq(left, 0);
    ckpt_rados_close(r);
    cr_assert_eq(test_run_stash("bench checkpoint --storage rados", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "go together"), "%s", out);
    cr_assert_eq(test_run_stash("bench keyed --storage rados --pool stash", out, sizeof out), 2,
                 "%s", out);
}

Test(rados, an_incremental_chain_goes_up_once_a_file_and_comes_back_whole)
{
    char name[96], local[256];
    snprintf(local, sizeof local, "%s/local", dir);
    stash_arena *a = test_arena_create("radosinc", 16u << 20, 32, name);
    stash_service_opts so = rados_opts(local, "chain");
    so.incremental = 1;
    so.retain = 2;
    stash_service *svc;
    cr_assert_eq(stash_service_start(name, &so, &svc), 0, "%s", stash_errmsg());
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    stash_state *v;
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &v),
        0);
    put_all(w, 500, 1);
    stash_checkpoint_info info;
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
    /* The chain's first, its one file in shared/, read back from the pool. */
    static char out[16384];
    char args[256];
    setenv("CEPH_CONF", conf, 1);
    snprintf(args, sizeof args, "snapshot verify rados://stash/chain/chk-%llu",
             (unsigned long long)info.id);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "500 records"), "%s", out);
    /* Deltas: a tenth of the keys changed, then every key divisible by 7 gone. */
    for (int round = 0; round < 3; round++) {
        for (uint64_t k = round; k < 500; k += 10) {
            uint64_t x = 1000 + k;
            stash_key_set(w, &k, sizeof k);
            cr_assert_eq(stash_value_put(v, &x, sizeof x), 0);
        }
        if (round == 2)
            for (uint64_t k = 0; k < 500; k += 7) {
                stash_key_set(w, &k, sizeof k);
                cr_assert_eq(stash_state_clear(v), 0);
            }
        cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
        cr_assert(info.incremental, "checkpoint %llu is a delta", (unsigned long long)info.id);
    }
    /* Each shared file once: the full one and three deltas, all still listed
     * by the two kept checkpoints. */
    ckpt_rados *r = connect_to("stash", 0);
    cr_assert_eq(retained(r, "chain/shared/", 4), 4, "one object each (small files)");
    cr_assert_eq(retained(r, "chain/chk-", 4), 4, "two kept, each its claim and metadata");
    ckpt_rados_close(r);
    lose_all(name, a, w, svc, local);
    cr_assert_eq(stash_service_start(name, &so, &svc), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &v),
        0);
    for (uint64_t k = 0; k < 500; k++) {
        stash_bytes b;
        stash_key_set(w, &k, sizeof k);
        if (k % 7 == 0) {
            cr_assert_eq(stash_value_get(v, &b), STASH_ENOTFOUND, "key %llu",
                         (unsigned long long)k);
            continue;
        }
        cr_assert_eq(stash_value_get(v, &b), 0, "key %llu", (unsigned long long)k);
        cr_assert_eq(test_u64(b.data), k % 10 < 3 ? 1000 + k : k, "key %llu",
                     (unsigned long long)k);
    }
    stash_worker_close(w);
    stash_service_stop(svc);
    stash_arena_destroy(name, NULL);
}

Test(rados, a_stale_engine_never_writes_over_a_newer_one)
{
    char a_name[96], b_name[112], a_dir[256], b_dir[256], args[256];
    static char out[65536];
    setenv("CEPH_CONF", conf, 1);
    snprintf(a_dir, sizeof a_dir, "%s/a", dir);
    snprintf(b_dir, sizeof b_dir, "%s/b", dir);
    stash_arena *a = test_arena_create("radosa", 16u << 20, 16, a_name);
    stash_service_opts so = rados_opts(a_dir, "twice");
    stash_service *sa, *sb;
    cr_assert_eq(stash_service_start(a_name, &so, &sa), 0, "%s", stash_errmsg());
    stash_worker *wa;
    cr_assert_eq(stash_worker_open(a_name, NULL, &wa), 0, "%s", stash_errmsg());
    put_all(wa, 100, 1);
    stash_checkpoint_info info;
    cr_assert_eq(test_checkpoint_at_barriers(a, &wa, 1, &info), 0, "%s", info.detail);
    /* A second engine of the job (another host) starts from it and goes on. */
    snprintf(b_name, sizeof b_name, "%s-b", a_name);
    so.dir = b_dir;
    cr_assert_eq(stash_service_start(b_name, &so, &sb), 0, "%s", stash_errmsg());
    stash_arena *b;
    cr_assert_eq(stash_arena_open(b_name, NULL, &b), 0);
    stash_worker *wb;
    cr_assert_eq(stash_worker_open(b_name, NULL, &wb), 0, "%s", stash_errmsg());
    put_all(wb, 100, 2);
    stash_checkpoint_info binfo;
    cr_assert_eq(test_checkpoint_at_barriers(b, &wb, 1, &binfo), 0, "%s", binfo.detail);
    cr_assert_eq(latest_of("twice"), binfo.id);
    /* The first one, stale, fails twice: the id the other took, then the
     * pointer the other moved. */
    put_all(wa, 100, 3);
    cr_assert_neq(test_checkpoint_at_barriers(a, &wa, 1, &info), 0);
    cr_assert(strstr(info.detail, "another engine"), "%s", info.detail);
    cr_assert_neq(test_checkpoint_at_barriers(a, &wa, 1, &info), 0);
    cr_assert(strstr(info.detail, "does not hold"), "%s", info.detail);
    cr_assert_eq(latest_of("twice"), binfo.id);
    /* The newer one is whole: every value the second engine wrote. */
    snprintf(args, sizeof args, "snapshot dump rados://stash/twice --format hex");
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"value\": \"c600000000000000\""), "key 99's 198: %.2000s", out);
    cr_assert_eq(test_run_stash("snapshot verify rados://stash/twice", out, sizeof out), 0, "%s",
                 out);
    stash_worker_close(wa);
    stash_worker_close(wb);
    stash_service_stop(sa);
    stash_service_stop(sb);
    stash_arena_close(a);
    stash_arena_close(b);
    stash_arena_destroy(a_name, NULL);
    stash_arena_destroy(b_name, NULL);
}

/* Runs the ceph command line on the test's cluster: its exit code. */
static int ceph_cli(const char *args)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "timeout 20 ceph -c %s %s >/dev/null 2>&1", conf, args);
    return WEXITSTATUS(system(cmd));
}

/* Writes small objects until one fails (the monitor learns how full the
 * pool is from the manager within seconds), for a minute at most: the
 * failing call's result, or 0. */
static int write_until_refused(ckpt_rados *r)
{
    for (int i = 0; i < 600; i++) {
        char name[64];
        snprintf(name, sizeof name, "full/%d", i);
        int rc = ckpt_rados_write_file(r, name, "x", 1);
        if (rc < 0) return rc;
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

Test(rados, a_full_pool_is_said_so_at_once)
{
    /* A write that waited for space would end in its timeout (ETIMEDOUT). */
    ckpt_rados *r = connect_to("stash", 0);
    char name[96], local[256];
    snprintf(local, sizeof local, "%s/local", dir);
    stash_arena *a = test_arena_create("full", 16u << 20, 32, name);
    stash_service_opts so = rados_opts(local, "full");
    stash_service *svc;
    cr_assert_eq(stash_service_start(name, &so, &svc), 0, "%s", stash_errmsg());
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    stash_checkpoint_info info;
    put_all(w, 100, 1);
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);

    /* The pool's quota reached. */
    cr_assert_eq(ceph_cli("osd pool set-quota stash max_objects 8"), 0);
    int rc = write_until_refused(r);
    cr_assert_eq(rc, -EDQUOT, "%d: %s", rc, stash_errmsg());
    cr_assert(strstr(stash_errmsg(), "the pool is full (its quota is reached)"), "%s",
              stash_errmsg());
    put_all(w, 100, 2);
    cr_assert_neq(test_checkpoint_at_barriers(a, &w, 1, &info), 0);
    cr_assert(strstr(info.detail, "the pool is full"), "%s", info.detail);
    cr_assert_eq(ceph_cli("osd pool set-quota stash max_objects 0"), 0);

    /* The OSD past its full ratio. */
    cr_assert_eq(ceph_cli("osd set-nearfull-ratio 0.01"), 0);
    cr_assert_eq(ceph_cli("osd set-backfillfull-ratio 0.02"), 0);
    cr_assert_eq(ceph_cli("osd set-full-ratio 0.03"), 0);
    rc = write_until_refused(r);
    cr_assert_eq(rc, -ENOSPC, "%d: %s", rc, stash_errmsg());
    cr_assert(strstr(stash_errmsg(), "the pool is full (an OSD is past its full ratio)"), "%s",
              stash_errmsg());

    /* Space again: the next checkpoint goes in. */
    cr_assert_eq(ceph_cli("osd set-full-ratio 0.80"), 0);
    cr_assert_eq(ceph_cli("osd set-backfillfull-ratio 0.75"), 0);
    cr_assert_eq(ceph_cli("osd set-nearfull-ratio 0.70"), 0);
    rc = -1;
    for (int tries = 0; rc != 0 && tries < 60; tries++) {
        rc = test_checkpoint_at_barriers(a, &w, 1, &info);
        struct timespec ts = {0, 500000000};
        if (rc) nanosleep(&ts, NULL);
    }
    cr_assert_eq(rc, 0, "%s", info.detail);
    stash_worker_close(w);
    stash_service_stop(svc);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    ckpt_rados_close(r);
}
