/* SPDX-License-Identifier: MIT */
/*
 * lmdb.c: the lmdb keyed backend. Key group kg lives in the environment
 * DIR/kg-NNNNN.mdb, so that its owner is the one writer of that environment
 * and a key group changes hands without moving a byte. A record's key is
 * the layout of docs/architecture.md: key group (2 bytes, big-endian), state id (2),
 * the key's length (2), the key, the namespace; its value is the stored
 * bytes of the heap backend (a TTL timestamp first where the state has one,
 * the list or map layout for those kinds).
 *
 * The owner keeps one write transaction per key group it touched, and
 * reads its own key groups through it (it sees its own writes). The
 * transaction commits at each barrier and when the worker closes; before a
 * write it commits early, and grows the map, if the transaction could
 * otherwise run out of room: LMDB fails a transaction that fills the map
 * (MDB_MAP_FULL) or holds too many dirty pages (MDB_TXN_FULL), and a failed
 * transaction would lose every write since the last commit. Others read
 * what was last committed through read transactions, renewed per read.
 */
#define _GNU_SOURCE /* RUSAGE_THREAD */
#include <errno.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <time.h>

#include "backends/lmdb/lmdb.h"
#include "backends/lmdb/lmdb_env.h"
#include "backends/lmdb/lmdb_fetch.h"
#include "shm/hash.h"

#define TXN_MAX_BYTES (32ull << 20) /* an estimate of a transaction's new pages stays under it */
#define KEY_PREFIX 6u

typedef struct kg_env {
    lmdb_env *x;        /* the process's handle on the environment, NULL until first use */
    MDB_txn *txn;       /* the owner's write transaction, or NULL */
    MDB_txn *rtxn;      /* a reset read transaction, or NULL */
    MDB_txn *snap;      /* the engine's snapshot of the key group for a checkpoint, or NULL */
    bool append;        /* a restore into it while empty: records in key order append */
    uint64_t txn_bytes; /* an estimate of the pages txn has made, in bytes */
    uint64_t room;      /* what txn_bytes may reach before the transaction commits */
    uint32_t depth;
    uint8_t *clean; /* the stored key the TTL cleanup goes on after */
    size_t clean_len, clean_cap;
} kg_env;

typedef struct lmdb_store {
    store base; /* first: a store handle is an lmdb_store */
    kg_env *envs;
    uint32_t maxp;
    int max_key; /* LMDB's longest key, known once an environment is open */
    char dir[SHM_LMDB_DIR];
    uint8_t *kbuf; /* an encoded key */
    size_t kcap;
    shm_rec *shadow[2]; /* private copies of records: one found, one being built */
    size_t shadow_cap[2];
    int cur;               /* the shadow that holds the record found or put last */
    uint64_t committed_ns; /* when every transaction last committed */
    uint64_t dirty;        /* the charge of the open transactions */
    uint64_t pruned_below; /* the change log's notes older than this are gone */
    lmdb_fetcher *fetch;   /* reader threads, started by the first fetch ahead */
    uint64_t majflt;       /* the worker thread's major faults when last looked at */
    bool reading_ahead;    /* pages were waited for when last looked: the threads read */
    uint32_t idle_calls;   /* fetches ahead since, while they do not */
} lmdb_store;

static lmdb_store *of(store *st)
{
    return (lmdb_store *)st;
}

static int lmdb_fail(int rc, const char *what, const kg_env *e, uint32_t kg)
{
    const char *path = e && e->x ? e->x->path : "";
    if (rc == MDB_MAP_FULL || rc == MDB_TXN_FULL)
        return shm_fail(STASH_EFULL, "key group %u (%s): %s: %s", kg, path, what, mdb_strerror(rc));
    return shm_fail(rc > 0        ? -rc
                    : rc < -30800 ? -EIO
                                  : rc,
                    "key group %u (%s): %s: %s", kg, path, what, mdb_strerror(rc));
}

static int lmdb_open(stash_arena *a, store **out)
{
    /* LMDB opens its files by path: the directory they go in is checked
     * first as one stash writes into (this user's own, writable by no other
     * user, every directory on the way root's or this user's, links on the
     * way trusted ones), so that no other user can change where the path
     * leads. */
    shm_dir d;
    int rc = shm_dir_open(a->hdr->lmdb_dir, SHM_DIR_OWN, &d);
    if (rc) return rc;
    shm_dir_close(&d);
    lmdb_store *st = calloc(1, sizeof *st);
    if (!st) return shm_fail(-ENOMEM, "out of memory");
    store_init(&st->base, &lmdb_store_ops, a);
    st->maxp = a->hdr->max_parallelism;
    st->envs = calloc(st->maxp, sizeof *st->envs);
    if (!st->envs) {
        free(st);
        return shm_fail(-ENOMEM, "out of memory");
    }
    snprintf(st->dir, sizeof st->dir, "%s", a->hdr->lmdb_dir);
    st->committed_ns = shm_now_ns();
    *out = &st->base;
    return 0;
}

static int env_for(lmdb_store *st, uint32_t kg, kg_env **out)
{
    kg_env *e = &st->envs[kg];
    *out = e;
    if (e->x) return 0;
    char path[SHM_LMDB_DIR + 32];
    snprintf(path, sizeof path, "%s/kg-%05u.mdb", st->dir, kg);
    int rc = lmdb_env_get(path, kg, &e->x);
    if (rc == 0) st->max_key = e->x->max_key;
    return rc;
}

/* Room for new pages: the map less what is used, halved (a transaction
 * copies each page it changes), and never more than LMDB's dirty-page
 * limit allows. */
static uint64_t room_of(const kg_env *e)
{
    MDB_envinfo info;
    mdb_env_info(e->x->env, &info);
    uint64_t used = ((uint64_t)info.me_last_pgno + 1) * e->x->psize;
    uint64_t room = info.me_mapsize > used ? (info.me_mapsize - used) / 2 : 0;
    return room < TXN_MAX_BYTES ? room : TXN_MAX_BYTES;
}

static int begin_write(kg_env *e, uint32_t kg)
{
    if (e->rtxn) {
        lmdb_env_free_reset(e->rtxn);
        e->rtxn = NULL;
    }
    int rc = lmdb_env_begin(e->x, 0, &e->txn);
    if (rc) return lmdb_fail(rc, "cannot begin a write", e, kg);
    MDB_stat s;
    mdb_stat(e->txn, e->x->dbi, &s);
    e->depth = s.ms_depth;
    e->room = room_of(e);
    return 0;
}

/* Takes an ended transaction's charge off the store's. */
static void discharge(lmdb_store *st, kg_env *e)
{
    e->txn = NULL;
    st->dirty -= e->txn_bytes < st->dirty ? e->txn_bytes : st->dirty;
    e->txn_bytes = 0;
}

static int commit(lmdb_store *st, kg_env *e, uint32_t kg)
{
    if (!e->txn) return 0;
    int rc = lmdb_env_commit(e->x, e->txn);
    discharge(st, e);
    /* Readers a dead process left would hold old pages back for good. */
    int dead;
    mdb_reader_check(e->x->env, &dead);
    if (rc == 0) return 0;
    /* LMDB reports a write cut short by a full disk as an I/O error. */
    int fd;
    struct statvfs fs;
    if ((rc == EIO || rc == ENOSPC) && mdb_env_get_fd(e->x->env, &fd) == 0 &&
        fstatvfs(fd, &fs) == 0 && (uint64_t)fs.f_bavail * fs.f_frsize < (1u << 20)) {
        const char *path = "";
        mdb_env_get_path(e->x->env, &path);
        return shm_fail(-ENOSPC,
                        "key group %u (%s): cannot commit: no space left on the disk; the writes "
                        "since the last commit are lost",
                        kg, path);
    }
    return lmdb_fail(rc, "cannot commit", e, kg);
}

/* Makes room for a write of about bytes: commits the transaction early and
 * doubles the map until a transaction of that size fits. */
static int make_room(lmdb_store *st, kg_env *e, uint32_t kg, uint64_t bytes)
{
    int rc = commit(st, e, kg);
    for (int i = 0; rc == 0 && room_of(e) < bytes && i < 40; i++) {
        MDB_envinfo info;
        mdb_env_info(e->x->env, &info);
        rc = lmdb_env_resize(e->x, info.me_mapsize * 2);
        if (rc) rc = lmdb_fail(rc, "cannot grow the map", e, kg);
    }
    if (rc == 0 && room_of(e) < bytes)
        rc = shm_fail(STASH_ETOOBIG, "key group %u: a write of %llu bytes", kg,
                      (unsigned long long)bytes);
    return rc ? rc : begin_write(e, kg);
}

/* Waits while the engine has yet to open its snapshot of a key group this
 * process cut for a checkpoint: a commit now would change what it reads. */
static void await_snapshot(lmdb_store *st, uint32_t kg)
{
    while (atomic_load(&st->base.arena->tables[kg].cut) &&
           shm_service_alive(st->base.arena, NULL)) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
}

/* What a write of bytes is charged: the bytes and the pages it may copy
 * (its path down the tree, a split) or fill (a value's overflow pages). */
static uint64_t charge_of(const kg_env *e, uint64_t bytes)
{
    uint32_t psize = e->x ? e->x->psize : 0; /* not yet opened: the bytes alone */
    return bytes ? bytes + (uint64_t)(e->depth + 2) * psize : 0;
}

/* The transaction of kg, begun if need be; with bytes > 0, one that has
 * room for a write of that many bytes. */
static int store_txn(lmdb_store *st, uint32_t kg, uint64_t bytes, kg_env **out)
{
    int rc = env_for(st, kg, out);
    if (rc) return rc;
    kg_env *e = *out;
    if (!e->txn && (rc = begin_write(e, kg)) != 0) return rc;
    uint64_t need = charge_of(e, bytes);
    if (need == 0) return 0;
    if (e->txn_bytes + need > e->room) {
        await_snapshot(st, kg);
        if ((rc = make_room(st, e, kg, need)) != 0) return rc;
    }
    e->txn_bytes += need;
    st->dirty += need;
    return 0;
}

static int store_commit(lmdb_store *st, bool wait);

/* A worker's transaction of kg: as store_txn, keeping what all its
 * transactions hold in memory within a budget (it commits them first if a
 * write would pass it). */
static int txn_for(lmdb_store *st, uint32_t kg, uint64_t bytes, kg_env **out)
{
    uint64_t need = charge_of(&st->envs[kg], bytes);
    if (need && st->dirty + need > LMDB_STORE_MAX_BYTES) {
        (*st->base.moves)++;
        int rc = store_commit(st, true);
        if (rc) return rc;
    }
    return store_txn(st, kg, bytes, out);
}

/* ---- the change log of incremental checkpoints ------------------------------- */

/* Notes in kg's table that the stored key k changed, tagged with the newest
 * checkpoint id: a delta based on checkpoint B takes the keys tagged B or
 * later, as its cut left them. A key tagged already is not written again.
 * Where the log cannot take the note (the arena full), the next checkpoint
 * is full. */
static void log_change(lmdb_store *st, uint32_t kg, const MDB_val *k)
{
    stash_arena *a = st->base.arena;
    if (!atomic_load_explicit(&a->hdr->change_track, memory_order_relaxed)) return;
    uint64_t tag = atomic_load_explicit(&a->control->last_id, memory_order_acquire);
    shm_lookup l = {.kg = kg,
                    .hash = shm_lookup_hash(shm_key_hash(k->mv_data, k->mv_size),
                                            shm_lookup_seed(SHM_CHANGE_STATE, 0)),
                    .state = SHM_CHANGE_STATE,
                    .klen = (uint16_t)k->mv_size,
                    .key = k->mv_data,
                    .ns = ""};
    shm_cursor c;
    shm_table_tend(a, kg);
    int rc = shm_table_find(a, &l, &c);
    if (rc == 0 && shm_rec_live(c.rec) && atomic_load(&c.rec->vlen) == sizeof tag &&
        memcmp(shm_rec_value(c.rec), &tag, sizeof tag) == 0)
        return;
    shm_rec *r;
    if (rc == 0) rc = shm_rec_new(a, &l, sizeof tag, &r);
    if (rc) {
        atomic_fetch_add(&a->hdr->change_untracked, 1);
        return;
    }
    memcpy(shm_rec_value(r), &tag, sizeof tag);
    atomic_store_explicit(&r->vlen, sizeof tag, memory_order_relaxed);
    if (shm_table_publish(a, &l, &c, r) < 0) {
        shm_free(a, shm_off_of(a, r));
        atomic_fetch_add(&a->hdr->change_untracked, 1);
    }
}

/* Drops the log's notes of kg older than the next delta's base. */
static void prune_changes(lmdb_store *st, uint32_t kg, uint64_t below)
{
    stash_arena *a = st->base.arena;
    shm_table_tend(a, kg);
    uint8_t *key = NULL;
    size_t cap = 0;
    uint32_t pos = 0, hash;
    for (shm_rec *r; (r = shm_table_next(a, kg, &pos, &hash));) {
        uint64_t tag;
        if (r->state != SHM_CHANGE_STATE || !shm_rec_live(r) || atomic_load(&r->vlen) != sizeof tag)
            continue;
        memcpy(&tag, shm_rec_value(r), sizeof tag);
        if (tag >= below || shm_reserve(&key, &cap, r->klen ? r->klen : 1) < 0) continue;
        /* The lookup's bytes outlive the record the delete retires. */
        memcpy(key, shm_rec_key(r), r->klen);
        shm_lookup l = {.kg = kg,
                        .hash = hash,
                        .state = SHM_CHANGE_STATE,
                        .klen = r->klen,
                        .key = key,
                        .ns = ""};
        shm_cursor c;
        if (shm_table_find(a, &l, &c) == 0) shm_table_delete(a, &l, &c);
    }
    free(key);
}

/* Commits the open transactions; those of key groups the engine has yet to
 * snapshot wait for it, or, unless wait, stay open. */
static int store_commit(lmdb_store *st, bool wait)
{
    int first = 0;
    for (uint32_t kg = 0; kg < st->maxp; kg++) {
        kg_env *e = &st->envs[kg];
        if (!e->txn) continue;
        if (atomic_load(&st->base.arena->tables[kg].cut)) {
            if (!wait) continue;
            await_snapshot(st, kg);
        }
        int rc = commit(st, e, kg);
        if (rc && !first) first = rc;
    }
    st->committed_ns = shm_now_ns();
    return first;
}

static int lmdb_commit(store *base)
{
    (*base->moves)++;
    return store_commit(of(base), true);
}

static int lmdb_commit_due(store *base)
{
    lmdb_store *st = of(base);
    if (shm_now_ns() - st->committed_ns < LMDB_COMMIT_MS * 1000000ull) return 0;
    (*base->moves)++;
    uint64_t below = atomic_load(&st->base.arena->hdr->change_prune_below);
    if (below > st->pruned_below) {
        for (uint32_t kg = base->range.first; kg <= base->range.last; kg++)
            prune_changes(st, kg, below);
        st->pruned_below = below;
    }
    return store_commit(st, false);
}

static void lmdb_cut_close(store *base, uint32_t kg);

static void lmdb_forget(store *base)
{
    lmdb_store *st = of(base);
    lmdb_fetch_forget(st->fetch);
    for (uint32_t kg = 0; kg < st->maxp; kg++) free(st->envs[kg].clean);
    free(st->envs);
    free(st->kbuf);
    free(st->shadow[0]);
    free(st->shadow[1]);
    free(st);
}

static void lmdb_close(store *base)
{
    if (!base) return;
    lmdb_store *st = of(base);
    /* Its threads' transactions end before the environments may close. */
    lmdb_fetch_stop(st->fetch);
    st->fetch = NULL;
    store_commit(st, true);
    for (uint32_t kg = 0; kg < st->maxp; kg++) lmdb_cut_close(base, kg);
    for (uint32_t kg = 0; kg < st->maxp; kg++) {
        kg_env *e = &st->envs[kg];
        if (e->rtxn) lmdb_env_free_reset(e->rtxn);
        lmdb_env_put(e->x);
    }
    lmdb_forget(base);
}

/* ---- keys and shadows --------------------------------------------------- */

static int encode(lmdb_store *st, uint32_t kg, uint16_t state, const void *key, uint16_t klen,
                  const void *ns, uint16_t nslen, MDB_val *out)
{
    size_t n = KEY_PREFIX + klen + nslen;
    if (st->max_key && n > (size_t)st->max_key)
        return shm_fail(STASH_ETOOBIG,
                        "key group %u: a key and namespace of %u bytes; lmdb stores at most %d "
                        "with its %u-byte prefix",
                        kg, klen + nslen, st->max_key, KEY_PREFIX);
    if (shm_reserve(&st->kbuf, &st->kcap, n) < 0) return shm_fail(-ENOMEM, "out of memory");
    uint8_t *p = st->kbuf;
    p[0] = (uint8_t)(kg >> 8), p[1] = (uint8_t)kg;
    p[2] = (uint8_t)(state >> 8), p[3] = (uint8_t)state;
    p[4] = (uint8_t)(klen >> 8), p[5] = (uint8_t)klen;
    if (klen) memcpy(p + KEY_PREFIX, key, klen);
    if (nslen) memcpy(p + KEY_PREFIX + klen, ns, nslen);
    *out = (MDB_val){n, p};
    return 0;
}

static int encode_lookup(lmdb_store *st, const shm_lookup *l, MDB_val *out)
{
    return encode(st, l->kg, l->state, l->key, l->klen, l->ns, l->nslen, out);
}

/* Shadow i, with room for klen + nslen + cap bytes after its header. */
static shm_rec *shadow(lmdb_store *st, int i, size_t klen, size_t nslen, size_t cap)
{
    size_t need = sizeof(shm_rec) + klen + nslen + cap;
    if (need > st->shadow_cap[i]) {
        size_t n = st->shadow_cap[i] ? st->shadow_cap[i] : 256;
        while (n < need) n *= 2;
        void *grown = realloc(st->shadow[i], n);
        if (!grown) return NULL;
        st->shadow[i] = grown;
        st->shadow_cap[i] = n;
    }
    return st->shadow[i];
}

/* Fills a shadow header for kg's record of l. */
static void shadow_head(shm_rec *r, uint32_t kg, uint16_t state, uint16_t klen, uint16_t nslen,
                        uint32_t vlen)
{
    memset(r, 0, sizeof *r);
    r->version = kg; /* a shadow knows where it goes */
    r->state = state;
    r->klen = klen;
    r->nslen = nslen;
    atomic_store_explicit(&r->vlen, vlen, memory_order_relaxed);
}

/* Copies the stored value v of l into the current shadow. */
static int load_shadow(lmdb_store *st, const shm_lookup *l, const MDB_val *v, shm_rec **out)
{
    shm_rec *r = shadow(st, st->cur, l->klen, l->nslen, v->mv_size);
    if (!r) return shm_fail(-ENOMEM, "out of memory");
    shadow_head(r, l->kg, l->state, l->klen, l->nslen, (uint32_t)v->mv_size);
    uint8_t *p = (uint8_t *)(r + 1);
    if (l->klen) memcpy(p, l->key, l->klen);
    if (l->nslen) memcpy(p + l->klen, l->ns, l->nslen);
    if (v->mv_size) memcpy(shm_rec_value(r), v->mv_data, v->mv_size);
    *out = r;
    return 0;
}

/* A read of an owned key group views LMDB's map through the owner's
 * transaction; only a read that may write through c next (for_write: a TTL
 * refresh, a map's change in place) needs the record copied. */
static int lmdb_read_owned(store *base, const shm_lookup *l, shm_cursor *c, stash_bytes *out,
                           bool for_write)
{
    lmdb_store *st = of(base);
    c->group = NULL;
    c->rec = NULL;
    kg_env *e;
    MDB_val k, v;
    int rc = txn_for(st, l->kg, 0, &e);
    if (!rc) rc = encode_lookup(st, l, &k);
    if (rc) return rc;
    rc = mdb_get(e->txn, e->x->dbi, &k, &v);
    if (rc == MDB_NOTFOUND) return STASH_ENOTFOUND;
    if (rc) return lmdb_fail(rc, "cannot read", e, l->kg);
    *out = (stash_bytes){v.mv_data, v.mv_size};
    return for_write ? load_shadow(st, l, &v, &c->rec) : 0;
}

static int lmdb_find(store *st, const shm_lookup *l, shm_cursor *c, bool for_write)
{
    (void)for_write; /* a write goes through the copy of the record found */
    stash_bytes view;
    int rc = lmdb_read_owned(st, l, c, &view, true);
    return rc == STASH_ENOTFOUND ? 0 : rc;
}

static int lmdb_view(store *st, const shm_lookup *l, shm_cursor *c, stash_bytes *out)
{
    return lmdb_read_owned(st, l, c, out, true);
}

static int64_t lmdb_read_copy(store *base, const shm_lookup *l, uint8_t **buf, size_t *cap)
{
    lmdb_store *st = of(base);
    kg_env *e;
    MDB_val k, v;
    int rc = env_for(st, l->kg, &e);
    if (!rc) rc = encode_lookup(st, l, &k);
    if (rc) return rc;
    /* The owner in this process reads through its own transaction. */
    if (e->txn) {
        rc = mdb_get(e->txn, e->x->dbi, &k, &v);
    } else {
        rc = lmdb_env_renew(e->x, &e->rtxn);
        if (rc) return lmdb_fail(rc, "cannot begin a read", e, l->kg);
        rc = mdb_get(e->rtxn, e->x->dbi, &k, &v);
    }
    if (rc == 0) {
        if (shm_reserve(buf, cap, v.mv_size ? v.mv_size : 1) < 0)
            rc = -ENOMEM;
        else if (v.mv_size)
            memcpy(*buf, v.mv_data, v.mv_size);
    }
    if (!e->txn) lmdb_env_reset(e->x, e->rtxn);
    if (rc == MDB_NOTFOUND) return STASH_ENOTFOUND;
    if (rc == -ENOMEM) return shm_fail(-ENOMEM, "out of memory");
    if (rc) return lmdb_fail(rc, "cannot read", e, l->kg);
    return (int64_t)v.mv_size;
}

/* Whether reading ahead pays: the pages the worker's reads or the reader
 * threads' look-ups waited for since the last call (major faults). With
 * the state in memory none do, and the threads would only take a core. */
static bool faulting(lmdb_store *st)
{
    /* While reading ahead does not pay, ask the kernel only now and then:
     * the faults add up meanwhile. */
    if (!st->reading_ahead && ++st->idle_calls % 16 != 0) return false;
    struct rusage ru;
    uint64_t mine = getrusage(RUSAGE_THREAD, &ru) == 0 ? (uint64_t)ru.ru_majflt : 0;
    uint64_t faults = mine - st->majflt + (st->fetch ? lmdb_fetch_faults(st->fetch) : 0);
    st->majflt = mine;
    st->reading_ahead = faults > 0;
    return st->reading_ahead;
}

/* A batch's look-ups, first on reader threads (lmdb_fetch.h), while its
 * reads wait for pages: a page the worker's read would wait for is read
 * meanwhile, many at once. */
static void lmdb_fetch_ahead(store *base, const shm_lookup *l, size_t n, int step)
{
    lmdb_store *st = of(base);
    if (step != STORE_FETCH_FIRST || !faulting(st)) return;
    if (!st->fetch && lmdb_fetch_start(st->maxp, &st->fetch) < 0) {
        shm_clear_error();
        return;
    }
    for (size_t i = 0; i < n; i++) {
        kg_env *e;
        MDB_val k = {0};
        if (env_for(st, l[i].kg, &e) < 0 || encode_lookup(st, &l[i], &k) < 0) {
            shm_clear_error();
            continue;
        }
        lmdb_fetch_queue(st->fetch, e->x, l[i].kg, k.mv_data, k.mv_size);
    }
    lmdb_fetch_go(st->fetch);
}

static int lmdb_rec_new(store *base, const shm_lookup *l, size_t cap, shm_rec **out)
{
    lmdb_store *st = of(base);
    shm_rec *r = shadow(st, 1 - st->cur, l->klen, l->nslen, cap);
    if (!r) return shm_fail(-ENOMEM, "out of memory");
    shadow_head(r, l->kg, l->state, l->klen, l->nslen, 0);
    uint8_t *p = (uint8_t *)(r + 1);
    if (l->klen) memcpy(p, l->key, l->klen);
    if (l->nslen) memcpy(p + l->klen, l->ns, l->nslen);
    *out = r;
    return 0;
}

/* A private copy changes in place, with no undo record. */
static bool lmdb_rec_mutable(store *st, uint32_t kg, const shm_rec *rec)
{
    (void)st, (void)kg, (void)rec;
    return true;
}

static bool lmdb_write_begin(store *st, uint32_t kg, shm_rec *rec, const shm_region *r, unsigned n)
{
    (void)st, (void)kg, (void)rec, (void)r, (void)n;
    return true;
}

static uint64_t lmdb_rec_capacity(const store *base, const shm_rec *rec)
{
    const lmdb_store *st = (const lmdb_store *)base;
    int i = rec == st->shadow[0] ? 0 : 1;
    return st->shadow_cap[i] - sizeof(shm_rec) - rec->klen - rec->nslen;
}

/* Puts rec (a shadow, which names its own key) into the store and, if c,
 * makes it c's. */
static int put_shadow(lmdb_store *st, shm_cursor *c, shm_rec *rec)
{
    uint32_t kg = rec->version, vlen = atomic_load_explicit(&rec->vlen, memory_order_relaxed);
    kg_env *e;
    MDB_val k, v = {vlen, shm_rec_value(rec)};
    int rc =
        encode(st, kg, rec->state, shm_rec_key(rec), rec->klen, shm_rec_ns(rec), rec->nslen, &k);
    if (!rc) rc = txn_for(st, kg, k.mv_size + vlen, &e);
    if (rc) return rc;
    rc = mdb_put(e->txn, e->x->dbi, &k, &v, 0);
    if (rc) return lmdb_fail(rc, "cannot write", e, kg);
    log_change(st, kg, &k);
    st->cur = rec == st->shadow[0] ? 0 : 1;
    if (c) c->rec = rec;
    return 0;
}

static int lmdb_publish(store *st, const shm_lookup *l, shm_cursor *c, shm_rec *rec)
{
    (void)l;
    return put_shadow(of(st), c, rec);
}

static int lmdb_write_end(store *st, uint32_t kg, shm_rec *rec)
{
    (void)kg;
    return put_shadow(of(st), NULL, rec);
}

static int lmdb_delete(store *base, const shm_lookup *l, shm_cursor *c)
{
    lmdb_store *st = of(base);
    kg_env *e;
    MDB_val k;
    int rc = encode_lookup(st, l, &k);
    if (!rc) rc = txn_for(st, l->kg, 1, &e);
    if (rc) return rc;
    rc = mdb_del(e->txn, e->x->dbi, &k, NULL);
    c->rec = NULL;
    if (rc == 0) log_change(st, l->kg, &k);
    return rc == 0 || rc == MDB_NOTFOUND ? 0 : lmdb_fail(rc, "cannot delete", e, l->kg);
}

static int64_t lmdb_kg_entries(store *st, uint32_t kg)
{
    kg_env *e;
    int rc = env_for(of(st), kg, &e);
    if (rc) return rc;
    MDB_txn *t = e->txn;
    if (!t && (rc = lmdb_env_begin(e->x, MDB_RDONLY, &t)) != 0)
        return lmdb_fail(rc, "cannot begin a read", e, kg);
    MDB_stat s;
    rc = mdb_stat(t, e->x->dbi, &s);
    if (t != e->txn) lmdb_env_abort(e->x, t);
    return rc ? lmdb_fail(rc, "cannot count", e, kg) : (int64_t)s.ms_entries;
}

/* ---- walks -------------------------------------------------------------- */

/* A stored record taken apart: its state, key and namespace views, value. */
typedef struct lmdb_entry {
    uint16_t state;
    stash_bytes key;
    stash_bytes ns;
    stash_bytes value;
} lmdb_entry;

static bool decode(const MDB_val *k, const MDB_val *v, lmdb_entry *out)
{
    const uint8_t *p = k->mv_data;
    if (k->mv_size < KEY_PREFIX) return false;
    uint16_t klen = (uint16_t)(p[4] << 8 | p[5]);
    if (k->mv_size < KEY_PREFIX + (size_t)klen) return false;
    out->state = (uint16_t)(p[2] << 8 | p[3]);
    out->key = (stash_bytes){p + KEY_PREFIX, klen};
    out->ns = (stash_bytes){p + KEY_PREFIX + klen, k->mv_size - KEY_PREFIX - klen};
    out->value = (stash_bytes){v->mv_data, v->mv_size};
    return true;
}

/* Positions cur on the first record of state in kg after `after` (NULL:
 * the first of the state). Returns 1 and the record, 0 at the end, or an
 * LMDB error. */
static int seek(MDB_cursor *cur, uint32_t kg, uint16_t state, const void *after, size_t after_len,
                MDB_val *k, MDB_val *v)
{
    uint8_t prefix[4] = {(uint8_t)(kg >> 8), (uint8_t)kg, (uint8_t)(state >> 8), (uint8_t)state};
    *k = after ? (MDB_val){after_len, (void *)after} : (MDB_val){sizeof prefix, prefix};
    int rc = mdb_cursor_get(cur, k, v, MDB_SET_RANGE);
    if (rc == 0 && after && k->mv_size == after_len && memcmp(k->mv_data, after, after_len) == 0)
        rc = mdb_cursor_get(cur, k, v, MDB_NEXT);
    if (rc == MDB_NOTFOUND) return 0;
    if (rc) return rc;
    return k->mv_size >= sizeof prefix && memcmp(k->mv_data, prefix, sizeof prefix) == 0;
}

/* Keys in key order, going on after the stored key returned last (which
 * the owner's writes to keys already returned leave where it was). */
static int lmdb_next(store *st, uint32_t kg, uint16_t state, store_walk *w, store_entry *out)
{
    kg_env *e;
    int rc = txn_for(of(st), kg, 0, &e);
    if (rc) return rc;
    MDB_cursor *cur;
    if ((rc = mdb_cursor_open(e->txn, e->x->dbi, &cur)) != 0)
        return lmdb_fail(rc, "cannot walk", e, kg);
    MDB_val k, v;
    rc = seek(cur, kg, state, w->after, w->after_len, &k, &v);
    mdb_cursor_close(cur);
    w->entered = true;
    if (rc < 0 || rc > 1) return lmdb_fail(rc, "cannot walk", e, kg);
    lmdb_entry en;
    if (rc == 1 && !decode(&k, &v, &en))
        return shm_fail(STASH_ECORRUPT, "key group %u: a stored key of %zu bytes", kg, k.mv_size);
    if (rc == 1) *out = (store_entry){en.key, en.ns, en.value, {k.mv_data, k.mv_size}};
    return rc;
}

static bool of_state(const MDB_val *k, uint32_t kg, uint16_t state)
{
    const uint8_t *p = k->mv_data;
    return k->mv_size >= 4 && p[0] == (uint8_t)(kg >> 8) && p[1] == (uint8_t)kg &&
           p[2] == (uint8_t)(state >> 8) && p[3] == (uint8_t)state;
}

static void lmdb_ttl_cleanup(store *base, uint32_t kg, uint16_t state, uint32_t budget,
                             store_expired_fn *expired, void *ctx)
{
    lmdb_store *st = of(base);
    kg_env *e;
    /* Room for the deletions first: making room commits, which would end
     * the walk's cursor. */
    if (txn_for(st, kg, (uint64_t)budget * 4096u, &e)) return;
    MDB_cursor *cur;
    if (mdb_cursor_open(e->txn, e->x->dbi, &cur)) return;
    bool going_on = e->clean_len && of_state(&(MDB_val){e->clean_len, e->clean}, kg, state);
    MDB_val k, v;
    int rc = seek(cur, kg, state, going_on ? e->clean : NULL, going_on ? e->clean_len : 0, &k, &v);
    uint8_t *doomed = NULL;
    size_t doomed_len = 0, doomed_cap = 0;
    for (; rc == 1 && budget > 0; budget--) {
        /* The expired ones are deleted after the walk, which goes on after
         * the last one kept. */
        uint8_t **into = expired(ctx, v.mv_data, v.mv_size) ? &doomed : &e->clean;
        size_t *cap = into == &doomed ? &doomed_cap : &e->clean_cap;
        size_t at = into == &doomed ? doomed_len : 0;
        if (shm_reserve(into, cap, at + 2 + k.mv_size) == 0) {
            if (into == &doomed) {
                doomed[at] = (uint8_t)(k.mv_size >> 8), doomed[at + 1] = (uint8_t)k.mv_size;
                memcpy(doomed + at + 2, k.mv_data, k.mv_size);
                doomed_len = at + 2 + k.mv_size;
            } else {
                memcpy(e->clean, k.mv_data, k.mv_size);
                e->clean_len = k.mv_size;
            }
        }
        rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT) == 0 && of_state(&k, kg, state);
    }
    /* At the end of the state's records: start over next time. */
    if (rc != 1) e->clean_len = 0;
    mdb_cursor_close(cur);
    for (size_t at = 0; at + 2 <= doomed_len;) {
        size_t n = (size_t)doomed[at] << 8 | doomed[at + 1];
        MDB_val dk = {n, doomed + at + 2};
        if (mdb_del(e->txn, e->x->dbi, &dk, NULL) == 0) {
            log_change(st, kg, &dk);
            (*base->moves)++;
        }
        at += 2 + n;
    }
    free(doomed);
}

/* ---- checkpoints ---------------------------------------------------------- */

/* The engine's snapshot of kg: a read transaction begun while the cut
 * holds the owner's commits back. */
static int lmdb_cut_open(store *base, uint32_t kg)
{
    kg_env *e;
    int rc = env_for(of(base), kg, &e);
    if (rc || e->snap) return rc;
    rc = lmdb_env_begin(e->x, MDB_RDONLY, &e->snap);
    return rc ? lmdb_fail(rc, "cannot begin its snapshot", e, kg) : 0;
}

static void lmdb_cut_close(store *base, uint32_t kg)
{
    kg_env *e = &of(base)->envs[kg];
    if (!e->snap) return;
    lmdb_env_abort(e->x, e->snap);
    e->snap = NULL;
}

/* Emits the stored record k as the snapshot holds it (v), or, if the
 * snapshot has none (rc MDB_NOTFOUND), as deleted. */
static int emit_stored(kg_env *e, uint32_t kg, const MDB_val *k, const MDB_val *v, bool deleted,
                       store_emit_fn *emit, void *ctx)
{
    lmdb_entry en;
    if (!decode(k, v, &en) || en.ns.len > UINT16_MAX || v->mv_size > UINT32_MAX)
        return shm_fail(STASH_ECORRUPT, "key group %u (%s): a stored key of %zu bytes", kg,
                        e->x->path, k->mv_size);
    store_record r = {.state = en.state,
                      .klen = (uint16_t)en.key.len,
                      .nslen = (uint16_t)en.ns.len,
                      .flags = deleted ? STORE_REC_DELETED : 0,
                      .vlen = (uint32_t)v->mv_size,
                      .key = en.key.data,
                      .ns = en.ns.data,
                      .value = v->mv_data};
    return emit(ctx, &r);
}

typedef struct delta_walk {
    kg_env *e;
    uint32_t kg;
    uint64_t base;
    store_emit_fn *emit;
    void *ctx;
} delta_walk;

/* A note of the change log: the key as the snapshot holds it, or its
 * deletion. */
static int delta_visit(const shm_rec *r, void *ctx)
{
    delta_walk *d = ctx;
    uint64_t tag;
    if (r->state != SHM_CHANGE_STATE || atomic_load(&r->vlen) != sizeof tag) return 0;
    memcpy(&tag, shm_rec_value((shm_rec *)r), sizeof tag);
    if (tag < d->base) return 0;
    MDB_val k = {r->klen, (void *)shm_rec_key(r)}, v = {0, NULL};
    int rc = mdb_get(d->e->snap, d->e->x->dbi, &k, &v);
    if (rc && rc != MDB_NOTFOUND) return lmdb_fail(rc, "cannot read its snapshot", d->e, d->kg);
    return emit_stored(d->e, d->kg, &k, &v, rc != 0, d->emit, d->ctx);
}

/* All of kg, or with a base the keys the change log (as pinned at the
 * cut) names as changed since that checkpoint, deletions included. */
static int lmdb_snapshot(store *base, uint32_t kg, const store_cut *cut, store_emit_fn *emit,
                         void *ctx)
{
    lmdb_store *st = of(base);
    kg_env *e = &st->envs[kg];
    if (!e->snap) return shm_fail(-EINVAL, "key group %u: no snapshot open", kg);
    if (cut->base_id) {
        delta_walk d = {e, kg, cut->base_id, emit, ctx};
        return shm_table_walk_at(st->base.arena, kg, cut->pin, delta_visit, &d);
    }
    MDB_cursor *cur;
    int rc = mdb_cursor_open(e->snap, e->x->dbi, &cur);
    if (rc) return lmdb_fail(rc, "cannot walk its snapshot", e, kg);
    MDB_val k, v;
    int err = 0; /* stash's error, apart from LMDB's codes in rc */
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && err == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
        err = emit_stored(e, kg, &k, &v, false, emit, ctx);
    mdb_cursor_close(cur);
    if (err) return err;
    return rc == MDB_NOTFOUND ? 0 : lmdb_fail(rc, "cannot walk its snapshot", e, kg);
}

/* One read transaction: the key group as its last commit left it. */
static int lmdb_scan(store *base, uint32_t kg, uint16_t state, store_emit_fn *emit, void *ctx)
{
    kg_env *e;
    MDB_txn *t;
    MDB_cursor *cur;
    int rc = env_for(of(base), kg, &e);
    if (rc) return rc;
    if ((rc = lmdb_env_begin(e->x, MDB_RDONLY, &t)) != 0)
        return lmdb_fail(rc, "cannot begin a read", e, kg);
    if ((rc = mdb_cursor_open(t, e->x->dbi, &cur)) != 0) {
        lmdb_env_abort(e->x, t);
        return lmdb_fail(rc, "cannot walk", e, kg);
    }
    MDB_val k, v;
    int err = 0; /* stash's error, apart from LMDB's codes in rc */
    rc = seek(cur, kg, state, NULL, 0, &k, &v);
    while (rc == 1 && (err = emit_stored(e, kg, &k, &v, false, emit, ctx)) == 0) {
        rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
        rc = rc == MDB_NOTFOUND ? 0 : rc ? rc : of_state(&k, kg, state);
    }
    mdb_cursor_close(cur);
    lmdb_env_abort(e->x, t);
    if (err) return err;
    return rc == 0 || rc == 1 ? 0 : lmdb_fail(rc, "cannot walk", e, kg);
}

/* Into an empty environment, records in key order append. */
static int lmdb_restore_begin(store *base, uint32_t kg, uint64_t records)
{
    (void)records;
    kg_env *e;
    int rc = env_for(of(base), kg, &e);
    if (rc) return rc;
    MDB_txn *t;
    MDB_stat s;
    if ((rc = lmdb_env_begin(e->x, MDB_RDONLY, &t)) != 0)
        return lmdb_fail(rc, "cannot begin a read", e, kg);
    rc = mdb_stat(t, e->x->dbi, &s);
    lmdb_env_abort(e->x, t);
    if (rc) return lmdb_fail(rc, "cannot count", e, kg);
    e->append = s.ms_entries == 0;
    return 0;
}

static int lmdb_restore(store *base, const shm_lookup *l, const store_record *r)
{
    lmdb_store *st = of(base);
    uint32_t kg = l->kg;
    MDB_val k, v = {r->vlen, (void *)r->value};
    kg_env *e;
    /* Each key group is restored by one thread: its own key buffer. */
    uint8_t key[KEY_PREFIX + 512];
    size_t n = KEY_PREFIX + (size_t)l->klen + l->nslen;
    int rc = store_txn(st, kg, n + r->vlen, &e);
    if (rc) return rc;
    if (n > (size_t)st->max_key || n > sizeof key)
        return shm_fail(STASH_ETOOBIG,
                        "key group %u: a key and namespace of %zu bytes; lmdb stores at most %d "
                        "with its %u-byte prefix",
                        kg, n - KEY_PREFIX, st->max_key, KEY_PREFIX);
    key[0] = (uint8_t)(kg >> 8), key[1] = (uint8_t)kg;
    key[2] = (uint8_t)(l->state >> 8), key[3] = (uint8_t)l->state;
    key[4] = (uint8_t)(l->klen >> 8), key[5] = (uint8_t)l->klen;
    memcpy(key + KEY_PREFIX, l->key, l->klen);
    memcpy(key + KEY_PREFIX + l->klen, l->ns, l->nslen);
    k = (MDB_val){n, key};
    /* A rollback's changes go into the change log like any other. */
    log_change(st, kg, &k);
    if (r->flags & STORE_REC_DELETED) {
        e->append = false;
        rc = mdb_del(e->txn, e->x->dbi, &k, NULL);
        return rc == 0 || rc == MDB_NOTFOUND ? 0 : lmdb_fail(rc, "cannot delete", e, kg);
    }
    rc = mdb_put(e->txn, e->x->dbi, &k, &v, e->append ? MDB_APPEND : 0);
    if (rc == MDB_KEYEXIST && e->append) {
        /* Not in key order (a heap backend's checkpoint): plain puts from here. */
        e->append = false;
        rc = mdb_put(e->txn, e->x->dbi, &k, &v, 0);
    }
    return rc ? lmdb_fail(rc, "cannot write", e, kg) : 0;
}

static int lmdb_restore_end(store *base, uint32_t kg, int rc)
{
    lmdb_store *st = of(base);
    kg_env *e = &st->envs[kg];
    e->append = false;
    if (!e->txn) return rc;
    if (rc < 0) {
        lmdb_env_abort(e->x, e->txn);
        discharge(st, e);
        return rc;
    }
    return commit(st, e, kg);
}

static int lmdb_clear(store *base, stash_kg_range range)
{
    lmdb_store *st = of(base);
    for (uint32_t kg = range.first; kg <= range.last; kg++) {
        kg_env *e;
        int rc = store_txn(st, kg, 0, &e);
        if (rc) return rc;
        /* Every key that goes is a change a delta must carry. */
        MDB_cursor *cur;
        if ((rc = mdb_cursor_open(e->txn, e->x->dbi, &cur)) != 0)
            return lmdb_fail(rc, "cannot walk", e, kg);
        MDB_val k, v;
        for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
             rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
            log_change(st, kg, &k);
        mdb_cursor_close(cur);
        if (rc != MDB_NOTFOUND) return lmdb_fail(rc, "cannot walk", e, kg);
        if ((rc = mdb_drop(e->txn, e->x->dbi, 0)) != 0) return lmdb_fail(rc, "cannot empty", e, kg);
        if ((rc = commit(st, e, kg)) != 0) return rc;
    }
    return 0;
}

const store_ops lmdb_store_ops = {
    .name = "lmdb",
    .blind_put = true,
    .open = lmdb_open,
    .close = lmdb_close,
    .forget = lmdb_forget,
    .commit = lmdb_commit,
    .commit_due = lmdb_commit_due,
    .clear = lmdb_clear,
    .kg_entries = lmdb_kg_entries,
    .find = lmdb_find,
    .read_owned = lmdb_read_owned,
    .read_copy = lmdb_read_copy,
    .fetch_ahead = lmdb_fetch_ahead,
    .rec_new = lmdb_rec_new,
    .rec_mutable = lmdb_rec_mutable,
    .rec_capacity = lmdb_rec_capacity,
    .write_begin = lmdb_write_begin,
    .write_end = lmdb_write_end,
    .publish = lmdb_publish,
    .delete = lmdb_delete,
    .view = lmdb_view,
    .next = lmdb_next,
    .ttl_cleanup = lmdb_ttl_cleanup,
    .cut_open = lmdb_cut_open,
    .cut_close = lmdb_cut_close,
    .snapshot = lmdb_snapshot,
    .scan = lmdb_scan,
    .restore_begin = lmdb_restore_begin,
    .restore = lmdb_restore,
    .restore_end = lmdb_restore_end,
};
