/* SPDX-License-Identifier: MIT */
/*
 * storage.h: remote checkpoint storages as one table of operations, found
 * by a URL's scheme (storage.c): a Ceph RADOS pool (rados.c), an S3 bucket
 * (s3.c). A storage keeps files by name in a container (a pool, a bucket),
 * each moved in parts (transfer.c moves whole files over them, for every
 * storage), listed and removed by prefix. Pointer objects moved by compare-and-swap are
 * optional (CKPT_CAN_SWAP), and so is what a job that spans hosts needs
 * (CKPT_CAN_JOB: attributes compared and set at once, leases,
 * notifications); callers ask with ckpt_storage_can() first. A storage
 * grows by a new version of the table.
 */
#ifndef STASH_CKPT_STORAGE_H
#define STASH_CKPT_STORAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shm/shm.h"

#define CKPT_STORAGE_VERSION 2u
#define CKPT_STORAGE_DEPTH 8u          /* objects or parts in flight by default */
#define CKPT_STORAGE_DEPTH_MAX 64u     /* and at most */
#define CKPT_STORAGE_TIMEOUT_MS 10000u /* by default, of every call */

/* What a storage can do beyond files: pointers (swap, pointer, remove),
 * and what a job that spans hosts needs (set, update, remove_if, touch,
 * attrs, objects, leases, watches). */
#define CKPT_CAN_SWAP (1u << 0)
#define CKPT_CAN_JOB (1u << 1)

typedef struct ckpt_storage_ops ckpt_storage_ops;

/* Every storage's handle starts with this. */
typedef struct ckpt_storage {
    const ckpt_storage_ops *ops;
    char where[192];                /* "rados://POOL", "s3://BUCKET": what messages name */
    uint64_t part;                  /* the bytes of a part: what one call moves (set by open) */
    uint32_t depth;                 /* parts in flight at once (set by open) */
    struct ckpt_transfer *transfer; /* part buffers kept, faults injected (transfer.c) */
} ckpt_storage;

/* An attribute of an object: its name and value (NULL: absent). */
#define CKPT_STORAGE_VALUE "stash.ptr" /* a pointer object's value */
#define CKPT_STORAGE_ATTR_MAX 1023u    /* bytes of an attribute's value read back */
typedef struct ckpt_storage_attr {
    const char *name;
    const char *value;
} ckpt_storage_attr;
typedef int ckpt_storage_attr_fn(void *ctx, const char *attr, const char *value);
typedef int ckpt_storage_name_fn(void *ctx, const char *name);

/* A watch on an object; each storage's starts with this. */
typedef struct ckpt_storage_watch {
    const ckpt_storage_ops *ops;
} ckpt_storage_watch;
typedef void ckpt_storage_notify_fn(void *ctx, const char *msg);

struct ckpt_storage_ops {
    unsigned version;      /* CKPT_STORAGE_VERSION */
    const char *scheme;    /* its URLs: SCHEME://CONTAINER/... */
    const char *container; /* what a container is called in messages: "POOL" */
    unsigned caps;         /* CKPT_CAN_* */

    /* Connects to container (a pool, a bucket) with o's options for it.
     * Returns 0, or an error naming the storage and why (-ETIMEDOUT, -ENOENT
     * for a container that does not exist, -EACCES). */
    int (*open)(const char *container, const stash_storage_opts *o, ckpt_storage **out);
    void (*close)(ckpt_storage *st);

    /* ---- files: all required ---- */
    /* A file is written in parts of st->part bytes, several at once from
     * threads of their own, and becomes whole (the only state a reader
     * sees) when it ends. put_whole writes a file of one part (len <=
     * st->part). put_begin starts a file of more parts (*state: what the
     * others need, or NULL); put_part writes part index (from 0), from any
     * thread; put_end makes the file whole once every part is written
     * (total bytes in nparts parts); put_abort gives up a file begun, of
     * which parts below nparts may have been written (NULL: nothing to give
     * up). A file is only trusted once something committed names it. Each
     * returns 0 or an error naming the file. */
    int (*put_whole)(ckpt_storage *st, const char *name, const void *data, size_t len);
    int (*put_begin)(ckpt_storage *st, const char *name, void **state);
    int (*put_part)(ckpt_storage *st, void *state, const char *name, uint64_t index,
                    const void *data, size_t len);
    int (*put_end)(ckpt_storage *st, void *state, const char *name, uint64_t total,
                   uint64_t nparts);
    void (*put_abort)(ckpt_storage *st, void *state, const char *name, uint64_t nparts);
    /* Reads len bytes of file name at off (a multiple of st->part, len at
     * most a part) into dst, from any thread: 0, -ENOENT, or an error
     * naming it (fewer bytes there: STASH_ECORRUPT). */
    int (*get_range)(ckpt_storage *st, const char *name, uint64_t off, void *dst, size_t len);
    /* The length of file name: 0, -ENOENT, or an error naming it. */
    int (*file_size)(ckpt_storage *st, const char *name, uint64_t *len);
    /* Removes file name; removing what is absent is no error. */
    int (*remove_file)(ckpt_storage *st, const char *name);
    /* Calls fn(ctx, name) for each file whose name starts with prefix, in
     * no order; a non-zero return stops and is returned. */
    int (*list_files)(ckpt_storage *st, const char *prefix, ckpt_storage_name_fn *fn, void *ctx);
    /* Removes every file and object whose name starts with prefix. */
    int (*remove_prefix)(ckpt_storage *st, const char *prefix);

    /* ---- pointers: CKPT_CAN_SWAP ---- */
    /* Sets pointer object name to value if it holds expect now, or, with
     * expect NULL, if it does not exist: one atomic operation, of two
     * writers that read the same value only one moves it. A writer's values
     * are its own (ids it claimed, claims of its own): a storage that
     * retries a call whose answer was lost may take finding value there as
     * its own success. Returns 0, -ECANCELED, or an error naming it. */
    int (*swap)(ckpt_storage *st, const char *name, const char *expect, const char *value);
    /* Reads pointer object name into buf (cap bytes, NUL-terminated): 0,
     * -ENOENT, or an error naming it. */
    int (*pointer)(ckpt_storage *st, const char *name, char *buf, size_t cap);
    /* Removes the one object name; removing what is absent is no error. */
    int (*remove)(ckpt_storage *st, const char *name);

    /* ---- a job that spans hosts: CKPT_CAN_JOB, each as its function below says ---- */
    int (*set)(ckpt_storage *st, const char *name, const char *value);
    int (*update)(ckpt_storage *st, const char *name, const ckpt_storage_attr *expect,
                  size_t nexpect, const ckpt_storage_attr *set, size_t nset);
    int (*remove_if)(ckpt_storage *st, const char *name, const ckpt_storage_attr *expect);
    int (*touch)(ckpt_storage *st, const char *name);
    int (*attrs)(ckpt_storage *st, const char *name, ckpt_storage_attr_fn *fn, void *ctx);
    int (*objects)(ckpt_storage *st, const char *prefix, ckpt_storage_name_fn *fn, void *ctx);
    int (*lock)(ckpt_storage *st, const char *name, const char *cookie, uint32_t lease_ms);
    int (*lease_held)(ckpt_storage *st, const char *name);
    int (*unlock)(ckpt_storage *st, const char *name, const char *cookie);
    int (*watch_start)(ckpt_storage *st, const char *name, ckpt_storage_notify_fn *fn, void *ctx,
                       ckpt_storage_watch **out);
    int (*watch_check)(ckpt_storage_watch *w);
    void (*watch_stop)(ckpt_storage_watch *w);
    int (*notify)(ckpt_storage *st, const char *name, const char *msg, uint32_t timeout_ms);
};

/* The storages, one line each in storage.c's table. */
extern const ckpt_storage_ops ckpt_rados_ops;
extern const ckpt_storage_ops ckpt_s3_ops;

/* The storage whose scheme is the len bytes at scheme, or NULL. */
const ckpt_storage_ops *ckpt_storage_find(const char *scheme, size_t len);
/* The storage a URL names (SCHEME://...), or NULL if it names none. */
const ckpt_storage_ops *ckpt_storage_of_url(const char *url);
/* Whether st can do what caps names. */
static inline bool ckpt_storage_can(const ckpt_storage *st, unsigned caps)
{
    return (st->ops->caps & caps) == caps;
}
/* What messages name st by: "rados://POOL". */
static inline const char *ckpt_storage_where(const ckpt_storage *st)
{
    return st->where;
}

/* Opens container of the storage ops with o's options (NULL: defaults;
 * a caller's struct is taken by the public entry, shm_take_opts). */
int ckpt_storage_open(const ckpt_storage_ops *ops, const char *container,
                      const stash_storage_opts *o, ckpt_storage **out);
/* Closes st. Accepts NULL. */
void ckpt_storage_close(ckpt_storage *st);

/* ---- files, moved in parts, depth at once (transfer.c) ---- */
/* What transfers of st keep: part buffers, and in builds with
 * STASH_FAULT_INJECTION the faults $STASH_STORAGE_FAULT asks for (the
 * grammar of $STASH_IO_FAULT: write:N:ERR fails the Nth part or whole file
 * written, read:N:ERR the Nth part read, delay:MS holds each). Made by
 * ckpt_storage_open (-EINVAL for a bad specification) and freed by
 * ckpt_storage_close. */
int ckpt_transfer_init(ckpt_storage *st);
void ckpt_transfer_free(ckpt_storage *st);
/* Writes a file of len bytes from data. Returns 0 or an error naming it. */
int ckpt_storage_write_file(ckpt_storage *st, const char *name, const void *data, size_t len);
/* As ckpt_storage_write_file, streaming len bytes of the file open at fd
 * (named path in messages), read with pread from offset 0. */
int ckpt_storage_put_fd(ckpt_storage *st, const char *name, int fd, const char *path, uint64_t len);
/* Reads file name into *out (malloc'd), at most limit bytes. Returns 0,
 * -ENOENT, -EFBIG, or an error naming it (short or damaged:
 * STASH_ECORRUPT). */
int ckpt_storage_read_file(ckpt_storage *st, const char *name, size_t limit, uint8_t **out,
                           size_t *len);
/* Streams file name into the file open at fd (written with pwrite from
 * offset 0, named path in messages); *len: its length. */
int ckpt_storage_get_fd(ckpt_storage *st, const char *name, int fd, const char *path,
                        uint64_t *len);

/* A file read into memory in the background, depth parts at once in
 * order, while the caller takes its bytes as they arrive from the front:
 * *data (the caller's to free once the reader is closed) holds its *len
 * bytes, at most limit (-EFBIG beyond), once the reader says so. */
typedef struct ckpt_storage_reader ckpt_storage_reader;
int ckpt_storage_reader_open(ckpt_storage *st, const char *name, size_t limit, uint32_t depth,
                             ckpt_storage_reader **out, uint8_t **data, size_t *len);
/* Waits until the file's first upto bytes are in memory: 0, or the read's
 * failure, named (-ECANCELED once the reader is stopped). Any thread. */
int ckpt_storage_reader_wait(ckpt_storage_reader *rd, uint64_t upto);
/* Stops the reader: parts not yet asked for are not read, and a waiter
 * for them hears -ECANCELED once the parts in flight have landed. */
void ckpt_storage_reader_stop(ckpt_storage_reader *rd);
/* Stops the reader, waits for its parts in flight and frees it (no thread
 * may wait on it then). Accepts NULL. */
void ckpt_storage_reader_close(ckpt_storage_reader *rd);

/* A file written as its bytes come, of a length known only at its end:
 * each part goes up once full while the writer goes on (at most depth
 * parts wait or fly; put waits for one to land beyond that). */
typedef struct ckpt_storage_writer ckpt_storage_writer;
int ckpt_storage_writer_open(ckpt_storage *st, const char *name, ckpt_storage_writer **out);
/* Appends len bytes. Returns 0 or the writer's first failure. */
int ckpt_storage_writer_put(ckpt_storage_writer *w, const void *data, size_t len);
/* With commit, writes what is left and makes the file whole; else (or
 * after a failure) gives it up. Frees w; returns its first failure.
 * Accepts NULL. */
int ckpt_storage_writer_close(ckpt_storage_writer *w, bool commit);

/* The other operations, each through st's table, as the table says; an
 * optional one st lacks fails with -ENOTSUP naming the storage. */
int ckpt_storage_file_size(ckpt_storage *st, const char *name, uint64_t *len);
int ckpt_storage_remove_file(ckpt_storage *st, const char *name);
int ckpt_storage_list_files(ckpt_storage *st, const char *prefix, ckpt_storage_name_fn *fn,
                            void *ctx);
int ckpt_storage_remove_prefix(ckpt_storage *st, const char *prefix);
int ckpt_storage_swap(ckpt_storage *st, const char *name, const char *expect, const char *value);
int ckpt_storage_pointer(ckpt_storage *st, const char *name, char *buf, size_t cap);
int ckpt_storage_remove(ckpt_storage *st, const char *name);

/* Sets the pointer object name to value whatever it holds (its writer
 * holds a lease on it). */
int ckpt_storage_set(ckpt_storage *st, const char *name, const char *value);
/* Sets (value NULL: removes) the attributes set of object name if each of
 * expect holds the value given now (NULL: is absent), in one atomic
 * operation on the object: of two writers that read the same values, only
 * one changes them. Returns 0, -ECANCELED if one does not hold (or the
 * object is absent), or an error naming the object. */
int ckpt_storage_update(ckpt_storage *st, const char *name, const ckpt_storage_attr *expect,
                        size_t nexpect, const ckpt_storage_attr *set, size_t nset);
/* Removes object name if its attribute expect holds the value given, in
 * one operation. Returns 0, -ECANCELED, or an error naming the object. */
int ckpt_storage_remove_if(ckpt_storage *st, const char *name, const ckpt_storage_attr *expect);
/* Makes object name (empty) if it is absent. */
int ckpt_storage_touch(ckpt_storage *st, const char *name);
/* Calls fn(ctx, attribute, value) for each attribute of object name, all
 * read at once (values cut at CKPT_STORAGE_ATTR_MAX bytes); a non-zero
 * return stops and is returned. -ENOENT if the object is absent. */
int ckpt_storage_attrs(ckpt_storage *st, const char *name, ckpt_storage_attr_fn *fn, void *ctx);
/* Calls fn(ctx, name) for each object (not file) whose name starts with
 * prefix, in no order; a non-zero return stops and is returned. */
int ckpt_storage_objects(ckpt_storage *st, const char *prefix, ckpt_storage_name_fn *fn, void *ctx);
/* Takes, or renews, the lease on object name for lease_ms (whole
 * milliseconds): held by this connection under cookie until it lapses
 * unless renewed in time. Returns 0, -EBUSY while another connection or
 * cookie holds it, or an error naming the object. */
int ckpt_storage_lock(ckpt_storage *st, const char *name, const char *cookie, uint32_t lease_ms);
/* Whether anyone holds the lease on object name now (1) or not (0): read
 * only, as the storage's clock judges it. */
int ckpt_storage_lease_held(ckpt_storage *st, const char *name);
/* Gives a lease up. Giving up one not held is no error. */
int ckpt_storage_unlock(ckpt_storage *st, const char *name, const char *cookie);
/* Watches object name (made if absent): fn(ctx, msg) is called from the
 * storage's thread with each notification sent to it (a short string),
 * acknowledged once fn returns. */
int ckpt_storage_watch_start(ckpt_storage *st, const char *name, ckpt_storage_notify_fn *fn,
                             void *ctx, ckpt_storage_watch **out);
/* Takes a watch the storage dropped (its server gone a while) again. */
int ckpt_storage_watch_check(ckpt_storage_watch *w);
/* Ends a watch: no call of its fn runs once this returns. Accepts NULL. */
void ckpt_storage_watch_stop(ckpt_storage_watch *w);
/* Sends msg to every watcher of object name without waiting for their
 * acknowledgements (awaited in the background up to timeout_ms: a watcher
 * that is gone does not delay the sender). Returns 0 or an error naming
 * the object if it could not be sent. */
int ckpt_storage_notify(ckpt_storage *st, const char *name, const char *msg, uint32_t timeout_ms);

#endif /* STASH_CKPT_STORAGE_H */
