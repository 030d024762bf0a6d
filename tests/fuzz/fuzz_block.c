/* SPDX-License-Identifier: MIT */
/*
 * fuzz_block.c: one key group's block as the reader meets it in a data file
 * (header, checksums, LZ4 payload, records): refused with its offset, or
 * every record it yields lies inside the decoded payload and hashes into
 * the block's key group. The checksums are computed again over the mutated
 * bytes, so that mutations reach the payload's decoders.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "backends/checkpoint/checkpoints.h"
#include "include/stash.h"

#define MAXP 128u

static int check_record(void *ctx, uint32_t kg, const snap_record *r)
{
    const snap_block *b = ctx;
    const uint8_t *lo = b->payload, *hi = b->payload + b->hdr.raw_len;
    if (r->key < lo || r->key + r->klen > hi || r->ns < lo || r->ns + r->nslen > hi ||
        r->value < lo || r->value + r->vlen > hi)
        abort();
    if (stash_key_group(r->key, r->klen, MAXP) != kg) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static snap_buf scratch;
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    if (size >= sizeof(snap_block_hdr)) {
        snap_block_hdr h;
        memcpy(&h, copy, sizeof h);
        size_t stored = size - sizeof h;
        if (h.stored_len < stored) stored = h.stored_len;
        h.payload_crc = snap_crc32c(0, copy + sizeof h, stored);
        h.header_crc = snap_crc32c(0, &h, offsetof(snap_block_hdr, header_crc));
        memcpy(copy, &h, sizeof h);
    }
    snap_block b;
    if (snap_read_block(copy, size, "block", 0, &scratch, &b) == 0)
        snap_block_records(&b, MAXP, check_record, &b, "block", 0);
    free(copy);
    return 0;
}
