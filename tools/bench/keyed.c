/* SPDX-License-Identifier: MIT */
/*
 * keyed.c: `stash bench keyed`: keyed-state operations per second and
 * their latency, stash beside its peers (peers.c) replaying the same
 * pre-generated sequences in the same run: ValueState under YCSB A, B, C and
 * F, uniform and zipfian; ListState add and get; MapState put and get. Also
 * one worker process against two, and the bytes an entry costs beyond its
 * key and value. docs/benchmarks.md says how to read it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <sched.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "include/stash.h"
#include "tools/bench/peers.h"
#include "tools/bench/raw.h"
#include "tools/bench/bench.h"
#include "tools/bench/ycsb.h"

#define KEY_LEN 8
#define VALUE_LEN BENCH_VALUE_LEN
#define LIST_LEN 4               /* elements of each list that list/get reads */
#define MAP_ENTRIES 10           /* user keys per map */
#define PIPELINE 64              /* commands per batch for redis-pipelined */
#define BATCH_MAX 128            /* the largest batch of the batched cases */
#define VALUE_POOL 4096          /* distinct random values that writes cycle through */
#define ARENA_NAME "bench-keyed" /* only checked: the arena lives at the path given */

enum {
    SYS_STASH,
    SYS_RAW,
    SYS_RAW_LP,
    SYS_RAW_INDEX,
    SYS_LMDB,
    SYS_ROCKSDB,
    SYS_ROCKSDB_FLINK,
    SYS_REDIS,
    NSYS
};
static const char *const sys_names[NSYS] = {"stash",         "raw-table",      "raw-lp",
                                            "raw-index",     "lmdb",           "rocksdb",
                                            "rocksdb-flink", "redis-pipelined"};

enum { GROUP_VALUE, GROUP_LIST, GROUP_MAP, NGROUPS };
static const char *const group_names[NGROUPS] = {"value", "list", "map"};

typedef struct keyed_case {
    const char *name;
    int group;
    ycsb_kind first, second;
    double first_share;
    bool zipfian;
    unsigned batch; /* > 1: stash and the raw table run it in batches of this many; 1 not */
} keyed_case;

static const keyed_case cases[] = {
    {"value/ycsb-a/uniform", GROUP_VALUE, YCSB_GET, YCSB_PUT, 0.5, false, 1},
    {"value/ycsb-a/zipfian", GROUP_VALUE, YCSB_GET, YCSB_PUT, 0.5, true, 1},
    {"value/ycsb-b/uniform", GROUP_VALUE, YCSB_GET, YCSB_PUT, 0.95, false, 1},
    {"value/ycsb-b/zipfian", GROUP_VALUE, YCSB_GET, YCSB_PUT, 0.95, true, 1},
    {"value/ycsb-c/uniform", GROUP_VALUE, YCSB_GET, YCSB_GET, 1, false, 1},
    {"value/ycsb-c/zipfian", GROUP_VALUE, YCSB_GET, YCSB_GET, 1, true, 1},
    {"value/ycsb-f/uniform", GROUP_VALUE, YCSB_GET, YCSB_RMW, 0.5, false, 1},
    {"value/ycsb-f/zipfian", GROUP_VALUE, YCSB_GET, YCSB_RMW, 0.5, true, 1},
    {"value/ycsb-a/uniform/batch8", GROUP_VALUE, YCSB_GET, YCSB_PUT, 0.5, false, 8},
    {"value/ycsb-a/uniform/batch32", GROUP_VALUE, YCSB_GET, YCSB_PUT, 0.5, false, 32},
    {"value/ycsb-a/uniform/batch128", GROUP_VALUE, YCSB_GET, YCSB_PUT, 0.5, false, 128},
    {"value/ycsb-c/uniform/batch8", GROUP_VALUE, YCSB_GET, YCSB_GET, 1, false, 8},
    {"value/ycsb-c/uniform/batch32", GROUP_VALUE, YCSB_GET, YCSB_GET, 1, false, 32},
    {"value/ycsb-c/uniform/batch128", GROUP_VALUE, YCSB_GET, YCSB_GET, 1, false, 128},
    {"list/get", GROUP_LIST, YCSB_LIST_GET, YCSB_LIST_GET, 1, false, 1},
    {"list/add", GROUP_LIST, YCSB_LIST_ADD, YCSB_LIST_ADD, 1, false, 1},
    {"map/get", GROUP_MAP, YCSB_MAP_GET, YCSB_MAP_GET, 1, false, 1},
    {"map/put", GROUP_MAP, YCSB_MAP_PUT, YCSB_MAP_PUT, 1, false, 1},
};
#define NCASES (sizeof cases / sizeof cases[0])

static volatile sig_atomic_t interrupted;

static void on_interrupt(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* Interrupted, or nobody reads the report any more (SIGPIPE is ignored so
 * that the bench still cleans up after itself). */
static bool must_stop(void)
{
    return interrupted || ferror(stdout);
}

/* Latency samples in ns, pooled over the repetitions of one case. */
typedef struct lat_pool {
    uint64_t *ns;
    uint64_t n, cap;
} lat_pool;

/* What one system should hold, replayed after each of its passes: per
 * entry (a key's value, or one map entry) the first 8 bytes of its value
 * and the value of the pool the rest is from. Lists are never changed
 * where they are read (list/add appends to lists of fresh keys). */
typedef struct model {
    uint64_t *first8;
    uint16_t *pool;
    uint64_t n;
} model;

/* One system in the current group: running, or why not. */
typedef struct sys_run {
    kv_sys *sys;
    model m;
    char why[320];
} sys_run;

typedef struct keyed_bench {
    bench_opts o;
    stash_backend backend; /* lmdb: stash's lmdb backend beside LMDB and RocksDB, on disk */
    uint64_t keys;         /* key indices 0 .. keys-1 */
    uint64_t ops;          /* operations in a case's sequence: every pass runs them all */
    char dir[512];
    char arena_dir[64]; /* lmdb: the arena, in memory, beside the environments on disk */
    peer_redis_server *redis;
    char redis_why[256];
    uint64_t keyspace; /* list/add passes each append to lists of a fresh key space */
    /* --memory-budget (lmdb): bytes of cached pages the data may take
     * after loading; UINT64_MAX a quarter of its payload; 0 none */
    uint64_t budget_bytes;
    bench_budget budget;
    uint8_t values[VALUE_POOL][VALUE_LEN]; /* random: no system may compress them away */
    uint8_t buf[VALUE_LEN];
    uint8_t *log; /* the read log of a pass: ops reads of up to a list's bytes */
} keyed_bench;

/* What a pass did: operations, nanoseconds, and the sum of its reads'
 * checksums (bench_checksum). */
typedef struct pass_out {
    uint64_t done, ns, sum;
} pass_out;

/* ------------------------------------------------------------------------ */
/* stash behind the peers' interface: a worker, its current key, its states. */

typedef struct stash_sys {
    kv_sys base;
    stash_worker *w;
    stash_state *value, *list, *map;
    stash_batch *batch; /* of value state accesses, BATCH_MAX events */
    bool in_batch;      /* the batch sets each operation's key */
    /* With the lmdb store: a barrier (a commit) after this many writes, as
     * often as the LMDB peer commits; 0 on the heap. */
    unsigned commit_every, writes;
    stash_arena_opts aopts;
    char path[PATH_MAX];
    char lmdb_dir[PATH_MAX];
} stash_sys;

static int stash_sys_fail(kv_sys *s, const char *what, int rc)
{
    if (rc == STASH_ENOTFOUND) return -ENOENT;
    snprintf(s->error, sizeof s->error, "%s: %s (%s)", what, stash_strerror(rc), stash_errmsg());
    return rc;
}

static int copy_view(const stash_bytes *v, void *out, size_t cap, size_t *len)
{
    return copy_out(v->data, v->len, out, cap, len);
}

static int stash_sys_value_get(kv_sys *s, uint64_t key, void *out, size_t cap, size_t *len)
{
    stash_sys *t = (stash_sys *)s;
    stash_bytes v;
    /* One call an access, where no batch set the key. */
    int rc = t->in_batch ? stash_value_get(t->value, &v)
                         : stash_value_get_key(t->value, &key, KEY_LEN, &v);
    return rc ? stash_sys_fail(s, "stash_value_get", rc) : copy_view(&v, out, cap, len);
}

static int stash_sys_sync(kv_sys *s);

/* Counts a write; with the lmdb store, commits every commit_every (a
 * batch's after the batch). */
static int stash_sys_wrote(stash_sys *t)
{
    if (!t->commit_every || ++t->writes < t->commit_every || t->in_batch) return 0;
    t->writes = 0;
    return stash_sys_sync(&t->base);
}

static int stash_sys_value_put(kv_sys *s, uint64_t key, const void *v, size_t len)
{
    stash_sys *t = (stash_sys *)s;
    int rc = t->in_batch ? stash_value_put(t->value, v, len)
                         : stash_value_put_key(t->value, &key, KEY_LEN, v, len);
    return rc ? stash_sys_fail(s, "stash_value_put", rc) : stash_sys_wrote(t);
}

static int stash_sys_list_add(kv_sys *s, uint64_t key, const void *v, size_t len)
{
    stash_sys *t = (stash_sys *)s;
    int rc = stash_key_set(t->w, &key, KEY_LEN);
    if (rc == 0) rc = stash_list_add(t->list, v, len);
    return rc ? stash_sys_fail(s, "stash_list_add", rc) : 0;
}

static int stash_sys_list_get(kv_sys *s, uint64_t key, void *out, size_t cap, size_t *len)
{
    stash_sys *t = (stash_sys *)s;
    stash_iter it;
    stash_bytes v;
    size_t off = 0, n = 0;
    int rc = stash_key_set(t->w, &key, KEY_LEN);
    if (rc == 0) rc = stash_list_get(t->list, &it);
    while (rc == 0 && (rc = stash_iter_next(&it, NULL, &v)) == 1) {
        rc = copy_view(&v, (uint8_t *)out + off, cap - off, &n);
        off += n;
    }
    *len = off;
    return rc < 0 ? stash_sys_fail(s, "stash_list_get", rc) : 0;
}

static int stash_sys_map_put(kv_sys *s, uint64_t key, uint64_t ukey, const void *v, size_t len)
{
    stash_sys *t = (stash_sys *)s;
    int rc = stash_key_set(t->w, &key, KEY_LEN);
    if (rc == 0) rc = stash_map_put(t->map, &ukey, sizeof ukey, v, len);
    return rc ? stash_sys_fail(s, "stash_map_put", rc) : 0;
}

static int stash_sys_map_get(kv_sys *s, uint64_t key, uint64_t ukey, void *out, size_t cap,
                             size_t *len)
{
    stash_sys *t = (stash_sys *)s;
    stash_bytes v;
    int rc = stash_key_set(t->w, &key, KEY_LEN);
    if (rc == 0) rc = stash_map_get(t->map, &ukey, sizeof ukey, &v);
    return rc ? stash_sys_fail(s, "stash_map_get", rc) : copy_view(&v, out, cap, len);
}

typedef struct stash_batch_ctx {
    stash_sys *t;
    kv_batch_fn *fn;
    void *ctx;
} stash_batch_ctx;

static int stash_sys_event(stash_worker *w, void *event, void *ctx)
{
    (void)w;
    stash_batch_ctx *c = ctx;
    return c->fn(&c->t->base, (size_t)(uintptr_t)event, c->ctx);
}

/* A batch of value operations: stash_batch_run with each operation an
 * event, its index the event's pointer. */
static int stash_sys_run_batch(kv_sys *s, const uint64_t *keys, size_t n, kv_batch_fn *fn,
                               void *ctx)
{
    stash_sys *t = (stash_sys *)s;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = stash_batch_add(t->batch, &keys[i], KEY_LEN, (void *)(uintptr_t)i);
    if (rc < 0) return stash_sys_fail(s, "stash_batch_add", rc);
    stash_batch_ctx c = {t, fn, ctx};
    int results[BATCH_MAX];
    t->in_batch = true;
    rc = stash_batch_run(t->batch, stash_sys_event, &c, results);
    t->in_batch = false;
    if (rc < 0) return stash_sys_fail(s, "stash_batch_run", rc);
    for (size_t i = 0; rc > 0 && i < n; i++)
        if (results[i] < 0) return results[i]; /* the operation said what failed */
    if (t->commit_every && t->writes >= t->commit_every) {
        t->writes = 0;
        return stash_sys_sync(s);
    }
    return 0;
}

/* A barrier, as a worker reaches between records: with lmdb it commits. */
static int stash_sys_sync(kv_sys *s)
{
    stash_event ev;
    int rc = stash_barrier(((stash_sys *)s)->w, &ev);
    return rc < 0 ? stash_sys_fail(s, "stash_barrier", rc) : 0;
}

/* The key-group heaps' used bytes over every key group. */
static int stash_sys_footprint(kv_sys *s, uint64_t *bytes)
{
    stash_arena *a = stash_worker_arena(((stash_sys *)s)->w);
    stash_arena_info info;
    stash_arena_info_get(a, &info);
    *bytes = 0;
    for (uint32_t kg = 0; kg < info.max_parallelism; kg++) {
        stash_kg_usage u;
        int rc = stash_kg_usage_get(a, kg, &u);
        if (rc < 0) return stash_sys_fail(s, "stash_kg_usage_get", rc);
        *bytes += u.used_bytes;
    }
    return 0;
}

static void stash_sys_close(kv_sys *s)
{
    stash_sys *t = (stash_sys *)s;
    stash_batch_destroy(t->batch);
    stash_worker_close(t->w);
    /* The environments are on disk: they go with the arena. */
    if (t->lmdb_dir[0]) stash_arena_destroy(ARENA_NAME, &t->aopts);
    free(t);
}

static const kv_ops stash_sys_ops = {
    .value_get = stash_sys_value_get,
    .value_put = stash_sys_value_put,
    .list_add = stash_sys_list_add,
    .list_get = stash_sys_list_get,
    .map_put = stash_sys_map_put,
    .map_get = stash_sys_map_get,
    .run_batch = stash_sys_run_batch,
    .sync = stash_sys_sync,
    .footprint = stash_sys_footprint,
    .close = stash_sys_close,
};

/* Joins the arena at path as worker index of p and registers the states;
 * with size > 0, creates the arena first. Its file stays when the worker
 * closes: the group's directory goes with it. */
static int stash_sys_open(const char *path, uint64_t size, uint32_t index, uint32_t p,
                          const char *lmdb_dir, kv_sys **out, char *why, size_t whylen)
{
    stash_sys *t = calloc(1, sizeof *t);
    if (!t) return snprintf(why, whylen, "out of memory"), -ENOMEM;
    t->base = (kv_sys){.ops = &stash_sys_ops, .name = "stash", .batch = 1};
    snprintf(t->path, sizeof t->path, "%s", path);
    snprintf(t->lmdb_dir, sizeof t->lmdb_dir, "%s", lmdb_dir ? lmdb_dir : "");
    t->aopts = (stash_arena_opts){.sz = sizeof(stash_arena_opts),
                                  .path = t->path,
                                  .size = size,
                                  .backend = lmdb_dir ? STASH_BACKEND_LMDB : STASH_BACKEND_HEAP,
                                  .lmdb_dir = lmdb_dir ? t->lmdb_dir : NULL};
    t->commit_every = lmdb_dir ? PEER_LMDB_COMMIT_EVERY : 0;
    const char *what = "stash_arena_create";
    int rc = 0;
    if (size) {
        stash_arena *a;
        rc = stash_arena_create(ARENA_NAME, &t->aopts, &a);
        if (rc == 0) stash_arena_close(a);
    }
    if (rc == 0) {
        what = "stash_worker_open";
        stash_worker_opts wopts = {
            .sz = sizeof(stash_worker_opts), .index = index, .parallelism = p, .arena = &t->aopts};
        rc = stash_worker_open(ARENA_NAME, &wopts, &t->w);
    }
    const stash_state_desc descs[] = {
        {.sz = sizeof(stash_state_desc), .name = "value", .kind = STASH_VALUE},
        {.sz = sizeof(stash_state_desc), .name = "list", .kind = STASH_LIST},
        {.sz = sizeof(stash_state_desc), .name = "map", .kind = STASH_MAP}};
    stash_state **states[] = {&t->value, &t->list, &t->map};
    for (int i = 0; i < 3 && rc == 0; i++) {
        what = "stash_state_get";
        rc = stash_state_get(t->w, &descs[i], states[i]);
    }
    if (rc == 0) {
        what = "stash_batch_create";
        stash_batch_opts bo = {.sz = sizeof(stash_batch_opts),
                               .capacity = BATCH_MAX,
                               .states = &t->value,
                               .nstates = 1};
        rc = stash_batch_create(t->w, &bo, &t->batch);
    }
    if (rc < 0) {
        snprintf(why, whylen, "%s: %s (%s)", what, stash_strerror(rc), stash_errmsg());
        stash_sys_close(&t->base);
        return rc;
    }
    *out = &t->base;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Passes: one system replays a sequence. Each system's pass is a loop of    */
/* its own (PASS below), the operations' calls resolved when it is compiled  */
/* for stash and the raw tables, whose operations take tens of nanoseconds; */
/* the other peers' take microseconds and go through their table.           */

/* What a pass replays: ops[i] on the key keys[i]; batched > 1 in batches of
 * that many; lat non-NULL: the latency pass, every step (an operation, a
 * pipelined batch or a batch) timed, never a throughput pass. Every read
 * copies its value into the read log, one after another (log_len bytes
 * each: a value, or a list's elements), as a caller that deserializes it
 * would; the log is checked once the pass is over (check_log), so that no
 * check takes the processor inside the timed loop. */
typedef struct pass_in {
    const ycsb_op *ops;
    const uint64_t *keys;
    uint64_t n;
    unsigned batched;
    lat_pool *lat;
    uint8_t *log;
} pass_in;

/* The bytes each read of a sequence copies into the log. */
static size_t read_len(const ycsb_op *ops)
{
    return ops[0].kind == YCSB_LIST_GET ? LIST_LEN * VALUE_LEN : VALUE_LEN;
}

static inline __attribute__((always_inline)) int do_op(keyed_bench *b, kv_sys *s, const kv_ops *k,
                                                       const ycsb_op *op, uint64_t key, uint64_t i,
                                                       uint8_t **log)
{
    size_t len = 0, want = VALUE_LEN;
    int rc = 0;
    uint8_t *value = b->values[i % VALUE_POOL];
    switch ((ycsb_kind)op->kind) {
    case YCSB_GET:
        rc = k->value_get(s, key, *log, VALUE_LEN, &len);
        break;
    case YCSB_PUT:
        memcpy(value, &i, sizeof i); /* every write differs from the last */
        return k->value_put(s, key, value, VALUE_LEN);
    case YCSB_RMW:
        rc = k->value_get(s, key, *log, VALUE_LEN, &len);
        if (rc == 0 && len == VALUE_LEN) {
            uint64_t x;
            memcpy(b->buf, *log, VALUE_LEN);
            memcpy(&x, b->buf, sizeof x);
            x++;
            memcpy(b->buf, &x, sizeof x);
            rc = k->value_put(s, key, b->buf, VALUE_LEN);
        }
        break;
    case YCSB_LIST_ADD:
        memcpy(value, &i, sizeof i);
        return k->list_add(s, key, value, VALUE_LEN);
    case YCSB_LIST_GET:
        rc = k->list_get(s, key, *log, LIST_LEN * VALUE_LEN, &len);
        want = LIST_LEN * VALUE_LEN;
        break;
    case YCSB_MAP_PUT:
        memcpy(value, &i, sizeof i);
        return k->map_put(s, key, op->sub, value, VALUE_LEN);
    case YCSB_MAP_GET:
        rc = k->map_get(s, key, op->sub, *log, VALUE_LEN, &len);
        break;
    }
    if (rc == -ENOENT) snprintf(s->error, sizeof s->error, "key index %u: not found", op->key);
    /* A pipelined read only queues its command: sync() sums its reply. */
    if (rc == 0 && s->batch == 1) {
        if (len != want) {
            snprintf(s->error, sizeof s->error, "key index %u: read %zu bytes, expected %zu",
                     op->key, len, want);
            return -EIO;
        }
        *log += want;
    }
    return rc;
}

/* The sum of the checksums of the reads a pass logged, from log to end. */
static uint64_t check_log(const uint8_t *log, const uint8_t *end, size_t len)
{
    uint64_t sum = 0;
    for (; log + len <= end; log += len) sum += bench_checksum(log, len);
    return sum;
}

/* The operations of one batch: ops[i] is the batch's i-th. */
typedef struct batch_ops {
    keyed_bench *b;
    const ycsb_op *ops;
    const uint64_t *keys;
    uint64_t first;
    uint8_t *log;
} batch_ops;

typedef int pass_fn(keyed_bench *b, kv_sys *s, const pass_in *in, pass_out *out);

/* One step of a pass: ops[i] to ops[end - 1], as one batch of the
 * system's (batched), or one at a time and then, pipelined, their replies
 * collected. */
static inline __attribute__((always_inline)) int
pass_step(keyed_bench *b, kv_sys *s, const kv_ops *k, kv_batch_fn *op, const pass_in *in,
          bool batched, bool piped, uint64_t i, uint64_t end, uint8_t **log)
{
    int rc = 0;
    if (batched) {
        batch_ops o = {b, in->ops + i, in->keys + i, i, *log};
        rc = k->run_batch(s, in->keys + i, end - i, op, &o);
        *log = o.log;
        return rc;
    }
    for (; i < end && rc == 0; i++) rc = do_op(b, s, k, &in->ops[i], in->keys[i], i, log);
    return rc == 0 && piped ? k->sync(s) : rc;
}

/* A system's pass over in->ops, its operations k (a constant where the
 * compiler can resolve its calls), each batch's operations run by op.
 * timed, batched and piped are constants where it is inlined, so that a
 * throughput pass's loop holds nothing but the operations: no clock read,
 * and a look at whether to stop only every CHUNK operations. */
#define CHUNK 4096u
static inline __attribute__((always_inline)) int pass_loop(keyed_bench *b, kv_sys *s,
                                                           const kv_ops *k, kv_batch_fn *op,
                                                           const pass_in *in, bool timed,
                                                           bool batched, bool piped, pass_out *out)
{
    uint64_t i = 0, n = in->n, replies = s->sum;
    unsigned step = batched ? in->batched : piped ? s->batch : 1;
    lat_pool *lat = in->lat;
    uint8_t *log = in->log;
    int rc = 0;
    uint64_t t0 = bench_now_ns();
    while (i < n && rc == 0) {
        if (must_stop()) {
            rc = -EINTR;
            break;
        }
        uint64_t stop = i + CHUNK < n ? i + CHUNK : n;
        while (i < stop && rc == 0) {
            uint64_t end = i + step < n ? i + step : n;
            if (!timed) {
                rc = pass_step(b, s, k, op, in, batched, piped, i, end, &log);
            } else {
                uint64_t t = bench_now_ns();
                rc = pass_step(b, s, k, op, in, batched, piped, i, end, &log);
                if (lat->n < lat->cap) lat->ns[lat->n++] = bench_now_ns() - t;
            }
            i = end;
        }
    }
    if (rc == 0) rc = k->sync(s);
    uint64_t ns = bench_now_ns() - t0;
    *out = (pass_out){.done = rc == 0 ? i : 0,
                      .ns = ns,
                      .sum = check_log(in->log, log, read_len(in->ops)) + s->sum - replies};
    return rc;
}

/* The pass of a system whose operations are OPS (an expression of s), in
 * the variant its row needs. */
#define PASS(NAME, OPS)                                                                            \
    static int NAME##_batch_op(kv_sys *s, size_t i, void *ctx)                                     \
    {                                                                                              \
        batch_ops *o = ctx;                                                                        \
        return do_op(o->b, s, OPS, &o->ops[i], o->keys[i], o->first + i, &o->log);                 \
    }                                                                                              \
    static __attribute__((noinline)) int NAME##_pass(keyed_bench *b, kv_sys *s, const pass_in *in, \
                                                     pass_out *out)                                \
    {                                                                                              \
        bool timed = in->lat != NULL, batched = in->batched > 1, piped = s->batch > 1;             \
        if (piped)                                                                                 \
            return timed ? pass_loop(b, s, OPS, NAME##_batch_op, in, true, false, true, out)       \
                         : pass_loop(b, s, OPS, NAME##_batch_op, in, false, false, true, out);     \
        if (batched)                                                                               \
            return timed ? pass_loop(b, s, OPS, NAME##_batch_op, in, true, true, false, out)       \
                         : pass_loop(b, s, OPS, NAME##_batch_op, in, false, true, false, out);     \
        return timed ? pass_loop(b, s, OPS, NAME##_batch_op, in, true, false, false, out)          \
                     : pass_loop(b, s, OPS, NAME##_batch_op, in, false, false, false, out);        \
    }

PASS(stash, &stash_sys_ops)
PASS(raw_direct, &raw_direct_ops)
PASS(raw_lp, &raw_lp_ops)
PASS(raw_index, &raw_index_ops)
PASS(peer, s->ops)

/* The pass that runs system s. */
static pass_fn *pass_of(const kv_sys *s)
{
    return s->ops == &stash_sys_ops    ? stash_pass
           : s->ops == &raw_direct_ops ? raw_direct_pass
           : s->ops == &raw_lp_ops     ? raw_lp_pass
           : s->ops == &raw_index_ops  ? raw_index_pass
                                       : peer_pass;
}

/* ------------------------------------------------------------------------ */
/* Checks: every read of every pass summed, and the sum compared with what  */
/* a replay of the system's writes on its model says it must be.            */

static void model_free(model *m)
{
    free(m->first8);
    free(m->pool);
    *m = (model){0};
}

/* The model of a group's data as load_one writes it. */
static int model_init(model *m, const keyed_bench *b, int group)
{
    m->n = group == GROUP_MAP ? b->keys * MAP_ENTRIES : group == GROUP_VALUE ? b->keys : 0;
    m->first8 = malloc(m->n * sizeof *m->first8 + 1);
    m->pool = malloc(m->n * sizeof *m->pool + 1);
    if (!m->first8 || !m->pool) return model_free(m), -ENOMEM;
    for (uint64_t e = 0; e < m->n; e++) {
        uint64_t index = group == GROUP_MAP ? e / MAP_ENTRIES : e;
        m->first8[e] = index;
        m->pool[e] = (uint16_t)(index % VALUE_POOL);
    }
    return 0;
}

/* Entry e's value as the model has it, VALUE_LEN bytes into out. */
static void model_value(const keyed_bench *b, const model *m, uint64_t e, uint8_t *out)
{
    memcpy(out, b->values[m->pool[e]], VALUE_LEN);
    memcpy(out, &m->first8[e], sizeof m->first8[e]);
}

/* Replays in on m: the sum of the checksums its reads must have. */
static uint64_t model_pass(const keyed_bench *b, model *m, const pass_in *in)
{
    uint8_t buf[LIST_LEN * VALUE_LEN];
    uint64_t sum = 0;
    for (uint64_t i = 0; i < in->n; i++) {
        const ycsb_op *op = &in->ops[i];
        uint64_t e = op->kind == YCSB_MAP_GET || op->kind == YCSB_MAP_PUT
                         ? (uint64_t)op->key * MAP_ENTRIES + op->sub
                         : op->key;
        switch ((ycsb_kind)op->kind) {
        case YCSB_GET:
        case YCSB_MAP_GET:
            model_value(b, m, e, buf);
            sum += bench_checksum(buf, VALUE_LEN);
            break;
        case YCSB_RMW:
            model_value(b, m, e, buf);
            sum += bench_checksum(buf, VALUE_LEN);
            m->first8[e]++;
            break;
        case YCSB_PUT:
        case YCSB_MAP_PUT:
            m->first8[e] = i;
            m->pool[e] = (uint16_t)(i % VALUE_POOL);
            break;
        case YCSB_LIST_GET:
            for (unsigned j = 0; j < LIST_LEN; j++) {
                uint64_t index = op->key;
                memcpy(buf + j * VALUE_LEN, b->values[index % VALUE_POOL], VALUE_LEN);
                memcpy(buf + j * VALUE_LEN, &index, sizeof index);
            }
            sum += bench_checksum(buf, sizeof buf);
            break;
        case YCSB_LIST_ADD:
            break;
        }
    }
    return sum;
}

/* Fills keys[0 .. n-1] with the keys of ops: list/add's in a key space
 * of their own each pass (fresh lists), the others' the loaded ones. */
static void fill_keys(keyed_bench *b, const ycsb_op *ops, uint64_t n, uint64_t *keys)
{
    uint64_t space = n && ops[0].kind == YCSB_LIST_ADD ? ++b->keyspace << 32 : 0;
    for (uint64_t i = 0; i < n; i++) keys[i] = bench_key(space | ops[i].key);
}

/* ------------------------------------------------------------------------ */
/* Groups: every system opened fresh and loaded with the same data.          */

static uint64_t payload_bytes(const keyed_bench *b, int group)
{
    uint64_t entry = KEY_LEN + VALUE_LEN;
    if (group == GROUP_VALUE) return b->keys * entry;
    if (group == GROUP_MAP) return b->keys * MAP_ENTRIES * (entry + KEY_LEN);
    /* list/get's lists, and every list/add pass appending to a fresh key space */
    return b->keys * LIST_LEN * VALUE_LEN + (uint64_t)(b->o.reps + 1) * b->ops * entry;
}

static void fail_sys(sys_run *r, const char *stage)
{
    snprintf(r->why, sizeof r->why, "failed: %s: %s", stage, r->sys->error);
    r->sys->ops->close(r->sys);
    r->sys = NULL;
    model_free(&r->m);
}

/* One pass of ops on run's system (batched > 1 in batches), its reads
 * checked against its model; lat: the latency pass. Returns 0 with *out,
 * or -1 after failing the system (what names the pass). */
static int run_row(keyed_bench *b, sys_run *run, unsigned batched, const ycsb_op *ops,
                   uint64_t *keys, lat_pool *lat, pass_out *out, const char *what)
{
    fill_keys(b, ops, b->ops, keys);
    pass_in in = {ops, keys, b->ops, batched, lat, b->log};
    kv_sys *s = run->sys;
    /* For the tests of the checks: STASH_BENCH_CORRUPT names a system whose
     * value of the first key read is changed behind its model's back. */
    const char *corrupt = getenv("STASH_BENCH_CORRUPT");
    for (uint64_t i = 0; corrupt && strcmp(corrupt, s->name) == 0 && i < b->ops; i++)
        if (ops[i].kind == YCSB_GET || ops[i].kind == YCSB_MAP_GET) {
            uint8_t wrong[VALUE_LEN] = {0xEE};
            int rc = ops[i].kind == YCSB_GET
                         ? s->ops->value_put(s, keys[i], wrong, VALUE_LEN)
                         : s->ops->map_put(s, keys[i], ops[i].sub, wrong, VALUE_LEN);
            if (rc == 0) rc = s->ops->sync(s);
            if (rc < 0) return fail_sys(run, what), -1;
            break;
        }
    if (pass_of(s)(b, s, &in, out) < 0) {
        fail_sys(run, what);
        return -1;
    }
    uint64_t want = model_pass(b, &run->m, &in);
    if (out->sum != want) {
        snprintf(s->error, sizeof s->error,
                 "the reads' checksum is %016llx where a replay of the writes expects %016llx: "
                 "a read returned wrong contents",
                 (unsigned long long)out->sum, (unsigned long long)want);
        fail_sys(run, what);
        return -1;
    }
    return 0;
}

/* With --backend lmdb: stash's lmdb backend beside LMDB and RocksDB, which
 * keep their data on disk as it does. */
static bool peer_compared(const keyed_bench *b, int sys)
{
    return b->backend == STASH_BACKEND_HEAP || sys == SYS_STASH || sys == SYS_LMDB ||
           sys == SYS_ROCKSDB || sys == SYS_ROCKSDB_FLINK;
}

static void open_group(keyed_bench *b, int group, sys_run runs[NSYS])
{
    for (int i = 0; i < NSYS; i++) {
        if (!peer_compared(b, i)) {
            runs[i] = (sys_run){.sys = NULL, .why = "not in this comparison"};
            continue;
        }
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/%s-%s", b->dir, group_names[group], sys_names[i]);
        kv_plan plan = {.dir = dir,
                        .entries = group == GROUP_MAP ? b->keys * MAP_ENTRIES : b->keys,
                        .bytes = payload_bytes(b, group),
                        .value_len = VALUE_LEN,
                        .integer_keys = group != GROUP_MAP};
        /* Its model is set up once it is loaded, and freed whatever came of it. */
        runs[i] = (sys_run){.sys = NULL};
        char *why = runs[i].why;
        size_t wl = sizeof runs[i].why;
        if (i != SYS_REDIS && mkdir(dir, 0700) < 0) {
            snprintf(why, wl, "mkdir %.200s: %s", dir, strerror(errno));
            continue;
        }
        if (i == SYS_STASH && b->backend == STASH_BACKEND_LMDB) {
            char path[PATH_MAX], envs[PATH_MAX];
            snprintf(path, sizeof path, "%s/arena", b->arena_dir);
            snprintf(envs, sizeof envs, "%s/lmdb", dir);
            stash_sys_open(path, 64u << 20, 0, 1, envs, &runs[i].sys, why, wl);
        } else if (i == SYS_STASH) {
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/arena", dir);
            stash_sys_open(path, plan.bytes * 2 + (256ull << 20), 0, 1, NULL, &runs[i].sys, why,
                           wl);
        } else if ((i == SYS_RAW || i == SYS_RAW_LP || i == SYS_RAW_INDEX) && group == GROUP_LIST) {
            snprintf(why, wl, "its slots hold one %d-byte value: no lists", VALUE_LEN);
        } else if (i == SYS_RAW || i == SYS_RAW_LP || i == SYS_RAW_INDEX) {
            raw_open(&plan,
                     i == SYS_RAW      ? RAW_DIRECT
                     : i == SYS_RAW_LP ? RAW_LP
                                       : RAW_INDEX,
                     group == GROUP_MAP ? MAP_ENTRIES : 1, &runs[i].sys, why, wl);
        } else if (i == SYS_LMDB) {
            peer_lmdb_open(&plan, &runs[i].sys, why, wl);
        } else if ((i == SYS_ROCKSDB || i == SYS_ROCKSDB_FLINK) && b->budget_bytes) {
            snprintf(why, wl,
                     "not under --memory-budget: its block cache of 256 MiB alone is "
                     "memory the budget would have to hold");
        } else if (i == SYS_ROCKSDB || i == SYS_ROCKSDB_FLINK) {
            peer_rocksdb_open(&plan, i == SYS_ROCKSDB_FLINK, &runs[i].sys, why, wl);
        } else if (!b->redis) {
            snprintf(why, wl, "%s", b->redis_why);
        } else {
            peer_redis_open(b->redis, PIPELINE, &runs[i].sys, why, wl);
        }
    }
}

/* Loads key indices 0 .. keys-1 in a random order (a permutation drawn
 * from a fixed seed): each key's value (or each of its list's elements,
 * or its map's entries) the pool's value of its index, the index in its
 * first 8 bytes. */
static int load_one(keyed_bench *b, kv_sys *s, int group)
{
    const kv_ops *k = s->ops;
    unsigned pending = 0;
    int rc = 0;
    uint64_t *order = malloc(b->keys * sizeof *order);
    if (!order) return snprintf(s->error, sizeof s->error, "out of memory"), -ENOMEM;
    for (uint64_t i = 0; i < b->keys; i++) order[i] = i;
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (uint64_t i = b->keys - 1; i > 0; i--) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint64_t j = x % (i + 1), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    for (uint64_t n = 0; n < b->keys && rc == 0; n++) {
        if (n % 1024 == 0 && must_stop()) rc = -EINTR;
        uint64_t index = order[n], key = bench_key(index);
        uint8_t *value = b->values[index % VALUE_POOL];
        memcpy(value, &index, sizeof index);
        unsigned writes = group == GROUP_VALUE ? 1 : group == GROUP_LIST ? LIST_LEN : MAP_ENTRIES;
        for (unsigned j = 0; j < writes && rc == 0; j++) {
            rc = group == GROUP_VALUE  ? k->value_put(s, key, value, VALUE_LEN)
                 : group == GROUP_LIST ? k->list_add(s, key, value, VALUE_LEN)
                                       : k->map_put(s, key, j, value, VALUE_LEN);
            if (rc == 0 && ++pending == s->batch) rc = k->sync(s), pending = 0;
        }
    }
    free(order);
    return rc ? rc : k->sync(s);
}

static void load_group(keyed_bench *b, int group, sys_run runs[NSYS])
{
    for (int i = 0; i < NSYS && !must_stop(); i++) {
        if (!runs[i].sys) continue;
        bench_progress(&b->o, "keyed: loading %s into %s", group_names[group], sys_names[i]);
        if (load_one(b, runs[i].sys, group) < 0)
            fail_sys(&runs[i], "load");
        else if (model_init(&runs[i].m, b, group) < 0)
            snprintf(runs[i].sys->error, sizeof runs[i].sys->error, "out of memory"),
                fail_sys(&runs[i], "its model");
    }
}

static uint64_t tree_bytes_sum;

static int add_file_bytes(const char *path, const struct stat *st, int type, struct FTW *f)
{
    (void)path, (void)f;
    if (type == FTW_F) tree_bytes_sum += (uint64_t)st->st_blocks * 512;
    return 0;
}

/* The bytes the files under path take on disk. */
static uint64_t tree_bytes(const char *path)
{
    tree_bytes_sum = 0;
    nftw(path, add_file_bytes, 16, FTW_PHYS);
    return tree_bytes_sum;
}

/* --memory-budget: once the data is loaded and written out, limits the
 * process to what it holds besides plus the data's budget, and reports
 * both beside the bytes stash's and LMDB's files take. Returns 0, or -1 with
 * the reason reported. */
static int apply_budget(keyed_bench *b, const sys_run runs[NSYS])
{
    char why[320] = "";
    uint64_t data =
        b->budget_bytes == UINT64_MAX ? payload_bytes(b, GROUP_VALUE) / 4 : b->budget_bytes;
    bench_progress(&b->o, "keyed: limiting the process to %llu bytes for the data's pages",
                   (unsigned long long)data);
    sync();
    bench_result res = {.bench = "keyed", .name = "value/memory-budget", .unit = "bytes"};
    int rc = bench_budget_limit(&b->budget, data, why, sizeof why);
    res.system = "data";
    res.value = (double)data;
    res.skipped = rc < 0 ? why : NULL;
    bench_report(&b->o, &res);
    if (rc < 0) return -1;
    res.system = "held-besides";
    res.value = (double)b->budget.held;
    bench_report(&b->o, &res);
    for (int i = 0; i < NSYS; i++) {
        if (!runs[i].sys || (i != SYS_STASH && i != SYS_LMDB)) continue;
        char dir[1024], system[64];
        snprintf(dir, sizeof dir, "%s/%s-%s", b->dir, group_names[GROUP_VALUE], sys_names[i]);
        snprintf(system, sizeof system, "%s-files", sys_names[i]);
        res.system = system;
        res.value = (double)tree_bytes(dir);
        bench_report(&b->o, &res);
    }
    return 0;
}

/* Each system's data beyond the keys' and values' own bytes, per entry. */
/* Pins the calling process to processor cpu (the cpu-th of those it may use). */
static void pin_to(const cpu_set_t *allowed, int cpu)
{
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0, seen = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, allowed) && seen++ == cpu) {
            CPU_SET(c, &one);
            sched_setaffinity(0, sizeof one, &one);
            return;
        }
}

/* The machine's round trip between two processes through two pipes, a byte
 * each way, the two on different processors (cross) or on one: the least
 * any request to a server on this machine waits. Microseconds a round
 * trip, or -1 (one processor only, or a failure). */
static double round_trip_us(bool cross)
{
    enum { TRIPS = 20000, WARM = 1000 };
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) < 0 || (cross && CPU_COUNT(&allowed) < 2))
        return -1;
    int there[2], back[2];
    if (pipe(there) < 0) return -1;
    if (pipe(back) < 0) return close(there[0]), close(there[1]), -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(there[1]), close(back[0]);
        pin_to(&allowed, cross ? 1 : 0);
        char c;
        while (read(there[0], &c, 1) == 1 && write(back[1], &c, 1) == 1) {
        }
        _exit(0);
    }
    close(there[0]), close(back[1]);
    pin_to(&allowed, 0);
    uint64_t t0 = 0;
    bool ok = pid > 0;
    for (int i = 0; ok && i < WARM + TRIPS; i++) {
        if (i == WARM) t0 = bench_now_ns();
        char c = 'x';
        ok = write(there[1], &c, 1) == 1 && read(back[0], &c, 1) == 1;
    }
    double us = ok ? (double)(bench_now_ns() - t0) / 1e3 / TRIPS : -1;
    close(there[1]), close(back[0]);
    if (pid > 0) waitpid(pid, NULL, 0);
    sched_setaffinity(0, sizeof allowed, &allowed);
    return us;
}

/* Beside Redis: the round trips every one of its requests pays. */
static void report_round_trips(const keyed_bench *b)
{
    for (int cross = 1; cross >= 0; cross--) {
        bench_result res = {.bench = "keyed",
                            .name = "machine/round-trip",
                            .system = cross ? "cross-cpu" : "same-cpu",
                            .unit = "us"};
        res.value = round_trip_us(cross);
        if (res.value < 0) res.skipped = cross ? "one processor" : "pipes failed";
        bench_report(&b->o, &res);
    }
}

static void report_footprints(keyed_bench *b, sys_run runs[NSYS])
{
    bench_result res = {.bench = "keyed", .name = "value/bytes-per-entry", .unit = "bytes"};
    for (int i = 0; i < NSYS; i++) {
        kv_sys *s = runs[i].sys;
        uint64_t bytes = 0;
        res.system = sys_names[i];
        res.skipped = s ? NULL : runs[i].why;
        if (s && !s->ops->footprint)
            res.skipped = "no comparable figure: its blocks are compressed, spread over "
                          "memtables and files";
        else if (s && s->ops->footprint(s, &bytes) < 0)
            res.skipped = s->error;
        res.value = (double)bytes / (double)b->keys - (KEY_LEN + VALUE_LEN);
        bench_report(&b->o, &res);
    }
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *f)
{
    (void)st, (void)type, (void)f;
    remove(path);
    return 0;
}

static void remove_tree(const char *path)
{
    nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void close_group(keyed_bench *b, int group, sys_run runs[NSYS])
{
    for (int i = 0; i < NSYS; i++) {
        if (runs[i].sys) runs[i].sys->ops->close(runs[i].sys);
        runs[i].sys = NULL;
        model_free(&runs[i].m);
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/%s-%s", b->dir, group_names[group], sys_names[i]);
        remove_tree(dir);
    }
}

/* ------------------------------------------------------------------------ */
/* Cases: the same sequence on every system, reps times, interleaved.        */

/* A row of a case's report: a system, one at a time or in batches. */
typedef struct case_row {
    int sys;
    unsigned batched; /* > 1: in batches of this many */
    const char *name;
} case_row;

#define ROWS_MAX 10

/* The rows of case c: every system; for a batched case stash and the raw
 * tables batched and not, and LMDB. Returns how many. */
static int case_rows(const keyed_case *c, case_row rows[ROWS_MAX])
{
    if (c->batch > 1) {
        rows[0] = (case_row){SYS_STASH, c->batch, "stash"};
        rows[1] = (case_row){SYS_STASH, 0, "stash-unbatched"};
        rows[2] = (case_row){SYS_RAW, 0, "raw-table"};
        rows[3] = (case_row){SYS_RAW, c->batch, "raw-table-batched"};
        rows[4] = (case_row){SYS_RAW_LP, 0, "raw-lp"};
        rows[5] = (case_row){SYS_RAW_LP, c->batch, "raw-lp-batched"};
        rows[6] = (case_row){SYS_RAW_INDEX, 0, "raw-index"};
        rows[7] = (case_row){SYS_RAW_INDEX, c->batch, "raw-index-batched"};
        rows[8] = (case_row){SYS_LMDB, 0, "lmdb"};
        return 9;
    }
    for (int i = 0; i < NSYS; i++) rows[i] = (case_row){i, 0, sys_names[i]};
    return NSYS;
}

static const char *case_skip(const keyed_case *c, const case_row *row, const sys_run runs[NSYS])
{
    const sys_run *r = &runs[row->sys];
    if (!r->sys) return r->why;
    if (c->second == YCSB_RMW && r->sys->batch > 1)
        return "read-modify-write needs each read's reply before its write: nothing to "
               "pipeline";
    if (row->batched > 1 && !r->sys->ops->run_batch) return "no batches";
    return NULL;
}

/* Before a pass: waits for every system's background work (RocksDB's
 * flushes and compactions) and writes every file's dirty pages out, so
 * that no system's pass pays for another's; under --memory-budget, then
 * drops the data's cached pages, so that no pass finds the pages the one
 * before it brought in. */
static void settle(const keyed_bench *b, sys_run runs[NSYS])
{
    for (int i = 0; i < NSYS; i++)
        if (runs[i].sys && runs[i].sys->ops->quiesce && runs[i].sys->ops->quiesce(runs[i].sys) < 0)
            fail_sys(&runs[i], "waiting for its background work");
    sync();
    bench_budget_evict(&b->budget);
}

/* Runs one case on every row and reports it, with the ratios of stash to
 * the other rows: a warm-up pass of each row on a sequence of other keys,
 * reps throughput passes of each in a shuffled order (no clock read inside
 * one), then a latency pass of each, every step timed. Every pass runs the
 * whole sequence, and every pass's reads are checked. */
static void run_case(keyed_bench *b, const keyed_case *c, uint64_t seed, sys_run runs[NSYS])
{
    case_row rows[ROWS_MAX];
    int nrows = case_rows(c, rows), reps = b->o.reps, order[ROWS_MAX];
    ycsb_op *ops = malloc(b->ops * sizeof *ops), *warm = malloc(b->ops * sizeof *warm);
    uint64_t *keys = malloc(b->ops * sizeof *keys);
    double *rates = calloc((size_t)(ROWS_MAX + 2) * reps, sizeof *rates);
    lat_pool lat[ROWS_MAX] = {{0}};
    bool ok = ops && warm && keys && rates;
    for (int i = 0; i < nrows && ok; i++) {
        lat[i] = (lat_pool){.ns = malloc(b->ops * sizeof(uint64_t)), .cap = b->ops};
        ok = lat[i].ns != NULL;
    }
    ycsb_spec spec = {.keys = b->keys,
                      .zipfian = c->zipfian,
                      .first = c->first,
                      .second = c->second,
                      .first_share = c->first_share,
                      .subkeys = c->group == GROUP_MAP ? MAP_ENTRIES : 0,
                      .seed = seed};
    bench_progress(&b->o, "keyed: %s: generating", c->name);
    if (ok) ok = ycsb_generate(&spec, ops, b->ops) == 0;
    spec.seed = bench_key(seed) | 1u << 31; /* the warm-up's keys: another draw */
    if (ok) ok = ycsb_generate(&spec, warm, b->ops) == 0;
    char what[96];
    pass_out p;
    bool reads_only =
        (c->first == YCSB_GET || c->first == YCSB_LIST_GET || c->first == YCSB_MAP_GET) &&
        c->second == c->first;
    for (int i = 0; i < NSYS && ok && reads_only && !must_stop(); i++) {
        kv_sys *s = runs[i].sys;
        if (!s || !s->ops->ready_reads) continue;
        bench_progress(&b->o, "keyed: %s: %s: compacting", c->name, sys_names[i]);
        if (s->ops->ready_reads(s) < 0) fail_sys(&runs[i], "compacting");
    }
    for (int i = 0; i < nrows && ok && !must_stop(); i++) {
        if (case_skip(c, &rows[i], runs)) continue;
        bench_progress(&b->o, "keyed: %s: %s: warm-up", c->name, rows[i].name);
        settle(b, runs);
        snprintf(what, sizeof what, "%s warm-up", c->name);
        run_row(b, &runs[rows[i].sys], rows[i].batched, warm, keys, NULL, &p, what);
    }
    for (int r = 0; r < reps && ok && !must_stop(); r++) {
        bench_shuffle(order, nrows, seed, r);
        for (int k = 0; k < nrows && !must_stop(); k++) {
            int i = order[k];
            if (case_skip(c, &rows[i], runs)) continue;
            bench_progress(&b->o, "keyed: %s: %s: repetition %d of %d", c->name, rows[i].name,
                           r + 1, reps);
            settle(b, runs);
            snprintf(what, sizeof what, "%s repetition %d", c->name, r + 1);
            if (run_row(b, &runs[rows[i].sys], rows[i].batched, ops, keys, NULL, &p, what) == 0)
                rates[i * reps + r] = (double)p.done / ((double)p.ns / 1e9);
        }
    }
    bench_shuffle(order, nrows, seed, reps);
    for (int k = 0; k < nrows && ok && !must_stop(); k++) {
        int i = order[k];
        if (case_skip(c, &rows[i], runs)) continue;
        bench_progress(&b->o, "keyed: %s: %s: latency", c->name, rows[i].name);
        settle(b, runs);
        snprintf(what, sizeof what, "%s latency pass", c->name);
        run_row(b, &runs[rows[i].sys], rows[i].batched, ops, keys, &lat[i], &p, what);
    }
    for (int i = 0; i < nrows && ok && !must_stop(); i++) {
        if (!peer_compared(b, rows[i].sys)) continue;
        bench_result res = {.bench = "keyed", .name = c->name, .system = rows[i].name};
        res.skipped = case_skip(c, &rows[i], runs);
        if (!res.skipped) {
            double *v = &rates[(ROWS_MAX + 1) * reps]; /* bench_spread sorts: a copy */
            memcpy(v, &rates[i * reps], (size_t)reps * sizeof *v);
            res = bench_spread(res, v, reps);
            res.unit = "ops/s", res.latency = true, res.ops = b->ops;
            res.p50_us = bench_percentile_us(lat[i].ns, lat[i].n, 0.5);
            res.p99_us = bench_percentile_us(lat[i].ns, lat[i].n, 0.99);
            res.p999_us = bench_percentile_us(lat[i].ns, lat[i].n, 0.999);
            bench_plot_cdf("keyed", c->name, rows[i].name, lat[i].ns, lat[i].n);
        }
        bench_report(&b->o, &res);
    }
    bool all = c->batch > 1 || strcmp(c->name, "value/ycsb-a/uniform") == 0 ||
               b->backend == STASH_BACKEND_LMDB;
    for (int i = 1; i < nrows && ok && !must_stop(); i++) {
        int sys = rows[i].sys;
        char system[64];
        snprintf(system, sizeof system, "stash/%s", rows[i].name);
        if (peer_compared(b, sys) && !case_skip(c, &rows[i], runs) &&
            (all || sys == SYS_RAW || sys == SYS_RAW_LP || sys == SYS_RAW_INDEX ||
             sys == SYS_LMDB || sys == SYS_ROCKSDB))
            bench_report_ratio(&b->o, "keyed", c->name, system, &rates[0], &rates[i * reps], reps);
    }
    if (!ok) fprintf(stderr, "stash bench keyed: %s: out of memory\n", c->name);
    for (int i = 0; i < ROWS_MAX; i++) free(lat[i].ns);
    free(rates);
    free(keys);
    free(warm);
    free(ops);
}

/* Refuses a --case that selects none of the cases this backend runs. */
static int check_case(const keyed_bench *b)
{
    static const char *const heap_only[] = {"value/bytes-per-entry",
                                            "machine/round-trip",
                                            "value/ycsb-a/uniform/1proc",
                                            "value/ycsb-a/uniform/2proc",
                                            "value/ycsb-a/uniform/scaling",
                                            "value/ycsb-a/uniform/batch32/1proc",
                                            "value/ycsb-a/uniform/batch32/2proc",
                                            "value/ycsb-a/uniform/batch32/scaling"};
    const char *names[NCASES + sizeof heap_only / sizeof heap_only[0] + 1];
    size_t n = 0;
    bool lmdb = b->backend == STASH_BACKEND_LMDB;
    for (size_t c = 0; c < NCASES; c++)
        if (!lmdb || (cases[c].group == GROUP_VALUE && cases[c].second != YCSB_RMW))
            names[n++] = cases[c].name;
    for (size_t i = 0; !lmdb && i < sizeof heap_only / sizeof heap_only[0]; i++)
        names[n++] = heap_only[i];
    if (b->budget_bytes) names[n++] = "value/memory-budget";
    return bench_check_case(&b->o, "keyed", names, n);
}

/* ------------------------------------------------------------------------ */
/* Scaling: YCSB A on one worker process, then on two that each own half    */
/* the key groups and replay their share of the same sequence.               */

typedef struct scale_page {
    _Atomic int ready, go;
    uint64_t start_ns[2], end_ns[2], done[2];
    uint64_t sums[2][2]; /* each worker's warm-up's and timed pass's reads */
    char error[2][320];
} scale_page;

/* A worker of the scaling rows: a warm-up pass of warm (nw operations on
 * other keys), then, once every worker is warm, a timed pass of ops (n). */
static void scale_child(keyed_bench *b, const char *path, uint32_t index, uint32_t p,
                        unsigned batched, const ycsb_op *warm, uint64_t nw, const ycsb_op *ops,
                        uint64_t n, scale_page *pg)
{
    kv_sys *s = NULL;
    pass_out out = {0};
    uint64_t *keys = malloc((n > nw ? n : nw + 1) * sizeof *keys);
    /* A read log of its own, its pages there before any pass: the parent's
     * would be copied on write inside the timed pass. */
    size_t log_bytes = (n > nw ? n : nw + 1) * VALUE_LEN;
    uint8_t *log = mmap(NULL, log_bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    int rc = keys && log != MAP_FAILED ? 0 : -ENOMEM;
    if (rc == 0)
        rc = stash_sys_open(path, 0, index, p, NULL, &s, pg->error[index], sizeof pg->error[index]);
    if (rc == 0) {
        fill_keys(b, warm, nw, keys);
        rc = stash_pass(b, s, &(pass_in){warm, keys, nw, batched, NULL, log}, &out);
        pg->sums[index][0] = out.sum;
        fill_keys(b, ops, n, keys);
    }
    atomic_fetch_add(&pg->ready, 1);
    while (!atomic_load(&pg->go)) {
    }
    if (rc == 0) {
        pg->start_ns[index] = bench_now_ns();
        rc = stash_pass(b, s, &(pass_in){ops, keys, n, batched, NULL, log}, &out);
        pg->end_ns[index] = pg->start_ns[index] + out.ns;
        pg->done[index] = out.done;
        pg->sums[index][1] = out.sum;
    }
    free(keys);
    if (log != MAP_FAILED) munmap(log, log_bytes);
    if (rc < 0 && s) snprintf(pg->error[index], sizeof pg->error[index], "%s", s->error);
    if (s) s->ops->close(s);
    _exit(rc < 0);
}

/* Runs p worker processes at once, worker i on parts[i] after a warm-up
 * on warms[i], and checks their reads against the model m; returns their
 * operations per second over the span from the first start to the last end,
 * or -1 with why set. */
static double run_scale(keyed_bench *b, const char *path, uint32_t p, unsigned batched,
                        ycsb_op *const warms[2], const uint64_t nw[2], ycsb_op *const parts[2],
                        const uint64_t n[2], model *m, char *why, size_t whylen)
{
    scale_page *pg =
        mmap(NULL, sizeof *pg, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (pg == MAP_FAILED) return snprintf(why, whylen, "mmap: %s", strerror(errno)), -1;
    fflush(NULL);
    pid_t pids[2] = {-1, -1};
    int status[2] = {0, 0};
    bool reaped[2] = {false, false};
    for (uint32_t i = 0; i < p; i++) {
        pids[i] = fork();
        if (pids[i] == 0) scale_child(b, path, i, p, batched, warms[i], nw[i], parts[i], n[i], pg);
        if (pids[i] < 0) snprintf(pg->error[i], sizeof pg->error[i], "fork: %s", strerror(errno));
        reaped[i] = pids[i] < 0;
    }
    /* Go when every worker is warm or gone. The parent sleeps rather than
     * spins: two cores may be all there is. */
    for (int gone = 0; atomic_load(&pg->ready) + gone < (int)p;) {
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
        gone = 0;
        for (uint32_t i = 0; i < p; i++) {
            if (!reaped[i]) reaped[i] = waitpid(pids[i], &status[i], WNOHANG) == pids[i];
            gone += reaped[i];
        }
    }
    atomic_store(&pg->go, 1);
    bool bad = false;
    for (uint32_t i = 0; i < p; i++) {
        if (!reaped[i]) waitpid(pids[i], &status[i], 0);
        if (pids[i] < 0 || !WIFEXITED(status[i]) || WEXITSTATUS(status[i]) != 0) {
            snprintf(why, whylen, "failed: worker %u: %.200s", i,
                     *pg->error[i] ? pg->error[i] : "died");
            bad = true;
        }
    }
    uint64_t start = pg->start_ns[0], end = pg->end_ns[0], done = 0;
    for (uint32_t i = 0; i < p; i++) {
        if (pg->start_ns[i] < start) start = pg->start_ns[i];
        if (pg->end_ns[i] > end) end = pg->end_ns[i];
        done += pg->done[i];
        /* The workers' key groups are apart: each part replays on its own. */
        for (int k = 0; k < 2 && !bad; k++) {
            uint64_t want = model_pass(
                b, m, &(pass_in){k ? parts[i] : warms[i], NULL, k ? n[i] : nw[i], 0, NULL, NULL});
            if (pg->sums[i][k] != want) {
                snprintf(why, whylen,
                         "failed: worker %u: the reads' checksum is %016llx where a replay of "
                         "the writes expects %016llx: a read returned wrong contents",
                         i, (unsigned long long)pg->sums[i][k], (unsigned long long)want);
                bad = true;
            }
        }
    }
    munmap(pg, sizeof *pg);
    return bad ? -1 : (double)done / ((double)(end - start) / 1e9);
}

/* The scaling rows of YCSB A uniform, one operation at a time, or with
 * batched > 1 in batches of that many. */
static void run_scaling(keyed_bench *b, uint64_t seed, unsigned batched)
{
    char dir[600], path[640], why[320] = "";
    snprintf(dir, sizeof dir, "%s/scaling", b->dir);
    snprintf(path, sizeof path, "%s/arena", dir);
    /* [0] the sequence and [1] the warm-up's; each split in two by owner */
    ycsb_op *seq[2], *parts[2][2];
    bool ok = true;
    for (int k = 0; k < 2; k++) {
        seq[k] = malloc(b->ops * sizeof *seq[k]);
        parts[k][0] = malloc(b->ops * sizeof *seq[k]);
        parts[k][1] = malloc(b->ops * sizeof *seq[k]);
        ok = ok && seq[k] && parts[k][0] && parts[k][1];
    }
    double *v = calloc((size_t)3 * b->o.reps, sizeof *v);
    model m = {0};
    kv_sys *s = NULL;
    for (int k = 0; k < 2 && ok; k++) {
        ycsb_spec spec = {.keys = b->keys,
                          .first = YCSB_GET,
                          .second = YCSB_PUT,
                          .first_share = 0.5,
                          .seed = k ? bench_key(seed) | 1u << 31 : seed};
        ok = v && ycsb_generate(&spec, seq[k], b->ops) == 0;
    }
    if (!ok)
        snprintf(why, sizeof why, "out of memory");
    else if (mkdir(dir, 0700) < 0)
        snprintf(why, sizeof why, "mkdir %.200s: %s", dir, strerror(errno)), ok = false;
    else if (stash_sys_open(path, payload_bytes(b, GROUP_VALUE) * 2 + (256ull << 20), 0, 1, NULL,
                            &s, why, sizeof why) < 0)
        ok = false;
    bench_progress(&b->o, "keyed: scaling: loading");
    if (ok && load_one(b, s, GROUP_VALUE) < 0)
        snprintf(why, sizeof why, "failed: load: %s", s->error), ok = false;
    if (ok && model_init(&m, b, GROUP_VALUE) < 0)
        snprintf(why, sizeof why, "out of memory"), ok = false;
    if (s) s->ops->close(s); /* the workers below join at another parallelism */
    uint64_t n2[2][2] = {{0, 0}, {0, 0}};
    for (int k = 0; k < 2 && ok; k++)
        for (uint64_t i = 0; i < b->ops; i++) {
            uint64_t key = bench_key(seq[k][i].key);
            uint32_t kg = stash_key_group(&key, KEY_LEN, STASH_DEFAULT_MAX_PARALLELISM);
            int w = stash_kg_owner(kg, STASH_DEFAULT_MAX_PARALLELISM, 2);
            parts[k][w][n2[k][w]++] = seq[k][i];
        }
    ycsb_op *whole[2] = {seq[0], NULL}, *whole_warm[2] = {seq[1], NULL};
    uint64_t n1[2] = {b->ops, 0};
    for (int r = 0; r < b->o.reps && ok && !must_stop(); r++) {
        bench_progress(&b->o, "keyed: scaling: repetition %d of %d", r + 1, b->o.reps);
        v[r] = run_scale(b, path, 1, batched, whole_warm, n1, whole, n1, &m, why, sizeof why);
        v[b->o.reps + r] = v[r] > 0 ? run_scale(b, path, 2, batched, parts[1], n2[1], parts[0],
                                                n2[0], &m, why, sizeof why)
                                    : -1;
        ok = v[r] > 0 && v[b->o.reps + r] > 0;
    }
    if (!must_stop()) {
        bench_result res = {.bench = "keyed", .system = "stash", .unit = "ops/s"};
        char prefix[64], name[96];
        snprintf(prefix, sizeof prefix, "value/ycsb-a/uniform%s", batched > 1 ? "/batch32" : "");
        for (int p = 0; p < 2; p++) {
            snprintf(name, sizeof name, "%s/%dproc", prefix, p + 1);
            res.name = name;
            res.skipped = ok ? NULL : why;
            double *copy = &v[2 * b->o.reps]; /* bench_spread sorts: a copy */
            memcpy(copy, &v[p * b->o.reps], (size_t)b->o.reps * sizeof *copy);
            if (ok) res = bench_spread(res, copy, b->o.reps);
            bench_report(&b->o, &res);
        }
        snprintf(name, sizeof name, "%s/scaling", prefix);
        if (ok)
            bench_report_ratio(&b->o, "keyed", name, "stash-2p/1p", &v[b->o.reps], v, b->o.reps);
    }
    remove_tree(dir);
    model_free(&m);
    free(v);
    for (int k = 0; k < 2; k++) free(seq[k]), free(parts[k][0]), free(parts[k][1]);
}

/* Whether --case selects anything the group measures. */
static bool group_selected(const keyed_bench *b, int g)
{
    if (g == GROUP_VALUE && (bench_selected(&b->o, "value/bytes-per-entry") ||
                             bench_selected(&b->o, "machine/round-trip") ||
                             bench_selected(&b->o, "value/ycsb-a/uniform/1proc") ||
                             bench_selected(&b->o, "value/ycsb-a/uniform/batch32/1proc")))
        return true;
    if (g == GROUP_VALUE && b->budget_bytes && bench_selected(&b->o, "value/memory-budget"))
        return true;
    for (size_t c = 0; c < NCASES; c++)
        if (cases[c].group == g && bench_selected(&b->o, cases[c].name)) return true;
    return false;
}

/* --memory-budget's value: auto (UINT64_MAX), or bytes with an optional
 * K, M or G (binary). */
static int parse_budget(const char *v, uint64_t *out)
{
    if (strcmp(v, "auto") == 0) return *out = UINT64_MAX, 0;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
    if (shift) end++;
    if (errno || end == v || *end || n == 0 || n > (UINT64_MAX >> 31)) return -1;
    *out = (uint64_t)n << shift;
    return 0;
}

/* How each system runs, printed after the header (stash's second line: on
 * the lmdb backend). */
static const char *const setups[][3] = {
    {"stash",
     "one worker of an arena in /dev/shm; a value access is one call (stash_value_get_key, "
     "stash_value_put_key), a list or map access sets its key first (stash_key_set)",
     "one worker, the lmdb store; a barrier (its commit) every 1000 writes, as LMDB commits"},
    {"raw-table",
     "the one-miss limit: the keys are a bijective mix of dense indices, which it inverts, so a "
     "key's slot is its index: one aligned 128-byte slot, no probing"},
    {"raw-lp", "linear probing over XXH3 of the key, key and value in each slot, doubled at 7/8 "
               "full as stash's index"},
    {"raw-index", "stash's two steps alone: one-line groups of ten tags and references over XXH3 "
                  "of the key, doubled at 7/8 full, naming 128-byte records of key and value in "
                  "the order written"},
    {"lmdb", "MDB_NOSYNC | MDB_WRITEMAP | MDB_NORDAHEAD, MDB_INTEGERKEY for 8-byte keys; a "
             "commit every 1000 writes"},
    {"rocksdb", "WAL off; 256 MiB block cache; full bloom filter of 10 bits a key; flushed and "
                "compacted before a case that only reads; background work waited for between "
                "passes"},
    {"rocksdb-flink", "as Flink's RocksDB backend: WAL off, 256 MiB block cache, no bloom filter, "
                      "reads wherever the writes left the data"},
    {"redis-pipelined", "redis-server on a Unix socket, no persistence; hiredis, 64 commands a "
                        "round trip (machine/round-trip says what one costs)"},
};

/* ------------------------------------------------------------------------ */

int bench_keyed(int argc, char **argv)
{
    static const char usage[] =
        "Keyed-state operations per second and their latency (p50, p99, p99.9): ValueState\n"
        "under YCSB A, B, C and F (uniform and zipfian 0.99), ListState add and get, MapState\n"
        "put and get, 1M arbitrary 8-byte keys with 100-byte values (--quick: 100K). Beside,\n"
        "in the same run and on the same sequences, each at its best (the header says how):\n"
        "raw tables in shared memory (the one-miss limit, and plain linear probing), LMDB,\n"
        "RocksDB (and as Flink sets it up) and Redis pipelined, where installed. Every pass\n"
        "runs the whole sequence and checks every read; throughput passes read no clock,\n"
        "the latency comes from a pass of its own; rows run in a new order each repetition\n"
        "and ratios give their spread. Also one worker process against two, the bytes each\n"
        "entry costs beyond its key and value, and the machine's round trips.\n"
        "--backend lmdb: stash's lmdb backend beside LMDB and RocksDB, ValueState under\n"
        "YCSB A, B and C, 10M keys (--quick: 200K), everything on disk in $STASH_BENCH_DIR\n"
        "or /var/tmp. --memory-budget auto|BYTES (with --backend lmdb): once loaded, the\n"
        "data's cached pages are held to a quarter of its payload (auto) or BYTES, in a\n"
        "memory cgroup of the bench's own (RocksDB, whose cache alone is larger, left out),\n"
        "and a pass runs a tenth of the operations.\n"
        "The .../batchN cases run the same sequences in batches of N (stash_batch_run),\n"
        "beside stash one at a time and the raw table batched with the same prefetching\n"
        "and not.\n";
    keyed_bench *b = calloc(1, sizeof *b);
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!b || !args) {
        free(b);
        free(args);
        return tool_fail("bench keyed", -ENOMEM);
    }
    int nargs = 0, rc = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--memory-budget") != 0) {
            args[nargs++] = argv[i];
        } else if (i + 1 >= argc || parse_budget(argv[++i], &b->budget_bytes) < 0) {
            fprintf(stderr,
                    "stash bench keyed: --memory-budget takes auto or a number of bytes "
                    "(with K, M or G), not '%s'\n",
                    i < argc ? argv[i] : "");
            rc = -1;
        }
    }
    if (rc == 0) rc = bench_parse(nargs, args, usage, &b->o);
    free(args);
    b->backend = b->o.backend;
    if (rc == 0 && b->budget_bytes && b->backend != STASH_BACKEND_LMDB) {
        fprintf(stderr, "stash bench keyed: --memory-budget is for --backend lmdb\n");
        rc = -1;
    }
    if (rc == 0 && check_case(b) < 0) rc = -1;
    if (rc) {
        free(b);
        return rc < 0 ? 2 : 0;
    }
    bool lmdb = b->backend == STASH_BACKEND_LMDB;
    b->keys = lmdb ? (b->o.quick ? 200000 : 10000000) : b->o.quick ? 100000 : 1000000;
    b->ops = b->o.quick ? 200000 : 1000000;
    /* Under a budget most operations wait for the disk: a tenth as many a
     * pass keeps a case within minutes. */
    if (b->budget_bytes) b->ops /= 10;
    /* The read log, its pages there before the first pass. */
    size_t log_bytes = b->ops * LIST_LEN * VALUE_LEN;
    b->log = mmap(NULL, log_bytes, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (b->log == MAP_FAILED) {
        free(b);
        return tool_fail("bench keyed: the read log", -ENOMEM);
    }
    bench_header(
        &b->o, "keyed", "%llu keys of %d-byte values on the %s backend, %llu operations a pass",
        (unsigned long long)b->keys, VALUE_LEN, lmdb ? "lmdb" : "heap", (unsigned long long)b->ops);
    for (size_t i = 0; i < sizeof setups / sizeof setups[0]; i++)
        if (!lmdb ||
            (strncmp(setups[i][0], "raw", 3) != 0 && strncmp(setups[i][0], "redis", 5) != 0))
            bench_setup(&b->o, setups[i][0], lmdb && i == 0 ? setups[i][2] : setups[i][1]);
    uint64_t x = 0x243F6A8885A308D3ull; /* xorshift64: fixed, so every run writes the same */
    for (size_t i = 0; i < sizeof b->values; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b->values[i / VALUE_LEN][i % VALUE_LEN] = (uint8_t)(x >> 56);
    }
    /* Everything the bench creates lives here: in memory for every system,
     * or with --backend lmdb on disk (the arena alone in memory). */
    const char *disk = getenv("STASH_BENCH_DIR") ? getenv("STASH_BENCH_DIR") : "/var/tmp";
    if ((size_t)snprintf(b->dir, sizeof b->dir, "%s/stash-bench-keyed.XXXXXX",
                         lmdb ? disk : "/dev/shm") >= sizeof b->dir ||
        !mkdtemp(b->dir)) {
        fprintf(stderr, "stash bench keyed: cannot create %s: %s\n", b->dir, strerror(errno));
        munmap(b->log, log_bytes);
        free(b);
        return 1;
    }
    snprintf(b->arena_dir, sizeof b->arena_dir, "/dev/shm/stash-bench-keyed.XXXXXX");
    if (lmdb && !mkdtemp(b->arena_dir)) {
        rc = -errno;
        remove_tree(b->dir);
        munmap(b->log, log_bytes);
        free(b);
        return tool_fail("bench keyed: mkdtemp /dev/shm", rc);
    }
    char why[320];
    if (b->budget_bytes && bench_budget_enter(&b->budget, why, sizeof why) < 0) {
        fprintf(stderr, "stash bench keyed: --memory-budget: %s\n", why);
        remove_tree(b->dir);
        if (lmdb) remove_tree(b->arena_dir);
        munmap(b->log, log_bytes);
        free(b);
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_interrupt}, ign = {.sa_handler = SIG_IGN};
    struct sigaction old_int, old_term, old_pipe;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGPIPE, &ign, &old_pipe);

    char redis_dir[1024];
    snprintf(redis_dir, sizeof redis_dir, "%s/redis", b->dir);
    if (lmdb)
        snprintf(b->redis_why, sizeof b->redis_why, "not in this comparison");
    else if (mkdir(redis_dir, 0700) < 0)
        snprintf(b->redis_why, sizeof b->redis_why, "mkdir %.200s: %s", redis_dir, strerror(errno));
    else
        peer_redis_start(redis_dir, &b->redis, b->redis_why, sizeof b->redis_why);

    for (int g = 0; g < (lmdb ? 1 : NGROUPS) && !must_stop(); g++) {
        if (!group_selected(b, g)) continue;
        sys_run runs[NSYS];
        bench_progress(&b->o, "keyed: opening the %s group", group_names[g]);
        open_group(b, g, runs);
        load_group(b, g, runs);
        if (g == GROUP_VALUE && !lmdb && !must_stop()) report_footprints(b, runs);
        if (g == GROUP_VALUE && !lmdb && !must_stop()) report_round_trips(b);
        if (b->budget_bytes && !must_stop() && apply_budget(b, runs) < 0) {
            close_group(b, g, runs);
            break;
        }
        for (size_t c = 0; c < NCASES && !must_stop(); c++)
            if (cases[c].group == g && !(lmdb && cases[c].second == YCSB_RMW) &&
                bench_selected(&b->o, cases[c].name))
                run_case(b, &cases[c], c + 1, runs);
        close_group(b, g, runs);
        if (g == GROUP_VALUE && !lmdb && !must_stop() &&
            bench_selected(&b->o, "value/ycsb-a/uniform/1proc"))
            run_scaling(b, 1, 0);
        if (g == GROUP_VALUE && !lmdb && !must_stop() &&
            bench_selected(&b->o, "value/ycsb-a/uniform/batch32/1proc"))
            run_scaling(b, 1, 32);
    }

    peer_redis_stop(b->redis);
    bench_budget_leave(&b->budget);
    remove_tree(b->dir);
    if (lmdb) remove_tree(b->arena_dir);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGPIPE, &old_pipe, NULL);
    if (b->o.progress) fputs("\r\033[K", stderr);
    rc = interrupted ? 130 : ferror(stdout) ? 1 : 0;
    if (interrupted) fprintf(stderr, "stash bench keyed: interrupted; removed %s\n", b->dir);
    munmap(b->log, log_bytes);
    free(b);
    return rc;
}
