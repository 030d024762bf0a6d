/* SPDX-License-Identifier: MIT */
/*
 * fuzz_tool.c: running `stash snapshot` inside a fuzz target, and checking
 * that what it prints as JSON lines is JSON (RFC 8259).
 */
#include <fcntl.h>
#include <sanitizer/common_interface_defs.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/fuzz/fuzz_tool.h"

int tool_snapshot(int argc, char **argv);

static int out_fd = -1, null_fd = -1, err_fd = -1;

/* ---- a JSON checker (RFC 8259) ------------------------------------------- */

static const char *json_value(const char *p, int depth);

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
    return p;
}

static const char *json_string(const char *p)
{
    if (*p++ != '"') return NULL;
    while (*p != '"') {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20) return NULL;
        if (c == '\\') {
            p++;
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", p[i]) || !p[i]) return NULL;
                p += 5;
            } else if (*p && strchr("\"\\/bfnrt", *p)) {
                p++;
            } else {
                return NULL;
            }
            continue;
        }
        /* UTF-8: a lead byte and its continuation bytes, no overlong form. */
        int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (n == 0 || (n == 2 && c < 0xc2)) return NULL;
        for (int i = 1; i < n; i++)
            if (((unsigned char)p[i] & 0xc0) != 0x80) return NULL;
        p += n;
    }
    return p + 1;
}

static const char *json_number(const char *p)
{
    if (*p == '-') p++;
    if (*p < '0' || *p > '9') return NULL;
    while (*p >= '0' && *p <= '9') p++;
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9') return NULL;
        while (*p >= '0' && *p <= '9') p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (*p < '0' || *p > '9') return NULL;
        while (*p >= '0' && *p <= '9') p++;
    }
    return p;
}

static const char *json_items(const char *p, char close, bool object, int depth)
{
    p = skip_ws(p + 1);
    if (*p == close) return p + 1;
    for (;;) {
        if (object) {
            p = json_string(skip_ws(p));
            if (!p || *(p = skip_ws(p)) != ':') return NULL;
            p++;
        }
        p = json_value(p, depth + 1);
        if (!p) return NULL;
        p = skip_ws(p);
        if (*p == close) return p + 1;
        if (*p++ != ',') return NULL;
    }
}

static const char *json_value(const char *p, int depth)
{
    if (depth > 64) return NULL;
    p = skip_ws(p);
    if (*p == '{') return json_items(p, '}', true, depth);
    if (*p == '[') return json_items(p, ']', false, depth);
    if (*p == '"') return json_string(p);
    if (!strncmp(p, "true", 4)) return p + 4;
    if (!strncmp(p, "false", 5)) return p + 5;
    if (!strncmp(p, "null", 4)) return p + 4;
    return json_number(p);
}

void fuzz_check_json_lines(char *text, const char *what)
{
    for (char *line = text, *end; *line; line = end + 1) {
        end = strchr(line, '\n');
        if (!end) {
            fprintf(stderr, "%s: a line without its end: %s\n", what, line);
            abort();
        }
        *end = 0;
        const char *rest = json_value(line, 0);
        if (!rest || *skip_ws(rest)) {
            fprintf(stderr, "%s: not JSON: %s\n", what, line);
            abort();
        }
    }
}

/* ---- running the tool ---------------------------------------------------- */

char *fuzz_run_snapshot(int *rc, int argc, char **argv)
{
    if (out_fd < 0) {
        FILE *t = tmpfile();
        out_fd = t ? fileno(t) : -1;
        null_fd = open("/dev/null", O_WRONLY);
        err_fd = dup(2);
        if (out_fd < 0 || null_fd < 0 || err_fd < 0) abort();
        /* Reports of the sanitizers go to the real stderr, silenced or not. */
        __sanitizer_set_report_fd((void *)(intptr_t)err_fd);
    }
    fflush(stdout);
    if (ftruncate(out_fd, 0) < 0) abort();
    int saved_out = dup(1);
    dup2(out_fd, 1);
    dup2(null_fd, 2);
    *rc = tool_snapshot(argc, argv);
    fflush(stdout);
    dup2(saved_out, 1);
    dup2(err_fd, 2);
    close(saved_out);
    off_t n = lseek(out_fd, 0, SEEK_END);
    char *text = malloc((size_t)n + 1);
    if (!text || pread(out_fd, text, (size_t)n, 0) != n) abort();
    text[n] = 0;
    return text;
}
