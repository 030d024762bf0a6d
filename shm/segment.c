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
#define _GNU_SOURCE /* O_TMPFILE, AT_EMPTY_PATH, memfd_create */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
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
    /* Absolute: the lmdb directory's mark names it for every process. */
    if (opts && opts->path) return shm_path_absolute(opts->path, path, len);
    int n = snprintf(path, len, "/dev/shm/stash.%s", name);
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

/* The directory an arena's file lies in, opened as how asks, and the
 * file's name in it. */
static int arena_place(const char *path, unsigned how, shm_dir *d, char *base)
{
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (!*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || strlen(name) > 255)
        return shm_fail(-EINVAL, "%s: names no file", path);
    snprintf(base, 256, "%s", name);
    char dir[256];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    return shm_dir_open(slash == path ? "/" : dir, how, d);
}

/* Checks that what fd opened is an arena this user may remove or replace:
 * a regular file of this user's with the arena magic. */
static int check_removable(int fd, const char *path, struct stat *st, shm_header *h, ssize_t *got)
{
    if (fstat(fd, st) < 0) return shm_fail(-errno, "%s: %s", path, strerror(errno));
    if (!S_ISREG(st->st_mode)) return shm_fail(STASH_ENOTARENA, "%s: not a regular file", path);
    if (st->st_uid != geteuid())
        return shm_fail(-EPERM, "%s: owned by user %u, not by this user (%u): not removed", path,
                        (unsigned)st->st_uid, (unsigned)geteuid());
    memset(h, 0, sizeof *h);
    *got = pread(fd, h, sizeof *h, 0);
    if (*got < (ssize_t)sizeof h->magic || memcmp(h->magic, SHM_MAGIC, sizeof h->magic) != 0)
        return shm_fail(STASH_ENOTARENA,
                        "%s: not a stash arena (no magic at offset 0): not removed", path);
    return 0;
}

/* Opens base in d without following a link, as a file to read. */
static int open_entry(const shm_dir *d, const char *base, const char *path, int flags)
{
    int fd = openat(d->fd, base, flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0 && errno == ELOOP)
        return shm_fail(STASH_ENOTARENA, "%s: a symbolic link, not an arena: refused", path);
    /* Another user's file this one may not read: say whose it is. */
    struct stat st;
    if (fd < 0 && errno == EACCES && fstatat(d->fd, base, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        st.st_uid != geteuid())
        return shm_fail(-EACCES, "%s: owned by user %u, not by this user (%u): refused", path,
                        (unsigned)st.st_uid, (unsigned)geteuid());
    if (fd < 0) return shm_fail(-errno, "%s: cannot open: %s", path, strerror(errno));
    return fd;
}

/* Removes the arena file base of d, once checked (removable, and still the
 * entry that was checked); h gets its header. */
static int unlink_arena(const shm_dir *d, const char *base, const char *path, shm_header *h,
                        ssize_t *got)
{
    int fd = open_entry(d, base, path, O_RDONLY);
    if (fd < 0) return fd;
    struct stat st, now;
    int rc = check_removable(fd, path, &st, h, got);
    close(fd);
    if (rc) return rc;
    if (fstatat(d->fd, base, &now, AT_SYMLINK_NOFOLLOW) < 0 || now.st_ino != st.st_ino ||
        now.st_dev != st.st_dev)
        return shm_fail(-EAGAIN, "%s: replaced while it was checked: not removed", path);
    if (unlinkat(d->fd, base, 0) < 0)
        return shm_fail(-errno, "%s: cannot remove: %s", path, strerror(errno));
    return 0;
}

/* Makes the file of a new arena: without a name (O_TMPFILE) where the
 * filesystem allows, so that a creator that dies leaves nothing and no one
 * opens it half-made; else exclusively under its name (hugetlbfs), its
 * header marking it unfinished until creation ends. */
static int make_file(const shm_dir *d, const char *base, const char *path, mode_t mode,
                     bool replace, bool *named)
{
    *named = false;
    int fd = openat(d->fd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, mode);
    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR)) {
        *named = true;
        shm_header h;
        ssize_t got;
        int rc = replace ? unlink_arena(d, base, path, &h, &got) : 0;
        if (rc && rc != -ENOENT) return rc;
        fd = openat(d->fd, base, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        if (fd < 0 && errno == EEXIST)
            return shm_fail(-EEXIST, "%s: exists (replace it explicitly to recreate)", path);
    }
    if (fd < 0) return shm_fail(-errno, "%s: cannot create: %s", path, strerror(errno));
    /* The umask must not narrow the mode the caller asked for. */
    if (fchmod(fd, mode) < 0) {
        int err = errno;
        close(fd);
        if (*named) unlinkat(d->fd, base, 0);
        return shm_fail(-err, "%s: cannot set mode: %s", path, strerror(err));
    }
    return fd;
}

/* Gives the unnamed file fd the name base in d: never over another file,
 * unless replace and it is an arena of this user's. */
static int link_file(const shm_dir *d, const char *base, int fd, const char *path, bool replace)
{
    for (int tries = 0;; tries++) {
        int rc = linkat(fd, "", d->fd, base, AT_EMPTY_PATH);
        if (rc < 0 && errno == ENOENT) {
            /* Without CAP_DAC_READ_SEARCH: the same file through /proc. */
            char self[64];
            snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
            rc = linkat(AT_FDCWD, self, d->fd, base, AT_SYMLINK_FOLLOW);
        }
        if (rc == 0) return 0;
        if (errno != EEXIST) return shm_fail(-errno, "%s: cannot name: %s", path, strerror(errno));
        if (!replace || tries > 0)
            return shm_fail(-EEXIST, "%s: exists (replace it explicitly to recreate)", path);
        shm_header h;
        ssize_t got;
        rc = unlink_arena(d, base, path, &h, &got);
        if (rc && rc != -ENOENT) return rc;
    }
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

/* Removes the environment files (kg-*.mdb and their locks) of an lmdb
 * arena's directory, opened and checked as this user's own. */
static void clear_lmdb_dir(const shm_dir *d)
{
    int fd = openat(d->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        if (fd >= 0) close(fd);
        return;
    }
    for (struct dirent *e; (e = readdir(dir));) {
        size_t n = strlen(e->d_name);
        bool env = strncmp(e->d_name, "kg-", 3) == 0 &&
                   ((n > 4 && strcmp(e->d_name + n - 4, ".mdb") == 0) ||
                    (n > 9 && strcmp(e->d_name + n - 9, ".mdb-lock") == 0));
        if (env) unlinkat(d->fd, e->d_name, 0);
    }
    closedir(dir);
}

/* An lmdb directory's mark: the path of the arena whose environments it
 * holds, so that neither another arena's creation nor a destroy that read
 * another directory from a changed header clears it. */
#define LMDB_MARK "arena"

static bool lmdb_mark_read(const shm_dir *d, char *out, size_t cap)
{
    int fd = openat(d->fd, LMDB_MARK, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, out, cap - 1);
    close(fd);
    if (n <= 0 || out[n - 1] != '\n') return false;
    out[n - 1] = 0;
    return true;
}

static int lmdb_mark_write(const shm_dir *d, const char *path)
{
    char tmp[64];
    snprintf(tmp, sizeof tmp, ".%s.%d", LMDB_MARK, (int)getpid());
    unlinkat(d->fd, tmp, 0);
    int fd = openat(d->fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return shm_fail(-errno, "%s/%s: %s", d->path, tmp, strerror(errno));
    size_t n = strlen(path);
    bool ok = write(fd, path, n) == (ssize_t)n && write(fd, "\n", 1) == 1;
    close(fd);
    if (ok && renameat(d->fd, tmp, d->fd, LMDB_MARK) == 0) return 0;
    int err = ok ? -errno : -EIO;
    unlinkat(d->fd, tmp, 0);
    return shm_fail(err, "%s/%s: cannot write: %s", d->path, LMDB_MARK, strerror(-err));
}

/* Whether the lmdb directory d may hold the environments of the arena at
 * path: it holds none, or its mark names path, or the arena it names is
 * gone. */
static int lmdb_dir_free_for(const shm_dir *d, const char *path)
{
    char mark[300];
    if (!lmdb_mark_read(d, mark, sizeof mark) || strcmp(mark, path) == 0) return 0;
    struct stat st;
    if (stat(mark, &st) < 0 && errno == ENOENT) return 0;
    return shm_fail(-EBUSY, "%s: the lmdb directory of the arena %s: refused", d->path, mark);
}

/* What a new arena is made of, its options checked. */
typedef struct arena_plan {
    uint64_t size;
    uint32_t maxp;
    uint32_t flags;
    stash_backend backend;
} arena_plan;

static int plan_of(const stash_arena_opts *opts, arena_plan *p)
{
    p->size = opts && opts->size ? opts->size : SHM_DEFAULT_SIZE;
    p->maxp = opts && opts->max_parallelism ? opts->max_parallelism : STASH_DEFAULT_MAX_PARALLELISM;
    p->flags = opts ? opts->flags : 0;
    p->backend = opts ? opts->backend : STASH_BACKEND_HEAP;
    if (p->maxp > STASH_MAX_MAX_PARALLELISM)
        return shm_fail(-EINVAL, "max parallelism %u above %u", p->maxp, STASH_MAX_MAX_PARALLELISM);
    if (p->size < SHM_MIN_SIZE || p->size > SHM_MAX_ARENA_SIZE)
        return shm_fail(-EINVAL, "arena size %llu outside %llu .. %llu",
                        (unsigned long long)p->size, (unsigned long long)SHM_MIN_SIZE,
                        (unsigned long long)SHM_MAX_ARENA_SIZE);
    if (p->backend != STASH_BACKEND_HEAP && p->backend != STASH_BACKEND_LMDB)
        return shm_fail(-EINVAL, "unknown backend %d", (int)p->backend);
    return 0;
}

/* Sizes, maps and initializes the new arena file fd (the caller keeps it) as plan
 * says; the handle's path is path. */
static int build(int fd, const char *path, arena_plan *p, stash_arena **out)
{
    struct statfs fs;
    bool hugetlbfs = fstatfs(fd, &fs) == 0 && fs.f_type == HUGETLBFS_MAGIC_NUMBER;
    uint32_t page = hugetlbfs ? (uint32_t)fs.f_bsize : (uint32_t)sysconf(_SC_PAGESIZE);
    uint64_t size = align_up(p->size, page);
    shm_header plan = {0};
    if (plan_layout(&plan, size, p->maxp, page) < 0)
        return shm_fail(-EINVAL, "%s: %llu bytes cannot hold %u key groups and one span", path,
                        (unsigned long long)size, p->maxp);
    /* Reserve the memory now: a full tmpfs must fail here, not as SIGBUS later. */
    if (ftruncate(fd, (off_t)size) < 0)
        return shm_fail(-errno, "%s: cannot size to %llu bytes: %s", path, (unsigned long long)size,
                        strerror(errno));
    int err = posix_fallocate(fd, 0, (off_t)size);
    if (err && err != EOPNOTSUPP && err != EINVAL)
        return shm_fail(-err, "%s: cannot reserve %llu bytes: %s", path, (unsigned long long)size,
                        strerror(err));
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return shm_fail(-errno, "%s: cannot map: %s", path, strerror(errno));
    stash_arena *a = calloc(1, sizeof *a);
    if (!a) {
        munmap(base, size);
        return shm_fail(-ENOMEM, "out of memory");
    }
    memcpy(base, &plan, sizeof plan);
    plan.arena_size = size;
    bind_handle(a, base, &plan, path);
    a->unnamed_fd = a->lmdb_lock = -1;
    a->owner = geteuid();
    write_header(a, size, p->maxp, page, advise_huge_pages(base, size, hugetlbfs));
    a->hdr->backend = (uint32_t)p->backend;
    atomic_store_explicit(&a->hdr->initialized, SHM_INIT_MARK, memory_order_release);
    *out = a;
    return 0;
}

/* The lmdb directory of a new arena: opts->lmdb_dir, or NAME.lmdb in this
 * user's private state directory; made if missing, this user's own, and
 * locked until the arena is named, so that two creators never clear it
 * under each other. Its path goes into dir. */
static int take_lmdb_dir(const char *name, const stash_arena_opts *opts, char *dir, shm_dir *d)
{
    int rc = 0;
    if (opts->lmdb_dir) {
        /* Absolute: every process of the arena opens it from the header. */
        rc = shm_path_absolute(opts->lmdb_dir, dir, SHM_LMDB_DIR);
    } else {
        char leaf[128];
        snprintf(leaf, sizeof leaf, "%s.lmdb", name);
        rc = shm_private_path(SHM_PRIVATE_STATE, leaf, dir, SHM_LMDB_DIR);
    }
    if (rc == 0) rc = shm_dir_open(dir, SHM_DIR_OWN | SHM_DIR_CREATE, d);
    if (rc == 0 && flock(d->fd, LOCK_EX | LOCK_NB) < 0) {
        rc = shm_fail(-EBUSY, "%s: another arena is being created with this lmdb directory", dir);
        shm_dir_close(d);
    }
    return rc;
}

int shm_arena_make(const char *name, const stash_arena_opts *opts, stash_arena **out)
{
    char path[256], base[256], lmdb_dir[SHM_LMDB_DIR] = "";
    arena_plan p;
    *out = NULL;
    int rc = shm_arena_path(name, opts, path, sizeof path);
    if (rc == 0) rc = plan_of(opts, &p);
    if (rc) return rc;
    shm_dir d, env = {.fd = -1};
    if ((rc = arena_place(path, SHM_DIR_PLACE, &d, base)) != 0) return rc;
    if (p.backend == STASH_BACKEND_LMDB) rc = take_lmdb_dir(name, opts, lmdb_dir, &env);
    if (rc == 0 && env.fd >= 0) rc = lmdb_dir_free_for(&env, path);
    /* Taken already: nothing of it (its lmdb environments) may be cleared. */
    struct stat st;
    if (rc == 0 && !(p.flags & STASH_ARENA_REPLACE) &&
        fstatat(d.fd, base, &st, AT_SYMLINK_NOFOLLOW) == 0)
        rc = shm_fail(-EEXIST, "%s: exists (replace it explicitly to recreate)", path);
    bool named = false;
    int fd = rc ? rc
                : make_file(&d, base, path, p.flags & STASH_ARENA_GROUP ? 0660 : 0600,
                            p.flags & STASH_ARENA_REPLACE, &named);
    if (fd < 0) {
        shm_dir_close(&env);
        shm_dir_close(&d);
        return fd;
    }
    /* A new arena starts empty: environments an earlier one left go. */
    if (p.backend == STASH_BACKEND_LMDB) {
        clear_lmdb_dir(&env);
        rc = lmdb_mark_write(&env, path);
    }
    if (rc == 0) rc = build(fd, path, &p, out);
    if (rc == 0) {
        memcpy((*out)->hdr->lmdb_dir, lmdb_dir, sizeof lmdb_dir);
        (*out)->lmdb_lock = env.fd;
        env.fd = -1;
        /* Kept until shm_arena_publish names it. */
        if (!named) (*out)->unnamed_fd = fd;
    }
    if (rc || named) close(fd);
    if (rc && named) unlinkat(d.fd, base, 0);
    shm_dir_close(&env);
    shm_dir_close(&d);
    return rc;
}

int shm_arena_publish(stash_arena *a, const stash_arena_opts *opts)
{
    int rc = 0;
    if (a->unnamed_fd >= 0) {
        shm_dir d;
        char base[256];
        rc = arena_place(a->path, SHM_DIR_PLACE, &d, base);
        if (rc == 0) {
            rc = link_file(&d, base, a->unnamed_fd, a->path,
                           opts && (opts->flags & STASH_ARENA_REPLACE));
            shm_dir_close(&d);
        }
        if (rc == 0) {
            close(a->unnamed_fd);
            a->unnamed_fd = -1;
        }
    }
    if (rc == 0 && a->lmdb_lock >= 0) {
        close(a->lmdb_lock);
        a->lmdb_lock = -1;
    }
    return rc;
}

int shm_arena_make_private(const char *label, const stash_arena_opts *opts, stash_arena **out)
{
    arena_plan p;
    int rc = plan_of(opts, &p);
    if (rc) return rc;
    if (p.backend != STASH_BACKEND_HEAP)
        return shm_fail(-EINVAL, "%s: a private arena keeps its state in the heap store", label);
    int fd = memfd_create("stash", MFD_CLOEXEC);
    if (fd < 0) return shm_fail(-errno, "%s: no memory file: %s", label, strerror(errno));
    rc = build(fd, label, &p, out);
    close(fd);
    return rc;
}

STASH_API int stash_arena_create(const char *name, const stash_arena_opts *opts, stash_arena **out)
{
    shm_clear_error();
    if (!out) return shm_refuse_null(__func__, "out");
    stash_arena_opts o;
    int rc = SHM_TAKE_OPTS(__func__, stash_arena_opts, opts, &o);
    if (rc) return rc;
    rc = shm_arena_make(name, &o, out);
    if (rc == 0 && (rc = shm_arena_publish(*out, &o)) != 0) {
        stash_arena_close(*out);
        *out = NULL;
    }
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
    stash_arena_opts o;
    int rc = SHM_TAKE_OPTS(__func__, stash_arena_opts, opts, &o);
    if (rc) return rc;
    char path[256];
    if ((rc = shm_arena_path(name, &o, path, sizeof path)) != 0) return rc;
    /* The file itself, never a link's target; non-blocking: a FIFO in the
     * arena's place must not hang the open. */
    shm_dir d;
    char file[256];
    if ((rc = arena_place(path, 0, &d, file)) != 0) return rc;
    int fd = open_entry(&d, file, path, O_RDWR);
    shm_dir_close(&d);
    if (fd < 0) return fd;
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
    a->unnamed_fd = a->lmdb_lock = -1;
    a->owner = st.st_uid;
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
    if (arena->unnamed_fd >= 0) close(arena->unnamed_fd);
    if (arena->lmdb_lock >= 0) close(arena->lmdb_lock);
    free(arena);
}

/* Removes an arena's lmdb directory, dir (read from its header), with the
 * environments in it: only a directory of this user's that the arena at
 * path made (its mark names path), never through a link. */
static void remove_lmdb_dir(const char *dir, const char *path)
{
    shm_dir parent, env;
    char leaf[256];
    if (arena_place(dir, SHM_DIR_PLACE, &parent, leaf) != 0) return;
    if (shm_dir_openat(&parent, leaf, SHM_DIR_OWN, &env) == 0) {
        char mark[300];
        if (lmdb_mark_read(&env, mark, sizeof mark) && strcmp(mark, path) == 0) {
            clear_lmdb_dir(&env);
            unlinkat(env.fd, LMDB_MARK, 0);
            shm_dir_close(&env);
            unlinkat(parent.fd, leaf, AT_REMOVEDIR);
        }
        shm_dir_close(&env);
    }
    shm_dir_close(&parent);
}

STASH_API int stash_arena_destroy(const char *name, const stash_arena_opts *opts)
{
    shm_clear_error();
    stash_arena_opts o;
    int rc = SHM_TAKE_OPTS(__func__, stash_arena_opts, opts, &o);
    if (rc) return rc;
    char path[256], base[256];
    if ((rc = shm_arena_path(name, &o, path, sizeof path)) != 0) return rc;
    shm_dir d;
    if ((rc = arena_place(path, SHM_DIR_PLACE, &d, base)) != 0) return rc;
    shm_header h;
    ssize_t got;
    rc = unlink_arena(&d, base, path, &h, &got);
    shm_dir_close(&d);
    if (rc == 0 && got == (ssize_t)sizeof h && h.backend == STASH_BACKEND_LMDB) {
        h.lmdb_dir[sizeof h.lmdb_dir - 1] = 0;
        remove_lmdb_dir(h.lmdb_dir, path);
    }
    return rc;
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
