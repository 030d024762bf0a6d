/* SPDX-License-Identifier: MIT */
/*
 * rados_job.h: a job that spans hosts, as objects of its RADOS pool
 * (rados_job.c). Each host's service joins as a member under a lease and
 * an epoch of its own, writes its part of a checkpoint as a checkpoint of
 * its own arena (JOB/part/HOST/EPOCH/chk-ID, rados_mirror.c) and notes it
 * in its member; the leader, under an epoch of its own, gathers the notes,
 * writes the record (the parts and their workers) and commits it. The one
 * decision on each checkpoint, committed or aborted, the pointer to the
 * committed one and the leader's epoch are attributes of one object,
 * JOB/latest, changed only by operations that compare what they rest on:
 * a service that lost its lease or its epoch, however long it was paused,
 * changes nothing. A restore takes each key group from the part of the
 * host that served it.
 */
#ifndef STASH_CKPT_RADOS_JOB_H
#define STASH_CKPT_RADOS_JOB_H

#include "backends/checkpoint/ckpt_restore.h"
#include "backends/checkpoint/mirror.h"

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
    uint64_t epoch; /* of the service that wrote it (0: before epochs: JOB/part/HOST) */
} ckpt_job_part;

/* The parts of job checkpoint id. */
typedef struct ckpt_job_record {
    uint64_t id;
    bool savepoint; /* a savepoint of the job: each part HOST's savepoint-ID, kept for good */
    size_t n;
    ckpt_job_part parts[CKPT_JOB_HOSTS];
} ckpt_job_record;

/* A part's line, "HOST P MAXP WORKERS EPOCH\n" (a record's, a member's), into buf. */
void ckpt_job_part_format(const ckpt_job_part *p, char *buf, size_t cap);

/* The name of each part's checkpoint directory of rec: chk-ID, or
 * savepoint-ID for a savepoint. */
void ckpt_job_part_name(const ckpt_job_record *rec, char *buf, size_t cap);

/* Whether name is a host's name: 1 to CKPT_JOB_HOST_MAX bytes of letters,
 * digits, '.', '_' and '-'. */
bool ckpt_job_host_ok(const char *name);

/* The sub-job a host's parts are written into: JOB/part/HOST/EPOCH
 * (JOB/part/HOST for epoch 0). */
int ckpt_job_part_prefix(char *out, size_t cap, const char *job, const char *host, uint64_t epoch);
/* Object names: JOB/ctl (watched: the leader's requests and verdicts),
 * JOB/leader (its lease), JOB/hosts/HOST (a member), JOB/latest. */
int ckpt_job_object(char *out, size_t cap, const char *job, const char *what);

/* A new id for the job's next checkpoint, above every one used before
 * (one compare-and-swap of the counter JOB/ids). */
int ckpt_job_next_id(ckpt_storage *r, const char *job, uint64_t *id);

/* Moves the job's ids past floor: its next checkpoint's id is above it. */
int ckpt_job_ids_above(ckpt_storage *r, const char *job, uint64_t floor);

/* Notes in the pool that job was first started from source (a job
 * checkpoint's URL, rados://POOL/JOB/job-ID): one exclusive create, so
 * that every host of its first start restores the same. Returns 0 (noted
 * now, or before with the same source), or -EEXIST naming the source it
 * was started from. */
int ckpt_job_started_from(ckpt_storage *r, const char *job, const char *source);
/* The source job was first started from, into buf (cap bytes): 0, or
 * -ENOENT (none: it started empty or from its own checkpoints). */
int ckpt_job_origin(ckpt_storage *r, const char *job, char *buf, size_t cap);
/* Splits source (rados://POOL/JOB/job-ID) into its job (cap bytes) and
 * id, if it names a job of the storage where names ("rados://POOL").
 * Returns 0 or -EINVAL naming what is wrong. */
int ckpt_job_source_parse(const char *where, const char *source, char *job, size_t cap,
                          uint64_t *id);
/* Whether id is a committed checkpoint or savepoint of job whose record is
 * kept: 0, or -ENOENT naming it. The job's state is read, never written. */
int ckpt_job_committed(ckpt_storage *r, const char *job, uint64_t id);
/* The job checkpoint a host of job restores from: the one JOB/latest
 * names, or while the job has none, the one it was first started from
 * (ckpt_job_started_from); its job in from (cap bytes), its record in rec.
 * Returns 0, -ENOENT (neither: the job starts empty) or an error. */
int ckpt_job_source(ckpt_storage *r, const char *job, char *from, size_t cap, ckpt_job_record *rec);

/* ---- members ---- */

/* A member JOB/hosts/HOST as read at once. */
typedef struct ckpt_job_member {
    ckpt_job_part m;    /* the host and the workers it serves */
    char epoch[96];     /* the epoch of the service serving it, or "taken by HOST", or "lost" */
    uint64_t note_id;   /* the checkpoint its last note names (0: none) */
    ckpt_job_part note; /* that note's part */
} ckpt_job_member;
/* Reads member object name. Returns 0, -ENOENT (absent, or only its lease
 * is there), STASH_ECORRUPT naming it, or an error naming it. */
int ckpt_job_member_read(ckpt_storage *r, const char *name, ckpt_job_member *m);
/* The epoch of the service serving m (0: none: taken over or lost). */
uint64_t ckpt_job_member_epoch(const ckpt_job_member *m);
/* Whether another host is taking m's workers over. */
bool ckpt_job_member_taken(const ckpt_job_member *m);
/* The host taking m's workers over ("" if none is). */
const char *ckpt_job_member_taker(const ckpt_job_member *m);
/* Joins the job as host self->host serving self's workers: the member's
 * lease taken under cookie for lease_ms, then a new epoch (self->epoch,
 * from the counter JOB/epochs, never used before) set in the member with
 * its line, so that a service of an older epoch is fenced off. Returns 0,
 * -EBUSY (a live service holds the lease, or a takeover of the host's
 * workers is under way), or an error naming the object. */
int ckpt_job_join(ckpt_storage *r, const char *job, ckpt_job_part *self, const char *cookie,
                  uint32_t lease_ms);
/* Sets the member's line to self (the workers it serves changed), if the
 * member's epoch is still self->epoch. STASH_EFENCED if not. */
int ckpt_job_member_set(ckpt_storage *r, const char *job, const ckpt_job_part *self);
/* Notes that part's part of checkpoint id is in the pool, if the member's
 * epoch is still part->epoch. STASH_EFENCED if not. */
int ckpt_job_note(ckpt_storage *r, const char *job, uint64_t id, const ckpt_job_part *part);
/* Claims lost's workers for taker, if the member's epoch still reads seen:
 * the service of that epoch is fenced off from then on. Returns 0,
 * -ECANCELED (it changed), or an error naming the object. */
int ckpt_job_claim(ckpt_storage *r, const char *job, const char *lost, const char *seen,
                   const char *taker);
/* Gives taker's claim of lost's workers up (its takeover failed): lost,
 * for the leader to ask again. */
int ckpt_job_unclaim(ckpt_storage *r, const char *job, const char *lost, const char *taker);
/* The notes of checkpoint id by the services serving the members now, into rec. */
int ckpt_job_notes(ckpt_storage *r, const char *job, uint64_t id, ckpt_job_record *rec);
/* Whether the parts of rec serve each of the job's workers exactly once:
 * 0, -EAGAIN naming the first worker no part serves yet, or -EINVAL naming
 * a worker two parts serve or a part of another parallelism. */
int ckpt_job_covered(const ckpt_job_record *rec);

/* ---- the leader and the decisions ---- */

/* Takes the next leader's epoch (*epoch): a leader of an older one commits
 * nothing from then on. Called by the holder of JOB/leader's lease. */
int ckpt_job_lead(ckpt_storage *r, const char *job, uint64_t *epoch);
/* The leader's epoch now (0: none yet). */
int ckpt_job_leader(ckpt_storage *r, const char *job, uint64_t *epoch);
/* Commits job checkpoint rec->id as the leader of epoch leader: its record
 * written, then in one operation on JOB/latest, if the leader's epoch is
 * still leader, JOB/latest still names what it was read to name (below
 * rec->id) and nobody aborted rec->id, rec->id committed and named (a
 * savepoint noted as one too, a mark no retention forgets).
 * Returns 0, -ECANCELED saying which of those failed, or an error naming
 * the object. */
int ckpt_job_commit(ckpt_storage *r, const char *job, const ckpt_job_record *rec, uint64_t leader);
/* Aborts job checkpoint id (anyone may: no commit can follow) unless it
 * was committed. Returns 0 (aborted, now or before), 1 (committed),
 * -ESTALE (a decision forgotten), or an error naming the object. */
int ckpt_job_abort(ckpt_storage *r, const char *job, uint64_t id, const char *why);
/* The decision on checkpoint id: 1 committed, 0 none yet, -ECANCELED
 * aborted (one passed over by a later commit is aborted here), -ESTALE
 * (forgotten: below the oldest kept one), or an error naming the object. */
int ckpt_job_verdict(ckpt_storage *r, const char *job, uint64_t id);
/* The id JOB/latest names (-ENOENT: none yet) and, with rec, its record. */
int ckpt_job_latest(ckpt_storage *r, const char *job, uint64_t *id, ckpt_job_record *rec);
/* Reads the record of job checkpoint id into rec (-ENOENT: none). */
int ckpt_job_record_read(ckpt_storage *r, const char *job, uint64_t id, ckpt_job_record *rec);
/* The ids of the job's committed checkpoints whose decisions are kept and
 * of every committed savepoint, newest first (*ids: free it). */
int ckpt_job_records(ckpt_storage *r, const char *job, uint64_t **ids, size_t *n);
/* As the leader of epoch leader: keeps the newest keep committed job
 * checkpoints, every committed savepoint and the parts they name; forgets
 * the decisions below the oldest kept checkpoint; removes older records and
 * every part below JOB/latest that no kept record names. */
int ckpt_job_retain(ckpt_storage *r, const char *job, unsigned keep, uint64_t leader);

/* Restores into a the key groups of workers (of parallelism, the job's
 * max parallelism being the arena's) from job checkpoint rec: each part
 * that served any of them copied into DIR/parts/HOST, then its share
 * restored; the operator state of every part's workers gathered in *out
 * (so every part is read). The copies and the record stay in DIR/parts
 * for rollbacks. st: as for ckpt_restore_prepared(). */
int ckpt_job_restore(stash_arena *a, ckpt_storage *r, const char *job, const ckpt_job_record *rec,
                     const shm_dir *dir, uint32_t parallelism, const ckpt_job_workers *workers,
                     ioe_engine *e, store *st, ckpt_restored *out);
/* A rollback's restore of the key groups range from what the restore of
 * job checkpoint id into dir left (its parts' copies in DIR/parts/HOST and
 * its record, DIR/parts/job-ID); the records restored in *records. Also
 * from the parts of a job checkpoint of another job (a job's first start
 * from it) and of a savepoint. */
int ckpt_job_restore_copies(stash_arena *a, const shm_dir *dir, uint64_t id, stash_kg_range range,
                            ioe_engine *e, store *st, uint64_t *records);
/* Removes from dir the copies of job checkpoints below id (a checkpoint of
 * the arena holds what they restored). */
int ckpt_job_copies_drop(const shm_dir *dir, uint64_t below);

#endif /* STASH_CKPT_RADOS_JOB_H */
