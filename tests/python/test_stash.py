# SPDX-License-Identifier: MIT
"""The Python module's suite: every call, a Python worker and a C worker in
one job, a Python reader watching a C worker live, and a Python worker
killed with SIGKILL and rolled back. Runs with Debian's python3 against the
build's libstash (STASH_LIBRARY) and C worker (STASH_C_WORKER)."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import unittest

import stash

C_WORKER = os.environ.get("STASH_C_WORKER", "")
BACKEND = stash.LMDB if os.environ.get("STASH_TEST_BACKEND") == "lmdb" else stash.HEAP


def u64(b):
    return stash.as_int(b)


class Job(unittest.TestCase):
    """A fresh arena (and checkpoint directory) per test."""

    def setUp(self):
        self.name = f"t-py-{os.getpid()}-{self.id().rsplit('.', 1)[-1][:24]}"
        self.dir = tempfile.mkdtemp(prefix="stash-py-")
        self.lmdb_dir = os.path.join(self.dir, "lmdb") if BACKEND == stash.LMDB else None
        self.arena = stash.Arena.create(self.name, size=64 << 20, max_parallelism=16,
                                        backend=BACKEND, lmdb_dir=self.lmdb_dir, replace=True)
        self.closing = []

    def tearDown(self):
        for c in reversed(self.closing):
            c()
        self.arena.close()
        stash.Arena.destroy(self.name)
        shutil.rmtree(self.dir, ignore_errors=True)

    @staticmethod
    def reap(proc):
        """Ends a child the test started, whatever state it is in."""
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()

    def worker(self, **kw):
        w = stash.Worker(self.name, **kw)
        self.closing.append(w.close)
        return w

    def service(self, **kw):
        s = stash.Service(self.name, dir=os.path.join(self.dir, "chk"), **kw)
        self.closing.append(s.stop)
        return s

    def checkpoint_at_barriers(self, workers):
        """Takes a checkpoint while the workers call barriers; returns its
        facts and the events the workers saw."""
        done, out, events = threading.Event(), {}, []

        def take():
            try:
                out["info"] = self.arena.checkpoint(60000)
            except stash.StashError as e:
                out["error"] = e
            done.set()
        t = threading.Thread(target=take)
        t.start()
        while not done.is_set():
            for w in workers:
                e = w.barrier()
                if e:
                    events.append(e)
        t.join()
        if "error" in out:
            raise out["error"]
        for w in workers:  # the complete event reaches each at its next barrier
            e = w.barrier()
            if e:
                events.append(e)
        return out["info"], events


class Calls(Job):
    def test_value_state_bytes_str_int_and_views(self):
        w = self.worker()
        v = w.state("v", default=b"none")
        w.key("alice")
        self.assertEqual(v.get(), b"none")
        v.put("hello")
        self.assertEqual(v.get(), b"hello")
        w.key(7)
        v.put(42)
        self.assertEqual(u64(v.get()), 42)
        view = v.view()
        self.assertEqual(view.tobytes(), (42).to_bytes(8, "little"))
        self.assertEqual(len(view), 8)
        v.put(43)
        with self.assertRaises(stash.Stale):
            view.tobytes()
        v.namespace("ns1").put(b"\x00\xff")
        self.assertEqual(v.get(), b"\x00\xff")
        v.namespace(None)
        self.assertEqual(u64(v.get()), 43)
        v.clear()
        self.assertEqual(v.get(), b"none")
        self.assertEqual(w.key_group(), stash.key_group(7, 16))
        with self.assertRaises(TypeError):
            w.key(True)

    def test_one_call_reads_and_writes_of_one_key_and_many(self):
        w = self.worker()
        v = w.state("v")
        v.write("a", "1")
        v.write(2, b"two")
        self.assertEqual(v.read("a"), b"1")
        self.assertIsNone(v.read("nope"))
        self.assertEqual(w.key_group(), stash.key_group("nope", 16), "the key is current")
        keys = list(range(100)) + ["x", b"y", bytearray(b"z")]
        v.write_many(keys, [str(k) for k in range(len(keys))])
        got = v.read_many(keys + ["absent"])
        self.assertEqual(got[:3], [b"0", b"1", b"2"])
        self.assertEqual(got[-2], b"102")
        self.assertIsNone(got[-1])
        w.key(5)
        self.assertEqual(v.get(), b"5")
        v.write(5, None)
        self.assertIsNone(v.read(5))
        w.key(7)
        v.put(b"seven")
        view = v.view()
        v.write(8, b"eight")  # another key, in one call: the view goes stale too
        with self.assertRaises(stash.Stale):
            bytes(view)
        with self.assertRaises(ValueError):
            v.write_many([1, 2], [b"x"])
        with self.assertRaises(TypeError):
            v.read(1.5)
        reader = stash.Reader(self.name)
        self.closing.append(reader.close)
        rv = reader.state("v")
        with self.assertRaises(stash.StashError) as cm:
            rv.write("a", "no")
        self.assertEqual(cm.exception.code, stash.EKEYGROUP)
        if BACKEND == stash.HEAP:  # lmdb: visible to a reader once committed
            self.assertEqual(rv.read_many(["a", 2, "nope"]), [b"1", b"2", None])
        reader.close()
        with self.assertRaises(stash.StashError):
            rv.read("a")  # a closed handle raises, never reads freed memory

    def test_list_map_reducing_aggregating(self):
        w = self.worker()
        lst = w.state("l", stash.LIST)
        m = w.state("m", stash.MAP)
        r = w.state("r", stash.REDUCING,
                    reduce=lambda acc, x: stash.to_bytes((u64(acc) or 0) + u64(x)))
        a = w.state("a", stash.AGGREGATING, create=lambda: stash.to_bytes(0),
                    add=lambda acc, x: stash.to_bytes(u64(acc) + len(x)),
                    result=lambda acc: str(u64(acc)),
                    merge=lambda x, y: stash.to_bytes(u64(x) + u64(y)))
        w.key("k")
        self.assertEqual(lst.get(), [])
        lst.add("a")
        lst.add_all(["b", "c"])
        self.assertEqual(lst.get(), [b"a", b"b", b"c"])
        lst.update(["z"])
        self.assertEqual(lst.get(), [b"z"])
        lst.namespace("w1").add("x")
        lst.merge_namespaces("w0", ["w1"])
        self.assertEqual(lst.namespace("w0").get(), [b"x"])
        self.assertEqual(lst.namespace("w1").get(), [])
        self.assertTrue(m.is_empty())
        m.put("a", 1)
        m.put_all({"b": 2, "c": 3})
        self.assertIn("b", m)
        self.assertNotIn("q", m)
        self.assertEqual(m.get("q", b"?"), b"?")
        m.remove("c")
        self.assertEqual({k: u64(v) for k, v in m.items()}, {b"a": 1, b"b": 2})
        for x in (5, 7):
            r.add(x)
        self.assertEqual(u64(r.get()), 12)
        for x in ("ab", "cde"):
            a.add(x)
        self.assertEqual(a.get(), b"5")

    def test_operator_state_and_keys(self):
        w = self.worker()
        ol = w.state("ol", stash.OP_LIST)
        un = w.state("un", stash.OP_UNION)
        bc = w.state("bc", stash.OP_BROADCAST)
        ol.add("a")
        ol.update(["x", "y"])
        un.add("u")
        bc.put("rule", "on")
        self.assertEqual(ol.get(), [b"x", b"y"])
        self.assertEqual(un.get(), [b"u"])
        self.assertEqual(bc.get("rule"), b"on")
        self.assertEqual(bc.to_dict(), {b"rule": b"on"})
        bc.remove("rule")
        self.assertIsNone(bc.get("rule"))
        v = w.state("v")
        for k in range(50):
            w.key(k)
            v.put(k)
        self.assertEqual(sorted(u64(k) for k in v.keys(ns=b"")), list(range(50)))
        pairs = list(v.keys())
        self.assertEqual(len(pairs), 50)
        self.assertTrue(all(ns == b"" for _, ns in pairs))
        total = sum(len(list(v.keys(ns=b"", key_group=kg))) for kg in range(16))
        self.assertEqual(total, 50)

    def test_errors_carry_code_words_and_detail(self):
        w = self.worker()
        w.state("v")
        with self.assertRaises(stash.StashError) as cm:
            w.state("v", stash.LIST)
        e = cm.exception
        self.assertEqual(e.code, stash.EKIND)
        self.assertIn("kind", e.words)
        self.assertIn("'v'", e.detail)
        self.assertIn(e.detail, str(e))

    def test_a_second_worker_at_a_held_index_is_refused(self):
        self.worker()
        with self.assertRaises(stash.StashError) as cm:
            stash.Worker(self.name)
        self.assertEqual(cm.exception.code, -1006)
        with self.assertRaises(stash.StashError) as cm:
            stash.Worker("t-py-no-such-arena")
        self.assertEqual(cm.exception.code, -2)
        self.assertIn("t-py-no-such-arena", str(cm.exception))
        self.assertEqual(stash.strerror(stash.ENOTFOUND), "not found")

    def test_exceptions_in_callbacks_come_back(self):
        w = self.worker()

        def bad(acc, x):
            raise ValueError("from reduce")
        r = w.state("r", stash.REDUCING, reduce=bad)
        w.key(1)
        r.add(1)  # the first add stores the value: reduce is not called
        with self.assertRaises(ValueError):
            r.add(2)

    def test_batches_and_timers(self):
        w = self.worker()
        v = w.state("v")
        with w.batch(capacity=8, states=[v]) as b:
            for k in range(8):
                self.assertTrue(b.add(k, k * 10))
            self.assertFalse(b.add(99, 0))
            self.assertEqual(len(b), 8)
            self.assertEqual(b.run(lambda e: v.put(e)), [0] * 8)
            self.assertEqual(len(b), 0)
            b.add(3, None)

            def boom(e):
                raise RuntimeError("in the batch")
            with self.assertRaises(RuntimeError):
                b.run(boom)
        w.key(3)
        self.assertEqual(u64(v.get()), 30)
        t = w.timers("windows")
        for k, ts in ((1, 300), (2, 100), (3, 200)):
            w.key(k)
            t.register(ts, "w")
        w.key(3)
        t.delete(200, "w")
        self.assertEqual(len(t.timers(-1)), 0)
        fired = []
        self.assertEqual(t.advance(250, lambda tm: fired.append((u64(tm.key), tm.timestamp))), 1)
        self.assertEqual(fired, [(2, 100)])
        self.assertEqual(t.watermark, 250)
        self.assertEqual(t.advance(1000, lambda tm: fired.append((u64(tm.key), tm.timestamp))),
                         1)
        self.assertEqual(fired[-1], (1, 300))

    def test_reader_reads_what_a_worker_wrote_and_writes_nothing(self):
        w = self.worker()
        v = w.state("v")
        m = w.state("m", stash.MAP)
        w.key("alice")
        v.put("one")
        m.put("x", "10")
        if BACKEND == stash.LMDB:
            import time
            time.sleep(0.05)
        w.barrier()
        r = stash.Reader(self.name)
        self.closing.append(r.close)
        rv, rm = r.state("v"), r.state("m")
        r.key("alice")
        self.assertEqual(rv.get(), b"one")
        self.assertEqual(rm.to_dict(), {b"x": b"10"})
        with self.assertRaises(stash.StashError) as cm:
            rv.put("two")
        self.assertEqual(cm.exception.code, stash.EKEYGROUP)
        with self.assertRaises(stash.StashError):
            r.barrier()
        with self.assertRaises(stash.NotFound):
            r.state("nope")

    def test_service_checkpoint_savepoint_status_and_reading_them(self):
        self.service()
        w = self.worker()
        v = w.state("v")
        w.key("k")
        v.put("before")
        info, events = self.checkpoint_at_barriers([w])
        self.assertEqual(info["status"], 0)
        self.assertIn((stash.CHECKPOINT_COMPLETE, info["id"]),
                      [(e.kind, e.checkpoint_id) for e in events])
        v.put("after")
        st = self.arena.status()
        self.assertEqual(st["completed"], info["id"])
        self.assertEqual(st["pid"], os.getpid())
        self.assertEqual(st["completed_total"], 1)
        self.assertEqual(st["failed_total"], 0)
        self.assertIn(st["io_backend"], ("io_uring", "threads"))
        self.assertGreater(st["io_bytes_written"], 0)
        counts = self.arena.op_counts(0)
        self.assertEqual(counts["value_writes"], 2)
        self.assertEqual(counts["value_reads"], 0)
        pinned = stash.Reader(self.name, at_checkpoint=True)
        self.closing.append(pinned.close)
        pinned.key("k")
        self.assertEqual(pinned.state("v").get(), b"before")
        offline = stash.Reader(checkpoint_dir=os.path.join(self.dir, "chk", f"chk-{info['id']}"))
        self.closing.append(offline.close)
        offline.key("k")
        self.assertEqual(offline.state("v").get(), b"before")
        done = {}
        t = threading.Thread(target=lambda: done.update(sp=self.arena.savepoint(60000)))
        t.start()
        while t.is_alive():
            w.barrier()
        t.join()
        self.assertTrue(done["sp"]["savepoint"])


class Control(Job):
    def test_arena_worker_and_service_facts_and_a_stop_request(self):
        info = self.arena.info()
        self.assertEqual(info["max_parallelism"], 16)
        self.assertEqual(info["backend"], "lmdb" if BACKEND == stash.LMDB else "heap")
        self.assertEqual(stash.kg_range(16, 2, 1), (8, 15))
        with self.assertRaises(stash.StashError):
            stash.kg_range(16, 2, 2)
        w = self.worker(index=1, parallelism=2)
        wi = w.info()
        self.assertEqual((wi["index"], wi["parallelism"], wi["range"]), (1, 2, (8, 15)))
        self.assertEqual(wi["pid"], os.getpid())
        with self.assertRaises(stash.StashError) as cm:
            self.arena.checkpoint(1000)
        self.assertEqual(cm.exception.code, -1015, "no service")
        lines, records = [], []
        svc = stash.Service(self.name, dir=os.path.join(self.dir, "chk"), log=lines.append,
                            log_record=records.append)
        self.assertFalse(svc.stopped())
        # A stop request waits until the engine is gone: here, until this
        # process, which runs it, sees it stopped and ends it.
        asked = threading.Thread(target=self.arena.request_stop, args=(60000,))
        asked.start()
        while not svc.stopped():
            asked.join(0.01)
        svc.stop()
        asked.join()
        self.assertEqual(self.arena.status()["pid"], 0)
        self.assertTrue(lines, "the service logged")
        # The engine's thread may log the worker it finds before start logs.
        self.assertTrue(any(" INFO service: serving " in line for line in lines), lines)
        serving = [r for r in records if r.message.startswith("serving ")]
        self.assertEqual(len(serving), 1, records)
        self.assertEqual((serving[0].level, serving[0].subject), (stash.LOG_INFO, "service"))
        self.assertTrue(stash.version().count(".") == 2)

    def test_a_stop_with_a_savepoint(self):
        svc = stash.Service(self.name, dir=os.path.join(self.dir, "chk"))
        done = {}
        asked = threading.Thread(
            target=lambda: done.update(sp=self.arena.stop_with_savepoint(60000)))
        asked.start()
        while not svc.stopped():
            asked.join(0.01)
        svc.stop()
        asked.join()
        self.assertTrue(done["sp"]["savepoint"], done)
        self.assertTrue(done["sp"]["detail"].endswith(f"savepoint-{done['sp']['id']}"), done)
        status = self.arena.status()
        self.assertEqual(status["pid"], 0)
        self.assertEqual(status["completed"], done["sp"]["id"])


class Snapshots(Job):
    """A checkpoint read, rewritten and bootstrapped offline."""

    def checkpoint(self):
        self.service()
        w = self.worker()
        v, lst, m = w.state("v"), w.state("l", stash.LIST), w.state("m", stash.MAP)
        w.state("offsets", stash.OP_LIST).add(b"offset-7")
        for k in range(40):
            w.key(k)
            v.put(k * 3)
        w.key(1)
        lst.add(b"a")
        lst.add(b"bb")
        m.put(b"k", b"val")
        info, _ = self.checkpoint_at_barriers([w])
        return info["detail"]

    def test_entries_states_and_operator_state_are_read(self):
        path = self.checkpoint()
        with stash.Snapshot(path) as snap:
            self.assertEqual(snap.info()["max_parallelism"], 16)
            kinds = {s["name"]: s["kind"] for s in snap.states()}
            self.assertEqual(kinds, {"v": stash.VALUE, "l": stash.LIST, "m": stash.MAP,
                                     "offsets": stash.OP_LIST})
            entries = list(snap.entries())
            values = {u64(e.key): u64(e.value) for e in entries if e.state == "v"}
            self.assertEqual(values, {k: 3 * k for k in range(40)})
            for e in entries:
                self.assertEqual(e.kg, stash.key_group(e.key, 16))
            self.assertEqual(sorted((e.index, e.value) for e in entries if e.state == "l"),
                             [(0, b"a"), (1, b"bb")])
            self.assertEqual([(e.map_key, e.value) for e in entries if e.state == "m"],
                             [(b"k", b"val")])
            ops = snap.operator_state()
            self.assertEqual([(e.state, e.worker, e.value) for e in ops],
                             [("offsets", 0, b"offset-7")])
            self.assertEqual(len(list(snap.entries(0, 0))),
                             sum(1 for e in entries if e.kg == 0))
        with self.assertRaises(stash.StashError) as caught:
            stash.Snapshot(os.path.join(self.dir, "nosuch"))
        self.assertIn("nosuch", str(caught.exception))

    def test_a_rewrite_drops_renames_sets_a_ttl_and_rehashes(self):
        path = self.checkpoint()
        to = os.path.join(self.dir, "rewritten")
        with stash.Snapshot(path) as snap:
            out = snap.rewrite(to, max_parallelism=48, drop=["m"], rename={"v": "w"},
                               ttl={"l": 60000})
        self.assertEqual((out["max_parallelism"], out["states"]), (48, 3))
        with stash.Snapshot(to) as snap:
            states = {s["name"]: s for s in snap.states()}
            self.assertEqual(sorted(states), ["l", "offsets", "w"])
            self.assertEqual(states["l"]["ttl_ms"], 60000)
            entries = list(snap.entries())
            self.assertEqual(sum(1 for e in entries if e.state == "w"), 40)
            for e in entries:
                self.assertEqual(e.kg, stash.key_group(e.key, 48))
            self.assertTrue(all(e.ttl_ms > 0 for e in entries if e.state == "l"))
            with self.assertRaises(stash.NotFound):
                snap.rewrite(os.path.join(self.dir, "other"), drop=["nosuch"])
        self.assertFalse(os.path.exists(os.path.join(self.dir, "other")))

    def test_a_bootstrapped_savepoint_starts_a_job(self):
        to = os.path.join(self.dir, "boot")
        with stash.SnapshotWriter(to, max_parallelism=16, id=3, op_parallelism=1) as sw:
            sw.state("count")
            sw.state("seen", stash.LIST)
            sw.state("offsets", stash.OP_LIST)
            for k in range(25):
                sw.put("count", k, k + 100)
            sw.put("seen", 2, b"x")
            sw.put("seen", 2, b"y")
            sw.delete("count", 24)
            sw.op_put("offsets", 0, b"o-1")
        with self.assertRaises(ValueError):
            with stash.SnapshotWriter(os.path.join(self.dir, "aborted")) as sw:
                sw.state("count")
                raise ValueError("the job changed its mind")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "aborted")))
        for lazy in (False, True):
            self.start_from(to, lazy)

    def start_from(self, to, lazy):
        """A new arena from savepoint to, restored whole or lazily (each key
        group when first touched)."""
        name = self.name + ("-lazy" if lazy else "-boot")
        lines = []
        svc = stash.Service(name, dir=os.path.join(self.dir, name + "-chk"), restore=to,
                            backend=BACKEND, log=lines.append, lazy_restore=lazy,
                            lmdb_dir=self.lmdb_dir and self.lmdb_dir + name)
        if lazy:
            self.assertTrue(any("lazily" in line for line in lines), lines)
        try:
            w = stash.Worker(name)
            try:
                count = w.state("count")
                for k in range(24):
                    w.key(k)
                    self.assertEqual(u64(count.get()), k + 100)
                w.key(24)
                self.assertIsNone(count.get())
                w.key(2)
                self.assertEqual(w.state("seen", stash.LIST).get(), [b"x", b"y"])
                self.assertEqual(w.state("offsets", stash.OP_LIST).get(), [b"o-1"])
            finally:
                w.close()
        finally:
            svc.stop()
            stash.Arena.destroy(name)


class Processes(Job):
    def test_a_python_worker_and_a_c_worker_in_one_job_and_a_python_reader_watching(self):
        if not C_WORKER:
            self.skipTest("STASH_C_WORKER is not set")
        self.service(interval_ms=50)
        keys, rounds = 200, 30
        c = subprocess.Popen([C_WORKER, self.name, "1", "2", str(keys), str(rounds)],
                             stdout=subprocess.PIPE, text=True)
        self.closing.append(lambda: self.reap(c))
        w = self.worker(index=0, parallelism=2)
        count = w.state("count")
        first, last = w.info()["range"]
        mine = [k for k in range(keys) if first <= stash.key_group(k, 16) <= last]
        theirs = [k for k in range(keys) if k not in set(mine)]
        self.assertEqual(c.stdout.readline().strip(), "ready")
        # A reader watches the C worker's counts grow, never torn, never back.
        r = stash.Reader(self.name)
        self.closing.append(r.close)
        rc = r.state("count")
        seen = {k: 0 for k in theirs}
        for rnd in range(rounds):
            for k in mine:
                w.key(k)
                count.put(u64(count.get(0)) + 1)
            w.barrier()
            for k in theirs[::7]:
                r.key(k)
                b = rc.get()
                if b is not None:
                    self.assertEqual(len(b), 8)
                    self.assertGreaterEqual(u64(b), seen[k])
                    self.assertLessEqual(u64(b), rounds)
                    seen[k] = u64(b)
        while c.poll() is None:
            w.barrier()
        self.assertEqual(c.returncode, 0)
        self.assertEqual(c.stdout.read().strip(), "done")
        # The Python worker's last writes are in a checkpoint it cuts now
        # (on lmdb, also what makes them visible to other processes).
        self.checkpoint_at_barriers([w])
        for k in range(keys):
            r.key(k)
            self.assertEqual(u64(rc.get()), rounds, f"key {k}")


CHILD = r"""
import os, sys, stash
name = sys.argv[1]
cuts = {}
def on_cut(w, cid):
    w.key("k")
    cuts[cid] = stash.as_int(v.get(0))
w = stash.Worker(name, on_cut=on_cut)
v = w.state("v")
n = 0
while True:
    w.key("k")
    n += 1
    v.put(n)
    e = w.barrier()
    # (a checkpoint the engine cut for it while it was away has no on_cut)
    if e and e.kind == stash.CHECKPOINT_COMPLETE and e.checkpoint_id in cuts:
        print(e.checkpoint_id, cuts[e.checkpoint_id], flush=True)
"""


class Kill(Job):
    def test_a_python_worker_killed_rolls_back_to_its_last_complete_checkpoint(self):
        self.service(interval_ms=20)
        env = dict(os.environ)
        child = subprocess.Popen([sys.executable, "-c", CHILD, self.name],
                                 stdout=subprocess.PIPE, text=True, env=env)
        self.closing.append(lambda: self.reap(child))
        completed = {}
        while len(completed) < 3:
            line = child.stdout.readline()
            self.assertTrue(line, "the worker died")
            cid, value = map(int, line.split())
            completed[cid] = value
        child.send_signal(signal.SIGKILL)
        child.wait()
        self.assertEqual(child.returncode, -signal.SIGKILL)
        w = stash.Worker(self.name, rollback=True)
        self.closing.append(w.close)
        v = w.state("v")
        e = w.barrier()
        self.assertEqual(e.kind, stash.ROLLED_BACK)
        # The checkpoint restored is complete: the newest the worker heard
        # of, or one completed after it (its cut value not yet printed).
        self.assertGreaterEqual(e.checkpoint_id, max(completed))
        w.key("k")
        got = u64(v.get())
        if e.checkpoint_id in completed:
            self.assertEqual(got, completed[e.checkpoint_id])
        else:
            self.assertGreater(got, completed[max(completed)])


# ---- closed handles and threads -------------------------------------------

def run_child(test, body, *args):
    """Runs body (Python; NAME is the test's arena, ARGS the rest) in a child
    process, where a crash cannot take the suite with it: what it printed.
    A child killed by a signal fails the test, naming the signal and the
    last step it printed."""
    code = "import os, sys, threading, stash\nNAME, ARGS = sys.argv[1], sys.argv[2:]\n" + body
    p = subprocess.run([sys.executable, "-c", code, test.name, *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    if p.returncode < 0:
        steps = [line for line in p.stdout.splitlines() if line.startswith("step\t")]
        test.fail(f"the child was killed by {signal.Signals(-p.returncode).name} "
                  f"at {steps[-1:] or 'its start'}; stderr: {p.stderr[-2000:]}")
    test.assertEqual(p.returncode, 0, p.stderr)
    return p.stdout


# Every handle of the module, and what each gave out, called after it is
# closed: each step prints what it did ("step", then "closed", "other" or
# "returned" with the exception and its message).
AFTER_CLOSE = r"""
import shutil, tempfile
def step(what, fn):
    print("step", what, sep="\t", flush=True)
    try:
        fn()
    except stash.Closed as e:
        print("closed", what, str(e), sep="\t", flush=True)
    except Exception as e:
        print("other", what, f"{type(e).__name__}: {e}", sep="\t", flush=True)
    else:
        print("returned", what, sep="\t", flush=True)

w = stash.Worker(NAME)
v = w.state("v")
lst = w.state("l", stash.LIST)
m = w.state("m", stash.MAP)
red = w.state("r", stash.REDUCING, reduce=lambda a, x: x)
agg = w.state("g", stash.AGGREGATING, create=lambda: b"", add=lambda a, x: x,
              result=lambda a: a)
ol = w.state("o", stash.OP_LIST)
bc = w.state("b", stash.OP_BROADCAST)
for k in range(50):
    v.write(k, k)
w.key(1)
lst.add(b"x")
m.put(b"mk", b"mv")
tm = w.timers("t")
tm.register(100)
keys = v.keys(ns=b"")
next(keys)
items = m.items()
view = v.view()
read, write = v.read, v.write
batch = w.batch(capacity=8)
batch.add(1, None)
borrowed = w.arena()
own = w.batch()
own.close()
step("batch.add after its close", lambda: own.add(1, None))
step("len(batch) after its close", lambda: len(own))
step("batch.run after its close", lambda: own.run(lambda e: 0))
other = w.arena()
other.close()
step("a worker after its arena() handle closed", lambda: v.write(1, 1))
calling = []
inside = w.state("inside", stash.REDUCING, reduce=lambda a, x: calling[0]())
for what, fn in (("close", w.close), ("hand_over", w.hand_over)):
    calling[:] = [fn]
    w.key(what)
    inside.add(1)
    step(f"worker.{what} inside a reduce of its own call", lambda: inside.add(2))
w.close()
step("worker.close again", w.close)
for what, fn in [
        ("worker.key", lambda: w.key(1)), ("worker.key_group", w.key_group),
        ("worker.barrier", w.barrier), ("worker.info", w.info), ("worker.arena", w.arena),
        ("worker.state", lambda: w.state("v")), ("worker.state new", lambda: w.state("new")),
        ("worker.timers", lambda: w.timers("t")), ("worker.batch", w.batch),
        ("value.get", v.get), ("value.view", v.view), ("value.put", lambda: v.put(1)),
        ("value.read", lambda: v.read(1)), ("value.write", lambda: v.write(1, 2)),
        ("value.read_many", lambda: v.read_many([1, 2])),
        ("value.write_many", lambda: v.write_many([1], [2])),
        ("value.namespace", lambda: v.namespace("n")), ("value.clear", v.clear),
        ("value.keys", lambda: v.keys(ns=b"")),
        ("read bound before close", lambda: read(1)),
        ("write bound before close", lambda: write(1, 2)),
        ("list.get", lst.get), ("list.add", lambda: lst.add(1)),
        ("list.add_all", lambda: lst.add_all([1])), ("list.update", lambda: lst.update([1])),
        ("list.merge_namespaces", lambda: lst.merge_namespaces(b"t", [b"s"])),
        ("map.get", lambda: m.get(b"mk")), ("map.put", lambda: m.put(1, 1)),
        ("map.put_all", lambda: m.put_all({1: 1})), ("map.remove", lambda: m.remove(1)),
        ("map.__contains__", lambda: 1 in m), ("map.is_empty", m.is_empty),
        ("map.items", m.items), ("map.to_dict", m.to_dict),
        ("reducing.add", lambda: red.add(1)), ("reducing.get", red.get),
        ("aggregating.add", lambda: agg.add(1)), ("aggregating.get", agg.get),
        ("op_list.get", ol.get), ("op_list.add", lambda: ol.add(1)),
        ("op_list.update", lambda: ol.update([1])),
        ("broadcast.get", lambda: bc.get(1)), ("broadcast.put", lambda: bc.put(1, 1)),
        ("broadcast.remove", lambda: bc.remove(1)), ("broadcast.to_dict", bc.to_dict),
        ("keys iterator made before close", lambda: next(keys)),
        ("items iterator made before close", lambda: next(items)),
        ("view.tobytes", view.tobytes), ("bytes(view)", lambda: bytes(view)),
        ("len(view)", lambda: len(view)), ("view[0]", lambda: view[0]),
        ("view == bytes", lambda: view == b"x"), ("repr(view)", lambda: repr(view)),
        ("batch.add", lambda: batch.add(2, None)), ("len(batch)", lambda: len(batch)),
        ("batch.run", lambda: batch.run(lambda e: 0)),
        ("timers.register", lambda: tm.register(5)), ("timers.delete", lambda: tm.delete(5)),
        ("timers.advance", lambda: tm.advance(1000, print)),
        ("timers.poll", lambda: tm.poll(print)), ("timers.watermark", lambda: tm.watermark),
        ("timers.timers", tm.timers),
        ("worker arena.info", borrowed.info), ("worker arena.status", borrowed.status),
        ("worker arena.op_counts", lambda: borrowed.op_counts(0))]:
    step(what, fn)
step("batch.close after its worker's", batch.close)

r = stash.Reader(NAME)
rv = r.state("v")
rkeys = rv.keys(ns=b"", key_group=stash.key_group(1, 16))
next(rkeys)
r.key(1)
rview = rv.view()
r.close()
for what, fn in [
        ("reader.state", lambda: r.state("v")), ("reader.key", lambda: r.key(1)),
        ("reader value.get", rv.get), ("reader value.read", lambda: rv.read(1)),
        ("reader value.read_many", lambda: rv.read_many([1])),
        ("reader value.keys", lambda: rv.keys(ns=b"", key_group=0)),
        ("reader keys iterator made before close", lambda: next(rkeys)),
        ("reader view.tobytes", rview.tobytes)]:
    step(what, fn)

a = stash.Arena.open(NAME)
a.close()
for what, fn in [
        ("arena.info", a.info), ("arena.status", a.status),
        ("arena.checkpoint", lambda: a.checkpoint(1)), ("arena.savepoint", lambda: a.savepoint(1)),
        ("arena.op_counts", lambda: a.op_counts(0)),
        ("arena.request_stop", lambda: a.request_stop(1)),
        ("arena.stop_with_savepoint", lambda: a.stop_with_savepoint(1))]:
    step(what, fn)

top = tempfile.mkdtemp(prefix="stash-py-closed-")
path = os.path.join(top, "sp")
sw = stash.SnapshotWriter(path, max_parallelism=16)
sw.state("v")
sw.put("v", 1, b"one")
sw.commit()
for what, fn in [
        ("writer.state", lambda: sw.state("w")), ("writer.put", lambda: sw.put("v", 2, b"x")),
        ("writer.delete", lambda: sw.delete("v", 1)),
        ("writer.op_put", lambda: sw.op_put("o", 0, b"x")), ("writer.commit", sw.commit)]:
    step(what, fn)
snap = stash.Snapshot(path)
entries = snap.entries()
snap.close()
for what, fn in [
        ("snapshot.info", snap.info), ("snapshot.states", snap.states),
        ("snapshot.entries", lambda: next(snap.entries())),
        ("snapshot.operator_state", snap.operator_state),
        ("snapshot.rewrite", lambda: snap.rewrite(os.path.join(top, "sp2"))),
        ("entries made before close", lambda: next(entries))]:
    step(what, fn)
shutil.rmtree(top)
"""


class Closing(Job):
    """A closed handle, and whatever it gave out, raises Closed (a
    ValueError) naming what is closed: it never reads freed memory."""

    def test_an_iterator_made_before_its_worker_closed_raises(self):
        out = run_child(self, """
w = stash.Worker(NAME)
s = w.state("v")
for k in range(10):
    s.write(k, k)
it = s.keys(ns=b"")
w.close()
try:
    next(it)
except ValueError as e:
    print(type(e).__name__, e)
""")
        self.assertIn(f"Closed iterator: worker '{self.name}' (index 0 of 1) is closed", out)

    def test_a_view_asked_of_a_closed_worker_raises(self):
        out = run_child(self, """
w = stash.Worker(NAME)
s = w.state("v")
s.write(1, 1)
w.close()
try:
    s.view()
except ValueError as e:
    print(type(e).__name__, e)
""")
        self.assertIn(f"Closed v: worker '{self.name}' (index 0 of 1) is closed", out)

    def test_every_handle_and_what_it_gave_out_raises_once_closed(self):
        out = run_child(self, AFTER_CLOSE)
        ran = [line.split("\t") for line in out.splitlines()]
        outcome = {r[1]: r for r in ran if r[0] != "step"}
        steps = [r[1] for r in ran if r[0] == "step"]
        self.assertEqual(len(steps), len(outcome), "every step ended")
        fine = ("worker.close again", "a worker after its arena() handle closed",
                "batch.close after its worker's")
        for what in steps:
            with self.subTest(what):
                got = outcome[what]
                if what in fine:
                    self.assertEqual(got[0], "returned", got)
                    continue
                if "inside" in what:
                    self.assertEqual(got[0], "other", got)
                    self.assertIn(f"worker '{self.name}' (index 0 of 1): "
                                  f"{what.split()[0][7:]} inside a callback", got[2])
                    continue
                self.assertEqual(got[0], "closed", got)
                if what.startswith("writer") or what.startswith("snapshot") or "entries" in what:
                    self.assertIn("stash-py-closed-", got[2])
                elif what.endswith("after its close"):
                    self.assertIn(f"batch of worker '{self.name}'", got[2])
                else:
                    self.assertIn(f"'{self.name}'", got[2])
                self.assertIn("closed" if "writer" not in what else "ended", got[2])

    def test_a_view_is_no_buffer_and_a_closed_worker_view_raises(self):
        w = stash.Worker(self.name)
        v = w.state("v")
        v.write(1, b"bytes")
        view = v.view()
        with self.assertRaises(TypeError):
            memoryview(view)
        self.assertEqual(bytes(view), b"bytes")
        w.close()
        with self.assertRaises(ValueError) as cm:
            bytes(view)
        self.assertIsInstance(cm.exception, stash.Closed)
        self.assertIsInstance(cm.exception, stash.StashError)

    def test_a_service_stopped_says_so_and_stops_once(self):
        svc = self.service()
        svc.stop()
        self.assertTrue(svc.stopped())
        svc.stop()


# Four threads write through one worker, the first of them to call taking
# it: each write that returned is read back, and each thread that wrote
# nothing more says why.
FOUR_THREADS = r"""
n = int(ARGS[0])
w = stash.Worker(NAME)
v = w.state("v")
w.hand_over()
start = threading.Barrier(4)
done, errors = [], []
def run(t):
    start.wait()
    try:
        for i in range(n):
            k = t * n + i
            if i % 2:
                w.key(k)
                v.put(k)
            else:
                v.write(k, k)
            done.append(k)
    except Exception as e:
        errors.append(f"{type(e).__name__}: {e}")
threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
lost = [k for k in done if stash.as_int(v.read(k)) != k]
print("done", len(done), "lost", len(lost), flush=True)
for e in errors:
    print("error", e, sep="\t")
w.close()
"""


class Threads(Job):
    """A worker is used by one thread at a time: a call from another raises
    WrongThread (a RuntimeError) naming the worker, and never loses a write."""

    def test_four_threads_writing_through_one_worker_lose_no_write_silently(self):
        n = 5000
        out = run_child(self, FOUR_THREADS, n).splitlines()
        done, lost = int(out[0].split()[1]), int(out[0].split()[3])
        errors = [line.split("\t", 1)[1] for line in out[1:]]
        self.assertEqual(lost, 0, f"{lost} of {done} writes lost; errors: {errors}")
        self.assertEqual(done + n * len(errors), 4 * n, errors)
        for e in errors:
            self.assertTrue(e.startswith("WrongThread: "), e)
            self.assertIn(f"worker '{self.name}' (index 0 of 1) belongs to thread ", e)

    def test_a_worker_passes_to_another_thread_by_hand_over_or_when_its_thread_ends(self):
        w = self.worker()
        v = w.state("v")
        v.write(1, b"main")
        view = v.view()
        got, go_on, taken = {}, threading.Event(), threading.Event()

        def other():
            for what, fn in (("read", lambda: v.read(1)), ("key", lambda: w.key(1)),
                             ("view", view.tobytes), ("close", w.close)):
                try:
                    fn()
                except RuntimeError as e:
                    got[what] = e
        t = threading.Thread(target=other)
        t.start()
        t.join()
        self.assertEqual(sorted(got), ["close", "key", "read", "view"])
        for e in got.values():
            self.assertIsInstance(e, stash.WrongThread)
            self.assertIn(f"worker '{self.name}'", str(e))
        self.assertEqual(v.read(1), b"main", "the owner goes on")

        def take():
            v.write(2, b"taken")
            taken.set()
            go_on.wait()
        w.hand_over()
        t = threading.Thread(target=take)
        t.start()
        taken.wait()
        with self.assertRaises(stash.WrongThread):
            v.read(2)
        go_on.set()
        t.join()
        self.assertEqual(v.read(2), b"taken", "a thread that ended leaves its worker free")

    def test_threads_each_with_a_worker_of_its_own_write_every_key(self):
        got = {}

        def run(i):
            w = stash.Worker(self.name, index=i, parallelism=2)
            v = w.state("v")
            first, last = w.info()["range"]
            mine = [k for k in range(4000) if first <= stash.key_group(k, 16) <= last]
            for k in mine:
                v.write(k, k)
            w.barrier()
            got[i] = [k for k in mine if u64(v.read(k)) != k], len(mine)
            w.close()
        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(sorted(got), [0, 1])
        self.assertEqual(got[0][1] + got[1][1], 4000)
        self.assertEqual(got[0][0] + got[1][0], [], "every write read back")

    def test_a_reader_belongs_to_one_thread_too(self):
        w = self.worker()
        w.state("v").write(1, b"one")
        w.barrier()
        r = stash.Reader(self.name)
        self.closing.append(r.close)
        rv = r.state("v")
        got = {}

        def other():
            try:
                rv.read(1)
            except RuntimeError as e:
                got["e"] = e
        t = threading.Thread(target=other)
        t.start()
        t.join()
        self.assertIsInstance(got["e"], stash.WrongThread)
        self.assertIn(f"reader of '{self.name}'", str(got["e"]))

if __name__ == "__main__":
    unittest.main()
