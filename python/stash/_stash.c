/* SPDX-License-Identifier: MIT */
/*
 * _stash.c: the data path of the Python module in C: value and map reads
 * and writes of one key, and of many keys in one call (their state fetched
 * ahead, as a batch does), without the cost of a ctypes call per step.
 * The many-key calls run through a batch of the worker's the Python side
 * creates. The rest of the module (python/stash/__init__.py) goes through
 * ctypes; states and batches pass as the integers ctypes holds, a worker
 * as a Handle: its pointer (none once closed) and the one thread that may
 * use it, checked on every call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>

#include "stash.h"

/* The Python side's error(code, detail, call): the exception of a code,
 * of the class __init__.py raises for it. */
static PyObject *error_fn;

/* The Python side's claim(handle, call): the slow path of a Handle's check. */
static PyObject *claim_fn;

/* Calls made through this module: a View made before one may show memory
 * the call moved (the Python side compares). */
static unsigned long long calls;

/* Raises the module's exception for rc, as _check() in __init__.py does. */
static PyObject *raise(int rc, const char *call)
{
    if (!error_fn) {
        PyErr_Format(PyExc_RuntimeError, "%s: %s (%s)", call, stash_strerror(rc), stash_errmsg());
        return NULL;
    }
    PyObject *e = PyObject_CallFunction(error_fn, "iss", rc, stash_errmsg(), call);
    if (e) {
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        Py_DECREF(e);
    }
    return NULL;
}

/* The bytes of a key or value: a bytes-like object as is, str as UTF-8,
 * int as 8 little-endian bytes (two's complement), None as none, as
 * to_bytes() does. word holds an int's bytes; view, a buffer to release. */
typedef struct arg_bytes {
    const void *data;
    Py_ssize_t len;
    uint8_t word[8];
    Py_buffer view;
    bool viewed;
} arg_bytes;

static int arg_get(PyObject *o, arg_bytes *a)
{
    a->viewed = false;
    if (PyBytes_Check(o)) {
        a->data = PyBytes_AS_STRING(o);
        a->len = PyBytes_GET_SIZE(o);
        return 0;
    }
    if (PyUnicode_Check(o)) {
        a->data = PyUnicode_AsUTF8AndSize(o, &a->len);
        return a->data ? 0 : -1;
    }
    if (PyLong_Check(o) && !PyBool_Check(o)) {
        int overflow;
        uint64_t w = (uint64_t)PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow > 0) w = PyLong_AsUnsignedLongLong(o);
        if (overflow < 0) PyErr_SetString(PyExc_OverflowError, "stash: an int below -2**63");
        if (PyErr_Occurred()) return -1;
        for (int i = 0; i < 8; i++) a->word[i] = (uint8_t)(w >> (8 * i));
        a->data = a->word;
        a->len = 8;
        return 0;
    }
    if (o == Py_None) {
        a->data = NULL;
        a->len = 0;
        return 0;
    }
    if (PyObject_GetBuffer(o, &a->view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "stash: a %s is neither bytes, str nor int",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    a->viewed = true;
    a->data = a->view.buf;
    a->len = a->view.len;
    return 0;
}

static void arg_release(arg_bytes *a)
{
    if (a->viewed) PyBuffer_Release(&a->view);
}

static void *pointer(PyObject *o)
{
    return o == Py_None ? NULL : PyLong_AsVoidPtr(o);
}

/* A worker's (or reader's) handle. A stash_worker is used by one thread at
 * a time and its memory is freed at close: a call goes straight through
 * only from the thread that holds it while it is open, a check of two
 * words without a syscall. Any other call (a closed handle, another
 * thread's, a free one) goes to claim(), which raises or takes the handle
 * for the calling thread; the GIL makes the check and the call one step. */
typedef struct Handle {
    PyObject ob_base;     /* PyObject_HEAD */
    void *ptr;            /* NULL once closed */
    unsigned long thread; /* PyThread_get_thread_ident() of its thread; 0: free */
    PyObject *label;      /* what the messages call it: "worker 'clicks' (index 0 of 3)" */
} Handle;

static PyTypeObject handle_type;

static void *claim(Handle *h, const char *call)
{
    if (!claim_fn) {
        PyErr_SetString(PyExc_RuntimeError, "stash: the module is not set up");
        return NULL;
    }
    PyObject *r = PyObject_CallFunction(claim_fn, "Os", (PyObject *)h, call);
    if (!r) return NULL;
    Py_DECREF(r);
    return h->ptr;
}

/* The worker of o for a call from this thread, or NULL with an exception. */
static void *worker_of(PyObject *o, const char *call)
{
    if (!Py_IS_TYPE(o, &handle_type)) {
        PyErr_Format(PyExc_TypeError, "%s: a worker's Handle, not a %s", call, Py_TYPE(o)->tp_name);
        return NULL;
    }
    Handle *h = (Handle *)o;
    if (h->ptr && h->thread == PyThread_get_thread_ident()) return h->ptr;
    return claim(h, call);
}

/* Handle(ptr, label, thread) */
static PyObject *handle_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *ptr, *label;
    unsigned long thread;
    if (kw && PyDict_GET_SIZE(kw)) return PyErr_Format(PyExc_TypeError, "Handle takes no keywords");
    if (!PyArg_ParseTuple(args, "OUk", &ptr, &label, &thread)) return NULL;
    void *p = PyLong_AsVoidPtr(ptr);
    if (!p) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "Handle: a NULL pointer");
        return NULL;
    }
    Handle *h = (Handle *)type->tp_alloc(type, 0);
    if (!h) return NULL;
    h->ptr = p;
    h->thread = thread;
    Py_INCREF(label);
    h->label = label;
    return (PyObject *)h;
}

static void handle_dealloc(PyObject *o)
{
    Py_XDECREF(((Handle *)o)->label);
    Py_TYPE(o)->tp_free(o);
}

/* get(call): the pointer, checked as every call through this module is. */
static PyObject *handle_get(PyObject *o, PyObject *call)
{
    const char *c = PyUnicode_Check(call) ? PyUnicode_AsUTF8(call) : NULL;
    if (!c) return PyErr_Format(PyExc_TypeError, "Handle.get takes the call's name");
    void *p = worker_of(o, c);
    return p ? PyLong_FromVoidPtr(p) : NULL;
}

/* close(): every call from now on raises; freeing the worker is the caller's. */
static PyObject *handle_close(PyObject *o, PyObject *unused)
{
    (void)unused;
    ((Handle *)o)->ptr = NULL;
    Py_RETURN_NONE;
}

static PyObject *handle_ptr(PyObject *o, void *unused)
{
    (void)unused;
    Handle *h = (Handle *)o;
    if (!h->ptr) Py_RETURN_NONE;
    return PyLong_FromVoidPtr(h->ptr);
}

static PyObject *handle_thread(PyObject *o, void *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLong(((Handle *)o)->thread);
}

static int handle_set_thread(PyObject *o, PyObject *v, void *unused)
{
    (void)unused;
    unsigned long t = v ? PyLong_AsUnsignedLong(v) : 0;
    if (!v) PyErr_SetString(PyExc_AttributeError, "Handle.thread cannot be deleted");
    if (PyErr_Occurred()) return -1;
    ((Handle *)o)->thread = t;
    return 0;
}

static PyObject *handle_label(PyObject *o, void *unused)
{
    (void)unused;
    PyObject *l = ((Handle *)o)->label;
    Py_INCREF(l);
    return l;
}

static PyMethodDef handle_methods[] = {
    {"get", handle_get, METH_O, "get(call): the pointer, or raises (closed, another thread's)"},
    {"close", handle_close, METH_NOARGS, "close(): every later call raises"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef handle_getset[] = {
    {"ptr", handle_ptr, NULL, "the pointer, None once closed", NULL},
    {"thread", handle_thread, handle_set_thread, "the thread that holds it (0: free)", NULL},
    {"label", handle_label, NULL, "what messages call it", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* PyVarObject_HEAD_INIT ends in a comma of its own, which clang-format
 * does not see. */
/* clang-format off */
static PyTypeObject handle_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stash._stash.Handle",
    .tp_basicsize = sizeof(Handle),
    .tp_dealloc = handle_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A worker's handle: its pointer and the thread that may use it",
    .tp_methods = handle_methods,
    .tp_getset = handle_getset,
    .tp_new = handle_new,
};
/* clang-format on */

/* The value read (or None), or an exception. */
static PyObject *got(int rc, stash_bytes b, const char *call)
{
    if (rc == STASH_ENOTFOUND) Py_RETURN_NONE;
    if (rc < 0) return raise(rc, call);
    return PyBytes_FromStringAndSize(b.data, (Py_ssize_t)b.len);
}

/* value_get(handle, state, key): sets key current, reads its value. */
static PyObject *value_get(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    calls++;
    if (n != 3) return PyErr_Format(PyExc_TypeError, "value_get takes 3 arguments");
    void *w = worker_of(args[0], "read");
    if (!w) return NULL;
    arg_bytes k;
    if (arg_get(args[2], &k) < 0) return NULL;
    int rc = stash_key_set(w, k.data, (size_t)k.len);
    arg_release(&k);
    if (rc < 0) return raise(rc, "key");
    stash_bytes b;
    return got(stash_value_get(pointer(args[1]), &b), b, "get");
}

/* value_put(handle, state, key, value): sets key current, stores value. */
static PyObject *value_put(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    calls++;
    if (n != 4) return PyErr_Format(PyExc_TypeError, "value_put takes 4 arguments");
    void *w = worker_of(args[0], "write");
    if (!w) return NULL;
    arg_bytes k, v;
    if (arg_get(args[2], &k) < 0) return NULL;
    if (arg_get(args[3], &v) < 0) {
        arg_release(&k);
        return NULL;
    }
    int rc = stash_key_set(w, k.data, (size_t)k.len);
    if (rc == 0) rc = stash_value_put(pointer(args[1]), v.data, (size_t)v.len);
    arg_release(&k);
    arg_release(&v);
    if (rc < 0) return raise(rc, "put");
    Py_RETURN_NONE;
}

/* A call over many keys runs them as batches of the worker's (a batch of
 * the state's, created by the Python side): stash fetches each stretch's
 * index groups and then their records ahead, and the handler below does
 * each key's access with the key current. */
typedef struct many {
    void *state;
    PyObject *keys;   /* a fast sequence */
    PyObject *values; /* values_put: a fast sequence; values_get: the list filled */
    bool put;
} many;

/* One event: its index in the call is the event pointer. */
static int one(stash_worker *w, void *event, void *ctx)
{
    (void)w;
    many *m = ctx;
    Py_ssize_t i = (Py_ssize_t)(intptr_t)event;
    if (m->put) {
        arg_bytes v;
        if (arg_get(PySequence_Fast_GET_ITEM(m->values, i), &v) < 0) return -EINVAL;
        int rc = stash_value_put(m->state, v.data, (size_t)v.len);
        arg_release(&v);
        return rc;
    }
    stash_bytes b;
    int rc = stash_value_get(m->state, &b);
    if (rc == STASH_ENOTFOUND) return 0; /* the list holds None */
    if (rc < 0) return rc;
    PyObject *o = PyBytes_FromStringAndSize(b.data, (Py_ssize_t)b.len);
    if (!o) return -ENOMEM;
    Py_SETREF(PyList_GET_ITEM(m->values, i), o);
    return 0;
}

/* Runs m's keys through batch (capacity cap; NULL: none) in order. An event whose key
 * group the worker does not own is refused by the batch: a read of it is
 * made alone (a copy of another's key group), a write fails. Returns 0, or
 * -1 with an exception set. */
static int run_many(void *worker, void *batch, uint32_t cap, many *m)
{
    Py_ssize_t count = PySequence_Fast_GET_SIZE(m->keys);
    int results[4096];
    if (!batch) {
        /* A reader's: every key group is another's, read a key at a time. */
        for (Py_ssize_t i = 0; i < count; i++) {
            arg_bytes k;
            if (arg_get(PySequence_Fast_GET_ITEM(m->keys, i), &k) < 0) return -1;
            int r = stash_key_set(worker, k.data, (size_t)k.len);
            arg_release(&k);
            if (r == 0) r = one(worker, (void *)(intptr_t)i, m);
            if (r < 0) {
                if (!PyErr_Occurred()) raise(r, m->put ? "put" : "get");
                return -1;
            }
        }
        return 0;
    }
    if (cap > 4096) cap = 4096;
    for (Py_ssize_t at = 0; at < count; at += cap) {
        Py_ssize_t end = at + cap < count ? at + (Py_ssize_t)cap : count;
        for (Py_ssize_t i = at; i < end; i++) {
            arg_bytes k;
            if (arg_get(PySequence_Fast_GET_ITEM(m->keys, i), &k) < 0) return -1;
            int rc = stash_batch_add(batch, k.data, (size_t)k.len, (void *)(intptr_t)i);
            arg_release(&k);
            if (rc < 0) {
                raise(rc, "batch");
                return -1;
            }
        }
        int rc = stash_batch_run(batch, one, m, results);
        if (rc < 0) {
            raise(rc, "batch");
            return -1;
        }
        for (Py_ssize_t i = at; rc > 0 && i < end; i++) {
            int r = results[i - at];
            if (r == 0) continue;
            if (PyErr_Occurred()) return -1;
            if (r != STASH_EKEYGROUP || m->put) {
                raise(r, m->put ? "put" : "get");
                return -1;
            }
            arg_bytes k;
            if (arg_get(PySequence_Fast_GET_ITEM(m->keys, i), &k) < 0) return -1;
            r = stash_key_set(worker, k.data, (size_t)k.len);
            arg_release(&k);
            if (r == 0) r = one(worker, (void *)(intptr_t)i, m);
            if (r < 0) {
                if (!PyErr_Occurred()) raise(r, "get");
                return -1;
            }
        }
    }
    return 0;
}

/* values_get(handle, batch, capacity, state, keys): the value of each key
 * (None if none). */
static PyObject *values_get(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    calls++;
    if (n != 5) return PyErr_Format(PyExc_TypeError, "values_get takes 5 arguments");
    void *w = worker_of(args[0], "read_many");
    if (!w) return NULL;
    PyObject *seq = PySequence_Fast(args[4], "keys must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(count);
    for (Py_ssize_t i = 0; out && i < count; i++) {
        Py_INCREF(Py_None);
        PyList_SET_ITEM(out, i, Py_None);
    }
    many m = {pointer(args[3]), seq, out, false};
    if (out && run_many(w, pointer(args[1]), (uint32_t)PyLong_AsUnsignedLong(args[2]), &m) < 0)
        Py_CLEAR(out);
    Py_DECREF(seq);
    return out;
}

/* values_put(handle, batch, capacity, state, keys, values): stores
 * values[i] for keys[i]. */
static PyObject *values_put(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    calls++;
    if (n != 6) return PyErr_Format(PyExc_TypeError, "values_put takes 6 arguments");
    void *w = worker_of(args[0], "write_many");
    if (!w) return NULL;
    PyObject *ks = PySequence_Fast(args[4], "keys must be a sequence");
    PyObject *vs = ks ? PySequence_Fast(args[5], "values must be a sequence") : NULL;
    int rc = vs ? 0 : -1;
    if (rc == 0 && PySequence_Fast_GET_SIZE(vs) != PySequence_Fast_GET_SIZE(ks)) {
        PyErr_SetString(PyExc_ValueError, "as many values as keys");
        rc = -1;
    }
    many m = {pointer(args[3]), ks, vs, true};
    if (rc == 0) rc = run_many(w, pointer(args[1]), (uint32_t)PyLong_AsUnsignedLong(args[2]), &m);
    Py_XDECREF(ks);
    Py_XDECREF(vs);
    if (rc) return NULL;
    Py_RETURN_NONE;
}

/* generation(): how many calls the module has made. */
static PyObject *generation(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    return PyLong_FromUnsignedLongLong(calls);
}

/* setup(error, claim): what makes the exception of a code, and the slow
 * path of a Handle's check. */
static PyObject *setup(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *error, *claim;
    if (!PyArg_ParseTuple(args, "OO", &error, &claim)) return NULL;
    Py_INCREF(error);
    Py_XSETREF(error_fn, error);
    Py_INCREF(claim);
    Py_XSETREF(claim_fn, claim);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"value_get", (PyCFunction)(void (*)(void))value_get, METH_FASTCALL,
     "value_get(handle, state, key): key's value or None"},
    {"value_put", (PyCFunction)(void (*)(void))value_put, METH_FASTCALL,
     "value_put(handle, state, key, value)"},
    {"values_get", (PyCFunction)(void (*)(void))values_get, METH_FASTCALL,
     "values_get(handle, batch, capacity, state, keys): each key's value or None"},
    {"values_put", (PyCFunction)(void (*)(void))values_put, METH_FASTCALL,
     "values_put(handle, batch, capacity, state, keys, values)"},
    {"setup", setup, METH_VARARGS, "setup(error, claim)"},
    {"generation", generation, METH_NOARGS, "generation(): the calls made so far"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_stash", "stash's data path in C", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__stash(void);
PyMODINIT_FUNC PyInit__stash(void)
{
    if (PyType_Ready(&handle_type) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&handle_type);
    if (PyModule_AddObject(m, "Handle", (PyObject *)&handle_type) < 0) {
        Py_DECREF(&handle_type);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
