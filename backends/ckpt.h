/*
 * ckpt.h: checkpoints in a directory: a full checkpoint of an arena's key
 * groups written through the I/O engine and committed by the protocol of
 * docs/format.md, restored (newest complete first, falling back to older
 * ones), and retention of the newest few.
 */
#ifndef STASH_CKPT_H
#define STASH_CKPT_H

#include "backends/snapshot.h"
#include "ioengine/ioengine.h"

#define CKPT_MAGIC "STASHCKP"
#define CKPT_FORMAT_VERSION 1u
#define CKPT_BACKEND_HEAP 1u

typedef struct ckpt_opts {
    const char *dir;    /* the checkpoint directory (created if missing) */
    uint64_t id;        /* the checkpoint's id, > 0 */
    bool lz4;           /* compress each key group's block */
    ioe_engine *engine; /* every write and sync goes through it */
} ckpt_opts;

/* Writes key groups 0 .. max parallelism - 1, each as of its pinned version
 * pins[kg], into DIR/chk-ID/ and commits: the data file durable first, then
 * _metadata.tmp written, synced and renamed to _metadata, then the directory
 * synced. On any failure (a failed write or fsync included: never retried)
 * the partial checkpoint is removed and the error names the file and offset. */
int ckpt_write_full(stash_arena *a, const uint32_t *pins, const ckpt_opts *o);

typedef struct ckpt_restored {
    uint64_t id;      /* the checkpoint restored */
    uint64_t records; /* records put into the arena */
    unsigned skipped; /* newer checkpoints passed over as damaged or incomplete */
    char why[512];    /* the first reason one was passed over, naming file and offset */
} ckpt_restored;

/* Restores the key groups of range from checkpoint id in dir (0: the newest
 * complete one, falling back to older ones past any that fail a check, and
 * saying so in *out). Every block is checked before any record is written
 * into the arena, whose key groups no worker may write meanwhile. Never
 * modifies the directory. */
int ckpt_restore(stash_arena *a, const char *dir, uint64_t id, stash_kg_range range, ioe_engine *e,
                 ckpt_restored *out);

/* Deletes all but the newest keep complete checkpoints of dir. */
int ckpt_retain(const char *dir, unsigned keep);

#endif /* STASH_CKPT_H */
