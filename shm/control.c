/* SPDX-License-Identifier: MIT */
/*
 * control.c: the control block, where the persistence engine, the workers
 * and the control commands meet without sockets. Words they wait on are
 * futexes in the shared mapping; operator-state blobs are runs of spans the
 * control block owns instead of a key group.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shm/shm.h"

void shm_control_init(stash_arena *a)
{
    shm_lock_init(&a->control->lock);
}

int shm_futex_wait(_Atomic uint32_t *word, uint32_t seen, uint64_t timeout_ns)
{
    struct timespec ts = {(time_t)(timeout_ns / 1000000000u), (long)(timeout_ns % 1000000000u)};
    long rc =
        syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, timeout_ns ? &ts : NULL, NULL, 0);
    return rc < 0 && errno == ETIMEDOUT ? -ETIMEDOUT : 0;
}

void shm_futex_wake_as_is(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void shm_futex_wake(_Atomic uint32_t *word)
{
    atomic_fetch_add(word, 1);
    shm_futex_wake_as_is(word);
}

bool shm_service_alive(const stash_arena *a, int32_t *pid)
{
    const shm_control *c = a->control;
    int32_t p = atomic_load(&c->service_pid);
    if (p == 0 || !shm_proc_alive(p, atomic_load(&c->service_start))) return false;
    if (pid) *pid = p;
    return true;
}

int shm_blob_put(stash_arena *a, const void *data, size_t len, shm_off *off)
{
    uint64_t first, n = (len + SHM_SPAN_SIZE - 1) >> SHM_SPAN_SHIFT;
    int rc = shm_pool_take(a, n ? n : 1, SHM_OP_CONTROL_KG, SHM_CLASS_LARGE, &first);
    if (rc < 0) return shm_fail(rc, "%s: no room for %zu bytes of operator state", a->path, len);
    *off = shm_span_off(a, first);
    memcpy(a->base + *off, data, len);
    return 0;
}

void shm_blob_free(stash_arena *a, shm_off off)
{
    if (off) shm_pool_give(a, shm_span_index(a, off));
}
