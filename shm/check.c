/* SPDX-License-Identifier: MIT */
/*
 * check.c: the arena's consistency check. It walks the page pool and every
 * key group's heap and verifies what the allocator relies on: runs tile the
 * used spans, free lists hold exactly the free runs, every free block lies in
 * a span of its own key group and class, no block is listed twice, and the
 * counters equal what the structure holds; every keyed record lies in a
 * live block of its key group, in the index under its own hash where lookups
 * reach it, whole, and counted.
 * Tests run it after crashes.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "shm/index.h"

typedef struct checker {
    stash_arena *a;
    uint8_t *bits; /* one bit per free run head, then one per 16-byte data unit */
    uint64_t head_bits;
} checker;

static bool test_and_set(uint8_t *bits, uint64_t i)
{
    bool was = bits[i >> 3] & (1u << (i & 7));
    bits[i >> 3] |= (uint8_t)(1u << (i & 7));
    return was;
}

static bool test_and_clear(uint8_t *bits, uint64_t i)
{
    bool was = bits[i >> 3] & (1u << (i & 7));
    bits[i >> 3] &= (uint8_t) ~(1u << (i & 7));
    return was;
}

static int check_runs(checker *c, uint64_t *free_spans)
{
    stash_arena *a = c->a;
    uint64_t bump = atomic_load(&a->hdr->pool_bump), i = 0;
    *free_spans = 0;
    if (bump > a->hdr->nspans)
        return shm_fail(-EUCLEAN, "pool bump %llu beyond %llu spans", (unsigned long long)bump,
                        (unsigned long long)a->hdr->nspans);
    while (i < bump) {
        uint64_t w = atomic_load(&a->spans[i].word), len = shm_span_len(w);
        unsigned st = shm_span_state(w), cls = shm_span_class(w);
        if (len == 0 || i + len > bump)
            return shm_fail(-EUCLEAN, "span %llu: run length %llu crosses the bump mark %llu",
                            (unsigned long long)i, (unsigned long long)len,
                            (unsigned long long)bump);
        if (st == SHM_SPAN_FREE) {
            test_and_set(c->bits, i);
            *free_spans += len;
        } else if (st != SHM_SPAN_OWNED ||
                   (shm_span_kg(w) >= a->hdr->max_parallelism &&
                    !(shm_span_kg(w) == SHM_OP_CONTROL_KG && cls == SHM_CLASS_LARGE)) ||
                   (cls != SHM_CLASS_LARGE && (cls >= SHM_NCLASSES || len != shm_class_run(cls)))) {
            return shm_fail(-EUCLEAN, "span %llu: bad descriptor %#llx", (unsigned long long)i,
                            (unsigned long long)w);
        }
        i += len;
    }
    return 0;
}

static int check_pool_lists(checker *c, uint64_t free_spans)
{
    stash_arena *a = c->a;
    for (unsigned l = 1; l < SHM_POOL_LISTS; l++) {
        uint32_t cur = atomic_load(&a->hdr->pool_free[l]);
        for (; cur; cur = atomic_load(&a->spans[cur - 1].next)) {
            uint64_t i = cur - 1;
            if (i >= a->hdr->nspans || !test_and_clear(c->bits, i))
                return shm_fail(-EUCLEAN,
                                "pool list %u: span %llu is not a free run head or is "
                                "listed twice",
                                l, (unsigned long long)i);
            uint64_t len = shm_span_len(atomic_load(&a->spans[i].word));
            if ((len < SHM_POOL_LISTS - 1 ? len : SHM_POOL_LISTS - 1) != l)
                return shm_fail(-EUCLEAN, "pool list %u holds a run of %llu spans", l,
                                (unsigned long long)len);
        }
    }
    for (uint64_t i = 0; i < a->hdr->nspans; i++)
        if (test_and_clear(c->bits, i))
            return shm_fail(-EUCLEAN, "free run at span %llu is on no pool list",
                            (unsigned long long)i);
    uint64_t counted = free_spans + a->hdr->nspans - atomic_load(&a->hdr->pool_bump);
    if (counted != atomic_load(&a->hdr->pool_free_spans))
        return shm_fail(-EUCLEAN, "pool counts %llu free spans, holds %llu",
                        (unsigned long long)atomic_load(&a->hdr->pool_free_spans),
                        (unsigned long long)counted);
    return 0;
}

/* Where a block may lie: in a span owned by kg with class cls, on a block
 * boundary, below the carve mark if it is the span being carved. */
static int check_block(checker *c, uint32_t kg, unsigned cls, shm_off off)
{
    stash_arena *a = c->a;
    const char *why = NULL;
    uint64_t data_end = a->hdr->data_off + (a->hdr->nspans << SHM_SPAN_SHIFT);
    if (off < a->hdr->data_off || off >= data_end) {
        why = "outside the data region";
    } else {
        uint64_t i = shm_run_head(a, off), w = atomic_load(&a->spans[i].word);
        uint64_t in = off - shm_span_off(a, i), cs = shm_class_bytes(cls);
        uint64_t carve = atomic_load(&a->heaps[kg].cls[cls].carve);
        uint64_t limit = (carve >> 32) == i + 1 ? (uint32_t)carve : shm_class_capacity(cls);
        if (shm_span_state(w) != SHM_SPAN_OWNED || shm_span_kg(w) != kg || shm_span_class(w) != cls)
            why = "in a span of another key group or class";
        else if (in % cs || in + cs > limit)
            why = "not on a handed-out block boundary";
        else if (test_and_set(c->bits, c->head_bits + ((off - a->hdr->data_off) >> 4)))
            why = "listed twice";
    }
    if (!why) return 0;
    return shm_fail(-EUCLEAN, "key group %u, class %u: free block at offset %llu %s", kg,
                    shm_class_bytes(cls), (unsigned long long)off, why);
}

static int check_heap(checker *c, uint32_t kg)
{
    stash_arena *a = c->a;
    for (unsigned cls = 0; cls < SHM_NCLASSES; cls++) {
        uint64_t carve = atomic_load(&a->heaps[kg].cls[cls].carve), span1 = carve >> 32;
        if (span1) {
            uint64_t w = span1 <= a->hdr->nspans ? atomic_load(&a->spans[span1 - 1].word) : 0;
            if (shm_span_state(w) != SHM_SPAN_OWNED || shm_span_kg(w) != kg ||
                shm_span_class(w) != cls || (uint32_t)carve > shm_class_capacity(cls))
                return shm_fail(-EUCLEAN,
                                "key group %u, class %u: carving span %llu it does "
                                "not own",
                                kg, shm_class_bytes(cls), (unsigned long long)(span1 - 1));
        }
        shm_off off = atomic_load(&a->heaps[kg].cls[cls].free_head);
        for (; off; off = *(shm_off *)(a->base + off)) {
            int rc = check_block(c, kg, cls, off);
            if (rc) return rc;
        }
    }
    return 0;
}

/* A record (or an older version) must lie in an allocated block of its key
 * group, be reached once, and be whole (no in-place change half done). */
static int check_record(checker *c, uint32_t kg, shm_rec *r, const char *what)
{
    stash_arena *a = c->a;
    shm_off off = shm_off_of(a, r);
    uint64_t data_end = a->hdr->data_off + (a->hdr->nspans << SHM_SPAN_SHIFT);
    const char *why = NULL;
    if (off < a->hdr->data_off || off + sizeof *r > data_end) {
        why = "outside the data region";
    } else {
        uint64_t w = atomic_load(&a->spans[shm_run_head(a, off)].word);
        if (shm_span_state(w) != SHM_SPAN_OWNED || shm_span_kg(w) != kg)
            why = "in a span of another key group";
        else if (test_and_set(c->bits, c->head_bits + ((off - a->hdr->data_off) >> 4)))
            why = "on a free block or reached twice";
        else if (atomic_load(&r->seq) & 1)
            why = "left half-written";
        else if (sizeof *r + r->klen + r->nslen + atomic_load(&r->vlen) + shm_rec_link_bytes(r) >
                 shm_block_size(a, off))
            why = "longer than its block";
        else if (stash_key_group(shm_rec_key(r), r->klen, a->hdr->max_parallelism) != kg)
            why = "holding a key of another key group";
    }
    if (!why) return 0;
    return shm_fail(-EUCLEAN, "key group %u: %s at offset %llu %s", kg, what,
                    (unsigned long long)off, why);
}

/* One array of an index as check_part walks it: its groups, their count,
 * the first group not moved away yet, and which array it is. */
typedef struct part {
    shm_group *g;
    uint32_t n, from;
    const char *name;
} part;

/* Walks the probe for r's entry (hash h) in p as lookups do: whether it
 * passes group at before a group with an EMPTY slot ends it (at: -1 for no
 * group), and how many slots on the way hold the entry. */
static unsigned probe_walk(const stash_arena *a, const part *p, const shm_rec *r, uint32_t h,
                           int64_t at, bool *reached)
{
    shm_lookup l = {.hash = h,
                    .state = r->state,
                    .klen = r->klen,
                    .nslen = r->nslen,
                    .key = shm_rec_key(r),
                    .ns = shm_rec_ns(r)};
    unsigned copies = 0;
    *reached = false;
    if (!p->n) return 0;
    uint32_t g = h & (p->n - 1);
    if (g < p->from) g = p->from;
    for (uint32_t steps = p->from; steps < p->n; steps++) {
        *reached |= g == at;
        bool empty = false;
        for (unsigned i = 0; i < SHM_GROUP_SLOTS; i++) {
            uint16_t tag = atomic_load(&p->g[g].tag[i]);
            empty |= tag == SHM_SLOT_EMPTY;
            shm_rec *o =
                tag == shm_slot_tag(h) ? shm_rec_at(a, atomic_load(&p->g[g].ref[i])) : NULL;
            copies += o && shm_rec_matches(o, &l);
        }
        if (empty) break;
        g = g + 1 == p->n ? p->from : g + 1;
    }
    return copies;
}

static int check_versions(checker *c, uint32_t kg, shm_rec *r)
{
    stash_arena *a = c->a;
    for (shm_rec *v = shm_rec_at(a, shm_rec_older(a, r)), *newer = r; v;
         newer = v, v = shm_rec_at(a, shm_rec_older(a, v))) {
        int rc = check_record(c, kg, v, "older version");
        if (rc) return rc;
        if (v->version >= newer->version)
            return shm_fail(-EUCLEAN, "key group %u: version %u behind version %u", kg, v->version,
                            newer->version);
    }
    return 0;
}

/* Every slot of p: an entry in a valid record, under its own hash, where
 * probes find it, and marked for the prune sweep if it keeps an older
 * version or is a tombstone; free slots hold no reference; moved groups
 * hold nothing. */
static int check_part(checker *c, uint32_t kg, const part *p, const part *other, uint64_t *live,
                      uint32_t *heads, uint32_t *used, uint32_t *marked)
{
    for (uint32_t g = 0; g < p->n; g++) {
        for (unsigned i = 0; i < SHM_GROUP_SLOTS; i++) {
            uint16_t tag = atomic_load(&p->g[g].tag[i]);
            shm_ref ref = atomic_load(&p->g[g].ref[i]);
            *used += tag != SHM_SLOT_EMPTY;
            if (tag < 2 || g < p->from) {
                if (ref || tag >= 2)
                    return shm_fail(-EUCLEAN, "key group %u: %s index group %u slot %u: %s", kg,
                                    p->name, g, i,
                                    tag >= 2 ? "an entry left in a moved group"
                                             : "a free slot that references a record");
                continue;
            }
            shm_rec *r = shm_rec_at(c->a, ref);
            int rc = r ? check_record(c, kg, r, "record") : 0;
            if (rc) return rc;
            uint32_t h = r ? shm_rec_hash(r) : 0;
            if (!r || shm_slot_tag(h) != tag)
                return shm_fail(
                    -EUCLEAN, "key group %u: %s index group %u slot %u: %s", kg, p->name, g, i,
                    r ? "tag differs from its record's hash" : "an entry without a record");
            bool reached, in_other;
            unsigned copies = probe_walk(c->a, p, r, h, g, &reached);
            if (!reached)
                return shm_fail(-EUCLEAN,
                                "key group %u: %s index group %u slot %u: lookups do not reach it",
                                kg, p->name, g, i);
            if (copies + probe_walk(c->a, other, r, h, -1, &in_other) != 1)
                return shm_fail(-EUCLEAN,
                                "key group %u: %s index group %u slot %u: its entry is in the "
                                "index more than once",
                                kg, p->name, g, i);
            if ((rc = check_versions(c, kg, r))) return rc;
            bool kept = shm_group_kept(&p->g[g], i);
            if (!kept && (shm_rec_older(c->a, r) || (r->flags & SHM_REC_TOMBSTONE)))
                return shm_fail(-EUCLEAN,
                                "key group %u: %s index group %u slot %u: its entry keeps a "
                                "version the prune sweep would not read",
                                kg, p->name, g, i);
            *marked += kept;
            *live += shm_rec_live(r);
            ++*heads;
        }
    }
    return 0;
}

static int check_table(checker *c, uint32_t kg)
{
    stash_arena *a = c->a;
    shm_table *t = &a->tables[kg];
    if (atomic_load(&t->growing) || atomic_load(&t->undo.rec) || (atomic_load(&t->shape_seq) & 1))
        return shm_fail(-EUCLEAN, "key group %u: an owner's change was left unfinished", kg);
    if (!atomic_load(&t->index)) return 0;
    shm_off old = atomic_load(&t->old_index);
    part cur = {SHM_AT(a, shm_group, atomic_load(&t->index)), 1u << atomic_load(&t->log2), 0,
                "current"};
    part po = {SHM_AT(a, shm_group, old), old ? 1u << atomic_load(&t->old_log2) : 0,
               atomic_load(&t->migrate_pos), "old"};
    uint64_t live = 0;
    uint32_t heads = 0, old_used = 0, used = 0, marked = 0;
    int rc = check_part(c, kg, &po, &cur, &live, &heads, &old_used, &marked);
    uint32_t old_heads = heads;
    if (!rc) rc = check_part(c, kg, &cur, &po, &live, &heads, &used, &marked);
    if (rc) return rc;
    /* Between sweeps, an unpin skips the sweep if the table counts no mark. */
    if (t->sweep_pos == UINT32_MAX && marked > t->marked)
        return shm_fail(-EUCLEAN, "key group %u: %u slots marked for the prune sweep, %u counted",
                        kg, marked, t->marked);
    if (live != atomic_load(&t->count) || heads != t->heads || old_heads != t->old_left ||
        used != atomic_load(&t->used))
        return shm_fail(-EUCLEAN,
                        "key group %u counts %llu live entries, %u in slots (%u old), %u slots "
                        "used; holds %llu, %u (%u), %u",
                        kg, (unsigned long long)atomic_load(&t->count), t->heads, t->old_left,
                        atomic_load(&t->used), (unsigned long long)live, heads, old_heads, used);
    return 0;
}

static int check_counters(stash_arena *a)
{
    uint32_t nkg = a->hdr->max_parallelism;
    uint64_t *m = malloc(2 * (size_t)nkg * sizeof *m);
    if (!m) return -ENOMEM;
    int rc = shm_heap_measure(a, (stash_kg_range){0, nkg - 1}, m, m + nkg);
    for (uint32_t kg = 0; rc == 0 && kg < nkg; kg++) {
        uint64_t used = atomic_load(&a->heaps[kg].used_bytes);
        uint64_t fr = atomic_load(&a->heaps[kg].free_bytes);
        if (used != m[kg] || fr != m[nkg + kg])
            rc = shm_fail(-EUCLEAN,
                          "key group %u counts %llu used, %llu free; holds %llu used, "
                          "%llu free",
                          kg, (unsigned long long)used, (unsigned long long)fr,
                          (unsigned long long)m[kg], (unsigned long long)m[nkg + kg]);
    }
    free(m);
    return rc;
}

int shm_check(stash_arena *a)
{
    checker c = {.a = a, .head_bits = a->hdr->nspans};
    uint64_t bits = c.head_bits + ((a->hdr->nspans << SHM_SPAN_SHIFT) >> 4);
    c.bits = calloc(bits / 8 + 1, 1);
    if (!c.bits) return -ENOMEM;
    uint64_t free_spans;
    int rc = check_runs(&c, &free_spans);
    if (!rc) rc = check_pool_lists(&c, free_spans);
    for (uint32_t kg = 0; !rc && kg < a->hdr->max_parallelism; kg++) rc = check_heap(&c, kg);
    for (uint32_t kg = 0; !rc && kg < a->hdr->max_parallelism; kg++) rc = check_table(&c, kg);
    free(c.bits);
    return rc ? rc : check_counters(a);
}

/* ---- at attach ----------------------------------------------------------- */

/* Whether [off, off + len) lies in the data region (off 0: none, allowed if
 * may_be_none). */
static bool in_data(const stash_arena *a, uint64_t off, uint64_t len, bool may_be_none)
{
    if (off == 0) return may_be_none;
    uint64_t lo = a->hdr->data_off, hi = lo + (a->hdr->nspans << SHM_SPAN_SHIFT);
    return off >= lo && off < hi && len <= hi - off;
}

/* An index array of 2^log2 groups at off. */
static bool index_fits(const stash_arena *a, uint64_t off, uint32_t log2, bool may_be_none)
{
    if (off == 0) return may_be_none;
    return log2 < 32 && off % 64 == 0 &&
           in_data(a, off, (uint64_t)sizeof(shm_group) << log2, false);
}

/* A change in place that recovery would finish or undo stays inside its
 * record, and the record inside the data. */
static bool undo_fits(const stash_arena *a, const shm_undo *u)
{
    shm_off off = shm_ref_off(atomic_load(&u->rec));
    if (off == 0) return true;
    if (!in_data(a, off, sizeof(shm_rec), false)) return false;
    const shm_rec *r = shm_ptr(a, off);
    /* A save changes no byte (its vlen is the record's old version). */
    uint64_t vlen = atomic_load(&r->vlen);
    if (u->nregions == SHM_UNDO_SAVE || u->nregions == SHM_UNDO_SAVE_PUT)
        return in_data(a, off, sizeof(shm_rec) + (uint64_t)r->klen + r->nslen + vlen, false);
    if (u->vlen > vlen) vlen = u->vlen;
    if (u->nregions > SHM_UNDO_REGIONS || (u->nregions == 0 && u->vlen > SHM_UNDO_BYTES) ||
        !in_data(a, off, sizeof(shm_rec) + (uint64_t)r->klen + r->nslen + vlen, false))
        return false;
    uint64_t used = 0;
    for (uint32_t i = 0; i < u->nregions; i++) {
        used += u->regions[i].len;
        if ((uint64_t)u->regions[i].off + u->regions[i].len > vlen || used > SHM_UNDO_BYTES)
            return false;
    }
    return true;
}

/* The span descriptors below the pool's bump mark: each run's head says a
 * state, a length that stays below the mark, and for an owned run a key group
 * (or the control block's) and a size class that exist, with its other spans
 * pointing back to it; free-list links name spans. O(spans handed out). */
static int check_span_descriptors(const stash_arena *a, uint64_t bump)
{
    const shm_header *h = a->hdr;
    for (uint64_t i = 0; i < h->nspans; i++) {
        if (atomic_load(&a->spans[i].next) > h->nspans)
            return shm_fail(STASH_ECORRUPT, "%s: span %llu links past the last span", a->path,
                            (unsigned long long)i);
    }
    for (uint64_t i = 0; i < bump;) {
        uint64_t w = atomic_load(&a->spans[i].word), len = shm_span_len(w);
        unsigned state = shm_span_state(w), cls = shm_span_class(w);
        uint32_t kg = shm_span_kg(w);
        bool ok =
            (state == SHM_SPAN_FREE || state == SHM_SPAN_OWNED) && len >= 1 && len <= bump - i;
        if (ok && state == SHM_SPAN_OWNED)
            ok = (kg < h->max_parallelism || kg == SHM_OP_CONTROL_KG) &&
                 (cls < SHM_NCLASSES || cls == SHM_CLASS_LARGE);
        for (uint64_t j = 1; ok && state == SHM_SPAN_OWNED && j < len; j++) {
            uint64_t in = atomic_load(&a->spans[i + j].word);
            ok = shm_span_state(in) == SHM_SPAN_INTERIOR && shm_span_len(in) == j;
        }
        if (!ok)
            return shm_fail(STASH_ECORRUPT, "%s: span %llu is not the head of a run it can be",
                            a->path, (unsigned long long)i);
        i += len;
    }
    return 0;
}

/* The counts of workers that bound loops over the registry's slots and the
 * control block's per-worker array: the registry's high-water mark (every
 * scan of the slots stops there), the parallelism of the committed operator
 * state and of the workers that joined last. None may pass the arrays'
 * STASH_MAX_WORKERS entries. */
static int check_worker_counts(const stash_arena *a)
{
    const struct {
        const char *part, *field;
        uint32_t value;
    } counts[] = {
        {"header", "registry_hwm", atomic_load(&a->hdr->registry_hwm)},
        {"control block", "committed_p", atomic_load(&a->control->committed_p)},
        {"control block", "parallelism", atomic_load(&a->control->parallelism)},
    };
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        if (counts[i].value > STASH_MAX_WORKERS)
            return shm_fail(STASH_ECORRUPT, "%s: %s field %s is %u, past the %u worker slots",
                            a->path, counts[i].part, counts[i].field, counts[i].value,
                            STASH_MAX_WORKERS);
    return 0;
}

/* The paths the arena holds end inside their fields: each is read as a C
 * string (and then opened as a path, checked as any other). */
static int check_strings(const stash_arena *a)
{
    const struct {
        const char *part, *field, *at;
        size_t size;
    } strings[] = {
        {"header", "lmdb_dir", a->hdr->lmdb_dir, sizeof a->hdr->lmdb_dir},
        {"control block", "dir", a->control->dir, sizeof a->control->dir},
        {"control block", "lazy_path", a->control->lazy_path, sizeof a->control->lazy_path},
    };
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if (!memchr(strings[i].at, 0, strings[i].size))
            return shm_fail(STASH_ECORRUPT, "%s: %s field %s does not end within its %zu bytes",
                            a->path, strings[i].part, strings[i].field, strings[i].size);
    return 0;
}

int shm_check_attach(const stash_arena *a)
{
    const shm_header *h = a->hdr;
    uint64_t nspans = h->nspans;
    int rc = check_worker_counts(a);
    if (rc == 0) rc = check_strings(a);
    if (rc) return rc;
    if (atomic_load(&h->pool_bump) > nspans)
        return shm_fail(STASH_ECORRUPT, "%s: the page pool claims %llu of %llu spans", a->path,
                        (unsigned long long)atomic_load(&h->pool_bump), (unsigned long long)nspans);
    rc = check_span_descriptors(a, atomic_load(&h->pool_bump));
    if (rc) return rc;
    for (uint32_t l = 0; l < SHM_POOL_LISTS; l++)
        if (atomic_load(&h->pool_free[l]) > nspans)
            return shm_fail(STASH_ECORRUPT, "%s: page pool list %u starts past span %llu", a->path,
                            l, (unsigned long long)nspans);
    for (uint32_t kg = 0; kg < h->max_parallelism; kg++) {
        const shm_table *t = &a->tables[kg];
        const char *bad = NULL;
        if (!index_fits(a, atomic_load(&t->index), atomic_load(&t->log2), true))
            bad = "index";
        else if (!index_fits(a, atomic_load(&t->old_index), atomic_load(&t->old_log2), true) ||
                 (atomic_load(&t->old_index) &&
                  atomic_load(&t->migrate_pos) > (1u << atomic_load(&t->old_log2))))
            bad = "old index";
        else if (!index_fits(a, atomic_load(&t->growing), atomic_load(&t->growing_log2), true))
            bad = "growing index";
        else if (!in_data(a, atomic_load(&t->retired), 8, true))
            bad = "reclamation ring";
        else if (!in_data(a, atomic_load(&t->prelog), sizeof(shm_prelog_chunk), true))
            bad = "pre-image log";
        else if (!undo_fits(a, &t->undo))
            bad = "record being changed in place";
        for (uint32_t c = 0; !bad && c < SHM_NCLASSES; c++) {
            const shm_class_heap *ch = &a->heaps[kg].cls[c];
            shm_off head = atomic_load(&ch->free_head);
            if (head && !shm_block_in_data(a, head)) {
                bad = "free list";
            } else if (head && shm_span_index(a, head) >= atomic_load(&h->pool_bump)) {
                bad = "free list";
            } else if (head) {
                /* A block of this key group and class: its span (checked
                 * above, as every span below the bump mark) says so. */
                uint64_t w = atomic_load(&a->spans[shm_run_head(a, head)].word);
                if (shm_span_state(w) != SHM_SPAN_OWNED || shm_span_kg(w) != kg ||
                    shm_span_class(w) != c)
                    bad = "free list";
            } else if ((atomic_load(&ch->carve) >> 32) > nspans)
                bad = "span being carved";
        }
        if (bad)
            return shm_fail(STASH_ECORRUPT,
                            "%s: key group %u: its %s lies outside the arena's data", a->path, kg,
                            bad);
    }
    for (uint32_t i = 0; i < STASH_MAX_WORKERS; i++) {
        const shm_slot *s = &a->slots[i];
        uint32_t state = atomic_load(&s->state);
        if (state > SHM_SLOT_DEAD ||
            (state != SHM_SLOT_FREE &&
             (s->kg_first > s->kg_last || s->kg_last >= h->max_parallelism || s->parallelism == 0 ||
              s->parallelism > STASH_MAX_WORKERS)))
            return shm_fail(STASH_ECORRUPT, "%s: worker slot %u names key groups %u..%u of %u",
                            a->path, i, s->kg_first, s->kg_last, h->max_parallelism);
        const shm_ctl_worker *w = &a->control->workers[i];
        const shm_op_blob *blobs[2] = {&w->pending, &w->committed};
        for (int b = 0; b < 2; b++) {
            /* A blob is a run of spans: it starts at one. */
            uint64_t off = atomic_load(&blobs[b]->off);
            if (!in_data(a, off, atomic_load(&blobs[b]->len), true) ||
                (off && (off - h->data_off) % SHM_SPAN_SIZE != 0))
                return shm_fail(STASH_ECORRUPT,
                                "%s: worker %u: its operator state lies outside the arena's data",
                                a->path, i);
        }
    }
    for (uint32_t i = 0; i < SHM_CATALOG_SIZE; i++) {
        const shm_catalog_entry *e = &a->catalog[i];
        if (atomic_load(&e->used) > 1 ||
            (atomic_load(&e->used) &&
             (!memchr(e->name, 0, sizeof e->name) || e->kind == 0 || e->kind > STASH_TIMERS)))
            return shm_fail(STASH_ECORRUPT, "%s: state catalog entry %u is not one", a->path, i);
    }
    return 0;
}
