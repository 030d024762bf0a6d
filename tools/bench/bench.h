/* SPDX-License-Identifier: MIT */
/*
 * bench.h: the benchmark program's harness (options, the report beside
 * peers, medians, percentiles, progress) and its benches. `stash bench`
 * runs this program, stash-bench, which alone links the peers.
 */
#ifndef STASH_BENCH_H
#define STASH_BENCH_H

#include "tools/tools.h"

/* ------------------------------------------------------------------------ */
/* The harness (harness.c).                                                  */

typedef struct bench_opts {
    bool json;             /* one JSON object per line on stdout instead of a table */
    bool csv;              /* comma-separated rows on stdout instead of a table */
    bool quick;            /* reduced sizes: a smoke check under a minute */
    int reps;              /* repetitions; each figure is their median */
    bool progress;         /* stderr is a terminal and output is a table */
    stash_backend backend; /* --backend: keyed and checkpoint measure either */
    const char *only;      /* --case: only the cases whose name starts with it */
    const char *storage;   /* --storage rados|s3: checkpoint measures that remote storage */
    const char *container; /* its --pool P (rados) or --bucket B (s3) */
} bench_opts;

typedef struct bench_result {
    const char *bench;  /* "arena", "io", "keyed", ... */
    const char *name;   /* the case, e.g. "alloc-free/1proc" */
    const char *system; /* "stash", "malloc", "fio", ... */
    double value;       /* the median of the repetitions */
    double min, max;    /* the lowest and highest repetition; both 0: not repeated */
    const char *unit;   /* "ops/s", "bytes/s", "us", "bytes", "ratio" */
    bool latency;       /* whether the p50/p99/p999 fields apply */
    double p50_us, p99_us, p999_us;
    const char *skipped; /* non-NULL: the peer could not run, and why */
    uint64_t ops;        /* operations each repetition ran; 0: not said */
} bench_result;

/* A memory budget (budget.c): the process in a memory cgroup of its own. */
typedef struct bench_budget {
    char home[512];  /* the cgroup it came from */
    char group[512]; /* its own; "" if none */
    int layout;      /* cgroup v2, or v1's memory controller (budget.c) */
    uint64_t held;   /* bytes it held beyond the data's pages when limited */
    uint64_t limit;  /* the cgroup's memory.max: held plus the data's budget */
} bench_budget;

/* Moves the process into a new memory cgroup, no limit yet. Returns 0, or
 * an error with why set (no cgroup v2, not allowed). */
int bench_budget_enter(bench_budget *b, char *why, size_t whylen);
/* Limits it to what it holds now that no reclaim can take (anonymous and
 * shared memory) plus data_bytes for cached pages of its files: the kernel
 * reclaims the rest at once. Returns 0 or an error with why set. */
int bench_budget_limit(bench_budget *b, uint64_t data_bytes, char *why, size_t whylen);
/* Once limited: reclaims the data's cached pages, so that what runs next
 * starts as cold as what ran before it did. */
void bench_budget_evict(const bench_budget *b);
/* Moves the process back and removes the cgroup. Accepts one never entered. */
void bench_budget_leave(bench_budget *b);

/* Parses --json, --csv, --quick and --reps N; prints usage and returns -1
 * on a bad argument, 1 on --help, 0 otherwise. usage names the bench's own
 * cases. */
int bench_parse(int argc, char **argv, const char *usage, bench_opts *out);
/* Prints the header every bench starts with: stash's version and build
 * type, the machine (CPU model, cores, memory, kernel), the bench's sizes
 * (printf-style) and the repetitions; a comment in a table or CSV, an
 * object {"header": ...} in JSON. */
void bench_header(const bench_opts *o, const char *bench, const char *sizes, ...)
    __attribute__((format(printf, 3, 4)));
/* Prints how a system is set up (a peer's configuration), after the
 * header: a comment in a table or CSV, an object {"setup": ...} in JSON. */
void bench_setup(const bench_opts *o, const char *system, const char *setup);
/* Refuses --backend lmdb for a bench that measures the heap only: -1
 * after saying so, else 0. */
int bench_heap_only(const bench_opts *o, const char *cmd);
/* Refuses a --case that selects none of the n case names the bench reports
 * (on its backend): -1 after saying so and naming them, else 0. */
int bench_check_case(const bench_opts *o, const char *cmd, const char *const *names, size_t n);
/* Whether --case selects the case name (every case without --case). */
bool bench_selected(const bench_opts *o, const char *name);
/* Prints one result as a table row or a JSON line, if --case selects it. */
void bench_report(const bench_opts *o, const bench_result *r);
/* Prints a progress line on the terminal (overwritten by the next). */
void bench_progress(const bench_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* r with the median, lowest and highest of v[0 .. n-1] (reorders v). */
bench_result bench_spread(bench_result r, double *v, int n);
/* Fills order[0 .. n-1] with 0 .. n-1 in the order of repetition r,
 * shuffled from seed and r: no system always runs first, or always after
 * the same other. */
void bench_shuffle(int *order, int n, uint64_t seed, int r);
/* Reports system's ratio in case name of bench: the median of the
 * repetitions' ratios num[i] / den[i] (each from passes of one repetition),
 * with their lowest and highest; nothing if a repetition lacks either. */
void bench_report_ratio(const bench_opts *o, const char *bench, const char *name,
                        const char *system, const double *num, const double *den, int reps);
/* Monotonic nanoseconds. */
uint64_t bench_now_ns(void);
/* What the machine's processors did up to a moment: their busy time and
 * that of the bench's own processes, in nanoseconds. */
typedef struct bench_cpu_mark {
    uint64_t at_ns, busy_ns, own_ns;
} bench_cpu_mark;
/* Takes a mark, the processes pids[0 .. n-1] counted as the bench's own. */
void bench_cpu_mark_take(bench_cpu_mark *m, const int *pids, int n);
/* The processors other processes kept busy between two marks, on average
 * (0.5: half a core). */
double bench_cpu_others(const bench_cpu_mark *from, const bench_cpu_mark *to);
/* Latency percentile (0..1) in microseconds from n samples in ns (reorders them). */
double bench_percentile_us(uint64_t *ns, uint64_t n, double p);
/* Reports stash's pauses ns[0 .. n-1] as case name of bench: their median
 * in µs, with p50, p99 and p99.9; returns the median. */
double bench_report_pauses(const bench_opts *o, const char *bench, const char *name, uint64_t *ns,
                           uint64_t n);

/* ------------------------------------------------------------------------ */
/* --plot DIR (plot.c): figures' data in DIR, drawn by gnuplot at the end.  */

/* Throughput over time: operations counted so far at each sample, and a
 * checkpoint's start and end (0: none). */
#define BENCH_SERIES_MAX 8192u
typedef struct bench_series {
    uint64_t t_ns[BENCH_SERIES_MAX];
    uint64_t ops[BENCH_SERIES_MAX];
    uint32_t n;
    uint64_t mark_ns[2];
} bench_series;

/* Makes DIR (its parent must exist) where the plots go. Returns 0 or -errno. */
int bench_plot_dir(const char *dir);
/* Whether --plot was given. */
bool bench_plotting(void);
/* Appends a sample (now_ns, ops: bench_now_ns() and the count) to s, while
 * it has room. */
void bench_series_sample(bench_series *s, uint64_t now_ns, uint64_t ops);
/* With --plot: system's throughput over time in the picture name. */
void bench_plot_series(const char *name, const char *system, const bench_series *s);
/* With --plot: system's latency CDF in bench's case name, from n samples in
 * ns sorted ascending. */
void bench_plot_cdf(const char *bench, const char *name, const char *system, const uint64_t *ns,
                    uint64_t n);
/* With --plot: system's bar in the bar chart name. */
void bench_plot_bar(const char *name, const char *system, double value, const char *unit);
/* With --plot: writes DIR/plots.gp and runs gnuplot on it. Returns 0, or 1
 * after saying what failed (gnuplot missing or failing). */
int bench_plot_draw(void);

/* Runs fio on path: a file of size bytes (a new one when writing) in 1 MiB
 * blocks, io_uring with registered buffers and file, depth 16, fsync at the
 * end of a write; *bps its bandwidth. Returns 0 or -EIO. */
int bench_fio(const char *path, uint64_t size, bool writing, bool direct, double *bps);
/* The bytes a fio pass beside a transfer of n bytes moves: n, or 1 GiB if
 * that is more (a shorter pass is not steady). */
#define BENCH_FIO_BYTES(n) ((n) > (1ull << 30) ? (n) : (1ull << 30))
/* How bench_fio sets fio up, for a bench's header (bench_setup). */
#define BENCH_FIO_SETUP                                                                            \
    "io_uring, 1 MiB blocks, 16 in flight, buffers and file registered (--fixedbufs "              \
    "--registerfiles), once over a new file when writing, an fsync at its end"
/* Whether fio runs here. */
bool bench_fio_installed(void);
/* `rados bench` on pool (the cluster of $CEPH_CONF): bytes written as 4 MiB
 * objects 8 at a time (left for the read), or read back in order (then
 * removed). Returns 0 with the bandwidth in *bps, or -EIO. */
int bench_rados_bench(const char *pool, bool writing, uint64_t bytes, double *bps);
/* How bench_aws_s3 sets the AWS command line up, for a bench's header. */
#define BENCH_AWS_SETUP                                                                            \
    "aws s3 cp (awscli) of the checkpoint's data file up and down again, parts of 8 MiB, 8 "       \
    "in flight (s3.max_concurrent_requests, multipart_chunksize), the endpoint and keys of "       \
    "the environment; its time is shown whole (awscli) and less its interpreter's start "          \
    "(aws --version, timed just before each copy: awscli-less-start), which the ratios take"
/* `aws s3 cp` of the file at path to s3://bucket/key (writing), or back
 * into path: 0 with the seconds it took in *secs, or -EIO. */
int bench_aws_s3(const char *bucket, const char *key, const char *path, bool writing, double *secs);
/* How long `aws --version` takes (its interpreter's start): 0 and *secs, or -EIO. */
int bench_aws_start(double *secs);

/* One checkpoint's synchronous pause for worker w, the only worker of its
 * arena (checkpoint.c): every key group pinned, the worker's writes
 * committed, the store's cuts opened; the cuts are released after. */
uint64_t bench_cut_pause(stash_worker *w);

/* The benches, each `stash bench NAME`. */
int bench_arena(int argc, char **argv);
int bench_checkpoint(int argc, char **argv);
int bench_io(int argc, char **argv);
int bench_keyed(int argc, char **argv);
int bench_timers(int argc, char **argv);
int bench_python(int argc, char **argv);

#endif
