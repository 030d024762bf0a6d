/* SPDX-License-Identifier: MIT */
/*
 * test_rados_job.c: a job that spans hosts, against a real single-node
 * Ceph cluster each test starts and stops. Each host is a `stash serve`
 * process with an arena of its own; the test is every host's workers.
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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/checkpoint/checkpoints.h"
#include "include/stash.h"
#include "tests/helpers.h"

#define MAXP 12u
#define KEYS 600u
#define WAIT_MS 60000u

static char dir[128], conf[256], job[64];

static int cluster(const char *args)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "sh %s/ceph/cluster.sh %s >%s.out 2>&1", STASH_TESTS_DIR, args, dir);
    return WEXITSTATUS(system(cmd));
}

static void start_cluster(void)
{
    if (access("/usr/bin/ceph-mon", X_OK) != 0 || access("/usr/bin/ceph-osd", X_OK) != 0)
        cr_skip_test("Ceph is not installed (apt-get install ceph-mon ceph-osd)");
    snprintf(dir, sizeof dir, "/tmp/stash-test-ceph-%d", (int)getpid());
    snprintf(conf, sizeof conf, "%s/ceph.conf", dir);
    snprintf(job, sizeof job, "job%d", (int)getpid());
    char args[256];
    snprintf(args, sizeof args, "start %s %d bluestore", dir, 10000 + (int)getpid() % 20000);
    cr_assert_eq(cluster(args), 0, "the cluster did not start (see %s.out)", dir);
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

static void stop_cluster(void)
{
    for (size_t i = 0; i < nhosts; i++)
        if (hosts[i].pid > 0) {
            kill(hosts[i].pid, SIGKILL);
            waitpid(hosts[i].pid, NULL, 0);
            stash_arena_destroy(hosts[i].arena, NULL);
        }
    if (!dir[0]) return;
    char args[256];
    snprintf(args, sizeof args, "stop %s", dir);
    cluster(args);
    if (getenv("KEEPLOGS")) {
        snprintf(args, sizeof args, "mkdir -p /tmp/rj && cp %s/host-*.log /tmp/rj/", dir);
        system(args);
    }
    test_remove_dir(dir);
}

TestSuite(rados_job, .init = start_cluster, .fini = stop_cluster, .timeout = 300);

/* Starts host name serving workers of parallelism p. */
static host *start_host(const char *name, const char *workers, uint32_t p)
{
    host *h = &hosts[nhosts++];
    snprintf(h->name, sizeof h->name, "%s", name);
    snprintf(h->arena, sizeof h->arena, "t-job-%s-%d", name, (int)getpid());
    snprintf(h->dir, sizeof h->dir, "%s/host-%s", dir, name);
    snprintf(h->log, sizeof h->log, "%s/host-%s.log", dir, name);
    char p_arg[16], maxp_arg[16];
    snprintf(p_arg, sizeof p_arg, "%u", p);
    snprintf(maxp_arg, sizeof maxp_arg, "%u", MAXP);
    h->pid = fork();
    cr_assert_geq(h->pid, 0);
    if (h->pid == 0) {
        int fd = open(h->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(STASH_BIN, "stash", "serve", h->arena, "--storage", "rados", "--pool", "stash",
              "--ceph-conf", conf, "--job", job, "--host", name, "--workers", workers,
              "--job-parallelism", p_arg, "--max-parallelism", maxp_arg, "--dir", h->dir,
              "--timeout", "6s", "--lease", "2s", "--retain", "2", (char *)NULL);
        _exit(127);
    }
    return h;
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

/* Waits until one of the hosts logs text (its index), or fails. */
static size_t await_logged(const char *text)
{
    for (unsigned ms = 0; ms < WAIT_MS; ms += 50) {
        for (size_t i = 0; i < nhosts; i++)
            if (hosts[i].pid > 0 && logged(&hosts[i], text)) return i;
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
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
        stash_worker_open(h->arena, &(stash_worker_opts){.index = index, .parallelism = p}, &w), 0,
        "%s: %s", h->arena, stash_errmsg());
    return w;
}

static stash_state *count_of(stash_worker *w)
{
    stash_state *s;
    cr_assert_eq(stash_state_get(w, &(stash_state_desc){.name = "count", .kind = STASH_VALUE}, &s),
                 0, "%s", stash_errmsg());
    return s;
}

/* Writes key k = round * 100000 + k for every key worker index of p owns. */
static void write_round(stash_worker *w, uint32_t index, uint32_t p, uint64_t round)
{
    stash_state *s = count_of(w);
    char key[32];
    for (uint32_t k = 0; k < KEYS; k++) {
        int n = snprintf(key, sizeof key, "key-%u", k);
        if ((uint32_t)stash_kg_owner(stash_key_group(key, (size_t)n, MAXP), MAXP, p) != index)
            continue;
        uint64_t v = round * 100000 + k;
        cr_assert_eq(stash_key_set(w, key, (size_t)n), 0);
        cr_assert_eq(stash_value_put(s, &v, sizeof v), 0, "%s", stash_errmsg());
    }
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
static int checkpoint(const host *h, stash_worker *const *w, size_t n, stash_checkpoint_info *info)
{
    stash_arena *a;
    cr_assert_eq(stash_arena_open(h->arena, NULL, &a), 0, "%s", stash_errmsg());
    int rc = test_checkpoint_at_barriers(a, w, n, info);
    stash_arena_close(a);
    return rc;
}

/* Kills host h: its service with SIGKILL, its arena and directory removed. */
static void lose_host(host *h)
{
    kill(h->pid, SIGKILL);
    cr_assert_eq(test_wait(h->pid), 128 + SIGKILL);
    h->pid = -1;
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
typedef struct job_workers {
    stash_worker *w[3];
    size_t on[3];
} job_workers;

static void write_all(job_workers *jw, uint64_t round)
{
    for (uint32_t i = 0; i < 3; i++) write_round(jw->w[i], i, 3, round);
}

/* Moves the workers of host from (lost) to host to, each checked to hold
 * the values of round. */
static void move_workers(job_workers *jw, size_t from, size_t to, uint64_t round)
{
    for (uint32_t i = 0; i < 3; i++) {
        if (jw->on[i] != from) continue;
        jw->w[i] = open_worker(&hosts[to], i, 3);
        jw->on[i] = to;
        check_round(jw->w[i], i, 3, round);
    }
}

static void close_workers_on(job_workers *jw, size_t h)
{
    for (uint32_t i = 0; i < 3; i++)
        if (jw->on[i] == h) stash_worker_close(jw->w[i]);
}

/* Waits for the line of host h saying job checkpoint id committed of n parts. */
static void await_committed(uint64_t id, size_t parts)
{
    char text[128];
    snprintf(text, sizeof text, "job checkpoint %llu committed: %zu parts", (unsigned long long)id,
             parts);
    await_logged(text);
}

Test(rados_job, three_hosts_a_host_lost_and_the_leader_killed)
{
    host *a = start_host("a", "0-0", 3), *b = start_host("b", "1-1", 3),
         *c = start_host("c", "2-2", 3);
    size_t leader = await_logged("leads job");
    job_workers jw = {{open_worker(a, 0, 3), open_worker(b, 1, 3), open_worker(c, 2, 3)},
                      {0, 1, 2}};
    write_all(&jw, 1);
    stash_checkpoint_info info;
    /* Asked of one host: the leader triggers it on all three. */
    size_t asked = leader == 2 ? 0 : 2;
    cr_assert_eq(checkpoint(&hosts[asked], jw.w, 3, &info), 0, "%s", stash_errmsg());
    await_committed(info.id, 3);
    /* Every host's workers got the verdict. */
    for (size_t i = 0; i < 3; i++) {
        stash_arena *ar;
        stash_service_info si;
        cr_assert_eq(stash_arena_open(hosts[i].arena, NULL, &ar), 0);
        cr_assert_eq(stash_service_info_get(ar, &si), 0);
        cr_assert_eq(si.completed, info.id, "host %s completed %llu, not %llu", hosts[i].name,
                     (unsigned long long)si.completed, (unsigned long long)info.id);
        stash_arena_close(ar);
    }
    /* Round 2 is in no checkpoint. */
    write_all(&jw, 2);

    /* A host that does not lead lost: a live one takes its worker over
     * from the newest job checkpoint (round 1) while the others run on. */
    size_t lost = leader == 0 ? 1 : 0;
    close_workers_on(&jw, lost);
    lose_host(&hosts[lost]);
    char text[128];
    snprintf(text, sizeof text, "workers %zu-%zu of lost host %s over", lost, lost,
             hosts[lost].name);
    size_t taker = await_logged(text);
    cr_assert_neq(taker, lost);
    move_workers(&jw, lost, taker, 1);
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
