/* SPDX-License-Identifier: MIT */
/*
 * test_bench_tool.c: `stash bench` on the command line: a --case that
 * selects nothing is refused before anything runs, naming the cases the
 * bench has on its backend; a case that names something runs.
 */
#include <criterion/criterion.h>
#include <string.h>

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
}
