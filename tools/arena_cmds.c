/* SPDX-License-Identifier: MIT */
/*
 * arena_cmds.c: `stash create`, `stash status` and `stash destroy`: an
 * arena's life from the command line.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "include/stash.h"
#include "tools/tools.h"

/* Parses NAME and the options the arena commands share; returns 0, or the
 * exit code to return. */
typedef struct arena_args {
    const char *name;
    stash_arena_opts opts;
    bool json;
    bool prom;
    bool per_kg;
} arena_args;

static int parse_arena_args(int argc, char **argv, const char *usage, bool creating,
                            arena_args *out)
{
    *out = (arena_args){.opts.sz = sizeof(stash_arena_opts)};
    if (tool_wants_help(argc, argv)) {
        fputs(usage, stdout);
        return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n;
        if (strcmp(a, "--path") == 0 && val) {
            out->opts.path = val;
            i++;
        } else if (creating && strcmp(a, "--size") == 0 && val) {
            if (tool_parse_size(val, &n) < 0) goto bad_value;
            out->opts.size = n;
            i++;
        } else if (creating && strcmp(a, "--max-parallelism") == 0 && val) {
            if (tool_parse_size(val, &n) < 0 || n == 0 || n > STASH_MAX_MAX_PARALLELISM)
                goto bad_value;
            out->opts.max_parallelism = (uint32_t)n;
            i++;
        } else if (creating && strcmp(a, "--backend") == 0 && val) {
            if (strcmp(val, "heap") != 0 && strcmp(val, "lmdb") != 0) goto bad_value;
            out->opts.backend = strcmp(val, "lmdb") == 0 ? STASH_BACKEND_LMDB : STASH_BACKEND_HEAP;
            i++;
        } else if (creating && strcmp(a, "--lmdb-dir") == 0 && val) {
            out->opts.lmdb_dir = val;
            i++;
        } else if (creating && strcmp(a, "--group") == 0) {
            out->opts.flags |= STASH_ARENA_GROUP;
        } else if (creating && strcmp(a, "--replace") == 0) {
            out->opts.flags |= STASH_ARENA_REPLACE;
        } else if (!creating && strcmp(a, "--json") == 0) {
            out->json = true;
        } else if (!creating && strcmp(a, "--prom") == 0) {
            out->prom = true;
        } else if (!creating && strcmp(a, "--per-key-group") == 0) {
            out->per_kg = true;
        } else if (a[0] != '-' && !out->name) {
            out->name = a;
        } else {
            fprintf(stderr, "stash %s: unknown or incomplete argument '%s'\n%s", argv[0], a, usage);
            return 2;
        }
        continue;
    bad_value:
        fprintf(stderr, "stash %s: bad value '%s' for %s\n%s", argv[0], val, a, usage);
        return 2;
    }
    if (!out->name) {
        fprintf(stderr, "stash %s: missing arena NAME\n%s", argv[0], usage);
        return 2;
    }
    return 0;
}

int tool_create(int argc, char **argv)
{
    static const char usage[] =
        "usage: stash create NAME [--size SIZE] [--max-parallelism N] [--path FILE] [--group]\n"
        "                         [--backend heap|lmdb] [--lmdb-dir DIR] [--replace]\n"
        "Creates the arena NAME (/dev/shm/stash.NAME unless --path): SIZE bytes (64M),\n"
        "N key groups (128, at most 32768), mode 0600 (0660 with --group). Keyed state\n"
        "lives in the arena (heap) or in an LMDB environment per key group in DIR\n"
        "(lmdb; /var/lib/stash/NAME.lmdb for root, /var/tmp/stash-UID/NAME.lmdb for\n"
        "other users by default), made if missing, emptied if it held any: a directory\n"
        "of this user's that no other user may write, reached through directories of\n"
        "root's or this user's (with the sticky bit where others may write); one holding\n"
        "another existing arena's environments is refused. The arena is named once\n"
        "whole, never over a file there (--replace: over an arena of this user's).\n";
    arena_args args;
    int rc = parse_arena_args(argc, argv, usage, true, &args);
    if (rc) return rc < 0 ? 0 : rc;
    stash_arena *a;
    rc = stash_arena_create(args.name, &args.opts, &a);
    if (rc < 0) return tool_fail("create", rc);
    stash_arena_info info;
    stash_arena_info_get(a, &info);
    printf("created %s: %llu bytes, %u key groups, page %u bytes%s, keyed state in %s%s\n",
           info.path, (unsigned long long)info.size, info.max_parallelism, info.page_size,
           info.huge_pages == 1 ? ", hugetlbfs" : "",
           info.backend == STASH_BACKEND_LMDB ? "lmdb at " : "the arena",
           info.backend == STASH_BACKEND_LMDB ? info.lmdb_dir : "");
    stash_arena_close(a);
    return 0;
}

int tool_destroy(int argc, char **argv)
{
    static const char usage[] =
        "usage: stash destroy NAME [--path FILE]\n"
        "Removes the arena NAME: a file of this user's with an arena's header, never a\n"
        "symbolic link or another user's file; for lmdb, with the directory of its\n"
        "environments if that directory's mark names this arena. Processes that map it\n"
        "keep their mapping until they close it.\n";
    arena_args args;
    int rc = parse_arena_args(argc, argv, usage, false, &args);
    if (rc) return rc < 0 ? 0 : rc;
    rc = stash_arena_destroy(args.name, &args.opts);
    if (rc < 0) return tool_fail("destroy", rc);
    return 0;
}

static const char *state_name(int state)
{
    return state == STASH_WORKER_LIVE ? "live" : state == STASH_WORKER_DEAD ? "dead" : "free";
}

static void print_status_json(stash_arena *a, const stash_arena_info *info,
                              const stash_worker_info *w, size_t nw)
{
    printf("{\"path\": ");
    tool_json_string(info->path);
    printf(", \"layout_version\": %u, \"size\": %llu, \"page_size\": %u, "
           "\"max_parallelism\": %u, \"data_bytes\": %llu, \"pool_free_bytes\": %llu, "
           "\"huge_pages\": %d, \"creator_pid\": %d, \"created_ns\": %llu, \"backend\": \"%s\", "
           "\"lmdb_dir\": ",
           info->layout_version, (unsigned long long)info->size, info->page_size,
           info->max_parallelism, (unsigned long long)info->data_bytes,
           (unsigned long long)info->pool_free_bytes, info->huge_pages, info->creator_pid,
           (unsigned long long)info->created_ns,
           info->backend == STASH_BACKEND_LMDB ? "lmdb" : "heap");
    tool_json_string(info->lmdb_dir);
    printf(", \"workers\": [");
    for (size_t i = 0; i < nw; i++)
        printf("%s{\"index\": %u, \"parallelism\": %u, \"pid\": %d, \"state\": \"%s\", "
               "\"key_groups\": [%u, %u], \"generation\": %u, \"previous_pid\": %d, "
               "\"heartbeat_ns\": %llu}",
               i ? ", " : "", w[i].index, w[i].parallelism, w[i].pid, state_name(w[i].state),
               w[i].range.first, w[i].range.last, w[i].generation, w[i].previous_pid,
               (unsigned long long)w[i].heartbeat_ns);
    stash_service_info sv;
    stash_service_info_get(a, &sv);
    printf("], \"service\": {\"pid\": %d, \"since_ns\": %llu, \"dir\": ", sv.pid,
           (unsigned long long)sv.since_ns);
    tool_json_string(sv.dir);
    printf(", \"pending\": %llu, \"completed\": %llu, \"failing\": %u, \"next_ns\": %llu, "
           "\"completed_total\": %llu, \"failed_total\": %llu, \"restored_id\": %llu, "
           "\"restored_ns\": %llu, \"restored_records\": %llu, \"io_backend\": \"%s\", "
           "\"io_bytes_written\": %llu, \"io_bytes_read\": %llu, \"io_errors\": %llu, "
           "\"recent\": [",
           (unsigned long long)sv.pending, (unsigned long long)sv.completed, sv.failing,
           (unsigned long long)sv.next_ns, (unsigned long long)sv.completed_total,
           (unsigned long long)sv.failed_total, (unsigned long long)sv.restored_id,
           (unsigned long long)sv.restored_ns, (unsigned long long)sv.restored_records,
           sv.io_backend, (unsigned long long)sv.io_bytes_written,
           (unsigned long long)sv.io_bytes_read, (unsigned long long)sv.io_errors);
    for (uint32_t i = 0; i < sv.nrecent; i++) {
        const stash_checkpoint_info *c = &sv.recent[i];
        printf("%s{\"id\": %llu, \"status\": %d, \"savepoint\": %s, \"incremental\": %s, "
               "\"started_ns\": %llu, "
               "\"duration_ns\": %llu, \"bytes\": %llu, \"pause_ns\": %llu, \"detail\": ",
               i ? ", " : "", (unsigned long long)c->id, c->status, c->savepoint ? "true" : "false",
               c->incremental ? "true" : "false", (unsigned long long)c->started_ns,
               (unsigned long long)c->duration_ns, (unsigned long long)c->bytes,
               (unsigned long long)c->pause_ns);
        tool_json_string(c->detail);
        putchar('}');
    }
    printf("]}, \"key_groups\": [");
    for (uint32_t kg = 0; kg < info->max_parallelism; kg++) {
        stash_kg_usage u;
        stash_kg_usage_get(a, kg, &u);
        printf("%s{\"used_bytes\": %llu, \"free_bytes\": %llu}", kg ? ", " : "",
               (unsigned long long)u.used_bytes, (unsigned long long)u.free_bytes);
    }
    printf("]}\n");
}

static void print_status_text(stash_arena *a, const stash_arena_info *info,
                              const stash_worker_info *w, size_t nw)
{
    time_t t = (time_t)(info->created_ns / 1000000000ull);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
    printf("arena %s: layout %u, %llu bytes, page %u bytes%s\n", info->path, info->layout_version,
           (unsigned long long)info->size, info->page_size,
           info->huge_pages == 1   ? " (hugetlbfs)"
           : info->huge_pages == 2 ? " (transparent huge pages advised)"
                                   : "");
    printf("created %s by pid %d; %u key groups; %llu of %llu data bytes not yet in a key "
           "group\n",
           when, info->creator_pid, info->max_parallelism,
           (unsigned long long)info->pool_free_bytes, (unsigned long long)info->data_bytes);
    if (info->backend == STASH_BACKEND_LMDB)
        printf("keyed state: lmdb, an environment per key group in %s\n", info->lmdb_dir);
    printf("workers: %zu\n", nw);
    if (nw)
        printf("  %5s %5s %8s %5s %12s %4s %8s %12s\n", "index", "of", "pid", "state", "key groups",
               "gen", "took from", "last seen");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    for (size_t i = 0; i < nw; i++) {
        /* A barrier is a sign of life: a worker stuck between barriers ages. */
        double ago = now > w[i].heartbeat_ns ? (double)(now - w[i].heartbeat_ns) / 1e9 : 0;
        printf("  %5u %5u %8d %5s %5u..%-6u %4u %8d %9.1fs ago\n", w[i].index, w[i].parallelism,
               w[i].pid, state_name(w[i].state), w[i].range.first, w[i].range.last, w[i].generation,
               w[i].previous_pid, ago);
    }
    uint64_t used = 0, fr = 0;
    uint32_t busy = 0;
    for (uint32_t kg = 0; kg < info->max_parallelism; kg++) {
        stash_kg_usage u;
        stash_kg_usage_get(a, kg, &u);
        used += u.used_bytes;
        fr += u.free_bytes;
        busy += u.used_bytes > 0;
    }
    printf("memory: %llu bytes used, %llu free in key-group heaps; %u key groups hold data\n",
           (unsigned long long)used, (unsigned long long)fr, busy);
    stash_service_info sv;
    stash_service_info_get(a, &sv);
    if (sv.pid)
        printf("service: pid %d, checkpoints in %s, newest complete %llu%s\n", sv.pid, sv.dir,
               (unsigned long long)sv.completed, sv.pending ? " (one being cut)" : "");
    else
        printf("service: none running\n");
    if (sv.pid && sv.failing)
        printf("  %u checkpoints failed in a row%s; the next of the interval in %.1f s\n",
               sv.failing, sv.failing >= 3 ? ": backing off" : "",
               sv.next_ns > now ? (double)(sv.next_ns - now) / 1e9 : 0.0);
    for (uint32_t i = 0; i < sv.nrecent; i++) {
        const stash_checkpoint_info *c = &sv.recent[i];
        printf("  %s %llu %s: %.1f ms, %llu bytes%s, longest cut %.1f us: %s\n",
               c->savepoint ? "savepoint" : "checkpoint", (unsigned long long)c->id,
               c->status ? "failed" : "complete", (double)c->duration_ns / 1e6,
               (unsigned long long)c->bytes, c->incremental ? " (incremental)" : "",
               (double)c->pause_ns / 1e3, c->detail);
    }
}

int tool_status(int argc, char **argv)
{
    static const char usage[] =
        "usage: stash status NAME [--path FILE] [--json | --prom [--per-key-group]]\n"
        "Shows the arena's header, its workers, memory per key group,\n"
        "its service and its recent checkpoints. --prom prints them as metrics in\n"
        "Prometheus' text format, once (for node_exporter's textfile collector), the\n"
        "text `stash serve --metrics` serves; --per-key-group adds each key group's bytes.\n";
    arena_args args;
    int rc = parse_arena_args(argc, argv, usage, false, &args);
    if (rc) return rc < 0 ? 0 : rc;
    if (args.json && args.prom) {
        fprintf(stderr, "stash status: --json and --prom exclude each other\n%s", usage);
        return 2;
    }
    stash_arena *a;
    rc = stash_arena_open(args.name, &args.opts, &a);
    if (rc < 0) return tool_fail("status", rc);
    stash_arena_info info;
    stash_arena_info_get(a, &info);
    stash_worker_info *w = calloc(STASH_MAX_WORKERS, sizeof *w);
    size_t nw = 0;
    if (!w) {
        stash_arena_close(a);
        return tool_fail("status", -ENOMEM);
    }
    stash_registry_list(a, w, STASH_MAX_WORKERS, &nw);
    if (args.json)
        print_status_json(a, &info, w, nw);
    else if (args.prom)
        rc = tool_metrics(stdout, a, args.per_kg) < 0 ? tool_fail("status", -ENOMEM) : 0;
    else
        print_status_text(a, &info, w, nw);
    free(w);
    stash_arena_close(a);
    return rc;
}
