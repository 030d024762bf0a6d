/* SPDX-License-Identifier: MIT */
/*
 * ckpt.c: writing checkpoints into a directory. The writer serializes every
 * key group into one data file through the I/O engine, makes it durable,
 * then commits by renaming a synced _metadata into place: a checkpoint
 * without a valid _metadata does not exist. Retention removes what the
 * newest few no longer need. Reading is in ckpt_read.c, restoring in
 * ckpt_restore.c.
 */
#define _GNU_SOURCE /* O_DIRECT, sched_getaffinity */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/checkpoint/ckpt.h"

/* A checkpoint's files are new: never one that is there already, nor one a
 * symbolic link in its place points to. */
#define NEW_FILE (O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW)

/* Writes len bytes to a new file name in dirfd (path in messages) and
 * makes them durable. */
static int write_durable(ioe_engine *e, int dirfd, const char *name, const char *path, mode_t mode,
                         const void *data, size_t len)
{
    ioe_file *f;
    int rc = ioe_file_openat(e, dirfd, name, path, NEW_FILE, mode, &f);
    if (rc < 0) return shm_fail(rc, "%s: cannot create: %s", path, stash_strerror(rc));
    for (size_t off = 0; off < len && rc == 0;) {
        size_t n = len - off < CKPT_CHUNK ? len - off : CKPT_CHUNK;
        int q = ioe_write(f, (const uint8_t *)data + off, n, off, NULL);
        if (q == -EBUSY) {
            rc = ckpt_drain(e, ioe_outstanding(e) - 1, 0);
            continue;
        }
        if (q < 0) rc = shm_fail(q, "write %s at offset %zu: %s", path, off, stash_strerror(q));
        off += n;
    }
    if (rc == 0) {
        while ((rc = ioe_fsync(f, NULL)) == -EBUSY) rc = ckpt_drain(e, ioe_outstanding(e) - 1, 0);
        if (rc < 0) rc = shm_fail(rc, "fsync %s: %s", path, stash_strerror(rc));
    }
    rc = ckpt_drain(e, 0, rc);
    ioe_file_close(f);
    return rc;
}

/* A data file written while it is serialized, with O_DIRECT where the
 * filesystem has it, so the disk works while the next key groups are
 * serialized (buffered writes would wait for the fsync). A big block is
 * written from the buffer it was built in, at the next aligned offset; small
 * ones are gathered into the engine's staging buffers. The zeros between
 * blocks belong to no extent. Only the thread that opened the stream submits
 * and reaps. */
#define BLOCK_DIRECT_MIN (256u << 10) /* a block this big is written where it was built */
#define FILE_GROWTH (16u << 20)       /* the least the file's length is set ahead by */

/* A block built by a serializing thread, written from where it lies. */
enum { BLOCK_FREE, BLOCK_READY, BLOCK_FLIGHT };
typedef struct block_buf {
    snap_buf b;
    int64_t n;     /* its records, or the error that stopped it */
    int state;     /* BLOCK_*, under the stream's lock when another thread waits */
    char why[512]; /* the error, built in the thread that failed */
} block_buf;

typedef struct stream {
    ioe_engine *e;
    ioe_file *f;
    const char *path;
    uint64_t off;   /* where buf goes in the file */
    uint64_t end;   /* the end of the data: the file is cut there */
    uint64_t sized; /* the file's length, set ahead of direct writes */
    uint8_t *buf;   /* the staging buffer being filled, or NULL */
    size_t fill;
    size_t cap;
    uint32_t align;        /* O_DIRECT: the file's offset and length alignment; 1 buffered */
    int rc;                /* the first failure */
    const ckpt_copy *copy; /* the file's bytes also go there, in order, or NULL */
    size_t pad;            /* zeros owed to copy before its next bytes */
    pthread_mutex_t *mu;   /* with cv: wakes a thread waiting for one of its blocks, or NULL */
    pthread_cond_t *cv;
} stream;

/* A block's write carries its buffer's address with the low bit set;
 * staging buffers are page-aligned. */
static void *block_tag(block_buf *bb)
{
    return (char *)bb + 1;
}

static void block_set(stream *s, block_buf *bb, int state)
{
    if (s->mu) pthread_mutex_lock(s->mu);
    bb->state = state;
    if (s->cv) pthread_cond_broadcast(s->cv);
    if (s->mu) pthread_mutex_unlock(s->mu);
}

/* Reaps at least min completions, giving their buffers back. */
static void stream_reap(stream *s, unsigned min)
{
    ioe_cqe c[16];
    int n = ioe_reap(s->e, c, 16, min);
    if (n < 0 && !s->rc) s->rc = shm_fail(n, "waiting for I/O: %s", stash_strerror(n));
    for (int i = 0; i < n; i++) {
        if ((uintptr_t)c[i].user & 1)
            block_set(s, (block_buf *)((char *)c[i].user - 1), BLOCK_FREE);
        else if (c[i].user)
            ioe_buf_put(s->e, c[i].user);
        if (c[i].res >= 0 || s->rc) continue;
        char what[300];
        ioe_cqe_describe(&c[i], what, sizeof what);
        s->rc = shm_fail(c[i].res, "%s", what);
    }
}

static int stream_open(stream *s, ioe_engine *e, int dirfd, const char *name, const char *path,
                       mode_t mode)
{
    ioe_info info;
    ioe_engine_info(e, &info);
    *s = (stream){.e = e, .path = path, .cap = info.buf_size, .align = 1};
    int rc = ioe_file_openat(e, dirfd, name, path, NEW_FILE | O_DIRECT, mode, &s->f);
    if (rc == 0) {
        ioe_align al = ioe_file_align(s->f);
        /* Writes go whole filesystem blocks at a time, even where the device
         * takes less: the filesystem sends a write of part of a block through
         * a slow path that waits for every other write. Staging buffers are
         * page-aligned and a multiple of the page in size. */
        struct stat st;
        uint32_t align = al.offset;
        if (fstat(ioe_file_fd(s->f), &st) == 0 && st.st_blksize > align)
            align = (uint32_t)st.st_blksize;
        if (al.mem <= 4096 && align <= 4096 && s->cap % align == 0) {
            s->align = align;
            return 0;
        }
        ioe_file_close(s->f);
    } else if (rc != -EINVAL) {
        return shm_fail(rc, "%s: cannot create: %s", path, stash_strerror(rc));
    }
    /* A filesystem without direct I/O (tmpfs), which may have created the
     * file before refusing the flag: buffered writes to it made anew. */
    unlinkat(dirfd, name, 0);
    rc = ioe_file_openat(e, dirfd, name, path, NEW_FILE, mode, &s->f);
    return rc < 0 ? shm_fail(rc, "%s: cannot create: %s", path, stash_strerror(rc)) : 0;
}

/* Submits a write of len bytes at off, retrying while the ring is full. A
 * direct write past the file's end, or into blocks not yet allocated, would
 * go to a kernel worker and wait for the writes before it, so the file's
 * blocks are allocated ahead of the writes and cut back when the stream
 * closes. */
static int stream_write(stream *s, const void *data, size_t len, uint64_t off, void *user)
{
    if (s->align > 1 && off + len > s->sized && !s->rc) {
        uint64_t grow = s->sized / 2 > FILE_GROWTH ? s->sized / 2 : FILE_GROWTH;
        uint64_t size = off + len > s->sized + grow ? off + len : s->sized + grow;
        int fd = ioe_file_fd(s->f);
        int rc = fallocate(fd, 0, 0, (off_t)size) < 0 ? errno : 0;
        /* A disk short of the step ahead may still hold what this write needs. */
        if (rc == ENOSPC && size > off + len) {
            size = off + len;
            rc = fallocate(fd, 0, 0, (off_t)size) < 0 ? errno : 0;
        }
        if (rc == EOPNOTSUPP) rc = ftruncate(fd, (off_t)size) < 0 ? errno : 0;
        if (rc)
            s->rc = shm_fail(-rc, "%s: cannot extend to %llu bytes: %s", s->path,
                             (unsigned long long)size, strerror(rc));
        s->sized = size;
    }
    while (!s->rc) {
        int q = ioe_write(s->f, data, len, off, user);
        if (q == 0) return 0;
        if (q == -EBUSY) {
            stream_reap(s, 1);
            continue;
        }
        s->rc = shm_fail(q, "write %s at offset %llu: %s", s->path, (unsigned long long)off,
                         stash_strerror(q));
    }
    return s->rc;
}

/* Gives the copy n bytes at data, followed by pad zeros that only bytes
 * after them give it (the file is cut after its last data). */
static int stream_copy(stream *s, const void *data, size_t n, size_t pad)
{
    static const uint8_t zeros[4096];
    for (size_t k; !s->rc && s->pad; s->pad -= k) {
        k = s->pad < sizeof zeros ? s->pad : sizeof zeros;
        s->rc = s->copy->put(s->copy->ctx, zeros, k);
    }
    if (!s->rc) s->rc = s->copy->put(s->copy->ctx, data, n);
    s->pad = pad;
    return s->rc;
}

/* Writes the staging buffer, padded with zeros to the alignment; the next
 * bytes go after the padding. */
static void stream_submit(stream *s)
{
    if (!s->fill || s->rc) return;
    size_t len = (s->fill + s->align - 1) / s->align * s->align;
    if (len > s->fill) memset(s->buf + s->fill, 0, len - s->fill);
    if (s->copy && stream_copy(s, s->buf, s->fill, len - s->fill) < 0) return;
    if (stream_write(s, s->buf, len, s->off, s->buf) < 0) return;
    s->off += len;
    s->buf = NULL;
    s->fill = 0;
}

/* Appends n bytes through the staging buffers. Returns 0 or the stream's
 * first failure. */
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
        s->end = s->off + s->fill;
        if (s->fill == s->cap) stream_submit(s);
    }
    return s->rc;
}

/* Appends a block: a big one from its own buffer (which is in flight until
 * a reap frees it), a small one copied. Sets *at to where it lies. */
static int stream_block(stream *s, block_buf *bb, uint64_t *at)
{
    size_t len = bb->b.len;
    if (len < BLOCK_DIRECT_MIN || !bb->b.aligned) {
        *at = s->off + s->fill;
        int rc = stream_put(s, bb->b.data, len);
        block_set(s, bb, BLOCK_FREE);
        return rc;
    }
    stream_submit(s);
    size_t padded = (len + s->align - 1) / s->align * s->align; /* within cap: 4096-multiple */
    memset(bb->b.data + len, 0, padded - len);
    if (s->copy && stream_copy(s, bb->b.data, len, padded - len) < 0) return s->rc;
    *at = s->off;
    block_set(s, bb, BLOCK_FLIGHT);
    if (stream_write(s, bb->b.data, padded, s->off, block_tag(bb)) < 0) {
        block_set(s, bb, BLOCK_FREE);
        return s->rc;
    }
    s->off += padded;
    s->end = *at + len;
    return 0;
}

/* Waits until the thread's own block buffer is written. */
static void stream_wait_free(stream *s, block_buf *bb)
{
    while (bb->state == BLOCK_FLIGHT && ioe_outstanding(s->e)) stream_reap(s, 1);
}

/* Writes what is left, cuts the file to its data, makes it durable (or,
 * after a failure, only waits for what is in flight) and closes it. Returns
 * the first failure. */
static int stream_close(stream *s)
{
    stream_submit(s);
    if (s->buf) ioe_buf_put(s->e, s->buf);
    if (s->align > 1 && s->sized != s->end) {
        while (ioe_outstanding(s->e)) stream_reap(s, 1);
        if (!s->rc && ftruncate(ioe_file_fd(s->f), (off_t)s->end) < 0)
            s->rc = shm_fail(-errno, "%s: cannot cut to %llu bytes: %s", s->path,
                             (unsigned long long)s->end, strerror(errno));
    }
    int rc = s->rc;
    while (!s->rc && (rc = ioe_fsync(s->f, NULL)) == -EBUSY) stream_reap(s, 1);
    if (rc < 0 && !s->rc) s->rc = shm_fail(rc, "fsync %s: %s", s->path, stash_strerror(rc));
    while (ioe_outstanding(s->e)) stream_reap(s, 1);
    ioe_file_close(s->f);
    return s->rc;
}

void ckpt_remove_checkpoint(const shm_dir *dir, const char *name)
{
    shm_dir_remove(dir, name, 0);
}

/* ---- writing ---------------------------------------------------------------- */

/* What the new metadata lists: the base's files (for a delta), then its own. */
typedef struct file_list {
    uint32_t n;
    md_file files[CKPT_MAX_FILES];
    const uint8_t *extents[CKPT_MAX_FILES]; /* P extents each */
} file_list;

static int build_metadata(const ckpt_source *src, const ckpt_opts *o, const file_list *fl,
                          snap_buf *md)
{
    uint32_t maxp = src->max_parallelism, nstates = src->nstates;
    size_t bytes = sizeof(md_header) + nstates * sizeof(ckpt_state) +
                   fl->n * (sizeof(md_file) + maxp * sizeof(md_extent)) + 8 +
                   (size_t)o->op_parallelism * 8 + 4;
    for (uint32_t i = 0; i < o->op_parallelism; i++) bytes += ckpt_pad8(o->op_blobs[i].len);
    if (shm_reserve(&md->data, &md->cap, bytes) < 0) return -ENOMEM;
    md_header h = {.format_version = CKPT_FORMAT_VERSION,
                   .id = o->id,
                   .created_ns = shm_now_ns(),
                   .base_id = o->base_id,
                   .backend = src->backend,
                   .max_parallelism = maxp,
                   .nstates = nstates,
                   .nfiles = fl->n};
    memcpy(h.magic, CKPT_MAGIC, sizeof h.magic);
    uint8_t *p = md->data;
    memcpy(p, &h, sizeof h);
    p += sizeof h;
    memcpy(p, src->states, nstates * sizeof(ckpt_state));
    p += nstates * sizeof(ckpt_state);
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
        memset(p + len, 0, ckpt_pad8(len) - len);
        p += ckpt_pad8(len);
    }
    uint32_t crc = snap_crc32c(0, md->data, (size_t)(p - md->data));
    memcpy(p, &crc, 4);
    md->len = bytes;
    return 0;
}

/* An arena's key groups as a checkpoint's source: each as of its pin. */
typedef struct arena_source {
    stash_arena *a;
    const uint32_t *pins;
    const ckpt_opts *o;
} arena_source;

/* Whether key group kg was not whole in the arena when version pin was
 * pinned: a lazy restore has yet to bring it, or finished after the pin. */
static bool restored_after(const stash_arena *a, uint32_t kg, uint32_t pin)
{
    const shm_table *t = &a->tables[kg];
    return atomic_load(&t->lazy) != 0 || atomic_load(&t->lazy_done_at) > pin;
}

static int64_t serialize_kg(void *ctx, uint32_t kg, unsigned thread, snap_buf *block)
{
    const arena_source *as = ctx;
    stash_arena *a = as->a;
    const uint32_t *pins = as->pins;
    const ckpt_opts *o = as->o;
    uint32_t slot = thread ? o->reader_slot2 : o->reader_slot;
    /* Its owner has not written it: the restore's block is its state. */
    if (o->lazy_from && !o->base_id && restored_after(a, kg, pins[kg]))
        return ckpt_block_copy(o->lazy_from, kg, block);
    if (o->reader) shm_table_walk_enter(a, kg, slot);
    store_cut cut = {pins[kg], o->base_id ? o->base_pins[kg] : 0, o->base_id};
    int64_t n = snap_write_kg(o->store, kg, &cut, o->lz4, o->filter, block);
    if (o->reader) shm_table_walk_exit(a, kg, slot);
    return n;
}

#define BLOCK_BUFS 3 /* blocks a serializing thread may have built or in flight */

/* A second thread serializing the odd key groups into a ring of block
 * buffers, which the caller writes in order with its own even ones. */
typedef struct helper {
    const ckpt_source *src;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    block_buf bufs[BLOCK_BUFS];
    bool stop;
} helper;

static void *helper_main(void *arg)
{
    helper *h = arg;
    unsigned seq = 0;
    for (uint32_t kg = 1; kg < h->src->max_parallelism; kg += 2, seq++) {
        block_buf *bb = &h->bufs[seq % BLOCK_BUFS];
        pthread_mutex_lock(&h->mu);
        while (bb->state != BLOCK_FREE && !h->stop) pthread_cond_wait(&h->cv, &h->mu);
        bool stop = h->stop;
        pthread_mutex_unlock(&h->mu);
        if (stop) break;
        bb->b.len = 0;
        int64_t n = h->src->block(h->src->ctx, kg, 1, &bb->b);
        if (n < 0) snprintf(bb->why, sizeof bb->why, "%s", stash_errmsg());
        pthread_mutex_lock(&h->mu);
        bb->n = n;
        bb->state = BLOCK_READY;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        if (n < 0) break;
    }
    return NULL;
}

/* Streams key group kg's block, recording where it lies. */
static int emit(const ckpt_opts *o, stream *out, uint32_t kg, block_buf *bb, md_extent *ext,
                uint64_t *records, uint32_t *crc)
{
    if (bb->n < 0) {
        block_set(out, bb, BLOCK_FREE);
        return (int)bb->n;
    }
    *records += (uint64_t)bb->n;
    uint64_t end = out->end + bb->b.len; /* at least where it ends */
    if (o->cap_bytes && end > o->cap_bytes) {
        block_set(out, bb, BLOCK_FREE);
        return shm_fail(-EFBIG,
                        "%s: checkpoint %llu holds more than the storage's cap of %llu bytes",
                        out->path, (unsigned long long)o->id, (unsigned long long)o->cap_bytes);
    }
    ext[kg].size = bb->b.len;
    /* Blocks go in key-group order: the file's checksum in the metadata. */
    *crc = snap_crc32c(*crc, bb->b.data, bb->b.len);
    return stream_block(out, bb, &ext[kg].offset);
}

/* The processors this process may run on that busy workers leave. */
static long cores_free(uint32_t busy)
{
    cpu_set_t set;
    long n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                         : sysconf(_SC_NPROCESSORS_ONLN);
    return n > (long)busy ? n - (long)busy : 0;
}

/* Waits for the helper's next block, reaping writes meanwhile: a write's
 * completion may be what frees the helper's next buffer. */
static void await_block(helper *h, stream *out, block_buf *bb)
{
    pthread_mutex_lock(&h->mu);
    while (bb->state != BLOCK_READY) {
        if (ioe_outstanding(out->e)) {
            pthread_mutex_unlock(&h->mu);
            stream_reap(out, 1);
            pthread_mutex_lock(&h->mu);
        } else {
            pthread_cond_wait(&h->cv, &h->mu);
        }
    }
    pthread_mutex_unlock(&h->mu);
}

/* Serializes every key group (or its changes since the base) into the
 * stream, one block at a time, and records where each block lies. A writer
 * that owns none of the key groups announces itself for each walk. With two
 * processors beside those the busy workers take (and, for such a writer, a
 * second reader slot), a second thread serializes every other key group:
 * a worker that shares its core with a serializing thread loses more than
 * the checkpoint gains. */
static int serialize(const ckpt_source *src, const ckpt_opts *o, stream *out, md_extent *ext,
                     uint64_t *records, uint32_t *crc)
{
    block_buf own[BLOCK_BUFS];
    helper h = {.src = src};
    for (int i = 0; i < BLOCK_BUFS; i++) {
        own[i] = (block_buf){.b.aligned = true};
        h.bufs[i] = (block_buf){.b.aligned = true};
    }
    int rc = 0;
    uint32_t maxp = src->max_parallelism;
    *records = 0;
    pthread_t t;
    bool two = maxp > 1 && src->two_threads && cores_free(o->busy_workers) > 1;
    if (two) {
        pthread_mutex_init(&h.mu, NULL);
        pthread_cond_init(&h.cv, NULL);
        two = pthread_create(&t, NULL, helper_main, &h) == 0;
        if (two) {
            out->mu = &h.mu;
            out->cv = &h.cv;
        } else {
            pthread_mutex_destroy(&h.mu);
            pthread_cond_destroy(&h.cv);
        }
    }
    unsigned mine = 0, theirs = 0;
    for (uint32_t kg = 0; kg < maxp && rc == 0; kg++) {
        block_buf *bb;
        if (!two || kg % 2 == 0) {
            bb = &own[mine++ % BLOCK_BUFS];
            /* Only this thread reaps: the helper's written buffers are
             * free only once it has. */
            if (ioe_outstanding(out->e)) stream_reap(out, 0);
            stream_wait_free(out, bb);
            bb->b.len = 0;
            bb->n = src->block(src->ctx, kg, 0, &bb->b);
        } else {
            bb = &h.bufs[theirs++ % BLOCK_BUFS];
            await_block(&h, out, bb);
            if (bb->n < 0) shm_fail((int)bb->n, "%s", bb->why);
        }
        rc = emit(o, out, kg, bb, ext, records, crc);
        if (rc == 0 && o->serialized) o->serialized(o->serialized_ctx, kg);
    }
    if (two) {
        pthread_mutex_lock(&h.mu);
        h.stop = true;
        pthread_cond_broadcast(&h.cv);
        pthread_mutex_unlock(&h.mu);
        pthread_join(t, NULL);
    }
    /* The blocks in flight are written before their buffers go. */
    while (ioe_outstanding(out->e)) stream_reap(out, 1);
    out->mu = NULL;
    out->cv = NULL;
    if (two) {
        pthread_mutex_destroy(&h.mu);
        pthread_cond_destroy(&h.cv);
    }
    for (int i = 0; i < BLOCK_BUFS; i++) {
        snap_buf_free(&own[i].b);
        snap_buf_free(&h.bufs[i].b);
    }
    return rc;
}

/* Lists the base checkpoint's files, after checking each still holds what
 * its metadata says, then the new one. The base view stays open for its
 * extents. */
static int list_files(uint32_t maxp, const ckpt_opts *o, const char *own, const md_extent *ext,
                      uint32_t crc, ckpt_view *base, file_list *fl)
{
    fl->n = 0;
    if (o->base_id) {
        char path[4096], name[64];
        snprintf(name, sizeof name, "chk-%llu", (unsigned long long)o->base_id);
        int rc = ckpt_path_of(path, "%s/%s", o->dir->path, name);
        if (rc == 0) rc = ckpt_open_view_at(o->dir->fd, name, path, o->engine, base, false);
        if (rc) return rc;
        if (base->id != o->base_id || base->max_parallelism != maxp)
            return shm_fail(STASH_ECORRUPT, "%s: not the base checkpoint %llu of this arena",
                            base->meta_path, (unsigned long long)o->base_id);
        if (base->nfiles >= CKPT_MAX_FILES)
            return shm_fail(-E2BIG, "%s: a chain of %u files: take a full checkpoint",
                            base->meta_path, base->nfiles);
        /* The files it will depend on are still what was written: a delta
         * over a damaged file would never restore. */
        if ((rc = ckpt_view_check_files(base, o->engine)) != 0) {
            char why[512];
            snprintf(why, sizeof why, "%s", stash_errmsg());
            return shm_fail(rc, "checkpoint %llu would depend on a damaged file: %s",
                            (unsigned long long)o->id, why);
        }
        for (uint32_t f = 0; f < base->nfiles; f++) {
            md_file m = {.first_kg = 0,
                         .last_kg = maxp - 1,
                         .flags = base->files[f].flags,
                         .reserved = base->files[f].crc};
            memcpy(m.name, base->files[f].name, sizeof m.name);
            fl->files[fl->n] = m;
            fl->extents[fl->n++] = base->files[f].extents;
        }
    }
    md_file m = {.first_kg = 0,
                 .last_kg = maxp - 1,
                 .flags = (o->base_id ? CKPT_FILE_DELTA : 0) | CKPT_FILE_CRC,
                 .reserved = crc};
    snprintf(m.name, sizeof m.name, "%s", own);
    fl->files[fl->n] = m;
    fl->extents[fl->n++] = (const uint8_t *)ext;
    return 0;
}

/* The modes of a checkpoint's directories and files: the owner's alone,
 * or also its group's (read) where the arena is its group's too. */
static mode_t dir_mode(bool group)
{
    return group ? 0750 : 0700;
}
static mode_t file_mode(bool group)
{
    return group ? 0640 : 0600;
}

int ckpt_dir_open(const char *path, bool group, shm_dir *out)
{
    int rc = shm_dir_open(path, SHM_DIR_OWN | SHM_DIR_CREATE | (group ? SHM_DIR_GROUP : 0), out);
    if (rc == -ENOTDIR)
        return shm_fail(rc, "%s: the checkpoint directory is not a directory", path);
    if (rc == 0 && (rc = shm_dir_probe(out)) != 0) shm_dir_close(out);
    return rc;
}

/* The directory a checkpoint is written in, made anew (never one there
 * already), and locked while it is written: whoever finds it partial and
 * can take the lock knows its writer is gone. */
static int make_checkpoint_dir(const ckpt_opts *o, const char *name, shm_dir *chk)
{
    if (mkdirat(o->dir->fd, name, dir_mode(o->group)) < 0)
        return shm_fail(-errno, "%s/%s: cannot create: %s", o->dir->path, name, strerror(errno));
    int rc = shm_dir_openat(o->dir, name, SHM_DIR_OWN | (o->group ? SHM_DIR_GROUP : 0), chk);
    if (rc == 0 && flock(chk->fd, LOCK_EX | LOCK_NB) < 0)
        rc = shm_fail(-errno, "%s: cannot lock: %s", chk->path, strerror(errno));
    /* The umask must not narrow what the group was given. */
    if (rc == 0) fchmod(chk->fd, dir_mode(o->group));
    return rc;
}

int ckpt_write_source(const ckpt_source *src, const ckpt_opts *o, ckpt_written *out)
{
    char name[64], path[4096], own[40];
    if (o->id == 0) return shm_fail(-EINVAL, "a checkpoint id is > 0");
    bool in_shared = o->incremental && !o->savepoint;
    if (o->base_id && (!in_shared || !o->base_pins))
        return shm_fail(-EINVAL,
                        "checkpoint %llu: a delta needs incremental mode and the base's "
                        "pins",
                        (unsigned long long)o->id);
    snprintf(name, sizeof name, "%s-%llu", o->savepoint ? "savepoint" : "chk",
             (unsigned long long)o->id);
    shm_dir chk = {.fd = -1}, shared = {.fd = -1};
    int rc =
        in_shared
            ? shm_dir_openat(o->dir, CKPT_SHARED_DIR,
                             SHM_DIR_OWN | SHM_DIR_CREATE | (o->group ? SHM_DIR_GROUP : 0), &shared)
            : 0;
    if (rc == 0) rc = make_checkpoint_dir(o, name, &chk);
    if (rc) {
        shm_dir_close(&shared);
        return rc;
    }
    /* The data file: the checkpoint's own, or shared/ID.dat beside it. */
    const shm_dir *data_dir = in_shared ? &shared : &chk;
    if (in_shared)
        snprintf(own, sizeof own, "%llu.dat", (unsigned long long)o->id);
    else
        snprintf(own, sizeof own, "%s", CKPT_DATA_FILE);

    uint32_t maxp = src->max_parallelism;
    snap_buf md = {0};
    ckpt_view base = {0};
    file_list fl;
    uint64_t records = 0, data_bytes = 0;
    uint32_t crc = 0;
    stream data;
    char listed[64];
    snprintf(listed, sizeof listed, "%s%s%s", in_shared ? CKPT_SHARED_DIR : "",
             in_shared ? "/" : "", own);
    md_extent *ext = calloc(maxp, sizeof *ext);
    rc = ext ? ckpt_path_of(path, "%s/%s", data_dir->path, own) : -ENOMEM;
    bool copying = false;
    if (rc == 0 && o->copy) rc = o->copy->open(o->copy->ctx, listed);
    copying = rc == 0 && o->copy;
    if (rc == 0) rc = stream_open(&data, o->engine, data_dir->fd, own, path, file_mode(o->group));
    if (rc == 0) {
        data.copy = o->copy;
        rc = serialize(src, o, &data, ext, &records, &crc);
        data_bytes = data.end;
        int closed = stream_close(&data);
        if (rc == 0) rc = closed;
    }
    if (copying) {
        int closed = o->copy->close(o->copy->ctx, rc == 0);
        if (rc == 0) rc = closed;
    }
    if (rc == 0) rc = list_files(maxp, o, listed, ext, crc, &base, &fl);
    if (rc == 0 && in_shared) rc = shm_dir_sync(&shared);
    if (rc == 0) rc = build_metadata(src, o, &fl, &md);
    if (rc == 0) rc = ckpt_path_of(path, "%s/_metadata.tmp", chk.path);
    if (rc == 0)
        rc = write_durable(o->engine, chk.fd, "_metadata.tmp", path, file_mode(o->group), md.data,
                           md.len);
    if (rc == 0 && renameat(chk.fd, "_metadata.tmp", chk.fd, "_metadata") < 0)
        rc = shm_fail(-errno, "rename %s: %s", path, strerror(errno));
    if (rc == 0) rc = shm_dir_sync(&chk);
    if (rc == 0) rc = shm_dir_sync(o->dir);
    if (rc) {
        ckpt_remove_checkpoint(o->dir, name);
        if (in_shared) unlinkat(shared.fd, own, 0);
    } else if (out) {
        *out = (ckpt_written){data_bytes, records};
    }
    ckpt_view_close(&base);
    shm_dir_close(&chk);
    shm_dir_close(&shared);
    free(ext);
    snap_buf_free(&md);
    return rc;
}

/* ---- savepoints moved into place ---- */

/* What follows a destination's name in the directory its savepoint is
 * written in beside it. */
#define WRITING ".writing-"

int ckpt_dest_open(const char *path, ckpt_dest *d)
{
    *d = (ckpt_dest){.parent = {.fd = -1}, .tmp = {.fd = -1}};
    char parent[4096], prefix[300];
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base || strcmp(base, ".") == 0 || strcmp(base, "..") == 0 || strlen(base) > 255)
        return shm_fail(-EINVAL, "%s: names no directory", path);
    int rc = ckpt_path_of(d->path, "%s", path);
    if (rc == 0)
        rc = ckpt_path_of(parent, "%.*s", slash ? (int)(slash - path) : 1,
                          !slash          ? "."
                          : slash == path ? "/"
                                          : path);
    snprintf(d->base, sizeof d->base, "%s", base);
    /* New entries alone are made in the parent, each exclusively: it may be
     * another's, as /tmp is, if no other user may move them. */
    if (rc == 0) rc = shm_dir_open(parent, SHM_DIR_PLACE, &d->parent);
    if (rc == -ENOENT) rc = shm_fail(-ENOENT, "%s: no directory %s to write it in", path, parent);
    struct stat st;
    if (rc == 0 && fstatat(d->parent.fd, base, &st, AT_SYMLINK_NOFOLLOW) == 0)
        rc = shm_fail(-EEXIST, "%s: exists already", path);
    snprintf(prefix, sizeof prefix, ".%s" WRITING, base);
    /* What writers of any destination here left when killed goes too. */
    if (rc == 0) shm_dir_remove_left(&d->parent, WRITING);
    if (rc == 0) rc = shm_dir_temp(&d->parent, prefix, &d->tmp);
    if (rc) ckpt_dest_close(d);
    return rc;
}

int ckpt_dest_place(ckpt_dest *d, uint64_t id)
{
    char made[64];
    snprintf(made, sizeof made, "savepoint-%llu", (unsigned long long)id);
    /* Never over what came there meanwhile. */
    int rc = renameat2(d->tmp.fd, made, d->parent.fd, d->base, RENAME_NOREPLACE) < 0
                 ? shm_fail(-errno, "rename %s/%s to %s: %s", d->tmp.path, made, d->path,
                            strerror(errno))
                 : 0;
    /* The rename durable too. */
    return rc ? rc : shm_dir_sync(&d->parent);
}

void ckpt_dest_close(ckpt_dest *d)
{
    shm_dir_temp_remove(&d->parent, &d->tmp);
    shm_dir_close(&d->parent);
}

/* ---- retention ---------------------------------------------------------------- */

/* Removes the files of DIR/shared/ that no remaining checkpoint names. */
/* Whether name is one stash writes in DIR/shared: digits, then ".dat". */
static bool shared_file_name(const char *name)
{
    size_t digits = strspn(name, "0123456789");
    return digits > 0 && strcmp(name + digits, ".dat") == 0;
}

static void remove_unreferenced(const shm_dir *dir, const uint64_t *ids, int n, ioe_engine *e)
{
    shm_dir shared;
    if (shm_dir_openat(dir, CKPT_SHARED_DIR, SHM_DIR_OWN | SHM_DIR_GROUP, &shared) != 0) return;
    DIR *d = shm_dir_list(&shared);
    ckpt_view *views = calloc((size_t)n + 1, sizeof *views);
    bool *open = calloc((size_t)n + 1, sizeof *open);
    for (int i = 0; d && views && open && i < n; i++)
        open[i] = ckpt_open_chk(dir, ids[i], e, &views[i], false) == 0;
    for (struct dirent *de; d && views && open && (de = readdir(d));) {
        /* Never a name stash did not write. */
        if (!shared_file_name(de->d_name)) continue;
        bool used = false;
        for (int i = 0; i < n && !used; i++)
            for (uint32_t f = 0; open[i] && f < views[i].nfiles && !used; f++)
                used = strcmp(views[i].files[f].name + sizeof CKPT_SHARED_DIR, de->d_name) == 0;
        if (!used) unlinkat(shared.fd, de->d_name, 0);
    }
    for (int i = 0; views && open && i < n; i++)
        if (open[i]) ckpt_view_close(&views[i]);
    free(views);
    free(open);
    if (d) closedir(d);
    shm_dir_sync(&shared);
    shm_dir_close(&shared);
}

/* Every checkpoint of ids[0 .. n-1] with a _metadata opens: else what one
 * refers to is unknown, and nothing may go. */
static int every_metadata_opens(const shm_dir *dir, const uint64_t *ids, int n, ioe_engine *e)
{
    for (int i = 0; i < n; i++) {
        ckpt_view v;
        if (!ckpt_has_metadata(dir, ids[i])) continue;
        int rc = ckpt_open_chk(dir, ids[i], e, &v, false);
        if (rc) return rc;
        ckpt_view_close(&v);
    }
    return 0;
}

int ckpt_retain(const shm_dir *dir, unsigned keep, ioe_engine *e)
{
    uint64_t *ids;
    int n = ckpt_list(dir, &ids);
    if (n < 0) return n;
    int rc = every_metadata_opens(dir, ids, n, e);
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", stash_errmsg());
        free(ids);
        return shm_fail(rc, "%s: retention removed nothing: %s", dir->path, why);
    }
    unsigned complete = 0;
    int kept = 0;
    for (int i = 0; i < n; i++) {
        bool whole = ckpt_has_metadata(dir, ids[i]);
        /* A partial checkpoint newer than every complete one may be in the making. */
        bool keep_it = whole ? ++complete <= keep : complete == 0;
        if (keep_it) {
            ids[kept++] = ids[i];
        } else {
            char name[64];
            snprintf(name, sizeof name, "chk-%llu", (unsigned long long)ids[i]);
            ckpt_remove_checkpoint(dir, name);
        }
    }
    remove_unreferenced(dir, ids, kept, e);
    free(ids);
    return shm_dir_sync(dir);
}

int ckpt_remove_abandoned(const shm_dir *dir)
{
    DIR *d = shm_dir_list(dir);
    if (!d) return shm_fail(-errno, "%s: cannot list: %s", dir->path, strerror(errno));
    int removed = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (strncmp(de->d_name, "savepoint-", 10) != 0) continue;
        shm_dir sp;
        struct stat st;
        if (shm_dir_openat(dir, de->d_name, SHM_DIR_OWN | SHM_DIR_GROUP, &sp) != 0) continue;
        /* Whole, or its writer still at work. */
        bool left = fstatat(sp.fd, "_metadata", &st, AT_SYMLINK_NOFOLLOW) < 0 &&
                    flock(sp.fd, LOCK_EX | LOCK_NB) == 0;
        shm_dir_close(&sp);
        if (left && shm_dir_remove(dir, de->d_name, 0) == 0) removed++;
    }
    closedir(d);
    return removed;
}

/* Writes the arena's key groups, each as of its pin, and its catalog's
 * states. */
static int write_arena(stash_arena *a, const uint32_t *pins, const ckpt_opts *o, ckpt_written *out)
{
    ckpt_state states[SHM_CATALOG_SIZE];
    uint32_t n = 0;
    for (uint32_t i = 0; i < SHM_CATALOG_SIZE; i++) {
        shm_catalog_entry *c = &a->catalog[i];
        if (!atomic_load(&c->used)) continue;
        ckpt_state *st = &states[n++];
        *st = (ckpt_state){.id = (uint16_t)(i + 1), .kind = (uint16_t)c->kind};
        memcpy(st->options, c->options, sizeof st->options);
        memcpy(st->name, c->name, sizeof st->name);
    }
    arena_source as = {a, pins, o};
    ckpt_source src = {.max_parallelism = a->hdr->max_parallelism,
                       .backend = a->hdr->backend + 1, /* CKPT_BACKEND_* */
                       .nstates = n,
                       .states = states,
                       .block = serialize_kg,
                       .ctx = &as,
                       .two_threads = !o->reader || o->reader_slot2};
    return ckpt_write_source(&src, o, out);
}

int ckpt_write(stash_arena *a, const uint32_t *pins, const ckpt_opts *o, ckpt_written *out)
{
    if (o->store) return write_arena(a, pins, o, out);
    /* A store of its own, each key group's cut opened now. */
    ckpt_opts with = *o;
    uint32_t maxp = a->hdr->max_parallelism;
    int rc = store_open(a, 0, (stash_kg_range){0, maxp - 1}, &with.store);
    for (uint32_t kg = 0; rc == 0 && with.store->ops->cut_open && kg < maxp; kg++)
        rc = with.store->ops->cut_open(with.store, kg);
    if (rc == 0) rc = write_arena(a, pins, &with, out);
    store_close(with.store);
    return rc;
}
