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

#include "backends/lmdb.h"

#define MAP_INITIAL (64ull << 20)    /* bytes of map an environment starts with */
#define TXN_MAX_BYTES (256ull << 20) /* an estimate of a transaction's new pages stays under it */
#define ENV_FLAGS                                                                                  \
    (MDB_NOSUBDIR | MDB_WRITEMAP | MDB_NOSYNC | MDB_NOMETASYNC | MDB_NOTLS | MDB_NORDAHEAD)
#define KEY_PREFIX 6u

typedef struct kg_env {
    MDB_env *env;
    MDB_dbi dbi;
    MDB_txn *txn;       /* the owner's write transaction, or NULL */
    MDB_txn *rtxn;      /* a reset read transaction, or NULL */
    uint64_t txn_bytes; /* an estimate of the pages txn has made, in bytes */
    uint64_t room;      /* what txn_bytes may reach before the transaction commits */
    uint32_t psize;
    uint32_t depth;
    uint8_t *clean; /* the stored key the TTL cleanup goes on after */
    size_t clean_len, clean_cap;
} kg_env;

struct lmdb_store {
    kg_env *envs;
    uint32_t maxp;
    int max_key;
    char dir[SHM_LMDB_DIR];
    uint8_t *kbuf; /* an encoded key */
    size_t kcap;
    shm_rec *shadow[2]; /* private copies of records: one found, one being built */
    size_t shadow_cap[2];
    int cur;               /* the shadow that holds the record found or put last */
    uint64_t committed_ns; /* when every transaction last committed */
};

static int lmdb_fail(int rc, const char *what, const kg_env *e, uint32_t kg)
{
    const char *path = "";
    if (e && e->env) mdb_env_get_path(e->env, &path);
    if (rc == MDB_MAP_FULL || rc == MDB_TXN_FULL)
        return shm_fail(STASH_EFULL, "key group %u (%s): %s: %s", kg, path, what, mdb_strerror(rc));
    return shm_fail(rc > 0        ? -rc
                    : rc < -30800 ? -EIO
                                  : rc,
                    "key group %u (%s): %s: %s", kg, path, what, mdb_strerror(rc));
}

int lmdb_store_open(stash_worker *w)
{
    lmdb_store *st = calloc(1, sizeof *st);
    if (!st) return shm_fail(-ENOMEM, "out of memory");
    st->maxp = w->arena->hdr->max_parallelism;
    st->envs = calloc(st->maxp, sizeof *st->envs);
    if (!st->envs) {
        free(st);
        return shm_fail(-ENOMEM, "out of memory");
    }
    snprintf(st->dir, sizeof st->dir, "%s", w->arena->hdr->lmdb_dir);
    st->max_key = 0;
    w->lmdb = st;
    return 0;
}

/* Sets up a freshly opened environment: its table, its tree's shape. */
static int env_init(kg_env *e, uint32_t kg)
{
    MDB_txn *t;
    int rc = mdb_txn_begin(e->env, NULL, 0, &t);
    if (rc) return lmdb_fail(rc, "cannot begin", e, kg);
    rc = mdb_dbi_open(t, NULL, 0, &e->dbi);
    if (rc) {
        mdb_txn_abort(t);
        return lmdb_fail(rc, "cannot open its table", e, kg);
    }
    rc = mdb_txn_commit(t);
    return rc ? lmdb_fail(rc, "cannot commit", e, kg) : 0;
}

static int env_for(lmdb_store *st, uint32_t kg, kg_env **out)
{
    kg_env *e = &st->envs[kg];
    *out = e;
    if (e->env) return 0;
    char path[SHM_LMDB_DIR + 32];
    snprintf(path, sizeof path, "%s/kg-%05u.mdb", st->dir, kg);
    int rc = mdb_env_create(&e->env);
    if (rc) return shm_fail(-ENOMEM, "%s: %s", path, mdb_strerror(rc));
    if ((rc = mdb_env_set_mapsize(e->env, MAP_INITIAL)) == 0)
        rc = mdb_env_open(e->env, path, ENV_FLAGS, 0600);
    if (rc) {
        mdb_env_close(e->env);
        e->env = NULL;
        return shm_fail(rc > 0 ? -rc : -EIO, "key group %u: cannot open %s: %s", kg, path,
                        mdb_strerror(rc));
    }
    /* Readers a dead process left hold pages back: clear them. */
    int dead;
    mdb_reader_check(e->env, &dead);
    MDB_stat s;
    mdb_env_stat(e->env, &s);
    e->psize = s.ms_psize;
    if (!st->max_key) st->max_key = mdb_env_get_maxkeysize(e->env);
    rc = env_init(e, kg);
    if (rc) {
        mdb_env_close(e->env);
        e->env = NULL;
    }
    return rc;
}

/* Room for new pages: the map less what is used, halved (a transaction
 * copies each page it changes), and never more than LMDB's dirty-page
 * limit allows. */
static uint64_t room_of(const kg_env *e)
{
    MDB_envinfo info;
    mdb_env_info(e->env, &info);
    uint64_t used = ((uint64_t)info.me_last_pgno + 1) * e->psize;
    uint64_t room = info.me_mapsize > used ? (info.me_mapsize - used) / 2 : 0;
    return room < TXN_MAX_BYTES ? room : TXN_MAX_BYTES;
}

static int begin_write(kg_env *e, uint32_t kg)
{
    if (e->rtxn) {
        mdb_txn_abort(e->rtxn);
        e->rtxn = NULL;
    }
    int rc = mdb_txn_begin(e->env, NULL, 0, &e->txn);
    if (rc == MDB_MAP_RESIZED) {
        /* Another process grew the map: take its size. */
        mdb_env_set_mapsize(e->env, 0);
        rc = mdb_txn_begin(e->env, NULL, 0, &e->txn);
    }
    if (rc) {
        e->txn = NULL;
        return lmdb_fail(rc, "cannot begin a write", e, kg);
    }
    MDB_stat s;
    mdb_stat(e->txn, e->dbi, &s);
    e->depth = s.ms_depth;
    e->txn_bytes = 0;
    e->room = room_of(e);
    return 0;
}

static int commit(kg_env *e, uint32_t kg)
{
    if (!e->txn) return 0;
    int rc = mdb_txn_commit(e->txn);
    e->txn = NULL;
    return rc ? lmdb_fail(rc, "cannot commit", e, kg) : 0;
}

/* Makes room for a write of about bytes: commits the transaction early and
 * doubles the map until a transaction of that size fits. */
static int make_room(kg_env *e, uint32_t kg, uint64_t bytes)
{
    int rc = commit(e, kg);
    for (int i = 0; rc == 0 && room_of(e) < bytes && i < 40; i++) {
        MDB_envinfo info;
        mdb_env_info(e->env, &info);
        rc = mdb_env_set_mapsize(e->env, info.me_mapsize * 2);
        if (rc) rc = lmdb_fail(rc, "cannot grow the map", e, kg);
    }
    if (rc == 0 && room_of(e) < bytes)
        rc = shm_fail(STASH_ETOOBIG, "key group %u: a write of %llu bytes", kg,
                      (unsigned long long)bytes);
    return rc ? rc : begin_write(e, kg);
}

/* The owner's transaction of kg, begun if need be; with bytes > 0, one that
 * has room for a write of that many bytes. */
static int txn_for(stash_worker *w, uint32_t kg, uint64_t bytes, kg_env **out)
{
    int rc = env_for(w->lmdb, kg, out);
    if (rc) return rc;
    kg_env *e = *out;
    if (!e->txn && (rc = begin_write(e, kg)) != 0) return rc;
    if (bytes == 0) return 0;
    /* The pages a change may copy: its path down the tree, a split, and the
     * value's overflow pages. */
    uint64_t need = bytes + (uint64_t)(e->depth + 2) * e->psize;
    if (e->txn_bytes + need > e->room && (rc = make_room(e, kg, need)) != 0) return rc;
    e->txn_bytes += need;
    return 0;
}

int lmdb_store_commit(stash_worker *w)
{
    lmdb_store *st = w->lmdb;
    int first = 0;
    for (uint32_t kg = 0; kg < st->maxp; kg++) {
        kg_env *e = &st->envs[kg];
        if (!e->txn) continue;
        int rc = commit(e, kg);
        if (rc && !first) first = rc;
    }
    st->committed_ns = shm_now_ns();
    w->writes++;
    return first;
}

int lmdb_store_commit_due(stash_worker *w)
{
    uint64_t now = shm_now_ns();
    return now - w->lmdb->committed_ns >= LMDB_COMMIT_MS * 1000000ull ? lmdb_store_commit(w) : 0;
}

void lmdb_store_close(stash_worker *w)
{
    lmdb_store *st = w->lmdb;
    if (!st) return;
    lmdb_store_commit(w);
    for (uint32_t kg = 0; kg < st->maxp; kg++) {
        kg_env *e = &st->envs[kg];
        if (e->rtxn) mdb_txn_abort(e->rtxn);
        if (e->env) mdb_env_close(e->env);
        free(e->clean);
    }
    free(st->envs);
    free(st->kbuf);
    free(st->shadow[0]);
    free(st->shadow[1]);
    free(st);
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
    int rc = lmdb_read_owned(w, l, c, &view);
    return rc == STASH_ENOTFOUND ? 0 : rc;
}

int lmdb_read_owned(stash_worker *w, const shm_lookup *l, shm_cursor *c, stash_bytes *out)
{
    lmdb_store *st = w->lmdb;
    c->link = NULL;
    c->rec = NULL;
    kg_env *e;
    MDB_val k, v;
    int rc = txn_for(w, l->kg, 0, &e);
    if (!rc) rc = encode_lookup(st, l, &k);
    if (rc) return rc;
    rc = mdb_get(e->txn, e->dbi, &k, &v);
    if (rc == MDB_NOTFOUND) return STASH_ENOTFOUND;
    if (rc) return lmdb_fail(rc, "cannot read", e, l->kg);
    *out = (stash_bytes){v.mv_data, v.mv_size};
    return load_shadow(st, l, &v, &c->rec);
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
        rc = mdb_get(e->txn, e->dbi, &k, &v);
    } else {
        rc = e->rtxn ? mdb_txn_renew(e->rtxn) : mdb_txn_begin(e->env, NULL, MDB_RDONLY, &e->rtxn);
        if (rc == MDB_MAP_RESIZED) {
            if (e->rtxn) mdb_txn_abort(e->rtxn);
            e->rtxn = NULL;
            mdb_env_set_mapsize(e->env, 0);
            rc = mdb_txn_begin(e->env, NULL, MDB_RDONLY, &e->rtxn);
        }
        if (rc) {
            e->rtxn = NULL;
            return lmdb_fail(rc, "cannot begin a read", e, l->kg);
        }
        rc = mdb_get(e->rtxn, e->dbi, &k, &v);
    }
    if (rc == 0) {
        if (state_reserve(buf, cap, v.mv_size ? v.mv_size : 1) < 0)
            rc = -ENOMEM;
        else if (v.mv_size)
            memcpy(*buf, v.mv_data, v.mv_size);
    }
    if (!e->txn) mdb_txn_reset(e->rtxn);
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

int lmdb_publish(stash_worker *w, const shm_lookup *l, shm_cursor *c, shm_rec *rec)
{
    lmdb_store *st = w->lmdb;
    (void)l;
    uint32_t kg = rec->version, vlen = atomic_load_explicit(&rec->vlen, memory_order_relaxed);
    kg_env *e;
    MDB_val k, v = {vlen, shm_rec_value(rec)};
    int rc =
        encode(st, kg, rec->state, shm_rec_key(rec), rec->klen, shm_rec_ns(rec), rec->nslen, &k);
    if (!rc) rc = txn_for(w, kg, k.mv_size + vlen, &e);
    if (rc) return rc;
    rc = mdb_put(e->txn, e->dbi, &k, &v, 0);
    if (rc) return lmdb_fail(rc, "cannot write", e, kg);
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
    rc = mdb_del(e->txn, e->dbi, &k, NULL);
    c->rec = NULL;
    return rc == 0 || rc == MDB_NOTFOUND ? 0 : lmdb_fail(rc, "cannot delete", e, l->kg);
}

int64_t lmdb_kg_entries(stash_worker *w, uint32_t kg)
{
    kg_env *e;
    int rc = env_for(w->lmdb, kg, &e);
    if (rc) return rc;
    MDB_txn *t = e->txn;
    if (!t && (rc = mdb_txn_begin(e->env, NULL, MDB_RDONLY, &t)) != 0)
        return lmdb_fail(rc, "cannot begin a read", e, kg);
    MDB_stat s;
    rc = mdb_stat(t, e->dbi, &s);
    if (t != e->txn) mdb_txn_abort(t);
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
    if ((rc = mdb_cursor_open(e->txn, e->dbi, &cur)) != 0)
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
    if (mdb_cursor_open(e->txn, e->dbi, &cur)) return;
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
        if (mdb_del(e->txn, e->dbi, &dk, NULL) == 0) w->writes++;
        at += 2 + n;
    }
    free(doomed);
}
