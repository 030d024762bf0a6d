/* SPDX-License-Identifier: MIT */
/*
 * demo.c: `stash demo`: the service at work. `stash serve demo-PID`
 * checkpoints to a new temporary directory every second (it creates both and
 * touches nothing else) while three worker processes count the words of a
 * generated stream in batches of 32 events (a ValueState count and a
 * MapState of counts per stretch of the stream, per word) and keep their
 * input offset in operator ListState. Then: a worker is killed with SIGKILL and replaced by one
 * that rolls its key groups and offset back to the last complete checkpoint; the service is killed
 * and restarted, reattaching; finally everything dies and the arena is removed, as a power loss
 * would, and a new service restores the newest checkpoint and new workers resume from their
 * offsets. The events carry timestamps: per word (a user), event-time windows of ten minutes are
 * counted and emitted when their timers fire, through a sink that commits with the checkpoints
 * (demo_windows.c). Every count and every window ends exactly right (exactly once), and each
 * recovery is timed.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/demo.h"
#include "tools/demo_windows.h"

/* The arena and the checkpoint directory: the demo's own, made new. */
static char demo_name[32];
char demo_dir[256];
#define STRETCH 1000000u /* events per stretch: the MapState's user key */
#define RATE 500000u     /* events a worker scans per second */
#define BATCH 32u        /* events a worker runs in one batch */

__attribute__((format(printf, 1, 2))) void demo_say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

uint64_t demo_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The word of event i: a deterministic stream every process can replay. */
uint64_t demo_word_of(uint64_t i)
{
    uint64_t x = i * 0x9e3779b97f4a7c15ull;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    return (x ^ (x >> 29)) % WORDS;
}

typedef struct job_states {
    stash_worker *w;
    stash_state *count, *stretches, *offsets;
    stash_kg_range range;
    uint32_t max_parallelism;
    demo_windows *win;
} job_states;

/* Whether the worker owns the word's key group. */
static bool owns(const job_states *j, uint64_t word)
{
    uint32_t kg = stash_key_group(&word, sizeof word, j->max_parallelism);
    return kg >= j->range.first && kg <= j->range.last;
}

/* Adds one to the word's count and to its count in the event's stretch. */
static int count_event(job_states *j, uint64_t i)
{
    stash_bytes v;
    uint64_t n = 0, s = 0;
    uint32_t stretch = (uint32_t)(i / STRETCH);
    if (stash_value_get(j->count, &v) == 0) memcpy(&n, v.data, sizeof n);
    n++;
    int rc = stash_value_put(j->count, &n, sizeof n);
    if (rc == 0 && stash_map_get(j->stretches, &stretch, sizeof stretch, &v) == 0)
        memcpy(&s, v.data, sizeof s);
    s++;
    return rc ? rc : stash_map_put(j->stretches, &stretch, sizeof stretch, &s, sizeof s);
}

/* One event of a batch, its word the current key: counted, and added to
 * its user's window. */
static int count_batched(stash_worker *w, void *event, void *ctx)
{
    (void)w;
    job_states *j = ctx;
    uint64_t i = (uintptr_t)event;
    int rc = count_event(j, i);
    return rc < 0 ? rc : demo_windows_add(j->win, i);
}

/* Counts the worker's events of first .. end-1 in one batch. */
static int count_batch(job_states *j, stash_batch *batch, uint64_t first, uint64_t end)
{
    for (uint64_t i = first; i < end; i++) {
        uint64_t word = demo_word_of(i);
        if (!owns(j, word)) continue;
        /* The event is its index in the stream. */
        int rc = stash_batch_add(batch, &word, sizeof word, (void *)(uintptr_t)i);
        if (rc < 0) return rc;
    }
    int results[BATCH];
    uint32_t n = stash_batch_size(batch);
    int failed = stash_batch_run(batch, count_batched, j, results);
    for (uint32_t k = 0; failed > 0 && k < n; k++)
        if (results[k] < 0) return results[k];
    return failed < 0 ? failed : 0;
}

/* Checks every count of the worker's words against a replay of the stream. */
static int verify(job_states *j, uint64_t *wrong)
{
    uint32_t nstretch = (EVENTS + STRETCH - 1) / STRETCH;
    uint32_t *want = calloc((size_t)WORDS * nstretch, sizeof *want);
    if (!want) return -ENOMEM;
    for (uint64_t i = 0; i < EVENTS; i++) want[demo_word_of(i) * nstretch + i / STRETCH]++;
    *wrong = 0;
    for (uint64_t word = 0; word < WORDS; word++) {
        if (!owns(j, word)) continue;
        stash_key_set(j->w, &word, sizeof word);
        stash_bytes v;
        uint64_t n = 0, total = 0;
        if (stash_value_get(j->count, &v) == 0) memcpy(&n, v.data, sizeof n);
        for (uint32_t s = 0; s < nstretch; s++) {
            uint64_t c = 0;
            if (stash_map_get(j->stretches, &s, sizeof s, &v) == 0) memcpy(&c, v.data, sizeof c);
            *wrong += c != want[word * nstretch + s];
            total += want[word * nstretch + s];
        }
        *wrong += n != total;
    }
    free(want);
    return 0;
}

static int fail(int fd, uint32_t index, const char *what, int rc)
{
    dprintf(fd, "  worker %u FAILED to %s: %s (%s)\n", index, what, stash_strerror(rc),
            stash_errmsg());
    return 1;
}

/* Passes a barrier; a checkpoint complete commits the windows' output up
 * to it. Returns 1 if one completed, 0, or an error. */
static int barrier(job_states *j, demo_windows *win)
{
    stash_event ev;
    int rc = stash_barrier(j->w, &ev);
    if (rc <= 0 || ev.kind != STASH_CHECKPOINT_COMPLETE) return rc < 0 ? rc : 0;
    rc = demo_windows_complete(win, ev.checkpoint_id);
    return rc < 0 ? rc : 1;
}

/* A worker: joins (rolling back if asked), resumes at the offset its
 * operator state holds, counts its words and their windows at a steady
 * pace with a barrier after each event, and once done waits for a
 * checkpoint to hold its end and commit its last windows. */
static int worker_main(const char *arena, uint32_t index, bool rollback, int fd)
{
    job_states j = {0};
    demo_windows win = {.out = -1};
    uint64_t t0 = demo_now_ns();
    int rc = stash_worker_open(arena,
                               &(stash_worker_opts){.index = index,
                                                    .parallelism = WORKERS,
                                                    .rollback = rollback,
                                                    .on_cut = demo_windows_cut,
                                                    .cut_ctx = &win},
                               &j.w);
    if (rc < 0) return fail(fd, index, "join", rc);
    double join_ms = (double)(demo_now_ns() - t0) / 1e6;
    stash_worker_info info;
    stash_worker_info_get(j.w, &info);
    j.range = info.range;
    stash_arena_info ai;
    stash_arena_info_get(stash_worker_arena(j.w), &ai);
    j.max_parallelism = ai.max_parallelism;
    j.win = &win;
    if ((rc = stash_state_get(j.w, &(stash_state_desc){.name = "count", .kind = STASH_VALUE},
                              &j.count)) < 0 ||
        (rc = stash_state_get(j.w, &(stash_state_desc){.name = "stretches", .kind = STASH_MAP},
                              &j.stretches)) < 0 ||
        (rc = stash_state_get(j.w, &(stash_state_desc){.name = "offsets", .kind = STASH_OP_LIST},
                              &j.offsets)) < 0)
        return fail(fd, index, "register its states", rc);
    if ((rc = demo_windows_open(&win, j.w, index, demo_dir)) < 0)
        return fail(fd, index, "recover its window output", rc);
    const stash_bytes *el;
    size_t n;
    uint64_t start = 0;
    stash_op_list_get(j.offsets, &el, &n);
    if (n == 1 && el[0].len == sizeof start) memcpy(&start, el[0].data, sizeof start);
    if (rollback)
        dprintf(fd,
                "  worker %u (pid %d) replaced the dead one: rolled back to the last complete "
                "checkpoint in %.1f ms, resumes at event %llu\n",
                index, (int)getpid(), join_ms, (unsigned long long)start);
    stash_batch *batch;
    /* The windows' counts are read in the window's namespace, which the
     * handler sets: fetched ahead in another, they would be fetched for
     * nothing. */
    stash_state *fetched[] = {j.count, j.stretches};
    stash_batch_opts bo = {.capacity = BATCH, .states = fetched, .nstates = 2};
    if ((rc = stash_batch_create(j.w, &bo, &batch)) < 0)
        return fail(fd, index, "make its batch", rc);
    uint64_t begun = demo_now_ns(), completions = 0;
    /* Batches of the events of BATCH-aligned stretches of the stream, a
     * barrier between two: the offset recorded is always a batch's end. */
    for (uint64_t i = start, end; i < EVENTS; i = end) {
        end = (i / BATCH + 1) * BATCH < EVENTS ? (i / BATCH + 1) * BATCH : EVENTS;
        if ((rc = count_batch(&j, batch, i, end)) < 0) return fail(fd, index, "write", rc);
        if (((end - 1) & 1023) == 1023 &&
            (rc = demo_windows_advance(&win, demo_watermark(end - 1))) < 0)
            return fail(fd, index, "fire its windows", rc);
        stash_bytes b = {&end, sizeof end};
        if ((rc = stash_op_list_update(j.offsets, &b, 1)) < 0)
            return fail(fd, index, "record its offset", rc);
        if ((rc = barrier(&j, &win)) < 0) return fail(fd, index, "pass a barrier", rc);
        if ((end & 4095) == 0) {
            uint64_t due = begun + (end - start) * (1000000000ull / RATE), t = demo_now_ns();
            if (due > t) usleep((useconds_t)((due - t) / 1000));
        }
    }
    stash_batch_destroy(batch);
    /* The end of the stream: every window left is due. */
    if ((rc = demo_windows_advance(&win, UINT64_MAX)) < 0)
        return fail(fd, index, "fire its windows", rc);
    /* Checkpoints run one at a time: the second to complete from here was
     * cut after the end, and its completion commits the last windows. */
    uint64_t waited = demo_now_ns();
    while (completions < 2) {
        rc = barrier(&j, &win);
        if (rc < 0) return fail(fd, index, "pass a barrier", rc);
        completions += (uint64_t)rc;
        if (demo_now_ns() - waited > STEP_TIMEOUT_NS)
            return fail(fd, index, "see a checkpoint", -ETIMEDOUT);
        usleep(2000);
    }
    uint64_t wrong;
    if ((rc = verify(&j, &wrong)) < 0) return fail(fd, index, "verify", rc);
    dprintf(fd,
            "  worker %u (pid %d, key groups %u..%u): resumed at event %llu, finished the "
            "stream; counts %s; %llu windows committed, %llu restored transactions committed "
            "again, %llu found committed already\n",
            index, (int)getpid(), j.range.first, j.range.last, (unsigned long long)start,
            wrong ? "WRONG" : "exactly right", (unsigned long long)win.emitted,
            (unsigned long long)win.recommitted, (unsigned long long)win.skipped);
    stash_worker_close(j.w);
    demo_windows_close(&win);
    return wrong ? 1 : 0;
}

pid_t demo_start_worker(const char *arena, uint32_t index, bool rollback, int fd)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(worker_main(arena, index, rollback, fd));
    return pid;
}

/* `stash serve demo` as a child process of this binary. */
static pid_t start_service(void)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        char *argv[] = {"stash", "serve",  demo_name, "--dir", demo_dir,        "--interval",
                        "1s",    "--size", "256M",    "--lz4", "--incremental", NULL};
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    return pid;
}

void demo_relay(story *s, int ms)
{
    struct pollfd p = {s->fd, POLLIN, 0};
    while (poll(&p, 1, ms) > 0) {
        char c;
        if (read(s->fd, &c, 1) != 1) return;
        if (c != '\n' && s->len < sizeof s->line - 2) {
            s->line[s->len++] = c;
            ms = 0;
            continue;
        }
        s->line[s->len] = '\n';
        s->line[s->len + 1] = '\0';
        fputs(s->line, stdout);
        fflush(stdout);
        s->finished += strstr(s->line, "finished the stream") != NULL;
        const char *at = strstr(s->line, "checkpoint in ");
        if (at) s->rollback_ms = strtod(at + strlen("checkpoint in "), NULL);
        s->bad += strstr(s->line, "FAILED") != NULL || strstr(s->line, "WRONG") != NULL;
        s->len = 0;
        ms = 0;
    }
}

/* The service's view through the arena (pid 0 if no service runs). */
static stash_service_info service_info(void)
{
    stash_service_info info = {0};
    stash_arena *a;
    if (stash_arena_open(demo_name, NULL, &a) == 0) {
        stash_service_info_get(a, &info);
        stash_arena_close(a);
    }
    return info;
}

/* Waits, relaying reports, until a service with pid serves (pid 0: any). */
static int await_service(story *s, pid_t pid)
{
    for (uint64_t t0 = demo_now_ns(); demo_now_ns() - t0 < STEP_TIMEOUT_NS;) {
        stash_service_info i = service_info();
        if (i.pid && (pid == 0 || i.pid == pid)) return 0;
        demo_relay(s, 5);
    }
    demo_say("demo: the service never came up\n");
    return -1;
}

/* Waits, relaying reports, until checkpoint id or a later one is complete. */
static int await_checkpoint(story *s, uint64_t id)
{
    for (uint64_t t0 = demo_now_ns(); demo_now_ns() - t0 < STEP_TIMEOUT_NS;) {
        if (service_info().completed >= id) return 0;
        demo_relay(s, 20);
    }
    demo_say("demo: checkpoint %llu never completed\n", (unsigned long long)id);
    return -1;
}

void demo_kill_wait(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

int tool_demo(int argc, char **argv)
{
    if (tool_wants_help(argc, argv)) {
        printf("usage: stash demo [--hosts N [--ceph-conf FILE] [--pool P]]\n"
               "Runs the demonstration in a new directory under $TMPDIR (or /tmp) with a new\n"
               "arena demo-PID, touching nothing else: `stash serve` checkpoints every second\n"
               "while %u worker processes count words (ValueState, MapState), keep their\n"
               "input offsets in operator ListState, and count each word's events in windows\n"
               "of ten minutes of event time, emitted when their timers fire to the files\n"
               "windows-N.out, committed with the checkpoints; a worker is killed and replaced\n"
               "with a rollback, the service is killed and restarted, then everything dies\n"
               "with the arena and a new service restores it. Every count must end exactly\n"
               "right and every window be emitted once with its exact count. The arena is\n"
               "removed at the end; the checkpoints and the output stay, and the last line\n"
               "says where.\n"
               "--hosts N (2 to %u) runs the same job on N hosts, each a `stash serve --host`\n"
               "with an arena of its own, checkpointing into the RADOS pool P (stash) of a\n"
               "Ceph cluster (--ceph-conf; without it a single-node cluster on 127.0.0.1 that\n"
               "the demo starts and stops): a host is lost with its service, worker and arena\n"
               "and a live host takes its worker over from the newest job checkpoint, then\n"
               "the leader is lost and the lead moves; every count and window exactly right.\n",
               WORKERS, WORKERS);
        return 0;
    }
    unsigned nhosts = 0;
    const char *conf = NULL, *pool = NULL;
    for (int i = 1; i < argc; i++) {
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n = 0;
        if (val && strcmp(argv[i], "--hosts") == 0 && tool_parse_size(val, &n) == 0 && n >= 2 &&
            n <= WORKERS)
            nhosts = (unsigned)n;
        else if (val && strcmp(argv[i], "--ceph-conf") == 0)
            conf = val;
        else if (val && strcmp(argv[i], "--pool") == 0)
            pool = val;
        else {
            fprintf(stderr, "stash demo: bad or incomplete argument '%s' (see stash demo --help)\n",
                    argv[i]);
            return 2;
        }
        i++;
    }
    if (nhosts) return demo_hosts(nhosts, conf, pool);
    if (conf || pool) {
        fprintf(stderr, "stash demo: --ceph-conf and --pool go with --hosts N\n");
        return 2;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(demo_dir, sizeof demo_dir, "%s/stash-demo-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(demo_dir)) return tool_fail("demo: a directory for the checkpoints", -errno);
    snprintf(demo_name, sizeof demo_name, "demo-%d", (int)getpid());
    demo_say("== the demo's checkpoints go to %s, its arena is %s\n", demo_dir, demo_name);
    story s = {0};
    int pipefd[2];
    if (pipe(pipefd) < 0) return tool_fail("demo", -errno);
    s.fd = pipefd[0];
    int rc = 0;

    demo_say("== stash serve %s: checkpoints to %s every second\n", demo_name, demo_dir);
    pid_t svc = start_service();
    if (await_service(&s, svc) < 0) return 1;
    demo_say(
        "== %u workers count %u events over %u words (ValueState, MapState), offsets in "
        "operator ListState;\n   per word, windows of ten minutes of event time (timers) go to "
        "%s/windows-N.out, committed with the checkpoints\n",
        WORKERS, EVENTS, WORDS, demo_dir);
    pid_t pids[WORKERS];
    for (uint32_t i = 0; i < WORKERS; i++)
        pids[i] = demo_start_worker(demo_name, i, false, pipefd[1]);
    if (await_checkpoint(&s, 2) < 0) return 1;

    uint64_t done = service_info().completed;
    demo_say("== worker 1 (pid %d) killed with SIGKILL after checkpoint %llu\n", (int)pids[1],
             (unsigned long long)done);
    demo_kill_wait(pids[1]);
    /* The service notices within a quarter of a second; then the replacement. */
    for (uint64_t t = demo_now_ns(); demo_now_ns() - t < 400000000ull;) demo_relay(&s, 50);
    pids[1] = demo_start_worker(demo_name, 1, true, pipefd[1]);
    if (await_checkpoint(&s, done + 2) < 0) return 1;

    done = service_info().completed;
    demo_say("== the service (pid %d) killed with SIGKILL after checkpoint %llu; the workers go "
             "on\n",
             (int)svc, (unsigned long long)done);
    demo_kill_wait(svc);
    uint64_t t0 = demo_now_ns();
    svc = start_service();
    if (await_service(&s, svc) < 0) return 1;
    double reattach_ms = (double)(demo_now_ns() - t0) / 1e6;
    demo_say("== a new service reattached in %.1f ms\n", reattach_ms);
    if (await_checkpoint(&s, done + 2) < 0) return 1;

    done = service_info().completed;
    demo_say("== power loss after checkpoint %llu: the service and every worker killed, the arena "
             "removed\n",
             (unsigned long long)done);
    demo_kill_wait(svc);
    for (uint32_t i = 0; i < WORKERS; i++) demo_kill_wait(pids[i]);
    stash_arena_destroy(demo_name, NULL);
    t0 = demo_now_ns();
    svc = start_service();
    if (await_service(&s, svc) < 0) return 1;
    double restore_ms = (double)(demo_now_ns() - t0) / 1e6;
    demo_say("== a new service restored the arena in %.1f ms; %u new workers resume from their "
             "offsets\n",
             restore_ms, WORKERS);
    for (uint32_t i = 0; i < WORKERS; i++)
        pids[i] = demo_start_worker(demo_name, i, false, pipefd[1]);
    for (uint64_t t = demo_now_ns();
         s.finished + s.bad < WORKERS && demo_now_ns() - t < 4 * STEP_TIMEOUT_NS;)
        demo_relay(&s, 100);
    for (uint32_t i = 0; i < WORKERS; i++) waitpid(pids[i], NULL, 0);

    char *status[] = {"status", demo_name, NULL};
    tool_status(2, status);
    stash_arena *a;
    if (stash_arena_open(demo_name, NULL, &a) == 0) {
        rc = stash_service_request_stop(a, 30000);
        stash_arena_close(a);
    }
    waitpid(svc, NULL, 0);
    uint64_t windows = 0, missing = 0, twice = 0, wrong = 0;
    int checked = demo_windows_check(demo_dir, WORKERS, EVENTS, WORDS, demo_word_of, &windows,
                                     &missing, &twice, &wrong);
    if (checked < 0)
        demo_say("== windows: the output files could not be read: %s\n", stash_strerror(checked));
    else
        demo_say(
            "== windows: %llu (per word and ten minutes of event time) expected from a replay of "
            "the stream; %llu missing, %llu emitted twice, %llu with a wrong count%s\n",
            (unsigned long long)windows, (unsigned long long)missing, (unsigned long long)twice,
            (unsigned long long)wrong, missing + twice + wrong ? "" : ": each exactly once");
    bool ok = rc == 0 && s.bad == 0 && s.finished == WORKERS && checked == 0 &&
              missing + twice + wrong == 0;
    stash_arena_destroy(demo_name, NULL);
    demo_say(
        "== %s; recoveries took %.1f ms (worker rolled back), %.1f ms (service reattached) and "
        "%.1f ms (arena restored); arena %s removed, the checkpoints and windows stay in %s "
        "(stash snapshot ls %s)\n",
        ok ? "every count and window exactly right" : "FAILED", s.rollback_ms, reattach_ms,
        restore_ms, demo_name, demo_dir, demo_dir);
    return ok ? 0 : 1;
}
