/* SPDX-License-Identifier: MIT */
/*
 * align.c: memory that direct I/O accepts: the alignment a file asks for
 * (statx STATX_DIOALIGN, 4096 where unknown), aligned allocations, and the
 * engine's pool of page-aligned anonymous staging buffers. The pool is
 * anonymous on purpose: io_uring cannot register buffers that point into a
 * file-backed shared mapping such as the arena.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "ioengine/ioengine.h"

#define FALLBACK_ALIGN 4096u

int ioe_dio_align(int fd, ioe_align *out)
{
    struct statx stx;
    *out = (ioe_align){FALLBACK_ALIGN, FALLBACK_ALIGN};
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) < 0) return errno == ENOSYS ? 0 : -errno;
    if (!(stx.stx_mask & STATX_DIOALIGN)) return 0;
    if (stx.stx_dio_mem_align == 0 || stx.stx_dio_offset_align == 0) return -EOPNOTSUPP;
    *out = (ioe_align){stx.stx_dio_mem_align, stx.stx_dio_offset_align};
    return 0;
}

int ioe_aligned_alloc(size_t size, size_t align, void **out)
{
    if (align == 0) align = FALLBACK_ALIGN;
    if ((align & (align - 1)) != 0 || align < sizeof(void *)) return -EINVAL;
    if (size == 0 || size > SIZE_MAX - align) return -EINVAL;
    void *p;
    int rc = posix_memalign(&p, align, ioe_align_up(size, align));
    if (rc != 0) return -rc;
    *out = p;
    return 0;
}

int ioe_pool_init(ioe_pool *p, unsigned count, size_t buf_size)
{
    *p = (ioe_pool){.buf_size = buf_size, .count = count};
    void *base = mmap(NULL, (size_t)count * buf_size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    p->free = calloc(count, sizeof *p->free);
    p->taken = calloc(count, sizeof *p->taken);
    if (base == MAP_FAILED || !p->free || !p->taken) {
        if (base != MAP_FAILED) munmap(base, (size_t)count * buf_size);
        free(p->free);
        free(p->taken);
        *p = (ioe_pool){0};
        return -ENOMEM;
    }
    p->base = base;
    /* Hand out low indices first: the stack's top is index 0. */
    for (unsigned i = 0; i < count; i++) p->free[i] = count - 1 - i;
    p->nfree = count;
    return 0;
}

void ioe_pool_fini(ioe_pool *p)
{
    if (p->base) munmap(p->base, (size_t)p->count * p->buf_size);
    free(p->free);
    free(p->taken);
    *p = (ioe_pool){0};
}

int ioe_pool_index(const ioe_pool *p, const void *buf, size_t len)
{
    const char *c = buf;
    if (!p->base || c < p->base || c >= p->base + (size_t)p->count * p->buf_size) return -1;
    size_t i = (size_t)(c - p->base) / p->buf_size;
    if (len > p->buf_size - ((size_t)(c - p->base) - i * p->buf_size)) return -1;
    return (int)i;
}

int ioe_pool_take(ioe_pool *p, void **out)
{
    if (p->nfree == 0) return -ENOBUFS;
    unsigned i = p->free[--p->nfree];
    p->taken[i] = true;
    *out = p->base + (size_t)i * p->buf_size;
    return 0;
}

int ioe_pool_give(ioe_pool *p, void *buf)
{
    int i = ioe_pool_index(p, buf, p->buf_size);
    if (i < 0 || (char *)buf != p->base + (size_t)i * p->buf_size || !p->taken[i]) return -EINVAL;
    p->taken[i] = false;
    p->free[p->nfree++] = (unsigned)i;
    return 0;
}
