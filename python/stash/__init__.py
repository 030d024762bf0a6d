# SPDX-License-Identifier: MIT
"""stash from Python: workers, readers and the service of a stash arena.

A thin layer over libstash (ctypes): the same calls as include/stash.h,
bytes in and bytes out. Keys, namespaces and values may be given as bytes
(or any buffer), str (UTF-8) or int (8 bytes, little-endian, two's
complement); what comes back is bytes, with as_int() and as_str() to turn
it back. Errors raise StashError, which carries the code, stash_strerror()'s
words and stash_errmsg()'s detail. docs/python.md describes the module.
"""

import ctypes
import ctypes.util
import functools
import os
import threading
import weakref
from collections import namedtuple

__all__ = [
    "StashError", "NotFound", "Stale", "Closed", "WrongThread", "Arena", "Worker", "Reader",
    "Service", "View", "Batch", "Timers", "Event", "as_int", "as_str", "to_bytes",
    "key_group", "kg_range", "version", "strerror", "Snapshot", "SnapshotWriter", "Entry",
]

# ---- the library --------------------------------------------------------


def _load():
    """libstash: $STASH_LIBRARY, else the one installed with this package,
    else the loader's search."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("STASH_LIBRARY")]
    try:
        from stash._installed import LIBRARY
        candidates.append(os.path.join(here, LIBRARY))
    except ImportError:  # the source tree's package: no install beside it
        pass
    candidates.append(ctypes.util.find_library("stash"))
    candidates.append("libstash.so.0")
    errors = []
    for c in candidates:
        if not c:
            continue
        if os.sep in c and not os.path.exists(c):
            continue
        try:
            # Global: the C data path (_stash) links the same library.
            return ctypes.CDLL(c, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            errors.append(str(e))
    raise ImportError("stash: cannot load libstash.so (set STASH_LIBRARY): " +
                      "; ".join(errors))


_lib = _load()

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
    _fields_ = [("sz", ctypes.c_size_t), ("index", ctypes.c_uint32), ("parallelism", ctypes.c_uint32),
                ("arena", ctypes.POINTER(_ArenaOpts)), ("clock", _CLOCK),
                ("clock_ctx", ctypes.c_void_p), ("rollback", ctypes.c_int),
                ("on_cut", _CUT), ("cut_ctx", ctypes.c_void_p)]


class _ReaderOpts(_Sized):
    _fields_ = [("sz", ctypes.c_size_t), ("arena", ctypes.POINTER(_ArenaOpts)), ("clock", _CLOCK),
                ("clock_ctx", ctypes.c_void_p), ("at_checkpoint", ctypes.c_int),
                ("checkpoint_dir", ctypes.c_char_p)]


class _Ttl(ctypes.Structure):
    _fields_ = [("ttl_ms", ctypes.c_uint64), ("update", ctypes.c_int),
                ("visibility", ctypes.c_int), ("cleanup_entries", ctypes.c_uint32),
                ("cleanup_every_record", ctypes.c_int), ("cleanup_full_snapshot", ctypes.c_int),
                ("time", ctypes.c_int)]


class _AggregateFns(_Sized):
    _fields_ = [("sz", ctypes.c_size_t), ("create", _PRODUCE), ("add", _COMBINE), ("result", _PRODUCE),
                ("merge", _COMBINE)]


class _StateDesc(_Sized):
    _fields_ = [("sz", ctypes.c_size_t), ("name", ctypes.c_char_p), ("kind", ctypes.c_int), ("ttl", _Ttl),
                ("reduce", _COMBINE), ("aggregate", ctypes.POINTER(_AggregateFns)),
                ("ctx", ctypes.c_void_p), ("default_value", _Bytes)]


class _Event(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("checkpoint_id", ctypes.c_uint64),
                ("detail", ctypes.c_char_p)]


class _CheckpointInfo(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("status", ctypes.c_int), ("incremental", ctypes.c_int),
                ("savepoint", ctypes.c_int), ("started_ns", ctypes.c_uint64),
                ("duration_ns", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("pause_ns", ctypes.c_uint64), ("detail", ctypes.c_char * 256)]


class _ServiceOpts(_Sized):
    _fields_ = [("sz", ctypes.c_size_t), ("arena", ctypes.POINTER(_ArenaOpts)), ("storage", ctypes.c_int),
                ("dir", ctypes.c_char_p), ("memory_cap", ctypes.c_uint64),
                ("interval_ms", ctypes.c_uint64), ("min_pause_ms", ctypes.c_uint64),
                ("timeout_ms", ctypes.c_uint64), ("retain", ctypes.c_uint32),
                ("incremental", ctypes.c_int), ("full_every", ctypes.c_uint32),
                ("lz4", ctypes.c_int), ("restore", ctypes.c_char_p),
                ("start_empty", ctypes.c_int), ("lazy_restore", ctypes.c_int),
                ("log", _LOG), ("log_ctx", ctypes.c_void_p),
                ("log_record", _LOG_RECORD), ("pool", ctypes.c_char_p),
                ("ceph_conf", ctypes.c_char_p), ("ceph_id", ctypes.c_char_p),
                ("job", ctypes.c_char_p), ("ceph_timeout_ms", ctypes.c_uint32),
                ("host", ctypes.c_char_p), ("workers", ctypes.c_char_p),
                ("job_parallelism", ctypes.c_uint32), ("lease_ms", ctypes.c_uint32)]


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


class _KgRange(ctypes.Structure):
    _fields_ = [("first", ctypes.c_uint32), ("last", ctypes.c_uint32)]


class _WorkerInfo(ctypes.Structure):
    _fields_ = [("index", ctypes.c_uint32), ("parallelism", ctypes.c_uint32),
                ("pid", ctypes.c_int32), ("state", ctypes.c_int), ("range", _KgRange),
                ("joined_ns", ctypes.c_uint64), ("heartbeat_ns", ctypes.c_uint64),
                ("generation", ctypes.c_uint32), ("previous_pid", ctypes.c_int32)]


class _BatchOpts(_Sized):
    _fields_ = [("sz", ctypes.c_size_t), ("capacity", ctypes.c_uint32), ("states", ctypes.POINTER(ctypes.c_void_p)),
                ("nstates", ctypes.c_uint32)]


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
    _fields_ = [("sz", ctypes.c_size_t), ("max_parallelism", ctypes.c_uint32), ("id", ctypes.c_uint64),
                ("changes", ctypes.POINTER(_SnapshotChange)), ("nchanges", ctypes.c_uint32),
                ("progress", _PROGRESS), ("progress_ctx", ctypes.c_void_p)]


class _WriterOpts(_Sized):
    _fields_ = [("sz", ctypes.c_size_t), ("max_parallelism", ctypes.c_uint32), ("size", ctypes.c_uint64),
                ("id", ctypes.c_uint64), ("op_parallelism", ctypes.c_uint32)]


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
for _name, (_res, _args) in _SIGNATURES.items():
    _fn = getattr(_lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args

# ---- constants ----------------------------------------------------------

VALUE, LIST, MAP, REDUCING, AGGREGATING = 1, 2, 3, 4, 5
OP_LIST, OP_UNION, OP_BROADCAST, TIMERS = 6, 7, 8, 9
HEAP, LMDB = 0, 1
EVENT_TIME, PROCESSING_TIME = 0, 1
CHECKPOINT_COMPLETE, CHECKPOINT_ABORTED, ROLLED_BACK = 1, 2, 3
TTL_ON_CREATE_AND_WRITE, TTL_ON_READ_AND_WRITE = 0, 1
TTL_NEVER_RETURN_EXPIRED, TTL_RETURN_EXPIRED_IF_NOT_CLEANED = 0, 1
STORAGE_FS, STORAGE_MEMORY, STORAGE_RADOS = 0, 1, 2

_MANY = 64  # keys a batch of the many-key calls takes at a time

ENOTFOUND, EKEYGROUP, EKIND, ESTALE, ENOKEY, EABORTED, EFENCED = (
    -1008, -1009, -1010, -1011, -1012, -1016, -1018)

# ---- errors -------------------------------------------------------------


class StashError(Exception):
    """A failed call: code (negative, as stash.h returns it), words
    (stash_strerror) and detail (stash_errmsg: the file, key group or
    worker concerned)."""

    def __init__(self, code, detail=None, call=None):
        self.code = code
        self.words = strerror(code)
        self.detail = _errmsg() if detail is None else detail
        self.call = call
        where = f"{call}: " if call else ""
        more = f" ({self.detail})" if self.detail else ""
        super().__init__(f"{where}{self.words}{more}")


class NotFound(StashError, KeyError):
    """STASH_ENOTFOUND where a lookup cannot answer None."""

    __str__ = Exception.__str__


class Stale(StashError):
    """A view or iterator used after the worker's next call moved what it
    showed (STASH_ESTALE)."""


class Closed(StashError, ValueError):
    """A call on a closed handle, or on what it gave out (a state, an
    iterator, a view, a batch, timers): a ValueError, as Python's files
    raise after close."""

    def __init__(self, detail, call=None):
        super().__init__(-22, detail, call)

    def __str__(self):
        return f"{self.call}: {self.detail}" if self.call else self.detail


class WrongThread(StashError, RuntimeError):
    """A call on a worker or reader from a thread other than the one that
    holds it: a stash_worker is used by one thread at a time."""

    def __init__(self, detail, call=None):
        super().__init__(-16, detail, call)

    __str__ = Closed.__str__


def strerror(code):
    """Words for an error code."""
    return _lib.stash_strerror(code).decode()


def _errmsg():
    return _lib.stash_errmsg().decode(errors="replace")


def _check(rc, call, owner=None):
    """rc if it is no error, else raises: the exception a Python callback
    raised during the call first, then StashError."""
    if owner is not None and owner._raised is not None:
        e, owner._raised = owner._raised, None
        raise e
    if rc < 0:
        cls = NotFound if rc == ENOTFOUND else Stale if rc == ESTALE else StashError
        raise cls(rc, call=call)
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
    _fast.setup(StashError, NotFound, Stale, _claim)
    _Handle = _fast.Handle
except ImportError:  # the module without its C data path: ctypes alone
    _fast = None
    _Handle = _Owned


def version():
    """The version of the libstash loaded, "MAJOR.MINOR.PATCH"."""
    return _lib.stash_version().decode()

# ---- bytes --------------------------------------------------------------


def to_bytes(x):
    """bytes of a key, namespace or value: bytes-like as is, str as UTF-8,
    int as 8 bytes little-endian (two's complement)."""
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
    """The int of up to 8 little-endian bytes (None stays None)."""
    return None if b is None else int.from_bytes(bytes(b), "little", signed=signed)


def as_str(b):
    """The str of UTF-8 bytes (None stays None)."""
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


def key_group(key, max_parallelism=128):
    """The key group of key (Flink's formula over XXH3)."""
    k = to_bytes(key)
    kg = _lib.stash_key_group(k, len(k), max_parallelism)
    if kg == 0xFFFFFFFF:
        raise StashError(-22, f"max_parallelism {max_parallelism} out of range", "key_group")
    return kg


def kg_range(max_parallelism, parallelism, index):
    """The (first, last) key groups worker index of parallelism owns."""
    r = _KgRange()
    _check(_lib.stash_kg_range_of(max_parallelism, parallelism, index, ctypes.byref(r)),
           "kg_range")
    return (r.first, r.last)

# ---- arenas and the service ---------------------------------------------


def _arena_opts(path=None, size=0, max_parallelism=0, backend=HEAP, lmdb_dir=None, flags=0):
    return _ArenaOpts(path.encode() if path else None, size, max_parallelism, flags, backend,
                      lmdb_dir.encode() if lmdb_dir else None)


def _checkpoint_dict(ci):
    return {"id": ci.id, "status": ci.status, "incremental": bool(ci.incremental),
            "savepoint": bool(ci.savepoint), "started_ns": ci.started_ns,
            "duration_ns": ci.duration_ns, "bytes": ci.bytes, "pause_ns": ci.pause_ns,
            "detail": ci.detail.decode(errors="replace")}


class Arena:
    """A mapped arena: Arena.create(...) or Arena.open(name); any thread may
    call it, and close() waits for the calls in flight."""

    def __init__(self, handle, name):
        self._g = handle if isinstance(handle, _Borrowed) else _Shared(
            handle.value, f"arena {name!r}", _lib.stash_arena_close)
        self.name = name

    @classmethod
    def create(cls, name, size=0, max_parallelism=0, backend=HEAP, path=None, lmdb_dir=None,
               replace=False, group=False):
        o = _arena_opts(path, size, max_parallelism, backend, lmdb_dir,
                        (1 if replace else 0) | (2 if group else 0))
        h = ctypes.c_void_p()
        _check(_lib.stash_arena_create(name.encode(), ctypes.byref(o), ctypes.byref(h)),
               "Arena.create")
        return cls(h, name)

    @classmethod
    def open(cls, name, path=None):
        o = _arena_opts(path)
        h = ctypes.c_void_p()
        _check(_lib.stash_arena_open(name.encode(), ctypes.byref(o), ctypes.byref(h)),
               "Arena.open")
        return cls(h, name)

    @staticmethod
    def destroy(name, path=None):
        """Removes the arena's file (absent: no error)."""
        o = _arena_opts(path)
        rc = _lib.stash_arena_destroy(name.encode(), ctypes.byref(o))
        if rc != -2:
            _check(rc, "Arena.destroy")

    def close(self):
        self._g.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def info(self):
        i = _ArenaInfo()
        _check(self._g.call("Arena.info", _lib.stash_arena_info_get, ctypes.byref(i)),
               "Arena.info")
        return {"path": i.path.decode(), "size": i.size, "data_bytes": i.data_bytes,
                "pool_free_bytes": i.pool_free_bytes, "max_parallelism": i.max_parallelism,
                "backend": "lmdb" if i.backend == LMDB else "heap",
                "lmdb_dir": i.lmdb_dir.decode(), "page_size": i.page_size}

    def checkpoint(self, timeout_ms=0):
        """Takes a checkpoint and waits for it: its facts as a dict."""
        ci = _CheckpointInfo()
        rc = self._g.call("checkpoint", _lib.stash_checkpoint, timeout_ms, ctypes.byref(ci))
        if rc == EABORTED:
            raise StashError(rc, ci.detail.decode(errors="replace"), "checkpoint")
        _check(rc, "checkpoint")
        return _checkpoint_dict(ci)

    def savepoint(self, timeout_ms=0):
        """Takes a savepoint (DIR/savepoint-ID) and waits for it."""
        ci = _CheckpointInfo()
        rc = self._g.call("savepoint", _lib.stash_savepoint, timeout_ms, ctypes.byref(ci))
        if rc == EABORTED:
            raise StashError(rc, ci.detail.decode(errors="replace"), "savepoint")
        _check(rc, "savepoint")
        return _checkpoint_dict(ci)

    def status(self):
        """What the control block says of the service and recent checkpoints."""
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
        """The state operations of worker index so far (stash_op_counts_get), as a
        dict: value_reads, value_writes, list_..., map_..., merging_..., rollbacks."""
        c = _OpCounts()
        _check(self._g.call("op_counts", _lib.stash_op_counts_get, index, ctypes.byref(c)),
               "op_counts")
        return {n: getattr(c, n) for n in _OP_COUNTS}

    def request_stop(self, timeout_ms=0):
        """Asks the service serving the arena to stop and waits for it."""
        _check(self._g.call("request_stop", _lib.stash_service_request_stop, timeout_ms),
               "request_stop")

    def stop_with_savepoint(self, timeout_ms=0):
        """Takes a savepoint and stops the service once it is complete (on a
        job's host: a savepoint of the whole job, and every host stops)."""
        ci = _CheckpointInfo()
        rc = self._g.call("stop_with_savepoint", _lib.stash_stop_with_savepoint, timeout_ms,
                          ctypes.byref(ci))
        if rc == EABORTED:
            raise StashError(rc, ci.detail.decode(errors="replace"), "stop_with_savepoint")
        _check(rc, "stop_with_savepoint")
        return _checkpoint_dict(ci)


LogRecord = namedtuple("LogRecord", "time_ns level subject message")
LOG_INFO, LOG_WARN, LOG_ERROR = 0, 1, 2


class Service:
    """The persistence engine of an arena, in a thread of this process
    (stash_service_start): Service(name, dir=..., interval_ms=..., ...);
    with storage=STORAGE_RADOS and host=, workers=, job_parallelism= it is
    one host of a job that spans hosts.
    log(line) receives each event as a line, log_record(LogRecord) as a
    record (time_ns, level, subject, message)."""

    def __init__(self, name, dir=None, storage=STORAGE_FS, interval_ms=0, min_pause_ms=0,
                 timeout_ms=0, retain=0, incremental=False, full_every=0, lz4=False,
                 restore=None, start_empty=False, memory_cap=0, size=0, max_parallelism=0,
                 backend=HEAP, path=None, lmdb_dir=None, log=None, log_record=None, pool=None,
                 ceph_conf=None, ceph_id=None, job=None, ceph_timeout_ms=0, host=None,
                 workers=None, job_parallelism=0, lease_ms=0, lazy_restore=False):
        self._ao = _arena_opts(path, size, max_parallelism, backend, lmdb_dir)
        self._log = _LOG(lambda ctx, line: log(line.decode(errors="replace"))) if log else _LOG()

        def record(ctx, r):
            c = r.contents
            log_record(LogRecord(c.time_ns, c.level, c.subject.decode(errors="replace"),
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
                         workers.encode() if workers else None, job_parallelism, lease_ms)
        h = ctypes.c_void_p()
        _check(_lib.stash_service_start(name.encode(), ctypes.byref(o), ctypes.byref(h)),
               "Service")
        self._g = _Shared(h.value, f"service of {name!r}", _lib.stash_service_stop)

    def stop(self):
        """Lets the checkpoint in flight finish and stops the engine (once;
        from any thread, after the calls in flight)."""
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


class View:
    """Bytes in the arena, without a copy: valid until the next call on the
    worker that read them (a write, a read, a key set, a barrier); used
    after, it raises Stale rather than show memory that may have moved, and
    once the worker is closed, Closed. It exports no buffer (memoryview()
    of it raises TypeError): every read through it is checked first, so
    nothing handed out can outlive the worker's memory."""

    __slots__ = ("_owner", "_gen", "_fast_gen", "_data", "_len")

    def __init__(self, owner, b):
        self._owner, self._gen = owner, owner._gen
        self._fast_gen = _fast.generation() if _fast else 0
        self._data, self._len = b.data, b.len

    def _valid(self):
        self._owner._handle.get("View")
        # The C data path's calls are counted there, not on the worker.
        if (self._owner._gen != self._gen or
                (_fast and _fast.generation() != self._fast_gen)):
            raise Stale(ESTALE, "a view used after the worker's next call", "View")

    def tobytes(self):
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
Timer = namedtuple("Timer", "domain timestamp key ns")

# ---- state --------------------------------------------------------------


def _combine_fn(owner, f):
    """A C combining function over f(acc or None, value) -> bytes."""
    def call(acc, value, out, cap, length, ctx):
        try:
            a = _copy(acc.contents) if acc and acc.contents.len else None
            r = to_bytes(owner._callback(f, a, _copy(value.contents)))
            length[0] = len(r)
            if cap < len(r):
                return -28  # -ENOSPC: called again with room
            ctypes.memmove(out, r, len(r))
            return 0
        except BaseException as e:  # carried across C, raised when the call returns
            owner._raised = e
            return -125  # -ECANCELED
    return _COMBINE(call)


def _produce_fn(owner, f, with_acc):
    def call(acc, out, cap, length, ctx):
        try:
            a = _copy(acc.contents) if with_acc and acc else None
            r = to_bytes(owner._callback(f, a) if with_acc else owner._callback(f))
            length[0] = len(r)
            if cap < len(r):
                return -28
            ctypes.memmove(out, r, len(r))
            return 0
        except BaseException as e:
            owner._raised = e
            return -125
    return _PRODUCE(call)


class _State:
    kind = 0

    def __init__(self, worker, handle, name, keep):
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
        if rc == ENOTFOUND:
            return default
        _check(rc, self.name, w)
        return _copy(b)

    def namespace(self, ns):
        """Sets the namespace of this state's accesses (None: the empty one)."""
        n = to_bytes(ns)
        self._call(_lib.stash_state_namespace, n, len(n))
        return self

    def clear(self):
        """Removes the current key's entry in the current namespace."""
        self._call(_lib.stash_state_clear)

    def keys(self, ns=None, key_group=None):
        """The keys of the worker's key groups (or of key_group: a reader's
        any), in namespace ns, or (key, namespace) pairs of all with ns None."""
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
    kind = VALUE

    def get(self, default=None):
        """The current key's value (a copy), or the state's default, or default."""
        return self._lookup(_lib.stash_value_get, default)

    def view(self):
        """The current key's value as a View (no copy), or None."""
        b = _Bytes()
        w = self._w
        w._handle.get(self.name)
        w._gen += 1
        rc = _lib.stash_value_get(self._h, ctypes.byref(b))
        if rc == ENOTFOUND:
            return None
        _check(rc, self.name, w)
        return View(w, b)

    def put(self, value):
        """Stores a copy of value; None clears."""
        if value is None:
            return self._call(_lib.stash_value_put, None, 0)
        v = to_bytes(value)
        self._call(_lib.stash_value_put, v, len(v))

    # One call for a key and its value: the key becomes the worker's
    # current key, as w.key(key) would make it. Through the C data path
    # where it is built, else through ctypes.

    if _fast:
        def __init__(self, worker, handle, name, keep):
            super().__init__(worker, handle, name, keep)
            # read and write are the C calls themselves, bound to the
            # handles: a Python method around them would cost more than
            # the access (they count their calls for views themselves, and
            # check the worker's handle as every call does).
            self.read = functools.partial(_fast.value_get, worker._handle, self._sh)
            self.write = functools.partial(_fast.value_put, worker._handle, self._sh)

        def read(self, key):
            """The value of key (a copy), or None."""
            return _fast.value_get(self._w._handle, self._sh, key)

        def write(self, key, value):
            """Stores value for key (None clears)."""
            _fast.value_put(self._w._handle, self._sh, key, value)

        def read_many(self, keys):
            """The value of each key (None if none), in one call: the keys
            run as batches of the worker's, their entries fetched ahead."""
            w = self._w
            w._gen += 1
            return _fast.values_get(w._handle, self._batch(), _MANY, self._sh, keys)

        def write_many(self, keys, values):
            """Stores values[i] for keys[i], in one call, as read_many
            reads; the last key stays current."""
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
            self._w.key(key)
            return self.get()

        def write(self, key, value):
            self._w.key(key)
            self.put(value)

        def read_many(self, keys):
            return [self.read(k) for k in keys]

        def write_many(self, keys, values):
            keys, values = list(keys), list(values)
            if len(keys) != len(values):
                raise ValueError("as many values as keys")
            for k, v in zip(keys, values):
                self.write(k, v)


class ListState(_State):
    kind = LIST

    def get(self):
        """The current key's elements, a list of bytes ([] if none)."""
        it = _Iter()
        w = self._w
        w._handle.get(self.name)
        w._gen += 1
        rc = _lib.stash_list_get(self._h, ctypes.byref(it))
        if rc == ENOTFOUND:
            return []
        _check(rc, self.name, w)
        return list(_iterate(w, it, lambda k, v: _copy(v)))

    def add(self, value):
        v = to_bytes(value)
        self._call(_lib.stash_list_add, v, len(v))

    def add_all(self, values):
        arr, keep, n = _array(values)
        self._call(_lib.stash_list_add_all, arr, n)

    def update(self, values):
        """Replaces the list; an empty one deletes it."""
        arr, keep, n = _array(values)
        self._call(_lib.stash_list_update, arr, n)

    def merge_namespaces(self, target, sources):
        _merge(self, target, sources)


def _merge(state, target, sources):
    t = to_bytes(target)
    arr, keep, n = _array(sources)
    state._call(_lib.stash_merge_namespaces, t, len(t), arr, n)


class MapState(_State):
    kind = MAP

    def get(self, k, default=None):
        kb = to_bytes(k)
        return self._lookup(_lib.stash_map_get, default, kb, len(kb))

    def put(self, k, value):
        kb, v = to_bytes(k), to_bytes(value)
        self._call(_lib.stash_map_put, kb, len(kb), v, len(v))

    def put_all(self, entries):
        """Puts every (key, value) of a dict or of pairs."""
        pairs = list(entries.items() if hasattr(entries, "items") else entries)
        ka, kk, n = _array(p[0] for p in pairs)
        va, vk, _ = _array(p[1] for p in pairs)
        self._call(_lib.stash_map_put_all, ka, va, n)

    def remove(self, k):
        kb = to_bytes(k)
        self._call(_lib.stash_map_remove, kb, len(kb))

    def __contains__(self, k):
        kb = to_bytes(k)
        return self._call(_lib.stash_map_contains, kb, len(kb)) == 1

    def is_empty(self):
        return self._call(_lib.stash_map_is_empty) == 1

    def items(self):
        """An iterator of (key, value) pairs of the current key's map."""
        it = _Iter()
        w = self._w
        w._handle.get(self.name)
        w._gen += 1
        rc = _lib.stash_map_iter(self._h, ctypes.byref(it))
        if rc == ENOTFOUND:
            return iter(())
        _check(rc, self.name, w)
        return _iterate(w, it, lambda k, v: (_copy(k), _copy(v)))

    def to_dict(self):
        return dict(self.items())


class _MergingState(_State):
    def add(self, value):
        v = to_bytes(value)
        self._call(_lib.stash_merging_add, v, len(v))

    def get(self, default=None):
        return self._lookup(_lib.stash_merging_get, default)

    def merge_namespaces(self, target, sources):
        _merge(self, target, sources)


class ReducingState(_MergingState):
    kind = REDUCING


class AggregatingState(_MergingState):
    kind = AGGREGATING


class OpListState(_State):
    """Operator list state (kind OP_LIST or OP_UNION)."""
    kind = OP_LIST

    def get(self):
        p, n = _BytesP(), ctypes.c_size_t()
        self._call(_lib.stash_op_list_get, ctypes.byref(p), ctypes.byref(n))
        return [_copy(p[i]) for i in range(n.value)]

    def add(self, value):
        v = to_bytes(value)
        self._call(_lib.stash_op_list_add, v, len(v))

    def update(self, values):
        arr, keep, n = _array(values)
        self._call(_lib.stash_op_list_update, arr, n)


class BroadcastState(_State):
    kind = OP_BROADCAST

    def get(self, k, default=None):
        kb = to_bytes(k)
        return self._lookup(_lib.stash_broadcast_get, default, kb, len(kb))

    def put(self, k, value):
        kb, v = to_bytes(k), to_bytes(value)
        self._call(_lib.stash_broadcast_put, kb, len(kb), v, len(v))

    def remove(self, k):
        kb = to_bytes(k)
        self._call(_lib.stash_broadcast_remove, kb, len(kb))

    def to_dict(self):
        ks, vs, n = _BytesP(), _BytesP(), ctypes.c_size_t()
        self._call(_lib.stash_broadcast_entries, ctypes.byref(ks), ctypes.byref(vs),
                   ctypes.byref(n))
        return {_copy(ks[i]): _copy(vs[i]) for i in range(n.value)}


_CLASSES = {VALUE: ValueState, LIST: ListState, MAP: MapState, REDUCING: ReducingState,
            AGGREGATING: AggregatingState, OP_LIST: OpListState, OP_UNION: OpListState,
            OP_BROADCAST: BroadcastState}

# ---- workers and readers ------------------------------------------------


class Worker:
    """A worker process's handle: Worker(name, index=0, parallelism=1, ...).
    clock() -> milliseconds for TTL; on_cut(worker, checkpoint_id) is
    called at each cut before the state is cut. It is used by one thread
    at a time: the one that opened it, until hand_over() or that thread's
    end; a call from another raises WrongThread."""

    def __init__(self, name, index=0, parallelism=1, rollback=False, path=None, clock=None,
                 on_cut=None, _reader=None):
        self._gen = 0
        self._raised = None
        self._inside = 0  # Python callbacks running inside a call of the worker's
        self._states = {}
        self._batches = set()
        self._ao = _arena_opts(path)
        self._clock = _CLOCK(lambda ctx: int(self._callback(clock))) if clock else _CLOCK()
        self.name = name
        h = ctypes.c_void_p()
        if _reader is not None:
            at, cdir = _reader
            o = _ReaderOpts(ctypes.pointer(self._ao) if path else None, self._clock, None,
                            int(at), cdir.encode() if cdir else None)
            rc = _lib.stash_reader_open(name.encode() if name else None, ctypes.byref(o),
                                        ctypes.byref(h))
            _check(rc, "Reader")
            label = f"reader of {name or cdir!r}"
        else:
            def cut(worker, checkpoint_id, ctx):
                try:
                    r = self._callback(on_cut, self, checkpoint_id)
                    return int(r) if r else 0
                except BaseException as e:
                    self._raised = e
                    return -125
            self._cut = _CUT(cut) if on_cut else _CUT()
            o = _WorkerOpts(index, parallelism, ctypes.pointer(self._ao) if path else None,
                            self._clock, None, int(rollback), self._cut, None)
            _check(_lib.stash_worker_open(name.encode(), ctypes.byref(o), ctypes.byref(h)),
                   "Worker")
            label = f"worker {name!r} (index {index} of {parallelism or 1})"
        self._handle = _Handle(h.value, label, _here())

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
            raise StashError(-16, f"{self._handle.label}: {call} inside a callback of one of "
                             "its own calls (it returns first)", call)

    def close(self):
        """Leaves the registry (after recording operator state) and detaches;
        every state, iterator, view, batch and timer service it gave out
        raises Closed from now on. Closing again does nothing."""
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
        return Arena(_Borrowed(self, _lib.stash_worker_arena(self._live("arena"))), self.name)

    def info(self):
        i = _WorkerInfo()
        _check(_lib.stash_worker_info_get(self._live("info"), ctypes.byref(i)), "info")
        return {"index": i.index, "parallelism": i.parallelism, "pid": i.pid,
                "range": (i.range.first, i.range.last), "generation": i.generation,
                "previous_pid": i.previous_pid}

    def state(self, name, kind=VALUE, ttl_ms=0, ttl_update=TTL_ON_CREATE_AND_WRITE,
              ttl_visibility=TTL_NEVER_RETURN_EXPIRED, reduce=None, create=None, add=None,
              result=None, merge=None, default=None):
        """The worker's handle on state name, registered if need be: reduce
        is f(acc or None, value) -> bytes; an aggregating state takes
        create() -> acc, add(acc, value) -> acc, result(acc) -> bytes and
        merge(acc, acc) -> acc."""
        self._live(name)
        got = self._states.get(name)
        if got is not None and got.kind == kind:
            return got
        d = _StateDesc()
        d.name, d.kind = name.encode(), kind
        d.ttl.ttl_ms, d.ttl.update, d.ttl.visibility = ttl_ms, ttl_update, ttl_visibility
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
        s = _CLASSES[d.kind](self, h, d.name.decode(), keep)
        self._states[s.name] = s
        return s

    def key(self, key):
        """Sets the current key: every access until the next call uses it."""
        k = to_bytes(key)
        self._gen += 1
        _check(_lib.stash_key_set(self._handle.get("key"), k, len(k)), "key")
        return self

    def key_group(self):
        """The key group of the current key."""
        return _check(_lib.stash_key_group_current(self._live("key_group")), "key_group")

    def barrier(self):
        """Call between records: cuts a requested checkpoint; returns an
        Event (kind, checkpoint_id, detail) when one completed, aborted or a
        rollback restored one, else None."""
        e = _Event()
        self._gen += 1
        rc = _check(_lib.stash_barrier(self._handle.get("barrier"), ctypes.byref(e)), "barrier",
                    self)
        if rc == 0:
            return None
        return Event(e.kind, e.checkpoint_id, e.detail.decode(errors="replace"))

    def timers(self, name):
        """The worker's timer service called name."""
        h = ctypes.c_void_p()
        _check(_lib.stash_timers_get(self._live(name), name.encode(), ctypes.byref(h)), name)
        return Timers(self, h, name)

    def batch(self, capacity=0, states=None):
        """A Batch of this worker's, fetching ahead the entries of states
        (default: every keyed state registered, the first 8)."""
        return Batch(self, capacity, states)


class Reader(Worker):
    """A reader of arena name: no worker slot, no key group, no barrier; it
    reads any key of any key group, never blocking a worker or a checkpoint.
    at_checkpoint reads as of the newest complete checkpoint; checkpoint_dir
    reads a checkpoint or savepoint directory without an arena (name None)."""

    def __init__(self, name=None, at_checkpoint=False, checkpoint_dir=None, path=None,
                 clock=None):
        super().__init__(name, path=path, clock=clock, _reader=(at_checkpoint, checkpoint_dir))

    def state(self, name, **kw):
        """The handle on state name as workers registered it (its kind and
        TTL from the arena's catalog); an aggregating state without result
        shows its accumulator."""
        arena = _lib.stash_worker_arena(self._live(name))
        got = self._states.get(name)
        if got is not None:
            return got
        d = _StateDesc()
        _check(_lib.stash_state_describe(arena, name.encode(), ctypes.byref(d)), name)
        d.name = name.encode()
        if d.kind == REDUCING and "reduce" not in kw:
            kw["reduce"] = lambda acc, v: v
        if d.kind == AGGREGATING:
            kw.setdefault("create", lambda: b"")
            kw.setdefault("add", lambda acc, v: v)
            kw.setdefault("result", lambda acc: acc)
        return self._register(d, kw.get("reduce"), kw.get("create"), kw.get("add"),
                              kw.get("result"), kw.get("merge"), kw.get("default"))

# ---- batches and timers -------------------------------------------------


class Batch:
    """Events of many keys, their state fetched ahead, then run in order:
    add(key, event) each, then run(fn) calls fn(event) with the event's key
    current and returns the events' results (0 or a negative error; fn's
    exceptions are raised once the batch has run)."""

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
        """Queues event for key; False if the batch is full."""
        k = to_bytes(key)
        rc = _lib.stash_batch_add(self._live("Batch.add"), k, len(k), len(self._events))
        if rc == -28:
            return False
        _check(rc, "Batch.add")
        self._events.append(event)
        return True

    def __len__(self):
        return _lib.stash_batch_size(self._live("len"))

    def run(self, fn):
        h = self._live("Batch.run")
        events, self._events = self._events, []
        w = self._w

        def call(worker, ev, ctx):
            if w._raised is not None:
                return -125
            try:
                r = w._callback(fn, events[ev or 0])
                return int(r) if r else 0
            except BaseException as e:
                w._raised = e
                return -125
        results = (ctypes.c_int * max(len(events), 1))()
        w._gen += 1
        _check(_lib.stash_batch_run(h, _BATCH_FN(call), None, results), "Batch.run", w)
        return list(results[:len(events)])

    def _free(self):
        if self._h is not None:
            _lib.stash_batch_destroy(self._h)
            self._h = None
            self._w._batches.discard(self)

    def close(self):
        """Frees the batch (closing again, or after the worker, does nothing)."""
        if self._h is not None:
            self._w._live("Batch.close")
            self._free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Timers:
    """A timer service of a worker (Flink's InternalTimerService)."""

    def __init__(self, worker, handle, name):
        self._w, self._h, self.name = worker, handle, name

    def _live(self):
        """The timer service's handle, its worker checked first."""
        self._w._live(self.name)
        self._w._gen += 1
        return self._h

    def register(self, timestamp, ns=b"", domain=EVENT_TIME):
        """A timer for the current key in namespace ns at timestamp."""
        n = to_bytes(ns)
        _check(_lib.stash_timer_register(self._live(), domain, n, len(n), timestamp), self.name)

    def delete(self, timestamp, ns=b"", domain=EVENT_TIME):
        n = to_bytes(ns)
        _check(_lib.stash_timer_delete(self._live(), domain, n, len(n), timestamp), self.name)

    def _fire(self, fn):
        w = self._w

        def call(t, ctx):
            try:
                tm = t.contents
                r = w._callback(fn, Timer(tm.domain, tm.timestamp, _copy(tm.key), _copy(tm.ns)))
                return int(r) if r else 0
            except BaseException as e:
                w._raised = e
                return -125
        return _TIMER_FN(call)

    def advance(self, watermark, fn):
        """Raises the watermark and calls fn(timer) for each timer due, in
        order, its key current. Returns how many fired."""
        return _check(_lib.stash_timers_advance(self._live(), watermark, self._fire(fn), None),
                      self.name, self._w)

    def poll(self, fn):
        """Fires the processing-time timers due by the worker's clock."""
        return _check(_lib.stash_timers_poll(self._live(), self._fire(fn), None), self.name,
                      self._w)

    @property
    def watermark(self):
        self._w._live(self.name)
        return _lib.stash_timers_watermark(self._h)

    def timers(self, key_group=-1):
        """The timers of an owned key group, or with -1 of the current key."""
        it, t = _Iter(), _Timer()
        _check(_lib.stash_timers_iter(self._live(), key_group, ctypes.byref(it)), self.name)
        out = []
        while _check(_lib.stash_timers_next(ctypes.byref(it), ctypes.byref(t)), self.name) == 1:
            out.append(Timer(t.domain, t.timestamp, _copy(t.key), _copy(t.ns)))
        return out


# ---- snapshots offline --------------------------------------------------

Entry = namedtuple("Entry", "kg state kind key ns map_key value index ttl_ms domain timestamp "
                            "worker")
Entry.__doc__ = """One entry of a snapshot: a value (or accumulator), a list element
(index), a map entry (map_key), a timer (domain, timestamp), or an
operator-state entry of a worker; ttl_ms is when a TTL state's entry was
written (0 without TTL)."""


def _entry(e):
    return Entry(e.kg, e.state.decode(), e.kind, _copy(e.key), _copy(e.ns), _copy(e.map_key),
                 _copy(e.value), e.index, e.ttl_ms, e.domain, e.timestamp, e.worker)


def _snapshot_info(i):
    return {"id": i.id, "created_ns": i.created_ns, "base_id": i.base_id,
            "max_parallelism": i.max_parallelism, "states": i.nstates,
            "op_parallelism": i.op_parallelism, "data_bytes": i.data_bytes}


def _ttl_of(ttl_ms, update, visibility):
    t = _Ttl()
    t.ttl_ms, t.update, t.visibility = ttl_ms, update, visibility
    return t


class Snapshot:
    """A checkpoint or savepoint directory read offline, without an arena
    (Flink's State Processor API reading a savepoint): its states, its
    keyed entries decoded and its operator state; rewrite() writes it anew
    with changes. Any thread may call it, one call at a time; close()
    waits for the call in flight."""

    def __init__(self, path):
        h = ctypes.c_void_p()
        _check(_lib.stash_snapshot_open(os.fsencode(path), ctypes.byref(h)), str(path))
        self.path = str(path)
        self._g = _Shared(h.value, f"snapshot {self.path!r}", _lib.stash_snapshot_close,
                          serial=True)

    def close(self):
        self._g.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def info(self):
        i = _SnapshotInfo()
        _check(self._g.call("info", _lib.stash_snapshot_info_get, ctypes.byref(i)), "info")
        return _snapshot_info(i)

    def states(self):
        """Each state: name, kind and TTL setting."""
        out = []
        for i in range(self.info()["states"]):
            d = _StateDesc()
            _check(self._g.call("states", _lib.stash_snapshot_state, i, ctypes.byref(d)),
                   "states")
            out.append({"name": d.name.decode(), "kind": d.kind, "ttl_ms": d.ttl.ttl_ms,
                        "ttl_update": d.ttl.update, "ttl_visibility": d.ttl.visibility})
        return out

    def _collect(self, scan):
        got = []

        def take(ctx, e):
            got.append(_entry(e.contents))
            return 0
        _check(scan(_SNAPSHOT_FN(take)), "scan")
        return got

    def entries(self, first=0, last=None):
        """The keyed entries of key groups first..last (all by default), as
        of the snapshot, one key group's at a time."""
        if last is None:
            last = self.info()["max_parallelism"] - 1
        for kg in range(first, last + 1):
            yield from self._collect(lambda fn, kg=kg: self._g.call(
                "entries", _lib.stash_snapshot_scan, _KgRange(kg, kg), fn, None))

    def operator_state(self):
        """Every operator-state entry, worker by worker."""
        return self._collect(lambda fn: self._g.call("operator_state",
                                                     _lib.stash_snapshot_op_scan, fn, None))

    def rewrite(self, path, max_parallelism=0, id=0, drop=(), rename=None, ttl=None):
        """Writes the snapshot anew as a savepoint at path: states in drop
        left out, rename {old: new}, ttl {state: ms, 0 for none}, every entry
        re-hashed into max_parallelism key groups if given. Returns what was
        written."""
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
    """A savepoint written offline (bootstrap): declare states, put entries,
    commit. Used with `with`, it commits when the block ends and aborts if
    it raised; path holds a whole savepoint or nothing. Any thread may call
    it, one call at a time."""

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

    def state(self, name, kind=VALUE, ttl_ms=0, ttl_update=TTL_ON_CREATE_AND_WRITE,
              ttl_visibility=TTL_NEVER_RETURN_EXPIRED):
        """Declares a state (TIMERS: a timer service)."""
        d = _StateDesc()
        d.name, d.kind = name.encode(), kind
        d.ttl = _ttl_of(ttl_ms, ttl_update, ttl_visibility)
        _check(self._g.call(name, _lib.stash_snapshot_writer_state, ctypes.byref(d)), name)

    def _entry(self, state, key=b"", value=b"", ns=b"", map_key=b"", ttl_ms=0,
               domain=EVENT_TIME, timestamp=0, worker=0):
        e, keep = _SnapshotEntry(), []
        e.state = state.encode()
        for field, x in (("key", key), ("value", value), ("ns", ns), ("map_key", map_key)):
            b = to_bytes(x)
            keep.append(b)
            setattr(e, field, _Bytes(ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p), len(b)))
        e.ttl_ms, e.domain, e.timestamp, e.worker = ttl_ms, domain, timestamp, worker
        return e, keep

    def put(self, state, key, value=b"", ns=b"", map_key=b"", ttl_ms=0, domain=EVENT_TIME,
            timestamp=0):
        """A value (replacing one), a list element appended, a map entry
        (map_key), or a timer (domain, timestamp); a TTL state's entry keeps
        ttl_ms as when it was written (0: now)."""
        e, keep = self._entry(state, key, value, ns, map_key, ttl_ms, domain, timestamp)
        _check(self._g.call(state, _lib.stash_snapshot_writer_put, ctypes.byref(e)), state)

    def delete(self, state, key, ns=b"", map_key=b"", domain=EVENT_TIME, timestamp=0):
        """Removes a value, a whole list, a map entry (the map without
        map_key) or a timer."""
        e, keep = self._entry(state, key, b"", ns, map_key, 0, domain, timestamp)
        _check(self._g.call(state, _lib.stash_snapshot_writer_delete, ctypes.byref(e)), state)

    def op_put(self, state, worker, value=b"", map_key=b"", timestamp=0):
        """An operator-state entry of a worker: a list element, a broadcast
        entry (map_key), or a timer service's watermark (timestamp)."""
        e, keep = self._entry(state, b"", value, b"", map_key, 0, EVENT_TIME, timestamp, worker)
        _check(self._g.call(state, _lib.stash_snapshot_writer_op_put, ctypes.byref(e)), state)

    def commit(self):
        """Writes and commits the savepoint; returns what was written."""
        i = _SnapshotInfo()
        h = self._g.take("commit")
        _check(_lib.stash_snapshot_writer_commit(h, ctypes.byref(i)), self.path)
        return _snapshot_info(i)

    def abort(self):
        """Writes nothing (after commit or abort, does nothing)."""
        self._g.close()
