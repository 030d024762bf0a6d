/* SPDX-License-Identifier: MIT */
/*
 * registry.c: the worker registry, a fixed table of slots, one per worker
 * index. A worker joins as index i of p and owns Flink's key-group range for
 * it; the registry refuses a second live holder of an index and live workers
 * that disagree on p, and lets a new process take over a dead holder's slot.
 *
 * The registry lock is robust but needs no repair: a join writes the slot's
 * fields first and its LIVE state last, so a joiner that dies half-way leaves
 * a slot that is still FREE or DEAD, which the next join overwrites.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "shm/table.h"

/* A LIVE slot whose process is gone is DEAD; returns the state that holds. */
static uint32_t settle_state(shm_slot *s)
{
    uint32_t st = atomic_load_explicit(&s->state, memory_order_acquire);
    if (st == SHM_SLOT_LIVE && !shm_proc_alive(s->pid, s->start_time)) {
        atomic_store(&s->state, SHM_SLOT_DEAD);
        return SHM_SLOT_DEAD;
    }
    return st;
}

static int check_peers(stash_arena *a, uint32_t index, uint32_t p)
{
    for (uint32_t i = 0; i < STASH_MAX_WORKERS; i++) {
        shm_slot *s = &a->slots[i];
        if (settle_state(s) != SHM_SLOT_LIVE) continue;
        if (i == index)
            return shm_fail(STASH_EBUSY, "%s: worker index %u is held by live pid %d", a->path,
                            index, s->pid);
        if (s->parallelism != p)
            return shm_fail(STASH_EPARALLELISM,
                            "%s: worker %u (pid %d) runs at parallelism %u, not %u", a->path, i,
                            s->pid, s->parallelism, p);
    }
    return 0;
}

int shm_registry_join(stash_arena *a, uint32_t index, uint32_t p, uint32_t *slot)
{
    uint32_t maxp = a->hdr->max_parallelism;
    stash_kg_range range;
    if (p == 0 || p > maxp || p > STASH_MAX_WORKERS || index >= p ||
        stash_kg_range_of(maxp, p, index, &range) < 0)
        return shm_fail(-EINVAL,
                        "%s: worker index %u of parallelism %u (max parallelism %u, "
                        "at most %u workers)",
                        a->path, index, p, maxp, STASH_MAX_WORKERS);
    int rc = shm_lock_acquire(&a->hdr->registry_lock, NULL, NULL);
    if (rc < 0) return shm_fail(rc, "%s: registry lock: %s", a->path, stash_errmsg());
    rc = check_peers(a, index, p);
    if (rc) {
        shm_lock_release(&a->hdr->registry_lock);
        return rc;
    }
    shm_slot *s = &a->slots[index];
    int32_t previous = atomic_load(&s->state) == SHM_SLOT_DEAD ? s->pid : 0;
    s->index = index;
    s->parallelism = p;
    s->pid = getpid();
    s->start_time = shm_proc_start_time(s->pid);
    s->kg_first = range.first;
    s->kg_last = range.last;
    s->joined_ns = shm_now_ns();
    atomic_store(&s->heartbeat_ns, s->joined_ns);
    s->generation++;
    s->previous_pid = previous;
    atomic_store(&s->reader_epoch, 0);
    atomic_store_explicit(&s->state, SHM_SLOT_LIVE, memory_order_release);
    if (atomic_load(&a->hdr->registry_hwm) <= index) atomic_store(&a->hdr->registry_hwm, index + 1);
    shm_lock_release(&a->hdr->registry_lock);
    /* The keyed tables are what lives in the heaps: made whole first. */
    shm_heap_adopt(a, range, shm_table_recover);
    *slot = index;
    return 0;
}

void shm_registry_leave(stash_arena *a, uint32_t slot)
{
    shm_slot *s = &a->slots[slot];
    if (shm_lock_acquire(&a->hdr->registry_lock, NULL, NULL) < 0) return;
    if (s->pid == getpid() && atomic_load(&s->state) == SHM_SLOT_LIVE) {
        shm_heap_release(a, (stash_kg_range){s->kg_first, s->kg_last});
        atomic_store(&s->state, SHM_SLOT_FREE);
    }
    shm_lock_release(&a->hdr->registry_lock);
}

void shm_registry_describe(stash_arena *a, uint32_t slot, stash_worker_info *out)
{
    shm_slot *s = &a->slots[slot];
    uint32_t st = atomic_load_explicit(&s->state, memory_order_acquire);
    if (st == SHM_SLOT_LIVE && !shm_proc_alive(s->pid, s->start_time)) st = SHM_SLOT_DEAD;
    memset(out, 0, sizeof *out);
    out->index = s->index;
    out->parallelism = s->parallelism;
    out->pid = s->pid;
    out->state = st == SHM_SLOT_LIVE   ? STASH_WORKER_LIVE
                 : st == SHM_SLOT_DEAD ? STASH_WORKER_DEAD
                                       : STASH_WORKER_FREE;
    out->range = (stash_kg_range){s->kg_first, s->kg_last};
    out->joined_ns = s->joined_ns;
    out->heartbeat_ns = atomic_load(&s->heartbeat_ns);
    out->generation = s->generation;
    out->previous_pid = s->previous_pid;
}

STASH_API int stash_op_counts_get(stash_arena *arena, uint32_t index, stash_op_counts *out)
{
    if (!arena || !out) return shm_refuse_null(__func__, "arena or out");
    if (index >= STASH_MAX_WORKERS)
        return shm_fail(-EINVAL, "worker index %u: at most %u", index, STASH_MAX_WORKERS - 1);
    const shm_ctl_worker *cw = &arena->control->workers[index];
    const shm_ctl_ops *o = &cw->ops;
    *out = (stash_op_counts){atomic_load(&o->reads[SHM_OPS_VALUE]),
                             atomic_load(&o->writes[SHM_OPS_VALUE]),
                             atomic_load(&o->reads[SHM_OPS_LIST]),
                             atomic_load(&o->writes[SHM_OPS_LIST]),
                             atomic_load(&o->reads[SHM_OPS_MAP]),
                             atomic_load(&o->writes[SHM_OPS_MAP]),
                             atomic_load(&o->reads[SHM_OPS_MERGING]),
                             atomic_load(&o->writes[SHM_OPS_MERGING]),
                             atomic_load(&cw->rollbacks)};
    return 0;
}

STASH_API int stash_registry_list(stash_arena *arena, stash_worker_info *out, size_t cap, size_t *n)
{
    if (!arena || !n || (!out && cap)) return shm_refuse_null(__func__, "arena, out or n");
    size_t count = 0;
    for (uint32_t i = 0; i < STASH_MAX_WORKERS; i++) {
        if (atomic_load(&arena->slots[i].state) == SHM_SLOT_FREE) continue;
        if (count < cap) shm_registry_describe(arena, i, &out[count]);
        count++;
    }
    *n = count;
    return 0;
}

int shm_registry_cut_free(stash_arena *a, stash_kg_range range, uint32_t holder)
{
    int rc = shm_lock_acquire(&a->hdr->registry_lock, NULL, NULL);
    if (rc < 0) return shm_fail(rc, "%s: registry lock: %s", a->path, stash_errmsg());
    uint32_t hwm = atomic_load(&a->hdr->registry_hwm);
    for (uint32_t i = 0; i < hwm && rc == 0; i++) {
        shm_slot *s = &a->slots[i];
        if (atomic_load(&s->state) != SHM_SLOT_FREE && s->kg_first <= range.last &&
            s->kg_last >= range.first)
            rc = -EBUSY;
    }
    /* No owner writes while the lock keeps workers out: the pins are the cut. */
    for (uint32_t kg = range.first; rc == 0 && kg <= range.last; kg++) {
        if (atomic_load(&a->tables[kg].cut)) continue;
        int64_t v = shm_table_pin_for(a, kg, holder, true);
        if (v > 0) atomic_store(&a->tables[kg].cut, (uint32_t)v);
    }
    shm_lock_release(&a->hdr->registry_lock);
    return rc;
}
