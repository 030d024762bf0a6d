/* SPDX-License-Identifier: MIT */
/*
 * ckpt_read.c: reading checkpoints, trusting no byte: a view opens one (its
 * metadata's checksum, counts, names and ranges checked, its data files
 * read with O_DIRECT where the filesystem has it) and walks its blocks,
 * checking every one, in two threads where that pays.
 */
#define _GNU_SOURCE /* O_DIRECT */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/checkpoint/ckpt_read.h"
#include "backends/state/opstate.h"

#define SPLIT_MIN_BYTES (4u << 20) /* a walk over fewer bytes stays in one thread */
#define HUGE_PAGE (2u << 20)

/* Reads the whole file at path into *out (malloc'd), with O_DIRECT where the
 * filesystem has it (a restore reads each byte once: no page cache). */
__attribute__((format(printf, 2, 3))) int ckpt_path_of(char *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, 4096, fmt, ap);
    va_end(ap);
    return n < 0 || n >= 4096 ? shm_fail(-ENAMETOOLONG, "a path longer than 4095 bytes") : 0;
}

/* ---- files through the engine -------------------------------------------- */

/* Reaps until at most keep requests are outstanding; the first failure wins. */
int ckpt_drain(ioe_engine *e, unsigned keep, int rc)
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

/* Reads bytes from .. to of file name in directory dirfd (path in
 * messages) into *out (malloc'd), the file offset of its first byte in *at;
 * to 0: the whole file, which must not be longer than limit. */
static int read_span(ioe_engine *e, int dirfd, const char *name, const char *path, uint64_t from,
                     uint64_t to, size_t limit, uint8_t **out, size_t *len, uint64_t *at)
{
    ioe_file *f;
    /* Never a link's target; non-blocking: a FIFO in a file's place must
     * not hang the open. */
    const int how = O_RDONLY | O_NONBLOCK | O_NOFOLLOW;
    int rc = ioe_file_openat(e, dirfd, name, path, how | O_DIRECT, 0, &f);
    if (rc < 0 && rc != -ELOOP) rc = ioe_file_openat(e, dirfd, name, path, how, 0, &f);
    if (rc == -ELOOP) return shm_fail(STASH_ECORRUPT, "%s: a symbolic link: refused", path);
    if (rc < 0) return shm_fail(rc, "%s: cannot open: %s", path, stash_strerror(rc));
    ioe_align al = ioe_file_align(f);
    struct stat st;
    int fd = ioe_file_fd(f);
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        ioe_file_close(f);
        return shm_fail(STASH_ECORRUPT, "%s: not a regular file", path);
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    if (!to && (uint64_t)st.st_size > limit) {
        ioe_file_close(f);
        return shm_fail(STASH_ECORRUPT, "%s: %lld bytes, more than the %zu its metadata names",
                        path, (long long)st.st_size, limit);
    }
    if (to && (uint64_t)st.st_size < to) {
        ioe_file_close(f);
        return shm_fail(STASH_ECORRUPT, "%s: %lld bytes, but its metadata names blocks up to %llu",
                        path, (long long)st.st_size, (unsigned long long)to);
    }
    /* Direct reads go whole aligned blocks at a time: the last one past the end. */
    uint64_t base = to ? from / al.offset * al.offset : 0;
    *at = base;
    *len = (size_t)((to ? to : (uint64_t)st.st_size) - base);
    size_t want = (*len + al.offset - 1) / al.offset * al.offset;
    *out = NULL;
    /* A big file goes into huge pages where the kernel has them: a few
     * faults instead of one per page. */
    size_t mem_align = want >= HUGE_PAGE ? HUGE_PAGE : al.mem > 64 ? al.mem : 64;
    if (ioe_aligned_alloc(want ? want : al.offset, mem_align, (void **)out) < 0) {
        ioe_file_close(f);
        return -ENOMEM;
    }
    if (want >= HUGE_PAGE) madvise(*out, want / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE);
    for (size_t off = 0; off < want && rc == 0;) {
        size_t n = want - off < CKPT_CHUNK ? want - off : CKPT_CHUNK;
        int q = ioe_read(f, *out + off, n, base + off, NULL);
        if (q == -EBUSY) {
            rc = ckpt_drain(e, ioe_outstanding(e) - 1, 0);
            continue;
        }
        if (q < 0)
            rc = shm_fail(q, "read %s at offset %llu: %s", path, (unsigned long long)(base + off),
                          stash_strerror(q));
        off += n;
    }
    rc = ckpt_drain(e, 0, rc);
    ioe_file_close(f);
    if (rc) {
        /* The caller's view frees what it holds: hold nothing. */
        free(*out);
        *out = NULL;
        *len = 0;
    }
    return rc;
}

static int read_whole(ioe_engine *e, int dirfd, const char *name, const char *path, size_t limit,
                      uint8_t **out, size_t *len)
{
    uint64_t at;
    return read_span(e, dirfd, name, path, 0, 0, limit, out, len, &at);
}

/* The directory a data file of v lies in (the checkpoint's, or shared/
 * beside it), opened once, and its name there. */
static int file_place(ckpt_view *v, const ckpt_file *cf, int *dirfd, const char **name)
{
    bool shared = strncmp(cf->name, CKPT_SHARED_DIR "/", sizeof CKPT_SHARED_DIR) == 0;
    *name = shared ? cf->name + sizeof CKPT_SHARED_DIR : cf->name;
    if (!shared) {
        *dirfd = v->dirs->chk;
        return 0;
    }
    if (v->dirs->shared < 0) {
        int up = openat(v->dirs->chk, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
        v->dirs->shared =
            up < 0 ? -1
                   : openat(up, CKPT_SHARED_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (up >= 0) close(up);
        if (v->dirs->shared < 0)
            return shm_fail(errno == ELOOP ? STASH_ECORRUPT : -errno,
                            "%s: cannot open its directory: %s", cf->path,
                            errno == ELOOP ? "a symbolic link" : strerror(errno));
    }
    *dirfd = v->dirs->shared;
    return 0;
}

/* Whether a data file's name stays inside the checkpoint: a plain name, or
 * "shared/" and a plain name. */
static bool safe_name(const char *name, size_t size)
{
    if (!memchr(name, 0, size)) return false;
    if (strncmp(name, CKPT_SHARED_DIR "/", sizeof CKPT_SHARED_DIR) == 0)
        name += sizeof CKPT_SHARED_DIR;
    return name[0] && name[0] != '.' && !strchr(name, '/');
}

/* Checks _metadata's bytes: checksum, magic, version, counts against its
 * size, state names, data file names (no path may leave the checkpoint) and
 * key-group ranges. */
/* The operator-state section from offset at to end (the checksum's offset). */
static int parse_opstate(ckpt_view *v, uint64_t at, uint64_t end)
{
    const char *path = v->meta_path;
    uint32_t head[2];
    memcpy(head, v->md + at, sizeof head);
    uint32_t p = head[0];
    if (p > STASH_MAX_WORKERS || head[1] != 0 || (end - at - 8) / 8 < p)
        return shm_fail(STASH_ECORRUPT, "%s: offset %llu: operator state of %u workers", path,
                        (unsigned long long)at, p);
    v->op_blobs = calloc(p ? p : 1, sizeof *v->op_blobs);
    if (!v->op_blobs) return -ENOMEM;
    uint64_t lens = at + 8, data = lens + 8ull * p;
    for (uint32_t i = 0; i < p; i++) {
        uint64_t len;
        memcpy(&len, v->md + lens + 8ull * i, 8);
        if (len > end - data || ckpt_pad8(len) > end - data)
            return shm_fail(STASH_ECORRUPT,
                            "%s: offset %llu: operator state of worker %u runs past the end", path,
                            (unsigned long long)(lens + 8ull * i), i);
        v->op_blobs[i] = (ckpt_blob){v->md + data, len};
        data += ckpt_pad8(len);
    }
    if (data != end)
        return shm_fail(STASH_ECORRUPT, "%s: offset %llu: %llu bytes after the operator state",
                        path, (unsigned long long)data, (unsigned long long)(end - data));
    v->op_parallelism = p;
    return 0;
}

/* Whether a state's options are ones a registration makes (docs/format.md):
 * an update type and a visibility of 0 or 1, a flag of 0 or 1, zeros after
 * them, and no TTL on operator state or timers. */
static bool options_valid(const ckpt_state *s)
{
    uint64_t ttl_ms;
    memcpy(&ttl_ms, s->options, sizeof ttl_ms);
    if (s->options[8] > 1 || s->options[9] > 1 || s->options[10] > 1 || s->options[11] > 1)
        return false;
    for (size_t i = 12; i < sizeof s->options; i++)
        if (s->options[i]) return false;
    return !((opstate_kind((stash_kind)s->kind) || s->kind == STASH_TIMERS) && ttl_ms);
}

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
    uint64_t fixed = sizeof h + (uint64_t)h.nstates * sizeof(ckpt_state) +
                     (uint64_t)h.nfiles * (sizeof(md_file) + h.max_parallelism * sizeof(md_extent));
    if (h.nfiles == 0 || h.nfiles > CKPT_MAX_FILES || h.max_parallelism == 0 ||
        h.max_parallelism > STASH_MAX_MAX_PARALLELISM || h.nstates > SHM_CATALOG_SIZE ||
        fixed + 12 > len)
        return shm_fail(STASH_ECORRUPT,
                        "%s: offset 40: counts (%u states, %u files, %u key "
                        "groups) do not match its %zu bytes",
                        path, h.nstates, h.nfiles, h.max_parallelism, len);
    v->id = h.id;
    v->created_ns = h.created_ns;
    v->base_id = h.base_id;
    v->max_parallelism = h.max_parallelism;
    v->nstates = h.nstates;
    for (uint32_t i = 0; i < h.nstates; i++) {
        ckpt_state s = ckpt_view_state(v, i);
        bool twice = false;
        for (uint32_t j = 0; j < i && !twice; j++) {
            ckpt_state o = ckpt_view_state(v, j);
            twice = o.id == s.id || strncmp(o.name, s.name, sizeof s.name) == 0;
        }
        if (s.id == 0 || s.id > SHM_CATALOG_SIZE || !memchr(s.name, 0, sizeof s.name) ||
            s.name[0] == 0 || twice)
            return shm_fail(STASH_ECORRUPT, "%s: offset %zu: a bad or repeated state entry", path,
                            sizeof h + i * sizeof(ckpt_state));
        if (s.kind < STASH_VALUE || s.kind > STASH_TIMERS)
            return shm_fail(STASH_ECORRUPT, "%s: offset %zu: state '%s' of kind %u, which is none",
                            path, sizeof h + i * sizeof(ckpt_state), s.name, s.kind);
        if (!options_valid(&s))
            return shm_fail(STASH_ECORRUPT,
                            "%s: offset %zu: state '%s' with TTL options no state has", path,
                            sizeof h + i * sizeof(ckpt_state), s.name);
    }
    v->files = calloc(h.nfiles, sizeof *v->files);
    if (!v->files) return -ENOMEM;
    size_t at = sizeof h + h.nstates * sizeof(ckpt_state);
    for (uint32_t f = 0; f < h.nfiles; f++) {
        md_file m;
        memcpy(&m, p + at, sizeof m);
        if (!safe_name(m.name, sizeof m.name) || m.first_kg != 0 ||
            m.last_kg != h.max_parallelism - 1 || (m.flags & ~(CKPT_FILE_DELTA | CKPT_FILE_CRC)) ||
            (!(m.flags & CKPT_FILE_CRC) && m.reserved) || (f == 0) != !(m.flags & CKPT_FILE_DELTA))
            return shm_fail(STASH_ECORRUPT,
                            "%s: offset %zu: a data file entry that names a path "
                            "outside the checkpoint, a bad range or kind",
                            path, at);
        memcpy(v->files[f].name, m.name, sizeof m.name);
        v->files[f].flags = m.flags;
        v->files[f].crc = m.reserved;
        v->files[f].extents = p + at + sizeof m;
        at += sizeof m + h.max_parallelism * sizeof(md_extent);
    }
    v->nfiles = h.nfiles;
    return parse_opstate(v, fixed, len - 4);
}

/* Every operator-state blob is well formed and names only operator states
 * of the metadata: what verify checks is what restore needs (restore
 * remaps the same blobs to the arena's ids). */
static int check_opstate(const ckpt_view *v)
{
    uint16_t ids[SHM_CATALOG_SIZE + 1] = {0};
    for (uint32_t i = 0; i < v->nstates; i++) {
        ckpt_state s = ckpt_view_state(v, i);
        if (opstate_recorded((stash_kind)s.kind)) ids[s.id] = s.id;
    }
    int rc = 0;
    for (uint32_t i = 0; i < v->op_parallelism && rc == 0; i++) {
        uint64_t len = v->op_blobs[i].len;
        uint8_t *copy = malloc(len ? len : 1);
        if (!copy) return shm_fail(-ENOMEM, "out of memory");
        if (len) memcpy(copy, v->op_blobs[i].data, len);
        char what[4200];
        snprintf(what, sizeof what, "%s: operator state of worker %u", v->meta_path, i);
        rc = opstate_remap(copy, len, ids, SHM_CATALOG_SIZE + 1, what);
        free(copy);
    }
    return rc;
}

ckpt_state ckpt_view_state(const ckpt_view *v, uint32_t i)
{
    ckpt_state s;
    memcpy(&s, v->md + sizeof(md_header) + i * sizeof s, sizeof s);
    return s;
}

static uint64_t entry_id(const char *name, const char *prefix);

/* A checkpoint's directory named chk-ID or savepoint-ID must hold ID's
 * metadata: a copy of another's would restore the other's state under this
 * id. (A savepoint moved under another name names no id.) */
static int check_dir_names_id(const char *path, const ckpt_view *v)
{
    char name[256];
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    const char *base = path + n;
    while (base > path && base[-1] != '/') base--;
    snprintf(name, sizeof name, "%.*s", (int)(path + n - base), base);
    uint64_t named = entry_id(name, "chk-");
    if (!named) named = entry_id(base, "savepoint-");
    if (!named || named == v->id) return 0;
    return shm_fail(STASH_ECORRUPT, "%s: offset 16: names checkpoint %llu, not %llu", v->meta_path,
                    (unsigned long long)v->id, (unsigned long long)named);
}

int ckpt_view_parse(ckpt_view *v)
{
    int rc = parse_metadata(v);
    return rc ? rc : check_opstate(v);
}

int ckpt_view_file_open(ckpt_view *v, const ckpt_file *cf)
{
    int dirfd = -1;
    const char *name = NULL;
    int rc = file_place(v, cf, &dirfd, &name);
    if (rc) return rc;
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return shm_fail(errno == ELOOP ? STASH_ECORRUPT : -errno, "%s: cannot open: %s", cf->path,
                        errno == ELOOP ? "a symbolic link" : strerror(errno));
    return fd;
}

int ckpt_open_view_at(int dirfd, const char *name, const char *path, ioe_engine *e, ckpt_view *v,
                      bool with_data)
{
    memset(v, 0, sizeof *v);
    int rc = ckpt_path_of(v->meta_path, "%s/_metadata", path);
    if (rc == 0 && !(v->dirs = malloc(sizeof *v->dirs))) rc = -ENOMEM;
    if (rc == 0) {
        *v->dirs = (ckpt_dirs){.shared = -1};
        v->dirs->chk = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (v->dirs->chk < 0)
            rc = shm_fail(errno == ELOOP ? STASH_ECORRUPT : -errno, "%s: cannot open: %s", path,
                          errno == ELOOP ? "a symbolic link" : strerror(errno));
    }
    if (rc == 0)
        rc = read_whole(e, v->dirs->chk, "_metadata", v->meta_path, CKPT_MAX_METADATA, &v->md,
                        &v->md_len);
    if (rc == 0) rc = ckpt_view_parse(v);
    if (rc == 0) rc = check_dir_names_id(path, v);
    for (uint32_t f = 0; rc == 0 && f < v->nfiles; f++) {
        ckpt_file *cf = &v->files[f];
        bool shared = strncmp(cf->name, CKPT_SHARED_DIR "/", sizeof CKPT_SHARED_DIR) == 0;
        rc = shared ? ckpt_path_of(cf->path, "%s/../%s", path, cf->name)
                    : ckpt_path_of(cf->path, "%s/%s", path, cf->name);
    }
    if (rc == 0 && with_data) rc = ckpt_view_load(v, e);
    if (rc) ckpt_view_close(v);
    return rc;
}

int ckpt_open_view(const char *path, ioe_engine *e, ckpt_view *v, bool with_data)
{
    shm_dir d;
    int rc = shm_dir_open(path, 0, &d);
    if (rc == 0)
        rc = ckpt_open_view_at(d.fd, ".", path, e, v, with_data);
    else
        memset(v, 0, sizeof *v);
    shm_dir_close(&d);
    return rc;
}

/* The bytes of a data file its metadata names: up to the end of its last
 * key group's block. */
uint64_t ckpt_file_named_bytes(const ckpt_view *v, const ckpt_file *f)
{
    uint64_t end = 0;
    for (uint32_t kg = 0; kg < v->max_parallelism; kg++) {
        md_extent x;
        memcpy(&x, f->extents + kg * sizeof x, sizeof x);
        if (x.offset > UINT64_MAX - x.size) return UINT64_MAX;
        if (x.offset + x.size > end) end = x.offset + x.size;
    }
    return end;
}

/* A data file is the one its metadata names, not another checkpoint's with
 * blocks of the same sizes: the CRC32C of its blocks in key-group order. */
int ckpt_file_check(const ckpt_view *v, const ckpt_file *f)
{
    if (!(f->flags & CKPT_FILE_CRC)) return 0;
    uint32_t crc = 0;
    for (uint32_t kg = 0; kg < v->max_parallelism; kg++) {
        md_extent x;
        memcpy(&x, f->extents + kg * sizeof x, sizeof x);
        if (x.offset > f->len || x.size > f->len - x.offset)
            return shm_fail(STASH_ECORRUPT, "%s: key group %u at offset %llu beyond the file's %zu",
                            f->path, kg, (unsigned long long)x.offset, f->len);
        crc = snap_crc32c(crc, f->data + x.offset, x.size);
    }
    if (crc == f->crc) return 0;
    /* A damaged block is named by its own checks, with its offset. */
    snap_buf scratch = {0};
    int rc = 0;
    for (uint32_t kg = 0; kg < v->max_parallelism && rc == 0; kg++) {
        md_extent x;
        memcpy(&x, f->extents + kg * sizeof x, sizeof x);
        snap_block b;
        rc = snap_read_block(f->data + x.offset, x.size, f->path, x.offset, &scratch, &b);
    }
    snap_buf_free(&scratch);
    if (rc) return rc;
    return shm_fail(STASH_ECORRUPT,
                    "%s: its blocks' checksum %08x is not the %08x its metadata names: the file "
                    "of another checkpoint, or damaged",
                    f->path, crc, f->crc);
}

/* Reads data file f of v and checks it against the metadata: at most the
 * bytes the metadata names (a longer file is not read whole), then the
 * CRC32C of its blocks. With keep false it lets the bytes go again. */
static int load_file(ckpt_view *v, ckpt_file *cf, ioe_engine *e, bool keep)
{
    uint64_t named = ckpt_file_named_bytes(v, cf);
    size_t limit = named < SIZE_MAX ? (size_t)named : SIZE_MAX;
    int dirfd = -1;
    const char *name = NULL;
    int rc = v->fetch ? v->fetch(v->fetch_ctx, cf, limit, &cf->data, &cf->len)
                      : file_place(v, cf, &dirfd, &name);
    if (rc == 0 && !v->fetch) rc = read_whole(e, dirfd, name, cf->path, limit, &cf->data, &cf->len);
    if (rc == 0) rc = ckpt_file_check(v, cf);
    if (!keep) {
        free(cf->data);
        cf->data = NULL;
        cf->len = 0;
    }
    return rc;
}

int ckpt_view_load(ckpt_view *v, ioe_engine *e)
{
    int rc = 0;
    for (uint32_t f = 0; rc == 0 && f < v->nfiles; f++) rc = load_file(v, &v->files[f], e, true);
    return rc;
}

int ckpt_view_load_range(ckpt_view *v, ioe_engine *e, stash_kg_range range)
{
    if (range.first > range.last || range.last >= v->max_parallelism)
        return shm_fail(-EINVAL, "%s: key groups %u..%u of %u", v->meta_path, range.first,
                        range.last, v->max_parallelism);
    int rc = 0;
    for (uint32_t f = 0; rc == 0 && f < v->nfiles; f++) {
        ckpt_file *cf = &v->files[f];
        uint64_t from = UINT64_MAX, to = 0;
        for (uint32_t kg = range.first; kg <= range.last; kg++) {
            md_extent x;
            memcpy(&x, cf->extents + kg * sizeof x, sizeof x);
            if (x.offset > UINT64_MAX - x.size)
                return shm_fail(STASH_ECORRUPT, "%s: key group %u at offset %llu, %llu bytes",
                                v->meta_path, kg, (unsigned long long)x.offset,
                                (unsigned long long)x.size);
            if (x.offset < from) from = x.offset;
            if (x.offset + x.size > to) to = x.offset + x.size;
        }
        /* Blocks need at least their header: an empty span still reads one. */
        if (to <= from) to = from + 1;
        int dirfd;
        const char *name;
        rc = file_place(v, cf, &dirfd, &name);
        if (rc == 0)
            rc = read_span(e, dirfd, name, cf->path, from, to, 0, &cf->data, &cf->len, &cf->base);
    }
    return rc;
}

int64_t ckpt_block_copy(const char *path, uint32_t kg, snap_buf *out)
{
    ioe_engine *e;
    int rc = ioe_engine_open(&(ioe_opts){.depth = 8, .buf_count = 1, .buf_size = 4096}, &e);
    if (rc < 0) return shm_fail(rc, "key group %u: no I/O engine to copy its block", kg);
    ckpt_view v;
    rc = ckpt_open_view(path, e, &v, false);
    if (rc == 0 &&
        (v.nfiles != 1 || (v.files[0].flags & CKPT_FILE_DELTA) || kg >= v.max_parallelism))
        rc = shm_fail(-ENOTSUP, "%s: not one full data file of key group %u", path, kg);
    if (rc == 0) rc = ckpt_view_load_range(&v, e, (stash_kg_range){kg, kg});
    int64_t n = rc;
    if (rc == 0) {
        const ckpt_file *f = &v.files[0];
        md_extent x;
        memcpy(&x, f->extents + kg * sizeof x, sizeof x);
        snap_buf scratch = {0};
        snap_block b;
        const uint8_t *p = f->data + (x.offset - f->base);
        n = snap_read_block(p, x.size, f->path, x.offset, &scratch, &b);
        if (n == 0 && (b.hdr.kg != kg || b.size != x.size || (b.hdr.flags & SNAP_DELTA)))
            n = shm_fail(STASH_ECORRUPT,
                         "%s: offset %llu: the block of key group %u is not the one the "
                         "metadata says",
                         f->path, (unsigned long long)x.offset, kg);
        if (n == 0) n = snap_buf_put(out, p, x.size) ? -ENOMEM : (int64_t)b.hdr.records;
        snap_buf_free(&scratch);
    }
    ckpt_view_close(&v);
    ioe_engine_close(e);
    return n;
}

int ckpt_view_check_files(ckpt_view *v, ioe_engine *e)
{
    int rc = 0;
    for (uint32_t f = 0; rc == 0 && f < v->nfiles; f++) rc = load_file(v, &v->files[f], e, false);
    return rc;
}

int ckpt_view_open_path(const char *path, ioe_engine *e, ckpt_view *v)
{
    return ckpt_open_view(path, e, v, true);
}

int ckpt_open_chk(const shm_dir *dir, uint64_t id, ioe_engine *e, ckpt_view *v, bool with_data)
{
    char chk[4096], name[64];
    snprintf(name, sizeof name, "chk-%llu", (unsigned long long)id);
    int rc = ckpt_path_of(chk, "%s/%s", dir->path, name);
    if (rc) memset(v, 0, sizeof *v);
    /* Opening chk-ID checks that its metadata names ID. */
    return rc ? rc : ckpt_open_view_at(dir->fd, name, chk, e, v, with_data);
}

int ckpt_view_open(const shm_dir *dir, uint64_t id, ioe_engine *e, ckpt_view *v)
{
    return ckpt_open_chk(dir, id, e, v, true);
}

void ckpt_view_close(ckpt_view *v)
{
    for (uint32_t f = 0; v->files && f < v->nfiles; f++) free(v->files[f].data);
    free(v->files);
    free(v->md);
    free(v->op_blobs);
    if (v->dirs && v->dirs->chk >= 0) close(v->dirs->chk);
    if (v->dirs && v->dirs->shared >= 0) close(v->dirs->shared);
    free(v->dirs);
    v->dirs = NULL;
    v->op_blobs = NULL;
    v->files = NULL;
    v->md = NULL;
    v->nfiles = 0;
}

/* The check pass: a record's state must be one the metadata names, and its
 * value well formed for that state's kind, before anything is restored. */
int ckpt_record_check(const ckpt_view *v, const snap_record *r)
{
    for (uint32_t i = 0; i < v->nstates; i++) {
        ckpt_state s = ckpt_view_state(v, i);
        if (s.id != r->state) continue;
        if (opstate_kind((stash_kind)s.kind))
            return shm_fail(STASH_ECORRUPT, "a keyed record of operator state '%s'", s.name);
        uint64_t ttl_ms;
        memcpy(&ttl_ms, s.options, sizeof ttl_ms);
        bool ttl = ttl_ms > 0, ok = true;
        if (!(r->flags & SNAP_REC_DELETED)) {
            if (s.kind == STASH_LIST)
                ok = list_bytes_valid(r->value, r->vlen, ttl);
            else if (s.kind == STASH_MAP)
                ok = map_bytes_valid(r->value, r->vlen, ttl);
            else if (s.kind == STASH_TIMERS)
                ok = timer_record_valid(r->ns, r->nslen, r->vlen);
            else
                ok = !ttl || r->vlen >= TTL_BYTES;
        }
        return ok ? 0
                  : shm_fail(STASH_ECORRUPT,
                             "a value that is not a well-formed state '%s' of "
                             "kind %u",
                             s.name, s.kind);
    }
    return shm_fail(STASH_ECORRUPT, "a record of state %u, which the metadata does not name",
                    r->state);
}

static int check_record(void *ctx, uint32_t kg, const snap_record *r)
{
    (void)kg;
    return ckpt_record_check(ctx, r);
}

/* Checks one file's block of key group kg and walks its records. */
static int64_t walk_block(const ckpt_view *v, const ckpt_file *f, uint32_t kg, snap_buf *scratch,
                          bool checked, snap_record_fn *fn, void *ctx)
{
    md_extent e;
    memcpy(&e, f->extents + kg * sizeof e, sizeof e);
    if (e.offset < f->base || e.offset - f->base > f->len || e.size > f->len - (e.offset - f->base))
        return shm_fail(STASH_ECORRUPT,
                        "%s: key group %u at offset %llu, %llu bytes, beyond the "
                        "file's %zu",
                        f->path, kg, (unsigned long long)e.offset, (unsigned long long)e.size,
                        (size_t)(f->base + f->len));
    snap_block b;
    int rc = (checked ? snap_reread_block : snap_read_block)(f->data + (e.offset - f->base), e.size,
                                                             f->path, e.offset, scratch, &b);
    if (rc) return rc;
    bool delta = f->flags & CKPT_FILE_DELTA;
    if (b.hdr.kg != kg || b.size != e.size || delta != !!(b.hdr.flags & SNAP_DELTA))
        return shm_fail(STASH_ECORRUPT,
                        "%s: offset %llu: the block of key group %u is not the "
                        "one the metadata says",
                        f->path, (unsigned long long)e.offset, kg);
    return snap_block_records(&b, v->max_parallelism, fn ? fn : check_record, fn ? ctx : (void *)v,
                              f->path, e.offset);
}

int64_t ckpt_view_walk_kg(const ckpt_view *v, uint32_t kg, bool checked, snap_record_fn *fn,
                          void *ctx, snap_buf *scratch)
{
    int64_t n = 0;
    for (uint32_t f = 0; f < v->nfiles && n >= 0; f++) {
        int64_t k = walk_block(v, &v->files[f], kg, scratch, checked, fn, ctx);
        n = k < 0 ? k : n + k;
    }
    return n;
}

/* Walks the blocks of range, key group by key group, each in every file in
 * order; checked: a second pass over bytes the first already checked. done,
 * if set, hears of each key group's end (its records' count or error). */
static int64_t walk_range(const ckpt_view *v, stash_kg_range range, bool checked,
                          snap_record_fn *fn, ckpt_kg_done_fn *done, void *ctx)
{
    if (range.first > range.last || range.last >= v->max_parallelism)
        return shm_fail(-EINVAL, "%s: key groups %u..%u of %u", v->meta_path, range.first,
                        range.last, v->max_parallelism);
    snap_buf scratch = {0};
    int64_t total = 0;
    for (uint32_t kg = range.first; kg <= range.last && total >= 0; kg++) {
        int64_t n = ckpt_view_walk_kg(v, kg, checked, fn, ctx, &scratch);
        if (done) {
            int rc = done(ctx, kg, n < 0 ? (int)n : 0);
            if (n >= 0 && rc < 0) n = rc;
        }
        total = n < 0 ? n : total + n;
    }
    snap_buf_free(&scratch);
    return total;
}

/* Half of a walk, in a thread of its own: key groups are independent. */
typedef struct walk_half {
    const ckpt_view *v;
    stash_kg_range range;
    bool checked;
    snap_record_fn *fn;
    ckpt_kg_done_fn *done;
    void *ctx;
    int64_t n;
    char why[512]; /* stash_errmsg() is per thread */
} walk_half;

static void *walk_half_main(void *arg)
{
    walk_half *h = arg;
    h->n = walk_range(h->v, h->range, h->checked, h->fn, h->done, h->ctx);
    if (h->n < 0) snprintf(h->why, sizeof h->why, "%s", stash_errmsg());
    return NULL;
}

/* walk_range with the upper half of the key groups in a second thread, when
 * there are enough bytes to be worth one. fn and done must be safe to call
 * for different key groups at once (checks are; a restore's inserts are,
 * each key group having one writer). An error of the lower half wins. */
int64_t ckpt_walk_range_split(const ckpt_view *v, stash_kg_range range, bool checked,
                              snap_record_fn *fn, ckpt_kg_done_fn *done, void *ctx)
{
    uint32_t n = range.last - range.first + 1;
    pthread_t t;
    walk_half hi = {v, {range.first + n / 2, range.last}, checked, fn, done, ctx, 0, ""};
    if (n < 2 || v->files[0].len < SPLIT_MIN_BYTES || sysconf(_SC_NPROCESSORS_ONLN) < 2 ||
        pthread_create(&t, NULL, walk_half_main, &hi) != 0)
        return walk_range(v, range, checked, fn, done, ctx);
    int64_t lo =
        walk_range(v, (stash_kg_range){range.first, hi.range.first - 1}, checked, fn, done, ctx);
    char why[512];
    if (lo < 0) snprintf(why, sizeof why, "%s", stash_errmsg());
    pthread_join(t, NULL);
    if (lo < 0) return shm_fail((int)lo, "%s", why);
    if (hi.n < 0) return shm_fail((int)hi.n, "%s", hi.why);
    return lo + hi.n;
}

int64_t ckpt_view_walk_checked(const ckpt_view *v, stash_kg_range range, snap_record_fn *fn,
                               void *ctx)
{
    return walk_range(v, range, true, fn, NULL, ctx);
}

int64_t ckpt_view_walk(const ckpt_view *v, stash_kg_range range, snap_record_fn *fn, void *ctx)
{
    return fn ? walk_range(v, range, false, fn, NULL, ctx)
              : ckpt_walk_range_split(v, range, false, NULL, NULL, NULL);
}

int ckpt_list(const shm_dir *dir, uint64_t **ids)
{
    DIR *d = shm_dir_list(dir);
    if (!d) return shm_fail(-errno, "%s: cannot list: %s", dir->path, strerror(errno));
    size_t n = 0, cap = 0;
    *ids = NULL;
    for (struct dirent *de; (de = readdir(d));) {
        uint64_t id = entry_id(de->d_name, "chk-");
        if (id == 0) continue;
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

/* The id in a directory entry named prefix followed by digits only, or 0:
 * also for ids past CKPT_MAX_ID, which no engine hands out (a stray name
 * must not wrap the next id around). */
static uint64_t entry_id(const char *name, const char *prefix)
{
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0 || name[n] < '0' || name[n] > '9') return 0;
    uint64_t id = 0;
    for (const char *c = name + n; *c; c++) {
        if (*c < '0' || *c > '9' || id > CKPT_MAX_ID / 10) return 0;
        id = id * 10 + (uint64_t)(*c - '0');
    }
    return id <= CKPT_MAX_ID ? id : 0;
}

int ckpt_highest_id(const shm_dir *dir, uint64_t *id)
{
    *id = 0;
    DIR *d = shm_dir_list(dir);
    if (!d) return shm_fail(-errno, "%s: cannot list: %s", dir->path, strerror(errno));
    for (struct dirent *de; (de = readdir(d));) {
        uint64_t chk = entry_id(de->d_name, "chk-"), sp = entry_id(de->d_name, "savepoint-");
        if (chk > *id) *id = chk;
        if (sp > *id) *id = sp;
    }
    closedir(d);
    return 0;
}

bool ckpt_has_metadata(const shm_dir *dir, uint64_t id)
{
    char meta[64];
    struct stat st;
    snprintf(meta, sizeof meta, "chk-%llu/_metadata", (unsigned long long)id);
    return fstatat(dir->fd, meta, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

int ckpt_path_info(const char *path, ioe_engine *e, uint64_t *id, uint32_t *max_parallelism)
{
    ckpt_view v;
    int rc = ckpt_open_view(path, e, &v, false);
    if (rc == 0) {
        *id = v.id;
        *max_parallelism = v.max_parallelism;
        ckpt_view_close(&v);
    }
    return rc;
}

int ckpt_newest(const shm_dir *dir, ioe_engine *e, uint64_t *id, uint32_t *max_parallelism)
{
    uint64_t *ids;
    int n = ckpt_list(dir, &ids), rc = -ENOENT;
    char why[1024] = "";
    size_t used = 0;
    for (int i = 0; i < n && rc; i++) {
        ckpt_view v;
        if (!ckpt_has_metadata(dir, ids[i])) continue;
        int err = ckpt_open_chk(dir, ids[i], e, &v, false);
        if (err < 0) {
            /* Each checkpoint that could not be used, and why. */
            int k = snprintf(why + used, sizeof why - used, "%schk-%llu: %s", used ? "; " : "",
                             (unsigned long long)ids[i], stash_errmsg());
            used = k > 0 && (size_t)k < sizeof why - used ? used + (size_t)k : sizeof why - 1;
            rc = STASH_ECORRUPT;
            continue;
        }
        *id = ids[i];
        *max_parallelism = v.max_parallelism;
        ckpt_view_close(&v);
        rc = 0;
    }
    if (n >= 0) free(ids);
    if (n < 0) return n;
    if (rc == STASH_ECORRUPT)
        return shm_fail(rc, "%s: no checkpoint's metadata can be used: %s", dir->path, why);
    return rc;
}

/* The records of one key group, copied (a block's bytes may be a scratch
 * buffer the next block reuses), in the order the files gave them. */
typedef struct kg_records {
    snap_record *r;
    size_t n, cap;
} kg_records;

static int keep_copy(void *ctx, uint32_t kg, const snap_record *r)
{
    kg_records *k = ctx;
    (void)kg;
    if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 256;
        snap_record *grown = realloc(k->r, cap * sizeof *grown);
        if (!grown) return shm_fail(-ENOMEM, "out of memory");
        k->r = grown;
        k->cap = cap;
    }
    uint8_t *mem = malloc((size_t)r->klen + r->nslen + r->vlen + 1);
    if (!mem) return shm_fail(-ENOMEM, "out of memory");
    snap_record c = *r;
    if (r->klen) memcpy(mem, r->key, r->klen);
    if (r->nslen) memcpy(mem + r->klen, r->ns, r->nslen);
    if (r->vlen) memcpy(mem + r->klen + r->nslen, r->value, r->vlen);
    c.key = mem;
    c.ns = mem + r->klen;
    c.value = mem + r->klen + r->nslen;
    k->r[k->n++] = c;
    return 0;
}

/* Whether two records are of one entry. */
static bool by_entry_same(const snap_record *a, const snap_record *b)
{
    return a->state == b->state && a->klen == b->klen && a->nslen == b->nslen &&
           memcmp(a->key, b->key, a->klen) == 0 && memcmp(a->ns, b->ns, a->nslen) == 0;
}

/* Orders records by entry (state, key, namespace), then as the files gave
 * them: the last of each entry is its state as of the checkpoint. */
static int by_entry(const void *x, const void *y)
{
    const snap_record *a = x, *b = y;
    if (a->state != b->state) return a->state < b->state ? -1 : 1;
    if (a->klen != b->klen) return a->klen < b->klen ? -1 : 1;
    if (a->nslen != b->nslen) return a->nslen < b->nslen ? -1 : 1;
    int c = memcmp(a->key, b->key, a->klen);
    if (c == 0) c = memcmp(a->ns, b->ns, a->nslen);
    if (c) return c;
    /* The walk's order, kept in the unused hash field by the caller. */
    return a->key_hash < b->key_hash ? -1 : a->key_hash > b->key_hash;
}

int64_t ckpt_view_walk_latest(const ckpt_view *v, stash_kg_range range, snap_record_fn *fn,
                              void *ctx)
{
    int64_t total = 0;
    for (uint32_t kg = range.first; kg <= range.last && total >= 0; kg++) {
        kg_records k = {0};
        int64_t n = ckpt_view_walk(v, (stash_kg_range){kg, kg}, keep_copy, &k);
        if (n >= 0) {
            for (size_t i = 0; i < k.n; i++) k.r[i].key_hash = i;
            if (k.n) qsort(k.r, k.n, sizeof *k.r, by_entry);
            n = 0;
            for (size_t i = 0; i < k.n && n >= 0; i++) {
                bool last = i + 1 == k.n || !by_entry_same(&k.r[i], &k.r[i + 1]);
                if (!last || (k.r[i].flags & SNAP_REC_DELETED)) continue;
                snap_record r = k.r[i];
                r.key_hash = stash_hash(r.key, r.klen);
                int rc = fn(ctx, kg, &r);
                n = rc < 0 ? rc : n + 1;
            }
        }
        for (size_t i = 0; i < k.n; i++) free((void *)k.r[i].key);
        free(k.r);
        total = n < 0 ? n : total + n;
    }
    return total;
}
