/* SPDX-License-Identifier: MIT */
/*
 * fuzz_load.c: `stash snapshot load` over mutated JSON lines (the first
 * byte picks the format of the bytes: text, hex or base64). Whatever the
 * lines, the load exits 0, 1 or 2; a failed one leaves nothing at the
 * destination or beside it; a savepoint it writes opens as a restore opens
 * it, verifies, shows its info, dumps as JSON lines, and those lines load
 * into a savepoint that dumps the same lines.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "include/stash.h"
#include "tests/fuzz/fuzz_tool.h"

static char dir[128], input[160], dest[160], again[160];

/* Removes a savepoint directory the target made (files, then itself). */
static void remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return;
    char sub[512];
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        if (unlink(sub) < 0) remove_tree(sub);
    }
    closedir(d);
    rmdir(path);
}

static void remove_dir(void)
{
    remove_tree(dir);
}

/* Aborts if dir holds anything but the input file. */
static void expect_nothing_written(const char *why)
{
    DIR *d = opendir(dir);
    if (!d) abort();
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, "input"))
            continue;
        fprintf(stderr, "%s left %s/%s\n", why, dir, e->d_name);
        abort();
    }
    closedir(d);
}

/* Runs `stash snapshot load to --format f` with the file at from as stdin. */
static int load(const char *from, const char *to, const char *f)
{
    if (!freopen(from, "r", stdin)) abort();
    int rc;
    free(fuzz_run_snapshot(
        &rc, 7,
        (char *[]){"snapshot", "load", (char *)to, "--format", (char *)f, "--size", "16M", NULL}));
    return rc;
}

/* The lines of text sorted, as one string (malloc'd). */
static char *sorted_lines(const char *text)
{
    size_t n = 0, len = strlen(text);
    for (const char *p = text; *p; p++) n += *p == '\n';
    char *copy = strdup(text), **lines = calloc(n + 1, sizeof *lines), *out = malloc(len + 1);
    if (!copy || !lines || !out) abort();
    size_t k = 0;
    for (char *p = copy, *end; k < n && (end = strchr(p, '\n')); p = end + 1) {
        *end = 0;
        lines[k++] = p;
    }
    qsort(lines, k, sizeof *lines, (int (*)(const void *, const void *))strcmp);
    out[0] = 0;
    for (size_t i = 0, at = 0; i < k; i++) at += (size_t)sprintf(out + at, "%s\n", lines[i]);
    free(lines);
    free(copy);
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        /* A directory of its own, made anew (another user may plant
         * anything under /tmp), and gone when the run ends. */
        snprintf(dir, sizeof dir, "/tmp/stash-fuzz-load-XXXXXX");
        if (!mkdtemp(dir)) abort();
        atexit(remove_dir);
        snprintf(input, sizeof input, "%s/input", dir);
        snprintf(dest, sizeof dest, "%s/sp", dir);
        snprintf(again, sizeof again, "%s/sp-again", dir);
    }
    if (size < 1) return 0;
    static const char *const formats[] = {"text", "hex", "base64"};
    const char *f = formats[data[0] % 3];
    FILE *in = fopen(input, "w");
    if (!in || fwrite(data + 1, 1, size - 1, in) != size - 1 || fclose(in) != 0) abort();
    remove_tree(dest);
    remove_tree(again);
    int rc = load(input, dest, f);
    if (rc < 0 || rc > 2) {
        fprintf(stderr, "load exits %d\n", rc);
        abort();
    }
    if (rc != 0) {
        expect_nothing_written("a failed load");
        return 0;
    }
    /* What load writes, every reader takes. */
    stash_snapshot *snap;
    if (stash_snapshot_open(dest, &snap) != 0) {
        fprintf(stderr, "a loaded savepoint does not open: %s\n", stash_errmsg());
        abort();
    }
    stash_snapshot_close(snap);
    int verify, info, dump;
    free(fuzz_run_snapshot(&verify, 3, (char *[]){"snapshot", "verify", dest, NULL}));
    free(fuzz_run_snapshot(&info, 3, (char *[]){"snapshot", "info", dest, NULL}));
    char *first = fuzz_run_snapshot(
        &dump, 5, (char *[]){"snapshot", "dump", dest, "--format", (char *)f, NULL});
    if (verify != 0 || info != 0 || dump != 0) {
        fprintf(stderr, "a loaded savepoint: verify exits %d, info %d, dump %d\n", verify, info,
                dump);
        abort();
    }
    /* What it dumps loads again into the same savepoint. */
    in = fopen(input, "w");
    if (!in || fputs(first, in) < 0 || fclose(in) != 0) abort();
    if ((rc = load(input, again, f)) != 0) {
        fprintf(stderr, "a dump does not load again (%d):\n%s", rc, first);
        abort();
    }
    char *second = fuzz_run_snapshot(
        &dump, 5, (char *[]){"snapshot", "dump", again, "--format", (char *)f, NULL});
    char *a = sorted_lines(first), *b = sorted_lines(second);
    if (dump != 0 || strcmp(a, b) != 0) {
        fprintf(stderr, "dump, load, dump differs:\n%s---\n%s", a, b);
        abort();
    }
    fuzz_check_json_lines(first, "dump");
    free(a);
    free(b);
    free(first);
    free(second);
    return 0;
}
