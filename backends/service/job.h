/* SPDX-License-Identifier: MIT */
/*
 * job.h: one service's side of a job that spans hosts (job.c). Each
 * service is a host of the job: it joins under a lease on its member
 * object and an epoch of its own (a service of that host before it is
 * fenced off from then on), watches the job's control object, and
 * competes for the leader's lease. The leader, under an epoch of its own,
 * asks every host for checkpoint ID (a notification), waits until the
 * notes of the services serving the members cover every worker of the
 * job, commits the job's checkpoint (rados_job.h) or aborts it, and tells
 * every host. A host whose lease lapsed and whose workers nobody else
 * serves is lost: the leader asks the live host serving the fewest
 * workers to take them over, which fences the lost host's service off.
 */
#ifndef STASH_SERVICE_JOB_H
#define STASH_SERVICE_JOB_H

#include "backends/service/service.h"

#define JOB_DEFAULT_LEASE_MS 10000u

typedef struct svc_job svc_job;

typedef void svc_job_log_fn(void *ctx, stash_log_level level, const char *subject,
                            const char *message);

typedef struct svc_job_opts {
    ckpt_storage *remote;     /* the connection, shared with the caller (CKPT_CAN_JOB) */
    const char *job;          /* the job's objects' prefix */
    const char *host;         /* this host's name (ckpt_job_host_ok) */
    uint32_t parallelism;     /* the job's workers */
    uint32_t max_parallelism; /* the job's key groups */
    ckpt_job_workers workers; /* those this host serves */
    uint32_t lease_ms;        /* of the leader and of each host (0: JOB_DEFAULT_LEASE_MS) */
    uint32_t call_ms;         /* the longest a call to the cluster waits (0: 10 s) */
    uint64_t interval_ms;     /* the leader's checkpoint interval (0: only when asked) */
    uint64_t timeout_ms;      /* a job checkpoint not in from every host by then aborts */
    unsigned retain;          /* committed job checkpoints kept */
    svc_job_log_fn *log;
    void *log_ctx;
} svc_job_opts;

/* Joins the job as host o->host: refused (-EBUSY) while a live host
 * serves one of its workers or the host's lease is held; then the
 * member's lease and a new epoch, and what a service of the host before
 * this one left undecided aborted. The job is watched from before the
 * join: what the leader asks for after it is kept for the engine
 * (job_requested). Nothing else runs yet: job_start(). */
int job_open(const svc_job_opts *o, svc_job **out);
/* The member's line set with the arena's key groups, and the thread
 * that keeps the leases and, while it leads, runs the job's
 * checkpoints; wake is the engine's futex, woken for a request, a
 * takeover or a fence. */
int job_start(svc_job *j, uint32_t max_parallelism, _Atomic uint32_t *wake);
/* This service's member epoch. */
uint64_t job_epoch(const svc_job *j);
/* Whether this service is fenced off the job (why: cap bytes): another
 * service of its host joined, or its workers were taken over. */
bool job_fenced(svc_job *j, char *why, size_t cap);
/* Tells a job's waits to end (the service stops). Accepts NULL. */
void job_quit(svc_job *j);
/* Leaves the job: the thread stopped, the leases given up. Accepts NULL. */
void job_close(svc_job *j);

/* The newest checkpoint id the leader asked for (0: none yet). */
uint64_t job_requested(svc_job *j);
/* Whether the leader asked for id as a savepoint of the job: 0 no, 1 yes,
 * 2 one after which every host stops. */
unsigned job_savepoint(svc_job *j, uint64_t id);
/* Asks the leader for a checkpoint now (a control command's request); with
 * savepoint 1 for a savepoint of the job, 2 for one after which the job
 * stops. */
void job_want(svc_job *j, unsigned savepoint);
/* This host's part of checkpoint id is in the pool: notes it, then waits
 * for the decision. Returns 0 (committed), -ECANCELED (aborted),
 * STASH_EFENCED (this service is fenced off the job), or -ETIMEDOUT (no
 * decision in time: this host aborted it), the reason in stash_errmsg(). */
int job_part_done(svc_job *j, uint64_t id);
/* The workers this host serves now. */
void job_workers(svc_job *j, ckpt_job_workers *out);

/* A takeover the leader asked of this host: the lost host's name and
 * workers. Returns true once for each (claimed in the pool first, which
 * fences the lost host's service off). */
bool job_takeover(svc_job *j, char *lost, size_t cap, ckpt_job_workers *workers);
/* The takeover of lost's workers failed: the claim goes, so that the
 * leader asks again. */
void job_takeover_failed(svc_job *j, const char *lost);
/* The takeover of lost's workers is done (their key groups restored):
 * this host serves them from now on, and lost is no member any more. */
int job_takeover_done(svc_job *j, const char *lost, const ckpt_job_workers *workers);

#endif /* STASH_SERVICE_JOB_H */
