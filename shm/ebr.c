/* SPDX-License-Identifier: MIT */
/*
 * ebr.c: epoch-based reclamation across processes. A process that reads key
 * groups it does not own announces the arena's current epoch in its registry
 * slot while it reads; an owner frees what it unlinked only once every
 * announced epoch is newer than the epoch at which it unlinked it. A reader
 * that died mid-read would hold memory back for ever, so once it does, its
 * announcement is cleared after its death is confirmed (pid and start time).
 */
#include <unistd.h>

#include "shm/shm.h"

static _Atomic uint64_t *announcement(stash_arena *a, uint32_t slot)
{
    return slot < STASH_MAX_WORKERS ? &a->slots[slot].reader_epoch
                                    : &a->hdr->readers[slot - STASH_MAX_WORKERS].reader_epoch;
}

void shm_ebr_enter(stash_arena *a, uint32_t slot)
{
    uint64_t e = atomic_load(&a->hdr->ebr_epoch);
    atomic_store(announcement(a, slot), e);
    /* The announcement must be visible before the reader loads any link. */
    atomic_thread_fence(memory_order_seq_cst);
}

void shm_ebr_exit(stash_arena *a, uint32_t slot)
{
    atomic_store_explicit(announcement(a, slot), 0, memory_order_release);
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
    for (uint32_t i = 0; i < SHM_READERS; i++) {
        shm_reader *r = &a->hdr->readers[i];
        uint64_t e = atomic_load_explicit(&r->reader_epoch, memory_order_acquire);
        if (e == 0) continue;
        if (check_dead && !shm_proc_alive(r->pid, r->start_time)) {
            atomic_compare_exchange_strong(&r->reader_epoch, &e, 0);
            continue;
        }
        if (e < min) min = e;
    }
    return min;
}

int shm_reader_join(stash_arena *a, uint32_t *slot)
{
    int32_t me = getpid();
    uint64_t start = shm_proc_start_time(me);
    for (uint32_t i = 0; i < SHM_READERS; i++) {
        shm_reader *r = &a->hdr->readers[i];
        int32_t pid = atomic_load(&r->pid);
        /* A slot is free, or its holder is dead: claim it with one exchange. */
        if (pid != 0 && shm_proc_alive(pid, r->start_time)) continue;
        if (!atomic_compare_exchange_strong(&r->pid, &pid, me)) continue;
        r->start_time = start;
        atomic_store(&r->reader_epoch, 0);
        /* Walks a dead holder announced end with it. */
        for (uint32_t kg = 0; kg < a->hdr->max_parallelism; kg++)
            atomic_fetch_and(&a->tables[kg].walkers, ~(1u << i));
        *slot = STASH_MAX_WORKERS + i;
        return 0;
    }
    return shm_fail(STASH_EBUSY, "%s: all %u reader slots are held by live processes", a->path,
                    SHM_READERS);
}

void shm_reader_leave(stash_arena *a, uint32_t slot)
{
    shm_reader *r = &a->hdr->readers[slot - STASH_MAX_WORKERS];
    atomic_store(&r->reader_epoch, 0);
    atomic_store(&r->pid, 0);
}

bool shm_reader_alive(const stash_arena *a, uint32_t holder)
{
    if (holder == 0 || holder > SHM_READERS) return false;
    const shm_reader *r = &a->hdr->readers[holder - 1];
    int32_t pid = atomic_load(&r->pid);
    return pid != 0 && shm_proc_alive(pid, r->start_time);
}
