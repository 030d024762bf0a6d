/* SPDX-License-Identifier: MIT */
/*
 * helpers.h: what the test suites share: unique arena names, child processes
 * that report through their exit status (killed while they run), and
 * waiting for them, values that carry their own checksum, removing a
 * directory.
 */
#ifndef STASH_TEST_HELPERS_H
#define STASH_TEST_HELPERS_H

#include <errno.h>
#include <stdbool.h>
#include <sys/types.h>

#include "backends/state/state.h"

/* Views into the arena carry no alignment: read typed values through memcpy. */
static inline int test_int(const void *p)
{
    int v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}
static inline uint64_t test_u64(const void *p)
{
    uint64_t v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}
static inline double test_double(const void *p)
{
    double v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

/* A name unique to this process and call: "t-<tag>-<pid>-<n>". */
const char *test_arena_name(const char *tag);
/* Creates an arena of size bytes (0: default) under a unique name; asserts. */
/* The backend the suites run on: lmdb if STASH_TEST_BACKEND=lmdb, else heap. */
stash_backend test_backend(void);
stash_arena *test_arena_create(const char *tag, uint64_t size, uint32_t maxp, char *name_out);
/* Forks a child that runs fn(arg) and _exits with its return value; the
 * child is killed if the test process ends first. */
pid_t test_fork(int (*fn)(void *arg), void *arg);
/* Forks fn(arg), waits for the byte it writes to ready_fd's other end once
 * it runs, lets it run from min_us to max_us more (at random: rand()),
 * kills it with SIGKILL and reaps it, asserting that the kill ended it.
 * Returns its pid. */
pid_t test_kill_running(int (*fn)(void *arg), void *arg, int ready_fd, unsigned min_us,
                        unsigned max_us);
/* The checkpoint directory at path, opened (made if missing) as the engine
 * opens its own; asserts. Each call opens it anew into one of a few slots
 * that later calls reuse. */
const shm_dir *test_ckpt_dir(const char *path);
/* Removes the directory dir and everything in it; asserts it went. */
void test_remove_dir(const char *dir);
/* Fills buf with len (>= 16) bytes of stamp that end in an 8-byte
 * checksum of the rest; returns len. test_sealed() says whether bytes are
 * whole such a value: a torn read is not. */
size_t test_seal(uint8_t *buf, size_t len, uint64_t stamp);
bool test_sealed(const void *p, size_t len);
/* A reduce function over 8-byte unsigned sums (an absent accumulator is 0). */
int test_sum_reduce(const stash_bytes *acc, const stash_bytes *in, void *out, size_t cap,
                    size_t *len, void *ctx);
/* Waits for pid; returns its exit code, or 128 + signal if it was killed. */
int test_wait(pid_t pid);
/* Returns once process pid, a child of this one, serves arena name (its
 * engine has claimed the arena); fails the test if pid exits first or does
 * not serve within a minute. */
void test_await_serving(const char *name, pid_t pid);
/* Asks for a checkpoint of arena a (stash_checkpoint, 60 s at most) from
 * another thread: test_checkpoint_done() says whether it finished,
 * test_checkpoint_end() waits for it and returns what it returned. */
typedef struct test_pending test_pending;
test_pending *test_checkpoint_begin(stash_arena *a, stash_checkpoint_info *out);
bool test_checkpoint_done(const test_pending *p);
int test_checkpoint_end(test_pending *p);
/* Asks for a checkpoint of arena a from another thread while the n workers
 * w (of this thread) reach barriers, until it has finished; returns what
 * stash_checkpoint() returned, with *out set. */
int test_checkpoint_at_barriers(stash_arena *a, stash_worker *const *w, size_t n,
                                stash_checkpoint_info *out);
/* As test_checkpoint_at_barriers(), keeping the first error a barrier
 * returned in *barrier_rc (0 if none) where the other asserts there is none. */
int test_checkpoint_at_failing_barriers(stash_arena *a, stash_worker *const *w, size_t n,
                                        stash_checkpoint_info *out, int *barrier_rc);
/* The seed of a random test: $STASH_TEST_SEED to replay one, else the
 * clock's; printed with the test's name so that a failure can be replayed. */
unsigned test_seed(const char *test);
/* Runs this build's stash binary with args (stderr joined to stdout); returns
 * its exit code, or 128 if it did not exit, with its output in out. */
int test_run_stash(const char *args, char *out, size_t cap);
/* As test_run_stash(), killing it after seconds (0: never): a command
 * that should answer at once and hangs fails the test instead. */
int test_run_stash_within(const char *args, unsigned seconds, char *out, size_t cap);

/* The Ceph cluster a test runs against (tests/ceph/cluster.sh: one
 * monitor, one OSD on BlueStore in a sparse file and a manager, on
 * 127.0.0.1). test_ceph_start() joins the cluster the suites share (ctest
 * starts it once for the run and names its directory in $STASH_TEST_CEPH:
 * tests/CMakeLists.txt) with a pool of the test's own, or starts one of
 * the test's own where there is none (a suite binary run by hand).
 * test_ceph_start_own() always starts one of the test's own, on a port of
 * its own: for a test that stops, fills or otherwise disturbs it.
 * test_ceph_dir is the test's own directory (the cluster's too, if the
 * cluster is the test's), test_ceph_conf the cluster's conf, and
 * test_ceph_container the pool (after test_s3_start, the bucket) that
 * holds the test's files: one of the test's own on the shared cluster,
 * "stash" on a cluster of its own. The test is skipped where Ceph is not
 * installed. */
extern char test_ceph_dir[128], test_ceph_conf[256], test_ceph_container[64];
void test_ceph_start(void);
void test_ceph_start_own(void);
/* Runs cluster.sh verb ("osd-stop", "osd-start", "stop", ...) on the
 * test's own cluster; returns its exit code. Fails the test on the shared
 * cluster, which every test running beside it uses. */
int test_ceph(const char *verb);
/* Stops the test's own cluster, or removes its pool or bucket from the
 * shared one, and removes test_ceph_dir (a suite's fini). */
void test_ceph_stop(void);
/* As test_ceph_start and test_ceph_start_own, with the cluster's S3
 * gateway (radosgw) and a bucket (test_ceph_container) of the gateway's
 * user: its endpoint and the user's keys set in the environment
 * (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...); the test is skipped where
 * radosgw is not installed. On its own cluster, test_ceph("rgw-stop") and
 * test_ceph("rgw-start") stop and start the gateway again. */
void test_s3_start(void);
void test_s3_start_own(void);

#endif
