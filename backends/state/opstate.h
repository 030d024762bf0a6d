/* SPDX-License-Identifier: MIT */
/*
 * opstate.h: operator state's blobs (opstate.c): how a worker records its
 * operator states at a barrier and gets them back when it starts.
 */
#ifndef STASH_OPSTATE_H
#define STASH_OPSTATE_H

#include "backends/state/state.h"

/* Bytes being built: data (realloc'd; the caller frees it), len of them
 * used, cap held. */
typedef struct op_buf {
    uint8_t *data;
    size_t len, cap;
} op_buf;

/* Encodes every operator state of w into out (replacing its contents). */
int opstate_encode(stash_worker *w, op_buf *out);
/* Checks every byte of a blob and rewrites its state ids through ids (the
 * metadata's id -> the arena's; 0: unknown); what names the blob in errors. */
int opstate_remap(uint8_t *blob, size_t len, const uint16_t *ids, uint32_t nids, const char *what);
/* Copies a blob into out (replacing its contents) without the states
 * dropped[id] names (a byte per possible id); out is empty if none is
 * left. Checks every byte as opstate_remap does. */
int opstate_drop(const uint8_t *blob, size_t len, const uint8_t *dropped, op_buf *out,
                 const char *what);
/* Sets s to its share of the blobs of p workers (redistributed if p is not
 * the worker's parallelism); with p 0, to nothing. */
int opstate_load(stash_state *s, uint32_t p, const ckpt_blob *blobs);
/* Sets s from the control block's committed operator state, if any. */
int opstate_load_committed(stash_state *s);
/* Frees what s holds. */
void opstate_free(stash_state *s);

#endif /* STASH_OPSTATE_H */
