/* SPDX-License-Identifier: MIT */
/*
 * layout.h: the arena's shared layout: the header, span descriptors, key
 * groups' heaps, worker slots, keyed tables, records, catalog and control
 * block as every process maps them, and the offsets that reach them.
 *
 * The arena is one file mapped by every process at a different address, so
 * nothing in it holds a pointer: every reference is an shm_off, a byte offset
 * from the arena base, and 0 is the null offset (the header lives there).
 * docs/architecture.md draws the layout and states the locking and crash rules.
 */
#ifndef STASH_SHM_LAYOUT_H
#define STASH_SHM_LAYOUT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "include/stash.h"

#if defined(__SSE2__) && !defined(__SANITIZE_THREAD__)
#include <emmintrin.h>
#define SHM_GROUP_SIMD 1
#endif

typedef uint64_t shm_off;

#define SHM_MAGIC "STASHARN"
#define SHM_LAYOUT_VERSION 13u
#define SHM_INIT_MARK 0x54494e49u /* "INIT": written last by the creator */
#define SHM_HEADER_SIZE 4096u
#define SHM_SPAN_SHIFT 12u
#define SHM_SPAN_SIZE (1u << SHM_SPAN_SHIFT) /* the page pool's unit: 4 KiB */
#define SHM_NCLASSES 44u                     /* small size classes, 16 B .. 32 KiB */
#define SHM_CLASS_LARGE 63u                  /* one record over a run of whole spans */
#define SHM_SMALL_MAX 32768u
#define SHM_POOL_LISTS 65u /* free runs of 1 .. 63 spans, then every longer run */
#define SHM_DEFAULT_SIZE (64ull << 20)
#define SHM_MIN_SIZE (1ull << 20)

/* ------------------------------------------------------------------------ */
/* Robust process-shared locks, for the slow paths only.                     */

typedef struct shm_lock {
    pthread_mutex_t mutex;
} shm_lock;

/* ------------------------------------------------------------------------ */
/* Shared structures.                                                         */

/* One span's descriptor. The first span of a run (its head) says what the run
 * is; its word is stored in one atomic write, which is what makes the pool's
 * crash repair possible (pool.c). The other spans of an owned run are
 * INTERIOR, with the distance back to their head in the length field. */
enum { SHM_SPAN_UNUSED = 0, SHM_SPAN_FREE = 1, SHM_SPAN_OWNED = 2, SHM_SPAN_INTERIOR = 3 };
typedef struct shm_span {
    _Atomic uint64_t word; /* state:2 | class:6 | kg:16 | run length:40 */
    _Atomic uint32_t next; /* pool free list link: span index + 1, 0 ends */
    uint32_t reserved;
} shm_span;

static inline uint64_t shm_span_pack(unsigned state, unsigned cls, uint32_t kg, uint64_t len)
{
    return (uint64_t)state | (uint64_t)cls << 2 | (uint64_t)kg << 8 | len << 24;
}
static inline unsigned shm_span_state(uint64_t w)
{
    return w & 3u;
}
static inline unsigned shm_span_class(uint64_t w)
{
    return (w >> 2) & 63u;
}
static inline uint32_t shm_span_kg(uint64_t w)
{
    return (w >> 8) & 0xffffu;
}
static inline uint64_t shm_span_len(uint64_t w)
{
    return w >> 24;
}

/* A key group's heap: written only by the key group's owner (one writer), so
 * its fast path takes no lock; other processes read the counters. */
typedef struct shm_class_heap {
    _Atomic shm_off free_head; /* free blocks, linked through their first 8 bytes */
    /* The span being carved (index + 1, 0 none) in the high half and the bytes
     * already carved from it in the low half: one word, so that a crash can
     * never pair a new span with an old count. */
    _Atomic uint64_t carve;
} shm_class_heap;

typedef struct shm_kg_heap {
    _Atomic uint64_t used_bytes;
    _Atomic uint64_t free_bytes;
    _Atomic int32_t owner_pid; /* last worker that wrote here, 0 after a clean leave */
    uint32_t pad;
    _Atomic uint64_t owner_start; /* its process start time, to tell a reused pid */
    shm_class_heap cls[SHM_NCLASSES];
} shm_kg_heap;

enum { SHM_SLOT_FREE = 0, SHM_SLOT_LIVE = 1, SHM_SLOT_DEAD = 2 };
typedef struct shm_slot {
    _Atomic uint32_t state; /* SHM_SLOT_*; LIVE is written last on join */
    uint32_t index;
    uint32_t parallelism;
    int32_t pid;
    uint64_t start_time; /* of pid, from /proc: a reused pid is another process */
    uint32_t kg_first;
    uint32_t kg_last;
    uint64_t joined_ns;
    _Atomic uint64_t heartbeat_ns;
    uint32_t generation;
    int32_t previous_pid;
    _Atomic uint64_t
        reader_epoch; /* reclamation epoch while reading another's key groups, 0 idle */
} shm_slot;

/* A process that reads key groups it owns none of (a checkpoint writer, a
 * query): its identity and its reclamation epoch, as a worker slot has. */
#define SHM_READERS 8u
typedef struct shm_reader {
    _Atomic int32_t pid; /* 0: free */
    uint32_t pad;
    uint64_t start_time;
    _Atomic uint64_t reader_epoch;
} shm_reader;

#define SHM_LMDB_DIR 256u
#define SHM_CHANGE_STATE 0u /* the lmdb change log's records: no state has id 0 */

typedef struct shm_header {
    char magic[8];
    uint32_t layout_version;
    uint32_t header_size;
    uint64_t arena_size;
    uint32_t page_size;
    uint32_t span_size;
    uint32_t max_parallelism;
    int32_t creator_pid;
    uint64_t created_ns;
    uint32_t flags;
    uint32_t huge_pages;
    /* where each part lives (offsets from the base) */
    shm_off registry_off;
    shm_off heaps_off;
    shm_off spans_desc_off;
    shm_off data_off;
    uint64_t nspans;
    /* the page pool: runs of spans; see pool.c */
    shm_lock pool_lock;
    _Atomic uint64_t pool_bump; /* spans below it have descriptors */
    _Atomic uint64_t pool_free_spans;
    _Atomic uint32_t pool_free[SHM_POOL_LISTS]; /* heads: span index + 1 */
    /* the worker registry; see registry.c */
    shm_lock registry_lock;
    /* keyed tables (table.c, index.c), their reclamation epoch (ebr.c), the state catalog
     * (catalog.c) */
    shm_off tables_off;
    shm_off catalog_off;
    _Atomic uint64_t ebr_epoch;
    _Atomic uint32_t registry_hwm; /* slots at or above it have never been used */
    shm_reader readers[SHM_READERS];
    shm_lock catalog_lock;
    shm_off control_off;          /* the control block (control.c) */
    _Atomic uint32_t initialized; /* SHM_INIT_MARK once creation finished */
    uint32_t backend;             /* stash_backend: where keyed state lives */
    char lmdb_dir[SHM_LMDB_DIR];  /* lmdb: the environments' directory */
    /* lmdb, incremental checkpoints: owners log each key they change in the
     * key group's table (state SHM_CHANGE_STATE, value the newest
     * checkpoint id then); the engine's deltas read the log as cut. */
    _Atomic uint32_t change_track;       /* the engine wants the log */
    _Atomic uint32_t change_untracked;   /* bumped by changes the log missed (no room) */
    _Atomic uint64_t change_prune_below; /* entries older than the next delta's base may go */
} shm_header;

_Static_assert(sizeof(shm_header) <= SHM_HEADER_SIZE, "header fits its page");
_Static_assert(sizeof(shm_slot) == 64, "a slot is a cache line");

/* A reference to a 16-byte aligned object: its offset / 16, 0 none. Records
 * and the tables' index use it to halve their links (arenas up to 64 GiB). */
typedef uint32_t shm_ref;
#define SHM_MAX_ARENA_SIZE (64ull << 30)

enum { SHM_LAZY_PENDING = 1u, SHM_LAZY_FAILED = 2u, SHM_LAZY_CLAIMED = 1u << 31 };

/* A keyed record: one version of the entry of (state, key, namespace) in a
 * key group's table. The owner writes it; readers in any process read it.
 * Its lookup hash lives in the table's index, not here. A record made while
 * a version of its table is pinned may come to keep an older version for
 * that pin: it is LINKED, and the last 4 bytes of its block hold that link
 * (shm_rec_older), beyond what its value may grow to. Other records spend
 * no byte on one. */
enum { SHM_REC_TOMBSTONE = 1u, SHM_REC_LINKED = 2u };
typedef struct shm_rec {
    _Atomic uint32_t seq; /* odd while the owner rewrites the value in place */
    uint32_t version;     /* the table epoch in which this version was written */
    _Atomic uint32_t vlen;
    uint16_t state; /* catalog id of the state */
    uint16_t klen;
    uint16_t nslen;
    uint8_t flags;      /* SHM_REC_*, fixed once published but for TOMBSTONE at creation */
    uint8_t size_class; /* of its block, SHM_CLASS_LARGE for a run of spans */
    /* then klen key bytes, nslen namespace bytes, the value */
} shm_rec;
_Static_assert(sizeof(shm_rec) == 20, "a record header is 20 bytes");

/* The index of a key group's table is an array of groups, each one cache
 * line: ten slots, each a 16-bit tag (the high half of an entry's lookup
 * hash; or EMPTY, or DELETED: a slot that held an entry, which probes go
 * past) and the reference of the entry's newest version. Tags are at least
 * 2. The tags come first, so that two 16-byte loads compare them all. The
 * last word marks the slots whose entry keeps an older version or is a
 * tombstone: the only ones the prune sweep reads the record of. */
#define SHM_GROUP_SLOTS 10u
enum { SHM_SLOT_EMPTY = 0u, SHM_SLOT_DELETED = 1u };
typedef struct shm_group {
    _Atomic uint16_t tag[SHM_GROUP_SLOTS];
    _Atomic shm_ref ref[SHM_GROUP_SLOTS];
    _Atomic uint32_t kept; /* bit i: slot i has versions to prune (the owner's) */
} shm_group;
_Static_assert(sizeof(shm_group) == 64, "a group is a cache line");

#define SHM_MAX_PINS 4u
#define SHM_UNDO_REGIONS 4u
#define SHM_UNDO_BYTES 512u

/* A part of a record's value that an in-place change overwrites. */
typedef struct shm_region {
    uint32_t off;
    uint32_t len;
} shm_region;

/* What the owner is in the middle of, so that whoever takes the key group
 * over after a crash can finish or undo it (shm_table_recover): the old
 * bytes of the regions a change overwrites, or, for a change that replaces
 * the whole value (redo), the new value. */
#define SHM_UNDO_SAVE 0xffffffffu /* nregions of a save: the old bytes go to the pre-image log */
/* nregions of a save and an overwrite in one bracket: the old record goes
 * to the pre-image log first, and recovery takes its value back from there */
#define SHM_UNDO_SAVE_PUT 0xfffffffeu
typedef struct shm_undo {
    _Atomic shm_ref rec; /* the record being changed in place, 0 none */
    uint32_t vlen;       /* its value length before, or with redo after; a save's old version */
    uint32_t nregions;   /* 0 with redo, SHM_UNDO_SAVE with a save, SHM_UNDO_SAVE_PUT both */
    shm_region regions[SHM_UNDO_REGIONS];
    uint8_t bytes[SHM_UNDO_BYTES]; /* the regions' old bytes one after another, or the new value */
} shm_undo;

/* A key group's table: an open-addressing index of records, grown by moving
 * a few groups into a larger index per write; written by the key group's
 * owner only. Tables start on a cache line, and the fields a lookup and an
 * in-place write read come first, in that one line. */
typedef struct shm_table {
    _Alignas(64) _Atomic uint32_t epoch; /* the version the owner writes now */
    _Atomic uint32_t shape_seq;          /* odd while entries move between the index arrays */
    _Atomic shm_off index;               /* shm_group[1 << log2] */
    _Atomic shm_off old_index;           /* while growing: the array being emptied into index */
    _Atomic uint32_t log2;               /* groups of index */
    _Atomic uint32_t old_log2;           /* groups of old_index */
    _Atomic uint32_t migrate_pos;        /* groups of old_index below it have moved */
    _Atomic uint32_t used;               /* slots of index not EMPTY */
    uint32_t grow_at;                    /* used beyond which the index grows */
    _Atomic uint32_t walkers;  /* reader slots walking the table, a bit each: moves wait */
    _Atomic uint32_t pins_gen; /* bumped by every unpin */
    uint32_t swept_gen;        /* pins_gen the last prune sweep started from */
    uint32_t sweep_pos;        /* next slot of the prune sweep, or UINT32_MAX: none */
    /* Records of this version or newer no pin sees (the newest pin + 1, 0
     * with none; the owner's, behind an unpin until it tends the table). */
    _Atomic uint32_t mutable_from;
    _Atomic uint64_t count; /* live (non-tombstone) entries */
    uint32_t heads;         /* slots of both arrays holding an entry (tombstones too) */
    uint32_t old_left;      /* of those, the ones in old_index */
    _Atomic uint32_t pins[SHM_MAX_PINS]; /* versions pinned by readers, 0 free */
    uint32_t sweep_resizes;   /* resizes when the sweep started: it starts over after one */
    uint32_t cleanup_pos;     /* next slot of the TTL cleanup */
    _Atomic uint32_t resizes; /* bumped whenever index or old_index changes */
    _Atomic shm_off retired;  /* the ring of memory waiting for readers (table.c) */
    /* Who holds each pin, a byte per pin: 0 the owner itself (its pins die
     * with it), else 1 + the reader slot of the process that will release it. */
    _Atomic uint32_t pin_holders;
    _Atomic uint32_t cut; /* the version cut for the checkpoint being taken (control.c), 0 none */
    /* A lazy restore (control block's lazy_*): 0 the key group is here;
     * SHM_LAZY_PENDING still in the checkpoint; SHM_LAZY_FAILED its blocks
     * did not restore; else SHM_LAZY_CLAIMED | the thread restoring it. */
    _Atomic uint32_t lazy;
    /* The epoch when a lazy restore finished bringing it: a pin below it was
     * taken before (its checkpoint copies the block from the restore's). */
    _Atomic uint32_t lazy_done_at;
    _Atomic shm_off growing;       /* the index a growth is switching to */
    _Atomic uint32_t growing_log2; /* its groups */
    uint32_t moves_held;           /* moves put off for walkers */
    _Atomic uint32_t moving;       /* set while the owner moves groups (recovery finishes them) */
    _Atomic uint64_t writes;       /* every publish and delete: invalidates iterators */
    _Atomic uint32_t pin_walk;     /* bit i: pin i is a walk's, which the pre-image log serves */
    _Atomic uint32_t pin_base;     /* bit i: pin i is a delta's base, which sees no version */
    /* At least the slots marked for the prune sweep (shm_group_keep) while
     * no sweep runs: an unpin starts one only if some are. */
    uint32_t marked;
    _Atomic shm_off prelog;      /* the pre-image log's newest chunk, 0 none */
    _Atomic uint64_t prelog_end; /* the log's bytes so far, published after each entry */
    shm_undo undo;
} shm_table;

/* The pre-image log of a key group (table.c): while only walks pin it, a
 * record a pin sees is saved here before it is changed in place, instead of
 * being copied on write. Chunks link newest first; an entry is a header and
 * the record as it was (header, key, namespace, value), 8-byte aligned. */
typedef struct shm_prelog_chunk {
    shm_off older;         /* the chunk before, 0 none */
    uint64_t start;        /* the log position of bytes[0] */
    _Atomic uint32_t used; /* bytes of whole entries, published after each */
    uint32_t cap;
    uint8_t bytes[];
} shm_prelog_chunk;
typedef struct shm_prelog_entry {
    shm_ref ref;    /* the record's block */
    uint32_t until; /* the version that replaced it: it is the entry's as of versions below */
    uint32_t bytes; /* the record's bytes that follow */
    uint32_t pad;
} shm_prelog_entry;
_Static_assert(offsetof(shm_table, mutable_from) < 64,
               "a lookup and a write read one line of the table");

/* A state's entry in the arena's catalog. */
#define SHM_CATALOG_SIZE 256u
#define SHM_STATE_NAME 64u
typedef struct shm_catalog_entry {
    _Atomic uint32_t used;
    uint32_t kind;
    uint8_t options[32]; /* compared byte for byte when another process registers */
    char name[SHM_STATE_NAME];
} shm_catalog_entry;

/* The control block (control.c): where the persistence engine, the workers
 * and control commands meet, with futex wake-ups instead of sockets. */
#define SHM_CTL_HISTORY 8u
#define SHM_CTL_DETAIL 256u
#define SHM_OP_CONTROL_KG 0xffffu /* span owner of operator-state blobs: no key group */

/* One finished checkpoint, as `stash status` shows it. */
typedef struct shm_ctl_result {
    uint64_t id;
    int32_t status; /* 0, or the negative error that failed it */
    uint16_t incremental;
    uint16_t savepoint;
    uint64_t covers; /* the requests (shm_control.requests) it answers */
    uint64_t started_ns;
    uint64_t duration_ns;
    uint64_t bytes;
    uint64_t pause_ns;           /* the longest synchronous part of a worker's cut */
    char detail[SHM_CTL_DETAIL]; /* the checkpoint's path, or why it failed */
} shm_ctl_result;

/* Operator state of a set of workers: one blob per worker index, each a run
 * of spans owned by SHM_OP_CONTROL_KG (0 off: the worker has none). */
typedef struct shm_op_blob {
    _Atomic shm_off off;
    _Atomic uint64_t len;
    _Atomic uint32_t parallelism; /* of the worker that recorded it */
    uint32_t pad;
} shm_op_blob;

/* A worker index's state operations, counted by the worker alone on a cache
 * line of its own (no line another process writes), read by metrics: per
 * kind (SHM_OPS_VALUE ...), reads and writes. Never reset: a counter of the
 * index since the arena was created. */
enum { SHM_OPS_VALUE, SHM_OPS_LIST, SHM_OPS_MAP, SHM_OPS_MERGING, SHM_OPS_KINDS };
typedef struct shm_ctl_ops {
    _Alignas(64) _Atomic uint64_t reads[SHM_OPS_KINDS];
    _Atomic uint64_t writes[SHM_OPS_KINDS];
} shm_ctl_ops;
_Static_assert(sizeof(shm_ctl_ops) == 64, "a worker's counters fill one cache line");

typedef struct shm_ctl_worker {
    shm_ctl_ops ops;
    _Atomic uint64_t acked;         /* the newest checkpoint this index cut */
    _Atomic uint64_t pause_ns;      /* how long that cut took */
    shm_op_blob pending;            /* its newest operator state: at its last cut or its close */
    shm_op_blob committed;          /* as of the newest completed checkpoint or restore */
    _Atomic uint32_t restoring;     /* reading checkpoints (a rollback): retention waits */
    _Atomic int32_t cut_error;      /* why its last cut failed (arena full, no pin free), or 0 */
    _Atomic uint64_t cut_clock_ms;  /* its TTL clock at its last cut */
    _Atomic uint64_t rollbacks;     /* rollbacks the index's workers made */
    _Atomic uint64_t fallback_seen; /* the arena's fallback (fallback_gen) the index went through */
    /* The job checkpoint the index's key groups were last restored from
     * (a takeover, a new arena of a job's host; 0 none): a rollback before
     * a checkpoint of this arena holds them reads the copies that restore
     * left (DIR/parts). */
    _Atomic uint64_t job_restored;
} shm_ctl_worker;

/* What `stash stop` asks of the engine: exit now, or once the savepoint
 * asked for next is complete (a job's: every host's engine exits). */
enum { SHM_STOP_NOW = 1, SHM_STOP_AFTER_SAVEPOINT = 2 };

typedef struct shm_control {
    shm_lock lock;                   /* results, operator-state sets */
    _Atomic int32_t service_pid;     /* the live engine's process, 0 none */
    _Atomic uint32_t service_reader; /* its reader slot (the holder of its pins) */
    _Atomic uint64_t service_start;
    uint64_t service_since_ns;
    char dir[SHM_CTL_DETAIL];          /* where its checkpoints go (workers roll back from it) */
    _Atomic uint32_t wake;             /* futex: the engine sleeps on it */
    _Atomic uint32_t finished;         /* futex: bumped when a checkpoint ends */
    _Atomic uint32_t stop;             /* `stash stop`: SHM_STOP_NOW, SHM_STOP_AFTER_SAVEPOINT */
    _Atomic uint32_t committed_p;      /* the parallelism of the committed operator state, 0 none */
    _Atomic uint32_t parallelism;      /* of the workers that joined last */
    _Atomic uint64_t savepoint_ticket; /* the newest request that asks for a savepoint */
    _Atomic uint64_t requests;         /* checkpoint requests so far */
    _Atomic uint64_t last_id;          /* the newest id an engine handed out: ids never repeat */
    _Atomic uint64_t pending;     /* the checkpoint workers cut at their next barrier, 0 none */
    _Atomic uint64_t completed;   /* the newest committed checkpoint */
    _Atomic uint64_t aborted;     /* the newest failed one */
    _Atomic uint32_t history_n;   /* results recorded so far */
    _Atomic uint32_t failing;     /* checkpoints failed in a row */
    _Atomic uint64_t next_due_ns; /* when the next checkpoint of the interval is due, 0 none */
    /* Totals since the arena was created, for metrics. */
    _Atomic uint64_t completed_total;  /* checkpoints and savepoints committed */
    _Atomic uint64_t failed_total;     /* and failed */
    _Atomic uint64_t restored_id;      /* the checkpoint the arena was restored from, 0 none */
    _Atomic uint64_t restored_ns;      /* how long that restore took */
    _Atomic uint64_t restored_at_ns;   /* when it ended, ns since the epoch */
    _Atomic uint64_t restored_records; /* records it restored */
    _Atomic uint32_t io_backend;       /* the engine's I/O backend (IOE_URING, IOE_THREADS) */
    _Atomic uint32_t lazy_left;        /* a lazy restore: key groups not restored yet, 0 none */
    char lazy_path[SHM_CTL_DETAIL];    /* the checkpoint they come from */
    _Atomic uint64_t lazy_started_ns;  /* when the lazy restore began, ns since the epoch */
    _Atomic uint32_t lazy_failed;      /* a key group's blocks failed their checks: fall back */
    _Atomic uint64_t fallback_gen;     /* the arena's fallbacks to an older checkpoint so far */
    _Atomic uint64_t fallback_id;      /* the checkpoint the newest one went back to */
    char fallback_why[SHM_CTL_DETAIL]; /* and why */
    _Atomic uint64_t io_written;       /* bytes the engine wrote */
    _Atomic uint64_t io_read;          /* and read */
    _Atomic uint64_t io_errors;        /* requests that failed */
    /* A host of a job that spans hosts: the sub-job its parts go to
     * (JOB/part/HOST/EPOCH: the service that last served the arena), and
     * whether that service was fenced off the job (workers get
     * STASH_EFENCED), and why. */
    char job_part[SHM_CTL_DETAIL];
    _Atomic uint32_t fenced;
    char fenced_why[SHM_CTL_DETAIL];
    shm_ctl_result history[SHM_CTL_HISTORY];
    shm_ctl_worker workers[STASH_MAX_WORKERS];
} shm_control;

/* The sizes docs/architecture.md's table of the arena's layout gives. */
_Static_assert(sizeof(shm_kg_heap) == 736 && sizeof(shm_table) == 768 &&
                   sizeof(shm_catalog_entry) == 104 && sizeof(shm_control) == 200704,
               "the arena's layout as docs/architecture.md gives it");

/* A process's handle on a mapped arena. */
struct stash_arena {
    char *base;
    uint64_t size;
    shm_header *hdr;
    shm_slot *slots;
    shm_kg_heap *heaps;
    shm_span *spans;
    shm_table *tables;
    shm_catalog_entry *catalog;
    struct shm_control *control;
    char *data;
    char path[256];
    uid_t owner;    /* the file's */
    int unnamed_fd; /* a file made without a name, until shm_arena_publish; -1 */
    int lmdb_lock;  /* a new lmdb arena's directory, locked until it is named; -1 */
};

static inline void *shm_ptr(const stash_arena *a, shm_off off)
{
    return off ? a->base + off : NULL;
}
static inline shm_off shm_off_of(const stash_arena *a, const void *p)
{
    return p ? (shm_off)((const char *)p - a->base) : 0;
}
/* Whether off can be a small block: in the data region, on a 16-byte unit.
 * Attach checks free-list heads with it, and the recount of a taken-over
 * key group's heap each link before it follows it. The allocator's own pop
 * does not: the check there cost 8% of YCSB A uniform; a link in the data
 * is within reach of any process that may write the arena (the trust model
 * of docs/operations.md). */
static inline bool shm_block_in_data(const stash_arena *a, shm_off off)
{
    return off >= (shm_off)(a->data - a->base) && off <= a->size - 16 && (off & 15) == 0;
}
/* A typed view of the object at an offset: SHM_AT(a, struct x, off). */
#define SHM_AT(a, type, off) ((type *)shm_ptr((a), (off)))

static inline shm_ref shm_ref_of(shm_off off)
{
    return (shm_ref)(off >> 4);
}
static inline shm_off shm_ref_off(shm_ref r)
{
    return (shm_off)r << 4;
}
static inline shm_rec *shm_rec_at(const stash_arena *a, shm_ref r)
{
    return r ? (shm_rec *)(a->base + shm_ref_off(r)) : NULL;
}

static inline uint64_t shm_span_index(const stash_arena *a, shm_off off)
{
    return (off - a->hdr->data_off) >> SHM_SPAN_SHIFT;
}
/* The index of the head of the run that holds offset off. */
static inline uint64_t shm_run_head(const stash_arena *a, shm_off off)
{
    uint64_t i = shm_span_index(a, off);
    uint64_t w = atomic_load_explicit(&a->spans[i].word, memory_order_relaxed);
    return shm_span_state(w) == SHM_SPAN_INTERIOR ? i - shm_span_len(w) : i;
}
static inline shm_off shm_span_off(const stash_arena *a, uint64_t index)
{
    return a->hdr->data_off + (index << SHM_SPAN_SHIFT);
}

#endif /* STASH_SHM_LAYOUT_H */
