/* SPDX-License-Identifier: MIT */
/*
 * nemesis.c: stash-nemesis, the crash campaign across hosts. A job of
 * HOSTS hosts, each as it would be on a machine of its own: a network
 * namespace with its own address on a bridge the campaign makes (in a
 * namespace of its own, joined to this one by one veth pair whose address
 * the single-node Ceph cluster it starts listens on), a mount namespace
 * with its own /dev/shm and /var/tmp, a time namespace whose monotonic
 * clock is days apart from the others', and a wall clock the campaign can
 * step (clockstep.c). On each host a `stash serve --job` process and the
 * workers it serves, each applying the deterministic workload (workload.c)
 * with a barrier after every event and checking every key against a replay
 * of the stream whenever it starts.
 *
 * At steps drawn from a seeded generator (the seed is printed; --seed
 * replays the sequence) the campaign kills a host's service with SIGKILL
 * (started again on its kept arena), pauses it with SIGSTOP past its lease,
 * loses a whole host (its namespaces, arena and directory gone; a new
 * machine joins in its place), cuts a host off the cluster or off its OSD
 * alone (nftables in the host's namespace), drops a share of its packets
 * or slows its link, steps its wall clock, stops the OSD or the monitor,
 * kills a worker (its replacement rolls back) and restarts every host. After
 * each step it heals the fault, starts what is down again where the pool
 * says it belongs, and waits for a job checkpoint to commit. The checker
 * compares every outcome a worker was told (complete, aborted, the
 * checkpoint a rollback restored) with the decision the pool holds, and
 * fails on any key that differs from the replay.
 *
 * The namespaces, links and bridge go with the campaign's processes, also
 * when it is killed (every process it starts dies with it); the Ceph
 * daemons and the directory of a run that was killed are removed by the
 * next run.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/checkpoint/rados_job.h"
#include "include/stash.h"
#include "tests/crash/workload.h"
#include "tools/machines.h"

#define HOSTS 3u
#define MAXP 32u
#define LEASE_MS 2000u
#define RATE 2000u                /* events a worker scans per second */
#define SETTLE_NS 120000000000ull /* the longest wait for a commit after a step */
/* A host's arena (in its own /dev/shm) and checkpoint directory (in its
 * own /var/tmp): one of two places, a second service of the host taking
 * the other. */
#define ARENA "nemesis-%u"
#define HOST_DIR "/var/tmp/stash-job-%u"

/* ------------------------------------------------------------------------ */
/* The world: the campaign's directory, addresses and namespaces.           */

typedef struct host {
    char name[8];
    pid_t holder;     /* holds the host's namespaces; 0: the machine is gone */
    unsigned machine; /* how many machines played this host */
    pid_t serve;      /* its service, 0 when none runs */
    bool fenced;      /* its service logged its fence */
    char serves[64];  /* the workers it was started with */
    char log[300];
    unsigned starts;
    uint64_t next_start_ns; /* a service refused is started again a lease later */
    int64_t *clock;         /* the wall clock's step, shared with its processes */
    bool cut;               /* an nftables table is in place */
    unsigned place;         /* of its arena and directory (ARENA, HOST_DIR) */
} host;

typedef struct worker {
    pid_t pid;
    int host;        /* where it runs */
    unsigned starts; /* a start after the first rolls back */
    char obs[200];   /* what it was told, a line each */
    off_t read;      /* how far the checker read obs */
    bool verified;   /* the running one checked its keys */
} worker;

static struct world {
    char dir[128], conf[200], job[32];
    char log[160]; /* the commands' output */
    machines m;    /* the switch: W.m.net is "10.213.X." */
    unsigned port;
    host hosts[HOSTS];
    worker workers[HOSTS];
    ckpt_storage *rados; /* the checker's connection, never cut */
    uint64_t rng;
    bool incremental; /* the hosts' parts: deltas (odd seeds) or full */
} W;

/* What the campaign counted. */
static struct counts {
    uint64_t steps, verified, keys, complete, aborted, rolled, fenced, unknown, problems;
} K;

/* A line on stderr: what the campaign does, a problem, or why it stops. */
static void vtell(const char *kind, const char *fmt, va_list ap)
{
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    fprintf(stderr, "stash-nemesis: %s%s\n", kind, line);
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vtell("", fmt, ap);
    va_end(ap);
}

static void problem(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void problem(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vtell("PROBLEM: ", fmt, ap);
    va_end(ap);
    K.problems++;
}

static _Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vtell("", fmt, ap);
    va_end(ap);
    fprintf(stderr, "stash-nemesis: the run's files are in %s\n", W.dir);
    exit(1);
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void nap_ms(unsigned ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000l};
    while (nanosleep(&t, &t) < 0 && errno == EINTR) {
    }
}

static uint64_t draw(uint64_t bound)
{
    W.rng = wl_mix64(W.rng);
    return bound ? W.rng % bound : 0;
}

#define RUN(...) machines_run(&W.m, 0, (const char *const[]){__VA_ARGS__, NULL})

/* Runs a command in the network namespace of pid; dies if it fails. */
static void in_net(pid_t pid, const char *const *argv)
{
    int rc = machines_run(&W.m, pid, argv);
    if (rc != 0)
        die("'%s %s %s' in the namespace of %d failed (%d)", argv[0], argv[1], argv[2], pid, rc);
}

#define IN_NET(pid, ...) in_net(pid, (const char *const[]){__VA_ARGS__, NULL})

/* A new machine for host i: namespaces, an address (NET.10+i) on the
 * switch, a /var/tmp and a monotonic clock days apart of its own. */
static void make_machine(unsigned i)
{
    host *h = &W.hosts[i];
    h->machine++;
    h->holder = machines_add(&W.m, i, h->machine, MACHINE_VAR_TMP | MACHINE_CLOCK,
                             1000u * (i + 1) + h->machine);
    if (h->holder < 0) die("%s", W.m.why);
    h->cut = false;
    *h->clock = 0;
}

/* Starts argv in host i's namespaces with its wall clock, output to log. */
static pid_t start_in(unsigned i, const char *log, const char *const *argv)
{
    host *h = &W.hosts[i];
    char clock[200];
    snprintf(clock, sizeof clock, "%s/clock-%s", W.dir, h->name);
    pid_t pid = machines_fork_bound();
    if (pid < 0) die("fork: %s", strerror(errno));
    if (pid == 0) {
        if (machines_enter(h->holder) < 0) _exit(126);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd < 0) _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        setenv("LD_PRELOAD", STASH_CLOCKSTEP, 1);
        setenv("STASH_TEST_CLOCK_FILE", clock, 1);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Whether file path holds text. */
static bool file_has(const char *path, const char *text)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[2048];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, text) != NULL;
    fclose(f);
    return found;
}

/* ------------------------------------------------------------------------ */
/* The cluster.                                                             */

static int cluster(const char *verb)
{
    char script[300];
    snprintf(script, sizeof script, "%s/ceph/cluster.sh", STASH_TESTS_DIR);
    char cdir[160], port[16], addr[32];
    snprintf(cdir, sizeof cdir, "%s/ceph", W.dir);
    snprintf(port, sizeof port, "%u", W.port);
    snprintf(addr, sizeof addr, "%s1", W.m.net);
    setenv("CEPH_ADDR", addr, 1);
    return RUN("sh", script, verb, cdir, port, "bluestore");
}

/* Stops the Ceph daemons and removes the directories of runs that were
 * killed (their campaign process is gone). */
static void reap_old_runs(void)
{
    DIR *d = opendir("/tmp");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid;
        if (sscanf(e->d_name, "stash-nemesis.%d", &pid) != 1 || kill(pid, 0) == 0) continue;
        char path[300];
        snprintf(path, sizeof path, "/tmp/%s/ceph", e->d_name);
        char script[300];
        snprintf(script, sizeof script, "%s/ceph/cluster.sh", STASH_TESTS_DIR);
        RUN("sh", script, "stop", path);
        snprintf(path, sizeof path, "/tmp/%s", e->d_name);
        RUN("rm", "-rf", path);
    }
    if (d) closedir(d);
}

/* ------------------------------------------------------------------------ */
/* The hosts' services.                                                     */

static void start_service(unsigned i, const char *workers)
{
    host *h = &W.hosts[i];
    snprintf(h->serves, sizeof h->serves, "%s", workers);
    char log[sizeof h->log];
    snprintf(log, sizeof log, "%s/%s-%u.log", W.dir, h->name, ++h->starts);
    memcpy(h->log, log, sizeof log);
    char p[16], maxp[16], lease[16], arena[32], dir[64];
    snprintf(arena, sizeof arena, ARENA, h->place);
    snprintf(dir, sizeof dir, HOST_DIR, h->place);
    snprintf(p, sizeof p, "%u", HOSTS);
    snprintf(maxp, sizeof maxp, "%u", MAXP);
    snprintf(lease, sizeof lease, "%ums", LEASE_MS);
    const char *argv[] = {STASH_BIN, "serve",
                          arena,     "--storage",
                          "rados",   "--pool",
                          "stash",   "--ceph-conf",
                          W.conf,    "--job",
                          W.job,     "--host",
                          h->name,   "--workers",
                          workers,   "--job-parallelism",
                          p,         "--max-parallelism",
                          maxp,      "--dir",
                          dir,       "--interval",
                          "1s",      "--timeout",
                          "6s",      "--lease",
                          lease,     "--retain",
                          "500",     "--ceph-timeout",
                          "3s",      W.incremental ? "--incremental" : NULL,
                          NULL};
    h->serve = start_in(i, h->log, argv);
    h->fenced = false;
}

/* Ends host i's service (signal sig first, SIGKILL after 10 s). */
static void stop_service(unsigned i, int sig)
{
    host *h = &W.hosts[i];
    if (h->serve <= 0) return;
    kill(h->serve, SIGCONT);
    kill(h->serve, sig);
    for (unsigned ms = 0; ms < 10000; ms += 20) {
        if (waitpid(h->serve, NULL, WNOHANG) == h->serve) {
            h->serve = 0;
            return;
        }
        nap_ms(20);
    }
    kill(h->serve, SIGKILL);
    waitpid(h->serve, NULL, 0);
    h->serve = 0;
}

/* Whether host i's service is serving (the arena claimed, the job joined). */
static bool serving(unsigned i)
{
    host *h = &W.hosts[i];
    return h->serve > 0 && file_has(h->log, "serving /") && !h->fenced;
}

/* Ends the machine of host i: every process on it and its namespaces. */
static void lose_machine(unsigned i)
{
    host *h = &W.hosts[i];
    stop_service(i, SIGKILL);
    for (unsigned w = 0; w < HOSTS; w++)
        if (W.workers[w].pid > 0 && W.workers[w].host == (int)i) {
            kill(W.workers[w].pid, SIGKILL);
            waitpid(W.workers[w].pid, NULL, 0);
            W.workers[w].pid = 0;
        }
    if (h->holder > 0) {
        kill(h->holder, SIGKILL);
        waitpid(h->holder, NULL, 0);
    }
    h->holder = 0;
}

/* ------------------------------------------------------------------------ */
/* The workers.                                                             */

static int obs_fd = -1;

static void observe(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void observe(const char *fmt, ...)
{
    char line[600];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    if (write(obs_fd, line, (size_t)n) != n) _exit(1);
}

static const char *obs_host = "";

static void observe_event(const stash_event *ev)
{
    if (ev->kind == STASH_CHECKPOINT_COMPLETE)
        observe("%s complete %" PRIu64, obs_host, ev->checkpoint_id);
    else if (ev->kind == STASH_CHECKPOINT_ABORTED)
        observe("%s aborted %" PRIu64, obs_host, ev->checkpoint_id);
    else if (ev->kind == STASH_ROLLED_BACK)
        observe("%s rolled %" PRIu64 " %s", obs_host, ev->checkpoint_id, ev->detail);
}

/* Worker index of the job on the arena of host on (this one): exits 0 on
 * SIGTERM, 2 when fenced, 3 when a key differs from the replay, 1 on any
 * other error. What it is told goes to obs, a line each, after its host. */
static int worker_main(uint32_t index, const char *on, const char *arena, bool rollback,
                       const char *obs)
{
    obs_host = on;
    obs_fd = open(obs, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (obs_fd < 0) return 1;
    stash_worker *w;
    int rc = stash_worker_open(arena,
                               &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                    .index = index,
                                                    .parallelism = HOSTS,
                                                    .rollback = rollback},
                               &w);
    if (rc == STASH_EFENCED) {
        observe("fenced at open: %s", stash_errmsg());
        return 2;
    }
    if (rc < 0) {
        observe("error: open: %s", stash_errmsg());
        return 1;
    }
    wl_job j;
    const char *what;
    if ((rc = wl_open(&j, w, MAXP, &what)) < 0) {
        observe("error: register %s: %s", what, stash_errmsg());
        return 1;
    }
    uint64_t start = wl_offset(&j), keys, bad;
    stash_event ev;
    while ((rc = stash_barrier(w, &ev)) == 1) observe_event(&ev);
    if (rc == 0) rc = wl_check(&j, start, &keys, &bad);
    if (rc < 0) {
        observe("%s: first barrier: %s", rc == STASH_EFENCED ? "fenced" : "error", stash_errmsg());
        return rc == STASH_EFENCED ? 2 : 1;
    }
    observe("verified %" PRIu64 " %" PRIu64 " %" PRIu64, start, keys, bad);
    if (bad) return 3;
    uint64_t begun = now_ns();
    for (uint64_t i = start;; i++) {
        rc = wl_step(&j, i, &what);
        if (rc == 0) {
            what = "pass a barrier";
            while ((rc = stash_barrier(w, &ev)) == 1) observe_event(&ev);
        }
        if (rc == STASH_EFENCED) {
            observe("fenced at %" PRIu64 ": %s", i, stash_errmsg());
            return 2;
        }
        if (rc < 0) {
            observe("error: %s at %" PRIu64 ": %s", what, i, stash_errmsg());
            return 1;
        }
        if ((i & 63) == 0) {
            uint64_t due = begun + (i - start) * (1000000000ull / RATE), t = now_ns();
            if (due > t) nap_ms((unsigned)((due - t) / 1000000));
        }
    }
}

/* Starts worker index on host i. */
static void start_worker(uint32_t index, unsigned i)
{
    worker *k = &W.workers[index];
    char idx[16], log[300];
    snprintf(idx, sizeof idx, "%u", index);
    snprintf(log, sizeof log, "%s/w%u.log", W.dir, index);
    char arena[32];
    snprintf(arena, sizeof arena, ARENA, W.hosts[i].place);
    const char *argv[] = {"/proc/self/exe", "--worker", idx,
                          W.hosts[i].name,  arena,      k->starts ? "rollback" : "fresh",
                          k->obs,           NULL};
    static char self[300];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) die("readlink /proc/self/exe: %s", strerror(errno));
    self[n] = 0;
    argv[0] = self;
    k->pid = start_in(i, log, argv);
    k->verified = false;
    k->host = (int)i;
    k->starts++;
}

/* ------------------------------------------------------------------------ */
/* The checker: what workers were told against what the pool decided.       */

#define IDS (1u << 20) /* ids the checker follows */

typedef struct decisions {
    uint64_t ptr;
    char done[IDS], aborted[IDS]; /* by id */
} decisions;

static int read_attr(void *ctx, const char *attr, const char *value)
{
    decisions *d = ctx;
    unsigned long long id;
    if (strcmp(attr, CKPT_STORAGE_VALUE) == 0) {
        d->ptr = strtoull(value, NULL, 10);
        return 0;
    }
    if (sscanf(attr, "stash.done.%llu", &id) == 1 && id < sizeof d->done) d->done[id] = 1;
    if (sscanf(attr, "stash.abort.%llu", &id) == 1 && id < sizeof d->aborted) d->aborted[id] = 1;
    return 0;
}

/* The pool's decisions: 0, or an error (the pool did not answer). */
static int pool_decisions(decisions *d)
{
    memset(d, 0, sizeof *d);
    char name[128];
    ckpt_job_object(name, sizeof name, W.job, "latest");
    int rc = ckpt_storage_attrs(W.rados, name, read_attr, d);
    return rc == -ENOENT ? 0 : rc;
}

/* The host whose part of committed checkpoint id holds worker w ("" if
 * none does, or the record cannot be read now). */
static const char *part_of(uint64_t id, unsigned w, char *name, size_t cap)
{
    static ckpt_job_record rec;
    name[0] = 0;
    if (rec.id != id && ckpt_job_record_read(W.rados, W.job, id, &rec) < 0) {
        rec.id = 0;
        return name;
    }
    for (size_t i = 0; i < rec.n; i++)
        if (ckpt_job_workers_has(&rec.parts[i].workers, w))
            snprintf(name, cap, "%s", rec.parts[i].host);
    return name;
}

/* Aborts a worker was told of while the pool had decided nothing yet: the
 * pool must never commit them with its host's part (looked at again at each
 * check; those still undecided when the run ends are counted unknown). */
typedef struct told {
    uint64_t id;
    unsigned w;
    char on[16];
} told;
static told *undecided;
static size_t nundecided;

/* Whether abort id told to worker w on host on stands in d: 1 settled
 * (aborted, or passed over by a later commit), 0 undecided, -1 committed
 * with that host's part (a problem, said). */
static int abort_stands(const decisions *d, uint64_t id, unsigned w, const char *on)
{
    char part[CKPT_JOB_HOST_MAX + 1];
    if (d->done[id] && strcmp(part_of(id, w, part, sizeof part), on) == 0) {
        problem("worker %u on %s was told checkpoint %llu was aborted; the pool committed its part",
                w, on, (unsigned long long)id);
        return -1;
    }
    return d->done[id] || d->aborted[id] || id < d->ptr ? 1 : 0;
}

static void recheck_undecided(const decisions *d)
{
    size_t kept = 0;
    for (size_t i = 0; i < nundecided; i++)
        if (abort_stands(d, undecided[i].id, undecided[i].w, undecided[i].on) == 0)
            undecided[kept++] = undecided[i];
    nundecided = kept;
}

/* Reads what the workers were told since the last look and compares it with
 * the pool's decisions: a worker is told a checkpoint completed only if the
 * pool committed it with its host's part for it, and aborted only if the
 * pool did not (or committed another host's part in its place: the worker
 * ran on a host fenced off meanwhile); a rollback restores only a
 * committed checkpoint. */
static void check(void)
{
    decisions *d = malloc(sizeof *d);
    if (!d || pool_decisions(d) < 0) {
        free(d);
        return; /* the cluster is down: checked at the next look */
    }
    recheck_undecided(d);
    for (unsigned w = 0; w < HOSTS; w++) {
        worker *k = &W.workers[w];
        FILE *f = fopen(k->obs, "r");
        if (!f) continue;
        fseeko(f, k->read, SEEK_SET);
        char line[700], on[16], what[16], part[CKPT_JOB_HOST_MAX + 1];
        while (fgets(line, sizeof line, f)) {
            size_t len = strlen(line);
            if (!len || line[len - 1] != '\n') break; /* the rest at the next look */
            k->read += (off_t)len;
            line[len - 1] = 0;
            unsigned long long id, at, keys, bad;
            if (sscanf(line, "%15s %15s %llu", on, what, &id) == 3 &&
                strcmp(what, "complete") == 0) {
                K.complete++;
                if (id >= IDS)
                    K.unknown++;
                else if (!d->done[id])
                    problem("worker %u on %s was told checkpoint %llu completed; the pool %s", w,
                            on, id, d->aborted[id] ? "aborted it" : "did not commit it");
                else if (strcmp(part_of(id, w, part, sizeof part), on) != 0)
                    problem("worker %u on %s was told checkpoint %llu completed; the pool "
                            "committed host %s's part for it",
                            w, on, id, part[0] ? part : "(unread)");
            } else if (sscanf(line, "%15s %15s %llu", on, what, &id) == 3 &&
                       strcmp(what, "aborted") == 0) {
                K.aborted++;
                if (id >= IDS)
                    K.unknown++;
                else if (abort_stands(d, id, w, on) == 0) {
                    told *t = realloc(undecided, (nundecided + 1) * sizeof *t);
                    if (!t) die("out of memory");
                    undecided = t;
                    undecided[nundecided] = (told){.id = id, .w = w};
                    snprintf(undecided[nundecided++].on, sizeof t->on, "%s", on);
                }
            } else if (sscanf(line, "%15s %15s %llu", on, what, &id) == 3 &&
                       strcmp(what, "rolled") == 0) {
                K.rolled++;
                if (id && id < IDS && !d->done[id])
                    problem("worker %u on %s rolled back to checkpoint %llu, which the pool %s", w,
                            on, id, d->aborted[id] ? "aborted" : "never committed");
            } else if (sscanf(line, "verified %llu %llu %llu", &at, &keys, &bad) == 3) {
                K.verified++;
                k->verified = true;
                K.keys += keys;
                if (bad)
                    problem("worker %u at offset %llu: %llu values of its %llu keys differ from "
                            "the replay",
                            w, at, bad, keys);
            } else if (strncmp(line, "fenced", 6) == 0) {
                K.fenced++;
            } else if (strncmp(line, "error", 5) == 0 && strstr(line, "not letting go") &&
                       strstr(line, "(stash-nemesis)")) {
                /* Workers are never paused: such a wait ended early (a
                 * lock's deadline on the wall clock, which was stepped). */
                problem("worker %u: %s", w, line);
            } else if (strncmp(line, "error", 5) == 0) {
                say("worker %u: %s", w, line);
            }
        }
        fclose(f);
    }
    free(d);
}

/* ------------------------------------------------------------------------ */
/* Repairs: what is down starts again where the pool says it belongs.       */

/* Who serves each worker index now: a host's index, -1 none. From the
 * members in the pool (a member whose service is gone still counts until
 * the job takes its workers over). */
static int members(int *served_by)
{
    for (unsigned w = 0; w < HOSTS; w++) served_by[w] = -1;
    for (unsigned i = 0; i < HOSTS; i++) {
        char name[160], what[32];
        snprintf(what, sizeof what, "hosts/%s", W.hosts[i].name);
        ckpt_job_object(name, sizeof name, W.job, what);
        ckpt_job_member m;
        int rc = ckpt_job_member_read(W.rados, name, &m);
        if (rc == -ENOENT) continue;
        if (rc < 0) return rc;
        if (ckpt_job_member_epoch(&m) == 0) continue;
        for (unsigned w = 0; w < HOSTS; w++)
            if (ckpt_job_workers_has(&m.m.workers, w)) served_by[w] = (int)i;
    }
    return 0;
}

static void reap(void)
{
    for (unsigned i = 0; i < HOSTS; i++) {
        host *h = &W.hosts[i];
        int st;
        if (h->serve > 0 && waitpid(h->serve, &st, WNOHANG) == h->serve) {
            h->serve = 0;
            if (WIFEXITED(st) && WEXITSTATUS(st) >= 126)
                die("host %s's service could not be started (%d)", h->name, WEXITSTATUS(st));
        }
        if (h->serve > 0 && !h->fenced && file_has(h->log, "was fenced off")) {
            h->fenced = true;
            stop_service(i, SIGTERM);
        }
    }
    for (unsigned w = 0; w < HOSTS; w++) {
        worker *k = &W.workers[w];
        int st;
        if (k->pid > 0 && waitpid(k->pid, &st, WNOHANG) == k->pid) {
            k->pid = 0;
            if (WIFEXITED(st) && WEXITSTATUS(st) == 3)
                problem("worker %u found keys that differ from the replay", w);
        }
    }
}

/* Starts every service and worker that is down, where it belongs. */
static void repair(void)
{
    reap();
    int by[HOSTS];
    if (members(by) < 0) return;
    for (unsigned i = 0; i < HOSTS; i++) {
        host *h = &W.hosts[i];
        if (h->holder == 0) make_machine(i);
        if (h->serve > 0 || now_ns() < h->next_start_ns) continue;
        /* The workers its member lists, those nobody serves whose own host
         * is this one or runs a service already, and its own. */
        char set[64] = "";
        for (unsigned w = 0; w < HOSTS; w++)
            if (by[w] == (int)i || (by[w] < 0 && (w == i || W.hosts[w].serve > 0))) {
                size_t n = strlen(set);
                snprintf(set + n, sizeof set - n, "%s%u-%u", n ? "," : "", w, w);
                by[w] = (int)i;
            }
        if (!set[0]) continue;
        start_service(i, set);
        h->next_start_ns = now_ns() + LEASE_MS * 1000000ull;
    }
    for (unsigned w = 0; w < HOSTS; w++) {
        worker *k = &W.workers[w];
        if (k->pid > 0 || by[w] < 0 || !serving((unsigned)by[w])) continue;
        start_worker(w, (unsigned)by[w]);
    }
}

/* Waits until a job checkpoint newer than after commits with every worker
 * running, repairing meanwhile; its id. */
static uint64_t settle(uint64_t after)
{
    uint64_t t0 = now_ns();
    for (;;) {
        repair();
        check();
        decisions *d = malloc(sizeof *d);
        bool up = true;
        for (unsigned w = 0; w < HOSTS; w++)
            up = up && W.workers[w].pid > 0 && W.workers[w].verified;
        uint64_t ptr = d && pool_decisions(d) == 0 ? d->ptr : 0;
        free(d);
        if (up && ptr > after) return ptr;
        if (now_ns() - t0 > SETTLE_NS)
            die("no job checkpoint committed within %llu s after the step (newest %llu)",
                SETTLE_NS / 1000000000ull, (unsigned long long)ptr);
        nap_ms(250);
    }
}

/* ------------------------------------------------------------------------ */
/* The faults.                                                              */

/* nftables in host i's namespace: rules (a chain's body for output and
 * input), or none. */
static void cut(unsigned i, const char *rules)
{
    host *h = &W.hosts[i];
    if (h->holder == 0) return;
    if (h->cut) IN_NET(h->holder, "nft", "delete", "table", "inet", "nemesis");
    h->cut = false;
    if (!rules) return;
    char script[1024];
    snprintf(script, sizeof script,
             "table inet nemesis {\n"
             " chain out { type filter hook output priority 0; %s }\n"
             " chain in { type filter hook input priority 0; %s }\n"
             "}\n",
             rules, rules);
    char path[200];
    snprintf(path, sizeof path, "%s/nft-%s", W.dir, h->name);
    FILE *f = fopen(path, "w");
    if (!f) die("%s: %s", path, strerror(errno));
    fputs(script, f);
    fclose(f);
    IN_NET(h->holder, "nft", "-f", path);
    h->cut = true;
}

/* Whether host i's member lease is held (1), not (0), or an error. */
static int member_held(unsigned i)
{
    char name[160], what[32];
    snprintf(what, sizeof what, "hosts/%s", W.hosts[i].name);
    ckpt_job_object(name, sizeof name, W.job, what);
    return ckpt_storage_lease_held(W.rados, name);
}

/* Host i's service paused past its lease while a second service of the
 * host, on the other arena and directory, joins and serves its workers;
 * the first, woken, must fence itself off. */
static void twin(unsigned i, unsigned hold)
{
    host *h = &W.hosts[i];
    if (!serving(i)) return;
    pid_t first = h->serve;
    char first_log[sizeof h->log];
    memcpy(first_log, h->log, sizeof first_log);
    kill(first, SIGSTOP);
    uint64_t t0 = now_ns();
    while (member_held(i) != 0 && now_ns() - t0 < SETTLE_NS) nap_ms(100);
    h->place ^= 1;
    h->serve = 0;
    char serves[sizeof h->serves];
    memcpy(serves, h->serves, sizeof serves);
    start_service(i, serves);
    /* It may be refused: the job may have taken the host's workers over. */
    for (t0 = now_ns(); h->serve > 0 && !serving(i) && now_ns() - t0 < SETTLE_NS; nap_ms(100))
        if (waitpid(h->serve, NULL, WNOHANG) == h->serve) h->serve = 0;
    nap_ms(hold);
    kill(first, SIGCONT);
    for (t0 = now_ns(); !file_has(first_log, "was fenced off") && now_ns() - t0 < SETTLE_NS;)
        nap_ms(100);
    if (!file_has(first_log, "was fenced off"))
        problem("host %s's first service, woken beside a second one, was not fenced off (see %s)",
                h->name, first_log);
    kill(first, SIGTERM);
    for (t0 = now_ns(); waitpid(first, NULL, WNOHANG) != first; nap_ms(20))
        if (now_ns() - t0 > 10000000000ull) kill(first, SIGKILL);
}

enum {
    F_KILL_SERVICE,
    F_PAUSE,
    F_LOSE_HOST,
    F_PARTITION,
    F_PARTITION_OSD,
    F_LOSS,
    F_SLOW,
    F_CLOCK,
    F_OSD_STOP,
    F_MON_STOP,
    F_KILL_WORKER,
    F_RESTART_ALL,
    F_TWIN,
    F_STOP_SAVEPOINT,
    F_STORAGE_FAULT,
    F_KINDS
};

static const char *fault_names[F_KINDS] = {
    "service killed",
    "service paused",
    "host lost",
    "host cut off the cluster",
    "host cut off its OSD",
    "packets lost",
    "link slowed",
    "wall clock stepped",
    "OSD stopped",
    "monitor stopped",
    "worker killed",
    "every host restarted",
    "a second service of a host",
    "the job stopped with a savepoint",
    "a service on a storage that fails",
};

static uint64_t fault_counts[F_KINDS];

/* `stash stop --savepoint` on host i, as an operator stops the whole job:
 * once its savepoint is committed, every host that was told so stops by
 * itself; if it fails, nothing stops. The repair starts them again. */
static void stop_with_savepoint(unsigned i)
{
    host *h = &W.hosts[i];
    if (!serving(i)) return;
    char arena[32], log[300], text[64];
    snprintf(arena, sizeof arena, ARENA, h->place);
    snprintf(log, sizeof log, "%s/stop-%" PRIu64 ".log", W.dir, K.steps);
    const char *argv[] = {STASH_BIN, "stop", arena, "--savepoint", "--timeout", "60s", NULL};
    int st = 0;
    pid_t pid = start_in(i, log, argv);
    waitpid(pid, &st, 0);
    FILE *f = fopen(log, "r");
    unsigned long long id = 0;
    if (!f || fscanf(f, "savepoint %llu", &id) != 1) id = 0;
    if (f) fclose(f);
    say("stop with a savepoint on host %s: %s", h->name,
        WIFEXITED(st) && WEXITSTATUS(st) == 0 && id ? "the job stops" : "failed: nothing stops");
    if (!id) return;
    snprintf(text, sizeof text, "savepoint %llu: complete", id);
    for (unsigned j = 0; j < HOSTS; j++) {
        host *o = &W.hosts[j];
        for (unsigned ms = 0; o->serve > 0 && ms < 30000; ms += 20) {
            if (waitpid(o->serve, &st, WNOHANG) == o->serve) o->serve = 0;
            if (o->serve > 0) nap_ms(20);
        }
        if (o->serve <= 0) continue;
        /* One that was told the savepoint completed must have stopped. */
        if (file_has(o->log, text))
            problem("host %s's service was told savepoint %llu completed and did not stop", o->name,
                    id);
        stop_service(j, SIGTERM);
    }
}

/* One step: a fault drawn, held, healed. */
static void step(void)
{
    unsigned f = (unsigned)draw(F_KINDS), i = (unsigned)draw(HOSTS);
    unsigned hold = LEASE_MS / 2 + (unsigned)draw(LEASE_MS * 3);
    host *h = &W.hosts[i];
    fault_counts[f]++;
    K.steps++;
    say("step %" PRIu64 ": %s (host %s, %u ms)", K.steps, fault_names[f], h->name, hold);
    char rule[256];
    switch (f) {
    case F_KILL_SERVICE:
        stop_service(i, SIGKILL);
        nap_ms(hold / 4);
        break;
    case F_PAUSE:
        if (h->serve > 0) {
            kill(h->serve, SIGSTOP);
            nap_ms(hold);
            kill(h->serve, SIGCONT);
        }
        break;
    case F_LOSE_HOST:
        lose_machine(i);
        nap_ms(hold);
        break;
    case F_PARTITION:
        snprintf(rule, sizeof rule, "ip daddr %s1 drop; ip saddr %s1 drop;", W.m.net, W.m.net);
        cut(i, rule);
        nap_ms(hold);
        cut(i, NULL);
        break;
    case F_PARTITION_OSD:
        snprintf(rule, sizeof rule,
                 "ip daddr %s1 tcp dport != %u drop; ip saddr %s1 tcp sport != %u drop;", W.m.net,
                 W.port, W.m.net, W.port);
        cut(i, rule);
        nap_ms(hold);
        cut(i, NULL);
        break;
    case F_LOSS:
        cut(i, "numgen random mod 100 < 30 drop;");
        nap_ms(hold);
        cut(i, NULL);
        break;
    case F_SLOW:
        if (h->holder > 0) {
            IN_NET(h->holder, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "256kbit",
                   "burst", "16kbit", "latency", "400ms");
            nap_ms(hold);
            IN_NET(h->holder, "tc", "qdisc", "del", "dev", "eth0", "root");
        }
        break;
    case F_CLOCK: {
        int64_t s = (int64_t)draw(600) - 300;
        *h->clock = s * 1000000000ll;
        say("host %s's wall clock is %+" PRId64 " s off", h->name, s);
        nap_ms(hold);
        break;
    }
    case F_OSD_STOP:
    case F_MON_STOP:
        cluster(f == F_OSD_STOP ? "osd-stop" : "mon-stop");
        nap_ms(hold);
        if (cluster(f == F_OSD_STOP ? "osd-start" : "mon-start") != 0)
            die("the %s did not start again", f == F_OSD_STOP ? "OSD" : "monitor");
        break;
    case F_KILL_WORKER: {
        worker *k = &W.workers[i];
        if (k->pid > 0) {
            kill(k->pid, SIGKILL);
            waitpid(k->pid, NULL, 0);
            k->pid = 0;
        }
        break;
    }
    case F_TWIN:
        twin(i, hold);
        break;
    case F_STOP_SAVEPOINT:
        stop_with_savepoint(i);
        break;
    case F_STORAGE_FAULT: {
        /* Started again on a storage that fails one part written or read
         * (an injected fault): a checkpoint's data file, its metadata, a
         * restore's read. */
        char spec[64], workers[sizeof h->serves];
        snprintf(spec, sizeof spec, "%s:%u:%s", draw(2) ? "write" : "read", 1 + (unsigned)draw(12),
                 draw(2) ? "EIO" : "ENOSPC");
        say("host %s's service is started again on a storage with %s", h->name, spec);
        snprintf(workers, sizeof workers, "%s", h->serves);
        stop_service(i, SIGKILL);
        setenv("STASH_STORAGE_FAULT", spec, 1);
        start_service(i, workers);
        unsetenv("STASH_STORAGE_FAULT");
        nap_ms(hold);
        break;
    }
    case F_RESTART_ALL:
        for (unsigned w = 0; w < HOSTS; w++)
            if (W.workers[w].pid > 0) {
                kill(W.workers[w].pid, SIGKILL);
                waitpid(W.workers[w].pid, NULL, 0);
                W.workers[w].pid = 0;
            }
        for (unsigned j = 0; j < HOSTS; j++) stop_service(j, SIGTERM);
        break;
    }
}

/* ------------------------------------------------------------------------ */

static void usage(FILE *to)
{
    fprintf(to,
            "usage: stash-nemesis [--events N | --minutes M] [--seed S]\n"
            "A job of %u hosts, each in network, mount and time namespaces of its own on a\n"
            "bridge of the campaign's, against a single-node Ceph cluster it starts: faults\n"
            "drawn from the seed (services killed and paused, hosts lost, partitions, packet\n"
            "loss, slow links, wall-clock steps, the OSD and the monitor stopped, workers\n"
            "killed, every host restarted, the job stopped with a savepoint, a service on a\n"
            "storage that fails a part written or read), each healed and\n"
            "followed by a committed job checkpoint; every key checked against a replay,\n"
            "every outcome a worker was told against the pool's decision. Needs root. Exits 1\n"
            "on any problem.\n",
            HOSTS);
}

int main(int argc, char **argv)
{
    if (argc == 7 && strcmp(argv[1], "--worker") == 0)
        return worker_main((uint32_t)atoi(argv[2]), argv[3], argv[4],
                           strcmp(argv[5], "rollback") == 0, argv[6]);
    uint64_t events = 0, minutes = 0, seed = 0;
    bool seeded = false;
    static const struct option opts[] = {{"events", required_argument, NULL, 'e'},
                                         {"minutes", required_argument, NULL, 'm'},
                                         {"seed", required_argument, NULL, 's'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'e')
            events = strtoull(optarg, NULL, 10);
        else if (c == 'm')
            minutes = strtoull(optarg, NULL, 10);
        else if (c == 's') {
            seed = strtoull(optarg, NULL, 10);
            seeded = true;
        } else if (c == 'h') {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!events && !minutes) events = 12;
    if (!seeded) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        seed = wl_mix64((uint64_t)t.tv_nsec ^ ((uint64_t)getpid() << 32));
    }
    W.rng = seed;
    W.incremental = seed & 1;
    say("seed %" PRIu64 " (--seed %" PRIu64 " replays the sequence of faults); %s parts", seed,
        seed, W.incremental ? "incremental" : "full");
    if (geteuid() != 0) {
        fprintf(stderr, "stash-nemesis: needs root (namespaces, links, nftables)\n");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    reap_old_runs();
    snprintf(W.dir, sizeof W.dir, "/tmp/stash-nemesis.%d", (int)getpid());
    if (mkdir(W.dir, 0700) < 0) die("%s: %s", W.dir, strerror(errno));
    say("its files: %s (removed if it passes)", W.dir);
    snprintf(W.conf, sizeof W.conf, "%s/ceph/ceph.conf", W.dir);
    snprintf(W.job, sizeof W.job, "nemesis%d", (int)getpid());
    W.port = 10000u + (unsigned)getpid() % 20000u;
    snprintf(W.log, sizeof W.log, "%s/commands.log", W.dir);
    if (machines_open(&W.m, W.log) < 0) die("%s", W.m.why);
    if (cluster("start") != 0) die("the cluster did not start (see %s)", W.log);
    stash_storage_opts so = {.sz = sizeof so, .ceph_conf = W.conf};
    if (ckpt_storage_open(&ckpt_rados_ops, "stash", &so, &W.rados) < 0)
        die("the checker cannot reach the cluster: %s", stash_errmsg());
    for (unsigned i = 0; i < HOSTS; i++) {
        host *h = &W.hosts[i];
        snprintf(h->name, sizeof h->name, "h%u", i);
        char path[200];
        snprintf(path, sizeof path, "%s/clock-%s", W.dir, h->name);
        int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 || ftruncate(fd, sizeof(int64_t)) < 0) die("%s: %s", path, strerror(errno));
        h->clock = mmap(NULL, sizeof(int64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (h->clock == MAP_FAILED) die("%s: %s", path, strerror(errno));
        snprintf(path, sizeof path, "%s/w%u.obs", W.dir, i);
        memcpy(W.workers[i].obs, path, sizeof path);
        make_machine(i);
        char own[16];
        snprintf(own, sizeof own, "%u-%u", i, i);
        start_service(i, own);
    }
    uint64_t last = settle(0), t0 = now_ns();
    say("the job runs on %u hosts (checkpoint %" PRIu64 " committed)", HOSTS, last);
    while (events ? K.steps < events : now_ns() - t0 < minutes * 60000000000ull) {
        step();
        last = settle(last);
        say("  healed: checkpoint %" PRIu64 " committed", last);
    }
    for (unsigned i = 0; i < HOSTS; i++) stop_service(i, SIGTERM);
    for (unsigned w = 0; w < HOSTS; w++)
        if (W.workers[w].pid > 0) {
            kill(W.workers[w].pid, SIGKILL);
            waitpid(W.workers[w].pid, NULL, 0);
        }
    check();
    K.unknown += nundecided;
    free(undecided);
    char line[1024] = "";
    for (unsigned f = 0; f < F_KINDS; f++) {
        size_t n = strlen(line);
        if (fault_counts[f])
            snprintf(line + n, sizeof line - n, "%s%" PRIu64 " %s", n ? ", " : "", fault_counts[f],
                     fault_names[f]);
    }
    say("seed %" PRIu64 ": %" PRIu64 " steps (%s)", seed, K.steps, line);
    say("%" PRIu64 " worker starts verified %" PRIu64 " keys; %" PRIu64
        " outcomes complete, %" PRIu64 " aborted, %" PRIu64 " rollbacks, %" PRIu64
        " fences, all checked against the pool (%" PRIu64
        " aborts undecided when it ended); %" PRIu64 " problems; %s",
        K.verified, K.keys, K.complete, K.aborted, K.rolled, K.fenced, K.unknown, K.problems,
        K.problems ? "FAILED" : "PASSED");
    ckpt_storage_close(W.rados);
    cluster("stop");
    if (!K.problems) RUN("rm", "-rf", W.dir);
    return K.problems ? 1 : 0;
}
