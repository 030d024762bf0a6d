/*
 * table.c: a key group's keyed table: an open-addressing index of versioned
 * records, written by the key group's owner and read by anyone.
 *
 * Invariants the rest of stash relies on:
 * - One writer: only the key group's owner changes its table, so the owner's
 *   own reads need no synchronisation and its views stay valid until its
 *   next change.
 * - The index: groups of eight slots (hash, reference), probed group by group
 *   from the hash's home group until a group with an EMPTY slot. A slot only
 *   goes from EMPTY to used, and from used to DELETED (never back to EMPTY),
 *   so an entry is always reachable from its home without crossing an EMPTY
 *   slot. A lookup compares the eight hashes of a group at once and reads
 *   only the records whose hash matches: one miss for the group, one for the
 *   record.
 * - Versions: every record carries the table epoch in which it was written.
 *   Pinning a version starts a new epoch; a record written before the pin is
 *   never changed in place again (shm_rec_mutable), and replacing or deleting
 *   it keeps it behind the new version (older) for as long as a pin may see
 *   it. So a reader pinned to version v sees the table exactly as of v.
 * - Readers in other processes follow references without locks: a slot's
 *   reference is written before its hash, an entry is replaced by storing one
 *   reference, an unlinked record is freed only after every reader that could
 *   hold it has left (ebr.c), an in-place change is bracketed by the record's
 *   sequence lock, and moving entries between index arrays is bracketed by
 *   the table's shape sequence, so a reader that missed a key because of a
 *   move looks again.
 * - Growing never stops the world: when the index is 7/8 used, a new one
 *   (room for twice the live entries) takes every new entry and the owner
 *   moves a few groups of the old one into it per write. Lookups probe the
 *   old array first, skipping the groups already moved (an entry can only be
 *   in a group not moved yet, at or after its home, with no EMPTY slot
 *   between), then the new one. Moves wait while a walker walks the key group
 *   (a checkpoint), so a walk sees each entry in one place.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__) && !defined(__SANITIZE_THREAD__)
#include <emmintrin.h>
#define GROUP_SIMD 1
#endif

#include "shm/hash.h"
#include "shm/shm.h"

#define INITIAL_LOG2 1u   /* groups of a new index */
#define RECLAIM_BATCH 64u /* retired objects that trigger a reclamation */
#define RECLAIM_CHECK_DEAD 4096u
#define WALK_AHEAD 16u /* slots whose record a walk fetches ahead */

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

static shm_group *groups_at(const stash_arena *a, shm_off off)
{
    return (shm_group *)(a->base + off);
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

/* ---- groups -------------------------------------------------------------- */

/* The slots of g whose hash is h: bit 2i for slot i. */
static inline unsigned group_match(const shm_group *g, uint32_t h)
{
#ifdef GROUP_SIMD
    /* Aligned 16-byte loads read each 4-byte hash whole. */
    const __m128i *p = (const __m128i *)(const void *)g->hash;
    __m128i want = _mm_set1_epi32((int)h);
    __m128i eq = _mm_packs_epi32(_mm_cmpeq_epi32(_mm_load_si128(p), want),
                                 _mm_cmpeq_epi32(_mm_load_si128(p + 1), want));
    return (unsigned)_mm_movemask_epi8(eq) & 0x5555u;
#else
    unsigned m = 0;
    for (unsigned i = 0; i < SHM_GROUP_SLOTS; i++)
        m |= (unsigned)(atomic_load_explicit(&g->hash[i], memory_order_relaxed) == h) << (2 * i);
    return m;
#endif
}

static inline unsigned next_slot(unsigned *mask)
{
    unsigned i = (unsigned)__builtin_ctz(*mask) >> 1;
    *mask &= *mask - 1;
    return i;
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

/* State, key length and namespace length lie side by side in both. */
_Static_assert(offsetof(shm_rec, klen) == offsetof(shm_rec, state) + 2 &&
                   offsetof(shm_rec, nslen) == offsetof(shm_rec, state) + 4 &&
                   offsetof(shm_lookup, klen) == offsetof(shm_lookup, state) + 2 &&
                   offsetof(shm_lookup, nslen) == offsetof(shm_lookup, state) + 4,
               "state, klen and nslen are compared as one word");

static inline bool rec_matches(const shm_rec *r, const shm_lookup *l)
{
    uint64_t x, y;
    memcpy(&x, &r->state, 8);
    memcpy(&y, &l->state, 8);
    return ((x ^ y) & 0xffffffffffffull) == 0 && bytes_equal(shm_rec_key(r), l->key, l->klen) &&
           (l->nslen == 0 || memcmp(shm_rec_ns(r), l->ns, l->nslen) == 0);
}

/* The record of slot i of g whose hash matched, fetched whole: its value
 * usually spans the next two cache lines, which then arrive with the first. */
static inline shm_rec *slot_rec(const stash_arena *a, const shm_group *g, unsigned i)
{
    shm_rec *r = shm_rec_at(a, atomic_load_explicit(&g->ref[i], memory_order_acquire));
    if (r) {
        __builtin_prefetch((const char *)r + 64);
        __builtin_prefetch((const char *)r + 128);
    }
    return r;
}

/* One array of an index: its groups, their count, and the first group not
 * moved yet (0 for the current array). */
typedef struct index_part {
    shm_group *g;
    uint32_t n;
    uint32_t from;
} index_part;

/* The part's group where a probe for hash h starts, and the next one. Groups
 * below from have moved: probes skip them, wrapping to from. */
static inline uint32_t probe_start(const index_part *p, uint32_t h)
{
    uint32_t g = h & (p->n - 1);
    return g < p->from ? p->from : g;
}
static inline uint32_t probe_next(const index_part *p, uint32_t g)
{
    return g + 1 == p->n ? p->from : g + 1;
}

/* Finds l in p: its group and slot and record, or NULL. With free_g, the
 * first free slot on the way (for an insert) goes there. */
static shm_rec *probe(const stash_arena *a, const index_part *p, const shm_lookup *l,
                      shm_group **at, unsigned *slot, shm_group **free_g, unsigned *free_slot)
{
    uint32_t g = probe_start(p, l->hash);
    for (uint32_t steps = p->from; steps < p->n; steps++, g = probe_next(p, g)) {
        shm_group *grp = &p->g[g];
        unsigned m = group_match(grp, l->hash);
        atomic_thread_fence(memory_order_acquire);
        while (m) {
            unsigned i = next_slot(&m);
            shm_rec *r = slot_rec(a, grp, i);
            if (r && rec_matches(r, l)) {
                *at = grp;
                *slot = i;
                return r;
            }
        }
        unsigned empty = group_match(grp, SHM_SLOT_EMPTY);
        if (free_g && !*free_g) {
            unsigned f = empty | group_match(grp, SHM_SLOT_DELETED);
            if (f) {
                *free_g = grp;
                *free_slot = (unsigned)__builtin_ctz(f) >> 1;
            }
        }
        if (empty) break;
    }
    return NULL;
}

/* The owner's parts: the array being emptied (n 0 if none) and the current one. */
static void owner_parts(const stash_arena *a, const shm_table *t, index_part *old, index_part *cur)
{
    shm_off o = atomic_load_explicit(&t->old_index, memory_order_relaxed);
    *old = (index_part){o ? groups_at(a, o) : NULL,
                        o ? 1u << atomic_load_explicit(&t->old_log2, memory_order_relaxed) : 0,
                        o ? atomic_load_explicit(&t->migrate_pos, memory_order_relaxed) : 0};
    *cur = (index_part){groups_at(a, atomic_load_explicit(&t->index, memory_order_relaxed)),
                        1u << atomic_load_explicit(&t->log2, memory_order_relaxed), 0};
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

/* A reader's view of the index: both parts as of one even shape. */
typedef struct index_view {
    index_part old, cur;
    uint32_t shape;
    bool any; /* the table has an index */
} index_view;

/* Takes a view of kg's index. Returns false if the owner died mid-move. */
static bool view_take(const stash_arena *a, uint32_t kg, index_view *v)
{
    shm_table *t = &a->tables[kg];
    for (;;) {
        if (!wait_even(a, kg, &t->shape_seq, &v->shape)) return false;
        shm_off cur = atomic_load_explicit(&t->index, memory_order_acquire);
        shm_off old = atomic_load_explicit(&t->old_index, memory_order_acquire);
        uint32_t log2 = atomic_load_explicit(&t->log2, memory_order_acquire);
        uint32_t old_log2 = atomic_load_explicit(&t->old_log2, memory_order_acquire);
        uint32_t from = atomic_load_explicit(&t->migrate_pos, memory_order_acquire);
        if (atomic_load_explicit(&t->shape_seq, memory_order_acquire) != v->shape) continue;
        v->any = cur != 0;
        v->cur = (index_part){cur ? groups_at(a, cur) : NULL, cur ? 1u << log2 : 0, 0};
        v->old =
            (index_part){old ? groups_at(a, old) : NULL, old ? 1u << old_log2 : 0, old ? from : 0};
        return true;
    }
}

/* The head of l's entry in a view, or NULL. */
static shm_rec *view_find(const stash_arena *a, const index_view *v, const shm_lookup *l)
{
    shm_group *g;
    unsigned i;
    shm_rec *r = v->old.n ? probe(a, &v->old, l, &g, &i, NULL, NULL) : NULL;
    if (!r && v->cur.n) r = probe(a, &v->cur, l, &g, &i, NULL, NULL);
    return r;
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

static int new_index(stash_arena *a, uint32_t kg, uint32_t log2, shm_off *out)
{
    size_t bytes = sizeof(shm_group) << log2;
    int rc = shm_alloc(a, kg, bytes, out);
    if (rc == 0) memset(a->base + *out, 0, bytes);
    return rc;
}

/* The groups for an index of at least slots slots. */
static uint32_t log2_for_slots(uint64_t slots)
{
    uint32_t log2 = INITIAL_LOG2;
    while (log2 < 28 && ((uint64_t)SHM_GROUP_SLOTS << log2) < slots) log2++;
    return log2;
}

static void set_grow_at(shm_table *t)
{
    uint32_t slots = SHM_GROUP_SLOTS << t->log2;
    t->grow_at = slots - slots / 8;
}

static void shape_begin(shm_table *t)
{
    atomic_fetch_add(&t->shape_seq, 1);
}
static void shape_end(shm_table *t)
{
    atomic_fetch_add(&t->shape_seq, 1);
}

/* Clears the walks announced from reader slots whose process died. */
static void forget_dead_walkers(stash_arena *a, shm_table *t)
{
    uint32_t w = atomic_load(&t->walkers);
    for (uint32_t i = 0; i < SHM_READERS; i++)
        if ((w >> i & 1u) && !shm_reader_alive(a, i + 1)) atomic_fetch_and(&t->walkers, ~(1u << i));
}

/* Opens a move of entries between index arrays: false (and nothing opened)
 * while a walker walks the table. A walker announces itself, then waits for
 * an even shape; the owner makes the shape odd, then looks for walkers: one
 * of the two always sees the other. */
static bool moves_begin(stash_arena *a, shm_table *t)
{
    shape_begin(t);
    if (!atomic_load(&t->walkers)) return true;
    shape_end(t);
    if (++t->moves_held % 1024 == 0) forget_dead_walkers(a, t);
    return false;
}

/* Opens a move, waiting for the table's walkers to leave (a walk of one key
 * group, or a walker that died). */
static void moves_begin_waiting(stash_arena *a, shm_table *t)
{
    for (uint32_t spins = 1; !moves_begin(a, t); spins++) {
        if (spins % 1024 == 0) forget_dead_walkers(a, t);
        __builtin_ia32_pause();
    }
}

/* Makes t->growing the index, the current one the array being emptied.
 * Idempotent, so that recovery can repeat it after a crash. */
static void switch_index(shm_table *t)
{
    shm_off fresh = atomic_load(&t->growing);
    if (atomic_load(&t->index) != fresh) {
        atomic_store(&t->old_log2, atomic_load(&t->log2));
        atomic_store(&t->migrate_pos, 0);
        atomic_store(&t->old_index, atomic_load(&t->index));
        atomic_store(&t->index, fresh);
    }
    atomic_store(&t->log2, atomic_load(&t->growing_log2));
    atomic_store(&t->used, 0);
    t->old_left = t->heads;
    set_grow_at(t);
    atomic_fetch_add(&t->resizes, 1);
    atomic_store(&t->growing, 0);
}

/* Starts a growth into an index for twice the live entries. A switch moves
 * nothing, so it does not wait for walkers: they keep the arrays they took,
 * and every entry new since then is newer than the version they walk. */
static void grow_start(stash_arena *a, uint32_t kg)
{
    shm_table *t = &a->tables[kg];
    uint32_t log2 = log2_for_slots(2 * ((uint64_t)t->heads + 1));
    shm_off fresh;
    if (new_index(a, kg, log2, &fresh) < 0) {
        /* No room: try again when half the rest has filled, until inserts
         * find the index full. */
        t->grow_at += ((SHM_GROUP_SLOTS << t->log2) - t->grow_at) / 2;
        return;
    }
    atomic_store(&t->growing_log2, log2);
    atomic_store(&t->growing, fresh);
    shape_begin(t);
    switch_index(t);
    shape_end(t);
}

/* Puts (h, r) into a free slot of the current index. */
static void insert_slot(stash_arena *a, shm_table *t, uint32_t h, shm_ref r)
{
    index_part cur = {groups_at(a, atomic_load(&t->index)), 1u << atomic_load(&t->log2), 0};
    uint32_t g = probe_start(&cur, h);
    for (uint32_t steps = 0; steps < cur.n; steps++, g = probe_next(&cur, g)) {
        shm_group *grp = &cur.g[g];
        unsigned empty = group_match(grp, SHM_SLOT_EMPTY);
        unsigned f = empty | group_match(grp, SHM_SLOT_DELETED);
        if (!f) continue;
        unsigned i = (unsigned)__builtin_ctz(f) >> 1;
        bool was_empty = atomic_load(&grp->hash[i]) == SHM_SLOT_EMPTY;
        atomic_store_explicit(&grp->ref[i], r, memory_order_relaxed);
        atomic_store_explicit(&grp->hash[i], h, memory_order_release);
        if (was_empty) atomic_store(&t->used, atomic_load(&t->used) + 1);
        return;
    }
}

/* Whether the current index holds reference r under hash h. */
static bool index_holds(const stash_arena *a, const shm_table *t, uint32_t h, shm_ref r)
{
    index_part cur = {groups_at(a, atomic_load(&t->index)), 1u << atomic_load(&t->log2), 0};
    uint32_t g = probe_start(&cur, h);
    for (uint32_t steps = 0; steps < cur.n; steps++, g = probe_next(&cur, g)) {
        const shm_group *grp = &cur.g[g];
        for (unsigned m = group_match(grp, h); m;)
            if (atomic_load(&grp->ref[next_slot(&m)]) == r) return true;
        if (group_match(grp, SHM_SLOT_EMPTY)) return false;
    }
    return false;
}

/* Moves the entries of old group migrate_pos into the index, marking each
 * moved slot DELETED, then advances migrate_pos: lookups skip the group only
 * once all of it is there. After a crash (recovering) an entry may already
 * be in both: it is then only marked. */
static void move_group(stash_arena *a, shm_table *t, bool recovering)
{
    uint32_t pos = atomic_load(&t->migrate_pos);
    shm_group *g = &groups_at(a, atomic_load(&t->old_index))[pos];
    for (unsigned i = 0; i < SHM_GROUP_SLOTS; i++) {
        uint32_t h = atomic_load(&g->hash[i]);
        shm_ref r = atomic_load(&g->ref[i]);
        if (h >= 2 && r) {
            if (!(recovering && index_holds(a, t, h, r))) insert_slot(a, t, h, r);
            t->old_left--;
        }
        if (h != SHM_SLOT_EMPTY) atomic_store(&g->hash[i], SHM_SLOT_DELETED);
        atomic_store(&g->ref[i], 0);
    }
    atomic_store(&t->migrate_pos, pos + 1);
}

/* Moves up to n old groups (all if n is UINT32_MAX); retires the old array
 * when it is empty. With wait, waits for walkers instead of putting it off. */
static void migrate(stash_arena *a, uint32_t kg, uint32_t n, bool wait)
{
    shm_table *t = &a->tables[kg];
    shm_off old = atomic_load(&t->old_index);
    uint32_t old_n = 1u << atomic_load(&t->old_log2);
    if (wait)
        moves_begin_waiting(a, t);
    else if (!moves_begin(a, t))
        return;
    for (; n > 0 && atomic_load(&t->migrate_pos) < old_n; n--) move_group(a, t, false);
    bool done = atomic_load(&t->migrate_pos) == old_n;
    if (done) {
        atomic_store(&t->old_index, 0);
        atomic_fetch_add(&t->resizes, 1);
    }
    shape_end(t);
    if (done) retire(a, kg, old);
}

/* Keeps room for the next insert: grows at 7/8 used. While the old array
 * is still being emptied, inserts go on into the index; should walkers hold
 * the moves back until what is left to move would fill the index to 15/16,
 * the move is finished first, waiting for them. */
static void make_room(stash_arena *a, uint32_t kg)
{
    shm_table *t = &a->tables[kg];
    if (atomic_load(&t->old_index)) {
        uint32_t slots = SHM_GROUP_SLOTS << t->log2;
        if ((uint64_t)atomic_load(&t->used) + t->old_left < slots - slots / 16) return;
        migrate(a, kg, UINT32_MAX, true);
    }
    if (atomic_load(&t->used) > t->grow_at) grow_start(a, kg);
}

/* ---- pruning: dropping versions no pin sees any more ------------------- */

/* Drops the versions behind head that no pin sees. */
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

/* The slot at scan position pos of the owner's parts: the old array's slots
 * first, then the current one's. */
static bool scan_slot(const index_part *old, const index_part *cur, uint32_t pos, shm_group **g,
                      unsigned *i)
{
    uint32_t old_slots = old->n * SHM_GROUP_SLOTS;
    const index_part *p = pos < old_slots ? old : cur;
    uint32_t at = pos < old_slots ? pos : pos - old_slots;
    if (p == cur && at >= cur->n * SHM_GROUP_SLOTS) return false;
    *g = &p->g[at / SHM_GROUP_SLOTS];
    *i = at % SHM_GROUP_SLOTS;
    return true;
}

/* Marks slot i of g DELETED: the entry is gone from the index. */
static void slot_clear(shm_table *t, shm_group *g, unsigned i, bool in_old)
{
    atomic_store_explicit(&g->hash[i], SHM_SLOT_DELETED, memory_order_release);
    atomic_store_explicit(&g->ref[i], 0, memory_order_release);
    t->heads--;
    if (in_old) t->old_left--;
}

static void sweep_step(stash_arena *a, uint32_t kg, uint32_t budget)
{
    shm_table *t = &a->tables[kg];
    /* Positions shift when the arrays change: start over. */
    if (atomic_load(&t->resizes) != t->sweep_resizes) {
        t->sweep_resizes = atomic_load(&t->resizes);
        t->sweep_pos = 0;
    }
    index_part old, cur;
    owner_parts(a, t, &old, &cur);
    if (t->sweep_pos < old.from * SHM_GROUP_SLOTS) t->sweep_pos = old.from * SHM_GROUP_SLOTS;
    for (uint32_t n = budget * SHM_GROUP_SLOTS; n > 0; n--, t->sweep_pos++) {
        shm_group *g;
        unsigned i;
        if (!scan_slot(&old, &cur, t->sweep_pos, &g, &i)) {
            t->sweep_pos = UINT32_MAX;
            return;
        }
        if (atomic_load(&g->hash[i]) < 2) continue;
        shm_rec *rec = shm_rec_at(a, atomic_load(&g->ref[i]));
        if (!rec) continue;
        prune_versions(a, kg, rec);
        if ((rec->flags & SHM_REC_TOMBSTONE) && !atomic_load(&rec->older)) {
            slot_clear(t, g, i, t->sweep_pos < old.n * SHM_GROUP_SLOTS);
            retire_rec(a, kg, rec);
        }
    }
}

void shm_table_maintain(stash_arena *a, uint32_t kg, uint32_t budget)
{
    shm_table *t = &a->tables[kg];
    if (!atomic_load(&t->index)) return;
    make_room(a, kg);
    /* A sweep runs to its end, then another starts if pins changed meanwhile:
     * restarting on every unpin could starve the end of the table. */
    uint32_t gen = atomic_load(&t->pins_gen);
    if (gen != t->swept_gen && t->sweep_pos == UINT32_MAX) {
        t->swept_gen = gen;
        t->sweep_pos = 0;
        t->sweep_resizes = atomic_load(&t->resizes);
    }
    if (t->sweep_pos != UINT32_MAX)
        sweep_step(a, kg, budget);
    else if (atomic_load(&t->old_index))
        migrate(a, kg, budget, false);
}

/* ---- the owner's operations --------------------------------------------- */

static int index_create(stash_arena *a, uint32_t kg, uint32_t log2)
{
    shm_table *t = &a->tables[kg];
    shm_off fresh;
    int rc = new_index(a, kg, log2, &fresh);
    if (rc < 0) return rc;
    atomic_store(&t->log2, log2);
    atomic_store(&t->used, 0);
    t->heads = t->old_left = 0;
    set_grow_at(t);
    atomic_store_explicit(&t->index, fresh, memory_order_release);
    return 0;
}

int shm_table_reserve(stash_arena *a, uint32_t kg, uint64_t n)
{
    if (atomic_load(&a->tables[kg].index)) return 0;
    /* Filled to n, it should not have to grow: n at most 7/8 of the slots. */
    return index_create(a, kg, log2_for_slots(n + n / 7 + 1));
}

/* shm_table_find past its first look: the whole probe, noting where a new
 * entry would go; while the index grows, the old array first. */
static __attribute__((noinline)) int find_probe(stash_arena *a, const shm_table *t,
                                                const shm_lookup *l, shm_cursor *c)
{
    index_part old, cur;
    owner_parts(a, t, &old, &cur);
    shm_group *free_g = NULL;
    unsigned free_i = 0;
    c->rec = old.n ? probe(a, &old, l, &c->group, &c->slot, NULL, NULL) : NULL;
    c->in_old = c->rec != NULL;
    if (c->rec) return 0;
    c->rec = probe(a, &cur, l, &c->group, &c->slot, &free_g, &free_i);
    if (!c->rec) {
        c->group = free_g;
        c->slot = free_i;
    }
    return 0;
}

int shm_table_find(stash_arena *a, const shm_lookup *l, shm_cursor *c)
{
    shm_table *t = &a->tables[l->kg];
    shm_off index = atomic_load_explicit(&t->index, memory_order_relaxed);
    if (__builtin_expect(!index, 0)) {
        int rc = index_create(a, l->kg, INITIAL_LOG2);
        if (rc < 0) return rc;
        index = atomic_load_explicit(&t->index, memory_order_relaxed);
    }
    /* The common case first: one array, the entry in its home group. */
    if (__builtin_expect(atomic_load_explicit(&t->old_index, memory_order_relaxed) == 0, 1)) {
        uint32_t mask = (1u << atomic_load_explicit(&t->log2, memory_order_relaxed)) - 1;
        shm_group *grp = &groups_at(a, index)[l->hash & mask];
        unsigned m = group_match(grp, l->hash);
        if (__builtin_expect(m != 0, 1)) {
            unsigned i = next_slot(&m);
            shm_rec *r = slot_rec(a, grp, i);
            if (__builtin_expect(r && rec_matches(r, l), 1)) {
                *c = (shm_cursor){.group = grp, .slot = i, .in_old = false, .rec = r};
                return 0;
            }
        }
    }
    return find_probe(a, t, l, c);
}

int shm_rec_new(stash_arena *a, const shm_lookup *l, size_t cap, shm_rec **out)
{
    shm_off off;
    size_t size = sizeof(shm_rec) + l->klen + l->nslen + cap;
    int rc = shm_alloc(a, l->kg, size, &off);
    if (rc < 0) return rc;
    shm_rec *r = shm_ptr(a, off);
    atomic_store_explicit(&r->older, 0, memory_order_relaxed);
    atomic_store_explicit(&r->seq, 0, memory_order_relaxed);
    r->version = atomic_load_explicit(&a->tables[l->kg].epoch, memory_order_relaxed);
    atomic_store_explicit(&r->vlen, 0, memory_order_relaxed);
    r->state = l->state;
    r->klen = l->klen;
    r->nslen = l->nslen;
    r->flags = 0;
    r->size_class = (uint8_t)(size > SHM_SMALL_MAX ? SHM_CLASS_LARGE : shm_size_class(size));
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
static void after_change(shm_table *t)
{
    uint64_t w = atomic_load_explicit(&t->writes, memory_order_relaxed);
    atomic_store_explicit(&t->writes, w + 1, memory_order_relaxed);
}

/* A free slot of the current index for l's new entry into c; false if none. */
static bool find_free(stash_arena *a, const shm_table *t, const shm_lookup *l, shm_cursor *c)
{
    index_part cur = {groups_at(a, atomic_load(&t->index)), 1u << atomic_load(&t->log2), 0};
    uint32_t g = probe_start(&cur, l->hash);
    for (uint32_t steps = 0; steps < cur.n; steps++, g = probe_next(&cur, g)) {
        unsigned f =
            group_match(&cur.g[g], SHM_SLOT_EMPTY) | group_match(&cur.g[g], SHM_SLOT_DELETED);
        if (f) {
            c->group = &cur.g[g];
            c->slot = (unsigned)__builtin_ctz(f) >> 1;
            c->in_old = false;
            return true;
        }
    }
    return false;
}

int shm_table_publish(stash_arena *a, const shm_lookup *l, shm_cursor *c, shm_rec *rec)
{
    shm_table *t = &a->tables[l->kg];
    shm_rec *old = c->rec;
    rec->version = atomic_load_explicit(&t->epoch, memory_order_relaxed);
    shm_ref ref = shm_ref_of(shm_off_of(a, rec));
    if (!old) {
        if ((!c->group || c->in_old) && !find_free(a, t, l, c))
            return shm_fail(STASH_EFULL,
                            "%s: key group %u: its index is full and the arena has no room to "
                            "grow it",
                            a->path, l->kg);
        shm_group *g = c->group;
        bool was_empty =
            atomic_load_explicit(&g->hash[c->slot], memory_order_relaxed) == SHM_SLOT_EMPTY;
        atomic_store_explicit(&g->ref[c->slot], ref, memory_order_relaxed);
        atomic_store_explicit(&g->hash[c->slot], l->hash, memory_order_release);
        if (was_empty)
            atomic_store_explicit(&t->used,
                                  atomic_load_explicit(&t->used, memory_order_relaxed) + 1,
                                  memory_order_relaxed);
        t->heads++;
        count_add(t, 1);
    } else {
        bool keep = old->version <= max_pin(t);
        atomic_store_explicit(&rec->older,
                              keep ? shm_ref_of(shm_off_of(a, old)) : atomic_load(&old->older),
                              memory_order_relaxed);
        atomic_store_explicit(&c->group->ref[c->slot], ref, memory_order_release);
        if (old->flags & SHM_REC_TOMBSTONE) count_add(t, 1);
        if (!keep) retire_rec(a, l->kg, old);
    }
    c->rec = rec;
    after_change(t);
    return 0;
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
    slot_clear(t, c->group, c->slot, c->in_old);
    for (shm_ref r = atomic_load(&old->older); r;) {
        shm_rec *v = shm_rec_at(a, r);
        r = atomic_load(&v->older);
        retire_rec(a, l->kg, v);
    }
    retire_rec(a, l->kg, old);
    /* The slot is free for a new entry of l, unless it lies in the old array. */
    if (c->in_old) c->group = NULL;
    c->rec = NULL;
    count_add(t, -1);
    after_change(t);
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

bool shm_rec_overwrite(stash_arena *a, uint32_t kg, shm_rec *rec, const void *value, size_t len)
{
    /* shm_rec_write_begin for the one region at the start, written out. */
    shm_undo *u = &a->tables[kg].undo;
    uint32_t vlen = atomic_load_explicit(&rec->vlen, memory_order_relaxed);
    uint32_t save = vlen < len ? vlen : (uint32_t)len;
    if (save > SHM_UNDO_BYTES) return false;
    u->regions[0] = (shm_region){0, save};
    memcpy(u->bytes, shm_rec_value(rec), save);
    u->nregions = 1;
    u->vlen = vlen;
    atomic_store_explicit(&u->rec, shm_ref_of(shm_off_of(a, rec)), memory_order_release);
    atomic_store_explicit(&rec->seq, atomic_load_explicit(&rec->seq, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    memcpy(shm_rec_value(rec), value, len);
    atomic_store_explicit(&rec->vlen, (uint32_t)len, memory_order_relaxed);
    shm_rec_write_end(a, kg, rec);
    return true;
}

void shm_rec_write_end(stash_arena *a, uint32_t kg, shm_rec *rec)
{
    atomic_store_explicit(&rec->seq, atomic_load_explicit(&rec->seq, memory_order_relaxed) + 1,
                          memory_order_release);
    atomic_store_explicit(&a->tables[kg].undo.rec, 0, memory_order_release);
}

/* Recounts the live entries and the used slots (each count follows a slot
 * store: a crash between them leaves it one off). */
static void recount(stash_arena *a, uint32_t kg)
{
    shm_table *t = &a->tables[kg];
    uint64_t live = 0;
    uint32_t used = 0, heads = 0, old_left = 0, pos = 0, h;
    index_part old, cur;
    owner_parts(a, t, &old, &cur);
    for (shm_rec *r; (r = shm_table_next(a, kg, &pos, &h));) {
        live += shm_rec_live(r);
        heads++;
        old_left += pos <= old.n * SHM_GROUP_SLOTS;
    }
    for (uint32_t g = 0; g < cur.n; g++)
        for (unsigned i = 0; i < SHM_GROUP_SLOTS; i++)
            used += atomic_load(&cur.g[g].hash[i]) != SHM_SLOT_EMPTY;
    atomic_store(&t->count, live);
    atomic_store(&t->used, used);
    t->heads = heads;
    t->old_left = old_left;
}

void shm_table_recover(stash_arena *a, uint32_t kg)
{
    shm_table *t = &a->tables[kg];
    if (atomic_load(&t->growing)) switch_index(t);
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
    /* A group half moved: finish it (what already moved is only marked). */
    shm_off old = atomic_load(&t->old_index);
    if (old && atomic_load(&t->migrate_pos) < (1u << atomic_load(&t->old_log2)))
        move_group(a, t, true);
    /* A delete stores DELETED before clearing the reference. */
    index_part po, pc;
    owner_parts(a, t, &po, &pc);
    const index_part *parts[2] = {&po, &pc};
    for (int p = 0; p < 2; p++)
        for (uint32_t g = parts[p]->from; g < parts[p]->n; g++)
            for (unsigned i = 0; i < SHM_GROUP_SLOTS; i++)
                if (atomic_load(&parts[p]->g[g].hash[i]) < 2)
                    atomic_store(&parts[p]->g[g].ref[i], 0);
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
    if (atomic_load(&t->index)) {
        set_grow_at(t);
        recount(a, kg);
    }
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
        if (holder >= 1 && holder <= SHM_READERS)
            atomic_fetch_and(&t->walkers, ~(1u << (holder - 1)));
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

/* The newest version of the chain from rec at or below version, or NULL. */
static shm_rec *version_at(stash_arena *a, shm_rec *rec, uint32_t version)
{
    while (rec && rec->version > version)
        rec = shm_rec_at(a, atomic_load_explicit(&rec->older, memory_order_acquire));
    return rec;
}

shm_rec *shm_table_get_at(stash_arena *a, const shm_lookup *l, uint32_t version)
{
    shm_table *t = &a->tables[l->kg];
    for (;;) {
        index_view v;
        if (!view_take(a, l->kg, &v) || !v.any) return NULL;
        shm_rec *head = view_find(a, &v, l);
        if (head) {
            shm_rec *rec = version_at(a, head, version);
            return shm_rec_live(rec) ? rec : NULL;
        }
        /* Not found: a move may have carried it off; look again if one did. */
        if (atomic_load_explicit(&t->shape_seq, memory_order_acquire) == v.shape) return NULL;
    }
}

/* ---- walks --------------------------------------------------------------- */

void shm_table_walk_enter(stash_arena *a, uint32_t kg, uint32_t slot)
{
    shm_ebr_enter(a, slot);
    if (slot >= STASH_MAX_WORKERS)
        atomic_fetch_or(&a->tables[kg].walkers, 1u << (slot - STASH_MAX_WORKERS));
}

void shm_table_walk_exit(stash_arena *a, uint32_t kg, uint32_t slot)
{
    if (slot >= STASH_MAX_WORKERS)
        atomic_fetch_and(&a->tables[kg].walkers, ~(1u << (slot - STASH_MAX_WORKERS)));
    shm_ebr_exit(a, slot);
}

/* Calls each(a, head, ctx) for the head of every entry of kg, from a view
 * taken after a move under way ended; stops at the first non-zero result. */
typedef int head_fn(stash_arena *a, shm_rec *head, void *ctx);

static int walk_part(stash_arena *a, const index_part *p, head_fn *each, void *ctx)
{
    uint32_t end = p->n * SHM_GROUP_SLOTS;
    int rc = 0;
    for (uint32_t pos = p->from * SHM_GROUP_SLOTS; rc == 0 && pos < end; pos++) {
        /* Records lie anywhere in the key group's heap: fetching ahead lets
         * their cache misses overlap instead of following one another. */
        if (pos + WALK_AHEAD < end) {
            const shm_group *ahead = &p->g[(pos + WALK_AHEAD) / SHM_GROUP_SLOTS];
            const char *r = (const char *)shm_rec_at(
                a, atomic_load_explicit(&ahead->ref[(pos + WALK_AHEAD) % SHM_GROUP_SLOTS],
                                        memory_order_relaxed));
            if (r) {
                __builtin_prefetch(r);
                __builtin_prefetch(r + 64);
                __builtin_prefetch(r + 128);
            }
        }
        const shm_group *g = &p->g[pos / SHM_GROUP_SLOTS];
        unsigned i = pos % SHM_GROUP_SLOTS;
        if (atomic_load_explicit(&g->hash[i], memory_order_acquire) < 2) continue;
        shm_rec *rec = shm_rec_at(a, atomic_load_explicit(&g->ref[i], memory_order_acquire));
        if (rec) rc = each(a, rec, ctx);
    }
    return rc;
}

static int walk_heads(stash_arena *a, uint32_t kg, head_fn *each, void *ctx)
{
    index_view v;
    if (!view_take(a, kg, &v)) return owner_died(a, kg);
    int rc = v.old.n ? walk_part(a, &v.old, each, ctx) : 0;
    return rc == 0 && v.cur.n ? walk_part(a, &v.cur, each, ctx) : rc;
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

shm_rec *shm_table_next(const stash_arena *a, uint32_t kg, uint32_t *pos, uint32_t *hash)
{
    const shm_table *t = &a->tables[kg];
    if (!atomic_load(&t->index)) return NULL;
    index_part old, cur;
    owner_parts(a, t, &old, &cur);
    uint32_t p = *pos < old.from * SHM_GROUP_SLOTS ? old.from * SHM_GROUP_SLOTS : *pos;
    shm_group *g;
    unsigned i;
    for (; scan_slot(&old, &cur, p, &g, &i); p++) {
        uint32_t h = atomic_load(&g->hash[i]);
        shm_rec *r = h < 2 ? NULL : shm_rec_at(a, atomic_load(&g->ref[i]));
        if (r) {
            *pos = p + 1;
            *hash = h;
            return r;
        }
    }
    *pos = p;
    return NULL;
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
        index_view v;
        if (!view_take(a, l->kg, &v)) {
            rc = owner_died(a, l->kg);
            break;
        }
        if (!v.any) break;
        shm_rec *found = view_find(a, &v, l);
        if (found) {
            rc = shm_rec_live(found) ? copy_stable(a, l->kg, found, buf, cap) : STASH_ENOTFOUND;
            break;
        }
        if (atomic_load_explicit(&t->shape_seq, memory_order_acquire) == v.shape) break;
    }
    shm_ebr_exit(a, reader_slot);
    return rc;
}
