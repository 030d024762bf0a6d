/* SPDX-License-Identifier: MIT */
/*
 * test_snapshot_tool.c: `stash snapshot` on real checkpoint directories: ls,
 * info, verify (exit codes, the damaged file and offset named), dump (one
 * JSON line per record), diff, the usage errors, and the savepoint writer
 * under load.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/checkpoint/checkpoints.h"
#include "tests/helpers.h"

static char dir[128];

static void make_checkpoints(void)
{
    snprintf(dir, sizeof dir, "/tmp/stash-tool-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char name[96];
    stash_arena *a = test_arena_create("tool", 16u << 20, 4, name);
    stash_worker *w;
    stash_state *s;
    cr_assert_eq(stash_worker_open(name, &(stash_worker_opts){.parallelism = 1}, &w), 0);
    cr_assert_eq(stash_state_get(w, &(stash_state_desc){.name = "clicks", .kind = STASH_VALUE}, &s),
                 0);
    ioe_engine *e;
    cr_assert_eq(ioe_engine_open(&(ioe_opts){.backend = IOE_THREADS}, &e), 0);
    for (uint64_t id = 1; id <= 2; id++) {
        for (uint32_t k = 0; k < 100; k++) {
            stash_key_set(w, &k, sizeof k);
            uint64_t v = k * id;
            stash_value_put(s, &v, sizeof v);
        }
        uint32_t pins[4];
        for (uint32_t kg = 0; kg < 4; kg++) pins[kg] = (uint32_t)shm_table_pin(a, kg);
        cr_assert_eq(ckpt_write(a, pins,
                                &(ckpt_opts){.dir = test_ckpt_dir(dir), .id = id, .engine = e},
                                NULL),
                     0);
        for (uint32_t kg = 0; kg < 4; kg++) shm_table_unpin(a, kg, pins[kg]);
    }
    /* A savepoint beside them, with the operator state of two workers and
     * a timer. */
    stash_timers *t;
    uint32_t seven = 7;
    cr_assert_eq(stash_timers_get(w, "windows", &t), 0);
    stash_key_set(w, &seven, sizeof seven);
    cr_assert_eq(stash_timer_register(t, STASH_EVENT_TIME, "w", 1, 1234), 0);
    uint32_t pins[4];
    for (uint32_t kg = 0; kg < 4; kg++) pins[kg] = (uint32_t)shm_table_pin(a, kg);
    const ckpt_blob ops[2] = {{NULL, 0}, {NULL, 0}};
    cr_assert_eq(ckpt_write(a, pins,
                            &(ckpt_opts){.dir = test_ckpt_dir(dir),
                                         .id = 3,
                                         .savepoint = true,
                                         .engine = e,
                                         .op_parallelism = 2,
                                         .op_blobs = ops},
                            NULL),
                 0, "%s", stash_errmsg());
    for (uint32_t kg = 0; kg < 4; kg++) shm_table_unpin(a, kg, pins[kg]);
    ioe_engine_close(e);
    stash_worker_close(w);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

static void remove_checkpoints(void)
{
    test_remove_dir(dir);
}

TestSuite(tool, .init = make_checkpoints, .fini = remove_checkpoints);

static char out[1 << 20];

Test(tool, ls_info_and_verify)
{
    char args[512];
    snprintf(args, sizeof args, "snapshot ls %s", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "chk-1") && strstr(out, "chk-2") && strstr(out, "complete"), "%s", out);
    cr_assert(strstr(out, "savepoint-3") && strstr(out, " savepoint "), "%s", out);
    snprintf(args, sizeof args, "snapshot info %s/savepoint-3", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "operator state: 2 workers, 0 bytes"), "%s", out);
    snprintf(args, sizeof args, "snapshot info %s --json", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"id\": 2") && strstr(out, "\"name\": \"clicks\""), "%s", out);
    snprintf(args, sizeof args, "snapshot verify %s/chk-1", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "100 records"), "%s", out);
}

Test(tool, verify_names_the_damage_and_fails)
{
    char path[256], args[512];
    snprintf(path, sizeof path, "%s/chk-2/kg-data.dat", dir);
    FILE *f = fopen(path, "r+b");
    fseek(f, 100, SEEK_SET);
    fputc(0xff, f);
    fclose(f);
    snprintf(args, sizeof args, "snapshot verify %s/chk-2", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "kg-data.dat: offset"), "%s", out);
}

Test(tool, dump_prints_every_record_as_json)
{
    char args[512];
    snprintf(args, sizeof args, "snapshot dump %s/chk-1", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    int lines = 0; /* a line per keyed entry; the snapshot's and states' lines before them */
    for (char *p = out; (p = strstr(p, "{\"kg\": ")); p++) lines++;
    cr_assert_eq(lines, 100);
    cr_assert(strstr(out, "{\"kg\": ") && strstr(out, "\"state\": \"clicks\""), "%.300s", out);
    /* Key 1 is 01000000; its value in checkpoint 1 is 1. */
    cr_assert(strstr(out, "\"key\": \"01000000\", \"namespace\": \"\", \"value\": "
                          "\"0100000000000000\""),
              "%.300s", out);
}

Test(tool, dump_shows_a_timer_as_its_domain_time_and_namespace)
{
    char args[512];
    snprintf(args, sizeof args, "snapshot dump %s/savepoint-3", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out,
                     "\"state\": \"windows\", \"kind\": \"timers\", \"key\": \"07000000\", "
                     "\"domain\": \"event-time\", \"timestamp\": 1234, \"namespace\": \"77\"}"),
              "%.4000s", out);
}

Test(tool, diff_names_a_timer_by_its_domain_and_time)
{
    char args[512];
    snprintf(args, sizeof args, "snapshot diff %s/chk-2 %s/savepoint-3", dir, dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "+ windows 07000000 event-time@1234 77\n"), "%s", out);
    cr_assert(strstr(out, "1 entries differ"), "%s", out);
}

Test(tool, diff_tells_what_changed)
{
    char args[512];
    snprintf(args, sizeof args, "snapshot diff %s/chk-1 %s/chk-1", dir, dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    snprintf(args, sizeof args, "snapshot diff %s/chk-1 %s/chk-2", dir, dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "99 entries differ"), "key 0 is 0 in both: %s", out);
}

Test(tool, usage_errors)
{
    cr_assert_eq(test_run_stash("snapshot", out, sizeof out), 2);
    cr_assert_eq(test_run_stash("snapshot frobnicate x", out, sizeof out), 2);
    cr_assert(strstr(out, "unknown subcommand"));
    cr_assert_eq(test_run_stash("snapshot --help", out, sizeof out), 0);
    /* Trouble, not damage: diff(1)'s 2. */
    cr_assert_eq(test_run_stash("snapshot verify /nonexistent-dir", out, sizeof out), 2);
    cr_assert_eq(test_run_stash("snapshot diff /nonexistent-dir /nonexistent-dir", out, sizeof out),
                 2);
    /* A sign does not wrap around into a small number. */
    cr_assert_eq(
        test_run_stash("create neg --max-parallelism -18446744073709551608", out, sizeof out), 2,
        "%s", out);
    cr_assert(strstr(out, "-18446744073709551608"), "%s", out);
    cr_assert_eq(test_run_stash("serve neg --dir /tmp --retain -1", out, sizeof out), 2, "%s", out);
    cr_assert_eq(test_run_stash("serve neg --dir /tmp --interval -5s", out, sizeof out), 2, "%s",
                 out);
}

Test(tool, every_subcommand_refuses_an_unknown_option_and_takes_options_anywhere)
{
    const char *cmds[] = {"ls", "info", "verify", "dump"};
    char args[512];
    for (int i = 0; i < 4; i++) {
        snprintf(args, sizeof args, "snapshot %s %s --jsn", cmds[i], dir);
        cr_assert_eq(test_run_stash(args, out, sizeof out), 2, "%s: %s", cmds[i], out);
        cr_assert(strstr(out, "unknown option '--jsn'"), "%s: %s", cmds[i], out);
        cr_assert(!strchr(strchr(out, '\n') + 1, '\n'), "one line: %s", out);
    }
    snprintf(args, sizeof args, "snapshot diff %s/chk-1 %s/chk-1 --brief", dir, dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 2, "%s", out);
    snprintf(args, sizeof args, "snapshot ls %s extra", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 2, "%s", out);
    snprintf(args, sizeof args, "snapshot info --json %s", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"id\": 2"), "%s", out);
    snprintf(args, sizeof args, "snapshot info --json=x %s", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 2, "a flag takes no value: %s", out);
}

Test(tool, ls_says_unverified_unless_asked_to_verify)
{
    char path[256], args[512];
    snprintf(path, sizeof path, "%s/chk-2/kg-data.dat", dir);
    FILE *f = fopen(path, "r+b");
    fseek(f, 100, SEEK_SET);
    fputc(0xff, f);
    fclose(f);
    snprintf(args, sizeof args, "snapshot ls %s", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "complete (unverified)"), "%s", out);
    cr_assert(!strstr(out, "complete (verified)"), "%s", out);
    snprintf(args, sizeof args, "snapshot ls --verify %s", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    char *two = strstr(out, "chk-2");
    cr_assert_not_null(two);
    char *line = two;
    while (line > out && line[-1] != '\n') line--;
    cr_assert(strstr(line, "damaged") && strstr(line, "damaged") < two, "%s", out);
    cr_assert(strstr(out, "complete (verified)"), "chk-1 and the savepoint: %s", out);
    /* verify of the directory takes its newest checkpoint, damaged or not. */
    snprintf(args, sizeof args, "snapshot verify %s", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "chk-2/kg-data.dat: offset"), "%s", out);
}

Test(tool, dump_and_diff_show_an_incremental_chain_as_of_its_checkpoint)
{
    char inc[160], args[600];
    snprintf(inc, sizeof inc, "%s/inc", dir);
    char name[96];
    stash_arena *a = test_arena_create("toolinc", 16u << 20, 4, name);
    stash_worker *w;
    stash_state *s;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0);
    cr_assert_eq(stash_state_get(w, &(stash_state_desc){.name = "v", .kind = STASH_VALUE}, &s), 0);
    ioe_engine *e;
    cr_assert_eq(ioe_engine_open(&(ioe_opts){.backend = IOE_THREADS}, &e), 0);
    uint32_t base[4], pins[4];
    for (uint32_t k = 0; k < 100; k++) {
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_put(s, "1", 1), 0);
    }
    for (uint32_t kg = 0; kg < 4; kg++) base[kg] = (uint32_t)shm_table_pin(a, kg);
    cr_assert_eq(
        ckpt_write(
            a, base,
            &(ckpt_opts){.dir = test_ckpt_dir(inc), .id = 1, .engine = e, .incremental = true},
            NULL),
        0, "%s", stash_errmsg());
    /* Key 0 changes, key 1 goes. */
    uint32_t k = 0;
    stash_key_set(w, &k, sizeof k);
    cr_assert_eq(stash_value_put(s, "2", 1), 0);
    k = 1;
    stash_key_set(w, &k, sizeof k);
    cr_assert_eq(stash_state_clear(s), 0);
    for (uint32_t kg = 0; kg < 4; kg++) pins[kg] = (uint32_t)shm_table_pin(a, kg);
    cr_assert_eq(ckpt_write(a, pins,
                            &(ckpt_opts){.dir = test_ckpt_dir(inc),
                                         .id = 2,
                                         .engine = e,
                                         .incremental = true,
                                         .base_id = 1,
                                         .base_pins = base},
                            NULL),
                 0, "%s", stash_errmsg());
    /* A savepoint of the same state. */
    cr_assert_eq(
        ckpt_write(a, pins,
                   &(ckpt_opts){.dir = test_ckpt_dir(inc), .id = 3, .savepoint = true, .engine = e},
                   NULL),
        0, "%s", stash_errmsg());
    for (uint32_t kg = 0; kg < 4; kg++) {
        shm_table_unpin(a, kg, base[kg]);
        shm_table_unpin(a, kg, pins[kg]);
    }
    ioe_engine_close(e);
    stash_worker_close(w);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    snprintf(args, sizeof args, "snapshot dump %s/chk-2", inc);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    int lines = 0; /* a line per keyed entry; the snapshot's and states' lines before them */
    for (char *p = out; (p = strstr(p, "{\"kg\": ")); p++) lines++;
    cr_assert_eq(lines, 99, "key 1 is gone: %s", out);
    cr_assert(strstr(out, "\"key\": \"00000000\", \"namespace\": \"\", \"value\": \"32\""),
              "key 0 once, as changed: %.400s", out);
    cr_assert(!strstr(out, "\"key\": \"00000000\", \"namespace\": \"\", \"value\": \"31\""),
              "%.400s", out);
    snprintf(args, sizeof args, "snapshot diff %s/chk-2 %s/savepoint-3", inc, inc);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "0 entries differ (99 in the first, 99 in the second)"), "%s", out);
}

/* ---- load and its writer ------------------------------------------------ */

/* Loads lines (--format text) at DIR/name; returns the exit code. */
static int load_lines(const char *name, const char *lines)
{
    char input[200], args[600];
    snprintf(input, sizeof input, "%s/%s.jsonl", dir, name);
    FILE *f = fopen(input, "w");
    cr_assert_not_null(f);
    fputs(lines, f);
    fclose(f);
    snprintf(args, sizeof args, "snapshot load %s/%s --format text < %s", dir, name, input);
    return test_run_stash(args, out, sizeof out);
}

/* The writer load runs refuses, as load does, what no reader would take. */
Test(tool, the_snapshot_writer_refuses_what_a_reader_would_refuse)
{
    char to[200];
    snprintf(to, sizeof to, "%s/sp-writer", dir);
    stash_snapshot_writer *w;
    cr_assert_eq(
        stash_snapshot_writer_open(to, &(stash_snapshot_writer_opts){.id = CKPT_MAX_ID + 1}, &w), 0,
        "%s", stash_errmsg());
    cr_assert_eq(stash_snapshot_writer_commit(w, NULL), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "id"), "%s", stash_errmsg());
    cr_assert_eq(access(to, F_OK), -1);
    cr_assert_eq(
        stash_snapshot_writer_open(
            to, &(stash_snapshot_writer_opts){.op_parallelism = STASH_MAX_WORKERS + 1}, &w),
        0, "%s", stash_errmsg());
    cr_assert_eq(stash_snapshot_writer_commit(w, NULL), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "workers"), "%s", stash_errmsg());
    cr_assert_eq(access(to, F_OK), -1);
    cr_assert_eq(
        stash_snapshot_writer_open(to, &(stash_snapshot_writer_opts){.op_parallelism = 1}, &w), 0,
        "%s", stash_errmsg());
    cr_assert_eq(
        stash_snapshot_writer_state(
            w, &(stash_state_desc){.name = "t", .kind = STASH_TIMERS, .ttl = {.ttl_ms = 1000}}),
        -EINVAL, "a timer service takes no TTL");
    cr_assert_eq(
        stash_snapshot_writer_state(w, &(stash_state_desc){.name = "", .kind = STASH_VALUE}),
        -EINVAL);
    cr_assert_eq(stash_snapshot_writer_state(w, &(stash_state_desc){.name = "x", .kind = 0}),
                 -EINVAL);
    /* Operator state past what metadata may hold. */
    cr_assert_eq(
        stash_snapshot_writer_state(w, &(stash_state_desc){.name = "o", .kind = STASH_OP_LIST}), 0);
    size_t big = CKPT_MAX_METADATA;
    char *bytes = calloc(1, big);
    cr_assert_not_null(bytes);
    stash_snapshot_entry e = {.state = "o", .value = {bytes, big}};
    cr_assert_eq(stash_snapshot_writer_op_put(w, &e), 0, "%s", stash_errmsg());
    free(bytes);
    cr_assert_eq(stash_snapshot_writer_commit(w, NULL), -EFBIG);
    cr_assert(strstr(stash_errmsg(), "operator state"), "%s", stash_errmsg());
    cr_assert_eq(access(to, F_OK), -1);
}

Test(tool, load_keeps_every_entry_of_a_ttl_state_whatever_the_time_it_was_written)
{
    const char *clocks[] = {"", ", \"ttl_event_time\": 1"};
    for (int c = 0; c < 2; c++) {
        char lines[2048], name[32], args[400];
        int at = snprintf(lines, sizeof lines,
                          "{\"declare\": \"v\", \"kind\": \"value\", \"ttl_ms\": 60000%s}\n"
                          "{\"declare\": \"l\", \"kind\": \"list\", \"ttl_ms\": 60000%s}\n",
                          clocks[c], clocks[c]);
        /* Written long ago, then now: the later puts expire none of them. */
        for (int k = 0; k < 8; k++)
            at += snprintf(lines + at, sizeof lines - (size_t)at,
                           "{\"state\": \"%s\", \"kind\": \"%s\", \"key\": \"k%d\", \"value\": "
                           "\"x\", \"ttl_ms\": %s}\n",
                           k % 2 ? "l" : "v", k % 2 ? "list" : "value", k,
                           k < 4 ? "17" : "1000000000000");
        snprintf(name, sizeof name, "sp-ttl-%d", c);
        cr_assert_eq(load_lines(name, lines), 0, "%s", out);
        snprintf(args, sizeof args, "snapshot dump %s/%s --format text", dir, name);
        cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
        int n = 0;
        for (char *p = out; (p = strstr(p, "\"ttl_ms\": 17}")); p++) n++;
        cr_assert_eq(n, 4, "every entry of long ago, at its time: %s", out);
        for (char *p = out; (p = strstr(p, "\"ttl_ms\": 1000000000000}")); p++) n++;
        cr_assert_eq(n, 8, "%s", out);
    }
}
