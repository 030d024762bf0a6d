/* SPDX-License-Identifier: MIT */
/*
 * job.c: a service as one host of a job that spans hosts (job.h). The
 * job's objects (rados_job.h): JOB/hosts/HOST (a member: the workers it
 * serves, under its lease and the epoch of the service serving it),
 * JOB/leader (the leader's lease), JOB/latest (the leader's epoch, the
 * decisions, the committed checkpoint), JOB/ctl (watched by every host).
 * Notifications on JOB/ctl, each a line:
 *   checkpoint ID        the leader asks every host for its part of ID
 *   savepoint ID [stop]  the same for a savepoint of the job (then every host stops)
 *   part ID HOST         HOST's part of ID is in (wakes the leader)
 *   verdict ID           ID is committed or aborted (read it from the pool)
 *   want [savepoint|stop] a host asks the leader for a checkpoint now (a savepoint;
 *                        a savepoint after which the job stops)
 *   takeover LOST HOST   HOST is to take the lost host's workers over
 * Every receiver also polls what it waits for: a notification lost with
 * a watch only delays it. Leases are the cluster's; what a service may
 * write rests on its epochs, compared in the writes themselves; its own
 * waits are on the monotonic clock.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends/service/job.h"

#define POLL_NS 200000000ull         /* the longest wait between two looks at the pool */
#define HOSTS_EVERY_NS 1000000000ull /* looks for lost hosts while a checkpoint waits */
#define NOTIFY_MS 5000u /* acknowledgements of a notification awaited in the background */
#define SETTLE_MAX 64u  /* undecided ids a new leader or member aborts, at most */

struct svc_job {
    svc_job_opts o;
    char job[256];
    char host[CKPT_JOB_HOST_MAX + 1];
    char cookie[96]; /* this service's, on its leases */
    char member[1024], leader[1024], ctl[1024], hosts[1024];
    uint64_t epoch;                   /* this service's member epoch */
    bool joined;                      /* the member's lease taken and its epoch set */
    _Atomic bool fenced;              /* its epoch is not the member's any more */
    _Atomic(_Atomic uint32_t *) wake; /* the engine's, once it started */
    ckpt_storage_watch *watch;
    pthread_t thread, leases; /* the job's work; the leases' renewals, apart */
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    ckpt_job_workers workers;
    uint32_t events; /* bumped by each notification */
    bool want;
    unsigned want_sp; /* 1: a savepoint asked for, 2: one after which the job stops */
    bool take_pending;
    char take_lost[CKPT_JOB_HOST_MAX + 1];
    bool quit;
    char fenced_why[256];
    _Atomic uint64_t requested;
    _Atomic uint64_t requested_sp; /* the newest savepoint the leader asked for */
    _Atomic uint64_t stop_id;      /* the savepoint after which the job stops (0: none) */
    _Atomic bool stopped;          /* that one was committed: the job does no more */
    /* set by the leases' thread */
    _Atomic bool leading;
    _Atomic uint64_t leader_epoch; /* while leading */
    _Atomic bool new_lead;         /* the lead was taken: the job's thread starts afresh */
    _Atomic uint64_t clean_ns;     /* since when this host's own renewals succeed (monotonic) */
    uint64_t leases_ns;            /* its last renewal */
    /* the job's thread's own */
    uint64_t next_due_ns;
    uint64_t hosts_ns;
    bool wanted;                           /* a checkpoint asked for, not run yet */
    unsigned wanted_sp;                    /* a savepoint (2: then stop), not run yet */
    char announced[CKPT_JOB_HOST_MAX + 1]; /* the lost host last said to be lost */
};

__attribute__((format(printf, 4, 5))) static void say(svc_job *j, stash_log_level level,
                                                      const char *subject, const char *fmt, ...)
{
    if (!j->o.log) return;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    j->o.log(j->o.log_ctx, level, subject, msg);
}

/* This host serving workers w, as its member object and notes say. */
static ckpt_job_part self_part(const svc_job *j, const ckpt_job_workers *w)
{
    ckpt_job_part part = {.parallelism = j->o.parallelism,
                          .max_parallelism = j->o.max_parallelism,
                          .workers = *w,
                          .epoch = j->epoch};
    memcpy(part.host, j->host, sizeof part.host);
    return part;
}

static uint32_t lease_ms(const svc_job *j)
{
    return j->o.lease_ms ? j->o.lease_ms : JOB_DEFAULT_LEASE_MS;
}

/* ---- notifications ------------------------------------------------------------ */

/* Moves *v up to id. */
static void raise_to(_Atomic uint64_t *v, uint64_t id)
{
    uint64_t was = atomic_load(v);
    while (id > was && !atomic_compare_exchange_weak(v, &was, id)) {
    }
}

/* Wakes the engine, once it started. */
static void wake(svc_job *j)
{
    _Atomic uint32_t *w = atomic_load(&j->wake);
    if (w) shm_futex_wake(w);
}

static void on_notify(void *ctx, const char *msg)
{
    svc_job *j = ctx;
    uint64_t id = 0;
    char a[CKPT_JOB_HOST_MAX + 2] = "", b[CKPT_JOB_HOST_MAX + 2] = "";
    bool wake_engine = false;
    pthread_mutex_lock(&j->mu);
    j->events++;
    if (sscanf(msg, "checkpoint %" SCNu64, &id) == 1) {
        raise_to(&j->requested, id);
        wake_engine = true;
    } else if (sscanf(msg, "savepoint %" SCNu64 " %5s", &id, a) >= 1) {
        /* Its kind first: the engine that sees the id sees what it is. */
        raise_to(&j->requested_sp, id);
        if (strcmp(a, "stop") == 0) raise_to(&j->stop_id, id);
        raise_to(&j->requested, id);
        wake_engine = true;
    } else if (strcmp(msg, "want") == 0) {
        j->want = true;
    } else if (strcmp(msg, "want savepoint") == 0) {
        j->want_sp = j->want_sp > 1 ? j->want_sp : 1;
    } else if (strcmp(msg, "want stop") == 0) {
        j->want_sp = 2;
    } else if (sscanf(msg, "takeover %64s %64s", a, b) == 2 && strcmp(b, j->host) == 0 &&
               ckpt_job_host_ok(a) && !j->take_pending) {
        memcpy(j->take_lost, a, strlen(a) + 1); /* checked: at most CKPT_JOB_HOST_MAX */
        j->take_pending = true;
        wake_engine = true;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (wake_engine) wake(j);
}

static void notify(svc_job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void notify(svc_job *j, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (ckpt_storage_notify(j->o.remote, j->ctl, msg, NOTIFY_MS) < 0)
        say(j, STASH_LOG_WARN, "job", "%s", stash_errmsg());
}

/* Waits until a notification arrives, quit, or ns pass. */
/* Waits up to ns for a notification, a request or the end (any: the
 * leases' thread waits for the end alone). */
static void await_wake(svc_job *j, uint32_t seen, uint64_t ns, bool any)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until); /* the condition variable's clock */
    uint64_t at = (uint64_t)until.tv_nsec + ns;
    until.tv_sec += (time_t)(at / 1000000000ull);
    until.tv_nsec = (long)(at % 1000000000ull);
    pthread_mutex_lock(&j->mu);
    while (!j->quit && (!any || (j->events == seen && !j->want && !j->want_sp)))
        if (pthread_cond_timedwait(&j->cv, &j->mu, &until) == ETIMEDOUT) break;
    pthread_mutex_unlock(&j->mu);
}

static void await_event(svc_job *j, uint32_t seen, uint64_t ns)
{
    await_wake(j, seen, ns, true);
}

static uint32_t events(svc_job *j)
{
    pthread_mutex_lock(&j->mu);
    uint32_t n = j->events;
    pthread_mutex_unlock(&j->mu);
    return n;
}

static bool quitting(svc_job *j)
{
    pthread_mutex_lock(&j->mu);
    bool q = j->quit;
    pthread_mutex_unlock(&j->mu);
    return q;
}

/* ---- members -------------------------------------------------------------------- */

typedef struct member {
    char name[1024]; /* its object */
    ckpt_job_member m;
    bool alive; /* its lease is held */
} member;

typedef struct members {
    svc_job *j;
    member *v;
    size_t n, cap;
} members;

static int take_member(void *ctx, const char *name)
{
    members *ms = ctx;
    const char *rest = name + strlen(ms->j->hosts);
    if (!ckpt_job_host_ok(rest)) return 0;
    if (ms->n == ms->cap) {
        size_t cap = ms->cap ? 2 * ms->cap : 8;
        member *v = realloc(ms->v, cap * sizeof *v);
        if (!v) return shm_fail(-ENOMEM, "out of memory");
        ms->v = v;
        ms->cap = cap;
    }
    member *m = &ms->v[ms->n];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    int rc = ckpt_job_member_read(ms->j->o.remote, name, &m->m);
    if (rc == -ENOENT) return 0; /* removed meanwhile, or only its lease is left */
    if (rc == STASH_ECORRUPT) {
        say(ms->j, STASH_LOG_WARN, "job", "%s", stash_errmsg());
        return 0;
    }
    if (rc < 0) return rc;
    if (strcmp(m->m.m.host, ms->j->host) == 0)
        m->alive = true;
    else if ((rc = ckpt_storage_lease_held(ms->j->o.remote, name)) < 0)
        return rc;
    else
        m->alive = rc == 1;
    ms->n++;
    return 0;
}

static int list_members(svc_job *j, members *ms)
{
    *ms = (members){j, NULL, 0, 0};
    int rc = ckpt_storage_objects(j->o.remote, j->hosts, take_member, ms);
    if (rc) {
        free(ms->v);
        ms->v = NULL;
    }
    return rc;
}

/* The live member other than skip serving worker w of the job, if any. */
static const member *served_by(const members *ms, uint32_t p, uint32_t w, const char *skip)
{
    for (size_t i = 0; i < ms->n; i++) {
        const member *m = &ms->v[i];
        if (m->alive && m->m.m.parallelism == p && strcmp(m->m.m.host, skip) != 0 &&
            ckpt_job_workers_has(&m->m.m.workers, w))
            return m;
    }
    return NULL;
}

/* Whether a member whose lease lapsed is lost: this host's own renewals
 * have succeeded long enough that the cluster answered all along, and a
 * live host's renewals (every third of a lease, on a thread that does
 * nothing else; one stuck in a call when the cluster came back ends
 * within the call's timeout) would have kept its lease too. After an
 * outage of the cluster, or of this host's link to it, every lease may
 * have lapsed: none is lost until then. A takeover so follows a lost host
 * within one lease and one look at the hosts. */
static bool lost_now(const svc_job *j, uint64_t now)
{
    uint64_t lease = lease_ms(j) * 1000000ull;
    uint64_t call = (j->o.call_ms ? j->o.call_ms : 10000) * 1000000ull + lease / 3;
    return now - atomic_load(&j->clean_ns) >= (call > lease ? call : lease);
}

/* Whether the host taking lost's workers over can no longer finish: its
 * member is gone, or its service was fenced off (its epoch replaced, so it
 * can list nothing more) before it listed any of them. Its claim is then
 * given up for the leader to ask another host; one whose member lists
 * them already is taken over with it. */
static bool taker_gone(const members *ms, const ckpt_job_member *lost)
{
    const char *taker = ckpt_job_member_taker(lost);
    for (size_t i = 0; i < ms->n; i++) {
        const ckpt_job_member *t = &ms->v[i].m;
        if (strcmp(t->m.host, taker) != 0) continue;
        if (ckpt_job_member_epoch(t) != 0) return false;
        for (uint32_t k = 0; k < lost->m.workers.n; k++)
            for (uint32_t w = lost->m.workers.r[k].first; w <= lost->m.workers.r[k].last; w++)
                if (ckpt_job_workers_has(&t->m.workers, w)) return false;
    }
    return true;
}

static uint32_t count_workers(const ckpt_job_workers *w)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < w->n; i++) n += w->r[i].last - w->r[i].first + 1;
    return n;
}

/* The leader's look at the hosts: a member whose lease lapsed is stale
 * if live hosts serve all its workers (or it served another parallelism),
 * and is removed; else it is lost, and the live host serving the fewest
 * workers is asked to take its workers over (which fences the lost
 * host's service off, whatever it does once it wakes). Returns the number
 * of lost hosts (the first one named in why, cap bytes). */
static unsigned check_hosts(svc_job *j, char *why, size_t cap)
{
    members ms;
    unsigned lost = 0;
    if (list_members(j, &ms) < 0) {
        say(j, STASH_LOG_WARN, "job", "looking at the hosts: %s", stash_errmsg());
        return 0;
    }
    bool sure = lost_now(j, shm_clock_ns());
    for (size_t i = 0; i < ms.n; i++) {
        const member *m = &ms.v[i];
        const ckpt_job_part *mp = &m->m.m;
        if (m->alive || !sure) continue;
        bool covered = true;
        for (uint32_t k = 0; k < mp->workers.n && covered; k++)
            for (uint32_t w = mp->workers.r[k].first; w <= mp->workers.r[k].last; w++)
                if (!served_by(&ms, mp->parallelism, w, mp->host)) {
                    covered = false;
                    break;
                }
        if (covered || mp->parallelism != j->o.parallelism) {
            say(j, STASH_LOG_INFO, "job", "host %s is gone and its workers are served: forgotten",
                mp->host);
            ckpt_storage_remove(j->o.remote, m->name);
            continue;
        }
        char ws[512];
        ckpt_job_workers_format(&mp->workers, ws, sizeof ws);
        if (lost++ == 0)
            snprintf(why, cap, "host %s is lost: workers %.200s wait for a takeover", mp->host, ws);
        if (ckpt_job_member_taken(&m->m) && !taker_gone(&ms, &m->m)) continue; /* under way */
        if (ckpt_job_member_taken(&m->m)) {
            say(j, STASH_LOG_WARN, "job",
                "host %s, which was taking host %s's workers over, is gone: they are asked for "
                "again",
                ckpt_job_member_taker(&m->m), mp->host);
            if (ckpt_job_unclaim(j->o.remote, j->job, mp->host, ckpt_job_member_taker(&m->m)) < 0)
                say(j, STASH_LOG_ERROR, "job", "%s", stash_errmsg());
            continue;
        }
        const member *to = NULL;
        for (size_t k = 0; k < ms.n; k++) {
            const member *c = &ms.v[k];
            if (!c->alive || c->m.m.parallelism != j->o.parallelism) continue;
            uint32_t nc = count_workers(&c->m.m.workers);
            uint32_t nt = to ? count_workers(&to->m.m.workers) : 0;
            if (!to || nc < nt || (nc == nt && strcmp(c->m.m.host, to->m.m.host) < 0)) to = c;
        }
        if (!to) continue;
        /* Said once; asked again at each look, in case the notification was lost. */
        if (strcmp(j->announced, mp->host) != 0)
            say(j, STASH_LOG_WARN, "job",
                "host %s is lost (its lease lapsed): host %s takes workers %s", mp->host,
                to->m.m.host, ws);
        snprintf(j->announced, sizeof j->announced, "%s", mp->host);
        notify(j, "takeover %s %s", mp->host, to->m.m.host);
    }
    free(ms.v);
    return lost;
}

/* ---- leases -------------------------------------------------------------------- */

/* Aborts the ids a leader before this one (or a service of this host
 * before this one) asked for and left undecided, so that the hosts
 * waiting on them stop waiting and no part of a service fenced off since
 * is committed. */
static void settle(svc_job *j, const char *why)
{
    char name[1024], buf[32];
    uint64_t latest = 0;
    int rc = ckpt_storage_latest(j->o.remote, j->job, &latest);
    if (rc && rc != -ENOENT) return;
    if (ckpt_job_object(name, sizeof name, j->job, "ids") < 0 ||
        ckpt_storage_pointer(j->o.remote, name, buf, sizeof buf) < 0)
        return;
    uint64_t top = strtoull(buf, NULL, 10);
    for (uint64_t id = top; id > latest && top - id < SETTLE_MAX; id--)
        if (ckpt_job_verdict(j->o.remote, j->job, id) == 0 &&
            ckpt_job_abort(j->o.remote, j->job, id, why) == 0) {
            say(j, STASH_LOG_WARN, "job",
                "job checkpoint %" PRIu64 " was left undecided: aborted (%s)", id, why);
            notify(j, "verdict %" PRIu64, id);
        }
}

/* Gives the lead up (the lease, for another to take at once). */
static void step_down(svc_job *j)
{
    if (atomic_exchange(&j->leading, false)) ckpt_storage_unlock(j->o.remote, j->leader, j->cookie);
}

/* This service is fenced off the job: said once, and the engine woken to
 * tell the workers. */
static void fence(svc_job *j, const char *why)
{
    if (atomic_exchange(&j->fenced, true)) return;
    pthread_mutex_lock(&j->mu);
    snprintf(j->fenced_why, sizeof j->fenced_why, "%s", why);
    pthread_mutex_unlock(&j->mu);
    say(j, STASH_LOG_ERROR, "job", "%s: this service takes no part in the job any more (stop it)",
        why);
    wake(j);
}

/* Renews this host's lease and takes or renews the leader's, a third of
 * a lease after the last time. */
static void keep_leases(svc_job *j)
{
    uint64_t now = shm_clock_ns(), every = lease_ms(j) * 1000000ull / 3;
    if (j->leases_ns && now - j->leases_ns < every) return;
    j->leases_ns = now;
    if (atomic_load(&j->fenced)) {
        step_down(j);
        return;
    }
    int rc = ckpt_storage_lock(j->o.remote, j->member, j->cookie, lease_ms(j));
    uint64_t done = shm_clock_ns();
    /* Out of reach of the cluster ourselves, or reached late: the others
     * may have been out of reach too. */
    if (rc < 0 || done - now > every) j->clean_ns = done;
    if (rc < 0) {
        say(j, STASH_LOG_WARN, "job", "this host's lease: %s", stash_errmsg());
        /* Renewed again without the calls below, which would wait as long:
         * at once after a timeout, else a third of a lease later. */
        if (rc != -EBUSY) {
            if (done - now >= every) j->leases_ns = 0;
            return;
        }
    }
    ckpt_job_member m;
    rc = ckpt_job_member_read(j->o.remote, j->member, &m);
    if ((rc == 0 && ckpt_job_member_epoch(&m) != j->epoch) || rc == -ENOENT) {
        char why[256];
        snprintf(why, sizeof why,
                 "host %s's service of epoch %" PRIu64 " was fenced off: the member's epoch is %s",
                 j->host, j->epoch, rc == 0 ? m.epoch : "gone (its workers were taken over)");
        fence(j, why);
        step_down(j);
        return;
    }
    if (ckpt_storage_watch_check(j->watch) < 0)
        say(j, STASH_LOG_WARN, "job", "watching the job: %s", stash_errmsg());
    rc = ckpt_storage_lock(j->o.remote, j->leader, j->cookie, lease_ms(j));
    bool was = atomic_load(&j->leading);
    uint64_t epoch = atomic_load(&j->leader_epoch);
    if (rc == 0 && !was) {
        /* A new epoch first: a leader before this one commits nothing more. */
        rc = ckpt_job_lead(j->o.remote, j->job, &epoch);
        if (rc) ckpt_storage_unlock(j->o.remote, j->leader, j->cookie);
    }
    atomic_store(&j->leader_epoch, epoch);
    atomic_store(&j->leading, rc == 0);
    if (rc == 0 && !was) {
        say(j, STASH_LOG_INFO, "job", "host %s leads job %s (lease %u ms, epoch %" PRIu64 ")",
            j->host, j->job, lease_ms(j), epoch);
        settle(j, "left undecided by the last leader");
        atomic_store(&j->new_lead, true);
        pthread_mutex_lock(&j->mu);
        j->events++;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
    } else if (was && rc != 0) {
        say(j, STASH_LOG_WARN, "job", "host %s no longer leads: %s", j->host,
            rc == -EBUSY ? "another holds the lease" : stash_errmsg());
    }
}

/* ---- the leader's checkpoint ---------------------------------------------------- */

/* Runs job checkpoint ID, or with sp a savepoint of the job (2: after
 * which the job stops). */
static void run_job_checkpoint(svc_job *j, unsigned sp)
{
    const char *what = sp ? "savepoint" : "checkpoint";
    uint64_t id, t0 = shm_clock_ns(), epoch = 0, leader = j->leader_epoch;
    uint64_t timeout = (j->o.timeout_ms ? j->o.timeout_ms : 60000) * 1000000ull;
    /* A leader that was paused may hold a lease that lapsed meanwhile: it
     * asks the pool first (its commit would be refused anyway). */
    if (ckpt_job_leader(j->o.remote, j->job, &epoch) < 0 || epoch != leader) {
        say(j, STASH_LOG_WARN, "job", "host %s no longer leads: the leader's epoch is %" PRIu64,
            j->host, epoch);
        step_down(j);
        return;
    }
    if (ckpt_job_next_id(j->o.remote, j->job, &id) < 0) {
        say(j, STASH_LOG_ERROR, "job", "no checkpoint id: %s", stash_errmsg());
        return;
    }
    if (sp)
        notify(j, "savepoint %" PRIu64 "%s", id, sp > 1 ? " stop" : "");
    else
        notify(j, "checkpoint %" PRIu64, id);
    ckpt_job_record *rec = malloc(sizeof *rec);
    char why[512] = "out of memory";
    int rc = rec ? -EAGAIN : -ENOMEM;
    while (rec && rc == -EAGAIN && !quitting(j)) {
        uint32_t seen = events(j);
        rc = ckpt_job_notes(j->o.remote, j->job, id, rec);
        rec->savepoint = sp != 0;
        if (rc == 0) rc = ckpt_job_covered(rec);
        if (rc == 0) rc = ckpt_job_commit(j->o.remote, j->job, rec, leader);
        if (rc != -EAGAIN) {
            if (rc) snprintf(why, sizeof why, "%s", stash_errmsg());
            break;
        }
        snprintf(why, sizeof why, "%s", stash_errmsg());
        /* Any host may decide it meanwhile (one that joins aborts what is
         * in flight): the parts it waits for would never come. */
        if (ckpt_job_verdict(j->o.remote, j->job, id) == -ECANCELED) {
            snprintf(why, sizeof why, "%s", stash_errmsg());
            rc = -ECANCELED;
            break;
        }
        uint64_t now = shm_clock_ns();
        if (now - t0 >= timeout) {
            rc = -ETIMEDOUT;
            break;
        }
        if (!j->leading) {
            snprintf(why, sizeof why, "the leader lost its lease");
            rc = -ECANCELED;
            break;
        }
        if (now - j->hosts_ns >= HOSTS_EVERY_NS) {
            j->hosts_ns = now;
            /* A lost host's part never comes: the checkpoint ends now, and
             * the hosts can take its workers over. */
            if (check_hosts(j, why, sizeof why)) {
                rc = -ECANCELED;
                break;
            }
        }
        await_event(j, seen, POLL_NS);
    }
    if (rc == -EAGAIN) snprintf(why, sizeof why, "the service is stopping");
    int was = rc ? ckpt_job_abort(j->o.remote, j->job, id, why) : 1;
    if (was < 0) {
        /* Undecided: whoever next reaches the pool decides (a host that
         * waits for it, or the next leader). */
        say(j, STASH_LOG_ERROR, "job", "job %s %" PRIu64 " left undecided (%s): %s", what, id, why,
            stash_errmsg());
        free(rec);
        return;
    }
    if (was == 1) rc = 0; /* committed after all: the one decision says so */
    if (rc == 0 && sp > 1) atomic_store(&j->stopped, true);
    notify(j, "verdict %" PRIu64, id);
    double ms = (double)(shm_clock_ns() - t0) / 1e6;
    if (rc == 0) {
        /* Retention first: once the line says committed, older records are
         * gone as retention keeps them. */
        if (ckpt_job_retain(j->o.remote, j->job, j->o.retain ? j->o.retain : 3, leader) < 0)
            say(j, STASH_LOG_ERROR, "retention", "%s", stash_errmsg());
        say(j, STASH_LOG_INFO, "job", "job %s %" PRIu64 " committed: %zu parts in %.1f ms%s", what,
            id, rec->n, ms, sp > 1 ? "; the job stops" : "");
    } else {
        say(j, STASH_LOG_ERROR, "job", "job %s %" PRIu64 " aborted after %.1f ms: %s", what, id, ms,
            why);
    }
    free(rec);
}

/* Whether the job stops after a savepoint: once it is committed, nothing
 * more is started (no checkpoint, no takeover of the hosts that stop);
 * while it is undecided, nothing either. */
static bool job_stopping(svc_job *j)
{
    uint64_t id = atomic_load(&j->stop_id);
    if (!id || atomic_load(&j->stopped)) return id != 0;
    int rc = ckpt_job_verdict(j->o.remote, j->job, id);
    if (rc == 1) atomic_store(&j->stopped, true);
    if (rc == -ECANCELED || rc == -ESTALE) atomic_compare_exchange_strong(&j->stop_id, &id, 0);
    return atomic_load(&j->stop_id) != 0;
}

static void *job_main(void *arg)
{
    svc_job *j = arg;
    while (!quitting(j)) {
        uint32_t seen = events(j);
        uint64_t now = shm_clock_ns();
        if (atomic_exchange(&j->new_lead, false)) {
            j->next_due_ns = now + j->o.interval_ms * 1000000ull;
            j->hosts_ns = 0;
        }
        pthread_mutex_lock(&j->mu);
        /* Kept while another leads or none does: this host may lead next. */
        j->wanted = j->wanted || j->want || j->want_sp;
        j->wanted_sp = j->want_sp > j->wanted_sp ? j->want_sp : j->wanted_sp;
        j->want = false;
        j->want_sp = 0;
        pthread_mutex_unlock(&j->mu);
        if (job_stopping(j)) {
            await_event(j, seen, POLL_NS * 5);
            continue;
        }
        if (j->leading && (now - j->hosts_ns >= HOSTS_EVERY_NS)) {
            char why[256];
            j->hosts_ns = now;
            check_hosts(j, why, sizeof why);
        }
        bool due = j->o.interval_ms && now >= j->next_due_ns;
        if (j->leading && !atomic_load(&j->fenced) && (j->wanted || due)) {
            unsigned sp = j->wanted_sp;
            j->wanted = false;
            j->wanted_sp = 0;
            run_job_checkpoint(j, sp);
            j->next_due_ns = shm_clock_ns() + j->o.interval_ms * 1000000ull;
            continue;
        }
        uint64_t wait = lease_ms(j) * 1000000ull / 3;
        if (j->leading && j->o.interval_ms && j->next_due_ns > now && j->next_due_ns - now < wait)
            wait = j->next_due_ns - now;
        await_event(j, seen, wait < POLL_NS * 5 ? wait : POLL_NS * 5);
    }
    return NULL;
}

/* Keeps the leases, apart from the job's work: a call to the cluster that
 * waits there never holds a renewal up for longer than its own timeout. */
static void *leases_main(void *arg)
{
    svc_job *j = arg;
    uint64_t every = lease_ms(j) * 1000000ull / 3;
    while (!quitting(j)) {
        keep_leases(j);
        uint64_t next = j->leases_ns + every, now = shm_clock_ns();
        if (next > now) await_wake(j, 0, next - now, false);
    }
    return NULL;
}

/* ---- the host's side ------------------------------------------------------------ */

uint64_t job_requested(svc_job *j)
{
    return atomic_load(&j->requested);
}

void job_want(svc_job *j, unsigned savepoint)
{
    notify(j, "want%s", savepoint > 1 ? " stop" : savepoint ? " savepoint" : "");
}

unsigned job_savepoint(svc_job *j, uint64_t id)
{
    if (atomic_load(&j->requested_sp) != id) return 0;
    return atomic_load(&j->stop_id) == id ? 2 : 1;
}

void job_workers(svc_job *j, ckpt_job_workers *out)
{
    pthread_mutex_lock(&j->mu);
    *out = j->workers;
    pthread_mutex_unlock(&j->mu);
}

uint64_t job_epoch(const svc_job *j)
{
    return j->epoch;
}

bool job_fenced(svc_job *j, char *why, size_t cap)
{
    if (!atomic_load(&j->fenced)) return false;
    pthread_mutex_lock(&j->mu);
    snprintf(why, cap, "%s", j->fenced_why);
    pthread_mutex_unlock(&j->mu);
    return true;
}

/* Whether committed job checkpoint id holds this service's part: a service
 * fenced off after it noted its part finds another's in its place, and
 * its workers must not learn that their state was committed. */
static int part_committed(svc_job *j, uint64_t id)
{
    ckpt_job_record *rec = malloc(sizeof *rec);
    int rc = rec ? ckpt_job_record_read(j->o.remote, j->job, id, rec)
                 : shm_fail(-ENOMEM, "out of memory");
    bool mine = false;
    for (size_t i = 0; rc == 0 && i < rec->n; i++)
        mine =
            mine || (strcmp(rec->parts[i].host, j->host) == 0 && rec->parts[i].epoch == j->epoch);
    free(rec);
    if (rc || mine) return rc;
    char why[256];
    snprintf(why, sizeof why,
             "host %s's service of epoch %" PRIu64 " was fenced off: job checkpoint %" PRIu64
             " was committed without its part",
             j->host, j->epoch, id);
    fence(j, why);
    return shm_fail(STASH_EFENCED, "%s", why);
}

int job_part_done(svc_job *j, uint64_t id)
{
    char why[256];
    if (job_fenced(j, why, sizeof why)) return shm_fail(STASH_EFENCED, "%s", why);
    ckpt_job_workers w;
    job_workers(j, &w);
    ckpt_job_part part = self_part(j, &w);
    int rc = ckpt_job_note(j->o.remote, j->job, id, &part);
    if (rc == STASH_EFENCED) {
        snprintf(why, sizeof why, "%s", stash_errmsg());
        fence(j, why);
        return shm_fail(STASH_EFENCED, "%s", why);
    }
    if (rc) return rc;
    notify(j, "part %" PRIu64 " %s", id, j->host);
    uint64_t t0 = shm_clock_ns();
    uint64_t deadline = ((j->o.timeout_ms ? j->o.timeout_ms : 60000) + lease_ms(j)) * 1000000ull;
    /* The workers learn the pool's decision, never a guess: while the pool
     * does not answer, this waits (a host cut off for longer than its
     * lease is fenced, and its workers stop without an outcome). */
    for (;;) {
        uint32_t seen = events(j);
        rc = ckpt_job_verdict(j->o.remote, j->job, id);
        if (rc == 1 && ((rc = part_committed(j, id)) == 0 || rc == STASH_EFENCED)) return rc;
        if (rc == -ECANCELED || rc == -ESTALE) return rc;
        if (job_fenced(j, why, sizeof why)) return shm_fail(STASH_EFENCED, "%s", why);
        bool late = shm_clock_ns() - t0 >= deadline;
        /* A service that stops still learns the decision (its workers may
         * run on); it gives up only once the pool has not answered. */
        if (quitting(j) && late && rc < 0)
            return shm_fail(rc, "the service is stopping: %s", stash_errmsg());
        if (rc == 0 && late) {
            /* No leader decided in time: this host decides, the one way
             * that needs no lead, and reads what was decided. */
            snprintf(why, sizeof why, "no verdict from the leader within %llu ms (host %s)",
                     (unsigned long long)(deadline / 1000000ull), j->host);
            rc = ckpt_job_abort(j->o.remote, j->job, id, why);
            if (rc == 1 && ((rc = part_committed(j, id)) == 0 || rc == STASH_EFENCED)) return rc;
            if (rc == 0) {
                notify(j, "verdict %" PRIu64, id);
                return shm_fail(-ETIMEDOUT, "job checkpoint %" PRIu64 ": %s", id, why);
            }
        }
        if (!quitting(j)) {
            await_event(j, seen, POLL_NS);
            continue;
        }
        /* Stopping: the waits end at once, so a look every 50 ms. */
        struct timespec pause = {0, (long)(POLL_NS / 4)};
        nanosleep(&pause, NULL);
    }
}

bool job_takeover(svc_job *j, char *lost, size_t cap, ckpt_job_workers *workers)
{
    pthread_mutex_lock(&j->mu);
    bool pending = j->take_pending;
    char name[CKPT_JOB_HOST_MAX + 1];
    snprintf(name, sizeof name, "%s", j->take_lost);
    j->take_pending = false;
    pthread_mutex_unlock(&j->mu);
    if (!pending || atomic_load(&j->fenced)) return false;
    members ms;
    if (list_members(j, &ms) < 0) {
        say(j, STASH_LOG_WARN, "job", "taking over %s: %s", name, stash_errmsg());
        return false;
    }
    const member *m = NULL;
    for (size_t i = 0; i < ms.n; i++)
        if (strcmp(ms.v[i].m.m.host, name) == 0) m = &ms.v[i];
    bool take =
        m && !m->alive && !ckpt_job_member_taken(&m->m) && m->m.m.parallelism == j->o.parallelism;
    /* The claim replaces the lost host's epoch: its service, should it
     * wake, can note nothing more. */
    if (take) take = ckpt_job_claim(j->o.remote, j->job, name, m->m.epoch, j->host) == 0;
    if (take) {
        *workers = m->m.m.workers;
        snprintf(lost, cap, "%s", name);
        /* What the lost host's service may still have had in flight is decided now. */
        settle(j, "its host was lost");
    }
    free(ms.v);
    return take;
}

void job_takeover_failed(svc_job *j, const char *lost)
{
    if (ckpt_job_unclaim(j->o.remote, j->job, lost, j->host) < 0)
        say(j, STASH_LOG_ERROR, "job", "%s", stash_errmsg());
}

int job_takeover_done(svc_job *j, const char *lost, const ckpt_job_workers *workers)
{
    pthread_mutex_lock(&j->mu);
    ckpt_job_workers w = j->workers;
    int rc = ckpt_job_workers_add(&w, workers);
    pthread_mutex_unlock(&j->mu);
    if (rc == 0) {
        ckpt_job_part self = self_part(j, &w);
        rc = ckpt_job_member_set(j->o.remote, j->job, &self);
        if (rc == STASH_EFENCED) fence(j, stash_errmsg());
    }
    if (rc) return rc;
    pthread_mutex_lock(&j->mu);
    j->workers = w;
    pthread_mutex_unlock(&j->mu);
    char name[1100], taken[CKPT_JOB_HOST_MAX + 16];
    snprintf(name, sizeof name, "%s%s", j->hosts, lost);
    snprintf(taken, sizeof taken, "taken by %s", j->host);
    rc = ckpt_storage_remove_if(j->o.remote, name, &(ckpt_storage_attr){"stash.epoch", taken});
    return rc == -ECANCELED ? 0 : rc; /* gone already */
}

/* ---- join and leave -------------------------------------------------------------- */

/* Refuses a host whose workers a live host serves. */
static int check_join(svc_job *j)
{
    members ms;
    int rc = list_members(j, &ms);
    for (size_t i = 0; rc == 0 && i < ms.n; i++) {
        const member *m = &ms.v[i];
        const ckpt_job_part *mp = &m->m.m;
        if (!m->alive || strcmp(mp->host, j->host) == 0) continue;
        if (mp->parallelism != j->o.parallelism)
            rc = shm_fail(-EBUSY, "job %s: live host %s serves workers of %u, not %u", j->job,
                          mp->host, mp->parallelism, j->o.parallelism);
        for (uint32_t w = 0; rc == 0 && w < j->o.parallelism; w++)
            if (ckpt_job_workers_has(&j->workers, w) && ckpt_job_workers_has(&mp->workers, w))
                rc = shm_fail(-EBUSY, "job %s: worker %u is served by live host %s", j->job, w,
                              mp->host);
    }
    free(ms.v);
    return rc;
}

int job_open(const svc_job_opts *o, svc_job **out)
{
    if (!ckpt_job_host_ok(o->host))
        return shm_fail(-EINVAL, "host '%s': 1 to %u letters, digits, '.', '_' or '-'",
                        o->host ? o->host : "(null)", CKPT_JOB_HOST_MAX);
    if (!o->parallelism || o->parallelism > o->max_parallelism)
        return shm_fail(-EINVAL, "a job of %u workers over %u key groups", o->parallelism,
                        o->max_parallelism);
    for (uint32_t i = 0; i < o->workers.n; i++)
        if (o->workers.r[i].last >= o->parallelism)
            return shm_fail(-EINVAL, "worker %u of a job of %u workers", o->workers.r[i].last,
                            o->parallelism);
    svc_job *j = calloc(1, sizeof *j);
    if (!j) return shm_fail(-ENOMEM, "out of memory");
    j->o = *o;
    j->workers = o->workers;
    snprintf(j->job, sizeof j->job, "%s", o->job);
    snprintf(j->host, sizeof j->host, "%s", o->host);
    snprintf(j->cookie, sizeof j->cookie, "%s.%d", j->host, (int)getpid());
    j->o.job = j->job;
    j->o.host = j->host;
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    char what[1100];
    snprintf(what, sizeof what, "hosts/%s", j->host);
    int rc = ckpt_job_object(j->member, sizeof j->member, j->job, what);
    if (rc == 0) rc = ckpt_job_object(j->leader, sizeof j->leader, j->job, "leader");
    if (rc == 0) rc = ckpt_job_object(j->ctl, sizeof j->ctl, j->job, "ctl");
    if (rc == 0) rc = ckpt_job_object(j->hosts, sizeof j->hosts, j->job, "hosts/");
    /* Watched before it joins: settle() below aborts every id asked for
     * before, and whatever the leader asks for after reaches this host,
     * whose engine answers it once started. */
    if (rc == 0) rc = ckpt_storage_watch_start(j->o.remote, j->ctl, on_notify, j, &j->watch);
    if (rc == 0) rc = check_join(j);
    ckpt_job_part self = self_part(j, &j->workers);
    if (rc == 0) rc = ckpt_job_join(j->o.remote, j->job, &self, j->cookie, lease_ms(j));
    if (rc == 0) {
        j->joined = true;
        j->epoch = self.epoch;
        /* What a service of this host before this one left in flight is
         * decided before this one restores anything. */
        settle(j, "its host's service changed");
    }
    if (rc) {
        job_close(j);
        return rc;
    }
    *out = j;
    return 0;
}

int job_start(svc_job *j, uint32_t max_parallelism, _Atomic uint32_t *wake)
{
    j->o.max_parallelism = max_parallelism;
    atomic_store(&j->wake, wake);
    j->clean_ns = shm_clock_ns();
    ckpt_job_part self = self_part(j, &j->workers);
    int rc = ckpt_job_member_set(j->o.remote, j->job, &self);
    if (rc == 0 && (rc = -pthread_create(&j->leases, NULL, leases_main, j)) != 0)
        return shm_fail(rc, "cannot start the job's threads");
    if (rc == 0 && (rc = -pthread_create(&j->thread, NULL, job_main, j)) != 0) {
        job_quit(j);
        pthread_join(j->leases, NULL);
        return shm_fail(rc, "cannot start the job's threads");
    }
    j->started = rc == 0;
    return rc;
}

void job_quit(svc_job *j)
{
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    j->quit = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void job_close(svc_job *j)
{
    if (!j) return;
    job_quit(j);
    if (j->started) {
        pthread_join(j->thread, NULL);
        pthread_join(j->leases, NULL);
    }
    ckpt_storage_watch_stop(j->watch);
    step_down(j);
    /* A host that leaves on purpose is no lost host: nobody takes its
     * workers over, and the job's checkpoints wait for it to come back.
     * A fenced one leaves the member to the service that serves it now. */
    if (j->joined && !atomic_load(&j->fenced)) {
        char epoch[32];
        snprintf(epoch, sizeof epoch, "%" PRIu64, j->epoch);
        ckpt_storage_remove_if(j->o.remote, j->member, &(ckpt_storage_attr){"stash.epoch", epoch});
        ckpt_storage_unlock(j->o.remote, j->member, j->cookie);
    }
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}
