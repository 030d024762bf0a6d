/* SPDX-License-Identifier: MIT */
/*
 * timers.c: timer services (Flink's InternalTimerService). A timer is a
 * record of its key's key group in the worker's store (state.h says how it
 * is named), so registering twice is one timer, and checkpoints, restores,
 * rescales and rollbacks carry timers as they carry state. Which timer is
 * due next is the worker's own knowledge: a 4-ary min-heap per time domain
 * in its private memory, built from the records of its key groups when the
 * service is first used. A deleted timer stays in the heap until it comes
 * up (it then finds no record and is dropped) or the heap is compacted.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backends/state/state.h"

/* A timer's key and namespace, in the bytes of its entry where they fit
 * (no allocation for the common short keys), else in memory of their own. */
#define ENTRY_INLINE 28u
typedef struct timer_entry {
    uint16_t klen;
    uint16_t nslen;
    union {
        uint8_t bytes[ENTRY_INLINE]; /* the key, then the namespace */
        uint8_t *out;
    } u;
} timer_entry;

/* A heap's node: what orders it (most comparisons end at the time or the
 * key group without reading the entry) and its entry's slot. Four nodes
 * fill a cache line: the heap is 4-ary, a node's children one line. */
typedef struct timer_node {
    uint64_t ts;
    uint32_t kg;
    uint32_t slot;
} timer_node;

typedef struct timer_heap {
    timer_node *e;
    size_t n, cap;
    timer_entry *entries; /* by slot */
    uint32_t *free_slots;
    size_t nfree, used, entries_cap;
} timer_heap;

static const uint8_t *entry_bytes(const timer_entry *x)
{
    return (size_t)x->klen + x->nslen <= ENTRY_INLINE ? x->u.bytes : x->u.out;
}

static void entry_free(timer_entry *x)
{
    if ((size_t)x->klen + x->nslen > ENTRY_INLINE) free(x->u.out);
}

struct stash_timers {
    stash_state *state;
    uint8_t *key; /* the key the newest iteration of one key's timers keeps to */
    size_t key_cap;
    struct stash_timers *next;
    timer_heap heap[2]; /* per stash_time_domain */
    size_t stale[2];    /* deleted timers still in the heap */
    uint8_t *ns;        /* an encoded namespace */
    size_t ns_cap;
};

stash_state *timers_state(const stash_timers *t)
{
    return t->state;
}

/* More deleted timers than this beyond half the heap compact it. */
#define STALE_SLACK 1024u

bool timer_record_valid(const uint8_t *ns, size_t nslen, uint32_t vlen)
{
    return vlen == 0 && nslen >= TIMER_NS_PREFIX && ns[0] <= STASH_PROCESSING_TIME;
}

static uint64_t get_be64(const uint8_t *p)
{
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x = x << 8 | p[i];
    return x;
}

static void put_be64(uint8_t *p, uint64_t x)
{
    for (int i = 7; i >= 0; i--, x >>= 8) p[i] = (uint8_t)x;
}

/* ---- the heaps ------------------------------------------------------------ */

/* Timestamp order; ties in key group, key and namespace order. */
static int node_cmp(const timer_heap *h, const timer_node *a, const timer_node *b)
{
    if (a->ts != b->ts) return a->ts < b->ts ? -1 : 1;
    if (a->kg != b->kg) return a->kg < b->kg ? -1 : 1;
    const timer_entry *x = &h->entries[a->slot], *y = &h->entries[b->slot];
    if (x->klen != y->klen) return x->klen < y->klen ? -1 : 1;
    size_t an = (size_t)x->klen + x->nslen, bn = (size_t)y->klen + y->nslen;
    int c = memcmp(entry_bytes(x), entry_bytes(y), an < bn ? an : bn);
    return c ? c : (an > bn) - (an < bn);
}

#define ARITY 4u

static void heap_push(timer_heap *h, const timer_node *x)
{
    size_t i = h->n++;
    while (i > 0 && node_cmp(h, x, &h->e[(i - 1) / ARITY]) < 0) {
        h->e[i] = h->e[(i - 1) / ARITY];
        i = (i - 1) / ARITY;
    }
    h->e[i] = *x;
}

/* Moves node x down from position i to where it belongs. */
static void sift_down(timer_heap *h, size_t i, timer_node x)
{
    for (;;) {
        size_t first = ARITY * i + 1, m = first;
        if (first >= h->n) break;
        size_t end = first + ARITY < h->n ? first + ARITY : h->n;
        for (size_t c = first + 1; c < end; c++)
            if (node_cmp(h, &h->e[c], &h->e[m]) < 0) m = c;
        if (node_cmp(h, &h->e[m], &x) >= 0) break;
        h->e[i] = h->e[m];
        i = m;
    }
    h->e[i] = x;
}

/* Takes the least node off the heap into *top. */
static void heap_pop(timer_heap *h, timer_node *top)
{
    *top = h->e[0];
    timer_node last = h->e[--h->n];
    if (h->n) sift_down(h, 0, last);
}

static void heap_clear(timer_heap *h)
{
    for (size_t i = 0; i < h->n; i++) entry_free(&h->entries[h->e[i].slot]);
    h->n = h->nfree = h->used = 0;
}

static void heap_free(timer_heap *h)
{
    heap_clear(h);
    free(h->e);
    free(h->entries);
    free(h->free_slots);
}

/* Room for one more timer in h. */
static int heap_reserve(timer_heap *h)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        timer_node *grown = realloc(h->e, cap * sizeof *grown);
        if (!grown) return -ENOMEM;
        h->e = grown;
        h->cap = cap;
    }
    if (h->nfree == 0 && h->used == h->entries_cap) {
        size_t cap = h->entries_cap ? h->entries_cap * 2 : 64;
        if (cap > UINT32_MAX) return -ENOMEM;
        timer_entry *grown = realloc(h->entries, cap * sizeof *grown);
        if (!grown) return -ENOMEM;
        h->entries = grown;
        uint32_t *slots = realloc(h->free_slots, cap * sizeof *slots);
        if (!slots) return -ENOMEM;
        h->free_slots = slots;
        h->entries_cap = cap;
    }
    return 0;
}

/* Adds a timer of key group kg to its domain's heap. */
static int push_timer(stash_timers *t, stash_time_domain d, uint64_t ts, uint32_t kg,
                      const void *key, size_t klen, const void *ns, size_t nslen)
{
    timer_heap *h = &t->heap[d];
    if (heap_reserve(h) < 0) return shm_fail(-ENOMEM, "out of memory");
    timer_entry x = {(uint16_t)klen, (uint16_t)nslen, {{0}}};
    uint8_t *to = x.u.bytes;
    if (klen + nslen > ENTRY_INLINE && !(to = x.u.out = malloc(klen + nslen)))
        return shm_fail(-ENOMEM, "out of memory");
    if (klen) memcpy(to, key, klen);
    if (nslen) memcpy(to + klen, ns, nslen);
    uint32_t slot = h->nfree ? h->free_slots[--h->nfree] : (uint32_t)h->used++;
    h->entries[slot] = x;
    heap_push(h, &(timer_node){ts, kg, slot});
    return 0;
}

/* Builds both heaps from the timer records of the worker's key groups. */
static int build(stash_timers *t)
{
    stash_state *s = t->state;
    store *st = s->w->store;
    heap_clear(&t->heap[0]);
    heap_clear(&t->heap[1]);
    t->stale[0] = t->stale[1] = 0;
    uint8_t *after = NULL;
    size_t after_cap = 0;
    int rc = 0;
    for (uint32_t kg = s->w->range.first; rc == 0 && kg <= s->w->range.last; kg++) {
        store_walk walk = {0};
        store_entry e;
        /* Every timer is known from the start: its key group must be here. */
        rc = state_kg_ready(s->w, kg);
        while (rc == 0 && (rc = st->ops->next(st, kg, s->id, &walk, &e)) == 1) {
            rc = 0;
            if (e.resume.len) {
                if (shm_reserve(&after, &after_cap, e.resume.len) < 0) {
                    rc = shm_fail(-ENOMEM, "out of memory");
                    break;
                }
                memcpy(after, e.resume.data, e.resume.len);
                walk.after = after;
                walk.after_len = e.resume.len;
            }
            const uint8_t *ns = e.ns.data;
            if (!timer_record_valid(ns, e.ns.len, (uint32_t)e.value.len))
                continue; /* a restore checked every record: none is here */
            rc = push_timer(t, (stash_time_domain)ns[0], get_be64(ns + 1), kg, e.key.data,
                            e.key.len, ns + TIMER_NS_PREFIX, e.ns.len - TIMER_NS_PREFIX);
        }
    }
    free(after);
    return rc < 0 ? rc : 0;
}

/* ---- the service ---------------------------------------------------------- */

STASH_API int stash_timers_get(stash_worker *worker, const char *name, stash_timers **out)
{
    shm_clear_error();
    if (!worker || !name || !out) return shm_refuse_null(__func__, "worker, name or out");
    if (worker->forked) return worker_refuse_forked(worker, __func__);
    stash_state *s;
    int rc = state_get_timers(worker, name, &s);
    if (rc) return rc;
    for (stash_timers *t = worker->timers; t; t = t->next)
        if (t->state == s) {
            *out = t;
            return 0;
        }
    stash_timers *t = calloc(1, sizeof *t);
    if (!t) return shm_fail(-ENOMEM, "out of memory");
    t->state = s;
    if ((rc = build(t)) < 0) {
        heap_free(&t->heap[0]);
        heap_free(&t->heap[1]);
        free(t);
        return rc;
    }
    t->next = worker->timers;
    worker->timers = t;
    *out = t;
    return 0;
}

int timers_rebuild_all(stash_worker *w)
{
    int rc = 0;
    for (stash_timers *t = w->timers; t && rc == 0; t = t->next) rc = build(t);
    return rc;
}

void timers_free_all(stash_worker *w)
{
    while (w->timers) {
        stash_timers *t = w->timers;
        w->timers = t->next;
        for (int d = 0; d < 2; d++) {
            heap_free(&t->heap[d]);
        }
        free(t->ns);
        free(t->key);
        free(t);
    }
}

/* The lookup of the current key's timer (d, ns, ts), its namespace encoded
 * into t->ns. */
static int timer_lookup(stash_timers *t, stash_time_domain d, const void *ns, size_t nslen,
                        uint64_t ts, shm_lookup *l)
{
    if (nslen > UINT16_MAX - TIMER_NS_PREFIX)
        return shm_fail(-EINVAL, "a timer namespace of %zu bytes", nslen);
    if (shm_reserve(&t->ns, &t->ns_cap, TIMER_NS_PREFIX + nslen) < 0)
        return shm_fail(-ENOMEM, "out of memory");
    t->ns[0] = (uint8_t)d;
    put_be64(t->ns + 1, ts);
    if (nslen) memcpy(t->ns + TIMER_NS_PREFIX, ns, nslen);
    return state_lookup_ns(t->state, t->ns, (uint16_t)(TIMER_NS_PREFIX + nslen), l);
}

/* Finds the current key's timer (d, ns, ts) for a change by the key
 * group's owner: l and c as state_find_write() leaves them. */
static int find_timer(stash_timers *t, stash_time_domain d, const void *ns, size_t nslen,
                      uint64_t ts, const char *fn, shm_lookup *l, shm_cursor *c)
{
    if (!t) return shm_refuse_null(fn, "timers");
    if (shm_null_bytes(ns, nslen)) return shm_refuse_null(fn, "ns");
    if (d != STASH_EVENT_TIME && d != STASH_PROCESSING_TIME)
        return shm_fail(-EINVAL, "%s: unknown time domain %d", fn, (int)d);
    stash_state *s = t->state;
    if (s->w->forked) return worker_refuse_forked(s->w, fn);
    int rc = timer_lookup(t, d, ns, nslen, ts, l);
    if (rc) return rc;
    if (!state_owns(s, l->kg)) return state_refuse_write(s, l->kg);
    return state_find_write(s, l, c);
}

/* Whether node x of domain d is still registered: its key made the
 * worker's current key, its record looked up. Returns 1, 0 or an error. */
static int registered(stash_timers *t, stash_time_domain d, const timer_node *x)
{
    const timer_entry *e = &t->heap[d].entries[x->slot];
    const uint8_t *bytes = entry_bytes(e);
    int rc = stash_key_set(t->state->w, bytes, e->klen);
    shm_lookup l;
    shm_cursor c;
    if (!rc) rc = timer_lookup(t, d, bytes + e->klen, e->nslen, x->ts, &l);
    if (!rc) rc = state_find(t->state, &l, &c);
    return rc < 0 ? rc : shm_rec_live(c.rec);
}

/* Drops the deleted timers from domain d's heap (each found without a
 * record: work in proportion to the timers, whatever other state the
 * worker holds) and orders the rest again. The current key is kept. */
static int compact(stash_timers *t, stash_time_domain d)
{
    stash_worker *w = t->state->w;
    timer_heap *h = &t->heap[d];
    bool had_key = w->has_key;
    size_t klen = w->klen;
    uint8_t *key = malloc(klen ? klen : 1);
    if (!key) return shm_fail(-ENOMEM, "out of memory");
    if (had_key) memcpy(key, w->key, klen);
    size_t kept = 0;
    int rc = 0;
    for (size_t i = 0; i < h->n; i++) {
        int live = rc < 0 ? 1 : registered(t, d, &h->e[i]);
        if (live < 0) rc = live;
        if (live) {
            h->e[kept++] = h->e[i];
        } else {
            entry_free(&h->entries[h->e[i].slot]);
            h->free_slots[h->nfree++] = h->e[i].slot;
        }
    }
    h->n = kept;
    for (size_t i = kept > 1 ? (kept - 2) / ARITY + 1 : 0; i-- > 0;) sift_down(h, i, h->e[i]);
    if (rc == 0) t->stale[d] = 0;
    if (had_key) {
        int krc = stash_key_set(w, key, klen);
        if (rc == 0) rc = krc;
    } else {
        worker_drop_key(w);
    }
    free(key);
    return rc;
}

STASH_API int stash_timer_register(stash_timers *timers, stash_time_domain domain, const void *ns,
                                   size_t nslen, uint64_t timestamp)
{
    shm_lookup l;
    shm_cursor c;
    int rc = find_timer(timers, domain, ns, nslen, timestamp, __func__, &l, &c);
    if (rc < 0) return rc;
    if (shm_rec_live(c.rec)) return 0; /* registered already */
    if ((rc = state_write(timers->state, &l, &c, "", 0)) < 0) return rc;
    return push_timer(timers, domain, timestamp, l.kg, l.key, l.klen, ns, nslen);
}

STASH_API int stash_timer_delete(stash_timers *timers, stash_time_domain domain, const void *ns,
                                 size_t nslen, uint64_t timestamp)
{
    shm_lookup l;
    shm_cursor c;
    int rc = find_timer(timers, domain, ns, nslen, timestamp, __func__, &l, &c);
    if (rc < 0) return rc;
    if (!shm_rec_live(c.rec)) return 0;
    if ((rc = state_delete(timers->state, &l, &c)) < 0) return rc;
    timer_heap *h = &timers->heap[domain];
    if (++timers->stale[domain] > h->n / 2 + STALE_SLACK) return compact(timers, domain);
    return 0;
}

/* Takes timer (ts, x) of domain d off the store if it is still
 * registered: sets its key as the worker's current key and deletes its
 * record. Returns 1 if it was, 0 if it had been deleted, or an error. */
static int take(stash_timers *t, stash_time_domain d, uint64_t ts, const timer_entry *x)
{
    stash_worker *w = t->state->w;
    const uint8_t *bytes = entry_bytes(x);
    int rc = stash_key_set(w, bytes, x->klen);
    shm_lookup l;
    shm_cursor c;
    if (!rc) rc = timer_lookup(t, d, bytes + x->klen, x->nslen, ts, &l);
    if (!rc) rc = state_find_write(t->state, &l, &c);
    if (rc < 0) return rc;
    if (!shm_rec_live(c.rec)) {
        if (t->stale[d]) t->stale[d]--;
        return 0;
    }
    rc = state_delete(t->state, &l, &c);
    return rc < 0 ? rc : 1;
}

/* Fires every timer of domain d at or before limit, in order. */
static int64_t fire(stash_timers *t, stash_time_domain d, uint64_t limit, stash_timer_fn *fn,
                    void *ctx)
{
    timer_heap *h = &t->heap[d];
    int64_t fired = 0;
    while (h->n > 0 && h->e[0].ts <= limit) {
        timer_node top;
        heap_pop(h, &top);
        /* The handler may register timers, moving the entries: a copy. */
        timer_entry x = h->entries[top.slot];
        h->free_slots[h->nfree++] = top.slot;
        int rc = take(t, d, top.ts, &x);
        if (rc == 1) {
            const uint8_t *bytes = entry_bytes(&x);
            stash_timer timer = {d, top.ts, {bytes, x.klen}, {bytes + x.klen, x.nslen}};
            fired++;
            rc = fn(&timer, ctx);
        }
        entry_free(&x);
        if (rc < 0) return rc;
    }
    return fired;
}

STASH_API int64_t stash_timers_advance(stash_timers *timers, uint64_t watermark, stash_timer_fn *fn,
                                       void *ctx)
{
    shm_clear_error();
    if (!timers || !fn) return shm_refuse_null(__func__, "timers or fn");
    if (timers->state->w->forked) return worker_refuse_forked(timers->state->w, __func__);
    stash_state *s = timers->state;
    if (watermark > s->watermark) s->watermark = watermark;
    if (watermark > s->w->watermark) s->w->watermark = watermark;
    return fire(timers, STASH_EVENT_TIME, s->watermark, fn, ctx);
}

STASH_API int64_t stash_timers_poll(stash_timers *timers, stash_timer_fn *fn, void *ctx)
{
    shm_clear_error();
    if (!timers || !fn) return shm_refuse_null(__func__, "timers or fn");
    if (timers->state->w->forked) return worker_refuse_forked(timers->state->w, __func__);
    return fire(timers, STASH_PROCESSING_TIME, worker_clock_ms(timers->state->w), fn, ctx);
}

STASH_API uint64_t stash_timers_watermark(const stash_timers *timers)
{
    return timers ? timers->state->watermark : 0;
}

/* ---- iteration -------------------------------------------------------------- */

STASH_API int stash_timers_iter(stash_timers *timers, int32_t kg, stash_iter *it)
{
    shm_clear_error();
    if (!timers || !it) return shm_refuse_null(__func__, "timers or it");
    stash_state *s = timers->state;
    stash_worker *w = s->w;
    if (w->forked) return worker_refuse_forked(w, __func__);
    iter_impl *x = (iter_impl *)it;
    memset(x, 0, sizeof *x);
    if (kg < 0) {
        if (!w->has_key) return shm_fail(STASH_ENOKEY, "%s: no current key", __func__);
        if (shm_reserve(&timers->key, &timers->key_cap, w->klen ? w->klen : 1) < 0)
            return shm_fail(-ENOMEM, "out of memory");
        memcpy(timers->key, w->key, w->klen);
        x->filter_ns = 1; /* a key's timers: ns and nslen hold the key */
        x->ns = timers->key;
        x->nslen = w->klen;
        kg = (int32_t)w->kg;
    }
    if (!state_owns(s, (uint32_t)kg))
        return shm_fail(STASH_EKEYGROUP, "%s: key group %d is not worker %u's (%u .. %u)", __func__,
                        kg, w->slot, w->range.first, w->range.last);
    int rc = state_kg_ready(w, (uint32_t)kg);
    if (rc) return rc;
    x->type = ITER_TIMERS;
    x->state = s;
    x->kg = (uint32_t)kg;
    x->seed = ++s->keys_iters;
    return 0;
}

STASH_API int stash_timers_next(stash_iter *it, stash_timer *out)
{
    if (!it || !out) return shm_refuse_null(__func__, "it or out");
    iter_impl *x = (iter_impl *)it;
    if (x->type != ITER_TIMERS || !x->state) return shm_fail(-EINVAL, "not a timers iteration");
    stash_state *s = x->state;
    store *st = s->w->store;
    if (x->seed != s->keys_iters)
        return shm_fail(STASH_ESTALE, "a newer iteration of this timer service started");
    for (;;) {
        store_walk walk = {x->pos, x->layout, x->entered, x->blob, x->blob_len};
        store_entry e;
        int rc = st->ops->next(st, x->kg, s->id, &walk, &e);
        x->pos = walk.pos;
        x->layout = walk.layout;
        x->entered = walk.entered;
        if (rc <= 0) return rc;
        if (e.resume.len) {
            if (shm_reserve(&s->keys_after, &s->keys_after_cap, e.resume.len) < 0)
                return shm_fail(-ENOMEM, "out of memory");
            memcpy(s->keys_after, e.resume.data, e.resume.len);
            x->blob = s->keys_after;
            x->blob_len = (uint32_t)e.resume.len;
        }
        const uint8_t *ns = e.ns.data;
        if (!timer_record_valid(ns, e.ns.len, (uint32_t)e.value.len)) continue;
        if (x->filter_ns && (e.key.len != x->nslen || memcmp(e.key.data, x->ns, x->nslen) != 0))
            continue;
        *out = (stash_timer){(stash_time_domain)ns[0],
                             get_be64(ns + 1),
                             e.key,
                             {ns + TIMER_NS_PREFIX, e.ns.len - TIMER_NS_PREFIX}};
        return 1;
    }
}
