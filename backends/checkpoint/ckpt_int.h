/* SPDX-License-Identifier: MIT */
/*
 * ckpt_int.h: what the checkpoint files (ckpt.c, ckpt_read.c,
 * ckpt_restore.c) share: the metadata's layout (docs/format.md) and the
 * helpers each side uses of the other.
 */
#ifndef STASH_CKPT_INT_H
#define STASH_CKPT_INT_H

#include "backends/checkpoint/ckpt.h"

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

/* Formats a path into out (4096 bytes); -ENAMETOOLONG if it does not fit. */
int ckpt_path_of(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reaps until at most keep requests are outstanding; the first failure wins. */
int ckpt_drain(ioe_engine *e, unsigned keep, int rc);
/* fsyncs a directory. */
int ckpt_sync_dir(const char *path);
/* Opens the checkpoint directory at path: its metadata checked, and with
 * with_data its data files read. */
int ckpt_open_view(const char *path, ioe_engine *e, ckpt_view *v, bool with_data);
/* Reads the data files of a view opened without them. */
int ckpt_view_load(ckpt_view *v, ioe_engine *e);
/* Reads each data file of a view opened without them, checks it against the
 * metadata (its length and blocks' CRC32C) and lets it go: one file in
 * memory at a time. */
int ckpt_view_check_files(ckpt_view *v, ioe_engine *e);
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

#endif /* STASH_CKPT_INT_H */
