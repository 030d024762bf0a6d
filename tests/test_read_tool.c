/* SPDX-License-Identifier: MIT */
/*
 * test_read_tool.c: `stash get` and `stash scan` on a live arena, as of its
 * newest complete checkpoint and on a checkpoint directory alone: every
 * keyed kind, the three formats, --json, and the usage errors, each named;
 * and every command's --version.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/lmdb/lmdb.h"
#include "tests/helpers.h"

static char name[96], dir[128];
static stash_arena *arena;
static stash_worker *w;
static stash_service *svc;
static stash_state *v, *l, *m, *r, *ops;

static int concat(const stash_bytes *acc, const stash_bytes *in, void *out, size_t cap, size_t *len,
                  void *ctx)
{
    (void)ctx;
    *len = acc->len + in->len;
    if (cap < *len) return -ENOSPC;
    if (acc->len) memcpy(out, acc->data, acc->len);
    memcpy((char *)out + acc->len, in->data, in->len);
    return 0;
}

static void put(stash_state *s, const char *key, const char *value)
{
    cr_assert_eq(stash_key_set(w, key, strlen(key)), 0);
    cr_assert_eq(stash_value_put(s, value, strlen(value)), 0);
}

static void setup(void)
{
    arena = test_arena_create("readtool", 16u << 20, 8, name);
    snprintf(dir, sizeof dir, "/tmp/stash-test-readtool-%d", (int)getpid());
    mkdir(dir, 0700);
    cr_assert_eq(
        stash_service_start(
            name, &(stash_service_opts){.sz = sizeof(stash_service_opts), .dir = dir}, &svc),
        0, "%s", stash_errmsg());
    cr_assert_eq(
        stash_worker_open(
            name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w),
        0);
    stash_state_get(
        w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
        &v);
    stash_state_get(
        w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "l", .kind = STASH_LIST},
        &l);
    stash_state_get(
        w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "m", .kind = STASH_MAP}, &m);
    stash_state_get(
        w,
        &(stash_state_desc){
            .sz = sizeof(stash_state_desc), .name = "r", .kind = STASH_REDUCING, .reduce = concat},
        &r);
    stash_state_get(
        w,
        &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "ops", .kind = STASH_OP_LIST},
        &ops);
    put(v, "alice", "one");
    put(v, "bob", "two");
    cr_assert_eq(stash_state_namespace(v, "n1", 2), 0);
    put(v, "bob", "in n1");
    cr_assert_eq(stash_state_namespace(v, NULL, 0), 0);
    stash_key_set(w, "alice", 5);
    cr_assert_eq(stash_list_add(l, "a", 1), 0);
    cr_assert_eq(stash_list_add(l, "b\tc", 3), 0);
    cr_assert_eq(stash_map_put(m, "x", 1, "10", 2), 0);
    cr_assert_eq(stash_merging_add(r, "ab", 2), 0);
    cr_assert_eq(stash_merging_add(r, "cd", 2), 0);
    stash_key_set(w, "\x01\xff", 2);
    cr_assert_eq(stash_value_put(v, "\x00\x7f", 2), 0);
    stash_checkpoint_info info;
    cr_assert_eq(test_checkpoint_at_barriers(arena, &w, 1, &info), 0, "%s", info.detail);
    put(v, "alice", "after");
    /* Visible to other processes: on lmdb, a barrier commits once
     * LMDB_COMMIT_MS has passed since the last commit. */
    if (test_backend() == STASH_BACKEND_LMDB) usleep(2 * LMDB_COMMIT_MS * 1000);
    stash_event ev;
    cr_assert_geq(stash_barrier(w, &ev), 0);
}

static void teardown(void)
{
    stash_worker_close(w);
    stash_service_stop(svc);
    stash_arena_close(arena);
    stash_arena_destroy(name, NULL);
    test_remove_dir(dir);
}

TestSuite(read_tool, .init = setup, .fini = teardown, .timeout = 120);

/* Runs stash with the arguments after "%s" (the arena's name) and returns
 * its exit code, its output in out. */
static int run(char *out, const char *fmt)
{
    char args[512];
    snprintf(args, sizeof args, fmt, name);
    return test_run_stash(args, out, 4096);
}

/* Text never hands a terminal a byte it could act on: control bytes (C0
 * and C1) and bytes that are no UTF-8 come out escaped, characters as they
 * are; in JSON, bytes that are no UTF-8 are {"hex": ...}. */
Test(read_tool, text_escapes_what_a_terminal_would_act_on)
{
    static const char value[] = "a\xff\x1b[2J\xc2\x9b"
                                "z\xc3\xa7";
    cr_assert_eq(stash_key_set(w, "term", 4), 0);
    cr_assert_eq(stash_value_put(v, value, sizeof value - 1), 0);
    if (test_backend() == STASH_BACKEND_LMDB) usleep(2 * LMDB_COMMIT_MS * 1000);
    stash_event ev;
    cr_assert_geq(stash_barrier(w, &ev), 0);
    char out[4096];
    cr_assert_eq(run(out, "get %s --state v --key term"), 0, "%s", out);
    cr_assert_str_eq(out, "a\\xff\\x1b[2J\\xc2\\x9bz\xc3\xa7\n");
    cr_assert_eq(run(out, "get %s --state v --key term --json"), 0, "%s", out);
    cr_assert(strstr(out, "\"value\":{\"hex\": \"61ff1b5b324ac29b7ac3a7\"}"), "%s", out);
}

Test(read_tool, get_reads_every_keyed_kind)
{
    char out[4096];
    cr_assert_eq(run(out, "get %s --state v --key alice"), 0, "%s", out);
    cr_assert_str_eq(out, "after\n");
    cr_assert_eq(run(out, "get %s --state v --key bob --ns n1"), 0, "%s", out);
    cr_assert_str_eq(out, "in n1\n");
    cr_assert_eq(run(out, "get %s --state l --key alice"), 0, "%s", out);
    cr_assert_str_eq(out, "a\nb\\x09c\n");
    cr_assert_eq(run(out, "get %s --state m --key alice"), 0, "%s", out);
    cr_assert_str_eq(out, "x\t10\n");
    cr_assert_eq(run(out, "get %s --state m --key alice --map-key x"), 0, "%s", out);
    cr_assert_str_eq(out, "10\n");
    cr_assert_eq(run(out, "get %s --state r --key alice"), 0, "%s", out);
    cr_assert_str_eq(out, "abcd\n");
    cr_assert_eq(run(out, "get %s --state v --key 01ff --format hex"), 0, "%s", out);
    cr_assert_str_eq(out, "007f\n");
    cr_assert_eq(run(out, "get %s --state v --key Af8= --format base64"), 0, "%s", out);
    cr_assert_str_eq(out, "AH8=\n");
    cr_assert_eq(run(out, "get %s --state v --key 01ff --format hex --json"), 0, "%s", out);
    cr_assert_str_eq(out, "{\"state\":\"v\",\"kind\":\"value\",\"key\":\"01ff\",\"namespace\":\"\","
                          "\"value\":\"007f\"}\n");
    cr_assert_eq(run(out, "get %s --state m --key alice --json"), 0, "%s", out);
    cr_assert_str_eq(out, "{\"state\":\"m\",\"kind\":\"map\",\"key\":\"alice\",\"namespace\":\"\","
                          "\"entries\":[{\"map_key\":\"x\",\"value\":\"10\"}]}\n");
    cr_assert_eq(run(out, "get %s --state l --key alice --json"), 0, "%s", out);
    cr_assert_str_eq(out, "{\"state\":\"l\",\"kind\":\"list\",\"key\":\"alice\",\"namespace\":\"\","
                          "\"elements\":[\"a\",\"b\\u0009c\"]}\n");
    /* Absent: exit 1, saying so on stderr. */
    cr_assert_eq(run(out, "get %s --state v --key carol"), 1, "%s", out);
    cr_assert(strstr(out, "carol"), "%s", out);
    cr_assert_eq(run(out, "get %s --state m --key alice --map-key y"), 1, "%s", out);
}

Test(read_tool, get_reads_as_of_the_checkpoint_or_a_checkpoint_directory)
{
    char out[4096], args[512];
    cr_assert_eq(run(out, "get %s --state v --key alice --at-checkpoint"), 0, "%s", out);
    cr_assert_str_eq(out, "one\n");
    snprintf(args, sizeof args, "get --checkpoint %s/chk-1 --state l --key alice", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert_str_eq(out, "a\nb\\x09c\n");
    snprintf(args, sizeof args, "scan --checkpoint %s/chk-1 --state v", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "alice\t\tone\n") && strstr(out, "bob\tn1\tin n1\n") &&
                  strstr(out, "bob\t\ttwo\n") && strstr(out, "\\x01\\xff\t\t\\x00\\x7f\n"),
              "%s", out);
}

Test(read_tool, scan_lists_every_entry_of_a_state)
{
    char out[4096];
    cr_assert_eq(run(out, "scan %s --state v"), 0, "%s", out);
    int lines = 0;
    for (const char *p = out; (p = strchr(p, '\n')); p++) lines++;
    cr_assert_eq(lines, 4, "%s", out);
    cr_assert(strstr(out, "alice\t\tafter\n"), "%s", out);
    cr_assert_eq(run(out, "scan %s --state v --ns n1 --json"), 0, "%s", out);
    cr_assert_str_eq(out,
                     "{\"state\":\"v\",\"kind\":\"value\",\"key\":\"bob\",\"namespace\":\"n1\","
                     "\"value\":\"in n1\"}\n");
    cr_assert_eq(run(out, "scan %s --state m"), 0, "%s", out);
    cr_assert_str_eq(out, "alice\t\tx\t10\n");
    char args[64];
    uint32_t kg = stash_key_group("alice", 5, 8);
    snprintf(args, sizeof args, "scan %%s --state l --key-group %u", kg);
    cr_assert_eq(run(out, args), 0, "%s", out);
    cr_assert_str_eq(out, "alice\t\ta\tb\\x09c\n");
    snprintf(args, sizeof args, "scan %%s --state l --key-group %u", (kg + 1) % 8);
    cr_assert_eq(run(out, args), 0, "%s", out);
    cr_assert_str_eq(out, "");
}

Test(read_tool, bad_arguments_are_named)
{
    static const struct {
        const char *args; /* %s: the arena's name */
        int code;
        const char *named;
    } cases[] = {
        {"get %s --key alice", 2, "missing --state"},
        {"get %s --state v", 2, "missing --key"},
        {"get %s --state v --key alice --bogus", 2, "--bogus"},
        {"get %s --state v --key xyz --format hex", 2, "--key 'xyz' is not hex"},
        {"get %s --state v --key alice --format octal", 2, "octal"},
        {"get %s --state nope --key alice", 2, "nope"},
        {"get %s --state ops --key alice", 2, "operator state"},
        {"get %s --state v --key alice --map-key x", 2, "not a map"},
        {"scan %s --state v --key-group 8", 2, "key groups 0 to 7"},
        {"scan %s --state v --at-checkpoint --checkpoint /x", 2, "exclude each other"},
        {"get t-readtool-no-such-arena --state v --key a", 2, "t-readtool-no-such-arena"},
        {"get --checkpoint /nonexistent --state v --key a", 2, "/nonexistent"},
        {"get --help", 0, "usage: stash get"},
        {"scan --help", 0, "usage: stash scan"},
    };
    char out[4096];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(run(out, cases[i].args), cases[i].code, "%s: %s", cases[i].args, out);
        cr_assert(strstr(out, cases[i].named), "%s: %s", cases[i].args, out);
    }
}

Test(read_tool, every_command_says_its_version)
{
    static const char *const commands[] = {"--version",
                                           "serve --version",
                                           "checkpoint --version",
                                           "stop --version",
                                           "create --version",
                                           "status --version",
                                           "destroy --version",
                                           "get --version",
                                           "scan --version",
                                           "snapshot ls --version",
                                           "bench --version",
                                           "bench keyed --version",
                                           "demo --version"};
    char out[256], want[64];
    snprintf(want, sizeof want, "stash %s\n", stash_version());
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        cr_assert_eq(test_run_stash(commands[i], out, sizeof out), 0, "%s: %s", commands[i], out);
        cr_assert_str_eq(out, want, "%s", commands[i]);
    }
}
