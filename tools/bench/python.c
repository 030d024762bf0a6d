/* SPDX-License-Identifier: MIT */
/*
 * python.c: `stash bench python`: stash's Python module against
 * python3-lmdb and python3-redis, measured by the module's own bench
 * (python3 -m stash.bench, with Debian's python3) and reported here as
 * every bench reports.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/bench/bench.h"

#define PYTHON "/usr/bin/python3"

/* Where the stash package lies: the build tree's python/ beside tools/, or
 * where it installs beside bin/. Returns 0 with the directory in out. */
static int package_dir(char *out, size_t cap)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n < 0) return -errno;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    const char *places[] = {"../python", "../" STASH_PYTHON_DIR};
    for (size_t i = 0; i < 2; i++) {
        char probe[4400];
        snprintf(probe, sizeof probe, "%s/%s/stash/__init__.py", self, places[i]);
        struct stat st;
        if (stat(probe, &st) == 0) {
            probe[strlen(probe) - strlen("/stash/__init__.py")] = 0;
            if (strlen(probe) >= cap) return -ENAMETOOLONG;
            memcpy(out, probe, strlen(probe) + 1);
            return 0;
        }
    }
    return -ENOENT;
}

/* Reports every system of the cases as skipped, saying why. */
static void skip_all(const bench_opts *o, const char *const *cases, size_t n, const char *why)
{
    static const char *const systems[] = {"stash", "python3-lmdb", "python3-redis"};
    for (size_t i = 0; i < n; i++)
        for (size_t s = 0; s < 3; s++)
            bench_report(o, &(bench_result){.bench = "python",
                                            .name = cases[i],
                                            .system = systems[s],
                                            .unit = "ops/s",
                                            .skipped = why});
}

int bench_python(int argc, char **argv)
{
    static const char usage[] =
        "Value reads and writes from Python through stash's module: one key a call\n"
        "(value-read/one, value-write/one: ValueState.read and .write) and 32 keys a call\n"
        "(value-read/batch32, value-write/batch32: .read_many and .write_many), 200K\n"
        "arbitrary 8-byte keys (--quick: 10K) in a random order, 100-byte values, beside\n"
        "python3-lmdb (a transaction a call; writemap, no sync, in /dev/shm) and\n"
        "python3-redis (GET and SET, MGET and MSET, over a Unix socket) in the same run,\n"
        "with Debian's python3: every read checked, the systems interleaved in a new\n"
        "order each repetition; ratios stash/peer with their spread. Each figure the\n"
        "median of --reps.\n";
    static const char *const cases[] = {"value-read/one", "value-write/one", "value-read/batch32",
                                        "value-write/batch32"};
    bench_opts o;
    int rc = bench_parse(argc, argv, usage, &o);
    if (rc) return rc < 0 ? 2 : 0;
    if (bench_heap_only(&o, "python") < 0) return 2;
    if (bench_check_case(&o, "python", cases, sizeof cases / sizeof cases[0]) < 0) return 2;
    bench_header(&o, "python", "%s keys of 8 bytes, 100-byte values, with %s",
                 o.quick ? "10K" : "200K", PYTHON);
    char dir[4096];
#ifdef __SANITIZE_ADDRESS__
    skip_all(&o, cases, 4, "a sanitizer build: python3 cannot load its libstash");
    return 0;
#endif
    if (access(PYTHON, X_OK) < 0) {
        skip_all(&o, cases, 4, "python3 not installed");
        return 0;
    }
    if (package_dir(dir, sizeof dir) < 0) {
        skip_all(&o, cases, 4, "the stash Python package is not beside this program");
        return 0;
    }
    char cmd[4600];
    snprintf(cmd, sizeof cmd, "PYTHONPATH='%s' %s -m stash.bench --reps %d%s%s", dir, PYTHON,
             o.reps, o.quick ? " --quick" : "", o.progress ? "" : " 2>/dev/null");
    FILE *p = popen(cmd, "r");
    if (!p) return tool_fail("bench python: python3", -errno);
    char line[1024];
    int rows = 0;
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = 0;
        /* case, system, value, unit, lowest, highest, or why it was skipped */
        char *f[6] = {0};
        char *save = NULL, *s = line;
        for (int i = 0; i < 6 && (f[i] = strtok_r(s, "\t", &save)); i++) s = NULL;
        if (!f[3]) continue;
        bool skipped = f[4] && !f[5];
        bench_result r = {.bench = "python",
                          .name = f[0],
                          .system = f[1],
                          .value = strtod(f[2], NULL),
                          .unit = f[3],
                          .min = f[5] ? strtod(f[4], NULL) : 0,
                          .max = f[5] ? strtod(f[5], NULL) : 0,
                          .skipped = skipped ? f[4] : NULL};
        bench_report(&o, &r);
        rows++;
    }
    int st = pclose(p);
    if (rows == 0 || st != 0) {
        fprintf(stderr, "stash bench python: %s -m stash.bench failed (exit status %d)\n", PYTHON,
                WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        return 1;
    }
    return 0;
}
