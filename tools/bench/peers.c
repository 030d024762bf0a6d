/* SPDX-License-Identifier: MIT */
/*
 * peers.c: the keyed bench's peers, each used the way its own users
 * would hold keyed state: LMDB with batched write transactions, RocksDB
 * with the WAL off (as Flink runs it); the raw tables are in raw.h, Redis
 * in redis.c.
 * Reads copy the value out, as a caller that deserializes it would.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef STASH_HAVE_ROCKSDB
#include <rocksdb/c.h>
#endif

#include "tools/bench/peers.h"

static void encode_map_key(uint64_t key, uint64_t ukey, uint8_t out[16])
{
    memcpy(out, &key, 8);
    memcpy(out + 8, &ukey, 8);
}

/* ------------------------------------------------------------------------ */
/* LMDB at its best for this work: one environment, MDB_NOSYNC (no durable   */
/* commits, as stash's lmdb store between checkpoints), MDB_WRITEMAP (writes */
/* straight into the map), MDB_NORDAHEAD (random reads of a map larger than  */
/* memory read no pages they do not ask for), MDB_INTEGERKEY where every key */
/* is 8 bytes; writes committed in transactions of PEER_LMDB_COMMIT_EVERY;   */
/* reads go through the open write transaction (to see its writes) or a     */
/* reused read-only one. A list is one value: its elements one after       */
/* another, rewritten on append.                                            */

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
    return ++l->writes >= PEER_LMDB_COMMIT_EVERY ? lmdb_commit(l) : 0;
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
    if (rc == 0)
        rc = mdb_env_open(l->env, plan->dir, MDB_NOSYNC | MDB_WRITEMAP | MDB_NORDAHEAD, 0600);
    if (rc == 0) {
        what = "opening the database";
        rc = mdb_txn_begin(l->env, NULL, 0, &txn);
    }
    if (rc == 0) rc = mdb_dbi_open(txn, NULL, plan->integer_keys ? MDB_INTEGERKEY : 0, &l->dbi);
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
/* appends (Flink's ListState on RocksDB does the same). At its best, as     */
/* db_bench's readrandom is run: a full bloom filter of 10 bits a key, and   */
/* the data flushed and compacted before a case that only reads. As Flink    */
/* sets it up: no bloom filter, reads wherever the writes left the data.     */
/* Either way its flushes and compactions are waited for between passes,    */
/* not inside one.                                                          */

#ifdef STASH_HAVE_ROCKSDB

typedef struct rocks_sys {
    kv_sys base;
    rocksdb_t *db;
    rocksdb_options_t *opts;
    rocksdb_writeoptions_t *wopts;
    rocksdb_readoptions_t *ropts;
    rocksdb_cache_t *cache;
    bool flink;
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

/* Waits for the flushes and compactions the writes set off: on two cores
 * they would otherwise run during the next pass, whichever system's. */
static int rocks_quiesce(kv_sys *s)
{
    rocks_sys *r = (rocks_sys *)s;
    static const char *const busy[] = {"rocksdb.num-running-compactions",
                                       "rocksdb.num-running-flushes", "rocksdb.compaction-pending",
                                       "rocksdb.mem-table-flush-pending"};
    for (int waited_ms = 0; waited_ms < 60000; waited_ms++) {
        bool idle = true;
        for (size_t i = 0; i < sizeof busy / sizeof busy[0] && idle; i++) {
            uint64_t v = 0;
            idle = rocksdb_property_int(r->db, busy[i], &v) != 0 || v == 0;
        }
        if (idle) return 0;
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
    return 0;
}

/* At its best: the memtable flushed and everything compacted into one
 * level, so that a read finds a key in one file, its filter first. */
static int rocks_ready_reads(kv_sys *s)
{
    rocks_sys *r = (rocks_sys *)s;
    if (r->flink) return 0;
    char *err = NULL;
    rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
    rocksdb_flushoptions_set_wait(fo, 1);
    rocksdb_flush(r->db, fo, &err);
    rocksdb_flushoptions_destroy(fo);
    if (err) return rocks_fail(r, "rocksdb_flush", err);
    rocksdb_compact_range(r->db, NULL, 0, NULL, 0);
    return rocks_quiesce(s);
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
    .quiesce = rocks_quiesce,
    .ready_reads = rocks_ready_reads,
    .close = rocks_close,
};

int peer_rocksdb_open(const kv_plan *plan, bool flink, kv_sys **out, char *why, size_t whylen)
{
    rocks_sys *r = calloc(1, sizeof *r);
    if (!r) return WHY("out of memory");
    r->base = (kv_sys){.ops = &rocks_ops, .name = flink ? "rocksdb-flink" : "rocksdb", .batch = 1};
    r->flink = flink;
    r->opts = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(r->opts, 1);
    rocksdb_options_set_max_background_jobs(r->opts, 2);
    rocksdb_options_set_merge_operator(
        r->opts, rocksdb_mergeoperator_create(NULL, append_destroy, append_full, append_partial,
                                              append_free, append_name));
    r->cache = rocksdb_cache_create_lru(256u << 20);
    rocksdb_block_based_table_options_t *table = rocksdb_block_based_options_create();
    rocksdb_block_based_options_set_block_cache(table, r->cache);
    if (!flink)
        rocksdb_block_based_options_set_filter_policy(table,
                                                      rocksdb_filterpolicy_create_bloom_full(10));
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

int peer_rocksdb_open(const kv_plan *plan, bool flink, kv_sys **out, char *why, size_t whylen)
{
    (void)plan, (void)flink, (void)out;
    return WHY("built without RocksDB (librocksdb-dev not found)");
}

#endif
