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
/* The memory storage: checkpoints in shared memory, capped (Flink's
 * MemoryStateBackend keeps 5 MiB by default). */
#define CKPT_MEMORY_DEFAULT_CAP (5ull << 20)

typedef struct ckpt_opts {
    const char *dir;    /* the checkpoint directory (created if missing) */
    uint64_t id;        /* the checkpoint's id, > 0 */
    bool lz4;           /* compress each key group's block */
    bool savepoint;     /* DIR/savepoint-ID: kept until the user removes it */
    uint64_t cap_bytes; /* the memory storage's cap on a checkpoint's bytes; 0: none */
    ioe_engine *engine; /* every write and sync goes through it */
} ckpt_opts;

/* Writes key groups 0 .. max parallelism - 1, each as of its pinned version
 * pins[kg], into DIR/chk-ID/ (or DIR/savepoint-ID/) and commits: the data file durable first, then
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

/* A state as a checkpoint's metadata describes it. */
typedef struct ckpt_state {
    uint16_t id;
    uint16_t kind;
    uint8_t options[32];
    char name[SHM_STATE_NAME];
} ckpt_state;

/* An opened checkpoint: its metadata checked, its data file read. */
typedef struct ckpt_view {
    uint64_t id;
    uint64_t created_ns;
    uint32_t max_parallelism;
    uint32_t nstates;
    char meta_path[4096];
    char data_path[4096];
    char data_file[64];
    uint8_t *md;
    size_t md_len;
    uint8_t *data;
    size_t data_len;
    const uint8_t *extents; /* per key group: offset and size of its block */
} ckpt_view;

/* Opens the checkpoint or savepoint directory at path (wherever it was
 * moved: nothing in it names another place): reads and checks _metadata,
 * reads the data file. Returns 0, or an error naming the file and offset. */
int ckpt_view_open_path(const char *path, ioe_engine *e, ckpt_view *v);
/* Opens checkpoint id of dir, checking that it is the one its metadata names. */
int ckpt_view_open(const char *dir, uint64_t id, ioe_engine *e, ckpt_view *v);
void ckpt_view_close(ckpt_view *v);
/* The checkpoint's i-th state (i < nstates). */
ckpt_state ckpt_view_state(const ckpt_view *v, uint32_t i);
/* Checks every block of the range and passes each record to fn (NULL: only
 * check). Returns the records, or the first error with file and offset. */
int64_t ckpt_view_walk(const ckpt_view *v, stash_kg_range range, snap_record_fn *fn, void *ctx);
/* The ids of dir's checkpoints (complete or not), newest first, in *ids
 * (free it). Returns how many or an error. */
int ckpt_list(const char *dir, uint64_t **ids);

/* Restores the key groups of range from the checkpoint or savepoint
 * directory at path, as ckpt_restore() does for one checkpoint. */
int ckpt_restore_path(stash_arena *a, const char *path, stash_kg_range range, ioe_engine *e,
                      ckpt_restored *out);

/* Deletes all but the newest keep complete checkpoints of dir. */
int ckpt_retain(const char *dir, unsigned keep);

#endif /* STASH_CKPT_H */
