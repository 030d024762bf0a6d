/* SPDX-License-Identifier: MIT */
/*
 * ycsb.h: YCSB-style operation sequences for the keyed bench: key indices
 * drawn uniformly or from YCSB's scrambled zipfian, and a mix of two
 * operation kinds, generated once so that every system replays the same one.
 */
#ifndef STASH_TOOLS_YCSB_H
#define STASH_TOOLS_YCSB_H

#include <stdbool.h>
#include <stdint.h>

typedef enum ycsb_kind {
    YCSB_GET,      /* read a value */
    YCSB_PUT,      /* overwrite a value */
    YCSB_RMW,      /* read a value, change it, write it back (one operation) */
    YCSB_LIST_ADD, /* append an element to a list */
    YCSB_LIST_GET, /* read every element of a list */
    YCSB_MAP_PUT,  /* overwrite the entry of one user key in a map */
    YCSB_MAP_GET,  /* read the entry of one user key in a map */
} ycsb_kind;

/* One operation: its kind, the key index and, for maps, the user key index. */
typedef struct ycsb_op {
    uint32_t key;
    uint16_t kind; /* ycsb_kind */
    uint16_t sub;
} ycsb_op;

typedef struct ycsb_spec {
    uint64_t keys;    /* key indices 0 .. keys-1 */
    bool zipfian;     /* zipfian with theta 0.99, scrambled; otherwise uniform */
    ycsb_kind first;  /* the kind of a fraction first_share of the operations */
    ycsb_kind second; /* the kind of the others */
    double first_share;
    uint32_t subkeys; /* user keys per map: sub is uniform in 0 .. subkeys-1 */
    uint64_t seed;
} ycsb_spec;

/* Gray et al.'s zipfian generator over ranks 0 .. n-1, as YCSB has it. */
typedef struct ycsb_zipf {
    uint64_t n;
    double theta, alpha, zetan, eta, half_pow_theta;
} ycsb_zipf;

/* Prepares a zipfian over n ranks (computing zeta(n) takes n steps). */
void ycsb_zipf_init(ycsb_zipf *z, uint64_t n, double theta);
/* The rank for a uniform draw u in [0, 1): rank 0 is the most popular. */
uint64_t ycsb_zipf_rank(const ycsb_zipf *z, double u);
/* YCSB's scrambling of a rank into a key index: FNV-1a 64 of the rank mod n,
 * so that popular keys are spread over the key space. */
uint64_t ycsb_scramble(uint64_t rank, uint64_t n);

/* Fills ops[0 .. n-1] after spec. Returns 0, or -EINVAL on a bad spec. */
int ycsb_generate(const ycsb_spec *spec, ycsb_op *ops, uint64_t n);

#endif /* STASH_TOOLS_YCSB_H */
