/* SPDX-License-Identifier: MIT */
/*
 * storage.c: the table of remote checkpoint storages, found by a URL's
 * scheme, and each operation passed through a storage's table. Adding a
 * storage is a file defining its ckpt_storage_ops and a line here.
 */
#include <errno.h>
#include <string.h>

#include "backends/checkpoint/storage.h"

static const ckpt_storage_ops *const storages[] = {
    &ckpt_rados_ops,
    &ckpt_s3_ops,
};

const ckpt_storage_ops *ckpt_storage_find(const char *scheme, size_t len)
{
    for (size_t i = 0; i < sizeof storages / sizeof *storages; i++)
        if (strlen(storages[i]->scheme) == len && memcmp(storages[i]->scheme, scheme, len) == 0)
            return storages[i];
    return NULL;
}

const ckpt_storage_ops *ckpt_storage_of_url(const char *url)
{
    const char *sep = url ? strstr(url, "://") : NULL;
    return sep ? ckpt_storage_find(url, (size_t)(sep - url)) : NULL;
}

int ckpt_storage_open(const ckpt_storage_ops *ops, const char *container,
                      const stash_storage_opts *o, ckpt_storage **out)
{
    static const stash_storage_opts defaults = {.sz = sizeof defaults};
    if (!container || !*container || strchr(container, '/'))
        return shm_fail(-EINVAL, "%s://%s: not a %s container's name", ops->scheme,
                        container ? container : "", ops->scheme);
    if (o && o->depth > CKPT_STORAGE_DEPTH_MAX)
        return shm_fail(-EINVAL, "%s://%s: %u parts in flight, more than %u", ops->scheme,
                        container, o->depth, CKPT_STORAGE_DEPTH_MAX);
    int rc = ops->open(container, o ? o : &defaults, out);
    if (rc == 0 && (rc = ckpt_transfer_init(*out)) != 0) {
        ckpt_transfer_free(*out);
        ops->close(*out);
        *out = NULL;
    }
    return rc;
}

void ckpt_storage_close(ckpt_storage *st)
{
    if (!st) return;
    ckpt_transfer_free(st);
    st->ops->close(st);
}

/* An optional operation st's storage lacks. */
static int lacks(const ckpt_storage *st, const char *what)
{
    return shm_fail(-ENOTSUP, "%s: the %s storage cannot %s", st->where, st->ops->scheme, what);
}

#define CALL(st, op, what, ...) ((st)->ops->op ? (st)->ops->op(__VA_ARGS__) : lacks(st, what))

int ckpt_storage_file_size(ckpt_storage *st, const char *name, uint64_t *len)
{
    return st->ops->file_size(st, name, len);
}

int ckpt_storage_remove_file(ckpt_storage *st, const char *name)
{
    return st->ops->remove_file(st, name);
}

int ckpt_storage_list_files(ckpt_storage *st, const char *prefix, ckpt_storage_name_fn *fn,
                            void *ctx)
{
    return st->ops->list_files(st, prefix, fn, ctx);
}

int ckpt_storage_remove_prefix(ckpt_storage *st, const char *prefix)
{
    return st->ops->remove_prefix(st, prefix);
}

int ckpt_storage_swap(ckpt_storage *st, const char *name, const char *expect, const char *value)
{
    return CALL(st, swap, "compare and swap", st, name, expect, value);
}

int ckpt_storage_pointer(ckpt_storage *st, const char *name, char *buf, size_t cap)
{
    return CALL(st, pointer, "keep pointers", st, name, buf, cap);
}

int ckpt_storage_remove(ckpt_storage *st, const char *name)
{
    return CALL(st, remove, "remove pointers", st, name);
}

int ckpt_storage_set(ckpt_storage *st, const char *name, const char *value)
{
    return CALL(st, set, "set pointers", st, name, value);
}

int ckpt_storage_update(ckpt_storage *st, const char *name, const ckpt_storage_attr *expect,
                        size_t nexpect, const ckpt_storage_attr *set, size_t nset)
{
    return CALL(st, update, "compare and set attributes", st, name, expect, nexpect, set, nset);
}

int ckpt_storage_remove_if(ckpt_storage *st, const char *name, const ckpt_storage_attr *expect)
{
    return CALL(st, remove_if, "remove on a comparison", st, name, expect);
}

int ckpt_storage_touch(ckpt_storage *st, const char *name)
{
    return CALL(st, touch, "make empty objects", st, name);
}

int ckpt_storage_attrs(ckpt_storage *st, const char *name, ckpt_storage_attr_fn *fn, void *ctx)
{
    return CALL(st, attrs, "read attributes", st, name, fn, ctx);
}

int ckpt_storage_objects(ckpt_storage *st, const char *prefix, ckpt_storage_name_fn *fn, void *ctx)
{
    return CALL(st, objects, "list objects", st, prefix, fn, ctx);
}

int ckpt_storage_lock(ckpt_storage *st, const char *name, const char *cookie, uint32_t lease_ms)
{
    return CALL(st, lock, "hold leases", st, name, cookie, lease_ms);
}

int ckpt_storage_lease_held(ckpt_storage *st, const char *name)
{
    return CALL(st, lease_held, "hold leases", st, name);
}

int ckpt_storage_unlock(ckpt_storage *st, const char *name, const char *cookie)
{
    return CALL(st, unlock, "hold leases", st, name, cookie);
}

int ckpt_storage_watch_start(ckpt_storage *st, const char *name, ckpt_storage_notify_fn *fn,
                             void *ctx, ckpt_storage_watch **out)
{
    return CALL(st, watch_start, "watch objects", st, name, fn, ctx, out);
}

int ckpt_storage_watch_check(ckpt_storage_watch *w)
{
    return w->ops->watch_check(w);
}

void ckpt_storage_watch_stop(ckpt_storage_watch *w)
{
    if (w) w->ops->watch_stop(w);
}

int ckpt_storage_notify(ckpt_storage *st, const char *name, const char *msg, uint32_t timeout_ms)
{
    return CALL(st, notify, "notify watchers", st, name, msg, timeout_ms);
}
