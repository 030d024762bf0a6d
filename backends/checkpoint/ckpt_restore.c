/* SPDX-License-Identifier: MIT */
/*
 * ckpt_restore.c: restoring a checkpoint into an arena: every block of the
 * key groups wanted is checked before the first record goes in, so a
 * damaged checkpoint changes nothing and gives way to the one before it;
 * into a new arena, which a failure drops whole, each key group goes in as
 * soon as its blocks have arrived and passed their checks; and a lazy
 * restore, key group by key group while the arena serves.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "backends/checkpoint/ckpt_restore.h"
#include "backends/state/opstate.h"

/* Registers the checkpoint's states in the arena and maps their ids. */
static int map_states(stash_arena *a, const ckpt_view *v, uint16_t *ids, snap_id_map *map)
{
    memset(ids, 0, (SHM_CATALOG_SIZE + 1) * sizeof *ids);
    for (uint32_t i = 0; i < v->nstates; i++) {
        ckpt_state s = ckpt_view_state(v, i);
        int id = shm_catalog_register(a, s.name, s.kind, s.options);
        if (id < 0) return id;
        ids[s.id] = (uint16_t)id;
    }
    *map = (snap_id_map){ids, SHM_CATALOG_SIZE + 1};
    return 0;
}

/* Restores an opened checkpoint after checking all of it that the range
 * needs, and closes it. */
/* Copies the view's operator state into out, its state ids mapped. */
static int copy_opstate(const ckpt_view *v, const snap_id_map *map, ckpt_restored *out)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < v->op_parallelism; i++) total += v->op_blobs[i].len;
    out->op_blobs = calloc(v->op_parallelism ? v->op_parallelism : 1, sizeof *out->op_blobs);
    out->op_mem = malloc(total ? total : 1);
    if (!out->op_blobs || !out->op_mem) return shm_fail(-ENOMEM, "out of memory");
    uint8_t *p = out->op_mem;
    int rc = 0;
    for (uint32_t i = 0; i < v->op_parallelism && rc == 0; i++) {
        uint64_t len = v->op_blobs[i].len;
        if (len) memcpy(p, v->op_blobs[i].data, len);
        char what[4200];
        snprintf(what, sizeof what, "%s: operator state of worker %u", v->meta_path, i);
        rc = opstate_remap(p, len, map->ids, map->n, what);
        out->op_blobs[i] = (ckpt_blob){p, len};
        p += len;
    }
    out->op_parallelism = v->op_parallelism;
    return rc;
}

void ckpt_restored_free(ckpt_restored *r)
{
    free(r->op_blobs);
    free(r->op_mem);
    r->op_blobs = NULL;
    r->op_mem = NULL;
    r->op_parallelism = 0;
}

/* Puts the checked records of range into the store, each key group told
 * first how many records its blocks hold. */
static int64_t apply(ckpt_view *v, stash_kg_range range, const snap_id_map *map, store *st)
{
    int64_t n = 0;
    for (uint32_t kg = range.first; n >= 0 && kg <= range.last; kg++) {
        uint64_t held = 0;
        for (uint32_t f = 0; f < v->nfiles; f++) {
            md_extent e;
            snap_block_hdr h;
            memcpy(&e, v->files[f].extents + kg * sizeof e, sizeof e);
            /* Checked by the first walk. */
            memcpy(&h, v->files[f].data + (e.offset - v->files[f].base), sizeof h);
            held += h.records;
        }
        n = st->ops->restore_begin(st, kg, held);
    }
    snap_restorer to = {st, map};
    if (n >= 0)
        n = ckpt_walk_range_split(v, range, true, snap_restore_record, snap_restore_kg_done, &to);
    return n;
}

static int restore_view(stash_arena *a, ckpt_view *v, stash_kg_range range, bool *applying,
                        store *st, ckpt_prepare_fn *prepare, void *ctx, ckpt_restored *out)
{
    uint64_t *records = &out->records;
    int64_t n = 0;
    if (v->max_parallelism != a->hdr->max_parallelism)
        n = shm_fail(STASH_ECORRUPT, "%s: a checkpoint of %u key groups for an arena of %u",
                     v->meta_path, v->max_parallelism, a->hdr->max_parallelism);
    if (n == 0) n = ckpt_view_walk(v, range, NULL, NULL);
    uint16_t ids[SHM_CATALOG_SIZE + 1];
    snap_id_map map;
    if (n >= 0) n = map_states(a, v, ids, &map);
    ckpt_restored_free(out);
    if (n >= 0) n = copy_opstate(v, &map, out);
    if (n >= 0) {
        /* From here a failure (the arena full) leaves part of the checkpoint
         * in the arena: no older checkpoint may be restored over it. */
        *applying = true;
        if (prepare) n = prepare(ctx);
        if (n >= 0) n = apply(v, range, &map, st);
    }
    if (n >= 0) *records = (uint64_t)n;
    return n < 0 ? (int)n : 0;
}

#define PREFAULT_MIN (4u << 20) /* fewer bytes are not worth a thread */

/* The arena bytes a restore of range from v fills, about: a record takes
 * more room in the arena than in the file (its header, its index entry). */
static uint64_t restore_bytes(const ckpt_view *v, stash_kg_range range)
{
    uint64_t bytes = 0;
    for (uint32_t f = 0; f < v->nfiles; f++)
        for (uint32_t kg = range.first; kg <= range.last && kg < v->max_parallelism; kg++) {
            md_extent x;
            memcpy(&x, v->files[f].extents + kg * sizeof x, sizeof x);
            bytes = x.size < (UINT64_MAX >> 2) - bytes ? bytes + x.size : UINT64_MAX >> 2;
        }
    return bytes + bytes / 2;
}

static void *prefault_main(void *arg)
{
    shm_prefault_run(arg);
    return NULL;
}

/* Reads the data files of v (opened without them) for a restore of range:
 * while they are read, a second thread maps the arena memory the records
 * will fill, which the reading leaves idle, and the reading thread helps
 * once its reads are in. */
static int load_for_restore(stash_arena *a, const store *st, stash_kg_range range, ioe_engine *e,
                            ckpt_view *v)
{
    int rc;
    uint64_t bytes = restore_bytes(v, range);
    shm_prefault p;
    shm_prefault_init(&p, a, bytes);
    pthread_t t;
    bool two = st->ops->in_arena && bytes >= PREFAULT_MIN &&
               pthread_create(&t, NULL, prefault_main, &p) == 0;
    rc = ckpt_view_load(v, e);
    if (two) {
        if (rc == 0) shm_prefault_run(&p);
        pthread_join(t, NULL);
    }
    return rc;
}

static int restore_one(stash_arena *a, const shm_dir *dir, uint64_t id, stash_kg_range range,
                       ioe_engine *e, bool *applying, store *st, ckpt_prepare_fn *prepare,
                       void *ctx, ckpt_restored *out)
{
    ckpt_view v;
    /* Opening chk-ID checks that its metadata names ID. */
    int rc = ckpt_open_chk(dir, id, e, &v, false);
    if (rc) return rc;
    rc = load_for_restore(a, st, range, e, &v);
    if (rc == 0) rc = restore_view(a, &v, range, applying, st, prepare, ctx, out);
    ckpt_view_close(&v);
    return rc;
}

static bool thread_alive(uint32_t tid)
{
    return kill((pid_t)tid, 0) == 0 || errno != ESRCH;
}

/* The checkpoint the lazy restore brings its key groups from, copied out
 * under the control block's lock (a fallback rewrites it). */
static void lazy_source(stash_arena *a, char *out)
{
    shm_control *c = a->control;
    bool locked = shm_lock_acquire(&c->lock, NULL, NULL) >= 0;
    memcpy(out, c->lazy_path, sizeof c->lazy_path);
    if (locked) shm_lock_release(&c->lock);
    out[sizeof c->lazy_path - 1] = 0;
}

/* Claims key group kg of a lazy restore for this thread: 1 claimed (*dead:
 * from a thread that died at it, whose unfinished work is the claimant's
 * to clear), 0 if it is whole, after waiting while another thread holds it
 * (looking now and then whether that thread still lives). A failed key
 * group is claimed with take_failed, else STASH_ECORRUPT. */
static int lazy_claim(stash_arena *a, uint32_t kg, bool take_failed, bool *dead)
{
    _Atomic uint32_t *word = &a->tables[kg].lazy;
    for (;;) {
        uint32_t v = atomic_load_explicit(word, memory_order_acquire);
        if (v == 0) return 0;
        if (v == SHM_LAZY_FAILED && !take_failed) {
            char from[SHM_CTL_DETAIL];
            lazy_source(a, from);
            return shm_fail(STASH_ECORRUPT,
                            "%s: key group %u did not restore from %s (its blocks failed their "
                            "checks; the service's log says how)",
                            a->path, kg, from);
        }
        *dead = (v & SHM_LAZY_CLAIMED) && !thread_alive(v & ~SHM_LAZY_CLAIMED);
        if ((v & SHM_LAZY_CLAIMED) && !*dead) {
            shm_futex_wait(word, v, 10000000);
            continue;
        }
        if (atomic_compare_exchange_strong(word, &v,
                                           SHM_LAZY_CLAIMED | (uint32_t)syscall(SYS_gettid)))
            return 1;
    }
}

/* Lets claimed key group kg go as to says (0: whole, SHM_LAZY_PENDING or
 * SHM_LAZY_FAILED), waking its waiters. A key group that failed tells the
 * engine, which makes the arena fall back to a checkpoint that restores
 * whole. */
static void lazy_release(stash_arena *a, uint32_t kg, uint32_t to)
{
    shm_table *t = &a->tables[kg];
    shm_control *c = a->control;
    /* A pin below this epoch was taken before the key group was whole. */
    if (to == 0) atomic_store(&t->lazy_done_at, atomic_load(&t->epoch));
    atomic_store_explicit(&t->lazy, to, memory_order_release);
    if (to == 0) atomic_fetch_sub(&c->lazy_left, 1);
    shm_futex_wake_as_is(&t->lazy);
    if (to == SHM_LAZY_FAILED) {
        atomic_store(&c->lazy_failed, 1);
        shm_futex_wake(&c->wake);
    }
}

/* Claims key group kg whatever its state (whole, still to come, failed),
 * waiting while a live thread holds it; *whole says whether it was whole,
 * *dead whether its holder died. */
static void lazy_claim_any(stash_arena *a, uint32_t kg, bool *whole, bool *dead)
{
    _Atomic uint32_t *word = &a->tables[kg].lazy;
    uint32_t me = SHM_LAZY_CLAIMED | (uint32_t)syscall(SYS_gettid);
    for (;;) {
        uint32_t v = atomic_load_explicit(word, memory_order_acquire);
        *dead = (v & SHM_LAZY_CLAIMED) && !thread_alive(v & ~SHM_LAZY_CLAIMED);
        if ((v & SHM_LAZY_CLAIMED) && !*dead) {
            shm_futex_wait(word, v, 10000000);
            continue;
        }
        *whole = v == 0;
        if (atomic_compare_exchange_strong(word, &v, me)) return;
    }
}

/* The key groups of range a whole restore covers, within the arena's. */
static uint32_t range_end(const stash_arena *a, stash_kg_range range)
{
    uint32_t maxp = a->hdr->max_parallelism;
    return range.last < maxp ? range.last : maxp - 1;
}

/* Empties key group kg, just claimed, of what a restorer before left in it
 * (one that failed part-way, or after dead one that died at it, whose
 * unfinished heap work is mended first). */
static int lazy_clear_left(stash_arena *a, uint32_t kg, bool dead, store *st)
{
    int64_t there = dead ? shm_heap_recover(a, kg, shm_table_recover) : 0;
    if (there == 0) there = st->ops->kg_entries(st, kg);
    if (there < 0) return (int)there;
    return there > 0 ? st->ops->clear(st, (stash_kg_range){kg, kg}) : 0;
}

/* A whole restore over range while a lazy restore goes on takes the lazy
 * restore's key groups there first, so that no lazy restorer writes its
 * older records over the whole restore's: each still to come or failed is
 * claimed for this thread and emptied of what a restorer left. */
static int lazy_take(stash_arena *a, stash_kg_range range, store *st)
{
    for (uint32_t kg = range.first; kg <= range_end(a, range) && ckpt_lazy_pending(a); kg++) {
        bool dead = false;
        int rc = lazy_claim(a, kg, true, &dead);
        if (rc > 0) rc = lazy_clear_left(a, kg, dead, st);
        if (rc < 0) return rc;
    }
    return 0;
}

/* Gives back the key groups lazy_take claimed: whole if the restore
 * succeeded, else still to come. */
static void lazy_give(stash_arena *a, stash_kg_range range, bool whole)
{
    uint32_t me = SHM_LAZY_CLAIMED | (uint32_t)syscall(SYS_gettid);
    for (uint32_t kg = range.first; kg <= range_end(a, range); kg++)
        if (atomic_load_explicit(&a->tables[kg].lazy, memory_order_acquire) == me)
            lazy_release(a, kg, whole ? 0 : SHM_LAZY_PENDING);
}

/* The caller's store handle, or else one of the restore's own in *own. */
static int store_for(stash_arena *a, stash_kg_range range, store *given, store **own)
{
    *own = NULL;
    return given ? 0 : store_open(a, 0, range, own);
}

/* Restores range from v, opened without its data files, which it loads. */
static int restore_view_whole(stash_arena *a, ckpt_view *v, stash_kg_range range, ioe_engine *e,
                              store *st, ckpt_restored *out)
{
    store *own;
    memset(out, 0, sizeof *out);
    int rc = store_for(a, range, st, &own);
    bool taken = rc == 0 && ckpt_lazy_pending(a);
    if (taken) rc = lazy_take(a, range, st ? st : own);
    if (rc == 0) rc = load_for_restore(a, st ? st : own, range, e, v);
    if (rc == 0) {
        out->id = v->id;
        bool applying = false;
        rc = restore_view(a, v, range, &applying, st ? st : own, NULL, NULL, out);
        if (rc) ckpt_restored_free(out);
    }
    if (taken) lazy_give(a, range, rc == 0);
    store_close(own);
    return rc;
}

/* ---- a restore as the bytes arrive ---------------------------------------- */

typedef struct arriving {
    ckpt_view *v;
    stash_kg_range range;
    store *st;
    const snap_id_map *map;
    ckpt_arrived_fn *arrived;
    void *ctx;
    _Atomic uint32_t next; /* the next key group to take */
    _Atomic uint64_t records;
    pthread_mutex_t mu;
    int rc;
    char why[512]; /* rc's message, made in the thread that failed */
} arriving;

/* A record checked, then put in. */
typedef struct checked_restorer {
    snap_restorer to;
    const ckpt_view *v;
} checked_restorer;

static int check_and_restore(void *ctx, uint32_t kg, const snap_record *r)
{
    checked_restorer *c = ctx;
    int rc = ckpt_record_check(c->v, r);
    return rc ? rc : snap_restore_record(&c->to, kg, r);
}

/* Waits for key group kg's blocks, then in one pass checks each block and
 * each record and puts the record in: returns how many. */
static int64_t arrive_kg(arriving *x, uint32_t kg, snap_buf *scratch)
{
    ckpt_view *v = x->v;
    uint64_t held = 0;
    for (uint32_t f = 0; f < v->nfiles; f++) {
        md_extent e;
        snap_block_hdr h;
        memcpy(&e, v->files[f].extents + kg * sizeof e, sizeof e);
        int rc = e.offset > UINT64_MAX - e.size || e.offset + e.size > v->files[f].len ||
                         e.size < sizeof h
                     ? shm_fail(STASH_ECORRUPT,
                                "%s: key group %u: a block of %llu bytes at offset %llu, which "
                                "the file's %zu bytes do not hold",
                                v->files[f].path, kg, (unsigned long long)e.size,
                                (unsigned long long)e.offset, v->files[f].len)
                     : x->arrived(x->ctx, f, e.offset + e.size);
        if (rc) return rc;
        /* The room to make, from a header that passes its own checksum (the
         * walk below names one that does not) and claims no more records
         * than its raw bytes hold. */
        memcpy(&h, v->files[f].data + e.offset, sizeof h);
        if (snap_crc32c(0, &h, offsetof(snap_block_hdr, header_crc)) != h.header_crc) continue;
        if (h.records > h.raw_len / sizeof(snap_rec_hdr))
            return shm_fail(STASH_ECORRUPT, "%s: offset %llu: %llu records in %u bytes",
                            v->files[f].path, (unsigned long long)e.offset,
                            (unsigned long long)h.records, h.raw_len);
        held += h.records;
    }
    int64_t n = x->st->ops->restore_begin(x->st, kg, held);
    checked_restorer c = {{x->st, x->map}, v};
    if (n >= 0) n = ckpt_view_walk_kg(v, kg, false, check_and_restore, &c, scratch);
    int rc = snap_restore_kg_done(&c.to, kg, n < 0 ? (int)n : 0);
    return n >= 0 && rc < 0 ? rc : n;
}

static void *arrive_main(void *arg)
{
    arriving *x = arg;
    snap_buf scratch = {0};
    for (;;) {
        uint32_t kg = atomic_fetch_add(&x->next, 1);
        pthread_mutex_lock(&x->mu);
        bool stop = x->rc != 0 || kg > x->range.last;
        pthread_mutex_unlock(&x->mu);
        if (stop) break;
        int64_t n = arrive_kg(x, kg, &scratch);
        if (n >= 0) {
            atomic_fetch_add(&x->records, (uint64_t)n);
            continue;
        }
        pthread_mutex_lock(&x->mu);
        if (!x->rc) {
            x->rc = (int)n;
            snprintf(x->why, sizeof x->why, "%s", stash_errmsg());
        }
        pthread_mutex_unlock(&x->mu);
    }
    snap_buf_free(&scratch);
    return NULL;
}

int ckpt_restore_arriving(stash_arena *a, ckpt_view *v, stash_kg_range range, store *st,
                          ckpt_arrived_fn *arrived, void *ctx, ckpt_restored *out)
{
    store *own;
    memset(out, 0, sizeof *out);
    int rc = store_for(a, range, st, &own);
    uint16_t ids[SHM_CATALOG_SIZE + 1];
    snap_id_map map;
    if (rc == 0 && v->max_parallelism != a->hdr->max_parallelism)
        rc = shm_fail(STASH_ECORRUPT, "%s: a checkpoint of %u key groups for an arena of %u",
                      v->meta_path, v->max_parallelism, a->hdr->max_parallelism);
    if (rc == 0 && (range.first > range.last || range.last >= v->max_parallelism))
        rc = shm_fail(-EINVAL, "%s: key groups %u..%u of %u", v->meta_path, range.first, range.last,
                      v->max_parallelism);
    if (rc == 0) rc = map_states(a, v, ids, &map);
    if (rc == 0) rc = copy_opstate(v, &map, out);
    arriving x = {.v = v,
                  .range = range,
                  .st = st ? st : own,
                  .map = &map,
                  .arrived = arrived,
                  .ctx = ctx,
                  .next = range.first};
    pthread_mutex_init(&x.mu, NULL);
    if (rc == 0) {
        /* The arena memory the records will fill is mapped in bulk by a
         * thread of its own while the first bytes come, not a page at a
         * time by the threads that put them in. */
        uint64_t bytes = restore_bytes(v, range);
        shm_prefault p;
        shm_prefault_init(&p, a, bytes);
        pthread_t pt, t;
        bool prefaulting = x.st->ops->in_arena && bytes >= PREFAULT_MIN &&
                           pthread_create(&pt, NULL, prefault_main, &p) == 0;
        /* Key groups are independent: two threads take them in order, as
         * their bytes come. */
        bool two = sysconf(_SC_NPROCESSORS_ONLN) >= 2 && range.last > range.first &&
                   pthread_create(&t, NULL, arrive_main, &x) == 0;
        arrive_main(&x);
        if (two) pthread_join(t, NULL);
        if (prefaulting) pthread_join(pt, NULL);
        if (x.rc) rc = shm_fail(x.rc, "%s", x.why);
    }
    /* The file is the one the metadata names: its blocks' checksum. */
    for (uint32_t f = 0; rc == 0 && f < v->nfiles; f++) {
        rc = arrived(ctx, f, v->files[f].len);
        if (rc == 0) rc = ckpt_file_check(v, &v->files[f]);
    }
    pthread_mutex_destroy(&x.mu);
    if (rc == 0) {
        out->id = v->id;
        out->records = atomic_load(&x.records);
    } else {
        ckpt_restored_free(out);
    }
    store_close(own);
    return rc;
}

int ckpt_restore_path(stash_arena *a, const char *path, stash_kg_range range, ioe_engine *e,
                      store *st, ckpt_restored *out)
{
    ckpt_view v;
    memset(out, 0, sizeof *out);
    int rc = ckpt_open_view(path, e, &v, false);
    if (rc == 0) {
        rc = restore_view_whole(a, &v, range, e, st, out);
        ckpt_view_close(&v);
    }
    return rc;
}

int ckpt_restore_opstate(stash_arena *a, const char *path, ioe_engine *e, ckpt_restored *out)
{
    ckpt_view v;
    memset(out, 0, sizeof *out);
    int rc = ckpt_open_view(path, e, &v, false);
    if (rc) return rc;
    out->id = v.id;
    uint16_t ids[SHM_CATALOG_SIZE + 1];
    snap_id_map map;
    if (v.max_parallelism != a->hdr->max_parallelism)
        rc = shm_fail(STASH_ECORRUPT, "%s: a checkpoint of %u key groups for an arena of %u",
                      v.meta_path, v.max_parallelism, a->hdr->max_parallelism);
    if (rc == 0) rc = map_states(a, &v, ids, &map);
    if (rc == 0) rc = copy_opstate(&v, &map, out);
    ckpt_view_close(&v);
    if (rc) ckpt_restored_free(out);
    return rc;
}

int ckpt_restore(stash_arena *a, const shm_dir *dir, uint64_t id, stash_kg_range range,
                 ioe_engine *e, ckpt_restored *out)
{
    return ckpt_restore_prepared(a, dir, id, UINT64_MAX, range, e, NULL, NULL, NULL, out);
}

static int restore_newest(stash_arena *a, const shm_dir *dir, uint64_t id, uint64_t upto,
                          stash_kg_range range, ioe_engine *e, store *st, ckpt_prepare_fn *prepare,
                          void *ctx, ckpt_restored *out)
{
    memset(out, 0, sizeof *out);
    bool applying = false;
    int rc;
    if (id) {
        out->id = id;
        rc = restore_one(a, dir, id, range, e, &applying, st, prepare, ctx, out);
        if (rc) ckpt_restored_free(out);
        return rc;
    }
    uint64_t *ids;
    int n = ckpt_list(dir, &ids);
    if (n < 0) return n;
    rc = shm_fail(-ENOENT, "%s: no complete checkpoint", dir->path);
    for (int i = 0; i < n; i++) {
        /* Without _metadata a checkpoint does not exist: not a fallback. */
        if (ids[i] > upto || !ckpt_has_metadata(dir, ids[i])) continue;
        rc = restore_one(a, dir, ids[i], range, e, &applying, st, prepare, ctx, out);
        if (rc == 0) {
            out->id = ids[i];
            break;
        }
        char why[sizeof out->why];
        snprintf(why, sizeof why, "%s", stash_errmsg());
        if (applying) {
            rc = shm_fail(rc,
                          "%s: restoring checkpoint %llu failed part-way (%s): the arena "
                          "holds part of it",
                          dir->path, (unsigned long long)ids[i], why);
            break;
        }
        if (out->skipped++ == 0) memcpy(out->why, why, sizeof why);
    }
    if (rc && out->skipped)
        rc = shm_fail(rc, "%s: no checkpoint restores; the newest failed: %s", dir->path, out->why);
    if (rc) ckpt_restored_free(out);
    free(ids);
    return rc;
}

/* ---- a lazy restore ------------------------------------------------------- */

int ckpt_lazy_begin(stash_arena *a, const char *path, stash_kg_range range, ioe_engine *e,
                    ckpt_restored *out)
{
    shm_control *c = a->control;
    memset(out, 0, sizeof *out);
    /* Absolute: whoever touches a key group opens it, from anywhere. */
    char abs[sizeof c->lazy_path];
    if (shm_path_absolute(path, abs, sizeof abs) < 0)
        return shm_fail(-ENAMETOOLONG, "%s: a path too long for a lazy restore", path);
    /* Its metadata checked, its states registered, its operator state out. */
    int rc = ckpt_restore_opstate(a, abs, e, out);
    if (rc) return rc;
    snprintf(c->lazy_path, sizeof c->lazy_path, "%s", abs);
    atomic_store(&c->lazy_started_ns, shm_now_ns());
    for (uint32_t kg = range.first; kg <= range.last; kg++)
        atomic_store(&a->tables[kg].lazy, SHM_LAZY_PENDING);
    atomic_store(&c->lazy_left, range.last - range.first + 1);
    return 0;
}

bool ckpt_lazy_pending(const stash_arena *a)
{
    return atomic_load_explicit(&a->control->lazy_left, memory_order_acquire) != 0;
}

int ckpt_lazy_rebase(stash_arena *a, const char *path)
{
    shm_control *c = a->control;
    char abs[sizeof c->lazy_path];
    if (shm_path_absolute(path, abs, sizeof abs) < 0)
        return shm_fail(-ENAMETOOLONG, "%s: a path too long for a lazy restore", path);
    int rc = shm_lock_acquire(&c->lock, NULL, NULL);
    if (rc < 0) return rc;
    snprintf(c->lazy_path, sizeof c->lazy_path, "%s", abs);
    shm_lock_release(&c->lock);
    atomic_store(&c->lazy_started_ns, shm_now_ns());
    return 0;
}

int ckpt_lazy_renew(stash_arena *a, stash_kg_range range, bool failed_only, store *st)
{
    int rc = 0;
    uint32_t me = SHM_LAZY_CLAIMED | (uint32_t)syscall(SYS_gettid);
    for (uint32_t kg = range.first; kg <= range_end(a, range); kg++) {
        bool whole = false, dead = false;
        uint32_t failed = SHM_LAZY_FAILED;
        if (failed_only && !atomic_compare_exchange_strong(&a->tables[kg].lazy, &failed, me))
            continue;
        if (!failed_only) lazy_claim_any(a, kg, &whole, &dead);
        if (whole) atomic_fetch_add(&a->control->lazy_left, 1);
        int err = lazy_clear_left(a, kg, dead, st);
        if (err && !rc) rc = err;
        lazy_release(a, kg, SHM_LAZY_PENDING);
    }
    if (st->ops->commit) st->ops->commit(st);
    return rc;
}

/* Restores key group kg, claimed by this thread; after dead, a thread that
 * died restoring it. What is there already (a dead or failed restorer's
 * records) goes first. */
static int restore_claimed(stash_arena *a, uint32_t kg, bool dead, ioe_engine *e)
{
    stash_kg_range one = {kg, kg};
    store *st;
    int rc = store_open(a, 0, one, &st);
    if (rc) return rc;
    rc = lazy_clear_left(a, kg, dead, st);
    ioe_engine *own = NULL;
    /* A small engine: a key group's reads go into the view's own buffers. */
    if (rc == 0 && !e &&
        (rc = ioe_engine_open(&(ioe_opts){.depth = 8, .buf_count = 1, .buf_size = 4096}, &own)) < 0)
        rc = shm_fail(rc, "key group %u: no I/O engine for its restore", kg);
    ckpt_view v;
    char from[SHM_CTL_DETAIL];
    lazy_source(a, from);
    if (rc == 0) rc = ckpt_open_view(from, e ? e : own, &v, false);
    if (rc == 0 && (rc = ckpt_view_load_range(&v, e ? e : own, one)) != 0) ckpt_view_close(&v);
    ckpt_restored out = {0};
    bool applying = false;
    if (rc == 0) {
        rc = restore_view(a, &v, one, &applying, st, NULL, NULL, &out);
        ckpt_view_close(&v);
    }
    ckpt_restored_free(&out);
    if (own) ioe_engine_close(own);
    if (st->ops->commit) st->ops->commit(st);
    store_close(st);
    return rc;
}

int ckpt_lazy_await(stash_arena *a, uint32_t kg, ioe_engine *e)
{
    if (kg >= a->hdr->max_parallelism)
        return shm_fail(-EINVAL, "%s: key group %u of %u", a->path, kg, a->hdr->max_parallelism);
    bool dead = false;
    int rc = lazy_claim(a, kg, false, &dead);
    if (rc <= 0) return rc;
    rc = restore_claimed(a, kg, dead, e);
    char why[512];
    if (rc) snprintf(why, sizeof why, "%s", stash_errmsg());
    /* A damaged block stays damaged; anything else (memory, a read) may
     * pass: the next touch tries again. */
    lazy_release(a, kg, rc == 0 ? 0 : rc == STASH_ECORRUPT ? SHM_LAZY_FAILED : SHM_LAZY_PENDING);
    if (rc) {
        char from[SHM_CTL_DETAIL];
        lazy_source(a, from);
        return shm_fail(rc, "%s: key group %u did not restore from %s: %s", a->path, kg, from, why);
    }
    return 0;
}

int ckpt_lazy_copyable(stash_arena *a, ioe_engine *e)
{
    ckpt_view v;
    char from[SHM_CTL_DETAIL];
    lazy_source(a, from);
    int rc = ckpt_open_view(from, e, &v, false);
    if (rc) return rc;
    bool ok = v.nfiles == 1 && !(v.files[0].flags & CKPT_FILE_DELTA);
    /* Registered by the restore's start: each finds its own id again. */
    for (uint32_t i = 0; ok && i < v.nstates; i++) {
        ckpt_state s = ckpt_view_state(&v, i);
        ok = shm_catalog_register(a, s.name, s.kind, s.options) == (int)s.id;
    }
    ckpt_view_close(&v);
    return ok ? 0
              : shm_fail(-ENOTSUP, "%s: its blocks cannot stand in another checkpoint as they are",
                         from);
}

int ckpt_lazy_fill(stash_arena *a, ioe_engine *e, const _Atomic int *stop)
{
    for (uint32_t kg = 0; kg < a->hdr->max_parallelism && ckpt_lazy_pending(a); kg++) {
        if (stop && atomic_load(stop)) return 0;
        int rc = ckpt_lazy_await(a, kg, e);
        if (rc) return rc;
    }
    return 0;
}

int ckpt_restore_prepared(stash_arena *a, const shm_dir *dir, uint64_t id, uint64_t upto,
                          stash_kg_range range, ioe_engine *e, store *st, ckpt_prepare_fn *prepare,
                          void *ctx, ckpt_restored *out)
{
    store *own;
    memset(out, 0, sizeof *out);
    int rc = store_for(a, range, st, &own);
    bool taken = rc == 0 && ckpt_lazy_pending(a);
    if (taken) rc = lazy_take(a, range, st ? st : own);
    if (rc == 0) rc = restore_newest(a, dir, id, upto, range, e, st ? st : own, prepare, ctx, out);
    if (taken) lazy_give(a, range, rc == 0);
    store_close(own);
    return rc;
}
