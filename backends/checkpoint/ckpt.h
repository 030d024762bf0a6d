/* SPDX-License-Identifier: MIT */
/*
 * ckpt.h: checkpoints in a directory: full and incremental checkpoints of an
 * arena's key groups written through the I/O engine and committed by the
 * protocol of docs/format.md, savepoints, restore (newest complete first,
 * falling back to older ones), and retention of the newest few.
 */
#ifndef STASH_CKPT_H
#define STASH_CKPT_H

#include "backends/checkpoint/ckpt_read.h"

/* The memory storage: checkpoints in shared memory, capped (Flink's
 * MemoryStateBackend keeps 5 MiB by default). */
#define CKPT_MEMORY_DEFAULT_CAP (5ull << 20)

/* Where a checkpoint's data file also goes as it is written: open is
 * called with the file's name as the metadata lists it ("kg-data.dat",
 * "shared/12.dat"), put with its bytes in order, and close once the file
 * is durable (commit) or the checkpoint has failed. Each returns 0 or an
 * error, which fails the checkpoint. */
typedef struct ckpt_copy {
    void *ctx;
    int (*open)(void *ctx, const char *file);
    int (*put)(void *ctx, const void *data, size_t len);
    int (*close)(void *ctx, bool commit);
} ckpt_copy;

typedef struct ckpt_opts {
    const shm_dir *dir; /* the checkpoint directory (ckpt_dir_open) */
    uint64_t id;        /* the checkpoint's id, > 0 */
    bool lz4;           /* compress each key group's block */
    bool savepoint;     /* DIR/savepoint-ID, full and self-contained, never retired */
    bool incremental;   /* data files in DIR/shared/, which later checkpoints reference */
    uint64_t base_id;   /* incremental: write only the changes since this checkpoint */
    const uint32_t
        *base_pins;        /* with base_id: the versions the base was written at, still pinned */
    uint64_t cap_bytes;    /* the memory storage's cap on a checkpoint's bytes; 0: none */
    bool reader;           /* the writer owns none of the key groups: it announces itself */
    uint32_t reader_slot;  /* with reader: its slot for shm_ebr_enter (shm_reader_join) */
    uint32_t reader_slot2; /* with reader: a slot for a second serializing thread; 0 none */
    /* Worker processes busy beside the checkpoint, each taking a core: a
     * second serializing thread runs only on a core they leave free. */
    uint32_t busy_workers;
    ioe_engine *engine;        /* every write and sync goes through it */
    uint32_t op_parallelism;   /* operator state: of this many workers (0: none) */
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
    /* A full checkpoint taken while the arena is restored lazily from the
     * checkpoint at lazy_from (pins taken while it was): a key group not
     * whole at its pin (still to come, or whole only at a later epoch) gets
     * its block from there, as it is, not serialized. NULL: every block
     * serialized. */
    const char *lazy_from;
    const ckpt_copy *copy; /* NULL: the data file goes to the directory alone */
} ckpt_opts;

typedef struct ckpt_written {
    uint64_t data_bytes; /* written into this checkpoint's own data file */
    uint64_t records;    /* records (or changes) in it */
} ckpt_written;

/* Writes key groups 0 .. max parallelism - 1, each as of its pinned version
 * pins[kg] (with base_id: only what changed since base_pins[kg]), into
 * DIR/chk-ID/ or DIR/savepoint-ID/, and commits: the data file durable first,
 * then _metadata.tmp written, synced and renamed to _metadata, then the
 * directories synced. On any failure (a failed write or fsync included: never
 * retried) the partial checkpoint is removed and the error names the file
 * and offset. Returns 0 (and, if out, what was written), or -E2BIG if the
 * base's chain is already CKPT_MAX_FILES long (take a full checkpoint). */
int ckpt_write(stash_arena *a, const uint32_t *pins, const ckpt_opts *o, ckpt_written *out);

/* Where a checkpoint's key groups and states come from: an arena's
 * (ckpt_write) or another's (a snapshot rewritten). */
typedef struct ckpt_source {
    uint32_t max_parallelism;
    uint32_t backend; /* CKPT_BACKEND_*, written in the metadata */
    uint32_t nstates;
    const ckpt_state *states; /* as the metadata lists them */
    /* Appends key group kg's block to out (empty), in serializing thread
     * thread (0, or 1 for the second); returns its records or an error. */
    int64_t (*block)(void *ctx, uint32_t kg, unsigned thread, snap_buf *out);
    void *ctx;
    bool two_threads; /* block may run in two threads at once, for different key groups */
} ckpt_source;

/* As ckpt_write, with the key groups and states of src: of o, its
 * directory, id, kind (savepoint, incremental with base_id: src's blocks
 * are then deltas), cap, engine, operator state, modes and serialized. */
int ckpt_write_source(const ckpt_source *src, const ckpt_opts *o, ckpt_written *out);

/* A savepoint written beside where it goes, then moved into place: the
 * place holds a whole savepoint or nothing. */
typedef struct ckpt_dest {
    char path[4096]; /* where it goes */
    char base[256];  /* its last component */
    shm_dir parent;  /* path's parent, synced once it is renamed into place */
    shm_dir tmp;     /* .BASE.writing-PID-R in parent, this process's while open (as DIR) */
} ckpt_dest;
/* Checks that path is not there and its parent is (a directory this user
 * or root has, sticky if others may write into it), removes what writers
 * of path that died left there, and makes tmp. Returns 0, -EEXIST, -ENOENT
 * or another error naming path. */
int ckpt_dest_open(const char *path, ckpt_dest *d);
/* Renames tmp/savepoint-ID to path (never over anything) and syncs the parent. */
int ckpt_dest_place(ckpt_dest *d, uint64_t id);
/* Removes tmp and what a failure left in it. Accepts a d that failed to open. */
void ckpt_dest_close(ckpt_dest *d);

/* Removes the checkpoint directory name of dir and the files in it (not
 * shared/), never through a link. */
void ckpt_remove_checkpoint(const shm_dir *dir, const char *name);

/* Opens the checkpoint directory at path (made if missing, 0700 or with
 * group 0750; its parent must exist): this user's own, not writable by
 * others, every directory on the way root's or this user's, and one this
 * process can create files in. Returns 0 or an error naming the path and
 * why. */
int ckpt_dir_open(const char *path, bool group, shm_dir *out);

/* Deletes all but the newest keep complete checkpoints of dir, partial ones
 * older than the newest complete one, and the shared files no remaining
 * checkpoint references. If any checkpoint's metadata cannot be read it
 * deletes nothing (what that one refers to is unknown) and returns the
 * error, naming the file. */
int ckpt_retain(const shm_dir *dir, unsigned keep, ioe_engine *e);

/* Removes the partial savepoints of dir whose writer is gone (no _metadata,
 * their lock free). Returns how many, or an error. */
int ckpt_remove_abandoned(const shm_dir *dir);

#endif /* STASH_CKPT_H */
