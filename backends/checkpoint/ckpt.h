/* SPDX-License-Identifier: MIT */
/*
 * ckpt.h: checkpoints in a directory: full and incremental checkpoints of an
 * arena's key groups written through the I/O engine and committed by the
 * protocol of docs/format.md, savepoints, restore (newest complete first,
 * falling back to older ones), and retention of the newest few.
 */
#ifndef STASH_CKPT_H
#define STASH_CKPT_H

#include "backends/checkpoint/snapshot.h"
#include "ioengine/ioengine.h"

#define CKPT_MAGIC "STASHCKP"
#define CKPT_FORMAT_VERSION 2u
#define CKPT_BACKEND_HEAP 1u /* the metadata's backend: the arena's STASH_BACKEND_* + 1 */
#define CKPT_BACKEND_LMDB 2u
_Static_assert(CKPT_BACKEND_HEAP == STASH_BACKEND_HEAP + 1 &&
                   CKPT_BACKEND_LMDB == STASH_BACKEND_LMDB + 1,
               "the metadata numbers backends as the arena does, from 1");
#define CKPT_MAX_FILES 64u /* a chain: one full data file, then deltas */
#define CKPT_FILE_DELTA 1u /* a data file of delta blocks */
#define CKPT_FILE_CRC 2u   /* the metadata holds the CRC32C of the file's blocks in order */
/* The memory storage: checkpoints in shared memory, capped (Flink's
 * MemoryStateBackend keeps 5 MiB by default). */
#define CKPT_MEMORY_DEFAULT_CAP (5ull << 20)

typedef struct ckpt_opts {
    const char *dir;  /* the checkpoint directory (created if missing) */
    uint64_t id;      /* the checkpoint's id, > 0 */
    bool lz4;         /* compress each key group's block */
    bool savepoint;   /* DIR/savepoint-ID, full and self-contained, never retired */
    bool incremental; /* data files in DIR/shared/, which later checkpoints reference */
    uint64_t base_id; /* incremental: write only the changes since this checkpoint */
    const uint32_t
        *base_pins;          /* with base_id: the versions the base was written at, still pinned */
    uint64_t cap_bytes;      /* the memory storage's cap on a checkpoint's bytes; 0: none */
    bool reader;             /* the writer owns none of the key groups: it announces itself */
    uint32_t reader_slot;    /* with reader: its slot for shm_ebr_enter (shm_reader_join) */
    uint32_t reader_slot2;   /* with reader: a slot for a second serializing thread; 0 none */
    ioe_engine *engine;      /* every write and sync goes through it */
    uint32_t op_parallelism; /* operator state: of this many workers (0: none) */
    const ckpt_blob *op_blobs; /* worker i's operator-state blob (opstate.h) */
    bool group;                /* directories 0750 and files 0640, not 0700 and 0600 */
    /* A full checkpoint's records go through it (TTL states that leave out
     * what expired at the cut); NULL: all of them. Deltas take no filter. */
    const snap_filter *filter;
    /* If set, called in the writing thread once key group kg is serialized:
     * the checkpoint needs pins[kg] no longer, and releasing it then stops
     * kg's writers keeping old versions for it. Without reader, the caller's
     * process owns the key groups and must not write them meanwhile. */
    void (*serialized)(void *ctx, uint32_t kg);
    void *serialized_ctx;
    /* The store key groups are read from, each cut opened (NULL: the
     * writer opens one of the arena's backend and cuts every key group as
     * it stands). Read from two threads at once for different key groups,
     * each announced in its reader slot. */
    store *store;
} ckpt_opts;

/* Writes key groups 0 .. max parallelism - 1, each as of its pinned version
 * pins[kg] (with base_id: only what changed since base_pins[kg]), into
 * DIR/chk-ID/ or DIR/savepoint-ID/, and commits: the data file durable first,
 * then _metadata.tmp written, synced and renamed to _metadata, then the
 * directories synced. On any failure (a failed write or fsync included: never
 * retried) the partial checkpoint is removed and the error names the file
 * and offset. Returns 0 (and, if out, what was written), or -E2BIG if the
 * base's chain is already CKPT_MAX_FILES long (take a full checkpoint). */
typedef struct ckpt_written {
    uint64_t data_bytes; /* written into this checkpoint's own data file */
    uint64_t records;    /* records (or changes) in it */
} ckpt_written;
int ckpt_write(stash_arena *a, const uint32_t *pins, const ckpt_opts *o, ckpt_written *out);

typedef struct ckpt_restored {
    uint64_t id;             /* the checkpoint restored */
    uint64_t records;        /* records put into the arena (deltas count each change) */
    unsigned skipped;        /* newer checkpoints passed over as damaged */
    char why[512];           /* the first reason one was passed over, naming file and offset */
    uint32_t op_parallelism; /* its operator state: of this many workers */
    ckpt_blob *op_blobs;     /* their blobs, state ids those of the arena */
    uint8_t *op_mem;         /* what the blobs point into */
} ckpt_restored;

/* Frees the operator state a restore handed out. */
void ckpt_restored_free(ckpt_restored *r);

/* Restores the key groups of range from checkpoint id in dir (0: the newest
 * complete one, falling back to older ones past any that fail a check, and
 * saying so in *out). Every block of every file the checkpoint needs is
 * checked before any record is written into the arena, whose key groups no
 * worker may write meanwhile. Never modifies the directory. */
int ckpt_restore(stash_arena *a, const char *dir, uint64_t id, stash_kg_range range, ioe_engine *e,
                 ckpt_restored *out);

/* As ckpt_restore(), calling prepare(ctx) once the checkpoint to restore
 * has passed every check and before its first record goes in (a rollback
 * clears its key groups there, so a checkpoint that cannot restore leaves
 * them as they were). A failure of prepare fails the restore. */
typedef int ckpt_prepare_fn(void *ctx);
/* st: the caller's store handle on the arena if it has one (the lmdb store
 * allows one per process), else NULL: the restore opens its own. */
int ckpt_restore_prepared(stash_arena *a, const char *dir, uint64_t id, stash_kg_range range,
                          ioe_engine *e, store *st, ckpt_prepare_fn *prepare, void *ctx,
                          ckpt_restored *out);

/* The id and key groups of the checkpoint or savepoint directory at path,
 * from its metadata (checked). Returns 0 or an error naming the file. */
int ckpt_path_info(const char *path, ioe_engine *e, uint64_t *id, uint32_t *max_parallelism);

/* The newest checkpoint of dir whose metadata reads whole: its id and key
 * groups. Returns 0, -ENOENT if dir holds no checkpoint (directories without
 * _metadata are none), or STASH_ECORRUPT naming each checkpoint whose
 * metadata could not be used and why when none could. */
int ckpt_newest(const char *dir, ioe_engine *e, uint64_t *id, uint32_t *max_parallelism);

/* Restores the key groups of range from the checkpoint or savepoint
 * directory at path, as ckpt_restore() does for one checkpoint (store: as
 * for ckpt_restore_prepared()). */
int ckpt_restore_path(stash_arena *a, const char *path, stash_kg_range range, ioe_engine *e,
                      store *st, ckpt_restored *out);

/* A state as a checkpoint's metadata describes it. */
typedef struct ckpt_state {
    uint16_t id;
    uint16_t kind;
    uint8_t options[32];
    char name[SHM_STATE_NAME];
} ckpt_state;

/* One data file of a checkpoint, as its metadata names it. */
typedef struct ckpt_file {
    char name[64];          /* "kg-data.dat" in the checkpoint, or "shared/NAME" beside it */
    uint32_t flags;         /* CKPT_FILE_DELTA, CKPT_FILE_CRC */
    uint32_t crc;           /* with CKPT_FILE_CRC: of its key groups' blocks, in order */
    const uint8_t *extents; /* per key group: offset and size of its block (in the metadata) */
    char path[4096];
    uint8_t *data; /* the file's bytes */
    size_t len;
} ckpt_file;

/* An opened checkpoint: its metadata checked, its data files read. */
typedef struct ckpt_view {
    uint64_t id;
    uint64_t created_ns;
    uint64_t base_id;
    uint32_t max_parallelism;
    uint32_t nstates;
    uint32_t nfiles;
    char meta_path[4096];
    uint8_t *md;
    size_t md_len;
    ckpt_file *files; /* in the order they apply: the full file, then deltas */
    uint32_t op_parallelism;
    ckpt_blob *op_blobs; /* point into md */
} ckpt_view;

/* Opens the checkpoint or savepoint directory at path (a savepoint wherever
 * it was moved: nothing in it names another place): reads and checks
 * _metadata, then reads every data file. Returns 0, or an error naming the
 * file and offset. */
int ckpt_view_open_path(const char *path, ioe_engine *e, ckpt_view *v);
/* Opens checkpoint id of dir, checking that it is the one its metadata names. */
int ckpt_view_open(const char *dir, uint64_t id, ioe_engine *e, ckpt_view *v);
void ckpt_view_close(ckpt_view *v);
/* The checkpoint's i-th state (i < nstates). */
ckpt_state ckpt_view_state(const ckpt_view *v, uint32_t i);
/* Checks every block of the range in every file, in order, and passes each
 * record to fn; with fn NULL, checks each record too: its state named by the
 * metadata, its value well formed for the state's kind. Returns the records,
 * or the first error with file and offset. */
int64_t ckpt_view_walk(const ckpt_view *v, stash_kg_range range, snap_record_fn *fn, void *ctx);
/* As ckpt_view_walk() with fn, giving each entry once as of the checkpoint:
 * an incremental checkpoint's newest record of it, none for an entry its
 * chain deleted (what dump and diff show). */
int64_t ckpt_view_walk_latest(const ckpt_view *v, stash_kg_range range, snap_record_fn *fn,
                              void *ctx);
/* The largest checkpoint id: ids stay exact as JSON numbers, and a stray
 * directory with a larger one is not a checkpoint. */
#define CKPT_MAX_ID (1ull << 53)

/* The ids of dir's checkpoints (complete or not), newest first, in *ids
 * (free it). Returns how many or an error. */
int ckpt_list(const char *dir, uint64_t **ids);
/* Whether DIR/chk-ID has its _metadata (is complete, or damaged). */
bool ckpt_has_metadata(const char *dir, uint64_t id);

/* The highest id any entry of dir names (chk-ID or savepoint-ID, complete,
 * partial or damaged: an id is never used twice), 0 if none or no dir.
 * Returns 0 or an error naming dir. */
int ckpt_highest_id(const char *dir, uint64_t *id);

/* Makes sure dir is a directory (created if missing, 0700 or with group
 * 0750; its parent must exist), this user's own and not writable by others,
 * that this process can create files in. Returns 0 or an error naming dir
 * and why. */
int ckpt_dir_check(const char *dir, bool group);

/* Deletes all but the newest keep complete checkpoints of dir, partial ones
 * older than the newest complete one, and the shared files no remaining
 * checkpoint references. If any checkpoint's metadata cannot be read it
 * deletes nothing (what that one refers to is unknown) and returns the
 * error, naming the file. */
int ckpt_retain(const char *dir, unsigned keep, ioe_engine *e);

#endif /* STASH_CKPT_H */
