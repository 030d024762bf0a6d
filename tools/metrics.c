/* SPDX-License-Identifier: MIT */
/*
 * metrics.c: the arena, its workers, its service and its checkpoints as
 * Prometheus' text format (0.0.4): what `stash status --prom` prints once
 * and `stash serve --metrics` serves at /metrics.
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "include/stash.h"
#include "tools/tools.h"

/* One metric family's HELP and TYPE lines. */
static void family(FILE *out, const char *name, const char *type, const char *help)
{
    fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value: backslashes, quotes and line feeds escaped. */
static void label_value(FILE *out, const char *s)
{
    for (const char *p = s; *p; p++)
        fprintf(out, *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : "%c", *p);
}

static uint64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void arena_metrics(FILE *out, stash_arena *a, const stash_arena_info *info, bool per_kg)
{
    family(out, "stash_arena_info", "gauge", "The arena's facts as labels; always 1.");
    fprintf(out, "stash_arena_info{path=\"");
    label_value(out, info->path);
    fprintf(out, "\",backend=\"%s\",version=\"%s\"} 1\n",
            info->backend == STASH_BACKEND_LMDB ? "lmdb" : "heap", stash_version());
    family(out, "stash_arena_size_bytes", "gauge", "Bytes of the arena.");
    fprintf(out, "stash_arena_size_bytes %llu\n", (unsigned long long)info->size);
    family(out, "stash_arena_key_groups", "gauge", "Key groups (the max parallelism).");
    fprintf(out, "stash_arena_key_groups %u\n", info->max_parallelism);
    uint64_t used = 0, fr = 0;
    for (uint32_t kg = 0; kg < info->max_parallelism; kg++) {
        stash_kg_usage u;
        stash_kg_usage_get(a, kg, &u);
        used += u.used_bytes;
        fr += u.free_bytes;
    }
    family(out, "stash_arena_used_bytes", "gauge",
           "Bytes handed out to records in key-group heaps.");
    fprintf(out, "stash_arena_used_bytes %llu\n", (unsigned long long)used);
    family(out, "stash_arena_free_bytes", "gauge",
           "Bytes free: held by key-group heaps for reuse, or in no key group yet.");
    fprintf(out, "stash_arena_free_bytes{where=\"key_groups\"} %llu\n", (unsigned long long)fr);
    fprintf(out, "stash_arena_free_bytes{where=\"pool\"} %llu\n",
            (unsigned long long)info->pool_free_bytes);
    if (!per_kg) return;
    /* Each key group's two figures, as one family after the other. */
    static const char *const name[2] = {"stash_key_group_used_bytes", "stash_key_group_free_bytes"};
    static const char *const help[2] = {"Bytes handed out to records, per key group.",
                                        "Bytes a key group's heap holds for reuse, per key group."};
    for (int f = 0; f < 2; f++) {
        family(out, name[f], "gauge", help[f]);
        for (uint32_t kg = 0; kg < info->max_parallelism; kg++) {
            stash_kg_usage u;
            stash_kg_usage_get(a, kg, &u);
            fprintf(out, "%s{kg=\"%u\"} %llu\n", name[f], kg,
                    (unsigned long long)(f ? u.free_bytes : u.used_bytes));
        }
    }
}

static void worker_metrics(FILE *out, const stash_worker_info *w, size_t nw, uint64_t now)
{
    family(out, "stash_worker_up", "gauge", "1 while the worker's process lives, 0 once it died.");
    for (size_t i = 0; i < nw; i++)
        fprintf(out, "stash_worker_up{index=\"%u\"} %d\n", w[i].index,
                w[i].state == STASH_WORKER_LIVE);
    family(out, "stash_worker_key_groups", "gauge", "Key groups the worker owns.");
    for (size_t i = 0; i < nw; i++)
        fprintf(out, "stash_worker_key_groups{index=\"%u\"} %u\n", w[i].index,
                stash_kg_range_size(w[i].range));
    family(out, "stash_worker_last_barrier_age_seconds", "gauge",
           "Seconds since the worker's last barrier: a stuck worker's grows.");
    for (size_t i = 0; i < nw; i++)
        fprintf(out, "stash_worker_last_barrier_age_seconds{index=\"%u\"} %.3f\n", w[i].index,
                now > w[i].heartbeat_ns ? (double)(now - w[i].heartbeat_ns) / 1e9 : 0.0);
    family(out, "stash_worker_takeovers_total", "counter",
           "Times the worker's slot was joined after its first holder.");
    for (size_t i = 0; i < nw; i++)
        fprintf(out, "stash_worker_takeovers_total{index=\"%u\"} %u\n", w[i].index,
                w[i].generation ? w[i].generation - 1 : 0);
}

/* The operation counters of every index that has a worker or had one. */
static void op_metrics(FILE *out, stash_arena *a, const stash_worker_info *w, size_t nw)
{
    stash_op_counts *c = calloc(STASH_MAX_WORKERS, sizeof *c);
    bool *shown = calloc(STASH_MAX_WORKERS, sizeof *shown);
    if (!c || !shown) {
        free(c);
        free(shown);
        return;
    }
    for (size_t i = 0; i < nw; i++) shown[w[i].index] = true;
    for (uint32_t i = 0; i < STASH_MAX_WORKERS; i++) {
        stash_op_counts_get(a, i, &c[i]);
        const stash_op_counts *o = &c[i];
        shown[i] |= o->value_reads || o->value_writes || o->list_reads || o->list_writes ||
                    o->map_reads || o->map_writes || o->merging_reads || o->merging_writes ||
                    o->rollbacks;
    }
    family(out, "stash_worker_rollbacks_total", "counter",
           "Rollbacks to a checkpoint by the workers of the index.");
    for (uint32_t i = 0; i < STASH_MAX_WORKERS; i++)
        if (shown[i])
            fprintf(out, "stash_worker_rollbacks_total{index=\"%u\"} %llu\n", i,
                    (unsigned long long)c[i].rollbacks);
    family(out, "stash_worker_state_operations_total", "counter",
           "State operations of the worker index by state kind: reads (get, iterate, contains) "
           "and writes (put, add, remove, clear).");
    for (uint32_t i = 0; i < STASH_MAX_WORKERS; i++) {
        if (!shown[i]) continue;
        const stash_op_counts *o = &c[i];
        const struct {
            const char *kind;
            uint64_t reads, writes;
        } k[] = {{"value", o->value_reads, o->value_writes},
                 {"list", o->list_reads, o->list_writes},
                 {"map", o->map_reads, o->map_writes},
                 {"merging", o->merging_reads, o->merging_writes}};
        for (size_t j = 0; j < sizeof k / sizeof k[0]; j++)
            fprintf(out,
                    "stash_worker_state_operations_total{index=\"%u\",kind=\"%s\",op=\"read\"} "
                    "%llu\n"
                    "stash_worker_state_operations_total{index=\"%u\",kind=\"%s\",op=\"write\"} "
                    "%llu\n",
                    i, k[j].kind, (unsigned long long)k[j].reads, i, k[j].kind,
                    (unsigned long long)k[j].writes);
    }
    free(c);
    free(shown);
}

static void service_metrics(FILE *out, const stash_service_info *sv, uint64_t now)
{
    family(out, "stash_service_up", "gauge", "1 while a persistence engine serves the arena.");
    fprintf(out, "stash_service_up %d\n", sv->pid != 0);
    family(out, "stash_checkpoints_completed_total", "counter",
           "Checkpoints and savepoints committed since the arena was created.");
    fprintf(out, "stash_checkpoints_completed_total %llu\n",
            (unsigned long long)sv->completed_total);
    family(out, "stash_checkpoints_failed_total", "counter",
           "Checkpoints and savepoints failed since the arena was created.");
    fprintf(out, "stash_checkpoints_failed_total %llu\n", (unsigned long long)sv->failed_total);
    family(out, "stash_checkpoint_in_progress", "gauge", "1 while a checkpoint is being cut.");
    fprintf(out, "stash_checkpoint_in_progress %d\n", sv->pending != 0);
    family(out, "stash_checkpoint_last_completed_id", "gauge",
           "The newest complete checkpoint's id.");
    fprintf(out, "stash_checkpoint_last_completed_id %llu\n", (unsigned long long)sv->completed);
    family(out, "stash_checkpoints_failed_in_a_row", "gauge",
           "Checkpoints failed since the last complete one.");
    fprintf(out, "stash_checkpoints_failed_in_a_row %u\n", sv->failing);
    family(out, "stash_io_info", "gauge", "The persistence engine's I/O backend as a label; 1.");
    fprintf(out, "stash_io_info{backend=\"%s\"} 1\n", sv->io_backend[0] ? sv->io_backend : "none");
    family(out, "stash_io_written_bytes_total", "counter",
           "Bytes the persistence engines' writes moved (checkpoints).");
    fprintf(out, "stash_io_written_bytes_total %llu\n", (unsigned long long)sv->io_bytes_written);
    family(out, "stash_io_read_bytes_total", "counter",
           "Bytes the persistence engines' reads moved (restores, incremental bases).");
    fprintf(out, "stash_io_read_bytes_total %llu\n", (unsigned long long)sv->io_bytes_read);
    family(out, "stash_io_errors_total", "counter", "I/O requests of the engines that failed.");
    fprintf(out, "stash_io_errors_total %llu\n", (unsigned long long)sv->io_errors);
    if (sv->restored_at_ns) {
        family(out, "stash_restore_last_id", "gauge",
               "The checkpoint or savepoint the arena was restored from.");
        fprintf(out, "stash_restore_last_id %llu\n", (unsigned long long)sv->restored_id);
        family(out, "stash_restore_last_duration_seconds", "gauge", "How long that restore took.");
        fprintf(out, "stash_restore_last_duration_seconds %.6f\n", (double)sv->restored_ns / 1e9);
        family(out, "stash_restore_last_records", "gauge", "Records that restore restored.");
        fprintf(out, "stash_restore_last_records %llu\n", (unsigned long long)sv->restored_records);
        family(out, "stash_restore_last_timestamp_seconds", "gauge",
               "When that restore ended, seconds since the epoch.");
        fprintf(out, "stash_restore_last_timestamp_seconds %.3f\n",
                (double)sv->restored_at_ns / 1e9);
    }
    /* The newest complete one of the recent, newest first, and the newest
     * incremental one. */
    const stash_checkpoint_info *last = NULL, *delta = NULL;
    for (uint32_t i = 0; i < sv->nrecent; i++) {
        if (sv->recent[i].status) continue;
        if (!last) last = &sv->recent[i];
        if (!delta && sv->recent[i].incremental) delta = &sv->recent[i];
    }
    if (delta) {
        family(out, "stash_checkpoint_last_incremental_size_bytes", "gauge",
               "Bytes the newest complete incremental checkpoint wrote.");
        fprintf(out, "stash_checkpoint_last_incremental_size_bytes %llu\n",
                (unsigned long long)delta->bytes);
    }
    if (!last) return;
    family(out, "stash_checkpoint_last_duration_seconds", "gauge",
           "How long the newest complete checkpoint took.");
    fprintf(out, "stash_checkpoint_last_duration_seconds %.6f\n", (double)last->duration_ns / 1e9);
    family(out, "stash_checkpoint_last_size_bytes", "gauge",
           "Bytes the newest complete checkpoint wrote.");
    fprintf(out, "stash_checkpoint_last_size_bytes{incremental=\"%s\"} %llu\n",
            last->incremental ? "true" : "false", (unsigned long long)last->bytes);
    family(out, "stash_checkpoint_last_longest_cut_seconds", "gauge",
           "The longest synchronous cut of a worker in the newest complete checkpoint.");
    fprintf(out, "stash_checkpoint_last_longest_cut_seconds %.9f\n", (double)last->pause_ns / 1e9);
    family(out, "stash_checkpoint_seconds_since_last_complete", "gauge",
           "Seconds since the newest complete checkpoint ended.");
    uint64_t end = last->started_ns + last->duration_ns;
    fprintf(out, "stash_checkpoint_seconds_since_last_complete %.3f\n",
            now > end ? (double)(now - end) / 1e9 : 0.0);
}

int tool_metrics(FILE *out, stash_arena *a, bool per_kg)
{
    stash_arena_info info;
    stash_arena_info_get(a, &info);
    stash_worker_info *w = calloc(STASH_MAX_WORKERS, sizeof *w);
    if (!w) return -ENOMEM;
    size_t nw = 0;
    stash_registry_list(a, w, STASH_MAX_WORKERS, &nw);
    stash_service_info sv;
    stash_service_info_get(a, &sv);
    uint64_t now = wall_ns();
    arena_metrics(out, a, &info, per_kg);
    worker_metrics(out, w, nw, now);
    op_metrics(out, a, w, nw);
    service_metrics(out, &sv, now);
    free(w);
    return 0;
}
