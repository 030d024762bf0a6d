/* SPDX-License-Identifier: MIT */
/*
 * fuzz_seed.c: stash-fuzz-seed DIR writes the fuzz targets' seed corpus into
 * DIR/checkpoint, DIR/block and DIR/load: real checkpoints, packed as
 * fuzz_common.h says, of every state kind (with TTL, namespaces and
 * operator state), full and LZ4-compressed, an incremental chain with
 * deletions, each also with its metadata to be sealed again, the first
 * block of each data file, and each checkpoint dumped as JSON lines in
 * every format (after the byte that picks it).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/checkpoint/checkpoints.h"
#include "include/stash.h"
#include "tests/fuzz/fuzz_common.h"

#define CAP (4u << 20)

static int sum_u64(const stash_bytes *acc, const stash_bytes *in, void *out, size_t cap,
                   size_t *len, void *ctx)
{
    (void)ctx;
    uint64_t a = 0, b = 0;
    if (acc->len == 8) memcpy(&a, acc->data, 8);
    if (in->len == 8) memcpy(&b, in->data, 8);
    *len = 8;
    if (cap < 8) return -ENOSPC;
    a += b;
    memcpy(out, &a, 8);
    return 0;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "stash-fuzz-seed: %s: %s (%s)\n", what, stash_strerror(rc), stash_errmsg());
    exit(1);
}

static uint8_t *slurp(const char *path, uint32_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        *n = 0;
        return NULL;
    }
    uint8_t *p = malloc(CAP);
    *n = p ? (uint32_t)fread(p, 1, CAP, f) : 0;
    fclose(f);
    return p;
}

static void spit(const char *dir, const char *name, const uint8_t *p, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) die(path, -EIO);
}

/* Packs checkpoint chk-id of dir (its shared files 1 .. nshared) as
 * NAME.bin, NAME-sealed.bin, and the first block of its first data file as
 * block/NAME.bin. */
static void pack(const char *out, const char *dir, uint64_t id, unsigned nshared, const char *name)
{
    uint8_t *buf = malloc(CAP);
    size_t len = 0;
    char path[512], sub[512];
    uint8_t *first = NULL;
    uint32_t first_n = 0;
    for (unsigned s = 0; s < 2 + nshared; s++) {
        if (s == 0)
            snprintf(path, sizeof path, "%s/chk-%llu/_metadata", dir, (unsigned long long)id);
        else if (s == 1)
            snprintf(path, sizeof path, "%s/chk-%llu/kg-data.dat", dir, (unsigned long long)id);
        else
            snprintf(path, sizeof path, "%s/shared/%u.dat", dir, s - 1);
        uint32_t n;
        uint8_t *p = slurp(path, &n);
        if (fuzz_pack_section(buf, CAP, &len, p, n) < 0) die(path, -E2BIG);
        if (s > 0 && !first && n >= sizeof(snap_block_hdr)) {
            first = p;
            first_n = n;
        } else {
            free(p);
        }
    }
    snprintf(sub, sizeof sub, "%s/checkpoint", out);
    snprintf(path, sizeof path, "%s.bin", name);
    spit(sub, path, buf, len);
    uint32_t l0;
    memcpy(&l0, buf, 4);
    l0 |= FUZZ_SEAL;
    memcpy(buf, &l0, 4);
    snprintf(path, sizeof path, "%s-sealed.bin", name);
    spit(sub, path, buf, len);
    if (first) {
        snap_block_hdr h;
        memcpy(&h, first, sizeof h);
        size_t n = sizeof h + h.stored_len;
        snprintf(sub, sizeof sub, "%s/block", out);
        snprintf(path, sizeof path, "%s.bin", name);
        spit(sub, path, first, n < first_n ? n : first_n);
    }
    free(first);
    free(buf);
}

typedef struct job {
    stash_worker *w;
    stash_state *v, *l, *m, *r, *ttl, *ol, *b;
} job;

static void open_job(const char *name, job *j)
{
    int rc = stash_worker_open(name, NULL, &j->w);
    if (rc) die("worker", rc);
    const stash_state_desc d[] = {
        {.sz = sizeof(stash_state_desc), .name = "value", .kind = STASH_VALUE},
        {.sz = sizeof(stash_state_desc), .name = "list", .kind = STASH_LIST},
        {.sz = sizeof(stash_state_desc), .name = "map", .kind = STASH_MAP},
        {.sz = sizeof(stash_state_desc), .name = "sum", .kind = STASH_REDUCING, .reduce = sum_u64},
        {.sz = sizeof(stash_state_desc),
         .name = "ttl-map",
         .kind = STASH_MAP,
         .ttl = {.ttl_ms = 3600000}},
        {.sz = sizeof(stash_state_desc), .name = "offsets", .kind = STASH_OP_LIST},
        {.sz = sizeof(stash_state_desc), .name = "rules", .kind = STASH_OP_BROADCAST},
    };
    stash_state **out[] = {&j->v, &j->l, &j->m, &j->r, &j->ttl, &j->ol, &j->b};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        if ((rc = stash_state_get(j->w, &d[i], out[i])) < 0) die(d[i].name, rc);
}

/* Writes keys [from, to), deleting every third of [0, del). */
static void write_keys(job *j, uint64_t from, uint64_t to, uint64_t del)
{
    for (uint64_t k = from; k < to; k++) {
        stash_key_set(j->w, &k, sizeof k);
        stash_state_namespace(j->v, k % 2 ? "w1" : "w2", 2);
        stash_value_put(j->v, &k, sizeof k);
        stash_list_add(j->l, &k, sizeof k);
        stash_list_add(j->l, "x", 1);
        stash_map_put(j->m, "a", 1, &k, sizeof k);
        stash_map_put(j->m, &k, sizeof k, "b", 1);
        stash_merging_add(j->r, &k, sizeof k);
        stash_map_put(j->ttl, "t", 1, &k, sizeof k);
    }
    for (uint64_t k = 0; k < del; k += 3) {
        stash_key_set(j->w, &k, sizeof k);
        stash_state_clear(j->l);
        stash_map_remove(j->m, "a", 1);
    }
    stash_bytes off = {&to, sizeof to};
    stash_op_list_update(j->ol, &off, 1);
    stash_broadcast_put(j->b, "rule", 4, &from, sizeof from);
}

static void checkpoint(const char *name)
{
    stash_arena *a;
    int rc = stash_arena_open(name, NULL, &a);
    stash_checkpoint_info info;
    if (rc == 0) rc = stash_checkpoint(a, 60000, &info);
    if (rc) die(info.detail, rc);
    stash_arena_close(a);
}

int tool_snapshot(int argc, char **argv);

/* `stash snapshot dump` of checkpoint id of dir in each format, into
 * OUT/load/TAG-FORMAT after the byte fuzz_load reads the format from. */
static void dump_seeds(const char *out, const char *dir, uint64_t id, const char *tag)
{
    static const char *const formats[] = {"text", "hex", "base64"};
    char chk[512], path[512];
    snprintf(chk, sizeof chk, "%s/chk-%llu", dir, (unsigned long long)id);
    for (uint8_t f = 0; f < 3; f++) {
        snprintf(path, sizeof path, "%s/load/%s-%s", out, tag, formats[f]);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write(fd, &f, 1) != 1) die(path, -errno);
        fflush(stdout);
        int saved = dup(1);
        dup2(fd, 1);
        int rc = tool_snapshot(
            5, (char *[]){"snapshot", "dump", chk, "--format", (char *)formats[f], NULL});
        fflush(stdout);
        dup2(saved, 1);
        close(saved);
        close(fd);
        if (rc) die(path, -EIO);
    }
}

static void run(const char *out, const char *tag, int incremental, int lz4)
{
    char name[64], dir[256];
    snprintf(name, sizeof name, "fuzz-seed-%d-%s", (int)getpid(), tag);
    snprintf(dir, sizeof dir, "/tmp/stash-fuzz-seed-XXXXXX");
    if (!mkdtemp(dir)) die("mkdtemp", -errno);
    stash_service *s;
    stash_arena_opts ao = {.sz = sizeof(stash_arena_opts), .size = 16u << 20, .max_parallelism = 8};
    int rc = stash_service_start(name,
                                 &(stash_service_opts){.sz = sizeof(stash_service_opts),
                                                       .arena = &ao,
                                                       .dir = dir,
                                                       .incremental = incremental,
                                                       .lz4 = lz4},
                                 &s);
    if (rc) die("service", rc);
    job j;
    open_job(name, &j);
    write_keys(&j, 0, 24, 0);
    stash_worker_close(j.w);
    checkpoint(name);
    if (incremental) {
        open_job(name, &j);
        write_keys(&j, 20, 30, 24);
        stash_worker_close(j.w);
        checkpoint(name);
    }
    stash_service_stop(s);
    stash_arena_destroy(name, NULL);
    pack(out, dir, incremental ? 2 : 1, incremental ? 2 : 0, tag);
    if (!lz4) dump_seeds(out, dir, incremental ? 2 : 1, tag); /* compressed: the same lines */
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) die(cmd, -EIO);
}

int main(int argc, char **argv)
{
    if (argc != 2 || !strcmp(argv[1], "--help")) {
        fprintf(argc == 2 ? stdout : stderr,
                "usage: stash-fuzz-seed DIR\nWrites the fuzz targets' seed corpus into "
                "DIR/checkpoint, DIR/block and DIR/load.\n");
        return argc == 2 ? 0 : 2;
    }
    char sub[512];
    mkdir(argv[1], 0755);
    snprintf(sub, sizeof sub, "%s/checkpoint", argv[1]);
    mkdir(sub, 0755);
    snprintf(sub, sizeof sub, "%s/block", argv[1]);
    mkdir(sub, 0755);
    snprintf(sub, sizeof sub, "%s/load", argv[1]);
    mkdir(sub, 0755);
    run(argv[1], "full", 0, 0);
    run(argv[1], "full-lz4", 0, 1);
    run(argv[1], "incremental-lz4", 1, 1);
    run(argv[1], "incremental", 1, 0);
    return 0;
}
