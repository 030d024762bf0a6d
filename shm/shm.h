/* SPDX-License-Identifier: MIT */
/*
 * shm.h: the arena's internal interface, for shm/ and the backends above it.
 *
 * The arena is one file mapped by every process at a different address, so
 * nothing in it holds a pointer: every reference is an shm_off, a byte offset
 * from the arena base, and 0 is the null offset (the header lives there).
 * docs/architecture.md draws the layout and states the locking and crash rules.
 * The keyed tables' interface, with its hot-path inlines, is shm/table.h.
 */
#ifndef STASH_SHM_H
#define STASH_SHM_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>

#include "include/stash.h"

#if defined(__SSE2__) && !defined(__SANITIZE_THREAD__)
#include <emmintrin.h>
#define SHM_GROUP_SIMD 1
#endif

typedef uint64_t shm_off;

#define SHM_MAGIC "STASHARN"
#define SHM_LAYOUT_VERSION 6u
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

/* Called with the lock held when its previous owner died inside it: puts the
 * structure the lock protects back into a consistent state. */
typedef void shm_repair_fn(void *arg);

/* How long a taker waits for a holder that lives but does not let go. */
#define SHM_LOCK_TIMEOUT_S 10u

int shm_lock_init(shm_lock *lock);
/* Takes the lock; if the previous holder died, runs repair first. Returns 0,
 * 1 if a repair ran, -ETIMEDOUT naming the holder's process if a live one
 * held it for SHM_LOCK_TIMEOUT_S, or another negative error. */
int shm_lock_acquire(shm_lock *lock, shm_repair_fn *repair, void *arg);
void shm_lock_release(shm_lock *lock);

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
 * 2. The tags come first, so that two 16-byte loads compare them all. */
#define SHM_GROUP_SLOTS 10u
enum { SHM_SLOT_EMPTY = 0u, SHM_SLOT_DELETED = 1u };
typedef struct shm_group {
    _Atomic uint16_t tag[SHM_GROUP_SLOTS];
    _Atomic shm_ref ref[SHM_GROUP_SLOTS];
    uint32_t pad; /* to a whole line */
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
typedef struct shm_undo {
    _Atomic shm_ref rec; /* the record being changed in place, 0 none */
    uint32_t vlen;       /* its value length before, or with redo after */
    uint32_t nregions;   /* 0 with redo */
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
    _Atomic uint64_t count;    /* live (non-tombstone) entries */
    uint32_t heads;            /* slots of both arrays holding an entry (tombstones too) */
    uint32_t old_left;         /* of those, the ones in old_index */
    _Atomic uint32_t pins[SHM_MAX_PINS]; /* versions pinned by readers, 0 free */
    uint32_t sweep_resizes;   /* resizes when the sweep started: it starts over after one */
    uint32_t cleanup_pos;     /* next slot of the TTL cleanup */
    _Atomic uint32_t resizes; /* bumped whenever index or old_index changes */
    _Atomic shm_off retired;  /* the ring of memory waiting for readers (table.c) */
    /* Who holds each pin, a byte per pin: 0 the owner itself (its pins die
     * with it), else 1 + the reader slot of the process that will release it. */
    _Atomic uint32_t pin_holders;
    _Atomic uint32_t cut; /* the version cut for the checkpoint being taken (control.c), 0 none */
    _Atomic shm_off growing;       /* the index a growth is switching to */
    _Atomic uint32_t growing_log2; /* its groups */
    uint32_t moves_held;           /* moves put off for walkers */
    _Atomic uint32_t moving;       /* set while the owner moves groups (recovery finishes them) */
    _Atomic uint64_t writes;       /* every publish and delete: invalidates iterators */
    shm_undo undo;
} shm_table;
_Static_assert(offsetof(shm_table, sweep_pos) < 64,
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

typedef struct shm_ctl_worker {
    _Atomic uint64_t acked;        /* the newest checkpoint this index cut */
    _Atomic uint64_t pause_ns;     /* how long that cut took */
    shm_op_blob pending;           /* its newest operator state: at its last cut or its close */
    shm_op_blob committed;         /* as of the newest completed checkpoint or restore */
    _Atomic uint32_t restoring;    /* reading checkpoints (a rollback): retention waits */
    _Atomic int32_t cut_error;     /* why its last cut failed (arena full, no pin free), or 0 */
    _Atomic uint64_t cut_clock_ms; /* its TTL clock at its last cut */
} shm_ctl_worker;

typedef struct shm_control {
    shm_lock lock;                   /* results, operator-state sets */
    _Atomic int32_t service_pid;     /* the live engine's process, 0 none */
    _Atomic uint32_t service_reader; /* its reader slot (the holder of its pins) */
    _Atomic uint64_t service_start;
    uint64_t service_since_ns;
    char dir[SHM_CTL_DETAIL];          /* where its checkpoints go (workers roll back from it) */
    _Atomic uint32_t wake;             /* futex: the engine sleeps on it */
    _Atomic uint32_t finished;         /* futex: bumped when a checkpoint ends */
    _Atomic uint32_t stop;             /* `stash stop`: the engine exits */
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
    shm_ctl_result history[SHM_CTL_HISTORY];
    shm_ctl_worker workers[STASH_MAX_WORKERS];
} shm_control;

/* The sizes docs/architecture.md's table of the arena's layout gives. */
_Static_assert(sizeof(shm_kg_heap) == 736 && sizeof(shm_table) == 768 &&
                   sizeof(shm_catalog_entry) == 104 && sizeof(shm_control) == 84824,
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

/* ------------------------------------------------------------------------ */
/* The page pool (pool.c): runs of whole spans, shared by all key groups.     */

void shm_pool_init(stash_arena *a);
/* Takes a run of n spans for key group kg with size class cls; *first is its
 * first span index. Returns 0 or STASH_EFULL. */
int shm_pool_take(stash_arena *a, uint64_t n, uint32_t kg, unsigned cls, uint64_t *first);
/* Gives the run starting at span first back to the pool. */
void shm_pool_give(stash_arena *a, uint64_t first);
/* Rebuilds the free lists from the descriptors (the lock's crash repair). */
void shm_pool_rebuild(void *arena);
/* Maps into this process, in one call, the first bytes of the spans not yet
 * cut (where a fresh arena's heaps grow), so that filling them takes no page
 * fault per page. Only a speed-up: does nothing where the kernel cannot. */
void shm_pool_prefault(stash_arena *a, uint64_t bytes);

/* ------------------------------------------------------------------------ */
/* Per-key-group heaps (heap.c). Only the owner of kg may call alloc and free. */

/* The size class for a request of size bytes (size <= SHM_SMALL_MAX). */
unsigned shm_size_class(size_t size);
/* The bytes a block of class cls spans: 16-byte steps up to 256, then
 * four classes per power of two. */
static inline __attribute__((always_inline)) uint32_t shm_class_bytes(unsigned cls)
{
    if (cls < 16) return (cls + 1) * 16;
    unsigned i = cls - 16;
    return (5u + i % 4) << (6 + i / 4);
}
/* The spans in one run of class cls (chosen so that little of the run is waste). */
uint32_t shm_class_run(unsigned cls);
/* The bytes of a run of class cls that blocks can use. */
uint32_t shm_class_capacity(unsigned cls);

/* Allocates size bytes in key group kg's heap. Returns 0 and *out, STASH_EFULL,
 * or STASH_ETOOBIG. The block is 16-byte aligned. */
int shm_alloc(stash_arena *a, uint32_t kg, size_t size, shm_off *out);
/* Frees a block back to the heap of the key group that owns it. */
void shm_free(stash_arena *a, shm_off off);
/* The usable bytes of an allocated block. */
uint64_t shm_block_size(const stash_arena *a, shm_off off);
/* Measures the used and free bytes of each key group of range from its spans
 * and free lists into used[k], free_b[k] (k = kg - range.first). Returns 0 or
 * a lock error. */
int shm_heap_measure(stash_arena *a, stash_kg_range range, uint64_t *used, uint64_t *free_b);
/* Recovers every key group in range whose last owner did not leave cleanly
 * (recover_kg makes what lives in its heap whole, then its counters are
 * recomputed from its spans and free lists: a block in flight at the crash
 * stays counted as used), and marks the caller as their owner. */
typedef void shm_kg_recover_fn(stash_arena *a, uint32_t kg);
void shm_heap_adopt(stash_arena *a, stash_kg_range range, shm_kg_recover_fn *recover_kg);
/* Marks the key groups of range as left cleanly. */
void shm_heap_release(stash_arena *a, stash_kg_range range);

/* ------------------------------------------------------------------------ */
/* The worker registry (registry.c).                                          */

/* Takes slot index for a worker of parallelism p, refusing a live holder and
 * live workers of another parallelism; a dead holder's slot is taken over.
 * Then adopts the slot's key groups (recovering heaps a dead owner left).
 * Returns 0 and the slot's number in *slot, or a negative error. */
int shm_registry_join(stash_arena *a, uint32_t index, uint32_t p, uint32_t *slot);
/* Leaves slot (if this process still holds it) and releases its key groups. */
void shm_registry_leave(stash_arena *a, uint32_t slot);
/* With no worker holding a key group of range (their slots free: they left
 * cleanly), pins each for holder as its cut (tables[kg].cut, if not cut
 * yet), keeping workers from joining meanwhile. Returns 0, or -EBUSY if a
 * live or dead worker holds one of them. */
int shm_registry_cut_free(stash_arena *a, stash_kg_range range, uint32_t holder);
/* Fills *out from slot, with LIVE turned into DEAD if its process is gone. */
void shm_registry_describe(stash_arena *a, uint32_t slot, stash_worker_info *out);

/* ------------------------------------------------------------------------ */
/* Reclamation (ebr.c): memory unlinked by an owner is freed once no reader
 * process that could still hold it is reading.                               */

/* A reader announces itself before following links into another's table.
 * slot is a worker's registry slot, or STASH_MAX_WORKERS + a reader slot. */
void shm_ebr_enter(stash_arena *a, uint32_t slot);
void shm_ebr_exit(stash_arena *a, uint32_t slot);
/* Takes a reader slot for this process (for shm_ebr_enter); returns 0 and
 * the slot's number, or STASH_EBUSY if all are held by live processes. */
int shm_reader_join(stash_arena *a, uint32_t *slot);
void shm_reader_leave(stash_arena *a, uint32_t slot);
/* Whether holder (1 + a reader slot's index) is held by a live process. */
bool shm_reader_alive(const stash_arena *a, uint32_t holder);
/* The oldest epoch a live reader announced, or UINT64_MAX; readers that died
 * are cleared when they hold memory back. */
uint64_t shm_ebr_min(stash_arena *a, bool check_dead);

/* ------------------------------------------------------------------------ */
/* The state catalog (catalog.c).                                             */

/* Registers name with kind and options, or finds it and takes options as
 * its own; returns its id (>= 1), or STASH_EKIND if it exists with another
 * kind or TTL switched the other way (catalog.c). */
int shm_catalog_register(stash_arena *a, const char *name, uint32_t kind,
                         const uint8_t options[32]);

/* ------------------------------------------------------------------------ */
/* The arena file (segment.c).                                                */

/* The file of arena name: opts->path, or /dev/shm/stash.NAME. Returns 0, or
 * -EINVAL for a bad name, -ENAMETOOLONG. */
int shm_arena_path(const char *name, const stash_arena_opts *opts, char *path, size_t len);

/* ------------------------------------------------------------------------ */
/* The control block (control.c).                                             */

void shm_control_init(stash_arena *a);
/* Sleeps while *word == seen, at most timeout_ns (0: no limit), or until a
 * wake-up. Returns 0, or -ETIMEDOUT. */
int shm_futex_wait(_Atomic uint32_t *word, uint32_t seen, uint64_t timeout_ns);
/* Bumps *word and wakes every process sleeping on it. */
void shm_futex_wake(_Atomic uint32_t *word);
/* Whether a live engine serves the arena; its pid in *pid if so. */
bool shm_service_alive(const stash_arena *a, int32_t *pid);
/* Copies len bytes into a new run of spans owned by the control block (any
 * process); *off its offset. Returns 0 or STASH_EFULL. */
int shm_blob_put(stash_arena *a, const void *data, size_t len, shm_off *off);
/* Gives a blob's spans back to the pool (any process; 0 is ignored). */
void shm_blob_free(stash_arena *a, shm_off off);

/* ------------------------------------------------------------------------ */
/* Consistency (check.c): every invariant of the pool and the heaps.          */

/* Checks every invariant of the pool and the heaps while no worker writes.
 * Returns 0, or -EUCLEAN with the first violation in stash_errmsg(). */
int shm_check(stash_arena *a);

/* What attach checks of a mapped arena, in time independent of its state:
 * every offset the fixed parts hold (key groups' indexes, free lists,
 * reclamation rings, operator-state blobs) lies in the data region, worker
 * slots name key groups of the arena, catalog entries name kinds. Returns 0
 * or STASH_ECORRUPT naming the part. */
int shm_check_attach(const stash_arena *a);

/* ------------------------------------------------------------------------ */
/* Processes (proc.c).                                                        */

/* The start time of pid (clock ticks since boot), or 0 if it is gone or a zombie. */
uint64_t shm_proc_start_time(int32_t pid);
/* Whether pid is the same living process that had start time start. */
bool shm_proc_alive(int32_t pid, uint64_t start);
/* Nanoseconds since the epoch. */
uint64_t shm_now_ns(void);

/* Makes dir (mode) or takes the one there: a directory (or a link to one of
 * this user's), this user's own and not writable by others. Returns 0, or
 * -ENOTDIR or -EPERM (or -errno) naming dir and why (segment.c). */
int shm_own_dir(const char *dir, mode_t mode);

/* ------------------------------------------------------------------------ */
/* Errors (error.c).                                                          */

/* Records the detail of an error for stash_errmsg(); returns err. */
int shm_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Clears the detail at the start of a public call. */
void shm_clear_error(void);
/* -EINVAL for a NULL argument of a public function: "fn: what is NULL". */
int shm_refuse_null(const char *fn, const char *what);
/* Whether bytes (p, len) are NULL with a length: never a valid argument. */
static inline bool shm_null_bytes(const void *p, size_t len)
{
    return __builtin_expect(!p && len, 0);
}

/* Ensures the private buffer *buf (realloc'd) holds at least need bytes.
 * Returns 0 or -ENOMEM. */
static inline int shm_reserve(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    uint8_t *grown = realloc(*buf, n);
    if (!grown) return -ENOMEM;
    *buf = grown;
    *cap = n;
    return 0;
}

#endif /* STASH_SHM_H */
