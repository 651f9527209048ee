/* broker.trace._sets: `SetsBase`, the message trace recorder's calls made for every message in C
 * (the twin: broker/trace/sets.py's `SetsBasePy`; `TraceRecorder` derives from whichever runs).
 *
 * sent_usual(client_addr, group, topic, queue_id, queue_offset)
 * pulled(channel, group, topic, queue_id, from_offset, next_offset, count)
 * committed(client_addr, group, topic, queue_id, old_offset, new_offset)
 *
 * Each is the twin's method line for line (see there for the records they build); in Python they
 * cost ~2,500-3,800 instructions a call, the trace's whole per-message cost on the request paths
 * (issue #42: end to end the trace cost ~5-6 % against a 5 % target). The state is the
 * recorder's own attributes, as members the Python subclass reads and replaces (`drain`): `_queue`
 * (a collections.deque), `_commits`, `_sent_sets`, `_pulled_sets` (dicts), `_batch_sets`,
 * `_in_sets`, `_max` and `dropped`. The time is time.time()'s (CLOCK_REALTIME, seconds as a float).
 * Event-loop thread only (the GIL held throughout).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>
#include "structmember.h"

typedef struct {
    PyObject_HEAD
    PyObject *queue;            /* _queue: deque of event tuples */
    PyObject *commits;          /* _commits: (group, topic, queue_id) -> [COMMITTED, time, topic, queue_id, old, new, group, client] */
    PyObject *sent_sets;        /* _sent_sets: (topic, queue_id, group, client) -> [queue offsets] */
    PyObject *pulled_sets;      /* _pulled_sets: the same key -> [from, next, count, time, ...] */
    PyObject *batch_sets;       /* _batch_sets: the same key -> [first, next, time, ...] (Python's) */
    Py_ssize_t in_sets, max, dropped;
} SetsBase;

static PyObject *committed_kind, *remote_address_name, *append_name;

static PyObject *
now_seconds(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyFloat_FromDouble((double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
}

/* -1 with an error set when the recorder's state is missing or of the wrong type. */
static int
state_ok(SetsBase *self)
{
    if (self->queue == NULL || self->commits == NULL || self->sent_sets == NULL || self->pulled_sets == NULL
            || !PyDict_CheckExact(self->commits) || !PyDict_CheckExact(self->sent_sets)
            || !PyDict_CheckExact(self->pulled_sets)) {
        PyErr_SetString(PyExc_TypeError, "SetsBase: _queue, _commits, _sent_sets and _pulled_sets must be set "
                                         "(the last three dicts)");
        return -1;
    }
    return 0;
}

/* A set's event with `nargs` arguments (`expected`; else TypeError with `usage`): 1 when it is
 * taken (counted in `in_sets`), 0 when the queue and the sets are full (dropped and counted), -1
 * with an error set. */
static int
admit(SetsBase *self, Py_ssize_t nargs, Py_ssize_t expected, const char *usage)
{
    if (nargs != expected) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    if (state_ok(self) < 0)
        return -1;
    Py_ssize_t waiting = PyObject_Size(self->queue);
    if (waiting < 0)
        return -1;
    if (waiting + self->in_sets >= self->max) {
        self->dropped++;
        return 0;
    }
    self->in_sets++;
    return 1;
}

/* `items` appended to the list at `key` of `sets` (the list made from `items` when missing). */
static int
add_to_set(PyObject *sets, PyObject *key, PyObject *const *items, Py_ssize_t count)
{
    PyObject *list = PyDict_GetItemWithError(sets, key);
    if (list == NULL) {
        if (PyErr_Occurred())
            return -1;
        PyObject *made = PyList_New(count);
        if (made == NULL)
            return -1;
        for (Py_ssize_t i = 0; i < count; i++)
            PyList_SET_ITEM(made, i, Py_NewRef(items[i]));
        int stored = PyDict_SetItem(sets, key, made);
        Py_DECREF(made);
        return stored;
    }
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "SetsBase: a set's value is not a list");
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        if (PyList_Append(list, items[i]) < 0)
            return -1;
    return 0;
}

static PyObject *
sets_key(PyObject *topic, PyObject *queue_id, PyObject *group, PyObject *client)
{
    return PyTuple_Pack(4, topic, queue_id, group, client);
}

static PyObject *
sent_usual(SetsBase *self, PyObject *const *args, Py_ssize_t nargs)
{
    int admitted = admit(self, nargs, 5, "sent_usual(client_addr, group, topic, queue_id, queue_offset)");
    if (admitted <= 0)
        return admitted < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *key = sets_key(args[2], args[3], args[1], args[0]);
    if (key == NULL)
        return NULL;
    int added = add_to_set(self->sent_sets, key, &args[4], 1);
    Py_DECREF(key);
    return added < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *
pulled(SetsBase *self, PyObject *const *args, Py_ssize_t nargs)
{
    int admitted = admit(self, nargs, 7, "pulled(channel, group, topic, queue_id, from_offset, next_offset, count)");
    if (admitted <= 0)
        return admitted < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *client = PyObject_GetAttr(args[0], remote_address_name);
    if (client == NULL)
        return NULL;
    PyObject *key = sets_key(args[2], args[3], args[1], client);
    Py_DECREF(client);
    if (key == NULL)
        return NULL;
    PyObject *now = now_seconds();
    if (now == NULL) {
        Py_DECREF(key);
        return NULL;
    }
    PyObject *items[4] = {args[4], args[5], args[6], now};
    int added = add_to_set(self->pulled_sets, key, items, 4);
    Py_DECREF(now);
    Py_DECREF(key);
    return added < 0 ? NULL : Py_NewRef(Py_None);
}

/* The twin's `_add(tuple(pending))`: appended while the queue has room, else counted as dropped. */
static int
add_event(SetsBase *self, PyObject *pending)
{
    Py_ssize_t waiting = PyObject_Size(self->queue);
    if (waiting < 0)
        return -1;
    if (waiting >= self->max) {
        self->dropped++;
        return 0;
    }
    PyObject *event = PySequence_Tuple(pending);
    if (event == NULL)
        return -1;
    PyObject *done = PyObject_CallMethodOneArg(self->queue, append_name, event);
    Py_DECREF(event);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    return 0;
}

static PyObject *
committed(SetsBase *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "committed(client_addr, group, topic, queue_id, old_offset, new_offset)");
        return NULL;
    }
    if (state_ok(self) < 0)
        return NULL;
    PyObject *client = args[0], *group = args[1], *topic = args[2], *queue_id = args[3];
    PyObject *old_offset = args[4], *new_offset = args[5];
    PyObject *key = PyTuple_Pack(3, group, topic, queue_id);
    if (key == NULL)
        return NULL;
    PyObject *pending = PyDict_GetItemWithError(self->commits, key);
    if (pending == NULL && PyErr_Occurred())
        goto error;
    if (pending != NULL) {
        if (!PyList_CheckExact(pending) || PyList_GET_SIZE(pending) != 8) {
            PyErr_SetString(PyExc_TypeError, "SetsBase: a pending COMMITTED is not a list of 8");
            goto error;
        }
        Py_INCREF(pending);
        /* a forward move (new >= the pending new, the pending run itself forward) extends it */
        int forward = PyObject_RichCompareBool(new_offset, PyList_GET_ITEM(pending, 5), Py_GE);
        if (forward > 0) {
            PyObject *run_old = PyList_GET_ITEM(pending, 4);
            forward = run_old == Py_None ? 1 : PyObject_RichCompareBool(run_old, PyList_GET_ITEM(pending, 5), Py_LE);
        }
        if (forward < 0) {
            Py_DECREF(pending);
            goto error;
        }
        if (forward) {
            PyObject *now = now_seconds();
            if (now == NULL) {
                Py_DECREF(pending);
                goto error;
            }
            PyList_SetItem(pending, 1, now);                  /* (steals `now`) */
            PyList_SetItem(pending, 5, Py_NewRef(new_offset));
            PyList_SetItem(pending, 7, Py_NewRef(client));
            Py_DECREF(pending);
            Py_DECREF(key);
            Py_RETURN_NONE;
        }
        int added = add_event(self, pending);           /* a move back stands apart from the forward runs */
        Py_DECREF(pending);
        if (added < 0)
            goto error;
    }
    PyObject *now = now_seconds();
    if (now == NULL)
        goto error;
    PyObject *record = PyList_New(8);
    if (record == NULL) {
        Py_DECREF(now);
        goto error;
    }
    PyObject *items[8] = {committed_kind, now, topic, queue_id, old_offset, new_offset, group, client};
    for (int i = 0; i < 8; i++)
        PyList_SET_ITEM(record, i, Py_NewRef(items[i]));
    Py_DECREF(now);
    int stored = PyDict_SetItem(self->commits, key, record);
    Py_DECREF(record);
    Py_DECREF(key);
    return stored < 0 ? NULL : Py_NewRef(Py_None);
error:
    Py_DECREF(key);
    return NULL;
}

static int
traverse(SetsBase *self, visitproc visit, void *arg)
{
    Py_VISIT(self->queue);
    Py_VISIT(self->commits);
    Py_VISIT(self->sent_sets);
    Py_VISIT(self->pulled_sets);
    Py_VISIT(self->batch_sets);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int
clear(SetsBase *self)
{
    Py_CLEAR(self->queue);
    Py_CLEAR(self->commits);
    Py_CLEAR(self->sent_sets);
    Py_CLEAR(self->pulled_sets);
    Py_CLEAR(self->batch_sets);
    return 0;
}

static void
dealloc(SetsBase *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyMethodDef methods[] = {
    {"sent_usual", (PyCFunction)(void (*)(void))sent_usual, METH_FASTCALL,
     "sent_usual(client_addr, group, topic, queue_id, queue_offset): SEND_MESSAGE's fast path stored one message."},
    {"pulled", (PyCFunction)(void (*)(void))pulled, METH_FASTCALL,
     "pulled(channel, group, topic, queue_id, from_offset, next_offset, count): a pull returned messages."},
    {"committed", (PyCFunction)(void (*)(void))committed, METH_FASTCALL,
     "committed(client_addr, group, topic, queue_id, old_offset, new_offset): a group's offset moved."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef members[] = {
    {"_queue", T_OBJECT_EX, offsetof(SetsBase, queue), 0, NULL},
    {"_commits", T_OBJECT_EX, offsetof(SetsBase, commits), 0, NULL},
    {"_sent_sets", T_OBJECT_EX, offsetof(SetsBase, sent_sets), 0, NULL},
    {"_pulled_sets", T_OBJECT_EX, offsetof(SetsBase, pulled_sets), 0, NULL},
    {"_batch_sets", T_OBJECT_EX, offsetof(SetsBase, batch_sets), 0, NULL},
    {"_in_sets", T_PYSSIZET, offsetof(SetsBase, in_sets), 0, NULL},
    {"_max", T_PYSSIZET, offsetof(SetsBase, max), 0, NULL},
    {"dropped", T_PYSSIZET, offsetof(SetsBase, dropped), 0, "events not recorded: the queue was full"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot slots[] = {
    {Py_tp_doc, "The trace recorder's per-message calls in C (broker/trace/sets.py's SetsBasePy is its twin)."},
    {Py_tp_methods, methods},
    {Py_tp_members, members},
    {Py_tp_traverse, traverse},
    {Py_tp_clear, clear},
    {Py_tp_dealloc, dealloc},
    {0, NULL},
};

static PyType_Spec spec = {
    "broker.trace._sets.SetsBase", sizeof(SetsBase), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, slots,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "broker.trace._sets", "The trace recorder's per-message calls in C.", -1, NULL,
};

PyMODINIT_FUNC
PyInit__sets(void)
{
    PyObject *trace = PyImport_ImportModule("protocol.trace");     /* COMMITTED: the record kind's letter */
    if (trace == NULL)
        return NULL;
    committed_kind = PyObject_GetAttrString(trace, "COMMITTED");
    Py_DECREF(trace);
    remote_address_name = PyUnicode_InternFromString("remote_address");
    append_name = PyUnicode_InternFromString("append");
    if (committed_kind == NULL || remote_address_name == NULL || append_name == NULL)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    PyObject *type = PyType_FromSpec(&spec);
    if (type == NULL || PyModule_AddObject(module, "SetsBase", type) < 0) {
        Py_XDECREF(type);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
