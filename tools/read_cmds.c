/* SPDX-License-Identifier: MIT */
/*
 * read_cmds.c: `stash get` and `stash scan`: keyed state read from the
 * command line through a reader, which never blocks the workers or a
 * checkpoint: of the live arena, as of its newest complete checkpoint, or
 * of a checkpoint directory.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "include/stash.h"
#include "tools/tools.h"

typedef struct read_args {
    const char *name;
    const char *state;
    const char *key;
    const char *ns;
    const char *map_key;
    const char *checkpoint;
    stash_arena_opts arena;
    bool has_arena;
    bool at_checkpoint;
    bool json;
    tool_format format;
    bool has_kg;
    uint32_t kg;
} read_args;

/* Parses the options get and scan share (scan: --key-group, get: --key and
 * --map-key); returns 0, -1 after --help, or the exit code 2. */
static int parse_read_args(int argc, char **argv, const char *usage, bool scan, read_args *out)
{
    *out = (read_args){.arena.sz = sizeof(stash_arena_opts)};
    if (tool_wants_help(argc, argv)) {
        fputs(usage, stdout);
        return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        const char **text = strcmp(a, "--state") == 0              ? &out->state
                            : !scan && strcmp(a, "--key") == 0     ? &out->key
                            : strcmp(a, "--ns") == 0               ? &out->ns
                            : !scan && strcmp(a, "--map-key") == 0 ? &out->map_key
                            : strcmp(a, "--checkpoint") == 0       ? &out->checkpoint
                            : strcmp(a, "--path") == 0             ? &out->arena.path
                                                                   : NULL;
        if (text && val) {
            *text = val;
            out->has_arena |= text == &out->arena.path;
            i++;
        } else if (strcmp(a, "--format") == 0 && val) {
            if (tool_parse_format(val, &out->format) < 0) goto bad_value;
            i++;
        } else if (scan && strcmp(a, "--key-group") == 0 && val) {
            uint64_t n;
            if (tool_parse_size(val, &n) < 0 || n >= STASH_MAX_MAX_PARALLELISM) goto bad_value;
            out->has_kg = true;
            out->kg = (uint32_t)n;
            i++;
        } else if (strcmp(a, "--at-checkpoint") == 0) {
            out->at_checkpoint = true;
        } else if (strcmp(a, "--json") == 0) {
            out->json = true;
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
    const char *missing = !out->name && !out->checkpoint ? "arena NAME (or --checkpoint DIR)"
                          : !out->state                  ? "--state"
                          : !scan && !out->key           ? "--key"
                                                         : NULL;
    if (missing) {
        fprintf(stderr, "stash %s: missing %s\n%s", argv[0], missing, usage);
        return 2;
    }
    if (out->checkpoint && out->at_checkpoint) {
        fprintf(stderr, "stash %s: --checkpoint and --at-checkpoint exclude each other\n%s",
                argv[0], usage);
        return 2;
    }
    return 0;
}

/* The functions of states the reader did not register: reads never call
 * reduce or add; an aggregating state shows its accumulator. */
static int not_here(const stash_bytes *acc, const stash_bytes *in, void *out, size_t cap,
                    size_t *len, void *ctx)
{
    (void)acc, (void)in, (void)out, (void)cap, (void)len, (void)ctx;
    return -ENOTSUP;
}

static int no_create(const stash_bytes *acc, void *out, size_t cap, size_t *len, void *ctx)
{
    (void)acc, (void)out, (void)cap, (void)len, (void)ctx;
    return -ENOTSUP;
}

static int accumulator(const stash_bytes *acc, void *out, size_t cap, size_t *len, void *ctx)
{
    (void)ctx;
    *len = acc->len;
    if (cap < acc->len) return -ENOSPC;
    if (acc->len) memcpy(out, acc->data, acc->len);
    return 0;
}

static const stash_aggregate_fns shown_as_accumulator = {
    .sz = sizeof(stash_aggregate_fns), no_create, not_here, accumulator, NULL};

static const char *kind_name(stash_kind k)
{
    switch (k) {
    case STASH_VALUE:
        return "value";
    case STASH_LIST:
        return "list";
    case STASH_MAP:
        return "map";
    case STASH_REDUCING:
        return "reducing";
    case STASH_AGGREGATING:
        return "aggregating";
    default:
        return "other";
    }
}

/* A reader as the arguments ask, and its handle on the state. Returns 0,
 * or the exit code after saying why not. */
static int open_state(const read_args *a, const char *cmd, stash_worker **r, stash_state **s,
                      stash_kind *kind)
{
    stash_reader_opts o = {.sz = sizeof(stash_reader_opts),
                           .arena = a->has_arena ? &a->arena : NULL,
                           .at_checkpoint = a->at_checkpoint,
                           .checkpoint_dir = a->checkpoint};
    int rc = stash_reader_open(a->name, &o, r);
    if (rc) return tool_fail(cmd, rc) + 1;
    stash_state_desc d;
    rc = stash_state_describe(stash_worker_arena(*r), a->state, &d);
    if (rc == 0 && (d.kind < STASH_VALUE || d.kind > STASH_AGGREGATING)) {
        fprintf(stderr, "stash %s: state '%s' is %s, not keyed state\n", cmd, a->state,
                d.kind == STASH_TIMERS ? "a timer service" : "operator state");
        stash_worker_close(*r);
        return 2;
    }
    if (rc == 0) {
        d.reduce = not_here;
        d.aggregate = &shown_as_accumulator;
        rc = stash_state_get(*r, &d, s);
    }
    if (rc) {
        stash_worker_close(*r);
        return tool_fail(cmd, rc) + 1;
    }
    *kind = d.kind;
    return 0;
}

/* Decodes the argument of option opt in format f; says why not. */
static int decode_arg(const char *cmd, const char *opt, const char *arg, tool_format f,
                      uint8_t **out, size_t *len)
{
    int rc = tool_decode(arg, f, out, len);
    if (rc)
        fprintf(stderr, "stash %s: %s '%s' is not %s\n", cmd, opt, arg,
                f == TOOL_HEX ? "hex" : "base64");
    return rc;
}

static void field(const char *name, const void *p, size_t n, const read_args *a)
{
    printf(",\"%s\":", name);
    tool_print_bytes(p, n, a->format, true);
}

/* Prints the current key's entry of s (its key and namespace first, for a
 * scan's line): returns 1 if printed, 0 if it has none, or an error. */
static int print_entry(stash_state *s, stash_kind kind, const read_args *a, stash_bytes map_key,
                       bool scan, const stash_bytes *key, const stash_bytes *ns)
{
    stash_bytes v, mk;
    stash_iter it;
    int rc;
    bool many = false;
    if (kind == STASH_LIST) {
        rc = stash_list_get(s, &it);
        many = true;
    } else if (kind == STASH_MAP && !a->map_key) {
        rc = stash_map_iter(s, &it);
        many = true;
    } else if (kind == STASH_MAP) {
        rc = stash_map_get(s, map_key.data, map_key.len, &v);
    } else if (kind == STASH_VALUE) {
        rc = stash_value_get(s, &v);
    } else {
        rc = stash_merging_get(s, &v);
    }
    if (rc == STASH_ENOTFOUND) return 0;
    if (rc) return rc;
    if (a->json) {
        printf("{\"state\":");
        tool_json_string(a->state);
        printf(",\"kind\":\"%s\"", kind_name(kind));
        field("key", key->data, key->len, a);
        field("namespace", ns->data, ns->len, a);
    } else if (scan) {
        tool_print_bytes(key->data, key->len, a->format, false);
        putchar('\t');
        tool_print_bytes(ns->data, ns->len, a->format, false);
        putchar('\t');
    }
    if (!many) {
        if (a->json) {
            field("value", v.data, v.len, a);
        } else {
            tool_print_bytes(v.data, v.len, a->format, false);
        }
    } else {
        /* Elements, or entries as map key then value; a get without --json
         * gives each its own line. */
        bool map = kind == STASH_MAP;
        if (a->json) printf(",\"%s\":[", map ? "entries" : "elements");
        const char *between = a->json ? "," : scan ? "\t" : "\n";
        int n = 0;
        while ((rc = stash_iter_next(&it, &mk, &v)) == 1) {
            if (n++) fputs(between, stdout);
            if (map && a->json) {
                printf("{\"map_key\":");
                tool_print_bytes(mk.data, mk.len, a->format, true);
                printf(",\"value\":");
            } else if (map) {
                tool_print_bytes(mk.data, mk.len, a->format, false);
                putchar('\t');
            }
            tool_print_bytes(v.data, v.len, a->format, a->json);
            if (map && a->json) putchar('}');
        }
        if (rc < 0) return rc;
        if (a->json) putchar(']');
    }
    if (a->json) putchar('}');
    putchar('\n');
    return 1;
}

int tool_get(int argc, char **argv)
{
    static const char usage[] =
        "usage: stash get NAME --state S --key K [--ns N] [--map-key M]\n"
        "                      [--format text|hex|base64] [--json] [--path FILE]\n"
        "                      [--at-checkpoint | --checkpoint DIR]\n"
        "Reads the entry of key K (in namespace N, the empty one by default) of the\n"
        "keyed state S through a reader, which never blocks a worker or a checkpoint:\n"
        "a value state's value, a list's elements one a line, a map's entries one a\n"
        "line (map key, a tab, value) or with --map-key the value of one, a reducing\n"
        "state's value, an aggregating state's accumulator (its result function is\n"
        "the worker's). Keys, namespaces and values are given and shown as text\n"
        "(control bytes and backslashes shown escaped), hex or base64 (--format).\n"
        "--at-checkpoint reads as of the arena's newest complete checkpoint;\n"
        "--checkpoint DIR reads a checkpoint or savepoint directory, with no arena\n"
        "(NAME may then be left out). --json prints one object. Exit status: 0 found,\n"
        "1 no entry, 2 on an error.\n";
    read_args a;
    int rc = parse_read_args(argc, argv, usage, false, &a);
    if (rc) return rc < 0 ? 0 : rc;
    uint8_t *key = NULL, *ns = NULL, *mk = NULL;
    size_t klen = 0, nslen = 0, mklen = 0;
    if (decode_arg("get", "--key", a.key, a.format, &key, &klen) ||
        (a.ns && decode_arg("get", "--ns", a.ns, a.format, &ns, &nslen)) ||
        (a.map_key && decode_arg("get", "--map-key", a.map_key, a.format, &mk, &mklen))) {
        free(key);
        free(ns);
        return 2;
    }
    stash_worker *r = NULL;
    stash_state *s;
    stash_kind kind;
    int code = open_state(&a, "get", &r, &s, &kind);
    bool opened = code == 0;
    if (code == 0 && a.map_key && kind != STASH_MAP) {
        fprintf(stderr, "stash get: --map-key: state '%s' is a %s state, not a map\n", a.state,
                kind_name(kind));
        code = 2;
    }
    if (code == 0) {
        rc = stash_state_namespace(s, ns, nslen);
        if (rc == 0) rc = stash_key_set(r, key, klen);
        if (rc == 0)
            rc = print_entry(s, kind, &a, (stash_bytes){mk, mklen}, false,
                             &(stash_bytes){key, klen}, &(stash_bytes){ns, nslen});
        code = rc == 1 ? 0 : rc == 0 ? 1 : tool_fail("get", rc) + 1;
        if (rc == 0)
            fprintf(stderr, "stash get: state '%s' has no entry of key '%s'\n", a.state, a.key);
    }
    free(key);
    free(ns);
    free(mk);
    if (opened) stash_worker_close(r);
    return code;
}

int tool_scan(int argc, char **argv)
{
    static const char usage[] =
        "usage: stash scan NAME --state S [--key-group G] [--ns N]\n"
        "                       [--format text|hex|base64] [--json] [--path FILE]\n"
        "                       [--at-checkpoint | --checkpoint DIR]\n"
        "Lists the entries of the keyed state S, of every key group or of G alone (in\n"
        "namespace N alone with --ns), one a line: key, namespace and what `stash get`\n"
        "shows for it, separated by tabs (a list's elements, a map's map keys and\n"
        "values each in a field of their own), or with --json one object a line.\n"
        "It reads through a reader, which never blocks a worker or a checkpoint: each\n"
        "key group's keys are copied at its turn while the owners write on (an entry\n"
        "written meanwhile may show before or after the write); --at-checkpoint and\n"
        "--checkpoint DIR read one consistent version, as `stash get` does. Progress\n"
        "goes to a terminal's stderr.\n";
    read_args a;
    int rc = parse_read_args(argc, argv, usage, true, &a);
    if (rc) return rc < 0 ? 0 : rc;
    uint8_t *ns = NULL;
    size_t nslen = 0;
    if (a.ns && decode_arg("scan", "--ns", a.ns, a.format, &ns, &nslen)) return 2;
    stash_worker *r;
    stash_state *s;
    stash_kind kind;
    int code = open_state(&a, "scan", &r, &s, &kind);
    if (code) {
        free(ns);
        return code;
    }
    stash_arena_info info;
    stash_arena_info_get(stash_worker_arena(r), &info);
    uint32_t first = a.has_kg ? a.kg : 0, last = a.has_kg ? a.kg : info.max_parallelism - 1;
    if (a.has_kg && a.kg >= info.max_parallelism) {
        fprintf(stderr, "stash scan: --key-group %u: the arena has key groups 0 to %u\n", a.kg,
                info.max_parallelism - 1);
        last = 0;
        code = 2;
    }
    bool progress = isatty(STDERR_FILENO) && !isatty(STDOUT_FILENO);
    uint64_t entries = 0;
    for (uint32_t kg = first; code == 0 && rc >= 0 && kg <= last; kg++) {
        stash_iter it;
        stash_bytes key, kns;
        rc = stash_kg_keys_iter(s, kg, ns, nslen, &it);
        while (rc >= 0 && (rc = stash_iter_next(&it, &key, &kns)) == 1) {
            rc = stash_key_set(r, key.data, key.len);
            if (rc == 0) rc = stash_state_namespace(s, kns.data, kns.len);
            if (rc == 0) rc = print_entry(s, kind, &a, (stash_bytes){0}, true, &key, &kns);
            entries += rc == 1;
        }
        if (progress)
            fprintf(stderr, "\rstash scan: key group %u of %u, %llu entries", kg - first + 1,
                    last - first + 1, (unsigned long long)entries);
    }
    if (progress) fputs("\n", stderr);
    if (code == 0 && rc < 0) code = tool_fail("scan", rc) + 1;
    free(ns);
    stash_worker_close(r);
    return code;
}
