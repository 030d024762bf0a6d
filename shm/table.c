/*
 * table.c: a key group's keyed table: chained hash buckets of versioned
 * records, written by the key group's owner and read by anyone.
 *
 * Invariants the rest of stash relies on:
 * - One writer: only the key group's owner changes its table, so the owner's
 *   own reads need no synchronisation and its views stay valid until its
 *   next change.
 * - Versions: every record carries the table epoch in which it was written.
 *   Pinning a version starts a new epoch; a record written before the pin is
 *   never changed in place again (shm_rec_mutable), and replacing or deleting
 *   it keeps it behind the new version (older) for as long as a pin may see
 *   it. So a reader pinned to version v sees the table exactly as of v.
 * - Readers in other processes follow links without locks: a record is
 *   replaced by storing one link, an unlinked record is freed only after
 *   every reader that could hold it has left (ebr.c), an in-place change is
 *   bracketed by the record's sequence lock, and moving records between
 *   buckets (rehash) is bracketed by the table's shape sequence, so a reader
 *   that missed a key because of a move retries.
 * - Growing never stops the world: the bucket array doubles when it holds
 *   half as many records as buckets, and the owner moves a few old buckets
 *   per write. Moves wait while a process in a reader slot reads (a
 *   checkpoint's walk), so a walk sees each record in one place.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "shm/shm.h"

#define INITIAL_LOG2 4u
#define WRITE_BUDGET 2u   /* buckets moved or swept per write */
#define RECLAIM_BATCH 64u /* retired objects that trigger a reclamation */
#define RECLAIM_CHECK_DEAD 4096u

typedef struct retired_item {
    shm_off off;
    uint64_t epoch;
} retired_item;

/* The retire ring lives in one block: its capacity, then its head and
 * length packed in one word (so each change is one store), then the items.
 * Growing builds a new ring and switches the table to it with one store. */
typedef struct retire_ring {
    uint32_t cap;
    uint32_t pad;
    _Atomic uint64_t head_len;
    retired_item items[];
} retire_ring;

static uint32_t ring_head(const retire_ring *r)
{
    return (uint32_t)(atomic_load(&r->head_len) >> 32);
}
static uint32_t ring_len(const retire_ring *r)
{
    return (uint32_t)atomic_load(&r->head_len);
}
static void ring_set(retire_ring *r, uint32_t head, uint32_t len)
{
    atomic_store(&r->head_len, (uint64_t)head << 32 | len);
}

static _Atomic shm_ref *bucket_array(const stash_arena *a, shm_off off)
{
    return (_Atomic shm_ref *)(a->base + off);
}

static uint32_t max_pin(const shm_table *t)
{
    uint32_t m = 0;
    for (unsigned i = 0; i < SHM_MAX_PINS; i++) {
        uint32_t p = atomic_load_explicit(&t->pins[i], memory_order_acquire);
        if (p > m) m = p;
    }
    return m;
}

/* Whether some pin sees version v while newer is the next newer version. */
static bool pin_sees(const shm_table *t, uint32_t v, uint32_t newer)
{
    for (unsigned i = 0; i < SHM_MAX_PINS; i++) {
        uint32_t p = atomic_load_explicit(&t->pins[i], memory_order_acquire);
        if (p && v <= p && p < newer) return true;
    }
    return false;
}

/* The bucket that holds hash h now: during a rehash, an old bucket not yet moved. */
static _Atomic shm_ref *bucket_for(const stash_arena *a, const shm_table *t, uint32_t h)
{
    uint32_t log2 = atomic_load_explicit(&t->log2, memory_order_relaxed);
    shm_off old = atomic_load_explicit(&t->old_buckets, memory_order_relaxed);
    if (old) {
        uint32_t ob = h & ((1u << (log2 - 1)) - 1);
        if (ob >= atomic_load_explicit(&t->migrate_pos, memory_order_relaxed))
            return &bucket_array(a, old)[ob];
    }
    shm_off cur = atomic_load_explicit(&t->buckets, memory_order_relaxed);
    return &bucket_array(a, cur)[h & ((1u << log2) - 1)];
}

/* Byte equality without a call for the short keys and namespaces of most jobs. */
static inline bool bytes_equal(const uint8_t *x, const uint8_t *y, size_t n)
{
    if (n == 8) {
        uint64_t a, b;
        memcpy(&a, x, 8);
        memcpy(&b, y, 8);
        return a == b;
    }
    return n == 0 || memcmp(x, y, n) == 0;
}

static bool rec_matches(const shm_rec *r, const shm_lookup *l)
{
    return r->hash == l->hash && r->state == l->state && r->klen == l->klen &&
           r->nslen == l->nslen && bytes_equal(shm_rec_key(r), l->key, l->klen) &&
           bytes_equal(shm_rec_ns(r), l->ns, l->nslen);
}

/* The newest version of the chain from rec at or below version, or NULL. */
static shm_rec *version_at(stash_arena *a, shm_rec *rec, uint32_t version)
{
    while (rec && rec->version > version)
        rec = shm_rec_at(a, atomic_load_explicit(&rec->older, memory_order_acquire));
    return rec;
}

#define SPINS_BEFORE_CHECK (1u << 20)

/* Whether key group kg's owner is gone (then a change it left half done
 * stays so until a new owner recovers the key group). */
static bool owner_gone(const stash_arena *a, uint32_t kg)
{
    const shm_kg_heap *h = &a->heaps[kg];
    return !shm_proc_alive(atomic_load(&h->owner_pid), atomic_load(&h->owner_start));
}

/* Waits for an even value of seq (no change under way) into *out. Returns
 * false if the owner died in the middle of its change. */
static bool wait_even(const stash_arena *a, uint32_t kg, _Atomic uint32_t *seq, uint32_t *out)
{
    for (uint32_t spins = 1;; spins++) {
        *out = atomic_load_explicit(seq, memory_order_acquire);
        if (!(*out & 1)) return true;
        if (spins % SPINS_BEFORE_CHECK == 0 && owner_gone(a, kg)) return false;
        __builtin_ia32_pause();
    }
}

static int owner_died(const stash_arena *a, uint32_t kg)
{
    return shm_fail(-EAGAIN,
                    "%s: key group %u: its owner died in the middle of a change; a new "
                    "owner recovers it",
                    a->path, kg);
}

/* ---- reclamation -------------------------------------------------------- */

static void reclaim(stash_arena *a, shm_table *t, bool check_dead)
{
    retire_ring *ring = shm_ptr(a, atomic_load(&t->retired));
    if (!ring) return;
    uint32_t len = ring_len(ring);
    uint64_t min = shm_ebr_min(a, check_dead || len >= RECLAIM_CHECK_DEAD);
    for (uint32_t head = ring_head(ring); len && ring->items[head].epoch < min;) {
        /* Off the ring first: a crash then leaks the block, never frees it twice. */
        shm_off off = ring->items[head].off;
        head = (head + 1) % ring->cap;
        ring_set(ring, head, --len);
        shm_free(a, off);
    }
    /* Later retirements get a newer epoch than any reader announced so far. */
    atomic_fetch_add(&a->hdr->ebr_epoch, 1);
}

/* Switches the table to a ring of twice the capacity. Returns 0 or an error. */
static int grow_ring(stash_arena *a, uint32_t kg)
{
    shm_table *t = &a->tables[kg];
    retire_ring *old = shm_ptr(a, atomic_load(&t->retired));
    uint32_t cap = old ? old->cap * 2 : RECLAIM_BATCH * 2, len = old ? ring_len(old) : 0;
    shm_off fresh;
    int rc = shm_alloc(a, kg, sizeof(retire_ring) + cap * sizeof(retired_item), &fresh);
    if (rc < 0) return rc;
    retire_ring *r = shm_ptr(a, fresh);
    r->cap = cap;
    for (uint32_t i = 0; i < len; i++) r->items[i] = old->items[(ring_head(old) + i) % old->cap];
    ring_set(r, 0, len);
    atomic_store(&t->retired, fresh);
    if (old) shm_free(a, shm_off_of(a, old));
    return 0;
}

/* Frees off once every reader announced after now: for when the arena has
 * no room left for the ring itself. */
static void free_after_readers(stash_arena *a, shm_off off)
{
    uint64_t e = atomic_fetch_add(&a->hdr->ebr_epoch, 1);
    while (shm_ebr_min(a, true) <= e) {
    }
    shm_free(a, off);
}

/* Queues off for freeing once no reader can hold it. If the ring cannot grow
 * (arena full), waits for the readers instead of losing the block. */
static void retire(stash_arena *a, uint32_t kg, shm_off off)
{
    shm_table *t = &a->tables[kg];
    retire_ring *r = shm_ptr(a, atomic_load(&t->retired));
    if ((!r || ring_len(r) == r->cap) && grow_ring(a, kg) < 0 && r)
        while (ring_len(r) == r->cap) reclaim(a, t, true);
    r = shm_ptr(a, atomic_load(&t->retired));
    if (!r) {
        free_after_readers(a, off);
        return;
    }
    uint32_t head = ring_head(r), len = ring_len(r);
    /* The unlink must be visible before the epoch is read: a reader that
     * announces a later epoch then cannot still reach off. */
    atomic_thread_fence(memory_order_seq_cst);
    r->items[(head + len) % r->cap] = (retired_item){off, atomic_load(&a->hdr->ebr_epoch)};
    ring_set(r, head, ++len);
    if (len % RECLAIM_BATCH == 0) reclaim(a, t, false);
}

static void retire_rec(stash_arena *a, uint32_t kg, shm_rec *r)
{
    retire(a, kg, shm_off_of(a, r));
}

/* ---- growth ------------------------------------------------------------- */

static int new_buckets(stash_arena *a, uint32_t kg, uint32_t log2, shm_off *out)
{
    size_t bytes = sizeof(shm_ref) << log2;
    int rc = shm_alloc(a, kg, bytes, out);
    if (rc == 0) memset(a->base + *out, 0, bytes);
    return rc;
}

static void shape_begin(shm_table *t)
{
    atomic_fetch_add(&t->shape_seq, 1);
}
static void shape_end(shm_table *t)
{
    atomic_fetch_add(&t->shape_seq, 1);
}

/* Makes t->growing the bucket array, the current one the array being
 * emptied. Idempotent, so that recovery can repeat it after a crash. */
static void switch_buckets(stash_arena *a, shm_table *t)
{
    shm_off fresh = atomic_load(&t->growing);
    if (atomic_load(&t->buckets) != fresh) {
        atomic_store(&t->old_buckets, atomic_load(&t->buckets));
        atomic_store(&t->migrate_pos, 0);
        atomic_store(&t->buckets, fresh);
    }
    if ((sizeof(shm_ref) << t->log2) != shm_block_size(a, fresh))
        atomic_store(&t->log2, t->log2 + 1);
    atomic_store(&t->growing, 0);
}

/* Opens a move of records between buckets: false (and nothing opened) while
 * a reader process may be walking the table. A walker announces itself, then
 * waits for an even shape; the owner makes the shape odd, then looks for
 * walkers: one of the two always sees the other. */
static bool moves_begin(stash_arena *a, shm_table *t)
{
    shape_begin(t);
    if (!shm_ebr_readers_active(a)) return true;
    shape_end(t);
    /* A reader that died announced would hold moves back for ever. */
    if (++t->moves_held % 1024 == 0) shm_ebr_min(a, true);
    return false;
}

static void rehash_start(stash_arena *a, uint32_t kg)
{
    shm_table *t = &a->tables[kg];
    shm_off fresh;
    if (new_buckets(a, kg, t->log2 + 1, &fresh) < 0) return; /* grow later; chains just lengthen */
    if (!moves_begin(a, t)) {
        shm_free(a, fresh);
        return;
    }
    atomic_store(&t->growing, fresh);
    switch_buckets(a, t);
    shape_end(t);
}

/* Links the record in t->moving at the head of its new bucket. Idempotent,
 * so that recovery can repeat it after a crash at any point. */
static void finish_move(stash_arena *a, shm_table *t)
{
    shm_ref r = atomic_load(&t->moving);
    shm_rec *rec = shm_rec_at(a, r);
    _Atomic shm_ref *dst = &bucket_array(a, t->buckets)[rec->hash & ((1u << t->log2) - 1)];
    for (shm_ref x = atomic_load(dst); x; x = atomic_load(&shm_rec_at(a, x)->next))
        if (x == r) goto done;
    atomic_store(&rec->next, atomic_load(dst));
    atomic_store(dst, r);
done:
    atomic_store(&t->moving, 0);
}

/* Empties old bucket migrate_pos into the new array, one record at a time,
 * each held in t->moving while it is in neither chain, then advances
 * migrate_pos: lookups of that bucket's hashes go to the new array only once
 * all of it is there. Recovery repeats it for a bucket a crash left half done. */
static void move_bucket(stash_arena *a, shm_table *t)
{
    uint32_t pos = atomic_load(&t->migrate_pos);
    _Atomic shm_ref *from = &bucket_array(a, atomic_load(&t->old_buckets))[pos];
    for (shm_ref r = atomic_load(from); r; r = atomic_load(from)) {
        atomic_store(&t->moving, r);
        atomic_store(from, atomic_load(&shm_rec_at(a, r)->next));
        finish_move(a, t);
    }
    atomic_store(&t->migrate_pos, pos + 1);
}

/* Moves n old buckets into the new array; retires the old array when done. */
static void rehash_step(stash_arena *a, uint32_t kg, uint32_t n)
{
    shm_table *t = &a->tables[kg];
    shm_off old = atomic_load(&t->old_buckets);
    uint32_t old_n = 1u << (t->log2 - 1);
    if (!moves_begin(a, t)) return;
    for (; n > 0 && atomic_load(&t->migrate_pos) < old_n; n--) move_bucket(a, t);
    bool done = atomic_load(&t->migrate_pos) == old_n;
    if (done) atomic_store(&t->old_buckets, 0);
    shape_end(t);
    if (done) retire(a, kg, old);
}

/* ---- pruning: dropping versions no pin sees any more ------------------- */

/* Drops the versions behind head that no pin sees; a tombstone head that
 * hides nothing any more is unlinked. Returns the record the chain's link
 * should point at (head, or what followed it). */
static void prune_versions(stash_arena *a, uint32_t kg, shm_rec *head)
{
    shm_table *t = &a->tables[kg];
    shm_rec *newer = head;
    shm_ref r = atomic_load(&head->older);
    while (r) {
        shm_rec *v = shm_rec_at(a, r);
        shm_ref next = atomic_load(&v->older);
        if (pin_sees(t, v->version, newer->version)) {
            newer = v;
        } else {
            atomic_store(&newer->older, next);
            retire_rec(a, kg, v);
        }
        r = next;
    }
}

static void sweep_step(stash_arena *a, uint32_t kg, uint32_t budget)
{
    shm_table *t = &a->tables[kg];
    uint32_t end = shm_table_positions(a, kg);
    for (; budget > 0 && t->sweep_pos < end; budget--, t->sweep_pos++) {
        _Atomic shm_ref *link =
            t->sweep_pos < (1u << t->log2)
                ? &bucket_array(a, t->buckets)[t->sweep_pos]
                : &bucket_array(a, t->old_buckets)[t->sweep_pos - (1u << t->log2)];
        for (shm_ref r = atomic_load(link); r; r = atomic_load(link)) {
            shm_rec *rec = shm_rec_at(a, r);
            prune_versions(a, kg, rec);
            if ((rec->flags & SHM_REC_TOMBSTONE) && !atomic_load(&rec->older)) {
                atomic_store(link, atomic_load(&rec->next));
                retire_rec(a, kg, rec);
                continue;
            }
            link = &rec->next;
        }
    }
    if (t->sweep_pos >= end) t->sweep_pos = UINT32_MAX;
}

void shm_table_maintain(stash_arena *a, uint32_t kg, uint32_t budget)
{
    shm_table *t = &a->tables[kg];
    /* A sweep runs to its end, then another starts if pins changed meanwhile:
     * restarting on every unpin could starve the end of the table. */
    uint32_t gen = atomic_load(&t->pins_gen);
    if (gen != t->swept_gen && t->buckets && t->sweep_pos == UINT32_MAX) {
        t->swept_gen = gen;
        t->sweep_pos = 0;
    }
    if (t->sweep_pos != UINT32_MAX) {
        sweep_step(a, kg, budget);
        return;
    }
    if (atomic_load(&t->old_buckets))
        rehash_step(a, kg, budget);
    else if (t->buckets && atomic_load(&t->count) > (1ull << t->log2) / 2)
        rehash_start(a, kg);
}

/* ---- the owner's operations --------------------------------------------- */

/* Whether the table has background work: a sweep, a rehash, or growth. */
static bool work_pending(const shm_table *t)
{
    return t->sweep_pos != UINT32_MAX ||
           atomic_load_explicit(&t->pins_gen, memory_order_relaxed) != t->swept_gen ||
           atomic_load_explicit(&t->old_buckets, memory_order_relaxed) ||
           atomic_load_explicit(&t->count, memory_order_relaxed) > (1ull << t->log2) / 2;
}

int shm_table_reserve(stash_arena *a, uint32_t kg, uint64_t n)
{
    shm_table *t = &a->tables[kg];
    if (atomic_load(&t->buckets)) return 0;
    uint32_t log2 = INITIAL_LOG2;
    while (log2 < 31 && (1ull << log2) < 2 * n) log2++;
    shm_off b;
    int rc = new_buckets(a, kg, log2, &b);
    if (rc < 0) return rc;
    atomic_store(&t->log2, log2);
    atomic_store_explicit(&t->buckets, b, memory_order_release);
    return 0;
}

void shm_table_tend(stash_arena *a, uint32_t kg)
{
    shm_table *t = &a->tables[kg];
    if (t->buckets && work_pending(t)) shm_table_maintain(a, kg, WRITE_BUDGET);
}

int shm_table_find(stash_arena *a, const shm_lookup *l, shm_cursor *c)
{
    shm_table *t = &a->tables[l->kg];
    if (!atomic_load_explicit(&t->buckets, memory_order_relaxed)) {
        shm_off b;
        int rc = new_buckets(a, l->kg, INITIAL_LOG2, &b);
        if (rc < 0) return rc;
        atomic_store(&t->log2, INITIAL_LOG2);
        atomic_store_explicit(&t->buckets, b, memory_order_release);
    }
    _Atomic shm_ref *link = bucket_for(a, t, l->hash);
    c->link = link;
    c->rec = NULL;
    for (shm_ref r = atomic_load_explicit(link, memory_order_relaxed); r;) {
        shm_rec *rec = shm_rec_at(a, r);
        if (rec_matches(rec, l)) {
            c->link = link;
            c->rec = rec;
            return 0;
        }
        link = &rec->next;
        r = atomic_load_explicit(link, memory_order_relaxed);
    }
    return 0;
}

bool shm_rec_mutable(const stash_arena *a, uint32_t kg, const shm_rec *rec)
{
    return rec->version == atomic_load_explicit(&a->tables[kg].epoch, memory_order_relaxed);
}

uint64_t shm_rec_capacity(const stash_arena *a, const shm_rec *rec)
{
    /* The class in the header spares a look at the span descriptors. */
    uint64_t block = rec->size_class == SHM_CLASS_LARGE ? shm_block_size(a, shm_off_of(a, rec))
                                                        : shm_class_size(rec->size_class);
    return block - sizeof *rec - rec->klen - rec->nslen;
}

int shm_rec_new(stash_arena *a, const shm_lookup *l, size_t cap, shm_rec **out)
{
    shm_off off;
    size_t size = sizeof(shm_rec) + l->klen + l->nslen + cap;
    int rc = shm_alloc(a, l->kg, size, &off);
    if (rc < 0) return rc;
    shm_rec *r = shm_ptr(a, off);
    atomic_store_explicit(&r->next, 0, memory_order_relaxed);
    atomic_store_explicit(&r->older, 0, memory_order_relaxed);
    atomic_store_explicit(&r->seq, 0, memory_order_relaxed);
    r->version = atomic_load_explicit(&a->tables[l->kg].epoch, memory_order_relaxed);
    r->hash = l->hash;
    r->state = l->state;
    r->flags = 0;
    r->size_class = (uint8_t)(size > SHM_SMALL_MAX ? SHM_CLASS_LARGE : shm_size_class(size));
    r->klen = l->klen;
    r->nslen = l->nslen;
    atomic_store_explicit(&r->vlen, 0, memory_order_relaxed);
    memcpy((uint8_t *)(r + 1), l->key, l->klen);
    memcpy((uint8_t *)(r + 1) + l->klen, l->ns, l->nslen);
    *out = r;
    return 0;
}

static void count_add(shm_table *t, int64_t d)
{
    uint64_t n = atomic_load_explicit(&t->count, memory_order_relaxed);
    atomic_store_explicit(&t->count, n + (uint64_t)d, memory_order_relaxed);
}

/* Counts a change. Maintenance waits for the owner's next lookup, so that
 * no cursor the caller holds is moved under it. */
static void after_change(stash_arena *a, uint32_t kg)
{
    shm_table *t = &a->tables[kg];
    uint64_t w = atomic_load_explicit(&t->writes, memory_order_relaxed);
    atomic_store_explicit(&t->writes, w + 1, memory_order_relaxed);
}

void shm_table_publish(stash_arena *a, const shm_lookup *l, shm_cursor *c, shm_rec *rec)
{
    shm_table *t = &a->tables[l->kg];
    shm_rec *old = c->rec;
    rec->version = atomic_load_explicit(&t->epoch, memory_order_relaxed);
    if (!old) {
        atomic_store_explicit(&rec->next, atomic_load(c->link), memory_order_relaxed);
        atomic_store_explicit(c->link, shm_ref_of(shm_off_of(a, rec)), memory_order_release);
        count_add(t, 1);
    } else {
        bool keep = old->version <= max_pin(t);
        atomic_store_explicit(&rec->next, atomic_load(&old->next), memory_order_relaxed);
        atomic_store_explicit(&rec->older,
                              keep ? shm_ref_of(shm_off_of(a, old)) : atomic_load(&old->older),
                              memory_order_relaxed);
        atomic_store_explicit(c->link, shm_ref_of(shm_off_of(a, rec)), memory_order_release);
        if (old->flags & SHM_REC_TOMBSTONE) count_add(t, 1);
        if (!keep) retire_rec(a, l->kg, old);
    }
    c->rec = rec;
    after_change(a, l->kg);
}

int shm_table_delete(stash_arena *a, const shm_lookup *l, shm_cursor *c)
{
    shm_table *t = &a->tables[l->kg];
    shm_rec *old = c->rec;
    if (!old || (old->flags & SHM_REC_TOMBSTONE)) return 0;
    if (max_pin(t)) {
        /* A pinned reader may still see old or what it keeps: leave a tombstone. */
        shm_rec *tomb;
        int rc = shm_rec_new(a, l, 0, &tomb);
        if (rc < 0) return rc;
        tomb->flags = SHM_REC_TOMBSTONE;
        shm_table_publish(a, l, c, tomb);
        count_add(t, -1);
        return 0;
    }
    atomic_store_explicit(c->link, atomic_load(&old->next), memory_order_release);
    for (shm_ref r = atomic_load(&old->older); r;) {
        shm_rec *v = shm_rec_at(a, r);
        r = atomic_load(&v->older);
        retire_rec(a, l->kg, v);
    }
    retire_rec(a, l->kg, old);
    c->rec = NULL;
    count_add(t, -1);
    after_change(a, l->kg);
    return 0;
}

bool shm_rec_write_begin(stash_arena *a, uint32_t kg, shm_rec *rec, const shm_region *r, unsigned n)
{
    shm_undo *u = &a->tables[kg].undo;
    uint32_t vlen = atomic_load_explicit(&rec->vlen, memory_order_relaxed), used = 0;
    if (n > SHM_UNDO_REGIONS) return false;
    for (unsigned i = 0; i < n; i++) {
        /* Only bytes below the old length hold anything to restore. */
        uint32_t len = r[i].off >= vlen             ? 0
                       : r[i].len < vlen - r[i].off ? r[i].len
                                                    : vlen - r[i].off;
        if (used + len > SHM_UNDO_BYTES) return false;
        u->regions[i] = (shm_region){r[i].off, len};
        memcpy(u->bytes + used, shm_rec_value(rec) + r[i].off, len);
        used += len;
    }
    u->nregions = n;
    u->vlen = vlen;
    atomic_store_explicit(&u->rec, shm_ref_of(shm_off_of(a, rec)), memory_order_release);
    atomic_store_explicit(&rec->seq, atomic_load_explicit(&rec->seq, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    return true;
}

void shm_rec_write_end(stash_arena *a, uint32_t kg, shm_rec *rec)
{
    atomic_store_explicit(&rec->seq, atomic_load_explicit(&rec->seq, memory_order_relaxed) + 1,
                          memory_order_release);
    atomic_store_explicit(&a->tables[kg].undo.rec, 0, memory_order_release);
}

void shm_table_recover(stash_arena *a, uint32_t kg)
{
    shm_table *t = &a->tables[kg];
    if (atomic_load(&t->growing)) switch_buckets(a, t);
    /* The owner's own pins belong to checkpoints it took, which fail with it:
     * release them (a pin stored without its new epoch, never handed out,
     * included), or nobody ever would. Pins held for a live reader process
     * (the persistence engine) stay: it releases them itself. */
    uint32_t holders = atomic_load(&t->pin_holders);
    for (unsigned i = 0; i < SHM_MAX_PINS; i++) {
        uint32_t holder = holders >> (8 * i) & 0xffu;
        if (holder && shm_reader_alive(a, holder)) continue;
        if (atomic_exchange(&t->pins[i], 0)) atomic_fetch_add(&t->pins_gen, 1);
    }
    shm_ref moving = atomic_load(&t->moving);
    shm_off old = atomic_load(&t->old_buckets);
    if (moving) {
        /* Moves take the head of the old bucket: if it still is, unlink it first. */
        _Atomic shm_ref *head = &bucket_array(a, old)[atomic_load(&t->migrate_pos)];
        if (atomic_load(head) == moving)
            atomic_store(head, atomic_load(&shm_rec_at(a, moving)->next));
        finish_move(a, t);
    }
    /* A bucket half moved hides what already moved: finish it. */
    if (old && atomic_load(&t->migrate_pos) < (1u << (t->log2 - 1))) move_bucket(a, t);
    shm_undo *u = &t->undo;
    shm_rec *rec = shm_rec_at(a, atomic_load(&u->rec));
    if (rec && (atomic_load(&rec->seq) & 1)) {
        uint32_t used = 0;
        for (unsigned i = 0; i < u->nregions; i++) {
            memcpy(shm_rec_value(rec) + u->regions[i].off, u->bytes + used, u->regions[i].len);
            used += u->regions[i].len;
        }
        atomic_store(&rec->vlen, u->vlen);
        atomic_fetch_add(&rec->seq, 1);
    }
    atomic_store(&u->rec, 0);
    if (atomic_load(&t->shape_seq) & 1) atomic_fetch_add(&t->shape_seq, 1);
    /* The count follows a link store: a crash between them leaves it one off. */
    uint64_t live = 0;
    uint32_t n = shm_table_positions(a, kg);
    for (uint32_t pos = 0; pos < n; pos++)
        for (shm_ref r = shm_table_bucket(a, kg, pos); r; r = atomic_load(&shm_rec_at(a, r)->next))
            live += shm_rec_live(shm_rec_at(a, r));
    atomic_store(&t->count, live);
}

/* ---- pins ---------------------------------------------------------------- */

int64_t shm_table_pin(stash_arena *a, uint32_t kg)
{
    return shm_table_pin_for(a, kg, 0);
}

int64_t shm_table_pin_for(stash_arena *a, uint32_t kg, uint32_t holder)
{
    shm_table *t = &a->tables[kg];
    for (unsigned i = 0; i < SHM_MAX_PINS; i++) {
        if (atomic_load(&t->pins[i])) continue;
        uint32_t v = atomic_load(&t->epoch);
        /* The holder first: recovery reads it once it sees the pin. */
        uint32_t hs = atomic_load(&t->pin_holders) & ~(0xffu << (8 * i));
        atomic_store(&t->pin_holders, hs | (holder & 0xffu) << (8 * i));
        atomic_store(&t->pins[i], v);
        atomic_store(&t->epoch, v + 1);
        return v;
    }
    return shm_fail(-EBUSY, "%s: key group %u already has %u versions pinned", a->path, kg,
                    SHM_MAX_PINS);
}

void shm_table_release_holder(stash_arena *a, uint32_t holder)
{
    for (uint32_t kg = 0; kg < a->hdr->max_parallelism; kg++) {
        shm_table *t = &a->tables[kg];
        uint32_t holders = atomic_load(&t->pin_holders);
        for (unsigned i = 0; i < SHM_MAX_PINS; i++) {
            uint32_t v = atomic_load(&t->pins[i]);
            if (v && (holders >> (8 * i) & 0xffu) == holder &&
                atomic_compare_exchange_strong(&t->pins[i], &v, 0))
                atomic_fetch_add(&t->pins_gen, 1);
        }
    }
}

void shm_table_unpin(stash_arena *a, uint32_t kg, uint32_t version)
{
    shm_table *t = &a->tables[kg];
    for (unsigned i = 0; i < SHM_MAX_PINS; i++) {
        uint32_t v = version;
        if (atomic_compare_exchange_strong(&t->pins[i], &v, 0)) {
            atomic_fetch_add(&t->pins_gen, 1);
            return;
        }
    }
}

shm_rec *shm_table_get_at(stash_arena *a, const shm_lookup *l, uint32_t version)
{
    shm_table *t = &a->tables[l->kg];
    for (;;) {
        uint32_t shape;
        if (!wait_even(a, l->kg, &t->shape_seq, &shape)) return NULL;
        if (!atomic_load_explicit(&t->buckets, memory_order_acquire)) return NULL;
        for (shm_ref r = atomic_load_explicit(bucket_for(a, t, l->hash), memory_order_acquire);
             r;) {
            shm_rec *rec = shm_rec_at(a, r);
            if (rec_matches(rec, l)) {
                rec = version_at(a, rec, version);
                return shm_rec_live(rec) ? rec : NULL;
            }
            r = atomic_load_explicit(&rec->next, memory_order_acquire);
        }
        /* Not found: a move may have carried it off; look again if one did. */
        if (atomic_load_explicit(&t->shape_seq, memory_order_acquire) == shape) return NULL;
    }
}

/* A walk waits for a move under way to end (moves then wait for it). */
static int walk_begin(const stash_arena *a, uint32_t kg)
{
    uint32_t shape;
    return wait_even(a, kg, &a->tables[kg].shape_seq, &shape) ? 0 : owner_died(a, kg);
}

/* Calls each(a, head, ctx) for the head of every chain of kg, after a move
 * under way ended; stops at the first non-zero result. */
typedef int head_fn(stash_arena *a, shm_rec *head, void *ctx);
#define WALK_AHEAD 16u /* buckets whose first record a walk fetches ahead */

static int walk_heads(stash_arena *a, uint32_t kg, head_fn *each, void *ctx)
{
    int rc = walk_begin(a, kg);
    uint32_t n = shm_table_positions(a, kg);
    for (uint32_t pos = 0; rc == 0 && pos < n; pos++) {
        /* Records lie anywhere in the key group's heap: fetching ahead lets
         * their cache misses overlap instead of following one another. */
        if (pos + WALK_AHEAD < n) {
            const char *ahead =
                (const char *)shm_rec_at(a, shm_table_bucket(a, kg, pos + WALK_AHEAD));
            if (ahead) {
                __builtin_prefetch(ahead);
                __builtin_prefetch(ahead + 64);
                __builtin_prefetch(ahead + 128);
            }
        }
        for (shm_ref r = shm_table_bucket(a, kg, pos); rc == 0 && r;) {
            shm_rec *rec = shm_rec_at(a, r);
            r = atomic_load_explicit(&rec->next, memory_order_acquire);
            rc = each(a, rec, ctx);
        }
    }
    return rc;
}

typedef struct at_walk {
    uint32_t version;
    shm_visit_fn *fn;
    void *ctx;
} at_walk;

static int visit_at(stash_arena *a, shm_rec *head, void *ctx)
{
    at_walk *w = ctx;
    shm_rec *v = version_at(a, head, w->version);
    return shm_rec_live(v) ? w->fn(v, w->ctx) : 0;
}

int shm_table_walk_at(stash_arena *a, uint32_t kg, uint32_t version, shm_visit_fn *fn, void *ctx)
{
    at_walk w = {version, fn, ctx};
    return walk_heads(a, kg, visit_at, &w);
}

typedef struct delta_walk {
    uint32_t base;
    uint32_t version;
    shm_delta_fn *fn;
    void *ctx;
} delta_walk;

static int visit_delta(stash_arena *a, shm_rec *head, void *ctx)
{
    delta_walk *w = ctx;
    shm_rec *now = version_at(a, head, w->version), *then = version_at(a, head, w->base);
    if (now == then || (!shm_rec_live(now) && !shm_rec_live(then))) return 0;
    return shm_rec_live(now) ? w->fn(now, false, w->ctx) : w->fn(then, true, w->ctx);
}

int shm_table_walk_delta(stash_arena *a, uint32_t kg, uint32_t base, uint32_t version,
                         shm_delta_fn *fn, void *ctx)
{
    delta_walk w = {base, version, fn, ctx};
    return walk_heads(a, kg, visit_delta, &w);
}

uint32_t shm_table_positions(const stash_arena *a, uint32_t kg)
{
    const shm_table *t = &a->tables[kg];
    if (!t->buckets) return 0;
    uint32_t n = 1u << t->log2;
    return t->old_buckets ? n + n / 2 : n;
}

shm_ref shm_table_bucket(const stash_arena *a, uint32_t kg, uint32_t pos)
{
    const shm_table *t = &a->tables[kg];
    uint32_t n = 1u << t->log2;
    if (pos < n)
        return atomic_load_explicit(&bucket_array(a, t->buckets)[pos], memory_order_acquire);
    return atomic_load_explicit(&bucket_array(a, t->old_buckets)[pos - n], memory_order_acquire);
}

/* ---- readers in other processes ----------------------------------------- */

/* Copies rec's value under its sequence lock. Returns its length, -ENOMEM,
 * or -EAGAIN if the owner died in the middle of rewriting it. */
static int64_t copy_stable(const stash_arena *a, uint32_t kg, shm_rec *rec, uint8_t **buf,
                           size_t *cap)
{
    for (;;) {
        uint32_t s;
        if (!wait_even(a, kg, &rec->seq, &s)) return owner_died(a, kg);
        uint32_t len = atomic_load_explicit(&rec->vlen, memory_order_relaxed);
        if (len > *cap) {
            uint8_t *grown = realloc(*buf, len);
            if (!grown) return -ENOMEM;
            *buf = grown;
            *cap = len;
        }
        memcpy(*buf, shm_rec_value(rec), len);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&rec->seq, memory_order_relaxed) == s) return len;
    }
}

int64_t shm_table_read_copy(stash_arena *a, uint32_t reader_slot, const shm_lookup *l,
                            uint8_t **buf, size_t *cap)
{
    shm_table *t = &a->tables[l->kg];
    int64_t rc = STASH_ENOTFOUND;
    shm_ebr_enter(a, reader_slot);
    for (;;) {
        uint32_t shape;
        if (!wait_even(a, l->kg, &t->shape_seq, &shape)) {
            rc = owner_died(a, l->kg);
            break;
        }
        if (!atomic_load_explicit(&t->buckets, memory_order_acquire)) break;
        shm_rec *found = NULL;
        bool confused = false;
        /* Only a move under way can send a walk round in circles; after many
         * steps, a changed shape says so (retry), an unchanged one that the
         * chain is merely long (tombstones kept for pins): go on. */
        uint64_t steps = 0;
        for (shm_ref r = atomic_load_explicit(bucket_for(a, t, l->hash), memory_order_acquire);
             r;) {
            shm_rec *rec = shm_rec_at(a, r);
            if (rec_matches(rec, l)) {
                found = rec;
                break;
            }
            r = atomic_load_explicit(&rec->next, memory_order_acquire);
            if (++steps % 4096 == 0 &&
                atomic_load_explicit(&t->shape_seq, memory_order_acquire) != shape) {
                confused = true;
                break;
            }
        }
        if (found) {
            rc = shm_rec_live(found) ? copy_stable(a, l->kg, found, buf, cap) : STASH_ENOTFOUND;
            break;
        }
        if (!confused && atomic_load_explicit(&t->shape_seq, memory_order_acquire) == shape) break;
    }
    shm_ebr_exit(a, reader_slot);
    return rc;
}
