/* SPDX-License-Identifier: MIT */
/*
 * test_batch.c: batches of events. A random mix of every keyed state kind
 * (value, list, map, reducing, aggregating, with and without TTL) and
 * timers, run in batches in one arena and one event at a time in another,
 * leaves the same state, reads the same values, fires the same timers and checkpoints the
 * same records; same-key events run in order; an event of a foreign key
 * fails alone; a barrier never falls inside a batch; a worker killed in the
 * middle of batches leaves key groups that recover. Runs on both backends.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "tests/helpers.h"

#define KGS 16u
#define KEYS 300u

static stash_worker *join(const char *name, uint32_t index, uint32_t p, stash_clock_fn *clock,
                          void *ctx)
{
    stash_worker *w;
    stash_worker_opts o = {.sz = sizeof(stash_worker_opts),
                           .index = index,
                           .parallelism = p,
                           .clock = clock,
                           .clock_ctx = ctx};
    int rc = stash_worker_open(name, &o, &w);
    cr_assert_eq(rc, 0, "join %s: %s", name, stash_errmsg());
    return w;
}

static stash_state *get_state(stash_worker *w, const stash_state_desc *d)
{
    stash_state *s = NULL;
    int rc = stash_state_get(w, d, &s);
    cr_assert_eq(rc, 0, "state %s: %s", d->name, stash_errmsg());
    return s;
}

static uint64_t key_of(uint32_t k)
{
    return 0x9E3779B97F4A7C15ull * (k + 1);
}

/* ------------------------------------------------------------------------ */
/* The random mix: the same events, batched in one arena, one at a time in   */
/* another.                                                                  */

enum {
    OP_PUT,
    OP_GET,
    OP_CLEAR,
    OP_LIST_ADD,
    OP_LIST_GET,
    OP_MAP_PUT,
    OP_MAP_REMOVE,
    OP_MAP_ITER,
    OP_REDUCE,
    OP_AGGREGATE,
    OP_TTL_PUT,
    OP_TTL_GET,
    OP_TIMER_REGISTER,
    OP_TIMER_DELETE,
    OP_ADVANCE,
    NOPS
};

typedef struct mix_event {
    uint32_t key;
    uint8_t op;
    uint32_t arg;
    uint64_t time;
} mix_event;

/* One arena's run: its worker, states, clock, and a digest of everything
 * its events read and fired. */
typedef struct mix_run {
    char name[96];
    char dir[128];
    stash_service *svc;
    stash_arena *arena;
    stash_worker *w;
    stash_state *value, *list, *map, *sum, *mean, *ttl;
    stash_timers *timers;
    uint64_t now;
    XXH3_state_t *digest;
    uint64_t handled;
} mix_run;

static uint64_t mix_clock(void *ctx)
{
    return ((mix_run *)ctx)->now;
}

static int sum_fn(const stash_bytes *acc, const stash_bytes *in, void *out, size_t cap, size_t *len,
                  void *ctx)
{
    (void)ctx;
    if (cap < 8) return *len = 8, -ENOSPC;
    uint64_t a = acc->len == 8 ? test_u64(acc->data) : 0;
    uint64_t b = in->len == 8 ? test_u64(in->data) : 0;
    a += b;
    memcpy(out, &a, 8);
    *len = 8;
    return 0;
}

/* An aggregate of u64 inputs: the accumulator their count and sum, the
 * result the sum over the count. */
static int mean_create(const stash_bytes *acc, void *out, size_t cap, size_t *len, void *ctx)
{
    (void)acc, (void)ctx;
    if (cap < 16) return *len = 16, -ENOSPC;
    memset(out, 0, 16);
    *len = 16;
    return 0;
}

static int mean_add(const stash_bytes *acc, const stash_bytes *in, void *out, size_t cap,
                    size_t *len, void *ctx)
{
    (void)ctx;
    if (cap < 16) return *len = 16, -ENOSPC;
    uint64_t a[2];
    memcpy(a, acc->data, 16);
    a[0]++;
    a[1] += test_u64(in->data);
    memcpy(out, a, 16);
    *len = 16;
    return 0;
}

static int mean_result(const stash_bytes *acc, void *out, size_t cap, size_t *len, void *ctx)
{
    (void)ctx;
    if (cap < 8) return *len = 8, -ENOSPC;
    uint64_t a[2];
    memcpy(a, acc->data, 16);
    uint64_t m = a[0] ? a[1] / a[0] : 0;
    memcpy(out, &m, 8);
    *len = 8;
    return 0;
}

static const stash_aggregate_fns mean_fns = {
    .sz = sizeof(stash_aggregate_fns), mean_create, mean_add, mean_result, NULL};

static void digest(mix_run *r, const void *p, size_t n)
{
    XXH3_64bits_update(r->digest, &n, sizeof n);
    if (n) XXH3_64bits_update(r->digest, p, n);
}

static int on_timer(const stash_timer *t, void *ctx)
{
    mix_run *r = ctx;
    digest(r, t->key.data, t->key.len);
    digest(r, t->ns.data, t->ns.len);
    digest(r, &t->timestamp, sizeof t->timestamp);
    /* The handler reads and clears state under the timer's key. */
    stash_bytes v;
    if (stash_value_get(r->value, &v) == 0) digest(r, v.data, v.len);
    return stash_state_clear(r->value);
}

static void mix_open(mix_run *r, const char *tag)
{
    snprintf(r->dir, sizeof r->dir, "/tmp/stash-test-batch-%d-%s", (int)getpid(), tag);
    mkdir(r->dir, 0700);
    snprintf(r->name, sizeof r->name, "%s", test_arena_name(tag));
    stash_arena_opts ao = {.sz = sizeof(stash_arena_opts),
                           .size = 64u << 20,
                           .max_parallelism = KGS,
                           .backend = test_backend()};
    stash_service_opts so = {.sz = sizeof(stash_service_opts), .arena = &ao, .dir = r->dir};
    int rc = stash_service_start(r->name, &so, &r->svc);
    cr_assert_eq(rc, 0, "service: %s", stash_errmsg());
    cr_assert_eq(stash_arena_open(r->name, NULL, &r->arena), 0);
    r->now = 1000;
    /* Worker 0 of 2: the events of the other half's keys are foreign. */
    r->w = join(r->name, 0, 2, mix_clock, r);
    r->value = get_state(
        r->w,
        &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "value", .kind = STASH_VALUE});
    r->list = get_state(
        r->w,
        &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "list", .kind = STASH_LIST});
    r->map = get_state(r->w, &(stash_state_desc){
                                 .sz = sizeof(stash_state_desc), .name = "map", .kind = STASH_MAP});
    r->sum = get_state(r->w, &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                 .name = "sum",
                                                 .kind = STASH_REDUCING,
                                                 .reduce = sum_fn});
    r->mean = get_state(r->w, &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                  .name = "mean",
                                                  .kind = STASH_AGGREGATING,
                                                  .aggregate = &mean_fns});
    r->ttl = get_state(r->w, &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                 .name = "ttl",
                                                 .kind = STASH_VALUE,
                                                 .ttl = {.ttl_ms = 50, .cleanup_entries = 3}});
    cr_assert_eq(stash_timers_get(r->w, "timers", &r->timers), 0, "%s", stash_errmsg());
    r->digest = XXH3_createState();
    XXH3_64bits_reset(r->digest);
}

static void mix_close(mix_run *r)
{
    XXH3_freeState(r->digest);
    stash_worker_close(r->w);
    stash_service_stop(r->svc);
    stash_arena_close(r->arena);
    stash_arena_destroy(r->name, NULL);
    test_remove_dir(r->dir);
}

static void iter_digest(mix_run *r, stash_iter *it)
{
    stash_bytes k, v;
    int rc;
    while ((rc = stash_iter_next(it, &k, &v)) == 1) {
        digest(r, k.data, k.len);
        digest(r, v.data, v.len);
    }
    cr_assert_eq(rc, 0, "%s", stash_errmsg());
}

/* One event, with its key current: what both runs do. */
static int mix_apply(mix_run *r, const mix_event *e)
{
    uint8_t buf[64];
    size_t len = 1 + e->arg % 40;
    for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)(e->arg * 7 + i);
    uint64_t one = e->arg % 100;
    uint32_t uk = e->arg % 8;
    char ns = (char)('a' + e->arg % 3);
    stash_bytes v;
    stash_iter it;
    int rc = 0;
    r->now = e->time;
    r->handled++;
    switch (e->op) {
    case OP_PUT:
        if ((rc = stash_state_namespace(r->value, &ns, 1)) == 0)
            rc = stash_value_put(r->value, buf, len);
        break;
    case OP_GET:
        if ((rc = stash_state_namespace(r->value, &ns, 1)) == 0 &&
            (rc = stash_value_get(r->value, &v)) == 0)
            digest(r, v.data, v.len);
        break;
    case OP_CLEAR:
        if ((rc = stash_state_namespace(r->value, &ns, 1)) == 0) rc = stash_state_clear(r->value);
        break;
    case OP_LIST_ADD:
        rc = stash_list_add(r->list, buf, len);
        break;
    case OP_LIST_GET:
        if ((rc = stash_list_get(r->list, &it)) == 0) iter_digest(r, &it);
        break;
    case OP_MAP_PUT:
        rc = stash_map_put(r->map, &uk, sizeof uk, buf, len);
        break;
    case OP_MAP_REMOVE:
        rc = stash_map_remove(r->map, &uk, sizeof uk);
        break;
    case OP_MAP_ITER:
        if ((rc = stash_map_iter(r->map, &it)) == 0) iter_digest(r, &it);
        break;
    case OP_REDUCE:
        if ((rc = stash_merging_add(r->sum, &one, sizeof one)) == 0 &&
            (rc = stash_merging_get(r->sum, &v)) == 0)
            digest(r, v.data, v.len);
        break;
    case OP_AGGREGATE:
        if ((rc = stash_merging_add(r->mean, &one, sizeof one)) == 0 &&
            (rc = stash_merging_get(r->mean, &v)) == 0)
            digest(r, v.data, v.len);
        break;
    case OP_TTL_PUT:
        rc = stash_value_put(r->ttl, buf, len);
        break;
    case OP_TTL_GET:
        if ((rc = stash_value_get(r->ttl, &v)) == 0) digest(r, v.data, v.len);
        break;
    case OP_TIMER_REGISTER:
        rc = stash_timer_register(r->timers, STASH_EVENT_TIME, &ns, 1, e->time + e->arg % 30);
        break;
    case OP_TIMER_DELETE:
        rc = stash_timer_delete(r->timers, STASH_EVENT_TIME, &ns, 1, e->time + e->arg % 30);
        break;
    case OP_ADVANCE: {
        int64_t fired = stash_timers_advance(r->timers, e->time, on_timer, r);
        digest(r, &fired, sizeof fired);
        rc = fired < 0 ? (int)fired : 0;
        break;
    }
    }
    if (rc == STASH_ENOTFOUND) rc = 0;
    digest(r, &rc, sizeof rc);
    return rc;
}

static int mix_handler(stash_worker *w, void *event, void *ctx)
{
    (void)w;
    return mix_apply(ctx, event);
}

/* Moves r's clock past every TTL after time t and reads every key's TTL
 * value: each expired one its owner removes. */
static void expire_all(mix_run *r, uint64_t t)
{
    r->now = t + 1000;
    for (uint32_t k = 0; k < KEYS; k++) {
        uint64_t key = key_of(k);
        stash_bytes v;
        cr_assert_eq(stash_key_set(r->w, &key, sizeof key), 0);
        cr_assert_eq(stash_value_get(r->ttl, &v), STASH_ENOTFOUND, "key %u's TTL value expired", k);
    }
}

static void checkpoint_of(mix_run *r, char *dir, size_t cap)
{
    stash_checkpoint_info info;
    int rc = test_checkpoint_at_barriers(r->arena, &r->w, 1, &info);
    cr_assert_eq(rc, 0, "checkpoint of %s: %s (%s)", r->name, stash_strerror(rc), info.detail);
    snprintf(dir, cap, "%s", info.detail);
}

Test(batch_mix, batches_leave_the_state_of_running_their_events_one_at_a_time, .timeout = 300)
{
    unsigned seed = test_seed("batches_leave_the_state_of_running_their_events_one_at_a_time");
    srand(seed);
    enum { N = 20000 };
    mix_event *ev = calloc(N, sizeof *ev);
    cr_assert_not_null(ev);
    uint64_t t = 1000;
    for (int i = 0; i < N; i++) {
        t += (uint64_t)(rand() % 3);
        /* Few keys: a batch often holds several events of one key. */
        ev[i] = (mix_event){.key = (uint32_t)rand() % (i % 500 < 250 ? 12u : KEYS),
                            .op = (uint8_t)(rand() % NOPS),
                            .arg = (uint32_t)rand(),
                            .time = t};
    }
    mix_run one = {0}, batched = {0};
    mix_open(&one, "one");
    mix_open(&batched, "batched");

    int *want = calloc(N, sizeof *want), got[128];
    uint64_t foreign = 0;
    for (int i = 0; i < N; i++) {
        uint64_t k = key_of(ev[i].key);
        cr_assert_eq(stash_key_set(one.w, &k, sizeof k), 0);
        int kg = stash_key_group_current(one.w);
        want[i] = kg >= (int)KGS / 2 ? STASH_EKEYGROUP : mix_apply(&one, &ev[i]);
        foreign += kg >= (int)KGS / 2;
    }
    cr_assert_gt(foreign, 0u);

    stash_batch *b;
    stash_state *some[] = {batched.value, batched.map};
    cr_assert_eq(
        stash_batch_create(
            batched.w, &(stash_batch_opts){.sz = sizeof(stash_batch_opts), .capacity = 128}, &b),
        0, "%s", stash_errmsg());
    stash_batch *b2;
    cr_assert_eq(stash_batch_create(batched.w,
                                    &(stash_batch_opts){.sz = sizeof(stash_batch_opts),
                                                        .capacity = 16,
                                                        .states = some,
                                                        .nstates = 2},
                                    &b2),
                 0, "%s", stash_errmsg());
    for (int i = 0; i < N;) {
        /* Batches of 1 to 128 events, some fetching ahead only two states. */
        stash_batch *use = rand() % 3 == 0 ? b2 : b;
        int n = 1 + rand() % (use == b2 ? 16 : 128);
        if (n > N - i) n = N - i;
        for (int j = 0; j < n; j++) {
            uint64_t k = key_of(ev[i + j].key);
            cr_assert_eq(stash_batch_add(use, &k, sizeof k, &ev[i + j]), 0, "%s", stash_errmsg());
        }
        cr_assert_eq(stash_batch_size(use), (uint32_t)n);
        int failed = stash_batch_run(use, mix_handler, &batched, got);
        int want_failed = 0;
        for (int j = 0; j < n; j++) {
            cr_assert_eq(got[j], want[i + j], "seed %u: event %d (op %u): %d, one at a time %d",
                         seed, i + j, ev[i + j].op, got[j], want[i + j]);
            want_failed += want[i + j] < 0;
        }
        cr_assert_eq(failed, want_failed);
        cr_assert_eq(stash_batch_size(use), 0u);
        i += n;
    }
    cr_assert_eq(batched.handled, one.handled, "the handler ran once per owned event");
    cr_assert_eq(XXH3_64bits_digest(batched.digest), XXH3_64bits_digest(one.digest),
                 "seed %u: batched events read or fired otherwise", seed);

    /* A barrier cleans a few expired entries if 50 ms have passed since
     * the last (by the wall clock): how many barriers a checkpoint takes
     * would make the two differ. Every TTL entry expired and read first
     * leaves none to clean in either. */
    expire_all(&one, t);
    expire_all(&batched, t);
    char d1[256], d2[256], args[600], out[8192];
    checkpoint_of(&one, d1, sizeof d1);
    checkpoint_of(&batched, d2, sizeof d2);
    snprintf(args, sizeof args, "snapshot diff %s %s", d1, d2);
    int rc = test_run_stash(args, out, sizeof out);
    cr_assert_eq(rc, 0, "seed %u: the checkpoints differ:\n%s", seed, out);

    stash_batch_destroy(b);
    stash_batch_destroy(b2);
    mix_close(&one);
    mix_close(&batched);
    free(want);
    free(ev);
}

/* ------------------------------------------------------------------------ */
/* Order, foreign keys, errors, barriers, arguments.                         */

static char arena_name[96];
static stash_arena *arena;
static stash_worker *w;
static stash_state *list;

static void setup(void)
{
    arena = test_arena_create("batch", 32u << 20, KGS, arena_name);
    w = join(arena_name, 0, 2, NULL, NULL);
    list = get_state(
        w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "list", .kind = STASH_LIST});
}

static void teardown(void)
{
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
    stash_worker_close(w);
    stash_arena_close(arena);
    stash_arena_destroy(arena_name, NULL);
}

/* A key of worker 0 of 2 (owned) or not, the n-th such. */
static uint64_t key_where(bool owned, int n)
{
    for (uint32_t k = 0;; k++) {
        uint64_t key = key_of(k);
        uint32_t kg = stash_key_group(&key, sizeof key, KGS);
        if ((kg < KGS / 2) == owned && n-- == 0) return key;
    }
}

static int append_event(stash_worker *worker, void *event, void *ctx)
{
    (void)worker;
    int *calls = ctx;
    (*calls)++;
    uint32_t v = (uint32_t)(uintptr_t)event;
    if (v == 666) return -EPROTO;
    return stash_list_add(list, &v, sizeof v);
}

static void list_is(uint64_t key, const uint32_t *want, size_t n)
{
    stash_key_set(w, &key, sizeof key);
    stash_iter it;
    stash_bytes v;
    cr_assert_eq(stash_list_get(list, &it), n ? 0 : STASH_ENOTFOUND);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(stash_iter_next(&it, NULL, &v), 1);
        cr_assert_eq(test_int(v.data), (int)want[i], "element %zu", i);
    }
    if (n) cr_assert_eq(stash_iter_next(&it, NULL, &v), 0);
}

TestSuite(batch, .init = setup, .fini = teardown);

Test(batch, events_of_one_key_run_in_the_order_they_were_added)
{
    stash_batch *b;
    cr_assert_eq(stash_batch_create(w, NULL, &b), 0);
    uint64_t k1 = key_where(true, 0), k2 = key_where(true, 1);
    for (uint32_t i = 1; i <= 10; i++) {
        uint64_t k = i % 3 ? k1 : k2;
        cr_assert_eq(stash_batch_add(b, &k, sizeof k, (void *)(uintptr_t)i), 0);
    }
    int calls = 0;
    cr_assert_eq(stash_batch_run(b, append_event, &calls, NULL), 0);
    cr_assert_eq(calls, 10);
    list_is(k1, (const uint32_t[]){1, 2, 4, 5, 7, 8, 10}, 7);
    list_is(k2, (const uint32_t[]){3, 6, 9}, 3);
    stash_batch_destroy(b);
}

Test(batch, an_event_of_a_foreign_key_or_a_failing_handler_fails_alone)
{
    stash_batch *b;
    cr_assert_eq(stash_batch_create(
                     w, &(stash_batch_opts){.sz = sizeof(stash_batch_opts), .capacity = 4}, &b),
                 0);
    uint64_t mine = key_where(true, 0), theirs = key_where(false, 0);
    cr_assert_eq(stash_batch_add(b, &mine, sizeof mine, (void *)(uintptr_t)1), 0);
    cr_assert_eq(stash_batch_add(b, &theirs, sizeof theirs, (void *)(uintptr_t)2), 0);
    cr_assert_eq(stash_batch_add(b, &mine, sizeof mine, (void *)(uintptr_t)666), 0);
    cr_assert_eq(stash_batch_add(b, &mine, sizeof mine, (void *)(uintptr_t)3), 0);
    cr_assert_eq(stash_batch_add(b, &mine, sizeof mine, NULL), -ENOSPC, "a full batch");
    int calls = 0, results[4];
    cr_assert_eq(stash_batch_run(b, append_event, &calls, results), 2);
    cr_assert_eq(calls, 3, "the handler never sees the foreign key's event");
    cr_assert_eq(results[0], 0);
    cr_assert_eq(results[1], STASH_EKEYGROUP);
    cr_assert_eq(results[2], -EPROTO);
    cr_assert_eq(results[3], 0);
    list_is(mine, (const uint32_t[]){1, 3}, 2);
    list_is(theirs, NULL, 0);
    /* A batch whose last event was foreign leaves no key current, for the
     * one-step value paths too (the event before it set an 8-byte key). */
    stash_state *v = get_state(
        w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE});
    uint32_t x = 9;
    stash_key_set(w, &mine, sizeof mine);
    cr_assert_eq(stash_value_put(v, &x, sizeof x), 0);
    cr_assert_eq(stash_batch_add(b, &mine, sizeof mine, (void *)(uintptr_t)4), 0);
    cr_assert_eq(stash_batch_add(b, &theirs, sizeof theirs, (void *)(uintptr_t)5), 0);
    cr_assert_eq(stash_batch_run(b, append_event, &calls, NULL), 1);
    cr_assert_eq(stash_value_put(v, &calls, sizeof calls), STASH_ENOKEY);
    list_is(mine, (const uint32_t[]){1, 3, 4}, 3);
    stash_batch_destroy(b);
}

static int barrier_event(stash_worker *worker, void *event, void *ctx)
{
    stash_batch *inner = ctx;
    (void)event;
    stash_event ev;
    int rc = stash_barrier(worker, &ev);
    cr_assert_eq(rc, -EINVAL, "a barrier inside a batch");
    cr_assert(strstr(stash_errmsg(), "batch"), "%s", stash_errmsg());
    cr_assert_eq(stash_batch_run(inner, append_event, NULL, NULL), -EINVAL, "a batch in a batch");
    return 0;
}

Test(batch, no_barrier_and_no_other_batch_runs_inside_a_batch)
{
    stash_batch *b, *inner;
    cr_assert_eq(stash_batch_create(w, NULL, &b), 0);
    cr_assert_eq(stash_batch_create(w, NULL, &inner), 0);
    uint64_t k = key_where(true, 0);
    cr_assert_eq(stash_batch_add(b, &k, sizeof k, NULL), 0);
    cr_assert_eq(stash_batch_run(b, barrier_event, inner, NULL), 0);
    stash_event ev;
    cr_assert_geq(stash_barrier(w, &ev), 0, "after the batch, barriers work: %s", stash_errmsg());
    stash_batch_destroy(b);
    stash_batch_destroy(inner);
}

Test(batch, bad_arguments_are_refused_by_name)
{
    stash_batch *b = NULL;
    stash_state *opl;
    cr_assert_eq(stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = "ops",
                                                     .kind = STASH_OP_LIST},
                                 &opl),
                 0);
    cr_assert_eq(stash_batch_create(NULL, NULL, &b), -EINVAL);
    cr_assert_eq(stash_batch_create(w, NULL, NULL), -EINVAL);
    cr_assert_eq(stash_batch_create(
                     w, &(stash_batch_opts){.sz = sizeof(stash_batch_opts), .capacity = 5000}, &b),
                 -EINVAL);
    cr_assert(strstr(stash_errmsg(), "5000"), "%s", stash_errmsg());
    cr_assert_eq(stash_batch_create(
                     w, &(stash_batch_opts){.sz = sizeof(stash_batch_opts), .nstates = 1}, &b),
                 -EINVAL);
    cr_assert_eq(
        stash_batch_create(
            w, &(stash_batch_opts){.sz = sizeof(stash_batch_opts), .states = &opl, .nstates = 1},
            &b),
        STASH_EKIND);
    cr_assert_eq(stash_batch_create(w, NULL, &b), 0);
    cr_assert_eq(stash_batch_add(NULL, "k", 1, NULL), -EINVAL);
    cr_assert_eq(stash_batch_add(b, NULL, 3, NULL), -EINVAL);
    static uint8_t big[70000];
    cr_assert_eq(stash_batch_add(b, big, sizeof big, NULL), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "70000"), "%s", stash_errmsg());
    cr_assert_eq(stash_batch_run(b, NULL, NULL, NULL), -EINVAL);
    cr_assert_eq(stash_batch_run(NULL, append_event, NULL, NULL), -EINVAL);
    cr_assert_eq(stash_batch_size(NULL), 0u);
    cr_assert_eq(stash_prefetch(NULL, "k", 1), -EINVAL);
    cr_assert_eq(stash_prefetch(list, NULL, 1), -EINVAL);
    cr_assert_eq(stash_prefetch(opl, "k", 1), STASH_EKIND);
    stash_batch_destroy(b);
    stash_batch_destroy(NULL);
}

Test(batch, a_prefetch_changes_nothing)
{
    uint64_t k = key_where(true, 0), other = key_where(false, 0);
    uint32_t v = 7;
    stash_key_set(w, &k, sizeof k);
    cr_assert_eq(stash_list_add(list, &v, sizeof v), 0);
    cr_assert_eq(stash_prefetch(list, &other, sizeof other), 0);
    cr_assert_eq(stash_prefetch(list, &k, sizeof k), 0);
    cr_assert_eq(stash_prefetch(list, "", 0), 0);
    cr_assert_eq(stash_key_group_current(w), (int)stash_key_group(&k, sizeof k, KGS),
                 "the current key stays");
    list_is(k, (const uint32_t[]){7}, 1);
    list_is(other, NULL, 0);
}

/* ------------------------------------------------------------------------ */
/* A worker killed in the middle of batches.                                 */

typedef struct killed_args {
    const char *name;
    int ready[2];
} killed_args;

typedef struct killed_event {
    uint64_t stamp;
} killed_event;

static stash_state *kv, *kl;

/* Two writes an event, of values that carry their own checksum. */
static int write_pair(stash_worker *worker, void *event, void *ctx)
{
    (void)worker, (void)ctx;
    killed_event *e = event;
    uint8_t buf[256], elem[24];
    int rc = stash_value_put(kv, buf, test_seal(buf, 24 + e->stamp % 200, e->stamp));
    if (rc == 0) rc = stash_list_add(kl, elem, test_seal(elem, sizeof elem, e->stamp >> 8));
    return rc;
}

static int batch_forever(void *arg)
{
    killed_args *ka = arg;
    stash_worker *kw;
    if (stash_worker_open(
            ka->name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &kw))
        return 1;
    if (stash_state_get(
            kw,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &kv) ||
        stash_state_get(
            kw,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "l", .kind = STASH_LIST},
            &kl))
        return 2;
    stash_batch *b;
    if (stash_batch_create(kw, &(stash_batch_opts){.sz = sizeof(stash_batch_opts), .capacity = 64},
                           &b))
        return 3;
    static killed_event ev[64];
    uint64_t x = (uint64_t)getpid() * 7919 + 1;
    for (uint64_t round = 0;; round++) {
        for (int i = 0; i < 64; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            uint32_t k = (uint32_t)(x % 2000);
            ev[i].stamp = x >> 8;
            if (stash_batch_add(b, &k, sizeof k, &ev[i])) return 4;
        }
        if (stash_batch_run(b, write_pair, NULL, NULL) != 0) return 5;
        stash_event e;
        if (stash_barrier(kw, &e) < 0) return 6;
        if (round == 20 && write(ka->ready[1], "x", 1) != 1) return 7;
    }
}

Test(batch_procs, a_worker_killed_in_the_middle_of_batches_leaves_key_groups_that_recover,
     .timeout = 300)
{
    char name[96];
    stash_arena *a = test_arena_create("batchkill", 128u << 20, KGS, name);
    killed_args ka = {.name = name};
    cr_assert_eq(pipe(ka.ready), 0);
    unsigned seed =
        test_seed("a_worker_killed_in_the_middle_of_batches_leaves_key_groups_that_recover");
    srand(seed);
    for (int round = 0; round < 10; round++) {
        test_kill_running(batch_forever, &ka, ka.ready[0], 0, 20000);
        stash_worker *nw = join(name, 0, 1, NULL, NULL);
        cr_assert_eq(shm_check(a), 0, "seed %u round %d: %s", seed, round, stash_errmsg());
        stash_state *v = get_state(
            nw,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE});
        stash_state *l = get_state(
            nw,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "l", .kind = STASH_LIST});
        for (uint32_t k = 0; k < 2000; k++) {
            stash_key_set(nw, &k, sizeof k);
            stash_bytes b;
            stash_iter it;
            if (stash_value_get(v, &b) == 0)
                cr_assert(test_sealed(b.data, b.len), "seed %u: value of %u", seed, k);
            if (stash_list_get(l, &it) == 0)
                while (stash_iter_next(&it, NULL, &b) == 1)
                    cr_assert(test_sealed(b.data, b.len), "seed %u: list element of %u", seed, k);
        }
        stash_worker_close(nw);
    }
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}
