/* SPDX-License-Identifier: MIT */
/*
 * transfer.c: files moved to and from a storage in parts, written once for
 * every storage over its part operations (storage.h). Up to depth parts are
 * in flight, each in a thread of its own (a storage's calls block); a
 * writer takes bytes as they come, a part going up as soon as it is full,
 * and the first part last, which makes the file whole. Part buffers are
 * kept with the storage's handle between transfers: memory touched for the
 * first time costs more than the network does (a fault a page).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backends/checkpoint/storage.h"
#include "ioengine/ioengine.h"

/* ---- kept part buffers, and injected faults ---------------------------------------- */

typedef struct ckpt_transfer {
    pthread_mutex_t mu;
    uint8_t **free; /* part buffers not in use, n of them */
    size_t n, cap;
    bool faulty;       /* faults has rules */
    ioe_faults faults; /* $STASH_STORAGE_FAULT: writes, reads, delay */
} ckpt_transfer;

int ckpt_transfer_init(ckpt_storage *st)
{
    ckpt_transfer *t = calloc(1, sizeof *t);
    if (!t) return shm_fail(-ENOMEM, "out of memory");
    pthread_mutex_init(&t->mu, NULL);
    st->transfer = t;
#ifdef STASH_FAULT_INJECTION
    /* Only builds that ask for it (the tests') take faults from the environment. */
    const char *spec = getenv("STASH_STORAGE_FAULT");
    if (spec && ioe_faults_parse(spec, &t->faults) < 0)
        return shm_fail(-EINVAL, "STASH_STORAGE_FAULT: '%s' is not a fault specification", spec);
    t->faulty = t->faults.nrules || t->faults.delay_ms;
#endif
    return 0;
}

void ckpt_transfer_free(ckpt_storage *st)
{
    ckpt_transfer *t = st->transfer;
    if (!t) return;
    for (size_t i = 0; i < t->n; i++) free(t->free[i]);
    free(t->free);
    pthread_mutex_destroy(&t->mu);
    free(t);
    st->transfer = NULL;
}

/* The injected fault of a write (op IOE_WRITE: part index of file name,
 * or a whole file) or a read (IOE_READ) about to go, after the delay the
 * faults ask for: 0, or the error, named. */
static int injected(ckpt_storage *st, int op, const char *name, uint64_t index)
{
    ckpt_transfer *t = st->transfer;
    if (!t->faulty) return 0;
    pthread_mutex_lock(&t->mu);
    int err = ioe_faults_pick(&t->faults, op);
    uint32_t ms = t->faults.delay_ms;
    pthread_mutex_unlock(&t->mu);
    if (ms) nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000}, NULL);
    return err ? shm_fail(-err, "%s/%s: part %llu: %s (an injected fault)", st->where, name,
                          (unsigned long long)index, strerror(err))
               : 0;
}

static int put_whole(ckpt_storage *st, const char *name, const void *data, size_t len)
{
    int rc = injected(st, IOE_WRITE, name, 0);
    return rc ? rc : st->ops->put_whole(st, name, data, len);
}

static int put_part(ckpt_storage *st, void *state, const char *name, uint64_t index,
                    const void *data, size_t len)
{
    int rc = injected(st, IOE_WRITE, name, index);
    return rc ? rc : st->ops->put_part(st, state, name, index, data, len);
}

static int get_range(ckpt_storage *st, const char *name, uint64_t off, void *dst, size_t len)
{
    int rc = injected(st, IOE_READ, name, off / st->part);
    return rc ? rc : st->ops->get_range(st, name, off, dst, len);
}

/* A part buffer of st->part bytes, or NULL. */
static uint8_t *part_get(ckpt_storage *st)
{
    ckpt_transfer *p = st->transfer;
    pthread_mutex_lock(&p->mu);
    uint8_t *b = p->n ? p->free[--p->n] : NULL;
    pthread_mutex_unlock(&p->mu);
    return b ? b : malloc(st->part);
}

static void part_put(ckpt_storage *st, uint8_t *b)
{
    ckpt_transfer *p = st->transfer;
    if (!b) return;
    pthread_mutex_lock(&p->mu);
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        uint8_t **grown = realloc(p->free, cap * sizeof *grown);
        if (grown) p->free = grown, p->cap = cap;
    }
    if (p->n < p->cap) p->free[p->n++] = b, b = NULL;
    pthread_mutex_unlock(&p->mu);
    free(b);
}

/* ---- a crew of threads ---------------------------------------------------------- */

/* Runs fn(ctx, i) for i in 0 .. n-1, depth at once; the first failure
 * stops what has not started and is returned. */
typedef int crew_fn(void *ctx, uint64_t i);
typedef struct crew {
    crew_fn *fn;
    void *ctx;
    uint64_t n, next;
    int rc;
    char why[512]; /* rc's message, made in the thread that failed */
    pthread_mutex_t mu;
} crew;

static void *crew_main(void *arg)
{
    crew *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        uint64_t i = c->rc ? c->n : c->next++;
        pthread_mutex_unlock(&c->mu);
        if (i >= c->n) return NULL;
        int rc = c->fn(c->ctx, i);
        pthread_mutex_lock(&c->mu);
        if (rc && !c->rc) {
            c->rc = rc;
            snprintf(c->why, sizeof c->why, "%s", stash_errmsg());
        }
        pthread_mutex_unlock(&c->mu);
    }
}

static int crew_run(uint32_t depth, uint64_t n, crew_fn *fn, void *ctx)
{
    crew c = {.fn = fn, .ctx = ctx, .n = n};
    pthread_mutex_init(&c.mu, NULL);
    uint32_t k = n < depth ? (uint32_t)n : depth;
    pthread_t t[k ? k : 1];
    uint32_t started = 0;
    while (started + 1 < k && pthread_create(&t[started], NULL, crew_main, &c) == 0) started++;
    crew_main(&c); /* the caller is one of the crew */
    for (uint32_t i = 0; i < started; i++) pthread_join(t[i], NULL);
    pthread_mutex_destroy(&c.mu);
    return c.rc ? shm_fail(c.rc, "%s", c.why) : 0;
}

/* ---- reads ----------------------------------------------------------------------- */

typedef struct reading {
    ckpt_storage *st;
    const char *name;
    uint64_t len;
    uint8_t *dst; /* into memory, or */
    int fd;       /* into this file */
    const char *path;
    struct ckpt_storage_reader *told; /* told of each part in memory, if set */
} reading;

static void reader_arrived(struct ckpt_storage_reader *rd, uint64_t part);
static bool reader_stopped(const struct ckpt_storage_reader *rd);

static int read_part(void *ctx, uint64_t i)
{
    reading *r = ctx;
    ckpt_storage *st = r->st;
    uint64_t off = i * st->part;
    size_t n = r->len - off < st->part ? (size_t)(r->len - off) : (size_t)st->part;
    if (r->told && reader_stopped(r->told))
        return shm_fail(-ECANCELED, "%s/%s: the read was stopped", st->where, r->name);
    if (r->dst) {
        /* The part's pages made here, not one fault at a time in the
         * storage client's thread that receives the bytes. */
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), from = (uintptr_t)(r->dst + off),
                  to = from + n;
        from = (from + page - 1) & ~(page - 1);
        if (to > from) madvise((void *)from, to - from, MADV_POPULATE_WRITE);
        int rc = get_range(st, r->name, off, r->dst + off, n);
        if (rc == 0 && r->told) reader_arrived(r->told, i);
        return rc;
    }
    uint8_t *b = part_get(st);
    int rc = b ? get_range(st, r->name, off, b, n) : shm_fail(-ENOMEM, "out of memory");
    for (size_t done = 0; rc == 0 && done < n;) {
        ssize_t w = pwrite(r->fd, b + done, n - done, (off_t)(off + done));
        if (w < 0)
            rc = shm_fail(-errno, "write %s at offset %llu: %s", r->path,
                          (unsigned long long)(off + done), strerror(errno));
        done += w > 0 ? (size_t)w : 0;
    }
    part_put(st, b);
    return rc;
}

static int read_all(reading *r)
{
    uint64_t n = (r->len + r->st->part - 1) / r->st->part;
    return crew_run(r->st->depth, n, read_part, r);
}

/* The length of file name, if at most limit bytes (-EFBIG beyond). */
static int size_within(ckpt_storage *st, const char *name, size_t limit, uint64_t *len)
{
    int rc = st->ops->file_size(st, name, len);
    if (rc == 0 && *len > limit)
        rc = shm_fail(-EFBIG, "%s/%s: %llu bytes, more than %zu", st->where, name,
                      (unsigned long long)*len, limit);
    return rc;
}

int ckpt_storage_read_file(ckpt_storage *st, const char *name, size_t limit, uint8_t **out,
                           size_t *len)
{
    uint64_t len64;
    int rc = size_within(st, name, limit, &len64);
    if (rc) return rc;
    reading r = {.st = st, .name = name, .len = len64, .dst = malloc(len64 ? len64 : 1)};
    if (!r.dst) return shm_fail(-ENOMEM, "out of memory");
    if ((rc = read_all(&r)) != 0) {
        free(r.dst);
        return rc;
    }
    *out = r.dst;
    *len = len64;
    return 0;
}

/* ---- a file read in the background, its bytes arriving from the front ---------- */

struct ckpt_storage_reader {
    reading r;
    uint32_t depth;
    pthread_t t;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool *in;       /* per part: in memory */
    uint64_t parts; /* of the file */
    uint64_t front; /* parts in memory from the first on */
    bool ended;     /* the crew is done */
    int rc;
    char why[512]; /* rc's message */
    _Atomic bool stop;
};

static void reader_arrived(struct ckpt_storage_reader *rd, uint64_t part)
{
    pthread_mutex_lock(&rd->mu);
    rd->in[part] = true;
    uint64_t was = rd->front;
    while (rd->front < rd->parts && rd->in[rd->front]) rd->front++;
    if (rd->front != was) pthread_cond_broadcast(&rd->cv);
    pthread_mutex_unlock(&rd->mu);
}

static bool reader_stopped(const struct ckpt_storage_reader *rd)
{
    return atomic_load_explicit(&rd->stop, memory_order_relaxed);
}

static void *reader_main(void *arg)
{
    ckpt_storage_reader *rd = arg;
    int rc = crew_run(rd->depth, rd->parts, read_part, &rd->r);
    pthread_mutex_lock(&rd->mu);
    rd->ended = true;
    rd->rc = rc;
    if (rc) snprintf(rd->why, sizeof rd->why, "%s", stash_errmsg());
    pthread_cond_broadcast(&rd->cv);
    pthread_mutex_unlock(&rd->mu);
    return NULL;
}

int ckpt_storage_reader_open(ckpt_storage *st, const char *name, size_t limit, uint32_t depth,
                             ckpt_storage_reader **out, uint8_t **data, size_t *len)
{
    uint64_t len64;
    int rc = size_within(st, name, limit, &len64);
    if (rc) return rc;
    ckpt_storage_reader *rd = calloc(1, sizeof *rd);
    if (!rd) return shm_fail(-ENOMEM, "out of memory");
    rd->parts = (len64 + st->part - 1) / st->part;
    rd->depth = depth ? depth : 1;
    rd->r = (reading){.st = st, .name = name, .len = len64, .told = rd};
    /* Aligned to a page: its copy into a directory goes to the disk
     * straight from it. */
    void *mem;
    rd->r.dst =
        posix_memalign(&mem, (size_t)sysconf(_SC_PAGESIZE), len64 ? len64 : 1) == 0 ? mem : NULL;
    rd->in = calloc(rd->parts ? rd->parts : 1, sizeof *rd->in);
    pthread_mutex_init(&rd->mu, NULL);
    pthread_cond_init(&rd->cv, NULL);
    if (!rd->r.dst || !rd->in)
        rc = shm_fail(-ENOMEM, "out of memory");
    else if (pthread_create(&rd->t, NULL, reader_main, rd) != 0)
        rc = shm_fail(-EAGAIN, "%s/%s: no thread to read", st->where, name);
    if (rc) {
        free(rd->r.dst);
        rd->r.dst = NULL;
        ckpt_storage_reader_close(rd);
        return rc;
    }
    rd->started = true;
    *out = rd;
    *data = rd->r.dst;
    *len = (size_t)len64;
    return 0;
}

int ckpt_storage_reader_wait(ckpt_storage_reader *rd, uint64_t upto)
{
    ckpt_storage *st = rd->r.st;
    if (upto > rd->r.len)
        return shm_fail(STASH_ECORRUPT, "%s/%s: offset %llu beyond its %llu bytes", st->where,
                        rd->r.name, (unsigned long long)upto, (unsigned long long)rd->r.len);
    uint64_t parts = (upto + st->part - 1) / st->part;
    pthread_mutex_lock(&rd->mu);
    while (rd->front < parts && !rd->ended) pthread_cond_wait(&rd->cv, &rd->mu);
    int rc = rd->front >= parts ? 0 : rd->rc;
    if (rc) shm_fail(rc, "%s", rd->why);
    pthread_mutex_unlock(&rd->mu);
    return rc;
}

void ckpt_storage_reader_stop(ckpt_storage_reader *rd)
{
    if (rd) atomic_store(&rd->stop, true);
}

void ckpt_storage_reader_close(ckpt_storage_reader *rd)
{
    if (!rd) return;
    ckpt_storage_reader_stop(rd);
    if (rd->started) pthread_join(rd->t, NULL);
    pthread_cond_destroy(&rd->cv);
    pthread_mutex_destroy(&rd->mu);
    free(rd->in);
    free(rd);
}

int ckpt_storage_get_fd(ckpt_storage *st, const char *name, int fd, const char *path, uint64_t *len)
{
    int rc = st->ops->file_size(st, name, len);
    reading r = {.st = st, .name = name, .len = *len, .fd = fd, .path = path};
    return rc ? rc : read_all(&r);
}

/* ---- writes ---------------------------------------------------------------------- */

struct ckpt_storage_writer {
    ckpt_storage *st;
    char name[1024];
    void *state;    /* put_begin's, once a second part came */
    bool begun;     /* put_begin called */
    uint8_t *first; /* part 0, written last */
    uint8_t *cur;   /* the part being filled, index next - 1 */
    size_t fill;
    uint64_t next; /* parts started */
    uint64_t total;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct queued {
        uint64_t index;
        uint8_t *buf;
        size_t len;
    } * queue;
    uint32_t head, queued, flying; /* queue's first, queued, being written */
    bool done;
    _Atomic int rc;
    char why[512]; /* rc's message, if a part's thread failed */
    bool told;     /* rc's message is the caller's */
    pthread_t *threads;
    uint32_t nthreads;
};

/* w's first failure, its message made the caller's (once). */
static int writer_rc(ckpt_storage_writer *w)
{
    if (w->rc && !w->told) {
        w->told = true;
        shm_fail(w->rc, "%s", w->why);
    }
    return w->rc;
}

/* Fails w with rc, whose message the caller has. */
static int writer_fail(ckpt_storage_writer *w, int rc)
{
    pthread_mutex_lock(&w->mu);
    if (!w->rc) {
        w->rc = rc;
        w->told = true;
    }
    pthread_mutex_unlock(&w->mu);
    return writer_rc(w);
}

static void *writer_main(void *arg)
{
    ckpt_storage_writer *w = arg;
    ckpt_storage *st = w->st;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->queued && !w->done) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->queued) break;
        struct queued q = w->queue[w->head];
        w->head = (w->head + 1) % st->depth;
        w->queued--;
        w->flying++;
        int failed = w->rc;
        pthread_mutex_unlock(&w->mu);
        int rc = failed ? 0 : put_part(st, w->state, w->name, q.index, q.buf, q.len);
        part_put(st, q.buf);
        pthread_mutex_lock(&w->mu);
        if (rc && !w->rc) { /* its message first: a caller may see rc unlocked */
            snprintf(w->why, sizeof w->why, "%s", stash_errmsg());
            w->rc = rc;
        }
        w->flying--;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int ckpt_storage_writer_open(ckpt_storage *st, const char *name, ckpt_storage_writer **out)
{
    ckpt_storage_writer *w = calloc(1, sizeof *w);
    if (!w) return shm_fail(-ENOMEM, "out of memory");
    w->st = st;
    if ((size_t)snprintf(w->name, sizeof w->name, "%s", name) >= sizeof w->name) {
        free(w);
        return shm_fail(-ENAMETOOLONG, "%s/%s: too long", st->where, name);
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->queue = calloc(st->depth, sizeof *w->queue);
    w->threads = calloc(st->depth, sizeof *w->threads);
    int rc = w->queue && w->threads ? 0 : shm_fail(-ENOMEM, "out of memory");
    while (rc == 0 && w->nthreads < st->depth &&
           pthread_create(&w->threads[w->nthreads], NULL, writer_main, w) == 0)
        w->nthreads++;
    if (rc == 0 && !w->nthreads)
        rc = shm_fail(-EAGAIN, "%s/%s: no thread to write", st->where, name);
    if (rc) {
        ckpt_storage_writer_close(w, false);
        return rc;
    }
    *out = w;
    return 0;
}

/* Queues part index (len bytes at buf, given to the queue), once fewer
 * than depth wait or fly. */
static int writer_queue(ckpt_storage_writer *w, uint64_t index, uint8_t *buf, size_t len)
{
    ckpt_storage *st = w->st;
    pthread_mutex_lock(&w->mu);
    while (!w->rc && w->queued + w->flying >= st->depth) pthread_cond_wait(&w->cv, &w->mu);
    int rc = w->rc;
    if (!rc) {
        w->queue[(w->head + w->queued) % st->depth] =
            (struct queued){.index = index, .buf = buf, .len = len};
        w->queued++;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    if (rc) part_put(st, buf);
    return rc ? writer_rc(w) : 0;
}

/* Hands the full part cur on: part 0 is kept until a second comes (a file
 * of one part is written whole), then both go, and every one after. */
static int writer_ship(ckpt_storage_writer *w)
{
    ckpt_storage *st = w->st;
    uint64_t index = w->next - 1;
    uint8_t *buf = w->cur;
    w->cur = NULL;
    if (index == 0) {
        w->first = buf;
        return 0;
    }
    if (!w->begun) {
        w->begun = true;
        int rc = st->ops->put_begin ? st->ops->put_begin(st, w->name, &w->state) : 0;
        uint8_t *first = w->first;
        w->first = NULL;
        if (rc == 0)
            rc = writer_queue(w, 0, first, (size_t)st->part);
        else
            part_put(st, first);
        if (rc) {
            part_put(st, buf);
            return writer_fail(w, rc);
        }
    }
    return writer_queue(w, index, buf, w->fill);
}

int ckpt_storage_writer_put(ckpt_storage_writer *w, const void *data, size_t len)
{
    ckpt_storage *st = w->st;
    const uint8_t *p = data;
    while (len && !w->rc) {
        if (!w->cur) {
            if (!(w->cur = part_get(st))) return writer_fail(w, shm_fail(-ENOMEM, "out of memory"));
            w->fill = 0;
            w->next++;
        }
        size_t k = len < st->part - w->fill ? len : (size_t)(st->part - w->fill);
        memcpy(w->cur + w->fill, p, k);
        w->fill += k, p += k, len -= k;
        w->total += k;
        if (w->fill == st->part && writer_ship(w)) break;
    }
    return writer_rc(w);
}

int ckpt_storage_writer_close(ckpt_storage_writer *w, bool commit)
{
    if (!w) return 0;
    ckpt_storage *st = w->st;
    if (commit && !w->rc && w->cur && w->fill && w->next > 1) writer_ship(w);
    pthread_mutex_lock(&w->mu);
    w->done = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    for (uint32_t i = 0; i < w->nthreads; i++) pthread_join(w->threads[i], NULL);
    /* Given up, the caller's message stays what failed it. */
    int rc = commit ? writer_rc(w) : w->rc;
    if (commit && !rc) {
        if (w->next <= 1) /* one part, or none */
            rc = put_whole(st, w->name,
                           w->first ? w->first
                           : w->cur ? w->cur
                                    : (const uint8_t *)"",
                           (size_t)w->total);
        else
            rc = st->ops->put_end(st, w->state, w->name, w->total, w->next);
    }
    if ((rc || !commit) && w->begun && st->ops->put_abort) {
        char why[512];
        snprintf(why, sizeof why, "%s", stash_errmsg());
        st->ops->put_abort(st, w->state, w->name, w->next);
        shm_fail(rc, "%s", why);
    }
    for (uint32_t i = 0; i < w->queued; i++) part_put(st, w->queue[(w->head + i) % st->depth].buf);
    part_put(st, w->first);
    part_put(st, w->cur);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w->queue);
    free(w->threads);
    free(w);
    return rc;
}

int ckpt_storage_write_file(ckpt_storage *st, const char *name, const void *data, size_t len)
{
    if (len <= st->part) return put_whole(st, name, data ? data : "", len);
    ckpt_storage_writer *w = NULL;
    int rc = ckpt_storage_writer_open(st, name, &w);
    if (rc == 0) rc = ckpt_storage_writer_put(w, data, len);
    int closed = w ? ckpt_storage_writer_close(w, rc == 0) : 0;
    return rc ? rc : closed;
}

int ckpt_storage_put_fd(ckpt_storage *st, const char *name, int fd, const char *path, uint64_t len)
{
    ckpt_storage_writer *w = NULL;
    int rc = ckpt_storage_writer_open(st, name, &w);
    enum { CHUNK = 1u << 20 };
    uint8_t *buf = rc == 0 ? malloc(CHUNK) : NULL;
    if (rc == 0 && !buf) rc = shm_fail(-ENOMEM, "out of memory");
    for (uint64_t off = 0; rc == 0 && off < len;) {
        size_t want = len - off < CHUNK ? (size_t)(len - off) : CHUNK;
        ssize_t got = pread(fd, buf, want, (off_t)off);
        if (got <= 0)
            rc = shm_fail(got < 0 ? -errno : STASH_ECORRUPT, "read %s at offset %llu: %s", path,
                          (unsigned long long)off,
                          got < 0 ? strerror(errno) : "the file is shorter than it was");
        if (rc == 0) rc = ckpt_storage_writer_put(w, buf, (size_t)got);
        off += got > 0 ? (uint64_t)got : 0;
    }
    free(buf);
    if (!w) return rc;
    int closed = ckpt_storage_writer_close(w, rc == 0);
    return rc ? rc : closed;
}
