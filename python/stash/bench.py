# SPDX-License-Identifier: MIT
"""`stash bench python`'s measurements (python3 -m stash.bench): value reads
and writes from Python, one key a call and 32 keys a call, beside
python3-lmdb and python3-redis used the way their users do (a transaction
per call, MGET/MSET for many keys), in the same run. Prints one line per
figure: case, system, value (the median), unit, then the lowest and highest
repetition, or for a peer that could not run why, separated by tabs;
stash-bench reports them."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import stash

BATCH = 32
CASES = ["value-read/one", "value-write/one", "value-read/batch32", "value-write/batch32"]


def timed(fn, n, reps):
    """Operations per second of fn(), which does n of them: the median,
    lowest and highest of reps."""
    rates = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        rates.append(n / (time.perf_counter() - t))
    rates.sort()
    mid = len(rates) // 2
    median = rates[mid] if len(rates) % 2 else (rates[mid - 1] + rates[mid]) / 2
    return (median, rates[0], rates[-1])


def chunks(xs):
    return [xs[i:i + BATCH] for i in range(0, len(xs), BATCH)]


def bench_stash(keys, values, reps):
    name = f"bench-py-{os.getpid()}"
    arena = stash.Arena.create(name, size=max(256 << 20, len(keys) * 1024),
                               max_parallelism=128, replace=True)
    w = stash.Worker(name)
    v = w.state("v")
    try:
        for k, x in zip(keys, values):
            v.write(k, x)
        kc, vc = chunks(keys), chunks(values)

        def read_one():
            for k in keys:
                v.read(k)

        def write_one():
            for k, x in zip(keys, values):
                v.write(k, x)

        def read_many():
            for c in kc:
                v.read_many(c)

        def write_many():
            for c, d in zip(kc, vc):
                v.write_many(c, d)
        return [timed(f, len(keys), reps) for f in (read_one, write_one, read_many, write_many)]
    finally:
        w.close()
        arena.close()
        stash.Arena.destroy(name)


def bench_lmdb(keys, values, reps, workdir):
    import lmdb
    env = lmdb.open(os.path.join(workdir, "lmdb"), map_size=max(1 << 30, len(keys) * 4096),
                    sync=False, metasync=False, readahead=False)
    try:
        with env.begin(write=True) as txn:
            for k, x in zip(keys, values):
                txn.put(k, x)
        kc, vc = chunks(keys), chunks(values)

        def read_one():
            for k in keys:
                with env.begin() as txn:
                    txn.get(k)

        def write_one():
            for k, x in zip(keys, values):
                with env.begin(write=True) as txn:
                    txn.put(k, x)

        def read_many():
            for c in kc:
                with env.begin() as txn:
                    for k in c:
                        txn.get(k)

        def write_many():
            for c, d in zip(kc, vc):
                with env.begin(write=True) as txn:
                    for k, x in zip(c, d):
                        txn.put(k, x)
        return [timed(f, len(keys), reps) for f in (read_one, write_one, read_many, write_many)]
    finally:
        env.close()


def bench_redis(keys, values, reps, workdir):
    import redis
    server = shutil.which("redis-server")
    if not server:
        raise RuntimeError("redis-server not installed")
    sock = os.path.join(workdir, "redis.sock")
    proc = subprocess.Popen([server, "--port", "0", "--unixsocket", sock, "--save", "",
                             "--appendonly", "no", "--dir", workdir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(unix_socket_path=sock)
        for _ in range(500):
            try:
                r.ping()
                break
            except (redis.exceptions.ConnectionError, socket.error):
                time.sleep(0.01)
        r.mset(dict(zip(keys, values)))
        kc, vc = chunks(keys), chunks(values)

        def read_one():
            for k in keys:
                r.get(k)

        def write_one():
            for k, x in zip(keys, values):
                r.set(k, x)

        def read_many():
            for c in kc:
                r.mget(c)

        def write_many():
            for c, d in zip(kc, vc):
                r.mset(dict(zip(c, d)))
        return [timed(f, len(keys), reps) for f in (read_one, write_one, read_many, write_many)]
    finally:
        proc.terminate()
        proc.wait()


def main(argv):
    quick = "--quick" in argv
    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 3
    n = 10000 if quick else 200000
    keys = [i.to_bytes(8, "little") for i in range(n)]
    values = [(i.to_bytes(8, "little") * 13)[:100] for i in range(n)]
    workdir = tempfile.mkdtemp(prefix="stash-bench-py-")
    results = {}
    try:
        for system, run in (("stash", lambda: bench_stash(keys, values, reps)),
                            ("python3-lmdb", lambda: bench_lmdb(keys, values, reps, workdir)),
                            ("python3-redis", lambda: bench_redis(keys, values, reps, workdir))):
            print(f"python: {system}", file=sys.stderr, flush=True)
            try:
                results[system] = run()
            except ImportError as e:
                results[system] = f"not installed ({e.name or e})"
            except Exception as e:  # a peer that cannot run is skipped, saying why
                results[system] = f"{type(e).__name__}: {e}"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for i, case in enumerate(CASES):
        for system, r in results.items():
            if isinstance(r, str):
                print(f"{case}\t{system}\t0\tops/s\t{r}")
            else:
                print(f"{case}\t{system}\t{r[i][0]:.1f}\tops/s\t{r[i][1]:.1f}\t{r[i][2]:.1f}")
        for peer in ("python3-lmdb", "python3-redis"):
            s, p = results.get("stash"), results.get(peer)
            if isinstance(s, list) and isinstance(p, list):
                print(f"{case}\tstash/{peer}\t{s[i][0] / p[i][0]:.3f}\tratio")
                # Many keys a call against the peer's one key a call: what
                # the batch saves of the call's cost.
                if case.endswith("batch32"):
                    print(f"{case}\tstash/{peer}-one\t{s[i][0] / p[i - 2][0]:.3f}\tratio")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
