/* SPDX-License-Identifier: MIT */
/*
 * barrier.c: the worker's side of checkpoints (the barrier between records,
 * the rollback of a replacement) and the requests control commands make to
 * the engine through the control block (service.h has the protocol).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/checkpoint/rados_job.h"
#include "backends/state/opstate.h"
#include "backends/service/service.h"

void service_release_cuts(stash_arena *a)
{
    for (uint32_t kg = 0; kg < a->hdr->max_parallelism; kg++) {
        uint32_t v = atomic_exchange(&a->tables[kg].cut, 0);
        if (v) shm_table_unpin(a, kg, v);
    }
}

/* Releases the cuts of w's own key groups (taken for a checkpoint given up). */
static void release_own_cuts(stash_worker *w)
{
    for (uint32_t kg = w->range.first; kg <= w->range.last; kg++) {
        uint32_t v = atomic_exchange(&w->arena->tables[kg].cut, 0);
        if (v) shm_table_unpin(w->arena, kg, v);
    }
}

int worker_record_opstate(stash_worker *w)
{
    shm_control *c = w->arena->control;
    shm_ctl_worker *cw = &c->workers[w->slot];
    op_buf b = {0};
    shm_off off = 0;
    int rc = opstate_encode(w, &b);
    uint64_t len = b.len;
    if (rc == 0) rc = shm_blob_put(w->arena, b.data, len, &off);
    free(b.data);
    if (rc < 0) return rc;
    /* The engine moves pending blobs to committed under the lock. */
    rc = shm_lock_acquire(&c->lock, NULL, NULL);
    if (rc < 0) {
        shm_blob_free(w->arena, off);
        return rc;
    }
    shm_blob_free(w->arena, atomic_exchange(&cw->pending.off, 0));
    atomic_store(&cw->pending.len, len);
    atomic_store(&cw->pending.parallelism, w->parallelism);
    atomic_store(&cw->pending.off, off);
    shm_lock_release(&c->lock);
    return 0;
}

/* Whether the engine already cut w's key groups (it joined while they were
 * free and the checkpoint was starting): then that cut stands. */
static bool cut_by_engine(stash_worker *w)
{
    for (uint32_t kg = w->range.first; kg <= w->range.last; kg++)
        if (atomic_load(&w->arena->tables[kg].cut)) return true;
    return false;
}

/* Cuts checkpoint id: the worker's on_cut called, operator state
 * recorded, key groups pinned for the engine, the acknowledgement stored,
 * the engine woken. */
static int cut(stash_worker *w, uint64_t id)
{
    stash_arena *a = w->arena;
    shm_control *c = a->control;
    shm_ctl_worker *cw = &c->workers[w->slot];
    w->cut_id = id;
    /* An engine that died leaves its request behind: nobody would release the pins. */
    if (!shm_service_alive(a, NULL)) return 0;
    uint64_t t0 = shm_clock_ns();
    /* What on_cut writes is in this checkpoint: not so where the engine's
     * cut stands (with an operator state recorded before). */
    bool engine_cut = cut_by_engine(w);
    int rc = 0;
    if (!engine_cut && w->on_cut && (rc = w->on_cut(w, id, w->cut_ctx)) < 0 && !stash_errmsg()[0])
        shm_fail(rc, "worker %u: its on_cut failed checkpoint %llu", w->slot,
                 (unsigned long long)id);
    /* Writes are in the cut once committed. */
    if (rc >= 0) rc = worker_commit(w, false);
    if (rc == 0) rc = engine_cut ? 1 : worker_record_opstate(w);
    uint32_t holder = atomic_load(&c->service_reader);
    int err = rc < 0 ? rc : 0; /* the engine names it when it finds a key group uncut */
    /* The engine only walks its cuts; a chain's then stay as bases. */
    for (uint32_t kg = w->range.first; rc == 0 && kg <= w->range.last; kg++) {
        int64_t v = shm_table_pin_for(a, kg, holder, true);
        if (v > 0) atomic_store(&a->tables[kg].cut, (uint32_t)v);
        if (v < 0 && !err) err = (int)v;
    }
    atomic_store(&cw->cut_error, err);
    /* The time full snapshots of TTL states leave expired entries out by. */
    atomic_store(&cw->cut_clock_ms, worker_clock_ms(w));
    atomic_store(&cw->pause_ns, shm_clock_ns() - t0);
    atomic_store(&cw->acked, id);
    if (atomic_load(&c->aborted) >= id) release_own_cuts(w);
    shm_futex_wake(&c->wake);
    return rc < 0 ? rc : 0;
}

/* Flink's background cleanup: at most every TTL_SWEEP_MS of barriers, a
 * few entries of each TTL state in one of the worker's key groups, in turn,
 * so that entries nobody touches again still go. */
#define TTL_SWEEP_MS 50u
static void ttl_sweep(stash_worker *w)
{
    uint64_t now = shm_clock_ns();
    if (w->range.first > w->range.last || now - w->ttl_swept_ns < TTL_SWEEP_MS * 1000000ull) return;
    w->ttl_swept_ns = now;
    w->writes++; /* entries may go: iterators of this worker are stale */
    uint32_t n = w->range.last - w->range.first + 1;
    uint32_t kg = w->range.first + w->ttl_sweep_kg++ % n;
    /* One a lazy restore has yet to bring has nothing to clean (and may be
     * being written by whoever brings it). */
    if (atomic_load(&w->arena->tables[kg].lazy)) return;
    for (stash_state *s = w->states; s; s = s->next)
        if (state_has_ttl(s)) state_ttl_cleanup(s, kg);
}

/* A sign of life for `stash status` (a worker that stops reaching
 * barriers shows): the coarse clock, read without a syscall, stored only
 * when it has ticked (every few ms). */
static void heartbeat(stash_worker *w)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    _Atomic uint64_t *beat = &w->arena->slots[w->slot].heartbeat_ns;
    if (atomic_load_explicit(beat, memory_order_relaxed) < now)
        atomic_store_explicit(beat, now, memory_order_relaxed);
}

int worker_fenced(stash_worker *w)
{
    shm_control *c = w->arena->control;
    char why[SHM_CTL_DETAIL];
    int rc = shm_lock_acquire(&c->lock, NULL, NULL);
    if (rc < 0) return rc;
    memcpy(why, c->fenced_why, sizeof why);
    shm_lock_release(&c->lock);
    why[sizeof why - 1] = 0;
    return shm_fail(STASH_EFENCED, "%s: worker %u: %s", w->arena->path, w->slot, why);
}

STASH_API int stash_barrier(stash_worker *worker, stash_event *event)
{
    if (__builtin_expect(!worker || !event, 0)) return shm_refuse_null(__func__, "worker or event");
    if (__builtin_expect(worker->forked, 0)) return worker_refuse_forked(worker, __func__);
    if (__builtin_expect(worker->reader, 0))
        return shm_fail(-EINVAL, "stash_barrier: a reader joins no barrier");
    if (__builtin_expect(worker->in_batch, 0))
        return shm_fail(-EINVAL,
                        "stash_barrier: worker %u is running a batch: no barrier falls "
                        "inside one",
                        worker->slot);
    shm_control *c = worker->arena->control;
    heartbeat(worker);
    /* Its host's service lost its place in the job: another serves these workers. */
    if (__builtin_expect(atomic_load_explicit(&c->fenced, memory_order_acquire), 0))
        return worker_fenced(worker);
    /* Before a cut: what it pins is the state the arena fell back to. */
    if (__builtin_expect(
            atomic_load_explicit(&c->fallback_gen, memory_order_acquire) !=
                atomic_load_explicit(&c->workers[worker->slot].fallback_seen, memory_order_relaxed),
            0)) {
        int rc = worker_fall_back(worker);
        if (rc < 0) return rc;
    }
    uint64_t pending = atomic_load_explicit(&c->pending, memory_order_acquire);
    if (pending && pending != worker->cut_id) {
        shm_clear_error();
        int rc = cut(worker, pending);
        if (rc < 0) return rc;
    } else {
        if (worker->has_ttl) ttl_sweep(worker);
        /* Between checkpoints too, so that other processes see the writes. */
        int rc = worker_commit(worker, true);
        if (rc < 0) return rc;
    }
    if (worker->rolled_back_to) {
        *event = (stash_event){STASH_ROLLED_BACK, worker->rolled_back_to, worker->rollback_why};
        worker->rolled_back_to = 0;
        return 1;
    }
    uint64_t done = atomic_load_explicit(&c->completed, memory_order_acquire);
    if (done > worker->seen_done) {
        worker->seen_done = done;
        *event = (stash_event){STASH_CHECKPOINT_COMPLETE, done, ""};
        return 1;
    }
    uint64_t aborted = atomic_load_explicit(&c->aborted, memory_order_acquire);
    if (aborted > worker->seen_aborted) {
        worker->seen_aborted = aborted;
        *event = (stash_event){STASH_CHECKPOINT_ABORTED, aborted, ""};
        return 1;
    }
    return 0;
}

/* Empties the worker's key groups: what a rollback restores into. */
static int clear_kgs(void *ctx)
{
    stash_worker *w = ctx;
    /* A store whose cut the engine opens reads the key group when it takes
     * the cut, not when it was cut: a cut the dead owner left is given up,
     * failing its checkpoint, rather than read after the rollback rewrote
     * the key group. */
    if (w->store->ops->cut_open) release_own_cuts(w);
    return w->store->ops->clear(w->store, w->range);
}

#define POLL_NS 200000000ull /* how often a waiter checks that the engine lives */

void worker_await_cut_end(stash_worker *w)
{
    shm_control *c = w->arena->control;
    uint64_t id = atomic_load(&c->workers[w->slot].acked);
    for (;;) {
        uint32_t seen = atomic_load(&c->finished);
        if (atomic_load(&c->completed) >= id || atomic_load(&c->aborted) >= id ||
            !shm_service_alive(w->arena, NULL))
            return;
        shm_futex_wait(&c->finished, seen, POLL_NS);
    }
}

/* The committed operator state, as the restore that put it there left it,
 * into out (a rollback's). */
static int committed_opstate(stash_worker *w, ckpt_restored *out)
{
    shm_control *c = w->arena->control;
    int rc = shm_lock_acquire(&c->lock, NULL, NULL);
    if (rc < 0) return rc;
    uint32_t p = atomic_load(&c->committed_p);
    uint64_t total = 0;
    for (uint32_t i = 0; i < p; i++) total += atomic_load(&c->workers[i].committed.len);
    out->op_parallelism = p;
    out->op_blobs = calloc(p ? p : 1, sizeof *out->op_blobs);
    out->op_mem = malloc(total ? total : 1);
    uint8_t *at = out->op_mem;
    for (uint32_t i = 0; out->op_blobs && at && i < p; i++) {
        shm_off off = atomic_load(&c->workers[i].committed.off);
        uint64_t len = off ? atomic_load(&c->workers[i].committed.len) : 0;
        if (len) memcpy(at, (const uint8_t *)w->arena->base + off, len);
        out->op_blobs[i] = (ckpt_blob){len ? at : NULL, len};
        at += len;
    }
    shm_lock_release(&c->lock);
    if (!out->op_blobs || !out->op_mem) return shm_fail(-ENOMEM, "out of memory");
    return 0;
}

/* A rollback of key groups a restore from the job put into this arena
 * (a takeover, a new arena of the job's host) before any checkpoint of
 * the arena holds them: from the copies of the parts that restore read,
 * and the operator state it committed. */
static int rollback_from_job(stash_worker *w, const shm_dir *d, uint64_t id, ioe_engine *e,
                             ckpt_restored *out)
{
    int rc = clear_kgs(w);
    if (rc == 0)
        rc = ckpt_job_restore_copies(w->arena, d, id, w->range, e, w->store, &out->records);
    if (rc == 0) rc = committed_opstate(w, out);
    out->id = id;
    if (rc) ckpt_restored_free(out);
    return rc;
}

/* Whether dir holds a checkpoint (not a savepoint: rollbacks read none)
 * of an id in (above, upto]. */
static bool has_checkpoint_in(const shm_dir *d, uint64_t above, uint64_t upto)
{
    uint64_t *ids;
    int n = ckpt_list(d, &ids);
    bool found = false;
    for (int i = 0; i < n; i++) found = found || (ids[i] > above && ids[i] <= upto);
    if (n >= 0) free(ids);
    return found;
}

int worker_rollback(stash_worker *w)
{
    stash_arena *a = w->arena;
    shm_control *c = a->control;
    char dir[SHM_CTL_DETAIL];
    if (!shm_service_alive(a, NULL))
        return shm_fail(STASH_ENOSERVICE, "%s: worker %u cannot roll back: no service runs",
                        a->path, w->slot);
    /* A checkpoint the dead predecessor cut ends first, with its cut: then
     * the newest complete checkpoint is the one to restore, and nothing
     * restored here reaches a checkpoint that has the predecessor's offsets
     * (a cut the engine opens is read when the engine takes it). */
    worker_await_cut_end(w);
    ioe_engine *e;
    int rc = ioe_engine_open(&(ioe_opts){0}, &e);
    if (rc < 0) return shm_fail(rc, "worker %u: no I/O engine for the rollback", w->slot);
    /* Before choosing a checkpoint (and reading the newest published one):
     * retention, of checkpoints and of a job restore's copies, leaves them
     * all alone until the restore ends. */
    atomic_store(&c->workers[w->slot].restoring, 1);
    rc = shm_lock_acquire(&c->lock, NULL, NULL);
    if (rc < 0) {
        atomic_store(&c->workers[w->slot].restoring, 0);
        ioe_engine_close(e);
        return rc;
    }
    memcpy(dir, c->dir, sizeof dir);
    /* A job's host writes a checkpoint into its directory before the job
     * decides on it: only those it published complete are. */
    uint64_t upto = c->job_part[0] ? atomic_load(&c->completed) : UINT64_MAX;
    shm_lock_release(&c->lock);
    ckpt_restored out = {0};
    shm_dir d;
    rc = shm_dir_open_named(a, dir, &d);
    uint64_t from_job = atomic_load(&c->workers[w->slot].job_restored);
    if (rc == 0 && from_job && !has_checkpoint_in(&d, from_job, upto))
        rc = rollback_from_job(w, &d, from_job, e, &out);
    else if (rc == 0)
        rc = ckpt_restore_prepared(a, &d, 0, upto, w->range, e, w->store, clear_kgs, w, &out);
    shm_dir_close(&d);
    atomic_store(&c->workers[w->slot].restoring, 0);
    if (rc == 0) {
        atomic_fetch_add(&c->workers[w->slot].rollbacks, 1);
        w->op_p = out.op_parallelism;
        w->op_blobs = out.op_blobs;
        w->op_mem = out.op_mem;
        w->rolled_back_to = out.id;
        if (out.skipped)
            snprintf(w->rollback_why, sizeof w->rollback_why,
                     "%u newer checkpoint%s passed over: %s", out.skipped,
                     out.skipped > 1 ? "s" : "", out.why);
    }
    ioe_engine_close(e);
    return rc;
}

/* stash_key_set and the walks, while the arena is restored lazily: a key
 * group not there yet is restored here or waited for. */
static int await_lazy_kg(stash_worker *w, uint32_t kg)
{
    if (atomic_load_explicit(&w->arena->tables[kg].lazy, memory_order_acquire) == 0) {
        if (!ckpt_lazy_pending(w->arena) && !w->reader) w->kg_await = NULL;
        return 0;
    }
    return ckpt_lazy_await(w->arena, kg, NULL);
}

void worker_watch_lazy(stash_worker *w)
{
    w->kg_await = await_lazy_kg;
}

int worker_fall_back(stash_worker *w)
{
    stash_arena *a = w->arena;
    shm_control *c = a->control;
    uint64_t gen = atomic_load_explicit(&c->fallback_gen, memory_order_acquire);
    if (gen == atomic_load(&c->workers[w->slot].fallback_seen)) return 0;
    /* What this worker wrote goes: its key groups come again from the
     * checkpoint the arena fell back to, first touch or background pass;
     * a checkpoint it cut before reads them until it ends. */
    worker_await_cut_end(w);
    int rc = worker_commit(w, true);
    worker_drop_key(w);
    if (rc == 0) rc = ckpt_lazy_renew(a, w->range, false, w->store);
    worker_watch_lazy(w);
    /* Its operator state is the checkpoint's (the engine dropped what the
     * workers recorded since). */
    free(w->op_blobs);
    free(w->op_mem);
    w->op_blobs = NULL;
    w->op_mem = NULL;
    for (stash_state *s = w->states; rc == 0 && s; s = s->next)
        if (opstate_recorded(s->kind)) rc = opstate_load_committed(s);
    if (rc == 0) rc = timers_rebuild_all(w);
    if (rc < 0) return rc;
    if ((rc = shm_lock_acquire(&c->lock, NULL, NULL)) < 0) return rc;
    w->rolled_back_to = atomic_load(&c->fallback_id);
    snprintf(w->rollback_why, sizeof w->rollback_why, "%s", c->fallback_why);
    shm_lock_release(&c->lock);
    atomic_fetch_add(&c->workers[w->slot].rollbacks, 1);
    atomic_store(&c->workers[w->slot].fallback_seen, gen);
    return 0;
}

/* ---- control requests ---------------------------------------------------- */

static void info_of(const shm_ctl_result *r, stash_checkpoint_info *out)
{
    *out = (stash_checkpoint_info){.id = r->id,
                                   .status = r->status,
                                   .incremental = (int)r->incremental,
                                   .savepoint = (int)r->savepoint,
                                   .started_ns = r->started_ns,
                                   .duration_ns = r->duration_ns,
                                   .bytes = r->bytes,
                                   .pause_ns = r->pause_ns};
    memcpy(out->detail, r->detail, sizeof out->detail);
}

/* The oldest recorded result that answers request ticket (a savepoint's
 * only by a savepoint), if any. */
static bool find_result(shm_control *c, uint64_t ticket, bool savepoint, stash_checkpoint_info *out)
{
    bool found = false;
    if (shm_lock_acquire(&c->lock, NULL, NULL) < 0) return false;
    uint32_t n = atomic_load(&c->history_n);
    uint32_t k = n < SHM_CTL_HISTORY ? n : SHM_CTL_HISTORY;
    for (uint32_t i = n - k; i < n && !found; i++) {
        const shm_ctl_result *r = &c->history[i % SHM_CTL_HISTORY];
        if (r->covers >= ticket && (r->savepoint || !savepoint)) {
            info_of(r, out);
            found = true;
        }
    }
    shm_lock_release(&c->lock);
    return found;
}

/* Requests a checkpoint (or savepoint) and waits for the one that answers it. */
static int request(stash_arena *arena, bool savepoint, uint64_t timeout_ms,
                   stash_checkpoint_info *out)
{
    shm_clear_error();
    if (!arena || !out)
        return shm_refuse_null(savepoint ? "stash_savepoint" : "stash_checkpoint", "arena or out");
    shm_control *c = arena->control;
    if (!shm_service_alive(arena, NULL))
        return shm_fail(STASH_ENOSERVICE, "%s: no service runs (start one with stash serve)",
                        arena->path);
    uint64_t ticket = atomic_fetch_add(&c->requests, 1) + 1;
    /* After the request: an engine that sees the savepoint ticket sees the request. */
    for (uint64_t t = atomic_load(&c->savepoint_ticket);
         savepoint && t < ticket &&
         !atomic_compare_exchange_weak(&c->savepoint_ticket, &t, ticket);)
        ;
    shm_futex_wake(&c->wake);
    uint64_t deadline = timeout_ms ? shm_clock_ns() + timeout_ms * 1000000ull : 0;
    for (;;) {
        uint32_t seen = atomic_load(&c->finished);
        if (find_result(c, ticket, savepoint, out))
            return out->status == 0 ? 0
                                    : shm_fail(STASH_EABORTED, "checkpoint %llu: %s",
                                               (unsigned long long)out->id, out->detail);
        if (!shm_service_alive(arena, NULL))
            return shm_fail(STASH_ENOSERVICE, "%s: the service stopped before the checkpoint",
                            arena->path);
        uint64_t now = shm_clock_ns();
        if (deadline && now >= deadline)
            return shm_fail(-ETIMEDOUT, "%s: no checkpoint finished within %llu ms", arena->path,
                            (unsigned long long)timeout_ms);
        uint64_t wait = deadline && deadline - now < POLL_NS ? deadline - now : POLL_NS;
        shm_futex_wait(&c->finished, seen, wait);
    }
}

STASH_API int stash_checkpoint(stash_arena *arena, uint64_t timeout_ms, stash_checkpoint_info *out)
{
    return request(arena, false, timeout_ms, out);
}

STASH_API int stash_savepoint(stash_arena *arena, uint64_t timeout_ms, stash_checkpoint_info *out)
{
    return request(arena, true, timeout_ms, out);
}

/* Waits until the engine (pid) stopped, until deadline (0: none). */
static int await_stopped(stash_arena *arena, int32_t pid, uint64_t deadline, uint64_t timeout_ms)
{
    shm_control *c = arena->control;
    while (shm_service_alive(arena, NULL)) {
        if (deadline && shm_clock_ns() >= deadline)
            return shm_fail(-ETIMEDOUT, "%s: the service (pid %d) did not stop within %llu ms",
                            arena->path, pid, (unsigned long long)timeout_ms);
        uint32_t seen = atomic_load(&c->finished);
        shm_futex_wait(&c->finished, seen, 50000000ull);
    }
    return 0;
}

STASH_API int stash_service_request_stop(stash_arena *arena, uint64_t timeout_ms)
{
    shm_clear_error();
    if (!arena) return shm_refuse_null(__func__, "arena");
    shm_control *c = arena->control;
    int32_t pid;
    if (!shm_service_alive(arena, &pid))
        return shm_fail(STASH_ENOSERVICE, "%s: no service runs", arena->path);
    atomic_store(&c->stop, SHM_STOP_NOW);
    shm_futex_wake(&c->wake);
    return await_stopped(arena, pid, timeout_ms ? shm_clock_ns() + timeout_ms * 1000000ull : 0,
                         timeout_ms);
}

STASH_API int stash_stop_with_savepoint(stash_arena *arena, uint64_t timeout_ms,
                                        stash_checkpoint_info *out)
{
    shm_clear_error();
    if (!arena || !out) return shm_refuse_null(__func__, "arena or out");
    shm_control *c = arena->control;
    int32_t pid;
    if (!shm_service_alive(arena, &pid))
        return shm_fail(STASH_ENOSERVICE, "%s: no service runs", arena->path);
    uint64_t t0 = shm_clock_ns();
    /* Before the request: the engine that takes the savepoint sees it. */
    uint32_t none = 0;
    atomic_compare_exchange_strong(&c->stop, &none, SHM_STOP_AFTER_SAVEPOINT);
    int rc = request(arena, true, timeout_ms, out);
    if (rc) {
        uint32_t after = SHM_STOP_AFTER_SAVEPOINT;
        atomic_compare_exchange_strong(&c->stop, &after, 0);
        return rc;
    }
    return await_stopped(arena, pid, timeout_ms ? t0 + timeout_ms * 1000000ull : 0, timeout_ms);
}

STASH_API int stash_service_info_get(stash_arena *arena, stash_service_info *out)
{
    if (!arena || !out) return shm_refuse_null(__func__, "arena or out");
    shm_control *c = arena->control;
    memset(out, 0, sizeof *out);
    int32_t pid = 0;
    if (shm_service_alive(arena, &pid)) out->pid = pid;
    int rc = shm_lock_acquire(&c->lock, NULL, NULL);
    if (rc < 0) return rc;
    out->since_ns = c->service_since_ns;
    memcpy(out->dir, c->dir, sizeof out->dir);
    out->pending = atomic_load(&c->pending);
    out->completed = atomic_load(&c->completed);
    out->failing = atomic_load(&c->failing);
    out->next_ns = atomic_load(&c->next_due_ns);
    out->completed_total = atomic_load(&c->completed_total);
    out->failed_total = atomic_load(&c->failed_total);
    out->restored_id = atomic_load(&c->restored_id);
    out->restored_ns = atomic_load(&c->restored_ns);
    out->restored_at_ns = atomic_load(&c->restored_at_ns);
    out->restored_records = atomic_load(&c->restored_records);
    uint32_t backend = atomic_load(&c->io_backend);
    if (backend)
        snprintf(out->io_backend, sizeof out->io_backend, "%s", ioe_backend_name((int)backend));
    out->io_bytes_written = atomic_load(&c->io_written);
    out->io_bytes_read = atomic_load(&c->io_read);
    out->io_errors = atomic_load(&c->io_errors);
    uint32_t n = atomic_load(&c->history_n);
    for (uint32_t i = 0; i < SHM_CTL_HISTORY && i < n; i++)
        info_of(&c->history[(n - 1 - i) % SHM_CTL_HISTORY], &out->recent[out->nrecent++]);
    shm_lock_release(&c->lock);
    return 0;
}
