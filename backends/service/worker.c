/* SPDX-License-Identifier: MIT */
/*
 * worker.c: the worker handle: a process attached to an arena and joined to
 * its registry as index i of p, owning that index's key-group range.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "backends/state/opstate.h"
#include "backends/service/service.h"

/* The process's open workers: a forked child marks its copies as its
 * parent's, so that they refuse to work (their registry slots, pins and
 * LMDB handles are the parent's). The child has one thread when it runs. */
static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static stash_worker *open_workers;

static void mark_forked(void)
{
    for (stash_worker *w = open_workers; w; w = w->next_open) {
        w->forked = true;
        /* Every access needs a current key, and stash_key_set refuses. */
        worker_drop_key(w);
        w->key_cap = 0;
    }
    open_workers = NULL;
    pthread_mutex_init(&open_mu, NULL);
}

static void watch_forks(void)
{
    pthread_atfork(NULL, NULL, mark_forked);
}

static void add_open(stash_worker *w)
{
    pthread_once(&fork_once, watch_forks);
    pthread_mutex_lock(&open_mu);
    w->next_open = open_workers;
    open_workers = w;
    pthread_mutex_unlock(&open_mu);
}

static void remove_open(stash_worker *w)
{
    pthread_mutex_lock(&open_mu);
    stash_worker **p = &open_workers;
    while (*p && *p != w) p = &(*p)->next_open;
    if (*p) *p = w->next_open;
    pthread_mutex_unlock(&open_mu);
}

/* Opens the keyed store of w's slot and range, and what follows from the
 * arena and the options. A reader keeps watching for key groups to come: a
 * fallback may make them come again at any time, and it has no barrier. */
static int attach_store(stash_worker *w, stash_clock_fn *clock, void *clock_ctx)
{
    int rc = store_open(w->arena, w->slot, w->range, &w->store);
    if (rc < 0) return rc;
    if (ckpt_lazy_pending(w->arena) || w->reader) worker_watch_lazy(w);
    w->store->moves = &w->writes;
    w->records_in_arena = w->store->ops->in_arena;
    w->max_parallelism = w->arena->hdr->max_parallelism;
    w->clock = clock;
    w->clock_ctx = clock_ctx;
    return 0;
}

int service_worker_open_on(stash_arena *a, const stash_worker_opts *opts, stash_worker **out)
{
    stash_worker_opts o = *opts;
    if (o.parallelism == 0) o.parallelism = 1;
    stash_worker *w = calloc(1, sizeof *w);
    if (!w) {
        stash_arena_close(a);
        return shm_fail(-ENOMEM, "out of memory");
    }
    w->arena = a;
    int rc = shm_registry_join(w->arena, o.index, o.parallelism, &w->slot);
    if (rc < 0) {
        stash_arena_close(w->arena);
        free(w);
        return rc;
    }
    shm_slot *s = &w->arena->slots[w->slot];
    w->range = (stash_kg_range){s->kg_first, s->kg_last};
    rc = attach_store(w, o.clock, o.clock_ctx);
    if (rc < 0) {
        shm_registry_leave(w->arena, w->slot);
        stash_arena_close(w->arena);
        free(w);
        return rc;
    }
    w->parallelism = o.parallelism;
    w->on_cut = o.on_cut;
    w->cut_ctx = o.cut_ctx;
    shm_control *c = w->arena->control;
    atomic_store(&c->parallelism, o.parallelism);
    w->seen_done = atomic_load(&c->completed);
    w->seen_aborted = atomic_load(&c->aborted);
    /* A checkpoint the previous holder of this index already cut keeps that
     * cut: its operator state and its keyed state (pinned versions, or
     * snapshots the engine may have opened) go together; cutting it again
     * would pair this worker's operator state with the other's key groups. */
    w->cut_id = atomic_load(&c->workers[w->slot].acked);
    w->ops = &c->workers[w->slot].ops;
    add_open(w);
    /* A fallback of the arena that this index's last worker died before
     * going through: this one goes through it first. */
    rc = atomic_load(&c->fenced) ? worker_fenced(w) : worker_fall_back(w);
    if (rc == 0 && o.rollback) rc = worker_rollback(w);
    if (rc < 0) {
        stash_worker_close(w);
        return rc;
    }
    *out = w;
    return 0;
}

STASH_API int stash_worker_open(const char *name, const stash_worker_opts *opts, stash_worker **out)
{
    shm_clear_error();
    if (!name || !out) return shm_refuse_null(__func__, "name or out");
    stash_worker_opts o;
    int rc = SHM_TAKE_OPTS(__func__, stash_worker_opts, opts, &o);
    if (rc) return rc;
    stash_arena *a;
    rc = stash_arena_open(name, o.arena, &a);
    return rc ? rc : service_worker_open_on(a, &o, out);
}

STASH_API int stash_reader_open(const char *name, const stash_reader_opts *opts, stash_worker **out)
{
    shm_clear_error();
    stash_reader_opts o;
    stash_arena_opts ao;
    int rc = SHM_TAKE_OPTS(__func__, stash_reader_opts, opts, &o);
    if (rc == 0) rc = SHM_TAKE_OPTS(__func__, stash_arena_opts, o.arena, &ao);
    if (rc) return rc;
    if (!o.checkpoint_dir && !name) return shm_refuse_null(__func__, "name");
    if (!out) return shm_refuse_null(__func__, "out");
    stash_arena *a;
    rc = o.checkpoint_dir || o.at_checkpoint ? service_view_create(name, &ao, o.checkpoint_dir, &a)
                                             : stash_arena_open(name, &ao, &a);
    if (rc < 0) return rc;
    stash_worker *w = calloc(1, sizeof *w);
    if (!w) {
        stash_arena_close(a);
        return shm_fail(-ENOMEM, "out of memory");
    }
    w->arena = a;
    uint32_t rslot = 0;
    rc = shm_reader_join(w->arena, &rslot);
    if (rc < 0) {
        stash_arena_close(w->arena);
        free(w);
        return rc;
    }
    w->reader = true;
    w->slot = rslot; /* STASH_MAX_WORKERS + the reader slot's index */
    w->range = STASH_KG_RANGE_EMPTY;
    rc = attach_store(w, o.clock, o.clock_ctx);
    if (rc < 0) {
        shm_reader_leave(w->arena, rslot);
        stash_arena_close(w->arena);
        free(w);
        return rc;
    }
    add_open(w);
    *out = w;
    return 0;
}

static void free_states(stash_state *s)
{
    while (s) {
        stash_state *next = s->next;
        free(s->defval);
        free(s->ns);
        free(s->scratch);
        free(s->scratch2);
        free(s->keys_after);
        free(s->scan);
        opstate_free(s);
        free(s);
        s = next;
    }
}

/* Frees what the handle holds in this process's memory. */
static void free_worker(stash_worker *w)
{
    stash_arena_close(w->arena);
    timers_free_all(w);
    free_states(w->states);
    free(w->op_blobs);
    free(w->op_mem);
    free(w->key);
    free(w);
}

STASH_API void stash_worker_close(stash_worker *worker)
{
    if (!worker) return;
    if (worker->forked) {
        /* The slot, the pins and the store's handles stay the opener's. */
        worker->store->ops->forget(worker->store);
        free_worker(worker);
        return;
    }
    remove_open(worker);
    if (worker->reader) {
        store_close(worker->store);
        shm_reader_leave(worker->arena, worker->slot);
        free_worker(worker);
        return;
    }
    /* Leaving for good: the final operator state goes with the final keyed
     * state, once a checkpoint this worker cut has ended with the operator
     * state recorded at the cut. */
    bool has_opstate = false;
    for (stash_state *s = worker->states; s; s = s->next) has_opstate |= opstate_recorded(s->kind);
    if (has_opstate) {
        worker_await_cut_end(worker);
        worker_record_opstate(worker);
    }
    store_close(worker->store);
    shm_registry_leave(worker->arena, worker->slot);
    free_worker(worker);
}

STASH_API stash_arena *stash_worker_arena(const stash_worker *worker)
{
    return worker ? worker->arena : NULL;
}

STASH_API int stash_worker_info_get(const stash_worker *worker, stash_worker_info *out)
{
    if (!worker || !out) return shm_refuse_null(__func__, "worker or out");
    if (worker->forked) return worker_refuse_forked(worker, __func__);
    if (worker->reader) return shm_fail(-EINVAL, "%s: a reader has no registry slot", __func__);
    shm_registry_describe(worker->arena, worker->slot, out);
    return 0;
}
