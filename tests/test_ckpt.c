/* SPDX-License-Identifier: MIT */
/*
 * test_ckpt.c: full checkpoints in a directory, on both I/O engines: a
 * checkpoint restores the state as of its pins; a failed fsync or write fails
 * the checkpoint, leaves nothing of it and keeps the earlier ones; a damaged,
 * truncated or incomplete checkpoint gives way to the previous one, with the
 * file and offset said; reading never changes the directory; retention keeps
 * the newest; a second serializing thread only on a core the workers leave.
 */
#define _GNU_SOURCE /* sched_getaffinity */
#include <criterion/criterion.h>
#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/checkpoint/checkpoints.h"
#include "tests/helpers.h"

#define KGS 8u

static const int backends[] = {IOE_URING, IOE_THREADS};

static ioe_engine *engine(int backend, const char *faults)
{
    ioe_engine *e;
    int rc = ioe_engine_open(&(ioe_opts){.backend = backend, .faults = faults ? faults : ""}, &e);
    if (rc == -EPERM || rc == -ENOSYS) cr_skip_test("io_uring unavailable here");
    cr_assert_eq(rc, 0, "engine: %s", stash_strerror(rc));
    return e;
}

typedef struct job {
    char name[96];
    stash_arena *arena;
    stash_worker *w;
    stash_state *v;
} job;

static void open_job(job *j)
{
    j->arena = test_arena_create("ckpt", 32u << 20, KGS, j->name);
    cr_assert_eq(
        stash_worker_open(j->name,
                          &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1},
                          &j->w),
        0);
    cr_assert_eq(
        stash_state_get(
            j->w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &j->v),
        0);
}

static void close_job(job *j)
{
    stash_worker_close(j->w);
    stash_arena_close(j->arena);
    stash_arena_destroy(j->name, NULL);
}

static void put_all(job *j, uint64_t gen)
{
    for (uint32_t k = 0; k < 3000; k++) {
        stash_key_set(j->w, &k, sizeof k);
        uint64_t v[2] = {k, gen};
        cr_assert_eq(stash_value_put(j->v, v, sizeof v), 0);
    }
}

/* Checks every key holds generation gen. */
static void expect_gen(job *j, uint64_t gen)
{
    for (uint32_t k = 0; k < 3000; k++) {
        stash_key_set(j->w, &k, sizeof k);
        stash_bytes b;
        cr_assert_eq(stash_value_get(j->v, &b), 0, "key %u restored", k);
        cr_assert_eq(test_u64((const uint8_t *)b.data + 8), gen, "key %u of generation %llu", k,
                     (unsigned long long)gen);
    }
}

static int checkpoint(job *j, ioe_engine *e, const char *dir, uint64_t id)
{
    uint32_t pins[KGS];
    for (uint32_t kg = 0; kg < KGS; kg++) {
        int64_t v = shm_table_pin(j->arena, kg);
        if (v <= 0) return (int)v;
        pins[kg] = (uint32_t)v;
    }
    int rc = ckpt_write(
        j->arena, pins,
        &(ckpt_opts){.dir = test_ckpt_dir(dir), .id = id, .lz4 = id % 2, .engine = e}, NULL);
    for (uint32_t kg = 0; kg < KGS; kg++) shm_table_unpin(j->arena, kg, pins[kg]);
    return rc;
}

static void restore_into_new(const char *dir, ioe_engine *e, uint64_t id, uint64_t gen,
                             ckpt_restored *out)
{
    job r;
    open_job(&r);
    int rc = ckpt_restore(r.arena, test_ckpt_dir(dir), id, (stash_kg_range){0, KGS - 1}, e, out);
    cr_assert_eq(rc, 0, "restore: %s", stash_errmsg());
    ckpt_restored_free(out);
    cr_assert_eq(out->records, 3000);
    expect_gen(&r, gen);
    cr_assert_eq(shm_check(r.arena), 0, "%s", stash_errmsg());
    close_job(&r);
}

/* Opens a job and takes checkpoints 1 and 2 of it into dir, every key at
 * generation 1, then 2. */
static void two_checkpoints(job *j, ioe_engine *e, const char *dir)
{
    open_job(j);
    put_all(j, 1);
    cr_assert_eq(checkpoint(j, e, dir, 1), 0, "%s", stash_errmsg());
    put_all(j, 2);
    cr_assert_eq(checkpoint(j, e, dir, 2), 0, "%s", stash_errmsg());
}

static void make_dir(char *dir)
{
    snprintf(dir, 128, "/tmp/stash-ckpt-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

Test(ckpt, a_checkpoint_restores_the_state_as_of_its_pins, .timeout = 120)
{
    for (int b = 0; b < 2; b++) {
        char dir[128];
        make_dir(dir);
        ioe_engine *e = engine(backends[b], NULL);
        job j;
        open_job(&j);
        put_all(&j, 1);
        cr_assert_eq(checkpoint(&j, e, dir, 1), 0, "%s", stash_errmsg());
        put_all(&j, 2);
        cr_assert_eq(checkpoint(&j, e, dir, 2), 0, "%s", stash_errmsg());
        char path[256];
        snprintf(path, sizeof path, "%s/chk-2/_metadata.tmp", dir);
        cr_assert_neq(access(path, F_OK), 0, "committed: no temporary metadata left");
        ckpt_restored out;
        restore_into_new(dir, e, 0, 2, &out);
        cr_assert_eq(out.id, 2);
        cr_assert_eq(out.skipped, 0);
        restore_into_new(dir, e, 1, 1, &out);
        close_job(&j);
        ioe_engine_close(e);
        test_remove_dir(dir);
    }
}

Test(ckpt, a_failed_fsync_or_write_fails_the_checkpoint_and_keeps_the_earlier, .timeout = 120)
{
    const char *faults[] = {"fsync:1:EIO", "write:1:ENOSPC"};
    for (int b = 0; b < 2; b++) {
        for (int f = 0; f < 2; f++) {
            char dir[128], path[256];
            make_dir(dir);
            ioe_engine *good = engine(backends[b], NULL), *bad = engine(backends[b], faults[f]);
            job j;
            open_job(&j);
            put_all(&j, 1);
            cr_assert_eq(checkpoint(&j, good, dir, 1), 0);
            put_all(&j, 2);
            int rc = checkpoint(&j, bad, dir, 2);
            cr_assert_eq(rc, f ? -ENOSPC : -EIO, "%s: %s", faults[f], stash_strerror(rc));
            cr_assert(strstr(stash_errmsg(), "kg-data.dat"), "names the file: %s", stash_errmsg());
            snprintf(path, sizeof path, "%s/chk-2", dir);
            cr_assert_neq(access(path, F_OK), 0, "the failed checkpoint left nothing");
            ckpt_restored out;
            restore_into_new(dir, good, 0, 1, &out);
            cr_assert_eq(out.id, 1);
            close_job(&j);
            ioe_engine_close(good);
            ioe_engine_close(bad);
            test_remove_dir(dir);
        }
    }
}

/* The names and bytes of every file under dir, to show reading changed nothing. */
static uint64_t dir_digest(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "cd %s && find . -type f -exec cksum {} + | sort | cksum", dir);
    FILE *p = popen(cmd, "r");
    unsigned long long d = 0;
    cr_assert_eq(fscanf(p, "%llu", &d), 1);
    pclose(p);
    return d;
}

static void damage(const char *path, long off, int truncate_to)
{
    if (truncate_to >= 0) {
        cr_assert_eq(truncate(path, truncate_to), 0);
        return;
    }
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x04, f);
    fclose(f);
}

Test(ckpt, a_damaged_newest_checkpoint_gives_way_to_the_previous, .timeout = 120)
{
    struct {
        const char *file;
        long off;
        int truncate_to;
        const char *named;
    } cases[] = {
        {"kg-data.dat", 300, -1, "kg-data.dat: offset"},
        {"kg-data.dat", 0, 1000, "kg-data.dat"},
        {"_metadata", 20, -1, "_metadata: offset"},
        {"_metadata", 0, 30, "_metadata"},
    };
    for (int b = 0; b < 2; b++) {
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            char dir[128], path[256];
            make_dir(dir);
            ioe_engine *e = engine(backends[b], NULL);
            job j;
            two_checkpoints(&j, e, dir);
            snprintf(path, sizeof path, "%s/chk-2/%s", dir, cases[c].file);
            damage(path, cases[c].off, cases[c].truncate_to);
            uint64_t before = dir_digest(dir);
            ckpt_restored out;
            restore_into_new(dir, e, 0, 1, &out);
            cr_assert_eq(out.id, 1, "case %zu: fell back to checkpoint 1", c);
            cr_assert_eq(out.skipped, 1);
            cr_assert(strstr(out.why, cases[c].named), "case %zu says why: %s", c, out.why);
            cr_assert_eq(dir_digest(dir), before, "reading changed nothing");
            close_job(&j);
            ioe_engine_close(e);
            test_remove_dir(dir);
        }
    }
}

Test(ckpt, a_read_error_costs_one_checkpoint_never_the_restore, .timeout = 120)
{
    for (int b = 0; b < 2; b++) {
        char dir[128];
        make_dir(dir);
        ioe_engine *e = engine(backends[b], NULL);
        job j;
        two_checkpoints(&j, e, dir);
        close_job(&j);
        ioe_engine_close(e);
        /* One read request fails, each in turn: the metadata's or the
         * data's, of the newest checkpoint or the one before. */
        for (int n = 1; n <= 6; n++) {
            char faults[32];
            snprintf(faults, sizeof faults, "read:%d:EIO", n);
            e = engine(backends[b], faults);
            ckpt_view v;
            char chk[200];
            snprintf(chk, sizeof chk, "%s/chk-2", dir);
            int rc = ckpt_view_open_path(chk, e, &v);
            if (rc == 0) ckpt_view_close(&v);
            ioe_engine_close(e);
            e = engine(backends[b], faults);
            job r;
            open_job(&r);
            ckpt_restored out;
            rc =
                ckpt_restore(r.arena, test_ckpt_dir(dir), 0, (stash_kg_range){0, KGS - 1}, e, &out);
            cr_assert_eq(rc, 0, "%s, engine %d: %s", faults, b, stash_errmsg());
            ckpt_restored_free(&out);
            expect_gen(&r, out.id);
            if (out.skipped) cr_assert(strstr(out.why, "read"), "%s: %s", faults, out.why);
            close_job(&r);
            ioe_engine_close(e);
        }
        test_remove_dir(dir);
    }
}

Test(ckpt, a_checkpoint_holding_another_checkpoints_metadata_is_refused, .timeout = 60)
{
    char dir[128], cmd[512], chk[200];
    make_dir(dir);
    ioe_engine *e = engine(IOE_THREADS, NULL);
    job j;
    two_checkpoints(&j, e, dir);
    snprintf(cmd, sizeof cmd, "cp %s/chk-1/_metadata %s/chk-2/_metadata", dir, dir);
    cr_assert_eq(system(cmd), 0);
    snprintf(chk, sizeof chk, "%s/chk-2/", dir);
    ckpt_view v;
    cr_assert_eq(ckpt_view_open_path(chk, e, &v), STASH_ECORRUPT);
    cr_assert(strstr(stash_errmsg(), "chk-2/") &&
                  strstr(stash_errmsg(), "names checkpoint 1, not 2"),
              "%s", stash_errmsg());
    ckpt_restored out;
    restore_into_new(dir, e, 0, 1, &out);
    cr_assert_eq(out.id, 1);
    cr_assert_eq(out.skipped, 1);
    close_job(&j);
    ioe_engine_close(e);
    test_remove_dir(dir);
}

/* The ext4 image a test mounted and where: removed after the test, failed or not. */
static char small_img[64], small_mnt[64];

static void unmount_small(void)
{
    if (small_mnt[0]) {
        umount2(small_mnt, MNT_DETACH);
        rmdir(small_mnt);
    }
    if (small_img[0]) unlink(small_img);
    small_mnt[0] = small_img[0] = 0;
}

Test(ckpt, a_small_checkpoint_fits_a_disk_with_little_room, .timeout = 120, .fini = unmount_small)
{
    /* A real filesystem (direct I/O, block allocation) with less free room
     * than the step the data file grows by. */
    char cmd[512];
    snprintf(small_img, sizeof small_img, "/var/tmp/stash-small-XXXXXX");
    int fd = mkstemp(small_img);
    cr_assert_geq(fd, 0);
    close(fd);
    snprintf(small_mnt, sizeof small_mnt, "/var/tmp/stash-smallmnt-XXXXXX");
    cr_assert_not_null(mkdtemp(small_mnt));
    snprintf(cmd, sizeof cmd,
             "truncate -s 12M %s && mkfs.ext4 -q -F %s && mount -o loop %s %s 2>/dev/null",
             small_img, small_img, small_img, small_mnt);
    if (system(cmd) != 0) {
        rmdir(small_mnt);
        small_mnt[0] = 0;
        cr_skip_test("cannot make and mount a small ext4 image here");
    }
    for (int b = 0; b < 2; b++) {
        char dir[200];
        snprintf(dir, sizeof dir, "%s/ckpt-%d", small_mnt, b);
        ioe_engine *e = engine(backends[b], NULL);
        job j;
        open_job(&j);
        put_all(&j, 1);
        cr_assert_eq(checkpoint(&j, e, dir, 1), 0, "%s", stash_errmsg());
        ckpt_restored out;
        restore_into_new(dir, e, 0, 1, &out);
        close_job(&j);
        ioe_engine_close(e);
    }
}

Test(ckpt, a_fifo_in_place_of_a_file_is_refused_without_blocking, .timeout = 60)
{
    char dir[128], path[256];
    make_dir(dir);
    ioe_engine *e = engine(IOE_THREADS, NULL);
    job j;
    two_checkpoints(&j, e, dir);
    const char *files[] = {"_metadata", "kg-data.dat"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/chk-2/%s", dir, files[i]);
        char saved[300];
        snprintf(saved, sizeof saved, "%s.saved", path);
        cr_assert_eq(rename(path, saved), 0);
        cr_assert_eq(mkfifo(path, 0600), 0);
        ckpt_restored out;
        restore_into_new(dir, e, 0, 1, &out);
        cr_assert_eq(out.id, 1);
        cr_assert(strstr(out.why, path) && strstr(out.why, "not a regular file"), "%s", out.why);
        cr_assert_eq(unlink(path), 0);
        cr_assert_eq(rename(saved, path), 0);
    }
    close_job(&j);
    ioe_engine_close(e);
    test_remove_dir(dir);
}

/* Sets the bytes at offset at of the metadata's first state and seals the
 * metadata with a checksum that matches again, as a crafted checkpoint would. */
static void craft_state(const char *meta, size_t at, const void *bytes, size_t len)
{
    FILE *f = fopen(meta, "r+b");
    cr_assert_not_null(f);
    static uint8_t md[1 << 20];
    size_t n = fread(md, 1, sizeof md, f);
    cr_assert_gt(n, sizeof(md_header) + sizeof(ckpt_state));
    memcpy(md + sizeof(md_header) + at, bytes, len);
    uint32_t crc = snap_crc32c(0, md, n - 4);
    memcpy(md + n - 4, &crc, 4);
    rewind(f);
    cr_assert_eq(fwrite(md, 1, n, f), n);
    fclose(f);
}

/* Verify (open, then check every record) and restore refuse alike. */
static void refused_alike(const char *dir, const char *chk, ioe_engine *e, const char *says)
{
    ckpt_view v;
    int rc = ckpt_view_open_path(chk, e, &v);
    if (rc == 0) {
        rc = (int)ckpt_view_walk(&v, (stash_kg_range){0, v.max_parallelism - 1}, NULL, NULL);
        ckpt_view_close(&v);
    }
    cr_assert_eq(rc, STASH_ECORRUPT, "verify: %s", stash_errmsg());
    cr_assert(strstr(stash_errmsg(), says), "verify says: %s", stash_errmsg());
    job r;
    open_job(&r);
    ckpt_restored out;
    cr_assert_eq(
        ckpt_restore(r.arena, test_ckpt_dir(dir), 1, (stash_kg_range){0, KGS - 1}, e, &out),
        STASH_ECORRUPT);
    cr_assert(strstr(stash_errmsg(), says), "restore says: %s", stash_errmsg());
    close_job(&r);
}

/* Writes checkpoint id of j with one worker's operator state: the len
 * bytes of blob. */
static int write_with_opstate(job *j, ioe_engine *e, const char *dir, uint64_t id,
                              const uint8_t *blob, size_t len)
{
    ckpt_blob b = {blob, len};
    uint32_t pins[KGS];
    for (uint32_t kg = 0; kg < KGS; kg++) pins[kg] = (uint32_t)shm_table_pin(j->arena, kg);
    ckpt_opts o = {
        .dir = test_ckpt_dir(dir), .id = id, .engine = e, .op_parallelism = 1, .op_blobs = &b};
    int rc = ckpt_write(j->arena, pins, &o, NULL);
    for (uint32_t kg = 0; kg < KGS; kg++) shm_table_unpin(j->arena, kg, pins[kg]);
    return rc;
}

/* Writes checkpoint id of j with one worker's operator state: a timer
 * service's entry of n watermarks of vlen bytes each. */
static int write_watermarks(job *j, ioe_engine *e, const char *dir, uint64_t id, uint32_t n,
                            uint32_t vlen)
{
    uint8_t blob[64] = {0};
    uint32_t count = 1;
    uint16_t head[2] = {2, STASH_TIMERS}; /* registered after v */
    size_t len = 12;
    memcpy(blob, &count, 4);
    memcpy(blob + 4, head, 4);
    memcpy(blob + 8, &n, 4);
    for (uint32_t i = 0; i < n; i++, len += 4 + vlen) memcpy(blob + len, &vlen, 4);
    return write_with_opstate(j, e, dir, id, blob, len);
}

Test(ckpt, crafted_state_kinds_and_operator_state_are_refused_by_verify_and_restore, .timeout = 60)
{
    char dir[128], chk[200], meta[256];
    make_dir(dir);
    ioe_engine *e = engine(IOE_THREADS, NULL);
    job j;
    open_job(&j);
    put_all(&j, 1);
    cr_assert_eq(checkpoint(&j, e, dir, 1), 0);
    snprintf(chk, sizeof chk, "%s/chk-1", dir);
    snprintf(meta, sizeof meta, "%s/_metadata", chk);
    uint16_t kind = STASH_TIMERS + 1;
    craft_state(meta, offsetof(ckpt_state, kind), &kind, 2);
    refused_alike(dir, chk, e, "kind 10, which is none");
    /* The keyed state called a timer service: its records are no timers. */
    kind = STASH_TIMERS;
    craft_state(meta, offsetof(ckpt_state, kind), &kind, 2);
    refused_alike(dir, chk, e, "not a well-formed state 'v' of kind 9");
    /* The keyed state called an operator list. */
    kind = STASH_OP_LIST;
    craft_state(meta, offsetof(ckpt_state, kind), &kind, 2);
    refused_alike(dir, chk, e, "keyed record of operator state 'v'");
    kind = STASH_VALUE;
    craft_state(meta, offsetof(ckpt_state, kind), &kind, 2);
    /* An update type out of range, then a reserved byte set. */
    uint8_t seven = 7, zero = 0;
    craft_state(meta, offsetof(ckpt_state, options) + 8, &seven, 1);
    refused_alike(dir, chk, e, "TTL options no state has");
    craft_state(meta, offsetof(ckpt_state, options) + 8, &zero, 1);
    craft_state(meta, offsetof(ckpt_state, options) + 20, &seven, 1);
    refused_alike(dir, chk, e, "TTL options no state has");
    /* Operator state that names the keyed state. */
    uint8_t blob[16] = {0};
    uint32_t count = 1, entries = 0;
    uint16_t head[2] = {1, STASH_OP_LIST}; /* the first state registered: v */
    memcpy(blob, &count, 4);
    memcpy(blob + 4, head, 4);
    memcpy(blob + 8, &entries, 4);
    cr_assert_eq(write_with_opstate(&j, e, dir, 2, blob, 12), 0, "%s", stash_errmsg());
    snprintf(chk, sizeof chk, "%s/chk-2", dir);
    ckpt_view v;
    cr_assert_eq(ckpt_view_open_path(chk, e, &v), STASH_ECORRUPT);
    cr_assert(strstr(stash_errmsg(), "operator state of worker 0") &&
                  strstr(stash_errmsg(), "not in the metadata"),
              "%s", stash_errmsg());
    close_job(&j);
    ioe_engine_close(e);
    test_remove_dir(dir);
}

Test(ckpt, a_timer_services_watermark_of_another_shape_is_refused, .timeout = 60)
{
    char dir[128], chk[200];
    make_dir(dir);
    ioe_engine *e = engine(IOE_THREADS, NULL);
    job j;
    open_job(&j);
    stash_timers *t;
    cr_assert_eq(stash_timers_get(j.w, "windows", &t), 0);
    const struct {
        uint32_t n, vlen;
        const char *says;
    } cases[] = {{1, 8, NULL},
                 {2, 8, "timer service 2 has 2 watermarks"},
                 {0, 8, "timer service 2 has 0 watermarks"},
                 {1, 4, "a watermark of 4 bytes"}};
    for (uint64_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(write_watermarks(&j, e, dir, i + 1, cases[i].n, cases[i].vlen), 0, "%s",
                     stash_errmsg());
        snprintf(chk, sizeof chk, "%s/chk-%llu", dir, (unsigned long long)i + 1);
        ckpt_view v;
        int rc = ckpt_view_open_path(chk, e, &v);
        if (!cases[i].says) {
            cr_assert_eq(rc, 0, "%s", stash_errmsg());
            cr_assert_eq(ckpt_view_state(&v, 1).kind, STASH_TIMERS);
            ckpt_view_close(&v);
            continue;
        }
        cr_assert_eq(rc, STASH_ECORRUPT);
        cr_assert(strstr(stash_errmsg(), "operator state of worker 0") &&
                      strstr(stash_errmsg(), cases[i].says),
                  "%s", stash_errmsg());
    }
    close_job(&j);
    ioe_engine_close(e);
    test_remove_dir(dir);
}

Test(ckpt, a_data_file_longer_than_its_metadata_says_is_not_read_whole, .timeout = 60)
{
    char dir[128], path[256];
    make_dir(dir);
    ioe_engine *e = engine(IOE_THREADS, NULL);
    job j;
    two_checkpoints(&j, e, dir);
    /* A sparse gigabyte after the blocks. */
    snprintf(path, sizeof path, "%s/chk-2/kg-data.dat", dir);
    cr_assert_eq(truncate(path, 1ll << 30), 0);
    ckpt_restored out;
    restore_into_new(dir, e, 0, 1, &out);
    cr_assert_eq(out.id, 1);
    cr_assert(strstr(out.why, "more than the") && strstr(out.why, "its metadata names"), "%s",
              out.why);
    close_job(&j);
    ioe_engine_close(e);
    test_remove_dir(dir);
}

Test(ckpt, a_data_file_of_another_checkpoint_with_blocks_of_the_same_sizes_is_refused,
     .timeout = 60)
{
    char dir[128], cmd[512];
    make_dir(dir);
    ioe_engine *e = engine(IOE_THREADS, NULL);
    job j;
    open_job(&j);
    /* Even ids: neither compressed, every block of the same size. */
    put_all(&j, 2);
    cr_assert_eq(checkpoint(&j, e, dir, 2), 0);
    put_all(&j, 4);
    cr_assert_eq(checkpoint(&j, e, dir, 4), 0);
    snprintf(cmd, sizeof cmd, "cp %s/chk-2/kg-data.dat %s/chk-4/kg-data.dat", dir, dir);
    cr_assert_eq(system(cmd), 0);
    ckpt_restored out;
    restore_into_new(dir, e, 0, 2, &out);
    cr_assert_eq(out.id, 2, "checkpoint 4 holds checkpoint 2's values: refused");
    cr_assert(strstr(out.why, "chk-4/kg-data.dat") && strstr(out.why, "another checkpoint"), "%s",
              out.why);
    close_job(&j);
    ioe_engine_close(e);
    test_remove_dir(dir);
}

Test(ckpt, a_checkpoint_without_metadata_does_not_exist, .timeout = 60)
{
    char dir[128], path[256];
    make_dir(dir);
    ioe_engine *e = engine(IOE_THREADS, NULL);
    job j;
    two_checkpoints(&j, e, dir);
    snprintf(path, sizeof path, "%s/chk-2/_metadata", dir);
    cr_assert_eq(unlink(path), 0);
    ckpt_restored out;
    restore_into_new(dir, e, 0, 1, &out);
    cr_assert_eq(out.id, 1);
    job r;
    open_job(&r);
    cr_assert_eq(
        ckpt_restore(r.arena, test_ckpt_dir(dir), 2, (stash_kg_range){0, KGS - 1}, e, &out),
        -ENOENT);
    cr_assert(strstr(stash_errmsg(), "chk-2/_metadata"), "%s", stash_errmsg());
    close_job(&r);
    close_job(&j);
    ioe_engine_close(e);
    test_remove_dir(dir);
}

Test(ckpt, retention_keeps_the_newest, .timeout = 60)
{
    char dir[128], path[256];
    make_dir(dir);
    ioe_engine *e = engine(IOE_THREADS, NULL);
    job j;
    open_job(&j);
    for (uint64_t id = 1; id <= 5; id++) {
        put_all(&j, id);
        cr_assert_eq(checkpoint(&j, e, dir, id), 0);
    }
    cr_assert_eq(ckpt_retain(test_ckpt_dir(dir), 3, e), 0);
    for (uint64_t id = 1; id <= 5; id++) {
        snprintf(path, sizeof path, "%s/chk-%llu", dir, (unsigned long long)id);
        cr_assert_eq(access(path, F_OK) == 0, id >= 3, "checkpoint %llu", (unsigned long long)id);
    }
    ckpt_restored out;
    restore_into_new(dir, e, 0, 5, &out);
    close_job(&j);
    ioe_engine_close(e);
    test_remove_dir(dir);
}

/* A process that writes generation g of every key, then checkpoint g, for ever. */
typedef struct looper {
    const char *name;
    const char *dir;
    int ready[2];
} looper;

static int checkpoint_forever(void *arg)
{
    looper *lp = arg;
    job j;
    snprintf(j.name, sizeof j.name, "%s", lp->name);
    if (stash_worker_open(
            j.name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &j.w))
        return 1;
    j.arena = stash_worker_arena(j.w);
    if (stash_state_get(
            j.w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &j.v))
        return 2;
    ioe_engine *e;
    if (ioe_engine_open(&(ioe_opts){.backend = IOE_THREADS}, &e)) return 3;
    if (write(lp->ready[1], "x", 1) != 1) return 4;
    for (uint64_t id = 1;; id++) {
        for (uint32_t k = 0; k < 3000; k++) {
            stash_key_set(j.w, &k, sizeof k);
            uint64_t v[2] = {k, id};
            stash_value_put(j.v, v, sizeof v);
        }
        if (checkpoint(&j, e, lp->dir, id) != 0) return 5;
    }
    return 0;
}

Test(ckpt, a_writer_killed_at_any_moment_leaves_complete_or_invisible, .timeout = 300)
{
    char dir[128];
    make_dir(dir);
    job j;
    open_job(&j);
    ioe_engine *e = engine(IOE_THREADS, NULL);
    looper lp = {.name = j.name, .dir = dir};
    cr_assert_eq(pipe(lp.ready), 0);
    stash_worker_close(j.w);
    srand(test_seed("a_writer_killed_at_any_moment_leaves_complete_or_invisible"));
    uint64_t last = 0;
    for (int round = 0; round < 30; round++) {
        pid_t pid = test_fork(checkpoint_forever, &lp);
        char b;
        cr_assert_eq(read(lp.ready[0], &b, 1), 1);
        usleep(20000 + (useconds_t)(rand() % 130000));
        kill(pid, SIGKILL);
        cr_assert_eq(test_wait(pid), 128 + SIGKILL);
        /* Every checkpoint that committed restores whole; a partial one is invisible. */
        ckpt_restored out;
        job r;
        open_job(&r);
        int rc =
            ckpt_restore(r.arena, test_ckpt_dir(dir), 0, (stash_kg_range){0, KGS - 1}, e, &out);
        /* -ENOENT: nothing committed before the kill, and the partial one is invisible. */
        if (rc != -ENOENT) {
            cr_assert_eq(rc, 0, "round %d: %s", round, stash_errmsg());
            cr_assert_eq(out.skipped, 0, "round %d: a partial checkpoint was visible: %s", round,
                         out.why);
            ckpt_restored_free(&out);
            expect_gen(&r, out.id);
            last = out.id;
        }
        close_job(&r);
        test_remove_dir(dir);
        cr_assert_eq(mkdir(dir, 0755), 0);
    }
    cr_assert_gt(last, 0, "some checkpoint committed");
    ioe_engine_close(e);
    stash_arena_close(j.arena);
    stash_arena_destroy(j.name, NULL);
    test_remove_dir(dir);
}

/* Checkpointed by one worker, restored by three, each its own key groups. */
/* Restores checkpoint id of dir into a new arena of three workers (each
 * its range of the key groups) and checks that every key is there once, at
 * generation gen. */
static void restore_rescaled(const char *dir, ioe_engine *e, uint64_t id, uint64_t gen)
{
    char name[96];
    stash_arena *a = test_arena_create("rescale", 32u << 20, KGS, name);
    uint64_t records = 0;
    stash_worker *w[3];
    for (uint32_t i = 0; i < 3; i++) {
        cr_assert_eq(
            stash_worker_open(
                name,
                &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = i, .parallelism = 3},
                &w[i]),
            0);
        stash_worker_info info;
        stash_worker_info_get(w[i], &info);
        ckpt_restored out;
        cr_assert_eq(ckpt_restore(a, test_ckpt_dir(dir), id, info.range, e, &out), 0, "%s",
                     stash_errmsg());
        ckpt_restored_free(&out);
        records += out.records;
    }
    cr_assert_eq(records, 3000, "every key restored by exactly one worker");
    for (uint32_t i = 0; i < 3; i++) {
        stash_state *v;
        cr_assert_eq(stash_state_get(w[i],
                                     &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                         .name = "v",
                                                         .kind = STASH_VALUE},
                                     &v),
                     0);
        stash_worker_info info;
        stash_worker_info_get(w[i], &info);
        for (uint32_t k = 0; k < 3000; k++) {
            stash_key_set(w[i], &k, sizeof k);
            uint32_t kg = (uint32_t)stash_key_group_current(w[i]);
            if (kg < info.range.first || kg > info.range.last) continue;
            stash_bytes b;
            cr_assert_eq(stash_value_get(v, &b), 0, "worker %u, key %u", i, k);
            cr_assert_eq(b.len, 16, "key %u: the value's length at the cut", k);
            cr_assert_eq(test_u64((const uint8_t *)b.data + 8), gen, "key %u of generation %llu", k,
                         (unsigned long long)gen);
        }
    }
    cr_assert_eq(shm_check(a), 0, "%s", stash_errmsg());
    for (uint32_t i = 0; i < 3; i++) stash_worker_close(w[i]);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(ckpt, a_checkpoint_restores_at_another_parallelism, .timeout = 120)
{
    char dir[128];
    make_dir(dir);
    ioe_engine *e = engine(IOE_THREADS, NULL);
    job j;
    open_job(&j);
    put_all(&j, 7);
    cr_assert_eq(checkpoint(&j, e, dir, 1), 0);
    close_job(&j);
    restore_rescaled(dir, e, 1, 7);
    ioe_engine_close(e);
    test_remove_dir(dir);
}

/* A savepoint moved elsewhere restores from where it is now. */
Test(ckpt, a_savepoint_is_self_contained_and_relocatable, .timeout = 60)
{
    char dir[128], moved[128], from[256], to[300];
    make_dir(dir);
    make_dir(moved);
    ioe_engine *e = engine(IOE_THREADS, NULL);
    job j;
    open_job(&j);
    put_all(&j, 4);
    uint32_t pins[KGS];
    for (uint32_t kg = 0; kg < KGS; kg++) pins[kg] = (uint32_t)shm_table_pin(j.arena, kg);
    cr_assert_eq(
        ckpt_write(j.arena, pins,
                   &(ckpt_opts){.dir = test_ckpt_dir(dir), .id = 9, .savepoint = true, .engine = e},
                   NULL),
        0, "%s", stash_errmsg());
    for (uint32_t kg = 0; kg < KGS; kg++) shm_table_unpin(j.arena, kg, pins[kg]);
    snprintf(from, sizeof from, "%s/savepoint-9", dir);
    snprintf(to, sizeof to, "%s/my-savepoint", moved);
    cr_assert_eq(rename(from, to), 0);
    job r;
    open_job(&r);
    ckpt_restored out;
    cr_assert_eq(ckpt_restore_path(r.arena, to, (stash_kg_range){0, KGS - 1}, e, NULL, &out), 0,
                 "%s", stash_errmsg());
    ckpt_restored_free(&out);
    cr_assert_eq(out.id, 9);
    expect_gen(&r, 4);
    ckpt_restored none;
    cr_assert_eq(
        ckpt_restore(r.arena, test_ckpt_dir(dir), 0, (stash_kg_range){0, KGS - 1}, e, &none),
        -ENOENT, "savepoints are not checkpoints");
    close_job(&r);
    close_job(&j);
    ioe_engine_close(e);
    test_remove_dir(dir);
    test_remove_dir(moved);
}

/* The memory storage: a checkpoint over its cap fails, naming the cap, and
 * leaves the earlier ones. */
Test(ckpt, a_checkpoint_over_the_memory_cap_fails_clearly, .timeout = 60)
{
    char dir[128], path[256];
    snprintf(dir, sizeof dir, "/dev/shm/stash-test-mem-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    ioe_engine *e = engine(IOE_THREADS, NULL);
    job j;
    open_job(&j);
    put_all(&j, 1);
    uint32_t pins[KGS];
    for (uint32_t kg = 0; kg < KGS; kg++) pins[kg] = (uint32_t)shm_table_pin(j.arena, kg);
    ckpt_opts o = {
        .dir = test_ckpt_dir(dir), .id = 1, .engine = e, .cap_bytes = CKPT_MEMORY_DEFAULT_CAP};
    cr_assert_eq(ckpt_write(j.arena, pins, &o, NULL), 0, "%s", stash_errmsg());
    o.id = 2;
    o.cap_bytes = 1000;
    cr_assert_eq(ckpt_write(j.arena, pins, &o, NULL), -EFBIG);
    cr_assert(strstr(stash_errmsg(), "cap of 1000"), "%s", stash_errmsg());
    snprintf(path, sizeof path, "%s/chk-2", dir);
    cr_assert_neq(access(path, F_OK), 0);
    for (uint32_t kg = 0; kg < KGS; kg++) shm_table_unpin(j.arena, kg, pins[kg]);
    ckpt_restored out;
    restore_into_new(dir, e, 0, 1, &out);
    close_job(&j);
    ioe_engine_close(e);
    test_remove_dir(dir);
}

/* Writes generation gen into every step-th key. */
static void put_some(job *j, uint64_t gen, uint32_t step)
{
    for (uint32_t k = 0; k < 3000; k += step) {
        stash_key_set(j->w, &k, sizeof k);
        uint64_t v[2] = {k, gen};
        cr_assert_eq(stash_value_put(j->v, v, sizeof v), 0);
    }
}

/* Checks key k holds generation gens[k]. */
static void expect_gens(job *j, const uint64_t *gens)
{
    for (uint32_t k = 0; k < 3000; k++) {
        stash_key_set(j->w, &k, sizeof k);
        stash_bytes b;
        cr_assert_eq(stash_value_get(j->v, &b), 0, "key %u restored", k);
        cr_assert_eq(test_u64((const uint8_t *)b.data + 8), gens[k], "key %u", k);
    }
}

typedef struct chain {
    uint32_t pins[KGS];
    uint64_t id;
} chain;

/* Takes checkpoint id: full, or the changes since *base (whose pins it then
 * releases); keeps its own pins as the next base. */
static uint64_t incremental(job *j, ioe_engine *e, const char *dir, uint64_t id, chain *base)
{
    uint32_t pins[KGS];
    for (uint32_t kg = 0; kg < KGS; kg++) pins[kg] = (uint32_t)shm_table_pin(j->arena, kg);
    ckpt_written w;
    ckpt_opts o = {.dir = test_ckpt_dir(dir),
                   .id = id,
                   .engine = e,
                   .incremental = true,
                   .base_id = base->id,
                   .base_pins = base->pins};
    cr_assert_eq(ckpt_write(j->arena, pins, &o, &w), 0, "%s", stash_errmsg());
    if (base->id)
        for (uint32_t kg = 0; kg < KGS; kg++) shm_table_unpin(j->arena, kg, base->pins[kg]);
    memcpy(base->pins, pins, sizeof pins);
    base->id = id;
    return w.data_bytes;
}

Test(ckpt, incremental_checkpoints_write_only_the_changes, .timeout = 120)
{
    for (int b = 0; b < 2; b++) {
        char dir[128], path[256];
        make_dir(dir);
        ioe_engine *e = engine(backends[b], NULL);
        job j;
        open_job(&j);
        static uint64_t gens[3000];
        put_all(&j, 1);
        for (uint32_t k = 0; k < 3000; k++) gens[k] = 1;
        chain base = {.id = 0};
        uint64_t full = incremental(&j, e, dir, 1, &base);
        put_some(&j, 2, 100); /* 1% of the keys */
        for (uint32_t k = 0; k < 3000; k += 100) gens[k] = 2;
        uint64_t delta = incremental(&j, e, dir, 2, &base);
        cr_assert_leq(delta * 100, full * 3, "%llu bytes after 1%% changed, beside a full %llu",
                      (unsigned long long)delta, (unsigned long long)full);
        put_some(&j, 3, 7);
        for (uint32_t k = 0; k < 3000; k += 7) gens[k] = 3;
        incremental(&j, e, dir, 3, &base);

        job r;
        open_job(&r);
        ckpt_restored out;
        cr_assert_eq(
            ckpt_restore(r.arena, test_ckpt_dir(dir), 0, (stash_kg_range){0, KGS - 1}, e, &out), 0,
            "%s", stash_errmsg());
        ckpt_restored_free(&out);
        cr_assert_eq(out.id, 3);
        expect_gens(&r, gens);
        close_job(&r);

        /* A read error on a kept checkpoint's metadata: what it refers to
         * is unknown, and retention removes nothing. */
        ioe_engine *faulty = engine(backends[b], "read:1:EIO");
        cr_assert_lt(ckpt_retain(test_ckpt_dir(dir), 1, faulty), 0);
        cr_assert(strstr(stash_errmsg(), "removed nothing") && strstr(stash_errmsg(), "_metadata"),
                  "%s", stash_errmsg());
        ioe_engine_close(faulty);
        for (int id = 1; id <= 3; id++) {
            snprintf(path, sizeof path, "%s/shared/%d.dat", dir, id);
            cr_assert_eq(access(path, F_OK), 0, "%s stays", path);
        }

        /* Retention keeps the files the kept checkpoint still needs. */
        cr_assert_eq(ckpt_retain(test_ckpt_dir(dir), 1, e), 0);
        snprintf(path, sizeof path, "%s/chk-1", dir);
        cr_assert_neq(access(path, F_OK), 0);
        snprintf(path, sizeof path, "%s/shared/1.dat", dir);
        cr_assert_eq(access(path, F_OK), 0, "the base's data stays while chk-3 needs it");
        open_job(&r);
        cr_assert_eq(
            ckpt_restore(r.arena, test_ckpt_dir(dir), 0, (stash_kg_range){0, KGS - 1}, e, &out), 0,
            "%s", stash_errmsg());
        ckpt_restored_free(&out);
        expect_gens(&r, gens);
        close_job(&r);

        /* A full checkpoint starts a new chain; the old files go. */
        for (uint32_t kg = 0; kg < KGS; kg++) shm_table_unpin(j.arena, kg, base.pins[kg]);
        base.id = 0;
        incremental(&j, e, dir, 4, &base);
        cr_assert_eq(ckpt_retain(test_ckpt_dir(dir), 1, e), 0);
        cr_assert_neq(access(path, F_OK), 0, "no checkpoint needs shared/1.dat now");
        for (uint32_t kg = 0; kg < KGS; kg++) shm_table_unpin(j.arena, kg, base.pins[kg]);
        close_job(&j);
        ioe_engine_close(e);
        test_remove_dir(dir);
    }
}

Test(ckpt, a_damaged_delta_gives_way_to_the_previous_checkpoint, .timeout = 60)
{
    char dir[128], path[256];
    make_dir(dir);
    ioe_engine *e = engine(IOE_THREADS, NULL);
    job j;
    open_job(&j);
    put_all(&j, 1);
    chain base = {.id = 0};
    incremental(&j, e, dir, 1, &base);
    put_all(&j, 2);
    incremental(&j, e, dir, 2, &base);
    put_all(&j, 3);
    incremental(&j, e, dir, 3, &base);
    snprintf(path, sizeof path, "%s/shared/3.dat", dir);
    damage(path, 60, -1);
    job r;
    open_job(&r);
    ckpt_restored out;
    cr_assert_eq(
        ckpt_restore(r.arena, test_ckpt_dir(dir), 0, (stash_kg_range){0, KGS - 1}, e, &out), 0,
        "%s", stash_errmsg());
    ckpt_restored_free(&out);
    cr_assert_eq(out.id, 2);
    cr_assert(strstr(out.why, "shared/3.dat"), "%s", out.why);
    expect_gen(&r, 2);
    close_job(&r);
    for (uint32_t kg = 0; kg < KGS; kg++) shm_table_unpin(j.arena, kg, base.pins[kg]);
    close_job(&j);
    ioe_engine_close(e);
    test_remove_dir(dir);
}

/* The asynchronous part in another process, while the owner writes on. */
typedef struct async_args {
    const char *name;
    const char *dir;
    uint32_t pins[KGS];
    int backend;
} async_args;

static int write_from_another_process(void *arg)
{
    async_args *x = arg;
    stash_arena *a;
    uint32_t slot;
    ioe_engine *e;
    if (stash_arena_open(x->name, NULL, &a) || shm_reader_join(a, &slot)) return 1;
    if (ioe_engine_open(&(ioe_opts){.backend = x->backend}, &e)) return 2;
    int rc = ckpt_write(a, x->pins,
                        &(ckpt_opts){.dir = test_ckpt_dir(x->dir),
                                     .id = 1,
                                     .engine = e,
                                     .reader = true,
                                     .reader_slot = slot},
                        NULL);
    ioe_engine_close(e);
    shm_reader_leave(a, slot);
    stash_arena_close(a);
    return rc ? 3 : 0;
}

/* The owner's writes while a checkpoint is taken, generation gen of them:
 * each key rewritten in place, grown out of its block, cleared, or a new
 * key put beside it, by turns. */
static void write_mixed(job *j, uint64_t gen)
{
    for (uint32_t k = 0; k < 3000; k++) {
        uint64_t v[32] = {k, gen}, added = 10000 + k;
        stash_key_set(j->w, &k, sizeof k);
        switch ((k + gen) % 6) {
        case 0:
            cr_assert_eq(stash_value_put(j->v, v, sizeof v), 0, "key %u grown", k);
            break;
        case 1:
            cr_assert_eq(stash_state_clear(j->v), 0, "key %u cleared", k);
            break;
        case 2:
            stash_key_set(j->w, &added, sizeof added);
            cr_assert_eq(stash_value_put(j->v, v, 16), 0, "key %llu added",
                         (unsigned long long)added);
            break;
        default:
            cr_assert_eq(stash_value_put(j->v, v, 16), 0, "key %u rewritten", k);
        }
    }
}

/* A checkpoint written by another process while the owner writes holds
 * every key exactly as it was at the cut, restored whole and rescaled:
 * with the cut pinned as a walk's (records saved to the pre-image log
 * before they change, some before the walk starts, the rest as it goes)
 * and as a reader's (copied on write). */
Test(ckpt, another_process_writes_the_checkpoint_while_the_owner_writes_on, .timeout = 120)
{
    for (int b = 0; b < 2; b++)
        for (int walk = 0; walk < 2; walk++) {
            char dir[128];
            make_dir(dir);
            ioe_engine *e = engine(backends[b], NULL);
            job j;
            open_job(&j);
            put_all(&j, 1);
            async_args x = {.name = j.name, .dir = dir, .backend = backends[b]};
            for (uint32_t kg = 0; kg < KGS; kg++) {
                int64_t v = shm_table_pin_for(j.arena, kg, 0, walk);
                cr_assert_gt(v, 0);
                x.pins[kg] = (uint32_t)v;
            }
            write_mixed(&j, 2);
            if (walk)
                for (uint32_t kg = 0; kg < KGS; kg++)
                    cr_assert_neq(atomic_load(&j.arena->tables[kg].prelog), 0,
                                  "key group %u saved to its log", kg);
            pid_t pid = test_fork(write_from_another_process, &x);
            int st = -1;
            for (uint64_t gen = 3; gen < 1000 && st < 0; gen++) {
                write_mixed(&j, gen);
                if (waitpid(pid, &st, WNOHANG) == 0) st = -1;
            }
            if (st < 0) waitpid(pid, &st, 0);
            cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the writer process succeeded");
            for (uint32_t kg = 0; kg < KGS; kg++) shm_table_unpin(j.arena, kg, x.pins[kg]);
            cr_assert_eq(shm_check(j.arena), 0, "%s", stash_errmsg());
            close_job(&j);
            ckpt_restored out;
            restore_into_new(dir, e, 1, 1, &out);
            restore_rescaled(dir, e, 1, 1);
            ioe_engine_close(e);
            test_remove_dir(dir);
        }
}

/* Checksums that hold over a value that is not what its state's kind stores:
 * the check pass refuses it before anything is restored. */
Test(ckpt, a_malformed_value_is_refused_before_restoring, .timeout = 60)
{
    char dir[128];
    make_dir(dir);
    ioe_engine *e = engine(IOE_THREADS, NULL);
    job j;
    open_job(&j);
    put_all(&j, 1);
    cr_assert_eq(checkpoint(&j, e, dir, 1), 0);
    stash_state *m;
    cr_assert_eq(
        stash_state_get(
            j.w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "m", .kind = STASH_MAP},
            &m),
        0);
    uint32_t k = 5;
    stash_key_set(j.w, &k, sizeof k);
    cr_assert_eq(stash_map_put(m, "a", 1, "b", 1), 0);
    /* Break the map's slot count in the arena itself, then checkpoint it. */
    shm_lookup l;
    state_lookup(m, &l);
    shm_cursor c;
    cr_assert_eq(shm_table_find(j.arena, &l, &c), 0);
    uint32_t huge = 0x40000000;
    memcpy(shm_rec_value(c.rec), &huge, 4);
    cr_assert_eq(checkpoint(&j, e, dir, 2), 0);
    job r;
    open_job(&r);
    ckpt_restored out;
    cr_assert_eq(
        ckpt_restore(r.arena, test_ckpt_dir(dir), 0, (stash_kg_range){0, KGS - 1}, e, &out), 0);
    ckpt_restored_free(&out);
    cr_assert_eq(out.id, 1, "fell back past the malformed checkpoint");
    cr_assert(strstr(out.why, "well-formed state 'm'"), "%s", out.why);
    cr_assert(strstr(out.why, "kg-data.dat: offset"), "%s", out.why);
    close_job(&r);
    close_job(&j);
    ioe_engine_close(e);
    test_remove_dir(dir);
}

/* Big blocks, written from the buffers they were built in, with the pins
 * released key group by key group as the checkpoint goes. */
#define BIG_KEYS 40000u
#define BIG_VALUE 200u

typedef struct release_log {
    job *j;
    uint32_t *pins;
    uint32_t next; /* the key group the next call must name */
} release_log;

static void put_big(job *j, uint64_t gen)
{
    uint8_t v[BIG_VALUE];
    for (uint32_t k = 0; k < BIG_KEYS; k++) {
        memset(v, (int)(k + gen), sizeof v);
        memcpy(v, &k, sizeof k);
        memcpy(v + 8, &gen, sizeof gen);
        stash_key_set(j->w, &k, sizeof k);
        cr_assert_eq(stash_value_put(j->v, v, sizeof v), 0, "%s", stash_errmsg());
    }
}

/* Releases kg's pin, then rewrites every key: the key groups already
 * serialized keep no old version, the others keep theirs for the checkpoint. */
static void release_and_rewrite(void *ctx, uint32_t kg)
{
    release_log *r = ctx;
    cr_assert_eq(kg, r->next++, "key groups are released in order, each once");
    shm_table_unpin(r->j->arena, kg, r->pins[kg]);
    r->pins[kg] = 0;
    if (kg == KGS / 2) put_big(r->j, 2);
}

Test(ckpt, big_blocks_restore_and_pins_go_as_their_key_groups_are_written, .timeout = 120)
{
    for (int b = 0; b < 2; b++) {
        char dir[128];
        snprintf(dir, sizeof dir, "/var/tmp/stash-ckpt-test-XXXXXX");
        cr_assert_not_null(mkdtemp(dir));
        ioe_engine *e = engine(backends[b], NULL);
        job j;
        j.arena = test_arena_create("ckbig", 64u << 20, KGS, j.name);
        cr_assert_eq(stash_worker_open(
                         j.name,
                         &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1},
                         &j.w),
                     0);
        cr_assert_eq(stash_state_get(j.w,
                                     &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                         .name = "v",
                                                         .kind = STASH_VALUE},
                                     &j.v),
                     0);
        put_big(&j, 1);
        uint32_t pins[KGS];
        for (uint32_t kg = 0; kg < KGS; kg++) pins[kg] = (uint32_t)shm_table_pin(j.arena, kg);
        release_log log = {&j, pins, 0};
        ckpt_written w;
        /* The owner writes while the walks go on: they announce themselves
         * in reader slots, so that what they read is not reclaimed. */
        uint32_t slot, slot2;
        cr_assert_eq(shm_reader_join(j.arena, &slot), 0);
        cr_assert_eq(shm_reader_join(j.arena, &slot2), 0);
        cr_assert_eq(ckpt_write(j.arena, pins,
                                &(ckpt_opts){.dir = test_ckpt_dir(dir),
                                             .id = 1,
                                             .engine = e,
                                             .reader = true,
                                             .reader_slot = slot,
                                             .reader_slot2 = slot2,
                                             .serialized = release_and_rewrite,
                                             .serialized_ctx = &log},
                                &w),
                     0, "%s", stash_errmsg());
        shm_reader_leave(j.arena, slot);
        shm_reader_leave(j.arena, slot2);
        cr_assert_eq(log.next, KGS);
        cr_assert_eq(w.records, BIG_KEYS);
        char path[256];
        struct stat st;
        snprintf(path, sizeof path, "%s/chk-1/kg-data.dat", dir);
        cr_assert_eq(stat(path, &st), 0);
        cr_assert_eq((uint64_t)st.st_size, w.data_bytes, "the file is cut to its data");
        ckpt_view v;
        snprintf(path, sizeof path, "%s/chk-1", dir);
        cr_assert_eq(ckpt_view_open_path(path, e, &v), 0, "%s", stash_errmsg());
        for (uint32_t kg = 0; kg < KGS; kg++) {
            md_extent x;
            memcpy(&x, v.files[0].extents + kg * sizeof x, sizeof x);
            cr_assert_eq(x.offset % (uint64_t)st.st_blksize, 0,
                         "key group %u's block starts at a filesystem block", kg);
        }
        ckpt_view_close(&v);
        cr_assert_eq(shm_check(j.arena), 0, "%s", stash_errmsg());
        /* Restored: generation 1 everywhere, the rewrite after the pins
         * notwithstanding. */
        job r;
        r.arena = test_arena_create("ckbig", 64u << 20, KGS, r.name);
        cr_assert_eq(stash_worker_open(
                         r.name,
                         &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1},
                         &r.w),
                     0);
        cr_assert_eq(stash_state_get(r.w,
                                     &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                         .name = "v",
                                                         .kind = STASH_VALUE},
                                     &r.v),
                     0);
        ckpt_restored out;
        cr_assert_eq(
            ckpt_restore(r.arena, test_ckpt_dir(dir), 1, (stash_kg_range){0, KGS - 1}, e, &out), 0,
            "%s", stash_errmsg());
        ckpt_restored_free(&out);
        cr_assert_eq(out.records, BIG_KEYS);
        for (uint32_t k = 0; k < BIG_KEYS; k++) {
            stash_key_set(r.w, &k, sizeof k);
            stash_bytes got;
            cr_assert_eq(stash_value_get(r.v, &got), 0, "key %u restored", k);
            cr_assert_eq(got.len, BIG_VALUE);
            const uint8_t *p = got.data;
            cr_assert_eq(test_u64(p + 8), 1, "key %u of generation 1", k);
            cr_assert_eq(p[BIG_VALUE - 1], (uint8_t)(k + 1), "key %u", k);
        }
        cr_assert_eq(shm_check(r.arena), 0, "%s", stash_errmsg());
        close_job(&r);
        close_job(&j);
        ioe_engine_close(e);
        test_remove_dir(dir);
    }
}

/* The blocks the second serializing thread built. */
static _Atomic unsigned by_second;

static int64_t count_thread(void *ctx, uint32_t kg, unsigned thread, snap_buf *out)
{
    (void)ctx;
    (void)kg;
    (void)out;
    if (thread) atomic_fetch_add(&by_second, 1);
    return 0;
}

/* A second serializing thread runs only on a core the busy workers leave
 * free: a worker sharing its core with one lost more than the checkpoint
 * gained (docs/benchmarks.md). */
Test(ckpt, a_second_serializing_thread_takes_only_a_core_the_workers_leave, .timeout = 60)
{
    cpu_set_t set;
    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
    uint32_t cores = (uint32_t)CPU_COUNT(&set);
    if (cores < 2) cr_skip_test("one processor here");
    ioe_engine *e = engine(IOE_THREADS, NULL);
    char dir[128];
    make_dir(dir);
    ckpt_state none[1] = {{0}};
    ckpt_source src = {.max_parallelism = KGS,
                       .backend = CKPT_BACKEND_HEAP,
                       .states = none,
                       .block = count_thread,
                       .two_threads = true};
    const uint32_t busy[] = {0, cores - 2, cores - 1, cores, cores + 3};
    for (size_t i = 0; i < sizeof busy / sizeof *busy; i++) {
        atomic_store(&by_second, 0);
        cr_assert_eq(ckpt_write_source(&src,
                                       &(ckpt_opts){.dir = test_ckpt_dir(dir),
                                                    .id = i + 1,
                                                    .engine = e,
                                                    .busy_workers = busy[i]},
                                       NULL),
                     0, "%s", stash_errmsg());
        unsigned want = busy[i] + 2 <= cores ? KGS / 2 : 0;
        cr_assert_eq(atomic_load(&by_second), want,
                     "%u busy workers on %u cores: %u blocks, not %u", busy[i], cores,
                     atomic_load(&by_second), want);
    }
    ioe_engine_close(e);
    test_remove_dir(dir);
}
