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

int tool_parse_size(const char *s, uint64_t *out)
{
    char *end;
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
        fprintf(stderr, "stash: %s: %s (%s)\n", what, stash_strerror(err), detail);
    else
        fprintf(stderr, "stash: %s: %s\n", what, stash_strerror(err));
    return 1;
}

int tool_parse_duration(const char *s, uint64_t *ms)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-') return -EINVAL;
    uint64_t unit = strcmp(end, "ms") == 0                         ? 1
                    : strcmp(end, "s") == 0 || *end == 0           ? 1000
                    : strcmp(end, "m") == 0 || !strcmp(end, "min") ? 60000
                    : strcmp(end, "h") == 0                        ? 3600000
                                                                   : 0;
    if (!unit || v > UINT64_MAX / unit) return -EINVAL;
    *ms = v * unit;
    return 0;
}

void tool_json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}
