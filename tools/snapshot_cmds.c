/* SPDX-License-Identifier: MIT */
/*
 * snapshot_cmds.c: `stash snapshot`: looking into a checkpoint directory
 * without changing it: ls, info, verify (every checksum, exit code), dump
 * (states, keys and values as JSON lines) and diff of two checkpoints.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "backends/checkpoint/checkpoints.h"
#include "tools/tools.h"

static const char usage[] =
    "usage: stash snapshot ls DIR [--json] [--verify]\n"
    "       stash snapshot info CHECKPOINT [--json]\n"
    "       stash snapshot verify CHECKPOINT\n"
    "       stash snapshot dump CHECKPOINT [--format hex|text|base64]\n"
    "       stash snapshot diff CHECKPOINT CHECKPOINT [--format hex|text|base64]\n"
    "       stash snapshot load DEST [--format hex|text|base64] [--max-parallelism N]\n"
    "                           [--size SIZE] < LINES\n"
    "       stash snapshot rewrite CHECKPOINT DEST [--drop-state S]... [--rename-state A=B]...\n"
    "                              [--ttl S=DURATION|none]... [--max-parallelism N]\n"
    "CHECKPOINT is a checkpoint or savepoint directory (DIR/chk-ID, a savepoint\n"
    "anywhere), or DIR for its newest checkpoint (info and dump pass over damaged\n"
    "ones, saying so; verify takes the newest, damaged or not), or one in a remote\n"
    "storage, rados://POOL/JOB/chk-ID or s3://BUCKET/PREFIX/chk-ID (or /NAME of a\n"
    "savepoint), or rados://POOL/JOB or s3://BUCKET/PREFIX for the one JOB/latest names\n"
    "(Ceph: the cluster of $CEPH_CONF or /etc/ceph/ceph.conf, the client $STASH_CEPH_ID\n"
    "or admin; S3: the endpoint, region and keys of the environment, as stash serve\n"
    "takes them); of a job that spans hosts, rados://POOL/JOB/job-ID (or\n"
    "rados://POOL/JOB for its newest) reads a job checkpoint as one, its parts merged;\n"
    "ls of such a URL lists the job's checkpoints (of a job that spans hosts, each\n"
    "with its parts: rados://POOL/JOB/part/HOST/EPOCH/chk-ID), and rewrite's DEST may\n"
    "be such a URL ending in /NAME (a savepoint copied into the storage; NAME not\n"
    "chk-ID). ls lists DIR's\n"
    "checkpoints, then its savepoints, as complete (unverified: its metadata\n"
    "holds), partial or damaged; --verify checks every byte of each, as verify\n"
    "does. info shows the states and each worker's operator state. Nothing in\n"
    "the directory is ever changed. verify exits 0 if intact, 1 if damaged; diff\n"
    "0 if the two hold the same state, 1 if not; both 2 on trouble (a bad\n"
    "argument, a directory that cannot be read). diff compares the entries dump\n"
    "prints (decoded, however each snapshot lays its records out) and prints each\n"
    "that differs: - only in the first, + only in the second, ~ old -> new (bytes\n"
    "as --format says). dump prints one JSON object per\n"
    "value, list element (with its index) and map entry (with its map_key), a timer\n"
    "as its domain, timestamp and namespace, and with TTL the time an entry was\n"
    "written (ttl_ms); bytes in hex, or as --format says (text: a JSON string where\n"
    "the bytes are UTF-8, else {\"hex\": \"...\"}, so that any JSON tool keeps them).\n"
    "rewrite writes a new savepoint at DEST (which must not exist) from\n"
    "CHECKPOINT: states dropped, renamed, their TTL set or removed, and every key\n"
    "moved into its key group of N key groups; DEST holds a whole savepoint or\n"
    "nothing. Savepoints are canonical: there is nothing to convert. load builds a\n"
    "savepoint at DEST from dump's lines on stdin (edited or not; --format as dump was\n"
    "given), built in a heap of SIZE bytes (256M); it takes the fields dump writes,\n"
    "each of the type and in the range a reader takes (docs/format.md), and refuses\n"
    "any other, one given twice or missing, or one that means nothing for its state's\n"
    "kind: a line it cannot take is named by its number and field, and nothing is\n"
    "written.\n";

static const char *kind_name(unsigned kind)
{
    static const char *names[] = {"?",           "value",   "list",     "map",       "reducing",
                                  "aggregating", "op-list", "op-union", "broadcast", "timers"};
    return kind < sizeof names / sizeof names[0] ? names[kind] : "?";
}

/* Opens what arg names with open(arg, id, ctx): a checkpoint or savepoint
 * directory (one holding _metadata: id 0), or a checkpoint of a checkpoint
 * directory: the newest with metadata, damaged or not, if strict; else the
 * newest that opens, saying on stderr which newer ones it passed over and
 * why. */
typedef int opener_fn(const char *arg, uint64_t id, void *ctx);

static int resolve_with(const char *arg, bool strict, opener_fn *open, void *ctx)
{
    if (ckpt_url(arg)) {
        /* Copied from the storage and opened as a directory; read whole, so that
         * the copy can go at once. */
        ckpt_fetched f;
        int rc = ckpt_url_fetch(arg, NULL, &f);
        if (rc) return rc;
        rc = open(f.path, 0, ctx);
        ckpt_url_release(&f);
        return rc;
    }
    shm_dir d;
    struct stat st;
    int rc = shm_dir_open(arg, 0, &d);
    if (rc) return rc;
    if (fstatat(d.fd, "_metadata", &st, AT_SYMLINK_NOFOLLOW) == 0) {
        shm_dir_close(&d);
        return open(arg, 0, ctx);
    }
    uint64_t *ids;
    int n = ckpt_list(&d, &ids);
    rc = n < 0 ? n : -ENOENT;
    for (int i = 0; i < n && rc; i++) {
        if (!ckpt_has_metadata(&d, ids[i])) continue;
        rc = open(arg, ids[i], ctx);
        if (rc == 0 || strict) break;
        fprintf(stderr, "stash snapshot: passed over checkpoint %llu: %s\n",
                (unsigned long long)ids[i], stash_errmsg());
    }
    if (n >= 0) free(ids);
    shm_dir_close(&d);
    if (rc == -ENOENT && n >= 0) shm_fail(rc, "%s: no checkpoint", arg);
    return rc;
}

typedef struct view_open {
    ioe_engine *e;
    ckpt_view *v;
} view_open;

/* Opens arg, or its checkpoint id (checking it is the one its metadata names). */
static int open_view(const char *arg, uint64_t id, void *ctx)
{
    view_open *o = ctx;
    char path[4096];
    int rc = id ? ckpt_path_of(path, "%s/chk-%llu", arg, (unsigned long long)id)
                : ckpt_path_of(path, "%s", arg);
    return rc ? rc : ckpt_view_open_path(path, o->e, o->v);
}

static int resolve(const char *arg, ioe_engine *e, bool strict, ckpt_view *v)
{
    return resolve_with(arg, strict, open_view, &(view_open){e, v});
}

/* Opens DIR/chk-ID (id > 0, checking it is the one its metadata names) or
 * arg itself as a stash_snapshot. */
static int open_snapshot(const char *arg, uint64_t id, void *ctx)
{
    stash_snapshot **snap = ctx;
    char path[4096];
    int rc = id ? ckpt_path_of(path, "%s/chk-%llu", arg, (unsigned long long)id)
                : ckpt_path_of(path, "%s", arg);
    if (rc == 0) rc = stash_snapshot_open(path, snap);
    stash_snapshot_info info;
    if (rc == 0 && id && stash_snapshot_info_get(*snap, &info) == 0 && info.id != id) {
        stash_snapshot_close(*snap);
        rc = shm_fail(STASH_ECORRUPT, "%s: its metadata names checkpoint %llu", path,
                      (unsigned long long)info.id);
    }
    return rc;
}

/* The exit code of verify and diff for an error: 1 for a damaged
 * checkpoint, 2 for trouble (diff(1)'s convention). */
static int damage_or_trouble(const char *what, int err)
{
    tool_fail(what, err);
    return err == STASH_ECORRUPT || err == STASH_EFORMAT ? 1 : 2;
}

/* The bytes of a checkpoint's data files (its chain included). */
static size_t data_bytes(const ckpt_view *v)
{
    size_t n = 0;
    for (uint32_t f = 0; f < v->nfiles; f++) n += v->files[f].len;
    return n;
}

#define SNAP_MAX_CHANGES 64

typedef struct snap_args {
    bool json;
    bool verify;
    tool_format format; /* dump's, diff's and load's */
    const char *path[2];
    /* rewrite's: states dropped, renamed (A=B), TTLs set (S=DURATION|none) */
    const char *drop[SNAP_MAX_CHANGES], *rename[SNAP_MAX_CHANGES], *ttl[SNAP_MAX_CHANGES];
    int ndrop, nrename, nttl;
    uint32_t max_parallelism;
    uint64_t size; /* load's heap */
} snap_args;

/* Opens path (a checkpoint or savepoint directory) for ls: its state, and
 * with --verify every byte checked. */
static const char *ls_open(const char *path, const snap_args *a, ioe_engine *e, ckpt_view *v,
                           int *rc, bool *verified)
{
    *verified = false;
    *rc = ckpt_view_open_path(path, e, v);
    if (*rc == 0 && a->verify) {
        int64_t n = ckpt_view_walk(v, (stash_kg_range){0, v->max_parallelism - 1}, NULL, NULL);
        if (n < 0) {
            ckpt_view_close(v);
            *rc = (int)n;
        } else {
            *verified = true;
        }
    }
    return *rc == 0 ? "complete" : *rc == -ENOENT ? "partial" : "damaged";
}

/* One line of ls: id, time, state, bytes (its data files and metadata),
 * path. */
static void ls_line(uint64_t id, const char *path, const char *st, int rc, bool verified,
                    const ckpt_view *v, bool json, bool savepoint)
{
    char when[32] = "-", state[40];
    size_t bytes = rc == 0 ? data_bytes(v) + v->md_len : 0;
    if (rc == 0) {
        time_t t = (time_t)(v->created_ns / 1000000000ull);
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
    }
    if (json) {
        printf("{\"id\": %llu, \"state\": \"%s\", \"savepoint\": %s, \"verified\": %s, "
               "\"created_ns\": %llu, \"bytes\": %zu, \"path\": ",
               (unsigned long long)id, st, savepoint ? "true" : "false",
               verified ? "true" : "false", rc == 0 ? (unsigned long long)v->created_ns : 0ull,
               bytes);
        tool_json_string(path);
        printf("}\n");
        return;
    }
    snprintf(state, sizeof state, "%s%s%s", savepoint && rc == 0 ? "savepoint" : st,
             rc == 0 ? (verified ? " (verified)" : " (unverified)") : "", "");
    printf("%-10llu %-20s %-24s %10zu %s\n", (unsigned long long)id, when, state, bytes, path);
}

/* Lists the savepoint-<id> directories of dir, after its checkpoints. */
static void list_savepoints(const shm_dir *dir, const snap_args *a, ioe_engine *e)
{
    DIR *d = shm_dir_list(dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        char *end;
        if (strncmp(de->d_name, "savepoint-", 10) != 0) continue;
        unsigned long long id = strtoull(de->d_name + 10, &end, 10);
        if (*end || end == de->d_name + 10) continue;
        char path[4096];
        if (ckpt_path_of(path, "%s/%s", dir->path, de->d_name) < 0) continue;
        ckpt_view v;
        int rc;
        bool verified;
        const char *st = ls_open(path, a, e, &v, &rc, &verified);
        ls_line(id, path, st, rc, verified, &v, a->json, true);
        if (rc == 0) ckpt_view_close(&v);
    }
    if (d) closedir(d);
}

/* The checkpoints and savepoints of a job that spans hosts, each one line
 * (what restores it: rados://POOL/JOB/job-ID); its parts, each a host's
 * checkpoint of its own arena, only with --json. Closes r. */
static int ls_job(const snap_args *a, ckpt_storage *r, const char *job, uint64_t latest)
{
    uint64_t *ids = NULL;
    size_t n = 0;
    ckpt_job_record *rec = malloc(sizeof *rec);
    int rc = rec ? ckpt_job_records(r, job, &ids, &n) : -ENOMEM;
    if (rc == 0 && !a->json) printf("%-10s %-12s %-6s %s\n", "id", "state", "parts", "url");
    for (size_t i = 0; rc == 0 && i < n; i++) {
        rc = ckpt_job_record_read(r, job, ids[i], rec);
        if (rc == -ENOENT) {
            rc = 0; /* removed meanwhile */
            continue;
        }
        if (rc) break;
        const char *st = ids[i] > latest  ? "uncommitted"
                         : rec->savepoint ? "savepoint"
                                          : "complete";
        char url[1024];
        snprintf(url, sizeof url, "%s/job-%llu", a->path[0], (unsigned long long)ids[i]);
        if (!a->json) {
            printf("%-10llu %-12s %-6zu %s%s\n", (unsigned long long)ids[i], st, rec->n, url,
                   ids[i] == latest ? " (latest)" : "");
            continue;
        }
        printf("{\"id\": %llu, \"state\": \"%s\", \"savepoint\": %s, \"latest\": %s, \"url\": ",
               (unsigned long long)ids[i], st, rec->savepoint ? "true" : "false",
               ids[i] == latest ? "true" : "false");
        tool_json_string(url);
        printf(", \"parts\": [");
        char name[64];
        ckpt_job_part_name(rec, name, sizeof name);
        for (size_t k = 0; k < rec->n; k++) {
            char part[1024], workers[512], epoch[32] = "";
            if (rec->parts[k].epoch)
                snprintf(epoch, sizeof epoch, "/%llu", (unsigned long long)rec->parts[k].epoch);
            snprintf(part, sizeof part, "%s/part/%s%s/%s", a->path[0], rec->parts[k].host, epoch,
                     name);
            ckpt_job_workers_format(&rec->parts[k].workers, workers, sizeof workers);
            printf("%s{\"host\": ", k ? ", " : "");
            tool_json_string(rec->parts[k].host);
            printf(", \"workers\": \"%s\", \"parallelism\": %u, \"url\": ", workers,
                   rec->parts[k].parallelism);
            tool_json_string(part);
            printf("}");
        }
        printf("]}\n");
    }
    ckpt_storage_close(r);
    free(rec);
    free(ids);
    return rc ? tool_fail("snapshot ls", rc) : 0;
}

static int ls_remote(const snap_args *a)
{
    ckpt_storage *r;
    char job[256], name[256];
    int rc = ckpt_url_open(a->path[0], &r, job, sizeof job, name, sizeof name);
    uint64_t *ids = NULL, latest = 0;
    bool *committed = NULL;
    size_t n = 0;
    if (rc == 0 && name[0])
        rc = shm_fail(-EINVAL, "%s: ls takes a job, not a checkpoint", a->path[0]);
    if (rc == 0) rc = ckpt_storage_checkpoints(r, job, &ids, &committed, &n);
    if (rc == 0 && (rc = ckpt_storage_latest(r, job, &latest)) == -ENOENT) rc = 0;
    if (rc) {
        ckpt_storage_close(r);
        return tool_fail("snapshot ls", rc);
    }
    if (!a->json) printf("%-10s %-10s %s\n", "id", "state", "url");
    for (size_t i = 0; i < n; i++) {
        const char *st = !committed[i] ? "partial" : ids[i] > latest ? "uncommitted" : "complete";
        if (a->json)
            printf("{\"id\": %llu, \"state\": \"%s\", \"latest\": %s, \"url\": ",
                   (unsigned long long)ids[i], st, ids[i] == latest ? "true" : "false");
        else
            printf("%-10llu %-10s ", (unsigned long long)ids[i], st);
        char url[1024];
        snprintf(url, sizeof url, "%s/chk-%llu", a->path[0], (unsigned long long)ids[i]);
        if (a->json) {
            tool_json_string(url);
            printf("}\n");
        } else {
            printf("%s%s\n", url, ids[i] == latest ? " (latest)" : "");
        }
    }
    free(ids);
    free(committed);
    if (ckpt_storage_can(r, CKPT_CAN_JOB)) return ls_job(a, r, job, latest);
    ckpt_storage_close(r);
    return 0;
}

static int cmd_ls(const snap_args *a, ioe_engine *e)
{
    if (ckpt_url(a->path[0])) return ls_remote(a);
    uint64_t *ids;
    shm_dir d;
    int n = shm_dir_open(a->path[0], 0, &d);
    if (n == 0 && (n = ckpt_list(&d, &ids)) < 0) shm_dir_close(&d);
    if (n < 0) return tool_fail("snapshot ls", n);
    if (!a->json) printf("%-10s %-20s %-24s %10s %s\n", "id", "created", "state", "bytes", "path");
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/chk-%llu", a->path[0], (unsigned long long)ids[i]);
        ckpt_view v;
        int rc;
        bool verified;
        const char *st = ls_open(path, a, e, &v, &rc, &verified);
        ls_line(ids[i], path, st, rc, verified, &v, a->json, false);
        if (rc == 0) ckpt_view_close(&v);
    }
    free(ids);
    list_savepoints(&d, a, e);
    shm_dir_close(&d);
    return 0;
}

static int cmd_info(const snap_args *a, ioe_engine *e)
{
    bool json = a->json;
    ckpt_view v;
    int rc = resolve(a->path[0], e, false, &v);
    if (rc) return tool_fail("snapshot info", rc);
    if (json) {
        printf("{\"id\": %llu, \"created_ns\": %llu, \"base_id\": %llu, \"max_parallelism\": "
               "%u, \"data_bytes\": %zu, \"files\": [",
               (unsigned long long)v.id, (unsigned long long)v.created_ns,
               (unsigned long long)v.base_id, v.max_parallelism, data_bytes(&v));
        for (uint32_t f = 0; f < v.nfiles; f++) {
            printf("%s{\"name\": ", f ? ", " : "");
            tool_json_string(v.files[f].name);
            printf(", \"bytes\": %zu, \"delta\": %s}", v.files[f].len,
                   v.files[f].flags & CKPT_FILE_DELTA ? "true" : "false");
        }
        printf("], \"states\": [");
        for (uint32_t i = 0; i < v.nstates; i++) {
            ckpt_state s = ckpt_view_state(&v, i);
            uint64_t ttl;
            memcpy(&ttl, s.options, sizeof ttl);
            printf("%s{\"name\": ", i ? ", " : "");
            tool_json_string(s.name);
            printf(", \"kind\": \"%s\", \"ttl_ms\": %llu}", kind_name(s.kind),
                   (unsigned long long)ttl);
        }
        printf("], \"operator_state\": [");
        for (uint32_t i = 0; i < v.op_parallelism; i++)
            printf("%s%llu", i ? ", " : "", (unsigned long long)v.op_blobs[i].len);
        printf("]}\n");
    } else {
        printf("checkpoint %llu: %s\n%u key groups, %zu data bytes%s\nfiles:\n",
               (unsigned long long)v.id, v.meta_path, v.max_parallelism, data_bytes(&v),
               v.base_id ? " (incremental)" : "");
        for (uint32_t f = 0; f < v.nfiles; f++)
            printf("  %-24s %10zu bytes%s\n", v.files[f].name, v.files[f].len,
                   v.files[f].flags & CKPT_FILE_DELTA ? ", changes" : "");
        printf("states:\n");
        for (uint32_t i = 0; i < v.nstates; i++) {
            ckpt_state s = ckpt_view_state(&v, i);
            uint64_t ttl;
            memcpy(&ttl, s.options, sizeof ttl);
            if (ttl)
                printf("  %-24s %-12s ttl %llu ms\n", s.name, kind_name(s.kind),
                       (unsigned long long)ttl);
            else
                printf("  %-24s %-12s no ttl\n", s.name, kind_name(s.kind));
        }
        uint64_t op = 0;
        for (uint32_t i = 0; i < v.op_parallelism; i++) op += v.op_blobs[i].len;
        printf("operator state: %u worker%s, %llu bytes\n", v.op_parallelism,
               v.op_parallelism == 1 ? "" : "s", (unsigned long long)op);
    }
    ckpt_view_close(&v);
    return 0;
}

static int cmd_verify(const snap_args *a, ioe_engine *e)
{
    ckpt_view v;
    int rc = resolve(a->path[0], e, true, &v);
    if (rc) return damage_or_trouble("snapshot verify", rc);
    int64_t n = ckpt_view_walk(&v, (stash_kg_range){0, v.max_parallelism - 1}, NULL, NULL);
    if (n < 0) {
        ckpt_view_close(&v);
        return damage_or_trouble("snapshot verify", (int)n);
    }
    printf("checkpoint %llu: %u key groups, %lld records: every checksum holds\n",
           (unsigned long long)v.id, v.max_parallelism, (long long)n);
    ckpt_view_close(&v);
    return 0;
}

/* Prints one entry as a JSON line: a value, a list's element, a map's
 * entry or a timer. */
static int dump_entry(void *ctx, const stash_snapshot_entry *e)
{
    tool_format f = *(const tool_format *)ctx;
    printf("{\"kg\": %u, \"state\": ", e->kg);
    tool_json_string(e->state);
    printf(", \"kind\": \"%s\", \"key\": ", kind_name(e->kind));
    tool_print_bytes(e->key.data, e->key.len, f, true);
    if (e->kind == STASH_TIMERS) {
        printf(", \"domain\": \"%s\", \"timestamp\": %llu",
               e->domain == STASH_EVENT_TIME ? "event-time" : "processing-time",
               (unsigned long long)e->timestamp);
    }
    printf(", \"namespace\": ");
    tool_print_bytes(e->ns.data, e->ns.len, f, true);
    if (e->kind == STASH_LIST) printf(", \"index\": %u", e->index);
    if (e->kind == STASH_MAP) {
        printf(", \"map_key\": ");
        tool_print_bytes(e->map_key.data, e->map_key.len, f, true);
    }
    if (e->kind != STASH_TIMERS) {
        printf(", \"value\": ");
        tool_print_bytes(e->value.data, e->value.len, f, true);
    }
    if (e->ttl_ms) printf(", \"ttl_ms\": %llu", (unsigned long long)e->ttl_ms);
    printf("}\n");
    return 0;
}

/* Prints one operator-state entry as a JSON line. */
static int dump_op_entry(void *ctx, const stash_snapshot_entry *e)
{
    tool_format f = *(const tool_format *)ctx;
    printf("{\"state\": ");
    tool_json_string(e->state);
    printf(", \"kind\": \"%s\", \"worker\": %u", kind_name(e->kind), e->worker);
    if (e->kind == STASH_TIMERS) {
        printf(", \"watermark\": %llu}\n", (unsigned long long)e->timestamp);
        return 0;
    }
    if (e->kind == STASH_OP_BROADCAST) {
        printf(", \"map_key\": ");
        tool_print_bytes(e->map_key.data, e->map_key.len, f, true);
    } else {
        printf(", \"index\": %u", e->index);
    }
    printf(", \"value\": ");
    tool_print_bytes(e->value.data, e->value.len, f, true);
    printf("}\n");
    return 0;
}

/* The snapshot's own line and one line per state: what load needs first. */
static void dump_header(stash_snapshot *snap, const stash_snapshot_info *info)
{
    printf("{\"snapshot\": %llu, \"max_parallelism\": %u, \"op_parallelism\": %u}\n",
           (unsigned long long)info->id, info->max_parallelism, info->op_parallelism);
    for (uint32_t i = 0; i < info->nstates; i++) {
        stash_state_desc d;
        stash_snapshot_state(snap, i, &d);
        printf("{\"declare\": ");
        tool_json_string(d.name);
        printf(", \"kind\": \"%s\"", kind_name(d.kind));
        if (d.ttl.ttl_ms)
            printf(", \"ttl_ms\": %llu, \"ttl_update\": %d, \"ttl_visibility\": %d, "
                   "\"ttl_cleanup_full_snapshot\": %d, \"ttl_event_time\": %d",
                   (unsigned long long)d.ttl.ttl_ms, d.ttl.update, d.ttl.visibility,
                   d.ttl.cleanup_full_snapshot, d.ttl.time == STASH_TTL_EVENT_TIME);
        printf("}\n");
    }
}

static int cmd_dump(const snap_args *a)
{
    stash_snapshot *snap;
    int rc = resolve_with(a->path[0], false, open_snapshot, &snap);
    if (rc) return tool_fail("snapshot dump", rc);
    stash_snapshot_info info;
    stash_snapshot_info_get(snap, &info);
    dump_header(snap, &info);
    bool progress = isatty(STDERR_FILENO) && !isatty(STDOUT_FILENO);
    for (uint32_t kg = 0; kg < info.max_parallelism && rc == 0; kg++) {
        if (progress)
            fprintf(stderr, "\r\033[Kdump: key group %u of %u", kg + 1, info.max_parallelism);
        rc = stash_snapshot_scan(snap, (stash_kg_range){kg, kg}, dump_entry, (void *)&a->format);
    }
    if (progress) fputs("\r\033[K", stderr);
    if (rc == 0) rc = stash_snapshot_op_scan(snap, dump_op_entry, (void *)&a->format);
    stash_snapshot_close(snap);
    return rc ? tool_fail("snapshot dump", rc) : 0;
}

/* An entry reduced to what diff compares: its identity (state, key,
 * namespace, and the timer, list index, map key or operator state's worker
 * that tell it apart) and its value (with TTL, the time it was written),
 * both as text in the --format given. */
typedef struct entry {
    uint64_t id_hash, value_hash;
    char *label, *value;
} entry;

typedef struct collector {
    tool_format format;
    entry *e;
    size_t n, cap;
} collector;

/* Bytes shown of a value; the hash compares all of them. */
#define DIFF_SHOWN 64u

static void put_bytes(FILE *f, const char *sep, stash_bytes b, tool_format format, size_t max)
{
    fputs(sep, f);
    tool_fprint_bytes(f, b.data, b.len < max ? b.len : max, format);
    if (b.len > max) fprintf(f, "... (%zu bytes)", b.len);
}

static int collect_entry(collector *c, const stash_snapshot_entry *e, bool op)
{
    if (c->n == c->cap) {
        entry *grown = realloc(c->e, (c->cap = c->cap ? c->cap * 2 : 1024) * sizeof *grown);
        if (!grown) return -ENOMEM;
        c->e = grown;
    }
    entry *x = &c->e[c->n];
    size_t len;
    FILE *f = open_memstream(&x->label, &len);
    if (!f) return -ENOMEM;
    fputs(e->state, f);
    if (op) {
        fprintf(f, " worker=%u", e->worker);
    } else {
        put_bytes(f, " ", e->key, c->format, SIZE_MAX);
        if (e->kind == STASH_TIMERS)
            fprintf(f, " %s@%llu", e->domain == STASH_EVENT_TIME ? "event-time" : "processing-time",
                    (unsigned long long)e->timestamp);
        put_bytes(f, " ", e->ns, c->format, SIZE_MAX);
    }
    if (e->kind == STASH_MAP || e->kind == STASH_OP_BROADCAST)
        put_bytes(f, " map_key=", e->map_key, c->format, SIZE_MAX);
    if (e->kind == STASH_LIST || e->kind == STASH_OP_LIST || e->kind == STASH_OP_UNION)
        fprintf(f, " [%u]", e->index);
    if (fclose(f) != 0) return -ENOMEM;
    x->value = NULL; /* a timer is all identity */
    uint64_t h = 0;
    if (e->kind != STASH_TIMERS || op) {
        f = open_memstream(&x->value, &len);
        if (!f) return free(x->label), -ENOMEM;
        if (e->kind == STASH_TIMERS) {
            fprintf(f, "watermark %llu", (unsigned long long)e->timestamp);
            h = e->timestamp;
        } else {
            put_bytes(f, "", e->value, c->format, DIFF_SHOWN);
            if (e->ttl_ms) fprintf(f, " (written at %llu ms)", (unsigned long long)e->ttl_ms);
            h = XXH3_64bits_withSeed(e->value.data, e->value.len, e->ttl_ms);
        }
        if (fclose(f) != 0) return free(x->label), -ENOMEM;
    }
    x->id_hash = XXH3_64bits(x->label, strlen(x->label));
    x->value_hash = h;
    c->n++;
    return 0;
}

static int collect_keyed(void *ctx, const stash_snapshot_entry *e)
{
    return collect_entry(ctx, e, false);
}

static int collect_op(void *ctx, const stash_snapshot_entry *e)
{
    return collect_entry(ctx, e, true);
}

static int by_id(const void *x, const void *y)
{
    const entry *a = x, *b = y;
    if (a->id_hash != b->id_hash) return a->id_hash < b->id_hash ? -1 : 1;
    return strcmp(a->label, b->label);
}

/* Every entry of the snapshot arg names, keyed and operator state, as
 * stash_snapshot_scan decodes them: two snapshots that hold the same state
 * give the same entries, however their records are laid out. */
static int load_entries(const char *arg, tool_format format, collector *c)
{
    stash_snapshot *snap;
    *c = (collector){.format = format};
    int rc = resolve_with(arg, false, open_snapshot, &snap);
    if (rc) return rc;
    stash_snapshot_info info;
    stash_snapshot_info_get(snap, &info);
    rc = stash_snapshot_scan(snap, (stash_kg_range){0, info.max_parallelism - 1}, collect_keyed, c);
    if (rc == 0) rc = stash_snapshot_op_scan(snap, collect_op, c);
    stash_snapshot_close(snap);
    if (rc == 0) qsort(c->e, c->n, sizeof *c->e, by_id);
    return rc;
}

static void free_entries(collector *c)
{
    for (size_t i = 0; i < c->n; i++) free(c->e[i].label), free(c->e[i].value);
    free(c->e);
}

static void print_one(char sign, const entry *x)
{
    if (x->value)
        printf("%c %s = %s\n", sign, x->label, x->value);
    else
        printf("%c %s\n", sign, x->label);
}

static int cmd_diff(const snap_args *args)
{
    collector a, b;
    int rc = load_entries(args->path[0], args->format, &a);
    if (rc) {
        free_entries(&a);
        return damage_or_trouble("snapshot diff", rc);
    }
    if ((rc = load_entries(args->path[1], args->format, &b))) {
        free_entries(&a);
        free_entries(&b);
        return damage_or_trouble("snapshot diff", rc);
    }
    size_t i = 0, j = 0, differ = 0;
    while (i < a.n || j < b.n) {
        int c = i == a.n ? 1 : j == b.n ? -1 : by_id(&a.e[i], &b.e[j]);
        if (c < 0) {
            print_one('-', &a.e[i++]);
        } else if (c > 0) {
            print_one('+', &b.e[j++]);
        } else if (a.e[i].value_hash != b.e[j].value_hash) {
            printf("~ %s: %s -> %s\n", a.e[i].label, a.e[i].value, b.e[j].value);
            i++, j++;
        } else {
            i++, j++;
            continue;
        }
        differ++;
    }
    printf("%zu entries differ (%zu in the first, %zu in the second)\n", differ, a.n, b.n);
    free_entries(&a);
    free_entries(&b);
    return differ ? 1 : 0;
}

/* A rewrite's progress on a terminal: key groups written. */
static void rewrite_progress(void *ctx, uint32_t done, uint32_t total)
{
    (void)ctx;
    if (done % 64 == 0 || done == total)
        fprintf(stderr, "\r\033[Krewrite: %u of %u key groups", done, total);
}

/* The changes the flags ask for, one a flag, into ch (room for all). */
static int changes_of(const snap_args *a, stash_snapshot *snap, stash_snapshot_change *ch,
                      char (*names)[128], uint32_t *n)
{
    *n = 0;
    for (int i = 0; i < a->ndrop; i++)
        ch[(*n)++] = (stash_snapshot_change){.state = a->drop[i], .drop = 1};
    for (int i = 0; i < a->nrename; i++) {
        const char *eq = strchr(a->rename[i], '=');
        snprintf(names[*n], sizeof names[*n], "%.*s", (int)(eq - a->rename[i]), a->rename[i]);
        ch[*n] = (stash_snapshot_change){.state = names[*n], .rename = eq + 1};
        (*n)++;
    }
    for (int t = 0; t < a->nttl; t++) {
        const char *eq = strchr(a->ttl[t], '=');
        snprintf(names[*n], sizeof names[*n], "%.*s", (int)(eq - a->ttl[t]), a->ttl[t]);
        uint64_t ms = 0;
        if (strcmp(eq + 1, "none") != 0 && (tool_parse_duration(eq + 1, &ms) < 0 || ms == 0)) {
            fprintf(stderr,
                    "stash snapshot rewrite: --ttl %s: a duration (500ms, 2s, 1h) or none\n",
                    a->ttl[t]);
            return 2;
        }
        /* The state's other TTL settings stay as they were. */
        stash_ttl ttl = {0};
        stash_snapshot_info info;
        stash_snapshot_info_get(snap, &info);
        for (uint32_t i = 0; i < info.nstates; i++) {
            stash_state_desc d;
            stash_snapshot_state(snap, i, &d);
            if (strcmp(d.name, names[*n]) == 0) ttl = d.ttl;
        }
        ttl.ttl_ms = ms;
        ch[*n] = (stash_snapshot_change){.state = names[*n], .set_ttl = 1, .ttl = ttl};
        (*n)++;
    }
    return 0;
}

static int cmd_rewrite(const snap_args *a)
{
    stash_snapshot *snap;
    int rc = stash_snapshot_open(a->path[0], &snap);
    if (rc) return tool_fail("snapshot rewrite", rc);
    size_t most = (size_t)a->ndrop + (size_t)a->nrename + (size_t)a->nttl + 1;
    stash_snapshot_change *ch = calloc(most, sizeof *ch);
    char(*names)[128] = calloc(most, sizeof *names);
    uint32_t n = 0;
    int bad = ch && names ? changes_of(a, snap, ch, names, &n) : 1;
    stash_snapshot_info out;
    if (bad == 0)
        rc =
            stash_snapshot_rewrite(snap, a->path[1],
                                   &(stash_snapshot_rewrite_opts){
                                       .sz = sizeof(stash_snapshot_rewrite_opts),
                                       .max_parallelism = a->max_parallelism,
                                       .changes = ch,
                                       .nchanges = n,
                                       .progress = isatty(STDERR_FILENO) ? rewrite_progress : NULL},
                                   &out);
    if (bad == 0 && isatty(STDERR_FILENO)) fputs("\r\033[K", stderr);
    free(ch);
    free(names);
    stash_snapshot_close(snap);
    if (bad) return bad;
    if (rc) return tool_fail("snapshot rewrite", rc);
    printf("savepoint %llu %s: %u key groups, %u states\n", (unsigned long long)out.id, a->path[1],
           out.max_parallelism, out.nstates);
    return 0;
}

/* ---- load: dump's lines back into a savepoint --------------------------- */

/* Every field a line of dump may hold (docs/format.md); load refuses any
 * other, and any of these where it means nothing. */
#define LOAD_FIELDS                                                                                \
    "snapshot max_parallelism op_parallelism declare kind ttl_ms ttl_update ttl_visibility "       \
    "ttl_cleanup_full_snapshot ttl_event_time kg state key namespace index map_key value domain "  \
    "timestamp worker watermark"

/* A TTL's settings beside its "ttl_ms", as dump gives them. */
#define TTL_OPTIONS "ttl_update ttl_visibility ttl_cleanup_full_snapshot ttl_event_time"

/* A state the lines declared: what its entries are checked against. */
typedef struct load_state {
    char name[SHM_STATE_NAME];
    stash_kind kind;
    bool ttl;
} load_state;

/* A set of byte strings: open addressing, at most half full. */
typedef struct seen_key {
    uint64_t hash;
    size_t len;
    uint8_t *bytes; /* owned; NULL: a free slot */
} seen_key;

typedef struct key_set {
    seen_key *slot;
    size_t n, cap; /* cap: 0 or a power of two */
} key_set;

static void key_set_place(seen_key *slot, size_t cap, seen_key k)
{
    size_t j = k.hash & (cap - 1);
    while (slot[j].bytes) j = (j + 1) & (cap - 1);
    slot[j] = k;
}

/* Adds bytes (malloc'd, len > 0; the set takes them) to s: returns 0, 1
 * if they were in it already (and frees them), or -ENOMEM. */
static int key_set_add(key_set *s, uint8_t *bytes, size_t len)
{
    if (2 * (s->n + 1) > s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        seen_key *grown = calloc(cap, sizeof *grown);
        if (!grown) {
            free(bytes);
            return -ENOMEM;
        }
        for (size_t i = 0; i < s->cap; i++)
            if (s->slot[i].bytes) key_set_place(grown, cap, s->slot[i]);
        free(s->slot);
        s->slot = grown;
        s->cap = cap;
    }
    uint64_t h = XXH3_64bits(bytes, len);
    for (size_t j = h & (s->cap - 1); s->slot[j].bytes; j = (j + 1) & (s->cap - 1))
        if (s->slot[j].hash == h && s->slot[j].len == len &&
            !memcmp(s->slot[j].bytes, bytes, len)) {
            free(bytes);
            return 1;
        }
    key_set_place(s->slot, s->cap, (seen_key){h, len, bytes});
    s->n++;
    return 0;
}

static void key_set_free(key_set *s)
{
    for (size_t i = 0; i < s->cap; i++) free(s->slot[i].bytes);
    free(s->slot);
}

/* A load in progress: the writer, opened at the first line after the
 * snapshot's (which says how), the states declared so far, and the keys
 * of broadcast state each worker was given (the writer would keep a key
 * given twice twice). */
typedef struct loader {
    const snap_args *a;
    stash_snapshot_writer *w;
    stash_snapshot_writer_opts o;
    bool begun; /* a line was taken: no snapshot line may come */
    load_state states[SHM_CATALOG_SIZE];
    uint32_t nstates;
    key_set broadcast; /* state index (4), worker (4), map key */
    uint8_t *bytes[4]; /* decoded fields of the line */
    int nbytes;
} loader;

/* One line's fields. */
typedef struct load_line {
    const tool_json_field *f;
    int n;
} load_line;

/* Refuses field name (len bytes) of the line: its name as given, but for
 * bytes other than printable ASCII and past the 40th (a name made up is
 * not echoed whole), then why. */
static int __attribute__((format(printf, 3, 4)))
name_fail(const char *name, size_t len, const char *fmt, ...)
{
    char shown[48], why[256];
    size_t n = 0;
    for (size_t i = 0; i < len && n < 40; i++)
        shown[n++] = name[i] >= ' ' && name[i] <= '~' && name[i] != '"' ? name[i] : '?';
    if (len > 40) n += (size_t)sprintf(shown + n, "...");
    shown[n] = '\0';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return shm_fail(-EINVAL, "\"%s\": %s", shown, why);
}

#define field_fail(x, ...) name_fail((x)->name, (x)->name_len, __VA_ARGS__)
#define refuse(name, ...) name_fail(name, strlen(name), __VA_ARGS__)
#define missing(name) refuse(name, "missing")

/* Whether name (len bytes) is one of the words of list. */
static bool one_of(const char *name, size_t len, const char *list)
{
    for (const char *p = list; *p;) {
        size_t w = strcspn(p, " ");
        if (w == len && memcmp(p, name, len) == 0) return true;
        p += w + (p[w] == ' ');
    }
    return false;
}

/* Refuses a field given twice, or not one of allowed (where means says
 * why it means nothing). */
static int only_fields(const load_line *ln, const char *allowed, const char *means)
{
    for (int i = 0; i < ln->n; i++) {
        const tool_json_field *x = &ln->f[i];
        for (int j = 0; j < i; j++)
            if (x->name_len == ln->f[j].name_len &&
                memcmp(x->name, ln->f[j].name, x->name_len) == 0)
                return field_fail(x, "given twice");
        if (!one_of(x->name, x->name_len, LOAD_FIELDS))
            return field_fail(x, "no field of dump's lines");
        if (!one_of(x->name, x->name_len, allowed)) return field_fail(x, "means nothing %s", means);
    }
    return 0;
}

/* Refuses the first field of the line that is one of list, saying why. */
static int none_of(const load_line *ln, const char *list, const char *why)
{
    for (int i = 0; i < ln->n; i++)
        if (one_of(ln->f[i].name, ln->f[i].name_len, list)) return field_fail(&ln->f[i], "%s", why);
    return 0;
}

/* Field name of the line as a JSON integer from min to max (digits only:
 * no sign, fraction, exponent, leading zero or quotes) into *out; left as
 * it is if absent and not needed. */
static int integer(const load_line *ln, const char *name, bool needed, uint64_t min, uint64_t max,
                   uint64_t *out)
{
    const tool_json_field *x = tool_json_get(ln->f, ln->n, name);
    if (!x) return needed ? missing(name) : 0;
    const char *p = x->value;
    uint64_t v = 0;
    bool ok = !x->string && *p >= '0' && *p <= '9' && !(p[0] == '0' && p[1]);
    for (; ok && *p; p++) {
        unsigned d = (unsigned)(*p - '0');
        ok = *p >= '0' && *p <= '9' && v <= (UINT64_MAX - d) / 10;
        v = v * 10 + d;
    }
    if (!ok || v < min || v > max)
        return field_fail(x, "not an integer from %llu to %llu", (unsigned long long)min,
                          (unsigned long long)max);
    *out = v;
    return 0;
}

/* Field name of the line as a string of 1 to max bytes without a NUL
 * byte: it becomes a C string. */
static int c_string(const load_line *ln, const char *name, size_t max, const tool_json_field **out)
{
    const tool_json_field *x = tool_json_get(ln->f, ln->n, name);
    if (!x) return missing(name);
    if (!x->string || x->len == 0 || x->len > max || memchr(x->value, 0, x->len))
        return field_fail(x, "not a string of 1 to %zu bytes without a NUL byte", max);
    *out = x;
    return 0;
}

/* The line's "kind": one of the kinds' names. */
static int kind_field(const load_line *ln, stash_kind *out)
{
    const tool_json_field *x;
    int rc = c_string(ln, "kind", 16, &x);
    for (int k = STASH_VALUE; rc == 0 && k <= STASH_TIMERS; k++)
        if (strcmp(x->value, kind_name((unsigned)k)) == 0) {
            *out = (stash_kind)k;
            return 0;
        }
    return rc ? rc : field_fail(x, "names no state kind");
}

/* Field name of the line, its bytes in the --format given, into *out (at
 * most most of them); empty if absent and not needed. */
static int bytes_field(loader *l, const load_line *ln, const char *name, bool needed, size_t most,
                       stash_bytes *out)
{
    const tool_json_field *x = tool_json_get(ln->f, ln->n, name);
    *out = (stash_bytes){0};
    if (!x) return needed ? missing(name) : 0;
    if (!x->string && !x->bytes) return field_fail(x, "not a string or {\"hex\": ...}");
    if (l->a->format == TOOL_TEXT || x->bytes) {
        *out = (stash_bytes){x->value, x->len};
    } else {
        size_t len;
        uint8_t *b;
        int rc =
            memchr(x->value, 0, x->len) ? -EINVAL : tool_decode(x->value, l->a->format, &b, &len);
        if (rc == -ENOMEM) return shm_fail(rc, "out of memory");
        if (rc) return field_fail(x, "not %s", l->a->format == TOOL_HEX ? "hex" : "base64");
        l->bytes[l->nbytes++] = b;
        *out = (stash_bytes){b, len};
    }
    if (out->len > most) return field_fail(x, "%zu bytes, at most %zu", out->len, most);
    return 0;
}

/* Whether kind k's states take a TTL: keyed state but timers. */
static bool takes_ttl(stash_kind k)
{
    return k >= STASH_VALUE && k <= STASH_AGGREGATING;
}

/* The snapshot's line: its id, key groups and operator state's workers,
 * as a reader takes them. */
static int load_header(loader *l, const load_line *ln)
{
    if (l->begun) return refuse("snapshot", "the snapshot line comes first, and once");
    int rc = only_fields(ln, "snapshot max_parallelism op_parallelism", "on the snapshot line");
    uint64_t id = 0, maxp = 0, opp = 0;
    if (rc == 0) rc = integer(ln, "snapshot", true, 1, CKPT_MAX_ID, &id);
    if (rc == 0) rc = integer(ln, "max_parallelism", false, 1, STASH_MAX_MAX_PARALLELISM, &maxp);
    if (rc == 0) rc = integer(ln, "op_parallelism", false, 0, STASH_MAX_WORKERS, &opp);
    if (rc) return rc;
    l->o.id = id;
    if (!l->a->max_parallelism && maxp) l->o.max_parallelism = (uint32_t)maxp;
    l->o.op_parallelism = (uint32_t)opp;
    return 0;
}

/* A state's declaration: its name, kind and TTL settings (a TTL for keyed
 * state but timers, its options 0 or 1 as the metadata keeps them). */
static int load_declare(loader *l, const load_line *ln)
{
    const tool_json_field *name;
    stash_kind k = 0;
    int rc = c_string(ln, "declare", SHM_STATE_NAME - 1, &name);
    if (rc == 0) rc = kind_field(ln, &k);
    for (uint32_t i = 0; rc == 0 && i < l->nstates; i++)
        if (strcmp(l->states[i].name, name->value) == 0)
            return field_fail(name, "the state was declared above");
    if (rc == 0 && l->nstates == SHM_CATALOG_SIZE)
        return field_fail(name, "a savepoint holds at most %u states", SHM_CATALOG_SIZE);
    stash_ttl ttl = {0};
    if (rc == 0 && takes_ttl(k)) rc = integer(ln, "ttl_ms", false, 0, UINT64_MAX, &ttl.ttl_ms);
    char means[64];
    snprintf(means, sizeof means, "in a declaration of kind %s", kind_name(k));
    if (rc == 0 && takes_ttl(k) && !ttl.ttl_ms)
        rc = none_of(ln, TTL_OPTIONS, "means nothing without a TTL (\"ttl_ms\" above 0)");
    if (rc == 0)
        rc = only_fields(ln, takes_ttl(k) ? "declare kind ttl_ms " TTL_OPTIONS : "declare kind",
                         means);
    uint64_t opt[4] = {0};
    static const char *const opts[4] = {"ttl_update", "ttl_visibility", "ttl_cleanup_full_snapshot",
                                        "ttl_event_time"};
    for (int i = 0; rc == 0 && i < 4; i++) rc = integer(ln, opts[i], false, 0, 1, &opt[i]);
    if (rc == 0 && !l->w) rc = stash_snapshot_writer_open(l->a->path[0], &l->o, &l->w);
    if (rc) return rc;
    ttl.update = (int)opt[0];
    ttl.visibility = (int)opt[1];
    ttl.cleanup_full_snapshot = (int)opt[2];
    ttl.time = opt[3] ? STASH_TTL_EVENT_TIME : STASH_TTL_PROCESSING_TIME;
    rc = stash_snapshot_writer_state(
        l->w, &(stash_state_desc){
                  .sz = sizeof(stash_state_desc), .name = name->value, .kind = k, .ttl = ttl});
    if (rc) return rc;
    load_state *s = &l->states[l->nstates++];
    memcpy(s->name, name->value, name->len + 1);
    s->kind = k;
    s->ttl = ttl.ttl_ms > 0;
    return 0;
}

/* The declared state the line's "state" names, which its "kind" must be. */
static int entry_state(loader *l, const load_line *ln, const load_state **out)
{
    const tool_json_field *name;
    stash_kind k = 0;
    int rc = c_string(ln, "state", SHM_STATE_NAME - 1, &name);
    *out = NULL;
    for (uint32_t i = 0; rc == 0 && i < l->nstates && !*out; i++)
        if (strcmp(l->states[i].name, name->value) == 0) *out = &l->states[i];
    if (rc == 0 && !*out) return field_fail(name, "names no state declared above");
    if (rc == 0) rc = kind_field(ln, &k);
    if (rc == 0 && k != (*out)->kind)
        return refuse("kind", "%s, but the state was declared %s", kind_name(k),
                      kind_name((*out)->kind));
    return rc;
}

/* A keyed entry: a value or accumulator, a list's element (its index is
 * the line's place among its list's lines), a map's entry, or a timer.
 * Its "kg" is checked, then computed again from the key (of the max
 * parallelism loaded into). */
static int load_keyed(loader *l, const load_line *ln, const load_state *s)
{
    stash_kind k = s->kind;
    char allowed[128], means[64];
    snprintf(allowed, sizeof allowed, "kg state kind key namespace %s%s",
             k == STASH_TIMERS ? "domain timestamp"
             : k == STASH_LIST ? "index value"
             : k == STASH_MAP  ? "map_key value"
                               : "value",
             s->ttl ? " ttl_ms" : "");
    snprintf(means, sizeof means, "for kind %s", kind_name(k));
    stash_snapshot_entry e = {.state = s->name, .kind = k};
    uint64_t kg = 0, index = 0, ts = 0;
    int rc = takes_ttl(k) && !s->ttl
                 ? none_of(ln, "ttl_ms", "means nothing for a state declared without a TTL")
                 : 0;
    if (rc == 0) rc = only_fields(ln, allowed, means);
    if (rc == 0) rc = integer(ln, "kg", false, 0, STASH_MAX_MAX_PARALLELISM - 1, &kg);
    if (rc == 0) rc = bytes_field(l, ln, "key", true, UINT16_MAX, &e.key);
    if (rc == 0)
        rc = bytes_field(l, ln, "namespace", false,
                         UINT16_MAX - (k == STASH_TIMERS ? TIMER_NS_PREFIX : 0), &e.ns);
    if (rc == 0 && k == STASH_LIST) rc = integer(ln, "index", false, 0, UINT32_MAX, &index);
    if (rc == 0 && k == STASH_MAP) rc = bytes_field(l, ln, "map_key", true, UINT16_MAX, &e.map_key);
    if (rc == 0 && k != STASH_TIMERS) rc = bytes_field(l, ln, "value", true, UINT32_MAX, &e.value);
    if (rc == 0 && s->ttl) rc = integer(ln, "ttl_ms", false, 0, UINT64_MAX, &e.ttl_ms);
    if (rc == 0 && k == STASH_TIMERS) {
        const tool_json_field *dom;
        rc = c_string(ln, "domain", 16, &dom);
        if (rc == 0 && strcmp(dom->value, "event-time") == 0)
            e.domain = STASH_EVENT_TIME;
        else if (rc == 0 && strcmp(dom->value, "processing-time") == 0)
            e.domain = STASH_PROCESSING_TIME;
        else if (rc == 0)
            rc = field_fail(dom, "neither event-time nor processing-time");
        if (rc == 0) rc = integer(ln, "timestamp", true, 0, UINT64_MAX, &ts);
        e.timestamp = ts;
    }
    return rc ? rc : stash_snapshot_writer_put(l->w, &e);
}

/* Whether e's key is new to its worker's broadcast state s: a map, where
 * a key is given once. */
static int broadcast_key_new(loader *l, const load_state *s, const stash_snapshot_entry *e)
{
    uint32_t head[2] = {(uint32_t)(s - l->states), e->worker};
    uint8_t *k = malloc(sizeof head + e->map_key.len);
    if (!k) return shm_fail(-ENOMEM, "out of memory");
    memcpy(k, head, sizeof head);
    if (e->map_key.len) memcpy(k + sizeof head, e->map_key.data, e->map_key.len);
    int rc = key_set_add(&l->broadcast, k, sizeof head + e->map_key.len);
    if (rc < 0) return shm_fail(rc, "out of memory");
    return rc ? refuse("map_key", "given above for this worker's broadcast state") : 0;
}

/* An operator-state entry of worker "worker": a list's element, a
 * broadcast entry, or a timer service's watermark. */
static int load_op(loader *l, const load_line *ln, const load_state *s)
{
    stash_kind k = s->kind;
    char means[64];
    snprintf(means, sizeof means, "in operator state of kind %s", kind_name(k));
    stash_snapshot_entry e = {.state = s->name, .kind = k};
    uint64_t worker = 0, index = 0;
    int rc = only_fields(ln,
                         k == STASH_TIMERS         ? "state kind worker watermark"
                         : k == STASH_OP_BROADCAST ? "state kind worker map_key value"
                                                   : "state kind worker index value",
                         means);
    if (rc == 0 && !l->o.op_parallelism)
        return refuse("worker", "the snapshot line gives no operator state");
    if (rc == 0) rc = integer(ln, "worker", true, 0, l->o.op_parallelism - 1, &worker);
    if (rc == 0 && k == STASH_TIMERS)
        rc = integer(ln, "watermark", true, 0, UINT64_MAX, &e.timestamp);
    if (rc == 0 && k == STASH_OP_BROADCAST)
        rc = bytes_field(l, ln, "map_key", true, UINT32_MAX, &e.map_key);
    if (rc == 0 && k != STASH_TIMERS && k != STASH_OP_BROADCAST)
        rc = integer(ln, "index", false, 0, UINT32_MAX, &index);
    if (rc == 0 && k != STASH_TIMERS) rc = bytes_field(l, ln, "value", true, UINT32_MAX, &e.value);
    e.worker = (uint32_t)worker;
    if (rc == 0 && k == STASH_OP_BROADCAST) rc = broadcast_key_new(l, s, &e);
    return rc ? rc : stash_snapshot_writer_op_put(l->w, &e);
}

/* Takes one parsed line: the snapshot's, a declaration, or an entry of a
 * state declared above (a field given twice, or unknown, refused first:
 * what kind of line it is depends on its fields). */
static int take_line(loader *l, const load_line *ln)
{
    int rc = only_fields(ln, LOAD_FIELDS, "");
    if (rc == 0 && tool_json_get(ln->f, ln->n, "snapshot"))
        rc = load_header(l, ln);
    else if (rc == 0 && tool_json_get(ln->f, ln->n, "declare"))
        rc = load_declare(l, ln);
    else if (rc == 0) {
        const load_state *s;
        rc = entry_state(l, ln, &s);
        if (rc == 0 && !l->w) rc = stash_snapshot_writer_open(l->a->path[0], &l->o, &l->w);
        /* A timer service has keyed entries (its timers) and a line of
         * operator state per worker (its watermark). */
        if (rc == 0)
            rc = (s->kind >= STASH_OP_LIST && s->kind <= STASH_OP_BROADCAST) ||
                         (s->kind == STASH_TIMERS && tool_json_get(ln->f, ln->n, "worker"))
                     ? load_op(l, ln, s)
                     : load_keyed(l, ln, s);
    }
    l->begun = true;
    return rc;
}

static int cmd_load(const snap_args *a)
{
    loader l = {.a = a,
                .o = {.sz = sizeof(stash_snapshot_writer_opts),
                      .max_parallelism = a->max_parallelism,
                      .size = a->size}};
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    unsigned long no = 0;
    tool_json_field f[32];
    for (ssize_t got; rc == 0 && (got = getline(&line, &cap, stdin)) >= 0;) {
        no++;
        if (strspn(line, " \t\r\n") == (size_t)got) continue;
        size_t at = 0;
        int n = -1;
        if (strlen(line) != (size_t)got)
            rc = shm_fail(-EINVAL, "stdin line %lu: a NUL byte at byte %zu", no, strlen(line));
        else if ((n = tool_json_object(line, f, 32, &at)) < 0)
            rc = shm_fail(-EINVAL, "stdin line %lu: not a JSON object (at byte %zu)", no, at);
        else
            rc = take_line(&l, &(load_line){f, n});
        for (int i = 0; i < l.nbytes; i++) free(l.bytes[i]);
        l.nbytes = 0;
        if (rc && n >= 0) {
            char why[512];
            snprintf(why, sizeof why, "%s", stash_errmsg());
            rc = shm_fail(rc, "stdin line %lu: %s", no, why);
        }
    }
    free(line);
    key_set_free(&l.broadcast);
    if (rc == 0 && !l.w) rc = stash_snapshot_writer_open(a->path[0], &l.o, &l.w);
    stash_snapshot_info out;
    if (rc == 0)
        rc = stash_snapshot_writer_commit(l.w, &out);
    else
        stash_snapshot_writer_abort(l.w);
    if (rc) return tool_fail("snapshot load", rc);
    printf("savepoint %llu %s: %u key groups, %u states, %lu lines\n", (unsigned long long)out.id,
           a->path[0], out.max_parallelism, out.nstates, no);
    return 0;
}

/* Parses a subcommand's options (getopt_long: --opt or --opt=value, in any
 * place) and its npaths paths. Returns 0, or the exit code (2) after saying
 * what was wrong. */
static int parse_args(int argc, char **argv, const char *cmd, const struct option *opts, int npaths,
                      snap_args *out)
{
    *out = (snap_args){.format = TOOL_HEX};
    opterr = 0;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        if (c == 'j')
            out->json = true;
        else if (c == 'v')
            out->verify = true;
        else if (c == 'f' && tool_parse_format(optarg, &out->format) == 0)
            ;
        else if ((c == 'd' || c == 'r' || c == 't') &&
                 (c == 'd'   ? out->ndrop
                  : c == 'r' ? out->nrename
                             : out->nttl) == SNAP_MAX_CHANGES) {
            fprintf(stderr, "stash snapshot %s: at most %d of %s\n", cmd, SNAP_MAX_CHANGES,
                    argv[optind - 1]);
            return 2;
        } else if (c == 'd')
            out->drop[out->ndrop++] = optarg;
        else if (c == 'r' && strchr(optarg, '=') && optarg[0] != '=' && strchr(optarg, '=')[1])
            out->rename[out->nrename++] = optarg;
        else if (c == 't' && strchr(optarg, '=') && optarg[0] != '=')
            out->ttl[out->nttl++] = optarg;
        else if (c == 'm') {
            uint64_t n;
            if (tool_parse_size(optarg, &n) < 0 || n == 0 || n > STASH_MAX_MAX_PARALLELISM) {
                fprintf(stderr, "stash snapshot %s: --max-parallelism takes 1 to %u, not '%s'\n",
                        cmd, STASH_MAX_MAX_PARALLELISM, optarg);
                return 2;
            }
            out->max_parallelism = (uint32_t)n;
        } else if (c == 's') {
            if (tool_parse_size(optarg, &out->size) < 0 || out->size == 0) {
                fprintf(stderr, "stash snapshot %s: --size takes bytes (64M, 2G), not '%s'\n", cmd,
                        optarg);
                return 2;
            }
        } else if (c == 'r' || c == 't') {
            fprintf(stderr, "stash snapshot %s: %s takes %s, not '%s'\n", cmd,
                    c == 'r' ? "--rename-state" : "--ttl", c == 'r' ? "OLD=NEW" : "STATE=DURATION",
                    optarg);
            return 2;
        } else if (c == 'f') {
            fprintf(stderr, "stash snapshot %s: --format takes text, hex or base64, not '%s'\n",
                    cmd, optarg);
            return 2;
        } else {
            fprintf(stderr, "stash snapshot %s: %s '%s'\n", cmd,
                    c == ':' ? "missing value for" : "unknown option", argv[optind - 1]);
            return 2;
        }
    }
    if (argc - optind != npaths) {
        fprintf(stderr, "stash snapshot %s: %s (see stash snapshot --help)\n", cmd,
                argc - optind < npaths ? "missing a directory" : "one directory too many");
        return 2;
    }
    for (int i = 0; i < npaths; i++) out->path[i] = argv[optind + i];
    return 0;
}

int tool_snapshot(int argc, char **argv)
{
    static const struct option ls_opts[] = {
        {"json", no_argument, NULL, 'j'}, {"verify", no_argument, NULL, 'v'}, {0}};
    static const struct option info_opts[] = {{"json", no_argument, NULL, 'j'}, {0}};
    static const struct option dump_opts[] = {{"format", required_argument, NULL, 'f'}, {0}};
    static const struct option no_opts[] = {{0}};
    static const struct option load_opts[] = {{"format", required_argument, NULL, 'f'},
                                              {"max-parallelism", required_argument, NULL, 'm'},
                                              {"size", required_argument, NULL, 's'},
                                              {0}};
    static const struct option rewrite_opts[] = {{"drop-state", required_argument, NULL, 'd'},
                                                 {"rename-state", required_argument, NULL, 'r'},
                                                 {"ttl", required_argument, NULL, 't'},
                                                 {"max-parallelism", required_argument, NULL, 'm'},
                                                 {0}};
    static const struct {
        const char *name;
        int paths;
        const struct option *opts;
    } cmds[] = {{"ls", 1, ls_opts},     {"info", 1, info_opts}, {"verify", 1, no_opts},
                {"dump", 1, dump_opts}, {"diff", 2, dump_opts}, {"rewrite", 2, rewrite_opts},
                {"load", 1, load_opts}};
    if (argc < 2 || tool_wants_help(argc, argv)) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    int which = -1;
    for (int i = 0; i < (int)(sizeof cmds / sizeof cmds[0]); i++)
        if (strcmp(argv[1], cmds[i].name) == 0) which = i;
    if (which < 0) {
        fprintf(stderr, "stash snapshot: unknown subcommand '%s'\n%s", argv[1], usage);
        return 2;
    }
    snap_args a;
    int rc =
        parse_args(argc - 1, argv + 1, cmds[which].name, cmds[which].opts, cmds[which].paths, &a);
    if (rc) return rc;
    ioe_engine *e;
    rc = ioe_engine_open(&(ioe_opts){0}, &e);
    if (rc < 0) {
        tool_fail("snapshot: I/O engine", rc);
        return 2;
    }
    switch (which) {
    case 0:
        rc = cmd_ls(&a, e);
        break;
    case 1:
        rc = cmd_info(&a, e);
        break;
    case 2:
        rc = cmd_verify(&a, e);
        break;
    case 3:
        rc = cmd_dump(&a);
        break;
    case 4:
        rc = cmd_diff(&a);
        break;
    case 5:
        rc = cmd_rewrite(&a);
        break;
    default:
        rc = cmd_load(&a);
        break;
    }
    ioe_engine_close(e);
    return rc;
}
