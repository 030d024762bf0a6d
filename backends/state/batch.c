/* SPDX-License-Identifier: MIT */
/*
 * batch.c: batches of events, run in order with their state fetched ahead.
 * One access at a time, a lookup waits for its index group and then for its
 * record; the processor overlaps little of one access with the next. A
 * batch knows its keys before the first handler runs, so the store fetches
 * what the accesses of a stretch of events will touch at once (store.h's
 * fetch_ahead), and the handlers, called in order with each event's key
 * current, find it near.
 * Nothing else differs from setting each key and calling the handler.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backends/state/state.h"

#define BATCH_DEFAULT 32u
#define BATCH_MAX 4096u
#define BATCH_STATES 8u
#define FETCH_STRETCH 32u /* events whose accesses are fetched at once */

typedef struct batch_event {
    size_t off; /* of its key in the batch's key bytes */
    uint16_t len;
    uint32_t kg;
    uint64_t hash;
    void *event;
} batch_event;

struct stash_batch {
    stash_worker *w;
    uint32_t cap, n;
    stash_state *states[BATCH_STATES];
    uint32_t nstates; /* 0: the worker's keyed states */
    /* The states the events' accesses are fetched for, chosen as the batch
     * runs, and the lookups of a stretch's accesses. */
    stash_state *fetch[BATCH_STATES];
    uint32_t nfetch;
    shm_lookup lookups[FETCH_STRETCH * BATCH_STATES];
    batch_event *ev;
    uint8_t *keys;
    size_t keys_len, keys_cap;
};

static bool keyed_kind(stash_kind k)
{
    return k == STASH_VALUE || k == STASH_LIST || k == STASH_MAP || k == STASH_REDUCING ||
           k == STASH_AGGREGATING;
}

/* The states whose entries the batch fetches ahead: the ones it was given,
 * or the worker's keyed states now; none if the store fetches nothing. */
static uint32_t fetched_states(const stash_batch *b, stash_state **out)
{
    if (!b->w->store->ops->fetch_ahead) return 0;
    if (b->nstates) {
        memcpy(out, b->states, b->nstates * sizeof *out);
        return b->nstates;
    }
    uint32_t n = 0;
    for (stash_state *s = b->w->states; s && n < BATCH_STATES; s = s->next)
        if (keyed_kind(s->kind)) out[n++] = s;
    return n;
}

static bool owned(const stash_batch *b, const batch_event *e)
{
    return e->kg >= b->w->range.first && e->kg <= b->w->range.last;
}

/* The lookup of state s's entry, in its namespace now, for a key (len
 * bytes) of hash and key group kg. */
static shm_lookup lookup_of(const stash_state *s, const void *key, uint16_t len, uint64_t hash,
                            uint32_t kg)
{
    return (shm_lookup){.kg = kg,
                        .hash = shm_lookup_hash(hash, s->seed),
                        .state = s->id,
                        .klen = len,
                        .nslen = s->nslen,
                        .key = key,
                        .ns = s->nslen ? s->ns : (const uint8_t *)""};
}

/* Fetches the accesses of the owned events first .. end-1 ahead, both
 * steps (the heap: their index groups, then the records these name). */
static void fetch_ahead(stash_batch *b, uint32_t first, uint32_t end)
{
    size_t n = 0;
    for (uint32_t i = first; i < end; i++) {
        const batch_event *e = &b->ev[i];
        if (!owned(b, e)) continue;
        for (uint32_t j = 0; j < b->nfetch; j++)
            b->lookups[n++] = lookup_of(b->fetch[j], b->keys + e->off, e->len, e->hash, e->kg);
    }
    store *st = b->w->store;
    st->ops->fetch_ahead(st, b->lookups, n, STORE_FETCH_FIRST);
    st->ops->fetch_ahead(st, b->lookups, n, STORE_FETCH_SECOND);
}

STASH_API int stash_batch_create(stash_worker *worker, const stash_batch_opts *opts,
                                 stash_batch **out)
{
    if (!worker || !out) return shm_refuse_null(__func__, "worker or out");
    if (worker->forked) return worker_refuse_forked(worker, __func__);
    stash_batch_opts o;
    int rc = SHM_TAKE_OPTS(__func__, stash_batch_opts, opts, &o);
    if (rc) return rc;
    if (o.capacity == 0) o.capacity = BATCH_DEFAULT;
    if (o.capacity > BATCH_MAX)
        return shm_fail(-EINVAL, "%s: a capacity of %u events (at most %u)", __func__, o.capacity,
                        BATCH_MAX);
    if (o.nstates > BATCH_STATES)
        return shm_fail(-EINVAL, "%s: %u states to fetch ahead (at most %u)", __func__, o.nstates,
                        BATCH_STATES);
    if (o.nstates && !o.states) return shm_refuse_null(__func__, "opts->states");
    for (uint32_t i = 0; i < o.nstates; i++) {
        const stash_state *s = o.states[i];
        if (!s) return shm_fail(-EINVAL, "%s: opts->states[%u] is NULL", __func__, i);
        if (s->w != worker)
            return shm_fail(-EINVAL, "%s: opts->states[%u] belongs to another worker", __func__, i);
        if (!keyed_kind(s->kind))
            return shm_fail(STASH_EKIND, "%s: opts->states[%u] is not keyed state", __func__, i);
    }
    stash_batch *b = calloc(1, sizeof *b);
    if (!b) return shm_fail(-ENOMEM, "out of memory");
    b->w = worker;
    b->cap = o.capacity;
    b->nstates = o.nstates;
    for (uint32_t i = 0; i < o.nstates; i++) b->states[i] = o.states[i];
    b->ev = calloc(b->cap, sizeof *b->ev);
    if (!b->ev) {
        stash_batch_destroy(b);
        return shm_fail(-ENOMEM, "out of memory");
    }
    *out = b;
    return 0;
}

STASH_API void stash_batch_destroy(stash_batch *batch)
{
    if (!batch) return;
    free(batch->ev);
    free(batch->keys);
    free(batch);
}

STASH_API int stash_batch_add(stash_batch *batch, const void *key, size_t len, void *event)
{
    if (!batch) return shm_refuse_null(__func__, "batch");
    if (shm_null_bytes(key, len)) return shm_refuse_null(__func__, "key");
    if (len > UINT16_MAX)
        return shm_fail(-EINVAL, "%s: a key of %zu bytes (at most 65535)", __func__, len);
    if (batch->n == batch->cap)
        return shm_fail(-ENOSPC, "%s: the batch holds %u events already", __func__, batch->cap);
    if (shm_reserve(&batch->keys, &batch->keys_cap, batch->keys_len + len + 1) < 0)
        return shm_fail(-ENOMEM, "out of memory");
    if (len) memcpy(batch->keys + batch->keys_len, key, len);
    uint64_t hash = shm_key_hash(key, len);
    batch_event *e = &batch->ev[batch->n];
    *e = (batch_event){.off = batch->keys_len,
                       .len = (uint16_t)len,
                       .kg = shm_key_group_of(hash, batch->w->max_parallelism),
                       .hash = hash,
                       .event = event};
    batch->keys_len += len;
    batch->n++;
    return 0;
}

STASH_API uint32_t stash_batch_size(const stash_batch *batch)
{
    return batch ? batch->n : 0;
}

/* Runs event i: its key current, then the handler. */
static int run_event(stash_batch *b, uint32_t i, stash_batch_fn *fn, void *ctx)
{
    stash_worker *w = b->w;
    const batch_event *e = &b->ev[i];
    if (!owned(b, e)) {
        worker_drop_key(w);
        return shm_fail(STASH_EKEYGROUP, "batch event %u: worker %u owns key groups %u..%u, not %u",
                        i, w->slot, w->range.first, w->range.last, e->kg);
    }
    int rc = worker_key_set_hashed(w, b->keys + e->off, e->len, e->hash);
    return rc ? rc : fn(w, e->event, ctx);
}

STASH_API int stash_batch_run(stash_batch *batch, stash_batch_fn *fn, void *ctx, int *results)
{
    if (!batch || !fn) return shm_refuse_null(__func__, "batch or fn");
    stash_worker *w = batch->w;
    if (w->forked) return worker_refuse_forked(w, __func__);
    if (w->in_batch)
        return shm_fail(-EINVAL, "%s: worker %u is running a batch already", __func__, w->slot);
    /* A stretch of events at a time: its accesses fetched ahead, then its
     * handlers run. Fetched all at once, a large batch's first groups leave
     * the caches before their records' turn; a stretch fetched while the
     * one before runs gained nothing (docs/benchmarks.md). */
    batch->nfetch = fetched_states(batch, batch->fetch);
    w->in_batch = true;
    int failed = 0;
    for (uint32_t i = 0; i < batch->n; i++) {
        if (batch->nfetch && i % FETCH_STRETCH == 0)
            fetch_ahead(batch, i, i + FETCH_STRETCH < batch->n ? i + FETCH_STRETCH : batch->n);
        int rc = run_event(batch, i, fn, ctx);
        if (results) results[i] = rc < 0 ? rc : 0;
        failed += rc < 0;
    }
    w->in_batch = false;
    batch->n = 0;
    batch->keys_len = 0;
    return failed;
}

STASH_API int stash_prefetch(stash_state *state, const void *key, size_t len)
{
    if (!state) return shm_refuse_null(__func__, "state");
    if (shm_null_bytes(key, len)) return shm_refuse_null(__func__, "key");
    if (!keyed_kind(state->kind)) return shm_fail(STASH_EKIND, "%s: not keyed state", __func__);
    if (len > UINT16_MAX) return 0;
    stash_worker *w = state->w;
    store *st = w->store;
    if (!st->ops->fetch_ahead) return 0;
    uint64_t hash = shm_key_hash(key, len);
    /* The first step alone: the second would wait here for the first. */
    shm_lookup l =
        lookup_of(state, key, (uint16_t)len, hash, shm_key_group_of(hash, w->max_parallelism));
    st->ops->fetch_ahead(st, &l, 1, STORE_FETCH_FIRST);
    return 0;
}
