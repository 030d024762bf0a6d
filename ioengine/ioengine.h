/* SPDX-License-Identifier: MIT */
/*
 * ioengine.h: asynchronous file I/O for the persistence engine: writes and
 * reads at offsets, fsync ordered after the writes before it, a bounded number
 * of requests in flight, completions the caller drains. Two backends behind one
 * interface: io_uring, and a thread pool doing pwrite/pread/fsync where
 * io_uring is unavailable. Faults can be injected for tests.
 *
 * An engine is used by one thread at a time. Every function that can fail
 * returns 0 (or a count) on success and -errno otherwise; none prints except
 * the one log line when the fallback is chosen automatically (routed through
 * ioe_opts.log). docs/ioengine.md explains the model.
 */
#ifndef STASH_IOENGINE_H
#define STASH_IOENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct ioe_engine ioe_engine;
typedef struct ioe_file ioe_file;

/* Backends. */
enum {
    IOE_AUTO = 0,    /* $STASH_IO if set, otherwise io_uring, falling back to threads */
    IOE_URING = 1,   /* io_uring; fails if the kernel refuses it */
    IOE_THREADS = 2, /* the thread pool with pwrite/pread/fsync */
};

/* Operations, as reported in completions. */
enum {
    IOE_WRITE = 1,
    IOE_READ = 2,
    IOE_FSYNC = 3,
    IOE_FDATASYNC = 4,
};

/* Receives the one line the engine may log; ctx is ioe_opts.log_ctx. */
typedef void ioe_log_fn(void *ctx, const char *line);

/* Engine options; a zero field means its default. */
typedef struct ioe_opts {
    int backend;        /* IOE_AUTO, IOE_URING or IOE_THREADS */
    unsigned depth;     /* requests outstanding (submitted, not yet reaped); 0: 32; at most 4096 */
    unsigned threads;   /* threads of the fallback pool; 0: 4; at most 64 */
    unsigned buf_count; /* staging buffers in the engine's pool; 0: depth; at most 1024 */
    size_t buf_size;    /* bytes per staging buffer, rounded up to 4096; 0: 1 MiB; at most 1 GiB */
    unsigned max_files; /* io_uring registered-file slots; 0: 64 (files beyond use plain fds) */
    bool sqpoll;        /* io_uring with a kernel submission thread (SQPOLL); default off */
    const char *faults; /* fault specification (docs/ioengine.md); NULL: $STASH_IO_FAULT */
    ioe_log_fn *log;    /* where the fallback line goes; NULL: nowhere (ioe_info has it) */
    void *log_ctx;
} ioe_opts;

/* One finished request, as ioe_reap() hands it out. */
typedef struct ioe_cqe {
    void *user;       /* the tag given with the request */
    ioe_file *file;   /* the file it was for */
    const char *path; /* that file's path; valid until ioe_file_close() */
    uint64_t offset;  /* where the request started; 0 for fsync */
    uint64_t len;     /* bytes requested; 0 for fsync */
    uint64_t done;    /* bytes transferred: len, or fewer at end of file or before an error */
    int op;           /* IOE_WRITE, IOE_READ, IOE_FSYNC or IOE_FDATASYNC */
    int res;          /* 0, or -errno; a failed write or read failed at offset + done */
} ioe_cqe;

/* What an engine runs with and what it has done. */
typedef struct ioe_info {
    int backend;             /* IOE_URING or IOE_THREADS */
    unsigned depth;          /* as configured */
    unsigned threads;        /* fallback pool threads; 0 on io_uring */
    unsigned buf_count;      /* staging buffers */
    size_t buf_size;         /* bytes each */
    bool registered_buffers; /* io_uring: the pool is registered (fixed-buffer ops) */
    bool fixed_files;        /* io_uring: files are registered where a slot is free */
    bool sqpoll;             /* io_uring: a kernel thread polls the submission queue */
    const char
        *fallback_reason;   /* why io_uring was not used when IOE_AUTO chose threads; or NULL */
    uint64_t submitted;     /* requests accepted */
    uint64_t completed;     /* requests finished (success or error) */
    uint64_t continued;     /* short transfers resumed where they stopped */
    uint64_t retried;       /* attempts repeated after -EAGAIN or -EINTR */
    uint64_t faults;        /* faults injected */
    uint64_t bytes_written; /* bytes moved by writes that succeeded */
    uint64_t bytes_read;    /* bytes moved by reads that succeeded */
    uint64_t errors;        /* requests that failed */
    unsigned max_in_flight; /* most attempts handed to the backend at once */
} ioe_info;

/* Alignment that O_DIRECT needs: buffers in memory and offsets/lengths in the file. */
typedef struct ioe_align {
    uint32_t mem;    /* buffer address alignment */
    uint32_t offset; /* file offset and length alignment */
} ioe_align;

/* ------------------------------------------------------------------------ */
/* The engine.                                                               */

/* Opens an engine (opts may be NULL). Backend choice: opts->backend, else
 * $STASH_IO ("uring" or "threads"), else io_uring with a fallback to threads
 * on -EPERM, -ENOSYS or -ENOMEM from its setup, logged once. Returns 0, or
 * -EINVAL for bad options or a bad fault specification, or the setup error.
 * The caller owns *out and releases it with ioe_engine_close(). */
int ioe_engine_open(const ioe_opts *opts, ioe_engine **out);

/* Waits for every request still in flight, discards unreaped completions,
 * closes files still open, and frees the engine. Accepts NULL. */
void ioe_engine_close(ioe_engine *e);

/* Fills *out with the engine's configuration and counters. */
void ioe_engine_info(const ioe_engine *e, ioe_info *out);

/* "io_uring" or "threads" for IOE_URING or IOE_THREADS; "auto" or "?" otherwise. */
const char *ioe_backend_name(int backend);

/* Replaces the engine's faults with spec (NULL or "" clears them) and restarts
 * their counters. "setup:" faults have no effect here. Returns 0 or -EINVAL. */
int ioe_fault_set(ioe_engine *e, const char *spec);

/* ------------------------------------------------------------------------ */
/* Files.                                                                    */

/* Opens path with open(2) flags (O_DIRECT allowed, O_CREAT uses mode). For
 * O_DIRECT files, the alignment comes from statx (4096 if unknown). Returns 0
 * or -errno; the caller owns *out until ioe_file_close(). */
int ioe_file_open(ioe_engine *e, const char *path, int oflags, mode_t mode, ioe_file **out);
/* As ioe_file_open, for name in the directory dirfd (AT_FDCWD: the working
 * directory); label is the path messages give (NULL: name). */
int ioe_file_openat(ioe_engine *e, int dirfd, const char *name, const char *label, int oflags,
                    mode_t mode, ioe_file **out);

/* Closes a file. Returns -EBUSY (and keeps it open) while requests for it are
 * outstanding; otherwise 0 or the error of close(2). The file is gone either way
 * except for -EBUSY. */
int ioe_file_close(ioe_file *f);

/* The path the file was opened with; owned by the file. */
const char *ioe_file_path(const ioe_file *f);

/* The file's descriptor, for calls the engine does not make (ftruncate,
 * fstat); owned by the file. */
int ioe_file_fd(const ioe_file *f);

/* The alignment O_DIRECT requires of this file's requests; {1, 1} if buffered. */
ioe_align ioe_file_align(const ioe_file *f);

/* ------------------------------------------------------------------------ */
/* Requests. Each takes one of the engine's depth slots until reaped; with all
 * slots taken it returns -EBUSY (reap, then retry). Requests are queued and
 * handed to the kernel by ioe_submit() or ioe_reap(). Buffers must stay valid
 * and untouched until the completion is reaped. Short transfers are resumed,
 * -EAGAIN and -EINTR retried; other errors arrive in the completion.         */

/* Writes len bytes from buf at offset off. Returns 0, -EBUSY, or -EINVAL if
 * len is 0 or an O_DIRECT file's alignment is not met. */
int ioe_write(ioe_file *f, const void *buf, size_t len, uint64_t off, void *user);

/* Reads len bytes into buf from offset off; a completion with done < len and
 * res 0 means end of file. Returns as ioe_write(). */
int ioe_read(ioe_file *f, void *buf, size_t len, uint64_t off, void *user);

/* Makes every write submitted to f before this call durable: the fsync goes to
 * the kernel only once those writes have finished, and its completion comes
 * after theirs. It does not repeat their errors. Returns 0 or -EBUSY. */
int ioe_fsync(ioe_file *f, void *user);

/* As ioe_fsync() with fdatasync(2): file size and data, not every attribute. */
int ioe_fdatasync(ioe_file *f, void *user);

/* Hands queued requests to the kernel (or the pool) without waiting. Returns 0
 * or -errno from the submission; the requests stay queued after an error. */
int ioe_submit(ioe_engine *e);

/* Submits what is queued, then moves up to max finished requests into
 * out[0 .. max-1] in completion order, waiting until at least min are there
 * (fewer if fewer are outstanding). Returns how many, or -errno if waiting
 * failed. */
int ioe_reap(ioe_engine *e, ioe_cqe *out, unsigned max, unsigned min);

/* Requests outstanding: submitted and not yet reaped. */
unsigned ioe_outstanding(const ioe_engine *e);

/* Writes "write PATH at offset N: ERROR" (or "fsync PATH: ERROR") into buf.
 * Returns what snprintf returns. */
int ioe_cqe_describe(const ioe_cqe *c, char *buf, size_t size);

/* ------------------------------------------------------------------------ */
/* Aligned memory and the staging-buffer pool.                              */

/* Takes a free staging buffer of ioe_info.buf_size bytes, aligned to 4096,
 * from the engine's pool (registered with io_uring where possible: O_DIRECT
 * writes and reads inside it use fixed-buffer operations). Returns 0 or
 * -ENOBUFS. */
int ioe_buf_get(ioe_engine *e, void **out);

/* Returns a staging buffer to the pool. Returns 0, or -EINVAL if buf is not
 * a taken buffer of this pool. */
int ioe_buf_put(ioe_engine *e, void *buf);

/* The O_DIRECT alignment of the open file fd: statx STATX_DIOALIGN where the
 * kernel and filesystem report it, 4096 for both otherwise. Returns 0, -errno
 * from statx, or -EOPNOTSUPP if the filesystem reports no direct I/O. */
int ioe_dio_align(int fd, ioe_align *out);

/* Allocates size bytes (rounded up to align) aligned to align (a power of
 * two; 0: 4096). Returns 0 or -EINVAL / -ENOMEM; free *out with free(). */
int ioe_aligned_alloc(size_t size, size_t align, void **out);

/* x rounded up to a multiple of a (a power of two). */
static inline uint64_t ioe_align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) & ~(a - 1);
}

/* ------------------------------------------------------------------------ */
/* Between the engine (engine.c) and its parts (uring.c, threads.c, fault.c,  */
/* align.c). Not for callers.                                                 */

/* One attempt as a backend performs it. */
typedef struct ioe_req {
    int op;               /* IOE_WRITE, IOE_READ, IOE_FSYNC or IOE_FDATASYNC */
    int fd;               /* the file's descriptor */
    int fixed;            /* its registered-file index, or -1 */
    int buf_index;        /* O_DIRECT: the pool buffer holding [buf, buf + len); or -1 */
    bool nop;             /* a fault replaces the operation: perform nothing, report 0 */
    void *buf;            /* read and write: where */
    uint32_t len;         /* read and write: how many bytes */
    uint64_t off;         /* read and write: at which file offset */
    int res;              /* the threads backend's result slot */
    struct ioe_req *next; /* the backend's queue link */
} ioe_req;

typedef struct ioe_backend ioe_backend;

/* What a backend is opened with. */
typedef struct ioe_backend_cfg {
    ioe_engine *engine;
    unsigned depth;
    unsigned threads;
    unsigned max_files;
    bool sqpoll;
    void *pool; /* buf_count buffers of buf_size bytes, contiguous */
    size_t buf_size;
    unsigned buf_count;
} ioe_backend_cfg;

/* A backend: it performs attempts and reports each through ioe_core_complete()
 * from within wait(), on the engine's thread. */
typedef struct ioe_backend_ops {
    int (*open)(const ioe_backend_cfg *cfg, ioe_backend **out);
    void (*close)(ioe_backend *b);
    int (*file_register)(ioe_backend *b, int fd); /* a fixed index, or -1 */
    void (*file_unregister)(ioe_backend *b, int fixed);
    void (*queue)(ioe_backend *b, ioe_req *r); /* never fails: the engine bounds the count */
    int (*submit)(ioe_backend *b);
    /* Submits what is queued, waits up to timeout_ns (< 0: without limit, 0: not
     * at all) for a finished attempt and reports every finished one. Returns how
     * many it reported (0 on timeout) or -errno. */
    int (*wait)(ioe_backend *b, int64_t timeout_ns);
    void (*info)(const ioe_backend *b, ioe_info *out);
} ioe_backend_ops;

/* The two backends: io_uring (uring.c) and the thread pool (threads.c). */
extern const ioe_backend_ops ioe_uring_ops;
extern const ioe_backend_ops ioe_threads_ops;

/* Reports the result of one attempt: bytes transferred, 0, or -errno. */
void ioe_core_complete(ioe_engine *e, ioe_req *r, int res);

/* Parsed fault specification and its counters. */
#define IOE_MAX_FAULT_RULES 8
typedef struct ioe_faults {
    struct {
        int op;       /* IOE_WRITE, IOE_READ or IOE_FSYNC (covers fdatasync) */
        uint64_t nth; /* 1-based request number of that kind */
        int err;      /* positive errno */
    } rule[IOE_MAX_FAULT_RULES];
    unsigned nrules;
    bool short_io;     /* reads and writes transfer at most half of what remains */
    uint32_t delay_ms; /* every completion is held this long */
    int setup_err;     /* positive errno io_uring setup fails with */
    uint64_t count[3]; /* requests seen: writes, reads, fsyncs */
} ioe_faults;

/* Parses spec (NULL or "" is no fault) into *out. Returns 0 or -EINVAL. */
int ioe_faults_parse(const char *spec, ioe_faults *out);

/* Counts a new request of kind op; returns the positive errno to inject, or 0. */
int ioe_faults_pick(ioe_faults *f, int op);

/* The staging-buffer pool: contiguous, page-aligned buffers and a free stack. */
typedef struct ioe_pool {
    char *base;
    size_t buf_size;
    unsigned count;
    unsigned nfree;
    unsigned *free; /* indices of free buffers; [0 .. nfree-1] */
    bool *taken;
} ioe_pool;

/* Maps count buffers of buf_size bytes. Returns 0 or -ENOMEM. */
int ioe_pool_init(ioe_pool *p, unsigned count, size_t buf_size);

/* Unmaps the pool; accepts a zeroed pool. */
void ioe_pool_fini(ioe_pool *p);

/* The index of the pool buffer that holds all of [buf, buf + len), or -1. */
int ioe_pool_index(const ioe_pool *p, const void *buf, size_t len);

/* Takes a free buffer. Returns 0 or -ENOBUFS. */
int ioe_pool_take(ioe_pool *p, void **out);

/* Gives a taken buffer back. Returns 0 or -EINVAL. */
int ioe_pool_give(ioe_pool *p, void *buf);

#endif /* STASH_IOENGINE_H */
