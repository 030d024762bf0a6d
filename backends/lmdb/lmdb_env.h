/* SPDX-License-Identifier: MIT */
/*
 * lmdb_env.h: the process's LMDB environments. LMDB allows one handle per
 * environment file and process: two handles in one process lose each
 * other's locks when either closes. So every lmdb store of a process (its
 * workers', its engine's, a restore's) shares one reference-counted handle
 * per file, and a change of the map's size, which moves the pages every
 * open transaction of the process points into, waits until none is open.
 */
#ifndef STASH_BACKENDS_LMDB_ENV_H
#define STASH_BACKENDS_LMDB_ENV_H

#include <lmdb.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct lmdb_env {
    MDB_env *env;
    MDB_dbi dbi;    /* the environment's one table */
    uint32_t psize; /* its page size */
    int max_key;    /* the longest key it stores */
    /* Private to lmdb_env.c. */
    char *path;
    unsigned refs;
    unsigned open_txns; /* transactions of this process open on it */
    bool remapping;     /* a change of the map's size waits for them to end */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct lmdb_env *next;
} lmdb_env;

/* The process's handle on the environment at path (key group kg, for
 * messages), opened with its table on first use; each call takes a
 * reference that lmdb_env_put() gives back. Returns 0 or an error. */
int lmdb_env_get(const char *path, uint32_t kg, lmdb_env **out);
/* Gives a reference back; the last one closes the environment, whose
 * transactions of this process must all have ended. Accepts NULL. */
void lmdb_env_put(lmdb_env *x);

/* Transactions of this process on x are counted from their begin (or
 * renew) to their commit, abort or reset, so that a remap can wait for
 * them. Each returns 0 or LMDB's error code. */

/* Begins a transaction (flags: 0 or MDB_RDONLY), taking a size of the map
 * another process set first if need be. */
int lmdb_env_begin(lmdb_env *x, unsigned flags, MDB_txn **txn);
/* Renews the reset read transaction *txn, or begins one if *txn is NULL. */
int lmdb_env_renew(lmdb_env *x, MDB_txn **txn);
/* Resets a read transaction for a later renew. */
void lmdb_env_reset(lmdb_env *x, MDB_txn *txn);
int lmdb_env_commit(lmdb_env *x, MDB_txn *txn);
void lmdb_env_abort(lmdb_env *x, MDB_txn *txn);
/* Frees a read transaction left reset (not counted as open). */
void lmdb_env_free_reset(MDB_txn *txn);

/* Sets the map's size (0: the size another process set), once no
 * transaction of this process is open on x. The caller must hold none. */
int lmdb_env_resize(lmdb_env *x, size_t size);

#endif /* STASH_BACKENDS_LMDB_ENV_H */
