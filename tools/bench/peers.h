/* SPDX-License-Identifier: MIT */
/*
 * peers.h: the systems the keyed bench measures stash against, behind
 * one small interface: raw tables in shared memory (raw.h: the speed
 * limit, and a plain table), LMDB, RocksDB and Redis. Each holds values, lists and maps
 * under 8-byte keys the way its users would store Flink-style keyed state.
 */
#ifndef STASH_TOOLS_BENCH_PEERS_H
#define STASH_TOOLS_BENCH_PEERS_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tools/bench/bench.h"
#include "tools/bench/ycsb.h"

/* Fills the caller's why (whylen bytes) and evaluates to -1. */
#define WHY(...) (snprintf(why, whylen, __VA_ARGS__), -1)

/* The key of key index i: splitmix64's finalizer of i, a bijection, so
 * that keys are arbitrary 8-byte keys as users' are (not dense indices
 * that one hash spreads perfectly and another badly), distinct, and the
 * same for every system. */
static inline uint64_t bench_key(uint64_t i)
{
    uint64_t z = i + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t bench_unshift(uint64_t y, unsigned s)
{
    for (unsigned t = s; t < 64; t += t) y ^= y >> t;
    return y;
}

/* The key index of a key: bench_key undone (the multipliers' inverses mod
 * 2^64). Only the raw table that is the one-miss limit uses it. */
static inline uint64_t bench_key_index(uint64_t key)
{
    uint64_t z = bench_unshift(key, 31) * 0x319642B2D24D8EC3ull;
    z = bench_unshift(z, 27) * 0x96DE1B173F119089ull;
    return bench_unshift(z, 30) - 0x9E3779B97F4A7C15ull;
}

/* The keyed bench's values: every write is of this many bytes. */
#define BENCH_VALUE_LEN 100

/* A read's checksum: its bytes as 8-byte words (the last one padded with
 * zeros), each XORed with a constant of its place, summed, and its length.
 * Every system's reads pass through it in the same loop, so it is kept to
 * a few vector instructions for a value of BENCH_VALUE_LEN bytes: a check
 * that took more would narrow the window in which the processor overlaps
 * one operation's misses with the next, and narrow it most for the
 * systems that do least. */
static inline uint64_t bench_checksum_n(const uint8_t *b, size_t n)
{
    uint64_t sum = n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        sum += w ^ (0x9E3779B97F4A7C15ull * (i + 8));
    }
    if (i < n) {
        uint64_t w = 0;
        memcpy(&w, b + i, n - i);
        sum += w ^ (0x9E3779B97F4A7C15ull * (i + 8));
    }
    return sum;
}

static inline uint64_t bench_checksum(const void *p, size_t n)
{
    return n == BENCH_VALUE_LEN ? bench_checksum_n(p, BENCH_VALUE_LEN) : bench_checksum_n(p, n);
}

/* Keys as their users would write them: 8 bytes; a map entry is the key
 * followed by the user key (Flink's RocksDB layout). */
static inline void encode_key(uint64_t key, uint8_t out[8])
{
    memcpy(out, &key, 8);
}

/* Copies n bytes of a value into out (cap bytes); -EMSGSIZE if they do not
 * fit. A value of BENCH_VALUE_LEN bytes is copied by a few moves, not a
 * call, for every system alike. */
static inline int copy_out(const void *v, size_t n, void *out, size_t cap, size_t *len)
{
    if (n > cap) return -EMSGSIZE;
    if (n == BENCH_VALUE_LEN)
        memcpy(out, v, BENCH_VALUE_LEN);
    else
        memcpy(out, v, n);
    *len = n;
    return 0;
}

typedef struct kv_sys kv_sys;

/* One operation of a batch, the i-th. */
typedef int kv_batch_fn(kv_sys *s, size_t i, void *ctx);

/* A system's operations. Keys are key indices (encoded as 8 bytes by each
 * system), map user keys are indices too. Reads copy what they find into out
 * (cap bytes) and set *len; a missing key is -ENOENT. An operation that a
 * system cannot express is NULL. Errors are negative, with sys->error set. */
typedef struct kv_ops {
    int (*value_get)(kv_sys *s, uint64_t key, void *out, size_t cap, size_t *len);
    int (*value_put)(kv_sys *s, uint64_t key, const void *v, size_t len);
    int (*list_add)(kv_sys *s, uint64_t key, const void *v, size_t len);
    /* The elements, in order, one after another. */
    int (*list_get)(kv_sys *s, uint64_t key, void *out, size_t cap, size_t *len);
    int (*map_put)(kv_sys *s, uint64_t key, uint64_t ukey, const void *v, size_t len);
    int (*map_get)(kv_sys *s, uint64_t key, uint64_t ukey, void *out, size_t cap, size_t *len);
    /* Runs fn(s, i, ctx) for i = 0 .. n-1 in order, the operations on
     * keys[0 .. n-1], after fetching ahead what they will touch; NULL where
     * the system has no such road. Returns the first error. */
    int (*run_batch)(kv_sys *s, const uint64_t *keys, size_t n, kv_batch_fn *fn, void *ctx);
    /* Completes what is pending: a batch of pipelined commands, a write
     * transaction. Called after every batch and at the end of each pass. */
    int (*sync)(kv_sys *s);
    /* Optional, outside every timed pass: waits for the work the system
     * does in the background (flushes, compactions), so that it takes no
     * processor from the next pass, whichever system's. */
    int (*quiesce)(kv_sys *s);
    /* Optional, outside every timed pass, before a case that only reads:
     * puts the data in the shape the system reads fastest (RocksDB:
     * flushed and compacted into one level). */
    int (*ready_reads)(kv_sys *s);
    /* Bytes the system holds for its data, for the per-entry overhead; NULL
     * where no honest figure exists. */
    int (*footprint)(kv_sys *s, uint64_t *bytes);
    /* Releases the system and removes what it created. */
    void (*close)(kv_sys *s);
} kv_ops;

struct kv_sys {
    const kv_ops *ops;
    const char *name; /* the "system" of the report */
    unsigned batch;   /* operations issued before sync() collects them: 1 unless pipelined */
    char error[256];  /* what went wrong last */
    uint64_t sum;     /* pipelined: the checksums of the replies sync() took */
};

/* What a system is opened for: one group of cases, on fresh data. */
typedef struct kv_plan {
    const char *dir;   /* an empty private directory for files */
    uint64_t entries;  /* values, or map entries, the load writes */
    uint64_t bytes;    /* payload bytes the group may write in all (sizes maps) */
    size_t value_len;  /* the fixed value size: what the raw table's slots hold */
    bool integer_keys; /* every key is 8 bytes (no map entries) */
} kv_plan;

/* Writes per LMDB write transaction: the LMDB peer commits this often, and
 * so does stash's lmdb store in the same comparison. */
#define PEER_LMDB_COMMIT_EVERY 1000

/* Each opener returns 0 and *out, or a negative code with why[] saying what
 * is missing or failed (reported as "skipped"). */
int peer_lmdb_open(const kv_plan *plan, kv_sys **out, char *why, size_t whylen);
/* RocksDB at its best (flink false: a 10-bit bloom filter, compacted before
 * a case that only reads), or as Flink's RocksDB backend sets it up (no
 * bloom filter, reads wherever the data lies). */
int peer_rocksdb_open(const kv_plan *plan, bool flink, kv_sys **out, char *why, size_t whylen);

/* A redis-server started by the bench on a free loopback port, with no
 * persistence, in dir; stopped (and waited for) by peer_redis_stop. */
typedef struct peer_redis_server peer_redis_server;
int peer_redis_start(const char *dir, peer_redis_server **out, char *why, size_t whylen);
void peer_redis_stop(peer_redis_server *srv);
/* Empties the server and connects to it: pipelined (depth commands per
 * batch) or one command per round trip. */
int peer_redis_open(peer_redis_server *srv, unsigned depth, kv_sys **out, char *why, size_t whylen);
/* Runs BGSAVE on srv while a process of its own replays ops (value gets
 * and puts of value_len bytes, pipelined) against it; *cow is what the
 * snapshot's fork copied on write (rdb_last_cow_size), *dataset the data's
 * bytes (used_memory_dataset). series (NULL: none) gets the load's
 * operations over time, with BGSAVE's start and end. Returns 0, or -1 with why. */
int peer_redis_bgsave(peer_redis_server *srv, const ycsb_op *ops, uint64_t nops, unsigned value_len,
                      uint64_t *cow, uint64_t *dataset, bench_series *series, char *why,
                      size_t whylen);

#endif /* STASH_TOOLS_BENCH_PEERS_H */
