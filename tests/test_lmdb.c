/* SPDX-License-Identifier: MIT */
/*
 * test_lmdb.c: what the lmdb backend adds to the suites both backends run:
 * savepoints that move between the backends, a worker killed in the middle
 * of a transaction, the bound on a worker's dirty pages, a map that grows
 * and keys it cannot hold, state several times the memory its process may
 * use, incremental checkpoints, a full disk, and several stores (workers,
 * the engine) in one process.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/checkpoint/checkpoints.h"
#include "backends/lmdb/lmdb.h"
#include "tests/helpers.h"

#define KGS 16u

/* An arena of maxp key groups, named after tag into name. */
static stash_arena *create_kgs(const char *tag, stash_backend backend, uint32_t maxp, char *name)
{
    const char *n = test_arena_name(tag);
    snprintf(name, 96, "%s", n);
    stash_arena *a;
    int rc = stash_arena_create(n,
                                &(stash_arena_opts){.sz = sizeof(stash_arena_opts),
                                                    .size = 16u << 20,
                                                    .max_parallelism = maxp,
                                                    .backend = backend},
                                &a);
    cr_assert_eq(rc, 0, "create %s: %s", n, stash_errmsg());
    return a;
}

static stash_arena *create(const char *tag, stash_backend backend, char *name)
{
    return create_kgs(tag, backend, KGS, name);
}

static void destroy(stash_arena *a, const char *name)
{
    stash_arena_close(a);
    cr_assert_eq(stash_arena_destroy(name, NULL), 0, "%s", stash_errmsg());
}

static stash_state *state(stash_worker *w, const char *name, stash_kind kind)
{
    stash_state *s;
    cr_assert_eq(
        stash_state_get(
            w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = name, .kind = kind}, &s),
        0, "%s", stash_errmsg());
    return s;
}

static void put_u64(stash_state *s, uint64_t v)
{
    cr_assert_eq(stash_value_put(s, &v, sizeof v), 0, "%s", stash_errmsg());
}

static uint64_t get_u64(stash_state *s)
{
    stash_bytes b;
    int rc = stash_value_get(s, &b);
    if (rc == STASH_ENOTFOUND) return UINT64_MAX;
    cr_assert_eq(rc, 0, "%s", stash_errmsg());
    cr_assert_eq(b.len, 8);
    return test_u64(b.data);
}

/* ---- savepoints between backends ---------------------------------------- */

#define KEYS 2000u

/* Values in two namespaces, a list and a map for every key. */
static void fill(const char *name)
{
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    stash_state *v = state(w, "v", STASH_VALUE), *l = state(w, "l", STASH_LIST),
                *m = state(w, "m", STASH_MAP);
    for (uint64_t k = 0; k < KEYS; k++) {
        stash_key_set(w, &k, sizeof k);
        stash_state_namespace(v, "", 0);
        put_u64(v, k * 3);
        stash_state_namespace(v, "ns", 2);
        put_u64(v, k * 5);
        uint64_t e[2] = {k, k + 1};
        cr_assert_eq(stash_list_add(l, &e[0], 8), 0);
        cr_assert_eq(stash_list_add(l, &e[1], 8), 0);
        cr_assert_eq(stash_map_put(m, "a", 1, &k, 8), 0);
    }
    stash_worker_close(w);
}

static void check(const char *name)
{
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    stash_state *v = state(w, "v", STASH_VALUE), *l = state(w, "l", STASH_LIST),
                *m = state(w, "m", STASH_MAP);
    for (uint64_t k = 0; k < KEYS; k++) {
        stash_key_set(w, &k, sizeof k);
        stash_state_namespace(v, "", 0);
        cr_assert_eq(get_u64(v), k * 3, "key %llu", (unsigned long long)k);
        stash_state_namespace(v, "ns", 2);
        cr_assert_eq(get_u64(v), k * 5, "key %llu", (unsigned long long)k);
        stash_iter it;
        stash_bytes e;
        cr_assert_eq(stash_list_get(l, &it), 0);
        for (uint64_t i = 0; i < 2; i++) {
            cr_assert_eq(stash_iter_next(&it, NULL, &e), 1);
            cr_assert_eq(test_u64(e.data), k + i);
        }
        cr_assert_eq(stash_iter_next(&it, NULL, &e), 0);
        cr_assert_eq(stash_map_get(m, "a", 1, &e), 0);
        cr_assert_eq(test_u64(e.data), k);
    }
    stash_worker_close(w);
}

/* A savepoint of the arena as it stands: key groups pinned, and the store's
 * cuts opened by the writer. */
static void savepoint(stash_arena *a, const char *dir, uint64_t id, ioe_engine *e)
{
    uint32_t pins[KGS] = {0};
    ckpt_opts o = {.dir = test_ckpt_dir(dir), .id = id, .savepoint = true, .engine = e};
    for (uint32_t kg = 0; kg < KGS; kg++) pins[kg] = (uint32_t)shm_table_pin(a, kg);
    ckpt_written out;
    cr_assert_eq(ckpt_write(a, pins, &o, &out), 0, "%s", stash_errmsg());
    cr_assert_eq(out.records, 4 * KEYS);
    for (uint32_t kg = 0; kg < KGS; kg++) shm_table_unpin(a, kg, pins[kg]);
}

static void restore(stash_arena *a, const char *path, ioe_engine *e)
{
    ckpt_restored out;
    cr_assert_eq(ckpt_restore_path(a, path, (stash_kg_range){0, KGS - 1}, e, NULL, &out), 0, "%s",
                 stash_errmsg());
    cr_assert_eq(out.records, 4 * KEYS);
    ckpt_restored_free(&out);
}

Test(lmdb, savepoints_move_between_the_backends, .timeout = 120)
{
    char dir[128], path[256], hn[96], ln[96], hn2[96];
    snprintf(dir, sizeof dir, "/var/tmp/stash-lmdb-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    ioe_engine *e;
    cr_assert_eq(ioe_engine_open(&(ioe_opts){0}, &e), 0);
    stash_arena *heap = create("lmsp", STASH_BACKEND_HEAP, hn);
    fill(hn);
    savepoint(heap, dir, 1, e);
    /* heap -> lmdb */
    stash_arena *lm = create("lmsp", STASH_BACKEND_LMDB, ln);
    snprintf(path, sizeof path, "%s/savepoint-1", dir);
    restore(lm, path, e);
    check(ln);
    /* lmdb -> heap */
    savepoint(lm, dir, 2, e);
    stash_arena *heap2 = create("lmsp", STASH_BACKEND_HEAP, hn2);
    snprintf(path, sizeof path, "%s/savepoint-2", dir);
    restore(heap2, path, e);
    check(hn2);
    destroy(heap, hn);
    destroy(lm, ln);
    destroy(heap2, hn2);
    ioe_engine_close(e);
    test_remove_dir(dir);
}

/* ---- a worker killed in the middle of a transaction --------------------- */

/* A writer in a child process, which writes a byte into ready when it has
 * done what it is to be killed after. */
typedef struct writer {
    const char *name;
    uint64_t puts;
    int ready;
} writer;

/* In a child: a worker of name and its value state called state. */
static int child_value(const char *name, const char *state, stash_worker **w, stash_state **v)
{
    if (stash_worker_open(name, NULL, w) < 0) return -1;
    return stash_state_get(
        *w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = state, .kind = STASH_VALUE},
        v);
}

/* Forks fn with x, waits for its byte, and kills it with -9 up to
 * most_us later (at random). */
static void kill_after_byte(int (*fn)(void *), writer *x, unsigned most_us)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    x->ready = p[1];
    test_kill_running(fn, x, p[0], 0, most_us);
    close(p[0]);
    close(p[1]);
}

/* Writes round r into every key, then commits it at a barrier, for ever:
 * a byte after each committed round. */
static int write_rounds(void *arg)
{
    writer *x = arg;
    stash_worker *w;
    stash_state *v;
    if (child_value(x->name, "r", &w, &v) < 0) return 10;
    for (uint64_t r = 1;; r++) {
        for (uint64_t k = 0; k < x->puts; k++) {
            stash_key_set(w, &k, sizeof k);
            if (stash_value_put(v, &r, sizeof r) < 0) return 12;
        }
        usleep(2 * LMDB_COMMIT_MS * 1000);
        stash_event ev;
        if (stash_barrier(w, &ev) < 0) return 13;
        if (write(x->ready, "", 1) != 1) return 14;
    }
}

Test(lmdb, a_worker_killed_mid_transaction_leaves_the_last_commit, .timeout = 120)
{
    char name[96];
    stash_arena *a = create("lmkill", STASH_BACKEND_LMDB, name);
    srand(test_seed("a_worker_killed_mid_transaction_leaves_the_last_commit"));
    for (int round = 0; round < 6; round++) {
        /* Somewhere in the middle of the next round's writes. */
        writer x = {name, KEYS, -1};
        kill_after_byte(write_rounds, &x, 20000);
        /* The replacement takes the dead one's place: every key holds the
         * same committed round, and the writer's lock is free. */
        stash_worker *w;
        cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
        stash_state *v = state(w, "r", STASH_VALUE);
        uint64_t k0 = 0, seen;
        stash_key_set(w, &k0, sizeof k0);
        seen = get_u64(v);
        cr_assert(seen != UINT64_MAX && seen >= 1, "round %d: key 0 holds round %llu", round,
                  (unsigned long long)seen);
        for (uint64_t k = 0; k < KEYS; k++) {
            stash_key_set(w, &k, sizeof k);
            cr_assert_eq(get_u64(v), seen, "round %d: key %llu", round, (unsigned long long)k);
            put_u64(v, 1000 + k);
        }
        stash_worker_close(w);
        cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
        v = state(w, "r", STASH_VALUE);
        for (uint64_t k = 0; k < KEYS; k += 97) {
            stash_key_set(w, &k, sizeof k);
            cr_assert_eq(get_u64(v), 1000 + k, "the replacement's writes were committed");
        }
        stash_worker_close(w);
    }
    destroy(a, name);
}

/* ---- the dirty pages a worker holds --------------------------------------- */

/* Puts keys 0 .. puts-1 without a barrier, says so, and waits to be killed. */
static int write_unbarred(void *arg)
{
    writer *x = arg;
    stash_worker *w;
    stash_state *v;
    if (child_value(x->name, "u", &w, &v) < 0) return 10;
    for (uint64_t k = 0; k < x->puts; k++) {
        stash_key_set(w, &k, sizeof k);
        if (stash_value_put(v, &k, sizeof k) < 0) return 12;
    }
    if (write(x->ready, "", 1) != 1) return 13;
    for (;;) pause();
}

Test(lmdb, a_workers_transactions_commit_before_their_charges_pass_the_bound, .timeout = 120)
{
    char name[96];
    stash_arena *a = create_kgs("lmcharge", STASH_BACKEND_LMDB, 128, name);
    /* Each put is charged two pages at least: this many pass the bound,
     * spread so thinly over 128 key groups that none passes its own. */
    writer x = {name, LMDB_STORE_MAX_BYTES / 8192 + 1000, -1};
    kill_after_byte(write_unbarred, &x, 0);
    /* Killed before any barrier: what it left is what the bound committed. */
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    stash_state *v = state(w, "u", STASH_VALUE);
    uint64_t found = 0;
    for (uint64_t k = 0; k < x.puts; k++) {
        stash_key_set(w, &k, sizeof k);
        stash_bytes b;
        int rc = stash_value_get(v, &b);
        cr_assert(rc == 0 || rc == STASH_ENOTFOUND, "key %llu: %s", (unsigned long long)k,
                  stash_errmsg());
        if (rc == 0) {
            cr_assert_eq(test_u64(b.data), k);
            found++;
        }
    }
    cr_assert_gt(found, 0, "%llu puts and none committed", (unsigned long long)x.puts);
    stash_worker_close(w);
    destroy(a, name);
}

/* ---- the map grows; keys it cannot hold ---------------------------------- */

Test(lmdb, the_map_grows_and_a_key_too_long_is_refused, .timeout = 120)
{
    char name[96];
    stash_arena *a = create_kgs("lmgrow", STASH_BACKEND_LMDB, 1, name);
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0);
    stash_state *v = state(w, "big", STASH_VALUE);
    /* Well past the 64 MiB an environment's map starts with, in one key group. */
    static uint8_t value[1000];
    const uint64_t n_keys = 100000;
    for (uint64_t k = 0; k < n_keys; k++) {
        memcpy(value, &k, sizeof k);
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_put(v, value, sizeof value), 0, "key %llu: %s",
                     (unsigned long long)k, stash_errmsg());
    }
    cr_assert_eq(worker_kg_entries(w, 0), (int64_t)n_keys);
    stash_worker_close(w);
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0);
    v = state(w, "big", STASH_VALUE);
    for (uint64_t k = 0; k < n_keys; k += 101) {
        stash_key_set(w, &k, sizeof k);
        stash_bytes b;
        cr_assert_eq(stash_value_get(v, &b), 0);
        cr_assert_eq(b.len, sizeof value);
        cr_assert_eq(test_u64(b.data), k);
    }
    static char key[600];
    memset(key, 'k', sizeof key);
    stash_key_set(w, key, sizeof key);
    cr_assert_eq(stash_value_put(v, "x", 1), STASH_ETOOBIG);
    cr_assert(strstr(stash_errmsg(), "lmdb stores at most"), "%s", stash_errmsg());
    stash_worker_close(w);
    destroy(a, name);
}

/* ---- state several times the memory the process may use ----------------- */

#define BUDGET (96u << 20)
#define STATE_KEYS 400000u /* of 1000 bytes: about four times the budget */

/* Puts the calling process in a memory cgroup of BUDGET bytes (v2, else
 * v1). Returns 0, or -1 where the machine has no such cgroups. */
static int limit_memory(char *group, size_t size)
{
    const char *roots[] = {"/sys/fs/cgroup", "/sys/fs/cgroup/memory"};
    const char *limits[] = {"memory.max", "memory.limit_in_bytes"};
    for (int i = 0; i < 2; i++) {
        snprintf(group, size, "%s/stash-test-%d", roots[i], (int)getpid());
        if (mkdir(group, 0755) < 0) continue;
        char path[512], v[32];
        snprintf(path, sizeof path, "%s/%s", group, limits[i]);
        int fd = open(path, O_WRONLY);
        int n = snprintf(v, sizeof v, "%u", BUDGET);
        bool ok = fd >= 0 && write(fd, v, (size_t)n) == n;
        if (fd >= 0) close(fd);
        snprintf(path, sizeof path, "%s/cgroup.procs", group);
        fd = open(path, O_WRONLY);
        n = snprintf(v, sizeof v, "%d", (int)getpid());
        ok = ok && fd >= 0 && write(fd, v, (size_t)n) == n;
        if (fd >= 0) close(fd);
        if (ok) return 0;
        rmdir(group);
    }
    return -1;
}

static int large_state(void *arg)
{
    const char *name = arg;
    char group[256];
    if (limit_memory(group, sizeof group) < 0) return 77;
    stash_worker *w;
    if (stash_worker_open(name, NULL, &w) < 0) return 10;
    stash_state *v;
    if (stash_state_get(w,
                        &(stash_state_desc){
                            .sz = sizeof(stash_state_desc), .name = "large", .kind = STASH_VALUE},
                        &v) < 0)
        return 11;
    static uint8_t value[1000];
    for (uint64_t k = 0; k < STATE_KEYS; k++) {
        memset(value, (int)k, sizeof value);
        memcpy(value, &k, sizeof k);
        stash_key_set(w, &k, sizeof k);
        if (stash_value_put(v, value, sizeof value) < 0) return 12;
        stash_event ev;
        if (k % 1000 == 0 && stash_barrier(w, &ev) < 0) return 13;
    }
    for (uint64_t k = 0; k < STATE_KEYS; k++) {
        stash_key_set(w, &k, sizeof k);
        stash_bytes b;
        if (stash_value_get(v, &b) < 0 || b.len != sizeof value || test_u64(b.data) != k ||
            ((const uint8_t *)b.data)[sizeof value - 1] != (uint8_t)k)
            return 14;
    }
    stash_worker_close(w);
    return 0;
}

/* Minutes of writing: ctest runs it as test_lmdb_budget (label soak), with
 * STASH_TEST_SOAK set; the suite's own run passes it over. */
Test(lmdb, state_four_times_the_memory_budget_works, .timeout = 300)
{
#ifdef __SANITIZE_ADDRESS__
    cr_skip_test("the address sanitizer's own memory would not fit the budget");
#endif
    if (!getenv("STASH_TEST_SOAK")) cr_skip_test("a soak: set STASH_TEST_SOAK to run it");
    char name[96];
    stash_arena *a = create("lmlarge", STASH_BACKEND_LMDB, name);
    pid_t pid = test_fork(large_state, name);
    int st = test_wait(pid);
    char group[256];
    snprintf(group, sizeof group, "/sys/fs/cgroup/stash-test-%d", (int)pid);
    rmdir(group);
    snprintf(group, sizeof group, "/sys/fs/cgroup/memory/stash-test-%d", (int)pid);
    rmdir(group);
    if (st == 77) {
        destroy(a, name);
        cr_skip_test("no memory cgroup can be made here");
    }
    cr_assert_eq(st, 0, "the worker in %u bytes of memory: status %d", BUDGET, st);
    destroy(a, name);
}

/* ---- incremental checkpoints --------------------------------------------- */

typedef struct engine_args {
    const char *name;
    const char *dir;
} engine_args;

static int run_engine(void *arg)
{
    engine_args *x = arg;
    stash_service *s;
    if (stash_service_start(x->name,
                            &(stash_service_opts){
                                .sz = sizeof(stash_service_opts), .dir = x->dir, .incremental = 1},
                            &s) < 0)
        return 20;
    while (!stash_service_stopped(s)) usleep(5000);
    stash_service_stop(s);
    return 0;
}

static void write_keys(const char *name, uint64_t first, uint64_t n, uint64_t gen, bool erase)
{
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    stash_state *v = state(w, "v", STASH_VALUE);
    for (uint64_t k = first; k < first + n; k++) {
        stash_key_set(w, &k, sizeof k);
        if (erase)
            cr_assert_eq(stash_state_clear(v), 0);
        else
            put_u64(v, k * 1000 + gen);
    }
    stash_worker_close(w);
}

Test(lmdb, incremental_checkpoints_carry_changes_and_deletions, .timeout = 120)
{
    char name[96], dir[128];
    snprintf(dir, sizeof dir, "/var/tmp/stash-lmdb-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    stash_arena *a = create("lminc", STASH_BACKEND_LMDB, name);
    engine_args x = {name, dir};
    pid_t engine = test_fork(run_engine, &x);
    test_await_serving(name, engine);
    write_keys(name, 0, KEYS, 1, false);
    stash_checkpoint_info full, delta;
    cr_assert_eq(stash_checkpoint(a, 60000, &full), 0, "%s", stash_errmsg());
    cr_assert(!full.incremental);
    /* One key in a hundred changes, and a few go. */
    write_keys(name, 0, KEYS / 100, 2, false);
    write_keys(name, KEYS - 10, 10, 0, true);
    cr_assert_eq(stash_checkpoint(a, 60000, &delta), 0, "%s", stash_errmsg());
    cr_assert(delta.incremental);
    cr_assert_lt(delta.bytes * 20, full.bytes, "a delta of %llu bytes beside %llu",
                 (unsigned long long)delta.bytes, (unsigned long long)full.bytes);
    cr_assert_eq(stash_service_request_stop(a, 20000), 0);
    cr_assert_eq(test_wait(engine), 0);
    /* The chain restores into a new arena: changed, unchanged and gone keys. */
    char name2[96];
    stash_arena *b = create("lminc", STASH_BACKEND_LMDB, name2);
    ioe_engine *e;
    cr_assert_eq(ioe_engine_open(&(ioe_opts){0}, &e), 0);
    ckpt_restored out;
    cr_assert_eq(ckpt_restore(b, test_ckpt_dir(dir), 0, (stash_kg_range){0, KGS - 1}, e, &out), 0,
                 "%s", stash_errmsg());
    cr_assert_eq(out.id, delta.id);
    ckpt_restored_free(&out);
    ioe_engine_close(e);
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name2, NULL, &w), 0);
    stash_state *v = state(w, "v", STASH_VALUE);
    for (uint64_t k = 0; k < KEYS; k++) {
        stash_key_set(w, &k, sizeof k);
        uint64_t want = k >= KEYS - 10 ? UINT64_MAX : k * 1000 + (k < KEYS / 100 ? 2 : 1);
        cr_assert_eq(get_u64(v), want, "key %llu", (unsigned long long)k);
    }
    stash_worker_close(w);
    destroy(b, name2);
    destroy(a, name);
    test_remove_dir(dir);
}

/* ---- a full disk ----------------------------------------------------------- */

Test(lmdb, a_full_disk_fails_the_write_and_keeps_what_was_committed, .timeout = 120)
{
    char mnt[] = "/var/tmp/stash-lmdb-full-XXXXXX", envs[64], name[96];
    cr_assert_not_null(mkdtemp(mnt));
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=64m") != 0) {
        int err = errno;
        rmdir(mnt);
        cr_skip_test("cannot mount a small tmpfs here: %s", strerror(err));
    }
    snprintf(envs, sizeof envs, "%s/envs", mnt);
    snprintf(name, sizeof name, "%s", test_arena_name("lmfull"));
    stash_arena *a;
    cr_assert_eq(stash_arena_create(name,
                                    &(stash_arena_opts){.sz = sizeof(stash_arena_opts),
                                                        .size = 16u << 20,
                                                        .max_parallelism = 1,
                                                        .backend = STASH_BACKEND_LMDB,
                                                        .lmdb_dir = envs},
                                    &a),
                 0, "%s", stash_errmsg());
    write_keys(name, 0, KEYS, 1, false);
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0);
    stash_state *big = state(w, "big", STASH_VALUE);
    static uint8_t value[1000];
    int rc = 0;
    for (uint64_t k = 0; k < 100000 && rc == 0; k++) {
        stash_key_set(w, &k, sizeof k);
        rc = stash_value_put(big, value, sizeof value);
    }
    /* A commit (here an early one, to make room) found the disk full. */
    cr_assert_eq(rc, -ENOSPC, "%s (%s)", stash_strerror(rc), stash_errmsg());
    cr_assert(strstr(stash_errmsg(), "no space left") && strstr(stash_errmsg(), envs), "%s",
              stash_errmsg());
    stash_worker_close(w);
    /* What was committed before is all there. */
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0);
    stash_state *v = state(w, "v", STASH_VALUE);
    for (uint64_t k = 0; k < KEYS; k++) {
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(get_u64(v), k * 1000 + 1, "key %llu", (unsigned long long)k);
    }
    stash_worker_close(w);
    destroy(a, name);
    cr_assert_eq(umount(mnt), 0);
    rmdir(mnt);
}

/* ---- several lmdb stores in one process ------------------------------------ */

typedef struct in_process {
    stash_arena *a;
    stash_worker *w[2];
    stash_state *v[2];
    stash_checkpoint_info info;
} in_process;

/* Puts key k through whichever of the two workers owns its key group. */
static void put_owned(in_process *x, uint64_t k, uint64_t value)
{
    int owner = stash_kg_owner(stash_key_group(&k, sizeof k, KGS), KGS, 2);
    stash_key_set(x->w[owner], &k, sizeof k);
    put_u64(x->v[owner], value);
}

/* Both workers reach barriers until a checkpoint has finished. */
static void checkpoint_between_barriers(in_process *x)
{
    cr_assert_eq(test_checkpoint_at_barriers(x->a, x->w, 2, &x->info), 0, "%s", x->info.detail);
}

Test(lmdb, two_workers_and_the_engine_in_one_process_share_each_environment, .timeout = 120)
{
    char name[96], dir[128];
    snprintf(dir, sizeof dir, "/var/tmp/stash-lmdb-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    in_process x = {.a = create("lmproc", STASH_BACKEND_LMDB, name)};
    stash_service *s;
    cr_assert_eq(stash_service_start(
                     name, &(stash_service_opts){.sz = sizeof(stash_service_opts), .dir = dir}, &s),
                 0, "%s", stash_errmsg());
    for (uint32_t i = 0; i < 2; i++) {
        cr_assert_eq(
            stash_worker_open(
                name,
                &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = i, .parallelism = 2},
                &x.w[i]),
            0, "%s", stash_errmsg());
        x.v[i] = state(x.w[i], "v", STASH_VALUE);
    }
    for (uint64_t k = 0; k < KEYS; k++) put_owned(&x, k, k * 7);
    checkpoint_between_barriers(&x);
    /* Each worker reads every key: its own key groups and the other's. */
    for (int i = 0; i < 2; i++)
        for (uint64_t k = 0; k < KEYS; k++) {
            stash_key_set(x.w[i], &k, sizeof k);
            cr_assert_eq(get_u64(x.v[i]), k * 7, "worker %d, key %llu", i, (unsigned long long)k);
        }
    for (uint64_t k = 0; k < KEYS; k += 2) put_owned(&x, k, k * 9);
    checkpoint_between_barriers(&x);
    for (int i = 0; i < 2; i++) stash_worker_close(x.w[i]);
    stash_service_stop(s);
    /* The second checkpoint restores into a new arena with every value. */
    char name2[96];
    stash_arena *b = create("lmproc", STASH_BACKEND_LMDB, name2);
    ioe_engine *e;
    cr_assert_eq(ioe_engine_open(&(ioe_opts){0}, &e), 0);
    ckpt_restored out;
    cr_assert_eq(ckpt_restore(b, test_ckpt_dir(dir), 0, (stash_kg_range){0, KGS - 1}, e, &out), 0,
                 "%s", stash_errmsg());
    cr_assert_eq(out.id, x.info.id);
    ckpt_restored_free(&out);
    ioe_engine_close(e);
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name2, NULL, &w), 0);
    stash_state *v = state(w, "v", STASH_VALUE);
    for (uint64_t k = 0; k < KEYS; k++) {
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(get_u64(v), k % 2 ? k * 7 : k * 9, "key %llu", (unsigned long long)k);
    }
    stash_worker_close(w);
    destroy(b, name2);
    destroy(x.a, name);
    test_remove_dir(dir);
}

typedef struct reader_args {
    const char *name;
    atomic_bool stop;
    uint64_t reads;
    int rc;
} reader_args;

/* Another worker of the arena in its own thread reads key group 0, which
 * its owner in the main thread grows meanwhile. */
static void *read_key_group_0(void *arg)
{
    reader_args *r = arg;
    stash_worker *w;
    r->rc = stash_worker_open(
        r->name,
        &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 1, .parallelism = 2}, &w);
    if (r->rc) return NULL;
    stash_state *v;
    r->rc = stash_state_get(
        w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "big", .kind = STASH_VALUE},
        &v);
    for (uint64_t k = 0; r->rc == 0 && !atomic_load(&r->stop); k = (k + 1) % 64, r->reads++) {
        stash_bytes b;
        stash_key_set(w, &k, sizeof k);
        int rc = stash_value_get(v, &b);
        if (rc == 0 && (b.len != 100000 || test_u64(b.data) != k)) r->rc = STASH_ECORRUPT;
        if (rc < 0 && rc != STASH_ENOTFOUND) r->rc = rc;
    }
    stash_worker_close(w);
    return NULL;
}

Test(lmdb, a_map_grows_while_another_thread_of_the_process_reads_it, .timeout = 120)
{
    char name[96];
    stash_arena *a = create_kgs("lmremap", STASH_BACKEND_LMDB, 2, name);
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 2},
            &w),
        0);
    stash_state *v = state(w, "big", STASH_VALUE);
    reader_args r = {.name = name};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, read_key_group_0, &r), 0);
    /* Keys of key group 0 only, rewritten until the map has doubled a few
     * times past the 64 MiB it starts with; each barrier commits. */
    static uint8_t value[100000];
    stash_event ev;
    for (uint64_t k = 0, n = 0; n < 3000; k++) {
        if (stash_key_group(&k, sizeof k, 2) != 0) continue;
        memcpy(value, &k, sizeof k);
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_put(v, value, sizeof value), 0, "%s", stash_errmsg());
        if (++n % 16 == 0) cr_assert_geq(stash_barrier(w, &ev), 0);
    }
    atomic_store(&r.stop, true);
    pthread_join(t, NULL);
    cr_assert_eq(r.rc, 0, "the reader: %s", stash_strerror(r.rc));
    cr_assert_gt(r.reads, 0);
    stash_worker_close(w);
    destroy(a, name);
}

Test(lmdb, an_environment_directory_another_user_made_is_refused, .timeout = 60)
{
    const char *name = test_arena_name("lmown");
    char envs[128], planted[200];
    snprintf(envs, sizeof envs, "/var/tmp/stash.%s.lmdb", name);
    cr_assert_eq(mkdir(envs, 0777), 0);
    cr_assert_eq(chown(envs, 65534, 65534), 0);
    /* What a worker would otherwise create as root through the link. */
    snprintf(planted, sizeof planted, "%s/kg-00000.mdb", envs);
    cr_assert_eq(symlink("/var/tmp/stash-lmown-target", planted), 0);
    stash_arena *a;
    cr_assert_eq(stash_arena_create(name,
                                    &(stash_arena_opts){.sz = sizeof(stash_arena_opts),
                                                        .size = 16u << 20,
                                                        .max_parallelism = 1,
                                                        .backend = STASH_BACKEND_LMDB,
                                                        .lmdb_dir = envs},
                                    &a),
                 -EPERM);
    cr_assert(strstr(stash_errmsg(), envs) && strstr(stash_errmsg(), "owned by user 65534"), "%s",
              stash_errmsg());
    cr_assert_neq(access("/var/tmp/stash-lmown-target", F_OK), 0, "nothing was created");
    unlink(planted);
    rmdir(envs);
}
