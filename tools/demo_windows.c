/* SPDX-License-Identifier: MIT */
/*
 * demo_windows.c: the demo's event-time windows and their sink. A window
 * fired is staged in the worker's memory; the barrier that cuts checkpoint
 * N moves what is staged into operator ListState as transaction N, so the
 * checkpoint holds it; when N is complete the worker appends the
 * transactions up to N to its output file with a commit line each, synced,
 * and drops them from the outbox. A worker that starts (rolled back or
 * restored) first cuts off a transaction its output file holds half, then
 * commits those of its restored outbox the file lacks: the commit is
 * idempotent, by transaction id.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools/demo_windows.h"

#define LATENESS_MS 5000ull /* how far out of order events come */

/* A fired window as staged and as a transaction holds it. */
typedef struct window_out {
    uint64_t user;
    uint32_t window;
    uint32_t count;
} window_out;

uint64_t demo_event_time(uint64_t i)
{
    uint64_t x = (i + 1) * 0xd1b54a32d192ed03ull;
    x ^= x >> 29;
    return i + LATENESS_MS - x % LATENESS_MS;
}

uint64_t demo_watermark(uint64_t i)
{
    return i; /* every event after i happens after i + 1 */
}

static int fail_errno(void)
{
    return -errno;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return fail_errno();
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Reads all of file fd into a new buffer (*len bytes, NUL-terminated). */
static int read_whole(int fd, char **out, size_t *len)
{
    struct stat st;
    if (fstat(fd, &st) < 0) return fail_errno();
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) return -ENOMEM;
    size_t n = 0;
    while (n < (size_t)st.st_size) {
        ssize_t k = pread(fd, buf + n, (size_t)st.st_size - n, (off_t)n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            free(buf);
            return k < 0 ? fail_errno() : -EIO;
        }
        n += (size_t)k;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

/* Calls fn for each window line of the committed transactions of text
 * (n bytes); returns the length of that committed part and sets *last to
 * the newest transaction id in it (0 if none). */
static size_t each_committed(const char *text, size_t n, uint64_t *last,
                             void (*fn)(const window_out *o, void *ctx), void *ctx)
{
    size_t valid = 0, at = 0, txn_start = 0;
    *last = 0;
    while (at < n) {
        const char *nl = memchr(text + at, '\n', n - at);
        if (!nl) break; /* a line half written */
        uint64_t id;
        if (sscanf(text + at, "commit %" SCNu64, &id) == 1) {
            if (fn)
                for (size_t p = txn_start; p < at;) {
                    window_out o;
                    if (sscanf(text + p, "%" SCNu64 " %" SCNu32 " %" SCNu32, &o.user, &o.window,
                               &o.count) == 3)
                        fn(&o, ctx);
                    p = (size_t)((const char *)memchr(text + p, '\n', n - p) - text) + 1;
                }
            *last = id;
            valid = (size_t)(nl - text) + 1;
            txn_start = valid;
        }
        at = (size_t)(nl - text) + 1;
    }
    return valid;
}

/* Appends transaction id's windows and its commit line, synced. */
static int commit_txn(demo_windows *d, uint64_t id, const window_out *o, size_t n)
{
    size_t cap = n * 48 + 32, len = 0;
    char *text = malloc(cap);
    if (!text) return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(text + len, cap - len, "%" PRIu64 " %" PRIu32 " %" PRIu32 "\n",
                                o[i].user, o[i].window, o[i].count);
    len += (size_t)snprintf(text + len, cap - len, "commit %" PRIu64 "\n", id);
    int rc = write_all(d->out, text, len);
    free(text);
    if (rc == 0 && fdatasync(d->out) < 0) rc = fail_errno();
    if (rc == 0) {
        d->committed = id;
        d->emitted += n;
    }
    return rc;
}

/* Commits the outbox's transactions up to id (all with UINT64_MAX) that
 * the file lacks, and keeps the others in it. */
static int commit_outbox(demo_windows *d, uint64_t id, bool restored)
{
    const stash_bytes *el;
    size_t n, kept = 0;
    int rc = stash_op_list_get(d->outbox, &el, &n);
    if (rc < 0) return rc;
    stash_bytes *keep = calloc(n ? n : 1, sizeof *keep);
    if (!keep) return -ENOMEM;
    for (size_t i = 0; i < n && rc == 0; i++) {
        uint64_t txn;
        memcpy(&txn, el[i].data, sizeof txn);
        if (txn > id) {
            keep[kept++] = el[i];
            continue;
        }
        if (txn <= d->committed) {
            d->skipped += restored;
            continue;
        }
        size_t nw = (el[i].len - sizeof txn) / sizeof(window_out);
        window_out *o = malloc(nw ? nw * sizeof *o : 1);
        if (!o) {
            rc = -ENOMEM;
            break;
        }
        memcpy(o, (const uint8_t *)el[i].data + sizeof txn, nw * sizeof *o);
        rc = commit_txn(d, txn, o, nw);
        free(o);
        d->recommitted += restored;
    }
    if (rc == 0 && kept < n) rc = stash_op_list_update(d->outbox, keep, kept);
    free(keep);
    return rc;
}

int demo_windows_open(demo_windows *d, stash_worker *w, uint32_t index, const char *dir)
{
    *d = (demo_windows){.w = w, .out = -1};
    int rc = stash_state_get(
        w,
        &(stash_state_desc){.sz = sizeof(stash_state_desc), .name = "windows", .kind = STASH_VALUE},
        &d->counts);
    if (rc == 0)
        rc = stash_state_get(w,
                             &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                 .name = "outbox",
                                                 .kind = STASH_OP_LIST},
                             &d->outbox);
    if (rc == 0) rc = stash_timers_get(w, "window-ends", &d->timers);
    if (rc < 0) return rc;
    char path[512];
    snprintf(path, sizeof path, "%s/windows-%u.out", dir, index);
    d->out = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (d->out < 0) return fail_errno();
    char *text;
    size_t len;
    if ((rc = read_whole(d->out, &text, &len)) < 0) return rc;
    size_t valid = each_committed(text, len, &d->committed, NULL, NULL);
    free(text);
    if (ftruncate(d->out, (off_t)valid) < 0 || lseek(d->out, 0, SEEK_END) < 0) return fail_errno();
    /* The outbox came back with a complete checkpoint: all of it is due. */
    return commit_outbox(d, UINT64_MAX, true);
}

int demo_windows_add(demo_windows *d, uint64_t i)
{
    uint32_t win = (uint32_t)(demo_event_time(i) / WINDOW_MS);
    stash_bytes v;
    uint64_t n = 0;
    int rc = stash_state_namespace(d->counts, &win, sizeof win);
    if (rc == 0 && stash_value_get(d->counts, &v) == 0) memcpy(&n, v.data, sizeof n);
    n++;
    if (rc == 0) rc = stash_value_put(d->counts, &n, sizeof n);
    if (rc == 0)
        rc = stash_timer_register(d->timers, STASH_EVENT_TIME, &win, sizeof win,
                                  (win + 1) * WINDOW_MS - 1);
    return rc;
}

/* A window's timer: its count is read, staged for output and cleared. */
static int fire(const stash_timer *t, void *ctx)
{
    demo_windows *d = ctx;
    window_out o = {0};
    stash_bytes v;
    uint64_t n = 0;
    if (t->key.len != sizeof o.user || t->ns.len != sizeof o.window) return -EINVAL;
    memcpy(&o.user, t->key.data, sizeof o.user);
    memcpy(&o.window, t->ns.data, sizeof o.window);
    int rc = stash_state_namespace(d->counts, t->ns.data, t->ns.len);
    if (rc == 0 && stash_value_get(d->counts, &v) == 0) memcpy(&n, v.data, sizeof n);
    o.count = (uint32_t)n;
    if (rc == 0) rc = stash_state_clear(d->counts);
    if (rc < 0) return rc;
    if (d->staged_len + sizeof o > d->staged_cap) {
        size_t cap = d->staged_cap ? 2 * d->staged_cap : 4096;
        uint8_t *grown = realloc(d->staged, cap);
        if (!grown) return -ENOMEM;
        d->staged = grown;
        d->staged_cap = cap;
    }
    memcpy(d->staged + d->staged_len, &o, sizeof o);
    d->staged_len += sizeof o;
    return 0;
}

int demo_windows_advance(demo_windows *d, uint64_t watermark)
{
    int64_t n = stash_timers_advance(d->timers, watermark, fire, d);
    return n < 0 ? (int)n : 0;
}

int demo_windows_cut(stash_worker *w, uint64_t id, void *ctx)
{
    (void)w;
    demo_windows *d = ctx;
    if (d->staged_len == 0) return 0;
    uint8_t *txn = malloc(sizeof id + d->staged_len);
    if (!txn) return -ENOMEM;
    memcpy(txn, &id, sizeof id);
    memcpy(txn + sizeof id, d->staged, d->staged_len);
    int rc = stash_op_list_add(d->outbox, txn, sizeof id + d->staged_len);
    free(txn);
    if (rc == 0) d->staged_len = 0;
    return rc;
}

int demo_windows_complete(demo_windows *d, uint64_t id)
{
    return commit_outbox(d, id, false);
}

void demo_windows_close(demo_windows *d)
{
    if (d->out >= 0) close(d->out);
    free(d->staged);
    *d = (demo_windows){.out = -1};
}

/* ---- the check ------------------------------------------------------------- */

typedef struct tally {
    uint32_t *want;
    uint8_t *seen;
    uint64_t users, nwin, twice, wrong;
} tally;

static void count_line(const window_out *o, void *ctx)
{
    tally *t = ctx;
    if (o->user >= t->users || o->window >= t->nwin) {
        t->wrong++;
        return;
    }
    size_t at = o->user * t->nwin + o->window;
    if (t->seen[at]++) t->twice++;
    t->wrong += o->count != t->want[at];
}

int demo_windows_check(const char *dir, uint32_t workers, uint64_t events, uint64_t users,
                       uint64_t (*user_of)(uint64_t), uint64_t *windows, uint64_t *missing,
                       uint64_t *twice, uint64_t *wrong)
{
    tally t = {.users = users, .nwin = (events + LATENESS_MS) / WINDOW_MS + 1};
    t.want = calloc(users * t.nwin, sizeof *t.want);
    t.seen = calloc(users * t.nwin, 1);
    int rc = t.want && t.seen ? 0 : -ENOMEM;
    for (uint64_t i = 0; rc == 0 && i < events; i++)
        t.want[user_of(i) * t.nwin + demo_event_time(i) / WINDOW_MS]++;
    for (uint32_t k = 0; rc == 0 && k < workers; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/windows-%u.out", dir, k);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            rc = fail_errno();
            break;
        }
        char *text;
        size_t len;
        uint64_t last;
        rc = read_whole(fd, &text, &len);
        close(fd);
        if (rc == 0) each_committed(text, len, &last, count_line, &t);
        if (rc == 0) free(text);
    }
    *windows = *missing = 0;
    for (size_t at = 0; rc == 0 && at < users * t.nwin; at++) {
        *windows += t.want[at] > 0;
        *missing += t.want[at] > 0 && !t.seen[at];
    }
    *twice = t.twice;
    *wrong = t.wrong;
    free(t.want);
    free(t.seen);
    return rc;
}
