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
    char pool[128];
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
    r->base.depth = o->depth ? o->depth : CKPT_STORAGE_DEPTH;
    r->base.part = STRIPE;
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

/* A file NAME of more than a stripe is objects NAME.0, NAME.1, ... each of
 * a stripe (the last of what is left); NAME.0 carries the file's length in
 * an xattr, set once every stripe is written (for a file of one stripe, in
 * the same operation as its bytes). Until then NAME.0 is there without a
 * length, made before any other stripe: a file being written, which no
 * reader sees and which removing removes whole. */
static void stripe_name(char *oid, size_t cap, const char *name, uint64_t k)
{
    snprintf(oid, cap, "%s.%llu", name, (unsigned long long)k);
}

static int rd_put_part(ckpt_storage *st, void *state, const char *name, uint64_t index,
                       const void *data, size_t len)
{
    (void)state;
    ckpt_rados *r = (ckpt_rados *)st;
    char oid[300];
    stripe_name(oid, sizeof oid, name, index);
    int rc = rados_write_full(r->io, oid, data, len);
    return rc < 0 ? fail(r, rc, oid, "write") : 0;
}

static int rd_put_begin(ckpt_storage *st, const char *name, void **state)
{
    ckpt_rados *r = (ckpt_rados *)st;
    char oid[300];
    stripe_name(oid, sizeof oid, name, 0);
    *state = NULL;
    int rc = rados_remove(r->io, oid);
    if (rc == 0 || rc == -ENOENT) rc = rados_write_full(r->io, oid, "", 0);
    return rc < 0 ? fail(r, rc, oid, "write") : 0;
}

/* NAME.0 takes the length last: the file is whole. */
static int rd_put_end(ckpt_storage *st, void *state, const char *name, uint64_t total,
                      uint64_t nparts)
{
    (void)state, (void)nparts;
    ckpt_rados *r = (ckpt_rados *)st;
    char oid[300];
    stripe_name(oid, sizeof oid, name, 0);
    int rc = rados_setxattr(r->io, oid, LEN_XATTR, (const char *)&total, sizeof total);
    return rc < 0 ? fail(r, rc, oid, "write") : 0;
}

/* Removes what a file given up may have left, NAME.0 last. */
static void rd_put_abort(ckpt_storage *st, void *state, const char *name, uint64_t nparts)
{
    (void)state;
    ckpt_rados *r = (ckpt_rados *)st;
    char oid[300];
    for (uint64_t k = 1; k < nparts; k++) {
        stripe_name(oid, sizeof oid, name, k);
        rados_remove(r->io, oid);
    }
    stripe_name(oid, sizeof oid, name, 0);
    rados_remove(r->io, oid);
}

static int rd_put_whole(ckpt_storage *st, const char *name, const void *data, size_t len)
{
    ckpt_rados *r = (ckpt_rados *)st;
    char oid[300];
    stripe_name(oid, sizeof oid, name, 0);
    uint64_t len64 = len;
    rados_write_op_t op = rados_create_write_op();
    if (!op) return shm_fail(-ENOMEM, "out of memory");
    rados_write_op_write_full(op, data, len);
    rados_write_op_setxattr(op, LEN_XATTR, (const char *)&len64, sizeof len64);
    int rc = rados_write_op_operate(op, r->io, oid, NULL, 0);
    rados_release_write_op(op);
    return rc < 0 ? fail(r, rc, oid, "write") : 0;
}

static int rd_get_range(ckpt_storage *st, const char *name, uint64_t off, void *dst, size_t len)
{
    ckpt_rados *r = (ckpt_rados *)st;
    char oid[300];
    stripe_name(oid, sizeof oid, name, off / STRIPE);
    int rc = rados_read(r->io, oid, dst, len, off % STRIPE);
    if (rc == -ENOENT && off) /* a stripe of a file that has its length */
        return shm_fail(STASH_ECORRUPT, "rados://%s/%s: a stripe is missing", r->pool, oid);
    if (rc < 0) return fail(r, rc, oid, "read");
    if ((size_t)rc != len)
        return shm_fail(STASH_ECORRUPT, "rados://%s/%s: %d bytes, not %zu", r->pool, oid, rc, len);
    return 0;
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

static int rd_remove_file(ckpt_storage *st, const char *name)
{
    ckpt_rados *r = (ckpt_rados *)st;
    char oid[300];
    uint64_t len;
    stripe_name(oid, sizeof oid, name, 0);
    int rc = rados_getxattr(r->io, oid, LEN_XATTR, (char *)&len, sizeof len);
    if (rc == -ENOENT) return 0;
    /* Whole, its stripes are known; being written (or given up by a writer
     * that died), they end before CKPT_STORAGE_DEPTH_MAX are missing in a
     * row: parts start in order, at most that many at once. NAME.0 goes
     * last: a removal cut short leaves a file to remove. */
    bool whole = rc == sizeof len;
    uint64_t stripes = whole ? (len + STRIPE - 1) / STRIPE : UINT64_MAX;
    for (uint64_t k = 1, missing = 0; k < stripes && missing < CKPT_STORAGE_DEPTH_MAX; k++) {
        stripe_name(oid, sizeof oid, name, k);
        rc = rados_remove(r->io, oid);
        if (rc < 0 && rc != -ENOENT) return fail(r, rc, oid, "remove");
        missing = rc == -ENOENT ? missing + 1 : 0;
    }
    stripe_name(oid, sizeof oid, name, 0);
    rc = rados_remove(r->io, oid);
    return rc < 0 && rc != -ENOENT ? fail(r, rc, oid, "remove") : 0;
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
    .put_whole = rd_put_whole,
    .put_begin = rd_put_begin,
    .put_part = rd_put_part,
    .put_end = rd_put_end,
    .put_abort = rd_put_abort,
    .get_range = rd_get_range,
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
