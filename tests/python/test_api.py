# SPDX-License-Identifier: MIT
"""The module as include/stash.h's mirror and as a Python API: every struct
it passes to C has C's size and offsets and every constant C's value (the
build's layout helper, STASH_LAYOUT, prints what the compiler makes of
the header); constants are IntEnums that are still the module's names;
each error code raises its own class, also the built-in Python raises for
it; every public class and function says what it does; no public
signature takes an argument only the module passes; a Snapshot iterates
over its entries; __version__ is the header's."""

import enum
import errno
import inspect
import os
import pickle
import pydoc
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

import stash
from test_stash import Job

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                      "include", "stash.h")
LAYOUT = os.environ.get("STASH_LAYOUT", "")

# The ctypes mirror of each struct of the header.
MIRRORS = {
    "stash_kg_range": stash._KgRange, "stash_arena_opts": stash._ArenaOpts,
    "stash_arena_info": stash._ArenaInfo, "stash_kg_usage": stash._KgUsage,
    "stash_worker_opts": stash._WorkerOpts, "stash_reader_opts": stash._ReaderOpts,
    "stash_op_counts": stash._OpCounts, "stash_worker_info": stash._WorkerInfo,
    "stash_bytes": stash._Bytes, "stash_ttl": stash._Ttl,
    "stash_aggregate_fns": stash._AggregateFns, "stash_state_desc": stash._StateDesc,
    "stash_iter": stash._Iter, "stash_batch_opts": stash._BatchOpts,
    "stash_timer": stash._Timer, "stash_event": stash._Event,
    "stash_log_record": stash._LogRecord, "stash_service_opts": stash._ServiceOpts,
    "stash_storage_opts": stash._StorageOpts,
    "stash_checkpoint_info": stash._CheckpointInfo, "stash_service_info": stash._ServiceInfo,
    "stash_snapshot_info": stash._SnapshotInfo, "stash_snapshot_entry": stash._SnapshotEntry,
    "stash_snapshot_writer_opts": stash._WriterOpts,
    "stash_snapshot_change": stash._SnapshotChange,
    "stash_snapshot_rewrite_opts": stash._RewriteOpts,
}


def header_text():
    with open(HEADER) as f:
        return re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)


def header_structs():
    """{struct: [member, ...]} as include/stash.h declares them."""
    out = {}
    for m in re.finditer(r"typedef struct (\w+) \{(.*?)\} (\w+);", header_text(), re.S):
        members = []
        for decl in m.group(2).split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            pointer = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl)  # a function pointer
            if pointer:
                members.append(pointer.group(1))
                continue
            for part in decl.split(","):  # uint64_t a, b;
                members.append(re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", part).group(1))
        out[m.group(3)] = members
    return out


def header_constants():
    """The names of the header's enum constants, and of its numeric macros
    (the version's aside)."""
    text = header_text()
    macros = [n for n in re.findall(r"^#define (STASH_\w+) [0-9]+u?$", text, re.M)
              if not n.startswith("STASH_VERSION_")]
    return re.findall(r"^\s*(STASH_\w+)\s*=", text, re.M), macros


def header_version():
    text = header_text()
    return ".".join(re.search(rf"^#define STASH_VERSION_{p} ([0-9]+)$", text, re.M).group(1)
                    for p in ("MAJOR", "MINOR", "PATCH"))


def layout():
    """What the layout helper prints: {struct: (size, {member: (offset,
    size)}, [members in order])}, {constant: value} and the version."""
    out = subprocess.run([LAYOUT], capture_output=True, text=True, check=True).stdout
    structs, constants, version = {}, {}, None
    for line in out.splitlines():
        kind, *rest = line.split()
        if kind == "field":
            name, size, member, offset, msize = rest
            s = structs.setdefault(name, (int(size), {}, []))
            s[1][member] = (int(offset), int(msize))
            s[2].append(member)
        elif kind == "constant":
            constants[rest[0]] = int(rest[1])
        elif kind == "version":
            version = rest[0]
    return structs, constants, version


def mismatches(c_struct, cls):
    """How the ctypes class cls differs from C's struct (size, members,
    offsets, member sizes): [] if it does not."""
    size, members, order = c_struct
    got = []
    if stash.ctypes.sizeof(cls) != size:
        got.append(f"size {stash.ctypes.sizeof(cls)}, C's {size}")
    mirrored = [f[0] for f in cls._fields_]
    for m in order:
        if m not in mirrored:
            got.append(f"no member {m}")
            continue
        field = getattr(cls, m)
        if (field.offset, field.size) != members[m]:
            got.append(f"{m} at {field.offset} of {field.size} bytes, C's at {members[m][0]} "
                       f"of {members[m][1]}")
    got += [f"member {m} C has not" for m in mirrored if m not in members]
    if [m for m in mirrored if m in members] != [m for m in order if m in mirrored]:
        got.append(f"members in the order {mirrored}, C's {order}")
    return got


@unittest.skipUnless(LAYOUT, "no layout helper (STASH_LAYOUT): run by ctest from a build")
class Layout(unittest.TestCase):
    """What the module hands to C is laid out as C lays it out."""

    @classmethod
    def setUpClass(cls):
        cls.structs, cls.constants, cls.version = layout()

    def test_the_helper_lists_every_member_and_constant_the_header_declares(self):
        declared = header_structs()
        self.assertEqual(sorted(declared), sorted(self.structs))
        for name, members in declared.items():
            self.assertEqual(members, self.structs[name][2], name)
        enums, macros = header_constants()
        self.assertEqual(sorted(enums + macros), sorted(self.constants))
        self.assertEqual(self.version, header_version())

    def test_every_struct_has_cs_size_and_each_member_cs_offset_and_size(self):
        self.assertEqual(sorted(MIRRORS), sorted(self.structs), "every struct is mirrored")
        for name, cls in MIRRORS.items():
            with self.subTest(name):
                self.assertEqual(mismatches(self.structs[name], cls), [])

    def test_a_mirror_missing_a_member_or_with_a_member_too_narrow_is_caught(self):
        fields = stash._ServiceOpts._fields_
        short = type("Short", (stash.ctypes.Structure,), {"_fields_": fields[:-1]})
        self.assertIn("no member storage_opts",
                      mismatches(self.structs["stash_service_opts"], short))
        # A member lost in the middle shifts those after it.
        holed = type("Holed", (stash.ctypes.Structure,),
                     {"_fields_": [f for f in fields if f[0] != "retain"]})
        got = mismatches(self.structs["stash_service_opts"], holed)
        self.assertIn("no member retain", got)
        self.assertTrue(any(g.startswith("incremental at") for g in got), got)
        narrow = type("Narrow", (stash.ctypes.Structure,),
                      {"_fields_": [("first", stash.ctypes.c_uint16),
                                    ("last", stash.ctypes.c_uint32)]})
        self.assertIn("first at 0 of 2 bytes, C's at 0 of 4",
                      mismatches(self.structs["stash_kg_range"], narrow))

    def test_every_constant_is_an_enum_member_named_as_in_c(self):
        members, macros = set(), header_constants()[1]
        for name, value in self.constants.items():
            with self.subTest(name):
                got = getattr(stash, name[len("STASH_"):])
                self.assertEqual(got, value)
                if name in macros:
                    continue
                self.assertIsInstance(got, enum.Enum)
                members.add(got)
        groups = [v for v in vars(stash).values()
                  if isinstance(v, type) and issubclass(v, enum.Enum)]
        every = {m for g in groups for m in g}
        self.assertEqual(every - members, set(), "every member is one of the header's")

    def test_every_options_struct_carries_its_size(self):
        for name, cls in MIRRORS.items():
            if "sz" in self.structs[name][1]:
                with self.subTest(name):
                    self.assertEqual(cls().sz, stash.ctypes.sizeof(cls))


class Constants(unittest.TestCase):
    def test_constant_groups_are_int_enums_and_the_old_names_still_work(self):
        self.assertIs(stash.VALUE, stash.Kind.VALUE)
        self.assertEqual(stash.Kind.MAP, 3)
        self.assertIsInstance(stash.Kind.MAP, int)
        self.assertIs(stash.HEAP, stash.Backend.HEAP)
        self.assertIs(stash.LMDB, stash.BACKEND_LMDB)
        self.assertIs(stash.ENOTFOUND, stash.Error.ENOTFOUND)
        self.assertEqual(stash.Error(-1013).name, "ECORRUPT")
        self.assertEqual(stash.TTL_ON_READ_AND_WRITE, stash.TtlUpdate.ON_READ_AND_WRITE)
        self.assertEqual(stash.STORAGE_MEMORY, stash.Storage.MEMORY)
        self.assertEqual(stash.LOG_ERROR, stash.LogLevel.ERROR)
        self.assertEqual(stash.ArenaFlag.REPLACE | stash.ArenaFlag.GROUP, 3)
        self.assertEqual(f"{stash.Kind.LIST}", "2", "formatted as the int it is")

    def test_the_version_is_the_headers(self):
        self.assertEqual(stash.__version__, header_version())
        self.assertEqual(stash.version(), header_version(), "the build's library")


class Values(Job):
    """What the calls return holds the enums."""

    def test_infos_events_timers_and_entries_give_enum_members(self):
        w = self.worker()
        self.assertIs(w.info()["state"], stash.WorkerState.LIVE)
        t = w.timers("t")
        w.key(1)
        t.register(5, domain=stash.TimeDomain.PROCESSING_TIME)
        self.assertIs(t.timers()[0].domain, stash.TimeDomain.PROCESSING_TIME)
        self.assertEqual(self.arena.kg_usage(0).keys(), {"used_bytes", "free_bytes"})
        w.state("v").write(1, b"x")
        self.service()
        info, events = self.checkpoint_at_barriers([w])
        self.assertIs(events[0].kind, stash.EventKind.CHECKPOINT_COMPLETE)
        snap = stash.Snapshot(info["detail"])
        self.closing.append(snap.close)
        kinds = {s["name"]: s["kind"] for s in snap.states()}
        self.assertIs(kinds["v"], stash.Kind.VALUE)
        self.assertIs(kinds["t"], stash.Kind.TIMERS)
        timer = next(e for e in snap if e.state == "t")
        self.assertIs(timer.kind, stash.Kind.TIMERS)
        self.assertIs(timer.domain, stash.TimeDomain.PROCESSING_TIME)


class Errors(Job):
    """Each code raises its own class: a StashError, and the built-in
    exception Python raises for the same failure."""

    def test_no_such_arena_is_a_file_not_found_error_naming_it(self):
        with self.assertRaises(FileNotFoundError) as cm:
            stash.Worker("t-py-no-such-arena")
        e = cm.exception
        self.assertIsInstance(e, stash.FileNotFound)
        self.assertIsInstance(e, stash.StashOSError)
        self.assertEqual((e.code, e.errno), (-errno.ENOENT, errno.ENOENT))
        self.assertEqual(e.strerror, os.strerror(errno.ENOENT))
        self.assertIn("/dev/shm/stash.t-py-no-such-arena", e.detail)
        self.assertEqual(str(e), f"Worker: {os.strerror(errno.ENOENT)} ({e.detail})")

    def test_an_arena_that_exists_is_a_file_exists_error(self):
        with self.assertRaises(FileExistsError) as cm:
            stash.Arena.create(self.name, size=8 << 20)
        self.assertIsInstance(cm.exception, stash.FileExists)
        self.assertEqual(cm.exception.errno, errno.EEXIST)

    def test_an_argument_out_of_range_is_a_value_error(self):
        w = self.worker()
        with self.assertRaises(ValueError) as cm:
            w.key(b"k" * 70000)
        self.assertIsInstance(cm.exception, stash.InvalidArgument)
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        self.assertNotIsInstance(cm.exception, OSError)
        with self.assertRaises(stash.InvalidArgument) as cm:
            stash.kg_range(16, 2, 2)
        self.assertIn("index 2 of parallelism 2", cm.exception.detail)
        with self.assertRaises(stash.InvalidArgument):
            stash.key_group(1, 0)

    @unittest.skipUnless(os.geteuid() == 0, "needs root to become another user")
    def test_another_users_arena_is_a_permission_error(self):
        code = ("import stash\ntry:\n    stash.Arena.open(%r)\nexcept PermissionError as e:\n"
                "    print(type(e).__name__, e.errno, e.code, e.detail)\n" % self.name)
        env = {k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "STASH_LIBRARY")}
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           user=65534, group=65534, env=env, cwd="/", timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, f"^PermissionDenied ({errno.EACCES} -{errno.EACCES}|"
                         f"{errno.EPERM} -{errno.EPERM}) ")
        self.assertIn(f"/dev/shm/stash.{self.name}", p.stdout)

    def test_stash_codes_raise_their_own_classes(self):
        w = self.worker()
        v = w.state("v")
        with self.assertRaises(stash.NoKey) as cm:
            v.get()
        self.assertIs(cm.exception.code, stash.Error.ENOKEY)
        self.assertIsNone(cm.exception.errno)
        with self.assertRaises(stash.WrongKind):
            w.state("v", stash.LIST)
        with self.assertRaises(stash.Busy) as cm:
            stash.Worker(self.name)
        self.assertIn("index 0", str(cm.exception))
        with self.assertRaises(stash.NoService):
            self.arena.checkpoint(100)
        reader = stash.Reader(self.name)
        self.closing.append(reader.close)
        with self.assertRaises(KeyError) as cm:
            reader.state("absent")
        self.assertIsInstance(cm.exception, stash.NotFound)
        self.assertIn("'absent'", str(cm.exception), "the message, not its repr")
        rv = reader.state("v")
        reader.key("a")
        with self.assertRaises(stash.WrongKeyGroup):
            rv.put(b"no")  # through ctypes
        with self.assertRaises(stash.WrongKeyGroup) as cm:
            rv.write("a", b"no")  # through the C data path where it is built
        self.assertIs(cm.exception.code, stash.Error.EKEYGROUP)
        self.assertIn("write", str(cm.exception).lower() + cm.exception.words)

    def test_a_checkpoint_no_worker_cuts_in_time_is_a_timeout_error(self):
        self.worker()  # never calls a barrier
        self.service(timeout_ms=500)  # the checkpoint fails soon after
        with self.assertRaises(TimeoutError) as cm:
            self.arena.checkpoint(200)
        self.assertIsInstance(cm.exception, stash.TimedOut)

    def test_a_damaged_snapshot_is_corrupt_naming_the_file(self):
        top = tempfile.mkdtemp(prefix="stash-py-api-")
        self.addCleanup(shutil.rmtree, top)
        path = os.path.join(top, "sp")
        with stash.SnapshotWriter(path, max_parallelism=16) as sw:
            sw.state("v")
            for k in range(50):
                sw.put("v", k, b"value %d" % k)
        data = [f for f in os.listdir(path) if not f.startswith("_")]
        self.assertTrue(data, os.listdir(path))
        victim = os.path.join(path, max(data, key=lambda f: os.path.getsize(os.path.join(path, f))))
        with open(victim, "r+b") as f:
            f.seek(os.path.getsize(victim) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        with self.assertRaises(stash.Corrupt) as cm:
            stash.Snapshot(path)
        self.assertIs(cm.exception.code, stash.Error.ECORRUPT)
        self.assertIn(os.path.basename(victim), cm.exception.detail)

    def test_every_code_has_a_class_and_errnos_the_builtins_python_gives_them(self):
        classes = {}
        for code in stash.Error:
            cls = stash._class_of(code)
            self.assertTrue(issubclass(cls, stash.StashError), code)
            self.assertIsNot(cls, stash.StashError, code)
            classes[cls] = code
            self.assertIn(cls.__name__, stash.__all__)
        self.assertEqual(len(classes), len(stash.Error), "one class a code")
        self.assertTrue(issubclass(stash._class_of(stash.ENOTFOUND), KeyError))
        for code, builtin in ((errno.ENOENT, FileNotFoundError), (errno.EEXIST, FileExistsError),
                              (errno.EACCES, PermissionError), (errno.EPERM, PermissionError),
                              (errno.ETIMEDOUT, TimeoutError), (errno.EAGAIN, BlockingIOError),
                              (errno.ENOTDIR, NotADirectoryError), (errno.EINVAL, ValueError),
                              (errno.EIO, OSError), (errno.ENOSPC, OSError)):
            with self.subTest(errno.errorcode[code]):
                e = stash._error(-code, "detail", "call")
                self.assertIsInstance(e, builtin)
                self.assertIsInstance(e, stash.StashError)
                self.assertEqual((e.code, e.errno, e.detail), (-code, code, "detail"))
                self.assertEqual(str(e), f"call: {os.strerror(code)} (detail)")

    def test_an_error_pickles_whole(self):
        for e in (stash._error(-errno.ENOENT, "no arena", "Worker"),
                  stash._error(stash.ECORRUPT, "file 3 at 12", "Snapshot"),
                  stash._error(stash.ENOTFOUND, "no state 'x'", "x"),
                  stash.Closed("worker 'w' is closed", "get")):
            with self.subTest(type(e).__name__):
                got = pickle.loads(pickle.dumps(e))
                self.assertIs(type(got), type(e))
                self.assertEqual((got.code, got.errno, got.detail, got.call, str(got)),
                                 (e.code, e.errno, e.detail, e.call, str(e)))

    def test_closed_and_wrong_thread_are_value_and_runtime_errors(self):
        w = self.worker()
        v = w.state("v")
        errors = []
        t = threading.Thread(target=lambda: errors.append(self.raised(lambda: v.read(1))))
        t.start()
        t.join()
        self.assertIsInstance(errors[0], stash.WrongThread)
        self.assertIsInstance(errors[0], RuntimeError)
        w.close()
        e = self.raised(lambda: v.read(1))
        self.assertIsInstance(e, stash.Closed)
        self.assertIsInstance(e, ValueError)
        self.assertEqual(e.code, -errno.EINVAL)

    @staticmethod
    def raised(fn):
        try:
            fn()
        except Exception as e:
            return e
        return None


def public_names():
    return [n for n in stash.__all__ if not isinstance(getattr(stash, n), (int, enum.Enum))
            or isinstance(getattr(stash, n), type)]


def members(cls, init=False):
    """The public methods and properties cls itself defines (init: and
    __init__, which the class's docstring describes)."""
    for name, value in vars(cls).items():
        if name.startswith("_") and not (init and name == "__init__"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            yield name, value


class Api(unittest.TestCase):
    def test_all_names_every_public_name_of_the_module(self):
        public = {n for n, v in vars(stash).items()
                  if not n.startswith("_") and not inspect.ismodule(v)
                  and not ((inspect.isclass(v) or inspect.isfunction(v))
                           and v.__module__ != "stash")}
        self.assertEqual(public - set(stash.__all__), set())
        self.assertEqual(set(stash.__all__) - public, set())

    def test_every_public_class_function_and_method_has_a_docstring(self):
        for name in public_names():
            obj = getattr(stash, name)
            with self.subTest(name):
                self.assertTrue(obj.__doc__ and obj.__doc__.strip(), f"{name} has no docstring")
                if isinstance(obj, type) and issubclass(obj, enum.Enum):
                    self.assertIn("__doc__", vars(obj), f"{name}'s docstring is Enum's")
                    continue
                if isinstance(obj, type) and issubclass(obj, tuple):
                    self.assertFalse(obj.__doc__.startswith(name + "("), "namedtuple's own")
                    continue
                if isinstance(obj, type) and issubclass(obj, BaseException):
                    self.assertIn("__doc__", vars(obj))
                    continue
                if isinstance(obj, type):
                    for cls in obj.__mro__:
                        if cls.__module__ != "stash":
                            continue
                        for mname, m in members(cls):
                            with self.subTest(f"{name}.{mname}"):
                                self.assertTrue(m.__doc__ and m.__doc__.strip(),
                                                f"{cls.__name__}.{mname} has no docstring")

    def test_help_of_a_state_says_what_it_does_its_arguments_and_what_it_raises(self):
        text = pydoc.render_doc(stash.ValueState, renderer=pydoc.plaintext)
        for words in ("Flink's ValueState", "Worker.state(name)", "raise NoKey", "WrongKeyGroup",
                      "read_many(self, keys)", "write(self, key, value)", "returns its value",
                      "Closed"):
            self.assertIn(words, text)
        text = pydoc.render_doc(stash.Worker, renderer=pydoc.plaintext)
        for words in ("Raises FileNotFound", "Busy", "state(self, name, kind=<Kind.VALUE: 1>",
                      "ttl_ms: entries expire"):
            self.assertIn(words, text)

    def test_no_public_signature_takes_an_argument_only_the_module_passes(self):
        for name in public_names():
            obj = getattr(stash, name)
            if isinstance(obj, type) and issubclass(obj, (BaseException, enum.Enum, tuple)):
                continue
            callables = [(name, obj)]
            if isinstance(obj, type):
                callables += [(f"{name}.{m}", f) for c in obj.__mro__ if c.__module__ == "stash"
                              for m, f in members(c, init=True) if not isinstance(f, property)]
            for what, fn in callables:
                with self.subTest(what):
                    params = inspect.signature(fn).parameters
                    self.assertEqual([p for p in params if p.startswith("_")], [])

    def test_the_classes_the_module_makes_are_not_made_by_calling_them(self):
        for cls, made_by in ((stash.Arena, "Arena.create()"), (stash.View, "ValueState.view()"),
                             (stash.ValueState, "Worker.state()"),
                             (stash.MapState, "Worker.state()"), (stash.Timers, "Worker.timers()")):
            with self.subTest(cls.__name__):
                with self.assertRaises(TypeError) as cm:
                    cls(None, "x")
                self.assertIn(made_by, str(cm.exception))

    def test_a_library_named_by_stash_library_or_none(self):
        env = dict(os.environ, STASH_LIBRARY="/nonexistent/libstash.so.0")
        p = subprocess.run([sys.executable, "-c", "import stash"], capture_output=True,
                           text=True, env=env, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("/nonexistent/libstash.so.0", p.stderr)
        self.assertIn("set STASH_LIBRARY", p.stderr)


class Iteration(unittest.TestCase):
    def test_a_snapshot_iterates_over_its_keyed_entries_key_group_by_key_group(self):
        top = tempfile.mkdtemp(prefix="stash-py-api-")
        self.addCleanup(shutil.rmtree, top)
        path = os.path.join(top, "sp")
        with stash.SnapshotWriter(path, max_parallelism=16, op_parallelism=1) as sw:
            sw.state("v")
            sw.state("l", stash.Kind.LIST)
            sw.state("o", stash.Kind.OP_LIST)
            for k in range(40):
                sw.put("v", k, b"v%d" % k)
            for x in (b"a", b"b"):
                sw.put("l", "key", x)
            sw.op_put("o", 0, b"op")
        with stash.Snapshot(path) as snap:
            got = [e for e in snap]
            self.assertEqual(got, list(snap.entries()))
            self.assertEqual(list(snap), got, "iterated again, the same")
            self.assertEqual([e.kg for e in got], sorted(e.kg for e in got))
            values = {stash.as_int(e.key): e.value for e in got if e.state == "v"}
            self.assertEqual(values, {k: b"v%d" % k for k in range(40)})
            self.assertEqual([(e.index, e.value) for e in got if e.state == "l"],
                             [(0, b"a"), (1, b"b")])
            self.assertTrue(all(isinstance(e, stash.Entry) for e in got))
            self.assertNotIn("o", {e.state for e in got}, "operator state is not keyed")
            self.assertEqual([e.value for e in snap.operator_state()], [b"op"])


if __name__ == "__main__":
    unittest.main()
