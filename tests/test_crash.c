/* SPDX-License-Identifier: MIT */
/*
 * test_crash.c: processes killed with SIGKILL inside the arena's locks and
 * in the middle of allocations. The others go on, the structure stays
 * consistent, and a new owner's accounting agrees with what the heaps hold.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/helpers.h"

typedef struct crash_args {
    const char *name;
    int ready[2]; /* the child writes a byte when it holds the lock */
} crash_args;

static int hold_pool_lock(void *arg)
{
    crash_args *c = arg;
    stash_arena *a;
    if (stash_arena_open(c->name, NULL, &a)) return 1;
    shm_lock_acquire(&a->hdr->pool_lock, shm_pool_rebuild, a);
    if (write(c->ready[1], "x", 1) != 1) return 2;
    pause();
    return 0;
}

static void kill_while_holding(const char *name, int (*fn)(void *))
{
    crash_args c = {.name = name};
    cr_assert_eq(pipe(c.ready), 0);
    pid_t pid = test_fork(fn, &c);
    char b;
    cr_assert_eq(read(c.ready[0], &b, 1), 1, "the child took the lock");
    kill(pid, SIGKILL);
    cr_assert_eq(test_wait(pid), 128 + SIGKILL);
    close(c.ready[0]);
    close(c.ready[1]);
}

Test(crash, a_holder_of_the_pool_lock_killed)
{
    char name[96];
    stash_arena *a = test_arena_create("poollock", 8u << 20, 4, name);
    shm_off off;
    cr_assert_eq(shm_alloc(a, 0, 100000, &off), 0);
    kill_while_holding(name, hold_pool_lock);
    shm_off more;
    cr_assert_eq(shm_alloc(a, 1, 200000, &more), 0, "the pool lock is repaired: %s",
                 stash_errmsg());
    shm_free(a, off);
    shm_free(a, more);
    cr_assert_eq(shm_check(a), 0, "%s", stash_errmsg());
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

static int hold_registry_lock(void *arg)
{
    crash_args *c = arg;
    stash_arena *a;
    if (stash_arena_open(c->name, NULL, &a)) return 1;
    shm_lock_acquire(&a->hdr->registry_lock, NULL, NULL);
    if (write(c->ready[1], "x", 1) != 1) return 2;
    pause();
    return 0;
}

Test(crash, a_holder_of_the_registry_lock_killed)
{
    char name[96];
    stash_arena *a = test_arena_create("reglock", 4u << 20, 8, name);
    kill_while_holding(name, hold_registry_lock);
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 2},
            &w),
        0, "%s", stash_errmsg());
    stash_worker_close(w);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(crash, a_live_holder_of_a_lock_that_never_lets_go_is_named, .timeout = 120)
{
    char name[96], pid_text[32];
    stash_arena *a = test_arena_create("stucklock", 4u << 20, 8, name);
    crash_args c = {.name = name};
    cr_assert_eq(pipe(c.ready), 0);
    pid_t pid = test_fork(hold_registry_lock, &c);
    char b;
    cr_assert_eq(read(c.ready[0], &b, 1), 1, "the child took the lock");
    /* Alive, holding the lock, and never letting go. */
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 2},
            &w),
        -ETIMEDOUT);
    snprintf(pid_text, sizeof pid_text, "process %d", (int)pid);
    cr_assert(strstr(stash_errmsg(), pid_text), "%s", stash_errmsg());
    /* Once it is gone, the lock is taken over. */
    kill(pid, SIGKILL);
    cr_assert_eq(test_wait(pid), 128 + SIGKILL);
    cr_assert_eq(
        stash_worker_open(
            name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 2},
            &w),
        0, "%s", stash_errmsg());
    stash_worker_close(w);
    close(c.ready[0]);
    close(c.ready[1]);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

/* Allocates and frees forever, many of them large (through the pool lock). */
static int churn_forever(void *arg)
{
    crash_args *c = arg;
    stash_worker *w;
    if (stash_worker_open(
            c->name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 1},
            &w))
        return 1;
    stash_arena *a = stash_worker_arena(w);
    if (write(c->ready[1], "x", 1) != 1) return 2;
    static shm_off live[512];
    uint64_t x = (uint64_t)getpid() * 2654435761u + 1;
    for (;;) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t slot = x % 512;
        if (live[slot]) {
            shm_free(a, live[slot]);
            live[slot] = 0;
        } else {
            size_t size = x % 8 == 0 ? 40000 + (x >> 32) % 60000 : 16 + (x >> 32) % 3000;
            if (shm_alloc(a, (uint32_t)(x >> 16) % 16, size, &live[slot])) live[slot] = 0;
        }
    }
    return 0;
}

Test(crash, owners_killed_at_random_moments_leave_a_consistent_arena, .timeout = 300)
{
    char name[96];
    stash_arena *a = test_arena_create("randkill", 256u << 20, 16, name);
    srand(test_seed("owners_killed_at_random_moments_leave_a_consistent_arena"));
    crash_args c = {.name = name};
    cr_assert_eq(pipe(c.ready), 0);
    for (int round = 0; round < 40; round++) {
        pid_t pid = test_kill_running(churn_forever, &c, c.ready[0], 0, 20000);
        /* A replacement takes the dead owner's key groups over and recovers them. */
        stash_worker *w;
        cr_assert_eq(
            stash_worker_open(
                name,
                &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 1},
                &w),
            0, "round %d: %s", round, stash_errmsg());
        stash_worker_info info;
        stash_worker_info_get(w, &info);
        cr_assert_eq(info.previous_pid, pid, "the slot was taken over from the dead worker");
        cr_assert_eq(shm_check(a), 0, "round %d: %s", round, stash_errmsg());
        shm_off off;
        cr_assert_eq(shm_alloc(a, 0, 1000, &off), 0);
        shm_free(a, off);
        stash_worker_close(w);
    }
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}
