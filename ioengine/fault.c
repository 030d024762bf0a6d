/* SPDX-License-Identifier: MIT */
/*
 * fault.c: the fault specification that tests (through ioe_fault_set() or
 * ioe_opts.faults) and operators (through $STASH_IO_FAULT) give the engine,
 * and the choice of which request a fault hits.
 *
 * Grammar: items separated by commas, each one of
 *   write:N:ERR   the Nth write request fails with ERR (N counts from 1)
 *   read:N:ERR    the Nth read request fails with ERR
 *   fsync:N:ERR   the Nth fsync or fdatasync request fails with ERR
 *   short         every read and write attempt moves at most half of what remains
 *   delay:MS      every completion is held MS milliseconds before it is delivered
 *   setup:ERR     io_uring setup fails with ERR (at ioe_engine_open() only)
 * ERR is an errno name such as EIO or ENOSPC, or its number.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ioengine/ioengine.h"

static const struct {
    const char *name;
    int err;
} errnames[] = {
    {"EIO", EIO},
    {"ENOSPC", ENOSPC},
    {"EDQUOT", EDQUOT},
    {"EROFS", EROFS},
    {"EFBIG", EFBIG},
    {"EBADF", EBADF},
    {"EINVAL", EINVAL},
    {"EPERM", EPERM},
    {"ENOSYS", ENOSYS},
    {"ENOMEM", ENOMEM},
    {"EAGAIN", EAGAIN},
    {"EINTR", EINTR},
    {"ETIMEDOUT", ETIMEDOUT},
    {"ECONNRESET", ECONNRESET},
};

/* Parses a decimal number that fills all of [s, end). */
static int parse_number(const char *s, const char *end, uint64_t *out)
{
    if (s == end) return -EINVAL;
    uint64_t v = 0;
    for (const char *p = s; p < end; p++) {
        if (*p < '0' || *p > '9' || v > (UINT64_MAX - 9) / 10) return -EINVAL;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *out = v;
    return 0;
}

/* Parses an errno name or number that fills all of [s, end). */
static int parse_errno(const char *s, const char *end, int *out)
{
    size_t n = (size_t)(end - s);
    for (size_t i = 0; i < sizeof errnames / sizeof errnames[0]; i++) {
        if (strlen(errnames[i].name) == n && memcmp(errnames[i].name, s, n) == 0) {
            *out = errnames[i].err;
            return 0;
        }
    }
    uint64_t v;
    if (parse_number(s, end, &v) < 0 || v == 0 || v > 4095) return -EINVAL;
    *out = (int)v;
    return 0;
}

/* Whether [s, end) starts with word followed by ':'; moves *s past it. */
static bool take_word(const char **s, const char *end, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(end - *s) <= n || memcmp(*s, word, n) != 0 || (*s)[n] != ':') return false;
    *s += n + 1;
    return true;
}

/* Parses one "op:N:ERR" rule from [s, end). */
static int parse_rule(ioe_faults *f, int op, const char *s, const char *end)
{
    const char *colon = memchr(s, ':', (size_t)(end - s));
    if (!colon || f->nrules == IOE_MAX_FAULT_RULES) return -EINVAL;
    uint64_t nth;
    int err;
    if (parse_number(s, colon, &nth) < 0 || nth == 0) return -EINVAL;
    if (parse_errno(colon + 1, end, &err) < 0) return -EINVAL;
    f->rule[f->nrules].op = op;
    f->rule[f->nrules].nth = nth;
    f->rule[f->nrules].err = err;
    f->nrules++;
    return 0;
}

static int parse_item(ioe_faults *f, const char *s, const char *end)
{
    if ((size_t)(end - s) == 5 && memcmp(s, "short", 5) == 0) {
        f->short_io = true;
        return 0;
    }
    if (take_word(&s, end, "write")) return parse_rule(f, IOE_WRITE, s, end);
    if (take_word(&s, end, "read")) return parse_rule(f, IOE_READ, s, end);
    if (take_word(&s, end, "fsync")) return parse_rule(f, IOE_FSYNC, s, end);
    if (take_word(&s, end, "setup")) return parse_errno(s, end, &f->setup_err);
    if (take_word(&s, end, "delay")) {
        uint64_t ms;
        if (parse_number(s, end, &ms) < 0 || ms > 60000) return -EINVAL;
        f->delay_ms = (uint32_t)ms;
        return 0;
    }
    return -EINVAL;
}

int ioe_faults_parse(const char *spec, ioe_faults *out)
{
    ioe_faults f = {0};
    for (const char *s = spec; s && *s;) {
        const char *end = strchr(s, ',');
        if (!end) end = s + strlen(s);
        if (parse_item(&f, s, end) < 0) return -EINVAL;
        if (!*end) break;
        s = end + 1;
        if (!*s) return -EINVAL; /* a trailing comma */
    }
    *out = f;
    return 0;
}

/* The counter index of a request kind: fsync and fdatasync count together. */
static int kind_of(int op)
{
    switch (op) {
    case IOE_WRITE:
        return 0;
    case IOE_READ:
        return 1;
    default:
        return 2;
    }
}

int ioe_faults_pick(ioe_faults *f, int op)
{
    int k = kind_of(op);
    uint64_t n = ++f->count[k];
    for (unsigned i = 0; i < f->nrules; i++)
        if (kind_of(f->rule[i].op) == k && f->rule[i].nth == n) return f->rule[i].err;
    return 0;
}
