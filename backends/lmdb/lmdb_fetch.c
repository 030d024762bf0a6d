/* SPDX-License-Identifier: MIT */
/*
 * lmdb_fetch.c: the reader threads of lmdb_fetch.h. Each thread takes one
 * queued key at a time and looks it up in a read transaction of its own on
 * the key's environment (reset between look-ups, kept per environment),
 * touching every page of the value: a page not in memory is read from disk
 * on this thread, while the others and the worker go on. What a look-up
 * finds is thrown away; it changes nothing but what is in memory.
 */
#define _GNU_SOURCE /* RUSAGE_THREAD */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "backends/lmdb/lmdb_fetch.h"
#include "shm/shm.h"

#define FETCH_THREADS 16u
#define FETCH_QUEUE 1024u
#define FETCH_KEY_MAX 512u /* LMDB's longest key is 511 bytes */

typedef struct fetch_job {
    lmdb_env *x;
    uint32_t kg;
    uint16_t len;
    uint8_t key[FETCH_KEY_MAX];
} fetch_job;

struct lmdb_fetcher {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    _Atomic uint64_t faults; /* major faults of the threads' look-ups, since last taken */
    uint32_t head, tail;     /* jobs[head % FETCH_QUEUE .. tail) wait for a thread */
    uint32_t maxp;
    unsigned nthreads;
    pthread_t threads[FETCH_THREADS];
    fetch_job jobs[FETCH_QUEUE];
};

/* Looks j's key up in the thread's read transaction on its environment
 * (txns: one per key group, reset between look-ups). */
static void look_up(MDB_txn **txns, const fetch_job *j)
{
    MDB_txn **txn = &txns[j->kg];
    if (lmdb_env_renew(j->x, txn) != 0) return;
    MDB_val k = {j->len, (void *)j->key}, v;
    if (mdb_get(*txn, j->x->dbi, &k, &v) == 0) {
        /* A value on overflow pages: each page read here, not by the worker. */
        volatile const uint8_t *p = v.mv_data;
        for (size_t off = 0; off < v.mv_size; off += j->x->psize) (void)p[off];
    }
    lmdb_env_reset(j->x, *txn);
}

static void *reader(void *arg)
{
    lmdb_fetcher *f = arg;
    MDB_txn **txns = calloc(f->maxp, sizeof *txns);
    fetch_job *job = malloc(sizeof *job);
    uint64_t faults = 0; /* this thread's major faults so far */
    pthread_mutex_lock(&f->mu);
    while (!f->stop) {
        if (f->head == f->tail) {
            pthread_cond_wait(&f->cv, &f->mu);
            continue;
        }
        const fetch_job *q = &f->jobs[f->head++ % FETCH_QUEUE];
        bool usable = job && txns;
        if (usable) memcpy(job, q, offsetof(fetch_job, key) + q->len);
        pthread_mutex_unlock(&f->mu);
        if (usable) {
            look_up(txns, job);
            struct rusage ru;
            if (getrusage(RUSAGE_THREAD, &ru) == 0 && (uint64_t)ru.ru_majflt > faults) {
                atomic_fetch_add_explicit(&f->faults, (uint64_t)ru.ru_majflt - faults,
                                          memory_order_relaxed);
                faults = (uint64_t)ru.ru_majflt;
            }
        }
        pthread_mutex_lock(&f->mu);
    }
    pthread_mutex_unlock(&f->mu);
    for (uint32_t kg = 0; txns && kg < f->maxp; kg++)
        if (txns[kg]) lmdb_env_free_reset(txns[kg]);
    free(txns);
    free(job);
    return NULL;
}

int lmdb_fetch_start(uint32_t maxp, lmdb_fetcher **out)
{
    lmdb_fetcher *f = calloc(1, sizeof *f);
    if (!f) return shm_fail(-ENOMEM, "out of memory");
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    f->maxp = maxp;
    for (unsigned i = 0; i < FETCH_THREADS; i++) {
        int rc = pthread_create(&f->threads[i], NULL, reader, f);
        if (rc) {
            lmdb_fetch_stop(f);
            return shm_fail(-rc, "cannot start an lmdb reader thread");
        }
        f->nthreads++;
    }
    *out = f;
    return 0;
}

void lmdb_fetch_queue(lmdb_fetcher *f, lmdb_env *x, uint32_t kg, const void *key, size_t len)
{
    if (len > FETCH_KEY_MAX || kg >= f->maxp) return;
    pthread_mutex_lock(&f->mu);
    if (f->tail - f->head < FETCH_QUEUE) {
        fetch_job *j = &f->jobs[f->tail++ % FETCH_QUEUE];
        j->x = x;
        j->kg = kg;
        j->len = (uint16_t)len;
        memcpy(j->key, key, len);
    }
    pthread_mutex_unlock(&f->mu);
}

void lmdb_fetch_go(lmdb_fetcher *f)
{
    pthread_mutex_lock(&f->mu);
    uint32_t waiting = f->tail - f->head;
    pthread_mutex_unlock(&f->mu);
    /* As many threads as there are keys: a thread woken for nothing still
     * takes a core from the worker. */
    if (waiting >= f->nthreads)
        pthread_cond_broadcast(&f->cv);
    else
        while (waiting--) pthread_cond_signal(&f->cv);
}

uint64_t lmdb_fetch_faults(lmdb_fetcher *f)
{
    return atomic_exchange_explicit(&f->faults, 0, memory_order_relaxed);
}

void lmdb_fetch_stop(lmdb_fetcher *f)
{
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    f->stop = true;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    for (unsigned i = 0; i < f->nthreads; i++) pthread_join(f->threads[i], NULL);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

void lmdb_fetch_forget(lmdb_fetcher *f)
{
    free(f);
}
