/* SPDX-License-Identifier: MIT */
/*
 * demo_windows.h: the demo's event-time windows (demo_windows.c): per user,
 * tumbling windows of 10 minutes of event time counted in keyed state
 * (the window is the namespace) and emitted when the window's timer fires,
 * through a sink that commits each checkpoint's output once the checkpoint
 * is complete (Flink's two-phase commit sink), so that every window is
 * written exactly once across kills and restores.
 */
#ifndef STASH_DEMO_WINDOWS_H
#define STASH_DEMO_WINDOWS_H

#include <stdint.h>

#include "include/stash.h"

#define WINDOW_MS 600000ull /* ten minutes */

/* Event time: event i happens at about i ms, out of order by up to 5 s. */
uint64_t demo_event_time(uint64_t i);
/* The watermark once events 0 .. i were read: no later event is older. */
uint64_t demo_watermark(uint64_t i);

/* One worker's windows and sink. */
typedef struct demo_windows {
    stash_worker *w;
    stash_state *counts; /* ValueState per user, namespace the window */
    stash_state *outbox; /* operator ListState: transactions cut, not yet committed */
    stash_timers *timers;
    int out;            /* the worker's output file */
    uint64_t committed; /* the newest transaction the file holds */
    uint8_t *staged;    /* windows fired since the last cut */
    size_t staged_len, staged_cap;
    uint64_t recommitted, skipped; /* restored transactions committed now, or found committed */
    uint64_t emitted;              /* windows this process committed */
} demo_windows;

/* Registers the states of worker w (index index), recovers its output file
 * in dir (a transaction half written is cut off) and commits the
 * transactions its restored operator state holds that the file lacks. */
int demo_windows_open(demo_windows *d, stash_worker *w, uint32_t index, const char *dir);
/* Counts event i (its user the current key) in its window. */
int demo_windows_add(demo_windows *d, uint64_t i);
/* Fires the windows the watermark closes. */
int demo_windows_advance(demo_windows *d, uint64_t watermark);
/* The worker's on_cut: stages the fired windows as transaction id. */
int demo_windows_cut(stash_worker *w, uint64_t id, void *ctx);
/* Checkpoint id is complete: commits the transactions up to it. */
int demo_windows_complete(demo_windows *d, uint64_t id);
void demo_windows_close(demo_windows *d);

/* Reads the output files of workers 0 .. workers-1 in dir and checks each
 * window of the stream (events 0 .. events-1, user_of(i) their users)
 * against a replay: emitted once with its exact count. Sets *windows to
 * the windows expected, *missing, *twice and *wrong; returns 0 or an error. */
int demo_windows_check(const char *dir, uint32_t workers, uint64_t events, uint64_t users,
                       uint64_t (*user_of)(uint64_t), uint64_t *windows, uint64_t *missing,
                       uint64_t *twice, uint64_t *wrong);

#endif /* STASH_DEMO_WINDOWS_H */
