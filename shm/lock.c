/* SPDX-License-Identifier: MIT */
/*
 * lock.c: process-shared robust mutexes. A holder killed inside the lock
 * hands the next taker EOWNERDEAD; the taker repairs the structure the lock
 * guards and marks the mutex consistent. These locks guard slow paths only
 * (span refills, registry joins): the data path takes none. A holder that
 * lives but never lets go (stopped, or stuck) is not waited for forever:
 * after SHM_LOCK_TIMEOUT_S the taker gives up and names it.
 */
#define _GNU_SOURCE /* pthread_mutex_clocklock */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "shm/shm.h"

int shm_lock_init(shm_lock *lock)
{
    pthread_mutexattr_t attr;
    int rc = pthread_mutexattr_init(&attr);
    if (rc) return -rc;
    rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    if (!rc) rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    if (!rc) rc = pthread_mutex_init(&lock->mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    return -rc;
}

/* The process (and its name) of the thread tid, from /proc. */
static void holder_of(int tid, int *pid, char *name, size_t cap)
{
    char path[64], line[256];
    *pid = tid;
    snprintf(name, cap, "?");
    snprintf(path, sizeof path, "/proc/%d/status", tid);
    FILE *f = fopen(path, "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "Name:\t", 6) == 0) {
            line[strcspn(line, "\n")] = 0;
            snprintf(name, cap, "%.63s", line + 6);
        } else if (strncmp(line, "Tgid:\t", 6) == 0) {
            sscanf(line + 6, "%d", pid);
        }
    }
    fclose(f);
}

int shm_lock_acquire(shm_lock *lock, shm_repair_fn *repair, void *arg)
{
    /* On the monotonic clock: a step of the wall clock neither ends the
     * wait at once nor makes it longer. */
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += SHM_LOCK_TIMEOUT_S;
    int rc = pthread_mutex_clocklock(&lock->mutex, CLOCK_MONOTONIC, &until);
    if (rc == 0) return 0;
    if (rc == ETIMEDOUT) {
        int pid;
        char name[64];
        holder_of(lock->mutex.__data.__owner, &pid, name, sizeof name);
        return shm_fail(-ETIMEDOUT,
                        "a lock of the arena has been held for more than %u s by process %d "
                        "(%s), alive but not letting go: stop that process to go on",
                        SHM_LOCK_TIMEOUT_S, pid, name);
    }
    if (rc == EOWNERDEAD) {
        if (repair) repair(arg);
        rc = pthread_mutex_consistent(&lock->mutex);
        if (rc == 0) return 1;
    }
    return shm_fail(-rc, "%s", strerror(rc));
}

void shm_lock_release(shm_lock *lock)
{
    pthread_mutex_unlock(&lock->mutex);
}
