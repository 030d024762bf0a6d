/* SPDX-License-Identifier: MIT */
/*
 * hello.c: the smallest program against an installed libstash: creates an
 * arena, joins it as worker 0 of 2, prints its key-group range, and cleans up.
 * Build: cc hello.c $(pkg-config --cflags --libs stash)
 */
#include <stdio.h>
#include <unistd.h>

#include <stash.h>

int main(void)
{
    char name[64];
    snprintf(name, sizeof name, "hello-%d", (int)getpid());
    stash_arena *arena;
    int rc = stash_arena_create(
        name, &(stash_arena_opts){.sz = sizeof(stash_arena_opts), .size = 8u << 20}, &arena);
    if (rc < 0) {
        fprintf(stderr, "%s: %s (%s)\n", name, stash_strerror(rc), stash_errmsg());
        return 1;
    }
    stash_worker *w;
    rc = stash_worker_open(
        name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 2},
        &w);
    if (rc == 0) {
        stash_worker_info info;
        stash_worker_info_get(w, &info);
        printf("worker 0 of 2 owns key groups %u..%u\n", info.range.first, info.range.last);
        stash_worker_close(w);
    } else {
        fprintf(stderr, "%s: %s (%s)\n", name, stash_strerror(rc), stash_errmsg());
    }
    stash_arena_close(arena);
    stash_arena_destroy(name, NULL);
    return rc < 0;
}
