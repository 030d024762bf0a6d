/* SPDX-License-Identifier: MIT */
/*
 * stores.c: the table of keyed stores, one per backend an arena is
 * created with, and opening a handle on an arena's.
 */
#include <errno.h>

#include "backends/store/store.h"

static const store_ops *const stores[] = {
    [STASH_BACKEND_HEAP] = &heap_store_ops,
    [STASH_BACKEND_LMDB] = &lmdb_store_ops,
};

const store_ops *store_ops_of(uint32_t backend)
{
    return backend < sizeof stores / sizeof stores[0] ? stores[backend] : NULL;
}

int store_open(stash_arena *a, uint32_t slot, stash_kg_range range, store **out)
{
    const store_ops *ops = store_ops_of(a->hdr->backend);
    if (!ops)
        return shm_fail(STASH_EFORMAT, "%s: keyed state of backend %u, which this build lacks",
                        a->path, a->hdr->backend);
    int rc = ops->open(a, out);
    if (rc) return rc;
    (*out)->slot = slot;
    (*out)->range = range;
    return 0;
}

void store_close(store *st)
{
    if (st) st->ops->close(st);
}
