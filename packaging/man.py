#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Writes stash's manual pages from the sources of truth: stash(1) and one
page per subcommand from what `stash --help` and `stash CMD --help` print,
and stash.h(3) from the comments of include/stash.h.

    man.py STASH_BINARY include/stash.h OUTDIR VERSION
"""

import os
import re
import subprocess
import sys

DATE = "2026"


def roff(text):
    """Text as roff: backslashes escaped, no line taken for a request."""
    out = []
    for line in text.split("\n"):
        line = line.replace("\\", "\\e")
        if line.startswith((".", "'")):
            line = "\\&" + line
        out.append(line)
    return "\n".join(out)


def page(name, section, version, title, summary, sections):
    """A page: its NAME line (name \\- summary), then each (heading, text,
    literal) section, literal ones kept line for line."""
    head = [f'.TH "{name.upper()}" "{section}" "{DATE}" "stash {version}" "{title}"',
            ".SH NAME", f"{name} \\- {roff(summary)}"]
    for heading, body, literal in sections:
        head.append(f".SH {heading}")
        if literal:
            head += [".nf", roff(body), ".fi"]
        else:
            head.append(roff(body))
    return "\n".join(head) + "\n"


def run(binary, *args):
    r = subprocess.run([binary, *args], capture_output=True, text=True)
    return r.stdout


def commands(binary):
    """(name, summary) of each subcommand `stash --help` lists."""
    found = []
    for line in run(binary, "--help").splitlines():
        m = re.match(r"^  (\w+)\s+(.*)$", line)
        if m:
            found.append((m.group(1), m.group(2)))
    return found


def command_pages(binary, outdir, version):
    cmds = commands(binary)
    listing = "\n".join(f"stash {c}\t{s}" for c, s in cmds)
    see = ", ".join(f"stash-{c}(1)" for c, _ in cmds) + ", stash.h(3)"
    with open(os.path.join(outdir, "stash.1"), "w") as f:
        f.write(page("stash", 1, version, "stash manual",
                     "a keyed-state service for worker processes on one machine", [
            ("SYNOPSIS", "stash COMMAND [ARGS]\nstash --version", True),
            ("COMMANDS", listing, True),
            ("DESCRIPTION", "Workers map one shared-memory arena and keep Flink-style keyed "
             "and operator state in it; a persistence engine checkpoints it to files. "
             "Each command takes --help. The library is include/stash.h, see stash.h(3).",
             False),
            ("SEE ALSO", see, False),
        ]))
    for c, summary in cmds:
        helptext = run(binary, c, "--help")
        with open(os.path.join(outdir, f"stash-{c}.1"), "w") as f:
            f.write(page(f"stash-{c}", 1, version, "stash manual", summary, [
                ("SYNOPSIS AND DESCRIPTION", helptext.rstrip("\n"), True),
                ("SEE ALSO", "stash(1)", False),
            ]))


def api_page(header, outdir, version):
    """stash.h(3): each part of the header (its banner comments) with the
    declarations and the comments above them, as the header has them."""
    text = open(header).read()
    body = text[text.index("#define STASH_API"):text.rindex("#ifdef __cplusplus")]
    body = body.split("\n", 1)[1]
    start = text.index("/*\n")
    intro = text[start:text.index("*/", start)]
    intro = "\n".join(line.strip(" /*") for line in intro.split("\n")[1:]).strip()
    body = body.replace("STASH_API ", "")
    with open(os.path.join(outdir, "stash.h.3"), "w") as f:
        f.write(page("stash.h", 3, version, "stash library", "the C API of stash", [
            ("SYNOPSIS", "#include <stash.h>\ncc prog.c $(pkg-config --cflags --libs stash)",
             True),
            ("DESCRIPTION", intro, False),
            ("DECLARATIONS", body.strip("\n"), True),
            ("SEE ALSO", "stash(1)", False),
        ]))


def main(argv):
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    binary, header, outdir, version = argv[1:]
    os.makedirs(outdir, exist_ok=True)
    command_pages(binary, outdir, version)
    api_page(header, outdir, version)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
