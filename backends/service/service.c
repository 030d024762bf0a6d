/* SPDX-License-Identifier: MIT */
/*
 * service.c: the persistence engine: a thread that serves one arena
 * (started by start.c). It runs checkpoints one at a time, on an interval
 * or when a control command asks (or, on a host of a job that spans hosts,
 * when the job's leader asks), through the barrier protocol of service.h:
 * request, every worker's cut, the asynchronous write, commit, completion.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends/service/engine.h"

#define DEFAULT_TIMEOUT_MS 60000u
#define DEFAULT_RETAIN 3u
#define DEFAULT_FULL_EVERY 10u
#define IDLE_NS 250000000ull /* the longest sleep between looks at the workers */
#define ACK_POLL_NS 100000000ull
#define BACKOFF_AFTER 3u     /* failures in a row before the interval backs off */
#define BACKOFF_MAX_SHIFT 6u /* at most 2^6 intervals between two attempts */

STASH_API const char *stash_log_level_name(stash_log_level level)
{
    return level == STASH_LOG_ERROR ? "ERROR" : level == STASH_LOG_WARN ? "WARN" : "INFO";
}

/* Hands one event to the caller's log: as a record, and as a line. */
__attribute__((format(printf, 4, 5))) void engine_say(stash_service *s, stash_log_level level,
                                                      const char *subject, const char *fmt, ...)
{
    if (!s->o.log && !s->o.log_record) return;
    char message[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    stash_log_record r = {(uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec, level,
                          subject, message};
    if (s->o.log_record) s->o.log_record(s->o.log_ctx, &r);
    if (!s->o.log) return;
    struct tm tm;
    char when[32], line[1024];
    localtime_r(&ts.tv_sec, &tm);
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    snprintf(line, sizeof line, "%s.%03ld %s %s: %s", when, ts.tv_nsec / 1000000,
             stash_log_level_name(level), subject, message);
    s->o.log(s->o.log_ctx, line);
}

/* A subject naming one thing by its number ("checkpoint 12", "worker 3"),
 * written into buf (32 bytes). */
static const char *subject_of(char *buf, const char *what, uint64_t n)
{
    snprintf(buf, 32, "%s %llu", what, (unsigned long long)n);
    return buf;
}
#define SUBJECT(what, n) subject_of((char[32]){0}, what, n)

/* The I/O engine's line, as the service's event. */
void engine_io_line(void *ctx, const char *line)
{
    engine_say(ctx, STASH_LOG_WARN, "io", "%s", line);
}

static bool stopping(stash_service *s)
{
    return atomic_load(&s->quit) || atomic_load(&s->a->control->stop) == SHM_STOP_NOW;
}

void engine_unpin_all(stash_arena *a, uint32_t *pins)
{
    for (uint32_t kg = 0; kg < a->hdr->max_parallelism; kg++) {
        if (pins[kg]) shm_table_unpin(a, kg, pins[kg]);
        pins[kg] = 0;
    }
}

/* ---- one checkpoint --------------------------------------------------------- */

typedef struct outcome {
    int status;
    uint64_t bytes;
    uint64_t pause_ns;
    bool incremental;
    bool savepoint;
    char detail[SHM_CTL_DETAIL];
} outcome;

__attribute__((format(printf, 3, 4))) static int failed(outcome *r, int status, const char *fmt,
                                                        ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->detail, sizeof r->detail, fmt, ap);
    va_end(ap);
    r->status = status < 0 ? status : STASH_EABORTED;
    return r->status;
}

/* The parallelism of the workers: of those in the registry, or of the last
 * that joined if all left (0 if none ever did). A dead worker fails the
 * checkpoint: its key groups may hold a change it left half done. */
static int worker_parallelism(stash_service *s, uint32_t *p, outcome *r)
{
    stash_worker_info *w = calloc(STASH_MAX_WORKERS, sizeof *w);
    if (!w) return failed(r, -ENOMEM, "out of memory");
    size_t n = 0;
    stash_registry_list(s->a, w, STASH_MAX_WORKERS, &n);
    *p = atomic_load(&s->a->control->parallelism);
    int rc = 0;
    for (size_t i = 0; i < n && i < STASH_MAX_WORKERS && rc == 0; i++) {
        if (w[i].state == STASH_WORKER_DEAD)
            rc = failed(r, 0, "worker %u (pid %d) is dead: its key groups wait for a replacement",
                        w[i].index, w[i].pid);
        else if (w[i].state == STASH_WORKER_LIVE)
            *p = w[i].parallelism;
    }
    free(w);
    return rc;
}

/* Cuts the key groups of worker index of p while it is away (it left
 * cleanly: nobody writes them). Returns 0, or -EBUSY if it came back. */
static int cut_for_absent(stash_service *s, uint32_t index, uint32_t p, outcome *r)
{
    stash_kg_range range;
    stash_kg_range_of(s->a->hdr->max_parallelism, p, index, &range);
    int rc = shm_registry_cut_free(s->a, range, s->holder);
    if (rc < 0 && rc != -EBUSY) return failed(r, rc, "%s", stash_errmsg());
    return rc;
}

/* Takes key group kg's cut into s->cut, if it has one and it was not taken
 * yet. A store that opens cuts opens kg's first: the cut holds the owner's
 * commits back until it is taken. */
static int take_cut(stash_service *s, uint32_t kg, outcome *r)
{
    shm_table *t = &s->a->tables[kg];
    const store_ops *ops = s->store->ops;
    if (s->cut[kg] || !atomic_load(&t->cut)) return 0;
    if (ops->cut_open && ops->cut_open(s->store, kg) < 0) return failed(r, 0, "%s", stash_errmsg());
    s->cut[kg] = atomic_exchange(&t->cut, 0);
    /* A replacement's rollback gave the cut up meanwhile: what the cut
     * opened may already be rolled back, and no later checkpoint may read it. */
    if (!s->cut[kg] && ops->cut_close) ops->cut_close(s->store, kg);
    return 0;
}

/* Lets every cut the store opened go. */
static void close_cuts(stash_service *s)
{
    for (uint32_t kg = 0; s->store->ops->cut_close && kg < s->a->hdr->max_parallelism; kg++)
        s->store->ops->cut_close(s->store, kg);
}

/* Waits until each of workers 0 .. p-1 has cut checkpoint id, or left
 * (the engine then cuts its key groups itself). */
static int await_cuts(stash_service *s, uint64_t id, uint32_t p, uint64_t t0, outcome *r)
{
    shm_control *c = s->a->control;
    uint64_t timeout = (s->o.timeout_ms ? s->o.timeout_ms : DEFAULT_TIMEOUT_MS) * 1000000ull;
    bool *done = calloc(p, sizeof *done);
    if (!done) return failed(r, -ENOMEM, "out of memory");
    int rc = 0;
    for (;;) {
        uint32_t seen = atomic_load(&c->wake), missing = 0;
        for (uint32_t i = 0; i < p && rc == 0; i++) {
            if (done[i]) continue;
            if (atomic_load(&c->workers[i].acked) == id) {
                done[i] = true;
                /* An owner may commit again once the cuts of its key groups are open. */
                stash_kg_range range;
                stash_kg_range_of(s->a->hdr->max_parallelism, p, i, &range);
                bool opens = s->store->ops->cut_open != NULL;
                for (uint32_t kg = range.first; opens && rc == 0 && kg <= range.last; kg++)
                    rc = take_cut(s, kg, r);
                continue;
            }
            stash_worker_info info;
            shm_registry_describe(s->a, i, &info);
            if (info.state == STASH_WORKER_FREE && cut_for_absent(s, i, p, r) == 0) {
                done[i] = true;
                continue;
            }
            if (info.state == STASH_WORKER_DEAD)
                rc = failed(r, 0, "worker %u (pid %d) died before its barrier", i, info.pid);
            missing++;
        }
        if (rc || missing == 0) break;
        if (stopping(s)) {
            rc = failed(r, 0, "the service is stopping");
            break;
        }
        uint64_t now = shm_now_ns();
        if (now - t0 >= timeout) {
            for (uint32_t i = 0; i < p && rc == 0; i++)
                if (!done[i])
                    rc = failed(r, -ETIMEDOUT, "worker %u reached no barrier within %llu ms", i,
                                (unsigned long long)(timeout / 1000000ull));
            break;
        }
        uint64_t left = timeout - (now - t0);
        shm_futex_wait(&c->wake, seen, left < ACK_POLL_NS ? left : ACK_POLL_NS);
    }
    free(done);
    return rc;
}

/* Takes every key group's cut into s->cut; fails if one has none, naming
 * its worker and why it could not cut. */
static int collect_cuts(stash_service *s, uint32_t p, outcome *r)
{
    stash_arena *a = s->a;
    uint32_t maxp = a->hdr->max_parallelism;
    int rc = 0;
    for (uint32_t kg = 0; kg < maxp && rc == 0; kg++) rc = take_cut(s, kg, r);
    for (uint32_t kg = 0; kg < maxp; kg++) {
        if (s->cut[kg] || rc) continue;
        int owner = p ? stash_kg_owner(kg, maxp, p) : 0;
        int err = p ? atomic_load(&a->control->workers[owner].cut_error) : 0;
        rc = failed(r, 0, "key group %u was not cut: worker %d: %s", kg, owner,
                    err ? stash_strerror(err) : "it left no pin for it");
    }
    return rc;
}

/* Copies the operator state of workers 0 .. p-1 (each its newest blob, the
 * one recorded at this cut or when it left) out of the arena. */
static int copy_opstate(stash_service *s, uint32_t p, ckpt_blob *blobs, uint8_t **mem)
{
    shm_control *c = s->a->control;
    int rc = shm_lock_acquire(&c->lock, NULL, NULL);
    if (rc < 0) return rc;
    uint64_t total = 0;
    for (uint32_t i = 0; i < p; i++) {
        shm_op_blob *b = atomic_load(&c->workers[i].pending.off) ? &c->workers[i].pending
                                                                 : &c->workers[i].committed;
        blobs[i].len = atomic_load(&b->off) ? atomic_load(&b->len) : 0;
        total += blobs[i].len;
    }
    *mem = malloc(total ? total : 1);
    uint8_t *at = *mem;
    for (uint32_t i = 0; at && i < p; i++) {
        shm_op_blob *b = atomic_load(&c->workers[i].pending.off) ? &c->workers[i].pending
                                                                 : &c->workers[i].committed;
        if (blobs[i].len) memcpy(at, s->a->base + atomic_load(&b->off), blobs[i].len);
        blobs[i].data = at;
        at += blobs[i].len;
    }
    shm_lock_release(&c->lock);
    return *mem ? 0 : -ENOMEM;
}

/* A full checkpoint releases each key group's pin once it is serialized. */
static void release_cut(void *ctx, uint32_t kg)
{
    stash_service *s = ctx;
    if (s->cut[kg]) shm_table_unpin(s->a, kg, s->cut[kg]);
    s->cut[kg] = 0;
}

/* A checkpoint of a chain keeps each key group's pin, serialized, as the
 * next delta's base: it sees no version any more, so the owner's writes
 * neither save nor copy for it. */
static void rebase_cut(void *ctx, uint32_t kg)
{
    stash_service *s = ctx;
    if (s->cut[kg]) shm_table_pin_rebase(s->a, kg, s->cut[kg]);
}

/* Writes the cut key groups with the operator state of p workers;
 * untracked is the change log's count of misses before the cut. */
/* The TTL time of checkpoint id's cut: the earliest TTL clock of the
 * workers that cut it (what is expired by it expired for all), else now. */
static uint64_t cut_clock_ms(stash_service *s, uint64_t id, uint32_t p)
{
    uint64_t at = UINT64_MAX;
    bool cut = false; /* a clock that reads 0 is a time like any other */
    for (uint32_t i = 0; i < p; i++) {
        shm_ctl_worker *w = &s->a->control->workers[i];
        uint64_t ms = atomic_load(&w->cut_clock_ms);
        if (atomic_load(&w->acked) == id && ms <= at) at = ms, cut = true;
    }
    return cut ? at : shm_now_ns() / 1000000ull;
}

/* Copies what of the checkpoint just committed in dir did not go up while
 * it was written into the remote storage; on failure it is removed from
 * dir too: complete means named by JOB/latest. */
static int upload(stash_service *s, ckpt_upload *u, uint64_t id, bool savepoint, bool shared)
{
    char chk[4096], name[64];
    snprintf(name, sizeof name, "%s-%llu", savepoint ? "savepoint" : "chk", (unsigned long long)id);
    int rc = ckpt_path_of(chk, "%s/%s", s->dir, name);
    if (rc == 0)
        rc = ckpt_upload_finish(u, s->ckpts.fd, chk, savepoint ? 0 : s->remote_latest, s->e);
    if (rc == 0 && !savepoint) s->remote_latest = id;
    if (rc == 0) return 0;
    char why[512];
    snprintf(why, sizeof why, "%s", stash_errmsg());
    ckpt_remove_checkpoint(&s->ckpts, name);
    if (shared) {
        snprintf(name, sizeof name, "%s/%llu.dat", CKPT_SHARED_DIR, (unsigned long long)id);
        unlinkat(s->ckpts.fd, name, 0);
    }
    return shm_fail(rc, "not in %s: %s", ckpt_storage_where(s->remote), why);
}

/* Opens the checkpoint directory again, every check made again: a
 * checkpoint goes to the directory at the path now (one replaced or
 * mounted over since the last is the new one), and everything it does
 * there goes through that descriptor. */
static int reopen_dir(stash_service *s)
{
    shm_dir now;
    int rc = ckpt_dir_open(s->dir, s->group, &now);
    if (rc) return rc;
    shm_dir_close(&s->ckpts);
    s->ckpts = now;
    return 0;
}

/* Makes the next checkpoint full: a delta would rest on what the job may
 * not hold (a base it aborted, key groups a takeover restored, which no
 * change log noted, a chain a failure broke). */
static void full_next(stash_service *s)
{
    s->since_full = s->o.full_every ? s->o.full_every : DEFAULT_FULL_EVERY;
}

/* The workers attached as the engine last looked: each busy, as far as
 * the serializing threads are told. */
static uint32_t live_workers(const stash_service *s)
{
    uint32_t n = 0, hwm = atomic_load(&s->a->hdr->registry_hwm);
    for (uint32_t i = 0; i < hwm && i < STASH_MAX_WORKERS; i++)
        n += s->seen[i].state == STASH_WORKER_LIVE;
    return n;
}

static int write_cut(stash_service *s, uint64_t id, uint32_t p, uint32_t untracked, outcome *r)
{
    stash_arena *a = s->a;
    int rc = reopen_dir(s);
    if (rc < 0) return failed(r, rc, "%s", stash_errmsg());
    uint8_t *mem = NULL;
    ckpt_blob *blobs = calloc(p ? p : 1, sizeof *blobs);
    rc = blobs ? copy_opstate(s, p, blobs, &mem) : -ENOMEM;
    if (rc < 0) {
        free(blobs);
        return failed(r, rc, "operator state: %s", stash_strerror(rc));
    }
    uint32_t full_every = s->o.full_every ? s->o.full_every : DEFAULT_FULL_EVERY;
    /* A savepoint stands alone: full, in its own directory, no one's base. */
    bool chain = s->o.incremental && !r->savepoint;
    /* A delta needs the change log (where the store keeps one) whole since
     * the base was cut, and a chain with room for one more file (decided
     * here: once a key group is serialized its cut is a base, which no
     * full checkpoint could walk again). */
    bool delta = chain && s->base_id && s->since_full < full_every &&
                 s->since_full + 1 < CKPT_MAX_FILES && untracked == s->untracked_seen;
    /* Full checkpoints leave out what expired at the cut, where states ask. */
    ttl_cut *cut = malloc(sizeof *cut);
    snap_filter filter = {ttl_cut_filter, cut};
    bool filtered = cut && ttl_cut_init(a, cut_clock_ms(s, id, p), cut) > 0;
    ckpt_opts o = {
        .dir = &s->ckpts,
        .filter = filtered ? &filter : NULL,
        .id = id,
        .lz4 = s->o.lz4,
        .savepoint = r->savepoint,
        .incremental = chain,
        .base_id = delta ? s->base_id : 0,
        .base_pins = delta ? s->base : NULL,
        .cap_bytes = s->memory ? (s->o.memory_cap ? s->o.memory_cap : CKPT_MEMORY_DEFAULT_CAP) : 0,
        .group = s->group,
        .reader = true,
        .reader_slot = s->reader,
        .reader_slot2 = s->reader2,
        .busy_workers = live_workers(s),
        .engine = s->e,
        .op_parallelism = p,
        .op_blobs = blobs,
        .serialized = chain ? rebase_cut : release_cut,
        .serialized_ctx = s,
        .store = s->store,
        .lazy_from = s->lazy_cut ? a->control->lazy_path : NULL};
    ckpt_written w = {0};
    /* A remote storage takes the data file as it is written. */
    ckpt_upload up;
    char name[64];
    snprintf(name, sizeof name, "%s-%llu", r->savepoint ? "savepoint" : "chk",
             (unsigned long long)id);
    rc = s->remote ? ckpt_upload_begin(&up, s->remote, s->job, name) : 0;
    if (rc == 0 && s->remote) o.copy = &up.copy;
    if (rc == 0) rc = ckpt_write(a, s->cut, &o, &w);
    if (rc && s->remote && (!o.copy || up.failed)) {
        char why[512];
        snprintf(why, sizeof why, "%s", stash_errmsg());
        shm_fail(rc, "not in %s: %s", ckpt_storage_where(s->remote), why);
    }
    if (rc == 0 && s->remote) rc = upload(s, &up, id, r->savepoint, chain);
    free(blobs);
    free(mem);
    free(cut);
    close_cuts(s);
    if (rc && delta) {
        /* Whatever failed it (the base's metadata damaged or replaced, a
         * file of the chain unreadable), the next one depends on nothing. */
        full_next(s);
        char why[512];
        snprintf(why, sizeof why, "%s", stash_errmsg());
        return failed(r, rc, "%s; the next checkpoint is full", why);
    }
    if (rc) return failed(r, rc, "%s", stash_errmsg());
    r->bytes = w.data_bytes;
    r->incremental = delta;
    if (snprintf(r->detail, sizeof r->detail, "%s/%s-%llu", s->dir,
                 r->savepoint ? "savepoint" : "chk",
                 (unsigned long long)id) >= (int)sizeof r->detail)
        r->detail[sizeof r->detail - 1] = 0;
    if (chain) {
        /* This cut is the next one's base: its pins stay. */
        engine_unpin_all(a, s->base);
        memcpy(s->base, s->cut, a->hdr->max_parallelism * sizeof *s->cut);
        memset(s->cut, 0, a->hdr->max_parallelism * sizeof *s->cut);
        s->base_id = id;
        s->since_full = delta ? s->since_full + 1 : 0;
        s->untracked_seen = untracked;
        /* The change log's older notes serve no delta any more. */
        atomic_store(&a->hdr->change_prune_below, id);
    } else {
        engine_unpin_all(a, s->cut);
    }
    return 0;
}

/* Publishes a finished checkpoint: the result, and on success the workers'
 * operator state as the committed set. */
static void publish(stash_service *s, uint64_t id, uint32_t p, uint64_t t0, const outcome *r)
{
    shm_control *c = s->a->control;
    if (shm_lock_acquire(&c->lock, NULL, NULL) < 0) {
        engine_say(s, STASH_LOG_ERROR, SUBJECT("checkpoint", id), "%s", stash_errmsg());
        return;
    }
    if (r->status == 0) {
        /* Each worker's newest blob becomes its committed one. */
        uint32_t old_p = atomic_load(&c->committed_p);
        for (uint32_t i = 0; i < (p > old_p ? p : old_p); i++) {
            shm_ctl_worker *w = &c->workers[i];
            if (i < p && !atomic_load(&w->pending.off)) continue;
            shm_blob_free(s->a, atomic_exchange(&w->committed.off, 0));
            if (i >= p) continue;
            atomic_store(&w->committed.len, atomic_load(&w->pending.len));
            atomic_store(&w->committed.parallelism, atomic_load(&w->pending.parallelism));
            atomic_store(&w->committed.off, atomic_exchange(&w->pending.off, 0));
        }
        atomic_store(&c->committed_p, p);
    }
    uint32_t n = atomic_load(&c->history_n);
    shm_ctl_result *h = &c->history[n % SHM_CTL_HISTORY];
    *h = (shm_ctl_result){.id = id,
                          .status = r->status,
                          .incremental = r->incremental,
                          .savepoint = r->savepoint,
                          .covers = s->served,
                          .started_ns = t0,
                          .duration_ns = shm_now_ns() - t0,
                          .bytes = r->bytes,
                          .pause_ns = r->pause_ns};
    memcpy(h->detail, r->detail, sizeof h->detail);
    atomic_store(&c->history_n, n + 1);
    /* Id 0 answers a request refused before any checkpoint started. */
    if (id && r->status == 0)
        atomic_store(&c->completed, id);
    else if (id)
        atomic_store(&c->aborted, id);
    if (id) atomic_fetch_add(r->status == 0 ? &c->completed_total : &c->failed_total, 1);
    shm_lock_release(&c->lock);
    shm_futex_wake(&c->finished);
    if (!id)
        engine_say(s, STASH_LOG_ERROR, "service", "%s", r->detail);
    else if (r->status == 0)
        engine_say(s, STASH_LOG_INFO, SUBJECT(r->savepoint ? "savepoint" : "checkpoint", id),
                   "complete: %llu bytes%s in %.1f ms, longest cut %.1f us, %s",
                   (unsigned long long)r->bytes, r->incremental ? " (incremental)" : "",
                   (double)h->duration_ns / 1e6, (double)r->pause_ns / 1e3, r->detail);
    else
        engine_say(s, STASH_LOG_ERROR, SUBJECT("checkpoint", id), "failed after %.1f ms: %s",
                   (double)h->duration_ns / 1e6, r->detail);
}

void engine_lazy_done(stash_service *s)
{
    stash_arena *a = s->a;
    shm_control *c = a->control;
    if (ckpt_lazy_pending(a) || atomic_exchange(&s->lazy_said, 1)) return;
    uint64_t records = 0, took = shm_now_ns() - atomic_load(&c->lazy_started_ns);
    /* Counted by a store handle of its own: the engine's is the engine
     * thread's, and with lmdb the records are not the tables'. */
    store *st;
    if (store_open(a, 0, (stash_kg_range){0, a->hdr->max_parallelism - 1}, &st) == 0) {
        for (uint32_t kg = 0; kg < a->hdr->max_parallelism; kg++) {
            int64_t n = st->ops->kg_entries(st, kg);
            if (n > 0) records += (uint64_t)n;
        }
        store_close(st);
    }
    atomic_store(&c->restored_ns, took);
    atomic_store(&c->restored_at_ns, shm_now_ns());
    atomic_store(&c->restored_records, records);
    engine_say(s, STASH_LOG_INFO, "restore",
               "restored checkpoint %llu lazily: every key group in %.1f ms (%llu records)",
               (unsigned long long)atomic_load(&c->restored_id), (double)took / 1e6,
               (unsigned long long)records);
}

/* A lazy restore's background pass, with an I/O engine of its own. */
static void *lazy_main(void *arg)
{
    stash_service *s = arg;
    ioe_engine *e;
    /* Small: a key group's reads go into the view's own buffers. */
    int rc = ioe_engine_open(&(ioe_opts){.depth = 8, .buf_count = 1, .buf_size = 4096}, &e);
    if (rc == 0) {
        rc = ckpt_lazy_fill(s->a, e, &s->lazy_stop);
        ioe_engine_close(e);
    }
    /* A damaged block: the engine makes the arena fall back, and says so. */
    if (rc && rc != STASH_ECORRUPT)
        engine_say(s, STASH_LOG_ERROR, "restore", "the lazy restore's background pass: %s",
                   stash_errmsg());
    else if (rc == 0)
        engine_lazy_done(s);
    return NULL;
}

void engine_lazy_start(stash_service *s)
{
    atomic_store(&s->lazy_stop, 0);
    s->lazy_running = pthread_create(&s->lazy_thread, NULL, lazy_main, s) == 0;
    if (!s->lazy_running)
        engine_say(s, STASH_LOG_WARN, "restore",
                   "no thread for the lazy restore's background pass: key groups come "
                   "when touched and before the next checkpoint");
}

/* Brings every key group a lazy restore has yet to bring (before a cut whose
 * checkpoint cannot copy their blocks). */
static int lazy_finish(stash_service *s)
{
    if (!ckpt_lazy_pending(s->a)) return 0;
    int rc = ckpt_lazy_fill(s->a, s->e, NULL);
    if (rc == 0) engine_lazy_done(s);
    return rc;
}

/* ---- a lazy restore that found a damaged block ------------------------------ *
 * The arena falls back to the newest checkpoint of the directory that
 * restores whole, as a whole restore would have: a service that serves but
 * can never checkpoint (each one fails on the damaged key group) is worse
 * than one that loses the workers' writes since the restore, which the
 * workers hear of (STASH_ROLLED_BACK) and replay. */

/* The first key group of the lazy restore that failed, or UINT32_MAX. */
static uint32_t failed_kg(const stash_arena *a)
{
    for (uint32_t kg = 0; kg < a->hdr->max_parallelism; kg++)
        if (atomic_load(&a->tables[kg].lazy) == SHM_LAZY_FAILED) return kg;
    return UINT32_MAX;
}

/* The newest checkpoint of the directory below id whose every block passes
 * its checks, in *out; -ENOENT if none. */
static int newest_whole(stash_service *s, uint64_t below, uint64_t *out)
{
    uint64_t *ids;
    int n = ckpt_list(&s->ckpts, &ids), rc = -ENOENT;
    for (int i = 0; i < n && rc; i++) {
        if (ids[i] >= below || !ckpt_has_metadata(&s->ckpts, ids[i])) continue;
        ckpt_view v;
        int64_t got = ckpt_open_chk(&s->ckpts, ids[i], s->e, &v, true);
        if (got == 0) {
            got = ckpt_view_walk(&v, (stash_kg_range){0, v.max_parallelism - 1}, NULL, NULL);
            if (got >= 0 && v.max_parallelism != s->a->hdr->max_parallelism)
                got = shm_fail(STASH_ECORRUPT, "%s: %u key groups, the arena's %u", v.meta_path,
                               v.max_parallelism, s->a->hdr->max_parallelism);
            ckpt_view_close(&v);
        }
        if (got >= 0) {
            *out = ids[i];
            rc = 0;
        } else {
            engine_say(s, STASH_LOG_WARN, "restore", "passed over checkpoint %llu: %s",
                       (unsigned long long)ids[i], stash_errmsg());
        }
    }
    if (n >= 0) free(ids);
    return n < 0 ? n : rc;
}

/* The operator state of the checkpoint the arena falls back to becomes the
 * committed one of every worker index, and what workers recorded since the
 * restore goes. */
static int fallback_opstate(stash_service *s, const ckpt_restored *r)
{
    stash_arena *a = s->a;
    shm_control *c = a->control;
    int rc = shm_lock_acquire(&c->lock, NULL, NULL);
    if (rc < 0) return rc;
    for (uint32_t i = 0; i < STASH_MAX_WORKERS; i++) {
        shm_blob_free(a, atomic_exchange(&c->workers[i].committed.off, 0));
        shm_blob_free(a, atomic_exchange(&c->workers[i].pending.off, 0));
        atomic_store(&c->workers[i].committed.len, 0);
        atomic_store(&c->workers[i].pending.len, 0);
    }
    for (uint32_t i = 0; rc == 0 && i < r->op_parallelism; i++) {
        shm_off off = 0;
        if (r->op_blobs[i].len) rc = shm_blob_put(a, r->op_blobs[i].data, r->op_blobs[i].len, &off);
        atomic_store(&c->workers[i].committed.len, rc ? 0 : r->op_blobs[i].len);
        atomic_store(&c->workers[i].committed.off, off);
    }
    atomic_store(&c->committed_p, rc ? 0 : r->op_parallelism);
    shm_lock_release(&c->lock);
    return rc;
}

/* Makes the lazy restore bring every key group again from checkpoint id of
 * the directory: the key groups of no worker now, emptied here; a worker's
 * own, by the worker at its next barrier (or by its replacement when it
 * opens: worker_fall_back), who alone may write them. */
static int fall_back_to(stash_service *s, uint64_t id, const char *why)
{
    stash_arena *a = s->a;
    shm_control *c = a->control;
    char path[4096];
    ckpt_restored out = {0};
    int rc = ckpt_path_of(path, "%s/chk-%llu", s->dir, (unsigned long long)id);
    if (rc == 0) rc = ckpt_restore_opstate(a, path, s->e, &out);
    if (rc == 0) rc = fallback_opstate(s, &out);
    ckpt_restored_free(&out);
    if (rc == 0) rc = ckpt_lazy_rebase(a, path);
    if (rc == 0) rc = shm_lock_acquire(&a->hdr->registry_lock, NULL, NULL);
    if (rc < 0) return rc;
    uint64_t gen = atomic_load(&c->fallback_gen) + 1;
    uint32_t maxp = a->hdr->max_parallelism;
    bool *owned = calloc(maxp, sizeof *owned);
    if (!owned) rc = shm_fail(-ENOMEM, "out of memory");
    uint32_t hwm = atomic_load(&a->hdr->registry_hwm);
    for (uint32_t i = 0; rc == 0 && i < STASH_MAX_WORKERS; i++) {
        stash_worker_info info;
        if (i < hwm) shm_registry_describe(a, i, &info);
        bool held = i < hwm && (info.state == STASH_WORKER_LIVE || info.state == STASH_WORKER_DEAD);
        for (uint32_t kg = info.range.first; held && kg <= info.range.last && kg < maxp; kg++)
            owned[kg] = true;
        /* An index no worker holds has nothing of its own to go through. */
        if (!held) atomic_store(&c->workers[i].fallback_seen, gen);
    }
    /* A worker's key group that failed was never written: it comes again too. */
    for (uint32_t kg = 0; rc == 0 && kg < maxp; kg++)
        rc = ckpt_lazy_renew(a, (stash_kg_range){kg, kg}, owned[kg], s->store);
    free(owned);
    if (rc == 0 && (rc = shm_lock_acquire(&c->lock, NULL, NULL)) >= 0) {
        snprintf(c->fallback_why, sizeof c->fallback_why, "%.*s", (int)sizeof c->fallback_why - 1,
                 why);
        atomic_store(&c->fallback_id, id);
        atomic_store(&c->restored_id, id);
        atomic_store(&c->fallback_gen, gen);
        shm_lock_release(&c->lock);
        rc = 0;
    }
    shm_lock_release(&a->hdr->registry_lock);
    return rc;
}

/* What a key group of the lazy restore that failed its checks sets off: the
 * arena's fallback, or, where no checkpoint of the directory older than the
 * one restored restores whole, the engine's stop. */
static void fall_back(stash_service *s)
{
    stash_arena *a = s->a;
    shm_control *c = a->control;
    atomic_store(&c->lazy_failed, 0);
    uint32_t kg = failed_kg(a);
    if (kg == UINT32_MAX) return;
    if (s->lazy_running) {
        atomic_store(&s->lazy_stop, 1);
        pthread_join(s->lazy_thread, NULL);
        s->lazy_running = false;
    }
    uint64_t from_id = atomic_load(&c->restored_id), to = 0;
    char from[SHM_CTL_DETAIL], mine[4200], why[1024];
    if (shm_lock_acquire(&c->lock, NULL, NULL) >= 0) {
        memcpy(from, c->lazy_path, sizeof from);
        shm_lock_release(&c->lock);
    }
    from[sizeof from - 1] = 0;
    /* Checked again here for the message, which the thread that failed it kept. */
    snap_buf b = {0};
    int64_t n = ckpt_block_copy(from, kg, &b);
    snap_buf_free(&b);
    snprintf(why, sizeof why, "key group %u of %s did not restore: %s", kg, from,
             n < 0 ? stash_errmsg() : "its blocks failed their checks");
    snprintf(mine, sizeof mine, "%s/chk-%llu", s->dir, (unsigned long long)from_id);
    bool ours = strcmp(mine, from) == 0;
    int rc = ours ? newest_whole(s, from_id, &to) : -ENOENT;
    if (rc == 0) rc = fall_back_to(s, to, why);
    if (rc == 0) {
        engine_say(s, STASH_LOG_WARN, "restore",
                   "%s: the arena falls back to checkpoint %llu (restored lazily); each worker "
                   "rolls back to it at its next barrier",
                   why, (unsigned long long)to);
        atomic_store(&s->lazy_said, 0);
        engine_lazy_start(s);
        return;
    }
    if (rc == -ENOENT)
        engine_say(s, STASH_LOG_ERROR, "restore",
                   "%s; %s: stopping, since every checkpoint would fail on it", why,
                   ours ? "no older checkpoint of the directory restores whole"
                        : "it is no checkpoint of the directory, which has none to fall back to");
    else
        engine_say(s, STASH_LOG_ERROR, "restore", "%s; falling back failed: %s: stopping", why,
                   stash_errmsg());
    s->failure = rc == -ENOENT ? STASH_ECORRUPT : rc;
    atomic_store(&s->quit, 1);
}

/* Whether a checkpoint is being read: by a lazy restore, or by a live
 * worker rolling back (any one): retention waits for the next one. */
static bool rollback_reading(stash_service *s)
{
    /* A lazy restore reads its checkpoint until its last key group. */
    if (ckpt_lazy_pending(s->a)) return true;
    uint32_t hwm = atomic_load(&s->a->hdr->registry_hwm);
    for (uint32_t i = 0; i < hwm && i < STASH_MAX_WORKERS; i++) {
        if (!atomic_load(&s->a->control->workers[i].restoring)) continue;
        stash_worker_info info;
        shm_registry_describe(s->a, i, &info);
        if (info.state == STASH_WORKER_LIVE) return true;
    }
    return false;
}

/* The wait between the end of one checkpoint and the next of the interval:
 * the interval, doubled for each failure in a row from the third on (a
 * directory that went read-only, a full disk), so that a failing engine
 * neither floods the log nor keeps the workers cutting for nothing. */
static uint64_t interval_ns(const stash_service *s)
{
    uint64_t ns = s->o.interval_ms * 1000000ull;
    if (s->failing < BACKOFF_AFTER) return ns;
    uint32_t shift = s->failing - BACKOFF_AFTER + 1;
    if (shift > BACKOFF_MAX_SHIFT) shift = BACKOFF_MAX_SHIFT;
    return ns << shift;
}

/* Counts a checkpoint's outcome into the failures in a row, saying when the
 * interval starts or stops backing off. */
static void count_outcome(stash_service *s, uint64_t id, int rc)
{
    if (rc == 0) {
        if (s->failing >= BACKOFF_AFTER)
            engine_say(s, STASH_LOG_INFO, SUBJECT("checkpoint", id),
                       "complete after %u failed in a row: every %llu ms again", s->failing,
                       (unsigned long long)s->o.interval_ms);
        s->failing = 0;
    } else if (++s->failing >= BACKOFF_AFTER && s->o.interval_ms) {
        engine_say(s, STASH_LOG_WARN, "service",
                   "%u checkpoints failed in a row: backing off, the next in %.1f s", s->failing,
                   (double)interval_ns(s) / 1e9);
    }
    /* Before the result is published: whoever waits on it sees both. */
    atomic_store(&s->a->control->failing, s->failing);
    atomic_store(&s->a->control->next_due_ns, s->o.interval_ms ? shm_now_ns() + interval_ns(s) : 0);
}

/* Adds what the I/O engine did since the last look to the arena's totals. */
void engine_account_io(stash_service *s)
{
    shm_control *c = s->a->control;
    ioe_info now;
    ioe_engine_info(s->e, &now);
    atomic_store(&c->io_backend, (uint32_t)now.backend);
    atomic_fetch_add(&c->io_written, now.bytes_written - s->io_seen.bytes_written);
    atomic_fetch_add(&c->io_read, now.bytes_read - s->io_seen.bytes_read);
    atomic_fetch_add(&c->io_errors, now.errors - s->io_seen.errors);
    s->io_seen = now;
}

/* A host's part of job checkpoint id is written: the job's verdict on it.
 * A part of an aborted checkpoint leaves the directory (the pool's copy
 * goes with the leader's retention). */
static int await_verdict(stash_service *s, uint64_t id, outcome *r)
{
    int rc = job_part_done(s->jobs, id);
    if (rc == 0 && r->savepoint) {
        /* The job's savepoint is the record of all its parts: what restores it. */
        snprintf(r->detail, sizeof r->detail, "%.80s/%.120s/job-%llu",
                 ckpt_storage_where(s->remote), s->jobname, (unsigned long long)id);
    }
    if (rc == 0) return 0;
    full_next(s);
    char chk[64], why[512];
    snprintf(why, sizeof why, "%s", stash_errmsg());
    snprintf(chk, sizeof chk, "%s-%llu", r->savepoint ? "savepoint" : "chk",
             (unsigned long long)id);
    ckpt_remove_checkpoint(&s->ckpts, chk);
    return failed(r, rc, "job %s: %s", s->jobname, why);
}

/* A savepoint that was to stop the engine ended: it stops (done), or the
 * request to stop after it is dropped (failed: nothing stops). */
static void stop_after(stash_service *s, bool done)
{
    shm_control *c = s->a->control;
    uint32_t after = SHM_STOP_AFTER_SAVEPOINT;
    if (!done) {
        atomic_compare_exchange_strong(&c->stop, &after, 0);
        return;
    }
    atomic_store(&c->stop, SHM_STOP_NOW);
    engine_say(s, STASH_LOG_INFO, "service", "stopping after the savepoint");
}

static void run_checkpoint(stash_service *s)
{
    stash_arena *a = s->a;
    shm_control *c = a->control;
    uint64_t id = s->jobs ? job_requested(s->jobs) : s->next_id++, t0 = shm_now_ns();
    s->job_done = id;
    atomic_store(&c->last_id, id);
    uint64_t sp = atomic_load(&c->savepoint_ticket);
    s->served = atomic_load(&c->requests);
    /* A job's savepoints are the leader's: each host's part of one. */
    unsigned kind = s->jobs ? job_savepoint(s->jobs, id) : sp > s->savepoint_done;
    bool savepoint = kind != 0;
    bool then_stop = s->jobs ? kind > 1 : atomic_load(&c->stop) == SHM_STOP_AFTER_SAVEPOINT;
    if (savepoint) s->savepoint_done = sp > s->savepoint_done ? sp : s->savepoint_done;
    outcome r = {.savepoint = savepoint};
    /* Read before anything is cut: a rollback from here on makes the next
     * checkpoint after this one full. */
    uint32_t untracked = atomic_load(&a->hdr->change_untracked);
    uint32_t p = 0;
    /* While a lazy restore runs, the key groups not whole at their cut take
     * their blocks from its checkpoint as they are, where they can stand
     * in this one; else it brings them first. */
    int rc = 0;
    s->lazy_cut = ckpt_lazy_pending(a) && ckpt_lazy_copyable(a, s->e) == 0;
    if (!s->lazy_cut && (rc = lazy_finish(s)) != 0) rc = failed(&r, rc, "%s", stash_errmsg());
    if (rc == 0) rc = worker_parallelism(s, &p, &r);
    if (rc == 0 && p == 0) {
        /* No worker ever joined: the engine cuts every key group itself. */
        uint64_t t = shm_now_ns();
        rc = shm_registry_cut_free(a, (stash_kg_range){0, a->hdr->max_parallelism - 1}, s->holder);
        if (rc == -EBUSY)
            rc = failed(&r, 0, "a worker joined while the checkpoint started");
        else if (rc < 0)
            rc = failed(&r, rc, "%s", stash_errmsg());
        r.pause_ns = shm_now_ns() - t;
    } else if (rc == 0) {
        atomic_store(&c->pending, id);
        rc = await_cuts(s, id, p, t0, &r);
        atomic_store(&c->pending, 0);
    }
    /* The longest cut of this checkpoint: a worker that left was cut by
     * the engine, and its figure is an older checkpoint's. */
    for (uint32_t i = 0; rc == 0 && i < p; i++) {
        uint64_t pause = atomic_load(&c->workers[i].pause_ns);
        if (atomic_load(&c->workers[i].acked) == id && pause > r.pause_ns) r.pause_ns = pause;
    }
    if (rc == 0) rc = collect_cuts(s, p, &r);
    if (rc == 0) rc = write_cut(s, id, p, untracked, &r);
    if (rc == 0 && s->jobs) rc = await_verdict(s, id, &r);
    if (rc) {
        close_cuts(s);
        /* Workers that cut late see the abort and release their own pins. */
        atomic_store(&c->aborted, id);
        service_release_cuts(a);
        engine_unpin_all(a, s->cut);
        /* A worker killed between pinning a key group for this checkpoint
         * and naming the pin as its cut left a pin nobody knows of: every
         * pin held for the engine goes but its base's. */
        shm_table_release_holder(a, s->holder, s->base);
    }
    /* Retention before the announcement: whoever reads the storage once a
     * checkpoint is complete finds the older ones it retires gone. */
    unsigned keep = s->o.retain ? s->o.retain : DEFAULT_RETAIN;
    if (rc == 0 && !rollback_reading(s) && ckpt_retain(&s->ckpts, keep, s->e) < 0)
        engine_say(s, STASH_LOG_ERROR, "retention", "%s", stash_errmsg());
    /* Until a checkpoint of the arena holds what a job restore put in
     * (rollbacks read no savepoint), its copies stay. */
    if (rc == 0 && s->jobs && !savepoint && !rollback_reading(s) &&
        ckpt_job_copies_drop(&s->ckpts, id) < 0)
        engine_say(s, STASH_LOG_ERROR, "retention", "%s", stash_errmsg());
    /* A job's parts are kept by its leader, as its records name them. */
    if (rc == 0 && s->remote && !s->jobs && ckpt_storage_retain(s->remote, s->job, keep) < 0)
        engine_say(s, STASH_LOG_ERROR, "retention", "%s", stash_errmsg());
    count_outcome(s, id, rc);
    engine_account_io(s);
    publish(s, id, p, t0, &r);
    if (savepoint) stop_after(s, rc == 0 && then_stop);
    s->last_end_ns = shm_clock_ns();
}

/* Logs what changed in the registry since the last look: workers that
 * joined, left, died, or took a dead one's place. */
static void watch_workers(stash_service *s)
{
    uint32_t hwm = atomic_load(&s->a->hdr->registry_hwm);
    for (uint32_t i = 0; i < hwm && i < STASH_MAX_WORKERS; i++) {
        stash_worker_info now, *was = &s->seen[i];
        shm_registry_describe(s->a, i, &now);
        if (now.state == was->state && now.generation == was->generation) continue;
        if (now.state == STASH_WORKER_DEAD)
            engine_say(s, STASH_LOG_WARN, SUBJECT("worker", i),
                       "pid %d died: key groups %u..%u wait for a replacement", now.pid,
                       now.range.first, now.range.last);
        else if (now.state == STASH_WORKER_LIVE && now.previous_pid)
            engine_say(s, STASH_LOG_INFO, SUBJECT("worker", i), "pid %d took over from dead pid %d",
                       now.pid, now.previous_pid);
        else if (now.state == STASH_WORKER_LIVE)
            engine_say(s, STASH_LOG_INFO, SUBJECT("worker", i), "pid %d %s as %u of %u", now.pid,
                       was->generation ? "joined" : "is attached", i, now.parallelism);
        else if (was->state == STASH_WORKER_LIVE)
            engine_say(s, STASH_LOG_INFO, SUBJECT("worker", i), "pid %d left", was->pid);
        *was = now;
    }
}

/* Takes the workers of a lost host over, as the leader asked: their key
 * groups and operator state restored from the job's newest checkpoint
 * (no worker of this arena owns them: nobody writes them meanwhile, and
 * no checkpoint of this engine runs). */
static void take_over(stash_service *s)
{
    char lost[CKPT_JOB_HOST_MAX + 1];
    ckpt_job_workers w;
    if (!job_takeover(s->jobs, lost, sizeof lost, &w)) return;
    char ws[512];
    ckpt_job_workers_format(&w, ws, sizeof ws);
    uint64_t id = 0, t0 = shm_now_ns();
    ckpt_job_record *rec = malloc(sizeof *rec);
    ckpt_restored out = {0};
    char from[256];
    int rc = rec ? ckpt_job_source(s->remote, s->jobname, from, sizeof from, rec) : -ENOMEM;
    if (rc == 0) {
        id = rec->id;
        rc = ckpt_job_restore(s->a, s->remote, from, rec, &s->ckpts, s->o.job_parallelism, &w, s->e,
                              s->store, &out);
    }
    shm_control *c = s->a->control;
    if (rc == 0 && (rc = shm_lock_acquire(&c->lock, NULL, NULL)) == 0) {
        for (uint32_t i = 0; rc == 0 && i < out.op_parallelism; i++) {
            if (!ckpt_job_workers_has(&w, i)) continue;
            shm_off off = 0;
            if (out.op_blobs[i].len)
                rc = shm_blob_put(s->a, out.op_blobs[i].data, out.op_blobs[i].len, &off);
            if (rc) break;
            shm_blob_free(s->a, atomic_exchange(&c->workers[i].committed.off, 0));
            atomic_store(&c->workers[i].committed.len, out.op_blobs[i].len);
            atomic_store(&c->workers[i].committed.off, off);
        }
        shm_lock_release(&c->lock);
    }
    if (rc == -ENOENT) rc = 0; /* no job checkpoint yet: the workers start empty */
    /* Their rollbacks read the copies the restore left until a checkpoint
     * of this arena holds them. */
    for (uint32_t i = 0; rc == 0 && i < STASH_MAX_WORKERS; i++)
        if (ckpt_job_workers_has(&w, i)) atomic_store(&c->workers[i].job_restored, id);
    if (rc == 0) rc = job_takeover_done(s->jobs, lost, &w);
    if (rc == 0) full_next(s);
    if (rc == 0)
        engine_say(
            s, STASH_LOG_INFO, "job",
            "took workers %s of lost host %s over: %llu records of job checkpoint %llu restored "
            "in %.1f ms",
            ws, lost, (unsigned long long)out.records, (unsigned long long)id,
            (double)(shm_now_ns() - t0) / 1e6);
    else {
        engine_say(s, STASH_LOG_ERROR, "job", "taking workers %s of lost host %s over: %s", ws,
                   lost, stash_errmsg());
        job_takeover_failed(s->jobs, lost);
    }
    ckpt_restored_free(&out);
    free(rec);
}

/* A host's engine: a takeover asked of it, requests passed on to the
 * leader, a savepoint refused, the checkpoint the leader asked for.
 * Returns whether it did any of them. */
static bool job_host_turn(stash_service *s)
{
    shm_control *c = s->a->control;
    char why[256];
    if (job_fenced(s->jobs, why, sizeof why)) {
        if (!s->fenced_told) {
            /* The workers learn it at their next barrier; nothing of this
             * arena goes into the job again. */
            s->fenced_told = true;
            if (shm_lock_acquire(&c->lock, NULL, NULL) == 0) {
                snprintf(c->fenced_why, sizeof c->fenced_why, "%s", why);
                atomic_store(&c->fenced, 1);
                shm_lock_release(&c->lock);
            }
            atomic_fetch_add(&c->finished, 1);
            shm_futex_wake(&c->finished);
        }
        uint64_t requests = atomic_load(&c->requests);
        uint64_t sp = atomic_load(&c->savepoint_ticket);
        if (requests <= s->served && sp <= s->savepoint_done) return false;
        outcome r = {.savepoint = sp > s->savepoint_done};
        s->served = requests;
        s->savepoint_done = sp;
        failed(&r, STASH_EFENCED, "%s", why);
        publish(s, 0, 0, shm_now_ns(), &r);
        if (r.savepoint) stop_after(s, false);
        return true;
    }
    take_over(s);
    uint64_t requests = atomic_load(&c->requests);
    uint64_t sp = atomic_load(&c->savepoint_ticket);
    if (sp > s->savepoint_sent) {
        /* A savepoint of the whole job, and with `stash stop --savepoint`
         * one after which every host stops. */
        s->savepoint_sent = sp;
        s->wants_sent = requests;
        s->want_ns = shm_clock_ns();
        job_want(s->jobs, atomic_load(&c->stop) == SHM_STOP_AFTER_SAVEPOINT ? 2 : 1);
    } else if (requests > s->wants_sent) {
        s->wants_sent = requests;
        s->want_ns = shm_clock_ns();
        job_want(s->jobs, 0);
    }
    if (job_requested(s->jobs) > s->job_done) {
        run_checkpoint(s);
        return true;
    }
    /* No leader answered (none is elected, or the cluster is out of reach):
     * the request fails rather than waiting for ever. */
    uint64_t timeout = (s->o.timeout_ms ? s->o.timeout_ms : DEFAULT_TIMEOUT_MS) * 1000000ull;
    bool late = shm_clock_ns() - s->want_ns >= timeout;
    if ((requests > s->served || sp > s->savepoint_done) && late) {
        /* A savepoint asked for is not answered by a checkpoint run since. */
        outcome r = {.savepoint = sp > s->savepoint_done};
        s->served = requests;
        s->savepoint_done = sp;
        failed(&r, -ETIMEDOUT, "job %s: the leader started no checkpoint within %llu ms",
               s->jobname, (unsigned long long)(timeout / 1000000ull));
        publish(s, 0, 0, shm_now_ns(), &r);
        if (r.savepoint) stop_after(s, false);
        return true;
    }
    return false;
}

void *engine_main(void *arg)
{
    stash_service *s = arg;
    shm_control *c = s->a->control;
    while (!stopping(s)) {
        watch_workers(s);
        if (atomic_load(&c->lazy_failed)) {
            fall_back(s);
            continue;
        }
        uint32_t seen = atomic_load(&c->wake);
        /* Scheduled on the monotonic clock; shown on the wall's. */
        uint64_t now = shm_clock_ns();
        uint64_t earliest = s->last_end_ns + s->o.min_pause_ms * 1000000ull;
        uint64_t due = s->o.interval_ms ? s->last_end_ns + interval_ns(s) : UINT64_MAX;
        atomic_store(&c->next_due_ns,
                     !s->o.interval_ms ? 0 : shm_now_ns() + (due > now ? due - now : 0));
        bool asked = atomic_load(&c->requests) > s->served ||
                     atomic_load(&c->savepoint_ticket) > s->savepoint_done;
        if (s->jobs) {
            /* The leader decides when: requests go to it, its ids come back. */
            if (job_host_turn(s)) continue;
            shm_futex_wait(&c->wake, seen, IDLE_NS);
            continue;
        }
        if ((asked || now >= due) && now >= earliest) {
            run_checkpoint(s);
            continue;
        }
        uint64_t until = asked ? earliest : (due > earliest ? due : earliest);
        uint64_t wait = until > now && until - now < IDLE_NS ? until - now : IDLE_NS;
        shm_futex_wait(&c->wake, seen, wait);
    }
    atomic_store(&s->stopped, 1);
    return NULL;
}
