/* SPDX-License-Identifier: MIT */
/*
 * fuzz_arena.c: an arena whose fixed parts (header, registry, catalog, key
 * groups' heaps and tables, control block, span descriptors) another
 * process corrupted: attach refuses it with a message, or what follows it
 * (the registry and service views, a worker taking over a dead one's key
 * groups and reading every key) stays inside the mapping. The input is a
 * list of patches, each a 4-byte offset (taken modulo the fixed parts'
 * size), a length byte (at most 16) and the bytes, applied to a real arena
 * that a killed worker left with 200 keys. The locks' bytes are left alone:
 * a lock made to look held by a live thread only costs the lock's timeout.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shm/shm.h"

#define KEYS 200u

static uint8_t *image;
static size_t image_len, fixed_len;
static char name[64], path[128];

/* The locks of the fixed parts, as [offset, end) ranges. */
static size_t locks[4][2];

static void destroy_image(void)
{
    stash_arena_destroy(name, NULL);
}

static void make_image(void)
{
    snprintf(name, sizeof name, "fuzz-arena-%d", (int)getpid());
    snprintf(path, sizeof path, "/dev/shm/stash.%s", name);
    stash_arena *a;
    if (stash_arena_create(name,
                           &(stash_arena_opts){.sz = sizeof(stash_arena_opts),
                                               .size = 4u << 20,
                                               .max_parallelism = 8,
                                               .flags = STASH_ARENA_REPLACE},
                           &a) != 0)
        abort();
    atexit(destroy_image);
    pid_t pid = fork();
    if (pid == 0) {
        /* A worker that writes its keys and dies without leaving. */
        stash_worker *w;
        stash_state *v;
        if (stash_worker_open(name, NULL, &w) ||
            stash_state_get(w,
                            &(stash_state_desc){
                                .sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
                            &v))
            _exit(1);
        for (uint64_t k = 0; k < KEYS; k++) {
            stash_key_set(w, &k, sizeof k);
            stash_value_put(v, &k, sizeof k);
        }
        _exit(0);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) abort();
    image_len = a->size;
    fixed_len = a->hdr->data_off;
    const size_t lock_at[4] = {offsetof(shm_header, pool_lock), offsetof(shm_header, registry_lock),
                               offsetof(shm_header, catalog_lock),
                               a->hdr->control_off + offsetof(shm_control, lock)};
    for (int i = 0; i < 4; i++) {
        locks[i][0] = lock_at[i];
        locks[i][1] = lock_at[i] + sizeof(shm_lock);
    }
    image = malloc(image_len);
    if (!image) abort();
    memcpy(image, a->base, image_len);
    stash_arena_close(a);
}

static bool touches_a_lock(size_t off, size_t n)
{
    for (int i = 0; i < 4; i++)
        if (off < locks[i][1] && off + n > locks[i][0]) return true;
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!image) make_image();
    FILE *f = fopen(path, "r+b");
    if (!f || fwrite(image, 1, image_len, f) != image_len) abort();
    while (size >= 5) {
        uint32_t off;
        memcpy(&off, data, 4);
        size_t n = data[4] % 17;
        data += 5;
        size -= 5;
        if (n > size) n = size;
        off %= (uint32_t)fixed_len;
        if (off + n > fixed_len) n = fixed_len - off;
        if (!touches_a_lock(off, n)) {
            fseek(f, off, SEEK_SET);
            if (fwrite(data, 1, n, f) != n) abort();
        }
        data += n;
        size -= n;
    }
    fclose(f);
    stash_arena *a;
    if (stash_arena_open(name, NULL, &a) != 0) {
        if (!stash_errmsg()[0]) abort();
        return 0;
    }
    stash_worker_info slots[4];
    size_t n;
    stash_registry_list(a, slots, 4, &n);
    stash_service_info si;
    stash_service_info_get(a, &si);
    stash_kg_usage u;
    for (uint32_t kg = 0; kg < 8; kg++) stash_kg_usage_get(a, kg, &u);
    stash_worker *w;
    stash_state *v;
    if (stash_worker_open(name, NULL, &w) == 0) {
        if (stash_state_get(w,
                            &(stash_state_desc){
                                .sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
                            &v) == 0) {
            for (uint64_t k = 0; k < KEYS; k++) {
                stash_bytes b;
                stash_key_set(w, &k, sizeof k);
                stash_value_get(v, &b);
            }
        }
        stash_worker_close(w);
    }
    stash_arena_close(a);
    return 0;
}
