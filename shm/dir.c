/* SPDX-License-Identifier: MIT */
/*
 * dir.c: directories stash writes into or reads from, opened once and
 * checked on the descriptor. A path is walked one component at a time
 * (openat with O_NOFOLLOW), so the kernel never follows a link on its own:
 * each link met is followed only if this user, root or the owner of the
 * directory holding it made it, and its target is walked the same way.
 * Every later create, list, rename and remove is relative to the
 * descriptor, so what the checks saw is what is written.
 *
 * Why those checks: another local user may write into /tmp, /var/tmp and
 * /dev/shm. A link of theirs on the way would send stash's writes (and its
 * retention's removals) into any directory; a directory of theirs would let
 * them plant what stash reads back as its own state. A directory stash
 * owns and nobody else may write holds only what stash put there.
 */
#define _GNU_SOURCE /* O_PATH, O_TMPFILE, strchrnul */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm/shm.h"

#define MAX_LINKS 40 /* as the kernel's own limit */

typedef struct walk {
    unsigned how;
    int links;         /* links followed so far */
    const char *whole; /* the path as given, for messages */
} walk;

/* Whether a directory may lead to one stash writes into: root's or this
 * user's, and where others may write into it only with the sticky bit (they
 * cannot then rename or remove what is not theirs, as in /tmp). */
static int check_way(const walk *w, const struct stat *st, const char *at, int len)
{
    char what[sizeof((shm_dir *)0)->path + 300];
    if (at == w->whole && (size_t)len == strlen(at))
        snprintf(what, sizeof what, "%s", at);
    else
        snprintf(what, sizeof what, "%s: %.*s", w->whole, len, at);
    if (st->st_uid != 0 && st->st_uid != geteuid())
        return shm_fail(-EPERM, "%s is owned by user %u, not by root or this user (%u): refused",
                        what, (unsigned)st->st_uid, (unsigned)geteuid());
    if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_mode & S_ISVTX))
        return shm_fail(-EPERM,
                        "%s may be written by other users and has no sticky bit (mode %04o): "
                        "refused",
                        what, (unsigned)(st->st_mode & 07777));
    return 0;
}

static int walk_path(walk *w, int at, const char *path, bool check_last, int *out);

/* Follows the link lfd (an O_PATH descriptor) found in directory cur, if its
 * owner may be trusted: this user, root, or the directory's owner (who could
 * have put anything there anyway). Sets *out to where it leads. */
static int follow_link(walk *w, int cur, int lfd, const struct stat *lst, const char *at, int len,
                       bool check_last, int *out)
{
    struct stat dst;
    if (fstat(cur, &dst) < 0) return shm_fail(-errno, "%s: %s", w->whole, strerror(errno));
    if (lst->st_uid != geteuid() && lst->st_uid != 0 && lst->st_uid != dst.st_uid)
        return shm_fail(-EPERM,
                        "%s: %.*s is a symbolic link owned by user %u, in a directory of user %u: "
                        "not followed",
                        w->whole, len, at, (unsigned)lst->st_uid, (unsigned)dst.st_uid);
    if (++w->links > MAX_LINKS)
        return shm_fail(-ELOOP, "%s: more than %d symbolic links", w->whole, MAX_LINKS);
    char target[PATH_MAX];
    ssize_t n = readlinkat(lfd, "", target, sizeof target - 1);
    if (n < 0) return shm_fail(-errno, "%s: %.*s: %s", w->whole, len, at, strerror(errno));
    target[n] = 0;
    return walk_path(w, cur, target, check_last, out);
}

/* Walks path from directory at (or from / for an absolute path) and sets
 * *out to an O_PATH descriptor of the directory it names. Every directory
 * on the way is checked as the way to one stash writes into (for OWN and
 * PLACE), the last one only with check_last: the caller checks it as the
 * place itself. */
static int walk_path(walk *w, int at, const char *path, bool check_last, int *out)
{
    int cur = path[0] == '/'   ? open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)
              : at == AT_FDCWD ? open(".", O_PATH | O_DIRECTORY | O_CLOEXEC)
                               : fcntl(at, F_DUPFD_CLOEXEC, 3);
    if (cur < 0) return shm_fail(-errno, "%s: %s", w->whole, strerror(errno));
    int rc = 0;
    for (const char *p = path; rc == 0 && *p;) {
        while (*p == '/') p++;
        if (!*p) break;
        const char *end = strchrnul(p, '/');
        char name[NAME_MAX + 1];
        int len = (int)(end - path);
        if ((size_t)(end - p) > NAME_MAX) {
            rc = shm_fail(-ENAMETOOLONG, "%s: a name longer than %d bytes", w->whole, NAME_MAX);
            break;
        }
        memcpy(name, p, (size_t)(end - p));
        name[end - p] = 0;
        p = end;
        while (*p == '/') p++;
        bool last = !*p;
        if (strcmp(name, ".") == 0) continue;
        int fd = openat(cur, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0) {
            rc = shm_fail(-errno, "%s: %.*s: %s", w->whole, len, path, strerror(errno));
            if (fd >= 0) close(fd);
            break;
        }
        if (S_ISLNK(st.st_mode)) {
            int to = -1;
            rc = follow_link(w, cur, fd, &st, path, len, check_last || !last, &to);
            close(fd);
            fd = to;
            if (rc == 0 && fstat(fd, &st) < 0) rc = -errno;
        }
        if (rc == 0 && !S_ISDIR(st.st_mode))
            rc = shm_fail(-ENOTDIR, "%s: %.*s is not a directory", w->whole, len, path);
        if (rc == 0 && (check_last || !last) && (w->how & (SHM_DIR_OWN | SHM_DIR_PLACE)))
            rc = check_way(w, &st, path, len);
        if (rc) {
            if (fd >= 0) close(fd);
            break;
        }
        close(cur);
        cur = fd;
    }
    if (rc) {
        close(cur);
        return rc;
    }
    *out = cur;
    return 0;
}

/* The last component of path (trailing slashes aside) in *name, and the
 * length of what comes before it. Returns -EINVAL for a path without one
 * (empty, "/", ending in "." or ".."). */
static int split_last(const char *path, char *name, size_t *parent_len)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    if (n - b == 0 || n - b > NAME_MAX) return -EINVAL;
    memcpy(name, path + b, n - b);
    name[n - b] = 0;
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || strcmp(name, "/") == 0) return -EINVAL;
    *parent_len = b;
    return 0;
}

/* Checks the directory a descriptor names as how asks. */
static int check_final(const char *path, int fd, unsigned how, uid_t *uid)
{
    struct stat st;
    if (fstat(fd, &st) < 0) return shm_fail(-errno, "%s: %s", path, strerror(errno));
    *uid = st.st_uid;
    if (how & SHM_DIR_PLACE) {
        walk w = {.how = how, .whole = path};
        int rc = check_way(&w, &st, path, (int)strlen(path));
        if (rc) return rc;
    }
    if (how & SHM_DIR_OWN) {
        if (st.st_uid != geteuid())
            return shm_fail(-EPERM, "%s: owned by user %u, not by this user (%u): refused", path,
                            (unsigned)st.st_uid, (unsigned)geteuid());
        if (st.st_mode & S_IWOTH)
            return shm_fail(-EPERM, "%s: writable by any user (mode %04o): refused", path,
                            (unsigned)(st.st_mode & 07777));
        if ((st.st_mode & S_IWGRP) && !(how & SHM_DIR_GROUP))
            return shm_fail(-EPERM, "%s: writable by its group (mode %04o): refused", path,
                            (unsigned)(st.st_mode & 07777));
    }
    return 0;
}

int shm_path_absolute(const char *path, char *out, size_t cap)
{
    if (path[0] == '/') {
        if ((size_t)snprintf(out, cap, "%s", path) >= cap)
            return shm_fail(-ENAMETOOLONG, "%.64s...: a path longer than %zu bytes", path, cap - 1);
        return 0;
    }
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        return shm_fail(-errno, "%s: the working directory: %s", path, strerror(errno));
    if ((size_t)snprintf(out, cap, "%s/%s", cwd, path) >= cap)
        return shm_fail(-ENAMETOOLONG, "%s/%.64s...: a path longer than %zu bytes", cwd, path,
                        cap - 1);
    return 0;
}

int shm_dir_open(const char *path, unsigned how, shm_dir *out)
{
    *out = (shm_dir){.fd = -1};
    if (!path || !*path) return shm_fail(-EINVAL, "an empty directory path");
    if ((size_t)snprintf(out->path, sizeof out->path, "%s", path) >= sizeof out->path)
        return shm_fail(-ENAMETOOLONG, "%.64s...: a path longer than %zu bytes", path,
                        sizeof out->path - 1);
    /* A relative path is walked from / through the working directory, so
     * that the directories leading to it are checked as an absolute path's
     * are: a working directory of another user's must not let a link of
     * theirs lead stash's writes into another of this user's directories. */
    char abs[sizeof out->path];
    const char *walked = path;
    if (path[0] != '/' && (how & (SHM_DIR_OWN | SHM_DIR_PLACE))) {
        int rc = shm_path_absolute(path, abs, sizeof abs);
        if (rc) return rc;
        walked = abs;
    }
    walk w = {.how = how, .whole = path};
    int pfd = -1, rc;
    char last[NAME_MAX + 1];
    size_t plen;
    bool made = false;
    if ((how & SHM_DIR_CREATE) && split_last(walked, last, &plen) == 0) {
        char parent[sizeof out->path];
        snprintf(parent, sizeof parent, "%.*s", (int)plen, walked);
        int at = -1;
        rc = walk_path(&w, AT_FDCWD, plen ? parent : ".", true, &at);
        if (rc == 0) {
            made = mkdirat(at, last, (how & SHM_DIR_GROUP) ? 0750 : 0700) == 0;
            if (!made && errno != EEXIST)
                rc = shm_fail(-errno, "%s: cannot create: %s", path, strerror(errno));
        }
        /* The last step as every other: a link there is followed only if
         * trusted, and what it leads to is checked the same way. */
        if (rc == 0) rc = walk_path(&w, at, last, false, &pfd);
        if (at >= 0) close(at);
    } else {
        rc = walk_path(&w, AT_FDCWD, walked, false, &pfd);
    }
    if (rc) return rc;
    out->fd = openat(pfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    close(pfd);
    if (out->fd < 0) return shm_fail(-errno, "%s: cannot open: %s", path, strerror(errno));
    /* The umask must not narrow what was asked for. */
    if (made) fchmod(out->fd, (how & SHM_DIR_GROUP) ? 0750 : 0700);
    rc = check_final(path, out->fd, how, &out->uid);
    if (rc) shm_dir_close(out);
    return rc;
}

int shm_dir_openat(const shm_dir *parent, const char *name, unsigned how, shm_dir *out)
{
    *out = (shm_dir){.fd = -1};
    if ((size_t)snprintf(out->path, sizeof out->path, "%s/%s", parent->path, name) >=
        sizeof out->path)
        return shm_fail(-ENAMETOOLONG, "%s/%s: a path longer than %zu bytes", parent->path, name,
                        sizeof out->path - 1);
    bool made = false;
    if (how & SHM_DIR_CREATE) {
        made = mkdirat(parent->fd, name, (how & SHM_DIR_GROUP) ? 0750 : 0700) == 0;
        if (!made && errno != EEXIST)
            return shm_fail(-errno, "%s: cannot create: %s", out->path, strerror(errno));
    }
    out->fd = openat(parent->fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (out->fd < 0) {
        int err = errno == ELOOP ? -EPERM : -errno;
        return shm_fail(err, "%s: %s", out->path,
                        err == -EPERM ? "a symbolic link where a directory belongs: refused"
                                      : strerror(-err));
    }
    if (made) fchmod(out->fd, (how & SHM_DIR_GROUP) ? 0750 : 0700);
    int rc = check_final(out->path, out->fd, how, &out->uid);
    if (rc) shm_dir_close(out);
    return rc;
}

int shm_dir_open_named(const stash_arena *a, const char *path, shm_dir *out)
{
    int rc = shm_dir_open(path, 0, out);
    if (rc) return rc;
    struct stat st;
    if (fstat(out->fd, &st) < 0) {
        rc = shm_fail(-errno, "%s: %s", path, strerror(errno));
    } else if (st.st_uid != a->owner && st.st_uid != geteuid()) {
        rc = shm_fail(-EPERM,
                      "%s (named by %s): owned by user %u, not by the arena's owner (%u): "
                      "refused",
                      path, a->path, (unsigned)st.st_uid, (unsigned)a->owner);
    } else if (st.st_mode & S_IWOTH) {
        rc = shm_fail(-EPERM, "%s (named by %s): writable by any user (mode %04o): refused", path,
                      a->path, (unsigned)(st.st_mode & 07777));
    }
    if (rc) shm_dir_close(out);
    return rc;
}

void shm_dir_close(shm_dir *d)
{
    if (d && d->fd >= 0) close(d->fd);
    if (d) d->fd = -1;
}

int shm_dir_sync(const shm_dir *d)
{
    return fsync(d->fd) < 0 ? shm_fail(-errno, "fsync %s: %s", d->path, strerror(errno)) : 0;
}

/* Removes name in directory dirfd, and within it, depth levels down. */
static int remove_at(int dirfd, const char *name, int depth)
{
    if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT) return 0;
    if (errno != EISDIR || depth < 0) return -errno;
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -errno;
    }
    int rc = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        int r = remove_at(fd, de->d_name, depth - 1);
        if (r && !rc) rc = r;
    }
    closedir(d);
    if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && !rc) rc = -errno;
    return rc;
}

int shm_dir_remove(const shm_dir *d, const char *name, int depth)
{
    int rc = remove_at(d->fd, name, depth);
    return rc ? shm_fail(rc, "%s/%s: cannot remove: %s", d->path, name, strerror(-rc)) : 0;
}

DIR *shm_dir_list(const shm_dir *d)
{
    int fd = openat(d->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir && fd >= 0) {
        int err = errno;
        close(fd);
        errno = err;
    }
    return dir;
}

int shm_dir_probe(const shm_dir *d)
{
    /* Permissions alone say nothing to root or of a read-only mount: try,
     * with a file that has no name to leave behind. */
    int fd = openat(d->fd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR)) {
        char name[64];
        snprintf(name, sizeof name, ".stash-probe-%d", (int)getpid());
        fd = openat(d->fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0) unlinkat(d->fd, name, 0);
    }
    if (fd < 0) return shm_fail(-errno, "%s: cannot write into it: %s", d->path, strerror(errno));
    close(fd);
    return 0;
}

/* Whether the process whose pid follows prefix in name is gone. */
/* Whether name holds marker followed by a maker's part (its pid, '-' and
 * 8 hex digits, as shm_dir_temp makes them) and that process is gone. */
static bool maker_gone(const char *name, const char *marker)
{
    const char *at = strstr(name, marker);
    if (!at) return false;
    char *end;
    long pid = strtol(at + strlen(marker), &end, 10);
    if (pid <= 0 || *end != '-' || strlen(end + 1) != 8 || strspn(end + 1, "0123456789abcdef") != 8)
        return false;
    char proc[32];
    snprintf(proc, sizeof proc, "/proc/%ld", pid);
    return access(proc, F_OK) != 0 && errno == ENOENT;
}

/* Removes what makers of temporary directories that died left in parent:
 * this user's directories whose name starts with prefix (with anchored) or
 * holds it, followed by a maker's part, whose maker is gone and whose lock
 * no one holds. */
static void remove_left(const shm_dir *parent, const char *prefix, bool anchored)
{
    DIR *d = shm_dir_list(parent);
    if (!d) return;
    size_t n = strlen(prefix);
    for (struct dirent *de; (de = readdir(d));) {
        if ((anchored && strncmp(de->d_name, prefix, n) != 0) || !maker_gone(de->d_name, prefix))
            continue;
        shm_dir left;
        if (shm_dir_openat(parent, de->d_name, SHM_DIR_OWN, &left) != 0) continue;
        bool free = flock(left.fd, LOCK_EX | LOCK_NB) == 0;
        shm_dir_close(&left);
        if (free) remove_at(parent->fd, de->d_name, 2);
    }
    closedir(d);
}

void shm_dir_remove_left(const shm_dir *parent, const char *marker)
{
    remove_left(parent, marker, false);
}

int shm_dir_temp(const shm_dir *parent, const char *prefix, shm_dir *out)
{
    *out = (shm_dir){.fd = -1};
    remove_left(parent, prefix, true);
    for (int tries = 0; tries < 16; tries++) {
        uint32_t r = 0;
        if (getrandom(&r, sizeof r, 0) != sizeof r) r = (uint32_t)rand();
        char name[NAME_MAX + 1];
        if ((size_t)snprintf(name, sizeof name, "%s%d-%08x", prefix, (int)getpid(), r) >=
            sizeof name)
            return shm_fail(-ENAMETOOLONG, "%s/%s: a name too long", parent->path, prefix);
        if (mkdirat(parent->fd, name, 0700) < 0) {
            if (errno == EEXIST) continue;
            return shm_fail(-errno, "%s/%s: cannot create: %s", parent->path, name,
                            strerror(errno));
        }
        int rc = shm_dir_openat(parent, name, SHM_DIR_OWN, out);
        /* Held until it goes: a later maker that can take it knows this one died. */
        if (rc == 0 && flock(out->fd, LOCK_EX | LOCK_NB) < 0)
            rc = shm_fail(-errno, "%s: cannot lock: %s", out->path, strerror(errno));
        if (rc) {
            shm_dir_close(out);
            unlinkat(parent->fd, name, AT_REMOVEDIR);
        }
        return rc;
    }
    return shm_fail(-EEXIST, "%s/%s...: no free name", parent->path, prefix);
}

int shm_dir_temp_remove(const shm_dir *parent, shm_dir *t)
{
    if (t->fd < 0) return 0;
    const char *name = strrchr(t->path, '/') + 1;
    int rc = remove_at(parent->fd, name, 2);
    shm_dir_close(t);
    return rc ? shm_fail(rc, "%s: cannot remove: %s", t->path, strerror(-rc)) : 0;
}

/* The first directory of a list systemd gives a service in var (its
 * RuntimeDirectory= or StateDirectory=, absolute, colon-separated). */
static bool systemd_dir(const char *var, char *out, size_t cap)
{
    const char *v = getenv(var);
    if (!v || v[0] != '/') return false;
    size_t n = strcspn(v, ":");
    if (n >= cap) return false;
    snprintf(out, cap, "%.*s", (int)n, v);
    return true;
}

int shm_private_path(shm_private kind, const char *name, char *out, size_t cap)
{
    char base[256];
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    uid_t uid = geteuid();
    if (kind == SHM_PRIVATE_RUNTIME) {
        if (systemd_dir("RUNTIME_DIRECTORY", base, sizeof base))
            ;
        else if (uid == 0)
            snprintf(base, sizeof base, "/run/stash");
        else if (xdg && xdg[0] == '/' && strlen(xdg) < 200)
            snprintf(base, sizeof base, "%s/stash", xdg);
        else
            snprintf(base, sizeof base, "/dev/shm/stash-%u", (unsigned)uid);
    } else if (!systemd_dir("STATE_DIRECTORY", base, sizeof base)) {
        if (uid == 0)
            snprintf(base, sizeof base, "/var/lib/stash");
        else
            snprintf(base, sizeof base, "/var/tmp/stash-%u", (unsigned)uid);
    }
    shm_dir d;
    int rc = shm_dir_open(base, SHM_DIR_OWN | SHM_DIR_CREATE, &d);
    if (rc) return rc;
    shm_dir_close(&d);
    if ((size_t)snprintf(out, cap, "%s/%s", base, name) >= cap)
        return shm_fail(-ENAMETOOLONG, "%s/%s: a path longer than %zu bytes", base, name, cap - 1);
    return 0;
}
