/* SPDX-License-Identifier: MIT */
/*
 * plot.c: `stash bench ... --plot DIR`: the data of a run's figures as files
 * in DIR (throughput over time with a checkpoint's start and end, latency
 * CDFs, bandwidths beside fio), drawn as PNGs by gnuplot once the benches
 * have run.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/bench/bench.h"

#define MAX_PLOTS 256
#define MAX_LINES 16
#define CDF_POINTS 400

/* One picture: lines (series or CDFs) or bars, each from a data file. */
typedef struct plot {
    char name[96]; /* the PNG's base name */
    char title[160];
    int kind; /* PLOT_SERIES, PLOT_CDF, PLOT_BARS */
    int nlines;
    char system[MAX_LINES][48];
    char data[MAX_LINES][160]; /* lines' data files, relative to DIR (bars: none) */
    double mark[MAX_LINES][2]; /* series: a checkpoint's start and end (s), < 0 none */
    double bar[MAX_LINES];     /* bars: the value */
    char unit[24];
} plot;

enum { PLOT_SERIES, PLOT_CDF, PLOT_BARS };

static struct {
    const char *dir;
    plot plots[MAX_PLOTS];
    int n;
} P;

int bench_plot_dir(const char *dir)
{
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) return -errno;
    struct stat st;
    if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) return -ENOTDIR;
    P.dir = dir;
    return 0;
}

/* s's characters fit for a file name: '/' and others become '-'. */
static void file_name(char *out, size_t cap, const char *s)
{
    size_t i = 0;
    for (; s[i] && i + 1 < cap; i++) {
        char c = s[i];
        out[i] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                         c == '.' || c == '_'
                     ? c
                     : '-';
    }
    out[i] = 0;
}

/* The picture called name (found or added), or NULL if there is no room. */
static plot *plot_of(const char *name, const char *title, int kind, const char *unit)
{
    char base[96];
    file_name(base, sizeof base, name);
    for (int i = 0; i < P.n; i++)
        if (strcmp(P.plots[i].name, base) == 0) return &P.plots[i];
    if (P.n == MAX_PLOTS) return NULL;
    plot *p = &P.plots[P.n++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", base);
    snprintf(p->title, sizeof p->title, "%s", title);
    snprintf(p->unit, sizeof p->unit, "%s", unit ? unit : "");
    p->kind = kind;
    return p;
}

/* Adds a line of system to p with its data file DIR/p-system.dat opened. */
static FILE *line_of(plot *p, const char *system)
{
    if (!p || p->nlines == MAX_LINES) return NULL;
    int i = p->nlines;
    char sys[48], path[512];
    file_name(sys, sizeof sys, system);
    snprintf(p->system[i], sizeof p->system[i], "%s", system);
    char base[96];
    memcpy(base, p->name, sizeof base);
    snprintf(p->data[i], sizeof p->data[i], "%s-%s.dat", base, sys);
    snprintf(path, sizeof path, "%s/%s", P.dir, p->data[i]);
    FILE *f = fopen(path, "w");
    if (f)
        p->nlines++;
    else
        fprintf(stderr, "stash bench: --plot: %s: %s\n", path, strerror(errno));
    return f;
}

bool bench_plotting(void)
{
    return P.dir != NULL;
}

void bench_series_sample(bench_series *s, uint64_t now_ns, uint64_t ops)
{
    if (s->n == BENCH_SERIES_MAX) return;
    s->t_ns[s->n] = now_ns;
    s->ops[s->n++] = ops;
}

void bench_plot_series(const char *name, const char *system, const bench_series *s)
{
    if (!P.dir || s->n < 2) return;
    char title[160];
    snprintf(title, sizeof title, "%s: throughput over time", name);
    plot *p = plot_of(name, title, PLOT_SERIES, "ops/s");
    FILE *f = line_of(p, system);
    if (!f) return;
    int i = p->nlines - 1;
    double t0 = (double)s->t_ns[0];
    p->mark[i][0] = s->mark_ns[0] ? ((double)s->mark_ns[0] - t0) / 1e9 : -1;
    p->mark[i][1] = s->mark_ns[1] ? ((double)s->mark_ns[1] - t0) / 1e9 : -1;
    fprintf(f, "# seconds ops/s (%s, %s)\n", name, system);
    for (uint32_t j = 1; j < s->n; j++) {
        double dt = (double)(s->t_ns[j] - s->t_ns[j - 1]) / 1e9;
        if (dt > 0)
            fprintf(f, "%.4f %.0f\n", ((double)s->t_ns[j] - t0) / 1e9,
                    (double)(s->ops[j] - s->ops[j - 1]) / dt);
    }
    fclose(f);
}

void bench_plot_cdf(const char *bench, const char *name, const char *system, const uint64_t *ns,
                    uint64_t n)
{
    if (!P.dir || n == 0) return;
    char pname[96], title[160];
    snprintf(pname, sizeof pname, "%s-%s-latency", bench, name);
    snprintf(title, sizeof title, "%s %s: latency CDF", bench, name);
    FILE *f = line_of(plot_of(pname, title, PLOT_CDF, "us"), system);
    if (!f) return;
    fprintf(f, "# microseconds fraction (sorted samples: %llu)\n", (unsigned long long)n);
    /* Evenly spaced in fraction, and denser in the tail: p99 to p100. */
    for (int k = 0; k <= CDF_POINTS; k++) {
        double q = k < CDF_POINTS / 2 ? 0.99 * k / (CDF_POINTS / 2)
                                      : 0.99 + 0.01 * (k - CDF_POINTS / 2) / (CDF_POINTS / 2);
        uint64_t i = (uint64_t)(q * (double)(n - 1));
        fprintf(f, "%.3f %.6f\n", (double)ns[i] / 1e3, q);
    }
    fclose(f);
}

void bench_plot_bar(const char *name, const char *system, double value, const char *unit)
{
    if (!P.dir) return;
    plot *p = plot_of(name, name, PLOT_BARS, unit);
    if (!p || p->nlines == MAX_LINES) return;
    snprintf(p->system[p->nlines], sizeof p->system[0], "%s", system);
    p->bar[p->nlines++] = value;
}

/* Writes the gnuplot script of p into f. */
static void script_of(FILE *f, const plot *p)
{
    fprintf(f, "set terminal png size 1000,600\nset output '%s.png'\nset title \"%s\" noenhanced\n",
            p->name, p->title);
    fprintf(f, "set grid\nset key outside bottom center horizontal noenhanced\n");
    if (p->kind == PLOT_CDF) {
        fprintf(f, "set logscale x\nset xlabel 'latency (us, log scale)'\nset ylabel 'fraction'\n"
                   "set yrange [0:1]\nplot ");
        for (int i = 0; i < p->nlines; i++)
            fprintf(f, "%s'%s' using 1:2 with lines lw 2 title '%s'", i ? ", " : "", p->data[i],
                    p->system[i]);
        fprintf(f, "\n");
    } else if (p->kind == PLOT_SERIES) {
        /* A panel per system: their scales differ by orders of magnitude. */
        fprintf(f, "set multiplot layout %d,1\nset xlabel 'seconds'\nset ylabel 'ops/s'\n",
                p->nlines);
        for (int i = 0; i < p->nlines; i++) {
            fprintf(f, "unset arrow\nunset label\nset title '%s' noenhanced\n", p->system[i]);
            for (int m = 0; m < 2; m++)
                if (p->mark[i][m] >= 0)
                    fprintf(f,
                            "set arrow from %.4f, graph 0 to %.4f, graph 1 nohead lc rgb 'red'\n"
                            "set label '%s' at %.4f, graph 0.95 %s textcolor rgb 'red'\n",
                            p->mark[i][m], p->mark[i][m], m ? "end" : "start", p->mark[i][m],
                            m ? "left" : "right");
            fprintf(f, "plot '%s' using 1:2 with lines lw 1 title '%s'\n", p->data[i],
                    p->system[i]);
        }
        fprintf(f, "unset multiplot\n");
    } else {
        fprintf(f,
                "set style fill solid 0.6\nset boxwidth 0.6\nset yrange [0:*]\n"
                "set ylabel '%s'\nset xtics rotate by -20 noenhanced\nplot '-' using 0:2:xtic(1) "
                "with boxes notitle\n",
                p->unit);
        for (int i = 0; i < p->nlines; i++) fprintf(f, "\"%s\" %g\n", p->system[i], p->bar[i]);
        fprintf(f, "e\n");
    }
}

int bench_plot_draw(void)
{
    if (!P.dir || P.n == 0) return 0;
    char path[512];
    snprintf(path, sizeof path, "%s/plots.gp", P.dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "stash bench: --plot: %s: %s\n", path, strerror(errno));
        return 1;
    }
    for (int i = 0; i < P.n; i++) {
        script_of(f, &P.plots[i]);
        fprintf(f, "reset\n");
    }
    fclose(f);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (chdir(P.dir) < 0) _exit(126);
        execlp("gnuplot", "gnuplot", "plots.gp", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0) status = -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
        fprintf(stderr,
                "stash bench: --plot: gnuplot is not installed (apt-get install "
                "gnuplot-nox); the data and %s are in %s\n",
                "plots.gp", P.dir);
        return 1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "stash bench: --plot: gnuplot failed on %s\n", path);
        return 1;
    }
    fprintf(stderr, "stash bench: %d plots in %s\n", P.n, P.dir);
    return 0;
}
