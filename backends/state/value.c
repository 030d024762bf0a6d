/* SPDX-License-Identifier: MIT */
/*
 * value.c: the single-value state kinds: ValueState, and ReducingState and
 * AggregatingState, which keep one accumulator per key and namespace. With
 * TTL the stored bytes are an 8-byte timestamp followed by the value.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backends/state/state.h"

/* Reads the current entry's value without its timestamp, applying TTL: an
 * expired value is removed by its owner and returned only if the state says
 * so; a read refreshes the timestamp when the state updates on reads. */
static int read_value(stash_state *s, const shm_lookup *l, shm_cursor *c, stash_bytes *out)
{
    stash_bytes raw;
    int rc = state_read(s, l, c, &raw);
    if (rc < 0 || !state_has_ttl(s)) {
        *out = raw;
        return rc;
    }
    if (raw.len < TTL_BYTES) return STASH_ENOTFOUND;
    uint64_t now = state_now(s);
    out->data = (const uint8_t *)raw.data + TTL_BYTES;
    out->len = raw.len - TTL_BYTES;
    bool owned = c->rec != NULL;
    if (state_expired(s, state_ts_get(raw.data), now)) {
        bool show = s->ttl.visibility == STASH_TTL_RETURN_EXPIRED_IF_NOT_CLEANED;
        if (!owned) return show ? 0 : STASH_ENOTFOUND;
        if (show) {
            /* Copy out before the record goes. */
            if (shm_reserve(&s->scratch, &s->scratch_cap, out->len ? out->len : 1) < 0)
                return -ENOMEM;
            memcpy(s->scratch, out->data, out->len);
            out->data = s->scratch;
        }
        rc = state_delete(s, l, c);
        return rc < 0 ? rc : show ? 0 : STASH_ENOTFOUND;
    }
    if (owned && s->ttl.update == STASH_TTL_ON_READ_AND_WRITE) {
        shm_rec *rec;
        int in_place = state_write_begin(s, l, c, raw.len, raw.len, TTL_BYTES, 0, &rec);
        if (in_place < 0) return in_place;
        state_ts_put(shm_rec_value(rec), now);
        if ((rc = state_write_end(s, l, c, rec, raw.len, in_place)) < 0) return rc;
        if ((rc = state_view(s, l, c, &raw)) < 0) return rc;
        out->data = (const uint8_t *)raw.data + TTL_BYTES;
    }
    return 0;
}

/* Rewrites the live heap record r of an entry whose key and namespace take
 * keys bytes, in table t, with value in place if it may: its block, of a
 * size class, has room, and no pinned reader sees it, or only walks do and
 * it is saved for them first. Returns whether it did. */
static inline __attribute__((always_inline)) bool rewrite_in_place(stash_arena *a, shm_table *t,
                                                                   shm_rec *r, size_t keys,
                                                                   const void *value, size_t len)
{
    if (r->size_class == SHM_CLASS_LARGE || shm_rec_room(a, r, keys) < len || len > SHM_UNDO_BYTES)
        return false;
    uint8_t *dst = (uint8_t *)(r + 1) + keys;
    return shm_rec_mutable(t, r) ? shm_rec_overwrite(a, t, r, dst, value, len)
                                 : shm_rec_save_overwrite(a, t, r, dst, value, len);
}

/* The common put in one step: a heap record without TTL rewritten in
 * place. Returns whether it was. */
static inline __attribute__((always_inline)) bool
put_in_place(stash_state *s, const shm_lookup *l, shm_cursor *c, const void *value, size_t len)
{
    stash_arena *a = s->w->arena;
    return !state_has_ttl(s) && s->w->records_in_arena && shm_rec_live(c->rec) &&
           rewrite_in_place(a, &a->tables[l->kg], c->rec, (size_t)l->klen + l->nslen, value, len);
}

/* write_value past put_in_place: a record built or changed for the value. */
static int write_record(stash_state *s, const shm_lookup *l, shm_cursor *c, const void *value,
                        size_t len)
{
    size_t ts = state_ts_bytes(s);
    if (len > UINT32_MAX - ts) return shm_fail(STASH_ETOOBIG, "a value of %zu bytes", len);
    shm_rec *rec;
    int in_place = state_write_begin(s, l, c, len + ts, 0, len + ts, 0, &rec);
    if (in_place < 0) return in_place;
    if (ts) state_ts_put(shm_rec_value(rec), state_now(s));
    if (len) memcpy(shm_rec_value(rec) + ts, value, len);
    int rc = state_write_end(s, l, c, rec, len + ts, in_place);
    if (rc == 0 && ts) state_ttl_cleanup(s, l->kg);
    return rc;
}

/* Stores value (with a fresh timestamp under TTL) as the current entry. */
static inline __attribute__((always_inline)) int
write_value(stash_state *s, const shm_lookup *l, shm_cursor *c, const void *value, size_t len)
{
    return put_in_place(s, l, c, value, len) ? 0 : write_record(s, l, c, value, len);
}

static int check_value(const stash_state *s)
{
    return s->kind == STASH_VALUE ? 0 : shm_fail(STASH_EKIND, "not a value state");
}

/* stash_value_get past get_fast. */
static __attribute__((noinline)) int value_get(stash_state *state, stash_bytes *out)
{
    shm_lookup l;
    shm_cursor c;
    int rc = check_value(state);
    if (!rc) rc = state_lookup(state, &l);
    if (rc) return rc;
    rc = state_has_ttl(state) ? read_value(state, &l, &c, out) : state_read(state, &l, &c, out);
    if (rc == STASH_ENOTFOUND && state->defval) {
        *out = (stash_bytes){state->defval, state->deflen};
        return 0;
    }
    return rc;
}

/* stash_value_put past put_fast. */
static __attribute__((noinline)) int value_put(stash_state *state, const void *value, size_t len)
{
    int rc = check_value(state);
    return rc ? rc : state_put_raw(state, value, len);
}

int state_put_raw(stash_state *s, const void *value, size_t len)
{
    shm_lookup l;
    shm_cursor c;
    int rc = state_lookup(s, &l);
    if (rc) return rc;
    if (!state_owns(s, l.kg)) return state_refuse_write(s, l.kg);
    rc = state_find_overwrite(s, &l, &c);
    if (rc) return rc;
    return len ? write_value(s, &l, &c, value, len) : state_delete(s, &l, &c);
}

/* The live record, in table t, of the current key in s's namespace for a
 * one-step get or put: s a one-step state, the current key a one-step key,
 * the entry in its home group (shm_table_find_short). NULL sends the access
 * the general way, which finds the same record or decides otherwise. */
static inline __attribute__((always_inline)) shm_rec *one_step_find(stash_state *s,
                                                                    const shm_table *t)
{
    stash_worker *w = s->w;
    shm_rec *r =
        shm_table_find_short(w->arena, t, worker_lookup_hash(w, s->seed), s->fetch_bytes,
                             s->name | (uint64_t)w->klen << 16, w->key, w->klen, s->ns, s->nslen);
    /* A state's values are mostly of one size: the next record most likely
     * spans as many lines as this one. */
    if (__builtin_expect(r && r->size_class != s->fetch_class, 0)) {
        s->fetch_class = r->size_class;
        uint64_t bytes = shm_rec_block_bytes(w->arena, r);
        s->fetch_bytes = bytes < SHM_FETCH_ANY ? (uint32_t)bytes : SHM_FETCH_ANY;
    }
    return r;
}

/* The common read and put, each in one step that calls nothing and saves
 * few registers: a value found by one_step_find, viewed, or rewritten in
 * place. Each returns whether it was done; if not, nothing changed. */
static inline __attribute__((always_inline)) bool get_fast(stash_state *s, stash_bytes *out)
{
    stash_worker *w = s->w;
    if (!s->one_step || !w->one_step_key) return false;
    shm_rec *r = one_step_find(s, &w->arena->tables[w->kg]);
    if (!r) return false;
    *out = (stash_bytes){(uint8_t *)(r + 1) + w->klen + s->nslen,
                         atomic_load_explicit(&r->vlen, memory_order_relaxed)};
    return true;
}

static inline __attribute__((always_inline)) bool put_fast(stash_state *s, const void *value,
                                                           size_t len)
{
    stash_worker *w = s->w;
    if (!s->one_step || !w->one_step_key || len == 0) return false;
    stash_arena *a = w->arena;
    shm_table *t = &a->tables[w->kg];
    shm_rec *r;
    if (!(r = one_step_find(s, t)) || shm_table_untended(t) ||
        !rewrite_in_place(a, t, r, (size_t)w->klen + s->nslen, value, len))
        return false;
    w->writes++;
    return true;
}

STASH_API int stash_value_get(stash_state *state, stash_bytes *out)
{
    if (__builtin_expect(!state || !out, 0)) return shm_refuse_null(__func__, "state or out");
    state_count(state->w, SHM_OPS_VALUE, false);
    return get_fast(state, out) ? 0 : value_get(state, out);
}

STASH_API int stash_value_put(stash_state *state, const void *value, size_t len)
{
    if (__builtin_expect(!state, 0)) return shm_refuse_null(__func__, "state");
    state_count(state->w, SHM_OPS_VALUE, true);
    if (shm_null_bytes(value, len)) return shm_refuse_null(__func__, "value");
    return put_fast(state, value, len) ? 0 : value_put(state, value, len);
}

/* Makes key the worker's current key for fn, as stash_key_set() does:
 * inline for the usual keys, so that a one-call access calls nothing on its
 * way. A refused key leaves none current, as there. */
static inline __attribute__((always_inline)) int key_set(stash_worker *w, const void *key,
                                                         size_t len, const char *fn)
{
    if (__builtin_expect(worker_key_short(w, key, len), 1))
        return worker_key_set_short(w, key, len);
    if (shm_null_bytes(key, len)) {
        worker_drop_key(w);
        return shm_refuse_null(fn, "key");
    }
    return stash_key_set(w, key, len);
}

STASH_API __attribute__((flatten)) int stash_value_get_key(stash_state *state, const void *key,
                                                           size_t klen, stash_bytes *out)
{
    if (__builtin_expect(!state || !out, 0)) return shm_refuse_null(__func__, "state or out");
    int rc = key_set(state->w, key, klen, __func__);
    if (__builtin_expect(rc != 0, 0)) return rc;
    state_count(state->w, SHM_OPS_VALUE, false);
    return get_fast(state, out) ? 0 : value_get(state, out);
}

STASH_API __attribute__((flatten)) int
stash_value_put_key(stash_state *state, const void *key, size_t klen, const void *value, size_t len)
{
    if (__builtin_expect(!state, 0)) return shm_refuse_null(__func__, "state");
    if (shm_null_bytes(value, len)) return shm_refuse_null(__func__, "value");
    int rc = key_set(state->w, key, klen, __func__);
    if (__builtin_expect(rc != 0, 0)) return rc;
    state_count(state->w, SHM_OPS_VALUE, true);
    return put_fast(state, value, len) ? 0 : value_put(state, value, len);
}

/* Folds in into the accumulator of l's entry and stores the result. For an
 * aggregating state, `merge` chooses the merge function over add (in is then
 * another accumulator). */
static int merge_into(stash_state *s, const shm_lookup *l, const stash_bytes *in, bool merge)
{
    shm_cursor c;
    stash_bytes acc, result;
    int rc = state_find_write(s, l, &c);
    if (rc) return rc;
    rc = read_value(s, l, &c, &acc);
    if (rc < 0 && rc != STASH_ENOTFOUND) return rc;
    bool have = rc == 0;
    if (s->kind == STASH_REDUCING) {
        if (!have) return write_value(s, l, &c, in->data, in->len);
        rc = state_combine(s, s->reduce, &acc, in, &result);
    } else if (merge) {
        if (!have) return write_value(s, l, &c, in->data, in->len);
        if (!s->agg.merge) return shm_fail(-EINVAL, "aggregating state without a merge function");
        rc = state_combine(s, s->agg.merge, &acc, in, &result);
    } else {
        if (!have &&
            (rc = state_produce(s, s->agg.create, NULL, &s->scratch, &s->scratch_cap, &acc)) < 0)
            return rc;
        rc = state_combine(s, s->agg.add, &acc, in, &result);
    }
    return rc < 0 ? rc : write_value(s, l, &c, result.data, result.len);
}

static int check_merging(const stash_state *s)
{
    if (s->kind == STASH_REDUCING || s->kind == STASH_AGGREGATING) return 0;
    return shm_fail(STASH_EKIND, "not a reducing or aggregating state");
}

STASH_API int stash_merging_add(stash_state *state, const void *value, size_t len)
{
    if (!state) return shm_refuse_null(__func__, "state");
    state_count(state->w, SHM_OPS_MERGING, true);
    if (shm_null_bytes(value, len)) return shm_refuse_null(__func__, "value");
    shm_lookup l;
    int rc = check_merging(state);
    if (!rc) rc = state_lookup(state, &l);
    if (rc) return rc;
    if (!state_owns(state, l.kg)) return state_refuse_write(state, l.kg);
    stash_bytes in = {value, len};
    return merge_into(state, &l, &in, false);
}

STASH_API int stash_merging_get(stash_state *state, stash_bytes *out)
{
    if (!state || !out) return shm_refuse_null(__func__, "state or out");
    state_count(state->w, SHM_OPS_MERGING, false);
    shm_lookup l;
    shm_cursor c;
    int rc = check_merging(state);
    if (!rc) rc = state_lookup(state, &l);
    if (!rc) rc = read_value(state, &l, &c, out);
    if (rc || state->kind == STASH_REDUCING) return rc;
    stash_bytes acc = *out;
    return state_produce(state, state->agg.result, &acc, &state->scratch2, &state->scratch2_cap,
                         out);
}

int merging_merge_into(stash_state *s, const shm_lookup *target, const stash_bytes *raw)
{
    stash_bytes in = *raw;
    if (state_has_ttl(s)) {
        /* An expired accumulator merges nothing. */
        if (raw->len < TTL_BYTES || state_expired(s, state_ts_get(raw->data), state_now(s)))
            return 0;
        in = (stash_bytes){(const uint8_t *)raw->data + TTL_BYTES, raw->len - TTL_BYTES};
    }
    return merge_into(s, target, &in, true);
}
