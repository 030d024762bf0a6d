/* SPDX-License-Identifier: MIT */
/*
 * engine.c: the backend-independent core of the I/O engine: choosing a
 * backend, files, the bounded set of request slots, and the life of a request
 * from acceptance to the completion the caller reaps. Everything that must
 * behave the same on io_uring and on the thread pool lives here: resuming
 * short transfers, retrying -EAGAIN and -EINTR, holding an fsync until the
 * writes before it have finished, and injecting faults. A backend only
 * performs single attempts and reports their raw results.
 *
 * The invariant the bound rests on: a slot carries at most one attempt in a
 * backend at a time, and there are depth slots; so at most depth attempts are
 * ever in a backend, and io_uring's queues (sized for depth) cannot overflow.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ioengine/ioengine.h"

#define DEFAULT_DEPTH 32u
#define MAX_DEPTH 4096u
#define DEFAULT_THREADS 4u
#define MAX_THREADS 64u
#define MAX_BUF_COUNT 1024u
#define DEFAULT_BUF_SIZE (1u << 20)
#define MAX_BUF_SIZE (1ull << 30)
#define DEFAULT_MAX_FILES 64u
/* One attempt moves at most this much: io_uring lengths are 32-bit, and a
 * multiple of any O_DIRECT alignment keeps the next attempt aligned. */
#define MAX_ATTEMPT (1u << 30)
/* Consecutive -EAGAIN or -EINTR results before the error is reported. */
#define MAX_RETRIES 1000u

/* A request from acceptance to reaping. A slot is in exactly one place: the
 * free list, a backend, its file's held fsyncs, the delayed queue, or the
 * ready queue. */
typedef struct ioe_slot {
    ioe_req io; /* first: the backend's ioe_req * is the slot */
    int op;
    ioe_file *file;
    void *user;
    char *buf;
    uint64_t off, len, done;
    int res;
    int fault; /* positive errno to inject on the first attempt, or 0 */
    unsigned retries;
    uint64_t seq; /* write: its number among the file's writes; fsync: the last it covers */
    uint64_t due_ns;
    struct ioe_slot *next;          /* free list, ready or delayed queue, the file's held syncs */
    struct ioe_slot *wprev, *wnext; /* the file's unfinished writes */
} ioe_slot;

typedef struct slot_queue {
    ioe_slot *first, *last;
} slot_queue;

struct ioe_file {
    ioe_engine *e;
    char *path;
    int fd;
    int fixed;
    bool direct;
    ioe_align align;
    unsigned outstanding;     /* requests not yet reaped */
    uint64_t wseq;            /* writes accepted so far */
    ioe_slot *wfirst, *wlast; /* unfinished writes, in the order they were accepted */
    slot_queue syncs;         /* fsyncs held until the writes before them finish */
    struct ioe_file *prev, *next;
};

struct ioe_engine {
    const ioe_backend_ops *ops;
    ioe_backend *bk;
    int backend;
    unsigned depth, threads;
    ioe_slot *slots;
    ioe_slot *free;
    unsigned outstanding;
    unsigned in_backend;
    slot_queue ready, delayed;
    ioe_pool pool;
    ioe_faults faults;
    ioe_file *files;
    ioe_info counters;
    ioe_log_fn *log;
    void *log_ctx;
    char fallback_reason[192];
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void queue_push(slot_queue *q, ioe_slot *s)
{
    s->next = NULL;
    if (q->last)
        q->last->next = s;
    else
        q->first = s;
    q->last = s;
}

static ioe_slot *queue_pop(slot_queue *q)
{
    ioe_slot *s = q->first;
    if (s) {
        q->first = s->next;
        if (!q->first) q->last = NULL;
    }
    return s;
}

const char *ioe_backend_name(int backend)
{
    switch (backend) {
    case IOE_AUTO:
        return "auto";
    case IOE_URING:
        return "io_uring";
    case IOE_THREADS:
        return "threads";
    default:
        return "?";
    }
}

/* ------------------------------------------------------------------------ */
/* Opening: options, the backend choice, the fallback line.                 */

static int resolve_opts(const ioe_opts *in, ioe_opts *o)
{
    *o = in ? *in : (ioe_opts){0};
    if (o->backend != IOE_AUTO && o->backend != IOE_URING && o->backend != IOE_THREADS)
        return -EINVAL;
    if (!o->depth) o->depth = DEFAULT_DEPTH;
    if (!o->threads) o->threads = DEFAULT_THREADS;
    if (!o->buf_count) o->buf_count = o->depth;
    if (!o->buf_size) o->buf_size = DEFAULT_BUF_SIZE;
    if (!o->max_files) o->max_files = DEFAULT_MAX_FILES;
    if (o->depth > MAX_DEPTH || o->threads > MAX_THREADS || o->buf_count > MAX_BUF_COUNT ||
        o->buf_size > MAX_BUF_SIZE)
        return -EINVAL;
    o->buf_size = ioe_align_up(o->buf_size, 4096);
#ifdef STASH_FAULT_INJECTION
    /* Only builds that ask for it (the tests') take faults from the environment. */
    if (!o->faults) o->faults = getenv("STASH_IO_FAULT");
#endif
    return 0;
}

/* The backend to open and whether it was asked for (no fallback) or chosen. */
static int choose_backend(const ioe_opts *o, int *backend, bool *forced)
{
    *backend = o->backend;
    *forced = true;
    if (*backend != IOE_AUTO) return 0;
    const char *env = getenv("STASH_IO");
    if (env && *env) {
        if (strcmp(env, "uring") == 0 || strcmp(env, "io_uring") == 0)
            *backend = IOE_URING;
        else if (strcmp(env, "threads") == 0)
            *backend = IOE_THREADS;
        else
            return -EINVAL;
        return 0;
    }
    *backend = IOE_URING;
    *forced = false;
    return 0;
}

static int open_backend(ioe_engine *e, const ioe_opts *o, int backend)
{
    if (backend == IOE_URING && e->faults.setup_err) return -e->faults.setup_err;
    const ioe_backend_ops *ops = backend == IOE_URING ? &ioe_uring_ops : &ioe_threads_ops;
    ioe_backend_cfg cfg = {
        .engine = e,
        .depth = o->depth,
        .threads = o->threads,
        .max_files = o->max_files,
        .sqpoll = o->sqpoll,
        .pool = e->pool.base,
        .buf_size = e->pool.buf_size,
        .buf_count = e->pool.count,
    };
    int rc = ops->open(&cfg, &e->bk);
    if (rc < 0) return rc;
    e->ops = ops;
    e->backend = backend;
    e->threads = backend == IOE_THREADS ? o->threads : 0;
    return 0;
}

static bool fallback_allowed(int err)
{
    return err == -EPERM || err == -ENOSYS || err == -ENOMEM;
}

static const char *fallback_cause(int err)
{
    switch (err) {
    case -EPERM:
        return "a seccomp filter or kernel.io_uring_disabled forbids it";
    case -ENOSYS:
        return "the kernel has no io_uring, or one older than 5.6";
    default:
        return "the locked-memory limit (ulimit -l) is too low for its rings";
    }
}

static void log_fallback(ioe_engine *e, int err)
{
    char err_words[64];
    snprintf(e->fallback_reason, sizeof e->fallback_reason, "io_uring_setup failed with %s (%s)",
             strerror_r(-err, err_words, sizeof err_words), fallback_cause(err));
    char line[320];
    snprintf(line, sizeof line,
             "%s; using the thread-pool I/O fallback (STASH_IO=threads selects it quietly)",
             e->fallback_reason);
    if (e->log) e->log(e->log_ctx, line);
}

int ioe_engine_open(const ioe_opts *opts, ioe_engine **out)
{
    ioe_opts o;
    int rc = resolve_opts(opts, &o);
    if (rc < 0) return rc;
    ioe_engine *e = calloc(1, sizeof *e);
    if (!e) return -ENOMEM;
    e->depth = o.depth;
    e->log = o.log;
    e->log_ctx = o.log_ctx;
    int backend;
    bool forced;
    if ((rc = ioe_faults_parse(o.faults, &e->faults)) < 0 ||
        (rc = choose_backend(&o, &backend, &forced)) < 0)
        goto fail;
    e->slots = calloc(o.depth, sizeof *e->slots);
    if (!e->slots) {
        rc = -ENOMEM;
        goto fail;
    }
    for (unsigned i = o.depth; i-- > 0;) {
        e->slots[i].next = e->free;
        e->free = &e->slots[i];
    }
    if ((rc = ioe_pool_init(&e->pool, o.buf_count, o.buf_size)) < 0) goto fail;
    rc = open_backend(e, &o, backend);
    if (rc < 0 && !forced && fallback_allowed(rc)) {
        log_fallback(e, rc);
        rc = open_backend(e, &o, IOE_THREADS);
    }
    if (rc < 0) goto fail;
    *out = e;
    return 0;
fail:
    ioe_pool_fini(&e->pool);
    free(e->slots);
    free(e);
    return rc;
}

static void free_file(ioe_file *f)
{
    ioe_engine *e = f->e;
    if (f->prev)
        f->prev->next = f->next;
    else
        e->files = f->next;
    if (f->next) f->next->prev = f->prev;
    free(f->path);
    free(f);
}

void ioe_engine_close(ioe_engine *e)
{
    if (!e) return;
    ioe_cqe scratch[16];
    while (e->outstanding > 0 && ioe_reap(e, scratch, 16, 1) > 0) {
    }
    /* The backend goes first: it stops using the descriptors closed after it. */
    e->ops->close(e->bk);
    while (e->files) {
        close(e->files->fd);
        free_file(e->files);
    }
    ioe_pool_fini(&e->pool);
    free(e->slots);
    free(e);
}

void ioe_engine_info(const ioe_engine *e, ioe_info *out)
{
    *out = e->counters;
    out->backend = e->backend;
    out->depth = e->depth;
    out->threads = e->threads;
    out->buf_count = e->pool.count;
    out->buf_size = e->pool.buf_size;
    out->fallback_reason = e->fallback_reason[0] ? e->fallback_reason : NULL;
    e->ops->info(e->bk, out);
}

int ioe_fault_set(ioe_engine *e, const char *spec)
{
    ioe_faults f;
    int rc = ioe_faults_parse(spec, &f);
    if (rc < 0) return rc;
    e->faults = f;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Files.                                                                    */

int ioe_file_open(ioe_engine *e, const char *path, int oflags, mode_t mode, ioe_file **out)
{
    return ioe_file_openat(e, AT_FDCWD, path, path, oflags, mode, out);
}

int ioe_file_openat(ioe_engine *e, int dirfd, const char *name, const char *label, int oflags,
                    mode_t mode, ioe_file **out)
{
    if (!e || !name || !out) return -EINVAL;
    ioe_file *f = calloc(1, sizeof *f);
    char *p = strdup(label ? label : name);
    if (!f || !p) {
        free(f);
        free(p);
        return -ENOMEM;
    }
    int fd;
    do fd = openat(dirfd, name, oflags | O_CLOEXEC, mode);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        int rc = -errno;
        free(f);
        free(p);
        return rc;
    }
    *f = (ioe_file){
        .e = e, .path = p, .fd = fd, .direct = (oflags & O_DIRECT) != 0, .align = {1, 1}};
    if (f->direct) {
        int rc = ioe_dio_align(fd, &f->align);
        if (rc < 0) {
            close(fd);
            free(f);
            free(p);
            return rc;
        }
    }
    f->fixed = e->ops->file_register(e->bk, fd);
    f->next = e->files;
    if (e->files) e->files->prev = f;
    e->files = f;
    *out = f;
    return 0;
}

int ioe_file_close(ioe_file *f)
{
    if (!f) return 0;
    if (f->outstanding > 0) return -EBUSY;
    ioe_engine *e = f->e;
    if (f->fixed >= 0) e->ops->file_unregister(e->bk, f->fixed);
    /* close(2) is not retried on EINTR: on Linux the descriptor is gone anyway. */
    int rc = close(f->fd) < 0 ? -errno : 0;
    free_file(f);
    return rc;
}

const char *ioe_file_path(const ioe_file *f)
{
    return f->path;
}

int ioe_file_fd(const ioe_file *f)
{
    return f->fd;
}

ioe_align ioe_file_align(const ioe_file *f)
{
    return f->align;
}

/* ------------------------------------------------------------------------ */
/* The life of a request.                                                    */

/* The length of a shortened attempt: half of what remains, kept aligned. */
static uint64_t shortened(uint64_t left, uint64_t align)
{
    uint64_t half = left / 2 / align * align;
    return half ? half : left;
}

/* Hands the slot's next attempt to the backend. */
static void dispatch(ioe_engine *e, ioe_slot *s)
{
    ioe_file *f = s->file;
    ioe_req *r = &s->io;
    *r = (ioe_req){.op = s->op, .fd = f->fd, .fixed = f->fixed, .buf_index = -1};
    if (s->fault) {
        r->nop = true;
    } else if (s->op == IOE_WRITE || s->op == IOE_READ) {
        uint64_t left = s->len - s->done;
        if (left > MAX_ATTEMPT) left = MAX_ATTEMPT;
        if (e->faults.short_io) left = shortened(left, f->align.offset);
        r->buf = s->buf + s->done;
        r->len = (uint32_t)left;
        r->off = s->off + s->done;
        /* Registered buffers spare direct I/O the pinning of user pages for
         * each request; buffered I/O copies into the page cache anyway, and
         * measured slower with fixed-buffer operations (docs/ioengine.md). */
        r->buf_index = f->direct ? ioe_pool_index(&e->pool, r->buf, r->len) : -1;
    }
    if (++e->in_backend > e->counters.max_in_flight) e->counters.max_in_flight = e->in_backend;
    e->ops->queue(e->bk, r);
}

static void unlink_write(ioe_file *f, ioe_slot *s)
{
    if (s->wprev)
        s->wprev->wnext = s->wnext;
    else
        f->wfirst = s->wnext;
    if (s->wnext)
        s->wnext->wprev = s->wprev;
    else
        f->wlast = s->wprev;
    s->wprev = s->wnext = NULL;
}

/* Dispatches the file's held fsyncs whose writes have all finished. */
static void release_syncs(ioe_engine *e, ioe_file *f)
{
    while (f->syncs.first && (!f->wfirst || f->wfirst->seq > f->syncs.first->seq))
        dispatch(e, queue_pop(&f->syncs));
}

/* The request is finished for the caller: queue it, and let fsyncs go. */
static void deliver(ioe_engine *e, ioe_slot *s)
{
    queue_push(&e->ready, s);
    e->counters.completed++;
    if (s->res < 0)
        e->counters.errors++;
    else if (s->op == IOE_WRITE)
        e->counters.bytes_written += s->done;
    else if (s->op == IOE_READ)
        e->counters.bytes_read += s->done;
    if (s->op == IOE_WRITE) {
        unlink_write(s->file, s);
        release_syncs(e, s->file);
    }
}

static void finish(ioe_engine *e, ioe_slot *s, int res)
{
    s->res = res;
    if (e->faults.delay_ms) {
        s->due_ns = now_ns() + (uint64_t)e->faults.delay_ms * 1000000u;
        queue_push(&e->delayed, s);
        return;
    }
    deliver(e, s);
}

void ioe_core_complete(ioe_engine *e, ioe_req *r, int res)
{
    ioe_slot *s = (ioe_slot *)r;
    e->in_backend--;
    if (r->nop) {
        res = -s->fault;
        s->fault = 0;
        e->counters.faults++;
    }
    if ((res == -EAGAIN || res == -EINTR) && s->retries < MAX_RETRIES) {
        s->retries++;
        e->counters.retried++;
        dispatch(e, s);
        return;
    }
    if (res < 0 || s->op == IOE_FSYNC || s->op == IOE_FDATASYNC) {
        finish(e, s, res < 0 ? res : 0);
        return;
    }
    s->retries = 0;
    if (res == 0) {
        /* A read that moves nothing has met the end of the file; a write that
         * moves nothing would never finish. */
        finish(e, s, s->op == IOE_WRITE ? -EIO : 0);
        return;
    }
    s->done += (uint64_t)res;
    if (s->done < s->len) {
        e->counters.continued++;
        dispatch(e, s);
        return;
    }
    finish(e, s, 0);
}

/* Takes a free slot for a new request on f, or NULL when all are outstanding. */
static ioe_slot *take_slot(ioe_file *f, int op, void *user)
{
    ioe_engine *e = f->e;
    ioe_slot *s = e->free;
    if (!s) return NULL;
    e->free = s->next;
    *s = (ioe_slot){.op = op, .file = f, .user = user};
    s->fault = ioe_faults_pick(&e->faults, op);
    e->outstanding++;
    f->outstanding++;
    e->counters.submitted++;
    return s;
}

static bool misaligned(const ioe_file *f, const void *buf, size_t len, uint64_t off)
{
    return (uintptr_t)buf % f->align.mem || len % f->align.offset || off % f->align.offset;
}

static int start_transfer(ioe_file *f, int op, void *buf, size_t len, uint64_t off, void *user)
{
    if (!f || !buf || len == 0 || off > UINT64_MAX - len) return -EINVAL;
    if (f->direct && misaligned(f, buf, len, off)) return -EINVAL;
    ioe_slot *s = take_slot(f, op, user);
    if (!s) return -EBUSY;
    s->buf = buf;
    s->len = len;
    s->off = off;
    if (op == IOE_WRITE) {
        s->seq = ++f->wseq;
        s->wprev = f->wlast;
        if (f->wlast)
            f->wlast->wnext = s;
        else
            f->wfirst = s;
        f->wlast = s;
    }
    dispatch(f->e, s);
    return 0;
}

static int start_sync(ioe_file *f, int op, void *user)
{
    if (!f) return -EINVAL;
    ioe_slot *s = take_slot(f, op, user);
    if (!s) return -EBUSY;
    if (f->wfirst) {
        /* Writes before this fsync are unfinished: hold it until they are. */
        s->seq = f->wseq;
        queue_push(&f->syncs, s);
        return 0;
    }
    dispatch(f->e, s);
    return 0;
}

int ioe_write(ioe_file *f, const void *buf, size_t len, uint64_t off, void *user)
{
    return start_transfer(f, IOE_WRITE, (void *)buf, len, off, user);
}

int ioe_read(ioe_file *f, void *buf, size_t len, uint64_t off, void *user)
{
    return start_transfer(f, IOE_READ, buf, len, off, user);
}

int ioe_fsync(ioe_file *f, void *user)
{
    return start_sync(f, IOE_FSYNC, user);
}

int ioe_fdatasync(ioe_file *f, void *user)
{
    return start_sync(f, IOE_FDATASYNC, user);
}

/* ------------------------------------------------------------------------ */
/* Submitting and reaping.                                                   */

int ioe_submit(ioe_engine *e)
{
    return e->in_backend ? e->ops->submit(e->bk) : 0;
}

unsigned ioe_outstanding(const ioe_engine *e)
{
    return e->outstanding;
}

static void release_due(ioe_engine *e)
{
    if (!e->delayed.first) return;
    uint64_t now = now_ns();
    while (e->delayed.first && e->delayed.first->due_ns <= now) deliver(e, queue_pop(&e->delayed));
}

static void hand_out(ioe_engine *e, ioe_cqe *c)
{
    ioe_slot *s = queue_pop(&e->ready);
    bool transfer = s->op == IOE_WRITE || s->op == IOE_READ;
    *c = (ioe_cqe){
        .user = s->user,
        .file = s->file,
        .path = s->file->path,
        .offset = transfer ? s->off : 0,
        .len = transfer ? s->len : 0,
        .done = s->done,
        .op = s->op,
        .res = s->res,
    };
    s->file->outstanding--;
    e->outstanding--;
    s->next = e->free;
    e->free = s;
}

/* Submits what is queued and collects finished attempts; blocking, it waits
 * for one, or for the next delayed completion's due time. */
static int progress(ioe_engine *e, bool block)
{
    int64_t timeout = block ? -1 : 0;
    if (block && e->delayed.first) {
        uint64_t now = now_ns(), due = e->delayed.first->due_ns;
        timeout = due > now ? (int64_t)(due - now) : 0;
    }
    if (e->in_backend > 0) return e->ops->wait(e->bk, timeout);
    if (timeout > 0) {
        struct timespec ts = {timeout / 1000000000, timeout % 1000000000};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
        }
    }
    return 0;
}

int ioe_reap(ioe_engine *e, ioe_cqe *out, unsigned max, unsigned min)
{
    if (!e || (!out && max)) return -EINVAL;
    if (min > max) min = max;
    unsigned n = 0;
    for (bool block = false;; block = true) {
        int rc = progress(e, block);
        if (rc < 0) return n ? (int)n : rc;
        release_due(e);
        while (n < max && e->ready.first) hand_out(e, &out[n++]);
        if (n >= min || (e->in_backend == 0 && !e->delayed.first)) return (int)n;
    }
}

int ioe_buf_get(ioe_engine *e, void **out)
{
    return ioe_pool_take(&e->pool, out);
}

int ioe_buf_put(ioe_engine *e, void *buf)
{
    return ioe_pool_give(&e->pool, buf);
}

static const char *op_name(int op)
{
    switch (op) {
    case IOE_WRITE:
        return "write";
    case IOE_READ:
        return "read";
    case IOE_FSYNC:
        return "fsync";
    case IOE_FDATASYNC:
        return "fdatasync";
    default:
        return "?";
    }
}

int ioe_cqe_describe(const ioe_cqe *c, char *buf, size_t size)
{
    char words[128];
    const char *what = c->res ? strerror_r(-c->res, words, sizeof words) : "done";
    if (c->op == IOE_FSYNC || c->op == IOE_FDATASYNC)
        return snprintf(buf, size, "%s %s: %s", op_name(c->op), c->path, what);
    return snprintf(buf, size, "%s %s at offset %llu: %s", op_name(c->op), c->path,
                    (unsigned long long)(c->offset + c->done), what);
}
