# SPDX-License-Identifier: MIT
"""stash from Python: workers, readers and the service of a stash arena.

A thin layer over libstash (ctypes): the same calls as include/stash.h,
bytes in and bytes out. Keys, namespaces and values may be given as bytes
(or any buffer), str (UTF-8) or int (8 bytes, little-endian, two's
complement); what comes back is bytes, with as_int() and as_str() to turn
it back. The header's constants are IntEnums (Kind, Backend, Error, ...),
each member also a name of the module: stash.VALUE is stash.Kind.VALUE. A
failed call raises the StashError subclass of its code (NotFound, Busy,
Corrupt, FileNotFound, InvalidArgument, ...), which is also the built-in
exception Python would raise for it (KeyError, FileNotFoundError,
ValueError, ...) and carries the code, the errno, stash_strerror()'s words
and stash_errmsg()'s detail. docs/python.md describes the module.
"""

import ctypes
import enum
import errno as _errno
import functools
import os
import threading
import types
import weakref
from collections import namedtuple

try:
    from stash import _installed
except ImportError:  # the source tree's package, which no build wrote
    _installed = None

__all__ = [
    # handles
    "Arena", "Service", "Worker", "Reader", "ValueState", "ListState", "MapState",
    "ReducingState", "AggregatingState", "OpListState", "BroadcastState", "View", "Batch",
    "Timers", "Snapshot", "SnapshotWriter", "Event", "Timer", "Entry", "LogRecord",
    # functions
    "version", "strerror", "to_bytes", "as_int", "as_str", "key_group", "kg_range",
    # constants: each enum's members are added below, as names of the module
    "Kind", "Backend", "ArenaFlag", "WorkerState", "TtlUpdate", "TtlVisibility", "TtlTime",
    "TimeDomain", "EventKind", "Storage", "LogLevel", "Error", "HEAP", "LMDB",
    "DEFAULT_MAX_PARALLELISM", "MAX_MAX_PARALLELISM", "MAX_WORKERS",
    # errors
    "StashError", "StashOSError", "FileNotFound", "FileExists", "PermissionDenied", "TimedOut",
    "NotADirectory", "TryAgain", "InvalidArgument", "NotArena", "WrongVersion", "Truncated",
    "Incomplete", "Full", "TooBig", "Busy", "WrongParallelism", "NotFound", "WrongKeyGroup",
    "WrongKind", "Stale", "NoKey", "Corrupt", "WrongFormat", "NoService", "Aborted", "Forked",
    "Fenced", "Closed", "WrongThread",
]

# ---- the library --------------------------------------------------------


def _load():
    """libstash: $STASH_LIBRARY if it is set, else the one the build that
    installed this package put where _installed says (CMake's install),
    else libstash.so.0 wherever the system's loader finds it (a wheel's)."""
    given = os.environ.get("STASH_LIBRARY")
    candidates = [given] if given else []
    if not given and _installed is not None and _installed.LIBRARY:
        beside = os.path.join(os.path.dirname(os.path.abspath(__file__)), _installed.LIBRARY)
        if os.path.exists(beside):
            candidates.append(beside)
    if not given:
        candidates.append("libstash.so.0")
    errors = []
    for c in candidates:
        try:
            # Global: the C data path (_stash) links the same library.
            return c, ctypes.CDLL(c, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            errors.append(str(e))
    raise ImportError("stash: cannot load libstash.so.0 (install it, or set STASH_LIBRARY to "
                      "its path): " + "; ".join(errors))


_path, _dll = _load()

_u8p = ctypes.POINTER(ctypes.c_uint8)
_size_p = ctypes.POINTER(ctypes.c_size_t)


class _Bytes(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_BytesP = ctypes.POINTER(_Bytes)


class _Iter(ctypes.Structure):
    _fields_ = [("opaque", ctypes.c_uint64 * 12)]


class _Sized(ctypes.Structure):
    """A struct the caller fills that starts with its own size, sz (the
    header's rule for a stable ABI): set here, before the other fields."""

    def __init__(self, *args, **kwargs):
        super().__init__(ctypes.sizeof(self), *args, **kwargs)


class _ArenaOpts(_Sized):
    _fields_ = [("sz", ctypes.c_size_t), ("path", ctypes.c_char_p), ("size", ctypes.c_uint64),
                ("max_parallelism", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("backend", ctypes.c_int), ("lmdb_dir", ctypes.c_char_p)]


_CLOCK = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p)
_CUT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p)
_COMBINE = ctypes.CFUNCTYPE(ctypes.c_int, _BytesP, _BytesP, ctypes.c_void_p, ctypes.c_size_t,
                            _size_p, ctypes.c_void_p)
_PRODUCE = ctypes.CFUNCTYPE(ctypes.c_int, _BytesP, ctypes.c_void_p, ctypes.c_size_t, _size_p,
                            ctypes.c_void_p)
_BATCH_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_LOG = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)


class _LogRecord(ctypes.Structure):
    _fields_ = [("time_ns", ctypes.c_uint64), ("level", ctypes.c_int),
                ("subject", ctypes.c_char_p), ("message", ctypes.c_char_p)]


_LOG_RECORD = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(_LogRecord))


class _WorkerOpts(_Sized):
    _fields_ = [("sz", ctypes.c_size_t), ("index", ctypes.c_uint32),
                ("parallelism", ctypes.c_uint32), ("arena", ctypes.POINTER(_ArenaOpts)),
                ("clock", _CLOCK), ("clock_ctx", ctypes.c_void_p), ("rollback", ctypes.c_int),
                ("on_cut", _CUT), ("cut_ctx", ctypes.c_void_p)]


class _ReaderOpts(_Sized):
    _fields_ = [("sz", ctypes.c_size_t), ("arena", ctypes.POINTER(_ArenaOpts)),
                ("clock", _CLOCK), ("clock_ctx", ctypes.c_void_p),
                ("at_checkpoint", ctypes.c_int), ("checkpoint_dir", ctypes.c_char_p)]


class _Ttl(ctypes.Structure):
    _fields_ = [("ttl_ms", ctypes.c_uint64), ("update", ctypes.c_int),
                ("visibility", ctypes.c_int), ("cleanup_entries", ctypes.c_uint32),
                ("cleanup_every_record", ctypes.c_int), ("cleanup_full_snapshot", ctypes.c_int),
                ("time", ctypes.c_int)]


class _AggregateFns(_Sized):
    _fields_ = [("sz", ctypes.c_size_t), ("create", _PRODUCE), ("add", _COMBINE),
                ("result", _PRODUCE), ("merge", _COMBINE)]


class _StateDesc(_Sized):
    _fields_ = [("sz", ctypes.c_size_t), ("name", ctypes.c_char_p), ("kind", ctypes.c_int),
                ("ttl", _Ttl), ("reduce", _COMBINE), ("aggregate", ctypes.POINTER(_AggregateFns)),
                ("ctx", ctypes.c_void_p), ("default_value", _Bytes)]


class _Event(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("checkpoint_id", ctypes.c_uint64),
                ("detail", ctypes.c_char_p)]


class _CheckpointInfo(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("status", ctypes.c_int), ("incremental", ctypes.c_int),
                ("savepoint", ctypes.c_int), ("started_ns", ctypes.c_uint64),
                ("duration_ns", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("pause_ns", ctypes.c_uint64), ("detail", ctypes.c_char * 256)]


class _StorageOpts(_Sized):
    _fields_ = [("sz", ctypes.c_size_t), ("timeout_ms", ctypes.c_uint32),
                ("depth", ctypes.c_uint32), ("ceph_conf", ctypes.c_char_p),
                ("ceph_id", ctypes.c_char_p), ("endpoint", ctypes.c_char_p),
                ("region", ctypes.c_char_p), ("credentials", ctypes.c_char_p),
                ("profile", ctypes.c_char_p), ("part_bytes", ctypes.c_uint64)]


class _ServiceOpts(_Sized):
    _fields_ = [("sz", ctypes.c_size_t), ("arena", ctypes.POINTER(_ArenaOpts)),
                ("storage", ctypes.c_int), ("dir", ctypes.c_char_p),
                ("memory_cap", ctypes.c_uint64), ("interval_ms", ctypes.c_uint64),
                ("min_pause_ms", ctypes.c_uint64), ("timeout_ms", ctypes.c_uint64),
                ("retain", ctypes.c_uint32), ("incremental", ctypes.c_int),
                ("full_every", ctypes.c_uint32), ("lz4", ctypes.c_int),
                ("restore", ctypes.c_char_p), ("start_empty", ctypes.c_int),
                ("lazy_restore", ctypes.c_int), ("log", _LOG), ("log_ctx", ctypes.c_void_p),
                ("log_record", _LOG_RECORD), ("pool", ctypes.c_char_p),
                ("ceph_conf", ctypes.c_char_p), ("ceph_id", ctypes.c_char_p),
                ("job", ctypes.c_char_p), ("ceph_timeout_ms", ctypes.c_uint32),
                ("host", ctypes.c_char_p), ("workers", ctypes.c_char_p),
                ("job_parallelism", ctypes.c_uint32), ("lease_ms", ctypes.c_uint32),
                ("storage_url", ctypes.c_char_p),
                ("storage_opts", ctypes.POINTER(_StorageOpts))]


class _ServiceInfo(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_int32), ("since_ns", ctypes.c_uint64),
                ("dir", ctypes.c_char * 256), ("pending", ctypes.c_uint64),
                ("completed", ctypes.c_uint64), ("failing", ctypes.c_uint32),
                ("next_ns", ctypes.c_uint64), ("nrecent", ctypes.c_uint32),
                ("recent", _CheckpointInfo * 8), ("completed_total", ctypes.c_uint64),
                ("failed_total", ctypes.c_uint64), ("restored_id", ctypes.c_uint64),
                ("restored_ns", ctypes.c_uint64), ("restored_at_ns", ctypes.c_uint64),
                ("restored_records", ctypes.c_uint64), ("io_backend", ctypes.c_char * 16),
                ("io_bytes_written", ctypes.c_uint64), ("io_bytes_read", ctypes.c_uint64),
                ("io_errors", ctypes.c_uint64)]


_OP_COUNTS = ("value_reads", "value_writes", "list_reads", "list_writes", "map_reads",
              "map_writes", "merging_reads", "merging_writes", "rollbacks")


class _OpCounts(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in _OP_COUNTS]


class _ArenaInfo(ctypes.Structure):
    _fields_ = [("path", ctypes.c_char * 256), ("layout_version", ctypes.c_uint32),
                ("page_size", ctypes.c_uint32), ("size", ctypes.c_uint64),
                ("data_bytes", ctypes.c_uint64), ("pool_free_bytes", ctypes.c_uint64),
                ("max_parallelism", ctypes.c_uint32), ("creator_pid", ctypes.c_int32),
                ("created_ns", ctypes.c_uint64), ("huge_pages", ctypes.c_int),
                ("backend", ctypes.c_int), ("lmdb_dir", ctypes.c_char * 256)]


class _KgUsage(ctypes.Structure):
    _fields_ = [("used_bytes", ctypes.c_uint64), ("free_bytes", ctypes.c_uint64)]


class _KgRange(ctypes.Structure):
    _fields_ = [("first", ctypes.c_uint32), ("last", ctypes.c_uint32)]


class _WorkerInfo(ctypes.Structure):
    _fields_ = [("index", ctypes.c_uint32), ("parallelism", ctypes.c_uint32),
                ("pid", ctypes.c_int32), ("state", ctypes.c_int), ("range", _KgRange),
                ("joined_ns", ctypes.c_uint64), ("heartbeat_ns", ctypes.c_uint64),
                ("generation", ctypes.c_uint32), ("previous_pid", ctypes.c_int32)]


class _BatchOpts(_Sized):
    _fields_ = [("sz", ctypes.c_size_t), ("capacity", ctypes.c_uint32),
                ("states", ctypes.POINTER(ctypes.c_void_p)), ("nstates", ctypes.c_uint32)]


class _Timer(ctypes.Structure):
    _fields_ = [("domain", ctypes.c_int), ("timestamp", ctypes.c_uint64), ("key", _Bytes),
                ("ns", _Bytes)]


_TIMER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_Timer), ctypes.c_void_p)


class _SnapshotInfo(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("created_ns", ctypes.c_uint64),
                ("base_id", ctypes.c_uint64), ("max_parallelism", ctypes.c_uint32),
                ("nstates", ctypes.c_uint32), ("op_parallelism", ctypes.c_uint32),
                ("data_bytes", ctypes.c_uint64)]


class _SnapshotEntry(ctypes.Structure):
    _fields_ = [("kg", ctypes.c_uint32), ("state", ctypes.c_char_p), ("kind", ctypes.c_int),
                ("key", _Bytes), ("ns", _Bytes), ("map_key", _Bytes), ("value", _Bytes),
                ("index", ctypes.c_uint32), ("ttl_ms", ctypes.c_uint64),
                ("domain", ctypes.c_int), ("timestamp", ctypes.c_uint64),
                ("worker", ctypes.c_uint32)]


_SNAPSHOT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_SnapshotEntry))


class _SnapshotChange(ctypes.Structure):
    _fields_ = [("state", ctypes.c_char_p), ("drop", ctypes.c_int), ("rename", ctypes.c_char_p),
                ("set_ttl", ctypes.c_int), ("ttl", _Ttl)]


_PROGRESS = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32)


class _RewriteOpts(_Sized):
    _fields_ = [("sz", ctypes.c_size_t), ("max_parallelism", ctypes.c_uint32),
                ("id", ctypes.c_uint64), ("changes", ctypes.POINTER(_SnapshotChange)),
                ("nchanges", ctypes.c_uint32), ("progress", _PROGRESS),
                ("progress_ctx", ctypes.c_void_p)]


class _WriterOpts(_Sized):
    _fields_ = [("sz", ctypes.c_size_t), ("max_parallelism", ctypes.c_uint32),
                ("size", ctypes.c_uint64), ("id", ctypes.c_uint64),
                ("op_parallelism", ctypes.c_uint32)]


_vp, _cp, _sz, _int = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int
_u32, _u64 = ctypes.c_uint32, ctypes.c_uint64
_SIGNATURES = {
    "stash_version": (_cp, []),
    "stash_strerror": (_cp, [_int]),
    "stash_errmsg": (_cp, []),
    "stash_hash": (_u64, [_vp, _sz]),
    "stash_key_group": (_u32, [_vp, _sz, _u32]),
    "stash_kg_range_of": (_int, [_u32, _u32, _u32, ctypes.POINTER(_KgRange)]),
    "stash_arena_create": (_int, [_cp, ctypes.POINTER(_ArenaOpts), ctypes.POINTER(_vp)]),
    "stash_arena_open": (_int, [_cp, ctypes.POINTER(_ArenaOpts), ctypes.POINTER(_vp)]),
    "stash_arena_close": (None, [_vp]),
    "stash_arena_destroy": (_int, [_cp, ctypes.POINTER(_ArenaOpts)]),
    "stash_arena_info_get": (_int, [_vp, ctypes.POINTER(_ArenaInfo)]),
    "stash_kg_usage_get": (_int, [_vp, _u32, ctypes.POINTER(_KgUsage)]),
    "stash_worker_open": (_int, [_cp, ctypes.POINTER(_WorkerOpts), ctypes.POINTER(_vp)]),
    "stash_reader_open": (_int, [_cp, ctypes.POINTER(_ReaderOpts), ctypes.POINTER(_vp)]),
    "stash_worker_close": (None, [_vp]),
    "stash_worker_arena": (_vp, [_vp]),
    "stash_worker_info_get": (_int, [_vp, ctypes.POINTER(_WorkerInfo)]),
    "stash_state_describe": (_int, [_vp, _cp, ctypes.POINTER(_StateDesc)]),
    "stash_state_get": (_int, [_vp, ctypes.POINTER(_StateDesc), ctypes.POINTER(_vp)]),
    "stash_key_set": (_int, [_vp, _vp, _sz]),
    "stash_key_group_current": (_int, [_vp]),
    "stash_state_namespace": (_int, [_vp, _vp, _sz]),
    "stash_state_clear": (_int, [_vp]),
    "stash_value_get": (_int, [_vp, _BytesP]),
    "stash_value_put": (_int, [_vp, _vp, _sz]),
    "stash_list_get": (_int, [_vp, ctypes.POINTER(_Iter)]),
    "stash_list_add": (_int, [_vp, _vp, _sz]),
    "stash_list_add_all": (_int, [_vp, _BytesP, _sz]),
    "stash_list_update": (_int, [_vp, _BytesP, _sz]),
    "stash_map_get": (_int, [_vp, _vp, _sz, _BytesP]),
    "stash_map_put": (_int, [_vp, _vp, _sz, _vp, _sz]),
    "stash_map_put_all": (_int, [_vp, _BytesP, _BytesP, _sz]),
    "stash_map_remove": (_int, [_vp, _vp, _sz]),
    "stash_map_contains": (_int, [_vp, _vp, _sz]),
    "stash_map_is_empty": (_int, [_vp]),
    "stash_map_iter": (_int, [_vp, ctypes.POINTER(_Iter)]),
    "stash_merging_add": (_int, [_vp, _vp, _sz]),
    "stash_merging_get": (_int, [_vp, _BytesP]),
    "stash_merge_namespaces": (_int, [_vp, _vp, _sz, _BytesP, _sz]),
    "stash_keys_iter": (_int, [_vp, _vp, _sz, ctypes.POINTER(_Iter)]),
    "stash_kg_keys_iter": (_int, [_vp, _u32, _vp, _sz, ctypes.POINTER(_Iter)]),
    "stash_iter_next": (_int, [ctypes.POINTER(_Iter), _BytesP, _BytesP]),
    "stash_iter_remove": (_int, [ctypes.POINTER(_Iter)]),
    "stash_iter_set_value": (_int, [ctypes.POINTER(_Iter), _vp, _sz]),
    "stash_batch_create": (_int, [_vp, ctypes.POINTER(_BatchOpts), ctypes.POINTER(_vp)]),
    "stash_batch_destroy": (None, [_vp]),
    "stash_batch_add": (_int, [_vp, _vp, _sz, _vp]),
    "stash_batch_size": (_u32, [_vp]),
    "stash_batch_run": (_int, [_vp, _BATCH_FN, _vp, ctypes.POINTER(_int)]),
    "stash_timers_get": (_int, [_vp, _cp, ctypes.POINTER(_vp)]),
    "stash_timer_register": (_int, [_vp, _int, _vp, _sz, _u64]),
    "stash_timer_delete": (_int, [_vp, _int, _vp, _sz, _u64]),
    "stash_timers_advance": (ctypes.c_int64, [_vp, _u64, _TIMER_FN, _vp]),
    "stash_timers_poll": (ctypes.c_int64, [_vp, _TIMER_FN, _vp]),
    "stash_timers_iter": (_int, [_vp, ctypes.c_int32, ctypes.POINTER(_Iter)]),
    "stash_timers_next": (_int, [ctypes.POINTER(_Iter), ctypes.POINTER(_Timer)]),
    "stash_timers_watermark": (_u64, [_vp]),
    "stash_op_list_get": (_int, [_vp, ctypes.POINTER(_BytesP), _size_p]),
    "stash_op_list_add": (_int, [_vp, _vp, _sz]),
    "stash_op_list_update": (_int, [_vp, _BytesP, _sz]),
    "stash_broadcast_get": (_int, [_vp, _vp, _sz, _BytesP]),
    "stash_broadcast_put": (_int, [_vp, _vp, _sz, _vp, _sz]),
    "stash_broadcast_remove": (_int, [_vp, _vp, _sz]),
    "stash_broadcast_entries": (_int, [_vp, ctypes.POINTER(_BytesP), ctypes.POINTER(_BytesP),
                                       _size_p]),
    "stash_barrier": (_int, [_vp, ctypes.POINTER(_Event)]),
    "stash_service_start": (_int, [_cp, ctypes.POINTER(_ServiceOpts), ctypes.POINTER(_vp)]),
    "stash_service_stop": (None, [_vp]),
    "stash_service_stopped": (_int, [_vp]),
    "stash_checkpoint": (_int, [_vp, _u64, ctypes.POINTER(_CheckpointInfo)]),
    "stash_savepoint": (_int, [_vp, _u64, ctypes.POINTER(_CheckpointInfo)]),
    "stash_service_request_stop": (_int, [_vp, _u64]),
    "stash_stop_with_savepoint": (_int, [_vp, _u64, ctypes.POINTER(_CheckpointInfo)]),
    "stash_service_info_get": (_int, [_vp, ctypes.POINTER(_ServiceInfo)]),
    "stash_op_counts_get": (_int, [_vp, _u32, ctypes.POINTER(_OpCounts)]),
    "stash_snapshot_open": (_int, [_cp, ctypes.POINTER(_vp)]),
    "stash_snapshot_close": (None, [_vp]),
    "stash_snapshot_info_get": (_int, [_vp, ctypes.POINTER(_SnapshotInfo)]),
    "stash_snapshot_state": (_int, [_vp, _u32, ctypes.POINTER(_StateDesc)]),
    "stash_snapshot_scan": (_int, [_vp, _KgRange, _SNAPSHOT_FN, _vp]),
    "stash_snapshot_op_scan": (_int, [_vp, _SNAPSHOT_FN, _vp]),
    "stash_snapshot_rewrite": (_int, [_vp, _cp, ctypes.POINTER(_RewriteOpts),
                                      ctypes.POINTER(_SnapshotInfo)]),
    "stash_snapshot_writer_open": (_int, [_cp, ctypes.POINTER(_WriterOpts),
                                          ctypes.POINTER(_vp)]),
    "stash_snapshot_writer_state": (_int, [_vp, ctypes.POINTER(_StateDesc)]),
    "stash_snapshot_writer_put": (_int, [_vp, ctypes.POINTER(_SnapshotEntry)]),
    "stash_snapshot_writer_delete": (_int, [_vp, ctypes.POINTER(_SnapshotEntry)]),
    "stash_snapshot_writer_op_put": (_int, [_vp, ctypes.POINTER(_SnapshotEntry)]),
    "stash_snapshot_writer_commit": (_int, [_vp, ctypes.POINTER(_SnapshotInfo)]),
    "stash_snapshot_writer_abort": (None, [_vp]),
}

# Every function above was added in the first release, exported under the
# version node STASH_0.1 (libstash.map); one added later gives its own.
_NODE = "STASH_0.1"


def _bind():
    """The functions of _SIGNATURES, each at the version node this module
    was written for, as the linker binds a C program's calls: a later
    library that gives a function a new version (a struct it fills grew)
    still gives this module the one whose structs it mirrors, and a library
    without it fails the import, naming what is missing."""
    try:
        dlvsym = ctypes.CDLL(None).dlvsym
    except AttributeError:  # a C library without symbol versions
        dlvsym = None
    else:
        dlvsym.restype = ctypes.c_void_p
        dlvsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    fns = {}
    for name, (res, args) in _SIGNATURES.items():
        if dlvsym is None:
            fn = getattr(_dll, name)
            fn.restype, fn.argtypes = res, args
        else:
            address = dlvsym(_dll._handle, name.encode(), _NODE.encode())
            if not address:
                raise ImportError(f"stash: {_path} has no {name} of version {_NODE}: this "
                                  f"module needs a libstash.so.0 of release {_NODE[6:]} or later")
            fn = ctypes.CFUNCTYPE(res, *args)(address)
        fns[name] = fn
    return types.SimpleNamespace(**fns)


_lib = _bind()

# ---- constants ----------------------------------------------------------
#
# Every constant of include/stash.h is a member of an IntEnum below and a
# name of the module: STASH_X is stash.X (STASH_VALUE: stash.VALUE, which is
# stash.Kind.VALUE). Being ints, they go wherever an int went before.


class Kind(enum.IntEnum):
    """The kind of a state (stash_kind): Flink's keyed state kinds, its
    operator state kinds, and a timer service's timers."""

    VALUE = 1  # ValueState: one value per key and namespace
    LIST = 2  # ListState: a list of elements
    MAP = 3  # MapState: a map of user keys to values
    REDUCING = 4  # ReducingState: values combined by a reduce function
    AGGREGATING = 5  # AggregatingState: an AggregateFunction's accumulator
    OP_LIST = 6  # operator ListState: split evenly on restore at another parallelism
    OP_UNION = 7  # operator UnionListState: every worker gets the whole list
    OP_BROADCAST = 8  # BroadcastState: a map, the same on every worker
    TIMERS = 9  # a timer service's timers (keyed state)


class Backend(enum.IntEnum):
    """Where an arena keeps keyed state (stash_backend)."""

    HEAP = 0  # in the arena's own memory
    LMDB = 1  # in LMDB environments on disk, one per key group: larger than RAM


class ArenaFlag(enum.IntFlag):
    """Flags of an arena's creation (STASH_ARENA_*); Arena.create() takes
    them as replace= and group=."""

    REPLACE = 1  # remove an existing arena of that name first
    GROUP = 2  # mode 0660 instead of 0600


class WorkerState(enum.IntEnum):
    """The state of a worker's registry slot (STASH_WORKER_*)."""

    FREE = 0  # the slot is unused
    LIVE = 1  # a live process holds the slot
    DEAD = 2  # the holder died without leaving: the slot can be taken over


class TtlUpdate(enum.IntEnum):
    """When a TTL state's timestamp moves (STASH_TTL_ON_*)."""

    ON_CREATE_AND_WRITE = 0  # on writes
    ON_READ_AND_WRITE = 1  # on reads too


class TtlVisibility(enum.IntEnum):
    """Whether a read may return an expired entry not yet cleaned up."""

    NEVER_RETURN_EXPIRED = 0
    RETURN_EXPIRED_IF_NOT_CLEANED = 1


class TtlTime(enum.IntEnum):
    """The time a TTL state's entries are stamped and expire by."""

    PROCESSING_TIME = 0  # the worker's clock (Flink's only one)
    EVENT_TIME = 1  # the worker's watermark (Timers.advance)


class TimeDomain(enum.IntEnum):
    """The domain of a timer (stash_time_domain)."""

    EVENT_TIME = 0  # fired as the watermark passes it
    PROCESSING_TIME = 1  # fired as the worker's clock does


class EventKind(enum.IntEnum):
    """What a barrier reports (stash_event_kind): Event.kind."""

    CHECKPOINT_COMPLETE = 1  # every file of the checkpoint is durable and committed
    CHECKPOINT_ABORTED = 2  # the checkpoint failed: it will never complete
    ROLLED_BACK = 3  # this worker's rollback restored the checkpoint


class Storage(enum.IntEnum):
    """Where a service writes checkpoints (stash_storage)."""

    FS = 0  # a directory on disk
    MEMORY = 1  # shared memory (tmpfs), each checkpoint capped in size
    RADOS = 2  # a pool of a Ceph cluster, with a copy in a directory


class LogLevel(enum.IntEnum):
    """How much an event of the persistence engine matters (LogRecord.level)."""

    INFO = 0  # what it did: a checkpoint complete, a worker joined
    WARN = 1  # what went wrong and was dealt with: a worker died, a retry
    ERROR = 2  # what failed: a checkpoint, retention


class Error(enum.IntEnum):
    """stash's own error codes (STASH_E*), negative as the calls return them;
    a system error is returned as -errno instead. Each raises its own
    StashError subclass (Error.ENOTFOUND: NotFound)."""

    ENOTARENA = -1000  # the file is not a stash arena (bad magic)
    EVERSION = -1001  # the arena has another layout version
    ETRUNCATED = -1002  # the arena file is shorter than its header says
    EINCOMPLETE = -1003  # the arena's creation never finished
    EFULL = -1004  # the arena has no memory left for this allocation
    ETOOBIG = -1005  # the record is larger than the largest allocation
    EBUSY = -1006  # the worker index is held by a live process
    EPARALLELISM = -1007  # the parallelism differs from the live workers'
    ENOTFOUND = -1008  # no value for this key and namespace
    EKEYGROUP = -1009  # a write to a key group this worker does not own
    EKIND = -1010  # the state is registered with another kind or options
    ESTALE = -1011  # the iterator was invalidated by a write
    ENOKEY = -1012  # no current key is set
    ECORRUPT = -1013  # a snapshot's bytes fail a check (checksum, length, magic)
    EFORMAT = -1014  # a snapshot of another format version
    ENOSERVICE = -1015  # no live service serves the arena
    EABORTED = -1016  # the checkpoint failed; the detail says why
    EFORK = -1017  # a worker handle used in a process forked from its opener
    EFENCED = -1018  # the arena's host lost its place in its job to another


# The module's names of the members: STASH_ and the rest of the C name.
_NAMES = ((Kind, ""), (Backend, "BACKEND_"), (ArenaFlag, "ARENA_"), (WorkerState, "WORKER_"),
          (TtlUpdate, "TTL_"), (TtlVisibility, "TTL_"), (TtlTime, "TTL_"), (TimeDomain, ""),
          (EventKind, ""), (Storage, "STORAGE_"), (LogLevel, "LOG_"), (Error, ""))
for _group, _prefix in _NAMES:
    for _member in _group:
        globals()[_prefix + _member.name] = _member
        __all__.append(_prefix + _member.name)
del _group, _prefix, _member
HEAP, LMDB = Backend.HEAP, Backend.LMDB  # as the module named them first

DEFAULT_MAX_PARALLELISM = 128  # key groups of an arena created without a number
MAX_MAX_PARALLELISM = 32768  # the most key groups an arena can have
MAX_WORKERS = 1024  # worker indices an arena has

_MANY = 64  # keys a batch of the many-key calls takes at a time


def _enum(group, value):
    """value as a member of group, or as the int it is if this module does
    not know it (a newer library's)."""
    try:
        return group(value)
    except ValueError:
        return value

# ---- errors -------------------------------------------------------------
#
# A failed call raises the class of its code: each of stash's own codes has
# one (Error.ENOTFOUND: NotFound, also a KeyError); a system error (-errno)
# raises the class of the OSError Python raises for that errno (-ENOENT:
# FileNotFound, a FileNotFoundError), else StashOSError; -EINVAL raises
# InvalidArgument, a ValueError. Every one is a StashError.

_BY_CODE = {}  # a code -> the class raised for it


def _raised_for(code):
    """Makes a class the one raised for code."""
    def mark(cls):
        _BY_CODE[code] = cls
        return cls
    return mark


class StashError(Exception):
    """A call of libstash that failed; what is raised is the subclass of its
    code (NotFound for Error.ENOTFOUND, FileNotFound for -ENOENT, ...).

    Attributes: code, the negative code the call returned (an Error member
    for stash's own codes, -errno for a system error); errno, that errno
    (positive, as OSError's) or None for stash's own codes; words,
    stash_strerror() of the code; detail, stash_errmsg(): what the failure
    concerns (the file, offset, key group or worker), "" if nothing; call,
    the call of the module that failed.

    StashError(code, detail=None, call=None) makes one; without a detail
    it takes stash_errmsg() of the calling thread's last failed call."""

    def __init__(self, code, detail=None, call=None):
        super().__init__()
        self._fill(code, _errmsg() if detail is None else detail, call)

    def _fill(self, code, detail, call):
        self.code = _enum(Error, code)
        self.errno = -code if -1000 < code < 0 else None
        self.words = strerror(code)
        self.detail, self.call = detail, call
        if isinstance(self, OSError):
            self.strerror = self.words
        self.args = (self._describe(),)

    def _describe(self):
        where = f"{self.call}: " if self.call else ""
        more = f" ({self.detail})" if self.detail else ""
        return f"{where}{self.words}{more}"

    def __str__(self):
        return self._describe()

    def __reduce__(self):
        return _restore, (type(self), int(self.code), self.detail, self.call)


def _restore(cls, code, detail, call):
    """A StashError unpickled: its class, code, detail and call as they were."""
    e = cls.__new__(cls)
    StashError._fill(e, code, detail, call)
    return e


# System errors (-errno): each the built-in exception of its errno too.

class StashOSError(StashError, OSError):
    """A system error (-errno) of a call, also an OSError (errno, strerror).
    The errnos Python gives an OSError subclass of its own raise a subclass
    that is both: FileNotFound, FileExists, PermissionDenied, TimedOut,
    NotADirectory, TryAgain; -EINVAL raises InvalidArgument."""


class FileNotFound(StashOSError, FileNotFoundError):
    """-ENOENT: no such arena, file or directory, or no complete checkpoint
    to read or roll back to; a FileNotFoundError."""


class FileExists(StashOSError, FileExistsError):
    """-EEXIST: the arena (created without replace) or the path a savepoint
    is to be written at exists; a FileExistsError."""


class PermissionDenied(StashOSError, PermissionError):
    """-EACCES or -EPERM: another user's arena, file or directory; a
    PermissionError."""


class TimedOut(StashOSError, TimeoutError):
    """-ETIMEDOUT: a checkpoint, savepoint or stop took longer than the
    timeout given; a TimeoutError."""


class NotADirectory(StashOSError, NotADirectoryError):
    """-ENOTDIR: a path that must be a directory is not; a NotADirectoryError."""


class TryAgain(StashOSError, BlockingIOError):
    """-EAGAIN: a read of a key group whose owner died in the middle of a
    change, until a new owner has recovered it; a BlockingIOError."""


_OS_CLASSES = {FileNotFoundError: FileNotFound, FileExistsError: FileExists,
               PermissionError: PermissionDenied, TimeoutError: TimedOut,
               NotADirectoryError: NotADirectory, BlockingIOError: TryAgain}


@_raised_for(-_errno.EINVAL)
class InvalidArgument(StashError, ValueError):
    """-EINVAL: an argument out of range or of the wrong form (the detail
    names it); a ValueError."""


# stash's own codes (Error): a class each.

@_raised_for(Error.ENOTARENA)
class NotArena(StashError):
    """Error.ENOTARENA: the file is not a stash arena (bad magic)."""


@_raised_for(Error.EVERSION)
class WrongVersion(StashError):
    """Error.EVERSION: the arena has another layout version."""


@_raised_for(Error.ETRUNCATED)
class Truncated(StashError):
    """Error.ETRUNCATED: the arena file is shorter than its header says."""


@_raised_for(Error.EINCOMPLETE)
class Incomplete(StashError):
    """Error.EINCOMPLETE: the arena's creation never finished."""


@_raised_for(Error.EFULL)
class Full(StashError):
    """Error.EFULL: the arena (or a snapshot writer's heap) has no memory
    left for this allocation."""


@_raised_for(Error.ETOOBIG)
class TooBig(StashError):
    """Error.ETOOBIG: the record is larger than the largest allocation."""


@_raised_for(Error.EBUSY)
class Busy(StashError):
    """Error.EBUSY: the worker index is held by a live process (or every
    reader slot, or the arena's engine, by another)."""


@_raised_for(Error.EPARALLELISM)
class WrongParallelism(StashError):
    """Error.EPARALLELISM: the parallelism differs from the live workers'."""


@_raised_for(Error.ENOTFOUND)
class NotFound(StashError, KeyError):
    """Error.ENOTFOUND: no value for this key and namespace, no state of
    that name, or no state a change names; also a KeyError. The reads that
    can answer "nothing" answer None instead of raising it."""


@_raised_for(Error.EKEYGROUP)
class WrongKeyGroup(StashError):
    """Error.EKEYGROUP: a write to a key group this worker does not own (a
    reader's write, or a key of another worker's)."""


@_raised_for(Error.EKIND)
class WrongKind(StashError):
    """Error.EKIND: the state is registered with another kind or TTL, or a
    call of one kind was made on a state of another."""


@_raised_for(Error.ESTALE)
class Stale(StashError):
    """Error.ESTALE: an iterator or a View used after a write of its worker
    moved what it showed."""


@_raised_for(Error.ENOKEY)
class NoKey(StashError):
    """Error.ENOKEY: a keyed access with no current key (Worker.key() sets
    one)."""


@_raised_for(Error.ECORRUPT)
class Corrupt(StashError):
    """Error.ECORRUPT: a checkpoint's or snapshot's bytes fail a check
    (checksum, length, magic); the detail names the file and offset."""


@_raised_for(Error.EFORMAT)
class WrongFormat(StashError):
    """Error.EFORMAT: a snapshot of another format version."""


@_raised_for(Error.ENOSERVICE)
class NoService(StashError):
    """Error.ENOSERVICE: no live service serves the arena."""


@_raised_for(Error.EABORTED)
class Aborted(StashError):
    """Error.EABORTED: the checkpoint or savepoint failed; the detail says
    why."""


@_raised_for(Error.EFORK)
class Forked(StashError):
    """Error.EFORK: a worker used in a process forked from the one that
    opened it."""


@_raised_for(Error.EFENCED)
class Fenced(StashError):
    """Error.EFENCED: the arena's host lost its place in its job to another
    host, which serves this worker's index now: the worker should stop."""


# The module's own: calls refused before they reach the library.

class Closed(InvalidArgument):
    """A call on a closed handle, or on what it gave out (a state, an
    iterator, a view, a batch, timers): a ValueError, as Python's files
    raise after close, with the code -EINVAL. Closed(detail, call=None)."""

    def __init__(self, detail, call=None):
        super().__init__(-_errno.EINVAL, detail, call)

    def _describe(self):
        return f"{self.call}: {self.detail}" if self.call else self.detail


class WrongThread(StashError, RuntimeError):
    """A call on a worker or reader from a thread other than the one that
    holds it (a stash_worker is used by one thread at a time): a
    RuntimeError, with the code -EBUSY. WrongThread(detail, call=None)."""

    def __init__(self, detail, call=None):
        super().__init__(-_errno.EBUSY, detail, call)

    _describe = Closed._describe


def _class_of(code):
    """The class raised for code."""
    cls = _BY_CODE.get(code)
    if cls is None and -1000 < code < 0:
        cls = _OS_CLASSES.get(type(OSError(-code, "")), StashOSError)
    return cls or StashError


def _error(code, detail=None, call=None):
    """The exception for code, which a call returned (detail None: the
    thread's stash_errmsg())."""
    return _class_of(code)(code, detail, call)


def strerror(code):
    """Words for an error code (stash_strerror): "not found" for
    Error.ENOTFOUND, the system's words for -errno."""
    return _lib.stash_strerror(code).decode()


def _errmsg():
    return _lib.stash_errmsg().decode(errors="replace")


def _check(rc, call, owner=None):
    """rc if it is no error, else raises: the exception a Python callback
    raised during the call first, then the code's."""
    if owner is not None and owner._raised is not None:
        e, owner._raised = owner._raised, None
        raise e
    if rc < 0:
        raise _error(rc, call=call)
    return rc


# ---- handles: closed, and used by one thread ------------------------------
#
# A handle's memory is freed when it closes, and the objects it gave out
# (states, iterators, views, batches, timers) point into it: each of their
# calls checks the handle first, so a call after close raises Closed and
# never reaches freed memory. A worker (or reader) holds a current key
# between calls, so it is used by one thread at a time: the thread that
# opened it, until that thread hands it over or ends; a call from another
# raises WrongThread, which no lock could replace (a key set by one thread
# and a put by another would write the wrong key, silently). Arenas,
# services and snapshots may be shared: their calls are counted, and close
# waits for those in flight.

_claiming = threading.Lock()
_threads = threading.local()
_alive = weakref.WeakValueDictionary()  # thread ident -> its token, gone when it ends


class _Token:
    pass


def _here():
    """This thread's ident, noted as alive until the thread ends (its token,
    thread-local, goes with it)."""
    me = threading.get_ident()
    if getattr(_threads, "token", None) is None:
        _threads.token = _Token()
    _alive[me] = _threads.token
    return me


def _thread_name(ident):
    for t in threading.enumerate():
        if t.ident == ident:
            return t.name
    return "unnamed"


def _claim(h, call):
    """The slow path of a worker handle's check (h.get(call)): raises Closed
    or WrongThread, or takes the handle for this thread if it is free or
    its thread has ended."""
    with _claiming:
        if h.ptr is None:
            raise Closed(f"{h.label} is closed", call)
        me = _here()
        if h.thread not in (0, me) and h.thread in _alive:
            raise WrongThread(
                f"{h.label} belongs to thread {h.thread} ({_thread_name(h.thread)}), "
                f"not to thread {me} ({_thread_name(me)}): a worker is used by one thread "
                "at a time (hand_over() passes it on; a thread that ends lets it go)", call)
        h.thread = me
    return h.ptr


class _Owned:
    """A worker's handle without the C data path: _stash.Handle in Python."""

    __slots__ = ("ptr", "thread", "label")

    def __init__(self, ptr, label, thread):
        self.ptr, self.label, self.thread = ptr, label, thread

    def get(self, call):
        if self.ptr is not None and self.thread == threading.get_ident():
            return self.ptr
        return _claim(self, call)

    def close(self):
        self.ptr = None


class _Shared:
    """A handle any thread may call (an arena, a service, a snapshot): its
    calls are counted in and out, and close waits for those in flight
    before the handle is freed; a serial one (a snapshot, which keeps state
    between calls) takes one call at a time."""

    def __init__(self, ptr, label, free, serial=False, ended="is closed"):
        self.ptr, self.label, self._free, self._ended = ptr, label, free, ended
        self._calls = 0
        self._idle = threading.Condition()
        self._serial = threading.RLock() if serial else None

    def call(self, call, fn, *args):
        """fn(handle, *args), unless the handle is closed."""
        with self._idle:
            if self.ptr is None:
                raise Closed(f"{self.label} {self._ended}", call)
            self._calls += 1
            h = self.ptr
        try:
            if self._serial is None:
                return fn(h, *args)
            with self._serial:
                return fn(h, *args)
        finally:
            with self._idle:
                self._calls -= 1
                if not self._calls:
                    self._idle.notify_all()

    def take(self, call):
        """The handle, closed to every other call once those in flight have
        ended: the caller frees it."""
        with self._idle:
            h, self.ptr = self.ptr, None
            if h is None:
                raise Closed(f"{self.label} {self._ended}", call)
            self._idle.wait_for(lambda: not self._calls)
        return h

    def close(self):
        try:
            h = self.take("close")
        except Closed:
            return
        self._free(h)


class _Borrowed:
    """The arena of a worker (Worker.arena()): the worker's, used from its
    thread while it is open; closing this handle only lets go of it."""

    def __init__(self, worker, ptr):
        self._w, self.ptr = worker, ptr

    def call(self, call, fn, *args):
        self._w._handle.get(call)
        if self.ptr is None:
            raise Closed(f"this handle on the arena of {self._w._handle.label} is closed", call)
        return fn(self.ptr, *args)

    def close(self):
        self.ptr = None


try:
    from stash import _stash as _fast
    _fast.setup(_error, _claim)
    _Handle = _fast.Handle
except ImportError:  # the module without its C data path: ctypes alone
    _fast = None
    _Handle = _Owned


def version():
    """The version of the libstash loaded, "MAJOR.MINOR.PATCH": that of the
    library, where __version__ is the package's."""
    return _lib.stash_version().decode()


# The version of stash the package was built from, written by the build
# (CMake, setup.py) from include/stash.h's STASH_VERSION_*: stash_version()
# is to it what the header's macros are to a C program's stash_version().
# The source tree's package, which no build wrote, is the library's.
__version__ = _installed.VERSION if _installed is not None else version()

# ---- bytes --------------------------------------------------------------


def to_bytes(x):
    """The bytes of a key, namespace or value: bytes (or any buffer) as is,
    str as UTF-8, int as 8 bytes little-endian (two's complement), None as
    b"". Raises TypeError for anything else, a bool included."""
    if isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode()
    if isinstance(x, bool):
        raise TypeError("stash: a bool is neither bytes, str nor int")
    if isinstance(x, int):
        return x.to_bytes(8, "little", signed=x < 0)
    if x is None:
        return b""
    return bytes(x)


def as_int(b, signed=False):
    """The int of up to 8 little-endian bytes, as to_bytes() writes an int
    (signed: two's complement); None stays None."""
    return None if b is None else int.from_bytes(bytes(b), "little", signed=signed)


def as_str(b):
    """The str of UTF-8 bytes (None stays None); raises UnicodeDecodeError
    for bytes that are not UTF-8."""
    return None if b is None else bytes(b).decode()


def _copy(b):
    return ctypes.string_at(b.data, b.len) if b.len else b""


def _array(values):
    items = [to_bytes(v) for v in values]
    arr = (_Bytes * max(len(items), 1))()
    for i, v in enumerate(items):
        arr[i].data = ctypes.cast(ctypes.c_char_p(v), ctypes.c_void_p)
        arr[i].len = len(v)
    return arr, items, len(items)


def key_group(key, max_parallelism=DEFAULT_MAX_PARALLELISM):
    """The key group of key among max_parallelism (Flink's formula over
    XXH3: stash_key_group). Raises InvalidArgument for a max_parallelism
    outside 1 .. MAX_MAX_PARALLELISM."""
    k = to_bytes(key)
    kg = _lib.stash_key_group(k, len(k), max_parallelism)
    if kg == 0xFFFFFFFF:
        raise _error(-_errno.EINVAL, f"max_parallelism {max_parallelism} out of range",
                     "key_group")
    return kg


def kg_range(max_parallelism, parallelism, index):
    """The (first, last) key groups worker index of parallelism owns
    (stash_kg_range_of). Raises InvalidArgument for arguments out of
    range."""
    r = _KgRange()
    if _lib.stash_kg_range_of(max_parallelism, parallelism, index, ctypes.byref(r)) < 0:
        # The library leaves stash_errmsg() as it was: the detail is ours.
        raise _error(-_errno.EINVAL, f"index {index} of parallelism {parallelism} of "
                     f"max_parallelism {max_parallelism} out of range", "kg_range")
    return (r.first, r.last)

# ---- arenas and the service ---------------------------------------------


def _arena_opts(path=None, size=0, max_parallelism=0, backend=Backend.HEAP, lmdb_dir=None,
                flags=0):
    return _ArenaOpts(path.encode() if path else None, size, max_parallelism, flags, backend,
                      lmdb_dir.encode() if lmdb_dir else None)


def _checkpoint_dict(ci):
    return {"id": ci.id, "status": ci.status, "incremental": bool(ci.incremental),
            "savepoint": bool(ci.savepoint), "started_ns": ci.started_ns,
            "duration_ns": ci.duration_ns, "bytes": ci.bytes, "pause_ns": ci.pause_ns,
            "detail": ci.detail.decode(errors="replace")}


class _Made:
    """A class whose objects the module makes, by the call its docstring
    names: calling the class raises TypeError instead of making a handle
    without its C object."""

    __slots__ = ()
    _made_by = "the module"

    def __init__(self, *args, **kwargs):
        """Not called: the class's docstring names the call that makes one."""
        raise TypeError(f"stash.{type(self).__name__} is made by {self._made_by}, "
                        "not by calling the class")

    @classmethod
    def _new(cls, *args):
        self = cls.__new__(cls)
        self._setup(*args)
        return self


class Arena(_Made):
    """A mapped arena, the shared memory the workers of a job attach to:
    Arena.create(name, ...) makes one, Arena.open(name) maps an existing
    one, Worker.arena() is a worker's. Through it a program asks the
    arena's service for checkpoints and reads what it reports. Any thread
    may call it; close() waits for the calls in flight. A context manager.
    A call after close() raises Closed."""

    _made_by = "Arena.create(), Arena.open() or Worker.arena()"

    def _setup(self, guard, name):
        self._g, self.name = guard, name

    @classmethod
    def _mapped(cls, handle, name):
        return cls._new(_Shared(handle.value, f"arena {name!r}", _lib.stash_arena_close), name)

    @classmethod
    def create(cls, name, size=0, max_parallelism=0, backend=Backend.HEAP, path=None,
               lmdb_dir=None,
               replace=False, group=False):
        """Creates the arena name and maps it (stash_arena_create).

        size: bytes, fixed for the arena's life (0: 64 MiB);
        max_parallelism: its key groups (0: DEFAULT_MAX_PARALLELISM, at
        most MAX_MAX_PARALLELISM); backend: Backend.HEAP or Backend.LMDB;
        path: the backing file (None: /dev/shm/stash.NAME); lmdb_dir: the
        LMDB environments' directory (None: NAME.lmdb in this user's state
        directory); replace: remove an existing arena of that name first;
        group: mode 0660 instead of 0600.

        Raises FileExists if the arena exists (without replace),
        InvalidArgument for a bad name or size, PermissionDenied for
        another user's file or directory."""
        o = _arena_opts(path, size, max_parallelism, backend, lmdb_dir,
                        (ArenaFlag.REPLACE if replace else 0) | (ArenaFlag.GROUP if group else 0))
        h = ctypes.c_void_p()
        _check(_lib.stash_arena_create(name.encode(), ctypes.byref(o), ctypes.byref(h)),
               "Arena.create")
        return cls._mapped(h, name)

    @classmethod
    def open(cls, name, path=None):
        """Maps the existing arena name (stash_arena_open); path: its backing
        file if it is not /dev/shm/stash.NAME.

        Raises FileNotFound, NotArena, WrongVersion, Truncated or
        Incomplete, and changes nothing in the file."""
        o = _arena_opts(path)
        h = ctypes.c_void_p()
        _check(_lib.stash_arena_open(name.encode(), ctypes.byref(o), ctypes.byref(h)),
               "Arena.open")
        return cls._mapped(h, name)

    @staticmethod
    def destroy(name, path=None):
        """Removes the arena name's file (stash_arena_destroy); one that is
        absent is no error. Processes that have it mapped keep it until
        they close it. Raises PermissionDenied for another user's arena."""
        o = _arena_opts(path)
        rc = _lib.stash_arena_destroy(name.encode(), ctypes.byref(o))
        if rc != -_errno.ENOENT:
            _check(rc, "Arena.destroy")

    def close(self):
        """Unmaps the arena once the calls in flight have ended; its
        contents stay. Closing again does nothing."""
        self._g.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def info(self):
        """The arena's header facts as a dict: path, size, data_bytes,
        pool_free_bytes, max_parallelism, backend ("heap" or "lmdb"),
        lmdb_dir, page_size, huge_pages, layout_version, creator_pid and
        created_ns."""
        i = _ArenaInfo()
        _check(self._g.call("Arena.info", _lib.stash_arena_info_get, ctypes.byref(i)),
               "Arena.info")
        return {"path": i.path.decode(), "size": i.size, "data_bytes": i.data_bytes,
                "pool_free_bytes": i.pool_free_bytes, "max_parallelism": i.max_parallelism,
                "backend": "lmdb" if i.backend == LMDB else "heap",
                "lmdb_dir": i.lmdb_dir.decode(), "page_size": i.page_size,
                "huge_pages": i.huge_pages, "layout_version": i.layout_version,
                "creator_pid": i.creator_pid, "created_ns": i.created_ns}

    def kg_usage(self, kg):
        """The memory of key group kg as a dict: used_bytes (handed out to
        records) and free_bytes (held by its heap for reuse). Raises
        InvalidArgument for a key group out of range."""
        u = _KgUsage()
        _check(self._g.call("kg_usage", _lib.stash_kg_usage_get, kg, ctypes.byref(u)),
               "kg_usage")
        return {"used_bytes": u.used_bytes, "free_bytes": u.free_bytes}

    def _finished(self, call, fn, timeout_ms):
        """fn's checkpoint or savepoint as a dict, or raises: an aborted one
        with why it failed as its detail."""
        ci = _CheckpointInfo()
        rc = self._g.call(call, fn, timeout_ms, ctypes.byref(ci))
        if rc == Error.EABORTED:
            raise _error(rc, ci.detail.decode(errors="replace"), call)
        _check(rc, call)
        return _checkpoint_dict(ci)

    def checkpoint(self, timeout_ms=0):
        """Asks the service serving the arena for a checkpoint and waits
        until one that started after the request has finished (at most
        timeout_ms; 0: no limit). Returns its facts as a dict: id, status,
        incremental, savepoint, started_ns, duration_ns, bytes, pause_ns
        and detail (its directory).

        Raises Aborted (the detail says why it failed), NoService, or
        TimedOut."""
        return self._finished("checkpoint", _lib.stash_checkpoint, timeout_ms)

    def savepoint(self, timeout_ms=0):
        """As checkpoint(), for a savepoint: DIR/savepoint-ID, full and
        self-contained, never removed by retention. Raises as checkpoint()."""
        return self._finished("savepoint", _lib.stash_savepoint, timeout_ms)

    def status(self):
        """What the control block says of the service and its recent
        checkpoints, as a dict: pid (0 if no service is live), dir,
        pending, completed, failing, next_ns, recent (checkpoint dicts,
        newest first), completed_total, failed_total, the restore that
        filled the arena (restored_id, restored_ns, restored_at_ns,
        restored_records) and the engine's I/O (io_backend,
        io_bytes_written, io_bytes_read, io_errors)."""
        s = _ServiceInfo()
        _check(self._g.call("status", _lib.stash_service_info_get, ctypes.byref(s)), "status")
        return {"pid": s.pid, "dir": s.dir.decode(), "pending": s.pending,
                "completed": s.completed, "failing": s.failing, "next_ns": s.next_ns,
                "recent": [_checkpoint_dict(s.recent[i]) for i in range(s.nrecent)],
                "completed_total": s.completed_total, "failed_total": s.failed_total,
                "restored_id": s.restored_id, "restored_ns": s.restored_ns,
                "restored_at_ns": s.restored_at_ns, "restored_records": s.restored_records,
                "io_backend": s.io_backend.decode(), "io_bytes_written": s.io_bytes_written,
                "io_bytes_read": s.io_bytes_read, "io_errors": s.io_errors}

    def op_counts(self, index):
        """The state operations of worker index so far, also once its worker
        left (stash_op_counts_get), as a dict: value_reads, value_writes,
        list_reads, list_writes, map_reads, map_writes, merging_reads,
        merging_writes and rollbacks. Raises InvalidArgument for an index
        of MAX_WORKERS or more."""
        c = _OpCounts()
        _check(self._g.call("op_counts", _lib.stash_op_counts_get, index, ctypes.byref(c)),
               "op_counts")
        return {n: getattr(c, n) for n in _OP_COUNTS}

    def request_stop(self, timeout_ms=0):
        """Asks the service serving the arena to stop and waits for it (at
        most timeout_ms; 0: no limit). Raises NoService or TimedOut."""
        _check(self._g.call("request_stop", _lib.stash_service_request_stop, timeout_ms),
               "request_stop")

    def stop_with_savepoint(self, timeout_ms=0):
        """Takes a savepoint and stops the service once it is complete, with
        no checkpoint between (on a job's host: a savepoint of the whole
        job, and every host stops). If the savepoint fails nothing stops.
        Returns the savepoint as checkpoint() does and raises as it does."""
        return self._finished("stop_with_savepoint", _lib.stash_stop_with_savepoint,
                              timeout_ms)


LogRecord = namedtuple("LogRecord", "time_ns level subject message")
LogRecord.__doc__ = """One event of the persistence engine, as Service's log_record receives
it: time_ns (ns since the epoch), level (a LogLevel), subject ("checkpoint
12", "worker 3", "service", ...) and message."""


class Service:
    """The persistence engine of arena name, in a thread of this process
    (stash_service_start): it cuts checkpoints at the workers' barriers and
    writes them. An existing arena is reattached; a missing one is created
    (size, max_parallelism, backend, path, lmdb_dir as Arena.create takes
    them) and restored from the newest complete checkpoint in dir.

    dir: the checkpoint directory (required but for storage=STORAGE_MEMORY);
    storage: a Storage; interval_ms: a checkpoint this often (0: only when
    asked); min_pause_ms: at least this long between one's end and the
    next; timeout_ms: a checkpoint not cut by every worker in time fails (0:
    60 s); retain: complete checkpoints kept (0: 3); incremental: write the
    changes since the previous one, a full one every full_every (0: 10);
    lz4: compress each key group's block; restore: restore this checkpoint
    or savepoint directory instead; start_empty: start empty when no
    checkpoint of dir restores; lazy_restore: serve at once, each key group
    restored when first touched; memory_cap: STORAGE_MEMORY's bytes per
    checkpoint (0: 5 MiB); log(line) receives each event as a line,
    log_record(LogRecord) as a record. storage_url names the storage
    instead of storage: "file:DIR", "memory:", "rados://POOL/JOB" or
    "s3://BUCKET/PREFIX" (the remote ones with a copy in dir), with
    ceph_conf, ceph_id and storage_timeout_ms (rados), s3_endpoint,
    s3_region, s3_credentials (a file; keys are never taken as arguments),
    s3_profile and s3_part_bytes (s3); STORAGE_RADOS is its older form,
    writing to pool (with ceph_conf, ceph_id, job, ceph_timeout_ms). With
    host, workers ("A-B"), job_parallelism and lease_ms the service is one
    host of a job that spans hosts (rados).

    Raises Busy if a live engine serves the arena, Corrupt naming each
    checkpoint if none restores (without start_empty), NotADirectory,
    PermissionDenied or another StashOSError naming an unusable dir. Any
    thread may call it; a context manager that stops it."""

    def __init__(self, name, dir=None, storage=Storage.FS, interval_ms=0, min_pause_ms=0,
                 timeout_ms=0, retain=0, incremental=False, full_every=0, lz4=False,
                 restore=None, start_empty=False, memory_cap=0, size=0, max_parallelism=0,
                 backend=Backend.HEAP, path=None, lmdb_dir=None, log=None, log_record=None,
                 pool=None,
                 ceph_conf=None, ceph_id=None, job=None, ceph_timeout_ms=0, host=None,
                 workers=None, job_parallelism=0, lease_ms=0, lazy_restore=False,
                 storage_url=None, storage_timeout_ms=0, s3_endpoint=None, s3_region=None,
                 s3_credentials=None, s3_profile=None, s3_part_bytes=0):
        self._ao = _arena_opts(path, size, max_parallelism, backend, lmdb_dir)
        self._so = _StorageOpts(storage_timeout_ms or ceph_timeout_ms, 0,
                                *[x.encode() if x else None
                                  for x in (ceph_conf, ceph_id, s3_endpoint, s3_region,
                                            s3_credentials, s3_profile)],
                                s3_part_bytes)
        self._log = _LOG(lambda ctx, line: log(line.decode(errors="replace"))) if log else _LOG()

        def record(ctx, r):
            c = r.contents
            log_record(LogRecord(c.time_ns, _enum(LogLevel, c.level),
                                 c.subject.decode(errors="replace"),
                                 c.message.decode(errors="replace")))
        self._log_record = _LOG_RECORD(record) if log_record else _LOG_RECORD()
        o = _ServiceOpts(ctypes.pointer(self._ao), storage, dir.encode() if dir else None,
                         memory_cap, interval_ms, min_pause_ms, timeout_ms, retain,
                         int(incremental), full_every, int(lz4),
                         restore.encode() if restore else None, int(start_empty),
                         int(lazy_restore), self._log,
                         None, self._log_record, *[x.encode() if x else None
                                                   for x in (pool, ceph_conf, ceph_id, job)],
                         ceph_timeout_ms, host.encode() if host else None,
                         workers.encode() if workers else None, job_parallelism, lease_ms,
                         storage_url.encode() if storage_url else None,
                         ctypes.pointer(self._so))
        h = ctypes.c_void_p()
        _check(_lib.stash_service_start(name.encode(), ctypes.byref(o), ctypes.byref(h)),
               "Service")
        self._g = _Shared(h.value, f"service of {name!r}", _lib.stash_service_stop)

    def stop(self):
        """Lets the checkpoint in flight finish and stops the engine, once
        the calls other threads have in flight have ended; the arena stays.
        Stopping again does nothing."""
        self._g.close()

    def stopped(self):
        """Whether the engine stopped by itself, asked to by a stop request
        (`stash stop`, Arena.request_stop): stop() then ends it. True once
        stop() has."""
        try:
            return bool(self._g.call("stopped", _lib.stash_service_stopped))
        except Closed:
            return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

# ---- views --------------------------------------------------------------


class View(_Made):
    """Bytes in the arena, without a copy (ValueState.view() makes one):
    valid until the next call on the worker that read them (a write, a
    read, a key set, a barrier); used after, it raises Stale rather than
    show memory that may have moved, and once the worker is closed,
    Closed. bytes(view) or view.tobytes() copies its bytes out; len(),
    indexing and comparison with bytes work as on bytes. It exports no
    buffer (memoryview() of it raises TypeError): every read through it is
    checked first, so nothing handed out can outlive the worker's memory."""

    __slots__ = ("_owner", "_gen", "_fast_gen", "_data", "_len")
    _made_by = "ValueState.view()"

    def _setup(self, owner, b):
        self._owner, self._gen = owner, owner._gen
        self._fast_gen = _fast.generation() if _fast else 0
        self._data, self._len = b.data, b.len

    def _valid(self):
        self._owner._handle.get("View")
        # The C data path's calls are counted there, not on the worker.
        if (self._owner._gen != self._gen or
                (_fast and _fast.generation() != self._fast_gen)):
            raise Stale(Error.ESTALE, "a view used after the worker's next call", "View")

    def tobytes(self):
        """A copy of the bytes. Raises Stale after the worker's next call,
        Closed once it is closed."""
        self._valid()
        return ctypes.string_at(self._data, self._len) if self._len else b""

    __bytes__ = tobytes

    def __len__(self):
        self._valid()
        return self._len

    def __getitem__(self, i):
        return self.tobytes()[i]

    def __eq__(self, other):
        return self.tobytes() == to_bytes(other)

    def __hash__(self):
        return hash(self.tobytes())

    def __repr__(self):
        return f"View({self.tobytes()!r})"


Event = namedtuple("Event", "kind checkpoint_id detail")
Event.__doc__ = """What Worker.barrier() reports: kind (an EventKind: CHECKPOINT_COMPLETE,
CHECKPOINT_ABORTED or ROLLED_BACK), checkpoint_id, and detail (for a
rollback, why newer complete checkpoints were passed over; "" if none)."""
Timer = namedtuple("Timer", "domain timestamp key ns")
Timer.__doc__ = """A timer: domain (a TimeDomain), timestamp (ms), key and namespace
(bytes)."""

# ---- state --------------------------------------------------------------


def _combine_fn(owner, f):
    """A C combining function over f(acc or None, value) -> bytes."""
    def call(acc, value, out, cap, length, ctx):
        try:
            a = _copy(acc.contents) if acc and acc.contents.len else None
            r = to_bytes(owner._callback(f, a, _copy(value.contents)))
            length[0] = len(r)
            if cap < len(r):
                return -_errno.ENOSPC  # called again with room
            ctypes.memmove(out, r, len(r))
            return 0
        except BaseException as e:  # carried across C, raised when the call returns
            owner._raised = e
            return -_errno.ECANCELED
    return _COMBINE(call)


def _produce_fn(owner, f, with_acc):
    def call(acc, out, cap, length, ctx):
        try:
            a = _copy(acc.contents) if with_acc and acc else None
            r = to_bytes(owner._callback(f, a) if with_acc else owner._callback(f))
            length[0] = len(r)
            if cap < len(r):
                return -_errno.ENOSPC
            ctypes.memmove(out, r, len(r))
            return 0
        except BaseException as e:
            owner._raised = e
            return -_errno.ECANCELED
    return _PRODUCE(call)


class _State(_Made):
    """What every state handle has: its name and kind, and for keyed state
    namespace(), clear() and keys()."""

    kind = 0
    _made_by = "Worker.state() or Reader.state()"

    def _setup(self, worker, handle, name, keep):
        self._w, self._h, self.name, self._keep = worker, handle, name, keep
        self._sh = handle.value
        self._many = None  # the batch of ValueState's many-key calls

    def _call(self, fn, *args, call=None):
        w = self._w
        w._handle.get(call or self.name)
        w._gen += 1
        return _check(fn(self._h, *args), call or self.name, w)

    def _lookup(self, fn, default, *args):
        """A copy of what fn(state, *args, &bytes) finds, or default."""
        b = _Bytes()
        w = self._w
        w._handle.get(self.name)
        w._gen += 1
        rc = fn(self._h, *args, ctypes.byref(b))
        if rc == Error.ENOTFOUND:
            return default
        _check(rc, self.name, w)
        return _copy(b)

    def namespace(self, ns):
        """Sets the namespace of this state's accesses from now on (None or
        b"": the default, empty one; at most 65535 bytes) and returns the
        state, so that lst.namespace("w1").add(x) reads as one step. Raises
        InvalidArgument for a longer namespace, which leaves it as it was."""
        n = to_bytes(ns)
        self._call(_lib.stash_state_namespace, n, len(n))
        return self

    def clear(self):
        """Removes the current key's entry in the current namespace (a
        value, a whole list or map, an accumulator). Raises NoKey without a
        current key, WrongKeyGroup for a key of another worker's key group,
        WrongKind on operator state."""
        self._call(_lib.stash_state_clear)

    def keys(self, ns=None, key_group=None):
        """An iterator of the keys of this state in the worker's key groups
        (Flink's getKeys): in namespace ns, or with ns None (key, namespace)
        pairs of every namespace. key_group: that key group's alone, one
        the worker owns (a reader: any, as a copy taken now). Each item is
        a copy. A write of the worker that adds a key or namespace makes
        the iterator raise Stale; WrongKeyGroup for a key group a worker
        does not own, InvalidArgument for one out of range."""
        n = None if ns is None else to_bytes(ns)
        it = _Iter()
        if key_group is None:
            self._call(_lib.stash_keys_iter, n, len(n or b""), ctypes.byref(it))
        else:
            self._call(_lib.stash_kg_keys_iter, key_group, n, len(n or b""), ctypes.byref(it))
        return _iterate(self._w, it, lambda k, v: _copy(k) if n is not None
                        else (_copy(k), _copy(v)))


def _iterate(w, it, item):
    """A Python iterator over a started stash_iter; each item copied."""
    k, v = _Bytes(), _Bytes()
    while True:
        w._handle.get("iterator")
        rc = _check(_lib.stash_iter_next(ctypes.byref(it), ctypes.byref(k), ctypes.byref(v)),
                    "iterator", w)
        if rc == 0:
            return
        yield item(k, v)


class ValueState(_State):
    """Flink's ValueState: one value per key and namespace (Kind.VALUE),
    made by Worker.state(name) or Reader.state(name).

    get(), view(), put() and clear() act on the worker's current key
    (Worker.key()) in the state's namespace; read(key), write(key, value),
    read_many(keys) and write_many(keys, values) set the key and access it
    in one call. Values are bytes; a value given may be bytes, str or int
    (to_bytes). The calls raise NoKey without a current key,
    WrongKeyGroup for a write of a key in another worker's key group (and
    for any write of a reader), Full when the arena has no memory left,
    TooBig for a value larger than the largest allocation, Closed once
    the worker is closed and WrongThread from a thread other than the
    worker's."""

    kind = Kind.VALUE

    def get(self, default=None):
        """The current key's value (a copy), or the default value the state
        was registered with, or default if it has none."""
        return self._lookup(_lib.stash_value_get, default)

    def view(self):
        """The current key's value as a View, without a copy (valid until the
        worker's next call), or None if it has none."""
        b = _Bytes()
        w = self._w
        w._handle.get(self.name)
        w._gen += 1
        rc = _lib.stash_value_get(self._h, ctypes.byref(b))
        if rc == Error.ENOTFOUND:
            return None
        _check(rc, self.name, w)
        return View._new(w, b)

    def put(self, value):
        """Stores a copy of value for the current key; None clears it."""
        if value is None:
            return self._call(_lib.stash_value_put, None, 0)
        v = to_bytes(value)
        self._call(_lib.stash_value_put, v, len(v))

    # One call for a key and its value: the key becomes the worker's
    # current key, as w.key(key) would make it. Through the C data path
    # where it is built, else through ctypes.

    if _fast:
        def _setup(self, worker, handle, name, keep):
            super()._setup(worker, handle, name, keep)
            # read and write are the C calls themselves, bound to the
            # handles: a Python method around them would cost more than
            # the access (they count their calls for views themselves, and
            # check the worker's handle as every call does).
            self.read = functools.partial(_fast.value_get, worker._handle, self._sh)
            self.write = functools.partial(_fast.value_put, worker._handle, self._sh)

        def read(self, key):
            """Sets key as the worker's current key and returns its value (a
            copy), or None: w.key(key) and get() in one call."""
            return _fast.value_get(self._w._handle, self._sh, key)

        def write(self, key, value):
            """Sets key as the worker's current key and stores value for it
            (None clears): w.key(key) and put(value) in one call."""
            _fast.value_put(self._w._handle, self._sh, key, value)

        def read_many(self, keys):
            """The value of each key of keys (None where it has none), as a
            list, in one call: the keys run as batches of the worker's (64 at
            a time), their entries fetched ahead. A key of another worker's
            key group is read as a copy. The last key stays current."""
            w = self._w
            w._gen += 1
            return _fast.values_get(w._handle, self._batch(), _MANY, self._sh, keys)

        def write_many(self, keys, values):
            """Stores values[i] for keys[i] (None clears), in one call, as
            read_many() reads; the last key stays current. Raises ValueError
            if there are not as many values as keys."""
            w = self._w
            w._gen += 1
            _fast.values_put(w._handle, self._batch(), _MANY, self._sh, keys, values)

        def _batch(self):
            """The batch the many-key calls run through (a reader: none)."""
            if self._many is None and not isinstance(self._w, Reader):
                o = _BatchOpts(_MANY, ctypes.pointer(ctypes.c_void_p(self._sh)), 1)
                h = ctypes.c_void_p()
                _check(_lib.stash_batch_create(self._w._live(self.name), ctypes.byref(o),
                                               ctypes.byref(h)), self.name)
                self._many = h.value
            return self._many
    else:
        def read(self, key):
            """Sets key as the worker's current key and returns its value (a
            copy), or None: w.key(key) and get() in one call."""
            self._w.key(key)
            return self.get()

        def write(self, key, value):
            """Sets key as the worker's current key and stores value for it
            (None clears): w.key(key) and put(value) in one call."""
            self._w.key(key)
            self.put(value)

        def read_many(self, keys):
            """The value of each key of keys (None where it has none), as a
            list; the last key stays current."""
            return [self.read(k) for k in keys]

        def write_many(self, keys, values):
            """Stores values[i] for keys[i] (None clears); the last key stays
            current. Raises ValueError if there are not as many values as
            keys."""
            keys, values = list(keys), list(values)
            if len(keys) != len(values):
                raise ValueError("as many values as keys")
            for k, v in zip(keys, values):
                self.write(k, v)


_RAISES = """The calls act on the worker's current key (Worker.key()) in the state's
    namespace and raise NoKey without one, WrongKeyGroup for a write of a
    key in another worker's key group (and for any write of a reader),
    Full when the arena has no memory left, Closed once the worker is
    closed and WrongThread from a thread other than the worker's."""


class ListState(_State):
    """Flink's ListState: a list of elements per key and namespace
    (Kind.LIST), made by Worker.state(name, Kind.LIST).

    {raises}"""

    kind = Kind.LIST

    def get(self):
        """The current key's elements in insertion order, a list of bytes
        ([] if it has none)."""
        it = _Iter()
        w = self._w
        w._handle.get(self.name)
        w._gen += 1
        rc = _lib.stash_list_get(self._h, ctypes.byref(it))
        if rc == Error.ENOTFOUND:
            return []
        _check(rc, self.name, w)
        return list(_iterate(w, it, lambda k, v: _copy(v)))

    def add(self, value):
        """Appends a copy of value to the current key's list."""
        v = to_bytes(value)
        self._call(_lib.stash_list_add, v, len(v))

    def add_all(self, values):
        """Appends copies of every element of values, in order."""
        arr, keep, n = _array(values)
        self._call(_lib.stash_list_add_all, arr, n)

    def update(self, values):
        """Replaces the current key's list with copies of values; an empty
        one deletes it."""
        arr, keep, n = _array(values)
        self._call(_lib.stash_list_update, arr, n)

    def merge_namespaces(self, target, sources):
        """Appends the current key's lists in the namespaces of sources, in
        order, to its list in namespace target and deletes them (Flink's
        mergeNamespaces, for session windows)."""
        _merge(self, target, sources)


def _merge(state, target, sources):
    t = to_bytes(target)
    arr, keep, n = _array(sources)
    state._call(_lib.stash_merge_namespaces, t, len(t), arr, n)


class MapState(_State):
    """Flink's MapState: a map of user keys to values per key and
    namespace (Kind.MAP), made by Worker.state(name, Kind.MAP). mk in m
    says whether user key mk is present.

    {raises}"""

    kind = Kind.MAP

    def get(self, k, default=None):
        """The value of user key k in the current key's map (a copy), or
        default."""
        kb = to_bytes(k)
        return self._lookup(_lib.stash_map_get, default, kb, len(kb))

    def put(self, k, value):
        """Puts a copy of (k, value) in the current key's map."""
        kb, v = to_bytes(k), to_bytes(value)
        self._call(_lib.stash_map_put, kb, len(kb), v, len(v))

    def put_all(self, entries):
        """Puts every (user key, value) of a dict or of an iterable of pairs."""
        pairs = list(entries.items() if hasattr(entries, "items") else entries)
        ka, kk, n = _array(p[0] for p in pairs)
        va, vk, _ = _array(p[1] for p in pairs)
        self._call(_lib.stash_map_put_all, ka, va, n)

    def remove(self, k):
        """Removes user key k from the current key's map (absent: no error)."""
        kb = to_bytes(k)
        self._call(_lib.stash_map_remove, kb, len(kb))

    def __contains__(self, k):
        kb = to_bytes(k)
        return self._call(_lib.stash_map_contains, kb, len(kb)) == 1

    def is_empty(self):
        """Whether the current key's map is empty (or absent)."""
        return self._call(_lib.stash_map_is_empty) == 1

    def items(self):
        """An iterator of the (user key, value) pairs of the current key's
        map, each a copy, in no particular order. A put of a new user key
        or another current key makes it raise Stale."""
        it = _Iter()
        w = self._w
        w._handle.get(self.name)
        w._gen += 1
        rc = _lib.stash_map_iter(self._h, ctypes.byref(it))
        if rc == Error.ENOTFOUND:
            return iter(())
        _check(rc, self.name, w)
        return _iterate(w, it, lambda k, v: (_copy(k), _copy(v)))

    def to_dict(self):
        """The current key's map as a dict of bytes to bytes."""
        return dict(self.items())


class _MergingState(_State):
    def add(self, value):
        """Adds value to the current key's entry through the state's
        function; an exception the function raised is raised here."""
        v = to_bytes(value)
        self._call(_lib.stash_merging_add, v, len(v))

    def get(self, default=None):
        """The current key's result (a copy), or default if nothing was
        added."""
        return self._lookup(_lib.stash_merging_get, default)

    def merge_namespaces(self, target, sources):
        """Merges the current key's entries in the namespaces of sources
        into namespace target through the state's function and deletes
        them (Flink's mergeNamespaces, for session windows)."""
        _merge(self, target, sources)


class ReducingState(_MergingState):
    """Flink's ReducingState: values combined per key and namespace by the
    reduce(acc, value) -> bytes it was registered with (Kind.REDUCING),
    made by Worker.state(name, Kind.REDUCING, reduce=f). get() is the
    reduced value.

    {raises}"""

    kind = Kind.REDUCING


class AggregatingState(_MergingState):
    """Flink's AggregatingState: an AggregateFunction's accumulator per
    key and namespace (Kind.AGGREGATING), made by Worker.state(name,
    Kind.AGGREGATING, create=, add=, result=, merge=). add(value) goes
    through add(acc, value); get() is result(accumulator).

    {raises}"""

    kind = Kind.AGGREGATING


class OpListState(_State):
    """Flink's operator ListState (Kind.OP_LIST, split evenly among the
    workers on a restore at another parallelism) or UnionListState
    (Kind.OP_UNION, whole on every worker): a list per worker, not per key,
    made by Worker.state(name, Kind.OP_LIST). Raises Closed once the worker
    is closed, WrongThread from another thread."""

    kind = Kind.OP_LIST

    def get(self):
        """The worker's elements, in order: a list of bytes."""
        p, n = _BytesP(), ctypes.c_size_t()
        self._call(_lib.stash_op_list_get, ctypes.byref(p), ctypes.byref(n))
        return [_copy(p[i]) for i in range(n.value)]

    def add(self, value):
        """Appends a copy of value."""
        v = to_bytes(value)
        self._call(_lib.stash_op_list_add, v, len(v))

    def update(self, values):
        """Replaces the list with copies of values (empty: empties it)."""
        arr, keep, n = _array(values)
        self._call(_lib.stash_op_list_update, arr, n)


class BroadcastState(_State):
    """Flink's BroadcastState: a map per worker, the same on every worker
    (Kind.OP_BROADCAST), made by Worker.state(name, Kind.OP_BROADCAST).
    Raises Closed once the worker is closed, WrongThread from another
    thread."""

    kind = Kind.OP_BROADCAST

    def get(self, k, default=None):
        """The value of key k (a copy), or default."""
        kb = to_bytes(k)
        return self._lookup(_lib.stash_broadcast_get, default, kb, len(kb))

    def put(self, k, value):
        """Puts a copy of (k, value)."""
        kb, v = to_bytes(k), to_bytes(value)
        self._call(_lib.stash_broadcast_put, kb, len(kb), v, len(v))

    def remove(self, k):
        """Removes key k (absent: no error)."""
        kb = to_bytes(k)
        self._call(_lib.stash_broadcast_remove, kb, len(kb))

    def to_dict(self):
        """Every entry, as a dict of bytes to bytes."""
        ks, vs, n = _BytesP(), _BytesP(), ctypes.c_size_t()
        self._call(_lib.stash_broadcast_entries, ctypes.byref(ks), ctypes.byref(vs),
                   ctypes.byref(n))
        return {_copy(ks[i]): _copy(vs[i]) for i in range(n.value)}


for _cls in (ListState, MapState, ReducingState, AggregatingState):
    _cls.__doc__ = _cls.__doc__.format(raises=_RAISES)
del _cls

_CLASSES = {Kind.VALUE: ValueState, Kind.LIST: ListState, Kind.MAP: MapState,
            Kind.REDUCING: ReducingState, Kind.AGGREGATING: AggregatingState,
            Kind.OP_LIST: OpListState, Kind.OP_UNION: OpListState,
            Kind.OP_BROADCAST: BroadcastState}

# ---- workers and readers ------------------------------------------------


class Worker:
    """A worker of arena name: a process (or thread) that joins the arena's
    registry as worker index of parallelism and owns the key groups of
    that index (stash_worker_open). It sets a current key (key()) and reads
    and writes state through the handles state() gives, calls barrier()
    between records, and close() when it is done. A context manager.

    rollback: restore the worker's key groups and operator state from the
    service's newest complete checkpoint (a replacement after a failure);
    path: the arena's backing file if it is not /dev/shm/stash.NAME;
    clock() -> milliseconds, the TTL clock (default: the real time);
    on_cut(worker, checkpoint_id) is called at each checkpoint's cut of
    this worker, before its state is cut (a non-zero return fails the
    checkpoint).

    Raises FileNotFound for no such arena, Busy if a live process holds the
    index, WrongParallelism if live workers run at another parallelism,
    NoService or FileNotFound for a rollback with no service or no
    checkpoint, Fenced if the arena's host lost its place in its job.

    A worker is used by one thread at a time: the one that opened it, until
    hand_over() or that thread's end; a call from another, on the worker or
    on anything it gave out, raises WrongThread."""

    def __init__(self, name, index=0, parallelism=1, rollback=False, path=None, clock=None,
                 on_cut=None):
        self._prepare(name, path, clock)

        def cut(worker, checkpoint_id, ctx):
            try:
                r = self._callback(on_cut, self, checkpoint_id)
                return int(r) if r else 0
            except BaseException as e:
                self._raised = e
                return -_errno.ECANCELED
        self._cut = _CUT(cut) if on_cut else _CUT()
        o = _WorkerOpts(index, parallelism, ctypes.pointer(self._ao) if path else None,
                        self._clock, None, int(rollback), self._cut, None)
        h = ctypes.c_void_p()
        _check(_lib.stash_worker_open(name.encode(), ctypes.byref(o), ctypes.byref(h)),
               "Worker", self)
        self._handle = _Handle(h.value, f"worker {name!r} (index {index} of {parallelism or 1})",
                               _here())

    def _prepare(self, name, path, clock):
        """What a worker and a reader hold before their handle opens."""
        self._gen = 0
        self._raised = None
        self._inside = 0  # Python callbacks running inside a call of the worker's
        self._states = {}
        self._batches = set()
        self._ao = _arena_opts(path)
        self._clock = _CLOCK(lambda ctx: int(self._callback(clock))) if clock else _CLOCK()
        self.name = name

    def _live(self, call="Worker"):
        """The worker's handle for a call from this thread, or raises."""
        return self._handle.get(call)

    def _callback(self, fn, *args):
        """fn(*args) called from inside a call of the worker's: meanwhile the
        worker may be neither closed nor handed over."""
        self._inside += 1
        try:
            return fn(*args)
        finally:
            self._inside -= 1

    def _not_inside(self, call):
        if self._inside:
            raise _error(-_errno.EBUSY, f"{self._handle.label}: {call} inside a callback of "
                         "one of its own calls (it returns first)", call)

    def close(self):
        """Leaves the registry (after recording operator state) and detaches;
        every state, iterator, view, batch and timer service it gave out
        raises Closed from now on. Closing again does nothing; closing from
        inside a callback of one of the worker's own calls raises
        StashOSError (-EBUSY)."""
        if self._handle.ptr is None:
            return
        h = self._live("close")
        self._not_inside("close")
        self._handle.close()
        self._gen += 1
        # Batches go before their worker (stash.h).
        for b in list(self._batches):
            b._free()
        for s in self._states.values():
            if s._many is not None:
                _lib.stash_batch_destroy(s._many)
                s._many = None
        _lib.stash_worker_close(h)

    def hand_over(self):
        """Lets the worker go from this thread: the next thread to call it
        holds it from then on."""
        self._live("hand_over")
        self._not_inside("hand_over")
        self._handle.thread = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def arena(self):
        """The arena the worker is attached to: the worker's, used from its
        thread while it is open; closing it only lets go of this handle."""
        return Arena._new(_Borrowed(self, _lib.stash_worker_arena(self._live("arena"))),
                          self.name)

    def info(self):
        """Facts of the worker's registry slot as a dict: index,
        parallelism, pid, state (a WorkerState), range (the first and last
        key group it owns), joined_ns, heartbeat_ns, generation (how many
        times the slot was joined) and previous_pid (the dead worker it
        took over from, or 0)."""
        i = _WorkerInfo()
        _check(_lib.stash_worker_info_get(self._live("info"), ctypes.byref(i)), "info")
        return {"index": i.index, "parallelism": i.parallelism, "pid": i.pid,
                "state": _enum(WorkerState, i.state), "range": (i.range.first, i.range.last),
                "joined_ns": i.joined_ns, "heartbeat_ns": i.heartbeat_ns,
                "generation": i.generation, "previous_pid": i.previous_pid}

    def state(self, name, kind=Kind.VALUE, ttl_ms=0, ttl_update=TtlUpdate.ON_CREATE_AND_WRITE,
              ttl_visibility=TtlVisibility.NEVER_RETURN_EXPIRED, reduce=None, create=None,
              add=None, result=None, merge=None, default=None, ttl_time=TtlTime.PROCESSING_TIME,
              ttl_cleanup_entries=0, ttl_cleanup_every_record=False,
              ttl_cleanup_full_snapshot=False):
        """The worker's handle on state name (at most 63 bytes), registered
        in the arena if no process has (stash_state_get): a ValueState,
        ListState, MapState, ReducingState, AggregatingState, OpListState
        or BroadcastState as kind (a Kind) says. Asked again, it is the
        same handle.

        ttl_ms: entries expire this long after they were written (0:
        never), with ttl_update, ttl_visibility, ttl_time (TtlTime:
        processing or event time), ttl_cleanup_entries (entries examined
        per write; 0: 5), ttl_cleanup_every_record and
        ttl_cleanup_full_snapshot as Flink's StateTtlConfig has them.
        reduce(acc or None, value) -> bytes combines a reducing state's
        values; an aggregating state takes create() -> acc, add(acc,
        value) -> acc, result(acc) -> bytes and merge(acc, acc) -> acc; a
        value state's default is read for a key that has none. The
        functions are this process's; an exception one raises is raised by
        the call that ran it.

        Raises WrongKind if name is registered with another kind or TTL,
        InvalidArgument for no name, a kind unknown or a function missing,
        Full when the arena's catalog is full."""
        self._live(name)
        got = self._states.get(name)
        if got is not None and got.kind == kind:
            return got
        d = _StateDesc()
        d.name, d.kind = name.encode(), kind
        d.ttl.ttl_ms, d.ttl.update, d.ttl.visibility = ttl_ms, ttl_update, ttl_visibility
        d.ttl.time, d.ttl.cleanup_entries = ttl_time, ttl_cleanup_entries
        d.ttl.cleanup_every_record = int(ttl_cleanup_every_record)
        d.ttl.cleanup_full_snapshot = int(ttl_cleanup_full_snapshot)
        return self._register(d, reduce, create, add, result, merge, default)

    def _register(self, d, reduce, create, add, result, merge, default):
        keep = [d.name]
        if reduce:
            d.reduce = _combine_fn(self, reduce)
            keep.append(d.reduce)
        if create or add or result:
            fns = _AggregateFns(_produce_fn(self, create, False) if create else _PRODUCE(),
                                _combine_fn(self, add) if add else _COMBINE(),
                                _produce_fn(self, result, True) if result else _PRODUCE(),
                                _combine_fn(self, merge) if merge else _COMBINE())
            d.aggregate = ctypes.pointer(fns)
            keep.append(fns)
        if default is not None:
            dv = to_bytes(default)
            keep.append(dv)
            d.default_value = _Bytes(ctypes.cast(ctypes.c_char_p(dv), ctypes.c_void_p), len(dv))
        h = ctypes.c_void_p()
        _check(_lib.stash_state_get(self._live(d.name.decode()), ctypes.byref(d),
                                    ctypes.byref(h)),
               d.name.decode(), self)
        s = _CLASSES[d.kind]._new(self, h, d.name.decode(), keep)
        self._states[s.name] = s
        return s

    def key(self, key):
        """Sets the current key (bytes, str or int; at most 65535 bytes):
        every state access until the next key() uses it. Returns the
        worker. Raises InvalidArgument for a longer key, after which no key
        is current."""
        k = to_bytes(key)
        self._gen += 1
        _check(_lib.stash_key_set(self._handle.get("key"), k, len(k)), "key")
        return self

    def key_group(self):
        """The key group of the current key. Raises NoKey if none is set."""
        return _check(_lib.stash_key_group_current(self._live("key_group")), "key_group")

    def barrier(self):
        """Call between records: if the service asked for a checkpoint this
        worker has not cut yet, cuts it here (calling on_cut first). Returns
        an Event when a checkpoint completed or aborted since the last one,
        or at the first barrier after a rollback which checkpoint it
        restored; else None. Raises Fenced when the arena's host lost its
        place in its job (the worker should stop), or the exception on_cut
        raised."""
        e = _Event()
        self._gen += 1
        rc = _check(_lib.stash_barrier(self._handle.get("barrier"), ctypes.byref(e)), "barrier",
                    self)
        if rc == 0:
            return None
        return Event(_enum(EventKind, e.kind), e.checkpoint_id, e.detail.decode(errors="replace"))

    def timers(self, name):
        """The worker's timer service called name (Flink's
        InternalTimerService), registered in the arena's catalog on first
        use: a Timers. Raises WrongKind if a state has that name."""
        h = ctypes.c_void_p()
        _check(_lib.stash_timers_get(self._live(name), name.encode(), ctypes.byref(h)), name)
        return Timers._new(self, h, name)

    def batch(self, capacity=0, states=None):
        """A Batch of this worker's events (capacity: how many it holds; 0:
        32, at most 4096), fetching ahead the entries of states (at most 8;
        default: every keyed state registered, the first 8)."""
        return Batch(self, capacity, states)


class Reader(Worker):
    """A reader of arena name (stash_reader_open): a worker handle that
    takes no worker slot, owns no key group and joins no barrier, so it
    never blocks a worker or a checkpoint. It reads any key of any key
    group, as a copy; its writes raise WrongKeyGroup. at_checkpoint: read
    as of the service's newest complete checkpoint, fixed for the
    reader's life; checkpoint_dir: read that checkpoint or savepoint
    directory instead of an arena (name None); path and clock as Worker
    takes them.

    Raises FileNotFound (no arena, or no complete checkpoint), NoService
    (at_checkpoint with no service's checkpoints), Busy when every reader
    slot is taken, Corrupt naming the file of a damaged checkpoint. Used by
    one thread at a time, as a Worker is."""

    def __init__(self, name=None, at_checkpoint=False, checkpoint_dir=None, path=None,
                 clock=None):
        self._prepare(name, path, clock)
        o = _ReaderOpts(ctypes.pointer(self._ao) if path else None, self._clock, None,
                        int(at_checkpoint), checkpoint_dir.encode() if checkpoint_dir else None)
        h = ctypes.c_void_p()
        _check(_lib.stash_reader_open(name.encode() if name else None, ctypes.byref(o),
                                      ctypes.byref(h)), "Reader", self)
        self._handle = _Handle(h.value, f"reader of {name or checkpoint_dir!r}", _here())

    def state(self, name, reduce=None, create=None, add=None, result=None, merge=None,
              default=None):
        """The handle on state name as the workers registered it, its kind
        and TTL from the arena's catalog (stash_state_describe). A reducing
        or aggregating state may be given the workers' functions as
        Worker.state() takes them; without result, an aggregating state's
        get() shows its accumulator. Raises NotFound if no process
        registered name."""
        arena = _lib.stash_worker_arena(self._live(name))
        got = self._states.get(name)
        if got is not None:
            return got
        d = _StateDesc()
        _check(_lib.stash_state_describe(arena, name.encode(), ctypes.byref(d)), name)
        d.name = name.encode()
        if d.kind == Kind.REDUCING and reduce is None:
            reduce = lambda acc, v: v  # noqa: E731
        if d.kind == Kind.AGGREGATING:
            create = create or (lambda: b"")
            add = add or (lambda acc, v: v)
            result = result or (lambda acc: acc)
        return self._register(d, reduce, create, add, result, merge, default)

# ---- batches and timers -------------------------------------------------


class Batch:
    """Events of many keys of worker's, their state fetched ahead, then run
    in order (stash_batch_*; Worker.batch() makes one too): add(key, event)
    queues each, then run(fn) calls fn(event) with the event's key current.
    capacity: events it holds (0: 32, at most 4096); states: the state
    handles whose entries fn reads or writes, fetched ahead (at most 8;
    default: every keyed state the worker registered, the first 8). A
    context manager that closes it. Raises InvalidArgument for a capacity
    or states out of range, Closed once it or its worker is closed."""

    def __init__(self, worker, capacity=0, states=None):
        self._w = worker
        self._events = []
        o = _BatchOpts(capacity, None, 0)
        if states:
            arr = (ctypes.c_void_p * len(states))(*[s._h.value for s in states])
            o.states, o.nstates = ctypes.cast(arr, ctypes.POINTER(ctypes.c_void_p)), len(states)
        h = ctypes.c_void_p()
        _check(_lib.stash_batch_create(worker._live("Batch"), ctypes.byref(o), ctypes.byref(h)),
               "Batch")
        self._h = h.value
        worker._batches.add(self)
        self.capacity = capacity or 32

    def _live(self, call):
        """The batch's handle for a call, its worker checked first."""
        self._w._live(call)
        if self._h is None:
            raise Closed(f"batch of {self._w._handle.label} is closed", call)
        return self._h

    def add(self, key, event=None):
        """Queues event (any object, handed to run()'s fn) for key (copied,
        at most 65535 bytes). Returns False if the batch is full, else
        True."""
        k = to_bytes(key)
        rc = _lib.stash_batch_add(self._live("Batch.add"), k, len(k), len(self._events))
        if rc == -_errno.ENOSPC:
            return False
        _check(rc, "Batch.add")
        self._events.append(event)
        return True

    def __len__(self):
        return _lib.stash_batch_size(self._live("len"))

    def run(self, fn):
        """Runs the queued events and empties the batch: fetches ahead what
        their accesses will touch, then calls fn(event) for each in the
        order they were added, its key the worker's current key (the
        outcome is that of setting each key and calling fn one at a time).
        Returns each event's result: 0, fn's int return, or
        Error.EKEYGROUP for an event of a key group the worker does not own
        (fn not called). An exception fn raised stops the run and is raised
        here."""
        h = self._live("Batch.run")
        events, self._events = self._events, []
        w = self._w

        def call(worker, ev, ctx):
            if w._raised is not None:
                return -_errno.ECANCELED
            try:
                r = w._callback(fn, events[ev or 0])
                return int(r) if r else 0
            except BaseException as e:
                w._raised = e
                return -_errno.ECANCELED
        results = (ctypes.c_int * max(len(events), 1))()
        w._gen += 1
        _check(_lib.stash_batch_run(h, _BATCH_FN(call), None, results), "Batch.run", w)
        return [_enum(Error, r) if r <= -1000 else r for r in results[:len(events)]]

    def _free(self):
        if self._h is not None:
            _lib.stash_batch_destroy(self._h)
            self._h = None
            self._w._batches.discard(self)

    def close(self):
        """Frees the batch and its queued events (closing again, or after the
        worker, does nothing)."""
        if self._h is not None:
            self._w._live("Batch.close")
            self._free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Timers(_Made):
    """A timer service of a worker (Flink's InternalTimerService), made by
    Worker.timers(name): timers per key and namespace, in event time (fired
    as the watermark passes them, advance()) or processing time (fired as
    the worker's clock does, poll()). A timer is keyed state of its key's
    key group: the key group's owner registers and fires it, checkpoints
    carry it. Raises NoKey where a current key is needed and there is
    none, WrongKeyGroup for a key of another worker's key group, Closed
    once the worker is closed."""

    _made_by = "Worker.timers()"

    def _setup(self, worker, handle, name):
        self._w, self._h, self.name = worker, handle, name

    def _live(self):
        """The timer service's handle, its worker checked first."""
        self._w._live(self.name)
        self._w._gen += 1
        return self._h

    def register(self, timestamp, ns=b"", domain=TimeDomain.EVENT_TIME):
        """Registers a timer for the current key in namespace ns at timestamp
        (ms) in domain (a TimeDomain); the same timer registered twice is
        one."""
        n = to_bytes(ns)
        _check(_lib.stash_timer_register(self._live(), domain, n, len(n), timestamp), self.name)

    def delete(self, timestamp, ns=b"", domain=TimeDomain.EVENT_TIME):
        """Deletes the current key's timer in namespace ns at timestamp (an
        absent one is no error)."""
        n = to_bytes(ns)
        _check(_lib.stash_timer_delete(self._live(), domain, n, len(n), timestamp), self.name)

    def _fire(self, fn):
        w = self._w

        def call(t, ctx):
            try:
                tm = t.contents
                r = w._callback(fn, Timer(_enum(TimeDomain, tm.domain), tm.timestamp,
                                          _copy(tm.key), _copy(tm.ns)))
                return int(r) if r else 0
            except BaseException as e:
                w._raised = e
                return -_errno.ECANCELED
        return _TIMER_FN(call)

    def advance(self, watermark, fn):
        """Raises the service's watermark to watermark (it never goes back)
        and calls fn(timer) for each event-time timer at or before it, in
        timestamp order, with the timer's key current (fn may register
        timers). Returns how many fired; an exception fn raised stops the
        firing and is raised here."""
        return _check(_lib.stash_timers_advance(self._live(), watermark, self._fire(fn), None),
                      self.name, self._w)

    def poll(self, fn):
        """As advance(), for the processing-time timers due by the worker's
        clock now. Returns how many fired."""
        return _check(_lib.stash_timers_poll(self._live(), self._fire(fn), None), self.name,
                      self._w)

    @property
    def watermark(self):
        """The service's watermark: the highest advance() was given, 0
        before the first."""
        self._w._live(self.name)
        return _lib.stash_timers_watermark(self._h)

    def timers(self, key_group=-1):
        """A list of the timers of key group key_group, one the worker owns,
        or with -1 those of the current key (order unspecified)."""
        it, t = _Iter(), _Timer()
        _check(_lib.stash_timers_iter(self._live(), key_group, ctypes.byref(it)), self.name)
        out = []
        while _check(_lib.stash_timers_next(ctypes.byref(it), ctypes.byref(t)), self.name) == 1:
            out.append(Timer(_enum(TimeDomain, t.domain), t.timestamp, _copy(t.key),
                             _copy(t.ns)))
        return out


# ---- snapshots offline --------------------------------------------------

Entry = namedtuple("Entry", "kg state kind key ns map_key value index ttl_ms domain timestamp "
                            "worker")
Entry.__doc__ = """One entry of a snapshot (stash_snapshot_entry): a value (or the
accumulator of a reducing or aggregating state), a list element (index), a
map entry (map_key), a timer (domain, timestamp), or an operator-state entry
of worker; kg is its key group, state its state's name, kind a Kind; ttl_ms
is when a TTL state's entry was written (0 without TTL)."""


def _entry(e):
    return Entry(e.kg, e.state.decode(), _enum(Kind, e.kind), _copy(e.key), _copy(e.ns),
                 _copy(e.map_key), _copy(e.value), e.index, e.ttl_ms,
                 _enum(TimeDomain, e.domain), e.timestamp, e.worker)


def _snapshot_info(i):
    return {"id": i.id, "created_ns": i.created_ns, "base_id": i.base_id,
            "max_parallelism": i.max_parallelism, "states": i.nstates,
            "op_parallelism": i.op_parallelism, "data_bytes": i.data_bytes}


def _ttl_of(ttl_ms, update, visibility):
    t = _Ttl()
    t.ttl_ms, t.update, t.visibility = ttl_ms, update, visibility
    return t


class Snapshot:
    """A checkpoint or savepoint directory at path read offline, without an
    arena or a service (Flink's State Processor API reading a savepoint):
    its states, its keyed entries decoded and its operator state;
    rewrite() writes it anew with changes. Iterating over it gives every
    keyed entry, as entries() does. Opening it checks its metadata and
    every data file's checksums, as a restore does: raises FileNotFound
    for no such directory, Corrupt naming the file and offset of damage.

    Any thread may call it, one call at a time; close() waits for the call
    in flight. A context manager; a call after close() raises Closed."""

    def __init__(self, path):
        h = ctypes.c_void_p()
        _check(_lib.stash_snapshot_open(os.fsencode(path), ctypes.byref(h)), str(path))
        self.path = str(path)
        self._g = _Shared(h.value, f"snapshot {self.path!r}", _lib.stash_snapshot_close,
                          serial=True)

    def close(self):
        """Releases the snapshot (closing again does nothing)."""
        self._g.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __iter__(self):
        return self.entries()

    def info(self):
        """The snapshot's facts as a dict: id, created_ns, base_id (an
        incremental checkpoint's base; 0 for a full one), max_parallelism,
        states (how many), op_parallelism and data_bytes."""
        i = _SnapshotInfo()
        _check(self._g.call("info", _lib.stash_snapshot_info_get, ctypes.byref(i)), "info")
        return _snapshot_info(i)

    def states(self):
        """Each state of the snapshot as a dict: name, kind (a Kind), ttl_ms,
        ttl_update, ttl_visibility and ttl_time."""
        out = []
        for i in range(self.info()["states"]):
            d = _StateDesc()
            _check(self._g.call("states", _lib.stash_snapshot_state, i, ctypes.byref(d)),
                   "states")
            out.append({"name": d.name.decode(), "kind": _enum(Kind, d.kind),
                        "ttl_ms": d.ttl.ttl_ms, "ttl_update": _enum(TtlUpdate, d.ttl.update),
                        "ttl_visibility": _enum(TtlVisibility, d.ttl.visibility),
                        "ttl_time": _enum(TtlTime, d.ttl.time)})
        return out

    def _collect(self, scan):
        got = []

        def take(ctx, e):
            got.append(_entry(e.contents))
            return 0
        _check(scan(_SNAPSHOT_FN(take)), "scan")
        return got

    def entries(self, first=0, last=None):
        """An iterator of the keyed entries (Entry) of key groups first to
        last (all by default), as of the snapshot (of an incremental
        checkpoint, each entry's newest version in its chain), key group
        by key group as stash_snapshot_scan gives them. Raises
        InvalidArgument for a range beyond the key groups, Corrupt naming
        the file and offset of damage found."""
        if last is None:
            last = self.info()["max_parallelism"] - 1
        for kg in range(first, last + 1):
            yield from self._collect(lambda fn, kg=kg: self._g.call(
                "entries", _lib.stash_snapshot_scan, _KgRange(kg, kg), fn, None))

    def operator_state(self):
        """A list of every operator-state entry (Entry), worker by worker: an
        element of a list or union list (index, value), a broadcast entry
        (map_key, value) and a timer service's watermark (kind
        Kind.TIMERS, timestamp). Raises Corrupt for damaged metadata."""
        return self._collect(lambda fn: self._g.call("operator_state",
                                                     _lib.stash_snapshot_op_scan, fn, None))

    def rewrite(self, path, max_parallelism=0, id=0, drop=(), rename=None, ttl=None):
        """Writes the snapshot anew as a savepoint at path, which must not
        exist (its parent must), whole or not at all: the states named in
        drop left out, rename {old: new}, ttl {state: ms, 0 for none}, every
        entry re-hashed into max_parallelism key groups if given (0: the
        snapshot's), its id id (0: the snapshot's). Returns what was
        written, as info() does.

        Raises FileExists, FileNotFound (no parent), NotFound for a change
        naming no state of the snapshot, InvalidArgument (two states left
        with one name, a TTL for operator state), or the I/O error naming
        the file."""
        rename, ttl = rename or {}, ttl or {}
        current = {s["name"]: s for s in self.states()}
        changes, keep = [], []
        for name in drop:
            changes.append((name, 1, None, 0, None))
        for old, new in rename.items():
            changes.append((old, 0, new, 0, None))
        for name, ms in ttl.items():
            s = current.get(name, {})
            changes.append((name, 0, None, 1, _ttl_of(ms, s.get("ttl_update", 0),
                                                      s.get("ttl_visibility", 0))))
        arr = (_SnapshotChange * max(len(changes), 1))()
        for i, (name, dropped, new, set_ttl, t) in enumerate(changes):
            keep.extend([name.encode(), new.encode() if new else None])
            arr[i].state, arr[i].drop, arr[i].set_ttl = keep[-2], dropped, set_ttl
            arr[i].rename = keep[-1]
            if t is not None:
                arr[i].ttl = t
        o = _RewriteOpts()
        o.max_parallelism, o.id, o.nchanges = max_parallelism, id, len(changes)
        o.changes = ctypes.cast(arr, ctypes.POINTER(_SnapshotChange))
        i = _SnapshotInfo()
        _check(self._g.call("rewrite", _lib.stash_snapshot_rewrite, os.fsencode(path),
                            ctypes.byref(o), ctypes.byref(i)), str(path))
        return _snapshot_info(i)


class SnapshotWriter:
    """A savepoint written offline, from scratch (bootstrap): declare its
    states with state(), add entries with put(), delete() and op_put(),
    then commit() writes it at path, which must not exist (its parent
    must): path holds a whole savepoint or nothing. Its entries are built
    in a heap of the writer's own of size bytes (0: 256 MiB).
    max_parallelism: its key groups (0: DEFAULT_MAX_PARALLELISM); id: the
    savepoint's id (0: 1); op_parallelism: the workers its operator state
    is of (0: none).

    Used with `with`, it commits when the block ends and aborts if the
    block raised. Raises FileExists, FileNotFound (no parent) or another
    error naming path. Any thread may call it, one call at a time; a call
    after commit() or abort() raises Closed."""

    def __init__(self, path, max_parallelism=0, size=0, id=0, op_parallelism=0):
        o = _WriterOpts(max_parallelism, size, id, op_parallelism)
        h = ctypes.c_void_p()
        _check(_lib.stash_snapshot_writer_open(os.fsencode(path), ctypes.byref(o),
                                               ctypes.byref(h)), str(path))
        self.path = str(path)
        self._g = _Shared(h.value, f"snapshot writer of {self.path!r}",
                          _lib.stash_snapshot_writer_abort, serial=True,
                          ended="has ended (committed or aborted)")

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if self._g.ptr is None:
            return
        if kind is None:
            self.commit()
        else:
            self.abort()

    def state(self, name, kind=Kind.VALUE, ttl_ms=0, ttl_update=TtlUpdate.ON_CREATE_AND_WRITE,
              ttl_visibility=TtlVisibility.NEVER_RETURN_EXPIRED):
        """Declares state name of kind (a Kind; Kind.TIMERS: a timer
        service) with its TTL setting; functions and default values are the
        job's, not the savepoint's. Raises WrongKind if name was declared
        with another kind, InvalidArgument for no name or TTL options its
        kind cannot have."""
        d = _StateDesc()
        d.name, d.kind = name.encode(), kind
        d.ttl = _ttl_of(ttl_ms, ttl_update, ttl_visibility)
        _check(self._g.call(name, _lib.stash_snapshot_writer_state, ctypes.byref(d)), name)

    def _entry(self, state, key=b"", value=b"", ns=b"", map_key=b"", ttl_ms=0,
               domain=TimeDomain.EVENT_TIME, timestamp=0, worker=0):
        e, keep = _SnapshotEntry(), []
        e.state = state.encode()
        for field, x in (("key", key), ("value", value), ("ns", ns), ("map_key", map_key)):
            b = to_bytes(x)
            keep.append(b)
            setattr(e, field, _Bytes(ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p), len(b)))
        e.ttl_ms, e.domain, e.timestamp, e.worker = ttl_ms, domain, timestamp, worker
        return e, keep

    def put(self, state, key, value=b"", ns=b"", map_key=b"", ttl_ms=0,
            domain=TimeDomain.EVENT_TIME, timestamp=0):
        """Adds one keyed entry of key in namespace ns to the declared state
        state: a value, or a reducing or aggregating state's accumulator
        (replacing one there), an element appended to a list, a map entry
        (map_key, replacing one), or a timer (domain, timestamp). A TTL
        state's entry keeps ttl_ms as when it was written (0: now). Raises
        NotFound for an undeclared state, WrongKind for operator state,
        Full when the writer's heap is full (give a larger size)."""
        e, keep = self._entry(state, key, value, ns, map_key, ttl_ms, domain, timestamp)
        _check(self._g.call(state, _lib.stash_snapshot_writer_put, ctypes.byref(e)), state)

    def delete(self, state, key, ns=b"", map_key=b"", domain=TimeDomain.EVENT_TIME, timestamp=0):
        """Removes what put() would have added for key in namespace ns: the
        value or accumulator, the whole list, the map entry of map_key (the
        whole map without one), or the timer (domain, timestamp). What is
        absent is no error. Raises NotFound for an undeclared state,
        WrongKind for operator state."""
        e, keep = self._entry(state, key, b"", ns, map_key, 0, domain, timestamp)
        _check(self._g.call(state, _lib.stash_snapshot_writer_delete, ctypes.byref(e)), state)

    def op_put(self, state, worker, value=b"", map_key=b"", timestamp=0):
        """Adds an operator-state entry of worker worker (< op_parallelism) to
        the declared state state: an element appended to a list or union
        list, a broadcast entry (map_key, value), or a timer service's
        watermark (timestamp). Raises NotFound for an undeclared state,
        WrongKind for keyed state, InvalidArgument for a worker beyond the
        operator state's parallelism."""
        e, keep = self._entry(state, b"", value, b"", map_key, 0, TimeDomain.EVENT_TIME,
                              timestamp, worker)
        _check(self._g.call(state, _lib.stash_snapshot_writer_op_put, ctypes.byref(e)), state)

    def commit(self):
        """Writes and commits the savepoint at path and ends the writer,
        also if it fails, which leaves nothing at path. Returns what was
        written, as Snapshot.info() does. Raises InvalidArgument (an id past
        2**53, operator state of more than MAX_WORKERS workers),
        StashOSError (-EFBIG for metadata past 64 MiB) or the error naming
        the file."""
        i = _SnapshotInfo()
        h = self._g.take("commit")
        _check(_lib.stash_snapshot_writer_commit(h, ctypes.byref(i)), self.path)
        return _snapshot_info(i)

    def abort(self):
        """Ends the writer without writing anything (after commit() or
        abort(), does nothing)."""
        self._g.close()
