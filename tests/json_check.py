# SPDX-License-Identifier: MIT
"""Reads JSON lines on stdin: every line must parse (as UTF-8), and every
string named by an environment variable STASH_JSON_EXPECT_<n> must appear
within a string value of them. Bytes that are no UTF-8 are expected
as the code points of their values (how stash escapes them). Exit 0 if so,
1 with the reason otherwise."""
import json
import os
import sys


def expected(raw):
    text = raw.decode("utf-8", errors="surrogateescape")
    return "".join(chr(ord(c) - 0xDC00) if 0xDC80 <= ord(c) <= 0xDCFF else c for c in text)


def strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def main():
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        print(f"not UTF-8: {e}")
        return 1
    seen = set()
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        print("no output")
        return 1
    for n, line in enumerate(lines, 1):
        try:
            seen.update(strings(json.loads(line)))
        except json.JSONDecodeError as e:
            print(f"line {n} is not JSON ({e}): {line!r}")
            return 1
    for key, value in sorted(os.environb.items()):
        want = expected(value)
        if key.startswith(b"STASH_JSON_EXPECT_") and not any(want in s for s in seen):
            print(f"{key.decode()}: {want!r} is in no string value")
            return 1
    print(f"{len(lines)} lines of JSON")
    return 0


sys.exit(main())
