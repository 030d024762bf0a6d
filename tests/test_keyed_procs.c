/* SPDX-License-Identifier: MIT */
/*
 * test_keyed_procs.c: keyed state across real processes. An owner writes
 * values that carry their own checksum while another process reads them: a
 * read is never torn. An owner killed with SIGKILL in the middle of writes
 * leaves a table that a new owner finds consistent, every value whole. A
 * reader finds every key its owner has put while the index grows.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "tests/helpers.h"

/* A value of len bytes: a 4-byte length, a stamp, filler, an 8-byte checksum. */
static size_t make_value(uint8_t *buf, uint32_t len, uint64_t stamp)
{
    memcpy(buf, &len, 4);
    for (uint32_t i = 4; i + 8 < len; i++) buf[i] = (uint8_t)(stamp * 31 + i);
    uint64_t h = XXH3_64bits(buf, len - 8);
    memcpy(buf + len - 8, &h, 8);
    return len;
}

static bool value_whole(const void *p, size_t len)
{
    uint32_t n;
    uint64_t h;
    if (len < 16) return false;
    memcpy(&n, p, 4);
    memcpy(&h, (const uint8_t *)p + len - 8, 8);
    return n == len && XXH3_64bits(p, len - 8) == h;
}

static stash_worker *join(const char *name, uint32_t index, uint32_t p)
{
    stash_worker *w;
    int rc = stash_worker_open(
        name,
        &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = index, .parallelism = p},
        &w);
    cr_assert_eq(rc, 0, "%s", stash_errmsg());
    return w;
}

static stash_state *get_state(stash_worker *w, const char *name, stash_kind kind)
{
    stash_state *s = NULL;
    stash_state_get(
        w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = name, .kind = kind}, &s);
    return s;
}

/* The first n keys (4-byte counters) in key groups 0 to 63: those of worker
 * 0 of 2 in an arena of 128. */
static void first_half_keys(stash_worker *w, uint32_t *keys, uint32_t n)
{
    for (uint32_t k = 0, i = 0; i < n; k++) {
        stash_key_set(w, &k, sizeof k);
        if (stash_key_group_current(w) < 64) keys[i++] = k;
    }
}

/* ---- a reader in another process never sees a torn value ----------------- */

#define KEYS 4000u

typedef struct shared_run {
    _Atomic int done;
    _Atomic uint64_t reads;
} shared_run;

typedef struct reader_args {
    const char *name;
    shared_run *run;
    uint32_t *keys; /* keys the owner (worker 0) holds */
} reader_args;

static int read_foreign(void *arg)
{
    reader_args *r = arg;
    stash_worker *w;
    if (stash_worker_open(
            r->name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 1, .parallelism = 2},
            &w))
        return 1;
    stash_state *v = get_state(w, "v", STASH_VALUE), *l = get_state(w, "l", STASH_LIST);
    if (!v || !l) return 2;
    uint64_t x = 12345;
    while (!atomic_load(&r->run->done)) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t k = r->keys[x % KEYS];
        stash_key_set(w, &k, sizeof k);
        stash_bytes b;
        int rc = stash_value_get(v, &b);
        if (rc == 0 && !value_whole(b.data, b.len)) return 10;
        if (rc != 0 && rc != STASH_ENOTFOUND) return 11;
        stash_iter it;
        if (stash_list_get(l, &it) == 0)
            while (stash_iter_next(&it, NULL, &b) == 1)
                if (!value_whole(b.data, b.len)) return 12;
        atomic_fetch_add(&r->run->reads, 1);
    }
    stash_worker_close(w);
    return 0;
}

Test(procs, another_process_never_reads_a_torn_value, .timeout = 300)
{
    char name[96];
    stash_arena *a = test_arena_create("torn", 256u << 20, 128, name);
    stash_worker *w = join(name, 0, 2);
    stash_state *v = get_state(w, "v", STASH_VALUE), *l = get_state(w, "l", STASH_LIST);
    shared_run *run =
        mmap(NULL, sizeof *run, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    static uint32_t keys[KEYS];
    first_half_keys(w, keys, KEYS);
    reader_args args = {name, run, keys};
    pid_t pid = test_fork(read_foreign, &args);
    static uint8_t buf[70000];
    uint64_t x = 99;
    for (uint64_t i = 0; i < 400000 || atomic_load(&run->reads) < 1000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t k = keys[x % KEYS];
        stash_key_set(w, &k, sizeof k);
        uint32_t len = x % 97 == 0 ? 40000 + (uint32_t)(x >> 40) % 20000 : 16 + (x >> 20) % 300;
        if (x % 5 == 0) {
            stash_list_add(l, buf, make_value(buf, 16 + (uint32_t)(x >> 24) % 64, i));
            if (x % 50 == 0) stash_list_update(l, NULL, 0);
        } else if (x % 11 == 0) {
            cr_assert_eq(stash_value_put(v, NULL, 0), 0);
        } else {
            cr_assert_eq(stash_value_put(v, buf, make_value(buf, len, i)), 0, "%s", stash_errmsg());
        }
        if (i % 1000 == 0) {
            /* Pins make the owner copy on write, as checkpoints will. */
            int64_t p = shm_table_pin(a, (uint32_t)(x % 64));
            if (p > 0) shm_table_unpin(a, (uint32_t)(x % 64), (uint32_t)p);
        }
    }
    atomic_store(&run->done, 1);
    cr_assert_eq(test_wait(pid), 0, "the reader saw only whole values");
    cr_assert_gt(atomic_load(&run->reads), 1000);
    stash_worker_close(w);
    cr_assert_eq(shm_check(a), 0, "%s", stash_errmsg());
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

/* ---- a reader in another process finds every key while the index grows ---- */

#define GROWN_KEYS 60000u

typedef struct growth_run {
    _Atomic uint32_t published; /* keys[0 .. published-1] are in the state */
    _Atomic int done;
    _Atomic uint64_t reads;
    _Atomic int failed; /* the reader's exit code once it failed */
    uint32_t missed;    /* the key a failed read looked for */
} growth_run;

typedef struct finder_args {
    const char *name;
    growth_run *run;
    const uint32_t *keys;
} finder_args;

/* Reads keys the owner has published, in its key groups, until told to stop:
 * each must be found, with the value the owner put (its index in keys). */
static int find_keys(finder_args *f)
{
    stash_worker *w;
    if (stash_worker_open(
            f->name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 1, .parallelism = 2},
            &w))
        return 1;
    stash_state *v = get_state(w, "v", STASH_VALUE);
    if (!v) return 2;
    uint64_t x = 4242;
    while (!atomic_load(&f->run->done)) {
        uint32_t n = atomic_load_explicit(&f->run->published, memory_order_acquire);
        if (n == 0) continue;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        /* Half the reads go to the newest keys, which growth moves last. */
        uint32_t j =
            x & 1 ? (uint32_t)(x >> 8) % n : n - 1 - (uint32_t)(x >> 8) % (n < 64 ? n : 64);
        uint32_t k = f->keys[j];
        stash_key_set(w, &k, sizeof k);
        stash_bytes b;
        uint64_t got = UINT64_MAX;
        if (stash_value_get(v, &b) == 0 && b.len == sizeof got) memcpy(&got, b.data, sizeof got);
        if (got != j) {
            f->run->missed = k;
            return 10;
        }
        atomic_fetch_add(&f->run->reads, 1);
    }
    stash_worker_close(w);
    return 0;
}

static int find_published(void *arg)
{
    finder_args *f = arg;
    int rc = find_keys(f);
    if (rc) atomic_store(&f->run->failed, rc);
    return rc;
}

/* Lookups from other processes take no lock: while entries move into a
 * larger index, a reader probes the array being emptied, then the new one.
 * Every key the owner has put must be found, through every growth of its
 * key groups. */
Test(procs, another_process_finds_every_key_while_the_index_grows, .timeout = 300)
{
    char name[96];
    stash_arena *a = test_arena_create("grown", 128u << 20, 128, name);
    stash_worker *w = join(name, 0, 2);
    stash_state *v = get_state(w, "v", STASH_VALUE);
    growth_run *run =
        mmap(NULL, sizeof *run, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(run, MAP_FAILED);
    static uint32_t keys[GROWN_KEYS];
    first_half_keys(w, keys, GROWN_KEYS);
    finder_args args = {name, run, keys};
    pid_t pid = test_fork(find_published, &args);
    for (uint32_t j = 0; j < GROWN_KEYS; j++) {
        stash_key_set(w, &keys[j], sizeof keys[j]);
        uint64_t val = j;
        cr_assert_eq(stash_value_put(v, &val, sizeof val), 0, "%s", stash_errmsg());
        atomic_store_explicit(&run->published, j + 1, memory_order_release);
        /* Let the reader keep up with the writes now and then. */
        if (j % 16 == 0) {
            uint64_t until = atomic_load(&run->reads) + 4;
            while (atomic_load(&run->reads) < until && !atomic_load(&run->failed)) {
            }
        }
    }
    /* Each growth counts twice: its switch to a new array and its end. */
    uint32_t least = UINT32_MAX;
    for (uint32_t kg = 0; kg < 64; kg++) {
        uint32_t r = atomic_load(&a->tables[kg].resizes);
        least = r < least ? r : least;
    }
    atomic_store(&run->done, 1);
    int rc = test_wait(pid);
    cr_assert_eq(rc, 0, "the reader missed key %u (exit %d)", run->missed, rc);
    cr_assert_geq(least, 8u, "every key group's index grew four times or more");
    cr_assert_gt(atomic_load(&run->reads), GROWN_KEYS / 16);
    stash_worker_close(w);
    cr_assert_eq(shm_check(a), 0, "%s", stash_errmsg());
    munmap(run, sizeof *run);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

/* ---- an owner killed in the middle of writes -------------------------------- */

typedef struct writer_args {
    const char *name;
    int ready[2];
} writer_args;

static int write_forever(void *arg)
{
    writer_args *wa = arg;
    stash_worker *w;
    if (stash_worker_open(
            wa->name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 1},
            &w))
        return 1;
    stash_state *v = get_state(w, "v", STASH_VALUE), *l = get_state(w, "l", STASH_LIST),
                *m = get_state(w, "m", STASH_MAP);
    if (write(wa->ready[1], "x", 1) != 1) return 2;
    static uint8_t buf[70000];
    uint64_t x = (uint64_t)getpid() * 7919 + 1;
    for (uint64_t i = 0;; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t k = (uint32_t)(x % 3000);
        stash_key_set(w, &k, sizeof k);
        uint32_t len = x % 97 == 0 ? 33000 + (uint32_t)(x >> 40) % 9000 : 16 + (x >> 20) % 400;
        switch (x % 7) {
        case 0:
            stash_list_add(l, buf, make_value(buf, 16 + (uint32_t)(x >> 24) % 64, i));
            break;
        case 1:
            stash_value_put(v, NULL, 0);
            break;
        case 2: {
            uint32_t uk = (uint32_t)(x >> 32) % 50;
            stash_map_put(m, &uk, sizeof uk, buf,
                          make_value(buf, 16 + (uint32_t)(x >> 28) % 40, i));
            break;
        }
        case 3: {
            uint32_t uk = (uint32_t)(x >> 32) % 50;
            stash_map_remove(m, &uk, sizeof uk);
            break;
        }
        default:
            stash_value_put(v, buf, make_value(buf, len, i));
            break;
        }
    }
    return 0;
}

static void check_all_whole(stash_worker *w)
{
    stash_state *v = get_state(w, "v", STASH_VALUE), *l = get_state(w, "l", STASH_LIST),
                *m = get_state(w, "m", STASH_MAP);
    for (uint32_t k = 0; k < 3000; k++) {
        stash_key_set(w, &k, sizeof k);
        stash_bytes b, key;
        stash_iter it;
        if (stash_value_get(v, &b) == 0) cr_assert(value_whole(b.data, b.len), "value of %u", k);
        if (stash_list_get(l, &it) == 0)
            while (stash_iter_next(&it, NULL, &b) == 1)
                cr_assert(value_whole(b.data, b.len), "list element of %u", k);
        if (stash_map_iter(m, &it) == 0)
            while (stash_iter_next(&it, &key, &b) == 1)
                cr_assert(value_whole(b.data, b.len), "map entry of %u", k);
    }
}

Test(procs, an_owner_killed_mid_write_leaves_a_consistent_table, .timeout = 600)
{
    char name[96];
    stash_arena *a = test_arena_create("killw", 512u << 20, 16, name);
    writer_args wa = {.name = name};
    cr_assert_eq(pipe(wa.ready), 0);
    srand(test_seed("an_owner_killed_mid_write_leaves_a_consistent_table"));
    for (int round = 0; round < 25; round++) {
        pid_t pid = test_kill_running(write_forever, &wa, wa.ready[0], 1000, 31000);
        stash_worker *w = join(name, 0, 1);
        stash_worker_info info;
        stash_worker_info_get(w, &info);
        cr_assert_eq(info.previous_pid, pid);
        cr_assert_eq(shm_check(a), 0, "round %d: %s", round, stash_errmsg());
        check_all_whole(w);
        stash_worker_close(w);
    }
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

/* An owner that died in the middle of an in-place change: another process's
 * read does not spin for ever, it says so. */
static int write_and_die(void *arg)
{
    stash_worker *w;
    if (stash_worker_open(
            arg,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 2},
            &w))
        return 1;
    stash_state *v = get_state(w, "v", STASH_VALUE);
    for (uint32_t k = 0; k < 100; k++) {
        stash_key_set(w, &k, sizeof k);
        stash_value_put(v, "0123456789abcdef", 16);
    }
    _exit(0); /* no clean leave: as if killed */
}

Test(procs, a_read_of_a_change_its_dead_owner_left_half_done_fails_clearly, .timeout = 60)
{
    char name[96];
    stash_arena *a = test_arena_create("halfdone", 16u << 20, 128, name);
    cr_assert_eq(test_wait(test_fork(write_and_die, name)), 0);
    stash_worker *w = join(name, 1, 2);
    stash_state *v = get_state(w, "v", STASH_VALUE);
    uint32_t k = 0;
    for (stash_key_set(w, &k, sizeof k); stash_key_group_current(w) >= 64;) {
        k++;
        stash_key_set(w, &k, sizeof k);
    }
    stash_bytes b;
    cr_assert_eq(stash_value_get(v, &b), 0, "a whole value reads");
    /* Leave the record as a write killed half-way leaves it: sequence odd. */
    shm_lookup l;
    state_lookup(v, &l);
    shm_cursor c;
    cr_assert_eq(shm_table_find(a, &l, &c), 0);
    atomic_fetch_add(&c.rec->seq, 1);
    cr_assert_eq(stash_value_get(v, &b), -EAGAIN);
    cr_assert(strstr(stash_errmsg(), "owner died"), "%s", stash_errmsg());
    stash_worker_close(w);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

typedef struct forked_use {
    stash_worker *w;
    stash_state *v;
} forked_use;

/* In a child: the parent's handle refuses every use and closes without
 * touching the parent's registration. Exit code: 0, or which check failed. */
static int use_parents_handle(void *arg)
{
    forked_use *f = arg;
    uint64_t k = 1, v = 99;
    stash_event ev;
    if (stash_value_put(f->v, &v, sizeof v) != STASH_ENOKEY) return 1;
    if (stash_key_set(f->w, &k, sizeof k) != STASH_EFORK) return 2;
    if (!strstr(stash_errmsg(), "another process")) return 3;
    if (stash_value_put(f->v, &v, sizeof v) != STASH_ENOKEY) return 4;
    if (stash_barrier(f->w, &ev) != STASH_EFORK) return 5;
    stash_state *s;
    if (stash_state_get(
            f->w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "x", .kind = STASH_VALUE},
            &s) != STASH_EFORK)
        return 6;
    stash_worker_close(f->w);
    return 0;
}

Test(procs, a_handle_used_in_a_forked_child_is_refused_and_the_parent_goes_on, .timeout = 60)
{
    char name[96];
    stash_arena *a = test_arena_create("forked", 0, 8, name);
    forked_use f;
    cr_assert_eq(stash_worker_open(name, NULL, &f.w), 0);
    cr_assert_eq(
        stash_state_get(
            f.w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &f.v),
        0);
    uint64_t k = 1, v = 7;
    stash_key_set(f.w, &k, sizeof k);
    cr_assert_eq(stash_value_put(f.v, &v, sizeof v), 0);
    cr_assert_eq(test_wait(test_fork(use_parents_handle, &f)), 0);
    /* The parent's handle, slot and value are as they were. */
    stash_worker_info info;
    cr_assert_eq(stash_worker_info_get(f.w, &info), 0);
    cr_assert_eq(info.state, STASH_WORKER_LIVE);
    cr_assert_eq(info.pid, getpid());
    stash_bytes b;
    cr_assert_eq(stash_value_get(f.v, &b), 0);
    cr_assert_eq(test_u64(b.data), 7);
    v = 8;
    cr_assert_eq(stash_value_put(f.v, &v, sizeof v), 0);
    stash_worker_close(f.w);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}
