/* SPDX-License-Identifier: MIT */
/*
 * service.h: what the worker side (barrier.c) and the persistence engine
 * (service.c) share: the protocol over the arena's control block.
 *
 * Checkpoint N: the engine stores pending = N; each worker, at its next
 * barrier, records its operator state as workers[i].pending, pins each of
 * its key groups for the engine (tables[kg].cut) and stores acked = N. When
 * every worker acked, the engine clears pending, takes the cut versions,
 * writes, commits, and publishes completed = N (or aborted = N). A worker
 * that cut after the engine gave N up (aborted >= N) releases its own pins;
 * whichever of the two takes a key group's cut with an exchange unpins it.
 */
#ifndef STASH_SERVICE_H
#define STASH_SERVICE_H

#include "backends/checkpoint/checkpoints.h"

/* Rolls the worker's key groups and operator state back to the newest
 * complete checkpoint of the service's directory, once a checkpoint its
 * index already cut has ended. */
int worker_rollback(stash_worker *w);

/* Takes the worker through the arena's newest fallback to an older
 * checkpoint (a lazy restore found a damaged block), if its index has not
 * been through it: its key groups emptied, to come again from that
 * checkpoint, its operator state and timers the checkpoint's; its next
 * barrier says STASH_ROLLED_BACK. At a barrier, or when it opens. */
int worker_fall_back(stash_worker *w);

/* STASH_EFENCED naming why: the arena's host was fenced off its job. */
int worker_fenced(stash_worker *w);

/* Makes the worker wait for key groups a lazy restore has yet to bring. */
void worker_watch_lazy(stash_worker *w);

/* Waits until the checkpoint the worker's index cut last (acked) has
 * completed or failed, or no engine runs. */
void worker_await_cut_end(stash_worker *w);

/* Records the worker's operator state as its pending blob (at a cut, and
 * when it leaves). */
int worker_record_opstate(stash_worker *w);

/* Installs a restore's operator state as the arena's committed set, of
 * the checkpoint's workers: what workers opening the arena start from. */
int service_install_opstate(stash_arena *a, const ckpt_restored *r);

/* Builds an arena of the caller's own (in memory, named nowhere), filled
 * from the checkpoint or savepoint directory path, or with path NULL from
 * the newest complete checkpoint of the service serving arena name (live:
 * where that arena lives). Returns 0 and *out, or an error naming the
 * checkpoint. */
int service_view_create(const char *name, const stash_arena_opts *live, const char *path,
                        stash_arena **out);

/* A worker on arena a (owned by the worker from here, closed on failure),
 * as stash_worker_open makes one on an arena it opens by name. */
int service_worker_open_on(stash_arena *a, const stash_worker_opts *opts, stash_worker **out);

/* Releases the pin of every key group's cut (an abandoned checkpoint). */
void service_release_cuts(stash_arena *a);

#endif /* STASH_SERVICE_H */
