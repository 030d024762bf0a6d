/* SPDX-License-Identifier: MIT */
/*
 * test_opstate.c: operator state as Flink's operator-state tests have it:
 * one state per name and worker, split lists dealt out in contiguous chunks
 * with the first workers taking one more (RoundRobinOperatorStateRepartitioner),
 * union lists whole to every worker, broadcast state to every new worker
 * from any old worker that had it.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/helpers.h"

#define MAXP 16u
#define MAXW 8u

typedef struct job {
    char name[96];
    char dir[128];
    stash_service *service;
    stash_arena *arena;
    stash_worker *w[MAXW];
    uint32_t p;
} job;

/* The job's service on its directory, creating the arena (restored from
 * the directory's newest checkpoint if it has one). */
static void serve(job *j)
{
    stash_arena_opts ao = {.sz = sizeof(stash_arena_opts),
                           .size = 16u << 20,
                           .max_parallelism = MAXP,
                           .backend = test_backend()};
    cr_assert_eq(
        stash_service_start(
            j->name,
            &(stash_service_opts){.sz = sizeof(stash_service_opts), .arena = &ao, .dir = j->dir},
            &j->service),
        0, "%s", stash_errmsg());
    cr_assert_eq(stash_arena_open(j->name, NULL, &j->arena), 0);
}

static void start_job(job *j)
{
    const char *n = test_arena_name("op");
    snprintf(j->name, sizeof j->name, "%s", n);
    snprintf(j->dir, sizeof j->dir, "/var/tmp/stash-opstate-XXXXXX");
    cr_assert_not_null(mkdtemp(j->dir));
    serve(j);
}

static void stop_job(job *j)
{
    stash_service_stop(j->service);
    stash_arena_close(j->arena);
    stash_arena_destroy(j->name, NULL);
    test_remove_dir(j->dir);
}

static void open_workers(job *j, uint32_t p)
{
    j->p = p;
    for (uint32_t i = 0; i < p; i++)
        cr_assert_eq(
            stash_worker_open(
                j->name,
                &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = i, .parallelism = p},
                &j->w[i]),
            0, "worker %u of %u: %s", i, p, stash_errmsg());
}

static void close_workers(job *j)
{
    for (uint32_t i = 0; i < j->p; i++) stash_worker_close(j->w[i]);
}

static stash_state *state(stash_worker *w, const char *name, stash_kind kind)
{
    stash_state *s;
    cr_assert_eq(
        stash_state_get(
            w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = name, .kind = kind}, &s),
        0, "%s", stash_errmsg());
    return s;
}

/* A checkpoint, which every worker of the job cuts at its barriers. */
static void checkpoint(job *j)
{
    stash_checkpoint_info info;
    cr_assert_eq(test_checkpoint_at_barriers(j->arena, j->w, j->p, &info), 0, "%s", info.detail);
}

static void add_u32s(stash_state *s, const uint32_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(stash_op_list_add(s, &v[i], sizeof v[i]), 0, "%s", stash_errmsg());
}

/* The list's elements as u32s into out; returns how many. */
static size_t list_u32s(stash_state *s, uint32_t *out, size_t cap)
{
    const stash_bytes *e;
    size_t n;
    cr_assert_eq(stash_op_list_get(s, &e, &n), 0);
    cr_assert_leq(n, cap);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(e[i].len, 4);
        memcpy(&out[i], e[i].data, 4);
    }
    return n;
}

Test(opstate, registering_a_name_twice_gives_the_same_state, .timeout = 60)
{
    job j;
    start_job(&j);
    open_workers(&j, 1);
    const stash_kind kinds[] = {STASH_OP_LIST, STASH_OP_UNION, STASH_OP_BROADCAST, STASH_VALUE};
    const char *names[] = {"l", "u", "b", "v"};
    for (int k = 0; k < 4; k++) {
        stash_state *a = state(j.w[0], names[k], kinds[k]);
        cr_assert_eq(state(j.w[0], names[k], kinds[k]), a, "%s", names[k]);
    }
    /* Elements added through either handle are one list, checkpointed once. */
    stash_state *l = state(j.w[0], "l", STASH_OP_LIST);
    uint32_t one = 1, two = 2;
    cr_assert_eq(stash_op_list_add(l, &one, 4), 0);
    cr_assert_eq(stash_op_list_add(state(j.w[0], "l", STASH_OP_LIST), &two, 4), 0);
    checkpoint(&j);
    close_workers(&j);
    open_workers(&j, 1);
    uint32_t got[8];
    cr_assert_eq(list_u32s(state(j.w[0], "l", STASH_OP_LIST), got, 8), 2);
    cr_assert_eq(got[0], 1);
    cr_assert_eq(got[1], 2);
    close_workers(&j);
    stop_job(&j);
}

/* Old workers' split lists (lists[i] of sizes[i]) restored at np: each
 * new worker must get want[i] (of want_n[i] elements). */
static void repartition(uint32_t p, const uint32_t lists[][8], const size_t *sizes, uint32_t np,
                        const uint32_t want[][8], const size_t *want_n)
{
    job j;
    start_job(&j);
    open_workers(&j, p);
    for (uint32_t i = 0; i < p; i++)
        add_u32s(state(j.w[i], "split", STASH_OP_LIST), lists[i], sizes[i]);
    checkpoint(&j);
    close_workers(&j);
    open_workers(&j, np);
    for (uint32_t i = 0; i < np; i++) {
        uint32_t got[16];
        size_t n = list_u32s(state(j.w[i], "split", STASH_OP_LIST), got, 16);
        cr_assert_eq(n, want_n[i], "%u -> %u: worker %u has %zu elements, not %zu", p, np, i, n,
                     want_n[i]);
        for (size_t k = 0; k < n; k++)
            cr_assert_eq(got[k], want[i][k], "%u -> %u: worker %u element %zu", p, np, i, k);
    }
    close_workers(&j);
    stop_job(&j);
}

Test(opstate, split_lists_go_in_contiguous_chunks_the_first_workers_one_more, .timeout = 120)
{
    /* Flink's example: [1,2,3] + [4,5] at 3 workers is [1,2] [3,4] [5]. */
    const uint32_t a[][8] = {{1, 2, 3}, {4, 5}};
    const size_t an[] = {3, 2};
    const uint32_t aw[][8] = {{1, 2}, {3, 4}, {5}};
    const size_t awn[] = {2, 2, 1};
    repartition(2, a, an, 3, aw, awn);
    /* 1 -> 3, 3 -> 1, 2 -> 5, 5 -> 2, and lists that are empty. */
    const uint32_t b[][8] = {{1, 2, 3, 4}};
    const size_t bn[] = {4};
    const uint32_t bw[][8] = {{1, 2}, {3}, {4}};
    const size_t bwn[] = {2, 1, 1};
    repartition(1, b, bn, 3, bw, bwn);
    const uint32_t c[][8] = {{1}, {}, {2, 3}};
    const size_t cn[] = {1, 0, 2};
    const uint32_t cw[][8] = {{1, 2, 3}};
    const size_t cwn[] = {3};
    repartition(3, c, cn, 1, cw, cwn);
    const uint32_t d[][8] = {{1, 2}, {3, 4, 5, 6, 7}};
    const size_t dn[] = {2, 5};
    const uint32_t dw[][8] = {{1, 2}, {3, 4}, {5}, {6}, {7}};
    const size_t dwn[] = {2, 2, 1, 1, 1};
    repartition(2, d, dn, 5, dw, dwn);
    const uint32_t e[][8] = {{1}, {2}, {}, {3}, {4}};
    const size_t en[] = {1, 1, 0, 1, 1};
    const uint32_t ew[][8] = {{1, 2}, {3, 4}};
    const size_t ewn[] = {2, 2};
    repartition(5, e, en, 2, ew, ewn);
    const uint32_t f[][8] = {{}, {}};
    const size_t fn[] = {0, 0};
    const uint32_t fw[][8] = {{}, {}, {}};
    const size_t fwn[] = {0, 0, 0};
    repartition(2, f, fn, 3, fw, fwn);
}

Test(opstate, union_lists_go_whole_to_every_worker, .timeout = 60)
{
    job j;
    start_job(&j);
    open_workers(&j, 2);
    const uint32_t v0[] = {1, 2}, v1[] = {3};
    add_u32s(state(j.w[0], "union", STASH_OP_UNION), v0, 2);
    add_u32s(state(j.w[1], "union", STASH_OP_UNION), v1, 1);
    checkpoint(&j);
    close_workers(&j);
    open_workers(&j, 3);
    for (uint32_t i = 0; i < 3; i++) {
        uint32_t got[8];
        cr_assert_eq(list_u32s(state(j.w[i], "union", STASH_OP_UNION), got, 8), 3, "worker %u", i);
        cr_assert(got[0] == 1 && got[1] == 2 && got[2] == 3, "worker %u", i);
    }
    close_workers(&j);
    stop_job(&j);
}

/* Empty elements and values (data NULL, length 0) come back empty. */
Test(opstate, empty_elements_and_values_are_checkpointed, .timeout = 60)
{
    job j;
    start_job(&j);
    open_workers(&j, 1);
    cr_assert_eq(stash_op_list_add(state(j.w[0], "l", STASH_OP_LIST), NULL, 0), 0, "%s",
                 stash_errmsg());
    cr_assert_eq(stash_broadcast_put(state(j.w[0], "b", STASH_OP_BROADCAST), "k", 1, NULL, 0), 0,
                 "%s", stash_errmsg());
    checkpoint(&j);
    close_workers(&j);
    open_workers(&j, 1);
    const stash_bytes *e;
    size_t n;
    cr_assert_eq(stash_op_list_get(state(j.w[0], "l", STASH_OP_LIST), &e, &n), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(e[0].len, 0);
    stash_bytes b;
    cr_assert_eq(stash_broadcast_get(state(j.w[0], "b", STASH_OP_BROADCAST), "k", 1, &b), 0);
    cr_assert_eq(b.len, 0);
    close_workers(&j);
    stop_job(&j);
}

/* Every worker of the job sees broadcast state "b" with k -> v. */
static void expect_broadcast(job *j)
{
    for (uint32_t i = 0; i < j->p; i++) {
        stash_bytes b;
        int rc = stash_broadcast_get(state(j->w[i], "b", STASH_OP_BROADCAST), "k", 1, &b);
        cr_assert_eq(rc, 0, "worker %u of %u has the broadcast state", i, j->p);
        cr_assert_eq(b.len, 1);
        cr_assert_eq(((const char *)b.data)[0], 'v');
    }
}

Test(opstate, every_new_worker_gets_the_broadcast_state_one_old_worker_had, .timeout = 120)
{
    const uint32_t news[] = {4, 2, 5};
    for (int c = 0; c < 3; c++) {
        job j;
        start_job(&j);
        open_workers(&j, 3);
        /* Only worker 0 ever registered it; worker 1 has other state. */
        cr_assert_eq(stash_broadcast_put(state(j.w[0], "b", STASH_OP_BROADCAST), "k", 1, "v", 1),
                     0);
        const uint32_t x[] = {9};
        add_u32s(state(j.w[1], "other", STASH_OP_LIST), x, 1);
        checkpoint(&j);
        close_workers(&j);
        open_workers(&j, news[c]);
        expect_broadcast(&j);
        close_workers(&j);
        stop_job(&j);
    }
}

/* Rounds of workers that register only "other": each adds one element,
 * cuts a checkpoint and closes. */
static void only_other(job *j, uint32_t p, uint32_t round)
{
    open_workers(j, p);
    for (uint32_t i = 0; i < p; i++) {
        const uint32_t x[] = {100 * round + i};
        add_u32s(state(j->w[i], "other", STASH_OP_LIST), x, 1);
    }
    checkpoint(j);
    close_workers(j);
}

/* The elements of list state name over the job's workers, sorted. */
static size_t all_u32s(job *j, const char *name, stash_kind kind, uint32_t *out, size_t cap)
{
    size_t n = 0;
    for (uint32_t i = 0; i < j->p; i++)
        n += list_u32s(state(j->w[i], name, kind), out + n, cap - n);
    for (size_t a = 0; a < n; a++)
        for (size_t b = a + 1; b < n; b++)
            if (out[b] < out[a]) {
                uint32_t t = out[a];
                out[a] = out[b];
                out[b] = t;
            }
    return n;
}

/* Flink's DefaultOperatorStateBackend keeps the restored states nobody
 * registers (OperatorStateBackendTest: every restored name is registered
 * before any is asked for), and so do the workers: a split list, a union
 * list and broadcast state pass through rounds of workers, at 3 and at 2
 * and across a restore from the directory, that register none of them. */
Test(opstate, state_no_worker_registers_is_kept, .timeout = 120)
{
    job j;
    start_job(&j);
    open_workers(&j, 2);
    const uint32_t o0[] = {1, 2}, o1[] = {3}, u0[] = {10}, u1[] = {11};
    add_u32s(state(j.w[0], "offsets", STASH_OP_LIST), o0, 2);
    add_u32s(state(j.w[1], "offsets", STASH_OP_LIST), o1, 1);
    add_u32s(state(j.w[0], "u", STASH_OP_UNION), u0, 1);
    add_u32s(state(j.w[1], "u", STASH_OP_UNION), u1, 1);
    cr_assert_eq(stash_broadcast_put(state(j.w[1], "b", STASH_OP_BROADCAST), "k", 1, "v", 1), 0);
    checkpoint(&j);
    close_workers(&j);
    only_other(&j, 3, 1);
    only_other(&j, 2, 2);
    only_other(&j, 2, 3);

    /* A new arena restored from the directory's newest checkpoint. */
    stash_service_stop(j.service);
    stash_arena_close(j.arena);
    stash_arena_destroy(j.name, NULL);
    serve(&j);
    open_workers(&j, 3);
    uint32_t got[32];
    cr_assert_eq(all_u32s(&j, "offsets", STASH_OP_LIST, got, 32), 3);
    cr_assert(got[0] == 1 && got[1] == 2 && got[2] == 3);
    for (uint32_t i = 0; i < 3; i++) {
        cr_assert_eq(list_u32s(state(j.w[i], "u", STASH_OP_UNION), got, 32), 2,
                     "worker %u has the union list once", i);
        cr_assert((got[0] == 10 && got[1] == 11) || (got[0] == 11 && got[1] == 10));
    }
    expect_broadcast(&j);
    /* The rounds' own elements are all there too. */
    cr_assert_eq(all_u32s(&j, "other", STASH_OP_LIST, got, 32), 7);
    close_workers(&j);
    stop_job(&j);
}
