/* SPDX-License-Identifier: MIT */
/*
 * test_metrics.c: the counters behind the metrics (each worker's state
 * operations, rollbacks, checkpoint totals, the restore, the engine's I/O)
 * against what was done; `stash serve --metrics` over HTTP (the addresses
 * it takes, what clients that hold connections cannot do), its config file
 * (and what it refuses), and `stash stop --savepoint`.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "include/stash.h"
#include "tests/helpers.h"

static stash_state *state_of(stash_worker *w, const char *name, stash_kind kind)
{
    stash_state *s;
    stash_state_desc d = {.sz = sizeof(stash_state_desc), .name = name, .kind = kind};
    if (kind == STASH_REDUCING) d.reduce = test_sum_reduce;
    cr_assert_eq(stash_state_get(w, &d, &s), 0, "%s", stash_errmsg());
    return s;
}

static stash_op_counts ops_of(stash_arena *a, uint32_t i)
{
    stash_op_counts o;
    cr_assert_eq(stash_op_counts_get(a, i, &o), 0);
    return o;
}

static void make_dir(char *dir, const char *tag)
{
    snprintf(dir, 128, "/tmp/stash-test-metrics-%s-%d", tag, (int)getpid());
    test_remove_dir(dir);
    mkdir(dir, 0700);
}

/* Writes len bytes into the config file path and gives it mode. */
static void write_config(const char *path, const void *bytes, size_t len, mode_t mode)
{
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
    cr_assert_eq(write(fd, bytes, len), (ssize_t)len);
    cr_assert_eq(fchmod(fd, mode), 0);
    close(fd);
}

Test(metrics, every_operation_is_counted_by_its_worker_and_kind, .timeout = 120)
{
    char name[96], check[1024], out[65536];
    stash_arena *a = test_arena_create("metrics", 64u << 20, 128, name);
    stash_worker *w0, *w1;
    cr_assert_eq(
        stash_worker_open(
            name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 0, .parallelism = 2},
            &w0),
        0);
    cr_assert_eq(
        stash_worker_open(
            name,
            &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .index = 1, .parallelism = 2},
            &w1),
        0);
    stash_state *v = state_of(w0, "v", STASH_VALUE), *l = state_of(w0, "l", STASH_LIST),
                *m = state_of(w0, "m", STASH_MAP), *r = state_of(w0, "r", STASH_REDUCING);
    stash_bytes b;
    stash_iter it;
    stash_worker_info me;
    stash_worker_info_get(w0, &me);
    uint64_t done = 0;
    for (uint64_t k = 0; done < 100; k++) {
        cr_assert_eq(stash_key_set(w0, &k, sizeof k), 0);
        if (!stash_kg_range_contains(me.range, (uint32_t)stash_key_group_current(w0))) continue;
        done++;
        cr_assert_eq(stash_value_put(v, &k, sizeof k), 0);                  /* 100 value writes */
        if (done % 2) cr_assert_eq(stash_value_get(v, &b), 0);              /* 50 value reads */
        if (done <= 7) cr_assert_eq(stash_list_add(l, "e", 1), 0);          /* 7 list writes */
        if (done <= 3) cr_assert_eq(stash_list_get(l, &it), 0);             /* 3 list reads */
        if (done <= 11) cr_assert_eq(stash_map_put(m, "k", 1, "v", 1), 0);  /* 11 map writes */
        if (done <= 5) cr_assert_eq(stash_map_get(m, "k", 1, &b), 0);       /* 5 map reads */
        if (done <= 2) cr_assert_eq(stash_map_remove(m, "k", 1), 0);        /* 2 more writes */
        if (done <= 4) cr_assert_eq(stash_merging_add(r, &k, sizeof k), 0); /* 4 merging writes */
        if (done == 1) cr_assert_eq(stash_merging_get(r, &b), 0);           /* 1 merging read */
        if (done == 1) cr_assert_eq(stash_state_clear(v), 0);               /* 1 more value write */
    }
    /* A reader counts nothing, a worker only its own. */
    stash_worker *rd;
    cr_assert_eq(stash_reader_open(name, NULL, &rd), 0, "%s", stash_errmsg());
    stash_state *rv = state_of(rd, "v", STASH_VALUE);
    uint64_t k = 3;
    stash_key_set(rd, &k, sizeof k);
    stash_value_get(rv, &b);
    stash_worker_close(rd);
    stash_op_counts o = ops_of(a, 0);
    cr_assert_eq(o.value_writes, 101);
    cr_assert_eq(o.value_reads, 50);
    cr_assert_eq(o.list_writes, 7);
    cr_assert_eq(o.list_reads, 3);
    cr_assert_eq(o.map_writes, 13);
    cr_assert_eq(o.map_reads, 5);
    cr_assert_eq(o.merging_writes, 4);
    cr_assert_eq(o.merging_reads, 1);
    cr_assert_eq(o.rollbacks, 0);
    stash_op_counts none = ops_of(a, 1);
    cr_assert_eq(none.value_reads + none.value_writes + none.map_writes, 0);
    stash_op_counts o2;
    cr_assert_eq(stash_op_counts_get(a, STASH_MAX_WORKERS, &o2), -EINVAL);
    cr_assert_eq(stash_op_counts_get(NULL, 0, &o2), -EINVAL);
    cr_assert_eq(stash_op_counts_get(a, 0, NULL), -EINVAL);
    /* The same through the metrics text. */
    snprintf(check, sizeof check,
             "status %s --prom --per-key-group | python3 %s/prom_check.py "
             "'stash_worker_state_operations_total{index=\"0\",kind=\"value\",op=\"write\"}=101' "
             "'stash_worker_state_operations_total{index=\"0\",kind=\"value\",op=\"read\"}=50' "
             "'stash_worker_state_operations_total{index=\"0\",kind=\"list\",op=\"write\"}=7' "
             "'stash_worker_state_operations_total{index=\"0\",kind=\"map\",op=\"write\"}=13' "
             "'stash_worker_state_operations_total{index=\"0\",kind=\"merging\",op=\"read\"}=1' "
             "'stash_worker_state_operations_total{index=\"1\",kind=\"value\",op=\"write\"}=0' "
             "'stash_key_group_used_bytes{kg=\"0\"}>=1' stash_service_up=0",
             name, STASH_TESTS_DIR);
    cr_assert_eq(test_run_stash(check, out, sizeof out), 0, "%s: %s", check, out);
    /* Counters stay once the workers left, until the arena goes. */
    stash_worker_close(w0);
    stash_worker_close(w1);
    cr_assert_eq(ops_of(a, 0).value_writes, 101);
    snprintf(check, sizeof check,
             "status %s --prom | python3 %s/prom_check.py "
             "'stash_worker_state_operations_total{index=\"0\",kind=\"value\",op=\"write\"}=101'",
             name, STASH_TESTS_DIR);
    cr_assert_eq(test_run_stash(check, out, sizeof out), 0, "%s: %s", check, out);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
}

Test(metrics, checkpoints_the_restore_rollbacks_and_io_are_counted, .timeout = 120)
{
    char name[96], dir[128];
    make_dir(dir, "totals");
    stash_arena *a = test_arena_create("metrics-totals", 64u << 20, 128, name);
    stash_service *svc;
    cr_assert_eq(
        stash_service_start(
            name, &(stash_service_opts){.sz = sizeof(stash_service_opts), .dir = dir}, &svc),
        0, "%s", stash_errmsg());
    stash_worker *w;
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0);
    stash_state *v = state_of(w, "v", STASH_VALUE);
    for (uint64_t k = 0; k < 1000; k++) {
        stash_key_set(w, &k, sizeof k);
        cr_assert_eq(stash_value_put(v, &k, sizeof k), 0);
    }
    stash_checkpoint_info info;
    for (int i = 0; i < 2; i++)
        cr_assert_eq(test_checkpoint_at_barriers(a, &w, 1, &info), 0, "%s", info.detail);
    stash_service_info sv;
    stash_service_info_get(a, &sv);
    cr_assert_eq(sv.completed_total, 2);
    cr_assert_eq(sv.failed_total, 0);
    cr_assert(strcmp(sv.io_backend, "io_uring") == 0 || strcmp(sv.io_backend, "threads") == 0, "%s",
              sv.io_backend);
    cr_assert_geq(sv.io_bytes_written, 2 * 1000 * 16, "two checkpoints of 1000 16-byte entries");
    cr_assert_eq(sv.io_errors, 0);
    cr_assert_eq(sv.restored_at_ns, 0, "created empty: no restore");
    char args[128], out[65536];
    snprintf(args, sizeof args, "status %s --json", name);
    cr_assert_eq(test_run_stash(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"completed_total\": 2, \"failed_total\": 0,"), "%s", out);
    /* A replacement that rolls back counts a rollback for its index. */
    stash_worker_close(w);
    cr_assert_eq(
        stash_worker_open(name,
                          &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .rollback = 1}, &w),
        0, "%s", stash_errmsg());
    cr_assert_eq(ops_of(a, 0).rollbacks, 1);
    cr_assert_eq(ops_of(a, 0).value_writes, 1000, "the index's counts go on");
    stash_worker_close(w);
    stash_service_stop(svc);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    /* A service that creates the arena from the checkpoint says so. */
    cr_assert_eq(
        stash_service_start(
            name, &(stash_service_opts){.sz = sizeof(stash_service_opts), .dir = dir}, &svc),
        0, "%s", stash_errmsg());
    cr_assert_eq(stash_arena_open(name, NULL, &a), 0);
    stash_service_info_get(a, &sv);
    cr_assert_eq(sv.restored_id, info.id);
    cr_assert_eq(sv.restored_records, 1000);
    cr_assert_gt(sv.restored_at_ns, 0);
    cr_assert_gt(sv.io_bytes_read, 0);
    cr_assert_eq(sv.completed_total, 0, "totals are the arena's: a new one starts at 0");
    stash_service_stop(svc);
    stash_arena_close(a);
    stash_arena_destroy(name, NULL);
    test_remove_dir(dir);
}

/* Starts `stash serve NAME --dir DIR extra...` with stdout and stderr into
 * log, after the shell command shell (a ulimit, or ""); returns its pid. */
static pid_t serve(const char *shell, const char *name, const char *dir, const char *log,
                   const char *extra)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s exec %s serve %s --dir %s %s > %s 2>&1", shell, STASH_BIN, name,
             dir, extra, log);
    pid_t pid = fork();
    if (pid == 0) {
        /* A test that fails leaves no service behind. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Waits until the log has a line with what (the service writes it), or the
 * server died; copies that line's rest after what into out. */
static bool await_line(const char *log, const char *what, pid_t pid, char *out, size_t cap)
{
    for (;;) {
        char line[1024];
        FILE *f = fopen(log, "r");
        while (f && fgets(line, sizeof line, f)) {
            char *at = strstr(line, what);
            if (!at) continue;
            snprintf(out, cap, "%s", at + strlen(what));
            out[strcspn(out, "\n")] = 0;
            fclose(f);
            return true;
        }
        if (f) fclose(f);
        if (waitpid(pid, NULL, WNOHANG) == pid) return false;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
}

Test(metrics, serve_serves_them_over_http_reads_a_config_and_stops_with_a_savepoint, .timeout = 180)
{
    char name[64], dir[128], log[160], conf[160], url[256], cmd[2048], out[65536];
    make_dir(dir, "http");
    snprintf(log, sizeof log, "%s.log", dir);
    snprintf(conf, sizeof conf, "%s.conf", dir);
    snprintf(name, sizeof name, "%s", test_arena_name("metrics-http"));
    static const char served[] = "# the service of the test\nretain = 2\n  incremental   # deltas\n"
                                 "metrics 127.0.0.1:0\n\nmemory-cap 1M\n";
    write_config(conf, served, sizeof served - 1, 0600);
    /* systemd's notification socket: the service says when it is ready. */
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof sun.sun_path, "/tmp/stash-test-notify-%d", (int)getpid());
    unlink(sun.sun_path);
    int nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert_eq(bind(nfd, (struct sockaddr *)&sun, sizeof sun), 0);
    setenv("NOTIFY_SOCKET", sun.sun_path, 1);
    char extra[512], note[256];
    snprintf(extra, sizeof extra, "--config %s", conf);
    pid_t pid = serve("", name, dir, log, extra);
    unsetenv("NOTIFY_SOCKET");
    ssize_t got = recv(nfd, note, sizeof note - 1, 0);
    cr_assert_gt(got, 0);
    note[got] = 0;
    cr_assert(strstr(note, "READY=1"), "%s", note);
    cr_assert(await_line(log, "metrics at ", pid, url, sizeof url), "no metrics line in %s", log);
    snprintf(cmd, sizeof cmd, "checkpoint %s --timeout 20s", name);
    cr_assert_eq(test_run_stash(cmd, out, sizeof out), 0, "%s", out);
    /* Prometheus' text over HTTP, checked by the same validator. */
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import sys, urllib.request; "
             "r = urllib.request.urlopen(sys.argv[1]); "
             "assert r.headers[\"Content-Type\"].startswith(\"text/plain; version=0.0.4\"); "
             "sys.stdout.write(r.read().decode())' '%s?kg=1' | python3 %s/prom_check.py "
             "stash_service_up=1 stash_checkpoints_completed_total=1 "
             "'stash_io_written_bytes_total>=1' 'stash_key_group_free_bytes{kg=\"127\"}>=0'",
             url, STASH_TESTS_DIR);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    char missing[600];
    snprintf(missing, sizeof missing,
             "python3 -c 'import sys, urllib.request, urllib.error\n"
             "try: urllib.request.urlopen(sys.argv[1])\n"
             "except urllib.error.HTTPError as e: sys.exit(e.code != 404)\n"
             "sys.exit(1)' '%.*s/other'",
             (int)(strlen(url) - strlen("/metrics")), url);
    cr_assert_eq(system(missing), 0, "another path is not found");
    /* Stop with a savepoint: printed, complete, and the service gone. */
    snprintf(cmd, sizeof cmd, "stop %s --savepoint --json --timeout 30s", name);
    cr_assert_eq(test_run_stash(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "\"savepoint\": true") && strstr(out, "savepoint-"), "%s", out);
    cr_assert_eq(test_wait(pid), 0);
    got = recv(nfd, note, sizeof note - 1, 0);
    cr_assert_gt(got, 0);
    note[got] = 0;
    cr_assert(strstr(note, "STOPPING=1"), "%s", note);
    close(nfd);
    unlink(sun.sun_path);
    char *path = strstr(out, "\"path\": \"") + 9;
    path[strcspn(path, "\"")] = 0;
    snprintf(cmd, sizeof cmd, "snapshot verify %s", path);
    cr_assert_eq(test_run_stash(cmd, out, sizeof out), 0, "%s", out);
    /* With no service, stop --savepoint fails and says why. */
    snprintf(cmd, sizeof cmd, "stop %s --savepoint", name);
    cr_assert_eq(test_run_stash(cmd, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "no service"), "%s", out);
    /* A config file's wrong line is named; so is a missing file. */
    static const char wrong[] = "retain 2\ninterval soon\n";
    write_config(conf, wrong, sizeof wrong - 1, 0600);
    snprintf(cmd, sizeof cmd, "serve %s --dir %s --config %s", name, dir, conf);
    cr_assert_eq(test_run_stash(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "line 2: bad value for interval") && !strstr(out, "soon"), "%s", out);
    static const char dashes[] = "--retain 2\n";
    write_config(conf, dashes, sizeof dashes - 1, 0600);
    cr_assert_eq(test_run_stash(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "line 1"), "%s", out);
    snprintf(cmd, sizeof cmd, "serve %s --dir %s --config %s.none", name, dir, conf);
    cr_assert_eq(test_run_stash(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, ".none") && strstr(out, "No such file"), "%s", out);
    stash_arena_destroy(name, NULL);
    unlink(log);
    unlink(conf);
    test_remove_dir(dir);
}

/* Raises this process's descriptor limit to at least n, the hard one too
 * where it may (as root); skips the test if it cannot. */
static void allow_descriptors(rlim_t n)
{
    struct rlimit r;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &r), 0);
    if (r.rlim_max < n) r.rlim_max = n;
    if (r.rlim_cur < n) r.rlim_cur = n;
    if (setrlimit(RLIMIT_NOFILE, &r) != 0)
        cr_skip_test("cannot open %llu descriptors: %s", (unsigned long long)n, strerror(errno));
}

/* The port of the URL in the service's "metrics at URL" line. */
static int port_of(const char *url)
{
    return atoi(strrchr(url, ':') + 1);
}

/* Opens n connections from 127.0.0.1 to 127.0.0.1:port that send nothing. */
static int *connect_many(int port, int n)
{
    int *fd = malloc((size_t)n * sizeof *fd);
    cr_assert_not_null(fd);
    struct sockaddr_in to = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int i = 0; i < n; i++) {
        fd[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        cr_assert_geq(fd[i], 0, "socket %d: %s", i, strerror(errno));
        int rc = connect(fd[i], (struct sockaddr *)&to, sizeof to);
        cr_assert(rc == 0 || errno == EINPROGRESS, "connection %d: %s", i, strerror(errno));
    }
    return fd;
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* A GET /metrics in flight and what came back of it. */
typedef struct scrape {
    int fd;
    bool done; /* the server ended the reply */
    size_t len;
    char out[1 << 16];
} scrape;

/* Sends GET /metrics to 127.0.0.1:port from the address src (127.0.0.2 is
 * another client than 127.0.0.1). */
static void scrape_start(scrape *s, const char *src, int port)
{
    *s = (scrape){.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
    cr_assert_geq(s->fd, 0, "%s", strerror(errno));
    struct sockaddr_in from = {.sin_family = AF_INET},
                       to = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    inet_pton(AF_INET, src, &from.sin_addr);
    cr_assert_eq(bind(s->fd, (struct sockaddr *)&from, sizeof from), 0, "%s: %s", src,
                 strerror(errno));
    cr_assert_eq(connect(s->fd, (struct sockaddr *)&to, sizeof to), 0, "%s", strerror(errno));
    static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
    cr_assert_eq(send(s->fd, req, sizeof req - 1, MSG_NOSIGNAL), (ssize_t)(sizeof req - 1));
}

/* Reads what the server sent of the reply within ms; false if nothing. */
static bool scrape_read(scrape *s, int ms)
{
    struct pollfd p = {.fd = s->fd, .events = POLLIN};
    if (s->done || poll(&p, 1, ms) <= 0) return false;
    ssize_t got = read(s->fd, s->out + s->len, sizeof s->out - 1 - s->len);
    if (got > 0) {
        s->len += (size_t)got;
        s->out[s->len] = 0;
        return true;
    }
    close(s->fd);
    s->done = true;
    return true;
}

/* Waits, a minute at most, until the server ended the reply; meanwhile each
 * of the n sockets of trickle sends the next byte of a request that never
 * ends whenever half a second passed without a byte of the reply. */
static void scrape_end(scrape *s, const int *trickle, int n)
{
    static const char req[] = "GET /metrics HTTP/1.1\r\nX-Trickle: ";
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t sent = 0; !s->done && seconds_since(&t0) < 60;) {
        if (scrape_read(s, 500)) continue;
        char c = sent < sizeof req - 1 ? req[sent] : 'a';
        for (int i = 0; i < n; i++) send(trickle[i], &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        sent++;
    }
}

/* Waits up to ms for the server to close some of the n connections fd;
 * returns how many it closed (their fd are then -1). */
static int closed_within(int *fd, int n, int ms)
{
    struct pollfd *p = calloc((size_t)n, sizeof *p);
    cr_assert_not_null(p);
    for (int i = 0; i < n; i++) p[i] = (struct pollfd){.fd = fd[i], .events = POLLIN};
    int closed = 0;
    if (poll(p, (nfds_t)n, ms) > 0)
        for (int i = 0; i < n; i++) {
            char c;
            if (p[i].fd < 0 || !p[i].revents || recv(p[i].fd, &c, 1, MSG_DONTWAIT) > 0) continue;
            close(fd[i]);
            fd[i] = -1;
            closed++;
        }
    free(p);
    return closed;
}

/* Stops the service pid of arena name and removes what the test made. */
static void serve_end(const char *name, pid_t pid, const char *dir, const char *log)
{
    char cmd[256], out[4096];
    snprintf(cmd, sizeof cmd, "stop %s --timeout 30s", name);
    cr_assert_eq(test_run_stash(cmd, out, sizeof out), 0, "%s", out);
    cr_assert_eq(test_wait(pid), 0);
    stash_arena_destroy(name, NULL);
    unlink(log);
    test_remove_dir(dir);
}

Test(metrics, idle_connections_leave_checkpoints_their_descriptors_and_others_an_answer,
     .timeout = 180)
{
    char name[64], dir[128], log[160], url[256], cmd[256], out[65536];
    allow_descriptors(4096);
    make_dir(dir, "idle");
    snprintf(log, sizeof log, "%s.log", dir);
    snprintf(name, sizeof name, "%s", test_arena_name("metrics-idle"));
    /* 1,024 descriptors, soft and hard: the service cannot raise them. */
    pid_t pid = serve("ulimit -n 1024;", name, dir, log, "--metrics 127.0.0.1:0");
    cr_assert(await_line(log, "metrics at ", pid, url, sizeof url), "no metrics line in %s", log);
    int *idle = connect_many(port_of(url), 1100);
    /* As long as any of them is open, checkpoints of the arena succeed; and
     * another client is answered. */
    scrape *other = malloc(sizeof *other);
    cr_assert_not_null(other);
    scrape_start(other, "127.0.0.2", port_of(url));
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int open = 1100;
    for (int round = 0; open > 0 && seconds_since(&t0) < 60; round++) {
        snprintf(cmd, sizeof cmd, "checkpoint %s --timeout 30s", name);
        cr_assert_eq(test_run_stash(cmd, out, sizeof out), 0, "round %d, %d open: %s", round, open,
                     out);
        scrape_read(other, 0);
        open -= closed_within(idle, 1100, 100);
    }
    scrape_end(other, NULL, 0);
    cr_assert(strstr(other->out, " 200 OK") && strstr(other->out, "stash_service_up 1"), "%s",
              other->out);
    /* Idle ones are timed out: 127.0.0.1 is answered again. */
    cr_assert_eq(open, 0, "the server closed each idle connection");
    free(idle);
    scrape_start(other, "127.0.0.1", port_of(url));
    scrape_end(other, NULL, 0);
    cr_assert(strstr(other->out, "stash_checkpoints_completed_total"), "%s", other->out);
    free(other);
    serve_end(name, pid, dir, log);
}

Test(metrics, a_trickling_client_does_not_hold_up_another_clients_scrape, .timeout = 180)
{
    char name[64], dir[128], log[160], url[256];
    allow_descriptors(4096);
    make_dir(dir, "trickle");
    snprintf(log, sizeof log, "%s.log", dir);
    snprintf(name, sizeof name, "%s", test_arena_name("metrics-trickle"));
    pid_t pid = serve("", name, dir, log, "--metrics :0");
    cr_assert(await_line(log, "metrics at ", pid, url, sizeof url), "no metrics line in %s", log);
    cr_assert(strncmp(url, "http://0.0.0.0:", 15) == 0, ":PORT is every IPv4 address: %s", url);
    int *trickle = connect_many(port_of(url), 1100);
    scrape *other = malloc(sizeof *other);
    cr_assert_not_null(other);
    scrape_start(other, "127.0.0.2", port_of(url));
    scrape_end(other, trickle, 1100);
    cr_assert(strstr(other->out, " 200 OK") && strstr(other->out, "stash_service_up 1"), "%s",
              other->out);
    free(other);
    for (int i = 0; i < 1100; i++) close(trickle[i]);
    free(trickle);
    serve_end(name, pid, dir, log);
}

Test(metrics, the_service_raises_its_descriptor_limit_to_the_hard_one, .timeout = 120)
{
    char name[64], dir[128], log[160], url[256], path[64], line[256];
    allow_descriptors(4096);
    make_dir(dir, "nofile");
    snprintf(log, sizeof log, "%s.log", dir);
    snprintf(name, sizeof name, "%s", test_arena_name("metrics-nofile"));
    pid_t pid = serve("ulimit -Sn 1024;", name, dir, log, "--metrics 127.0.0.1:0");
    cr_assert(await_line(log, "metrics at ", pid, url, sizeof url), "no metrics line in %s", log);
    snprintf(path, sizeof path, "/proc/%d/limits", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    unsigned long long soft = 0, hard = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Max open files %llu %llu", &soft, &hard) == 2) break;
    fclose(f);
    struct rlimit r;
    getrlimit(RLIMIT_NOFILE, &r);
    cr_assert_eq(hard, (unsigned long long)r.rlim_max);
    cr_assert_eq(soft, hard, "soft %llu, hard %llu", soft, hard);
    serve_end(name, pid, dir, log);
}

Test(metrics, addresses_out_of_range_or_malformed_are_refused_by_name, .timeout = 120)
{
    static const struct {
        const char *addr, *what;
    } bad[] = {
        {"127.0.0.1:99999", "port"},
        {"127.0.0.1:65536", "port"},
        {"127.0.0.1:-1", "port"},
        {"127.0.0.1:+80", "port"},
        {"127.0.0.1:80x", "port"},
        {"127.0.0.1:", "port"},
        {":", "port"},
        {"[::1]:99999", "port"},
        {"[::1]:", "port"},
        {"1.2.3:9187", "IPv4"},
        {"127.1:9187", "IPv4"},
        {"999.1.1.1:9187", "IPv4"},
        {"localhost:9187", "IPv4"},
        {"::1:9187", "brackets"},
        {"[1.2.3.4]:9187", "IPv6"},
        {"[::1]", "PORT"},
        {"[::1:9187", "PORT"},
        {"no-port", "PORT"},
    };
    char name[64], dir[128], cmd[512], out[8192];
    make_dir(dir, "addr");
    snprintf(name, sizeof name, "%s", test_arena_name("metrics-addr"));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "serve %s --dir %s --metrics '%s'", name, dir, bad[i].addr);
        cr_assert_eq(test_run_stash_within(cmd, 30, out, sizeof out), 2, "%s: %s", bad[i].addr,
                     out);
        char said[128];
        snprintf(said, sizeof said, "--metrics %s: ", bad[i].addr);
        cr_assert(strstr(out, said) && strstr(out, bad[i].what), "%s: %s", bad[i].addr, out);
        /* Refused before the service started: no arena. */
        stash_arena *a;
        cr_assert_neq(stash_arena_open(name, NULL, &a), 0, "%s", bad[i].addr);
    }
    test_remove_dir(dir);
}

/* A config file of the test's own and an arena name that no service takes. */
typedef struct config_case {
    char name[64], dir[128], conf[160], out[8192];
} config_case;

static void config_case_init(config_case *c, const char *tag)
{
    make_dir(c->dir, tag);
    snprintf(c->conf, sizeof c->conf, "%s.conf", c->dir);
    snprintf(c->name, sizeof c->name, "%s", test_arena_name(tag));
}

static void config_case_end(config_case *c)
{
    stash_arena_destroy(c->name, NULL);
    unlink(c->conf);
    test_remove_dir(c->dir);
}

/* Runs stash serve with --config conf (and --dir where dir is set), which
 * must refuse it at once, naming the file; c->out says why. */
static void config_refused(config_case *c, const char *conf, bool dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "serve %s %s %s --config %s", c->name, dir ? "--dir" : "",
             dir ? c->dir : "", conf);
    cr_assert_eq(test_run_stash_within(cmd, 30, c->out, sizeof c->out), 2, "%s: %s", conf, c->out);
    cr_assert(strstr(c->out, conf), "names %s: %s", conf, c->out);
}

Test(metrics, config_that_is_no_regular_file_is_refused_at_once, .timeout = 120)
{
    config_case c;
    config_case_init(&c, "conf-kind");
    cr_assert_eq(mkfifo(c.conf, 0600), 0, "%s", strerror(errno));
    config_refused(&c, c.conf, true);
    cr_assert(strstr(c.out, "FIFO, not a regular file"), "%s", c.out);
    config_refused(&c, "/dev/zero", true);
    cr_assert(strstr(c.out, "character device, not a regular file"), "%s", c.out);
    config_refused(&c, c.dir, true);
    cr_assert(strstr(c.out, "directory, not a regular file"), "%s", c.out);
    config_case_end(&c);
}

Test(metrics, config_larger_than_64_KiB_is_refused, .timeout = 120)
{
    config_case c;
    config_case_init(&c, "conf-size");
    /* Comment lines, then a bad one that a read of the whole file reaches. */
    static char text[65537];
    memset(text, '#', sizeof text);
    for (size_t i = 63; i < sizeof text; i += 64) text[i] = '\n';
    static const char last[] = "interval soon\n";
    text[sizeof text - sizeof last] = '\n';
    memcpy(text + sizeof text - sizeof last + 1, last, sizeof last - 1);
    write_config(c.conf, text, sizeof text, 0600);
    config_refused(&c, c.conf, true);
    cr_assert(strstr(c.out, "65537 bytes, more than 65536"), "%s", c.out);
    /* 65536 bytes are read: the bad line is found. */
    write_config(c.conf, text + 1, sizeof text - 1, 0600);
    config_refused(&c, c.conf, true);
    cr_assert(strstr(c.out, "line 1025: bad value for interval"), "%s", c.out);
    config_case_end(&c);
}

Test(metrics, config_that_others_may_write_is_refused, .timeout = 120)
{
    config_case c;
    config_case_init(&c, "conf-mode");
    static const char text[] = "interval soon\n";
    write_config(c.conf, text, sizeof text - 1, 0620);
    config_refused(&c, c.conf, true);
    cr_assert(strstr(c.out, "writable by its group (mode 0620)"), "%s", c.out);
    write_config(c.conf, text, sizeof text - 1, 0602);
    config_refused(&c, c.conf, true);
    cr_assert(strstr(c.out, "writable by others (mode 0602)"), "%s", c.out);
    config_case_end(&c);
}

Test(metrics, config_that_another_user_owns_is_refused, .timeout = 120)
{
    if (geteuid() != 0) cr_skip_test("giving a file to another user needs root");
    config_case c;
    config_case_init(&c, "conf-owner");
    static const char text[] = "interval soon\n";
    write_config(c.conf, text, sizeof text - 1, 0600);
    /* 65534: nobody, an unused uid. */
    cr_assert_eq(chown(c.conf, 65534, 65534), 0, "%s", strerror(errno));
    config_refused(&c, c.conf, true);
    cr_assert(strstr(c.out, "owned by uid 65534"), "%s", c.out);
    config_case_end(&c);
}

Test(metrics, config_with_a_nul_byte_is_refused_naming_the_line, .timeout = 120)
{
    config_case c;
    config_case_init(&c, "conf-nul");
    static const char text[] = "retain 2\nincremental\0 and then\ninterval soon\n";
    write_config(c.conf, text, sizeof text - 1, 0600);
    config_refused(&c, c.conf, true);
    cr_assert(strstr(c.out, "line 2: a NUL byte"), "%s", c.out);
    config_case_end(&c);
}

Test(metrics, config_option_without_its_value_is_an_error, .timeout = 120)
{
    config_case c;
    config_case_init(&c, "conf-novalue");
    /* No --dir on the command line: the arena's name must not become it. */
    static const char dir[] = "retain 2\ndir\n";
    write_config(c.conf, dir, sizeof dir - 1, 0600);
    config_refused(&c, c.conf, false);
    cr_assert(strstr(c.out, "line 2: dir needs a value"), "%s", c.out);
    static const char empty[] = "retain =\n";
    write_config(c.conf, empty, sizeof empty - 1, 0600);
    config_refused(&c, c.conf, true);
    cr_assert(strstr(c.out, "line 1: retain needs a value"), "%s", c.out);
    static const char flag[] = "incremental yes\n";
    write_config(c.conf, flag, sizeof flag - 1, 0600);
    config_refused(&c, c.conf, true);
    cr_assert(strstr(c.out, "line 1: incremental takes no value"), "%s", c.out);
    config_case_end(&c);
}

Test(metrics, config_line_it_cannot_parse_is_not_printed, .timeout = 120)
{
    config_case c;
    config_case_init(&c, "conf-secret");
    char secret[200];
    snprintf(secret, sizeof secret, "%s.secret", c.dir);
    static const struct {
        const char *text, *said;
    } lines[] = {
        {"sk-live-4f9a2c7e\n", "line 1: unknown option"},
        {"# a comment\nsk-live-4f9a2c7e = 1\n", "line 2: unknown option"},
        {"interval sk-live-4f9a2c7e\n", "line 1: bad value for interval"},
        {"--sk-live-4f9a2c7e\n", "line 1: an option is written without its dashes"},
        {"metrics 127.0.0.1:4f9a2c7e\n", "line 1: metrics: the port is not a number"},
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        write_config(secret, lines[i].text, strlen(lines[i].text), 0600);
        /* Directly, and as a config linked to the secret file. */
        for (int link = 0; link < 2; link++) {
            unlink(c.conf);
            if (link) cr_assert_eq(symlink(secret, c.conf), 0, "%s", strerror(errno));
            config_refused(&c, link ? c.conf : secret, true);
            cr_assert(strstr(c.out, lines[i].said), "%s", c.out);
            cr_assert_null(strstr(c.out, "4f9a2c7e"), "the line is printed: %s", c.out);
        }
    }
    unlink(secret);
    config_case_end(&c);
}
