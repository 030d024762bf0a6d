/* SPDX-License-Identifier: MIT */
/*
 * main.c: stash-bench, the benchmark program: `stash bench NAME ...` runs it
 * (it sits beside the stash binary); it alone links the peers it measures
 * stash against (RocksDB, hiredis, where installed; fio and redis-server as
 * child processes).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/bench/bench.h"

typedef struct bench_cmd {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} bench_cmd;

static const bench_cmd benches[] = {
    {"arena", bench_arena, "allocate+free pairs per second, 1 and 2 processes, beside malloc"},
    {"io", bench_io, "write, fsync and read a 2 GiB file, io_uring and threads, beside fio"},
    {"keyed", bench_keyed,
     "keyed state ops/s and latency, YCSB A, B, C and F, beside LMDB, RocksDB, Redis"},
    {"checkpoint", bench_checkpoint,
     "full and incremental checkpoints, restore, pause, load, memory, beside fio"},
    {"timers", bench_timers,
     "timers registered, fired and deleted, advance, pause, beside a private heap, LMDB, RocksDB"},
    {"python", bench_python, "value reads and writes from Python, beside python3-lmdb and redis"},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void usage(FILE *f)
{
    fputs("usage: stash bench BENCH [--json | --csv] [--quick] [--reps N] [--case PREFIX]\n"
          "                        [--plot DIR] [BENCH'S OPTIONS]\n"
          "Each figure is printed beside peers measured in the same run. The benches' own\n"
          "options (stash bench BENCH --help says more):\n"
          "  keyed       --backend heap|lmdb  --memory-budget auto|BYTES (with lmdb)\n"
          "  checkpoint  --backend heap|lmdb  --storage fs|rados --pool P\n"
          "  timers      --backend heap|lmdb\n"
          "  io          --dir DIR  --size N\n"
          "benches:\n",
          f);
    for (size_t i = 0; i < COUNT(benches); i++)
        fprintf(f, "  %-10s %s\n", benches[i].name, benches[i].summary);
    fprintf(f, "  %-10s %s\n", "all", "every bench above");
}

static int run_bench(int argc, char **argv)
{
    if (!tool_wants_help(argc, argv) && tool_version(argc, argv)) return 0;
    if (argc < 2 || tool_wants_help(2, argv)) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "all") == 0) {
        int rc = 0;
        for (size_t i = 0; i < COUNT(benches); i++) {
            argv[1] = (char *)benches[i].name;
            rc |= benches[i].run(argc - 1, argv + 1);
        }
        return rc;
    }
    for (size_t i = 0; i < COUNT(benches); i++)
        if (strcmp(argv[1], benches[i].name) == 0) return benches[i].run(argc - 1, argv + 1);
    fprintf(stderr, "stash bench: unknown bench '%s' (stash bench --help lists them)\n", argv[1]);
    return 2;
}

int main(int argc, char **argv)
{
    int n;
    char **split = tool_split_equals(argc, argv, &n);
    if (!split) return tool_fail("arguments", -ENOMEM);
    int rc = run_bench(n, split);
    rc |= bench_plot_draw();
    free(split);
    return rc;
}
