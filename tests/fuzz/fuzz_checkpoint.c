/* SPDX-License-Identifier: MIT */
/*
 * fuzz_checkpoint.c: a mutated checkpoint (metadata, blocks, LZ4, operator
 * state, incremental chains) is refused by verify and restore alike, with
 * file and offset, or passes both and restores exactly what its files say:
 * the records in the arena after the restore have the digest of the
 * checkpoint's records as of its id, and the operator state of as many
 * workers.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/checkpoint/checkpoints.h"
#include "shm/shm.h"
#include "tests/fuzz/fuzz_common.h"

static ioe_engine *engine;

typedef struct walk {
    const ckpt_view *v;
    fuzz_digest d;
} walk;

static const char *state_name(const ckpt_view *v, uint16_t id)
{
    static ckpt_state s;
    for (uint32_t i = 0; i < v->nstates; i++) {
        s = ckpt_view_state(v, i);
        if (s.id == id) return s.name;
    }
    return "?";
}

static int digest_record(void *ctx, uint32_t kg, const snap_record *r)
{
    walk *w = ctx;
    if (!(r->flags & SNAP_REC_DELETED))
        fuzz_digest_add(&w->d, kg, state_name(w->v, r->state), r->key, r->klen, r->ns, r->nslen,
                        r->value, r->vlen);
    return 0;
}

/* The arena's keyed records, as its owner sees them. */
static fuzz_digest arena_digest(stash_arena *a)
{
    fuzz_digest d = {0};
    for (uint32_t kg = 0; kg < a->hdr->max_parallelism; kg++) {
        uint32_t pos = 0;
        for (shm_rec *r; (r = shm_table_next(a, kg, &pos, NULL));) {
            if (r->flags & SHM_REC_TOMBSTONE) continue;
            if (r->state == 0 || r->state > SHM_CATALOG_SIZE) abort();
            fuzz_digest_add(&d, kg, a->catalog[r->state - 1].name, shm_rec_key(r), r->klen,
                            shm_rec_ns(r), r->nslen, shm_rec_value(r), atomic_load(&r->vlen));
        }
    }
    return d;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!engine && ioe_engine_open(&(ioe_opts){.depth = 8, .buf_count = 4}, &engine) < 0) abort();
    const char *ck = fuzz_unpack(data, size);
    if (!ck) return 0;
    /* What stash snapshot verify does. */
    ckpt_view v;
    int verified = ckpt_view_open_path(ck, engine, &v);
    walk w = {.v = &v};
    if (verified == 0) {
        int64_t n = ckpt_view_walk(&v, (stash_kg_range){0, v.max_parallelism - 1}, NULL, NULL);
        if (n >= 0)
            n = ckpt_view_walk_latest(&v, (stash_kg_range){0, v.max_parallelism - 1}, digest_record,
                                      &w);
        verified = n < 0 ? (int)n : 0;
    }
    uint32_t maxp = verified == 0 ? v.max_parallelism : 0;
    uint32_t op_workers = verified == 0 ? v.op_parallelism : 0;
    ckpt_view_close(&v);
    /* What a restore does, into a new arena of the checkpoint's key groups. */
    uint64_t id;
    uint32_t restore_maxp;
    int rc = ckpt_path_info(ck, engine, &id, &restore_maxp);
    if (rc == 0 && verified == 0 && restore_maxp != maxp) abort();
    char name[64];
    snprintf(name, sizeof name, "fuzz-%d", (int)getpid());
    stash_arena *a = NULL;
    if (rc == 0)
        rc = stash_arena_create(name,
                                &(stash_arena_opts){.sz = sizeof(stash_arena_opts),
                                                    .size = 64u << 20,
                                                    .max_parallelism = restore_maxp,
                                                    .flags = STASH_ARENA_REPLACE},
                                &a);
    if (rc == -ENOMEM || rc == STASH_EFULL) {
        /* Too many key groups for the test's arena: nothing to compare. */
        stash_arena_destroy(name, NULL);
        return 0;
    }
    ckpt_restored out = {0};
    if (rc == 0)
        rc = ckpt_restore_path(a, ck, (stash_kg_range){0, restore_maxp - 1}, engine, NULL, &out);
    if (rc == STASH_EFULL || rc == STASH_ETOOBIG) {
        /* The records do not fit the test's arena: the restore said so. */
    } else if ((rc == 0) != (verified == 0)) {
        fprintf(stderr, "verify says %d, restore %d: %s\n", verified, rc, stash_errmsg());
        abort();
    } else if (rc == 0) {
        fuzz_digest got = arena_digest(a);
        if (got.count != w.d.count || got.sum != w.d.sum || out.op_parallelism != op_workers) {
            fprintf(stderr, "restored %llu records, the checkpoint holds %llu\n",
                    (unsigned long long)got.count, (unsigned long long)w.d.count);
            abort();
        }
    } else if (!strstr(stash_errmsg(), "/")) {
        fprintf(stderr, "a refusal names no file: %s\n", stash_errmsg());
        abort();
    }
    ckpt_restored_free(&out);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    return 0;
}
