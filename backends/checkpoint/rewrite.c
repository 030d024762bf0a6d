/* SPDX-License-Identifier: MIT */
/*
 * rewrite.c: stash_snapshot_rewrite: a snapshot written anew as a
 * savepoint. Its records go from the source's blocks straight into the new
 * ones (a dropped state's left out, their TTL times added or taken out,
 * re-hashed into another number of key groups) and are committed by
 * ckpt_write_source into a directory beside the destination, then moved
 * into place. State ids stay the source's; only the metadata's names and
 * options change.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/checkpoint/ckpt.h"
#include "backends/checkpoint/mirror.h"
#include "backends/state/opstate.h"

#define IDS 65536u /* every state id a record can name */

typedef struct rewrite {
    const ckpt_view *v;
    uint32_t maxp; /* the new key groups */
    uint64_t now;  /* the stamp of an entry whose state is given a TTL */
    int64_t (*walk)(const ckpt_view *v, stash_kg_range range, snap_record_fn *fn, void *ctx);
    uint8_t dropped[IDS];
    uint8_t from_ttl[IDS], to_ttl[IDS];
    uint16_t kind[IDS];
    snap_buf scratch[2]; /* a value with its times changed, per serializing thread */
    snap_buf *moved;     /* with another max parallelism: each new key group's records */
    uint64_t *moved_n;
    void (*progress)(void *ctx, uint32_t done, uint32_t total);
    void *progress_ctx;
} rewrite;

/* What r becomes in the rewrite, in *out (its value in scratch if its times
 * change): 1, 0 if its state is dropped, or an error. */
static int transform(const rewrite *rw, const snap_record *r, snap_buf *scratch, snap_record *out)
{
    if (rw->dropped[r->state]) return 0;
    *out = *r;
    bool from = rw->from_ttl[r->state], to = rw->to_ttl[r->state];
    if (from == to) return 1;
    if (shm_reserve(&scratch->data, &scratch->cap, 3 * (size_t)r->vlen + TTL_BYTES) < 0)
        return shm_fail(-ENOMEM, "out of memory");
    size_t n;
    if (rw->kind[r->state] == STASH_LIST) {
        n = list_bytes_retime(r->value, r->vlen, from, to, rw->now, scratch->data);
    } else if (rw->kind[r->state] == STASH_MAP) {
        n = map_bytes_retime(r->value, r->vlen, from, to, rw->now, scratch->data);
    } else if (to) {
        state_ts_put(scratch->data, rw->now);
        memcpy(scratch->data + TTL_BYTES, r->value, r->vlen);
        n = TTL_BYTES + (size_t)r->vlen;
    } else {
        n = r->vlen - TTL_BYTES; /* a TTL state's value holds its time (checked at open) */
        memcpy(scratch->data, r->value + TTL_BYTES, n);
    }
    if (n > UINT32_MAX / 2)
        return shm_fail(STASH_ETOOBIG, "a value of %zu bytes once its times are added", n);
    out->value = scratch->data;
    out->vlen = (uint32_t)n;
    return 1;
}

/* Records going into one block, or into the moved key groups' buffers. */
typedef struct filling {
    rewrite *rw;
    snap_buf *out; /* NULL: into rw->moved */
    snap_buf *scratch;
    uint64_t n;
} filling;

static int add_record(void *ctx, uint32_t kg, const snap_record *r)
{
    filling *f = ctx;
    snap_record t;
    int keep = transform(f->rw, r, f->scratch, &t);
    if (keep <= 0) return keep;
    uint32_t to = f->out ? kg : shm_key_group_of(r->key_hash, f->rw->maxp);
    int rc = snap_block_add(f->out ? f->out : &f->rw->moved[to], &t);
    if (rc) return shm_fail(rc, "out of memory");
    if (f->out)
        f->n++;
    else
        f->rw->moved_n[to]++;
    return 0;
}

/* A ckpt_source's block: key group kg's records, from the source's key
 * group kg or as moved there. */
static int64_t block_of(void *ctx, uint32_t kg, unsigned thread, snap_buf *out)
{
    rewrite *rw = ctx;
    size_t start;
    if (snap_block_begin(out, &start) < 0) return -ENOMEM;
    filling f = {rw, out, &rw->scratch[thread], 0};
    if (rw->moved) {
        if (snap_buf_put(out, rw->moved[kg].data, rw->moved[kg].len) < 0) return -ENOMEM;
        f.n = rw->moved_n[kg];
        snap_buf_free(&rw->moved[kg]);
    } else {
        int64_t n = rw->walk(rw->v, (stash_kg_range){kg, kg}, add_record, &f);
        if (n < 0) return n;
    }
    return snap_block_end(out, start, kg, f.n, 0, false);
}

/* Moves every record of the source into its key group of rw->maxp. */
static int move_all(rewrite *rw)
{
    rw->moved = calloc(rw->maxp, sizeof *rw->moved);
    rw->moved_n = calloc(rw->maxp, sizeof *rw->moved_n);
    if (!rw->moved || !rw->moved_n) return shm_fail(-ENOMEM, "out of memory");
    filling f = {rw, NULL, &rw->scratch[0], 0};
    int64_t n = rw->walk(rw->v, (stash_kg_range){0, rw->v->max_parallelism - 1}, add_record, &f);
    return n < 0 ? (int)n : 0;
}

static void kg_written(void *ctx, uint32_t kg)
{
    const rewrite *rw = ctx;
    rw->progress(rw->progress_ctx, kg + 1, rw->maxp);
}

/* The index of the source's state name, or -1. */
static int state_index(const ckpt_view *v, const char *name)
{
    for (uint32_t i = 0; i < v->nstates; i++)
        if (strcmp(ckpt_view_state(v, i).name, name) == 0) return (int)i;
    return -1;
}

/* Applies the changes to the source's states (into states, kept ones
 * first: *kept of them) and to rw's tables. */
static int plan(rewrite *rw, const stash_snapshot_rewrite_opts *o, ckpt_state *states,
                uint32_t *kept)
{
    const ckpt_view *v = rw->v;
    for (uint32_t i = 0; i < v->nstates; i++) {
        states[i] = ckpt_view_state(v, i);
        uint16_t id = states[i].id;
        stash_ttl ttl;
        state_ttl_of_options(states[i].options, &ttl);
        rw->kind[id] = states[i].kind;
        rw->from_ttl[id] = rw->to_ttl[id] = ttl.ttl_ms > 0;
    }
    for (uint32_t c = 0; c < o->nchanges; c++) {
        const stash_snapshot_change *ch = &o->changes[c];
        if (!ch->state) return shm_refuse_null("stash_snapshot_rewrite", "a change's state");
        int i = state_index(v, ch->state); /* by its name in the source */
        if (i < 0) return shm_fail(STASH_ENOTFOUND, "%s: no state '%s'", v->meta_path, ch->state);
        ckpt_state *s = &states[i];
        if (ch->drop) rw->dropped[s->id] = 1;
        if (ch->rename && (!*ch->rename || strlen(ch->rename) >= SHM_STATE_NAME))
            return shm_fail(-EINVAL, "state '%s' renamed '%s': a name of 1 to %u bytes", ch->state,
                            ch->rename, SHM_STATE_NAME - 1);
        if (ch->rename) snprintf(s->name, sizeof s->name, "%s", ch->rename);
        if (ch->set_ttl) {
            int rc = state_ttl_check(s->name, (stash_kind)s->kind, &ch->ttl);
            if (rc) return rc;
            state_options_of_ttl(&ch->ttl, s->options);
            rw->to_ttl[s->id] = ch->ttl.ttl_ms > 0;
        }
    }
    *kept = 0;
    for (uint32_t i = 0; i < v->nstates; i++) {
        if (rw->dropped[states[i].id]) continue;
        for (uint32_t k = 0; k < *kept; k++)
            if (strcmp(states[k].name, states[i].name) == 0)
                return shm_fail(-EINVAL, "two states named '%s' in the rewrite of %s",
                                states[i].name, v->meta_path);
        states[(*kept)++] = states[i];
    }
    return 0;
}

/* The source's operator state without the dropped states, in blobs[]. */
static int keep_op_state(const rewrite *rw, op_buf *bufs, ckpt_blob *blobs)
{
    for (uint32_t i = 0; i < rw->v->op_parallelism; i++) {
        char what[4200];
        snprintf(what, sizeof what, "%s: worker %u's operator state", rw->v->meta_path, i);
        int rc = opstate_drop(rw->v->op_blobs[i].data, rw->v->op_blobs[i].len, rw->dropped,
                              &bufs[i], what);
        if (rc) return rc;
        blobs[i] = (ckpt_blob){bufs[i].data, bufs[i].len};
    }
    return 0;
}

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* A rewrite into a remote storage: written into a directory of its own,
 * then copied into the job under the URL's name. */
static int rewrite_to_remote(stash_snapshot *snap, const char *url,
                             const stash_snapshot_rewrite_opts *opts, stash_snapshot_info *out)
{
    ckpt_storage *r;
    char job[256], name[256], local[4096];
    int rc = ckpt_url_open(url, &r, job, sizeof job, name, sizeof name);
    if (rc) return rc;
    if (!name[0])
        rc = shm_fail(-EINVAL, "%s: names no savepoint (%s/JOB/NAME)", url, ckpt_storage_where(r));
    ckpt_storage_close(r);
    if (rc) return rc;
    shm_dir parent, tmp = {.fd = -1};
    rc = shm_dir_open("/var/tmp", SHM_DIR_PLACE, &parent);
    if (rc == 0) rc = shm_dir_temp(&parent, "stash-rewrite-", &tmp);
    ioe_engine *e = NULL;
    if (rc == 0) rc = ckpt_path_of(local, "%s/%s", tmp.path, name);
    if (rc == 0) rc = stash_snapshot_rewrite(snap, local, opts, out);
    if (rc == 0) rc = ioe_engine_open(NULL, &e);
    if (rc == 0) rc = ckpt_url_put(local, url, e);
    ioe_engine_close(e);
    shm_dir_temp_remove(&parent, &tmp);
    shm_dir_close(&parent);
    return rc;
}

STASH_API int stash_snapshot_rewrite(stash_snapshot *snap, const char *path,
                                     const stash_snapshot_rewrite_opts *opts,
                                     stash_snapshot_info *out)
{
    shm_clear_error();
    if (!snap || !path) return shm_refuse_null(__func__, "snap or path");
    stash_snapshot_rewrite_opts o;
    int rc = SHM_TAKE_OPTS(__func__, stash_snapshot_rewrite_opts, opts, &o);
    if (rc) return rc;
    if (ckpt_url(path)) return rewrite_to_remote(snap, path, &o, out);
    if (o.nchanges && !o.changes) return shm_refuse_null(__func__, "changes");
    if (o.max_parallelism > STASH_MAX_MAX_PARALLELISM)
        return shm_fail(-EINVAL, "a savepoint of %u key groups: at most %u", o.max_parallelism,
                        STASH_MAX_MAX_PARALLELISM);
    const ckpt_view *v = ckpt_snapshot_view(snap);
    rewrite *rw = calloc(1, sizeof *rw);
    ckpt_state *states = calloc(v->nstates ? v->nstates : 1, sizeof *states);
    op_buf *bufs = calloc(v->op_parallelism ? v->op_parallelism : 1, sizeof *bufs);
    ckpt_blob *blobs = calloc(v->op_parallelism ? v->op_parallelism : 1, sizeof *blobs);
    ioe_engine *e = NULL;
    ckpt_dest dest = {.parent = {.fd = -1}, .tmp = {.fd = -1}};
    uint64_t id = o.id ? o.id : v->id;
    rc = rw && states && bufs && blobs ? 0 : shm_fail(-ENOMEM, "out of memory");
    uint32_t kept = 0;
    if (rc == 0) {
        *rw = (rewrite){.v = v,
                        .maxp = o.max_parallelism ? o.max_parallelism : v->max_parallelism,
                        .now = wall_ms(),
                        /* A full file holds each entry once: no chain to
                         * resolve, and its blocks were checked at the open. */
                        .walk = v->nfiles == 1 ? ckpt_view_walk_checked : ckpt_view_walk_latest,
                        .progress = o.progress,
                        .progress_ctx = o.progress_ctx};
        rc = plan(rw, &o, states, &kept);
    }
    if (rc == 0) rc = keep_op_state(rw, bufs, blobs);
    if (rc == 0 && rw->maxp != v->max_parallelism) rc = move_all(rw);
    if (rc == 0) rc = ioe_engine_open(NULL, &e);
    if (rc == 0) rc = ckpt_dest_open(path, &dest);
    md_header h;
    memcpy(&h, v->md, sizeof h);
    ckpt_written written = {0};
    if (rc == 0) {
        ckpt_source src = {.max_parallelism = rw->maxp,
                           .backend = h.backend,
                           .nstates = kept,
                           .states = states,
                           .block = block_of,
                           .ctx = rw,
                           .two_threads = true};
        rc = ckpt_write_source(&src,
                               &(ckpt_opts){.dir = &dest.tmp,
                                            .id = id,
                                            .savepoint = true,
                                            .engine = e,
                                            .op_parallelism = v->op_parallelism,
                                            .op_blobs = v->op_parallelism ? blobs : NULL,
                                            .serialized = rw->progress ? kg_written : NULL,
                                            .serialized_ctx = rw},
                               &written);
    }
    if (rc == 0) rc = ckpt_dest_place(&dest, id);
    ckpt_dest_close(&dest);
    if (rc == 0 && out)
        *out = (stash_snapshot_info){.id = id,
                                     .created_ns = shm_now_ns(),
                                     .max_parallelism = rw->maxp,
                                     .nstates = kept,
                                     .op_parallelism = v->op_parallelism,
                                     .data_bytes = written.data_bytes};
    ioe_engine_close(e);
    for (uint32_t i = 0; rw && rw->moved && i < rw->maxp; i++) snap_buf_free(&rw->moved[i]);
    for (uint32_t i = 0; bufs && i < v->op_parallelism; i++) free(bufs[i].data);
    if (rw) {
        free(rw->moved);
        free(rw->moved_n);
        snap_buf_free(&rw->scratch[0]);
        snap_buf_free(&rw->scratch[1]);
    }
    free(rw);
    free(states);
    free(bufs);
    free(blobs);
    return rc;
}
