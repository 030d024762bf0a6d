/* SPDX-License-Identifier: MIT */
/*
 * arena.c: `stash bench arena`: allocate+free pairs per second in the
 * arena's key-group heaps, in one process and in two, beside glibc malloc
 * running the same pre-generated sequence in the same invocation.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/state/state.h"
#include "tools/bench/bench.h"

#define WINDOW 4096u /* live blocks: each pair frees the oldest and allocates anew */

typedef struct op_seq {
    uint32_t *size;
    uint32_t *kg; /* index into the worker's key-group range */
    uint64_t n;
} op_seq;

/* Sizes 16 .. 512 bytes, skewed small like serialized state records. */
static op_seq make_seq(uint64_t n, uint64_t seed)
{
    op_seq s = {malloc(n * sizeof(uint32_t)), malloc(n * sizeof(uint32_t)), n};
    if (!s.size || !s.kg) {
        free(s.size);
        free(s.kg);
        return (op_seq){0};
    }
    uint64_t x = seed | 1;
    for (uint64_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t r = (uint32_t)(x >> 32);
        s.size[i] = 16 + (r % 4 == 0 ? r % 497 : r % 113);
        s.kg[i] = (uint32_t)x;
    }
    return s;
}

typedef struct shared_clock {
    _Atomic int ready;
    _Atomic int go;
    uint64_t start_ns[2], end_ns[2];
    int failed;
} shared_clock;

static int run_stash(const char *name, uint32_t index, uint32_t p, const op_seq *s, uint64_t *ns)
{
    stash_worker *w;
    int rc = stash_worker_open(
        name,
        &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = index, .parallelism = p},
        &w);
    if (rc < 0) return rc;
    stash_arena *a = stash_worker_arena(w);
    stash_worker_info info;
    stash_worker_info_get(w, &info);
    uint32_t nkg = info.range.last - info.range.first + 1;
    shm_off ring[WINDOW] = {0};
    for (uint32_t i = 0; i < WINDOW && rc == 0; i++)
        rc = shm_alloc(a, info.range.first + i % nkg, 64, &ring[i]);
    uint64_t t0 = 0;
    /* The first pass is the warm-up; the second is timed. */
    for (int pass = 0; pass < 2; pass++) {
        t0 = bench_now_ns();
        for (uint64_t i = 0; i < s->n && rc == 0; i++) {
            uint32_t slot = i % WINDOW;
            shm_free(a, ring[slot]);
            rc = shm_alloc(a, info.range.first + s->kg[i] % nkg, s->size[i], &ring[slot]);
        }
    }
    *ns = bench_now_ns() - t0;
    for (uint32_t i = 0; i < WINDOW; i++)
        if (ring[i]) shm_free(a, ring[i]);
    stash_worker_close(w);
    return rc;
}

static int run_malloc(const op_seq *s, uint64_t *ns)
{
    void *ring[WINDOW];
    for (uint32_t i = 0; i < WINDOW; i++) ring[i] = malloc(64);
    uint64_t t0 = 0;
    for (int pass = 0; pass < 2; pass++) {
        t0 = bench_now_ns();
        for (uint64_t i = 0; i < s->n; i++) {
            uint32_t slot = i % WINDOW;
            free(ring[slot]);
            ring[slot] = malloc(s->size[i]);
            if (!ring[slot]) return -ENOMEM;
        }
    }
    *ns = bench_now_ns() - t0;
    for (uint32_t i = 0; i < WINDOW; i++) free(ring[i]);
    return 0;
}

/* Runs p processes at once (stash when name is set, malloc otherwise) and
 * returns their pairs per second over the span from first start to last end. */
static double run_procs(const char *name, uint32_t p, const op_seq *seqs)
{
    shared_clock *clk =
        mmap(NULL, sizeof *clk, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (clk == MAP_FAILED) return -1;
    fflush(NULL);
    pid_t pids[2];
    for (uint32_t i = 0; i < p; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            atomic_fetch_add(&clk->ready, 1);
            while (!atomic_load(&clk->go)) {
            }
            uint64_t ns = 0;
            clk->start_ns[i] = bench_now_ns();
            int rc = name ? run_stash(name, i, p, &seqs[i], &ns) : run_malloc(&seqs[i], &ns);
            clk->end_ns[i] = clk->start_ns[i] + ns;
            _exit(rc < 0 ? 1 : 0);
        }
    }
    while (atomic_load(&clk->ready) < (int)p) {
    }
    atomic_store(&clk->go, 1);
    int bad = 0;
    for (uint32_t i = 0; i < p; i++) {
        int st;
        waitpid(pids[i], &st, 0);
        bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    uint64_t start = clk->start_ns[0], end = clk->end_ns[0];
    for (uint32_t i = 1; i < p; i++) {
        if (clk->start_ns[i] < start) start = clk->start_ns[i];
        if (clk->end_ns[i] > end) end = clk->end_ns[i];
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < p; i++) total += seqs[i].n;
    munmap(clk, sizeof *clk);
    return bad ? -1 : (double)total / ((double)(end - start) / 1e9);
}

enum { STASH_1, MALLOC_1, STASH_2, MALLOC_2, NCASES };

int bench_arena(int argc, char **argv)
{
    static const char usage[] =
        "Allocate+free pairs per second in one arena (sizes 16..512 B, 4096 live blocks),\n"
        "one process and two, beside glibc malloc on the same sequence; the four run in\n"
        "a new order each repetition.\n";
    bench_opts o;
    int rc = bench_parse(argc, argv, usage, &o);
    static const char *const names[] = {"alloc-free/1proc", "alloc-free/2proc",
                                        "alloc-free/scaling"};
    if (rc == 0 && bench_heap_only(&o, "arena") < 0) rc = -1;
    if (rc == 0 && bench_check_case(&o, "arena", names, sizeof names / sizeof names[0]) < 0)
        rc = -1;
    if (rc) return rc < 0 ? 2 : 0;
    uint64_t n = o.quick ? 4000000 : 20000000;
    bench_header(&o, "arena", "%llu allocate+free pairs per process, 4096 live blocks",
                 (unsigned long long)n);
    op_seq seqs[2] = {make_seq(n, 1), make_seq(n, 2)};
    if (!seqs[0].size || !seqs[1].size) return tool_fail("bench arena", -ENOMEM);
    char name[64];
    snprintf(name, sizeof name, "bench-arena-%d", (int)getpid());
    stash_arena *a;
    rc = stash_arena_create(
        name, &(stash_arena_opts){.sz = sizeof(stash_arena_opts), .size = 256ull << 20}, &a);
    if (rc < 0) return tool_fail("bench arena", rc);
    stash_arena_close(a);

    double v[NCASES][1000];
    for (int r = 0; r < o.reps && rc == 0; r++) {
        bench_progress(&o, "arena: repetition %d of %d", r + 1, o.reps);
        int order[NCASES];
        bench_shuffle(order, NCASES, 1, r);
        for (int k = 0; k < NCASES; k++) {
            int c = order[k];
            v[c][r] = run_procs(c == STASH_1 || c == STASH_2 ? name : NULL,
                                c == STASH_2 || c == MALLOC_2 ? 2 : 1, seqs);
            if (v[c][r] < 0) rc = -EIO;
        }
    }
    stash_arena_destroy(name, NULL);
    free(seqs[0].size), free(seqs[0].kg), free(seqs[1].size), free(seqs[1].kg);
    if (rc < 0) return tool_fail("bench arena: a measuring process failed", rc);

    static const struct {
        const char *name, *system;
    } rows[NCASES] = {
        [STASH_1] = {"alloc-free/1proc", "stash"},
        [MALLOC_1] = {"alloc-free/1proc", "malloc"},
        [STASH_2] = {"alloc-free/2proc", "stash"},
        [MALLOC_2] = {"alloc-free/2proc", "malloc"},
    };
    for (int c = 0; c < NCASES; c++) {
        double sorted[1000];
        memcpy(sorted, v[c], (size_t)o.reps * sizeof *sorted);
        bench_result row = bench_spread(
            (bench_result){
                .bench = "arena", .name = rows[c].name, .system = rows[c].system, .unit = "ops/s"},
            sorted, o.reps);
        bench_report(&o, &row);
    }
    bench_report_ratio(&o, "arena", "alloc-free/1proc", "stash/malloc", v[STASH_1], v[MALLOC_1],
                       o.reps);
    bench_report_ratio(&o, "arena", "alloc-free/scaling", "stash-2p/1p", v[STASH_2], v[STASH_1],
                       o.reps);
    return 0;
}
