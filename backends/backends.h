/*
 * backends.h: the internal interface shared by the keyed backends, operator
 * state and the checkpoint storages, all built on the arena (shm/).
 */
#ifndef STASH_BACKENDS_H
#define STASH_BACKENDS_H

#include "shm/shm.h"

/* A worker: one process's membership of an arena's registry. */
struct stash_worker {
    stash_arena *arena;
    uint32_t slot;
};

#endif /* STASH_BACKENDS_H */
