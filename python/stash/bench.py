# SPDX-License-Identifier: MIT
"""`stash bench python`'s measurements (python3 -m stash.bench): value reads
and writes from Python, one key a call and 32 keys a call, beside
python3-lmdb and python3-redis used the way their users do (a transaction
per call, MGET/MSET for many keys), in the same run: arbitrary 8-byte keys
in a random order, every read checked, the systems interleaved in a new
order each repetition. Prints one line per figure: case, system, value (the
median), unit, then the lowest and highest repetition (of a ratio: of the
repetitions' ratios), or for a peer that could not run why, separated by
tabs; stash-bench reports them."""

import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import stash

BATCH = 32
CASES = ["value-read/one", "value-write/one", "value-read/batch32", "value-write/batch32"]


class WrongRead(Exception):
    pass


def chunks(xs):
    return [xs[i:i + BATCH] for i in range(0, len(xs), BATCH)]


def cases_of(get, put, get_many, put_many, keys, values):
    """The four cases over keys (in their random order), each read checked
    against the value written: the same checks in every system's loop."""
    kc, vc = chunks(keys), chunks(values)

    def read_one():
        for k, x in zip(keys, values):
            if get(k) != x:
                raise WrongRead(f"key {k.hex()}: a read returned wrong contents")

    def write_one():
        for k, x in zip(keys, values):
            put(k, x)

    def read_many():
        for c, d in zip(kc, vc):
            if list(get_many(c)) != d:
                raise WrongRead(f"keys from {c[0].hex()}: a read returned wrong contents")

    def write_many():
        for c, d in zip(kc, vc):
            put_many(c, d)
    return [read_one, write_one, read_many, write_many]


def open_stash(keys, values, workdir):
    name = f"bench-py-{os.getpid()}"
    arena = stash.Arena.create(name, size=max(256 << 20, len(keys) * 1024),
                               max_parallelism=128, replace=True)
    w = stash.Worker(name)
    v = w.state("v")
    for k, x in zip(keys, values):
        v.write(k, x)

    def close():
        w.close()
        arena.close()
        stash.Arena.destroy(name)
    return cases_of(v.read, v.write, v.read_many, v.write_many, keys, values), close


def open_lmdb(keys, values, workdir):
    """python3-lmdb at its best here: the map in /dev/shm, written through
    (writemap), no syncs, no readahead; a transaction a call, as its users
    write one."""
    import lmdb
    env = lmdb.open(os.path.join(workdir, "lmdb"), map_size=max(1 << 30, len(keys) * 4096),
                    sync=False, metasync=False, readahead=False, writemap=True)
    with env.begin(write=True) as txn:
        for k, x in zip(keys, values):
            txn.put(k, x)

    def get(k):
        with env.begin() as txn:
            return txn.get(k)

    def put(k, x):
        with env.begin(write=True) as txn:
            txn.put(k, x)

    def get_many(c):
        with env.begin() as txn:
            return [txn.get(k) for k in c]

    def put_many(c, d):
        with env.begin(write=True) as txn:
            for k, x in zip(c, d):
                txn.put(k, x)
    return cases_of(get, put, get_many, put_many, keys, values), env.close


def open_redis(keys, values, workdir):
    import redis
    server = shutil.which("redis-server")
    if not server:
        raise RuntimeError("redis-server not installed")
    sock = os.path.join(workdir, "redis.sock")
    proc = subprocess.Popen([server, "--port", "0", "--unixsocket", sock, "--save", "",
                             "--appendonly", "no", "--dir", workdir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def close():
        proc.terminate()
        proc.wait()
    try:
        r = redis.Redis(unix_socket_path=sock)
        for _ in range(500):
            try:
                r.ping()
                break
            except (redis.exceptions.ConnectionError, socket.error):
                time.sleep(0.01)
        r.mset(dict(zip(keys, values)))
        return cases_of(r.get, r.set, r.mget, lambda c, d: r.mset(dict(zip(c, d))),
                        keys, values), close
    except BaseException:
        close()
        raise


SYSTEMS = [("stash", open_stash), ("python3-lmdb", open_lmdb), ("python3-redis", open_redis)]


def spread(v):
    v = sorted(v)
    mid = len(v) // 2
    return (v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2), v[0], v[-1]


def main(argv):
    quick = "--quick" in argv
    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 3
    n = 10000 if quick else 200000
    order = list(range(n))
    rng = random.Random(20261206)
    rng.shuffle(order)
    keys = [stash_key(i) for i in order]
    values = [(i.to_bytes(8, "little") * 13)[:100] for i in order]
    workdir = tempfile.mkdtemp(prefix="stash-bench-py-", dir="/dev/shm")
    opened, why, closes = {}, {}, []
    rates = {s: [[] for _ in CASES] for s, _ in SYSTEMS}
    try:
        for system, open_ in SYSTEMS:
            print(f"python: opening {system}", file=sys.stderr, flush=True)
            try:
                opened[system], close = open_(keys, values, workdir)
                closes.append(close)
            except ImportError as e:
                why[system] = f"not installed ({e.name or e})"
            except Exception as e:  # a peer that cannot run is skipped, saying why
                why[system] = f"{type(e).__name__}: {e}"
        # The systems interleaved: each repetition runs every case on every
        # system, in a new order each time.
        for rep in range(reps):
            for c in range(len(CASES)):
                systems = list(opened)
                rng.shuffle(systems)
                for system in systems:
                    print(f"python: {CASES[c]}: {system}: repetition {rep + 1}",
                          file=sys.stderr, flush=True)
                    t = time.perf_counter()
                    try:
                        opened[system][c]()
                    except Exception as e:
                        why[system] = f"failed: {CASES[c]}: {type(e).__name__}: {e}"
                        del opened[system]
                        continue
                    rates[system][c].append(n / (time.perf_counter() - t))
    finally:
        for close in closes:
            close()
        shutil.rmtree(workdir, ignore_errors=True)
    for i, case in enumerate(CASES):
        for system, _ in SYSTEMS:
            if system not in opened:
                print(f"{case}\t{system}\t0\tops/s\t{why[system]}")
            else:
                m, lo, hi = spread(rates[system][i])
                print(f"{case}\t{system}\t{m:.1f}\tops/s\t{lo:.1f}\t{hi:.1f}")
        s = rates["stash"]
        for peer in ("python3-lmdb", "python3-redis"):
            if "stash" not in opened or peer not in opened:
                continue
            p = rates[peer]
            m, lo, hi = spread([a / b for a, b in zip(s[i], p[i])])
            print(f"{case}\tstash/{peer}\t{m:.3f}\tratio\t{lo:.3f}\t{hi:.3f}")
            # Many keys a call against the peer's one key a call: what the
            # batch saves of the call's cost.
            if case.endswith("batch32"):
                m, lo, hi = spread([a / b for a, b in zip(s[i], p[i - 2])])
                print(f"{case}\tstash/{peer}-one\t{m:.3f}\tratio\t{lo:.3f}\t{hi:.3f}")
    return 0


def stash_key(i):
    """The keyed bench's keys: splitmix64's finalizer of i, 8 bytes."""
    m = (1 << 64) - 1
    z = (i + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return (z ^ (z >> 31)).to_bytes(8, "little")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
