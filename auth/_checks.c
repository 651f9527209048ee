/* auth._checks: what every request of a server with authentication on goes through, in C (issue
 * #37: authentication added ~48,000 instructions to a single send's ~99,000, a fifth of them in
 * Python around the C signature check).
 *
 * NonceCache: the twin of auth/nonces.py's pure-Python `NonceCache` (same constructor, `check`,
 * `len()`, `window_ms`, `max_entries` and `floor_ms`; see that module for the rules): ~1,100
 * instructions a check against ~5,300.
 *
 * known_key(allowed_keys, username, code, fields, names) -> True | tuple | None: the twin of
 * auth/enforcer.py's `known_key_py` (the key a connection's allowed requests are remembered by,
 * built and looked up: ~3,500 instructions in Python).
 *
 * State: `seen`, a set of the nonces held; `buckets`, one per second of signed timestamps
 * (timestamp // 1000), sorted oldest first, each the list of its nonces. Timestamps and `now_ms`
 * are ints (epoch milliseconds): a timestamp beyond +-2**62 is "expired", as the twin finds it
 * for every `now_ms` within +-2**61 and `window_ms` up to 2**60; a `now_ms` or `window_ms` beyond
 * those raises OverflowError. Only the event loop's thread calls it (the GIL held throughout).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include "structmember.h"

#define LIMIT ((int64_t)1 << 62)         /* timestamps beyond: "expired" */
#define NOW_LIMIT ((int64_t)1 << 61)     /* now_ms beyond: OverflowError */
#define WINDOW_LIMIT ((int64_t)1 << 60)  /* window_ms beyond: OverflowError */

typedef struct {
    int64_t second;
    PyObject *nonces;               /* list of the nonces accepted with a timestamp in this second */
} bucket;

typedef struct {
    PyObject_HEAD
    long long window_ms;
    Py_ssize_t max_entries;
    long long floor_ms;             /* timestamps <= this are refused (their nonces were forgotten) */
    PyObject *seen;                 /* set */
    bucket *buckets;
    Py_ssize_t count, capacity;
} NonceCache;

static PyObject *expired_text, *replayed_text;

static int64_t
floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* Forget the oldest second's nonces; raise the floor past that second when `raise_floor`. */
static int
forget_oldest(NonceCache *self, int raise_floor)
{
    bucket oldest = self->buckets[0];
    self->count--;
    memmove(self->buckets, self->buckets + 1, (size_t)self->count * sizeof(bucket));
    Py_ssize_t n = PyList_GET_SIZE(oldest.nonces);
    int failed = 0;
    for (Py_ssize_t i = 0; i < n && !failed; i++)
        failed = PySet_Discard(self->seen, PyList_GET_ITEM(oldest.nonces, i)) < 0;
    Py_DECREF(oldest.nonces);
    if (raise_floor && oldest.second * 1000 + 999 > self->floor_ms)
        self->floor_ms = oldest.second * 1000 + 999;
    return failed ? -1 : 0;
}

/* The bucket of `second` (made, in order, when missing), or NULL with an error set. */
static bucket *
bucket_of(NonceCache *self, int64_t second)
{
    Py_ssize_t at = self->count;
    if (at > 0 && self->buckets[at - 1].second == second)
        return &self->buckets[at - 1];
    if (at > 0 && second < self->buckets[at - 1].second) {     /* an older second: binary search */
        Py_ssize_t lo = 0, hi = at - 1;
        while (lo < hi) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            if (self->buckets[mid].second < second)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (self->buckets[lo].second == second)
            return &self->buckets[lo];
        at = lo;
    }
    if (self->count == self->capacity) {
        Py_ssize_t capacity = self->capacity ? self->capacity * 2 : 16;
        bucket *grown = PyMem_Realloc(self->buckets, (size_t)capacity * sizeof(bucket));
        if (grown == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        self->capacity = capacity;
        self->buckets = grown;
    }
    PyObject *nonces = PyList_New(0);
    if (nonces == NULL)
        return NULL;
    memmove(self->buckets + at + 1, self->buckets + at, (size_t)(self->count - at) * sizeof(bucket));
    self->buckets[at].second = second;
    self->buckets[at].nonces = nonces;
    self->count++;
    return &self->buckets[at];
}

static int
as_ms(PyObject *value, int64_t limit, int64_t *out, int *beyond)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *beyond = overflow != 0 || v > limit || v < -limit;
    *out = v;
    return 0;
}

static PyObject *
check(NonceCache *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "check(nonce, timestamp_ms, now_ms)");
        return NULL;
    }
    PyObject *nonce = args[0];
    if (!PyLong_Check(args[1]) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "timestamp_ms and now_ms must be ints");
        return NULL;
    }
    int64_t timestamp_ms, now_ms;
    int ts_beyond, now_beyond;
    if (as_ms(args[1], LIMIT, &timestamp_ms, &ts_beyond) < 0 || as_ms(args[2], NOW_LIMIT, &now_ms, &now_beyond) < 0)
        return NULL;
    if (now_beyond) {
        PyErr_SetString(PyExc_OverflowError, "now_ms beyond +-2**61");
        return NULL;
    }
    int64_t skew = now_ms - timestamp_ms;
    if (ts_beyond || (skew < 0 ? -skew : skew) > self->window_ms || timestamp_ms <= self->floor_ms)
        return Py_NewRef(expired_text);
    int64_t oldest_allowed = floor_div(now_ms - self->window_ms, 1000);
    while (self->count > 0 && self->buckets[0].second < oldest_allowed)
        if (forget_oldest(self, 0) < 0)
            return NULL;
    int present = PySet_Contains(self->seen, nonce);
    if (present < 0)
        return NULL;
    if (present)
        return Py_NewRef(replayed_text);
    bucket *into = bucket_of(self, floor_div(timestamp_ms, 1000));
    if (into == NULL || PyList_Append(into->nonces, nonce) < 0 || PySet_Add(self->seen, nonce) < 0)
        return NULL;
    while (PySet_GET_SIZE(self->seen) > self->max_entries && self->count > 0)
        if (forget_oldest(self, 1) < 0)
            return NULL;
    Py_RETURN_NONE;
}

static int
init(NonceCache *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"window_ms", "max_entries", NULL};
    long long window_ms, max_entries = 262144;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "L|L:NonceCache", names, &window_ms, &max_entries))
        return -1;
    if (window_ms < 0 || max_entries < 1) {
        PyErr_SetString(PyExc_ValueError, "window_ms must be \u2265 0 and max_entries \u2265 1");
        return -1;
    }
    if (window_ms > WINDOW_LIMIT || max_entries > PY_SSIZE_T_MAX) {
        PyErr_SetString(PyExc_OverflowError, "window_ms or max_entries too large");
        return -1;
    }
    while (self->count > 0)
        if (forget_oldest(self, 0) < 0)
            return -1;
    Py_CLEAR(self->seen);
    self->seen = PySet_New(NULL);
    if (self->seen == NULL)
        return -1;
    self->window_ms = window_ms;
    self->max_entries = (Py_ssize_t)max_entries;
    self->floor_ms = -1;
    return 0;
}

static void
dealloc(NonceCache *self)
{
    for (Py_ssize_t i = 0; i < self->count; i++)
        Py_DECREF(self->buckets[i].nonces);
    PyMem_Free(self->buckets);
    Py_XDECREF(self->seen);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t
length(NonceCache *self)
{
    return self->seen == NULL ? 0 : PySet_GET_SIZE(self->seen);
}

/* known_key(allowed_keys, username, code, fields, names): True when (username, code, *the values
 * of `names` in `fields`, None when missing) is in `allowed_keys`, else that key; None when
 * `fields` is not exactly a dict or a value cannot be hashed. */
static PyObject *
known_key(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "known_key(allowed_keys, username, code, fields, names)");
        return NULL;
    }
    PyObject *allowed = args[0], *fields = args[3], *names = args[4];
    if (!PyDict_CheckExact(fields))
        Py_RETURN_NONE;
    if (!PyTuple_Check(names)) {
        PyErr_SetString(PyExc_TypeError, "names must be a tuple");
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(names);
    PyObject *key = PyTuple_New(2 + count);
    if (key == NULL)
        return NULL;
    PyTuple_SET_ITEM(key, 0, Py_NewRef(args[1]));
    PyTuple_SET_ITEM(key, 1, Py_NewRef(args[2]));
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *value = PyDict_GetItemWithError(fields, PyTuple_GET_ITEM(names, i));
        if (value == NULL && PyErr_Occurred()) {
            Py_DECREF(key);
            return NULL;
        }
        PyTuple_SET_ITEM(key, 2 + i, Py_NewRef(value == NULL ? Py_None : value));
    }
    int present = PySequence_Contains(allowed, key);
    if (present < 0) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) {
            Py_DECREF(key);
            return NULL;
        }
        PyErr_Clear();              /* a value that is not hashable: not a name, the builder refuses it */
        Py_DECREF(key);
        Py_RETURN_NONE;
    }
    if (present) {
        Py_DECREF(key);
        Py_RETURN_TRUE;
    }
    return key;
}

static PyMethodDef module_methods[] = {
    {"known_key", (PyCFunction)(void (*)(void))known_key, METH_FASTCALL,
     "known_key(allowed_keys, username, code, fields, names) -> True | tuple | None (auth/enforcer.py's "
     "known_key_py)."},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef cache_methods[] = {
    {"check", (PyCFunction)(void (*)(void))check, METH_FASTCALL,
     "check(nonce, timestamp_ms, now_ms) -> None (accepted and remembered) | 'expired' | 'replayed'."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef cache_members[] = {
    {"window_ms", T_LONGLONG, offsetof(NonceCache, window_ms), READONLY, "the clock-skew window (ms)"},
    {"max_entries", T_PYSSIZET, offsetof(NonceCache, max_entries), READONLY, "the nonces held at most"},
    {"floor_ms", T_LONGLONG, offsetof(NonceCache, floor_ms), READONLY,
     "timestamps up to this are refused (-1: none)"},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods cache_sequence = {.sq_length = (lenfunc)length};

static PyTypeObject NonceCacheType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "auth._checks.NonceCache",
    .tp_basicsize = sizeof(NonceCache),
    .tp_dealloc = (destructor)dealloc,
    .tp_as_sequence = &cache_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "NonceCache(window_ms, max_entries=262144): the nonces seen within the clock-skew window "
              "(auth/nonces.py's twin).",
    .tp_methods = cache_methods,
    .tp_members = cache_members,
    .tp_init = (initproc)init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "auth._checks", "NonceCache and known_key in C (see auth/nonces.py, auth/enforcer.py).",
    -1, module_methods,
};

PyMODINIT_FUNC
PyInit__checks(void)
{
    if (PyType_Ready(&NonceCacheType) < 0)
        return NULL;
    expired_text = PyUnicode_InternFromString("expired");
    replayed_text = PyUnicode_InternFromString("replayed");
    if (expired_text == NULL || replayed_text == NULL)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    Py_INCREF(&NonceCacheType);
    if (PyModule_AddObject(module, "NonceCache", (PyObject *)&NonceCacheType) < 0) {
        Py_DECREF(&NonceCacheType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
