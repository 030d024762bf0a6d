/* SPDX-License-Identifier: MIT */
/*
 * error.c: error codes in words, the per-thread detail of the last failure
 * (which file, offset, key group or worker) behind stash_errmsg(), and the
 * library's version.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "shm/shm.h"

static _Thread_local char last_detail[512];

#define VERSION_TEXT(x) #x
#define VERSION_OF(major, minor, patch)                                                            \
    VERSION_TEXT(major) "." VERSION_TEXT(minor) "." VERSION_TEXT(patch)

STASH_API const char *stash_version(void)
{
    return VERSION_OF(STASH_VERSION_MAJOR, STASH_VERSION_MINOR, STASH_VERSION_PATCH);
}

STASH_API const char *stash_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
    case STASH_ENOTARENA:
        return "not a stash arena";
    case STASH_EVERSION:
        return "arena of another layout version";
    case STASH_ETRUNCATED:
        return "arena file truncated";
    case STASH_EINCOMPLETE:
        return "arena creation never finished";
    case STASH_EFULL:
        return "arena full";
    case STASH_ETOOBIG:
        return "record too large";
    case STASH_EBUSY:
        return "worker index held by a live process";
    case STASH_EPARALLELISM:
        return "parallelism differs from the live workers'";
    case STASH_ENOTFOUND:
        return "not found";
    case STASH_EKEYGROUP:
        return "key group not owned by this worker";
    case STASH_EKIND:
        return "state registered with another kind or options";
    case STASH_ESTALE:
        return "iterator invalidated by a write";
    case STASH_ENOKEY:
        return "no current key";
    case STASH_ECORRUPT:
        return "corrupt snapshot data";
    case STASH_EFORMAT:
        return "snapshot of another format version";
    case STASH_ENOSERVICE:
        return "no service runs for the arena";
    case STASH_EFORK:
        return "worker handle of another process (opened before a fork)";
    case STASH_EABORTED:
        return "checkpoint aborted";
    case STASH_EFENCED:
        return "fenced off the job: another service serves these workers";
    default:
        break;
    }
    if (err < 0 && err > -4096) return strerror(-err);
    return "unknown error";
}

STASH_API const char *stash_errmsg(void)
{
    return last_detail;
}

int shm_fail(int err, const char *fmt, ...)
{
    /* Through a copy: the arguments may include the previous detail. */
    char detail[sizeof last_detail];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    memcpy(last_detail, detail, sizeof detail);
    return err;
}

int shm_refuse_null(const char *fn, const char *what)
{
    return shm_fail(-EINVAL, "%s: %s is NULL", fn, what);
}

int shm_take_opts(const char *fn, const char *type, const void *src, void *dst, size_t size)
{
    memset(dst, 0, size);
    *(size_t *)dst = size;
    if (!src) return 0;
    size_t sz;
    memcpy(&sz, src, sizeof sz);
    if (sz < sizeof sz)
        return shm_fail(-EINVAL, "%s: %s.sz is %zu: set it to sizeof(%s)", fn, type, sz, type);
    const unsigned char *b = src;
    for (size_t i = size; i < sz; i++)
        if (b[i])
            return shm_fail(-EINVAL,
                            "%s: %s of %zu bytes sets byte %zu, past the %zu bytes library %s "
                            "knows",
                            fn, type, sz, i, size, stash_version());
    memcpy(dst, src, sz < size ? sz : size);
    *(size_t *)dst = size;
    return 0;
}

void shm_clear_error(void)
{
    last_detail[0] = '\0';
}
