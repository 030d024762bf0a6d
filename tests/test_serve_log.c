/* SPDX-License-Identifier: MIT */
/*
 * test_serve_log.c: `stash serve`'s log as journald reads it. Where its
 * stdout is the stream systemd's JOURNAL_STREAM names, each text line
 * starts with the syslog priority of its level (<6> INFO, <4> WARN, <3>
 * ERROR), which journald takes as the entry's priority; anywhere else, and
 * in JSON, the lines are as they always were.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "include/stash.h"
#include "tests/helpers.h"

typedef struct served {
    char name[64];
    char dir[64];  /* the test's directory, removed at the end */
    char ckpt[96]; /* the checkpoint directory in it */
    char log[96];  /* the service's stdout and stderr */
    pid_t pid;
} served;

/* "DEV:INO" of the file at path, as systemd writes JOURNAL_STREAM. */
static void stream_of(const char *path, char *out, size_t cap)
{
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    snprintf(out, cap, "%llu:%llu", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
}

/* Starts `stash serve` with JOURNAL_STREAM=stream (none if NULL) and its
 * output appended to s->log, which exists first so that its inode is the
 * one stream may name; "@log" names it. */
static void serve(served *s, const char *stream, const char *extra)
{
    snprintf(s->name, sizeof s->name, "%s", test_arena_name("journal"));
    snprintf(s->dir, sizeof s->dir, "/tmp/stash-journal-XXXXXX");
    cr_assert_not_null(mkdtemp(s->dir));
    snprintf(s->ckpt, sizeof s->ckpt, "%s/ckpt", s->dir);
    snprintf(s->log, sizeof s->log, "%s/log", s->dir);
    FILE *f = fopen(s->log, "w");
    cr_assert_not_null(f);
    fclose(f);
    char env[96] = "", cmd[1024];
    if (stream && strcmp(stream, "@log") == 0) {
        char dev_ino[64];
        stream_of(s->log, dev_ino, sizeof dev_ino);
        snprintf(env, sizeof env, "JOURNAL_STREAM=%s ", dev_ino);
    } else if (stream) {
        snprintf(env, sizeof env, "JOURNAL_STREAM=%s ", stream);
    }
    snprintf(cmd, sizeof cmd, "%sexec %s serve %s --dir %s --size 16M %s >> %s 2>&1", env,
             STASH_BIN, s->name, s->ckpt, extra, s->log);
    s->pid = fork();
    cr_assert_geq(s->pid, 0);
    if (s->pid == 0) {
        /* A test that fails leaves no service behind. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        unsetenv("JOURNAL_STREAM");
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    test_await_serving(s->name, s->pid);
}

/* Stops the service with `stash stop`, asserts it exited 0, and reads its
 * log into out. */
static void stop(served *s, char *out, size_t cap)
{
    char args[128], said[4096];
    snprintf(args, sizeof args, "stop %s --timeout 30s", s->name);
    cr_assert_eq(test_run_stash_within(args, 60, said, sizeof said), 0, "%s", said);
    cr_assert_eq(test_wait(s->pid), 0);
    FILE *f = fopen(s->log, "r");
    cr_assert_not_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    fclose(f);
    stash_arena_destroy(s->name, NULL);
    test_remove_dir(s->dir);
}

/* Whether the log has a line with what in it. */
static bool logged(const served *s, const char *what)
{
    char line[1024];
    bool found = false;
    FILE *f = fopen(s->log, "r");
    while (f && !found && fgets(line, sizeof line, f)) found = strstr(line, what) != NULL;
    if (f) fclose(f);
    return found;
}

/* Waits up to a minute for a line with what. */
static void await_logged(const served *s, const char *what)
{
    for (int i = 0; i < 6000 && !logged(s, what); i++) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    cr_assert(logged(s, what), "no line with '%s' in %s", what, s->log);
}

/* A worker that joins the arena and dies without leaving: the service
 * logs its death as a warning. */
static int join_and_die(void *arg)
{
    stash_worker *w;
    return stash_worker_open(arg, NULL, &w) == 0 ? 0 : 1;
}

/* The priority a line must carry for the level word it holds. */
static const char *priority_of(const char *line)
{
    if (strstr(line, " ERROR ")) return "<3>";
    if (strstr(line, " WARN ")) return "<4>";
    return "<6>";
}

Test(serve_log, each_text_line_carries_its_level_as_a_syslog_priority_for_the_journal,
     .timeout = 180)
{
    served s;
    serve(&s, "@log", "");
    pid_t worker = test_fork(join_and_die, s.name);
    cr_assert_eq(test_wait(worker), 0, "the worker could not join");
    await_logged(&s, "died");
    /* A checkpoint that a dead worker fails: an error. */
    char args[128], said[4096];
    snprintf(args, sizeof args, "checkpoint %s --timeout 30s", s.name);
    cr_assert_eq(test_run_stash_within(args, 60, said, sizeof said), 1, "%s", said);
    await_logged(&s, "ERROR");
    static char log[1 << 16];
    stop(&s, log, sizeof log);

    int seen[3] = {0};
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
        const char *want = priority_of(line);
        cr_assert(strncmp(line, want, 3) == 0, "'%s' does not start with %s", line, want);
        /* journald reads the prefix and no more: the line is the usual one after it. */
        cr_assert(line[3] >= '0' && line[3] <= '9', "'%s'", line);
        seen[want[1] == '6' ? 0 : want[1] == '4' ? 1 : 2]++;
    }
    cr_assert(seen[0] && seen[1] && seen[2], "INFO %d, WARN %d, ERROR %d lines", seen[0], seen[1],
              seen[2]);
}

Test(serve_log, lines_carry_no_priority_where_stdout_is_not_the_journal, .timeout = 120)
{
    /* No JOURNAL_STREAM, one that names another file (/dev/null: a journal
     * stream inherited by a service that was redirected), and a malformed one. */
    struct stat null;
    cr_assert_eq(stat("/dev/null", &null), 0);
    char other[64];
    snprintf(other, sizeof other, "%llu:%llu", (unsigned long long)null.st_dev,
             (unsigned long long)null.st_ino);
    const char *streams[] = {NULL, other, "12:34x", ""};
    for (size_t i = 0; i < sizeof streams / sizeof streams[0]; i++) {
        served s;
        serve(&s, streams[i], "");
        static char log[1 << 16];
        stop(&s, log, sizeof log);
        cr_assert(strstr(log, "INFO service: stopped"), "%s", log);
        for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n"))
            cr_assert(line[0] >= '0' && line[0] <= '9', "JOURNAL_STREAM=%s: '%s'",
                      streams[i] ? streams[i] : "(none)", line);
    }
}

Test(serve_log, json_lines_stay_json_for_the_journal, .timeout = 120)
{
    served s;
    serve(&s, "@log", "--log-format json");
    static char log[1 << 16];
    stop(&s, log, sizeof log);
    cr_assert(strstr(log, "\"message\": \"stopped\""), "%s", log);
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n"))
        cr_assert(line[0] == '{', "'%s'", line);
}
