/* SPDX-License-Identifier: MIT */
/*
 * test_arena.c: creating, attaching, detaching and destroying arenas, and
 * every refusal: a file that is not an arena, another layout version, a
 * truncated file, an unfinished creation, an existing name, a corrupted
 * arena. A refused file is never written to.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "tests/helpers.h"

static void path_of(const char *name, char *path)
{
    snprintf(path, 128, "/dev/shm/stash.%s", name);
}

/* The bytes of a file, to show that a refused open changed none of them. */
static uint64_t file_digest(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    uint64_t h = 1469598103934665603ull;
    int c;
    while ((c = fgetc(f)) != EOF) h = (h ^ (uint64_t)c) * 1099511628211ull;
    fclose(f);
    return h;
}

static void expect_refused(const char *name, const char *path, int want)
{
    uint64_t before = file_digest(path);
    stash_arena *a = NULL;
    int rc = stash_arena_open(name, NULL, &a);
    cr_assert_eq(rc, want, "open %s: got %d (%s), want %d (%s)", name, rc, stash_strerror(rc), want,
                 stash_strerror(want));
    cr_assert_null(a);
    cr_assert(strstr(stash_errmsg(), path), "the message names the file: %s", stash_errmsg());
    cr_assert_eq(file_digest(path), before, "a refused arena file is left as it was");
}

Test(arena, the_library_is_the_version_its_header_says)
{
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", STASH_VERSION_MAJOR, STASH_VERSION_MINOR,
             STASH_VERSION_PATCH);
    cr_assert_str_eq(stash_version(), want);
}

Test(arena, create_open_close_destroy_round_trip)
{
    char name[96];
    stash_arena *a = test_arena_create("rt", 8u << 20, 256, name);
    stash_arena_info info;
    stash_arena_info_get(a, &info);
    cr_assert_eq(info.size, 8u << 20);
    cr_assert_eq(info.max_parallelism, 256);
    cr_assert_eq(info.layout_version, SHM_LAYOUT_VERSION);
    cr_assert_eq(info.creator_pid, getpid());
    cr_assert_gt(info.data_bytes, 4u << 20);
    cr_assert_eq(info.pool_free_bytes, info.data_bytes);

    stash_arena *b;
    cr_assert_eq(stash_arena_open(name, NULL, &b), 0, "%s", stash_errmsg());
    stash_arena_info binfo;
    stash_arena_info_get(b, &binfo);
    cr_assert_eq(binfo.created_ns, info.created_ns);
    cr_assert_str_eq(binfo.path, info.path);
    stash_arena_close(b);
    stash_arena_close(a);
    stash_arena_close(NULL);

    cr_assert_eq(stash_arena_destroy(name, NULL), 0);
    cr_assert_eq(stash_arena_open(name, NULL, &b), -ENOENT);
    cr_assert_eq(stash_arena_destroy(name, NULL), -ENOENT);
}

Test(arena, attach_from_another_process_sees_the_same_memory)
{
    char name[96];
    stash_arena *a = test_arena_create("share", 4u << 20, 0, name);
    uint32_t *cell = (uint32_t *)(a->data);
    *cell = 0;
    pid_t pid = fork();
    if (pid == 0) {
        stash_arena *b;
        if (stash_arena_open(name, NULL, &b)) _exit(1);
        *(uint32_t *)b->data = 0xfeedbeef;
        stash_arena_close(b);
        _exit(0);
    }
    cr_assert_eq(test_wait(pid), 0);
    cr_assert_eq(*cell, 0xfeedbeef, "a store in the child is seen by the parent");
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(arena, mode_is_0600_by_default_and_0660_with_group)
{
    char name[96], path[128];
    stash_arena *a = test_arena_create("mode", 2u << 20, 0, name);
    path_of(name, path);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);

    const char *g = test_arena_name("group");
    cr_assert_eq(stash_arena_create(g,
                                    &(stash_arena_opts){.sz = sizeof(stash_arena_opts),
                                                        .size = 2u << 20,
                                                        .flags = STASH_ARENA_GROUP},
                                    &a),
                 0);
    path_of(g, path);
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0660);
    stash_arena_close(a);
    stash_arena_destroy(g, NULL);
}

Test(arena, an_existing_name_is_refused_unless_replaced)
{
    char name[96], path[128];
    stash_arena *a = test_arena_create("exists", 2u << 20, 0, name), *b = NULL;
    path_of(name, path);
    *(uint64_t *)a->data = 42;
    cr_assert_eq(
        stash_arena_create(
            name, &(stash_arena_opts){.sz = sizeof(stash_arena_opts), .size = 2u << 20}, &b),
        -EEXIST);
    cr_assert(strstr(stash_errmsg(), path));
    cr_assert_eq(*(uint64_t *)a->data, 42, "the existing arena is untouched");
    cr_assert_eq(stash_arena_create(name,
                                    &(stash_arena_opts){.sz = sizeof(stash_arena_opts),
                                                        .size = 2u << 20,
                                                        .flags = STASH_ARENA_REPLACE},
                                    &b),
                 0);
    cr_assert_eq(*(uint64_t *)b->data, 0, "the replacement is a new arena");
    stash_arena_close(b);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(arena, a_file_that_is_not_an_arena_is_refused)
{
    const char *name = test_arena_name("junk");
    char path[128];
    path_of(name, path);
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 10000; i++) fputc(i * 7, f);
    fclose(f);
    expect_refused(name, path, STASH_ENOTARENA);
    uint64_t before = file_digest(path);
    cr_assert_eq(stash_arena_destroy(name, NULL), STASH_ENOTARENA);
    cr_assert(strstr(stash_errmsg(), path), "%s", stash_errmsg());
    cr_assert_eq(file_digest(path), before, "destroy removed or changed no byte of it");
    unlink(path);
}

Test(arena, an_arena_of_another_user_is_refused_unless_shared_with_a_group_of_ours)
{
    char name[96], path[128];
    stash_arena_close(test_arena_create("owner", 2u << 20, 0, name));
    path_of(name, path);
    cr_assert_eq(chown(path, 65534, 65534), 0);
    stash_arena *a = NULL;
    cr_assert_eq(stash_arena_open(name, NULL, &a), -EPERM);
    cr_assert(strstr(stash_errmsg(), path) && strstr(stash_errmsg(), "owned by user 65534"), "%s",
              stash_errmsg());
    /* Shared with a group of this process: accepted. */
    cr_assert_eq(chown(path, 65534, getegid()), 0);
    cr_assert_eq(chmod(path, 0660), 0);
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0, "%s", stash_errmsg());
    stash_arena_close(a);
    cr_assert_eq(chmod(path, 0600), 0);
    cr_assert_eq(stash_arena_open(name, NULL, &a), -EPERM);
    /* Nor is it destroyed: its owner removes it (here, the test). */
    cr_assert_eq(stash_arena_destroy(name, NULL), -EPERM);
    cr_assert_eq(access(path, F_OK), 0);
    unlink(path);
}

Test(arena, a_device_or_fifo_in_place_of_the_arena_is_refused, .timeout = 30)
{
    stash_arena *a = NULL;
    cr_assert_eq(
        stash_arena_open(
            "zero", &(stash_arena_opts){.sz = sizeof(stash_arena_opts), .path = "/dev/zero"}, &a),
        STASH_ENOTARENA);
    cr_assert(strstr(stash_errmsg(), "not a regular file"), "%s", stash_errmsg());
    char fifo[128];
    snprintf(fifo, sizeof fifo, "/dev/shm/stash.%s", test_arena_name("fifo"));
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_assert_eq(stash_arena_open(
                     "fifo", &(stash_arena_opts){.sz = sizeof(stash_arena_opts), .path = fifo}, &a),
                 STASH_ENOTARENA);
    unlink(fifo);
}

Test(arena, destroy_removes_the_arena_it_names_and_no_other)
{
    const char *name = test_arena_name("left");
    char other[128];
    snprintf(other, sizeof other, "%s.restoring", name);
    stash_arena *a;
    cr_assert_eq(
        stash_arena_create(
            name, &(stash_arena_opts){.sz = sizeof(stash_arena_opts), .size = 2u << 20}, &a),
        0);
    stash_arena_close(a);
    cr_assert_eq(
        stash_arena_create(
            other, &(stash_arena_opts){.sz = sizeof(stash_arena_opts), .size = 2u << 20}, &a),
        0);
    stash_arena_close(a);
    cr_assert_eq(stash_arena_destroy(name, NULL), 0, "%s", stash_errmsg());
    cr_assert_eq(stash_arena_destroy(name, NULL), -ENOENT);
    cr_assert_eq(stash_arena_open(other, NULL, &a), 0, "%s", stash_errmsg());
    stash_arena_close(a);
    cr_assert_eq(stash_arena_destroy(other, NULL), 0, "%s", stash_errmsg());
}

static void patch_file(const char *path, off_t off, const void *bytes, size_t n)
{
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pwrite(fd, bytes, n, off), (ssize_t)n);
    close(fd);
}

Test(arena, another_layout_version_is_refused)
{
    char name[96], path[128];
    stash_arena_close(test_arena_create("version", 2u << 20, 0, name));
    path_of(name, path);
    uint32_t v = 99;
    patch_file(path, offsetof(shm_header, layout_version), &v, sizeof v);
    expect_refused(name, path, STASH_EVERSION);
    cr_assert(strstr(stash_errmsg(), "99"), "%s", stash_errmsg());
    stash_arena_destroy(name, NULL);
}

/* One part of a live arena corrupted in its memory: attach refuses it,
 * naming the part, and takes it again once the bytes are back. */
typedef struct corruption {
    const char *what; /* in the message */
    size_t offset;    /* from the arena's start */
    uint64_t value;
    size_t len;
} corruption;

Test(arena, a_corrupted_arena_is_refused_at_attach_naming_the_part)
{
    char name[96], path[128];
    stash_arena *a = test_arena_create("corrupt", 8u << 20, 8, name);
    path_of(name, path);
    stash_worker *w;
    stash_state *v;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
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
    const shm_header *h = a->hdr;
    size_t table = h->tables_off + 2 * sizeof(shm_table),
           heap = h->heaps_off + 3 * sizeof(shm_kg_heap);
    /* A block of span 0, given as a free block of a class its span does not have. */
    unsigned other = (shm_span_class(atomic_load(&a->spans[0].word)) + 1) % SHM_NCLASSES;
    const corruption cases[] = {
        {"places the arena's parts", offsetof(shm_header, tables_off), 4096, 8},
        {"out of range", offsetof(shm_header, nspans), 1u << 30, 8},
        {"places the arena's parts", offsetof(shm_header, nspans), 1, 8},
        {"places the arena's parts", offsetof(shm_header, page_size), 3, 4},
        {"key group 2: its index", table + offsetof(shm_table, index), h->arena_size + 4096, 8},
        {"key group 2: its index", table + offsetof(shm_table, log2), 40, 4},
        {"key group 2: its growing index", table + offsetof(shm_table, growing), 64, 8},
        {"key group 2: its reclamation ring", table + offsetof(shm_table, retired), UINT64_MAX - 4,
         8},
        {"key group 2: its record being changed", table + offsetof(shm_table, undo.rec), 1, 4},
        {"key group 3: its free list", heap + offsetof(shm_kg_heap, cls[5].free_head), 16, 8},
        {"key group 3: its free list",
         heap + offsetof(shm_kg_heap, cls) + other * sizeof(shm_class_heap) +
             offsetof(shm_class_heap, free_head),
         h->data_off, 8},
        {"key group 3: its span being carved", heap + offsetof(shm_kg_heap, cls[5].carve),
         (uint64_t)1 << 60, 8},
        {"worker slot 0", h->registry_off + offsetof(shm_slot, kg_last), 8, 4},
        {"worker 5: its operator state",
         h->control_off + offsetof(shm_control, workers[5].committed.off), h->arena_size + 64, 8},
        {"worker 5: its operator state",
         h->control_off + offsetof(shm_control, workers[5].pending.off), h->data_off + 8, 8},
        {"page pool", offsetof(shm_header, pool_bump), h->nspans + 1, 8},
        {"span 0 is not the head", h->spans_desc_off + offsetof(shm_span, word),
         shm_span_pack(SHM_SPAN_OWNED, 62, 0, 1), 8},
        {"span 3 links past", h->spans_desc_off + 3 * sizeof(shm_span) + offsetof(shm_span, next),
         (uint32_t)h->nspans + 2, 4},
        {"state catalog entry 0", h->catalog_off + offsetof(shm_catalog_entry, kind), 77, 4},
        {"registry_hwm", offsetof(shm_header, registry_hwm), 0xffffffffu, 4},
        {"registry_hwm", offsetof(shm_header, registry_hwm), STASH_MAX_WORKERS + 1, 4},
        {"committed_p", h->control_off + offsetof(shm_control, committed_p), STASH_MAX_WORKERS + 1,
         4},
        {"parallelism", h->control_off + offsetof(shm_control, parallelism), 0x80000000u, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const corruption *c = &cases[i];
        uint8_t saved[8];
        memcpy(saved, a->base + c->offset, c->len);
        memcpy(a->base + c->offset, &c->value, c->len);
        stash_arena *b = NULL;
        int rc = stash_arena_open(name, NULL, &b);
        cr_assert_lt(rc, 0, "%s: attached", c->what);
        cr_assert_null(b);
        cr_assert(strstr(stash_errmsg(), c->what) && strstr(stash_errmsg(), path),
                  "case %zu: the message names %s and the file: %s", i, c->what, stash_errmsg());
        memcpy(a->base + c->offset, saved, c->len);
        cr_assert_eq(stash_arena_open(name, NULL, &b), 0, "%s", stash_errmsg());
        stash_arena_close(b);
    }
    stash_worker_close(w);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(arena, a_path_in_the_arena_that_does_not_end_in_its_field_is_refused_at_attach)
{
    char name[96], path[128];
    stash_arena *a = test_arena_create("unended", 8u << 20, 8, name);
    path_of(name, path);
    const struct {
        const char *what;
        char *at;
        size_t size;
    } fields[] = {
        {"lmdb_dir", a->hdr->lmdb_dir, sizeof a->hdr->lmdb_dir},
        {"field dir", a->control->dir, sizeof a->control->dir},
        {"lazy_path", a->control->lazy_path, sizeof a->control->lazy_path},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        char saved[SHM_CTL_DETAIL];
        memcpy(saved, fields[i].at, fields[i].size);
        memset(fields[i].at, '/', fields[i].size);
        stash_arena *b = NULL;
        cr_assert_eq(stash_arena_open(name, NULL, &b), STASH_ECORRUPT, "%s", fields[i].what);
        cr_assert(strstr(stash_errmsg(), fields[i].what) && strstr(stash_errmsg(), path), "%s",
                  stash_errmsg());
        memcpy(fields[i].at, saved, fields[i].size);
        cr_assert_eq(stash_arena_open(name, NULL, &b), 0, "%s", stash_errmsg());
        stash_arena_close(b);
    }
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

/* Attaches to arena arg as a worker and writes: exits 0 if the attach was
 * refused naming the registry's high-water mark, 1 if it was taken. */
static int attach_and_write(void *arg)
{
    stash_worker *w;
    stash_state *v;
    if (stash_worker_open(arg, NULL, &w) != 0)
        return strstr(stash_errmsg(), "registry_hwm") && strstr(stash_errmsg(), (char *)arg) ? 0
                                                                                             : 2;
    uint64_t k = 1;
    stash_state_get(
        w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
        &v);
    stash_key_set(w, &k, sizeof k);
    stash_value_put(v, &k, sizeof k);
    stash_worker_close(w);
    return 1;
}

Test(arena, a_registry_high_water_mark_past_the_slots_is_refused_before_a_worker_writes)
{
    char name[96];
    stash_arena *a = test_arena_create("hwm", 8u << 20, 8, name);
    atomic_store(&a->hdr->registry_hwm, 0xffffffffu);
    int rc = test_wait(test_fork(attach_and_write, name));
    cr_assert_eq(
        rc, 0, "the worker is refused, naming the field and the file, and does not crash: %d", rc);
    atomic_store(&a->hdr->registry_hwm, STASH_MAX_WORKERS);
    rc = test_wait(test_fork(attach_and_write, name));
    cr_assert_eq(rc, 1, "every slot in use is a mark: %d", rc);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(arena, a_truncated_file_is_refused)
{
    char name[96], path[128];
    stash_arena_close(test_arena_create("trunc", 4u << 20, 0, name));
    path_of(name, path);
    cr_assert_eq(truncate(path, 3u << 20), 0);
    expect_refused(name, path, STASH_ETRUNCATED);
    cr_assert_eq(truncate(path, 100), 0);
    expect_refused(name, path, STASH_ETRUNCATED);
    stash_arena_destroy(name, NULL);
}

Test(arena, an_unfinished_creation_is_refused)
{
    char name[96], path[128];
    stash_arena_close(test_arena_create("unfinished", 2u << 20, 0, name));
    path_of(name, path);
    uint32_t zero = 0;
    patch_file(path, offsetof(shm_header, initialized), &zero, sizeof zero);
    expect_refused(name, path, STASH_EINCOMPLETE);
    cr_assert_eq(truncate(path, 0), 0);
    stash_arena *a;
    cr_assert_eq(stash_arena_open(name, NULL, &a), STASH_EINCOMPLETE);
    /* Emptied, it is no arena destroy may remove: the test removes it. */
    cr_assert_eq(stash_arena_destroy(name, NULL), STASH_ENOTARENA);
    unlink(path);
}

Test(arena, bad_names_and_sizes_are_refused)
{
    stash_arena *a;
    cr_assert_eq(stash_arena_create("", NULL, &a), -EINVAL);
    cr_assert_eq(stash_arena_create("a/b", NULL, &a), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "a/b"));
    cr_assert_eq(stash_arena_create(".hidden", NULL, &a), -EINVAL);
    const char *name = test_arena_name("small");
    cr_assert_eq(stash_arena_create(
                     name, &(stash_arena_opts){.sz = sizeof(stash_arena_opts), .size = 4096}, &a),
                 -EINVAL);
    cr_assert_eq(stash_arena_create(
                     name,
                     &(stash_arena_opts){.sz = sizeof(stash_arena_opts), .max_parallelism = 40000},
                     &a),
                 -EINVAL);
    cr_assert_eq(stash_arena_create(name,
                                    &(stash_arena_opts){.sz = sizeof(stash_arena_opts),
                                                        .size = 1u << 20,
                                                        .max_parallelism = 32768},
                                    &a),
                 -EINVAL, "1 MiB cannot hold 32768 key-group heaps");
    cr_assert_eq(stash_arena_open(name, NULL, &a), -ENOENT, "a refused create leaves no file");
}

Test(arena, an_explicit_path_is_used)
{
    char path[128];
    snprintf(path, sizeof path, "/tmp/stash-test-%d.arena", (int)getpid());
    stash_arena_opts o = {.sz = sizeof(stash_arena_opts), .path = path, .size = 2u << 20};
    stash_arena *a, *b;
    cr_assert_eq(stash_arena_create("custom", &o, &a), 0, "%s", stash_errmsg());
    cr_assert_eq(access(path, F_OK), 0);
    cr_assert_eq(stash_arena_open("custom", &o, &b), 0);
    stash_arena_close(b);
    stash_arena_close(a);
    cr_assert_eq(stash_arena_destroy("custom", &o), 0);
    cr_assert_neq(access(path, F_OK), 0);
}

Test(arena, huge_pages_on_hugetlbfs)
{
    const char *mount = "/dev/hugepages";
    struct statfs fs;
    if (statfs(mount, &fs) != 0 || fs.f_type != 0x958458f6)
        cr_skip_test("no hugetlbfs mounted at %s", mount);
    char path[128];
    snprintf(path, sizeof path, "%s/stash-test-%d", mount, (int)getpid());
    stash_arena *a;
    int rc = stash_arena_create(
        "huge", &(stash_arena_opts){.sz = sizeof(stash_arena_opts), .path = path, .size = 4u << 20},
        &a);
    if (rc == -ENOMEM || rc == -ENOSPC) cr_skip_test("no huge pages reserved (vm.nr_hugepages)");
    cr_assert_eq(rc, 0, "%s", stash_errmsg());
    stash_arena_info info;
    stash_arena_info_get(a, &info);
    cr_assert_eq(info.huge_pages, 1);
    cr_assert_eq(info.page_size, fs.f_bsize);
    stash_arena_close(a);
    unlink(path);
}

/* Writes keys 0 .. 99 and dies holding its key groups. */
static int write_keys_and_die(void *arg)
{
    const char *name = arg;
    stash_worker *w;
    stash_state *v;
    if (stash_worker_open(name, NULL, &w) ||
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &v))
        return 1;
    for (uint64_t k = 0; k < 100; k++) {
        stash_key_set(w, &k, sizeof k);
        if (stash_value_put(v, &k, sizeof k)) return 2;
    }
    _exit(0);
}

Test(arena, a_takeover_drops_an_index_slot_that_leads_outside_the_arena)
{
    char name[96];
    stash_arena *a = test_arena_create("stray", 8u << 20, 8, name);
    cr_assert_eq(test_wait(test_fork(write_keys_and_die, name)), 0);
    /* Damage: one used slot of key group 0 refers past the arena's end. */
    shm_table *t = &a->tables[0];
    shm_group *g = (shm_group *)(a->base + atomic_load(&t->index));
    uint32_t groups = 1u << atomic_load(&t->log2), hit = 0;
    for (uint32_t i = 0; i < groups * SHM_GROUP_SLOTS && !hit; i++)
        if (atomic_load(&g[i / SHM_GROUP_SLOTS].tag[i % SHM_GROUP_SLOTS]) >= 2) {
            atomic_store(&g[i / SHM_GROUP_SLOTS].ref[i % SHM_GROUP_SLOTS],
                         shm_ref_of(a->size + (1u << 20)));
            hit = 1;
        }
    cr_assert(hit, "key group 0 holds no key");
    stash_worker *w;
    stash_state *v;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    cr_assert_eq(
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &v),
        0);
    unsigned found = 0;
    for (uint64_t k = 0; k < 100; k++) {
        stash_bytes b;
        cr_assert_eq(stash_key_set(w, &k, sizeof k), 0);
        int rc = stash_value_get(v, &b);
        cr_assert(rc == 0 || rc == STASH_ENOTFOUND, "%s", stash_errmsg());
        if (rc == 0) cr_assert_eq(test_u64(b.data), k);
        found += rc == 0;
    }
    cr_assert_eq(found, 99u, "the one damaged entry is lost, no other");
    cr_assert_eq(shm_check(a), 0, "%s", stash_errmsg());
    stash_worker_close(w);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}
