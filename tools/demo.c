/*
 * demo.c: `stash demo`: keyed state at work across processes. Three worker
 * processes count words of a generated stream in ValueState, each the words
 * of its own key groups; one is killed with SIGKILL in the middle; its
 * replacement takes the slot over, learns from the recovered counts how far
 * the dead worker got (each event adds exactly one to one count, and a crash
 * leaves every count either before or after its event), resumes there, and
 * every count ends exactly right. Then the counts are checkpointed to
 * ./stash-data, the arena is removed as a reboot would, and a new arena
 * restores them.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/ckpt.h"
#include "tools/tools.h"

#define DEMO_WORKERS 3u
#define DEMO_EVENTS 3000000u
#define DEMO_WORDS 50000u
#define DEMO_DIR "stash-data"

/* The word of event i: a deterministic stream every process can replay. */
static uint64_t word_of(uint64_t i)
{
    uint64_t x = i * 0x9e3779b97f4a7c15ull;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    return (x ^ (x >> 29)) % DEMO_WORDS;
}

static bool mine(stash_worker *w, uint64_t word)
{
    stash_key_set(w, &word, sizeof word);
    int kg = stash_key_group_current(w);
    return kg >= (int)w->range.first && kg <= (int)w->range.last;
}

/* Sums the counts in this worker's key groups: how many of its events are in. */
static int counted_so_far(stash_state *count, uint64_t *total)
{
    stash_iter it;
    stash_bytes key, v;
    int rc = stash_keys_iter(count, NULL, 0, &it);
    *total = 0;
    while (rc >= 0 && (rc = stash_iter_next(&it, &key, NULL)) == 1) {
        uint64_t word, n;
        memcpy(&word, key.data, sizeof word);
        stash_key_set(count->w, &word, sizeof word);
        if (stash_value_get(count, &v) == 0) {
            memcpy(&n, v.data, sizeof n);
            *total += n;
        }
    }
    return rc < 0 ? rc : 0;
}

/* Checks every count of this worker's words against a replay of the stream. */
static int verify_counts(stash_worker *w, stash_state *count, uint64_t *wrong)
{
    uint32_t *want = calloc(DEMO_WORDS, sizeof *want);
    if (!want) return -ENOMEM;
    for (uint64_t i = 0; i < DEMO_EVENTS; i++) want[word_of(i)]++;
    *wrong = 0;
    for (uint64_t word = 0; word < DEMO_WORDS; word++) {
        if (!mine(w, word)) continue;
        stash_bytes v;
        uint64_t n = 0;
        if (stash_value_get(count, &v) == 0) memcpy(&n, v.data, sizeof n);
        *wrong += n != want[word];
    }
    free(want);
    return 0;
}

static int report(int fd, const char *fmt, uint32_t index, int rc)
{
    dprintf(fd, fmt, index, stash_strerror(rc), stash_errmsg());
    return 1;
}

/* A worker: joins, resumes after the events its key groups already count,
 * counts the rest, and reports one line. */
static int worker_main(const char *name, uint32_t index, int report_fd)
{
    stash_worker *w;
    stash_state *count;
    int rc = stash_worker_open(
        name, &(stash_worker_opts){.index = index, .parallelism = DEMO_WORKERS}, &w);
    if (rc < 0) return report(report_fd, "  worker %u FAILED to join: %s (%s)\n", index, rc);
    rc = stash_state_get(w, &(stash_state_desc){.name = "count", .kind = STASH_VALUE}, &count);
    uint64_t done = 0, seen = 0;
    if (rc == 0) rc = counted_so_far(count, &done);
    if (rc < 0) return report(report_fd, "  worker %u FAILED to read: %s (%s)\n", index, rc);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (uint64_t i = 0; i < DEMO_EVENTS; i++) {
        uint64_t word = word_of(i);
        if (!mine(w, word) || seen++ < done) continue;
        stash_bytes v;
        uint64_t n = 0;
        if (stash_value_get(count, &v) == 0) memcpy(&n, v.data, sizeof n);
        n++;
        if ((rc = stash_value_put(count, &n, sizeof n)) < 0)
            return report(report_fd, "  worker %u FAILED to write: %s (%s)\n", index, rc);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    uint64_t wrong;
    if ((rc = verify_counts(w, count, &wrong)) < 0)
        return report(report_fd, "  worker %u FAILED to verify: %s (%s)\n", index, rc);
    stash_worker_info info;
    stash_worker_info_get(w, &info);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    dprintf(report_fd,
            "  worker %u (pid %d, key groups %u..%u)%s: resumed after %llu events, counted %llu "
            "more in %.2f s; counts %s\n",
            index, (int)getpid(), info.range.first, info.range.last,
            info.previous_pid ? " took over a dead worker's slot" : "", (unsigned long long)done,
            (unsigned long long)(seen - done), secs, wrong ? "WRONG" : "exactly right");
    stash_worker_close(w);
    return wrong ? 1 : 0;
}

static pid_t start_worker(const char *name, uint32_t index, int report_fd)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(worker_main(name, index, report_fd));
    return pid;
}

/* Copies report lines from the pipe to stdout until count arrived; returns
 * how many said something went wrong. */
static int relay_reports(int fd, unsigned count)
{
    char line[512];
    size_t len = 0;
    int bad = 0;
    while (count > 0 && read(fd, &line[len], 1) == 1) {
        if (line[len] != '\n' && len < sizeof line - 2) {
            len++;
            continue;
        }
        line[len + 1] = '\0';
        fputs(line, stdout);
        bad += strstr(line, "FAILED") != NULL || strstr(line, "WRONG") != NULL;
        len = 0;
        count--;
    }
    fflush(stdout);
    return bad;
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

/* Joins as the only worker, pins every key group and writes a checkpoint. */
static int take_checkpoint(const char *name, ioe_engine *e)
{
    stash_worker *w;
    int rc = stash_worker_open(name, &(stash_worker_opts){.parallelism = 1}, &w);
    if (rc < 0) return tool_fail("demo: join", rc);
    stash_arena *a = stash_worker_arena(w);
    uint32_t maxp = a->hdr->max_parallelism, *pins = calloc(maxp, sizeof *pins);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (uint32_t kg = 0; pins && kg < maxp; kg++) pins[kg] = (uint32_t)shm_table_pin(a, kg);
    double pause_us = seconds_since(&t0) * 1e6;
    ckpt_written out = {0};
    rc = pins ? ckpt_write(a, pins,
                           &(ckpt_opts){.dir = DEMO_DIR, .id = 1, .lz4 = true, .engine = e}, &out)
              : -ENOMEM;
    for (uint32_t kg = 0; pins && kg < maxp; kg++) shm_table_unpin(a, kg, pins[kg]);
    free(pins);
    stash_worker_close(w);
    if (rc < 0) return tool_fail("demo: checkpoint", rc);
    printf("  checkpoint 1: %llu records, %llu bytes (LZ4) in %.1f ms; pinning every key group "
           "took %.1f us\n",
           (unsigned long long)out.records, (unsigned long long)out.data_bytes,
           seconds_since(&t0) * 1e3, pause_us);
    return 0;
}

/* Checkpoints the counts to DEMO_DIR, removes the arena as a reboot would,
 * restores into a new one, and checks every count. */
static int checkpoint_and_restore(const char *name)
{
    ioe_engine *e;
    int rc = ioe_engine_open(&(ioe_opts){0}, &e);
    if (rc < 0) return tool_fail("demo: I/O engine", rc);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", DEMO_DIR);
    if (system(cmd) != 0) return tool_fail("demo: clean " DEMO_DIR, -EIO);
    printf("== a checkpoint of every key group to %s\n", DEMO_DIR);
    rc = take_checkpoint(name, e);
    printf("== the arena is removed, as a reboot would\n");
    stash_arena_destroy(name, NULL);
    stash_arena *a;
    if (rc == 0)
        rc = stash_arena_create(name, &(stash_arena_opts){.size = 256u << 20}, &a) < 0
                 ? tool_fail("demo: create", -EIO)
                 : 0;
    stash_worker *w = NULL;
    stash_state *count;
    struct timespec t0;
    ckpt_restored out;
    uint64_t wrong = 0;
    if (rc == 0) {
        stash_arena_close(a);
        printf("== a new arena restores the newest complete checkpoint\n");
        clock_gettime(CLOCK_MONOTONIC, &t0);
        rc = stash_worker_open(name, &(stash_worker_opts){.parallelism = 1}, &w);
        if (rc == 0)
            rc = ckpt_restore(stash_worker_arena(w), DEMO_DIR, 0,
                              (stash_kg_range){0, stash_worker_arena(w)->hdr->max_parallelism - 1},
                              e, &out);
        if (rc == 0)
            rc = stash_state_get(w, &(stash_state_desc){.name = "count", .kind = STASH_VALUE},
                                 &count);
        if (rc == 0) rc = verify_counts(w, count, &wrong);
        if (rc < 0) tool_fail("demo: restore", rc);
    }
    if (rc == 0)
        printf("  restored checkpoint %llu: %llu records in %.1f ms; counts %s\n",
               (unsigned long long)out.id, (unsigned long long)out.records,
               seconds_since(&t0) * 1e3, wrong ? "WRONG" : "exactly right");
    stash_worker_close(w);
    stash_arena_destroy(name, NULL);
    ioe_engine_close(e);
    printf("== destroyed the arena '%s'; the checkpoint stays in %s (stash snapshot info %s)\n",
           name, DEMO_DIR, DEMO_DIR);
    return rc < 0 || wrong;
}

static void show_registry(const char *name)
{
    char *argv[] = {"status", (char *)name, NULL};
    tool_status(2, argv);
}

int tool_demo(int argc, char **argv)
{
    if (tool_wants_help(argc, argv)) {
        printf("usage: stash demo\nRuns the demonstration: %u worker processes count words in "
               "keyed state;\none is killed with SIGKILL and replaced; every count ends exact; the "
               "counts are\ncheckpointed to ./%s, the arena removed, and a new one restored.\n",
               DEMO_WORKERS, DEMO_DIR);
        return 0;
    }
    const char *name = "demo";
    stash_arena *a;
    int rc = stash_arena_create(
        name, &(stash_arena_opts){.size = 256u << 20, .flags = STASH_ARENA_REPLACE}, &a);
    if (rc < 0) return tool_fail("demo: create", rc);
    printf("== created the arena '%s' (/dev/shm/stash.%s)\n", name, name);
    int reports[2];
    if (pipe(reports) < 0) return tool_fail("demo", -errno);

    printf("== %u workers count %u events over %u words in ValueState\n", DEMO_WORKERS, DEMO_EVENTS,
           DEMO_WORDS);
    pid_t pids[DEMO_WORKERS];
    for (uint32_t i = 0; i < DEMO_WORKERS; i++) pids[i] = start_worker(name, i, reports[1]);
    usleep(120000);
    show_registry(name);
    printf("== killing worker 1 (pid %d) with SIGKILL in the middle of its stream\n", (int)pids[1]);
    kill(pids[1], SIGKILL);
    waitpid(pids[1], NULL, 0);
    show_registry(name);

    printf("== a replacement joins as worker 1 and resumes from the recovered counts\n");
    pids[1] = start_worker(name, 1, reports[1]);
    int bad = relay_reports(reports[0], DEMO_WORKERS);
    for (uint32_t i = 0; i < DEMO_WORKERS; i++) waitpid(pids[i], NULL, 0);
    show_registry(name);
    rc = shm_check(a);
    printf("== consistency check of the arena: %s%s\n", rc ? "FAILED: " : "every invariant holds",
           rc ? stash_errmsg() : "");
    stash_arena_close(a);
    if (rc || bad) return 1;
    return checkpoint_and_restore(name) ? 1 : 0;
}
