/* SPDX-License-Identifier: MIT */
/*
 * ckpt_read.h: reading checkpoints in a directory (ckpt_read.c): the
 * metadata's layout (docs/format.md), opening a checkpoint with every check,
 * walking its records, and listing a directory's checkpoints.
 */
#ifndef STASH_CKPT_READ_H
#define STASH_CKPT_READ_H

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

#define CKPT_DATA_FILE "kg-data.dat"
#define CKPT_SHARED_DIR "shared"
#define CKPT_CHUNK (1u << 20)
#define CKPT_MAX_METADATA (64u << 20)

typedef struct md_header {
    char magic[8];
    uint32_t format_version;
    uint32_t flags;
    uint64_t id;
    uint64_t created_ns;
    uint64_t base_id;
    uint32_t backend;
    uint32_t max_parallelism;
    uint32_t nstates;
    uint32_t nfiles;
} md_header;

typedef struct md_file {
    char name[64];
    uint32_t first_kg;
    uint32_t last_kg;
    uint32_t flags;
    uint32_t reserved; /* with CKPT_FILE_CRC: the CRC32C of the file's blocks in order */
} md_file;

typedef struct md_extent {
    uint64_t offset;
    uint64_t size;
} md_extent;

static inline uint64_t ckpt_pad8(uint64_t n)
{
    return (n + 7) & ~7ull;
}

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
    uint8_t *data; /* the file's bytes, from offset base */
    size_t len;
    uint64_t base; /* 0 but for ckpt_view_load_range */
} ckpt_file;

/* The directories an opened checkpoint's files are read from: its own and
 * the shared/ beside it (opened when first needed; -1 until then). */
typedef struct ckpt_dirs {
    int chk;
    int shared;
} ckpt_dirs;

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
    ckpt_dirs *dirs;     /* NULL in a view not opened from a directory */
    /* A view of a checkpoint elsewhere (mirror.c: in a remote storage)
     * reads its data files through fetch: file cf, at most limit bytes,
     * into *data (malloc'd). NULL: from dirs. */
    int (*fetch)(void *ctx, const ckpt_file *cf, size_t limit, uint8_t **data, size_t *len);
    void *fetch_ctx;
} ckpt_view;

/* Opens the checkpoint or savepoint directory at path (a savepoint wherever
 * it was moved: nothing in it names another place): reads and checks
 * _metadata, then reads every data file. Returns 0, or an error naming the
 * file and offset. */
int ckpt_view_open_path(const char *path, ioe_engine *e, ckpt_view *v);
/* Opens checkpoint id of dir, checking that it is the one its metadata names. */
int ckpt_view_open(const shm_dir *dir, uint64_t id, ioe_engine *e, ckpt_view *v);
/* As ckpt_view_open, with its data files read only if with_data. */
int ckpt_open_chk(const shm_dir *dir, uint64_t id, ioe_engine *e, ckpt_view *v, bool with_data);
void ckpt_view_close(ckpt_view *v);
/* The checkpoint's i-th state (i < nstates). */
ckpt_state ckpt_view_state(const ckpt_view *v, uint32_t i);
/* Checks every block of the range in every file, in order, and passes each
 * record to fn; with fn NULL, checks each record too: its state named by the
 * metadata, its value well formed for the state's kind. Returns the records,
 * or the first error with file and offset. */
int64_t ckpt_view_walk(const ckpt_view *v, stash_kg_range range, snap_record_fn *fn, void *ctx);
/* As ckpt_view_walk() with fn, over a view this process has walked whole
 * already: every check but the payloads' checksums, which passed. */
int64_t ckpt_view_walk_checked(const ckpt_view *v, stash_kg_range range, snap_record_fn *fn,
                               void *ctx);
/* As ckpt_view_walk() with fn, giving each entry once as of the checkpoint:
 * an incremental checkpoint's newest record of it, none for an entry its
 * chain deleted (what dump and diff show). */
int64_t ckpt_view_walk_latest(const ckpt_view *v, stash_kg_range range, snap_record_fn *fn,
                              void *ctx);
/* The opened checkpoint behind a stash_snapshot (snapshot_api.c). */
const ckpt_view *ckpt_snapshot_view(const stash_snapshot *snap);

/* The largest checkpoint id: ids stay exact as JSON numbers, and a stray
 * directory with a larger one is not a checkpoint. */
#define CKPT_MAX_ID (1ull << 53)

/* The ids of dir's checkpoints (complete or not), newest first, in *ids
 * (free it). Returns how many or an error. */
int ckpt_list(const shm_dir *dir, uint64_t **ids);
/* Whether DIR/chk-ID has its _metadata (is complete, or damaged). */
bool ckpt_has_metadata(const shm_dir *dir, uint64_t id);

/* The highest id any entry of dir names (chk-ID or savepoint-ID, complete,
 * partial or damaged: an id is never used twice), 0 if none or no dir.
 * Returns 0 or an error naming dir. */
int ckpt_highest_id(const shm_dir *dir, uint64_t *id);

/* Formats a path into out (4096 bytes); -ENAMETOOLONG if it does not fit. */
int ckpt_path_of(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reaps until at most keep requests of e are outstanding; the first failure wins. */
int ckpt_drain(ioe_engine *e, unsigned keep, int rc);
/* Checks and parses metadata already in v (md, md_len; meta_path names it
 * in messages): its files (names and extents, without paths) and operator
 * state. Returns 0 or an error naming meta_path and the offset. */
int ckpt_view_parse(ckpt_view *v);
/* Opens the checkpoint directory at path (walked as shm_dir_open walks
 * it): its metadata checked, and with with_data its data files read. */
int ckpt_open_view(const char *path, ioe_engine *e, ckpt_view *v, bool with_data);
/* As ckpt_open_view, for the checkpoint directory name in dirfd (never a
 * link), path naming it in messages. */
int ckpt_open_view_at(int dirfd, const char *name, const char *path, ioe_engine *e, ckpt_view *v,
                      bool with_data);
/* Opens data file cf of v, opened from a directory, to read (never a
 * link). Returns the descriptor or an error naming the file. */
int ckpt_view_file_open(ckpt_view *v, const ckpt_file *cf);
/* Reads the data files of a view opened without them. */
int ckpt_view_load(ckpt_view *v, ioe_engine *e);
/* Reads of each data file only the bytes holding the blocks of range (its
 * key groups' blocks lie one after another): a walk of range checks each
 * block, but no file's checksum as a whole. */
int ckpt_view_load_range(ckpt_view *v, ioe_engine *e, stash_kg_range range);
/* Appends key group kg's block of the full checkpoint at path to out, its
 * bytes as they are once checked; returns its records' count. Reads with an
 * I/O engine of its own: any thread may call it. */
int64_t ckpt_block_copy(const char *path, uint32_t kg, snap_buf *out);
/* Reads each data file of a view opened without them, checks it against the
 * metadata (its length and blocks' CRC32C) and lets it go: one file in
 * memory at a time. */
int ckpt_view_check_files(ckpt_view *v, ioe_engine *e);
/* The bytes of data file f that its metadata's blocks take: what reading
 * it needs (UINT64_MAX if its extents overflow). */
uint64_t ckpt_file_named_bytes(const ckpt_view *v, const ckpt_file *f);
/* Checks data file f of v, all in memory, against the CRC32C of its blocks
 * the metadata names (a damaged block named by its own checks). */
int ckpt_file_check(const ckpt_view *v, const ckpt_file *f);
/* Checks record r of v: its state one the metadata names, its value well
 * formed for the state's kind. Returns 0 or STASH_ECORRUPT, named. */
int ckpt_record_check(const ckpt_view *v, const snap_record *r);
/* Checks key group kg's blocks (each file's, in order) and passes their
 * records to fn (NULL: checks each record as ckpt_view_walk does);
 * checked: bytes a walk checked already. scratch: the caller's (for LZ4).
 * Returns the records or the first error with file and offset. */
int64_t ckpt_view_walk_kg(const ckpt_view *v, uint32_t kg, bool checked, snap_record_fn *fn,
                          void *ctx, snap_buf *scratch);
/* Hears that the records of key group kg ended (rc: 0, or the error that
 * stopped them); a negative return fails the walk. */
typedef int ckpt_kg_done_fn(void *ctx, uint32_t kg, int rc);
/* Walks the blocks of range, key group by key group (each in every file in
 * order), the upper half of the key groups in a second thread where it
 * pays; checked: a second pass over bytes a first one checked. fn and done
 * (which may be NULL) must be safe to call for different key groups at
 * once. An error of the lower half wins. */
int64_t ckpt_walk_range_split(const ckpt_view *v, stash_kg_range range, bool checked,
                              snap_record_fn *fn, ckpt_kg_done_fn *done, void *ctx);

/* The id and key groups of the checkpoint or savepoint directory at path,
 * from its metadata (checked). Returns 0 or an error naming the file. */
int ckpt_path_info(const char *path, ioe_engine *e, uint64_t *id, uint32_t *max_parallelism);

/* The newest checkpoint of dir whose metadata reads whole: its id and key
 * groups. Returns 0, -ENOENT if dir holds no checkpoint (directories without
 * _metadata are none), or STASH_ECORRUPT naming each checkpoint whose
 * metadata could not be used and why when none could. */
int ckpt_newest(const shm_dir *dir, ioe_engine *e, uint64_t *id, uint32_t *max_parallelism);

#endif /* STASH_CKPT_READ_H */
