/* SPDX-License-Identifier: MIT */
/*
 * snapshot.h: the canonical snapshot format's key-group blocks (format.md):
 * writing a key group as of a pinned version, checking and reading a block
 * back, and restoring it into an arena. Checkpoint storages and the engine
 * build on these.
 */
#ifndef STASH_SNAPSHOT_H
#define STASH_SNAPSHOT_H

#include "backends/state/state.h"
#include "backends/store/store.h"

#define SNAP_BLOCK_MAGIC "SKGB"
#define SNAP_FORMAT_VERSION 1u
#define SNAP_LZ4 1u                        /* block flags: the payload is one LZ4 block */
#define SNAP_DELTA 2u                      /* block flags: the changes since a base version */
#define SNAP_REC_DELETED STORE_REC_DELETED /* record flags (deltas only): the entry is gone */

/* Snapshots and checkpoints store integers as this processor does, which
 * docs/format.md says is little-endian: a build for another byte order stops here. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "checkpoints are little-endian, as the processors stash builds for");

/* A block's header, little-endian on disk; docs/format.md has the layout. */
typedef struct snap_block_hdr {
    char magic[4];
    uint16_t format_version;
    uint16_t flags;
    uint32_t kg;
    uint32_t reserved;
    uint64_t records;
    uint32_t raw_len;     /* payload bytes before compression */
    uint32_t stored_len;  /* payload bytes as stored after the header */
    uint32_t payload_crc; /* CRC32C of the stored payload */
    uint32_t header_crc;  /* CRC32C of the header up to this field */
} snap_block_hdr;
_Static_assert(sizeof(snap_block_hdr) == 40, "the block header is 40 bytes");

/* One record in a payload: this header, then the key, namespace and value. */
typedef struct snap_rec_hdr {
    uint16_t state; /* the state's id in the snapshot's catalog */
    uint16_t klen;
    uint16_t nslen;
    uint16_t flags;
    uint32_t vlen;
} snap_rec_hdr;
_Static_assert(sizeof(snap_rec_hdr) == 12, "the record header is 12 bytes");

/* A growable byte buffer. */
typedef struct snap_buf {
    uint8_t *data;
    size_t len;
    size_t cap;
    bool aligned; /* data is 4096-aligned and cap a multiple of 4096 (direct I/O) */
} snap_buf;

void snap_buf_free(snap_buf *b);
/* Appends n bytes; returns 0 or -ENOMEM. */
int snap_buf_put(snap_buf *b, const void *p, size_t n);

/* CRC32C of len bytes, continuing from crc (0 to start). */
uint32_t snap_crc32c(uint32_t crc, const void *data, size_t len);
/* The same through the table alone, as on a processor without CRC32C
 * instructions. */
uint32_t snap_crc32c_portable(uint32_t crc, const void *data, size_t len);

/* What a full snapshot keeps of a record (Flink's cleanupFullSnapshot):
 * returns 1 to keep it, with *value and *vlen rewritten (into scratch, the
 * caller's) if part of it goes, 0 to leave it out, or an error. */
typedef int snap_filter_fn(void *ctx, uint16_t state, const uint8_t **value, uint32_t *vlen,
                           snap_buf *scratch);
typedef struct snap_filter {
    snap_filter_fn *fn;
    void *ctx;
} snap_filter;

/* What full snapshots leave out of the states that ask for it (a
 * snap_filter's context): entries expired at the cut's TTL time. */
typedef struct ttl_cut {
    uint64_t now_ms;
    uint64_t ttl_ms[SHM_CATALOG_SIZE + 1]; /* per state id; 0: keep everything */
    uint8_t kind[SHM_CATALOG_SIZE + 1];
} ttl_cut;
/* Fills cut from the arena's catalog for TTL time now_ms; returns how many
 * states ask for the cleanup (0: no filter needed). */
int ttl_cut_init(stash_arena *a, uint64_t now_ms, ttl_cut *cut);
snap_filter_fn ttl_cut_filter;

/* Appends key group kg of store st as its cut left it to out as one block,
 * compressed with LZ4 if lz4: every live record, each through filter (NULL:
 * all of them), or with a base in cut the changes since it (a delta block,
 * deletions flagged SNAP_REC_DELETED; no filter). Returns the records
 * written or a negative error. */
int64_t snap_write_kg(store *st, uint32_t kg, const store_cut *cut, bool lz4,
                      const snap_filter *filter, snap_buf *out);

/* A block built record by record: begun at *start (the end of out), each
 * record added, then ended: its header filled in for key group kg, with
 * flags (SNAP_DELTA) and the payload compressed with LZ4 if lz4 and it
 * gets smaller. begin and add return 0 or -ENOMEM; end returns records or
 * an error naming kg (a block too big). */
int snap_block_begin(snap_buf *out, size_t *start);
int snap_block_add(snap_buf *out, const store_record *r);
int64_t snap_block_end(snap_buf *out, size_t start, uint32_t kg, uint64_t records, uint16_t flags,
                       bool lz4);

/* A checked block: its header and its payload (decompressed). */
typedef struct snap_block {
    snap_block_hdr hdr;
    const uint8_t *payload; /* raw_len bytes, owned by the scratch buffer given */
    size_t size;            /* bytes of the block in its file */
} snap_block;

/* Checks the block at p (avail bytes; at offset off of file, for messages):
 * magic, version, lengths, both checksums, and decompresses its payload into
 * scratch. Returns 0, STASH_ECORRUPT or STASH_EFORMAT naming file and offset. */
int snap_read_block(const uint8_t *p, size_t avail, const char *file, uint64_t off,
                    snap_buf *scratch, snap_block *out);
/* As snap_read_block, for bytes in memory it already accepted in this
 * process: every check but the payload's checksum, which the bytes passed. */
int snap_reread_block(const uint8_t *p, size_t avail, const char *file, uint64_t off,
                      snap_buf *scratch, snap_block *out);

/* One record of a block's payload, its state id the snapshot's and its
 * key_hash computed once by the walk. */
typedef store_record snap_record;

/* Receives a record; a negative return stops the walk (STASH_ECORRUPT gets
 * the file and offset added to its message). */
typedef int snap_record_fn(void *ctx, uint32_t kg, const snap_record *r);

/* Walks a checked block's records, checking each one's lengths and that its
 * key hashes into the block's key group. Returns the records or an error. */
int64_t snap_block_records(const snap_block *b, uint32_t max_parallelism, snap_record_fn *fn,
                           void *ctx, const char *file, uint64_t off);

/* Maps a snapshot's state ids to this arena's: ids[i] for snapshot id i. */
typedef struct snap_id_map {
    const uint16_t *ids;
    uint32_t n;
} snap_id_map;

/* Where restored records go: a store whose key groups nobody writes
 * meanwhile, and the snapshot's state ids mapped to its own. */
typedef struct snap_restorer {
    store *store;
    const snap_id_map *map;
} snap_restorer;

/* A snap_record_fn: puts the record into the restorer's store, replacing
 * what its key group holds for the same state, key and namespace (or, for a
 * deleted record of a delta, removing it). */
int snap_restore_record(void *restorer, uint32_t kg, const snap_record *r);
/* Ends the records of key group kg (rc: 0, or the error that stopped them,
 * which it returns): the store commits them or lets them go. */
int snap_restore_kg_done(void *restorer, uint32_t kg, int rc);

#endif /* STASH_SNAPSHOT_H */
