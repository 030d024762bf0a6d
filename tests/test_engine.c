/* SPDX-License-Identifier: MIT */
/*
 * test_engine.c: the persistence engine's bookkeeping: checkpoint ids that
 * never repeat, a checkpoint directory it cannot write, failures in a row
 * and the back-off of the interval, the workers' heartbeats, and the longest
 * cut a checkpoint reports.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers.h"

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *f)
{
    (void)st, (void)type, (void)f;
    return remove(path);
}

static void drop_dir(const char *dir)
{
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void temp_dir(char *dir, size_t cap, const char *tag)
{
    snprintf(dir, cap, "/var/tmp/stash-engine-%s-XXXXXX", tag);
    cr_assert_not_null(mkdtemp(dir));
}

static stash_service *start(const char *name, const stash_service_opts *o)
{
    stash_service *s;
    cr_assert_eq(stash_service_start(name, o, &s), 0, "%s", stash_errmsg());
    return s;
}

static const stash_arena_opts arena_opts = {
    .sz = sizeof(stash_arena_opts), .size = 16u << 20, .max_parallelism = 8};

Test(engine, ids_go_on_after_every_checkpoint_and_savepoint_in_the_directory, .timeout = 120)
{
    char dir[128], path[256];
    temp_dir(dir, sizeof dir, "ids");
    const char *name = test_arena_name("ids");
    stash_arena_opts ao = arena_opts;
    ao.backend = test_backend();
    stash_service_opts o = {.sz = sizeof(stash_service_opts), .arena = &ao, .dir = dir};
    stash_service *s = start(name, &o);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "%s", info.detail);
    cr_assert_eq(info.id, 1);
    cr_assert_eq(stash_savepoint(a, 60000, &info), 0, "%s", info.detail);
    cr_assert_eq(info.id, 2);
    stash_service_stop(s);
    stash_arena_close(a);
    /* The arena is lost, and a killed engine left a partial checkpoint 7. */
    cr_assert_eq(stash_arena_destroy(name, NULL), 0);
    snprintf(path, sizeof path, "%s/chk-7", dir);
    cr_assert_eq(mkdir(path, 0700), 0);
    /* Names that are no checkpoint's: an id past the largest, a sign. */
    snprintf(path, sizeof path, "%s/chk-18446744073709551615", dir);
    cr_assert_eq(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/chk--5", dir);
    cr_assert_eq(mkdir(path, 0700), 0);
    s = start(name, &o); /* restores checkpoint 1 */
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    cr_assert_eq(stash_savepoint(a, 60000, &info), 0, "%s", info.detail);
    cr_assert_eq(info.id, 8);
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "%s", info.detail);
    cr_assert_eq(info.id, 9);
    stash_service_stop(s);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

Test(engine, checkpoints_whose_metadata_is_all_damaged_refuse_a_start, .timeout = 120)
{
    char dir[128], path[256];
    temp_dir(dir, sizeof dir, "dmg");
    const char *name = test_arena_name("dmg");
    stash_arena_opts ao = arena_opts;
    ao.backend = test_backend();
    stash_service_opts o = {.sz = sizeof(stash_service_opts), .arena = &ao, .dir = dir};
    stash_service *s = start(name, &o);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_checkpoint_info info;
    for (int i = 0; i < 2; i++) cr_assert_eq(stash_checkpoint(a, 60000, &info), 0);
    stash_service_stop(s);
    stash_arena_close(a);
    cr_assert_eq(stash_arena_destroy(name, NULL), 0);
    for (int id = 1; id <= 2; id++) {
        snprintf(path, sizeof path, "%s/chk-%d/_metadata", dir, id);
        FILE *f = fopen(path, "r+");
        cr_assert_not_null(f);
        fseek(f, 20, SEEK_SET);
        fputs("damage", f);
        fclose(f);
    }
    cr_assert_eq(stash_service_start(name, &o, &s), STASH_ECORRUPT);
    cr_assert(strstr(stash_errmsg(), "chk-2: ") && strstr(stash_errmsg(), "chk-1: "), "%s",
              stash_errmsg());
    cr_assert_eq(stash_arena_destroy(name, NULL), -ENOENT, "no arena was created");
    /* So does the command, also with --dir=DIR. */
    char args[512], out[4096];
    snprintf(args, sizeof args, "serve %s --dir=%s", name, dir);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "chk-2: ") && strstr(out, "no checkpoint's metadata can be used"), "%s",
              out);
    o.start_empty = 1;
    s = start(name, &o);
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0);
    cr_assert_eq(info.id, 3);
    stash_service_stop(s);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

Test(engine, a_delta_that_fails_on_its_base_is_followed_by_a_full_checkpoint, .timeout = 120)
{
    char dir[128], path[256];
    temp_dir(dir, sizeof dir, "base");
    const char *name = test_arena_name("base");
    stash_arena_opts ao = arena_opts;
    ao.backend = test_backend();
    stash_service *s = start(
        name, &(stash_service_opts){
                  .sz = sizeof(stash_service_opts), .arena = &ao, .dir = dir, .incremental = 1});
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "%s", info.detail);
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "%s", info.detail);
    cr_assert(info.incremental);
    /* The base of the next delta loses its metadata's bytes. */
    snprintf(path, sizeof path, "%s/chk-%llu/_metadata", dir, (unsigned long long)info.id);
    FILE *f = fopen(path, "r+");
    cr_assert_not_null(f);
    fseek(f, 20, SEEK_SET);
    fputs("damage", f);
    fclose(f);
    cr_assert_eq(stash_checkpoint(a, 60000, &info), STASH_EABORTED);
    cr_assert(strstr(info.detail, "the next checkpoint is full"), "%s", info.detail);
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "%s", info.detail);
    cr_assert(!info.incremental);
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "%s", info.detail);
    cr_assert(info.incremental, "the chain goes on from the full one");
    stash_service_stop(s);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

/* Flips the byte at offset of the file at path. */
static void flip_byte(const char *path, long offset)
{
    FILE *f = fopen(path, "r+");
    cr_assert_not_null(f, "%s", path);
    fseek(f, offset, SEEK_SET);
    int c = fgetc(f);
    cr_assert_neq(c, EOF, "%s is shorter than %ld bytes", path, offset);
    fseek(f, offset, SEEK_SET);
    fputc(c ^ 0x20, f);
    fclose(f);
}

Test(engine, a_delta_never_depends_on_a_shared_file_damaged_after_it_was_written, .timeout = 120)
{
    char dir[128], path[256];
    temp_dir(dir, sizeof dir, "shd");
    const char *name = test_arena_name("shd");
    stash_arena_opts ao = arena_opts;
    ao.backend = test_backend();
    stash_service *s = start(name, &(stash_service_opts){.sz = sizeof(stash_service_opts),
                                                         .arena = &ao,
                                                         .dir = dir,
                                                         .incremental = 1,
                                                         .retain = 1});
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_worker *w;
    stash_state *v;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &v),
        0);
    for (uint64_t k = 0; k < 64; k++) {
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_put(v, &k, sizeof k), 0);
    }
    stash_checkpoint_info info;
    stash_event ev;
    cr_assert_eq(stash_barrier(w, &ev), 0);
    /* The worker's barriers cut each checkpoint; a thread of the test asks. */
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
    uint64_t first = info.id;
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
    cr_assert(info.incremental);
    /* The full checkpoint's data file, which the delta and every next one
     * would depend on, is damaged on the disk. */
    snprintf(path, sizeof path, "%s/shared/%llu.dat", dir, (unsigned long long)first);
    flip_byte(path, 40);
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), STASH_EABORTED);
    snprintf(path, sizeof path, "shared/%llu.dat: offset 40", (unsigned long long)first);
    cr_assert(strstr(info.detail, "damaged file") && strstr(info.detail, path), "%s", info.detail);
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
    cr_assert(!info.incremental, "the next one depends on nothing");
    stash_worker_close(w);
    stash_service_stop(s);
    stash_arena_close(a);
    /* A power loss: the newest checkpoint, the only one retained, restores. */
    stash_arena_destroy(name, NULL);
    s = start(name,
              &(stash_service_opts){
                  .sz = sizeof(stash_service_opts), .arena = &ao, .dir = dir, .incremental = 1});
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &v),
        0);
    for (uint64_t k = 0; k < 64; k++) {
        stash_bytes b;
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_get(v, &b), 0, "key %llu", (unsigned long long)k);
        cr_assert_eq(test_u64(b.data), k);
    }
    stash_worker_close(w);
    stash_service_stop(s);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

/* Opens worker 0 of 1 (with rollback) and registers the value state v. */
static stash_worker *open_worker(const char *name, bool rollback, stash_state **v)
{
    stash_worker *w;
    cr_assert_eq(
        stash_worker_open(
            name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .rollback = rollback}, &w),
        0, "%s", stash_errmsg());
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            v),
        0);
    return w;
}

static void put_checkpoint(const char *name, stash_arena *a, uint64_t value)
{
    stash_state *v;
    stash_worker *w = open_worker(name, false, &v);
    uint64_t k = 1;
    stash_key_set(w, &k, sizeof k);
    cr_assert_eq(stash_value_put(v, &value, sizeof value), 0);
    stash_worker_close(w);
    stash_checkpoint_info info;
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "%s", info.detail);
}

Test(engine, a_rollback_says_which_checkpoint_it_restored_and_why_not_a_newer, .timeout = 120)
{
    char dir[128], path[256];
    temp_dir(dir, sizeof dir, "back");
    const char *name = test_arena_name("rb");
    stash_arena_opts ao = arena_opts;
    ao.backend = test_backend();
    stash_service *s = start(
        name, &(stash_service_opts){.sz = sizeof(stash_service_opts), .arena = &ao, .dir = dir});
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    put_checkpoint(name, a, 1);
    put_checkpoint(name, a, 2);
    stash_state *v;
    stash_event ev;
    stash_worker *w = open_worker(name, true, &v);
    cr_assert_eq(stash_barrier(w, &ev), 1);
    cr_assert_eq(ev.kind, STASH_ROLLED_BACK);
    cr_assert_eq(ev.checkpoint_id, 2);
    cr_assert_str_eq(ev.detail, "");
    cr_assert_eq(stash_barrier(w, &ev), 0, "reported once");
    stash_worker_close(w);
    /* The newest checkpoint's data is damaged: the rollback goes further back, and says so. */
    snprintf(path, sizeof path, "%s/chk-2/kg-data.dat", dir);
    FILE *f = fopen(path, "r+");
    cr_assert_not_null(f);
    fseek(f, 100, SEEK_SET);
    fputs("damage", f);
    fclose(f);
    w = open_worker(name, true, &v);
    cr_assert_eq(stash_barrier(w, &ev), 1);
    cr_assert_eq(ev.kind, STASH_ROLLED_BACK);
    cr_assert_eq(ev.checkpoint_id, 1);
    cr_assert(strstr(ev.detail, "1 newer checkpoint passed over") && strstr(ev.detail, path), "%s",
              ev.detail);
    uint64_t k = 1;
    stash_key_set(w, &k, sizeof k);
    stash_bytes b;
    cr_assert_eq(stash_value_get(v, &b), 0);
    cr_assert_eq(test_u64(b.data), 1);
    stash_worker_close(w);
    stash_service_stop(s);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

Test(engine, a_checkpoint_directory_that_is_a_file_is_refused_at_start, .timeout = 60)
{
    char dir[128], file[160], out[4096], args[512];
    temp_dir(dir, sizeof dir, "file");
    snprintf(file, sizeof file, "%s/plain", dir);
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fclose(f);
    const char *name = test_arena_name("file");
    stash_service *s = NULL;
    cr_assert_eq(
        stash_service_start(
            name, &(stash_service_opts){.sz = sizeof(stash_service_opts), .dir = file}, &s),
        -ENOTDIR);
    cr_assert(strstr(stash_errmsg(), file), "%s", stash_errmsg());
    cr_assert_eq(stash_arena_destroy(name, NULL), -ENOENT, "no arena was created");
    snprintf(args, sizeof args, "serve %s --dir %s", name, file);
    int rc = test_run_stash(args, out, sizeof out);
    cr_assert_neq(rc, 0, "%s", out);
    cr_assert(strstr(out, file) && strstr(out, "not a directory"), "%s", out);
    drop_dir(dir);
}

/* The tmpfs a test mounted: unmounted after the test, failed or not. */
static char mounted[128];

static void unmount_tmpfs(void)
{
    if (!mounted[0]) return;
    umount2(mounted, MNT_DETACH);
    rmdir(mounted);
    mounted[0] = 0;
}

/* Mounts a small tmpfs on a new directory in dir, or skips the test. */
static void mount_tmpfs(char *dir, size_t cap, const char *tag)
{
    temp_dir(dir, cap, tag);
    if (mount("tmpfs", dir, "tmpfs", 0, "size=64m,mode=0700") != 0) {
        int err = errno;
        rmdir(dir);
        cr_skip_test("cannot mount a tmpfs here: %s", strerror(err));
    }
    snprintf(mounted, sizeof mounted, "%s", dir);
}

static void remount_read_only(const char *dir)
{
    cr_assert_eq(mount(NULL, dir, NULL, MS_REMOUNT | MS_RDONLY, NULL), 0, "remount %s: %s", dir,
                 strerror(errno));
}

Test(engine, a_read_only_checkpoint_directory_is_refused_at_start, .timeout = 60,
     .fini = unmount_tmpfs)
{
    char dir[128];
    mount_tmpfs(dir, sizeof dir, "ro");
    remount_read_only(dir);
    stash_service *s = NULL;
    int rc = stash_service_start(
        test_arena_name("ro"), &(stash_service_opts){.sz = sizeof(stash_service_opts), .dir = dir},
        &s);
    cr_assert_eq(rc, -EROFS, "%s", stash_strerror(rc));
    cr_assert(strstr(stash_errmsg(), dir) && strstr(stash_errmsg(), "cannot write"), "%s",
              stash_errmsg());
}

typedef struct log_lines {
    pthread_mutex_t mu;
    char text[16384];
} log_lines;

static void keep_line(void *ctx, const char *line)
{
    log_lines *l = ctx;
    pthread_mutex_lock(&l->mu);
    size_t n = strlen(l->text);
    snprintf(l->text + n, sizeof l->text - n, "%s\n", line);
    pthread_mutex_unlock(&l->mu);
}

static bool logged(log_lines *l, const char *what)
{
    pthread_mutex_lock(&l->mu);
    bool found = strstr(l->text, what) != NULL;
    pthread_mutex_unlock(&l->mu);
    return found;
}

Test(engine, checkpoints_failing_in_a_row_back_off_and_say_so, .timeout = 120)
{
    char dir[128], away[160];
    temp_dir(dir, sizeof dir, "back");
    snprintf(away, sizeof away, "%s.away", dir);
    const char *name = test_arena_name("back");
    log_lines lines = {.mu = PTHREAD_MUTEX_INITIALIZER};
    stash_arena_opts ao = arena_opts;
    ao.backend = test_backend();
    const uint64_t interval_ms = 60000;
    stash_service *s = start(name, &(stash_service_opts){.sz = sizeof(stash_service_opts),
                                                         .arena = &ao,
                                                         .dir = dir,
                                                         .interval_ms = interval_ms,
                                                         .log = keep_line,
                                                         .log_ctx = &lines});
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_checkpoint_info info;
    stash_service_info sv;
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "%s", info.detail);
    /* The directory goes (a file stands in its place): every checkpoint fails. */
    cr_assert_eq(rename(dir, away), 0);
    FILE *f = fopen(dir, "w");
    cr_assert_not_null(f);
    fclose(f);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(stash_checkpoint(a, 60000, &info), STASH_EABORTED);
        cr_assert(strstr(info.detail, dir), "%s", info.detail);
    }
    cr_assert_eq(stash_service_info_get(a, &sv), 0);
    cr_assert_geq(sv.failing, 3);
    cr_assert_neq(sv.recent[0].status, 0);
    cr_assert(logged(&lines, "failed in a row: backing off"), "%s", lines.text);
    char args[256], out[8192];
    snprintf(args, sizeof args, "status %s", name);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "checkpoints failed in a row: backing off"), "%s", out);
    /* From the third failure the next checkpoint of the interval waits at
     * least two intervals after the last one ended. */
    cr_assert_geq(sv.next_ns, sv.recent[0].started_ns + 2 * interval_ms * 1000000ull, "%llu",
                  (unsigned long long)sv.next_ns);
    cr_assert_eq(unlink(dir), 0);
    cr_assert_eq(rename(away, dir), 0);
    cr_assert_eq(stash_checkpoint(a, 60000, &info), 0, "%s", info.detail);
    cr_assert_eq(stash_service_info_get(a, &sv), 0);
    cr_assert_eq(sv.failing, 0);
    cr_assert(logged(&lines, "failed in a row: every 60000 ms again"), "%s", lines.text);
    /* Back to one interval after a success. */
    cr_assert_lt(sv.next_ns, sv.recent[0].started_ns + 2 * interval_ms * 1000000ull);
    stash_service_stop(s);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}

static uint64_t coarse_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

Test(engine, a_workers_heartbeat_moves_at_its_barriers, .timeout = 60)
{
    char name[96];
    stash_arena *a = test_arena_create("beat", 0, 8, name);
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    stash_worker_info before, after;
    stash_worker_info_get(w, &before);
    /* Once the clock has moved past the last sign of life, a barrier shows. */
    while (coarse_now_ns() <= before.heartbeat_ns) continue;
    stash_event ev;
    cr_assert_geq(stash_barrier(w, &ev), 0);
    stash_worker_info_get(w, &after);
    cr_assert_gt(after.heartbeat_ns, before.heartbeat_ns);
    stash_worker_close(w);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(engine, the_longest_cut_is_of_that_checkpoint_only, .timeout = 120)
{
    char dir[128];
    temp_dir(dir, sizeof dir, "cut");
    const char *name = test_arena_name("cut");
    stash_arena_opts ao = arena_opts;
    ao.backend = test_backend();
    stash_service *s = start(
        name, &(stash_service_opts){.sz = sizeof(stash_service_opts), .arena = &ao, .dir = dir});
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    stash_state *offsets;
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "o", .kind = STASH_OP_LIST},
            &offsets),
        0);
    /* Operator state to record makes the worker's cut take a while. */
    static uint8_t element[4096];
    for (int i = 0; i < 2000; i++)
        cr_assert_eq(stash_op_list_add(offsets, element, sizeof element), 0);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_checkpoint_info first;
    cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &first), 0, "%s", first.detail);
    cr_assert_gt(first.pause_ns, 0);
    /* The worker leaves; the engine cuts its key groups itself. */
    stash_worker_close(w);
    stash_checkpoint_info second;
    cr_assert_eq(stash_checkpoint(a, 60000, &second), 0, "%s", second.detail);
    cr_assert_lt(second.pause_ns, first.pause_ns, "%llu after %llu",
                 (unsigned long long)second.pause_ns, (unsigned long long)first.pause_ns);
    stash_service_stop(s);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    drop_dir(dir);
}
