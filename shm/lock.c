/*
 * lock.c: process-shared robust mutexes. A holder killed inside the lock
 * hands the next taker EOWNERDEAD; the taker repairs the structure the lock
 * guards and marks the mutex consistent. These locks guard slow paths only
 * (span refills, registry joins): the data path takes none.
 */
#include <errno.h>

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

int shm_lock_acquire(shm_lock *lock, shm_repair_fn *repair, void *arg)
{
    int rc = pthread_mutex_lock(&lock->mutex);
    if (rc == 0) return 0;
    if (rc != EOWNERDEAD) return -rc;
    if (repair) repair(arg);
    rc = pthread_mutex_consistent(&lock->mutex);
    return rc ? -rc : 1;
}

void shm_lock_release(shm_lock *lock)
{
    pthread_mutex_unlock(&lock->mutex);
}
