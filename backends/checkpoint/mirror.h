/* SPDX-License-Identifier: MIT */
/*
 * mirror.h: a job's checkpoints in a remote storage (mirror.c), mirrored
 * from and into a local checkpoint directory, and URLs naming them
 * (SCHEME://CONTAINER/JOB[/NAME]) for the tools.
 */
#ifndef STASH_CKPT_MIRROR_H
#define STASH_CKPT_MIRROR_H

#include "backends/checkpoint/ckpt.h"
#include "backends/checkpoint/ckpt_restore.h"
#include "backends/checkpoint/storage.h"

/* A job's files are named JOB/ and the file's path in a checkpoint
 * directory; the pointer JOB/latest names the newest complete checkpoint. */

/* A checkpoint or savepoint going into the job while it is written: its
 * name claimed first (another engine of the job that took the same id
 * writes nothing over it), its data file sent as it is written (copy, for
 * ckpt_opts.copy), the rest by ckpt_upload_finish once it is committed in
 * the directory. */
typedef struct ckpt_upload {
    ckpt_storage *st;
    const char *job;
    char dirname[64];       /* chk-ID, savepoint-ID */
    char file[64];          /* the data file going up, as the metadata lists it */
    char sent[64];          /* the data file that went up whole, or "" */
    ckpt_storage_writer *w; /* file's */
    bool failed;            /* the storage failed the copy */
    ckpt_copy copy;
} ckpt_upload;
/* Claims dirname in the job. Returns 0, -ECANCELED (taken by another
 * engine), or an error naming the object. */
int ckpt_upload_begin(ckpt_upload *u, ckpt_storage *st, const char *job, const char *dirname);
/* Sends what of the committed directory dirname of dirfd (path in messages)
 * did not go up while it was written, as ckpt_storage_upload does, and
 * ends u. */
int ckpt_upload_finish(ckpt_upload *u, int dirfd, const char *path, uint64_t prev, ioe_engine *e);

/* Copies the checkpoint or savepoint directory dirname of dirfd (chk-ID or
 * savepoint-ID, committed; path names it in messages) into the job: its data files (a shared file
 * of an earlier checkpoint that is there already is not copied again),
 * then its metadata; then, for a checkpoint, moves JOB/latest from prev
 * (0: none yet) to its id. Returns 0, -ECANCELED if JOB/latest holds
 * another id (another engine committed), or an error naming the object. */
int ckpt_storage_upload(ckpt_storage *st, const char *job, int dirfd, const char *dirname,
                        const char *path, uint64_t prev, ioe_engine *e);
/* The id JOB/latest names. Returns 0, -ENOENT (the job has none), or an
 * error naming the object. */
int ckpt_storage_latest(ckpt_storage *st, const char *job, uint64_t *id);
/* Copies checkpoint or savepoint dirname (chk-ID, savepoint-ID, ...) of the
 * job into DIR/dirname (and the shared files it lists into DIR/shared),
 * unless DIR holds it already: each file moved into place once whole, the
 * checkpoint's directory last. Returns 0 or an error naming the object or
 * the file. */
int ckpt_storage_fetch(ckpt_storage *st, const char *job, const shm_dir *dir, const char *dirname);
/* Opens checkpoint or savepoint dirname of the job in v, its metadata read
 * and checked (and that it names the id dirname names), its data files read
 * straight from the storage into memory when loaded (ckpt_view_load), with
 * no copy on disk. st must stay open while v is. Returns 0 or an error
 * naming the object. */
int ckpt_storage_view(ckpt_storage *st, const char *job, const char *dirname, ckpt_view *v);
/* Writes checkpoint or savepoint dirname of the job, viewed in v
 * (ckpt_storage_view), into dir, made durable: its data files from memory
 * where v has them loaded, else streamed from the storage. Each file is
 * moved into place once whole (a shared file dir has already is kept), the
 * checkpoint's directory last. Returns 0 or an error naming the file. */
int ckpt_storage_place(ckpt_storage *st, const char *job, const ckpt_view *v, const shm_dir *dir,
                       const char *dirname);
/* Restores range of checkpoint v of the job (ckpt_storage_view, opened
 * without its data) into a new arena a's store into (NULL: one of its
 * own), as ckpt_restore_arriving does: its data files read straight from
 * the storage into memory, each key group put in once its blocks have
 * arrived and passed their checks. Meanwhile a thread writes the copy into
 * dir as the bytes come, named only once the restore passed (a replaced
 * worker rolls back from the directory). Fails if either fails; a failure
 * may leave part of the checkpoint in a, which the caller drops. The
 * caller closes v. */
int ckpt_storage_restore(ckpt_storage *st, const char *job, ckpt_view *v, const shm_dir *dir,
                         stash_arena *a, stash_kg_range range, store *into, ckpt_restored *out);
/* Appends to *names (of *n; free each and the array) the shared files
 * ("shared/ID.dat") checkpoint dirname of the job lists. */
int ckpt_storage_shared_of(ckpt_storage *st, const char *job, const char *dirname, char ***names,
                           size_t *n);
/* The job's checkpoints in the storage, newest first: their ids in *ids and
 * whether each one's metadata is there in *committed (free both). */
int ckpt_storage_checkpoints(ckpt_storage *st, const char *job, uint64_t **ids, bool **committed,
                             size_t *n);
/* Removes the job's checkpoints but the newest keep complete ones at or
 * below JOB/latest (partial ones below it too), then the shared files none
 * of the kept ones lists. */
int ckpt_storage_retain(ckpt_storage *st, const char *job, unsigned keep);

/* URLs SCHEME://CONTAINER/JOB[/NAME] name a job's checkpoint or savepoint
 * NAME (chk-ID, savepoint-ID, job-ID; without one, the checkpoint
 * JOB/latest names) in a storage of storage.h's table. The tools connect
 * with the storage's defaults: rados, the cluster Ceph's own search finds
 * ($CEPH_CONF, then /etc/ceph/ceph.conf) as client $STASH_CEPH_ID or admin;
 * s3, the endpoint and credentials of the environment (s3.c). */
/* Whether path is such a URL (of a storage in the table). */
bool ckpt_url(const char *path);
/* Splits url into its storage, container, job and NAME ("" if none),
 * each in a buffer of the size given. Returns 0 or -EINVAL naming it. */
int ckpt_url_parse(const char *url, const ckpt_storage_ops **ops, char *container,
                   size_t container_cap, char *job, size_t job_cap, char *name, size_t name_cap);
/* Connects for url: *st (close it), the job and NAME ("" if none). */
int ckpt_url_open(const char *url, ckpt_storage **st, char *job, size_t job_cap, char *name,
                  size_t name_cap);
/* A checkpoint or savepoint fetched from a storage into a directory of its own. */
typedef struct ckpt_fetched {
    shm_dir parent;  /* where tmp was made */
    shm_dir tmp;     /* stash-fetch-PID-R, this process's while open */
    char path[4096]; /* tmp/NAME: opens as any checkpoint directory */
} ckpt_fetched;
/* Copies the checkpoint or savepoint url names into a new directory under
 * under (NULL: /var/tmp); ckpt_url_release removes it. (ckpt_url_fetch of
 * job_merge.h takes a job checkpoint of a job that spans hosts too.) */
int ckpt_url_fetch_checkpoint(const char *url, const shm_dir *under, ckpt_fetched *out);
/* Removes what ckpt_url_fetch_checkpoint or ckpt_url_fetch fetched (accepts one that failed). */
void ckpt_url_release(ckpt_fetched *f);
/* Copies the savepoint directory local into url, whose NAME must be
 * local's own name (savepoint-ID or another, not chk-ID) and not in the
 * job yet. Returns 0, -EEXIST, -EINVAL, or an error naming the object. */
int ckpt_url_put(const char *local, const char *url, ioe_engine *e);

#endif /* STASH_CKPT_MIRROR_H */
