/* SPDX-License-Identifier: MIT */
/*
 * shm.h: the arena substrate's functions, for shm/ and the backends above
 * it: locks, the page pool, the allocator, the registry, epochs, the
 * catalog, the control block, the checks, processes and errors, over the
 * shared layout of shm/layout.h. The keyed tables are shm/table.h.
 */
#ifndef STASH_SHM_H
#define STASH_SHM_H

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/types.h>

#include "shm/layout.h"

/* ------------------------------------------------------------------------ */
/* Robust process-shared locks, for the slow paths only.                     */

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
/* The page pool (pool.c): runs of whole spans, shared by all key groups.     */

void shm_pool_init(stash_arena *a);
/* Takes a run of n spans for key group kg with size class cls; *first is its
 * first span index. Returns 0 or STASH_EFULL. */
int shm_pool_take(stash_arena *a, uint64_t n, uint32_t kg, unsigned cls, uint64_t *first);
/* Gives the run starting at span first back to the pool. */
void shm_pool_give(stash_arena *a, uint64_t first);
/* Rebuilds the free lists from the descriptors (the lock's crash repair). */
void shm_pool_rebuild(void *arena);
/* Maps into this process the first bytes of the spans not yet cut (where a
 * fresh arena's heaps grow), so that filling them takes no page fault per
 * page; any number of threads may share the work, each calling
 * shm_prefault_run on one shm_prefault. Only a speed-up: changes no byte,
 * and does nothing where the kernel cannot. */
typedef struct shm_prefault {
    char *base;            /* the first span not yet cut */
    uint64_t spans;        /* how many to map */
    _Atomic uint64_t next; /* the next chunk of spans a thread takes */
} shm_prefault;
void shm_prefault_init(shm_prefault *p, stash_arena *a, uint64_t bytes);
void shm_prefault_run(shm_prefault *p);

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
/* Key group kg after a process that wrote it (not its owner) died: what
 * it was in the middle of finished or undone (recover_kg), and the heap's
 * counters recounted. */
int shm_heap_recover(stash_arena *a, uint32_t kg, shm_kg_recover_fn *recover_kg);
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
/* Finds name, registered by someone, without changing anything: its id, or
 * STASH_ENOTFOUND, or STASH_EKIND if its kind or TTL is another. */
int shm_catalog_find(stash_arena *a, const char *name, uint32_t kind, bool ttl);

/* ------------------------------------------------------------------------ */
/* The arena file (segment.c).                                                */

/* The file of arena name: opts->path, or /dev/shm/stash.NAME. Returns 0, or
 * -EINVAL for a bad name, -ENAMETOOLONG. */
int shm_arena_path(const char *name, const stash_arena_opts *opts, char *path, size_t len);
/* Creates arena name as stash_arena_create does, but without its name:
 * its file has none (where the filesystem allows) until shm_arena_publish
 * gives it, so that no one attaches to it half-filled and a creator that
 * dies leaves nothing. */
int shm_arena_make(const char *name, const stash_arena_opts *opts, stash_arena **out);
/* Names an arena made by shm_arena_make (opts: the same; with
 * STASH_ARENA_REPLACE over an arena of this user's). Returns 0, -EEXIST. */
int shm_arena_publish(stash_arena *a, const stash_arena_opts *opts);
/* A heap arena of this process's alone, in memory with no name anywhere
 * (a view of a checkpoint, a savepoint writer's heap); label names it in
 * messages. */
int shm_arena_make_private(const char *label, const stash_arena_opts *opts, stash_arena **out);

/* ------------------------------------------------------------------------ */
/* The control block (control.c).                                             */

void shm_control_init(stash_arena *a);
/* Sleeps while *word == seen, at most timeout_ns (0: no limit), or until a
 * wake-up. Returns 0, or -ETIMEDOUT. */
int shm_futex_wait(_Atomic uint32_t *word, uint32_t seen, uint64_t timeout_ns);
/* Bumps *word and wakes every process sleeping on it. */
void shm_futex_wake(_Atomic uint32_t *word);
/* Wakes every process sleeping on word, which the caller changed itself. */
void shm_futex_wake_as_is(_Atomic uint32_t *word);
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
 * slots name key groups of the arena, catalog entries name kinds, counts of
 * workers stay within the slots, the paths it holds end within their
 * fields. Returns 0 or STASH_ECORRUPT naming the part. */
int shm_check_attach(const stash_arena *a);

/* ------------------------------------------------------------------------ */
/* Processes (proc.c).                                                        */

/* The start time of pid (clock ticks since boot), or 0 if it is gone or a zombie. */
uint64_t shm_proc_start_time(int32_t pid);
/* Whether pid is the same living process that had start time start. */
bool shm_proc_alive(int32_t pid, uint64_t start);
/* Nanoseconds since the epoch. */
uint64_t shm_now_ns(void);
/* A clock no step of the wall clock moves (CLOCK_MONOTONIC), in ns: what
 * intervals, deadlines and leases are measured on. */
uint64_t shm_clock_ns(void);

/* ------------------------------------------------------------------------ */
/* Directories (dir.c): opened once, checked on the descriptor, used through */
/* *at() calls. Links on the way are followed only if this user, root or the */
/* owner of the directory holding them made them.                            */

typedef struct shm_dir {
    int fd;          /* O_RDONLY | O_DIRECTORY; -1 when closed */
    uid_t uid;       /* its owner */
    char path[4096]; /* as it was named: for messages */
} shm_dir;

enum {
    /* Written, listed and removed in: this user's own and writable by no
     * other user; every directory on the way root's or this user's, with
     * the sticky bit where others may write into it. */
    SHM_DIR_OWN = 1u,
    /* New entries made in it, each exclusively: root's or this user's, with
     * the sticky bit where others may write into it, as is the way there. */
    SHM_DIR_PLACE = 2u,
    SHM_DIR_CREATE = 4u, /* made (0700) if missing; its parent must exist */
    /* With OWN: shared with its group, trusted as the arena's group is
     * (made 0750; its group may write). */
    SHM_DIR_GROUP = 8u,
};
/* The absolute form of path (a relative one after the working directory),
 * so that a path kept for other processes leads where it led here. Returns
 * 0 or -ENAMETOOLONG. */
int shm_path_absolute(const char *path, char *out, size_t cap);
/* Opens the directory at path for reading (how 0) or as how asks. Returns
 * 0, or an error naming the path, the component at fault and why. */
int shm_dir_open(const char *path, unsigned how, shm_dir *out);
/* Opens directory name in parent (a link there refused), made first with
 * SHM_DIR_CREATE, checked as how asks. */
int shm_dir_openat(const shm_dir *parent, const char *name, unsigned how, shm_dir *out);
/* Opens, to read, a directory whose path an arena holds (nothing read from
 * an arena is trusted as a path): walked as shm_dir_open walks it, and
 * refused unless the arena's owner or this user has it and no other user
 * may write into it. */
int shm_dir_open_named(const stash_arena *a, const char *path, shm_dir *out);
/* Closes d (accepts one closed or never opened with fd -1). */
void shm_dir_close(shm_dir *d);
/* fsyncs the directory. */
int shm_dir_sync(const shm_dir *d);
/* Removes name in d (a file or link itself, never what it points to) and,
 * if it is a directory, what it holds down to depth levels of
 * subdirectories. Returns 0 or the first error naming what stayed. */
int shm_dir_remove(const shm_dir *d, const char *name, int depth);
/* Checks that this process can create files in d, leaving nothing behind. */
int shm_dir_probe(const shm_dir *d);
/* Makes a new directory of this user's in parent, named prefix, this
 * process's pid, '-' and a random part, locked while it is open: what a
 * maker that died left under prefix there (its process gone, its lock
 * free) is removed first. */
int shm_dir_temp(const shm_dir *parent, const char *prefix, shm_dir *out);
/* Removes what any maker of temporary directories whose names hold marker
 * (then the maker's pid and random part) left in parent, as shm_dir_temp
 * does for its prefix. */
void shm_dir_remove_left(const shm_dir *parent, const char *marker);
/* Removes a directory shm_dir_temp made in parent, with what it holds, and
 * closes it. */
int shm_dir_temp_remove(const shm_dir *parent, shm_dir *t);
/* A listing of d (closedir it; d stays open), or NULL and errno. */
DIR *shm_dir_list(const shm_dir *d);

/* Where stash keeps, for this user alone, what is not given a place:
 * RUNTIME in memory (systemd's $RUNTIME_DIRECTORY, else /run/stash for
 * root, $XDG_RUNTIME_DIR/stash or /dev/shm/stash-UID), STATE on disk
 * ($STATE_DIRECTORY, else /var/lib/stash for root, /var/tmp/stash-UID).
 * Makes that directory (0700) if missing, refuses one another user has or
 * others may write, and writes its path, '/' and name into out. */
typedef enum shm_private { SHM_PRIVATE_RUNTIME, SHM_PRIVATE_STATE } shm_private;
int shm_private_path(shm_private kind, const char *name, char *out, size_t cap);

/* ------------------------------------------------------------------------ */
/* Errors (error.c).                                                          */

/* Records the detail of an error for stash_errmsg(); returns err. */
int shm_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Clears the detail at the start of a public call. */
void shm_clear_error(void);
/* -EINVAL for a NULL argument of a public function: "fn: what is NULL". */
int shm_refuse_null(const char *fn, const char *what);
/* Copies the caller's struct src (NULL: all defaults), whose first member is
 * its size_t sz, into dst of this library's size: members an older
 * program's smaller struct lacks read as zero, and dst's sz is its size.
 * -EINVAL naming fn and type if sz is below sizeof(size_t), or a newer
 * program's larger struct has a non-zero byte this library does not know. */
int shm_take_opts(const char *fn, const char *type, const void *src, void *dst, size_t size);
#define SHM_TAKE_OPTS(fn, type, src, dst) shm_take_opts(fn, #type, src, dst, sizeof(type))
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
