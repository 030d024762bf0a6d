/* SPDX-License-Identifier: MIT */
/*
 * workload.c: the crash campaigns' workload and its model (workload.h).
 */
#include "tests/crash/workload.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

uint64_t wl_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t key_of(uint64_t i)
{
    return wl_mix64(i) % WL_KEYS;
}
static uint64_t weight_of(uint64_t i)
{
    return wl_mix64(i ^ 0x5bd1e995ull);
}

/* A key's ValueState: how many events it saw and the sum of their weights. */
typedef struct sum {
    uint64_t count, total;
} sum;

typedef struct model {
    sum sums[WL_KEYS];
    uint64_t classes[WL_KEYS][WL_CLASSES];
    uint64_t *marks;             /* every key's marks, key after key */
    uint64_t first[WL_KEYS + 1]; /* key k's marks are marks[first[k] .. first[k+1]) */
} model;

/* The state every key has after events [0, offset). */
static model *model_at(uint64_t offset)
{
    model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    uint64_t nmarks[WL_KEYS] = {0};
    for (uint64_t i = 0; i < offset; i++) {
        uint64_t k = key_of(i);
        m->sums[k].count++;
        m->sums[k].total += weight_of(i);
        m->classes[k][i % WL_CLASSES]++;
        nmarks[k] += i % WL_MARK_EVERY == 0;
    }
    for (uint32_t k = 0; k < WL_KEYS; k++) m->first[k + 1] = m->first[k] + nmarks[k];
    m->marks = malloc((m->first[WL_KEYS] + 1) * sizeof *m->marks);
    if (!m->marks) {
        free(m);
        return NULL;
    }
    memset(nmarks, 0, sizeof nmarks);
    for (uint64_t i = 0; i < offset; i += WL_MARK_EVERY) {
        uint64_t k = key_of(i);
        m->marks[m->first[k] + nmarks[k]++] = i;
    }
    return m;
}

static void model_free(model *m)
{
    if (m) free(m->marks);
    free(m);
}

static bool owned(wl_job *j, uint64_t key)
{
    uint32_t kg = stash_key_group(&key, sizeof key, j->maxp);
    return kg >= j->range.first && kg <= j->range.last;
}

int wl_check(wl_job *j, uint64_t offset, uint64_t *keys, uint64_t *bad)
{
    model *m = model_at(offset);
    if (!m) return -ENOMEM;
    *keys = *bad = 0;
    int rc = 0;
    for (uint64_t k = 0; k < WL_KEYS && rc == 0; k++) {
        if (!owned(j, k)) continue;
        (*keys)++;
        if ((rc = stash_key_set(j->w, &k, sizeof k)) < 0) break;
        stash_bytes v;
        sum s = {0};
        rc = stash_value_get(j->sums, &v);
        if (rc == 0 && v.len == sizeof s)
            memcpy(&s, v.data, sizeof s);
        else if (rc == 0)
            s.count = UINT64_MAX;
        else if (rc != STASH_ENOTFOUND)
            break;
        *bad += s.count != m->sums[k].count || s.total != m->sums[k].total;
        for (uint8_t c = 0; c < WL_CLASSES; c++) {
            uint64_t n = 0;
            rc = stash_map_get(j->classes, &c, 1, &v);
            if (rc == 0)
                memcpy(&n, v.data, v.len == sizeof n ? sizeof n : 0);
            else if (rc != STASH_ENOTFOUND)
                break;
            *bad += n != m->classes[k][c] || (rc == 0 && v.len != sizeof n);
        }
        if (rc < 0 && rc != STASH_ENOTFOUND) break;
        stash_iter it;
        uint64_t at = m->first[k], end = m->first[k + 1];
        rc = stash_list_get(j->marks, &it);
        if (rc == 0) {
            while ((rc = stash_iter_next(&it, NULL, &v)) == 1) {
                uint64_t i;
                memcpy(&i, v.data, v.len == sizeof i ? sizeof i : 0);
                *bad += at >= end || v.len != sizeof i || i != m->marks[at];
                at++;
            }
            if (rc < 0) break;
        } else if (rc != STASH_ENOTFOUND) {
            break;
        }
        *bad += at < end ? end - at : 0;
        rc = 0;
    }
    model_free(m);
    return rc;
}

int wl_apply(wl_job *j, uint64_t i)
{
    uint64_t k = key_of(i);
    if (!owned(j, k)) return 0;
    int rc = stash_key_set(j->w, &k, sizeof k);
    if (rc < 0) return rc;
    stash_bytes v;
    sum s = {0};
    rc = stash_value_get(j->sums, &v);
    if (rc == 0)
        memcpy(&s, v.data, v.len == sizeof s ? sizeof s : 0);
    else if (rc != STASH_ENOTFOUND)
        return rc;
    s.count++;
    s.total += weight_of(i);
    if ((rc = stash_value_put(j->sums, &s, sizeof s)) < 0) return rc;
    uint8_t c = (uint8_t)(i % WL_CLASSES);
    uint64_t n = 0;
    rc = stash_map_get(j->classes, &c, 1, &v);
    if (rc == 0)
        memcpy(&n, v.data, v.len == sizeof n ? sizeof n : 0);
    else if (rc != STASH_ENOTFOUND)
        return rc;
    n++;
    if ((rc = stash_map_put(j->classes, &c, 1, &n, sizeof n)) < 0) return rc;
    if (i % WL_MARK_EVERY == 0) rc = stash_list_add(j->marks, &i, sizeof i);
    return rc < 0 ? rc : 0;
}

int wl_open(wl_job *j, stash_worker *w, uint32_t maxp, const char **what)
{
    *j = (wl_job){.w = w, .maxp = maxp};
    stash_worker_info info;
    stash_worker_info_get(w, &info);
    j->range = info.range;
    const struct {
        const char *name;
        stash_kind kind;
        stash_state **out;
    } states[] = {{"sums", STASH_VALUE, &j->sums},
                  {"classes", STASH_MAP, &j->classes},
                  {"marks", STASH_LIST, &j->marks},
                  {"offset", STASH_OP_LIST, &j->offset}};
    for (size_t s = 0; s < sizeof states / sizeof states[0]; s++) {
        *what = states[s].name;
        int rc = stash_state_get(w,
                                 &(stash_state_desc){.sz = sizeof(stash_state_desc),
                                                     .name = states[s].name,
                                                     .kind = states[s].kind},
                                 states[s].out);
        if (rc < 0) return rc;
    }
    return 0;
}

uint64_t wl_offset(wl_job *j)
{
    const stash_bytes *el;
    size_t n;
    uint64_t at = 0;
    if (stash_op_list_get(j->offset, &el, &n) == 0 && n == 1 && el[0].len == sizeof at)
        memcpy(&at, el[0].data, sizeof at);
    return at;
}

int wl_record(wl_job *j, uint64_t next)
{
    stash_bytes b = {&next, sizeof next};
    return stash_op_list_update(j->offset, &b, 1);
}

int wl_step(wl_job *j, uint64_t i, const char **what)
{
    *what = "apply an event";
    int rc = wl_apply(j, i);
    if (rc == 0) {
        *what = "record its offset";
        rc = wl_record(j, i + 1);
    }
    return rc;
}
