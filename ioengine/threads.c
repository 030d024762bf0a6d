/* SPDX-License-Identifier: MIT */
/*
 * threads.c: the fallback backend for machines where io_uring is refused: a
 * small pool of threads that perform each attempt with pwrite, pread, fsync
 * or fdatasync, and hand the raw result back. Resuming short transfers,
 * retries, ordering and faults stay in the engine, so both backends behave
 * alike; this file only moves attempts to threads and results back.
 *
 * Attempts queued by the engine's thread collect in a batch that submit()
 * hands to the workers under one lock acquisition.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "ioengine/ioengine.h"

typedef struct req_list {
    ioe_req *first, *last;
} req_list;

struct ioe_backend {
    ioe_engine *e;
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* todo gained attempts, or stop */
    pthread_cond_t done_cv; /* done gained a result */
    req_list todo;          /* waiting for a worker; under mu */
    req_list done;          /* performed, result in res; under mu */
    req_list batch;         /* queued, not yet submitted; the engine's thread only */
    bool stop;
    unsigned nthreads;
    pthread_t tid[];
};

static void list_push(req_list *l, ioe_req *r)
{
    r->next = NULL;
    if (l->last)
        l->last->next = r;
    else
        l->first = r;
    l->last = r;
}

static void list_append(req_list *to, req_list *from)
{
    if (!from->first) return;
    if (to->last)
        to->last->next = from->first;
    else
        to->first = from->first;
    to->last = from->last;
    *from = (req_list){0};
}

static int perform(const ioe_req *r)
{
    ssize_t n;
    if (r->nop) return 0;
    switch (r->op) {
    case IOE_WRITE:
        n = pwrite(r->fd, r->buf, r->len, (off_t)r->off);
        break;
    case IOE_READ:
        n = pread(r->fd, r->buf, r->len, (off_t)r->off);
        break;
    case IOE_FSYNC:
        n = fsync(r->fd);
        break;
    default:
        n = fdatasync(r->fd);
        break;
    }
    return n < 0 ? -errno : (int)n;
}

static void *worker(void *arg)
{
    ioe_backend *b = arg;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->todo.first && !b->stop) pthread_cond_wait(&b->work_cv, &b->mu);
        ioe_req *r = b->todo.first;
        if (!r) break; /* stopping, and nothing left to perform */
        b->todo.first = r->next;
        if (!b->todo.first) b->todo.last = NULL;
        pthread_mutex_unlock(&b->mu);
        r->res = perform(r);
        pthread_mutex_lock(&b->mu);
        list_push(&b->done, r);
        pthread_cond_signal(&b->done_cv);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

static void stop_workers(ioe_backend *b, unsigned started)
{
    pthread_mutex_lock(&b->mu);
    b->stop = true;
    pthread_cond_broadcast(&b->work_cv);
    pthread_mutex_unlock(&b->mu);
    for (unsigned i = 0; i < started; i++) pthread_join(b->tid[i], NULL);
}

static void destroy_sync(ioe_backend *b)
{
    pthread_cond_destroy(&b->done_cv);
    pthread_cond_destroy(&b->work_cv);
    pthread_mutex_destroy(&b->mu);
}

static int init_sync(ioe_backend *b)
{
    pthread_condattr_t ca;
    int rc = pthread_condattr_init(&ca);
    if (rc) return -rc;
    /* Timed waits count on the monotonic clock, as the engine's due times do. */
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    rc = pthread_mutex_init(&b->mu, NULL);
    if (!rc && (rc = pthread_cond_init(&b->work_cv, NULL)) != 0) pthread_mutex_destroy(&b->mu);
    if (!rc && (rc = pthread_cond_init(&b->done_cv, &ca)) != 0) {
        pthread_cond_destroy(&b->work_cv);
        pthread_mutex_destroy(&b->mu);
    }
    pthread_condattr_destroy(&ca);
    return -rc;
}

static int threads_open(const ioe_backend_cfg *cfg, ioe_backend **out)
{
    ioe_backend *b = calloc(1, sizeof *b + cfg->threads * sizeof(pthread_t));
    if (!b) return -ENOMEM;
    b->e = cfg->engine;
    b->nthreads = cfg->threads;
    int rc = init_sync(b);
    if (rc < 0) {
        free(b);
        return rc;
    }
    /* Workers block every signal: signals belong to the application's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    unsigned started = 0;
    for (; started < b->nthreads; started++)
        if ((rc = pthread_create(&b->tid[started], NULL, worker, b)) != 0) break;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (started < b->nthreads) {
        stop_workers(b, started);
        destroy_sync(b);
        free(b);
        return -rc;
    }
    *out = b;
    return 0;
}

static void threads_close(ioe_backend *b)
{
    stop_workers(b, b->nthreads);
    destroy_sync(b);
    free(b);
}

static int threads_file_register(ioe_backend *b, int fd)
{
    (void)b, (void)fd;
    return -1;
}

static void threads_file_unregister(ioe_backend *b, int fixed)
{
    (void)b, (void)fixed;
}

static void threads_queue(ioe_backend *b, ioe_req *r)
{
    list_push(&b->batch, r);
}

static int threads_submit(ioe_backend *b)
{
    if (!b->batch.first) return 0;
    bool several = b->batch.first != b->batch.last;
    pthread_mutex_lock(&b->mu);
    list_append(&b->todo, &b->batch);
    if (several)
        pthread_cond_broadcast(&b->work_cv);
    else
        pthread_cond_signal(&b->work_cv);
    pthread_mutex_unlock(&b->mu);
    return 0;
}

static struct timespec deadline_after(int64_t ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t nsec = ts.tv_nsec + ns % 1000000000;
    ts.tv_sec += ns / 1000000000 + nsec / 1000000000;
    ts.tv_nsec = nsec % 1000000000;
    return ts;
}

static int threads_wait(ioe_backend *b, int64_t timeout_ns)
{
    threads_submit(b);
    struct timespec deadline = deadline_after(timeout_ns > 0 ? timeout_ns : 0);
    pthread_mutex_lock(&b->mu);
    while (!b->done.first && timeout_ns != 0) {
        if (timeout_ns < 0)
            pthread_cond_wait(&b->done_cv, &b->mu);
        else if (pthread_cond_timedwait(&b->done_cv, &b->mu, &deadline) == ETIMEDOUT)
            break;
    }
    req_list done = b->done;
    b->done = (req_list){0};
    pthread_mutex_unlock(&b->mu);
    int n = 0;
    for (ioe_req *r = done.first, *next; r; r = next, n++) {
        next = r->next; /* completing may queue the attempt again, which relinks it */
        ioe_core_complete(b->e, r, r->res);
    }
    return n;
}

static void threads_info(const ioe_backend *b, ioe_info *out)
{
    (void)b;
    out->registered_buffers = false;
    out->fixed_files = false;
    out->sqpoll = false;
}

const ioe_backend_ops ioe_threads_ops = {
    .open = threads_open,
    .close = threads_close,
    .file_register = threads_file_register,
    .file_unregister = threads_file_unregister,
    .queue = threads_queue,
    .submit = threads_submit,
    .wait = threads_wait,
    .info = threads_info,
};
