/* SPDX-License-Identifier: MIT */
/*
 * fuzz_common.h: what the fuzz targets share: a checkpoint directory built
 * from one input (a packed checkpoint) and a content digest of records.
 *
 * A packed checkpoint is a sequence of sections, each a 4-byte little-endian
 * length and that many bytes: the first is DIR/ck/_metadata, the second
 * DIR/ck/kg-data.dat, the n-th after them DIR/shared/<n>.dat (n from 1).
 * The directory "ck" names no id, so the id its metadata says is taken.
 * FUZZ_SEAL set in the first length asks for the metadata's checksum to be
 * computed again over its bytes, so that mutations reach what it guards.
 */
#ifndef STASH_FUZZ_COMMON_H
#define STASH_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

#define FUZZ_MAX_SECTIONS 12u
#define FUZZ_SEAL 0x80000000u

/* Writes the sections of a packed checkpoint under a directory of this
 * process's own (made once) and returns the checkpoint's path; NULL if the
 * input holds no section. Files of an earlier input are removed first. */
const char *fuzz_unpack(const uint8_t *data, size_t size);

/* Appends one section to a packed checkpoint in buf (cap bytes) at *len;
 * -1 if it does not fit. */
int fuzz_pack_section(uint8_t *buf, size_t cap, size_t *len, const void *data, uint32_t n);

/* An order-independent digest of records: their count and the sum of a hash
 * of each (key group, state name, key, namespace, value). */
typedef struct fuzz_digest {
    uint64_t count;
    uint64_t sum;
} fuzz_digest;

void fuzz_digest_add(fuzz_digest *d, uint32_t kg, const char *state, const void *key, size_t klen,
                     const void *ns, size_t nslen, const void *value, size_t vlen);

#endif
