/*
 * test_versions.c: records carry the version they were written in. A reader
 * pinned to version N sees the state as of N while the owner writes N+1, in
 * this process and in another; unpinning gives the old versions back; the
 * table grows a few buckets per write; memory unlinked while a reader
 * process reads is freed after it leaves, or after it dies.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "tests/helpers.h"

static char arena_name[96];
static stash_arena *arena;
static stash_worker *w;
static stash_state *s;

static void setup(void)
{
    arena = test_arena_create("ver", 128u << 20, 8, arena_name);
    cr_assert_eq(
        stash_worker_open(arena_name, &(stash_worker_opts){.index = 0, .parallelism = 1}, &w), 0);
    cr_assert_eq(stash_state_get(w, &(stash_state_desc){.name = "v", .kind = STASH_VALUE}, &s), 0);
}

static void teardown(void)
{
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
    stash_worker_close(w);
    stash_arena_close(arena);
    stash_arena_destroy(arena_name, NULL);
}

TestSuite(versions, .init = setup, .fini = teardown);

static void put(uint32_t k, uint64_t v)
{
    stash_key_set(w, &k, sizeof k);
    uint64_t buf[4] = {v, v, v, v};
    cr_assert_eq(stash_value_put(s, buf, sizeof buf), 0);
}

static shm_lookup lookup_of(uint32_t *k)
{
    stash_key_set(w, k, sizeof *k);
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
        stash_key_set(w, &k, sizeof k);
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
        uint32_t n = shm_table_positions(arena, kg);
        for (uint32_t p = 0; p < n; p++)
            for (shm_ref r = shm_table_bucket(arena, kg, p); r;
                 r = atomic_load(&shm_rec_at(arena, r)->next))
                cr_assert_eq(atomic_load(&shm_rec_at(arena, r)->older), 0,
                             "no old version is kept once nobody pins it");
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

Test(versions, growth_moves_a_few_buckets_per_write)
{
    bool saw_rehash = false;
    uint32_t kg = 0, prev_pos = 0;
    for (uint32_t k = 0; k < 100000; k++) {
        put(k, k);
        shm_table *t = &arena->tables[kg];
        if (atomic_load(&t->old_buckets)) {
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
        stash_key_set(w, &k, sizeof k);
        stash_bytes v;
        cr_assert_eq(stash_value_get(s, &v), 0);
        cr_assert_eq(test_u64(v.data), k);
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
    if (stash_worker_open(p->name, &(stash_worker_opts){.index = 1, .parallelism = 2}, &rw))
        return 1;
    if (stash_state_get(rw, &(stash_state_desc){.name = "v", .kind = STASH_VALUE}, &rs)) return 2;
    stash_arena *a = stash_worker_arena(rw);
    static uint32_t keys[3000];
    for (uint32_t k = 0, n = 0; n < 3000; k++) {
        stash_key_set(rw, &k, sizeof k);
        if (stash_key_group_current(rw) < 4) keys[n++] = k;
    }
    if (write(p->ready[1], "x", 1) != 1) return 3;
    for (int round = 0; round < 50; round++) {
        for (uint32_t i = 0; i < 3000; i++) {
            stash_key_set(rw, &keys[i], sizeof keys[i]);
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
        stash_worker_open(arena_name, &(stash_worker_opts){.index = 0, .parallelism = 2}, &w), 0);
    cr_assert_eq(stash_state_get(w, &(stash_state_desc){.name = "v", .kind = STASH_VALUE}, &s), 0);
    /* Worker 0 of 2 owns key groups 0..3: use keys that fall there. */
    pinned_args p = {.name = arena_name};
    cr_assert_eq(pipe(p.ready), 0);
    uint32_t keys[3000], n = 0;
    for (uint32_t k = 0; n < 3000; k++) {
        stash_key_set(w, &k, sizeof k);
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
    if (stash_worker_open(p->name, &(stash_worker_opts){.index = 1, .parallelism = 2}, &rw))
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
        stash_worker_open(arena_name, &(stash_worker_opts){.index = 0, .parallelism = 2}, &w), 0);
    cr_assert_eq(stash_state_get(w, &(stash_state_desc){.name = "v", .kind = STASH_VALUE}, &s), 0);
    uint32_t key = 0;
    for (stash_key_set(w, &key, sizeof key); stash_key_group_current(w) >= 4;) {
        key++;
        stash_key_set(w, &key, sizeof key);
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

/* Brings key group kg into a rehash whose next old bucket holds two records
 * or more; returns that bucket's head. */
static _Atomic shm_ref *rehash_with_a_full_bucket(uint32_t kg, uint32_t *next_key)
{
    shm_table *t = &arena->tables[kg];
    for (uint32_t k = *next_key;; k++) {
        stash_key_set(w, &k, sizeof k);
        if ((uint32_t)stash_key_group_current(w) != kg) continue;
        uint64_t v = k;
        cr_assert_eq(stash_value_put(s, &v, sizeof v), 0);
        shm_off old = atomic_load(&t->old_buckets);
        if (!old) continue;
        _Atomic shm_ref *head =
            &((_Atomic shm_ref *)(arena->base + old))[atomic_load(&t->migrate_pos)];
        shm_ref r = atomic_load(head);
        if (r && atomic_load(&shm_rec_at(arena, r)->next)) {
            *next_key = k + 1;
            return head;
        }
    }
}

static void expect_all_readable(uint32_t upto)
{
    for (uint32_t k = 0; k < upto; k++) {
        stash_key_set(w, &k, sizeof k);
        if (stash_key_group_current(w) != 0) continue;
        stash_bytes b;
        cr_assert_eq(stash_value_get(s, &b), 0, "key %u", k);
        cr_assert_eq(test_u64(b.data), k);
    }
}

Test(versions, a_rehash_cut_short_by_a_crash_is_finished_by_recovery)
{
    uint32_t next = 0;
    for (int variant = 0; variant < 2; variant++) {
        shm_table *t = &arena->tables[0];
        _Atomic shm_ref *head = rehash_with_a_full_bucket(0, &next);
        shm_ref r = atomic_load(head);
        shm_rec *rec = shm_rec_at(arena, r);
        /* As rehash_step leaves it when killed: the first record taken off
         * the old bucket (variant 0: in neither chain; variant 1: already in
         * its new bucket), the rest of the bucket not moved yet. */
        atomic_store(&t->moving, r);
        atomic_store(head, atomic_load(&rec->next));
        if (variant == 1) {
            _Atomic shm_ref *to =
                &((_Atomic shm_ref *)(arena->base + t->buckets))[rec->hash & ((1u << t->log2) - 1)];
            atomic_store(&rec->next, atomic_load(to));
            atomic_store(to, r);
            atomic_store(&t->moving, 0);
        }
        shm_table_recover(arena, 0);
        cr_assert_eq(shm_check(arena), 0, "variant %d: %s", variant, stash_errmsg());
        expect_all_readable(next);
    }
}
