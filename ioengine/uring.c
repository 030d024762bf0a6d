/* SPDX-License-Identifier: MIT */
/*
 * uring.c: the io_uring backend. Attempts become SQEs that are submitted in
 * batches; the engine's staging pool is registered so that transfers inside it
 * use the fixed-buffer operations, and files take registered slots while there
 * are free ones. Submission and waiting share one io_uring_enter call.
 *
 * The rings are sized for the engine's depth: the engine never has more than
 * depth attempts in the backend, each one SQE and one CQE, so the submission
 * queue always has room and the completion queue (twice the submission queue)
 * cannot overflow.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <time.h>

#include "ioengine/ioengine.h"

struct ioe_backend {
    ioe_engine *e;
    struct io_uring ring;
    bool registered_buffers;
    bool fixed_files;
    bool sqpoll;
    unsigned max_files;
    bool *file_used; /* registered-file slots in use */
};

static unsigned pow2_at_least(unsigned n)
{
    unsigned p = 1;
    while (p < n) p <<= 1;
    return p;
}

static bool register_pool(struct io_uring *ring, const ioe_backend_cfg *cfg)
{
    struct iovec *iov = calloc(cfg->buf_count, sizeof *iov);
    if (!iov) return false;
    for (unsigned i = 0; i < cfg->buf_count; i++)
        iov[i] = (struct iovec){(char *)cfg->pool + (size_t)i * cfg->buf_size, cfg->buf_size};
    /* Failure (typically the locked-memory limit) only costs the fixed-buffer
     * operations: transfers fall back to plain reads and writes. */
    int rc = io_uring_register_buffers(ring, iov, cfg->buf_count);
    free(iov);
    return rc == 0;
}

/* Whether the kernel's io_uring has every operation the engine issues (plain
 * reads and writes arrived in 5.6); without them it counts as no io_uring. */
static bool has_operations(struct io_uring *ring)
{
    static const int needed[] = {IORING_OP_NOP,         IORING_OP_WRITE,      IORING_OP_READ,
                                 IORING_OP_WRITE_FIXED, IORING_OP_READ_FIXED, IORING_OP_FSYNC};
    struct io_uring_probe *probe = io_uring_get_probe_ring(ring);
    bool all = probe != NULL;
    for (size_t i = 0; all && i < sizeof needed / sizeof needed[0]; i++)
        all = io_uring_opcode_supported(probe, needed[i]);
    io_uring_free_probe(probe);
    return all;
}

static int uring_open(const ioe_backend_cfg *cfg, ioe_backend **out)
{
    ioe_backend *b = calloc(1, sizeof *b);
    if (!b) return -ENOMEM;
    unsigned entries = pow2_at_least(cfg->depth);
    struct io_uring_params p = {.flags = IORING_SETUP_CQSIZE, .cq_entries = 2 * entries};
    if (cfg->sqpoll) {
        p.flags |= IORING_SETUP_SQPOLL;
        p.sq_thread_idle = 100;
    }
    int rc = io_uring_queue_init_params(entries, &b->ring, &p);
    if (rc < 0 || !has_operations(&b->ring)) {
        if (rc == 0) io_uring_queue_exit(&b->ring);
        free(b);
        return rc < 0 ? rc : -ENOSYS;
    }
    b->e = cfg->engine;
    b->sqpoll = cfg->sqpoll;
    b->registered_buffers = cfg->buf_count > 0 && register_pool(&b->ring, cfg);
    b->file_used = calloc(cfg->max_files, sizeof *b->file_used);
    if (b->file_used && io_uring_register_files_sparse(&b->ring, cfg->max_files) == 0) {
        b->fixed_files = true;
        b->max_files = cfg->max_files;
    }
    *out = b;
    return 0;
}

static void uring_close(ioe_backend *b)
{
    io_uring_queue_exit(&b->ring);
    free(b->file_used);
    free(b);
}

static int uring_file_register(ioe_backend *b, int fd)
{
    if (!b->fixed_files) return -1;
    for (unsigned i = 0; i < b->max_files; i++) {
        if (b->file_used[i]) continue;
        if (io_uring_register_files_update(&b->ring, i, &fd, 1) != 1) return -1;
        b->file_used[i] = true;
        return (int)i;
    }
    return -1;
}

static void uring_file_unregister(ioe_backend *b, int fixed)
{
    int none = -1;
    io_uring_register_files_update(&b->ring, (unsigned)fixed, &none, 1);
    b->file_used[fixed] = false;
}

static void prep_transfer(ioe_backend *b, struct io_uring_sqe *sqe, int fd, const ioe_req *r)
{
    bool fixed_buf = b->registered_buffers && r->buf_index >= 0;
    if (r->op == IOE_WRITE && fixed_buf)
        io_uring_prep_write_fixed(sqe, fd, r->buf, r->len, r->off, r->buf_index);
    else if (r->op == IOE_WRITE)
        io_uring_prep_write(sqe, fd, r->buf, r->len, r->off);
    else if (fixed_buf)
        io_uring_prep_read_fixed(sqe, fd, r->buf, r->len, r->off, r->buf_index);
    else
        io_uring_prep_read(sqe, fd, r->buf, r->len, r->off);
}

static void uring_queue(ioe_backend *b, ioe_req *r)
{
    struct io_uring_sqe *sqe;
    /* The queue has room by the engine's bound; with SQPOLL the kernel thread
     * may still be consuming earlier entries, and submitting lets it catch up. */
    while (!(sqe = io_uring_get_sqe(&b->ring))) io_uring_submit(&b->ring);
    int fd = r->fixed >= 0 ? r->fixed : r->fd;
    if (r->nop) {
        io_uring_prep_nop(sqe);
    } else if (r->op == IOE_WRITE || r->op == IOE_READ) {
        prep_transfer(b, sqe, fd, r);
    } else {
        io_uring_prep_fsync(sqe, fd, r->op == IOE_FDATASYNC ? IORING_FSYNC_DATASYNC : 0);
    }
    if (!r->nop && r->fixed >= 0) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, r);
}

/* -EAGAIN and -EBUSY from io_uring_enter mean "try again later"; the entries
 * stay queued and the next submission takes them. */
static bool transient(int rc)
{
    return rc == -EINTR || rc == -EAGAIN || rc == -EBUSY || rc == -ETIME;
}

static int uring_submit(ioe_backend *b)
{
    int rc;
    do rc = io_uring_submit(&b->ring);
    while (rc == -EINTR);
    return rc < 0 && !transient(rc) ? rc : 0;
}

static int uring_wait(ioe_backend *b, int64_t timeout_ns)
{
    struct io_uring_cqe *cqe;
    int rc;
    if (timeout_ns == 0) {
        rc = io_uring_submit(&b->ring);
    } else if (timeout_ns < 0) {
        rc = io_uring_submit_and_wait(&b->ring, 1);
    } else {
        struct __kernel_timespec ts = {timeout_ns / 1000000000, timeout_ns % 1000000000};
        rc = io_uring_submit_and_wait_timeout(&b->ring, &cqe, 1, &ts, NULL);
    }
    if (rc < 0 && !transient(rc)) return rc;
    int n = 0;
    while (io_uring_peek_cqe(&b->ring, &cqe) == 0) {
        ioe_req *r = io_uring_cqe_get_data(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&b->ring, cqe);
        ioe_core_complete(b->e, r, res);
        n++;
    }
    if (n == 0 && (rc == -EAGAIN || rc == -EBUSY)) {
        /* The kernel is short of memory for the submission: give it a moment. */
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
    }
    return n;
}

static void uring_info(const ioe_backend *b, ioe_info *out)
{
    out->registered_buffers = b->registered_buffers;
    out->fixed_files = b->fixed_files;
    out->sqpoll = b->sqpoll;
}

const ioe_backend_ops ioe_uring_ops = {
    .open = uring_open,
    .close = uring_close,
    .file_register = uring_file_register,
    .file_unregister = uring_file_unregister,
    .queue = uring_queue,
    .submit = uring_submit,
    .wait = uring_wait,
    .info = uring_info,
};
