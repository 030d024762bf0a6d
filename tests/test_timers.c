/* SPDX-License-Identifier: MIT */
/*
 * test_timers.c: timer services as Flink's InternalTimerService behaves:
 * dedup, deletion, firing in timestamp order (ties by key group, key and
 * namespace), timers registered while firing, the handler's current key,
 * processing time by the worker's clock, the watermark, and timers carried
 * by a checkpoint into another arena. Runs on both backends.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/service/service.h"
#include "tests/helpers.h"

#define KGS 8u

static uint64_t fake_now;
static uint64_t fake_clock(void *ctx)
{
    (void)ctx;
    return fake_now;
}

static char arena_name[96];
static stash_arena *arena;
static stash_worker *w;
static stash_timers *tm;

static void setup(void)
{
    fake_now = 1000;
    arena = test_arena_create("timers", 32u << 20, KGS, arena_name);
    cr_assert_eq(stash_worker_open(arena_name,
                                   &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                        .parallelism = 1,
                                                        .clock = fake_clock},
                                   &w),
                 0, "%s", stash_errmsg());
    cr_assert_eq(stash_timers_get(w, "windows", &tm), 0, "%s", stash_errmsg());
}

static void teardown(void)
{
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
    stash_worker_close(w);
    stash_arena_close(arena);
    stash_arena_destroy(arena_name, NULL);
}

TestSuite(timers, .init = setup, .fini = teardown);

/* What fired, in order. */
typedef struct fired {
    size_t n;
    uint64_t ts[64];
    uint64_t key[64];
    char ns[64][16];
    stash_time_domain domain[64];
} fired;

static int record(const stash_timer *t, void *ctx)
{
    fired *f = ctx;
    cr_assert_lt(f->n, 64u);
    cr_assert_eq(t->key.len, 8u);
    cr_assert_lt(t->ns.len, 16u);
    f->ts[f->n] = t->timestamp;
    f->key[f->n] = test_u64(t->key.data);
    memcpy(f->ns[f->n], t->ns.data, t->ns.len);
    f->ns[f->n][t->ns.len] = 0;
    f->domain[f->n] = t->domain;
    f->n++;
    return 0;
}

static void set_key(uint64_t k)
{
    cr_assert_eq(stash_key_set(w, &k, sizeof k), 0, "%s", stash_errmsg());
}

static void reg(uint64_t k, const char *ns, uint64_t ts)
{
    set_key(k);
    cr_assert_eq(stash_timer_register(tm, STASH_EVENT_TIME, ns, strlen(ns), ts), 0, "%s",
                 stash_errmsg());
}

Test(timers, a_timer_registered_twice_fires_once)
{
    reg(1, "w", 100);
    reg(1, "w", 100);
    fired f = {0};
    cr_assert_eq(stash_timers_advance(tm, 100, record, &f), 1);
    cr_assert_eq(f.n, 1u);
    cr_assert_eq(f.ts[0], 100u);
    cr_assert_eq(f.key[0], 1u);
    cr_assert_str_eq(f.ns[0], "w");
    cr_assert_eq(f.domain[0], STASH_EVENT_TIME);
    cr_assert_eq(stash_timers_advance(tm, 1000, record, &f), 0, "a fired timer is gone");
}

Test(timers, a_deleted_timer_does_not_fire_and_deleting_an_absent_one_is_no_error)
{
    reg(1, "w", 100);
    reg(2, "w", 100);
    set_key(1);
    cr_assert_eq(stash_timer_delete(tm, STASH_EVENT_TIME, "w", 1, 100), 0);
    cr_assert_eq(stash_timer_delete(tm, STASH_EVENT_TIME, "w", 1, 100), 0);
    cr_assert_eq(stash_timer_delete(tm, STASH_EVENT_TIME, "v", 1, 7), 0);
    cr_assert_eq(stash_timer_delete(tm, STASH_PROCESSING_TIME, "w", 1, 100), 0);
    fired f = {0};
    cr_assert_eq(stash_timers_advance(tm, 500, record, &f), 1);
    cr_assert_eq(f.key[0], 2u);
    /* Registered again after its deletion: one timer again. */
    reg(1, "w", 600);
    set_key(1);
    cr_assert_eq(stash_timer_delete(tm, STASH_EVENT_TIME, "w", 1, 600), 0);
    reg(1, "w", 600);
    f.n = 0;
    cr_assert_eq(stash_timers_advance(tm, 600, record, &f), 1);
}

/* Checks each timer fired: key k at 1000 + k, with a long namespace
 * (longer than a heap entry holds inline) for odd keys; counts them. */
static int check_long(const stash_timer *t, void *ctx)
{
    uint64_t *n = ctx, k = test_u64(t->key.data);
    char want[64];
    snprintf(want, sizeof want, "%s-%llu", k % 2 ? "a-namespace-longer-than-a-heap-entry" : "w",
             (unsigned long long)k);
    cr_assert_eq(t->timestamp, 1000 + k);
    cr_assert_eq(t->ns.len, strlen(want));
    cr_assert(memcmp(t->ns.data, want, t->ns.len) == 0, "key %llu", (unsigned long long)k);
    cr_assert(k % 7 == 0, "key %llu's timer was deleted", (unsigned long long)k);
    (*n)++;
    return 0;
}

Test(timers, deleting_most_timers_compacts_the_heap_and_keeps_the_current_key, .timeout = 60)
{
    enum { N = 3000 };
    char ns[64];
    for (uint64_t k = 0; k < N; k++) {
        snprintf(ns, sizeof ns, "%s-%llu", k % 2 ? "a-namespace-longer-than-a-heap-entry" : "w",
                 (unsigned long long)k);
        reg(k, ns, 1000 + k);
    }
    stash_state *v;
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &v),
        0);
    /* Deleted in reverse, so that none of them comes up first: more than
     * half the heap and the slack are left behind, and it is compacted. */
    uint64_t last = 0;
    for (uint64_t k = N; k-- > 0;) {
        if (k % 7 == 0) continue;
        snprintf(ns, sizeof ns, "%s-%llu", k % 2 ? "a-namespace-longer-than-a-heap-entry" : "w",
                 (unsigned long long)k);
        set_key(k);
        int kg = stash_key_group_current(w);
        cr_assert_eq(stash_timer_delete(tm, STASH_EVENT_TIME, ns, strlen(ns), 1000 + k), 0, "%s",
                     stash_errmsg());
        cr_assert_eq(stash_key_group_current(w), kg, "the delete of key %llu kept it current",
                     (unsigned long long)k);
        last = k;
    }
    /* The current key is still the one the last delete was for. */
    cr_assert_eq(stash_value_put(v, "x", 1), 0);
    set_key(last);
    stash_bytes got;
    cr_assert_eq(stash_value_get(v, &got), 0);
    uint64_t n = 0;
    cr_assert_eq(stash_timers_advance(tm, UINT64_MAX, check_long, &n), (N + 6) / 7);
    cr_assert_eq(n, (N + 6) / 7);
}

Test(timers, timers_fire_in_timestamp_order_and_ties_by_key_group_key_and_namespace)
{
    /* Keys of several key groups, registered out of order, ties included. */
    uint64_t ts[] = {30, 10, 20, 10, 30, 10};
    for (uint64_t k = 0; k < 6; k++) reg(k, "a", ts[k]);
    reg(3, "b", 10);
    fired f = {0};
    cr_assert_eq(stash_timers_advance(tm, 25, record, &f), 5);
    for (size_t i = 1; i < f.n; i++) {
        cr_assert_leq(f.ts[i - 1], f.ts[i]);
        if (f.ts[i - 1] != f.ts[i]) continue;
        uint64_t k0 = f.key[i - 1], k1 = f.key[i];
        uint32_t kg0 = (uint32_t)(stash_hash(&k0, 8) % KGS),
                 kg1 = (uint32_t)(stash_hash(&k1, 8) % KGS);
        cr_assert(kg0 < kg1 || (kg0 == kg1 && memcmp(&k0, &k1, 8) < 0) ||
                      (k0 == k1 && strcmp(f.ns[i - 1], f.ns[i]) < 0),
                  "ties out of order at %zu", i);
    }
    cr_assert_eq(f.ts[4], 20u);
    f.n = 0;
    cr_assert_eq(stash_timers_advance(tm, 30, record, &f), 2);
}

/* Registers a timer at the watermark and one past it when the first timer
 * fires (a handler that registered its own timer again at the watermark
 * would fire forever, in Flink as here). */
static int register_more(const stash_timer *t, void *ctx)
{
    record(t, ctx);
    if (t->ns.len == 1) {
        stash_timer_register(tm, STASH_EVENT_TIME, "again", 5, 100);
        stash_timer_register(tm, STASH_EVENT_TIME, "later", 5, 101);
    }
    return 0;
}

Test(timers, a_timer_registered_while_firing_at_or_before_the_watermark_fires_in_the_same_advance)
{
    reg(7, "w", 100);
    fired f = {0};
    cr_assert_eq(stash_timers_advance(tm, 100, register_more, &f), 2);
    cr_assert_str_eq(f.ns[1], "again");
    cr_assert_eq(f.key[1], 7u, "registered under the firing timer's key");
    f.n = 0;
    cr_assert_eq(stash_timers_advance(tm, 101, record, &f), 1);
    cr_assert_str_eq(f.ns[0], "later");
}

static stash_state *count;

/* Reads and clears the firing key's count, as a window's end does. */
static int emit_count(const stash_timer *t, void *ctx)
{
    uint64_t *sum = ctx;
    stash_bytes v;
    int rc = stash_value_get(count, &v);
    if (rc) return rc;
    *sum += test_u64(v.data) * 1000 + test_u64(t->key.data);
    return stash_state_clear(count);
}

Test(timers, the_handler_has_the_timers_key_current_and_reads_and_clears_its_state)
{
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "count",
                                                     .kind = STASH_VALUE},
                                 &count),
                 0);
    for (uint64_t k = 1; k <= 3; k++) {
        set_key(k);
        uint64_t n = k * 10;
        cr_assert_eq(stash_value_put(count, &n, sizeof n), 0);
        cr_assert_eq(stash_timer_register(tm, STASH_EVENT_TIME, NULL, 0, 50 + k), 0);
    }
    set_key(99);
    uint64_t sum = 0;
    cr_assert_eq(stash_timers_advance(tm, 60, emit_count, &sum), 3);
    cr_assert_eq(sum, 10 * 1000 + 1 + 20 * 1000 + 2 + 30 * 1000 + 3);
    for (uint64_t k = 1; k <= 3; k++) {
        set_key(k);
        stash_bytes v;
        cr_assert_eq(stash_value_get(count, &v), STASH_ENOTFOUND);
    }
}

Test(timers, processing_time_timers_fire_by_the_workers_clock_and_event_time_apart)
{
    set_key(5);
    cr_assert_eq(stash_timer_register(tm, STASH_PROCESSING_TIME, "p", 1, 1500), 0);
    cr_assert_eq(stash_timer_register(tm, STASH_EVENT_TIME, "p", 1, 1500), 0);
    fired f = {0};
    cr_assert_eq(stash_timers_poll(tm, record, &f), 0, "the clock is at 1000");
    fake_now = 1500;
    cr_assert_eq(stash_timers_poll(tm, record, &f), 1);
    cr_assert_eq(f.domain[0], STASH_PROCESSING_TIME);
    cr_assert_eq(stash_timers_advance(tm, 1499, record, &f), 0);
    cr_assert_eq(stash_timers_advance(tm, 1500, record, &f), 1);
    cr_assert_eq(f.domain[1], STASH_EVENT_TIME);
}

Test(timers, the_watermark_never_goes_back)
{
    fired f = {0};
    cr_assert_eq(stash_timers_watermark(tm), 0u);
    cr_assert_eq(stash_timers_advance(tm, 200, record, &f), 0);
    cr_assert_eq(stash_timers_advance(tm, 100, record, &f), 0);
    cr_assert_eq(stash_timers_watermark(tm), 200u);
    /* A timer at or before the watermark fires at the next advance. */
    reg(3, "late", 150);
    cr_assert_eq(stash_timers_advance(tm, 100, record, &f), 1);
}

Test(timers, a_timer_of_a_key_group_the_worker_does_not_own_is_refused)
{
    stash_worker *w2;
    char name[96];
    stash_arena *a = test_arena_create("timers2", 32u << 20, KGS, name);
    cr_assert_eq(
        stash_worker_open(
            name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 2},
            &w2),
        0);
    stash_timers *t2;
    cr_assert_eq(stash_timers_get(w2, "windows", &t2), 0);
    stash_worker_info info;
    stash_worker_info_get(w2, &info);
    uint64_t k = 0;
    while (stash_hash(&k, 8) % KGS <= info.range.last) k++;
    cr_assert_eq(stash_key_set(w2, &k, 8), 0);
    cr_assert_eq(stash_timer_register(t2, STASH_EVENT_TIME, NULL, 0, 1), STASH_EKEYGROUP);
    cr_assert_eq(stash_timer_delete(t2, STASH_EVENT_TIME, NULL, 0, 1), STASH_EKEYGROUP);
    stash_worker_close(w2);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(timers, bad_arguments_and_names_are_refused)
{
    stash_timers *t;
    cr_assert_eq(stash_timers_get(NULL, "x", &t), -EINVAL);
    cr_assert_eq(stash_timers_get(w, NULL, &t), -EINVAL);
    cr_assert_eq(stash_timers_get(w, "x", NULL), -EINVAL);
    cr_assert_eq(stash_timer_register(NULL, STASH_EVENT_TIME, NULL, 0, 1), -EINVAL);
    set_key(1);
    cr_assert_eq(stash_timer_register(tm, (stash_time_domain)2, NULL, 0, 1), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "time domain"), "%s", stash_errmsg());
    cr_assert_eq(stash_timer_register(tm, STASH_EVENT_TIME, NULL, 3, 1), -EINVAL);
    cr_assert_eq(stash_timers_advance(tm, 1, NULL, NULL), -EINVAL);
    cr_assert_eq(stash_timers_poll(NULL, record, NULL), -EINVAL);
    stash_state *s;
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "y", .kind = STASH_TIMERS},
            &s),
        -EINVAL);
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "windows",
                                                     .kind = STASH_VALUE},
                                 &s),
                 STASH_EKIND, "a state cannot take a timer service's name");
    stash_timers *again;
    cr_assert_eq(stash_timers_get(w, "windows", &again), 0);
    cr_assert_eq(again, tm);
}

/* Checkpoint 1 of the suite's arena, its p workers gone (their operator
 * state as they left it), into a new directory made from the template
 * dir; returns the engine it used. */
static ioe_engine *checkpoint_arena(char *dir, uint32_t p)
{
    cr_assert_not_null(mkdtemp(dir));
    ioe_engine *e;
    cr_assert_eq(ioe_engine_open(&(ioe_opts){0}, &e), 0);
    uint32_t pins[KGS];
    for (uint32_t kg = 0; kg < KGS; kg++) pins[kg] = (uint32_t)shm_table_pin(arena, kg);
    ckpt_blob blobs[4] = {{0}};
    cr_assert_leq(p, 4u);
    for (uint32_t i = 0; i < p; i++) {
        const shm_op_blob *b = &arena->control->workers[i].pending;
        shm_off off = atomic_load(&b->off);
        blobs[i] = (ckpt_blob){off ? (const uint8_t *)arena->base + off : NULL,
                               off ? atomic_load(&b->len) : 0};
    }
    ckpt_opts o = {
        .dir = test_ckpt_dir(dir), .id = 1, .engine = e, .op_parallelism = p, .op_blobs = blobs};
    cr_assert_eq(ckpt_write(arena, pins, &o, NULL), 0, "%s", stash_errmsg());
    for (uint32_t kg = 0; kg < KGS; kg++) shm_table_unpin(arena, kg, pins[kg]);
    return e;
}

Test(timers, timers_come_back_from_a_checkpoint_in_another_arena, .timeout = 60)
{
    for (uint64_t k = 0; k < 40; k++) reg(k, k % 2 ? "odd" : "even", 100 + k % 5);
    set_key(3);
    cr_assert_eq(stash_timer_delete(tm, STASH_EVENT_TIME, "odd", 3, 103), 0);
    cr_assert_eq(stash_timers_advance(tm, 42, record, &(fired){0}), 0);
    stash_worker_close(w);
    w = NULL;
    char dir[] = "/var/tmp/stash-timers-XXXXXX";
    ioe_engine *e = checkpoint_arena(dir, 1);
    char name2[96];
    stash_arena *b = test_arena_create("timers3", 32u << 20, KGS, name2);
    ckpt_restored out;
    cr_assert_eq(ckpt_restore(b, test_ckpt_dir(dir), 0, (stash_kg_range){0, KGS - 1}, e, &out), 0,
                 "%s", stash_errmsg());
    cr_assert_eq(service_install_opstate(b, &out), 0);
    ckpt_restored_free(&out);
    stash_worker *w2;
    stash_timers *t2;
    cr_assert_eq(stash_worker_open(name2, NULL, &w2), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_timers_get(w2, "windows", &t2), 0);
    cr_assert_eq(stash_timers_watermark(t2), 42, "the watermark is operator state");
    fired f = {0};
    cr_assert_eq(stash_timers_advance(t2, 1000, record, &f), 39);
    for (size_t i = 0; i < f.n; i++) {
        cr_assert_eq(f.ts[i], 100 + f.key[i] % 5);
        cr_assert_str_eq(f.ns[i], f.key[i] % 2 ? "odd" : "even");
        cr_assert_neq(f.key[i], 3u, "the deleted timer stays deleted");
    }
    stash_worker_close(w2);
    stash_arena_close(b);
    stash_arena_destroy(name2, NULL);
    ioe_engine_close(e);
    test_remove_dir(dir);
    cr_assert_eq(stash_worker_open(arena_name, NULL, &w), 0);
}

/* Stops the firing after 64 timers: the recorder holds no more. */
static int record_some(const stash_timer *t, void *ctx)
{
    fired *f = ctx;
    record(t, ctx);
    return f->n == 64 ? -ECANCELED : 0;
}

/* Restores checkpoint dir into a new arena, opens workers 0 .. p-1 of p
 * in it and fires every timer: each must fire once, in its owner. */
static void fire_at_parallelism(const char *dir, ioe_engine *e, uint32_t p, uint64_t timers)
{
    char name[96];
    stash_arena *b = test_arena_create("timersp", 32u << 20, KGS, name);
    ckpt_restored out;
    cr_assert_eq(ckpt_restore(b, test_ckpt_dir(dir), 0, (stash_kg_range){0, KGS - 1}, e, &out), 0,
                 "%s", stash_errmsg());
    cr_assert_eq(service_install_opstate(b, &out), 0);
    ckpt_restored_free(&out);
    uint8_t seen[200] = {0};
    uint64_t total = 0;
    for (uint32_t i = 0; i < p; i++) {
        stash_worker *wi;
        stash_timers *ti;
        cr_assert_eq(
            stash_worker_open(
                name,
                &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = i, .parallelism = p},
                &wi),
            0, "%s", stash_errmsg());
        cr_assert_eq(stash_timers_get(wi, "windows", &ti), 0);
        cr_assert_eq(stash_timers_watermark(ti), 500,
                     "at another parallelism, the lowest of the old workers' watermarks");
        stash_worker_info info;
        stash_worker_info_get(wi, &info);
        for (int64_t n = -ECANCELED; n == -ECANCELED;) {
            fired f = {0};
            n = stash_timers_advance(ti, 100000, record_some, &f);
            cr_assert(n >= 0 || n == -ECANCELED, "%s", stash_errmsg());
            for (size_t j = 0; j < f.n; j++) {
                uint64_t k = f.key[j];
                uint32_t kg = (uint32_t)(stash_hash(&k, 8) % KGS);
                cr_assert(kg >= info.range.first && kg <= info.range.last,
                          "key %llu of key group %u fired in worker %u", (unsigned long long)k, kg,
                          i);
                cr_assert_lt(k, 200u);
                cr_assert_eq(seen[k]++, 0, "key %llu fired twice", (unsigned long long)k);
                cr_assert_eq(f.ts[j], 1000 + k % 7);
            }
            total += f.n;
        }
        stash_worker_close(wi);
    }
    cr_assert_eq(total, timers, "%u workers fired %llu of %llu timers", p,
                 (unsigned long long)total, (unsigned long long)timers);
    stash_arena_close(b);
    stash_arena_destroy(name, NULL);
}

/* p workers write a timer for each of keys 0 .. 149, every key group
 * holding some, advance their watermarks to 500, 510, ... and leave; the arena is checkpointed;
 * then q workers of each parallelism in fire_ps fire them from a restore. */
static void rescale(uint32_t p, const uint32_t *fire_ps, size_t n)
{
    stash_worker_close(w);
    w = NULL;
    for (uint32_t i = 0; i < p; i++) {
        stash_worker *wi;
        cr_assert_eq(
            stash_worker_open(
                arena_name,
                &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = i, .parallelism = p},
                &wi),
            0);
        stash_timers *ti;
        cr_assert_eq(stash_timers_get(wi, "windows", &ti), 0);
        stash_worker_info info;
        stash_worker_info_get(wi, &info);
        for (uint64_t k = 0; k < 150; k++) {
            uint32_t kg = (uint32_t)(stash_hash(&k, 8) % KGS);
            if (kg < info.range.first || kg > info.range.last) continue;
            cr_assert_eq(stash_key_set(wi, &k, 8), 0);
            cr_assert_eq(stash_timer_register(ti, STASH_EVENT_TIME, "w", 1, 1000 + k % 7), 0);
        }
        cr_assert_eq(stash_timers_advance(ti, 500 + 10 * i, record, &(fired){0}), 0);
        stash_worker_close(wi);
    }
    char dir[] = "/var/tmp/stash-timers-XXXXXX";
    ioe_engine *e = checkpoint_arena(dir, p);
    for (size_t i = 0; i < n; i++) fire_at_parallelism(dir, e, fire_ps[i], 150);
    ioe_engine_close(e);
    test_remove_dir(dir);
    cr_assert_eq(stash_worker_open(arena_name, NULL, &w), 0);
}

Test(timers, timers_of_two_workers_restore_at_three_and_one_each_in_its_new_owner_once,
     .timeout = 120)
{
    rescale(2, (const uint32_t[]){3, 1}, 2);
}

Test(timers, timers_of_three_workers_restore_at_two_each_in_its_new_owner_once, .timeout = 120)
{
    rescale(3, (const uint32_t[]){2}, 1);
}

Test(timers, the_timers_of_a_key_or_a_key_group_are_iterated)
{
    for (uint64_t k = 0; k < 20; k++) {
        reg(k, "a", 100 + k);
        reg(k, "b", 200 + k);
    }
    set_key(7);
    cr_assert_eq(stash_timer_register(tm, STASH_PROCESSING_TIME, "p", 1, 5), 0);
    stash_iter it;
    stash_timer t;
    cr_assert_eq(stash_timers_iter(tm, -1, &it), 0);
    unsigned seen = 0;
    while (stash_timers_next(&it, &t) == 1) {
        cr_assert_eq(test_u64(t.key.data), 7u);
        if (t.domain == STASH_PROCESSING_TIME) {
            cr_assert_eq(t.timestamp, 5u);
            seen |= 4;
        } else {
            cr_assert_eq(t.ns.len, 1u);
            cr_assert_eq(t.timestamp, (((const char *)t.ns.data)[0] == 'a' ? 100u : 200u) + 7);
            seen |= ((const char *)t.ns.data)[0] == 'a' ? 1 : 2;
        }
    }
    cr_assert_eq(seen, 7u, "key 7's three timers");
    size_t total = 0;
    for (int32_t kg = 0; kg < (int32_t)KGS; kg++) {
        cr_assert_eq(stash_timers_iter(tm, kg, &it), 0, "%s", stash_errmsg());
        int rc;
        while ((rc = stash_timers_next(&it, &t)) == 1) {
            uint64_t k = test_u64(t.key.data);
            cr_assert_eq(stash_hash(&k, 8) % KGS, (uint64_t)kg);
            total++;
        }
        cr_assert_eq(rc, 0, "%s", stash_errmsg());
    }
    cr_assert_eq(total, 41u);
    /* A newer iteration makes the older one stale. */
    stash_iter older;
    cr_assert_eq(stash_timers_iter(tm, 0, &older), 0);
    cr_assert_eq(stash_timers_iter(tm, 0, &it), 0);
    cr_assert_eq(stash_timers_next(&older, &t), STASH_ESTALE);
    cr_assert_eq(stash_timers_iter(tm, (int32_t)KGS, &it), STASH_EKEYGROUP);
    cr_assert_eq(stash_timers_next(&(stash_iter){0}, &t), -EINVAL);
}
