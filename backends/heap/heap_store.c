/* SPDX-License-Identifier: MIT */
/*
 * heap_store.c: the heap store: records in the arena's keyed tables (one
 * per key group, shm/table.h), versioned so that checkpoints read a key
 * group as of a pinned version while its owner writes on.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backends/store/store.h"

static int heap_open(stash_arena *a, store **out)
{
    store *st = calloc(1, sizeof *st);
    if (!st) return shm_fail(-ENOMEM, "out of memory");
    store_init(st, &heap_store_ops, a);
    *out = st;
    return 0;
}

static void heap_close(store *st)
{
    free(st);
}

/* The lookup of a record met by a walk, with its key and namespace copied
 * into *buf: the bytes outlive the record a delete retires. */
static int lookup_of(const shm_rec *rec, uint32_t kg, uint32_t hash, uint8_t **buf, size_t *cap,
                     shm_lookup *l)
{
    size_t n = (size_t)rec->klen + rec->nslen;
    if (shm_reserve(buf, cap, n + 1) < 0) return shm_fail(-ENOMEM, "out of memory");
    memcpy(*buf, shm_rec_key(rec), n);
    *l = (shm_lookup){.kg = kg,
                      .hash = hash,
                      .state = rec->state,
                      .klen = rec->klen,
                      .nslen = rec->nslen,
                      .key = *buf,
                      .ns = *buf + rec->klen};
    return 0;
}

static int clear_kg(stash_arena *a, uint32_t kg)
{
    uint8_t *buf = NULL;
    size_t cap = 0;
    int rc = 0;
    uint32_t pos = 0, hash;
    for (shm_rec *rec; rc == 0 && (rec = shm_table_next(a, kg, &pos, &hash));) {
        if (!shm_rec_live(rec)) continue;
        shm_lookup l;
        shm_cursor cur;
        rc = lookup_of(rec, kg, hash, &buf, &cap, &l);
        if (rc == 0) rc = shm_table_find(a, &l, &cur);
        if (rc == 0) rc = shm_table_delete(a, &l, &cur);
    }
    free(buf);
    return rc;
}

static int heap_clear(store *st, stash_kg_range range)
{
    int rc = 0;
    for (uint32_t kg = range.first; rc == 0 && kg <= range.last; kg++) rc = clear_kg(st->arena, kg);
    return rc;
}

static int64_t heap_kg_entries(store *st, uint32_t kg)
{
    return (int64_t)atomic_load(&st->arena->tables[kg].count);
}

static int heap_find(store *st, const shm_lookup *l, shm_cursor *c, bool for_write)
{
    if (for_write) shm_table_tend(st->arena, l->kg);
    return shm_table_find(st->arena, l, c);
}

static int heap_read_owned(store *st, const shm_lookup *l, shm_cursor *c, stash_bytes *out,
                           bool for_write)
{
    (void)for_write; /* the record found is the one a write goes through */
    int rc = shm_table_find(st->arena, l, c);
    if (rc < 0) return rc;
    if (!shm_rec_live(c->rec)) return STASH_ENOTFOUND;
    *out = (stash_bytes){shm_rec_value(c->rec),
                         atomic_load_explicit(&c->rec->vlen, memory_order_relaxed)};
    return 0;
}

static int64_t heap_read_copy(store *st, const shm_lookup *l, uint8_t **buf, size_t *cap)
{
    return shm_table_read_copy(st->arena, st->slot, l, buf, cap);
}

/* A find waits for its index group before it learns where its record is.
 * Fetched ahead, every lookup's group loads at once, and then, once they
 * are near, every record they name; for the few lookups whose home group
 * holds no slot of their tag, the next group, then its record. */
static void heap_fetch_ahead(store *st, const shm_lookup *l, size_t n, int step)
{
    const stash_arena *a = st->arena;
    if (step == STORE_FETCH_FIRST) {
        for (size_t i = 0; i < n; i++) shm_table_prefetch(a, l[i].kg, l[i].hash);
        return;
    }
    size_t away[64], naway = 0;
    for (size_t i = 0; i < n; i++)
        if (!shm_table_prefetch_record(a, l[i].kg, l[i].hash, 0) && naway < 64) away[naway++] = i;
    for (size_t j = 0; j < naway; j++)
        shm_table_prefetch_record(a, l[away[j]].kg, l[away[j]].hash, 1);
}

static int heap_rec_new(store *st, const shm_lookup *l, size_t cap, shm_rec **out)
{
    return shm_rec_new(st->arena, l, cap, out);
}

static bool heap_rec_mutable(store *st, uint32_t kg, const shm_rec *rec)
{
    return shm_rec_mutable(&st->arena->tables[kg], rec);
}

static uint64_t heap_rec_capacity(const store *st, const shm_rec *rec)
{
    return shm_rec_capacity(st->arena, rec);
}

static bool heap_write_begin(store *st, uint32_t kg, shm_rec *rec, const shm_region *r, unsigned n)
{
    return shm_rec_write_begin(st->arena, kg, rec, r, n);
}

static int heap_write_end(store *st, uint32_t kg, shm_rec *rec)
{
    shm_rec_write_end(&st->arena->tables[kg], rec);
    return 0;
}

static int heap_publish(store *st, const shm_lookup *l, shm_cursor *c, shm_rec *rec)
{
    int rc = shm_table_publish(st->arena, l, c, rec);
    if (rc) shm_free(st->arena, shm_off_of(st->arena, rec));
    return rc;
}

static int heap_delete(store *st, const shm_lookup *l, shm_cursor *c)
{
    return shm_table_delete(st->arena, l, c);
}

static int heap_view(store *st, const shm_lookup *l, shm_cursor *c, stash_bytes *out)
{
    (void)st, (void)l;
    *out = (stash_bytes){shm_rec_value(c->rec),
                         atomic_load_explicit(&c->rec->vlen, memory_order_relaxed)};
    return 0;
}

/* A walk enters a key group once the table's pending work (a growth due or
 * under way, a sweep) is done, so that the owner's clears and updates of
 * the entries walked move none (only a growth moves them, and only new
 * entries start one); a growth after that makes the walk stale. */
static int heap_next(store *st, uint32_t kg, uint16_t state, store_walk *w, store_entry *out)
{
    stash_arena *a = st->arena;
    shm_table *t = &a->tables[kg];
    if (!w->entered) {
        for (int i = 0; i < 1 << 16 && shm_table_untended(t); i++) shm_table_maintain(a, kg, 64);
        w->entered = true;
        w->layout = atomic_load(&t->resizes);
    } else if (atomic_load(&t->resizes) != w->layout || atomic_load(&t->old_index)) {
        return shm_fail(STASH_ESTALE, "key group %u's index grew under its keys iterator", kg);
    }
    for (shm_rec *r; (r = shm_table_next(a, kg, &w->pos, NULL));) {
        if (r->state != state || !shm_rec_live(r)) continue;
        *out = (store_entry){.key = {shm_rec_key(r), r->klen},
                             .ns = {shm_rec_ns(r), r->nslen},
                             .value = {shm_rec_value(r), atomic_load(&r->vlen)}};
        return 1;
    }
    return 0;
}

static void heap_ttl_cleanup(store *st, uint32_t kg, uint16_t state, uint32_t budget,
                             store_expired_fn *expired, void *ctx)
{
    stash_arena *a = st->arena;
    shm_table *t = &a->tables[kg];
    bool wrapped = false;
    for (; budget > 0; budget--) {
        uint32_t hash;
        shm_rec *rec = shm_table_next(a, kg, &t->cleanup_pos, &hash);
        if (!rec) {
            /* The end of the table: on from the start, once. */
            if (wrapped) return;
            wrapped = true;
            t->cleanup_pos = 0;
            budget++;
            continue;
        }
        if (rec->state != state || !shm_rec_live(rec) ||
            !expired(ctx, shm_rec_value(rec), atomic_load(&rec->vlen)))
            continue;
        shm_lookup l = {.kg = kg,
                        .hash = hash,
                        .state = rec->state,
                        .klen = rec->klen,
                        .nslen = rec->nslen,
                        .key = shm_rec_key(rec),
                        .ns = shm_rec_ns(rec)};
        shm_cursor c;
        if (shm_table_find(a, &l, &c) == 0) shm_table_delete(a, &l, &c);
    }
}

typedef struct emitter {
    store_emit_fn *emit;
    void *ctx;
} emitter;

static int emit_change(const shm_rec *r, bool deleted, void *ctx)
{
    emitter *e = ctx;
    store_record out = {.state = r->state,
                        .klen = r->klen,
                        .nslen = r->nslen,
                        .flags = deleted ? STORE_REC_DELETED : 0,
                        .vlen = deleted ? 0 : atomic_load_explicit(&r->vlen, memory_order_relaxed),
                        .key = shm_rec_key(r),
                        .ns = shm_rec_ns(r),
                        .value = shm_rec_value((shm_rec *)r)};
    return e->emit(e->ctx, &out);
}

static int emit_record(const shm_rec *r, void *ctx)
{
    return emit_change(r, false, ctx);
}

static int heap_snapshot(store *st, uint32_t kg, const store_cut *cut, store_emit_fn *emit,
                         void *ctx)
{
    emitter e = {emit, ctx};
    if (cut->base_id)
        return shm_table_walk_delta(st->arena, kg, cut->base_pin, cut->pin, emit_change, &e);
    return shm_table_walk_at(st->arena, kg, cut->pin, emit_record, &e);
}

typedef struct scanner {
    uint16_t state;
    store_emit_fn *emit;
    void *ctx;
} scanner;

static int scan_record(const shm_rec *r, stash_bytes value, void *ctx)
{
    scanner *sc = ctx;
    if (r->state != sc->state) return 0;
    store_record out = {.state = r->state,
                        .klen = r->klen,
                        .nslen = r->nslen,
                        .vlen = (uint32_t)value.len,
                        .key = shm_rec_key(r),
                        .ns = shm_rec_ns(r),
                        .value = value.data};
    return sc->emit(sc->ctx, &out);
}

static int heap_scan(store *st, uint32_t kg, uint16_t state, store_emit_fn *emit, void *ctx)
{
    if (st->slot < STASH_MAX_WORKERS)
        return shm_fail(-EINVAL, "key group %u: only a reader scans a key group it does not own",
                        kg);
    scanner sc = {state, emit, ctx};
    return shm_table_scan(st->arena, kg, st->slot, scan_record, &sc);
}

/* Sized for what it is about to hold: no rehash while records go in. */
static int heap_restore_begin(store *st, uint32_t kg, uint64_t records)
{
    return shm_table_reserve(st->arena, kg, records);
}

static int heap_restore(store *st, const shm_lookup *l, const store_record *r)
{
    stash_arena *a = st->arena;
    shm_cursor c;
    shm_rec *rec;
    shm_table_tend(a, l->kg);
    int rc = shm_table_find(a, l, &c);
    if (!rc && (r->flags & STORE_REC_DELETED)) return shm_table_delete(a, l, &c);
    if (!rc) rc = shm_rec_new(a, l, r->vlen, &rec);
    if (rc) return rc;
    if (r->vlen) memcpy(shm_rec_value(rec), r->value, r->vlen);
    atomic_store_explicit(&rec->vlen, r->vlen, memory_order_relaxed);
    return heap_publish(st, l, &c, rec);
}

const store_ops heap_store_ops = {
    .name = "heap",
    .in_arena = true,
    .open = heap_open,
    .close = heap_close,
    .forget = heap_close,
    .clear = heap_clear,
    .kg_entries = heap_kg_entries,
    .find = heap_find,
    .read_owned = heap_read_owned,
    .read_copy = heap_read_copy,
    .fetch_ahead = heap_fetch_ahead,
    .rec_new = heap_rec_new,
    .rec_mutable = heap_rec_mutable,
    .rec_capacity = heap_rec_capacity,
    .write_begin = heap_write_begin,
    .write_end = heap_write_end,
    .publish = heap_publish,
    .delete = heap_delete,
    .view = heap_view,
    .next = heap_next,
    .scan = heap_scan,
    .ttl_cleanup = heap_ttl_cleanup,
    .snapshot = heap_snapshot,
    .restore_begin = heap_restore_begin,
    .restore = heap_restore,
};
