/* SPDX-License-Identifier: MIT */
/*
 * demo_workers.c: the demonstrations' workers (demo.h): each a process that
 * joins an arena as index i of 3 (rolling back first if asked), resumes at
 * the offset its operator state holds, counts the words of a generated
 * stream in batches of 32 events (a ValueState count and a MapState of
 * counts per stretch of the stream, per word) with their event-time
 * windows (demo_windows.c), and once done checks every count against a
 * replay of the stream; and the story's report pipe they write to.
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
#include "tools/machines.h"
#include "tools/demo_windows.h"

/* The demo's directory, made new by the story. */
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
                               &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                    .index = index,
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
    if ((rc = stash_state_get(j.w,
                              &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                  .name = "count",
                                                  .kind = STASH_VALUE},
                              &j.count)) < 0 ||
        (rc = stash_state_get(j.w,
                              &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                  .name = "stretches",
                                                  .kind = STASH_MAP},
                              &j.stretches)) < 0 ||
        (rc = stash_state_get(j.w,
                              &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                  .name = "offsets",
                                                  .kind = STASH_OP_LIST},
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
    stash_batch_opts bo = {
        .sz = sizeof(stash_batch_opts), .capacity = BATCH, .states = fetched, .nstates = 2};
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

pid_t demo_start_worker(const char *arena, uint32_t index, bool rollback, int fd, pid_t machine)
{
    fflush(NULL);
    pid_t pid = machines_fork_bound();
    if (pid == 0) {
        if (machine > 0 && machines_enter(machine) < 0)
            _exit(fail(fd, index, "enter its machine", -errno));
        _exit(worker_main(arena, index, rollback, fd));
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

void demo_kill_wait(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}
