/* SPDX-License-Identifier: MIT */
/*
 * ycsb.c: the operation sequences of the keyed bench, generated before any
 * clock starts: YCSB's zipfian (Gray et al., "Quickly generating
 * billion-record synthetic databases", SIGMOD 1994) scrambled with FNV-1a as
 * YCSB's ScrambledZipfianGenerator does, or uniform keys.
 */
#include <errno.h>
#include <math.h>

#include "tools/bench/ycsb.h"

/* splitmix64: a fast, well-mixed stream from a seed; quality is ample for
 * picking keys, and the sequence is the same on every run. */
static uint64_t next_random(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A double uniform in [0, 1). */
static double next_unit(uint64_t *state)
{
    return (double)(next_random(state) >> 11) * 0x1.0p-53;
}

/* A uniform integer in [0, n) without modulo bias worth speaking of (n < 2^32). */
static uint64_t next_below(uint64_t *state, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)next_random(state) * n) >> 64);
}

void ycsb_zipf_init(ycsb_zipf *z, uint64_t n, double theta)
{
    double zetan = 0;
    for (uint64_t i = 1; i <= n; i++) zetan += 1.0 / pow((double)i, theta);
    double zeta2 = 1.0 + 1.0 / pow(2.0, theta);
    *z = (ycsb_zipf){
        .n = n,
        .theta = theta,
        .alpha = 1.0 / (1.0 - theta),
        .zetan = zetan,
        .eta = (1.0 - pow(2.0 / (double)n, 1.0 - theta)) / (1.0 - zeta2 / zetan),
        .half_pow_theta = 1.0 + pow(0.5, theta),
    };
}

uint64_t ycsb_zipf_rank(const ycsb_zipf *z, double u)
{
    double uz = u * z->zetan;
    if (uz < 1.0) return 0;
    if (uz < z->half_pow_theta) return 1;
    uint64_t r = (uint64_t)((double)z->n * pow(z->eta * u - z->eta + 1.0, z->alpha));
    return r < z->n ? r : z->n - 1;
}

uint64_t ycsb_scramble(uint64_t rank, uint64_t n)
{
    uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a 64 over the rank's 8 bytes, as YCSB */
    for (int i = 0; i < 8; i++) {
        h ^= (rank >> (8 * i)) & 0xff;
        h *= 0x100000001B3ull;
    }
    return h % n;
}

int ycsb_generate(const ycsb_spec *spec, ycsb_op *ops, uint64_t n)
{
    if (spec->keys == 0 || spec->keys > UINT32_MAX || spec->subkeys > UINT16_MAX ||
        spec->first_share < 0 || spec->first_share > 1)
        return -EINVAL;
    ycsb_zipf z;
    if (spec->zipfian) ycsb_zipf_init(&z, spec->keys, 0.99);
    uint64_t rs = spec->seed;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t key = spec->zipfian ? ycsb_scramble(ycsb_zipf_rank(&z, next_unit(&rs)), spec->keys)
                                     : next_below(&rs, spec->keys);
        ycsb_kind kind = next_unit(&rs) < spec->first_share ? spec->first : spec->second;
        uint64_t sub = spec->subkeys ? next_below(&rs, spec->subkeys) : 0;
        ops[i] = (ycsb_op){.key = (uint32_t)key, .kind = (uint16_t)kind, .sub = (uint16_t)sub};
    }
    return 0;
}
