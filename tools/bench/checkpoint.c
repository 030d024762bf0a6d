/* SPDX-License-Identifier: MIT */
/*
 * checkpoint.c: `stash bench checkpoint`: what checkpoints cost. A
 * full checkpoint's bandwidth and a restore's, each beside fio on the same
 * number of bytes in the same directory; the synchronous pause (pinning every
 * key group) with few keys and with many; the bytes of an incremental
 * checkpoint after 1% of the keys changed; and a worker process's throughput
 * and the arena's extra memory while another process writes a checkpoint
 * under YCSB A load, against the same worker without one and beside reads
 * of the arena at the checkpoint's pace; and the worker just after a
 * checkpoint whose pins stay as an incremental chain's base.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/checkpoint/checkpoints.h"
#include "backends/state/state.h"
#include "tools/bench/bench.h"
#include "tools/bench/peers.h"
#include "tools/bench/ycsb.h"

#include <liburing.h>

#define VALUE_BYTES 100u
#define MAX_REPS 100
#define OTHERS_BUSY 0.25 /* cores other processes may take before the second is not free */

typedef struct ckb {
    bench_opts o;
    shm_dir parent; /* $STASH_BENCH_DIR or /var/tmp */
    shm_dir ckd;    /* the bench's own directory in it: where checkpoints go */
    char dir[4096]; /* its path */
    char name[64];
    uint64_t keys;
    ioe_engine *e;
} ckb;

static void report(const ckb *b, const char *name, const char *system, double value,
                   const char *unit)
{
    bench_report(
        &b->o,
        &(bench_result){
            .bench = "checkpoint", .name = name, .system = system, .value = value, .unit = unit});
}

/* stash's rate over a peer's: the median of the repetitions' ratios. */
static void report_ratio(const ckb *b, const char *name, const char *system, const double *num,
                         const double *den)
{
    bench_report_ratio(&b->o, "checkpoint", name, system, num, den, b->o.reps);
}

/* Reports the median of the repetitions v (with their lowest and highest)
 * and returns it; v is left as it was. */
static double report_reps(const ckb *b, const char *name, const char *system, const double *v,
                          const char *unit)
{
    double sorted[MAX_REPS];
    memcpy(sorted, v, (size_t)b->o.reps * sizeof *sorted);
    bench_result r = bench_spread(
        (bench_result){.bench = "checkpoint", .name = name, .system = system, .unit = unit}, sorted,
        b->o.reps);
    bench_report(&b->o, &r);
    return r.value;
}

static void report_skip(const ckb *b, const char *name, const char *system, const char *why)
{
    bench_report(&b->o, &(bench_result){
                            .bench = "checkpoint", .name = name, .system = system, .skipped = why});
}

static bool on_lmdb(const ckb *b)
{
    return b->o.backend == STASH_BACKEND_LMDB;
}

/* Creates the arena (with lmdb: its environments in the checkpoint
 * directory's lmdb/, name-lmdb/) and joins it as the worker of every key
 * group. */
static int create_arena(ckb *b, const char *name, uint64_t keys)
{
    char envs[sizeof b->dir + 80];
    if ((size_t)snprintf(envs, sizeof envs, "%s/%s.lmdb", b->dir, name) >= sizeof envs)
        return -ENAMETOOLONG;
    stash_arena *a;
    int rc = stash_arena_create(
        name,
        &(stash_arena_opts){.sz = sizeof(stash_arena_opts),
                            .size = on_lmdb(b) ? 256ull << 20 : keys * 256 + (64ull << 20),
                            .flags = STASH_ARENA_REPLACE,
                            .backend = b->o.backend,
                            .lmdb_dir = envs},
        &a);
    if (rc == 0) stash_arena_close(a);
    return rc;
}

/* The next key's value, as the load wrote it: xorshift64 from *x. */
static void next_value(uint64_t *x, uint8_t val[VALUE_BYTES])
{
    for (unsigned i = 0; i < VALUE_BYTES; i += 8) {
        *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
        memcpy(val + i, x, VALUE_BYTES - i < 8 ? VALUE_BYTES - i : 8);
    }
}

static int open_loaded(ckb *b, uint64_t keys, stash_worker **w, stash_state **s)
{
    int rc = create_arena(b, b->name, keys);
    if (rc < 0) return rc;
    rc = stash_worker_open(
        b->name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, w);
    if (rc == 0)
        rc = stash_state_get(
            *w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            s);
    uint8_t val[VALUE_BYTES];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t k = 0; rc == 0 && k < keys; k++) {
        next_value(&x, val);
        stash_key_set(*w, &k, sizeof k);
        rc = stash_value_put(*s, val, sizeof val);
        if (k % 65536 == 0)
            bench_progress(&b->o, "checkpoint: loading %llu of %llu keys", (unsigned long long)k,
                           (unsigned long long)keys);
    }
    if (rc == 0) rc = worker_commit(*w, false);
    return rc;
}

/* Writes a checkpoint of w's arena as of pins, once the worker's writes
 * are committed: the heap's pinned versions, or with lmdb what the
 * environments hold then (pins then hold the change log for a delta). */
static int write_checkpoint(stash_worker *w, const uint32_t *pins, ckpt_opts *o, ckpt_written *out)
{
    int rc = worker_commit(w, false);
    return rc ? rc : ckpt_write(stash_worker_arena(w), pins, o, out);
}

static void close_loaded(ckb *b, stash_worker *w)
{
    stash_worker_close(w);
    stash_arena_destroy(b->name, NULL);
}

static uint32_t *pin_all(stash_arena *a)
{
    uint32_t maxp = a->hdr->max_parallelism, *pins = malloc(maxp * sizeof *pins);
    for (uint32_t kg = 0; pins && kg < maxp; kg++)
        pins[kg] = (uint32_t)shm_table_pin_for(a, kg, 0, true);
    return pins;
}

static void unpin_all(stash_arena *a, uint32_t *pins)
{
    for (uint32_t kg = 0; kg < a->hdr->max_parallelism; kg++) shm_table_unpin(a, kg, pins[kg]);
    free(pins);
}

static uint64_t arena_used_bytes(const stash_arena *a)
{
    uint64_t n = 0;
    for (uint32_t kg = 0; kg < a->hdr->max_parallelism; kg++) {
        stash_kg_usage u;
        stash_kg_usage_get(a, kg, &u);
        n += u.used_bytes;
    }
    return n;
}

/* Removes the checkpoints, shared files and fio's file of the bench's directory. */
static void clean_dir(const ckb *b)
{
    DIR *d = shm_dir_list(&b->ckd);
    for (struct dirent *de; d && (de = readdir(d));)
        if (strncmp(de->d_name, "chk-", 4) == 0 || strcmp(de->d_name, CKPT_SHARED_DIR) == 0 ||
            strcmp(de->d_name, "fio.dat") == 0)
            shm_dir_remove(&b->ckd, de->d_name, 1);
    if (d) closedir(d);
}

/* ---- full checkpoint and restore bandwidth, beside fio ---------------------- */

#define COPY_BLOCK (1u << 20)
#define COPY_DEPTH 8u

/* The physical work of a restore with nothing of stash's in it: every file
 * of checkpoint 1 read with O_DIRECT, COPY_DEPTH blocks of COPY_BLOCK in
 * flight through io_uring, each block copied as it lands into fresh pages
 * of a new file in /dev/shm (what a restore writes its records into).
 * Returns 0 with its bytes per second in *bps, or an error. */
static int copy_peer(const ckb *b, double *bps)
{
    char dir[sizeof b->dir + 16], shm[64];
    snprintf(dir, sizeof dir, "%s/chk-1", b->dir);
    snprintf(shm, sizeof shm, "/dev/shm/stash-bench-copy.XXXXXX");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return -errno;
    DIR *d = fdopendir(dfd);
    if (!d) return close(dfd), -errno;
    enum { FILES_MAX = 4096 };
    static char names[FILES_MAX][256];
    static uint64_t sizes[FILES_MAX];
    size_t nfiles = 0;
    uint64_t total = 0;
    for (struct dirent *de; (de = readdir(d)) && nfiles < FILES_MAX;) {
        struct stat st;
        if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
            continue;
        snprintf(names[nfiles], sizeof names[nfiles], "%s", de->d_name);
        sizes[nfiles++] = (uint64_t)st.st_size;
        total += (uint64_t)st.st_size;
    }
    /* A name nobody can have taken first; gone at once, the descriptor kept. */
    int out = mkostemp(shm, O_CLOEXEC);
    if (out >= 0) unlink(shm);
    int rc = out < 0 ? -errno : ftruncate(out, (off_t)(total ? total : 1)) < 0 ? -errno : 0;
    uint8_t *dst = rc == 0
                       ? mmap(NULL, total ? total : 1, PROT_READ | PROT_WRITE, MAP_SHARED, out, 0)
                       : MAP_FAILED;
    if (rc == 0 && dst == MAP_FAILED) rc = -errno;
    uint8_t *bufs = NULL;
    struct io_uring ring;
    bool ring_up = false;
    if (rc == 0 && posix_memalign((void **)&bufs, 4096, (size_t)COPY_DEPTH * COPY_BLOCK) != 0)
        rc = -ENOMEM;
    if (rc == 0) rc = io_uring_queue_init(COPY_DEPTH, &ring, 0);
    ring_up = rc == 0;
    uint64_t t0 = bench_now_ns(), base = 0;
    for (size_t f = 0; f < nfiles && rc == 0; base += sizes[f++]) {
        int fd = openat(dfd, names[f], O_RDONLY | O_DIRECT | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) {
            rc = -errno;
            break;
        }
        uint64_t next = 0, done = 0;
        unsigned inflight = 0;
        uint64_t at[COPY_DEPTH];
        bool busy[COPY_DEPTH] = {false};
        while (rc == 0 && done < sizes[f]) {
            for (unsigned k = 0; k < COPY_DEPTH && next < sizes[f]; k++) {
                if (busy[k]) continue;
                struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
                io_uring_prep_read(sqe, fd, bufs + (size_t)k * COPY_BLOCK, COPY_BLOCK, (__u64)next);
                io_uring_sqe_set_data64(sqe, k);
                busy[k] = true, at[k] = next, next += COPY_BLOCK, inflight++;
            }
            io_uring_submit(&ring);
            struct io_uring_cqe *cqe;
            if ((rc = io_uring_wait_cqe(&ring, &cqe)) < 0) break;
            unsigned k = (unsigned)io_uring_cqe_get_data64(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(&ring, cqe);
            busy[k] = false, inflight--;
            uint64_t want = sizes[f] - at[k] < COPY_BLOCK ? sizes[f] - at[k] : COPY_BLOCK;
            if (res < 0 || (uint64_t)res < want) {
                rc = res < 0 ? res : -EIO;
                break;
            }
            memcpy(dst + base + at[k], bufs + (size_t)k * COPY_BLOCK, want);
            done += want;
        }
        while (inflight > 0) { /* a failure leaves reads to collect */
            struct io_uring_cqe *cqe;
            if (io_uring_wait_cqe(&ring, &cqe) < 0) break;
            io_uring_cqe_seen(&ring, cqe);
            inflight--;
        }
        close(fd);
    }
    uint64_t ns = bench_now_ns() - t0;
    if (ring_up) io_uring_queue_exit(&ring);
    free(bufs);
    if (dst != MAP_FAILED) munmap(dst, total ? total : 1);
    if (out >= 0) close(out);
    closedir(d);
    if (rc == 0) *bps = (double)total / ((double)ns / 1e9);
    return rc;
}

/* What writing the first byte of a fresh page of a /dev/shm file costs
 * (the kernel allocating and zeroing it), over 256 MiB: microseconds. */
static double first_touch_us(void)
{
    const size_t bytes = 256u << 20, page = 4096;
    char shm[64];
    snprintf(shm, sizeof shm, "/dev/shm/stash-bench-touch.XXXXXX");
    int fd = mkostemp(shm, O_CLOEXEC);
    if (fd < 0) return -1;
    unlink(shm);
    uint8_t *p = ftruncate(fd, (off_t)bytes) == 0
                     ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                     : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED) return -1;
    uint64_t t0 = bench_now_ns();
    for (size_t i = 0; i < bytes; i += page) p[i] = 1;
    double us = (double)(bench_now_ns() - t0) / 1e3 / (double)(bytes / page);
    munmap(p, bytes);
    return us;
}

/* Checks, untimed, that the arena name2 holds the keys 0 .. keys-1 with
 * the values the load gave them, and nothing else (records: what the
 * restore put). Returns 0, or -EIO with the first key that differs said. */
static int check_restored(const char *name2, uint64_t keys, uint64_t records)
{
    if (records != keys)
        return shm_fail(-EIO, "the restore put %llu records, not %llu", (unsigned long long)records,
                        (unsigned long long)keys);
    stash_worker *w;
    stash_state *s;
    int rc = stash_worker_open(
        name2, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w);
    if (rc) return rc;
    rc = stash_state_get(
        w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
        &s);
    uint8_t val[VALUE_BYTES];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t k = 0; rc == 0 && k < keys; k++) {
        next_value(&x, val);
        stash_bytes v;
        if ((rc = stash_key_set(w, &k, sizeof k)) == 0) rc = stash_value_get(s, &v);
        if (rc == 0 && (v.len != VALUE_BYTES || memcmp(v.data, val, VALUE_BYTES) != 0))
            rc = shm_fail(-EIO, "key %llu: the restored value differs from the one written",
                          (unsigned long long)k);
    }
    stash_worker_close(w);
    return rc;
}

/* Restores checkpoint 1 of b's directory into a new arena name2 for keys
 * keys, as after a reboot, checks every key (untimed) and destroys the
 * arena again; *ns: the time the restore took. */
static int restore_fresh(ckb *b, const char *name2, uint64_t keys, uint64_t *ns)
{
    stash_arena *fresh;
    int rc = create_arena(b, name2, keys);
    uint64_t records = 0;
    if (rc == 0 && (rc = stash_arena_open(name2, NULL, &fresh)) == 0) {
        ckpt_restored res;
        uint64_t t0 = bench_now_ns();
        rc = ckpt_restore(fresh, &b->ckd, 1, (stash_kg_range){0, fresh->hdr->max_parallelism - 1},
                          b->e, &res);
        *ns = bench_now_ns() - t0;
        if (rc == 0) records = res.records, ckpt_restored_free(&res);
        stash_arena_close(fresh);
    }
    if (rc == 0) rc = check_restored(name2, keys, records);
    stash_arena_destroy(name2, NULL);
    return rc;
}

static int bandwidth_cases(ckb *b)
{
    stash_worker *w;
    stash_state *s;
    uint64_t load_ns = bench_now_ns();
    int rc = open_loaded(b, b->keys, &w, &s);
    load_ns = bench_now_ns() - load_ns;
    if (rc < 0) return rc;
    stash_arena *a = stash_worker_arena(w);
    double wr[MAX_REPS], rd[MAX_REPS], fw[MAX_REPS], fr[MAX_REPS], cp[MAX_REPS];
    uint64_t bytes = 0;
    bool fio = bench_fio_installed();
    int copied = 0;
    for (int r = 0; r < b->o.reps && rc == 0; r++) {
        bench_progress(&b->o, "checkpoint: bandwidth, repetition %d of %d", r + 1, b->o.reps);
        clean_dir(b);
        uint32_t *pins = pin_all(a);
        ckpt_written out;
        uint64_t t0 = bench_now_ns();
        rc = write_checkpoint(w, pins, &(ckpt_opts){.dir = &b->ckd, .id = 1, .engine = b->e}, &out);
        wr[r] = (double)out.data_bytes / ((double)(bench_now_ns() - t0) / 1e9);
        unpin_all(a, pins);
        bytes = out.data_bytes;
        /* The restore and its peers, which read what the write left, in a
         * new order each repetition. */
        int order[3];
        bench_shuffle(order, 3, 5, r);
        for (int k = 0; k < 3 && rc == 0; k++) {
            if (order[k] == 0) {
                char name2[80];
                snprintf(name2, sizeof name2, "%s-restore", b->name);
                uint64_t ns = 0;
                rc = restore_fresh(b, name2, b->keys, &ns);
                rd[r] = (double)bytes / ((double)ns / 1e9);
            } else if (order[k] == 1) {
                if (copy_peer(b, &cp[r]) == 0) copied++;
            } else if (fio) {
                char path[sizeof b->dir + 16];
                snprintf(path, sizeof path, "%s/fio.dat", b->dir);
                fio = bench_fio(path, BENCH_FIO_BYTES(bytes), true, true, &fw[r]) == 0 &&
                      bench_fio(path, BENCH_FIO_BYTES(bytes), false, true, &fr[r]) == 0;
            }
        }
    }
    close_loaded(b, w);
    clean_dir(b);
    if (rc < 0) return rc;
    double mw = report_reps(b, "full/write", "stash-uring", wr, "bytes/s");
    double mr = report_reps(b, "restore/read", "stash-uring", rd, "bytes/s");
    if (copied == b->o.reps) {
        report_reps(b, "restore/read", "read-and-copy", cp, "bytes/s");
        report_ratio(b, "restore/read", "stash/read-and-copy", rd, cp);
    } else {
        report_skip(b, "restore/read", "read-and-copy", "the checkpoint's files could not be read");
    }
    double touch = first_touch_us();
    if (touch > 0) report(b, "restore/first-touch", "kernel", touch, "us/page");
    if (on_lmdb(b)) {
        /* Beside the same records put key by key through the API (the load). */
        double put = (double)bytes / ((double)load_ns / 1e9);
        report(b, "restore/read", "stash-put-by-key", put, "bytes/s");
        report(b, "restore/read", "restore/put-by-key", mr / put, "ratio");
    }
    if (!fio) {
        report_skip(b, "full/write", "fio", "fio is not installed or failed (apt-get install fio)");
        return 0;
    }
    double mfw = report_reps(b, "full/write", "fio", fw, "bytes/s");
    double mfr = report_reps(b, "restore/read", "fio", fr, "bytes/s");
    report_ratio(b, "full/write", "stash/fio", wr, fw);
    report_ratio(b, "restore/read", "stash/fio", rd, fr);
    const char *bw = "checkpoint bandwidth beside fio (MB/s)";
    bench_plot_bar(bw, "checkpoint write: stash", mw / 1e6, "MB/s");
    bench_plot_bar(bw, "checkpoint write: fio", mfw / 1e6, "MB/s");
    bench_plot_bar(bw, "restore read: stash", mr / 1e6, "MB/s");
    bench_plot_bar(bw, "restore read: fio", mfr / 1e6, "MB/s");
    return 0;
}

/* ---- a checkpoint in a remote storage, beside its own client ------------------ */

/* The peers of a remote storage's case, each repetition: bytes per
 * second up and down. */
typedef struct remote_peer {
    const char *name; /* "rados-bench", "awscli" */
    bool ok;
    double up[MAX_REPS], down[MAX_REPS];
    /* awscli: less its interpreter's start, what the ratios compare with */
    double up_net[MAX_REPS], down_net[MAX_REPS];
} remote_peer;

/* Whether the files at a and b hold the same bytes. */
static bool files_equal(const char *a, const char *b)
{
    FILE *fa = fopen(a, "re"), *fb = fopen(b, "re");
    bool same = fa && fb;
    static char ba[1 << 16], bb[1 << 16];
    while (same) {
        size_t na = fread(ba, 1, sizeof ba, fa), nb = fread(bb, 1, sizeof bb, fb);
        same = na == nb && memcmp(ba, bb, na) == 0;
        if (!na) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* One checkpoint of w's arena into the storage (written in b->dir, its
 * data file going up as it is written, the rest after its commit) and its
 * restore into a fresh arena (copied down, then restored): bytes per second
 * of the whole write and restore in *wr and *rd. Their steps, timed apart
 * on a checkpoint of their own before: ph[0] (the local write alone), ph[1]
 * (its upload alone, into job JOB-steps), then ph[2] (the fetch) and ph[3]
 * (the local restore). With s3, the peer then copies the same data file up
 * and down (rep: its repetition). */
static int remote_once(ckb *b, stash_worker *w, ckpt_storage *r, const char *job, uint64_t id,
                       double *wr, double *rd, double ph[4], remote_peer *peer, int rep)
{
    stash_arena *a = stash_worker_arena(w);
    char chk[4096], name[64], name2[80], steps[80];
    snprintf(name, sizeof name, "chk-%llu", (unsigned long long)id);
    snprintf(steps, sizeof steps, "%s-steps", job);
    if (ckpt_path_of(chk, "%s/%s", b->dir, name) < 0) return -ENAMETOOLONG;
    snprintf(name2, sizeof name2, "%s-restore", b->name);
    uint32_t *pins = pin_all(a);
    ckpt_written out = {0};
    uint64_t t0 = bench_now_ns();
    int rc =
        write_checkpoint(w, pins, &(ckpt_opts){.dir = &b->ckd, .id = id, .engine = b->e}, &out);
    uint64_t t1 = bench_now_ns();
    if (rc == 0)
        rc = ckpt_storage_upload(r, steps, b->ckd.fd, name, chk, id > 1 ? id - 1 : 0, b->e);
    uint64_t t2 = bench_now_ns();
    double bytes = (double)out.data_bytes;
    ph[0] = bytes / ((double)(t1 - t0) / 1e9);
    ph[1] = bytes / ((double)(t2 - t1) / 1e9);
    ckpt_remove_checkpoint(&b->ckd, name);
    ckpt_upload up;
    t0 = bench_now_ns();
    if (rc == 0) rc = ckpt_upload_begin(&up, r, job, name);
    if (rc == 0)
        rc = write_checkpoint(
            w, pins, &(ckpt_opts){.dir = &b->ckd, .id = id, .engine = b->e, .copy = &up.copy},
            &out);
    if (rc == 0) rc = ckpt_upload_finish(&up, b->ckd.fd, chk, id > 1 ? id - 1 : 0, b->e);
    t1 = bench_now_ns();
    unpin_all(a, pins);
    *wr = bytes / ((double)(t1 - t0) / 1e9);
    stash_kg_range all = {0, a->hdr->max_parallelism - 1};
    /* Restored straight from the storage (its copy in the directory
     * written meanwhile, as the engine does), then in steps: fetched, then
     * restored from the copy. Each holds every key. */
    for (int k = 0; k < 2 && rc == 0; k++) {
        stash_arena *fresh = NULL;
        shm_dir down = {.fd = -1};
        ckpt_restored res = {0};
        ckpt_view v;
        rc = create_arena(b, name2, b->keys);
        if (rc == 0) rc = stash_arena_open(name2, NULL, &fresh);
        if (rc == 0) rc = shm_dir_openat(&b->ckd, "down", SHM_DIR_OWN | SHM_DIR_CREATE, &down);
        t0 = bench_now_ns();
        if (rc == 0 && !k && (rc = ckpt_storage_view(r, job, name, &v)) == 0) {
            rc = ckpt_storage_restore(r, job, &v, &down, fresh, all, NULL, &res);
            ckpt_view_close(&v);
        }
        if (rc == 0 && k) rc = ckpt_storage_fetch(r, job, &down, name);
        t1 = bench_now_ns();
        if (rc == 0 && k) rc = ckpt_restore(fresh, &down, id, all, b->e, &res);
        t2 = bench_now_ns();
        if (rc == 0 && res.records != b->keys)
            rc = shm_fail(STASH_ECORRUPT, "restored %llu records of %llu",
                          (unsigned long long)res.records, (unsigned long long)b->keys);
        if (!k) {
            *rd = bytes / ((double)(t1 - t0) / 1e9);
        } else {
            ph[2] = bytes / ((double)(t1 - t0) / 1e9);
            ph[3] = bytes / ((double)(t2 - t1) / 1e9);
        }
        ckpt_restored_free(&res);
        if (fresh) stash_arena_close(fresh);
        stash_arena_destroy(name2, NULL);
        if (down.fd >= 0) ckpt_remove_checkpoint(&down, name);
        shm_dir_close(&down);
    }
    unlinkat(b->ckd.fd, "down", AT_REMOVEDIR);
    /* The same bytes up and down by the storage's own client, the file
     * read back checked against the checkpoint's. */
    char data[4200], back[4200], key[200];
    double secs = 0;
    /* Its interpreter's start, timed just before, is taken off its time. */
    double start = 0;
    if (rc == 0 && peer->ok && strcmp(peer->name, "awscli") == 0 &&
        ckpt_path_of(data, "%s/%s", chk, CKPT_DATA_FILE) == 0 &&
        ckpt_path_of(back, "%s/peer.dat", b->dir) == 0) {
        snprintf(key, sizeof key, "%s/peer/%s", job, name);
        peer->ok = bench_aws_start(&start) == 0 &&
                   bench_aws_s3(b->o.container, key, data, true, &secs) == 0 && secs > start;
        peer->up[rep] = peer->ok ? bytes / secs : 0;
        peer->up_net[rep] = peer->ok ? bytes / (secs - start) : 0;
        peer->ok = peer->ok && bench_aws_start(&start) == 0 &&
                   bench_aws_s3(b->o.container, key, back, false, &secs) == 0 && secs > start;
        peer->down[rep] = peer->ok ? bytes / secs : 0;
        peer->down_net[rep] = peer->ok ? bytes / (secs - start) : 0;
        peer->ok = peer->ok && files_equal(data, back);
        unlink(back);
    }
    clean_dir(b);
    return rc;
}

static int remote_cases(ckb *b)
{
    const ckpt_storage_ops *ops = ckpt_storage_find(b->o.storage, strlen(b->o.storage));
    ckpt_storage *r;
    char job[64], wcase[32], rcase[32];
    snprintf(job, sizeof job, "stash-bench-%d", (int)getpid());
    snprintf(wcase, sizeof wcase, "%s/write", ops->scheme);
    snprintf(rcase, sizeof rcase, "%s/restore", ops->scheme);
    bool s3 = strcmp(ops->scheme, "s3") == 0;
    double start;
    remote_peer peer = {.name = s3 ? "awscli" : "rados-bench",
                        .ok = !s3 || bench_aws_start(&start) == 0};
    int rc = ckpt_storage_open(ops, b->o.container, NULL, &r);
    if (rc) return rc;
    stash_worker *w = NULL;
    stash_state *s;
    rc = open_loaded(b, b->keys, &w, &s);
    /* The checkpoint's bytes, which the peer moves too. */
    uint64_t bytes = 0;
    if (rc == 0) {
        stash_arena *a = stash_worker_arena(w);
        uint32_t *pins = pin_all(a);
        ckpt_written out = {0};
        rc = write_checkpoint(w, pins, &(ckpt_opts){.dir = &b->ckd, .id = 1, .engine = b->e}, &out);
        unpin_all(a, pins);
        ckpt_remove_checkpoint(&b->ckd, "chk-1");
        bytes = out.data_bytes;
    }
    double wr[MAX_REPS], rd[MAX_REPS], ph[4][MAX_REPS];
    for (int i = 0; i < b->o.reps && rc == 0; i++) {
        bench_progress(&b->o, "checkpoint: %s, repetition %d of %d", ops->scheme, i + 1, b->o.reps);
        int order[2];
        bench_shuffle(order, 2, 7, i);
        for (int k = 0; k < 2 && rc == 0; k++) {
            if (order[k] == 0) {
                double one[4] = {0};
                rc = remote_once(b, w, r, job, (uint64_t)i + 1, &wr[i], &rd[i], one, &peer, i);
                for (int p = 0; p < 4; p++) ph[p][i] = one[p];
            } else if (peer.ok && !s3) {
                peer.ok = bench_rados_bench(b->o.container, true, bytes, &peer.up[i]) == 0 &&
                          bench_rados_bench(b->o.container, false, bytes, &peer.down[i]) == 0;
            }
        }
    }
    for (int k = 0; k < 2; k++) {
        char prefix[80];
        snprintf(prefix, sizeof prefix, "%s%s/", job, k ? "-steps" : "");
        int gone = ckpt_storage_remove_prefix(r, prefix);
        if (rc == 0) rc = gone;
    }
    if (w) close_loaded(b, w);
    ckpt_storage_close(r);
    if (rc) return rc;
    report_reps(b, wcase, "stash", wr, "bytes/s");
    report_reps(b, wcase, "stash-local-write", ph[0], "bytes/s");
    report_reps(b, wcase, "stash-upload", ph[1], "bytes/s");
    report_reps(b, rcase, "stash", rd, "bytes/s");
    report_reps(b, rcase, "stash-fetch", ph[2], "bytes/s");
    report_reps(b, rcase, "stash-local-restore", ph[3], "bytes/s");
    if (!peer.ok) {
        report_skip(b, wcase, peer.name,
                    s3 ? "aws s3 cp not installed, failed or read back other bytes (awscli)"
                       : "rados bench failed (ceph-common)");
        return 0;
    }
    char ratio[64], upload[64], fetch[64];
    snprintf(ratio, sizeof ratio, "stash/%s", peer.name);
    snprintf(upload, sizeof upload, "stash-upload/%s", peer.name);
    snprintf(fetch, sizeof fetch, "stash-fetch/%s", peer.name);
    report_reps(b, wcase, peer.name, peer.up, "bytes/s");
    report_reps(b, rcase, peer.name, peer.down, "bytes/s");
    double *up = peer.up, *down = peer.down;
    if (s3) {
        report_reps(b, wcase, "awscli-less-start", peer.up_net, "bytes/s");
        report_reps(b, rcase, "awscli-less-start", peer.down_net, "bytes/s");
        snprintf(ratio, sizeof ratio, "stash/awscli-less-start");
        snprintf(upload, sizeof upload, "stash-upload/awscli-less-start");
        snprintf(fetch, sizeof fetch, "stash-fetch/awscli-less-start");
        up = peer.up_net, down = peer.down_net;
    }
    report_ratio(b, wcase, ratio, wr, up);
    report_ratio(b, wcase, upload, ph[1], up);
    report_ratio(b, rcase, ratio, rd, down);
    report_ratio(b, rcase, fetch, ph[2], down);
    return 0;
}

/* ---- a savepoint rewritten offline, beside fio ------------------------------- */

/* One rewrite of src into dst with state "dropped" left out, as stash
 * snapshot rewrite --drop-state does it: open and check, then copy. */
static int rewrite_once(const char *src, const char *dst, uint64_t *dst_bytes)
{
    stash_snapshot *snap;
    int rc = stash_snapshot_open(src, &snap);
    if (rc) return rc;
    stash_snapshot_info out;
    rc = stash_snapshot_rewrite(
        snap, dst,
        &(stash_snapshot_rewrite_opts){.sz = sizeof(stash_snapshot_rewrite_opts),
                                       .changes =
                                           &(stash_snapshot_change){.state = "dropped", .drop = 1},
                                       .nchanges = 1},
        &out);
    stash_snapshot_close(snap);
    if (rc == 0) *dst_bytes = out.data_bytes;
    return rc;
}

static int rewrite_case(ckb *b)
{
    stash_worker *w;
    stash_state *s, *dropped;
    int rc = open_loaded(b, b->keys, &w, &s);
    if (rc == 0)
        rc = stash_state_get(w,
                             &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                 .name = "dropped",
                                                 .kind = STASH_VALUE},
                             &dropped);
    uint8_t val[VALUE_BYTES] = {0};
    for (uint64_t k = 0; rc == 0 && k < b->keys / 10; k++) {
        stash_key_set(w, &k, sizeof k);
        rc = stash_value_put(dropped, val, sizeof val);
    }
    char src[sizeof b->dir + 16], dst[sizeof b->dir + 16], fio_path[sizeof b->dir + 16];
    snprintf(src, sizeof src, "%s/chk-1", b->dir);
    snprintf(dst, sizeof dst, "%s/rewritten", b->dir);
    snprintf(fio_path, sizeof fio_path, "%s/fio.dat", b->dir);
    clean_dir(b);
    if (rc == 0) {
        uint32_t *pins = pin_all(stash_worker_arena(w));
        rc = write_checkpoint(w, pins, &(ckpt_opts){.dir = &b->ckd, .id = 1, .engine = b->e}, NULL);
        unpin_all(stash_worker_arena(w), pins);
    }
    close_loaded(b, w);
    uint64_t src_bytes = 0, dst_bytes = 0;
    stash_snapshot *snap;
    if (rc == 0 && (rc = stash_snapshot_open(src, &snap)) == 0) {
        stash_snapshot_info info;
        stash_snapshot_info_get(snap, &info);
        src_bytes = info.data_bytes;
        stash_snapshot_close(snap);
    }
    double mine[MAX_REPS], fio[MAX_REPS];
    bool with_fio = bench_fio_installed();
    char cmd[sizeof dst + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dst);
    /* A rewrite untimed first: a warm-up, and the bytes fio is to write. */
    if (rc == 0) rc = rewrite_once(src, dst, &dst_bytes);
    for (int r = 0; r < b->o.reps && rc == 0; r++) {
        bench_progress(&b->o, "checkpoint: rewrite, repetition %d of %d", r + 1, b->o.reps);
        if (system(cmd) != 0) return -EIO;
        int order[2];
        bench_shuffle(order, 2, 11, r);
        for (int k = 0; k < 2 && rc == 0; k++) {
            if (order[k] == 0) {
                uint64_t t0 = bench_now_ns();
                rc = rewrite_once(src, dst, &dst_bytes);
                mine[r] = (double)(src_bytes + dst_bytes) / ((double)(bench_now_ns() - t0) / 1e9);
                continue;
            }
            /* fio reading the source's bytes, then writing the result's. */
            double fr = 0, fw = 0;
            if (with_fio &&
                (bench_fio(fio_path, BENCH_FIO_BYTES(src_bytes), false, true, &fr) < 0 ||
                 bench_fio(fio_path, BENCH_FIO_BYTES(dst_bytes), true, true, &fw) < 0))
                with_fio = false;
            if (with_fio)
                fio[r] = (double)(src_bytes + dst_bytes) /
                         ((double)src_bytes / fr + (double)dst_bytes / fw);
        }
    }
    clean_dir(b);
    if (system(cmd) != 0) fprintf(stderr, "stash bench checkpoint: cannot remove %s\n", dst);
    if (rc < 0) return rc;
    report_reps(b, "rewrite", "stash", mine, "bytes/s");
    if (!with_fio) {
        report_skip(b, "rewrite", "fio", "fio is not installed or failed (apt-get install fio)");
        return 0;
    }
    report_reps(b, "rewrite", "fio", fio, "bytes/s");
    report_ratio(b, "rewrite", "stash/fio", mine, fio);
    return 0;
}

/* ---- instant recovery: a lazy restore beside a whole one ------------------------ */

typedef struct lazy_pass {
    stash_arena *a;
    int rc;
    char why[512];
} lazy_pass;

/* The background pass, as the service runs it: an I/O engine of its own. */
static void *lazy_pass_main(void *arg)
{
    lazy_pass *p = arg;
    ioe_engine *e;
    p->rc = ioe_engine_open(&(ioe_opts){.depth = 8, .buf_count = 1, .buf_size = 4096}, &e);
    if (p->rc == 0) {
        p->rc = ckpt_lazy_fill(p->a, e, NULL);
        ioe_engine_close(e);
    }
    if (p->rc) snprintf(p->why, sizeof p->why, "%s", stash_errmsg());
    return NULL;
}

/* One lazy restore of dir's checkpoint 1 into a new arena name2: the ms
 * until a worker's first get of a random key returned (*first) and until
 * every key group was back while it went on getting random keys (*all);
 * *ops: the gets done meanwhile. */
static int lazy_once(ckb *b, uint64_t keys, const char *name2, double *first, double *all,
                     double *ops)
{
    stash_arena *fresh;
    int rc = create_arena(b, name2, keys);
    if (rc == 0) rc = stash_arena_open(name2, NULL, &fresh);
    if (rc) return rc;
    char path[sizeof b->dir + 16];
    snprintf(path, sizeof path, "%s/chk-1", b->dir);
    uint64_t t0 = bench_now_ns(), x = 0x2545f4914f6cdd1dull, n = 0;
    ckpt_restored res;
    rc = ckpt_lazy_begin(fresh, path, (stash_kg_range){0, fresh->hdr->max_parallelism - 1}, b->e,
                         &res);
    if (rc) {
        stash_arena_close(fresh);
        return rc;
    }
    ckpt_restored_free(&res);
    lazy_pass pass = {.a = fresh};
    pthread_t t;
    bool background = pthread_create(&t, NULL, lazy_pass_main, &pass) == 0;
    stash_worker *w = NULL;
    stash_state *s;
    rc = stash_worker_open(
        name2, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w);
    if (rc == 0)
        rc = stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &s);
    *first = 0;
    while (rc == 0) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint64_t k = x % keys;
        stash_bytes v;
        rc = stash_key_set(w, &k, sizeof k);
        if (rc == 0) rc = stash_value_get(s, &v);
        n++;
        if (n == 1) *first = (double)(bench_now_ns() - t0) / 1e6;
        if (!ckpt_lazy_pending(fresh)) break;
    }
    *all = (double)(bench_now_ns() - t0) / 1e6;
    *ops = (double)n;
    if (background) pthread_join(t, NULL);
    if (rc == 0 && pass.rc) rc = shm_fail(pass.rc, "%s", pass.why);
    if (w) stash_worker_close(w);
    stash_arena_close(fresh);
    stash_arena_destroy(name2, NULL);
    return rc;
}

static int instant_case(ckb *b, uint64_t keys, const char *name)
{
    stash_worker *w;
    stash_state *s;
    int rc = open_loaded(b, keys, &w, &s);
    if (rc < 0) return rc;
    clean_dir(b);
    stash_arena *a = stash_worker_arena(w);
    uint32_t *pins = pin_all(a);
    rc = write_checkpoint(w, pins, &(ckpt_opts){.dir = &b->ckd, .id = 1, .engine = b->e}, NULL);
    unpin_all(a, pins);
    close_loaded(b, w);
    char name2[80];
    snprintf(name2, sizeof name2, "%s-instant", b->name);
    double first[MAX_REPS], all[MAX_REPS], whole[MAX_REPS], ops[MAX_REPS];
    for (int r = 0; r < b->o.reps && rc == 0; r++) {
        bench_progress(&b->o, "checkpoint: %s, repetition %d of %d", name, r + 1, b->o.reps);
        uint64_t ns = 0;
        rc = restore_fresh(b, name2, keys, &ns);
        whole[r] = (double)ns / 1e6;
        if (rc == 0) rc = lazy_once(b, keys, name2, &first[r], &all[r], &ops[r]);
    }
    clean_dir(b);
    if (rc) return rc;
    double f = report_reps(b, name, "stash-lazy-first-op", first, "ms");
    report_reps(b, name, "stash-lazy-every-kg", all, "ms");
    report_reps(b, name, "stash-lazy-gets-meanwhile", ops, "ops");
    double w2 = report_reps(b, name, "stash-whole-restore", whole, "ms");
    report(b, name, "whole/lazy-first-op", w2 / f, "ratio");
    return 0;
}

/* ---- the synchronous pause ---------------------------------------------------- */

uint64_t bench_cut_pause(stash_worker *w)
{
    /* The cut commits the worker's writes and opens the store's cut of
     * every key group (with lmdb, its snapshots). */
    stash_arena *a = stash_worker_arena(w);
    uint64_t t0 = bench_now_ns();
    uint32_t *pins = pin_all(a);
    const store_ops *ops = w->store->ops;
    worker_commit(w, false);
    for (uint32_t kg = 0; ops->cut_open && kg < a->hdr->max_parallelism; kg++)
        ops->cut_open(w->store, kg);
    uint64_t ns = bench_now_ns() - t0;
    for (uint32_t kg = 0; ops->cut_close && kg < a->hdr->max_parallelism; kg++)
        ops->cut_close(w->store, kg);
    if (pins) unpin_all(a, pins);
    return ns;
}

static int pause_case(ckb *b, uint64_t keys, const char *name)
{
    stash_worker *w;
    stash_state *s;
    int rc = open_loaded(b, keys, &w, &s);
    if (rc < 0) return rc;
    enum { PINS = 101 };
    uint64_t ns[PINS];
    for (int i = 0; i < PINS; i++) {
        ns[i] = bench_cut_pause(w);
        /* A write between pins, as a worker's records between barriers. */
        uint64_t k = (uint64_t)i;
        stash_key_set(w, &k, sizeof k);
        stash_value_put(s, &k, sizeof k);
    }
    close_loaded(b, w);
    bench_report_pauses(&b->o, "checkpoint", name, ns, PINS);
    return 0;
}

/* ---- incremental bytes after 1% changed ----------------------------------- */

static int incremental_case(ckb *b)
{
    stash_worker *w;
    stash_state *s;
    int rc = open_loaded(b, b->keys, &w, &s);
    if (rc < 0) return rc;
    stash_arena *a = stash_worker_arena(w);
    clean_dir(b);
    uint32_t *base = pin_all(a);
    ckpt_written full, delta;
    rc = write_checkpoint(
        w, base, &(ckpt_opts){.dir = &b->ckd, .id = 1, .engine = b->e, .incremental = true}, &full);
    /* lmdb: the owner logs what it changes from here, as under an engine in
     * incremental mode that started checkpoint 1. */
    atomic_store(&a->hdr->change_track, 1);
    atomic_store(&a->control->last_id, 1);
    uint8_t val[VALUE_BYTES] = {1};
    for (uint64_t k = 0; rc == 0 && k < b->keys; k += 100) {
        stash_key_set(w, &k, sizeof k);
        rc = stash_value_put(s, val, sizeof val);
    }
    if (rc == 0) rc = worker_commit(w, false);
    uint32_t *pins = pin_all(a);
    if (rc == 0)
        rc = write_checkpoint(w, pins,
                              &(ckpt_opts){.dir = &b->ckd,
                                           .id = 2,
                                           .engine = b->e,
                                           .incremental = true,
                                           .base_id = 1,
                                           .base_pins = base},
                              &delta);
    unpin_all(a, pins);
    unpin_all(a, base);
    close_loaded(b, w);
    clean_dir(b);
    if (rc < 0) return rc;
    report(b, "incremental-1pct", "stash-full", (double)full.data_bytes, "bytes");
    report(b, "incremental-1pct", "stash-incremental", (double)delta.data_bytes, "bytes");
    report(b, "incremental-1pct", "incremental/full",
           (double)delta.data_bytes / (double)full.data_bytes, "ratio");
    return 0;
}

/* ---- throughput and memory while another process writes a checkpoint ------- */

typedef struct shared_run {
    _Atomic int want;     /* pin at the next operation boundary: 1 as walks, 2 as readers */
    _Atomic int pinned;   /* the worker pinned: pins[] hold the versions */
    _Atomic int released; /* the checkpoint is written and unpinned */
    _Atomic int stop;
    _Atomic uint64_t ops;
    uint64_t pause_ns;
    uint32_t pins[STASH_MAX_MAX_PARALLELISM];
} shared_run;

/* The worker: YCSB A on every key until told to stop, pinning when asked. */
static int load_worker(ckb *b, shared_run *run, const ycsb_op *ops, uint64_t nops)
{
    stash_worker *w;
    stash_state *s;
    if (stash_worker_open(
            b->name, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1}, &w) ||
        stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &s))
        return 1;
    stash_arena *a = stash_worker_arena(w);
    uint8_t val[VALUE_BYTES] = {0}, copy[VALUE_BYTES];
    for (uint64_t i = 0; !atomic_load_explicit(&run->stop, memory_order_relaxed); i++) {
        const ycsb_op *op = &ops[i % nops];
        uint64_t k = op->key;
        stash_key_set(w, &k, sizeof k);
        stash_bytes v;
        if (op->kind == YCSB_GET) {
            if (stash_value_get(s, &v) == 0) memcpy(copy, v.data, VALUE_BYTES);
        } else {
            val[0] = (uint8_t)i;
            stash_value_put(s, val, sizeof val);
        }
        atomic_store_explicit(&run->ops, i + 1, memory_order_relaxed);
        int want = atomic_load(&run->want);
        if (i % 64 == 0 && want && !atomic_load(&run->pinned)) {
            uint64_t t0 = bench_now_ns();
            for (uint32_t kg = 0; kg < a->hdr->max_parallelism; kg++)
                run->pins[kg] = (uint32_t)shm_table_pin_for(a, kg, 0, want == 1);
            run->pause_ns = bench_now_ns() - t0;
            atomic_store(&run->pinned, 1);
        }
    }
    stash_worker_close(w);
    return 0;
}

/* With --plot: the worker's operations sampled every 2 ms on a thread of
 * its own, around the first repetition's checkpoint. */
typedef struct sampler {
    shared_run *run;
    bench_series *series;
    _Atomic int stop;
    pthread_t thread;
} sampler;

static void *sample_ops(void *arg)
{
    sampler *sm = arg;
    while (!atomic_load(&sm->stop)) {
        bench_series_sample(sm->series, bench_now_ns(), atomic_load(&sm->run->ops));
        nanosleep(&(struct timespec){.tv_nsec = 2000000}, NULL);
    }
    return NULL;
}

/* The worker's operations over ns, and in *others the processors other
 * processes than the bench's own (self and worker) kept busy meanwhile. */
static uint64_t ops_during(shared_run *run, uint64_t ns, const int pids[2], double *others)
{
    bench_cpu_mark m0, m1;
    bench_cpu_mark_take(&m0, pids, 2);
    uint64_t before = atomic_load(&run->ops), t0 = bench_now_ns();
    while (bench_now_ns() - t0 < ns) usleep(1000);
    uint64_t n = atomic_load(&run->ops) - before;
    bench_cpu_mark_take(&m1, pids, 2);
    if (others) *others = bench_cpu_others(&m0, &m1);
    return n;
}

/* A thread of the bench that reads the arena's memory 1 MiB at a time, at a
 * checkpoint's pace (its state's bytes over its duration): a checkpoint's
 * reads without the checkpoint, for what sharing the memory alone costs
 * the worker. */
typedef struct paced_reads {
    const uint8_t *from;
    uint64_t bytes;
    double per_s;
    _Atomic int stop;
    pthread_t thread;
} paced_reads;

#define PACED_STEP (1u << 20)

static void *read_paced(void *arg)
{
    paced_reads *r = arg;
    uint8_t *buf = malloc(PACED_STEP);
    uint64_t t0 = bench_now_ns(), done = 0;
    while (buf && !atomic_load(&r->stop)) {
        uint64_t at = done % r->bytes, n = r->bytes - at < PACED_STEP ? r->bytes - at : PACED_STEP;
        memcpy(buf, r->from + at, n);
        done += n;
        uint64_t due = t0 + (uint64_t)((double)done / r->per_s * 1e9), now = bench_now_ns();
        if (due > now)
            nanosleep(&(struct timespec){.tv_sec = (time_t)((due - now) / 1000000000u),
                                         .tv_nsec = (long)((due - now) % 1000000000u)},
                      NULL);
    }
    free(buf);
    return NULL;
}

/* The worker's operations per second over ns while the bench reads the
 * arena's data as a checkpoint of state_bytes in ckpt_ns would; 0 if the
 * reading thread did not start. */
static double ops_beside_reads(shared_run *run, stash_arena *a, uint64_t ns, const int pids[2],
                               uint64_t state_bytes, uint64_t ckpt_ns)
{
    paced_reads r = {.from = (const uint8_t *)a->base + a->hdr->data_off,
                     .bytes = state_bytes < PACED_STEP ? PACED_STEP : state_bytes,
                     .per_s = (double)state_bytes / ((double)ckpt_ns / 1e9)};
    if (pthread_create(&r.thread, NULL, read_paced, &r) != 0) return 0;
    uint64_t n = ops_during(run, ns, pids, NULL);
    atomic_store(&r.stop, 1);
    pthread_join(r.thread, NULL);
    return (double)n / ((double)ns / 1e9);
}

/* Redis BGSAVE on the same keys under the same YCSB A operations: what its
 * fork copies on write, beside the stash checkpoint's peak (peak bytes over
 * state_bytes). */
static void redis_bgsave_case(ckb *b, const ycsb_op *ops, uint64_t nops, double peak,
                              double state_bytes, bench_series *series)
{
    char why[512];
    peer_redis_server *srv = NULL;
    kv_sys *kv = NULL;
    int rc = peer_redis_start(b->dir, &srv, why, sizeof why);
    if (rc == 0) rc = peer_redis_open(srv, 64, &kv, why, sizeof why);
    uint8_t val[VALUE_BYTES] = {0};
    bench_progress(&b->o, "checkpoint: loading redis-server");
    for (uint64_t k = 0; rc == 0 && k < b->keys; k++) {
        rc = kv->ops->value_put(kv, k, val, sizeof val);
        if (rc == 0 && (k % 64 == 63 || k + 1 == b->keys)) rc = kv->ops->sync(kv);
        if (rc) snprintf(why, sizeof why, "%s", kv->error);
    }
    uint64_t cow = 0, dataset = 0;
    bench_progress(&b->o, "checkpoint: redis BGSAVE under load");
    if (rc == 0)
        rc =
            peer_redis_bgsave(srv, ops, nops, VALUE_BYTES, &cow, &dataset, series, why, sizeof why);
    if (rc == 0 && series) bench_plot_series("ycsb-a-during-checkpoint", "redis BGSAVE", series);
    if (kv) kv->ops->close(kv);
    peer_redis_stop(srv);
    if (rc) {
        report_skip(b, "extra-memory", "redis-bgsave", why);
        return;
    }
    report(b, "extra-memory", "redis-bgsave", (double)cow, "bytes");
    report(b, "extra-memory", "redis-cow/dataset", (double)cow / (double)dataset, "ratio");
    if (cow)
        report(b, "extra-memory", "stash/redis",
               (peak / state_bytes) / ((double)cow / (double)dataset), "ratio");
}

/* As the engine does for a full checkpoint: each key group's pin goes once
 * the key group is serialized. */
typedef struct pin_set {
    stash_arena *a;
    uint32_t *pins;
} pin_set;

static void release_pin(void *ctx, uint32_t kg)
{
    pin_set *p = ctx;
    shm_table_unpin(p->a, kg, p->pins[kg]);
    p->pins[kg] = 0;
}

/* Has the worker pin every key group as a checkpoint's walks (as readers'
 * with reader), between two of its operations. */
static void pin_under_load(shared_run *run, bool reader)
{
    atomic_store(&run->pinned, 0);
    atomic_store(&run->want, reader ? 2 : 1);
    while (!atomic_load(&run->pinned)) usleep(100);
    atomic_store(&run->want, 0);
}

/* Writes checkpoint 1 of the pinned key groups from the bench's reader
 * slots, calling serialized(pins, kg) once each key group is serialized. */
static int write_pinned(ckb *b, stash_arena *a, shared_run *run, uint32_t slot, uint32_t slot2,
                        void (*serialized)(void *, uint32_t))
{
    return ckpt_write(a, run->pins,
                      &(ckpt_opts){.dir = &b->ckd,
                                   .id = 1,
                                   .engine = b->e,
                                   .reader = true,
                                   .reader_slot = slot,
                                   .reader_slot2 = slot2,
                                   .busy_workers = 1,
                                   .serialized = serialized,
                                   .serialized_ctx = &(pin_set){a, run->pins}},
                      NULL);
}

/* Releases the pins still held. */
static void unpin_run(stash_arena *a, shared_run *run)
{
    for (uint32_t kg = 0; kg < a->hdr->max_parallelism; kg++)
        if (run->pins[kg]) shm_table_unpin(a, kg, run->pins[kg]);
}

/* Writes checkpoint 1 of the pinned key groups, each released once it is
 * serialized, then releases what is left. */
static int write_under_load(ckb *b, stash_arena *a, shared_run *run, uint32_t slot, uint32_t slot2)
{
    int rc = write_pinned(b, a, run, slot, slot2, release_pin);
    unpin_run(a, run);
    return rc;
}

/* Keeps a key group's pin, once serialized, as a delta's base (as the
 * engine keeps an incremental checkpoint's cut). */
static void rebase_pin(void *ctx, uint32_t kg)
{
    pin_set *p = ctx;
    shm_table_pin_rebase(p->a, kg, p->pins[kg]);
}

/* The worker's operations a second over window just after checkpoint 1,
 * its pins kept meanwhile as the base of the next delta: as bases (reader
 * false), what an incremental checkpoint's base costs the worker between
 * checkpoints; as readers' pins, what it cost when the base was one. */
static double ops_after_base(ckb *b, stash_arena *a, shared_run *run, uint32_t slot, uint32_t slot2,
                             bool reader, uint64_t window, const int pids[2], int *rc)
{
    clean_dir(b);
    pin_under_load(run, reader);
    *rc = write_pinned(b, a, run, slot, slot2, reader ? NULL : rebase_pin);
    double rate = *rc ? 0 : (double)ops_during(run, window, pids, NULL) / ((double)window / 1e9);
    unpin_run(a, run);
    return rate;
}

/* The highest of the arena's used bytes while a checkpoint runs, sampled
 * every 200 us by a thread of its own. */
typedef struct mem_sampler {
    const stash_arena *a;
    _Atomic int stop;
    uint64_t peak;
    pthread_t thread;
} mem_sampler;

static void *sample_memory(void *arg)
{
    mem_sampler *m = arg;
    while (!atomic_load(&m->stop)) {
        uint64_t n = arena_used_bytes(m->a);
        if (n > m->peak) m->peak = n;
        nanosleep(&(struct timespec){.tv_nsec = 200000}, NULL);
    }
    return NULL;
}

/* One more checkpoint under the same load, its memory sampled throughout:
 * apart from the timed ones, so that the sampling slows none of them. */
static int peak_under_load(ckb *b, stash_arena *a, shared_run *run, uint32_t slot, uint32_t slot2,
                           uint64_t *peak)
{
    clean_dir(b);
    mem_sampler m = {.a = a, .peak = arena_used_bytes(a)};
    if (pthread_create(&m.thread, NULL, sample_memory, &m) != 0) return -EAGAIN;
    pin_under_load(run, false);
    int rc = write_under_load(b, a, run, slot, slot2);
    atomic_store(&m.stop, 1);
    pthread_join(m.thread, NULL);
    *peak = m.peak;
    return rc;
}

static int under_load_case(ckb *b)
{
    stash_worker *w;
    stash_state *s;
    int rc = open_loaded(b, b->keys, &w, &s);
    if (rc < 0) return rc;
    stash_worker_close(w);
    uint64_t nops = b->o.quick ? 1000000 : 4000000;
    ycsb_op *ops = malloc(nops * sizeof *ops);
    shared_run *run =
        mmap(NULL, sizeof *run, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (!ops || run == MAP_FAILED) return -ENOMEM;
    ycsb_generate(
        &(ycsb_spec){
            .keys = b->keys, .first = YCSB_GET, .second = YCSB_PUT, .first_share = 0.5, .seed = 7},
        ops, nops);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(load_worker(b, run, ops, nops));
    stash_arena *a;
    uint32_t slot, slot2 = 0;
    rc = stash_arena_open(b->name, NULL, &a);
    if (rc == 0) rc = shm_reader_join(a, &slot);
    /* A second serializing thread where the engine would run one. */
    if (rc == 0 && shm_reader_join(a, &slot2) < 0) slot2 = 0;
    while (rc == 0 && atomic_load(&run->ops) < nops / 4) usleep(1000);
    double with[MAX_REPS], without[MAX_REPS], extra[MAX_REPS], busy_with[MAX_REPS],
        busy_without[MAX_REPS], beside[MAX_REPS], base[MAX_REPS], reader_base[MAX_REPS];
    const int pids[2] = {(int)getpid(), (int)pid};
    uint64_t state_bytes = a ? arena_used_bytes(a) : 0;
    bench_series *plot = bench_plotting() ? calloc(1, sizeof *plot) : NULL;
    sampler sm = {.run = run, .series = plot};
    for (int r = 0; r < b->o.reps && rc == 0; r++) {
        bench_progress(&b->o, "checkpoint: under load, repetition %d of %d", r + 1, b->o.reps);
        clean_dir(b);
        bool sampling = r == 0 && plot && pthread_create(&sm.thread, NULL, sample_ops, &sm) == 0;
        /* The same worker without a checkpoint, just before one. */
        uint64_t window = b->o.quick ? 100000000ull : 300000000ull;
        without[r] =
            (double)ops_during(run, window, pids, &busy_without[r]) / ((double)window / 1e9);
        if (sampling) plot->mark_ns[0] = bench_now_ns();
        pin_under_load(run, false);
        bench_cpu_mark m0, m1;
        bench_cpu_mark_take(&m0, pids, 2);
        uint64_t t0 = bench_now_ns(), ops0 = atomic_load(&run->ops);
        rc = write_under_load(b, a, run, slot, slot2);
        uint64_t ns = bench_now_ns() - t0, done = atomic_load(&run->ops) - ops0;
        bench_cpu_mark_take(&m1, pids, 2);
        busy_with[r] = bench_cpu_others(&m0, &m1);
        /* Over the state's own bytes, not over the moment before: what an
         * earlier checkpoint left (a log a walker held back) counts too. */
        extra[r] = (double)arena_used_bytes(a) - (double)state_bytes;
        if (sampling) {
            plot->mark_ns[1] = bench_now_ns();
            ops_during(run, window, pids, NULL);
            atomic_store(&sm.stop, 1);
            pthread_join(sm.thread, NULL);
            bench_plot_series("ycsb-a-during-checkpoint", "stash", plot);
            memset(plot, 0, sizeof *plot);
        }
        with[r] = (double)done / ((double)ns / 1e9);
        if (rc == 0) beside[r] = ops_beside_reads(run, a, window, pids, state_bytes, ns);
    }
    uint64_t peak = 0;
    if (rc == 0) {
        bench_progress(&b->o, "checkpoint: under load, the memory's peak");
        rc = peak_under_load(b, a, run, slot, slot2, &peak);
    }
    /* Last: a reader's pin, once released, leaves its copies for the owner
     * to sweep and free, which would slow whatever came next. */
    uint64_t window = b->o.quick ? 100000000ull : 300000000ull;
    for (int r = 0; r < b->o.reps && rc == 0; r++) {
        bench_progress(&b->o, "checkpoint: after a checkpoint, repetition %d of %d", r + 1,
                       b->o.reps);
        base[r] = ops_after_base(b, a, run, slot, slot2, false, window, pids, &rc);
        if (rc == 0)
            reader_base[r] = ops_after_base(b, a, run, slot, slot2, true, window, pids, &rc);
        if (rc == 0) ops_during(run, window, pids, NULL);
    }
    atomic_store(&run->stop, 1);
    waitpid(pid, NULL, 0);
    if (a) {
        shm_reader_leave(a, slot);
        if (slot2) shm_reader_leave(a, slot2);
        stash_arena_close(a);
    }
    stash_arena_destroy(b->name, NULL);
    clean_dir(b);
    munmap(run, sizeof *run);
    if (rc < 0) {
        free(ops);
        return rc;
    }
    report_reps(b, "ycsb-a/during-checkpoint", "stash", with, "ops/s");
    report_reps(b, "ycsb-a/without", "stash", without, "ops/s");
    report_ratio(b, "ycsb-a/during-checkpoint", "during/without", with, without);
    report_reps(b, "ycsb-a/beside-reads", "stash", beside, "ops/s");
    report_ratio(b, "ycsb-a/beside-reads", "reads/without", beside, without);
    report_reps(b, "ycsb-a/after-checkpoint", "stash-base", base, "ops/s");
    report_ratio(b, "ycsb-a/after-checkpoint", "base/without", base, without);
    report_reps(b, "ycsb-a/after-checkpoint", "stash-reader-base", reader_base, "ops/s");
    report_ratio(b, "ycsb-a/after-checkpoint", "reader-base/without", reader_base, without);
    /* Whether the second core was free for the engine: what other processes
     * took of the machine's processors in the same windows. */
    double bw = report_reps(b, "ycsb-a/during-checkpoint", "other-processes", busy_with, "cores");
    double bo = report_reps(b, "ycsb-a/without", "other-processes", busy_without, "cores");
    if ((bw > OTHERS_BUSY || bo > OTHERS_BUSY) && !b->o.json && !b->o.csv)
        printf("# ycsb-a: the second core was not free: other processes took %.2f cores during "
               "the checkpoints and %.2f without\n",
               bw, bo);
    double me = report_reps(b, "extra-memory", "stash", extra, "bytes");
    report(b, "extra-memory", "extra/state", me / (double)state_bytes, "ratio");
    double over = (double)peak - (double)state_bytes;
    report(b, "extra-memory", "stash-peak", over, "bytes");
    report(b, "extra-memory", "peak/state", over / (double)state_bytes, "ratio");
    redis_bgsave_case(b, ops, nops, over, (double)state_bytes, plot);
    free(plot);
    free(ops);
    return 0;
}

int bench_checkpoint(int argc, char **argv)
{
    static const char usage[] =
        "A full checkpoint's write bandwidth and a restore's read bandwidth beside fio (direct,\n"
        "io_uring, depth 16) on the same bytes; the pause to pin every key group with 100K\n"
        "keys and with 10M (--quick: 1M); the bytes of an incremental checkpoint after 1% of\n"
        "the keys changed; a worker's YCSB A throughput and the arena's extra memory while\n"
        "another process writes a checkpoint, beside what Redis BGSAVE's fork copies on write\n"
        "under the same operations (redis-server, when installed), and beside reads of the\n"
        "arena at the checkpoint's pace with no checkpoint; the worker's throughput just\n"
        "after a checkpoint whose pins stay as the next delta's base (after-checkpoint: as\n"
        "bases, and as readers' pins, which copy on write). 1M keys of 100 bytes\n"
        "(--quick: 100K). instant: a checkpoint of 1M keys and one of 10M (--quick: 100K\n"
        "and 1M) restored lazily into a new arena while a worker gets random keys: the time\n"
        "to its first get and until every key group is back (a background pass and the\n"
        "worker's touches), beside the time of a whole restore. The checkpoints go to\n"
        "$STASH_BENCH_DIR, or /var/tmp.\n"
        "--backend lmdb: the same of the lmdb backend (10M keys, --quick: 200K; the pause is\n"
        "the cut's commit and the engine's opening of every snapshot; the restore also\n"
        "beside the same records put key by key), its environments beside the\n"
        "checkpoints; no figures under load. rewrite: a savepoint of the 1M keys and 100K\n"
        "of a second state read, checked and written again without the second state\n"
        "(stash snapshot rewrite --drop-state), its bytes read and written per second\n"
        "beside fio reading and writing the same bytes (heap backend).\n"
        "--storage rados --pool P: instead, a checkpoint of the 1M keys written into the\n"
        "pool P (the cluster of $CEPH_CONF) as it is written to the directory, and\n"
        "committed, and its restore straight from the pool (the directory's copy written\n"
        "meanwhile); each step also timed alone (the local write, the upload of it, the\n"
        "fetch, the local restore); beside rados bench writing the same bytes as objects\n"
        "of 4 MiB, 8 at a time, and reading them back, in the same run. --storage s3 --bucket B: "
        "the same into the S3 bucket B (the\n"
        "endpoint and keys of the environment, as stash serve takes them), beside aws s3\n"
        "cp copying the checkpoint's data file up and down with parts of 8 MiB, 8 at a\n"
        "time.\n";
    ckb b = {0};
    int rc = bench_parse(argc, argv, usage, &b.o);
    const char *const names[] = {"full/write",
                                 "restore/read",
                                 "restore/first-touch",
                                 "pause/100k-keys",
                                 b.o.quick ? "pause/1m-keys" : "pause/10m-keys",
                                 "incremental-1pct",
                                 "ycsb-a/during-checkpoint",
                                 "ycsb-a/without",
                                 "ycsb-a/beside-reads",
                                 "ycsb-a/after-checkpoint",
                                 "extra-memory",
                                 "rewrite",
                                 "rados/write",
                                 "rados/restore",
                                 "s3/write",
                                 "s3/restore",
                                 "instant/100k-keys",
                                 "instant/1m-keys",
                                 "instant/10m-keys"};
    if (rc == 0 && bench_check_case(&b.o, "checkpoint", names, sizeof names / sizeof names[0]) < 0)
        rc = -1;
    if (rc) return rc < 0 ? 2 : 0;
    if (b.o.reps > MAX_REPS) b.o.reps = MAX_REPS;
    const char *base = getenv("STASH_BENCH_DIR") ? getenv("STASH_BENCH_DIR") : "/var/tmp";
    snprintf(b.name, sizeof b.name, "bench-ckpt-%d", (int)getpid());
    b.keys = on_lmdb(&b) ? (b.o.quick ? 200000 : 10000000) : b.o.quick ? 100000 : 1000000;
    bench_header(&b.o, "checkpoint", "%llu keys on the %s backend, checkpoints in %s",
                 (unsigned long long)b.keys, on_lmdb(&b) ? "lmdb" : "heap", base);
    double aws_start;
    if (b.o.storage && strcmp(b.o.storage, "rados") == 0) {
        bench_setup(&b.o, "rados-bench",
                    "rados bench on the same pool: the checkpoint's bytes as 4 MiB objects "
                    "(--max-objects), 8 in flight, written, "
                    "then seq reading them back");
    } else if (b.o.storage && bench_aws_start(&aws_start) == 0) {
        char took[96];
        snprintf(took, sizeof took, "aws --version took %.0f ms here", aws_start * 1e3);
        bench_setup(&b.o, "awscli", BENCH_AWS_SETUP);
        bench_setup(&b.o, "awscli-start", took);
    } else if (b.o.storage) {
        bench_setup(&b.o, "awscli", "not installed (apt-get install awscli): skipped");
    } else {
        bench_setup(&b.o, "fio", BENCH_FIO_SETUP "; at least 1 GiB a pass");
        bench_setup(&b.o, "read-and-copy",
                    "the checkpoint's files read with O_DIRECT, 8 blocks of 1 MiB in flight "
                    "through io_uring, each copied as it lands into fresh pages of a new "
                    "/dev/shm file");
    }
    rc = ioe_engine_open(&(ioe_opts){.backend = IOE_AUTO}, &b.e);
    if (rc < 0) return tool_fail("bench checkpoint: I/O engine", rc);
    /* A directory of the bench's own, never one another user made. */
    b.ckd.fd = -1;
    rc = shm_dir_open(base, SHM_DIR_PLACE, &b.parent);
    if (rc == 0) rc = shm_dir_temp(&b.parent, "stash-bench-checkpoint.", &b.ckd);
    if (rc) {
        ioe_engine_close(b.e);
        shm_dir_close(&b.parent);
        return tool_fail("bench checkpoint: its directory", rc);
    }
    snprintf(b.dir, sizeof b.dir, "%s", b.ckd.path);
    if (b.o.storage) {
        rc = bench_selected(&b.o, b.o.storage) ? remote_cases(&b) : 0;
        ioe_engine_close(b.e);
        shm_dir_temp_remove(&b.parent, &b.ckd);
        shm_dir_close(&b.parent);
        return rc < 0 ? tool_fail("bench checkpoint", rc) : 0;
    }
    rc = bandwidth_cases(&b);
    if (rc == 0) rc = pause_case(&b, 100000, "pause/100k-keys");
    if (rc == 0)
        rc = pause_case(&b, b.o.quick ? 1000000 : 10000000,
                        b.o.quick ? "pause/1m-keys" : "pause/10m-keys");
    if (rc == 0) rc = incremental_case(&b);
    if (rc == 0 && bench_selected(&b.o, "instant")) {
        rc = instant_case(&b, b.o.quick ? 100000 : 1000000,
                          b.o.quick ? "instant/100k-keys" : "instant/1m-keys");
        if (rc == 0)
            rc = instant_case(&b, b.o.quick ? 1000000 : 10000000,
                              b.o.quick ? "instant/1m-keys" : "instant/10m-keys");
    }
    if (rc == 0 && on_lmdb(&b))
        report_skip(&b, "rewrite", "stash",
                    "a savepoint is the same on both backends: measured with the heap's");
    else if (rc == 0 && bench_selected(&b.o, "rewrite"))
        rc = rewrite_case(&b);
    if (rc == 0 && on_lmdb(&b))
        report_skip(&b, "ycsb-a/during-checkpoint", "stash",
                    "measured for the heap backend: its writers and the checkpoint share the "
                    "arena's memory");
    else if (rc == 0)
        rc = under_load_case(&b);
    ioe_engine_close(b.e);
    shm_dir_temp_remove(&b.parent, &b.ckd);
    shm_dir_close(&b.parent);
    stash_arena_destroy(b.name, NULL);
    return rc < 0 ? tool_fail("bench checkpoint", rc) : 0;
}
