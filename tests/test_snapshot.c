/* SPDX-License-Identifier: MIT */
/*
 * test_snapshot.c: key-group blocks of the snapshot format: CRC32C, a round
 * trip of every state kind as of a pinned version while the owner writes on,
 * with and without LZ4, and a reader that refuses every corrupt, truncated
 * or foreign block with the file and offset.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/checkpoint/checkpoints.h"
#include "tests/helpers.h"

#define KGS 16u

Test(snapshot, crc32c_matches_the_standard_check_value)
{
    cr_assert_eq(snap_crc32c(0, "123456789", 9), 0xe3069283u);
    cr_assert_eq(snap_crc32c(0, "", 0), 0);
    uint8_t buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (uint8_t)(i * 7);
    uint32_t whole = snap_crc32c(0, buf, 1000);
    cr_assert_eq(snap_crc32c(snap_crc32c(0, buf, 333), buf + 333, 667), whole, "it continues");
}

Test(snapshot, crc32c_by_table_equals_crc32c_by_instruction)
{
    cr_assert_eq(snap_crc32c_portable(0, "123456789", 9), 0xe3069283u);
    unsigned seed = test_seed("crc32c_by_table_equals_crc32c_by_instruction");
    srand(seed);
    static uint8_t buf[65536];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)rand();
    for (int round = 0; round < 200; round++) {
        size_t at = (size_t)rand() % 1024, len = (size_t)rand() % (sizeof buf - at);
        uint32_t start = (uint32_t)rand();
        cr_assert_eq(snap_crc32c_portable(start, buf + at, len), snap_crc32c(start, buf + at, len),
                     "seed %u round %d: %zu bytes at %zu", seed, round, len, at);
    }
}

typedef struct first_use {
    pthread_barrier_t *go;
    uint32_t crc;
} first_use;

static void *crc_at_once(void *arg)
{
    first_use *f = arg;
    pthread_barrier_wait(f->go);
    f->crc = snap_crc32c_portable(0, "123456789", 9);
    return NULL;
}

Test(snapshot, crc32c_by_table_is_right_from_the_first_use_in_every_thread)
{
    /* A table built at first use could be read half-built by a second
     * thread: every thread's first checksum must be the right one. */
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 8);
    first_use f[8];
    pthread_t t[8];
    for (int i = 0; i < 8; i++) {
        f[i] = (first_use){&go, 0};
        cr_assert_eq(pthread_create(&t[i], NULL, crc_at_once, &f[i]), 0);
    }
    for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 8; i++) cr_assert_eq(f[i].crc, 0xe3069283u, "thread %d", i);
    pthread_barrier_destroy(&go);
}

typedef struct side {
    char name[96];
    stash_arena *arena;
    stash_worker *w;
    stash_state *v, *l, *m;
} side;

static void open_side(side *s, const char *tag)
{
    s->arena = test_arena_create(tag, 64u << 20, KGS, s->name);
    cr_assert_eq(
        stash_worker_open(s->name,
                          &(stash_worker_opts){.sz = sizeof(stash_worker_opts), .parallelism = 1},
                          &s->w),
        0);
    stash_state_get(
        s->w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
        &s->v);
    stash_state_get(
        s->w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "l", .kind = STASH_LIST},
        &s->l);
    stash_state_get(
        s->w, &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "m", .kind = STASH_MAP},
        &s->m);
}

static void close_side(side *s)
{
    cr_assert_eq(shm_check(s->arena), 0, "%s", stash_errmsg());
    stash_worker_close(s->w);
    stash_arena_close(s->arena);
    stash_arena_destroy(s->name, NULL);
}

/* Writes generation g of every key: values, a list, a map, in two namespaces. */
static void fill(side *s, int g)
{
    for (uint32_t k = 0; k < 2000; k++) {
        stash_key_set(s->w, &k, sizeof k);
        stash_state_namespace(s->v, k % 2 ? "odd" : NULL, k % 2 ? 3 : 0);
        uint64_t val[3] = {k, (uint64_t)g, k * 3};
        stash_value_put(s->v, val, sizeof val);
        if (k % 3 == 0) stash_list_add(s->l, &g, sizeof g);
        if (k % 5 == 0) {
            uint32_t uk = k % 7;
            stash_map_put(s->m, &uk, sizeof uk, val, sizeof val);
        }
        if (g > 0 && k % 11 == 0) stash_state_clear(s->v);
    }
}

/* A copy of every value, list and map as bytes, for comparing two sides. */
static void expect_same(side *a, side *b)
{
    for (uint32_t k = 0; k < 2000; k++) {
        stash_key_set(a->w, &k, sizeof k);
        stash_key_set(b->w, &k, sizeof k);
        stash_state_namespace(a->v, k % 2 ? "odd" : NULL, k % 2 ? 3 : 0);
        stash_state_namespace(b->v, k % 2 ? "odd" : NULL, k % 2 ? 3 : 0);
        stash_bytes x, y;
        int ra = stash_value_get(a->v, &x), rb = stash_value_get(b->v, &y);
        cr_assert_eq(ra, rb, "value of key %u", k);
        if (ra == 0) cr_assert(x.len == y.len && memcmp(x.data, y.data, x.len) == 0, "key %u", k);
        stash_iter ia, ib;
        ra = stash_list_get(a->l, &ia), rb = stash_list_get(b->l, &ib);
        cr_assert_eq(ra, rb, "list of key %u", k);
        while (ra == 0 && stash_iter_next(&ia, NULL, &x) == 1) {
            cr_assert_eq(stash_iter_next(&ib, NULL, &y), 1);
            cr_assert(x.len == y.len && memcmp(x.data, y.data, x.len) == 0);
        }
        for (uint32_t uk = 0; uk < 7; uk++)
            cr_assert_eq(stash_map_contains(a->m, &uk, sizeof uk),
                         stash_map_contains(b->m, &uk, sizeof uk), "map entry %u of %u", uk, k);
    }
}

static snap_id_map id_map(side *from, side *to, uint16_t *ids)
{
    memset(ids, 0, SHM_CATALOG_SIZE * sizeof *ids);
    for (uint32_t i = 0; i < SHM_CATALOG_SIZE; i++) {
        shm_catalog_entry *e = &from->arena->catalog[i];
        if (!atomic_load(&e->used)) continue;
        int id = shm_catalog_register(to->arena, e->name, e->kind, e->options);
        cr_assert_gt(id, 0);
        ids[i + 1] = (uint16_t)id;
    }
    return (snap_id_map){ids, SHM_CATALOG_SIZE + 1};
}

static void round_trip(bool lz4)
{
    side a, b, now;
    open_side(&a, "snapa");
    fill(&a, 0);
    uint32_t pins[KGS];
    for (uint32_t kg = 0; kg < KGS; kg++) pins[kg] = (uint32_t)shm_table_pin(a.arena, kg);
    /* The state as of the pins, kept aside to compare with. */
    open_side(&now, "snapref");
    fill(&now, 0);
    fill(&a, 1); /* the owner writes on after the pin */
    snap_buf out = {0};
    for (uint32_t kg = 0; kg < KGS; kg++)
        cr_assert_geq(snap_write_kg(a.w->store, kg, &(store_cut){.pin = pins[kg]}, lz4, NULL, &out),
                      0);
    for (uint32_t kg = 0; kg < KGS; kg++) shm_table_unpin(a.arena, kg, pins[kg]);

    open_side(&b, "snapb");
    uint16_t ids[SHM_CATALOG_SIZE + 1];
    snap_id_map map = id_map(&a, &b, ids);
    snap_buf scratch = {0};
    uint64_t off = 0, records = 0;
    while (off < out.len) {
        snap_block blk;
        cr_assert_eq(snap_read_block(out.data + off, out.len - off, "mem", off, &scratch, &blk), 0,
                     "%s", stash_errmsg());
        cr_assert_eq(blk.hdr.flags & SNAP_LZ4, lz4 ? SNAP_LZ4 : 0u);
        snap_restorer to = {b.w->store, &map};
        int64_t n = snap_block_records(&blk, KGS, snap_restore_record, &to, "mem", off);
        cr_assert_geq(n, 0, "%s", stash_errmsg());
        records += (uint64_t)n;
        off += blk.size;
    }
    cr_assert_gt(records, 2000);
    expect_same(&now, &b);
    snap_buf_free(&out);
    snap_buf_free(&scratch);
    close_side(&a);
    close_side(&b);
    close_side(&now);
}

Test(snapshot, every_kind_round_trips_as_of_the_pin, .timeout = 120)
{
    round_trip(false);
}

Test(snapshot, lz4_blocks_round_trip, .timeout = 120)
{
    round_trip(true);
}

Test(snapshot, the_reader_refuses_every_damaged_block, .timeout = 120)
{
    side a;
    open_side(&a, "snapbad");
    fill(&a, 0);
    snap_buf out = {0}, scratch = {0};
    uint32_t v = (uint32_t)shm_table_pin(a.arena, 3);
    cr_assert_gt(snap_write_kg(a.w->store, 3, &(store_cut){.pin = v}, false, NULL, &out), 0);
    snap_block blk;
    /* Every single flipped bit, in the header or the payload, is caught. */
    for (size_t i = 0; i < out.len; i += 1 + i / 64) {
        out.data[i] ^= 0x10;
        int rc = snap_read_block(out.data, out.len, "chk-1/kg.dat", 4096, &scratch, &blk);
        cr_assert(rc == STASH_ECORRUPT || rc == STASH_EFORMAT, "flipped byte %zu: rc %d", i, rc);
        cr_assert(strstr(stash_errmsg(), "chk-1/kg.dat: offset"), "%s", stash_errmsg());
        out.data[i] ^= 0x10;
    }
    cr_assert_eq(snap_read_block(out.data, out.len - 1, "f", 0, &scratch, &blk), STASH_ECORRUPT,
                 "truncated");
    cr_assert_eq(snap_read_block(out.data, 10, "f", 0, &scratch, &blk), STASH_ECORRUPT);
    /* Another format version, with a correct header checksum, is named as such. */
    snap_block_hdr h;
    memcpy(&h, out.data, sizeof h);
    h.format_version = 9;
    h.header_crc = snap_crc32c(0, &h, offsetof(snap_block_hdr, header_crc));
    memcpy(out.data, &h, sizeof h);
    cr_assert_eq(snap_read_block(out.data, out.len, "f", 0, &scratch, &blk), STASH_EFORMAT);
    cr_assert(strstr(stash_errmsg(), "version 9"), "%s", stash_errmsg());
    snap_buf_free(&out);
    snap_buf_free(&scratch);
    close_side(&a);
}

Test(snapshot, an_lz4_block_claiming_more_than_lz4_can_expand_is_refused_before_reserving)
{
    side a;
    open_side(&a, "snaplz");
    fill(&a, 0);
    snap_buf out = {0}, scratch = {0};
    cr_assert_gt(snap_write_kg(a.w->store, 2,
                               &(store_cut){.pin = (uint32_t)shm_table_pin(a.arena, 2)}, true, NULL,
                               &out),
                 0);
    snap_block_hdr h;
    memcpy(&h, out.data, sizeof h);
    cr_assert(h.flags & SNAP_LZ4, "the block is compressed");
    /* 4 GiB claimed, with both checksums right. */
    h.raw_len = UINT32_MAX;
    h.header_crc = snap_crc32c(0, &h, offsetof(snap_block_hdr, header_crc));
    memcpy(out.data, &h, sizeof h);
    snap_block blk;
    cr_assert_eq(snap_read_block(out.data, out.len, "f", 0, &scratch, &blk), STASH_ECORRUPT);
    cr_assert(strstr(stash_errmsg(), "claim 4294967295 raw bytes"), "%s", stash_errmsg());
    cr_assert_lt(scratch.cap, 1u << 20, "nothing near the claim was reserved");
    snap_buf_free(&out);
    snap_buf_free(&scratch);
    close_side(&a);
}

Test(snapshot, a_record_of_another_key_group_is_refused)
{
    side a;
    open_side(&a, "snapkg");
    fill(&a, 0);
    snap_buf out = {0}, scratch = {0};
    cr_assert_gt(snap_write_kg(a.w->store, 5, &(store_cut){.pin = 1}, false, NULL, &out), 0);
    /* Claim the records belong to key group 6, with valid checksums. */
    snap_block_hdr h;
    memcpy(&h, out.data, sizeof h);
    h.kg = 6;
    h.header_crc = snap_crc32c(0, &h, offsetof(snap_block_hdr, header_crc));
    memcpy(out.data, &h, sizeof h);
    snap_block blk;
    cr_assert_eq(snap_read_block(out.data, out.len, "f", 0, &scratch, &blk), 0);
    uint16_t ids[SHM_CATALOG_SIZE + 1];
    snap_id_map map = id_map(&a, &a, ids);
    snap_restorer to = {a.w->store, &map};
    cr_assert_eq(snap_block_records(&blk, KGS, snap_restore_record, &to, "f", 0), STASH_ECORRUPT);
    cr_assert(strstr(stash_errmsg(), "key group 6"), "%s", stash_errmsg());
    snap_buf_free(&out);
    snap_buf_free(&scratch);
    close_side(&a);
}

/* The changes between two pins: a delta applied on the base gives the state
 * at the second pin, and after 1% of keys changed it is a few percent of a
 * full snapshot. */
Test(snapshot, a_delta_on_its_base_gives_the_later_state, .timeout = 120)
{
    side a, b;
    open_side(&a, "delta");
    uint8_t val[100];
    for (uint32_t k = 0; k < 20000; k++) {
        stash_key_set(a.w, &k, sizeof k);
        memset(val, (int)(k % 251), sizeof val);
        stash_value_put(a.v, val, sizeof val);
    }
    uint32_t base[KGS], cut[KGS];
    for (uint32_t kg = 0; kg < KGS; kg++) base[kg] = (uint32_t)shm_table_pin(a.arena, kg);
    snap_buf full = {0}, delta = {0}, scratch = {0};
    for (uint32_t kg = 0; kg < KGS; kg++)
        cr_assert_geq(
            snap_write_kg(a.w->store, kg, &(store_cut){.pin = base[kg]}, false, NULL, &full), 0);
    for (uint32_t k = 0; k < 20000; k += 100) { /* 1% changed */
        stash_key_set(a.w, &k, sizeof k);
        memset(val, 0xee, sizeof val);
        stash_value_put(a.v, val, sizeof val);
    }
    for (uint32_t k = 50; k < 20000; k += 400) { /* deleted */
        stash_key_set(a.w, &k, sizeof k);
        stash_state_clear(a.v);
    }
    for (uint32_t k = 30000; k < 30050; k++) { /* added, and one added then deleted */
        stash_key_set(a.w, &k, sizeof k);
        stash_value_put(a.v, val, sizeof val);
    }
    uint32_t gone = 30049;
    stash_key_set(a.w, &gone, sizeof gone);
    stash_state_clear(a.v);
    for (uint32_t kg = 0; kg < KGS; kg++) cut[kg] = (uint32_t)shm_table_pin(a.arena, kg);
    uint64_t changes = 0;
    for (uint32_t kg = 0; kg < KGS; kg++) {
        int64_t n =
            snap_write_kg(a.w->store, kg, &(store_cut){cut[kg], base[kg], 1}, false, NULL, &delta);
        cr_assert_geq(n, 0);
        changes += (uint64_t)n;
    }
    cr_assert_eq(changes, 200 + 50 + 49, "changed, deleted and added entries, once each");
    cr_assert_leq(delta.len * 100, full.len * 3, "a delta of %zu bytes beside a full %zu",
                  delta.len, full.len);

    open_side(&b, "deltab");
    uint16_t ids[SHM_CATALOG_SIZE + 1];
    snap_id_map map = id_map(&a, &b, ids);
    snap_restorer to = {b.w->store, &map};
    snap_buf *bufs[2] = {&full, &delta};
    for (int i = 0; i < 2; i++) {
        for (uint64_t off = 0; off < bufs[i]->len;) {
            snap_block blk;
            cr_assert_eq(snap_read_block(bufs[i]->data + off, bufs[i]->len - off, "mem", off,
                                         &scratch, &blk),
                         0, "%s", stash_errmsg());
            cr_assert_geq(snap_block_records(&blk, KGS, snap_restore_record, &to, "mem", off), 0,
                          "%s", stash_errmsg());
            off += blk.size;
        }
    }
    for (uint32_t k = 0; k < 30050; k++) {
        stash_key_set(a.w, &k, sizeof k);
        stash_key_set(b.w, &k, sizeof k);
        stash_bytes x, y;
        int ra = stash_value_get(a.v, &x), rb = stash_value_get(b.v, &y);
        cr_assert_eq(ra, rb, "key %u", k);
        if (ra == 0) cr_assert(x.len == y.len && memcmp(x.data, y.data, x.len) == 0, "key %u", k);
    }
    for (uint32_t kg = 0; kg < KGS; kg++) {
        shm_table_unpin(a.arena, kg, base[kg]);
        shm_table_unpin(a.arena, kg, cut[kg]);
    }
    snap_buf_free(&full);
    snap_buf_free(&delta);
    snap_buf_free(&scratch);
    close_side(&a);
    close_side(&b);
}
