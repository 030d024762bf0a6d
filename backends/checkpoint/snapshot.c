/* SPDX-License-Identifier: MIT */
/*
 * snapshot.c: key-group blocks of the canonical snapshot format. A writer
 * walks a key group as of a pinned version and serializes each live record;
 * a reader trusts no byte: it checks the header's own checksum, the magic,
 * the version and every length against what is there, then the payload's
 * checksum, before it decompresses or parses anything.
 */
#include <errno.h>
#include <lz4.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/checkpoint/snapshot.h"

void snap_buf_free(snap_buf *b)
{
    free(b->data);
    *b = (snap_buf){0};
}

static int buf_reserve(snap_buf *b, size_t more)
{
    size_t need = b->len + more;
    if (!b->aligned) return shm_reserve(&b->data, &b->cap, need) < 0 ? -ENOMEM : 0;
    if (need <= b->cap) return 0;
    size_t n = b->cap ? b->cap : 64u << 10;
    while (n < need) n *= 2;
    void *grown;
    if (posix_memalign(&grown, 4096, n) != 0) return -ENOMEM;
    if (b->len) memcpy(grown, b->data, b->len);
    free(b->data);
    b->data = grown;
    b->cap = n;
    return 0;
}

int snap_buf_put(snap_buf *b, const void *p, size_t n)
{
    if (buf_reserve(b, n) < 0) return -ENOMEM;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

int snap_block_add(snap_buf *out, const store_record *r)
{
    snap_rec_hdr h = {r->state, r->klen, r->nslen, r->flags, r->vlen};
    size_t n = sizeof h + r->klen + r->nslen + r->vlen;
    if (buf_reserve(out, n) < 0) return shm_fail(-ENOMEM, "out of memory");
    uint8_t *p = out->data + out->len;
    memcpy(p, &h, sizeof h);
    if (r->klen) memcpy(p + sizeof h, r->key, r->klen);
    if (r->nslen) memcpy(p + sizeof h + r->klen, r->ns, r->nslen);
    if (r->vlen) memcpy(p + sizeof h + r->klen + r->nslen, r->value, r->vlen);
    out->len += n;
    return 0;
}

typedef struct writer {
    snap_buf *out;
    uint64_t records;
    const snap_filter *filter;
    snap_buf scratch;
} writer;

static int write_record(void *ctx, const store_record *r)
{
    writer *w = ctx;
    store_record kept;
    if (w->filter) {
        kept = *r;
        int keep = w->filter->fn(w->filter->ctx, r->state, &kept.value, &kept.vlen, &w->scratch);
        if (keep <= 0) return keep;
        r = &kept;
    }
    int rc = snap_block_add(w->out, r);
    if (rc == 0) w->records++;
    return rc;
}

int snap_block_begin(snap_buf *out, size_t *start)
{
    *start = out->len;
    if (buf_reserve(out, sizeof(snap_block_hdr)) < 0) return shm_fail(-ENOMEM, "out of memory");
    out->len += sizeof(snap_block_hdr);
    return 0;
}

int64_t snap_block_end(snap_buf *out, size_t start, uint32_t kg, uint64_t records, uint16_t flags,
                       bool lz4)
{
    size_t raw_len = out->len - start - sizeof(snap_block_hdr);
    if (raw_len > UINT32_MAX / 2) {
        out->len = start;
        return shm_fail(STASH_ETOOBIG, "key group %u: %zu bytes in one block", kg, raw_len);
    }
    if (lz4 && raw_len > 0) {
        int bound = LZ4_compressBound((int)raw_len);
        uint8_t *tmp = malloc((size_t)bound);
        if (!tmp) {
            out->len = start;
            return -ENOMEM;
        }
        int n = LZ4_compress_default((const char *)out->data + start + sizeof(snap_block_hdr),
                                     (char *)tmp, (int)raw_len, bound);
        if (n > 0 && (size_t)n < raw_len) {
            memcpy(out->data + start + sizeof(snap_block_hdr), tmp, (size_t)n);
            out->len = start + sizeof(snap_block_hdr) + (size_t)n;
            flags |= SNAP_LZ4;
        }
        free(tmp);
    }
    snap_block_hdr h = {.format_version = SNAP_FORMAT_VERSION,
                        .flags = flags,
                        .kg = kg,
                        .records = records,
                        .raw_len = (uint32_t)raw_len};
    memcpy(h.magic, SNAP_BLOCK_MAGIC, 4);
    h.stored_len = (uint32_t)(out->len - start - sizeof h);
    h.payload_crc = snap_crc32c(0, out->data + start + sizeof h, h.stored_len);
    h.header_crc = snap_crc32c(0, &h, offsetof(snap_block_hdr, header_crc));
    memcpy(out->data + start, &h, sizeof h);
    return (int64_t)records;
}

int64_t snap_write_kg(store *st, uint32_t kg, const store_cut *cut, bool lz4,
                      const snap_filter *filter, snap_buf *out)
{
    size_t start;
    if (snap_block_begin(out, &start) < 0) return -ENOMEM;
    writer w = {out, 0, cut->base_id ? NULL : filter, {0}};
    int rc = st->ops->snapshot(st, kg, cut, write_record, &w);
    snap_buf_free(&w.scratch);
    if (rc < 0) {
        out->len = start;
        return rc;
    }
    return snap_block_end(out, start, kg, w.records, cut->base_id ? SNAP_DELTA : 0, lz4);
}

static int read_block(const uint8_t *p, size_t avail, const char *file, uint64_t off,
                      snap_buf *scratch, bool checked, snap_block *out)
{
    snap_block_hdr h;
    if (avail < sizeof h)
        return shm_fail(STASH_ECORRUPT, "%s: offset %llu: %zu bytes, too few for a block header",
                        file, (unsigned long long)off, avail);
    memcpy(&h, p, sizeof h);
    if (memcmp(h.magic, SNAP_BLOCK_MAGIC, 4) != 0)
        return shm_fail(STASH_ECORRUPT, "%s: offset %llu: no key-group block magic", file,
                        (unsigned long long)off);
    if (snap_crc32c(0, &h, offsetof(snap_block_hdr, header_crc)) != h.header_crc)
        return shm_fail(STASH_ECORRUPT, "%s: offset %llu: block header checksum mismatch", file,
                        (unsigned long long)off);
    if (h.format_version != SNAP_FORMAT_VERSION)
        return shm_fail(STASH_EFORMAT, "%s: offset %llu: format version %u, this build reads %u",
                        file, (unsigned long long)off, h.format_version, SNAP_FORMAT_VERSION);
    if (h.stored_len > avail - sizeof h || (h.flags & ~(SNAP_LZ4 | SNAP_DELTA)) ||
        (!(h.flags & SNAP_LZ4) && h.stored_len != h.raw_len))
        return shm_fail(STASH_ECORRUPT,
                        "%s: offset %llu: key group %u: a payload of %u bytes (%u raw) where %zu "
                        "remain",
                        file, (unsigned long long)off, h.kg, h.stored_len, h.raw_len,
                        avail - sizeof h);
    const uint8_t *payload = p + sizeof h;
    if (!checked && snap_crc32c(0, payload, h.stored_len) != h.payload_crc)
        return shm_fail(STASH_ECORRUPT, "%s: offset %llu: key group %u: payload checksum mismatch",
                        file, (unsigned long long)(off + sizeof h), h.kg);
    if (h.flags & SNAP_LZ4) {
        /* LZ4 expands a byte to at most 255: a larger claim is no block of
         * ours, and must not make the reader reserve what it claims. */
        if (h.raw_len > UINT32_MAX / 2 || (uint64_t)h.raw_len > (uint64_t)h.stored_len * 255 + 64)
            return shm_fail(STASH_ECORRUPT,
                            "%s: offset %llu: key group %u: %u bytes of LZ4 claim %u raw bytes",
                            file, (unsigned long long)off, h.kg, h.stored_len, h.raw_len);
        scratch->len = 0;
        if (buf_reserve(scratch, h.raw_len ? h.raw_len : 1) < 0) return -ENOMEM;
        int n = LZ4_decompress_safe((const char *)payload, (char *)scratch->data, (int)h.stored_len,
                                    (int)h.raw_len);
        if (n < 0 || (uint32_t)n != h.raw_len)
            return shm_fail(STASH_ECORRUPT,
                            "%s: offset %llu: key group %u: LZ4 payload does not "
                            "decompress to %u bytes",
                            file, (unsigned long long)(off + sizeof h), h.kg, h.raw_len);
        payload = scratch->data;
    }
    *out = (snap_block){h, payload, sizeof h + h.stored_len};
    return 0;
}

int snap_read_block(const uint8_t *p, size_t avail, const char *file, uint64_t off,
                    snap_buf *scratch, snap_block *out)
{
    return read_block(p, avail, file, off, scratch, false, out);
}

int snap_reread_block(const uint8_t *p, size_t avail, const char *file, uint64_t off,
                      snap_buf *scratch, snap_block *out)
{
    return read_block(p, avail, file, off, scratch, true, out);
}

int64_t snap_block_records(const snap_block *b, uint32_t max_parallelism, snap_record_fn *fn,
                           void *ctx, const char *file, uint64_t off)
{
    uint32_t kg = b->hdr.kg;
    if (kg >= max_parallelism)
        return shm_fail(STASH_ECORRUPT, "%s: offset %llu: key group %u beyond max parallelism %u",
                        file, (unsigned long long)off, kg, max_parallelism);
    const uint8_t *p = b->payload, *end = b->payload + b->hdr.raw_len;
    uint64_t n = 0;
    while (p < end) {
        snap_rec_hdr h;
        uint64_t at = off + sizeof(snap_block_hdr) + (uint64_t)(p - b->payload);
        if ((size_t)(end - p) < sizeof h)
            return shm_fail(STASH_ECORRUPT,
                            "%s: offset %llu: key group %u: a record header cut "
                            "short",
                            file, (unsigned long long)at, kg);
        memcpy(&h, p, sizeof h);
        uint64_t need = sizeof h + (uint64_t)h.klen + h.nslen + h.vlen, hash = 0;
        if (need <= (uint64_t)(end - p)) hash = stash_hash(p + sizeof h, h.klen);
        if (need > (uint64_t)(end - p) || hash % max_parallelism != kg)
            return shm_fail(STASH_ECORRUPT,
                            "%s: offset %llu: key group %u: a record (state %u, "
                            "%u + %u + %u bytes) that does not fit or belong",
                            file, (unsigned long long)at, kg, h.state, h.klen, h.nslen, h.vlen);
        const uint8_t *key = p + sizeof h;
        if ((h.flags & ~SNAP_REC_DELETED) ||
            ((h.flags & SNAP_REC_DELETED) && (h.vlen || !(b->hdr.flags & SNAP_DELTA))))
            return shm_fail(STASH_ECORRUPT,
                            "%s: offset %llu: key group %u: a record with flags "
                            "%#x",
                            file, (unsigned long long)at, kg, h.flags);
        snap_record r = {h.state, h.klen, h.nslen,      h.flags,
                         h.vlen,  key,    key + h.klen, key + h.klen + h.nslen,
                         hash};
        int rc = fn(ctx, kg, &r);
        if (rc < 0) {
            if (rc == STASH_ECORRUPT) {
                char why[256];
                snprintf(why, sizeof why, "%s", stash_errmsg());
                shm_fail(rc, "%s: offset %llu: key group %u: %s", file, (unsigned long long)at, kg,
                         why);
            }
            return rc;
        }
        p += need;
        n++;
    }
    if (n != b->hdr.records)
        return shm_fail(STASH_ECORRUPT,
                        "%s: offset %llu: key group %u holds %llu records, its "
                        "header says %llu",
                        file, (unsigned long long)off, kg, (unsigned long long)n,
                        (unsigned long long)b->hdr.records);
    return (int64_t)n;
}

/* Inserts one record, replacing what the key group holds for it. */

int snap_restore_record(void *restorer, uint32_t kg, const snap_record *r)
{
    snap_restorer *x = restorer;
    if (r->state >= x->map->n || x->map->ids[r->state] == 0)
        return shm_fail(STASH_ECORRUPT, "a record of state %u, which the metadata does not name",
                        r->state);
    uint16_t state = x->map->ids[r->state];
    shm_lookup l = {
        .kg = kg,
        .hash = shm_lookup_hash(r->key_hash, shm_lookup_seed(state, shm_ns_hash(r->ns, r->nslen))),
        .state = state,
        .klen = r->klen,
        .nslen = r->nslen,
        .key = r->key,
        .ns = r->nslen ? (const void *)r->ns : ""};
    return x->store->ops->restore(x->store, &l, r);
}

int snap_restore_kg_done(void *restorer, uint32_t kg, int rc)
{
    snap_restorer *x = restorer;
    return x->store->ops->restore_end ? x->store->ops->restore_end(x->store, kg, rc) : rc;
}

int ttl_cut_init(stash_arena *a, uint64_t now_ms, ttl_cut *cut)
{
    memset(cut, 0, sizeof *cut);
    cut->now_ms = now_ms;
    int n = 0;
    for (uint32_t i = 0; i < SHM_CATALOG_SIZE; i++) {
        const shm_catalog_entry *e = &a->catalog[i];
        /* Event-time states leave nothing out: the cut's time is the clock's. */
        if (!atomic_load(&e->used) || !e->options[STATE_OPT_CLEANUP_FULL_SNAPSHOT] ||
            e->options[STATE_OPT_EVENT_TIME])
            continue;
        memcpy(&cut->ttl_ms[i + 1], e->options, sizeof cut->ttl_ms[i + 1]);
        cut->kind[i + 1] = (uint8_t)e->kind;
        n += cut->ttl_ms[i + 1] > 0;
    }
    return n;
}

int ttl_cut_filter(void *ctx, uint16_t state, const uint8_t **value, uint32_t *vlen,
                   snap_buf *scratch)
{
    const ttl_cut *cut = ctx;
    uint64_t ttl = state <= SHM_CATALOG_SIZE ? cut->ttl_ms[state] : 0;
    if (!ttl) return 1;
    if (cut->kind[state] != STASH_LIST && cut->kind[state] != STASH_MAP)
        return *vlen < TTL_BYTES || !ttl_expired(state_ts_get(*value), ttl, cut->now_ms);
    /* Lists per element, maps per user key: a filtered copy. */
    if (shm_reserve(&scratch->data, &scratch->cap, *vlen ? *vlen : 1) < 0)
        return shm_fail(-ENOMEM, "out of memory");
    size_t kept = *vlen;
    if (cut->kind[state] == STASH_LIST) {
        kept = list_keep_unexpired(*value, *vlen, ttl, cut->now_ms, scratch->data);
    } else {
        memcpy(scratch->data, *value, *vlen);
        if (!map_drop_expired(scratch->data, *vlen, ttl, cut->now_ms)) kept = 0;
    }
    if (kept == 0) return 0;
    *value = scratch->data;
    *vlen = (uint32_t)kept;
    return 1;
}
