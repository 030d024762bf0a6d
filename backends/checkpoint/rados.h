/* SPDX-License-Identifier: MIT */
/*
 * rados.h: checkpoint files as objects of a Ceph RADOS pool (rados.c):
 * a connection whose every call is bounded in time, a file striped over
 * objects written with several in flight, whole objects written atomically,
 * a compare-and-swap of a small pointer object, listing and removal by
 * prefix.
 */
#ifndef STASH_CKPT_RADOS_H
#define STASH_CKPT_RADOS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ioengine/ioengine.h"
#include "shm/shm.h"

#define CKPT_RADOS_STRIPE (4u << 20) /* bytes of each object of a striped file */
#define CKPT_RADOS_DEPTH 8u          /* objects in flight by default */
#define CKPT_RADOS_TIMEOUT_MS 10000u /* by default, of every call */

typedef struct ckpt_rados ckpt_rados;

typedef struct ckpt_rados_opts {
    const char *conf;    /* the cluster's ceph.conf (NULL: Ceph's search) */
    const char *id;      /* the client's id: "admin" for client.admin (NULL: admin) */
    const char *pool;    /* required */
    uint32_t timeout_ms; /* of connecting and of each operation, in whole seconds rounded
                            up (0: CKPT_RADOS_TIMEOUT_MS) */
    uint32_t depth;      /* objects written or read at once (0: CKPT_RADOS_DEPTH) */
} ckpt_rados_opts;

/* Connects to the cluster and opens the pool. Returns 0, -ETIMEDOUT when
 * no monitor answers in time, -ENOENT for a pool that does not exist, or
 * another error naming the cluster's conf and the pool. */
int ckpt_rados_open(const ckpt_rados_opts *o, ckpt_rados **out);
/* Shuts the connection down. Accepts NULL. */
void ckpt_rados_close(ckpt_rados *r);
/* The pool's name, for messages ("rados://POOL/NAME"). */
const char *ckpt_rados_pool(const ckpt_rados *r);

/* Writes a file of len bytes as objects NAME.0, NAME.1, ... of
 * CKPT_RADOS_STRIPE bytes, up to depth at once; NAME.0 carries the file's
 * length, written with it. A file is only trusted once something committed
 * names it (a checkpoint's metadata). Returns 0 or the first error, naming
 * the object. */
int ckpt_rados_write_file(ckpt_rados *r, const char *name, const void *data, size_t len);
/* Reads a file written by ckpt_rados_write_file into *out (malloc'd; the
 * caller frees it), at most limit bytes. Returns 0, -ENOENT, -EFBIG, or an
 * error naming the object (a stripe missing or short: STASH_ECORRUPT). */
int ckpt_rados_read_file(ckpt_rados *r, const char *name, size_t limit, uint8_t **out, size_t *len);
/* The length of a file written by ckpt_rados_write_file. Returns 0,
 * -ENOENT, or an error naming the object. */
int ckpt_rados_file_size(ckpt_rados *r, const char *name, uint64_t *len);
/* As ckpt_rados_read_file and ckpt_rados_write_file, streaming between the
 * objects and the file open at fd (named path in messages) through the
 * connection's buffers: what the file holds is written as its stripes come
 * in (*len: the file's length), or len bytes of it are read as stripes go
 * out. */
int ckpt_rados_get_fd(ckpt_rados *r, const char *name, int fd, const char *path, uint64_t *len);
int ckpt_rados_put_fd(ckpt_rados *r, const char *name, int fd, const char *path, uint64_t len);
/* Removes a file's objects. Removing what is absent is no error. */
int ckpt_rados_remove_file(ckpt_rados *r, const char *name);

/* Sets the pointer object name to value (a short string) if it holds
 * expect now, or, with expect NULL, if it does not exist: one atomic
 * operation, so that of two writers that read the same value only one
 * moves it. Returns 0, -ECANCELED if it holds something else (or exists
 * already), or another error naming the object. */
int ckpt_rados_swap(ckpt_rados *r, const char *name, const char *expect, const char *value);
/* Sets the pointer object name to value whatever it holds (its writer
 * holds a lease on it). */
int ckpt_rados_set(ckpt_rados *r, const char *name, const char *value);
/* An attribute of an object: its name and value (NULL: absent). */
#define CKPT_RADOS_VALUE "stash.ptr" /* a pointer object's value */
#define CKPT_RADOS_ATTR_MAX 1023u    /* bytes of an attribute's value read back */
typedef struct ckpt_rados_attr {
    const char *name;
    const char *value;
} ckpt_rados_attr;
/* Sets (value NULL: removes) the attributes set of object name if each of
 * expect holds the value given now (NULL: is absent), in one atomic
 * operation on the object: of two writers that read the same values, only
 * one changes them. Returns 0, -ECANCELED if one does not hold (or the
 * object is absent), or an error naming the object. */
int ckpt_rados_update(ckpt_rados *r, const char *name, const ckpt_rados_attr *expect,
                      size_t nexpect, const ckpt_rados_attr *set, size_t nset);
/* Removes object name if its attribute expect holds the value given, in
 * one operation. Returns 0, -ECANCELED, or an error naming the object. */
int ckpt_rados_remove_if(ckpt_rados *r, const char *name, const ckpt_rados_attr *expect);
/* Makes object name (empty) if it is absent. */
int ckpt_rados_touch(ckpt_rados *r, const char *name);
/* Calls fn(ctx, attribute, value) for each attribute of object name, all
 * read at once (values cut at CKPT_RADOS_ATTR_MAX bytes); a non-zero
 * return stops and is returned. -ENOENT if the object is absent. */
typedef int ckpt_rados_attr_fn(void *ctx, const char *attr, const char *value);
int ckpt_rados_attrs(ckpt_rados *r, const char *name, ckpt_rados_attr_fn *fn, void *ctx);
/* Reads the pointer object name into buf (cap bytes, NUL-terminated).
 * Returns 0, -ENOENT, or an error naming the object. */
int ckpt_rados_pointer(ckpt_rados *r, const char *name, char *buf, size_t cap);

/* Calls fn(ctx, name) for each object whose name starts with prefix, in no
 * order; a non-zero return stops the listing and is returned. */
int ckpt_rados_list(ckpt_rados *r, const char *prefix, int (*fn)(void *ctx, const char *name),
                    void *ctx);

/* Removes every object whose name starts with prefix (a job's: "JOB/"). */
int ckpt_rados_remove_prefix(ckpt_rados *r, const char *prefix);

/* Removes the one object name. Removing what is absent is no error. */
int ckpt_rados_remove(ckpt_rados *r, const char *name);

/* Takes, or renews, the lease on object name for lease_ms (whole
 * milliseconds; RADOS' exclusive lock with a duration): held by this
 * connection under cookie until it lapses unless renewed in time. Returns
 * 0, -EBUSY while another connection or cookie holds it, or an error
 * naming the object. */
int ckpt_rados_lock(ckpt_rados *r, const char *name, const char *cookie, uint32_t lease_ms);
/* Whether anyone holds the lease on object name now (1) or not (0): read
 * only, as the cluster's clock judges it. */
int ckpt_rados_lease_held(ckpt_rados *r, const char *name);
/* Gives a lease up. Giving up one not held is no error. */
int ckpt_rados_unlock(ckpt_rados *r, const char *name, const char *cookie);

/* Watches object name (made if absent): fn(ctx, msg) is called from
 * librados' thread with each notification sent to it (a short string),
 * which is acknowledged once fn returns. */
typedef struct ckpt_rados_watch ckpt_rados_watch;
typedef void ckpt_rados_notify_fn(void *ctx, const char *msg);
int ckpt_rados_watch_start(ckpt_rados *r, const char *name, ckpt_rados_notify_fn *fn, void *ctx,
                           ckpt_rados_watch **out);
/* Takes a watch the cluster dropped (its OSD gone a while) again. */
int ckpt_rados_watch_check(ckpt_rados_watch *w);
/* Ends a watch: no call of its fn runs once this returns. Accepts NULL. */
void ckpt_rados_watch_stop(ckpt_rados_watch *w);
/* Sends msg to every watcher of object name without waiting for their
 * acknowledgements (awaited in the background up to timeout_ms: a watcher
 * that is gone does not delay the sender). Returns 0 or an error naming
 * the object if it could not be sent. */
int ckpt_rados_notify(ckpt_rados *r, const char *name, const char *msg, uint32_t timeout_ms);

/* A job's checkpoints mirrored into RADOS (rados_mirror.c): objects named
 * JOB/ and the file's path in a checkpoint directory, JOB/latest naming
 * the newest complete checkpoint. */

/* Copies the checkpoint or savepoint directory dirname of dirfd (chk-ID or
 * savepoint-ID, committed; path names it in messages) into the job: its data files (a shared file
 * of an earlier checkpoint that is there already is not copied again),
 * then its metadata; then, for a checkpoint, moves JOB/latest from prev
 * (0: none yet) to its id. Returns 0, -ECANCELED if JOB/latest holds
 * another id (another engine committed), or an error naming the object. */
int ckpt_rados_upload(ckpt_rados *r, const char *job, int dirfd, const char *dirname,
                      const char *path, uint64_t prev, ioe_engine *e);
/* The id JOB/latest names. Returns 0, -ENOENT (the job has none), or an
 * error naming the object. */
int ckpt_rados_latest(ckpt_rados *r, const char *job, uint64_t *id);
/* Copies checkpoint or savepoint dirname (chk-ID, savepoint-ID, ...) of the
 * job into DIR/dirname (and the shared files it lists into DIR/shared),
 * unless DIR holds it already: each file moved into place once whole, the
 * checkpoint's directory last. Returns 0 or an error naming the object or
 * the file. */
int ckpt_rados_fetch(ckpt_rados *r, const char *job, const shm_dir *dir, const char *dirname);
/* Appends to *names (of *n; free each and the array) the shared files
 * ("shared/ID.dat") checkpoint dirname of the job lists. */
int ckpt_rados_shared_of(ckpt_rados *r, const char *job, const char *dirname, char ***names,
                         size_t *n);
/* The job's checkpoints in the pool, newest first: their ids in *ids and
 * whether each one's metadata is there in *committed (free both). */
int ckpt_rados_checkpoints(ckpt_rados *r, const char *job, uint64_t **ids, bool **committed,
                           size_t *n);
/* Removes the job's checkpoints but the newest keep complete ones at or
 * below JOB/latest (partial ones below it too), then the shared files none
 * of the kept ones lists. */
int ckpt_rados_retain(ckpt_rados *r, const char *job, unsigned keep);

/* URLs rados://POOL/JOB[/NAME] name a job's checkpoint or savepoint NAME
 * (chk-ID, savepoint-ID; without one, the checkpoint JOB/latest names). The
 * cluster is the one Ceph's own search finds ($CEPH_CONF, then
 * /etc/ceph/ceph.conf), the client $STASH_CEPH_ID or admin. */
#define CKPT_RADOS_URL "rados://"
bool ckpt_rados_url(const char *path);
/* Splits url into its pool, job and NAME ("" if none), each in a buffer
 * of the size given. Returns 0 or -EINVAL naming it. */
int ckpt_rados_url_parse(const char *url, char *pool, size_t pool_cap, char *job, size_t job_cap,
                         char *name, size_t name_cap);
/* Connects for url: *r (close it), the job and NAME ("" if none). */
int ckpt_rados_url_open(const char *url, ckpt_rados **r, char *job, size_t job_cap, char *name,
                        size_t name_cap);
/* A checkpoint or savepoint fetched from RADOS into a directory of its own. */
typedef struct ckpt_fetched {
    shm_dir parent;  /* where tmp was made */
    shm_dir tmp;     /* stash-rados-PID-R, this process's while open */
    char path[4096]; /* tmp/NAME: opens as any checkpoint directory */
} ckpt_fetched;
/* Copies what url names into a new directory under under (NULL: /var/tmp).
 * ckpt_rados_url_release removes it. */
int ckpt_rados_url_fetch(const char *url, const shm_dir *under, ckpt_fetched *out);
/* Removes what ckpt_rados_url_fetch fetched (accepts one that failed). */
void ckpt_rados_url_release(ckpt_fetched *f);
/* Copies the savepoint directory local into url, whose NAME must be
 * local's own name (savepoint-ID or another, not chk-ID) and not in the
 * job yet. Returns 0, -EEXIST, -EINVAL, or an error naming the object. */
int ckpt_rados_url_put(const char *local, const char *url, ioe_engine *e);

#endif /* STASH_CKPT_RADOS_H */
