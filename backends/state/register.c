/* SPDX-License-Identifier: MIT */
/*
 * register.c: a worker's state handles: a state registered in the arena's
 * catalog by name, kind and options, its handle set up (operator state
 * loaded from the restored or committed blobs).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backends/state/opstate.h"

#define DEFAULT_CLEANUP_ENTRIES 5u

void state_options_of_ttl(const stash_ttl *ttl, uint8_t out[32])
{
    memset(out, 0, 32);
    memcpy(out, &ttl->ttl_ms, sizeof ttl->ttl_ms);
    out[8] = (uint8_t)ttl->update;
    out[9] = (uint8_t)ttl->visibility;
    out[STATE_OPT_CLEANUP_FULL_SNAPSHOT] = ttl->cleanup_full_snapshot != 0;
    out[STATE_OPT_EVENT_TIME] = ttl->time == STASH_TTL_EVENT_TIME;
}

int state_ttl_check(const char *name, stash_kind kind, const stash_ttl *ttl)
{
    if (ttl->update > STASH_TTL_ON_READ_AND_WRITE ||
        ttl->visibility > STASH_TTL_RETURN_EXPIRED_IF_NOT_CLEANED || ttl->update < 0 ||
        ttl->visibility < 0 ||
        (ttl->time != STASH_TTL_PROCESSING_TIME && ttl->time != STASH_TTL_EVENT_TIME))
        return shm_fail(-EINVAL, "state '%s': bad TTL options", name);
    if ((opstate_kind(kind) || kind == STASH_TIMERS) && ttl->ttl_ms)
        return shm_fail(-EINVAL, "%s '%s' takes no TTL",
                        kind == STASH_TIMERS ? "timer service" : "operator state", name);
    return 0;
}

void state_ttl_of_options(const uint8_t options[32], stash_ttl *out)
{
    *out = (stash_ttl){.update = options[8], .visibility = options[9]};
    memcpy(&out->ttl_ms, options, sizeof out->ttl_ms);
    out->cleanup_full_snapshot = options[STATE_OPT_CLEANUP_FULL_SNAPSHOT];
    out->time = options[STATE_OPT_EVENT_TIME] ? STASH_TTL_EVENT_TIME : STASH_TTL_PROCESSING_TIME;
}

STASH_API int stash_state_describe(stash_arena *arena, const char *name, stash_state_desc *out)
{
    shm_clear_error();
    if (!arena || !name || !out) return shm_refuse_null(__func__, "arena, name or out");
    for (uint32_t i = 0; i < SHM_CATALOG_SIZE; i++) {
        const shm_catalog_entry *e = &arena->catalog[i];
        if (!atomic_load_explicit(&e->used, memory_order_acquire) || strcmp(e->name, name) != 0)
            continue;
        *out = (stash_state_desc){
            .sz = sizeof(stash_state_desc), .name = name, .kind = (stash_kind)e->kind};
        state_ttl_of_options(e->options, &out->ttl);
        return 0;
    }
    return shm_fail(STASH_ENOTFOUND, "%s: no state '%s' is registered", arena->path, name);
}

static int check_desc(const stash_state_desc *d)
{
    if (!d || !d->name) return shm_fail(-EINVAL, "a state needs a name");
    if (d->kind == STASH_TIMERS)
        return shm_fail(-EINVAL, "state '%s': a timer service comes from stash_timers_get",
                        d->name);
    if (d->kind < STASH_VALUE || d->kind > STASH_OP_BROADCAST)
        return shm_fail(-EINVAL, "state '%s': unknown kind %d", d->name, (int)d->kind);
    if (d->kind == STASH_REDUCING && !d->reduce)
        return shm_fail(-EINVAL, "reducing state '%s' needs a reduce function", d->name);
    if (d->kind == STASH_AGGREGATING &&
        (!d->aggregate || !d->aggregate->create || !d->aggregate->add || !d->aggregate->result))
        return shm_fail(-EINVAL, "aggregating state '%s' needs create, add and result functions",
                        d->name);
    return state_ttl_check(d->name, d->kind, &d->ttl);
}

/* The worker's handle on the state desc names, registered if need be. */
static int get_state(stash_worker *worker, const stash_state_desc *desc, stash_state **out)
{
    int rc = 0;
    /* Registered already by this worker: the same state, as Flink hands out
     * one state object per name (a second copy of operator state would
     * diverge from the first and be merged with it at the next cut). */
    for (stash_state *s = worker->states; s; s = s->next) {
        const shm_catalog_entry *e = &worker->arena->catalog[s->id - 1];
        if (strcmp(e->name, desc->name) != 0) continue;
        if (s->kind != desc->kind || state_has_ttl(s) != (desc->ttl.ttl_ms > 0))
            return shm_fail(STASH_EKIND, "state '%s' is registered as kind %u %s TTL", desc->name,
                            s->kind, state_has_ttl(s) ? "with" : "without");
        *out = s;
        return 0;
    }
    uint8_t options[32];
    state_options_of_ttl(&desc->ttl, options);
    int id;
    if (worker->reader && opstate_recorded(desc->kind))
        return shm_fail(-EINVAL, "state '%s': a reader has no %s", desc->name,
                        desc->kind == STASH_TIMERS ? "timer service" : "operator state");
    else if (worker->reader) /* it only reads: what a worker registered, as registered */
        id =
            shm_catalog_find(worker->arena, desc->name, (uint32_t)desc->kind, desc->ttl.ttl_ms > 0);
    else
        id = shm_catalog_register(worker->arena, desc->name, (uint32_t)desc->kind, options);
    if (id < 0) return id;
    stash_state *s = calloc(1, sizeof *s);
    if (!s) return shm_fail(-ENOMEM, "out of memory");
    s->w = worker;
    s->id = (uint16_t)id;
    s->kind = desc->kind;
    s->ttl = desc->ttl;
    if (!s->ttl.cleanup_entries) s->ttl.cleanup_entries = DEFAULT_CLEANUP_ENTRIES;
    s->reduce = desc->reduce;
    if (desc->aggregate) s->agg = *desc->aggregate;
    s->ctx = desc->ctx;
    if (desc->default_value.len) {
        s->defval = malloc(desc->default_value.len);
        if (!s->defval) {
            free(s);
            return shm_fail(-ENOMEM, "out of memory");
        }
        memcpy(s->defval, desc->default_value.data, desc->default_value.len);
        s->deflen = desc->default_value.len;
    }
    if (opstate_recorded(s->kind)) {
        rc = worker->op_blobs ? opstate_load(s, worker->op_p, worker->op_blobs)
                              : opstate_load_committed(s);
        if (rc < 0) {
            free(s->defval);
            free(s);
            return rc;
        }
    }
    state_namespace_set(s, 0);
    s->fetch_class = SHM_CLASS_LARGE;
    s->fetch_bytes = SHM_FETCH_ANY;
    s->next = worker->states;
    worker->states = s;
    worker->has_ttl |= state_has_ttl(s);
    worker->ttl_every_record |= state_has_ttl(s) && desc->ttl.cleanup_every_record;
    *out = s;
    return 0;
}

STASH_API int stash_state_get(stash_worker *worker, const stash_state_desc *desc, stash_state **out)
{
    shm_clear_error();
    if (!worker || !desc || !out) return shm_refuse_null(__func__, "worker, desc or out");
    if (worker->forked) return worker_refuse_forked(worker, __func__);
    stash_state_desc d;
    stash_aggregate_fns agg;
    int rc = SHM_TAKE_OPTS(__func__, stash_state_desc, desc, &d);
    if (rc == 0 && d.aggregate) {
        rc = SHM_TAKE_OPTS(__func__, stash_aggregate_fns, d.aggregate, &agg);
        d.aggregate = &agg;
    }
    if (rc == 0) rc = check_desc(&d);
    return rc ? rc : get_state(worker, &d, out);
}

int state_get_timers(stash_worker *worker, const char *name, stash_state **out)
{
    return get_state(
        worker,
        &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = name, .kind = STASH_TIMERS},
        out);
}
