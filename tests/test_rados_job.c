/* SPDX-License-Identifier: MIT */
/*
 * test_rados_job.c: a job that spans hosts, against a real single-node
 * Ceph cluster: the one the suites share, in a pool of the test's own, or,
 * for the test that stops its OSD, one it starts and stops. Each host is a
 * `stash serve` process with an arena of its own; the test is every host's
 * workers.
 * Checkpoints across three hosts, a host killed with SIGKILL (its service,
 * arena and directory gone) and its workers taken over by a live host from
 * the newest job checkpoint while the others run on, the leader killed and
 * the lead moved within the lease, the cluster's OSD stopped mid-checkpoint
 * (aborted on every host, the next one committed once it is back), and the
 * job restored on two hosts of another parallelism: every value exact.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/checkpoint/checkpoints.h"
#include "backends/service/job.h"
#include "include/stash.h"
#include "tests/helpers.h"

#define MAXP 12u
#define KEYS 600u
#define WAIT_MS 60000u

static const char *const dir = test_ceph_dir, *const conf = test_ceph_conf,
                         *const pool = test_ceph_container;
static char job[64];

/* A cluster's start was most of a test's time (8 s), so the tests share
 * the cluster ctest starts for the suites (tests/helpers.h), two at a time
 * (--jobs 2), each with a pool of its own, whose hosts, leases and records
 * the other does not see. refusals_osd_stopped_and_rescaled_to_two_hosts
 * stops the OSD, which would fail the test beside it: it starts a cluster
 * of its own. */
static void start_cluster(void)
{
    test_ceph_start();
    snprintf(job, sizeof job, "job%d", (int)getpid());
}

static void start_own_cluster(void)
{
    test_ceph_start_own();
    snprintf(job, sizeof job, "job%d", (int)getpid());
}

/* A host: its `stash serve` process, arena and directory. */
typedef struct host {
    char name[16];
    char arena[64];
    char dir[160];
    char log[192];
    pid_t pid;
} host;

static host hosts[8];
static size_t nhosts;

/* Kills what is left of the hosts, then stops the cluster. */
static void stop_all(void)
{
    for (size_t i = 0; i < nhosts; i++)
        if (hosts[i].pid > 0) {
            kill(hosts[i].pid, SIGKILL);
            waitpid(hosts[i].pid, NULL, 0);
            stash_arena_destroy(hosts[i].arena, NULL);
        }
    test_ceph_stop();
}

/* Connects to the test's pool into *r: 0 or an error. */
static int open_pool(ckpt_storage **r)
{
    stash_storage_opts o = {.sz = sizeof o, .ceph_conf = test_ceph_conf};
    return ckpt_storage_open(&ckpt_rados_ops, pool, &o, r);
}

TestSuite(rados_job, .fini = stop_all, .timeout = 300);

/* Starts host name of job jobname serving workers of parallelism p, on
 * the arena and directory of tag; with opt, the option opt (and its value
 * val, if any). */
static host *start_host_of(const char *jobname, const char *name, const char *tag,
                           const char *workers, uint32_t p, const char *opt, const char *val)
{
    host *h = &hosts[nhosts++];
    snprintf(h->name, sizeof h->name, "%s", name);
    snprintf(h->arena, sizeof h->arena, "t-job-%s-%d", tag, (int)getpid());
    snprintf(h->dir, sizeof h->dir, "%s/host-%s", dir, tag);
    snprintf(h->log, sizeof h->log, "%s/host-%s-%zu.log", dir, tag, nhosts);
    char p_arg[16], maxp_arg[16];
    snprintf(p_arg, sizeof p_arg, "%u", p);
    snprintf(maxp_arg, sizeof maxp_arg, "%u", MAXP);
    h->pid = fork();
    cr_assert_geq(h->pid, 0);
    if (h->pid == 0) {
        int fd = open(h->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        dup2(fd, 1);
        dup2(fd, 2);
        const char *argv[] = {"stash",  "serve",
                              h->arena, "--storage",
                              "rados",  "--pool",
                              pool,     "--ceph-conf",
                              conf,     "--job",
                              jobname,  "--host",
                              name,     "--workers",
                              workers,  "--job-parallelism",
                              p_arg,    "--max-parallelism",
                              maxp_arg, "--dir",
                              h->dir,   "--timeout",
                              "6s",     "--lease",
                              "2s",     "--retain",
                              "2",      "--ceph-timeout",
                              "3s",     opt,
                              val,      NULL};
        execv(STASH_BIN, (char *const *)argv);
        _exit(127);
    }
    return h;
}

static host *start_host_on(const char *name, const char *tag, const char *workers, uint32_t p)
{
    return start_host_of(job, name, tag, workers, p, NULL, NULL);
}

static host *start_host(const char *name, const char *workers, uint32_t p)
{
    return start_host_on(name, name, workers, p);
}

/* Whether host h's log holds text. */
static bool logged(const host *h, const char *text)
{
    FILE *f = fopen(h->log, "r");
    if (!f) return false;
    char line[2048];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, text) != NULL;
    fclose(f);
    return found;
}

/* Copies every host's log to stderr: what a failed wait shows. */
static void dump_logs(void)
{
    for (size_t i = 0; i < nhosts; i++) {
        FILE *f = fopen(hosts[i].log, "r");
        char line[2048];
        fprintf(stderr, "--- host %s (%s)\n", hosts[i].name, hosts[i].log);
        while (f && fgets(line, sizeof line, f)) fputs(line, stderr);
        if (f) fclose(f);
    }
}

/* Waits until one of the hosts logs text (its index), or fails. */
static size_t await_logged(const char *text)
{
    for (unsigned ms = 0; ms < WAIT_MS; ms += 50) {
        for (size_t i = 0; i < nhosts; i++)
            if (hosts[i].pid > 0 && logged(&hosts[i], text)) return i;
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
    dump_logs();
    cr_assert_fail("no host logged '%s' within %u ms", text, WAIT_MS);
    return 0;
}

/* Opens worker index of p on host h's arena, once it serves. */
static stash_worker *open_worker(const host *h, uint32_t index, uint32_t p)
{
    char ready[96];
    snprintf(ready, sizeof ready, "serving /");
    for (unsigned ms = 0; ms < WAIT_MS && !logged(h, ready); ms += 50) {
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            h->arena,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = index, .parallelism = p},
            &w),
        0, "%s: %s", h->arena, stash_errmsg());
    return w;
}

static stash_state *count_of(stash_worker *w)
{
    stash_state *s;
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "count",
                                                     .kind = STASH_VALUE},
                                 &s),
                 0, "%s", stash_errmsg());
    return s;
}

/* Writes key k = round * 100000 + k for the first most keys worker index
 * of p owns. */
static void write_keys(stash_worker *w, uint32_t index, uint32_t p, uint64_t round, unsigned most)
{
    stash_state *s = count_of(w);
    char key[32];
    for (uint32_t k = 0; k < KEYS && most; k++) {
        int n = snprintf(key, sizeof key, "key-%u", k);
        if ((uint32_t)stash_kg_owner(stash_key_group(key, (size_t)n, MAXP), MAXP, p) != index)
            continue;
        uint64_t v = round * 100000 + k;
        cr_assert_eq(stash_key_set(w, key, (size_t)n), 0);
        cr_assert_eq(stash_value_put(s, &v, sizeof v), 0, "%s", stash_errmsg());
        most--;
    }
}

static void write_round(stash_worker *w, uint32_t index, uint32_t p, uint64_t round)
{
    write_keys(w, index, p, round, KEYS);
}

/* Rewrites one key worker index of p owns with the value of round. */
static void touch_one(stash_worker *w, uint32_t index, uint32_t p, uint64_t round)
{
    write_keys(w, index, p, round, 1);
}

/* Asserts every key worker index of p owns holds the value of round. */
static void check_round(stash_worker *w, uint32_t index, uint32_t p, uint64_t round)
{
    stash_state *s = count_of(w);
    char key[32];
    unsigned seen = 0;
    for (uint32_t k = 0; k < KEYS; k++) {
        int n = snprintf(key, sizeof key, "key-%u", k);
        if ((uint32_t)stash_kg_owner(stash_key_group(key, (size_t)n, MAXP), MAXP, p) != index)
            continue;
        stash_bytes v;
        cr_assert_eq(stash_key_set(w, key, (size_t)n), 0);
        cr_assert_eq(stash_value_get(s, &v), 0, "worker %u of %u: %s missing", index, p, key);
        cr_assert_eq(test_u64(v.data), round * 100000 + k,
                     "worker %u of %u: %s = %llu, not round %llu", index, p, key,
                     (unsigned long long)test_u64(v.data), (unsigned long long)round);
        seen++;
    }
    cr_assert_gt(seen, 0, "worker %u of %u owns no key", index, p);
}

/* A checkpoint asked of host h's arena while workers w reach barriers. */
static int try_checkpoint(const host *h, stash_worker *const *w, size_t n,
                          stash_checkpoint_info *info)
{
    stash_arena *a;
    cr_assert_eq(stash_arena_open(h->arena, NULL, &a), 0, "%s", stash_errmsg());
    int rc = test_checkpoint_at_barriers(a, w, n, info);
    stash_arena_close(a);
    return rc;
}

/* As try_checkpoint(), with every host's log on stderr if it fails. */
static int checkpoint(const host *h, stash_worker *const *w, size_t n, stash_checkpoint_info *info)
{
    int rc = try_checkpoint(h, w, n, info);
    if (rc) {
        fprintf(stderr, "checkpoint of host %s: %d: %s\n", h->name, rc, stash_errmsg());
        dump_logs();
    }
    return rc;
}

/* Kills host h's service with SIGKILL, its arena and directory kept. */
static void kill_service(host *h)
{
    kill(h->pid, SIGKILL);
    cr_assert_eq(test_wait(h->pid), 128 + SIGKILL);
    h->pid = -1;
}

/* Kills host h: its service with SIGKILL, its arena and directory removed. */
static void lose_host(host *h)
{
    kill_service(h);
    cr_assert_eq(stash_arena_destroy(h->arena, NULL), 0, "%s", stash_errmsg());
    test_remove_dir(h->dir);
}

/* Stops host h with SIGTERM, as an operator does. */
static void stop_host(host *h)
{
    kill(h->pid, SIGTERM);
    cr_assert_eq(test_wait(h->pid), 0, "host %s did not stop cleanly (see %s)", h->name, h->log);
    h->pid = -1;
    stash_arena_destroy(h->arena, NULL);
}

/* The hosts' workers: worker i on hosts[on[i]]. */
typedef struct placed_workers {
    stash_worker *w[3];
    size_t on[3];
} placed_workers;

static void write_all(placed_workers *jw, uint64_t round)
{
    for (uint32_t i = 0; i < 3; i++) write_round(jw->w[i], i, 3, round);
}

/* Moves the workers of host from (lost) to host to, each checked to hold
 * the values of round. */
static void move_workers(placed_workers *jw, size_t from, size_t to, uint64_t round)
{
    for (uint32_t i = 0; i < 3; i++) {
        if (jw->on[i] != from) continue;
        jw->w[i] = open_worker(&hosts[to], i, 3);
        jw->on[i] = to;
        check_round(jw->w[i], i, 3, round);
    }
}

static void close_workers_on(placed_workers *jw, size_t h)
{
    for (uint32_t i = 0; i < 3; i++)
        if (jw->on[i] == h) stash_worker_close(jw->w[i]);
}

/* Waits until host h has published checkpoint id as complete. */
static void await_completed(const host *h, uint64_t id)
{
    stash_arena *ar;
    stash_service_info si = {0};
    cr_assert_eq(stash_arena_open(h->arena, NULL, &ar), 0);
    for (unsigned ms = 0; ms < WAIT_MS; ms += 20) {
        cr_assert_eq(stash_service_info_get(ar, &si), 0);
        if (si.completed >= id) break;
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    stash_arena_close(ar);
    cr_assert_eq(si.completed, id, "host %s completed %llu, not %llu", h->name,
                 (unsigned long long)si.completed, (unsigned long long)id);
}

/* Waits until host h has published checkpoint id as failed. */
static void await_failed(const host *h, uint64_t id)
{
    stash_arena *ar;
    stash_service_info si = {0};
    cr_assert_eq(stash_arena_open(h->arena, NULL, &ar), 0);
    bool found = false;
    for (unsigned ms = 0; ms < WAIT_MS && !found; ms += 20) {
        cr_assert_eq(stash_service_info_get(ar, &si), 0);
        for (size_t k = 0; k < si.nrecent; k++)
            if (si.recent[k].id == id) {
                cr_assert_neq(si.recent[k].status, 0, "host %s committed %llu", h->name,
                              (unsigned long long)id);
                found = true;
            }
        struct timespec ts = {0, 20000000};
        if (!found) nanosleep(&ts, NULL);
    }
    stash_arena_close(ar);
    cr_assert(found, "host %s never ended checkpoint %llu", h->name, (unsigned long long)id);
}

/* Waits for the line of host h saying job checkpoint id committed of n parts. */
static void await_committed(uint64_t id, size_t parts)
{
    char text[128];
    snprintf(text, sizeof text, "job checkpoint %llu committed: %zu parts", (unsigned long long)id,
             parts);
    await_logged(text);
}

Test(rados_job, three_hosts_a_host_lost_and_the_leader_killed, .init = start_cluster)
{
    host *a = start_host("a", "0-0", 3), *b = start_host("b", "1-1", 3),
         *c = start_host("c", "2-2", 3);
    size_t leader = await_logged("leads job");
    placed_workers jw = {{open_worker(a, 0, 3), open_worker(b, 1, 3), open_worker(c, 2, 3)},
                         {0, 1, 2}};
    write_all(&jw, 1);
    stash_checkpoint_info info;
    /* Asked of one host: the leader triggers it on all three. */
    size_t by = leader == 2 ? 0 : 2;
    cr_assert_eq(checkpoint(&hosts[by], jw.w, 3, &info), 0, "%s", stash_errmsg());
    await_committed(info.id, 3);
    uint64_t first = info.id;
    /* Every host's workers get the verdict. */
    for (size_t i = 0; i < 3; i++) await_completed(&hosts[i], info.id);
    /* Round 2 is in no checkpoint: a worker's replacement rolls back to
     * round 1 from its host's part of the job's newest checkpoint. */
    write_all(&jw, 2);
    stash_worker_close(jw.w[1]);
    cr_assert_eq(stash_worker_open(b->arena,
                                   &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                        .index = 1,
                                                        .parallelism = 3,
                                                        .rollback = 1},
                                   &jw.w[1]),
                 0, "%s", stash_errmsg());
    check_round(jw.w[1], 1, 3, 1);
    write_round(jw.w[1], 1, 3, 2);

    /* A host that does not lead lost: a live one takes its worker over
     * from the newest job checkpoint (round 1) while the others run on. */
    size_t lost = leader == 0 ? 1 : 0;
    close_workers_on(&jw, lost);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    lose_host(&hosts[lost]);
    char text[128];
    snprintf(text, sizeof text, "workers %zu-%zu of lost host %s over", lost, lost,
             hosts[lost].name);
    size_t taker = await_logged(text);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fprintf(stderr, "three_hosts: the lost host's worker was taken over %.1f s after its loss\n",
            (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    /* The live host serving the fewest workers takes them, the first by
     * name of those serving as few. */
    cr_assert_eq(taker, lost == 0 ? 1u : 0u, "host %s took them", hosts[taker].name);
    move_workers(&jw, lost, taker, 1);
    /* Before a checkpoint of the taker's arena holds the taken worker, its
     * replacement rolls back from the copies the takeover's restore left:
     * round 1, of the job's checkpoint. */
    write_round(jw.w[lost], (uint32_t)lost, 3, 2);
    stash_worker_close(jw.w[lost]);
    cr_assert_eq(stash_worker_open(hosts[taker].arena,
                                   &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                        .index = (uint32_t)lost,
                                                        .parallelism = 3,
                                                        .rollback = 1},
                                   &jw.w[lost]),
                 0, "%s", stash_errmsg());
    stash_event ev;
    cr_assert_eq(stash_barrier(jw.w[lost], &ev), 1, "%s", stash_errmsg());
    cr_assert_eq(ev.kind, STASH_ROLLED_BACK);
    cr_assert_eq(ev.checkpoint_id, first);
    check_round(jw.w[lost], (uint32_t)lost, 3, 1);
    for (uint32_t i = 0; i < 3; i++)
        if (i != lost) check_round(jw.w[i], i, 3, 2);
    write_all(&jw, 3);
    cr_assert_eq(checkpoint(&hosts[taker], jw.w, 3, &info), 0, "%s", stash_errmsg());
    await_committed(info.id, 2);

    /* The leader killed: the other live host leads within the lease and
     * takes the leader's workers over from the newest job checkpoint
     * (round 4); its own workers keep round 5. */
    write_all(&jw, 4);
    cr_assert_eq(checkpoint(&hosts[leader], jw.w, 3, &info), 0, "%s", stash_errmsg());
    uint64_t before = info.id;
    write_all(&jw, 5);
    size_t other = 3 - lost - leader;
    close_workers_on(&jw, leader);
    lose_host(&hosts[leader]);
    char leads[64];
    snprintf(leads, sizeof leads, "host %s leads job", hosts[other].name);
    cr_assert_eq(await_logged(leads), other);
    snprintf(text, sizeof text, "of lost host %s over", hosts[leader].name);
    cr_assert_eq(await_logged(text), other);
    for (uint32_t i = 0; i < 3; i++)
        if (jw.on[i] == other) check_round(jw.w[i], i, 3, 5);
    move_workers(&jw, leader, other, 4);
    cr_assert_eq(checkpoint(&hosts[other], jw.w, 3, &info), 0, "%s", stash_errmsg());
    cr_assert_gt(info.id, before);
    await_committed(info.id, 1);
    close_workers_on(&jw, other);
    stop_host(&hosts[other]);
}

/* A host that joins aborts what is in flight (what a service of its host
 * before it may have left): the leader stops waiting for the parts of that
 * checkpoint then, not at its timeout, and the next one takes every host. */
Test(rados_job, a_checkpoint_a_joining_host_aborts_ends_at_once, .init = start_cluster)
{
    host *a = start_host("a", "0-0", 3), *b = start_host("b", "1-1", 3);
    await_logged("leads job");
    stash_worker *w[3] = {open_worker(a, 0, 3), open_worker(b, 1, 3), NULL};
    write_keys(w[0], 0, 3, 1, KEYS);
    write_keys(w[1], 1, 3, 1, KEYS);
    ckpt_storage *r;
    cr_assert_eq(open_pool(&r), 0, "%s", stash_errmsg());
    ckpt_job_record *rec = malloc(sizeof *rec);
    stash_arena *ar;
    cr_assert_eq(stash_arena_open(a->arena, NULL, &ar), 0, "%s", stash_errmsg());
    stash_checkpoint_info info;
    test_pending *p = test_checkpoint_begin(ar, &info);
    /* The job's first checkpoint waits for worker 2 once both parts are in. */
    stash_event ev;
    for (unsigned ms = 0; ms < WAIT_MS; ms += 20) {
        for (size_t i = 0; i < 2; i++) stash_barrier(w[i], &ev);
        cr_assert_eq(ckpt_job_notes(r, job, 1, rec), 0, "%s", stash_errmsg());
        if (rec->n == 2) break;
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    cr_assert_eq(rec->n, 2, "the parts of a and b never came in");
    host *c = start_host("c", "2-2", 3);
    while (!test_checkpoint_done(p))
        for (size_t i = 0; i < 2; i++) stash_barrier(w[i], &ev);
    cr_assert_neq(test_checkpoint_end(p), 0, "checkpoint 1 committed without worker 2");
    stash_arena_close(ar);
    await_logged("ms: job checkpoint 1 was aborted: its host's service changed");
    for (size_t i = 0; i < nhosts; i++)
        cr_assert(!logged(&hosts[i], "no part of worker 2"), "host %s waited for c's part",
                  hosts[i].name);
    w[2] = open_worker(c, 2, 3);
    cr_assert_eq(checkpoint(a, w, 3, &info), 0, "%s", stash_errmsg());
    await_committed(info.id, 3);
    for (size_t i = 0; i < 3; i++) stash_worker_close(w[i]);
    free(rec);
    ckpt_storage_close(r);
}

/* A host restores between its join and its engine's start: a checkpoint
 * the leader asks for meanwhile is asked of it too (it missed it once, and
 * the leader waited for its part until its timeout). */
Test(rados_job, a_host_hears_what_is_asked_between_its_join_and_its_start, .init = start_cluster)
{
    ckpt_storage *r, *leader;
    cr_assert_eq(open_pool(&r), 0, "%s", stash_errmsg());
    cr_assert_eq(open_pool(&leader), 0, "%s", stash_errmsg());
    svc_job_opts o = {
        .remote = r, .job = job, .host = "a", .parallelism = 1, .max_parallelism = MAXP};
    cr_assert_eq(ckpt_job_workers_parse("0", &o.workers), 0);
    svc_job *j;
    cr_assert_eq(job_open(&o, &j), 0, "%s", stash_errmsg());
    char ctl[1024];
    cr_assert_eq(ckpt_job_object(ctl, sizeof ctl, job, "ctl"), 0);
    cr_assert_geq(ckpt_storage_notify(leader, ctl, "checkpoint 7", 5000), 0, "%s", stash_errmsg());
    for (unsigned ms = 0; ms < WAIT_MS && job_requested(j) != 7; ms += 20) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    cr_assert_eq(job_requested(j), 7, "the request never reached the host");
    job_close(j);
    ckpt_storage_close(leader);
    ckpt_storage_close(r);
}

/* Passes worker w's barriers until one returns STASH_EFENCED, or fails. */
static void await_fenced(stash_worker *w)
{
    stash_event ev;
    int rc = 0;
    for (unsigned ms = 0; ms < WAIT_MS && rc != STASH_EFENCED; ms += 20) {
        rc = stash_barrier(w, &ev);
        struct timespec ts = {0, 20000000};
        if (rc != STASH_EFENCED) nanosleep(&ts, NULL);
    }
    cr_assert_eq(rc, STASH_EFENCED, "%d: %s", rc, stash_errmsg());
}

/* The job's committed records in the pool (JOB/job-ID objects). */
typedef struct pool_count {
    const char *prefix;
    unsigned records, parts;
} pool_count;

static int count_object(void *ctx, const char *name)
{
    pool_count *c = ctx;
    const char *rest = name + strlen(c->prefix);
    if (strncmp(rest, "job-", 4) == 0) c->records++;
    if (strncmp(rest, "part/", 5) == 0 && strstr(rest, "/_metadata.0")) c->parts++;
    return 0;
}

static int stash_serve(const char *extra, char *out, size_t cap)
{
    char args[1024];
    snprintf(args, sizeof args,
             "serve t-job-refused-%d --storage rados --pool %s --ceph-conf %s --job %s "
             "--max-parallelism %u --dir %s/refused --lease 2s %s",
             (int)getpid(), pool, conf, job, MAXP, dir, extra);
    return test_run_stash(args, out, cap);
}

Test(rados_job, refusals_osd_stopped_and_rescaled_to_two_hosts, .init = start_own_cluster)
{
    host *a = start_host("a", "0-0", 3);
    start_host("b", "1-1", 3);
    start_host("c", "2-2", 3);
    size_t leader = await_logged("leads job");
    stash_worker *w[4] = {open_worker(a, 0, 3), open_worker(&hosts[1], 1, 3),
                          open_worker(&hosts[2], 2, 3)};
    char out[4096];
    /* A live host's workers are its own; options are checked. */
    cr_assert_eq(stash_serve("--host x --workers 0-1 --job-parallelism 3", out, sizeof out), 1,
                 "%s", out);
    cr_assert(strstr(out, "is served by live host"), "%s", out);
    cr_assert_eq(stash_serve("--host a --workers 0-0 --job-parallelism 3", out, sizeof out), 1,
                 "%s", out);
    cr_assert(strstr(out, "host a is served by another service"), "%s", out);
    /* Refused before anything was made: no arena is left behind. */
    char refused[96];
    snprintf(refused, sizeof refused, "/dev/shm/stash.t-job-refused-%d", (int)getpid());
    cr_assert_eq(access(refused, F_OK), -1, "%s was left behind", refused);
    cr_assert_eq(stash_serve("--host x --job-parallelism 3", out, sizeof out), 2, "%s", out);
    cr_assert_eq(stash_serve("--host x --workers 2-1 --job-parallelism 3", out, sizeof out), 1,
                 "%s", out);
    cr_assert(strstr(out, "workers '2-1'"), "%s", out);
    cr_assert_eq(stash_serve("--host x --workers 3 --job-parallelism 3", out, sizeof out), 1, "%s",
                 out);
    cr_assert(strstr(out, "worker 3 of a job of 3 workers"), "%s", out);
    cr_assert_eq(stash_serve("--host x/y --workers 0 --job-parallelism 3", out, sizeof out), 1,
                 "%s", out);
    cr_assert_eq(stash_serve("--host x --workers 0 --job-parallelism 3 --restore /nonexistent", out,
                             sizeof out),
                 1, "%s", out);
    cr_assert(strstr(out, "/nonexistent: names no storage"), "%s", out);
    cr_assert_eq(stash_serve("--host x --workers 0 --job-parallelism 3 --restore "
                             "rados://other/j/job-3",
                             out, sizeof out),
                 1, "%s", out);
    char restore[256], want[256];
    snprintf(want, sizeof want,
             "a job's hosts restore from a job of their own storage (rados://%s)", pool);
    cr_assert(strstr(out, want), "%s", out);
    snprintf(restore, sizeof restore,
             "--host x --workers 0 --job-parallelism 3 --restore rados://%s/j/chk-3", pool);
    cr_assert_eq(stash_serve(restore, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "not a job checkpoint"), "%s", out);
    stash_checkpoint_info info;

    for (uint32_t i = 0; i < 3; i++) write_round(w[i], i, 3, 1);
    cr_assert_eq(checkpoint(a, w, 3, &info), 0, "%s", stash_errmsg());
    await_committed(info.id, 3);
    for (uint32_t i = 0; i < 3; i++) write_round(w[i], i, 3, 2);

    /* The OSD stopped mid-checkpoint: once the leader triggered it (host
     * c's worker holds it up), the OSD goes. Host c, which cannot write its
     * part, fails it at once; the hosts that noted theirs wait for the
     * pool's decision, which they read once the OSD is back: aborted, on
     * every host. The next one commits. */
    stash_arena *asked_of;
    cr_assert_eq(stash_arena_open(a->arena, NULL, &asked_of), 0);
    test_pending *q = test_checkpoint_begin(asked_of, &info);
    stash_arena *held;
    cr_assert_eq(stash_arena_open(hosts[2].arena, NULL, &held), 0);
    stash_service_info si;
    stash_event ev;
    do {
        stash_barrier(w[0], &ev);
        stash_barrier(w[1], &ev);
        cr_assert_eq(stash_service_info_get(held, &si), 0);
    } while (!si.pending);
    uint64_t failed = si.pending;
    cr_assert_eq(test_ceph("osd-stop"), 0);
    char text[128];
    snprintf(text, sizeof text, "checkpoint %llu: failed", (unsigned long long)failed);
    for (unsigned ms = 0; ms < WAIT_MS && !logged(&hosts[2], text); ms += 20) {
        for (uint32_t i = 0; i < 3; i++) stash_barrier(w[i], &ev);
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    cr_assert(logged(&hosts[2], text), "host c never failed checkpoint %llu",
              (unsigned long long)failed);
    cr_assert_eq(test_ceph("osd-start"), 0, "the OSD did not start again");
    while (!test_checkpoint_done(q))
        for (uint32_t i = 0; i < 3; i++) stash_barrier(w[i], &ev);
    int qrc = test_checkpoint_end(q);
    cr_assert_eq(qrc, STASH_EABORTED, "%d: %llu %s", qrc, (unsigned long long)info.id, info.detail);
    stash_arena_close(asked_of);
    stash_arena_close(held);
    cr_assert_eq(info.id, failed, "answered by %llu: %s", (unsigned long long)info.id, info.detail);
    for (size_t i = 0; i < 3; i++) await_failed(&hosts[i], failed);
    for (uint32_t i = 0; i < 3; i++) write_round(w[i], i, 3, 3);
    /* The lead may move as the leases come back (the one in flight then
     * aborts, "the leader lost its lease"): one of the next few commits. */
    int crc = -1;
    for (int tries = 0; crc != 0 && tries < 5; tries++)
        if ((crc = try_checkpoint(&hosts[1], w, 3, &info)) != 0)
            cr_assert(strstr(info.detail, "lost its lease") || strstr(info.detail, "undecided"),
                      "%s", info.detail);
    cr_assert_eq(crc, 0, "%s", info.detail);
    cr_assert_gt(info.id, failed);
    await_committed(info.id, 3);
    for (size_t i = 0; i < 3; i++) await_completed(&hosts[i], info.id);
    /* Two more: retention keeps 2 records and the parts they name. */
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(checkpoint(&hosts[2], w, 3, &info), 0, "%s", stash_errmsg());
        await_committed(info.id, 3);
    }
    ckpt_storage *r;
    cr_assert_eq(open_pool(&r), 0);
    char prefix[96];
    snprintf(prefix, sizeof prefix, "%s/", job);
    pool_count pc = {prefix, 0, 0};
    cr_assert_eq(ckpt_storage_objects(r, prefix, count_object, &pc), 0);
    cr_assert_eq(pc.records, 2, "records kept: %u", pc.records);
    cr_assert_eq(pc.parts, 6, "parts kept: %u", pc.parts);
    /* Each part reads as a checkpoint: JOB/part/HOST/EPOCH/chk-ID. */
    ckpt_job_record *rec = malloc(sizeof *rec);
    cr_assert_eq(ckpt_job_record_read(r, job, info.id, rec), 0, "%s", stash_errmsg());
    uint64_t epoch_b = 0, epoch_c = 0;
    for (size_t k = 0; k < rec->n; k++) {
        if (strcmp(rec->parts[k].host, "b") == 0) epoch_b = rec->parts[k].epoch;
        if (strcmp(rec->parts[k].host, "c") == 0) epoch_c = rec->parts[k].epoch;
    }
    free(rec);
    cr_assert(epoch_b && epoch_c && epoch_b != epoch_c, "epochs %llu %llu",
              (unsigned long long)epoch_b, (unsigned long long)epoch_c);
    ckpt_storage_close(r);
    setenv("CEPH_CONF", conf, 1);
    char url[256];
    snprintf(url, sizeof url, "snapshot verify rados://%s/%s/part/b/%llu/chk-%llu", pool, job,
             (unsigned long long)epoch_b, (unsigned long long)info.id);
    cr_assert_eq(test_run_stash(url, out, sizeof out), 0, "%s", out);
    /* ls lists each job checkpoint once, as what restores it; its parts
     * with --json. */
    snprintf(url, sizeof url, "snapshot ls rados://%s/%s", pool, job);
    cr_assert_eq(test_run_stash(url, out, sizeof out), 0, "%s", out);
    char line[256];
    snprintf(line, sizeof line, "complete     3      rados://%s/%s/job-%llu (latest)", pool, job,
             (unsigned long long)info.id);
    cr_assert(strstr(out, line), "%s", out);
    cr_assert(!strstr(out, "/part/"), "%s", out);
    snprintf(url, sizeof url, "snapshot ls rados://%s/%s --json", pool, job);
    cr_assert_eq(test_run_stash(url, out, sizeof out), 0, "%s", out);
    snprintf(line, sizeof line,
             "{\"id\": %llu, \"state\": \"complete\", \"savepoint\": false, \"latest\": true, "
             "\"url\": \"rados://%s/%s/job-%llu\", \"parts\": [",
             (unsigned long long)info.id, pool, job, (unsigned long long)info.id);
    cr_assert(strstr(out, line), "%s", out);
    snprintf(line, sizeof line, "\"url\": \"rados://%s/%s/part/c/%llu/chk-%llu\"", pool, job,
             (unsigned long long)epoch_c, (unsigned long long)info.id);
    cr_assert(strstr(out, line), "%s", out);

    /* A host frozen past its lease is taken for lost: its worker goes to a
     * live host; thawed, it finds itself fenced off and the job goes on
     * without it. */
    size_t frozen = leader == 2 ? 1 : 2;
    kill(hosts[frozen].pid, SIGSTOP);
    snprintf(url, sizeof url, "workers %zu-%zu of lost host %s over", frozen, frozen,
             hosts[frozen].name);
    size_t taker = await_logged(url);
    cr_assert_eq(taker, 0, "host %s took them, not a", hosts[taker].name);
    kill(hosts[frozen].pid, SIGCONT);
    await_logged("was fenced off");
    /* Its worker hears it at a barrier: its workers are served elsewhere. */
    await_fenced(w[frozen]);
    cr_assert(strstr(stash_errmsg(), "fenced off"), "%s", stash_errmsg());
    stash_worker_close(w[frozen]);
    w[frozen] = open_worker(&hosts[taker], (uint32_t)frozen, 3);
    check_round(w[frozen], (uint32_t)frozen, 3, 3);
    cr_assert_eq(checkpoint(&hosts[taker], w, 3, &info), 0, "%s", stash_errmsg());
    await_committed(info.id, 2);
    for (uint32_t i = 0; i < 3; i++) write_round(w[i], i, 3, 4);

    /* Rescaled: the job stopped, restored on two hosts of four workers
     * from its newest checkpoint (round 3). */
    for (size_t i = 0; i < 3; i++) stash_worker_close(w[i]);
    for (size_t i = 0; i < 3; i++) stop_host(&hosts[i]);
    host *d = start_host("d", "0-1", 4), *e = start_host("e", "2-3", 4);
    stash_worker *v[4] = {open_worker(d, 0, 4), open_worker(d, 1, 4), open_worker(e, 2, 4),
                          open_worker(e, 3, 4)};
    for (uint32_t i = 0; i < 4; i++) check_round(v[i], i, 4, 3);
    for (uint32_t i = 0; i < 4; i++) write_round(v[i], i, 4, 5);
    cr_assert_eq(checkpoint(e, v, 4, &info), 0, "%s", stash_errmsg());
    await_committed(info.id, 2);
    for (uint32_t i = 0; i < 4; i++) stash_worker_close(v[i]);
}

/* Waits until nobody holds the lease on object name (it lapsed). */
static void await_lapsed(ckpt_storage *r, const char *name)
{
    int held = 1;
    for (unsigned ms = 0; ms < WAIT_MS && held == 1; ms += 50) {
        held = ckpt_storage_lease_held(r, name);
        struct timespec ts = {0, 50000000};
        if (held == 1) nanosleep(&ts, NULL);
    }
    cr_assert_eq(held, 0, "%s: the lease never lapsed (%d)", name, held);
}

Test(rados_job, one_decision_and_fences_made_by_the_pool, .init = start_cluster)
{
    /* Two services as two processes would be: each its own connection.
     * What the test pauses is the order of their calls, not time. */
    ckpt_storage *ra, *rb;
    cr_assert_eq(open_pool(&ra), 0);
    cr_assert_eq(open_pool(&rb), 0);
    ckpt_job_part pa = {.host = "h1", .parallelism = 1, .max_parallelism = MAXP};
    cr_assert_eq(ckpt_job_workers_parse("0", &pa.workers), 0);
    ckpt_job_part pb = pa;
    cr_assert_eq(ckpt_job_join(ra, job, &pa, "A", 1000), 0, "%s", stash_errmsg());
    cr_assert_gt(pa.epoch, 0);
    ckpt_job_record *rec = malloc(sizeof *rec);

    /* A leader paused past its lease: the next one's epoch fences it; the
     * undecided checkpoint is aborted, and its commit fails. */
    uint64_t la, lb, id1, id2, id3, id4, id5;
    cr_assert_eq(ckpt_job_lead(ra, job, &la), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_job_next_id(ra, job, &id1), 0);
    cr_assert_eq(ckpt_job_note(ra, job, id1, &pa), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_job_notes(ra, job, id1, rec), 0);
    cr_assert_eq(rec->n, 1);
    cr_assert_eq(ckpt_job_covered(rec), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_job_lead(rb, job, &lb), 0);
    cr_assert_eq(lb, la + 1);
    cr_assert_eq(ckpt_job_verdict(rb, job, id1), 0, "undecided");
    cr_assert_eq(ckpt_job_abort(rb, job, id1, "left undecided by the last leader"), 0);
    cr_assert_eq(ckpt_job_commit(ra, job, rec, la), -ECANCELED);
    cr_assert(strstr(stash_errmsg(), "was aborted: left undecided"), "%s", stash_errmsg());
    cr_assert_eq(ckpt_job_verdict(ra, job, id1), -ECANCELED);
    uint64_t latest = 0;
    cr_assert_eq(ckpt_job_latest(ra, job, &latest, NULL), -ENOENT, "nothing committed");
    /* Deposed without an abort in its way: the epoch alone refuses it. */
    cr_assert_eq(ckpt_job_next_id(ra, job, &id2), 0);
    cr_assert_eq(ckpt_job_note(ra, job, id2, &pa), 0);
    cr_assert_eq(ckpt_job_notes(ra, job, id2, rec), 0);
    cr_assert_eq(ckpt_job_commit(ra, job, rec, la), -ECANCELED);
    cr_assert(strstr(stash_errmsg(), "the lead passed on"), "%s", stash_errmsg());
    /* The leader of the newest epoch commits it; an abort after that
     * learns it was committed, and so does every verdict. */
    cr_assert_eq(ckpt_job_commit(rb, job, rec, lb), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_job_abort(ra, job, id2, "too late"), 1);
    cr_assert_eq(ckpt_job_verdict(ra, job, id2), 1);
    cr_assert_eq(ckpt_job_latest(ra, job, &latest, rec), 0);
    cr_assert_eq(latest, id2);
    cr_assert_eq(rec->n, 1);
    cr_assert_eq(rec->parts[0].epoch, pa.epoch);
    /* A host's abort (no verdict in time) first: the commit fails. */
    cr_assert_eq(ckpt_job_next_id(rb, job, &id3), 0);
    cr_assert_eq(ckpt_job_note(ra, job, id3, &pa), 0);
    cr_assert_eq(ckpt_job_notes(rb, job, id3, rec), 0);
    cr_assert_eq(ckpt_job_abort(ra, job, id3, "no verdict in time"), 0);
    cr_assert_eq(ckpt_job_commit(rb, job, rec, lb), -ECANCELED);
    cr_assert_eq(ckpt_job_verdict(rb, job, id3), -ECANCELED);
    cr_assert(strstr(stash_errmsg(), "no verdict in time"), "%s", stash_errmsg());
    /* One passed over by a later commit is aborted, and stays so; no
     * commit goes below the committed id. */
    cr_assert_eq(ckpt_job_next_id(rb, job, &id4), 0);
    cr_assert_eq(ckpt_job_next_id(rb, job, &id5), 0);
    cr_assert_eq(ckpt_job_note(ra, job, id5, &pa), 0);
    cr_assert_eq(ckpt_job_notes(rb, job, id5, rec), 0);
    cr_assert_eq(ckpt_job_commit(rb, job, rec, lb), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_job_verdict(ra, job, id4), -ECANCELED);
    cr_assert(strstr(stash_errmsg(), "passed over"), "%s", stash_errmsg());
    cr_assert_eq(ckpt_job_verdict(rb, job, id4), -ECANCELED);
    cr_assert(strstr(stash_errmsg(), "passed over"), "%s", stash_errmsg());
    rec->id = id4;
    cr_assert_eq(ckpt_job_commit(rb, job, rec, lb), -ECANCELED);

    /* A second service of host h1 once the first one's lease lapsed (the
     * first paused): a new epoch; the first one's notes and member
     * changes fail from then on, and only the new one's note counts. */
    char member[256];
    snprintf(member, sizeof member, "%s/hosts/h1", job);
    cr_assert_eq(ckpt_job_join(rb, job, &pb, "B", 1000), -EBUSY, "the first one's lease holds");
    await_lapsed(rb, member);
    cr_assert_eq(ckpt_job_join(rb, job, &pb, "B", 1000), 0, "%s", stash_errmsg());
    cr_assert_gt(pb.epoch, pa.epoch);
    uint64_t id6;
    cr_assert_eq(ckpt_job_next_id(rb, job, &id6), 0);
    cr_assert_eq(ckpt_job_note(ra, job, id6, &pa), STASH_EFENCED);
    cr_assert(strstr(stash_errmsg(), "is fenced off"), "%s", stash_errmsg());
    cr_assert_eq(ckpt_job_member_set(ra, job, &pa), STASH_EFENCED);
    cr_assert_eq(ckpt_storage_lock(ra, member, "A", 1000), -EBUSY);
    cr_assert_eq(ckpt_job_notes(rb, job, id6, rec), 0);
    cr_assert_eq(rec->n, 0, "the fenced service's note does not count");
    cr_assert_eq(ckpt_job_note(rb, job, id6, &pb), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_job_notes(rb, job, id6, rec), 0);
    cr_assert_eq(rec->n, 1);
    cr_assert_eq(rec->parts[0].epoch, pb.epoch);
    /* A takeover's claim replaces the epoch: the second service is fenced
     * off too; a claim on what changed meanwhile fails. */
    char seen[32];
    snprintf(seen, sizeof seen, "%llu", (unsigned long long)pb.epoch);
    cr_assert_eq(ckpt_job_claim(ra, job, "h1", seen, "h2"), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_job_claim(ra, job, "h1", seen, "h3"), -ECANCELED);
    cr_assert_eq(ckpt_job_note(rb, job, id6, &pb), STASH_EFENCED);
    ckpt_job_member m;
    cr_assert_eq(ckpt_job_member_read(ra, member, &m), 0);
    cr_assert(ckpt_job_member_taken(&m));
    cr_assert_eq(ckpt_job_member_epoch(&m), 0);

    /* Retention keeps the newest committed one and forgets the decisions
     * below it: a verdict on one says so. */
    cr_assert_eq(ckpt_job_retain(rb, job, 1, lb), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_job_verdict(ra, job, id2), -ESTALE);
    cr_assert_eq(ckpt_job_verdict(ra, job, id5), 1);
    uint64_t *ids;
    size_t n;
    cr_assert_eq(ckpt_job_records(ra, job, &ids, &n), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(ids[0], id5);
    free(ids);
    /* Retention by a leader whose lead passed on removes nothing. */
    cr_assert_eq(ckpt_job_retain(ra, job, 1, la), -ECANCELED);
    cr_assert(strstr(stash_errmsg(), "the lead passed on"), "%s", stash_errmsg());
    cr_assert_eq(ckpt_job_verdict(ra, job, id5), 1);

    /* A savepoint is kept past retention, and so is its decision. */
    uint64_t id7, id8;
    cr_assert_eq(ckpt_job_next_id(rb, job, &id7), 0);
    rec->id = id7;
    rec->savepoint = true;
    cr_assert_eq(ckpt_job_commit(rb, job, rec, lb), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_job_next_id(rb, job, &id8), 0);
    rec->id = id8;
    rec->savepoint = false;
    cr_assert_eq(ckpt_job_commit(rb, job, rec, lb), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_job_retain(rb, job, 1, lb), 0, "%s", stash_errmsg());
    cr_assert_eq(ckpt_job_verdict(ra, job, id5), -ESTALE);
    cr_assert_eq(ckpt_job_verdict(ra, job, id7), 1);
    cr_assert_eq(ckpt_job_abort(ra, job, id7, "too late"), 1);
    cr_assert_eq(ckpt_job_records(ra, job, &ids, &n), 0);
    cr_assert_eq(n, 2);
    cr_assert(ids[0] == id8 && ids[1] == id7);
    free(ids);
    cr_assert_eq(ckpt_job_record_read(ra, job, id7, rec), 0, "%s", stash_errmsg());
    cr_assert(rec->savepoint);
    cr_assert_eq(ckpt_job_record_read(ra, job, id5, rec), -ENOENT);
    free(rec);
    ckpt_storage_close(ra);
    ckpt_storage_close(rb);
}

Test(rados_job, a_second_service_of_a_host_fences_the_first_and_stale_arenas_restore,
     .init = start_cluster)
{
    /* One host: nobody takes its worker over while its service is paused. */
    host *b = start_host("b", "0-0", 1);
    await_logged("host b leads job");
    stash_worker *w = open_worker(b, 0, 1);
    write_round(w, 0, 1, 1);
    stash_checkpoint_info info;
    cr_assert_eq(checkpoint(b, &w, 1, &info), 0, "%s", stash_errmsg());
    await_committed(info.id, 1);
    write_round(w, 0, 1, 2);

    /* Its service paused past its lease (its worker runs on); a second
     * service of host b on another arena joins under a new epoch and
     * restores round 1. */
    kill(b->pid, SIGSTOP);
    ckpt_storage *r;
    cr_assert_eq(open_pool(&r), 0);
    char member[256];
    snprintf(member, sizeof member, "%s/hosts/b", job);
    await_lapsed(r, member);
    host *b2 = start_host_on("b", "b2", "0-0", 1);
    stash_worker *w2 = open_worker(b2, 0, 1);
    check_round(w2, 0, 1, 1);
    /* The first one wakes: fenced off, its worker told so. */
    kill(b->pid, SIGCONT);
    await_logged("was fenced off");
    await_fenced(w);
    stash_worker_close(w);
    cr_assert_eq(
        stash_worker_open(
            b->arena,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 1},
            &w),
        STASH_EFENCED, "a worker opening on the fenced arena");
    /* The job goes on with the second one: its parts are committed. */
    write_round(w2, 0, 1, 3);
    cr_assert_eq(checkpoint(b2, &w2, 1, &info), 0, "%s", stash_errmsg());
    char text[128];
    snprintf(text, sizeof text, "job checkpoint %llu committed", (unsigned long long)info.id);
    await_logged(text);
    ckpt_job_record *rec = malloc(sizeof *rec);
    uint64_t latest;
    cr_assert_eq(ckpt_job_latest(r, job, &latest, rec), 0, "%s", stash_errmsg());
    cr_assert_eq(latest, info.id);
    cr_assert_eq(rec->n, 1);
    uint64_t second = rec->parts[0].epoch;
    stash_worker_close(w2);

    /* Both stopped, the first one started again on its own arena: that
     * arena is behind the job (its part is not in the newest checkpoint)
     * and is restored anew: round 3, not round 2. */
    kill_service(b);
    stop_host(b2);
    host *b3 = start_host("b", "0-0", 1);
    await_logged("restored anew from it");
    w = open_worker(b3, 0, 1);
    check_round(w, 0, 1, 3);
    write_round(w, 0, 1, 4);
    cr_assert_eq(checkpoint(b3, &w, 1, &info), 0, "%s", stash_errmsg());
    snprintf(text, sizeof text, "job checkpoint %llu committed", (unsigned long long)info.id);
    await_logged(text);
    cr_assert_eq(ckpt_job_latest(r, job, &latest, rec), 0);
    cr_assert_gt(rec->parts[0].epoch, second);

    /* That service killed, its worker still attached; the job goes on
     * with another service of host b. The killed one started again on the
     * kept arena restores it anew, and the worker left on the arena it
     * replaced is told to stop (it would go on unseen). */
    kill_service(b3);
    await_lapsed(r, member);
    host *b4 = start_host_on("b", "b2", "0-0", 1);
    w2 = open_worker(b4, 0, 1);
    check_round(w2, 0, 1, 4);
    write_round(w2, 0, 1, 5);
    cr_assert_eq(checkpoint(b4, &w2, 1, &info), 0, "%s", stash_errmsg());
    snprintf(text, sizeof text, "job checkpoint %llu committed", (unsigned long long)info.id);
    await_logged(text);
    stash_worker_close(w2);
    stop_host(b4);
    host *b5 = start_host("b", "0-0", 1);
    await_logged("restored anew from it");
    await_fenced(w);
    cr_assert(strstr(stash_errmsg(), "restored anew"), "%s", stash_errmsg());
    stash_worker_close(w);
    w = open_worker(b5, 0, 1);
    check_round(w, 0, 1, 5);
    stash_worker_close(w);
    free(rec);
    ckpt_storage_close(r);
    stop_host(b5);
}

Test(rados_job, a_claim_whose_taker_is_gone_is_given_up_and_asked_again, .init = start_cluster)
{
    /* Host z served worker 2; host y claimed its workers and was gone before
     * it took them (it has no member). Nobody would serve worker 2 again
     * unless the leader gives that claim up. */
    ckpt_storage *r;
    cr_assert_eq(open_pool(&r), 0);
    ckpt_job_part z = {.host = "z", .parallelism = 3, .max_parallelism = MAXP};
    cr_assert_eq(ckpt_job_workers_parse("2-2", &z.workers), 0);
    cr_assert_eq(ckpt_job_join(r, job, &z, "Z", 1000), 0, "%s", stash_errmsg());
    char seen[32], member[256];
    snprintf(seen, sizeof seen, "%llu", (unsigned long long)z.epoch);
    cr_assert_eq(ckpt_job_claim(r, job, "z", seen, "y"), 0, "%s", stash_errmsg());
    snprintf(member, sizeof member, "%s/hosts/z", job);
    await_lapsed(r, member);
    stash_worker *w[3];
    host *a = start_host("a", "0-0", 3), *b = start_host("b", "1-1", 3);
    await_logged("host y, which was taking host z's workers over, is gone");
    size_t taker = await_logged("took workers 2-2 of lost host z over");
    w[0] = open_worker(a, 0, 3);
    w[1] = open_worker(b, 1, 3);
    w[2] = open_worker(&hosts[taker], 2, 3);
    for (uint32_t i = 0; i < 3; i++) write_round(w[i], i, 3, 1);
    stash_checkpoint_info info;
    cr_assert_eq(checkpoint(a, w, 3, &info), 0, "%s", stash_errmsg());
    await_committed(info.id, 2);
    for (uint32_t i = 0; i < 3; i++) stash_worker_close(w[i]);
    ckpt_storage_close(r);
}

/* What a scan of a snapshot found: the count of each key, the operator
 * state's workers. */
typedef struct seen_all {
    uint64_t counts, others, wrong;
    unsigned offsets[3];
} seen_all;

static int seen_keyed(void *ctx, const stash_snapshot_entry *e)
{
    seen_all *s = ctx;
    unsigned k;
    char key[32];
    snprintf(key, sizeof key, "%.*s", (int)e->key.len, (const char *)e->key.data);
    if (strcmp(e->state, "other") == 0) {
        s->others++;
        return 0;
    }
    if (strcmp(e->state, "count") != 0 || sscanf(key, "key-%u", &k) != 1 ||
        e->value.len != sizeof(uint64_t) || test_u64(e->value.data) != 100000 + k)
        s->wrong++;
    s->counts++;
    return 0;
}

static int seen_op(void *ctx, const stash_snapshot_entry *e)
{
    seen_all *s = ctx;
    if (e->worker < 3 && strcmp(e->state, "offset") == 0) s->offsets[e->worker]++;
    return 0;
}

Test(rados_job, a_job_checkpoint_reads_and_restores_as_one, .init = start_cluster)
{
    host *a = start_host("a", "0-0", 3);
    start_host("b", "1-1", 3);
    start_host("c", "2-2", 3);
    await_logged("leads job");
    stash_worker *w[3] = {open_worker(a, 0, 3), open_worker(&hosts[1], 1, 3),
                          open_worker(&hosts[2], 2, 3)};
    /* Host a's arena numbers its states otherwise than the others': a
     * state of its own first. Each worker keeps an offset in operator state. */
    stash_state *other, *offset;
    cr_assert_eq(stash_state_get(w[0],
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "other",
                                                     .kind = STASH_VALUE},
                                 &other),
                 0);
    cr_assert_eq(stash_key_set(w[0], "x", 1), 0);
    cr_assert_eq(stash_value_put(other, "y", 1), 0);
    for (uint32_t i = 0; i < 3; i++) {
        write_round(w[i], i, 3, 1);
        cr_assert_eq(stash_state_get(w[i],
                                     &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                         .name = "offset",
                                                         .kind = STASH_OP_LIST},
                                     &offset),
                     0);
        stash_bytes at = {&i, sizeof i};
        cr_assert_eq(stash_op_list_update(offset, &at, 1), 0);
    }
    stash_checkpoint_info info;
    cr_assert_eq(checkpoint(a, w, 3, &info), 0, "%s", stash_errmsg());
    await_committed(info.id, 3);
    for (uint32_t i = 0; i < 3; i++) stash_worker_close(w[i]);

    /* Read as one: every key of every part under its one state, each
     * worker's operator state from its host's part. */
    setenv("CEPH_CONF", conf, 1);
    char url[256];
    snprintf(url, sizeof url, "rados://%s/%s/job-%llu", pool, job, (unsigned long long)info.id);
    stash_snapshot *snap;
    cr_assert_eq(stash_snapshot_open(url, &snap), 0, "%s", stash_errmsg());
    stash_snapshot_info si;
    cr_assert_eq(stash_snapshot_info_get(snap, &si), 0);
    cr_assert_eq(si.id, info.id);
    cr_assert_eq(si.max_parallelism, MAXP);
    cr_assert_eq(si.op_parallelism, 3);
    cr_assert_eq(si.nstates, 3, "count, other and offset, once each");
    seen_all seen = {0};
    cr_assert_eq(stash_snapshot_scan(snap, (stash_kg_range){0, MAXP - 1}, seen_keyed, &seen), 0);
    cr_assert_eq(seen.counts, KEYS);
    cr_assert_eq(seen.others, 1);
    cr_assert_eq(seen.wrong, 0);
    cr_assert_eq(stash_snapshot_op_scan(snap, seen_op, &seen), 0);
    for (uint32_t i = 0; i < 3; i++) cr_assert_eq(seen.offsets[i], 1, "worker %u", i);
    stash_snapshot_close(snap);
    char out[8192], args[512];
    snprintf(args, sizeof args, "snapshot verify rados://%s/%s", pool, job);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);

    /* Restored on one machine, from the job's newest checkpoint: one worker
     * holds every key. */
    char name[96], local[256];
    snprintf(name, sizeof name, "t-job-one-%d", (int)getpid());
    snprintf(local, sizeof local, "%s/one", dir);
    snprintf(url, sizeof url, "rados://%s/%s", pool, job);
    stash_service *one;
    cr_assert_eq(
        stash_service_start(
            name,
            &(stash_service_opts){.sz = sizeof(stash_service_opts),
                                  .dir = local,
                                  .restore = url,
                                  .arena = &(stash_arena_opts){.sz = sizeof(stash_arena_opts),
                                                               .max_parallelism = MAXP}},
            &one),
        0, "%s", stash_errmsg());
    stash_worker *all;
    cr_assert_eq(stash_worker_open(name, NULL, &all), 0, "%s", stash_errmsg());
    check_round(all, 0, 1, 1);
    stash_worker_close(all);
    stash_service_stop(one);
    stash_arena_destroy(name, NULL);

    /* Two hosts that disagree on a state (host b's "other" is a map) make
     * no one snapshot: refused, naming both. */
    for (uint32_t i = 0; i < 3; i++) w[i] = open_worker(&hosts[i], i, 3);
    cr_assert_eq(
        stash_state_get(
            w[1],
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "other", .kind = STASH_MAP},
            &other),
        0);
    char mine[16];
    int len = 0;
    for (unsigned k = 0; k < 1000; k++) {
        len = snprintf(mine, sizeof mine, "m%u", k);
        if (stash_kg_owner(stash_key_group(mine, (size_t)len, MAXP), MAXP, 3) == 1) break;
    }
    cr_assert_eq(stash_key_set(w[1], mine, (size_t)len), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_map_put(other, "k", 1, "v", 1), 0, "%s", stash_errmsg());
    cr_assert_eq(checkpoint(a, w, 3, &info), 0, "%s", stash_errmsg());
    await_committed(info.id, 3);
    for (uint32_t i = 0; i < 3; i++) stash_worker_close(w[i]);
    snprintf(url, sizeof url, "rados://%s/%s/job-%llu", pool, job, (unsigned long long)info.id);
    cr_assert_eq(stash_snapshot_open(url, &snap), STASH_ECORRUPT);
    /* Named by the part found second (the record lists the parts in any order). */
    const char *why = stash_errmsg();
    cr_assert(strstr(why, "state 'other' is of another kind or options than in host"), "%s", why);
    cr_assert((strstr(why, "parts/a/") && strstr(why, "host b's part")) ||
                  (strstr(why, "parts/b/") && strstr(why, "host a's part")),
              "%s", why);
}

/* A command run from another thread while workers reach barriers. */
typedef struct command {
    const char *args;
    char *out;
    size_t cap;
    int rc;
    atomic_bool done;
} command;

static void *run_command(void *arg)
{
    command *c = arg;
    c->rc = test_run_stash(c->args, c->out, c->cap);
    atomic_store(&c->done, true);
    return NULL;
}

/* Runs `stash args` while the n workers w reach barriers; its exit code,
 * its output in out. */
static int run_at_barriers(const char *args, stash_worker *const *w, size_t n, char *out,
                           size_t cap)
{
    command c = {args, out, cap, 0, false};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, run_command, &c), 0);
    stash_event ev;
    while (!atomic_load(&c.done))
        for (size_t i = 0; i < n; i++) stash_barrier(w[i], &ev);
    pthread_join(t, NULL);
    return c.rc;
}

/* The id a command's --json output names. */
static uint64_t id_of(const char *out)
{
    const char *at = strstr(out, "\"id\": ");
    unsigned long long id = 0;
    cr_assert(at && sscanf(at, "\"id\": %llu", &id) == 1, "no id in %s", out);
    return id;
}

static int count_savepoint_part(void *ctx, const char *name)
{
    const char *want = ((const char **)ctx)[0];
    if (strstr(name, "/part/") && strstr(name, want)) (*(unsigned *)((const char **)ctx)[1])++;
    return 0;
}

/* Objects JOB/part/.../savepoint-ID/_metadata.0 of the job's parts. */
static unsigned savepoint_parts(ckpt_storage *r, const char *jobname, uint64_t id)
{
    char prefix[96], want[64];
    unsigned n = 0;
    snprintf(prefix, sizeof prefix, "%s/part/", jobname);
    snprintf(want, sizeof want, "/savepoint-%llu/_metadata.0", (unsigned long long)id);
    const char *ctx[2] = {want, (const char *)&n};
    cr_assert_eq(ckpt_storage_objects(r, prefix, count_savepoint_part, ctx), 0);
    return n;
}

Test(rados_job, savepoints_of_a_job_start_a_new_one_and_stop_every_host, .init = start_cluster)
{
    host *a = start_host("a", "0-0", 2), *b = start_host("b", "1-1", 2);
    await_logged("leads job");
    stash_worker *w[2] = {open_worker(a, 0, 2), open_worker(b, 1, 2)};
    for (uint32_t i = 0; i < 2; i++) write_round(w[i], i, 2, 1);
    stash_checkpoint_info info;
    cr_assert_eq(checkpoint(a, w, 2, &info), 0, "%s", stash_errmsg());
    uint64_t first = info.id;
    await_committed(first, 2);

    /* A savepoint asked of any host is the whole job's: each host's part
     * a savepoint of its arena, the record what restores it. */
    for (uint32_t i = 0; i < 2; i++) write_round(w[i], i, 2, 2);
    char out[8192], args[512], text[1024];
    snprintf(args, sizeof args, "checkpoint %s --savepoint --json", b->arena);
    cr_assert_eq(run_at_barriers(args, w, 2, out, sizeof out), 0, "%s", out);
    uint64_t sp = id_of(out);
    char source[256];
    snprintf(source, sizeof source, "rados://%s/%s/job-%llu", pool, job, (unsigned long long)sp);
    snprintf(text, sizeof text, "\"savepoint\": true");
    cr_assert(strstr(out, text), "%s", out);
    snprintf(text, sizeof text, "\"path\": \"%s\"", source);
    cr_assert(strstr(out, text), "%s", out);
    snprintf(text, sizeof text, "job savepoint %llu committed: 2 parts", (unsigned long long)sp);
    await_logged(text);
    await_completed(a, sp);

    /* Checkpoints past retention (2 kept) keep it and its parts. */
    for (uint32_t i = 0; i < 2; i++) write_round(w[i], i, 2, 3);
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(checkpoint(a, w, 2, &info), 0, "%s", stash_errmsg());
        await_committed(info.id, 2);
    }
    uint64_t newest = info.id;
    for (uint32_t i = 0; i < 2; i++) stash_worker_close(w[i]);
    ckpt_storage *r;
    cr_assert_eq(open_pool(&r), 0);
    ckpt_job_record *rec = malloc(sizeof *rec);
    cr_assert_eq(ckpt_job_record_read(r, job, sp, rec), 0, "%s", stash_errmsg());
    cr_assert(rec->savepoint);
    cr_assert_eq(rec->n, 2);
    cr_assert_eq(ckpt_job_verdict(r, job, sp), 1, "a savepoint stays committed");
    cr_assert_eq(savepoint_parts(r, job, sp), 2);
    cr_assert_eq(ckpt_job_record_read(r, job, first, rec), -ENOENT, "checkpoint %llu retired",
                 (unsigned long long)first);
    setenv("CEPH_CONF", conf, 1);
    snprintf(args, sizeof args, "snapshot ls rados://%s/%s", pool, job);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    snprintf(text, sizeof text, "savepoint    2      %s\n", source);
    cr_assert(strstr(out, text), "%s", out);
    stop_host(a);
    stop_host(b);

    /* A new job started from it: every host of its first start restores
     * the same one (another refused), with the workers split otherwise. */
    char job2[96], other[256];
    snprintf(job2, sizeof job2, "%s-b", job);
    snprintf(other, sizeof other, "rados://%s/%s/job-%llu", pool, job, (unsigned long long)newest);
    host *c = start_host_of(job2, "c", "c", "0-0", 2, "--restore", source);
    for (unsigned ms = 0; ms < WAIT_MS && !logged(c, "serving /"); ms += 50) {
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
    host *d = start_host_of(job2, "d", "d", "1-1", 2, "--restore", other);
    cr_assert_neq(test_wait(d->pid), 0, "a host started from another checkpoint serves");
    d->pid = -1;
    snprintf(text, sizeof text, "job %s was first started from %s, not %s", job2, source, other);
    cr_assert(logged(d, text), "see %s", d->log);
    d = start_host_of(job2, "d", "d", "1-1", 2, "--restore", source);
    stash_worker *v[2] = {open_worker(c, 0, 2), open_worker(d, 1, 2)};
    for (uint32_t i = 0; i < 2; i++) check_round(v[i], i, 2, 2);
    /* A host lost before the new job's first commit: its worker is taken
     * over from what the job started from. */
    stash_worker_close(v[1]);
    lose_host(d);
    await_logged("workers 1-1 of lost host d over");
    v[1] = open_worker(c, 1, 2);
    check_round(v[1], 1, 2, 2);
    for (uint32_t i = 0; i < 2; i++) write_round(v[i], i, 2, 4);
    cr_assert_eq(checkpoint(c, v, 2, &info), 0, "%s", stash_errmsg());
    cr_assert_gt(info.id, sp, "the new job's ids go on above what it started from");
    await_committed(info.id, 1);

    /* Stopped with a savepoint: of the whole job, and its host stops. */
    snprintf(args, sizeof args, "stop %s --savepoint --json", c->arena);
    cr_assert_eq(run_at_barriers(args, v, 2, out, sizeof out), 0, "%s", out);
    uint64_t sp2 = id_of(out);
    snprintf(text, sizeof text, "\"path\": \"rados://%s/%s/job-%llu\"", pool, job2,
             (unsigned long long)sp2);
    cr_assert(strstr(out, text), "%s", out);
    for (uint32_t i = 0; i < 2; i++) stash_worker_close(v[i]);
    cr_assert_eq(test_wait(c->pid), 0, "see %s", c->log);
    c->pid = -1;
    uint64_t latest = 0;
    cr_assert_eq(ckpt_job_latest(r, job2, &latest, rec), 0, "%s", stash_errmsg());
    cr_assert_eq(latest, sp2);
    cr_assert(rec->savepoint);
    cr_assert_eq(savepoint_parts(r, job2, sp2), 1);

    /* Started again as its unit says (--restore and all): the job goes on
     * from its newest, the savepoint, not from what it first started from. */
    c = start_host_of(job2, "c", "c", "0-1", 2, "--restore", source);
    v[0] = open_worker(c, 0, 2);
    v[1] = open_worker(c, 1, 2);
    for (uint32_t i = 0; i < 2; i++) check_round(v[i], i, 2, 4);
    snprintf(text, sizeof text, "has committed checkpoint %llu since", (unsigned long long)sp2);
    await_logged(text);
    for (uint32_t i = 0; i < 2; i++) stash_worker_close(v[i]);
    free(rec);
    ckpt_storage_close(r);
}

/* The newest result host h's arena recorded for checkpoint id. */
static stash_checkpoint_info result_of(const host *h, uint64_t id)
{
    await_completed(h, id);
    stash_arena *ar;
    stash_service_info si;
    cr_assert_eq(stash_arena_open(h->arena, NULL, &ar), 0);
    cr_assert_eq(stash_service_info_get(ar, &si), 0);
    stash_arena_close(ar);
    for (size_t k = 0; k < si.nrecent; k++)
        if (si.recent[k].id == id) return si.recent[k];
    cr_assert_fail("host %s has no result of %llu", h->name, (unsigned long long)id);
    return si.recent[0];
}

static int count_prefix(void *ctx, const char *name)
{
    (void)name;
    (*(unsigned *)ctx)++;
    return 0;
}

/* The objects whose names start with JOB/what. */
static unsigned objects_of(ckpt_storage *r, const char *what)
{
    char prefix[128];
    unsigned n = 0;
    snprintf(prefix, sizeof prefix, "%s/%s", job, what);
    cr_assert_eq(ckpt_storage_objects(r, prefix, count_prefix, &n), 0);
    return n;
}

Test(rados_job, incremental_parts_restore_after_a_takeover_and_retire_their_shared_files,
     .init = start_cluster)
{
    host *a = start_host_of(job, "a", "a", "0-0", 3, "--incremental", NULL);
    host *b = start_host_of(job, "b", "b", "1-1", 3, "--incremental", NULL);
    host *c = start_host_of(job, "c", "c", "2-2", 3, "--incremental", NULL);
    await_logged("leads job");
    placed_workers jw = {{open_worker(a, 0, 3), open_worker(b, 1, 3), open_worker(c, 2, 3)},
                         {0, 1, 2}};
    write_all(&jw, 1);
    stash_checkpoint_info info;
    cr_assert_eq(checkpoint(a, jw.w, 3, &info), 0, "%s", stash_errmsg());
    await_committed(info.id, 3);
    cr_assert(!info.incremental, "the first part is full");
    uint64_t full_bytes = info.bytes;
    /* One key changed on each host: each part a delta of it alone. */
    for (uint32_t i = 0; i < 3; i++) touch_one(jw.w[i], i, 3, 1);
    cr_assert_eq(checkpoint(a, jw.w, 3, &info), 0, "%s", stash_errmsg());
    await_committed(info.id, 3);
    cr_assert(info.incremental);
    cr_assert_lt(info.bytes * 10, full_bytes, "a delta of one key: %llu bytes, the full %llu",
                 (unsigned long long)info.bytes, (unsigned long long)full_bytes);
    stash_checkpoint_info of_c = result_of(c, info.id);
    cr_assert(of_c.incremental);
    write_all(&jw, 2);
    cr_assert_eq(checkpoint(a, jw.w, 3, &info), 0, "%s", stash_errmsg());
    await_committed(info.id, 3);
    cr_assert(result_of(c, info.id).incremental);

    /* Host c lost after two deltas: its workers come back from its chain
     * (the full part and both deltas, their shared files fetched). */
    close_workers_on(&jw, 2);
    lose_host(c);
    size_t taker = await_logged("of lost host c over");
    move_workers(&jw, 2, taker, 2);
    /* The taker's next part is full (the key groups it restored are in no
     * change log); the other host's a delta. */
    cr_assert_eq(checkpoint(a, jw.w, 3, &info), 0, "%s", stash_errmsg());
    await_committed(info.id, 2);
    cr_assert(!result_of(&hosts[taker], info.id).incremental, "full after a takeover");
    cr_assert(result_of(&hosts[taker == 0 ? 1 : 0], info.id).incremental);

    /* Past retention (2 kept), the lost host's parts and shared files go;
     * what the kept deltas rest on stays, and the job reads whole. */
    for (int k = 0; k < 2; k++) {
        for (uint32_t i = 0; i < 3; i++) touch_one(jw.w[i], i, 3, 2);
        cr_assert_eq(checkpoint(a, jw.w, 3, &info), 0, "%s", stash_errmsg());
        await_committed(info.id, 2);
    }
    ckpt_storage *r;
    cr_assert_eq(open_pool(&r), 0);
    for (unsigned ms = 0; ms < WAIT_MS && objects_of(r, "part/c/"); ms += 100) {
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    cr_assert_eq(objects_of(r, "part/c/"), 0, "the lost host's parts and shared files are gone");
    ckpt_storage_close(r);
    setenv("CEPH_CONF", conf, 1);
    char args[256], out[8192];
    snprintf(args, sizeof args, "snapshot verify rados://%s/%s", pool, job);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    /* A new arena of the other host, stopped and its directory gone,
     * restores its chain from the pool. */
    size_t other = taker == 0 ? 1 : 0;
    close_workers_on(&jw, other);
    stop_host(&hosts[other]);
    test_remove_dir(hosts[other].dir);
    host *back = start_host_of(job, hosts[other].name, hosts[other].name,
                               other == 0 ? "0-0" : "1-1", 3, "--incremental", NULL);
    stash_worker *again = open_worker(back, (uint32_t)other, 3);
    check_round(again, (uint32_t)other, 3, 2);
    stash_worker_close(again);
    close_workers_on(&jw, taker);
}
