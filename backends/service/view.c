/* SPDX-License-Identifier: MIT */
/*
 * view.c: an arena of this process's own, filled from one checkpoint, for a
 * reader that reads as of that checkpoint: the newest complete one of the
 * service serving an arena, or a checkpoint or savepoint directory named
 * by its path. Whatever backend wrote the checkpoint, the view keeps it in
 * the heap store (its blocks are in the canonical format).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/service/service.h"

#define VIEW_MIN_BYTES (64ull << 20)
#define VIEW_TRIES 5 /* sizes tried, each twice the last, before giving up */

/* The checkpoint directory to read: path, or the newest complete
 * checkpoint of the service serving arena name. */
static int view_source(const char *name, const stash_arena_opts *live, const char *path,
                       ioe_engine *e, char *out)
{
    if (path) return ckpt_path_of(out, "%s", path);
    stash_arena *a;
    int rc = stash_arena_open(name, live, &a);
    if (rc) return rc;
    stash_service_info info;
    stash_service_info_get(a, &info);
    uint64_t id = 0;
    uint32_t maxp = 0;
    shm_dir d = {.fd = -1};
    if (!info.dir[0])
        rc = shm_fail(STASH_ENOSERVICE, "%s: no service has written checkpoints of it", a->path);
    else
        rc = shm_dir_open_named(a, info.dir, &d);
    if (rc == 0 && (rc = ckpt_newest(&d, e, &id, &maxp)) == -ENOENT)
        rc = shm_fail(-ENOENT, "%s: no complete checkpoint in %s yet", a->path, info.dir);
    if (rc == 0) rc = ckpt_path_of(out, "%s/chk-%llu", info.dir, (unsigned long long)id);
    shm_dir_close(&d);
    stash_arena_close(a);
    return rc;
}

/* The bytes of the checkpoint's data files: what the view's size starts from. */
static int source_bytes(const char *path, ioe_engine *e, uint64_t *bytes, uint32_t *maxp)
{
    ckpt_view v;
    int rc = ckpt_open_view(path, e, &v, false);
    if (rc) return rc;
    *bytes = 0;
    *maxp = v.max_parallelism;
    for (uint32_t f = 0; f < v.nfiles; f++) {
        struct stat st;
        int fd = ckpt_view_file_open(&v, &v.files[f]);
        if (fd < 0) {
            rc = fd;
            break;
        }
        rc = fstat(fd, &st) < 0 ? shm_fail(-errno, "%s: %s", v.files[f].path, strerror(errno)) : 0;
        close(fd);
        if (rc) break;
        *bytes += (uint64_t)st.st_size;
    }
    ckpt_view_close(&v);
    return rc;
}

/* Creates a private arena as ao says and restores the checkpoint at path
 * into every key group of it. */
static int fill(const stash_arena_opts *ao, const char *path, ioe_engine *e, stash_arena **out)
{
    stash_arena *a;
    char label[300];
    snprintf(label, sizeof label, "a view of %.200s", path);
    int rc = shm_arena_make_private(label, ao, &a);
    if (rc) return rc;
    ckpt_restored got = {0};
    rc =
        ckpt_restore_path(a, path, (stash_kg_range){0, a->hdr->max_parallelism - 1}, e, NULL, &got);
    ckpt_restored_free(&got);
    if (rc)
        stash_arena_close(a);
    else
        *out = a;
    return rc;
}

int service_view_create(const char *name, const stash_arena_opts *live, const char *path,
                        stash_arena **out)
{
    ioe_engine *e;
    int rc = ioe_engine_open(&(ioe_opts){0}, &e);
    if (rc) return rc;
    char src[4096];
    uint64_t bytes = 0;
    uint32_t maxp = 0;
    if ((rc = view_source(name, live, path, e, src)) != 0) {
        ioe_engine_close(e);
        return rc;
    }
    rc = source_bytes(src, e, &bytes, &maxp);
    stash_arena_opts ao = {
        .sz = sizeof(stash_arena_opts), .max_parallelism = maxp, .backend = STASH_BACKEND_HEAP};
    /* Records take more room in the arena than in a block: the size doubles
     * until the checkpoint fits. */
    ao.size = VIEW_MIN_BYTES + 2 * bytes;
    for (int i = 0; rc == 0 && i < VIEW_TRIES; i++, ao.size *= 2) {
        rc = fill(&ao, src, e, out);
        if (rc != STASH_EFULL) break;
        if (i + 1 < VIEW_TRIES) rc = 0;
    }
    ioe_engine_close(e);
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", stash_errmsg());
        return shm_fail(rc, "%s: cannot read it into a view: %s", src, why);
    }
    return 0;
}
