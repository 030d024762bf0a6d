/* SPDX-License-Identifier: MIT */
/*
 * iter.c: iteration (list elements, map entries, a state's keys) behind the
 * one public iterator, and the namespace merge that dispatches on the kind.
 * An iterator started by a worker is invalidated by that worker's next write
 * (except a map iterator's own removals): it then answers STASH_ESTALE rather
 * than read memory that moved.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backends/state/state.h"

STASH_API int stash_keys_iter(stash_state *state, const void *ns, size_t nslen, stash_iter *it)
{
    if (!state || !it) return shm_refuse_null(__func__, "state or it");
    if (shm_null_bytes(ns, nslen)) return shm_refuse_null(__func__, "ns");
    if (opstate_kind(state->kind))
        return shm_fail(STASH_EKIND, "operator state has no keys: use stash_op_list_get or "
                                     "stash_broadcast_entries");
    iter_impl *x = (iter_impl *)it;
    memset(x, 0, sizeof *x);
    x->type = ITER_KEYS;
    x->state = state;
    x->filter_ns = ns != NULL;
    x->ns = ns;
    x->nslen = (uint16_t)nslen;
    x->kg = state->w->range.first;
    x->kg_last = state->w->range.last;
    x->last = UINT32_MAX; /* no key group entered yet */
    x->writes = state->w->writes;
    x->seed = ++state->keys_iters;
    if (state_has_ttl(state) && state->ttl.visibility == STASH_TTL_NEVER_RETURN_EXPIRED)
        x->now = state_now(state);
    return 0;
}

/* Whether the walk's entry e passes the iterator's namespace filter and,
 * for states that never return what expired, has not expired whole. */
static bool key_matches(const iter_impl *it, const store_entry *e)
{
    const stash_state *s = it->state;
    if (it->filter_ns && (e->ns.len != it->nslen || memcmp(e->ns.data, it->ns, it->nslen)))
        return false;
    if (it->now && s->kind != STASH_LIST && s->kind != STASH_MAP && e->value.len >= TTL_BYTES &&
        state_expired(s, state_ts_get(e->value.data), it->now))
        return false;
    return true;
}

/* Appends a scanned entry that passes the filters to the state's copy:
 * its key's and namespace's lengths (2 bytes each), then their bytes. */
static int scan_keep(void *ctx, const store_record *r)
{
    iter_impl *x = ctx;
    stash_state *s = x->state;
    store_entry e = {
        .key = {r->key, r->klen}, .ns = {r->ns, r->nslen}, .value = {r->value, r->vlen}};
    if (!key_matches(x, &e)) return 0;
    size_t need = x->blob_len + 4u + r->klen + r->nslen;
    if (need > UINT32_MAX) return shm_fail(-E2BIG, "key group %u: over 4 GiB of keys", x->kg);
    if (shm_reserve(&s->scan, &s->scan_cap, need) < 0) return shm_fail(-ENOMEM, "out of memory");
    uint8_t *p = s->scan + x->blob_len;
    uint16_t lens[2] = {r->klen, r->nslen};
    memcpy(p, lens, 4);
    memcpy(p + 4, r->key, r->klen);
    memcpy(p + 4 + r->klen, r->ns, r->nslen);
    x->blob_len = (uint32_t)need;
    return 0;
}

STASH_API int stash_kg_keys_iter(stash_state *state, uint32_t kg, const void *ns, size_t nslen,
                                 stash_iter *it)
{
    int rc = stash_keys_iter(state, ns, nslen, it);
    if (rc) return rc;
    iter_impl *x = (iter_impl *)it;
    stash_worker *w = state->w;
    uint32_t maxp = w->arena->hdr->max_parallelism;
    if (kg >= maxp) {
        x->type = 0;
        return shm_fail(-EINVAL, "key group %u of %u", kg, maxp);
    }
    x->kg = kg;
    if (stash_kg_range_contains(w->range, kg)) {
        x->kg_last = kg;
        return 0;
    }
    x->type = 0;
    if (!w->reader)
        return shm_fail(STASH_EKEYGROUP,
                        "worker %u does not own key group %u: a reader (stash_reader_open) "
                        "walks any key group",
                        w->slot, kg);
    rc = state_kg_ready(w, kg);
    if (rc == 0) rc = w->store->ops->scan(w->store, kg, state->id, scan_keep, x);
    if (rc) return rc;
    x->type = ITER_SCAN;
    x->blob = state->scan;
    x->pos = 0;
    return 0;
}

/* The next entry of a key group's copy. */
static int scan_next(iter_impl *it, stash_bytes *key, stash_bytes *ns)
{
    if (it->seed != it->state->keys_iters)
        return shm_fail(STASH_ESTALE, "a newer keys iteration of this state handle started");
    if (it->pos >= it->blob_len) return 0;
    const uint8_t *p = it->blob + it->pos;
    uint16_t lens[2];
    memcpy(lens, p, 4);
    if (key) *key = (stash_bytes){p + 4, lens[0]};
    if (ns) *ns = (stash_bytes){p + 4 + lens[0], lens[1]};
    it->pos += 4u + lens[0] + lens[1];
    return 1;
}

/* A walk over the worker's key groups in turn, through its store. Stores
 * that go on after the entry returned last keep its bytes in the state,
 * which the newest keys iteration of the state owns. */
static int keys_next(iter_impl *it, stash_bytes *key, stash_bytes *ns)
{
    stash_state *s = it->state;
    store *st = s->w->store;
    for (; it->kg <= it->kg_last; it->kg++) {
        if (it->last != it->kg) {
            int rc = state_kg_ready(s->w, it->kg);
            if (rc) return rc;
            it->last = it->kg;
            it->pos = 0;
            it->layout = 0;
            it->entered = false;
            it->blob = NULL;
            it->blob_len = 0;
        }
        for (;;) {
            if (it->blob && it->seed != s->keys_iters)
                return shm_fail(STASH_ESTALE,
                                "a newer keys iteration of this state handle started");
            store_walk walk = {.pos = it->pos,
                               .layout = it->layout,
                               .entered = it->entered,
                               .after = it->blob,
                               .after_len = it->blob_len};
            store_entry e;
            int rc = st->ops->next(st, it->kg, s->id, &walk, &e);
            it->pos = walk.pos;
            it->layout = walk.layout;
            it->entered = walk.entered;
            if (rc <= 0) {
                if (rc < 0) return rc;
                break;
            }
            if (e.resume.len) {
                if (shm_reserve(&s->keys_after, &s->keys_after_cap, e.resume.len) < 0)
                    return shm_fail(-ENOMEM, "out of memory");
                memcpy(s->keys_after, e.resume.data, e.resume.len);
                it->blob = s->keys_after;
                it->blob_len = (uint32_t)e.resume.len;
            }
            if (!key_matches(it, &e)) continue;
            if (key) *key = e.key;
            if (ns) *ns = e.ns;
            return 1;
        }
    }
    return 0;
}

/* An iterator a start call set up: a zeroed or foreign one holds no state. */
static int check_started(const iter_impl *x)
{
    if (x->type < ITER_LIST || x->type > ITER_SCAN || x->type == ITER_TIMERS || !x->state)
        return shm_fail(-EINVAL, "not a started iterator");
    return 0;
}

STASH_API int stash_iter_next(stash_iter *it, stash_bytes *key, stash_bytes *value)
{
    if (!it) return shm_refuse_null(__func__, "it");
    iter_impl *x = (iter_impl *)it;
    int rc = check_started(x);
    if (rc) return rc;
    switch (x->type) {
    case ITER_LIST:
        if (x->writes != x->state->w->writes)
            return shm_fail(STASH_ESTALE, "the worker wrote since the iterator started");
        if (key) *key = (stash_bytes){NULL, 0};
        return list_iter_next(x, value);
    case ITER_MAP:
        if ((rc = map_iter_sync(x)) != 0) return rc;
        return map_iter_next(x, key, value);
    case ITER_KEYS:
        return keys_next(x, key, value);
    case ITER_SCAN:
        return scan_next(x, key, value);
    default:
        return shm_fail(-EINVAL, "not a started iterator");
    }
}

STASH_API int stash_iter_remove(stash_iter *it)
{
    if (!it) return shm_refuse_null(__func__, "it");
    iter_impl *x = (iter_impl *)it;
    int rc = check_started(x);
    if (rc) return rc;
    if (x->type != ITER_MAP) return shm_fail(-EINVAL, "only map iterators remove entries");
    if ((rc = map_iter_sync(x)) != 0) return rc;
    if (!x->blob) return shm_fail(-EINVAL, "no entry returned to remove");
    return map_iter_remove(x);
}

/* Moves each source namespace's entry of the current key into the target
 * through merge, deleting the source. */
static int merge_sources(stash_state *s, const void *target, size_t tlen,
                         const stash_bytes *sources, size_t n, merge_into_fn *merge)
{
    shm_lookup tl;
    int rc = state_lookup_ns(s, target, (uint16_t)tlen, &tl);
    uint8_t *copy = NULL;
    size_t cap = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        shm_lookup sl;
        shm_cursor c;
        stash_bytes raw;
        if (sources[i].len == tlen && (tlen == 0 || memcmp(sources[i].data, target, tlen) == 0))
            continue;
        rc = state_lookup_ns(s, sources[i].data, (uint16_t)sources[i].len, &sl);
        if (!rc) rc = state_read(s, &sl, &c, &raw);
        if (rc == STASH_ENOTFOUND) {
            rc = 0;
            continue;
        }
        /* The source's record goes with the delete: merge from a copy. */
        if (rc || (rc = shm_reserve(&copy, &cap, raw.len ? raw.len : 1)) < 0) break;
        memcpy(copy, raw.data, raw.len);
        raw.data = copy;
        if ((rc = state_delete(s, &sl, &c)) == 0) rc = merge(s, &tl, &raw);
    }
    free(copy);
    return rc;
}

STASH_API int stash_merge_namespaces(stash_state *state, const void *target, size_t tlen,
                                     const stash_bytes *sources, size_t n)
{
    if (!state) return shm_refuse_null(__func__, "state");
    if (shm_null_bytes(target, tlen)) return shm_refuse_null(__func__, "target");
    int err = state_check_array(sources, n, __func__, "sources");
    if (err) return err;
    if (!state->w->has_key) return shm_fail(STASH_ENOKEY, "state access without a current key");
    if (!state_owns(state, state->w->kg)) return state_refuse_write(state, state->w->kg);
    if (tlen > UINT16_MAX) return shm_fail(-EINVAL, "a namespace of %zu bytes", tlen);
    for (size_t i = 0; i < n; i++)
        if (sources[i].len > UINT16_MAX)
            return shm_fail(-EINVAL, "a namespace of %zu bytes", sources[i].len);
    switch (state->kind) {
    case STASH_LIST:
        return merge_sources(state, target, tlen, sources, n, list_merge_into);
    case STASH_REDUCING:
    case STASH_AGGREGATING:
        return merge_sources(state, target, tlen, sources, n, merging_merge_into);
    default:
        return shm_fail(STASH_EKIND, "only list, reducing and aggregating states merge");
    }
}
