/* SPDX-License-Identifier: MIT */
/*
 * state.c: what every state kind shares: the current key and namespace,
 * reads that are views for the owner and copies for everyone else,
 * copy-on-write writes through the worker's store, and TTL (timestamps,
 * expiry, incremental cleanup).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/state/state.h"

int worker_refuse_forked(const stash_worker *w, const char *fn)
{
    if (w->reader)
        return shm_fail(STASH_EFORK, "%s: a reader opened by another process, before a fork", fn);
    return shm_fail(STASH_EFORK,
                    "%s: worker %u was opened by another process (pid %d), before a fork", fn,
                    w->slot, w->arena->slots[w->slot].pid);
}

int64_t worker_kg_entries(stash_worker *w, uint32_t kg)
{
    if (kg >= w->max_parallelism)
        return shm_fail(-EINVAL, "key group %u of %u", kg, w->max_parallelism);
    return w->store->ops->kg_entries(w->store, kg);
}

/* What follows from s's namespace (of hash ns_hash): its part of lookup
 * hashes, and whether its values may take the one-step paths. */
void state_namespace_set(stash_state *s, uint64_t ns_hash)
{
    s->seed = shm_lookup_seed(s->id, ns_hash);
    s->one_step = s->kind == STASH_VALUE && !state_has_ttl(s) && s->w->records_in_arena &&
                  (s->nslen == 0 || (s->nslen >= 8 && s->nslen <= 16));
    s->name = shm_name_word(s->id, 0, s->nslen);
}

/* Flink's cleanup for every record: a few entries of the new current key's
 * key group, for each state that asks for it. Never inlined into the key's
 * setting, whose common path then saves no registers for it. */
__attribute__((noinline)) void worker_clean_on_record(stash_worker *w)
{
    if (w->kg < w->range.first || w->kg > w->range.last) return;
    w->writes++;
    for (stash_state *s = w->states; s; s = s->next)
        if (state_has_ttl(s) && s->ttl.cleanup_every_record) state_ttl_cleanup(s, w->kg);
}

int worker_key_set_hashed(stash_worker *worker, const void *key, size_t len, uint64_t hash)
{
    if (len > worker->key_cap || !worker->key) {
        if (shm_reserve(&worker->key, &worker->key_cap, len ? len : 1) < 0) {
            worker_drop_key(worker);
            return shm_fail(-ENOMEM, "out of memory");
        }
    }
    if (len) memcpy(worker->key, key, len);
    return worker_key_use(worker, len, hash, len >= 8 && len <= 16);
}

/* stash_key_set for a key outside 8 to 16 bytes or longer than the buffer:
 * apart, so that the common case saves no registers. */
static __attribute__((noinline)) int key_set_other(stash_worker *worker, const void *key,
                                                   size_t len)
{
    if (!worker) return shm_refuse_null("stash_key_set", "worker");
    if (worker->forked) return worker_refuse_forked(worker, "stash_key_set");
    /* A refused key leaves none current: a write that follows must not go
     * to the key before it. */
    worker_drop_key(worker);
    if (shm_null_bytes(key, len)) return shm_refuse_null("stash_key_set", "key");
    if (len > UINT16_MAX) return shm_fail(-EINVAL, "a key of %zu bytes (at most 65535)", len);
    return worker_key_set_hashed(worker, key, len, shm_key_hash(key, len));
}

/* Flattened: the key's hash is computed inline. */
STASH_API __attribute__((flatten)) int stash_key_set(stash_worker *worker, const void *key,
                                                     size_t len)
{
    return worker_key_short(worker, key, len) ? worker_key_set_short(worker, key, len)
                                              : key_set_other(worker, key, len);
}

STASH_API int stash_key_group_current(const stash_worker *worker)
{
    if (!worker) return shm_refuse_null(__func__, "worker");
    return worker->has_key ? (int)worker->kg : STASH_ENOKEY;
}

STASH_API int stash_state_namespace(stash_state *state, const void *ns, size_t len)
{
    if (!state) return shm_refuse_null(__func__, "state");
    if (shm_null_bytes(ns, len)) return shm_refuse_null(__func__, "ns");
    if (len > UINT16_MAX) return shm_fail(-EINVAL, "a namespace of %zu bytes (at most 65535)", len);
    if (shm_reserve(&state->ns, &state->ns_cap, len ? len : 1) < 0)
        return shm_fail(-ENOMEM, "out of memory");
    if (len) memcpy(state->ns, ns, len);
    state->nslen = (uint16_t)len;
    state_namespace_set(state, shm_ns_hash(ns, len));
    return 0;
}

int state_check_array(const stash_bytes *values, size_t n, const char *fn, const char *what)
{
    if (n && !values) return shm_refuse_null(fn, what);
    for (size_t i = 0; i < n; i++) {
        if (shm_null_bytes(values[i].data, values[i].len))
            return shm_fail(-EINVAL, "%s: %s[%zu] is NULL with a length", fn, what, i);
        if (values[i].len > UINT32_MAX / 4)
            return shm_fail(STASH_ETOOBIG, "%s: %s[%zu] of %zu bytes", fn, what, i, values[i].len);
    }
    return 0;
}

int state_refuse_write(const stash_state *s, uint32_t kg)
{
    if (s->w->reader)
        return shm_fail(STASH_EKEYGROUP, "a reader writes nothing (key group %u)", kg);
    return shm_fail(STASH_EKEYGROUP, "worker %u owns key groups %u..%u, not %u", s->w->slot,
                    s->w->range.first, s->w->range.last, kg);
}

int state_read_copy(stash_state *s, const shm_lookup *l, shm_cursor *c, stash_bytes *out)
{
    store *st = s->w->store;
    c->rec = NULL;
    int64_t n = st->ops->read_copy(st, l, &s->scratch, &s->scratch_cap);
    if (n < 0) return (int)n;
    out->data = s->scratch;
    out->len = (size_t)n;
    return 0;
}

int state_write_begin(stash_state *s, const shm_lookup *l, shm_cursor *c, size_t len,
                      size_t preserve, size_t dirty, size_t cap, shm_rec **rec)
{
    shm_rec *old = shm_rec_live(c->rec) ? c->rec : NULL;
    shm_region region = {0, (uint32_t)dirty};
    if (old && state_rec_mutable(s, l->kg, old) && state_rec_capacity(s, old) >= len &&
        state_rec_write_begin(s, l->kg, old, &region, 1)) {
        *rec = old;
        return 1;
    }
    int rc = state_rec_new(s, l, cap > len ? cap : len, rec);
    if (rc < 0) return rc;
    if (old && preserve) memcpy(shm_rec_value(*rec), shm_rec_value(old), preserve);
    return 0;
}

int state_write_end(stash_state *s, const shm_lookup *l, shm_cursor *c, shm_rec *rec, size_t len,
                    int in_place)
{
    atomic_store_explicit(&rec->vlen, (uint32_t)len, memory_order_relaxed);
    s->w->writes++;
    store *st = s->w->store;
    return in_place ? st->ops->write_end(st, l->kg, rec) : st->ops->publish(st, l, c, rec);
}

int state_write(stash_state *s, const shm_lookup *l, shm_cursor *c, const void *bytes, size_t len)
{
    if (len > UINT32_MAX) return shm_fail(STASH_ETOOBIG, "a value of %zu bytes", len);
    shm_rec *rec;
    int in_place = state_write_begin(s, l, c, len, 0, len, 0, &rec);
    if (in_place < 0) return in_place;
    memcpy(shm_rec_value(rec), bytes, len);
    return state_write_end(s, l, c, rec, len, in_place);
}

int state_delete(stash_state *s, const shm_lookup *l, shm_cursor *c)
{
    s->w->writes++;
    store *st = s->w->store;
    return st->ops->delete (st, l, c);
}

STASH_API int stash_state_clear(stash_state *state)
{
    if (!state) return shm_refuse_null(__func__, "state");
    state_count(state->w, state_ops_kind(state->kind), true);
    if (opstate_kind(state->kind))
        return shm_fail(STASH_EKIND, "operator state has no current key's entry: empty it with "
                                     "stash_op_list_update or stash_broadcast_remove");
    shm_lookup l;
    shm_cursor c;
    int rc = state_lookup(state, &l);
    if (rc) return rc;
    if (!state_owns(state, l.kg)) return state_refuse_write(state, l.kg);
    rc = state_find_write(state, &l, &c);
    return rc ? rc : state_delete(state, &l, &c);
}

/* ---- TTL ---------------------------------------------------------------- */

uint64_t worker_clock_ms(const stash_worker *w)
{
    if (w->clock) return w->clock(w->clock_ctx);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t state_now(const stash_state *s)
{
    return s->ttl.time == STASH_TTL_EVENT_TIME ? s->w->watermark : worker_clock_ms(s->w);
}

bool state_expired(const stash_state *s, uint64_t ts, uint64_t now)
{
    return ttl_expired(ts, s->ttl.ttl_ms, now);
}

uint64_t state_ts_get(const uint8_t *p)
{
    uint64_t ts;
    memcpy(&ts, p, sizeof ts);
    return ts;
}

void state_ts_put(uint8_t *p, uint64_t ts)
{
    memcpy(p, &ts, sizeof ts);
}

typedef struct cleanup {
    const stash_state *s;
    uint64_t now;
} cleanup;

/* Whether a whole record of a state has expired: values and merging states
 * by their timestamp; lists and maps expire element by element on access
 * instead. A store_expired_fn. */
static bool record_expired(void *ctx, const uint8_t *value, size_t len)
{
    const cleanup *c = ctx;
    if (c->s->kind == STASH_LIST || c->s->kind == STASH_MAP) return false;
    return len >= TTL_BYTES && state_expired(c->s, state_ts_get(value), c->now);
}

void state_ttl_cleanup(stash_state *s, uint32_t kg)
{
    store *st = s->w->store;
    cleanup c = {s, state_now(s)};
    st->ops->ttl_cleanup(st, kg, s->id, s->ttl.cleanup_entries, record_expired, &c);
}

int state_combine(stash_state *s, stash_combine_fn *fn, const stash_bytes *acc,
                  const stash_bytes *in, stash_bytes *out)
{
    size_t len = 0;
    if (shm_reserve(&s->scratch2, &s->scratch2_cap, 64) < 0) return -ENOMEM;
    int rc = fn(acc, in, s->scratch2, s->scratch2_cap, &len, s->ctx);
    if (rc == -ENOSPC) {
        if (shm_reserve(&s->scratch2, &s->scratch2_cap, len) < 0) return -ENOMEM;
        rc = fn(acc, in, s->scratch2, s->scratch2_cap, &len, s->ctx);
    }
    if (rc < 0) return rc;
    *out = (stash_bytes){s->scratch2, len};
    return 0;
}

int state_produce(stash_state *s, stash_produce_fn *fn, const stash_bytes *acc, uint8_t **buf,
                  size_t *cap, stash_bytes *out)
{
    size_t len = 0;
    if (shm_reserve(buf, cap, 64) < 0) return -ENOMEM;
    int rc = fn(acc, *buf, *cap, &len, s->ctx);
    if (rc == -ENOSPC) {
        if (shm_reserve(buf, cap, len) < 0) return -ENOMEM;
        rc = fn(acc, *buf, *cap, &len, s->ctx);
    }
    if (rc < 0) return rc;
    *out = (stash_bytes){*buf, len};
    return 0;
}
