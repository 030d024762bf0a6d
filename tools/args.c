/* SPDX-License-Identifier: MIT */
/*
 * args.c: small argument helpers shared by the subcommands.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "include/stash.h"
#include "tools/tools.h"

bool tool_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return true;
    return false;
}

bool tool_version(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--version") == 0) {
            printf("stash %s\n", stash_version());
            return true;
        }
    return false;
}

int tool_parse_size(const char *s, uint64_t *out)
{
    char *end;
    /* strtoull takes a sign and wraps it around: digits only. */
    if (s[0] < '0' || s[0] > '9') return -EINVAL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s) return -EINVAL;
    unsigned shift = 0;
    switch (*end) {
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'i' || *end == 'B') end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
    if (*end || (shift && v > (~0ull >> shift))) return -EINVAL;
    *out = v << shift;
    return 0;
}

int tool_fail(const char *what, int err)
{
    const char *detail = stash_errmsg();
    if (detail[0])
        fprintf(stderr, "stash %s: %s (%s)\n", what, stash_strerror(err), detail);
    else
        fprintf(stderr, "stash %s: %s\n", what, stash_strerror(err));
    return 1;
}

int tool_parse_duration(const char *s, uint64_t *ms)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] < '0' || s[0] > '9') return -EINVAL;
    uint64_t unit = strcmp(end, "ms") == 0                         ? 1
                    : strcmp(end, "s") == 0 || *end == 0           ? 1000
                    : strcmp(end, "m") == 0 || !strcmp(end, "min") ? 60000
                    : strcmp(end, "h") == 0                        ? 3600000
                                                                   : 0;
    if (!unit || v > UINT64_MAX / unit) return -EINVAL;
    *ms = v * unit;
    return 0;
}

/* The length of the well-formed UTF-8 sequence at s (1 to 4), or 0. */
static size_t utf8_sequence(const unsigned char *s)
{
    unsigned char c = s[0];
    size_t n = c < 0x80             ? 1
               : (c & 0xe0) == 0xc0 ? 2
               : (c & 0xf0) == 0xe0 ? 3
               : (c & 0xf8) == 0xf0 ? 4
                                    : 0;
    if (n == 0 || (n == 2 && c < 0xc2) || (n == 4 && c > 0xf4)) return 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    /* No overlong forms, no surrogates, nothing past U+10FFFF. */
    if ((n == 3 && c == 0xe0 && s[1] < 0xa0) || (n == 3 && c == 0xed && s[1] >= 0xa0) ||
        (n == 4 && c == 0xf0 && s[1] < 0x90) || (n == 4 && c == 0xf4 && s[1] >= 0x90))
        return 0;
    return n;
}

void tool_json_bytes(const void *bytes, size_t len)
{
    const unsigned char *p = bytes, *end = p + len;
    putchar('"');
    while (p < end) {
        /* A sequence cut off by the end is no UTF-8: look at a padded copy. */
        unsigned char tail[4] = {0};
        memcpy(tail, p, (size_t)(end - p) < 4 ? (size_t)(end - p) : 4);
        size_t n = utf8_sequence(tail);
        if (*p == '"' || *p == '\\') {
            printf("\\%c", *p);
        } else if (*p < 0x20 || n == 0) {
            /* A control character, or a byte that is no UTF-8: as the code
             * point of its value, so the line stays valid JSON. */
            printf("\\u%04x", *p);
            n = 1;
        } else {
            fwrite(p, 1, n, stdout);
        }
        p += n;
    }
    putchar('"');
}

bool tool_utf8_valid(const void *bytes, size_t len)
{
    const unsigned char *p = bytes, *end = p + len;
    while (p < end) {
        unsigned char tail[4] = {0};
        memcpy(tail, p, (size_t)(end - p) < 4 ? (size_t)(end - p) : 4);
        size_t n = utf8_sequence(tail);
        if (n == 0) return false;
        p += n;
    }
    return true;
}

void tool_json_string(const char *s)
{
    tool_json_bytes(s, strlen(s));
}

int tool_parse_format(const char *s, tool_format *out)
{
    static const char *const names[] = {"text", "hex", "base64"};
    for (int i = 0; i < 3; i++)
        if (strcmp(s, names[i]) == 0) return *out = (tool_format)i, 0;
    return -EINVAL;
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int hex_digit(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

int tool_decode(const char *s, tool_format f, uint8_t **out, size_t *len)
{
    size_t n = strlen(s);
    uint8_t *b = malloc(n + 1);
    if (!b) return -ENOMEM;
    size_t k = 0;
    if (f == TOOL_TEXT) {
        memcpy(b, s, n);
        k = n;
    } else if (f == TOOL_HEX) {
        for (size_t i = 0; i + 1 < n; i += 2) {
            int hi = hex_digit(s[i]), lo = hex_digit(s[i + 1]);
            if (hi < 0 || lo < 0) goto bad;
            b[k++] = (uint8_t)(hi << 4 | lo);
        }
        if (n % 2) goto bad;
    } else {
        if (n % 4) goto bad;
        for (size_t i = 0; i < n; i += 4) {
            uint32_t w = 0;
            int pad = 0;
            for (int j = 0; j < 4; j++) {
                const char *at = s[i + j] ? strchr(b64, s[i + j]) : NULL;
                if (s[i + j] == '=' && i + 4 == n && j >= 2) {
                    pad++;
                } else if (!at || pad) {
                    goto bad;
                }
                w = w << 6 | (at ? (uint32_t)(at - b64) : 0);
            }
            b[k++] = (uint8_t)(w >> 16);
            if (pad < 2) b[k++] = (uint8_t)(w >> 8);
            if (pad < 1) b[k++] = (uint8_t)w;
        }
    }
    *out = b;
    *len = k;
    return 0;
bad:
    free(b);
    return -EINVAL;
}

void tool_fprint_bytes(FILE *out, const void *bytes, size_t n, tool_format f)
{
    static const char hex[] = "0123456789abcdef";
    const uint8_t *p = bytes;
    if (f == TOOL_TEXT) {
        /* One line per entry: control bytes (C0 and C1) and bytes that are
         * no UTF-8 escaped, so that none reaches a terminal as it is. */
        for (size_t i = 0; i < n;) {
            unsigned char tail[4] = {0};
            memcpy(tail, p + i, n - i < 4 ? n - i : 4);
            size_t len = utf8_sequence(tail);
            bool c1 = len == 2 && p[i] == 0xc2 && p[i + 1] < 0xa0; /* U+0080..U+009F */
            if (p[i] == '\\') {
                fputs("\\\\", out);
            } else if (p[i] < 0x20 || p[i] == 0x7f || len == 0) {
                fprintf(out, "\\x%02x", p[i]);
                len = 1;
            } else if (c1) {
                fprintf(out, "\\x%02x\\x%02x", p[i], p[i + 1]);
            } else {
                fwrite(p + i, 1, len, out);
            }
            i += len;
        }
    } else if (f == TOOL_HEX) {
        for (size_t i = 0; i < n; i++) fputc(hex[p[i] >> 4], out), fputc(hex[p[i] & 15], out);
    } else {
        for (size_t i = 0; i < n; i += 3) {
            uint32_t w = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                         (i + 2 < n ? p[i + 2] : 0);
            fputc(b64[w >> 18 & 63], out);
            fputc(b64[w >> 12 & 63], out);
            fputc(i + 1 < n ? b64[w >> 6 & 63] : '=', out);
            fputc(i + 2 < n ? b64[w & 63] : '=', out);
        }
    }
}

void tool_print_bytes(const void *bytes, size_t n, tool_format f, bool json)
{
    if (f == TOOL_TEXT && json) {
        /* A JSON string holds characters, not bytes: other bytes in hex. */
        if (tool_utf8_valid(bytes, n)) {
            tool_json_bytes(bytes, n);
        } else {
            fputs("{\"hex\": \"", stdout);
            tool_fprint_bytes(stdout, bytes, n, TOOL_HEX);
            fputs("\"}", stdout);
        }
        return;
    }
    if (json) putchar('"');
    tool_fprint_bytes(stdout, bytes, n, f);
    if (json) putchar('"');
}

char **tool_split_equals(int argc, char **argv, int *out_argc)
{
    size_t bytes = 0;
    int n = 0;
    for (int i = 0; i < argc; i++, n++) {
        bytes += strlen(argv[i]) + 1;
        if (strncmp(argv[i], "--", 2) == 0 && strchr(argv[i], '=')) n++;
    }
    char **out = malloc((size_t)(n + 1) * sizeof *out + bytes);
    if (!out) return NULL;
    char *text = (char *)(out + n + 1);
    int k = 0;
    for (int i = 0; i < argc; i++) {
        size_t len = strlen(argv[i]);
        memcpy(text, argv[i], len + 1);
        out[k++] = text;
        char *eq = strncmp(text, "--", 2) == 0 ? strchr(text, '=') : NULL;
        if (eq) {
            *eq = '\0';
            out[k++] = eq + 1;
        }
        text += len + 1;
    }
    out[k] = NULL;
    *out_argc = k;
    return out;
}
