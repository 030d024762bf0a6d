/* SPDX-License-Identifier: MIT */
/*
 * shm.h: the arena's internal interface, for shm/ and the backends above it.
 *
 * The arena is one file mapped by every process at a different address, so
 * nothing in it holds a pointer: every reference is an shm_off, a byte offset
 * from the arena base, and 0 is the null offset (the header lives there).
 * docs/architecture.md draws the layout and states the locking and crash rules.
 */
#ifndef STASH_SHM_H
#define STASH_SHM_H

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
    _Atomic uint32_t lmdb_track;       /* the engine wants the log */
    _Atomic uint32_t lmdb_untracked;   /* bumped by changes the log missed (no room) */
    _Atomic uint64_t lmdb_prune_below; /* entries older than the next delta's base may go */
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
 * A free list's link is checked before it is followed: another process
 * that damaged it makes the allocator drop the rest of the list (a leak),
 * never read or write outside the mapping. */
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
 * (its table made whole, its counters recomputed from its spans and free
 * lists: a block in flight at the crash stays counted as used), and marks
 * the caller as their owner. */
void shm_heap_adopt(stash_arena *a, stash_kg_range range);
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
/* Keyed tables (table.c, index.c): one per key group, one writer (the owner). */

/* What identifies an entry: state, key and namespace, with their hash. */
typedef struct shm_lookup {
    uint32_t kg;
    uint32_t hash;
    uint16_t state;
    uint16_t klen;
    uint16_t nslen;
    const void *key;
    const void *ns;
} shm_lookup;

/* Where an entry lives: its slot in the index (or the free slot a new entry
 * of it takes) and its record. Valid until the owner's next change. */
typedef struct shm_cursor {
    shm_group *group; /* NULL: no slot (the entry is absent and the index full) */
    uint32_t slot;
    bool in_old;  /* the slot is in the index being emptied */
    shm_rec *rec; /* the newest version, tombstones included; NULL if none */
} shm_cursor;

static inline const uint8_t *shm_rec_key(const shm_rec *r)
{
    return (const uint8_t *)(r + 1);
}
static inline const uint8_t *shm_rec_ns(const shm_rec *r)
{
    return shm_rec_key(r) + r->klen;
}
static inline uint8_t *shm_rec_value(shm_rec *r)
{
    return (uint8_t *)(r + 1) + r->klen + r->nslen;
}
static inline bool shm_rec_live(const shm_rec *r)
{
    return r && !(r->flags & SHM_REC_TOMBSTONE);
}
/* The bytes of rec's block. */
static inline __attribute__((always_inline)) uint64_t shm_rec_block_bytes(const stash_arena *a,
                                                                          const shm_rec *rec)
{
    /* The class in the header spares a look at the span descriptors. */
    return rec->size_class == SHM_CLASS_LARGE ? shm_block_size(a, shm_off_of(a, rec))
                                              : shm_class_bytes(rec->size_class);
}
/* The bytes at the end of rec's block that hold its link, 0 if unlinked. */
static inline uint64_t shm_rec_link_bytes(const shm_rec *rec)
{
    return rec->flags & SHM_REC_LINKED ? sizeof(shm_ref) : 0;
}
/* The older version's link of a LINKED record. */
static inline _Atomic shm_ref *shm_rec_link(const stash_arena *a, shm_rec *r)
{
    return (_Atomic shm_ref *)(void *)((uint8_t *)r + shm_rec_block_bytes(a, r) - sizeof(shm_ref));
}
/* The older version r keeps for a pinned reader, 0 if none. */
static inline shm_ref shm_rec_older(const stash_arena *a, const shm_rec *r)
{
    return (r->flags & SHM_REC_LINKED)
               ? atomic_load_explicit(shm_rec_link(a, (shm_rec *)r), memory_order_acquire)
               : 0;
}

/* The tag a slot keeps for an entry of lookup hash h. */
static inline uint16_t shm_slot_tag(uint32_t h)
{
    return (uint16_t)(h >> 16);
}

/* The slots of g whose tag is tag: bit 2i for slot i. */
static inline unsigned shm_group_match(const shm_group *g, uint16_t tag)
{
#ifdef SHM_GROUP_SIMD
    /* Tags 0 to 7, then 2 to 9: each 2-byte tag read whole, within the line. */
    const uint8_t *p = (const uint8_t *)(const void *)g->tag;
    __m128i want = _mm_set1_epi16((short)tag);
    unsigned lo = (unsigned)_mm_movemask_epi8(
        _mm_cmpeq_epi16(_mm_load_si128((const __m128i *)(const void *)p), want));
    unsigned hi = (unsigned)_mm_movemask_epi8(
        _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)(const void *)(p + 4)), want));
    return (lo | hi << 4) & 0x55555u;
#else
    unsigned m = 0;
    for (unsigned i = 0; i < SHM_GROUP_SLOTS; i++)
        m |= (unsigned)(atomic_load_explicit(&g->tag[i], memory_order_relaxed) == tag) << (2 * i);
    return m;
#endif
}

/* The slot of the lowest bit of a match mask, taken off the mask. */
static inline unsigned shm_group_next(unsigned *mask)
{
    unsigned i = (unsigned)__builtin_ctz(*mask) >> 1;
    *mask &= *mask - 1;
    return i;
}

/* Non-zero unless the n bytes at x and y, 8 <= n <= 16, are equal: their
 * first and last 8 bytes compared, with no branch. */
static inline __attribute__((always_inline)) uint64_t shm_words_differ(const uint8_t *x,
                                                                       const uint8_t *y, size_t n)
{
    uint64_t a0, a1, b0, b1;
    __builtin_memcpy(&a0, x, 8), __builtin_memcpy(&a1, x + n - 8, 8);
    __builtin_memcpy(&b0, y, 8), __builtin_memcpy(&b1, y + n - 8, 8);
    return (a0 ^ b0) | (a1 ^ b1);
}

/* Byte equality without a call for keys and namespaces of at most 16
 * bytes, the usual: two overlapping loads from each. */
static inline __attribute__((always_inline)) bool shm_bytes_equal(const uint8_t *x,
                                                                  const uint8_t *y, size_t n)
{
    if (n > 16) return __builtin_memcmp(x, y, n) == 0;
    if (n >= 8) return shm_words_differ(x, y, n) == 0;
    if (n >= 4) {
        uint32_t c0, c1, d0, d1;
        __builtin_memcpy(&c0, x, 4), __builtin_memcpy(&c1, x + n - 4, 4);
        __builtin_memcpy(&d0, y, 4), __builtin_memcpy(&d1, y + n - 4, 4);
        return ((c0 ^ d0) | (c1 ^ d1)) == 0;
    }
    return n == 0 || (x[0] == y[0] && x[n / 2] == y[n / 2] && x[n - 1] == y[n - 1]);
}

/* 16 bytes at any alignment, moved as one vector where the target has them. */
typedef uint8_t shm_bytes16 __attribute__((vector_size(16), aligned(1), may_alias));

static inline __attribute__((always_inline)) shm_bytes16 shm_load16(const uint8_t *s)
{
    return *(const shm_bytes16 *)(const void *)s;
}
static inline __attribute__((always_inline)) void shm_store16(uint8_t *d, shm_bytes16 v)
{
    *(shm_bytes16 *)(void *)d = v;
}
static inline void shm_move16(uint8_t *d, const uint8_t *s)
{
    shm_store16(d, shm_load16(s));
}

static inline void shm_move64(uint8_t *d, const uint8_t *s)
{
    shm_move16(d, s), shm_move16(d + 16, s + 16);
    shm_move16(d + 32, s + 32), shm_move16(d + 48, s + 48);
}

/* Copies n <= SHM_UNDO_BYTES bytes between buffers that do not overlap,
 * without a call: moves of 64, 16, 8, 4 or 1 bytes, the last one
 * overlapping the one before it. */
static inline __attribute__((always_inline)) void shm_copy_small(uint8_t *d, const uint8_t *s,
                                                                 size_t n)
{
    if (n >= 64) {
        for (size_t i = 0; i + 64 < n; i += 64) shm_move64(d + i, s + i);
        shm_move64(d + n - 64, s + n - 64);
    } else if (n >= 16) {
        for (size_t i = 0; i + 16 < n; i += 16) shm_move16(d + i, s + i);
        shm_move16(d + n - 16, s + n - 16);
    } else if (n >= 8) {
        __builtin_memcpy(d, s, 8), __builtin_memcpy(d + n - 8, s + n - 8, 8);
    } else if (n >= 4) {
        __builtin_memcpy(d, s, 4), __builtin_memcpy(d + n - 4, s + n - 4, 4);
    } else if (n) {
        d[0] = s[0], d[n / 2] = s[n / 2], d[n - 1] = s[n - 1];
    }
}

/* 16 to 128 bytes held in vector registers, to be stored more than once
 * after one load: the first and last 16, 32 or 64 bytes, which overlap. */
#define SHM_HELD_MAX 128u
typedef struct shm_held {
    shm_bytes16 head[4], tail[4];
} shm_held;

static inline __attribute__((always_inline)) shm_held shm_hold(const uint8_t *s, size_t n)
{
    shm_held h;
    const uint8_t *e = s + n;
    if (n >= 64) {
        h.head[0] = shm_load16(s), h.head[1] = shm_load16(s + 16);
        h.head[2] = shm_load16(s + 32), h.head[3] = shm_load16(s + 48);
        h.tail[0] = shm_load16(e - 64), h.tail[1] = shm_load16(e - 48);
    } else if (n >= 32) {
        h.head[0] = shm_load16(s), h.head[1] = shm_load16(s + 16);
    } else {
        h.head[0] = shm_load16(s);
    }
    if (n >= 32) h.tail[2] = shm_load16(e - 32);
    h.tail[3] = shm_load16(e - 16);
    return h;
}

static inline __attribute__((always_inline)) void shm_unhold(uint8_t *d, const shm_held *h,
                                                             size_t n)
{
    uint8_t *e = d + n;
    if (n >= 64) {
        shm_store16(d, h->head[0]), shm_store16(d + 16, h->head[1]);
        shm_store16(d + 32, h->head[2]), shm_store16(d + 48, h->head[3]);
        shm_store16(e - 64, h->tail[0]), shm_store16(e - 48, h->tail[1]);
    } else if (n >= 32) {
        shm_store16(d, h->head[0]), shm_store16(d + 16, h->head[1]);
    } else {
        shm_store16(d, h->head[0]);
    }
    if (n >= 32) shm_store16(e - 32, h->tail[2]);
    shm_store16(e - 16, h->tail[3]);
}

/* State, key length and namespace length lie side by side in both. */
_Static_assert(offsetof(shm_rec, klen) == offsetof(shm_rec, state) + 2 &&
                   offsetof(shm_rec, nslen) == offsetof(shm_rec, state) + 4 &&
                   offsetof(shm_lookup, klen) == offsetof(shm_lookup, state) + 2 &&
                   offsetof(shm_lookup, nslen) == offsetof(shm_lookup, state) + 4,
               "state, klen and nslen are compared as one word");

/* A record's state, key length, namespace length and flags as one
 * (little-endian) word; the bits of it that name an entry, and those and
 * TOMBSTONE, which a live version of the entry has clear. */
_Static_assert(offsetof(shm_rec, flags) == offsetof(shm_rec, state) + 6,
               "the flags follow the lengths in the name word");
#define SHM_NAME_BITS 0xffffffffffffull
#define SHM_LIVE_NAME_BITS (SHM_NAME_BITS | (uint64_t)SHM_REC_TOMBSTONE << 48)
static inline uint64_t shm_rec_name(const shm_rec *r)
{
    uint64_t x;
    __builtin_memcpy(&x, &r->state, 8);
    return x;
}
/* The name word of the entries of state with keys of klen bytes in
 * namespaces of nslen bytes. */
static inline uint64_t shm_name_word(uint16_t state, uint16_t klen, uint16_t nslen)
{
    return state | (uint64_t)klen << 16 | (uint64_t)nslen << 32;
}

/* Whether r is a version of l's entry. */
static inline __attribute__((always_inline)) bool shm_rec_matches(const shm_rec *r,
                                                                  const shm_lookup *l)
{
    uint64_t y;
    __builtin_memcpy(&y, &l->state, 8);
    return ((shm_rec_name(r) ^ y) & SHM_NAME_BITS) == 0 &&
           shm_bytes_equal(shm_rec_key(r), l->key, l->klen) &&
           shm_bytes_equal(shm_rec_ns(r), l->ns, l->nslen);
}

/* Starts loading the lines past its first that record r covers if its
 * block spans span bytes, up to two, so that a value arrives with its
 * header. A lookup that cannot guess the block's size fetches two. */
#define SHM_FETCH_ANY 192u
static inline void shm_rec_fetch(const shm_rec *r, uint32_t span)
{
    uint64_t end = ((uintptr_t)r & 63) + span;
    if (end > 64) __builtin_prefetch((const char *)r + 64);
    if (end > 128) __builtin_prefetch((const char *)r + 128);
}
/* The record of slot i of g whose tag matched, fetched whole. */
static inline shm_rec *shm_group_rec(const stash_arena *a, const shm_group *g, unsigned i)
{
    shm_rec *r = shm_rec_at(a, atomic_load_explicit(&g->ref[i], memory_order_acquire));
    if (r) shm_rec_fetch(r, SHM_FETCH_ANY);
    return r;
}

/* Owner: shm_table_find past its first look (index.c). */
int shm_table_find_probe(stash_arena *a, const shm_lookup *l, shm_cursor *c);

/* Any process: starts loading the home group of lookup hash h in key group
 * kg's index, so that a lookup soon after finds it in cache. */
static inline void shm_table_prefetch(const stash_arena *a, uint32_t kg, uint32_t h)
{
    const shm_table *t = &a->tables[kg];
    shm_off index = atomic_load_explicit(&t->index, memory_order_relaxed);
    uint32_t mask = (1u << atomic_load_explicit(&t->log2, memory_order_relaxed)) - 1;
    if (index) __builtin_prefetch((const shm_group *)(a->base + index) + (h & mask));
}

/* Owner: the record of the first slot with the tag of lookup hash h in its
 * home group of the index of table t, fetched as a block of span bytes, and
 * that group and slot; NULL if the group has no such slot or the index is
 * growing (an entry may then be in either array). The first look of every
 * owner's lookup, inline. */
static inline __attribute__((always_inline)) shm_rec *shm_table_home(const stash_arena *a,
                                                                     const shm_table *t, uint32_t h,
                                                                     uint32_t span, shm_group **grp,
                                                                     unsigned *slot)
{
    shm_off index = atomic_load_explicit(&t->index, memory_order_relaxed);
    if (__builtin_expect(!index || atomic_load_explicit(&t->old_index, memory_order_relaxed), 0))
        return NULL;
    uint32_t mask = (1u << atomic_load_explicit(&t->log2, memory_order_relaxed)) - 1;
    *grp = (shm_group *)(a->base + index) + (h & mask);
    unsigned m = shm_group_match(*grp, shm_slot_tag(h));
    if (__builtin_expect(m == 0, 0)) return NULL;
    *slot = shm_group_next(&m);
    /* A slot takes its reference before its tag and keeps it: the owner's
     * matched slot has one. */
    shm_rec *r = (shm_rec *)(a->base + shm_ref_off(atomic_load_explicit(&(*grp)->ref[*slot],
                                                                        memory_order_relaxed)));
    shm_rec_fetch(r, span);
    return r;
}

/* Owner: shm_table_find's first look: the entry in its home group. Returns
 * whether it found the entry there, and c. */
static inline __attribute__((always_inline)) bool
shm_table_find_home(stash_arena *a, const shm_lookup *l, shm_cursor *c)
{
    shm_group *grp;
    unsigned i;
    shm_rec *r = shm_table_home(a, &a->tables[l->kg], l->hash, SHM_FETCH_ANY, &grp, &i);
    if (__builtin_expect(!r || !shm_rec_matches(r, l), 0)) return false;
    *c = (shm_cursor){.group = grp, .slot = i, .in_old = false, .rec = r};
    return true;
}

/* Owner: the live record in table t of the entry named by name
 * (shm_name_word) with a key of 8 to 16 bytes and an empty namespace or one
 * of 8 to 16 bytes, if it is in its home group (fetched as a block of span
 * bytes); NULL otherwise, and shm_table_find decides. The common lookup,
 * compared with few instructions and no branch on lengths. */
static inline __attribute__((always_inline)) shm_rec *
shm_table_find_short(const stash_arena *a, const shm_table *t, uint32_t h, uint32_t span,
                     uint64_t name, const uint8_t *key, size_t klen, const uint8_t *ns,
                     size_t nslen)
{
    shm_group *grp;
    unsigned i;
    shm_rec *r = shm_table_home(a, t, h, span, &grp, &i);
    if (__builtin_expect(!r, 0)) return NULL;
    const uint8_t *k = shm_rec_key(r);
    uint64_t differ =
        ((shm_rec_name(r) ^ name) & SHM_LIVE_NAME_BITS) | shm_words_differ(k, key, klen);
    if (nslen) differ |= shm_words_differ(k + klen, ns, nslen);
    return __builtin_expect(differ == 0, 1) ? r : NULL;
}

/* Owner: finds the entry of l (cursor->rec NULL if absent). Returns 0 or an
 * allocation error. */
static inline __attribute__((always_inline)) int shm_table_find(stash_arena *a, const shm_lookup *l,
                                                                shm_cursor *c)
{
    return shm_table_find_home(a, l, c) ? 0 : shm_table_find_probe(a, l, c);
}

/* Owner: sizes an empty table for about n records, so that filling it (a
 * restore) moves nothing. Returns 0 or an allocation error. */
int shm_table_reserve(stash_arena *a, uint32_t kg, uint64_t n);

/* Owner: whether rec, in table t, may be changed in place (no pinned
 * reader can see it). */
static inline bool shm_rec_mutable(const shm_table *t, const shm_rec *rec)
{
    return rec->version == atomic_load_explicit(&t->epoch, memory_order_relaxed);
}
/* The bytes the value of rec, whose key and namespace take keys bytes, may
 * grow to in place. */
static inline __attribute__((always_inline)) uint64_t shm_rec_room(const stash_arena *a,
                                                                   const shm_rec *rec, size_t keys)
{
    return shm_rec_block_bytes(a, rec) - shm_rec_link_bytes(rec) - sizeof *rec - keys;
}
/* The bytes the value of rec may grow to in place. */
static inline __attribute__((always_inline)) uint64_t shm_rec_capacity(const stash_arena *a,
                                                                       const shm_rec *rec)
{
    return shm_rec_room(a, rec, (size_t)rec->klen + rec->nslen);
}
/* Owner: a new, unpublished record for l with room for cap value bytes. */
int shm_rec_new(stash_arena *a, const shm_lookup *l, size_t cap, shm_rec **out);
/* Owner: makes rec the entry of c (found for l), replacing the old version,
 * which is retired or, if a pinned reader needs it, kept behind rec. Returns
 * 0, or STASH_EFULL for a new entry when the index is full and the arena has
 * no room to grow it. */
int shm_table_publish(stash_arena *a, const shm_lookup *l, shm_cursor *c, shm_rec *rec);
/* Owner: deletes the entry of c (a tombstone if a pinned reader needs it). */
int shm_table_delete(stash_arena *a, const shm_lookup *l, shm_cursor *c);
/* Owner: brackets an in-place change of a mutable record's value that
 * overwrites the n regions (bytes past the old length need none). Saves
 * their bytes for a crash's undo; returns false, changing nothing, if they
 * exceed SHM_UNDO_BYTES (the caller then writes a new record instead). */
bool shm_rec_write_begin(stash_arena *a, uint32_t kg, shm_rec *rec, const shm_region *r,
                         unsigned n);
static inline __attribute__((always_inline)) void shm_rec_write_end(shm_table *t, shm_rec *rec)
{
    atomic_store_explicit(&rec->seq, atomic_load_explicit(&rec->seq, memory_order_relaxed) + 1,
                          memory_order_release);
    atomic_store_explicit(&t->undo.rec, 0, memory_order_release);
}
/* Owner: names rec in the undo record u as changed in place, with the n
 * regions u holds (0: a redo, u holding the whole new value) and a value of
 * vlen bytes (before the change, or with a redo after it), then makes rec's
 * sequence odd: from here a crash's recovery finishes or undoes it. */
static inline __attribute__((always_inline)) void
shm_undo_open(const stash_arena *a, shm_undo *u, shm_rec *rec, unsigned n, uint32_t vlen)
{
    u->nregions = n;
    u->vlen = vlen;
    atomic_store_explicit(&u->rec, shm_ref_of(shm_off_of(a, rec)), memory_order_release);
    /* Odd only after the undo names the record (recovery looks there). */
    atomic_store_explicit(&rec->seq, atomic_load_explicit(&rec->seq, memory_order_relaxed) + 1,
                          memory_order_release);
    atomic_thread_fence(memory_order_release);
}
/* Owner: replaces the whole value of a mutable record in table t, which
 * starts at dst and has room for len bytes, in place, under its sequence
 * lock. The new value is saved first for a crash's redo, so the old one
 * need not be read. Returns false, changing nothing, if it is longer than
 * SHM_UNDO_BYTES. */
static inline __attribute__((always_inline)) bool shm_rec_overwrite(const stash_arena *a,
                                                                    shm_table *t, shm_rec *rec,
                                                                    uint8_t *dst, const void *value,
                                                                    size_t len)
{
    if (len > SHM_UNDO_BYTES) return false;
    shm_undo *u = &t->undo;
    if (len >= 16 && len <= SHM_HELD_MAX) {
        /* Loaded once for both copies. */
        shm_held h = shm_hold(value, len);
        shm_unhold(u->bytes, &h, len);
        shm_undo_open(a, u, rec, 0, (uint32_t)len);
        shm_unhold(dst, &h, len);
    } else {
        shm_copy_small(u->bytes, value, len);
        shm_undo_open(a, u, rec, 0, (uint32_t)len);
        shm_copy_small(dst, value, len);
    }
    atomic_store_explicit(&rec->vlen, (uint32_t)len, memory_order_relaxed);
    shm_rec_write_end(t, rec);
    return true;
}
/* After the owner died: finishes a move between index arrays and undoes a
 * half-done in-place change, so the table is whole again, and releases every
 * pin (a checkpoint in flight when an owner of its key groups dies fails with it). */
void shm_table_recover(stash_arena *a, uint32_t kg);
/* Owner: a step of background work (growth, pruning, reclamation), bounded by budget. */
void shm_table_maintain(stash_arena *a, uint32_t kg, uint32_t budget);
#define SHM_TEND_BUDGET 2u /* groups a write moves or sweeps */
/* Whether table t has background work pending (a sweep, a growth, a
 * prune after an unpin). */
static inline bool shm_table_untended(const shm_table *t)
{
    return t->sweep_pos != UINT32_MAX ||
           atomic_load_explicit(&t->pins_gen, memory_order_relaxed) != t->swept_gen ||
           atomic_load_explicit(&t->old_index, memory_order_relaxed) ||
           atomic_load_explicit(&t->used, memory_order_relaxed) > t->grow_at;
}
/* Owner: a small step of pending background work, if any; call it before a
 * write's lookup (never between a lookup and the change that uses its cursor:
 * the step may move entries). Every write calls it, so pruning and growth go
 * on under any write load. */
static inline void shm_table_tend(stash_arena *a, uint32_t kg)
{
    if (shm_table_untended(&a->tables[kg])) shm_table_maintain(a, kg, SHM_TEND_BUDGET);
}

/* Owner: pins the current version of key group kg for a reader and starts a
 * new one; returns the pinned version (> 0) or -EBUSY if all pins are taken. */
int64_t shm_table_pin(stash_arena *a, uint32_t kg);
/* Owner: pins as shm_table_pin() does, for holder (1 + a reader slot's
 * index): the pin then outlives the owner while the holder's process lives. */
int64_t shm_table_pin_for(stash_arena *a, uint32_t kg, uint32_t holder);
/* Any process: releases a pin; the owner prunes what only it kept. */
void shm_table_unpin(stash_arena *a, uint32_t kg, uint32_t version);
/* Any process: releases every pin held for holder in every key group (its
 * process died, or a new process took its reader slot over), and forgets
 * any walk its process had announced. With keep, the pin of version
 * keep[kg] (0: none) stays: pins a worker died taking for the holder before
 * it could say so go, the holder's own stay. */
void shm_table_release_holder(stash_arena *a, uint32_t holder, const uint32_t *keep);
/* The record of l as of a pinned version (NULL if absent then, or if the
 * owner died in the middle of a move). The caller holds the pin, so the
 * versions it sees do not change, and is the owner or reads inside
 * shm_ebr_enter/exit, so that the heads it passes stay allocated. */
shm_rec *shm_table_get_at(stash_arena *a, const shm_lookup *l, uint32_t version);

/* A process walking key group kg while its owner writes announces itself
 * for reclamation (slot as for shm_ebr_enter) and, from a reader slot, as a
 * walker of kg: the owner then moves no entry of kg, so the walk meets each
 * once. Growth waits for the walk only when the index is nearly full. */
void shm_table_walk_enter(stash_arena *a, uint32_t kg, uint32_t slot);
void shm_table_walk_exit(stash_arena *a, uint32_t kg, uint32_t slot);

/* Visits every live record of key group kg as of a pinned version (the
 * newest version at or below it, tombstones left out), calling fn(rec, ctx)
 * until it returns non-zero, which is returned. The caller holds the pin and,
 * in another process than the owner, walks inside shm_table_walk_enter/exit.
 * -EAGAIN if the owner died in the middle of a move. */
typedef int shm_visit_fn(const shm_rec *rec, void *ctx);
int shm_table_walk_at(stash_arena *a, uint32_t kg, uint32_t version, shm_visit_fn *fn, void *ctx);

/* Visits what changed in key group kg between two pinned versions base <
 * version: for every entry whose newest version at or below version differs
 * from its newest at or below base, fn(rec, ctx) with that record, or with
 * the base's record and deleted set if the entry is gone by version. The
 * caller holds both pins. Returns the first non-zero fn result, or 0. */
typedef int shm_delta_fn(const shm_rec *rec, bool deleted, void *ctx);
int shm_table_walk_delta(stash_arena *a, uint32_t kg, uint32_t base, uint32_t version,
                         shm_delta_fn *fn, void *ctx);

/* Any process: copies the value of l's entry into *buf (grown with realloc as
 * needed) under the record's sequence lock, so the copy is never torn.
 * Returns the value's length, STASH_ENOTFOUND, or -ENOMEM. */
int64_t shm_table_read_copy(stash_arena *a, uint32_t reader_slot, const shm_lookup *l,
                            uint8_t **buf, size_t *cap);

/* Owner: the entries of kg one after another: the newest version of the
 * entry at scan position *pos or after (tombstones included), and, unless
 * hash is NULL, its lookup hash (computed from the record), advancing *pos
 * past it; NULL at the end. Start at 0. The owner may delete or replace
 * entries between calls (nothing moves), but not tend the table. */
shm_rec *shm_table_next(const stash_arena *a, uint32_t kg, uint32_t *pos, uint32_t *hash);

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

#endif /* STASH_SHM_H */
