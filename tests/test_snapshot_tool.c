/* SPDX-License-Identifier: MIT */
/*
 * test_snapshot_tool.c: `stash snapshot` on real checkpoint directories: ls,
 * info, verify (exit codes, the damaged file and offset named), dump (one
 * JSON line per record), diff, the usage errors, and the savepoint writer
 * under load and every line load refuses.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
    cr_assert_eq(
        stash_worker_open(
            name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w),
        0);
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "clicks",
                                                     .kind = STASH_VALUE},
                                 &s),
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
    /* The same size in text and in JSON: chk-1's files and metadata. */
    unsigned long long text_bytes = 0, json_bytes = 0;
    const char *line = strstr(out, "chk-1\n");
    cr_assert_not_null(line, "%s", out);
    while (line > out && line[-1] != '\n') line--;
    cr_assert_eq(sscanf(line, "%*s %*s %*s %*s %*s %llu", &text_bytes), 1, "%s", line);
    snprintf(args, sizeof args, "snapshot ls %s --json", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    const char *obj = strstr(out, "{\"id\": 1,");
    cr_assert_not_null(obj, "%s", out);
    cr_assert_eq(sscanf(strstr(obj, "\"bytes\": "), "\"bytes\": %llu", &json_bytes), 1, "%s", obj);
    cr_assert_eq(text_bytes, json_bytes, "%s", out);
    snprintf(args, sizeof args, "snapshot info %s/savepoint-3", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "operator state: 2 workers, 0 bytes"), "%s", out);
    cr_assert(strstr(out, "no ttl") && !strstr(out, "ttl 0 ms"), "%s", out);
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

/* A savepoint of one MapState of 1000 entries (10 keys of 100), each value
 * its map key times mult, the entries put in the order given by step. */
static void write_map_savepoint(const char *path, uint64_t mult, uint32_t step)
{
    stash_snapshot_writer *w;
    cr_assert_eq(stash_snapshot_writer_open(
                     path,
                     &(stash_snapshot_writer_opts){.sz = sizeof(stash_snapshot_writer_opts),
                                                   .max_parallelism = 4},
                     &w),
                 0, "%s", stash_errmsg());
    cr_assert_eq(
        stash_snapshot_writer_state(
            w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "m", .kind = STASH_MAP}),
        0, "%s", stash_errmsg());
    for (uint32_t i = 0; i < 1000; i++) {
        uint32_t at = i * step % 1000, key = at / 100, mk = at % 100;
        uint64_t v = mk * mult;
        stash_snapshot_entry e = {.state = "m",
                                  .kind = STASH_MAP,
                                  .key = {&key, sizeof key},
                                  .map_key = {&mk, sizeof mk},
                                  .value = {&v, sizeof v}};
        cr_assert_eq(stash_snapshot_writer_put(w, &e), 0, "%s", stash_errmsg());
    }
    cr_assert_eq(stash_snapshot_writer_commit(w, NULL), 0, "%s", stash_errmsg());
}

/* diff compares what two snapshots hold, not how their records lie: a
 * savepoint dumped and loaded back, or one whose maps were filled in
 * another order, holds the same state; a changed entry shows both values. */
Test(tool, diff_compares_entries_not_how_records_are_laid_out)
{
    char src[256], other[256], back[256], changed[256], lines[256], args[1024];
    snprintf(src, sizeof src, "%s/sp-map", dir);
    snprintf(other, sizeof other, "%s/sp-map-reordered", dir);
    snprintf(back, sizeof back, "%s/sp-map-back", dir);
    snprintf(changed, sizeof changed, "%s/sp-map-changed", dir);
    snprintf(lines, sizeof lines, "%s/lines", dir);
    write_map_savepoint(src, 1, 1);
    write_map_savepoint(other, 1, 7); /* 7 and 1000 share no factor: every entry, reordered */
    snprintf(args, sizeof args, "snapshot dump %s > %s", src, lines);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    snprintf(args, sizeof args, "snapshot load %s < %s", back, lines);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    const char *pairs[][2] = {{src, back}, {src, other}};
    for (size_t i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "snapshot diff %s %s", pairs[i][0], pairs[i][1]);
        cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
        cr_assert(strstr(out, "0 entries differ (1000 in the first, 1000 in the second)"), "%s",
                  out);
    }
    /* Every value doubled but map key 0's (0 either way). */
    write_map_savepoint(changed, 2, 1);
    snprintf(args, sizeof args, "snapshot diff %s %s", src, changed);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "990 entries differ"), "%s", out);
    /* Key 3, map key 5: 5 before, 10 after. */
    cr_assert(strstr(out, "~ m 03000000  map_key=05000000: 0500000000000000 -> 0a00000000000000\n"),
              "%.2000s", out);
    snprintf(args, sizeof args, "snapshot diff %s %s --format text", src, changed);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "~ m \\x03\\x00\\x00\\x00  map_key=\\x05\\x00\\x00\\x00: "
                          "\\x05\\x00\\x00\\x00\\x00\\x00\\x00\\x00 -> \\x0a"),
              "%.2000s", out);
}

/* Dump's text goes through other people's JSON tools and comes back the
 * same: bytes that are no UTF-8 (0xe7 alone is not ç), control bytes,
 * characters of two and four bytes (Python writes the latter as a
 * surrogate pair), a NUL. */
Test(tool, text_survives_python_s_json_and_jq)
{
    static const char *const keys[] = {
        "plain",    "\xe7",      "\xc3\xa7",    "a\001b\177", "\xf0\x9f\x98\x80",
        "\xff\xfe", "tab\there", "\xed\xa0\x80"};
    char src[256], args[2048];
    snprintf(src, sizeof src, "%s/sp-bytes", dir);
    stash_snapshot_writer *w;
    cr_assert_eq(stash_snapshot_writer_open(
                     src,
                     &(stash_snapshot_writer_opts){.sz = sizeof(stash_snapshot_writer_opts),
                                                   .max_parallelism = 4},
                     &w),
                 0, "%s", stash_errmsg());
    cr_assert_eq(
        stash_snapshot_writer_state(
            w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "m", .kind = STASH_MAP}),
        0, "%s", stash_errmsg());
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        for (size_t j = 0; j < sizeof keys / sizeof keys[0]; j++) {
            char value[16] = {'v', (char)i, 0, (char)j}; /* a NUL inside */
            stash_snapshot_entry e = {.state = "m",
                                      .kind = STASH_MAP,
                                      .key = {keys[i], strlen(keys[i])},
                                      .ns = {keys[j], strlen(keys[j])},
                                      .map_key = {keys[j], strlen(keys[j])},
                                      .value = {value, 4}};
            cr_assert_eq(stash_snapshot_writer_put(w, &e), 0, "%s", stash_errmsg());
        }
    cr_assert_eq(stash_snapshot_writer_commit(w, NULL), 0, "%s", stash_errmsg());
    const char *tools[] = {
        "python3 -c 'import json, sys\nfor l in sys.stdin: print(json.dumps(json.loads(l)))'",
        "jq -c .",
        /* An editor's hand: hex in capitals, as --format hex takes it too. */
        "sed 's/\"hex\": \"ff\\([0-9a-f]*\\)\"/\"hex\": \"FF\\1\"/'"};
    for (size_t t = 0; t < sizeof tools / sizeof tools[0]; t++) {
        char back[256];
        snprintf(back, sizeof back, "%s/sp-bytes-%zu", dir, t);
        snprintf(args, sizeof args,
                 "snapshot dump %s --format text | %s | %s snapshot load %s --format text", src,
                 tools[t], STASH_BIN, back);
        cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s: %s", tools[t], out);
        snprintf(args, sizeof args, "snapshot diff %s %s", src, back);
        cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s: %s", tools[t], out);
        cr_assert(strstr(out, "0 entries differ (64 in the first, 64 in the second)"), "%s: %s",
                  tools[t], out);
    }
    /* What is not UTF-8 is in hex; what is, a string. */
    snprintf(args, sizeof args, "snapshot dump %s --format text", src);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"key\": {\"hex\": \"e7\"}"), "%.2000s", out);
    cr_assert(strstr(out, "\"key\": \"\xc3\xa7\""), "%.2000s", out);
    cr_assert(strstr(out, "\"key\": {\"hex\": \"eda080\"}"), "a surrogate's bytes: %.2000s", out);
}

Test(tool, usage_errors)
{
    cr_assert_eq(test_run_stash("snapshot", out, sizeof out), 2);
    cr_assert_eq(test_run_stash("snapshot frobnicate x", out, sizeof out), 2);
    cr_assert(strstr(out, "unknown subcommand"));
    cr_assert_eq(test_run_stash("snapshot --help", out, sizeof out), 0);
    /* The command's list names every subcommand; an unknown command is one line. */
    cr_assert_eq(test_run_stash("--help", out, sizeof out), 0);
    cr_assert(strstr(out, "load") && strstr(out, "rewrite"), "%s", out);
    cr_assert_eq(test_run_stash("frobnicate", out, sizeof out), 2);
    cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s", out);
    /* Trouble, not damage: diff(1)'s 2. */
    cr_assert_eq(test_run_stash("snapshot verify /nonexistent-dir", out, sizeof out), 2);
    /* Every error line starts "stash COMMAND: ". */
    cr_assert_eq(strncmp(out, "stash snapshot verify: ", 23), 0, "%s", out);
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
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &s),
        0);
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

/* Whether directory path holds nothing. */
static bool empty_dir(const char *path)
{
    DIR *d = opendir(path);
    cr_assert_not_null(d, "%s", path);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n == 0;
}

/* Loads lines (--format text) into an empty directory of their own: the
 * load exits 1, its message names stdin's line and the field, and the
 * directory stays empty. */
static void expect_load_refused(const char *lines, int line, const char *field)
{
    static unsigned n;
    char sub[200], input[200], args[600], where[96];
    snprintf(sub, sizeof sub, "%s/load-%u", dir, n);
    snprintf(input, sizeof input, "%s/lines-%u", dir, n++);
    cr_assert_eq(mkdir(sub, 0700), 0);
    FILE *f = fopen(input, "w");
    cr_assert_not_null(f);
    fputs(lines, f);
    fclose(f);
    snprintf(args, sizeof args, "snapshot load %s/sp --format text < %s", sub, input);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 1, "%s: %s", lines, out);
    snprintf(where, sizeof where, "stdin line %d: \"%s\": ", line, field);
    cr_assert(strstr(out, where), "%s: the message names %s: %s", lines, where, out);
    cr_assert(!strchr(strchr(out, '\n') + 1, '\n'), "one line: %s", out);
    cr_assert(empty_dir(sub), "%s: nothing is left in %s", lines, sub);
}

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

#define VALUE_STATE "{\"declare\": \"v\", \"kind\": \"value\"}\n"

Test(tool, load_refuses_an_operator_state_of_more_workers_than_a_reader_takes)
{
    expect_load_refused("{\"snapshot\": 1, \"max_parallelism\": 8, \"op_parallelism\": 100000}\n"
                        "{\"declare\": \"v\", \"kind\": \"value\"}\n",
                        1, "op_parallelism");
    char lines[200];
    snprintf(lines, sizeof lines,
             "{\"snapshot\": 1, \"max_parallelism\": 8, \"op_parallelism\": %u}\n",
             STASH_MAX_WORKERS + 1);
    expect_load_refused(lines, 1, "op_parallelism");
    snprintf(lines, sizeof lines,
             "{\"snapshot\": 1, \"max_parallelism\": 8, \"op_parallelism\": %u}\n",
             STASH_MAX_WORKERS);
    cr_assert_eq(load_lines("sp-most-workers", lines), 0, "%s", out);
}

Test(tool, load_refuses_a_max_parallelism_that_is_not_an_integer_in_range)
{
    const char *bad[] = {"\"8\"", "8.5", "1e3", "0", "-8", "08", "32769", "true", "[8]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char lines[200];
        snprintf(lines, sizeof lines,
                 "{\"snapshot\": 1, \"max_parallelism\": %s, \"op_parallelism\": 0}\n" VALUE_STATE,
                 bad[i]);
        expect_load_refused(lines, 1, "max_parallelism");
    }
}

Test(tool, load_refuses_a_snapshot_id_that_is_no_checkpoint_id)
{
    char lines[200], most[32], past[32];
    snprintf(most, sizeof most, "%llu", (unsigned long long)CKPT_MAX_ID);
    snprintf(past, sizeof past, "%llu", (unsigned long long)CKPT_MAX_ID + 1);
    const char *bad[] = {"-5", "0", "18446744073709551615", "18446744073709551616", past, "1.0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(lines, sizeof lines,
                 "{\"snapshot\": %s, \"max_parallelism\": 8, \"op_parallelism\": 0}\n" VALUE_STATE,
                 bad[i]);
        expect_load_refused(lines, 1, "snapshot");
    }
    snprintf(lines, sizeof lines,
             "{\"snapshot\": %s, \"max_parallelism\": 8, \"op_parallelism\": 0}\n" VALUE_STATE,
             most);
    cr_assert_eq(load_lines("sp-most", lines), 0, "%s", out);
    char args[400];
    snprintf(args, sizeof args, "snapshot verify %s/sp-most", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, most), "%s", out);
    /* A service restored from it would take ids nobody lists: refused, and
     * no arena is left. */
    char from[300], ckpts[300];
    snprintf(from, sizeof from, "%s/sp-most", dir);
    snprintf(ckpts, sizeof ckpts, "%s/ckpts", dir);
    const char *name = test_arena_name("most");
    stash_service *s;
    cr_assert_eq(
        stash_service_start(
            name,
            &(stash_service_opts){.sz = sizeof(stash_service_opts), .dir = ckpts, .restore = from},
            &s),
        -EOVERFLOW);
    cr_assert(strstr(stash_errmsg(), "last id"), "%s", stash_errmsg());
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), -ENOENT);
}

Test(tool, load_refuses_a_state_name_with_a_nul_byte)
{
    expect_load_refused("{\"declare\": \"a\\u0000b\", \"kind\": \"value\"}\n", 1, "declare");
    expect_load_refused("{\"declare\": \"a\", \"kind\": \"value\"}\n"
                        "{\"state\": \"a\\u0000b\", \"kind\": \"value\", \"key\": \"k\", "
                        "\"namespace\": \"\", \"value\": \"x\"}\n",
                        2, "state");
    expect_load_refused("{\"declare\": \"a\", \"kind\": \"value\\u0000map\"}\n", 1, "kind");
    expect_load_refused("{\"declare\": \"\", \"kind\": \"value\"}\n", 1, "declare");
}

Test(tool, load_refuses_an_entry_of_another_kind_than_its_state)
{
    expect_load_refused(VALUE_STATE "{\"kg\": 0, \"state\": \"v\", \"kind\": \"map\", \"key\": "
                                    "\"k\", \"namespace\": \"\", \"map_key\": \"m\", \"value\": "
                                    "\"x\"}\n",
                        2, "kind");
    expect_load_refused(VALUE_STATE "{\"state\": \"v\", \"key\": \"k\", \"value\": \"x\"}\n", 2,
                        "kind");
    expect_load_refused(VALUE_STATE "{\"state\": \"w\", \"kind\": \"value\", \"key\": \"k\", "
                                    "\"value\": \"x\"}\n",
                        2, "state");
    expect_load_refused(VALUE_STATE "{\"declare\": \"v\", \"kind\": \"list\"}\n", 2, "declare");
}

Test(tool, load_refuses_an_entry_without_what_its_kind_needs)
{
    expect_load_refused(VALUE_STATE
                        "{\"kg\": 0, \"state\": \"v\", \"kind\": \"value\", \"key\": \"k\", "
                        "\"namespace\": \"\"}\n",
                        2, "value");
    expect_load_refused(VALUE_STATE "{\"state\": \"v\", \"kind\": \"value\", \"value\": \"x\"}\n",
                        2, "key");
    expect_load_refused("{\"declare\": \"m\", \"kind\": \"map\"}\n"
                        "{\"state\": \"m\", \"kind\": \"map\", \"key\": \"k\", \"value\": \"x\"}\n",
                        2, "map_key");
    expect_load_refused("{\"declare\": \"t\", \"kind\": \"timers\"}\n"
                        "{\"state\": \"t\", \"kind\": \"timers\", \"key\": \"k\", \"domain\": "
                        "\"event-time\", \"namespace\": \"\"}\n",
                        2, "timestamp");
    expect_load_refused("{\"kind\": \"value\", \"key\": \"k\", \"value\": \"x\"}\n", 1, "state");
    expect_load_refused("{\"declare\": \"v\"}\n", 1, "kind");
}

Test(tool, load_refuses_a_field_that_means_nothing_for_the_kind)
{
    /* An index on a value; a list's index that is no integer. */
    expect_load_refused(VALUE_STATE "{\"state\": \"v\", \"kind\": \"value\", \"key\": \"k\", "
                                    "\"namespace\": \"\", \"index\": 0, \"value\": \"x\"}\n",
                        2, "index");
    expect_load_refused("{\"declare\": \"l\", \"kind\": \"list\"}\n"
                        "{\"state\": \"l\", \"kind\": \"list\", \"key\": \"k\", \"namespace\": "
                        "\"\", \"index\": [0], \"value\": \"x\"}\n",
                        2, "index");
    expect_load_refused("{\"declare\": \"l\", \"kind\": \"list\"}\n"
                        "{\"state\": \"l\", \"kind\": \"list\", \"key\": \"k\", \"map_key\": "
                        "\"m\", \"value\": \"x\"}\n",
                        2, "map_key");
    expect_load_refused("{\"declare\": \"t\", \"kind\": \"timers\"}\n"
                        "{\"state\": \"t\", \"kind\": \"timers\", \"key\": \"k\", \"domain\": "
                        "\"event-time\", \"timestamp\": 5, \"value\": \"x\"}\n",
                        2, "value");
    expect_load_refused(VALUE_STATE "{\"state\": \"v\", \"kind\": \"value\", \"key\": \"k\", "
                                    "\"value\": \"x\", \"ttl_ms\": 5}\n",
                        2, "ttl_ms");
    expect_load_refused("{\"snapshot\": 1, \"max_parallelism\": 8, \"op_parallelism\": 1}\n"
                        "{\"declare\": \"o\", \"kind\": \"op-list\"}\n"
                        "{\"state\": \"o\", \"kind\": \"op-list\", \"worker\": 0, \"key\": "
                        "\"k\", \"value\": \"x\"}\n",
                        3, "key");
    expect_load_refused(VALUE_STATE "{\"state\": \"v\", \"kind\": \"value\", \"worker\": 0, "
                                    "\"value\": \"x\"}\n",
                        2, "worker");
    expect_load_refused("{\"declare\": \"t\", \"kind\": \"timers\", \"ttl_ms\": 1000}\n", 1,
                        "ttl_ms");
    expect_load_refused("{\"declare\": \"v\", \"kind\": \"value\", \"ttl_update\": 1}\n", 1,
                        "ttl_update");
}

Test(tool, load_refuses_a_ttl_that_is_negative_or_out_of_range)
{
    const char *ttl_state = "{\"declare\": \"v\", \"kind\": \"value\", \"ttl_ms\": 60000}\n";
    char lines[400];
    snprintf(lines, sizeof lines,
             "%s{\"state\": \"v\", \"kind\": \"value\", \"key\": \"k\", \"namespace\": \"\", "
             "\"value\": \"x\", \"ttl_ms\": -1}\n",
             ttl_state);
    expect_load_refused(lines, 2, "ttl_ms");
    snprintf(lines, sizeof lines,
             "%s{\"state\": \"v\", \"kind\": \"value\", \"key\": \"k\", \"namespace\": \"\", "
             "\"value\": \"x\", \"ttl_ms\": 18446744073709551616}\n",
             ttl_state);
    expect_load_refused(lines, 2, "ttl_ms");
    expect_load_refused("{\"declare\": \"v\", \"kind\": \"value\", \"ttl_ms\": -1}\n", 1, "ttl_ms");
    expect_load_refused("{\"declare\": \"v\", \"kind\": \"value\", \"ttl_ms\": 60000, "
                        "\"ttl_update\": 2}\n",
                        1, "ttl_update");
    expect_load_refused("{\"declare\": \"v\", \"kind\": \"value\", \"ttl_ms\": 60000, "
                        "\"ttl_event_time\": -1}\n",
                        1, "ttl_event_time");
}

Test(tool, load_refuses_an_unknown_or_repeated_field)
{
    expect_load_refused("{\"declare\": \"v\", \"kind\": \"value\", \"colour\": \"red\"}\n", 1,
                        "colour");
    expect_load_refused(VALUE_STATE "{\"state\": \"v\", \"kind\": \"value\", \"key\": \"k\", "
                                    "\"value\": \"x\", \"value\": \"y\"}\n",
                        2, "value");
    expect_load_refused("{\"snapshot\": 1, \"max_parallelism\": 8, \"op_parallelism\": 0, "
                        "\"base\": 0}\n",
                        1, "base");
}

Test(tool, load_refuses_a_timer_domain_and_a_worker_it_does_not_know)
{
    expect_load_refused("{\"declare\": \"t\", \"kind\": \"timers\"}\n"
                        "{\"state\": \"t\", \"kind\": \"timers\", \"key\": \"k\", \"domain\": "
                        "\"wall-time\", \"timestamp\": 5, \"namespace\": \"\"}\n",
                        2, "domain");
    expect_load_refused("{\"snapshot\": 1, \"max_parallelism\": 8, \"op_parallelism\": 2}\n"
                        "{\"declare\": \"o\", \"kind\": \"op-list\"}\n"
                        "{\"state\": \"o\", \"kind\": \"op-list\", \"worker\": 2, \"index\": 0, "
                        "\"value\": \"x\"}\n",
                        3, "worker");
}

Test(tool, load_refuses_a_broadcast_key_given_twice_to_one_worker)
{
    const char *entry = "{\"state\": \"b\", \"kind\": \"broadcast\", \"worker\": %d, "
                        "\"map_key\": \"k\", \"value\": \"%d\"}\n";
    char lines[600];
    int at = snprintf(lines, sizeof lines,
                      "{\"snapshot\": 1, \"max_parallelism\": 8, \"op_parallelism\": 2}\n"
                      "{\"declare\": \"b\", \"kind\": \"broadcast\"}\n");
    at += snprintf(lines + at, sizeof lines - (size_t)at, entry, 0, 1);
    at += snprintf(lines + at, sizeof lines - (size_t)at, entry, 1, 1);
    cr_assert_eq(load_lines("sp-broadcast", lines), 0, "one key for each worker: %s", out);
    snprintf(lines + at, sizeof lines - (size_t)at, entry, 0, 2);
    expect_load_refused(lines, 5, "map_key");
}

Test(tool, load_takes_the_snapshot_line_only_first)
{
    expect_load_refused(VALUE_STATE
                        "{\"snapshot\": 1, \"max_parallelism\": 8, \"op_parallelism\": 0}\n",
                        2, "snapshot");
}

Test(tool, load_takes_every_kind_as_dump_writes_it_and_dumps_it_again)
{
    const char *lines =
        "{\"snapshot\": 4, \"max_parallelism\": 8, \"op_parallelism\": 2}\n"
        "{\"declare\": \"v\", \"kind\": \"value\"}\n"
        "{\"declare\": \"l\", \"kind\": \"list\", \"ttl_ms\": 60000, \"ttl_update\": 1, "
        "\"ttl_visibility\": 1, \"ttl_cleanup_full_snapshot\": 0, \"ttl_event_time\": 1}\n"
        "{\"declare\": \"m\", \"kind\": \"map\"}\n"
        "{\"declare\": \"r\", \"kind\": \"reducing\"}\n"
        "{\"declare\": \"t\", \"kind\": \"timers\"}\n"
        "{\"declare\": \"o\", \"kind\": \"op-union\"}\n"
        "{\"declare\": \"b\", \"kind\": \"broadcast\"}\n"
        "{\"kg\": 3, \"state\": \"v\", \"kind\": \"value\", \"key\": \"k\", \"namespace\": \"n\", "
        "\"value\": \"a\\u0000b\"}\n"
        "{\"kg\": 3, \"state\": \"l\", \"kind\": \"list\", \"key\": \"k\", \"namespace\": \"\", "
        "\"index\": 0, \"value\": \"e\", \"ttl_ms\": 17}\n"
        "{\"kg\": 3, \"state\": \"m\", \"kind\": \"map\", \"key\": \"k\", \"namespace\": \"\", "
        "\"map_key\": \"mk\", \"value\": \"mv\"}\n"
        "{\"kg\": 3, \"state\": \"r\", \"kind\": \"reducing\", \"key\": \"k\", \"namespace\": "
        "\"\", \"value\": \"acc\"}\n"
        "{\"kg\": 3, \"state\": \"t\", \"kind\": \"timers\", \"key\": \"k\", \"domain\": "
        "\"processing-time\", \"timestamp\": 99, \"namespace\": \"w\"}\n"
        "{\"state\": \"o\", \"kind\": \"op-union\", \"worker\": 1, \"index\": 0, \"value\": "
        "\"u\"}\n"
        "{\"state\": \"b\", \"kind\": \"broadcast\", \"worker\": 0, \"map_key\": \"bk\", "
        "\"value\": \"bv\"}\n"
        "{\"state\": \"t\", \"kind\": \"timers\", \"worker\": 0, \"watermark\": 7}\n";
    cr_assert_eq(load_lines("sp-every-kind", lines), 0, "%s", out);
    char args[400];
    snprintf(args, sizeof args, "snapshot dump %s/sp-every-kind --format text", dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    /* Each line again, the key groups recomputed from the keys. */
    const char *again[] = {
        "\"state\": \"v\", \"kind\": \"value\", \"key\": \"k\", \"namespace\": \"n\", \"value\": "
        "\"a\\u0000b\"}",
        "\"index\": 0, \"value\": \"e\", \"ttl_ms\": 17}",
        "\"map_key\": \"mk\", \"value\": \"mv\"}",
        "\"domain\": \"processing-time\", \"timestamp\": 99, \"namespace\": \"w\"}",
        "\"ttl_ms\": 60000, \"ttl_update\": 1, \"ttl_visibility\": 1, "
        "\"ttl_cleanup_full_snapshot\": 0, \"ttl_event_time\": 1}",
        "{\"state\": \"o\", \"kind\": \"op-union\", \"worker\": 1, \"index\": 0, \"value\": "
        "\"u\"}",
        "{\"state\": \"t\", \"kind\": \"timers\", \"worker\": 0, \"watermark\": 7}",
        "{\"snapshot\": 4, \"max_parallelism\": 8, \"op_parallelism\": 2}"};
    for (size_t i = 0; i < sizeof again / sizeof again[0]; i++)
        cr_assert(strstr(out, again[i]), "%s in %s", again[i], out);
}

/* The writer load runs refuses, as load does, what no reader would take. */
Test(tool, the_snapshot_writer_refuses_what_a_reader_would_refuse)
{
    char to[200];
    snprintf(to, sizeof to, "%s/sp-writer", dir);
    stash_snapshot_writer *w;
    cr_assert_eq(stash_snapshot_writer_open(
                     to,
                     &(stash_snapshot_writer_opts){.sz = sizeof(stash_snapshot_writer_opts),
                                                   .id = CKPT_MAX_ID + 1},
                     &w),
                 0, "%s", stash_errmsg());
    cr_assert_eq(stash_snapshot_writer_commit(w, NULL), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "id"), "%s", stash_errmsg());
    cr_assert_eq(access(to, F_OK), -1);
    cr_assert_eq(stash_snapshot_writer_open(
                     to,
                     &(stash_snapshot_writer_opts){.sz = sizeof(stash_snapshot_writer_opts),
                                                   .op_parallelism = STASH_MAX_WORKERS + 1},
                     &w),
                 0, "%s", stash_errmsg());
    cr_assert_eq(stash_snapshot_writer_commit(w, NULL), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "workers"), "%s", stash_errmsg());
    cr_assert_eq(access(to, F_OK), -1);
    cr_assert_eq(stash_snapshot_writer_open(
                     to,
                     &(stash_snapshot_writer_opts){.sz = sizeof(stash_snapshot_writer_opts),
                                                   .op_parallelism = 1},
                     &w),
                 0, "%s", stash_errmsg());
    cr_assert_eq(stash_snapshot_writer_state(w, &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                                    .name = "t",
                                                                    .kind = STASH_TIMERS,
                                                                    .ttl = {.ttl_ms = 1000}}),
                 -EINVAL, "a timer service takes no TTL");
    cr_assert_eq(stash_snapshot_writer_state(w, &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                                    .name = "",
                                                                    .kind = STASH_VALUE}),
                 -EINVAL);
    cr_assert_eq(
        stash_snapshot_writer_state(
            w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "x", .kind = 0}),
        -EINVAL);
    /* Operator state past what metadata may hold. */
    cr_assert_eq(stash_snapshot_writer_state(w, &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                                    .name = "o",
                                                                    .kind = STASH_OP_LIST}),
                 0);
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

/* Whether dir holds an entry whose name starts with prefix. */
static bool holds(const char *prefix)
{
    DIR *d = opendir(dir);
    bool found = false;
    for (struct dirent *de; d && !found && (de = readdir(d));)
        found = strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    if (d) closedir(d);
    return found;
}

Test(tool, what_a_killed_load_left_beside_its_destination_goes_with_the_next_load)
{
    char dest[200];
    snprintf(dest, sizeof dest, "%s/killed", dir);
    int in[2];
    cr_assert_eq(pipe(in), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(in[0], 0);
        close(in[1]);
        execl(STASH_BIN, "stash", "snapshot", "load", dest, "--format", "text", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    /* An entry opens its writer; stdin left open keeps it writing. */
    const char *lines = VALUE_STATE "{\"state\": \"v\", \"kind\": \"value\", \"key\": \"k\", "
                                    "\"namespace\": \"\", \"value\": \"x\"}\n";
    cr_assert_eq(write(in[1], lines, strlen(lines)), (ssize_t)strlen(lines));
    for (int i = 0; i < 60000 && !holds(".killed.writing-"); i++) usleep(1000);
    cr_assert(holds(".killed.writing-"), "the load writes beside its destination");
    kill(pid, SIGKILL);
    test_wait(pid);
    close(in[1]);
    cr_assert(holds(".killed.writing-"), "what the killed load was writing is there");
    /* The next load, to any destination there, removes it. */
    cr_assert_eq(load_lines("after", VALUE_STATE), 0, "%s", out);
    cr_assert(!holds(".killed.writing-"), "what the killed load left is gone");
    cr_assert(!holds("killed"), "nothing at its destination");
}
