/* SPDX-License-Identifier: MIT */
/*
 * fio.c: the storage's own figures, run as child processes for the benches
 * that compare against them: fio for a disk (io, checkpoint), rados bench
 * for a Ceph pool (checkpoint --storage rados).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/bench/bench.h"

/* Runs argv with stdout into out (NUL-terminated) and stderr discarded.
 * Returns the exit status, 127 if it could not run, or -errno. */
static int run_capture(char *const argv[], char *out, size_t cap)
{
    int pipefd[2];
    if (pipe(pipefd) < 0) return -errno;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(pipefd[0]), close(pipefd[1]);
        return -errno;
    }
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(pipefd[1], STDOUT_FILENO);
        if (null >= 0) dup2(null, STDERR_FILENO);
        close(pipefd[0]);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(pipefd[1]);
    size_t len = 0;
    ssize_t n;
    while ((n = read(pipefd[0], out + len, cap - 1 - len)) > 0 || (n < 0 && errno == EINTR))
        if (n > 0) len += (size_t)n;
    out[len] = '\0';
    close(pipefd[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The "bw_bytes" of fio's "read" or "write" section in its JSON output. */
static double fio_bandwidth(const char *json, const char *section)
{
    char key[32];
    snprintf(key, sizeof key, "\"%s\" : {", section);
    const char *s = strstr(json, key);
    s = s ? strstr(s, "\"bw_bytes\" : ") : NULL;
    return s ? strtod(s + strlen("\"bw_bytes\" : "), NULL) : -1;
}

int bench_fio(const char *path, uint64_t size, bool writing, bool direct, double *bps)
{
    if (writing) unlink(path); /* a new file, as a checkpoint writes */
    char sz[32], dir[16], *out = malloc(1 << 20);
    if (!out) return -ENOMEM;
    snprintf(sz, sizeof sz, "--size=%llu", (unsigned long long)size);
    snprintf(dir, sizeof dir, "--direct=%d", direct);
    char filename[600];
    snprintf(filename, sizeof filename, "--filename=%s", path);
    char *argv[] = {"fio", "--name=stash-bench", filename, writing ? "--rw=write" : "--rw=read",
                    "--bs=1M", sz, "--ioengine=io_uring", "--iodepth=16",
                    /* Its buffers and file registered, as stash's engine has
                     * them: fio at its best on this job. */
                    "--fixedbufs=1", "--registerfiles=1", dir,
                    writing ? "--end_fsync=1" : "--invalidate=1", "--output-format=json", NULL};
    int st = run_capture(argv, out, 1 << 20);
    *bps = st == 0 ? fio_bandwidth(out, writing ? "write" : "read") : -1;
    free(out);
    return st == 0 && *bps > 0 ? 0 : -EIO;
}

bool bench_fio_installed(void)
{
    char out[256];
    char *argv[] = {"fio", "--version", NULL};
    return run_capture(argv, out, sizeof out) == 0;
}

int bench_rados_bench(const char *pool, bool writing, uint64_t bytes, double *bps)
{
    char *out = malloc(1 << 16);
    if (!out) return -ENOMEM;
    char run[64], objects[32];
    snprintf(run, sizeof run, "stash-bench-%d", (int)getpid());
    snprintf(objects, sizeof objects, "%llu",
             (unsigned long long)((bytes + (4u << 20) - 1) / (4u << 20)));
    /* The same bytes in objects of the size stash stripes a checkpoint's
     * files into, as many in flight (its time limit only a bound); the
     * reads are of the objects the write left. */
    char *write_argv[] = {
        "rados", "-p", (char *)pool,    "bench", "600",          "write",      "-b", "4194304",
        "-t",    "8",  "--max-objects", objects, "--no-cleanup", "--run-name", run,  NULL};
    char *read_argv[] = {"rados", "-p", (char *)pool, "bench", "600", "seq",
                         "-t",    "8",  "--run-name", run,     NULL};
    int st = run_capture(writing ? write_argv : read_argv, out, 1 << 16);
    const char *bw = st == 0 ? strstr(out, "Bandwidth (MB/sec):") : NULL;
    *bps = bw ? strtod(bw + strlen("Bandwidth (MB/sec):"), NULL) * 1048576.0 : -1;
    if (!writing) {
        char *clean_argv[] = {"rados", "-p", (char *)pool, "cleanup", "--run-name", run, NULL};
        run_capture(clean_argv, out, 1 << 16);
    }
    free(out);
    return *bps > 0 ? 0 : -EIO;
}

/* An AWS config file of the bench's: parts of 8 MiB, 8 in flight, as the
 * s3 storage has them. Returns its path (static) or NULL. */
static const char *aws_config(void)
{
    static char path[128];
    if (path[0]) return path;
    snprintf(path, sizeof path, "/tmp/stash-bench-aws-%d.conf", (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return path[0] = 0, NULL;
    static const char conf[] = "[default]\ns3 =\n  max_concurrent_requests = 8\n"
                               "  multipart_threshold = 8MB\n  multipart_chunksize = 8MB\n";
    bool ok = write(fd, conf, sizeof conf - 1) == (ssize_t)(sizeof conf - 1);
    close(fd);
    if (!ok) unlink(path), path[0] = 0;
    return path[0] ? path : NULL;
}

static void aws_config_remove(void)
{
    char path[128];
    snprintf(path, sizeof path, "/tmp/stash-bench-aws-%d.conf", (int)getpid());
    unlink(path);
}

int bench_aws_s3(const char *bucket, const char *key, const char *path, bool writing, double *secs)
{
    const char *conf = aws_config(), *endpoint = getenv("AWS_ENDPOINT_URL");
    if (!conf) return -EIO;
    static bool registered;
    if (!registered) registered = atexit(aws_config_remove) == 0;
    setenv("AWS_CONFIG_FILE", conf, 1);
    char url[1024], *out = malloc(1 << 16);
    if (!out) return -ENOMEM;
    snprintf(url, sizeof url, "s3://%s/%s", bucket, key);
    char *argv[] = {"aws",
                    "s3",
                    "cp",
                    writing ? (char *)path : url,
                    writing ? url : (char *)path,
                    "--only-show-errors",
                    "--no-progress",
                    endpoint ? "--endpoint-url" : NULL,
                    (char *)endpoint,
                    NULL};
    uint64_t t0 = bench_now_ns();
    int st = run_capture(argv, out, 1 << 16);
    *secs = (double)(bench_now_ns() - t0) / 1e9;
    free(out);
    return st == 0 ? 0 : -EIO;
}

int bench_aws_start(double *secs)
{
    char out[256];
    char *argv[] = {"aws", "--version", NULL};
    uint64_t t0 = bench_now_ns();
    int st = run_capture(argv, out, sizeof out);
    *secs = (double)(bench_now_ns() - t0) / 1e9;
    return st == 0 ? 0 : -EIO;
}
