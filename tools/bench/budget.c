/* SPDX-License-Identifier: MIT */
/*
 * budget.c: a memory budget for the bench (--memory-budget): the process
 * runs in a memory cgroup of its own (cgroup v2, or v1's memory controller
 * where a machine mounts that), without a limit while it loads its data,
 * then limited, which makes the kernel reclaim the data's cached pages
 * down to the budget: the passes that follow read state larger than their
 * memory from the disk, as a job whose state outgrows its machine does.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools/bench/bench.h"

#define BUDGET_SLACK (96ull << 20) /* the bench's allocations after the limit */

/* The two layouts of memory cgroups. */
typedef struct cg_layout {
    const char *root;   /* where the tree is mounted */
    const char *marker; /* a file only that tree's root has */
    const char *line;   /* what /proc/self/cgroup's line for it holds before the path */
    const char *limit;  /* the file that caps memory */
    const char *anon;   /* memory.stat's anonymous memory */
    const char *evict;  /* the file that reclaims on demand, and what to write */
    const char *evict_all;
} cg_layout;

static const cg_layout layouts[] = {
    {"/sys/fs/cgroup", "cgroup.controllers", "0::", "memory.max", "anon", "memory.reclaim", "1T"},
    {"/sys/fs/cgroup/memory", "memory.limit_in_bytes", ":memory:", "memory.limit_in_bytes", "rss",
     "memory.force_empty", "0"},
};

static int write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    ssize_t n = write(fd, text, strlen(text));
    int rc = n == (ssize_t)strlen(text) ? 0 : n < 0 ? -errno : -EIO;
    close(fd);
    return rc;
}

/* The cgroup of layout l the process is in now, as a path. */
static int current_group(const cg_layout *l, char *out, size_t cap)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return -errno;
    char line[512];
    int rc = -ENOENT;
    while (fgets(line, sizeof line, f)) {
        /* v2: "0::/path"; v1: "N:memory:/path" */
        char *path = strstr(line, l->line);
        if (!path || (l->line[0] == '0' && path != line)) continue;
        path += strlen(l->line);
        path[strcspn(path, "\n")] = 0;
        rc = (size_t)snprintf(out, cap, "%s%.400s", l->root, path) < cap ? 0 : -ENAMETOOLONG;
    }
    fclose(f);
    return rc;
}

int bench_budget_enter(bench_budget *b, char *why, size_t whylen)
{
    const cg_layout *l = NULL;
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0] && !l; i++) {
        char marker[128];
        snprintf(marker, sizeof marker, "%s/%s", layouts[i].root, layouts[i].marker);
        if (access(marker, F_OK) == 0) l = &layouts[i];
    }
    if (!l) return snprintf(why, whylen, "no memory cgroup controller is mounted"), -ENOENT;
    b->layout = (int)(l - layouts);
    int rc = current_group(l, b->home, sizeof b->home);
    if (rc < 0) return snprintf(why, whylen, "/proc/self/cgroup names no memory cgroup"), rc;
    snprintf(b->group, sizeof b->group, "%s/stash-bench-%d", l->root, (int)getpid());
    if (mkdir(b->group, 0755) < 0) {
        rc = -errno;
        snprintf(why, whylen, "cannot make the memory cgroup %s: %s", b->group, strerror(-rc));
        b->group[0] = 0;
        return rc;
    }
    char procs[600], pid[32];
    snprintf(procs, sizeof procs, "%s/cgroup.procs", b->group);
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    rc = write_file(procs, pid);
    if (rc < 0) {
        snprintf(why, whylen, "cannot enter the memory cgroup %s: %s", b->group, strerror(-rc));
        rmdir(b->group);
        b->group[0] = 0;
    }
    return rc;
}

/* A counter of the cgroup's memory.stat, in bytes (0 if absent). */
static uint64_t stat_of(const bench_budget *b, const char *key)
{
    char path[600], name[64];
    snprintf(path, sizeof path, "%s/memory.stat", b->group);
    FILE *f = fopen(path, "r");
    unsigned long long v = 0, x;
    while (f && fscanf(f, "%63s %llu", name, &x) == 2)
        if (strcmp(name, key) == 0) v = x;
    if (f) fclose(f);
    return v;
}

/* Writes limit to the cgroup's limit file. */
static int set_limit(const bench_budget *b, uint64_t limit)
{
    char path[600], v[32];
    snprintf(path, sizeof path, "%s/%s", b->group, layouts[b->layout].limit);
    snprintf(v, sizeof v, "%llu", (unsigned long long)limit);
    return write_file(path, v);
}

int bench_budget_limit(bench_budget *b, uint64_t data_bytes, char *why, size_t whylen)
{
    /* What no reclaim can take without swap (the bench's own memory, the
     * arena in /dev/shm, and room for what the bench allocates later) is
     * held anyway: the data gets data_bytes beyond. */
    const cg_layout *l = &layouts[b->layout];
    b->held = stat_of(b, l->anon) + stat_of(b, "shmem") + BUDGET_SLACK;
    b->limit = b->held + data_bytes;
    int rc = set_limit(b, b->limit);
    if (rc < 0)
        snprintf(why, whylen, "cannot limit %s to %llu bytes: %s", b->group,
                 (unsigned long long)b->limit, strerror(-rc));
    return rc;
}

void bench_budget_evict(const bench_budget *b)
{
    if (!b->group[0] || !b->limit) return;
    /* Reclaims as much as it can: every cached page (what is held besides
     * needs swap to go). */
    char path[600];
    snprintf(path, sizeof path, "%s/%s", b->group, layouts[b->layout].evict);
    write_file(path, layouts[b->layout].evict_all);
}

void bench_budget_leave(bench_budget *b)
{
    if (!b->group[0]) return;
    char procs[600], pid[32];
    snprintf(procs, sizeof procs, "%s/cgroup.procs", b->home);
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    write_file(procs, pid);
    rmdir(b->group);
    b->group[0] = 0;
}
