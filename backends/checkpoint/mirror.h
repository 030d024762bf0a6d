/* SPDX-License-Identifier: MIT */
/*
 * mirror.h: a job's checkpoints in a remote storage (mirror.c), mirrored
 * from and into a local checkpoint directory, and URLs naming them
 * (SCHEME://CONTAINER/JOB[/NAME]) for the tools.
 */
#ifndef STASH_CKPT_MIRROR_H
#define STASH_CKPT_MIRROR_H

#include "backends/checkpoint/storage.h"
#include "ioengine/ioengine.h"

/* A job's files are named JOB/ and the file's path in a checkpoint
 * directory; the pointer JOB/latest names the newest complete checkpoint. */

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
