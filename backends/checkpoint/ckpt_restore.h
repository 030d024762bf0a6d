/* SPDX-License-Identifier: MIT */
/*
 * ckpt_restore.h: restoring a checkpoint of a directory into an arena's
 * store (ckpt_restore.c): the newest complete one first, falling back to
 * older ones past any that fail a check; one arriving from a storage into a
 * new arena as its bytes come; or lazily.
 */
#ifndef STASH_CKPT_RESTORE_H
#define STASH_CKPT_RESTORE_H

#include "backends/checkpoint/ckpt_read.h"

typedef struct ckpt_restored {
    uint64_t id;             /* the checkpoint restored */
    uint64_t records;        /* records put into the arena (deltas count each change) */
    unsigned skipped;        /* newer checkpoints passed over as damaged */
    char why[512];           /* the first reason one was passed over, naming file and offset */
    uint32_t op_parallelism; /* its operator state: of this many workers */
    ckpt_blob *op_blobs;     /* their blobs, state ids those of the arena */
    uint8_t *op_mem;         /* what the blobs point into */
} ckpt_restored;

/* ---- a lazy restore (instant recovery) ---------------------------------
 * The arena serves at once; each key group comes from the checkpoint when
 * it is first touched or when a background pass reaches it, whichever is
 * first. The arena's control block names the checkpoint and each table
 * says whether its key group is there (layout.h: lazy): with the heap
 * store its records, with lmdb its environment, made from the key group's
 * blocks when it comes. A whole restore over key groups still to come
 * (ckpt_restore*, a rollback) takes them over. */

/* Begins a lazy restore of range from the checkpoint directory at path:
 * checks its metadata, registers its states and hands out its operator
 * state in *out (id, op_*), and marks every key group of range as still to
 * come. -ENAMETOOLONG if path does not fit the control block: restore it
 * whole instead. */
int ckpt_lazy_begin(stash_arena *a, const char *path, stash_kg_range range, ioe_engine *e,
                    ckpt_restored *out);
/* Returns once key group kg is in the arena: at once if it is, else after
 * restoring it here (reading only its blocks) or waiting for the thread
 * that is; a thread that died at it is taken over (what it wrote cleared
 * first). e may be NULL: the call opens an engine of its own. A key group
 * whose blocks fail their checks stays out: STASH_ECORRUPT for everyone
 * who touches it, naming the checkpoint and the key group. */
int ckpt_lazy_await(stash_arena *a, uint32_t kg, ioe_engine *e);
/* 0 if the lazy restore's checkpoint is one full data file whose states
 * have the arena's ids, so that a checkpoint taken meanwhile copies the
 * blocks of key groups not yet restored as they are (ckpt_opts.lazy_from);
 * -ENOTSUP if not (bring them first: ckpt_lazy_fill). */
int ckpt_lazy_copyable(stash_arena *a, ioe_engine *e);
/* Whether a lazy restore still has key groups to bring. */
bool ckpt_lazy_pending(const stash_arena *a);
/* Makes the checkpoint directory at path the one the lazy restore brings
 * key groups from (a fallback: the checkpoint before was found damaged).
 * Restorers at work finish from the old one; ckpt_lazy_renew their key
 * groups after. Returns 0 or -ENAMETOOLONG. */
int ckpt_lazy_rebase(stash_arena *a, const char *path);
/* Makes every key group of range still to come: each claimed whatever its
 * state (one a thread is bringing waited for), emptied through st (the
 * caller must be its owner, or none may own it), and left pending; with
 * failed_only, only those that failed (whose owner can have written
 * nothing). Returns 0 or the first error emptying one (pending all the
 * same). */
int ckpt_lazy_renew(stash_arena *a, stash_kg_range range, bool failed_only, store *st);
/* The background pass: brings every key group still to come, in order,
 * until none is left (0), stop becomes non-zero (0), or one fails. */
int ckpt_lazy_fill(stash_arena *a, ioe_engine *e, const _Atomic int *stop);

/* Frees the operator state a restore handed out. */
void ckpt_restored_free(ckpt_restored *r);

/* Restores the key groups of range from checkpoint id in dir (0: the newest
 * complete one, falling back to older ones past any that fail a check, and
 * saying so in *out). Every block of every file the checkpoint needs is
 * checked before any record is written into the arena, whose key groups no
 * worker may write meanwhile. Key groups of range that a lazy restore has
 * yet to bring are taken from it first (one it is bringing waited for) and
 * are whole after a restore that succeeded. Never modifies the directory. */
int ckpt_restore(stash_arena *a, const shm_dir *dir, uint64_t id, stash_kg_range range,
                 ioe_engine *e, ckpt_restored *out);

/* As ckpt_restore(), calling prepare(ctx) once the checkpoint to restore
 * has passed every check and before its first record goes in (a rollback
 * clears its key groups there, so a checkpoint that cannot restore leaves
 * them as they were). A failure of prepare fails the restore. */
typedef int ckpt_prepare_fn(void *ctx);
/* st: the caller's store handle on the arena if it has one (the lmdb store
 * allows one per process), else NULL: the restore opens its own. upto
 * (without id): none newer than it (a job's host: a checkpoint of its
 * directory is complete once the job committed it, which the arena says);
 * UINT64_MAX: any. */
int ckpt_restore_prepared(stash_arena *a, const shm_dir *dir, uint64_t id, uint64_t upto,
                          stash_kg_range range, ioe_engine *e, store *st, ckpt_prepare_fn *prepare,
                          void *ctx, ckpt_restored *out);

/* Restores the key groups of range from the checkpoint or savepoint
 * directory at path, as ckpt_restore() does for one checkpoint (store: as
 * for ckpt_restore_prepared()). */
int ckpt_restore_path(stash_arena *a, const char *path, stash_kg_range range, ioe_engine *e,
                      store *st, ckpt_restored *out);
/* Waits until the first upto bytes of data file f of a view are in its
 * memory: 0, or why they will not come (named). Any thread. */
typedef int ckpt_arrived_fn(void *ctx, uint32_t f, uint64_t upto);
/* As ckpt_restore_path, into a new arena whose key groups are empty, from
 * the view v whose data files are being read into memory (files[f].data
 * and .len set, the bytes arriving from the front; arrived(ctx, f, upto)
 * says when they are there): each key group goes in as soon as its blocks
 * have arrived and passed their checks, two at a time, and the files'
 * checksums are checked once whole. A failure may leave part of the
 * checkpoint in the arena: the caller drops the arena. */
int ckpt_restore_arriving(stash_arena *a, ckpt_view *v, stash_kg_range range, store *st,
                          ckpt_arrived_fn *arrived, void *ctx, ckpt_restored *out);

/* Registers the states of the checkpoint or savepoint directory at path
 * in the arena and hands out its operator state, restoring no record. */
int ckpt_restore_opstate(stash_arena *a, const char *path, ioe_engine *e, ckpt_restored *out);

#endif /* STASH_CKPT_RESTORE_H */
