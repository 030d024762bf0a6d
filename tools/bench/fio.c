/* SPDX-License-Identifier: MIT */
/*
 * fio.c: fio, the disk's own figure, run as a child process for the benches
 * that compare against it (io, checkpoint).
 */
#include <errno.h>
#include <fcntl.h>
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
    char sz[32], dir[16], *out = malloc(1 << 20);
    if (!out) return -ENOMEM;
    snprintf(sz, sizeof sz, "--size=%llu", (unsigned long long)size);
    snprintf(dir, sizeof dir, "--direct=%d", direct);
    char filename[600];
    snprintf(filename, sizeof filename, "--filename=%s", path);
    char *argv[] = {"fio",
                    "--name=stash-bench",
                    filename,
                    writing ? "--rw=write" : "--rw=read",
                    "--bs=1M",
                    sz,
                    "--ioengine=io_uring",
                    "--iodepth=16",
                    dir,
                    writing ? "--end_fsync=1" : "--invalidate=1",
                    "--output-format=json",
                    NULL};
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
