/* SPDX-License-Identifier: MIT */
/*
 * snapshot_writer.c: stash_snapshot_writer_*: a savepoint written offline.
 * Entries are put by a worker of a heap arena of the writer's own (its file
 * removed once mapped), which owns every key group; the commit writes that
 * arena as a savepoint into a directory beside the destination and renames
 * it into place, so that the destination holds a whole savepoint or none.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends/service/service.h"
#include "backends/state/state.h"

#define WRITER_DEFAULT_SIZE (256ull << 20)

/* One worker's entries of one operator state: a part of its blob. */
typedef struct op_buf {
    uint8_t *data;
    size_t len, cap;
    uint32_t n; /* entries */
} op_buf;

/* A declared state: its handle, or a timer service's. */
typedef struct declared {
    char name[SHM_STATE_NAME];
    stash_kind kind;
    stash_state *state;
    stash_timers *timers;
    uint16_t id; /* its id in the savepoint's metadata */
} declared;

struct stash_snapshot_writer {
    char path[4096];
    char tmp[4096];    /* the directory it is written in, beside path */
    char parent[4096]; /* path's, synced once it is renamed into place */
    stash_worker *w;
    ioe_engine *e;
    uint64_t id;
    uint64_t now_ms; /* the time the next put stamps, 0: the clock's */
    declared *states;
    uint32_t nstates;
    uint32_t op_p; /* workers of the operator state, 0 none yet */
    op_buf *op;    /* op_p x SHM_CATALOG_SIZE: worker w's entries of declared state d */
};

static uint64_t writer_clock(void *ctx)
{
    const stash_snapshot_writer *w = ctx;
    if (w->now_ms) return w->now_ms;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Functions for states whose values are only ever stored as they come. */
static int no_combine(const stash_bytes *acc, const stash_bytes *in, void *out, size_t cap,
                      size_t *len, void *ctx)
{
    (void)acc, (void)in, (void)out, (void)cap, (void)len, (void)ctx;
    return shm_fail(-ENOTSUP, "a savepoint writer stores accumulators, it does not combine them");
}

static int no_produce(const stash_bytes *acc, void *out, size_t cap, size_t *len, void *ctx)
{
    (void)acc, (void)out, (void)cap, (void)len, (void)ctx;
    return shm_fail(-ENOTSUP, "a savepoint writer stores accumulators, it does not make them");
}

static const stash_aggregate_fns no_aggregate = {no_produce, no_combine, no_produce, no_combine};

STASH_API void stash_snapshot_writer_abort(stash_snapshot_writer *w)
{
    if (!w) return;
    stash_worker_close(w->w);
    ioe_engine_close(w->e);
    char made[4200];
    /* What a failed commit left: a savepoint it could not move into place. */
    if (w->tmp[0] && snprintf(made, sizeof made, "%s/savepoint-%llu", w->tmp,
                              (unsigned long long)w->id) < (int)sizeof made)
        ckpt_remove_checkpoint(made);
    if (w->tmp[0]) rmdir(w->tmp);
    for (uint32_t i = 0; w->op && i < w->op_p * SHM_CATALOG_SIZE; i++) free(w->op[i].data);
    free(w->op);
    free(w->states);
    free(w);
}

/* Makes the heap arena the writer builds in and its worker. */
static int open_heap(stash_snapshot_writer *w, const stash_snapshot_writer_opts *o)
{
    static _Atomic unsigned heaps;
    char file[96];
    snprintf(file, sizeof file, "/dev/shm/stash.writer-%d-%u", (int)getpid(),
             atomic_fetch_add(&heaps, 1));
    stash_arena_opts ao = {.path = file,
                           .size = o->size ? o->size : WRITER_DEFAULT_SIZE,
                           .max_parallelism = o->max_parallelism,
                           .flags = STASH_ARENA_REPLACE,
                           .backend = STASH_BACKEND_HEAP};
    stash_arena *a;
    int rc = stash_arena_create("writer", &ao, &a);
    if (rc) return rc;
    stash_arena_close(a);
    rc = stash_worker_open(
        "writer",
        &(stash_worker_opts){.parallelism = 1, .arena = &ao, .clock = writer_clock, .clock_ctx = w},
        &w->w);
    unlink(file);
    return rc;
}

/* Sets the operator state's parallelism, the first time. */
static int op_parallelism(stash_snapshot_writer *w, uint32_t p)
{
    if (w->op_p && w->op_p != p)
        return shm_fail(-EINVAL, "operator state of %u workers beside state of %u", p, w->op_p);
    if (w->op_p || !p) return 0;
    if (!(w->op = calloc((size_t)p * SHM_CATALOG_SIZE, sizeof *w->op)))
        return shm_fail(-ENOMEM, "out of memory");
    w->op_p = p;
    return 0;
}

STASH_API int stash_snapshot_writer_open(const char *path, const stash_snapshot_writer_opts *opts,
                                         stash_snapshot_writer **out)
{
    shm_clear_error();
    if (!path || !out) return shm_refuse_null(__func__, "path or out");
    stash_snapshot_writer_opts o = opts ? *opts : (stash_snapshot_writer_opts){0};
    if (o.max_parallelism > STASH_MAX_MAX_PARALLELISM)
        return shm_fail(-EINVAL, "a savepoint of %u key groups: at most %u", o.max_parallelism,
                        STASH_MAX_MAX_PARALLELISM);
    struct stat st;
    if (stat(path, &st) == 0) return shm_fail(-EEXIST, "%s: exists already", path);
    stash_snapshot_writer *w = calloc(1, sizeof *w);
    if (!w) return shm_fail(-ENOMEM, "out of memory");
    w->id = o.id ? o.id : 1;
    int rc = ckpt_path_of(w->path, "%s", path);
    /* The directory it is written in: beside path, on its filesystem. */
    char *parent = w->parent;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    snprintf(parent, sizeof w->parent, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    if (slash == path) snprintf(parent, sizeof w->parent, "/");
    if (rc == 0 && !*base) rc = shm_fail(-EINVAL, "%s: names no directory", path);
    if (rc == 0 && (stat(parent, &st) < 0 || !S_ISDIR(st.st_mode)))
        rc = shm_fail(-ENOENT, "%s: no directory %s to write it in", path, parent);
    if (rc == 0) rc = ckpt_path_of(w->tmp, "%s/.%s.writing-%d", parent, base, (int)getpid());
    if (rc == 0 && mkdir(w->tmp, 0700) < 0) {
        rc = shm_fail(-errno, "%s: %s", w->tmp, strerror(errno));
        w->tmp[0] = 0;
    }
    if (rc == 0) rc = op_parallelism(w, o.op_parallelism);
    if (rc == 0) rc = open_heap(w, &o);
    if (rc == 0) rc = ioe_engine_open(NULL, &w->e);
    if (rc == 0 && !(w->states = calloc(SHM_CATALOG_SIZE, sizeof *w->states)))
        rc = shm_fail(-ENOMEM, "out of memory");
    if (rc) {
        stash_snapshot_writer_abort(w);
        return rc;
    }
    *out = w;
    return 0;
}

static declared *declared_of(stash_snapshot_writer *w, const char *name)
{
    for (uint32_t i = 0; i < w->nstates; i++)
        if (strcmp(w->states[i].name, name) == 0) return &w->states[i];
    return NULL;
}

STASH_API int stash_snapshot_writer_state(stash_snapshot_writer *w, const stash_state_desc *desc)
{
    shm_clear_error();
    if (!w || !desc || !desc->name) return shm_refuse_null(__func__, "w, desc or its name");
    declared *d = declared_of(w, desc->name);
    if (d && d->kind != desc->kind)
        return shm_fail(STASH_EKIND, "state '%s' was declared with kind %d, not %d", desc->name,
                        (int)d->kind, (int)desc->kind);
    if (d) return 0;
    if (w->nstates == SHM_CATALOG_SIZE)
        return shm_fail(STASH_EFULL, "a savepoint of at most %u states", SHM_CATALOG_SIZE);
    if (strlen(desc->name) >= SHM_STATE_NAME)
        return shm_fail(-EINVAL, "state name '%s': at most %u bytes", desc->name,
                        SHM_STATE_NAME - 1);
    declared n = {.kind = desc->kind};
    snprintf(n.name, sizeof n.name, "%s", desc->name);
    int rc;
    if (desc->kind == STASH_TIMERS) {
        rc = stash_timers_get(w->w, desc->name, &n.timers);
        if (rc == 0) n.id = timers_state(n.timers)->id;
    } else {
        stash_state_desc s = {.name = desc->name, .kind = desc->kind, .ttl = desc->ttl};
        if (desc->kind == STASH_REDUCING) s.reduce = no_combine;
        if (desc->kind == STASH_AGGREGATING) s.aggregate = &no_aggregate;
        rc = stash_state_get(w->w, &s, &n.state);
        if (rc == 0) n.id = n.state->id;
    }
    if (rc) return rc;
    w->states[w->nstates++] = n;
    return 0;
}

/* The declared state an entry names, or an error (NULL arguments, a state
 * not declared) in *rc. */
static declared *entry_state(stash_snapshot_writer *w, const stash_snapshot_entry *e,
                             const char *fn, int *rc)
{
    shm_clear_error();
    declared *d = w && e && e->state ? declared_of(w, e->state) : NULL;
    if (!w || !e || !e->state)
        *rc = shm_refuse_null(fn, "w, e or its state");
    else if (!d)
        *rc = shm_fail(STASH_ENOTFOUND, "state '%s' is not declared", e->state);
    return d;
}

STASH_API int stash_snapshot_writer_put(stash_snapshot_writer *w, const stash_snapshot_entry *e)
{
    int rc = 0;
    declared *d = entry_state(w, e, __func__, &rc);
    if (!d) return rc;
    if (opstate_kind(d->kind))
        return shm_fail(STASH_EKIND, "operator state '%s' goes in by stash_snapshot_writer_op_put",
                        e->state);
    rc = stash_key_set(w->w, e->key.data, e->key.len);
    if (rc) return rc;
    if (d->kind == STASH_TIMERS)
        return stash_timer_register(d->timers, e->domain, e->ns.data, e->ns.len, e->timestamp);
    rc = stash_state_namespace(d->state, e->ns.data, e->ns.len);
    if (rc) return rc;
    w->now_ms = e->ttl_ms;
    if (d->kind == STASH_LIST)
        rc = stash_list_add(d->state, e->value.data, e->value.len);
    else if (d->kind == STASH_MAP)
        rc = stash_map_put(d->state, e->map_key.data, e->map_key.len, e->value.data, e->value.len);
    else
        rc = state_put_raw(d->state, e->value.data, e->value.len);
    w->now_ms = 0;
    return rc;
}

STASH_API int stash_snapshot_writer_delete(stash_snapshot_writer *w, const stash_snapshot_entry *e)
{
    int rc = 0;
    declared *d = entry_state(w, e, __func__, &rc);
    if (!d) return rc;
    if (opstate_kind(d->kind))
        return shm_fail(STASH_EKIND, "'%s' is operator state: it has no keyed entries", e->state);
    rc = stash_key_set(w->w, e->key.data, e->key.len);
    if (rc) return rc;
    if (d->kind == STASH_TIMERS)
        return stash_timer_delete(d->timers, e->domain, e->ns.data, e->ns.len, e->timestamp);
    rc = stash_state_namespace(d->state, e->ns.data, e->ns.len);
    if (rc) return rc;
    if (d->kind == STASH_MAP && e->map_key.len)
        return stash_map_remove(d->state, e->map_key.data, e->map_key.len);
    return stash_state_clear(d->state);
}

/* Appends n bytes to b. */
static int op_append(op_buf *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        uint8_t *d = realloc(b->data, cap);
        if (!d) return shm_fail(-ENOMEM, "out of memory");
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

STASH_API int stash_snapshot_writer_op_put(stash_snapshot_writer *w, const stash_snapshot_entry *e)
{
    int rc = 0;
    declared *d = entry_state(w, e, __func__, &rc);
    if (!d) return rc;
    if (!opstate_recorded(d->kind))
        return shm_fail(STASH_EKIND,
                        "'%s' is keyed state: its entries go in by "
                        "stash_snapshot_writer_put",
                        e->state);
    if (e->worker >= w->op_p)
        return shm_fail(-EINVAL, "worker %u of operator state of %u workers", e->worker, w->op_p);
    op_buf *b = &w->op[e->worker * SHM_CATALOG_SIZE + (uint32_t)(d - w->states)];
    uint32_t a = (uint32_t)(d->kind == STASH_OP_BROADCAST ? e->map_key.len
                            : d->kind == STASH_TIMERS     ? 8
                                                          : e->value.len);
    rc = op_append(b, &a, 4);
    if (rc == 0 && d->kind == STASH_OP_BROADCAST) {
        uint32_t vl = (uint32_t)e->value.len;
        rc = op_append(b, &vl, 4);
        if (rc == 0) rc = op_append(b, e->map_key.data, e->map_key.len);
        if (rc == 0) rc = op_append(b, e->value.data, e->value.len);
    } else if (rc == 0 && d->kind == STASH_TIMERS) {
        /* A timer service has one watermark a worker: the newest put. */
        b->len = 0;
        b->n = 0;
        rc = op_append(b, &a, 4);
        if (rc == 0) rc = op_append(b, &e->timestamp, 8);
    } else if (rc == 0) {
        rc = op_append(b, e->value.data, e->value.len);
    }
    if (rc == 0) b->n++;
    return rc;
}

static uint32_t u32_of(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The bytes of one state's entries in a blob at p (kind, n entries), or 0
 * if they run past end. */
static size_t op_entries_bytes(const uint8_t *p, const uint8_t *end, uint16_t kind, uint32_t n)
{
    const uint8_t *q = p;
    for (uint32_t i = 0; i < n; i++) {
        size_t head = kind == STASH_OP_BROADCAST ? 8 : 4;
        if ((size_t)(end - q) < head) return 0;
        uint64_t len = u32_of(q) + (kind == STASH_OP_BROADCAST ? u32_of(q + 4) : 0);
        if ((uint64_t)(end - q) - head < len) return 0;
        q += head + len;
    }
    return (size_t)(q - p);
}

STASH_API int stash_snapshot_writer_operator_state(stash_snapshot_writer *w,
                                                   const stash_snapshot *src, const char *from,
                                                   const char *to)
{
    shm_clear_error();
    if (!w || !src || !from || !to) return shm_refuse_null(__func__, "w, src, from or to");
    const ckpt_view *v = ckpt_snapshot_view(src);
    declared *d = declared_of(w, to);
    if (!d) return shm_fail(STASH_ENOTFOUND, "state '%s' is not declared", to);
    int src_id = -1;
    for (uint32_t i = 0; i < v->nstates; i++) {
        ckpt_state s = ckpt_view_state(v, i);
        if (strcmp(s.name, from) != 0) continue;
        if (s.kind != (uint16_t)d->kind)
            return shm_fail(STASH_EKIND, "state '%s' is of kind %u, '%s' of kind %d", from, s.kind,
                            to, (int)d->kind);
        src_id = s.id;
    }
    if (src_id < 0) return shm_fail(STASH_ENOTFOUND, "%s: no state '%s'", v->meta_path, from);
    if (!opstate_recorded(d->kind))
        return shm_fail(STASH_EKIND, "'%s' is keyed state: its entries are put", to);
    int rc = op_parallelism(w, v->op_parallelism);
    if (rc) return rc;
    for (uint32_t i = 0; i < v->op_parallelism; i++) {
        const uint8_t *p = v->op_blobs[i].data, *end = p + v->op_blobs[i].len;
        uint32_t count = v->op_blobs[i].len >= 4 ? u32_of(p) : 0;
        p += v->op_blobs[i].len >= 4 ? 4 : 0;
        for (uint32_t s = 0; s < count; s++) {
            if (end - p < 8)
                return shm_fail(STASH_ECORRUPT,
                                "%s: worker %u's operator state is "
                                "cut short",
                                v->meta_path, i);
            uint16_t id, kind;
            memcpy(&id, p, 2);
            memcpy(&kind, p + 2, 2);
            uint32_t n = u32_of(p + 4);
            size_t bytes = op_entries_bytes(p + 8, end, kind, n);
            if (n && !bytes)
                return shm_fail(STASH_ECORRUPT, "%s: worker %u's operator state is cut short",
                                v->meta_path, i);
            if (id == (uint16_t)src_id) {
                op_buf *b = &w->op[i * SHM_CATALOG_SIZE + (uint32_t)(d - w->states)];
                if (d->kind == STASH_TIMERS) b->len = b->n = 0;
                if ((rc = op_append(b, p + 8, bytes)) < 0) return rc;
                b->n += n;
            }
            p += 8 + bytes;
        }
    }
    return 0;
}

/* Writes the arena's key groups and the operator state as savepoint id in
 * w->tmp. */
static int write_savepoint(stash_snapshot_writer *w, ckpt_written *written)
{
    stash_arena *a = stash_worker_arena(w->w);
    uint32_t maxp = a->hdr->max_parallelism;
    uint32_t *pins = calloc(maxp, sizeof *pins);
    ckpt_blob *blobs = calloc(w->op_p ? w->op_p : 1, sizeof *blobs);
    uint8_t **mem = calloc(w->op_p ? w->op_p : 1, sizeof *mem);
    int rc = pins && blobs && mem ? 0 : shm_fail(-ENOMEM, "out of memory");
    for (uint32_t i = 0; rc == 0 && i < w->op_p; i++) {
        /* Worker i's blob: its states with entries, each id, kind, count, entries. */
        op_buf blob = {0};
        uint32_t count = 0;
        rc = op_append(&blob, &count, 4);
        for (uint32_t d = 0; rc == 0 && d < w->nstates; d++) {
            const op_buf *b = &w->op[i * SHM_CATALOG_SIZE + d];
            if (!b->n) continue;
            uint16_t head[2] = {w->states[d].id, (uint16_t)w->states[d].kind};
            rc = op_append(&blob, head, 4);
            if (rc == 0) rc = op_append(&blob, &b->n, 4);
            if (rc == 0) rc = op_append(&blob, b->data, b->len);
            count++;
        }
        memcpy(blob.data, &count, 4);
        mem[i] = blob.data;
        if (count) blobs[i] = (ckpt_blob){blob.data, blob.len};
    }
    for (uint32_t kg = 0; rc == 0 && kg < maxp; kg++) {
        int64_t pin = shm_table_pin(a, kg);
        if (pin < 0)
            rc = (int)pin;
        else
            pins[kg] = (uint32_t)pin;
    }
    if (rc == 0)
        rc = ckpt_write(a, pins,
                        &(ckpt_opts){.dir = w->tmp,
                                     .id = w->id,
                                     .savepoint = true,
                                     .engine = w->e,
                                     .op_parallelism = w->op_p,
                                     .op_blobs = w->op_p ? blobs : NULL},
                        written);
    for (uint32_t kg = 0; pins && kg < maxp; kg++)
        if (pins[kg]) shm_table_unpin(a, kg, pins[kg]);
    for (uint32_t i = 0; mem && i < w->op_p; i++) free(mem[i]);
    free(mem);
    free(blobs);
    free(pins);
    return rc;
}

STASH_API int stash_snapshot_writer_commit(stash_snapshot_writer *w, stash_snapshot_info *out)
{
    shm_clear_error();
    if (!w) return shm_refuse_null(__func__, "w");
    ckpt_written written = {0};
    int rc = write_savepoint(w, &written);
    char made[4096];
    if (rc == 0) rc = ckpt_path_of(made, "%s/savepoint-%llu", w->tmp, (unsigned long long)w->id);
    if (rc == 0 && rename(made, w->path) < 0)
        rc = shm_fail(-errno, "rename %s to %s: %s", made, w->path, strerror(errno));
    if (rc == 0) {
        /* The rename durable too. */
        int fd = open(w->parent, O_RDONLY | O_DIRECTORY);
        if (fd < 0 || fsync(fd) < 0)
            rc = shm_fail(-errno, "fsync %s: %s", w->parent, strerror(errno));
        if (fd >= 0) close(fd);
    }
    if (rc == 0 && out) {
        stash_arena *a = stash_worker_arena(w->w);
        *out = (stash_snapshot_info){.id = w->id,
                                     .created_ns = shm_now_ns(),
                                     .max_parallelism = a->hdr->max_parallelism,
                                     .nstates = w->nstates,
                                     .op_parallelism = w->op_p};
    }
    stash_snapshot_writer_abort(w);
    return rc;
}
