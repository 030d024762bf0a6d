/* SPDX-License-Identifier: MIT */
/*
 * lmdb_env.c: one LMDB handle per environment file and process, shared by
 * every lmdb store of the process and counted; transactions counted so
 * that a remap of the map (LMDB's mdb_env_set_mapsize, which unmaps the
 * pages open transactions point into) runs only when none is open.
 *
 * A forked child must not use its parent's handles (LMDB forbids it), nor
 * close them (closing clears the parent's reader slots): it forgets them
 * and opens its own.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backends/lmdb/lmdb_env.h"
#include "shm/shm.h"

#define MAP_INITIAL (64ull << 20) /* bytes of map an environment starts with */
/* Dirty pages stay in the process until the commit writes them: a full disk
 * fails the commit rather than a write into the map. */
#define ENV_FLAGS (MDB_NOSUBDIR | MDB_NOSYNC | MDB_NOMETASYNC | MDB_NOTLS | MDB_NORDAHEAD)

static pthread_mutex_t envs_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t envs_once = PTHREAD_ONCE_INIT;
static lmdb_env *envs;
/* A parent's handles, kept (and reachable) in a forked child but never used. */
static lmdb_env *inherited;

static void forget_parents_envs(void)
{
    while (envs) {
        lmdb_env *x = envs;
        envs = x->next;
        x->next = inherited;
        inherited = x;
    }
    pthread_mutex_init(&envs_mu, NULL);
}

static void watch_forks(void)
{
    pthread_atfork(NULL, NULL, forget_parents_envs);
}

/* Reads the table's handle and the tree's facts in a read transaction: the
 * owner of the key group may hold the writer's lock for as long as it likes. */
static int env_init(lmdb_env *x)
{
    MDB_txn *t;
    int rc = mdb_txn_begin(x->env, NULL, MDB_RDONLY, &t);
    if (rc) return rc;
    rc = mdb_dbi_open(t, NULL, 0, &x->dbi);
    if (rc) {
        mdb_txn_abort(t);
        return rc;
    }
    MDB_stat s;
    mdb_env_stat(x->env, &s);
    x->psize = s.ms_psize;
    x->max_key = mdb_env_get_maxkeysize(x->env);
    return mdb_txn_commit(t);
}

static int env_open(const char *path, uint32_t kg, lmdb_env **out)
{
    lmdb_env *x = calloc(1, sizeof *x);
    char *p = strdup(path);
    if (!x || !p) {
        free(x);
        free(p);
        return shm_fail(-ENOMEM, "out of memory");
    }
    x->path = p;
    int rc = mdb_env_create(&x->env);
    if (rc) {
        free(p);
        free(x);
        return shm_fail(-ENOMEM, "%s: %s", path, mdb_strerror(rc));
    }
    if ((rc = mdb_env_set_mapsize(x->env, MAP_INITIAL)) == 0)
        rc = mdb_env_open(x->env, path, ENV_FLAGS, 0600);
    if (rc == 0) {
        /* Readers a dead process left hold pages back: clear them. */
        int dead;
        mdb_reader_check(x->env, &dead);
        rc = env_init(x);
    }
    if (rc) {
        mdb_env_close(x->env);
        free(p);
        free(x);
        return shm_fail(rc > 0 ? -rc : -EIO, "key group %u: cannot open %s: %s", kg, path,
                        mdb_strerror(rc));
    }
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    *out = x;
    return 0;
}

int lmdb_env_get(const char *path, uint32_t kg, lmdb_env **out)
{
    pthread_once(&envs_once, watch_forks);
    pthread_mutex_lock(&envs_mu);
    lmdb_env *x = envs;
    while (x && strcmp(x->path, path) != 0) x = x->next;
    int rc = 0;
    if (!x && (rc = env_open(path, kg, &x)) == 0) {
        x->next = envs;
        envs = x;
    }
    if (rc == 0) {
        x->refs++;
        *out = x;
    }
    pthread_mutex_unlock(&envs_mu);
    return rc;
}

void lmdb_env_put(lmdb_env *x)
{
    if (!x) return;
    pthread_mutex_lock(&envs_mu);
    bool last = --x->refs == 0;
    if (last) {
        lmdb_env **p = &envs;
        while (*p != x) p = &(*p)->next;
        *p = x->next;
    }
    pthread_mutex_unlock(&envs_mu);
    if (!last) return;
    mdb_env_close(x->env);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    free(x->path);
    free(x);
}

/* Counts a transaction about to open, after any remap under way. */
static void enter(lmdb_env *x)
{
    pthread_mutex_lock(&x->mu);
    while (x->remapping) pthread_cond_wait(&x->cv, &x->mu);
    x->open_txns++;
    pthread_mutex_unlock(&x->mu);
}

static void leave(lmdb_env *x)
{
    pthread_mutex_lock(&x->mu);
    if (--x->open_txns == 0) pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

int lmdb_env_resize(lmdb_env *x, size_t size)
{
    pthread_mutex_lock(&x->mu);
    while (x->remapping) pthread_cond_wait(&x->cv, &x->mu);
    x->remapping = true;
    while (x->open_txns) pthread_cond_wait(&x->cv, &x->mu);
    int rc = mdb_env_set_mapsize(x->env, size);
    x->remapping = false;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    return rc;
}

int lmdb_env_begin(lmdb_env *x, unsigned flags, MDB_txn **txn)
{
    enter(x);
    int rc = mdb_txn_begin(x->env, NULL, flags, txn);
    if (rc == MDB_MAP_RESIZED) {
        /* Another process grew the map: take its size. */
        leave(x);
        rc = lmdb_env_resize(x, 0);
        if (rc) {
            *txn = NULL;
            return rc;
        }
        enter(x);
        rc = mdb_txn_begin(x->env, NULL, flags, txn);
    }
    if (rc) {
        *txn = NULL;
        leave(x);
    }
    return rc;
}

int lmdb_env_renew(lmdb_env *x, MDB_txn **txn)
{
    if (!*txn) return lmdb_env_begin(x, MDB_RDONLY, txn);
    enter(x);
    int rc = mdb_txn_renew(*txn);
    if (rc == 0) return 0;
    leave(x);
    mdb_txn_abort(*txn);
    *txn = NULL;
    return rc == MDB_MAP_RESIZED ? lmdb_env_begin(x, MDB_RDONLY, txn) : rc;
}

void lmdb_env_reset(lmdb_env *x, MDB_txn *txn)
{
    mdb_txn_reset(txn);
    leave(x);
}

int lmdb_env_commit(lmdb_env *x, MDB_txn *txn)
{
    int rc = mdb_txn_commit(txn);
    leave(x);
    return rc;
}

void lmdb_env_abort(lmdb_env *x, MDB_txn *txn)
{
    mdb_txn_abort(txn);
    leave(x);
}

void lmdb_env_free_reset(MDB_txn *txn)
{
    mdb_txn_abort(txn);
}
