/* SPDX-License-Identifier: MIT */
/*
 * catalog.c: the arena's catalog of states. A name maps to one id and one
 * kind for the arena's life, whichever process registers it first; a later
 * registration must agree on the kind and on whether the state has TTL (its
 * stored values then carry timestamps: the options' first 8 bytes, the TTL
 * in ms, are non-zero), and its options replace the entry's (Flink lets a
 * job restore a state with another TTL duration). Registration is rare and
 * takes the catalog's robust lock; the entry's "used" mark is written last,
 * so a registrar that dies half-way leaves a free entry.
 */
#include <errno.h>
#include <string.h>

#include "shm/shm.h"

/* Whether options say the state's stored values carry TTL timestamps. */
static bool has_ttl(const uint8_t options[32])
{
    uint64_t ttl_ms;
    memcpy(&ttl_ms, options, sizeof ttl_ms);
    return ttl_ms != 0;
}

int shm_catalog_register(stash_arena *a, const char *name, uint32_t kind, const uint8_t options[32])
{
    size_t n = strlen(name);
    if (n == 0 || n >= SHM_STATE_NAME)
        return shm_fail(-EINVAL, "state name '%s': 1 to %u bytes", name, SHM_STATE_NAME - 1);
    int rc = shm_lock_acquire(&a->hdr->catalog_lock, NULL, NULL);
    if (rc < 0) return shm_fail(rc, "%s: catalog lock: %s", a->path, stash_errmsg());
    int id = 0, free_id = 0;
    for (uint32_t i = 0; i < SHM_CATALOG_SIZE && !id; i++) {
        shm_catalog_entry *e = &a->catalog[i];
        if (!atomic_load(&e->used)) {
            if (!free_id) free_id = (int)i + 1;
        } else if (strcmp(e->name, name) == 0) {
            id = (int)i + 1;
            if (e->kind != kind || has_ttl(e->options) != has_ttl(options))
                id = shm_fail(STASH_EKIND,
                              "%s: state '%s' is registered as kind %u %s TTL: it cannot be "
                              "kind %u %s",
                              a->path, name, e->kind, has_ttl(e->options) ? "with" : "without",
                              kind, has_ttl(options) ? "with TTL" : "without TTL");
            else
                memcpy(e->options, options, sizeof e->options);
        }
    }
    if (!id && free_id) {
        shm_catalog_entry *e = &a->catalog[free_id - 1];
        memcpy(e->name, name, n + 1);
        e->kind = kind;
        memcpy(e->options, options, sizeof e->options);
        atomic_store_explicit(&e->used, 1, memory_order_release);
        id = free_id;
    } else if (!id) {
        id =
            shm_fail(-ENOSPC, "%s: the catalog holds %u states already", a->path, SHM_CATALOG_SIZE);
    }
    shm_lock_release(&a->hdr->catalog_lock);
    return id;
}

int shm_catalog_find(stash_arena *a, const char *name, uint32_t kind, bool ttl)
{
    for (uint32_t i = 0; i < SHM_CATALOG_SIZE; i++) {
        const shm_catalog_entry *e = &a->catalog[i];
        if (!atomic_load_explicit(&e->used, memory_order_acquire) || strcmp(e->name, name) != 0)
            continue;
        if (e->kind != kind || has_ttl(e->options) != ttl)
            return shm_fail(STASH_EKIND,
                            "%s: state '%s' is registered as kind %u %s TTL, not kind %u %s",
                            a->path, name, e->kind, has_ttl(e->options) ? "with" : "without", kind,
                            ttl ? "with TTL" : "without TTL");
        return (int)i + 1;
    }
    return shm_fail(STASH_ENOTFOUND, "%s: no state '%s' is registered", a->path, name);
}
