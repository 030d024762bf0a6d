/* SPDX-License-Identifier: MIT */
/*
 * rados_mirror.c: a job's checkpoints in RADOS, mirrored from and into a
 * local checkpoint directory (Flink's checkpoints in a distributed store,
 * with a local copy for recovery). An object's name is the file's path in
 * the directory under the job's prefix: JOB/chk-ID/_metadata,
 * JOB/chk-ID/kg-data.dat, JOB/shared/ID.dat, JOB/savepoint-ID/... A
 * checkpoint is in RADOS once its metadata object is written and JOB/latest
 * has been moved to its id from the id it named before; a savepoint once
 * its metadata is written.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/checkpoint/ckpt.h"
#include "backends/checkpoint/rados.h"

#define LATEST "latest"
#define CLAIM "_claim" /* JOB/chk-ID/_claim: the engine that writes chk-ID */

/* The object name of a file (as a checkpoint's metadata names it, or
 * "_metadata") of checkpoint directory dirname ("chk-12"). */
static int object_of(char *out, size_t cap, const char *job, const char *dirname, const char *file)
{
    bool shared = strncmp(file, CKPT_SHARED_DIR "/", sizeof CKPT_SHARED_DIR) == 0;
    int n = shared ? snprintf(out, cap, "%s/%s", job, file)
                   : snprintf(out, cap, "%s/%s/%s", job, dirname, file);
    return n > 0 && (size_t)n < cap ? 0 : shm_fail(-ENAMETOOLONG, "%s/%s: too long", job, file);
}

static bool rados_has_file(ckpt_rados *r, const char *name)
{
    uint64_t len;
    return ckpt_rados_file_size(r, name, &len) == 0;
}

/* Copies the file at path into the objects of name. */
static int put_file(ckpt_rados *r, const char *name, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        int rc = shm_fail(-errno, "%s: cannot read: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return rc;
    }
    int rc = ckpt_rados_put_fd(r, name, fd, path, (uint64_t)st.st_size);
    close(fd);
    return rc;
}

int ckpt_rados_upload(ckpt_rados *r, const char *job, const char *chk, uint64_t prev, ioe_engine *e)
{
    ckpt_view v;
    int rc = ckpt_open_view(chk, e, &v, false);
    if (rc) return rc;
    const char *slash = strrchr(chk, '/');
    const char *dirname = slash ? slash + 1 : chk;
    bool checkpoint = strncmp(dirname, "chk-", 4) == 0;
    char name[1024], owner[300], host[256] = "";
    /* The id is this engine's before anything of it is written: another
     * engine of the job that took the same id must not write over it. */
    gethostname(host, sizeof host - 1);
    snprintf(owner, sizeof owner, "%d@%s", (int)getpid(), host);
    snprintf(name, sizeof name, "%s/%s/%s", job, dirname, CLAIM);
    rc = ckpt_rados_swap(r, name, NULL, owner);
    if (rc == -ECANCELED)
        rc = shm_fail(rc, "rados://%s/%s/%s: taken by another engine of the job",
                      ckpt_rados_pool(r), job, dirname);
    /* Data next: the metadata names only files that are there. */
    for (uint32_t f = 0; rc == 0 && f < v.nfiles; f++) {
        const ckpt_file *cf = &v.files[f];
        bool shared = strncmp(cf->name, CKPT_SHARED_DIR "/", sizeof CKPT_SHARED_DIR) == 0;
        rc = object_of(name, sizeof name, job, dirname, cf->name);
        /* A shared file went up with the checkpoint that wrote it. */
        if (rc == 0 && !(shared && f + 1 < v.nfiles && rados_has_file(r, name)))
            rc = put_file(r, name, cf->path);
    }
    if (rc == 0) rc = object_of(name, sizeof name, job, dirname, "_metadata");
    if (rc == 0) rc = ckpt_rados_write_file(r, name, v.md, v.md_len);
    if (rc == 0 && checkpoint) {
        char was[32], now[32];
        snprintf(was, sizeof was, "%llu", (unsigned long long)prev);
        snprintf(now, sizeof now, "%llu", (unsigned long long)v.id);
        snprintf(name, sizeof name, "%s/%s", job, LATEST);
        rc = ckpt_rados_swap(r, name, prev ? was : NULL, now);
    }
    ckpt_view_close(&v);
    return rc;
}

int ckpt_rados_latest(ckpt_rados *r, const char *job, uint64_t *id)
{
    char name[1024], value[32];
    snprintf(name, sizeof name, "%s/%s", job, LATEST);
    int rc = ckpt_rados_pointer(r, name, value, sizeof value);
    if (rc) return rc;
    char *end;
    *id = strtoull(value, &end, 10);
    if (*end || !*id)
        return shm_fail(STASH_ECORRUPT, "rados://%s/%s: '%s' names no checkpoint",
                        ckpt_rados_pool(r), name, value);
    return 0;
}

/* Writes len bytes to the new file path and makes them durable. */
static int write_new(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    int rc = fd < 0 ? shm_fail(-errno, "%s: cannot create: %s", path, strerror(errno)) : 0;
    for (size_t off = 0; rc == 0 && off < len;) {
        ssize_t n = write(fd, (const uint8_t *)data + off, len - off);
        if (n < 0) rc = shm_fail(-errno, "write %s at offset %zu: %s", path, off, strerror(errno));
        off += n > 0 ? (size_t)n : 0;
    }
    if (rc == 0 && fsync(fd) < 0) rc = shm_fail(-errno, "fsync %s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return rc;
}

/* Downloads the objects of name into the new file path, made durable. */
static int fetch_file(ckpt_rados *r, const char *name, const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return shm_fail(-errno, "%s: cannot create: %s", path, strerror(errno));
    uint64_t len;
    int rc = ckpt_rados_get_fd(r, name, fd, path, &len);
    if (rc == 0 && fsync(fd) < 0) rc = shm_fail(-errno, "fsync %s: %s", path, strerror(errno));
    close(fd);
    return rc;
}

int ckpt_rados_fetch(ckpt_rados *r, const char *job, const char *dir, const char *dirname)
{
    char chk[4096], stage[4096], path[4096], final[4096], name[1024];
    int rc = ckpt_path_of(chk, "%s/%s", dir, dirname);
    if (rc == 0 && ckpt_path_of(path, "%s/_metadata", chk) == 0 && access(path, F_OK) == 0)
        return 0; /* the local copy */
    /* Fetched beside the directory's checkpoints; each file moved into
     * place once whole, the checkpoint's directory last. */
    if (rc == 0) rc = ckpt_path_of(stage, "%s/.fetch-%s-%d", dir, dirname, (int)getpid());
    if (rc == 0 && mkdir(stage, 0700) < 0)
        rc = shm_fail(-errno, "%s: cannot create: %s", stage, strerror(errno));
    if (rc) return rc;
    ckpt_view v = {0};
    rc = object_of(name, sizeof name, job, dirname, "_metadata");
    if (rc == 0)
        snprintf(v.meta_path, sizeof v.meta_path, "rados://%s/%s", ckpt_rados_pool(r), name);
    if (rc == 0) rc = ckpt_rados_read_file(r, name, CKPT_MAX_METADATA, &v.md, &v.md_len);
    if (rc == 0) rc = ckpt_view_parse(&v);
    /* A directory named for an id holds that id's metadata. */
    char *end;
    const char *dash = strrchr(dirname, '-');
    uint64_t named = dash ? strtoull(dash + 1, &end, 10) : 0;
    if (rc == 0 && named && !*end && v.id != named)
        rc = shm_fail(STASH_ECORRUPT, "%s: names checkpoint %llu, not %llu", v.meta_path,
                      (unsigned long long)v.id, (unsigned long long)named);
    for (uint32_t f = 0; rc == 0 && f < v.nfiles; f++) {
        const char *file = v.files[f].name;
        bool in_shared = strncmp(file, CKPT_SHARED_DIR "/", sizeof CKPT_SHARED_DIR) == 0;
        const char *base = in_shared ? file + sizeof CKPT_SHARED_DIR : file;
        if (in_shared && (rc = ckpt_path_of(path, "%s/%s", dir, CKPT_SHARED_DIR)) == 0)
            rc = shm_own_dir(path, 0700);
        if (rc == 0) rc = object_of(name, sizeof name, job, dirname, file);
        if (rc == 0) rc = ckpt_path_of(final, "%s/%s", dir, file);
        if (rc == 0 && in_shared && access(final, F_OK) == 0)
            continue; /* a chain's file fetched with an earlier checkpoint */
        if (rc == 0) rc = ckpt_path_of(path, "%s/%s", stage, base);
        if (rc == 0) rc = fetch_file(r, name, path);
        if (rc == 0 && in_shared && rename(path, final) < 0)
            rc = shm_fail(-errno, "rename %s to %s: %s", path, final, strerror(errno));
    }
    if (rc == 0) rc = ckpt_path_of(path, "%s/_metadata", stage);
    if (rc == 0) rc = write_new(path, v.md, v.md_len);
    if (rc == 0 && rename(stage, chk) < 0)
        rc = shm_fail(-errno, "rename %s to %s: %s", stage, chk, strerror(errno));
    if (rc) ckpt_remove_checkpoint(stage);
    ckpt_view_close(&v);
    return rc;
}

/* The job's checkpoints found by listing: each id once, and whether its
 * metadata is there. */
typedef struct found {
    const char *job;
    uint64_t *ids;
    bool *committed;
    size_t n, cap;
} found;

static int take_id(void *ctx, const char *name)
{
    found *f = ctx;
    char *end;
    uint64_t id = strtoull(name + strlen(f->job) + strlen("/chk-"), &end, 10);
    if (!id || *end != '/') return 0;
    bool md = strcmp(end, "/_metadata.0") == 0;
    for (size_t i = 0; i < f->n; i++)
        if (f->ids[i] == id) {
            f->committed[i] |= md;
            return 0;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 16;
        uint64_t *ids = realloc(f->ids, cap * sizeof *ids);
        if (ids) f->ids = ids;
        bool *c = ids ? realloc(f->committed, cap * sizeof *c) : NULL;
        if (!c) return shm_fail(-ENOMEM, "out of memory");
        f->committed = c;
        f->cap = cap;
    }
    f->ids[f->n] = id;
    f->committed[f->n++] = md;
    return 0;
}

/* The shared files checkpoint id of the job lists, appended to names. */
static int list_shared(ckpt_rados *r, const char *job, uint64_t id, char ***names, size_t *n)
{
    char name[1024];
    snprintf(name, sizeof name, "%s/chk-%llu/_metadata", job, (unsigned long long)id);
    ckpt_view v = {0};
    snprintf(v.meta_path, sizeof v.meta_path, "rados://%s/%s", ckpt_rados_pool(r), name);
    int rc = ckpt_rados_read_file(r, name, CKPT_MAX_METADATA, &v.md, &v.md_len);
    if (rc == 0) rc = ckpt_view_parse(&v);
    for (uint32_t f = 0; rc == 0 && f < v.nfiles; f++) {
        if (strncmp(v.files[f].name, CKPT_SHARED_DIR "/", sizeof CKPT_SHARED_DIR) != 0) continue;
        char **grown = realloc(*names, (*n + 1) * sizeof **names);
        if (!grown || !(grown[*n] = strdup(v.files[f].name))) {
            if (grown) *names = grown;
            rc = shm_fail(-ENOMEM, "out of memory");
            break;
        }
        *names = grown;
        (*n)++;
    }
    ckpt_view_close(&v);
    return rc;
}

/* Collects the job's shared files that none of keep lists into *gone. */
typedef struct unlisted {
    const char *job;
    char **keep;
    size_t nkeep;
    char **gone;
    size_t ngone;
} unlisted;

static int take_unlisted(void *ctx, const char *name)
{
    unlisted *u = ctx;
    const char *file = name + strlen(u->job) + 1; /* shared/ID.dat.K */
    const char *dot = strrchr(file, '.');
    if (!dot || strcmp(dot, ".0") != 0) return 0;
    size_t len = (size_t)(dot - file);
    for (size_t i = 0; i < u->nkeep; i++)
        if (strlen(u->keep[i]) == len && strncmp(u->keep[i], file, len) == 0) return 0;
    char **grown = realloc(u->gone, (u->ngone + 1) * sizeof *grown);
    if (!grown) return shm_fail(-ENOMEM, "out of memory");
    u->gone = grown;
    if (!(grown[u->ngone] = strndup(name, (size_t)(dot - name))))
        return shm_fail(-ENOMEM, "out of memory");
    u->ngone++;
    return 0;
}

int ckpt_rados_checkpoints(ckpt_rados *r, const char *job, uint64_t **ids, bool **committed,
                           size_t *n)
{
    char prefix[1024];
    snprintf(prefix, sizeof prefix, "%s/chk-", job);
    found f = {job, NULL, NULL, 0, 0};
    int rc = ckpt_rados_list(r, prefix, take_id, &f);
    /* Newest first, as ckpt_list gives a directory's. */
    for (size_t i = 1; rc == 0 && i < f.n; i++)
        for (size_t j = i; j > 0 && f.ids[j] > f.ids[j - 1]; j--) {
            uint64_t t = f.ids[j];
            bool c = f.committed[j];
            f.ids[j] = f.ids[j - 1], f.committed[j] = f.committed[j - 1];
            f.ids[j - 1] = t, f.committed[j - 1] = c;
        }
    if (rc) {
        free(f.ids);
        free(f.committed);
        return rc;
    }
    *ids = f.ids;
    *committed = f.committed;
    *n = f.n;
    return 0;
}

int ckpt_rados_retain(ckpt_rados *r, const char *job, unsigned keep)
{
    uint64_t latest;
    int rc = ckpt_rados_latest(r, job, &latest);
    if (rc == -ENOENT) return 0;
    if (rc) return rc;
    char prefix[1024], name[1024];
    snprintf(prefix, sizeof prefix, "%s/chk-", job);
    found f = {job, NULL, NULL, 0, 0};
    rc = ckpt_rados_list(r, prefix, take_id, &f);
    if (rc) {
        free(f.ids);
        free(f.committed);
        return rc;
    }
    /* Kept: the newest keep committed at or below latest. Newer ones are
     * being written; older partial ones failed. */
    char **shared = NULL;
    size_t nshared = 0;
    for (unsigned kept = 0; rc == 0 && kept < keep; kept++) {
        size_t best = f.n;
        for (size_t i = 0; i < f.n; i++)
            if (f.committed[i] && f.ids[i] <= latest && (best == f.n || f.ids[i] > f.ids[best]))
                best = i;
        if (best == f.n) break;
        rc = list_shared(r, job, f.ids[best], &shared, &nshared);
        f.ids[best] = 0; /* kept: not removed below */
    }
    for (size_t i = 0; rc == 0 && i < f.n; i++) {
        if (!f.ids[i] || f.ids[i] > latest) continue;
        /* Its metadata first: a checkpoint half removed is one no longer. */
        snprintf(name, sizeof name, "%s/chk-%llu/_metadata", job, (unsigned long long)f.ids[i]);
        rc = ckpt_rados_remove_file(r, name);
        snprintf(name, sizeof name, "%s/chk-%llu/", job, (unsigned long long)f.ids[i]);
        if (rc == 0) rc = ckpt_rados_remove_prefix(r, name);
    }
    unlisted u = {job, shared, nshared, NULL, 0};
    snprintf(prefix, sizeof prefix, "%s/%s/", job, CKPT_SHARED_DIR);
    if (rc == 0) rc = ckpt_rados_list(r, prefix, take_unlisted, &u);
    for (size_t i = 0; rc == 0 && i < u.ngone; i++) rc = ckpt_rados_remove_file(r, u.gone[i]);
    for (size_t i = 0; i < u.ngone; i++) free(u.gone[i]);
    for (size_t i = 0; i < nshared; i++) free(shared[i]);
    free(u.gone);
    free(shared);
    free(f.ids);
    free(f.committed);
    return rc;
}

/* ---- rados:// URLs ---------------------------------------------------------- */

bool ckpt_rados_url(const char *path)
{
    return strncmp(path, CKPT_RADOS_URL, sizeof CKPT_RADOS_URL - 1) == 0;
}

int ckpt_rados_url_open(const char *url, ckpt_rados **r, char *job, size_t job_cap, char *name,
                        size_t name_cap)
{
    /* rados://POOL/JOB[/NAME]: JOB may hold slashes; NAME is chk-ID,
     * savepoint-ID or another savepoint's name. */
    const char *p = url + sizeof CKPT_RADOS_URL - 1, *slash = strchr(p, '/');
    char pool[128];
    if (!slash || slash == p || (size_t)(slash - p) >= sizeof pool || !slash[1])
        return shm_fail(-EINVAL, "%s: not rados://POOL/JOB[/chk-ID]", url);
    snprintf(pool, sizeof pool, "%.*s", (int)(slash - p), p);
    const char *rest = slash + 1, *last = strrchr(rest, '/');
    bool named = last && last[1] &&
                 (strncmp(last + 1, "chk-", 4) == 0 || strncmp(last + 1, "savepoint-", 10) == 0);
    size_t jlen = named ? (size_t)(last - rest) : strlen(rest);
    while (jlen && rest[jlen - 1] == '/') jlen--;
    if (!jlen || jlen >= job_cap) return shm_fail(-EINVAL, "%s: no job named", url);
    snprintf(job, job_cap, "%.*s", (int)jlen, rest);
    snprintf(name, name_cap, "%s", named ? last + 1 : "");
    const char *id = getenv("STASH_CEPH_ID");
    return ckpt_rados_open(&(ckpt_rados_opts){.pool = pool, .id = id && *id ? id : NULL}, r);
}

int ckpt_rados_url_fetch(const char *url, const char *tmp, char *local, size_t cap)
{
    ckpt_rados *r;
    char job[256], name[256], dir[4096];
    int rc = ckpt_rados_url_open(url, &r, job, sizeof job, name, sizeof name);
    if (rc) return rc;
    uint64_t id;
    if (!name[0] && (rc = ckpt_rados_latest(r, job, &id)) == 0)
        snprintf(name, sizeof name, "chk-%llu", (unsigned long long)id);
    if (rc == 0) rc = ckpt_path_of(dir, "%s/stash-rados-XXXXXX", tmp ? tmp : "/var/tmp");
    if (rc == 0 && !mkdtemp(dir)) rc = shm_fail(-errno, "%s: %s", dir, strerror(errno));
    if (rc == 0) rc = ckpt_rados_fetch(r, job, dir, name);
    if (rc == 0 && (size_t)snprintf(local, cap, "%s/%s", dir, name) >= cap)
        rc = shm_fail(-ENAMETOOLONG, "%s/%s: too long", dir, name);
    if (rc && dir[0]) ckpt_rados_url_release(dir);
    ckpt_rados_close(r);
    return rc;
}

void ckpt_rados_url_release(const char *local)
{
    /* local is TMP/stash-rados-XXXXXX/NAME, or that directory itself. */
    char dir[4096], path[4096];
    snprintf(dir, sizeof dir, "%s", local);
    char *slash = strrchr(dir, '/');
    if (slash && strncmp(slash + 1, "stash-rados-", 12) != 0) *slash = 0;
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        if (ckpt_path_of(path, "%s/%s", dir, de->d_name) == 0) ckpt_remove_checkpoint(path);
    }
    if (d) closedir(d);
    rmdir(dir);
}

int ckpt_rados_url_put(const char *local, const char *url, ioe_engine *e)
{
    ckpt_rados *r;
    char job[256], name[256];
    int rc = ckpt_rados_url_open(url, &r, job, sizeof job, name, sizeof name);
    if (rc) return rc;
    const char *slash = strrchr(local, '/');
    const char *base = slash ? slash + 1 : local;
    if (!name[0] || strcmp(name, base) != 0 || strncmp(name, "chk-", 4) == 0)
        rc = shm_fail(-EINVAL, "%s: a savepoint goes to rados://POOL/JOB/%s", url, base);
    char md[1024];
    uint64_t len;
    if (rc == 0 && snprintf(md, sizeof md, "%s/%s/_metadata", job, name) > 0 &&
        ckpt_rados_file_size(r, md, &len) == 0)
        rc = shm_fail(-EEXIST, "%s: exists already", url);
    if (rc == 0) rc = ckpt_rados_upload(r, job, local, 0, e);
    ckpt_rados_close(r);
    return rc;
}
