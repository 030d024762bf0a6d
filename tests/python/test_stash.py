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


if __name__ == "__main__":
    unittest.main()
