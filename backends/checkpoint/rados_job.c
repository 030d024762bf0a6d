/* SPDX-License-Identifier: MIT */
/*
 * rados_job.c: the objects of a job that spans hosts (rados_job.h). A
 * part's note and the job's record are small pointer objects written once
 * (exclusive create): a line "HOST P MAXP WORKERS" per part. The record of
 * checkpoint ID is JOB/job-ID, its abort JOB/job-ID.aborted, the notes
 * JOB/job-ID.part.HOST; committed means the record is there and JOB/latest
 * has been moved to ID or past it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backends/checkpoint/ckpt.h"
#include "backends/checkpoint/rados_job.h"

#define RECORD_MAX 8192 /* bytes of a record: CKPT_JOB_HOSTS lines */

bool ckpt_job_host_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > CKPT_JOB_HOST_MAX || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!(c >= 'a' && c <= 'z') && !(c >= 'A' && c <= 'Z') && !(c >= '0' && c <= '9') &&
            c != '.' && c != '_' && c != '-')
            return false;
    }
    return true;
}

int ckpt_job_workers_parse(const char *text, ckpt_job_workers *w)
{
    memset(w, 0, sizeof *w);
    const char *p = text;
    while (p && *p) {
        char *end;
        errno = 0;
        unsigned long a = strtoul(p, &end, 10), b = a;
        if (end == p || errno) break;
        if (*end == '-') {
            p = end + 1;
            b = strtoul(p, &end, 10);
            if (end == p || errno) break;
        }
        if (a > b || b >= STASH_MAX_WORKERS || w->n == CKPT_JOB_RANGES) break;
        w->r[w->n].first = (uint32_t)a;
        w->r[w->n++].last = (uint32_t)b;
        if (*end == 0) return 0;
        if (*end != ',') break;
        p = end + 1;
    }
    return shm_fail(-EINVAL,
                    "workers '%s': ranges A-B of worker indices below %u, comma-separated (at "
                    "most %u)",
                    text ? text : "(null)", STASH_MAX_WORKERS, CKPT_JOB_RANGES);
}

void ckpt_job_workers_format(const ckpt_job_workers *w, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = 0;
    for (uint32_t i = 0; i < w->n && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%u-%u", i ? "," : "", w->r[i].first,
                                w->r[i].last);
}

bool ckpt_job_workers_has(const ckpt_job_workers *w, uint32_t index)
{
    for (uint32_t i = 0; i < w->n; i++)
        if (index >= w->r[i].first && index <= w->r[i].last) return true;
    return false;
}

int ckpt_job_workers_add(ckpt_job_workers *w, const ckpt_job_workers *add)
{
    if (w->n + add->n > CKPT_JOB_RANGES)
        return shm_fail(-E2BIG, "more than %u ranges of workers", CKPT_JOB_RANGES);
    for (uint32_t i = 0; i < add->n; i++) w->r[w->n++] = add->r[i];
    return 0;
}

int ckpt_job_object(char *out, size_t cap, const char *job, const char *what)
{
    int n = snprintf(out, cap, "%s/%s", job, what);
    return n > 0 && (size_t)n < cap ? 0 : shm_fail(-ENAMETOOLONG, "%s/%s: too long", job, what);
}

int ckpt_job_part_prefix(char *out, size_t cap, const char *job, const char *host)
{
    int n = snprintf(out, cap, "%s/part/%s", job, host);
    return n > 0 && (size_t)n < cap ? 0
                                    : shm_fail(-ENAMETOOLONG, "%s/part/%s: too long", job, host);
}

/* ---- text of notes and records ------------------------------------------------ */

void ckpt_job_part_format(const ckpt_job_part *p, char *buf, size_t cap)
{
    char w[512];
    ckpt_job_workers_format(&p->workers, w, sizeof w);
    snprintf(buf, cap, "%s %u %u %s\n", p->host, p->parallelism, p->max_parallelism, w);
}

static int parse_part(const char *line, ckpt_job_part *p, const char *what)
{
    char host[CKPT_JOB_HOST_MAX + 2], w[512];
    memset(p, 0, sizeof *p);
    if (sscanf(line, "%64s %u %u %511s", host, &p->parallelism, &p->max_parallelism, w) != 4 ||
        !ckpt_job_host_ok(host) || p->parallelism == 0 || p->max_parallelism == 0 ||
        ckpt_job_workers_parse(w, &p->workers) < 0)
        return shm_fail(STASH_ECORRUPT, "%s: not a part: '%.80s'", what, line);
    memcpy(p->host, host, strlen(host) + 1); /* checked: at most CKPT_JOB_HOST_MAX */
    return 0;
}

int ckpt_job_part_read(ckpt_rados *r, const char *name, ckpt_job_part *p)
{
    char text[700], what[1300];
    snprintf(what, sizeof what, "rados://%.128s/%.1023s", ckpt_rados_pool(r), name);
    int rc = ckpt_rados_pointer(r, name, text, sizeof text);
    if (rc) return rc;
    char *nl = strchr(text, '\n');
    if (!nl || nl[1]) return shm_fail(STASH_ECORRUPT, "%s: not one line: '%.80s'", what, text);
    *nl = 0;
    return parse_part(text, p, what);
}

/* Reads the record (or note) object name into rec (appending its parts). */
static int read_parts(ckpt_rados *r, const char *name, ckpt_job_record *rec)
{
    char *text = malloc(RECORD_MAX), what[1300];
    if (!text) return shm_fail(-ENOMEM, "out of memory");
    snprintf(what, sizeof what, "rados://%s/%s", ckpt_rados_pool(r), name);
    int rc = ckpt_rados_pointer(r, name, text, RECORD_MAX);
    for (char *line = text, *nl; rc == 0 && *line; line = nl + 1) {
        if (!(nl = strchr(line, '\n'))) {
            rc = shm_fail(STASH_ECORRUPT, "%s: a line without its end", what);
            break;
        }
        *nl = 0;
        if (rec->n == CKPT_JOB_HOSTS)
            rc = shm_fail(STASH_ECORRUPT, "%s: more than %u parts", what, CKPT_JOB_HOSTS);
        else
            rc = parse_part(line, &rec->parts[rec->n++], what);
    }
    free(text);
    return rc;
}

static void job_name(char *out, size_t cap, const char *job, uint64_t id, const char *suffix)
{
    snprintf(out, cap, "%s/job-%" PRIu64 "%s", job, id, suffix);
}

/* ---- ids, notes, commit ------------------------------------------------------- */

int ckpt_job_next_id(ckpt_rados *r, const char *job, uint64_t *id)
{
    char name[1024], was[32], now[32];
    uint64_t latest = 0;
    int rc = ckpt_job_object(name, sizeof name, job, "ids");
    if (rc) return rc;
    for (int tries = 0; tries < 16; tries++) {
        rc = ckpt_rados_pointer(r, name, was, sizeof was);
        if (rc && rc != -ENOENT) return rc;
        uint64_t n = rc == 0 ? strtoull(was, NULL, 10) : 0;
        if (ckpt_rados_latest(r, job, &latest) == 0 && latest > n) n = latest;
        snprintf(now, sizeof now, "%" PRIu64, n + 1);
        rc = ckpt_rados_swap(r, name, rc == 0 ? was : NULL, now);
        if (rc == 0) {
            *id = n + 1;
            return 0;
        }
        if (rc != -ECANCELED) return rc;
    }
    return shm_fail(-EBUSY, "rados://%s/%s: taken by others 16 times in a row", ckpt_rados_pool(r),
                    name);
}

int ckpt_job_note(ckpt_rados *r, const char *job, uint64_t id, const ckpt_job_part *part)
{
    char name[1024], suffix[96], line[700];
    snprintf(suffix, sizeof suffix, ".part.%s", part->host);
    job_name(name, sizeof name, job, id, suffix);
    ckpt_job_part_format(part, line, sizeof line);
    return ckpt_rados_swap(r, name, NULL, line);
}

typedef struct notes {
    ckpt_rados *r;
    ckpt_job_record *rec;
} notes;

static int take_note(void *ctx, const char *name)
{
    notes *n = ctx;
    return read_parts(n->r, name, n->rec);
}

int ckpt_job_notes(ckpt_rados *r, const char *job, uint64_t id, ckpt_job_record *rec)
{
    char prefix[1024];
    memset(rec, 0, sizeof *rec);
    rec->id = id;
    job_name(prefix, sizeof prefix, job, id, ".part.");
    return ckpt_rados_list(r, prefix, take_note, &(notes){r, rec});
}

int ckpt_job_covered(const ckpt_job_record *rec)
{
    if (rec->n == 0) return shm_fail(-EAGAIN, "no part is in yet");
    uint32_t p = rec->parts[0].parallelism, maxp = rec->parts[0].max_parallelism;
    for (size_t i = 0; i < rec->n; i++)
        if (rec->parts[i].parallelism != p || rec->parts[i].max_parallelism != maxp)
            return shm_fail(-EINVAL,
                            "host %s serves workers of %u (of %u key groups), host %s of %u "
                            "(of %u)",
                            rec->parts[i].host, rec->parts[i].parallelism,
                            rec->parts[i].max_parallelism, rec->parts[0].host, p, maxp);
    for (uint32_t w = 0; w < p; w++) {
        const char *by = NULL;
        for (size_t i = 0; i < rec->n; i++) {
            if (!ckpt_job_workers_has(&rec->parts[i].workers, w)) continue;
            if (by)
                return shm_fail(-EINVAL, "worker %u is served by both %s and %s", w, by,
                                rec->parts[i].host);
            by = rec->parts[i].host;
        }
        if (!by) return shm_fail(-EAGAIN, "no part of worker %u of %u is in", w, p);
    }
    for (size_t i = 0; i < rec->n; i++)
        for (uint32_t k = 0; k < rec->parts[i].workers.n; k++)
            if (rec->parts[i].workers.r[k].last >= p)
                return shm_fail(-EINVAL, "host %s serves worker %u of %u", rec->parts[i].host,
                                rec->parts[i].workers.r[k].last, p);
    return 0;
}

int ckpt_job_commit(ckpt_rados *r, const char *job, const ckpt_job_record *rec, uint64_t prev)
{
    char name[1024], was[32], now[32];
    char *text = malloc(RECORD_MAX);
    if (!text) return shm_fail(-ENOMEM, "out of memory");
    size_t len = 0;
    for (size_t i = 0; i < rec->n && len < RECORD_MAX; i++) {
        ckpt_job_part_format(&rec->parts[i], text + len, RECORD_MAX - len);
        len += strlen(text + len);
    }
    job_name(name, sizeof name, job, rec->id, "");
    int rc = len < RECORD_MAX - 1 ? ckpt_rados_swap(r, name, NULL, text)
                                  : shm_fail(-E2BIG, "%s: a record too long", name);
    free(text);
    snprintf(was, sizeof was, "%" PRIu64, prev);
    snprintf(now, sizeof now, "%" PRIu64, rec->id);
    if (rc == 0) rc = ckpt_job_object(name, sizeof name, job, "latest");
    if (rc == 0) rc = ckpt_rados_swap(r, name, prev ? was : NULL, now);
    return rc;
}

int ckpt_job_abort(ckpt_rados *r, const char *job, uint64_t id)
{
    char name[1024];
    job_name(name, sizeof name, job, id, ".aborted");
    int rc = ckpt_rados_swap(r, name, NULL, "aborted");
    return rc == -ECANCELED ? 0 : rc; /* aborted already */
}

int ckpt_job_verdict(ckpt_rados *r, const char *job, uint64_t id)
{
    char name[1024], buf[64];
    uint64_t latest = 0;
    int rc = ckpt_rados_latest(r, job, &latest);
    if (rc && rc != -ENOENT) return rc;
    job_name(name, sizeof name, job, id, "");
    if (latest >= id) {
        rc = ckpt_rados_pointer(r, name, buf, sizeof buf);
        if (rc == 0 || rc == -ERANGE) return 1;
        if (rc != -ENOENT) return rc;
        return shm_fail(-ECANCELED, "job checkpoint %" PRIu64 " was passed over", id);
    }
    job_name(name, sizeof name, job, id, ".aborted");
    rc = ckpt_rados_pointer(r, name, buf, sizeof buf);
    if (rc == 0) return shm_fail(-ECANCELED, "the leader aborted job checkpoint %" PRIu64, id);
    return rc == -ENOENT ? 0 : rc;
}

int ckpt_job_record_read(ckpt_rados *r, const char *job, uint64_t id, ckpt_job_record *rec)
{
    char name[1024];
    memset(rec, 0, sizeof *rec);
    rec->id = id;
    job_name(name, sizeof name, job, id, "");
    return read_parts(r, name, rec);
}

int ckpt_job_latest(ckpt_rados *r, const char *job, uint64_t *id, ckpt_job_record *rec)
{
    int rc = ckpt_rados_latest(r, job, id);
    if (rc || !rec) return rc;
    rc = ckpt_job_record_read(r, job, *id, rec);
    if (rc == -ENOENT)
        return shm_fail(STASH_ECORRUPT,
                        "rados://%s/%s/job-%" PRIu64 ": JOB/latest names a checkpoint without "
                        "its record",
                        ckpt_rados_pool(r), job, *id);
    return rc;
}

typedef struct records {
    const char *job;
    uint64_t *ids;
    size_t n, cap;
} records;

static int take_record(void *ctx, const char *name)
{
    records *c = ctx;
    char *end;
    uint64_t id = strtoull(name + strlen(c->job) + strlen("/job-"), &end, 10);
    if (!id || *end) return 0; /* a note or an abort */
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        uint64_t *ids = realloc(c->ids, cap * sizeof *ids);
        if (!ids) return shm_fail(-ENOMEM, "out of memory");
        c->ids = ids;
        c->cap = cap;
    }
    c->ids[c->n++] = id;
    return 0;
}

static int newest_first(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int ckpt_job_records(ckpt_rados *r, const char *job, uint64_t **ids, size_t *n)
{
    char prefix[1024];
    snprintf(prefix, sizeof prefix, "%s/job-", job);
    records c = {job, NULL, 0, 0};
    int rc = ckpt_rados_list(r, prefix, take_record, &c);
    if (rc) {
        free(c.ids);
        return rc;
    }
    if (c.n) qsort(c.ids, c.n, sizeof *c.ids, newest_first);
    *ids = c.ids;
    *n = c.n;
    return 0;
}

/* ---- retention ------------------------------------------------------------------ */

typedef struct sweep {
    const char *job;
    uint64_t latest;
    const ckpt_job_record *kept;
    size_t nkept;
    char **gone; /* metadata objects first, then the rest */
    size_t n, cap;
    int rc;
} sweep;

static bool kept_id(const sweep *s, uint64_t id)
{
    for (size_t i = 0; i < s->nkept; i++)
        if (s->kept[i].id == id) return true;
    return false;
}

static bool kept_part(const sweep *s, const char *host, size_t hlen, uint64_t id)
{
    for (size_t i = 0; i < s->nkept; i++)
        for (size_t k = 0; s->kept[i].id == id && k < s->kept[i].n; k++)
            if (strlen(s->kept[i].parts[k].host) == hlen &&
                memcmp(s->kept[i].parts[k].host, host, hlen) == 0)
                return true;
    return false;
}

static int add_gone(sweep *s, const char *name)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        char **g = realloc(s->gone, cap * sizeof *g);
        if (!g) return shm_fail(-ENOMEM, "out of memory");
        s->gone = g;
        s->cap = cap;
    }
    if (!(s->gone[s->n] = strdup(name))) return shm_fail(-ENOMEM, "out of memory");
    s->n++;
    return 0;
}

/* Collects what retention removes: records and their notes and aborts
 * below latest that are not kept, and parts below latest no kept record
 * names. */
static int take_gone(void *ctx, const char *name)
{
    sweep *s = ctx;
    const char *rest = name + strlen(s->job) + 1;
    char *end;
    if (strncmp(rest, "job-", 4) == 0) {
        uint64_t id = strtoull(rest + 4, &end, 10);
        if (id && id <= s->latest && !kept_id(s, id)) return add_gone(s, name);
        return 0;
    }
    if (strncmp(rest, "part/", 5) != 0) return 0;
    const char *host = rest + 5, *slash = strchr(host, '/');
    if (!slash || strncmp(slash, "/chk-", 5) != 0) return 0;
    uint64_t id = strtoull(slash + 5, &end, 10);
    if (!id || *end != '/' || id > s->latest || kept_part(s, host, (size_t)(slash - host), id))
        return 0;
    return add_gone(s, name);
}

int ckpt_job_retain(ckpt_rados *r, const char *job, unsigned keep)
{
    uint64_t latest;
    int rc = ckpt_rados_latest(r, job, &latest);
    if (rc == -ENOENT) return 0;
    if (rc) return rc;
    ckpt_job_record *kept = calloc(keep ? keep : 1, sizeof *kept);
    if (!kept) return shm_fail(-ENOMEM, "out of memory");
    size_t nkept = 0;
    /* The newest keep committed ones: records at or below latest. */
    uint64_t *ids = NULL;
    size_t n = 0;
    rc = ckpt_job_records(r, job, &ids, &n);
    for (size_t i = 0; rc == 0 && i < n && nkept < keep; i++) {
        if (ids[i] > latest) continue;
        rc = ckpt_job_record_read(r, job, ids[i], &kept[nkept]);
        if (rc == 0) nkept++;
        if (rc == -ENOENT) rc = 0; /* removed meanwhile */
    }
    free(ids);
    char prefix[1024];
    snprintf(prefix, sizeof prefix, "%s/", job);
    sweep s = {job, latest, kept, nkept, NULL, 0, 0, 0};
    if (rc == 0) rc = ckpt_rados_list(r, prefix, take_gone, &s);
    /* Each part's metadata first: a part half removed is one no longer. */
    for (size_t i = 0; rc == 0 && i < s.n; i++)
        if (strstr(s.gone[i], "/_metadata.")) rc = ckpt_rados_remove(r, s.gone[i]);
    for (size_t i = 0; rc == 0 && i < s.n; i++)
        if (!strstr(s.gone[i], "/_metadata.")) rc = ckpt_rados_remove(r, s.gone[i]);
    for (size_t i = 0; i < s.n; i++) free(s.gone[i]);
    free(s.gone);
    free(kept);
    return rc;
}

/* ---- restore -------------------------------------------------------------------- */

/* The key groups of workers first..last of p (of maxp key groups). */
static stash_kg_range span(uint32_t maxp, uint32_t p, uint32_t first, uint32_t last)
{
    stash_kg_range a, b;
    stash_kg_range_of(maxp, p, first, &a);
    stash_kg_range_of(maxp, p, last, &b);
    return (stash_kg_range){a.first, b.last};
}

/* Gathers the operator state of part's workers from what its restore
 * handed out into *out (op_parallelism p, each blob copied). */
static int gather_opstate(const ckpt_job_part *part, const ckpt_restored *got, ckpt_restored *out)
{
    uint32_t p = part->parallelism;
    if (got->op_parallelism && got->op_parallelism != p)
        return shm_fail(STASH_ECORRUPT, "host %s's part holds operator state of %u workers, not %u",
                        part->host, got->op_parallelism, p);
    if (!out->op_blobs) {
        out->op_blobs = calloc(p, sizeof *out->op_blobs);
        if (!out->op_blobs) return shm_fail(-ENOMEM, "out of memory");
        out->op_parallelism = p;
    }
    for (uint32_t i = 0; i < got->op_parallelism; i++) {
        if (!ckpt_job_workers_has(&part->workers, i) || !got->op_blobs[i].len) continue;
        uint8_t *copy = malloc(got->op_blobs[i].len);
        if (!copy) return shm_fail(-ENOMEM, "out of memory");
        memcpy(copy, got->op_blobs[i].data, got->op_blobs[i].len);
        out->op_blobs[i] = (ckpt_blob){copy, got->op_blobs[i].len};
    }
    return 0;
}

/* Moves the gathered blobs into one allocation, as ckpt_restored_free()
 * frees them. */
static int pack_opstate(ckpt_restored *out)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < out->op_parallelism; i++) total += out->op_blobs[i].len;
    uint8_t *mem = malloc(total ? total : 1), *p = mem;
    if (!mem) return shm_fail(-ENOMEM, "out of memory");
    for (uint32_t i = 0; i < out->op_parallelism; i++) {
        uint8_t *was = (uint8_t *)out->op_blobs[i].data;
        if (was) memcpy(p, was, out->op_blobs[i].len);
        free(was);
        out->op_blobs[i].data = p;
        p += out->op_blobs[i].len;
    }
    out->op_mem = mem;
    return 0;
}

static void drop_gathered(ckpt_restored *out)
{
    for (uint32_t i = 0; !out->op_mem && out->op_blobs && i < out->op_parallelism; i++)
        free((void *)out->op_blobs[i].data);
    ckpt_restored_free(out);
}

/* Restores what part holds of the key groups of workers (of p). */
static int restore_part(stash_arena *a, ckpt_rados *r, const char *job, uint64_t id,
                        const ckpt_job_part *part, const shm_dir *dir, uint32_t p,
                        const ckpt_job_workers *workers, ioe_engine *e, store *st,
                        ckpt_restored *out)
{
    char sub[1024], chk[64], path[4096] = "";
    uint32_t maxp = a->hdr->max_parallelism;
    if (part->max_parallelism != maxp)
        return shm_fail(STASH_ECORRUPT, "host %s's part is of %u key groups, the arena of %u",
                        part->host, part->max_parallelism, maxp);
    snprintf(chk, sizeof chk, "chk-%" PRIu64, id);
    shm_dir parts = {.fd = -1}, local = {.fd = -1};
    int rc = ckpt_job_part_prefix(sub, sizeof sub, job, part->host);
    if (rc == 0) rc = shm_dir_openat(dir, "parts", SHM_DIR_OWN | SHM_DIR_CREATE, &parts);
    if (rc == 0) rc = shm_dir_openat(&parts, part->host, SHM_DIR_OWN | SHM_DIR_CREATE, &local);
    if (rc == 0) rc = ckpt_rados_fetch(r, sub, &local, chk);
    if (rc == 0) rc = ckpt_path_of(path, "%s/%s", local.path, chk);
    bool gathered = false;
    for (uint32_t i = 0; rc == 0 && i < part->workers.n; i++)
        for (uint32_t k = 0; rc == 0 && k < workers->n; k++) {
            stash_kg_range have = span(maxp, part->parallelism, part->workers.r[i].first,
                                       part->workers.r[i].last),
                           want = span(maxp, p, workers->r[k].first, workers->r[k].last);
            stash_kg_range both = {have.first > want.first ? have.first : want.first,
                                   have.last < want.last ? have.last : want.last};
            if (both.first > both.last) continue;
            ckpt_restored got = {0};
            rc = ckpt_restore_path(a, path, both, e, st, &got);
            if (rc == 0) out->records += got.records;
            if (rc == 0 && !gathered) rc = gather_opstate(part, &got, out);
            gathered = true;
            ckpt_restored_free(&got);
        }
    if (rc == 0 && !gathered) {
        /* None of its key groups: its operator state still counts. */
        ckpt_restored got = {0};
        rc = ckpt_restore_opstate(a, path, e, &got);
        if (rc == 0) rc = gather_opstate(part, &got, out);
        ckpt_restored_free(&got);
    }
    /* The pool keeps it: the local copy served this restore only. */
    if (path[0]) ckpt_remove_checkpoint(&local, chk);
    shm_dir_close(&local);
    shm_dir_close(&parts);
    return rc;
}

int ckpt_job_restore(stash_arena *a, ckpt_rados *r, const char *job, const ckpt_job_record *rec,
                     const shm_dir *dir, uint32_t parallelism, const ckpt_job_workers *workers,
                     ioe_engine *e, store *st, ckpt_restored *out)
{
    memset(out, 0, sizeof *out);
    out->id = rec->id;
    int rc = ckpt_job_covered(rec);
    if (rc == -EAGAIN) rc = STASH_ECORRUPT;
    for (size_t i = 0; rc == 0 && i < rec->n; i++)
        rc =
            restore_part(a, r, job, rec->id, &rec->parts[i], dir, parallelism, workers, e, st, out);
    if (rc == 0) rc = pack_opstate(out);
    if (rc) drop_gathered(out);
    return rc;
}
