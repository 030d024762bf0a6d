/* SPDX-License-Identifier: MIT */
/*
 * test_json_output.c: every --json output of the command line (status,
 * checkpoint, snapshot ls, info and dump, the bench's lines) parses as JSON
 * with Debian's Python, also when state names and directories hold quotes,
 * backslashes, control characters, UTF-8 and bytes that are no UTF-8, and
 * those names come back as they went in.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/helpers.h"

/* A name with every kind of byte JSON must escape or carry. */
#define HOSTILE "q\"b\\n\nt\tc\x01u\xc3\xa9\xe2\x9c\x93x\xff"

static char base[128], dir[256], name[96];
static stash_service *service;
static char out[1 << 16];

static void setup(void)
{
    if (access("/usr/bin/python3", X_OK) != 0) return;
    snprintf(base, sizeof base, "/var/tmp/stash-json-XXXXXX");
    cr_assert_not_null(mkdtemp(base));
    snprintf(dir, sizeof dir, "%s/ck " HOSTILE, base);
    snprintf(name, sizeof name, "%s", test_arena_name("json"));
    stash_arena_opts ao = {.sz = sizeof(stash_arena_opts), .size = 16u << 20, .max_parallelism = 4};
    cr_assert_eq(
        stash_service_start(
            name, &(stash_service_opts){.sz = sizeof(stash_service_opts), .arena = &ao, .dir = dir},
            &service),
        0, "%s", stash_errmsg());
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0);
    stash_state *s;
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "st " HOSTILE,
                                                     .kind = STASH_VALUE},
                                 &s),
                 0, "%s", stash_errmsg());
    stash_key_set(w, "k", 1);
    cr_assert_eq(stash_value_put(s, "v", 1), 0);
    stash_worker_close(w);
    setenv("STASH_JSON_EXPECT_STATE", "st " HOSTILE, 1);
    setenv("STASH_JSON_EXPECT_DIR", dir, 1);
}

static void teardown(void)
{
    if (!service) return;
    stash_service_stop(service);
    stash_arena_destroy(name, NULL);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    system(cmd);
}

TestSuite(json, .init = setup, .fini = teardown);

/* Runs `stash ARGS` and checks its output with tests/json_check.py: it must
 * parse, and carry the state's name or the directory where asked. */
static void parses(const char *args, bool state, bool directory)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s | env %s %s python3 %s/json_check.py", args,
             state ? "" : "-u STASH_JSON_EXPECT_STATE", directory ? "" : "-u STASH_JSON_EXPECT_DIR",
             STASH_TESTS_DIR);
    int rc = test_run_stash(cmd, out, sizeof out);
    cr_assert_eq(rc, 0, "stash %.200s: %s", args, out);
}

Test(json, every_json_output_parses_and_carries_names_back)
{
    if (!service) cr_skip_test("no /usr/bin/python3 to parse the output with");
    char args[768];
    snprintf(args, sizeof args, "checkpoint %s --json", name);
    parses(args, false, true);
    snprintf(args, sizeof args, "status %s --json", name);
    parses(args, false, true);
    snprintf(args, sizeof args, "snapshot ls '%s' --json", dir);
    parses(args, false, true);
    snprintf(args, sizeof args, "snapshot info '%s' --json", dir);
    parses(args, true, false);
    snprintf(args, sizeof args, "snapshot dump '%s'", dir);
    parses(args, true, false);
}

Test(json, bench_lines_parse, .timeout = 120)
{
    if (!service) cr_skip_test("no /usr/bin/python3 to parse the output with");
    parses("bench arena --quick --json --reps 1", false, false);
}
