# SPDX-License-Identifier: MIT
"""Reads Prometheus text exposition (format 0.0.4) on stdin and checks it:
every sample line is NAME{LABELS} VALUE of a family whose # TYPE came
before, every value a number, no family twice. Then each argument
NAME{LABELS}=VALUE (or NAME>=VALUE) must hold for a sample. Exit 0 if so,
1 with the reason otherwise."""
import re
import sys

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*",?)*\})? (\S+)$')


def main():
    types, samples = {}, {}
    for n, line in enumerate(sys.stdin.read().splitlines(), 1):
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            if name in types:
                print(f"line {n}: family {name} typed twice")
                return 1
            types[name] = kind
            continue
        if line.startswith("#") or not line:
            continue
        m = SAMPLE.match(line)
        if not m:
            print(f"line {n}: not a sample: {line!r}")
            return 1
        if m.group(1) not in types:
            print(f"line {n}: {m.group(1)} has no # TYPE before it")
            return 1
        try:
            samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        except ValueError:
            print(f"line {n}: not a number: {m.group(3)!r}")
            return 1
    for want in sys.argv[1:]:
        key, op, value = re.match(r"^(.*?)(>=|=)([^=]*)$", want).groups()
        got = samples.get(key)
        if got is None or (op == "=" and got != float(value)) or (op == ">=" and got < float(value)):
            print(f"{key} is {got}, not {op} {value}")
            return 1
    print(f"{len(samples)} samples of {len(types)} families")
    return 0


if __name__ == "__main__":
    sys.exit(main())
