/* SPDX-License-Identifier: MIT */
/*
 * rados_job.h: a job that spans hosts, as objects of its RADOS pool
 * (rados_job.c). Each host's service writes its part of a checkpoint as a
 * checkpoint of its own arena (JOB/part/HOST/chk-ID, rados_mirror.c) and a
 * note naming the workers it serves; the leader commits the job's
 * checkpoint ID by writing its record (the parts and their workers) and
 * moving JOB/latest to ID by compare-and-swap, or aborts it. A restore
 * takes each key group from the part of the host that served it.
 */
#ifndef STASH_CKPT_RADOS_JOB_H
#define STASH_CKPT_RADOS_JOB_H

#include "backends/checkpoint/ckpt_restore.h"
#include "backends/checkpoint/rados.h"

#define CKPT_JOB_RANGES 32   /* ranges of worker indices a host serves, at most */
#define CKPT_JOB_HOSTS 64    /* parts of one job checkpoint, at most */
#define CKPT_JOB_HOST_MAX 63 /* bytes of a host's name */

/* Worker indices of the job, as ranges: "0-1,4-4". */
typedef struct ckpt_job_workers {
    uint32_t n;
    struct {
        uint32_t first, last;
    } r[CKPT_JOB_RANGES];
} ckpt_job_workers;

/* Parses "A-B[,C-D...]" (or "A" for A-A). Returns 0 or -EINVAL naming what
 * is wrong. */
int ckpt_job_workers_parse(const char *text, ckpt_job_workers *w);
/* Writes w as text into buf (cap bytes). */
void ckpt_job_workers_format(const ckpt_job_workers *w, char *buf, size_t cap);
bool ckpt_job_workers_has(const ckpt_job_workers *w, uint32_t index);
/* Adds the ranges of add to w. Returns 0 or -E2BIG. */
int ckpt_job_workers_add(ckpt_job_workers *w, const ckpt_job_workers *add);

/* A host's part of a job checkpoint, or a host of the job. */
typedef struct ckpt_job_part {
    char host[CKPT_JOB_HOST_MAX + 1];
    uint32_t parallelism;     /* the job's workers, of which it serves workers */
    uint32_t max_parallelism; /* the job's key groups */
    ckpt_job_workers workers;
} ckpt_job_part;

/* The parts of job checkpoint id. */
typedef struct ckpt_job_record {
    uint64_t id;
    size_t n;
    ckpt_job_part parts[CKPT_JOB_HOSTS];
} ckpt_job_record;

/* A part's line, "HOST P MAXP WORKERS\n" (a note's, a member's), into buf. */
void ckpt_job_part_format(const ckpt_job_part *p, char *buf, size_t cap);
/* Reads the one-line object name (a member of the job) into *p. Returns 0,
 * -ENOENT, STASH_ECORRUPT naming it, or an error naming it. */
int ckpt_job_part_read(ckpt_rados *r, const char *name, ckpt_job_part *p);

/* Whether name is a host's name: 1 to CKPT_JOB_HOST_MAX bytes of letters,
 * digits, '.', '_' and '-'. */
bool ckpt_job_host_ok(const char *name);

/* The sub-job a host's parts are written into: JOB/part/HOST. */
int ckpt_job_part_prefix(char *out, size_t cap, const char *job, const char *host);
/* Object names: JOB/ctl (watched: the leader's requests and verdicts),
 * JOB/leader (its lease), JOB/hosts/HOST (a host's lease and workers). */
int ckpt_job_object(char *out, size_t cap, const char *job, const char *what);

/* A new id for the job's next checkpoint, above every one used before
 * (one compare-and-swap of the counter JOB/ids). */
int ckpt_job_next_id(ckpt_rados *r, const char *job, uint64_t *id);
/* Notes that part->host's part of checkpoint id is in the pool (written
 * once). */
int ckpt_job_note(ckpt_rados *r, const char *job, uint64_t id, const ckpt_job_part *part);
/* The notes of checkpoint id written so far, into rec. */
int ckpt_job_notes(ckpt_rados *r, const char *job, uint64_t id, ckpt_job_record *rec);
/* Whether the parts of rec serve each of the job's workers exactly once:
 * 0, -EAGAIN naming the first worker no part serves yet, or -EINVAL naming
 * a worker two parts serve or a part of another parallelism. */
int ckpt_job_covered(const ckpt_job_record *rec);
/* Commits job checkpoint rec->id: its record written, then JOB/latest
 * moved from prev (0: none yet). Returns 0, -ECANCELED (another leader
 * moved it), or an error naming the object. */
int ckpt_job_commit(ckpt_rados *r, const char *job, const ckpt_job_record *rec, uint64_t prev);
/* Aborts job checkpoint id (no commit can follow). */
int ckpt_job_abort(ckpt_rados *r, const char *job, uint64_t id);
/* What became of checkpoint id: 1 committed, 0 not yet decided,
 * -ECANCELED aborted, or an error naming the object. */
int ckpt_job_verdict(ckpt_rados *r, const char *job, uint64_t id);
/* The id JOB/latest names (-ENOENT: none yet) and, with rec, its record. */
int ckpt_job_latest(ckpt_rados *r, const char *job, uint64_t *id, ckpt_job_record *rec);
/* Reads the record of job checkpoint id into rec (-ENOENT: none). */
int ckpt_job_record_read(ckpt_rados *r, const char *job, uint64_t id, ckpt_job_record *rec);
/* The ids of the job's records in the pool, newest first (*ids: free it). */
int ckpt_job_records(ckpt_rados *r, const char *job, uint64_t **ids, size_t *n);
/* Keeps the newest keep committed job checkpoints at or below JOB/latest
 * and the parts they name; removes older records, aborted and undecided
 * ones below it, and every part below it that no kept record names. */
int ckpt_job_retain(ckpt_rados *r, const char *job, unsigned keep);

/* Restores into a the key groups of workers (of parallelism, the job's
 * max parallelism being the arena's) from job checkpoint rec: each part
 * that served any of them copied into DIR/parts/HOST, then its share
 * restored; the operator state of every part's workers gathered in *out
 * (so every part is read). st: as for ckpt_restore_prepared(). */
int ckpt_job_restore(stash_arena *a, ckpt_rados *r, const char *job, const ckpt_job_record *rec,
                     const shm_dir *dir, uint32_t parallelism, const ckpt_job_workers *workers,
                     ioe_engine *e, store *st, ckpt_restored *out);

#endif /* STASH_CKPT_RADOS_JOB_H */
