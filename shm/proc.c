/* SPDX-License-Identifier: MIT */
/*
 * proc.c: telling a live process from a dead one. A pid alone is not enough
 * (pids are reused), so a process is named by its pid and its start time
 * from /proc/PID/stat; a zombie counts as dead.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shm/shm.h"

uint64_t shm_proc_start_time(int32_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    /* The command name may hold spaces and parentheses: fields start after the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ') return 0;
    p += 2;
    if (*p == 'Z' || *p == 'X') return 0;
    /* p is field 3 (state); the start time is field 22. */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p) return 0;
        p++;
    }
    return strtoull(p, NULL, 10);
}

bool shm_proc_alive(int32_t pid, uint64_t start)
{
    if (pid <= 0) return false;
    if (kill(pid, 0) < 0 && errno == ESRCH) return false;
    uint64_t now = shm_proc_start_time(pid);
    return now != 0 && now == start;
}

uint64_t shm_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t shm_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
