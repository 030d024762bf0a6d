/* SPDX-License-Identifier: MIT */
/*
 * tools.h: what the `stash` command's subcommands share: argument helpers,
 * JSON output, and the subcommands themselves. The benchmarks are a program
 * of their own (tools/bench/).
 */
#ifndef STASH_TOOLS_H
#define STASH_TOOLS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>

#include "include/stash.h"

/* A subcommand: argv[0] is its own name. Returns the process exit code. */
typedef int tool_main_fn(int argc, char **argv);

/* Whether argv[i] is "--help" or "-h". */
bool tool_wants_help(int argc, char **argv);
/* Whether argv[i] is "--version" (i >= 1): if so, prints the library's
 * version, as every command does when asked. */
bool tool_version(int argc, char **argv);
/* Parses a size such as 4096, 64K, 256M or 2G. Returns 0 or -EINVAL. */
int tool_parse_size(const char *s, uint64_t *out);
/* Parses a duration such as 500ms, 2s, 1m or 1h (a plain number is seconds)
 * into milliseconds. Returns 0 or -EINVAL. */
int tool_parse_duration(const char *s, uint64_t *ms);
/* Prints s on stdout as a JSON string, quoted and escaped (RFC 8259):
 * quotes, backslashes and control characters escaped, valid UTF-8 as it
 * is, any other byte as \u00XX. Every JSON line the tools print goes
 * through it. */
void tool_json_string(const char *s);
/* As tool_json_string(), for len bytes that may hold any byte. */
void tool_json_bytes(const void *bytes, size_t len);

/* How bytes are given and shown on the command line. */
typedef enum tool_format { TOOL_TEXT = 0, TOOL_HEX = 1, TOOL_BASE64 = 2 } tool_format;
/* Parses "text", "hex" or "base64". Returns 0 or -EINVAL. */
int tool_parse_format(const char *s, tool_format *out);
/* The bytes s stands for in format f, in *out (the caller frees it) and
 * *len. Returns 0, -EINVAL if s is not of that format, or -ENOMEM. */
int tool_decode(const char *s, tool_format f, uint8_t **out, size_t *len);
/* Whether len bytes are well-formed UTF-8. */
bool tool_utf8_valid(const void *bytes, size_t len);
/* Prints n bytes in format f on stdout: with json as a JSON string (in
 * text, one of the characters the bytes encode; bytes that are not UTF-8
 * as the object {"hex": "..."} instead, so that any JSON tool keeps them),
 * else bare (text with a backslash escaped as \\, and control bytes and
 * bytes that are no UTF-8 as \xNN). */
void tool_print_bytes(const void *bytes, size_t n, tool_format f, bool json);
/* Prints n bytes bare in format f on out, as tool_print_bytes() without json. */
void tool_fprint_bytes(FILE *out, const void *bytes, size_t n, tool_format f);
/* Prints "stash <what>: <error words> (<detail>)" to stderr, what being the
 * command ("snapshot dump"), as every error line of the tools starts;
 * returns 1. */
int tool_fail(const char *what, int err);

/* One name and value of a flat JSON object (jsonl.c): a string's bytes
 * unescaped (len of them, each \uXXXX, or surrogate pair, the UTF-8 of its
 * character), the bytes of an object {"hex": "..."}, or a number's, true's,
 * false's or null's text (NUL-terminated). The name is unescaped too
 * (name_len bytes, NUL-terminated: one holding \u0000 is shorter as a C
 * string). */
typedef struct tool_json_field {
    const char *name;
    size_t name_len;
    char *value;
    size_t len;
    bool string; /* a JSON string: its characters' UTF-8 */
    bool bytes;  /* the object {"hex": "..."}: the bytes it spells */
} tool_json_field;
/* Parses line, a flat JSON object, in place into f (cap fields). Returns
 * how many, or -EINVAL with *at (if given) the offset of what is wrong. */
int tool_json_object(char *line, tool_json_field *f, int cap, size_t *at);
/* The field called name of f[0 .. n-1] (all of its name), or NULL. */
const tool_json_field *tool_json_get(const tool_json_field *f, int n, const char *name);

/* Writes the arena's metrics to out in Prometheus' text format (0.0.4);
 * per_kg adds each key group's bytes. Returns 0 or -ENOMEM. */
int tool_metrics(FILE *out, stash_arena *a, bool per_kg);

/* Reads the address of `stash serve --metrics`: "A.B.C.D:PORT", ":PORT"
 * (every IPv4 address) or "[IPV6]:PORT", numeric, PORT 0 (a free one) to
 * 65535, into out. Returns 0, or -EINVAL with *why saying what is wrong
 * (without quoting s). */
int tool_metrics_address(const char *s, struct sockaddr_storage *out, const char **why);
/* Serves the metrics of a at http://ADDR:PORT/metrics (addr from
 * tool_metrics_address) on a thread of its own until tool_metrics_stop(),
 * to a few connections at once (metrics_http.c); ?kg=1 adds each key
 * group's bytes. Writes the URL it serves into where. Returns 0 or the error
 * binding failed with. */
typedef struct tool_metrics_server tool_metrics_server;
int tool_metrics_serve(const struct sockaddr_storage *addr, stash_arena *a,
                       tool_metrics_server **out, char *where, size_t size);
void tool_metrics_stop(tool_metrics_server *s);
/* argv with each "--opt=value" split into "--opt" and "value", as the
 * commands read their options; *out_argc its count. The copy and its
 * strings live in one allocation the caller frees; NULL if out of memory. */
char **tool_split_equals(int argc, char **argv, int *out_argc);

/* The subcommands. */
int tool_create(int argc, char **argv);
int tool_destroy(int argc, char **argv);
int tool_status(int argc, char **argv);
int tool_demo(int argc, char **argv);
int tool_snapshot(int argc, char **argv);
int tool_serve(int argc, char **argv);
int tool_checkpoint(int argc, char **argv);
int tool_stop(int argc, char **argv);
int tool_get(int argc, char **argv);
int tool_scan(int argc, char **argv);

#endif /* STASH_TOOLS_H */
