/* SPDX-License-Identifier: MIT */
/*
 * test_ioengine.c: the I/O engine on both backends: every operation, fsync
 * ordering, short transfers resumed, injected faults surfacing with their
 * file and offset, many files at once, the bounded depth; then how the
 * backend is chosen and how faults are specified.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ioengine/ioengine.h"

static char dir[256];

static void make_dir(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/stash-ioe-XXXXXX", base && *base ? base : "/var/tmp");
    cr_assert_not_null(mkdtemp(dir), "mkdtemp %s: %s", dir, strerror(errno));
}

static void remove_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0, "cleaning %s", dir);
}

static const char *path_of(const char *name)
{
    static char paths[8][300];
    static unsigned next;
    char *p = paths[next++ % 8];
    snprintf(p, 300, "%s/%s", dir, name);
    return p;
}

/* io_uring may be refused where these tests run; its variants skip, saying so. */
static ioe_engine *open_engine(int backend, ioe_opts o)
{
    o.backend = backend;
    ioe_engine *e = NULL;
    int rc = ioe_engine_open(&o, &e);
    if (backend == IOE_URING && (rc == -EPERM || rc == -ENOSYS || rc == -ENOMEM))
        cr_skip_test("io_uring is unavailable on this machine: %s", strerror(-rc));
    cr_assert_eq(rc, 0, "engine open (%s): %s", ioe_backend_name(backend), strerror(-rc));
    return e;
}

static ioe_file *open_file(ioe_engine *e, const char *name, int flags)
{
    ioe_file *f = NULL;
    int rc = ioe_file_open(e, path_of(name), flags, 0644, &f);
    cr_assert_eq(rc, 0, "open %s: %s", name, strerror(-rc));
    return f;
}

/* Reaps exactly n completions into out. */
static void reap_n(ioe_engine *e, ioe_cqe *out, unsigned n)
{
    for (unsigned got = 0; got < n;) {
        int rc = ioe_reap(e, out + got, n - got, 1);
        cr_assert_gt(rc, 0, "reap after %u of %u: %s", got, n, rc ? strerror(-rc) : "nothing");
        got += (unsigned)rc;
    }
}

static void fill(void *buf, size_t len, unsigned seed)
{
    unsigned char *p = buf;
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        p[i] = (unsigned char)x;
    }
}

/* Asserts that the file's bytes at off are exactly buf. */
static void expect_on_disk(const char *path, const void *buf, size_t len, uint64_t off)
{
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0, "open %s", path);
    char *got = malloc(len);
    ssize_t n = pread(fd, got, len, (off_t)off);
    close(fd);
    cr_assert_eq(n, (ssize_t)len, "%s: read %zd of %zu bytes at %llu", path, n, len,
                 (unsigned long long)off);
    cr_assert_eq(memcmp(got, buf, len), 0, "%s: bytes at %llu differ from those written", path,
                 (unsigned long long)off);
    free(got);
}

static void expect_ok(const ioe_cqe *c)
{
    char what[512];
    ioe_cqe_describe(c, what, sizeof what);
    cr_assert_eq(c->res, 0, "%s", what);
    cr_assert_eq(c->done, c->len, "%s: %llu of %llu bytes", what, (unsigned long long)c->done,
                 (unsigned long long)c->len);
}

/* Each BOTH test runs once per backend, as libuv runs its fs tests. */
#define BOTH(name)                                                                                 \
    static void name(int backend);                                                                 \
    Test(ioengine, name##_uring, .init = make_dir, .fini = remove_dir)                             \
    {                                                                                              \
        name(IOE_URING);                                                                           \
    }                                                                                              \
    Test(ioengine, name##_threads, .init = make_dir, .fini = remove_dir)                           \
    {                                                                                              \
        name(IOE_THREADS);                                                                         \
    }                                                                                              \
    static void name(int backend)

#define BLOCK 65536u
/* A one-page staging pool: most tests write from their own buffers. */
#define SMALL .buf_count = 1, .buf_size = 4096

BOTH(write_fsync_read_roundtrip)
{
    ioe_engine *e = open_engine(backend, (ioe_opts){SMALL});
    ioe_file *f = open_file(e, "data", O_RDWR | O_CREAT | O_TRUNC);
    char *out = malloc(4 * BLOCK), *in = calloc(4, BLOCK);
    fill(out, 4 * BLOCK, 1);
    for (unsigned i = 0; i < 4; i++)
        cr_assert_eq(ioe_write(f, out + i * BLOCK, BLOCK, i * BLOCK, (void *)(uintptr_t)i), 0);
    cr_assert_eq(ioe_fsync(f, (void *)(uintptr_t)4), 0);
    cr_assert_eq(ioe_submit(e), 0);
    ioe_cqe c[5];
    reap_n(e, c, 5);
    for (unsigned i = 0; i < 5; i++) {
        expect_ok(&c[i]);
        cr_assert_eq(c[i].file, f);
        cr_assert_str_eq(c[i].path, ioe_file_path(f));
    }
    expect_on_disk(ioe_file_path(f), out, 4 * BLOCK, 0);
    for (unsigned i = 0; i < 4; i++)
        cr_assert_eq(ioe_read(f, in + i * BLOCK, BLOCK, i * BLOCK, NULL), 0);
    reap_n(e, c, 4);
    for (unsigned i = 0; i < 4; i++) {
        expect_ok(&c[i]);
        cr_assert_eq(c[i].op, IOE_READ);
    }
    cr_assert_eq(memcmp(in, out, 4 * BLOCK), 0, "the bytes read back differ");
    cr_assert_eq(ioe_file_close(f), 0);
    ioe_info info;
    ioe_engine_info(e, &info);
    cr_assert_eq(info.backend, backend);
    cr_assert_eq(info.submitted, 9);
    cr_assert_eq(info.completed, 9);
    free(out), free(in);
    ioe_engine_close(e);
}

BOTH(fdatasync_completes)
{
    ioe_engine *e = open_engine(backend, (ioe_opts){SMALL});
    ioe_file *f = open_file(e, "data", O_WRONLY | O_CREAT | O_TRUNC);
    char buf[4096];
    fill(buf, sizeof buf, 2);
    cr_assert_eq(ioe_write(f, buf, sizeof buf, 0, NULL), 0);
    cr_assert_eq(ioe_fdatasync(f, NULL), 0);
    ioe_cqe c[2];
    reap_n(e, c, 2);
    cr_assert_eq(c[1].op, IOE_FDATASYNC);
    expect_ok(&c[0]);
    expect_ok(&c[1]);
    expect_on_disk(ioe_file_path(f), buf, sizeof buf, 0);
    ioe_engine_close(e);
}

BOTH(pool_buffers_roundtrip)
{
    ioe_engine *e = open_engine(backend, (ioe_opts){.buf_count = 2, .buf_size = 8192});
    ioe_file *f = open_file(e, "data", O_RDWR | O_CREAT | O_TRUNC);
    void *a, *b, *none;
    cr_assert_eq(ioe_buf_get(e, &a), 0);
    cr_assert_eq(ioe_buf_get(e, &b), 0);
    cr_assert_eq(ioe_buf_get(e, &none), -ENOBUFS);
    cr_assert_eq((uintptr_t)a % 4096, 0, "pool buffers are page-aligned");
    fill(a, 8192, 3);
    cr_assert_eq(ioe_write(f, a, 8192, 0, NULL), 0);
    ioe_cqe c;
    reap_n(e, &c, 1);
    expect_ok(&c);
    cr_assert_eq(ioe_read(f, b, 8192, 0, NULL), 0);
    reap_n(e, &c, 1);
    expect_ok(&c);
    cr_assert_eq(memcmp(a, b, 8192), 0);
    cr_assert_eq(ioe_buf_put(e, b), 0);
    cr_assert_eq(ioe_buf_put(e, b), -EINVAL, "a buffer cannot be returned twice");
    cr_assert_eq(ioe_buf_put(e, (char *)a + 1), -EINVAL, "only a buffer's start is accepted");
    cr_assert_eq(ioe_buf_get(e, &none), 0);
    ioe_engine_close(e);
}

BOTH(direct_io_roundtrip)
{
    ioe_engine *e = open_engine(backend, (ioe_opts){SMALL});
    ioe_file *f = NULL;
    int rc = ioe_file_open(e, path_of("direct"), O_RDWR | O_CREAT | O_DIRECT, 0644, &f);
    if (rc == -EINVAL || rc == -EOPNOTSUPP)
        cr_skip_test("the filesystem of %s has no O_DIRECT: %s", dir, strerror(-rc));
    cr_assert_eq(rc, 0, "open O_DIRECT: %s", strerror(-rc));
    ioe_align al = ioe_file_align(f);
    size_t len = ioe_align_up(3 * BLOCK, al.offset);
    char *out, *in;
    cr_assert_eq(ioe_aligned_alloc(len + al.mem, al.mem, (void **)&out), 0);
    cr_assert_eq(ioe_aligned_alloc(len, al.mem, (void **)&in), 0);
    fill(out, len, 4);
    cr_assert_eq(ioe_write(f, out, len, 0, NULL), 0);
    cr_assert_eq(ioe_fsync(f, NULL), 0);
    ioe_cqe c[2];
    reap_n(e, c, 2);
    expect_ok(&c[0]);
    expect_ok(&c[1]);
    cr_assert_eq(ioe_read(f, in, len, 0, NULL), 0);
    reap_n(e, c, 1);
    expect_ok(&c[0]);
    cr_assert_eq(memcmp(in, out, len), 0);
    if (al.mem > 1)
        cr_assert_eq(ioe_write(f, out + 1, len, 0, NULL), -EINVAL, "a misaligned buffer");
    if (al.offset > 1) {
        cr_assert_eq(ioe_write(f, out, len - 1, 0, NULL), -EINVAL, "a misaligned length");
        cr_assert_eq(ioe_write(f, out, len, 1, NULL), -EINVAL, "a misaligned offset");
    }
    cr_assert_eq(ioe_outstanding(e), 0, "refused requests take no slot");
    free(out), free(in);
    ioe_engine_close(e);
}

BOTH(read_past_end_stops_at_end_of_file)
{
    ioe_engine *e = open_engine(backend, (ioe_opts){SMALL});
    ioe_file *f = open_file(e, "data", O_RDWR | O_CREAT | O_TRUNC);
    char buf[16384];
    fill(buf, 10000, 5);
    cr_assert_eq(ioe_write(f, buf, 10000, 0, NULL), 0);
    ioe_cqe c;
    reap_n(e, &c, 1);
    expect_ok(&c);
    cr_assert_eq(ioe_read(f, buf, sizeof buf, 0, NULL), 0);
    reap_n(e, &c, 1);
    cr_assert_eq(c.res, 0);
    cr_assert_eq(c.done, 10000, "read %llu bytes of a 10000-byte file", (unsigned long long)c.done);
    ioe_engine_close(e);
}

/* Every write submitted before an fsync is delivered before it, also when the
 * writes finish late (delay) and in pieces (short). */
BOTH(fsync_completes_after_earlier_writes)
{
    ioe_engine *e = open_engine(backend, (ioe_opts){SMALL, .faults = "short,delay:5"});
    ioe_file *f = open_file(e, "data", O_RDWR | O_CREAT | O_TRUNC);
    ioe_file *g = open_file(e, "other", O_RDWR | O_CREAT | O_TRUNC);
    char *buf = malloc(8 * BLOCK);
    fill(buf, 8 * BLOCK, 6);
    for (uintptr_t i = 0; i < 8; i++)
        cr_assert_eq(ioe_write(f, buf + i * BLOCK, BLOCK, i * BLOCK, (void *)i), 0);
    cr_assert_eq(ioe_write(g, buf, BLOCK, 0, (void *)100), 0);
    cr_assert_eq(ioe_fsync(f, (void *)8), 0);
    cr_assert_eq(ioe_write(f, buf, BLOCK, 8 * BLOCK, (void *)9), 0);
    ioe_cqe c[11];
    reap_n(e, c, 11);
    int fsync_at = -1;
    for (int i = 0; i < 11; i++) {
        expect_ok(&c[i]);
        if (c[i].op == IOE_FSYNC) fsync_at = i;
    }
    cr_assert_geq(fsync_at, 0);
    for (int i = fsync_at + 1; i < 11; i++)
        cr_assert(c[i].file != f || (uintptr_t)c[i].user == 9,
                  "write %lu to the file was delivered after the fsync that covers it",
                  (unsigned long)(uintptr_t)c[i].user);
    expect_on_disk(ioe_file_path(f), buf, 8 * BLOCK, 0);
    free(buf);
    ioe_engine_close(e);
}

BOTH(short_transfers_are_continued)
{
    ioe_engine *e = open_engine(backend, (ioe_opts){SMALL, .faults = "short"});
    ioe_file *f = open_file(e, "data", O_RDWR | O_CREAT | O_TRUNC);
    size_t len = 1 << 20;
    char *out = malloc(len), *in = calloc(1, len);
    fill(out, len, 7);
    cr_assert_eq(ioe_write(f, out, len, 4096, NULL), 0);
    ioe_cqe c;
    reap_n(e, &c, 1);
    expect_ok(&c);
    cr_assert_eq(c.offset, 4096);
    expect_on_disk(ioe_file_path(f), out, len, 4096);
    ioe_info info;
    ioe_engine_info(e, &info);
    cr_assert_gt(info.continued, 10, "a 1 MiB write halved each time resumes about 20 times");
    cr_assert_eq(ioe_read(f, in, len, 4096, NULL), 0);
    reap_n(e, &c, 1);
    expect_ok(&c);
    cr_assert_eq(memcmp(in, out, len), 0);
    free(out), free(in);
    ioe_engine_close(e);
}

/* Writes n blocks of 4096 bytes at offsets 0, 4096, ... and reaps them all. */
static void write_blocks(ioe_engine *e, ioe_file *f, unsigned n, ioe_cqe *c)
{
    static char buf[4096];
    for (uintptr_t i = 0; i < n; i++) cr_assert_eq(ioe_write(f, buf, 4096, i * 4096, (void *)i), 0);
    reap_n(e, c, n);
}

static const ioe_cqe *find_user(const ioe_cqe *c, unsigned n, uintptr_t user)
{
    const ioe_cqe *hit = NULL;
    for (unsigned i = 0; i < n; i++)
        if ((uintptr_t)c[i].user == user) hit = &c[i];
    cr_assert_not_null(hit, "no completion for request %lu", (unsigned long)user);
    return hit;
}

BOTH(injected_write_error_names_file_and_offset)
{
    ioe_engine *e = open_engine(backend, (ioe_opts){SMALL, .faults = "write:3:EIO,write:5:ENOSPC"});
    ioe_file *f = open_file(e, "data", O_RDWR | O_CREAT | O_TRUNC);
    ioe_cqe c[6];
    write_blocks(e, f, 6, c);
    for (uintptr_t i = 0; i < 6; i++) {
        const ioe_cqe *x = find_user(c, 6, i);
        int want = i == 2 ? -EIO : i == 4 ? -ENOSPC : 0;
        cr_assert_eq(x->res, want, "write %lu: %d, expected %d", (unsigned long)i, x->res, want);
        cr_assert_eq(x->offset, i * 4096);
        cr_assert_str_eq(x->path, path_of("data"));
    }
    char what[512];
    ioe_cqe_describe(find_user(c, 6, 2), what, sizeof what);
    char want[512];
    snprintf(want, sizeof want, "write %s at offset 8192: %s", path_of("data"), strerror(EIO));
    cr_assert_str_eq(what, want);
    ioe_info info;
    ioe_engine_info(e, &info);
    cr_assert_eq(info.faults, 2);
    ioe_engine_close(e);
}

BOTH(injected_fsync_error_names_file)
{
    ioe_engine *e = open_engine(backend, (ioe_opts){SMALL, .faults = "fsync:2:ENOSPC"});
    ioe_file *f = open_file(e, "a", O_RDWR | O_CREAT | O_TRUNC);
    ioe_file *g = open_file(e, "b", O_RDWR | O_CREAT | O_TRUNC);
    cr_assert_eq(ioe_fsync(f, NULL), 0);
    cr_assert_eq(ioe_fsync(g, NULL), 0);
    ioe_cqe c[2];
    reap_n(e, c, 2);
    const ioe_cqe *bad = c[0].file == g ? &c[0] : &c[1];
    const ioe_cqe *good = c[0].file == g ? &c[1] : &c[0];
    cr_assert_eq(bad->res, -ENOSPC);
    cr_assert_str_eq(bad->path, path_of("b"));
    cr_assert_eq(good->res, 0);
    char what[512];
    ioe_cqe_describe(bad, what, sizeof what);
    cr_assert(strstr(what, path_of("b")) && strstr(what, "fsync"), "%s", what);
    ioe_engine_close(e);
}

BOTH(injected_read_error_names_file_and_offset)
{
    ioe_engine *e = open_engine(backend, (ioe_opts){SMALL, .faults = "read:2:EIO"});
    ioe_file *f = open_file(e, "data", O_RDWR | O_CREAT | O_TRUNC);
    ioe_cqe c[3];
    write_blocks(e, f, 3, c);
    static char in[3][4096];
    for (uintptr_t i = 0; i < 3; i++)
        cr_assert_eq(ioe_read(f, in[i], 4096, i * 4096, (void *)i), 0);
    reap_n(e, c, 3);
    const ioe_cqe *bad = find_user(c, 3, 1);
    cr_assert_eq(bad->res, -EIO);
    cr_assert_eq(bad->offset, 4096);
    cr_assert_str_eq(bad->path, path_of("data"));
    expect_ok(find_user(c, 3, 0));
    expect_ok(find_user(c, 3, 2));
    ioe_engine_close(e);
}

BOTH(eagain_and_eintr_are_retried)
{
    ioe_engine *e =
        open_engine(backend, (ioe_opts){SMALL, .faults = "write:1:EAGAIN,fsync:1:EINTR"});
    ioe_file *f = open_file(e, "data", O_RDWR | O_CREAT | O_TRUNC);
    char buf[4096];
    fill(buf, sizeof buf, 8);
    cr_assert_eq(ioe_write(f, buf, sizeof buf, 0, NULL), 0);
    cr_assert_eq(ioe_fsync(f, NULL), 0);
    ioe_cqe c[2];
    reap_n(e, c, 2);
    expect_ok(&c[0]);
    expect_ok(&c[1]);
    expect_on_disk(ioe_file_path(f), buf, sizeof buf, 0);
    ioe_info info;
    ioe_engine_info(e, &info);
    cr_assert_eq(info.retried, 2);
    ioe_engine_close(e);
}

BOTH(delayed_completions_are_delivered)
{
    ioe_engine *e = open_engine(backend, (ioe_opts){SMALL, .faults = "delay:20"});
    ioe_file *f = open_file(e, "data", O_RDWR | O_CREAT | O_TRUNC);
    ioe_cqe c[4];
    write_blocks(e, f, 4, c);
    for (int i = 0; i < 4; i++) expect_ok(&c[i]);
    cr_assert_eq(ioe_outstanding(e), 0);
    ioe_engine_close(e);
}

BOTH(kernel_error_names_file_and_offset)
{
    ioe_engine *e = open_engine(backend, (ioe_opts){SMALL});
    int fd = open(path_of("ro"), O_CREAT | O_WRONLY, 0644);
    close(fd);
    ioe_file *f = open_file(e, "ro", O_RDONLY);
    char buf[512] = {0};
    cr_assert_eq(ioe_write(f, buf, sizeof buf, 12345, NULL), 0);
    ioe_cqe c;
    reap_n(e, &c, 1);
    cr_assert_eq(c.res, -EBADF, "writing a read-only descriptor: %d", c.res);
    cr_assert_eq(c.offset + c.done, 12345);
    cr_assert_str_eq(c.path, path_of("ro"));
    ioe_engine_close(e);
}

/* More files than registered slots, more requests than the depth: writes are
 * submitted round-robin and reaped whenever the engine pushes back. */
BOTH(many_files_in_flight)
{
    enum { FILES = 24, BLOCKS = 6 };
    ioe_engine *e =
        open_engine(backend, (ioe_opts){.depth = 16, .max_files = 8, .threads = 4, SMALL});
    ioe_file *f[FILES];
    char name[32];
    for (int i = 0; i < FILES; i++) {
        snprintf(name, sizeof name, "f%02d", i);
        f[i] = open_file(e, name, O_RDWR | O_CREAT | O_TRUNC);
    }
    char *buf = malloc((size_t)FILES * BLOCKS * 4096);
    fill(buf, (size_t)FILES * BLOCKS * 4096, 9);
    unsigned done = 0, failed = 0;
    ioe_cqe c[16];
    for (int pass = 0; pass <= BLOCKS; pass++) {
        for (int i = 0; i < FILES; i++) {
            char *b = buf + ((size_t)i * BLOCKS + (size_t)pass) * 4096;
            int rc;
            while ((rc = pass < BLOCKS ? ioe_write(f[i], b, 4096, (uint64_t)pass * 4096, NULL)
                                       : ioe_fsync(f[i], NULL)) == -EBUSY) {
                int n = ioe_reap(e, c, 16, 1);
                cr_assert_gt(n, 0);
                for (int k = 0; k < n; k++) failed += c[k].res != 0;
                done += (unsigned)n;
            }
            cr_assert_eq(rc, 0);
        }
    }
    while (done < FILES * (BLOCKS + 1)) {
        int n = ioe_reap(e, c, 16, 1);
        cr_assert_gt(n, 0);
        for (int k = 0; k < n; k++) failed += c[k].res != 0;
        done += (unsigned)n;
    }
    cr_assert_eq(failed, 0);
    for (int i = 0; i < FILES; i++) {
        expect_on_disk(ioe_file_path(f[i]), buf + (size_t)i * BLOCKS * 4096, BLOCKS * 4096, 0);
        cr_assert_eq(ioe_file_close(f[i]), 0);
    }
    ioe_info info;
    ioe_engine_info(e, &info);
    cr_assert_leq(info.max_in_flight, 16);
    free(buf);
    ioe_engine_close(e);
}

BOTH(depth_bounds_outstanding_requests)
{
    ioe_engine *e = open_engine(backend, (ioe_opts){.depth = 4, SMALL});
    ioe_file *f = open_file(e, "data", O_RDWR | O_CREAT | O_TRUNC);
    static char buf[4096];
    for (int i = 0; i < 4; i++) cr_assert_eq(ioe_write(f, buf, 4096, (uint64_t)i * 4096, NULL), 0);
    cr_assert_eq(ioe_write(f, buf, 4096, 0, NULL), -EBUSY);
    cr_assert_eq(ioe_read(f, buf, 4096, 0, NULL), -EBUSY);
    cr_assert_eq(ioe_fsync(f, NULL), -EBUSY);
    cr_assert_eq(ioe_outstanding(e), 4);
    ioe_cqe c[4];
    reap_n(e, c, 1);
    cr_assert_eq(ioe_outstanding(e), 3);
    cr_assert_eq(ioe_fsync(f, NULL), 0, "a reaped completion frees its slot");
    reap_n(e, c, 4);
    ioe_info info;
    ioe_engine_info(e, &info);
    cr_assert_leq(info.max_in_flight, 4);
    cr_assert_eq(info.submitted, 5, "refused requests are not counted");
    ioe_engine_close(e);
}

BOTH(file_close_waits_for_its_requests)
{
    ioe_engine *e = open_engine(backend, (ioe_opts){SMALL});
    ioe_file *f = open_file(e, "data", O_RDWR | O_CREAT | O_TRUNC);
    static char buf[4096];
    cr_assert_eq(ioe_write(f, buf, 4096, 0, NULL), 0);
    cr_assert_eq(ioe_file_close(f), -EBUSY);
    ioe_cqe c;
    reap_n(e, &c, 1);
    cr_assert_str_eq(c.path, path_of("data"), "the path outlives the request until close");
    cr_assert_eq(ioe_file_close(f), 0);
    ioe_engine_close(e);
}

BOTH(engine_close_with_requests_in_flight)
{
    ioe_engine *e = open_engine(backend, (ioe_opts){SMALL, .faults = "delay:10"});
    open_file(e, "unused", O_RDWR | O_CREAT | O_TRUNC);
    ioe_file *f = open_file(e, "data", O_RDWR | O_CREAT | O_TRUNC);
    static char buf[4096];
    for (int i = 0; i < 8; i++) cr_assert_eq(ioe_write(f, buf, 4096, (uint64_t)i * 4096, NULL), 0);
    cr_assert_eq(ioe_fsync(f, NULL), 0);
    cr_assert_eq(ioe_submit(e), 0);
    ioe_engine_close(e);
    struct stat st;
    cr_assert_eq(stat(path_of("data"), &st), 0);
    cr_assert_eq(st.st_size, 8 * 4096, "closing waits for the writes in flight");
}

BOTH(fault_set_replaces_faults)
{
    ioe_engine *e = open_engine(backend, (ioe_opts){SMALL, .faults = "write:1:EIO"});
    ioe_file *f = open_file(e, "data", O_RDWR | O_CREAT | O_TRUNC);
    ioe_cqe c[2];
    write_blocks(e, f, 1, c);
    cr_assert_eq(c[0].res, -EIO);
    cr_assert_eq(ioe_fault_set(e, "write:9:bogus"), -EINVAL);
    cr_assert_eq(ioe_fault_set(e, "write:2:EROFS"), 0);
    write_blocks(e, f, 2, c);
    cr_assert_eq(find_user(c, 2, 0)->res, 0, "counters restart with the new faults");
    cr_assert_eq(find_user(c, 2, 1)->res, -EROFS);
    cr_assert_eq(ioe_fault_set(e, NULL), 0);
    write_blocks(e, f, 2, c);
    expect_ok(&c[0]);
    expect_ok(&c[1]);
    ioe_engine_close(e);
}

Test(ioengine, sqpoll_roundtrip, .init = make_dir, .fini = remove_dir)
{
    ioe_engine *e = NULL;
    int rc = ioe_engine_open(&(ioe_opts){.backend = IOE_URING, .sqpoll = true, SMALL}, &e);
    if (rc == -EPERM || rc == -ENOSYS || rc == -ENOMEM || rc == -EINVAL)
        cr_skip_test("io_uring with SQPOLL is unavailable on this machine: %s", strerror(-rc));
    cr_assert_eq(rc, 0);
    ioe_info info;
    ioe_engine_info(e, &info);
    cr_assert(info.sqpoll);
    ioe_file *f = open_file(e, "data", O_RDWR | O_CREAT | O_TRUNC);
    ioe_cqe c[3];
    write_blocks(e, f, 3, c);
    for (int i = 0; i < 3; i++) expect_ok(&c[i]);
    ioe_engine_close(e);
}

/* ------------------------------------------------------------------------ */
/* Choosing the backend.                                                     */

typedef struct log_capture {
    int lines;
    char last[512];
} log_capture;

static void capture(void *ctx, const char *line)
{
    log_capture *l = ctx;
    l->lines++;
    snprintf(l->last, sizeof l->last, "%s", line);
}

Test(ioengine, fallback_on_each_refusal_logs_one_line)
{
    unsetenv("STASH_IO");
    const struct {
        const char *spec;
        int err;
    } cases[] = {{"setup:EPERM", EPERM}, {"setup:ENOSYS", ENOSYS}, {"setup:ENOMEM", ENOMEM}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        log_capture l = {0};
        ioe_engine *e;
        int rc = ioe_engine_open(&(ioe_opts){.faults = cases[i].spec,
                                             .log = capture,
                                             .log_ctx = &l,
                                             .buf_count = 1,
                                             .buf_size = 4096},
                                 &e);
        cr_assert_eq(rc, 0, "%s: %s", cases[i].spec, strerror(-rc));
        ioe_info info;
        ioe_engine_info(e, &info);
        cr_assert_eq(info.backend, IOE_THREADS);
        cr_assert_eq(l.lines, 1);
        cr_assert(strstr(l.last, strerror(cases[i].err)) && strstr(l.last, "thread-pool"),
                  "the line says why: %s", l.last);
        cr_assert_not_null(info.fallback_reason);
        ioe_engine_close(e);
    }
}

static void redirect_stderr(void)
{
    cr_redirect_stderr();
}

Test(ioengine, without_a_log_the_fallback_writes_nothing, .init = redirect_stderr)
{
    unsetenv("STASH_IO");
    ioe_engine *e;
    cr_assert_eq(ioe_engine_open(&(ioe_opts){.faults = "setup:EPERM", SMALL}, &e), 0);
    ioe_info info;
    ioe_engine_info(e, &info);
    cr_assert_eq(info.backend, IOE_THREADS);
    cr_assert(strstr(info.fallback_reason, "io_uring_setup failed"), "%s", info.fallback_reason);
    ioe_engine_close(e);
    fflush(stderr);
    cr_assert_stderr_eq_str("", "the library writes nothing on stderr");
}

Test(ioengine, other_setup_errors_are_not_hidden)
{
    unsetenv("STASH_IO");
    log_capture l = {0};
    ioe_engine *e;
    int rc =
        ioe_engine_open(&(ioe_opts){.faults = "setup:EINVAL", .log = capture, .log_ctx = &l}, &e);
    cr_assert_eq(rc, -EINVAL);
    cr_assert_eq(l.lines, 0);
}

Test(ioengine, forced_uring_does_not_fall_back)
{
    log_capture l = {0};
    ioe_engine *e;
    int rc = ioe_engine_open(
        &(ioe_opts){.backend = IOE_URING, .faults = "setup:EPERM", .log = capture, .log_ctx = &l},
        &e);
    cr_assert_eq(rc, -EPERM);
    cr_assert_eq(l.lines, 0);
    setenv("STASH_IO", "uring", 1);
    rc = ioe_engine_open(&(ioe_opts){.faults = "setup:ENOSYS", .log = capture, .log_ctx = &l}, &e);
    cr_assert_eq(rc, -ENOSYS, "STASH_IO=uring forces io_uring too");
    cr_assert_eq(l.lines, 0);
}

Test(ioengine, stash_io_selects_the_backend)
{
    log_capture l = {0};
    ioe_engine *e;
    setenv("STASH_IO", "threads", 1);
    cr_assert_eq(
        ioe_engine_open(
            &(ioe_opts){.log = capture, .log_ctx = &l, .buf_count = 1, .buf_size = 4096}, &e),
        0);
    ioe_info info;
    ioe_engine_info(e, &info);
    cr_assert_eq(info.backend, IOE_THREADS);
    cr_assert_eq(l.lines, 0, "a chosen fallback is not logged");
    cr_assert_null(info.fallback_reason);
    ioe_engine_close(e);
    setenv("STASH_IO", "bogus", 1);
    cr_assert_eq(ioe_engine_open(NULL, &e), -EINVAL);
    setenv("STASH_IO", "uring", 1);
    cr_assert_eq(
        ioe_engine_open(&(ioe_opts){.backend = IOE_THREADS, .buf_count = 1, .buf_size = 4096}, &e),
        0);
    ioe_engine_info(e, &info);
    cr_assert_eq(info.backend, IOE_THREADS, "an explicit option outranks the environment");
    ioe_engine_close(e);
}

Test(ioengine, stash_io_fault_is_read_from_the_environment, .init = make_dir, .fini = remove_dir)
{
    setenv("STASH_IO_FAULT", "write:1:ENOSPC", 1);
    ioe_engine *e = open_engine(IOE_THREADS, (ioe_opts){SMALL});
    ioe_file *f = open_file(e, "data", O_RDWR | O_CREAT | O_TRUNC);
    ioe_cqe c;
    write_blocks(e, f, 1, &c);
    cr_assert_eq(c.res, -ENOSPC);
    ioe_engine_close(e);
    setenv("STASH_IO_FAULT", "write:x:EIO", 1);
    cr_assert_eq(ioe_engine_open(&(ioe_opts){.backend = IOE_THREADS}, &e), -EINVAL,
                 "a bad specification is refused, not ignored");
}

Test(ioengine, fault_specifications)
{
    const char *good[] = {"", "short", "delay:0", "write:1:EIO,read:2:5,fsync:3:EDQUOT",
                          "setup:EPERM,short,delay:100"};
    const char *bad[] = {"write",        "write:0:EIO", "write:1:",     "write:1:EWHAT",
                         "read:1:0",     "short:1",     "delay:",       "delay:99999999",
                         "fsync:1:EIO,", ",short",      "unknown:1:EIO"};
    ioe_faults f;
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        cr_assert_eq(ioe_faults_parse(good[i], &f), 0, "'%s' is valid", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(ioe_faults_parse(bad[i], &f), -EINVAL, "'%s' is refused", bad[i]);
    cr_assert_eq(ioe_faults_parse("fsync:2:ENOSPC", &f), 0);
    cr_assert_eq(ioe_faults_pick(&f, IOE_FSYNC), 0);
    cr_assert_eq(ioe_faults_pick(&f, IOE_FDATASYNC), ENOSPC, "fdatasync counts as an fsync");
    cr_assert_eq(ioe_faults_pick(&f, IOE_FSYNC), 0, "a fault hits once");
}

Test(ioengine, options_out_of_range_are_refused)
{
    ioe_engine *e;
    cr_assert_eq(ioe_engine_open(&(ioe_opts){.depth = 5000}, &e), -EINVAL);
    cr_assert_eq(ioe_engine_open(&(ioe_opts){.threads = 65}, &e), -EINVAL);
    cr_assert_eq(ioe_engine_open(&(ioe_opts){.buf_count = 1025}, &e), -EINVAL);
    cr_assert_eq(ioe_engine_open(&(ioe_opts){.backend = 7}, &e), -EINVAL);
    ioe_engine_close(NULL);
}

Test(ioengine, aligned_memory_helpers, .init = make_dir, .fini = remove_dir)
{
    int fd = open(path_of("a"), O_CREAT | O_RDWR, 0644);
    cr_assert_geq(fd, 0);
    ioe_align al;
    int rc = ioe_dio_align(fd, &al);
    close(fd);
    if (rc == -EOPNOTSUPP) cr_skip_test("the filesystem of %s has no direct I/O", dir);
    cr_assert_eq(rc, 0);
    cr_assert(al.mem && !(al.mem & (al.mem - 1)), "memory alignment %u", al.mem);
    cr_assert(al.offset && !(al.offset & (al.offset - 1)), "offset alignment %u", al.offset);
    void *p;
    cr_assert_eq(ioe_aligned_alloc(100, 0, &p), 0);
    cr_assert_eq((uintptr_t)p % 4096, 0);
    free(p);
    cr_assert_eq(ioe_aligned_alloc(100, 3, &p), -EINVAL);
    cr_assert_eq(ioe_aligned_alloc(0, 512, &p), -EINVAL);
    cr_assert_eq(ioe_align_up(4097, 4096), 8192);
    cr_assert_eq(ioe_align_up(4096, 4096), 4096);
}
