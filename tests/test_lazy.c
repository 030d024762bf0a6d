/* SPDX-License-Identifier: MIT */
/*
 * test_lazy.c: instant recovery. An arena restored lazily serves at once:
 * a key group comes from the checkpoint when its owner or a reader first
 * touches it, and only that one; a process killed while restoring one is
 * taken over, what it wrote cleared first; a damaged block fails its key
 * group alone; a checkpoint taken meanwhile copies the blocks of the key
 * groups not whole at its cut; a service started with lazy_restore serves
 * workers in other processes, takes a checkpoint that holds every key, and
 * goes on with the restore after it was killed; a damaged block makes the
 * arena fall back to the newest checkpoint that restores whole (its
 * workers told so), or stops the service where there is none.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/checkpoint/checkpoints.h"
#include "tests/helpers.h"

#define KGS 16u
#define KEYS 40000u

static char dir[128];
static ioe_engine *eng;

static uint64_t value_of(uint64_t k)
{
    return k * 7 + 3;
}

static stash_state *value_state(stash_worker *w)
{
    stash_state *s;
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &s),
        0, "%s", stash_errmsg());
    return s;
}

/* Checkpoint id of arena a in dir, every key group pinned. */
static void checkpoint(stash_arena *a, uint64_t id)
{
    uint32_t pins[KGS];
    for (uint32_t kg = 0; kg < KGS; kg++) pins[kg] = (uint32_t)shm_table_pin(a, kg);
    cr_assert_eq(
        ckpt_write(a, pins, &(ckpt_opts){.dir = test_ckpt_dir(dir), .id = id, .engine = eng}, NULL),
        0, "%s", stash_errmsg());
    for (uint32_t kg = 0; kg < KGS; kg++) shm_table_unpin(a, kg, pins[kg]);
}

/* Checkpoint id in dir of an arena of KEYS keys, key k holding value(k). */
static void checkpoint_of(uint64_t id, uint64_t (*value)(uint64_t))
{
    char name[96];
    stash_arena *a = test_arena_create("lazysrc", 64u << 20, KGS, name);
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w),
        0);
    stash_state *s = value_state(w);
    for (uint64_t k = 0; k < KEYS; k++) {
        uint64_t v = value(k);
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_put(s, &v, sizeof v), 0);
    }
    stash_worker_close(w);
    checkpoint(a, id);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

/* Checkpoint 1 in dir of KEYS keys, key k holding value_of(k). */
static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/stash-test-lazy-%d", (int)getpid());
    test_remove_dir(dir);
    cr_assert_eq(mkdir(dir, 0700), 0);
    cr_assert_eq(ioe_engine_open(&(ioe_opts){0}, &eng), 0);
    checkpoint_of(1, value_of);
}

static void teardown(void)
{
    ioe_engine_close(eng);
    test_remove_dir(dir);
}

TestSuite(lazy, .init = setup, .fini = teardown);

/* A new arena with a lazy restore of checkpoint 1 begun: nothing there. */
static stash_arena *begin(const char *tag, char *name)
{
    stash_arena *a = test_arena_create(tag, 64u << 20, KGS, name);
    char path[256];
    snprintf(path, sizeof path, "%s/chk-1", dir);
    ckpt_restored out;
    cr_assert_eq(ckpt_lazy_begin(a, path, (stash_kg_range){0, KGS - 1}, eng, &out), 0, "%s",
                 stash_errmsg());
    cr_assert_eq(out.id, 1);
    ckpt_restored_free(&out);
    cr_assert_eq(atomic_load(&a->control->lazy_left), KGS);
    return a;
}

/* The key groups not restored yet. */
static uint32_t left(const stash_arena *a)
{
    uint32_t n = 0;
    for (uint32_t kg = 0; kg < KGS; kg++) n += atomic_load(&a->tables[kg].lazy) != 0;
    return n;
}

static void expect_all(stash_worker *w)
{
    stash_state *s = value_state(w);
    for (uint64_t k = 0; k < KEYS; k++) {
        cr_assert_eq(stash_key_set(w, &k, sizeof k), 0, "key %llu: %s", (unsigned long long)k,
                     stash_errmsg());
        stash_bytes b;
        cr_assert_eq(stash_value_get(s, &b), 0, "key %llu restored", (unsigned long long)k);
        cr_assert_eq(test_u64(b.data), value_of(k), "key %llu exact", (unsigned long long)k);
    }
}

/* A key whose key group is kg. */
static uint64_t key_in(uint32_t kg)
{
    for (uint64_t k = 0;; k++)
        if (stash_key_group(&k, sizeof k, KGS) == kg) return k;
}

/* Whether an lmdb arena's key group kg has its environment file. */
static bool env_exists(const stash_arena *a, uint32_t kg)
{
    char path[SHM_LMDB_DIR + 32];
    snprintf(path, sizeof path, "%s/kg-%05u.mdb", a->hdr->lmdb_dir, kg);
    struct stat sb;
    return stat(path, &sb) == 0;
}

Test(lazy, a_touch_restores_that_key_group_alone_for_owners_and_readers)
{
    char name[96];
    stash_arena *a = begin("lazy1", name);
    stash_worker *w, *r;
    cr_assert_eq(
        stash_worker_open(
            name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w),
        0);
    stash_state *s = value_state(w);
    uint64_t k = key_in(5);
    stash_bytes b;
    cr_assert_eq(stash_key_set(w, &k, sizeof k), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_value_get(s, &b), 0);
    cr_assert_eq(test_u64(b.data), value_of(k));
    cr_assert_eq(left(a), KGS - 1, "the owner's touch brought key group 5 alone");
    cr_assert_eq(atomic_load(&a->tables[5].lazy), 0);
    if (test_backend() == STASH_BACKEND_LMDB) {
        /* Its environment alone was made from the checkpoint's blocks. */
        cr_assert(env_exists(a, 5), "key group 5's environment");
        cr_assert_not(env_exists(a, 7), "no environment for key group 7 yet");
    }
    /* A reader in another process brings the key group it reads. */
    uint64_t rk = key_in(9);
    pid_t pid = fork();
    if (pid == 0) {
        stash_worker *rd;
        if (stash_reader_open(name, NULL, &rd)) _exit(1);
        stash_state *rs;
        if (stash_state_get(rd,
                            &(stash_state_desc){
                                .sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
                            &rs))
            _exit(2);
        stash_bytes v;
        if (stash_key_set(rd, &rk, sizeof rk) || stash_value_get(rs, &v)) _exit(3);
        _exit(test_u64(v.data) == value_of(rk) ? 0 : 4);
    }
    cr_assert_eq(test_wait(pid), 0, "the reader read key group 9's value");
    cr_assert_eq(left(a), KGS - 2);
    /* A worker's walk of a key group brings it too. */
    stash_iter it;
    cr_assert_eq(stash_kg_keys_iter(s, 12, NULL, 0, &it), 0, "%s", stash_errmsg());
    stash_bytes key;
    uint64_t n = 0;
    while (stash_iter_next(&it, &key, NULL) == 1) n++;
    cr_assert_gt(n, 0, "key group 12's keys");
    cr_assert_eq(left(a), KGS - 3);
    /* Every other key, through a reader of this process, then the owner. */
    cr_assert_eq(stash_reader_open(name, NULL, &r), 0);
    expect_all(r);
    cr_assert_eq(left(a), 0);
    cr_assert_not(ckpt_lazy_pending(a));
    expect_all(w);
    stash_worker_close(r);
    stash_worker_close(w);
    cr_assert_eq(shm_check(a), 0, "%s", stash_errmsg());
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

/* The background pass in a child, killed at a random moment: the pass
 * started again takes the dead child's key group over and every value is
 * exact. */
static int fill(void *arg)
{
    stash_arena *a;
    if (stash_arena_open(arg, NULL, &a)) return 1;
    return ckpt_lazy_fill(a, NULL, NULL) ? 2 : 0;
}

/* The entries of every key group, as the arena's store counts them. */
static int64_t entries(stash_arena *a)
{
    store *st;
    cr_assert_eq(store_open(a, 0, (stash_kg_range){0, KGS - 1}, &st), 0, "%s", stash_errmsg());
    int64_t n = 0;
    for (uint32_t kg = 0; kg < KGS; kg++) n += st->ops->kg_entries(st, kg);
    store_close(st);
    return n;
}

Test(lazy, a_restorer_killed_midway_is_taken_over, .timeout = 120)
{
    unsigned seed = test_seed("a_restorer_killed_midway_is_taken_over");
    for (int round = 0; round < 6; round++) {
        char name[96];
        stash_arena *a = begin("lazy2", name);
        pid_t pid = test_fork(fill, name);
        /* Kill it once it has brought some key groups, at a random instant. */
        uint32_t after = 1 + (seed + (unsigned)round * 5) % (KGS - 4);
        while (left(a) > KGS - after) {
            int st;
            cr_assert_eq(waitpid(pid, &st, WNOHANG), 0, "the pass ended early");
            sched_yield();
        }
        usleep((seed * 7919u + (unsigned)round * 131u) % 2000u);
        kill(pid, SIGKILL);
        test_wait(pid);
        uint32_t claimed = 0;
        for (uint32_t kg = 0; kg < KGS; kg++)
            claimed += (atomic_load(&a->tables[kg].lazy) & SHM_LAZY_CLAIMED) != 0;
        cr_assert_leq(claimed, 1, "one key group at a time");
        cr_assert_eq(ckpt_lazy_fill(a, NULL, NULL), 0, "%s", stash_errmsg());
        cr_assert_eq(left(a), 0);
        stash_worker *w;
        cr_assert_eq(
            stash_worker_open(
                name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w),
            0);
        expect_all(w);
        cr_assert_eq(entries(a), KEYS, "no key twice, none left over");
        stash_worker_close(w);
        cr_assert_eq(shm_check(a), 0, "%s", stash_errmsg());
        stash_arena_close(a);
        stash_arena_destroy(name, NULL);
    }
}

Test(lazy, what_a_dead_restorer_wrote_is_cleared_before_the_key_group_comes_again)
{
    char name[96];
    stash_arena *a = begin("lazy3", name);
    uint64_t k = key_in(3);
    cr_assert_eq(ckpt_lazy_await(a, 3, NULL), 0, "%s", stash_errmsg());
    /* A key the checkpoint does not have, then key group 3 as a restorer
     * that died part-way leaves it: claimed by a thread that is gone. */
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w),
        0);
    stash_state *s = value_state(w);
    uint64_t stray = k, v = 1;
    while (stash_key_group(&stray, sizeof stray, KGS) != 3 || stray < KEYS) stray++;
    cr_assert_eq(stash_key_set(w, &stray, sizeof stray), 0);
    cr_assert_eq(stash_value_put(s, &v, sizeof v), 0);
    pid_t gone = test_fork(fill, "no such arena");
    test_wait(gone);
    atomic_store(&a->tables[3].lazy, SHM_LAZY_CLAIMED | (uint32_t)gone);
    atomic_fetch_add(&a->control->lazy_left, 1);
    stash_worker_close(w);
    cr_assert_eq(
        stash_worker_open(
            name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w),
        0);
    s = value_state(w);
    cr_assert_eq(stash_key_set(w, &stray, sizeof stray), 0, "%s", stash_errmsg());
    stash_bytes b;
    cr_assert_eq(stash_value_get(s, &b), STASH_ENOTFOUND, "the dead restorer's record is gone");
    cr_assert_eq(stash_key_set(w, &k, sizeof k), 0);
    cr_assert_eq(stash_value_get(s, &b), 0);
    cr_assert_eq(test_u64(b.data), value_of(k));
    cr_assert_eq(ckpt_lazy_fill(a, NULL, NULL), 0, "%s", stash_errmsg());
    expect_all(w);
    stash_worker_close(w);
    cr_assert_eq(shm_check(a), 0, "%s", stash_errmsg());
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(lazy, a_relative_path_is_kept_absolute_for_processes_that_run_elsewhere)
{
    /* Begun from dir's parent with a relative path, touched from /. */
    char here[4096], parent[128];
    cr_assert_not_null(getcwd(here, sizeof here));
    snprintf(parent, sizeof parent, "%s", dir);
    *strrchr(parent, '/') = 0;
    cr_assert_eq(chdir(parent), 0);
    char name[96], rel[200];
    stash_arena *a = test_arena_create("lazyrel", 64u << 20, KGS, name);
    snprintf(rel, sizeof rel, "%s/chk-1", strrchr(dir, '/') + 1);
    ckpt_restored out;
    cr_assert_eq(ckpt_lazy_begin(a, rel, (stash_kg_range){0, KGS - 1}, eng, &out), 0, "%s",
                 stash_errmsg());
    ckpt_restored_free(&out);
    cr_assert_eq(chdir("/"), 0);
    char want[300];
    snprintf(want, sizeof want, "%s/chk-1", dir);
    cr_assert_str_eq(a->control->lazy_path, want);
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w),
        0);
    expect_all(w);
    stash_worker_close(w);
    cr_assert_eq(chdir(here), 0);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

/* Flips a byte in the middle of key group kg's block of checkpoint id, as
 * the metadata places it. */
static void damage(uint64_t id, uint32_t kg)
{
    char path[256];
    snprintf(path, sizeof path, "%s/chk-%llu", dir, (unsigned long long)id);
    ckpt_view v;
    cr_assert_eq(ckpt_open_view(path, eng, &v, false), 0, "%s", stash_errmsg());
    md_extent x;
    memcpy(&x, v.files[0].extents + kg * sizeof x, sizeof x);
    char data[4200];
    snprintf(data, sizeof data, "%s", v.files[0].path);
    ckpt_view_close(&v);
    int fd = open(data, O_RDWR);
    cr_assert_geq(fd, 0);
    uint8_t byte;
    cr_assert_eq(pread(fd, &byte, 1, (off_t)(x.offset + x.size / 2)), 1);
    byte ^= 0x5a;
    cr_assert_eq(pwrite(fd, &byte, 1, (off_t)(x.offset + x.size / 2)), 1);
    close(fd);
}

Test(lazy, a_damaged_block_fails_its_key_group_alone)
{
    damage(1, 6);
    char name[96];
    stash_arena *a = begin("lazy4", name);
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w),
        0);
    uint64_t bad = key_in(6), good = key_in(7);
    int rc = stash_key_set(w, &bad, sizeof bad);
    cr_assert_eq(rc, STASH_ECORRUPT, "%d: %s", rc, stash_errmsg());
    cr_assert(strstr(stash_errmsg(), "key group 6"), "%s", stash_errmsg());
    cr_assert(strstr(stash_errmsg(), "chk-1"), "%s", stash_errmsg());
    cr_assert_eq(atomic_load(&a->tables[6].lazy), SHM_LAZY_FAILED);
    rc = stash_key_set(w, &bad, sizeof bad);
    cr_assert_eq(rc, STASH_ECORRUPT, "it stays failed");
    cr_assert_eq(stash_key_set(w, &good, sizeof good), 0, "%s", stash_errmsg());
    stash_bytes b;
    cr_assert_eq(stash_value_get(value_state(w), &b), 0);
    cr_assert_eq(test_u64(b.data), value_of(good));
    cr_assert_eq(ckpt_lazy_fill(a, NULL, NULL), STASH_ECORRUPT);
    cr_assert(ckpt_lazy_pending(a), "key group 6 is still missing");
    stash_worker_close(w);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

/* The bytes of key group kg's block in checkpoint id of dir. */
static void block_of(uint64_t id, uint32_t kg, uint8_t **out, size_t *len)
{
    char path[256];
    snprintf(path, sizeof path, "%s/chk-%llu", dir, (unsigned long long)id);
    ckpt_view v;
    cr_assert_eq(ckpt_open_view(path, eng, &v, true), 0, "%s", stash_errmsg());
    md_extent x;
    memcpy(&x, v.files[0].extents + kg * sizeof x, sizeof x);
    *out = malloc(x.size);
    memcpy(*out, v.files[0].data + x.offset, x.size);
    *len = x.size;
    ckpt_view_close(&v);
}

static bool same_block(uint32_t kg)
{
    uint8_t *b1, *b2;
    size_t l1, l2;
    block_of(1, kg, &b1, &l1);
    block_of(2, kg, &b2, &l2);
    bool same = l1 == l2 && memcmp(b1, b2, l1) == 0;
    free(b1);
    free(b2);
    return same;
}

/* A new arena with checkpoint id of dir restored whole. */
static stash_arena *restored(const char *tag, uint64_t id, char *name)
{
    stash_arena *a = test_arena_create(tag, 64u << 20, KGS, name);
    ckpt_restored out;
    cr_assert_eq(ckpt_restore(a, test_ckpt_dir(dir), id, (stash_kg_range){0, KGS - 1}, eng, &out),
                 0, "%s", stash_errmsg());
    ckpt_restored_free(&out);
    return a;
}

Test(lazy, a_checkpoint_during_the_restore_copies_the_blocks_not_there_at_its_cut)
{
    char name[96], path[256];
    snprintf(path, sizeof path, "%s/chk-1", dir);
    stash_arena *a = begin("lazy5", name);
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w),
        0);
    stash_state *s = value_state(w);
    uint64_t k5 = key_in(5), k9 = key_in(9), v5 = 111, v9 = 222;
    /* Key group 5 comes before the cut and changes; 9 only after it. */
    cr_assert_eq(stash_key_set(w, &k5, sizeof k5), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_value_put(s, &v5, sizeof v5), 0);
    /* The barrier before a cut: an lmdb owner's writes committed. */
    if (w->store->ops->commit) cr_assert_eq(w->store->ops->commit(w->store), 0);
    uint32_t pins[KGS];
    for (uint32_t kg = 0; kg < KGS; kg++) pins[kg] = (uint32_t)shm_table_pin(a, kg);
    cr_assert_eq(stash_key_set(w, &k9, sizeof k9), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_value_put(s, &v9, sizeof v9), 0);
    cr_assert_eq(
        ckpt_write(
            a, pins,
            &(ckpt_opts){.dir = test_ckpt_dir(dir), .id = 2, .engine = eng, .lazy_from = path},
            NULL),
        0, "%s", stash_errmsg());
    for (uint32_t kg = 0; kg < KGS; kg++) shm_table_unpin(a, kg, pins[kg]);
    cr_assert_eq(left(a), KGS - 2, "the checkpoint brought no key group in");
    /* An arena walk would have found 0 and 9 empty at the cut: their blocks
     * are the restore's, byte for byte; 5's was serialized. */
    cr_assert(same_block(0), "key group 0's block copied");
    cr_assert(same_block(9), "key group 9's block copied: whole only after the cut");
    cr_assert_not(same_block(5), "key group 5's block serialized with its change");
    stash_worker_close(w);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    char other[96];
    stash_arena *b = restored("lazy5r", 2, other);
    cr_assert_eq(
        stash_worker_open(
            other, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w),
        0);
    s = value_state(w);
    for (uint64_t k = 0; k < KEYS; k++) {
        stash_bytes got;
        cr_assert_eq(stash_key_set(w, &k, sizeof k), 0);
        cr_assert_eq(stash_value_get(s, &got), 0, "key %llu", (unsigned long long)k);
        uint64_t want = k == k5 ? v5 : value_of(k);
        cr_assert_eq(test_u64(got.data), want, "key %llu as of the cut", (unsigned long long)k);
    }
    stash_worker_close(w);
    stash_arena_close(b);
    stash_arena_destroy(other, NULL);
}

/* Checkpoint 2 of dir: checkpoint 1 with key k7 (of key group 7) holding
 * v7 and key gone removed. */
static void write_second(uint64_t k7, uint64_t v7, uint64_t gone)
{
    char name[96];
    stash_arena *a = restored("lazy6src", 1, name);
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w),
        0);
    stash_state *s = value_state(w);
    cr_assert_eq(stash_key_set(w, &k7, sizeof k7), 0);
    cr_assert_eq(stash_value_put(s, &v7, sizeof v7), 0);
    cr_assert_eq(stash_key_set(w, &gone, sizeof gone), 0);
    cr_assert_eq(stash_state_clear(s), 0);
    stash_worker_close(w);
    checkpoint(a, 2);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

/* A whole restore into an arena that a lazy restore fills (a worker's
 * rollback to the newest checkpoint while the service restores an older
 * one lazily): the lazy restore's key groups are taken over, and none of
 * them comes from the older checkpoint afterwards. */
Test(lazy, a_whole_restore_takes_the_key_groups_of_a_lazy_one)
{
    uint64_t k7 = key_in(7), gone = k7 + 1, v7 = 999;
    while (stash_key_group(&gone, sizeof gone, KGS) != 7) gone++;
    write_second(k7, v7, gone);
    char name[96];
    stash_arena *a = begin("lazy6", name);
    /* Key group 2 comes from checkpoint 1 first; the others wait. */
    cr_assert_eq(ckpt_lazy_await(a, 2, NULL), 0, "%s", stash_errmsg());
    /* Key group 7 holds checkpoint 1's records but is still to come, as a
     * restorer that failed part-way leaves it: the key removed in
     * checkpoint 2 among them. */
    cr_assert_eq(ckpt_lazy_await(a, 7, NULL), 0, "%s", stash_errmsg());
    atomic_store(&a->tables[7].lazy, SHM_LAZY_PENDING);
    atomic_fetch_add(&a->control->lazy_left, 1);
    ckpt_restored out;
    cr_assert_eq(ckpt_restore(a, test_ckpt_dir(dir), 2, (stash_kg_range){0, KGS - 1}, eng, &out), 0,
                 "%s", stash_errmsg());
    ckpt_restored_free(&out);
    cr_assert_eq(left(a), 0, "every key group taken over");
    cr_assert_not(ckpt_lazy_pending(a));
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w),
        0);
    stash_state *s = value_state(w);
    for (uint64_t k = 0; k < KEYS; k++) {
        stash_bytes b;
        cr_assert_eq(stash_key_set(w, &k, sizeof k), 0, "%s", stash_errmsg());
        if (k == gone) {
            cr_assert_eq(stash_value_get(s, &b), STASH_ENOTFOUND, "key %llu stays removed",
                         (unsigned long long)k);
            continue;
        }
        cr_assert_eq(stash_value_get(s, &b), 0, "key %llu", (unsigned long long)k);
        cr_assert_eq(test_u64(b.data), k == k7 ? v7 : value_of(k),
                     "key %llu as checkpoint 2 has it", (unsigned long long)k);
    }
    stash_worker_close(w);
    cr_assert_eq(entries(a), KEYS - 1, "no key twice");
    cr_assert_eq(shm_check(a), 0, "%s", stash_errmsg());
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

/* ---- the service ----------------------------------------------------------- */

static const char *svc_name;

static int service_main(void *arg)
{
    (void)arg;
    stash_arena_opts ao = {.sz = sizeof(stash_arena_opts),
                           .size = 64u << 20,
                           .max_parallelism = KGS,
                           .backend = test_backend()};
    stash_service *s;
    if (stash_service_start(
            svc_name,
            &(stash_service_opts){
                .sz = sizeof(stash_service_opts), .arena = &ao, .dir = dir, .lazy_restore = 1},
            &s) < 0) {
        fprintf(stderr, "service: %s\n", stash_errmsg());
        return 20;
    }
    int stopped;
    while (!(stopped = stash_service_stopped(s))) usleep(5000);
    stash_service_stop(s);
    return stopped < 0 ? 21 : 0;
}

/* Starts the service and waits until it serves (its arena in place). */
static pid_t start_service(void)
{
    pid_t pid = test_fork(service_main, NULL);
    test_await_serving(svc_name, pid);
    return pid;
}

static int check_worker(void *arg)
{
    (void)arg;
    stash_worker *w;
    if (stash_worker_open(
            svc_name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w))
        return 1;
    stash_state *s;
    if (stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &s))
        return 2;
    for (uint64_t k = 0; k < KEYS; k++) {
        stash_bytes b;
        if (stash_key_set(w, &k, sizeof k) || stash_value_get(s, &b)) return 3;
        if (test_u64(b.data) != value_of(k)) return 4;
    }
    stash_worker_close(w);
    return 0;
}

Test(lazy, a_service_serves_at_once_checkpoints_and_survives_a_kill, .timeout = 240)
{
    char name[96];
    snprintf(name, sizeof name, "%s", test_arena_name("lazysvc"));
    svc_name = name;
    stash_arena_destroy(name, NULL);
    pid_t spid = start_service();
    /* Killed while restoring (or just after): the next one goes on. */
    kill(spid, SIGKILL);
    test_wait(spid);
    spid = start_service();
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    cr_assert_eq(atomic_load(&a->control->restored_id), 1);
    cr_assert_eq(test_wait(test_fork(check_worker, NULL)), 0, "a worker reads every key exact");
    /* A checkpoint holds every key, whether its key group was back yet. */
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 30000, &info), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_service_request_stop(a, 20000), 0, "%s", stash_errmsg());
    cr_assert_eq(test_wait(spid), 0);
    /* Its end counted every record as the arena's restore. */
    cr_assert_eq(atomic_load(&a->control->restored_records), KEYS);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    /* The new checkpoint restores whole, every key exact. */
    char other[96];
    stash_arena *b = test_arena_create("lazychk", 64u << 20, KGS, other);
    ckpt_restored out;
    cr_assert_eq(
        ckpt_restore(b, test_ckpt_dir(dir), info.id, (stash_kg_range){0, KGS - 1}, eng, &out), 0,
        "%s", stash_errmsg());
    cr_assert_eq(out.records, KEYS);
    ckpt_restored_free(&out);
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            other, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w),
        0);
    expect_all(w);
    stash_worker_close(w);
    stash_arena_close(b);
    stash_arena_destroy(other, NULL);
}

/* A value other than checkpoint 1's for key k: checkpoint 2's. */
static uint64_t second_of(uint64_t k)
{
    return k * 11 + 5;
}

/* How a worker of the arena meets the fallback. */
typedef struct fallback_run {
    bool before;  /* it opened before: its barrier says STASH_ROLLED_BACK */
    int ready[2]; /* it writes a byte here once open */
} fallback_run;

/* A worker of the service's arena: once open, barriers until the arena
 * has fallen back (at most a minute; with run->before, until its barrier
 * says so), then finds every key as checkpoint 1 has it and writes each
 * anew (k * 13). Exits 0, or a code saying what went wrong. */
static int fallback_worker(void *arg)
{
    fallback_run *run = arg;
    stash_worker *w;
    if (stash_worker_open(
            svc_name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w))
        return 1;
    stash_state *s;
    if (stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &s))
        return 2;
    if (write(run->ready[1], "x", 1) != 1) return 3;
    stash_arena *a = stash_worker_arena(w);
    stash_event ev = {0};
    uint64_t until = shm_now_ns() + 60000000000ull;
    for (bool seen = false; !seen;) {
        int rc = stash_barrier(w, &ev);
        if (rc < 0) return 4;
        if (rc == 1 && ev.kind == STASH_ROLLED_BACK) {
            if (!run->before) return 5;
            if (ev.checkpoint_id != 1 || !strstr(ev.detail, "key group 6")) return 6;
            seen = true;
        }
        if (!run->before && atomic_load(&a->control->fallback_gen)) seen = true;
        if (shm_now_ns() > until) return 7;
        if (!seen) usleep(1000);
    }
    for (uint64_t k = 0; k < KEYS; k++) {
        stash_bytes b;
        if (stash_key_set(w, &k, sizeof k) || stash_value_get(s, &b)) return 8;
        if (test_u64(b.data) != value_of(k)) return 9;
        uint64_t v = k * 13;
        if (stash_value_put(s, &v, sizeof v)) return 10;
    }
    if (stash_barrier(w, &ev) < 0) return 11;
    stash_worker_close(w);
    return 0;
}

/* Checkpoint 2 of dir with key group 6's block damaged, restored lazily
 * by a service into arena name (svc_name) with a worker that opens before
 * the service starts (before) or after the arena fell back; then a
 * checkpoint, which holds what the worker wrote after the fallback. */
static void fall_back_with_a_worker(bool before)
{
    checkpoint_of(2, second_of);
    damage(2, 6);
    char name[96];
    snprintf(name, sizeof name, "%s", test_arena_name("lazyfb"));
    svc_name = name;
    fallback_run run = {.before = before};
    cr_assert_eq(pipe(run.ready), 0);
    pid_t spid = 0, wpid = 0;
    stash_arena *a;
    char b1;
    if (before) {
        /* The lazy restore of checkpoint 2 begun as a service begins it,
         * a worker open, then the service that goes on with it. */
        a = test_arena_create("lazyfb", 64u << 20, KGS, name);
        char path[256];
        snprintf(path, sizeof path, "%s/chk-2", dir);
        ckpt_restored out;
        cr_assert_eq(ckpt_lazy_begin(a, path, (stash_kg_range){0, KGS - 1}, eng, &out), 0, "%s",
                     stash_errmsg());
        ckpt_restored_free(&out);
        atomic_store(&a->control->restored_id, 2);
        atomic_store(&a->control->last_id, 2);
        atomic_store(&a->control->completed, 2);
        wpid = test_fork(fallback_worker, &run);
        cr_assert_eq(read(run.ready[0], &b1, 1), 1, "the worker opened");
        spid = start_service();
    } else {
        spid = start_service();
        cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
        uint64_t until = shm_now_ns() + 60000000000ull;
        while (!atomic_load(&a->control->fallback_gen) && shm_now_ns() < until) usleep(1000);
        cr_assert_eq(atomic_load(&a->control->fallback_gen), 1, "the arena fell back");
        wpid = test_fork(fallback_worker, &run);
    }
    cr_assert_eq(test_wait(wpid), 0, "the worker (its exit code says)");
    cr_assert_eq(atomic_load(&a->control->fallback_id), 1);
    cr_assert(strstr(a->control->fallback_why, "key group 6") &&
                  strstr(a->control->fallback_why, "chk-2"),
              "%s", a->control->fallback_why);
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 30000, &info), 0, "%s", info.detail);
    cr_assert_eq(stash_service_request_stop(a, 20000), 0, "%s", stash_errmsg());
    cr_assert_eq(test_wait(spid), 0);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    close(run.ready[0]);
    close(run.ready[1]);
    char other[96];
    stash_arena *b = restored("lazyfb2", info.id, other);
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            other, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w),
        0);
    stash_state *s = value_state(w);
    for (uint64_t k = 0; k < KEYS; k++) {
        stash_bytes v;
        cr_assert_eq(stash_key_set(w, &k, sizeof k), 0);
        cr_assert_eq(stash_value_get(s, &v), 0, "key %llu", (unsigned long long)k);
        cr_assert_eq(test_u64(v.data), k * 13, "key %llu as the worker wrote it after the fallback",
                     (unsigned long long)k);
    }
    stash_worker_close(w);
    stash_arena_close(b);
    stash_arena_destroy(other, NULL);
}

Test(lazy, a_damaged_block_rolls_every_worker_back_to_the_newest_checkpoint_that_restores_whole,
     .timeout = 240)
{
    fall_back_with_a_worker(true);
}

Test(lazy, a_worker_that_opens_after_the_fallback_starts_from_that_checkpoint, .timeout = 240)
{
    fall_back_with_a_worker(false);
}

Test(lazy, a_damaged_checkpoint_restored_lazily_with_nothing_to_fall_back_to_stops_the_service,
     .timeout = 120)
{
    damage(1, 6);
    char own[160], from[160], name[96];
    snprintf(own, sizeof own, "%s/own", dir);
    snprintf(from, sizeof from, "%s/chk-1", dir);
    snprintf(name, sizeof name, "%s", test_arena_name("lazystop"));
    stash_arena_opts ao = {.sz = sizeof(stash_arena_opts),
                           .size = 64u << 20,
                           .max_parallelism = KGS,
                           .backend = test_backend()};
    stash_service *s;
    cr_assert_eq(stash_service_start(name,
                                     &(stash_service_opts){.sz = sizeof(stash_service_opts),
                                                           .arena = &ao,
                                                           .dir = own,
                                                           .restore = from,
                                                           .lazy_restore = 1},
                                     &s),
                 0, "%s", stash_errmsg());
    /* The background pass meets key group 6: the engine stops, saying why. */
    uint64_t until = shm_now_ns() + 60000000000ull;
    int stopped;
    while (!(stopped = stash_service_stopped(s)) && shm_now_ns() < until) usleep(2000);
    cr_assert_eq(stopped, STASH_ECORRUPT, "the engine stopped on the damage: %d", stopped);
    stash_service_stop(s);
    stash_arena_destroy(name, NULL);
}
