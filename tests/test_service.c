/* SPDX-License-Identifier: MIT */
/*
 * test_service.c: the persistence engine and the barrier protocol with real
 * worker processes: checkpoints cut at barriers and completed, each key as
 * of its worker's cut while the workers write on, notification, the timeout, a worker killed and
 * replaced (live or rolled back), the engine killed and restarted, the arena lost and restored, and
 * operator state redistributed at another parallelism.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/checkpoint/ckpt_read.h"
#include "backends/lmdb/lmdb.h"
#include "backends/service/service.h"
#include "tests/helpers.h"

#define MAXP 16u
#define KEYS 50u

typedef struct job {
    char name[96];
    char dir[128];
    uint32_t index, p;
    uint64_t events;    /* process this many events, then wait for a completion */
    uint64_t want_done; /* exit once a checkpoint at least this id completed */
    bool never_barrier; /* join and sleep without ever reaching a barrier */
    bool rollback;
    bool leave_after_cut; /* once it has cut a checkpoint, 200 more events, then leave */
    uint32_t slow_ms;     /* sleep this long before each barrier */
    int ready;            /* a pipe written once the worker is set up (fork_set_up), or 0 */
} job;

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *f)
{
    (void)st, (void)type, (void)f;
    return remove(path);
}

static void make_dir(char *dir, const char *tag)
{
    snprintf(dir, 128, "/tmp/stash-test-svc-%s-%d", tag, getpid());
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void drop_dir(const char *dir)
{
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* The first KEYS keys (u64 values) whose key groups worker index of p owns. */
static void keys_of(uint32_t index, uint32_t p, uint64_t *keys)
{
    stash_kg_range r;
    stash_kg_range_of(MAXP, p, index, &r);
    uint32_t n = 0;
    for (uint64_t k = 0; n < KEYS; k++) {
        uint32_t kg = stash_key_group(&k, sizeof k, MAXP);
        if (kg >= r.first && kg <= r.last) keys[n++] = k;
    }
}

/* The engine runs in a process of its own: forking workers from a process
 * with an engine thread could copy a lock that thread holds. */
typedef struct svc_args {
    char name[96];
    const char *dir;
    uint64_t timeout_ms, interval_ms;
    bool incremental;
    const char *faults;  /* $STASH_IO_FAULT for the engine's I/O */
    const char *restore; /* a new arena restores this directory */
} svc_args;

static int service_main(void *arg)
{
    svc_args *v = arg;
    stash_arena_opts ao = {.sz = sizeof(stash_arena_opts),
                           .size = 32u << 20,
                           .max_parallelism = MAXP,
                           .backend = test_backend()};
    stash_service_opts o = {.sz = sizeof(stash_service_opts),
                            .arena = &ao,
                            .dir = v->dir,
                            .timeout_ms = v->timeout_ms,
                            .interval_ms = v->interval_ms,
                            .incremental = v->incremental,
                            .restore = v->restore};
    stash_service *s;
    if (v->faults) setenv("STASH_IO_FAULT", v->faults, 1);
    if (stash_service_start(v->name, &o, &s) < 0) {
        fprintf(stderr, "service: %s\n", stash_errmsg());
        return 20;
    }
    while (!stash_service_stopped(s)) usleep(5000);
    stash_service_stop(s);
    return 0;
}

/* Starts an engine process for arena name and waits until it serves. */
static pid_t start_engine(svc_args *v)
{
    pid_t pid = test_fork(service_main, v);
    test_await_serving(v->name, pid);
    return pid;
}

static pid_t start_service(const char *name, const char *dir, uint64_t timeout_ms)
{
    static svc_args v;
    v = (svc_args){.dir = dir, .timeout_ms = timeout_ms};
    snprintf(v.name, sizeof v.name, "%s", name);
    return start_engine(&v);
}

static void stop_service(const char *name, pid_t pid)
{
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    cr_assert_eq(stash_service_request_stop(a, 20000), 0, "%s", stash_errmsg());
    stash_arena_close(a);
    /* It said it stopped: its process must end, not hang on the way out. */
    int st = 0;
    for (int i = 0; i < 6000 && waitpid(pid, &st, WNOHANG) == 0; i++) usleep(5000);
    if (waitpid(pid, &st, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        test_wait(pid);
        cr_assert_fail("the engine (pid %d) did not exit within 30 s of stopping", (int)pid);
    }
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the engine ended with status %#x", st);
}

/* Waits until worker index has passed a barrier after now: it ran on. */
static void wait_barrier_after_now(stash_arena *a, uint32_t index)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    stash_worker_info w[8];
    size_t k = 0;
    for (int tries = 0; tries < 15000; tries++) {
        stash_registry_list(a, w, 8, &k);
        for (size_t i = 0; i < k && i < 8; i++)
            if (w[i].index == index && w[i].state == STASH_WORKER_LIVE && w[i].heartbeat_ns > now)
                return;
        usleep(1000);
    }
    cr_assert_fail("worker %u passed no barrier in 15 s", index);
}

static void wait_live(const char *name, uint32_t n)
{
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    size_t live = 0;
    for (int tries = 0; tries < 15000 && live < n; tries++) {
        stash_worker_info w[8];
        size_t k = 0;
        live = 0;
        stash_registry_list(a, w, 8, &k);
        for (size_t i = 0; i < k && i < 8; i++) live += w[i].state == STASH_WORKER_LIVE;
        if (live < n) usleep(2000);
    }
    stash_arena_close(a);
    cr_assert_geq(live, n, "%zu of %u workers joined", live, n);
}

/* Fills j[0 .. p-1] from proto as the workers of arena name at parallelism
 * p, each with its index (and, when proto has events, 7 more per index, so
 * that they end apart). */
static void jobs_of(const char *name, job proto, uint32_t p, job *j)
{
    for (uint32_t i = 0; i < p; i++) {
        j[i] = proto;
        j[i].index = i;
        j[i].p = p;
        if (proto.events) j[i].events = proto.events + 7 * i;
        snprintf(j[i].name, sizeof j[i].name, "%s", name);
    }
}

/* Starts the p workers of j and waits until they are all live. */
static void fork_jobs(const char *name, job *j, uint32_t p, int (*fn)(void *), pid_t *pids)
{
    for (uint32_t i = 0; i < p; i++) pids[i] = test_fork(fn, &j[i]);
    wait_live(name, p);
}

/* Forks fn on job j and waits until it says it is set up (joined, rolled
 * back if asked, its states registered), through a pipe: a child that fails
 * first closes the pipe's last write end, and the read sees it. */
static pid_t fork_set_up(int (*fn)(void *), job *j, const char *what)
{
    int ready[2];
    cr_assert_eq(pipe(ready), 0);
    j->ready = ready[1];
    pid_t pid = test_fork(fn, j);
    close(ready[1]);
    j->ready = 0;
    char byte;
    cr_assert_eq(read(ready[0], &byte, 1), 1, "%s: the worker exited before it was set up", what);
    close(ready[0]);
    return pid;
}

/* Kills the p workers of pids (kill -9) and reaps them. */
static void kill_jobs(const pid_t *pids, uint32_t p)
{
    for (uint32_t i = 0; i < p; i++) {
        kill(pids[i], SIGKILL);
        test_wait(pids[i]);
    }
}

/* Starts workers 0 .. p-1 of arena name running fn, each on a copy of proto,
 * and waits until all have joined. */
static void start_workers(const char *name, job proto, uint32_t p, int (*fn)(void *), job *j,
                          pid_t *pids)
{
    jobs_of(name, proto, p, j);
    fork_jobs(name, j, p, fn, pids);
}

/* A worker of the counting job: event e adds one to the count of key
 * keys[e % KEYS]; its operator state (a union list) holds (index, events
 * done), so a checkpoint always pairs counts with the offset they reached. */
static int worker_main(void *arg)
{
    job *j = arg;
    stash_worker *w;
    stash_worker_opts wo = {.sz = sizeof(stash_worker_opts),
                            .index = j->index,
                            .parallelism = j->p,
                            .rollback = j->rollback};
    if (stash_worker_open(j->name, &wo, &w) < 0) {
        fprintf(stderr, "worker %u: %s\n", j->index, stash_errmsg());
        return 10;
    }
    stash_state *count, *offsets;
    if (stash_state_get(w,
                        &(stash_state_desc){
                            .sz = sizeof(stash_state_desc), .name = "count", .kind = STASH_VALUE},
                        &count) ||
        stash_state_get(w,
                        &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                            .name = "offsets",
                                            .kind = STASH_OP_UNION},
                        &offsets))
        return 11;
    if (j->ready && write(j->ready, "", 1) != 1) return 15;
    if (j->never_barrier) {
        pause();
        return 0;
    }
    uint64_t keys[KEYS], e = 0, completed = 0, leave_at = UINT64_MAX;
    keys_of(j->index, j->p, keys);
    /* Go on from the offset this worker's operator state says. */
    const stash_bytes *el;
    size_t n;
    stash_op_list_get(offsets, &el, &n);
    for (size_t i = 0; i < n; i++)
        if (test_u64(el[i].data) == j->index) e = test_u64((const uint8_t *)el[i].data + 8);
    for (;; e++) {
        if (e < j->events) {
            stash_key_set(w, &keys[e % KEYS], sizeof keys[0]);
            uint64_t c = 0;
            stash_bytes v;
            if (stash_value_get(count, &v) == 0) c = test_u64(v.data);
            c++;
            if (stash_value_put(count, &c, sizeof c) < 0) return 12;
            uint64_t off[2] = {j->index, e + 1};
            stash_bytes b = {off, sizeof off};
            if (stash_op_list_update(offsets, &b, 1) < 0) return 13;
        } else {
            usleep(1000);
        }
        if (j->slow_ms) usleep(j->slow_ms * 1000);
        if (e + 1 == leave_at) break;
        stash_event ev;
        int rc = stash_barrier(w, &ev);
        if (j->leave_after_cut && w->cut_id && leave_at == UINT64_MAX) leave_at = e + 200;
        if (rc < 0) {
            fprintf(stderr, "worker %u: barrier: %s (%s)\n", j->index, stash_strerror(rc),
                    stash_errmsg());
            return 14;
        }
        if (rc == 1 && ev.kind == STASH_CHECKPOINT_COMPLETE) completed = ev.checkpoint_id;
        if (completed >= j->want_done && e >= j->events) break;
    }
    stash_worker_close(w);
    return 0;
}

/* Checks the counts of the arena name against the offsets of its union
 * list state, at parallelism 1 (every key group). Returns the offsets. */
static void verify_counts(const char *name, uint32_t old_p, uint64_t *offs)
{
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 1},
            &w),
        0, "%s", stash_errmsg());
    stash_state *count, *offsets;
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "count",
                                                     .kind = STASH_VALUE},
                                 &count),
                 0);
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "offsets",
                                                     .kind = STASH_OP_UNION},
                                 &offsets),
                 0);
    const stash_bytes *el;
    size_t n;
    cr_assert_eq(stash_op_list_get(offsets, &el, &n), 0);
    cr_assert_eq(n, old_p, "a union list holds every worker's elements");
    for (size_t i = 0; i < n; i++) {
        uint32_t index = (uint32_t)test_u64(el[i].data);
        uint64_t off = test_u64((const uint8_t *)el[i].data + 8);
        cr_assert_lt(index, old_p);
        offs[index] = off;
        uint64_t keys[KEYS];
        keys_of(index, old_p, keys);
        for (uint32_t k = 0; k < KEYS; k++) {
            uint64_t want = off / KEYS + (k < off % KEYS), got = 0;
            stash_bytes v;
            stash_key_set(w, &keys[k], sizeof keys[k]);
            if (stash_value_get(count, &v) == 0) got = test_u64(v.data);
            cr_assert_eq(got, want, "worker %u key %u: count %llu, offset %llu wants %llu", index,
                         k, (unsigned long long)got, (unsigned long long)off,
                         (unsigned long long)want);
        }
    }
    stash_worker_close(w);
}

/* The arena lost, as after a reboot: a new service restores the newest
 * complete checkpoint of dir, whose counts must match its offsets (into offs
 * for p workers); then everything goes. */
static void restore_and_verify(const char *name, const char *dir, uint32_t p, uint64_t *offs)
{
    stash_arena_destroy(name, NULL);
    pid_t s = start_service(name, dir, 0);
    verify_counts(name, p, offs);
    stop_service(name, s);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

Test(service, barrier_cut_complete_and_restore_at_another_parallelism, .timeout = 240)
{
    job j[2];
    char dir[128];
    make_dir(dir, "basic");
    const char *name = test_arena_name("svc");
    pid_t s = start_service(name, dir, 0);
    pid_t pids[2];
    start_workers(name, (job){.events = 20000, .want_done = 3}, 2, worker_main, j, pids);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    for (uint64_t id = 1; id <= 3; id++) {
        stash_checkpoint_info info;
        int rc = stash_checkpoint(a, 0, &info);
        cr_assert_eq(rc, 0, "checkpoint: %s", stash_errmsg());
        cr_assert_eq(info.id, id);
        cr_assert_eq(info.status, 0);
        cr_assert(strstr(info.detail, dir), "%s", info.detail);
    }
    for (int i = 0; i < 2; i++) cr_assert_eq(test_wait(pids[i]), 0, "worker %d", i);
    /* With every worker gone the engine cuts the key groups itself and
     * keeps the operator state of the last checkpoint. */
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 0, &info), 0, "%s", stash_errmsg());
    cr_assert_eq(info.id, 4);
    stash_service_info si;
    stash_service_info_get(a, &si);
    cr_assert_eq(si.completed, 4);
    cr_assert_eq(si.nrecent, 4);
    cr_assert_eq(si.recent[0].id, 4);
    /* No pin outlives the checkpoints (the engine is not incremental). */
    for (uint32_t kg = 0; kg < MAXP; kg++)
        for (unsigned p = 0; p < SHM_MAX_PINS; p++)
            cr_assert_eq(atomic_load(&a->tables[kg].pins[p]), 0, "kg %u pin %u", kg, p);
    stash_arena_close(a);
    stop_service(name, s);
    /* The arena lost, as after a reboot: the service restores checkpoint 4. */
    uint64_t offs[2];
    restore_and_verify(name, dir, 2, offs);
    cr_assert_gt(offs[0], 0);
}

/* The cut test's keys per worker, and the value of (key k, generation g),
 * 1 to 160 bytes, g 0 meaning absent. */
#define CUT_KEYS 4000u
static size_t cut_value(uint64_t k, uint32_t g, uint8_t *v)
{
    size_t n = 1 + (size_t)((k * 7u + g * 13u) % 160u);
    for (size_t i = 0; i < n; i++) v[i] = (uint8_t)(k * 31u + g * 17u + i);
    return n;
}

/* A worker of the cut test: what it has written (the generation of each
 * of its keys) and where its cuts save that. */
typedef struct cut_model {
    uint64_t keys[CUT_KEYS];
    uint32_t gen[CUT_KEYS];
    const job *j;
} cut_model;

/* At each cut: the worker's generations, saved as model-INDEX-ID in the
 * job's directory, for the test to compare the checkpoint with. */
static int save_cut(stash_worker *w, uint64_t id, void *ctx)
{
    (void)w;
    cut_model *m = ctx;
    char path[256];
    snprintf(path, sizeof path, "%s/model-%u-%llu", m->j->dir, m->j->index, (unsigned long long)id);
    FILE *f = fopen(path, "w");
    if (!f) return -errno;
    size_t n = fwrite(m->gen, sizeof m->gen, 1, f);
    return fclose(f) == 0 && n == 1 ? 0 : -EIO;
}

/* A worker of the cut test: random puts of values of every size (rewritten
 * in place, grown, shrunk), clears and reads of its keys, each read checked,
 * a barrier every 50, until checkpoint want_done has completed. */
static int cut_worker_main(void *arg)
{
    const job *j = arg;
    static cut_model m;
    m = (cut_model){.j = j};
    stash_worker *w;
    stash_worker_opts wo = {.sz = sizeof(stash_worker_opts),
                            .index = j->index,
                            .parallelism = j->p,
                            .on_cut = save_cut,
                            .cut_ctx = &m};
    stash_state *s;
    if (stash_worker_open(j->name, &wo, &w) < 0 ||
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "cut", .kind = STASH_VALUE},
            &s) < 0) {
        fprintf(stderr, "worker %u: %s\n", j->index, stash_errmsg());
        return 10;
    }
    stash_kg_range r;
    stash_kg_range_of(MAXP, j->p, j->index, &r);
    uint32_t n = 0;
    for (uint64_t k = 0; n < CUT_KEYS; k++) {
        uint32_t kg = stash_key_group(&k, sizeof k, MAXP);
        if (kg >= r.first && kg <= r.last) m.keys[n++] = k;
    }
    uint64_t x = j->events; /* the seed */
    uint64_t completed = 0;
    for (uint32_t step = 1; completed < j->want_done; step++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t i = (uint32_t)(x % CUT_KEYS), what = (uint32_t)(x >> 32) % 20;
        uint8_t v[160];
        stash_bytes got;
        int rc;
        if (what < 12) {
            rc = stash_value_put_key(s, &m.keys[i], 8, v, cut_value(m.keys[i], step, v));
            m.gen[i] = step;
        } else if (what < 15) {
            rc = stash_key_set(w, &m.keys[i], 8);
            if (rc == 0) rc = stash_state_clear(s);
            m.gen[i] = 0;
        } else {
            rc = stash_value_get_key(s, &m.keys[i], 8, &got);
            if (m.gen[i] == 0 ? rc != STASH_ENOTFOUND
                              : rc != 0 || got.len != cut_value(m.keys[i], m.gen[i], v) ||
                                    memcmp(got.data, v, got.len) != 0) {
                fprintf(stderr, "worker %u seed %llu step %u: key %llu reads wrong (%d)\n",
                        j->index, (unsigned long long)j->events, step,
                        (unsigned long long)m.keys[i], rc);
                return 11;
            }
            rc = 0;
        }
        if (rc < 0) {
            fprintf(stderr, "worker %u step %u: %s\n", j->index, step, stash_errmsg());
            return 12;
        }
        stash_event ev;
        if (step % 50 == 0 && stash_barrier(w, &ev) == 1 && ev.kind == STASH_CHECKPOINT_COMPLETE)
            completed = ev.checkpoint_id;
    }
    stash_worker_close(w);
    return 0;
}

/* Reads every key of the cut test's worker index of p from an arena
 * restored from checkpoint id, through a worker of parallelism 1 and of
 * parallelism 3 (the key groups in other hands), against the generations
 * that worker saved at its cut. */
static void expect_cut(const char *name, const char *dir, uint32_t index, uint32_t p, uint64_t id,
                       unsigned seed)
{
    char path[256];
    snprintf(path, sizeof path, "%s/model-%u-%llu", dir, index, (unsigned long long)id);
    static uint32_t gen[CUT_KEYS];
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s: worker %u saved no cut of checkpoint %llu", path, index,
                       (unsigned long long)id);
    cr_assert_eq(fread(gen, sizeof gen, 1, f), 1);
    fclose(f);
    stash_kg_range r;
    stash_kg_range_of(MAXP, p, index, &r);
    for (uint32_t rp = 1; rp <= 3; rp += 2) {
        stash_worker *w[3];
        stash_state *s[3];
        for (uint32_t i = 0; i < rp; i++) {
            cr_assert_eq(stash_worker_open(name,
                                           &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                                .index = i,
                                                                .parallelism = rp},
                                           &w[i]),
                         0, "%s", stash_errmsg());
            cr_assert_eq(stash_state_get(w[i],
                                         &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                             .name = "cut",
                                                             .kind = STASH_VALUE},
                                         &s[i]),
                         0);
        }
        uint32_t n = 0;
        for (uint64_t k = 0; n < CUT_KEYS; k++) {
            uint32_t kg = stash_key_group(&k, sizeof k, MAXP);
            if (kg < r.first || kg > r.last) continue;
            /* Read by the worker of parallelism rp that owns the key group. */
            uint32_t owner = 0;
            for (uint32_t i = 0; i < rp; i++) {
                stash_kg_range o;
                stash_kg_range_of(MAXP, rp, i, &o);
                if (kg >= o.first && kg <= o.last) owner = i;
            }
            uint8_t v[160];
            stash_bytes got;
            int rc = stash_value_get_key(s[owner], &k, sizeof k, &got);
            if (gen[n] == 0) {
                cr_assert_eq(rc, STASH_ENOTFOUND,
                             "seed %u: checkpoint %llu, key %llu (key group %u): absent at the "
                             "cut, %d now",
                             seed, (unsigned long long)id, (unsigned long long)k, kg, rc);
            } else {
                size_t len = cut_value(k, gen[n], v);
                cr_assert(rc == 0 && got.len == len && memcmp(got.data, v, len) == 0,
                          "seed %u: checkpoint %llu, key %llu (key group %u): not its value at "
                          "the cut (%d, %zu bytes, %zu wanted)",
                          seed, (unsigned long long)id, (unsigned long long)k, kg, rc,
                          rc == 0 ? got.len : 0, len);
            }
            n++;
        }
        for (uint32_t i = 0; i < rp; i++) stash_worker_close(w[i]);
    }
}

/* A checkpoint holds, for every key, exactly the value it had at its
 * worker's cut, while the workers go on writing through the checkpoint's
 * asynchronous part (every write of the engine held 20 ms): values
 * rewritten, grown, shrunk and cleared after the cut, the checkpoint
 * restored and read at another parallelism. */
Test(service, every_key_holds_its_value_at_the_cut_while_workers_write_on, .timeout = 240)
{
    unsigned seed = test_seed("every_key_holds_its_value_at_the_cut_while_workers_write_on");
    char dir[128], models[128];
    make_dir(dir, "cut");
    make_dir(models, "cutmodels");
    cr_assert_eq(mkdir(models, 0700), 0);
    const char *name = test_arena_name("svccuts");
    static svc_args v;
    v = (svc_args){.dir = dir, .faults = "delay:20"};
    snprintf(v.name, sizeof v.name, "%s", name);
    pid_t s = start_engine(&v);
    job j[2];
    pid_t pids[2];
    jobs_of(name, (job){.want_done = 3}, 2, j);
    for (uint32_t i = 0; i < 2; i++) {
        snprintf(j[i].dir, sizeof j[i].dir, "%s", models);
        j[i].events = (uint64_t)seed * 2 + i + 1; /* each worker's seed */
    }
    fork_jobs(name, j, 2, cut_worker_main, pids);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    for (uint64_t id = 1; id <= 3; id++) {
        stash_checkpoint_info info;
        cr_assert_eq(stash_checkpoint(a, 0, &info), 0, "checkpoint %llu: %s",
                     (unsigned long long)id, stash_errmsg());
        cr_assert_eq(info.id, id);
    }
    for (int i = 0; i < 2; i++) cr_assert_eq(test_wait(pids[i]), 0, "worker %d (seed %u)", i, seed);
    stash_arena_close(a);
    stop_service(name, s);
    /* The arena lost: a new one restores checkpoint 3, the newest. */
    stash_arena_destroy(name, NULL);
    s = start_service(name, dir, 0);
    for (uint32_t i = 0; i < 2; i++) expect_cut(name, models, i, 2, 3, seed);
    stop_service(name, s);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
    drop_dir(models);
}

Test(service, a_worker_that_leaves_after_its_cut_keeps_its_cut_in_the_checkpoint, .timeout = 240)
{
    /* Worker 0 cuts checkpoint 1 at once and leaves 200 events later, while
     * worker 1's slow barrier holds the checkpoint open: the checkpoint must
     * keep worker 0's operator state from its cut, not the one it leaves
     * with, or its counts and offsets part. */
    char dir[128];
    make_dir(dir, "leave");
    const char *name = test_arena_name("svcl");
    pid_t s = start_service(name, dir, 20000);
    job j[2];
    pid_t pids[2];
    jobs_of(name, (job){.events = UINT64_MAX / 2, .want_done = UINT64_MAX}, 2, j);
    j[0].leave_after_cut = true;
    j[1].slow_ms = 300;
    fork_jobs(name, j, 2, worker_main, pids);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 20000, &info), 0, "%s", stash_errmsg());
    cr_assert_eq(test_wait(pids[0]), 0, "worker 0 left cleanly");
    kill(pids[1], SIGKILL);
    test_wait(pids[1]);
    stash_arena_close(a);
    kill(s, SIGKILL);
    test_wait(s);
    uint64_t offs[2];
    restore_and_verify(name, dir, 2, offs);
    cr_assert_gt(offs[0], 0);
}

Test(service, a_worker_that_never_reaches_a_barrier_fails_the_checkpoint, .timeout = 240)
{
    char dir[128];
    make_dir(dir, "timeout");
    const char *name = test_arena_name("svct");
    pid_t s = start_service(name, dir, 300);
    job j = {.index = 0, .p = 1, .never_barrier = true};
    snprintf(j.name, sizeof j.name, "%s", name);
    pid_t pid = test_fork(worker_main, &j);
    wait_live(name, 1);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    /* As a worker killed between pinning a key group for the engine and
     * naming the pin as its cut leaves it: the failed checkpoint releases it. */
    cr_assert_gt(shm_table_pin_for(a, 3, atomic_load(&a->control->service_reader), false), 0);
    stash_checkpoint_info info;
    int rc = stash_checkpoint(a, 0, &info);
    cr_assert_eq(rc, STASH_EABORTED);
    cr_assert(strstr(info.detail, "worker 0 reached no barrier within 300 ms"), "%s", info.detail);
    for (unsigned p = 0; p < SHM_MAX_PINS; p++)
        cr_assert_eq(atomic_load(&a->tables[3].pins[p]), 0, "a pin nobody named: %u", p);
    kill(pid, SIGKILL);
    test_wait(pid);
    /* The dead worker is named at once, without waiting for the timeout. */
    rc = stash_checkpoint(a, 0, &info);
    cr_assert_eq(rc, STASH_EABORTED);
    cr_assert(strstr(info.detail, "dead"), "%s", info.detail);
    for (uint32_t kg = 0; kg < MAXP; kg++)
        for (unsigned p = 0; p < SHM_MAX_PINS; p++)
            cr_assert_eq(atomic_load(&a->tables[kg].pins[p]), 0);
    stash_arena_close(a);
    stop_service(name, s);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

/* A worker that cuts checkpoint after checkpoint, then blocks in a loop of
 * barriers: the test kills it with SIGKILL at some moment. */
static int endless_worker(void *arg)
{
    job *j = arg;
    j->events = UINT64_MAX;
    return worker_main(j);
}

Test(service, a_killed_worker_is_replaced_live_or_rolled_back, .timeout = 240)
{
    char dir[128];
    make_dir(dir, "replace");
    const char *name = test_arena_name("svcr");
    pid_t s = start_service(name, dir, 5000);
    job j[2];
    pid_t pids[2];
    start_workers(name, (job){.want_done = UINT64_MAX}, 2, endless_worker, j, pids);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 0, &info), 0, "%s", stash_errmsg());
    wait_barrier_after_now(a, 1);
    kill(pids[1], SIGKILL);
    cr_assert_eq(test_wait(pids[1]), 128 + SIGKILL);
    /* A replacement goes on from the live state (its operator state from the
     * newest complete checkpoint): the other worker never stopped. */
    pids[1] = test_fork(endless_worker, &j[1]);
    wait_live(name, 2);
    cr_assert_eq(stash_checkpoint(a, 0, &info), 0, "%s", stash_errmsg());
    uint64_t good = info.id;
    wait_barrier_after_now(a, 1);
    kill(pids[1], SIGKILL);
    test_wait(pids[1]);
    /* A replacement that rolls back: its key groups and offset as of the
     * newest complete checkpoint, while worker 0 runs on. */
    j[1].rollback = true;
    j[1].never_barrier = true;
    pids[1] = fork_set_up(worker_main, &j[1], "the replacement");
    kill_jobs(pids, 2);
    stash_arena_close(a);
    stop_service(name, s);
    /* Worker 1's key groups now hold exactly checkpoint good's counts:
     * compare with a restore of it. */
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 1, .parallelism = 2},
            &w),
        0);
    stash_state *count;
    stash_state_get(
        w,
        &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "count", .kind = STASH_VALUE},
        &count);
    uint64_t live[KEYS], keys[KEYS];
    keys_of(1, 2, keys);
    for (uint32_t k = 0; k < KEYS; k++) {
        stash_bytes v;
        stash_key_set(w, &keys[k], sizeof keys[k]);
        live[k] = stash_value_get(count, &v) == 0 ? test_u64(v.data) : 0;
    }
    stash_worker_close(w);
    stash_arena_destroy(name, NULL);
    s = start_service(name, dir, 0);
    stash_service_info si;
    stash_arena_open(name, NULL, &a);
    stash_service_info_get(a, &si);
    cr_assert_eq(si.completed, good);
    stash_arena_close(a);
    cr_assert_eq(
        stash_worker_open(
            name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 1, .parallelism = 2},
            &w),
        0);
    stash_state_get(
        w,
        &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "count", .kind = STASH_VALUE},
        &count);
    for (uint32_t k = 0; k < KEYS; k++) {
        stash_bytes v;
        stash_key_set(w, &keys[k], sizeof keys[k]);
        uint64_t c = stash_value_get(count, &v) == 0 ? test_u64(v.data) : 0;
        cr_assert_eq(live[k], c, "key %u: rolled back to %llu, the checkpoint has %llu", k,
                     (unsigned long long)live[k], (unsigned long long)c);
    }
    stash_worker_close(w);
    stop_service(name, s);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

Test(service, the_engine_killed_and_restarted_loses_nothing, .timeout = 240)
{
    job wj[2];
    char dir[128];
    make_dir(dir, "kill");
    const char *name = test_arena_name("svck");
    svc_args sv = {.dir = dir, .interval_ms = 5, .incremental = true};
    snprintf(sv.name, sizeof sv.name, "%s", name);
    pid_t spid = start_engine(&sv);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    pid_t pids[2];
    start_workers(name, (job){.want_done = UINT64_MAX}, 2, endless_worker, wj, pids);
    /* Kill the engine at moments spread over its checkpoints. */
    for (int round = 0; round < 8; round++) {
        usleep(30000 + (unsigned)round * 7000);
        kill(spid, SIGKILL);
        test_wait(spid);
        spid = start_engine(&sv);
    }
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 10000, &info), 0, "%s", stash_errmsg());
    kill(spid, SIGKILL);
    test_wait(spid);
    /* Every pin the engines held went with them or was released. */
    pid_t s = start_service(name, dir, 0);
    for (uint32_t kg = 0; kg < MAXP; kg++) {
        uint32_t held = 0;
        for (unsigned p = 0; p < SHM_MAX_PINS; p++)
            held += atomic_load(&a->tables[kg].pins[p]) != 0;
        cr_assert_eq(held, 0, "key group %u keeps %u pins", kg, held);
    }
    kill_jobs(pids, 2);
    stash_arena_close(a);
    stop_service(name, s);
    /* The newest complete checkpoint restores, counts matching offsets. */
    uint64_t offs[2];
    restore_and_verify(name, dir, 2, offs);
}

/* Operator state of each kind at parallelism p: worker i's list holds
 * 10 + i elements (i, k), its union list (i), and its broadcast state
 * maps "rule" to i (and "w<i>" to i). */
static int opstate_worker(void *arg)
{
    job *j = arg;
    stash_worker *w;
    if (stash_worker_open(j->name,
                          &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                               .index = j->index,
                                               .parallelism = j->p},
                          &w) < 0)
        return 10;
    stash_state *list, *uni, *bc;
    if (stash_state_get(w,
                        &(stash_state_desc){
                            .sz = sizeof(stash_state_desc), .name = "list", .kind = STASH_OP_LIST},
                        &list) ||
        stash_state_get(w,
                        &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                            .name = "union",
                                            .kind = STASH_OP_UNION},
                        &uni) ||
        stash_state_get(w,
                        &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                            .name = "bc",
                                            .kind = STASH_OP_BROADCAST},
                        &bc))
        return 11;
    for (uint32_t k = 0; k < 10 + j->index; k++) {
        uint32_t el[2] = {j->index, k};
        stash_op_list_add(list, el, sizeof el);
    }
    stash_op_list_add(uni, &j->index, sizeof j->index);
    char key[8];
    snprintf(key, sizeof key, "w%u", j->index);
    stash_broadcast_put(bc, "rule", 4, &j->index, sizeof j->index);
    stash_broadcast_put(bc, key, strlen(key), &j->index, sizeof j->index);
    for (;;) {
        stash_event ev;
        int rc = stash_barrier(w, &ev);
        if (rc < 0) return 12;
        if (rc == 1 && ev.kind == STASH_CHECKPOINT_COMPLETE) break;
        usleep(1000);
    }
    stash_worker_close(w);
    return 0;
}

static void redistribute(uint32_t from, uint32_t to)
{
    char dir[128];
    make_dir(dir, "ops");
    const char *name = test_arena_name("svco");
    pid_t s = start_service(name, dir, 0);
    job j[4];
    pid_t pids[4];
    start_workers(name, (job){0}, from, opstate_worker, j, pids);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 0, &info), 0, "%s", stash_errmsg());
    for (uint32_t i = 0; i < from; i++) cr_assert_eq(test_wait(pids[i]), 0);
    stash_arena_close(a);
    stop_service(name, s);
    stash_arena_destroy(name, NULL);
    s = start_service(name, dir, 0);
    uint32_t total = 0, seen_list = 0;
    for (uint32_t i = 0; i < from; i++) total += 10 + i;
    for (uint32_t i = 0; i < to; i++) {
        stash_worker *w;
        cr_assert_eq(stash_worker_open(name,
                                       &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                            .index = i,
                                                            .parallelism = to},
                                       &w),
                     0, "%s", stash_errmsg());
        stash_state *list, *uni, *bc;
        stash_state_get(w,
                        &(stash_state_desc){
                            .sz = sizeof(stash_state_desc), .name = "list", .kind = STASH_OP_LIST},
                        &list);
        stash_state_get(w,
                        &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                            .name = "union",
                                            .kind = STASH_OP_UNION},
                        &uni);
        stash_state_get(w,
                        &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                            .name = "bc",
                                            .kind = STASH_OP_BROADCAST},
                        &bc);
        const stash_bytes *el;
        size_t n;
        cr_assert_eq(stash_op_list_get(list, &el, &n), 0);
        /* Contiguous chunks of the lists in worker order, the first workers
         * one element more (Flink's round-robin repartitioner). */
        size_t base = total / to, extra = total % to;
        size_t lo = base * i + (i < extra ? i : extra), hi = lo + base + (i < extra ? 1 : 0);
        cr_assert_eq(n, hi - lo, "worker %u of %u: %zu list elements, want %zu", i, to, n, hi - lo);
        for (size_t e = 0; e < n; e++) {
            uint32_t got[2], at = (uint32_t)(lo + e), owner = 0;
            memcpy(got, el[e].data, sizeof got);
            while (at >= 10 + owner) at -= 10 + owner++;
            cr_assert(got[0] == owner && got[1] == at, "element %zu of worker %u", lo + e, i);
        }
        seen_list += (uint32_t)n;
        cr_assert_eq(stash_op_list_get(uni, &el, &n), 0);
        cr_assert_eq(n, from, "the union list goes whole to every worker");
        for (size_t e = 0; e < n; e++) cr_assert_eq(test_int(el[e].data), (int)e);
        stash_bytes v;
        cr_assert_eq(stash_broadcast_get(bc, "rule", 4, &v), 0);
        cr_assert_eq(test_int(v.data), (int)(i % from), "broadcast state from i mod p");
        const stash_bytes *ks, *vs;
        cr_assert_eq(stash_broadcast_entries(bc, &ks, &vs, &n), 0);
        cr_assert_eq(n, 2);
        stash_worker_close(w);
    }
    cr_assert_eq(seen_list, total);
    stop_service(name, s);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

Test(service, operator_state_scales_down, .timeout = 240)
{
    redistribute(3, 2);
}

Test(service, operator_state_scales_up, .timeout = 240)
{
    redistribute(2, 3);
}

Test(service, operator_state_api_refuses_other_kinds, .timeout = 240)
{
    char name[96];
    stash_arena *a = test_arena_create("svcapi", 0, MAXP, name);
    stash_arena_close(a);
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0);
    stash_state *list, *bc, *val;
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "l", .kind = STASH_OP_LIST},
            &list),
        0);
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "b",
                                                     .kind = STASH_OP_BROADCAST},
                                 &bc),
                 0);
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &val),
        0);
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "t",
                                                     .kind = STASH_OP_LIST,
                                                     .ttl = {.ttl_ms = 5}},
                                 &val),
                 -EINVAL);
    stash_bytes v;
    cr_assert_eq(stash_broadcast_get(list, "k", 1, &v), STASH_EKIND);
    cr_assert_eq(stash_op_list_add(bc, "x", 1), STASH_EKIND);
    cr_assert_eq(stash_broadcast_put(bc, "k", 1, "1", 1), 0);
    cr_assert_eq(stash_broadcast_put(bc, "k", 1, "22", 2), 0);
    cr_assert_eq(stash_broadcast_get(bc, "k", 1, &v), 0);
    cr_assert_eq(v.len, 2);
    cr_assert_eq(stash_broadcast_remove(bc, "k", 1), 0);
    cr_assert_eq(stash_broadcast_get(bc, "k", 1, &v), STASH_ENOTFOUND);
    stash_bytes two[2] = {{"a", 1}, {"bb", 2}};
    const stash_bytes *el;
    size_t n;
    cr_assert_eq(stash_op_list_update(list, two, 2), 0);
    cr_assert_eq(stash_op_list_get(list, &el, &n), 0);
    cr_assert_eq(n, 2);
    cr_assert_eq(el[1].len, 2);
    /* Without a service there is nothing to cut and nobody to ask. */
    stash_event ev;
    cr_assert_eq(stash_barrier(w, &ev), 0);
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(w->arena, 100, &info), STASH_ENOSERVICE);
    stash_worker_close(w);
    cr_assert_eq(stash_worker_open(name,
                                   &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                        .index = 0,
                                                        .parallelism = 1,
                                                        .rollback = 1},
                                   &w),
                 STASH_ENOSERVICE);
    stash_arena_destroy(name, NULL);
}

/* `stash serve NAME --dir DIR --size 16M --log-format FORMAT` with its
 * output in log. */
static pid_t serve_as(const char *name, const char *dir, const char *log, const char *format)
{
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, 1) < 0) _exit(126);
        execl(STASH_BIN, "stash", "serve", name, "--dir", dir, "--size", "16M", "--log-format",
              format, (char *)NULL);
        _exit(127);
    }
    test_await_serving(name, pid);
    return pid;
}

static pid_t serve(const char *name, const char *dir, const char *log)
{
    return serve_as(name, dir, log, "text");
}

static bool file_has(const char *path, const char *what)
{
    char buf[8192];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    return strstr(buf, what) != NULL;
}

Test(service, the_commands_serve_checkpoint_status_stop, .timeout = 240)
{
    char dir[128], log[160], out[16384], args[512];
    make_dir(dir, "cli");
    snprintf(log, sizeof log, "%s.log", dir);
    const char *name = test_arena_name("svccli");
    pid_t pid = serve(name, dir, log);
    snprintf(args, sizeof args, "checkpoint %s --json --timeout 20s", name);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"id\": 1,") && strstr(out, "chk-1"), "%s", out);
    snprintf(args, sizeof args, "checkpoint %s --savepoint", name);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "savepoint 2 ") && strstr(out, "savepoint-2"), "%s", out);
    snprintf(args, sizeof args, "status %s --json", name);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"service\": {\"pid\": ") && strstr(out, "\"completed\": 2,") &&
                  strstr(out, "\"savepoint\": true"),
              "%s", out);
    snprintf(args, sizeof args, "stop %s", name);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert_eq(test_wait(pid), 0);
    cr_assert(file_has(log, " INFO checkpoint 1: complete: "), "a line with its level and subject");
    cr_assert(file_has(log, "stopped"));
    /* A worker killed with SIGKILL is noticed without a checkpoint asking. */
    pid = serve(name, dir, log);
    job j = {.index = 0, .p = 1, .never_barrier = true};
    snprintf(j.name, sizeof j.name, "%s", name);
    pid_t w = fork_set_up(worker_main, &j, "worker 0");
    kill(w, SIGKILL);
    test_wait(w);
    char died[64];
    snprintf(died, sizeof died, " WARN worker 0: pid %d died", (int)w);
    for (int i = 0; i < 2000 && !file_has(log, died); i++) usleep(5000);
    cr_assert(file_has(log, died));
    snprintf(args, sizeof args, "stop %s", name);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert_eq(test_wait(pid), 0);
    /* Restarted, it reattaches and numbers on; SIGTERM stops it cleanly. A
     * replacement for the dead worker makes the arena whole again first. */
    pid = serve(name, dir, log);
    stash_worker *wk;
    cr_assert_eq(stash_worker_open(name, NULL, &wk), 0, "%s", stash_errmsg());
    stash_worker_close(wk);
    snprintf(args, sizeof args, "checkpoint %s", name);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "checkpoint 3 "), "%s", out);
    /* The same as metrics, once, in Prometheus' text format. */
    char check[1024];
    snprintf(check, sizeof check,
             "status %s --prom | python3 %s/prom_check.py stash_service_up=1 "
             "'stash_checkpoint_last_completed_id>=3' stash_checkpoint_in_progress=0 "
             "'stash_checkpoint_last_size_bytes{incremental=\"false\"}>=1' "
             "stash_arena_key_groups=%u",
             name, STASH_TESTS_DIR, STASH_DEFAULT_MAX_PARALLELISM);
    cr_assert_eq(test_run_stash(check, out, sizeof out), 0, "%s: %s", check, out);
    snprintf(args, sizeof args, "status %s --prom --json", name);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 2, "%s", out);
    snprintf(args, sizeof args, "checkpoint %s", name);
    kill(pid, SIGTERM);
    cr_assert_eq(test_wait(pid), 0);
    cr_assert(file_has(log, "SIGTERM: stopping"));
    cr_assert_eq(test_run_stash(args, out, sizeof out), 1);
    cr_assert(strstr(out, "no service"), "%s", out);
    /* For machines: one JSON object a line. */
    pid = serve_as(name, dir, log, "json");
    snprintf(args, sizeof args, "stop %s", name);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert_eq(test_wait(pid), 0);
    cr_assert(file_has(log, "\"level\": \"INFO\", \"subject\": \"service\", \"message\": "
                            "\"serving "));
    snprintf(check, sizeof check, "python3 %s/json_check.py < %s", STASH_TESTS_DIR, log);
    cr_assert_eq(system(check), 0, "every line of %s is JSON", log);
    /* Wrong arguments: usage and exit code 2. */
    cr_assert_eq(test_run_stash("serve", out, sizeof out), 2);
    cr_assert(strstr(out, "missing arena NAME"), "%s", out);
    cr_assert_eq(test_run_stash("serve x", out, sizeof out), 2);
    cr_assert(strstr(out, "needs --dir"), "%s", out);
    cr_assert_eq(test_run_stash("serve x --dir d --interval 5q", out, sizeof out), 2);
    cr_assert(strstr(out, "'--interval 5q'"), "%s", out);
    cr_assert_eq(test_run_stash("serve x --dir d --backend rocks", out, sizeof out), 2);
    cr_assert_eq(test_run_stash("checkpoint", out, sizeof out), 2);
    for (int i = 0; i < 3; i++) {
        const char *cmd[] = {"serve --help", "checkpoint --help", "stop --help"};
        cr_assert_eq(test_run_stash(cmd[i], out, sizeof out), 0);
        cr_assert(strstr(out, "usage: stash"), "%s", out);
    }
    stash_arena_destroy(name, NULL);
    unlink(log);
    drop_dir(dir);
}

Test(service, a_soak_of_random_kills_loses_no_committed_state, .timeout = 240)
{
    char dir[128];
    make_dir(dir, "soak");
    const char *name = test_arena_name("svcs");
    svc_args sv = {.dir = dir, .interval_ms = 10, .incremental = true};
    snprintf(sv.name, sizeof sv.name, "%s", name);
    pid_t spid = start_engine(&sv);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    job j[2];
    pid_t pids[2];
    start_workers(name, (job){.want_done = UINT64_MAX}, 2, endless_worker, j, pids);
    srand(test_seed("a_soak_of_random_kills_loses_no_committed_state"));
    uint64_t committed = 0;
    for (int round = 0; round < 16; round++) {
        usleep(20000 + (unsigned)(rand() % 40000));
        stash_service_info si;
        stash_service_info_get(a, &si);
        cr_assert_geq(si.completed, committed, "a committed checkpoint went missing");
        committed = si.completed;
        int victim = rand() % 3;
        if (victim < 2) {
            /* Rolled back to the last complete checkpoint: exactly once. A
             * rollback needs one (a slow machine may not have it yet). */
            for (int i = 0; i < 10000 && si.completed == 0; i++) {
                usleep(2000);
                stash_service_info_get(a, &si);
            }
            cr_assert_gt(si.completed, 0, "no checkpoint completed to roll back to");
            kill(pids[victim], SIGKILL);
            test_wait(pids[victim]);
            /* Set up (rolled back) before a later round may kill the
             * engine, without which a rollback cannot start. */
            j[victim].rollback = true;
            pids[victim] = fork_set_up(endless_worker, &j[victim], "a replacement");
        } else {
            kill(spid, SIGKILL);
            test_wait(spid);
            spid = start_engine(&sv);
        }
    }
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 20000, &info), 0, "%s", stash_errmsg());
    cr_assert_gt(info.id, committed);
    kill_jobs(pids, 2);
    stash_arena_close(a);
    kill(spid, SIGKILL);
    test_wait(spid);
    /* Lost with its arena, the job comes back from the newest checkpoint:
     * counts and offsets from one cut, whatever was killed when. */
    stash_arena_destroy(name, NULL);
    pid_t s = start_service(name, dir, 0);
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_service_info si;
    stash_service_info_get(a, &si);
    cr_assert_geq(si.completed, info.id);
    stash_arena_close(a);
    uint64_t offs[2];
    verify_counts(name, 2, offs);
    stop_service(name, s);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

Test(service, the_memory_storage_caps_each_checkpoint, .timeout = 240)
{
    const char *name = test_arena_name("svcm");
    char dir[4096], leaf[128];
    /* By default in this user's private directory in memory. */
    snprintf(leaf, sizeof leaf, "%s.checkpoints", name);
    cr_assert_eq(shm_private_path(SHM_PRIVATE_RUNTIME, leaf, dir, sizeof dir), 0);
    drop_dir(dir);
    stash_arena_opts ao = {.sz = sizeof(stash_arena_opts),
                           .size = 32u << 20,
                           .max_parallelism = MAXP,
                           .backend = test_backend()};
    stash_service_opts o = {.sz = sizeof(stash_service_opts),
                            .arena = &ao,
                            .storage = STASH_STORAGE_MEMORY,
                            .memory_cap = 64u << 10};
    stash_service *s;
    cr_assert_eq(stash_service_start(name, &o, &s), 0, "%s", stash_errmsg());
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0);
    stash_state *v;
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &v),
        0);
    uint8_t value[1000];
    for (uint64_t k = 0; k < 1000; k++) {
        memset(value, (int)k, sizeof value);
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_put(v, value, sizeof value), 0);
    }
    stash_worker_close(w);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_checkpoint_info info;
    /* A million bytes of values, which LZ4 shrinks, but not below 64 KiB. */
    cr_assert_eq(stash_checkpoint(a, 0, &info), STASH_EABORTED);
    cr_assert(strstr(info.detail, "65536"), "%s", info.detail);
    stash_service_stop(s);
    o.memory_cap = 0; /* 5 MiB */
    cr_assert_eq(stash_service_start(name, &o, &s), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_checkpoint(a, 0, &info), 0, "%s", stash_errmsg());
    cr_assert_eq(info.id, 2);
    cr_assert(strncmp(info.detail, dir, strlen(dir)) == 0, "%s", info.detail);
    stash_service_stop(s);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

Test(service, a_failed_fsync_fails_that_checkpoint_and_keeps_the_others, .timeout = 240)
{
    char dir[128], path[200];
    make_dir(dir, "fsync");
    const char *name = test_arena_name("svcf");
    /* Checkpoint 1 syncs its data file and its metadata; 2 fails at its first. */
    svc_args sv = {.dir = dir, .faults = "fsync:3:ENOSPC"};
    snprintf(sv.name, sizeof sv.name, "%s", name);
    pid_t spid = start_engine(&sv);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_checkpoint(a, 60000, &info), STASH_EABORTED);
    cr_assert_eq(info.id, 2);
    cr_assert(strstr(info.detail, "No space left on device") && strstr(info.detail, dir), "%s",
              info.detail);
    snprintf(path, sizeof path, "%s/chk-2", dir);
    cr_assert_neq(access(path, F_OK), 0, "the failed checkpoint left %s", path);
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "%s", stash_errmsg());
    cr_assert_eq(info.id, 3);
    snprintf(path, sizeof path, "%s/chk-1/_metadata", dir);
    cr_assert_eq(access(path, F_OK), 0);
    stash_arena_close(a);
    stop_service(name, spid);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

Test(service, a_stop_with_a_savepoint_stops_after_it_and_a_failed_one_stops_nothing, .timeout = 240)
{
    char dir[128], path[200];
    make_dir(dir, "stopsp");
    const char *name = test_arena_name("svcss");
    /* Checkpoint 1 syncs its data file and its metadata; savepoint 2 fails at its first. */
    svc_args sv = {.dir = dir, .faults = "fsync:3:ENOSPC"};
    snprintf(sv.name, sizeof sv.name, "%s", name);
    pid_t spid = start_engine(&sv);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_stop_with_savepoint(a, 60000, &info), STASH_EABORTED);
    cr_assert(info.savepoint && info.id == 2, "savepoint %llu", (unsigned long long)info.id);
    /* Nothing stopped: the service goes on as before. */
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "%s", stash_errmsg());
    cr_assert_eq(info.id, 3);
    cr_assert(!info.savepoint);
    cr_assert_eq(stash_stop_with_savepoint(a, 60000, &info), 0, "%s", stash_errmsg());
    cr_assert(info.savepoint && info.id == 4, "savepoint %llu", (unsigned long long)info.id);
    snprintf(path, sizeof path, "%s/savepoint-4", dir);
    cr_assert_str_eq(info.detail, path);
    cr_assert_eq(test_wait(spid), 0, "the engine stopped cleanly");
    /* The savepoint was its last: no checkpoint after it. */
    stash_service_info si;
    cr_assert_eq(stash_service_info_get(a, &si), 0);
    cr_assert_eq(si.pid, 0);
    cr_assert_eq(si.completed, 4);
    cr_assert_eq(si.recent[0].id, 4);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

/* Asks the service of arena arg for a savepoint and waits for it. */
static int ask_savepoint(void *arg)
{
    stash_arena *a;
    if (stash_arena_open(arg, NULL, &a)) return 1;
    stash_checkpoint_info info;
    stash_savepoint(a, 120000, &info);
    stash_arena_close(a);
    return 0;
}

Test(service, a_savepoint_a_killed_engine_left_partial_is_removed_by_the_next, .timeout = 240)
{
    char dir[128], sp[200], meta[240];
    make_dir(dir, "sppart");
    const char *name = test_arena_name("svcsp");
    /* Every completion held a minute: the savepoint stops at its first write. */
    svc_args sv = {.dir = dir, .faults = "delay:60000"};
    snprintf(sv.name, sizeof sv.name, "%s", name);
    pid_t spid = start_engine(&sv);
    pid_t asker = test_fork(ask_savepoint, (void *)name);
    snprintf(sp, sizeof sp, "%s/savepoint-1", dir);
    snprintf(meta, sizeof meta, "%s/_metadata", sp);
    for (int i = 0; i < 60000 && access(sp, F_OK) != 0; i++) usleep(1000);
    cr_assert_eq(access(sp, F_OK), 0, "the savepoint began");
    kill(spid, SIGKILL);
    test_wait(spid);
    kill(asker, SIGKILL);
    test_wait(asker);
    cr_assert_neq(access(meta, F_OK), 0, "it is partial");
    /* The kernel lets the dead engine's lock go once the last of its
     * threads (io_uring's workers among them) is gone: wait for that. */
    int fd = open(sp, O_RDONLY | O_DIRECTORY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(flock(fd, LOCK_EX), 0);
    close(fd);
    /* Another's partial savepoint is not the engine's to remove. */
    char theirs[200];
    snprintf(theirs, sizeof theirs, "%s/savepoint-7", dir);
    cr_assert_eq(mkdir(theirs, 0700), 0);
    cr_assert_eq(chown(theirs, 65534, 65534), 0);
    spid = start_service(name, dir, 0);
    /* A checkpoint answered: the engine's start is over. */
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "%s", info.detail);
    cr_assert_neq(access(sp, F_OK), 0, "%s is left", sp);
    cr_assert_eq(access(theirs, F_OK), 0, "another user's directory stays");
    cr_assert_gt(info.id, 7, "ids go on after every one the directory names");
    stash_arena_close(a);
    stop_service(name, spid);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

Test(service, a_savepoint_moves_and_restores_elsewhere, .timeout = 240)
{
    char dir[128], dir2[128], moved[200], path[300];
    make_dir(dir, "sp");
    make_dir(dir2, "sp2");
    snprintf(moved, sizeof moved, "%s-moved", dir);
    drop_dir(moved);
    const char *name = test_arena_name("svcsp");
    svc_args sv = {.dir = dir, .incremental = true};
    snprintf(sv.name, sizeof sv.name, "%s", name);
    pid_t spid = start_engine(&sv);
    job j[2];
    pid_t pids[2];
    start_workers(name, (job){.events = 5000, .want_done = 2}, 2, worker_main, j, pids);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "%s", stash_errmsg());
    cr_assert(!info.savepoint);
    cr_assert_eq(stash_savepoint(a, 60000, &info), 0, "%s", stash_errmsg());
    cr_assert_eq(info.id, 2);
    cr_assert(info.savepoint && !info.incremental);
    snprintf(path, sizeof path, "%s/savepoint-2", dir);
    cr_assert_str_eq(info.detail, path);
    for (int i = 0; i < 2; i++) cr_assert_eq(test_wait(pids[i]), 0, "worker %d", i);
    stash_arena_close(a);
    stop_service(name, spid);
    /* Moved away from its directory, it restores a new arena on its own. */
    cr_assert_eq(rename(path, moved), 0);
    drop_dir(dir);
    stash_arena_destroy(name, NULL);
    svc_args sv2 = {.dir = dir2, .restore = moved};
    snprintf(sv2.name, sizeof sv2.name, "%s", name);
    spid = start_engine(&sv2);
    uint64_t offs[2];
    verify_counts(name, 2, offs);
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "%s", stash_errmsg());
    cr_assert_eq(info.id, 3, "ids go on from the savepoint's");
    stash_arena_close(a);
    stop_service(name, spid);
    stash_arena_destroy(name, NULL);
    drop_dir(dir2);
    drop_dir(moved);
}

/* Writes key 7 = 42 and dies without leaving. */
static int write_and_die(void *arg)
{
    job *j = arg;
    stash_worker *w;
    stash_state *v;
    if (stash_worker_open(j->name, NULL, &w) < 0 ||
        stash_state_get(w,
                        &(stash_state_desc){
                            .sz = sizeof(stash_state_desc), .name = "count", .kind = STASH_VALUE},
                        &v) < 0)
        return 10;
    uint64_t k = 7, x = 42;
    stash_key_set(w, &k, sizeof k);
    if (stash_value_put(v, &x, sizeof x) < 0) return 11;
    /* The lmdb backend's live state is what a barrier committed: one does
     * once LMDB_COMMIT_MS passed since the last commit. */
    usleep(2 * LMDB_COMMIT_MS * 1000);
    stash_event ev;
    if (stash_barrier(w, &ev) < 0) return 12;
    raise(SIGKILL);
    return 13;
}

Test(service, a_rollback_without_a_checkpoint_changes_nothing, .timeout = 240)
{
    char dir[128];
    make_dir(dir, "rbnone");
    const char *name = test_arena_name("svcrb");
    pid_t s = start_service(name, dir, 0);
    job j = {0};
    snprintf(j.name, sizeof j.name, "%s", name);
    cr_assert_eq(test_wait(test_fork(write_and_die, &j)), 128 + SIGKILL);
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(name,
                          &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .rollback = 1}, &w),
        -ENOENT);
    cr_assert(strstr(stash_errmsg(), "no complete checkpoint"), "%s", stash_errmsg());
    /* The live state the dead worker left is still there. */
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    stash_state *v;
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "count",
                                                     .kind = STASH_VALUE},
                                 &v),
                 0);
    uint64_t k = 7;
    stash_bytes b;
    stash_key_set(w, &k, sizeof k);
    cr_assert_eq(stash_value_get(v, &b), 0);
    cr_assert_eq(test_u64(b.data), 42);
    stash_worker_close(w);
    stop_service(name, s);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

/* The checkpoint a rollback restores may come from before any worker joined:
 * it holds no operator state, and the replacement starts with none, not
 * with the newest its predecessor recorded at a cut that later failed
 * (that would pair its offsets with key groups of another moment). */
Test(service, a_rollback_to_a_checkpoint_without_workers_starts_with_no_operator_state,
     .timeout = 240)
{
    char dir[128];
    make_dir(dir, "rbfirst");
    const char *name = test_arena_name("svcrf");
    pid_t s = start_service(name, dir, 300);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 20000, &info), 0, "%s", stash_errmsg());
    uint64_t first = info.id;
    /* Worker 0 counts and cuts the next checkpoint, recording its offset;
     * worker 1 never reaches a barrier, so that checkpoint fails. */
    job j[2];
    pid_t pids[2];
    jobs_of(name, (job){.want_done = UINT64_MAX}, 2, j);
    j[1].never_barrier = true;
    pids[0] = fork_set_up(endless_worker, &j[0], "worker 0");
    pids[1] = fork_set_up(worker_main, &j[1], "worker 1");
    cr_assert_eq(stash_checkpoint(a, 20000, &info), STASH_EABORTED, "%s", info.detail);
    kill_jobs(pids, 2);
    /* Both roll back to the checkpoint from before they joined. */
    jobs_of(name, (job){.want_done = UINT64_MAX, .rollback = true}, 2, j);
    for (uint32_t i = 0; i < 2; i++) pids[i] = fork_set_up(endless_worker, &j[i], "a replacement");
    /* This service gives a worker 300 ms to cut: on a loaded machine a
     * checkpoint may fail for it, and the next one is taken. */
    int rc = STASH_EABORTED;
    for (int tries = 0; tries < 20 && rc == STASH_EABORTED; tries++)
        rc = stash_checkpoint(a, 20000, &info);
    cr_assert_eq(rc, 0, "%s (%s)", stash_errmsg(), info.detail);
    cr_assert_gt(info.id, first);
    kill_jobs(pids, 2);
    stash_arena_close(a);
    stop_service(name, s);
    uint64_t offs[2];
    restore_and_verify(name, dir, 2, offs);
}

/* Fills the arena until it refuses even the smallest value (so that what
 * is left depends on no layout), then reaches barriers, failing each cut. */
static int fill_then_barrier(void *arg)
{
    job *j = arg;
    stash_worker *w;
    stash_state *v;
    if (stash_worker_open(j->name, NULL, &w) < 0 ||
        stash_state_get(w,
                        &(stash_state_desc){
                            .sz = sizeof(stash_state_desc), .name = "fill", .kind = STASH_VALUE},
                        &v) < 0)
        return 10;
    static uint8_t value[16384];
    uint64_t k = 0;
    for (size_t len = sizeof value; len >= 1; len /= 2) {
        int rc = 0;
        while (rc == 0) {
            stash_key_set(w, &k, sizeof k);
            k++;
            rc = stash_value_put(v, value, len);
        }
        if (rc != STASH_EFULL) return 11;
    }
    if (j->ready && write(j->ready, "", 1) != 1) return 12;
    for (;;) {
        stash_event ev;
        stash_barrier(w, &ev);
        usleep(1000);
    }
}

Test(service, a_worker_that_cannot_cut_names_why, .timeout = 240)
{
    if (test_backend() == STASH_BACKEND_LMDB) cr_skip_test("an lmdb arena's map grows instead");
    char dir[128];
    make_dir(dir, "full");
    const char *name = test_arena_name("svcfull");
    pid_t s = start_service(name, dir, 0);
    job j = {0};
    snprintf(j.name, sizeof j.name, "%s", name);
    pid_t w = fork_set_up(fill_then_barrier, &j, "the worker that fills the arena");
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 60000, &info), STASH_EABORTED);
    cr_assert(strstr(info.detail, "was not cut: worker 0: arena full"), "%s", info.detail);
    stash_arena_close(a);
    kill(w, SIGKILL);
    test_wait(w);
    stop_service(name, s);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

/* What on_cut is given: the states it writes and whether to fail. */
typedef struct cut_log {
    stash_state *cuts;  /* operator list: each checkpoint id cut */
    stash_state *value; /* keyed: key 1 holds the newest id cut */
    uint64_t calls;
    bool fail;
} cut_log;

static int log_cut(stash_worker *w, uint64_t id, void *ctx)
{
    cut_log *l = ctx;
    l->calls++;
    if (l->fail) return -EIO;
    uint64_t key = 1;
    int rc = stash_key_set(w, &key, sizeof key);
    if (rc == 0) rc = stash_value_put(l->value, &id, sizeof id);
    return rc ? rc : stash_op_list_add(l->cuts, &id, sizeof id);
}

static void open_logged(const char *name, int rollback, cut_log *l, stash_worker **w)
{
    stash_worker_opts o = {
        .sz = sizeof(stash_worker_opts), .rollback = rollback, .on_cut = log_cut, .cut_ctx = l};
    cr_assert_eq(stash_worker_open(name, &o, w), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_state_get(*w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "cuts",
                                                     .kind = STASH_OP_LIST},
                                 &l->cuts),
                 0);
    cr_assert_eq(
        stash_state_get(
            *w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &l->value),
        0);
}

Test(service, what_on_cut_writes_is_in_the_checkpoint_it_cuts_and_its_failure_fails_it,
     .timeout = 240)
{
    char dir[128];
    make_dir(dir, "oncut");
    const char *name = test_arena_name("svccut");
    pid_t s = start_service(name, dir, 0);
    cut_log l = {0};
    stash_worker *w;
    open_logged(name, 0, &l, &w);
    stash_arena *a = stash_worker_arena(w);
    stash_checkpoint_info info;
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", stash_errmsg());
    cr_assert_eq(l.calls, 1);
    uint64_t first = info.id, after = 999, key = 1;
    /* Written after the cut: not in the checkpoint. */
    cr_assert_eq(stash_op_list_add(l.cuts, &after, sizeof after), 0);
    cr_assert_eq(stash_key_set(w, &key, sizeof key), 0);
    cr_assert_eq(stash_value_put(l.value, &after, sizeof after), 0);
    l.fail = true;
    int barrier_rc;
    cr_assert_eq(test_checkpoint_at_failing_barriers(a, &w, 1, &info, &barrier_rc), STASH_EABORTED);
    cr_assert_eq(barrier_rc, -EIO, "the barrier that cut returns on_cut's error");
    cr_assert(strstr(info.detail, "was not cut: worker 0"), "%s", info.detail);
    cr_assert_eq(l.calls, 2);
    stash_worker_close(w);
    /* The replacement rolls back to the one checkpoint complete. */
    cut_log r = {0};
    open_logged(name, 1, &r, &w);
    const stash_bytes *el;
    size_t n;
    cr_assert_eq(stash_op_list_get(r.cuts, &el, &n), 0);
    cr_assert_eq(n, 1, "the operator state on_cut wrote, alone");
    cr_assert_eq(test_u64(el[0].data), first);
    stash_bytes v;
    cr_assert_eq(stash_key_set(w, &key, sizeof key), 0);
    cr_assert_eq(stash_value_get(r.value, &v), 0);
    cr_assert_eq(test_u64(v.data), first, "the keyed state on_cut wrote, as of the cut");
    stash_worker_close(w);
    stop_service(name, s);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

/* Starts an engine thread in this process with options o for a new arena
 * name (of the tests' size, parallelism and backend), and opens it. */
static stash_service *start_here(const char *name, stash_service_opts *o, stash_arena **a)
{
    static stash_arena_opts ao;
    ao = (stash_arena_opts){.sz = sizeof(stash_arena_opts),
                            .size = 32u << 20,
                            .max_parallelism = MAXP,
                            .backend = test_backend()};
    o->sz = sizeof *o;
    o->arena = &ao;
    stash_service *s;
    cr_assert_eq(stash_service_start(name, o, &s), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_arena_open(name, NULL, a), 0);
    return s;
}

Test(service, the_engine_keeps_its_options, .timeout = 240)
{
    char dir[128];
    make_dir(dir, "opts");
    const char *name = test_arena_name("svcopt");
    stash_arena *a;
    stash_service *s = start_here(name,
                                  &(stash_service_opts){.dir = dir,
                                                        .incremental = 1,
                                                        .full_every = 2,
                                                        .retain = 2,
                                                        .lz4 = 1,
                                                        .min_pause_ms = 200},
                                  &a);
    /* Incremental with a full checkpoint after every 2 deltas; each one
     * starts at least 200 ms after the one before ended. */
    const int want_incremental[5] = {0, 1, 1, 0, 1};
    stash_checkpoint_info info[5];
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(stash_checkpoint(a, 60000, &info[i]), 0, "%s", stash_errmsg());
        cr_assert_eq(info[i].id, (uint64_t)i + 1);
        cr_assert_eq(info[i].incremental, want_incremental[i], "checkpoint %d", i + 1);
        if (i)
            cr_assert_geq(info[i].started_ns,
                          info[i - 1].started_ns + info[i - 1].duration_ns + 200000000ull);
    }
    /* The chain's last cut stays as the next delta's base, which sees no
     * version: the owners write in place, nothing saved or copied for it. */
    for (uint32_t kg = 0; kg < MAXP; kg++) {
        const shm_table *t = &a->tables[kg];
        uint32_t held = 0;
        for (unsigned i = 0; i < SHM_MAX_PINS; i++)
            held |= (uint32_t)(atomic_load(&t->pins[i]) != 0) << i;
        cr_assert_neq(held, 0, "key group %u keeps its base", kg);
        cr_assert_eq(held & ~atomic_load(&t->pin_base), 0, "key group %u: its pins are bases", kg);
    }
    stash_service_stop(s);
    stash_arena_close(a);
    /* Retention kept the newest 2 complete checkpoints. */
    uint64_t *ids;
    int n = ckpt_list(test_ckpt_dir(dir), &ids);
    cr_assert_eq(n, 2);
    cr_assert(ids[0] == 5 && ids[1] == 4);
    free(ids);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

/* A chain holds at most CKPT_MAX_FILES files: the checkpoint that would
 * make it longer is full, decided before anything is cut (a cut, once
 * serialized, is a base no full checkpoint could walk again). */
Test(service, a_chain_at_its_longest_goes_on_with_a_full_checkpoint, .timeout = 240)
{
    char dir[128];
    make_dir(dir, "chain");
    const char *name = test_arena_name("svcchain");
    stash_arena *a;
    stash_service *s = start_here(
        name, &(stash_service_opts){.dir = dir, .incremental = 1, .full_every = 1000}, &a);
    for (uint64_t id = 1; id <= CKPT_MAX_FILES + 2; id++) {
        stash_checkpoint_info info;
        cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "checkpoint %llu: %s",
                     (unsigned long long)id, stash_errmsg());
        cr_assert_eq(info.id, id);
        cr_assert_eq(info.incremental, (id - 1) % CKPT_MAX_FILES != 0, "checkpoint %llu",
                     (unsigned long long)id);
    }
    stash_service_stop(s);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

static int count_timer(const stash_timer *timer, void *ctx)
{
    uint64_t *seen = ctx;
    uint64_t k = test_u64(timer->key.data);
    cr_assert_eq(timer->timestamp, 100 + k);
    cr_assert_lt(k, 64u);
    cr_assert_eq(*seen & 1ull << k, 0u, "key %llu fired twice", (unsigned long long)k);
    *seen |= 1ull << k;
    return 0;
}

/* Registers timers for keys 0 .. 49 and advances to 50, has them
 * checkpointed, then registers more, deletes some, advances to 99 and dies
 * without leaving. */
static int timers_then_die(void *arg)
{
    job *j = arg;
    stash_worker *w;
    stash_timers *t;
    if (stash_worker_open(j->name, NULL, &w) < 0 || stash_timers_get(w, "windows", &t) < 0)
        return 10;
    for (uint64_t k = 0; k < 60; k++) {
        if (k == 50) {
            if (stash_timers_advance(t, 50, count_timer, NULL) != 0) return 16;
            stash_arena *a = stash_worker_arena(w);
            stash_checkpoint_info info;
            if (test_checkpoint_at_barriers(a, &w, 1, &info) < 0) return 11;
        }
        stash_key_set(w, &k, sizeof k);
        if (stash_timer_register(t, STASH_EVENT_TIME, NULL, 0, 100 + k) < 0) return 12;
    }
    for (uint64_t k = 0; k < 10; k++) {
        stash_key_set(w, &k, sizeof k);
        if (stash_timer_delete(t, STASH_EVENT_TIME, NULL, 0, 100 + k) < 0) return 13;
    }
    if (stash_timers_advance(t, 99, count_timer, NULL) != 0) return 17;
    stash_event ev;
    if (stash_barrier(w, &ev) < 0) return 14;
    raise(SIGKILL);
    return 15;
}

Test(service, a_rolled_back_worker_gets_its_timers_as_of_the_checkpoint, .timeout = 240)
{
    char dir[128];
    make_dir(dir, "rbtimers");
    const char *name = test_arena_name("svcrt");
    pid_t s = start_service(name, dir, 0);
    job j = {0};
    snprintf(j.name, sizeof j.name, "%s", name);
    cr_assert_eq(test_wait(test_fork(timers_then_die, &j)), 128 + SIGKILL);
    stash_worker *w;
    stash_timers *t;
    cr_assert_eq(
        stash_worker_open(name,
                          &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .rollback = 1}, &w),
        0, "%s", stash_errmsg());
    cr_assert_eq(stash_timers_get(w, "windows", &t), 0);
    cr_assert_eq(stash_timers_watermark(t), 50, "the watermark as of the checkpoint");
    uint64_t seen = 0;
    cr_assert_eq(stash_timers_advance(t, UINT64_MAX, count_timer, &seen), 50, "%s", stash_errmsg());
    cr_assert_eq(seen, (1ull << 50) - 1, "keys 0 .. 49, as the checkpoint holds them");
    stash_worker_close(w);
    stop_service(name, s);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

typedef struct line_log {
    int lines;
    char fallback[512];
} line_log;

static void keep_line(void *ctx, const char *line)
{
    line_log *l = ctx;
    l->lines++;
    if (strstr(line, "thread-pool")) snprintf(l->fallback, sizeof l->fallback, "%s", line);
}

Test(service, the_io_engine_s_fallback_line_goes_to_the_service_s_log)
{
    char dir[128], name[96];
    make_dir(dir, "fallback-log");
    snprintf(name, sizeof name, "%s", test_arena_name("fallback-log"));
    stash_arena_opts ao = {.sz = sizeof(stash_arena_opts),
                           .size = 16u << 20,
                           .max_parallelism = MAXP,
                           .backend = test_backend()};
    line_log l = {0};
    /* Each test runs in a process of its own: its environment is its own. */
    unsetenv("STASH_IO");
    setenv("STASH_IO_FAULT", "setup:EPERM", 1);
    stash_service *s;
    int rc = stash_service_start(name,
                                 &(stash_service_opts){.sz = sizeof(stash_service_opts),
                                                       .arena = &ao,
                                                       .dir = dir,
                                                       .log = keep_line,
                                                       .log_ctx = &l},
                                 &s);
    cr_assert_eq(rc, 0, "%s", stash_errmsg());
    stash_service_stop(s);
    stash_arena_destroy(name, &ao);
    drop_dir(dir);
    cr_assert(strstr(l.fallback, " WARN io: io_uring_setup failed"),
              "the service logged %d lines, none the fallback", l.lines);
}

Test(service, a_relative_checkpoint_directory_is_named_absolute_in_the_arena, .timeout = 60)
{
    char dir[128], here[4096];
    make_dir(dir, "rel");
    cr_assert_not_null(getcwd(here, sizeof here));
    cr_assert_eq(chdir("/tmp"), 0);
    const char *name = test_arena_name("svcrel");
    stash_arena_opts ao = {.sz = sizeof(stash_arena_opts),
                           .size = 32u << 20,
                           .max_parallelism = MAXP,
                           .backend = test_backend()};
    stash_service *s;
    cr_assert_eq(
        stash_service_start(
            name,
            &(stash_service_opts){.sz = sizeof(stash_service_opts), .arena = &ao, .dir = dir + 5},
            &s),
        0, "%s", stash_errmsg());
    cr_assert_eq(chdir(here), 0);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_service_info info;
    cr_assert_eq(stash_service_info_get(a, &info), 0);
    /* Workers rolling back read it from wherever they run. */
    cr_assert_str_eq(info.dir, dir);
    stash_arena_close(a);
    stash_service_stop(s);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

/* The storage named by a URL: file:DIR is the fs storage in DIR (and a
 * second directory beside it is refused), memory: the memory storage. */
Test(service, a_storage_url_names_the_fs_and_memory_storages, .timeout = 120)
{
    char dir[128], url[160], name[96];
    make_dir(dir, "url");
    snprintf(url, sizeof url, "file:%s", dir);
    stash_arena *a = test_arena_create("url", 16u << 20, 8, name);
    stash_service_opts so = {.sz = sizeof so, .storage_url = url, .dir = "/tmp/elsewhere"};
    stash_service *svc;
    cr_assert_eq(stash_service_start(name, &so, &svc), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "two checkpoint directories"), "%s", stash_errmsg());
    so.dir = NULL;
    cr_assert_eq(stash_service_start(name, &so, &svc), 0, "%s", stash_errmsg());
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    stash_checkpoint_info info;
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
    cr_assert(strstr(info.detail, dir), "%s not in %s", dir, info.detail);
    stash_service_stop(svc);
    so.storage_url = "memory:";
    cr_assert_eq(stash_service_start(name, &so, &svc), 0, "%s", stash_errmsg());
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
    cr_assert(strstr(info.detail, ".checkpoints"), "the private memory directory: %s", info.detail);
    stash_service_stop(svc);
    stash_worker_close(w);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}
