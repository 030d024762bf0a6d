/* SPDX-License-Identifier: MIT */
/*
 * test_snapshot_api.c: stash_snapshot_*: a checkpoint read offline, every
 * keyed kind decoded (a list element by element, a map entry by entry, a
 * value's TTL time, a timer's domain and time), on the backend the tests
 * run on; damage and bad arguments refused, naming what is wrong.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "include/stash.h"
#include "tests/helpers.h"

#define KEYS 50u
#define MAXP 128u

static uint32_t maxp = MAXP; /* of the snapshot a scan reads */

static char name[96], dir[128], chk[256];

/* A job's state in every keyed kind, checkpointed once into dir. */
static void write_job(void)
{
    snprintf(dir, sizeof dir, "/tmp/stash-test-snapapi-%d", (int)getpid());
    test_remove_dir(dir);
    mkdir(dir, 0700);
    stash_arena *a = test_arena_create("snapapi", 32u << 20, MAXP, name);
    stash_service *svc;
    cr_assert_eq(
        stash_service_start(
            name, &(stash_service_opts){.sz = sizeof(stash_service_opts), .dir = dir}, &svc),
        0, "%s", stash_errmsg());
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    stash_state *v, *l, *m, *r, *t;
    stash_state_desc dv = {.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
                     dl = {.sz = sizeof(stash_state_desc), .name = "l", .kind = STASH_LIST},
                     dm = {.sz = sizeof(stash_state_desc), .name = "m", .kind = STASH_MAP},
                     dr = {.sz = sizeof(stash_state_desc),
                           .name = "r",
                           .kind = STASH_REDUCING,
                           .reduce = test_sum_reduce},
                     dt = {.sz = sizeof(stash_state_desc),
                           .name = "t",
                           .kind = STASH_VALUE,
                           .ttl = {.ttl_ms = 3600000}};
    cr_assert_eq(stash_state_get(w, &dv, &v), 0);
    cr_assert_eq(stash_state_get(w, &dl, &l), 0);
    cr_assert_eq(stash_state_get(w, &dm, &m), 0);
    cr_assert_eq(stash_state_get(w, &dr, &r), 0);
    cr_assert_eq(stash_state_get(w, &dt, &t), 0);
    stash_timers *tm;
    cr_assert_eq(stash_timers_get(w, "windows", &tm), 0);
    stash_state *offsets;
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "offsets",
                                                     .kind = STASH_OP_LIST},
                                 &offsets),
                 0);
    cr_assert_eq(stash_op_list_add(offsets, "offset-42", 9), 0);
    for (uint64_t k = 0; k < KEYS; k++) {
        uint64_t twice = 2 * k;
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_put(v, &twice, sizeof twice), 0);
    }
    uint64_t k = 1;
    stash_key_set(w, &k, sizeof k);
    cr_assert_eq(stash_list_add(l, "a", 1), 0);
    cr_assert_eq(stash_list_add(l, "bb", 2), 0);
    cr_assert_eq(stash_list_add(l, "ccc", 3), 0);
    cr_assert_eq(stash_merging_add(r, &k, sizeof k), 0);
    cr_assert_eq(stash_merging_add(r, &k, sizeof k), 0);
    cr_assert_eq(stash_value_put(t, "fresh", 5), 0);
    cr_assert_eq(stash_timer_register(tm, STASH_EVENT_TIME, "w", 1, 1234), 0);
    k = 2;
    stash_key_set(w, &k, sizeof k);
    cr_assert_eq(stash_state_namespace(m, "n", 1), 0);
    cr_assert_eq(stash_map_put(m, "k1", 2, "one", 3), 0);
    cr_assert_eq(stash_map_put(m, "k2", 2, "two", 3), 0);
    cr_assert_eq(stash_map_put(m, "k3", 2, "three", 5), 0);
    cr_assert_eq(stash_map_remove(m, "k3", 2), 0);
    stash_checkpoint_info info;
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
    snprintf(chk, sizeof chk, "%s", info.detail);
    stash_worker_close(w);
    stash_service_stop(svc);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

static void drop_job(void)
{
    test_remove_dir(dir);
}

TestSuite(snapshot_api, .init = write_job, .fini = drop_job, .timeout = 120);

/* What a scan met, kind by kind. */
typedef struct seen {
    unsigned values, elements, entries, reduced, timers, ttl, map_ttl;
    uint64_t value_of_7;
    char list[3][8];
    char map[2][16];
    uint64_t reduced_sum, timer_ts;
    bool event_time, namespace_n;
    int stop_after; /* > 0: return 99 at that entry */
} seen;

static int take(void *ctx, const stash_snapshot_entry *e)
{
    seen *s = ctx;
    if (s->stop_after && --s->stop_after == 0) return 99;
    uint64_t key = e->key.len == 8 ? test_u64(e->key.data) : UINT64_MAX;
    if (strcmp(e->state, "v") == 0 || strcmp(e->state, "v2") == 0) {
        cr_assert_eq(e->kind, STASH_VALUE);
        cr_assert_eq(test_u64(e->value.data), 2 * key);
        cr_assert_eq(e->kg, (uint32_t)stash_key_group(e->key.data, e->key.len, maxp));
        if (key == 7) s->value_of_7 = test_u64(e->value.data);
        s->values++;
    } else if (strcmp(e->state, "l") == 0) {
        cr_assert_eq(e->kind, STASH_LIST);
        cr_assert_lt(e->index, 3);
        snprintf(s->list[e->index], sizeof s->list[0], "%.*s", (int)e->value.len,
                 (const char *)e->value.data);
        s->elements++;
    } else if (strcmp(e->state, "m") == 0) {
        cr_assert_eq(e->kind, STASH_MAP);
        s->namespace_n = e->ns.len == 1 && memcmp(e->ns.data, "n", 1) == 0;
        s->map_ttl += e->ttl_ms > 0;
        snprintf(s->map[s->entries < 2 ? s->entries : 1], sizeof s->map[0], "%.*s=%.*s",
                 (int)e->map_key.len, (const char *)e->map_key.data, (int)e->value.len,
                 (const char *)e->value.data);
        s->entries++;
    } else if (strcmp(e->state, "r") == 0) {
        s->reduced_sum = test_u64(e->value.data);
        s->reduced++;
    } else if (strcmp(e->state, "t") == 0) {
        cr_assert_eq(e->value.len, 5, "the value without its TTL time");
        cr_assert_eq(memcmp(e->value.data, "fresh", 5), 0);
        s->ttl += e->ttl_ms > 0;
    } else if (e->kind == STASH_TIMERS) {
        s->timer_ts = e->timestamp;
        s->event_time = e->domain == STASH_EVENT_TIME && e->ns.len == 1;
        s->timers++;
    }
    return 0;
}

Test(snapshot_api, every_keyed_kind_is_decoded)
{
    stash_snapshot *snap;
    cr_assert_eq(stash_snapshot_open(chk, &snap), 0, "%s", stash_errmsg());
    stash_snapshot_info info;
    cr_assert_eq(stash_snapshot_info_get(snap, &info), 0);
    cr_assert_eq(info.max_parallelism, MAXP);
    cr_assert_eq(info.base_id, 0);
    cr_assert_gt(info.id, 0);
    cr_assert_eq(info.op_parallelism, 1);
    bool found_t = false, found_m = false;
    for (uint32_t i = 0; i < info.nstates; i++) {
        stash_state_desc d;
        cr_assert_eq(stash_snapshot_state(snap, i, &d), 0);
        if (strcmp(d.name, "t") == 0) found_t = d.ttl.ttl_ms == 3600000 && d.kind == STASH_VALUE;
        if (strcmp(d.name, "m") == 0) found_m = d.kind == STASH_MAP && d.ttl.ttl_ms == 0;
    }
    cr_assert(found_t && found_m, "the states with their kinds and TTL");
    seen s = {0};
    cr_assert_eq(stash_snapshot_scan(snap, (stash_kg_range){0, MAXP - 1}, take, &s), 0, "%s",
                 stash_errmsg());
    cr_assert_eq(s.values, KEYS);
    cr_assert_eq(s.value_of_7, 14);
    cr_assert_eq(s.elements, 3);
    cr_assert_str_eq(s.list[0], "a");
    cr_assert_str_eq(s.list[1], "bb");
    cr_assert_str_eq(s.list[2], "ccc");
    cr_assert_eq(s.entries, 2, "the removed entry is not given");
    cr_assert_eq(s.map_ttl, 0, "no TTL, no time");
    cr_assert(s.namespace_n);
    cr_assert((strcmp(s.map[0], "k1=one") == 0 && strcmp(s.map[1], "k2=two") == 0) ||
                  (strcmp(s.map[0], "k2=two") == 0 && strcmp(s.map[1], "k1=one") == 0),
              "%s %s", s.map[0], s.map[1]);
    cr_assert_eq(s.reduced, 1);
    cr_assert_eq(s.reduced_sum, 2);
    cr_assert_eq(s.ttl, 1);
    cr_assert_eq(s.timers, 1);
    cr_assert_eq(s.timer_ts, 1234);
    cr_assert(s.event_time);
    /* One key group alone gives only its keys; a function's non-zero stops the scan. */
    uint64_t seven = 7;
    uint32_t kg = (uint32_t)stash_key_group(&seven, sizeof seven, MAXP);
    seen one = {0};
    cr_assert_eq(stash_snapshot_scan(snap, (stash_kg_range){kg, kg}, take, &one), 0);
    cr_assert_eq(one.value_of_7, 14);
    cr_assert_lt(one.values, KEYS);
    seen stop = {.stop_after = 5};
    cr_assert_eq(stash_snapshot_scan(snap, (stash_kg_range){0, MAXP - 1}, take, &stop), 99);
    stash_snapshot_close(snap);
}

Test(snapshot_api, bad_arguments_are_refused)
{
    stash_snapshot *snap;
    cr_assert_eq(stash_snapshot_open(NULL, &snap), -EINVAL);
    cr_assert_eq(stash_snapshot_open(chk, NULL), -EINVAL);
    cr_assert_eq(stash_snapshot_open("/nonexistent/chk-1", &snap), -ENOENT);
    cr_assert_eq(stash_snapshot_open(chk, &snap), 0, "%s", stash_errmsg());
    seen s = {0};
    stash_snapshot_info info;
    stash_state_desc d;
    cr_assert_eq(stash_snapshot_scan(snap, (stash_kg_range){0, MAXP}, take, &s), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "of a snapshot of 128"), "%s", stash_errmsg());
    cr_assert_eq(stash_snapshot_scan(snap, (stash_kg_range){3, 2}, take, &s), -EINVAL);
    cr_assert_eq(stash_snapshot_scan(NULL, (stash_kg_range){0, 1}, take, &s), -EINVAL);
    cr_assert_eq(stash_snapshot_scan(snap, (stash_kg_range){0, 1}, NULL, &s), -EINVAL);
    cr_assert_eq(stash_snapshot_info_get(NULL, &info), -EINVAL);
    cr_assert_eq(stash_snapshot_state(snap, 1000, &d), -EINVAL);
    cr_assert_eq(stash_snapshot_state(snap, 0, NULL), -EINVAL);
    stash_snapshot_close(snap);
    stash_snapshot_close(NULL);
}

Test(snapshot_api, a_damaged_data_file_is_refused_naming_file_and_offset)
{
    char path[400];
    snprintf(path, sizeof path, "%s/kg-data.dat", chk);
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size / 2, SEEK_SET);
    int c = fgetc(f);
    fseek(f, size / 2, SEEK_SET);
    fputc(c ^ 0x5a, f);
    fclose(f);
    stash_snapshot *snap = NULL;
    cr_assert_eq(stash_snapshot_open(chk, &snap), STASH_ECORRUPT);
    cr_assert_null(snap);
    cr_assert(strstr(stash_errmsg(), "kg-data.dat") && strstr(stash_errmsg(), "offset"), "%s",
              stash_errmsg());
}

Test(snapshot_api, dump_prints_a_line_per_element_and_entry)
{
    static char out[65536];
    char args[512];
    snprintf(args, sizeof args, "snapshot dump %s --format text", chk);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"kind\": \"list\", \"key\": \"\\u0001\\u0000\\u0000\\u0000\\u0000"
                          "\\u0000\\u0000\\u0000\", \"namespace\": \"\", \"index\": 1, "
                          "\"value\": \"bb\"}"),
              "%.3000s", out);
    cr_assert(strstr(out, "\"namespace\": \"n\", \"map_key\": \"k1\", \"value\": \"one\"}"),
              "%.3000s", out);
    cr_assert(!strstr(out, "three"), "a removed entry is not dumped");
    cr_assert(strstr(out, "\"value\": \"fresh\", \"ttl_ms\": "), "%.3000s", out);
    cr_assert(strstr(out, "\"domain\": \"event-time\", \"timestamp\": 1234, \"namespace\": \"w\"}"),
              "%.3000s", out);
    int lines = 0; /* keyed entries; then the operator state's one element */
    for (char *p = out; (p = strstr(p, "{\"kg\": ")); p++) lines++;
    cr_assert_eq(lines, KEYS + 3 + 2 + 1 + 1 + 1, "%s", out);
    cr_assert(strstr(out, "{\"snapshot\": ") && strstr(out, "\"max_parallelism\": 128"), "%s", out);
    cr_assert(strstr(out, "{\"declare\": \"t\", \"kind\": \"value\", \"ttl_ms\": 3600000"), "%s",
              out);
    cr_assert(strstr(out, "{\"state\": \"offsets\", \"kind\": \"op-list\", \"worker\": 0, "
                          "\"index\": 0, \"value\": \"offset-42\"}"),
              "%s", out);
    snprintf(args, sizeof args, "snapshot dump %s --format octal", chk);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "'octal'"), "%s", out);
}

/* Scans the snapshot at path, of n key groups, into what it met. */
static seen scan_all(const char *path, uint32_t n)
{
    stash_snapshot *snap;
    cr_assert_eq(stash_snapshot_open(path, &snap), 0, "%s: %s", path, stash_errmsg());
    stash_snapshot_info info;
    stash_snapshot_info_get(snap, &info);
    cr_assert_eq(info.max_parallelism, n);
    seen s = {0};
    maxp = n;
    cr_assert_eq(stash_snapshot_scan(snap, (stash_kg_range){0, n - 1}, take, &s), 0, "%s",
                 stash_errmsg());
    maxp = MAXP;
    stash_snapshot_close(snap);
    return s;
}

/* A job started from the savepoint at sp, on the backend of the tests: its
 * arena's name (the fixture's and suffix) in job. */
typedef struct restored {
    char job[128];
    stash_arena_opts ao;
    stash_service *svc;
} restored;

static void restore_job(restored *r, const char *sp, const char *suffix)
{
    char sdir[300];
    snprintf(r->job, sizeof r->job, "%s-%s", name, suffix);
    snprintf(sdir, sizeof sdir, "%s/%s-svc", dir, suffix);
    r->ao = (stash_arena_opts){.sz = sizeof(stash_arena_opts), .backend = test_backend()};
    cr_assert_eq(stash_service_start(r->job,
                                     &(stash_service_opts){.sz = sizeof(stash_service_opts),
                                                           .dir = sdir,
                                                           .restore = sp,
                                                           .arena = &r->ao},
                                     &r->svc),
                 0, "%s", stash_errmsg());
}

static void end_job(restored *r)
{
    stash_service_stop(r->svc);
    stash_arena_destroy(r->job, &r->ao);
}

Test(snapshot_api, rewrite_moves_every_key_to_its_key_group_at_another_max_parallelism)
{
    char to256[300], to96[300], args[1024];
    static char out[16384];
    snprintf(to256, sizeof to256, "%s/sp-256", dir);
    snprintf(to96, sizeof to96, "%s/sp-96", dir);
    snprintf(args, sizeof args, "snapshot rewrite %s %s --max-parallelism 256", chk, to256);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "256 key groups"), "%s", out);
    snprintf(args, sizeof args, "snapshot rewrite %s %s --max-parallelism=96", to256, to96);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    snprintf(args, sizeof args, "snapshot verify %s", to96);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    /* Every entry, each in its key group of 96 (take checks it). */
    seen s = scan_all(to96, 96);
    cr_assert_eq(s.values, KEYS);
    cr_assert_eq(s.elements, 3);
    cr_assert_str_eq(s.list[1], "bb");
    cr_assert_eq(s.entries, 2);
    cr_assert_eq(s.reduced_sum, 2);
    cr_assert_eq(s.ttl, 1, "the TTL time kept");
    cr_assert_eq(s.timers, 1);
    cr_assert_eq(s.timer_ts, 1234);
    /* It restores, at another parallelism, with its operator state. */
    restored r;
    restore_job(&r, to96, "restored");
    const char *name2 = r.job;
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            name2,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 1, .parallelism = 2},
            &w),
        0, "%s", stash_errmsg());
    stash_state *v;
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &v),
        0);
    stash_worker_info me;
    stash_worker_info_get(w, &me);
    unsigned mine = 0;
    for (uint64_t k = 0; k < KEYS; k++) {
        stash_key_set(w, &k, sizeof k);
        if (!stash_kg_range_contains(me.range, (uint32_t)stash_key_group_current(w))) continue;
        stash_bytes b;
        cr_assert_eq(stash_value_get(v, &b), 0, "key %llu", (unsigned long long)k);
        cr_assert_eq(test_u64(b.data), 2 * k);
        mine++;
    }
    cr_assert_gt(mine, 0);
    stash_state *offsets;
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "offsets",
                                                     .kind = STASH_OP_LIST},
                                 &offsets),
                 0);
    const stash_bytes *el;
    size_t n;
    cr_assert_eq(stash_op_list_get(offsets, &el, &n), 0);
    stash_worker_close(w);
    stash_worker *w0;
    cr_assert_eq(
        stash_worker_open(
            name2,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 2},
            &w0),
        0);
    stash_state *offsets0;
    cr_assert_eq(stash_state_get(w0,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "offsets",
                                                     .kind = STASH_OP_LIST},
                                 &offsets0),
                 0);
    const stash_bytes *el0;
    size_t n0;
    cr_assert_eq(stash_op_list_get(offsets0, &el0, &n0), 0);
    cr_assert_eq(n + n0, 1, "the one element dealt to one of the two");
    const stash_bytes *one = n ? &el[0] : &el0[0];
    cr_assert(one->len == 9 && memcmp(one->data, "offset-42", 9) == 0);
    stash_worker_close(w0);
    end_job(&r);
}

Test(snapshot_api, rewrite_drops_renames_and_sets_ttl)
{
    char to[300], args[1024];
    static char out[16384];
    snprintf(to, sizeof to, "%s/sp-changed", dir);
    snprintf(args, sizeof args,
             "snapshot rewrite %s %s --drop-state r --rename-state v=v2 --ttl t=none --ttl m=1h",
             chk, to);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    seen s = scan_all(to, MAXP);
    cr_assert_eq(s.reduced, 0, "r dropped");
    cr_assert_eq(s.values, KEYS, "v's entries under v2");
    cr_assert_eq(s.ttl, 0, "t without TTL");
    cr_assert_eq(s.entries, 2);
    cr_assert_eq(s.map_ttl, 2, "entries of a state given a TTL are stamped");
    stash_snapshot *snap;
    cr_assert_eq(stash_snapshot_open(to, &snap), 0);
    stash_snapshot_info info;
    stash_snapshot_info_get(snap, &info);
    bool v2 = false, v = false, r = false, m_ttl = false;
    for (uint32_t i = 0; i < info.nstates; i++) {
        stash_state_desc d;
        stash_snapshot_state(snap, i, &d);
        v2 |= strcmp(d.name, "v2") == 0;
        v |= strcmp(d.name, "v") == 0;
        r |= strcmp(d.name, "r") == 0;
        m_ttl |= strcmp(d.name, "m") == 0 && d.ttl.ttl_ms == 3600000;
    }
    stash_snapshot_close(snap);
    cr_assert(v2 && !v && !r && m_ttl);
    /* Refusals: nothing written. */
    char to2[300];
    snprintf(to2, sizeof to2, "%s/sp-refused", dir);
    const char *bad[] = {"--drop-state nosuch", "--rename-state v", "--rename-state nosuch=x",
                         "--max-parallelism 0", "--ttl t=soon",     "--frobnicate"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "snapshot rewrite %s %s %s", chk, to2, bad[i]);
        int rc = test_run_stash(args, out, sizeof out);
        cr_assert(rc == 2 || rc == 1, "%s: %d %s", bad[i], rc, out);
        cr_assert_eq(access(to2, F_OK), -1, "%s left %s", bad[i], to2);
    }
    snprintf(args, sizeof args, "snapshot rewrite %s %s", chk, to);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "exists already"), "%s", out);
}

Test(snapshot_api, a_savepoint_is_bootstrapped_from_scratch)
{
    char to[300];
    snprintf(to, sizeof to, "%s/sp-bootstrap", dir);
    stash_snapshot_writer *w;
    cr_assert_eq(stash_snapshot_writer_open(
                     to,
                     &(stash_snapshot_writer_opts){.sz = sizeof(stash_snapshot_writer_opts),
                                                   .max_parallelism = 32,
                                                   .size = 16u << 20,
                                                   .id = 7},
                     &w),
                 0, "%s", stash_errmsg());
    cr_assert_eq(stash_snapshot_writer_state(w, &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                                    .name = "v",
                                                                    .kind = STASH_VALUE}),
                 0);
    cr_assert_eq(
        stash_snapshot_writer_state(
            w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_MAP}),
        STASH_EKIND);
    for (uint64_t k = 0; k < KEYS; k++) {
        uint64_t twice = 2 * k;
        stash_snapshot_entry e = {.state = "v", .key = {&k, sizeof k}, .value = {&twice, 8}};
        cr_assert_eq(stash_snapshot_writer_put(w, &e), 0, "%s", stash_errmsg());
    }
    /* Deleted again before the commit: key 3. */
    uint64_t three = 3;
    cr_assert_eq(stash_snapshot_writer_delete(
                     w, &(stash_snapshot_entry){.state = "v", .key = {&three, sizeof three}}),
                 0, "%s", stash_errmsg());
    uint64_t absent = 999;
    cr_assert_eq(stash_snapshot_writer_delete(
                     w, &(stash_snapshot_entry){.state = "v", .key = {&absent, sizeof absent}}),
                 0, "absent: no error");
    stash_snapshot_entry none = {.state = "nosuch", .key = {"k", 1}, .value = {"v", 1}};
    cr_assert_eq(stash_snapshot_writer_delete(w, &none), STASH_ENOTFOUND);
    cr_assert_eq(stash_snapshot_writer_put(w, &none), STASH_ENOTFOUND);
    cr_assert_eq(stash_snapshot_writer_put(NULL, &none), -EINVAL);
    stash_snapshot_info info;
    cr_assert_eq(stash_snapshot_writer_commit(w, &info), 0, "%s", stash_errmsg());
    cr_assert_eq(info.id, 7);
    seen s = scan_all(to, 32);
    cr_assert_eq(s.values, KEYS - 1);
    /* A job starts from it, at a parallelism of its own. */
    restored r;
    restore_job(&r, to, "boot");
    const char *job = r.job;
    unsigned found = 0;
    for (uint32_t i = 0; i < 3; i++) {
        stash_worker *wk;
        cr_assert_eq(
            stash_worker_open(
                job,
                &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = i, .parallelism = 3},
                &wk),
            0, "%s", stash_errmsg());
        stash_state *v;
        cr_assert_eq(stash_state_get(wk,
                                     &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                         .name = "v",
                                                         .kind = STASH_VALUE},
                                     &v),
                     0);
        stash_worker_info me;
        stash_worker_info_get(wk, &me);
        for (uint64_t k = 0; k < KEYS; k++) {
            stash_key_set(wk, &k, sizeof k);
            if (!stash_kg_range_contains(me.range, (uint32_t)stash_key_group_current(wk))) continue;
            stash_bytes b;
            if (k == 3) {
                cr_assert_eq(stash_value_get(v, &b), STASH_ENOTFOUND, "deleted");
                found++;
                continue;
            }
            cr_assert_eq(stash_value_get(v, &b), 0);
            cr_assert_eq(test_u64(b.data), 2 * k);
            found++;
        }
        stash_worker_close(wk);
    }
    cr_assert_eq(found, KEYS, "every key, each by the worker of its key group");
    end_job(&r);
    stash_snapshot_writer *again;
    cr_assert_eq(stash_snapshot_writer_open(to, NULL, &again), -EEXIST);
    char nowhere[300];
    snprintf(nowhere, sizeof nowhere, "%s/no/such/dir", dir);
    cr_assert_eq(stash_snapshot_writer_open(nowhere, NULL, &again), -ENOENT);
    /* Aborted, it leaves nothing behind. */
    char gone[300];
    snprintf(gone, sizeof gone, "%s/sp-aborted", dir);
    cr_assert_eq(stash_snapshot_writer_open(gone, NULL, &w), 0);
    stash_snapshot_writer_abort(w);
    cr_assert_eq(access(gone, F_OK), -1);
    stash_snapshot_writer_abort(NULL);
}

/* Empty elements and values of operator state (data NULL, len 0) go in and
 * come back empty. */
Test(snapshot_api, a_bootstrapped_savepoint_keeps_empty_operator_state)
{
    char to[300];
    snprintf(to, sizeof to, "%s/sp-empty-op", dir);
    stash_snapshot_writer *w;
    cr_assert_eq(stash_snapshot_writer_open(
                     to,
                     &(stash_snapshot_writer_opts){.sz = sizeof(stash_snapshot_writer_opts),
                                                   .op_parallelism = 1},
                     &w),
                 0, "%s", stash_errmsg());
    cr_assert_eq(stash_snapshot_writer_state(w, &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                                    .name = "u",
                                                                    .kind = STASH_OP_UNION}),
                 0);
    cr_assert_eq(stash_snapshot_writer_state(w, &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                                    .name = "b",
                                                                    .kind = STASH_OP_BROADCAST}),
                 0);
    stash_snapshot_entry e[] = {
        {.state = "u", .value = {NULL, 0}},
        {.state = "u", .value = {"x", 1}},
        {.state = "b", .map_key = {"k", 1}, .value = {NULL, 0}},
    };
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++)
        cr_assert_eq(stash_snapshot_writer_op_put(w, &e[i]), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_snapshot_writer_commit(w, NULL), 0, "%s", stash_errmsg());
    restored r;
    restore_job(&r, to, "empty-op");
    stash_worker *wk;
    cr_assert_eq(
        stash_worker_open(
            r.job,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 1},
            &wk),
        0, "%s", stash_errmsg());
    stash_state *u, *b;
    cr_assert_eq(stash_state_get(wk,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "u",
                                                     .kind = STASH_OP_UNION},
                                 &u),
                 0, "%s", stash_errmsg());
    cr_assert_eq(stash_state_get(wk,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "b",
                                                     .kind = STASH_OP_BROADCAST},
                                 &b),
                 0, "%s", stash_errmsg());
    const stash_bytes *el;
    size_t n;
    cr_assert_eq(stash_op_list_get(u, &el, &n), 0, "%s", stash_errmsg());
    cr_assert_eq(n, 2);
    cr_assert_eq(el[0].len, 0);
    cr_assert_eq(el[1].len, 1);
    cr_assert_eq(memcmp(el[1].data, "x", 1), 0);
    stash_bytes v;
    cr_assert_eq(stash_broadcast_get(b, "k", 1, &v), 0, "%s", stash_errmsg());
    cr_assert_eq(v.len, 0);
    stash_worker_close(wk);
    end_job(&r);
}

Test(snapshot_api, a_damaged_source_writes_nothing)
{
    char path[400], to[300], args[1024];
    static char out[16384];
    snprintf(path, sizeof path, "%s/kg-data.dat", chk);
    FILE *f = fopen(path, "r+b");
    fseek(f, 40, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 40, SEEK_SET);
    fputc(c ^ 0xff, f);
    fclose(f);
    snprintf(to, sizeof to, "%s/sp-from-damaged", dir);
    snprintf(args, sizeof args, "snapshot rewrite %s %s", chk, to);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "kg-data.dat") && strstr(out, "offset"), "%s", out);
    cr_assert_eq(access(to, F_OK), -1);
}

Test(snapshot_api, dump_then_load_round_trips_exactly_in_every_format)
{
    const char *formats[] = {"hex", "text", "base64"};
    for (int i = 0; i < 3; i++) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd,
                 "set -e; cd %s; B=%s; $B snapshot dump %s --format %s > dump-%s; "
                 "$B snapshot load sp-%s --format %s < dump-%s; "
                 "$B snapshot verify sp-%s; "
                 "$B snapshot dump sp-%s --format %s > again-%s; "
                 "sort dump-%s > a-%s; sort again-%s > b-%s; cmp a-%s b-%s",
                 dir, STASH_BIN, chk, formats[i], formats[i], formats[i], formats[i], formats[i],
                 formats[i], formats[i], formats[i], formats[i], formats[i], formats[i], formats[i],
                 formats[i], formats[i], formats[i]);
        cr_assert_eq(system(cmd), 0, "%s", cmd);
    }
    /* An edited line is taken: a value changed with any tool. */
    char cmd[2048], to[300];
    snprintf(to, sizeof to, "%s/sp-edited", dir);
    snprintf(cmd, sizeof cmd,
             "cd %s && sed 's/\"value\": \"fresh\"/\"value\": \"edited\"/' dump-text | "
             "%s snapshot load %s --format text",
             dir, STASH_BIN, to);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    static char out[65536];
    char args[1024];
    snprintf(args, sizeof args, "snapshot dump %s --format text", to);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"value\": \"edited\"") && !strstr(out, "fresh"), "%s", out);
    /* A line it cannot take is named, and nothing is written. */
    const char *bad[] = {"{\"state\": \"v\", \"kind\": \"value\", \"key\": \"zz\"}", "not json",
                         "{\"state\": \"nosuch\", \"kind\": \"value\", \"key\": \"00\"}",
                         "{\"declare\": \"v\", \"kind\": \"frob\"}"};
    for (int i = 0; i < 4; i++) {
        char gone[300], lines[300];
        snprintf(gone, sizeof gone, "%s/sp-bad-%d", dir, i);
        snprintf(lines, sizeof lines, "%s/bad-%d", dir, i);
        FILE *f = fopen(lines, "w");
        fprintf(f, "{\"declare\": \"v\", \"kind\": \"value\"}\n%s\n", bad[i]);
        fclose(f);
        snprintf(args, sizeof args, "snapshot load %s < %s", gone, lines);
        cr_assert_eq(test_run_stash(args, out, sizeof out), 1, "%s: %s", bad[i], out);
        cr_assert(strstr(out, "stdin line 2"), "%s: %s", bad[i], out);
        cr_assert_eq(access(gone, F_OK), -1);
    }
}

/* The list's elements and the map's entries of the snapshot at path: how
 * many carry a TTL time, and whether the values are what write_job put. */
typedef struct timed {
    unsigned elements, entries, stamped;
    bool values_kept;
} timed;

static int take_timed(void *ctx, const stash_snapshot_entry *e)
{
    timed *t = ctx;
    static const char *const list[] = {"a", "bb", "ccc"};
    if (strcmp(e->state, "l") == 0) {
        t->values_kept &= e->value.len == strlen(list[e->index]) &&
                          memcmp(e->value.data, list[e->index], e->value.len) == 0;
        t->elements++;
    } else if (strcmp(e->state, "m") == 0) {
        bool one = e->map_key.len == 2 && memcmp(e->map_key.data, "k1", 2) == 0;
        t->values_kept &= e->value.len == 3 && memcmp(e->value.data, one ? "one" : "two", 3) == 0;
        t->entries++;
    } else {
        return 0;
    }
    t->stamped += e->ttl_ms > 0;
    return 0;
}

static timed scan_timed(const char *path)
{
    stash_snapshot *snap;
    cr_assert_eq(stash_snapshot_open(path, &snap), 0, "%s: %s", path, stash_errmsg());
    timed t = {.values_kept = true};
    cr_assert_eq(stash_snapshot_scan(snap, (stash_kg_range){0, MAXP - 1}, take_timed, &t), 0);
    stash_snapshot_close(snap);
    return t;
}

static int rewrite_to(const char *src, const char *dst, const stash_snapshot_change *ch, uint32_t n)
{
    stash_snapshot *snap;
    cr_assert_eq(stash_snapshot_open(src, &snap), 0, "%s", stash_errmsg());
    int rc = stash_snapshot_rewrite(
        snap, dst,
        &(stash_snapshot_rewrite_opts){
            .sz = sizeof(stash_snapshot_rewrite_opts), .changes = ch, .nchanges = n},
        NULL);
    stash_snapshot_close(snap);
    return rc;
}

Test(snapshot_api, a_ttl_switched_on_stamps_every_element_and_entry_and_off_takes_them_out)
{
    char on[300], off[300];
    snprintf(on, sizeof on, "%s/sp-ttl-on", dir);
    snprintf(off, sizeof off, "%s/sp-ttl-off", dir);
    stash_ttl hour = {.ttl_ms = 3600000};
    stash_snapshot_change ch[] = {{.state = "l", .set_ttl = 1, .ttl = hour},
                                  {.state = "m", .set_ttl = 1, .ttl = hour}};
    cr_assert_eq(rewrite_to(chk, on, ch, 2), 0, "%s", stash_errmsg());
    timed t = scan_timed(on);
    cr_assert_eq(t.elements, 3);
    cr_assert_eq(t.entries, 2, "the removed entry stays removed");
    cr_assert_eq(t.stamped, 5, "every element and entry stamped");
    cr_assert(t.values_kept);
    /* The job reads them back under the TTL: nothing has expired. */
    restored r;
    restore_job(&r, on, "ttl");
    stash_worker *w;
    cr_assert_eq(stash_worker_open(r.job, NULL, &w), 0, "%s", stash_errmsg());
    stash_state *l, *m;
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "l",
                                                     .kind = STASH_LIST,
                                                     .ttl = hour},
                                 &l),
                 0, "%s", stash_errmsg());
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "m",
                                                     .kind = STASH_MAP,
                                                     .ttl = hour},
                                 &m),
                 0, "%s", stash_errmsg());
    uint64_t k = 1;
    stash_key_set(w, &k, sizeof k);
    stash_iter it;
    cr_assert_eq(stash_list_get(l, &it), 0, "%s", stash_errmsg());
    stash_bytes b;
    unsigned n = 0;
    while (stash_iter_next(&it, NULL, &b) == 1) n++;
    cr_assert_eq(n, 3, "no element expired");
    k = 2;
    stash_key_set(w, &k, sizeof k);
    stash_state_namespace(m, "n", 1);
    cr_assert_eq(stash_map_get(m, "k2", 2, &b), 0, "%s", stash_errmsg());
    cr_assert(b.len == 3 && memcmp(b.data, "two", 3) == 0);
    stash_worker_close(w);
    end_job(&r);
    /* Switched off again: the times go, the values stay. */
    stash_snapshot_change none[] = {{.state = "l", .set_ttl = 1}, {.state = "m", .set_ttl = 1}};
    cr_assert_eq(rewrite_to(on, off, none, 2), 0, "%s", stash_errmsg());
    t = scan_timed(off);
    cr_assert_eq(t.elements + t.entries, 5);
    cr_assert_eq(t.stamped, 0);
    cr_assert(t.values_kept);
    char args[1024];
    static char out[16384];
    snprintf(args, sizeof args, "snapshot verify %s", off);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
}

Test(snapshot_api, a_rewrite_drops_operator_state_and_refuses_what_it_cannot_write)
{
    char to[300];
    snprintf(to, sizeof to, "%s/sp-no-offsets", dir);
    stash_snapshot_change drop = {.state = "offsets", .drop = 1};
    cr_assert_eq(rewrite_to(chk, to, &drop, 1), 0, "%s", stash_errmsg());
    stash_snapshot *snap;
    cr_assert_eq(stash_snapshot_open(to, &snap), 0);
    seen s = {0};
    cr_assert_eq(stash_snapshot_op_scan(snap, take, &s), 0);
    stash_snapshot_info info;
    stash_snapshot_info_get(snap, &info);
    for (uint32_t i = 0; i < info.nstates; i++) {
        stash_state_desc d;
        stash_snapshot_state(snap, i, &d);
        cr_assert_str_neq(d.name, "offsets");
    }
    stash_snapshot_close(snap);
    /* Refused, and nothing written. */
    char gone[300];
    snprintf(gone, sizeof gone, "%s/sp-refused-api", dir);
    struct {
        stash_snapshot_change ch;
        int rc;
    } bad[] = {
        {{.state = "nosuch", .drop = 1}, STASH_ENOTFOUND},
        {{.state = "v", .rename = "l"}, -EINVAL},
        {{.state = "v", .rename = ""}, -EINVAL},
        {{.state = "offsets", .set_ttl = 1, .ttl = {.ttl_ms = 1000}}, -EINVAL},
        {{.state = "windows", .set_ttl = 1, .ttl = {.ttl_ms = 1000}}, -EINVAL},
        {{.state = "t", .set_ttl = 1, .ttl = {.ttl_ms = 1000, .update = 9}}, -EINVAL},
        {{.state = NULL, .drop = 1}, -EINVAL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(rewrite_to(chk, gone, &bad[i].ch, 1), bad[i].rc, "change %zu: %s", i,
                     stash_errmsg());
        cr_assert_eq(access(gone, F_OK), -1, "change %zu wrote %s", i, gone);
    }
    /* A rename onto a dropped state's name is no clash. */
    stash_snapshot_change swap[] = {{.state = "l", .drop = 1}, {.state = "v", .rename = "l"}};
    cr_assert_eq(rewrite_to(chk, gone, swap, 2), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_snapshot_open(chk, &snap), 0);
    cr_assert_eq(stash_snapshot_rewrite(snap, to, NULL, NULL), -EEXIST);
    cr_assert_eq(stash_snapshot_rewrite(NULL, to, NULL, NULL), -EINVAL);
    cr_assert_eq(stash_snapshot_rewrite(snap, NULL, NULL, NULL), -EINVAL);
    char other[300];
    snprintf(other, sizeof other, "%s/sp-too-many", dir);
    cr_assert_eq(stash_snapshot_rewrite(
                     snap, other,
                     &(stash_snapshot_rewrite_opts){.sz = sizeof(stash_snapshot_rewrite_opts),
                                                    .max_parallelism = 1u << 20},
                     NULL),
                 -EINVAL);
    cr_assert_eq(
        stash_snapshot_rewrite(snap, other,
                               &(stash_snapshot_rewrite_opts){
                                   .sz = sizeof(stash_snapshot_rewrite_opts), .nchanges = 1},
                               NULL),
        -EINVAL, "changes NULL");
    stash_snapshot_close(snap);
    cr_assert_eq(access(other, F_OK), -1);
}

/* Counts v's entries and checks each value. */
static int count_v(void *ctx, const stash_snapshot_entry *e)
{
    uint64_t *n = ctx, k = test_u64(e->key.data);
    if (strcmp(e->state, "v") != 0) return 0;
    cr_assert_eq(test_u64(e->value.data), k % 2 ? 3 * k : 2 * k, "key %llu", (unsigned long long)k);
    (*n)++;
    return 0;
}

Test(snapshot_api, an_incremental_checkpoint_is_rewritten_as_of_its_chain)
{
    char job[128], sdir[300], to[300];
    snprintf(job, sizeof job, "%s-inc", name);
    snprintf(sdir, sizeof sdir, "%s/inc-svc", dir);
    snprintf(to, sizeof to, "%s/sp-from-chain", dir);
    stash_arena *a = test_arena_create("snapinc", 16u << 20, MAXP, job);
    stash_service *svc;
    cr_assert_eq(
        stash_service_start(
            job,
            &(stash_service_opts){.sz = sizeof(stash_service_opts), .dir = sdir, .incremental = 1},
            &svc),
        0, "%s", stash_errmsg());
    stash_worker *w;
    cr_assert_eq(stash_worker_open(job, NULL, &w), 0, "%s", stash_errmsg());
    stash_state *v;
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &v),
        0);
    for (uint64_t k = 0; k < KEYS; k++) {
        uint64_t twice = 2 * k;
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_put(v, &twice, 8), 0);
    }
    stash_checkpoint_info info;
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
    /* The delta: odd keys changed, every key divisible by 5 removed. */
    for (uint64_t k = 0; k < KEYS; k++) {
        uint64_t thrice = 3 * k;
        stash_key_set(w, &k, sizeof k);
        if (k % 5 == 0)
            cr_assert_eq(stash_state_clear(v), 0);
        else if (k % 2)
            cr_assert_eq(stash_value_put(v, &thrice, 8), 0);
    }
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
    stash_worker_close(w);
    stash_service_stop(svc);
    stash_arena_close(a);
    stash_arena_destroy(job, NULL);
    stash_snapshot *snap;
    cr_assert_eq(stash_snapshot_open(info.detail, &snap), 0, "%s", stash_errmsg());
    stash_snapshot_info si;
    stash_snapshot_info_get(snap, &si);
    cr_assert_neq(si.base_id, 0, "%s is a delta", info.detail);
    cr_assert_eq(stash_snapshot_rewrite(snap, to, NULL, &si), 0, "%s", stash_errmsg());
    stash_snapshot_close(snap);
    cr_assert_eq(si.base_id, 0);
    cr_assert_eq(stash_snapshot_open(to, &snap), 0, "%s", stash_errmsg());
    stash_snapshot_info_get(snap, &si);
    cr_assert_eq(si.base_id, 0, "self-contained");
    uint64_t n = 0;
    cr_assert_eq(stash_snapshot_scan(snap, (stash_kg_range){0, MAXP - 1}, count_v, &n), 0);
    stash_snapshot_close(snap);
    cr_assert_eq(n, KEYS - KEYS / 5, "every entry as of the chain, the removed ones gone");
}

/* Whether dir holds an entry whose name starts with prefix. */
static bool left_in_dir(const char *prefix)
{
    DIR *d = opendir(dir);
    bool found = false;
    for (struct dirent *e; d && (e = readdir(d));)
        found |= strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d) closedir(d);
    return found;
}

Test(snapshot_api, a_rewrite_that_cannot_write_or_sync_leaves_nothing)
{
    const char *faults[] = {"write:2:ENOSPC", "fsync:1:EIO", "fsync:2:EIO"};
    const int codes[] = {-ENOSPC, -EIO, -EIO};
    for (int i = 0; i < 3; i++) {
        char to[300];
        snprintf(to, sizeof to, "%s/sp-faulty", dir);
        stash_snapshot *snap;
        cr_assert_eq(stash_snapshot_open(chk, &snap), 0, "%s", stash_errmsg());
        setenv("STASH_IO_FAULT", faults[i], 1);
        int rc = stash_snapshot_rewrite(snap, to, NULL, NULL);
        unsetenv("STASH_IO_FAULT");
        stash_snapshot_close(snap);
        cr_assert_eq(rc, codes[i], "%s: %d %s", faults[i], rc, stash_errmsg());
        cr_assert(strstr(stash_errmsg(), dir), "%s: names the file: %s", faults[i], stash_errmsg());
        cr_assert_eq(access(to, F_OK), -1, "%s: %s written", faults[i], to);
        cr_assert(!left_in_dir(".sp-faulty"), "%s: the directory beside it is gone", faults[i]);
    }
}
