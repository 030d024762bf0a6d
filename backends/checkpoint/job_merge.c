/* SPDX-License-Identifier: MIT */
/*
 * job_merge.c: a job checkpoint read as one (job_merge.h). The parts are
 * opened as the checkpoints they are; the merged savepoint's states are
 * the parts' by name, numbered anew, each record's and operator-state
 * blob's state id mapped from its part's numbering; each key group's block
 * is its records in the part of the host that served it, written by
 * ckpt_write_source as any savepoint is.
 */
#include "backends/checkpoint/job_merge.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/checkpoint/ckpt.h"
#include "backends/state/opstate.h"

#define IDS 65536u /* every state id a record can name */

typedef struct merge {
    const ckpt_job_record *rec;
    ckpt_view *views;   /* one per part */
    uint16_t **ids;     /* per part: its state id -> the savepoint's (0: none) */
    int32_t *owner;     /* per key group: the part holding it, -1 none */
    ckpt_state *states; /* the savepoint's */
    uint32_t *named_by; /* per state of the savepoint: the first part that holds it */
    uint32_t nstates;
} merge;

typedef struct filling {
    const uint16_t *ids;
    snap_buf *out;
    const char *what;
    uint64_t n;
} filling;

static int add_record(void *ctx, uint32_t kg, const snap_record *r)
{
    (void)kg;
    filling *f = ctx;
    snap_record t = *r;
    t.state = f->ids[r->state];
    if (!t.state)
        return shm_fail(STASH_ECORRUPT,
                        "%s: a record of state %u, which its metadata does not name", f->what,
                        r->state);
    if (snap_block_add(f->out, &t) < 0) return shm_fail(-ENOMEM, "out of memory");
    f->n++;
    return 0;
}

/* Key group kg's block: its records in the part that held it. */
static int64_t block_of(void *ctx, uint32_t kg, unsigned thread, snap_buf *out)
{
    (void)thread;
    merge *m = ctx;
    size_t start;
    if (snap_block_begin(out, &start) < 0) return -ENOMEM;
    int32_t p = m->owner[kg];
    filling f = {p >= 0 ? m->ids[p] : NULL, out, p >= 0 ? m->views[p].meta_path : "", 0};
    if (p >= 0) {
        int64_t n = ckpt_view_walk(&m->views[p], (stash_kg_range){kg, kg}, add_record, &f);
        if (n < 0) return n;
    }
    return snap_block_end(out, start, kg, f.n, 0, false);
}

/* Adds part p's states to the savepoint's, by name. */
static int name_states(merge *m, uint32_t p)
{
    const ckpt_view *v = &m->views[p];
    for (uint32_t i = 0; i < v->nstates; i++) {
        ckpt_state s = ckpt_view_state(v, i);
        uint32_t k = 0;
        while (k < m->nstates && strcmp(m->states[k].name, s.name) != 0) k++;
        if (k == m->nstates) {
            if (m->nstates == IDS - 1)
                return shm_fail(STASH_ECORRUPT, "%s: more states than a savepoint holds",
                                v->meta_path);
            m->states[k] = s;
            m->states[k].id = (uint16_t)(k + 1);
            m->named_by[k] = p;
            m->nstates++;
        } else if (m->states[k].kind != s.kind ||
                   memcmp(m->states[k].options, s.options, sizeof s.options) != 0) {
            return shm_fail(STASH_ECORRUPT,
                            "%s: state '%s' is of another kind or options than in host %s's part",
                            v->meta_path, s.name, m->rec->parts[m->named_by[k]].host);
        }
        m->ids[p][s.id] = m->states[k].id;
    }
    return 0;
}

/* Which part holds each key group: the one whose host served its worker. */
static int own_key_groups(merge *m, uint32_t maxp)
{
    for (uint32_t kg = 0; kg < maxp; kg++) m->owner[kg] = -1;
    for (size_t p = 0; p < m->rec->n; p++) {
        const ckpt_job_part *part = &m->rec->parts[p];
        for (uint32_t k = 0; k < part->workers.n; k++)
            for (uint32_t w = part->workers.r[k].first; w <= part->workers.r[k].last; w++) {
                stash_kg_range r;
                if (stash_kg_range_of(maxp, part->parallelism, w, &r) < 0)
                    return shm_fail(STASH_ECORRUPT, "host %s's part: worker %u of %u", part->host,
                                    w, part->parallelism);
                for (uint32_t kg = r.first; kg <= r.last; kg++) {
                    if (m->owner[kg] >= 0)
                        return shm_fail(STASH_ECORRUPT,
                                        "key group %u is in the parts of hosts %s "
                                        "and %s",
                                        kg, m->rec->parts[m->owner[kg]].host, part->host);
                    m->owner[kg] = (int32_t)p;
                }
            }
    }
    return 0;
}

/* Worker w's operator state: its host's part's blob, its ids mapped. */
static int worker_opstate(const merge *m, uint32_t w, ckpt_blob *out, uint8_t **mem)
{
    *out = (ckpt_blob){NULL, 0};
    for (size_t p = 0; p < m->rec->n; p++) {
        const ckpt_view *v = &m->views[p];
        if (!ckpt_job_workers_has(&m->rec->parts[p].workers, w) || w >= v->op_parallelism ||
            !v->op_blobs[w].len)
            continue;
        if (!(*mem = malloc(v->op_blobs[w].len))) return shm_fail(-ENOMEM, "out of memory");
        memcpy(*mem, v->op_blobs[w].data, v->op_blobs[w].len);
        char what[4200];
        snprintf(what, sizeof what, "%s: worker %u's operator state", v->meta_path, w);
        int rc = opstate_remap(*mem, v->op_blobs[w].len, m->ids[p], IDS, what);
        if (rc) return rc;
        *out = (ckpt_blob){*mem, v->op_blobs[w].len};
    }
    return 0;
}

int ckpt_job_merge(const ckpt_job_record *rec, const shm_dir *parts, const char *path,
                   ioe_engine *e)
{
    merge m = {.rec = rec};
    uint32_t p = rec->n ? rec->parts[0].parallelism : 0,
             maxp = rec->n ? rec->parts[0].max_parallelism : 0;
    int rc = ckpt_job_covered(rec);
    if (rc == -EAGAIN) rc = STASH_ECORRUPT;
    size_t opened = 0;
    m.views = calloc(rec->n ? rec->n : 1, sizeof *m.views);
    m.ids = calloc(rec->n ? rec->n : 1, sizeof *m.ids);
    m.owner = calloc(maxp ? maxp : 1, sizeof *m.owner);
    m.states = calloc(IDS, sizeof *m.states);
    m.named_by = calloc(IDS, sizeof *m.named_by);
    ckpt_blob *blobs = calloc(p ? p : 1, sizeof *blobs);
    uint8_t **mem = calloc(p ? p : 1, sizeof *mem);
    if (rc == 0 && (!m.views || !m.ids || !m.owner || !m.states || !m.named_by || !blobs || !mem))
        rc = shm_fail(-ENOMEM, "out of memory");
    char chk[64];
    ckpt_job_part_name(rec, chk, sizeof chk);
    for (; rc == 0 && opened < rec->n; opened++) {
        char dir[4096];
        rc = ckpt_path_of(dir, "%s/%s/%s", parts->path, rec->parts[opened].host, chk);
        if (rc == 0) rc = ckpt_view_open_path(dir, e, &m.views[opened]);
        if (rc) break;
        if (m.views[opened].max_parallelism != maxp)
            rc = shm_fail(STASH_ECORRUPT, "%s: %u key groups, the job's %u",
                          m.views[opened].meta_path, m.views[opened].max_parallelism, maxp);
        if (rc == 0 && !(m.ids[opened] = calloc(IDS, sizeof *m.ids[opened])))
            rc = shm_fail(-ENOMEM, "out of memory");
        if (rc == 0) rc = name_states(&m, (uint32_t)opened);
    }
    if (rc == 0) rc = own_key_groups(&m, maxp);
    for (uint32_t w = 0; rc == 0 && w < p; w++) rc = worker_opstate(&m, w, &blobs[w], &mem[w]);
    ckpt_dest dest = {.parent = {.fd = -1}, .tmp = {.fd = -1}};
    if (rc == 0) rc = ckpt_dest_open(path, &dest);
    if (rc == 0) {
        md_header h;
        memcpy(&h, m.views[0].md, sizeof h);
        ckpt_source src = {.max_parallelism = maxp,
                           .backend = h.backend,
                           .nstates = m.nstates,
                           .states = m.states,
                           .block = block_of,
                           .ctx = &m};
        ckpt_written written;
        rc = ckpt_write_source(&src,
                               &(ckpt_opts){.dir = &dest.tmp,
                                            .id = rec->id,
                                            .savepoint = true,
                                            .engine = e,
                                            .op_parallelism = p,
                                            .op_blobs = blobs},
                               &written);
    }
    if (rc == 0) rc = ckpt_dest_place(&dest, rec->id);
    ckpt_dest_close(&dest);
    for (size_t i = 0; i < opened && m.views; i++) ckpt_view_close(&m.views[i]);
    for (size_t i = 0; m.ids && i < rec->n; i++) free(m.ids[i]);
    for (uint32_t w = 0; mem && w < p; w++) free(mem[w]);
    free(m.views);
    free(m.ids);
    free(m.owner);
    free(m.states);
    free(m.named_by);
    free(blobs);
    free(mem);
    return rc;
}

/* Fetches the parts of job checkpoint id into DIR/parts/HOST and merges
 * them into DIR/job-ID. */
static int fetch_merged(ckpt_storage *r, const char *job, uint64_t id, ckpt_fetched *out)
{
    ckpt_job_record *rec = malloc(sizeof *rec);
    int rc = rec ? ckpt_job_committed(r, job, id) : shm_fail(-ENOMEM, "out of memory");
    if (rc == 0) rc = ckpt_job_record_read(r, job, id, rec);
    ioe_engine *e = NULL;
    shm_dir parts = {.fd = -1};
    if (rc == 0) rc = shm_dir_openat(&out->tmp, "parts", SHM_DIR_OWN | SHM_DIR_CREATE, &parts);
    char chk[64] = "";
    if (rc == 0) ckpt_job_part_name(rec, chk, sizeof chk);
    for (size_t i = 0; rc == 0 && i < rec->n; i++) {
        char sub[1024];
        shm_dir host;
        rc = ckpt_job_part_prefix(sub, sizeof sub, job, rec->parts[i].host, rec->parts[i].epoch);
        if (rc == 0)
            rc = shm_dir_openat(&parts, rec->parts[i].host, SHM_DIR_OWN | SHM_DIR_CREATE, &host);
        if (rc) break;
        rc = ckpt_storage_fetch(r, sub, &host, chk);
        shm_dir_close(&host);
    }
    if (rc == 0) rc = ckpt_path_of(out->path, "%s/job-%" PRIu64, out->tmp.path, id);
    if (rc == 0) rc = ioe_engine_open(NULL, &e);
    if (rc == 0) rc = ckpt_job_merge(rec, &parts, out->path, e);
    ioe_engine_close(e);
    if (parts.fd >= 0) {
        shm_dir_close(&parts);
        shm_dir_remove(&out->tmp, "parts", 3);
    }
    free(rec);
    return rc;
}

int ckpt_url_fetch(const char *url, const shm_dir *under, ckpt_fetched *out)
{
    ckpt_storage *r;
    char job[256], name[256];
    int rc = ckpt_url_open(url, &r, job, sizeof job, name, sizeof name);
    if (rc) return rc;
    uint64_t id = 0;
    char *end = NULL;
    if (strncmp(name, "job-", 4) == 0) {
        id = strtoull(name + 4, &end, 10);
        if (!id || *end)
            rc = shm_fail(-EINVAL, "%s: not %s/JOB/job-ID", url, ckpt_storage_where(r));
    } else if (!name[0] && ckpt_storage_latest(r, job, &id) == 0) {
        /* The job's newest: a job checkpoint if a record of one is there. */
        ckpt_job_record *rec = malloc(sizeof *rec);
        if (!rec || ckpt_job_record_read(r, job, id, rec) != 0) id = 0;
        free(rec);
    } else {
        id = 0;
    }
    if (rc == 0 && !id) {
        ckpt_storage_close(r);
        return ckpt_url_fetch_checkpoint(url, under, out);
    }
    *out = (ckpt_fetched){.parent = {.fd = -1}, .tmp = {.fd = -1}};
    if (rc == 0) rc = shm_dir_open(under ? under->path : "/var/tmp", SHM_DIR_PLACE, &out->parent);
    if (rc == 0) rc = shm_dir_temp(&out->parent, "stash-fetch-", &out->tmp);
    if (rc == 0) rc = fetch_merged(r, job, id, out);
    if (rc) ckpt_url_release(out);
    ckpt_storage_close(r);
    return rc;
}
