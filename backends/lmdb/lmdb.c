/* SPDX-License-Identifier: MIT */
/*
 * lmdb.c: the lmdb keyed backend. Key group kg lives in the environment
 * DIR/kg-NNNNN.mdb, so that its owner is the one writer of that environment
 * and a key group changes hands without moving a byte. A record's key is
 * DESIGN.md's layout: key group (2 bytes, big-endian), state id (2),
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
#include <errno.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>

#include "backends/lmdb/lmdb.h"
#include "backends/lmdb/lmdb_env.h"

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

struct lmdb_store {
    stash_arena *arena;
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
};

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

int lmdb_store_new(stash_arena *a, lmdb_store **out)
{
    lmdb_store *st = calloc(1, sizeof *st);
    if (!st) return shm_fail(-ENOMEM, "out of memory");
    st->arena = a;
    st->maxp = a->hdr->max_parallelism;
    st->envs = calloc(st->maxp, sizeof *st->envs);
    if (!st->envs) {
        free(st);
        return shm_fail(-ENOMEM, "out of memory");
    }
    snprintf(st->dir, sizeof st->dir, "%s", a->hdr->lmdb_dir);
    st->committed_ns = shm_now_ns();
    *out = st;
    return 0;
}

int lmdb_store_open(stash_worker *w)
{
    return lmdb_store_new(w->arena, &w->lmdb);
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
    while (atomic_load(&st->arena->tables[kg].cut) && shm_service_alive(st->arena, NULL)) {
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
static int txn_for(stash_worker *w, uint32_t kg, uint64_t bytes, kg_env **out)
{
    lmdb_store *st = w->lmdb;
    uint64_t need = charge_of(&st->envs[kg], bytes);
    if (need && st->dirty + need > LMDB_STORE_MAX_BYTES) {
        w->writes++;
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
    stash_arena *a = st->arena;
    if (!atomic_load_explicit(&a->hdr->lmdb_track, memory_order_relaxed)) return;
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
        atomic_fetch_add(&a->hdr->lmdb_untracked, 1);
        return;
    }
    memcpy(shm_rec_value(r), &tag, sizeof tag);
    atomic_store_explicit(&r->vlen, sizeof tag, memory_order_relaxed);
    if (shm_table_publish(a, &l, &c, r) < 0) {
        shm_free(a, shm_off_of(a, r));
        atomic_fetch_add(&a->hdr->lmdb_untracked, 1);
    }
}

/* Drops the log's notes of kg older than the next delta's base. */
static void prune_changes(lmdb_store *st, uint32_t kg, uint64_t below)
{
    stash_arena *a = st->arena;
    shm_table_tend(a, kg);
    uint8_t *key = NULL;
    size_t cap = 0;
    uint32_t pos = 0, hash;
    for (shm_rec *r; (r = shm_table_next(a, kg, &pos, &hash));) {
        uint64_t tag;
        if (r->state != SHM_CHANGE_STATE || !shm_rec_live(r) || atomic_load(&r->vlen) != sizeof tag)
            continue;
        memcpy(&tag, shm_rec_value(r), sizeof tag);
        if (tag >= below || state_reserve(&key, &cap, r->klen ? r->klen : 1) < 0) continue;
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
        if (atomic_load(&st->arena->tables[kg].cut)) {
            if (!wait) continue;
            await_snapshot(st, kg);
        }
        int rc = commit(st, e, kg);
        if (rc && !first) first = rc;
    }
    st->committed_ns = shm_now_ns();
    return first;
}

int lmdb_store_commit(stash_worker *w)
{
    w->writes++;
    return store_commit(w->lmdb, true);
}

int lmdb_store_commit_due(stash_worker *w)
{
    lmdb_store *st = w->lmdb;
    if (shm_now_ns() - st->committed_ns < LMDB_COMMIT_MS * 1000000ull) return 0;
    w->writes++;
    uint64_t below = atomic_load(&st->arena->hdr->lmdb_prune_below);
    if (below > st->pruned_below) {
        for (uint32_t kg = w->range.first; kg <= w->range.last; kg++) prune_changes(st, kg, below);
        st->pruned_below = below;
    }
    return store_commit(st, false);
}

void lmdb_store_free(lmdb_store *st)
{
    if (!st) return;
    store_commit(st, true);
    lmdb_snap_close(st);
    for (uint32_t kg = 0; kg < st->maxp; kg++) {
        kg_env *e = &st->envs[kg];
        if (e->rtxn) lmdb_env_free_reset(e->rtxn);
        lmdb_env_put(e->x);
        free(e->clean);
    }
    free(st->envs);
    free(st->kbuf);
    free(st->shadow[0]);
    free(st->shadow[1]);
    free(st);
}

void lmdb_store_close(stash_worker *w)
{
    lmdb_store_free(w->lmdb);
    w->lmdb = NULL;
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
    if (state_reserve(&st->kbuf, &st->kcap, n) < 0) return shm_fail(-ENOMEM, "out of memory");
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

int lmdb_find(stash_worker *w, const shm_lookup *l, shm_cursor *c)
{
    stash_bytes view;
    int rc = lmdb_read_owned(w, l, c, &view, true);
    return rc == STASH_ENOTFOUND ? 0 : rc;
}

int lmdb_read_owned(stash_worker *w, const shm_lookup *l, shm_cursor *c, stash_bytes *out,
                    bool shadow)
{
    lmdb_store *st = w->lmdb;
    c->group = NULL;
    c->rec = NULL;
    kg_env *e;
    MDB_val k, v;
    int rc = txn_for(w, l->kg, 0, &e);
    if (!rc) rc = encode_lookup(st, l, &k);
    if (rc) return rc;
    rc = mdb_get(e->txn, e->x->dbi, &k, &v);
    if (rc == MDB_NOTFOUND) return STASH_ENOTFOUND;
    if (rc) return lmdb_fail(rc, "cannot read", e, l->kg);
    *out = (stash_bytes){v.mv_data, v.mv_size};
    return shadow ? load_shadow(st, l, &v, &c->rec) : 0;
}

int64_t lmdb_read_copy(stash_worker *w, const shm_lookup *l, uint8_t **buf, size_t *cap)
{
    lmdb_store *st = w->lmdb;
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
        if (state_reserve(buf, cap, v.mv_size ? v.mv_size : 1) < 0)
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

int lmdb_rec_new(stash_worker *w, const shm_lookup *l, size_t cap, shm_rec **out)
{
    lmdb_store *st = w->lmdb;
    shm_rec *r = shadow(st, 1 - st->cur, l->klen, l->nslen, cap);
    if (!r) return shm_fail(-ENOMEM, "out of memory");
    shadow_head(r, l->kg, l->state, l->klen, l->nslen, 0);
    uint8_t *p = (uint8_t *)(r + 1);
    if (l->klen) memcpy(p, l->key, l->klen);
    if (l->nslen) memcpy(p + l->klen, l->ns, l->nslen);
    *out = r;
    return 0;
}

uint64_t lmdb_rec_capacity(const stash_worker *w, const shm_rec *rec)
{
    const lmdb_store *st = w->lmdb;
    int i = rec == st->shadow[0] ? 0 : 1;
    return st->shadow_cap[i] - sizeof(shm_rec) - rec->klen - rec->nslen;
}

int lmdb_publish(stash_worker *w, shm_cursor *c, shm_rec *rec)
{
    lmdb_store *st = w->lmdb;
    uint32_t kg = rec->version, vlen = atomic_load_explicit(&rec->vlen, memory_order_relaxed);
    kg_env *e;
    MDB_val k, v = {vlen, shm_rec_value(rec)};
    int rc =
        encode(st, kg, rec->state, shm_rec_key(rec), rec->klen, shm_rec_ns(rec), rec->nslen, &k);
    if (!rc) rc = txn_for(w, kg, k.mv_size + vlen, &e);
    if (rc) return rc;
    rc = mdb_put(e->txn, e->x->dbi, &k, &v, 0);
    if (rc) return lmdb_fail(rc, "cannot write", e, kg);
    log_change(st, kg, &k);
    st->cur = rec == st->shadow[0] ? 0 : 1;
    if (c) c->rec = rec;
    return 0;
}

int lmdb_delete(stash_worker *w, const shm_lookup *l, shm_cursor *c)
{
    kg_env *e;
    MDB_val k;
    int rc = encode_lookup(w->lmdb, l, &k);
    if (!rc) rc = txn_for(w, l->kg, 1, &e);
    if (rc) return rc;
    rc = mdb_del(e->txn, e->x->dbi, &k, NULL);
    c->rec = NULL;
    if (rc == 0) log_change(w->lmdb, l->kg, &k);
    return rc == 0 || rc == MDB_NOTFOUND ? 0 : lmdb_fail(rc, "cannot delete", e, l->kg);
}

int64_t lmdb_kg_entries(stash_worker *w, uint32_t kg)
{
    kg_env *e;
    int rc = env_for(w->lmdb, kg, &e);
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
    out->raw_key = (stash_bytes){k->mv_data, k->mv_size};
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

int lmdb_next(stash_worker *w, uint32_t kg, uint16_t state, const void *after, size_t after_len,
              lmdb_entry *out)
{
    kg_env *e;
    int rc = txn_for(w, kg, 0, &e);
    if (rc) return rc;
    MDB_cursor *cur;
    if ((rc = mdb_cursor_open(e->txn, e->x->dbi, &cur)) != 0)
        return lmdb_fail(rc, "cannot walk", e, kg);
    MDB_val k, v;
    rc = seek(cur, kg, state, after, after_len, &k, &v);
    mdb_cursor_close(cur);
    if (rc < 0 || rc > 1) return lmdb_fail(rc, "cannot walk", e, kg);
    if (rc == 1 && !decode(&k, &v, out))
        return shm_fail(STASH_ECORRUPT, "key group %u: a stored key of %zu bytes", kg, k.mv_size);
    return rc;
}

/* Whether a record of s expired whole: values and merging states by their
 * timestamp; lists and maps expire element by element on access instead. */
static bool value_expired(const stash_state *s, const MDB_val *v, uint64_t now)
{
    if (s->kind == STASH_LIST || s->kind == STASH_MAP) return false;
    return v->mv_size >= TTL_BYTES && state_expired(s, state_ts_get(v->mv_data), now);
}

static bool of_state(const MDB_val *k, uint32_t kg, uint16_t state)
{
    const uint8_t *p = k->mv_data;
    return k->mv_size >= 4 && p[0] == (uint8_t)(kg >> 8) && p[1] == (uint8_t)kg &&
           p[2] == (uint8_t)(state >> 8) && p[3] == (uint8_t)state;
}

void lmdb_ttl_cleanup(stash_state *s, uint32_t kg)
{
    stash_worker *w = s->w;
    uint32_t budget = s->ttl.cleanup_entries;
    kg_env *e;
    /* Room for the deletions first: making room commits, which would end
     * the walk's cursor. */
    if (txn_for(w, kg, (uint64_t)budget * 4096u, &e)) return;
    MDB_cursor *cur;
    if (mdb_cursor_open(e->txn, e->x->dbi, &cur)) return;
    uint64_t now = state_now(s);
    bool going_on = e->clean_len && of_state(&(MDB_val){e->clean_len, e->clean}, kg, s->id);
    MDB_val k, v;
    int rc = seek(cur, kg, s->id, going_on ? e->clean : NULL, going_on ? e->clean_len : 0, &k, &v);
    uint8_t *doomed = NULL;
    size_t doomed_len = 0, doomed_cap = 0;
    for (; rc == 1 && budget > 0; budget--) {
        /* The expired ones are deleted after the walk, which goes on after
         * the last one kept. */
        uint8_t **into = value_expired(s, &v, now) ? &doomed : &e->clean;
        size_t *cap = into == &doomed ? &doomed_cap : &e->clean_cap;
        size_t at = into == &doomed ? doomed_len : 0;
        if (state_reserve(into, cap, at + 2 + k.mv_size) == 0) {
            if (into == &doomed) {
                doomed[at] = (uint8_t)(k.mv_size >> 8), doomed[at + 1] = (uint8_t)k.mv_size;
                memcpy(doomed + at + 2, k.mv_data, k.mv_size);
                doomed_len = at + 2 + k.mv_size;
            } else {
                memcpy(e->clean, k.mv_data, k.mv_size);
                e->clean_len = k.mv_size;
            }
        }
        rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT) == 0 && of_state(&k, kg, s->id);
    }
    /* At the end of the state's records: start over next time. */
    if (rc != 1) e->clean_len = 0;
    mdb_cursor_close(cur);
    for (size_t at = 0; at + 2 <= doomed_len;) {
        size_t n = (size_t)doomed[at] << 8 | doomed[at + 1];
        MDB_val dk = {n, doomed + at + 2};
        if (mdb_del(e->txn, e->x->dbi, &dk, NULL) == 0) {
            log_change(w->lmdb, kg, &dk);
            w->writes++;
        }
        at += 2 + n;
    }
    free(doomed);
}

/* ---- checkpoints ---------------------------------------------------------- */

int lmdb_snap_open(lmdb_store *st, uint32_t kg)
{
    kg_env *e;
    int rc = env_for(st, kg, &e);
    if (rc || e->snap) return rc;
    rc = lmdb_env_begin(e->x, MDB_RDONLY, &e->snap);
    return rc ? lmdb_fail(rc, "cannot begin its snapshot", e, kg) : 0;
}

void lmdb_snap_close_kg(lmdb_store *st, uint32_t kg)
{
    if (!st->envs[kg].snap) return;
    lmdb_env_abort(st->envs[kg].x, st->envs[kg].snap);
    st->envs[kg].snap = NULL;
}

void lmdb_snap_close(lmdb_store *st)
{
    for (uint32_t kg = 0; kg < st->maxp; kg++) lmdb_snap_close_kg(st, kg);
}

typedef struct delta_walk {
    kg_env *e;
    uint32_t kg;
    uint64_t base;
    snap_buf *out;
    uint64_t n;
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
    lmdb_entry en;
    if (!decode(&k, &v, &en) || en.ns.len > UINT16_MAX || v.mv_size > UINT32_MAX)
        return shm_fail(STASH_ECORRUPT, "key group %u: a logged key of %zu bytes", d->kg,
                        k.mv_size);
    if (snap_block_add(d->out, en.state, en.key.data, (uint16_t)en.key.len, en.ns.data,
                       (uint16_t)en.ns.len, v.mv_data, (uint32_t)v.mv_size,
                       rc ? SNAP_REC_DELETED : 0) < 0)
        return shm_fail(-ENOMEM, "out of memory");
    d->n++;
    return 0;
}

int64_t lmdb_snap_write_kg(void *store, uint32_t kg, uint64_t base_id, uint32_t pin, bool lz4,
                           const snap_filter *filter, snap_buf *out)
{
    lmdb_store *st = store;
    kg_env *e = &st->envs[kg];
    if (!e->snap) return shm_fail(-EINVAL, "key group %u: no snapshot open", kg);
    if (base_id) {
        /* The keys the log names as changed since the base, as the cut left it. */
        size_t start;
        if (snap_block_begin(out, &start) < 0) return shm_fail(-ENOMEM, "out of memory");
        delta_walk d = {e, kg, base_id, out, 0};
        int rc = shm_table_walk_at(st->arena, kg, pin, delta_visit, &d);
        return rc < 0 ? rc : snap_block_end(out, start, kg, d.n, SNAP_DELTA, lz4);
    }
    size_t start;
    if (snap_block_begin(out, &start) < 0) return shm_fail(-ENOMEM, "out of memory");
    MDB_cursor *cur;
    int rc = mdb_cursor_open(e->snap, e->x->dbi, &cur);
    if (rc) return lmdb_fail(rc, "cannot walk its snapshot", e, kg);
    uint64_t n = 0;
    MDB_val k, v;
    snap_buf scratch = {0};
    int err = 0; /* stash's error, apart from LMDB's codes in rc */
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && err == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        lmdb_entry en;
        if (!decode(&k, &v, &en) || en.ns.len > UINT16_MAX || v.mv_size > UINT32_MAX) {
            err =
                shm_fail(STASH_ECORRUPT, "key group %u: a stored key of %zu bytes", kg, k.mv_size);
            break;
        }
        const uint8_t *value = v.mv_data;
        uint32_t vlen = (uint32_t)v.mv_size;
        int keep = filter ? filter->fn(filter->ctx, en.state, &value, &vlen, &scratch) : 1;
        if (keep < 0) err = keep;
        if (keep <= 0) continue;
        if (snap_block_add(out, en.state, en.key.data, (uint16_t)en.key.len, en.ns.data,
                           (uint16_t)en.ns.len, value, vlen, 0) < 0)
            err = shm_fail(-ENOMEM, "out of memory");
        else
            n++;
    }
    mdb_cursor_close(cur);
    snap_buf_free(&scratch);
    if (err) return err;
    if (rc != MDB_NOTFOUND) return lmdb_fail(rc, "cannot walk its snapshot", e, kg);
    return snap_block_end(out, start, kg, n, 0, lz4);
}

int lmdb_restore_begin(lmdb_store *st, stash_kg_range range)
{
    for (uint32_t kg = range.first; kg <= range.last; kg++) {
        kg_env *e;
        int rc = env_for(st, kg, &e);
        if (rc) return rc;
        MDB_txn *t;
        MDB_stat s;
        if ((rc = lmdb_env_begin(e->x, MDB_RDONLY, &t)) != 0)
            return lmdb_fail(rc, "cannot begin a read", e, kg);
        rc = mdb_stat(t, e->x->dbi, &s);
        lmdb_env_abort(e->x, t);
        if (rc) return lmdb_fail(rc, "cannot count", e, kg);
        /* Into an empty environment, records in key order append. */
        e->append = s.ms_entries == 0;
    }
    return 0;
}

int lmdb_restore_record(void *restorer, uint32_t kg, const snap_record *r)
{
    lmdb_restorer *x = restorer;
    if (r->state >= x->map->n || x->map->ids[r->state] == 0)
        return shm_fail(STASH_ECORRUPT, "a record of state %u, which the metadata does not name",
                        r->state);
    lmdb_store *st = x->store;
    MDB_val k, v = {r->vlen, (void *)r->value};
    kg_env *e;
    /* Each key group is restored by one thread: its own key buffer. */
    uint8_t key[KEY_PREFIX + 512];
    size_t n = KEY_PREFIX + (size_t)r->klen + r->nslen;
    int rc = store_txn(st, kg, n + r->vlen, &e);
    if (rc) return rc;
    if (n > (size_t)st->max_key || n > sizeof key)
        return shm_fail(STASH_ETOOBIG,
                        "key group %u: a key and namespace of %zu bytes; lmdb stores at most %d "
                        "with its %u-byte prefix",
                        kg, n - KEY_PREFIX, st->max_key, KEY_PREFIX);
    uint16_t state = x->map->ids[r->state];
    key[0] = (uint8_t)(kg >> 8), key[1] = (uint8_t)kg;
    key[2] = (uint8_t)(state >> 8), key[3] = (uint8_t)state;
    key[4] = (uint8_t)(r->klen >> 8), key[5] = (uint8_t)r->klen;
    memcpy(key + KEY_PREFIX, r->key, r->klen);
    memcpy(key + KEY_PREFIX + r->klen, r->ns, r->nslen);
    k = (MDB_val){n, key};
    /* A rollback's changes go into the change log like any other. */
    log_change(st, kg, &k);
    if (r->flags & SNAP_REC_DELETED) {
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

int lmdb_restore_kg_done(void *restorer, uint32_t kg, int rc)
{
    lmdb_restorer *x = restorer;
    kg_env *e = &x->store->envs[kg];
    e->append = false;
    if (!e->txn) return 0;
    if (rc < 0) {
        lmdb_env_abort(e->x, e->txn);
        discharge(x->store, e);
        return rc;
    }
    return commit(x->store, e, kg);
}

int lmdb_clear(lmdb_store *st, stash_kg_range range)
{
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
