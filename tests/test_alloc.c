/* SPDX-License-Identifier: MIT */
/*
 * test_alloc.c: allocation in the key-group heaps: size classes, exact
 * accounting, records up to and past 1 MiB, a full arena, and several
 * processes allocating and freeing at once with every block's bytes checked.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/helpers.h"

static stash_worker *join(const char *name, uint32_t index, uint32_t p)
{
    stash_worker *w;
    int rc = stash_worker_open(
        name,
        &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = index, .parallelism = p},
        &w);
    cr_assert_eq(rc, 0, "join %u of %u: %s (%s)", index, p, stash_strerror(rc), stash_errmsg());
    return w;
}

static void assert_consistent(stash_arena *a)
{
    int rc = shm_check(a);
    cr_assert_eq(rc, 0, "arena inconsistent: %s", stash_errmsg());
}

Test(alloc, size_classes_cover_every_size_and_fit)
{
    unsigned prev = 0;
    for (size_t s = 1; s <= SHM_SMALL_MAX; s++) {
        unsigned c = shm_size_class(s);
        cr_assert_lt(c, SHM_NCLASSES);
        cr_assert_geq(shm_class_bytes(c), s, "size %zu fits its class", s);
        if (c > 0) cr_assert_lt(shm_class_bytes(c - 1), s, "size %zu takes the smallest class", s);
        cr_assert_geq(c, prev);
        prev = c;
        cr_assert_eq(shm_class_bytes(c) % 16, 0, "blocks stay 16-byte aligned");
        cr_assert_geq(shm_class_capacity(c) * 16ull,
                      (uint64_t)shm_class_run(c) * SHM_SPAN_SIZE * 15, "a run wastes at most 1/16");
    }
}

Test(alloc, accounting_is_exact)
{
    char name[96];
    stash_arena *a = test_arena_create("acct", 16u << 20, 8, name);
    stash_worker *w = join(name, 0, 1);
    stash_kg_usage u;
    shm_off offs[1000];
    for (int i = 0; i < 1000; i++) {
        cr_assert_eq(shm_alloc(a, 3, 100, &offs[i]), 0);
        memset(shm_ptr(a, offs[i]), 0xab, 100);
    }
    cr_assert_eq(stash_kg_usage_get(a, 3, &u), 0);
    cr_assert_eq(u.used_bytes, 1000 * 112, "1000 blocks of the 112-byte class");
    uint64_t total = u.used_bytes + u.free_bytes;
    cr_assert_eq(total % shm_class_capacity(shm_size_class(100)), 0, "whole runs");
    for (int i = 0; i < 500; i++) shm_free(a, offs[i]);
    cr_assert_eq(stash_kg_usage_get(a, 3, &u), 0);
    cr_assert_eq(u.used_bytes, 500 * 112);
    cr_assert_eq(u.used_bytes + u.free_bytes, total, "freed bytes stay with the key group");
    cr_assert_eq(stash_kg_usage_get(a, 2, &u), 0);
    cr_assert_eq(u.used_bytes + u.free_bytes, 0, "other key groups are untouched");
    cr_assert_eq(stash_kg_usage_get(a, 8, &u), -EINVAL);
    assert_consistent(a);
    stash_worker_close(w);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(alloc, freed_blocks_are_reused_by_their_key_group)
{
    char name[96];
    stash_arena *a = test_arena_create("reuse", 4u << 20, 4, name);
    shm_off x, y;
    cr_assert_eq(shm_alloc(a, 1, 40, &x), 0);
    shm_free(a, x);
    cr_assert_eq(shm_alloc(a, 2, 40, &y), 0);
    cr_assert_neq(x, y, "another key group does not take key group 1's block");
    cr_assert_eq(shm_alloc(a, 1, 48, &y), 0);
    cr_assert_eq(x, y, "the same key group and class reuses it");
    assert_consistent(a);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(alloc, records_of_one_and_several_mebibytes)
{
    char name[96];
    stash_arena *a = test_arena_create("large", 32u << 20, 4, name);
    const size_t sizes[] = {32769, 1u << 20, (1u << 20) + 1, 5u << 20};
    shm_off offs[4];
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(shm_alloc(a, 0, sizes[i], &offs[i]), 0, "%zu bytes: %s", sizes[i],
                     stash_errmsg());
        cr_assert_geq(shm_block_size(a, offs[i]), sizes[i]);
        memset(shm_ptr(a, offs[i]), i + 1, sizes[i]);
    }
    for (int i = 0; i < 4; i++) {
        const uint8_t *p = shm_ptr(a, offs[i]);
        cr_assert(p[0] == i + 1 && p[sizes[i] - 1] == i + 1, "record %d intact", i);
    }
    stash_kg_usage u;
    stash_kg_usage_get(a, 0, &u);
    cr_assert_eq(u.used_bytes, (9u + 256 + 257 + 1280) * 4096ull);
    for (int i = 0; i < 4; i++) shm_free(a, offs[i]);
    stash_kg_usage_get(a, 0, &u);
    cr_assert_eq(u.used_bytes, 0);
    stash_arena_info info;
    stash_arena_info_get(a, &info);
    cr_assert_eq(info.pool_free_bytes, info.data_bytes, "large runs go back to the pool");
    assert_consistent(a);
    shm_off big;
    cr_assert_eq(shm_alloc(a, 0, 64u << 20, &big), STASH_ETOOBIG);
    cr_assert(strstr(stash_errmsg(), "67108864"), "%s", stash_errmsg());
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(alloc, a_full_arena_fails_cleanly_and_recovers)
{
    char name[96];
    stash_arena *a = test_arena_create("full", 2u << 20, 4, name);
    static shm_off offs[100000];
    int n = 0, rc = 0;
    while (n < 100000 && (rc = shm_alloc(a, (uint32_t)n % 4, 200, &offs[n])) == 0) n++;
    cr_assert_eq(rc, STASH_EFULL, "%s", stash_strerror(rc));
    cr_assert(strstr(stash_errmsg(), "key group"), "%s", stash_errmsg());
    cr_assert_gt(n, 1000);
    shm_off big;
    cr_assert_eq(shm_alloc(a, 0, 1u << 20, &big), STASH_EFULL);
    assert_consistent(a);
    for (int i = 0; i < n; i++) shm_free(a, offs[i]);
    for (int i = 0; i < n; i++) cr_assert_eq(shm_alloc(a, (uint32_t)i % 4, 200, &offs[i]), 0);
    assert_consistent(a);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

/* ---- two processes, each the owner of half the key groups ---------------- */

#define OPS 1000000
#define LIVE 2048

typedef struct stamp_args {
    const char *name;
    uint32_t index;
    uint64_t *live_bytes; /* shared: what the child leaves allocated, per key group */
} stamp_args;

static void stamp(uint8_t *p, uint64_t n, uint64_t tag)
{
    for (uint64_t i = 0; i + 8 <= n; i += 8) memcpy(p + i, &tag, 8);
}

static bool stamped(const uint8_t *p, uint64_t n, uint64_t tag)
{
    for (uint64_t i = 0; i + 8 <= n; i += 8)
        if (memcmp(p + i, &tag, 8) != 0) return false;
    return true;
}

static int churn(void *arg)
{
    stamp_args *s = arg;
    stash_worker *w;
    if (stash_worker_open(s->name,
                          &(stash_worker_opts){
                              .sz = sizeof(stash_worker_opts), .index = s->index, .parallelism = 2},
                          &w))
        return 10;
    stash_arena *a = stash_worker_arena(w);
    stash_worker_info info;
    stash_worker_info_get(w, &info);
    uint32_t nkg = info.range.last - info.range.first + 1;
    static shm_off off[LIVE];
    static uint64_t size[LIVE], tag[LIVE];
    uint64_t x = 88172645463325252ull ^ s->index;
    for (uint64_t i = 0; i < OPS; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t slot = (uint32_t)(x % LIVE);
        if (off[slot]) {
            if (!stamped(shm_ptr(a, off[slot]), size[slot], tag[slot])) return 11;
            shm_free(a, off[slot]);
            off[slot] = 0;
            continue;
        }
        size[slot] = (x >> 20) % 64 == 0 ? 33000 + (x >> 30) % 300000 : 8 + (x >> 24) % 600;
        uint32_t kg = info.range.first + (uint32_t)((x >> 40) % nkg);
        if (shm_alloc(a, kg, size[slot], &off[slot])) return 12;
        tag[slot] = (uint64_t)getpid() << 32 | i;
        stamp(shm_ptr(a, off[slot]), size[slot], tag[slot]);
    }
    for (uint32_t i = 0; i < LIVE; i++) {
        if (!off[i]) continue;
        if (!stamped(shm_ptr(a, off[i]), size[i], tag[i])) return 13;
        uint64_t w_ = shm_block_size(a, off[i]);
        uint32_t kg = shm_span_kg(atomic_load(&a->spans[shm_run_head(a, off[i])].word));
        __atomic_add_fetch(&s->live_bytes[kg], w_, __ATOMIC_RELAXED);
    }
    stash_worker_close(w);
    return 0;
}

Test(alloc, two_processes_allocate_and_free_concurrently, .timeout = 300)
{
    char name[96];
    stash_arena *a = test_arena_create("churn", 512u << 20, 128, name);
    uint64_t *live = mmap(NULL, 128 * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(live, MAP_FAILED);
    stamp_args args[2] = {{name, 0, live}, {name, 1, live}};
    pid_t pids[2] = {test_fork(churn, &args[0]), test_fork(churn, &args[1])};
    for (int i = 0; i < 2; i++)
        cr_assert_eq(test_wait(pids[i]), 0, "process %d found a bad block", i);
    assert_consistent(a);
    for (uint32_t kg = 0; kg < 128; kg++) {
        stash_kg_usage u;
        stash_kg_usage_get(a, kg, &u);
        cr_assert_eq(u.used_bytes, live[kg], "key group %u: used bytes equal the live blocks", kg);
    }
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}
