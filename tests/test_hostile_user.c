/* SPDX-License-Identifier: MIT */
/*
 * test_hostile_user.c: another local user against stash. An attacker, a
 * user of its own, plants symbolic links, FIFOs, files and directories of
 * its own wherever stash creates, lists or removes, and floods /dev/shm with
 * names; then root and a second user (the victims) run stash's commands and
 * its Python module. Whatever was planted, a victim's files elsewhere (a
 * tree of files and another arena's lmdb environments) stay byte for byte
 * as they were, nothing planted is ever read as the victim's state, nothing
 * hangs, and every refusal names the path and why.
 *
 * The users are made once for the whole binary (useradd, as root) and
 * removed at its end; the kernel's own checks on links, FIFOs and files in
 * sticky directories (fs.protected_*) are off while it runs, so that what
 * is tested is stash's checks. Each command runs in a child process as its
 * user, in a process group of its own, and is killed (failing the test) if
 * it has not ended in time.
 */
#define _GNU_SOURCE /* setresuid, pipe2, memmem */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers.h"

#define ATTACKER_ENV "STASH_TEST_HOSTILE_ATTACKER"
#define VICTIM_ENV "STASH_TEST_HOSTILE_VICTIM"
#define SKIP_ENV "STASH_TEST_HOSTILE_SKIP"
#define NO_LINKS_ENV "STASH_TEST_HOSTILE_NO_LINKS"
#define LOCK_ENV "STASH_TEST_HOSTILE_LOCK"
#define LIMIT_S 20 /* a command still running after this long hangs */
#define ARENA "--size 8M --max-parallelism 4"

/* ---- the users, made once for the binary ---------------------------------- */

static const char *const protections[] = {"/proc/sys/fs/protected_symlinks",
                                          "/proc/sys/fs/protected_regular",
                                          "/proc/sys/fs/protected_fifos"};
static char found[3][16]; /* their values before: put back at the end */

static int shell(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int shell(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Removes user name with what stash kept for it in its private places. */
static void remove_user(const char *name)
{
    struct passwd *pw = getpwnam(name);
    if (pw)
        shell("rm -rf /dev/shm/stash-%u /var/tmp/stash-%u", (unsigned)pw->pw_uid,
              (unsigned)pw->pw_uid);
    shell("userdel -f %s >/dev/null 2>&1", name);
}

/* Users an earlier run that was killed left: their run's pid is gone. */
static void remove_stale_users(void)
{
    char stale[64][40];
    int n = 0;
    setpwent();
    for (struct passwd *pw; (pw = getpwent()) && n < 64;) {
        if (strncmp(pw->pw_name, "stashmal-", 9) != 0 && strncmp(pw->pw_name, "stashvic-", 9) != 0)
            continue;
        long pid = strtol(pw->pw_name + 9, NULL, 10);
        if (pid > 0 && kill((pid_t)pid, 0) < 0 && errno == ESRCH)
            snprintf(stale[n++], sizeof stale[0], "%s", pw->pw_name);
    }
    endpwent();
    for (int i = 0; i < n; i++) remove_user(stale[i]);
}

/* Turns the kernel's checks off (noting what they were); NULL, or why not. */
static const char *relax_protections(void)
{
    for (int i = 0; i < 3; i++) {
        FILE *f = fopen(protections[i], "r");
        if (!f || !fgets(found[i], sizeof found[i], f)) {
            if (f) fclose(f);
            return "cannot read fs.protected_* in /proc/sys/fs";
        }
        fclose(f);
        f = fopen(protections[i], "w");
        if (!f || fputs("0\n", f) < 0 || fclose(f) != 0) return "cannot set fs.protected_* to 0";
    }
    return NULL;
}

static void restore_protections(void)
{
    for (int i = 0; i < 3; i++) {
        if (!found[i][0]) continue;
        FILE *f = fopen(protections[i], "w");
        if (f) {
            fputs(found[i], f);
            fclose(f);
        }
    }
}

ReportHook(PRE_ALL)(struct criterion_test_set *set)
{
    (void)set;
    char mal[40], vic[40], lock[80];
    snprintf(mal, sizeof mal, "stashmal-%d", (int)getpid());
    snprintf(vic, sizeof vic, "stashvic-%d", (int)getpid());
    const char *why = NULL;
    if (geteuid() != 0)
        why = "not root: adding the attacker's and the victim's users needs root";
    else if (access("/usr/sbin/useradd", X_OK) != 0 || access("/usr/sbin/userdel", X_OK) != 0)
        why = "no /usr/sbin/useradd or userdel to add the attacker's and the victim's users";
    if (!why) {
        remove_stale_users();
        if (shell("useradd -M -s /usr/sbin/nologin %s && useradd -M -s /usr/sbin/nologin %s", mal,
                  vic) != 0)
            why = "useradd failed";
    }
    if (why) {
        setenv(SKIP_ENV, why, 1);
        return;
    }
    setenv(ATTACKER_ENV, mal, 1);
    setenv(VICTIM_ENV, vic, 1);
    /* The victim's private places are one per user: a test that plants
     * them holds this lock alone, the others share it. */
    snprintf(lock, sizeof lock, "/var/tmp/stash-hostile-%d.lock", (int)getpid());
    close(open(lock, O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
    setenv(LOCK_ENV, lock, 1);
    why = relax_protections();
    if (why) setenv(NO_LINKS_ENV, why, 1);
}

ReportHook(POST_ALL)(struct criterion_global_stats *stats)
{
    (void)stats;
    restore_protections();
    const char *mal = getenv(ATTACKER_ENV), *vic = getenv(VICTIM_ENV), *lock = getenv(LOCK_ENV);
    if (mal) remove_user(mal);
    if (vic) remove_user(vic);
    if (lock) unlink(lock);
}

/* ---- who runs what ----------------------------------------------------------- */

typedef struct who {
    char name[40];
    char tag[8]; /* in file names */
    uid_t uid;
    gid_t gid;
    mode_t umask; /* victims run with 0: the modes stash sets are its own */
} who;

static who root_u = {.name = "root", .tag = "root", .umask = 0};
static who mal = {.tag = "mal", .umask = 022};
static who vic = {.tag = "vic", .umask = 0};
static who *const victims[2] = {&root_u, &vic};

static char env_stash[600], env_python[600];
static char *child_env[] = {
    "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/", "LC_ALL=C", env_stash, env_python, NULL};

/* Takes on u's identity (in a child: for good). */
static void become(const who *u)
{
    unsetenv("XDG_RUNTIME_DIR");
    if (u->uid != 0 && (setgroups(0, NULL) < 0 || setresgid(u->gid, u->gid, u->gid) < 0 ||
                        setresuid(u->uid, u->uid, u->uid) < 0))
        _exit(126);
    umask(u->umask);
}

/* A command running as a user: its output (stdout and stderr) read as it
 * comes, its stdin a pipe or /dev/null. */
typedef struct proc {
    pid_t pid;
    int pidfd; /* readable once it has ended */
    int out;   /* -1 at its end */
    int in;    /* -1: none, or closed */
    char log[65536];
    size_t len;
    char cmd[2048];
} proc;

static void start_proc(proc *p, const who *u, bool input, const char *cmd)
{
    int o[2], i[2] = {-1, -1};
    cr_assert_eq(pipe2(o, O_CLOEXEC), 0);
    if (input) cr_assert_eq(pipe2(i, O_CLOEXEC), 0);
    snprintf(p->cmd, sizeof p->cmd, "%s", cmd);
    p->len = 0;
    p->log[0] = 0;
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork");
    if (pid == 0) {
        setpgid(0, 0);
        int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
        dup2(input ? i[0] : null, 0);
        dup2(o[1], 1);
        dup2(o[1], 2);
        become(u);
        /* After the change of user, which clears it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execle("/bin/sh", "sh", "-c", cmd, (char *)NULL, child_env);
        _exit(127);
    }
    setpgid(pid, pid);
    close(o[1]);
    if (input) close(i[0]);
    p->pid = pid;
    p->out = o[0];
    p->in = input ? i[1] : -1;
    p->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    cr_assert_geq(p->pidfd, 0, "pidfd_open: %s", strerror(errno));
}

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* Reads what p wrote until want appears in it (true), p's output ends, or
 * the deadline passes (false). */
static bool read_until(proc *p, const char *want, long deadline)
{
    while (p->out >= 0) {
        if (want && strstr(p->log, want)) return true;
        long left = deadline - now_ms();
        if (left <= 0) return false;
        struct pollfd pf = {.fd = p->out, .events = POLLIN};
        if (poll(&pf, 1, (int)left) <= 0) continue;
        char *at = p->log + p->len;
        size_t room = sizeof p->log - 1 - p->len;
        ssize_t n = read(p->out, room ? at : (char[256]){0}, room ? room : 256);
        if (n <= 0) {
            close(p->out);
            p->out = -1;
        } else if (room) {
            p->len += (size_t)n;
            p->log[p->len] = 0;
        }
    }
    return want && strstr(p->log, want);
}

/* Kills p's process group and reaps it. */
static void kill_proc(proc *p)
{
    kill(-p->pid, SIGKILL);
    test_wait(p->pid);
    if (p->out >= 0) close(p->out);
    if (p->in >= 0) close(p->in);
    close(p->pidfd);
    p->out = p->in = -1;
}

/* Waits for p to end (its stdin closed first) and returns its exit code
 * (128 + signal if killed); a command that has not ended within LIMIT_S
 * seconds is killed and fails the test. */
static int finish(proc *p)
{
    if (p->in >= 0) close(p->in);
    p->in = -1;
    long deadline = now_ms() + LIMIT_S * 1000L;
    read_until(p, NULL, deadline);
    struct pollfd pf = {.fd = p->pidfd, .events = POLLIN};
    long left = deadline - now_ms();
    if (p->out >= 0 || poll(&pf, 1, left > 0 ? (int)left : 0) != 1) {
        kill_proc(p);
        cr_assert_fail("hung for %d s: %s\n%s", LIMIT_S, p->cmd, p->log);
    }
    close(p->pidfd);
    return test_wait(p->pid);
}

/* Where a test says what the attacker planted, printed with every failure. */
static char planted[8192];
static size_t planted_len;

static proc last; /* the last command run(), its output in last.log */
static int last_rc;
static const char *last_who;

static int run(const who *u, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int run(const who *u, const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    start_proc(&last, u, false, cmd);
    last_who = u->name;
    return last_rc = finish(&last);
}

/* Runs the shell command as u, which must succeed. */
#define run_ok(u, ...)                                                                             \
    do {                                                                                           \
        int rc_ = run(u, __VA_ARGS__);                                                             \
        cr_assert_eq(rc_, 0, "as %s: %s: exit %d:\n%s\nplanted:\n%s", (u)->name, last.cmd, rc_,    \
                     last.log, planted);                                                           \
    } while (0)

/* Runs fn(arg) in a child process as u; returns what it returned. */
typedef struct as_call {
    const who *u;
    int (*fn)(void *);
    void *arg;
} as_call;

static int call_as(void *arg)
{
    as_call *c = arg;
    become(c->u);
    return c->fn(c->arg);
}

static int as_user(const who *u, int (*fn)(void *), void *arg)
{
    as_call c = {u, fn, arg};
    return test_wait(test_fork(call_as, &c));
}

/* ---- the places --------------------------------------------------------------- */

static char base[96];       /* /var/tmp/stash-hostile-PID: root's, 0755 */
static char open_dir[128];  /* root's 1777 directory a link may lead to: stays empty */
static char shared[128];    /* root's 1777 directory: where users meet */
static char mal_area[128];  /* the attacker's own directory */
static char evil[160];      /* the attacker's savepoint, id 1: key k is "evil" */
static char area[2][128];   /* each victim's own directory */
static char sent[2][160];   /* each victim's tree of files */
static char l1[2][96];      /* each victim's other arena (lmdb) */
static char l1dir[2][160];  /* and its lmdb directory, with environments */
static char good[2][160];   /* each victim's savepoint, id 1: key k is "good" */
static char *sentinel_then; /* the listing every scenario must leave as it was */
static bool links_skipped;
static int lock_fd = -1;
static char why_link[64], why_owner[64]; /* the reasons stash gives */

static void user_of(who *u, const char *env)
{
    const char *name = getenv(env);
    cr_assert_not_null(name, "%s unset", env);
    struct passwd *pw = getpwnam(name);
    cr_assert_not_null(pw, "no user %s", name);
    snprintf(u->name, sizeof u->name, "%s", name);
    u->uid = pw->pw_uid;
    u->gid = pw->pw_gid;
}

/* The listing of every entry under the sentinel's roots: path, mode,
 * owner, size, inode, change time, and a hash of its bytes or of where it
 * links to. */
static FILE *listing;

static int list_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)type, (void)ftw;
    fprintf(listing, "%s %o %u:%u %lld ino %llu ctime %lld.%09ld", path, (unsigned)st->st_mode,
            (unsigned)st->st_uid, (unsigned)st->st_gid, (long long)st->st_size,
            (unsigned long long)st->st_ino, (long long)st->st_ctim.tv_sec, st->st_ctim.tv_nsec);
    if (S_ISREG(st->st_mode)) {
        int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        XXH3_state_t *h = XXH3_createState();
        XXH3_64bits_reset(h);
        char buf[65536];
        for (ssize_t n; fd >= 0 && (n = read(fd, buf, sizeof buf)) > 0;)
            XXH3_64bits_update(h, buf, (size_t)n);
        fprintf(listing, " bytes %016llx", (unsigned long long)XXH3_64bits_digest(h));
        XXH3_freeState(h);
        if (fd >= 0) close(fd);
    } else if (S_ISLNK(st->st_mode)) {
        char to[4096];
        ssize_t n = readlink(path, to, sizeof to - 1);
        fprintf(listing, " -> %.*s", n > 0 ? (int)n : 0, to);
    }
    fputc('\n', listing);
    return 0;
}

/* The listing of every entry under the n roots. */
static char *listing_of(const char *const *roots, size_t n)
{
    char *text = NULL;
    size_t len = 0;
    listing = open_memstream(&text, &len);
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (lstat(roots[i], &st) < 0)
            fprintf(listing, "%s: absent\n", roots[i]);
        else
            nftw(roots[i], list_entry, 16, FTW_PHYS);
    }
    fclose(listing);
    return text;
}

static char *sentinel_listing(void)
{
    char arena[2][160];
    for (int v = 0; v < 2; v++) snprintf(arena[v], sizeof arena[v], "/dev/shm/stash.%s", l1[v]);
    const char *roots[] = {open_dir, sent[0], sent[1], l1dir[0], l1dir[1], arena[0], arena[1]};
    return listing_of(roots, sizeof roots / sizeof roots[0]);
}

/* The victims' files elsewhere are as they were. */
static void sentinel_intact(const char *after)
{
    char *now = sentinel_listing();
    cr_assert(strcmp(now, sentinel_then) == 0,
              "after %s, the victims' files changed:\nbefore:\n%s\nafter:\n%s\nplanted:\n%s", after,
              sentinel_then, now, planted);
    free(now);
}

/* A victim's other arena: lmdb, its environments in its area, holding
 * keys. Returns 0 or the step that failed. */
static int make_other_arena(void *arg)
{
    int v = (int)(intptr_t)arg;
    stash_arena *a;
    stash_worker *w;
    stash_state *s;
    if (stash_arena_create(l1[v],
                           &(stash_arena_opts){.sz = sizeof(stash_arena_opts),
                                               .size = 8u << 20,
                                               .max_parallelism = 4,
                                               .backend = STASH_BACKEND_LMDB,
                                               .lmdb_dir = l1dir[v]},
                           &a) != 0)
        return 1;
    if (stash_worker_open(l1[v],
                          &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1},
                          &w) != 0)
        return 2;
    if (stash_state_get(
            w,
            &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
            &s) != 0)
        return 3;
    for (uint64_t k = 0; k < 64; k++)
        if (stash_key_set(w, &k, sizeof k) != 0 || stash_value_put(s, &k, sizeof k) != 0) return 4;
    stash_worker_close(w);
    stash_arena_close(a);
    return 0;
}

static const char lines_of[] = "{\"snapshot\": 1, \"max_parallelism\": 4}\n"
                               "{\"declare\": \"v\", \"kind\": \"value\"}\n"
                               "{\"state\": \"v\", \"kind\": \"value\", \"key\": \"k\", "
                               "\"value\": \"%s\"}\n";

static void write_lines(const char *value)
{
    char path[160];
    snprintf(path, sizeof path, "%s/lines-%s", base, value);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, lines_of, value);
    fclose(f);
}

static void setup(void)
{
    const char *skip = getenv(SKIP_ENV);
    if (skip) cr_skip_test("%s", skip);
    if (!getenv(ATTACKER_ENV)) cr_skip_test("the users were not made (run the whole binary)");
    user_of(&mal, ATTACKER_ENV);
    user_of(&vic, VICTIM_ENV);
    links_skipped = getenv(NO_LINKS_ENV) != NULL;
    snprintf(why_link, sizeof why_link, "symbolic link owned by user %u", (unsigned)mal.uid);
    snprintf(why_owner, sizeof why_owner, "owned by user %u", (unsigned)mal.uid);
    snprintf(env_stash, sizeof env_stash, "S=%s", STASH_BIN);
    const char *tools = strstr(STASH_BIN, "/tools/stash");
    snprintf(env_python, sizeof env_python, "PYTHONPATH=%.*s/python",
             tools ? (int)(tools - STASH_BIN) : 0, STASH_BIN);
    planted_len = 0;
    planted[0] = 0;

    snprintf(base, sizeof base, "/var/tmp/stash-hostile-%d", (int)getpid());
    snprintf(open_dir, sizeof open_dir, "%s/open", base);
    snprintf(shared, sizeof shared, "%s/shared", base);
    snprintf(mal_area, sizeof mal_area, "%s/mal", base);
    snprintf(evil, sizeof evil, "%s/evil", mal_area);
    cr_assert_eq(
        shell("rm -rf %s && mkdir -m 755 %s && mkdir -m 1777 %s %s", base, base, open_dir, shared),
        0);
    write_lines("evil");
    write_lines("good");
    cr_assert_eq(shell("install -d -m 755 -o %s %s", mal.name, mal_area), 0);
    run_ok(&mal, "$S snapshot load %s --format text --size 8M < %s/lines-evil && chmod -R a+rX %s",
           evil, base, evil);
    for (int v = 0; v < 2; v++) {
        const who *u = victims[v];
        snprintf(area[v], sizeof area[v], "%s/%s", base, u->tag);
        snprintf(sent[v], sizeof sent[v], "%s/sent", area[v]);
        snprintf(l1dir[v], sizeof l1dir[v], "%s/l1.lmdb", area[v]);
        snprintf(good[v], sizeof good[v], "%s/good", area[v]);
        snprintf(l1[v], sizeof l1[v], "%s", test_arena_name(v ? "hu-l1v" : "hu-l1r"));
        cr_assert_eq(shell("install -d -m 755 -o %s %s", u->name, area[v]), 0);
        run_ok(u,
               "umask 022 && mkdir -p %s/sub/deeper && echo one > %s/a && "
               "head -c 5000 /dev/urandom > %s/b && echo three > %s/sub/c && "
               "echo four > %s/sub/deeper/d",
               sent[v], sent[v], sent[v], sent[v], sent[v]);
        cr_assert_eq(as_user(u, make_other_arena, (void *)(intptr_t)v), 0, "%s's other arena",
                     u->name);
        run_ok(u, "$S snapshot load %s --format text --size 8M < %s/lines-good", good[v], base);
    }
    sentinel_then = sentinel_listing();
    cr_assert(strstr(sentinel_then, "kg-00000.mdb "), "no environments in the lmdb directory:\n%s",
              sentinel_then);
}

static proc servers[4];
static int nservers;
static bool private_alone;                /* this test has the victim's private places alone */
static unsigned flood_first, flood_count; /* the pids whose names were flooded */

static void remove_flood(void);

static void teardown(void)
{
    for (int i = 0; i < nservers; i++)
        if (servers[i].pid > 0) kill_proc(&servers[i]);
    nservers = 0;
    if (!base[0]) return;
    remove_flood();
    if (private_alone)
        shell("rm -rf /dev/shm/stash-%u /var/tmp/stash-%u", (unsigned)vic.uid, (unsigned)vic.uid);
    char pid[32];
    snprintf(pid, sizeof pid, "-%d-", (int)getpid());
    shell("rm -rf %s /dev/shm/stash.t-*%s* /run/stash/t-*%s* /var/lib/stash/t-*%s* "
          "/var/tmp/stash.t-*%s* /dev/shm/stash-%u/t-*%s* /var/tmp/stash-%u/t-*%s*",
          base, pid, pid, pid, pid, (unsigned)vic.uid, pid, (unsigned)vic.uid, pid);
    free(sentinel_then);
}

TestSuite(hostile_user, .init = setup, .fini = teardown, .timeout = 110);

/* The victim's private places (/dev/shm/stash-UID, /var/tmp/stash-UID) are
 * shared by the tests that run at once; a test that plants them has them
 * alone. */
static void share_private_places(void)
{
    lock_fd = open(getenv(LOCK_ENV), O_RDONLY | O_CLOEXEC);
    cr_assert_geq(lock_fd, 0);
    cr_assert_eq(flock(lock_fd, LOCK_SH), 0);
}

static void take_private_places(void)
{
    lock_fd = open(getenv(LOCK_ENV), O_RDONLY | O_CLOEXEC);
    cr_assert_geq(lock_fd, 0);
    cr_assert_eq(flock(lock_fd, LOCK_EX), 0);
    private_alone = true;
}

/* Removes the victim's private places (which it makes again when it
 * needs them), or what was planted there. */
static void clear_private_places(void)
{
    cr_assert_eq(
        shell("rm -rf /dev/shm/stash-%u /var/tmp/stash-%u", (unsigned)vic.uid, (unsigned)vic.uid),
        0);
    planted_len = 0;
    planted[0] = 0;
}

/* ---- what the attacker plants --------------------------------------------------- */

enum {
    LINK_TO_SENTINEL,   /* to the victim's tree of files */
    LINK_TO_VICTIM_DIR, /* to the victim's other arena's lmdb directory */
    LINK_TO_OPEN_DIR,   /* to a directory of root's anyone may write */
    A_FIFO,
    A_DIR_OF_ITS_OWN, /* holding a checkpoint chk-1 whose key k is "evil" */
    A_FILE_OF_ITS_OWN,
    AN_OPEN_DIR_ON_THE_WAY, /* a 1777 directory of its own, stash's path inside */
    KINDS
};

static const char *const kind_name[KINDS] = {
    "a symbolic link to the victim's files",
    "a symbolic link to the victim's other arena's lmdb directory",
    "a symbolic link to root's 1777 directory",
    "a FIFO",
    "a directory of its own holding a checkpoint chk-1",
    "a file of its own",
    "a 1777 directory of its own on the way",
};

static bool is_link(int kind)
{
    return kind <= LINK_TO_OPEN_DIR;
}

/* Whether the kind can be planted here: links only where the kernel lets
 * stash see them. */
static bool plantable(int kind)
{
    if (is_link(kind) && links_skipped) {
        cr_log_warn("%s: skipped: %s", kind_name[kind], getenv(NO_LINKS_ENV));
        return false;
    }
    return true;
}

static void note_plant(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note_plant(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(planted + planted_len, sizeof planted - planted_len, fmt, ap);
    va_end(ap);
    if (n > 0)
        planted_len =
            planted_len + (size_t)n < sizeof planted ? planted_len + (size_t)n : sizeof planted - 1;
}

/* Plants kind at path as the attacker, against victim v; returns the path
 * stash is given (inside, for a directory on the way), in out. */
static const char *plant(int kind, const char *path, int v, char *out, size_t cap)
{
    snprintf(out, cap, "%s", path);
    switch (kind) {
    case LINK_TO_SENTINEL:
        run_ok(&mal, "ln -s %s %s", sent[v], path);
        break;
    case LINK_TO_VICTIM_DIR:
        run_ok(&mal, "ln -s %s %s", l1dir[v], path);
        break;
    case LINK_TO_OPEN_DIR:
        run_ok(&mal, "ln -s %s %s", open_dir, path);
        break;
    case A_FIFO:
        run_ok(&mal, "mkfifo -m 666 %s", path);
        break;
    case A_DIR_OF_ITS_OWN:
        run_ok(&mal, "mkdir %s && cp -r %s %s/chk-1 && chmod -R a+rX %s", path, evil, path, path);
        break;
    case A_FILE_OF_ITS_OWN:
        run_ok(&mal, "echo evil > %s", path);
        break;
    case AN_OPEN_DIR_ON_THE_WAY:
        run_ok(&mal, "mkdir -m 1777 %s", path);
        snprintf(out, cap, "%s/inside", path);
        break;
    }
    note_plant("%s: %s (by user %u)\n", path, kind_name[kind], (unsigned)mal.uid);
    return out;
}

/* Removes what was planted at path (a link itself, never its target). */
static void unplant(const char *path)
{
    cr_assert_eq(shell("rm -rf %s", path), 0);
    planted_len = 0;
    planted[0] = 0;
}

/* Why stash refuses a directory of kind where one belongs. */
static const char *dir_refusal(int kind)
{
    if (is_link(kind)) return why_link;
    if (kind == A_FIFO || kind == A_FILE_OF_ITS_OWN) return "not a directory";
    return why_owner;
}

/* The last command failed (exited non-zero, not killed) and its message
 * named path and why. */
static void refused(const char *path, const char *why)
{
    cr_assert(last_rc != 0 && last_rc < 128, "as %s, exit %d (not a refusal): %s\n%s\nplanted:\n%s",
              last_who, last_rc, last.cmd, last.log, planted);
    cr_assert(strstr(last.log, path) && strstr(last.log, why),
              "as %s, the refusal does not name %s and why (%s): %s\n%s\nplanted:\n%s", last_who,
              path, why, last.cmd, last.log, planted);
}

/* ---- helpers of the scenarios ------------------------------------------------- */

/* Starts cmd (`stash serve` at its end) as u and returns once it serves;
 * fails the test with its output if it ends first or takes LIMIT_S
 * seconds. */
static proc *serve_as(const who *u, const char *cmd)
{
    proc *p = NULL;
    for (int i = 0; i < nservers && !p; i++)
        if (servers[i].pid == 0) p = &servers[i];
    if (!p) {
        cr_assert_lt(nservers, 4, "more than 4 services at once");
        p = &servers[nservers++];
    }
    start_proc(p, u, false, cmd);
    cr_assert(read_until(p, "INFO service: serving ", now_ms() + LIMIT_S * 1000L),
              "as %s, %s does not serve:\n%s\nplanted:\n%s", u->name, cmd, p->log, planted);
    return p;
}

/* Starts `stash serve` with args as u (serve_as). */
static proc *serve(const who *u, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static proc *serve(const who *u, const char *fmt, ...)
{
    char args[1024], cmd[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "exec $S serve %s", args);
    return serve_as(u, cmd);
}

/* Stops the service p of arena name (`stash stop` as u) and waits for it. */
static void stop(const who *u, const char *name, proc *p)
{
    run_ok(u, "$S stop %s", name);
    cr_assert_eq(finish(p), 0, "%s:\n%s", p->cmd, p->log);
    p->pid = 0;
}

/* The checkpoint directory a service said it uses, from its log. */
static void served_dir(const proc *p, char *out, size_t cap)
{
    const char *at = strstr(p->log, "checkpoints in ");
    cr_assert_not_null(at, "%s", p->log);
    at += strlen("checkpoints in ");
    size_t n = strcspn(at, " \n");
    snprintf(out, cap, "%.*s", (int)n, at);
}

static bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* Whether path is there and owned by u. */
static bool owned_by(const char *path, const who *u)
{
    struct stat st;
    return lstat(path, &st) == 0 && st.st_uid == u->uid;
}

/* The entries of dir whose names start with prefix, joined by spaces. */
static void entries(const char *dir, const char *prefix, char *out, size_t cap)
{
    out[0] = 0;
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    size_t used = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (strncmp(de->d_name, prefix, strlen(prefix)) != 0) continue;
        int n = snprintf(out + used, cap - used, "%s%s", used ? " " : "", de->d_name);
        if (n > 0 && (size_t)n < cap - used) used += (size_t)n;
    }
    closedir(d);
}

/* Waits (LIMIT_S at most) until dir, watched by ino, holds an entry whose
 * name starts with prefix, while p runs; its name goes into out. */
static bool await_entry(int ino, const char *dir, const char *prefix, const proc *p, char *out,
                        size_t cap)
{
    long deadline = now_ms() + LIMIT_S * 1000L;
    for (;;) {
        entries(dir, prefix, out, cap);
        if (out[0]) return true;
        long left = deadline - now_ms();
        struct pollfd pf[2] = {{.fd = ino, .events = POLLIN}, {.fd = p->pidfd, .events = POLLIN}};
        if (left <= 0 || poll(pf, 2, (int)left) <= 0 || (pf[1].revents & POLLIN)) {
            entries(dir, prefix, out, cap);
            return out[0] != 0;
        }
        char ev[4096];
        if (read(ino, ev, sizeof ev) < 0) return false;
    }
}

/* The bytes, inode and owner of a file, as one line. */
static void file_digest(const char *path, char *out, size_t cap)
{
    struct stat st;
    if (lstat(path, &st) < 0) {
        snprintf(out, cap, "%s: absent", path);
        return;
    }
    char *text = NULL;
    size_t len = 0;
    listing = open_memstream(&text, &len);
    list_entry(path, &st, 0, NULL);
    fclose(listing);
    snprintf(out, cap, "%s", text);
    free(text);
}

/* Writes lmdb_dir into the header of the arena file at path, in place:
 * what the attacker may do to an arena of its own. */
typedef struct header_edit {
    const char *path;
    const char *lmdb_dir;
} header_edit;

static int edit_lmdb_dir(void *arg)
{
    const header_edit *e = arg;
    char field[SHM_LMDB_DIR] = {0};
    snprintf(field, sizeof field, "%s", e->lmdb_dir);
    int fd = open(e->path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return 1;
    ssize_t n = pwrite(fd, field, sizeof field, offsetof(shm_header, lmdb_dir));
    close(fd);
    return n == (ssize_t)sizeof field ? 0 : 2;
}

/* Every entry under root (root too) is u's and no other user's to read or
 * write: directories 0700, files 0600. */
static const who *private_owner;
static char private_problem[1024];

static int check_private(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)type, (void)ftw;
    mode_t want = S_ISDIR(st->st_mode) ? 0700 : 0600;
    if (st->st_uid == private_owner->uid && (st->st_mode & 07777) == want) return 0;
    snprintf(private_problem, sizeof private_problem, "%s: user %u, mode %04o (wanted %u, %04o)",
             path, (unsigned)st->st_uid, (unsigned)(st->st_mode & 07777),
             (unsigned)private_owner->uid, (unsigned)want);
    return 1;
}

static void all_private(const char *root, const who *u)
{
    private_owner = u;
    cr_assert(exists(root), "%s is missing", root);
    cr_assert_eq(nftw(root, check_private, 16, FTW_PHYS), 0, "as %s: %s", u->name, private_problem);
}

/* ---- the victim's private places ---------------------------------------------- */

Test(hostile_user, private_places_another_user_made_first_are_refused)
{
    take_private_places();
    char mem[64], state[64], at[256];
    snprintf(mem, sizeof mem, "/dev/shm/stash-%u", (unsigned)vic.uid);
    snprintf(state, sizeof state, "/var/tmp/stash-%u", (unsigned)vic.uid);
    const char *name = test_arena_name("hu-priv");
    char arena[160];
    snprintf(arena, sizeof arena, "/dev/shm/stash.%s", name);
    for (int kind = 0; kind < KINDS; kind++) {
        if (!plantable(kind)) continue;
        /* Where the memory storage keeps checkpoints. */
        clear_private_places();
        plant(kind, mem, 1, at, sizeof at);
        run(&vic, "$S serve %s --storage memory " ARENA, name);
        refused(mem, dir_refusal(kind));
        cr_assert(!exists(arena), "%s made after a refusal", arena);
        /* Where lmdb environments go. */
        clear_private_places();
        plant(kind, state, 1, at, sizeof at);
        run(&vic, "$S create %s --backend lmdb " ARENA, name);
        refused(state, dir_refusal(kind));
        run(&vic, "$S serve %s --storage memory --backend lmdb " ARENA, name);
        refused(state, dir_refusal(kind));
        cr_assert(!exists(arena), "%s made after a refusal", arena);
        sentinel_intact(kind_name[kind]);
    }
    /* Gone, they are the victim's again. */
    clear_private_places();
    proc *p = serve(&vic, "%s --storage memory --backend lmdb " ARENA, name);
    run_ok(&vic, "$S checkpoint %s", name);
    stop(&vic, name, p);
    all_private(mem, &vic);
    all_private(state, &vic);
    run_ok(&vic, "$S destroy %s", name);
    sentinel_intact("serving with the private places");
}

/* The victim u reads key k of arena name (or fails to): never the
 * attacker's "evil". */
static void never_reads_evil(const who *u, const char *name)
{
    int rc = run(u, "$S get %s --state v --key k --format text", name);
    cr_assert(!strstr(last.log, "evil"),
              "as %s, the attacker's state was read (exit %d):\n%s\n"
              "planted:\n%s",
              u->name, rc, last.log, planted);
}

/* ---- checkpoint directories --------------------------------------------------- */

Test(hostile_user, a_checkpoint_directory_another_user_planted_is_refused)
{
    for (int v = 0; v < 2; v++)
        for (int kind = 0; kind < KINDS; kind++) {
            if (!plantable(kind)) continue;
            const char *name = test_arena_name("hu-dir");
            char path[256], given[300], arena[160];
            snprintf(path, sizeof path, "%s/%s.ck", shared, name);
            snprintf(arena, sizeof arena, "/dev/shm/stash.%s", name);
            plant(kind, path, v, given, sizeof given);
            run(victims[v], "$S serve %s --dir %s --retain 1 " ARENA, name, given);
            refused(path, dir_refusal(kind));
            cr_assert(!exists(arena), "%s made after a refusal", arena);
            cr_assert(owned_by(path, &mal), "%s: what was planted is gone", path);
            unplant(path);
            sentinel_intact(kind_name[kind]);
        }
    /* A directory anyone may write into is no checkpoint directory, not
     * even root's own. */
    for (int v = 0; v < 2; v++) {
        const char *name = test_arena_name("hu-open");
        run(victims[v], "$S serve %s --dir %s --retain 1 " ARENA, name, open_dir);
        refused(open_dir, v ? "owned by user 0" : "writable by any user");
    }
    sentinel_intact("a directory anyone may write into");
}

Test(hostile_user, a_relative_path_is_checked_all_the_way_as_an_absolute_one)
{
    for (int v = 0; v < 2; v++) {
        const who *u = victims[v];
        /* The victim's checkpoints of another arena. */
        const char *other = test_arena_name("hu-other");
        char theirs[300], mine[300];
        snprintf(mine, sizeof mine, "%s/%s.ck", area[v], other);
        proc *p = serve(u, "%s --dir %s --restore %s " ARENA, other, mine, good[v]);
        run_ok(u, "$S checkpoint %s && $S checkpoint %s", other, other);
        stop(u, other, p);
        run_ok(u, "$S destroy %s", other);
        const char *roots[] = {mine};
        char *then = listing_of(roots, 1);
        /* The attacker's directory, where the victim works, with links
         * to it and to the victim's other lmdb directory. */
        const char *name = test_arena_name("hu-rel");
        snprintf(theirs, sizeof theirs, "%s/%s.cwd", mal_area, name);
        if (links_skipped) cr_skip_test("%s", getenv(NO_LINKS_ENV));
        run_ok(&mal, "mkdir %s && ln -s %s %s/ck && ln -s %s %s/lmdb", theirs, mine, theirs,
               l1dir[v], theirs);
        note_plant("%s: a directory of its own, where the victim works; in it ck, a symbolic "
                   "link to %s, and lmdb, to %s\n",
                   theirs, mine, l1dir[v]);
        run(u, "cd %s && exec $S serve %s --dir ck --retain 1 " ARENA, theirs, name);
        refused("ck", why_owner);
        run(u, "cd %s && exec $S create %s --backend lmdb --lmdb-dir lmdb " ARENA, theirs, name);
        refused("lmdb", why_owner);
        run(u, "cd %s && exec $S snapshot load sp --format text --size 8M < %s/lines-good", theirs,
            base);
        refused(".", why_owner);
        char *now = listing_of(roots, 1);
        cr_assert_str_eq(now, then, "the victim's checkpoints changed\nplanted:\n%s", planted);
        free(now);
        free(then);
        never_reads_evil(u, name);
        cr_assert_neq(last_rc, 0, "%s was made:\n%s", name, last.log);
        unplant(theirs);
        sentinel_intact("a relative path");
    }
}

Test(hostile_user, retention_removes_nothing_through_another_users_link)
{
    share_private_places();
    for (int v = 0; v < 2; v++) {
        const who *u = victims[v];
        const char *name = test_arena_name("hu-keep");
        char theirs[256], old[160], link[256], mine[256];
        /* The attacker's checkpoints: links to the victim's directories. */
        snprintf(theirs, sizeof theirs, "%s/%s.x", mal_area, name);
        snprintf(old, sizeof old, "/dev/shm/stash.%s.checkpoints", name);
        snprintf(link, sizeof link, "%s/%s.link", shared, name);
        if (links_skipped) cr_skip_test("%s", getenv(NO_LINKS_ENV));
        run_ok(&mal,
               "mkdir %s %s/shared && ln -s %s %s/chk-1 && ln -s %s %s/chk-2 && "
               "ln -s %s/sub %s/chk-3 && ln -s %s/a %s/shared/1.dat && ln -s %s %s && ln -s %s %s",
               theirs, theirs, sent[v], theirs, l1dir[v], theirs, sent[v], theirs, sent[v], theirs,
               theirs, old, theirs, link);
        note_plant("%s: checkpoints chk-1..3 linked to %s, %s and %s/sub; %s and %s link to it\n",
                   theirs, sent[v], l1dir[v], sent[v], old, link);
        /* The memory storage's own place, not the old one: three
         * checkpoints, one kept. */
        proc *p = serve(u, "%s --storage memory --retain 1 " ARENA, name);
        for (int i = 0; i < 3; i++) run_ok(u, "$S checkpoint %s", name);
        stop(u, name, p);
        served_dir(p, mine, sizeof mine);
        cr_assert(strcmp(mine, old) != 0, "checkpoints went to %s", old);
        char kept[256];
        entries(mine, "chk-", kept, sizeof kept);
        cr_assert_str_eq(kept, "chk-3", "retention in %s", mine);
        sentinel_intact("retention of the memory storage");
        /* A --dir that leads through the attacker's link or directory. */
        run(u, "$S serve %s --dir %s --retain 1 " ARENA, name, old);
        refused(old, why_link);
        run(u, "$S serve %s --dir %s --retain 1 " ARENA, name, link);
        refused(link, why_link);
        run(u, "$S serve %s --dir %s --retain 1 " ARENA, name, theirs);
        refused(theirs, why_owner);
        for (int i = 1; i <= 3; i++) {
            char chk[300];
            snprintf(chk, sizeof chk, "%s/chk-%d", theirs, i);
            cr_assert(owned_by(chk, &mal), "%s: the attacker's link is gone", chk);
        }
        run_ok(u, "$S destroy %s", name);
        sentinel_intact("retention through links");
    }
}

Test(hostile_user, a_checkpoint_another_user_planted_is_never_restored)
{
    share_private_places();
    for (int v = 0; v < 2; v++) {
        const who *u = victims[v];
        /* What get shows when a checkpoint is restored: the victim's own. */
        const char *name = test_arena_name("hu-own");
        char ck[256], path[256], given[300];
        snprintf(ck, sizeof ck, "%s/%s.ck", area[v], name);
        run_ok(u, "mkdir -m 700 %s && cp -r %s %s/chk-1", ck, good[v], ck);
        proc *p = serve(u, "%s --dir %s " ARENA, name, ck);
        run_ok(u, "$S get %s --state v --key k --format text", name);
        cr_assert_str_eq(last.log, "good\n");
        stop(u, name, p);
        run_ok(u, "$S destroy %s", name);

        /* Where the memory storage once kept checkpoints. */
        name = test_arena_name("hu-mem");
        snprintf(path, sizeof path, "/dev/shm/stash.%s.checkpoints", name);
        plant(A_DIR_OF_ITS_OWN, path, v, given, sizeof given);
        p = serve(u, "%s --storage memory " ARENA, name);
        cr_assert(!strstr(p->log, "restored"), "%s", p->log);
        never_reads_evil(u, name);
        stop(u, name, p);
        run_ok(u, "$S destroy %s", name);
        unplant(path);

        /* An XDG_RUNTIME_DIR of the attacker's (as su or sudo may leave
         * it): root's checkpoints go to /run/stash, another user's are
         * refused. */
        name = test_arena_name("hu-xdg");
        char xdg[300];
        snprintf(xdg, sizeof xdg, "%s/%s.xdg", mal_area, name);
        run_ok(&mal,
               "mkdir -p %s/stash/%s.checkpoints && cp -r %s %s/stash/%s.checkpoints/chk-1 && "
               "chmod -R a+rX %s",
               xdg, name, evil, xdg, name, xdg);
        note_plant("%s: a directory of its own, holding stash/%s.checkpoints/chk-1\n", xdg, name);
        char cmd[600];
        snprintf(cmd, sizeof cmd, "XDG_RUNTIME_DIR=%s exec $S serve %s --storage memory " ARENA,
                 xdg, name);
        if (v == 0) {
            p = serve_as(u, cmd);
            cr_assert(!strstr(p->log, "restored") && !strstr(p->log, xdg), "%s", p->log);
            never_reads_evil(u, name);
            stop(u, name, p);
            run_ok(u, "$S destroy %s", name);
        } else {
            run(u, "%s", cmd);
            refused(xdg, why_owner);
            never_reads_evil(u, name);
        }
        unplant(xdg);

        /* A --dir of the attacker's, through its link, or below its 1777
         * directory: refused, no arena made. */
        for (int way = 0; way < 3; way++) {
            name = test_arena_name("hu-dir");
            char theirs[256], dir[300];
            snprintf(theirs, sizeof theirs, "%s/%s.x", mal_area, name);
            snprintf(path, sizeof path, "%s/%s.ck", shared, name);
            plant(A_DIR_OF_ITS_OWN, theirs, v, given, sizeof given);
            if (way == 0) {
                snprintf(dir, sizeof dir, "%s", theirs);
            } else if (way == 1) {
                if (links_skipped) continue;
                run_ok(&mal, "ln -s %s %s", theirs, path);
                note_plant("%s: a symbolic link to %s\n", path, theirs);
                snprintf(dir, sizeof dir, "%s", path);
            } else {
                plant(AN_OPEN_DIR_ON_THE_WAY, path, v, dir, sizeof dir);
                run_ok(&mal, "mkdir %s && cp -r %s %s/chk-1 && chmod -R a+rX %s", dir, evil, dir,
                       dir);
            }
            run(u, "$S serve %s --dir %s " ARENA, name, dir);
            refused(way == 0 ? theirs : path, way == 1 ? why_link : why_owner);
            never_reads_evil(u, name);
            unplant(path);
            unplant(theirs);
        }

        /* The attacker's own arena under the name the victim asks for,
         * holding its state. */
        name = test_arena_name("hu-theirs");
        char arena[160];
        snprintf(arena, sizeof arena, "/dev/shm/stash.%s", name);
        snprintf(ck, sizeof ck, "%s/%s.ck", mal_area, name);
        p = serve(&mal, "%s --dir %s --restore %s " ARENA, name, ck, evil);
        stop(&mal, name, p);
        note_plant("%s: an arena of its own, key k \"evil\"\n", arena);
        never_reads_evil(u, name);
        refused(arena, why_owner);
        snprintf(ck, sizeof ck, "%s/%s.ck", area[v], name);
        run(u, "$S serve %s --dir %s " ARENA, name, ck);
        refused(arena, why_owner);
        run(u, "$S create %s --replace " ARENA, name);
        refused(arena, why_owner);
        cr_assert(owned_by(arena, &mal), "%s: the attacker's arena went", arena);
        unplant(arena);
        sentinel_intact("planted checkpoints");
    }
}

/* ---- lmdb directories ---------------------------------------------------------- */

Test(hostile_user, an_lmdb_directory_another_user_planted_is_refused)
{
    for (int v = 0; v < 2; v++)
        for (int kind = 0; kind < KINDS; kind++) {
            if (!plantable(kind)) continue;
            const who *u = victims[v];
            const char *name = test_arena_name("hu-lmdb");
            char path[160], given[256], arena[160];
            /* Where lmdb environments once went by default. */
            snprintf(path, sizeof path, "/var/tmp/stash.%s.lmdb", name);
            snprintf(arena, sizeof arena, "/dev/shm/stash.%s", name);
            plant(kind, path, v, given, sizeof given);
            run(u, "$S create %s --backend lmdb --lmdb-dir %s " ARENA, name, given);
            refused(path, dir_refusal(kind));
            run(u, "$S serve %s --backend lmdb --lmdb-dir %s --dir %s/%s.ck " ARENA, name, given,
                area[v], name);
            refused(path, dir_refusal(kind));
            cr_assert(!exists(arena), "%s made after a refusal", arena);
            cr_assert(owned_by(path, &mal), "%s: what was planted is gone", path);
            unplant(path);
            sentinel_intact(kind_name[kind]);
        }
}

/* ---- destroy ------------------------------------------------------------------- */

Test(hostile_user, destroy_never_trusts_an_arena_another_user_made)
{
    for (int v = 0; v < 2; v++) {
        const who *u = victims[v];
        /* The attacker's lmdb arena, its header edited to name the
         * victim's other arena's lmdb directory. */
        const char *name = test_arena_name("hu-edit");
        char arena[160], digest[512], now[512];
        snprintf(arena, sizeof arena, "/dev/shm/stash.%s", name);
        run_ok(&mal, "$S create %s --backend lmdb --lmdb-dir %s/%s.lmdb " ARENA, name, mal_area,
               name);
        cr_assert_eq(as_user(&mal, edit_lmdb_dir, &(header_edit){arena, l1dir[v]}), 0);
        note_plant("%s: an lmdb arena of its own whose header names %s\n", arena, l1dir[v]);
        file_digest(arena, digest, sizeof digest);
        run(u, "$S destroy %s", name);
        refused(arena, why_owner);
        run(u, "$S destroy any --path %s", arena);
        refused(arena, why_owner);
        file_digest(arena, now, sizeof now);
        cr_assert_str_eq(now, digest, "the attacker's arena changed");
        sentinel_intact("destroy of the attacker's arena");
        unplant(arena);

        /* Other things where an arena's file belongs. */
        struct {
            int kind;
            const char *why;
        } cases[] = {{LINK_TO_SENTINEL, "a symbolic link, not an arena"},
                     {A_FIFO, "not a regular file"},
                     {A_DIR_OF_ITS_OWN, "not a regular file"},
                     {A_FILE_OF_ITS_OWN, why_owner}};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            if (!plantable(cases[i].kind)) continue;
            name = test_arena_name("hu-place");
            snprintf(arena, sizeof arena, "/dev/shm/stash.%s", name);
            if (cases[i].kind == LINK_TO_SENTINEL) {
                /* To the victim's other arena's file. */
                run_ok(&mal, "ln -s /dev/shm/stash.%s %s", l1[v], arena);
                note_plant("%s: a symbolic link to /dev/shm/stash.%s\n", arena, l1[v]);
            } else {
                char given[300];
                plant(cases[i].kind, arena, v, given, sizeof given);
            }
            file_digest(arena, digest, sizeof digest);
            run(u, "$S destroy %s", name);
            refused(arena, cases[i].why);
            file_digest(arena, now, sizeof now);
            cr_assert_str_eq(now, digest, "what was planted changed");
            unplant(arena);
            sentinel_intact("destroy of what was planted");
        }
    }
}

Test(hostile_user, destroy_path_removes_only_an_arena_of_its_user)
{
    for (int v = 0; v < 2; v++) {
        const who *u = victims[v];
        const char *name = test_arena_name("hu-path");
        char empty[256], zeros[256], theirs[256], way[256], behind[300];
        snprintf(empty, sizeof empty, "%s/%s.empty", area[v], name);
        snprintf(zeros, sizeof zeros, "%s/%s.zeros", area[v], name);
        snprintf(theirs, sizeof theirs, "%s/%s.theirs", shared, name);
        snprintf(way, sizeof way, "%s/%s.way", shared, name);
        snprintf(behind, sizeof behind, "%s/arena", way);
        run_ok(u, "umask 077 && : > %s && head -c 8 /dev/zero > %s", empty, zeros);
        run_ok(&mal, "$S create x --path %s " ARENA, theirs);
        note_plant("%s: an arena of its own\n", theirs);
        plant(AN_OPEN_DIR_ON_THE_WAY, way, v, behind, sizeof behind);
        /* The victim's own file with an arena's header, below it. */
        run_ok(u, "umask 077 && head -c 8192 /dev/shm/stash.%s > %s", l1[v], behind);
        struct {
            const char *path, *named, *why;
        } cases[] = {{empty, empty, "not a stash arena"},
                     {zeros, zeros, "not a stash arena"},
                     {theirs, theirs, why_owner},
                     {behind, way, why_owner}};
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            char digest[512], now[512];
            file_digest(cases[i].path, digest, sizeof digest);
            run(u, "$S destroy any --path %s", cases[i].path);
            refused(cases[i].named, cases[i].why);
            file_digest(cases[i].path, now, sizeof now);
            cr_assert_str_eq(now, digest, "destroy --path changed %s", cases[i].path);
        }
        /* What it removes: an arena of the victim's. */
        char mine[256];
        snprintf(mine, sizeof mine, "%s/%s.arena", area[v], name);
        run_ok(u, "$S create x --path %s " ARENA, mine);
        run_ok(u, "$S destroy x --path %s", mine);
        cr_assert(!exists(mine), "%s is still there", mine);
        sentinel_intact("destroy --path");
    }
    run_ok(&root_u, "$S destroy --help");
    cr_assert(strstr(last.log, "a file of this user's") && strstr(last.log, "another user's file"),
              "the help does not say what destroy removes:\n%s", last.log);
}

Test(hostile_user, destroy_removes_the_arena_it_names_and_leaves_NAME_restoring_alone)
{
    for (int v = 0; v < 2; v++) {
        const who *u = victims[v];
        const who *makers[2] = {u, &mal};
        for (int m = 0; m < 2; m++) {
            const char *name = test_arena_name("hu-v1");
            char arena[160], restoring[180];
            snprintf(arena, sizeof arena, "/dev/shm/stash.%s", name);
            snprintf(restoring, sizeof restoring, "%s.restoring", arena);
            run_ok(u, "$S create %s " ARENA, name);
            run_ok(makers[m], "$S create %s.restoring " ARENA, name);
            if (m) note_plant("%s: an arena of its own\n", restoring);
            run_ok(u, "$S destroy %s", name);
            cr_assert(!exists(arena), "%s is still there", arena);
            cr_assert(owned_by(restoring, makers[m]), "%s went", restoring);
            unplant(restoring);
        }
        sentinel_intact("destroy beside NAME.restoring");
    }
}

/* ---- names flooded into /dev/shm ---------------------------------------------- */

static const char *const flood_names[] = {"stash.view-%u-0", "stash.view-%u-1", "stash.writer-%u-0",
                                          "stash.snapshot-%u-0"};
#define FLOODED 2000u

static unsigned flood_pid(unsigned i)
{
    static unsigned pid_max;
    if (!pid_max) {
        FILE *f = fopen("/proc/sys/kernel/pid_max", "r");
        if (!f || fscanf(f, "%u", &pid_max) != 1) pid_max = 32768;
        if (f) fclose(f);
    }
    return (flood_first + i - 1) % pid_max + 1;
}

/* As the attacker: a link to the victim's file, a FIFO or a file of its
 * own under every name, for the next FLOODED pids. */
static int flood(void *arg)
{
    const char *target = arg;
    for (unsigned i = 0; i < flood_count; i++)
        for (size_t n = 0; n < sizeof flood_names / sizeof flood_names[0]; n++) {
            char path[96];
            snprintf(path, sizeof path, "/dev/shm/");
            snprintf(path + 9, sizeof path - 9, flood_names[n], flood_pid(i));
            int rc, fd;
            switch ((i + n) % 3) {
            case 0:
                rc = symlink(target, path);
                break;
            case 1:
                rc = mkfifo(path, 0666);
                break;
            default:
                fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
                rc = fd >= 0 && write(fd, "evil\n", 5) == 5 ? 0 : -1;
                if (fd >= 0) close(fd);
            }
            if (rc < 0 && errno != EEXIST) return 1;
        }
    return 0;
}

/* How many of the flooded names are still the attacker's. */
static unsigned flood_left(void)
{
    unsigned left = 0;
    for (unsigned i = 0; i < flood_count; i++)
        for (size_t n = 0; n < sizeof flood_names / sizeof flood_names[0]; n++) {
            char path[96];
            snprintf(path, sizeof path, "/dev/shm/");
            snprintf(path + 9, sizeof path - 9, flood_names[n], flood_pid(i));
            left += owned_by(path, &mal);
        }
    return left;
}

static void remove_flood(void)
{
    for (unsigned i = 0; i < flood_count; i++)
        for (size_t n = 0; n < sizeof flood_names / sizeof flood_names[0]; n++) {
            char path[96];
            snprintf(path, sizeof path, "/dev/shm/");
            snprintf(path + 9, sizeof path - 9, flood_names[n], flood_pid(i));
            if (owned_by(path, &mal)) unlink(path);
        }
    flood_count = 0;
}

/* Whether pid is one of those whose names were flooded. */
static bool flooded(pid_t pid)
{
    for (unsigned i = 0; i < flood_count; i++)
        if (flood_pid(i) == (unsigned)pid) return true;
    return false;
}

Test(hostile_user, names_another_user_floods_dev_shm_with_change_nothing)
{
    FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "r");
    cr_assert_not_null(f);
    cr_assert_eq(fscanf(f, "%u", &flood_first), 1);
    fclose(f);
    flood_first++;
    flood_count = FLOODED;
    char target[200];
    snprintf(target, sizeof target, "%s/a", sent[0]);
    cr_assert_eq(as_user(&mal, flood, target), 0, "the flood: %s", strerror(errno));
    unsigned planted_names = flood_left();
    note_plant("/dev/shm: %u names stash.view-PID-N, stash.writer-PID-0, stash.snapshot-PID-0 "
               "for pids %u.. (links to %s, FIFOs, files of its own)\n",
               planted_names, flood_first, target);
    for (int v = 0; v < 2; v++) {
        const who *u = victims[v];
        const char *name = test_arena_name("hu-flood");
        run_ok(u, "$S get --checkpoint %s --state v --key k --format text", good[v]);
        cr_assert_str_eq(last.log, "good\n");
        cr_assert(flooded(last.pid), "pid %d is past the flooded ones", (int)last.pid);
        run_ok(u, "$S scan --checkpoint %s --state v --format text", good[v]);
        run_ok(u, "$S snapshot load %s/%s.sp --format text --size 8M < %s/lines-good", shared, name,
               base);
        run_ok(u, "$S get --checkpoint %s/%s.sp --state v --key k --format text", shared, name);
        cr_assert_str_eq(last.log, "good\n");
        char rewritten[300];
        snprintf(rewritten, sizeof rewritten, "%s/%s.rw", shared, name);
        run_ok(u, "$S snapshot rewrite %s %s", good[v], rewritten);
        all_private(rewritten, u);
    }
    cr_assert_eq(flood_left(), planted_names, "flooded names were removed");
    sentinel_intact("the flood");
}

/* ---- savepoints written to a destination ------------------------------------- */

Test(hostile_user, a_savepoint_destination_another_user_planted_is_refused)
{
    for (int v = 0; v < 2; v++)
        for (int kind = 0; kind < KINDS; kind++) {
            if (!plantable(kind)) continue;
            const who *u = victims[v];
            const char *name = test_arena_name("hu-dest");
            char path[256], given[300], prefix[128], left[1024];
            snprintf(path, sizeof path, "%s/%s.sp", shared, name);
            plant(kind, path, v, given, sizeof given);
            const char *why = kind == AN_OPEN_DIR_ON_THE_WAY ? why_owner : "exists already";
            run(u, "$S snapshot load %s --format text --size 8M < %s/lines-good", given, base);
            refused(path, why);
            run(u, "$S snapshot rewrite %s %s", good[v], given);
            refused(path, why);
            snprintf(prefix, sizeof prefix, ".%s.sp.writing-", name);
            entries(shared, prefix, left, sizeof left);
            cr_assert_str_eq(left, "", "left behind in %s", shared);
            cr_assert(owned_by(path, &mal), "%s: what was planted is gone", path);
            unplant(path);
            sentinel_intact(kind_name[kind]);
        }
}

Test(hostile_user, a_destination_planted_while_a_savepoint_is_written_is_not_written_through)
{
    const int kinds[] = {LINK_TO_SENTINEL, LINK_TO_VICTIM_DIR, LINK_TO_OPEN_DIR, A_DIR_OF_ITS_OWN};
    int ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    cr_assert_geq(ino, 0);
    cr_assert_geq(inotify_add_watch(ino, shared, IN_CREATE | IN_MOVED_TO), 0);
    for (int v = 0; v < 2; v++)
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
            if (!plantable(kinds[k])) continue;
            const who *u = victims[v];
            const char *name = test_arena_name("hu-race");
            char dest[256], given[300], prefix[128], tmp[1024];
            snprintf(dest, sizeof dest, "%s/%s.sp", shared, name);
            snprintf(prefix, sizeof prefix, ".%s.sp.writing-", name);
            proc p;
            char cmd[512];
            snprintf(cmd, sizeof cmd, "exec $S snapshot load %s --format text --size 8M", dest);
            start_proc(&p, u, true, cmd);
            /* The savepoint is being written once its directory is there. */
            char head[256];
            int n = snprintf(head, sizeof head,
                             "{\"snapshot\": 1, \"max_parallelism\": 4}\n"
                             "{\"declare\": \"v\", \"kind\": \"value\"}\n");
            cr_assert_eq(write(p.in, head, (size_t)n), n);
            cr_assert(await_entry(ino, shared, prefix, &p, tmp, sizeof tmp), "no %s%d-* in %s:\n%s",
                      prefix, (int)p.pid, shared, p.log);
            plant(kinds[k], dest, v, given, sizeof given);
            n = snprintf(head, sizeof head,
                         "{\"state\": \"v\", \"kind\": \"value\", \"key\": \"k\", "
                         "\"value\": \"good\"}\n");
            cr_assert_eq(write(p.in, head, (size_t)n), n);
            int rc = finish(&p);
            cr_assert(rc != 0 && rc < 128 && strstr(p.log, dest) && strstr(p.log, "File exists"),
                      "as %s, exit %d:\n%s\nplanted:\n%s", u->name, rc, p.log, planted);
            entries(shared, prefix, tmp, sizeof tmp);
            cr_assert_str_eq(tmp, "", "left behind in %s", shared);
            cr_assert(owned_by(dest, &mal), "%s: what was planted is gone", dest);
            unplant(dest);
            sentinel_intact(kind_name[kinds[k]]);
        }
    close(ino);
}

/* A pid no process has: one that ended. */
static int nothing(void *arg)
{
    (void)arg;
    return 0;
}

Test(hostile_user, what_a_killed_snapshot_load_left_is_removed_by_the_next_and_another_users_never)
{
    int ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    cr_assert_geq(ino, 0);
    cr_assert_geq(inotify_add_watch(ino, shared, IN_CREATE | IN_MOVED_TO), 0);
    for (int v = 0; v < 2; v++) {
        const who *u = victims[v];
        const char *name = test_arena_name("hu-kill");
        char dest[256], prefix[128], left[1024], theirs[3][300];
        snprintf(dest, sizeof dest, "%s/%s.sp", shared, name);
        snprintf(prefix, sizeof prefix, ".%s.sp.writing-", name);
        /* The attacker's look-alikes of what a dead writer leaves. */
        pid_t dead = test_fork(nothing, NULL);
        test_wait(dead);
        for (int i = 0; i < 3; i++)
            snprintf(theirs[i], sizeof theirs[i], "%s/%s%d-%d0badf00", shared, prefix, (int)dead,
                     i);
        run_ok(&mal, "mkdir %s && echo evil > %s/savepoint-1 && ln -s %s %s && mkfifo %s",
               theirs[0], theirs[0], sent[v], theirs[1], theirs[2]);
        note_plant("%s: a directory of its own; %s: a link to %s; %s: a FIFO\n", theirs[0],
                   theirs[1], sent[v], theirs[2]);
        /* A writer killed while it writes. */
        proc p;
        char cmd[512], mine[1024];
        snprintf(cmd, sizeof cmd, "exec $S snapshot load %s --format text --size 8M", dest);
        start_proc(&p, u, true, cmd);
        const char head[] = "{\"snapshot\": 1, \"max_parallelism\": 4}\n"
                            "{\"declare\": \"v\", \"kind\": \"value\"}\n";
        cr_assert_eq(write(p.in, head, sizeof head - 1), (ssize_t)sizeof head - 1);
        char own[160];
        snprintf(own, sizeof own, "%s%d-", prefix, (int)p.pid);
        cr_assert(await_entry(ino, shared, own, &p, mine, sizeof mine), "no %s* in %s:\n%s", own,
                  shared, p.log);
        kill_proc(&p);
        char path[1300];
        snprintf(path, sizeof path, "%s/%s", shared, mine);
        cr_assert(owned_by(path, u), "%s: the killed writer's directory", path);
        /* The next writer takes it away, and nothing of the attacker's. */
        run_ok(u, "$S snapshot load %s --format text --size 8M < %s/lines-good", dest, base);
        cr_assert(!exists(path), "%s is still there", path);
        entries(shared, prefix, left, sizeof left);
        for (int i = 0; i < 3; i++)
            cr_assert(owned_by(theirs[i], &mal), "%s went; left: %s", theirs[i], left);
        run_ok(u, "$S get --checkpoint %s --state v --key k --format text", dest);
        cr_assert_str_eq(last.log, "good\n");
        all_private(dest, u);
        sentinel_intact("a killed writer's leftovers");
    }
    close(ino);
}

/* ---- a service's checkpoint directory ------------------------------------------ */

Test(hostile_user, a_partial_savepoint_whose_writer_is_gone_is_removed_when_the_service_starts)
{
    for (int v = 0; v < 2; v++) {
        const who *u = victims[v];
        const char *name = test_arena_name("hu-part");
        char ck[300], left[400], held[400], whole[400];
        snprintf(ck, sizeof ck, "%s/%s.ck", area[v], name);
        snprintf(left, sizeof left, "%s/savepoint-5", ck);
        snprintf(held, sizeof held, "%s/savepoint-6", ck);
        snprintf(whole, sizeof whole, "%s/savepoint-7", ck);
        run_ok(u,
               "mkdir -m 700 %s %s %s && echo partial > %s/kg-data.dat && cp -r %s %s && "
               "chmod 700 %s",
               ck, left, held, left, good[v], whole, whole);
        /* A writer still at work holds its lock. */
        int fd = open(held, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        cr_assert_geq(fd, 0);
        cr_assert_eq(flock(fd, LOCK_EX | LOCK_NB), 0);
        proc *p = serve(u, "%s --dir %s " ARENA, name, ck);
        stop(u, name, p);
        close(fd);
        cr_assert(!exists(left), "%s is still there:\n%s", left, p->log);
        cr_assert(strstr(p->log, "removed partial savepoints"), "%s", p->log);
        cr_assert(exists(held), "%s, being written, went", held);
        cr_assert(exists(whole), "%s, whole, went", whole);
        run_ok(u, "$S destroy %s", name);
        sentinel_intact("a service's start");
    }
}

/* ---- what the victim makes --------------------------------------------------------- */

Test(hostile_user, what_a_victim_makes_is_its_own_and_private_whatever_its_umask)
{
    share_private_places();
    for (int v = 0; v < 2; v++) {
        const who *u = victims[v];
        const char *name = test_arena_name("hu-mine");
        char arena[160], dir[256], lmdb[256], sp[256];
        snprintf(arena, sizeof arena, "/dev/shm/stash.%s", name);
        proc *p = serve(u, "%s --storage memory --backend lmdb --restore %s " ARENA, name, good[v]);
        run_ok(u, "$S checkpoint %s", name);
        stop(u, name, p);
        served_dir(p, dir, sizeof dir);
        all_private(arena, u);
        all_private(dir, u);
        run_ok(u, "$S status %s --json", name);
        const char *at = strstr(last.log, "\"lmdb_dir\": \"");
        cr_assert_not_null(at, "%s", last.log);
        at += strlen("\"lmdb_dir\": \"");
        snprintf(lmdb, sizeof lmdb, "%.*s", (int)strcspn(at, "\""), at);
        all_private(lmdb, u);
        cr_assert(strstr(dir, v ? "/dev/shm/stash-" : "/run/stash/") == dir, "%s", dir);
        cr_assert(strstr(lmdb, v ? "/var/tmp/stash-" : "/var/lib/stash/") == lmdb, "%s", lmdb);
        if (v) {
            *strrchr(dir, '/') = 0;
            *strrchr(lmdb, '/') = 0;
            all_private(dir, u);
            all_private(lmdb, u);
        }
        snprintf(sp, sizeof sp, "%s/%s.sp", shared, name);
        run_ok(u, "$S snapshot load %s --format text --size 8M < %s/lines-good", sp, base);
        all_private(sp, u);
        run_ok(u, "$S destroy %s", name);
    }
    run_ok(&root_u, "$S create --help");
    cr_assert(strstr(last.log, "/var/lib/stash/NAME.lmdb") &&
                  strstr(last.log, "/var/tmp/stash-UID/NAME.lmdb"),
              "the help does not name where lmdb environments go:\n%s", last.log);
}

/* ---- FIFOs ---------------------------------------------------------------------- */

Test(hostile_user, a_fifo_planted_anywhere_never_hangs_a_command)
{
    for (int v = 0; v < 2; v++) {
        const who *u = victims[v];
        const char *name = test_arena_name("hu-fifo");
        char md[256], data[256], chk[256], arena[160];
        /* Checkpoints of the attacker's the victim reads, FIFOs in them. */
        snprintf(md, sizeof md, "%s/%s.md", mal_area, name);
        snprintf(data, sizeof data, "%s/%s.data", mal_area, name);
        snprintf(chk, sizeof chk, "%s/%s.chk", mal_area, name);
        run_ok(&mal,
               "mkdir %s %s && mkfifo -m 666 %s/_metadata %s/chk-1 && cp -r %s %s && "
               "rm %s/kg-data.dat && mkfifo -m 666 %s/kg-data.dat && chmod -R a+rX %s",
               md, chk, md, chk, evil, data, data, data, data);
        note_plant("%s/_metadata, %s/kg-data.dat, %s/chk-1: FIFOs\n", md, data, chk);
        struct {
            const char *args, *path, *named;
        } reads[] = {
            {"get --checkpoint %s --state v --key k", md, "_metadata"},
            {"get --checkpoint %s --state v --key k", data, "kg-data.dat"},
            {"scan --checkpoint %s --state v", data, "kg-data.dat"},
            {"snapshot info %s", md, "_metadata"},
            {"snapshot verify %s", data, "kg-data.dat"},
            {"snapshot dump %s", data, "kg-data.dat"},
            {"snapshot verify %s", chk, "no checkpoint"},
        };
        for (size_t i = 0; i < sizeof reads / sizeof reads[0]; i++) {
            char cmd[600];
            snprintf(cmd, sizeof cmd, reads[i].args, reads[i].path);
            run(u, "$S %s", cmd);
            refused(reads[i].path, reads[i].named);
        }
        run(u, "$S snapshot ls %s", chk);
        run(u, "$S serve %s --restore %s --dir %s/%s.ck " ARENA, name, data, area[v], name);
        refused(data, "kg-data.dat");
        /* A FIFO where the arena's file belongs. */
        snprintf(arena, sizeof arena, "/dev/shm/stash.%s", name);
        run_ok(&mal, "mkfifo -m 666 %s", arena);
        note_plant("%s: a FIFO\n", arena);
        const char *const on_arena[] = {"serve %s --dir %s/%s.ck2 " ARENA,
                                        "get %s --state v --key k",
                                        "status %s",
                                        "checkpoint %s",
                                        "stop %s",
                                        "destroy %s",
                                        "create %s --replace " ARENA};
        for (size_t i = 0; i < sizeof on_arena / sizeof on_arena[0]; i++) {
            char cmd[600];
            snprintf(cmd, sizeof cmd, on_arena[i], name, area[v], name);
            run(u, "$S %s", cmd);
            refused(arena, "not a regular file");
        }
        unplant(arena);
        sentinel_intact("FIFOs");
    }
}

/* ---- the Python module ------------------------------------------------------------- */

static const char python_script[] =
    "import stash, sys\n"
    "name, link, theirs, their_dir = sys.argv[1:]\n"
    "def attempt(what, call):\n"
    "    try:\n"
    "        call()\n"
    "        print(what + ': accepted')\n"
    "    except stash.StashError as e:\n"
    "        print(what + ': refused: ' + str(e))\n"
    "size = dict(size=8 << 20, max_parallelism=4)\n"
    "attempt('create', lambda: stash.Arena.create(name, backend=stash.LMDB, lmdb_dir=link, "
    "**size))\n"
    "attempt('service', lambda: stash.Service(name, dir=their_dir, **size))\n"
    "attempt('open', lambda: stash.Arena.open(theirs))\n"
    "attempt('destroy', lambda: stash.Arena.destroy(theirs))\n";

Test(hostile_user, the_python_module_refuses_what_the_command_line_refuses)
{
    char script[160], package[640];
    snprintf(package, sizeof package, "%s/stash/__init__.py", env_python + strlen("PYTHONPATH="));
    if (access("/usr/bin/python3", X_OK) != 0 || access(package, R_OK) != 0)
        cr_skip_test("no /usr/bin/python3 or no module at %s", package);
    snprintf(script, sizeof script, "%s/hostile.py", base);
    FILE *f = fopen(script, "w");
    cr_assert_not_null(f);
    fputs(python_script, f);
    fclose(f);
    for (int v = 0; v < 2; v++) {
        const who *u = victims[v];
        const char *name = test_arena_name("hu-py");
        const char *theirs = test_arena_name("hu-pyt");
        char link[256], their_dir[256], arena[160], given[300];
        snprintf(link, sizeof link, "%s/%s.lmdb", shared, name);
        snprintf(their_dir, sizeof their_dir, "%s/%s.ck", mal_area, name);
        snprintf(arena, sizeof arena, "/dev/shm/stash.%s", theirs);
        if (!links_skipped) plant(LINK_TO_VICTIM_DIR, link, v, given, sizeof given);
        plant(A_DIR_OF_ITS_OWN, their_dir, v, given, sizeof given);
        run_ok(&mal, "$S create %s " ARENA, theirs);
        note_plant("%s: an arena of its own\n", arena);
        run_ok(u, "/usr/bin/python3 %s %s %s %s %s", script, name, link, theirs, their_dir);
        struct {
            const char *what, *path, *why;
        } calls[] = {{"create: refused", link, links_skipped ? "No such file" : why_link},
                     {"service: refused", their_dir, why_owner},
                     {"open: refused", arena, why_owner},
                     {"destroy: refused", arena, why_owner}};
        for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
            const char *line = strstr(last.log, calls[i].what);
            size_t n = line ? strcspn(line, "\n") : 0;
            cr_assert(line && memmem(line, n, calls[i].path, strlen(calls[i].path)) &&
                          memmem(line, n, calls[i].why, strlen(calls[i].why)),
                      "as %s, %s does not name %s and why (%s):\n%s\nplanted:\n%s", u->name,
                      calls[i].what, calls[i].path, calls[i].why, last.log, planted);
        }
        cr_assert(owned_by(arena, &mal), "%s went", arena);
        unplant(arena);
        unplant(link);
        unplant(their_dir);
        sentinel_intact("the Python module");
    }
}
