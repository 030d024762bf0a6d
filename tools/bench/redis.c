/* SPDX-License-Identifier: MIT */
/*
 * redis.c: the keyed and checkpoint benches' Redis peer: a private
 * redis-server on a Unix socket, reached through hiredis, and what its
 * BGSAVE copies on write under load.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef STASH_HAVE_HIREDIS
#include <hiredis.h>
#endif

#include "tools/bench/peers.h"

/* ------------------------------------------------------------------------ */
/* Redis: a private redis-server (no RDB, no AOF) on a Unix socket of its    */
/* own (no TCP: the fastest road to it on one machine), reached through     */
/* hiredis. Values are strings, lists are lists (RPUSH,      */
/* LRANGE), maps are hashes (HSET, HGET). Pipelined, commands are queued     */
/* and their replies read at sync(); otherwise each waits for its reply.     */

#ifdef STASH_HAVE_HIREDIS

struct peer_redis_server {
    pid_t pid;
    char sock[108]; /* sun_path's size */
};

typedef enum redis_expect { EXPECT_DONE, EXPECT_STRING, EXPECT_LIST } redis_expect;

typedef struct redis_sys {
    kv_sys base;
    redisContext *c;
    redis_expect *pending; /* what each queued command's reply should be */
    unsigned npending;
    uint64_t baseline; /* used_memory of the empty server */
    uint8_t scratch[1 << 16];
} redis_sys;

static int redis_fail(redis_sys *r, const char *what)
{
    snprintf(r->base.error, sizeof r->base.error, "%s: %s", what,
             r->c->err ? r->c->errstr : "unexpected reply");
    return -EIO;
}

/* Checks one reply against what its command should return, copying a string
 * or the elements of a list into out. */
static int redis_take(redis_sys *r, redisReply *rep, redis_expect e, void *out, size_t cap,
                      size_t *len)
{
    int rc = 0;
    if (!rep) return redis_fail(r, "redisGetReply");
    if (rep->type == REDIS_REPLY_ERROR) {
        snprintf(r->base.error, sizeof r->base.error, "redis: %s", rep->str);
        rc = -EIO;
    } else if (e == EXPECT_STRING) {
        rc = rep->type == REDIS_REPLY_NIL      ? -ENOENT
             : rep->type == REDIS_REPLY_STRING ? copy_out(rep->str, rep->len, out, cap, len)
                                               : redis_fail(r, "GET");
    } else if (e == EXPECT_LIST) {
        if (rep->type != REDIS_REPLY_ARRAY) rc = redis_fail(r, "LRANGE");
        if (rc == 0 && rep->elements == 0) rc = -ENOENT;
        size_t off = 0;
        for (size_t i = 0; rc == 0 && i < rep->elements; i++) {
            size_t n = 0;
            rc = copy_out(rep->element[i]->str, rep->element[i]->len, (uint8_t *)out + off,
                          cap - off, &n);
            off += n;
        }
        *len = off;
    }
    freeReplyObject(rep);
    return rc;
}

/* Queues a command (argv form: binary-safe). Without pipelining it also
 * waits for the reply and copies it to out. */
static int redis_issue(redis_sys *r, redis_expect e, int argc, const char **argv,
                       const size_t *lens, void *out, size_t cap, size_t *len)
{
    if (redisAppendCommandArgv(r->c, argc, argv, lens) != REDIS_OK) return redis_fail(r, argv[0]);
    if (r->base.batch > 1) {
        r->pending[r->npending++] = e;
        if (len) *len = 0;
        return 0;
    }
    void *rep = NULL;
    if (redisGetReply(r->c, &rep) != REDIS_OK) return redis_fail(r, argv[0]);
    return redis_take(r, rep, e, out, cap, len);
}

static int redis_value_get(kv_sys *s, uint64_t key, void *out, size_t cap, size_t *len)
{
    uint8_t k[8];
    encode_key(key, k);
    const char *argv[] = {"GET", (char *)k};
    const size_t lens[] = {3, 8};
    return redis_issue((redis_sys *)s, EXPECT_STRING, 2, argv, lens, out, cap, len);
}

static int redis_value_put(kv_sys *s, uint64_t key, const void *v, size_t len)
{
    uint8_t k[8];
    encode_key(key, k);
    const char *argv[] = {"SET", (char *)k, v};
    const size_t lens[] = {3, 8, len};
    return redis_issue((redis_sys *)s, EXPECT_DONE, 3, argv, lens, NULL, 0, NULL);
}

static int redis_list_add(kv_sys *s, uint64_t key, const void *v, size_t len)
{
    uint8_t k[8];
    encode_key(key, k);
    const char *argv[] = {"RPUSH", (char *)k, v};
    const size_t lens[] = {5, 8, len};
    return redis_issue((redis_sys *)s, EXPECT_DONE, 3, argv, lens, NULL, 0, NULL);
}

static int redis_list_get(kv_sys *s, uint64_t key, void *out, size_t cap, size_t *len)
{
    uint8_t k[8];
    encode_key(key, k);
    const char *argv[] = {"LRANGE", (char *)k, "0", "-1"};
    const size_t lens[] = {6, 8, 1, 2};
    return redis_issue((redis_sys *)s, EXPECT_LIST, 4, argv, lens, out, cap, len);
}

static int redis_map_put(kv_sys *s, uint64_t key, uint64_t ukey, const void *v, size_t len)
{
    uint8_t k[8], u[8];
    encode_key(key, k);
    encode_key(ukey, u);
    const char *argv[] = {"HSET", (char *)k, (char *)u, v};
    const size_t lens[] = {4, 8, 8, len};
    return redis_issue((redis_sys *)s, EXPECT_DONE, 4, argv, lens, NULL, 0, NULL);
}

static int redis_map_get(kv_sys *s, uint64_t key, uint64_t ukey, void *out, size_t cap, size_t *len)
{
    uint8_t k[8], u[8];
    encode_key(key, k);
    encode_key(ukey, u);
    const char *argv[] = {"HGET", (char *)k, (char *)u};
    const size_t lens[] = {4, 8, 8};
    return redis_issue((redis_sys *)s, EXPECT_STRING, 3, argv, lens, out, cap, len);
}

/* Reads the replies of every queued command; the first failure wins. */
static int redis_sync(kv_sys *s)
{
    redis_sys *r = (redis_sys *)s;
    int rc = 0;
    for (unsigned i = 0; i < r->npending; i++) {
        void *rep = NULL;
        if (redisGetReply(r->c, &rep) != REDIS_OK) {
            r->npending = 0;
            return redis_fail(r, "redisGetReply");
        }
        size_t len = 0;
        int one = redis_take(r, rep, r->pending[i], r->scratch, sizeof r->scratch, &len);
        if (one == 0 && r->pending[i] != EXPECT_DONE) s->sum += bench_checksum(r->scratch, len);
        if (rc == 0) rc = one;
    }
    r->npending = 0;
    return rc;
}

static int redis_used_memory(redis_sys *r, uint64_t *bytes)
{
    redisReply *rep = redisCommand(r->c, "INFO memory");
    if (!rep) return redis_fail(r, "INFO");
    const char *p = rep->type == REDIS_REPLY_STRING ? strstr(rep->str, "used_memory:") : NULL;
    if (p) *bytes = strtoull(p + strlen("used_memory:"), NULL, 10);
    freeReplyObject(rep);
    return p ? 0 : redis_fail(r, "INFO memory");
}

/* The server's memory beyond what it used empty. */
static int redis_footprint(kv_sys *s, uint64_t *bytes)
{
    redis_sys *r = (redis_sys *)s;
    int rc = redis_used_memory(r, bytes);
    if (rc == 0) *bytes -= *bytes > r->baseline ? r->baseline : *bytes;
    return rc;
}

static void redis_close(kv_sys *s)
{
    redis_sys *r = (redis_sys *)s;
    redisFree(r->c);
    free(r->pending);
    free(r);
}

static const kv_ops redis_ops = {
    .value_get = redis_value_get,
    .value_put = redis_value_put,
    .list_add = redis_list_add,
    .list_get = redis_list_get,
    .map_put = redis_map_put,
    .map_get = redis_map_get,
    .sync = redis_sync,
    .footprint = redis_footprint,
    .close = redis_close,
};

static bool in_path(const char *prog)
{
    const char *path = getenv("PATH");
    char buf[PATH_MAX];
    for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
        size_t n = strcspn(p, ":");
        snprintf(buf, sizeof buf, "%.*s/%s", (int)n, p, prog);
        if (access(buf, X_OK) == 0) return true;
        p += n + (p[n] == ':');
    }
    return false;
}

/* Starts redis-server on the socket sock and waits until it answers PING
 * (5 s at most). Returns its pid, or -1 with why set (and the server reaped). */
static pid_t spawn_redis(const char *dir, const char *sock, char *why, size_t whylen)
{
    char log[PATH_MAX];
    snprintf(log, sizeof log, "%s/redis.log", dir);
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) return WHY("fork: %s", strerror(errno));
    if (pid == 0) {
        /* A bench that dies leaves no server behind. */
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent) _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) dup2(fd, STDOUT_FILENO), dup2(fd, STDERR_FILENO);
        execlp("redis-server", "redis-server", "--port", "0", "--unixsocket", sock,
               "--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir", dir,
               "--daemonize", "no", "--logfile", "", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 500; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            /* Its last log line says why; redis marks warnings with '#'. */
            char last[256] = "";
            FILE *f = fopen(log, "r");
            for (char line[256]; f && fgets(line, sizeof line, f);)
                if (line[0] != '\n') snprintf(last, sizeof last, "%s", line);
            if (f) fclose(f);
            last[strcspn(last, "\n")] = 0;
            const char *mark = strstr(last, "# ");
            return WHY("redis-server exited: %s", mark ? mark + 2 : last);
        }
        redisContext *c = redisConnectUnix(sock);
        redisReply *rep = c && !c->err ? redisCommand(c, "PING") : NULL;
        bool up = rep && rep->type == REDIS_REPLY_STATUS;
        if (rep) freeReplyObject(rep);
        redisFree(c);
        if (up) return pid;
        nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return WHY("redis-server did not answer at %s within 5 s", sock);
}

int peer_redis_start(const char *dir, peer_redis_server **out, char *why, size_t whylen)
{
    if (!in_path("redis-server")) return WHY("redis-server not installed");
    peer_redis_server *srv = calloc(1, sizeof *srv);
    if (!srv) return WHY("out of memory");
    if ((size_t)snprintf(srv->sock, sizeof srv->sock, "%s/redis.sock", dir) >= sizeof srv->sock) {
        free(srv);
        return WHY("%s: too long a path for a Unix socket", dir);
    }
    srv->pid = spawn_redis(dir, srv->sock, why, whylen);
    if (srv->pid < 0) {
        free(srv);
        return -1;
    }
    *out = srv;
    return 0;
}

void peer_redis_stop(peer_redis_server *srv)
{
    if (!srv) return;
    kill(srv->pid, SIGTERM);
    bool reaped = false;
    for (int i = 0; i < 500 && !reaped; i++) {
        reaped = waitpid(srv->pid, NULL, WNOHANG) == srv->pid;
        if (!reaped) nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
    }
    if (!reaped) {
        kill(srv->pid, SIGKILL);
        waitpid(srv->pid, NULL, 0);
    }
    free(srv);
}

/* Connects to srv: emptied first with flush. */
static int redis_connect(peer_redis_server *srv, unsigned depth, bool flush, kv_sys **out,
                         char *why, size_t whylen)
{
    redis_sys *r = calloc(1, sizeof *r);
    if (r) r->pending = calloc(depth, sizeof *r->pending);
    if (!r || !r->pending) {
        free(r);
        return WHY("out of memory");
    }
    r->base = (kv_sys){
        .ops = &redis_ops, .name = depth > 1 ? "redis-pipelined" : "redis", .batch = depth};
    r->c = redisConnectUnix(srv->sock);
    redisReply *rep = r->c && !r->c->err ? redisCommand(r->c, flush ? "FLUSHALL" : "PING") : NULL;
    int rc = rep && rep->type == REDIS_REPLY_STATUS ? 0 : -1;
    if (rep) freeReplyObject(rep);
    if (rc == 0) rc = redis_used_memory(r, &r->baseline);
    if (rc < 0) {
        snprintf(why, whylen, "redis at %s: %s", srv->sock,
                 r->c && r->c->err ? r->c->errstr : "FLUSHALL failed");
        redis_close(&r->base);
        return -1;
    }
    *out = &r->base;
    return 0;
}

int peer_redis_open(peer_redis_server *srv, unsigned depth, kv_sys **out, char *why, size_t whylen)
{
    return redis_connect(srv, depth, true, out, why, whylen);
}

/* A number from a section of INFO. */
static int redis_info(redisContext *c, const char *section, const char *field, uint64_t *out)
{
    redisReply *rep = redisCommand(c, "INFO %s", section);
    char key[64];
    snprintf(key, sizeof key, "\n%s:", field);
    const char *p = rep && rep->type == REDIS_REPLY_STRING ? strstr(rep->str, key) : NULL;
    if (p) *out = strtoull(p + strlen(key), NULL, 10);
    if (rep) freeReplyObject(rep);
    return p ? 0 : -1;
}

/* Replays ops against srv until killed, counting them in *done: the load
 * during a BGSAVE. */
static int bgsave_load(peer_redis_server *srv, const ycsb_op *ops, uint64_t nops,
                       unsigned value_len, _Atomic uint64_t *done)
{
    kv_sys *s;
    char why[256];
    if (redis_connect(srv, 64, false, &s, why, sizeof why) < 0) return 1;
    uint8_t value[4096] = {0}, buf[4096];
    for (uint64_t i = 0;; i++) {
        const ycsb_op *op = &ops[i % nops];
        size_t len;
        value[0] = (uint8_t)i;
        int rc = op->kind == YCSB_PUT ? s->ops->value_put(s, op->key, value, value_len)
                                      : s->ops->value_get(s, op->key, buf, sizeof buf, &len);
        if (rc == 0 && i % 64 == 63) {
            rc = s->ops->sync(s);
            atomic_store_explicit(done, i + 1, memory_order_relaxed);
        }
        if (rc) return 1;
    }
}

/* Waits ms milliseconds, sampling the load's count into series every 5. */
static void sample_for(bench_series *series, _Atomic uint64_t *done, unsigned ms)
{
    for (unsigned t = 0; t < ms; t += 5) {
        if (series) bench_series_sample(series, bench_now_ns(), atomic_load(done));
        nanosleep(&(struct timespec){.tv_nsec = 5000000}, NULL);
    }
}

int peer_redis_bgsave(peer_redis_server *srv, const ycsb_op *ops, uint64_t nops, unsigned value_len,
                      uint64_t *cow, uint64_t *dataset, bench_series *series, char *why,
                      size_t whylen)
{
    _Atomic uint64_t *done =
        mmap(NULL, sizeof *done, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (done == MAP_FAILED) return WHY("no memory for the load's count");
    *done = 0;
    redisContext *c = redisConnectUnix(srv->sock);
    if (!c || c->err) {
        redisFree(c);
        return WHY("redis at %s: cannot connect", srv->sock);
    }
    int rc = redis_info(c, "memory", "used_memory_dataset", dataset);
    fflush(NULL);
    pid_t load = rc == 0 ? fork() : -1;
    if (load == 0) _exit(bgsave_load(srv, ops, nops, value_len, done));
    /* Let the load run a moment, as the stash case does before it checkpoints. */
    if (load > 0) sample_for(series, done, 300);
    if (series) series->mark_ns[0] = bench_now_ns();
    redisReply *rep = load > 0 ? redisCommand(c, "BGSAVE") : NULL;
    rc = rep && rep->type == REDIS_REPLY_STATUS ? 0 : -1;
    if (rep) freeReplyObject(rep);
    uint64_t busy = 1, ok = 0;
    for (int i = 0; rc == 0 && busy && i < 60000; i++) {
        sample_for(series, done, 5);
        rc = redis_info(c, "persistence", "rdb_bgsave_in_progress", &busy);
    }
    if (series) series->mark_ns[1] = bench_now_ns();
    if (load > 0 && rc == 0) sample_for(series, done, 300);
    if (load > 0) {
        kill(load, SIGKILL);
        waitpid(load, NULL, 0);
    }
    rep = rc == 0 && !busy ? redisCommand(c, "INFO persistence") : NULL;
    if (rep && rep->type == REDIS_REPLY_STRING)
        ok = strstr(rep->str, "rdb_last_bgsave_status:ok") != NULL;
    if (rep) freeReplyObject(rep);
    if (ok) rc = redis_info(c, "persistence", "rdb_last_cow_size", cow);
    redisFree(c);
    munmap(done, sizeof *done);
    return rc == 0 && ok ? 0 : WHY("BGSAVE at %s failed or never finished", srv->sock);
}

#else

int peer_redis_bgsave(peer_redis_server *srv, const ycsb_op *ops, uint64_t nops, unsigned value_len,
                      uint64_t *cow, uint64_t *dataset, bench_series *series, char *why,
                      size_t whylen)
{
    (void)srv, (void)ops, (void)nops, (void)value_len, (void)cow, (void)dataset, (void)series;
    return WHY("built without hiredis (libhiredis-dev not found)");
}

void peer_redis_stop(peer_redis_server *srv)
{
    (void)srv;
}

int peer_redis_start(const char *dir, peer_redis_server **out, char *why, size_t whylen)
{
    (void)dir, (void)out;
    return WHY("built without hiredis (libhiredis-dev not found)");
}

int peer_redis_open(peer_redis_server *srv, unsigned depth, kv_sys **out, char *why, size_t whylen)
{
    (void)srv, (void)depth, (void)out;
    return WHY("built without hiredis (libhiredis-dev not found)");
}

#endif
