/* SPDX-License-Identifier: MIT */
/*
 * test_ckpt_hostile.c: checkpoints beside another user of the machine: the
 * modes checkpoints are written with, directories another user owns or
 * anyone may write, symbolic links planted where stash writes, and files in
 * shared/ that stash did not write.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/checkpoint/checkpoints.h"
#include "tests/helpers.h"

#define KGS 4u

static char dir[128];
static char name[96];
static stash_arena *arena;
static ioe_engine *engine;

static void setup(void)
{
    snprintf(dir, sizeof dir, "/var/tmp/stash-hostile-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    arena = test_arena_create("hostile", 8u << 20, KGS, name);
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0);
    stash_state *v;
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &v),
        0);
    for (uint64_t k = 0; k < 100; k++) {
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_put(v, &k, sizeof k), 0);
    }
    stash_worker_close(w);
    cr_assert_eq(ioe_engine_open(&(ioe_opts){0}, &engine), 0);
}

static void teardown(void)
{
    ioe_engine_close(engine);
    stash_arena_close(arena);
    stash_arena_destroy(name, NULL);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s-target %s-target.d", dir, dir, dir);
    system(cmd);
}

TestSuite(hostile, .init = setup, .fini = teardown);

static int write_checkpoint(const char *into, uint64_t id, bool incremental, bool group)
{
    shm_dir d;
    int rc = ckpt_dir_open(into, group, &d);
    if (rc) return rc;
    uint32_t pins[KGS];
    for (uint32_t kg = 0; kg < KGS; kg++) pins[kg] = (uint32_t)shm_table_pin(arena, kg);
    ckpt_opts o = {
        .dir = &d, .id = id, .engine = engine, .incremental = incremental, .group = group};
    rc = ckpt_write(arena, pins, &o, NULL);
    for (uint32_t kg = 0; kg < KGS; kg++) shm_table_unpin(arena, kg, pins[kg]);
    shm_dir_close(&d);
    return rc;
}

static mode_t mode_of(const char *fmt, const char *a, const char *b)
{
    char path[300];
    snprintf(path, sizeof path, fmt, a, b);
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0, "%s", path);
    return st.st_mode & 07777;
}

Test(hostile, checkpoints_are_the_owners_alone_unless_the_group_is_asked_for)
{
    umask(022);
    char sub[200];
    snprintf(sub, sizeof sub, "%s/own", dir);
    cr_assert_eq(write_checkpoint(sub, 1, false, false), 0, "%s", stash_errmsg());
    cr_assert_eq(mode_of("%s%s", sub, ""), 0700);
    cr_assert_eq(mode_of("%s%s", sub, "/chk-1"), 0700);
    cr_assert_eq(mode_of("%s%s", sub, "/chk-1/_metadata"), 0600);
    cr_assert_eq(mode_of("%s%s", sub, "/chk-1/kg-data.dat"), 0600);
    snprintf(sub, sizeof sub, "%s/group", dir);
    cr_assert_eq(write_checkpoint(sub, 1, true, true), 0, "%s", stash_errmsg());
    cr_assert_eq(mode_of("%s%s", sub, "/chk-1"), 0750);
    cr_assert_eq(mode_of("%s%s", sub, "/shared"), 0750);
    cr_assert_eq(mode_of("%s%s", sub, "/shared/1.dat"), 0640);
    cr_assert_eq(mode_of("%s%s", sub, "/chk-1/_metadata"), 0640);
}

Test(hostile, a_directory_another_user_owns_or_anyone_may_write_is_refused)
{
    char sub[200];
    snprintf(sub, sizeof sub, "%s/theirs", dir);
    cr_assert_eq(mkdir(sub, 0755), 0);
    cr_assert_eq(chown(sub, 65534, 65534), 0);
    cr_assert_eq(write_checkpoint(sub, 1, false, false), -EPERM);
    cr_assert(strstr(stash_errmsg(), sub) && strstr(stash_errmsg(), "owned by user 65534"), "%s",
              stash_errmsg());
    shm_dir d;
    cr_assert_eq(ckpt_dir_open(sub, false, &d), -EPERM);
    snprintf(sub, sizeof sub, "%s/anyones", dir);
    cr_assert_eq(mkdir(sub, 0700), 0);
    cr_assert_eq(chmod(sub, 0777), 0);
    cr_assert_eq(write_checkpoint(sub, 1, false, false), -EPERM);
    cr_assert(strstr(stash_errmsg(), "writable by any user"), "%s", stash_errmsg());
}

/* A file elsewhere that a planted link points to, and its bytes. */
static void make_target(char *target)
{
    snprintf(target, 160, "%s-target", dir);
    int fd = open(target, O_WRONLY | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "precious", 8), 8);
    close(fd);
}

static void expect_untouched(const char *target)
{
    char buf[16] = "";
    FILE *f = fopen(target, "r");
    cr_assert_not_null(f);
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cr_assert_eq(n, 8);
    cr_assert_str_eq(buf, "precious");
}

Test(hostile, a_link_planted_for_a_shared_file_is_never_written_through)
{
    char target[160], link[256];
    make_target(target);
    cr_assert_eq(write_checkpoint(dir, 1, true, false), 0, "%s", stash_errmsg());
    snprintf(link, sizeof link, "%s/shared/2.dat", dir);
    cr_assert_eq(symlink(target, link), 0);
    cr_assert_lt(write_checkpoint(dir, 2, true, false), 0);
    cr_assert(strstr(stash_errmsg(), link), "%s", stash_errmsg());
    expect_untouched(target);
}

Test(hostile, a_link_planted_for_the_shared_directory_is_refused)
{
    char target[160], link[256], cmd[300];
    make_target(target);
    snprintf(link, sizeof link, "%s/shared", dir);
    /* Another user's directory behind the link. */
    snprintf(cmd, sizeof cmd, "%s.d", target);
    cr_assert_eq(mkdir(cmd, 0777), 0);
    cr_assert_eq(chown(cmd, 65534, 65534), 0);
    cr_assert_eq(symlink(cmd, link), 0);
    cr_assert_lt(write_checkpoint(dir, 1, true, false), 0);
    cr_assert(strstr(stash_errmsg(), link), "%s", stash_errmsg());
    rmdir(cmd);
}

Test(hostile, retention_removes_nothing_in_shared_that_stash_did_not_write)
{
    char mine[256];
    cr_assert_eq(write_checkpoint(dir, 1, true, false), 0, "%s", stash_errmsg());
    snprintf(mine, sizeof mine, "%s/shared/notes.txt", dir);
    FILE *f = fopen(mine, "w");
    cr_assert_not_null(f);
    fclose(f);
    cr_assert_eq(ckpt_retain(test_ckpt_dir(dir), 1, engine), 0, "%s", stash_errmsg());
    cr_assert_eq(access(mine, F_OK), 0, "a file stash did not write stays");
}
