/* SPDX-License-Identifier: MIT */
/*
 * helpers.c: shared test helpers (see helpers.h).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers.h"

const char *test_arena_name(const char *tag)
{
    static _Thread_local char name[96];
    static _Thread_local unsigned n;
    /* A pid comes back, and with it the name an arena a killed test left
     * behind has: a random part keeps a later test clear of it. */
    static _Thread_local uint32_t nonce;
    if (!nonce && getrandom(&nonce, sizeof nonce, 0) != sizeof nonce) nonce = (uint32_t)time(NULL);
    snprintf(name, sizeof name, "t-%s-%d-%08x-%u", tag, (int)getpid(), nonce, n++);
    return name;
}

stash_backend test_backend(void)
{
    const char *b = getenv("STASH_TEST_BACKEND");
    return b && strcmp(b, "lmdb") == 0 ? STASH_BACKEND_LMDB : STASH_BACKEND_HEAP;
}

stash_arena *test_arena_create(const char *tag, uint64_t size, uint32_t maxp, char *name_out)
{
    const char *name = test_arena_name(tag);
    stash_arena *a = NULL;
    int rc = stash_arena_create(name,
                                &(stash_arena_opts){.sz = sizeof(stash_arena_opts),
                                                    .size = size,
                                                    .max_parallelism = maxp,
                                                    .backend = test_backend()},
                                &a);
    cr_assert_eq(rc, 0, "create %s: %s (%s)", name, stash_strerror(rc), stash_errmsg());
    if (name_out) snprintf(name_out, 96, "%s", name);
    return a;
}

pid_t test_fork(int (*fn)(void *arg), void *arg)
{
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork");
    if (pid == 0) {
        /* A test that fails before it reaps its child must not leave it running. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        _exit(fn(arg));
    }
    return pid;
}

pid_t test_kill_running(int (*fn)(void *arg), void *arg, int ready_fd, unsigned min_us,
                        unsigned max_us)
{
    pid_t pid = test_fork(fn, arg);
    char c;
    cr_assert_eq(read(ready_fd, &c, 1), 1, "the child (pid %d) started", (int)pid);
    usleep(min_us + (max_us > min_us ? (useconds_t)rand() % (max_us - min_us) : 0));
    kill(pid, SIGKILL);
    cr_assert_eq(test_wait(pid), 128 + SIGKILL, "the child (pid %d) died of the kill", (int)pid);
    return pid;
}

const shm_dir *test_ckpt_dir(const char *path)
{
    static shm_dir slots[16] = {[0 ... 15] = {.fd = -1}};
    static _Atomic unsigned next;
    shm_dir *d = &slots[atomic_fetch_add(&next, 1) % 16];
    shm_dir_close(d);
    cr_assert_eq(shm_dir_open(path, SHM_DIR_OWN | SHM_DIR_CREATE, d), 0, "%s", stash_errmsg());
    return d;
}

void test_remove_dir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

size_t test_seal(uint8_t *buf, size_t len, uint64_t stamp)
{
    memset(buf, (int)(stamp & 0xff), len - 8);
    uint64_t h = XXH3_64bits(buf, len - 8);
    memcpy(buf + len - 8, &h, 8);
    return len;
}

bool test_sealed(const void *p, size_t len)
{
    uint64_t h;
    if (len < 16) return false;
    memcpy(&h, (const uint8_t *)p + len - 8, 8);
    return XXH3_64bits(p, len - 8) == h;
}

int test_wait(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0) {
    }
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

void test_await_serving(const char *name, pid_t pid)
{
    for (int i = 0; i < 30000; i++) {
        stash_arena *a;
        int32_t serving = 0;
        if (stash_arena_open(name, NULL, &a) == 0) {
            shm_service_alive(a, &serving);
            stash_arena_close(a);
        }
        if (serving == pid) return;
        int st;
        cr_assert_eq(waitpid(pid, &st, WNOHANG), 0, "pid %d exited before serving %s", (int)pid,
                     name);
        usleep(2000);
    }
    cr_assert_fail("pid %d never served %s", (int)pid, name);
}

int test_run_stash(const char *args, char *out, size_t cap)
{
    return test_run_stash_within(args, 0, out, cap);
}

int test_run_stash_within(const char *args, unsigned seconds, char *out, size_t cap)
{
    char cmd[1024], limit[32] = "";
    if (seconds) snprintf(limit, sizeof limit, "timeout %u ", seconds);
    snprintf(cmd, sizeof cmd, "%s%s %s 2>&1", limit, STASH_BIN, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p, "popen %s", cmd);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

unsigned test_seed(const char *test)
{
    const char *env = getenv("STASH_TEST_SEED");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)(ts.tv_sec ^ ts.tv_nsec);
    fprintf(stderr, "%s: seed %u (replay with STASH_TEST_SEED=%u)\n", test, seed, seed);
    return seed;
}

struct test_pending {
    stash_arena *a;
    stash_checkpoint_info *out;
    int rc;
    atomic_bool done;
    pthread_t thread;
};

static void *request_checkpoint(void *arg)
{
    test_pending *p = arg;
    p->rc = stash_checkpoint(p->a, 60000, p->out);
    atomic_store(&p->done, true);
    return NULL;
}

test_pending *test_checkpoint_begin(stash_arena *a, stash_checkpoint_info *out)
{
    test_pending *p = calloc(1, sizeof *p);
    cr_assert_not_null(p);
    p->a = a;
    p->out = out;
    cr_assert_eq(pthread_create(&p->thread, NULL, request_checkpoint, p), 0);
    return p;
}

bool test_checkpoint_done(const test_pending *p)
{
    return atomic_load(&p->done);
}

int test_checkpoint_end(test_pending *p)
{
    pthread_join(p->thread, NULL);
    int rc = p->rc;
    free(p);
    return rc;
}

int test_checkpoint_at_failing_barriers(stash_arena *a, stash_worker *const *w, size_t n,
                                        stash_checkpoint_info *out, int *barrier_rc)
{
    test_pending *p = test_checkpoint_begin(a, out);
    stash_event ev;
    *barrier_rc = 0;
    while (!test_checkpoint_done(p))
        for (size_t i = 0; i < n; i++) {
            int rc = stash_barrier(w[i], &ev);
            if (rc < 0 && *barrier_rc == 0) *barrier_rc = rc;
        }
    return test_checkpoint_end(p);
}

int test_checkpoint_at_barriers(stash_arena *a, stash_worker *const *w, size_t n,
                                stash_checkpoint_info *out)
{
    int barrier_rc;
    int rc = test_checkpoint_at_failing_barriers(a, w, n, out, &barrier_rc);
    cr_assert_eq(barrier_rc, 0, "a barrier failed: %s", stash_strerror(barrier_rc));
    return rc;
}

int test_sum_reduce(const stash_bytes *acc, const stash_bytes *in, void *out, size_t cap,
                    size_t *len, void *ctx)
{
    (void)ctx;
    *len = sizeof(uint64_t);
    if (cap < *len) return -ENOSPC;
    uint64_t r = (acc->len ? test_u64(acc->data) : 0) + test_u64(in->data);
    memcpy(out, &r, sizeof r);
    return 0;
}

char test_ceph_dir[128], test_ceph_conf[256], test_ceph_container[64];
/* The cluster's directory: test_ceph_dir if the cluster is the test's own,
 * the suites' shared one's otherwise; and what the test made on the shared
 * one (a pool, or a bucket of its gateway), removed when it ends. */
static char cluster_dir[128];
static bool cluster_shared, container_bucket;

static int cluster_sh(const char *verb, const char *extra)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "sh %s/ceph/cluster.sh %s %s %s >>%s.out 2>&1", STASH_TESTS_DIR, verb,
             cluster_dir, extra, test_ceph_dir);
    return WEXITSTATUS(system(cmd));
}

/* Fails the test with what went wrong, the end of the test's log of
 * cluster.sh and of the cluster's logs named (files of its directory, or
 * NULL). */
static void cluster_failed(const char *what, const char *logs)
{
    char out[4096] = "", cmd[600];
    int n = snprintf(cmd, sizeof cmd, "tail -c 1500 %s.out", test_ceph_dir);
    if (logs)
        snprintf(cmd + n, sizeof cmd - (size_t)n, "; cd %s && tail -n 15 %s 2>&1", cluster_dir,
                 logs);
    FILE *p = popen(cmd, "r");
    size_t len = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[len] = 0;
    if (p) pclose(p);
    cr_assert_fail("%s: %s", what, out);
}

/* Names the test's directory, /tmp/stash-test-ceph-PID, its log of
 * cluster.sh beside it begun anew (one a killed test left is another's). */
static void name_test_dir(void)
{
    char out[160];
    snprintf(test_ceph_dir, sizeof test_ceph_dir, "/tmp/stash-test-ceph-%d", (int)getpid());
    snprintf(out, sizeof out, "%s.out", test_ceph_dir);
    unlink(out);
}

/* The directory of the cluster the suites share ($STASH_TEST_CEPH) if it
 * holds file (its conf, or the gateway's keys once the gateway is up);
 * else NULL: not started (a suite run by hand) or Ceph not installed. */
static const char *shared_cluster(const char *file)
{
    const char *d = getenv("STASH_TEST_CEPH");
    char path[256];
    if (!d || !*d) return NULL;
    snprintf(path, sizeof path, "%s/%s", d, file);
    return access(path, R_OK) == 0 ? d : NULL;
}

/* Joins the shared cluster in directory shared, with a pool or bucket
 * named after the test's process; made by the caller. */
static void join_shared(const char *shared)
{
    name_test_dir();
    test_remove_dir(test_ceph_dir);
    cr_assert_eq(mkdir(test_ceph_dir, 0700), 0, "%s: %s", test_ceph_dir, strerror(errno));
    /* Removed with this process whatever ends it, as a cluster of its own
     * would be by its reaper (tests/ceph/cluster.sh). */
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "setsid sh -c 'tail --pid=%d -f /dev/null; rm -rf %s %s.out' </dev/null >/dev/null "
             "2>&1 &",
             (int)getpid(), test_ceph_dir, test_ceph_dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(cluster_dir, sizeof cluster_dir, "%s", shared);
    snprintf(test_ceph_conf, sizeof test_ceph_conf, "%s/ceph.conf", cluster_dir);
    cluster_shared = true;
    /* A pid comes back (pid_max may be 32768) while the cluster lives on:
     * a random part keeps the name apart from a pool a test left. Lower
     * case, digits and dashes, as a bucket's name must be. */
    uint32_t nonce;
    if (getrandom(&nonce, sizeof nonce, 0) != sizeof nonce) nonce = (uint32_t)time(NULL);
    snprintf(test_ceph_container, sizeof test_ceph_container, "stash-%d-%08x", (int)getpid(),
             nonce);
}

void test_ceph_start_own(void)
{
    if (access("/usr/bin/ceph-mon", X_OK) != 0 || access("/usr/bin/ceph-osd", X_OK) != 0)
        cr_skip_test("Ceph is not installed (apt-get install ceph-mon ceph-osd)");
    name_test_dir();
    snprintf(cluster_dir, sizeof cluster_dir, "%s", test_ceph_dir);
    snprintf(test_ceph_conf, sizeof test_ceph_conf, "%s/ceph.conf", test_ceph_dir);
    snprintf(test_ceph_container, sizeof test_ceph_container, "stash");
    cluster_shared = false;
    char port[64];
    snprintf(port, sizeof port, "%d bluestore", 10000 + (int)getpid() % 20000);
    /* Gone with this process whatever ends it (cluster.sh's reaper). */
    char owner[32];
    snprintf(owner, sizeof owner, "%d", (int)getpid());
    setenv("CEPH_OWNER", owner, 1);
    if (cluster_sh("start", port) != 0) cluster_failed("the cluster did not start", NULL);
}

void test_ceph_start(void)
{
    const char *shared = shared_cluster("ceph.conf");
    if (!shared) {
        test_ceph_start_own();
        return;
    }
    join_shared(shared);
    container_bucket = false;
    if (cluster_sh("pool", test_ceph_container) != 0)
        cluster_failed("no pool could be made on the shared cluster", "mon.a.log");
}

int test_ceph(const char *verb)
{
    cr_assert(!cluster_shared,
              "cluster.sh %s would disturb every test on the shared cluster: the test starts "
              "its own (test_ceph_start_own)",
              verb);
    return cluster_sh(verb, "");
}

/* Sets the environment from the gateway's s3.env (AWS_*=...). */
static void s3_environment(void)
{
    char path[300], line[512];
    snprintf(path, sizeof path, "%s/s3.env", cluster_dir);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s: %s", path, strerror(errno));
    while (fgets(line, sizeof line, f)) {
        char *eq = strchr(line, '='), *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (!eq) continue;
        *eq = 0;
        setenv(line, eq + 1, 1);
    }
    fclose(f);
}

void test_s3_start_own(void)
{
    if (access("/usr/bin/radosgw", X_OK) != 0)
        cr_skip_test("Ceph's S3 gateway is not installed (apt-get install radosgw)");
    test_ceph_start_own();
    char port[32];
    /* Below the kernel's ephemeral ports (32768 on), which a client's
     * connection may hold, and above the monitors' (10000 to 29999). */
    snprintf(port, sizeof port, "%d", 30000 + (int)getpid() % 2768);
    if (cluster_sh("rgw-start", port) != 0)
        cluster_failed("the S3 gateway did not start", "rgw.log rgw.out");
    s3_environment();
}

void test_s3_start(void)
{
    if (access("/usr/bin/radosgw", X_OK) != 0)
        cr_skip_test("Ceph's S3 gateway is not installed (apt-get install radosgw)");
    const char *shared = shared_cluster("s3.env");
    if (!shared) {
        test_s3_start_own();
        return;
    }
    join_shared(shared);
    container_bucket = true;
    s3_environment();
    if (cluster_sh("bucket", test_ceph_container) != 0)
        cluster_failed("no bucket could be made on the shared gateway", "rgw.log");
}

void test_ceph_stop(void)
{
    if (!test_ceph_dir[0]) return;
    /* What is left on the shared cluster goes with the cluster at the run's
     * end: a pool or bucket that could not be removed fails no test. */
    if (cluster_shared)
        cluster_sh(container_bucket ? "bucket-rm" : "pool-rm", test_ceph_container);
    else
        cluster_sh("destroy", "");
    test_remove_dir(test_ceph_dir);
    char out[160];
    snprintf(out, sizeof out, "%s.out", test_ceph_dir);
    unlink(out);
}
