/* SPDX-License-Identifier: MIT */
/*
 * io.c: `stash bench io`: the I/O engine's bandwidth writing a file in
 * 1 MiB blocks at depth 16, fsyncing it, and reading it back with the page
 * cache dropped, on io_uring and on the thread-pool fallback, buffered and
 * O_DIRECT, beside fio (io_uring engine, same block size, depth and fsync)
 * run in the same invocation.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ioengine/ioengine.h"
#include "tools/bench/bench.h"

#define BLOCK (1u << 20)
#define DEPTH 16u
#define MAX_REPS 1000

enum { SYS_URING, SYS_THREADS, SYS_FIO, NSYS };
enum { WRITE_BUFFERED, READ_BUFFERED, WRITE_DIRECT, READ_DIRECT, NCASES };

static const char *const system_names[NSYS] = {"stash-uring", "stash-threads", "fio"};
static const char *const case_names[NCASES] = {"write/buffered", "read/buffered", "write/direct",
                                               "read/direct"};

typedef struct io_run {
    const char *path;
    uint64_t size;
    bool direct;
    char error[512]; /* why the last pass failed */
} io_run;

/* ------------------------------------------------------------------------ */
/* The engine's passes.                                                      */

/* Keeps DEPTH blocks in flight over the whole file (and one fsync at the end
 * when writing); returns bytes per second, or -1 with run->error set. */
static double stash_transfer(io_run *run, ioe_engine *e, ioe_file *f, bool writing)
{
    void *free_bufs[DEPTH];
    unsigned nfree = 0;
    while (nfree < DEPTH && ioe_buf_get(e, &free_bufs[nfree]) == 0) nfree++;
    for (unsigned i = 0; writing && i < nfree; i++) {
        uint64_t *w = free_bufs[i]; /* bytes that no device could compress away */
        for (size_t k = 0; k < BLOCK / 8; k++) w[k] = (k + 1) * 0x9E3779B97F4A7C15ull ^ i;
    }
    uint64_t off = 0, t0 = bench_now_ns();
    bool synced = !writing;
    int rc = 0;
    while (rc == 0 && (off < run->size || !synced || ioe_outstanding(e) > 0)) {
        for (; rc == 0 && off < run->size && nfree > 0; off += BLOCK) {
            void *b = free_bufs[--nfree];
            rc = writing ? ioe_write(f, b, BLOCK, off, b) : ioe_read(f, b, BLOCK, off, b);
        }
        if (rc == 0 && off >= run->size && !synced && ioe_outstanding(e) < DEPTH) {
            rc = ioe_fsync(f, NULL); /* the engine holds it until every write has finished */
            synced = rc == 0;
        }
        ioe_cqe c[DEPTH];
        int n = rc < 0 ? rc : ioe_reap(e, c, DEPTH, 1);
        if (n < 0) {
            snprintf(run->error, sizeof run->error, "%s: %s", run->path, strerror(-n));
            return -1;
        }
        for (int i = 0; i < n; i++) {
            if (c[i].res < 0 || c[i].done != c[i].len) {
                ioe_cqe_describe(&c[i], run->error, sizeof run->error);
                rc = c[i].res < 0 ? c[i].res : -EIO;
            }
            if (c[i].user) free_bufs[nfree++] = c[i].user;
        }
    }
    double secs = (double)(bench_now_ns() - t0) / 1e9;
    return rc < 0 ? -1 : (double)run->size / secs;
}

static double stash_pass(io_run *run, int backend, bool writing)
{
    ioe_engine *e;
    int rc = ioe_engine_open(
        &(ioe_opts){.backend = backend, .depth = DEPTH, .buf_count = DEPTH, .buf_size = BLOCK}, &e);
    if (rc < 0) {
        snprintf(run->error, sizeof run->error, "%s engine: %s", ioe_backend_name(backend),
                 strerror(-rc));
        return -1;
    }
    int flags = (writing ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | (run->direct ? O_DIRECT : 0);
    ioe_file *f;
    double bps = -1;
    rc = ioe_file_open(e, run->path, flags, 0644, &f);
    if (rc < 0) {
        snprintf(run->error, sizeof run->error, "open %s: %s", run->path, strerror(-rc));
    } else {
        /* Read from the device, not from the pages the write left behind; and
         * declare the sequential pass, as fio does by default (fadvise_hint). */
        if (!writing) {
            posix_fadvise(ioe_file_fd(f), 0, 0, POSIX_FADV_DONTNEED);
            posix_fadvise(ioe_file_fd(f), 0, 0, POSIX_FADV_SEQUENTIAL);
        }
        bps = stash_transfer(run, e, f, writing);
    }
    ioe_engine_close(e);
    return bps;
}

static double fio_pass(io_run *run, bool writing)
{
    double bps;
    if (bench_fio(run->path, run->size, writing, run->direct, &bps) < 0) {
        snprintf(run->error, sizeof run->error, "fio %s failed", writing ? "write" : "read");
        return -1;
    }
    return bps;
}

/* ------------------------------------------------------------------------ */

typedef struct io_bench {
    bench_opts o;
    io_run run;
    double v[NCASES][NSYS][MAX_REPS];
    const char *skipped[NCASES][NSYS];
    char why[NCASES][NSYS][512];
} io_bench;

/* Removes the file and commits the removal (with its discards, on a
 * filesystem mounted with discard), so that the next pass does not pay for it. */
static void remove_file(const char *path)
{
    unlink(path);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    int fd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        syncfs(fd);
        close(fd);
    }
}

static double one_pass(io_bench *b, int sys, bool writing)
{
    if (sys == SYS_FIO) return fio_pass(&b->run, writing);
    return stash_pass(&b->run, sys == SYS_URING ? IOE_URING : IOE_THREADS, writing);
}

/* Writes then reads the file with one system in one mode; marks the cases
 * skipped (with the reason) if a pass fails. */
static void measure(io_bench *b, int sys, bool direct, int rep)
{
    int wc = direct ? WRITE_DIRECT : WRITE_BUFFERED, rc = wc + 1;
    b->run.direct = direct;
    bench_progress(&b->o, "io: %s %s, repetition %d of %d", system_names[sys],
                   direct ? "direct" : "buffered", rep + 1, b->o.reps);
    double w = one_pass(b, sys, true);
    double r = w > 0 ? one_pass(b, sys, false) : -1;
    remove_file(b->run.path);
    b->v[wc][sys][rep] = w;
    b->v[rc][sys][rep] = r;
    for (int c = wc; c <= rc; c++) {
        if (b->v[c][sys][rep] > 0 || b->skipped[c][sys]) continue;
        snprintf(b->why[c][sys], sizeof b->why[c][sys], "%s", b->run.error);
        b->skipped[c][sys] = b->why[c][sys];
    }
}

static bool direct_supported(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_DIRECT, 0644);
    if (fd >= 0) close(fd);
    unlink(path);
    return fd >= 0;
}

static void report(io_bench *b)
{
    for (int c = 0; c < NCASES; c++) {
        for (int s = 0; s < NSYS; s++) {
            bench_result res = {.bench = "io",
                                .name = case_names[c],
                                .system = system_names[s],
                                .unit = "bytes/s",
                                .skipped = b->skipped[c][s]};
            if (!res.skipped) {
                double sorted[MAX_REPS];
                memcpy(sorted, b->v[c][s], (size_t)b->o.reps * sizeof *sorted);
                res = bench_spread(res, sorted, b->o.reps);
            }
            bench_report(&b->o, &res);
        }
    }
    for (int c = 0; c < NCASES; c++) {
        if (b->skipped[c][SYS_FIO]) continue;
        for (int s = SYS_URING; s <= SYS_THREADS; s++)
            if (!b->skipped[c][s])
                bench_report_ratio(&b->o, "io", case_names[c],
                                   s == SYS_URING ? "stash-uring/fio" : "stash-threads/fio",
                                   b->v[c][s], b->v[c][SYS_FIO], b->o.reps);
    }
}

/* Takes "--dir DIR" and "--size N" out of argv (bench_parse knows neither). */
static int take_own_args(int *argc, char **argv, const char **dir, uint64_t *size)
{
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        bool is_dir = strcmp(argv[i], "--dir") == 0, is_size = strcmp(argv[i], "--size") == 0;
        if (!is_dir && !is_size) {
            argv[out++] = argv[i];
            continue;
        }
        if (++i >= *argc) return -EINVAL;
        if (is_dir)
            *dir = argv[i];
        else if (tool_parse_size(argv[i], size) < 0 || *size < BLOCK)
            return -EINVAL;
    }
    *argc = out;
    return 0;
}

int bench_io(int argc, char **argv)
{
    static const char usage[] =
        "Write a file in 1 MiB blocks at depth 16, fsync it, then read it back with the\n"
        "page cache dropped: the engine on io_uring and on its thread-pool fallback,\n"
        "buffered and O_DIRECT, beside fio (io_uring engine, same block size and depth).\n"
        "  --dir DIR    where the file goes (default /var/tmp); it is removed afterwards\n"
        "  --size N     file size (default 2G, 256M with --quick)\n";
    const char *dir = "/var/tmp";
    uint64_t size = 0;
    if (take_own_args(&argc, argv, &dir, &size) < 0) {
        fprintf(stderr, "stash bench io: --dir takes a directory, --size at least 1M\n%s", usage);
        return 2;
    }
    if (access(dir, W_OK | X_OK) < 0) {
        char what[600];
        snprintf(what, sizeof what, "bench io: --dir %s", dir);
        return tool_fail(what, -errno);
    }
    io_bench *b = calloc(1, sizeof *b);
    if (!b) return tool_fail("bench io", -ENOMEM);
    int rc = bench_parse(argc, argv, usage, &b->o);
    if (rc == 0 && bench_heap_only(&b->o, "io") < 0) rc = -1;
    if (rc == 0 && bench_check_case(&b->o, "io", case_names, NCASES) < 0) rc = -1;
    if (rc) {
        free(b);
        return rc < 0 ? 2 : 0;
    }
    if (!size) size = b->o.quick ? 256ull << 20 : 2ull << 30;
    b->run.size = ioe_align_up(size, BLOCK);
    bench_header(&b->o, "io", "a file of %llu MiB in %s, 1 MiB blocks",
                 (unsigned long long)(b->run.size >> 20), dir);
    bench_setup(&b->o, "fio", BENCH_FIO_SETUP);
    char path[512];
    snprintf(path, sizeof path, "%s/stash-bench-io.%d", dir, (int)getpid());
    b->run.path = path;

    bool have_fio = bench_fio_installed(), have_direct = direct_supported(path);
    for (int c = 0; c < NCASES; c++) {
        if (!have_fio) b->skipped[c][SYS_FIO] = "fio is not installed (apt-get install fio)";
        if (!have_direct && (c == WRITE_DIRECT || c == READ_DIRECT))
            for (int s = 0; s < NSYS; s++) b->skipped[c][s] = "the directory has no O_DIRECT";
    }
    /* The systems in a new order each repetition: the machine is noisy,
     * and the first pass after a pause tends to be slow. */
    remove_file(path);
    for (int rep = 0; rep < b->o.reps; rep++)
        for (int direct = 0; direct <= 1; direct++) {
            int order[NSYS];
            bench_shuffle(order, NSYS, (uint64_t)direct, rep);
            for (int i = 0; i < NSYS; i++)
                if (!b->skipped[direct ? WRITE_DIRECT : WRITE_BUFFERED][order[i]])
                    measure(b, order[i], direct, rep);
        }
    report(b);
    free(b);
    return 0;
}
