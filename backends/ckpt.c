/*
 * ckpt.c: full checkpoints in a directory. The writer serializes every key
 * group into one data file through the I/O engine, makes it durable, then
 * commits by renaming a synced _metadata into place: a checkpoint without a
 * valid _metadata does not exist. The reader trusts no byte: the metadata's
 * checksum, counts, names and ranges, and every block, are checked before
 * anything is restored, and a damaged checkpoint gives way to the previous one.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/ckpt.h"

#define DATA_FILE "kg-data.dat"
#define CHUNK (1u << 20)
#define MAX_METADATA (64u << 20)

typedef struct md_header {
    char magic[8];
    uint32_t format_version;
    uint32_t flags;
    uint64_t id;
    uint64_t created_ns;
    uint32_t backend;
    uint32_t max_parallelism;
    uint32_t nstates;
    uint32_t nfiles;
} md_header;

typedef struct md_file {
    char name[64];
    uint32_t first_kg;
    uint32_t last_kg;
} md_file;

typedef struct md_extent {
    uint64_t offset;
    uint64_t size;
} md_extent;

/* Formats a path into out (4096 bytes); -ENAMETOOLONG if it does not fit. */
__attribute__((format(printf, 2, 3))) static int path_of(char *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, 4096, fmt, ap);
    va_end(ap);
    return n < 0 || n >= 4096 ? shm_fail(-ENAMETOOLONG, "a path longer than 4095 bytes") : 0;
}

/* ---- files through the engine -------------------------------------------- */

/* Reaps until at most keep requests are outstanding; the first failure wins. */
static int drain(ioe_engine *e, unsigned keep, int rc)
{
    ioe_cqe c[16];
    while (ioe_outstanding(e) > keep) {
        int n = ioe_reap(e, c, 16, 1);
        if (n < 0) return rc ? rc : shm_fail(n, "waiting for I/O: %s", stash_strerror(n));
        for (int i = 0; i < n; i++) {
            if (c[i].res >= 0 || rc) continue;
            char what[300];
            ioe_cqe_describe(&c[i], what, sizeof what);
            rc = shm_fail(c[i].res, "%s", what);
        }
    }
    return rc;
}

/* Writes len bytes to a new file at path and makes them durable. */
static int write_durable(ioe_engine *e, const char *path, const void *data, size_t len)
{
    ioe_file *f;
    int rc = ioe_file_open(e, path, O_WRONLY | O_CREAT | O_TRUNC, 0644, &f);
    if (rc < 0) return shm_fail(rc, "%s: cannot create: %s", path, stash_strerror(rc));
    for (size_t off = 0; off < len && rc == 0;) {
        size_t n = len - off < CHUNK ? len - off : CHUNK;
        int q = ioe_write(f, (const uint8_t *)data + off, n, off, NULL);
        if (q == -EBUSY) {
            rc = drain(e, ioe_outstanding(e) - 1, 0);
            continue;
        }
        if (q < 0) rc = shm_fail(q, "write %s at offset %zu: %s", path, off, stash_strerror(q));
        off += n;
    }
    if (rc == 0) {
        while ((rc = ioe_fsync(f, NULL)) == -EBUSY) rc = drain(e, ioe_outstanding(e) - 1, 0);
        if (rc < 0) rc = shm_fail(rc, "fsync %s: %s", path, stash_strerror(rc));
    }
    rc = drain(e, 0, rc);
    ioe_file_close(f);
    return rc;
}

/* Reads the whole file at path into *out (malloc'd). */
static int read_whole(ioe_engine *e, const char *path, size_t limit, uint8_t **out, size_t *len)
{
    ioe_file *f;
    int rc = ioe_file_open(e, path, O_RDONLY, 0, &f);
    if (rc < 0) return shm_fail(rc, "%s: cannot open: %s", path, stash_strerror(rc));
    struct stat st;
    if (fstat(ioe_file_fd(f), &st) < 0 || (uint64_t)st.st_size > limit) {
        ioe_file_close(f);
        return shm_fail(STASH_ECORRUPT, "%s: %lld bytes, more than %zu", path,
                        (long long)st.st_size, limit);
    }
    *len = (size_t)st.st_size;
    *out = malloc(*len ? *len : 1);
    if (!*out) {
        ioe_file_close(f);
        return -ENOMEM;
    }
    for (size_t off = 0; off < *len && rc == 0;) {
        size_t n = *len - off < CHUNK ? *len - off : CHUNK;
        int q = ioe_read(f, *out + off, n, off, NULL);
        if (q == -EBUSY) {
            rc = drain(e, ioe_outstanding(e) - 1, 0);
            continue;
        }
        if (q < 0) rc = shm_fail(q, "read %s at offset %zu: %s", path, off, stash_strerror(q));
        off += n;
    }
    rc = drain(e, 0, rc);
    ioe_file_close(f);
    if (rc) free(*out);
    return rc;
}

static int sync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return shm_fail(-errno, "%s: cannot open: %s", path, strerror(errno));
    int rc = fsync(fd) < 0 ? shm_fail(-errno, "fsync %s: %s", path, strerror(errno)) : 0;
    close(fd);
    return rc;
}

/* Removes a checkpoint's directory and the files in it. */
static void remove_checkpoint(const char *chk)
{
    DIR *d = opendir(chk);
    if (d) {
        char path[4096];
        for (struct dirent *de; (de = readdir(d));) {
            if (de->d_name[0] == '.') continue;
            if (path_of(path, "%s/%s", chk, de->d_name) == 0) unlink(path);
        }
        closedir(d);
    }
    rmdir(chk);
}

/* ---- writing ---------------------------------------------------------------- */

static int build_metadata(stash_arena *a, const ckpt_opts *o, const md_extent *ext, snap_buf *md)
{
    uint32_t maxp = a->hdr->max_parallelism, nstates = 0;
    for (uint32_t i = 0; i < SHM_CATALOG_SIZE; i++) nstates += atomic_load(&a->catalog[i].used);
    size_t bytes = sizeof(md_header) + nstates * sizeof(ckpt_state) + sizeof(md_file) +
                   maxp * sizeof(md_extent) + 4;
    if (state_reserve(&md->data, &md->cap, bytes) < 0) return -ENOMEM;
    md_header h = {.format_version = CKPT_FORMAT_VERSION,
                   .id = o->id,
                   .created_ns = shm_now_ns(),
                   .backend = CKPT_BACKEND_HEAP,
                   .max_parallelism = maxp,
                   .nstates = nstates,
                   .nfiles = 1};
    memcpy(h.magic, CKPT_MAGIC, sizeof h.magic);
    uint8_t *p = md->data;
    memcpy(p, &h, sizeof h);
    p += sizeof h;
    for (uint32_t i = 0; i < SHM_CATALOG_SIZE; i++) {
        shm_catalog_entry *c = &a->catalog[i];
        if (!atomic_load(&c->used)) continue;
        ckpt_state s = {.id = (uint16_t)(i + 1), .kind = (uint16_t)c->kind};
        memcpy(s.options, c->options, sizeof s.options);
        memcpy(s.name, c->name, sizeof s.name);
        memcpy(p, &s, sizeof s);
        p += sizeof s;
    }
    md_file f = {.first_kg = 0, .last_kg = maxp - 1};
    snprintf(f.name, sizeof f.name, "%s", DATA_FILE);
    memcpy(p, &f, sizeof f);
    p += sizeof f;
    memcpy(p, ext, maxp * sizeof *ext);
    p += maxp * sizeof *ext;
    uint32_t crc = snap_crc32c(0, md->data, (size_t)(p - md->data));
    memcpy(p, &crc, 4);
    md->len = bytes;
    return 0;
}

int ckpt_write_full(stash_arena *a, const uint32_t *pins, const ckpt_opts *o)
{
    char chk[4096], path[4096];
    if (o->id == 0) return shm_fail(-EINVAL, "a checkpoint id is > 0");
    if (mkdir(o->dir, 0755) < 0 && errno != EEXIST)
        return shm_fail(-errno, "%s: cannot create: %s", o->dir, strerror(errno));
    if (path_of(chk, "%s/%s-%llu", o->dir, o->savepoint ? "savepoint" : "chk",
                (unsigned long long)o->id) < 0)
        return -ENAMETOOLONG;
    if (mkdir(chk, 0755) < 0)
        return shm_fail(-errno, "%s: cannot create: %s", chk, strerror(errno));
    uint32_t maxp = a->hdr->max_parallelism;
    snap_buf data = {0}, md = {0};
    md_extent *ext = calloc(maxp, sizeof *ext);
    int rc = ext ? 0 : -ENOMEM;
    for (uint32_t kg = 0; kg < maxp && rc == 0; kg++) {
        ext[kg].offset = data.len;
        int64_t n = snap_write_kg(a, kg, pins[kg], o->lz4, &data);
        if (n < 0) rc = (int)n;
        ext[kg].size = data.len - ext[kg].offset;
    }
    if (rc == 0 && o->cap_bytes && data.len > o->cap_bytes)
        rc = shm_fail(-EFBIG,
                      "%s: checkpoint %llu holds %zu bytes, over the storage's cap of "
                      "%llu",
                      chk, (unsigned long long)o->id, data.len, (unsigned long long)o->cap_bytes);
    if (rc == 0) rc = path_of(path, "%s/%s", chk, DATA_FILE);
    if (rc == 0) rc = write_durable(o->engine, path, data.data, data.len);
    if (rc == 0) rc = build_metadata(a, o, ext, &md);
    char final[4096];
    if (rc == 0) rc = path_of(path, "%s/_metadata.tmp", chk);
    if (rc == 0) rc = write_durable(o->engine, path, md.data, md.len);
    if (rc == 0) rc = path_of(final, "%s/_metadata", chk);
    if (rc == 0 && rename(path, final) < 0)
        rc = shm_fail(-errno, "rename %s: %s", path, strerror(errno));
    if (rc == 0) rc = sync_dir(chk);
    if (rc == 0) rc = sync_dir(o->dir);
    if (rc) remove_checkpoint(chk);
    free(ext);
    snap_buf_free(&data);
    snap_buf_free(&md);
    return rc;
}

/* ---- reading ------------------------------------------------------------------ */

/* Checks _metadata's bytes: checksum, magic, version, counts against its
 * size, state names, the data file's name (no path may leave the checkpoint)
 * and its key-group range. */
static int parse_metadata(ckpt_view *v)
{
    const uint8_t *p = v->md;
    size_t len = v->md_len;
    const char *path = v->meta_path;
    md_header h;
    uint32_t crc;
    if (len < sizeof h + 4) return shm_fail(STASH_ECORRUPT, "%s: %zu bytes, too short", path, len);
    memcpy(&crc, p + len - 4, 4);
    if (snap_crc32c(0, p, len - 4) != crc)
        return shm_fail(STASH_ECORRUPT, "%s: offset %zu: checksum mismatch", path, len - 4);
    memcpy(&h, p, sizeof h);
    if (memcmp(h.magic, CKPT_MAGIC, 8) != 0)
        return shm_fail(STASH_ECORRUPT, "%s: offset 0: not checkpoint metadata", path);
    if (h.format_version != CKPT_FORMAT_VERSION)
        return shm_fail(STASH_EFORMAT, "%s: offset 8: format version %u, this build reads %u", path,
                        h.format_version, CKPT_FORMAT_VERSION);
    uint64_t need = sizeof h + (uint64_t)h.nstates * sizeof(ckpt_state) + sizeof(md_file) +
                    (uint64_t)h.max_parallelism * sizeof(md_extent) + 4;
    if (h.nfiles != 1 || h.max_parallelism == 0 || h.max_parallelism > STASH_MAX_MAX_PARALLELISM ||
        h.nstates > SHM_CATALOG_SIZE || need != len)
        return shm_fail(STASH_ECORRUPT,
                        "%s: offset 32: counts (%u states, %u files, %u key "
                        "groups) do not match its %zu bytes",
                        path, h.nstates, h.nfiles, h.max_parallelism, len);
    v->id = h.id;
    v->created_ns = h.created_ns;
    v->max_parallelism = h.max_parallelism;
    v->nstates = h.nstates;
    for (uint32_t i = 0; i < h.nstates; i++) {
        ckpt_state s = ckpt_view_state(v, i);
        if (s.id == 0 || s.id > SHM_CATALOG_SIZE || !memchr(s.name, 0, sizeof s.name) ||
            s.name[0] == 0)
            return shm_fail(STASH_ECORRUPT, "%s: offset %zu: a bad state entry", path,
                            sizeof h + i * sizeof(ckpt_state));
    }
    size_t at = sizeof h + h.nstates * sizeof(ckpt_state);
    md_file f;
    memcpy(&f, p + at, sizeof f);
    if (!memchr(f.name, 0, sizeof f.name) || f.name[0] == '.' || f.name[0] == 0 ||
        strchr(f.name, '/') || f.first_kg != 0 || f.last_kg != h.max_parallelism - 1)
        return shm_fail(STASH_ECORRUPT,
                        "%s: offset %zu: a data file entry that names a path "
                        "outside the checkpoint or a bad range",
                        path, at);
    v->extents = p + at + sizeof f;
    memcpy(v->data_file, f.name, sizeof f.name);
    return 0;
}

ckpt_state ckpt_view_state(const ckpt_view *v, uint32_t i)
{
    ckpt_state s;
    memcpy(&s, v->md + sizeof(md_header) + i * sizeof s, sizeof s);
    return s;
}

int ckpt_view_open_path(const char *path, ioe_engine *e, ckpt_view *v)
{
    memset(v, 0, sizeof *v);
    int rc = path_of(v->meta_path, "%s/_metadata", path);
    if (rc == 0) rc = read_whole(e, v->meta_path, MAX_METADATA, &v->md, &v->md_len);
    if (rc == 0) rc = parse_metadata(v);
    if (rc == 0) rc = path_of(v->data_path, "%s/%s", path, v->data_file);
    if (rc == 0) rc = read_whole(e, v->data_path, SIZE_MAX, &v->data, &v->data_len);
    if (rc) ckpt_view_close(v);
    return rc;
}

int ckpt_view_open(const char *dir, uint64_t id, ioe_engine *e, ckpt_view *v)
{
    char chk[4096];
    int rc = path_of(chk, "%s/chk-%llu", dir, (unsigned long long)id);
    if (rc == 0) rc = ckpt_view_open_path(chk, e, v);
    if (rc == 0 && v->id != id) {
        rc = shm_fail(STASH_ECORRUPT, "%s: offset 16: names checkpoint %llu", v->meta_path,
                      (unsigned long long)v->id);
        ckpt_view_close(v);
    }
    return rc;
}

void ckpt_view_close(ckpt_view *v)
{
    free(v->md);
    free(v->data);
    v->md = v->data = NULL;
}

static int count_only(void *ctx, uint32_t kg, const snap_record *r)
{
    (void)ctx, (void)kg, (void)r;
    return 0;
}

int64_t ckpt_view_walk(const ckpt_view *v, stash_kg_range range, snap_record_fn *fn, void *ctx)
{
    if (range.first > range.last || range.last >= v->max_parallelism)
        return shm_fail(-EINVAL, "%s: key groups %u..%u of %u", v->meta_path, range.first,
                        range.last, v->max_parallelism);
    snap_buf scratch = {0};
    int64_t total = 0;
    for (uint32_t kg = range.first; kg <= range.last && total >= 0; kg++) {
        md_extent e;
        memcpy(&e, v->extents + kg * sizeof e, sizeof e);
        snap_block b;
        int rc = 0;
        if (e.offset > v->data_len || e.size > v->data_len - e.offset)
            rc = shm_fail(STASH_ECORRUPT,
                          "%s: key group %u at offset %llu, %llu bytes, beyond "
                          "the file's %zu",
                          v->data_path, kg, (unsigned long long)e.offset,
                          (unsigned long long)e.size, v->data_len);
        if (rc == 0)
            rc = snap_read_block(v->data + e.offset, e.size, v->data_path, e.offset, &scratch, &b);
        if (rc == 0 && (b.hdr.kg != kg || b.size != e.size))
            rc = shm_fail(STASH_ECORRUPT,
                          "%s: offset %llu: the block of key group %u is not "
                          "where the metadata says",
                          v->data_path, (unsigned long long)e.offset, kg);
        int64_t n = rc ? rc
                       : snap_block_records(&b, v->max_parallelism, fn ? fn : count_only, ctx,
                                            v->data_path, e.offset);
        total = n < 0 ? n : total + n;
    }
    snap_buf_free(&scratch);
    return total;
}

/* Registers the checkpoint's states in the arena and maps their ids. */
static int map_states(stash_arena *a, const ckpt_view *v, uint16_t *ids, snap_id_map *map)
{
    memset(ids, 0, (SHM_CATALOG_SIZE + 1) * sizeof *ids);
    for (uint32_t i = 0; i < v->nstates; i++) {
        ckpt_state s = ckpt_view_state(v, i);
        int id = shm_catalog_register(a, s.name, s.kind, s.options);
        if (id < 0) return id;
        ids[s.id] = (uint16_t)id;
    }
    *map = (snap_id_map){ids, SHM_CATALOG_SIZE + 1};
    return 0;
}

/* Restores an opened checkpoint after checking all of it that the range
 * needs, and closes it. */
static int restore_view(stash_arena *a, ckpt_view *v, stash_kg_range range, uint64_t *records)
{
    int64_t n = 0;
    if (v->max_parallelism != a->hdr->max_parallelism)
        n = shm_fail(STASH_ECORRUPT, "%s: a checkpoint of %u key groups for an arena of %u",
                     v->meta_path, v->max_parallelism, a->hdr->max_parallelism);
    if (n == 0) n = ckpt_view_walk(v, range, NULL, NULL);
    uint16_t ids[SHM_CATALOG_SIZE + 1];
    snap_id_map map;
    if (n >= 0) n = map_states(a, v, ids, &map);
    snap_restorer to = {a, &map};
    if (n >= 0) n = ckpt_view_walk(v, range, snap_restore_record, &to);
    if (n >= 0) *records = (uint64_t)n;
    ckpt_view_close(v);
    return n < 0 ? (int)n : 0;
}

static int restore_one(stash_arena *a, const char *dir, uint64_t id, stash_kg_range range,
                       ioe_engine *e, uint64_t *records)
{
    ckpt_view v;
    int rc = ckpt_view_open(dir, id, e, &v);
    return rc ? rc : restore_view(a, &v, range, records);
}

int ckpt_restore_path(stash_arena *a, const char *path, stash_kg_range range, ioe_engine *e,
                      ckpt_restored *out)
{
    ckpt_view v;
    memset(out, 0, sizeof *out);
    int rc = ckpt_view_open_path(path, e, &v);
    if (rc) return rc;
    out->id = v.id;
    return restore_view(a, &v, range, &out->records);
}

int ckpt_list(const char *dir, uint64_t **ids)
{
    DIR *d = opendir(dir);
    if (!d) return shm_fail(-errno, "%s: cannot open: %s", dir, strerror(errno));
    size_t n = 0, cap = 0;
    *ids = NULL;
    for (struct dirent *de; (de = readdir(d));) {
        unsigned long long id;
        char tail;
        if (sscanf(de->d_name, "chk-%llu%c", &id, &tail) != 1 || id == 0) continue;
        if (n == cap) {
            uint64_t *grown = realloc(*ids, (cap = cap ? cap * 2 : 16) * sizeof **ids);
            if (!grown) break;
            *ids = grown;
        }
        (*ids)[n++] = id;
    }
    closedir(d);
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && (*ids)[j - 1] < (*ids)[j]; j--) {
            uint64_t t = (*ids)[j];
            (*ids)[j] = (*ids)[j - 1];
            (*ids)[j - 1] = t;
        }
    return (int)n;
}

int ckpt_restore(stash_arena *a, const char *dir, uint64_t id, stash_kg_range range, ioe_engine *e,
                 ckpt_restored *out)
{
    memset(out, 0, sizeof *out);
    if (id) {
        out->id = id;
        return restore_one(a, dir, id, range, e, &out->records);
    }
    uint64_t *ids;
    int n = ckpt_list(dir, &ids);
    if (n < 0) return n;
    int rc = shm_fail(-ENOENT, "%s: no complete checkpoint", dir);
    char meta[4096];
    for (int i = 0; i < n; i++) {
        /* Without _metadata a checkpoint does not exist: not a fallback. */
        if (path_of(meta, "%s/chk-%llu/_metadata", dir, (unsigned long long)ids[i]) < 0 ||
            access(meta, F_OK) != 0)
            continue;
        rc = restore_one(a, dir, ids[i], range, e, &out->records);
        if (rc == 0) {
            out->id = ids[i];
            break;
        }
        if (out->skipped++ == 0) snprintf(out->why, sizeof out->why, "%s", stash_errmsg());
    }
    if (rc && out->skipped)
        rc = shm_fail(rc, "%s: no checkpoint restores; the newest failed: %s", dir, out->why);
    free(ids);
    return rc;
}

int ckpt_retain(const char *dir, unsigned keep)
{
    uint64_t *ids;
    int n = ckpt_list(dir, &ids);
    if (n < 0) return n;
    unsigned complete = 0;
    char path[4096];
    for (int i = 0; i < n; i++) {
        if (path_of(path, "%s/chk-%llu/_metadata", dir, (unsigned long long)ids[i]) < 0 ||
            access(path, F_OK) != 0 || ++complete <= keep)
            continue;
        if (path_of(path, "%s/chk-%llu", dir, (unsigned long long)ids[i]) == 0)
            remove_checkpoint(path);
    }
    free(ids);
    return sync_dir(dir);
}
