/*
 * ckpt.c: full checkpoints in a directory. The writer serializes every key
 * group into one data file through the I/O engine, makes it durable, then
 * commits by renaming a synced _metadata into place: a checkpoint without a
 * valid _metadata does not exist. The reader trusts no byte: the metadata's
 * checksum, counts, names and ranges, and every block, are checked before
 * anything is restored, and a damaged checkpoint gives way to the previous one.
 */
#define _GNU_SOURCE /* O_DIRECT */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/ckpt.h"
#include "backends/opstate.h"

#define DATA_FILE "kg-data.dat"
#define SHARED_DIR "shared"
#define CHUNK (1u << 20)
#define MAX_METADATA (64u << 20)
#define SPLIT_MIN_BYTES (4u << 20) /* a walk over fewer bytes stays in one thread */

typedef struct md_header {
    char magic[8];
    uint32_t format_version;
    uint32_t flags;
    uint64_t id;
    uint64_t created_ns;
    uint64_t base_id;
    uint32_t backend;
    uint32_t max_parallelism;
    uint32_t nstates;
    uint32_t nfiles;
} md_header;

typedef struct md_file {
    char name[64];
    uint32_t first_kg;
    uint32_t last_kg;
    uint32_t flags;
    uint32_t reserved;
} md_file;

typedef struct md_extent {
    uint64_t offset;
    uint64_t size;
} md_extent;

static uint64_t pad8(uint64_t n)
{
    return (n + 7) & ~7ull;
}

/* Formats a path into out (4096 bytes); -ENAMETOOLONG if it does not fit. */
__attribute__((format(printf, 2, 3))) static int path_of(char *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, 4096, fmt, ap);
    va_end(ap);
    return n < 0 || n >= 4096 ? shm_fail(-ENAMETOOLONG, "a path longer than 4095 bytes") : 0;
}

/* ---- files through the engine -------------------------------------------- */

/* Reaps until at most keep requests are outstanding; the first failure wins. */
static int drain(ioe_engine *e, unsigned keep, int rc)
{
    ioe_cqe c[16];
    while (ioe_outstanding(e) > keep) {
        int n = ioe_reap(e, c, 16, 1);
        if (n < 0) return rc ? rc : shm_fail(n, "waiting for I/O: %s", stash_strerror(n));
        for (int i = 0; i < n; i++) {
            if (c[i].res >= 0 || rc) continue;
            char what[300];
            ioe_cqe_describe(&c[i], what, sizeof what);
            rc = shm_fail(c[i].res, "%s", what);
        }
    }
    return rc;
}

/* Writes len bytes to a new file at path and makes them durable. */
static int write_durable(ioe_engine *e, const char *path, const void *data, size_t len)
{
    ioe_file *f;
    int rc = ioe_file_open(e, path, O_WRONLY | O_CREAT | O_TRUNC, 0644, &f);
    if (rc < 0) return shm_fail(rc, "%s: cannot create: %s", path, stash_strerror(rc));
    for (size_t off = 0; off < len && rc == 0;) {
        size_t n = len - off < CHUNK ? len - off : CHUNK;
        int q = ioe_write(f, (const uint8_t *)data + off, n, off, NULL);
        if (q == -EBUSY) {
            rc = drain(e, ioe_outstanding(e) - 1, 0);
            continue;
        }
        if (q < 0) rc = shm_fail(q, "write %s at offset %zu: %s", path, off, stash_strerror(q));
        off += n;
    }
    if (rc == 0) {
        while ((rc = ioe_fsync(f, NULL)) == -EBUSY) rc = drain(e, ioe_outstanding(e) - 1, 0);
        if (rc < 0) rc = shm_fail(rc, "fsync %s: %s", path, stash_strerror(rc));
    }
    rc = drain(e, 0, rc);
    ioe_file_close(f);
    return rc;
}

/* A data file written while it is serialized: blocks are copied into the
 * engine's staging buffers, and each buffer is written as soon as it is full,
 * with O_DIRECT where the filesystem has it, so the disk works while the next
 * key groups are serialized (buffered writes would wait for the fsync). */
typedef struct stream {
    ioe_engine *e;
    ioe_file *f;
    const char *path;
    uint64_t off; /* where buf goes in the file */
    uint8_t *buf; /* the staging buffer being filled, or NULL */
    size_t fill;
    size_t cap;
    uint32_t align; /* O_DIRECT: the file's offset and length alignment; 1 buffered */
    int rc;         /* the first failure */
} stream;

/* Reaps at least min completions, giving their staging buffers back. */
static void stream_reap(stream *s, unsigned min)
{
    ioe_cqe c[16];
    int n = ioe_reap(s->e, c, 16, min);
    if (n < 0 && !s->rc) s->rc = shm_fail(n, "waiting for I/O: %s", stash_strerror(n));
    for (int i = 0; i < n; i++) {
        if (c[i].user) ioe_buf_put(s->e, c[i].user);
        if (c[i].res >= 0 || s->rc) continue;
        char what[300];
        ioe_cqe_describe(&c[i], what, sizeof what);
        s->rc = shm_fail(c[i].res, "%s", what);
    }
}

static int stream_open(stream *s, ioe_engine *e, const char *path)
{
    ioe_info info;
    ioe_engine_info(e, &info);
    *s = (stream){.e = e, .path = path, .cap = info.buf_size, .align = 1};
    int rc = ioe_file_open(e, path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644, &s->f);
    if (rc == 0) {
        ioe_align al = ioe_file_align(s->f);
        /* Staging buffers are page-aligned and a multiple of the page in size. */
        if (al.mem <= 4096 && al.offset <= 4096 && s->cap % al.offset == 0) {
            s->align = al.offset;
            return 0;
        }
        ioe_file_close(s->f);
    }
    /* A filesystem without direct I/O (tmpfs): buffered writes. */
    rc = ioe_file_open(e, path, O_WRONLY | O_CREAT | O_TRUNC, 0644, &s->f);
    return rc < 0 ? shm_fail(rc, "%s: cannot create: %s", path, stash_strerror(rc)) : 0;
}

static void stream_submit(stream *s)
{
    while (s->fill && !s->rc) {
        /* The last, partial buffer of a direct file goes out padded; the
         * file is cut to its length before the fsync. */
        size_t len = (s->fill + s->align - 1) / s->align * s->align;
        if (len > s->fill) memset(s->buf + s->fill, 0, len - s->fill);
        int q = ioe_write(s->f, s->buf, len, s->off, s->buf);
        if (q == -EBUSY) {
            stream_reap(s, 1);
            continue;
        }
        if (q < 0) {
            s->rc = shm_fail(q, "write %s at offset %llu: %s", s->path, (unsigned long long)s->off,
                             stash_strerror(q));
            break;
        }
        s->off += s->fill;
        s->buf = NULL;
        s->fill = 0;
    }
}

/* Appends n bytes. Returns 0 or the stream's first failure. */
static int stream_put(stream *s, const uint8_t *p, size_t n)
{
    while (n && !s->rc) {
        if (!s->buf) {
            int rc = ioe_buf_get(s->e, (void **)&s->buf);
            if (rc == -ENOBUFS) {
                stream_reap(s, 1);
                continue;
            }
            if (rc < 0)
                s->rc = shm_fail(rc, "%s: no staging buffer: %s", s->path, stash_strerror(rc));
            continue;
        }
        size_t k = n < s->cap - s->fill ? n : s->cap - s->fill;
        memcpy(s->buf + s->fill, p, k);
        s->fill += k, p += k, n -= k;
        if (s->fill == s->cap) stream_submit(s);
    }
    return s->rc;
}

/* Writes what is left, makes the file durable (or, after a failure, only
 * waits for what is in flight) and closes it. Returns the first failure. */
static int stream_close(stream *s)
{
    uint64_t end = s->off + s->fill;
    stream_submit(s);
    if (s->buf) ioe_buf_put(s->e, s->buf);
    if (s->align > 1 && end % s->align) {
        while (ioe_outstanding(s->e)) stream_reap(s, 1);
        if (!s->rc && ftruncate(ioe_file_fd(s->f), (off_t)end) < 0)
            s->rc = shm_fail(-errno, "%s: cannot cut to %llu bytes: %s", s->path,
                             (unsigned long long)end, strerror(errno));
    }
    int rc = s->rc;
    while (!s->rc && (rc = ioe_fsync(s->f, NULL)) == -EBUSY) stream_reap(s, 1);
    if (rc < 0 && !s->rc) s->rc = shm_fail(rc, "fsync %s: %s", s->path, stash_strerror(rc));
    while (ioe_outstanding(s->e)) stream_reap(s, 1);
    ioe_file_close(s->f);
    return s->rc;
}

/* Reads the whole file at path into *out (malloc'd), with O_DIRECT where the
 * filesystem has it (a restore reads each byte once: no page cache). */
static int read_whole(ioe_engine *e, const char *path, size_t limit, uint8_t **out, size_t *len)
{
    ioe_file *f;
    int rc = ioe_file_open(e, path, O_RDONLY | O_DIRECT, 0, &f);
    if (rc < 0) rc = ioe_file_open(e, path, O_RDONLY, 0, &f);
    if (rc < 0) return shm_fail(rc, "%s: cannot open: %s", path, stash_strerror(rc));
    ioe_align al = ioe_file_align(f);
    struct stat st;
    if (fstat(ioe_file_fd(f), &st) < 0 || (uint64_t)st.st_size > limit) {
        ioe_file_close(f);
        return shm_fail(STASH_ECORRUPT, "%s: %lld bytes, more than %zu", path,
                        (long long)st.st_size, limit);
    }
    *len = (size_t)st.st_size;
    /* Direct reads go whole aligned blocks at a time: the last one past the end. */
    size_t want = (*len + al.offset - 1) / al.offset * al.offset;
    *out = NULL;
    if (ioe_aligned_alloc(want ? want : al.offset, al.mem > 64 ? al.mem : 64, (void **)out) < 0) {
        ioe_file_close(f);
        return -ENOMEM;
    }
    for (size_t off = 0; off < want && rc == 0;) {
        size_t n = want - off < CHUNK ? want - off : CHUNK;
        int q = ioe_read(f, *out + off, n, off, NULL);
        if (q == -EBUSY) {
            rc = drain(e, ioe_outstanding(e) - 1, 0);
            continue;
        }
        if (q < 0) rc = shm_fail(q, "read %s at offset %zu: %s", path, off, stash_strerror(q));
        off += n;
    }
    rc = drain(e, 0, rc);
    ioe_file_close(f);
    if (rc) free(*out);
    return rc;
}

static int sync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return shm_fail(-errno, "%s: cannot open: %s", path, strerror(errno));
    int rc = fsync(fd) < 0 ? shm_fail(-errno, "fsync %s: %s", path, strerror(errno)) : 0;
    close(fd);
    return rc;
}

/* Removes a checkpoint's directory and the files in it. */
static void remove_checkpoint(const char *chk)
{
    DIR *d = opendir(chk);
    if (d) {
        char path[4096];
        for (struct dirent *de; (de = readdir(d));) {
            if (de->d_name[0] == '.') continue;
            if (path_of(path, "%s/%s", chk, de->d_name) == 0) unlink(path);
        }
        closedir(d);
    }
    rmdir(chk);
}

/* ---- writing ---------------------------------------------------------------- */

/* What the new metadata lists: the base's files (for a delta), then its own. */
typedef struct file_list {
    uint32_t n;
    md_file files[CKPT_MAX_FILES];
    const uint8_t *extents[CKPT_MAX_FILES]; /* P extents each */
} file_list;

static int build_metadata(stash_arena *a, const ckpt_opts *o, const file_list *fl, snap_buf *md)
{
    uint32_t maxp = a->hdr->max_parallelism, nstates = 0;
    for (uint32_t i = 0; i < SHM_CATALOG_SIZE; i++) nstates += atomic_load(&a->catalog[i].used);
    size_t bytes = sizeof(md_header) + nstates * sizeof(ckpt_state) +
                   fl->n * (sizeof(md_file) + maxp * sizeof(md_extent)) + 8 +
                   (size_t)o->op_parallelism * 8 + 4;
    for (uint32_t i = 0; i < o->op_parallelism; i++) bytes += pad8(o->op_blobs[i].len);
    if (state_reserve(&md->data, &md->cap, bytes) < 0) return -ENOMEM;
    md_header h = {.format_version = CKPT_FORMAT_VERSION,
                   .id = o->id,
                   .created_ns = shm_now_ns(),
                   .base_id = o->base_id,
                   .backend = CKPT_BACKEND_HEAP,
                   .max_parallelism = maxp,
                   .nstates = nstates,
                   .nfiles = fl->n};
    memcpy(h.magic, CKPT_MAGIC, sizeof h.magic);
    uint8_t *p = md->data;
    memcpy(p, &h, sizeof h);
    p += sizeof h;
    for (uint32_t i = 0; i < SHM_CATALOG_SIZE; i++) {
        shm_catalog_entry *c = &a->catalog[i];
        if (!atomic_load(&c->used)) continue;
        ckpt_state s = {.id = (uint16_t)(i + 1), .kind = (uint16_t)c->kind};
        memcpy(s.options, c->options, sizeof s.options);
        memcpy(s.name, c->name, sizeof s.name);
        memcpy(p, &s, sizeof s);
        p += sizeof s;
    }
    for (uint32_t f = 0; f < fl->n; f++) {
        memcpy(p, &fl->files[f], sizeof(md_file));
        p += sizeof(md_file);
        memcpy(p, fl->extents[f], maxp * sizeof(md_extent));
        p += maxp * sizeof(md_extent);
    }
    /* Operator state: the workers' count, each blob's length, the blobs. */
    uint32_t op_head[2] = {o->op_parallelism, 0};
    memcpy(p, op_head, sizeof op_head);
    p += sizeof op_head;
    for (uint32_t i = 0; i < o->op_parallelism; i++, p += 8) memcpy(p, &o->op_blobs[i].len, 8);
    for (uint32_t i = 0; i < o->op_parallelism; i++) {
        uint64_t len = o->op_blobs[i].len;
        if (len) memcpy(p, o->op_blobs[i].data, len);
        memset(p + len, 0, pad8(len) - len);
        p += pad8(len);
    }
    uint32_t crc = snap_crc32c(0, md->data, (size_t)(p - md->data));
    memcpy(p, &crc, 4);
    md->len = bytes;
    return 0;
}

static int open_view(const char *path, ioe_engine *e, ckpt_view *v, bool with_data);

static int64_t serialize_kg(stash_arena *a, const uint32_t *pins, const ckpt_opts *o, uint32_t kg,
                            uint32_t slot, snap_buf *block)
{
    block->len = 0;
    if (o->reader) shm_ebr_enter(a, slot);
    int64_t n = o->base_id ? snap_write_kg_delta(a, kg, o->base_pins[kg], pins[kg], o->lz4, block)
                           : snap_write_kg(a, kg, pins[kg], o->lz4, block);
    if (o->reader) shm_ebr_exit(a, slot);
    return n;
}

/* A second thread serializing the odd key groups, handing each block over
 * through a one-block mailbox, while the caller serializes the even ones
 * and streams them all in order. */
typedef struct helper {
    stash_arena *a;
    const uint32_t *pins;
    const ckpt_opts *o;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    snap_buf block;
    int64_t n;
    bool full; /* block holds the next odd key group's */
    bool stop;
    char why[512]; /* stash_errmsg() is per thread */
} helper;

static void *helper_main(void *arg)
{
    helper *h = arg;
    for (uint32_t kg = 1; kg < h->a->hdr->max_parallelism; kg += 2) {
        pthread_mutex_lock(&h->mu);
        while (h->full && !h->stop) pthread_cond_wait(&h->cv, &h->mu);
        bool stop = h->stop;
        pthread_mutex_unlock(&h->mu);
        if (stop) break;
        int64_t n = serialize_kg(h->a, h->pins, h->o, kg, h->o->reader_slot2, &h->block);
        if (n < 0) snprintf(h->why, sizeof h->why, "%s", stash_errmsg());
        pthread_mutex_lock(&h->mu);
        h->n = n;
        h->full = true;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        if (n < 0) break;
    }
    return NULL;
}

/* Streams key group kg's block (n records, or the error n), recording where it lies. */
static int emit(const ckpt_opts *o, stream *out, uint32_t kg, const snap_buf *block, int64_t n,
                md_extent *ext, uint64_t *records)
{
    ext[kg] = (md_extent){out->off + out->fill, block->len};
    if (n < 0) return (int)n;
    *records += (uint64_t)n;
    if (o->cap_bytes && ext[kg].offset + block->len > o->cap_bytes)
        return shm_fail(-EFBIG,
                        "%s: checkpoint %llu holds more than the storage's cap of %llu bytes",
                        out->path, (unsigned long long)o->id, (unsigned long long)o->cap_bytes);
    return stream_put(out, block->data, block->len);
}

/* Serializes every key group (or its changes since the base) into the
 * stream, one block at a time, and records where each block lies. A writer
 * that owns none of the key groups announces itself for each walk. With two
 * processors (and, for such a writer, a second reader slot), a second thread
 * serializes every other key group. */
static int serialize(stash_arena *a, const uint32_t *pins, const ckpt_opts *o, stream *out,
                     md_extent *ext, uint64_t *records)
{
    snap_buf block = {0};
    int rc = 0;
    uint32_t maxp = a->hdr->max_parallelism;
    *records = 0;
    helper h = {.a = a, .pins = pins, .o = o};
    pthread_t t;
    bool two = maxp > 1 && (!o->reader || o->reader_slot2) && sysconf(_SC_NPROCESSORS_ONLN) > 1;
    if (two) {
        pthread_mutex_init(&h.mu, NULL);
        pthread_cond_init(&h.cv, NULL);
        two = pthread_create(&t, NULL, helper_main, &h) == 0;
        if (!two) {
            pthread_mutex_destroy(&h.mu);
            pthread_cond_destroy(&h.cv);
        }
    }
    for (uint32_t kg = 0; kg < maxp && rc == 0; kg++) {
        if (!two || kg % 2 == 0) {
            int64_t n = serialize_kg(a, pins, o, kg, o->reader_slot, &block);
            rc = emit(o, out, kg, &block, n, ext, records);
            continue;
        }
        pthread_mutex_lock(&h.mu);
        while (!h.full) pthread_cond_wait(&h.cv, &h.mu);
        pthread_mutex_unlock(&h.mu);
        rc = h.n < 0 ? shm_fail((int)h.n, "%s", h.why)
                     : emit(o, out, kg, &h.block, h.n, ext, records);
        pthread_mutex_lock(&h.mu);
        h.full = false;
        pthread_cond_broadcast(&h.cv);
        pthread_mutex_unlock(&h.mu);
    }
    if (two) {
        pthread_mutex_lock(&h.mu);
        h.stop = true;
        pthread_cond_broadcast(&h.cv);
        pthread_mutex_unlock(&h.mu);
        pthread_join(t, NULL);
        pthread_mutex_destroy(&h.mu);
        pthread_cond_destroy(&h.cv);
        snap_buf_free(&h.block);
    }
    snap_buf_free(&block);
    return rc;
}

/* Lists the base checkpoint's files, then the new one. The base view stays
 * open for its extents. */
static int list_files(stash_arena *a, const ckpt_opts *o, const char *own, const md_extent *ext,
                      ckpt_view *base, file_list *fl)
{
    fl->n = 0;
    if (o->base_id) {
        char path[4096];
        int rc = path_of(path, "%s/chk-%llu", o->dir, (unsigned long long)o->base_id);
        if (rc == 0) rc = open_view(path, o->engine, base, false);
        if (rc) return rc;
        if (base->id != o->base_id || base->max_parallelism != a->hdr->max_parallelism)
            return shm_fail(STASH_ECORRUPT, "%s: not the base checkpoint %llu of this arena",
                            base->meta_path, (unsigned long long)o->base_id);
        if (base->nfiles >= CKPT_MAX_FILES)
            return shm_fail(-E2BIG, "%s: a chain of %u files: take a full checkpoint",
                            base->meta_path, base->nfiles);
        for (uint32_t f = 0; f < base->nfiles; f++) {
            md_file m = {.first_kg = 0,
                         .last_kg = a->hdr->max_parallelism - 1,
                         .flags = base->files[f].flags};
            memcpy(m.name, base->files[f].name, sizeof m.name);
            fl->files[fl->n] = m;
            fl->extents[fl->n++] = base->files[f].extents;
        }
    }
    md_file m = {.first_kg = 0,
                 .last_kg = a->hdr->max_parallelism - 1,
                 .flags = o->base_id ? CKPT_FILE_DELTA : 0};
    snprintf(m.name, sizeof m.name, "%s", own);
    fl->files[fl->n] = m;
    fl->extents[fl->n++] = (const uint8_t *)ext;
    return 0;
}

int ckpt_write(stash_arena *a, const uint32_t *pins, const ckpt_opts *o, ckpt_written *out)
{
    char chk[4096], path[4096], final[4096], own[64], shared[4096];
    if (o->id == 0) return shm_fail(-EINVAL, "a checkpoint id is > 0");
    bool in_shared = o->incremental && !o->savepoint;
    if (o->base_id && (!in_shared || !o->base_pins))
        return shm_fail(-EINVAL,
                        "checkpoint %llu: a delta needs incremental mode and the base's "
                        "pins",
                        (unsigned long long)o->id);
    if (mkdir(o->dir, 0755) < 0 && errno != EEXIST)
        return shm_fail(-errno, "%s: cannot create: %s", o->dir, strerror(errno));
    if (path_of(chk, "%s/%s-%llu", o->dir, o->savepoint ? "savepoint" : "chk",
                (unsigned long long)o->id) < 0 ||
        path_of(shared, "%s/%s", o->dir, SHARED_DIR) < 0)
        return -ENAMETOOLONG;
    if (in_shared && mkdir(shared, 0755) < 0 && errno != EEXIST)
        return shm_fail(-errno, "%s: cannot create: %s", shared, strerror(errno));
    if (mkdir(chk, 0755) < 0)
        return shm_fail(-errno, "%s: cannot create: %s", chk, strerror(errno));
    if (in_shared)
        snprintf(own, sizeof own, "%s/%llu.dat", SHARED_DIR, (unsigned long long)o->id);
    else
        snprintf(own, sizeof own, "%s", DATA_FILE);

    uint32_t maxp = a->hdr->max_parallelism;
    snap_buf md = {0};
    ckpt_view base = {0};
    file_list fl;
    uint64_t records = 0, data_bytes = 0;
    stream data;
    md_extent *ext = calloc(maxp, sizeof *ext);
    int rc = ext ? path_of(path, "%s/%s", in_shared ? o->dir : chk, own) : -ENOMEM;
    if (rc == 0) rc = stream_open(&data, o->engine, path);
    if (rc == 0) {
        rc = serialize(a, pins, o, &data, ext, &records);
        data_bytes = data.off + data.fill;
        int closed = stream_close(&data);
        if (rc == 0) rc = closed;
    }
    if (rc == 0) rc = list_files(a, o, own, ext, &base, &fl);
    if (rc == 0 && in_shared) rc = sync_dir(shared);
    if (rc == 0) rc = build_metadata(a, o, &fl, &md);
    if (rc == 0) rc = path_of(path, "%s/_metadata.tmp", chk);
    if (rc == 0) rc = write_durable(o->engine, path, md.data, md.len);
    if (rc == 0) rc = path_of(final, "%s/_metadata", chk);
    if (rc == 0 && rename(path, final) < 0)
        rc = shm_fail(-errno, "rename %s: %s", path, strerror(errno));
    if (rc == 0) rc = sync_dir(chk);
    if (rc == 0) rc = sync_dir(o->dir);
    if (rc) {
        remove_checkpoint(chk);
        if (in_shared && path_of(path, "%s/%s", o->dir, own) == 0) unlink(path);
    } else if (out) {
        *out = (ckpt_written){data_bytes, records};
    }
    ckpt_view_close(&base);
    free(ext);
    snap_buf_free(&md);
    return rc;
}

/* ---- reading ------------------------------------------------------------------ */

/* Whether a data file's name stays inside the checkpoint: a plain name, or
 * "shared/" and a plain name. */
static bool safe_name(const char *name, size_t size)
{
    if (!memchr(name, 0, size)) return false;
    if (strncmp(name, SHARED_DIR "/", sizeof SHARED_DIR) == 0) name += sizeof SHARED_DIR;
    return name[0] && name[0] != '.' && !strchr(name, '/');
}

/* Checks _metadata's bytes: checksum, magic, version, counts against its
 * size, state names, data file names (no path may leave the checkpoint) and
 * key-group ranges. */
/* The operator-state section from offset at to end (the checksum's offset). */
static int parse_opstate(ckpt_view *v, uint64_t at, uint64_t end)
{
    const char *path = v->meta_path;
    uint32_t head[2];
    memcpy(head, v->md + at, sizeof head);
    uint32_t p = head[0];
    if (p > STASH_MAX_WORKERS || head[1] != 0 || (end - at - 8) / 8 < p)
        return shm_fail(STASH_ECORRUPT, "%s: offset %llu: operator state of %u workers", path,
                        (unsigned long long)at, p);
    v->op_blobs = calloc(p ? p : 1, sizeof *v->op_blobs);
    if (!v->op_blobs) return -ENOMEM;
    uint64_t lens = at + 8, data = lens + 8ull * p;
    for (uint32_t i = 0; i < p; i++) {
        uint64_t len;
        memcpy(&len, v->md + lens + 8ull * i, 8);
        if (len > end - data || pad8(len) > end - data)
            return shm_fail(STASH_ECORRUPT,
                            "%s: offset %llu: operator state of worker %u runs past the end", path,
                            (unsigned long long)(lens + 8ull * i), i);
        v->op_blobs[i] = (ckpt_blob){v->md + data, len};
        data += pad8(len);
    }
    if (data != end)
        return shm_fail(STASH_ECORRUPT, "%s: offset %llu: %llu bytes after the operator state",
                        path, (unsigned long long)data, (unsigned long long)(end - data));
    v->op_parallelism = p;
    return 0;
}

static int parse_metadata(ckpt_view *v)
{
    const uint8_t *p = v->md;
    size_t len = v->md_len;
    const char *path = v->meta_path;
    md_header h;
    uint32_t crc;
    if (len < sizeof h + 4) return shm_fail(STASH_ECORRUPT, "%s: %zu bytes, too short", path, len);
    memcpy(&crc, p + len - 4, 4);
    if (snap_crc32c(0, p, len - 4) != crc)
        return shm_fail(STASH_ECORRUPT, "%s: offset %zu: checksum mismatch", path, len - 4);
    memcpy(&h, p, sizeof h);
    if (memcmp(h.magic, CKPT_MAGIC, 8) != 0)
        return shm_fail(STASH_ECORRUPT, "%s: offset 0: not checkpoint metadata", path);
    if (h.format_version != CKPT_FORMAT_VERSION)
        return shm_fail(STASH_EFORMAT, "%s: offset 8: format version %u, this build reads %u", path,
                        h.format_version, CKPT_FORMAT_VERSION);
    uint64_t fixed = sizeof h + (uint64_t)h.nstates * sizeof(ckpt_state) +
                     (uint64_t)h.nfiles * (sizeof(md_file) + h.max_parallelism * sizeof(md_extent));
    if (h.nfiles == 0 || h.nfiles > CKPT_MAX_FILES || h.max_parallelism == 0 ||
        h.max_parallelism > STASH_MAX_MAX_PARALLELISM || h.nstates > SHM_CATALOG_SIZE ||
        fixed + 12 > len)
        return shm_fail(STASH_ECORRUPT,
                        "%s: offset 40: counts (%u states, %u files, %u key "
                        "groups) do not match its %zu bytes",
                        path, h.nstates, h.nfiles, h.max_parallelism, len);
    v->id = h.id;
    v->created_ns = h.created_ns;
    v->base_id = h.base_id;
    v->max_parallelism = h.max_parallelism;
    v->nstates = h.nstates;
    for (uint32_t i = 0; i < h.nstates; i++) {
        ckpt_state s = ckpt_view_state(v, i);
        bool twice = false;
        for (uint32_t j = 0; j < i && !twice; j++) {
            ckpt_state o = ckpt_view_state(v, j);
            twice = o.id == s.id || strncmp(o.name, s.name, sizeof s.name) == 0;
        }
        if (s.id == 0 || s.id > SHM_CATALOG_SIZE || !memchr(s.name, 0, sizeof s.name) ||
            s.name[0] == 0 || twice)
            return shm_fail(STASH_ECORRUPT, "%s: offset %zu: a bad or repeated state entry", path,
                            sizeof h + i * sizeof(ckpt_state));
    }
    v->files = calloc(h.nfiles, sizeof *v->files);
    if (!v->files) return -ENOMEM;
    size_t at = sizeof h + h.nstates * sizeof(ckpt_state);
    for (uint32_t f = 0; f < h.nfiles; f++) {
        md_file m;
        memcpy(&m, p + at, sizeof m);
        if (!safe_name(m.name, sizeof m.name) || m.first_kg != 0 ||
            m.last_kg != h.max_parallelism - 1 || (m.flags & ~CKPT_FILE_DELTA) ||
            (f == 0) != !(m.flags & CKPT_FILE_DELTA))
            return shm_fail(STASH_ECORRUPT,
                            "%s: offset %zu: a data file entry that names a path "
                            "outside the checkpoint, a bad range or kind",
                            path, at);
        memcpy(v->files[f].name, m.name, sizeof m.name);
        v->files[f].flags = m.flags;
        v->files[f].extents = p + at + sizeof m;
        at += sizeof m + h.max_parallelism * sizeof(md_extent);
    }
    v->nfiles = h.nfiles;
    return parse_opstate(v, fixed, len - 4);
}

ckpt_state ckpt_view_state(const ckpt_view *v, uint32_t i)
{
    ckpt_state s;
    memcpy(&s, v->md + sizeof(md_header) + i * sizeof s, sizeof s);
    return s;
}

static int open_view(const char *path, ioe_engine *e, ckpt_view *v, bool with_data)
{
    memset(v, 0, sizeof *v);
    char parent[4096];
    int rc = path_of(v->meta_path, "%s/_metadata", path);
    if (rc == 0) rc = path_of(parent, "%s/..", path);
    if (rc == 0) rc = read_whole(e, v->meta_path, MAX_METADATA, &v->md, &v->md_len);
    if (rc == 0) rc = parse_metadata(v);
    for (uint32_t f = 0; rc == 0 && f < v->nfiles; f++) {
        ckpt_file *cf = &v->files[f];
        bool shared = strncmp(cf->name, SHARED_DIR "/", sizeof SHARED_DIR) == 0;
        rc = path_of(cf->path, "%s/%s", shared ? parent : path, cf->name);
        if (rc == 0 && with_data) rc = read_whole(e, cf->path, SIZE_MAX, &cf->data, &cf->len);
    }
    if (rc) ckpt_view_close(v);
    return rc;
}

int ckpt_view_open_path(const char *path, ioe_engine *e, ckpt_view *v)
{
    return open_view(path, e, v, true);
}

int ckpt_view_open(const char *dir, uint64_t id, ioe_engine *e, ckpt_view *v)
{
    char chk[4096];
    int rc = path_of(chk, "%s/chk-%llu", dir, (unsigned long long)id);
    if (rc == 0) rc = ckpt_view_open_path(chk, e, v);
    if (rc == 0 && v->id != id) {
        rc = shm_fail(STASH_ECORRUPT, "%s: offset 16: names checkpoint %llu", v->meta_path,
                      (unsigned long long)v->id);
        ckpt_view_close(v);
    }
    return rc;
}

void ckpt_view_close(ckpt_view *v)
{
    for (uint32_t f = 0; v->files && f < v->nfiles; f++) free(v->files[f].data);
    free(v->files);
    free(v->md);
    free(v->op_blobs);
    v->op_blobs = NULL;
    v->files = NULL;
    v->md = NULL;
    v->nfiles = 0;
}

/* The check pass: a record's state must be one the metadata names, and its
 * value well formed for that state's kind, before anything is restored. */
static int check_record(void *ctx, uint32_t kg, const snap_record *r)
{
    const ckpt_view *v = ctx;
    (void)kg;
    for (uint32_t i = 0; i < v->nstates; i++) {
        ckpt_state s = ckpt_view_state(v, i);
        if (s.id != r->state) continue;
        uint64_t ttl_ms;
        memcpy(&ttl_ms, s.options, sizeof ttl_ms);
        bool ttl = ttl_ms > 0, ok = true;
        if (!(r->flags & SNAP_REC_DELETED)) {
            if (s.kind == STASH_LIST)
                ok = list_bytes_valid(r->value, r->vlen, ttl);
            else if (s.kind == STASH_MAP)
                ok = map_bytes_valid(r->value, r->vlen, ttl);
            else
                ok = !ttl || r->vlen >= TTL_BYTES;
        }
        return ok ? 0
                  : shm_fail(STASH_ECORRUPT,
                             "a value that is not a well-formed state '%s' of "
                             "kind %u",
                             s.name, s.kind);
    }
    return shm_fail(STASH_ECORRUPT, "a record of state %u, which the metadata does not name",
                    r->state);
}

/* Checks one file's block of key group kg and walks its records. */
static int64_t walk_block(const ckpt_view *v, const ckpt_file *f, uint32_t kg, snap_buf *scratch,
                          bool checked, snap_record_fn *fn, void *ctx)
{
    md_extent e;
    memcpy(&e, f->extents + kg * sizeof e, sizeof e);
    if (e.offset > f->len || e.size > f->len - e.offset)
        return shm_fail(STASH_ECORRUPT,
                        "%s: key group %u at offset %llu, %llu bytes, beyond the "
                        "file's %zu",
                        f->path, kg, (unsigned long long)e.offset, (unsigned long long)e.size,
                        f->len);
    snap_block b;
    int rc = (checked ? snap_reread_block : snap_read_block)(f->data + e.offset, e.size, f->path,
                                                             e.offset, scratch, &b);
    if (rc) return rc;
    bool delta = f->flags & CKPT_FILE_DELTA;
    if (b.hdr.kg != kg || b.size != e.size || delta != !!(b.hdr.flags & SNAP_DELTA))
        return shm_fail(STASH_ECORRUPT,
                        "%s: offset %llu: the block of key group %u is not the "
                        "one the metadata says",
                        f->path, (unsigned long long)e.offset, kg);
    return snap_block_records(&b, v->max_parallelism, fn ? fn : check_record, fn ? ctx : (void *)v,
                              f->path, e.offset);
}

/* Walks the blocks of range in every file; checked: a second pass over
 * bytes the first already checked. */
static int64_t walk_range(const ckpt_view *v, stash_kg_range range, bool checked,
                          snap_record_fn *fn, void *ctx)
{
    if (range.first > range.last || range.last >= v->max_parallelism)
        return shm_fail(-EINVAL, "%s: key groups %u..%u of %u", v->meta_path, range.first,
                        range.last, v->max_parallelism);
    snap_buf scratch = {0};
    int64_t total = 0;
    for (uint32_t f = 0; f < v->nfiles && total >= 0; f++)
        for (uint32_t kg = range.first; kg <= range.last && total >= 0; kg++) {
            int64_t n = walk_block(v, &v->files[f], kg, &scratch, checked, fn, ctx);
            total = n < 0 ? n : total + n;
        }
    snap_buf_free(&scratch);
    return total;
}

/* Half of a walk, in a thread of its own: key groups are independent. */
typedef struct walk_half {
    const ckpt_view *v;
    stash_kg_range range;
    bool checked;
    snap_record_fn *fn;
    void *ctx;
    int64_t n;
    char why[512]; /* stash_errmsg() is per thread */
} walk_half;

static void *walk_half_main(void *arg)
{
    walk_half *h = arg;
    h->n = walk_range(h->v, h->range, h->checked, h->fn, h->ctx);
    if (h->n < 0) snprintf(h->why, sizeof h->why, "%s", stash_errmsg());
    return NULL;
}

/* walk_range with the upper half of the key groups in a second thread, when
 * there are enough bytes to be worth one. fn must be safe to call for
 * different key groups at once (checks are; a restore's inserts are, each
 * key group having one writer). An error of the lower half wins. */
static int64_t walk_range_split(const ckpt_view *v, stash_kg_range range, bool checked,
                                snap_record_fn *fn, void *ctx)
{
    uint32_t n = range.last - range.first + 1;
    pthread_t t;
    walk_half hi = {v, {range.first + n / 2, range.last}, checked, fn, ctx, 0, ""};
    if (n < 2 || v->files[0].len < SPLIT_MIN_BYTES || sysconf(_SC_NPROCESSORS_ONLN) < 2 ||
        pthread_create(&t, NULL, walk_half_main, &hi) != 0)
        return walk_range(v, range, checked, fn, ctx);
    int64_t lo = walk_range(v, (stash_kg_range){range.first, hi.range.first - 1}, checked, fn, ctx);
    char why[512];
    if (lo < 0) snprintf(why, sizeof why, "%s", stash_errmsg());
    pthread_join(t, NULL);
    if (lo < 0) return shm_fail((int)lo, "%s", why);
    if (hi.n < 0) return shm_fail((int)hi.n, "%s", hi.why);
    return lo + hi.n;
}

int64_t ckpt_view_walk(const ckpt_view *v, stash_kg_range range, snap_record_fn *fn, void *ctx)
{
    return fn ? walk_range(v, range, false, fn, ctx)
              : walk_range_split(v, range, false, NULL, NULL);
}

/* Registers the checkpoint's states in the arena and maps their ids. */
static int map_states(stash_arena *a, const ckpt_view *v, uint16_t *ids, snap_id_map *map)
{
    memset(ids, 0, (SHM_CATALOG_SIZE + 1) * sizeof *ids);
    for (uint32_t i = 0; i < v->nstates; i++) {
        ckpt_state s = ckpt_view_state(v, i);
        int id = shm_catalog_register(a, s.name, s.kind, s.options);
        if (id < 0) return id;
        ids[s.id] = (uint16_t)id;
    }
    *map = (snap_id_map){ids, SHM_CATALOG_SIZE + 1};
    return 0;
}

/* Restores an opened checkpoint after checking all of it that the range
 * needs, and closes it. */
/* Copies the view's operator state into out, its state ids mapped. */
static int copy_opstate(const ckpt_view *v, const snap_id_map *map, ckpt_restored *out)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < v->op_parallelism; i++) total += v->op_blobs[i].len;
    out->op_blobs = calloc(v->op_parallelism ? v->op_parallelism : 1, sizeof *out->op_blobs);
    out->op_mem = malloc(total ? total : 1);
    if (!out->op_blobs || !out->op_mem) return shm_fail(-ENOMEM, "out of memory");
    uint8_t *p = out->op_mem;
    int rc = 0;
    for (uint32_t i = 0; i < v->op_parallelism && rc == 0; i++) {
        uint64_t len = v->op_blobs[i].len;
        if (len) memcpy(p, v->op_blobs[i].data, len);
        char what[4200];
        snprintf(what, sizeof what, "%s: operator state of worker %u", v->meta_path, i);
        rc = opstate_remap(p, len, map->ids, map->n, what);
        out->op_blobs[i] = (ckpt_blob){p, len};
        p += len;
    }
    out->op_parallelism = v->op_parallelism;
    return rc;
}

void ckpt_restored_free(ckpt_restored *r)
{
    free(r->op_blobs);
    free(r->op_mem);
    r->op_blobs = NULL;
    r->op_mem = NULL;
    r->op_parallelism = 0;
}

static int restore_view(stash_arena *a, ckpt_view *v, stash_kg_range range, bool *applying,
                        ckpt_prepare_fn *prepare, void *ctx, ckpt_restored *out)
{
    uint64_t *records = &out->records;
    int64_t n = 0;
    if (v->max_parallelism != a->hdr->max_parallelism)
        n = shm_fail(STASH_ECORRUPT, "%s: a checkpoint of %u key groups for an arena of %u",
                     v->meta_path, v->max_parallelism, a->hdr->max_parallelism);
    if (n == 0) n = ckpt_view_walk(v, range, NULL, NULL);
    uint16_t ids[SHM_CATALOG_SIZE + 1];
    snap_id_map map;
    if (n >= 0) n = map_states(a, v, ids, &map);
    ckpt_restored_free(out);
    if (n >= 0) n = copy_opstate(v, &map, out);
    snap_restorer to = {a, &map};
    /* Size each key group's table for what its blocks hold: no rehash then. */
    for (uint32_t kg = range.first; n >= 0 && kg <= range.last; kg++) {
        uint64_t held = 0;
        for (uint32_t f = 0; f < v->nfiles; f++) {
            md_extent e;
            snap_block_hdr h;
            memcpy(&e, v->files[f].extents + kg * sizeof e, sizeof e);
            memcpy(&h, v->files[f].data + e.offset, sizeof h); /* checked by the walk above */
            held += h.records;
        }
        n = shm_table_reserve(a, kg, held);
    }
    if (n >= 0) {
        /* From here a failure (the arena full) leaves part of the checkpoint
         * in the arena: no older checkpoint may be restored over it. */
        *applying = true;
        if (prepare) n = prepare(ctx);
        if (n >= 0) n = walk_range_split(v, range, true, snap_restore_record, &to);
    }
    if (n >= 0) *records = (uint64_t)n;
    ckpt_view_close(v);
    return n < 0 ? (int)n : 0;
}

static int restore_one(stash_arena *a, const char *dir, uint64_t id, stash_kg_range range,
                       ioe_engine *e, bool *applying, ckpt_prepare_fn *prepare, void *ctx,
                       ckpt_restored *out)
{
    ckpt_view v;
    int rc = ckpt_view_open(dir, id, e, &v);
    return rc ? rc : restore_view(a, &v, range, applying, prepare, ctx, out);
}

int ckpt_restore_path(stash_arena *a, const char *path, stash_kg_range range, ioe_engine *e,
                      ckpt_restored *out)
{
    ckpt_view v;
    memset(out, 0, sizeof *out);
    int rc = ckpt_view_open_path(path, e, &v);
    if (rc) return rc;
    out->id = v.id;
    bool applying = false;
    rc = restore_view(a, &v, range, &applying, NULL, NULL, out);
    if (rc) ckpt_restored_free(out);
    return rc;
}

int ckpt_list(const char *dir, uint64_t **ids)
{
    DIR *d = opendir(dir);
    if (!d) return shm_fail(-errno, "%s: cannot open: %s", dir, strerror(errno));
    size_t n = 0, cap = 0;
    *ids = NULL;
    for (struct dirent *de; (de = readdir(d));) {
        unsigned long long id;
        char tail;
        if (sscanf(de->d_name, "chk-%llu%c", &id, &tail) != 1 || id == 0) continue;
        if (n == cap) {
            uint64_t *grown = realloc(*ids, (cap = cap ? cap * 2 : 16) * sizeof **ids);
            if (!grown) break;
            *ids = grown;
        }
        (*ids)[n++] = id;
    }
    closedir(d);
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && (*ids)[j - 1] < (*ids)[j]; j--) {
            uint64_t t = (*ids)[j];
            (*ids)[j] = (*ids)[j - 1];
            (*ids)[j - 1] = t;
        }
    return (int)n;
}

static bool has_metadata(const char *dir, uint64_t id)
{
    char meta[4096];
    return path_of(meta, "%s/chk-%llu/_metadata", dir, (unsigned long long)id) == 0 &&
           access(meta, F_OK) == 0;
}

int ckpt_path_info(const char *path, ioe_engine *e, uint64_t *id, uint32_t *max_parallelism)
{
    ckpt_view v;
    int rc = open_view(path, e, &v, false);
    if (rc == 0) {
        *id = v.id;
        *max_parallelism = v.max_parallelism;
        ckpt_view_close(&v);
    }
    return rc;
}

int ckpt_newest(const char *dir, ioe_engine *e, uint64_t *id, uint32_t *max_parallelism)
{
    uint64_t *ids;
    int n = ckpt_list(dir, &ids), rc = -ENOENT;
    for (int i = 0; i < n && rc; i++) {
        char path[4096];
        ckpt_view v;
        if (!has_metadata(dir, ids[i]) ||
            path_of(path, "%s/chk-%llu", dir, (unsigned long long)ids[i]) < 0 ||
            open_view(path, e, &v, false) < 0)
            continue;
        *id = ids[i];
        *max_parallelism = v.max_parallelism;
        ckpt_view_close(&v);
        rc = 0;
    }
    if (n >= 0) free(ids);
    return n < 0 ? n : rc;
}

int ckpt_restore(stash_arena *a, const char *dir, uint64_t id, stash_kg_range range, ioe_engine *e,
                 ckpt_restored *out)
{
    return ckpt_restore_prepared(a, dir, id, range, e, NULL, NULL, out);
}

int ckpt_restore_prepared(stash_arena *a, const char *dir, uint64_t id, stash_kg_range range,
                          ioe_engine *e, ckpt_prepare_fn *prepare, void *ctx, ckpt_restored *out)
{
    memset(out, 0, sizeof *out);
    bool applying = false;
    int rc;
    if (id) {
        out->id = id;
        rc = restore_one(a, dir, id, range, e, &applying, prepare, ctx, out);
        if (rc) ckpt_restored_free(out);
        return rc;
    }
    uint64_t *ids;
    int n = ckpt_list(dir, &ids);
    if (n == -ENOENT) return shm_fail(n, "%s: no complete checkpoint: no such directory", dir);
    if (n < 0) return n;
    rc = shm_fail(-ENOENT, "%s: no complete checkpoint", dir);
    for (int i = 0; i < n; i++) {
        /* Without _metadata a checkpoint does not exist: not a fallback. */
        if (!has_metadata(dir, ids[i])) continue;
        rc = restore_one(a, dir, ids[i], range, e, &applying, prepare, ctx, out);
        if (rc == 0) {
            out->id = ids[i];
            break;
        }
        char why[sizeof out->why];
        snprintf(why, sizeof why, "%s", stash_errmsg());
        if (applying) {
            rc = shm_fail(rc,
                          "%s: restoring checkpoint %llu failed part-way (%s): the arena "
                          "holds part of it",
                          dir, (unsigned long long)ids[i], why);
            break;
        }
        if (out->skipped++ == 0) memcpy(out->why, why, sizeof why);
    }
    if (rc && out->skipped)
        rc = shm_fail(rc, "%s: no checkpoint restores; the newest failed: %s", dir, out->why);
    if (rc) ckpt_restored_free(out);
    free(ids);
    return rc;
}

/* Removes the files of DIR/shared/ that no remaining checkpoint names. */
static void remove_unreferenced(const char *dir, const uint64_t *ids, int n, ioe_engine *e)
{
    char shared[4096], path[4096];
    if (path_of(shared, "%s/%s", dir, SHARED_DIR) < 0) return;
    DIR *d = opendir(shared);
    if (!d) return;
    ckpt_view *views = calloc((size_t)n + 1, sizeof *views);
    bool *open = calloc((size_t)n + 1, sizeof *open);
    for (int i = 0; views && open && i < n; i++)
        open[i] = path_of(path, "%s/chk-%llu", dir, (unsigned long long)ids[i]) == 0 &&
                  open_view(path, e, &views[i], false) == 0;
    for (struct dirent *de; views && open && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        bool used = false;
        for (int i = 0; i < n && !used; i++)
            for (uint32_t f = 0; open[i] && f < views[i].nfiles && !used; f++)
                used = strcmp(views[i].files[f].name + sizeof SHARED_DIR, de->d_name) == 0;
        if (!used && path_of(path, "%s/%s", shared, de->d_name) == 0) unlink(path);
    }
    for (int i = 0; views && open && i < n; i++)
        if (open[i]) ckpt_view_close(&views[i]);
    free(views);
    free(open);
    closedir(d);
    sync_dir(shared);
}

int ckpt_retain(const char *dir, unsigned keep, ioe_engine *e)
{
    uint64_t *ids;
    int n = ckpt_list(dir, &ids);
    if (n < 0) return n;
    unsigned complete = 0;
    int kept = 0;
    char path[4096];
    for (int i = 0; i < n; i++) {
        bool whole = has_metadata(dir, ids[i]);
        /* A partial checkpoint newer than every complete one may be in the making. */
        bool keep_it = whole ? ++complete <= keep : complete == 0;
        if (keep_it) {
            ids[kept++] = ids[i];
        } else if (path_of(path, "%s/chk-%llu", dir, (unsigned long long)ids[i]) == 0) {
            remove_checkpoint(path);
        }
    }
    remove_unreferenced(dir, ids, kept, e);
    free(ids);
    return sync_dir(dir);
}
