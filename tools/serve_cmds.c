/* SPDX-License-Identifier: MIT */
/*
 * serve_cmds.c: `stash serve`, `stash checkpoint` and `stash stop`: the
 * persistence engine as a process, and the control commands that reach it
 * through the arena's control block.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <syslog.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "include/stash.h"
#include "tools/tools.h"

/* Whether stdout is a stream to the journal, as systemd's JOURNAL_STREAM
 * names it (its device and inode, "DEV:INO"): set once before the first
 * line (systemd.exec(5)). Then each text line starts with its syslog
 * priority, "<3>", which journald takes as the entry's priority and
 * removes (sd-daemon(3)); a stdout redirected elsewhere does not match. */
static bool to_journal;

static bool stdout_is_journal(void)
{
    const char *env = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    char end;
    if (!env || sscanf(env, "%llu:%llu%c", &dev, &ino, &end) != 2) return false;
    return fstat(STDOUT_FILENO, &st) == 0 && st.st_dev == (dev_t)dev && st.st_ino == (ino_t)ino;
}

static int syslog_priority(stash_log_level level)
{
    return level == STASH_LOG_ERROR ? LOG_ERR : level == STASH_LOG_WARN ? LOG_WARNING : LOG_INFO;
}

/* The level of a line as the library writes it: the word after its date
 * and time ("2026-12-04 10:15:02.345 WARN worker 3: ..."). */
static stash_log_level line_level(const char *line)
{
    const char *word = strchr(line, ' ');
    word = word ? strchr(word + 1, ' ') : NULL;
    if (!word) return STASH_LOG_INFO;
    word++;
    for (stash_log_level l = STASH_LOG_WARN; l <= STASH_LOG_ERROR; l++) {
        size_t n = strlen(stash_log_level_name(l));
        if (strncmp(word, stash_log_level_name(l), n) == 0 && word[n] == ' ') return l;
    }
    return STASH_LOG_INFO;
}

/* The service's events on stdout: a line as the library writes it, or
 * with --log-format json one object a line. */
static void log_text(void *ctx, const char *line)
{
    (void)ctx;
    if (to_journal) printf("<%d>", syslog_priority(line_level(line)));
    puts(line);
    fflush(stdout);
}

static void log_json(void *ctx, const stash_log_record *r)
{
    (void)ctx;
    time_t sec = (time_t)(r->time_ns / 1000000000u);
    struct tm tm;
    char when[32];
    gmtime_r(&sec, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    printf("{\"time\": \"%s.%03uZ\", \"level\": \"%s\", \"subject\": ", when,
           (unsigned)(r->time_ns / 1000000u % 1000u), stash_log_level_name(r->level));
    tool_json_string(r->subject);
    printf(", \"message\": ");
    tool_json_string(r->message);
    printf("}\n");
    fflush(stdout);
}

/* A line of serve's own (the service's subject), in the chosen format. */
static void log_own(bool json, const char *message)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    stash_log_record r = {(uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec, STASH_LOG_INFO,
                          "service", message};
    if (json) {
        log_json(NULL, &r);
        return;
    }
    struct tm tm;
    char when[32];
    localtime_r(&ts.tv_sec, &tm);
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    if (to_journal) printf("<%d>", syslog_priority(r.level));
    printf("%s.%03ld %s service: %s\n", when, ts.tv_nsec / 1000000, stash_log_level_name(r.level),
           message);
    fflush(stdout);
}

/* Raises the soft limit on descriptors to the hard one, which any process
 * may: a checkpoint opens files while the metrics server and the workers
 * hold descriptors, and the soft limit (1,024 by default) is there for
 * programs that use select(), which the service does not. */
static void raise_descriptor_limit(void)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur >= r.rlim_max) return;
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
}

/* The options of stash serve and whether each takes a value: the names a
 * config line may give, and which of the command line's are flags. */
typedef struct serve_option {
    const char *name;
    bool value;
} serve_option;

static const serve_option serve_options[] = {
    {"--storage", true},
    {"--dir", true},
    {"--interval", true},
    {"--min-pause", true},
    {"--timeout", true},
    {"--retain", true},
    {"--incremental", false},
    {"--full-every", true},
    {"--lz4", false},
    {"--memory-cap", true},
    {"--backend", true},
    {"--lmdb-dir", true},
    {"--path", true},
    {"--size", true},
    {"--max-parallelism", true},
    {"--restore", true},
    {"--start-empty", false},
    {"--lazy-restore", false},
    {"--log-format", true},
    {"--metrics", true},
    {"--pool", true},
    {"--ceph-conf", true},
    {"--ceph-id", true},
    {"--job", true},
    {"--ceph-timeout", true},
    {"--storage-timeout", true},
    {"--s3-endpoint", true},
    {"--s3-region", true},
    {"--s3-credentials", true},
    {"--s3-profile", true},
    {"--s3-part-size", true},
    {"--host", true},
    {"--workers", true},
    {"--job-parallelism", true},
    {"--lease", true},
};

/* The option called name (without its dashes), or NULL. */
static const serve_option *serve_option_find(const char *name)
{
    for (size_t i = 0; i < sizeof serve_options / sizeof serve_options[0]; i++)
        if (strcmp(serve_options[i].name + 2, name) == 0) return &serve_options[i];
    return NULL;
}

/* The options of a config file and the command line, as one argv: argv[0],
 * the file's, then the command line's but --config FILE. line[i] is the
 * file's line that gave argument i, 0 for the command line's; the file's
 * option names are those of serve_options, never its own bytes. */
typedef struct serve_argv {
    int argc;
    char **argv;
    unsigned *line;
    char *text; /* the file's bytes, which values point into */
    const char *path;
} serve_argv;

static void serve_argv_free(serve_argv *v)
{
    free(v->argv);
    free(v->line);
    free(v->text);
}

/* A config is a few dozen lines: a larger file is not one. */
#define CONFIG_MAX_BYTES 65536

/* Whether the config file path, of st, may be read; prints why not. Its
 * options say where the service writes and what it serves, so it is read
 * as the ssh client reads its own: a regular file, owned by this user or
 * root, that no one else may write. */
static bool config_acceptable(const char *path, const struct stat *st)
{
    static const struct {
        mode_t type;
        const char *what;
    } kinds[] = {{S_IFDIR, "a directory"},
                 {S_IFCHR, "a character device"},
                 {S_IFBLK, "a block device"},
                 {S_IFIFO, "a FIFO"},
                 {S_IFSOCK, "a socket"}};
    if (!S_ISREG(st->st_mode)) {
        const char *what = "something";
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
            if ((st->st_mode & S_IFMT) == kinds[i].type) what = kinds[i].what;
        fprintf(stderr, "stash serve: config %s: %s, not a regular file\n", path, what);
        return false;
    }
    if (st->st_uid != 0 && st->st_uid != geteuid()) {
        fprintf(stderr,
                "stash serve: config %s: owned by uid %u, neither this user (uid %u) nor root\n",
                path, (unsigned)st->st_uid, (unsigned)geteuid());
        return false;
    }
    if (st->st_mode & (S_IWGRP | S_IWOTH)) {
        fprintf(stderr,
                "stash serve: config %s: writable by %s (mode %04o): another user could choose "
                "the service's options\n",
                path, st->st_mode & S_IWOTH ? "others" : "its group",
                (unsigned)(st->st_mode & 07777));
        return false;
    }
    if (st->st_size > CONFIG_MAX_BYTES) {
        fprintf(stderr, "stash serve: config %s: %lld bytes, more than %d\n", path,
                (long long)st->st_size, CONFIG_MAX_BYTES);
        return false;
    }
    return true;
}

/* Reads the config file path into *text, NUL-terminated, *len its bytes.
 * Returns 0, or prints why not and returns 2. */
static int config_load(const char *path, char **text, size_t *len)
{
    /* O_NONBLOCK: opening a FIFO would wait for a writer. What is checked is
     * what was opened, so nothing can be swapped in between. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        fprintf(stderr, "stash serve: config %s: %s\n", path, strerror(errno));
        if (fd >= 0) close(fd);
        return 2;
    }
    char *buf = config_acceptable(path, &st) ? malloc(CONFIG_MAX_BYTES + 2) : NULL;
    if (!buf) {
        close(fd);
        return 2;
    }
    /* Up to a byte more than a config may hold, which a file that grew
     * since fstat would give. */
    size_t n = 0;
    ssize_t got = 0;
    while (n <= CONFIG_MAX_BYTES && (got = read(fd, buf + n, CONFIG_MAX_BYTES + 1 - n)) > 0)
        n += (size_t)got;
    int err = got < 0 ? errno : 0;
    close(fd);
    *text = buf;
    buf[n] = 0;
    if (err || n > CONFIG_MAX_BYTES) {
        fprintf(stderr, "stash serve: config %s: %s\n", path,
                err ? strerror(err) : "more than 65536 bytes");
        return 2;
    }
    const char *nul = memchr(buf, 0, n);
    if (nul) {
        unsigned line = 1;
        for (const char *c = buf; c < nul; c++) line += *c == '\n';
        fprintf(stderr, "stash serve: config %s line %u: a NUL byte, which no text holds\n", path,
                line);
        return 2;
    }
    *len = n;
    return 0;
}

/* Adds the lines of the config file's text (`option value`, `option =
 * value` or `option`; # starts a comment) to v. Returns 0, or prints which
 * line is wrong and returns 2; never what the line holds, since the file
 * may be another one than a config (a link to a secret). */
static int config_parse(serve_argv *v)
{
    char *p = v->text;
    for (unsigned no = 1; p; no++) {
        char *end = strchr(p, '\n');
        if (end) *end = 0;
        char *hash = strchr(p, '#');
        if (hash) *hash = 0;
        char *key = p + strspn(p, " \t\r");
        p = end ? end + 1 : NULL;
        if (!*key) continue;
        size_t klen = strcspn(key, " \t\r=");
        char *val = key + klen;
        val += strspn(val, " \t\r");
        if (*val == '=') val += 1 + strspn(val + 1, " \t\r");
        size_t vlen = strlen(val);
        while (vlen && strchr(" \t\r", val[vlen - 1])) val[--vlen] = 0;
        key[klen] = 0;
        const serve_option *opt = klen ? serve_option_find(key) : NULL;
        const char *why = !klen                        ? "a value without an option"
                          : key[0] == '-'              ? "an option is written without its dashes"
                          : strcmp(key, "config") == 0 ? "config is not an option here"
                          : !opt                       ? "unknown option"
                          : opt->value && !*val        ? "needs a value"
                          : !opt->value && *val        ? "takes no value"
                                                       : NULL;
        if (why) {
            /* The option's name where it is one of serve_options. */
            fprintf(stderr, "stash serve: config %s line %u: %s%s%s\n", v->path, no,
                    opt ? opt->name + 2 : "", opt ? " " : "", why);
            return 2;
        }
        v->line[v->argc] = no;
        v->argv[v->argc++] = (char *)opt->name;
        if (*val) {
            v->line[v->argc] = no;
            v->argv[v->argc++] = val;
        }
    }
    return 0;
}

/* Reads the file of --config FILE into v ahead of the command line.
 * Returns 0, or prints what is wrong and returns 2. */
static int read_config(int argc, char **argv, serve_argv *v)
{
    *v = (serve_argv){0};
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--config") == 0) v->path = argv[i + 1];
    size_t len = 0;
    if (v->path && config_load(v->path, &v->text, &len)) return 2;
    /* At most two arguments a line, plus the command line's. */
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += v->text[i] == '\n';
    size_t cap = 2 * lines + (size_t)argc + 1;
    v->argv = calloc(cap, sizeof *v->argv);
    v->line = calloc(cap, sizeof *v->line);
    if (!v->argv || !v->line) return 2;
    v->argv[v->argc++] = argv[0];
    if (v->text && config_parse(v)) return 2;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
            i++;
            continue;
        }
        v->argv[v->argc++] = argv[i];
    }
    return 0;
}

static int serve(int argc, char **argv, const unsigned *line, const char *config,
                 const char *usage);

int tool_serve(int argc, char **argv)
{
    static const char usage[] =
        "usage: stash serve NAME [--storage fs|memory|rados|URL] [--dir DIR]\n"
        "                        [--interval DURATION]\n"
        "                        [--min-pause DURATION] [--timeout DURATION] [--retain K]\n"
        "                        [--incremental] [--full-every M] [--lz4] [--memory-cap SIZE]\n"
        "                        [--backend heap|lmdb] [--lmdb-dir DIR] [--path FILE]\n"
        "                        [--size SIZE] [--max-parallelism N] [--restore CHECKPOINT]\n"
        "                        [--start-empty] [--lazy-restore] [--log-format text|json]\n"
        "                        [--metrics [ADDR]:PORT] [--config FILE] [--pool P]\n"
        "                        [--ceph-conf FILE] [--ceph-id ID] [--job JOB]\n"
        "                        [--ceph-timeout DURATION] [--storage-timeout DURATION]\n"
        "                        [--s3-endpoint URL] [--s3-region REGION]\n"
        "                        [--s3-credentials FILE] [--s3-profile PROFILE]\n"
        "                        [--s3-part-size SIZE]\n"
        "                        [--host HOST --workers A-B --job-parallelism P]\n"
        "                        [--lease DURATION]\n"
        "Runs the persistence engine of the arena NAME until SIGTERM, SIGINT or `stash stop`.\n"
        "An existing arena is reattached; a missing one is created (SIZE bytes, N key\n"
        "groups, keyed state in the arena (heap) or in LMDB environments in --lmdb-dir,\n"
        "NAME.lmdb of the user's private state directory by default) and restored from\n"
        "the newest complete checkpoint in DIR if there is one (or from the checkpoint or\n"
        "savepoint directory CHECKPOINT with --restore); if DIR holds checkpoints none of\n"
        "which can be used, it refuses to start, naming each, unless --start-empty. With\n"
        "--lazy-restore a new arena serves at once: each key group (lmdb: its environment)\n"
        "is restored when first touched (whoever touches it waits for that one alone) or\n"
        "when a background pass reaches it; a checkpoint taken meanwhile copies the blocks\n"
        "of those not back at its cut. A damaged block found then makes the arena fall\n"
        "back to the newest checkpoint of DIR that restores whole, each worker told at its\n"
        "next barrier; with none, the service stops and exits 1. DIR must be writable: a\n"
        "directory of this user that no other user may write, reached through directories\n"
        "of root or this user (sticky where others may write) and links none but they made.\n"
        "Checkpoints go to DIR (fs, required) or NAME.checkpoints in the user's private\n"
        "directory in memory (memory: /run/stash for root, each at most SIZE of\n"
        "--memory-cap, 5M by default) or to the RADOS pool P of a Ceph cluster (rados: as\n"
        "objects JOB/chk-ID/..., JOB the arena's name unless\n"
        "--job, with a copy of the retained ones in DIR, required; the cluster as\n"
        "--ceph-conf and --ceph-id say, Ceph's defaults otherwise, each call failing\n"
        "after --ceph-timeout (10s, whole seconds); complete once\n"
        "JOB/latest names it, which a new arena restores), or to the storage URL names:\n"
        "file:DIR and memory: as fs and memory, rados://POOL/JOB as rados, and\n"
        "s3://BUCKET/PREFIX the objects PREFIX/chk-ID/... of an S3 bucket, with a copy in\n"
        "DIR as for rados (the service at --s3-endpoint, else $AWS_ENDPOINT_URL_S3 or\n"
        "$AWS_ENDPOINT_URL, else AWS in --s3-region, $AWS_REGION or us-east-1; keys from\n"
        "$AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY, else the [--s3-profile] section\n"
        "(default) of --s3-credentials, $AWS_SHARED_CREDENTIALS_FILE or\n"
        "~/.aws/credentials, never from the command line; files above --s3-part-size, 8M\n"
        "by default, in parts; each call failing after --storage-timeout, 10s, retried\n"
        "with backoff within it), every DURATION of --interval\n"
        "(none: only on `stash checkpoint`), one at a time, at least --min-pause apart; a\n"
        "checkpoint that a worker does not cut within --timeout (60s) fails. The newest K\n"
        "complete ones are kept (3). --incremental writes only what changed, with a full\n"
        "checkpoint every M (10). From the third failure in a row the interval doubles\n"
        "with each failure (at most 64 intervals) until one completes. One line is logged\n"
        "on stdout per event (a checkpoint, a worker that joins, leaves or dies): local\n"
        "date, time with milliseconds, level (INFO, WARN, ERROR), subject and message;\n"
        "--log-format json: one object a line (time in UTC, level, subject, message).\n"
        "--host makes the service HOST of a job that spans hosts (rados): its arena holds\n"
        "the key groups of workers A-B (\"0-1,4-5\") of the job's P; the host holding\n"
        "the lease on JOB/leader (--lease, 10s) triggers each checkpoint on every host\n"
        "every --interval, commits it once every worker's part is in or aborts it after\n"
        "--timeout; a host whose lease lapses is lost and a live one takes its workers\n"
        "over from the newest job checkpoint. A new arena restores its workers' key\n"
        "groups from the job's newest checkpoint, of any number of hosts and workers;\n"
        "with --restore rados://POOL/OTHER/job-ID the job's first start restores that\n"
        "job checkpoint or savepoint instead (every host the same; once the job has\n"
        "committed one of its own, its newest). Without --host a job checkpoint restores\n"
        "on one machine as one: --restore rados://POOL/JOB/job-ID, or rados://POOL/JOB.\n"
        "--metrics serves the metrics of `stash status --prom` at http://ADDR:PORT/metrics\n"
        "(?kg=1 adds each key group's bytes). ADDR is a numeric IPv4 address, [IPV6], or\n"
        "none (:PORT) for every IPv4 address, which anyone who reaches the host may\n"
        "scrape: 127.0.0.1:PORT keeps it to this host. PORT is 0 (a free one, which the\n"
        "log names) to 65535. It holds at most 32 connections, 4 per client address, and\n"
        "closes one idle for 5s.\n"
        "--config FILE reads options from FILE first, one a line as the flags without their\n"
        "dashes (`interval 2s`, `interval = 2s`, `incremental`; # starts a comment); the\n"
        "command line overrides them. FILE must be a regular file of at most 64 KiB (65536\n"
        "bytes), owned by this user or root, that no one else may write; an option that\n"
        "needs a value must have one on its line. A wrong line is named, never printed.\n"
        "Under systemd (Type=notify) it reports ready once it serves and stopping when it\n"
        "stops.\n"
        "DURATION: 500ms, 2s, 1m (a plain number is seconds). Options take their value as\n"
        "--opt VALUE or --opt=VALUE.\n";
    if (tool_wants_help(argc, argv)) {
        fputs(usage, stdout);
        return 0;
    }
    serve_argv v;
    if (read_config(argc, argv, &v)) {
        serve_argv_free(&v);
        return 2;
    }
    int rc = serve(v.argc, v.argv, v.line, v.path, usage);
    serve_argv_free(&v);
    return rc;
}

static int serve(int argc, char **argv, const unsigned *line, const char *config, const char *usage)
{
    const char *name = NULL, *metrics = NULL;
    struct sockaddr_storage metrics_addr;
    stash_arena_opts ao = {.sz = sizeof(stash_arena_opts)};
    stash_storage_opts so = {.sz = sizeof(stash_storage_opts)};
    stash_service_opts o = {
        .sz = sizeof(stash_service_opts), .arena = &ao, .storage_opts = &so, .log = log_text};
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL, *why = NULL;
        uint64_t n;
        const serve_option *opt = strncmp(a, "--", 2) == 0 ? serve_option_find(a + 2) : NULL;
        bool ok = true, takes = opt && opt->value;
        if (strcmp(a, "--incremental") == 0) {
            o.incremental = 1;
        } else if (strcmp(a, "--lz4") == 0) {
            o.lz4 = 1;
        } else if (strcmp(a, "--start-empty") == 0) {
            o.start_empty = 1;
        } else if (strcmp(a, "--lazy-restore") == 0) {
            o.lazy_restore = 1;
        } else if (a[0] != '-' && !name) {
            name = a;
        } else if (!opt || !val) {
            ok = false;
        } else if (strcmp(a, "--metrics") == 0) {
            ok = tool_metrics_address(val, &metrics_addr, &why) == 0;
            metrics = val;
        } else if (strcmp(a, "--log-format") == 0) {
            ok = strcmp(val, "text") == 0 || strcmp(val, "json") == 0;
            json = strcmp(val, "json") == 0;
        } else if (strcmp(a, "--storage") == 0 && strchr(val, ':')) {
            o.storage_url = val;
        } else if (strcmp(a, "--storage") == 0) {
            ok = strcmp(val, "fs") == 0 || strcmp(val, "memory") == 0 || strcmp(val, "rados") == 0;
            o.storage = strcmp(val, "memory") == 0  ? STASH_STORAGE_MEMORY
                        : strcmp(val, "rados") == 0 ? STASH_STORAGE_RADOS
                                                    : STASH_STORAGE_FS;
        } else if (strcmp(a, "--pool") == 0) {
            o.pool = val;
        } else if (strcmp(a, "--ceph-conf") == 0) {
            o.ceph_conf = so.ceph_conf = val;
        } else if (strcmp(a, "--ceph-id") == 0) {
            o.ceph_id = so.ceph_id = val;
        } else if (strcmp(a, "--s3-endpoint") == 0) {
            so.endpoint = val;
        } else if (strcmp(a, "--s3-region") == 0) {
            so.region = val;
        } else if (strcmp(a, "--s3-credentials") == 0) {
            so.credentials = val;
        } else if (strcmp(a, "--s3-profile") == 0) {
            so.profile = val;
        } else if (strcmp(a, "--s3-part-size") == 0) {
            ok = tool_parse_size(val, &so.part_bytes) == 0 && so.part_bytes >= (5u << 20) &&
                 so.part_bytes <= (5ull << 30);
        } else if (strcmp(a, "--job") == 0) {
            o.job = val;
        } else if (strcmp(a, "--ceph-timeout") == 0 || strcmp(a, "--storage-timeout") == 0) {
            ok = tool_parse_duration(val, &n) == 0 && n >= 1000 && n <= 3600000;
            o.ceph_timeout_ms = so.timeout_ms = (uint32_t)n;
        } else if (strcmp(a, "--host") == 0) {
            o.host = val;
        } else if (strcmp(a, "--workers") == 0) {
            o.workers = val;
        } else if (strcmp(a, "--job-parallelism") == 0) {
            ok = tool_parse_size(val, &n) == 0 && n > 0 && n <= STASH_MAX_WORKERS;
            o.job_parallelism = (uint32_t)n;
        } else if (strcmp(a, "--lease") == 0) {
            ok = tool_parse_duration(val, &n) == 0 && n >= 1000 && n <= 3600000;
            o.lease_ms = (uint32_t)n;
        } else if (strcmp(a, "--backend") == 0) {
            ok = strcmp(val, "heap") == 0 || strcmp(val, "lmdb") == 0;
            ao.backend = strcmp(val, "lmdb") == 0 ? STASH_BACKEND_LMDB : STASH_BACKEND_HEAP;
        } else if (strcmp(a, "--lmdb-dir") == 0) {
            ao.lmdb_dir = val;
        } else if (strcmp(a, "--dir") == 0) {
            o.dir = val;
        } else if (strcmp(a, "--restore") == 0) {
            o.restore = val;
        } else if (strcmp(a, "--path") == 0) {
            ao.path = val;
        } else if (strcmp(a, "--interval") == 0) {
            ok = tool_parse_duration(val, &o.interval_ms) == 0;
        } else if (strcmp(a, "--min-pause") == 0) {
            ok = tool_parse_duration(val, &o.min_pause_ms) == 0;
        } else if (strcmp(a, "--timeout") == 0) {
            ok = tool_parse_duration(val, &o.timeout_ms) == 0 && o.timeout_ms > 0;
        } else if (strcmp(a, "--retain") == 0) {
            ok = tool_parse_size(val, &n) == 0 && n > 0 && n <= 1000;
            o.retain = (uint32_t)n;
        } else if (strcmp(a, "--full-every") == 0) {
            ok = tool_parse_size(val, &n) == 0 && n > 0 && n <= 64;
            o.full_every = (uint32_t)n;
        } else if (strcmp(a, "--memory-cap") == 0) {
            ok = tool_parse_size(val, &o.memory_cap) == 0 && o.memory_cap > 0;
        } else if (strcmp(a, "--size") == 0) {
            ok = tool_parse_size(val, &ao.size) == 0;
        } else if (strcmp(a, "--max-parallelism") == 0) {
            ok = tool_parse_size(val, &n) == 0 && n > 0 && n <= STASH_MAX_MAX_PARALLELISM;
            ao.max_parallelism = (uint32_t)n;
        } else {
            ok = false;
        }
        /* A config line's option is a name of serve_options, its value is
         * not printed. */
        if (!ok && line[i] && why) {
            fprintf(stderr, "stash serve: config %s line %u: %s: %s\n", config, line[i], a + 2,
                    why);
            return 2;
        }
        if (!ok && line[i]) {
            fprintf(stderr, "stash serve: config %s line %u: bad value for %s\n", config, line[i],
                    a + 2);
            return 2;
        }
        if (!ok && why) {
            fprintf(stderr, "stash serve: %s %s: %s\n", a, val, why);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "stash serve: bad or incomplete argument '%s%s%s'\n%s", a,
                    takes && val ? " " : "", takes && val ? val : "", usage);
            return 2;
        }
        if (takes) i++;
    }
    if (!name) {
        fprintf(stderr, "stash serve: missing arena NAME\n%s", usage);
        return 2;
    }
    bool url_dir = o.storage_url && (strncmp(o.storage_url, "file:", 5) == 0 ||
                                     strcmp(o.storage_url, "memory:") == 0);
    if (o.storage != STASH_STORAGE_MEMORY && !o.dir && !url_dir) {
        fprintf(stderr, "stash serve: the %s storage needs --dir DIR\n%s",
                o.storage_url                      ? o.storage_url
                : o.storage == STASH_STORAGE_RADOS ? "rados"
                                                   : "fs",
                usage);
        return 2;
    }
    if (o.storage == STASH_STORAGE_RADOS && !o.pool && !o.storage_url) {
        fprintf(stderr, "stash serve: the rados storage needs --pool P\n%s", usage);
        return 2;
    }
    if (o.host && ((o.storage != STASH_STORAGE_RADOS && !o.storage_url) || !o.workers ||
                   !o.job_parallelism)) {
        fprintf(stderr,
                "stash serve: --host needs --storage rados (or rados://POOL/JOB), --workers "
                "A-B and --job-parallelism P\n%s",
                usage);
        return 2;
    }
    if (json) o.log = NULL, o.log_record = log_json;
    to_journal = !json && stdout_is_journal();
    raise_descriptor_limit();
    /* Blocked before the engine's thread starts, so that it inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigprocmask(SIG_BLOCK, &sigs, NULL);
    stash_service *svc;
    int rc = stash_service_start(name, &o, &svc);
    if (rc < 0) return tool_fail("serve", rc);
    stash_arena *a = NULL;
    tool_metrics_server *http = NULL;
    if (metrics) {
        char url[300], line_[400];
        rc = stash_arena_open(name, &ao, &a);
        if (rc == 0 && (rc = tool_metrics_serve(&metrics_addr, a, &http, url, sizeof url)) < 0)
            fprintf(stderr, "stash serve: --metrics %s: %s\n", metrics, strerror(-rc));
        else if (rc < 0)
            tool_fail("serve", rc);
        if (rc < 0) {
            stash_arena_close(a);
            stash_service_stop(svc);
            return 1;
        }
        snprintf(line_, sizeof line_, "metrics at %s", url);
        log_own(json, line_);
    }
    sd_notify(0, "READY=1\nSTATUS=serving");
    const struct timespec tick = {0, 200000000};
    int sig = -1, stopped = 0;
    while (sig < 0 && !(stopped = stash_service_stopped(svc)))
        sig = sigtimedwait(&sigs, NULL, &tick);
    sd_notify(0, "STOPPING=1");
    log_own(json, sig > 0       ? (sig == SIGTERM ? "SIGTERM: stopping" : "SIGINT: stopping")
                  : stopped < 0 ? "the engine stopped on a failure (its log says which)"
                                : "stop requested: stopping");
    tool_metrics_stop(http);
    stash_arena_close(a);
    stash_service_stop(svc);
    log_own(json, "stopped");
    return stopped < 0 ? 1 : 0;
}

/* Parses NAME [--path FILE] [--timeout DURATION] [--json]. */
typedef struct control_args {
    const char *name;
    stash_arena_opts opts;
    uint64_t timeout_ms;
    bool json;
    bool savepoint;
} control_args;

static int parse_control(int argc, char **argv, const char *usage, control_args *out)
{
    if (tool_wants_help(argc, argv)) {
        fputs(usage, stdout);
        return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--path") == 0 && val) {
            out->opts.path = argv[++i];
        } else if (strcmp(a, "--timeout") == 0 && val &&
                   tool_parse_duration(val, &out->timeout_ms) == 0) {
            i++;
        } else if (strcmp(a, "--json") == 0) {
            out->json = true;
        } else if (strcmp(a, "--savepoint") == 0) {
            out->savepoint = true;
        } else if (a[0] != '-' && !out->name) {
            out->name = a;
        } else {
            fprintf(stderr, "stash %s: bad or incomplete argument '%s'\n%s", argv[0], a, usage);
            return 2;
        }
    }
    if (!out->name) {
        fprintf(stderr, "stash %s: missing arena NAME\n%s", argv[0], usage);
        return 2;
    }
    return 0;
}

/* Prints a finished checkpoint or savepoint (its id and directory, or as
 * JSON with why it failed); returns the command's exit code. */
static int print_outcome(const char *what, const control_args *args, int rc,
                         const stash_checkpoint_info *info)
{
    if (rc < 0 && rc != STASH_EABORTED) return tool_fail(what, rc);
    if (args->json) {
        printf("{\"id\": %llu, \"status\": %d, \"savepoint\": %s, \"incremental\": %s, "
               "\"bytes\": %llu, "
               "\"duration_ns\": %llu, \"pause_ns\": %llu, \"%s\": ",
               (unsigned long long)info->id, info->status, info->savepoint ? "true" : "false",
               info->incremental ? "true" : "false", (unsigned long long)info->bytes,
               (unsigned long long)info->duration_ns, (unsigned long long)info->pause_ns,
               rc ? "error" : "path");
        tool_json_string(info->detail);
        printf("}\n");
    } else if (rc == 0) {
        printf("%s %llu %s\n", info->savepoint ? "savepoint" : "checkpoint",
               (unsigned long long)info->id, info->detail);
    }
    return rc ? tool_fail(what, rc) : 0;
}

int tool_checkpoint(int argc, char **argv)
{
    static const char usage[] =
        "usage: stash checkpoint NAME [--savepoint] [--path FILE] [--timeout DURATION] [--json]\n"
        "Asks the service of the arena NAME for a checkpoint and waits until it is complete\n"
        "(at most --timeout; none by default); prints its id and directory. --savepoint\n"
        "takes a savepoint: DIR/savepoint-ID, full and self-contained (restore it anywhere\n"
        "with stash serve --restore), never removed by retention. On a host of a job that\n"
        "spans hosts both are the whole job's (the leader's); a savepoint prints as\n"
        "rados://POOL/JOB/job-ID. Exit code 1 if it failed (the reason is printed), no\n"
        "service runs, or the time ran out.\n";
    control_args args = {.opts.sz = sizeof(stash_arena_opts)};
    int rc = parse_control(argc, argv, usage, &args);
    if (rc) return rc < 0 ? 0 : rc;
    stash_arena *a;
    rc = stash_arena_open(args.name, &args.opts, &a);
    if (rc < 0) return tool_fail("checkpoint", rc);
    stash_checkpoint_info info;
    rc = (args.savepoint ? stash_savepoint : stash_checkpoint)(a, args.timeout_ms, &info);
    stash_arena_close(a);
    return print_outcome("checkpoint", &args, rc, &info);
}

int tool_stop(int argc, char **argv)
{
    static const char usage[] =
        "usage: stash stop NAME [--savepoint [--json]] [--path FILE] [--timeout DURATION]\n"
        "Asks the service of the arena NAME to stop (a checkpoint in flight finishes or\n"
        "fails first) and waits until it has (at most --timeout; none by default).\n"
        "--savepoint takes a savepoint first, as `stash checkpoint --savepoint` does, with\n"
        "no checkpoint between it and the stop, and prints it; if it fails the service is\n"
        "not stopped (exit code 1). On a host of a job that spans hosts it is a savepoint\n"
        "of the whole job (printed as rados://POOL/JOB/job-ID, what --restore takes) and\n"
        "every host's service stops once it is committed. Workers are not stopped: what\n"
        "they write after the savepoint is in none.\n";
    control_args args = {.opts.sz = sizeof(stash_arena_opts)};
    int rc = parse_control(argc, argv, usage, &args);
    if (rc) return rc < 0 ? 0 : rc;
    stash_arena *a = NULL;
    rc = stash_arena_open(args.name, &args.opts, &a);
    if (rc == 0 && args.savepoint) {
        stash_checkpoint_info info = {0};
        rc = stash_stop_with_savepoint(a, args.timeout_ms, &info);
        /* A savepoint taken but a stop that timed out: both said. */
        int code = print_outcome("stop", &args, rc == -ETIMEDOUT && info.id ? 0 : rc, &info);
        stash_arena_close(a);
        return code ? code : rc < 0 ? tool_fail("stop", rc) : 0;
    }
    if (rc == 0) rc = stash_service_request_stop(a, args.timeout_ms);
    stash_arena_close(a);
    return rc < 0 ? tool_fail("stop", rc) : 0;
}
