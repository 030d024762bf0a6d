/*
 * demo.c: `stash demo`: the arena at work. Creates an arena, starts worker
 * processes that join as index i of p and fill their key groups, shows the
 * registry, kills one worker with SIGKILL, lets a replacement take its slot
 * over, checks the arena's consistency, and destroys it.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/backends.h"
#include "tools/tools.h"

#define DEMO_WORKERS 3u
#define DEMO_RECORDS 20000u

/* Every worker writes exactly one line to the report pipe, also on failure. */
static int report_failure(int report_fd, uint32_t index, const char *what, int rc)
{
    dprintf(report_fd, "  worker %u FAILED to %s: %s (%s)\n", index, what, stash_strerror(rc),
            stash_errmsg());
    return 1;
}

/* A worker: joins, allocates records across its key groups, reports, then
 * waits on its pipe until the demo tells it to leave (or kills it). */
static int worker_main(const char *name, uint32_t index, int report_fd, int wait_fd)
{
    stash_worker *w;
    int rc = stash_worker_open(
        name, &(stash_worker_opts){.index = index, .parallelism = DEMO_WORKERS}, &w);
    if (rc < 0) return report_failure(report_fd, index, "join", rc);
    stash_worker_info info;
    stash_worker_info_get(w, &info);
    uint32_t nkg = info.range.last - info.range.first + 1;
    for (uint32_t i = 0; i < DEMO_RECORDS && rc == 0; i++) {
        shm_off off;
        rc = shm_alloc(stash_worker_arena(w), info.range.first + i % nkg, 24 + i % 200, &off);
    }
    if (rc < 0) return report_failure(report_fd, index, "allocate", rc);
    char line[160];
    int n = snprintf(line, sizeof line,
                     "  worker %u (pid %d) joined: key groups %u..%u, %u records%s\n", index,
                     (int)getpid(), info.range.first, info.range.last, DEMO_RECORDS,
                     info.previous_pid ? " (took over a dead worker's slot)" : "");
    if (write(report_fd, line, (size_t)n) < 0) return 1;
    char c;
    while (read(wait_fd, &c, 1) < 0 && errno == EINTR) {
    }
    stash_worker_close(w);
    return 0;
}

typedef struct demo_worker {
    pid_t pid;
    int go_fd; /* a byte written to it tells the worker to leave */
} demo_worker;

static int start_worker(const char *name, uint32_t index, int report_fd, demo_worker *out)
{
    int go[2];
    if (pipe(go) < 0) return -errno;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -errno;
    if (pid == 0) {
        close(go[1]);
        _exit(worker_main(name, index, report_fd, go[0]));
    }
    close(go[0]);
    *out = (demo_worker){pid, go[1]};
    return 0;
}

/* Copies one report line per worker from the pipe to stdout; returns how
 * many workers failed. */
static int relay_reports(int fd, unsigned count)
{
    char line[256];
    size_t len = 0;
    int failed = 0;
    while (count > 0 && read(fd, &line[len], 1) == 1) {
        if (line[len] != '\n' && len < sizeof line - 2) {
            len++;
            continue;
        }
        line[len + 1] = '\0';
        fputs(line, stdout);
        failed += strstr(line, "FAILED") != NULL;
        len = 0;
        count--;
    }
    fflush(stdout);
    return failed;
}

static int show_registry(const char *name)
{
    char *argv[] = {"status", (char *)name, NULL};
    return tool_status(2, argv);
}

int tool_demo(int argc, char **argv)
{
    if (tool_wants_help(argc, argv)) {
        printf("usage: stash demo\nRuns the demonstration: an arena, %u worker processes, a "
               "worker killed\nwith SIGKILL and replaced, a consistency check.\n",
               DEMO_WORKERS);
        return 0;
    }
    const char *name = "demo";
    stash_arena *a;
    int rc = stash_arena_create(name, &(stash_arena_opts){.flags = STASH_ARENA_REPLACE}, &a);
    if (rc < 0) return tool_fail("demo: create", rc);
    printf("== created the arena '%s' (/dev/shm/stash.%s)\n", name, name);
    int reports[2];
    if (pipe(reports) < 0) return tool_fail("demo", -errno);

    printf("== starting %u worker processes\n", DEMO_WORKERS);
    demo_worker w[DEMO_WORKERS];
    for (uint32_t i = 0; i < DEMO_WORKERS; i++)
        if ((rc = start_worker(name, i, reports[1], &w[i])) < 0) return tool_fail("demo", rc);
    if (relay_reports(reports[0], DEMO_WORKERS)) return 1;
    show_registry(name);

    printf("== killing worker 1 (pid %d) with SIGKILL\n", (int)w[1].pid);
    kill(w[1].pid, SIGKILL);
    waitpid(w[1].pid, NULL, 0);
    close(w[1].go_fd);
    show_registry(name);

    printf("== a replacement joins as worker 1\n");
    if ((rc = start_worker(name, 1, reports[1], &w[1])) < 0) return tool_fail("demo", rc);
    if (relay_reports(reports[0], 1)) return 1;
    show_registry(name);

    printf("== the workers leave\n");
    for (uint32_t i = 0; i < DEMO_WORKERS; i++) {
        if (write(w[i].go_fd, "", 1) < 0) kill(w[i].pid, SIGTERM);
        waitpid(w[i].pid, NULL, 0);
        close(w[i].go_fd);
    }
    rc = shm_check(a);
    printf("== consistency check: %s%s\n", rc ? "FAILED: " : "every invariant holds",
           rc ? stash_errmsg() : "");
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    printf("== destroyed the arena '%s'\n", name);
    return rc ? 1 : 0;
}
