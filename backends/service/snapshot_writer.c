/* SPDX-License-Identifier: MIT */
/*
 * snapshot_writer.c: stash_snapshot_writer_*: a savepoint written offline.
 * Entries are put by a worker of a heap arena of the writer's own (its file
 * removed once mapped), which owns every key group; the commit writes that
 * arena as a savepoint into a directory beside the destination and renames
 * it into place, so that the destination holds a whole savepoint or none.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends/service/service.h"
#include "backends/state/state.h"

#define WRITER_DEFAULT_SIZE (256ull << 20)

/* One worker's entries of one operator state: a part of its blob. */
typedef struct op_buf {
    uint8_t *data;
    size_t len, cap;
    uint32_t n; /* entries */
} op_buf;

/* A declared state: its handle, or a timer service's. */
typedef struct declared {
    char name[SHM_STATE_NAME];
    stash_kind kind;
    stash_state *state;
    stash_timers *timers;
    uint16_t id; /* its id in the savepoint's metadata */
} declared;

struct stash_snapshot_writer {
    ckpt_dest dest;
    stash_worker *w;
    ioe_engine *e;
    uint64_t id;
    uint64_t now_ms; /* the time the next put stamps, 0: the clock's */
    declared *states;
    uint32_t nstates;
    uint32_t op_p; /* workers of the operator state, 0 none */
    op_buf *op;    /* op_p x SHM_CATALOG_SIZE: worker w's entries of declared state d */
};

static uint64_t writer_clock(void *ctx)
{
    const stash_snapshot_writer *w = ctx;
    if (w->now_ms) return w->now_ms;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Functions for states whose values are only ever stored as they come. */
static int no_combine(const stash_bytes *acc, const stash_bytes *in, void *out, size_t cap,
                      size_t *len, void *ctx)
{
    (void)acc, (void)in, (void)out, (void)cap, (void)len, (void)ctx;
    return shm_fail(-ENOTSUP, "a savepoint writer stores accumulators, it does not combine them");
}

static int no_produce(const stash_bytes *acc, void *out, size_t cap, size_t *len, void *ctx)
{
    (void)acc, (void)out, (void)cap, (void)len, (void)ctx;
    return shm_fail(-ENOTSUP, "a savepoint writer stores accumulators, it does not make them");
}

static const stash_aggregate_fns no_aggregate = {
    .sz = sizeof(stash_aggregate_fns), no_produce, no_combine, no_produce, no_combine};

STASH_API void stash_snapshot_writer_abort(stash_snapshot_writer *w)
{
    if (!w) return;
    stash_worker_close(w->w);
    ioe_engine_close(w->e);
    ckpt_dest_close(&w->dest);
    for (uint32_t i = 0; w->op && i < w->op_p * SHM_CATALOG_SIZE; i++) free(w->op[i].data);
    free(w->op);
    free(w->states);
    free(w);
}

/* Makes the heap arena the writer builds in (in memory, named nowhere: a
 * writer that dies leaves nothing) and its worker. */
static int open_heap(stash_snapshot_writer *w, const stash_snapshot_writer_opts *o)
{
    stash_arena_opts ao = {.sz = sizeof(stash_arena_opts),
                           .size = o->size ? o->size : WRITER_DEFAULT_SIZE,
                           .max_parallelism = o->max_parallelism,
                           .backend = STASH_BACKEND_HEAP};
    stash_arena *a;
    int rc = shm_arena_make_private("a savepoint writer's heap", &ao, &a);
    if (rc) return rc;
    return service_worker_open_on(a,
                                  &(stash_worker_opts){.sz = sizeof(stash_worker_opts),
                                                       .parallelism = 1,
                                                       .clock = writer_clock,
                                                       .clock_ctx = w},
                                  &w->w);
}

STASH_API int stash_snapshot_writer_open(const char *path, const stash_snapshot_writer_opts *opts,
                                         stash_snapshot_writer **out)
{
    shm_clear_error();
    if (!path || !out) return shm_refuse_null(__func__, "path or out");
    stash_snapshot_writer_opts o;
    int rc = SHM_TAKE_OPTS(__func__, stash_snapshot_writer_opts, opts, &o);
    if (rc) return rc;
    if (o.max_parallelism > STASH_MAX_MAX_PARALLELISM)
        return shm_fail(-EINVAL, "a savepoint of %u key groups: at most %u", o.max_parallelism,
                        STASH_MAX_MAX_PARALLELISM);
    stash_snapshot_writer *w = calloc(1, sizeof *w);
    if (!w) return shm_fail(-ENOMEM, "out of memory");
    w->id = o.id ? o.id : 1;
    rc = ckpt_dest_open(path, &w->dest);
    w->op_p = o.op_parallelism;
    if (rc == 0 && w->op_p && !(w->op = calloc((size_t)w->op_p * SHM_CATALOG_SIZE, sizeof *w->op)))
        rc = shm_fail(-ENOMEM, "out of memory");
    if (rc == 0) rc = open_heap(w, &o);
    if (rc == 0) rc = ioe_engine_open(NULL, &w->e);
    if (rc == 0 && !(w->states = calloc(SHM_CATALOG_SIZE, sizeof *w->states)))
        rc = shm_fail(-ENOMEM, "out of memory");
    if (rc) {
        stash_snapshot_writer_abort(w);
        return rc;
    }
    *out = w;
    return 0;
}

static declared *declared_of(stash_snapshot_writer *w, const char *name)
{
    for (uint32_t i = 0; i < w->nstates; i++)
        if (strcmp(w->states[i].name, name) == 0) return &w->states[i];
    return NULL;
}

STASH_API int stash_snapshot_writer_state(stash_snapshot_writer *w, const stash_state_desc *given)
{
    shm_clear_error();
    stash_state_desc d0;
    if (!w || !given) return shm_refuse_null(__func__, "w or desc");
    int rc = SHM_TAKE_OPTS(__func__, stash_state_desc, given, &d0);
    if (rc) return rc;
    const stash_state_desc *desc = &d0;
    if (!desc->name) return shm_refuse_null(__func__, "desc->name");
    /* No state a reader refuses: one without a name or kind, or with TTL
     * options no registration makes (a timer service's included). */
    if (!desc->name[0]) return shm_fail(-EINVAL, "a state needs a name");
    if (desc->kind < STASH_VALUE || desc->kind > STASH_TIMERS)
        return shm_fail(-EINVAL, "state '%s': unknown kind %d", desc->name, (int)desc->kind);
    if ((rc = state_ttl_check(desc->name, desc->kind, &desc->ttl)) != 0) return rc;
    declared *d = declared_of(w, desc->name);
    if (d && d->kind != desc->kind)
        return shm_fail(STASH_EKIND, "state '%s' was declared with kind %d, not %d", desc->name,
                        (int)d->kind, (int)desc->kind);
    if (d) return 0;
    if (w->nstates == SHM_CATALOG_SIZE)
        return shm_fail(STASH_EFULL, "a savepoint of at most %u states", SHM_CATALOG_SIZE);
    if (strlen(desc->name) >= SHM_STATE_NAME)
        return shm_fail(-EINVAL, "state name '%s': at most %u bytes", desc->name,
                        SHM_STATE_NAME - 1);
    declared n = {.kind = desc->kind};
    snprintf(n.name, sizeof n.name, "%s", desc->name);
    if (desc->kind == STASH_TIMERS) {
        rc = stash_timers_get(w->w, desc->name, &n.timers);
        if (rc == 0) n.id = timers_state(n.timers)->id;
    } else {
        stash_state_desc s = {.sz = sizeof(stash_state_desc),
                              .name = desc->name,
                              .kind = desc->kind,
                              .ttl = desc->ttl};
        s.ttl.cleanup_every_record = 0;
        if (desc->kind == STASH_REDUCING) s.reduce = no_combine;
        if (desc->kind == STASH_AGGREGATING) s.aggregate = &no_aggregate;
        rc = stash_state_get(w->w, &s, &n.state);
        if (rc == 0) n.id = n.state->id;
        /* A savepoint holds every entry it is given: a put examines no
         * other entry for expiry, as by the put's own time (its entry's)
         * an older entry may have expired. */
        if (rc == 0) n.state->ttl.cleanup_entries = 0;
    }
    if (rc) return rc;
    w->states[w->nstates++] = n;
    return 0;
}

/* The declared state an entry names, or an error (NULL arguments, a state
 * not declared) in *rc. */
static declared *entry_state(stash_snapshot_writer *w, const stash_snapshot_entry *e,
                             const char *fn, int *rc)
{
    shm_clear_error();
    declared *d = w && e && e->state ? declared_of(w, e->state) : NULL;
    if (!w || !e || !e->state)
        *rc = shm_refuse_null(fn, "w, e or its state");
    else if (!d)
        *rc = shm_fail(STASH_ENOTFOUND, "state '%s' is not declared", e->state);
    return d;
}

/* The declared keyed state of e, its key made the worker's and (but for a
 * timer service's) its namespace the state's; NULL with *rc on a refusal. */
static declared *keyed_entry(stash_snapshot_writer *w, const stash_snapshot_entry *e,
                             const char *fn, int *rc)
{
    declared *d = entry_state(w, e, fn, rc);
    if (d && opstate_kind(d->kind))
        *rc = shm_fail(STASH_EKIND,
                       "'%s' is operator state: its entries go in by stash_snapshot_writer_op_put",
                       e->state);
    if (*rc == 0) *rc = stash_key_set(w->w, e->key.data, e->key.len);
    if (*rc == 0 && d->kind != STASH_TIMERS)
        *rc = stash_state_namespace(d->state, e->ns.data, e->ns.len);
    return *rc ? NULL : d;
}

STASH_API int stash_snapshot_writer_put(stash_snapshot_writer *w, const stash_snapshot_entry *e)
{
    int rc = 0;
    declared *d = keyed_entry(w, e, __func__, &rc);
    if (!d) return rc;
    if (d->kind == STASH_TIMERS)
        return stash_timer_register(d->timers, e->domain, e->ns.data, e->ns.len, e->timestamp);
    /* The entry's time is the TTL clock's: the worker's clock, or its
     * watermark for a TTL by event time. */
    uint64_t watermark = w->w->watermark;
    w->now_ms = e->ttl_ms;
    if (e->ttl_ms && d->state->ttl.time == STASH_TTL_EVENT_TIME) w->w->watermark = e->ttl_ms;
    if (d->kind == STASH_LIST)
        rc = stash_list_add(d->state, e->value.data, e->value.len);
    else if (d->kind == STASH_MAP)
        rc = stash_map_put(d->state, e->map_key.data, e->map_key.len, e->value.data, e->value.len);
    else
        rc = state_put_raw(d->state, e->value.data, e->value.len);
    w->now_ms = 0;
    w->w->watermark = watermark;
    return rc;
}

STASH_API int stash_snapshot_writer_delete(stash_snapshot_writer *w, const stash_snapshot_entry *e)
{
    int rc = 0;
    declared *d = keyed_entry(w, e, __func__, &rc);
    if (!d) return rc;
    if (d->kind == STASH_TIMERS)
        return stash_timer_delete(d->timers, e->domain, e->ns.data, e->ns.len, e->timestamp);
    if (d->kind == STASH_MAP && e->map_key.len)
        return stash_map_remove(d->state, e->map_key.data, e->map_key.len);
    return stash_state_clear(d->state);
}

/* Appends n bytes to b (p may be NULL when n is 0: an empty element). */
static int op_append(op_buf *b, const void *p, size_t n)
{
    if (n == 0) return 0;
    if (shm_reserve(&b->data, &b->cap, b->len + n) < 0) return shm_fail(-ENOMEM, "out of memory");
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

STASH_API int stash_snapshot_writer_op_put(stash_snapshot_writer *w, const stash_snapshot_entry *e)
{
    int rc = 0;
    declared *d = entry_state(w, e, __func__, &rc);
    if (!d) return rc;
    if (!opstate_recorded(d->kind))
        return shm_fail(STASH_EKIND,
                        "'%s' is keyed state: its entries go in by "
                        "stash_snapshot_writer_put",
                        e->state);
    if (e->worker >= w->op_p)
        return shm_fail(-EINVAL, "worker %u of operator state of %u workers", e->worker, w->op_p);
    op_buf *b = &w->op[e->worker * SHM_CATALOG_SIZE + (uint32_t)(d - w->states)];
    uint32_t a = (uint32_t)(d->kind == STASH_OP_BROADCAST ? e->map_key.len
                            : d->kind == STASH_TIMERS     ? 8
                                                          : e->value.len);
    rc = op_append(b, &a, 4);
    if (rc == 0 && d->kind == STASH_OP_BROADCAST) {
        uint32_t vl = (uint32_t)e->value.len;
        rc = op_append(b, &vl, 4);
        if (rc == 0) rc = op_append(b, e->map_key.data, e->map_key.len);
        if (rc == 0) rc = op_append(b, e->value.data, e->value.len);
    } else if (rc == 0 && d->kind == STASH_TIMERS) {
        /* A timer service has one watermark a worker: the newest put. */
        b->len = 0;
        b->n = 0;
        rc = op_append(b, &a, 4);
        if (rc == 0) rc = op_append(b, &e->timestamp, 8);
    } else if (rc == 0) {
        rc = op_append(b, e->value.data, e->value.len);
    }
    if (rc == 0) b->n++;
    return rc;
}

/* Whether the metadata of the savepoint, its operator state blobs in it,
 * stays within what a reader reads (CKPT_MAX_METADATA). */
static int metadata_fits(const stash_snapshot_writer *w, uint32_t maxp, const ckpt_blob *blobs)
{
    uint64_t op = 8 + 8ull * w->op_p;
    for (uint32_t i = 0; i < w->op_p; i++) op += ckpt_pad8(blobs[i].len);
    uint64_t bytes = sizeof(md_header) + (uint64_t)w->nstates * sizeof(ckpt_state) +
                     sizeof(md_file) + (uint64_t)maxp * sizeof(md_extent) + op + 4;
    if (bytes <= CKPT_MAX_METADATA) return 0;
    return shm_fail(-EFBIG,
                    "operator state of %llu bytes: a savepoint's metadata holds at most %u bytes",
                    (unsigned long long)op, CKPT_MAX_METADATA);
}

/* Writes the arena's key groups and the operator state as savepoint id in
 * w->tmp. */
static int write_savepoint(stash_snapshot_writer *w, ckpt_written *written)
{
    stash_arena *a = stash_worker_arena(w->w);
    uint32_t maxp = a->hdr->max_parallelism;
    uint32_t *pins = calloc(maxp, sizeof *pins);
    ckpt_blob *blobs = calloc(w->op_p ? w->op_p : 1, sizeof *blobs);
    uint8_t **mem = calloc(w->op_p ? w->op_p : 1, sizeof *mem);
    int rc = pins && blobs && mem ? 0 : shm_fail(-ENOMEM, "out of memory");
    for (uint32_t i = 0; rc == 0 && i < w->op_p; i++) {
        /* Worker i's blob: its states with entries, each id, kind, count, entries. */
        op_buf blob = {0};
        uint32_t count = 0;
        rc = op_append(&blob, &count, 4);
        for (uint32_t d = 0; rc == 0 && d < w->nstates; d++) {
            const op_buf *b = &w->op[i * SHM_CATALOG_SIZE + d];
            if (!b->n) continue;
            uint16_t head[2] = {w->states[d].id, (uint16_t)w->states[d].kind};
            rc = op_append(&blob, head, 4);
            if (rc == 0) rc = op_append(&blob, &b->n, 4);
            if (rc == 0) rc = op_append(&blob, b->data, b->len);
            count++;
        }
        memcpy(blob.data, &count, 4);
        mem[i] = blob.data;
        if (count) blobs[i] = (ckpt_blob){blob.data, blob.len};
    }
    if (rc == 0) rc = metadata_fits(w, maxp, blobs);
    for (uint32_t kg = 0; rc == 0 && kg < maxp; kg++) {
        int64_t pin = shm_table_pin(a, kg);
        if (pin < 0)
            rc = (int)pin;
        else
            pins[kg] = (uint32_t)pin;
    }
    if (rc == 0)
        rc = ckpt_write(a, pins,
                        &(ckpt_opts){.dir = &w->dest.tmp,
                                     .id = w->id,
                                     .savepoint = true,
                                     .engine = w->e,
                                     .op_parallelism = w->op_p,
                                     .op_blobs = w->op_p ? blobs : NULL},
                        written);
    for (uint32_t kg = 0; pins && kg < maxp; kg++)
        if (pins[kg]) shm_table_unpin(a, kg, pins[kg]);
    for (uint32_t i = 0; mem && i < w->op_p; i++) free(mem[i]);
    free(mem);
    free(blobs);
    free(pins);
    return rc;
}

STASH_API int stash_snapshot_writer_commit(stash_snapshot_writer *w, stash_snapshot_info *out)
{
    shm_clear_error();
    if (!w) return shm_refuse_null(__func__, "w");
    /* The options as a reader takes them (open keeps what it was given). */
    int rc = 0;
    if (w->id > CKPT_MAX_ID)
        rc = shm_fail(-EINVAL, "savepoint id %llu: at most %llu", (unsigned long long)w->id,
                      (unsigned long long)CKPT_MAX_ID);
    else if (w->op_p > STASH_MAX_WORKERS)
        rc = shm_fail(-EINVAL, "operator state of %u workers: at most %u", w->op_p,
                      STASH_MAX_WORKERS);
    ckpt_written written = {0};
    if (rc == 0) rc = write_savepoint(w, &written);
    if (rc == 0) rc = ckpt_dest_place(&w->dest, w->id);
    if (rc == 0 && out) {
        stash_arena *a = stash_worker_arena(w->w);
        *out = (stash_snapshot_info){.id = w->id,
                                     .created_ns = shm_now_ns(),
                                     .max_parallelism = a->hdr->max_parallelism,
                                     .nstates = w->nstates,
                                     .op_parallelism = w->op_p};
    }
    stash_snapshot_writer_abort(w);
    return rc;
}
