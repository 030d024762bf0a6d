/* SPDX-License-Identifier: MIT */
/*
 * clockstep.c: a library loaded with LD_PRELOAD into the processes of one
 * host of the crash campaign across hosts: it adds to the wall clock
 * (CLOCK_REALTIME and its kin, gettimeofday, time) the signed nanoseconds
 * the file STASH_TEST_CLOCK_FILE holds, read on every call from a shared
 * mapping, so that the campaign steps that host's clock as NTP would while
 * it runs. The monotonic clocks are left as they are.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef int clock_fn(clockid_t, struct timespec *);

static clock_fn *_Atomic real_clock;
static _Atomic int64_t *offset; /* NULL: no file, no step */

/* Other libraries' constructors may read the clock before this one runs. */
static clock_fn *real(void)
{
    clock_fn *f = atomic_load_explicit(&real_clock, memory_order_relaxed);
    if (!f) {
        f = (clock_fn *)dlsym(RTLD_NEXT, "clock_gettime");
        atomic_store_explicit(&real_clock, f, memory_order_relaxed);
    }
    return f;
}

__attribute__((constructor)) static void clockstep_init(void)
{
    const char *path = getenv("STASH_TEST_CLOCK_FILE");
    int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd < 0) return;
    void *p = mmap(NULL, sizeof *offset, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED) offset = p;
}

static void step(struct timespec *ts)
{
    int64_t ns = offset ? atomic_load_explicit(offset, memory_order_relaxed) : 0;
    int64_t t = (int64_t)ts->tv_sec * 1000000000ll + ts->tv_nsec + ns;
    ts->tv_sec = t / 1000000000ll;
    ts->tv_nsec = t % 1000000000ll;
    if (ts->tv_nsec < 0) {
        ts->tv_sec--;
        ts->tv_nsec += 1000000000ll;
    }
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
    int rc = real()(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI))
        step(ts);
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) *tv = (struct timeval){ts.tv_sec, ts.tv_nsec / 1000};
    return rc;
}

time_t time(time_t *out)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
