/* SPDX-License-Identifier: MIT */
/*
 * heap.c: per-key-group heaps. Each key group allocates from its own size-
 * class free lists and carves fresh spans it takes from the pool; records
 * over 32 KiB take whole runs of spans.
 *
 * Invariant: only the owner of a key group (the worker whose range holds it)
 * allocates or frees in its heap, so the fast path is plain loads and stores
 * with no lock and no syscall. Every step that changes a free list or a carve
 * mark is one store, so an owner killed at any instant leaves lists that are
 * well formed; at worst the block in its hands stays counted as used, and
 * a new owner's shm_heap_adopt() makes the counters agree with the structure again.
 */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "shm/shm.h"

unsigned shm_size_class(size_t size)
{
    if (size <= 256) return size ? (unsigned)((size + 15) >> 4) - 1 : 0;
    uint64_t s = size - 1;
    unsigned b = 63u - (unsigned)__builtin_clzll(s);
    return 16u + (b - 8u) * 4u + (unsigned)((s >> (b - 2u)) & 3u);
}

/* Spans per run of each class: the fewest whose tail waste is at most 1/16. */
static const uint8_t class_runs[SHM_NCLASSES] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    2, 1, 1, 2, 4, 1, 2, 3, 7, 1, 4, 3, 7, 2, 5, 3, 7, 4, 5, 6, 7, 8,
};

uint32_t shm_class_run(unsigned cls)
{
    return class_runs[cls];
}

uint32_t shm_class_capacity(unsigned cls)
{
    uint32_t bytes = (uint32_t)class_runs[cls] << SHM_SPAN_SHIFT;
    return bytes / shm_class_bytes(cls) * shm_class_bytes(cls);
}

static uint64_t carve_pack(uint64_t span_plus1, uint32_t carved)
{
    return span_plus1 << 32 | carved;
}

static void account(shm_kg_heap *h, int64_t used_delta, int64_t free_delta)
{
    /* One writer per heap: a load and a store, not a locked add. */
    uint64_t u = atomic_load_explicit(&h->used_bytes, memory_order_relaxed);
    uint64_t f = atomic_load_explicit(&h->free_bytes, memory_order_relaxed);
    atomic_store_explicit(&h->used_bytes, u + (uint64_t)used_delta, memory_order_relaxed);
    atomic_store_explicit(&h->free_bytes, f + (uint64_t)free_delta, memory_order_relaxed);
}

static int alloc_large(stash_arena *a, uint32_t kg, size_t size, shm_off *out)
{
    uint64_t n = (size + SHM_SPAN_SIZE - 1) >> SHM_SPAN_SHIFT, first;
    if (n > a->hdr->nspans)
        return shm_fail(STASH_ETOOBIG,
                        "%s: a record of %zu bytes exceeds the arena's %llu data bytes", a->path,
                        size, (unsigned long long)(a->hdr->nspans << SHM_SPAN_SHIFT));
    int rc = shm_pool_take(a, n, kg, SHM_CLASS_LARGE, &first);
    if (rc == STASH_EFULL)
        return shm_fail(rc, "%s: no run of %llu free spans for a %zu-byte record in key group %u",
                        a->path, (unsigned long long)n, size, kg);
    if (rc < 0) return shm_fail(rc, "%s: page pool lock: %s", a->path, stash_errmsg());
    account(&a->heaps[kg], (int64_t)(n << SHM_SPAN_SHIFT), 0);
    *out = shm_span_off(a, first);
    return 0;
}

/* Takes a fresh run for class cls and hands out its first block. */
static int refill(stash_arena *a, uint32_t kg, unsigned cls, shm_off *out)
{
    uint64_t span;
    int rc = shm_pool_take(a, class_runs[cls], kg, cls, &span);
    if (rc == STASH_EFULL)
        return shm_fail(rc, "%s: no free span for key group %u (%u-byte class)", a->path, kg,
                        shm_class_bytes(cls));
    if (rc < 0) return shm_fail(rc, "%s: page pool lock: %s", a->path, stash_errmsg());
    shm_kg_heap *h = &a->heaps[kg];
    uint32_t cs = shm_class_bytes(cls);
    atomic_store_explicit(&h->cls[cls].carve, carve_pack(span + 1, cs), memory_order_release);
    account(h, cs, (int64_t)shm_class_capacity(cls) - cs);
    *out = shm_span_off(a, span);
    return 0;
}

int shm_alloc(stash_arena *a, uint32_t kg, size_t size, shm_off *out)
{
    if (size > SHM_SMALL_MAX) return alloc_large(a, kg, size, out);
    unsigned cls = shm_size_class(size);
    uint32_t cs = shm_class_bytes(cls);
    shm_kg_heap *h = &a->heaps[kg];
    shm_class_heap *ch = &h->cls[cls];
    shm_off off = atomic_load_explicit(&ch->free_head, memory_order_relaxed);
    if (off) {
        shm_off next = *(shm_off *)(a->base + off);
        atomic_store_explicit(&ch->free_head, next, memory_order_relaxed);
        /* The next block's link is read by the next allocation, and its
         * lines written by its record: bring them near now (a free block
         * is rarely in the cache, and its link is a dependent load). */
        if (next) __builtin_prefetch(a->base + next, 1);
        account(h, cs, -(int64_t)cs);
        *out = off;
        return 0;
    }
    uint64_t carve = atomic_load_explicit(&ch->carve, memory_order_relaxed);
    uint64_t span1 = carve >> 32;
    uint32_t carved = (uint32_t)carve;
    if (span1 == 0 || carved + cs > shm_class_capacity(cls)) return refill(a, kg, cls, out);
    atomic_store_explicit(&ch->carve, carve_pack(span1, carved + cs), memory_order_relaxed);
    account(h, cs, -(int64_t)cs);
    *out = shm_span_off(a, span1 - 1) + carved;
    return 0;
}

void shm_free(stash_arena *a, shm_off off)
{
    uint64_t head = shm_run_head(a, off);
    uint64_t w = atomic_load_explicit(&a->spans[head].word, memory_order_relaxed);
    shm_kg_heap *h = &a->heaps[shm_span_kg(w)];
    unsigned cls = shm_span_class(w);
    if (cls == SHM_CLASS_LARGE) {
        account(h, -(int64_t)(shm_span_len(w) << SHM_SPAN_SHIFT), 0);
        shm_pool_give(a, head);
        return;
    }
    shm_class_heap *ch = &h->cls[cls];
    *(shm_off *)(a->base + off) = atomic_load_explicit(&ch->free_head, memory_order_relaxed);
    atomic_store_explicit(&ch->free_head, off, memory_order_release);
    account(h, -(int64_t)shm_class_bytes(cls), shm_class_bytes(cls));
}

uint64_t shm_block_size(const stash_arena *a, shm_off off)
{
    uint64_t w = atomic_load_explicit(&a->spans[shm_run_head(a, off)].word, memory_order_relaxed);
    unsigned cls = shm_span_class(w);
    return cls == SHM_CLASS_LARGE ? shm_span_len(w) << SHM_SPAN_SHIFT : shm_class_bytes(cls);
}

int shm_heap_measure(stash_arena *a, stash_kg_range range, uint64_t *used, uint64_t *free_b)
{
    uint32_t nkg = range.last - range.first + 1;
    for (uint32_t k = 0; k < nkg; k++) used[k] = free_b[k] = 0;
    /* The walk over the pool's heads needs them still: hold the pool lock. */
    int rc = shm_lock_acquire(&a->hdr->pool_lock, shm_pool_rebuild, a);
    if (rc < 0) return rc;
    uint64_t bump = atomic_load(&a->hdr->pool_bump);
    for (uint64_t i = 0; i < bump;) {
        uint64_t w = atomic_load(&a->spans[i].word), len = shm_span_len(w);
        uint32_t kg = shm_span_kg(w);
        unsigned cls = shm_span_class(w);
        if (shm_span_state(w) == SHM_SPAN_OWNED && kg >= range.first && kg <= range.last) {
            uint32_t k = kg - range.first;
            if (cls == SHM_CLASS_LARGE) {
                used[k] += len << SHM_SPAN_SHIFT;
            } else {
                uint64_t carve = atomic_load(&a->heaps[kg].cls[cls].carve);
                uint32_t cap = shm_class_capacity(cls);
                uint32_t carved = (carve >> 32) == i + 1 ? (uint32_t)carve : cap;
                used[k] += carved;
                free_b[k] += cap - carved;
            }
        }
        i += len ? len : 1;
    }
    shm_lock_release(&a->hdr->pool_lock);
    for (uint32_t k = 0; k < nkg; k++) {
        for (unsigned c = 0; c < SHM_NCLASSES; c++) {
            uint64_t limit = a->hdr->nspans << SHM_SPAN_SHIFT;
            shm_off off = atomic_load(&a->heaps[range.first + k].cls[c].free_head);
            for (; shm_block_in_data(a, off) && limit;
                 off = *(shm_off *)(a->base + off), limit -= 16) {
                used[k] -= shm_class_bytes(c);
                free_b[k] += shm_class_bytes(c);
            }
        }
    }
    return 0;
}

static int recover_range(stash_arena *a, stash_kg_range range)
{
    uint32_t nkg = range.last - range.first + 1;
    uint64_t *used = malloc(2 * nkg * sizeof *used);
    if (!used) return -ENOMEM;
    int rc = shm_heap_measure(a, range, used, used + nkg);
    for (uint32_t k = 0; rc == 0 && k < nkg; k++) {
        atomic_store(&a->heaps[range.first + k].used_bytes, used[k]);
        atomic_store(&a->heaps[range.first + k].free_bytes, used[nkg + k]);
    }
    free(used);
    return rc;
}

static uint64_t my_start_time(void)
{
    static uint64_t start;
    static pid_t pid;
    if (pid != getpid()) {
        pid = getpid();
        start = shm_proc_start_time(pid);
    }
    return start;
}

void shm_heap_adopt(stash_arena *a, stash_kg_range range, shm_kg_recover_fn *recover_kg)
{
    int32_t me = getpid();
    uint64_t start = my_start_time();
    bool dirty = false;
    for (uint32_t kg = range.first; kg <= range.last; kg++) {
        shm_kg_heap *h = &a->heaps[kg];
        int32_t owner = atomic_load(&h->owner_pid);
        /* An owner that left without a clean release may have died mid-operation. */
        if (owner != 0 && !(owner == me && atomic_load(&h->owner_start) == start)) {
            recover_kg(a, kg);
            dirty = true;
        }
        atomic_store(&h->owner_start, start);
        atomic_store(&h->owner_pid, me);
    }
    if (dirty) recover_range(a, range);
}

int shm_heap_recover(stash_arena *a, uint32_t kg, shm_kg_recover_fn *recover_kg)
{
    recover_kg(a, kg);
    return recover_range(a, (stash_kg_range){kg, kg});
}

void shm_heap_release(stash_arena *a, stash_kg_range range)
{
    for (uint32_t kg = range.first; kg <= range.last; kg++)
        atomic_store(&a->heaps[kg].owner_pid, 0);
}
