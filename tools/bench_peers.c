/*
 * bench_peers.c: the keyed bench's peers, each used the way its own users
 * would hold keyed state: a raw open-addressing table in a shared mapping of
 * a /dev/shm file (the speed limit), LMDB with batched write transactions,
 * RocksDB with the WAL off (as Flink runs it) and Redis over loopback.
 * Reads copy the value out, as a caller that deserializes it would.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <lmdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef STASH_HAVE_ROCKSDB
#include <rocksdb/c.h>
#endif
#ifdef STASH_HAVE_HIREDIS
#include <hiredis.h>
#endif

#include "tools/bench_peers.h"

#define WHY(...) (snprintf(why, whylen, __VA_ARGS__), -1)

/* Keys as their users would write them: the key index in 8 bytes; a map
 * entry is the key followed by the user key (Flink's RocksDB layout). */
static void encode_key(uint64_t key, uint8_t out[8])
{
    memcpy(out, &key, 8);
}

static void encode_map_key(uint64_t key, uint64_t ukey, uint8_t out[16])
{
    memcpy(out, &key, 8);
    memcpy(out + 8, &ukey, 8);
}

static int copy_out(const void *v, size_t n, void *out, size_t cap, size_t *len)
{
    if (n > cap) return -EMSGSIZE;
    memcpy(out, v, n);
    *len = n;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The raw table: fixed slots of an 8-byte key and an inline value, linear   */
/* probing, at most 3/4 full. No versions, no locks, no reclamation: what    */
/* a table in shared memory costs when it does nothing else.                 */

typedef struct raw_sys {
    kv_sys base;
    uint8_t *slots;
    uint64_t nslots, used;
    size_t slot_size, value_len, map_len;
} raw_sys;

/* The slot holding key, or the empty slot where it would go. Key 0 marks an
 * empty slot, so keys are stored plus one. */
static uint8_t *raw_find(raw_sys *t, uint64_t key)
{
    uint64_t stored = key + 1, h = stored * 0x9E3779B97F4A7C15ull;
    uint64_t i = (uint64_t)(((unsigned __int128)h * t->nslots) >> 64);
    for (;;) {
        uint8_t *slot = t->slots + i * t->slot_size;
        uint64_t k;
        memcpy(&k, slot, 8);
        if (k == stored || k == 0) return slot;
        if (++i == t->nslots) i = 0;
    }
}

static int raw_get(raw_sys *t, uint64_t key, void *out, size_t cap, size_t *len)
{
    uint8_t *slot = raw_find(t, key);
    uint64_t k;
    memcpy(&k, slot, 8);
    if (k == 0) return -ENOENT;
    return copy_out(slot + 8, t->value_len, out, cap, len);
}

static int raw_put(raw_sys *t, uint64_t key, const void *v, size_t len)
{
    if (len != t->value_len) {
        snprintf(t->base.error, sizeof t->base.error, "slots hold %zu-byte values", t->value_len);
        return -EINVAL;
    }
    uint8_t *slot = raw_find(t, key);
    uint64_t k;
    memcpy(&k, slot, 8);
    if (k == 0) {
        if (++t->used * 4 > t->nslots * 3) {
            snprintf(t->base.error, sizeof t->base.error, "table full");
            return -ENOSPC;
        }
        k = key + 1;
        memcpy(slot, &k, 8);
    }
    memcpy(slot + 8, v, len);
    return 0;
}

static int raw_value_get(kv_sys *s, uint64_t key, void *out, size_t cap, size_t *len)
{
    return raw_get((raw_sys *)s, key, out, cap, len);
}

static int raw_value_put(kv_sys *s, uint64_t key, const void *v, size_t len)
{
    return raw_put((raw_sys *)s, key, v, len);
}

/* A map entry is a slot of its own under (key, user key) in one word. */
static int raw_map_put(kv_sys *s, uint64_t key, uint64_t ukey, const void *v, size_t len)
{
    return raw_put((raw_sys *)s, key << 16 | ukey, v, len);
}

static int raw_map_get(kv_sys *s, uint64_t key, uint64_t ukey, void *out, size_t cap, size_t *len)
{
    return raw_get((raw_sys *)s, key << 16 | ukey, out, cap, len);
}

static int raw_sync(kv_sys *s)
{
    (void)s;
    return 0;
}

static int raw_footprint(kv_sys *s, uint64_t *bytes)
{
    *bytes = ((raw_sys *)s)->map_len;
    return 0;
}

static void raw_close(kv_sys *s)
{
    raw_sys *t = (raw_sys *)s;
    munmap(t->slots, t->map_len);
    free(t);
}

static const kv_ops raw_ops = {
    .value_get = raw_value_get,
    .value_put = raw_value_put,
    .map_put = raw_map_put,
    .map_get = raw_map_get,
    .sync = raw_sync,
    .footprint = raw_footprint,
    .close = raw_close,
};

int peer_raw_open(const kv_plan *plan, kv_sys **out, char *why, size_t whylen)
{
    raw_sys *t = calloc(1, sizeof *t);
    if (!t) return WHY("out of memory");
    t->base = (kv_sys){.ops = &raw_ops, .name = "raw-table", .batch = 1};
    t->value_len = plan->value_len;
    t->slot_size = (8 + plan->value_len + 7) & ~(size_t)7;
    t->nslots = plan->entries * 4 / 3 + 1;
    t->map_len = t->nslots * t->slot_size;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/raw-table", plan->dir);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int rc = fd < 0 ? errno : posix_fallocate(fd, 0, (off_t)t->map_len);
    if (rc == 0) {
        t->slots = mmap(NULL, t->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (t->slots == MAP_FAILED) rc = errno;
    }
    if (fd >= 0) close(fd);
    if (rc) {
        free(t);
        return WHY("%s: %s", path, strerror(rc));
    }
    *out = &t->base;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* LMDB: one environment, MDB_NOSYNC | MDB_WRITEMAP, writes committed in      */
/* transactions of LMDB_BATCH; reads go through the open write transaction   */
/* (to see its writes) or a reused read-only one. A list is one value: its   */
/* elements one after another, rewritten on append.                          */

#define LMDB_BATCH 1000

typedef struct lmdb_sys {
    kv_sys base;
    MDB_env *env;
    MDB_dbi dbi;
    MDB_txn *wtxn, *rtxn;
    bool rtxn_live;
    unsigned writes;
    uint8_t *scratch;
    size_t scratch_cap;
} lmdb_sys;

static int lmdb_fail(lmdb_sys *l, const char *what, int rc)
{
    snprintf(l->base.error, sizeof l->base.error, "%s: %s", what, mdb_strerror(rc));
    return rc > 0 ? -rc : -EIO;
}

static int lmdb_reader(lmdb_sys *l, MDB_txn **txn)
{
    int rc = 0;
    if (l->wtxn) {
        *txn = l->wtxn;
        return 0;
    }
    if (!l->rtxn)
        rc = mdb_txn_begin(l->env, NULL, MDB_RDONLY, &l->rtxn);
    else if (!l->rtxn_live)
        rc = mdb_txn_renew(l->rtxn);
    if (rc) return lmdb_fail(l, "mdb_txn_begin (read)", rc);
    l->rtxn_live = true;
    *txn = l->rtxn;
    return 0;
}

static int lmdb_writer(lmdb_sys *l)
{
    if (l->wtxn) return 0;
    if (l->rtxn_live) mdb_txn_reset(l->rtxn);
    l->rtxn_live = false;
    int rc = mdb_txn_begin(l->env, NULL, 0, &l->wtxn);
    return rc ? lmdb_fail(l, "mdb_txn_begin", rc) : 0;
}

static int lmdb_commit(lmdb_sys *l)
{
    if (!l->wtxn) return 0;
    int rc = mdb_txn_commit(l->wtxn);
    l->wtxn = NULL;
    l->writes = 0;
    return rc ? lmdb_fail(l, "mdb_txn_commit", rc) : 0;
}

static int lmdb_read(lmdb_sys *l, const void *k, size_t klen, MDB_val *v)
{
    MDB_txn *txn;
    int rc = lmdb_reader(l, &txn);
    if (rc < 0) return rc;
    MDB_val key = {klen, (void *)k};
    rc = mdb_get(txn, l->dbi, &key, v);
    if (rc == MDB_NOTFOUND) return -ENOENT;
    return rc ? lmdb_fail(l, "mdb_get", rc) : 0;
}

/* Puts head followed by tail (either may be empty) under k in one record. */
static int lmdb_write(lmdb_sys *l, const void *k, size_t klen, const void *head, size_t hlen,
                      const void *tail, size_t tlen)
{
    int rc = lmdb_writer(l);
    if (rc < 0) return rc;
    MDB_val key = {klen, (void *)k}, v = {hlen + tlen, NULL};
    rc = mdb_put(l->wtxn, l->dbi, &key, &v, MDB_RESERVE);
    if (rc) return lmdb_fail(l, "mdb_put", rc);
    if (hlen) memcpy(v.mv_data, head, hlen);
    memcpy((uint8_t *)v.mv_data + hlen, tail, tlen);
    return ++l->writes >= LMDB_BATCH ? lmdb_commit(l) : 0;
}

static int lmdb_value_get(kv_sys *s, uint64_t key, void *out, size_t cap, size_t *len)
{
    uint8_t k[8];
    encode_key(key, k);
    MDB_val v;
    int rc = lmdb_read((lmdb_sys *)s, k, sizeof k, &v);
    return rc < 0 ? rc : copy_out(v.mv_data, v.mv_size, out, cap, len);
}

static int lmdb_value_put(kv_sys *s, uint64_t key, const void *v, size_t len)
{
    uint8_t k[8];
    encode_key(key, k);
    return lmdb_write((lmdb_sys *)s, k, sizeof k, NULL, 0, v, len);
}

static int lmdb_list_add(kv_sys *s, uint64_t key, const void *v, size_t len)
{
    lmdb_sys *l = (lmdb_sys *)s;
    uint8_t k[8];
    encode_key(key, k);
    MDB_val old = {0, NULL};
    int rc = lmdb_read(l, k, sizeof k, &old);
    if (rc < 0 && rc != -ENOENT) return rc;
    /* The old list is copied aside first: reserving the new record may move it. */
    if (old.mv_size > l->scratch_cap) {
        uint8_t *p = realloc(l->scratch, old.mv_size * 2);
        if (!p) return -ENOMEM;
        l->scratch = p;
        l->scratch_cap = old.mv_size * 2;
    }
    if (old.mv_size) memcpy(l->scratch, old.mv_data, old.mv_size);
    return lmdb_write(l, k, sizeof k, l->scratch, old.mv_size, v, len);
}

static int lmdb_map_put(kv_sys *s, uint64_t key, uint64_t ukey, const void *v, size_t len)
{
    uint8_t k[16];
    encode_map_key(key, ukey, k);
    return lmdb_write((lmdb_sys *)s, k, sizeof k, NULL, 0, v, len);
}

static int lmdb_map_get(kv_sys *s, uint64_t key, uint64_t ukey, void *out, size_t cap, size_t *len)
{
    uint8_t k[16];
    encode_map_key(key, ukey, k);
    MDB_val v;
    int rc = lmdb_read((lmdb_sys *)s, k, sizeof k, &v);
    return rc < 0 ? rc : copy_out(v.mv_data, v.mv_size, out, cap, len);
}

static int lmdb_sync(kv_sys *s)
{
    lmdb_sys *l = (lmdb_sys *)s;
    if (l->rtxn_live) mdb_txn_reset(l->rtxn);
    l->rtxn_live = false;
    return lmdb_commit(l);
}

/* Pages in use, from the last page number: what the file holds for the data. */
static int lmdb_footprint(kv_sys *s, uint64_t *bytes)
{
    lmdb_sys *l = (lmdb_sys *)s;
    MDB_envinfo info;
    MDB_stat st;
    int rc = lmdb_sync(s);
    if (rc == 0) rc = mdb_env_info(l->env, &info) ? -EIO : 0;
    if (rc == 0) rc = mdb_env_stat(l->env, &st) ? -EIO : 0;
    if (rc == 0) *bytes = (uint64_t)(info.me_last_pgno + 1) * st.ms_psize;
    return rc;
}

static void lmdb_close(kv_sys *s)
{
    lmdb_sys *l = (lmdb_sys *)s;
    if (l->wtxn) mdb_txn_abort(l->wtxn);
    if (l->rtxn) mdb_txn_abort(l->rtxn);
    mdb_env_close(l->env);
    free(l->scratch);
    free(l);
}

static const kv_ops lmdb_ops = {
    .value_get = lmdb_value_get,
    .value_put = lmdb_value_put,
    .list_add = lmdb_list_add,
    .list_get = lmdb_value_get,
    .map_put = lmdb_map_put,
    .map_get = lmdb_map_get,
    .sync = lmdb_sync,
    .footprint = lmdb_footprint,
    .close = lmdb_close,
};

int peer_lmdb_open(const kv_plan *plan, kv_sys **out, char *why, size_t whylen)
{
    lmdb_sys *l = calloc(1, sizeof *l);
    if (!l) return WHY("out of memory");
    l->base = (kv_sys){.ops = &lmdb_ops, .name = "lmdb", .batch = 1};
    /* The map only reserves address space; room for B-tree pages and the
     * copies that copy-on-write keeps until a commit frees them. */
    size_t mapsize = (size_t)(plan->bytes * 3 + (1ull << 30));
    MDB_txn *txn = NULL;
    const char *what = "mdb_env_create";
    int rc = mdb_env_create(&l->env);
    if (rc == 0) {
        what = "mdb_env_open";
        rc = mdb_env_set_mapsize(l->env, mapsize);
    }
    if (rc == 0) rc = mdb_env_open(l->env, plan->dir, MDB_NOSYNC | MDB_WRITEMAP, 0600);
    if (rc == 0) {
        what = "opening the database";
        rc = mdb_txn_begin(l->env, NULL, 0, &txn);
    }
    if (rc == 0) rc = mdb_dbi_open(txn, NULL, 0, &l->dbi);
    if (rc == 0) {
        rc = mdb_txn_commit(txn);
        txn = NULL;
    }
    if (rc) {
        if (txn) mdb_txn_abort(txn);
        mdb_env_close(l->env);
        free(l);
        return WHY("%s %s: %s", what, plan->dir, mdb_strerror(rc));
    }
    *out = &l->base;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* RocksDB: the WAL off and no sync, as Flink's RocksDB backend writes; a    */
/* 256 MiB block cache; a list is one value grown by a merge operator that   */
/* appends (Flink's ListState on RocksDB does the same).                     */

#ifdef STASH_HAVE_ROCKSDB

typedef struct rocks_sys {
    kv_sys base;
    rocksdb_t *db;
    rocksdb_options_t *opts;
    rocksdb_writeoptions_t *wopts;
    rocksdb_readoptions_t *ropts;
    rocksdb_cache_t *cache;
} rocks_sys;

static char *concat(const char *head, size_t hlen, const char *const *parts, const size_t *lens,
                    int n, unsigned char *ok, size_t *len)
{
    size_t total = hlen;
    for (int i = 0; i < n; i++) total += lens[i];
    char *p = malloc(total ? total : 1);
    *ok = p != NULL;
    if (!p) return NULL;
    if (hlen) memcpy(p, head, hlen);
    for (size_t off = hlen, i = 0; i < (size_t)n; off += lens[i++])
        memcpy(p + off, parts[i], lens[i]);
    *len = total;
    return p;
}

static char *append_full(void *st, const char *k, size_t klen, const char *old, size_t olen,
                         const char *const *ops, const size_t *lens, int n, unsigned char *ok,
                         size_t *len)
{
    (void)st, (void)k, (void)klen;
    return concat(old, old ? olen : 0, ops, lens, n, ok, len);
}

static char *append_partial(void *st, const char *k, size_t klen, const char *const *ops,
                            const size_t *lens, int n, unsigned char *ok, size_t *len)
{
    (void)st, (void)k, (void)klen;
    return concat(NULL, 0, ops, lens, n, ok, len);
}

static void append_free(void *st, const char *v, size_t len)
{
    (void)st, (void)len;
    free((void *)v);
}

static void append_destroy(void *st)
{
    (void)st;
}

static const char *append_name(void *st)
{
    (void)st;
    return "stash-bench-append";
}

static int rocks_fail(rocks_sys *r, const char *what, char *err)
{
    snprintf(r->base.error, sizeof r->base.error, "%s: %s", what, err);
    rocksdb_free(err);
    return -EIO;
}

static int rocks_read(rocks_sys *r, const void *k, size_t klen, void *out, size_t cap, size_t *len)
{
    char *err = NULL;
    rocksdb_pinnableslice_t *v = rocksdb_get_pinned(r->db, r->ropts, k, klen, &err);
    if (err) return rocks_fail(r, "rocksdb_get_pinned", err);
    if (!v) return -ENOENT;
    size_t n;
    const char *data = rocksdb_pinnableslice_value(v, &n);
    int rc = copy_out(data, n, out, cap, len);
    rocksdb_pinnableslice_destroy(v);
    return rc;
}

static int rocks_write(rocks_sys *r, const void *k, size_t klen, const void *v, size_t len,
                       bool merge)
{
    char *err = NULL;
    if (merge)
        rocksdb_merge(r->db, r->wopts, k, klen, v, len, &err);
    else
        rocksdb_put(r->db, r->wopts, k, klen, v, len, &err);
    return err ? rocks_fail(r, merge ? "rocksdb_merge" : "rocksdb_put", err) : 0;
}

static int rocks_value_get(kv_sys *s, uint64_t key, void *out, size_t cap, size_t *len)
{
    uint8_t k[8];
    encode_key(key, k);
    return rocks_read((rocks_sys *)s, k, sizeof k, out, cap, len);
}

static int rocks_value_put(kv_sys *s, uint64_t key, const void *v, size_t len)
{
    uint8_t k[8];
    encode_key(key, k);
    return rocks_write((rocks_sys *)s, k, sizeof k, v, len, false);
}

static int rocks_list_add(kv_sys *s, uint64_t key, const void *v, size_t len)
{
    uint8_t k[8];
    encode_key(key, k);
    return rocks_write((rocks_sys *)s, k, sizeof k, v, len, true);
}

static int rocks_map_put(kv_sys *s, uint64_t key, uint64_t ukey, const void *v, size_t len)
{
    uint8_t k[16];
    encode_map_key(key, ukey, k);
    return rocks_write((rocks_sys *)s, k, sizeof k, v, len, false);
}

static int rocks_map_get(kv_sys *s, uint64_t key, uint64_t ukey, void *out, size_t cap, size_t *len)
{
    uint8_t k[16];
    encode_map_key(key, ukey, k);
    return rocks_read((rocks_sys *)s, k, sizeof k, out, cap, len);
}

static int rocks_sync(kv_sys *s)
{
    (void)s;
    return 0;
}

static void rocks_close(kv_sys *s)
{
    rocks_sys *r = (rocks_sys *)s;
    if (r->db) rocksdb_close(r->db);
    rocksdb_options_destroy(r->opts); /* also releases the merge operator it holds */
    rocksdb_writeoptions_destroy(r->wopts);
    rocksdb_readoptions_destroy(r->ropts);
    rocksdb_cache_destroy(r->cache);
    free(r);
}

static const kv_ops rocks_ops = {
    .value_get = rocks_value_get,
    .value_put = rocks_value_put,
    .list_add = rocks_list_add,
    .list_get = rocks_value_get,
    .map_put = rocks_map_put,
    .map_get = rocks_map_get,
    .sync = rocks_sync,
    .close = rocks_close,
};

int peer_rocksdb_open(const kv_plan *plan, kv_sys **out, char *why, size_t whylen)
{
    rocks_sys *r = calloc(1, sizeof *r);
    if (!r) return WHY("out of memory");
    r->base = (kv_sys){.ops = &rocks_ops, .name = "rocksdb", .batch = 1};
    r->opts = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(r->opts, 1);
    rocksdb_options_set_max_background_jobs(r->opts, 2);
    rocksdb_options_set_merge_operator(
        r->opts, rocksdb_mergeoperator_create(NULL, append_destroy, append_full, append_partial,
                                              append_free, append_name));
    r->cache = rocksdb_cache_create_lru(256u << 20);
    rocksdb_block_based_table_options_t *table = rocksdb_block_based_options_create();
    rocksdb_block_based_options_set_block_cache(table, r->cache);
    rocksdb_options_set_block_based_table_factory(r->opts, table);
    rocksdb_block_based_options_destroy(table);
    r->wopts = rocksdb_writeoptions_create();
    rocksdb_writeoptions_disable_WAL(r->wopts, 1);
    rocksdb_writeoptions_set_sync(r->wopts, 0);
    r->ropts = rocksdb_readoptions_create();
    char *err = NULL;
    r->db = rocksdb_open(r->opts, plan->dir, &err);
    if (err) {
        snprintf(why, whylen, "rocksdb_open %s: %s", plan->dir, err);
        rocksdb_free(err);
        r->db = NULL;
        rocks_close(&r->base);
        return -1;
    }
    *out = &r->base;
    return 0;
}

#else

int peer_rocksdb_open(const kv_plan *plan, kv_sys **out, char *why, size_t whylen)
{
    (void)plan, (void)out;
    return WHY("built without RocksDB (librocksdb-dev not found)");
}

#endif

/* ------------------------------------------------------------------------ */
/* Redis: a private redis-server (no RDB, no AOF) on a free loopback port,    */
/* reached through hiredis. Values are strings, lists are lists (RPUSH,      */
/* LRANGE), maps are hashes (HSET, HGET). Pipelined, commands are queued     */
/* and their replies read at sync(); otherwise each waits for its reply.     */

#ifdef STASH_HAVE_HIREDIS

struct peer_redis_server {
    pid_t pid;
    int port;
};

typedef enum redis_expect { EXPECT_DONE, EXPECT_STRING, EXPECT_LIST } redis_expect;

typedef struct redis_sys {
    kv_sys base;
    redisContext *c;
    redis_expect *pending; /* what each queued command's reply should be */
    unsigned npending;
    uint64_t baseline; /* used_memory of the empty server */
    uint8_t scratch[1 << 16];
} redis_sys;

static int redis_fail(redis_sys *r, const char *what)
{
    snprintf(r->base.error, sizeof r->base.error, "%s: %s", what,
             r->c->err ? r->c->errstr : "unexpected reply");
    return -EIO;
}

/* Checks one reply against what its command should return, copying a string
 * or the elements of a list into out. */
static int redis_take(redis_sys *r, redisReply *rep, redis_expect e, void *out, size_t cap,
                      size_t *len)
{
    int rc = 0;
    if (!rep) return redis_fail(r, "redisGetReply");
    if (rep->type == REDIS_REPLY_ERROR) {
        snprintf(r->base.error, sizeof r->base.error, "redis: %s", rep->str);
        rc = -EIO;
    } else if (e == EXPECT_STRING) {
        rc = rep->type == REDIS_REPLY_NIL      ? -ENOENT
             : rep->type == REDIS_REPLY_STRING ? copy_out(rep->str, rep->len, out, cap, len)
                                               : redis_fail(r, "GET");
    } else if (e == EXPECT_LIST) {
        if (rep->type != REDIS_REPLY_ARRAY) rc = redis_fail(r, "LRANGE");
        if (rc == 0 && rep->elements == 0) rc = -ENOENT;
        size_t off = 0;
        for (size_t i = 0; rc == 0 && i < rep->elements; i++) {
            size_t n = 0;
            rc = copy_out(rep->element[i]->str, rep->element[i]->len, (uint8_t *)out + off,
                          cap - off, &n);
            off += n;
        }
        *len = off;
    }
    freeReplyObject(rep);
    return rc;
}

/* Queues a command (argv form: binary-safe). Without pipelining it also
 * waits for the reply and copies it to out. */
static int redis_issue(redis_sys *r, redis_expect e, int argc, const char **argv,
                       const size_t *lens, void *out, size_t cap, size_t *len)
{
    if (redisAppendCommandArgv(r->c, argc, argv, lens) != REDIS_OK) return redis_fail(r, argv[0]);
    if (r->base.batch > 1) {
        r->pending[r->npending++] = e;
        if (len) *len = 0;
        return 0;
    }
    void *rep = NULL;
    if (redisGetReply(r->c, &rep) != REDIS_OK) return redis_fail(r, argv[0]);
    return redis_take(r, rep, e, out, cap, len);
}

static int redis_value_get(kv_sys *s, uint64_t key, void *out, size_t cap, size_t *len)
{
    uint8_t k[8];
    encode_key(key, k);
    const char *argv[] = {"GET", (char *)k};
    const size_t lens[] = {3, 8};
    return redis_issue((redis_sys *)s, EXPECT_STRING, 2, argv, lens, out, cap, len);
}

static int redis_value_put(kv_sys *s, uint64_t key, const void *v, size_t len)
{
    uint8_t k[8];
    encode_key(key, k);
    const char *argv[] = {"SET", (char *)k, v};
    const size_t lens[] = {3, 8, len};
    return redis_issue((redis_sys *)s, EXPECT_DONE, 3, argv, lens, NULL, 0, NULL);
}

static int redis_list_add(kv_sys *s, uint64_t key, const void *v, size_t len)
{
    uint8_t k[8];
    encode_key(key, k);
    const char *argv[] = {"RPUSH", (char *)k, v};
    const size_t lens[] = {5, 8, len};
    return redis_issue((redis_sys *)s, EXPECT_DONE, 3, argv, lens, NULL, 0, NULL);
}

static int redis_list_get(kv_sys *s, uint64_t key, void *out, size_t cap, size_t *len)
{
    uint8_t k[8];
    encode_key(key, k);
    const char *argv[] = {"LRANGE", (char *)k, "0", "-1"};
    const size_t lens[] = {6, 8, 1, 2};
    return redis_issue((redis_sys *)s, EXPECT_LIST, 4, argv, lens, out, cap, len);
}

static int redis_map_put(kv_sys *s, uint64_t key, uint64_t ukey, const void *v, size_t len)
{
    uint8_t k[8], u[8];
    encode_key(key, k);
    encode_key(ukey, u);
    const char *argv[] = {"HSET", (char *)k, (char *)u, v};
    const size_t lens[] = {4, 8, 8, len};
    return redis_issue((redis_sys *)s, EXPECT_DONE, 4, argv, lens, NULL, 0, NULL);
}

static int redis_map_get(kv_sys *s, uint64_t key, uint64_t ukey, void *out, size_t cap, size_t *len)
{
    uint8_t k[8], u[8];
    encode_key(key, k);
    encode_key(ukey, u);
    const char *argv[] = {"HGET", (char *)k, (char *)u};
    const size_t lens[] = {4, 8, 8};
    return redis_issue((redis_sys *)s, EXPECT_STRING, 3, argv, lens, out, cap, len);
}

/* Reads the replies of every queued command; the first failure wins. */
static int redis_sync(kv_sys *s)
{
    redis_sys *r = (redis_sys *)s;
    int rc = 0;
    for (unsigned i = 0; i < r->npending; i++) {
        void *rep = NULL;
        if (redisGetReply(r->c, &rep) != REDIS_OK) {
            r->npending = 0;
            return redis_fail(r, "redisGetReply");
        }
        size_t len;
        int one = redis_take(r, rep, r->pending[i], r->scratch, sizeof r->scratch, &len);
        if (rc == 0) rc = one;
    }
    r->npending = 0;
    return rc;
}

static int redis_used_memory(redis_sys *r, uint64_t *bytes)
{
    redisReply *rep = redisCommand(r->c, "INFO memory");
    if (!rep) return redis_fail(r, "INFO");
    const char *p = rep->type == REDIS_REPLY_STRING ? strstr(rep->str, "used_memory:") : NULL;
    if (p) *bytes = strtoull(p + strlen("used_memory:"), NULL, 10);
    freeReplyObject(rep);
    return p ? 0 : redis_fail(r, "INFO memory");
}

/* The server's memory beyond what it used empty. */
static int redis_footprint(kv_sys *s, uint64_t *bytes)
{
    redis_sys *r = (redis_sys *)s;
    int rc = redis_used_memory(r, bytes);
    if (rc == 0) *bytes -= *bytes > r->baseline ? r->baseline : *bytes;
    return rc;
}

static void redis_close(kv_sys *s)
{
    redis_sys *r = (redis_sys *)s;
    redisFree(r->c);
    free(r->pending);
    free(r);
}

static const kv_ops redis_ops = {
    .value_get = redis_value_get,
    .value_put = redis_value_put,
    .list_add = redis_list_add,
    .list_get = redis_list_get,
    .map_put = redis_map_put,
    .map_get = redis_map_get,
    .sync = redis_sync,
    .footprint = redis_footprint,
    .close = redis_close,
};

/* A port nobody listens on now; the server may still lose a race for it,
 * which the caller's retry covers. */
static int free_loopback_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &alen) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

static bool in_path(const char *prog)
{
    const char *path = getenv("PATH");
    char buf[PATH_MAX];
    for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
        size_t n = strcspn(p, ":");
        snprintf(buf, sizeof buf, "%.*s/%s", (int)n, p, prog);
        if (access(buf, X_OK) == 0) return true;
        p += n + (p[n] == ':');
    }
    return false;
}

/* Starts redis-server on port and waits until it answers PING (5 s at most).
 * Returns its pid, or -1 with why set (and the server reaped). */
static pid_t spawn_redis(const char *dir, int port, char *why, size_t whylen)
{
    char portstr[16], log[PATH_MAX];
    snprintf(portstr, sizeof portstr, "%d", port);
    snprintf(log, sizeof log, "%s/redis.log", dir);
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) return WHY("fork: %s", strerror(errno));
    if (pid == 0) {
        /* A bench that dies leaves no server behind. */
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent) _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) dup2(fd, STDOUT_FILENO), dup2(fd, STDERR_FILENO);
        execlp("redis-server", "redis-server", "--port", portstr, "--bind", "127.0.0.1", "--save",
               "", "--appendonly", "no", "--dir", dir, "--daemonize", "no", "--logfile", "",
               (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 500; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            /* Its last log line says why; redis marks warnings with '#'. */
            char last[256] = "";
            FILE *f = fopen(log, "r");
            for (char line[256]; f && fgets(line, sizeof line, f);)
                if (line[0] != '\n') snprintf(last, sizeof last, "%s", line);
            if (f) fclose(f);
            last[strcspn(last, "\n")] = 0;
            const char *mark = strstr(last, "# ");
            return WHY("redis-server exited: %s", mark ? mark + 2 : last);
        }
        redisContext *c = redisConnect("127.0.0.1", port);
        redisReply *rep = c && !c->err ? redisCommand(c, "PING") : NULL;
        bool up = rep && rep->type == REDIS_REPLY_STATUS;
        if (rep) freeReplyObject(rep);
        redisFree(c);
        if (up) return pid;
        nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return WHY("redis-server did not answer on port %d within 5 s", port);
}

int peer_redis_start(const char *dir, peer_redis_server **out, char *why, size_t whylen)
{
    if (!in_path("redis-server")) return WHY("redis-server not installed");
    peer_redis_server *srv = calloc(1, sizeof *srv);
    if (!srv) return WHY("out of memory");
    for (int attempt = 0; attempt < 3; attempt++) {
        srv->port = free_loopback_port();
        if (srv->port < 0) {
            free(srv);
            return WHY("no free loopback port: %s", strerror(errno));
        }
        srv->pid = spawn_redis(dir, srv->port, why, whylen);
        if (srv->pid > 0) {
            *out = srv;
            return 0;
        }
    }
    free(srv);
    return -1;
}

void peer_redis_stop(peer_redis_server *srv)
{
    if (!srv) return;
    kill(srv->pid, SIGTERM);
    bool reaped = false;
    for (int i = 0; i < 500 && !reaped; i++) {
        reaped = waitpid(srv->pid, NULL, WNOHANG) == srv->pid;
        if (!reaped) nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
    }
    if (!reaped) {
        kill(srv->pid, SIGKILL);
        waitpid(srv->pid, NULL, 0);
    }
    free(srv);
}

/* Connects to srv: emptied first with flush. */
static int redis_connect(peer_redis_server *srv, unsigned depth, bool flush, kv_sys **out,
                         char *why, size_t whylen)
{
    redis_sys *r = calloc(1, sizeof *r);
    if (r) r->pending = calloc(depth, sizeof *r->pending);
    if (!r || !r->pending) {
        free(r);
        return WHY("out of memory");
    }
    r->base = (kv_sys){.ops = &redis_ops,
                       .name = depth > 1 ? "redis-pipelined" : "redis",
                       .batch = depth,
                       .shares_data = depth == 1};
    r->c = redisConnect("127.0.0.1", srv->port);
    redisReply *rep = r->c && !r->c->err ? redisCommand(r->c, flush ? "FLUSHALL" : "PING") : NULL;
    int rc = rep && rep->type == REDIS_REPLY_STATUS ? 0 : -1;
    if (rep) freeReplyObject(rep);
    if (rc == 0) rc = redis_used_memory(r, &r->baseline);
    if (rc < 0) {
        snprintf(why, whylen, "redis on port %d: %s", srv->port,
                 r->c && r->c->err ? r->c->errstr : "FLUSHALL failed");
        redis_close(&r->base);
        return -1;
    }
    *out = &r->base;
    return 0;
}

int peer_redis_open(peer_redis_server *srv, unsigned depth, kv_sys **out, char *why, size_t whylen)
{
    return redis_connect(srv, depth, true, out, why, whylen);
}

/* A number from a section of INFO. */
static int redis_info(redisContext *c, const char *section, const char *field, uint64_t *out)
{
    redisReply *rep = redisCommand(c, "INFO %s", section);
    char key[64];
    snprintf(key, sizeof key, "\n%s:", field);
    const char *p = rep && rep->type == REDIS_REPLY_STRING ? strstr(rep->str, key) : NULL;
    if (p) *out = strtoull(p + strlen(key), NULL, 10);
    if (rep) freeReplyObject(rep);
    return p ? 0 : -1;
}

/* Replays ops against srv until killed: the load during a BGSAVE. */
static int bgsave_load(peer_redis_server *srv, const ycsb_op *ops, uint64_t nops,
                       unsigned value_len)
{
    kv_sys *s;
    char why[256];
    if (redis_connect(srv, 64, false, &s, why, sizeof why) < 0) return 1;
    uint8_t value[4096] = {0}, buf[4096];
    for (uint64_t i = 0;; i++) {
        const ycsb_op *op = &ops[i % nops];
        size_t len;
        value[0] = (uint8_t)i;
        int rc = op->kind == YCSB_PUT ? s->ops->value_put(s, op->key, value, value_len)
                                      : s->ops->value_get(s, op->key, buf, sizeof buf, &len);
        if (rc == 0 && i % 64 == 63) rc = s->ops->sync(s);
        if (rc) return 1;
    }
}

int peer_redis_bgsave(peer_redis_server *srv, const ycsb_op *ops, uint64_t nops, unsigned value_len,
                      uint64_t *cow, uint64_t *dataset, char *why, size_t whylen)
{
    redisContext *c = redisConnect("127.0.0.1", srv->port);
    if (!c || c->err) {
        redisFree(c);
        return WHY("redis on port %d: cannot connect", srv->port);
    }
    int rc = redis_info(c, "memory", "used_memory_dataset", dataset);
    fflush(NULL);
    pid_t load = rc == 0 ? fork() : -1;
    if (load == 0) _exit(bgsave_load(srv, ops, nops, value_len));
    /* Let the load run a moment, as the stash case does before it checkpoints. */
    if (load > 0) nanosleep(&(struct timespec){.tv_nsec = 100000000}, NULL);
    redisReply *rep = load > 0 ? redisCommand(c, "BGSAVE") : NULL;
    rc = rep && rep->type == REDIS_REPLY_STATUS ? 0 : -1;
    if (rep) freeReplyObject(rep);
    uint64_t busy = 1, ok = 0;
    for (int i = 0; rc == 0 && busy && i < 60000; i++) {
        nanosleep(&(struct timespec){.tv_nsec = 5000000}, NULL);
        rc = redis_info(c, "persistence", "rdb_bgsave_in_progress", &busy);
    }
    if (load > 0) {
        kill(load, SIGKILL);
        waitpid(load, NULL, 0);
    }
    rep = rc == 0 && !busy ? redisCommand(c, "INFO persistence") : NULL;
    if (rep && rep->type == REDIS_REPLY_STRING)
        ok = strstr(rep->str, "rdb_last_bgsave_status:ok") != NULL;
    if (rep) freeReplyObject(rep);
    if (ok) rc = redis_info(c, "persistence", "rdb_last_cow_size", cow);
    redisFree(c);
    return rc == 0 && ok ? 0 : WHY("BGSAVE on port %d failed or never finished", srv->port);
}

#else

int peer_redis_bgsave(peer_redis_server *srv, const ycsb_op *ops, uint64_t nops, unsigned value_len,
                      uint64_t *cow, uint64_t *dataset, char *why, size_t whylen)
{
    (void)srv, (void)ops, (void)nops, (void)value_len, (void)cow, (void)dataset;
    return WHY("built without hiredis (libhiredis-dev not found)");
}

void peer_redis_stop(peer_redis_server *srv)
{
    (void)srv;
}

int peer_redis_start(const char *dir, peer_redis_server **out, char *why, size_t whylen)
{
    (void)dir, (void)out;
    return WHY("built without hiredis (libhiredis-dev not found)");
}

int peer_redis_open(peer_redis_server *srv, unsigned depth, kv_sys **out, char *why, size_t whylen)
{
    (void)srv, (void)depth, (void)out;
    return WHY("built without hiredis (libhiredis-dev not found)");
}

#endif
