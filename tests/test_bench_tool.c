/* SPDX-License-Identifier: MIT */
/*
 * test_bench_tool.c: `stash bench` on the command line: a --case that
 * selects nothing is refused before anything runs, naming the cases the
 * bench has on its backend; a case that names something runs; --plot
 * draws its pictures.
 */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/helpers.h"

static char out[8192];

/* Runs `stash ARGS`, which must fail as a usage error naming want. */
static void refused(const char *args, const char *want)
{
    cr_assert_eq(test_run_stash(args, out, sizeof out), 2, "%s: %s", args, out);
    cr_assert_not_null(strstr(out, "starts no case's name"), "%s: %s", args, out);
    cr_assert_not_null(strstr(out, want), "%s names %s: %s", args, want, out);
}

Test(bench_tool, a_case_that_starts_no_name_is_refused_with_the_names)
{
    refused("bench keyed --case nothing", "value/ycsb-a/uniform/scaling");
    refused("bench checkpoint --case nothing", "incremental-1pct");
    refused("bench checkpoint --quick --case pause/10m", "pause/1m-keys");
    refused("bench io --case nothing", "write/direct");
    refused("bench arena --case nothing", "alloc-free/scaling");
    refused("bench timers --case nothing", "advance-1pct");
    refused("bench timers --quick --case pause/1m", "pause/100k-timers");
}

Test(bench_tool, a_case_the_lmdb_backend_does_not_run_is_refused)
{
    refused("bench keyed --backend lmdb --case value/ycsb-f", "value/ycsb-c/zipfian");
    refused("bench keyed --backend lmdb --case map", "with --backend lmdb");
    cr_assert_null(strstr(out, "list/get"), "the lmdb comparison has no lists: %s", out);
}

Test(bench_tool, a_case_that_names_a_prefix_runs_only_its_rows)
{
    cr_assert_eq(
        test_run_stash("bench arena --quick --reps 1 --json --case alloc-free/1", out, sizeof out),
        0, "%s", out);
    cr_assert_not_null(strstr(out, "\"case\": \"alloc-free/1proc\""), "%s", out);
    cr_assert_null(strstr(out, "alloc-free/2proc"), "%s", out);
}

Test(bench_tool, bad_arguments_are_refused)
{
    cr_assert_eq(test_run_stash("bench keyed --reps 0", out, sizeof out), 2, "%s", out);
    cr_assert_not_null(strstr(out, "--reps takes 1 to 1000"), "%s", out);
    cr_assert_eq(test_run_stash("bench keyed --backend rocksdb", out, sizeof out), 2, "%s", out);
    cr_assert_not_null(strstr(out, "not 'rocksdb'"), "%s", out);
    cr_assert_eq(test_run_stash("bench arena --backend lmdb", out, sizeof out), 2, "%s", out);
    cr_assert_eq(test_run_stash("bench keyed --frobnicate", out, sizeof out), 2, "%s", out);
    cr_assert_not_null(strstr(out, "unknown argument '--frobnicate'"), "%s", out);
    cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s", out);
    cr_assert_eq(test_run_stash("bench frobnicate", out, sizeof out), 2, "%s", out);
    cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s", out);
    /* Every bench's own options are in its help, and in the list's. */
    cr_assert_eq(test_run_stash("bench keyed --help", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "--memory-budget") && strstr(out, "--backend"), "%s", out);
    cr_assert_eq(test_run_stash("bench checkpoint --help", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "--storage fs|rados --pool P"), "%s", out);
    cr_assert_eq(test_run_stash("bench --help", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "stash bench BENCH") && strstr(out, "--memory-budget") &&
                  strstr(out, "--storage") && strstr(out, "--size"),
              "%s", out);
}

/* Every case reports stash and each peer, or says why a peer was skipped;
 * and every system fired what it was given (a row that did not would say
 * skipped, naming the count). */
static void timers_run(const char *backend)
{
    static char big[16384];
    char args[128];
    snprintf(args, sizeof args, "bench timers --quick --reps 1 --json --backend %s", backend);
    cr_assert_eq(test_run_stash(args, big, sizeof big), 0, "%s", big);
    const char *cases[] = {"register-fire", "register-delete", "advance-1pct"};
    const char *systems[] = {"stash", "inline-heap", "private-heap", "lmdb", "rocksdb"};
    for (size_t c = 0; c < 3; c++)
        for (size_t s = 0; s < 5; s++) {
            char row[128];
            snprintf(row, sizeof row, "\"case\": \"%s\", \"system\": \"%s\"", cases[c], systems[s]);
            const char *at = strstr(big, row);
            cr_assert_not_null(at, "%s: no row %s: %s", backend, row, big);
            const char *end = strchr(at, '\n');
            bool skipped = strstr(at, "\"skipped\"") && strstr(at, "\"skipped\"") < end;
            cr_assert(!skipped || strcmp(systems[s], "rocksdb") == 0, "%s: %.*s", backend,
                      (int)(end - at), at);
        }
    cr_assert_not_null(
        strstr(big, "\"case\": \"pause/100k-timers\", \"system\": \"stash\", \"value\""), "%s",
        big);
}

Test(bench_tool, bench_timers_runs_every_case_beside_its_peers, .timeout = 240)
{
    timers_run("heap");
    timers_run("lmdb");
}

/* A batched case reports stash batched and not, and the raw tables batched
 * and not, each with a rate, and their ratios. */
Test(bench_tool, a_batched_keyed_case_runs_beside_the_raw_table_batched_and_not, .timeout = 240)
{
    static char big[16384];
    cr_assert_eq(test_run_stash("bench keyed --quick --reps 1 --json --case "
                                "value/ycsb-c/uniform/batch32",
                                big, sizeof big),
                 0, "%s", big);
    const char *systems[] = {"stash",  "stash-unbatched", "raw-table", "raw-table-batched",
                             "raw-lp", "raw-lp-batched",  "raw-index", "raw-index-batched"};
    for (size_t s = 0; s < 8; s++) {
        char row[160];
        snprintf(row, sizeof row,
                 "\"case\": \"value/ycsb-c/uniform/batch32\", \"system\": \"%s\", \"value\"",
                 systems[s]);
        cr_assert_not_null(strstr(big, row), "no row %s: %s", row, big);
    }
    cr_assert_not_null(strstr(big, "\"system\": \"stash/raw-table-batched\""), "%s", big);
    cr_assert_not_null(strstr(big, "\"system\": \"stash/stash-unbatched\""), "%s", big);
}

/* Checks every row of a keyed report in big: each system's rate comes from
 * passes of the case's whole sequence (ops), none failed its reads' check
 * unless it is named by bad, and each of that one's rows did. */
static void every_row_ran_all_and_read_right(const char *big, const char *bad)
{
    int rows = 0, failed = 0;
    for (const char *at = strstr(big, "{\"bench\": \"keyed\""); at;
         at = strstr(at + 1, "{\"bench\": \"keyed\"")) {
        const char *end = strchr(at, '\n');
        int len = (int)(end ? end - at : (ptrdiff_t)strlen(at));
        char row[1024];
        snprintf(row, sizeof row, "%.*s", len, at);
        if (bad && strstr(row, bad)) {
            cr_assert_not_null(strstr(row, "a read returned wrong contents"), "%s", row);
            failed++;
            continue;
        }
        cr_assert_null(strstr(row, "failed"), "%s", row);
        if (!strstr(row, "\"unit\": \"ops/s\"")) continue;
        cr_assert_not_null(strstr(row, "\"ops\": 200000,"), "the whole sequence: %s", row);
        rows++;
    }
    cr_assert_gt(rows, 2, "%s", big);
    cr_assert(!bad || failed, "no row of %s failed: %s", bad, big);
}

/* Every system runs every pass of a case whole, throughput and latency in
 * passes of their own, and every read is checked against a replay of the
 * writes: a value changed behind the bench's back fails that system's row
 * and no other. */
Test(bench_tool, every_keyed_pass_runs_the_whole_sequence_and_its_reads_are_checked, .timeout = 450)
{
    static char big[32768];
    const char *cases[] = {"value/ycsb-f/uniform", "value/ycsb-a/zipfian", "map/get",
                           "value/ycsb-c/uniform/batch8"};
    for (size_t c = 0; c < 4; c++) {
        char args[160];
        snprintf(args, sizeof args, "bench keyed --quick --reps %d --json --case %s", c ? 1 : 2,
                 cases[c]);
        cr_assert_eq(test_run_stash(args, big, sizeof big), 0, "%s", big);
        every_row_ran_all_and_read_right(big, NULL);
    }
    setenv("STASH_BENCH_CORRUPT", "raw-lp", 1);
    int rc = test_run_stash(
        "bench keyed --quick --reps 1 --json --case value/ycsb-c/uniform/batch8", big, sizeof big);
    unsetenv("STASH_BENCH_CORRUPT");
    cr_assert_eq(rc, 0, "%s", big);
    every_row_ran_all_and_read_right(big, "\"system\": \"raw-lp");
}

Test(bench_tool, a_memory_budget_is_for_the_lmdb_backend_and_takes_bytes)
{
    cr_assert_eq(test_run_stash("bench keyed --memory-budget auto", out, sizeof out), 2, "%s", out);
    cr_assert_not_null(strstr(out, "--memory-budget is for --backend lmdb"), "%s", out);
    cr_assert_eq(test_run_stash("bench keyed --backend lmdb --memory-budget lots", out, sizeof out),
                 2, "%s", out);
    cr_assert_not_null(strstr(out, "not 'lots'"), "%s", out);
    cr_assert_eq(test_run_stash("bench keyed --backend lmdb --memory-budget", out, sizeof out), 2,
                 "%s", out);
}

Test(bench_tool, bench_python_runs_every_case_beside_its_peers, .timeout = 240)
{
#ifdef __SANITIZE_ADDRESS__
    cr_skip_test("python3 cannot load a sanitizer build's libstash");
#endif
    static char big[16384];
    cr_assert_eq(test_run_stash("bench python --quick --reps 1 --json", big, sizeof big), 0, "%s",
                 big);
    const char *cases[] = {"value-read/one", "value-write/one", "value-read/batch32",
                           "value-write/batch32"};
    const char *systems[] = {"stash", "python3-lmdb", "python3-redis"};
    for (size_t c = 0; c < 4; c++)
        for (size_t s = 0; s < 3; s++) {
            char row[128];
            snprintf(row, sizeof row, "\"case\": \"%s\", \"system\": \"%s\"", cases[c], systems[s]);
            const char *at = strstr(big, row);
            cr_assert_not_null(at, "no row %s: %s", row, big);
            const char *end = strchr(at, '\n');
            bool skipped = strstr(at, "\"skipped\"") && strstr(at, "\"skipped\"") < end;
            /* The peers are bench packages: a machine without them skips them. */
            cr_assert(!skipped || s > 0, "%.*s", (int)(end - at), at);
        }
    cr_assert_eq(test_run_stash("bench python --backend lmdb", big, sizeof big), 2, "%s", big);
    cr_assert_eq(test_run_stash("bench python --case nothing", big, sizeof big), 2, "%s", big);
    cr_assert_not_null(strstr(big, "value-read/one"), "%s", big);
}

/* About 80 s alone under ASan: a hang guard with room for a loaded machine. */
Test(bench_tool, every_report_starts_with_its_header_and_gives_each_figure_s_spread, .timeout = 600)
{
    static char big[16384];
    char want[64];
    snprintf(want, sizeof want, "{\"header\": {\"bench\": \"arena\", \"version\": \"%s\"",
             stash_version());
    cr_assert_eq(
        test_run_stash("bench arena --quick --reps 2 --json --case alloc-free/1", big, sizeof big),
        0, "%s", big);
    cr_assert_eq(strncmp(big, want, strlen(want)), 0, "%s", big);
    cr_assert_not_null(strstr(big, "\"cores\": "), "%s", big);
    cr_assert_not_null(strstr(big, "\"min\": "), "%s", big);
    /* A ratio too: the median of the repetitions' own ratios, with theirs. */
    const char *ratio = strstr(big, "\"system\": \"stash/malloc\"");
    cr_assert_not_null(ratio, "%s", big);
    const char *ratio_end = strchr(ratio, '\n');
    const char *ratio_min = strstr(ratio, "\"min\": ");
    cr_assert(ratio_min && ratio_end && ratio_min < ratio_end, "%s", big);
    cr_assert_eq(
        test_run_stash("bench arena --quick --reps 2 --csv --case alloc-free/1", big, sizeof big),
        0, "%s", big);
    cr_assert_eq(strncmp(big, "# stash ", 8), 0, "%s", big);
    const char *cols = strstr(big, "\nbench,case,system,value,unit,min,max,");
    cr_assert_not_null(cols, "%s", big);
    const char *row = strstr(cols, "\narena,alloc-free/1proc,stash,");
    cr_assert_not_null(row, "%s", big);
    int commas = 0;
    for (const char *p = row + 1; *p && *p != '\n'; p++) commas += *p == ',';
    cr_assert_eq(commas, 10, "eleven fields: %s", big);
    cr_assert_eq(
        test_run_stash("bench arena --quick --reps 2 --case alloc-free/1", big, sizeof big), 0,
        "%s", big);
    cr_assert_not_null(strstr(big, "# machine: "), "%s", big);
    cr_assert_not_null(strstr(big, " .. "), "the table shows each figure's lowest and highest: %s",
                       big);
    cr_assert_eq(test_run_stash("bench arena --json --csv", big, sizeof big), 2, "%s", big);
    cr_assert_not_null(strstr(big, "exclude each other"), "%s", big);
}

/* Whether the file at path exists and is not empty. */
static bool nonempty(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    return stat(path, &st) == 0 && st.st_size > 0;
}

Test(bench_tool, plot_draws_the_cdfs_the_throughput_over_time_and_the_bandwidths, .timeout = 300)
{
    static char big[16384];
    char dir[128], args[512];
    snprintf(dir, sizeof dir, "/tmp/stash-test-plot-%d", (int)getpid());
    test_remove_dir(dir);
    snprintf(args, sizeof args,
             "bench keyed --quick --reps 1 --case value/ycsb-c/uniform/batch32 --plot %s", dir);
    cr_assert_eq(test_run_stash(args, big, sizeof big), 0, "%s", big);
    cr_assert(nonempty(dir, "keyed-value-ycsb-c-uniform-batch32-latency.png"), "%s", big);
    cr_assert(nonempty(dir, "keyed-value-ycsb-c-uniform-batch32-latency-stash.dat"));
    cr_assert(nonempty(dir, "plots.gp"));
    snprintf(args, sizeof args, "bench checkpoint --quick --reps 1 --plot %s", dir);
    cr_assert_eq(test_run_stash(args, big, sizeof big), 0, "%s", big);
    cr_assert(nonempty(dir, "ycsb-a-during-checkpoint.png"), "%s", big);
    cr_assert(nonempty(dir, "ycsb-a-during-checkpoint-stash.dat"));
    /* The bandwidths stand beside fio's, where fio is installed. */
    if (system("command -v fio > /dev/null") == 0)
        cr_assert(nonempty(dir, "checkpoint-bandwidth-beside-fio--MB-s-.png"), "%s", big);
    /* A plot directory that cannot be made is refused before anything runs. */
    cr_assert_eq(test_run_stash("bench arena --plot /nonexistent/dir", big, sizeof big), 2, "%s",
                 big);
    cr_assert_not_null(strstr(big, "--plot /nonexistent/dir"), "%s", big);
    test_remove_dir(dir);
}
