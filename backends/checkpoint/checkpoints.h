/* SPDX-License-Identifier: MIT */
/*
 * checkpoints.h: the checkpoint layer's one header for the layers above it
 * (the engine, the tools, the tests): snapshot blocks (snapshot.h),
 * reading a checkpoint directory (ckpt_read.h), writing and retaining
 * checkpoints (ckpt.h), restoring them (ckpt_restore.h), the remote
 * storages' table (storage.h) and a job's checkpoints mirrored into one
 * (mirror.h), the checkpoints of a job that spans hosts (rados_job.h) and
 * a job checkpoint read as one (job_merge.h).
 */
#ifndef STASH_CHECKPOINTS_H
#define STASH_CHECKPOINTS_H

#include "backends/checkpoint/ckpt.h"
#include "backends/checkpoint/ckpt_restore.h"
#include "backends/checkpoint/job_merge.h"
#include "backends/checkpoint/mirror.h"
#include "backends/checkpoint/rados_job.h"

#endif /* STASH_CHECKPOINTS_H */
