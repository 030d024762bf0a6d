/* SPDX-License-Identifier: MIT */
/*
 * start.c: starting and stopping the persistence engine: the arena created
 * (restored from the newest complete checkpoint, a given one, or a job's
 * newest across hosts) or reattached, its control block claimed, the RADOS
 * connection opened and the job joined, the engine's thread started; and
 * all of it let go again.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/service/engine.h"

int service_install_opstate(stash_arena *a, const ckpt_restored *r)
{
    shm_control *c = a->control;
    for (uint32_t i = 0; i < r->op_parallelism; i++) {
        shm_off off = 0;
        int rc =
            r->op_blobs[i].len ? shm_blob_put(a, r->op_blobs[i].data, r->op_blobs[i].len, &off) : 0;
        if (rc < 0) return rc;
        atomic_store(&c->workers[i].committed.len, r->op_blobs[i].len);
        atomic_store(&c->workers[i].committed.off, off);
    }
    atomic_store(&c->committed_p, r->op_parallelism);
    /* The workers of the checkpoint, not the one that restored it. */
    atomic_store(&c->parallelism, r->op_parallelism);
    return 0;
}

/* Restores what a new arena starts from: a job's newest checkpoint (the
 * key groups of this host's workers), the checkpoint or savepoint
 * directory from, or the newest complete checkpoint of dir. */
static int restore_into(stash_service *s, stash_worker *w, const char *from, ckpt_restored *out)
{
    if (s->job_restore)
        return ckpt_job_restore(w->arena, s->remote, s->job_from, s->job_restore, &s->ckpts,
                                s->o.job_parallelism, &s->job_workers, s->e, w->store, out);
    if (s->remote_view)
        return ckpt_storage_restore(s->remote, s->job, s->remote_view, &s->ckpts, w->arena,
                                    w->range, w->store, out);
    if (from) return ckpt_restore_path(w->arena, from, w->range, s->e, w->store, out);
    return ckpt_restore_prepared(w->arena, &s->ckpts, 0, UINT64_MAX, w->range, s->e, w->store, NULL,
                                 NULL, out);
}

/* Begins a lazy restore of the checkpoint at path (from, or dir's chk-ID)
 * into the new arena w owns whole; 1 if it cannot be lazy (a path too long
 * for the control block): restore it whole. */
static int begin_lazy(stash_service *s, stash_worker *w, const char *from, uint64_t id,
                      ckpt_restored *out)
{
    char path[4096];
    int rc = from ? ckpt_path_of(path, "%s", from)
                  : ckpt_path_of(path, "%s/chk-%llu", s->dir, (unsigned long long)id);
    if (rc == 0) rc = ckpt_lazy_begin(w->arena, path, w->range, s->e, out);
    if (rc != -ENAMETOOLONG) return rc;
    engine_say(s, STASH_LOG_WARN, "restore", "restoring whole: %s", stash_errmsg());
    return 1;
}

/* A checkpoint past the largest id would be listed by no one: a service
 * whose checkpoints would need one refuses to start. */
static int last_id_reached(const stash_service *s, uint64_t id)
{
    return shm_fail(-EOVERFLOW,
                    "%s: checkpoint %llu is the last id a checkpoint may have: start from a "
                    "savepoint of a smaller id (its dump's snapshot line changed, then loaded)",
                    s->dir, (unsigned long long)id);
}

/* Restores into the new arena a (taken) what it starts from, through a
 * worker that owns it whole. */
static int fill_arena(stash_service *s, stash_arena *a, const stash_arena_opts *ao,
                      const char *from, uint64_t id)
{
    stash_worker *w;
    int rc = service_worker_open_on(
        a, &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 1}, &w);
    if (rc) return rc;
    ckpt_restored out = {0};
    uint64_t t0 = shm_now_ns();
    bool lazy = s->o.lazy_restore && !s->job_restore && !s->remote_view;
    if (lazy && (rc = begin_lazy(s, w, from, id, &out)) == 1) {
        lazy = false;
        rc = 0;
    }
    if (rc == 0 && !lazy) rc = restore_into(s, w, from, &out);
    if (rc == 0) rc = service_install_opstate(w->arena, &out);
    if (rc == 0) {
        shm_control *c = w->arena->control;
        uint64_t took = shm_now_ns() - t0;
        atomic_store(&c->completed, out.id);
        atomic_store(&c->last_id, out.id);
        atomic_store(&c->restored_id, out.id);
        atomic_store(&c->restored_ns, took);
        atomic_store(&c->restored_at_ns, shm_now_ns());
        atomic_store(&c->restored_records, out.records);
        /* Rolled back from the copies the restore left until a checkpoint
         * of this arena holds them. */
        for (uint32_t i = 0; s->job_restore && i < STASH_MAX_WORKERS; i++)
            if (ckpt_job_workers_has(&s->job_workers, i))
                atomic_store(&c->workers[i].job_restored, out.id);
        if (lazy)
            engine_say(s, STASH_LOG_INFO, "restore",
                       "restoring %s%s%llu lazily: serving after %.1f ms, each key group "
                       "when first touched or in the background",
                       from ? from : "checkpoint ", from ? ", id " : "", (unsigned long long)out.id,
                       (double)took / 1e6);
        else
            engine_say(s, STASH_LOG_INFO, "restore",
                       "restored %s%s%llu (%llu records) in %.1f ms%s%s",
                       from ? from : "checkpoint ", from ? ", id " : "", (unsigned long long)out.id,
                       (unsigned long long)out.records, (double)took / 1e6,
                       out.skipped ? "; passed over: " : "", out.skipped ? out.why : "");
    }
    ckpt_restored_free(&out);
    /* Named once whole: no worker attaches to a half-restored arena, and a
     * service killed meanwhile leaves nothing. */
    if (rc == 0) rc = shm_arena_publish(w->arena, ao);
    stash_worker_close(w);
    return rc;
}

/* Creates arena name, filled from the checkpoint or savepoint directory
 * from, or without one from the newest complete checkpoint of the
 * checkpoint directory if there is one. */
static int build_arena(stash_service *s, const char *name, const char *from)
{
    stash_arena_opts ao = s->arena_opts;
    if (s->replace) ao.flags |= STASH_ARENA_REPLACE;
    uint64_t id = 0;
    uint32_t maxp = 0;
    bool restore = true;
    int rc = 0;
    if (!from && s->o.host) {
        restore = s->job_restore != NULL;
        if (restore) maxp = s->job_restore->parts[0].max_parallelism;
    } else if (!from && s->remote_view) {
        id = s->remote_view->id;
        maxp = s->remote_view->max_parallelism;
    } else if (!from) {
        rc = ckpt_newest(&s->ckpts, s->e, &id, &maxp);
        /* Checkpoints that all fail to open are not an empty directory:
         * starting empty would lose them, unless asked to. */
        if (rc == STASH_ECORRUPT && s->o.start_empty) {
            engine_say(s, STASH_LOG_WARN, "restore", "starting empty as asked: %s", stash_errmsg());
            rc = -ENOENT;
        }
        if (rc < 0 && rc != -ENOENT) return rc;
        restore = rc == 0;
        rc = 0;
    }
    if (from && (rc = ckpt_path_info(from, s->e, &id, &maxp)) < 0) return rc;
    if (restore && id >= CKPT_MAX_ID) return last_id_reached(s, id);
    if (restore) ao.max_parallelism = maxp;
    stash_arena *a;
    rc = shm_arena_make(name, &ao, &a);
    if (rc == 0 && restore) {
        rc = fill_arena(s, a, &ao, from, id);
    } else if (rc == 0) {
        rc = shm_arena_publish(a, &ao);
        stash_arena_close(a);
    }
    if (rc) {
        char why[512], path[256];
        snprintf(why, sizeof why, "%s", stash_errmsg());
        shm_arena_path(name, &ao, path, sizeof path);
        return shm_fail(rc, "%s: cannot create the arena: %s", path, why);
    }
    return 0;
}

/* Creates arena name (build_arena): from --restore (a directory, or a
 * storage's URL copied beside dir's checkpoints first), or with a remote
 * storage from the checkpoint JOB/latest names (read straight from the
 * storage and copied into dir meanwhile, or with a lazy restore copied
 * into dir first), or from dir's newest. */
static int create_arena(stash_service *s, const char *name)
{
    const char *from = s->o.restore;
    char fetched[4096];
    int rc = 0;
    if (from && ckpt_url(from) && !s->o.host) {
        ckpt_fetched f;
        if ((rc = ckpt_url_fetch(from, &s->ckpts, &f)) != 0) return rc;
        rc = build_arena(s, name, f.path);
        ckpt_url_release(&f);
        return rc;
    }
    if (s->o.host) {
        /* A host restores from the job's newest checkpoint, not its own
         * parts (or from what the job was started from). */
        s->job_restore = malloc(sizeof *s->job_restore);
        rc = s->job_restore ? ckpt_job_source(s->remote, s->jobname, s->job_from,
                                              sizeof s->job_from, s->job_restore)
                            : -ENOMEM;
        if (rc == -ENOENT) {
            free(s->job_restore);
            s->job_restore = NULL;
            rc = 0;
        }
        if (rc == 0) rc = build_arena(s, name, NULL);
        free(s->job_restore);
        s->job_restore = NULL;
        return rc;
    }
    if (!from && s->remote_latest) {
        char chk[64];
        snprintf(chk, sizeof chk, "chk-%llu", (unsigned long long)s->remote_latest);
        /* Read straight from the storage into the arena (its copy in the
         * directory written meanwhile), unless it is here already or a lazy
         * restore reads key groups from the directory's copy. */
        bool here = ckpt_has_metadata(&s->ckpts, s->remote_latest);
        if (here && (rc = ckpt_path_of(fetched, "%s/%s", s->dir, chk)) == 0 &&
            (rc = build_arena(s, name, fetched)) != STASH_ECORRUPT && rc != -EIO && rc != -ENOENT)
            return rc;
        if (here) {
            /* The directory's copy is damaged, unreadable or incomplete: the
             * storage's is the checkpoint, read again in its place (its
             * shared files written again too). */
            engine_say(s, STASH_LOG_WARN, "restore",
                       "the directory's copy did not restore (%s): reading checkpoint %llu from "
                       "%s",
                       stash_errmsg(), (unsigned long long)s->remote_latest,
                       ckpt_storage_where(s->remote));
            if ((rc = shm_dir_remove(&s->ckpts, chk, 2)) != 0) return rc;
        }
        if (!s->o.lazy_restore) {
            ckpt_view v;
            if ((rc = ckpt_storage_view(s->remote, s->job, chk, &v)) != 0) return rc;
            s->remote_view = &v;
            rc = build_arena(s, name, NULL);
            ckpt_view_close(&v);
            s->remote_view = NULL;
            return rc;
        }
        rc = ckpt_storage_fetch(s->remote, s->job, &s->ckpts, chk);
        if (rc == 0) rc = ckpt_path_of(fetched, "%s/%s", s->dir, chk);
        if (rc) return rc;
        from = fetched;
    }
    return build_arena(s, name, from);
}

/* Claims the control block for this process, or STASH_EBUSY. */
static int claim(stash_service *s)
{
    stash_arena *a = s->a;
    shm_control *c = a->control;
    int rc = shm_lock_acquire(&c->lock, NULL, NULL);
    if (rc < 0) return rc;
    int32_t pid;
    if (shm_service_alive(a, &pid)) {
        shm_lock_release(&c->lock);
        return shm_fail(STASH_EBUSY, "%s: a service (pid %d) already serves the arena", a->path,
                        pid);
    }
    rc = shm_reader_join(a, &s->reader);
    if (rc < 0) {
        shm_lock_release(&c->lock);
        return rc;
    }
    s->holder = s->reader - STASH_MAX_WORKERS + 1;
    if (shm_reader_join(a, &s->reader2) < 0) s->reader2 = 0;
    /* What a dead engine left: its request (workers that cut it late release
     * their own pins once they see it aborted), then its pins. */
    atomic_store(&c->pending, 0);
    uint64_t last = atomic_load(&c->last_id);
    if (last > atomic_load(&c->completed) && last > atomic_load(&c->aborted))
        atomic_store(&c->aborted, last);
    for (uint32_t h = 1; h <= SHM_READERS; h++)
        if (h == s->holder || !shm_reader_alive(a, h)) shm_table_release_holder(a, h, NULL);
    service_release_cuts(a);
    atomic_store(&c->stop, 0);
    snprintf(c->dir, sizeof c->dir, "%s", s->dir);
    c->service_since_ns = shm_now_ns();
    atomic_store(&c->service_reader, s->holder);
    /* Every request counted after the engine shows alive is its to answer:
     * what came before is read before it shows. */
    s->served = atomic_load(&c->requests);
    s->savepoint_done = atomic_load(&c->savepoint_ticket);
    atomic_store(&c->service_start, shm_proc_start_time(getpid()));
    atomic_store(&c->service_pid, getpid());
    shm_lock_release(&c->lock);
    return 0;
}

static void release(stash_service *s)
{
    if (s->lazy_running) {
        atomic_store(&s->lazy_stop, 1);
        pthread_join(s->lazy_thread, NULL);
    }
    if (s->a) {
        shm_control *c = s->a->control;
        if (s->base) engine_unpin_all(s->a, s->base);
        if (s->holder && atomic_load(&c->service_pid) == getpid()) {
            atomic_store(&c->service_pid, 0);
            shm_reader_leave(s->a, s->reader);
            if (s->reader2) shm_reader_leave(s->a, s->reader2);
            shm_futex_wake(&c->finished);
        }
        store_close(s->store);
        stash_arena_close(s->a);
    }
    ioe_engine_close(s->e);
    shm_dir_close(&s->ckpts);
    job_close(s->jobs);
    ckpt_storage_close(s->remote);
    free(s->cut);
    free(s->base);
    free(s->seen);
    free(s);
}

/* A host of a job: its options checked (where: its storage, "rados://POOL"). */
static int check_host_opts(stash_service *s, const char *where)
{
    if (!ckpt_job_host_ok(s->o.host))
        return shm_fail(-EINVAL, "host '%s': 1 to %u letters, digits, '.', '_' or '-'", s->o.host,
                        CKPT_JOB_HOST_MAX);
    if (!s->o.workers || !s->o.job_parallelism)
        return shm_fail(-EINVAL,
                        "host %s: a job's host needs its workers and the job's parallelism",
                        s->o.host);
    int rc = ckpt_job_workers_parse(s->o.workers, &s->job_workers);
    if (rc == 0 && s->o.restore) {
        /* Refused before the job is joined. */
        char from[256];
        uint64_t id;
        rc = ckpt_job_source_parse(where, s->o.restore, from, sizeof from, &id);
    }
    for (uint32_t i = 0; rc == 0 && i < s->job_workers.n; i++)
        if (s->job_workers.r[i].last >= s->o.job_parallelism)
            rc = shm_fail(-EINVAL, "host %s: worker %u of a job of %u workers", s->o.host,
                          s->job_workers.r[i].last, s->o.job_parallelism);
    snprintf(s->jobname, sizeof s->jobname, "%s", s->job);
    return rc;
}

static void job_log(void *ctx, stash_log_level level, const char *subject, const char *message)
{
    engine_say(ctx, level, subject, "%s", message);
}

/* Joins the job as host s->o.host, before any arena is made or touched:
 * a refused host leaves nothing. Its parts go to JOB/part/HOST/EPOCH. */
static int open_job(stash_service *s)
{
    uint32_t maxp =
        s->o.arena->max_parallelism ? s->o.arena->max_parallelism : STASH_DEFAULT_MAX_PARALLELISM;
    svc_job_opts o = {.remote = s->remote,
                      .job = s->jobname,
                      .host = s->o.host,
                      .parallelism = s->o.job_parallelism,
                      .max_parallelism = maxp > s->o.job_parallelism ? maxp : s->o.job_parallelism,
                      .workers = s->job_workers,
                      .lease_ms = s->o.lease_ms,
                      .call_ms = s->call_ms,
                      .interval_ms = s->o.interval_ms,
                      .timeout_ms = s->o.timeout_ms,
                      .retain = s->o.retain,
                      .log = job_log,
                      .log_ctx = s};
    int rc = job_open(&o, &s->jobs);
    if (rc == 0)
        rc = ckpt_job_part_prefix(s->job, sizeof s->job, s->jobname, s->o.host, job_epoch(s->jobs));
    return rc;
}

/* A host of a job started with --restore rados://POOL/FROM/job-ID: the
 * job's first start restores that job checkpoint (every host the same,
 * noted in the pool, the job's ids going on above it); once the job has
 * committed a checkpoint, its hosts restore from the newest as always. */
static int job_start_from(stash_service *s)
{
    const char *url = s->o.restore;
    char from[256], had[1024];
    uint64_t id, latest;
    int rc = ckpt_job_source_parse(ckpt_storage_where(s->remote), url, from, sizeof from, &id);
    if (rc) return rc;
    if ((rc = ckpt_storage_latest(s->remote, s->jobname, &latest)) == 0) {
        rc = ckpt_job_origin(s->remote, s->jobname, had, sizeof had);
        if (rc == 0 && strcmp(had, url) == 0) {
            engine_say(s, STASH_LOG_INFO, "restore",
                       "job %s was started from %s and has committed checkpoint %llu since: "
                       "restoring from that",
                       s->jobname, url, (unsigned long long)latest);
            return 0;
        }
        if (rc && rc != -ENOENT) return rc;
        return shm_fail(-EEXIST,
                        "job %s has committed checkpoint %llu: --restore %s starts a new job "
                        "(another --job), or leave --restore out to go on from the newest",
                        s->jobname, (unsigned long long)latest, url);
    }
    if (rc != -ENOENT) return rc;
    if ((rc = ckpt_job_committed(s->remote, from, id)) != 0) return rc;
    if ((rc = ckpt_job_started_from(s->remote, s->jobname, url)) != 0) return rc;
    return ckpt_job_ids_above(s->remote, s->jobname, id);
}

/* A remote storage: the connection (to container of ops), and the
 * checkpoint JOB/latest names. */
static int connect_remote(stash_service *s, const ckpt_storage_ops *ops, const char *container,
                          const char *job, const stash_storage_opts *so)
{
    if (!*job || (size_t)snprintf(s->job, sizeof s->job, "%s", job) >= sizeof s->job)
        return shm_fail(-EINVAL, "job '%s': a name of 1 to %zu bytes", job, sizeof s->job - 1);
    if (s->o.host) {
        char where[192];
        snprintf(where, sizeof where, "%s://%s", ops->scheme, container);
        int rc = check_host_opts(s, where);
        if (rc) return rc;
    }
    int rc = ckpt_storage_open(ops, container, so, &s->remote);
    if (rc == 0 && s->o.host && !ckpt_storage_can(s->remote, CKPT_CAN_JOB))
        rc = shm_fail(-ENOTSUP,
                      "%s: a job that spans hosts needs leases and notifications, which the %s "
                      "storage lacks (rados has them)",
                      ckpt_storage_where(s->remote), ops->scheme);
    if (rc == 0 && !ckpt_storage_can(s->remote, CKPT_CAN_SWAP))
        rc = shm_fail(-ENOTSUP, "%s: the %s storage has no compare-and-swap to commit with",
                      ckpt_storage_where(s->remote), ops->scheme);
    if (rc == 0 && s->o.host) rc = open_job(s);
    if (rc == 0 && s->o.host && s->o.restore) rc = job_start_from(s);
    if (rc) return rc;
    rc = ckpt_storage_latest(s->remote, s->job, &s->remote_latest);
    return rc == -ENOENT ? 0 : rc; /* a job without checkpoints yet */
}

/* The storage: storage_url, or its older form (storage, pool, job, ceph_*),
 * decided here alone. Sets s->dir and s->memory; connects a remote one. */
static int choose_storage(stash_service *s, const char *name)
{
    const char *url = s->o.storage_url, *dir = s->o.dir;
    stash_storage_opts so;
    int rc = SHM_TAKE_OPTS("stash_service_start", stash_storage_opts, s->o.storage_opts, &so);
    if (rc) return rc;
    const ckpt_storage_ops *ops = NULL;
    char container[128], job[256], chk[256];
    if (url && strncmp(url, "file:", 5) == 0 && !ckpt_url(url)) {
        if (dir && strcmp(dir, url + 5) != 0)
            return shm_fail(-EINVAL, "%s: and dir %s: two checkpoint directories", url, dir);
        dir = url + 5;
    } else if (url && strcmp(url, "memory:") == 0) {
        s->memory = true;
    } else if (url) {
        if ((rc = ckpt_url_parse(url, &ops, container, sizeof container, job, sizeof job, chk,
                                 sizeof chk)) != 0)
            return shm_fail(rc,
                            "storage %s: not file:DIR, memory:, rados://POOL/JOB or "
                            "s3://BUCKET/PREFIX",
                            url);
        if (chk[0])
            return shm_fail(-EINVAL, "storage %s: names checkpoint %s, not a job", url, chk);
    } else if (s->o.storage == STASH_STORAGE_MEMORY) {
        s->memory = true;
    } else if (s->o.storage == STASH_STORAGE_RADOS) {
        if (!s->o.pool) return shm_fail(-EINVAL, "the rados storage needs a pool");
        ops = &ckpt_rados_ops;
        snprintf(container, sizeof container, "%s", s->o.pool);
        snprintf(job, sizeof job, "%s", s->o.job ? s->o.job : name);
        so = (stash_storage_opts){.sz = sizeof so,
                                  .ceph_conf = s->o.ceph_conf,
                                  .ceph_id = s->o.ceph_id,
                                  .timeout_ms = s->o.ceph_timeout_ms};
    } else if (s->o.storage != STASH_STORAGE_FS) {
        return shm_fail(-EINVAL, "unknown storage %d", (int)s->o.storage);
    }
    char leaf[128];
    snprintf(leaf, sizeof leaf, "%.100s.checkpoints", name);
    if (s->memory && !dir)
        rc = shm_private_path(SHM_PRIVATE_RUNTIME, leaf, s->dir, sizeof s->dir);
    else if (!dir)
        rc = shm_fail(-EINVAL, "the %s storage needs a checkpoint directory",
                      ops ? ops->scheme : "fs");
    /* Absolute: the arena names it to workers, which may run elsewhere. */
    else if (shm_path_absolute(dir, s->dir, sizeof s->dir) < 0)
        rc = shm_fail(-ENAMETOOLONG, "%s: a checkpoint directory of at most %u bytes", dir,
                      SHM_CTL_DETAIL - 1);
    if (rc == 0 && ops) {
        s->call_ms = so.timeout_ms;
        rc = connect_remote(s, ops, container, job, &so);
    }
    return rc;
}

/* Whether checkpoints are readable by the arena's group: as the arena is
 * (created with STASH_ARENA_GROUP), so that who may map it may read them. */
static bool group_readable(const char *name, const stash_arena_opts *ao)
{
    char path[256];
    struct stat st;
    if (shm_arena_path(name, ao, path, sizeof path) == 0 && stat(path, &st) == 0)
        return (st.st_mode & S_IRGRP) != 0;
    return (ao->flags & STASH_ARENA_GROUP) != 0;
}

/* Starts the job's side of a host once its arena is claimed: the arena
 * names the sub-job its parts go to. */
static int start_job(stash_service *s)
{
    shm_control *c = s->a->control;
    int rc = shm_lock_acquire(&c->lock, NULL, NULL);
    if (rc < 0) return rc;
    snprintf(c->job_part, sizeof c->job_part, "%s", s->job);
    atomic_store(&c->fenced, 0);
    c->fenced_why[0] = 0;
    shm_lock_release(&c->lock);
    /* A request made before the service started is the leader's to answer too. */
    s->wants_sent = s->served;
    s->savepoint_sent = s->savepoint_done;
    return job_start(s->jobs, s->a->hdr->max_parallelism, &c->wake);
}

/* Whether the existing arena of a job's host is behind the job: the job's
 * newest checkpoint holds no part of this host written from this arena
 * for the same workers (its workers were taken over, or it took others
 * over, or the job went on without it). Such an arena is restored anew
 * from the job; one another host or job served is refused. */
static int job_arena_behind(stash_service *s, bool *behind)
{
    shm_control *c = s->a->control;
    char had[SHM_CTL_DETAIL], mine[1024], prefix[1024], want[512], got[512];
    int rc = shm_lock_acquire(&c->lock, NULL, NULL);
    if (rc < 0) return rc;
    memcpy(had, c->job_part, sizeof had);
    shm_lock_release(&c->lock);
    had[sizeof had - 1] = 0;
    *behind = false;
    snprintf(mine, sizeof mine, "%s/part/%s/", s->jobname, s->o.host);
    if (had[0] && strncmp(had, mine, strlen(mine)) != 0)
        return shm_fail(-EBUSY, "%s: the arena served %s, not host %s of job %s", s->a->path, had,
                        s->o.host, s->jobname);
    ckpt_job_record *rec = malloc(sizeof *rec);
    uint64_t id = 0;
    rc =
        rec ? ckpt_job_latest(s->remote, s->jobname, &id, rec) : shm_fail(-ENOMEM, "out of memory");
    if (rc == -ENOENT) {
        free(rec);
        return 0; /* no job checkpoint yet: nothing to be behind */
    }
    const ckpt_job_part *part = NULL;
    for (size_t i = 0; rc == 0 && i < rec->n; i++)
        if (strcmp(rec->parts[i].host, s->o.host) == 0) part = &rec->parts[i];
    if (rc == 0 && part) {
        ckpt_job_part_prefix(prefix, sizeof prefix, s->jobname, part->host, part->epoch);
        ckpt_job_workers_format(&part->workers, got, sizeof got);
        ckpt_job_workers_format(&s->job_workers, want, sizeof want);
    }
    char why[1600] = "";
    if (rc == 0 && !part)
        snprintf(why, sizeof why, "job checkpoint %llu holds no part of host %s",
                 (unsigned long long)id, s->o.host);
    else if (rc == 0 && strcmp(prefix, had) != 0)
        snprintf(why, sizeof why,
                 "job checkpoint %llu holds host %s's part from %s, not from this arena (%s)",
                 (unsigned long long)id, s->o.host, prefix, had[0] ? had : "none");
    else if (rc == 0 && strcmp(got, want) != 0)
        snprintf(why, sizeof why, "host %s served workers %s in job checkpoint %llu, now %s",
                 s->o.host, got, (unsigned long long)id, want);
    *behind = why[0] != 0;
    if (*behind)
        engine_say(s, STASH_LOG_WARN, "restore", "%s: %s: restored anew from it", s->a->path, why);
    free(rec);
    return rc;
}

STASH_API int stash_service_start(const char *name, const stash_service_opts *opts,
                                  stash_service **out)
{
    shm_clear_error();
    if (!name || !out) return shm_refuse_null(__func__, "name or out");
    stash_service *s = calloc(1, sizeof *s);
    if (!s) return shm_fail(-ENOMEM, "out of memory");
    s->ckpts.fd = -1;
    int rc = SHM_TAKE_OPTS(__func__, stash_service_opts, opts, &s->o);
    if (rc == 0) rc = SHM_TAKE_OPTS(__func__, stash_arena_opts, s->o.arena, &s->arena_opts);
    if (rc) {
        free(s);
        return rc;
    }
    s->o.arena = &s->arena_opts;
    rc = choose_storage(s, name);
    /* A directory the engine cannot write would fail every checkpoint. */
    if (rc == 0) {
        s->group = group_readable(name, s->o.arena);
        rc = ckpt_dir_open(s->dir, s->group, &s->ckpts);
    }
    /* The I/O engine's one line (its fallback from io_uring) is the service's. */
    if (rc == 0) rc = ioe_engine_open(&(ioe_opts){.log = engine_io_line, .log_ctx = s}, &s->e);
    if (rc == 0) {
        rc = stash_arena_open(name, s->o.arena, &s->a);
        bool behind = false;
        if (rc == 0 && s->jobs) rc = job_arena_behind(s, &behind);
        if (rc == 0 && behind && shm_service_alive(s->a, NULL))
            rc = shm_fail(STASH_EBUSY, "%s: a live service serves the arena", s->a->path);
        if (rc == 0 && behind) {
            /* Workers still on it would go on unseen: they are told to stop. */
            shm_control *c = s->a->control;
            if ((rc = shm_lock_acquire(&c->lock, NULL, NULL)) == 0) {
                snprintf(c->fenced_why, sizeof c->fenced_why,
                         "%.110s: the arena was restored anew from job %.100s", s->a->path,
                         s->jobname);
                atomic_store(&c->fenced, 1);
                shm_lock_release(&c->lock);
            }
        }
        if (rc == 0 && behind) {
            stash_arena_close(s->a);
            s->a = NULL;
            s->replace = true;
            rc = -ENOENT;
        }
        if (rc == -ENOENT) {
            rc = create_arena(s, name);
            if (rc == 0) rc = stash_arena_open(name, s->o.arena, &s->a);
        }
    }
    if (rc == 0) {
        /* Owners log what they change (where their store keeps a change
         * log) only while deltas need it. */
        atomic_store(&s->a->hdr->change_track, s->o.incremental ? 1 : 0);
        rc = store_open(s->a, 0, (stash_kg_range){0, s->a->hdr->max_parallelism - 1}, &s->store);
    }
    if (rc == 0) rc = claim(s);
    if (rc == 0) {
        uint32_t maxp = s->a->hdr->max_parallelism;
        s->cut = calloc(maxp, sizeof *s->cut);
        s->base = calloc(maxp, sizeof *s->base);
        s->seen = calloc(STASH_MAX_WORKERS, sizeof *s->seen);
        if (!s->cut || !s->base || !s->seen) rc = shm_fail(-ENOMEM, "out of memory");
    }
    if (rc == 0) {
        shm_control *c = s->a->control;
        /* Ids go on after every one the directory names: one a restore
         * passed over, a savepoint, a partial one a killed engine left. */
        uint64_t highest = 0;
        rc = ckpt_highest_id(&s->ckpts, &highest);
        uint64_t last = atomic_load(&c->last_id);
        if (s->remote_latest > highest) highest = s->remote_latest;
        s->next_id = (highest > last ? highest : last) + 1;
        if (rc == 0 && s->next_id > CKPT_MAX_ID) rc = last_id_reached(s, s->next_id - 1);
        /* What savepoints a killed engine was writing left (their ids
         * counted above: never used again). */
        if (rc == 0 && ckpt_remove_abandoned(&s->ckpts) > 0)
            engine_say(s, STASH_LOG_INFO, "service",
                       "removed partial savepoints a killed engine left");
        s->last_end_ns = shm_clock_ns();
        engine_account_io(s);
    }
    if (rc == 0 && s->jobs) rc = start_job(s);
    if (rc == 0) {
        rc = -pthread_create(&s->thread, NULL, engine_main, s);
        if (rc) shm_fail(rc, "cannot start the engine thread");
    }
    /* A lazy restore begun here or by an engine that died goes on. */
    if (rc == 0 && ckpt_lazy_pending(s->a)) engine_lazy_start(s);
    if (rc) {
        release(s);
        return rc;
    }
    engine_say(s, STASH_LOG_INFO, "service", "serving %s, checkpoints in %s (next id %llu)",
               s->a->path, s->dir, (unsigned long long)s->next_id);
    *out = s;
    return 0;
}

STASH_API void stash_service_stop(stash_service *service)
{
    if (!service) return;
    atomic_store(&service->quit, 1);
    job_quit(service->jobs);
    shm_futex_wake(&service->a->control->wake);
    pthread_join(service->thread, NULL);
    release(service);
}

STASH_API int stash_service_stopped(const stash_service *service)
{
    if (!service) return shm_refuse_null(__func__, "service");
    if (!atomic_load(&service->stopped)) return 0;
    return service->failure ? service->failure : 1;
}
