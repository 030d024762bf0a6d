/* SPDX-License-Identifier: MIT */
/*
 * workload.h: the deterministic workload the crash campaigns apply to a
 * worker's keyed state, and its model. Event i of the input stream adds to
 * key key_of(i): a ValueState of a count and a sum of weights, a MapState
 * of counts per class, a ListState of marks (every MARK_EVERY-th event);
 * a worker applies the events whose keys it owns and keeps the offset of
 * the next one in operator ListState. The model replays the stream up to
 * an offset, so a worker that starts anywhere checks every key it owns.
 */
#ifndef STASH_TEST_WORKLOAD_H
#define STASH_TEST_WORKLOAD_H
#include <stdint.h>

#include "include/stash.h"

#define WL_KEYS 4096u
#define WL_CLASSES 4u
#define WL_MARK_EVERY 64u /* every 64th event appends its offset to the key's list */

uint64_t wl_mix64(uint64_t x);

/* A worker's states. */
typedef struct wl_job {
    stash_worker *w;
    stash_state *sums, *classes, *marks, *offset;
    stash_kg_range range;
    uint32_t maxp; /* the arena's key groups */
} wl_job;

/* Registers the workload's states on w (of an arena of maxp key groups)
 * into j. Returns 0 or what the
 * failing call returned, with *what naming the state. */
int wl_open(wl_job *j, stash_worker *w, uint32_t maxp, const char **what);
/* The offset j's operator state records (0: none). */
uint64_t wl_offset(wl_job *j);
/* Records next as j's offset. */
int wl_record(wl_job *j, uint64_t next);
/* Applies event i to its key, if j owns it. */
int wl_apply(wl_job *j, uint64_t i);
/* Applies event i and records i + 1 as the offset; *what names the step
 * that failed. */
int wl_step(wl_job *j, uint64_t i, const char **what);
/* Compares every key j owns with the model at offset: the keys compared
 * and the values that differ (a key's sum, a class count, a mark). */
int wl_check(wl_job *j, uint64_t offset, uint64_t *keys, uint64_t *bad);
#endif /* STASH_TEST_WORKLOAD_H */
