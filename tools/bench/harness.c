/* SPDX-License-Identifier: MIT */
/*
 * harness.c: the harness every bench shares: options, the header, the
 * table, JSON-lines or CSV report, medians with their spread and
 * percentiles, progress on a terminal.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "tools/bench/bench.h"

/* The options of bench name's own, for its usage line. */
static const char *own_options(const char *name)
{
    return strcmp(name, "keyed") == 0
               ? " [--backend heap|lmdb]\n       [--memory-budget auto|BYTES]"
           : strcmp(name, "checkpoint") == 0
               ? " [--backend heap|lmdb]\n       [--storage fs|rados --pool P|s3 --bucket B]"
           : strcmp(name, "timers") == 0 ? " [--backend heap|lmdb]"
           : strcmp(name, "io") == 0     ? " [--dir DIR] [--size N]"
                                         : "";
}

int bench_parse(int argc, char **argv, const char *usage, bench_opts *out)
{
    *out = (bench_opts){.reps = 5};
    const char *pool = NULL, *bucket = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            out->json = true;
        } else if (strcmp(argv[i], "--csv") == 0) {
            out->csv = true;
        } else if (strcmp(argv[i], "--quick") == 0) {
            out->quick = true;
        } else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
            const char *v = argv[++i];
            if (strcmp(v, "heap") != 0 && strcmp(v, "lmdb") != 0) {
                fprintf(stderr, "stash bench %s: --backend takes heap or lmdb, not '%s'\n", argv[0],
                        v);
                return -1;
            }
            out->backend = strcmp(v, "lmdb") == 0 ? STASH_BACKEND_LMDB : STASH_BACKEND_HEAP;
        } else if (strcmp(argv[i], "--storage") == 0 && i + 1 < argc) {
            const char *v = argv[++i];
            if (strcmp(v, "fs") != 0 && strcmp(v, "rados") != 0 && strcmp(v, "s3") != 0) {
                fprintf(stderr, "stash bench %s: --storage takes fs, rados or s3, not '%s'\n",
                        argv[0], v);
                return -1;
            }
            out->storage = strcmp(v, "fs") == 0 ? NULL : v;
        } else if (strcmp(argv[i], "--pool") == 0 && i + 1 < argc) {
            pool = argv[++i];
        } else if (strcmp(argv[i], "--bucket") == 0 && i + 1 < argc) {
            bucket = argv[++i];
        } else if (strcmp(argv[i], "--case") == 0 && i + 1 < argc) {
            out->only = argv[++i];
        } else if (strcmp(argv[i], "--plot") == 0 && i + 1 < argc) {
            int rc = bench_plot_dir(argv[++i]);
            if (rc < 0) {
                fprintf(stderr, "stash bench %s: --plot %s: %s\n", argv[0], argv[i], strerror(-rc));
                return -1;
            }
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            out->reps = atoi(argv[++i]);
            if (out->reps < 1 || out->reps > 1000) {
                fprintf(stderr, "stash bench %s: --reps takes 1 to 1000\n", argv[0]);
                return -1;
            }
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: stash bench %s [--json | --csv] [--quick] [--reps N] [--case PREFIX]\n"
                   "       [--plot DIR]%s\n%s"
                   "--case PREFIX: only the cases whose name starts with PREFIX. Each figure is\n"
                   "the median of the repetitions, shown with their lowest and highest.\n"
                   "--plot DIR: PNGs drawn by gnuplot in DIR, with their data: latency CDFs per\n"
                   "case, throughput over time around a checkpoint, bandwidth beside fio.\n",
                   argv[0], own_options(argv[0]), usage);
            return 1;
        } else {
            fprintf(stderr, "stash bench %s: unknown argument '%s' (stash bench %s --help)\n",
                    argv[0], argv[i], argv[0]);
            return -1;
        }
    }
    if ((out->storage || pool || bucket) && strcmp(argv[0], "checkpoint") != 0) {
        fprintf(stderr, "stash bench %s: --storage, --pool and --bucket are checkpoint's\n",
                argv[0]);
        return -1;
    }
    bool rados = out->storage && strcmp(out->storage, "rados") == 0,
         s3 = out->storage && strcmp(out->storage, "s3") == 0;
    if (rados != (pool != NULL) || s3 != (bucket != NULL)) {
        fprintf(stderr,
                "stash bench %s: --storage rados and --pool P go together, as do --storage s3 "
                "and --bucket B\n",
                argv[0]);
        return -1;
    }
    out->container = rados ? pool : bucket;
    if (out->json && out->csv) {
        fprintf(stderr, "stash bench %s: --json and --csv exclude each other\n", argv[0]);
        return -1;
    }
    if (out->quick && out->reps > 3) out->reps = 3;
    out->progress = !out->json && !out->csv && isatty(STDERR_FILENO);
    return 0;
}

/* The machine's facts for the header. */
typedef struct machine {
    char cpu[128];
    long cores;
    uint64_t memory;
    char kernel[160];
} machine;

static void machine_of(machine *m)
{
    snprintf(m->cpu, sizeof m->cpu, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !colon) continue;
        colon += 1 + strspn(colon + 1, " \t");
        colon[strcspn(colon, "\n")] = 0;
        snprintf(m->cpu, sizeof m->cpu, "%s", colon);
        break;
    }
    if (f) fclose(f);
    m->cores = sysconf(_SC_NPROCESSORS_ONLN);
    m->memory = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    struct utsname u;
    if (uname(&u) == 0)
        snprintf(m->kernel, sizeof m->kernel, "%s %s", u.sysname, u.release);
    else
        snprintf(m->kernel, sizeof m->kernel, "unknown");
}

#define CSV_COLUMNS "bench,case,system,value,unit,min,max,p50_us,p99_us,p999_us,skipped"

void bench_header(const bench_opts *o, const char *bench, const char *sizes, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, sizes);
    vsnprintf(what, sizeof what, sizes, ap);
    va_end(ap);
    machine m;
    machine_of(&m);
    if (o->json) {
        printf("{\"header\": {\"bench\": ");
        tool_json_string(bench);
        printf(", \"version\": ");
        tool_json_string(stash_version());
        printf(", \"build\": ");
        tool_json_string(STASH_BUILD_TYPE);
        printf(", \"cpu\": ");
        tool_json_string(m.cpu);
        printf(", \"cores\": %ld, \"memory_bytes\": %llu, \"kernel\": ", m.cores,
               (unsigned long long)m.memory);
        tool_json_string(m.kernel);
        printf(", \"sizes\": ");
        tool_json_string(what);
        printf(", \"reps\": %d}}\n", o->reps);
    } else {
        printf("# stash %s (%s build), bench %s: %s; each figure the median of %d\n"
               "# machine: %s, %ld cores, %.1f GiB, %s\n",
               stash_version(), STASH_BUILD_TYPE, bench, what, o->reps, m.cpu, m.cores,
               (double)m.memory / (1u << 30), m.kernel);
    }
    fflush(stdout);
}

void bench_setup(const bench_opts *o, const char *system, const char *setup)
{
    if (o->json) {
        printf("{\"setup\": {\"system\": ");
        tool_json_string(system);
        printf(", \"how\": ");
        tool_json_string(setup);
        printf("}}\n");
    } else {
        printf("# %s: %s\n", system, setup);
    }
    fflush(stdout);
}

int bench_heap_only(const bench_opts *o, const char *cmd)
{
    if (o->backend == STASH_BACKEND_HEAP) return 0;
    fprintf(stderr, "stash bench %s: --backend lmdb is for keyed, checkpoint and timers\n", cmd);
    return -1;
}

static void print_number(double v, const char *unit)
{
    if (strcmp(unit, "ratio") == 0)
        printf("%12.2fx", v);
    else if (v >= 1e9)
        printf("%12.3f G", v / 1e9);
    else if (v >= 1e6)
        printf("%12.3f M", v / 1e6);
    else if (v >= 1e3)
        printf("%12.3f K", v / 1e3);
    else
        printf("%12.3f  ", v);
}

/* A figure in few characters: 3 significant digits and a unit prefix. */
static void print_compact(double v)
{
    const char *p = v >= 1e9 ? "G" : v >= 1e6 ? "M" : v >= 1e3 ? "K" : "";
    double d = v >= 1e9 ? 1e9 : v >= 1e6 ? 1e6 : v >= 1e3 ? 1e3 : 1;
    printf("%.3g%s", v / d, p);
}

bool bench_selected(const bench_opts *o, const char *name)
{
    return !o->only || strncmp(name, o->only, strlen(o->only)) == 0;
}

int bench_check_case(const bench_opts *o, const char *cmd, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (bench_selected(o, names[i])) return 0;
    fprintf(stderr, "stash bench %s: --case '%s' starts no case's name; its cases%s:", cmd, o->only,
            o->backend == STASH_BACKEND_LMDB ? " with --backend lmdb" : "");
    for (size_t i = 0; i < n; i++) fprintf(stderr, "%s %s", i ? "," : "", names[i]);
    fputc('\n', stderr);
    return -1;
}

void bench_report(const bench_opts *o, const bench_result *r)
{
    if (!bench_selected(o, r->name)) return;
    if (o->progress) fputs("\r\033[K", stderr);
    /* One column line before the first row, however many benches follow. */
    static bool columns;
    if (o->csv && !columns) puts(CSV_COLUMNS);
    columns = true;
    bool spread = r->max > 0;
    if (o->csv) {
        /* Names are the benches' own: no commas or quotes in them; a reason
         * to skip is quoted. */
        printf("%s,%s,%s,", r->bench, r->name, r->system);
        if (r->skipped) {
            printf(",,,,,,,\"");
            for (const char *p = r->skipped; *p; p++) printf(*p == '"' ? "\"\"" : "%c", *p);
            printf("\"\n");
        } else {
            printf("%.6g,%s,", r->value, r->unit);
            if (spread)
                printf("%.6g,%.6g", r->min, r->max);
            else
                printf(",");
            if (r->latency)
                printf(",%.3f,%.3f,%.3f,\n", r->p50_us, r->p99_us, r->p999_us);
            else
                printf(",,,,\n");
        }
    } else if (o->json) {
        printf("{\"bench\": ");
        tool_json_string(r->bench);
        printf(", \"case\": ");
        tool_json_string(r->name);
        printf(", \"system\": ");
        tool_json_string(r->system);
        if (r->skipped) {
            printf(", \"skipped\": ");
            tool_json_string(r->skipped);
            printf("}\n");
        } else {
            printf(", \"value\": %.6g, \"unit\": ", r->value);
            tool_json_string(r->unit);
            if (spread) printf(", \"min\": %.6g, \"max\": %.6g", r->min, r->max);
            if (r->ops) printf(", \"ops\": %llu", (unsigned long long)r->ops);
            if (r->latency)
                printf(", \"p50_us\": %.3f, \"p99_us\": %.3f, \"p999_us\": %.3f", r->p50_us,
                       r->p99_us, r->p999_us);
            printf("}\n");
        }
    } else {
        printf("%-8s %-28s %-22s", r->bench, r->name, r->system);
        if (r->skipped) {
            printf("  skipped: %s\n", r->skipped);
        } else {
            print_number(r->value, r->unit);
            printf(" %-7s", strcmp(r->unit, "ratio") == 0 ? "" : r->unit);
            if (spread) {
                printf(" [");
                print_compact(r->min);
                printf(" .. ");
                print_compact(r->max);
                printf("]");
            }
            if (r->latency)
                printf("  p50 %.2f us  p99 %.2f us  p99.9 %.2f us", r->p50_us, r->p99_us,
                       r->p999_us);
            printf("\n");
        }
    }
    fflush(stdout);
}

void bench_progress(const bench_opts *o, const char *fmt, ...)
{
    if (!o->progress) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("\r\033[K", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

bench_result bench_spread(bench_result r, double *v, int n)
{
    r.value = median_of(v, n);
    r.min = v[0];
    r.max = v[n - 1];
    return r;
}

void bench_shuffle(int *order, int n, uint64_t seed, int r)
{
    uint64_t x = (seed << 16 | (uint64_t)r) + 0x9E3779B97F4A7C15ull; /* splitmix64's finalizer */
    x = (x ^ x >> 30) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ x >> 27) * 0x94D049BB133111EBull;
    x = (x ^ x >> 31) | 1;
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = n - 1; i > 0; i--) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int j = (int)(x % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j], order[j] = t;
    }
}

void bench_report_ratio(const bench_opts *o, const char *bench, const char *name,
                        const char *system, const double *num, const double *den, int reps)
{
    double *v = malloc((size_t)reps * sizeof *v);
    bool all = v != NULL;
    for (int r = 0; all && r < reps; r++) {
        all = num[r] > 0 && den[r] > 0;
        if (all) v[r] = num[r] / den[r];
    }
    if (all) {
        bench_result res = {.bench = bench, .name = name, .system = system, .unit = "ratio"};
        res = bench_spread(res, v, reps);
        bench_report(o, &res);
    }
    free(v);
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

double bench_percentile_us(uint64_t *ns, uint64_t n, double p)
{
    if (n == 0) return 0;
    qsort(ns, n, sizeof *ns, cmp_u64);
    uint64_t i = (uint64_t)(p * (double)(n - 1) + 0.5);
    return (double)ns[i] / 1e3;
}

uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The clock ticks of the first line of path after skip fields, summed over
 * the fields whose bit is set in take (bit 0 the first after skip). */
static uint64_t stat_ticks(const char *path, int skip, unsigned take)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    uint64_t n = 0;
    if (!f) return 0;
    if (fgets(line, sizeof line, f)) {
        /* A process's name (its second field) may hold spaces: skip it whole. */
        char *p = strrchr(line, ')');
        p = p ? p + 1 : line;
        for (int field = 0; *p; field++) {
            char *end;
            unsigned long long v = strtoull(p, &end, 10);
            if (end == p) {
                p++;
                field--;
                continue;
            }
            if (field >= skip && field - skip < 32 && (take >> (field - skip) & 1u)) n += v;
            p = end;
        }
    }
    fclose(f);
    return n;
}

void bench_cpu_mark_take(bench_cpu_mark *m, const int *pids, int n)
{
    double tick_ns = 1e9 / (double)sysconf(_SC_CLK_TCK);
    /* /proc/stat: "cpu user nice system idle iowait irq softirq steal ...". */
    m->busy_ns = (uint64_t)((double)stat_ticks("/proc/stat", 0, 0xe7u) * tick_ns);
    m->own_ns = 0;
    for (int i = 0; i < n; i++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/stat", pids[i]);
        /* After the name and state: ppid ... utime stime (fields 14 and 15). */
        m->own_ns += (uint64_t)((double)stat_ticks(path, 10, 3u) * tick_ns);
    }
    m->at_ns = bench_now_ns();
}

double bench_cpu_others(const bench_cpu_mark *from, const bench_cpu_mark *to)
{
    double busy = (double)(to->busy_ns - from->busy_ns), own = (double)(to->own_ns - from->own_ns);
    double ns = (double)(to->at_ns - from->at_ns);
    return ns > 0 && busy > own ? (busy - own) / ns : 0;
}

double bench_report_pauses(const bench_opts *o, const char *bench, const char *name, uint64_t *ns,
                           uint64_t n)
{
    double median = bench_percentile_us(ns, n, 0.5);
    bench_report(o, &(bench_result){.bench = bench,
                                    .name = name,
                                    .system = "stash",
                                    .value = median,
                                    .unit = "us",
                                    .latency = true,
                                    .p50_us = median,
                                    .p99_us = bench_percentile_us(ns, n, 0.99),
                                    .p999_us = bench_percentile_us(ns, n, 0.999)});
    return median;
}
