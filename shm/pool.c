/* SPDX-License-Identifier: MIT */
/*
 * pool.c: the page pool: the arena's data region cut into 4 KiB spans and
 * handed to key-group heaps in runs of whole spans.
 *
 * Crash rule: the descriptor of a run's first span (its head) is the truth.
 * Walking heads from span 0, each head's length leads to the next, up to the
 * bump mark; every change to the pool first makes the heads say the new truth
 * in one atomic store and only then fixes the free lists. So when a holder of
 * the pool lock dies, the next taker rebuilds the lists from the heads
 * (shm_pool_rebuild) and nothing is lost or handed out twice. A run taken
 * for a key group whose heap never recorded it stays owned by that group and
 * counted as used there (shm_heap_adopt).
 */
#include <errno.h>
#include <sys/mman.h>

#include "shm/shm.h"

#define LONG_LIST (SHM_POOL_LISTS - 1)

static unsigned list_for(uint64_t len)
{
    return len < LONG_LIST ? (unsigned)len : LONG_LIST;
}

static uint64_t head_word(const stash_arena *a, uint64_t i)
{
    return atomic_load_explicit(&a->spans[i].word, memory_order_relaxed);
}

static void set_head(stash_arena *a, uint64_t i, uint64_t word)
{
    atomic_store_explicit(&a->spans[i].word, word, memory_order_release);
}

static void push_free(stash_arena *a, uint64_t i, uint64_t len)
{
    _Atomic uint32_t *head = &a->hdr->pool_free[list_for(len)];
    atomic_store_explicit(&a->spans[i].next, atomic_load(head), memory_order_relaxed);
    atomic_store_explicit(head, (uint32_t)(i + 1), memory_order_release);
}

void shm_pool_init(stash_arena *a)
{
    shm_header *h = a->hdr;
    shm_lock_init(&h->pool_lock);
    atomic_store(&h->pool_bump, 0);
    atomic_store(&h->pool_free_spans, h->nspans);
    for (unsigned i = 0; i < SHM_POOL_LISTS; i++) atomic_store(&h->pool_free[i], 0);
}

void shm_pool_rebuild(void *arena)
{
    stash_arena *a = arena;
    shm_header *h = a->hdr;
    for (unsigned i = 0; i < SHM_POOL_LISTS; i++) atomic_store(&h->pool_free[i], 0);
    uint64_t bump = atomic_load(&h->pool_bump), free_spans = 0, i = 0;
    while (i < bump) {
        uint64_t w = head_word(a, i), len = shm_span_len(w);
        if (len == 0 || i + len > bump) break; /* unreachable: heads are written before bump */
        if (shm_span_state(w) == SHM_SPAN_FREE) {
            push_free(a, i, len);
            free_spans += len;
        }
        i += len;
    }
    atomic_store(&h->pool_bump, i);
    atomic_store(&h->pool_free_spans, free_spans + h->nspans - i);
}

/* Unlinks the first run of list idx at least n long; returns its index + 1 or 0. */
static uint32_t unlink_fit(stash_arena *a, unsigned idx, uint64_t n)
{
    _Atomic uint32_t *link = &a->hdr->pool_free[idx];
    for (uint32_t cur = atomic_load(link); cur; cur = atomic_load(link)) {
        if (shm_span_len(head_word(a, cur - 1)) >= n) {
            atomic_store(link, atomic_load(&a->spans[cur - 1].next));
            return cur;
        }
        link = &a->spans[cur - 1].next;
    }
    return 0;
}

/* Finds a free run of at least n spans: the exact list first, then longer ones. */
static uint32_t find_free_run(stash_arena *a, uint64_t n)
{
    for (unsigned idx = list_for(n); idx < SHM_POOL_LISTS; idx++) {
        uint32_t r = unlink_fit(a, idx, n);
        if (r) return r;
    }
    return 0;
}

int shm_pool_take(stash_arena *a, uint64_t n, uint32_t kg, unsigned cls, uint64_t *first)
{
    shm_header *h = a->hdr;
    int rc = shm_lock_acquire(&h->pool_lock, shm_pool_rebuild, a);
    if (rc < 0) return rc;
    uint64_t owned = shm_span_pack(SHM_SPAN_OWNED, cls, kg, n);
    uint64_t bump = atomic_load(&h->pool_bump);
    /* Reuse a freed run before cutting new spans, to keep the bump region whole
     * for large runs. The heads change before the lists, and a run's other
     * spans before its head: see the crash rule. Until the head says so,
     * they lie inside the free run or past the bump mark, where no walk of
     * the heads reads them. */
    uint32_t r = find_free_run(a, n);
    uint64_t at = r ? r - 1 : bump;
    if (!r && h->nspans - bump < n) {
        shm_lock_release(&h->pool_lock);
        return STASH_EFULL;
    }
    for (uint64_t j = 1; j < n; j++) set_head(a, at + j, shm_span_pack(SHM_SPAN_INTERIOR, 0, 0, j));
    if (r) {
        uint64_t len = shm_span_len(head_word(a, at));
        if (len > n) set_head(a, at + n, shm_span_pack(SHM_SPAN_FREE, 0, 0, len - n));
        set_head(a, at, owned);
        if (len > n) push_free(a, at + n, len - n);
    } else {
        set_head(a, bump, owned);
        atomic_store(&h->pool_bump, bump + n);
    }
    *first = at;
    atomic_fetch_sub(&h->pool_free_spans, n);
    shm_lock_release(&h->pool_lock);
    return 0;
}

void shm_pool_give(stash_arena *a, uint64_t first)
{
    shm_header *h = a->hdr;
    /* A repair always ends with the mutex made consistent; a holder stuck
     * alive inside it leaves the run with its key group, used by nothing. */
    if (shm_lock_acquire(&h->pool_lock, shm_pool_rebuild, a) < 0) return;
    uint64_t len = shm_span_len(head_word(a, first));
    set_head(a, first, shm_span_pack(SHM_SPAN_FREE, 0, 0, len));
    push_free(a, first, len);
    atomic_fetch_add(&h->pool_free_spans, len);
    shm_lock_release(&h->pool_lock);
}

#define PREFAULT_CHUNK 256u /* spans a thread takes at a time: 1 MiB */

void shm_prefault_init(shm_prefault *p, stash_arena *a, uint64_t bytes)
{
    uint64_t bump = atomic_load(&a->hdr->pool_bump), left = a->hdr->nspans - bump;
    uint64_t n = (bytes + SHM_SPAN_SIZE - 1) >> SHM_SPAN_SHIFT;
    p->base = a->base + shm_span_off(a, bump);
    p->spans = n < left ? n : left;
    atomic_init(&p->next, 0);
}

void shm_prefault_run(shm_prefault *p)
{
    for (;;) {
        uint64_t first = atomic_fetch_add(&p->next, PREFAULT_CHUNK);
        if (first >= p->spans) return;
        uint64_t n = p->spans - first < PREFAULT_CHUNK ? p->spans - first : PREFAULT_CHUNK;
        char *at = p->base + (first << SHM_SPAN_SHIFT);
        madvise(at, n << SHM_SPAN_SHIFT, MADV_POPULATE_WRITE);
        /* Under a hypervisor that maps a guest's pages on their first touch
         * (shadow paging), populated pages still fault once each when first
         * written: write each now. Adding zero changes nothing a worker may
         * have written meanwhile into spans it took. */
        for (uint64_t i = 0; i < n; i++)
            atomic_fetch_add_explicit((_Atomic uint64_t *)(void *)(at + (i << SHM_SPAN_SHIFT)), 0,
                                      memory_order_relaxed);
    }
}
