/* SPDX-License-Identifier: MIT */
/*
 * rados_job.c: the objects of a job that spans hosts (rados_job.h).
 *   JOB/latest        the job's state: attributes stash.ptr (the committed
 *                     checkpoint), stash.leader (the leader's epoch),
 *                     stash.done.ID and stash.abort.ID (the one decision on
 *                     ID), stash.floor (decisions below it are forgotten)
 *   JOB/job-ID        the record of checkpoint ID: a line "HOST P MAXP
 *                     WORKERS EPOCH" per part, written before its commit
 *   JOB/hosts/HOST    a member: its lease, its line (stash.ptr), the epoch
 *                     of the service serving it (stash.epoch) and its last
 *                     note (stash.note, "ID LINE")
 *   JOB/ids, JOB/epochs   counters moved by compare-and-swap
 * Every change to the state or a member compares what its writer's claim
 * rests on in the same operation, so a writer that lost it changes nothing.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

int ckpt_job_part_prefix(char *out, size_t cap, const char *job, const char *host, uint64_t epoch)
{
    int n = epoch ? snprintf(out, cap, "%s/part/%s/%" PRIu64, job, host, epoch)
                  : snprintf(out, cap, "%s/part/%s", job, host);
    return n > 0 && (size_t)n < cap ? 0
                                    : shm_fail(-ENAMETOOLONG, "%s/part/%s: too long", job, host);
}

/* ---- text of notes and records ------------------------------------------------ */

void ckpt_job_part_name(const ckpt_job_record *rec, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s-%" PRIu64, rec->savepoint ? "savepoint" : "chk", rec->id);
}

void ckpt_job_part_format(const ckpt_job_part *p, char *buf, size_t cap)
{
    char w[512];
    ckpt_job_workers_format(&p->workers, w, sizeof w);
    snprintf(buf, cap, "%s %u %u %s %" PRIu64 "\n", p->host, p->parallelism, p->max_parallelism, w,
             p->epoch);
}

static int parse_part(const char *line, ckpt_job_part *p, const char *what)
{
    char host[CKPT_JOB_HOST_MAX + 2], w[512];
    memset(p, 0, sizeof *p);
    /* Parts before epochs have four fields: epoch 0, their objects under JOB/part/HOST. */
    int n = sscanf(line, "%64s %u %u %511s %" SCNu64, host, &p->parallelism, &p->max_parallelism, w,
                   &p->epoch);
    if ((n != 4 && n != 5) || !ckpt_job_host_ok(host) || p->parallelism == 0 ||
        p->max_parallelism == 0 || ckpt_job_workers_parse(w, &p->workers) < 0)
        return shm_fail(STASH_ECORRUPT, "%s: not a part: '%.80s'", what, line);
    memcpy(p->host, host, strlen(host) + 1); /* checked: at most CKPT_JOB_HOST_MAX */
    return 0;
}

#define SAVEPOINT_LINE "savepoint" /* a record's first line: the job's savepoint */

/* A record's text: its parts' lines, after SAVEPOINT_LINE for a savepoint.
 * Returns its length, or -E2BIG. */
static int record_format(const ckpt_job_record *rec, char *text, size_t cap)
{
    size_t len = (size_t)snprintf(text, cap, "%s", rec->savepoint ? SAVEPOINT_LINE "\n" : "");
    for (size_t i = 0; i < rec->n && len < cap; i++) {
        ckpt_job_part_format(&rec->parts[i], text + len, cap - len);
        len += strlen(text + len);
    }
    return len < cap - 1 ? (int)len : shm_fail(-E2BIG, "a record of %zu parts: too long", rec->n);
}

/* Parses a record's text (changed in place) into rec; what names it. */
static int record_parse(char *text, ckpt_job_record *rec, const char *what)
{
    int rc = 0;
    for (char *line = text, *nl; rc == 0 && *line; line = nl + 1) {
        if (!(nl = strchr(line, '\n')))
            return shm_fail(STASH_ECORRUPT, "%s: a line without its end", what);
        *nl = 0;
        if (line == text && strcmp(line, SAVEPOINT_LINE) == 0)
            rec->savepoint = true;
        else if (rec->n == CKPT_JOB_HOSTS)
            rc = shm_fail(STASH_ECORRUPT, "%s: more than %u parts", what, CKPT_JOB_HOSTS);
        else
            rc = parse_part(line, &rec->parts[rec->n++], what);
    }
    return rc;
}

/* Reads the record object name into rec. */
static int read_parts(ckpt_storage *r, const char *name, ckpt_job_record *rec)
{
    char *text = malloc(RECORD_MAX), what[1300];
    if (!text) return shm_fail(-ENOMEM, "out of memory");
    snprintf(what, sizeof what, "%s/%s", ckpt_storage_where(r), name);
    int rc = ckpt_storage_pointer(r, name, text, RECORD_MAX);
    if (rc == 0) rc = record_parse(text, rec, what);
    free(text);
    return rc;
}

static void job_name(char *out, size_t cap, const char *job, uint64_t id)
{
    snprintf(out, cap, "%s/job-%" PRIu64, job, id);
}

/* ---- counters ------------------------------------------------------------------- */

/* Moves the counter JOB/what up by one (at least past floor): *n. */
static int count_up(ckpt_storage *r, const char *job, const char *what, uint64_t floor, uint64_t *n)
{
    char name[1024], was[32], now[32];
    int rc = ckpt_job_object(name, sizeof name, job, what);
    if (rc) return rc;
    for (int tries = 0; tries < 16; tries++) {
        rc = ckpt_storage_pointer(r, name, was, sizeof was);
        if (rc && rc != -ENOENT) return rc;
        uint64_t v = rc == 0 ? strtoull(was, NULL, 10) : 0;
        if (floor > v) v = floor;
        snprintf(now, sizeof now, "%" PRIu64, v + 1);
        rc = ckpt_storage_swap(r, name, rc == 0 ? was : NULL, now);
        if (rc == 0) {
            *n = v + 1;
            return 0;
        }
        if (rc != -ECANCELED) return rc;
    }
    return shm_fail(-EBUSY, "%s/%s: taken by others 16 times in a row", ckpt_storage_where(r),
                    name);
}

int ckpt_job_next_id(ckpt_storage *r, const char *job, uint64_t *id)
{
    uint64_t latest = 0;
    int rc = ckpt_storage_latest(r, job, &latest);
    if (rc && rc != -ENOENT) return rc;
    return count_up(r, job, "ids", latest, id);
}

int ckpt_job_ids_above(ckpt_storage *r, const char *job, uint64_t floor)
{
    uint64_t id;
    return count_up(r, job, "ids", floor, &id);
}

int ckpt_job_started_from(ckpt_storage *r, const char *job, const char *source)
{
    char name[1024], had[1024];
    int rc = ckpt_job_object(name, sizeof name, job, "started-from");
    if (rc == 0) rc = ckpt_storage_swap(r, name, NULL, source);
    if (rc != -ECANCELED) return rc;
    if ((rc = ckpt_storage_pointer(r, name, had, sizeof had)) != 0) return rc;
    if (strcmp(had, source) == 0) return 0;
    return shm_fail(-EEXIST, "job %s was first started from %s, not %s", job, had, source);
}

int ckpt_job_origin(ckpt_storage *r, const char *job, char *buf, size_t cap)
{
    char name[1024];
    int rc = ckpt_job_object(name, sizeof name, job, "started-from");
    return rc ? rc : ckpt_storage_pointer(r, name, buf, cap);
}

int ckpt_job_source_parse(const char *where, const char *source, char *job, size_t cap,
                          uint64_t *id)
{
    const ckpt_storage_ops *ops;
    char in[128], name[256], *end = NULL;
    int rc = ckpt_url_parse(source, &ops, in, sizeof in, job, cap, name, sizeof name);
    if (rc) return rc;
    size_t slen = strlen(ops->scheme);
    if (strncmp(where, ops->scheme, slen) != 0 || strncmp(where + slen, "://", 3) != 0 ||
        strcmp(where + slen + 3, in) != 0)
        return shm_fail(-EINVAL, "%s: a job's hosts restore from a job of their own storage (%s)",
                        source, where);
    *id = strncmp(name, "job-", 4) == 0 ? strtoull(name + 4, &end, 10) : 0;
    if (!*id || *end)
        return shm_fail(-EINVAL, "%s: not a job checkpoint (%s/JOB/job-ID)", source, where);
    return 0;
}

int ckpt_job_committed(ckpt_storage *r, const char *job, uint64_t id)
{
    uint64_t *ids;
    size_t n;
    int rc = ckpt_job_records(r, job, &ids, &n);
    if (rc) return rc;
    bool found = false;
    for (size_t i = 0; i < n; i++) found = found || ids[i] == id;
    free(ids);
    return found ? 0
                 : shm_fail(-ENOENT, "%s/%s/job-%" PRIu64 ": no committed job checkpoint",
                            ckpt_storage_where(r), job, id);
}

int ckpt_job_source(ckpt_storage *r, const char *job, char *from, size_t cap, ckpt_job_record *rec)
{
    uint64_t id;
    snprintf(from, cap, "%s", job);
    int rc = ckpt_job_latest(r, job, &id, rec);
    if (rc != -ENOENT) return rc;
    char source[1024];
    if ((rc = ckpt_job_origin(r, job, source, sizeof source)) != 0) return rc;
    if ((rc = ckpt_job_source_parse(ckpt_storage_where(r), source, from, cap, &id)) != 0) return rc;
    rc = ckpt_job_record_read(r, from, id, rec);
    return rc == -ENOENT
               ? shm_fail(-ENOENT, "%s: job %s was started from it, and its record is gone", source,
                          job)
               : rc;
}

/* ---- members ---------------------------------------------------------------------- */

#define EPOCH_ATTR "stash.epoch"
#define NOTE_ATTR "stash.note"
#define TAKEN "taken " /* an epoch's text while HOST takes the member's workers over */

static int member_name(char *out, size_t cap, const char *job, const char *host)
{
    char what[CKPT_JOB_HOST_MAX + 8];
    snprintf(what, sizeof what, "hosts/%s", host);
    return ckpt_job_object(out, cap, job, what);
}

typedef struct member_read {
    ckpt_job_member *m;
    const char *what;
    bool line;
    int rc;
} member_read;

static int take_attr(void *ctx, const char *attr, const char *value)
{
    member_read *mr = ctx;
    ckpt_job_member *m = mr->m;
    char line[CKPT_STORAGE_ATTR_MAX + 1];
    snprintf(line, sizeof line, "%s", value);
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    if (strcmp(attr, CKPT_STORAGE_VALUE) == 0) {
        mr->line = true;
        return parse_part(line, &m->m, mr->what);
    }
    if (strcmp(attr, EPOCH_ATTR) == 0) {
        snprintf(m->epoch, sizeof m->epoch, "%.95s", line);
        return 0;
    }
    if (strcmp(attr, NOTE_ATTR) == 0) {
        char *end;
        m->note_id = strtoull(line, &end, 10);
        if (end == line || *end != ' ')
            return shm_fail(STASH_ECORRUPT, "%s: a note '%.80s'", mr->what, line);
        return parse_part(end + 1, &m->note, mr->what);
    }
    return 0;
}

int ckpt_job_member_read(ckpt_storage *r, const char *name, ckpt_job_member *m)
{
    char what[1300];
    snprintf(what, sizeof what, "%s/%s", ckpt_storage_where(r), name);
    memset(m, 0, sizeof *m);
    member_read mr = {m, what, false, 0};
    int rc = ckpt_storage_attrs(r, name, take_attr, &mr);
    if (rc == 0 && !mr.line) rc = shm_fail(-ENOENT, "%s: no member (only its lease)", what);
    return rc;
}

uint64_t ckpt_job_member_epoch(const ckpt_job_member *m)
{
    char *end;
    uint64_t e = strtoull(m->epoch, &end, 10);
    return end != m->epoch && *end == 0 ? e : 0;
}

int ckpt_job_join(ckpt_storage *r, const char *job, ckpt_job_part *self, const char *cookie,
                  uint32_t lease_ms)
{
    char name[1024], line[700], epoch[32];
    int rc = member_name(name, sizeof name, job, self->host);
    if (rc) return rc;
    rc = ckpt_storage_lock(r, name, cookie, lease_ms);
    if (rc == -EBUSY)
        return shm_fail(-EBUSY,
                        "job %s: host %s is served by another service (its lease lasts up to %u "
                        "ms)",
                        job, self->host, lease_ms);
    if (rc) return rc;
    /* The epoch the member had: a service that still thinks it serves the
     * host compares it in every write, and fails from the next one on. */
    ckpt_job_member was;
    rc = ckpt_job_member_read(r, name, &was);
    if (rc && rc != -ENOENT) return rc;
    if (strncmp(was.epoch, TAKEN, strlen(TAKEN)) == 0)
        return shm_fail(-EBUSY,
                        "job %s: host %s's workers are being %s over: start it again once done",
                        job, self->host, was.epoch);
    if ((rc = count_up(r, job, "epochs", 0, &self->epoch)) != 0) return rc;
    ckpt_job_part_format(self, line, sizeof line);
    snprintf(epoch, sizeof epoch, "%" PRIu64, self->epoch);
    ckpt_storage_attr expect = {EPOCH_ATTR, was.epoch[0] ? was.epoch : NULL};
    ckpt_storage_attr set[] = {{CKPT_STORAGE_VALUE, line}, {EPOCH_ATTR, epoch}, {NOTE_ATTR, NULL}};
    rc = ckpt_storage_update(r, name, &expect, 1, set, 3);
    if (rc == -ECANCELED)
        return shm_fail(-EBUSY, "job %s: host %s changed hands while it joined: start it again",
                        job, self->host);
    return rc;
}

static int fenced(ckpt_storage *r, const char *name, const ckpt_job_part *self)
{
    ckpt_job_member now;
    int rc = ckpt_job_member_read(r, name, &now);
    char why[128] = "its member is gone";
    if (rc == 0) snprintf(why, sizeof why, "its member's epoch is %s now", now.epoch);
    return shm_fail(STASH_EFENCED, "job: host %s's service of epoch %" PRIu64 " is fenced off: %s",
                    self->host, self->epoch, why);
}

int ckpt_job_member_set(ckpt_storage *r, const char *job, const ckpt_job_part *self)
{
    char name[1024], line[700], epoch[32];
    int rc = member_name(name, sizeof name, job, self->host);
    if (rc) return rc;
    ckpt_job_part_format(self, line, sizeof line);
    snprintf(epoch, sizeof epoch, "%" PRIu64, self->epoch);
    ckpt_storage_attr expect = {EPOCH_ATTR, epoch}, set = {CKPT_STORAGE_VALUE, line};
    rc = ckpt_storage_update(r, name, &expect, 1, &set, 1);
    return rc == -ECANCELED ? fenced(r, name, self) : rc;
}

int ckpt_job_note(ckpt_storage *r, const char *job, uint64_t id, const ckpt_job_part *part)
{
    char name[1024], line[700], note[760], epoch[32];
    int rc = member_name(name, sizeof name, job, part->host);
    if (rc) return rc;
    ckpt_job_part_format(part, line, sizeof line);
    snprintf(note, sizeof note, "%" PRIu64 " %s", id, line);
    snprintf(epoch, sizeof epoch, "%" PRIu64, part->epoch);
    ckpt_storage_attr expect = {EPOCH_ATTR, epoch}, set = {NOTE_ATTR, note};
    rc = ckpt_storage_update(r, name, &expect, 1, &set, 1);
    return rc == -ECANCELED ? fenced(r, name, part) : rc;
}

int ckpt_job_claim(ckpt_storage *r, const char *job, const char *lost, const char *seen,
                   const char *taker)
{
    char name[1024], epoch[CKPT_JOB_HOST_MAX + 16];
    int rc = member_name(name, sizeof name, job, lost);
    if (rc) return rc;
    snprintf(epoch, sizeof epoch, TAKEN "by %s", taker);
    ckpt_storage_attr expect = {EPOCH_ATTR, seen[0] ? seen : NULL}, set = {EPOCH_ATTR, epoch};
    return ckpt_storage_update(r, name, &expect, 1, &set, 1);
}

int ckpt_job_unclaim(ckpt_storage *r, const char *job, const char *lost, const char *taker)
{
    char name[1024], epoch[CKPT_JOB_HOST_MAX + 16];
    int rc = member_name(name, sizeof name, job, lost);
    if (rc) return rc;
    snprintf(epoch, sizeof epoch, TAKEN "by %s", taker);
    ckpt_storage_attr expect = {EPOCH_ATTR, epoch}, set = {EPOCH_ATTR, "lost"};
    rc = ckpt_storage_update(r, name, &expect, 1, &set, 1);
    return rc == -ECANCELED ? 0 : rc; /* claimed by no one any more */
}

bool ckpt_job_member_taken(const ckpt_job_member *m)
{
    return strncmp(m->epoch, TAKEN, strlen(TAKEN)) == 0;
}

const char *ckpt_job_member_taker(const ckpt_job_member *m)
{
    return ckpt_job_member_taken(m) && strncmp(m->epoch, TAKEN "by ", strlen(TAKEN "by ")) == 0
               ? m->epoch + strlen(TAKEN "by ")
               : "";
}

typedef struct notes {
    ckpt_storage *r;
    const char *prefix;
    uint64_t id;
    ckpt_job_record *rec;
} notes;

static int take_note(void *ctx, const char *name)
{
    notes *n = ctx;
    if (!ckpt_job_host_ok(name + strlen(n->prefix))) return 0;
    ckpt_job_member m;
    int rc = ckpt_job_member_read(n->r, name, &m);
    if (rc == -ENOENT) return 0; /* removed meanwhile, or only its lease is left */
    if (rc) return rc;
    /* Only the note of the service that serves the member now counts. */
    if (m.note_id != n->id || !m.note.epoch || m.note.epoch != ckpt_job_member_epoch(&m)) return 0;
    if (n->rec->n == CKPT_JOB_HOSTS)
        return shm_fail(STASH_ECORRUPT, "job: more than %u hosts noted a part", CKPT_JOB_HOSTS);
    n->rec->parts[n->rec->n++] = m.note;
    return 0;
}

int ckpt_job_notes(ckpt_storage *r, const char *job, uint64_t id, ckpt_job_record *rec)
{
    char prefix[1024];
    memset(rec, 0, sizeof *rec);
    rec->id = id;
    int rc = ckpt_job_object(prefix, sizeof prefix, job, "hosts/");
    if (rc) return rc;
    return ckpt_storage_objects(r, prefix, take_note, &(notes){r, prefix, id, rec});
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

/* ---- the state: leader, decisions, the committed checkpoint ------------------------ */

#define LEADER_ATTR "stash.leader"
#define FLOOR_ATTR "stash.floor"
#define DONE_ATTR "stash.done."
#define ABORT_ATTR "stash.abort."
#define SAVED_ATTR "stash.savepoint." /* a committed savepoint: never forgotten */

/* JOB/latest as read at once, with the decision on id. */
typedef struct job_state {
    char latest[32], leader[32], floor[32]; /* as read ("" absent), for compares */
    uint64_t latest_id, leader_epoch, floor_id;
    int outcome; /* of id: 1 committed, -1 aborted, 0 undecided */
    char why[256];
    uint64_t id;
    bool list;
    uint64_t *done; /* with a list: the committed ids still decided, and the savepoints */
    size_t ndone, cap;
    uint64_t *saved; /* with a list: the committed savepoints */
    size_t nsaved, scap;
    int rc;
} job_state;

/* Appends id to the list *v of *n (room for *cap). */
static int list_add(uint64_t **v, size_t *n, size_t *cap, uint64_t id)
{
    if (*n == *cap) {
        size_t more = *cap ? 2 * *cap : 16;
        uint64_t *d = realloc(*v, more * sizeof *d);
        if (!d) return shm_fail(-ENOMEM, "out of memory");
        *v = d;
        *cap = more;
    }
    (*v)[(*n)++] = id;
    return 0;
}

static int take_state(void *ctx, const char *attr, const char *value)
{
    job_state *st = ctx;
    char *end;
    if (strcmp(attr, CKPT_STORAGE_VALUE) == 0) {
        snprintf(st->latest, sizeof st->latest, "%s", value);
        st->latest_id = strtoull(value, NULL, 10);
    } else if (strcmp(attr, LEADER_ATTR) == 0) {
        snprintf(st->leader, sizeof st->leader, "%s", value);
        st->leader_epoch = strtoull(value, NULL, 10);
    } else if (strcmp(attr, FLOOR_ATTR) == 0) {
        snprintf(st->floor, sizeof st->floor, "%s", value);
        st->floor_id = strtoull(value, NULL, 10);
    } else if (strncmp(attr, DONE_ATTR, strlen(DONE_ATTR)) == 0) {
        uint64_t id = strtoull(attr + strlen(DONE_ATTR), &end, 10);
        if (id == st->id) st->outcome = 1;
        if (st->list) return list_add(&st->done, &st->ndone, &st->cap, id);
    } else if (strncmp(attr, SAVED_ATTR, strlen(SAVED_ATTR)) == 0) {
        uint64_t id = strtoull(attr + strlen(SAVED_ATTR), &end, 10);
        if (id == st->id && id) st->outcome = 1;
        if (st->list) return list_add(&st->saved, &st->nsaved, &st->scap, id);
    } else if (strncmp(attr, ABORT_ATTR, strlen(ABORT_ATTR)) == 0) {
        if (strtoull(attr + strlen(ABORT_ATTR), &end, 10) == st->id && st->id) {
            st->outcome = -1;
            snprintf(st->why, sizeof st->why, "%s", value);
        }
    }
    return 0;
}

/* Reads JOB/latest (empty if absent) with the decision on id (0: none) and,
 * with list, the committed ids decided and the savepoints (free st->done,
 * st->saved). */
static int job_state_read(ckpt_storage *r, const char *job, uint64_t id, bool list, job_state *st)
{
    char name[1024];
    memset(st, 0, sizeof *st);
    st->id = id;
    st->list = list;
    int rc = ckpt_job_object(name, sizeof name, job, "latest");
    if (rc == 0) rc = ckpt_storage_attrs(r, name, take_state, st);
    if (rc == -ENOENT) { /* no leader yet: nothing decided */
        shm_clear_error();
        rc = 0;
    }
    if (rc) {
        free(st->done);
        free(st->saved);
    }
    return rc;
}

static void attr_of(char *out, size_t cap, const char *prefix, uint64_t id)
{
    snprintf(out, cap, "%s%" PRIu64, prefix, id);
}

int ckpt_job_lead(ckpt_storage *r, const char *job, uint64_t *epoch)
{
    char name[1024], now[32];
    int rc = ckpt_job_object(name, sizeof name, job, "latest");
    if (rc == 0) rc = ckpt_storage_touch(r, name); /* compares need the object */
    for (int tries = 0; rc == 0 && tries < 16; tries++) {
        job_state st;
        if ((rc = job_state_read(r, job, 0, false, &st)) != 0) return rc;
        snprintf(now, sizeof now, "%" PRIu64, st.leader_epoch + 1);
        ckpt_storage_attr expect = {LEADER_ATTR, st.leader[0] ? st.leader : NULL},
                          set = {LEADER_ATTR, now};
        rc = ckpt_storage_update(r, name, &expect, 1, &set, 1);
        if (rc == 0) *epoch = st.leader_epoch + 1;
        if (rc != -ECANCELED) return rc;
        rc = 0;
    }
    return rc ? rc
              : shm_fail(-EBUSY, "%s/%s: the lead changed 16 times in a row", ckpt_storage_where(r),
                         name);
}

int ckpt_job_leader(ckpt_storage *r, const char *job, uint64_t *epoch)
{
    job_state st;
    int rc = job_state_read(r, job, 0, false, &st);
    if (rc == 0) *epoch = st.leader_epoch;
    return rc;
}

int ckpt_job_commit(ckpt_storage *r, const char *job, const ckpt_job_record *rec, uint64_t leader)
{
    char name[1024], latest[1024], done[64], abort_[64], saved[64], now[32], mine[32];
    job_state st;
    int rc = job_state_read(r, job, rec->id, false, &st);
    if (rc) return rc;
    if (st.outcome < 0)
        return shm_fail(-ECANCELED, "job checkpoint %" PRIu64 " was aborted: %s", rec->id, st.why);
    if (st.leader_epoch != leader)
        return shm_fail(-ECANCELED, "the lead passed on (epoch %" PRIu64 ", not %" PRIu64 ")",
                        st.leader_epoch, leader);
    if (st.latest_id >= rec->id)
        return shm_fail(-ECANCELED, "job checkpoint %" PRIu64 " was passed over by %" PRIu64,
                        rec->id, st.latest_id);
    /* The record first: it names the parts once the decision is made. */
    char *text = malloc(RECORD_MAX);
    if (!text) return shm_fail(-ENOMEM, "out of memory");
    job_name(name, sizeof name, job, rec->id);
    rc = record_format(rec, text, RECORD_MAX);
    if (rc >= 0) rc = ckpt_storage_set(r, name, text);
    free(text);
    if (rc == 0) rc = ckpt_job_object(latest, sizeof latest, job, "latest");
    if (rc) return rc;
    /* The decision: the leader's epoch, the committed id and no abort of
     * this one compared in the same operation that makes it. */
    attr_of(done, sizeof done, DONE_ATTR, rec->id);
    attr_of(abort_, sizeof abort_, ABORT_ATTR, rec->id);
    snprintf(now, sizeof now, "%" PRIu64, rec->id);
    snprintf(mine, sizeof mine, "%" PRIu64, leader);
    ckpt_storage_attr expect[] = {
        {LEADER_ATTR, mine}, {CKPT_STORAGE_VALUE, st.latest[0] ? st.latest : NULL}, {abort_, NULL}};
    attr_of(saved, sizeof saved, SAVED_ATTR, rec->id);
    ckpt_storage_attr set[] = {
        {done, "committed"}, {CKPT_STORAGE_VALUE, now}, {saved, "committed"}};
    rc = ckpt_storage_update(r, latest, expect, 3, set, rec->savepoint ? 3 : 2);
    if (rc != -ECANCELED) return rc;
    /* Why not, as the state says now. */
    if ((rc = job_state_read(r, job, rec->id, false, &st)) != 0) return rc;
    if (st.outcome < 0)
        return shm_fail(-ECANCELED, "job checkpoint %" PRIu64 " was aborted: %s", rec->id, st.why);
    if (st.leader_epoch != leader)
        return shm_fail(-ECANCELED, "the lead passed on (epoch %" PRIu64 ", not %" PRIu64 ")",
                        st.leader_epoch, leader);
    return shm_fail(-ECANCELED, "job checkpoint %" PRIu64 " was passed over by %" PRIu64, rec->id,
                    st.latest_id);
}

int ckpt_job_abort(ckpt_storage *r, const char *job, uint64_t id, const char *why)
{
    char latest[1024], done[64], abort_[64], text[200];
    int rc = ckpt_job_object(latest, sizeof latest, job, "latest");
    attr_of(done, sizeof done, DONE_ATTR, id);
    attr_of(abort_, sizeof abort_, ABORT_ATTR, id);
    snprintf(text, sizeof text, "%.190s", why && *why ? why : "aborted");
    if (rc == 0) rc = ckpt_storage_touch(r, latest); /* compares need the object */
    for (int tries = 0; rc == 0 && tries < 16; tries++) {
        job_state st;
        if ((rc = job_state_read(r, job, id, false, &st)) != 0) return rc;
        if (st.outcome) return st.outcome > 0;
        if (id < st.floor_id)
            return shm_fail(-ESTALE, "job checkpoint %" PRIu64 ": its decision is forgotten", id);
        ckpt_storage_attr expect[] = {{done, NULL}, {FLOOR_ATTR, st.floor[0] ? st.floor : NULL}};
        ckpt_storage_attr set = {abort_, text};
        rc = ckpt_storage_update(r, latest, expect, 2, &set, 1);
        if (rc != -ECANCELED) return rc;
        rc = 0;
    }
    return rc ? rc
              : shm_fail(-EBUSY, "%s/%s: changed 16 times in a row", ckpt_storage_where(r), latest);
}

int ckpt_job_verdict(ckpt_storage *r, const char *job, uint64_t id)
{
    job_state st;
    int rc = job_state_read(r, job, id, false, &st);
    if (rc) return rc;
    if (st.outcome > 0) return 1;
    if (st.outcome < 0)
        return shm_fail(-ECANCELED, "job checkpoint %" PRIu64 " was aborted: %s", id, st.why);
    if (id < st.floor_id)
        return shm_fail(-ESTALE, "job checkpoint %" PRIu64 ": its decision is forgotten", id);
    if (st.latest_id < id) return 0;
    /* Passed over by a later one: no commit of it can follow; the abort is
     * written all the same, so that every host reads one decision. */
    rc = ckpt_job_abort(r, job, id, "passed over by a later checkpoint");
    if (rc == 1) return 1;
    if (rc < 0) return rc;
    return shm_fail(-ECANCELED, "job checkpoint %" PRIu64 " was passed over by %" PRIu64, id,
                    st.latest_id);
}

int ckpt_job_record_read(ckpt_storage *r, const char *job, uint64_t id, ckpt_job_record *rec)
{
    char name[1024];
    memset(rec, 0, sizeof *rec);
    rec->id = id;
    job_name(name, sizeof name, job, id);
    return read_parts(r, name, rec);
}

int ckpt_job_latest(ckpt_storage *r, const char *job, uint64_t *id, ckpt_job_record *rec)
{
    int rc = ckpt_storage_latest(r, job, id);
    if (rc || !rec) return rc;
    rc = ckpt_job_record_read(r, job, *id, rec);
    if (rc == -ENOENT)
        return shm_fail(STASH_ECORRUPT,
                        "%s/%s/job-%" PRIu64 ": JOB/latest names a checkpoint without "
                        "its record",
                        ckpt_storage_where(r), job, *id);
    return rc;
}

static int newest_first(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int ckpt_job_records(ckpt_storage *r, const char *job, uint64_t **ids, size_t *n)
{
    job_state st;
    int rc = job_state_read(r, job, 0, true, &st);
    /* A savepoint's decision may be forgotten; its mark is not. */
    for (size_t i = 0; rc == 0 && i < st.nsaved; i++) {
        bool listed = false;
        for (size_t k = 0; k < st.ndone; k++) listed = listed || st.done[k] == st.saved[i];
        if (!listed) rc = list_add(&st.done, &st.ndone, &st.cap, st.saved[i]);
    }
    free(st.saved);
    if (rc) {
        free(st.done);
        return rc;
    }
    if (st.ndone) qsort(st.done, st.ndone, sizeof *st.done, newest_first);
    *ids = st.done;
    *n = st.ndone;
    return 0;
}

/* ---- retention ------------------------------------------------------------------ */

typedef struct sweep {
    const char *job;
    uint64_t latest;
    const ckpt_job_record *kept;
    size_t nkept;
    char **shared; /* PART/shared/ID.dat each kept part lists; PART/shared/: all */
    size_t nshared;
    char **pointers; /* PART/latest of parts no kept record names */
    size_t npointers;
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

/* Whether a kept record names a part of host (hlen bytes) of epoch, of
 * id (any id: UINT64_MAX). */
static bool kept_part(const sweep *s, const char *host, size_t hlen, uint64_t epoch, uint64_t id)
{
    for (size_t i = 0; i < s->nkept; i++)
        for (size_t k = 0; (s->kept[i].id == id || id == UINT64_MAX) && k < s->kept[i].n; k++)
            if (strlen(s->kept[i].parts[k].host) == hlen &&
                memcmp(s->kept[i].parts[k].host, host, hlen) == 0 &&
                s->kept[i].parts[k].epoch == epoch)
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

/* Whether the shared file object name (PART/shared/ID.dat.K) is one a
 * kept part lists, or of an id above latest (a checkpoint in flight). */
static bool kept_shared(const sweep *s, const char *name, const char *file)
{
    char *end;
    uint64_t id = strtoull(file + strlen(CKPT_SHARED_DIR "/"), &end, 10);
    const char *dot = strrchr(name, '.');
    if (id > s->latest || strncmp(end, ".dat.", 5) != 0 || !dot) return true;
    size_t len = (size_t)(dot - name);
    for (size_t i = 0; i < s->nshared; i++) {
        size_t n = strlen(s->shared[i]);
        bool all = n && s->shared[i][n - 1] == '/';
        if ((all || n == len) && strncmp(s->shared[i], name, all ? n : len) == 0) return true;
    }
    return false;
}

static int list_add_name(char ***v, size_t *n, const char *name)
{
    char **grown = realloc(*v, (*n + 1) * sizeof *grown);
    if (!grown) return shm_fail(-ENOMEM, "out of memory");
    *v = grown;
    if (!(grown[*n] = strdup(name))) return shm_fail(-ENOMEM, "out of memory");
    (*n)++;
    return 0;
}

/* Collects what retention removes: records below latest that are not
 * kept, parts below latest no kept record names
 * (JOB/part/HOST[/EPOCH]/chk-ID/... or savepoint-ID/...), and the shared
 * files of incremental parts (JOB/part/HOST[/EPOCH]/shared/ID.dat) no kept
 * part lists. */
static int take_gone(void *ctx, const char *name)
{
    sweep *s = ctx;
    const char *rest = name + strlen(s->job) + 1;
    char *end;
    if (strncmp(rest, "job-", 4) == 0) {
        uint64_t id = strtoull(rest + 4, &end, 10);
        if (id && !*end && id <= s->latest && !kept_id(s, id)) return add_gone(s, name);
        return 0;
    }
    if (strncmp(rest, "part/", 5) != 0) return 0;
    const char *host = rest + 5, *slash = strchr(host, '/');
    if (!slash) return 0;
    uint64_t epoch = 0;
    const char *chk = slash + 1;
    if (*chk >= '0' && *chk <= '9') {
        epoch = strtoull(chk, &end, 10);
        if (*end != '/') return 0;
        chk = end + 1;
    }
    if (strncmp(chk, CKPT_SHARED_DIR "/", sizeof CKPT_SHARED_DIR) == 0)
        return kept_shared(s, name, chk) ? 0 : add_gone(s, name);
    if (strcmp(chk, "latest") == 0 &&
        !kept_part(s, host, (size_t)(slash - host), epoch, UINT64_MAX))
        return list_add_name(&s->pointers, &s->npointers, name);
    size_t skip = strncmp(chk, "chk-", 4) == 0 ? 4 : strncmp(chk, "savepoint-", 10) == 0 ? 10 : 0;
    if (!skip) return 0;
    uint64_t id = strtoull(chk + skip, &end, 10);
    if (!id || *end != '/' || id > s->latest ||
        kept_part(s, host, (size_t)(slash - host), epoch, id))
        return 0;
    return add_gone(s, name);
}

/* The decisions below a floor, to be forgotten. */
typedef struct forget {
    uint64_t floor;
    char (*names)[48];
    size_t n, cap;
} forget;

static int take_forget(void *ctx, const char *attr, const char *value)
{
    (void)value;
    forget *f = ctx;
    const char *num = NULL;
    if (strncmp(attr, DONE_ATTR, strlen(DONE_ATTR)) == 0) num = attr + strlen(DONE_ATTR);
    if (strncmp(attr, ABORT_ATTR, strlen(ABORT_ATTR)) == 0) num = attr + strlen(ABORT_ATTR);
    if (!num || strtoull(num, NULL, 10) >= f->floor || strlen(attr) >= sizeof f->names[0]) return 0;
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 32;
        char(*names)[48] = realloc(f->names, cap * sizeof *names);
        if (!names) return shm_fail(-ENOMEM, "out of memory");
        f->names = names;
        f->cap = cap;
    }
    snprintf(f->names[f->n++], sizeof f->names[0], "%s", attr);
    return 0;
}

/* Forgets the decisions below floor (the oldest kept checkpoint), as the
 * leader of epoch leader: a verdict asked of one says it is forgotten. */
static int forget_decisions(ckpt_storage *r, const char *job, uint64_t floor, uint64_t leader)
{
    char latest[1024], mine[32], now[32];
    forget f = {floor, NULL, 0, 0};
    int rc = ckpt_job_object(latest, sizeof latest, job, "latest");
    if (rc == 0) rc = ckpt_storage_attrs(r, latest, take_forget, &f);
    ckpt_storage_attr *set = rc == 0 ? calloc(f.n + 1, sizeof *set) : NULL;
    if (rc == 0 && !set) rc = shm_fail(-ENOMEM, "out of memory");
    if (rc == 0) {
        for (size_t i = 0; i < f.n; i++) set[i] = (ckpt_storage_attr){f.names[i], NULL};
        snprintf(now, sizeof now, "%" PRIu64, floor);
        snprintf(mine, sizeof mine, "%" PRIu64, leader);
        set[f.n] = (ckpt_storage_attr){FLOOR_ATTR, now};
        ckpt_storage_attr expect = {LEADER_ATTR, mine};
        rc = ckpt_storage_update(r, latest, &expect, 1, set, f.n + 1);
        if (rc == -ECANCELED) rc = shm_fail(-ECANCELED, "job %s: the lead passed on", job);
    }
    free(set);
    free(f.names);
    return rc;
}

/* Adds the shared files part of rec lists to s->shared, as object names
 * (PART/shared/ID.dat). */
static int list_part_shared(ckpt_storage *r, const char *job, const ckpt_job_record *rec,
                            const ckpt_job_part *part, sweep *s)
{
    char sub[1024], dirname[64];
    int rc = ckpt_job_part_prefix(sub, sizeof sub, job, part->host, part->epoch);
    ckpt_job_part_name(rec, dirname, sizeof dirname);
    size_t from = s->nshared;
    if (rc == 0) rc = ckpt_storage_shared_of(r, sub, dirname, &s->shared, &s->nshared);
    if (rc == -ENOENT) {
        /* A kept part without its metadata: what it rests on is unknown,
         * and every shared file of its prefix stays. */
        shm_clear_error();
        rc = list_add_name(&s->shared, &s->nshared, CKPT_SHARED_DIR "/");
    }
    for (size_t i = from; rc == 0 && i < s->nshared; i++) {
        size_t len = strlen(sub) + strlen(s->shared[i]) + 2;
        char *full = malloc(len);
        if (!full) {
            rc = shm_fail(-ENOMEM, "out of memory");
            break;
        }
        snprintf(full, len, "%s/%s", sub, s->shared[i]);
        free(s->shared[i]);
        s->shared[i] = full;
    }
    return rc;
}

int ckpt_job_retain(ckpt_storage *r, const char *job, unsigned keep, uint64_t leader)
{
    uint64_t latest;
    int rc = ckpt_storage_latest(r, job, &latest);
    if (rc == -ENOENT) return 0;
    if (rc) return rc;
    job_state st;
    if ((rc = job_state_read(r, job, 0, true, &st)) != 0) return rc;
    ckpt_job_record *kept = calloc(keep + st.nsaved + 1, sizeof *kept);
    if (!kept) rc = shm_fail(-ENOMEM, "out of memory");
    size_t nkept = 0, nchk = 0;
    uint64_t floor = 0;
    /* The newest keep committed checkpoints, then every savepoint. */
    if (st.ndone) qsort(st.done, st.ndone, sizeof *st.done, newest_first);
    for (size_t i = 0; rc == 0 && i < st.ndone && nchk < keep; i++) {
        bool saved = false;
        for (size_t k = 0; k < st.nsaved; k++) saved = saved || st.saved[k] == st.done[i];
        if (st.done[i] > latest || saved) continue;
        rc = ckpt_job_record_read(r, job, st.done[i], &kept[nkept]);
        if (rc == 0) floor = kept[nkept].id;
        if (rc == 0) nkept++, nchk++;
        if (rc == -ENOENT) rc = 0; /* removed meanwhile */
    }
    for (size_t i = 0; rc == 0 && i < st.nsaved; i++) {
        rc = ckpt_job_record_read(r, job, st.saved[i], &kept[nkept]);
        if (rc == 0) nkept++;
    }
    free(st.done);
    free(st.saved);
    sweep s = {job, latest, kept, nkept, NULL, 0, NULL, 0, NULL, 0, 0, 0};
    /* The shared files the kept incremental parts list. */
    for (size_t i = 0; rc == 0 && i < nkept; i++)
        for (size_t k = 0; rc == 0 && !kept[i].savepoint && k < kept[i].n; k++)
            rc = list_part_shared(r, job, &kept[i], &kept[i].parts[k], &s);
    /* The decisions go first: a record retention removes is one no verdict names. */
    if (rc == 0 && floor) rc = forget_decisions(r, job, floor, leader);
    char prefix[1024];
    snprintf(prefix, sizeof prefix, "%s/", job);
    if (rc == 0) rc = ckpt_storage_objects(r, prefix, take_gone, &s);
    /* Each part's metadata first: a part half removed is one no longer. */
    for (size_t i = 0; rc == 0 && i < s.n; i++)
        if (strstr(s.gone[i], "/_metadata.")) rc = ckpt_storage_remove(r, s.gone[i]);
    for (size_t i = 0; rc == 0 && i < s.n; i++)
        if (!strstr(s.gone[i], "/_metadata.")) rc = ckpt_storage_remove(r, s.gone[i]);
    /* The pointer of a part no kept record names, once nothing of it is in
     * flight (a live service's parts are in every record). */
    for (size_t i = 0; rc == 0 && i < s.npointers; i++) {
        char at[32];
        rc = ckpt_storage_pointer(r, s.pointers[i], at, sizeof at);
        if (rc == 0 && strtoull(at, NULL, 10) <= latest) rc = ckpt_storage_remove(r, s.pointers[i]);
        if (rc == -ENOENT) rc = 0;
    }
    for (size_t i = 0; i < s.npointers; i++) free(s.pointers[i]);
    free(s.pointers);
    for (size_t i = 0; i < s.n; i++) free(s.gone[i]);
    for (size_t i = 0; i < s.nshared; i++) free(s.shared[i]);
    free(s.gone);
    free(s.shared);
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
static int restore_part(stash_arena *a, ckpt_storage *r, const char *job,
                        const ckpt_job_record *rec, const ckpt_job_part *part, const shm_dir *dir,
                        uint32_t p, const ckpt_job_workers *workers, ioe_engine *e, store *st,
                        ckpt_restored *out)
{
    char sub[1024], chk[64], path[4096] = "";
    uint32_t maxp = a->hdr->max_parallelism;
    if (part->max_parallelism != maxp)
        return shm_fail(STASH_ECORRUPT, "host %s's part is of %u key groups, the arena of %u",
                        part->host, part->max_parallelism, maxp);
    ckpt_job_part_name(rec, chk, sizeof chk);
    shm_dir parts = {.fd = -1}, local = {.fd = -1};
    int rc = ckpt_job_part_prefix(sub, sizeof sub, job, part->host, part->epoch);
    if (rc == 0) rc = shm_dir_openat(dir, "parts", SHM_DIR_OWN | SHM_DIR_CREATE, &parts);
    if (rc == 0) rc = shm_dir_openat(&parts, part->host, SHM_DIR_OWN | SHM_DIR_CREATE, &local);
    if (rc == 0) rc = ckpt_storage_fetch(r, sub, &local, chk);
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
    /* Kept for the rollbacks of the workers restored from it, until a
     * checkpoint of this arena holds them (ckpt_job_copies_drop). */
    shm_dir_close(&local);
    shm_dir_close(&parts);
    return rc;
}

/* ---- the copies a restore leaves, for rollbacks ---------------------------------- */

#define COPIES "parts" /* DIR/parts/HOST/chk-ID: the parts a restore read; DIR/parts/job-ID */

/* Writes rec beside the copies of its parts (DIR/parts/job-ID), whole or
 * not at all. */
static int record_copy_write(const shm_dir *dir, const ckpt_job_record *rec)
{
    char text[RECORD_MAX], name[64], tmp[80];
    int len = record_format(rec, text, sizeof text);
    if (len < 0) return len;
    size_t n = (size_t)len;
    snprintf(name, sizeof name, "job-%" PRIu64, rec->id);
    snprintf(tmp, sizeof tmp, ".%s.tmp", name);
    shm_dir parts;
    int rc = shm_dir_openat(dir, COPIES, SHM_DIR_OWN | SHM_DIR_CREATE, &parts);
    if (rc) return rc;
    unlinkat(parts.fd, tmp, 0);
    int fd = openat(parts.fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) rc = shm_fail(-errno, "%s/%s: %s", parts.path, tmp, strerror(errno));
    if (rc == 0 && write(fd, text, n) != (ssize_t)n)
        rc = shm_fail(-EIO, "%s/%s: a short write", parts.path, tmp);
    if (rc == 0 && fsync(fd) < 0)
        rc = shm_fail(-errno, "%s/%s: %s", parts.path, tmp, strerror(errno));
    if (fd >= 0) close(fd);
    if (rc == 0 && renameat(parts.fd, tmp, parts.fd, name) < 0)
        rc = shm_fail(-errno, "%s/%s: %s", parts.path, name, strerror(errno));
    if (rc) unlinkat(parts.fd, tmp, 0);
    shm_dir_close(&parts);
    return rc;
}

/* Reads the record copy of job checkpoint id in parts into rec. */
static int record_copy_read(const shm_dir *parts, uint64_t id, ckpt_job_record *rec)
{
    char name[64], what[4200], text[RECORD_MAX];
    snprintf(name, sizeof name, "job-%" PRIu64, id);
    snprintf(what, sizeof what, "%s/%s", parts->path, name);
    memset(rec, 0, sizeof *rec);
    rec->id = id;
    int fd = openat(parts->fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return shm_fail(-errno, "%s: %s", what, strerror(errno));
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n < 0) return shm_fail(-EIO, "%s: cannot read", what);
    text[n] = 0;
    return record_parse(text, rec, what);
}

int ckpt_job_restore_copies(stash_arena *a, const shm_dir *dir, uint64_t id, stash_kg_range range,
                            ioe_engine *e, store *st, uint64_t *records)
{
    *records = 0;
    shm_dir parts;
    int rc = shm_dir_openat(dir, COPIES, SHM_DIR_OWN, &parts);
    ckpt_job_record *rec = rc ? NULL : malloc(sizeof *rec);
    if (rc == 0 && !rec) rc = shm_fail(-ENOMEM, "out of memory");
    if (rc == 0) rc = record_copy_read(&parts, id, rec);
    uint32_t maxp = a->hdr->max_parallelism;
    for (size_t i = 0; rc == 0 && i < rec->n; i++) {
        const ckpt_job_part *part = &rec->parts[i];
        for (uint32_t k = 0; rc == 0 && k < part->workers.n; k++) {
            stash_kg_range have =
                span(maxp, part->parallelism, part->workers.r[k].first, part->workers.r[k].last);
            stash_kg_range both = {have.first > range.first ? have.first : range.first,
                                   have.last < range.last ? have.last : range.last};
            if (both.first > both.last) continue;
            char path[4096], chk[64];
            ckpt_restored got = {0};
            ckpt_job_part_name(rec, chk, sizeof chk);
            rc = ckpt_path_of(path, "%s/%s/%s", parts.path, part->host, chk);
            if (rc == 0) rc = ckpt_restore_path(a, path, both, e, st, &got);
            if (rc == 0) *records += got.records;
            ckpt_restored_free(&got);
        }
    }
    free(rec);
    if (parts.fd >= 0) shm_dir_close(&parts);
    return rc;
}

/* Whether name is "chk-ID", "savepoint-ID" or "job-ID" of an id below the bound. */
static bool copy_below(const char *name, uint64_t below)
{
    const char *digits = strncmp(name, "chk-", 4) == 0 || strncmp(name, "job-", 4) == 0 ? name + 4
                         : strncmp(name, "savepoint-", 10) == 0                         ? name + 10
                                                                                        : NULL;
    char *end;
    uint64_t id = digits ? strtoull(digits, &end, 10) : 0;
    return digits && *digits && !*end && id < below;
}

int ckpt_job_copies_drop(const shm_dir *dir, uint64_t below)
{
    shm_dir parts;
    int rc = shm_dir_openat(dir, COPIES, SHM_DIR_OWN, &parts);
    if (rc == -ENOENT) return 0;
    if (rc) return rc;
    int fd = dup(parts.fd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d && fd >= 0) close(fd);
    struct dirent *ent;
    while (d && (ent = readdir(d))) {
        if (ent->d_name[0] == '.') continue;
        if (copy_below(ent->d_name, below)) {
            shm_dir_remove(&parts, ent->d_name, 0);
            continue;
        }
        shm_dir host;
        if (!ckpt_job_host_ok(ent->d_name) ||
            shm_dir_openat(&parts, ent->d_name, SHM_DIR_OWN, &host) != 0)
            continue;
        int hfd = dup(host.fd);
        DIR *hd = hfd >= 0 ? fdopendir(hfd) : NULL;
        if (!hd && hfd >= 0) close(hfd);
        struct dirent *c;
        bool left = false; /* a copy of an incremental part needs its shared files */
        while (hd && (c = readdir(hd))) {
            if (copy_below(c->d_name, below))
                ckpt_remove_checkpoint(&host, c->d_name);
            else
                left = left || strncmp(c->d_name, "chk-", 4) == 0;
        }
        if (hd) closedir(hd);
        if (!left) shm_dir_remove(&host, CKPT_SHARED_DIR, 1);
        shm_dir_close(&host);
    }
    if (d) closedir(d);
    shm_dir_close(&parts);
    return 0;
}

int ckpt_job_restore(stash_arena *a, ckpt_storage *r, const char *job, const ckpt_job_record *rec,
                     const shm_dir *dir, uint32_t parallelism, const ckpt_job_workers *workers,
                     ioe_engine *e, store *st, ckpt_restored *out)
{
    memset(out, 0, sizeof *out);
    out->id = rec->id;
    int rc = ckpt_job_covered(rec);
    if (rc == -EAGAIN) rc = STASH_ECORRUPT;
    for (size_t i = 0; rc == 0 && i < rec->n; i++)
        rc = restore_part(a, r, job, rec, &rec->parts[i], dir, parallelism, workers, e, st, out);
    if (rc == 0) rc = record_copy_write(dir, rec);
    if (rc == 0) rc = pack_opstate(out);
    if (rc) drop_gathered(out);
    return rc;
}
