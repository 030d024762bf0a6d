/* SPDX-License-Identifier: MIT */
/*
 * fuzz_snapshot.c: the snapshot tool (`stash snapshot verify|info|dump|diff`)
 * over a mutated checkpoint, packed as fuzz_common.h says. Whatever the
 * bytes, each subcommand ends with an exit code of its documented set, a
 * checkpoint that verifies dumps, and every line it prints as JSON is valid
 * JSON (keys, values and state names included).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_tool.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *ck = fuzz_unpack(data, size);
    if (!ck) return 0;
    char path[256];
    snprintf(path, sizeof path, "%s", ck);
    int verify, dump, info, diff;
    free(fuzz_run_snapshot(&verify, 3, (char *[]){"snapshot", "verify", path, NULL}));
    char *text = fuzz_run_snapshot(&dump, 3, (char *[]){"snapshot", "dump", path, NULL});
    if (verify < 0 || verify > 2 || dump < 0 || dump > 2 || (verify == 0 && dump != 0)) {
        fprintf(stderr, "verify exits %d, dump %d\n", verify, dump);
        abort();
    }
    fuzz_check_json_lines(text, "dump");
    free(text);
    text = fuzz_run_snapshot(&info, 4, (char *[]){"snapshot", "info", path, "--json", NULL});
    if (info != 0 && info != 1 && info != 2) abort();
    fuzz_check_json_lines(text, "info --json");
    free(text);
    free(fuzz_run_snapshot(&diff, 4, (char *[]){"snapshot", "diff", path, path, NULL}));
    if (verify == 0 && diff != 0) {
        fprintf(stderr, "a checkpoint that verifies differs from itself (%d)\n", diff);
        abort();
    }
    return 0;
}
