/* SPDX-License-Identifier: MIT */
/*
 * timers.c: `stash bench timers`: 1M keys (--quick: 100K), each with one
 * event-time timer at a pseudo-random time, registered and fired, or
 * registered and deleted, and a watermark advanced in steps that each make
 * 1% of them due; beside, on the same sequences in the same run: the speed
 * limit (a heap of (time, key) pairs inline and a set of them, in private
 * memory), a binary heap of slots with a hash set (Flink's heap timers),
 * LMDB and RocksDB holding timers as ordered keys (Flink's RocksDB timers). Also a checkpoint's
 * synchronous pause with 10K and with 1M timers: timers are state, and the pause does not grow with
 * them.
 */
#include <errno.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef STASH_HAVE_ROCKSDB
#include <rocksdb/c.h>
#endif

#include "tools/bench/bench.h"

#define STEPS 100u /* advances of advance-1pct: each makes 1% due */

typedef struct tsys tsys;

/* A system's timers: (key, time) pairs, one timer per pair. advance fires
 * every timer at or before watermark, in time order, and returns how many
 * (or a negative error, with error set). */
typedef struct tsys_ops {
    int (*reg)(tsys *s, uint64_t key, uint64_t ts);
    int (*del)(tsys *s, uint64_t key, uint64_t ts);
    int64_t (*advance)(tsys *s, uint64_t watermark);
    void (*close)(tsys *s);
} tsys_ops;

struct tsys {
    const tsys_ops *ops;
    const char *name;
    uint64_t fired_keys; /* the sum of the keys fired: every system must agree */
    char error[256];
};

typedef struct tbench {
    bench_opts o;
    uint64_t n;   /* timers */
    uint64_t *ts; /* key k's timer time */
    uint64_t span;
    char dir[512];
    char arena[64];
} tbench;

/* ---- stash -------------------------------------------------------------------- */

typedef struct stash_sys {
    tsys base;
    const tbench *b;
    stash_worker *w;
    stash_timers *t;
} stash_sys;

static int stash_fired(const stash_timer *t, void *ctx)
{
    uint64_t k;
    memcpy(&k, t->key.data, sizeof k);
    ((tsys *)ctx)->fired_keys += k;
    return 0;
}

static int stash_reg(tsys *s, uint64_t key, uint64_t ts)
{
    stash_sys *x = (stash_sys *)s;
    int rc = stash_key_set(x->w, &key, sizeof key);
    return rc ? rc : stash_timer_register(x->t, STASH_EVENT_TIME, NULL, 0, ts);
}

static int stash_del(tsys *s, uint64_t key, uint64_t ts)
{
    stash_sys *x = (stash_sys *)s;
    int rc = stash_key_set(x->w, &key, sizeof key);
    return rc ? rc : stash_timer_delete(x->t, STASH_EVENT_TIME, NULL, 0, ts);
}

static int64_t stash_adv(tsys *s, uint64_t watermark)
{
    stash_sys *x = (stash_sys *)s;
    return stash_timers_advance(x->t, watermark, stash_fired, s);
}

static void stash_sys_close(tsys *s)
{
    stash_sys *x = (stash_sys *)s;
    stash_worker_close(x->w);
    stash_arena_destroy(x->b->arena, NULL);
    free(x);
}

static const tsys_ops stash_ops = {stash_reg, stash_del, stash_adv, stash_sys_close};

static int stash_open(const tbench *b, tsys **out)
{
    char envs[sizeof b->dir + 80];
    snprintf(envs, sizeof envs, "%s/%s.lmdb", b->dir, b->arena);
    stash_arena *a;
    int rc = stash_arena_create(b->arena,
                                &(stash_arena_opts){.sz = sizeof(stash_arena_opts),
                                                    .size = b->n * 256 + (64ull << 20),
                                                    .flags = STASH_ARENA_REPLACE,
                                                    .backend = b->o.backend,
                                                    .lmdb_dir = envs},
                                &a);
    if (rc < 0) return rc;
    stash_arena_close(a);
    stash_sys *x = calloc(1, sizeof *x);
    if (!x) return -ENOMEM;
    x->base = (tsys){.ops = &stash_ops, .name = "stash"};
    x->b = b;
    rc = stash_worker_open(b->arena, NULL, &x->w);
    if (rc == 0) rc = stash_timers_get(x->w, "bench", &x->t);
    if (rc < 0) {
        stash_worker_close(x->w);
        stash_arena_destroy(b->arena, NULL);
        free(x);
        return rc;
    }
    *out = &x->base;
    return 0;
}

/* ---- a binary heap with a hash set, in private memory ------------------------ */

typedef struct heap_timer {
    uint64_t key, ts;
    uint32_t pos; /* in the heap */
} heap_timer;

typedef struct heap_sys {
    tsys base;
    heap_timer *t; /* the timers, by slot */
    uint32_t *free_slots, nfree, used;
    uint32_t *heap, n;
    uint32_t *set; /* open addressing: slot + 1, 0 empty, UINT32_MAX removed */
    uint64_t mask;
} heap_sys;

static uint64_t mix(uint64_t key, uint64_t ts)
{
    uint64_t x = key * 0x9e3779b97f4a7c15ull ^ ts * 0xc2b2ae3d27d4eb4full;
    return x ^ x >> 29;
}

static bool before(const heap_sys *h, uint32_t a, uint32_t b)
{
    const heap_timer *x = &h->t[a], *y = &h->t[b];
    return x->ts != y->ts ? x->ts < y->ts : x->key < y->key;
}

static void put_at(heap_sys *h, uint32_t i, uint32_t slot)
{
    h->heap[i] = slot;
    h->t[slot].pos = i;
}

static void sift_up(heap_sys *h, uint32_t i)
{
    uint32_t slot = h->heap[i];
    while (i > 0 && before(h, slot, h->heap[(i - 1) / 2])) {
        put_at(h, i, h->heap[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    put_at(h, i, slot);
}

static void sift_down(heap_sys *h, uint32_t i)
{
    uint32_t slot = h->heap[i];
    for (;;) {
        uint32_t l = 2 * i + 1, m = i;
        uint32_t best = slot;
        if (l < h->n && before(h, h->heap[l], best)) m = l, best = h->heap[l];
        if (l + 1 < h->n && before(h, h->heap[l + 1], best)) m = l + 1;
        if (m == i) break;
        put_at(h, i, h->heap[m]);
        i = m;
    }
    put_at(h, i, slot);
}

/* The set's cell of (key, ts), or the empty cell where it would go. */
static uint64_t find_cell(const heap_sys *h, uint64_t key, uint64_t ts, bool *found)
{
    uint64_t i = mix(key, ts) & h->mask, grave = UINT64_MAX;
    for (;; i = (i + 1) & h->mask) {
        uint32_t c = h->set[i];
        if (c == 0) {
            *found = false;
            return grave != UINT64_MAX ? grave : i;
        }
        if (c == UINT32_MAX) {
            if (grave == UINT64_MAX) grave = i;
            continue;
        }
        if (h->t[c - 1].key == key && h->t[c - 1].ts == ts) {
            *found = true;
            return i;
        }
    }
}

static int heap_reg(tsys *s, uint64_t key, uint64_t ts)
{
    heap_sys *h = (heap_sys *)s;
    bool found;
    uint64_t cell = find_cell(h, key, ts, &found);
    if (found) return 0;
    uint32_t slot = h->nfree ? h->free_slots[--h->nfree] : h->used++;
    h->t[slot] = (heap_timer){key, ts, 0};
    h->set[cell] = slot + 1;
    h->heap[h->n] = slot;
    sift_up(h, h->n++);
    return 0;
}

/* Takes the timer of heap position i out of the heap. */
static void heap_remove_at(heap_sys *h, uint32_t i)
{
    uint32_t last = h->heap[--h->n];
    if (i == h->n) return;
    put_at(h, i, last);
    if (i > 0 && before(h, last, h->heap[(i - 1) / 2]))
        sift_up(h, i);
    else
        sift_down(h, i);
}

static int heap_del(tsys *s, uint64_t key, uint64_t ts)
{
    heap_sys *h = (heap_sys *)s;
    bool found;
    uint64_t cell = find_cell(h, key, ts, &found);
    if (!found) return 0;
    uint32_t slot = h->set[cell] - 1;
    h->set[cell] = UINT32_MAX;
    heap_remove_at(h, h->t[slot].pos);
    h->free_slots[h->nfree++] = slot;
    return 0;
}

static int64_t heap_adv(tsys *s, uint64_t watermark)
{
    heap_sys *h = (heap_sys *)s;
    int64_t fired = 0;
    while (h->n && h->t[h->heap[0]].ts <= watermark) {
        uint32_t slot = h->heap[0];
        heap_timer t = h->t[slot];
        bool found;
        h->set[find_cell(h, t.key, t.ts, &found)] = UINT32_MAX;
        heap_remove_at(h, 0);
        h->free_slots[h->nfree++] = slot;
        s->fired_keys += t.key;
        fired++;
    }
    return fired;
}

static void heap_sys_close(tsys *s)
{
    heap_sys *h = (heap_sys *)s;
    free(h->t);
    free(h->free_slots);
    free(h->heap);
    free(h->set);
    free(h);
}

static const tsys_ops heap_ops = {heap_reg, heap_del, heap_adv, heap_sys_close};

static int heap_open(const tbench *b, tsys **out)
{
    heap_sys *h = calloc(1, sizeof *h);
    if (!h) return -ENOMEM;
    h->base = (tsys){.ops = &heap_ops, .name = "private-heap"};
    uint64_t cells = 1;
    while (cells < 2 * b->n) cells <<= 1;
    h->mask = cells - 1;
    h->t = malloc(b->n * sizeof *h->t);
    h->free_slots = malloc(b->n * sizeof *h->free_slots);
    h->heap = malloc(b->n * sizeof *h->heap);
    h->set = calloc(cells, sizeof *h->set);
    if (!h->t || !h->free_slots || !h->heap || !h->set) {
        heap_sys_close(&h->base);
        return -ENOMEM;
    }
    *out = &h->base;
    return 0;
}

/* ---- the limit: a binary heap of (time, key) inline, a set of the same ------------ */

/* The fastest a private timer queue does this work: the heap holds the
 * pairs themselves (a comparison reads no other memory), the set holds
 * them too; a delete only leaves the set, and a pair popped that the set
 * no longer holds is passed over (lazy deletion). */

typedef struct inline_timer {
    uint64_t ts, key;
} inline_timer;

typedef struct inline_sys {
    tsys base;
    inline_timer *heap;
    uint64_t n, cap;
    inline_timer *cells;
    uint8_t *state; /* 0 empty, 1 held, 2 removed */
    uint64_t mask;
} inline_sys;

static bool inline_before(inline_timer a, inline_timer b)
{
    return a.ts != b.ts ? a.ts < b.ts : a.key < b.key;
}

/* The set's cell of t, or the cell where it would go (*found false). */
static uint64_t inline_cell(const inline_sys *h, inline_timer t, bool *found)
{
    uint64_t i = mix(t.key, t.ts) & h->mask, grave = UINT64_MAX;
    for (;; i = (i + 1) & h->mask) {
        if (h->state[i] == 0) {
            *found = false;
            return grave != UINT64_MAX ? grave : i;
        }
        if (h->state[i] == 2) {
            if (grave == UINT64_MAX) grave = i;
        } else if (h->cells[i].key == t.key && h->cells[i].ts == t.ts) {
            *found = true;
            return i;
        }
    }
}

static int inline_reg(tsys *s, uint64_t key, uint64_t ts)
{
    inline_sys *h = (inline_sys *)s;
    inline_timer t = {ts, key};
    bool found;
    uint64_t c = inline_cell(h, t, &found);
    if (found) return 0;
    if (h->n == h->cap) {
        inline_timer *p = realloc(h->heap, 2 * h->cap * sizeof *p);
        if (!p) return -ENOMEM;
        h->heap = p, h->cap *= 2;
    }
    h->cells[c] = t, h->state[c] = 1;
    uint64_t i = h->n++;
    while (i > 0 && inline_before(t, h->heap[(i - 1) / 2])) {
        h->heap[i] = h->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->heap[i] = t;
    return 0;
}

static int inline_del(tsys *s, uint64_t key, uint64_t ts)
{
    inline_sys *h = (inline_sys *)s;
    bool found;
    uint64_t c = inline_cell(h, (inline_timer){ts, key}, &found);
    if (found) h->state[c] = 2;
    return 0;
}

static inline_timer inline_pop(inline_sys *h)
{
    inline_timer top = h->heap[0], last = h->heap[--h->n];
    uint64_t i = 0;
    for (;;) {
        uint64_t l = 2 * i + 1, m = l;
        if (l >= h->n) break;
        if (l + 1 < h->n && inline_before(h->heap[l + 1], h->heap[l])) m = l + 1;
        if (!inline_before(h->heap[m], last)) break;
        h->heap[i] = h->heap[m];
        i = m;
    }
    if (h->n) h->heap[i] = last;
    return top;
}

static int64_t inline_adv(tsys *s, uint64_t watermark)
{
    inline_sys *h = (inline_sys *)s;
    int64_t fired = 0;
    while (h->n && h->heap[0].ts <= watermark) {
        inline_timer t = inline_pop(h);
        bool found;
        uint64_t c = inline_cell(h, t, &found);
        if (!found) continue; /* deleted */
        h->state[c] = 2;
        s->fired_keys += t.key;
        fired++;
    }
    return fired;
}

static void inline_close(tsys *s)
{
    inline_sys *h = (inline_sys *)s;
    free(h->heap);
    free(h->cells);
    free(h->state);
    free(h);
}

static const tsys_ops inline_ops = {inline_reg, inline_del, inline_adv, inline_close};

static int inline_open(const tbench *b, tsys **out)
{
    inline_sys *h = calloc(1, sizeof *h);
    if (!h) return -ENOMEM;
    h->base = (tsys){.ops = &inline_ops, .name = "inline-heap"};
    uint64_t cells = 1;
    while (cells < 2 * b->n) cells <<= 1;
    h->mask = cells - 1;
    h->cap = b->n;
    h->heap = malloc(h->cap * sizeof *h->heap);
    h->cells = malloc(cells * sizeof *h->cells);
    h->state = calloc(cells, 1);
    if (!h->heap || !h->cells || !h->state) {
        inline_close(&h->base);
        return -ENOMEM;
    }
    *out = &h->base;
    return 0;
}

/* ---- ordered keys: time (big-endian) then key ---------------------------------- */

static void order_key(uint64_t key, uint64_t ts, uint8_t out[16])
{
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(ts >> (56 - 8 * i));
    memcpy(out + 8, &key, 8);
}

static uint64_t order_ts(const uint8_t *p)
{
    uint64_t ts = 0;
    for (int i = 0; i < 8; i++) ts = ts << 8 | p[i];
    return ts;
}

/* ---- LMDB ------------------------------------------------------------------------ */

#define LMDB_BATCH 1000 /* writes per transaction, as the keyed bench's LMDB */

typedef struct lmdb_sys {
    tsys base;
    MDB_env *env;
    MDB_dbi dbi;
    MDB_txn *txn;
    unsigned writes;
    char dir[600];
} lmdb_sys;

static int lmdb_err(lmdb_sys *l, const char *what, int rc)
{
    snprintf(l->base.error, sizeof l->base.error, "%s: %s", what, mdb_strerror(rc));
    return -EIO;
}

static int lmdb_txn(lmdb_sys *l)
{
    int rc = l->txn ? 0 : mdb_txn_begin(l->env, NULL, 0, &l->txn);
    return rc ? lmdb_err(l, "mdb_txn_begin", rc) : 0;
}

static int lmdb_wrote(lmdb_sys *l)
{
    if (++l->writes < LMDB_BATCH) return 0;
    l->writes = 0;
    int rc = mdb_txn_commit(l->txn);
    l->txn = NULL;
    return rc ? lmdb_err(l, "mdb_txn_commit", rc) : 0;
}

static int lmdb_reg(tsys *s, uint64_t key, uint64_t ts)
{
    lmdb_sys *l = (lmdb_sys *)s;
    uint8_t k[16];
    order_key(key, ts, k);
    MDB_val mk = {16, k}, mv = {0, NULL};
    int rc = lmdb_txn(l);
    if (rc == 0 && (rc = mdb_put(l->txn, l->dbi, &mk, &mv, 0)) != 0)
        return lmdb_err(l, "mdb_put", rc);
    return rc ? rc : lmdb_wrote(l);
}

static int lmdb_del(tsys *s, uint64_t key, uint64_t ts)
{
    lmdb_sys *l = (lmdb_sys *)s;
    uint8_t k[16];
    order_key(key, ts, k);
    MDB_val mk = {16, k};
    int rc = lmdb_txn(l);
    if (rc == 0 && (rc = mdb_del(l->txn, l->dbi, &mk, NULL)) != 0 && rc != MDB_NOTFOUND)
        return lmdb_err(l, "mdb_del", rc);
    return lmdb_wrote(l);
}

static int64_t lmdb_adv(tsys *s, uint64_t watermark)
{
    lmdb_sys *l = (lmdb_sys *)s;
    int64_t fired = 0;
    for (;;) {
        int rc = lmdb_txn(l);
        MDB_cursor *c;
        if (rc == 0 && (rc = mdb_cursor_open(l->txn, l->dbi, &c)) != 0)
            return lmdb_err(l, "mdb_cursor_open", rc);
        if (rc < 0) return rc;
        MDB_val k, v;
        unsigned n = 0;
        while (n < LMDB_BATCH && (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST)) == 0 &&
               order_ts(k.mv_data) <= watermark) {
            uint64_t key;
            memcpy(&key, (const uint8_t *)k.mv_data + 8, 8);
            s->fired_keys += key;
            if ((rc = mdb_cursor_del(c, 0)) != 0) break;
            fired++;
            n++;
        }
        mdb_cursor_close(c);
        if (rc != 0 && rc != MDB_NOTFOUND) return lmdb_err(l, "mdb_cursor", rc);
        rc = mdb_txn_commit(l->txn);
        l->txn = NULL;
        l->writes = 0;
        if (rc) return lmdb_err(l, "mdb_txn_commit", rc);
        if (n < LMDB_BATCH) return fired;
    }
}

static void lmdb_sys_close(tsys *s)
{
    lmdb_sys *l = (lmdb_sys *)s;
    if (l->txn) mdb_txn_abort(l->txn);
    if (l->env) mdb_env_close(l->env);
    char path[700];
    snprintf(path, sizeof path, "%s/data.mdb", l->dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/lock.mdb", l->dir);
    unlink(path);
    rmdir(l->dir);
    free(l);
}

static const tsys_ops lmdb_ops = {lmdb_reg, lmdb_del, lmdb_adv, lmdb_sys_close};

static int lmdb_open(const tbench *b, tsys **out, char *why, size_t whylen)
{
    lmdb_sys *l = calloc(1, sizeof *l);
    if (!l) return -ENOMEM;
    l->base = (tsys){.ops = &lmdb_ops, .name = "lmdb"};
    snprintf(l->dir, sizeof l->dir, "%s/lmdb", b->dir);
    int rc = mkdir(l->dir, 0700) < 0 ? -errno : 0;
    if (rc == 0) rc = mdb_env_create(&l->env);
    if (rc == 0) rc = mdb_env_set_mapsize(l->env, b->n * 256 + (64ull << 20));
    if (rc == 0) rc = mdb_env_open(l->env, l->dir, MDB_NOSYNC | MDB_WRITEMAP, 0600);
    if (rc == 0) rc = mdb_txn_begin(l->env, NULL, 0, &l->txn);
    if (rc == 0) rc = mdb_dbi_open(l->txn, NULL, 0, &l->dbi);
    if (rc == 0) rc = mdb_txn_commit(l->txn);
    l->txn = NULL;
    if (rc) {
        snprintf(why, whylen, "LMDB in %.200s: %s", l->dir,
                 rc < 0 ? strerror(-rc) : mdb_strerror(rc));
        lmdb_sys_close(&l->base);
        return -1;
    }
    *out = &l->base;
    return 0;
}

/* ---- RocksDB ------------------------------------------------------------------------ */

#ifdef STASH_HAVE_ROCKSDB

typedef struct rocks_sys {
    tsys base;
    rocksdb_t *db;
    rocksdb_options_t *opts;
    rocksdb_writeoptions_t *wopts;
    rocksdb_readoptions_t *ropts;
    uint64_t low; /* no timer is before it: where an advance seeks */
    char dir[600];
} rocks_sys;

static int rocks_err(rocks_sys *r, const char *what, char *err)
{
    snprintf(r->base.error, sizeof r->base.error, "%s: %s", what, err);
    rocksdb_free(err);
    return -EIO;
}

static int rocks_reg(tsys *s, uint64_t key, uint64_t ts)
{
    rocks_sys *r = (rocks_sys *)s;
    uint8_t k[16];
    order_key(key, ts, k);
    if (ts < r->low) r->low = ts;
    char *err = NULL;
    rocksdb_put(r->db, r->wopts, (const char *)k, 16, "", 0, &err);
    return err ? rocks_err(r, "rocksdb_put", err) : 0;
}

static int rocks_del(tsys *s, uint64_t key, uint64_t ts)
{
    rocks_sys *r = (rocks_sys *)s;
    uint8_t k[16];
    order_key(key, ts, k);
    char *err = NULL;
    rocksdb_delete(r->db, r->wopts, (const char *)k, 16, &err);
    return err ? rocks_err(r, "rocksdb_delete", err) : 0;
}

/* Iterates from the lowest time not yet fired (past the tombstones of the
 * fired ones, as a user who knows them would), deleting what fires. */
static int64_t rocks_adv(tsys *s, uint64_t watermark)
{
    rocks_sys *r = (rocks_sys *)s;
    int64_t fired = 0;
    uint8_t low[16];
    order_key(0, r->low, low);
    rocksdb_iterator_t *it = rocksdb_create_iterator(r->db, r->ropts);
    char *err = NULL;
    for (rocksdb_iter_seek(it, (const char *)low, 8); rocksdb_iter_valid(it) && !err;
         rocksdb_iter_next(it)) {
        size_t klen;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
        if (klen != 16 || order_ts(k) > watermark) break;
        uint64_t key;
        memcpy(&key, k + 8, 8);
        s->fired_keys += key;
        rocksdb_delete(r->db, r->wopts, (const char *)k, 16, &err);
        fired++;
    }
    rocksdb_iter_destroy(it);
    if (err) return rocks_err(r, "rocksdb_delete", err);
    if (watermark != UINT64_MAX) r->low = watermark + 1;
    return fired;
}

static void rocks_sys_close(tsys *s)
{
    rocks_sys *r = (rocks_sys *)s;
    if (r->db) rocksdb_close(r->db);
    char *err = NULL;
    rocksdb_destroy_db(r->opts, r->dir, &err);
    rocksdb_free(err);
    rocksdb_options_destroy(r->opts);
    rocksdb_writeoptions_destroy(r->wopts);
    rocksdb_readoptions_destroy(r->ropts);
    free(r);
}

static const tsys_ops rocks_ops = {rocks_reg, rocks_del, rocks_adv, rocks_sys_close};

static int rocks_open(const tbench *b, tsys **out, char *why, size_t whylen)
{
    rocks_sys *r = calloc(1, sizeof *r);
    if (!r) return -ENOMEM;
    r->base = (tsys){.ops = &rocks_ops, .name = "rocksdb"};
    snprintf(r->dir, sizeof r->dir, "%s/rocksdb", b->dir);
    r->opts = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(r->opts, 1);
    rocksdb_options_set_max_background_jobs(r->opts, 2);
    r->wopts = rocksdb_writeoptions_create();
    rocksdb_writeoptions_disable_WAL(r->wopts, 1); /* as Flink's RocksDB backend */
    r->ropts = rocksdb_readoptions_create();
    char *err = NULL;
    r->db = rocksdb_open(r->opts, r->dir, &err);
    if (err) {
        snprintf(why, whylen, "rocksdb_open %.200s: %.200s", r->dir, err);
        rocksdb_free(err);
        r->db = NULL;
        rocks_sys_close(&r->base);
        return -1;
    }
    *out = &r->base;
    return 0;
}

#else

static int rocks_open(const tbench *b, tsys **out, char *why, size_t whylen)
{
    (void)b, (void)out;
    snprintf(why, whylen, "built without RocksDB (librocksdb-dev not found)");
    return -1;
}

#endif

/* ---- the cases ------------------------------------------------------------------- */

enum { SYS_STASH, SYS_INLINE, SYS_HEAP, SYS_LMDB, SYS_ROCKSDB, NSYS };
static const char *const sys_names[NSYS] = {"stash", "inline-heap", "private-heap", "lmdb",
                                            "rocksdb"};

static int open_sys(const tbench *b, int which, tsys **out, char *why, size_t whylen)
{
    int rc;
    switch (which) {
    case SYS_STASH:
        rc = stash_open(b, out);
        if (rc < 0) snprintf(why, whylen, "%s (%s)", stash_strerror(rc), stash_errmsg());
        return rc;
    case SYS_INLINE:
        rc = inline_open(b, out);
        if (rc < 0) snprintf(why, whylen, "out of memory");
        return rc;
    case SYS_HEAP:
        rc = heap_open(b, out);
        if (rc < 0) snprintf(why, whylen, "out of memory");
        return rc;
    case SYS_LMDB:
        return lmdb_open(b, out, why, whylen);
    default:
        return rocks_open(b, out, why, whylen);
    }
}

typedef enum { CASE_FIRE, CASE_DELETE, CASE_ADVANCE, NCASES } case_kind;
static const char *const case_names[NCASES] = {"register-fire", "register-delete", "advance-1pct"};

static int fail_sys(tsys *s, const char *what, int64_t rc)
{
    if (!s->error[0])
        snprintf(s->error, sizeof s->error, "%s: %s (%s)", what, stash_strerror((int)rc),
                 stash_errmsg());
    return -1;
}

/* One repetition of case c on system s: its rate (timers, or advances,
 * per second) in *rate. */
static int run_case(const tbench *b, tsys *s, case_kind c, double *rate)
{
    uint64_t t0 = bench_now_ns(), want = 0;
    s->fired_keys = 0;
    for (uint64_t k = 0; k < b->n; k++) {
        int rc = s->ops->reg(s, k, b->ts[k]);
        if (rc < 0) return fail_sys(s, "register", rc);
        want += k;
    }
    int64_t fired = 0;
    uint64_t ns;
    if (c == CASE_FIRE) {
        fired = s->ops->advance(s, UINT64_MAX);
        ns = bench_now_ns() - t0;
    } else if (c == CASE_DELETE) {
        for (uint64_t k = 0; k < b->n; k++) {
            int rc = s->ops->del(s, k, b->ts[k]);
            if (rc < 0) return fail_sys(s, "delete", rc);
        }
        ns = bench_now_ns() - t0;
        fired = s->ops->advance(s, UINT64_MAX); /* none is left */
        want = 0;
    } else {
        t0 = bench_now_ns();
        for (uint64_t j = 1; j <= STEPS && fired >= 0; j++) {
            int64_t n = s->ops->advance(s, b->span / STEPS * j - 1);
            fired = n < 0 ? n : fired + n;
        }
        ns = bench_now_ns() - t0;
    }
    if (fired < 0) return fail_sys(s, "advance", fired);
    uint64_t expect = c == CASE_DELETE ? 0 : b->n;
    if ((uint64_t)fired != expect || s->fired_keys != want) {
        snprintf(s->error, sizeof s->error,
                 "fired %lld timers of %llu (keys summing to %llu, not %llu)", (long long)fired,
                 (unsigned long long)expect, (unsigned long long)s->fired_keys,
                 (unsigned long long)want);
        return -1;
    }
    *rate = (double)(c == CASE_ADVANCE ? STEPS : b->n) * 1e9 / (double)(ns ? ns : 1);
    return 0;
}

static void report(const tbench *b, const char *name, const char *system, double value,
                   const char *unit, const char *skipped)
{
    bench_report(&b->o, &(bench_result){.bench = "timers",
                                        .name = name,
                                        .system = system,
                                        .value = value,
                                        .unit = unit,
                                        .skipped = skipped});
}

/* Runs every case on every system: all of them open at once, a warm-up
 * repetition and then reps measured ones, the systems in a new order each
 * repetition. One system serves all of a case's repetitions: each ends
 * with no timer, and the next runs on memory the system already has, as a
 * timer service that runs for long does. */
static void rate_cases(const tbench *b)
{
    for (int c = 0; c < NCASES; c++) {
        if (!bench_selected(&b->o, case_names[c])) continue;
        tsys *s[NSYS] = {0};
        char why[NSYS][512] = {{0}};
        static double rates[NSYS][100];
        for (int which = 0; which < NSYS; which++)
            if (open_sys(b, which, &s[which], why[which], sizeof why[which]) < 0) s[which] = NULL;
        for (int r = 0; r <= b->o.reps; r++) {
            int order[NSYS];
            bench_shuffle(order, NSYS, (uint64_t)c, r);
            for (int k = 0; k < NSYS; k++) {
                int which = order[k];
                if (!s[which]) continue;
                bench_progress(&b->o, "timers: %s, %s, rep %d of %d", case_names[c],
                               sys_names[which], r, b->o.reps);
                double rate;
                if (run_case(b, s[which], (case_kind)c, &rate) < 0) {
                    snprintf(why[which], sizeof why[which], "%s", s[which]->error);
                    s[which]->ops->close(s[which]);
                    s[which] = NULL;
                } else if (r > 0) {
                    rates[which][r - 1] = rate;
                }
            }
        }
        for (int which = 0; which < NSYS; which++) {
            bench_result row = {
                .bench = "timers", .name = case_names[c], .system = sys_names[which]};
            if (s[which]) {
                double v[100];
                memcpy(v, rates[which], (size_t)b->o.reps * sizeof *v);
                row = bench_spread(row, v, b->o.reps);
                row.unit = c == CASE_ADVANCE ? "advances/s" : "timers/s";
            } else {
                row.skipped = why[which];
            }
            bench_report(&b->o, &row);
        }
        for (int peer = SYS_INLINE; peer < NSYS; peer++) {
            char name[64];
            snprintf(name, sizeof name, "stash/%s", sys_names[peer]);
            if (s[SYS_STASH] && s[peer])
                bench_report_ratio(&b->o, "timers", case_names[c], name, rates[SYS_STASH],
                                   rates[peer], b->o.reps);
        }
        for (int which = 0; which < NSYS; which++)
            if (s[which]) s[which]->ops->close(s[which]);
    }
}

/* The synchronous pause of a checkpoint with n timers registered: its
 * median in *us (0 if not measured). */
static int pause_case(tbench *b, uint64_t n, const char *name, double *us)
{
    *us = 0;
    if (!bench_selected(&b->o, name)) return 0;
    tsys *s;
    char why[512];
    uint64_t keep = b->n;
    b->n = n;
    int rc = stash_open(b, &s);
    b->n = keep;
    if (rc < 0) {
        snprintf(why, sizeof why, "%s (%s)", stash_strerror(rc), stash_errmsg());
        report(b, name, "stash", 0, NULL, why);
        return 0;
    }
    for (uint64_t k = 0; k < n && rc == 0; k++) {
        rc = s->ops->reg(s, k, b->ts[k % b->n]);
        if (k % 65536 == 0)
            bench_progress(&b->o, "timers: %s, registering %llu of %llu", name,
                           (unsigned long long)k, (unsigned long long)n);
    }
    enum { PINS = 101 };
    uint64_t ns[PINS];
    stash_sys *x = (stash_sys *)s;
    for (int i = 0; i < PINS && rc == 0; i++) {
        ns[i] = bench_cut_pause(x->w);
        /* A timer between pins, as a worker's records between barriers. */
        rc = s->ops->reg(s, (uint64_t)i, b->span + (uint64_t)i);
    }
    s->ops->close(s);
    if (rc < 0) {
        snprintf(why, sizeof why, "%s (%s)", stash_strerror(rc), stash_errmsg());
        report(b, name, "stash", 0, NULL, why);
        return 0;
    }
    *us = bench_report_pauses(&b->o, "timers", name, ns, PINS);
    return 0;
}

int bench_timers(int argc, char **argv)
{
    static const char usage[] =
        "Event-time timers: 1M keys (--quick: 100K), each with one timer at a pseudo-random\n"
        "time: registered then fired by one advance (register-fire, timers/s), registered\n"
        "then deleted (register-delete, timers/s), and a watermark advanced in 100 steps\n"
        "that each fire 1% of them (advance-1pct, advances/s). Beside, on the same timers\n"
        "in the same run: the limit, a binary heap of (time, key) pairs and a set of the\n"
        "same in private memory, deleting lazily (inline-heap); a heap of timer slots\n"
        "with a hash set, as Flink's heap timers (private-heap); LMDB and RocksDB holding\n"
        "timers as ordered keys (time, then key; Flink's RocksDB timers), in /dev/shm.\n"
        "Every system runs a warm-up repetition, then each repetition in a new order.\n"
        "Also a checkpoint's synchronous pause with 10K and with 1M (--quick: 100K) timers.\n"
        "--backend lmdb: stash's lmdb backend, its environments in /dev/shm too.\n";
    tbench b = {0};
    int rc = bench_parse(argc, argv, usage, &b.o);
    if (rc) return rc < 0 ? 2 : 0;
    b.n = b.o.quick ? 100000 : 1000000;
    const char *big = b.o.quick ? "pause/100k-timers" : "pause/1m-timers";
    const char *const names[] = {"register-fire", "register-delete", "advance-1pct",
                                 "pause/10k-timers", big};
    if (bench_check_case(&b.o, "timers", names, sizeof names / sizeof names[0]) < 0) return 2;
    if (b.o.reps > 100) b.o.reps = 100;
    bench_header(&b.o, "timers", "%llu keys, a timer each, on the %s backend",
                 (unsigned long long)b.n, b.o.backend == STASH_BACKEND_LMDB ? "lmdb" : "heap");
    b.span = b.n * 16;
    b.ts = malloc(b.n * sizeof *b.ts);
    if (!b.ts) return tool_fail("bench timers", -ENOMEM);
    uint64_t x = 0x243F6A8885A308D3ull; /* fixed: every system and run gets the same timers */
    for (uint64_t k = 0; k < b.n; k++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b.ts[k] = x % b.span;
    }
    snprintf(b.arena, sizeof b.arena, "bench-timers-%d", (int)getpid());
    snprintf(b.dir, sizeof b.dir, "/dev/shm/stash-bench-timers.XXXXXX");
    if (!mkdtemp(b.dir)) {
        free(b.ts);
        return tool_fail("bench timers: mkdtemp /dev/shm", -errno);
    }
    rate_cases(&b);
    double small_us, big_us;
    rc = pause_case(&b, 10000, "pause/10k-timers", &small_us);
    if (rc == 0) rc = pause_case(&b, b.n, big, &big_us);
    if (rc == 0 && small_us > 0 && big_us > 0)
        report(&b, big, b.o.quick ? "100k/10k" : "1m/10k", big_us / small_us, "ratio", NULL);
    char cmd[sizeof b.dir + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", b.dir);
    if (system(cmd) != 0) fprintf(stderr, "stash bench timers: cannot remove %s\n", b.dir);
    free(b.ts);
    return rc < 0 ? tool_fail("bench timers", rc) : 0;
}
