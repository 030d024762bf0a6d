/* SPDX-License-Identifier: MIT */
/*
 * c_worker.c: the C worker of the Python suite's mixed job: worker INDEX of
 * PARALLELISM on arena NAME adds 1 to the value state "count" of each key
 * 0 .. KEYS-1 in its key groups, ROUNDS times, with a barrier every 100
 * events, then waits at barriers until a checkpoint completes after its
 * last write, and leaves. Prints "ready" once it has written its first
 * round. Usage: c_worker NAME INDEX PARALLELISM KEYS ROUNDS
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stash.h"

static bool written;
static uint64_t cut_after; /* the first checkpoint cut after the last write */

static int on_cut(stash_worker *w, uint64_t id, void *ctx)
{
    (void)w, (void)ctx;
    if (written && !cut_after) cut_after = id;
    return 0;
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "c_worker: %s: %s (%s)\n", what, stash_strerror(rc), stash_errmsg());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: c_worker NAME INDEX PARALLELISM KEYS ROUNDS\n");
        return 2;
    }
    uint32_t index = (uint32_t)atoi(argv[2]), p = (uint32_t)atoi(argv[3]);
    uint64_t keys = strtoull(argv[4], NULL, 10), rounds = strtoull(argv[5], NULL, 10);
    stash_worker *w;
    int rc = stash_worker_open(
        argv[1],
        &(stash_worker_opts){
            .sz = sizeof(stash_worker_opts), .index = index, .parallelism = p, .on_cut = on_cut},
        &w);
    if (rc) return fail("open", rc);
    stash_state *count;
    rc = stash_state_get(
        w,
        &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "count", .kind = STASH_VALUE},
        &count);
    if (rc) return fail("state", rc);
    stash_arena_info info;
    stash_arena_info_get(stash_worker_arena(w), &info);
    stash_kg_range mine;
    stash_kg_range_of(info.max_parallelism, p, index, &mine);
    stash_event ev;
    uint64_t n = 0;
    for (uint64_t r = 0; r < rounds; r++) {
        for (uint64_t k = 0; k < keys; k++) {
            if (!stash_kg_range_contains(mine, stash_key_group(&k, sizeof k, info.max_parallelism)))
                continue;
            stash_key_set(w, &k, sizeof k);
            stash_bytes b;
            uint64_t c = 0;
            if (stash_value_get(count, &b) == 0) memcpy(&c, b.data, sizeof c);
            c++;
            if ((rc = stash_value_put(count, &c, sizeof c)) != 0) return fail("put", rc);
            if (++n % 100 == 0 && (rc = stash_barrier(w, &ev)) < 0) return fail("barrier", rc);
        }
        if (r == 0) {
            printf("ready\n");
            fflush(stdout);
        }
    }
    /* Written: on until a checkpoint cut after the last write completes. */
    written = true;
    for (;;) {
        rc = stash_barrier(w, &ev);
        if (rc < 0) return fail("barrier", rc);
        if (rc == 1 && ev.kind == STASH_CHECKPOINT_COMPLETE && cut_after &&
            ev.checkpoint_id >= cut_after)
            break;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    stash_worker_close(w);
    printf("done\n");
    return 0;
}
