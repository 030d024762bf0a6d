/* SPDX-License-Identifier: MIT */
/*
 * index.c: a key group's index: where the newest version of each entry is,
 * found by its lookup hash. Groups of ten slots (tag, reference), one
 * cache line each, probed group by group from the hash's home group until a
 * group with an EMPTY slot; only the key group's owner changes them.
 *
 * Invariants the rest of stash relies on:
 * - A slot only goes from EMPTY to used, and from used to DELETED (never back
 *   to EMPTY), so an entry is always reachable from its home without
 *   crossing an EMPTY slot. A lookup compares the ten tags of a group at
 *   once and reads only the records whose tag matches.
 * - Readers in other processes probe without locks: a slot's reference is
 *   written before its tag, and moving entries between index arrays is
 *   bracketed by the table's shape sequence, so a reader that missed a key
 *   because of a move looks again.
 * - Growing never stops the world: when the index is 7/8 used, a new array
 *   (room for twice the entries) takes every new entry and the owner moves a
 *   few groups of the old one into it per write. Lookups probe the old array
 *   first, skipping the groups already moved (an entry can only be in a group
 *   not moved yet, at or after its home, with no EMPTY slot between), then
 *   the new one. A slot keeps only the high half of its entry's hash, so a
 *   move reads each record to find its home in the new array. Moves wait
 *   while a walker walks the key group (a
 *   checkpoint), so a walk sees each entry in one place; an entry being moved
 *   goes into the new array before its old slot is marked, so a crash leaves
 *   it in one array or both, never in neither.
 */
#include <errno.h>
#include <string.h>

#include "shm/index.h"

#define INITIAL_LOG2 1u /* groups of a new index */
#define WALK_AHEAD 16u  /* slots whose record a walk fetches ahead */

static shm_group *groups_at(const stash_arena *a, shm_off off)
{
    return (shm_group *)(a->base + off);
}

/* ---- groups -------------------------------------------------------------- */

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
    uint16_t tag = shm_slot_tag(l->hash);
    for (uint32_t steps = p->from; steps < p->n; steps++, g = probe_next(p, g)) {
        shm_group *grp = &p->g[g];
        unsigned m = shm_group_match(grp, tag);
        atomic_thread_fence(memory_order_acquire);
        while (m) {
            unsigned i = shm_group_next(&m);
            shm_rec *r = shm_group_rec(a, grp, i);
            if (r && shm_rec_matches(r, l)) {
                *at = grp;
                *slot = i;
                return r;
            }
        }
        unsigned empty = shm_group_match(grp, SHM_SLOT_EMPTY);
        if (free_g && !*free_g) {
            unsigned f = empty | shm_group_match(grp, SHM_SLOT_DELETED);
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

bool shm_wait_even(const stash_arena *a, uint32_t kg, _Atomic uint32_t *seq, uint32_t *out)
{
    for (uint32_t spins = 1;; spins++) {
        *out = atomic_load_explicit(seq, memory_order_acquire);
        if (!(*out & 1)) return true;
        if (spins % SPINS_BEFORE_CHECK == 0 && owner_gone(a, kg)) return false;
        __builtin_ia32_pause();
    }
}

int shm_owner_died(const stash_arena *a, uint32_t kg)
{
    return shm_fail(-EAGAIN,
                    "%s: key group %u: its owner died in the middle of a change; a new "
                    "owner recovers it",
                    a->path, kg);
}

bool shm_index_view(const stash_arena *a, uint32_t kg, index_view *v)
{
    shm_table *t = &a->tables[kg];
    for (;;) {
        if (!shm_wait_even(a, kg, &t->shape_seq, &v->shape)) return false;
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

shm_rec *shm_index_view_find(const stash_arena *a, const index_view *v, const shm_lookup *l)
{
    shm_group *g;
    unsigned i;
    shm_rec *r = v->old.n ? probe(a, &v->old, l, &g, &i, NULL, NULL) : NULL;
    if (!r && v->cur.n) r = probe(a, &v->cur, l, &g, &i, NULL, NULL);
    return r;
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
    /* Odd before growing is set: recovery's repeat of the switch then runs
     * with readers kept out too. */
    shape_begin(t);
    atomic_store(&t->growing_log2, log2);
    atomic_store(&t->growing, fresh);
    switch_index(t);
    shape_end(t);
}

/* The first free (EMPTY or DELETED) slot of the current index on the probe
 * for hash h; false if the index has none. */
static bool free_slot(const stash_arena *a, const shm_table *t, uint32_t h, shm_group **g,
                      unsigned *i)
{
    index_part cur = {groups_at(a, atomic_load(&t->index)), 1u << atomic_load(&t->log2), 0};
    uint32_t at = probe_start(&cur, h);
    for (uint32_t steps = 0; steps < cur.n; steps++, at = probe_next(&cur, at)) {
        unsigned f = shm_group_match(&cur.g[at], SHM_SLOT_EMPTY) |
                     shm_group_match(&cur.g[at], SHM_SLOT_DELETED);
        if (f) {
            *g = &cur.g[at];
            *i = (unsigned)__builtin_ctz(f) >> 1;
            return true;
        }
    }
    return false;
}

/* Fills free slot i of g of the current index with the entry of hash h at
 * r: the reference before the tag, which readers match first; kept: the
 * entry has versions for the prune sweep. */
static void slot_fill(shm_table *t, shm_group *g, unsigned i, uint32_t h, shm_ref r, bool kept)
{
    shm_group_keep(t, g, i, kept);
    bool was_empty = atomic_load_explicit(&g->tag[i], memory_order_relaxed) == SHM_SLOT_EMPTY;
    atomic_store_explicit(&g->ref[i], r, memory_order_relaxed);
    atomic_store_explicit(&g->tag[i], shm_slot_tag(h), memory_order_release);
    if (was_empty)
        atomic_store_explicit(&t->used, atomic_load_explicit(&t->used, memory_order_relaxed) + 1,
                              memory_order_relaxed);
}

/* Puts (h, r) into a free slot of the current index (growth sized it to have one). */
static void insert_slot(stash_arena *a, shm_table *t, uint32_t h, shm_ref r, bool kept)
{
    shm_group *g;
    unsigned i;
    if (free_slot(a, t, h, &g, &i)) slot_fill(t, g, i, h, r, kept);
}

/* Whether the current index holds reference r under hash h. */
static bool index_holds(const stash_arena *a, const shm_table *t, uint32_t h, shm_ref r)
{
    index_part cur = {groups_at(a, atomic_load(&t->index)), 1u << atomic_load(&t->log2), 0};
    uint32_t g = probe_start(&cur, h);
    for (uint32_t steps = 0; steps < cur.n; steps++, g = probe_next(&cur, g)) {
        const shm_group *grp = &cur.g[g];
        for (unsigned m = shm_group_match(grp, shm_slot_tag(h)); m;)
            if (atomic_load(&grp->ref[shm_group_next(&m)]) == r) return true;
        if (shm_group_match(grp, SHM_SLOT_EMPTY)) return false;
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
    shm_rec *recs[SHM_GROUP_SLOTS];
    /* Each entry's home comes from its record: fetch them all first. */
    for (unsigned i = 0; i < SHM_GROUP_SLOTS; i++) {
        recs[i] = atomic_load(&g->tag[i]) >= 2 ? shm_rec_at(a, atomic_load(&g->ref[i])) : NULL;
        if (recs[i]) __builtin_prefetch(recs[i]);
    }
    for (unsigned i = 0; i < SHM_GROUP_SLOTS; i++) {
        if (recs[i]) {
            uint32_t h = shm_rec_hash(recs[i]);
            shm_ref r = atomic_load(&g->ref[i]);
            if (!(recovering && index_holds(a, t, h, r)))
                insert_slot(a, t, h, r, shm_group_kept(g, i));
            t->old_left--;
        }
        if (atomic_load(&g->tag[i]) != SHM_SLOT_EMPTY) atomic_store(&g->tag[i], SHM_SLOT_DELETED);
        atomic_store(&g->ref[i], 0);
    }
    atomic_store(&t->migrate_pos, pos + 1);
}

/* Moves up to n old groups (all if n is UINT32_MAX); returns the old array
 * once it is empty. With wait, waits for walkers instead of putting it off. */
static shm_off migrate(stash_arena *a, uint32_t kg, uint32_t n, bool wait)
{
    shm_table *t = &a->tables[kg];
    shm_off old = atomic_load(&t->old_index);
    uint32_t old_n = 1u << atomic_load(&t->old_log2);
    if (wait)
        moves_begin_waiting(a, t);
    else if (!moves_begin(a, t))
        return 0;
    /* Recovery finishes a group only when this says a move was under way:
     * an odd shape alone may be a switch, which a walk goes on through. */
    atomic_store(&t->moving, 1);
    for (; n > 0 && atomic_load(&t->migrate_pos) < old_n; n--) move_group(a, t, false);
    bool done = atomic_load(&t->migrate_pos) == old_n;
    if (done) {
        atomic_store(&t->old_index, 0);
        atomic_fetch_add(&t->resizes, 1);
    }
    atomic_store(&t->moving, 0);
    shape_end(t);
    return done ? old : 0;
}

shm_off shm_index_migrate(stash_arena *a, uint32_t kg, uint32_t groups, bool *moved)
{
    shm_table *t = &a->tables[kg];
    uint32_t before = atomic_load(&t->migrate_pos);
    shm_off emptied = atomic_load(&t->old_index) ? migrate(a, kg, groups, false) : 0;
    *moved = emptied || atomic_load(&t->migrate_pos) != before;
    return emptied;
}

/* Keeps room for the next insert: grows at 7/8 used. While the old array
 * is still being emptied, inserts go on into the index; should walkers hold
 * the moves back until what is left to move would fill the index to 15/16,
 * the move is finished first, waiting for them. */
shm_off shm_index_make_room(stash_arena *a, uint32_t kg)
{
    shm_table *t = &a->tables[kg];
    shm_off emptied = 0;
    if (atomic_load(&t->old_index)) {
        uint32_t slots = SHM_GROUP_SLOTS << t->log2;
        if ((uint64_t)atomic_load(&t->used) + t->old_left < slots - slots / 16) return 0;
        emptied = migrate(a, kg, UINT32_MAX, true);
    }
    if (atomic_load(&t->used) > t->grow_at) grow_start(a, kg);
    return emptied;
}

/* ---- the owner's lookups and changes ------------------------------------ */

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
static int find_probe(stash_arena *a, const shm_table *t, const shm_lookup *l, shm_cursor *c)
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

int shm_table_find_probe(stash_arena *a, const shm_lookup *l, shm_cursor *c)
{
    shm_table *t = &a->tables[l->kg];
    if (!atomic_load_explicit(&t->index, memory_order_relaxed)) {
        int rc = index_create(a, l->kg, INITIAL_LOG2);
        if (rc < 0) return rc;
    }
    return find_probe(a, t, l, c);
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

int shm_index_insert(stash_arena *a, const shm_lookup *l, shm_cursor *c, shm_ref ref)
{
    shm_table *t = &a->tables[l->kg];
    if (!c->group || c->in_old) {
        if (!free_slot(a, t, l->hash, &c->group, &c->slot))
            return shm_fail(STASH_EFULL,
                            "%s: key group %u: its index is full and the arena has no room to "
                            "grow it",
                            a->path, l->kg);
        c->in_old = false;
    }
    slot_fill(t, c->group, c->slot, l->hash, ref, false);
    t->heads++;
    return 0;
}

void shm_index_clear(shm_table *t, const shm_cursor *c)
{
    shm_group_keep(t, c->group, c->slot, false);
    atomic_store_explicit(&c->group->tag[c->slot], SHM_SLOT_DELETED, memory_order_release);
    atomic_store_explicit(&c->group->ref[c->slot], 0, memory_order_release);
    t->heads--;
    if (c->in_old) t->old_left--;
}

bool shm_index_at(const stash_arena *a, uint32_t kg, uint32_t *pos, shm_cursor *c)
{
    const shm_table *t = &a->tables[kg];
    if (!atomic_load(&t->index)) return false;
    index_part old, cur;
    owner_parts(a, t, &old, &cur);
    if (*pos < old.from * SHM_GROUP_SLOTS) *pos = old.from * SHM_GROUP_SLOTS;
    unsigned i;
    if (!scan_slot(&old, &cur, *pos, &c->group, &i)) return false;
    c->slot = i;
    c->in_old = *pos < old.n * SHM_GROUP_SLOTS;
    c->rec =
        atomic_load(&c->group->tag[i]) < 2 ? NULL : shm_rec_at(a, atomic_load(&c->group->ref[i]));
    return true;
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
            used += atomic_load(&cur.g[g].tag[i]) != SHM_SLOT_EMPTY;
    atomic_store(&t->count, live);
    atomic_store(&t->used, used);
    t->heads = heads;
    t->old_left = old_left;
}

/* Whether the record at ref lies whole in the arena's data region. */
static bool rec_fits(const stash_arena *a, shm_ref ref)
{
    shm_off off = shm_ref_off(ref);
    if (!shm_block_in_data(a, off) || a->size - off < sizeof(shm_rec)) return false;
    const shm_rec *r = shm_rec_at(a, ref);
    return a->size - off - sizeof(shm_rec) >=
           (uint64_t)r->klen + r->nslen + atomic_load_explicit(&r->vlen, memory_order_relaxed);
}

/* Drops the slots of both arrays whose reference leads outside the data
 * region: only damage to the arena makes one, and the recovery that reads
 * every entry's record must not follow it out of the mapping. */
static void drop_stray_refs(stash_arena *a, shm_table *t)
{
    index_part po, pc;
    owner_parts(a, t, &po, &pc);
    const index_part *parts[2] = {&po, &pc};
    for (int p = 0; p < 2; p++)
        for (uint32_t g = parts[p]->from; g < parts[p]->n; g++)
            for (unsigned i = 0; i < SHM_GROUP_SLOTS; i++) {
                shm_group *grp = &parts[p]->g[g];
                if (atomic_load(&grp->tag[i]) < 2 || rec_fits(a, atomic_load(&grp->ref[i])))
                    continue;
                atomic_store(&grp->tag[i], SHM_SLOT_DELETED);
                atomic_store(&grp->ref[i], 0);
            }
}

void shm_index_recover(stash_arena *a, uint32_t kg)
{
    shm_table *t = &a->tables[kg];
    /* Both left the shape odd, so walkers and readers wait meanwhile. */
    if (atomic_load(&t->growing)) switch_index(t);
    if (atomic_load(&t->index)) drop_stray_refs(a, t);
    /* A group half moved: finish it (what already moved is only marked).
     * Only then: a walk may be going through groups no move had reached. */
    shm_off old = atomic_load(&t->old_index);
    if (atomic_load(&t->moving) && old &&
        atomic_load(&t->migrate_pos) < (1u << atomic_load(&t->old_log2)))
        move_group(a, t, true);
    atomic_store(&t->moving, 0);
    if (!atomic_load(&t->index)) return;
    /* A delete stores DELETED before clearing the reference, an insert its
     * reference before its tag. Which slots keep versions is not known
     * after a crash: the next sweep reads them all. */
    index_part po, pc;
    owner_parts(a, t, &po, &pc);
    const index_part *parts[2] = {&po, &pc};
    t->marked = UINT32_MAX;
    for (int p = 0; p < 2; p++)
        for (uint32_t g = parts[p]->from; g < parts[p]->n; g++) {
            atomic_store(&parts[p]->g[g].kept, (1u << SHM_GROUP_SLOTS) - 1);
            for (unsigned i = 0; i < SHM_GROUP_SLOTS; i++)
                if (atomic_load(&parts[p]->g[g].tag[i]) < 2)
                    atomic_store(&parts[p]->g[g].ref[i], 0);
        }
    if (atomic_load(&t->shape_seq) & 1) atomic_fetch_add(&t->shape_seq, 1);
    set_grow_at(t);
    recount(a, kg);
}

shm_rec *shm_table_next(const stash_arena *a, uint32_t kg, uint32_t *pos, uint32_t *hash)
{
    shm_cursor c;
    for (; shm_index_at(a, kg, pos, &c); ++*pos) {
        if (!c.rec) continue;
        if (hash) *hash = shm_rec_hash(c.rec);
        ++*pos;
        return c.rec;
    }
    return NULL;
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

static int walk_part(stash_arena *a, const index_part *p, shm_head_fn *each, void *ctx)
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
        if (atomic_load_explicit(&g->tag[i], memory_order_acquire) < 2) continue;
        shm_rec *rec = shm_rec_at(a, atomic_load_explicit(&g->ref[i], memory_order_acquire));
        if (rec) rc = each(a, rec, ctx);
    }
    return rc;
}

int shm_index_walk(stash_arena *a, uint32_t kg, shm_head_fn *each, void *ctx)
{
    index_view v;
    if (!shm_index_view(a, kg, &v)) return shm_owner_died(a, kg);
    int rc = v.old.n ? walk_part(a, &v.old, each, ctx) : 0;
    return rc == 0 && v.cur.n ? walk_part(a, &v.cur, each, ctx) : rc;
}
