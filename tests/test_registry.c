/* SPDX-License-Identifier: MIT */
/*
 * test_registry.c: workers joining as index i of p: their key-group ranges,
 * the refusals (a live holder of the index, another parallelism), dead
 * workers detected and their slots taken over, a reused pid not mistaken for
 * the old process.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "tests/helpers.h"

static int open_worker(const char *name, uint32_t index, uint32_t p, stash_worker **w)
{
    return stash_worker_open(
        name,
        &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = index, .parallelism = p}, w);
}

Test(registry, workers_get_flinks_ranges_and_are_listed)
{
    char name[96];
    stash_arena *a = test_arena_create("reg", 4u << 20, 128, name);
    stash_worker *w[3];
    for (uint32_t i = 0; i < 3; i++) cr_assert_eq(open_worker(name, i, 3, &w[i]), 0);
    const stash_kg_range want[3] = {{0, 42}, {43, 85}, {86, 127}};
    for (uint32_t i = 0; i < 3; i++) {
        stash_worker_info info;
        stash_worker_info_get(w[i], &info);
        cr_assert_eq(info.index, i);
        cr_assert_eq(info.state, STASH_WORKER_LIVE);
        cr_assert_eq(info.pid, getpid());
        cr_assert_eq(info.range.first, want[i].first);
        cr_assert_eq(info.range.last, want[i].last);
    }
    stash_worker_info list[8];
    size_t n;
    cr_assert_eq(stash_registry_list(a, list, 8, &n), 0);
    cr_assert_eq(n, 3);
    stash_worker_close(w[1]);
    cr_assert_eq(stash_registry_list(a, list, 8, &n), 0);
    cr_assert_eq(n, 2, "a worker that leaves frees its slot");
    stash_worker_close(w[0]);
    stash_worker_close(w[2]);
    stash_worker_close(NULL);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(registry, a_live_holder_of_the_index_is_not_displaced)
{
    char name[96];
    stash_arena *a = test_arena_create("busy", 4u << 20, 0, name);
    stash_worker *w, *x = NULL;
    cr_assert_eq(open_worker(name, 1, 2, &w), 0);
    cr_assert_eq(open_worker(name, 1, 2, &x), STASH_EBUSY);
    cr_assert_null(x);
    cr_assert(strstr(stash_errmsg(), "index 1"), "%s", stash_errmsg());
    stash_worker_close(w);
    cr_assert_eq(open_worker(name, 1, 2, &x), 0, "free again once it left");
    stash_worker_close(x);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(registry, another_parallelism_is_refused_while_workers_live)
{
    char name[96];
    stash_arena *a = test_arena_create("par", 4u << 20, 0, name);
    stash_worker *w, *x;
    cr_assert_eq(open_worker(name, 0, 2, &w), 0);
    cr_assert_eq(open_worker(name, 1, 3, &x), STASH_EPARALLELISM);
    cr_assert(strstr(stash_errmsg(), "parallelism 2"), "%s", stash_errmsg());
    stash_worker_close(w);
    cr_assert_eq(open_worker(name, 1, 3, &x), 0, "a new parallelism once nobody runs the old");
    stash_worker_close(x);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(registry, bad_indices_are_refused)
{
    char name[96];
    stash_arena *a = test_arena_create("idx", 4u << 20, 16, name);
    stash_worker *w;
    cr_assert_eq(open_worker(name, 2, 2, &w), -EINVAL);
    cr_assert_eq(open_worker(name, 0, 17, &w), -EINVAL, "more workers than key groups");
    cr_assert_eq(stash_worker_open("no-such-arena-here", NULL, &w), -ENOENT);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

static int join_and_wait(void *arg)
{
    stash_worker *w;
    if (open_worker(arg, 0, 2, &w)) return 1;
    pause();
    return 0;
}

Test(registry, a_dead_workers_slot_is_detected_and_taken_over)
{
    char name[96];
    stash_arena *a = test_arena_create("dead", 4u << 20, 0, name);
    pid_t pid = test_fork(join_and_wait, name);
    stash_worker_info list[4];
    size_t n = 0;
    for (int i = 0; i < 5000 && n == 0; i++) {
        stash_registry_list(a, list, 4, &n);
        if (n == 0) usleep(1000);
    }
    cr_assert_eq(n, 1, "the child joined");
    cr_assert_eq(list[0].state, STASH_WORKER_LIVE);
    stash_worker *w;
    cr_assert_eq(open_worker(name, 0, 2, &w), STASH_EBUSY);

    kill(pid, SIGKILL);
    /* Not reaped yet: a zombie is dead too, as soon as the kill lands. */
    for (int i = 0; i < 5000; i++) {
        stash_registry_list(a, list, 4, &n);
        if (list[0].state == STASH_WORKER_DEAD) break;
        usleep(1000);
    }
    cr_assert_eq(list[0].state, STASH_WORKER_DEAD);
    cr_assert_eq(open_worker(name, 0, 2, &w), 0, "%s", stash_errmsg());
    stash_worker_info info;
    stash_worker_info_get(w, &info);
    cr_assert_eq(info.previous_pid, pid);
    cr_assert_eq(info.generation, 2);
    test_wait(pid);
    stash_worker_close(w);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(registry, a_reused_pid_is_not_the_old_process)
{
    char name[96];
    stash_arena *a = test_arena_create("reuse", 4u << 20, 0, name);
    stash_worker *w;
    cr_assert_eq(open_worker(name, 0, 1, &w), 0);
    /* Make the slot name this very pid with another start time: the process
     * that joined is gone even though its pid now belongs to someone. */
    a->slots[0].start_time += 1;
    stash_worker_info list[2];
    size_t n;
    stash_registry_list(a, list, 2, &n);
    cr_assert_eq(list[0].state, STASH_WORKER_DEAD);
    stash_worker *x;
    cr_assert_eq(open_worker(name, 0, 1, &x), 0, "the slot can be taken over");
    stash_worker_close(x);
    stash_worker_close(w);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}
