/* SPDX-License-Identifier: MIT */
/*
 * rados.c: checkpoint files as objects of a RADOS pool, through librados'
 * C API. librados waits forever on a monitor or OSD that is down unless
 * told otherwise, so the connection sets its mount, monitor and OSD
 * timeouts before it connects: a call fails with -ETIMEDOUT, never hangs
 * the engine.
 */
#include <errno.h>
#include <pthread.h>
#include <rados/librados.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/checkpoint/storage.h"
#include "shm/shm.h"

#define STRIPE (4u << 20)     /* bytes of each object of a striped file */
#define LEN_XATTR "stash.len" /* on NAME.0: the file's length, 8 bytes */
#define PTR_XATTR CKPT_STORAGE_VALUE

typedef struct ckpt_rados {
    ckpt_storage base;
    rados_t cluster;
    rados_ioctx_t io;
    uint32_t depth;
    char pool[128];
    /* depth stripe buffers, made on first use and kept: memory touched for
     * the first time costs more than the network (a page fault a page) */
    uint8_t **ring;
    pthread_mutex_t mu; /* guards sent */
    struct sent *sent;  /* notifications whose acknowledgements are still awaited */
} ckpt_rados;

/* A notification sent and not yet reaped. */
typedef struct sent {
    struct sent *next;
    rados_completion_t c;
    char *reply;
    size_t reply_len;
} sent;

/* Frees the notifications that completed (with all, waits for each). */
static void reap(ckpt_rados *r, bool all)
{
    pthread_mutex_lock(&r->mu);
    for (sent **p = &r->sent; *p;) {
        sent *n = *p;
        if (all) rados_aio_wait_for_complete(n->c);
        if (!all && !rados_aio_is_complete(n->c)) {
            p = &n->next;
            continue;
        }
        *p = n->next;
        if (n->reply) rados_buffer_free(n->reply);
        rados_aio_release(n->c);
        free(n);
    }
    pthread_mutex_unlock(&r->mu);
}

/* Fails with rc naming the object. */
static int fail(const ckpt_rados *r, int rc, const char *oid, const char *what)
{
    if (rc == -ENOSPC || rc == -EDQUOT)
        return shm_fail(rc, "rados://%s/%s: %s: the pool is full (%s)", r->pool, oid, what,
                        rc == -EDQUOT ? "its quota is reached" : "an OSD is past its full ratio");
    return shm_fail(rc, "rados://%s/%s: %s: %s", r->pool, oid, what, strerror(-rc));
}

static void rd_close(ckpt_storage *st)
{
    ckpt_rados *r = (ckpt_rados *)st;
    if (!r) return;
    if (r->io) reap(r, true);
    pthread_mutex_destroy(&r->mu);
    for (uint32_t i = 0; r->ring && i < r->depth; i++) free(r->ring[i]);
    free(r->ring);
    if (r->io) rados_ioctx_destroy(r->io);
    if (r->cluster) rados_shutdown(r->cluster);
    free(r);
}

static int rd_open(const char *pool, const stash_storage_opts *o, ckpt_storage **out)
{
    if (strlen(pool) >= sizeof((ckpt_rados *)0)->pool)
        return shm_fail(-EINVAL, "pool name '%s' is too long", pool);
    ckpt_rados *r = calloc(1, sizeof *r);
    if (!r) return shm_fail(-ENOMEM, "out of memory");
    r->base.ops = &ckpt_rados_ops;
    snprintf(r->base.where, sizeof r->base.where, "rados://%s", pool);
    pthread_mutex_init(&r->mu, NULL);
    snprintf(r->pool, sizeof r->pool, "%s", pool);
    r->depth = o->depth ? o->depth : CKPT_STORAGE_DEPTH;
    const char *conf = o->ceph_conf ? o->ceph_conf : "(Ceph's default ceph.conf)";
    int rc = rados_create(&r->cluster, o->ceph_id ? o->ceph_id : "admin");
    if (rc < 0) {
        r->cluster = NULL;
        shm_fail(rc, "%s: cannot make a RADOS client: %s", conf, strerror(-rc));
    }
    if (rc == 0 && (rc = rados_conf_read_file(r->cluster, o->ceph_conf)) < 0)
        shm_fail(rc, "%s: cannot read: %s", conf, strerror(-rc));
    /* Whole seconds (client_mount_timeout takes no fraction), rounded up. */
    char secs[32];
    snprintf(secs, sizeof secs, "%u",
             ((o->timeout_ms ? o->timeout_ms : CKPT_STORAGE_TIMEOUT_MS) + 999) / 1000);
    static const char *const timeouts[] = {"client_mount_timeout", "rados_mon_op_timeout",
                                           "rados_osd_op_timeout"};
    for (int i = 0; rc == 0 && i < 3; i++)
        if ((rc = rados_conf_set(r->cluster, timeouts[i], secs)) < 0)
            shm_fail(rc, "%s: cannot set %s: %s", conf, timeouts[i], strerror(-rc));
    if (rc == 0 && (rc = rados_connect(r->cluster)) < 0)
        shm_fail(rc, "%s: cannot reach the cluster: %s", conf, strerror(-rc));
    if (rc == 0 && (rc = rados_ioctx_create(r->cluster, pool, &r->io)) < 0) {
        r->io = NULL;
        shm_fail(rc, "rados://%s: cannot open the pool: %s", pool, strerror(-rc));
    }
    /* A write to a full pool fails at once (ENOSPC, EDQUOT) rather than
     * wait, unseen, for space until it times out. */
    if (rc == 0) rados_set_pool_full_try(r->io);
    if (rc) {
        rd_close(&r->base);
        return rc;
    }
    *out = &r->base;
    return 0;
}

/* ---- striped files -------------------------------------------------------- */

/* Operations in flight, at most depth, waited for oldest first. */
typedef struct flight {
    ckpt_rados *r;
    rados_completion_t *c;
    rados_write_op_t op; /* the first stripe's, released once it completes */
    char (*oid)[300];
    size_t *want; /* reads: the bytes each must bring */
    unsigned head, n;
    int rc;
} flight;

static int flight_init(flight *f, ckpt_rados *r)
{
    *f = (flight){.r = r};
    f->c = calloc(r->depth, sizeof *f->c);
    f->oid = calloc(r->depth, sizeof *f->oid);
    f->want = calloc(r->depth, sizeof *f->want);
    return f->c && f->oid && f->want ? 0 : shm_fail(-ENOMEM, "out of memory");
}

/* Waits for the oldest operation; keeps the first failure. */
static void flight_wait_one(flight *f, const char *what)
{
    unsigned i = f->head;
    rados_aio_wait_for_complete(f->c[i]);
    int rc = rados_aio_get_return_value(f->c[i]);
    rados_aio_release(f->c[i]);
    if (rc >= 0 && f->want[i] && (size_t)rc != f->want[i] && !f->rc)
        f->rc = shm_fail(STASH_ECORRUPT, "rados://%s/%s: %d bytes, not %zu", f->r->pool, f->oid[i],
                         rc, f->want[i]);
    if (rc == -ENOENT && f->want[i] && !f->rc) /* a stripe of a file that has its length */
        f->rc =
            shm_fail(STASH_ECORRUPT, "rados://%s/%s: a stripe is missing", f->r->pool, f->oid[i]);
    if (rc < 0 && !f->rc) f->rc = fail(f->r, rc, f->oid[i], what);
    f->head = (f->head + 1) % f->r->depth;
    f->n--;
}

/* A slot for the next operation on oid: its completion, once one is free. */
static rados_completion_t *flight_slot(flight *f, const char *what, const char *oid, size_t want)
{
    if (f->n == f->r->depth) flight_wait_one(f, what);
    unsigned i = (f->head + f->n) % f->r->depth;
    snprintf(f->oid[i], sizeof f->oid[i], "%s", oid);
    f->want[i] = want;
    if (rados_aio_create_completion2(NULL, NULL, &f->c[i]) < 0) return NULL;
    f->n++;
    return &f->c[i];
}

/* Waits for everything in flight and frees f; returns the first failure. */
static int flight_end(flight *f, const char *what)
{
    while (f->n) flight_wait_one(f, what);
    if (f->op) rados_release_write_op(f->op);
    free(f->c);
    free(f->oid);
    free(f->want);
    return f->rc;
}

static void stripe_name(char *oid, size_t cap, const char *name, size_t k)
{
    snprintf(oid, cap, "%s.%zu", name, k);
}

/* Where a stream's stripes come from or go: memory, read or written in
 * place, or a file, through the connection's stripe buffers. */
typedef struct ends {
    const uint8_t *src; /* a write's bytes in memory, or NULL */
    uint8_t *dst;       /* where a read's bytes go in memory, or NULL */
    int fd;             /* else the file, named path in messages */
    const char *path;
} ends;

/* The connection's stripe buffers. */
static int ring_of(ckpt_rados *r)
{
    if (r->ring) return 0;
    uint8_t **ring = calloc(r->depth, sizeof *ring);
    for (uint32_t i = 0; ring && i < r->depth; i++)
        if (!(ring[i] = malloc(STRIPE))) {
            while (i--) free(ring[i]);
            free(ring);
            ring = NULL;
        }
    if (!ring) return shm_fail(-ENOMEM, "out of memory");
    r->ring = ring;
    return 0;
}

/* Writes len bytes of e as the objects of name, up to depth at once; the
 * first carries the length, set in the same operation as its bytes. */
static int put_stream(ckpt_rados *r, const char *name, uint64_t len, const ends *e)
{
    int rc = e->src ? 0 : ring_of(r);
    flight f = {0};
    if (rc == 0) rc = flight_init(&f, r);
    uint64_t stripes = len ? (len + STRIPE - 1) / STRIPE : 1;
    for (uint64_t k = 0; rc == 0 && k < stripes && !f.rc; k++) {
        char oid[300];
        stripe_name(oid, sizeof oid, name, (size_t)k);
        uint64_t at = k * STRIPE;
        size_t n = len - at < STRIPE ? (size_t)(len - at) : STRIPE;
        /* The slot's buffer is free once the oldest write is done. */
        rados_completion_t *c = flight_slot(&f, "write", oid, 0);
        if (!c) {
            rc = shm_fail(-ENOMEM, "out of memory");
            break;
        }
        const uint8_t *p = e->src ? e->src + at : r->ring[(f.head + f.n - 1) % r->depth];
        for (size_t got = 0; !e->src && rc == 0 && got < n;) {
            ssize_t m = pread(e->fd, (uint8_t *)p + got, n - got, (off_t)(at + got));
            if (m <= 0)
                rc = shm_fail(m < 0 ? -errno : STASH_ECORRUPT, "read %s at offset %llu: %s",
                              e->path, (unsigned long long)(at + got),
                              m < 0 ? strerror(errno) : "the file is shorter than it was");
            got += m > 0 ? (size_t)m : 0;
        }
        int q = 0;
        if (rc == 0 && k == 0) {
            uint64_t len64 = len;
            f.op = rados_create_write_op();
            rados_write_op_write_full(f.op, (const char *)p, n);
            rados_write_op_setxattr(f.op, LEN_XATTR, (const char *)&len64, sizeof len64);
            q = rados_aio_write_op_operate(f.op, r->io, *c, oid, NULL, 0);
        } else if (rc == 0) {
            q = rados_aio_write_full(r->io, oid, *c, (const char *)p, n);
        }
        if (rc || q < 0) {
            rados_aio_release(*c);
            f.n--;
            if (q < 0) rc = fail(r, q, oid, "write");
        }
    }
    int ended = f.c ? flight_end(&f, "write") : 0;
    return rc ? rc : ended;
}

/* Waits for the oldest read; into a file, writes what it brought there. */
static void land_one(flight *f, const ends *e, const uint64_t *off)
{
    unsigned i = f->head;
    flight_wait_one(f, "read");
    for (size_t done = 0; !f->rc && !e->dst && done < f->want[i];) {
        ssize_t n = pwrite(e->fd, f->r->ring[i] + done, f->want[i] - done, (off_t)(off[i] + done));
        if (n < 0)
            f->rc = shm_fail(-errno, "write %s at offset %llu: %s", e->path,
                             (unsigned long long)(off[i] + done), strerror(errno));
        done += n > 0 ? (size_t)n : 0;
    }
}

/* Reads the len bytes of the objects of name into e, up to depth at once. */
static int get_stream(ckpt_rados *r, const char *name, uint64_t len, const ends *e)
{
    uint64_t *off = calloc(r->depth, sizeof *off);
    int rc = off ? 0 : shm_fail(-ENOMEM, "out of memory");
    if (rc == 0 && !e->dst) rc = ring_of(r);
    flight f = {0};
    if (rc == 0) rc = flight_init(&f, r);
    uint64_t stripes = (len + STRIPE - 1) / STRIPE;
    for (uint64_t k = 0; rc == 0 && k < stripes && !f.rc; k++) {
        char oid[300];
        stripe_name(oid, sizeof oid, name, (size_t)k);
        if (f.n == r->depth) land_one(&f, e, off);
        if (f.rc) break;
        unsigned i = (f.head + f.n) % r->depth;
        off[i] = k * STRIPE;
        size_t n = len - off[i] < STRIPE ? (size_t)(len - off[i]) : STRIPE;
        rados_completion_t *c = flight_slot(&f, "read", oid, n);
        if (!c) {
            rc = shm_fail(-ENOMEM, "out of memory");
            break;
        }
        char *into = (char *)(e->dst ? e->dst + off[i] : r->ring[i]);
        if ((rc = rados_aio_read(r->io, oid, *c, into, n, 0)) < 0) {
            rados_aio_release(*c);
            f.n--;
            rc = fail(r, rc, oid, "read");
        }
    }
    while (f.c && f.n) land_one(&f, e, off);
    int ended = f.c ? flight_end(&f, "read") : 0;
    free(off);
    return rc ? rc : ended;
}

static int rd_write_file(ckpt_storage *st, const char *name, const void *data, size_t len)
{
    ckpt_rados *r = (ckpt_rados *)st;
    return put_stream(r, name, len, &(ends){.src = data ? data : (const void *)""});
}

static int rd_put_fd(ckpt_storage *st, const char *name, int fd, const char *path, uint64_t len)
{
    ckpt_rados *r = (ckpt_rados *)st;
    return put_stream(r, name, len, &(ends){.fd = fd, .path = path});
}

static int rd_file_size(ckpt_storage *st, const char *name, uint64_t *len)
{
    ckpt_rados *r = (ckpt_rados *)st;
    char oid[300];
    stripe_name(oid, sizeof oid, name, 0);
    int rc = rados_getxattr(r->io, oid, LEN_XATTR, (char *)len, sizeof *len);
    if (rc == -ENOENT || rc == -ENODATA)
        return shm_fail(-ENOENT, "rados://%s/%s: no such file", r->pool, name);
    if (rc < 0) return fail(r, rc, oid, "read its length");
    if (rc != sizeof *len)
        return shm_fail(STASH_ECORRUPT, "rados://%s/%s: a length of %d bytes", r->pool, oid, rc);
    return 0;
}

static int rd_read_file(ckpt_storage *st, const char *name, size_t limit, uint8_t **out,
                        size_t *len)
{
    ckpt_rados *r = (ckpt_rados *)st;
    uint64_t len64 = 0;
    int rc = rd_file_size(&r->base, name, &len64);
    if (rc) return rc;
    if (len64 > limit)
        return shm_fail(-EFBIG, "rados://%s/%s: %llu bytes, more than %zu", r->pool, name,
                        (unsigned long long)len64, limit);
    uint8_t *buf = malloc(len64 ? len64 : 1);
    if (!buf) return shm_fail(-ENOMEM, "out of memory");
    if ((rc = get_stream(r, name, len64, &(ends){.dst = buf})) != 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = len64;
    return 0;
}

static int rd_get_fd(ckpt_storage *st, const char *name, int fd, const char *path, uint64_t *len)
{
    ckpt_rados *r = (ckpt_rados *)st;
    int rc = rd_file_size(&r->base, name, len);
    return rc ? rc : get_stream(r, name, *len, &(ends){.fd = fd, .path = path});
}

static int rd_remove_file(ckpt_storage *st, const char *name)
{
    ckpt_rados *r = (ckpt_rados *)st;
    /* Every stripe there is, however long the file was. */
    for (size_t k = 0;; k++) {
        char oid[300];
        stripe_name(oid, sizeof oid, name, k);
        int rc = rados_remove(r->io, oid);
        if (rc == -ENOENT) return 0;
        if (rc < 0) return fail(r, rc, oid, "remove");
    }
}

static int rd_objects(ckpt_storage *st, const char *prefix, ckpt_storage_name_fn *fn, void *ctx);

static int remove_one(void *ctx, const char *name)
{
    ckpt_rados *r = ctx;
    int rc = rados_remove(r->io, name);
    return rc < 0 && rc != -ENOENT ? fail(r, rc, name, "remove") : 0;
}

static int rd_remove_prefix(ckpt_storage *st, const char *prefix)
{
    ckpt_rados *r = (ckpt_rados *)st;
    return rd_objects(&r->base, prefix, remove_one, r);
}

/* ---- pointers and listing ----------------------------------------------- */

static int rd_swap(ckpt_storage *st, const char *name, const char *expect, const char *value)
{
    ckpt_rados *r = (ckpt_rados *)st;
    rados_write_op_t op = rados_create_write_op();
    if (!op) return shm_fail(-ENOMEM, "out of memory");
    if (expect)
        rados_write_op_cmpxattr(op, PTR_XATTR, LIBRADOS_CMPXATTR_OP_EQ, expect, strlen(expect));
    else
        rados_write_op_create(op, LIBRADOS_CREATE_EXCLUSIVE, NULL);
    rados_write_op_setxattr(op, PTR_XATTR, value, strlen(value));
    rados_write_op_write_full(op, value, strlen(value));
    int rc = rados_write_op_operate(op, r->io, name, NULL, 0);
    rados_release_write_op(op);
    if (rc == -ECANCELED || rc == -EEXIST || (expect && rc == -ENOENT))
        return shm_fail(-ECANCELED, "rados://%s/%s: does not hold '%s'", r->pool, name,
                        expect ? expect : "(nothing)");
    return rc < 0 ? fail(r, rc, name, "swap") : 0;
}

static int rd_set(ckpt_storage *st, const char *name, const char *value)
{
    ckpt_rados *r = (ckpt_rados *)st;
    rados_write_op_t op = rados_create_write_op();
    if (!op) return shm_fail(-ENOMEM, "out of memory");
    rados_write_op_setxattr(op, PTR_XATTR, value, strlen(value));
    rados_write_op_write_full(op, value, strlen(value));
    int rc = rados_write_op_operate(op, r->io, name, NULL, 0);
    rados_release_write_op(op);
    return rc < 0 ? fail(r, rc, name, "write") : 0;
}

static int rd_pointer(ckpt_storage *st, const char *name, char *buf, size_t cap)
{
    ckpt_rados *r = (ckpt_rados *)st;
    int rc = rados_getxattr(r->io, name, PTR_XATTR, buf, cap - 1);
    if (rc == -ENODATA) rc = -ENOENT; /* the object is there (a lease made it), its value not */
    if (rc == -ENOENT) return shm_fail(rc, "rados://%s/%s: no such pointer", r->pool, name);
    if (rc < 0) return fail(r, rc, name, "read");
    buf[rc] = 0;
    return 0;
}

static int rd_update(ckpt_storage *st, const char *name, const ckpt_storage_attr *expect,
                     size_t nexpect, const ckpt_storage_attr *set, size_t nset)
{
    ckpt_rados *r = (ckpt_rados *)st;
    rados_write_op_t op = rados_create_write_op();
    if (!op) return shm_fail(-ENOMEM, "out of memory");
    /* An attribute that is absent compares as the empty string. */
    for (size_t i = 0; i < nexpect; i++) {
        const char *v = expect[i].value ? expect[i].value : "";
        rados_write_op_cmpxattr(op, expect[i].name, LIBRADOS_CMPXATTR_OP_EQ, v, strlen(v));
    }
    for (size_t i = 0; i < nset; i++)
        if (set[i].value)
            rados_write_op_setxattr(op, set[i].name, set[i].value, strlen(set[i].value));
        else
            rados_write_op_rmxattr(op, set[i].name);
    int rc = rados_write_op_operate(op, r->io, name, NULL, 0);
    rados_release_write_op(op);
    if (rc == -ECANCELED || (nexpect && rc == -ENOENT))
        return shm_fail(-ECANCELED, "rados://%s/%s: changed by another", r->pool, name);
    return rc < 0 ? fail(r, rc, name, "update") : 0;
}

static int rd_remove_if(ckpt_storage *st, const char *name, const ckpt_storage_attr *expect)
{
    ckpt_rados *r = (ckpt_rados *)st;
    rados_write_op_t op = rados_create_write_op();
    if (!op) return shm_fail(-ENOMEM, "out of memory");
    const char *v = expect->value ? expect->value : "";
    rados_write_op_cmpxattr(op, expect->name, LIBRADOS_CMPXATTR_OP_EQ, v, strlen(v));
    rados_write_op_remove(op);
    int rc = rados_write_op_operate(op, r->io, name, NULL, 0);
    rados_release_write_op(op);
    if (rc == -ECANCELED || rc == -ENOENT)
        return shm_fail(-ECANCELED, "rados://%s/%s: changed by another", r->pool, name);
    return rc < 0 ? fail(r, rc, name, "remove") : 0;
}

static int rd_touch(ckpt_storage *st, const char *name)
{
    ckpt_rados *r = (ckpt_rados *)st;
    rados_write_op_t op = rados_create_write_op();
    if (!op) return shm_fail(-ENOMEM, "out of memory");
    rados_write_op_create(op, LIBRADOS_CREATE_IDEMPOTENT, NULL);
    int rc = rados_write_op_operate(op, r->io, name, NULL, 0);
    rados_release_write_op(op);
    return rc < 0 ? fail(r, rc, name, "create") : 0;
}

static int rd_attrs(ckpt_storage *st, const char *name, ckpt_storage_attr_fn *fn, void *ctx)
{
    ckpt_rados *r = (ckpt_rados *)st;
    rados_xattrs_iter_t it;
    int rc = rados_getxattrs(r->io, name, &it);
    if (rc == -ENOENT) return shm_fail(rc, "rados://%s/%s: no such object", r->pool, name);
    if (rc < 0) return fail(r, rc, name, "read");
    char value[CKPT_STORAGE_ATTR_MAX + 1];
    for (;;) {
        const char *key, *val;
        size_t len;
        if ((rc = rados_getxattrs_next(it, &key, &val, &len)) < 0) {
            rc = fail(r, rc, name, "read");
            break;
        }
        if (!key) break;
        if (len > CKPT_STORAGE_ATTR_MAX) len = CKPT_STORAGE_ATTR_MAX;
        memcpy(value, val, len);
        value[len] = 0;
        if ((rc = fn(ctx, key, value)) != 0) break;
    }
    rados_getxattrs_end(it);
    return rc;
}

static int rd_objects(ckpt_storage *st, const char *prefix, ckpt_storage_name_fn *fn, void *ctx)
{
    ckpt_rados *r = (ckpt_rados *)st;
    rados_list_ctx_t l;
    int rc = rados_nobjects_list_open(r->io, &l);
    if (rc < 0) return fail(r, rc, prefix, "list");
    size_t plen = strlen(prefix);
    char name[1024];
    for (;;) {
        const char *entry;
        size_t n = 0;
        rc = rados_nobjects_list_next2(l, &entry, NULL, NULL, &n, NULL, NULL);
        if (rc == -ENOENT) {
            rc = 0;
            break;
        }
        if (rc < 0) {
            rc = fail(r, rc, prefix, "list");
            break;
        }
        if (n < plen || n >= sizeof name || memcmp(entry, prefix, plen) != 0) continue;
        memcpy(name, entry, n);
        name[n] = 0;
        if ((rc = fn(ctx, name)) != 0) break;
    }
    rados_nobjects_list_close(l);
    return rc;
}

/* A file is its stripes NAME.0, NAME.1, ...: listed once, by NAME.0. */
typedef struct files_of {
    ckpt_storage_name_fn *fn;
    void *ctx;
} files_of;

static int take_file(void *ctx, const char *object)
{
    files_of *f = ctx;
    size_t n = strlen(object);
    if (n < 3 || strcmp(object + n - 2, ".0") != 0) return 0;
    char name[1024];
    snprintf(name, sizeof name, "%.*s", (int)(n - 2), object);
    return f->fn(f->ctx, name);
}

static int rd_list_files(ckpt_storage *st, const char *prefix, ckpt_storage_name_fn *fn, void *ctx)
{
    return rd_objects(st, prefix, take_file, &(files_of){fn, ctx});
}

static int rd_remove(ckpt_storage *st, const char *name)
{
    ckpt_rados *r = (ckpt_rados *)st;
    int rc = rados_remove(r->io, name);
    return rc < 0 && rc != -ENOENT ? fail(r, rc, name, "remove") : 0;
}

/* ---- leases and notifications ------------------------------------------------- */

#define LOCK_NAME "stash.lease"

static int rd_lock(ckpt_storage *st, const char *name, const char *cookie, uint32_t lease_ms)
{
    ckpt_rados *r = (ckpt_rados *)st;
    struct timeval d = {.tv_sec = lease_ms / 1000, .tv_usec = (lease_ms % 1000) * 1000};
    int rc = rados_lock_exclusive(r->io, name, LOCK_NAME, cookie, "stash", &d,
                                  LIBRADOS_LOCK_FLAG_MAY_RENEW);
    if (rc == -EBUSY || rc == -EEXIST)
        return shm_fail(-EBUSY, "rados://%s/%s: held by another", r->pool, name);
    return rc < 0 ? fail(r, rc, name, "lock") : 0;
}

static int rd_lease_held(ckpt_storage *st, const char *name)
{
    ckpt_rados *r = (ckpt_rados *)st;
    int exclusive;
    char tag[64], clients[512], cookies[512], addrs[512];
    size_t tag_len = sizeof tag, clients_len = sizeof clients, cookies_len = sizeof cookies,
           addrs_len = sizeof addrs;
    /* The class lists a lease only while it lasts: a lapsed one is no holder. */
    ssize_t n = rados_list_lockers(r->io, name, LOCK_NAME, &exclusive, tag, &tag_len, clients,
                                   &clients_len, cookies, &cookies_len, addrs, &addrs_len);
    if (n == -ENOENT) return 0;
    if (n < 0) return fail(r, (int)n, name, "list the lease of");
    return n > 0;
}

static int rd_unlock(ckpt_storage *st, const char *name, const char *cookie)
{
    ckpt_rados *r = (ckpt_rados *)st;
    int rc = rados_unlock(r->io, name, LOCK_NAME, cookie);
    return rc < 0 && rc != -ENOENT ? fail(r, rc, name, "unlock") : 0;
}

typedef struct rd_watcher {
    ckpt_storage_watch base;
    ckpt_rados *r;
    uint64_t handle;
    ckpt_storage_notify_fn *fn;
    void *ctx;
    char name[];
} rd_watcher;

static void on_notify(void *arg, uint64_t notify_id, uint64_t handle, uint64_t notifier, void *data,
                      size_t len)
{
    (void)notifier;
    rd_watcher *w = arg;
    char msg[512];
    if (len >= sizeof msg) len = sizeof msg - 1;
    memcpy(msg, data, len);
    msg[len] = 0;
    w->fn(w->ctx, msg);
    rados_notify_ack(w->r->io, w->name, notify_id, handle, NULL, 0);
}

/* The watch was lost (its OSD went away long enough): notifications may
 * have been missed, which the caller's polling makes up for; the watch is
 * taken again on the next watch check. */
static void on_watch_error(void *arg, uint64_t handle, int err)
{
    (void)handle;
    (void)err;
    rd_watcher *w = arg;
    __atomic_store_n(&w->handle, 0, __ATOMIC_RELEASE);
}

static int watch(rd_watcher *w)
{
    ckpt_rados *r = w->r;
    rados_write_op_t op = rados_create_write_op();
    if (!op) return shm_fail(-ENOMEM, "out of memory");
    rados_write_op_create(op, LIBRADOS_CREATE_IDEMPOTENT, NULL);
    int rc = rados_write_op_operate(op, r->io, w->name, NULL, 0);
    rados_release_write_op(op);
    uint64_t handle = 0;
    if (rc == 0) rc = rados_watch2(r->io, w->name, &handle, on_notify, on_watch_error, w);
    if (rc < 0) return fail(r, rc, w->name, "watch");
    __atomic_store_n(&w->handle, handle, __ATOMIC_RELEASE);
    return 0;
}

static int rd_watch_start(ckpt_storage *st, const char *name, ckpt_storage_notify_fn *fn, void *ctx,
                          ckpt_storage_watch **out)
{
    ckpt_rados *r = (ckpt_rados *)st;
    rd_watcher *w = calloc(1, sizeof *w + strlen(name) + 1);
    if (!w) return shm_fail(-ENOMEM, "out of memory");
    *w = (rd_watcher){.base = {&ckpt_rados_ops}, .r = r, .fn = fn, .ctx = ctx};
    strcpy(w->name, name);
    int rc = watch(w);
    if (rc) {
        free(w);
        return rc;
    }
    *out = &w->base;
    return 0;
}

static int rd_watch_check(ckpt_storage_watch *base)
{
    rd_watcher *w = (rd_watcher *)base;
    uint64_t handle = __atomic_load_n(&w->handle, __ATOMIC_ACQUIRE);
    if (handle && rados_watch_check(w->r->io, handle) >= 0) return 0;
    if (handle) rados_unwatch2(w->r->io, handle);
    return watch(w);
}

static void rd_watch_stop(ckpt_storage_watch *base)
{
    rd_watcher *w = (rd_watcher *)base;
    uint64_t handle = __atomic_load_n(&w->handle, __ATOMIC_ACQUIRE);
    if (handle) rados_unwatch2(w->r->io, handle);
    /* No callback runs on w once this returns. */
    rados_watch_flush(w->r->cluster);
    free(w);
}

static int rd_notify(ckpt_storage *st, const char *name, const char *msg, uint32_t timeout_ms)
{
    ckpt_rados *r = (ckpt_rados *)st;
    reap(r, false);
    sent *n = calloc(1, sizeof *n);
    if (!n) return shm_fail(-ENOMEM, "out of memory");
    int rc = rados_aio_create_completion2(NULL, NULL, &n->c);
    if (rc == 0)
        rc = rados_aio_notify(r->io, name, n->c, msg, (int)strlen(msg), timeout_ms, &n->reply,
                              &n->reply_len);
    if (rc < 0) {
        if (n->c) rados_aio_release(n->c);
        free(n);
        return fail(r, rc, name, "notify");
    }
    pthread_mutex_lock(&r->mu);
    n->next = r->sent;
    r->sent = n;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

const ckpt_storage_ops ckpt_rados_ops = {
    .version = CKPT_STORAGE_VERSION,
    .scheme = "rados",
    .container = "POOL",
    .caps = CKPT_CAN_SWAP | CKPT_CAN_JOB,
    .open = rd_open,
    .close = rd_close,
    .write_file = rd_write_file,
    .put_fd = rd_put_fd,
    .read_file = rd_read_file,
    .get_fd = rd_get_fd,
    .file_size = rd_file_size,
    .remove_file = rd_remove_file,
    .list_files = rd_list_files,
    .remove_prefix = rd_remove_prefix,
    .swap = rd_swap,
    .pointer = rd_pointer,
    .remove = rd_remove,
    .set = rd_set,
    .update = rd_update,
    .remove_if = rd_remove_if,
    .touch = rd_touch,
    .attrs = rd_attrs,
    .objects = rd_objects,
    .lock = rd_lock,
    .lease_held = rd_lease_held,
    .unlock = rd_unlock,
    .watch_start = rd_watch_start,
    .watch_check = rd_watch_check,
    .watch_stop = rd_watch_stop,
    .notify = rd_notify,
};
