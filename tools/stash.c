/* SPDX-License-Identifier: MIT */
/*
 * stash.c: the `stash` command's entry point: finds the subcommand and runs it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tools/tools.h"
#include "include/stash.h"

typedef struct tool_cmd {
    const char *name;
    tool_main_fn *run;
    const char *summary;
} tool_cmd;

static int bench_main(int argc, char **argv);

static const tool_cmd commands[] = {
    {"serve", tool_serve, "run the persistence engine of an arena: periodic checkpoints"},
    {"checkpoint", tool_checkpoint, "take a checkpoint now and wait for it (--json)"},
    {"stop", tool_stop, "stop an arena's service"},
    {"create", tool_create, "create an arena"},
    {"status", tool_status, "show an arena's workers, memory and checkpoints (--json)"},
    {"destroy", tool_destroy, "remove an arena"},
    {"snapshot", tool_snapshot, "look into checkpoints: ls, info, verify, dump, diff"},
    {"bench", bench_main, "measure stash beside its peers (--json, --quick)"},
    {"demo", tool_demo, "run the demonstration job"},
};

static const tool_cmd benches[] = {
    {"arena", bench_arena, "allocate+free pairs per second, 1 and 2 processes, beside malloc"},
    {"io", bench_io, "write, fsync and read a 2 GiB file, io_uring and threads, beside fio"},
    {"keyed", bench_keyed, "keyed state ops/s and latency, YCSB A-F, beside LMDB, RocksDB, Redis"},
    {"checkpoint", bench_checkpoint,
     "full and incremental checkpoints, restore, pause, load, memory, beside fio"},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void usage(FILE *f, const char *title, const tool_cmd *cmds, size_t n)
{
    fprintf(f, "%s\n", title);
    for (size_t i = 0; i < n; i++) fprintf(f, "  %-10s %s\n", cmds[i].name, cmds[i].summary);
}

static const tool_cmd *find(const tool_cmd *cmds, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(cmds[i].name, name) == 0) return &cmds[i];
    return NULL;
}

static int bench_main(int argc, char **argv)
{
    static const char title[] =
        "usage: stash bench NAME [--json] [--quick] [--reps N] [--case PREFIX]\n"
        "Each figure is printed beside peers measured in the same run.\nbenches:";
    if (argc < 2 || tool_wants_help(2, argv)) {
        usage(argc < 2 ? stderr : stdout, title, benches, COUNT(benches));
        fprintf(argc < 2 ? stderr : stdout, "  %-10s %s\n", "all", "every bench above");
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "all") == 0) {
        int rc = 0;
        for (size_t i = 0; i < COUNT(benches); i++) {
            argv[1] = (char *)benches[i].name;
            rc |= benches[i].run(argc - 1, argv + 1);
        }
        return rc;
    }
    const tool_cmd *b = find(benches, COUNT(benches), argv[1]);
    if (!b) {
        fprintf(stderr, "stash bench: unknown bench '%s'\n", argv[1]);
        usage(stderr, title, benches, COUNT(benches));
        return 2;
    }
    return b->run(argc - 1, argv + 1);
}

/* argv with each "--opt=value" split into "--opt" and "value", as
 * getopt_long reads it, for every command (most parse by hand). The copy
 * and its strings live in one allocation the caller frees. */
static char **split_equals(int argc, char **argv, int *out_argc)
{
    size_t bytes = 0;
    int n = 0;
    for (int i = 0; i < argc; i++, n++) {
        bytes += strlen(argv[i]) + 1;
        if (strncmp(argv[i], "--", 2) == 0 && strchr(argv[i], '=')) n++;
    }
    char **out = malloc((size_t)(n + 1) * sizeof *out + bytes);
    if (!out) return NULL;
    char *text = (char *)(out + n + 1);
    int k = 0;
    for (int i = 0; i < argc; i++) {
        size_t len = strlen(argv[i]);
        memcpy(text, argv[i], len + 1);
        out[k++] = text;
        char *eq = strncmp(text, "--", 2) == 0 ? strchr(text, '=') : NULL;
        if (eq) {
            *eq = '\0';
            out[k++] = eq + 1;
        }
        text += len + 1;
    }
    out[k] = NULL;
    *out_argc = k;
    return out;
}

static int run(const tool_cmd *c, int argc, char **argv)
{
    int n;
    char **split = split_equals(argc, argv, &n);
    if (!split) return tool_fail("arguments", -ENOMEM);
    int rc = c->run(n, split);
    free(split);
    return rc;
}

int main(int argc, char **argv)
{
    static const char title[] = "usage: stash COMMAND [ARGS] (stash COMMAND --help for more)\n"
                                "commands:";
    if (argc < 2 || tool_wants_help(2, argv)) {
        usage(argc < 2 ? stderr : stdout, title, commands, COUNT(commands));
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("stash %s\n", stash_version());
        return 0;
    }
    const tool_cmd *c = find(commands, COUNT(commands), argv[1]);
    if (!c) {
        fprintf(stderr, "stash: unknown command '%s'\n", argv[1]);
        usage(stderr, title, commands, COUNT(commands));
        return 2;
    }
    return run(c, argc - 1, argv + 1);
}
