/* SPDX-License-Identifier: MIT */
/*
 * s3.c: checkpoint files as objects of an S3 bucket, over libcurl, which
 * signs each request (AWS Signature Version 4). A file is one object,
 * written whole by one PUT or, past a part's size, by a multipart upload
 * with several parts in flight, each read from the file where it lies; a
 * file is read back by ranged GETs in flight at once, each written where
 * it belongs. A pointer moves by a conditional PUT (If-None-Match: * to
 * create, If-Match on the ETag read to replace), so of two writers that
 * read the same value only one moves it. Every call is bounded in time
 * and retried with backoff on a server's 5xx or a lost connection.
 * Credentials come from the environment or a credentials file, never from
 * a URL or a message.
 */
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends/checkpoint/storage.h"

#define PART_DEFAULT (8ull << 20)
#define PART_MIN (5ull << 20) /* S3's smallest part but the last */
#define PARTS_MAX 10000u      /* S3's most parts of an upload */
#define ATTEMPTS 5            /* of a call that fails for a reason that may pass */

typedef struct s3 {
    ckpt_storage base;
    CURLSH *share; /* connections, DNS and TLS sessions kept between calls */
    pthread_mutex_t locks[CURL_LOCK_DATA_LAST];
    char bucket[64];
    char url[512]; /* the bucket's: ENDPOINT/BUCKET, or https://BUCKET.s3.REGION.amazonaws.com */
    char sigv4[128];
    char userpwd[512];
    char token[2100]; /* "x-amz-security-token: ..." or "" */
    long timeout_ms;
} s3;

/* ---- the connection's shared state --------------------------------------------- */

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *ctx)
{
    (void)h;
    (void)access;
    pthread_mutex_lock(&((s3 *)ctx)->locks[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *ctx)
{
    (void)h;
    pthread_mutex_unlock(&((s3 *)ctx)->locks[data]);
}

/* ---- one request ------------------------------------------------------------ */

typedef struct req {
    s3 *s;
    CURL *h;
    struct curl_slist *hdrs;
    char key[1024];
    const char *what; /* "write", "read", ... for messages */
    /* what goes up: bytes in memory */
    const uint8_t *src;
    uint64_t up_len, up_done;
    /* what comes back: into memory grown as it comes (at most limit
     * bytes), or into dst (exactly down_len bytes) */
    uint8_t *body;
    size_t body_len, body_cap, limit;
    uint8_t *dst;
    uint64_t down_len, down_done;
    int io_rc; /* a failure of the body's handling */
    char etag[128];
    uint64_t length; /* Content-Length */
    bool has_length;
    long status;
    CURLcode cc;
    unsigned attempts;
    uint64_t started_ns; /* of the first attempt */
} req;

static size_t on_header(char *line, size_t size, size_t n, void *ctx)
{
    req *r = ctx;
    size_t len = size * n;
    char name[32];
    const char *colon = memchr(line, ':', len);
    if (!colon || (size_t)(colon - line) >= sizeof name) return len;
    size_t nlen = (size_t)(colon - line);
    for (size_t i = 0; i < nlen; i++) name[i] = (char)tolower((unsigned char)line[i]);
    name[nlen] = 0;
    const char *v = colon + 1, *end = line + len;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ')) end--;
    if (strcmp(name, "etag") == 0)
        snprintf(r->etag, sizeof r->etag, "%.*s", (int)(end - v), v);
    else if (strcmp(name, "content-length") == 0) {
        r->length = strtoull(v, NULL, 10);
        r->has_length = true;
    }
    return len;
}

static size_t on_body(char *data, size_t size, size_t n, void *ctx)
{
    req *r = ctx;
    size_t len = size * n;
    if (!r->status) curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &r->status);
    /* A failed request's body is its error, read into memory whatever it asked. */
    if (r->dst && r->status / 100 == 2) {
        if (r->down_done + len > r->down_len) {
            r->io_rc = shm_fail(STASH_ECORRUPT, "s3://%s/%s: more than the %llu bytes asked for",
                                r->s->bucket, r->key, (unsigned long long)r->down_len);
            return 0;
        }
        memcpy(r->dst + r->down_done, data, len);
        r->down_done += len;
        return len;
    }
    size_t limit = r->status / 100 == 2 ? r->limit : 65536;
    if (r->body_len + len > limit) {
        r->io_rc = shm_fail(-EFBIG, "s3://%s/%s: more than %zu bytes", r->s->bucket, r->key, limit);
        return 0;
    }
    if (r->body_len + len + 1 > r->body_cap) {
        size_t cap = r->body_cap ? r->body_cap : 4096;
        while (cap < r->body_len + len + 1) cap *= 2;
        uint8_t *grown = realloc(r->body, cap);
        if (!grown) {
            r->io_rc = shm_fail(-ENOMEM, "out of memory");
            return 0;
        }
        r->body = grown;
        r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, data, len);
    r->body_len += len;
    r->body[r->body_len] = 0;
    return len;
}

static size_t on_upload(char *buf, size_t size, size_t n, void *ctx)
{
    req *r = ctx;
    size_t want = size * n;
    uint64_t left = r->up_len - r->up_done;
    if (want > left) want = (size_t)left;
    memcpy(buf, r->src + r->up_done, want);
    r->up_done += want;
    return want;
}

/* The bucket's URL of key (each byte outside [A-Za-z0-9-._~/] escaped) and query. */
static int url_of(const s3 *s, const char *key, const char *query, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "%s/", s->url);
    for (const unsigned char *p = (const unsigned char *)key; *p && n + 4 < cap; p++)
        n += isalnum(*p) || strchr("-._~/", *p) ? (size_t)snprintf(out + n, cap - n, "%c", *p)
                                                : (size_t)snprintf(out + n, cap - n, "%%%02X", *p);
    if (query) n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "?%s", query);
    return n + 1 < cap ? 0 : shm_fail(-ENAMETOOLONG, "s3://%s/%s: too long", s->bucket, key);
}

/* Sets r up as method on key (with query, whose parameters must be in
 * order: the signature takes them as they are). */
static int req_init(s3 *s, req *r, const char *method, const char *key, const char *query,
                    const char *what)
{
    *r = (req){.s = s, .what = what, .limit = 64u << 20};
    snprintf(r->key, sizeof r->key, "%s", key);
    char url[2048];
    int rc = url_of(s, key, query, url, sizeof url);
    if (rc) return rc;
    if (!(r->h = curl_easy_init())) return shm_fail(-ENOMEM, "out of memory");
    /* The payload is not hashed into the signature: parts stream from files. */
    r->hdrs = curl_slist_append(NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (s->token[0]) r->hdrs = curl_slist_append(r->hdrs, s->token);
    CURL *h = r->h;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_SHARE, s->share);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, s->sigv4);
    curl_easy_setopt(h, CURLOPT_USERPWD, s->userpwd);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, s->timeout_ms);
    /* A call that moves no byte for the timeout fails; a long one that moves goes on. */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (s->timeout_ms + 999) / 1000);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    if (strcmp(method, "HEAD") == 0)
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    else if (strcmp(method, "GET") != 0)
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    return 0;
}

/* What goes up: len bytes at src. */
static void req_upload(req *r, const void *src, uint64_t len)
{
    r->src = src;
    r->up_len = len;
    curl_easy_setopt(r->h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(r->h, CURLOPT_READFUNCTION, on_upload);
    curl_easy_setopt(r->h, CURLOPT_READDATA, r);
    curl_easy_setopt(r->h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)len);
}

static void req_header(req *r, const char *line)
{
    r->hdrs = curl_slist_append(r->hdrs, line);
}

static void req_free(req *r)
{
    if (r->h) curl_easy_cleanup(r->h);
    curl_slist_free_all(r->hdrs);
    free(r->body);
    r->h = NULL;
    r->hdrs = NULL;
    r->body = NULL;
}

/* Back to before the request ran, for another attempt. */
static void req_rewind(req *r)
{
    r->up_done = r->down_done = 0;
    r->body_len = 0;
    r->etag[0] = 0;
    r->has_length = false;
    r->status = 0;
    r->io_rc = 0;
}

/* Whether a finished attempt failed for a reason that may pass. */
static bool transient(const req *r)
{
    if (r->io_rc) return false;
    switch (r->cc) {
    case CURLE_OK:
        return r->status >= 500 || r->status == 429;
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
        return true;
    default:
        return false;
    }
}

/* The wait before the attempt after attempt k (from 1): 100 ms, 400 ms, 1.6 s, 6.4 s. */
static long backoff_ms(unsigned k)
{
    long ms = 100;
    for (unsigned i = 1; i < k; i++) ms *= 4;
    return ms;
}

/* Whether r, which failed for a reason that may pass, goes again: while
 * attempts are left and the wait ends within the call's timeout (counted
 * from its first attempt), after that wait. */
static bool retry(req *r)
{
    long ms = backoff_ms(r->attempts);
    if (r->attempts >= ATTEMPTS ||
        (shm_clock_ns() - r->started_ns) / 1000000 + (uint64_t)ms > (uint64_t)r->s->timeout_ms)
        return false;
    nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000}, NULL);
    return true;
}

/* The error code in an S3 error's body ("NoSuchKey"), or "". */
static void error_code(const req *r, char *out, size_t cap)
{
    out[0] = 0;
    const char *b = r->body ? (const char *)r->body : "";
    const char *p = strstr(b, "<Code>"), *e = p ? strstr(p, "</Code>") : NULL;
    if (p && e) snprintf(out, cap, "%.*s", (int)(e - p - 6), p + 6);
}

/* The outcome of a finished request: 0, or an error naming the object. */
static int req_result(req *r)
{
    s3 *s = r->s;
    if (r->io_rc) return r->io_rc;
    if (r->cc != CURLE_OK) {
        int rc = r->cc == CURLE_OPERATION_TIMEDOUT     ? -ETIMEDOUT
                 : r->cc == CURLE_COULDNT_CONNECT      ? -ECONNREFUSED
                 : r->cc == CURLE_COULDNT_RESOLVE_HOST ? -EHOSTUNREACH
                                                       : -EIO;
        return shm_fail(rc, "s3://%s/%s: %s: %s (after %u attempts)", s->bucket, r->key, r->what,
                        curl_easy_strerror(r->cc), r->attempts);
    }
    if (r->status / 100 == 2) return 0;
    char code[64];
    error_code(r, code, sizeof code);
    /* A bucket over its quota answers 403 (radosgw) or 507: not a refusal
     * of the credentials. */
    bool full = r->status == 507 || strcmp(code, "QuotaExceeded") == 0;
    int rc = full               ? -EDQUOT
             : r->status == 404 ? -ENOENT
             : r->status == 403 ? -EACCES
             : r->status == 412 ? -ECANCELED
             : r->status == 400 ? -EINVAL
             : r->status == 409 ? -EBUSY
                                : -EIO;
    if (rc == -EDQUOT)
        return shm_fail(rc, "s3://%s/%s: %s: the bucket is full (HTTP %ld %s)", s->bucket, r->key,
                        r->what, r->status, code);
    return shm_fail(rc, "s3://%s/%s: %s: HTTP %ld%s%s", s->bucket, r->key, r->what, r->status,
                    code[0] ? " " : "", code);
}

/* Runs r to its end, retrying what may pass; 0 or an error naming it. */
static int req_run(req *r)
{
    r->started_ns = shm_clock_ns();
    for (;;) {
        curl_easy_setopt(r->h, CURLOPT_HTTPHEADER, r->hdrs);
        r->attempts++;
        r->cc = curl_easy_perform(r->h);
        curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &r->status);
        if (!transient(r) || !retry(r)) return req_result(r);
        req_rewind(r);
    }
}

/* Runs n requests, at most depth at once, each retried as req_run retries;
 * the first failure wins (the others still run to their end). */
static int run_many(s3 *s, req *rs, size_t n)
{
    CURLM *m = curl_multi_init();
    if (!m) return shm_fail(-ENOMEM, "out of memory");
    size_t next = 0, running = 0;
    int rc = 0;
    while (next < n || running) {
        while (next < n && running < s->base.depth) {
            req *r = &rs[next++];
            curl_easy_setopt(r->h, CURLOPT_HTTPHEADER, r->hdrs);
            curl_easy_setopt(r->h, CURLOPT_PRIVATE, r);
            r->started_ns = shm_clock_ns();
            r->attempts++;
            curl_multi_add_handle(m, r->h);
            running++;
        }
        int still;
        curl_multi_perform(m, &still);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            req *r;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
            r->cc = msg->data.result;
            curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &r->status);
            curl_multi_remove_handle(m, r->h);
            if (transient(r) && !rc && retry(r)) {
                req_rewind(r);
                r->attempts++;
                curl_multi_add_handle(m, r->h);
                continue;
            }
            running--;
            int one = req_result(r);
            if (one && !rc) rc = one;
        }
        if (running) curl_multi_poll(m, NULL, 0, 1000, NULL);
    }
    curl_multi_cleanup(m);
    return rc;
}

/* ---- files ---------------------------------------------------------------- */

/* The text between <tag> and </tag> at or after *p, XML's entities
 * undone, into out; *p moves past it. false if there is none. */
static bool xml_take(const char **p, const char *tag, char *out, size_t cap)
{
    char open[64], close[64];
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    const char *a = strstr(*p, open), *b = a ? strstr(a, close) : NULL;
    if (!b) return false;
    a += strlen(open);
    size_t n = 0;
    static const struct {
        const char *ent;
        char c;
    } ents[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    while (a < b && n + 1 < cap) {
        size_t k = 0;
        while (k < 5 && strncmp(a, ents[k].ent, strlen(ents[k].ent)) != 0) k++;
        out[n++] = k < 5 ? ents[k].c : *a;
        a += k < 5 ? strlen(ents[k].ent) : 1;
    }
    out[n] = 0;
    *p = b + strlen(close);
    return true;
}

static int s3_put_whole(ckpt_storage *st, const char *name, const void *data, size_t len)
{
    s3 *s = (s3 *)st;
    req r;
    int rc = req_init(s, &r, "PUT", name, NULL, "write");
    if (rc == 0) {
        req_upload(&r, data, len);
        rc = req_run(&r);
    }
    req_free(&r);
    return rc;
}

/* A multipart upload under way: its id and its parts' ETags. */
typedef struct upload {
    char *eid; /* its id, escaped for a query */
    pthread_mutex_t mu;
    char (*etags)[128];
    uint64_t cap;
} upload;

static void upload_free(upload *u)
{
    curl_free(u->eid);
    pthread_mutex_destroy(&u->mu);
    free(u->etags);
    free(u);
}

static int s3_put_begin(ckpt_storage *st, const char *name, void **state)
{
    s3 *s = (s3 *)st;
    upload *u = calloc(1, sizeof *u);
    if (!u) return shm_fail(-ENOMEM, "out of memory");
    pthread_mutex_init(&u->mu, NULL);
    req r;
    int rc = req_init(s, &r, "POST", name, "uploads=", "start an upload");
    if (rc == 0) rc = req_run(&r);
    char id[512] = "";
    const char *p = r.body ? (const char *)r.body : "";
    if (rc == 0 && !xml_take(&p, "UploadId", id, sizeof id))
        rc = shm_fail(-EIO, "s3://%s/%s: start an upload: no UploadId in the answer", s->bucket,
                      name);
    req_free(&r);
    if (rc == 0 && !(u->eid = curl_easy_escape(NULL, id, 0)))
        rc = shm_fail(-ENOMEM, "out of memory");
    if (rc) {
        upload_free(u);
        return rc;
    }
    *state = u;
    return 0;
}

/* Writes part index (from 0) as the upload's part index + 1. */
static int put_part(s3 *s, upload *u, const char *name, uint64_t index, const void *data,
                    size_t len)
{
    if (index >= PARTS_MAX)
        return shm_fail(-EFBIG, "s3://%s/%s: more than %u parts of %llu bytes", s->bucket, name,
                        PARTS_MAX, (unsigned long long)s->base.part);
    char query[700];
    snprintf(query, sizeof query, "partNumber=%llu&uploadId=%s", (unsigned long long)index + 1,
             u->eid);
    req r;
    int rc = req_init(s, &r, "PUT", name, query, "write a part");
    if (rc == 0) {
        req_upload(&r, data, len);
        rc = req_run(&r);
    }
    pthread_mutex_lock(&u->mu);
    if (rc == 0 && index >= u->cap) {
        uint64_t cap = index + 1 > u->cap * 2 ? index + 1 : u->cap * 2;
        char(*grown)[128] = realloc(u->etags, cap * sizeof *grown);
        if (grown) {
            memset(grown + u->cap, 0, (cap - u->cap) * sizeof *grown);
            u->etags = grown, u->cap = cap;
        } else {
            rc = shm_fail(-ENOMEM, "out of memory");
        }
    }
    if (rc == 0) snprintf(u->etags[index], sizeof u->etags[index], "%s", r.etag);
    pthread_mutex_unlock(&u->mu);
    req_free(&r);
    return rc;
}

static int s3_put_part(ckpt_storage *st, void *state, const char *name, uint64_t index,
                       const void *data, size_t len)
{
    return put_part((s3 *)st, state, name, index, data, len);
}

/* Completes the upload: the parts in order with their ETags. */
static int s3_put_end(ckpt_storage *st, void *state, const char *name, uint64_t total,
                      uint64_t nparts)
{
    (void)total;
    s3 *s = (s3 *)st;
    upload *u = state;
    int rc = 0;
    size_t cap = 128 + nparts * 200, len = 0;
    char *xml = rc == 0 ? malloc(cap) : NULL;
    if (rc == 0 && !xml) rc = shm_fail(-ENOMEM, "out of memory");
    if (rc == 0) len += (size_t)snprintf(xml, cap, "<CompleteMultipartUpload>");
    for (uint64_t i = 0; rc == 0 && i < nparts; i++)
        len += (size_t)snprintf(xml + len, cap - len,
                                "<Part><PartNumber>%llu</PartNumber><ETag>%s</ETag></Part>",
                                (unsigned long long)i + 1, i < u->cap ? u->etags[i] : "");
    if (rc == 0) snprintf(xml + len, cap - len, "</CompleteMultipartUpload>");
    char query[700];
    snprintf(query, sizeof query, "uploadId=%s", u->eid);
    req r;
    if (rc == 0 && (rc = req_init(s, &r, "POST", name, query, "complete an upload")) == 0) {
        curl_easy_setopt(r.h, CURLOPT_POSTFIELDS, xml);
        rc = req_run(&r);
        /* A completion can fail after its 200 has gone out: the body says. */
        const char *b = r.body ? (const char *)r.body : "";
        char code[64];
        if (rc == 0 && strstr(b, "<Error>") && xml_take(&b, "Code", code, sizeof code))
            rc = shm_fail(-EIO, "s3://%s/%s: complete an upload: %s", s->bucket, name, code);
        req_free(&r);
    }
    free(xml);
    if (rc == 0) upload_free(u); /* a failure is given up by put_abort */
    return rc;
}

/* What an abort leaves, remove_prefix or the bucket's lifecycle rules remove. */
static void s3_put_abort(ckpt_storage *st, void *state, const char *name, uint64_t nparts)
{
    (void)nparts;
    s3 *s = (s3 *)st;
    upload *u = state;
    if (!u) return;
    char query[700];
    snprintf(query, sizeof query, "uploadId=%s", u->eid);
    req r;
    if (req_init(s, &r, "DELETE", name, query, "abort an upload") == 0) req_run(&r);
    req_free(&r);
    upload_free(u);
}

static int s3_get_range(ckpt_storage *st, const char *name, uint64_t off, void *dst, size_t len)
{
    s3 *s = (s3 *)st;
    if (!len) return 0;
    req r;
    int rc = req_init(s, &r, "GET", name, NULL, "read");
    char range[80];
    snprintf(range, sizeof range, "Range: bytes=%llu-%llu", (unsigned long long)off,
             (unsigned long long)(off + len - 1));
    if (rc == 0) {
        req_header(&r, range);
        r.dst = dst;
        r.down_len = len;
        rc = req_run(&r);
    }
    if (rc == 0 && r.down_done != len)
        rc = shm_fail(STASH_ECORRUPT, "s3://%s/%s: %llu bytes at offset %llu, not %zu", s->bucket,
                      name, (unsigned long long)r.down_done, (unsigned long long)off, len);
    req_free(&r);
    return rc;
}

static int s3_file_size(ckpt_storage *st, const char *name, uint64_t *len)
{
    s3 *s = (s3 *)st;
    req r;
    int rc = req_init(s, &r, "HEAD", name, NULL, "read the length of");
    if (rc == 0) rc = req_run(&r);
    if (rc == 0 && !r.has_length)
        rc = shm_fail(-EIO, "s3://%s/%s: no length in the answer", s->bucket, name);
    if (rc == 0) *len = r.length;
    req_free(&r);
    return rc;
}

static int s3_remove(ckpt_storage *st, const char *name)
{
    s3 *s = (s3 *)st;
    req r;
    int rc = req_init(s, &r, "DELETE", name, NULL, "remove");
    if (rc == 0) rc = req_run(&r);
    req_free(&r);
    return rc == -ENOENT ? 0 : rc;
}

static int s3_list_files(ckpt_storage *st, const char *prefix, ckpt_storage_name_fn *fn, void *ctx)
{
    s3 *s = (s3 *)st;
    char *eprefix = curl_easy_escape(NULL, prefix, 0);
    char token[1024] = "", key[1024];
    int rc = eprefix ? 0 : shm_fail(-ENOMEM, "out of memory");
    for (bool more = true; rc == 0 && more;) {
        char *etoken = curl_easy_escape(NULL, token, 0);
        char query[3072];
        snprintf(query, sizeof query, "%s%s%slist-type=2&prefix=%s",
                 token[0] ? "continuation-token=" : "", token[0] ? etoken : "", token[0] ? "&" : "",
                 eprefix);
        curl_free(etoken);
        req r;
        rc = req_init(s, &r, "GET", "", query, "list");
        snprintf(r.key, sizeof r.key, "%s", prefix);
        if (rc == 0) rc = req_run(&r);
        const char *p = r.body ? (const char *)r.body : "";
        char truncated[16] = "false";
        const char *head = p;
        xml_take(&head, "IsTruncated", truncated, sizeof truncated);
        more = strcmp(truncated, "true") == 0;
        if (rc == 0 && more && !xml_take(&head, "NextContinuationToken", token, sizeof token))
            rc = shm_fail(-EIO, "s3://%s/%s: list: truncated, with no token to go on", s->bucket,
                          prefix);
        while (rc == 0 && xml_take(&p, "Key", key, sizeof key)) rc = fn(ctx, key);
        req_free(&r);
    }
    curl_free(eprefix);
    return rc;
}

/* Names gathered by a listing. */
typedef struct names {
    char **v;
    size_t n;
} names;

static int take_name(void *ctx, const char *name)
{
    names *ns = ctx;
    char **grown = realloc(ns->v, (ns->n + 1) * sizeof *grown);
    if (!grown) return shm_fail(-ENOMEM, "out of memory");
    ns->v = grown;
    return (grown[ns->n] = strdup(name)) ? (ns->n++, 0) : shm_fail(-ENOMEM, "out of memory");
}

/* Aborts every multipart upload under prefix (one a killed writer left
 * holds its parts' bytes, unseen by a listing, until it is aborted). */
static int abort_uploads(s3 *s, const char *prefix)
{
    char *eprefix = curl_easy_escape(NULL, prefix, 0);
    char query[1200];
    snprintf(query, sizeof query, "prefix=%s&uploads=", eprefix ? eprefix : "");
    curl_free(eprefix);
    req r;
    int rc = req_init(s, &r, "GET", "", query, "list the uploads under way");
    snprintf(r.key, sizeof r.key, "%s", prefix);
    if (rc == 0) rc = req_run(&r);
    const char *p = r.body ? (const char *)r.body : "";
    char key[1024], id[512];
    while (rc == 0 && xml_take(&p, "Key", key, sizeof key) &&
           xml_take(&p, "UploadId", id, sizeof id)) {
        char *eid = curl_easy_escape(NULL, id, 0);
        req a;
        snprintf(query, sizeof query, "uploadId=%s", eid ? eid : "");
        curl_free(eid);
        if ((rc = req_init(s, &a, "DELETE", key, query, "abort an upload")) == 0) rc = req_run(&a);
        if (rc == -ENOENT) rc = 0; /* completed or aborted meanwhile */
        req_free(&a);
    }
    req_free(&r);
    return rc;
}

static int s3_remove_prefix(ckpt_storage *st, const char *prefix)
{
    s3 *s = (s3 *)st;
    names ns = {0};
    int rc = abort_uploads(s, prefix);
    if (rc == 0) rc = s3_list_files(st, prefix, take_name, &ns);
    req *rs = rc == 0 && ns.n ? calloc(ns.n, sizeof *rs) : NULL;
    if (rc == 0 && ns.n && !rs) rc = shm_fail(-ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < ns.n; i++)
        rc = req_init(s, &rs[i], "DELETE", ns.v[i], NULL, "remove");
    if (rc == 0 && ns.n) rc = run_many(s, rs, ns.n);
    for (size_t i = 0; i < ns.n; i++) {
        if (rs) req_free(&rs[i]);
        free(ns.v[i]);
    }
    free(rs);
    free(ns.v);
    return rc == -ENOENT ? 0 : rc;
}

/* ---- pointers ---------------------------------------------------------------- */

/* Reads pointer name: its value into buf and its ETag into etag. */
static int read_pointer(s3 *s, const char *name, char *buf, size_t cap, char *etag, size_t ecap)
{
    req r;
    int rc = req_init(s, &r, "GET", name, NULL, "read");
    r.limit = cap - 1;
    if (rc == 0) rc = req_run(&r);
    if (rc == -ENOENT) rc = shm_fail(rc, "s3://%s/%s: no such pointer", s->bucket, name);
    if (rc == 0) {
        snprintf(buf, cap, "%.*s", (int)r.body_len, r.body ? (const char *)r.body : "");
        snprintf(etag, ecap, "%s", r.etag);
    }
    req_free(&r);
    return rc;
}

static int s3_pointer(ckpt_storage *st, const char *name, char *buf, size_t cap)
{
    char etag[128];
    return read_pointer((s3 *)st, name, buf, cap, etag, sizeof etag);
}

/* A conditional PUT of value: 0, -ECANCELED (the condition failed), or an
 * error; *retried if an attempt's answer was lost and it went again. */
static int put_if(s3 *s, const char *name, const char *condition, const char *value, bool *retried)
{
    req r;
    int rc = req_init(s, &r, "PUT", name, NULL, "swap");
    if (rc == 0) {
        req_header(&r, condition);
        req_upload(&r, value, strlen(value));
        rc = req_run(&r);
    }
    *retried |= r.attempts > 1;
    req_free(&r);
    return rc;
}

static int s3_swap(ckpt_storage *st, const char *name, const char *expect, const char *value)
{
    s3 *s = (s3 *)st;
    char now[256], etag[128], cond[200];
    bool retried = false;
    int rc;
    if (!expect) {
        rc = put_if(s, name, "If-None-Match: *", value, &retried);
    } else if ((rc = read_pointer(s, name, now, sizeof now, etag, sizeof etag)) == 0) {
        if (strcmp(now, expect) != 0) {
            rc = -ECANCELED;
        } else {
            /* The ETag bare (radosgw compares it so), then quoted (as S3 sends it). */
            size_t n = strlen(etag);
            bool quoted = n >= 2 && etag[0] == '"' && etag[n - 1] == '"';
            snprintf(cond, sizeof cond, "If-Match: %.*s", quoted ? (int)n - 2 : (int)n,
                     etag + quoted);
            rc = put_if(s, name, cond, value, &retried);
            char again[128];
            if (rc == -ECANCELED && quoted && !retried &&
                read_pointer(s, name, now, sizeof now, again, sizeof again) == 0 &&
                strcmp(again, etag) == 0) {
                snprintf(cond, sizeof cond, "If-Match: %s", etag);
                rc = put_if(s, name, cond, value, &retried);
            }
        }
    } else if (rc == -ENOENT) {
        rc = -ECANCELED;
    }
    /* An attempt whose answer was lost went again and met its own write:
     * the pointer holds value (which, as each writer's values are its own,
     * no other writer sets). */
    if (rc == -ECANCELED && retried &&
        read_pointer(s, name, now, sizeof now, etag, sizeof etag) == 0 && strcmp(now, value) == 0)
        rc = 0;
    if (rc == -ECANCELED)
        rc = shm_fail(-ECANCELED, "s3://%s/%s: does not hold '%s'", s->bucket, name,
                      expect ? expect : "(nothing)");
    return rc;
}

/* ---- the connection ---------------------------------------------------------- */

/* The value of key in section profile of the AWS credentials file f. */
static bool ini_value(FILE *f, const char *profile, const char *key, char *out, size_t cap)
{
    rewind(f);
    char line[2048];
    bool in = false;
    while (fgets(line, sizeof line, f)) {
        char *p = line, *end = line + strlen(line);
        while (end > p && isspace((unsigned char)end[-1])) *--end = 0;
        while (isspace((unsigned char)*p)) p++;
        if (*p == '[') {
            char *close = strchr(p, ']');
            in = close && (size_t)(close - p - 1) == strlen(profile) &&
                 strncmp(p + 1, profile, strlen(profile)) == 0;
            continue;
        }
        char *eq = strchr(p, '=');
        if (!in || !eq) continue;
        char *k_end = eq;
        while (k_end > p && isspace((unsigned char)k_end[-1])) k_end--;
        if ((size_t)(k_end - p) != strlen(key) || strncmp(p, key, strlen(key)) != 0) continue;
        char *v = eq + 1;
        while (isspace((unsigned char)*v)) v++;
        snprintf(out, cap, "%s", v);
        return true;
    }
    return false;
}

/* Reads the credentials: the environment's, else the file's. */
static int credentials(s3 *s, const stash_storage_opts *o)
{
    char id[256] = "", secret[256] = "", token[2048] = "";
    const char *eid = getenv("AWS_ACCESS_KEY_ID"), *esecret = getenv("AWS_SECRET_ACCESS_KEY");
    if (!o->credentials && eid && *eid && esecret && *esecret) {
        snprintf(id, sizeof id, "%s", eid);
        snprintf(secret, sizeof secret, "%s", esecret);
        const char *etoken = getenv("AWS_SESSION_TOKEN");
        if (etoken) snprintf(token, sizeof token, "%s", etoken);
    } else {
        char path[4096];
        const char *home = getenv("HOME"), *env = getenv("AWS_SHARED_CREDENTIALS_FILE");
        if (o->credentials)
            snprintf(path, sizeof path, "%s", o->credentials);
        else if (env && *env)
            snprintf(path, sizeof path, "%s", env);
        else
            snprintf(path, sizeof path, "%s/.aws/credentials", home ? home : "");
        const char *profile = o->profile ? o->profile : getenv("AWS_PROFILE");
        if (!profile || !*profile) profile = "default";
        FILE *f = fopen(path, "re");
        if (!f)
            return shm_fail(-errno,
                            "%s: no S3 credentials: %s (nor AWS_ACCESS_KEY_ID and "
                            "AWS_SECRET_ACCESS_KEY set)",
                            s->base.where, strerror(errno));
        struct stat sb;
        /* Secrets another user could have written are not this user's. */
        if (fstat(fileno(f), &sb) < 0 || (sb.st_uid != geteuid() && sb.st_uid != 0) ||
            (sb.st_mode & 022)) {
            fclose(f);
            return shm_fail(-EACCES, "%s: %s may be written by others: not trusted for credentials",
                            s->base.where, path);
        }
        bool found = ini_value(f, profile, "aws_access_key_id", id, sizeof id) &&
                     ini_value(f, profile, "aws_secret_access_key", secret, sizeof secret);
        ini_value(f, profile, "aws_session_token", token, sizeof token);
        fclose(f);
        if (!found)
            return shm_fail(-ENOENT,
                            "%s: %s has no [%s] with aws_access_key_id and "
                            "aws_secret_access_key",
                            s->base.where, path, profile);
    }
    snprintf(s->userpwd, sizeof s->userpwd, "%s:%s", id, secret);
    if (token[0]) snprintf(s->token, sizeof s->token, "x-amz-security-token: %s", token);
    return 0;
}

static void s3_close(ckpt_storage *st)
{
    s3 *s = (s3 *)st;
    if (s->share) curl_share_cleanup(s->share);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++) pthread_mutex_destroy(&s->locks[i]);
    memset(s->userpwd, 0, sizeof s->userpwd);
    free(s);
}

static void global_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static int s3_open(const char *bucket, const stash_storage_opts *o, ckpt_storage **out)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, global_init);
    if (strlen(bucket) >= sizeof((s3 *)0)->bucket)
        return shm_fail(-EINVAL, "bucket name '%s' is too long", bucket);
    if (o->part_bytes && o->part_bytes < PART_MIN)
        return shm_fail(-EINVAL, "s3://%s: parts of %llu bytes: S3 takes at least %llu", bucket,
                        (unsigned long long)o->part_bytes, PART_MIN);
    s3 *s = calloc(1, sizeof *s);
    if (!s) return shm_fail(-ENOMEM, "out of memory");
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++) pthread_mutex_init(&s->locks[i], NULL);
    s->base.ops = &ckpt_s3_ops;
    snprintf(s->base.where, sizeof s->base.where, "s3://%s", bucket);
    snprintf(s->bucket, sizeof s->bucket, "%s", bucket);
    s->timeout_ms = o->timeout_ms ? o->timeout_ms : CKPT_STORAGE_TIMEOUT_MS;
    s->base.depth = o->depth ? o->depth : CKPT_STORAGE_DEPTH;
    s->base.part = o->part_bytes ? o->part_bytes : PART_DEFAULT;
    const char *region = o->region ? o->region : getenv("AWS_REGION");
    if (!region || !*region) region = getenv("AWS_DEFAULT_REGION");
    if (!region || !*region) region = "us-east-1";
    const char *endpoint = o->endpoint ? o->endpoint : getenv("AWS_ENDPOINT_URL_S3");
    if (!endpoint || !*endpoint) endpoint = getenv("AWS_ENDPOINT_URL");
    size_t elen = endpoint ? strlen(endpoint) : 0;
    while (elen && endpoint[elen - 1] == '/') elen--;
    /* A service of one's own takes the bucket in the path; AWS in the host. */
    if (elen)
        snprintf(s->url, sizeof s->url, "%.*s/%s", (int)elen, endpoint, bucket);
    else
        snprintf(s->url, sizeof s->url, "https://%s.s3.%s.amazonaws.com", bucket, region);
    snprintf(s->sigv4, sizeof s->sigv4, "aws:amz:%s:s3", region);
    int rc = credentials(s, o);
    if (rc == 0 && !(s->share = curl_share_init())) rc = shm_fail(-ENOMEM, "out of memory");
    if (rc == 0) {
        curl_share_setopt(s->share, CURLSHOPT_LOCKFUNC, share_lock);
        curl_share_setopt(s->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
        curl_share_setopt(s->share, CURLSHOPT_USERDATA, s);
        curl_share_setopt(s->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
        curl_share_setopt(s->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
        curl_share_setopt(s->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    }
    /* The bucket is there and these credentials reach it. */
    req r = {0};
    if (rc == 0 && (rc = req_init(s, &r, "HEAD", "", NULL, "open the bucket")) == 0)
        rc = req_run(&r);
    req_free(&r);
    if (rc == -ENOENT) rc = shm_fail(-ENOENT, "s3://%s: no such bucket (at %s)", bucket, s->url);
    if (rc) {
        s3_close(&s->base);
        return rc;
    }
    *out = &s->base;
    return 0;
}

const ckpt_storage_ops ckpt_s3_ops = {
    .version = CKPT_STORAGE_VERSION,
    .scheme = "s3",
    .container = "BUCKET",
    .caps = CKPT_CAN_SWAP,
    .open = s3_open,
    .close = s3_close,
    .put_whole = s3_put_whole,
    .put_begin = s3_put_begin,
    .put_part = s3_put_part,
    .put_end = s3_put_end,
    .put_abort = s3_put_abort,
    .get_range = s3_get_range,
    .file_size = s3_file_size,
    .remove_file = s3_remove,
    .list_files = s3_list_files,
    .remove_prefix = s3_remove_prefix,
    .swap = s3_swap,
    .pointer = s3_pointer,
    .remove = s3_remove,
};
