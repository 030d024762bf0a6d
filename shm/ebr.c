/*
 * ebr.c: epoch-based reclamation across processes. A process that reads key
 * groups it does not own announces the arena's current epoch in its registry
 * slot while it reads; an owner frees what it unlinked only once every
 * announced epoch is newer than the epoch at which it unlinked it. A reader
 * that died mid-read would hold memory back for ever, so once it does, its
 * announcement is cleared after its death is confirmed (pid and start time).
 */
#include "shm/shm.h"

void shm_ebr_enter(stash_arena *a, uint32_t slot)
{
    uint64_t e = atomic_load(&a->hdr->ebr_epoch);
    atomic_store(&a->slots[slot].reader_epoch, e);
    /* The announcement must be visible before the reader loads any link. */
    atomic_thread_fence(memory_order_seq_cst);
}

void shm_ebr_exit(stash_arena *a, uint32_t slot)
{
    atomic_store_explicit(&a->slots[slot].reader_epoch, 0, memory_order_release);
}

uint64_t shm_ebr_min(stash_arena *a, bool check_dead)
{
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t min = UINT64_MAX;
    uint32_t hwm = atomic_load(&a->hdr->registry_hwm);
    for (uint32_t i = 0; i < hwm; i++) {
        shm_slot *s = &a->slots[i];
        uint64_t e = atomic_load_explicit(&s->reader_epoch, memory_order_acquire);
        if (e == 0) continue;
        if (check_dead && !shm_proc_alive(s->pid, s->start_time)) {
            atomic_compare_exchange_strong(&s->reader_epoch, &e, 0);
            continue;
        }
        if (e < min) min = e;
    }
    return min;
}
