/* SPDX-License-Identifier: MIT */
/*
 * fuzz_tool.h: what the fuzz targets of the snapshot tool share
 * (fuzz_tool.c).
 */
#ifndef STASH_FUZZ_TOOL_H
#define STASH_FUZZ_TOOL_H

/* Runs `stash snapshot ARGS...` (argv[0] is "snapshot") with stdout
 * captured (returned, malloc'd, NUL-terminated) and stderr silenced; sets
 * *rc to its exit code. */
char *fuzz_run_snapshot(int *rc, int argc, char **argv);

/* Aborts unless every line of text (each ended by a newline) is one JSON
 * value; what names the output in the message. Overwrites the newlines. */
void fuzz_check_json_lines(char *text, const char *what);

#endif
