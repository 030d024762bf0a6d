/* SPDX-License-Identifier: MIT */
/*
 * map.c: MapState. A map is one record holding a small open-addressing
 * table of its user keys: a header, a slot array of entry offsets, and the
 * entries (4-byte key length, 4-byte value length, an 8-byte timestamp under
 * TTL, key, value). A put of a same-sized value overwrites in place; other
 * puts append an entry while the record is mutable and has room, and
 * otherwise rebuild the map compacted into a larger record. A removal marks
 * its slot; a map whose last entry goes is deleted.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "backends/state/state.h"

#define SLOT_EMPTY 0u
#define SLOT_GONE 1u
#define MIN_SLOTS 8u

typedef struct map_hdr {
    uint32_t nslots;
    uint32_t count; /* live entries */
    uint32_t end;   /* bytes of the entry area in use */
    uint32_t dead;  /* bytes of the entry area no slot points at */
    uint32_t gone;  /* slots marked SLOT_GONE */
} map_hdr;

#define HDR_BYTES ((uint32_t)sizeof(map_hdr))

static map_hdr hdr_get(const uint8_t *m)
{
    map_hdr h;
    memcpy(&h, m, sizeof h);
    return h;
}
static void hdr_put(uint8_t *m, const map_hdr *h)
{
    memcpy(m, h, sizeof *h);
}
static uint32_t slot_get(const uint8_t *m, uint32_t i)
{
    uint32_t v;
    memcpy(&v, m + HDR_BYTES + 4 * i, 4);
    return v;
}
static void slot_put(uint8_t *m, uint32_t i, uint32_t v)
{
    memcpy(m + HDR_BYTES + 4 * i, &v, 4);
}
static uint32_t u32_at(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

typedef struct entry {
    uint32_t klen, vlen;
    const uint8_t *ts; /* NULL without TTL */
    const uint8_t *key, *value;
    size_t bytes;
} entry;

static entry entry_at(const stash_state *s, const uint8_t *m, uint32_t off)
{
    entry e = {u32_at(m + off), u32_at(m + off + 4), NULL, NULL, NULL, 0};
    const uint8_t *p = m + off + 8;
    if (state_has_ttl(s)) {
        e.ts = p;
        p += TTL_BYTES;
    }
    e.key = p;
    e.value = p + e.klen;
    e.bytes = 8 + state_ts_bytes(s) + e.klen + e.vlen;
    return e;
}

static size_t entry_bytes(const stash_state *s, size_t klen, size_t vlen)
{
    return 8 + state_ts_bytes(s) + klen + vlen;
}

static uint32_t write_entry(const stash_state *s, uint8_t *m, uint32_t off, const void *k,
                            uint32_t klen, const void *v, uint32_t vlen, uint64_t now)
{
    uint8_t *p = m + off;
    memcpy(p, &klen, 4);
    memcpy(p + 4, &vlen, 4);
    p += 8;
    if (state_has_ttl(s)) {
        state_ts_put(p, now);
        p += TTL_BYTES;
    }
    if (klen) memcpy(p, k, klen);
    if (vlen) memcpy(p + klen, v, vlen);
    return (uint32_t)(p + klen + vlen - (m + off));
}

static uint32_t entries_start(uint32_t nslots)
{
    return HDR_BYTES + 4 * nslots;
}

/* Finds user key k: returns its slot, or UINT32_MAX with *insert set to the
 * slot a new entry would take. */
static uint32_t find_slot(const stash_state *s, const uint8_t *m, const void *k, uint32_t klen,
                          uint32_t *insert)
{
    if (!k) k = ""; /* an empty user key given as NULL: memcmp takes no NULL */
    map_hdr h = hdr_get(m);
    uint32_t mask = h.nslots - 1, i = (uint32_t)XXH3_64bits(k, klen) & mask;
    uint32_t first_gone = UINT32_MAX;
    for (uint32_t n = 0; n < h.nslots; n++, i = (i + 1) & mask) {
        uint32_t v = slot_get(m, i);
        if (v == SLOT_EMPTY) break;
        if (v == SLOT_GONE) {
            if (first_gone == UINT32_MAX) first_gone = i;
            continue;
        }
        entry e = entry_at(s, m, v);
        if (e.klen == klen && memcmp(e.key, k, klen) == 0) return i;
    }
    if (insert) *insert = first_gone != UINT32_MAX ? first_gone : i;
    return UINT32_MAX;
}

static int check_map(const stash_state *s)
{
    return s->kind == STASH_MAP ? 0 : shm_fail(STASH_EKIND, "not a map state");
}

/* Makes c's record mutable, copying it as it is (same layout) if a pinned
 * reader may still see it. */
static int make_mutable(stash_state *s, const shm_lookup *l, shm_cursor *c)
{
    if (state_rec_mutable(s, l->kg, c->rec)) return 0;
    size_t len = atomic_load(&c->rec->vlen);
    shm_rec *rec;
    int rc = state_rec_new(s, l, state_rec_capacity(s, c->rec), &rec);
    if (rc < 0) return rc;
    memcpy(shm_rec_value(rec), shm_rec_value(c->rec), len);
    return state_write_end(s, l, c, rec, len, 0);
}

/* Builds the map of m (may be NULL) plus (k, v) into a new record, compacted
 * with room to grow, and publishes it. */
static int rebuild(stash_state *s, const shm_lookup *l, shm_cursor *c, const uint8_t *m,
                   const void *k, uint32_t klen, const void *v, uint32_t vlen, uint64_t now)
{
    /* Slots move: the state's map iterators go stale. */
    s->map_layouts++;
    map_hdr h = m ? hdr_get(m) : (map_hdr){0};
    uint32_t want = (h.count + 1) * 2, nslots = MIN_SLOTS;
    while (nslots < want) nslots *= 2;
    size_t live = m ? h.end - h.dead : 0;
    size_t need = entries_start(nslots) + live + entry_bytes(s, klen, vlen);
    if (need > UINT32_MAX / 2) return shm_fail(STASH_ETOOBIG, "a map of %zu bytes", need);
    /* Work from a private copy: the old record may be freed by the publish. */
    uint8_t *old = NULL;
    if (m) {
        size_t bytes = entries_start(h.nslots) + h.end;
        if (shm_reserve(&s->scratch2, &s->scratch2_cap, bytes) < 0) return -ENOMEM;
        memcpy(s->scratch2, m, bytes);
        old = s->scratch2;
    }
    shm_rec *rec;
    int rc = state_rec_new(s, l, need + need / 2, &rec);
    if (rc < 0) return rc;
    uint8_t *n = shm_rec_value(rec);
    map_hdr nh = {nslots, 0, 0, 0, 0};
    memset(n + HDR_BYTES, 0, 4 * nslots);
    hdr_put(n, &nh);
    uint32_t at = entries_start(nslots);
    for (uint32_t i = 0; old && i < h.nslots; i++) {
        uint32_t off = slot_get(old, i);
        if (off <= SLOT_GONE) continue;
        entry e = entry_at(s, old, off);
        if (e.klen == klen && memcmp(e.key, k, klen) == 0) continue;
        uint32_t slot;
        find_slot(s, n, e.key, e.klen, &slot);
        memcpy(n + at, old + off, e.bytes);
        slot_put(n, slot, at);
        at += (uint32_t)e.bytes;
        nh.count++;
    }
    uint32_t slot;
    find_slot(s, n, k, klen, &slot);
    at += write_entry(s, n, at, k, klen, v, vlen, now);
    slot_put(n, slot, at - (uint32_t)entry_bytes(s, klen, vlen));
    nh.count++;
    nh.end = at - entries_start(nslots);
    hdr_put(n, &nh);
    return state_write_end(s, l, c, rec, at, 0);
}

/* Copies c's map compacted (its live entries only) into a new record with
 * room for extra more bytes, every slot where it was, so that an iterator
 * over the map goes on, and publishes it. */
static int compact_keeping_slots(stash_state *s, const shm_lookup *l, shm_cursor *c, size_t extra)
{
    const uint8_t *m = shm_rec_value(c->rec);
    map_hdr h = hdr_get(m);
    uint32_t start = entries_start(h.nslots);
    size_t live = h.end - h.dead, need = start + live + extra;
    if (need + need / 2 > UINT32_MAX / 2)
        return shm_fail(STASH_ETOOBIG, "a map of %zu bytes", need);
    shm_rec *rec;
    int rc = state_rec_new(s, l, need + need / 2, &rec);
    if (rc < 0) return rc;
    uint8_t *n = shm_rec_value(rec);
    memcpy(n, m, start); /* the header and the slots, gone ones included */
    uint32_t at = start;
    for (uint32_t i = 0; i < h.nslots; i++) {
        uint32_t off = slot_get(m, i);
        if (off <= SLOT_GONE) continue;
        entry e = entry_at(s, m, off);
        memcpy(n + at, m + off, e.bytes);
        slot_put(n, i, at);
        at += (uint32_t)e.bytes;
    }
    h.end = at - start;
    h.dead = 0;
    hdr_put(n, &h);
    return state_write_end(s, l, c, rec, at, 0);
}

static int map_put_one(stash_state *s, const shm_lookup *l, shm_cursor *c, const void *k,
                       size_t klen, const void *v, size_t vlen, uint64_t now)
{
    if (klen > UINT16_MAX || vlen > UINT32_MAX / 4)
        return shm_fail(STASH_ETOOBIG, "a map entry of %zu + %zu bytes", klen, vlen);
    if (!shm_rec_live(c->rec))
        return rebuild(s, l, c, NULL, k, (uint32_t)klen, v, (uint32_t)vlen, now);
    uint8_t *m = shm_rec_value(c->rec);
    map_hdr h = hdr_get(m);
    uint32_t insert, slot = find_slot(s, m, k, (uint32_t)klen, &insert);
    bool mutable = state_rec_mutable(s, l->kg, c->rec);
    size_t need = entry_bytes(s, klen, vlen);
    if (slot != UINT32_MAX) {
        entry e = entry_at(s, m, slot_get(m, slot));
        const uint8_t *from = e.ts ? e.ts : e.value;
        shm_region r = {(uint32_t)(from - m), (uint32_t)(e.value + e.vlen - from)};
        if (e.vlen == vlen && mutable && state_rec_write_begin(s, l->kg, c->rec, &r, 1)) {
            if (e.ts) state_ts_put((uint8_t *)e.ts, now);
            if (vlen) memcpy((uint8_t *)e.value, v, vlen);
            s->w->writes++;
            return state_rec_write_end(s, l->kg, c->rec);
        }
    }
    if (slot != UINT32_MAX &&
        (!mutable || entries_start(h.nslots) + h.end + need > state_rec_capacity(s, c->rec))) {
        /* A new value for a key the map has: appended in a compacted copy
         * that keeps every slot, so that iterators over the map go on. */
        int rc = compact_keeping_slots(s, l, c, need);
        if (rc < 0) return rc;
        m = shm_rec_value(c->rec);
        h = hdr_get(m);
        mutable = true;
    }
    uint32_t used = entries_start(h.nslots) + h.end;
    uint32_t slots_after = h.count + h.gone + (slot == UINT32_MAX ? 1 : 0);
    uint32_t changed = slot != UINT32_MAX ? slot : insert;
    shm_region r[2] = {{0, HDR_BYTES}, {HDR_BYTES + 4 * changed, 4}};
    if (!mutable || used + need > state_rec_capacity(s, c->rec) || slots_after * 4 > h.nslots * 3 ||
        !state_rec_write_begin(s, l->kg, c->rec, r, 2))
        return rebuild(s, l, c, m, k, (uint32_t)klen, v, (uint32_t)vlen, now);
    write_entry(s, m, used, k, (uint32_t)klen, v, (uint32_t)vlen, now);
    if (slot != UINT32_MAX) {
        h.dead += (uint32_t)entry_at(s, m, slot_get(m, slot)).bytes;
    } else {
        if (slot_get(m, insert) == SLOT_GONE) h.gone--;
        slot = insert;
        h.count++;
    }
    slot_put(m, slot, used);
    h.end += (uint32_t)need;
    hdr_put(m, &h);
    atomic_store_explicit(&c->rec->vlen, used + (uint32_t)need, memory_order_relaxed);
    s->w->writes++;
    return state_rec_write_end(s, l->kg, c->rec);
}

/* Finds the owned map of the current key for a write. */
static int map_for_write(stash_state *s, shm_lookup *l, shm_cursor *c)
{
    int rc = check_map(s);
    if (!rc) rc = state_lookup(s, l);
    if (rc) return rc;
    if (!state_owns(s, l->kg)) return state_refuse_write(s, l->kg);
    return state_find_write(s, l, c);
}

STASH_API int stash_map_put_all(stash_state *state, const stash_bytes *keys,
                                const stash_bytes *values, size_t n)
{
    if (!state) return shm_refuse_null(__func__, "state");
    state_count(state->w, SHM_OPS_MAP, true);
    shm_lookup l;
    shm_cursor c;
    int rc = state_check_array(keys, n, __func__, "keys");
    if (!rc) rc = state_check_array(values, n, __func__, "values");
    if (!rc) rc = map_for_write(state, &l, &c);
    uint64_t now = state_has_ttl(state) ? state_now(state) : 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = map_put_one(state, &l, &c, keys[i].data, keys[i].len, values[i].data, values[i].len,
                         now);
    if (!rc && state_has_ttl(state)) state_ttl_cleanup(state, l.kg);
    return rc;
}

STASH_API int stash_map_put(stash_state *state, const void *k, size_t klen, const void *value,
                            size_t len)
{
    stash_bytes key = {k, klen}, v = {value, len};
    return stash_map_put_all(state, &key, &v, 1);
}

/* Removes the entry in slot of c's (owned, live) map. */
static int remove_slot(stash_state *s, const shm_lookup *l, shm_cursor *c, uint32_t slot)
{
    if (hdr_get(shm_rec_value(c->rec)).count == 1) return state_delete(s, l, c);
    int rc = make_mutable(s, l, c);
    if (rc < 0) return rc;
    uint8_t *m = shm_rec_value(c->rec);
    map_hdr h = hdr_get(m);
    shm_region r[2] = {{0, HDR_BYTES}, {HDR_BYTES + 4 * slot, 4}};
    /* 24 bytes in two regions always fit the undo record. */
    state_rec_write_begin(s, l->kg, c->rec, r, 2);
    h.dead += (uint32_t)entry_at(s, m, slot_get(m, slot)).bytes;
    h.count--;
    h.gone++;
    slot_put(m, slot, SLOT_GONE);
    hdr_put(m, &h);
    s->w->writes++;
    return state_rec_write_end(s, l->kg, c->rec);
}

STASH_API int stash_map_remove(stash_state *state, const void *k, size_t klen)
{
    if (!state) return shm_refuse_null(__func__, "state");
    state_count(state->w, SHM_OPS_MAP, true);
    if (shm_null_bytes(k, klen)) return shm_refuse_null(__func__, "k");
    shm_lookup l;
    shm_cursor c;
    int rc = map_for_write(state, &l, &c);
    if (rc || !shm_rec_live(c.rec)) return rc;
    uint32_t slot = find_slot(state, shm_rec_value(c.rec), k, (uint32_t)klen, NULL);
    return slot == UINT32_MAX ? 0 : remove_slot(state, &l, &c, slot);
}

/* Stamps the entry in slot of c's owned map with now (a read under
 * STASH_TTL_ON_READ_AND_WRITE) and views the map again: *view, with the
 * entry's value at offset *at. */
static int touch_entry(stash_state *s, const shm_lookup *l, shm_cursor *c, uint32_t slot,
                       uint64_t now, stash_bytes *view, size_t *at)
{
    int rc = make_mutable(s, l, c);
    if (rc < 0) return rc;
    uint8_t *m = shm_rec_value(c->rec);
    entry f = entry_at(s, m, slot_get(m, slot));
    shm_region r = {(uint32_t)(f.ts - m), TTL_BYTES};
    /* Eight bytes always fit the undo record. */
    state_rec_write_begin(s, l->kg, c->rec, &r, 1);
    state_ts_put((uint8_t *)f.ts, now);
    if ((rc = state_rec_write_end(s, l->kg, c->rec)) < 0) return rc;
    *at = (size_t)(f.value - m);
    return state_view(s, l, c, view);
}

/* Reads the current key's map: its bytes, and where it lives if owned. */
static int map_read(stash_state *s, shm_lookup *l, shm_cursor *c, stash_bytes *raw)
{
    int rc = check_map(s);
    if (!rc) rc = state_lookup(s, l);
    return rc ? rc : state_read(s, l, c, raw);
}

STASH_API int stash_map_get(stash_state *state, const void *k, size_t klen, stash_bytes *out)
{
    if (!state || !out) return shm_refuse_null(__func__, "state or out");
    state_count(state->w, SHM_OPS_MAP, false);
    if (shm_null_bytes(k, klen)) return shm_refuse_null(__func__, "k");
    shm_lookup l;
    shm_cursor c;
    stash_bytes raw;
    int rc = map_read(state, &l, &c, &raw);
    if (rc) return rc;
    uint32_t slot = find_slot(state, raw.data, k, (uint32_t)klen, NULL);
    if (slot == UINT32_MAX) return STASH_ENOTFOUND;
    entry e = entry_at(state, raw.data, slot_get(raw.data, slot));
    *out = (stash_bytes){e.value, e.vlen};
    if (!e.ts) return 0;
    uint64_t now = state_now(state);
    bool owned = c.rec != NULL;
    if (state_expired(state, state_ts_get(e.ts), now)) {
        bool show = state->ttl.visibility == STASH_TTL_RETURN_EXPIRED_IF_NOT_CLEANED;
        if (!owned) return show ? 0 : STASH_ENOTFOUND;
        if (show) {
            if (shm_reserve(&state->scratch, &state->scratch_cap, e.vlen ? e.vlen : 1) < 0)
                return -ENOMEM;
            memcpy(state->scratch, e.value, e.vlen);
            out->data = state->scratch;
        }
        rc = remove_slot(state, &l, &c, slot);
        return rc < 0 ? rc : show ? 0 : STASH_ENOTFOUND;
    }
    if (owned && state->ttl.update == STASH_TTL_ON_READ_AND_WRITE) {
        size_t at;
        if ((rc = touch_entry(state, &l, &c, slot, now, &raw, &at)) < 0) return rc;
        out->data = (const uint8_t *)raw.data + at;
    }
    return 0;
}

STASH_API int stash_map_contains(stash_state *state, const void *k, size_t klen)
{
    stash_bytes v;
    int rc = stash_map_get(state, k, klen, &v);
    return rc == 0 ? 1 : rc == STASH_ENOTFOUND ? 0 : rc;
}

STASH_API int stash_map_iter(stash_state *state, stash_iter *it)
{
    if (!state || !it) return shm_refuse_null(__func__, "state or it");
    state_count(state->w, SHM_OPS_MAP, false);
    shm_lookup l;
    shm_cursor c;
    stash_bytes raw;
    int rc = map_read(state, &l, &c, &raw);
    if (rc) return rc;
    iter_impl *x = (iter_impl *)it;
    memset(x, 0, sizeof *x);
    x->type = ITER_MAP;
    x->state = state;
    x->blob = raw.data;
    x->blob_len = (uint32_t)raw.len;
    x->rec = c.rec;
    x->last = UINT32_MAX;
    x->writes = state->w->writes;
    x->key_hash = state->w->key_hash;
    x->seed = state->seed;
    x->layout = state->map_layouts;
    if (state_has_ttl(state)) x->now = state_now(state);
    return 0;
}

STASH_API int stash_map_is_empty(stash_state *state)
{
    if (!state) return shm_refuse_null(__func__, "state");
    state_count(state->w, SHM_OPS_MAP, false);
    stash_iter it;
    int rc = stash_map_iter(state, &it);
    if (rc == STASH_ENOTFOUND) return 1;
    if (rc < 0) return rc;
    rc = map_iter_next((iter_impl *)&it, NULL, NULL);
    return rc < 0 ? rc : rc == 0;
}

/* Stamps the entry in slot of the iterated (owned) map with now, as a read
 * under STASH_TTL_ON_READ_AND_WRITE does, and views the map again. */
static int iter_touch(iter_impl *it, uint32_t slot, uint64_t now)
{
    stash_state *s = it->state;
    shm_lookup l;
    shm_cursor c;
    int rc = state_lookup(s, &l);
    if (!rc) rc = state_find(s, &l, &c);
    if (rc < 0) return rc;
    if (s->w->records_in_arena && c.rec != it->rec)
        return shm_fail(STASH_ESTALE, "the map changed under its iterator");
    stash_bytes view;
    size_t at;
    if ((rc = touch_entry(s, &l, &c, slot, now, &view, &at)) < 0) return rc;
    it->blob = view.data;
    it->rec = c.rec;
    it->writes = s->w->writes;
    return 0;
}

/* An expired entry of the iterated map, met by the iteration: what a read
 * of it does (removed if owned; shown, from a copy, only if asked). Returns
 * 1 with the views set, 0 to go on to the next entry, or an error. */
static int iter_expired(iter_impl *it, uint32_t slot, entry e, stash_bytes *key, stash_bytes *value)
{
    stash_state *s = it->state;
    bool show = s->ttl.visibility == STASH_TTL_RETURN_EXPIRED_IF_NOT_CLEANED;
    if (show) {
        if (shm_reserve(&s->scratch, &s->scratch_cap, (size_t)e.klen + e.vlen + 1) < 0)
            return shm_fail(-ENOMEM, "out of memory");
        memcpy(s->scratch, e.key, e.klen);
        memcpy(s->scratch + e.klen, e.value, e.vlen);
        e.key = s->scratch;
        e.value = s->scratch + e.klen;
    }
    if (it->rec) {
        it->last = slot;
        int rc = map_iter_remove(it);
        if (rc < 0) return rc;
    }
    if (!show) return 0;
    if (key) *key = (stash_bytes){e.key, e.klen};
    if (value) *value = (stash_bytes){e.value, e.vlen};
    return 1;
}

int map_iter_next(iter_impl *it, stash_bytes *key, stash_bytes *value)
{
    stash_state *s = it->state;
    while (it->blob && it->pos < hdr_get(it->blob).nslots) {
        uint32_t slot = it->pos++, off = slot_get(it->blob, slot);
        if (off <= SLOT_GONE) continue;
        entry e = entry_at(s, it->blob, off);
        /* Entry by entry as stash_map_get: expired ones go (shown once if
         * asked), and reads refresh where the state says so. */
        if (e.ts && state_expired(s, state_ts_get(e.ts), it->now)) {
            int rc = iter_expired(it, slot, e, key, value);
            if (rc) return rc;
            continue;
        }
        if (e.ts && it->rec && s->ttl.update == STASH_TTL_ON_READ_AND_WRITE) {
            int rc = iter_touch(it, slot, it->now);
            if (rc < 0) return rc;
            e = entry_at(s, it->blob, slot_get(it->blob, slot));
        }
        it->last = slot;
        if (key) *key = (stash_bytes){e.key, e.klen};
        if (value) *value = (stash_bytes){e.value, e.vlen};
        return 1;
    }
    return 0;
}

int map_iter_sync(iter_impl *it)
{
    stash_state *s = it->state;
    if (it->writes == s->w->writes) return 0;
    if (s->map_layouts != it->layout || !s->w->has_key || s->w->key_hash != it->key_hash ||
        s->seed != it->seed)
        return shm_fail(STASH_ESTALE, "the worker wrote since the iterator started");
    /* Only entries changed in place or appended, or removed: the slots hold. */
    shm_lookup l;
    shm_cursor c;
    stash_bytes raw;
    int rc = map_read(s, &l, &c, &raw);
    if (rc == STASH_ENOTFOUND) {
        it->blob = NULL; /* the map went: nothing more */
        it->rec = NULL;
    } else if (rc) {
        return rc;
    } else {
        it->blob = raw.data;
        it->blob_len = (uint32_t)raw.len;
        it->rec = c.rec;
    }
    it->writes = s->w->writes;
    return 0;
}

STASH_API int stash_iter_set_value(stash_iter *it, const void *value, size_t len)
{
    if (!it) return shm_refuse_null(__func__, "it");
    if (shm_null_bytes(value, len)) return shm_refuse_null(__func__, "value");
    iter_impl *x = (iter_impl *)it;
    if (x->type != ITER_MAP || !x->state)
        return shm_fail(-EINVAL, "only a started map iterator sets values");
    int rc = map_iter_sync(x);
    if (rc) return rc;
    stash_state *s = x->state;
    state_count(s->w, SHM_OPS_MAP, true);
    if (x->last == UINT32_MAX || !x->blob) return shm_fail(-EINVAL, "no entry returned to set");
    if (!x->rec) return state_refuse_write(s, s->w->kg);
    entry e = entry_at(s, x->blob, slot_get(x->blob, x->last));
    /* The key's bytes may go with the record the put replaces. */
    if (shm_reserve(&s->scratch2, &s->scratch2_cap, e.klen + 1u) < 0)
        return shm_fail(-ENOMEM, "out of memory");
    memcpy(s->scratch2, e.key, e.klen);
    shm_lookup l;
    shm_cursor c;
    if ((rc = map_for_write(s, &l, &c)) < 0) return rc;
    rc = map_put_one(s, &l, &c, s->scratch2, e.klen, value, len,
                     state_has_ttl(s) ? state_now(s) : 0);
    if (rc < 0) return rc;
    return map_iter_sync(x);
}

int map_iter_remove(iter_impl *it)
{
    stash_state *s = it->state;
    if (it->last == UINT32_MAX) return shm_fail(-EINVAL, "no entry returned to remove");
    if (!it->rec) return state_refuse_write(s, s->w->kg);
    shm_lookup l;
    int rc = state_lookup(s, &l);
    if (rc) return rc;
    shm_cursor c;
    if ((rc = state_find(s, &l, &c)) < 0) return rc;
    /* A record of the arena moves when rewritten; a private copy says
     * nothing, and the write count said it all. */
    if (s->w->records_in_arena && c.rec != it->rec)
        return shm_fail(STASH_ESTALE, "the map changed under its iterator");
    bool last_entry = hdr_get(it->blob).count == 1;
    rc = remove_slot(s, &l, &c, it->last);
    if (rc < 0) return rc;
    /* The layout is kept on removal, so iteration goes on over the same slots. */
    stash_bytes view = {0};
    if (!last_entry && (rc = state_view(s, &l, &c, &view)) < 0) return rc;
    it->rec = last_entry ? NULL : c.rec;
    it->blob = view.data;
    if (last_entry) it->pos = UINT32_MAX;
    it->last = UINT32_MAX;
    it->writes = s->w->writes;
    return 0;
}

bool map_bytes_valid(const uint8_t *v, size_t len, bool ttl)
{
    if (len < HDR_BYTES) return false;
    map_hdr h = hdr_get(v);
    if (h.nslots < MIN_SLOTS || (h.nslots & (h.nslots - 1)) || h.nslots > (len - HDR_BYTES) / 4)
        return false;
    uint32_t start = entries_start(h.nslots), live = 0, gone = 0;
    if ((uint64_t)start + h.end != len || h.dead > h.end || h.count == 0) return false;
    size_t extra = 8 + (ttl ? TTL_BYTES : 0);
    for (uint32_t i = 0; i < h.nslots; i++) {
        uint32_t off = slot_get(v, i);
        if (off == SLOT_EMPTY) continue;
        if (off == SLOT_GONE) {
            gone++;
            continue;
        }
        if (off < start || off > len || len - off < extra) return false;
        uint64_t klen = u32_at(v + off), vlen = u32_at(v + off + 4);
        if (klen + vlen > len - off - extra) return false;
        live++;
    }
    return live == h.count && gone == h.gone;
}

int map_bytes_each(const uint8_t *v, size_t len, bool ttl, state_item_fn *fn, void *ctx)
{
    if (len < HDR_BYTES) return 0;
    map_hdr h = hdr_get(v);
    size_t extra = 8 + (ttl ? TTL_BYTES : 0);
    for (uint32_t i = 0; i < h.nslots && HDR_BYTES + 4ull * (i + 1) <= len; i++) {
        uint32_t off = slot_get(v, i);
        if (off <= SLOT_GONE || off > len || len - off < extra) continue;
        uint64_t klen = u32_at(v + off), vlen = u32_at(v + off + 4);
        if (klen + vlen > len - off - extra) continue;
        stash_bytes k = {v + off + extra, klen}, val = {v + off + extra + klen, vlen};
        int rc = fn(ctx, i, &k, &val, ttl ? state_ts_get(v + off + 8) : 0);
        if (rc) return rc;
    }
    return 0;
}

bool map_drop_expired(uint8_t *m, size_t len, uint64_t ttl_ms, uint64_t now)
{
    map_hdr h = hdr_get(m);
    for (uint32_t i = 0; i < h.nslots; i++) {
        uint32_t off = slot_get(m, i);
        if (off <= SLOT_GONE || (size_t)off + 8 + TTL_BYTES > len) continue;
        if (!ttl_expired(state_ts_get(m + off + 8), ttl_ms, now)) continue;
        h.dead += 8 + TTL_BYTES + u32_at(m + off) + u32_at(m + off + 4);
        h.count--;
        h.gone++;
        slot_put(m, i, SLOT_GONE);
    }
    hdr_put(m, &h);
    return h.count > 0;
}

size_t map_bytes_retime(const uint8_t *v, size_t len, bool from_ttl, bool to_ttl, uint64_t now,
                        uint8_t *out)
{
    map_hdr h = hdr_get(v);
    uint32_t start = entries_start(h.nslots), end = start;
    size_t extra = 8 + (from_ttl ? TTL_BYTES : 0);
    memcpy(out, v, start);
    for (uint32_t i = 0; i < h.nslots; i++) {
        uint32_t off = slot_get(v, i);
        if (off <= SLOT_GONE || off > len || len - off < extra) continue;
        uint32_t klen = u32_at(v + off), vlen = u32_at(v + off + 4);
        if ((uint64_t)klen + vlen > len - off - extra) continue;
        slot_put(out, i, end);
        memcpy(out + end, v + off, 8);
        end += 8;
        if (to_ttl) {
            state_ts_put(out + end, from_ttl ? state_ts_get(v + off + 8) : now);
            end += TTL_BYTES;
        }
        memcpy(out + end, v + off + extra, (size_t)klen + vlen);
        end += klen + vlen;
    }
    h.end = end - start;
    h.dead = 0;
    hdr_put(out, &h);
    return end;
}
