/* SPDX-License-Identifier: MIT */
/*
 * lmdb_fetch.h: reads ahead on reader threads. A worker's batch knows the
 * keys its handlers will read; with state larger than memory each read may
 * wait for a page from disk, one at a time on the worker's thread. Reader
 * threads look the keys up first, each in a read transaction of its own,
 * so that many page reads are in flight at once and the worker's reads,
 * through its own write transaction, find the pages in memory.
 */
#ifndef STASH_BACKENDS_LMDB_FETCH_H
#define STASH_BACKENDS_LMDB_FETCH_H

#include <stddef.h>
#include <stdint.h>

#include "backends/lmdb/lmdb_env.h"

typedef struct lmdb_fetcher lmdb_fetcher;

/* Starts the reader threads for environments of up to maxp key groups.
 * Returns 0 or an error. */
int lmdb_fetch_start(uint32_t maxp, lmdb_fetcher **out);

/* Queues a look-up of the stored key (len bytes, copied) in environment x
 * of key group kg; dropped if the queue is full. lmdb_fetch_go() hands the
 * queued ones to the threads. */
void lmdb_fetch_queue(lmdb_fetcher *f, lmdb_env *x, uint32_t kg, const void *key, size_t len);
void lmdb_fetch_go(lmdb_fetcher *f);

/* The major page faults the threads' look-ups took since the last call:
 * none, and reading ahead only costs the worker a core. */
uint64_t lmdb_fetch_faults(lmdb_fetcher *f);

/* Stops the threads, which end their transactions first. Accepts NULL. */
void lmdb_fetch_stop(lmdb_fetcher *f);
/* Frees what a forked child inherited: its threads are its opener's. */
void lmdb_fetch_forget(lmdb_fetcher *f);

#endif /* STASH_BACKENDS_LMDB_FETCH_H */
