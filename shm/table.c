/* SPDX-License-Identifier: MIT */
/*
 * table.c: a key group's keyed table: the versioned records its index
 * (index.c) finds, written by the key group's owner and read by anyone.
 *
 * Invariants the rest of stash relies on:
 * - One writer: only the key group's owner changes its table, so the owner's
 *   own reads need no synchronisation and its views stay valid until its
 *   next change.
 * - Versions: every record carries the table epoch in which it was written.
 *   Pinning a version starts a new epoch; a record a pin sees (written at or
 *   before it) is never changed in place (shm_rec_mutable) unless saved to
 *   the pre-image log first (shm_rec_save, while only walks pin), and
 *   replacing or deleting it otherwise keeps it behind the new version
 *   (older) for as long as a pin may see it. So a reader pinned to version v
 *   sees the table exactly as of v.
 * - Readers in other processes follow references without locks: an entry is
 *   replaced by storing one reference, an unlinked record is freed only after
 *   every reader that could hold it has left (ebr.c), and an in-place change
 *   is bracketed by the record's sequence lock.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "shm/table.h"

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

/* The newest pin: the epoch stays past it. */
static uint32_t max_pin(const shm_table *t)
{
    uint32_t m = 0;
    for (unsigned i = 0; i < SHM_MAX_PINS; i++) {
        uint32_t p = atomic_load_explicit(&t->pins[i], memory_order_acquire);
        if (p > m) m = p;
    }
    return m;
}

/* The newest pin that sees versions as of itself (a reader's or a walk's,
 * not a base's): records at or below it are kept or saved when they change. */
static uint32_t max_seen_pin(const shm_table *t)
{
    uint32_t m = 0, bases = atomic_load_explicit(&t->pin_base, memory_order_acquire);
    for (unsigned i = 0; i < SHM_MAX_PINS; i++) {
        uint32_t p = atomic_load_explicit(&t->pins[i], memory_order_acquire);
        if (p > m && !(bases >> i & 1u)) m = p;
    }
    return m;
}

/* Whether a base pin lies below version v: a tombstone of v is then a
 * change that a delta from it must find. While the engine keeps deltas
 * (hdr->change_track) every pin counts: a cut's pins are walks' until their
 * key groups are serialized, then the next delta's base, so that a delete
 * under them must leave its tombstone from the cut on. */
static bool base_below(const stash_arena *a, const shm_table *t, uint32_t v)
{
    uint32_t bases = atomic_load_explicit(&a->hdr->change_track, memory_order_relaxed)
                         ? UINT32_MAX
                         : atomic_load_explicit(&t->pin_base, memory_order_acquire);
    for (unsigned i = 0; i < SHM_MAX_PINS; i++) {
        uint32_t p = atomic_load_explicit(&t->pins[i], memory_order_acquire);
        if (p && p < v && (bases >> i & 1u)) return true;
    }
    return false;
}

/* Whether some pin sees version v while newer is the next newer version. */
static bool pin_sees(const shm_table *t, uint32_t v, uint32_t newer)
{
    uint32_t bases = atomic_load_explicit(&t->pin_base, memory_order_acquire);
    for (unsigned i = 0; i < SHM_MAX_PINS; i++) {
        uint32_t p = atomic_load_explicit(&t->pins[i], memory_order_acquire);
        if (p && v <= p && p < newer && !(bases >> i & 1u)) return true;
    }
    return false;
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

/* Retires r and every older version it keeps. */
static void retire_chain(stash_arena *a, uint32_t kg, shm_rec *r)
{
    while (r) {
        shm_rec *older = shm_rec_at(a, shm_rec_older(a, r));
        retire_rec(a, kg, r);
        r = older;
    }
}

/* ---- the pre-image log ---------------------------------------------------- */

#define PRELOG_FIRST (4u << 10)  /* bytes of a log's first chunk; each next one twice */
#define PRELOG_CHUNK (64u << 10) /* up to this, unless an entry needs more */

static shm_prelog_chunk *chunk_at(const stash_arena *a, shm_off off)
{
    return off ? (shm_prelog_chunk *)(a->base + off) : NULL;
}

/* The chunk of kg's log with room for n bytes: the newest, or a new one
 * linked before it. NULL if the arena has no room. */
static shm_prelog_chunk *prelog_room(stash_arena *a, uint32_t kg, uint32_t n)
{
    shm_table *t = &a->tables[kg];
    shm_prelog_chunk *c = chunk_at(a, atomic_load_explicit(&t->prelog, memory_order_relaxed));
    if (c && c->cap - atomic_load_explicit(&c->used, memory_order_relaxed) >= n) return c;
    /* Chunks a walker held back when the last log went are freed once
     * readers allow, so that this log may take them. */
    if (!c) reclaim(a, t, false);
    uint32_t bytes = c ? 2 * ((uint32_t)sizeof *c + c->cap) : PRELOG_FIRST;
    uint32_t cap = (bytes < PRELOG_CHUNK ? bytes : PRELOG_CHUNK) - (uint32_t)sizeof *c;
    if (n > cap) cap = n;
    shm_off off;
    if (shm_alloc(a, kg, sizeof *c + cap, &off) < 0) return NULL;
    shm_prelog_chunk *fresh = shm_ptr(a, off);
    fresh->older = c ? shm_off_of(a, c) : 0;
    fresh->start = atomic_load_explicit(&t->prelog_end, memory_order_relaxed);
    atomic_store_explicit(&fresh->used, 0, memory_order_relaxed);
    fresh->cap = cap;
    atomic_store_explicit(&t->prelog, off, memory_order_release);
    return fresh;
}

bool shm_rec_save(stash_arena *a, uint32_t kg, shm_rec *rec)
{
    shm_table *t = &a->tables[kg];
    if (!shm_table_walks_only(t) || !shm_rec_live(rec) || shm_rec_older(a, rec)) return false;
    uint32_t rbytes = (uint32_t)sizeof *rec + rec->klen + rec->nslen +
                      atomic_load_explicit(&rec->vlen, memory_order_relaxed);
    uint32_t n = shm_prelog_entry_bytes(rbytes);
    shm_prelog_chunk *c = prelog_room(a, kg, n);
    if (!c) return false;
    /* One bracket over the entry and the new version: a walk that reads the
     * record outside it sees either the old version, the entry not yet in
     * the log it took at its start, or the new one with the entry logged. */
    shm_undo_open(a, &t->undo, rec, SHM_UNDO_SAVE, rec->version);
    uint32_t used = atomic_load_explicit(&c->used, memory_order_relaxed);
    shm_prelog_entry *e = (shm_prelog_entry *)(void *)(c->bytes + used);
    uint32_t until = atomic_load_explicit(&t->epoch, memory_order_relaxed);
    *e = (shm_prelog_entry){shm_ref_of(shm_off_of(a, rec)), until, rbytes, 0};
    shm_rec *copy = (shm_rec *)(e + 1);
    memcpy(copy, rec, rbytes);
    atomic_store_explicit(&copy->seq, 0, memory_order_relaxed);
    copy->flags &= (uint8_t)~SHM_REC_LINKED;
    atomic_store_explicit(&c->used, used + n, memory_order_release);
    atomic_store_explicit(&t->prelog_end, c->start + used + n, memory_order_release);
    shm_rec_write_end(t, rec); /* the new version: until */
    return true;
}

/* The newest entry of t's pre-image log, NULL if none. */
static const shm_prelog_entry *last_entry(const stash_arena *a, const shm_table *t)
{
    const shm_prelog_chunk *c = chunk_at(a, atomic_load(&t->prelog));
    const shm_prelog_entry *last = NULL;
    for (uint32_t at = 0, used = c ? atomic_load(&c->used) : 0; at < used;) {
        last = (const shm_prelog_entry *)(const void *)(c->bytes + at);
        at += shm_prelog_entry_bytes(last->bytes);
    }
    return last;
}

/* The log's entry of a save of rec from version old, cut short by a crash,
 * if it made it into the log whole (the record is then at its new version,
 * *until); NULL if not. */
static const shm_rec *saved_entry(const stash_arena *a, const shm_table *t, shm_ref rec,
                                  uint32_t old, uint32_t *until)
{
    const shm_prelog_entry *last = last_entry(a, t);
    if (!last || last->ref != rec || ((const shm_rec *)(last + 1))->version != old) return NULL;
    *until = last->until;
    return (const shm_rec *)(last + 1);
}

/* Drops kg's log once no pin is left to need it. A walk reads the log
 * only under its pin and inside its walk's announcement: with no pin and no
 * walker announced (read after the log is unlinked, as a walker announces
 * itself before it reads the link), nobody can reach the chunks, which are
 * freed at once; a checkpoint's memory then peaks at the logs of the key
 * groups it has not yet walked, not at every log it made. Otherwise they
 * wait for readers as any retired block. */
static void prelog_drop(stash_arena *a, uint32_t kg)
{
    shm_table *t = &a->tables[kg];
    shm_off off = atomic_exchange(&t->prelog, 0);
    bool unread = atomic_load(&t->walkers) == 0;
    while (off) {
        shm_off older = chunk_at(a, off)->older;
        if (unread)
            shm_free(a, off);
        else
            retire(a, kg, off);
        off = older;
    }
}

/* ---- pruning: dropping versions no pin sees any more ------------------- */

/* Drops the versions behind head that no pin sees. */
static void prune_versions(stash_arena *a, uint32_t kg, shm_rec *head)
{
    shm_table *t = &a->tables[kg];
    shm_rec *newer = head;
    shm_ref r = shm_rec_older(a, head);
    /* A record with an older version is LINKED, so newer always has a link. */
    while (r) {
        shm_rec *v = shm_rec_at(a, r);
        shm_ref next = shm_rec_older(a, v);
        if (pin_sees(t, v->version, newer->version)) {
            newer = v;
        } else {
            atomic_store(shm_rec_link(a, newer), next);
            retire_rec(a, kg, v);
        }
        r = next;
    }
}

static void sweep_step(stash_arena *a, uint32_t kg, uint32_t budget)
{
    shm_table *t = &a->tables[kg];
    /* Positions shift when the arrays change: start over. */
    if (atomic_load(&t->resizes) != t->sweep_resizes) {
        t->sweep_resizes = atomic_load(&t->resizes);
        t->sweep_pos = 0;
    }
    for (uint32_t n = budget * SHM_GROUP_SLOTS; n > 0; n--, t->sweep_pos++) {
        shm_cursor c;
        if (!shm_index_at(a, kg, &t->sweep_pos, &c)) {
            t->sweep_pos = UINT32_MAX;
            return;
        }
        /* Only marked slots: the others' records are not read at all. */
        if (!c.rec || !shm_group_kept(c.group, c.slot)) continue;
        prune_versions(a, kg, c.rec);
        bool older = shm_rec_older(a, c.rec) != 0;
        bool tomb = c.rec->flags & SHM_REC_TOMBSTONE;
        if (tomb && !older && !base_below(a, t, c.rec->version)) {
            shm_index_clear(t, &c);
            retire_rec(a, kg, c.rec);
        } else if (!older && !tomb) {
            shm_group_keep(t, c.group, c.slot, false);
        } else if (t->marked != UINT32_MAX) {
            t->marked++;
        }
    }
}

void shm_table_maintain(stash_arena *a, uint32_t kg, uint32_t budget)
{
    shm_table *t = &a->tables[kg];
    if (!atomic_load(&t->index)) return;
    uint32_t pinned = max_seen_pin(t);
    atomic_store(&t->mutable_from, pinned ? pinned + 1 : 0);
    if (atomic_load(&t->prelog) && !pinned) prelog_drop(a, kg);
    shm_off emptied = shm_index_make_room(a, kg);
    /* A sweep runs to its end, then another starts if pins changed meanwhile:
     * restarting on every unpin could starve the end of the table. */
    uint32_t gen = atomic_load(&t->pins_gen);
    if (gen != t->swept_gen && t->sweep_pos == UINT32_MAX) {
        t->swept_gen = gen;
        /* With no slot marked (pins that only walks held: their records
         * went to the log), there is nothing to drop and no line to read.
         * A sweep counts again the marks it leaves, and those set meanwhile. */
        if (t->marked) {
            t->marked = 0;
            t->sweep_pos = 0;
            t->sweep_resizes = atomic_load(&t->resizes);
        }
    }
    /* Growth first (it ends within a bounded number of writes, and a sweep
     * starts over when it does); the sweep whenever nothing moves. */
    bool moved = false;
    if (!emptied) emptied = shm_index_migrate(a, kg, budget, &moved);
    if (!moved && t->sweep_pos != UINT32_MAX) sweep_step(a, kg, budget);
    if (emptied) {
        /* An old index array is as big as the rest of the index: free it as
         * soon as readers allow, not after the next 64 retirements. */
        retire(a, kg, emptied);
        reclaim(a, t, false);
    }
}

/* ---- the owner's operations --------------------------------------------- */

int shm_rec_new(stash_arena *a, const shm_lookup *l, size_t cap, shm_rec **out)
{
    shm_off off;
    /* Only the owner pins its table, between its writes: a record made with
     * no version pinned is published with none pinned, and keeps nothing. */
    size_t link = max_seen_pin(&a->tables[l->kg]) ? sizeof(shm_ref) : 0;
    size_t size = sizeof(shm_rec) + l->klen + l->nslen + cap + link;
    int rc = shm_alloc(a, l->kg, size, &off);
    if (rc < 0) return rc;
    shm_rec *r = shm_ptr(a, off);
    atomic_store_explicit(&r->seq, 0, memory_order_relaxed);
    r->version = atomic_load_explicit(&a->tables[l->kg].epoch, memory_order_relaxed);
    atomic_store_explicit(&r->vlen, 0, memory_order_relaxed);
    r->state = l->state;
    r->klen = l->klen;
    r->nslen = l->nslen;
    r->flags = link ? SHM_REC_LINKED : 0;
    r->size_class = (uint8_t)(size > SHM_SMALL_MAX ? SHM_CLASS_LARGE : shm_size_class(size));
    if (link) atomic_store_explicit(shm_rec_link(a, r), 0, memory_order_relaxed);
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

int shm_table_publish(stash_arena *a, const shm_lookup *l, shm_cursor *c, shm_rec *rec)
{
    shm_table *t = &a->tables[l->kg];
    shm_rec *old = c->rec;
    rec->version = atomic_load_explicit(&t->epoch, memory_order_relaxed);
    shm_ref ref = shm_ref_of(shm_off_of(a, rec));
    if (!old) {
        int rc = shm_index_insert(a, l, c, ref);
        if (rc) return rc;
        count_add(t, 1);
    } else {
        uint32_t pin = max_seen_pin(t);
        bool linked = rec->flags & SHM_REC_LINKED;
        if (!linked && pin)
            return shm_fail(-EINVAL,
                            "%s: key group %u: a version was pinned between the making of a "
                            "record and its publication",
                            a->path, l->kg);
        /* Saved, old is replaced like a record no pin sees. */
        bool keep = old->version <= pin && !shm_rec_save(a, l->kg, old);
        shm_ref older = !linked ? 0 : keep ? shm_ref_of(shm_off_of(a, old)) : shm_rec_older(a, old);
        if (linked) atomic_store_explicit(shm_rec_link(a, rec), older, memory_order_relaxed);
        atomic_store_explicit(&c->group->ref[c->slot], ref, memory_order_release);
        shm_group_keep(t, c->group, c->slot, older || (rec->flags & SHM_REC_TOMBSTONE));
        if (old->flags & SHM_REC_TOMBSTONE) count_add(t, 1);
        /* Unlinked, rec keeps nothing: nothing is pinned, so old and what it
         * kept go. */
        if (!linked)
            retire_chain(a, l->kg, old);
        else if (!keep)
            retire_rec(a, l->kg, old);
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
    /* No pin sees old, nor anything it keeps, once it is saved. */
    uint32_t pin = max_seen_pin(t);
    if (pin && !shm_rec_older(a, old) && (old->version > pin || shm_rec_save(a, l->kg, old)))
        pin = 0;
    if (pin || base_below(a, t, atomic_load_explicit(&t->epoch, memory_order_relaxed))) {
        /* A pinned reader may still see old or what it keeps, or a delta
         * must find the delete: leave a tombstone. */
        shm_rec *tomb;
        int rc = shm_rec_new(a, l, 0, &tomb);
        if (rc < 0) return rc;
        tomb->flags |= SHM_REC_TOMBSTONE;
        shm_table_publish(a, l, c, tomb);
        count_add(t, -1);
        return 0;
    }
    shm_index_clear(t, c);
    retire_chain(a, l->kg, old);
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
    shm_undo_open(a, u, rec, n, vlen);
    return true;
}

void shm_table_recover(stash_arena *a, uint32_t kg)
{
    shm_table *t = &a->tables[kg];
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
    /* Killed between storing a pin and starting the next epoch: the epoch
     * moves past it, so that nothing is written in place at a pinned version. */
    uint32_t newest = max_pin(t), seen = max_seen_pin(t);
    if (atomic_load(&t->epoch) <= newest) atomic_store(&t->epoch, newest + 1);
    atomic_store(&t->mutable_from, seen ? seen + 1 : 0);
    shm_undo *u = &t->undo;
    shm_rec *rec = shm_rec_at(a, atomic_load(&u->rec));
    if (rec && (atomic_load(&rec->seq) & 1) &&
        (u->nregions == SHM_UNDO_SAVE || u->nregions == SHM_UNDO_SAVE_PUT)) {
        /* A save changes no byte of the value, only the version; a save and
         * a put write the value once the old record is whole in the log,
         * from which it is taken back. */
        uint32_t until = u->vlen;
        const shm_rec *saved = saved_entry(a, t, atomic_load(&u->rec), u->vlen, &until);
        rec->version = until;
        if (saved && u->nregions == SHM_UNDO_SAVE_PUT) {
            uint32_t vlen = atomic_load(&saved->vlen);
            memcpy(shm_rec_value(rec), shm_rec_value((shm_rec *)saved), vlen);
            atomic_store(&rec->vlen, vlen);
        }
        atomic_fetch_add(&rec->seq, 1);
    } else if (rec && (atomic_load(&rec->seq) & 1)) {
        /* Undo the regions' changes, or redo the whole new value, which
         * takes the current version as shm_rec_write_end would have given
         * it (a delta finds the change by it). */
        uint32_t used = 0;
        if (u->nregions == 0) {
            memcpy(shm_rec_value(rec), u->bytes, u->vlen);
            rec->version = atomic_load(&t->epoch);
        }
        for (unsigned i = 0; i < u->nregions; i++) {
            memcpy(shm_rec_value(rec) + u->regions[i].off, u->bytes + used, u->regions[i].len);
            used += u->regions[i].len;
        }
        atomic_store(&rec->vlen, u->vlen);
        atomic_fetch_add(&rec->seq, 1);
    }
    atomic_store(&u->rec, 0);
    shm_index_recover(a, kg);
}

/* ---- pins ---------------------------------------------------------------- */

int64_t shm_table_pin(stash_arena *a, uint32_t kg)
{
    return shm_table_pin_for(a, kg, 0, false);
}

int64_t shm_table_pin_for(stash_arena *a, uint32_t kg, uint32_t holder, bool walk)
{
    shm_table *t = &a->tables[kg];
    for (unsigned i = 0; i < SHM_MAX_PINS; i++) {
        if (atomic_load(&t->pins[i])) continue;
        uint32_t v = atomic_load(&t->epoch);
        /* Read-modify-writes: another process may rebase a pin meanwhile. */
        atomic_fetch_and(&t->pin_base, ~(1u << i));
        atomic_fetch_and(&t->pin_walk, ~(1u << i));
        atomic_fetch_or(&t->pin_walk, (uint32_t)walk << i);
        /* The holder first: recovery reads it once it sees the pin. */
        uint32_t hs = atomic_load(&t->pin_holders) & ~(0xffu << (8 * i));
        atomic_store(&t->pin_holders, hs | (holder & 0xffu) << (8 * i));
        atomic_store(&t->pins[i], v);
        atomic_store(&t->epoch, v + 1);
        atomic_store(&t->mutable_from, v + 1);
        return v;
    }
    return shm_fail(-EBUSY, "%s: key group %u already has %u versions pinned", a->path, kg,
                    SHM_MAX_PINS);
}

void shm_table_release_holder(stash_arena *a, uint32_t holder, const uint32_t *keep)
{
    for (uint32_t kg = 0; kg < a->hdr->max_parallelism; kg++) {
        shm_table *t = &a->tables[kg];
        uint32_t holders = atomic_load(&t->pin_holders);
        for (unsigned i = 0; i < SHM_MAX_PINS; i++) {
            uint32_t v = atomic_load(&t->pins[i]);
            if (v && (holders >> (8 * i) & 0xffu) == holder && !(keep && keep[kg] == v) &&
                atomic_compare_exchange_strong(&t->pins[i], &v, 0))
                atomic_fetch_add(&t->pins_gen, 1);
        }
        if (holder >= 1 && holder <= SHM_READERS)
            atomic_fetch_and(&t->walkers, ~(1u << (holder - 1)));
    }
}

void shm_table_pin_rebase(stash_arena *a, uint32_t kg, uint32_t version)
{
    shm_table *t = &a->tables[kg];
    for (unsigned i = 0; i < SHM_MAX_PINS; i++) {
        if (atomic_load(&t->pins[i]) != version) continue;
        /* A base first, then no walk: the owner never takes it for a
         * reader's in between. */
        atomic_fetch_or(&t->pin_base, 1u << i);
        atomic_fetch_and(&t->pin_walk, ~(1u << i));
        atomic_fetch_add(&t->pins_gen, 1);
        return;
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
    while (rec && rec->version > version) rec = shm_rec_at(a, shm_rec_older(a, rec));
    return rec;
}

shm_rec *shm_table_get_at(stash_arena *a, const shm_lookup *l, uint32_t version)
{
    shm_table *t = &a->tables[l->kg];
    for (;;) {
        index_view v;
        if (!shm_index_view(a, l->kg, &v) || !v.any) return NULL;
        shm_rec *head = shm_index_view_find(a, &v, l);
        if (head) {
            shm_rec *rec = version_at(a, head, version);
            return shm_rec_live(rec) ? rec : NULL;
        }
        /* Not found: a move may have carried it off; look again if one did. */
        if (atomic_load_explicit(&t->shape_seq, memory_order_acquire) == v.shape) return NULL;
    }
}

/* ---- walks --------------------------------------------------------------- */

typedef struct at_walk {
    uint32_t kg;
    uint32_t version;
    uint32_t base; /* a delta's: only what was written after it, deletions too; 0 all */
    shm_visit_fn *visit;
    shm_delta_fn *delta; /* instead of visit, with base */
    void *ctx;
    uint8_t *buf; /* a copy of the head being visited */
    size_t cap;
    shm_ref *taken; /* the records visited, for the log's entries */
    size_t ntaken, captaken;
} at_walk;

/* Calls the walk's function for r, the record of an entry as of its version. */
static int at_call(const at_walk *w, const shm_rec *r)
{
    return w->delta ? w->delta(r, !shm_rec_live(r), w->ctx) : w->visit(r, w->ctx);
}

/* Copies head into w->buf under its sequence lock if its version is at most
 * the walk's (it may be saved and changed in place meanwhile): 1 then, with
 * *out the copy; 0 if it is newer; or an error. */
static int copy_head(const stash_arena *a, at_walk *w, shm_rec *head, const shm_rec **out)
{
    for (;;) {
        uint32_t s;
        if (!shm_wait_even(a, w->kg, &head->seq, &s)) return shm_owner_died(a, w->kg);
        if (__atomic_load_n(&head->version, __ATOMIC_RELAXED) > w->version) return 0;
        size_t n = sizeof *head + head->klen + head->nslen +
                   atomic_load_explicit(&head->vlen, memory_order_relaxed);
        if (n > w->cap) {
            uint8_t *grown = realloc(w->buf, n);
            if (!grown) return shm_fail(-ENOMEM, "out of memory");
            w->buf = grown;
            w->cap = n;
        }
        memcpy(w->buf, head, n);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&head->seq, memory_order_relaxed) == s) {
            *out = (const shm_rec *)(const void *)w->buf;
            return 1;
        }
    }
}

static int visit_at(stash_arena *a, shm_rec *head, void *ctx)
{
    at_walk *w = ctx;
    const shm_rec *v = NULL;
    shm_rec *src = head;
    int rc = copy_head(a, w, head, &v);
    if (rc < 0) return rc;
    /* Older versions are never changed: read in place. */
    if (rc == 0) v = src = version_at(a, shm_rec_at(a, shm_rec_older(a, head)), w->version);
    if (!v || (w->base ? v->version <= w->base : !shm_rec_live(v))) return 0;
    if (w->ntaken == w->captaken) {
        size_t cap = w->captaken ? 2 * w->captaken : 1024;
        shm_ref *grown = realloc(w->taken, cap * sizeof *grown);
        if (!grown) return shm_fail(-ENOMEM, "out of memory");
        w->taken = grown;
        w->captaken = cap;
    }
    w->taken[w->ntaken++] = shm_ref_of(shm_off_of(a, src));
    return at_call(w, v);
}

static int ref_order(const void *x, const void *y)
{
    shm_ref a = *(const shm_ref *)x, b = *(const shm_ref *)y;
    return (a > b) - (a < b);
}

/* Visits the log's entries of the walk's version: records saved before
 * being changed in place. Those saved since position from (the log's end
 * when the walk began) may have been visited in the index already, before
 * their change: they are left out. */
static int walk_prelog(stash_arena *a, at_walk *w, uint64_t from)
{
    shm_table *t = &a->tables[w->kg];
    bool sorted = false;
    for (const shm_prelog_chunk *c =
             chunk_at(a, atomic_load_explicit(&t->prelog, memory_order_acquire));
         c; c = chunk_at(a, c->older)) {
        uint32_t used = atomic_load_explicit(&c->used, memory_order_acquire);
        for (uint32_t at = 0; at < used;) {
            const shm_prelog_entry *e = (const shm_prelog_entry *)(const void *)(c->bytes + at);
            const shm_rec *r = (const shm_rec *)(e + 1);
            uint64_t pos = c->start + at;
            at += shm_prelog_entry_bytes(e->bytes);
            if (r->version > w->version || e->until <= w->version ||
                (w->base && r->version <= w->base))
                continue;
            /* A walk that visited nothing has nothing to leave out. */
            if (pos >= from && w->ntaken) {
                if (!sorted) qsort(w->taken, w->ntaken, sizeof *w->taken, ref_order);
                sorted = true;
                if (bsearch(&e->ref, w->taken, w->ntaken, sizeof *w->taken, ref_order)) continue;
            }
            int rc = at_call(w, r);
            if (rc) return rc;
        }
    }
    return 0;
}

static int walk_at(stash_arena *a, at_walk *w)
{
    uint64_t from = atomic_load_explicit(&a->tables[w->kg].prelog_end, memory_order_acquire);
    int rc = shm_index_walk(a, w->kg, visit_at, w);
    if (rc == 0) rc = walk_prelog(a, w, from);
    free(w->buf);
    free(w->taken);
    return rc;
}

int shm_table_walk_at(stash_arena *a, uint32_t kg, uint32_t version, shm_visit_fn *fn, void *ctx)
{
    return walk_at(a, &(at_walk){.kg = kg, .version = version, .visit = fn, .ctx = ctx});
}

int shm_table_walk_delta(stash_arena *a, uint32_t kg, uint32_t base, uint32_t version,
                         shm_delta_fn *fn, void *ctx)
{
    return walk_at(a,
                   &(at_walk){.kg = kg, .version = version, .base = base, .delta = fn, .ctx = ctx});
}

/* ---- readers in other processes ----------------------------------------- */

/* Copies rec's value under its sequence lock. Returns its length, -ENOMEM,
 * or -EAGAIN if the owner died in the middle of rewriting it. */
static int64_t copy_stable(const stash_arena *a, uint32_t kg, shm_rec *rec, uint8_t **buf,
                           size_t *cap)
{
    for (;;) {
        uint32_t s;
        if (!shm_wait_even(a, kg, &rec->seq, &s)) return shm_owner_died(a, kg);
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

typedef struct scan_walk {
    shm_scan_fn *fn;
    void *ctx;
    uint32_t kg;
    uint8_t *buf;
    size_t cap;
} scan_walk;

static int visit_scan(stash_arena *a, shm_rec *head, void *ctx)
{
    scan_walk *w = ctx;
    if (!shm_rec_live(head)) return 0;
    int64_t n = copy_stable(a, w->kg, head, &w->buf, &w->cap);
    if (n < 0) return n == -ENOMEM ? shm_fail(-ENOMEM, "out of memory") : (int)n;
    return w->fn(head, (stash_bytes){w->buf, (size_t)n}, w->ctx);
}

int shm_table_scan(stash_arena *a, uint32_t kg, uint32_t reader_slot, shm_scan_fn *fn, void *ctx)
{
    scan_walk w = {fn, ctx, kg, NULL, 0};
    shm_table_walk_enter(a, kg, reader_slot);
    int rc = shm_index_walk(a, kg, visit_scan, &w);
    shm_table_walk_exit(a, kg, reader_slot);
    free(w.buf);
    return rc;
}

int64_t shm_table_read_copy(stash_arena *a, uint32_t reader_slot, const shm_lookup *l,
                            uint8_t **buf, size_t *cap)
{
    shm_table *t = &a->tables[l->kg];
    int64_t rc = STASH_ENOTFOUND;
    shm_ebr_enter(a, reader_slot);
    for (;;) {
        index_view v;
        if (!shm_index_view(a, l->kg, &v)) {
            rc = shm_owner_died(a, l->kg);
            break;
        }
        if (!v.any) break;
        shm_rec *found = shm_index_view_find(a, &v, l);
        if (found) {
            rc = shm_rec_live(found) ? copy_stable(a, l->kg, found, buf, cap) : STASH_ENOTFOUND;
            break;
        }
        if (atomic_load_explicit(&t->shape_seq, memory_order_acquire) == v.shape) break;
    }
    shm_ebr_exit(a, reader_slot);
    return rc;
}
