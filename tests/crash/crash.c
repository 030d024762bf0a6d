/* SPDX-License-Identifier: MIT */
/*
 * crash.c: stash-crash, the crash campaign. Worker processes apply a
 * deterministic workload to keyed state (a ValueState of a count and a
 * checksum, a MapState of counts per class, a ListState of marks) from the
 * input offset they keep in operator ListState, a barrier after every event,
 * while the service checkpoints every 50 ms. At moments drawn from a seeded
 * generator (the seed is printed; --seed replays the sequence) the campaign
 * kills a worker, a replacement in the middle of its rollback, the service
 * in the middle of a cut, everything with the arena removed (a power loss),
 * the service while it restores; it runs the service on a storage that
 * fails (EIO, ENOSPC, short writes, failed fsyncs and reads, through the
 * I/O engine's STASH_IO_FAULT) and damages the newest checkpoint's files.
 * With --storage, the checkpoints also go to a remote storage (RADOS or
 * S3): the storage fails writes and reads (STASH_STORAGE_FAULT), and the
 * machine is lost with its checkpoint directory, the arena then restored
 * straight from the storage.
 * Every worker that starts checks every key against a model replayed up to
 * its offset; the campaign checks that a restore never goes back past the
 * newest complete checkpoint (unless it was damaged) and that no checkpoint
 * id is used twice. It runs on both backends, full and incremental, and
 * ends with the counts: events by kind, verifications, lost or duplicated
 * values, checkpoints failed cleanly.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "include/stash.h"
#include "tests/crash/workload.h"

#define WORKERS 2u
#define MAXP 32u
#define RATE 20000u            /* events a worker scans per second */
#define WAIT_NS 60000000000ull /* the longest wait for one step: longer is a failure */
#define INTERVAL_MS 50u

/* ------------------------------------------------------------------------ */
/* Reports: fixed-size records on one pipe (atomic below PIPE_BUF).          */

enum {
    R_VERIFIED = 1, /* a worker checked its keys at its offset */
    R_FAILED = 2,   /* a worker or the service could not go on */
};

typedef struct report {
    int32_t kind;
    int32_t pid;
    uint32_t index; /* the worker's index; WORKERS for the service */
    uint64_t offset, keys, bad, rolled;
    char what[200];
} report;

static int report_fd = -1;

__attribute__((format(printf, 3, 4))) static void send_report(report *r, int kind, const char *fmt,
                                                              ...)
{
    r->kind = kind;
    r->pid = getpid();
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->what, sizeof r->what, fmt, ap);
    va_end(ap);
    if (write(report_fd, r, sizeof *r) != (ssize_t)sizeof *r) _exit(3);
}

/* ------------------------------------------------------------------------ */
/* A configuration: one arena and one checkpoint directory.                 */

typedef struct config {
    stash_backend backend;
    int incremental;
    char name[64];
    char dir[256];
    char lmdb_dir[300];
    char url[400]; /* the remote storage's job, or empty */
} config;

static stash_arena_opts arena_opts(const config *c)
{
    return (stash_arena_opts){.sz = sizeof(stash_arena_opts),
                              .size = 256u << 20,
                              .max_parallelism = MAXP,
                              .backend = c->backend,
                              .lmdb_dir = c->backend == STASH_BACKEND_LMDB ? c->lmdb_dir : NULL};
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* The worker process.                                                      */

static int worker_main(const config *c, uint32_t index, bool rollback, const char *fault)
{
    report r = {.index = index};
    if (fault)
        setenv("STASH_IO_FAULT", fault, 1);
    else
        unsetenv("STASH_IO_FAULT");
    stash_arena_opts ao = arena_opts(c);
    stash_worker *w;
    int rc = stash_worker_open(c->name,
                               &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                    .index = index,
                                                    .parallelism = WORKERS,
                                                    .arena = &ao,
                                                    .rollback = rollback},
                               &w);
    if (rc < 0) {
        send_report(&r, R_FAILED, "worker %u: open: %s", index, stash_errmsg());
        return 1;
    }
    wl_job j;
    const char *what;
    if ((rc = wl_open(&j, w, MAXP, &what)) < 0) {
        send_report(&r, R_FAILED, "worker %u: register %s: %s", index, what, stash_errmsg());
        return 1;
    }
    uint64_t start = wl_offset(&j);
    /* A replacement learns at its first barriers which checkpoint it rolled back to. */
    stash_event ev;
    while ((rc = stash_barrier(j.w, &ev)) == 1)
        if (ev.kind == STASH_ROLLED_BACK) r.rolled = ev.checkpoint_id;
    if (rc < 0) {
        send_report(&r, R_FAILED, "worker %u: first barrier: %s", index, stash_errmsg());
        return 1;
    }
    r.offset = start;
    if ((rc = wl_check(&j, start, &r.keys, &r.bad)) < 0) {
        send_report(&r, R_FAILED, "worker %u: read its keys: %s", index, stash_errmsg());
        return 1;
    }
    send_report(&r, R_VERIFIED, "worker %u", index);
    uint64_t begun = now_ns();
    for (uint64_t i = start;; i++) {
        rc = wl_step(&j, i, &what);
        if (rc == 0) {
            what = "pass a barrier";
            rc = stash_barrier(j.w, &ev);
        }
        if (rc < 0) {
            r.offset = i;
            send_report(&r, R_FAILED, "worker %u: %s at %llu: %s", index, what,
                        (unsigned long long)i, stash_errmsg());
            return 1;
        }
        if ((i & 1023) == 0) {
            uint64_t due = begun + (i - start) * (1000000000ull / RATE), t = now_ns();
            if (due > t) usleep((useconds_t)((due - t) / 1000));
        }
    }
}

/* ------------------------------------------------------------------------ */
/* The service process.                                                     */

/* A fault "remote:SPEC" is the remote storage's, any other the directory's. */
#define REMOTE "remote:"

static int service_main(const config *c, const char *fault)
{
    report r = {.index = WORKERS};
    bool remote = fault && strncmp(fault, REMOTE, strlen(REMOTE)) == 0;
    unsetenv("STASH_IO_FAULT");
    unsetenv("STASH_STORAGE_FAULT");
    if (fault)
        setenv(remote ? "STASH_STORAGE_FAULT" : "STASH_IO_FAULT",
               remote ? fault + strlen(REMOTE) : fault, 1);
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, NULL);
    stash_arena_opts ao = arena_opts(c);
    stash_service *s;
    int rc = stash_service_start(c->name,
                                 &(stash_service_opts){.sz = sizeof(stash_service_opts),
                                                       .arena = &ao,
                                                       .dir = c->dir,
                                                       .interval_ms = INTERVAL_MS,
                                                       .timeout_ms = 5000,
                                                       .incremental = c->incremental,
                                                       .full_every = 4,
                                                       .lz4 = c->incremental,
                                                       .storage_url = c->url[0] ? c->url : NULL},
                                 &s);
    if (rc < 0) {
        send_report(&r, R_FAILED, "service: start%s%s: %s", fault ? " with " : "",
                    fault ? fault : "", stash_errmsg());
        return 1;
    }
    int sig;
    sigwait(&term, &sig);
    stash_service_stop(s);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The campaign.                                                            */

enum {
    E_KILL_WORKER,
    E_KILL_REPLACEMENT,
    E_KILL_SERVICE,
    E_POWER_LOSS,
    E_KILL_RESTORING,
    E_STORAGE_FAULT,
    E_DAMAGE,
    E_LIVE_DAMAGE,
    E_READ_FAULT,
    E_MACHINE_LOST,
    E_KINDS
};

static const char *event_names[E_KINDS] = {
    "worker killed",
    "replacement killed in its rollback",
    "service killed",
    "power loss",
    "service killed while restoring",
    "storage fault",
    "newest checkpoint damaged",
    "checkpoint damaged while in use",
    "read error in a restore",
    "machine lost with its directory",
};

typedef struct counts {
    uint64_t events[E_KINDS];
    uint64_t verifications, keys, bad;
    uint64_t ckpt_complete, ckpt_failed;
    uint64_t regressions, reused_ids, leaks, failures;
    uint64_t fell_back; /* restores that passed over a damaged or unreadable checkpoint */
} counts;

typedef struct campaign {
    config c;
    uint64_t rng;
    int rfd;
    pid_t svc, w[WORKERS];
    counts n;
    report got[WORKERS + 1]; /* the last report of each worker and of the service */
    uint8_t *ledger;         /* per checkpoint id: 0 unseen, 1 complete, 2 failed */
    uint64_t max_id;
    bool verbose;
} campaign;

#define LEDGER_IDS (1u << 22)

static uint64_t rnd(campaign *k, uint64_t bound)
{
    k->rng = k->rng * 6364136223846793005ull + 1442695040888963407ull;
    return bound ? wl_mix64(k->rng) % bound : 0;
}

__attribute__((format(printf, 2, 3))) static void problem(campaign *k, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "stash-crash: %s/%s: ", k->c.backend == STASH_BACKEND_LMDB ? "lmdb" : "heap",
            k->c.incremental ? "incremental" : "full");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    k->n.failures++;
}

static pid_t spawn_worker(campaign *k, uint32_t index, bool rollback, const char *fault)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(worker_main(&k->c, index, rollback, fault));
    return pid;
}

static pid_t spawn_service(campaign *k, const char *fault)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(service_main(&k->c, fault));
    return pid;
}

static void kill_wait(pid_t *pid)
{
    if (*pid <= 0) return;
    kill(*pid, SIGKILL);
    waitpid(*pid, NULL, 0);
    *pid = 0;
}

/* What the control block says, or pid 0 if the arena is not there. */
static stash_service_info service_info(campaign *k)
{
    stash_service_info info = {0};
    stash_arena_opts ao = arena_opts(&k->c);
    stash_arena *a;
    if (stash_arena_open(k->c.name, &ao, &a) == 0) {
        stash_service_info_get(a, &info);
        stash_arena_close(a);
    }
    return info;
}

/* Enters the finished checkpoints into the ledger: an id is never used twice,
 * and ids grow. */
static void note_checkpoints(campaign *k, const stash_service_info *info)
{
    for (uint32_t i = info->nrecent; i-- > 0;) {
        const stash_checkpoint_info *ci = &info->recent[i];
        if (ci->savepoint || ci->id >= LEDGER_IDS) continue;
        uint8_t status = ci->status == 0 ? 1 : 2;
        if (k->ledger[ci->id] == status) continue;
        if (k->ledger[ci->id] != 0 || ci->id <= k->max_id) {
            problem(k, "checkpoint id %llu used again (%s after %s)", (unsigned long long)ci->id,
                    status == 1 ? "complete" : "failed",
                    k->ledger[ci->id] == 1   ? "complete"
                    : k->ledger[ci->id] == 2 ? "failed"
                                             : "a newer id");
            k->n.reused_ids++;
        }
        k->ledger[ci->id] = status;
        if (ci->id > k->max_id) k->max_id = ci->id;
        if (status == 1)
            k->n.ckpt_complete++;
        else
            k->n.ckpt_failed++;
        if (k->verbose)
            fprintf(stderr, "  checkpoint %llu %s%s%s\n", (unsigned long long)ci->id,
                    status == 1 ? "complete" : "failed: ", status == 1 ? "" : ci->detail,
                    ci->incremental ? " (incremental)" : "");
    }
}

/* Reads reports for up to ms, counting verifications; keeps each worker's
 * and the service's last report. Returns whether one from (index, pid) came. */
static bool pump(campaign *k, int ms, uint32_t index, pid_t pid)
{
    struct pollfd p = {k->rfd, POLLIN, 0};
    uint64_t until = now_ns() + (uint64_t)ms * 1000000ull;
    for (;;) {
        if (index <= WORKERS && k->got[index].pid == pid) return true;
        uint64_t t = now_ns();
        int left = t >= until ? 0 : (int)((until - t) / 1000000ull);
        if (poll(&p, 1, left) <= 0) return false;
        report r;
        if (read(k->rfd, &r, sizeof r) != (ssize_t)sizeof r) return false;
        if (r.kind == R_VERIFIED) {
            k->n.verifications++;
            k->n.keys += r.keys;
            k->n.bad += r.bad;
            if (r.bad)
                problem(k,
                        "worker %u (pid %d) at offset %llu: %llu of the values of its %llu "
                        "keys are lost or counted twice",
                        r.index, r.pid, (unsigned long long)r.offset, (unsigned long long)r.bad,
                        (unsigned long long)r.keys);
            else if (k->verbose)
                fprintf(stderr, "  worker %u (pid %d) verified %llu keys at offset %llu%s\n",
                        r.index, r.pid, (unsigned long long)r.keys, (unsigned long long)r.offset,
                        r.rolled ? " after its rollback" : "");
        }
        bool current = r.index < WORKERS ? k->w[r.index] == r.pid : k->svc == r.pid;
        if (r.index <= WORKERS && current)
            k->got[r.index] = r;
        else if (r.kind == R_FAILED && k->verbose)
            fprintf(stderr, "  (killed) %s\n", r.what);
        if (r.kind == R_FAILED && current) problem(k, "%s", r.what);
    }
}

/* Waits for the verification of worker index (or its failure). */
static bool await_worker(campaign *k, uint32_t index, report *out)
{
    pid_t pid = k->w[index];
    for (uint64_t t0 = now_ns(); now_ns() - t0 < WAIT_NS;) {
        if (pump(k, 100, index, pid)) {
            *out = k->got[index];
            return out->kind == R_VERIFIED;
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            k->w[index] = 0;
            if (pump(k, 100, index, pid)) return false;
            problem(k, "worker %u died before it verified its keys", index);
            return false;
        }
    }
    problem(k, "worker %u never verified its keys", index);
    return false;
}

/* Waits until the service (pid k->svc) serves the arena; false if it failed. */
static bool await_service(campaign *k)
{
    for (uint64_t t0 = now_ns(); now_ns() - t0 < WAIT_NS;) {
        if (service_info(k).pid == k->svc) return true;
        if (pump(k, 5, WORKERS, k->svc)) {
            waitpid(k->svc, NULL, 0);
            k->svc = 0;
            return false;
        }
    }
    problem(k, "the service (pid %d) never came up", (int)k->svc);
    return false;
}

/* Waits until a checkpoint newer than id completes (failures are counted). */
static bool await_checkpoint(campaign *k, uint64_t id)
{
    for (uint64_t t0 = now_ns(); now_ns() - t0 < WAIT_NS;) {
        stash_service_info info = service_info(k);
        note_checkpoints(k, &info);
        if (info.completed > id) return true;
        pump(k, 10, UINT32_MAX, 0);
    }
    problem(k, "no checkpoint after %llu completed", (unsigned long long)id);
    return false;
}

static bool start_workers(campaign *k, bool rollback)
{
    bool ok = true;
    report r;
    for (uint32_t i = 0; i < WORKERS; i++) k->w[i] = spawn_worker(k, i, rollback, NULL);
    for (uint32_t i = 0; i < WORKERS; i++) ok &= await_worker(k, i, &r);
    return ok;
}

static void kill_all(campaign *k)
{
    kill_wait(&k->svc);
    for (uint32_t i = 0; i < WORKERS; i++) kill_wait(&k->w[i]);
}

/* Removes the arena as a power loss does; counts what else a killed
 * service left in /dev/shm under the arena's name (an arena it was
 * building has no name until it is whole). */
static void lose_power(campaign *k)
{
    kill_all(k);
    stash_arena_opts ao = arena_opts(&k->c);
    stash_arena_destroy(k->c.name, &ao);
    char prefix[300];
    snprintf(prefix, sizeof prefix, "stash.%s", k->c.name);
    DIR *d = opendir("/dev/shm");
    for (struct dirent *de; d && (de = readdir(d));) {
        size_t n = strlen(prefix);
        if (strncmp(de->d_name, prefix, n) != 0 || (de->d_name[n] && de->d_name[n] != '.'))
            continue;
        problem(k, "/dev/shm/%s is left after stash_arena_destroy", de->d_name);
        k->n.leaks++;
        unlinkat(dirfd(d), de->d_name, 0);
    }
    if (d) closedir(d);
}

/* Restores after a power loss: the service must come back with a checkpoint
 * at least as new as committed (older only if may_fall_back), and workers
 * must find their keys as of their offsets. */
static bool restore(campaign *k, uint64_t committed, bool may_fall_back, const char *fault)
{
    k->svc = spawn_service(k, fault);
    if (!await_service(k)) return false;
    uint64_t restored = service_info(k).completed;
    if (restored < committed) {
        if (may_fall_back) {
            k->n.fell_back++;
        } else {
            problem(k, "restored checkpoint %llu though %llu was complete",
                    (unsigned long long)restored, (unsigned long long)committed);
            k->n.regressions++;
        }
    }
    return start_workers(k, false);
}

/* A replacement for worker index after it was killed; its rollback must not
 * go back past the checkpoint complete at the kill. */
static bool replace(campaign *k, uint32_t index, uint64_t committed, const char *fault)
{
    report r;
    k->w[index] = spawn_worker(k, index, true, fault);
    if (!await_worker(k, index, &r)) return false;
    if (r.rolled < committed && fault) {
        k->n.fell_back++;
    } else if (r.rolled < committed) {
        problem(k, "worker %u rolled back to checkpoint %llu though %llu was complete", index,
                (unsigned long long)r.rolled, (unsigned long long)committed);
        k->n.regressions++;
    }
    return true;
}

/* How many checkpoints of the directory have metadata. */
static unsigned committed_dirs(campaign *k)
{
    DIR *d = opendir(k->c.dir);
    unsigned n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char md[600];
        snprintf(md, sizeof md, "%s/%s/_metadata", k->c.dir, e->d_name);
        n += strncmp(e->d_name, "chk-", 4) == 0 && access(md, F_OK) == 0;
    }
    if (d) closedir(d);
    return n;
}

/* Flips a byte of, or truncates, one file of the newest complete checkpoint
 * (its metadata, or the data file only it uses), if an older one is left;
 * whether it did. */
static bool damage_newest(campaign *k, uint64_t id)
{
    if (id == 0 || committed_dirs(k) < 2) return false;
    char files[2][400];
    snprintf(files[0], sizeof files[0], "%s/chk-%llu/_metadata", k->c.dir, (unsigned long long)id);
    snprintf(files[1], sizeof files[1], "%s/chk-%llu/kg-data.dat", k->c.dir,
             (unsigned long long)id);
    if (access(files[1], F_OK) != 0)
        snprintf(files[1], sizeof files[1], "%s/shared/%llu.dat", k->c.dir, (unsigned long long)id);
    const char *f = files[rnd(k, 2)];
    int fd = open(f, O_RDWR);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || st.st_size == 0) {
        if (fd >= 0) close(fd);
        return false;
    }
    off_t at = (off_t)rnd(k, (uint64_t)st.st_size);
    if (rnd(k, 3) == 0) {
        if (ftruncate(fd, at) < 0) problem(k, "truncate %s: %s", f, strerror(errno));
    } else {
        uint8_t b;
        if (pread(fd, &b, 1, at) == 1) {
            b ^= (uint8_t)(1u << rnd(k, 8));
            if (pwrite(fd, &b, 1, at) != 1) problem(k, "damage %s: %s", f, strerror(errno));
        }
    }
    if (k->verbose) fprintf(stderr, "  damaged %s at %lld\n", f, (long long)at);
    close(fd);
    return true;
}

static const char *storage_faults[] = {
    "write:1:EIO", "write:3:ENOSPC", "fsync:1:EIO", "fsync:2:EIO", "short", "write:2:EDQUOT",
};

/* The remote storage's: a data file's part, its metadata, a later one. */
static const char *remote_faults[] = {
    REMOTE "write:1:EIO",
    REMOTE "write:2:EIO",
    REMOTE "write:3:EDQUOT",
    REMOTE "write:5:ETIMEDOUT",
};

/* Removes the checkpoint directory and makes it again, empty. */
static void lose_directory(campaign *k)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -m 700 '%s'", k->c.dir, k->c.dir);
    if (system(cmd) != 0) problem(k, "could not empty %s", k->c.dir);
}

/* A service whose storage fails the fault given must not start: true if
 * it failed as it should (and left no arena). */
static bool start_fails(campaign *k, const char *fault)
{
    pid_t pid = spawn_service(k, fault);
    for (uint64_t t0 = now_ns(); now_ns() - t0 < WAIT_NS;) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            pump(k, 10, UINT32_MAX, 0);
            if (service_info(k).pid == 0) return true;
            problem(k, "a service that failed on a storage with %s left an arena", fault);
            return false;
        }
        if (service_info(k).pid == pid) {
            problem(k, "the service started though its storage failed with %s", fault);
            kill_wait(&pid);
            return false;
        }
        pump(k, 10, UINT32_MAX, 0);
    }
    problem(k, "the service on a storage with %s neither started nor failed", fault);
    kill_wait(&pid);
    return false;
}

/* One event of kind e; false if the campaign cannot go on. */
static bool event(campaign *k, int e)
{
    uint64_t committed = service_info(k).completed;
    uint32_t index = (uint32_t)rnd(k, WORKERS);
    switch (e) {
    case E_KILL_WORKER:
        k->n.events[e]++;
        kill_wait(&k->w[index]);
        return replace(k, index, committed, NULL);
    case E_KILL_REPLACEMENT: {
        k->n.events[e]++;
        kill_wait(&k->w[index]);
        k->w[index] = spawn_worker(k, index, true, NULL);
        usleep((useconds_t)rnd(k, 30000));
        kill_wait(&k->w[index]);
        return replace(k, index, committed, NULL);
    }
    case E_KILL_SERVICE:
        k->n.events[e]++;
        kill_wait(&k->svc);
        k->svc = spawn_service(k, NULL);
        return await_service(k) && await_checkpoint(k, committed);
    case E_POWER_LOSS:
        k->n.events[e]++;
        lose_power(k);
        return restore(k, committed, false, NULL);
    case E_KILL_RESTORING:
        k->n.events[e]++;
        lose_power(k);
        k->svc = spawn_service(k, NULL);
        usleep((useconds_t)rnd(k, 20000));
        lose_power(k);
        return restore(k, committed, false, NULL);
    case E_STORAGE_FAULT: {
        const char *fault =
            k->c.url[0] && rnd(k, 2)
                ? remote_faults[rnd(k, sizeof remote_faults / sizeof *remote_faults)]
                : storage_faults[rnd(k, sizeof storage_faults / sizeof *storage_faults)];
        k->n.events[e]++;
        if (k->verbose) fprintf(stderr, "  service on a storage with %s\n", fault);
        kill_wait(&k->svc);
        k->svc = spawn_service(k, fault);
        if (!await_service(k)) return false;
        uint64_t before = k->n.ckpt_failed + k->n.ckpt_complete;
        for (uint64_t t0 = now_ns(); k->n.ckpt_failed + k->n.ckpt_complete < before + 3;) {
            stash_service_info info = service_info(k);
            note_checkpoints(k, &info);
            pump(k, 10, UINT32_MAX, 0);
            if (now_ns() - t0 > WAIT_NS) {
                problem(k, "no checkpoint finished on a storage with %s", fault);
                return false;
            }
        }
        committed = service_info(k).completed;
        kill_wait(&k->svc);
        k->svc = spawn_service(k, NULL);
        return await_service(k) && await_checkpoint(k, committed);
    }
    case E_DAMAGE:
        /* With no older checkpoint to fall back to, a plain power loss. */
        lose_power(k);
        k->n.events[damage_newest(k, committed) ? E_DAMAGE : E_POWER_LOSS]++;
        return restore(k, committed, true, NULL);
    case E_LIVE_DAMAGE:
        /* The next checkpoints must not depend on what was damaged: after
         * two more, a power loss restores the newest. */
        k->n.events[damage_newest(k, committed) ? E_LIVE_DAMAGE : E_POWER_LOSS]++;
        if (!await_checkpoint(k, committed)) return false;
        if (!await_checkpoint(k, service_info(k).completed)) return false;
        committed = service_info(k).completed;
        lose_power(k);
        return restore(k, committed, false, NULL);
    case E_READ_FAULT:
        /* The first read fails: the restore or the rollback costs one
         * checkpoint (the older one restores), never the job. */
        if (committed_dirs(k) < 2) return true;
        k->n.events[e]++;
        if (rnd(k, 2)) {
            kill_wait(&k->w[index]);
            return replace(k, index, committed, "read:1:EIO");
        }
        lose_power(k);
        if (!restore(k, committed, true, "read:1:EIO")) return false;
        committed = service_info(k).completed;
        kill_wait(&k->svc);
        k->svc = spawn_service(k, NULL);
        return await_service(k) && await_checkpoint(k, committed);
    case E_MACHINE_LOST:
        /* Without a remote storage, a power loss. */
        if (!k->c.url[0]) {
            k->n.events[E_POWER_LOSS]++;
            lose_power(k);
            return restore(k, committed, false, NULL);
        }
        k->n.events[e]++;
        lose_power(k);
        lose_directory(k);
        /* Read straight from the storage: one whose read fails first
         * fails the start, leaving nothing. */
        if (rnd(k, 2) && !start_fails(k, REMOTE "read:2:EIO")) return false;
        return restore(k, committed, false, NULL);
    }
    return false;
}

static bool run_config(campaign *k, uint64_t events, uint64_t until_ns)
{
    k->svc = spawn_service(k, NULL);
    if (!await_service(k) || !start_workers(k, false) || !await_checkpoint(k, 0)) return false;
    for (uint64_t e = 0; e < events && now_ns() < until_ns; e++) {
        pump(k, (int)rnd(k, 250), UINT32_MAX, 0);
        int kind = (int)rnd(k, E_KINDS);
        if (k->verbose)
            fprintf(stderr, "event %llu: %s\n", (unsigned long long)e, event_names[kind]);
        if (!event(k, kind)) return false;
        stash_service_info info = service_info(k);
        note_checkpoints(k, &info);
        if (!await_checkpoint(k, info.completed)) return false;
    }
    /* The end: one more checkpoint, a power loss (with a remote storage,
     * the machine lost with its directory), and every key checked. */
    uint64_t committed = service_info(k).completed;
    if (!await_checkpoint(k, committed)) return false;
    committed = service_info(k).completed;
    lose_power(k);
    if (k->c.url[0]) lose_directory(k);
    return restore(k, committed, false, NULL);
}

static void cleanup(campaign *k)
{
    kill_all(k);
    stash_arena_opts ao = arena_opts(&k->c);
    stash_arena_destroy(k->c.name, &ao);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", k->c.dir, k->c.lmdb_dir);
    if (system(cmd) != 0) fprintf(stderr, "stash-crash: could not remove %s\n", k->c.dir);
}

static void add_counts(counts *to, const counts *from)
{
    for (int e = 0; e < E_KINDS; e++) to->events[e] += from->events[e];
    to->verifications += from->verifications;
    to->keys += from->keys;
    to->bad += from->bad;
    to->ckpt_complete += from->ckpt_complete;
    to->ckpt_failed += from->ckpt_failed;
    to->regressions += from->regressions;
    to->reused_ids += from->reused_ids;
    to->leaks += from->leaks;
    to->failures += from->failures;
    to->fell_back += from->fell_back;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: stash-crash [--seed N] [--events N] [--minutes M] [--backend heap|lmdb|both]\n"
            "                   [--mode full|incremental|both] [--storage URL] [--verbose]\n"
            "The crash campaign: %u worker processes and a service checkpointing every %u ms,\n"
            "killed and damaged at seeded random moments; every worker that starts checks\n"
            "every key against a model. --events is per configuration (default 60); with\n"
            "--minutes the configurations take turns, --events each, until the time is up.\n"
            "--storage rados://POOL/PREFIX or s3://BUCKET/PREFIX: checkpoints go there too\n"
            "(each configuration under a job of its own), the storage fails writes and reads,\n"
            "and machines are lost with their directory ($CEPH_CONF, or the S3 endpoint and\n"
            "keys of the environment).\n"
            "The seed is printed; --seed replays the sequence of events. Exits 0 if nothing\n"
            "was lost, counted twice or reused, 1 otherwise, 2 on a wrong argument.\n",
            WORKERS, INTERVAL_MS);
}

static bool parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!s[0] || s[0] == '-') return false;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end) return false;
    *out = v;
    return true;
}

int main(int argc, char **argv)
{
    uint64_t seed = 0, events = 60, minutes = 0;
    bool have_seed = false, verbose = false;
    const char *storage = NULL;
    int backends = 3, modes = 3;
    static const struct option longopts[] = {{"seed", required_argument, NULL, 's'},
                                             {"events", required_argument, NULL, 'e'},
                                             {"minutes", required_argument, NULL, 'm'},
                                             {"backend", required_argument, NULL, 'b'},
                                             {"mode", required_argument, NULL, 'M'},
                                             {"verbose", no_argument, NULL, 'v'},
                                             {"storage", required_argument, NULL, 'S'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        const char *a = optarg;
        bool ok = true;
        switch (o) {
        case 's':
            ok = have_seed = parse_u64(a, &seed);
            break;
        case 'e':
            ok = parse_u64(a, &events) && events > 0;
            break;
        case 'm':
            ok = parse_u64(a, &minutes) && minutes > 0;
            break;
        case 'b':
            backends = !strcmp(a, "heap") ? 1 : !strcmp(a, "lmdb") ? 2 : !strcmp(a, "both") ? 3 : 0;
            ok = backends != 0;
            break;
        case 'M':
            modes = !strcmp(a, "full")          ? 1
                    : !strcmp(a, "incremental") ? 2
                    : !strcmp(a, "both")        ? 3
                                                : 0;
            ok = modes != 0;
            break;
        case 'S':
            storage = a;
            ok = strstr(a, "://") && strchr(strstr(a, "://") + 3, '/');
            break;
        case 'v':
            verbose = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "stash-crash: --%s: not a valid value: '%s'\n",
                    o == 's'   ? "seed"
                    : o == 'e' ? "events"
                    : o == 'm' ? "minutes"
                    : o == 'b' ? "backend"
                    : o == 'S' ? "storage"
                               : "mode",
                    a);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "stash-crash: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!have_seed) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        seed = wl_mix64((uint64_t)t.tv_nsec ^ ((uint64_t)getpid() << 32));
    }
    printf("stash-crash: seed %llu (replay with --seed %llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    fflush(stdout);
    signal(SIGPIPE, SIG_IGN);
    int pfd[2];
    if (pipe(pfd) < 0) return perror("pipe"), 1;
    report_fd = pfd[1];
    uint64_t until = minutes ? now_ns() + minutes * 60000000000ull : UINT64_MAX;
    uint8_t *ledger = calloc(LEDGER_IDS, 1);
    if (!ledger) return perror("calloc"), 1;
    counts total = {0};
    const char *tmp = getenv("TMPDIR");
    bool ok = true;
    for (unsigned round = 0; ok && (round == 0 || now_ns() < until); round++) {
        for (int cfg = 0; ok && cfg < 4; cfg++) {
            stash_backend b = cfg / 2 ? STASH_BACKEND_LMDB : STASH_BACKEND_HEAP;
            int inc = cfg % 2;
            if (!(backends & (1 << (int)b)) || !(modes & (1 << inc))) continue;
            campaign k = {.rng = wl_mix64(seed + (uint64_t)cfg + 4ull * round),
                          .rfd = pfd[0],
                          .ledger = ledger,
                          .verbose = verbose};
            memset(ledger, 0, LEDGER_IDS);
            k.c.backend = b;
            k.c.incremental = inc;
            snprintf(k.c.name, sizeof k.c.name, "crash-%d-%d", (int)getpid(), cfg);
            snprintf(k.c.dir, sizeof k.c.dir, "%s/stash-crash-XXXXXX",
                     tmp && tmp[0] ? tmp : "/tmp");
            if (!mkdtemp(k.c.dir)) return perror("mkdtemp"), 1;
            snprintf(k.c.lmdb_dir, sizeof k.c.lmdb_dir, "%s.lmdb", k.c.dir);
            if (storage)
                snprintf(k.c.url, sizeof k.c.url, "%s-%d-%d-%u", storage, (int)getpid(), cfg,
                         round);
            uint64_t t0 = now_ns();
            ok = run_config(&k, events, minutes ? until : UINT64_MAX);
            cleanup(&k);
            ok = ok && k.n.failures == 0;
            uint64_t nev = 0;
            for (int e = 0; e < E_KINDS; e++) nev += k.n.events[e];
            printf("stash-crash: %s/%s: %llu events, %llu verifications, %llu lost or counted "
                   "twice, %llu checkpoints complete, %llu failed cleanly (%.0f s)%s\n",
                   b == STASH_BACKEND_LMDB ? "lmdb" : "heap", inc ? "incremental" : "full",
                   (unsigned long long)nev, (unsigned long long)k.n.verifications,
                   (unsigned long long)k.n.bad, (unsigned long long)k.n.ckpt_complete,
                   (unsigned long long)k.n.ckpt_failed, (double)(now_ns() - t0) / 1e9,
                   ok ? "" : " FAILED");
            fflush(stdout);
            add_counts(&total, &k.n);
        }
        if (!minutes) break;
    }
    free(ledger);
    uint64_t nev = 0;
    for (int e = 0; e < E_KINDS; e++) nev += total.events[e];
    printf("stash-crash: seed %llu: %llu events (", (unsigned long long)seed,
           (unsigned long long)nev);
    for (int e = 0; e < E_KINDS; e++)
        printf("%s%llu %s", e ? ", " : "", (unsigned long long)total.events[e], event_names[e]);
    printf(")\nstash-crash: %llu worker starts verified %llu keys; %llu values lost or counted "
           "twice, %llu restores behind a complete checkpoint, %llu ids used twice, %llu "
           "files left in /dev/shm; %llu checkpoints complete, %llu failed cleanly, %llu restores "
           "fell back past a damaged one; %s\n",
           (unsigned long long)total.verifications, (unsigned long long)total.keys,
           (unsigned long long)total.bad, (unsigned long long)total.regressions,
           (unsigned long long)total.reused_ids, (unsigned long long)total.leaks,
           (unsigned long long)total.ckpt_complete, (unsigned long long)total.ckpt_failed,
           (unsigned long long)total.fell_back, ok ? "PASSED" : "FAILED");
    return ok ? 0 : 1;
}
