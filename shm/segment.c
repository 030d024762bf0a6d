/* SPDX-License-Identifier: MIT */
/*
 * segment.c: the arena's file and mapping: create, open (attach), close
 * (detach), destroy, and the header that tells an arena from anything else.
 *
 * Creation writes the magic first and the "initialized" mark last, so a
 * reader can tell a file that is not an arena from an arena whose creator
 * died half-way. Opening validates the header through pread before mapping
 * anything and never writes to a file it refuses.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "shm/shm.h"

#define HUGETLBFS_MAGIC_NUMBER 0x958458f6
#define NAME_MAX_LEN 100

static int check_name(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > NAME_MAX_LEN || name[0] == '.')
        return shm_fail(-EINVAL, "arena name '%s': 1 to %d characters, not starting with '.'",
                        name ? name : "(null)", NAME_MAX_LEN);
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return shm_fail(-EINVAL, "arena name '%s': only letters, digits, '_', '-' and '.'",
                            name);
    }
    return 0;
}

int shm_arena_path(const char *name, const stash_arena_opts *opts, char *path, size_t len)
{
    int rc = check_name(name);
    if (rc) return rc;
    int n = opts && opts->path ? snprintf(path, len, "%s", opts->path)
                               : snprintf(path, len, "/dev/shm/stash.%s", name);
    if (n < 0 || (size_t)n >= len) return shm_fail(-ENAMETOOLONG, "arena path too long");
    return 0;
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* Places the parts of an arena of the given size; fails if no span fits. */
static int plan_layout(shm_header *h, uint64_t size, uint32_t maxp, uint32_t page)
{
    h->registry_off = SHM_HEADER_SIZE;
    h->catalog_off = h->registry_off + (uint64_t)STASH_MAX_WORKERS * sizeof(shm_slot);
    h->heaps_off = align_up(h->catalog_off + SHM_CATALOG_SIZE * sizeof(shm_catalog_entry), 64);
    h->tables_off = align_up(h->heaps_off + (uint64_t)maxp * sizeof(shm_kg_heap), 64);
    h->control_off = align_up(h->tables_off + (uint64_t)maxp * sizeof(shm_table), 64);
    h->spans_desc_off = align_up(h->control_off + sizeof(shm_control), 4096);
    uint64_t data_align = page > SHM_SPAN_SIZE ? page : SHM_SPAN_SIZE;
    if (size <= h->spans_desc_off) return -EINVAL;
    uint64_t n = (size - h->spans_desc_off) / (SHM_SPAN_SIZE + sizeof(shm_span));
    while (n > 0) {
        uint64_t data = align_up(h->spans_desc_off + n * sizeof(shm_span), data_align);
        if (data + (n << SHM_SPAN_SHIFT) <= size) {
            h->data_off = data;
            break;
        }
        n--;
    }
    h->nspans = n;
    return n > 0 ? 0 : -EINVAL;
}

/* Points the handle's parts where the layout h (checked, or just planned)
 * puts them. */
static void bind_handle(stash_arena *a, void *base, const shm_header *h, const char *path)
{
    a->base = base;
    a->size = h->arena_size;
    a->hdr = base;
    a->slots = shm_ptr(a, h->registry_off);
    a->heaps = shm_ptr(a, h->heaps_off);
    a->tables = shm_ptr(a, h->tables_off);
    a->catalog = shm_ptr(a, h->catalog_off);
    a->control = shm_ptr(a, h->control_off);
    a->spans = shm_ptr(a, h->spans_desc_off);
    a->data = shm_ptr(a, h->data_off);
    snprintf(a->path, sizeof a->path, "%s", path);
}

static int open_exclusive(const char *path, mode_t mode, bool replace)
{
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0 && errno == EEXIST && replace) {
        if (unlink(path) < 0 && errno != ENOENT)
            return shm_fail(-errno, "%s: cannot remove the old arena: %s", path, strerror(errno));
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    }
    if (fd < 0 && errno == EEXIST)
        return shm_fail(-EEXIST, "%s: exists (replace it explicitly to recreate)", path);
    if (fd < 0) return shm_fail(-errno, "%s: cannot create: %s", path, strerror(errno));
    /* The umask must not narrow the mode the caller asked for. */
    if (fchmod(fd, mode) < 0) {
        int err = errno;
        close(fd);
        unlink(path);
        return shm_fail(-err, "%s: cannot set mode: %s", path, strerror(err));
    }
    return fd;
}

static int advise_huge_pages(void *base, uint64_t size, bool hugetlbfs)
{
    if (hugetlbfs) return 1;
    return madvise(base, size, MADV_HUGEPAGE) == 0 ? 2 : 0;
}

static void write_header(stash_arena *a, uint64_t size, uint32_t maxp, uint32_t page, int huge)
{
    shm_header *h = a->hdr;
    memcpy(h->magic, SHM_MAGIC, sizeof h->magic);
    h->layout_version = SHM_LAYOUT_VERSION;
    h->header_size = SHM_HEADER_SIZE;
    h->arena_size = size;
    h->page_size = page;
    h->span_size = SHM_SPAN_SIZE;
    h->max_parallelism = maxp;
    h->creator_pid = getpid();
    h->created_ns = shm_now_ns();
    h->huge_pages = (uint32_t)huge;
    shm_lock_init(&h->registry_lock);
    shm_lock_init(&h->catalog_lock);
    atomic_store(&h->ebr_epoch, 1);
    for (uint32_t kg = 0; kg < maxp; kg++) {
        atomic_store(&a->tables[kg].epoch, 1);
        a->tables[kg].sweep_pos = UINT32_MAX;
    }
    shm_pool_init(a);
    shm_control_init(a);
}

/* Another user who made a directory stash writes into first could steer
 * what stash writes and removes there. */
int shm_own_dir(const char *dir, mode_t mode)
{
    if (mkdir(dir, mode) == 0) return 0;
    if (errno != EEXIST) return shm_fail(-errno, "%s: cannot create: %s", dir, strerror(errno));
    struct stat st;
    if (lstat(dir, &st) < 0) return shm_fail(-errno, "%s: %s", dir, strerror(errno));
    if (S_ISLNK(st.st_mode) && stat(dir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid())
        return 0; /* a link the user made to a directory of theirs */
    if (!S_ISDIR(st.st_mode)) return shm_fail(-ENOTDIR, "%s: not a directory", dir);
    if (st.st_uid != geteuid())
        return shm_fail(-EPERM, "%s: owned by user %u, not by this user (%u): refused", dir,
                        (unsigned)st.st_uid, (unsigned)geteuid());
    if (st.st_mode & S_IWOTH)
        return shm_fail(-EPERM, "%s: writable by any user (mode %03o): refused", dir,
                        (unsigned)(st.st_mode & 0777));
    return 0;
}

/* Removes the environment files (kg-*.mdb and their locks) of an lmdb
 * arena's directory. */
static void clear_lmdb_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        bool env = strncmp(e->d_name, "kg-", 3) == 0 &&
                   ((n > 4 && strcmp(e->d_name + n - 4, ".mdb") == 0) ||
                    (n > 9 && strcmp(e->d_name + n - 9, ".mdb-lock") == 0));
        if (env) unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
}

STASH_API int stash_arena_create(const char *name, const stash_arena_opts *opts, stash_arena **out)
{
    shm_clear_error();
    if (!out) return shm_refuse_null(__func__, "out");
    char path[256];
    int rc = shm_arena_path(name, opts, path, sizeof path);
    if (rc) return rc;
    uint64_t size = opts && opts->size ? opts->size : SHM_DEFAULT_SIZE;
    uint32_t maxp =
        opts && opts->max_parallelism ? opts->max_parallelism : STASH_DEFAULT_MAX_PARALLELISM;
    uint32_t flags = opts ? opts->flags : 0;
    if (maxp > STASH_MAX_MAX_PARALLELISM)
        return shm_fail(-EINVAL, "max parallelism %u above %u", maxp, STASH_MAX_MAX_PARALLELISM);
    if (size < SHM_MIN_SIZE || size > SHM_MAX_ARENA_SIZE)
        return shm_fail(-EINVAL, "arena size %llu outside %llu .. %llu", (unsigned long long)size,
                        (unsigned long long)SHM_MIN_SIZE, (unsigned long long)SHM_MAX_ARENA_SIZE);

    stash_backend backend = opts ? opts->backend : STASH_BACKEND_HEAP;
    char lmdb_dir[SHM_LMDB_DIR] = "";
    if (backend != STASH_BACKEND_HEAP && backend != STASH_BACKEND_LMDB)
        return shm_fail(-EINVAL, "unknown backend %d", (int)backend);
    if (backend == STASH_BACKEND_LMDB) {
        int n = opts->lmdb_dir
                    ? snprintf(lmdb_dir, sizeof lmdb_dir, "%s", opts->lmdb_dir)
                    : snprintf(lmdb_dir, sizeof lmdb_dir, "/var/tmp/stash.%s.lmdb", name);
        if (n < 0 || (size_t)n >= sizeof lmdb_dir)
            return shm_fail(-ENAMETOOLONG, "an lmdb directory of at most %u bytes",
                            SHM_LMDB_DIR - 1);
        int err = shm_own_dir(lmdb_dir, 0700);
        if (err) return err;
    }

    int fd =
        open_exclusive(path, flags & STASH_ARENA_GROUP ? 0660 : 0600, flags & STASH_ARENA_REPLACE);
    if (fd < 0) return fd;
    /* A new arena starts empty: environments an earlier one left go. */
    if (backend == STASH_BACKEND_LMDB) clear_lmdb_dir(lmdb_dir);

    struct statfs fs;
    bool hugetlbfs = fstatfs(fd, &fs) == 0 && fs.f_type == HUGETLBFS_MAGIC_NUMBER;
    uint32_t page = hugetlbfs ? (uint32_t)fs.f_bsize : (uint32_t)sysconf(_SC_PAGESIZE);
    size = align_up(size, page);

    shm_header plan = {0};
    if (plan_layout(&plan, size, maxp, page) < 0) {
        rc = shm_fail(-EINVAL, "%s: %llu bytes cannot hold %u key groups and one span", path,
                      (unsigned long long)size, maxp);
        goto fail_unlink;
    }
    /* Reserve the memory now: a full tmpfs must fail here, not as SIGBUS later. */
    if (ftruncate(fd, (off_t)size) < 0) {
        rc = shm_fail(-errno, "%s: cannot size to %llu bytes: %s", path, (unsigned long long)size,
                      strerror(errno));
        goto fail_unlink;
    }
    int err = posix_fallocate(fd, 0, (off_t)size);
    if (err && err != EOPNOTSUPP && err != EINVAL) {
        rc = shm_fail(-err, "%s: cannot reserve %llu bytes: %s", path, (unsigned long long)size,
                      strerror(err));
        goto fail_unlink;
    }
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = shm_fail(-errno, "%s: cannot map: %s", path, strerror(errno));
        goto fail_unlink;
    }
    close(fd);

    stash_arena *a = calloc(1, sizeof *a);
    if (!a) {
        munmap(base, size);
        unlink(path);
        return shm_fail(-ENOMEM, "out of memory");
    }
    memcpy(base, &plan, sizeof plan);
    plan.arena_size = size;
    bind_handle(a, base, &plan, path);
    write_header(a, size, maxp, page, advise_huge_pages(base, size, hugetlbfs));
    a->hdr->backend = (uint32_t)backend;
    memcpy(a->hdr->lmdb_dir, lmdb_dir, sizeof lmdb_dir);
    atomic_store_explicit(&a->hdr->initialized, SHM_INIT_MARK, memory_order_release);
    *out = a;
    return 0;

fail_unlink:
    close(fd);
    unlink(path);
    return rc;
}

/* Checks a header read from path against the file's real size. */
static int validate_header(const shm_header *h, ssize_t got, uint64_t file_size, const char *path)
{
    if (got < (ssize_t)sizeof h->magic || memcmp(h->magic, SHM_MAGIC, sizeof h->magic) != 0)
        return shm_fail(STASH_ENOTARENA, "%s: no arena magic at offset 0", path);
    if (got < (ssize_t)sizeof *h)
        return shm_fail(STASH_ETRUNCATED, "%s: %llu bytes, shorter than the arena header", path,
                        (unsigned long long)file_size);
    if (h->layout_version != SHM_LAYOUT_VERSION)
        return shm_fail(STASH_EVERSION, "%s: layout version %u, this build reads %u", path,
                        h->layout_version, SHM_LAYOUT_VERSION);
    if (atomic_load_explicit(&h->initialized, memory_order_acquire) != SHM_INIT_MARK)
        return shm_fail(STASH_EINCOMPLETE, "%s: creation never finished (pid %d)", path,
                        h->creator_pid);
    if (h->arena_size > file_size)
        return shm_fail(STASH_ETRUNCATED, "%s: %llu bytes, the header says %llu", path,
                        (unsigned long long)file_size, (unsigned long long)h->arena_size);
    if (h->header_size != SHM_HEADER_SIZE || h->span_size != SHM_SPAN_SIZE ||
        h->max_parallelism == 0 || h->max_parallelism > STASH_MAX_MAX_PARALLELISM ||
        h->data_off + (h->nspans << SHM_SPAN_SHIFT) > h->arena_size ||
        h->spans_desc_off + h->nspans * sizeof(shm_span) > h->data_off)
        return shm_fail(STASH_ENOTARENA,
                        "%s: header fields out of range (header %u bytes, spans of %u bytes, %u "
                        "key groups, %llu spans from offset %llu)",
                        path, h->header_size, h->span_size, h->max_parallelism,
                        (unsigned long long)h->nspans, (unsigned long long)h->data_off);
    /* Every part where its size, key groups and page size put it. */
    shm_header plan = {0};
    if (h->page_size == 0 || (h->page_size & (h->page_size - 1)) ||
        plan_layout(&plan, h->arena_size, h->max_parallelism, h->page_size) < 0 ||
        plan.registry_off != h->registry_off || plan.catalog_off != h->catalog_off ||
        plan.heaps_off != h->heaps_off || plan.tables_off != h->tables_off ||
        plan.control_off != h->control_off || plan.spans_desc_off != h->spans_desc_off ||
        plan.data_off != h->data_off || plan.nspans != h->nspans)
        return shm_fail(STASH_ENOTARENA,
                        "%s: the header places the arena's parts where %llu bytes, %u key groups "
                        "and %u-byte pages do not",
                        path, (unsigned long long)h->arena_size, h->max_parallelism, h->page_size);
    return 0;
}

/* Whether gid is one of this process's groups. */
static bool in_my_groups(gid_t gid)
{
    if (gid == getegid()) return true;
    gid_t groups[256];
    int n = getgroups(256, groups);
    for (int i = 0; i < n; i++)
        if (groups[i] == gid) return true;
    return false;
}

/* An arena may be mapped by its owner, and by the members of its group
 * where its mode shares it with them (created with STASH_ARENA_GROUP):
 * a file another user made under an arena's name is refused, since mapping
 * it would hand that user every process that attaches. */
static int check_owner(const struct stat *st, const char *path)
{
    if (st->st_uid == geteuid()) return 0;
    if ((st->st_mode & (S_IRGRP | S_IWGRP)) == (S_IRGRP | S_IWGRP) && in_my_groups(st->st_gid))
        return 0;
    return shm_fail(-EPERM,
                    "%s: owned by user %u and not shared with a group of this user (%u): refused",
                    path, (unsigned)st->st_uid, (unsigned)geteuid());
}

STASH_API int stash_arena_open(const char *name, const stash_arena_opts *opts, stash_arena **out)
{
    shm_clear_error();
    if (!out) return shm_refuse_null(__func__, "out");
    char path[256];
    int rc = shm_arena_path(name, opts, path, sizeof path);
    if (rc) return rc;
    /* Non-blocking: a FIFO in the arena's place must not hang the open. */
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return shm_fail(-errno, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = shm_fail(-errno, "%s: cannot stat: %s", path, strerror(errno));
        goto out_close;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = shm_fail(STASH_ENOTARENA, "%s: not a regular file", path);
        goto out_close;
    }
    rc = check_owner(&st, path);
    if (rc) goto out_close;
    if (st.st_size == 0) {
        rc = shm_fail(STASH_EINCOMPLETE, "%s: empty file: creation never finished", path);
        goto out_close;
    }
    shm_header h;
    memset(&h, 0, sizeof h);
    ssize_t got = pread(fd, &h, sizeof h, 0);
    if (got < 0) {
        rc = shm_fail(-errno, "%s: cannot read the header: %s", path, strerror(errno));
        goto out_close;
    }
    rc = validate_header(&h, got, (uint64_t)st.st_size, path);
    if (rc) goto out_close;
    void *base = mmap(NULL, h.arena_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = shm_fail(-errno, "%s: cannot map: %s", path, strerror(errno));
        goto out_close;
    }
    close(fd);
    stash_arena *a = calloc(1, sizeof *a);
    if (!a) {
        munmap(base, h.arena_size);
        return shm_fail(-ENOMEM, "out of memory");
    }
    /* From the header as checked: a writer changing it meanwhile moves nothing. */
    bind_handle(a, base, &h, path);
    if ((rc = shm_check_attach(a)) != 0) {
        stash_arena_close(a);
        return rc;
    }
    if (h.huge_pages == 2) madvise(base, h.arena_size, MADV_HUGEPAGE);
    *out = a;
    return 0;

out_close:
    close(fd);
    return rc;
}

STASH_API void stash_arena_close(stash_arena *arena)
{
    if (!arena) return;
    munmap(arena->base, arena->size);
    free(arena);
}

/* Removes the arena file at path with its lmdb environments. Only an arena
 * is removed, or what a creation that stopped before the header left (an
 * empty file, zeros where the magic goes): any other file is refused. */
static int remove_arena_file(const char *path)
{
    shm_header h;
    memset(&h, 0, sizeof h);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return shm_fail(-errno, "%s: cannot remove: %s", path, strerror(errno));
    struct stat st;
    ssize_t got = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? pread(fd, &h, sizeof h, 0) : -1;
    close(fd);
    static const char zeros[sizeof h.magic];
    bool arena = got >= (ssize_t)sizeof h.magic && memcmp(h.magic, SHM_MAGIC, sizeof h.magic) == 0;
    bool unfinished =
        got == 0 || (got >= (ssize_t)sizeof h.magic && memcmp(h.magic, zeros, sizeof h.magic) == 0);
    if (!arena && !unfinished)
        return shm_fail(STASH_ENOTARENA,
                        "%s: not a stash arena (no magic at offset 0): not removed", path);
    if (arena && got == (ssize_t)sizeof h && h.backend == STASH_BACKEND_LMDB) {
        h.lmdb_dir[sizeof h.lmdb_dir - 1] = 0;
        clear_lmdb_dir(h.lmdb_dir);
        rmdir(h.lmdb_dir);
    }
    if (unlink(path) < 0) return shm_fail(-errno, "%s: cannot remove: %s", path, strerror(errno));
    return 0;
}

STASH_API int stash_arena_destroy(const char *name, const stash_arena_opts *opts)
{
    shm_clear_error();
    char path[256], restoring[300];
    int rc = shm_arena_path(name, opts, path, sizeof path);
    if (rc) return rc;
    /* A service killed while it restored left the arena it was filling. */
    snprintf(restoring, sizeof restoring, "%s.restoring", path);
    bool left = access(restoring, F_OK) == 0;
    int rrc = left ? remove_arena_file(restoring) : 0;
    rc = remove_arena_file(path);
    if (rc == -ENOENT && left) rc = 0; /* what was left of it is gone */
    return rc ? rc : rrc;
}

STASH_API int stash_arena_info_get(const stash_arena *arena, stash_arena_info *out)
{
    if (!arena || !out) return shm_refuse_null(__func__, "arena or out");
    const shm_header *h = arena->hdr;
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "%s", arena->path);
    out->layout_version = h->layout_version;
    out->page_size = h->page_size;
    out->size = h->arena_size;
    out->data_bytes = h->nspans << SHM_SPAN_SHIFT;
    out->pool_free_bytes = atomic_load_explicit(&h->pool_free_spans, memory_order_relaxed)
                           << SHM_SPAN_SHIFT;
    out->max_parallelism = h->max_parallelism;
    out->creator_pid = h->creator_pid;
    out->created_ns = h->created_ns;
    out->huge_pages = (int)h->huge_pages;
    out->backend = (stash_backend)h->backend;
    snprintf(out->lmdb_dir, sizeof out->lmdb_dir, "%s", h->lmdb_dir);
    return 0;
}

STASH_API int stash_kg_usage_get(const stash_arena *arena, uint32_t kg, stash_kg_usage *out)
{
    if (!arena || !out) return shm_refuse_null(__func__, "arena or out");
    if (kg >= arena->hdr->max_parallelism)
        return shm_fail(-EINVAL, "key group %u out of range 0..%u", kg,
                        arena->hdr->max_parallelism - 1);
    const shm_kg_heap *heap = &arena->heaps[kg];
    out->used_bytes = atomic_load_explicit(&heap->used_bytes, memory_order_relaxed);
    out->free_bytes = atomic_load_explicit(&heap->free_bytes, memory_order_relaxed);
    return 0;
}
