/* SPDX-License-Identifier: MIT */
/*
 * main.c: the `stash` command's entry point: finds the subcommand and runs it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    {"get", tool_get, "read one key's entry of a state (--json)"},
    {"scan", tool_scan, "list a state's keys and entries (--json)"},
    {"snapshot", tool_snapshot,
     "checkpoints and savepoints: ls, info, verify, dump, diff, load, rewrite"},
    {"bench", bench_main, "measure stash beside its peers (--json, --quick)"},
    {"demo", tool_demo, "run the demonstration job"},
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

/* `stash bench`: the benchmark program beside this binary, stash-bench,
 * which alone links the peers it measures stash against. */
static int bench_main(int argc, char **argv)
{
    (void)argc; /* argv ends with NULL, as execv wants */
    char self[4096], path[4200];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n < 0) return tool_fail("bench: where this binary is", -errno);
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    snprintf(path, sizeof path, "%s/stash-bench", self);
    argv[0] = path;
    execv(path, argv);
    fprintf(stderr, "stash bench: cannot run %s: %s (it is built and installed with stash)\n", path,
            strerror(errno));
    return 2;
}

static int run(const tool_cmd *c, int argc, char **argv)
{
    if (c->run != bench_main && !tool_wants_help(argc, argv) && tool_version(argc, argv)) return 0;
    int n;
    char **split = tool_split_equals(argc, argv, &n);
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
    if (tool_version(2, argv)) return 0;
    const tool_cmd *c = find(commands, COUNT(commands), argv[1]);
    if (!c) {
        fprintf(stderr, "stash: unknown command '%s' (stash --help lists them)\n", argv[1]);
        return 2;
    }
    return run(c, argc - 1, argv + 1);
}
