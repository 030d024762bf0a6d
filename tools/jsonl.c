/* SPDX-License-Identifier: MIT */
/*
 * jsonl.c: one line of JSON lines read back: a flat object whose values are
 * strings, numbers, true, false, null or bytes as {"hex": "..."}, as
 * stash's own JSON output writes them (`stash snapshot dump`), or as an
 * editor or any JSON tool left them.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tools/tools.h"

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static char *skip_space(char *p)
{
    while (is_space(*p)) p++;
    return p;
}

static int nibble(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

static int hex4(const char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int d = nibble(p[i]);
        if (d < 0) return -1;
        v = v << 4 | d;
    }
    return v;
}

/* Writes code point v as UTF-8 at out; returns the byte after it. */
static char *put_utf8(char *out, unsigned v)
{
    if (v < 0x80) {
        *out++ = (char)v;
    } else if (v < 0x800) {
        *out++ = (char)(0xc0 | v >> 6);
        *out++ = (char)(0x80 | (v & 0x3f));
    } else if (v < 0x10000) {
        *out++ = (char)(0xe0 | v >> 12);
        *out++ = (char)(0x80 | (v >> 6 & 0x3f));
        *out++ = (char)(0x80 | (v & 0x3f));
    } else {
        *out++ = (char)(0xf0 | v >> 18);
        *out++ = (char)(0x80 | (v >> 12 & 0x3f));
        *out++ = (char)(0x80 | (v >> 6 & 0x3f));
        *out++ = (char)(0x80 | (v & 0x3f));
    }
    return out;
}

/* Unescapes the string starting after its opening quote at p, in place;
 * sets *len and returns the character after the closing quote, or NULL.
 * \uXXXX gives its character's UTF-8, a surrogate pair (\uD8xx\uDCxx) the
 * character the two stand for; a lone surrogate is refused. */
static char *string_at(char *p, size_t *len)
{
    char *out = p, *start = p;
    while (*p && *p != '"') {
        if (*p != '\\') {
            *out++ = *p++;
            continue;
        }
        p++;
        switch (*p) {
        case '"':
        case '\\':
        case '/':
            *out++ = *p;
            break;
        case 'b':
            *out++ = '\b';
            break;
        case 'f':
            *out++ = '\f';
            break;
        case 'n':
            *out++ = '\n';
            break;
        case 'r':
            *out++ = '\r';
            break;
        case 't':
            *out++ = '\t';
            break;
        case 'u': {
            int v = hex4(p + 1);
            if (v < 0 || (v >= 0xdc00 && v < 0xe000)) return NULL;
            p += 4;
            if (v >= 0xd800 && v < 0xdc00) {
                int lo = p[1] == '\\' && p[2] == 'u' ? hex4(p + 3) : -1;
                if (lo < 0xdc00 || lo >= 0xe000) return NULL;
                v = 0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00);
                p += 6;
            }
            out = put_utf8(out, (unsigned)v);
            break;
        }
        default:
            return NULL;
        }
        p++;
    }
    if (*p != '"') return NULL;
    *len = (size_t)(out - start);
    return p + 1;
}

/* The object {"hex": "..."} starting after its brace at p: its bytes
 * decoded in place at *value (*len of them); returns the character after
 * its closing brace, or NULL. */
static char *hex_object_at(char *p, char **value, size_t *len)
{
    p = skip_space(p);
    size_t nlen;
    char *name = p + 1;
    if (*p != '"' || !(p = string_at(name, &nlen)) || nlen != 3 || memcmp(name, "hex", 3) != 0)
        return NULL;
    p = skip_space(p);
    if (*p++ != ':') return NULL;
    p = skip_space(p);
    size_t slen;
    char *hex = p + 1;
    if (*p != '"' || !(p = string_at(hex, &slen)) || slen % 2) return NULL;
    for (size_t i = 0; i < slen; i += 2) {
        int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
        if (hi < 0 || lo < 0) return NULL;
        hex[i / 2] = (char)(hi << 4 | lo);
    }
    p = skip_space(p);
    if (*p++ != '}') return NULL;
    *value = hex;
    *len = slen / 2;
    return p;
}

int tool_json_object(char *line, tool_json_field *f, int cap, size_t *at)
{
    char *p = skip_space(line);
    int n = 0;
    if (*p++ != '{') goto bad;
    p = skip_space(p);
    if (*p == '}') return 0;
    for (;;) {
        if (n == cap || *p != '"') goto bad;
        char *name = p + 1;
        size_t nlen;
        if (!(p = string_at(name, &nlen))) goto bad;
        name[nlen] = '\0';
        p = skip_space(p);
        if (*p++ != ':') goto bad;
        p = skip_space(p);
        tool_json_field *fl = &f[n++];
        fl->name = name;
        fl->name_len = nlen;
        fl->string = fl->bytes = false;
        if (*p == '"') {
            fl->string = true;
            fl->value = p + 1;
            if (!(p = string_at(p + 1, &fl->len))) goto bad;
        } else if (*p == '{') {
            fl->bytes = true;
            if (!(p = hex_object_at(p + 1, &fl->value, &fl->len))) goto bad;
        } else {
            fl->value = p;
            while (*p && *p != ',' && *p != '}' && !is_space(*p)) p++;
            fl->len = (size_t)(p - fl->value);
            if (!fl->len) goto bad;
        }
        p = skip_space(p);
        char sep = *p;
        if (sep != ',' && sep != '}') goto bad;
        /* Values end where their separators were. */
        *p++ = '\0';
        fl->value[fl->len] = '\0';
        if (sep == '}') break;
        p = skip_space(p);
    }
    if (*skip_space(p)) goto bad;
    return n;
bad:
    if (at) *at = (size_t)(p - line);
    return -EINVAL;
}

const tool_json_field *tool_json_get(const tool_json_field *f, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (f[i].name_len == strlen(name) && strcmp(f[i].name, name) == 0) return &f[i];
    return NULL;
}
