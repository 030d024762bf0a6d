/* SPDX-License-Identifier: MIT */
/*
 * list.c: ListState. A list is one record whose value is its elements in
 * insertion order, each as a 4-byte length, an 8-byte timestamp under TTL,
 * and the bytes. Appending writes in place while the record is mutable and
 * has room, and otherwise copies into a record twice the size, so adding is
 * amortized O(1). An empty list does not exist: updating with no elements
 * deletes it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backends/state/state.h"

static size_t element_bytes(const stash_state *s, size_t len)
{
    return 4 + state_ts_bytes(s) + len;
}

static uint8_t *put_element(const stash_state *s, uint8_t *p, const void *v, size_t len,
                            uint64_t now)
{
    uint32_t n = (uint32_t)len;
    memcpy(p, &n, 4);
    p += 4;
    if (state_has_ttl(s)) {
        state_ts_put(p, now);
        p += TTL_BYTES;
    }
    if (len) memcpy(p, v, len);
    return p + len;
}

/* Finds the owned list of the current key for a write. */
static int list_for_write(stash_state *s, shm_lookup *l, shm_cursor *c)
{
    if (s->kind != STASH_LIST) return shm_fail(STASH_EKIND, "not a list state");
    int rc = state_lookup(s, l);
    if (rc) return rc;
    if (!state_owns(s, l->kg)) return state_refuse_write(s, l->kg);
    return state_find_write(s, l, c);
}

STASH_API int stash_list_add_all(stash_state *state, const stash_bytes *values, size_t n)
{
    if (!state) return shm_refuse_null(__func__, "state");
    state_count(state->w, SHM_OPS_LIST, true);
    shm_lookup l;
    shm_cursor c;
    int rc = state_check_array(values, n, __func__, "values");
    if (!rc) rc = list_for_write(state, &l, &c);
    if (rc || n == 0) return rc;
    size_t old = shm_rec_live(c.rec) ? atomic_load(&c.rec->vlen) : 0, add = 0;
    for (size_t i = 0; i < n; i++) add += element_bytes(state, values[i].len);
    if (old + add > UINT32_MAX) return shm_fail(STASH_ETOOBIG, "a list of %zu bytes", old + add);
    shm_rec *rec;
    int in_place = state_write_begin(state, &l, &c, old + add, old, 0, 2 * (old + add), &rec);
    if (in_place < 0) return in_place;
    uint64_t now = state_has_ttl(state) ? state_now(state) : 0;
    uint8_t *p = shm_rec_value(rec) + old;
    for (size_t i = 0; i < n; i++) p = put_element(state, p, values[i].data, values[i].len, now);
    rc = state_write_end(state, &l, &c, rec, old + add, in_place);
    if (rc == 0 && state_has_ttl(state)) state_ttl_cleanup(state, l.kg);
    return rc;
}

STASH_API int stash_list_add(stash_state *state, const void *value, size_t len)
{
    stash_bytes v = {value, len};
    return stash_list_add_all(state, &v, 1);
}

STASH_API int stash_list_update(stash_state *state, const stash_bytes *values, size_t n)
{
    if (!state) return shm_refuse_null(__func__, "state");
    state_count(state->w, SHM_OPS_LIST, true);
    shm_lookup l;
    shm_cursor c;
    int rc = state_check_array(values, n, __func__, "values");
    if (!rc) rc = list_for_write(state, &l, &c);
    if (rc) return rc;
    if (n == 0) return state_delete(state, &l, &c);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += element_bytes(state, values[i].len);
    if (total > UINT32_MAX) return shm_fail(STASH_ETOOBIG, "a list of %zu bytes", total);
    shm_rec *rec;
    int in_place = state_write_begin(state, &l, &c, total, 0, total, 0, &rec);
    if (in_place < 0) return in_place;
    uint64_t now = state_has_ttl(state) ? state_now(state) : 0;
    uint8_t *p = shm_rec_value(rec);
    for (size_t i = 0; i < n; i++) p = put_element(state, p, values[i].data, values[i].len, now);
    return state_write_end(state, &l, &c, rec, total, in_place);
}

/* Rewrites an owned list under TTL: drops expired elements and, when reads
 * refresh, stamps the others with now. Returns the bytes left (0: deleted). */
static int64_t list_refresh(stash_state *s, const shm_lookup *l, shm_cursor *c,
                            const stash_bytes *raw, uint64_t now)
{
    bool refresh = s->ttl.update == STASH_TTL_ON_READ_AND_WRITE;
    size_t keep = 0, expired = 0;
    for (size_t off = 0; off + 4 + TTL_BYTES <= raw->len;) {
        uint32_t n;
        memcpy(&n, (const uint8_t *)raw->data + off, 4);
        size_t e = 4 + TTL_BYTES + n;
        if (state_expired(s, state_ts_get((const uint8_t *)raw->data + off + 4), now))
            expired++;
        else
            keep += e;
        off += e;
    }
    if (!expired && !refresh) return (int64_t)raw->len;
    if (keep == 0) {
        int rc = state_delete(s, l, c);
        return rc < 0 ? rc : 0;
    }
    /* Filter through a private copy: the new record may be the old one. */
    if (shm_reserve(&s->scratch2, &s->scratch2_cap, raw->len) < 0) return -ENOMEM;
    memcpy(s->scratch2, raw->data, raw->len);
    shm_rec *rec;
    int in_place = state_write_begin(s, l, c, keep, 0, keep, 0, &rec);
    if (in_place < 0) return in_place;
    uint8_t *dst = shm_rec_value(rec);
    for (size_t off = 0; off + 4 + TTL_BYTES <= raw->len;) {
        uint32_t n;
        memcpy(&n, s->scratch2 + off, 4);
        size_t e = 4 + TTL_BYTES + n;
        if (!state_expired(s, state_ts_get(s->scratch2 + off + 4), now)) {
            memcpy(dst, s->scratch2 + off, e);
            if (refresh) state_ts_put(dst + 4, now);
            dst += e;
        }
        off += e;
    }
    int rc = state_write_end(s, l, c, rec, keep, in_place);
    return rc < 0 ? rc : (int64_t)keep;
}

STASH_API int stash_list_get(stash_state *state, stash_iter *it)
{
    if (!state || !it) return shm_refuse_null(__func__, "state or it");
    state_count(state->w, SHM_OPS_LIST, false);
    shm_lookup l;
    shm_cursor c;
    stash_bytes raw;
    if (state->kind != STASH_LIST) return shm_fail(STASH_EKIND, "not a list state");
    int rc = state_lookup(state, &l);
    if (!rc) rc = state_read(state, &l, &c, &raw);
    if (rc) return rc;
    iter_impl *x = (iter_impl *)it;
    memset(x, 0, sizeof *x);
    x->type = ITER_LIST;
    x->state = state;
    x->now = state_has_ttl(state) ? state_now(state) : 0;
    bool show_expired = state->ttl.visibility == STASH_TTL_RETURN_EXPIRED_IF_NOT_CLEANED;
    if (state_has_ttl(state) && c.rec) {
        if (show_expired) {
            /* Hand out every element as it was, then clean the stored list. */
            if (shm_reserve(&state->scratch, &state->scratch_cap, raw.len) < 0) return -ENOMEM;
            memcpy(state->scratch, raw.data, raw.len);
            raw.data = state->scratch;
            x->now = 0;
            int64_t left = list_refresh(state, &l, &c, &raw, state_now(state));
            if (left < 0) return (int)left;
        } else {
            int64_t left = list_refresh(state, &l, &c, &raw, x->now);
            if (left <= 0) return left < 0 ? (int)left : STASH_ENOTFOUND;
            if ((rc = state_view(state, &l, &c, &raw)) < 0) return rc;
        }
    } else if (state_has_ttl(state) && show_expired) {
        x->now = 0;
    }
    x->blob = raw.data;
    x->blob_len = (uint32_t)raw.len;
    x->writes = state->w->writes;
    return 0;
}

int list_iter_next(iter_impl *it, stash_bytes *value)
{
    const stash_state *s = it->state;
    size_t ts = state_ts_bytes(s);
    while (it->pos + 4 + ts <= it->blob_len) {
        uint32_t n;
        memcpy(&n, it->blob + it->pos, 4);
        const uint8_t *p = it->blob + it->pos + 4;
        it->pos += (uint32_t)(4 + ts + n);
        if (ts && it->now && state_expired(s, state_ts_get(p), it->now)) continue;
        if (value) *value = (stash_bytes){p + ts, n};
        return 1;
    }
    return 0;
}

int list_merge_into(stash_state *s, const shm_lookup *target, const stash_bytes *raw)
{
    /* The source's elements, timestamps included, go after the target's. */
    shm_cursor c;
    int rc = state_find_write(s, target, &c);
    if (rc < 0) return rc;
    size_t old = shm_rec_live(c.rec) ? atomic_load(&c.rec->vlen) : 0;
    shm_rec *rec;
    int in_place =
        state_write_begin(s, target, &c, old + raw->len, old, 0, 2 * (old + raw->len), &rec);
    if (in_place < 0) return in_place;
    memcpy(shm_rec_value(rec) + old, raw->data, raw->len);
    return state_write_end(s, target, &c, rec, old + raw->len, in_place);
}

bool list_bytes_valid(const uint8_t *v, size_t len, bool ttl)
{
    size_t head = 4 + (ttl ? TTL_BYTES : 0), off = 0;
    while (off < len) {
        uint32_t n;
        if (len - off < head) return false;
        memcpy(&n, v + off, 4);
        if (n > len - off - head) return false;
        off += head + n;
    }
    return len > 0;
}

int list_bytes_each(const uint8_t *v, size_t len, bool ttl, state_item_fn *fn, void *ctx)
{
    size_t head = 4 + (ttl ? TTL_BYTES : 0);
    uint32_t i = 0;
    for (size_t off = 0; off + head <= len; i++) {
        uint32_t n;
        memcpy(&n, v + off, 4);
        if (n > len - off - head) break;
        stash_bytes e = {v + off + head, n};
        int rc = fn(ctx, i, NULL, &e, ttl ? state_ts_get(v + off + 4) : 0);
        if (rc) return rc;
        off += head + n;
    }
    return 0;
}

size_t list_keep_unexpired(const uint8_t *v, size_t len, uint64_t ttl_ms, uint64_t now,
                           uint8_t *out)
{
    size_t kept = 0;
    for (size_t off = 0; off + 4 + TTL_BYTES <= len;) {
        uint32_t n;
        memcpy(&n, v + off, 4);
        size_t e = 4 + TTL_BYTES + (size_t)n;
        if (e > len - off) break;
        if (!ttl_expired(state_ts_get(v + off + 4), ttl_ms, now)) {
            memcpy(out + kept, v + off, e);
            kept += e;
        }
        off += e;
    }
    return kept;
}

size_t list_bytes_retime(const uint8_t *v, size_t len, bool from_ttl, bool to_ttl, uint64_t now,
                         uint8_t *out)
{
    size_t head = 4 + (from_ttl ? TTL_BYTES : 0), n = 0;
    for (size_t off = 0; off + head <= len;) {
        uint32_t el;
        memcpy(&el, v + off, 4);
        if (el > len - off - head) break;
        memcpy(out + n, &el, 4);
        n += 4;
        if (to_ttl) {
            state_ts_put(out + n, from_ttl ? state_ts_get(v + off + 4) : now);
            n += TTL_BYTES;
        }
        memcpy(out + n, v + off + head, el);
        n += el;
        off += head + el;
    }
    return n;
}
