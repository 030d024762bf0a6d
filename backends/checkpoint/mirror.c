/* SPDX-License-Identifier: MIT */
/*
 * mirror.c: a job's checkpoints in a remote storage (storage.h), mirrored
 * from and into a local checkpoint directory (Flink's checkpoints in a
 * distributed store, with a local copy for recovery), whatever the storage.
 * A file's name is its path in the directory under the job's prefix:
 * JOB/chk-ID/_metadata, JOB/chk-ID/kg-data.dat, JOB/shared/ID.dat,
 * JOB/savepoint-ID/... A checkpoint is in the storage once its metadata is
 * written and the pointer JOB/latest has been moved to its id from the id
 * it named before (a compare-and-swap); a savepoint once its metadata is
 * written.
 */
#define _GNU_SOURCE /* sync_file_range */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/checkpoint/ckpt.h"
#include "backends/checkpoint/mirror.h"

#define LATEST "latest"
#define CLAIM "_claim" /* JOB/chk-ID/_claim: the engine that writes chk-ID */

/* The object name of a file (as a checkpoint's metadata names it, or
 * "_metadata") of checkpoint directory dirname ("chk-12"). */
static int object_of(char *out, size_t cap, const char *job, const char *dirname, const char *file)
{
    bool shared = strncmp(file, CKPT_SHARED_DIR "/", sizeof CKPT_SHARED_DIR) == 0;
    int n = shared ? snprintf(out, cap, "%s/%s", job, file)
                   : snprintf(out, cap, "%s/%s/%s", job, dirname, file);
    return n > 0 && (size_t)n < cap ? 0 : shm_fail(-ENAMETOOLONG, "%s/%s: too long", job, file);
}

static bool has_file(ckpt_storage *st, const char *name)
{
    uint64_t len;
    return ckpt_storage_file_size(st, name, &len) == 0;
}

/* Copies data file cf of v into the objects of name. */
static int put_file(ckpt_storage *st, const char *name, ckpt_view *v, const ckpt_file *cf)
{
    int fd = ckpt_view_file_open(v, cf);
    if (fd < 0) return fd;
    struct stat sb;
    int rc = fstat(fd, &sb) < 0 ? shm_fail(-errno, "%s: %s", cf->path, strerror(errno))
                                : ckpt_storage_put_fd(st, name, fd, cf->path, (uint64_t)sb.st_size);
    close(fd);
    return rc;
}

static int copy_open(void *ctx, const char *file)
{
    ckpt_upload *u = ctx;
    char name[1024];
    snprintf(u->file, sizeof u->file, "%s", file);
    u->sent[0] = 0;
    int rc = object_of(name, sizeof name, u->job, u->dirname, file);
    if (rc == 0) rc = ckpt_storage_writer_open(u->st, name, &u->w);
    u->failed = rc != 0;
    return rc;
}

static int copy_put(void *ctx, const void *data, size_t len)
{
    ckpt_upload *u = ctx;
    int rc = ckpt_storage_writer_put(u->w, data, len);
    u->failed |= rc != 0;
    return rc;
}

static int copy_close(void *ctx, bool commit)
{
    ckpt_upload *u = ctx;
    int rc = ckpt_storage_writer_close(u->w, commit);
    u->w = NULL;
    if (rc == 0 && commit) snprintf(u->sent, sizeof u->sent, "%s", u->file);
    u->failed |= rc != 0;
    return rc;
}

int ckpt_upload_begin(ckpt_upload *u, ckpt_storage *st, const char *job, const char *dirname)
{
    *u = (ckpt_upload){.st = st, .job = job, .copy = {u, copy_open, copy_put, copy_close}};
    snprintf(u->dirname, sizeof u->dirname, "%s", dirname);
    char name[1024], owner[300], host[256] = "";
    /* The id is this engine's before anything of it is written: another
     * engine of the job that took the same id must not write over it. The
     * claim's value is this call's alone (two engines may share a process). */
    uint64_t nonce = 0;
    gethostname(host, sizeof host - 1);
    if (getrandom(&nonce, sizeof nonce, 0) != sizeof nonce) nonce = shm_clock_ns();
    snprintf(owner, sizeof owner, "%d@%s/%016llx", (int)getpid(), host, (unsigned long long)nonce);
    snprintf(name, sizeof name, "%s/%s/%s", job, dirname, CLAIM);
    int rc = ckpt_storage_swap(st, name, NULL, owner);
    if (rc == -ECANCELED)
        rc = shm_fail(rc, "%s/%s/%s: taken by another engine of the job", ckpt_storage_where(st),
                      job, dirname);
    return rc;
}

int ckpt_upload_finish(ckpt_upload *u, int dirfd, const char *path, uint64_t prev, ioe_engine *e)
{
    ckpt_storage *st = u->st;
    const char *job = u->job, *dirname = u->dirname;
    ckpt_storage_writer_close(u->w, false);
    u->w = NULL;
    ckpt_view v;
    int rc = ckpt_open_view_at(dirfd, dirname, path, e, &v, false);
    if (rc) return rc;
    bool checkpoint = strncmp(dirname, "chk-", 4) == 0;
    char name[1024];
    /* Data next: the metadata names only files that are there. */
    for (uint32_t f = 0; rc == 0 && f < v.nfiles; f++) {
        const ckpt_file *cf = &v.files[f];
        bool shared = strncmp(cf->name, CKPT_SHARED_DIR "/", sizeof CKPT_SHARED_DIR) == 0;
        if (strcmp(cf->name, u->sent) == 0) continue; /* it went up while written */
        rc = object_of(name, sizeof name, job, dirname, cf->name);
        /* A shared file went up with the checkpoint that wrote it. */
        if (rc == 0 && !(shared && f + 1 < v.nfiles && has_file(st, name)))
            rc = put_file(st, name, &v, cf);
    }
    if (rc == 0) rc = object_of(name, sizeof name, job, dirname, "_metadata");
    if (rc == 0) rc = ckpt_storage_write_file(st, name, v.md, v.md_len);
    if (rc == 0 && checkpoint) {
        char was[32], now[32];
        snprintf(was, sizeof was, "%llu", (unsigned long long)prev);
        snprintf(now, sizeof now, "%llu", (unsigned long long)v.id);
        snprintf(name, sizeof name, "%s/%s", job, LATEST);
        rc = ckpt_storage_swap(st, name, prev ? was : NULL, now);
    }
    ckpt_view_close(&v);
    return rc;
}

int ckpt_storage_upload(ckpt_storage *st, const char *job, int dirfd, const char *dirname,
                        const char *path, uint64_t prev, ioe_engine *e)
{
    ckpt_upload u;
    int rc = ckpt_upload_begin(&u, st, job, dirname);
    return rc ? rc : ckpt_upload_finish(&u, dirfd, path, prev, e);
}

int ckpt_storage_latest(ckpt_storage *st, const char *job, uint64_t *id)
{
    char name[1024], value[32];
    snprintf(name, sizeof name, "%s/%s", job, LATEST);
    int rc = ckpt_storage_pointer(st, name, value, sizeof value);
    if (rc) return rc;
    char *end;
    *id = strtoull(value, &end, 10);
    if (*end || !*id)
        return shm_fail(STASH_ECORRUPT, "%s/%s: '%s' names no checkpoint", ckpt_storage_where(st),
                        name, value);
    return 0;
}

/* A checkpoint read straight from the storage into memory, each file's
 * bytes arriving from the front, while its records go into an arena and a
 * thread writes its copy into a directory as they come. The copy is named
 * only once the restore has passed every check. */
typedef struct arrivals {
    ckpt_storage *st;
    const char *job;
    ckpt_view *v;
    const shm_dir *dir;
    ckpt_storage_reader *readers[CKPT_MAX_FILES];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int verdict; /* 0 while the restore goes on, 1 passed, -1 failed */
    pthread_t t;
    bool started;
    int rc;
    char why[512]; /* rc's message, made in the copy's thread */
} arrivals;

static int arrived(void *ctx, uint32_t f, uint64_t upto)
{
    arrivals *s = ctx;
    return ckpt_storage_reader_wait(s->readers[f], upto);
}

/* Writes n bytes at data to fd at off: 0 or an error naming path. */
static int write_at(int fd, const char *path, const uint8_t *data, size_t n, size_t off)
{
    for (size_t done = 0; done < n;) {
        ssize_t w = pwrite(fd, data + done, n - done, (off_t)(off + done));
        if (w < 0)
            return shm_fail(-errno, "write %s at offset %zu: %s", path, off + done,
                            strerror(errno));
        done += (size_t)w;
    }
    return 0;
}

/* Writes len bytes to the new file name of d and makes them durable; with
 * rd, each stretch once it has arrived. Bytes in memory aligned to a page
 * go to the disk straight from there (O_DIRECT, where the filesystem takes
 * it): no copy into the page cache, which costs the CPU a restore needs. */
static int write_new(const shm_dir *d, const char *name, const void *data, size_t len,
                     ckpt_storage_reader *rd)
{
    enum { STRETCH = 4u << 20 };
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char path[4096];
    if (ckpt_path_of(path, "%s/%s", d->path, name) < 0) return -ENAMETOOLONG;
    int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    bool direct = (uintptr_t)data % page == 0 && len >= STRETCH;
    int fd = openat(d->fd, name, flags | (direct ? O_DIRECT : 0), 0600);
    if (fd < 0 && direct && errno == EINVAL) {
        direct = false;
        fd = openat(d->fd, name, flags, 0600);
    }
    int rc = fd < 0 ? shm_fail(-errno, "%s: cannot create: %s", path, strerror(errno)) : 0;
    const uint8_t *p = data;
    for (size_t off = 0; rc == 0 && off < len;) {
        size_t upto = len - off < STRETCH ? len : off + STRETCH;
        if (rd && (rc = ckpt_storage_reader_wait(rd, upto)) != 0) break;
        size_t n = direct ? (upto - off) / page * page : upto - off;
        if (n) rc = write_at(fd, path, p + off, n, off);
        if (rc == 0 && n < upto - off) {
            /* The last bytes, less than a page: padded, then cut. */
            uint8_t *tail = aligned_alloc(page, page);
            if (!tail) rc = shm_fail(-ENOMEM, "out of memory");
            if (tail) {
                memset(tail, 0, page);
                memcpy(tail, p + off + n, upto - off - n);
                rc = write_at(fd, path, tail, page, off + n);
                free(tail);
            }
            if (rc == 0 && ftruncate(fd, (off_t)len) < 0)
                rc = shm_fail(-errno, "truncate %s: %s", path, strerror(errno));
        }
        /* Written back while the rest comes, so that the fsync at the end
         * has little left to wait for. */
        if (rc == 0 && !direct)
            sync_file_range(fd, (off_t)off, (off_t)(upto - off), SYNC_FILE_RANGE_WRITE);
        off = upto;
    }
    if (rc == 0 && fsync(fd) < 0) rc = shm_fail(-errno, "fsync %s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return rc;
}

/* Downloads the objects of name into the new file file of d, made durable. */
static int fetch_file(ckpt_storage *st, const char *name, const shm_dir *d, const char *file)
{
    char path[4096];
    if (ckpt_path_of(path, "%s/%s", d->path, file) < 0) return -ENAMETOOLONG;
    int fd = openat(d->fd, file, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return shm_fail(-errno, "%s: cannot create: %s", path, strerror(errno));
    uint64_t len;
    int rc = ckpt_storage_get_fd(st, name, fd, path, &len);
    if (rc == 0 && fsync(fd) < 0) rc = shm_fail(-errno, "fsync %s: %s", path, strerror(errno));
    close(fd);
    return rc;
}

/* Reads file cf of a view of storage ctx: its object is its path less the
 * storage's "SCHEME://CONTAINER/". */
static const char *object_of_path(ckpt_storage *st, const ckpt_file *cf)
{
    return cf->path + strlen(ckpt_storage_where(st)) + 1;
}

static int view_fetch(void *ctx, const ckpt_file *cf, size_t limit, uint8_t **data, size_t *len)
{
    ckpt_storage *st = ctx;
    return ckpt_storage_read_file(st, object_of_path(st, cf), limit, data, len);
}

int ckpt_storage_view(ckpt_storage *st, const char *job, const char *dirname, ckpt_view *v)
{
    char name[1024];
    memset(v, 0, sizeof *v);
    int rc = object_of(name, sizeof name, job, dirname, "_metadata");
    if (rc == 0) snprintf(v->meta_path, sizeof v->meta_path, "%s/%s", ckpt_storage_where(st), name);
    if (rc == 0) rc = ckpt_storage_read_file(st, name, CKPT_MAX_METADATA, &v->md, &v->md_len);
    if (rc == 0) rc = ckpt_view_parse(v);
    /* A directory named for an id holds that id's metadata. */
    char *end;
    const char *dash = strrchr(dirname, '-');
    uint64_t named = dash ? strtoull(dash + 1, &end, 10) : 0;
    if (rc == 0 && named && !*end && v->id != named)
        rc = shm_fail(STASH_ECORRUPT, "%s: names checkpoint %llu, not %llu", v->meta_path,
                      (unsigned long long)v->id, (unsigned long long)named);
    for (uint32_t f = 0; rc == 0 && f < v->nfiles; f++) {
        ckpt_file *cf = &v->files[f];
        rc = object_of(name, sizeof name, job, dirname, cf->name);
        if (rc == 0) rc = ckpt_path_of(cf->path, "%s/%s", ckpt_storage_where(st), name);
    }
    v->fetch = view_fetch;
    v->fetch_ctx = st;
    if (rc) ckpt_view_close(v);
    return rc;
}

/* Waits for the restore's verdict on what is arriving: 0 once it passed. */
static int verdict(arrivals *s)
{
    pthread_mutex_lock(&s->mu);
    while (!s->verdict) pthread_cond_wait(&s->cv, &s->mu);
    int passed = s->verdict > 0;
    pthread_mutex_unlock(&s->mu);
    return passed ? 0 : shm_fail(-ECANCELED, "%s: the restore failed", s->v->meta_path);
}

/* ckpt_storage_place, with s: the view's files arriving, written as they
 * come, and the checkpoint named only once the restore passed. */
static int place(ckpt_storage *st, const char *job, const ckpt_view *v, const shm_dir *dir,
                 const char *dirname, arrivals *s)
{
    /* Written beside the directory's checkpoints; each file moved into
     * place once whole, the checkpoint's directory last. */
    char name[1024], prefix[300];
    struct stat sb;
    snprintf(prefix, sizeof prefix, ".fetch-%s-", dirname);
    shm_dir stage, shared = {.fd = -1};
    int rc = shm_dir_temp(dir, prefix, &stage);
    if (rc) return rc;
    for (uint32_t f = 0; rc == 0 && f < v->nfiles; f++) {
        const ckpt_file *cf = &v->files[f];
        bool in_shared = strncmp(cf->name, CKPT_SHARED_DIR "/", sizeof CKPT_SHARED_DIR) == 0;
        const char *base = in_shared ? cf->name + sizeof CKPT_SHARED_DIR : cf->name;
        if (in_shared && shared.fd < 0)
            rc = shm_dir_openat(dir, CKPT_SHARED_DIR, SHM_DIR_OWN | SHM_DIR_CREATE | SHM_DIR_GROUP,
                                &shared);
        if (rc == 0) rc = object_of(name, sizeof name, job, dirname, cf->name);
        /* A chain's file fetched with an earlier checkpoint is kept, but
         * for bytes a restore checked, which replace it (it may be what
         * made the directory's copy fail). */
        if (rc == 0 && in_shared && !s && fstatat(shared.fd, base, &sb, AT_SYMLINK_NOFOLLOW) == 0)
            continue;
        if (rc == 0)
            rc = cf->data ? write_new(&stage, base, cf->data, cf->len, s ? s->readers[f] : NULL)
                          : fetch_file(st, name, &stage, base);
        /* A shared file goes in only with a checkpoint that passed. */
        if (rc == 0 && in_shared && s) rc = verdict(s);
        if (rc == 0 && in_shared && renameat(stage.fd, base, shared.fd, base) < 0)
            rc = shm_fail(-errno, "rename %s/%s to %s/%s: %s", stage.path, base, shared.path, base,
                          strerror(errno));
    }
    if (rc == 0) rc = write_new(&stage, "_metadata", v->md, v->md_len, NULL);
    if (rc == 0 && s) rc = verdict(s);
    const char *made = strrchr(stage.path, '/') + 1;
    if (rc == 0 && renameat(dir->fd, made, dir->fd, dirname) < 0)
        rc = shm_fail(-errno, "rename %s to %s/%s: %s", stage.path, dir->path, dirname,
                      strerror(errno));
    if (rc)
        shm_dir_temp_remove(dir, &stage);
    else
        shm_dir_close(&stage);
    shm_dir_close(&shared);
    return rc;
}

int ckpt_storage_place(ckpt_storage *st, const char *job, const ckpt_view *v, const shm_dir *dir,
                       const char *dirname)
{
    return place(st, job, v, dir, dirname, NULL);
}

static void *copy_main(void *arg)
{
    arrivals *s = arg;
    char chk[64];
    snprintf(chk, sizeof chk, "chk-%llu", (unsigned long long)s->v->id);
    s->rc = place(s->st, s->job, s->v, s->dir, chk, s);
    if (s->rc) snprintf(s->why, sizeof s->why, "%s", stash_errmsg());
    return NULL;
}

int ckpt_storage_restore(ckpt_storage *st, const char *job, ckpt_view *v, const shm_dir *dir,
                         stash_arena *a, stash_kg_range range, store *into, ckpt_restored *out)
{
    arrivals s = {.st = st, .job = job, .v = v, .dir = dir};
    memset(out, 0, sizeof *out);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    uint32_t depth = st->depth / (v->nfiles ? v->nfiles : 1);
    int rc = 0;
    for (uint32_t f = 0; rc == 0 && f < v->nfiles; f++) {
        ckpt_file *cf = &v->files[f];
        uint64_t named = ckpt_file_named_bytes(v, cf);
        rc = ckpt_storage_reader_open(st, object_of_path(st, cf),
                                      named < SIZE_MAX ? (size_t)named : SIZE_MAX, depth,
                                      &s.readers[f], &cf->data, &cf->len);
    }
    if (rc == 0) s.started = pthread_create(&s.t, NULL, copy_main, &s) == 0;
    if (rc == 0 && !s.started) rc = shm_fail(-EAGAIN, "%s: no thread to copy it", v->meta_path);
    if (rc == 0) rc = ckpt_restore_arriving(a, v, range, into, arrived, &s, out);
    pthread_mutex_lock(&s.mu);
    s.verdict = rc == 0 ? 1 : -1;
    pthread_cond_broadcast(&s.cv);
    pthread_mutex_unlock(&s.mu);
    char why[512];
    snprintf(why, sizeof why, "%s", stash_errmsg());
    for (uint32_t f = 0; rc && f < v->nfiles; f++) ckpt_storage_reader_stop(s.readers[f]);
    if (s.started) pthread_join(s.t, NULL);
    for (uint32_t f = 0; f < v->nfiles; f++) ckpt_storage_reader_close(s.readers[f]);
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
    if (rc) return shm_fail(rc, "%s", why);
    if (s.rc) {
        ckpt_restored_free(out);
        return shm_fail(s.rc, "%s", s.why);
    }
    return 0;
}

int ckpt_storage_fetch(ckpt_storage *st, const char *job, const shm_dir *dir, const char *dirname)
{
    char meta[300];
    struct stat sb;
    snprintf(meta, sizeof meta, "%s/_metadata", dirname);
    if (fstatat(dir->fd, meta, &sb, AT_SYMLINK_NOFOLLOW) == 0) return 0; /* the local copy */
    ckpt_view v;
    int rc = ckpt_storage_view(st, job, dirname, &v);
    if (rc) return rc;
    rc = ckpt_storage_place(st, job, &v, dir, dirname);
    ckpt_view_close(&v);
    return rc;
}

/* The job's checkpoints found by listing: each id once, and whether its
 * metadata is there. */
typedef struct found {
    const char *job;
    uint64_t *ids;
    bool *committed;
    size_t n, cap;
} found;

static int take_id(void *ctx, const char *name)
{
    found *f = ctx;
    char *end;
    uint64_t id = strtoull(name + strlen(f->job) + strlen("/chk-"), &end, 10);
    if (!id || *end != '/') return 0;
    bool md = strcmp(end, "/_metadata") == 0;
    for (size_t i = 0; i < f->n; i++)
        if (f->ids[i] == id) {
            f->committed[i] |= md;
            return 0;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 16;
        uint64_t *ids = realloc(f->ids, cap * sizeof *ids);
        if (ids) f->ids = ids;
        bool *c = ids ? realloc(f->committed, cap * sizeof *c) : NULL;
        if (!c) return shm_fail(-ENOMEM, "out of memory");
        f->committed = c;
        f->cap = cap;
    }
    f->ids[f->n] = id;
    f->committed[f->n++] = md;
    return 0;
}

int ckpt_storage_shared_of(ckpt_storage *st, const char *job, const char *dirname, char ***names,
                           size_t *n)
{
    char name[1024];
    snprintf(name, sizeof name, "%s/%s/_metadata", job, dirname);
    ckpt_view v = {0};
    snprintf(v.meta_path, sizeof v.meta_path, "%s/%s", ckpt_storage_where(st), name);
    int rc = ckpt_storage_read_file(st, name, CKPT_MAX_METADATA, &v.md, &v.md_len);
    if (rc == 0) rc = ckpt_view_parse(&v);
    for (uint32_t f = 0; rc == 0 && f < v.nfiles; f++) {
        if (strncmp(v.files[f].name, CKPT_SHARED_DIR "/", sizeof CKPT_SHARED_DIR) != 0) continue;
        char **grown = realloc(*names, (*n + 1) * sizeof **names);
        if (!grown || !(grown[*n] = strdup(v.files[f].name))) {
            if (grown) *names = grown;
            rc = shm_fail(-ENOMEM, "out of memory");
            break;
        }
        *names = grown;
        (*n)++;
    }
    ckpt_view_close(&v);
    return rc;
}

/* Collects the job's shared files that none of keep lists into *gone. */
typedef struct unlisted {
    const char *job;
    char **keep;
    size_t nkeep;
    char **gone;
    size_t ngone;
} unlisted;

static int take_unlisted(void *ctx, const char *name)
{
    unlisted *u = ctx;
    const char *file = name + strlen(u->job) + 1; /* shared/ID.dat */
    for (size_t i = 0; i < u->nkeep; i++)
        if (strcmp(u->keep[i], file) == 0) return 0;
    char **grown = realloc(u->gone, (u->ngone + 1) * sizeof *grown);
    if (!grown) return shm_fail(-ENOMEM, "out of memory");
    u->gone = grown;
    if (!(grown[u->ngone] = strdup(name))) return shm_fail(-ENOMEM, "out of memory");
    u->ngone++;
    return 0;
}

int ckpt_storage_checkpoints(ckpt_storage *st, const char *job, uint64_t **ids, bool **committed,
                             size_t *n)
{
    char prefix[1024];
    snprintf(prefix, sizeof prefix, "%s/chk-", job);
    found f = {job, NULL, NULL, 0, 0};
    int rc = ckpt_storage_list_files(st, prefix, take_id, &f);
    /* Newest first, as ckpt_list gives a directory's. */
    for (size_t i = 1; rc == 0 && i < f.n; i++)
        for (size_t j = i; j > 0 && f.ids[j] > f.ids[j - 1]; j--) {
            uint64_t t = f.ids[j];
            bool c = f.committed[j];
            f.ids[j] = f.ids[j - 1], f.committed[j] = f.committed[j - 1];
            f.ids[j - 1] = t, f.committed[j - 1] = c;
        }
    if (rc) {
        free(f.ids);
        free(f.committed);
        return rc;
    }
    *ids = f.ids;
    *committed = f.committed;
    *n = f.n;
    return 0;
}

int ckpt_storage_retain(ckpt_storage *st, const char *job, unsigned keep)
{
    uint64_t latest;
    int rc = ckpt_storage_latest(st, job, &latest);
    if (rc == -ENOENT) return 0;
    if (rc) return rc;
    char prefix[1024], name[1024];
    snprintf(prefix, sizeof prefix, "%s/chk-", job);
    found f = {job, NULL, NULL, 0, 0};
    rc = ckpt_storage_list_files(st, prefix, take_id, &f);
    if (rc) {
        free(f.ids);
        free(f.committed);
        return rc;
    }
    /* Kept: the newest keep committed at or below latest. Newer ones are
     * being written; older partial ones failed. */
    char **shared = NULL;
    size_t nshared = 0;
    for (unsigned kept = 0; rc == 0 && kept < keep; kept++) {
        size_t best = f.n;
        for (size_t i = 0; i < f.n; i++)
            if (f.committed[i] && f.ids[i] <= latest && (best == f.n || f.ids[i] > f.ids[best]))
                best = i;
        if (best == f.n) break;
        snprintf(name, sizeof name, "chk-%llu", (unsigned long long)f.ids[best]);
        rc = ckpt_storage_shared_of(st, job, name, &shared, &nshared);
        f.ids[best] = 0; /* kept: not removed below */
    }
    for (size_t i = 0; rc == 0 && i < f.n; i++) {
        if (!f.ids[i] || f.ids[i] > latest) continue;
        /* Its metadata first: a checkpoint half removed is one no longer. */
        snprintf(name, sizeof name, "%s/chk-%llu/_metadata", job, (unsigned long long)f.ids[i]);
        rc = ckpt_storage_remove_file(st, name);
        snprintf(name, sizeof name, "%s/chk-%llu/", job, (unsigned long long)f.ids[i]);
        if (rc == 0) rc = ckpt_storage_remove_prefix(st, name);
    }
    unlisted u = {job, shared, nshared, NULL, 0};
    snprintf(prefix, sizeof prefix, "%s/%s/", job, CKPT_SHARED_DIR);
    if (rc == 0) rc = ckpt_storage_list_files(st, prefix, take_unlisted, &u);
    for (size_t i = 0; rc == 0 && i < u.ngone; i++) rc = ckpt_storage_remove_file(st, u.gone[i]);
    for (size_t i = 0; i < u.ngone; i++) free(u.gone[i]);
    for (size_t i = 0; i < nshared; i++) free(shared[i]);
    free(u.gone);
    free(shared);
    free(f.ids);
    free(f.committed);
    return rc;
}

/* ---- URLs ---------------------------------------------------------------- */

bool ckpt_url(const char *path)
{
    return ckpt_storage_of_url(path) != NULL;
}

int ckpt_url_parse(const char *url, const ckpt_storage_ops **ops, char *container,
                   size_t container_cap, char *job, size_t job_cap, char *name, size_t name_cap)
{
    /* SCHEME://CONTAINER/JOB[/NAME]: JOB may hold slashes; NAME is chk-ID,
     * savepoint-ID or job-ID (a job checkpoint of a job that spans hosts). */
    *ops = ckpt_storage_of_url(url);
    if (!*ops) return shm_fail(-EINVAL, "%s: names no storage (rados://, s3://)", url);
    const char *p = strstr(url, "://") + 3, *slash = strchr(p, '/');
    if (!slash || slash == p || (size_t)(slash - p) >= container_cap || !slash[1])
        return shm_fail(-EINVAL, "%s: not %s://%s/JOB[/chk-ID]", url, (*ops)->scheme,
                        (*ops)->container);
    snprintf(container, container_cap, "%.*s", (int)(slash - p), p);
    const char *rest = slash + 1, *last = strrchr(rest, '/');
    bool named = last && last[1] &&
                 (strncmp(last + 1, "chk-", 4) == 0 || strncmp(last + 1, "savepoint-", 10) == 0 ||
                  strncmp(last + 1, "job-", 4) == 0);
    size_t jlen = named ? (size_t)(last - rest) : strlen(rest);
    while (jlen && rest[jlen - 1] == '/') jlen--;
    if (!jlen || jlen >= job_cap) return shm_fail(-EINVAL, "%s: no job named", url);
    snprintf(job, job_cap, "%.*s", (int)jlen, rest);
    snprintf(name, name_cap, "%s", named ? last + 1 : "");
    return 0;
}

int ckpt_url_open(const char *url, ckpt_storage **st, char *job, size_t job_cap, char *name,
                  size_t name_cap)
{
    const ckpt_storage_ops *ops;
    char container[128];
    int rc = ckpt_url_parse(url, &ops, container, sizeof container, job, job_cap, name, name_cap);
    if (rc) return rc;
    const char *id = getenv("STASH_CEPH_ID");
    stash_storage_opts o = {.sz = sizeof o, .ceph_id = id && *id ? id : NULL};
    return ckpt_storage_open(ops, container, &o, st);
}

int ckpt_url_fetch_checkpoint(const char *url, const shm_dir *under, ckpt_fetched *out)
{
    *out = (ckpt_fetched){.parent = {.fd = -1}, .tmp = {.fd = -1}};
    ckpt_storage *st;
    char job[256], name[256];
    int rc = ckpt_url_open(url, &st, job, sizeof job, name, sizeof name);
    if (rc) return rc;
    uint64_t id;
    if (!name[0] && (rc = ckpt_storage_latest(st, job, &id)) == 0)
        snprintf(name, sizeof name, "chk-%llu", (unsigned long long)id);
    if (rc == 0) rc = shm_dir_open(under ? under->path : "/var/tmp", SHM_DIR_PLACE, &out->parent);
    if (rc == 0) rc = shm_dir_temp(&out->parent, "stash-fetch-", &out->tmp);
    if (rc == 0) rc = ckpt_storage_fetch(st, job, &out->tmp, name);
    if (rc == 0) rc = ckpt_path_of(out->path, "%s/%s", out->tmp.path, name);
    if (rc) ckpt_url_release(out);
    ckpt_storage_close(st);
    return rc;
}

void ckpt_url_release(ckpt_fetched *f)
{
    shm_dir_temp_remove(&f->parent, &f->tmp);
    shm_dir_close(&f->parent);
}

int ckpt_url_put(const char *local, const char *url, ioe_engine *e)
{
    ckpt_storage *st;
    char job[256], name[256];
    int rc = ckpt_url_open(url, &st, job, sizeof job, name, sizeof name);
    if (rc) return rc;
    const char *slash = strrchr(local, '/');
    const char *base = slash ? slash + 1 : local;
    if (!name[0] || strcmp(name, base) != 0 || strncmp(name, "chk-", 4) == 0)
        rc = shm_fail(-EINVAL, "%s: a savepoint goes to %s/JOB/%s", url, ckpt_storage_where(st),
                      base);
    char md[1024];
    uint64_t len;
    if (rc == 0 && snprintf(md, sizeof md, "%s/%s/_metadata", job, name) > 0 &&
        ckpt_storage_file_size(st, md, &len) == 0)
        rc = shm_fail(-EEXIST, "%s: exists already", url);
    shm_dir parent = {.fd = -1};
    char where[4096];
    if (rc == 0)
        rc = ckpt_path_of(where, "%.*s", slash ? (int)(slash - local) : 1,
                          !slash           ? "."
                          : slash == local ? "/"
                                           : local);
    if (rc == 0) rc = shm_dir_open(where, 0, &parent);
    if (rc == 0) rc = ckpt_storage_upload(st, job, parent.fd, base, local, 0, e);
    shm_dir_close(&parent);
    ckpt_storage_close(st);
    return rc;
}
