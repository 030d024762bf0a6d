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

typedef struct md_state {
    uint16_t id;
    uint16_t kind;
    uint8_t options[32];
    char name[SHM_STATE_NAME];
} md_state;

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
    size_t bytes = sizeof(md_header) + nstates * sizeof(md_state) + sizeof(md_file) +
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
        md_state s = {.id = (uint16_t)(i + 1), .kind = (uint16_t)c->kind};
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
    if (path_of(chk, "%s/chk-%llu", o->dir, (unsigned long long)o->id) < 0) return -ENAMETOOLONG;
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

typedef struct parsed_md {
    md_header h;
    const md_state *states;
    md_file file;
    const md_extent *ext;
} parsed_md;

/* Checks _metadata's bytes: checksum, magic, version, counts against its
 * size, state names, the data file's name (no path may leave the checkpoint)
 * and its key-group range. */
static int parse_metadata(const uint8_t *p, size_t len, const char *path, parsed_md *out)
{
    uint32_t crc;
    if (len < sizeof(md_header) + 4)
        return shm_fail(STASH_ECORRUPT, "%s: %zu bytes, too short", path, len);
    memcpy(&crc, p + len - 4, 4);
    if (snap_crc32c(0, p, len - 4) != crc)
        return shm_fail(STASH_ECORRUPT, "%s: offset %zu: checksum mismatch", path, len - 4);
    memcpy(&out->h, p, sizeof out->h);
    if (memcmp(out->h.magic, CKPT_MAGIC, 8) != 0)
        return shm_fail(STASH_ECORRUPT, "%s: offset 0: not checkpoint metadata", path);
    if (out->h.format_version != CKPT_FORMAT_VERSION)
        return shm_fail(STASH_EFORMAT, "%s: offset 8: format version %u, this build reads %u", path,
                        out->h.format_version, CKPT_FORMAT_VERSION);
    uint32_t maxp = out->h.max_parallelism;
    uint64_t need = sizeof(md_header) + (uint64_t)out->h.nstates * sizeof(md_state) +
                    sizeof(md_file) + (uint64_t)maxp * sizeof(md_extent) + 4;
    if (out->h.nfiles != 1 || maxp == 0 || maxp > STASH_MAX_MAX_PARALLELISM ||
        out->h.nstates > SHM_CATALOG_SIZE || need != len)
        return shm_fail(STASH_ECORRUPT,
                        "%s: offset 32: counts (%u states, %u files, %u key "
                        "groups) do not match its %zu bytes",
                        path, out->h.nstates, out->h.nfiles, maxp, len);
    out->states = (const md_state *)(p + sizeof(md_header));
    for (uint32_t i = 0; i < out->h.nstates; i++) {
        md_state s;
        memcpy(&s, &out->states[i], sizeof s);
        if (s.id == 0 || s.id > SHM_CATALOG_SIZE || memchr(s.name, 0, sizeof s.name) == NULL ||
            s.name[0] == 0)
            return shm_fail(STASH_ECORRUPT, "%s: offset %zu: a bad state entry", path,
                            sizeof(md_header) + i * sizeof(md_state));
    }
    size_t at = sizeof(md_header) + out->h.nstates * sizeof(md_state);
    memcpy(&out->file, p + at, sizeof out->file);
    if (memchr(out->file.name, 0, sizeof out->file.name) == NULL || out->file.name[0] == '.' ||
        strchr(out->file.name, '/') || out->file.first_kg != 0 || out->file.last_kg != maxp - 1)
        return shm_fail(STASH_ECORRUPT,
                        "%s: offset %zu: a data file entry that names a path "
                        "outside the checkpoint or a bad range",
                        path, at);
    out->ext = (const md_extent *)(p + at + sizeof(md_file));
    return 0;
}

/* Checks (apply false) or restores (apply true) the range's blocks. */
static int64_t apply_blocks(stash_arena *a, const parsed_md *m, const uint8_t *data, size_t len,
                            const char *path, stash_kg_range range, const snap_id_map *map,
                            bool apply)
{
    snap_buf scratch = {0};
    int64_t total = 0;
    for (uint32_t kg = range.first; kg <= range.last; kg++) {
        md_extent e;
        memcpy(&e, &m->ext[kg], sizeof e);
        if (e.offset > len || e.size > len - e.offset) {
            total =
                shm_fail(STASH_ECORRUPT,
                         "%s: key group %u at offset %llu, %llu bytes, "
                         "beyond the file's %zu",
                         path, kg, (unsigned long long)e.offset, (unsigned long long)e.size, len);
            break;
        }
        snap_block b;
        int rc = snap_read_block(data + e.offset, e.size, path, e.offset, &scratch, &b);
        if (rc == 0 && (b.hdr.kg != kg || b.size != e.size))
            rc = shm_fail(STASH_ECORRUPT,
                          "%s: offset %llu: the block of key group %u is not "
                          "where the metadata says",
                          path, (unsigned long long)e.offset, kg);
        int64_t n = rc ? rc : apply ? snap_restore_block(a, &b, map, path, e.offset) : 0;
        if (n < 0) {
            total = n;
            break;
        }
        total += n;
    }
    snap_buf_free(&scratch);
    return total;
}

/* Registers the checkpoint's states in the arena and maps their ids. */
static int map_states(stash_arena *a, const parsed_md *m, uint16_t *ids, snap_id_map *map)
{
    memset(ids, 0, (SHM_CATALOG_SIZE + 1) * sizeof *ids);
    for (uint32_t i = 0; i < m->h.nstates; i++) {
        md_state s;
        memcpy(&s, &m->states[i], sizeof s);
        int id = shm_catalog_register(a, s.name, s.kind, s.options);
        if (id < 0) return id;
        ids[s.id] = (uint16_t)id;
    }
    *map = (snap_id_map){ids, SHM_CATALOG_SIZE + 1};
    return 0;
}

/* Restores one checkpoint after checking all of it that the range needs. */
static int restore_one(stash_arena *a, const char *dir, uint64_t id, stash_kg_range range,
                       ioe_engine *e, uint64_t *records)
{
    char path[4096], data_path[4096];
    uint8_t *md = NULL, *data = NULL;
    size_t md_len, data_len;
    parsed_md m;
    int rc = path_of(path, "%s/chk-%llu/_metadata", dir, (unsigned long long)id);
    if (rc == 0) rc = read_whole(e, path, MAX_METADATA, &md, &md_len);
    if (rc) return rc;
    rc = parse_metadata(md, md_len, path, &m);
    if (rc == 0 && (m.h.id != id || range.last >= m.h.max_parallelism ||
                    m.h.max_parallelism != a->hdr->max_parallelism))
        rc = shm_fail(STASH_ECORRUPT,
                      "%s: checkpoint %llu of %u key groups cannot restore key "
                      "groups %u..%u of an arena of %u",
                      path, (unsigned long long)m.h.id, m.h.max_parallelism, range.first,
                      range.last, a->hdr->max_parallelism);
    if (rc == 0)
        rc = path_of(data_path, "%s/chk-%llu/%s", dir, (unsigned long long)id, m.file.name);
    if (rc == 0) rc = read_whole(e, data_path, SIZE_MAX, &data, &data_len);
    uint16_t ids[SHM_CATALOG_SIZE + 1];
    snap_id_map map;
    int64_t n = rc;
    if (rc == 0) n = apply_blocks(a, &m, data, data_len, data_path, range, NULL, false);
    if (n >= 0) n = map_states(a, &m, ids, &map);
    if (n >= 0) n = apply_blocks(a, &m, data, data_len, data_path, range, &map, true);
    if (n >= 0) *records = (uint64_t)n;
    free(md);
    free(data);
    return n < 0 ? (int)n : 0;
}

/* The ids of dir's checkpoints, newest first. Returns how many or an error. */
static int list_checkpoints(const char *dir, uint64_t **ids)
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
    int n = list_checkpoints(dir, &ids);
    if (n < 0) return n;
    int rc = shm_fail(-ENOENT, "%s: no complete checkpoint", dir);
    for (int i = 0; i < n; i++) {
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
    int n = list_checkpoints(dir, &ids);
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
