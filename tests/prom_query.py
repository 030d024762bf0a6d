# SPDX-License-Identifier: MIT
"""Asks a Prometheus server (URL) through its HTTP API for each SERIES and
waits until every one holds: NAME{LABELS}=VALUE or NAME{LABELS}>=VALUE, as
the newest sample of exactly one series. Exits 1 if process PID (the
server) ends first or two minutes pass, saying what was last seen.
Usage: prom_query.py URL PID SERIES..."""
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def value_of(url, query):
    q = urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
        body = json.load(r)
    if body.get("status") != "success":
        return None, body
    result = body["data"]["result"]
    if len(result) != 1:
        return None, result
    return float(result[0]["value"][1]), result


def main():
    url, pid, wants = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    pending = [re.match(r"^(.*?)(>=|=)([^=]*)$", w).groups() for w in wants]
    last = {}
    deadline = time.monotonic() + 120
    while pending:
        try:
            os.kill(pid, 0)
            alive = time.monotonic() < deadline
        except ProcessLookupError:
            alive = False
        if not alive:
            for query, op, value in pending:
                print(f"{query}{op}{value}: last seen {last.get(query)}", file=sys.stderr)
            return 1
        left = []
        for query, op, value in pending:
            try:
                got, seen = value_of(url, query)
            except (urllib.error.URLError, ConnectionError, OSError) as e:
                got, seen = None, str(e)
            last[query] = seen
            if got is None or (op == "=" and got != float(value)) or (op == ">=" and got < float(value)):
                left.append((query, op, value))
            else:
                print(f"{query} = {got:g}")
        pending = left
        if pending:
            time.sleep(0.2)
    return 0


sys.exit(main())
