/* SPDX-License-Identifier: MIT */
/*
 * job.c: a service as one host of a job that spans hosts (job.h). The
 * job's objects: JOB/hosts/HOST (a member: the workers it serves, under
 * its lease), JOB/taken/HOST (a lost host's workers claimed by the host
 * taking them over), JOB/leader (the leader's lease), JOB/ctl (watched by
 * every host). Notifications on JOB/ctl, each a line:
 *   checkpoint ID        the leader asks every host for its part of ID
 *   part ID HOST         HOST's part of ID is in (wakes the leader)
 *   verdict ID           ID is committed or aborted (read it from the pool)
 *   want                 a host asks the leader for a checkpoint now
 *   takeover LOST HOST   HOST is to take the lost host's workers over
 * Every receiver also polls what it waits for: a notification lost with
 * a watch only delays it.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/service/job.h"

#define POLL_NS 200000000ull         /* the longest wait between two looks at the pool */
#define HOSTS_EVERY_NS 1000000000ull /* looks for lost hosts while a checkpoint waits */
#define NOTIFY_MS 5000u /* acknowledgements of a notification awaited in the background */
#define PROBE "probe"   /* the cookie a lease is tested with */
#define SETTLE_MAX 64u  /* undecided ids a new leader aborts, at most */

struct svc_job {
    svc_job_opts o;
    char job[256];
    char host[CKPT_JOB_HOST_MAX + 1];
    char member[1024], leader[1024], ctl[1024], hosts[1024], taken[1024];
    bool joined;         /* the member object written */
    _Atomic bool fenced; /* taken for lost, its workers served elsewhere */
    ckpt_rados_watch *watch;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    ckpt_job_workers workers;
    uint32_t events; /* bumped by each notification */
    bool want;
    bool take_pending;
    char take_lost[CKPT_JOB_HOST_MAX + 1];
    bool quit;
    _Atomic uint64_t requested;
    /* the thread's own */
    bool leading;
    uint64_t next_due_ns;
    uint64_t leases_ns;
    uint64_t hosts_ns;
    char announced[CKPT_JOB_HOST_MAX + 1]; /* the lost host last said to be lost */
    /* members seen with their lease lapsed, and since when (the leader's) */
    struct {
        char host[CKPT_JOB_HOST_MAX + 1];
        uint64_t since_ns;
    } lapsed[CKPT_JOB_HOSTS];
    size_t nlapsed;
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
    ckpt_job_part part = {
        .parallelism = j->o.parallelism, .max_parallelism = j->o.max_parallelism, .workers = *w};
    memcpy(part.host, j->host, sizeof part.host);
    return part;
}

static uint32_t lease_ms(const svc_job *j)
{
    return j->o.lease_ms ? j->o.lease_ms : JOB_DEFAULT_LEASE_MS;
}

/* ---- notifications ------------------------------------------------------------ */

static void on_notify(void *ctx, const char *msg)
{
    svc_job *j = ctx;
    uint64_t id = 0;
    char a[CKPT_JOB_HOST_MAX + 2] = "", b[CKPT_JOB_HOST_MAX + 2] = "";
    bool wake_engine = false;
    pthread_mutex_lock(&j->mu);
    j->events++;
    if (sscanf(msg, "checkpoint %" SCNu64, &id) == 1) {
        uint64_t was = atomic_load(&j->requested);
        while (id > was && !atomic_compare_exchange_weak(&j->requested, &was, id)) {
        }
        wake_engine = true;
    } else if (strcmp(msg, "want") == 0) {
        j->want = true;
    } else if (sscanf(msg, "takeover %64s %64s", a, b) == 2 && strcmp(b, j->host) == 0 &&
               ckpt_job_host_ok(a) && !j->take_pending) {
        memcpy(j->take_lost, a, strlen(a) + 1); /* checked: at most CKPT_JOB_HOST_MAX */
        j->take_pending = true;
        wake_engine = true;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (wake_engine) shm_futex_wake(j->o.wake);
}

static void notify(svc_job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void notify(svc_job *j, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (ckpt_rados_notify(j->o.rados, j->ctl, msg, NOTIFY_MS) < 0)
        say(j, STASH_LOG_WARN, "job", "%s", stash_errmsg());
}

/* Waits until a notification arrives, quit, or ns pass. */
static void await_event(svc_job *j, uint32_t seen, uint64_t ns)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    uint64_t at = (uint64_t)until.tv_nsec + ns;
    until.tv_sec += (time_t)(at / 1000000000ull);
    until.tv_nsec = (long)(at % 1000000000ull);
    pthread_mutex_lock(&j->mu);
    while (j->events == seen && !j->quit && !j->want)
        if (pthread_cond_timedwait(&j->cv, &j->mu, &until) == ETIMEDOUT) break;
    pthread_mutex_unlock(&j->mu);
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
    ckpt_job_part m;
    bool alive;
} member;

typedef struct members {
    svc_job *j;
    member *v;
    size_t n, cap;
} members;

/* Whether the lease on member object name is held: taken under PROBE and
 * given back at once if it lapsed. */
static int lease_held(svc_job *j, const char *name)
{
    int rc = ckpt_rados_lock(j->o.rados, name, PROBE, 1000);
    if (rc == -EBUSY) return 1;
    if (rc < 0) return rc;
    ckpt_rados_unlock(j->o.rados, name, PROBE);
    return 0;
}

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
    int rc = ckpt_job_part_read(ms->j->o.rados, name, &m->m);
    if (rc == -ENOENT) return 0; /* removed meanwhile, or only its lease is left */
    if (rc == STASH_ECORRUPT) {
        say(ms->j, STASH_LOG_WARN, "job", "%s", stash_errmsg());
        return 0;
    }
    if (rc < 0) return rc;
    if (strcmp(m->m.host, ms->j->host) == 0)
        m->alive = true;
    else if ((rc = lease_held(ms->j, name)) < 0)
        return rc;
    else
        m->alive = rc == 1;
    ms->n++;
    return 0;
}

static int list_members(svc_job *j, members *ms)
{
    *ms = (members){j, NULL, 0, 0};
    int rc = ckpt_rados_list(j->o.rados, j->hosts, take_member, ms);
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
        if (m->alive && m->m.parallelism == p && strcmp(m->m.host, skip) != 0 &&
            ckpt_job_workers_has(&m->m.workers, w))
            return m;
    }
    return NULL;
}

/* Whether host's lease has been seen lapsed for a whole lease: a host that
 * could not renew while the cluster was out of reach renews within a
 * third of a lease once it is back, and is no lost host. */
static bool lapsed_long(svc_job *j, const char *host, uint64_t now, uint64_t lease_ns)
{
    for (size_t i = 0; i < j->nlapsed; i++)
        if (strcmp(j->lapsed[i].host, host) == 0) return now - j->lapsed[i].since_ns >= lease_ns;
    if (j->nlapsed < CKPT_JOB_HOSTS) {
        snprintf(j->lapsed[j->nlapsed].host, sizeof j->lapsed[0].host, "%s", host);
        j->lapsed[j->nlapsed++].since_ns = now;
    }
    return false;
}

/* Forgets the lapsed members that are alive again or gone. */
static void forget_lapsed(svc_job *j, const member *v, size_t n)
{
    size_t kept = 0;
    for (size_t i = 0; i < j->nlapsed; i++) {
        bool still = false;
        for (size_t k = 0; k < n; k++)
            if (!v[k].alive && strcmp(v[k].m.host, j->lapsed[i].host) == 0) still = true;
        if (still) j->lapsed[kept++] = j->lapsed[i];
    }
    j->nlapsed = kept;
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
 * workers is asked to take its workers over. Returns the number of lost
 * hosts (the first one named in why, cap bytes). */
static unsigned check_hosts(svc_job *j, char *why, size_t cap)
{
    members ms;
    unsigned lost = 0;
    if (list_members(j, &ms) < 0) {
        say(j, STASH_LOG_WARN, "job", "looking at the hosts: %s", stash_errmsg());
        return 0;
    }
    uint64_t now = shm_now_ns(), lease_ns = lease_ms(j) * 1000000ull;
    forget_lapsed(j, ms.v, ms.n);
    for (size_t i = 0; i < ms.n; i++) {
        const member *m = &ms.v[i];
        if (m->alive || !lapsed_long(j, m->m.host, now, lease_ns)) continue;
        bool covered = true;
        for (uint32_t k = 0; k < m->m.workers.n && covered; k++)
            for (uint32_t w = m->m.workers.r[k].first; w <= m->m.workers.r[k].last; w++)
                if (!served_by(&ms, m->m.parallelism, w, m->m.host)) {
                    covered = false;
                    break;
                }
        if (covered || m->m.parallelism != j->o.parallelism) {
            say(j, STASH_LOG_INFO, "job", "host %s is gone and its workers are served: forgotten",
                m->m.host);
            ckpt_rados_remove(j->o.rados, m->name);
            continue;
        }
        char ws[512];
        ckpt_job_workers_format(&m->m.workers, ws, sizeof ws);
        if (lost++ == 0)
            snprintf(why, cap, "host %s is lost: workers %.200s wait for a takeover", m->m.host,
                     ws);
        char claim[1100], buf[80];
        snprintf(claim, sizeof claim, "%s%s", j->taken, m->m.host);
        if (ckpt_rados_pointer(j->o.rados, claim, buf, sizeof buf) == 0) continue; /* under way */
        const member *to = NULL;
        for (size_t k = 0; k < ms.n; k++) {
            const member *c = &ms.v[k];
            if (!c->alive || c->m.parallelism != j->o.parallelism) continue;
            if (!to || count_workers(&c->m.workers) < count_workers(&to->m.workers) ||
                (count_workers(&c->m.workers) == count_workers(&to->m.workers) &&
                 strcmp(c->m.host, to->m.host) < 0))
                to = c;
        }
        if (!to) continue;
        /* Said once; asked again at each look, in case the notification was lost. */
        if (strcmp(j->announced, m->m.host) != 0)
            say(j, STASH_LOG_WARN, "job",
                "host %s is lost (its lease lapsed): host %s takes workers %s", m->m.host,
                to->m.host, ws);
        snprintf(j->announced, sizeof j->announced, "%s", m->m.host);
        notify(j, "takeover %s %s", m->m.host, to->m.host);
    }
    free(ms.v);
    return lost;
}

/* ---- leases -------------------------------------------------------------------- */

/* Ids a leader before this one asked for and left undecided: aborted, so
 * that the hosts waiting on them stop waiting. */
static void settle(svc_job *j)
{
    char name[1024], buf[32];
    uint64_t latest = 0;
    int rc = ckpt_rados_latest(j->o.rados, j->job, &latest);
    if (rc && rc != -ENOENT) return;
    if (ckpt_job_object(name, sizeof name, j->job, "ids") < 0 ||
        ckpt_rados_pointer(j->o.rados, name, buf, sizeof buf) < 0)
        return;
    uint64_t top = strtoull(buf, NULL, 10);
    for (uint64_t id = top; id > latest && top - id < SETTLE_MAX; id--)
        if (ckpt_job_verdict(j->o.rados, j->job, id) == 0 &&
            ckpt_job_abort(j->o.rados, j->job, id) == 0) {
            say(j, STASH_LOG_WARN, "job",
                "job checkpoint %" PRIu64 " was left undecided by the last leader: aborted", id);
            notify(j, "verdict %" PRIu64, id);
        }
}

/* Renews this host's lease and takes or renews the leader's, a third of
 * a lease after the last time. */
static void keep_leases(svc_job *j)
{
    uint64_t now = shm_now_ns(), every = lease_ms(j) * 1000000ull / 3;
    if (j->leases_ns && now - j->leases_ns < every) return;
    j->leases_ns = now;
    char value[700];
    if (ckpt_rados_lock(j->o.rados, j->member, j->host, lease_ms(j)) < 0) {
        say(j, STASH_LOG_WARN, "job", "this host's lease: %s", stash_errmsg());
        /* Out of reach of the cluster ourselves: what was seen lapsed may
         * have been out of reach too. */
        j->nlapsed = 0;
    } else if (!atomic_load(&j->fenced) &&
               ckpt_rados_pointer(j->o.rados, j->member, value, sizeof value) == -ENOENT) {
        /* The lease lapsed for long enough that another host took this
         * one's workers over: they are served there now, not here. */
        atomic_store(&j->fenced, true);
        say(j, STASH_LOG_ERROR, "job",
            "host %s was taken for lost and its workers were taken over: it takes no part in "
            "the job's checkpoints any more (stop it)",
            j->host);
    }
    if (ckpt_rados_watch_check(j->watch) < 0)
        say(j, STASH_LOG_WARN, "job", "watching the job: %s", stash_errmsg());
    int rc = ckpt_rados_lock(j->o.rados, j->leader, j->host, lease_ms(j));
    bool was = j->leading;
    j->leading = rc == 0;
    if (j->leading && !was) {
        say(j, STASH_LOG_INFO, "job", "host %s leads job %s (lease %u ms)", j->host, j->job,
            lease_ms(j));
        settle(j);
        j->nlapsed = 0;
        j->next_due_ns = now + j->o.interval_ms * 1000000ull;
        j->hosts_ns = 0;
    } else if (was && !j->leading) {
        say(j, STASH_LOG_WARN, "job", "host %s no longer leads: %s", j->host,
            rc == -EBUSY ? "another holds the lease" : stash_errmsg());
    }
}

/* ---- the leader's checkpoint ---------------------------------------------------- */

static void run_job_checkpoint(svc_job *j)
{
    uint64_t id, t0 = shm_now_ns();
    uint64_t timeout = (j->o.timeout_ms ? j->o.timeout_ms : 60000) * 1000000ull;
    if (ckpt_job_next_id(j->o.rados, j->job, &id) < 0) {
        say(j, STASH_LOG_ERROR, "job", "no checkpoint id: %s", stash_errmsg());
        return;
    }
    notify(j, "checkpoint %" PRIu64, id);
    ckpt_job_record *rec = malloc(sizeof *rec);
    char why[512] = "out of memory";
    int rc = rec ? -EAGAIN : -ENOMEM;
    while (rec && rc == -EAGAIN && !quitting(j)) {
        uint32_t seen = events(j);
        rc = ckpt_job_notes(j->o.rados, j->job, id, rec);
        if (rc == 0) rc = ckpt_job_covered(rec);
        if (rc == 0) {
            uint64_t latest = 0;
            rc = ckpt_rados_latest(j->o.rados, j->job, &latest);
            if (rc == -ENOENT) rc = 0;
            if (rc == 0) rc = ckpt_job_commit(j->o.rados, j->job, rec, latest);
        }
        if (rc != -EAGAIN) {
            if (rc) snprintf(why, sizeof why, "%s", stash_errmsg());
            break;
        }
        snprintf(why, sizeof why, "%s", stash_errmsg());
        uint64_t now = shm_now_ns();
        if (now - t0 >= timeout) {
            rc = -ETIMEDOUT;
            break;
        }
        keep_leases(j);
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
    if (rc && ckpt_job_abort(j->o.rados, j->job, id) < 0)
        say(j, STASH_LOG_ERROR, "job", "%s", stash_errmsg());
    notify(j, "verdict %" PRIu64, id);
    double ms = (double)(shm_now_ns() - t0) / 1e6;
    if (rc == 0) {
        /* Retention first: once the line says committed, older records are
         * gone as retention keeps them. */
        if (ckpt_job_retain(j->o.rados, j->job, j->o.retain ? j->o.retain : 3) < 0)
            say(j, STASH_LOG_ERROR, "retention", "%s", stash_errmsg());
        say(j, STASH_LOG_INFO, "job", "job checkpoint %" PRIu64 " committed: %zu parts in %.1f ms",
            id, rec->n, ms);
    } else {
        say(j, STASH_LOG_ERROR, "job", "job checkpoint %" PRIu64 " aborted after %.1f ms: %s", id,
            ms, why);
    }
    free(rec);
}

static void *job_main(void *arg)
{
    svc_job *j = arg;
    while (!quitting(j)) {
        uint32_t seen = events(j);
        keep_leases(j);
        uint64_t now = shm_now_ns();
        pthread_mutex_lock(&j->mu);
        bool want = j->want;
        j->want = false;
        pthread_mutex_unlock(&j->mu);
        if (j->leading && (now - j->hosts_ns >= HOSTS_EVERY_NS)) {
            char why[256];
            j->hosts_ns = now;
            check_hosts(j, why, sizeof why);
        }
        bool due = j->o.interval_ms && now >= j->next_due_ns;
        if (j->leading && (want || due)) {
            run_job_checkpoint(j);
            j->next_due_ns = shm_now_ns() + j->o.interval_ms * 1000000ull;
            continue;
        }
        uint64_t wait = lease_ms(j) * 1000000ull / 3;
        if (j->leading && j->o.interval_ms && j->next_due_ns > now && j->next_due_ns - now < wait)
            wait = j->next_due_ns - now;
        await_event(j, seen, wait < POLL_NS * 5 ? wait : POLL_NS * 5);
    }
    return NULL;
}

/* ---- the host's side ------------------------------------------------------------ */

uint64_t job_requested(svc_job *j)
{
    return atomic_load(&j->requested);
}

void job_want(svc_job *j)
{
    notify(j, "want");
}

void job_workers(svc_job *j, ckpt_job_workers *out)
{
    pthread_mutex_lock(&j->mu);
    *out = j->workers;
    pthread_mutex_unlock(&j->mu);
}

int job_part_done(svc_job *j, uint64_t id)
{
    if (atomic_load(&j->fenced))
        return shm_fail(-ECANCELED, "host %s was taken for lost: its workers are served elsewhere",
                        j->host);
    ckpt_job_workers w;
    job_workers(j, &w);
    ckpt_job_part part = self_part(j, &w);
    int rc = ckpt_job_note(j->o.rados, j->job, id, &part);
    if (rc) return rc;
    notify(j, "part %" PRIu64 " %s", id, j->host);
    uint64_t t0 = shm_now_ns();
    uint64_t deadline = ((j->o.timeout_ms ? j->o.timeout_ms : 60000) + lease_ms(j)) * 1000000ull;
    for (;;) {
        uint32_t seen = events(j);
        rc = ckpt_job_verdict(j->o.rados, j->job, id);
        if (rc == 1) return 0;
        if (rc == -ECANCELED) return rc;
        if (quitting(j)) return shm_fail(-ECANCELED, "the service is stopping");
        if (shm_now_ns() - t0 >= deadline)
            return shm_fail(-ETIMEDOUT,
                            "no verdict on job checkpoint %" PRIu64
                            " from the leader within %llu ms",
                            id, (unsigned long long)(deadline / 1000000ull));
        await_event(j, seen, POLL_NS);
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
    if (!pending) return false;
    members ms;
    if (list_members(j, &ms) < 0) {
        say(j, STASH_LOG_WARN, "job", "taking over %s: %s", name, stash_errmsg());
        return false;
    }
    const member *m = NULL;
    for (size_t i = 0; i < ms.n; i++)
        if (strcmp(ms.v[i].m.host, name) == 0) m = &ms.v[i];
    bool take = m && !m->alive && m->m.parallelism == j->o.parallelism;
    if (take) {
        char claim[1100];
        snprintf(claim, sizeof claim, "%s%s", j->taken, m->m.host);
        take = ckpt_rados_swap(j->o.rados, claim, NULL, j->host) == 0;
        *workers = m->m.workers;
        snprintf(lost, cap, "%s", name);
    }
    free(ms.v);
    return take;
}

void job_takeover_failed(svc_job *j, const char *lost)
{
    char name[1100];
    snprintf(name, sizeof name, "%s%s", j->taken, lost);
    if (ckpt_rados_remove(j->o.rados, name) < 0)
        say(j, STASH_LOG_ERROR, "job", "%s", stash_errmsg());
}

int job_takeover_done(svc_job *j, const char *lost, const ckpt_job_workers *workers)
{
    pthread_mutex_lock(&j->mu);
    ckpt_job_workers w = j->workers;
    int rc = ckpt_job_workers_add(&w, workers);
    pthread_mutex_unlock(&j->mu);
    char value[700], name[1100];
    if (rc == 0) {
        ckpt_job_part self = self_part(j, &w);
        ckpt_job_part_format(&self, value, sizeof value);
        rc = ckpt_rados_set(j->o.rados, j->member, value);
    }
    if (rc) return rc;
    pthread_mutex_lock(&j->mu);
    j->workers = w;
    pthread_mutex_unlock(&j->mu);
    snprintf(name, sizeof name, "%s%s", j->hosts, lost);
    rc = ckpt_rados_remove(j->o.rados, name);
    snprintf(name, sizeof name, "%s%s", j->taken, lost);
    if (rc == 0) rc = ckpt_rados_remove(j->o.rados, name);
    return rc;
}

/* ---- join and leave -------------------------------------------------------------- */

/* Refuses a host whose workers a live host serves, or whose name a live
 * service holds. */
static int check_join(svc_job *j)
{
    members ms;
    int rc = list_members(j, &ms);
    for (size_t i = 0; rc == 0 && i < ms.n; i++) {
        const member *m = &ms.v[i];
        if (!m->alive || strcmp(m->m.host, j->host) == 0) continue;
        if (m->m.parallelism != j->o.parallelism)
            rc = shm_fail(-EBUSY, "job %s: live host %s serves workers of %u, not %u", j->job,
                          m->m.host, m->m.parallelism, j->o.parallelism);
        for (uint32_t w = 0; rc == 0 && w < j->o.parallelism; w++)
            if (ckpt_job_workers_has(&j->workers, w) && ckpt_job_workers_has(&m->m.workers, w))
                rc = shm_fail(-EBUSY, "job %s: worker %u is served by live host %s", j->job, w,
                              m->m.host);
    }
    free(ms.v);
    return rc;
}

/* Writes this host's member object and takes its lease. */
static int join(svc_job *j)
{
    char value[700];
    ckpt_job_part self = self_part(j, &j->workers);
    ckpt_job_part_format(&self, value, sizeof value);
    int rc = ckpt_rados_lock(j->o.rados, j->member, j->host, lease_ms(j));
    if (rc == -EBUSY)
        return shm_fail(-EBUSY,
                        "job %s: host %s is served by another service (its lease lasts "
                        "up to %u ms)",
                        j->job, j->host, lease_ms(j));
    if (rc) return rc;
    rc = ckpt_rados_set(j->o.rados, j->member, value);
    j->joined = rc == 0;
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
    j->o.job = j->job;
    j->o.host = j->host;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    char what[1100];
    snprintf(what, sizeof what, "hosts/%s", j->host);
    int rc = ckpt_job_object(j->member, sizeof j->member, j->job, what);
    if (rc == 0) rc = ckpt_job_object(j->leader, sizeof j->leader, j->job, "leader");
    if (rc == 0) rc = ckpt_job_object(j->ctl, sizeof j->ctl, j->job, "ctl");
    if (rc == 0) rc = ckpt_job_object(j->hosts, sizeof j->hosts, j->job, "hosts/");
    if (rc == 0) rc = ckpt_job_object(j->taken, sizeof j->taken, j->job, "taken/");
    if (rc == 0) rc = check_join(j);
    if (rc == 0) rc = join(j);
    if (rc == 0) rc = ckpt_rados_watch_start(j->o.rados, j->ctl, on_notify, j, &j->watch);
    if (rc == 0) {
        rc = -pthread_create(&j->thread, NULL, job_main, j);
        if (rc) shm_fail(rc, "cannot start the job's thread");
        j->started = rc == 0;
    }
    if (rc) {
        job_close(j);
        return rc;
    }
    *out = j;
    return 0;
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
    if (j->started) pthread_join(j->thread, NULL);
    ckpt_rados_watch_stop(j->watch);
    if (j->leading) ckpt_rados_unlock(j->o.rados, j->leader, j->host);
    /* A host that leaves on purpose is no lost host: nobody takes its
     * workers over, and the job's checkpoints wait for it to come back. */
    if (j->joined) {
        ckpt_rados_remove(j->o.rados, j->member);
        ckpt_rados_unlock(j->o.rados, j->member, j->host);
    }
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}
