/* SPDX-License-Identifier: MIT */
/*
 * snapshot_api.c: stash_snapshot_*: a checkpoint or savepoint directory read
 * offline, without an arena: its states, and its keyed entries decoded (a
 * list one element at a time, a map one entry at a time, a timer as its
 * domain and time).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backends/checkpoint/ckpt_read.h"
#include "backends/checkpoint/job_merge.h"
#include "backends/state/state.h"

struct stash_snapshot {
    ckpt_view v;
    bool opened; /* v is open */
    ioe_engine *e;
    ckpt_state *states; /* v.nstates of them */
    stash_ttl *ttls;
};

STASH_API int stash_snapshot_open(const char *path, stash_snapshot **out)
{
    shm_clear_error();
    if (!path || !out) return shm_refuse_null(__func__, "path or out");
    stash_snapshot *s = calloc(1, sizeof *s);
    if (!s) return shm_fail(-ENOMEM, "out of memory");
    int rc = ioe_engine_open(NULL, &s->e);
    if (rc < 0) shm_fail(rc, "no I/O engine to read %s", path);
    if (rc == 0 && ckpt_url(path)) {
        /* Copied from the storage, read whole into memory, the copy removed. */
        ckpt_fetched f;
        rc = ckpt_url_fetch(path, NULL, &f);
        if (rc == 0) {
            rc = ckpt_view_open_path(f.path, s->e, &s->v);
            ckpt_url_release(&f);
        }
    } else if (rc == 0) {
        rc = ckpt_view_open_path(path, s->e, &s->v);
    }
    s->opened = rc == 0;
    if (rc == 0) {
        s->states = calloc(s->v.nstates ? s->v.nstates : 1, sizeof *s->states);
        s->ttls = calloc(s->v.nstates ? s->v.nstates : 1, sizeof *s->ttls);
        if (!s->states || !s->ttls) rc = shm_fail(-ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; rc == 0 && i < s->v.nstates; i++) {
        s->states[i] = ckpt_view_state(&s->v, i);
        state_ttl_of_options(s->states[i].options, &s->ttls[i]);
    }
    /* Every block and record checked before anything is given. */
    if (rc == 0 && s->v.max_parallelism) {
        int64_t n =
            ckpt_view_walk(&s->v, (stash_kg_range){0, s->v.max_parallelism - 1}, NULL, NULL);
        if (n < 0) rc = (int)n;
    }
    if (rc) {
        stash_snapshot_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

STASH_API void stash_snapshot_close(stash_snapshot *snap)
{
    if (!snap) return;
    if (snap->opened) ckpt_view_close(&snap->v);
    ioe_engine_close(snap->e);
    free(snap->states);
    free(snap->ttls);
    free(snap);
}

const ckpt_view *ckpt_snapshot_view(const stash_snapshot *snap)
{
    return &snap->v;
}

STASH_API int stash_snapshot_info_get(const stash_snapshot *snap, stash_snapshot_info *out)
{
    if (!snap || !out) return shm_refuse_null(__func__, "snap or out");
    *out = (stash_snapshot_info){.id = snap->v.id,
                                 .created_ns = snap->v.created_ns,
                                 .base_id = snap->v.base_id,
                                 .max_parallelism = snap->v.max_parallelism,
                                 .nstates = snap->v.nstates,
                                 .op_parallelism = snap->v.op_parallelism};
    for (uint32_t f = 0; f < snap->v.nfiles; f++) out->data_bytes += snap->v.files[f].len;
    return 0;
}

STASH_API int stash_snapshot_state(const stash_snapshot *snap, uint32_t i, stash_state_desc *out)
{
    if (!snap || !out) return shm_refuse_null(__func__, "snap or out");
    if (i >= snap->v.nstates)
        return shm_fail(-EINVAL, "state %u of a snapshot of %u states", i, snap->v.nstates);
    *out = (stash_state_desc){.sz = sizeof(stash_state_desc),
                              .name = snap->states[i].name,
                              .kind = (stash_kind)snap->states[i].kind,
                              .ttl = snap->ttls[i]};
    return 0;
}

/* A scan in progress: the caller's function, and what it returned. */
typedef struct scan {
    const stash_snapshot *snap;
    stash_snapshot_fn *fn;
    void *ctx;
    int user_rc;
    stash_snapshot_entry e;
} scan;

/* Hands one entry to the caller; a non-zero return stops the walk. */
static int give(scan *sc)
{
    int rc = sc->fn(sc->ctx, &sc->e);
    if (rc == 0) return 0;
    sc->user_rc = rc;
    return -ECANCELED;
}

static int give_item(void *ctx, uint32_t i, const stash_bytes *key, const stash_bytes *value,
                     uint64_t ts)
{
    scan *sc = ctx;
    sc->e.index = key ? 0 : i;
    sc->e.map_key = key ? *key : (stash_bytes){0};
    sc->e.value = *value;
    sc->e.ttl_ms = ts;
    return give(sc);
}

static int give_record(void *ctx, uint32_t kg, const snap_record *r)
{
    scan *sc = ctx;
    const stash_snapshot *s = sc->snap;
    uint32_t i = 0;
    while (i < s->v.nstates && s->states[i].id != r->state) i++;
    if (i == s->v.nstates)
        return shm_fail(STASH_ECORRUPT, "a record of state %u, which the metadata does not name",
                        r->state);
    bool ttl = s->ttls[i].ttl_ms > 0;
    stash_kind kind = (stash_kind)s->states[i].kind;
    sc->e = (stash_snapshot_entry){.kg = kg,
                                   .state = s->states[i].name,
                                   .kind = kind,
                                   .key = {r->key, r->klen},
                                   .ns = {r->ns, r->nslen}};
    if (kind == STASH_LIST) return list_bytes_each(r->value, r->vlen, ttl, give_item, sc);
    if (kind == STASH_MAP) return map_bytes_each(r->value, r->vlen, ttl, give_item, sc);
    if (kind == STASH_TIMERS) {
        /* The domain (1 byte) and time (8, big-endian) before the user's namespace. */
        uint64_t ts = 0;
        for (unsigned b = 1; b < TIMER_NS_PREFIX; b++) ts = ts << 8 | r->ns[b];
        sc->e.domain = r->ns[0] == STASH_EVENT_TIME ? STASH_EVENT_TIME : STASH_PROCESSING_TIME;
        sc->e.timestamp = ts;
        sc->e.ns = (stash_bytes){r->ns + TIMER_NS_PREFIX, r->nslen - TIMER_NS_PREFIX};
        return give(sc);
    }
    size_t head = ttl ? TTL_BYTES : 0;
    sc->e.ttl_ms = ttl ? state_ts_get(r->value) : 0;
    sc->e.value = (stash_bytes){r->value + head, r->vlen - head};
    return give(sc);
}

STASH_API int stash_snapshot_scan(stash_snapshot *snap, stash_kg_range range, stash_snapshot_fn *fn,
                                  void *ctx)
{
    shm_clear_error();
    if (!snap || !fn) return shm_refuse_null(__func__, "snap or fn");
    if (range.first > range.last || range.last >= snap->v.max_parallelism)
        return shm_fail(-EINVAL, "key groups %u..%u of a snapshot of %u", range.first, range.last,
                        snap->v.max_parallelism);
    scan sc = {.snap = snap, .fn = fn, .ctx = ctx};
    int64_t n = ckpt_view_walk_latest(&snap->v, range, give_record, &sc);
    if (n == -ECANCELED && sc.user_rc) return sc.user_rc;
    return n < 0 ? (int)n : 0;
}

static uint32_t u32_of(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The name and kind of the state id names, or NULL. */
static const ckpt_state *state_by_id(const stash_snapshot *s, uint16_t id)
{
    for (uint32_t i = 0; i < s->v.nstates; i++)
        if (s->states[i].id == id) return &s->states[i];
    return NULL;
}

STASH_API int stash_snapshot_op_scan(stash_snapshot *snap, stash_snapshot_fn *fn, void *ctx)
{
    shm_clear_error();
    if (!snap || !fn) return shm_refuse_null(__func__, "snap or fn");
    const ckpt_view *v = &snap->v;
    for (uint32_t w = 0; w < v->op_parallelism; w++) {
        const uint8_t *p = v->op_blobs[w].data, *end = p + v->op_blobs[w].len;
        if (v->op_blobs[w].len == 0) continue;
        uint32_t count = v->op_blobs[w].len >= 4 ? u32_of(p) : 0;
        p += 4;
        for (uint32_t k = 0; k < count; k++) {
            if (end - p < 8) goto short_blob;
            uint16_t id, kind;
            memcpy(&id, p, 2);
            memcpy(&kind, p + 2, 2);
            uint32_t n = u32_of(p + 4);
            p += 8;
            const ckpt_state *st = state_by_id(snap, id);
            if (!st)
                return shm_fail(STASH_ECORRUPT, "%s: worker %u's operator state names state %u",
                                v->meta_path, w, id);
            for (uint32_t i = 0; i < n; i++) {
                stash_snapshot_entry e = {
                    .state = st->name, .kind = (stash_kind)kind, .worker = w, .index = i};
                size_t head = kind == STASH_OP_BROADCAST ? 8 : 4;
                if ((size_t)(end - p) < head) goto short_blob;
                uint32_t a = u32_of(p), b = kind == STASH_OP_BROADCAST ? u32_of(p + 4) : 0;
                if ((uint64_t)(end - p) - head < (uint64_t)a + b) goto short_blob;
                if (kind == STASH_OP_BROADCAST) {
                    e.map_key = (stash_bytes){p + head, a};
                    e.value = (stash_bytes){p + head + a, b};
                } else if (kind == STASH_TIMERS) {
                    if (a != 8) goto short_blob;
                    memcpy(&e.timestamp, p + head, 8);
                } else {
                    e.value = (stash_bytes){p + head, a};
                }
                p += head + a + b;
                int rc = fn(ctx, &e);
                if (rc) return rc;
            }
        }
    }
    return 0;
short_blob:
    return shm_fail(STASH_ECORRUPT, "%s: an operator-state blob is cut short", v->meta_path);
}
