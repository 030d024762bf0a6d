/* SPDX-License-Identifier: MIT */
/*
 * opstate.c: operator state (Flink's DefaultOperatorStateBackend): per
 * worker, not per key. A worker keeps its operator states in its own memory
 * and records them at each barrier as one blob in the control block; the
 * engine writes the blobs of a checkpoint into its metadata. A worker that
 * starts takes its operator state from the blobs of the newest complete
 * checkpoint (or restore), redistributed when the parallelism changed:
 * split lists are dealt out in contiguous chunks (the first workers one
 * element more, as Flink's round-robin repartitioner), union lists go whole
 * to everyone, and broadcast state of worker i comes from old worker
 * i mod p, or the first old worker that has it where that one has none.
 *
 * A blob: u32 count of states, then per state u16 state id, u16 kind, u32
 * entries, then the entries: u32 length and bytes for lists; u32 key
 * length, u32 value length, key and value for broadcast maps.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/state/opstate.h"

static bool is_list_kind(stash_kind k)
{
    return k == STASH_OP_LIST || k == STASH_OP_UNION;
}

static void entries_free(op_entries *e)
{
    for (size_t i = 0; i < e->n; i++) free(e->mem[i]);
    free(e->mem);
    free(e->keys);
    free(e->values);
    *e = (op_entries){0};
}

/* Puts fresh in place of *dst, or after a failure rc frees it; returns rc. */
static int entries_replace(op_entries *dst, op_entries *fresh, int rc)
{
    if (rc) {
        entries_free(fresh);
        return rc;
    }
    entries_free(dst);
    *dst = *fresh;
    return 0;
}

void opstate_free(stash_state *s)
{
    entries_free(&s->op);
}

/* Appends a copy of (key, value) to e; key is unused (NULL) for lists. */
static int entries_add(op_entries *e, const void *k, size_t klen, const void *v, size_t vlen)
{
    if (e->n == e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 8;
        uint8_t **mem = realloc(e->mem, cap * sizeof *mem);
        if (mem) e->mem = mem;
        stash_bytes *keys = mem ? realloc(e->keys, cap * sizeof *keys) : NULL;
        if (keys) e->keys = keys;
        stash_bytes *values = keys ? realloc(e->values, cap * sizeof *values) : NULL;
        if (!values) return shm_fail(-ENOMEM, "out of memory");
        e->values = values;
        e->cap = cap;
    }
    uint8_t *m = malloc(klen + vlen + 1);
    if (!m) return shm_fail(-ENOMEM, "out of memory");
    if (klen) memcpy(m, k, klen);
    if (vlen) memcpy(m + klen, v, vlen);
    e->mem[e->n] = m;
    e->keys[e->n] = (stash_bytes){m, klen};
    e->values[e->n] = (stash_bytes){m + klen, vlen};
    e->n++;
    return 0;
}

static int check_kind(const stash_state *s, bool list)
{
    if (!s) return shm_refuse_null(list ? "operator list state" : "broadcast state", "state");
    if (list ? is_list_kind(s->kind) : s->kind == STASH_OP_BROADCAST) return 0;
    return shm_fail(STASH_EKIND, "state %u is not %s operator state", s->id,
                    list ? "list" : "broadcast");
}

STASH_API int stash_op_list_get(stash_state *state, const stash_bytes **elements, size_t *n)
{
    if (!elements || !n) return shm_refuse_null(__func__, "elements or n");
    int rc = check_kind(state, true);
    if (rc) return rc;
    *elements = state->op.values;
    *n = state->op.n;
    return 0;
}

/* Bytes a blob can carry: NULL only without a length, a u32 length. */
static int check_bytes(const void *p, size_t len, const char *fn, const char *what)
{
    if (shm_null_bytes(p, len)) return shm_refuse_null(fn, what);
    if (len > UINT32_MAX / 4) return shm_fail(STASH_ETOOBIG, "%s: %s of %zu bytes", fn, what, len);
    return 0;
}

STASH_API int stash_op_list_add(stash_state *state, const void *value, size_t len)
{
    int rc = check_kind(state, true);
    if (!rc) rc = check_bytes(value, len, __func__, "value");
    return rc ? rc : entries_add(&state->op, NULL, 0, value, len);
}

STASH_API int stash_op_list_update(stash_state *state, const stash_bytes *values, size_t n)
{
    int rc = check_kind(state, true);
    if (!rc) rc = state_check_array(values, n, __func__, "values");
    if (rc) return rc;
    op_entries fresh = {0};
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = entries_add(&fresh, NULL, 0, values[i].data, values[i].len);
    return entries_replace(&state->op, &fresh, rc);
}

static ssize_t broadcast_find(const stash_state *s, const void *k, size_t klen)
{
    if (!k) k = ""; /* an empty key given as NULL: memcmp takes no NULL */
    for (size_t i = 0; i < s->op.n; i++)
        if (s->op.keys[i].len == klen && memcmp(s->op.keys[i].data, k, klen) == 0)
            return (ssize_t)i;
    return -1;
}

STASH_API int stash_broadcast_get(stash_state *state, const void *k, size_t klen, stash_bytes *out)
{
    if (!out) return shm_refuse_null(__func__, "out");
    int rc = check_kind(state, false);
    if (!rc) rc = check_bytes(k, klen, __func__, "k");
    if (rc) return rc;
    ssize_t i = broadcast_find(state, k, klen);
    if (i < 0) return STASH_ENOTFOUND;
    *out = state->op.values[i];
    return 0;
}

static void broadcast_drop(op_entries *e, size_t i)
{
    free(e->mem[i]);
    e->n--;
    e->mem[i] = e->mem[e->n];
    e->keys[i] = e->keys[e->n];
    e->values[i] = e->values[e->n];
}

STASH_API int stash_broadcast_put(stash_state *state, const void *k, size_t klen, const void *value,
                                  size_t len)
{
    int rc = check_kind(state, false);
    if (!rc) rc = check_bytes(k, klen, __func__, "k");
    if (!rc) rc = check_bytes(value, len, __func__, "value");
    if (rc) return rc;
    ssize_t old = broadcast_find(state, k, klen);
    rc = entries_add(&state->op, k, klen, value, len);
    if (rc == 0 && old >= 0) broadcast_drop(&state->op, (size_t)old);
    return rc;
}

STASH_API int stash_broadcast_remove(stash_state *state, const void *k, size_t klen)
{
    int rc = check_kind(state, false);
    if (!rc) rc = check_bytes(k, klen, __func__, "k");
    if (rc) return rc;
    ssize_t i = broadcast_find(state, k, klen);
    if (i >= 0) broadcast_drop(&state->op, (size_t)i);
    return 0;
}

STASH_API int stash_broadcast_entries(stash_state *state, const stash_bytes **keys,
                                      const stash_bytes **values, size_t *n)
{
    if (!keys || !values || !n) return shm_refuse_null(__func__, "keys, values or n");
    int rc = check_kind(state, false);
    if (rc) return rc;
    *keys = state->op.keys;
    *values = state->op.values;
    *n = state->op.n;
    return 0;
}

/* ---- blobs ---------------------------------------------------------------- */

static int put(op_buf *b, const void *p, size_t n)
{
    if (shm_reserve(&b->data, &b->cap, b->len + n) < 0) return -ENOMEM;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

static int put_u32(op_buf *b, uint32_t x)
{
    return put(b, &x, 4);
}

/* Appends state s to a blob being built: its id, kind, count and entries. */
static int encode_state(const stash_state *s, op_buf *out)
{
    uint16_t head[2] = {s->id, (uint16_t)s->kind};
    int rc = put(out, head, sizeof head);
    if (s->kind == STASH_TIMERS) { /* one element: the watermark */
        if (rc == 0) rc = put_u32(out, 1);
        if (rc == 0) rc = put_u32(out, sizeof s->watermark);
        return rc == 0 ? put(out, &s->watermark, sizeof s->watermark) : rc;
    }
    if (rc == 0) rc = put_u32(out, (uint32_t)s->op.n);
    for (size_t i = 0; i < s->op.n && rc == 0; i++) {
        if (s->kind == STASH_OP_BROADCAST) rc = put_u32(out, (uint32_t)s->op.keys[i].len);
        if (rc == 0) rc = put_u32(out, (uint32_t)s->op.values[i].len);
        if (rc == 0 && s->kind == STASH_OP_BROADCAST)
            rc = put(out, s->op.keys[i].data, s->op.keys[i].len);
        if (rc == 0) rc = put(out, s->op.values[i].data, s->op.values[i].len);
    }
    return rc;
}

static int load_share(stash_state *s, uint32_t p, const ckpt_blob *blobs, bool carried);
static int load_committed(stash_state *s, bool carried);

static bool registered(const stash_worker *w, uint32_t id)
{
    for (const stash_state *s = w->states; s; s = s->next)
        if (s->id == id) return true;
    return false;
}

/* Appends the operator states of the arena that w has not registered, each
 * as registering it would give it to w, and counts them in *count: Flink's
 * backend keeps restored states nobody asks for, and so do the workers'
 * blobs. A union list is carried once in all, not once a worker: each its
 * own part at the same parallelism, worker 0 the whole at another. */
static int encode_carried(stash_worker *w, op_buf *out, uint32_t *count)
{
    int rc = 0;
    for (uint32_t i = 0; i < SHM_CATALOG_SIZE && rc == 0; i++) {
        const shm_catalog_entry *e = &w->arena->catalog[i];
        if (!atomic_load_explicit(&e->used, memory_order_acquire) ||
            !opstate_recorded((stash_kind)e->kind) || registered(w, i + 1))
            continue;
        stash_state t = {.w = w, .id = (uint16_t)(i + 1), .kind = (stash_kind)e->kind};
        rc = w->op_blobs ? load_share(&t, w->op_p, w->op_blobs, true) : load_committed(&t, true);
        if (rc == 0 && (t.op.n || t.watermark)) {
            rc = encode_state(&t, out) < 0 ? shm_fail(-ENOMEM, "out of memory") : 0;
            (*count)++;
        }
        opstate_free(&t);
    }
    return rc;
}

int opstate_encode(stash_worker *w, op_buf *out)
{
    uint32_t count = 0;
    out->len = 0;
    int rc = put_u32(out, 0);
    for (stash_state *s = w->states; s && rc == 0; s = s->next) {
        if (!opstate_recorded(s->kind)) continue;
        rc = encode_state(s, out);
        count++;
    }
    if (rc) return shm_fail(-ENOMEM, "out of memory");
    if ((rc = encode_carried(w, out, &count)) != 0) return rc;
    memcpy(out->data, &count, 4);
    return 0;
}

/* A cursor over a blob that trusts no byte of it. */
typedef struct reader {
    const uint8_t *p;
    size_t len, at;
    const char *what; /* names the blob in errors */
} reader;

static int take(reader *r, void *out, size_t n)
{
    if (r->len - r->at < n)
        return shm_fail(STASH_ECORRUPT, "%s: offset %zu: operator state runs past its %zu bytes",
                        r->what, r->at, r->len);
    if (out) memcpy(out, r->p + r->at, n);
    r->at += n;
    return 0;
}

/* Calls fn for each state of a blob: (id, kind, entries, ctx) with r at its
 * first entry; fn must consume the entries (or skip them with skip_entries). */
typedef int state_fn(reader *r, uint16_t id, uint16_t kind, uint32_t n, void *ctx);

static int skip_entries(reader *r, uint16_t kind, uint32_t n, op_entries *into)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t klen = 0, vlen = 0;
        int rc = kind == STASH_OP_BROADCAST ? take(r, &klen, 4) : 0;
        if (rc == 0) rc = take(r, &vlen, 4);
        size_t at = r->at;
        if (rc == 0 && kind == STASH_TIMERS && vlen != sizeof(uint64_t))
            rc = shm_fail(STASH_ECORRUPT, "%s: offset %zu: a watermark of %u bytes", r->what,
                          at - 4, vlen);
        if (rc == 0) rc = take(r, NULL, (size_t)klen + vlen);
        if (rc == 0 && into) rc = entries_add(into, r->p + at, klen, r->p + at + klen, vlen);
        if (rc) return rc;
    }
    return 0;
}

static int each_state(reader *r, state_fn *fn, void *ctx)
{
    uint32_t count = 0;
    int rc = take(r, &count, 4);
    for (uint32_t i = 0; i < count && rc == 0; i++) {
        uint16_t head[2] = {0, 0};
        uint32_t n = 0;
        size_t at = r->at;
        rc = take(r, head, sizeof head);
        if (rc == 0) rc = take(r, &n, 4);
        if (rc == 0 && !opstate_recorded((stash_kind)head[1]))
            rc = shm_fail(STASH_ECORRUPT, "%s: offset %zu: kind %u is no operator state", r->what,
                          at, head[1]);
        if (rc == 0 && head[1] == STASH_TIMERS && n != 1)
            rc = shm_fail(STASH_ECORRUPT, "%s: offset %zu: timer service %u has %u watermarks",
                          r->what, at, head[0], n);
        if (rc == 0) rc = fn(r, head[0], head[1], n, ctx);
    }
    if (rc == 0 && r->at != r->len)
        rc = shm_fail(STASH_ECORRUPT, "%s: offset %zu: %zu bytes after the last state", r->what,
                      r->at, r->len - r->at);
    return rc;
}

typedef struct remap_ctx {
    const uint16_t *ids;
    uint32_t nids;
    uint8_t *blob;
} remap_ctx;

static int remap_one(reader *r, uint16_t id, uint16_t kind, uint32_t n, void *ctx)
{
    remap_ctx *m = ctx;
    size_t at = r->at - 8;
    if (id >= m->nids || m->ids[id] == 0)
        return shm_fail(STASH_ECORRUPT, "%s: offset %zu: state %u is not in the metadata", r->what,
                        at, id);
    memcpy(m->blob + at, &m->ids[id], 2);
    return skip_entries(r, kind, n, NULL);
}

int opstate_remap(uint8_t *blob, size_t len, const uint16_t *ids, uint32_t nids, const char *what)
{
    reader r = {blob, len, 0, what};
    remap_ctx m = {ids, nids, blob};
    return len ? each_state(&r, remap_one, &m) : 0;
}

typedef struct keep_ctx {
    const uint8_t *dropped; /* per state id: 1 if it goes */
    op_buf *out;
    uint32_t kept;
} keep_ctx;

static int keep_one(reader *r, uint16_t id, uint16_t kind, uint32_t n, void *ctx)
{
    keep_ctx *k = ctx;
    size_t from = r->at - 8; /* the state's id, kind and count */
    int rc = skip_entries(r, kind, n, NULL);
    if (rc || k->dropped[id]) return rc;
    k->kept++;
    return put(k->out, r->p + from, r->at - from) < 0 ? shm_fail(-ENOMEM, "out of memory") : 0;
}

int opstate_drop(const uint8_t *blob, size_t len, const uint8_t *dropped, op_buf *out,
                 const char *what)
{
    reader r = {blob, len, 0, what};
    keep_ctx k = {dropped, out, 0};
    out->len = 0;
    if (!len) return 0;
    int rc = put_u32(out, 0);
    if (rc < 0) return shm_fail(-ENOMEM, "out of memory");
    rc = each_state(&r, keep_one, &k);
    if (rc == 0) memcpy(out->data, &k.kept, 4);
    if (rc == 0 && !k.kept) out->len = 0;
    return rc;
}

typedef struct gather_ctx {
    const stash_state *s;
    op_entries *into;
    bool found;
} gather_ctx;

static int gather_one(reader *r, uint16_t id, uint16_t kind, uint32_t n, void *ctx)
{
    gather_ctx *g = ctx;
    bool mine = id == g->s->id && kind == (uint16_t)g->s->kind;
    g->found |= mine;
    return skip_entries(r, kind, n, mine ? g->into : NULL);
}

/* Appends the entries of state s in blob to into; *found says whether the
 * blob holds s at all (else NULL). */
static int gather(const stash_state *s, const ckpt_blob *blob, op_entries *into, const char *what,
                  bool *found)
{
    reader r = {blob->data, blob->len, 0, what};
    gather_ctx g = {s, into, false};
    int rc = blob->len ? each_state(&r, gather_one, &g) : 0;
    if (found) *found = g.found;
    return rc;
}

/* Broadcast state from old worker me mod p, or, where that one never had it,
 * the first old worker that has it: every worker holds the same copy. */
static int gather_broadcast(const stash_state *s, uint32_t p, const ckpt_blob *blobs, uint32_t me,
                            op_entries *into)
{
    char what[64];
    bool found = false;
    for (uint32_t k = 0; k < p && !found; k++) {
        uint32_t i = (me + k) % p;
        snprintf(what, sizeof what, "operator state of worker %u", i);
        int rc = gather(s, &blobs[i], into, what, &found);
        if (rc) return rc;
    }
    return 0;
}

/* Worker me of np's share of n split-list elements: contiguous, the first
 * n mod np workers one more (Flink's RoundRobinOperatorStateRepartitioner). */
static void split_share(size_t n, uint32_t me, uint32_t np, size_t *lo, size_t *hi)
{
    size_t base = n / np, extra = n % np;
    *lo = base * me + (me < extra ? me : extra);
    *hi = *lo + base + (me < extra ? 1 : 0);
}

/* A timer service's watermark: its own at the same parallelism, else the
 * lowest of the old workers' that had the service (the others' timers may
 * wait for any time after it); 0 where none had it. */
static int load_watermark(stash_state *s, uint32_t p, const ckpt_blob *blobs)
{
    stash_worker *w = s->w;
    uint32_t me = w->slot;
    bool same = p == w->parallelism;
    op_entries all = {0};
    int rc = 0;
    char what[64];
    for (uint32_t i = same ? me : 0; i < (same ? me + 1 : p) && rc == 0; i++) {
        snprintf(what, sizeof what, "operator state of worker %u", i);
        rc = gather(s, &blobs[i], &all, what, NULL);
    }
    uint64_t low = 0;
    for (size_t i = 0; i < all.n && rc == 0; i++) {
        uint64_t x;
        memcpy(&x, all.values[i].data, sizeof x);
        if (i == 0 || x < low) low = x;
    }
    entries_free(&all);
    if (rc == 0) s->watermark = low;
    return rc;
}

/* Sets s to worker w's share of the blobs of p workers; carried: a union
 * list's share when w does not hold the state (encode_carried). */
static int load_share(stash_state *s, uint32_t p, const ckpt_blob *blobs, bool carried)
{
    stash_worker *w = s->w;
    uint32_t me = w->slot, np = w->parallelism;
    char what[64];
    op_entries all = {0};
    int rc = 0;
    if (s->kind == STASH_TIMERS) return p ? load_watermark(s, p, blobs) : 0;
    if (p == 0) return entries_replace(&s->op, &all, 0);
    bool own = s->kind == STASH_OP_LIST || (carried && s->kind == STASH_OP_UNION);
    if (s->kind == STASH_OP_BROADCAST) {
        rc = gather_broadcast(s, p, blobs, me, &all);
    } else if (carried && s->kind == STASH_OP_UNION && p != np && me != 0) {
        /* worker 0 carries it whole */
    } else if (own && p == np) {
        snprintf(what, sizeof what, "operator state of worker %u", me);
        rc = gather(s, &blobs[me], &all, what, NULL);
    } else {
        for (uint32_t i = 0; i < p && rc == 0; i++) {
            snprintf(what, sizeof what, "operator state of worker %u", i);
            rc = gather(s, &blobs[i], &all, what, NULL);
        }
    }
    if (rc == 0 && s->kind == STASH_OP_LIST && p != np) {
        size_t lo, hi;
        split_share(all.n, me, np, &lo, &hi);
        op_entries chunk = {0};
        for (size_t i = lo; i < hi && rc == 0; i++)
            rc = entries_add(&chunk, NULL, 0, all.values[i].data, all.values[i].len);
        entries_free(&all);
        all = chunk;
    }
    return entries_replace(&s->op, &all, rc);
}

/* A timer service's watermark, loaded, is the worker's lowest bound. */
static int raise_watermark(stash_state *s, int rc)
{
    if (rc == 0 && s->kind == STASH_TIMERS && s->watermark > s->w->watermark)
        s->w->watermark = s->watermark;
    return rc;
}

int opstate_load(stash_state *s, uint32_t p, const ckpt_blob *blobs)
{
    return raise_watermark(s, load_share(s, p, blobs, false));
}

static int load_committed(stash_state *s, bool carried)
{
    stash_worker *w = s->w;
    stash_arena *a = w->arena;
    shm_control *c = a->control;
    int rc = shm_lock_acquire(&c->lock, NULL, NULL);
    if (rc < 0) return rc;
    /* At the same parallelism: this index's newest state (recorded when the
     * worker left, or at its last cut); at another: the committed set,
     * redistributed. */
    const shm_op_blob *own = &c->workers[w->slot].pending;
    uint32_t p = atomic_load(&c->committed_p);
    bool newest = atomic_load(&own->off) && atomic_load(&own->parallelism) == w->parallelism;
    if (newest) p = w->parallelism;
    ckpt_blob *blobs = p ? calloc(p, sizeof *blobs) : NULL;
    if (p && !blobs) rc = shm_fail(-ENOMEM, "out of memory");
    for (uint32_t i = 0; blobs && i < p; i++) {
        const shm_op_blob *b = newest && i == w->slot ? own : &c->workers[i].committed;
        shm_off off = atomic_load(&b->off);
        blobs[i] = (ckpt_blob){off ? (const uint8_t *)a->base + off : NULL,
                               off ? atomic_load(&b->len) : 0};
    }
    if (blobs) rc = load_share(s, p, blobs, carried);
    shm_lock_release(&c->lock);
    free(blobs);
    return rc;
}

int opstate_load_committed(stash_state *s)
{
    return raise_watermark(s, load_committed(s, false));
}
