/* SPDX-License-Identifier: MIT */
/*
 * demo_hosts.c: `stash demo --hosts N`: the demo's job on N hosts, each a
 * `stash serve` of its own arena, checkpointing into a Ceph cluster: a
 * single-node one the demo starts (one monitor, one OSD) unless given one.
 * With the demo's own cluster and as root, each host is a machine of its
 * own (machines.h: network and mount namespaces, an address on a bridge of
 * the demo's, a /dev/shm of its own) and the cluster listens on the
 * bridge's uplink; otherwise the hosts share this machine, and the demo
 * says so. Workers count the stream as in the single-host demo. A host is
 * lost with its service, worker and arena: a live host takes its worker
 * over from the newest job checkpoint while the others run on; then the
 * leader is lost and the lead moves within the lease. Every count and
 * window ends exactly right.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/demo.h"
#include "tools/demo_windows.h"
#include "tools/machines.h"

#define LEASE "3s"
#define MAX_HOSTS WORKERS

typedef struct host {
    char name[16];
    char arena[48];
    char log[300];
    pid_t pid;
    pid_t machine; /* holds its namespaces; 0: it shares this machine */
    bool lost;
} host;

static host hosts[MAX_HOSTS];
static unsigned nhosts;
static const char *conf, *pool;
static char job[32];
static machines net;        /* the switch, when the hosts are machines apart */
static bool apart;          /* whether they are */
static pid_t pids[WORKERS]; /* the workers' processes, -1 once gone */
static int on[WORKERS];     /* the host each worker runs on */

/* `stash serve` of host h, serving worker index h (and, with fewer hosts
 * than workers, those after it up to the next host's). */
static pid_t start_host(host *h, unsigned index)
{
    char dir[300], workers[32];
    snprintf(dir, sizeof dir, "%.255s/%.15s", demo_dir, h->name);
    unsigned first = index * WORKERS / nhosts, last = (index + 1) * WORKERS / nhosts - 1;
    snprintf(workers, sizeof workers, "%u-%u", first, last);
    fflush(NULL);
    pid_t pid = machines_fork_bound();
    if (pid == 0) {
        FILE *f = freopen(h->log, "a", stdout);
        if (!f || (h->machine > 0 && machines_enter(h->machine) < 0)) _exit(127);
        char p[16];
        snprintf(p, sizeof p, "%u", WORKERS);
        char *argv[] = {"stash",
                        "serve",
                        h->arena,
                        "--storage",
                        "rados",
                        "--pool",
                        (char *)pool,
                        "--job",
                        job,
                        "--host",
                        h->name,
                        "--workers",
                        workers,
                        "--job-parallelism",
                        p,
                        "--dir",
                        dir,
                        "--lease",
                        LEASE,
                        "--interval",
                        "1s",
                        "--size",
                        "256M",
                        "--ceph-conf",
                        (char *)conf,
                        NULL};
        if (!conf) argv[23] = NULL;
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    return pid;
}

/* Whether host h's log holds text. */
static bool logged(const host *h, const char *text)
{
    FILE *f = fopen(h->log, "r");
    char line[2048];
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f)) found = strstr(line, text) != NULL;
    if (f) fclose(f);
    return found;
}

/* The host that serves worker i at the start (start_host's ranges). */
static int host_of(uint32_t i)
{
    int h = 0;
    for (unsigned k = 0; k < nhosts; k++)
        if (k * WORKERS / nhosts <= i) h = (int)k;
    return h;
}

/* Waits, relaying reports, until host h serves its arena. */
static int await_serving(story *s, const host *h)
{
    for (uint64_t t0 = demo_now_ns(); demo_now_ns() - t0 < STEP_TIMEOUT_NS;) {
        if (logged(h, "serving /")) return 0;
        demo_relay(s, 50);
    }
    demo_say("demo: host %s never served (see %s)\n", h->name, h->log);
    return -1;
}

/* Waits, relaying reports, until a live host logs text: its index, or -1. */
static int await_logged(story *s, const char *text)
{
    for (uint64_t t0 = demo_now_ns(); demo_now_ns() - t0 < STEP_TIMEOUT_NS;) {
        for (unsigned i = 0; i < nhosts; i++)
            if (!hosts[i].lost && logged(&hosts[i], text)) return (int)i;
        demo_relay(s, 50);
    }
    demo_say("demo: no host logged '%s' (see %s/h*.log)\n", text, demo_dir);
    return -1;
}

/* The newest checkpoint host h completed, read from its arena (on its
 * machine, by a process that enters it); 0 if none or unread. */
static uint64_t completed(const host *h)
{
    int p[2];
    if (pipe(p) < 0) return 0;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        stash_service_info info = {0};
        stash_arena *a;
        if ((h->machine == 0 || machines_enter(h->machine) == 0) &&
            stash_arena_open(h->arena, NULL, &a) == 0) {
            stash_service_info_get(a, &info);
            stash_arena_close(a);
        }
        _exit(write(p[1], &info.completed, sizeof info.completed) == sizeof info.completed ? 0 : 1);
    }
    close(p[1]);
    uint64_t id = 0;
    if (pid < 0 || read(p[0], &id, sizeof id) != sizeof id) id = 0;
    close(p[0]);
    if (pid > 0) waitpid(pid, NULL, 0);
    return id;
}

/* Waits, relaying reports, until host h completed checkpoint id or a later one. */
static int await_checkpoint(story *s, const host *h, uint64_t id)
{
    for (uint64_t t0 = demo_now_ns(); demo_now_ns() - t0 < STEP_TIMEOUT_NS;) {
        if (completed(h) >= id) return 0;
        demo_relay(s, 20);
    }
    demo_say("demo: host %s never completed checkpoint %llu (see %s)\n", h->name,
             (unsigned long long)id, h->log);
    return -1;
}

/* The host that leads now: the last of the live hosts' logs to say so. */
static int leader(story *s)
{
    for (uint64_t t0 = demo_now_ns(); demo_now_ns() - t0 < STEP_TIMEOUT_NS;) {
        int found = -1;
        for (unsigned i = 0; i < nhosts; i++)
            if (!hosts[i].lost && logged(&hosts[i], "leads job") &&
                !logged(&hosts[i], "no longer leads"))
                found = (int)i;
        if (found >= 0) return found;
        demo_relay(s, 50);
    }
    return -1;
}

/* Loses host h: its service and workers killed with SIGKILL, its arena and
 * directory gone (its machine's namespaces with them), as when a machine
 * dies. */
static void lose(host *h, unsigned index)
{
    demo_kill_wait(h->pid);
    for (uint32_t i = 0; i < WORKERS; i++)
        if (on[i] == (int)index && pids[i] > 0) {
            demo_kill_wait(pids[i]);
            pids[i] = -1;
        }
    h->lost = true;
    if (h->machine > 0) {
        demo_kill_wait(h->machine);
        h->machine = 0;
    } else {
        stash_arena_destroy(h->arena, NULL);
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/%s'", demo_dir, h->name);
    if (system(cmd) != 0) demo_say("demo: could not remove %s/%s\n", demo_dir, h->name);
}

/* Waits for the takeover of lost host h's workers (index), then starts
 * them again on the host that took them. */
static int resume_workers(story *s, const host *h, unsigned index, int fd)
{
    char text[64];
    snprintf(text, sizeof text, "of lost host %s over", h->name);
    int to = await_logged(s, text);
    if (to < 0) return -1;
    for (uint32_t i = 0; i < WORKERS; i++)
        if (on[i] == (int)index) {
            on[i] = to;
            pids[i] = demo_start_worker(hosts[to].arena, i, false, fd, hosts[to].machine);
        }
    return to;
}

static int run_cluster(const char *verb)
{
    char cmd[700];
    const char *script = STASH_CEPH_CLUSTER;
    if (access(script, R_OK) != 0) script = STASH_CEPH_CLUSTER_INSTALLED;
    char addr[32] = "";
    if (apart) snprintf(addr, sizeof addr, "CEPH_ADDR=%s1 ", net.net);
    snprintf(cmd, sizeof cmd, "%ssh '%s' %s '%s/ceph' %d bluestore >>'%s/ceph.out' 2>&1", addr,
             script, verb, demo_dir, 10000 + (int)getpid() % 20000, demo_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The story, from the hosts' start to the windows' check: whether every
 * step happened and every count and window is exact. */
static bool tell(story *s, int fd)
{
    for (unsigned i = 0; i < nhosts; i++) {
        host *h = &hosts[i];
        snprintf(h->name, sizeof h->name, "h%u", i);
        snprintf(h->arena, sizeof h->arena, "%.31s-h%u", job, i);
        snprintf(h->log, sizeof h->log, "%.255s/h%u.log", demo_dir, i);
        if (apart && (h->machine = machines_add(&net, i, 1, 0, 0)) < 0) {
            h->machine = 0;
            demo_say("demo: %s\n", net.why);
            return false;
        }
        h->pid = start_host(h, i);
    }
    int lead = leader(s);
    if (lead < 0) return false;
    demo_say("== host %s leads (a lease on rados://%s/%s/leader)\n", hosts[lead].name, pool, job);
    for (uint32_t i = 0; i < WORKERS; i++) {
        on[i] = host_of(i);
        if (await_serving(s, &hosts[on[i]]) < 0) return false;
        pids[i] = demo_start_worker(hosts[on[i]].arena, i, false, fd, hosts[on[i]].machine);
    }
    /* Machines apart: no host's arena is in this machine's /dev/shm. */
    for (unsigned i = 0; apart && i < nhosts; i++) {
        stash_arena *a;
        if (stash_arena_open(hosts[i].arena, NULL, &a) == 0) {
            stash_arena_close(a);
            demo_say("demo: host %s's arena is in this machine's /dev/shm\n", hosts[i].name);
            return false;
        }
    }
    demo_say("== %u workers count %u events over %u words, windows to %s/windows-N.out\n", WORKERS,
             EVENTS, WORDS, demo_dir);
    if (await_checkpoint(s, &hosts[lead], 2) < 0) return false;

    unsigned gone = lead == (int)nhosts - 1 ? 0 : nhosts - 1;
    demo_say("== host %s lost after job checkpoint %llu: its service and worker killed with "
             "SIGKILL, its arena and directory removed; the other hosts run on\n",
             hosts[gone].name, (unsigned long long)completed(&hosts[lead]));
    uint64_t t0 = demo_now_ns();
    lose(&hosts[gone], gone);
    int to = resume_workers(s, &hosts[gone], gone, fd);
    if (to < 0) return false;
    demo_say("== host %s took the workers of %s over %.1f s after the loss (the lease is %s); "
             "they resume there from the offsets of the newest job checkpoint\n",
             hosts[to].name, hosts[gone].name, (double)(demo_now_ns() - t0) / 1e9, LEASE);
    uint64_t now = completed(&hosts[lead]);
    if (await_checkpoint(s, &hosts[lead], now + 2) < 0) return false;

    now = completed(&hosts[lead]);
    demo_say("== the leader, host %s, lost after job checkpoint %llu\n", hosts[lead].name,
             (unsigned long long)now);
    t0 = demo_now_ns();
    lose(&hosts[lead], (unsigned)lead);
    int next = leader(s);
    if (next < 0) return false;
    demo_say("== host %s leads %.1f s after the loss\n", hosts[next].name,
             (double)(demo_now_ns() - t0) / 1e9);
    if (resume_workers(s, &hosts[lead], (unsigned)lead, fd) < 0) return false;
    demo_say("== the leader's workers resumed on host %s %.1f s after the loss\n", hosts[next].name,
             (double)(demo_now_ns() - t0) / 1e9);

    for (uint64_t t = demo_now_ns();
         s->finished + s->bad < WORKERS && demo_now_ns() - t < 4 * STEP_TIMEOUT_NS;)
        demo_relay(s, 100);
    for (uint32_t i = 0; i < WORKERS; i++) {
        waitpid(pids[i], NULL, 0);
        pids[i] = -1;
    }
    uint64_t windows = 0, missing = 0, twice = 0, wrong = 0;
    int checked = demo_windows_check(demo_dir, WORKERS, EVENTS, WORDS, demo_word_of, &windows,
                                     &missing, &twice, &wrong);
    if (checked == 0)
        demo_say("== windows: %llu expected from a replay of the stream; %llu missing, %llu "
                 "emitted twice, %llu with a wrong count\n",
                 (unsigned long long)windows, (unsigned long long)missing,
                 (unsigned long long)twice, (unsigned long long)wrong);
    return s->bad == 0 && s->finished == WORKERS && checked == 0 && missing + twice + wrong == 0;
}

int demo_hosts(unsigned n, const char *ceph_conf, const char *ceph_pool)
{
    if (n < 2 || n > MAX_HOSTS) {
        fprintf(stderr, "stash demo: --hosts 2 to %u\n", MAX_HOSTS);
        return 2;
    }
    static char conf_path[300];
    const char *tmp = getenv("TMPDIR");
    snprintf(demo_dir, sizeof demo_dir, "%s/stash-demo-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(demo_dir)) return tool_fail("demo: a directory", -errno);
    nhosts = n;
    conf = ceph_conf;
    pool = ceph_pool ? ceph_pool : "stash";
    snprintf(job, sizeof job, "demo-%d", (int)getpid());
    bool own = !conf;
    /* Machines apart need root, and the hosts reach only the demo's own
     * cluster from their namespaces. */
    static char machines_log[300];
    const char *why = "given a cluster, they reach it through this machine's network";
    if (own && geteuid() != 0) {
        why = "machines of their own need root";
    } else if (own) {
        snprintf(machines_log, sizeof machines_log, "%.255s/machines.log", demo_dir);
        apart = machines_open(&net, machines_log) == 0;
        if (!apart) why = net.why;
    }
    if (own) {
        demo_say("== a single-node Ceph cluster (one monitor, one OSD) in %s/ceph, on %s%s\n",
                 demo_dir, apart ? net.net : "127.0.0.1", apart ? "1" : "");
        if (access(STASH_CEPH_CLUSTER, R_OK) != 0 &&
            access(STASH_CEPH_CLUSTER_INSTALLED, R_OK) != 0) {
            fprintf(stderr, "stash demo: %s is missing: give a cluster with --ceph-conf FILE\n",
                    STASH_CEPH_CLUSTER_INSTALLED);
            return 1;
        }
        if (run_cluster("start") < 0) {
            demo_say("demo: the cluster did not start (see %s/ceph.out)\n", demo_dir);
            return 1;
        }
        snprintf(conf_path, sizeof conf_path, "%s/ceph/ceph.conf", demo_dir);
        conf = conf_path;
    }
    story s = {0};
    int pipefd[2];
    if (pipe(pipefd) < 0) return tool_fail("demo", -errno);
    s.fd = pipefd[0];
    demo_say("== job %s on %u hosts, checkpoints in rados://%s/%s every second; each host a "
             "`stash serve --host` with an arena of its own, its log in %s/hN.log\n",
             job, n, pool, job, demo_dir);
    if (apart)
        demo_say("== each host a machine of its own: network and mount namespaces, the address "
                 "%s1N on a bridge of the demo's, a /dev/shm of its own\n",
                 net.net);
    else
        demo_say("== the hosts share this machine's network and /dev/shm (%s)\n", why);
    for (uint32_t i = 0; i < WORKERS; i++) pids[i] = -1;
    bool ok = tell(&s, pipefd[1]);
    /* Whatever the story came to, nothing of it stays running. */
    for (uint32_t i = 0; i < WORKERS; i++)
        if (pids[i] > 0) demo_kill_wait(pids[i]);
    for (unsigned i = 0; i < n; i++) {
        host *h = &hosts[i];
        if (!h->lost && h->pid > 0) {
            kill(h->pid, SIGTERM);
            waitpid(h->pid, NULL, 0);
        }
        if (h->machine > 0)
            demo_kill_wait(h->machine);
        else if (!h->lost)
            stash_arena_destroy(h->arena, NULL);
    }
    if (own) run_cluster("stop");
    if (apart) demo_kill_wait(net.sw);
    demo_say("== %s; the hosts' logs and the windows stay in %s\n",
             ok ? "every count and window exactly right" : "FAILED", demo_dir);
    return ok ? 0 : 1;
}
