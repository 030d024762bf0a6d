/* SPDX-License-Identifier: MIT */
/*
 * test_api_args.c: every public function refuses a NULL handle, a NULL
 * out-parameter and NULL bytes with a non-zero length with -EINVAL (and a
 * message naming the argument), and changes nothing when it does.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "tests/helpers.h"

static char name[96];
static stash_arena *arena;
static stash_worker *w;
static stash_state *value, *list, *map, *reducing, *op_list, *broadcast;

static int sum(const stash_bytes *acc, const stash_bytes *in, void *out, size_t cap, size_t *len,
               void *ctx)
{
    (void)ctx;
    if (cap < 8) {
        *len = 8;
        return -ENOSPC;
    }
    uint64_t a = acc && acc->len ? test_u64(acc->data) : 0;
    a += test_u64(in->data);
    memcpy(out, &a, 8);
    *len = 8;
    return 0;
}

static stash_state *get(const char *n, stash_kind kind)
{
    stash_state *s;
    cr_assert_eq(
        stash_state_get(w,
                        &(stash_state_desc){
                            .sz = sizeof(stash_state_desc), .name = n, .kind = kind, .reduce = sum},
                        &s),
        0, "%s", stash_errmsg());
    return s;
}

static void setup(void)
{
    arena = test_arena_create("args", 0, 8, name);
    cr_assert_eq(stash_worker_open(name, NULL, &w), 0, "%s", stash_errmsg());
    value = get("v", STASH_VALUE);
    list = get("l", STASH_LIST);
    map = get("m", STASH_MAP);
    reducing = get("r", STASH_REDUCING);
    op_list = get("o", STASH_OP_LIST);
    broadcast = get("b", STASH_OP_BROADCAST);
    uint64_t k = 7;
    cr_assert_eq(stash_key_set(w, &k, sizeof k), 0);
}

static void teardown(void)
{
    stash_worker_close(w);
    stash_arena_close(arena);
    stash_arena_destroy(name, NULL);
}

TestSuite(args, .init = setup, .fini = teardown);

/* rc is -EINVAL and the message names what was NULL. */
static void refused(int rc, const char *what)
{
    cr_assert_eq(rc, -EINVAL, "%s: %s (%s)", what, stash_strerror(rc), stash_errmsg());
    cr_assert(strstr(stash_errmsg(), "NULL"), "%s: %s", what, stash_errmsg());
}

Test(args, null_handles_and_out_parameters_are_refused)
{
    stash_bytes b;
    stash_iter it;
    stash_arena *a;
    stash_worker *w2;
    stash_state *s;
    stash_arena_info ai;
    stash_kg_usage u;
    stash_worker_info wi;
    stash_service_info si;
    stash_checkpoint_info ci;
    stash_event ev;
    size_t n;
    const stash_bytes *elements;
    refused(stash_arena_create("x", NULL, NULL), "arena_create out");
    refused(stash_arena_open(name, NULL, NULL), "arena_open out");
    refused(stash_arena_info_get(NULL, &ai), "arena_info_get arena");
    refused(stash_arena_info_get(arena, NULL), "arena_info_get out");
    refused(stash_kg_usage_get(NULL, 0, &u), "kg_usage_get arena");
    refused(stash_kg_usage_get(arena, 0, NULL), "kg_usage_get out");
    refused(stash_worker_open(NULL, NULL, &w2), "worker_open name");
    refused(stash_worker_open(name, NULL, NULL), "worker_open out");
    refused(stash_worker_info_get(NULL, &wi), "worker_info_get worker");
    refused(stash_worker_info_get(w, NULL), "worker_info_get out");
    cr_assert_null(stash_worker_arena(NULL));
    refused(stash_registry_list(NULL, &wi, 1, &n), "registry_list arena");
    refused(stash_registry_list(arena, NULL, 1, &n), "registry_list out");
    refused(stash_registry_list(arena, &wi, 1, NULL), "registry_list n");
    refused(stash_state_get(NULL,
                            &(stash_state_desc){
                                .sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
                            &s),
            "state_get worker");
    refused(stash_state_get(w, NULL, &s), "state_get desc");
    refused(stash_state_get(w,
                            &(stash_state_desc){
                                .sz = sizeof(stash_state_desc), .name = "v", .kind = STASH_VALUE},
                            NULL),
            "state_get out");
    refused(stash_key_set(NULL, "k", 1), "key_set worker");
    refused(stash_key_group_current(NULL), "key_group_current");
    refused(stash_state_namespace(NULL, "n", 1), "namespace state");
    refused(stash_state_clear(NULL), "clear state");
    refused(stash_value_get(NULL, &b), "value_get state");
    refused(stash_value_get(value, NULL), "value_get out");
    refused(stash_value_put(NULL, "v", 1), "value_put state");
    refused(stash_value_get_key(NULL, "k", 1, &b), "value_get_key state");
    refused(stash_value_get_key(value, "k", 1, NULL), "value_get_key out");
    refused(stash_value_put_key(NULL, "k", 1, "v", 1), "value_put_key state");
    refused(stash_list_get(NULL, &it), "list_get state");
    refused(stash_list_get(list, NULL), "list_get it");
    refused(stash_map_get(map, "k", 1, NULL), "map_get out");
    refused(stash_map_iter(map, NULL), "map_iter it");
    refused(stash_map_is_empty(NULL), "map_is_empty");
    refused(stash_merging_add(NULL, "v", 1), "merging_add state");
    refused(stash_merging_get(reducing, NULL), "merging_get out");
    refused(stash_keys_iter(value, NULL, 0, NULL), "keys_iter it");
    refused(stash_iter_next(NULL, NULL, NULL), "iter_next it");
    refused(stash_iter_remove(NULL), "iter_remove it");
    refused(stash_op_list_get(op_list, NULL, &n), "op_list_get elements");
    refused(stash_op_list_get(op_list, &elements, NULL), "op_list_get n");
    refused(stash_broadcast_get(broadcast, "k", 1, NULL), "broadcast_get out");
    refused(stash_broadcast_entries(broadcast, NULL, &elements, &n), "broadcast_entries keys");
    refused(stash_barrier(NULL, &ev), "barrier worker");
    refused(stash_barrier(w, NULL), "barrier event");
    refused(stash_checkpoint(NULL, 0, &ci), "checkpoint arena");
    refused(stash_checkpoint(arena, 0, NULL), "checkpoint out");
    refused(stash_savepoint(NULL, 0, &ci), "savepoint arena");
    refused(stash_service_request_stop(NULL, 0), "request_stop arena");
    refused(stash_stop_with_savepoint(NULL, 0, &ci), "stop_with_savepoint arena");
    refused(stash_stop_with_savepoint(arena, 0, NULL), "stop_with_savepoint out");
    refused(stash_service_info_get(NULL, &si), "service_info_get arena");
    refused(stash_service_info_get(arena, NULL), "service_info_get out");
    refused(stash_service_start(NULL, NULL, NULL), "service_start");
    refused(stash_service_stopped(NULL), "service_stopped");
    refused(stash_kg_range_of(8, 1, 0, NULL), "kg_range_of out");
    (void)a;
}

Test(args, a_refused_key_leaves_none_current_after_a_key_of_the_common_length)
{
    /* The second 8-byte key takes stash_key_set's common path (and the
     * one-step get and put); a refused key after it must leave no key for
     * those either. */
    uint64_t k1 = 11, k2 = 12, v = 1, w2 = 2;
    cr_assert_eq(stash_key_set(w, &k1, sizeof k1), 0);
    cr_assert_eq(stash_value_put(value, &v, sizeof v), 0);
    cr_assert_eq(stash_key_set(w, &k2, sizeof k2), 0);
    cr_assert_eq(stash_value_put(value, &v, sizeof v), 0);
    refused(stash_key_set(w, NULL, 8), "key_set key");
    stash_bytes b;
    cr_assert_eq(stash_value_put(value, &w2, sizeof w2), STASH_ENOKEY);
    cr_assert_eq(stash_value_get(value, &b), STASH_ENOKEY);
    cr_assert_eq(stash_key_set(w, &k2, sizeof k2), 0);
    cr_assert_eq(stash_value_get(value, &b), 0);
    cr_assert_eq(test_u64(b.data), 1u, "the key before the refused one kept its value");
}

Test(args, null_bytes_with_a_length_are_refused_and_change_nothing)
{
    uint64_t v = 42;
    cr_assert_eq(stash_value_put(value, &v, sizeof v), 0);
    cr_assert_eq(stash_list_add(list, &v, sizeof v), 0);
    cr_assert_eq(stash_map_put(map, "k", 1, &v, sizeof v), 0);
    stash_bytes ok = {&v, sizeof v}, null4 = {NULL, 4};
    stash_bytes with_null[2] = {ok, null4};
    refused(stash_key_set(w, NULL, 4), "key_set key");
    /* The refused key left none current. */
    cr_assert_eq(stash_value_put(value, &v, sizeof v), STASH_ENOKEY);
    uint64_t k = 7;
    cr_assert_eq(stash_key_set(w, &k, sizeof k), 0);
    refused(stash_state_namespace(value, NULL, 5), "namespace ns");
    refused(stash_value_put(value, NULL, 4), "value_put value");
    refused(stash_value_put_key(value, &k, sizeof k, NULL, 4), "value_put_key value");
    refused(stash_list_add(list, NULL, 4), "list_add value");
    refused(stash_list_add_all(list, NULL, 2), "list_add_all values");
    refused(stash_list_add_all(list, with_null, 2), "list_add_all element");
    refused(stash_list_update(list, NULL, 2), "list_update values");
    refused(stash_list_update(list, with_null, 2), "list_update element");
    refused(stash_map_put(map, NULL, 4, &v, sizeof v), "map_put key");
    refused(stash_map_put(map, "k", 1, NULL, 4), "map_put value");
    refused(stash_map_put_all(map, NULL, &ok, 1), "map_put_all keys");
    refused(stash_map_put_all(map, &ok, with_null + 1, 1), "map_put_all value");
    refused(stash_map_get(map, NULL, 4, &ok), "map_get key");
    refused(stash_map_remove(map, NULL, 4), "map_remove key");
    refused(stash_map_contains(map, NULL, 4), "map_contains key");
    refused(stash_merging_add(reducing, NULL, 8), "merging_add value");
    refused(stash_merge_namespaces(list, NULL, 3, &ok, 1), "merge_namespaces target");
    refused(stash_merge_namespaces(list, "t", 1, NULL, 1), "merge_namespaces sources");
    refused(stash_merge_namespaces(list, "t", 1, with_null + 1, 1), "merge_namespaces source");
    refused(stash_keys_iter(value, NULL, 3, &(stash_iter){0}), "keys_iter ns");
    refused(stash_op_list_add(op_list, NULL, 4), "op_list_add value");
    refused(stash_op_list_update(op_list, NULL, 1), "op_list_update values");
    refused(stash_op_list_update(op_list, with_null, 2), "op_list_update element");
    refused(stash_broadcast_put(broadcast, NULL, 4, &v, 8), "broadcast_put key");
    refused(stash_broadcast_put(broadcast, "k", 1, NULL, 4), "broadcast_put value");
    refused(stash_broadcast_get(broadcast, NULL, 4, &ok), "broadcast_get key");
    refused(stash_broadcast_remove(broadcast, NULL, 4), "broadcast_remove key");
    /* Nothing changed. */
    stash_bytes b;
    cr_assert_eq(stash_value_get(value, &b), 0);
    cr_assert_eq(test_u64(b.data), 42);
    stash_iter it;
    cr_assert_eq(stash_list_get(list, &it), 0);
    cr_assert_eq(stash_iter_next(&it, NULL, &b), 1);
    cr_assert_eq(stash_iter_next(&it, NULL, &b), 0);
    cr_assert_eq(stash_map_get(map, "k", 1, &b), 0);
    cr_assert_eq(test_u64(b.data), 42);
    size_t n;
    const stash_bytes *elements;
    cr_assert_eq(stash_op_list_get(op_list, &elements, &n), 0);
    cr_assert_eq(n, 0);
}

Test(args, null_bytes_of_length_zero_are_empty_bytes)
{
    cr_assert_eq(stash_key_set(w, NULL, 0), 0);
    cr_assert_eq(stash_state_namespace(value, NULL, 0), 0);
    cr_assert_eq(stash_value_put(value, NULL, 0), 0, "clears");
    cr_assert_eq(stash_list_add(list, NULL, 0), 0);
    cr_assert_eq(stash_map_put(map, NULL, 0, NULL, 0), 0);
    stash_bytes b;
    cr_assert_eq(stash_map_get(map, NULL, 0, &b), 0);
    cr_assert_eq(b.len, 0);
    cr_assert_eq(stash_list_add_all(list, NULL, 0), 0);
    cr_assert_eq(stash_op_list_add(op_list, NULL, 0), 0);
    cr_assert_eq(stash_broadcast_put(broadcast, NULL, 0, NULL, 0), 0);
}

Test(args, a_key_longer_than_65535_bytes_leaves_no_key_current)
{
    static uint8_t big[70000];
    uint64_t v = 1;
    cr_assert_eq(stash_key_set(w, big, sizeof big), -EINVAL);
    cr_assert_eq(stash_value_put(value, &v, sizeof v), STASH_ENOKEY);
    cr_assert_eq(stash_key_group_current(w), STASH_ENOKEY);
}

Test(args, a_zeroed_iterator_is_refused)
{
    stash_iter it;
    memset(&it, 0, sizeof it);
    stash_bytes k, v;
    cr_assert_eq(stash_iter_next(&it, &k, &v), -EINVAL);
    cr_assert(strstr(stash_errmsg(), "not a started iterator"), "%s", stash_errmsg());
    cr_assert_eq(stash_iter_remove(&it), -EINVAL);
}

Test(args, keyed_calls_on_operator_state_are_refused)
{
    stash_iter it;
    cr_assert_eq(stash_state_clear(op_list), STASH_EKIND);
    cr_assert_eq(stash_state_clear(broadcast), STASH_EKIND);
    cr_assert_eq(stash_keys_iter(op_list, NULL, 0, &it), STASH_EKIND);
    cr_assert_eq(stash_keys_iter(broadcast, NULL, 0, &it), STASH_EKIND);
}

Test(args, lengths_past_what_a_record_holds_are_refused_before_any_write)
{
    static const uint8_t byte = 1;
    stash_bytes huge = {&byte, SIZE_MAX};
    cr_assert_eq(stash_list_add(list, &byte, SIZE_MAX), STASH_ETOOBIG);
    cr_assert_eq(stash_list_add_all(list, &huge, 1), STASH_ETOOBIG);
    cr_assert_eq(stash_list_update(list, &huge, 1), STASH_ETOOBIG);
    cr_assert_eq(stash_map_put(map, "k", 1, &byte, SIZE_MAX), STASH_ETOOBIG);
    cr_assert_eq(stash_op_list_add(op_list, &byte, SIZE_MAX), STASH_ETOOBIG);
    cr_assert_eq(stash_op_list_update(op_list, &huge, 1), STASH_ETOOBIG);
    cr_assert_eq(stash_broadcast_put(broadcast, "k", 1, &byte, SIZE_MAX), STASH_ETOOBIG);
    cr_assert_eq(stash_broadcast_put(broadcast, &byte, SIZE_MAX, "v", 1), STASH_ETOOBIG);
    stash_iter it;
    cr_assert_eq(stash_list_get(list, &it), STASH_ENOTFOUND, "the list was never written");
    size_t n;
    const stash_bytes *e;
    cr_assert_eq(stash_op_list_get(op_list, &e, &n), 0);
    cr_assert_eq(n, 0);
    cr_assert_eq(shm_check(arena), 0, "%s", stash_errmsg());
}
