/* SPDX-License-Identifier: MIT */
/*
 * job_merge.h: a job checkpoint of a job that spans hosts read as one
 * (job_merge.c): its parts, each a host's checkpoint of its own arena,
 * merged into one savepoint, each key group from the part of the host that
 * served it and each worker's operator state from its host's part.
 */
#ifndef STASH_CKPT_JOB_MERGE_H
#define STASH_CKPT_JOB_MERGE_H
#include "backends/checkpoint/rados_job.h"

/* Merges the parts of job checkpoint rec, each the checkpoint directory
 * HOST/chk-ID (HOST/savepoint-ID) of parts, into the savepoint at path (which must not exist):
 * id rec->id, the parts' key groups and the job's workers' operator state,
 * the states named as in the parts (each host's arena numbered them its own
 * way: the savepoint numbers them anew). Returns 0, STASH_ECORRUPT naming
 * the part that disagrees with the others (a state of another kind or
 * options, a key group two parts hold), or an error naming the file. */
int ckpt_job_merge(const ckpt_job_record *rec, const shm_dir *parts, const char *path,
                   ioe_engine *e);

/* As ckpt_url_fetch, with a job checkpoint of a job that spans hosts
 * (rados://POOL/JOB/job-ID, or rados://POOL/JOB when the job's newest
 * checkpoint is one) fetched part by part and merged into one savepoint,
 * out->path. Only a committed one: the job's state is read, never written. */
int ckpt_url_fetch(const char *url, const shm_dir *under, ckpt_fetched *out);
#endif /* STASH_CKPT_JOB_MERGE_H */
