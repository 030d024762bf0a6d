/* SPDX-License-Identifier: MIT */
/*
 * fuzz_common.c: packed checkpoints unpacked into files, and record digests.
 */
#include "tests/fuzz/fuzz_common.h"

#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/checkpoint/checkpoints.h"
#include "include/stash.h"

static char root[128];

static void write_file(const char *path, const uint8_t *p, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) abort();
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) abort();
        p += w;
        n -= (size_t)w;
    }
    close(fd);
}

/* The files of the last input and the directories, when the fuzzer exits. */
static void remove_root(void)
{
    char path[256];
    static const char *const names[] = {"ck/_metadata", "ck/kg-data.dat", "ck", "shared"};
    for (unsigned i = 1; i <= FUZZ_MAX_SECTIONS; i++) {
        snprintf(path, sizeof path, "%s/shared/%u.dat", root, i);
        unlink(path);
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", root, names[i]);
        if (unlink(path) < 0) rmdir(path);
    }
    rmdir(root);
}

const char *fuzz_unpack(const uint8_t *data, size_t size)
{
    static char ck[160];
    char path[256];
    if (!root[0]) {
        atexit(remove_root);
        snprintf(root, sizeof root, "/dev/shm/stash-fuzz-%d", (int)getpid());
        mkdir(root, 0700);
        snprintf(path, sizeof path, "%s/ck", root);
        mkdir(path, 0700);
        snprintf(path, sizeof path, "%s/shared", root);
        mkdir(path, 0700);
        snprintf(ck, sizeof ck, "%s/ck", root);
    }
    snprintf(path, sizeof path, "%s/_metadata", ck);
    unlink(path);
    snprintf(path, sizeof path, "%s/kg-data.dat", ck);
    unlink(path);
    for (unsigned i = 1; i <= FUZZ_MAX_SECTIONS; i++) {
        snprintf(path, sizeof path, "%s/shared/%u.dat", root, i);
        unlink(path);
    }
    unsigned n = 0;
    while (size >= 4 && n < FUZZ_MAX_SECTIONS) {
        uint32_t len;
        memcpy(&len, data, 4);
        data += 4;
        size -= 4;
        bool seal = n == 0 && (len & FUZZ_SEAL);
        len &= ~FUZZ_SEAL;
        if (len > size) len = (uint32_t)size;
        if (seal && len >= 4) {
            /* The metadata's checksum over what the mutation made of it. */
            uint8_t *md = malloc(len);
            if (!md) abort();
            memcpy(md, data, len);
            uint32_t crc = snap_crc32c(0, md, len - 4);
            memcpy(md + len - 4, &crc, 4);
            snprintf(path, sizeof path, "%s/_metadata", ck);
            write_file(path, md, len);
            free(md);
            data += len;
            size -= len;
            n++;
            continue;
        }
        if (n == 0)
            snprintf(path, sizeof path, "%s/_metadata", ck);
        else if (n == 1)
            snprintf(path, sizeof path, "%s/kg-data.dat", ck);
        else
            snprintf(path, sizeof path, "%s/shared/%u.dat", root, n - 1);
        write_file(path, data, len);
        data += len;
        size -= len;
        n++;
    }
    return n ? ck : NULL;
}

int fuzz_pack_section(uint8_t *buf, size_t cap, size_t *len, const void *data, uint32_t n)
{
    if (cap - *len < 4 + (size_t)n) return -1;
    memcpy(buf + *len, &n, 4);
    if (n) memcpy(buf + *len + 4, data, n);
    *len += 4 + (size_t)n;
    return 0;
}

static uint64_t mix(uint64_t h, const void *p, size_t n)
{
    return stash_hash(p, n) ^ (h * 0x9e3779b97f4a7c15ull + n);
}

void fuzz_digest_add(fuzz_digest *d, uint32_t kg, const char *state, const void *key, size_t klen,
                     const void *ns, size_t nslen, const void *value, size_t vlen)
{
    uint64_t h = mix(kg, state, strlen(state));
    h = mix(h, key, klen);
    h = mix(h, ns, nslen);
    h = mix(h, value, vlen);
    d->count++;
    d->sum += h * 0xff51afd7ed558ccdull;
}
