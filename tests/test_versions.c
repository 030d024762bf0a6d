/* SPDX-License-Identifier: MIT */
/*
 * test_versions.c: records carry the version they were written in. A reader
 * pinned to version N sees the state as of N while the owner writes N+1, in
 * this process and in another; unpinning gives the old versions back; the
 * table grows a few buckets per write; memory unlinked while a reader
 * process reads is freed after it leaves, or after it dies.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shm/index.h"
#include "tests/helpers.h"

static char arena_name[96];
static stash_arena *arena;
static stash_worker *w;
static stash_state *s;

static void setup(void)
{
    arena = test_arena_create("ver", 128u << 20, 8, arena_name);
    cr_assert_eq(
        stash_worker_open(
            arena_name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 1},
            &w),
        0);
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &s),
        0);
}

static void teardown(void)
{
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
    stash_worker_close(w);
    stash_arena_close(arena);
    stash_arena_destroy(arena_name, NULL);
}

TestSuite(versions, .init = setup, .fini = teardown);

/* Keys are 8 bytes, as the one-step accesses of value.c take them. */
static void key_in(stash_worker *wk, uint64_t k)
{
    stash_key_set(wk, &k, sizeof k);
}

static void put(uint32_t k, uint64_t v)
{
    key_in(w, k);
    uint64_t buf[4] = {v, v, v, v};
    cr_assert_eq(stash_value_put(s, buf, sizeof buf), 0);
}

static shm_lookup lookup_of(uint32_t *k)
{
    key_in(w, *k);
    shm_lookup l;
    state_lookup(s, &l);
    return l;
}

static uint64_t used_bytes(void)
{
    uint64_t n = 0;
    for (uint32_t kg = 0; kg < 8; kg++) {
        stash_kg_usage u;
        stash_kg_usage_get(arena, kg, &u);
        n += u.used_bytes;
    }
    return n;
}

static void pin_all(uint32_t *pins)
{
    for (uint32_t kg = 0; kg < 8; kg++) {
        int64_t v = shm_table_pin(arena, kg);
        cr_assert_gt(v, 0);
        pins[kg] = (uint32_t)v;
    }
}

static void unpin_and_settle(const uint32_t *pins)
{
    for (uint32_t kg = 0; kg < 8; kg++) shm_table_unpin(arena, kg, pins[kg]);
    for (uint32_t kg = 0; kg < 8; kg++)
        for (int i = 0; i < 100000; i++) shm_table_maintain(arena, kg, 64);
}

Test(versions, a_pinned_reader_sees_the_state_as_of_its_version)
{
    for (uint32_t k = 0; k < 2000; k++) put(k, k);
    uint32_t pins[8];
    pin_all(pins);
    for (uint32_t k = 0; k < 2000; k += 2) put(k, k + 1000000); /* replaced */
    for (uint32_t k = 1; k < 2000; k += 4) {                    /* deleted */
        key_in(w, k);
        stash_value_put(s, NULL, 0);
    }
    for (uint32_t k = 2000; k < 3000; k++) put(k, k); /* new */
    for (uint32_t k = 0; k < 3000; k++) {
        shm_lookup l = lookup_of(&k);
        shm_rec *r = shm_table_get_at(arena, &l, pins[l.kg]);
        if (k >= 2000) {
            cr_assert_null(r, "key %u did not exist at the pinned version", k);
            continue;
        }
        cr_assert_not_null(r, "key %u existed at the pinned version", k);
        cr_assert_eq(test_u64(shm_rec_value(r)), k, "key %u as it was", k);
        stash_bytes now;
        int rc = stash_value_get(s, &now);
        if (k % 4 == 1)
            cr_assert_eq(rc, STASH_ENOTFOUND);
        else
            cr_assert_eq(test_u64(now.data), k % 2 ? k : k + 1000000);
    }
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
    unpin_and_settle(pins);
    for (uint32_t kg = 0; kg < 8; kg++) {
        uint32_t pos = 0;
        for (shm_rec *r; (r = shm_table_next(arena, kg, &pos, NULL));)
            cr_assert_eq(shm_rec_older(arena, r), 0, "no old version is kept once nobody pins it");
    }
}

Test(versions, writes_after_a_pin_copy_and_unpinning_frees_the_copies)
{
    for (uint32_t k = 0; k < 5000; k++) put(k, k);
    for (uint32_t kg = 0; kg < 8; kg++) shm_table_maintain(arena, kg, 1u << 20);
    uint64_t before = used_bytes();
    uint32_t pins[8];
    pin_all(pins);
    for (uint32_t k = 0; k < 5000; k++) put(k, k + 1);
    cr_assert_gt(used_bytes(), before + 5000 * 32, "the old versions are kept");
    for (uint32_t k = 0; k < 5000; k++) put(k, k + 2); /* in place now: no new copies */
    unpin_and_settle(pins);
    cr_assert_leq(used_bytes(), before + before / 10, "kept versions are given back");
}

/* The prune sweep reads only the slots marked as keeping versions: the
 * marks move with their entries when the index grows, and after the last
 * unpin no version is left behind and no tombstone stays. */
Test(versions, versions_kept_across_growth_are_pruned_after_the_unpin)
{
    for (uint32_t k = 0; k < 2000; k++) put(k, k);
    uint32_t pins[8];
    pin_all(pins);
    for (uint32_t k = 0; k < 2000; k++) put(k, k + 1);
    for (uint32_t k = 1; k < 2000; k += 3) {
        key_in(w, k);
        stash_value_put(s, NULL, 0);
    }
    uint32_t log2_before = atomic_load(&arena->tables[0].log2);
    for (uint32_t k = 2000; k < 40000; k++) put(k, k);
    cr_assert_gt(atomic_load(&arena->tables[0].log2), log2_before, "the index grew under the pin");
    unpin_and_settle(pins);
    uint64_t entries = 0;
    for (uint32_t kg = 0; kg < 8; kg++) {
        uint32_t pos = 0;
        for (shm_rec *r; (r = shm_table_next(arena, kg, &pos, NULL)); entries++) {
            cr_assert_eq(shm_rec_older(arena, r), 0, "no old version is kept once nobody pins it");
            cr_assert_not(r->flags & SHM_REC_TOMBSTONE, "no tombstone stays once nobody pins it");
        }
    }
    cr_assert_eq(entries, 40000 - 667, "every entry but the deleted ones");
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
}

/* Under a pin, the first write copies the record, which keeps its link to
 * the pinned version in the last bytes of its block: values rewritten in
 * place after it, longer and longer up to the room the block has, must
 * never reach that link or the version the pin sees. */
Test(versions, values_rewritten_in_place_to_their_room_keep_the_pinned_version)
{
    uint32_t k = 7;
    put(k, 42);
    uint32_t pins[8];
    pin_all(pins);
    shm_lookup l = lookup_of(&k);
    uint8_t value[256];
    for (size_t len = 1; len <= sizeof value; len++) {
        memset(value, (int)len, len);
        key_in(w, k);
        cr_assert_eq(stash_value_put(s, value, len), 0);
        shm_rec *r = shm_table_get_at(arena, &l, pins[l.kg]);
        cr_assert_not_null(r, "length %zu: the pinned version is still there", len);
        cr_assert_eq(atomic_load(&r->vlen), 32u, "length %zu", len);
        cr_assert_eq(test_u64(shm_rec_value(r)), 42, "length %zu: the pinned value as it was", len);
        stash_bytes now;
        key_in(w, k);
        cr_assert_eq(stash_value_get(s, &now), 0);
        cr_assert_eq(now.len, len);
        cr_assert_eq(memcmp(now.data, value, len), 0, "length %zu", len);
        cr_assert_eq(shm_check(arena), 0, "length %zu: %s", len, stash_errmsg());
    }
    unpin_and_settle(pins);
}

Test(versions, two_pins_each_see_their_own_version)
{
    put(7, 1);
    uint32_t k = 7, p1[8], p2[8];
    pin_all(p1);
    put(7, 2);
    pin_all(p2);
    put(7, 3);
    shm_lookup l = lookup_of(&k);
    cr_assert_eq(test_u64(shm_rec_value(shm_table_get_at(arena, &l, p1[l.kg]))), 1);
    cr_assert_eq(test_u64(shm_rec_value(shm_table_get_at(arena, &l, p2[l.kg]))), 2);
    unpin_and_settle(p1);
    cr_assert_eq(test_u64(shm_rec_value(shm_table_get_at(arena, &l, p2[l.kg]))), 2);
    unpin_and_settle(p2);
}

Test(versions, growth_moves_a_few_groups_per_write)
{
    bool saw_rehash = false;
    uint32_t kg = 0, prev_pos = 0;
    for (uint32_t k = 0; k < 100000; k++) {
        put(k, k);
        shm_table *t = &arena->tables[kg];
        if (atomic_load(&t->old_index)) {
            uint32_t pos = atomic_load(&t->migrate_pos);
            if (saw_rehash && pos >= prev_pos) cr_assert_leq(pos - prev_pos, 2);
            saw_rehash = true;
            prev_pos = pos;
        } else {
            prev_pos = 0;
        }
    }
    cr_assert(saw_rehash, "the table grew incrementally");
    for (uint32_t k = 0; k < 100000; k += 7) {
        key_in(w, k);
        stash_bytes v;
        cr_assert_eq(stash_value_get(s, &v), 0);
        cr_assert_eq(test_u64(v.data), k);
    }
}

/* Entry i of the growth test below: its key (4, 8 or 30 bytes), state and
 * namespace (none, 8 bytes or 24), and its value. */
static const char *const growth_ns[3] = {"", "window-7", "a namespace of 24 bytes!"};
static void growth_entry(stash_state *const st[2], uint32_t i, stash_state **at, uint64_t *value)
{
    char k[30];
    memset(k, 'k', sizeof k);
    memcpy(k, &i, sizeof i);
    size_t klen = i % 3 == 0 ? 4 : i % 3 == 1 ? 8 : 30;
    *at = st[i / 3 % 2];
    cr_assert_eq(stash_key_set(w, k, klen), 0);
    const char *ns = growth_ns[i / 6 % 3];
    cr_assert_eq(stash_state_namespace(*at, ns, strlen(ns)), 0);
    *value = (uint64_t)i * 7 + 1;
}

/* A slot keeps only its entry's tag, so growth finds where each entry goes
 * in the larger index from its record: from its state, key and namespace.
 * With a pin held, some of the records are older versions' successors and
 * tombstones. */
Test(versions, growth_places_every_entry_by_its_state_key_and_namespace)
{
    stash_state *st[2] = {s, NULL};
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "g", .kind = STASH_VALUE},
            &st[1]),
        0);
    enum { N = 30000 };
    uint32_t pins[8];
    for (uint32_t i = 0; i < N; i++) {
        if (i == N / 2) pin_all(pins);
        stash_state *at;
        uint64_t v;
        growth_entry(st, i, &at, &v);
        cr_assert_eq(stash_value_put(at, &v, sizeof v), 0);
        if (i % 5 == 4) {
            growth_entry(st, i - 2, &at, &v);
            cr_assert_eq(stash_value_put(at, NULL, 0), 0);
        }
    }
    cr_assert_gt(atomic_load(&arena->tables[0].resizes), 8u, "the index grew several times");
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
    unpin_and_settle(pins);
    for (uint32_t i = 0; i < N; i++) {
        stash_state *at;
        uint64_t v;
        growth_entry(st, i, &at, &v);
        stash_bytes b;
        if (i % 5 == 2 && i + 2 < N) {
            cr_assert_eq(stash_value_get(at, &b), STASH_ENOTFOUND, "entry %u was deleted", i);
            continue;
        }
        cr_assert_eq(stash_value_get(at, &b), 0, "entry %u", i);
        cr_assert_eq(test_u64(b.data), v, "entry %u", i);
    }
}

/* A reader in another process, pinned, walks the keys while the owner writes. */
typedef struct pinned_args {
    const char *name;
    uint32_t pins[8];
    int ready[2];
} pinned_args;

static int read_pinned(void *arg)
{
    pinned_args *p = arg;
    stash_worker *rw;
    stash_state *rs;
    if (stash_worker_open(
            p->name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 1, .parallelism = 2},
            &rw))
        return 1;
    if (stash_state_get(
            rw,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &rs))
        return 2;
    stash_arena *a = stash_worker_arena(rw);
    static uint32_t keys[3000];
    for (uint32_t k = 0, n = 0; n < 3000; k++) {
        key_in(rw, k);
        if (stash_key_group_current(rw) < 4) keys[n++] = k;
    }
    if (write(p->ready[1], "x", 1) != 1) return 3;
    for (int round = 0; round < 50; round++) {
        for (uint32_t i = 0; i < 3000; i++) {
            key_in(rw, keys[i]);
            shm_lookup l;
            state_lookup(rs, &l);
            shm_ebr_enter(a, 1);
            shm_rec *r = shm_table_get_at(a, &l, p->pins[l.kg]);
            bool ok = r && test_u64(shm_rec_value(r)) == i;
            shm_ebr_exit(a, 1);
            if (!ok) return 10;
        }
    }
    stash_worker_close(rw);
    return 0;
}

Test(versions, a_pinned_reader_in_another_process_sees_its_version, .timeout = 120)
{
    stash_worker_close(w);
    cr_assert_eq(
        stash_worker_open(
            arena_name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 2},
            &w),
        0);
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &s),
        0);
    /* Worker 0 of 2 owns key groups 0..3: use keys that fall there. */
    pinned_args p = {.name = arena_name};
    cr_assert_eq(pipe(p.ready), 0);
    uint32_t keys[3000], n = 0;
    for (uint32_t k = 0; n < 3000; k++) {
        key_in(w, k);
        if (stash_key_group_current(w) < 4) keys[n++] = k;
    }
    for (uint32_t i = 0; i < 3000; i++) put(keys[i], i);
    for (uint32_t kg = 0; kg < 4; kg++) p.pins[kg] = (uint32_t)shm_table_pin(arena, kg);
    pid_t pid = test_fork(read_pinned, &p);
    char b;
    cr_assert_eq(read(p.ready[0], &b, 1), 1);
    for (int round = 0; round < 30; round++)
        for (uint32_t i = 0; i < 3000; i++) put(keys[i], i + 1000u * (uint32_t)round + 5000);
    cr_assert_eq(test_wait(pid), 0, "the pinned reader saw only its version");
    for (uint32_t kg = 0; kg < 4; kg++) shm_table_unpin(arena, kg, p.pins[kg]);
}

/* A reader that announced itself and then died must not hold memory back. */
typedef struct stuck_args {
    const char *name;
    int ready[2];
} stuck_args;

static int announce_and_stop(void *arg)
{
    stuck_args *p = arg;
    stash_worker *rw;
    if (stash_worker_open(
            p->name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 1, .parallelism = 2},
            &rw))
        return 1;
    shm_ebr_enter(stash_worker_arena(rw), 1);
    if (write(p->ready[1], "x", 1) != 1) return 2;
    pause();
    return 0;
}

static uint64_t retired_backlog(void)
{
    uint64_t n = 0;
    for (uint32_t kg = 0; kg < 4; kg++) {
        shm_off ring = atomic_load(&arena->tables[kg].retired);
        if (ring) n += (uint32_t)atomic_load((_Atomic uint64_t *)(arena->base + ring + 8));
    }
    return n;
}

Test(versions, memory_held_back_by_a_dead_reader_is_freed, .timeout = 120)
{
    stash_worker_close(w);
    cr_assert_eq(
        stash_worker_open(
            arena_name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 2},
            &w),
        0);
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &s),
        0);
    uint32_t key = 0;
    for (key_in(w, key); stash_key_group_current(w) >= 4;) {
        key++;
        key_in(w, key);
    }
    char big[600] = {0};
    stuck_args p = {.name = arena_name};
    cr_assert_eq(pipe(p.ready), 0);
    pid_t pid = test_fork(announce_and_stop, &p);
    char b;
    cr_assert_eq(read(p.ready[0], &b, 1), 1);
    /* Every clear unlinks the record and retires it. */
    for (int i = 0; i < 2000; i++) {
        cr_assert_eq(stash_value_put(s, big, 500), 0);
        cr_assert_eq(stash_state_clear(s), 0);
    }
    cr_assert_geq(retired_backlog(), 1900, "a live reader holds the retired records back");
    kill(pid, SIGKILL);
    test_wait(pid);
    for (int i = 0; i < 20000; i++) {
        cr_assert_eq(stash_value_put(s, big, 500), 0);
        cr_assert_eq(stash_state_clear(s), 0);
    }
    cr_assert_lt(retired_backlog(), 4096 + 64, "the dead reader's announcement was cleared");
    stash_kg_usage u;
    stash_kg_usage_get(arena, (uint32_t)stash_key_group_current(w), &u);
    cr_assert_lt(u.used_bytes, 4200 * 1024, "the retired records were freed");
}

/* Brings key group kg into a growth whose next old group holds two entries
 * or more; returns that group. */
static shm_group *growth_with_a_full_group(uint32_t kg, uint32_t *next_key)
{
    shm_table *t = &arena->tables[kg];
    for (uint32_t k = *next_key;; k++) {
        key_in(w, k);
        if ((uint32_t)stash_key_group_current(w) != kg) continue;
        uint64_t v = k;
        cr_assert_eq(stash_value_put(s, &v, sizeof v), 0);
        shm_off old = atomic_load(&t->old_index);
        if (!old) continue;
        shm_group *g = (shm_group *)(arena->base + old) + atomic_load(&t->migrate_pos);
        unsigned entries = 0;
        for (unsigned i = 0; i < SHM_GROUP_SLOTS; i++) entries += atomic_load(&g->tag[i]) >= 2;
        if (entries >= 2) {
            *next_key = k + 1;
            return g;
        }
    }
}

/* Puts the entry at ref into the current index as a move does: the first
 * free slot from its hash's home group on. */
static void move_into_index(shm_table *t, shm_ref ref)
{
    uint32_t hash = shm_rec_hash(shm_rec_at(arena, ref));
    shm_group *groups = (shm_group *)(arena->base + atomic_load(&t->index));
    uint32_t n = 1u << atomic_load(&t->log2);
    for (uint32_t g = hash & (n - 1);; g = (g + 1) & (n - 1)) {
        for (unsigned i = 0; i < SHM_GROUP_SLOTS; i++) {
            uint16_t tag = atomic_load(&groups[g].tag[i]);
            if (tag >= 2) continue;
            atomic_store(&groups[g].ref[i], ref);
            atomic_store(&groups[g].tag[i], shm_slot_tag(hash));
            if (tag == SHM_SLOT_EMPTY) atomic_fetch_add(&t->used, 1);
            return;
        }
    }
}

static void expect_all_readable(uint32_t upto)
{
    for (uint32_t k = 0; k < upto; k++) {
        key_in(w, k);
        if (stash_key_group_current(w) != 0) continue;
        stash_bytes b;
        cr_assert_eq(stash_value_get(s, &b), 0, "key %u", k);
        cr_assert_eq(test_u64(b.data), k);
    }
}

Test(versions, a_move_cut_short_by_a_crash_is_finished_by_recovery)
{
    uint32_t next = 0;
    for (int variant = 0; variant < 2; variant++) {
        shm_table *t = &arena->tables[0];
        shm_group *g = growth_with_a_full_group(0, &next);
        unsigned i = 0;
        while (atomic_load(&g->tag[i]) < 2) i++;
        /* As a move leaves the group when killed: its first entry copied into
         * the index (variant 0: still in the old group too; variant 1: marked
         * moved there), the rest not moved yet, the shape odd. */
        atomic_store(&t->moving, 1);
        atomic_fetch_add(&t->shape_seq, 1);
        move_into_index(t, atomic_load(&g->ref[i]));
        if (variant == 1) {
            atomic_store(&g->tag[i], SHM_SLOT_DELETED);
            atomic_store(&g->ref[i], 0);
        }
        shm_table_recover(arena, 0);
        cr_assert_eq(shm_check(arena), 0, "variant %d: %s", variant, stash_errmsg());
        expect_all_readable(next);
    }
}

/* ---- walkers and growth ------------------------------------------------- */

/* Keys of key group kg from *next on, n of them, into keys. */
static void keys_of(uint32_t kg, uint32_t *next, uint32_t *keys, uint32_t n)
{
    for (uint32_t k = *next, i = 0; i < n; k++) {
        key_in(w, k);
        if ((uint32_t)stash_key_group_current(w) == kg) keys[i++] = k;
        *next = k + 1;
    }
}

/* Whether the owner of key group 0 must wait for walkers before it can
 * insert again: what is left to move would fill the index to 15/16. */
static bool index_full_of_held_moves(const shm_table *t)
{
    uint32_t slots = SHM_GROUP_SLOTS << atomic_load(&t->log2);
    return atomic_load(&t->old_index) && atomic_load(&t->used) + t->old_left >= slots - slots / 16;
}

/* Key keys[j] holds j, for j below n. */
static void expect_values(const uint32_t *keys, uint32_t n)
{
    for (uint32_t j = 0; j < n; j++) {
        key_in(w, keys[j]);
        stash_bytes b;
        cr_assert_eq(stash_value_get(s, &b), 0, "key %u", j);
        cr_assert_eq(test_u64(b.data), j);
    }
}

/* Announces a walk of key group 0 from a reader slot, says so, then ends it
 * when told (or is killed in the middle); with until_full, once the owner
 * must wait for it instead. */
typedef struct walker_args {
    const char *name;
    bool until_full;
    int ready[2], go[2];
} walker_args;

static int walk_until_told(void *arg)
{
    walker_args *p = arg;
    stash_arena *a;
    uint32_t slot;
    if (stash_arena_open(p->name, NULL, &a) || shm_reader_join(a, &slot)) return 1;
    shm_table_walk_enter(a, 0, slot);
    if (write(p->ready[1], "x", 1) != 1) return 2;
    char b;
    if (p->until_full)
        while (!index_full_of_held_moves(&a->tables[0])) usleep(1000);
    else if (read(p->go[0], &b, 1) != 1)
        return 3;
    shm_table_walk_exit(a, 0, slot);
    shm_reader_leave(a, slot);
    stash_arena_close(a);
    return 0;
}

static pid_t start_walker(walker_args *p)
{
    p->name = arena_name;
    cr_assert_eq(pipe(p->ready), 0);
    cr_assert_eq(pipe(p->go), 0);
    pid_t pid = test_fork(walk_until_told, p);
    char b;
    cr_assert_eq(read(p->ready[0], &b, 1), 1);
    return pid;
}

Test(versions, a_walk_holds_moves_back_while_the_index_grows, .timeout = 120)
{
    static uint32_t keys[20000];
    uint32_t next = 0;
    keys_of(0, &next, keys, 20000);
    for (uint32_t i = 0; i < 1000; i++) put(keys[i], i);
    walker_args p = {0};
    pid_t pid = start_walker(&p);
    shm_table *t = &arena->tables[0];
    /* The index grows into a new array while nothing moves out of the old. */
    uint32_t i = 1000;
    for (; i < 20000 && !atomic_load(&t->old_index); i++) put(keys[i], i);
    cr_assert_neq(atomic_load(&t->old_index), 0, "the index grew");
    uint32_t grown_at = i;
    for (; i < grown_at + 200; i++) put(keys[i], i);
    cr_assert_eq(atomic_load(&t->migrate_pos), 0, "no group moved during the walk");
    cr_assert_neq(atomic_load(&t->old_index), 0);
    expect_values(keys, i);
    cr_assert_eq(write(p.go[1], "x", 1), 1);
    cr_assert_eq(test_wait(pid), 0);
    for (; i < 20000; i++) put(keys[i], i);
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
    expect_values(keys, 20000);
}

Test(versions, an_index_that_fills_during_a_walk_waits_for_it, .timeout = 120)
{
    static uint32_t keys[60000];
    uint32_t next = 0;
    keys_of(0, &next, keys, 60000);
    /* The inserts outgrow the index the walk holds back: the owner waits for
     * the walk (which ends only once the owner has to), then moves and grows. */
    walker_args p = {.until_full = true};
    pid_t pid = start_walker(&p);
    for (uint32_t i = 0; i < 60000; i++) put(keys[i], i);
    cr_assert_eq(test_wait(pid), 0);
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
    expect_values(keys, 60000);
}

Test(versions, a_walker_that_died_holds_no_move_back, .timeout = 120)
{
    static uint32_t keys[60000];
    uint32_t next = 0;
    keys_of(0, &next, keys, 60000);
    walker_args p = {0};
    pid_t pid = start_walker(&p);
    kill(pid, SIGKILL);
    test_wait(pid);
    for (uint32_t i = 0; i < 60000; i++) put(keys[i], i);
    shm_table *t = &arena->tables[0];
    for (uint32_t i = 0; i < 60000 && atomic_load(&t->old_index); i++) put(keys[i], i);
    cr_assert_eq(atomic_load(&t->old_index), 0, "the growth finished");
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
}

Test(versions, deleted_slots_are_reused_and_the_index_stays_its_size)
{
    static uint32_t keys[4000];
    uint32_t next = 0;
    keys_of(0, &next, keys, 4000);
    shm_table *t = &arena->tables[0];
    uint32_t log2 = 0;
    for (int round = 0; round < 20; round++) {
        /* Half the keys live at a time: each round deletes them and puts the other half. */
        uint32_t *live = keys + (round % 2) * 2000, *gone = keys + (1 - round % 2) * 2000;
        for (uint32_t i = 0; i < 2000; i++) {
            key_in(w, gone[i]);
            cr_assert_eq(stash_value_put(s, NULL, 0), 0);
            put(live[i], (uint64_t)round * 10000 + i);
        }
        if (round == 3) log2 = atomic_load(&t->log2);
    }
    cr_assert_leq(atomic_load(&t->log2), log2 + 1, "churn does not grow the index");
    cr_assert_eq(atomic_load(&t->count), 2000);
    for (uint32_t i = 0; i < 2000; i++) {
        key_in(w, keys[2000 + i]);
        stash_bytes b;
        cr_assert_eq(stash_value_get(s, &b), 0);
        cr_assert_eq(test_u64(b.data), 19u * 10000 + i);
        key_in(w, keys[i]);
        cr_assert_eq(stash_value_get(s, &b), STASH_ENOTFOUND);
    }
}

Test(versions, recovery_moves_nothing_when_no_move_was_under_way)
{
    /* An owner killed while a growth waits to move groups (a walker holds the
     * moves back, the shape even): a walk may still be reading the old
     * array, so recovery leaves it as it is. */
    uint32_t next = 0;
    shm_table *t = &arena->tables[0];
    growth_with_a_full_group(0, &next);
    uint32_t pos = atomic_load(&t->migrate_pos);
    shm_table_recover(arena, 0);
    cr_assert_eq(atomic_load(&t->migrate_pos), pos, "no group moved");
    cr_assert_eq(atomic_load(&t->shape_seq) & 1, 0);
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
    expect_all_readable(next);
}

Test(versions, a_whole_value_rewrite_cut_short_is_redone_by_recovery)
{
    uint32_t k = 0;
    key_in(w, k);
    uint32_t kg = (uint32_t)stash_key_group_current(w);
    char old[100], fresh[100];
    memset(old, 'o', sizeof old);
    memset(fresh, 'n', sizeof fresh);
    cr_assert_eq(stash_value_put(s, old, sizeof old), 0);
    shm_lookup l = lookup_of(&k);
    shm_cursor c;
    cr_assert_eq(shm_table_find(arena, &l, &c), 0);
    /* As shm_rec_overwrite leaves the record when killed in its copy: the
     * new value saved for a redo, the sequence odd, half the bytes written. */
    shm_undo *u = &arena->tables[kg].undo;
    memcpy(u->bytes, fresh, sizeof fresh);
    u->nregions = 0;
    u->vlen = sizeof fresh;
    atomic_store(&u->rec, shm_ref_of(shm_off_of(arena, c.rec)));
    atomic_fetch_add(&c.rec->seq, 1);
    memcpy(shm_rec_value(c.rec), fresh, 37);
    shm_table_recover(arena, kg);
    stash_bytes b;
    cr_assert_eq(stash_value_get(s, &b), 0);
    cr_assert_eq(b.len, sizeof fresh);
    cr_assert_eq(memcmp(b.data, fresh, sizeof fresh), 0, "the rewrite is finished, not torn");
}

Test(versions, recovery_starts_an_epoch_past_a_pin_its_owner_died_storing)
{
    /* Killed between storing a pin for a live reader process and starting
     * the next epoch: records written now would sit at the pinned version. */
    put(1, 1);
    uint32_t slot;
    cr_assert_eq(shm_reader_join(arena, &slot), 0);
    shm_table *t = &arena->tables[0];
    uint32_t v = atomic_load(&t->epoch);
    atomic_store(&t->pin_holders, slot - STASH_MAX_WORKERS + 1);
    atomic_store(&t->pins[0], v);
    shm_table_recover(arena, 0);
    cr_assert_eq(atomic_load(&t->pins[0]), v, "the live reader's pin stays");
    cr_assert_gt(atomic_load(&t->epoch), v, "writes go on at a version past the pin");
    shm_table_unpin(arena, 0, v);
    shm_reader_leave(arena, slot);
}

static void pin_walks(uint32_t *pins)
{
    for (uint32_t kg = 0; kg < 8; kg++) {
        int64_t v = shm_table_pin_for(arena, kg, 0, true);
        cr_assert_gt(v, 0);
        pins[kg] = (uint32_t)v;
    }
}

#define WALKED 3000u

/* A walk of a walk's pin that writes as it goes: what each key held at the
 * pin, how often the walk met it, and the keys it rewrites on the way. */
typedef struct walk_check {
    uint64_t at_pin[WALKED];
    unsigned met[WALKED];
    unsigned seed;
} walk_check;

static int walk_and_write(const shm_rec *r, void *ctx)
{
    walk_check *c = ctx;
    uint64_t k;
    cr_assert_eq(r->klen, sizeof k);
    memcpy(&k, shm_rec_key(r), sizeof k);
    cr_assert_lt(k, WALKED);
    c->met[k]++;
    cr_assert_eq(test_u64(shm_rec_value((shm_rec *)r)), c->at_pin[k], "key %llu as of the pin",
                 (unsigned long long)k);
    /* Two keys changed: one the walk may have met, one it may not. Most are
     * rewritten in place; some grow out of their block, some go. */
    for (int i = 0; i < 2; i++) {
        uint32_t x = (uint32_t)(rand_r(&c->seed) % WALKED), what = (uint32_t)rand_r(&c->seed) % 8;
        uint64_t grown[32] = {rand_r(&c->seed)};
        key_in(w, x);
        if (what == 0)
            cr_assert_eq(stash_value_put(s, grown, sizeof grown), 0);
        else if (what == 1)
            cr_assert_eq(stash_state_clear(s), 0);
        else
            put(x, rand_r(&c->seed));
    }
    return 0;
}

Test(versions, a_walk_pin_sees_each_record_once_as_of_it_while_the_owner_writes_in_place)
{
    static walk_check c;
    c.seed = test_seed("a_walk_pin_sees_each_record_once");
    for (uint32_t k = 0; k < WALKED; k++) put(k, c.at_pin[k] = k);
    for (uint32_t kg = 0; kg < 8; kg++) shm_table_maintain(arena, kg, 1u << 20);
    uint64_t before = used_bytes();
    uint32_t pins[8];
    pin_walks(pins);
    /* Saved before the walks begin. */
    for (uint32_t k = 0; k < WALKED; k += 3) put(k, k + 1000000);
    cr_assert_lt(used_bytes(), before + WALKED * 64, "saved to the log, not copied");
    for (uint32_t kg = 0; kg < 8; kg++) {
        cr_assert_neq(atomic_load(&arena->tables[kg].prelog), 0, "key group %u saved", kg);
        cr_assert_eq(shm_table_walk_at(arena, kg, pins[kg], walk_and_write, &c), 0, "%s",
                     stash_errmsg());
    }
    for (uint32_t k = 0; k < WALKED; k++) cr_assert_eq(c.met[k], 1, "key %u met once", k);
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
    unpin_and_settle(pins);
    for (uint32_t kg = 0; kg < 8; kg++)
        cr_assert_eq(atomic_load(&arena->tables[kg].prelog), 0, "the log goes with the pins");
}

/* A checkpoint's memory peaks at the logs of the key groups it has not yet
 * walked: each log goes back to its heap at the owner's first write once no
 * pin is left, unless a walker is still announced on the key group. */
Test(versions, a_log_is_freed_at_the_first_write_after_its_pins_unless_a_walker_is_in)
{
    for (uint32_t k = 0; k < WALKED; k++) put(k, k);
    for (uint32_t kg = 0; kg < 8; kg++) shm_table_maintain(arena, kg, 1u << 20);
    stash_kg_usage before[8], u;
    for (uint32_t kg = 0; kg < 8; kg++) stash_kg_usage_get(arena, kg, &before[kg]);
    uint32_t pins[8], slot;
    cr_assert_eq(shm_reader_join(arena, &slot), 0);
    shm_table_walk_enter(arena, 0, slot);
    pin_walks(pins);
    for (uint32_t k = 0; k < WALKED; k++) put(k, k + 1);
    for (uint32_t kg = 0; kg < 8; kg++) shm_table_unpin(arena, kg, pins[kg]);
    for (uint32_t k = 0; k < WALKED; k++) put(k, k + 2);
    for (uint32_t kg = 0; kg < 8; kg++) {
        cr_assert_eq(atomic_load(&arena->tables[kg].prelog), 0, "key group %u dropped its log", kg);
        stash_kg_usage_get(arena, kg, &u);
        if (kg == 0)
            cr_assert_gt(u.used_bytes, before[kg].used_bytes + 4096,
                         "key group 0's log waits for its walker");
        else
            cr_assert_eq(u.used_bytes, before[kg].used_bytes,
                         "key group %u: its log is back in its heap", kg);
    }
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
    shm_table_walk_exit(arena, 0, slot);
    shm_reader_leave(arena, slot);
}

static int count_met(const shm_rec *r, void *ctx)
{
    walk_check *c = ctx;
    uint64_t k;
    memcpy(&k, shm_rec_key(r), sizeof k);
    c->met[k]++;
    cr_assert_eq(test_u64(shm_rec_value((shm_rec *)r)), c->at_pin[k], "key %llu as of the pin",
                 (unsigned long long)k);
    return 0;
}

Test(versions, two_walk_pins_each_see_their_own_version)
{
    static walk_check first, second;
    for (uint32_t k = 0; k < WALKED; k++) put(k, first.at_pin[k] = k);
    uint32_t p1[8], p2[8];
    pin_walks(p1);
    for (uint32_t k = 0; k < WALKED; k += 2) put(k, k + 1000);
    for (uint32_t k = 0; k < WALKED; k++) second.at_pin[k] = k % 2 ? k : k + 1000;
    pin_walks(p2);
    for (uint32_t k = 0; k < WALKED; k++) put(k, k + 2000);
    for (uint32_t kg = 0; kg < 8; kg++) {
        cr_assert_eq(shm_table_walk_at(arena, kg, p2[kg], count_met, &second), 0);
        cr_assert_eq(shm_table_walk_at(arena, kg, p1[kg], count_met, &first), 0);
    }
    for (uint32_t k = 0; k < WALKED; k++)
        cr_assert(first.met[k] == 1 && second.met[k] == 1, "key %u met once by each", k);
    for (uint32_t kg = 0; kg < 8; kg++) shm_table_unpin(arena, kg, p2[kg]);
    unpin_and_settle(p1);
}

Test(versions, a_pin_that_is_not_a_walks_keeps_copy_on_write)
{
    for (uint32_t k = 0; k < 2000; k++) put(k, k);
    uint32_t walks[8], versions[8];
    pin_walks(walks);
    pin_all(versions);
    for (uint32_t k = 0; k < 2000; k++) put(k, k + 1);
    for (uint32_t k = 0; k < 2000; k++) {
        shm_lookup l = lookup_of(&k);
        shm_rec *r = shm_table_get_at(arena, &l, versions[l.kg]);
        cr_assert_not_null(r);
        cr_assert_eq(test_u64(shm_rec_value(r)), k, "key %u kept as of the pin", k);
    }
    for (uint32_t kg = 0; kg < 8; kg++)
        cr_assert_eq(atomic_load(&arena->tables[kg].prelog), 0, "nothing saved");
    for (uint32_t kg = 0; kg < 8; kg++) shm_table_unpin(arena, kg, walks[kg]);
    unpin_and_settle(versions);
}

/* A delta's view of an entry: 0 not met, 1 met live with value at_pin,
 * 2 met deleted. */
typedef struct delta_check {
    uint8_t met[2 * WALKED];
    uint64_t value[2 * WALKED];
    unsigned seed;
} delta_check;

static int note_change(const shm_rec *r, bool deleted, void *ctx)
{
    delta_check *d = ctx;
    uint64_t k;
    memcpy(&k, shm_rec_key(r), sizeof k);
    cr_assert_lt(k, 2 * WALKED);
    cr_assert_eq(d->met[k], 0, "key %llu met once", (unsigned long long)k);
    d->met[k] = deleted ? 2 : 1;
    if (!deleted) d->value[k] = test_u64(shm_rec_value((shm_rec *)r));
    /* The owner writes on while the delta is walked: in place, grown,
     * deleted, added; none of it is the delta's. */
    uint32_t x = (uint32_t)(rand_r(&d->seed) % (2 * WALKED)), what = (uint32_t)rand_r(&d->seed) % 4;
    if (what == 0) {
        key_in(w, x);
        cr_assert_eq(stash_state_clear(s), 0);
    } else if (what == 1) {
        uint64_t grown[32] = {7};
        key_in(w, x);
        cr_assert_eq(stash_value_put(s, grown, sizeof grown), 0);
    } else {
        put(x, 9999999);
    }
    return 0;
}

/* A checkpoint of a chain stays as the next delta's base once walked: the
 * owner then writes in place with nothing saved or copied, a delete leaves
 * a tombstone, and a delta from the base finds every change by the
 * versions records carry, while the owner writes on during the walk. */
Test(versions, a_base_pin_keeps_no_version_and_a_delta_from_it_finds_every_change)
{
    static delta_check d;
    d.seed = test_seed("a_base_pin_keeps_no_version");
    for (uint32_t k = 0; k < WALKED; k++) put(k, k);
    uint32_t base[8], cut[8];
    pin_walks(base);
    for (uint32_t kg = 0; kg < 8; kg++) shm_table_pin_rebase(arena, kg, base[kg]);
    /* Rewritten in place, grown out of the block, deleted, untouched; added. */
    shm_rec *was[WALKED];
    for (uint32_t k = 0; k < WALKED; k++) {
        shm_lookup l = lookup_of(&k);
        was[k] = shm_table_get_at(arena, &l, UINT32_MAX);
    }
    for (uint32_t k = 0; k < WALKED; k++) {
        key_in(w, k);
        if (k % 4 == 0) {
            put(k, k + 100000);
        } else if (k % 4 == 1) {
            uint64_t grown[32] = {k + 200000};
            cr_assert_eq(stash_value_put(s, grown, sizeof grown), 0);
        } else if (k % 4 == 2) {
            cr_assert_eq(stash_state_clear(s), 0);
        }
    }
    for (uint32_t k = WALKED; k < WALKED + 100; k++) put(k, k + 300000);
    for (uint32_t kg = 0; kg < 8; kg++)
        cr_assert_eq(atomic_load(&arena->tables[kg].prelog), 0, "key group %u saved nothing", kg);
    for (uint32_t k = 0; k < WALKED; k += 4) {
        shm_lookup l = lookup_of(&k);
        cr_assert_eq(shm_table_get_at(arena, &l, UINT32_MAX), was[k], "key %u rewritten in place",
                     k);
    }
    pin_walks(cut);
    for (uint32_t kg = 0; kg < 8; kg++)
        cr_assert_eq(shm_table_walk_delta(arena, kg, base[kg], cut[kg], note_change, &d), 0, "%s",
                     stash_errmsg());
    for (uint32_t k = 0; k < 2 * WALKED; k++) {
        uint8_t want = k >= WALKED + 100 ? 0
                       : k >= WALKED     ? 1
                       : k % 4 == 3      ? 0
                       : k % 4 == 2      ? 2
                                         : 1;
        cr_assert_eq(d.met[k], want, "key %u: met %u, expected %u", k, d.met[k], want);
        uint64_t v = k >= WALKED ? k + 300000 : k % 4 == 0 ? k + 100000 : k + 200000;
        if (want == 1) cr_assert_eq(d.value[k], v, "key %u as of the cut", k);
    }
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
    /* With no base left, the tombstones go. */
    unpin_and_settle(base);
    for (uint32_t kg = 0; kg < 8; kg++) shm_table_unpin(arena, kg, cut[kg]);
    for (uint32_t kg = 0; kg < 8; kg++)
        for (int i = 0; i < 100000; i++) shm_table_maintain(arena, kg, 64);
    for (uint32_t kg = 0; kg < 8; kg++) {
        shm_table *t = &arena->tables[kg];
        cr_assert_eq(t->heads, atomic_load(&t->count), "key group %u: no tombstone left", kg);
    }
}

/* While the engine keeps deltas, a cut is a walk's pin until its key group
 * is serialized, then the next delta's base: a delete in between, with no
 * older base pinned (the first cut of a run), must leave its tombstone. */
Test(versions, a_delete_between_a_cut_and_its_rebase_is_in_the_next_delta)
{
    atomic_store(&arena->hdr->change_track, 1);
    for (uint32_t k = 0; k < 100; k++) put(k, k);
    uint32_t cut[8], next[8];
    pin_walks(cut);
    for (uint32_t k = 0; k < 100; k += 2) {
        key_in(w, k);
        cr_assert_eq(stash_state_clear(s), 0);
    }
    for (uint32_t kg = 0; kg < 8; kg++) shm_table_pin_rebase(arena, kg, cut[kg]);
    for (uint32_t kg = 0; kg < 8; kg++) shm_table_maintain(arena, kg, 1u << 20);
    pin_walks(next);
    static delta_check d;
    for (uint32_t kg = 0; kg < 8; kg++)
        cr_assert_eq(shm_table_walk_delta(arena, kg, cut[kg], next[kg], note_change, &d), 0);
    for (uint32_t k = 0; k < 100; k++)
        cr_assert_eq(d.met[k], k % 2 ? 0 : 2, "key %u: met %u", k, d.met[k]);
    for (uint32_t kg = 0; kg < 8; kg++) shm_table_unpin(arena, kg, next[kg]);
    unpin_and_settle(cut);
    atomic_store(&arena->hdr->change_track, 0);
}

/* A put in place under a base, killed with its redo in the undo record:
 * recovery writes the new value and stamps it with the current version, as
 * the put would have, so that a delta from the base finds it. */
Test(versions, a_put_redone_by_recovery_is_newer_than_the_base)
{
    uint32_t slot;
    cr_assert_eq(shm_reader_join(arena, &slot), 0);
    uint32_t k = 5;
    put(k, 50);
    shm_lookup l = lookup_of(&k);
    uint32_t base = (uint32_t)shm_table_pin_for(arena, l.kg, slot - STASH_MAX_WORKERS + 1, true);
    shm_table_pin_rebase(arena, l.kg, base);
    shm_table_maintain(arena, l.kg, 64); /* tended: the base sees no version */
    shm_cursor cur;
    cr_assert_eq(shm_table_find(arena, &l, &cur), 0);
    shm_table *t = &arena->tables[l.kg];
    cr_assert(shm_rec_mutable(t, cur.rec), "a base keeps no version");
    /* Killed with the redo saved and the value half written, before the
     * bracket closed. */
    uint64_t redo[4] = {52, 52, 52, 52};
    memcpy(t->undo.bytes, redo, sizeof redo);
    cr_assert_leq(cur.rec->version, base, "written before the base");
    shm_undo_open(arena, &t->undo, cur.rec, 0, sizeof redo);
    memset(shm_rec_value(cur.rec), 0xee, 8);
    shm_table_recover(arena, l.kg);
    cr_assert_gt(cur.rec->version, base, "stamped by the redo");
    cr_assert_eq(test_u64(shm_rec_value(cur.rec) + 24), 52);
    static delta_check d;
    uint32_t cut = (uint32_t)shm_table_pin_for(arena, l.kg, slot - STASH_MAX_WORKERS + 1, true);
    cr_assert_eq(shm_table_walk_delta(arena, l.kg, base, cut, note_change, &d), 0);
    cr_assert_eq(d.met[k], 1, "the redone put is in the delta");
    cr_assert_eq(d.value[k], 52);
    shm_table_unpin(arena, l.kg, cut);
    shm_table_unpin(arena, l.kg, base);
    shm_reader_leave(arena, slot);
}

/* After a pin that kept versions, the owner's sweep reads the index to drop
 * them; after walks' pins, whose records went to the log, there is nothing
 * to drop, and no sweep starts (it would read every index line). */
Test(versions, an_unpin_sweeps_only_a_table_that_kept_versions)
{
    for (uint32_t k = 0; k < 2000; k++) put(k, k);
    for (int walks = 0; walks < 2; walks++) {
        uint32_t pins[8];
        if (walks)
            pin_walks(pins);
        else
            pin_all(pins);
        for (uint32_t k = 0; k < 2000; k++) put(k, k + 1);
        for (uint32_t kg = 0; kg < 8; kg++) shm_table_unpin(arena, kg, pins[kg]);
        for (uint32_t kg = 0; kg < 8; kg++) {
            shm_table *t = &arena->tables[kg];
            shm_table_maintain(arena, kg, 1);
            cr_assert_eq(t->sweep_pos == UINT32_MAX, walks, "walks %d: key group %u swept %u",
                         walks, kg, t->sweep_pos);
            for (int i = 0; i < 100000 && t->sweep_pos != UINT32_MAX; i++)
                shm_table_maintain(arena, kg, 64);
            cr_assert_eq(t->marked, 0, "walks %d: key group %u keeps no version", walks, kg);
        }
        cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
    }
}

/* Recovers key group kg after a save of rec from version old was killed in
 * its bracket: rec's sequence is even again, and its version the new one
 * (past pin) if its entry was logged, else old. */
static void recover_save(uint32_t kg, shm_rec *rec, uint32_t pin, uint32_t old, int logged)
{
    shm_table_recover(arena, kg);
    cr_assert_eq(atomic_load(&rec->seq) & 1, 0);
    cr_assert(logged ? rec->version > pin : rec->version == old, "logged %d: version %u", logged,
              rec->version);
}

/* A save killed in its bracket: the new version stands only if the entry
 * made it into the log; the value is the old one either way. */
Test(versions, a_save_cut_short_keeps_the_old_version_unless_its_entry_is_logged)
{
    /* Pinned for a live reader process, as the engine pins: recovery keeps it. */
    uint32_t slot;
    cr_assert_eq(shm_reader_join(arena, &slot), 0);
    for (int logged = 0; logged < 2; logged++) {
        uint32_t k = 7;
        put(k, 70);
        shm_lookup l = lookup_of(&k);
        uint32_t pin = (uint32_t)shm_table_pin_for(arena, l.kg, slot - STASH_MAX_WORKERS + 1, true);
        shm_cursor cur;
        cr_assert_eq(shm_table_find(arena, &l, &cur), 0);
        shm_table *t = &arena->tables[l.kg];
        uint32_t old = cur.rec->version;
        if (logged) {
            /* Saved whole, then killed before the bracket closed. */
            cr_assert(shm_rec_save(arena, l.kg, cur.rec));
            atomic_store(&t->undo.rec, shm_ref_of(shm_off_of(arena, cur.rec)));
            t->undo.nregions = SHM_UNDO_SAVE;
            t->undo.vlen = old;
            atomic_fetch_add(&cur.rec->seq, 1);
        } else {
            /* Killed after the bracket opened, before the entry was in. */
            shm_undo_open(arena, &t->undo, cur.rec, SHM_UNDO_SAVE, old);
            cur.rec->version = atomic_load(&t->epoch);
        }
        recover_save(l.kg, cur.rec, pin, old, logged);
        key_in(w, k);
        stash_bytes b;
        cr_assert_eq(stash_value_get(s, &b), 0);
        cr_assert_eq(test_u64(b.data), 70);
        walk_check *c = calloc(1, sizeof *c);
        c->at_pin[k] = 70;
        for (uint32_t x = 0; x < WALKED; x++)
            if (x != k) c->at_pin[x] = UINT64_MAX;
        cr_assert_eq(shm_table_walk_at(arena, l.kg, pin, count_met, c), 0);
        cr_assert_eq(c->met[k], 1, "logged %d: met once", logged);
        free(c);
        shm_table_unpin(arena, l.kg, pin);
    }
    shm_reader_leave(arena, slot);
}

/* A put that saves its record and rewrites it in one bracket, killed before
 * the bracket closed: with the record whole in the log, the record keeps
 * the new version and takes its old value back from there; without, it
 * stays as it was. Either way the walk of the pin meets the old value once. */
Test(versions, a_save_and_put_cut_short_takes_the_old_value_back)
{
    uint32_t slot;
    cr_assert_eq(shm_reader_join(arena, &slot), 0);
    for (int logged = 0; logged < 2; logged++) {
        uint32_t k = 7, other = 8;
        put(k, 70);
        shm_lookup l = lookup_of(&k);
        while (lookup_of(&other).kg != l.kg) other++;
        put(other, 80);
        uint32_t pin = (uint32_t)shm_table_pin_for(arena, l.kg, slot - STASH_MAX_WORKERS + 1, true);
        /* The log's first chunk, so that the next save takes one bracket. */
        put(other, 81);
        shm_cursor cur;
        l = lookup_of(&k);
        cr_assert_eq(shm_table_find(arena, &l, &cur), 0);
        shm_table *t = &arena->tables[l.kg];
        uint32_t old = cur.rec->version;
        if (logged) {
            put(k, 71);
            cr_assert_eq(t->undo.nregions, SHM_UNDO_SAVE_PUT, "saved and put in one bracket");
            /* Killed with the value half written. */
            atomic_store(&t->undo.rec, shm_ref_of(shm_off_of(arena, cur.rec)));
            atomic_fetch_add(&cur.rec->seq, 1);
            memset(shm_rec_value(cur.rec) + 8, 0xee, 8);
        } else {
            /* Killed after the bracket opened, before the entry was in. */
            shm_undo_open(arena, &t->undo, cur.rec, SHM_UNDO_SAVE_PUT, old);
        }
        recover_save(l.kg, cur.rec, pin, old, logged);
        key_in(w, k);
        stash_bytes b;
        cr_assert_eq(stash_value_get(s, &b), 0);
        cr_assert_eq(b.len, 32);
        for (unsigned i = 0; i < 4; i++)
            cr_assert_eq(test_u64((const uint8_t *)b.data + 8 * i), 70, "logged %d: word %u",
                         logged, i);
        walk_check *c = calloc(1, sizeof *c);
        c->at_pin[k] = 70;
        c->at_pin[other] = 80;
        for (uint32_t x = 0; x < WALKED; x++)
            if (x != k && x != other) c->at_pin[x] = UINT64_MAX;
        cr_assert_eq(shm_table_walk_at(arena, l.kg, pin, count_met, c), 0);
        cr_assert(c->met[k] == 1 && c->met[other] == 1, "logged %d: met once", logged);
        free(c);
        cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
        shm_table_unpin(arena, l.kg, pin);
    }
    shm_reader_leave(arena, slot);
}

/* A walk in another process, as the engine's, of walks' pins while the
 * owner rewrites, grows, deletes and puts back keys as fast as it can. */
#define RACED 20000u
typedef struct raced_walk {
    const char *name;
    uint32_t pins[8];
    uint64_t at_pin[RACED]; /* UINT64_MAX: absent at the pin */
    unsigned met[RACED];
    _Atomic int done;
    char why[128];
} raced_walk;

static int check_raced(const shm_rec *r, void *ctx)
{
    raced_walk *p = ctx;
    uint64_t k;
    memcpy(&k, shm_rec_key(r), sizeof k);
    if (k >= RACED || p->met[k]++ || test_u64(shm_rec_value((shm_rec *)r)) != p->at_pin[k]) {
        snprintf(p->why, sizeof p->why, "key %llu: met %u times, %llu for %llu",
                 (unsigned long long)k, k < RACED ? p->met[k] : 0,
                 (unsigned long long)test_u64(shm_rec_value((shm_rec *)r)),
                 (unsigned long long)(k < RACED ? p->at_pin[k] : 0));
        return -1;
    }
    return 0;
}

static int walk_raced(void *arg)
{
    raced_walk *p = arg;
    stash_arena *a;
    uint32_t slot;
    int rc = stash_arena_open(p->name, NULL, &a);
    if (rc == 0) rc = shm_reader_join(a, &slot);
    for (uint32_t kg = 0; rc == 0 && kg < 8; kg++) {
        shm_table_walk_enter(a, kg, slot);
        rc = shm_table_walk_at(a, kg, p->pins[kg], check_raced, p);
        shm_table_walk_exit(a, kg, slot);
    }
    if (rc && !p->why[0]) snprintf(p->why, sizeof p->why, "%s", stash_errmsg());
    atomic_store(&p->done, 1);
    return rc == 0 ? 0 : 1;
}

Test(versions, a_walk_in_another_process_meets_each_record_once_as_of_its_pin, .timeout = 240)
{
    raced_walk *p =
        mmap(NULL, sizeof *p, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(p, MAP_FAILED);
    static uint64_t now[RACED];
    unsigned first = test_seed("a_walk_in_another_process"), seed = first;
    for (uint32_t k = 0; k < RACED; k++) put(k, now[k] = k);
    for (int round = 0; round < 40; round++) {
        memset(p, 0, sizeof *p);
        p->name = arena_name;
        memcpy(p->at_pin, now, sizeof now);
        pin_walks(p->pins);
        pid_t pid = test_fork(walk_raced, p);
        uint64_t v = (uint64_t)round << 32;
        /* Until the walk ends, or its process does without ending it
         * (looked at, not reaped: test_wait says how it ended). */
        siginfo_t si = {0};
        for (unsigned i = 0; !atomic_load(&p->done); i++) {
            if (i % 1024 == 0 && waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                si.si_pid)
                break;
            uint32_t k = (uint32_t)rand_r(&seed) % RACED, what = (uint32_t)rand_r(&seed) % 8;
            key_in(w, k);
            if (what == 0) {
                uint64_t grown[24] = {++v};
                cr_assert_eq(stash_value_put(s, grown, (size_t)(8 + rand_r(&seed) % 180)), 0);
                now[k] = v;
            } else if (what == 1) {
                cr_assert_eq(stash_state_clear(s), 0);
                now[k] = UINT64_MAX;
            } else {
                put(k, now[k] = ++v);
            }
        }
        int rc = test_wait(pid);
        cr_assert_eq(rc, 0, "seed %u, round %d: the walk's process: %d %s", first, round, rc,
                     p->why);
        for (uint32_t k = 0; k < RACED; k++)
            cr_assert_eq(p->met[k], p->at_pin[k] != UINT64_MAX, "seed %u, round %d: key %u met %u",
                         first, round, k, p->met[k]);
        for (uint32_t kg = 0; kg < 8; kg++) shm_table_unpin(arena, kg, p->pins[kg]);
    }
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
    munmap(p, sizeof *p);
}

static shm_rec *rec_of(uint32_t k)
{
    shm_lookup l = lookup_of(&k);
    shm_cursor c;
    cr_assert_eq(shm_table_find(arena, &l, &c), 0);
    return c.rec;
}

Test(versions, once_unpinned_a_record_is_rewritten_in_place_again)
{
    put(5, 1);
    shm_rec *before = rec_of(5);
    uint32_t pins[8];
    pin_all(pins);
    unpin_and_settle(pins);
    put(5, 2);
    cr_assert_eq(rec_of(5), before, "no pin sees it: rewritten in place, not copied");
    pin_walks(pins);
    put(5, 3);
    cr_assert_eq(rec_of(5), before, "only walks pin it: saved, then rewritten in place");
    unpin_and_settle(pins);
}

/* An arena that fills while a walk's pin is held: a rewrite the log has no
 * room for fails whole, naming the key group, and the walk still meets
 * every key once, as of its pin. */
#define FILLED (1u << 17)
typedef struct fill_check {
    uint32_t met[FILLED];
    uint32_t n;
} fill_check;

/* Keys below n held their own number at the pin, but every sixteenth, gone. */
static int count_filled(const shm_rec *r, void *ctx)
{
    fill_check *c = ctx;
    uint64_t k;
    memcpy(&k, shm_rec_key(r), sizeof k);
    cr_assert(k < c->n && k % 16 != 0, "key %llu was not there", (unsigned long long)k);
    cr_assert_eq(test_u64(shm_rec_value((shm_rec *)r)), k, "key %llu as of the pin",
                 (unsigned long long)k);
    c->met[k]++;
    return 0;
}

Test(versions, a_save_the_arena_has_no_room_for_fails_whole)
{
    char name[96];
    stash_arena *small = test_arena_create("verfull", 4u << 20, 8, name);
    stash_worker *sw;
    stash_state *ss;
    cr_assert_eq(
        stash_worker_open(
            name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 1},
            &sw),
        0);
    cr_assert_eq(
        stash_state_get(
            sw,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &ss),
        0);
    static fill_check c;
    uint32_t n = 0;
    for (int rc = 0; rc == 0 && n < FILLED; n++) {
        uint64_t k = n, v[4] = {n, n, n, n};
        stash_key_set(sw, &k, sizeof k);
        rc = stash_value_put(ss, v, sizeof v);
        if (rc) cr_assert_eq(rc, STASH_EFULL, "%s", stash_errmsg());
    }
    n--; /* the last put failed */
    cr_assert_lt(n, FILLED, "the arena filled");
    c.n = n;
    /* Room for a few pre-images only. */
    for (uint64_t k = 0; k < n; k += 16) {
        stash_key_set(sw, &k, sizeof k);
        cr_assert_eq(stash_state_clear(ss), 0);
    }
    for (uint32_t kg = 0; kg < 8; kg++) shm_table_maintain(small, kg, 1u << 20);
    uint32_t pins[8];
    for (uint32_t kg = 0; kg < 8; kg++) pins[kg] = (uint32_t)shm_table_pin_for(small, kg, 0, true);
    uint32_t done = 0, full = 0;
    for (uint64_t k = 1; k < n; k++) {
        if (k % 16 == 0) continue;
        uint64_t v[4] = {k + 1000000, 0, 0, 0};
        stash_key_set(sw, &k, sizeof k);
        int rc = stash_value_put(ss, v, sizeof v);
        if (rc == 0) {
            done++;
            continue;
        }
        full++;
        cr_assert_eq(rc, STASH_EFULL, "%s", stash_errmsg());
        cr_assert(strstr(stash_errmsg(), "key group"), "%s", stash_errmsg());
        stash_bytes b;
        cr_assert_eq(stash_value_get(ss, &b), 0);
        cr_assert_eq(test_u64(b.data), k, "key %llu unchanged", (unsigned long long)k);
    }
    cr_assert(done > 0 && full > 0, "saved %u, refused %u", done, full);
    for (uint32_t kg = 0; kg < 8; kg++)
        cr_assert_eq(shm_table_walk_at(small, kg, pins[kg], count_filled, &c), 0, "%s",
                     stash_errmsg());
    for (uint32_t k = 0; k < n; k++)
        cr_assert_eq(c.met[k], k % 16 != 0, "key %u met once if it was there", k);
    cr_assert_eq(shm_check(small), 0, "%s", stash_errmsg());
    for (uint32_t kg = 0; kg < 8; kg++) shm_table_unpin(small, kg, pins[kg]);
    stash_worker_close(sw);
    stash_arena_close(small);
    stash_arena_destroy(name, NULL);
}
