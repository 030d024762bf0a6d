/* SPDX-License-Identifier: MIT */
/*
 * engine.h: what the engine's thread (service.c) and its start and stop
 * (start.c) share: the service's state and the engine's entry points.
 */
#ifndef STASH_SERVICE_ENGINE_H
#define STASH_SERVICE_ENGINE_H

#include "backends/service/job.h"

struct stash_service {
    stash_service_opts o;        /* o.arena points at arena_opts */
    stash_arena_opts arena_opts; /* the caller's, as this library's struct */
    stash_arena *a;
    ioe_engine *e;
    char dir[SHM_CTL_DETAIL];
    shm_dir ckpts;    /* dir, opened once and checked: every checkpoint goes through it */
    uint32_t reader;  /* its reader slot (for shm_ebr_enter) */
    uint32_t reader2; /* a second one for a second serializing thread, 0 if none was free */
    uint32_t holder;  /* 1 + the reader slot's index: the holder of its pins */
    pthread_t thread;
    _Atomic int quit;
    _Atomic int stopped;
    uint64_t next_id;
    uint64_t served;         /* requests answered by checkpoints started so far */
    uint64_t savepoint_done; /* the savepoint ticket the last savepoint answered */
    uint64_t last_end_ns;    /* when the last checkpoint ended (shm_clock_ns) */
    uint32_t *cut;           /* per key group: the version the checkpoint in flight reads */
    uint32_t *base;          /* incremental: the versions of base_id, still pinned */
    uint64_t base_id;
    uint32_t since_full;     /* incremental checkpoints since the last full one */
    uint32_t untracked_seen; /* the change log's misses the chain's base saw */
    uint32_t failing;        /* checkpoints failed in a row */
    bool group;              /* checkpoints readable by the arena's group */
    stash_worker_info *seen; /* per worker index, as the last look found it */
    store *store;            /* the engine's handle on the arena's store, for its cuts */
    ioe_info io_seen;        /* the I/O engine's counters as last added to the arena's */
    ckpt_storage *remote;    /* a remote storage (rados, s3): the connection */
    char job[256];           /* remote: the objects' prefix */
    uint64_t remote_latest;  /* remote: the id JOB/latest names, 0 none */
    uint32_t call_ms;        /* remote: of each call (0: the storage's default) */
    bool memory;             /* the memory storage: each checkpoint capped */
    /* a job that spans hosts (s->o.host): s->job is this host's parts' prefix */
    svc_job *jobs;
    char jobname[256];            /* the job's prefix */
    ckpt_job_workers job_workers; /* the workers this host serves at the start */
    bool replace;                 /* the arena is behind its job: made anew over it */
    bool fenced_told;             /* the fence published to the workers */
    ckpt_job_record *job_restore; /* a new arena: the job checkpoint it restores */
    ckpt_view *remote_view;       /* a new arena: the remote checkpoint it restores, read
                                   * straight from the storage */
    char job_from[256];           /* the job whose checkpoint that is */
    uint64_t job_done;            /* the newest job checkpoint id run */
    uint64_t wants_sent;          /* requests passed on to the leader */
    uint64_t savepoint_sent;      /* the savepoint ticket passed on to the leader */
    uint64_t want_ns;             /* when the last of them was (shm_clock_ns) */
    /* a lazy restore's background pass (service.c) */
    pthread_t lazy_thread;
    bool lazy_running;
    _Atomic int lazy_stop;
    _Atomic int lazy_said; /* its end was logged */
    int failure;           /* what stopped the engine by itself, 0 none (a `stash stop`) */
    bool lazy_cut;         /* the checkpoint in flight was cut while it ran */
};

/* Hands one event to the caller's log: as a record, and as a line. */
void engine_say(stash_service *s, stash_log_level level, const char *subject, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The I/O engine's line (ctx: the service), as the service's event. */
void engine_io_line(void *ctx, const char *line);
/* Unpins every key group pins[kg] names, zeroing it. */
void engine_unpin_all(stash_arena *a, uint32_t *pins);
/* Adds what the I/O engine did since the last look to the arena's totals. */
void engine_account_io(stash_service *s);
/* Starts a lazy restore's background pass (none running): key groups
 * still to come are brought in order. */
void engine_lazy_start(stash_service *s);

/* Says, once, that a lazy restore brought its last key group, and counts
 * it as the arena's restore. */
void engine_lazy_done(stash_service *s);
/* The engine's thread (arg: the service) until it is asked to stop. */
void *engine_main(void *arg);

#endif /* STASH_SERVICE_ENGINE_H */
