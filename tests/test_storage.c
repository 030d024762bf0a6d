/* SPDX-License-Identifier: MIT */
/*
 * test_storage.c: the remote checkpoint storages (backends/checkpoint/
 * storage.h) against real services: a single-node Ceph cluster (one
 * monitor, one OSD on bluestore in a sparse file, so that it keeps its data
 * when it restarts) for rados, with its S3 gateway (radosgw) for s3
 * (STASH_TEST_STORAGE=s3), the one the suites share or, for a test that
 * stops or fills it, one the test starts and stops on ports of its own. Files
 * round-trip, a pointer moves only from the value it holds, listing by
 * prefix, calls fail within their timeout while the service is down
 * instead of hanging, a service checkpoints into the storage and a lost
 * arena comes back from it, the snapshot tool reads and writes its URLs,
 * and damage is named.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/checkpoint/checkpoints.h"
#include "include/stash.h"
#include "tests/helpers.h"

static const char *const dir = test_ceph_dir, *const conf = test_ceph_conf,
                         *const container = test_ceph_container;

static bool on_s3(void)
{
    const char *s = getenv("STASH_TEST_STORAGE");
    return s && strcmp(s, "s3") == 0;
}

static const char *scheme(void)
{
    return on_s3() ? "s3" : "rados";
}

/* Where each test runs. A cluster's start was most of a test's time (8 s,
 * its gateway's 14 s more), so the tests share the cluster ctest starts for
 * the suites (tests/helpers.h), two at a time (--jobs 2), each with a pool
 * or bucket of its own: what one writes, lists, removes or limits, the
 * other does not see, and a fault injected (STASH_STORAGE_FAULT) is its
 * client's alone. A test that stops a daemon or fills the OSD would fail
 * the one beside it: it starts a cluster of its own.
 *   shared: files_pointers_and_listing, a_writer_killed_halfway_...,
 *     a_storage_failing_mid_checkpoint_..., a_restore_as_the_bytes_arrive_...,
 *     the_crash_campaign_... (its faults injected too), the_snapshot_tool_...,
 *     the_bench_..., an_incremental_chain_..., a_stale_engine_..., and
 *     a_full_pool_... on S3 (its bucket's quota);
 *   its own: calls_fail_within_their_timeout_... (the OSD, the gateway and
 *     then every daemon stopped), an_upload_goes_on_across_the_gateway_...
 *     (the gateway killed), a_service_checkpoints_into_the_pool_... (the
 *     OSD stopped), and a_full_pool_... on RADOS (the full ratio is the
 *     cluster's). */
static void start(void)
{
    if (on_s3())
        test_s3_start();
    else
        test_ceph_start();
}

static void start_own(void)
{
    if (on_s3())
        test_s3_start_own();
    else
        test_ceph_start_own();
}

static void start_own_on_rados(void)
{
    if (on_s3())
        test_s3_start();
    else
        test_ceph_start_own();
}

/* The tests of one storage skip before a cluster or bucket is made for them. */
static void start_on_rados(void)
{
    if (on_s3()) cr_skip_test("S3 keeps a killed writer's parts in its open upload");
    test_ceph_start();
}

static void start_own_on_s3(void)
{
    if (!on_s3()) cr_skip_test("the S3 gateway's: rados' OSD stopped is the test above");
    test_s3_start_own();
}

TestSuite(storage, .fini = test_ceph_stop, .timeout = 240);

/* The storage's URL of job ("rados://POOL/JOB"), in a static buffer. */
static const char *url_of(const char *job)
{
    static char url[256];
    snprintf(url, sizeof url, "%s://%s/%s", scheme(), container, job);
    return url;
}

/* The storage's options: the test cluster's conf (rados), parts of 5 MiB
 * (s3, so that a file of a few MiB goes up in parts); the endpoint and
 * keys of s3 come from the environment. */
static stash_storage_opts storage_opts(uint32_t timeout_ms)
{
    return (stash_storage_opts){.sz = sizeof(stash_storage_opts),
                                .ceph_conf = conf,
                                .timeout_ms = timeout_ms,
                                .part_bytes = 5u << 20};
}

static ckpt_storage *connect_to(const char *name, uint32_t timeout_ms)
{
    ckpt_storage *r;
    stash_storage_opts o = storage_opts(timeout_ms);
    cr_assert_eq(ckpt_storage_open(ckpt_storage_of_url(url_of("")), name, &o, &r), 0, "%s",
                 stash_errmsg());
    return r;
}

static int count_name(void *ctx, const char *name)
{
    (void)name;
    (*(unsigned *)ctx)++;
    return 0;
}

/* The files whose names start with prefix. */
static unsigned count_prefix(ckpt_storage *r, const char *prefix)
{
    unsigned n = 0;
    cr_assert_eq(ckpt_storage_list_files(r, prefix, count_name, &n), 0, "%s", stash_errmsg());
    return n;
}

/* The job's checkpoints in the storage, complete or not. */
static unsigned checkpoints_of(ckpt_storage *r, const char *job)
{
    uint64_t *ids;
    bool *committed;
    size_t n;
    cr_assert_eq(ckpt_storage_checkpoints(r, job, &ids, &committed, &n), 0, "%s", stash_errmsg());
    free(ids);
    free(committed);
    return (unsigned)n;
}

/* Waits until count(r, what) is want, as retention, which follows a
 * checkpoint's completion, leaves it (ten seconds at most): the count. */
static unsigned retained(ckpt_storage *r, const char *what,
                         unsigned (*count)(ckpt_storage *, const char *), unsigned want)
{
    unsigned n = count(r, what);
    for (int tries = 0; n != want && tries < 200; tries++) {
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
        n = count(r, what);
    }
    return n;
}

/* A file of len bytes made from seed, in dir. */
static int make_file(const char *path, uint8_t *data, size_t len)
{
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0, "%s", path);
    cr_assert_eq(write(fd, data, len), (ssize_t)len);
    return fd;
}

Test(storage, files_pointers_and_listing, .init = start)
{
    ckpt_storage *r = connect_to(container, 0);
    char want[128];
    snprintf(want, sizeof want, "%s://%s", scheme(), container);
    cr_assert_str_eq(ckpt_storage_where(r), want);
    /* Larger than a stripe or part twice, the last of one byte. */
    size_t len = (10u << 20) + 1;
    uint8_t *data = malloc(len);
    for (size_t i = 0; i < len; i++) data[i] = (uint8_t)(i * 131 + i / 4096);
    cr_assert_eq(ckpt_storage_write_file(r, "job/chk-1/kg-data.dat", data, len), 0, "%s",
                 stash_errmsg());
    uint8_t *back;
    size_t got;
    cr_assert_eq(ckpt_storage_read_file(r, "job/chk-1/kg-data.dat", len, &back, &got), 0, "%s",
                 stash_errmsg());
    cr_assert_eq(got, len);
    cr_assert_eq(memcmp(back, data, len), 0, "the bytes read are the bytes written");
    free(back);
    cr_assert_eq(ckpt_storage_read_file(r, "job/chk-1/kg-data.dat", len - 1, &back, &got), -EFBIG);
    /* Read in the background, its bytes taken as they arrive from the front. */
    ckpt_storage_reader *rd;
    cr_assert_eq(ckpt_storage_reader_open(r, "job/chk-1/kg-data.dat", len, 2, &rd, &back, &got), 0,
                 "%s", stash_errmsg());
    cr_assert_eq(got, len);
    for (size_t upto = 1;; upto = upto * 3 + 7) {
        upto = upto < len ? upto : len;
        cr_assert_eq(ckpt_storage_reader_wait(rd, upto), 0, "%s", stash_errmsg());
        cr_assert_eq(memcmp(back, data, upto), 0, "the first %zu bytes", upto);
        if (upto == len) break;
    }
    cr_assert_eq(ckpt_storage_reader_wait(rd, len + 1), STASH_ECORRUPT);
    ckpt_storage_reader_close(rd);
    free(back);
    cr_assert_eq(ckpt_storage_reader_open(r, "job/chk-1/kg-data.dat", len - 1, 2, &rd, &back, &got),
                 -EFBIG);
    cr_assert_eq(ckpt_storage_reader_open(r, "job/chk-1/none", len, 2, &rd, &back, &got), -ENOENT);
    /* Stopped, it reads no part not yet asked for, and a waiter hears so. */
    cr_assert_eq(setenv("STASH_STORAGE_FAULT", "delay:300", 1), 0);
    ckpt_storage *slow = connect_to(container, 0);
    unsetenv("STASH_STORAGE_FAULT");
    cr_assert_eq(ckpt_storage_reader_open(slow, "job/chk-1/kg-data.dat", len, 1, &rd, &back, &got),
                 0, "%s", stash_errmsg());
    ckpt_storage_reader_stop(rd);
    cr_assert_eq(ckpt_storage_reader_wait(rd, len), -ECANCELED);
    cr_assert(strstr(stash_errmsg(), "stopped"), "%s", stash_errmsg());
    ckpt_storage_reader_close(rd);
    free(back);
    ckpt_storage_close(slow);
    /* Streamed from a file and back into another (s3: in parts). */
    char path[300], path2[300];
    snprintf(path, sizeof path, "%s/up", dir);
    snprintf(path2, sizeof path2, "%s/down", dir);
    int fd = make_file(path, data, len);
    cr_assert_eq(ckpt_storage_put_fd(r, "job/chk-1/streamed", fd, path, len), 0, "%s",
                 stash_errmsg());
    close(fd);
    fd = open(path2, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    uint64_t len64 = 0;
    cr_assert_eq(ckpt_storage_get_fd(r, "job/chk-1/streamed", fd, path2, &len64), 0, "%s",
                 stash_errmsg());
    cr_assert_eq(len64, len);
    back = malloc(len);
    cr_assert_eq(pread(fd, back, len, 0), (ssize_t)len);
    cr_assert_eq(memcmp(back, data, len), 0, "the bytes streamed back are the bytes sent");
    free(back);
    close(fd);
    cr_assert_eq(ckpt_storage_file_size(r, "job/chk-1/streamed", &len64), 0);
    cr_assert_eq(len64, len);
    /* A file that shrank while it went up is named. */
    fd = make_file(path, data, 100);
    cr_assert_neq(ckpt_storage_put_fd(r, "job/chk-1/short", fd, path, len), 0);
    cr_assert(strstr(stash_errmsg(), path), "%s", stash_errmsg());
    close(fd);
    /* Written as its bytes come, in pieces that cross parts unevenly: whole
     * only once closed with commit; given up, not there. */
    ckpt_storage_writer *wr;
    cr_assert_eq(ckpt_storage_writer_open(r, "job/chk-1/written", &wr), 0, "%s", stash_errmsg());
    for (size_t off = 0, k = 1; off < len; k = k * 7 % 1000003) {
        size_t n = 1 + k * 37 % (3u << 20);
        n = n < len - off ? n : len - off;
        cr_assert_eq(ckpt_storage_writer_put(wr, data + off, n), 0, "%s", stash_errmsg());
        off += n;
    }
    cr_assert_eq(ckpt_storage_file_size(r, "job/chk-1/written", &len64), -ENOENT,
                 "not there before it is whole");
    cr_assert_eq(ckpt_storage_writer_close(wr, true), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_read_file(r, "job/chk-1/written", len, &back, &got), 0, "%s",
                 stash_errmsg());
    cr_assert_eq(got, len);
    cr_assert_eq(memcmp(back, data, len), 0, "the bytes read are the bytes written");
    free(back);
    cr_assert_eq(ckpt_storage_remove_file(r, "job/chk-1/written"), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_writer_open(r, "job/chk-1/dropped", &wr), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_writer_put(wr, data, len), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_writer_close(wr, false), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_file_size(r, "job/chk-1/dropped", &len64), -ENOENT);
    if (!on_s3()) {
        unsigned left = 0;
        cr_assert_eq(ckpt_storage_objects(r, "job/chk-1/dropped", count_name, &left), 0);
        cr_assert_eq(left, 0, "a file given up leaves no stripe");
    }
    /* Exactly a part, and nothing. */
    cr_assert_eq(ckpt_storage_writer_open(r, "job/chk-1/one", &wr), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_writer_put(wr, data, r->part), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_writer_close(wr, true), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_file_size(r, "job/chk-1/one", &len64), 0, "%s", stash_errmsg());
    cr_assert_eq(len64, r->part);
    cr_assert_eq(ckpt_storage_remove_file(r, "job/chk-1/one"), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_writer_open(r, "job/chk-1/none", &wr), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_writer_close(wr, true), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_file_size(r, "job/chk-1/none", &len64), 0, "%s", stash_errmsg());
    cr_assert_eq(len64, 0);
    cr_assert_eq(ckpt_storage_remove_file(r, "job/chk-1/none"), 0, "%s", stash_errmsg());
    /* An empty file, and one that is not there. */
    cr_assert_eq(ckpt_storage_write_file(r, "job/chk-1/_metadata", "", 0), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_read_file(r, "job/chk-1/_metadata", 16, &back, &got), 0);
    cr_assert_eq(got, 0);
    free(back);
    cr_assert_eq(ckpt_storage_read_file(r, "job/chk-2/_metadata", 16, &back, &got), -ENOENT);
    snprintf(want, sizeof want, "%s://%s/job/chk-2/_metadata", scheme(), container);
    cr_assert(strstr(stash_errmsg(), want), "%s", stash_errmsg());
    if (!on_s3()) {
        /* A file of RADOS is its stripes: one lost is damage, named. */
        unsigned stripes = 0;
        cr_assert_eq(ckpt_storage_objects(r, "job/chk-1/kg-data.dat.", count_name, &stripes), 0);
        cr_assert_eq(stripes, 3, "a stripe an object");
        cr_assert_eq(ckpt_storage_write_file(r, "job/lost", data, len), 0);
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "timeout 20 rados -c %s -p %s rm job/lost.1", conf, container);
        cr_assert_eq(system(cmd), 0, "%s", cmd);
        cr_assert_eq(ckpt_storage_read_file(r, "job/lost", len, &back, &got), STASH_ECORRUPT);
        cr_assert(strstr(stash_errmsg(), "job/lost.1"), "%s", stash_errmsg());
        cr_assert_eq(ckpt_storage_remove_file(r, "job/lost"), 0, "%s", stash_errmsg());
        /* A file never made whole (its NAME.0 without a length) whose
         * stripes have gaps, as writers in flight leave them: removing it
         * takes every stripe. */
        const char *planted[] = {"job/gap.0", "job/gap.1", "job/gap.3", "job/gap.40"};
        for (size_t i = 0; i < sizeof planted / sizeof *planted; i++) {
            snprintf(cmd, sizeof cmd, "timeout 20 rados -c %s -p %s put %s %s", conf, container,
                     planted[i], i ? path : "/dev/null");
            cr_assert_eq(system(cmd), 0, "%s", cmd);
        }
        cr_assert_eq(ckpt_storage_file_size(r, "job/gap", &len64), -ENOENT, "not a file");
        cr_assert_eq(ckpt_storage_remove_file(r, "job/gap"), 0, "%s", stash_errmsg());
        unsigned gap = 0;
        cr_assert_eq(ckpt_storage_objects(r, "job/gap.", count_name, &gap), 0);
        cr_assert_eq(gap, 0, "every stripe removed, past the gaps");
    }
    ckpt_storage *other = connect_to(container, 0);
    cr_assert_eq(count_prefix(r, "job/"), 3, "kg-data.dat, streamed and _metadata");
    cr_assert_eq(ckpt_storage_remove_file(r, "job/chk-1/kg-data.dat"), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_file_size(r, "job/chk-1/kg-data.dat", &len64), -ENOENT);
    cr_assert_eq(ckpt_storage_remove_file(r, "job/chk-1/kg-data.dat"), 0, "absent: no error");
    cr_assert_eq(count_prefix(other, "job/"), 2, "streamed and _metadata");
    /* The pointer moves only from what it holds. */
    char buf[64];
    cr_assert_eq(ckpt_storage_pointer(r, "job/latest", buf, sizeof buf), -ENOENT);
    cr_assert_eq(ckpt_storage_swap(r, "job/latest", NULL, "1"), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_swap(other, "job/latest", NULL, "9"), -ECANCELED, "exists");
    cr_assert_eq(ckpt_storage_swap(r, "job/latest", "1", "2"), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_swap(other, "job/latest", "1", "3"), -ECANCELED,
                 "a stale writer cannot move it back");
    cr_assert_eq(ckpt_storage_swap(other, "job/latest", "", "3"), -ECANCELED);
    cr_assert_eq(ckpt_storage_swap(other, "job/none", "1", "3"), -ECANCELED);
    cr_assert_eq(ckpt_storage_pointer(other, "job/latest", buf, sizeof buf), 0);
    cr_assert_str_eq(buf, "2");
    cr_assert_eq(ckpt_storage_swap(other, "job/latest", "2", "12"), 0);
    cr_assert_eq(ckpt_storage_pointer(r, "job/latest", buf, sizeof buf), 0);
    cr_assert_str_eq(buf, "12");
    /* Of writers racing from the same value, one wins. */
    unsigned won = 0;
    for (int i = 0; i < 8; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            ckpt_storage *mine;
            stash_storage_opts o = storage_opts(0);
            char value[16];
            snprintf(value, sizeof value, "%d", 100 + i);
            if (ckpt_storage_open(r->ops, container, &o, &mine) != 0) _exit(2);
            _exit(ckpt_storage_swap(mine, "job/latest", "12", value) == 0 ? 0 : 1);
        }
    }
    for (int i = 0; i < 8; i++) {
        int status;
        cr_assert_gt(wait(&status), 0);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) < 2);
        won += WEXITSTATUS(status) == 0;
    }
    cr_assert_eq(won, 1, "%u writers moved the pointer from 12", won);
    /* Removal by prefix takes every file of it. */
    cr_assert_eq(ckpt_storage_remove_prefix(r, "job/"), 0, "%s", stash_errmsg());
    cr_assert_eq(count_prefix(r, "job/"), 0);
    ckpt_storage_close(other);
    ckpt_storage_close(r);
    free(data);
    ckpt_storage_close(NULL);
}

/* A writer killed halfway (RADOS): the stripes it wrote hang from a NAME.0
 * without a length, which no reader takes for a file, which retention's
 * listing sees, and whose removal takes every stripe with it. (On S3 the
 * upload a killed writer left open: see the gateway's test below.) */
Test(storage, a_writer_killed_halfway_leaves_nothing_removal_misses, .init = start_on_rados)
{
    ckpt_storage *r = connect_to(container, 0);
    size_t len = (size_t)r->part * 3 + 7;
    uint8_t *data = calloc(1, len);
    pid_t pid = fork();
    if (pid == 0) {
        ckpt_storage *mine;
        ckpt_storage_writer *w;
        stash_storage_opts o = storage_opts(0);
        if (ckpt_storage_open(r->ops, container, &o, &mine) != 0 ||
            ckpt_storage_writer_open(mine, "killed/file", &w) != 0 ||
            ckpt_storage_writer_put(w, data, len) != 0)
            _exit(2);
        pause();
        _exit(0);
    }
    /* Killed once its third stripe is in. */
    unsigned third = 0;
    for (int tries = 0; tries < 600 && !third; tries++) {
        cr_assert_eq(ckpt_storage_objects(r, "killed/file.2", count_name, &third), 0, "%s",
                     stash_errmsg());
        struct timespec ts = {0, 50000000};
        if (!third) nanosleep(&ts, NULL);
    }
    cr_assert_gt(third, 0, "the writer wrote its third stripe");
    kill(pid, SIGKILL);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status), "the writer was killed, not done: %d", status);
    uint64_t len64;
    cr_assert_eq(ckpt_storage_file_size(r, "killed/file", &len64), -ENOENT, "no file to read");
    cr_assert_eq(count_prefix(r, "killed/"), 1, "a file to remove, as retention lists them");
    cr_assert_eq(ckpt_storage_remove_file(r, "killed/file"), 0, "%s", stash_errmsg());
    unsigned left = 0;
    cr_assert_eq(ckpt_storage_objects(r, "killed/", count_name, &left), 0);
    cr_assert_eq(left, 0, "every stripe removed");
    free(data);
    ckpt_storage_close(r);
}

/* Retries a write until the storage takes it again (it was down): the last result. */
static int write_once_back(ckpt_storage *r, const char *name)
{
    int rc = -ETIMEDOUT;
    for (int tries = 0; rc != 0 && tries < 30; tries++)
        rc = ckpt_storage_write_file(r, name, "z", 1);
    return rc;
}

Test(storage, calls_fail_within_their_timeout_while_the_service_is_down, .init = start_own)
{
    ckpt_storage *r = connect_to(container, 2000);
    cr_assert_eq(ckpt_storage_write_file(r, "job/before", "x", 1), 0, "%s", stash_errmsg());
    /* The OSD down under either: a call returns (an unbounded one would
     * wait for the OSD forever). */
    cr_assert_eq(test_ceph("osd-stop"), 0);
    int rc = ckpt_storage_write_file(r, "job/during", "y", 1);
    cr_assert_eq(rc, -ETIMEDOUT, "%d: %s", rc, stash_errmsg());
    char want[128];
    snprintf(want, sizeof want, "%s://%s/job/during", scheme(), container);
    cr_assert(strstr(stash_errmsg(), want), "%s", stash_errmsg());
    char buf[16];
    cr_assert_eq(ckpt_storage_pointer(r, "job/latest", buf, sizeof buf), -ETIMEDOUT);
    /* Back, the next calls work, and what was there before still is. */
    cr_assert_eq(test_ceph("osd-start"), 0);
    cr_assert_eq(write_once_back(r, "job/after"), 0, "%s", stash_errmsg());
    if (on_s3()) {
        /* The gateway itself gone: refused, after the retries, then back. */
        cr_assert_eq(test_ceph("rgw-stop"), 0);
        rc = ckpt_storage_write_file(r, "job/during", "y", 1);
        cr_assert_eq(rc, -ECONNREFUSED, "%d: %s", rc, stash_errmsg());
        cr_assert(strstr(stash_errmsg(), "attempts"), "%s", stash_errmsg());
        cr_assert_eq(test_ceph("rgw-start"), 0);
        cr_assert_eq(write_once_back(r, "job/after"), 0, "%s", stash_errmsg());
    }
    uint8_t *back;
    size_t got;
    cr_assert_eq(ckpt_storage_read_file(r, "job/before", 16, &back, &got), 0, "%s", stash_errmsg());
    cr_assert(got == 1 && back[0] == 'x');
    free(back);
    ckpt_storage_close(r);
    /* A container that is not there, and none named. */
    ckpt_storage *none;
    const ckpt_storage_ops *ops = ckpt_storage_of_url(url_of(""));
    stash_storage_opts o = storage_opts(0);
    cr_assert_eq(ckpt_storage_open(ops, "nosuch", &o, &none), -ENOENT, "%s", stash_errmsg());
    snprintf(want, sizeof want, "%s://nosuch", scheme());
    cr_assert(strstr(stash_errmsg(), want), "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_open(ops, "", &o, &none), -EINVAL);
    /* Nothing answering at all. */
    cr_assert_eq(test_ceph("stop"), 0);
    o.timeout_ms = 1000;
    rc = ckpt_storage_open(ops, container, &o, &none);
    cr_assert(rc == -ETIMEDOUT || rc == -ECONNREFUSED, "%d: %s", rc, stash_errmsg());
}

/* Whether the test gateway has a multipart upload under way in the test's bucket. */
static bool upload_under_way(void)
{
    char cmd[1024], out[4096] = "";
    snprintf(cmd, sizeof cmd,
             "curl -sf --aws-sigv4 aws:amz:us-east-1:s3 --user \"$AWS_ACCESS_KEY_ID:"
             "$AWS_SECRET_ACCESS_KEY\" -H x-amz-content-sha256:UNSIGNED-PAYLOAD "
             "\"$AWS_ENDPOINT_URL/%s?uploads=\"",
             container);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[n] = 0;
    if (p) pclose(p);
    return strstr(out, "<UploadId>") != NULL;
}

Test(storage, an_upload_goes_on_across_the_gateway_killed_and_started_again,
     .init = start_own_on_s3)
{
    size_t len = 120u << 20;
    uint8_t *data = malloc(len);
    for (size_t i = 0; i < len; i++) data[i] = (uint8_t)(i * 7 + i / 65536);
    char path[300], path2[300];
    snprintf(path, sizeof path, "%s/up", dir);
    snprintf(path2, sizeof path2, "%s/down", dir);
    int fd = make_file(path, data, len);
    /* The uploader, paused once its parts are going up: the gateway dies
     * under it and comes back, then it goes on (the file's bytes stay
     * unchanged for the writer killed below). */
    pid_t pid = fork();
    if (pid == 0) {
        ckpt_storage *r;
        stash_storage_opts o = storage_opts(60000);
        if (ckpt_storage_open(ckpt_storage_of_url(url_of("")), container, &o, &r) != 0) _exit(2);
        int rc = ckpt_storage_put_fd(r, "big/file", fd, path, len);
        if (rc) fprintf(stderr, "%s\n", stash_errmsg());
        _exit(rc == 0 ? 0 : 1);
    }
    bool seen = false;
    for (int tries = 0; !seen && tries < 2000; tries++) {
        seen = upload_under_way();
        if (!seen) nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    cr_assert(seen, "no upload was seen under way");
    cr_assert_eq(kill(pid, SIGSTOP), 0);
    cr_assert_eq(test_ceph("rgw-kill"), 0);
    cr_assert_eq(test_ceph("rgw-start"), 0);
    cr_assert_eq(kill(pid, SIGCONT), 0);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the upload failed (%d)", status);
    cr_assert(!upload_under_way(), "the upload was completed, none left open");
    /* A writer killed mid-upload leaves its upload open: removing the
     * prefix (as retention removes a partial checkpoint) aborts it. */
    pid = fork();
    if (pid == 0) {
        ckpt_storage *mine;
        stash_storage_opts o = storage_opts(0);
        if (ckpt_storage_open(ckpt_storage_of_url(url_of("")), container, &o, &mine) != 0) _exit(2);
        _exit(ckpt_storage_put_fd(mine, "job/chk-5/kg-data.dat", fd, path, len) == 0 ? 0 : 1);
    }
    seen = false;
    for (int tries = 0; !seen && tries < 2000; tries++) {
        seen = upload_under_way();
        if (!seen) nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    cr_assert(seen, "no upload was seen under way");
    cr_assert_eq(kill(pid, SIGKILL), 0);
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(upload_under_way(), "the killed writer's upload is left open");
    ckpt_storage *st = connect_to(container, 0);
    cr_assert_eq(ckpt_storage_remove_prefix(st, "job/chk-5/"), 0, "%s", stash_errmsg());
    cr_assert(!upload_under_way(), "removing the prefix aborted it");
    ckpt_storage_close(st);
    ckpt_storage *r = connect_to(container, 0);
    int back = open(path2, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    uint64_t got = 0;
    cr_assert_eq(ckpt_storage_get_fd(r, "big/file", back, path2, &got), 0, "%s", stash_errmsg());
    cr_assert_eq(got, len);
    uint8_t *bytes = malloc(len);
    cr_assert_eq(pread(back, bytes, len, 0), (ssize_t)len);
    cr_assert_eq(memcmp(bytes, data, len), 0, "the bytes are those sent");
    close(back);
    close(fd);
    free(bytes);
    free(data);
    ckpt_storage_close(r);
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
    ckpt_storage *r = connect_to(container, 0);
    uint64_t id = 0;
    cr_assert_eq(ckpt_storage_latest(r, job, &id), 0, "%s", stash_errmsg());
    ckpt_storage_close(r);
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

/* A service's options for the storage of job (its URL in url, 256
 * bytes), its copy in local. */
static stash_service_opts svc_opts(const char *local, char *url, const char *job)
{
    static stash_storage_opts o;
    o = storage_opts(2000);
    snprintf(url, 256, "%s", url_of(job));
    return (stash_service_opts){
        .sz = sizeof(stash_service_opts), .dir = local, .storage_url = url, .storage_opts = &o};
}

Test(storage, a_service_checkpoints_into_the_pool_and_a_lost_arena_comes_back_from_it,
     .init = start_own)
{
    char name[96], local[256];
    snprintf(local, sizeof local, "%s/local", dir);
    stash_arena *a = test_arena_create("rados", 16u << 20, 32, name);
    char url[256];
    stash_service_opts so = svc_opts(local, url, "wordcount");
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
    ckpt_storage *r = connect_to(container, 0);
    cr_assert_eq(retained(r, "wordcount", checkpoints_of, 2), 2, "two kept");
    cr_assert_eq(count_prefix(r, "wordcount/shared/"), 0, "full checkpoints share no file");
    /* The OSD down: the checkpoint fails, the pointer stays, nothing is
     * left of it locally; back up, the next one completes. */
    cr_assert_eq(test_ceph("osd-stop"), 0);
    put_all(w, 1000, 4);
    cr_assert_neq(test_checkpoint_at_barriers(a, &w, 1, &info), 0);
    char want[80];
    snprintf(want, sizeof want, "not in %s://%s", scheme(), container);
    cr_assert(strstr(info.detail, want), "%s", info.detail);
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
    /* Read straight from the storage, its copy written into the directory
     * meanwhile: the one a replaced worker rolls back from. */
    char copy[300];
    snprintf(copy, sizeof copy, "%s/chk-%llu/_metadata", local,
             (unsigned long long)latest_of("wordcount"));
    cr_assert_eq(access(copy, F_OK), 0, "%s", copy);
    /* At another parallelism: three workers, each finding its own keys,
     * the first a replacement that rolls back. */
    unsigned found = 0;
    for (uint32_t i = 0; i < 3; i++) {
        cr_assert_eq(stash_worker_open(name,
                                       &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                            .index = i,
                                                            .parallelism = 3,
                                                            .rollback = i == 0},
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
    snprintf(url, sizeof url, "%s://%s", scheme(), container);
    cr_assert_eq(stash_service_start(name, &so, &svc), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "JOB"), "%s", stash_errmsg());
    snprintf(url, sizeof url, "%s://%s/job/chk-3", scheme(), container);
    cr_assert_eq(stash_service_start(name, &so, &svc), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "names checkpoint chk-3"), "%s", stash_errmsg());
    snprintf(url, sizeof url, "%s://nosuch/job", scheme());
    rc = stash_service_start(name, &so, &svc);
    cr_assert_eq(rc, -ENOENT, "%d %s", rc, stash_errmsg());
    snprintf(want, sizeof want, "%s://nosuch", scheme());
    cr_assert(strstr(stash_errmsg(), want), "%s", stash_errmsg());
    snprintf(url, sizeof url, "nosuch://%s/job", container);
    cr_assert_eq(stash_service_start(name, &so, &svc), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "not file:DIR, memory:"), "%s", stash_errmsg());
    if (on_s3()) {
        /* A job that spans hosts needs what S3 lacks. */
        snprintf(url, sizeof url, "s3://%s/hosts", container);
        so.host = "a";
        so.workers = "0-0";
        so.job_parallelism = 1;
        cr_assert_eq(stash_service_start(name, &so, &svc), -ENOTSUP, "%s", stash_errmsg());
        cr_assert(strstr(stash_errmsg(), "leases"), "%s", stash_errmsg());
    } else {
        /* The older form: storage, pool and job. */
        so = (stash_service_opts){.sz = sizeof so,
                                  .storage = STASH_STORAGE_RADOS,
                                  .dir = local,
                                  .ceph_conf = conf,
                                  .job = "wordcount"};
        cr_assert_eq(stash_service_start(name, &so, &svc), -EINVAL);
        cr_assert(strstr(stash_errmsg(), "pool"), "%s", stash_errmsg());
        so.pool = container;
        cr_assert_eq(stash_service_start(name, &so, &svc), 0, "%s", stash_errmsg());
        cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
        check_all(w, 1000, 4);
        stash_worker_close(w);
        stash_service_stop(svc);
        stash_arena_destroy(name, NULL);
    }
    ckpt_storage_close(r);
}

/* The storage fails a checkpoint's data file on its way up (an injected
 * fault: a part written, then a part read): the checkpoint fails, named,
 * and leaves nothing, the one before stays the newest, and the next one
 * completes; a restore that cannot read loses nothing either. */
Test(storage, a_storage_failing_mid_checkpoint_or_mid_restore_loses_nothing_committed,
     .init = start)
{
    char name[96], local[256], url[256], want[300];
    snprintf(local, sizeof local, "%s/local", dir);
    stash_arena *a = test_arena_create("faults", 16u << 20, 32, name);
    stash_service_opts so = svc_opts(local, url, "faulty");
    stash_service *svc;
    cr_assert_eq(setenv("STASH_STORAGE_FAULT", "bad", 1), 0);
    cr_assert_eq(stash_service_start(name, &so, &svc), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "STASH_STORAGE_FAULT"), "%s", stash_errmsg());
    /* The second write fails: the first checkpoint's data file goes up,
     * its metadata does not. */
    cr_assert_eq(setenv("STASH_STORAGE_FAULT", "write:2:EIO", 1), 0);
    cr_assert_eq(stash_service_start(name, &so, &svc), 0, "%s", stash_errmsg());
    unsetenv("STASH_STORAGE_FAULT");
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    stash_checkpoint_info info;
    put_all(w, 1000, 1);
    cr_assert_neq(test_checkpoint_at_barriers(a, &w, 1, &info), 0);
    snprintf(want, sizeof want, "not in %s://%s", scheme(), container);
    cr_assert(strstr(info.detail, want), "%s", info.detail);
    cr_assert(strstr(info.detail, "injected"), "%s", info.detail);
    snprintf(want, sizeof want, "%s/chk-%llu", local, (unsigned long long)info.id);
    cr_assert_eq(access(want, F_OK), -1, "%s left", want);
    ckpt_storage *r = connect_to(container, 0);
    uint64_t id;
    cr_assert_eq(ckpt_storage_latest(r, "faulty", &id), -ENOENT, "no checkpoint is complete");
    put_all(w, 1000, 2);
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
    cr_assert_eq(latest_of("faulty"), info.id);
    /* Lost, and restored by a service whose storage fails the second read:
     * it does not start; without the fault, it restores every key. */
    lose_all(name, a, w, svc, local);
    cr_assert_eq(setenv("STASH_STORAGE_FAULT", "read:2:EIO", 1), 0);
    cr_assert_neq(stash_service_start(name, &so, &svc), 0);
    cr_assert(strstr(stash_errmsg(), "injected"), "%s", stash_errmsg());
    unsetenv("STASH_STORAGE_FAULT");
    cr_assert_eq(stash_service_start(name, &so, &svc), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    check_all(w, 1000, 2);
    stash_worker_close(w);
    stash_service_stop(svc);
    stash_arena_destroy(name, NULL);
    test_remove_dir(local);
    cr_assert_eq(ckpt_storage_remove_prefix(r, "faulty/"), 0, "%s", stash_errmsg());
    ckpt_storage_close(r);
}

/* Values of 240 bytes, each naming its key and mult. */
static void wide_value(uint64_t k, uint64_t mult, uint8_t *out)
{
    for (size_t i = 0; i < 240; i += 16) {
        memcpy(out + i, &k, 8);
        uint64_t m = mult + i;
        memcpy(out + i + 8, &m, 8);
    }
}

static void wide_all(stash_worker *w, uint64_t n, uint64_t mult, bool check)
{
    stash_state *v;
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "wide",
                                                     .kind = STASH_VALUE},
                                 &v),
                 0);
    uint8_t want[240];
    for (uint64_t k = 0; k < n; k++) {
        stash_key_set(w, &k, sizeof k);
        wide_value(k, mult, want);
        if (!check) {
            cr_assert_eq(stash_value_put(v, want, sizeof want), 0, "%s", stash_errmsg());
            continue;
        }
        stash_bytes b;
        cr_assert_eq(stash_value_get(v, &b), 0, "key %llu", (unsigned long long)k);
        cr_assert(b.len == sizeof want && memcmp(b.data, want, sizeof want) == 0, "key %llu",
                  (unsigned long long)k);
    }
}

/* Whether directory path holds an entry whose name starts with prefix. */
static bool holds(const char *path, const char *prefix)
{
    DIR *d = opendir(path);
    bool found = false;
    for (struct dirent *e; d && !found && (e = readdir(d));)
        found = strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d) closedir(d);
    return found;
}

/* A lost arena comes back straight from the storage, each key group put
 * in once its blocks have arrived: a checkpoint of several parts whose
 * last block is damaged fails the start, named, after key groups before it
 * went in, and leaves no arena and no copy in the directory; whole again,
 * it restores every key and leaves its copy. */
Test(storage, a_restore_as_the_bytes_arrive_leaves_nothing_when_a_late_block_is_damaged,
     .init = start)
{
    char name[96], local[256], url[256], file[300];
    snprintf(local, sizeof local, "%s/local", dir);
    stash_arena *a = test_arena_create("arrive", 96u << 20, 32, name);
    stash_service_opts so = svc_opts(local, url, "arrive");
    stash_service *svc;
    cr_assert_eq(stash_service_start(name, &so, &svc), 0, "%s", stash_errmsg());
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    const uint64_t keys = 60000; /* ~16 MB of blocks: parts of 4 or 5 MiB */
    wide_all(w, keys, 7, false);
    stash_checkpoint_info info;
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
    lose_all(name, a, w, svc, local);
    ckpt_storage *r = connect_to(container, 0);
    snprintf(file, sizeof file, "arrive/chk-%llu/kg-data.dat", (unsigned long long)info.id);
    uint8_t *good, *bad;
    size_t len;
    cr_assert_eq(ckpt_storage_read_file(r, file, 64u << 20, &good, &len), 0, "%s", stash_errmsg());
    cr_assert_gt(len, 2 * (size_t)r->part, "a file of three parts or more");
    bad = malloc(len);
    memcpy(bad, good, len);
    bad[len - 100] ^= 0x40; /* in the last key group's block */
    cr_assert_eq(ckpt_storage_write_file(r, file, bad, len), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_service_start(name, &so, &svc), STASH_ECORRUPT, "%s", stash_errmsg());
    cr_assert(strstr(stash_errmsg(), "kg-data.dat") && strstr(stash_errmsg(), "offset"), "%s",
              stash_errmsg());
    cr_assert_eq(stash_arena_open(name, NULL, &a), -ENOENT, "no arena is left");
    char chk[64];
    snprintf(chk, sizeof chk, "chk-%llu", (unsigned long long)info.id);
    cr_assert(!holds(local, chk) && !holds(local, ".fetch-"), "no copy left in %s", local);
    /* The first block's header damaged (its record count): named too. */
    memcpy(bad, good, len);
    bad[16] ^= 0x40;
    cr_assert_eq(ckpt_storage_write_file(r, file, bad, len), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_service_start(name, &so, &svc), STASH_ECORRUPT, "%s", stash_errmsg());
    cr_assert(strstr(stash_errmsg(), "header checksum") && strstr(stash_errmsg(), "offset 0"), "%s",
              stash_errmsg());
    cr_assert_eq(stash_arena_open(name, NULL, &a), -ENOENT, "no arena is left");
    cr_assert(!holds(local, chk) && !holds(local, ".fetch-"), "no copy left in %s", local);
    /* Whole again: every key, and the directory's copy, byte for byte
     * (written from memory with O_DIRECT, its last page padded and cut),
     * on a disk and in memory. */
    cr_assert_eq(ckpt_storage_write_file(r, file, good, len), 0, "%s", stash_errmsg());
    char shm_local[256];
    snprintf(shm_local, sizeof shm_local, "/dev/shm/stash-test-arrive-%d", (int)getpid());
    const char *locals[] = {local, shm_local};
    for (int i = 0; i < 2; i++) {
        so.dir = locals[i];
        cr_assert_eq(stash_service_start(name, &so, &svc), 0, "%s", stash_errmsg());
        cr_assert_eq(stash_arena_open(name, NULL, &a), 0, "%s", stash_errmsg());
        cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
        wide_all(w, keys, 7, true);
        char copy[400];
        snprintf(copy, sizeof copy, "%s/%s/kg-data.dat", locals[i], chk);
        uint8_t *back = malloc(len + 1);
        int fd = open(copy, O_RDONLY | O_CLOEXEC);
        cr_assert_geq(fd, 0, "%s", copy);
        cr_assert_eq(read(fd, back, len + 1), (ssize_t)len, "%s: its length", copy);
        cr_assert_eq(memcmp(back, good, len), 0, "%s: the bytes of the storage's", copy);
        close(fd);
        free(back);
        snprintf(copy, sizeof copy, "%s/%s/_metadata", locals[i], chk);
        cr_assert_eq(access(copy, F_OK), 0, "%s", copy);
        cr_assert(!holds(locals[i], ".fetch-"), "no staging left in %s", locals[i]);
        if (i == 0) {
            /* The arena lost, the directory kept but its copy damaged: the
             * storage's is read in its place, and the copy made whole. */
            stash_worker_close(w);
            stash_service_stop(svc);
            stash_arena_close(a);
            stash_arena_destroy(name, NULL);
            snprintf(copy, sizeof copy, "%s/%s/kg-data.dat", locals[i], chk);
            fd = open(copy, O_RDWR | O_CLOEXEC);
            cr_assert_eq(pwrite(fd, "\xff", 1, (off_t)(len / 2)), 1);
            close(fd);
            cr_assert_eq(stash_service_start(name, &so, &svc), 0, "%s", stash_errmsg());
            cr_assert_eq(stash_arena_open(name, NULL, &a), 0, "%s", stash_errmsg());
            cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
            wide_all(w, keys, 7, true);
            back = malloc(len);
            fd = open(copy, O_RDONLY | O_CLOEXEC);
            cr_assert_eq(read(fd, back, len), (ssize_t)len);
            cr_assert_eq(memcmp(back, good, len), 0, "%s made whole", copy);
            close(fd);
            free(back);
        }
        lose_all(name, a, w, svc, locals[i]);
    }
    cr_assert_eq(ckpt_storage_remove_prefix(r, "arrive/"), 0, "%s", stash_errmsg());
    ckpt_storage_close(r);
    free(good);
    free(bad);
}

/* The crash campaign with its checkpoints in the storage too: writes and
 * reads of the storage failed, machines lost with their directory and
 * restored straight from the storage, every key checked at every start. */
Test(storage, the_crash_campaign_loses_nothing_with_checkpoints_in_the_storage, .init = start,
     .timeout = 600)
{
    char cmd[2048], out[300];
    snprintf(out, sizeof out, "%s/crash.out", dir);
    snprintf(cmd, sizeof cmd,
             "CEPH_CONF=%s TMPDIR=%s %s --storage %s --events 10 --backend heap >%s 2>&1", conf,
             dir, STASH_CRASH, url_of("crash"), out);
    int rc = system(cmd);
    FILE *f = fopen(out, "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f))
        if (rc != 0 || strstr(line, "events (")) fputs(line, stderr);
    if (f) fclose(f);
    cr_assert_eq(WEXITSTATUS(rc), 0, "stash-crash failed (its output above)");
}

Test(storage, the_snapshot_tool_reads_and_writes_storage_urls, .init = start)
{
    char name[96], local[256], args[1024], sp[300], url[256];
    static char out[65536];
    setenv("CEPH_CONF", conf, 1);
    snprintf(local, sizeof local, "%s/local", dir);
    stash_arena *a = test_arena_create("storageurl", 16u << 20, 16, name);
    stash_service_opts so = svc_opts(local, url, "urls");
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
    /* ls, verify, info and dump of what is in the storage. */
    const char *S = scheme();
    snprintf(args, sizeof args, "snapshot ls %s://%s/urls --json", S, container);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    char want[128];
    snprintf(want, sizeof want, "{\"id\": %llu, \"state\": \"complete\", \"latest\": true",
             (unsigned long long)info.id);
    cr_assert(strstr(out, want), "%s", out);
    snprintf(args, sizeof args, "snapshot verify %s://%s/urls", S, container);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "100 records"), "%s", out);
    snprintf(args, sizeof args, "snapshot dump %s://%s/urls/chk-%llu", S, container,
             (unsigned long long)info.id);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    unsigned lines = 0;
    for (char *p = out; (p = strstr(p, "{\"kg\": ")); p++) lines++;
    cr_assert_eq(lines, 100);
    snprintf(args, sizeof args, "snapshot info %s://%s/nosuch", S, container);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 1);
    snprintf(want, sizeof want, "%s://%s/nosuch/latest", S, container);
    cr_assert(strstr(out, want), "%s", out);
    /* A savepoint copied down to a directory and up into the storage again. */
    snprintf(sp, sizeof sp, "%s/savepoint-%llu", dir, (unsigned long long)info.id);
    snprintf(args, sizeof args, "snapshot rewrite %s://%s/urls %s", S, container, sp);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    snprintf(args, sizeof args, "snapshot rewrite %s %s://%s/moved/savepoint-%llu", sp, S,
             container, (unsigned long long)info.id);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "exists already"), "%s", out);
    /* A job starts from the savepoint in the storage. */
    char restore[300];
    snprintf(restore, sizeof restore, "%s://%s/moved/savepoint-%llu", S, container,
             (unsigned long long)info.id);
    test_remove_dir(local);
    stash_service_opts fs = {.sz = sizeof(stash_service_opts), .dir = local, .restore = restore};
    cr_assert_eq(stash_service_start(name, &fs, &svc), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    check_all(w, 100, 7);
    stash_worker_close(w);
    stash_service_stop(svc);
    stash_arena_destroy(name, NULL);
    snprintf(args, sizeof args, "snapshot rewrite %s://%s/urls %s://%s/urls/chk-99", S, container,
             S, container);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "savepoint"), "%s", out);
    /* Damage in the storage is named: the data file of the checkpoint. */
    ckpt_storage *r = connect_to(container, 0);
    char file[128];
    snprintf(file, sizeof file, "urls/chk-%llu/kg-data.dat", (unsigned long long)info.id);
    uint8_t *bytes;
    size_t len;
    cr_assert_eq(ckpt_storage_read_file(r, file, 64u << 20, &bytes, &len), 0, "%s", stash_errmsg());
    bytes[len / 2] ^= 0x40;
    cr_assert_eq(ckpt_storage_write_file(r, file, bytes, len), 0, "%s", stash_errmsg());
    free(bytes);
    ckpt_storage_close(r);
    snprintf(args, sizeof args, "snapshot verify %s://%s/urls", S, container);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "kg-data.dat"), "%s", out);
}

Test(storage, the_bench_measures_the_storage_beside_its_own_client, .init = start)
{
    static char out[65536];
    char args[256], want[12][128];
    const char *S = scheme(), *peer = on_s3() ? "awscli" : "rados-bench";
    setenv("CEPH_CONF", conf, 1);
    snprintf(args, sizeof args, "bench checkpoint --storage %s --%s %s --quick --reps 1 --json", S,
             on_s3() ? "bucket" : "pool", container);
    int rc = test_run_stash(args, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", out);
    static const char *const lines[][2] = {
        {"write", "stash"},         {"restore", "stash"},
        {"write", "stash-upload"},  {"write", "stash-local-write"},
        {"restore", "stash-fetch"}, {"restore", "stash-local-restore"}};
    size_t n = 0;
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        snprintf(want[n++], sizeof want[0], "\"case\": \"%s/%s\", \"system\": \"%s\"", S,
                 lines[i][0], lines[i][1]);
    /* The peer measured, or said to be skipped (awscli is the bench's, not the tests'). */
    snprintf(want[n++], sizeof want[0], "\"case\": \"%s/write\", \"system\": \"%s\"", S, peer);
    for (size_t i = 0; i < n; i++) cr_assert(strstr(out, want[i]), "%s not in %s", want[i], out);
    /* The job's objects are gone, and the pool holds what it held. */
    ckpt_storage *r = connect_to(container, 0);
    unsigned left = count_prefix(r, "stash-bench-");
    cr_assert_eq(left, 0, "%u files of the bench left", left);
    ckpt_storage_close(r);
    snprintf(args, sizeof args, "bench checkpoint --storage %s", S);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "go together"), "%s", out);
    snprintf(args, sizeof args, "bench keyed --storage rados --pool %s", container);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 2, "%s", out);
}

Test(storage, an_incremental_chain_goes_up_once_a_file_and_comes_back_whole, .init = start)
{
    char name[96], local[256];
    snprintf(local, sizeof local, "%s/local", dir);
    stash_arena *a = test_arena_create("radosinc", 16u << 20, 32, name);
    char url[256];
    stash_service_opts so = svc_opts(local, url, "chain");
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
    snprintf(args, sizeof args, "snapshot verify %s://%s/chain/chk-%llu", scheme(), container,
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
    ckpt_storage *r = connect_to(container, 0);
    cr_assert_eq(retained(r, "chain/shared/", count_prefix, 4), 4, "each shared file once");
    cr_assert_eq(retained(r, "chain", checkpoints_of, 2), 2, "two kept");
    ckpt_storage_close(r);
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

Test(storage, a_stale_engine_never_writes_over_a_newer_one, .init = start)
{
    char a_name[96], b_name[112], a_dir[256], b_dir[256], args[256];
    static char out[65536];
    setenv("CEPH_CONF", conf, 1);
    snprintf(a_dir, sizeof a_dir, "%s/a", dir);
    snprintf(b_dir, sizeof b_dir, "%s/b", dir);
    stash_arena *a = test_arena_create("radosa", 16u << 20, 16, a_name);
    char url[256];
    stash_service_opts so = svc_opts(a_dir, url, "twice");
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
    snprintf(args, sizeof args, "snapshot dump %s://%s/twice --format hex", scheme(), container);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"value\": \"c600000000000000\""), "key 99's 198: %.2000s", out);
    snprintf(args, sizeof args, "snapshot verify %s://%s/twice", scheme(), container);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
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
static int write_until_refused(ckpt_storage *r)
{
    for (int i = 0; i < 600; i++) {
        char name[64];
        snprintf(name, sizeof name, "full/%d", i);
        int rc = ckpt_storage_write_file(r, name, "x", 1);
        if (rc < 0) return rc;
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* Sets the quota of the test's bucket to max_bytes (0: none). */
static int bucket_quota(uint64_t max_bytes)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "timeout 60 radosgw-admin -c %s -n client.rgw.x quota set --quota-scope=bucket "
             "--bucket=%s --max-size=%llu >/dev/null 2>&1 && timeout 60 radosgw-admin -c %s "
             "-n client.rgw.x quota %s --quota-scope=bucket --bucket=%s >/dev/null 2>&1",
             conf, container, (unsigned long long)(max_bytes ? max_bytes : 1), conf,
             max_bytes ? "enable" : "disable", container);
    return WEXITSTATUS(system(cmd));
}

/* A bucket past its quota (radosgw's, as MinIO and other services have
 * them; AWS has none): a write, a part or a checkpoint refused at once,
 * named as full, not as a refusal of the credentials; under it again, the
 * next checkpoint goes in. */
static void full_bucket(ckpt_storage *r, stash_arena *a, stash_worker **w)
{
    cr_assert_eq(bucket_quota(1024), 0);
    size_t len = (size_t)r->part * 2;
    uint8_t *data = calloc(1, len);
    cr_assert_eq(ckpt_storage_write_file(r, "full/one", data, 3u << 20), -EDQUOT, "%s",
                 stash_errmsg());
    cr_assert(strstr(stash_errmsg(), "the bucket is full"), "%s", stash_errmsg());
    cr_assert_eq(ckpt_storage_write_file(r, "full/parts", data, len), -EDQUOT, "%s",
                 stash_errmsg());
    free(data);
    stash_checkpoint_info info;
    put_all(*w, 100, 2);
    cr_assert_neq(test_checkpoint_at_barriers(a, w, 1, &info), 0);
    cr_assert(strstr(info.detail, "the bucket is full"), "%s", info.detail);
    cr_assert_eq(bucket_quota(0), 0);
    cr_assert_eq(test_checkpoint_at_barriers(a, w, 1, &info), 0, "%s", info.detail);
}

Test(storage, a_full_pool_is_said_so_at_once, .init = start_own_on_rados)
{
    /* A write that waited for space would end in its timeout (ETIMEDOUT). */
    ckpt_storage *r = connect_to(container, 0);
    char name[96], local[256];
    snprintf(local, sizeof local, "%s/local", dir);
    stash_arena *a = test_arena_create("full", 16u << 20, 32, name);
    char url[256];
    stash_service_opts so = svc_opts(local, url, "full");
    stash_service *svc;
    cr_assert_eq(stash_service_start(name, &so, &svc), 0, "%s", stash_errmsg());
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    stash_checkpoint_info info;
    put_all(w, 100, 1);
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
    if (on_s3()) {
        full_bucket(r, a, &w);
        stash_worker_close(w);
        stash_service_stop(svc);
        stash_arena_close(a);
        stash_arena_destroy(name, NULL);
        ckpt_storage_close(r);
        return;
    }

    /* The pool's quota reached. */
    char quota[128];
    snprintf(quota, sizeof quota, "osd pool set-quota %s max_objects 8", container);
    cr_assert_eq(ceph_cli(quota), 0);
    int rc = write_until_refused(r);
    cr_assert_eq(rc, -EDQUOT, "%d: %s", rc, stash_errmsg());
    cr_assert(strstr(stash_errmsg(), "the pool is full (its quota is reached)"), "%s",
              stash_errmsg());
    put_all(w, 100, 2);
    cr_assert_neq(test_checkpoint_at_barriers(a, &w, 1, &info), 0);
    cr_assert(strstr(info.detail, "the pool is full"), "%s", info.detail);
    snprintf(quota, sizeof quota, "osd pool set-quota %s max_objects 0", container);
    cr_assert_eq(ceph_cli(quota), 0);

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
    ckpt_storage_close(r);
}
