/* protocol._speedups: optional C versions of pure functions on the per-message path.
 *
 * Each function here has a pure-Python twin in protocol/ that is the reference: the same result
 * for every input, the same exception type and message (tests/protocol/test_speedups.py checks
 * both on generated and corrupted inputs). protocol/message.py uses these when the module was
 * built and RQ_PURE_PYTHON is not set; an install without a C compiler still works.
 *
 * decode_message_batch(body) -> list[MessageExt]
 *     The messages of a pull body (PROTOCOL.md "Messages in a body"): msgpack's own Unpacker
 *     parses the stream; this turns each stored array into a MessageExt (the twin's
 *     `message_from_fields`) with the slots written directly, which is where the Python version
 *     spends two thirds of its time.
 *
 * configure(message_type, msg_id_prefix, protocol_error) must be called once before use: the
 * MessageExt class, the cached prefix function and the exception class, from protocol.message. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdio.h>
#include <string.h>

#define STORED_FIELD_COUNT 13

/* The MessageExt slots, in the order of the stored array, then msg_id. */
enum {
    S_TOPIC, S_QUEUE_ID, S_QUEUE_OFFSET, S_COMMIT_LOG_OFFSET, S_FLAG, S_SYS_FLAG, S_BORN_TIMESTAMP,
    S_BORN_HOST, S_STORE_TIMESTAMP, S_STORE_HOST, S_RECONSUME_TIMES, S_PROPERTIES, S_BODY, S_MSG_ID,
    SLOT_COUNT
};

static const char *slot_names[SLOT_COUNT] = {
    "topic", "queue_id", "queue_offset", "commit_log_offset", "flag", "sys_flag", "born_timestamp",
    "born_host", "store_timestamp", "store_host", "reconsume_times", "properties", "body", "msg_id",
};

typedef struct {
    PyTypeObject *message_type;       /* MessageExt */
    PyObject *msg_id_prefix;          /* protocol.message.msg_id_prefix */
    PyObject *protocol_error;         /* protocol.errors.ProtocolError */
    PyObject *unpacker_type;          /* msgpack.Unpacker */
    PyObject *unpack_exception;       /* msgpack.UnpackException */
    PyObject *unpacker_kwargs;        /* raw=False, use_list=True, strict_map_key=False */
    PyObject *empty_tuple;
    Py_ssize_t slot_offsets[SLOT_COUNT];
    int configured;
} module_state;

static module_state state;

/* The byte offset of each of `type`'s slots into `offsets`; -1 with TypeError unless every name
 * in slot_names is an object slot of `type` (a `@dataclass(slots=True)` class). */
static int
find_slot_offsets(PyTypeObject *type, Py_ssize_t *offsets)
{
    for (int i = 0; i < SLOT_COUNT; i++) {
        PyObject *descr = PyObject_GetAttrString((PyObject *)type, slot_names[i]);
        if (descr == NULL) {
            PyErr_Format(PyExc_TypeError, "%s has no slot %s", type->tp_name, slot_names[i]);
            return -1;
        }
        if (!PyObject_TypeCheck(descr, &PyMemberDescr_Type)) {
            Py_DECREF(descr);
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, slot_names[i]);
            return -1;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type != T_OBJECT_EX) {
            Py_DECREF(descr);
            PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", type->tp_name, slot_names[i]);
            return -1;
        }
        offsets[i] = member->offset;
        Py_DECREF(descr);
    }
    return 0;
}

static PyObject *
configure(PyObject *module, PyObject *args)
{
    PyObject *message_type, *msg_id_prefix, *protocol_error;
    if (!PyArg_ParseTuple(args, "O!OO:configure", &PyType_Type, &message_type, &msg_id_prefix,
                          &protocol_error))
        return NULL;
    Py_ssize_t offsets[SLOT_COUNT];
    if (find_slot_offsets((PyTypeObject *)message_type, offsets) < 0)
        return NULL;
    PyObject *msgpack = PyImport_ImportModule("msgpack");
    if (msgpack == NULL)
        return NULL;
    PyObject *unpacker_type = PyObject_GetAttrString(msgpack, "Unpacker");
    PyObject *unpack_exception = PyObject_GetAttrString(msgpack, "UnpackException");
    Py_DECREF(msgpack);
    PyObject *kwargs = Py_BuildValue("{s:O,s:O,s:O}", "raw", Py_False, "use_list", Py_True,
                                     "strict_map_key", Py_False);
    if (unpacker_type == NULL || unpack_exception == NULL || kwargs == NULL) {
        Py_XDECREF(unpacker_type);
        Py_XDECREF(unpack_exception);
        Py_XDECREF(kwargs);
        return NULL;
    }
    if (state.empty_tuple == NULL && (state.empty_tuple = PyTuple_New(0)) == NULL) {
        Py_DECREF(unpacker_type);
        Py_DECREF(unpack_exception);
        Py_DECREF(kwargs);
        return NULL;
    }
    memcpy(state.slot_offsets, offsets, sizeof offsets);
    Py_XSETREF(state.message_type, (PyTypeObject *)Py_NewRef(message_type));
    Py_XSETREF(state.msg_id_prefix, Py_NewRef(msg_id_prefix));
    Py_XSETREF(state.protocol_error, Py_NewRef(protocol_error));
    Py_XSETREF(state.unpacker_type, unpacker_type);
    Py_XSETREF(state.unpack_exception, unpack_exception);
    Py_XSETREF(state.unpacker_kwargs, kwargs);
    state.configured = 1;
    Py_RETURN_NONE;
}

static void
protocol_error(const char *message)
{
    PyErr_SetString(state.protocol_error, message);
}

/* prefix + f"{commit_log_offset:016X}" in one allocation (prefix is ASCII, as msg_id_prefix makes it). */
static PyObject *
msg_id_of(PyObject *prefix, unsigned long long commit_log_offset)
{
    static const char digits[] = "0123456789ABCDEF";
    if (!PyUnicode_IS_ASCII(prefix)) {
        char hex[17];
        snprintf(hex, sizeof hex, "%016llX", commit_log_offset);
        PyObject *tail = PyUnicode_FromStringAndSize(hex, 16);
        if (tail == NULL)
            return NULL;
        PyObject *joined = PyUnicode_Concat(prefix, tail);
        Py_DECREF(tail);
        return joined;
    }
    Py_ssize_t prefix_length = PyUnicode_GET_LENGTH(prefix);
    PyObject *msg_id = PyUnicode_New(prefix_length + 16, 127);
    if (msg_id == NULL)
        return NULL;
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(msg_id);
    memcpy(out, PyUnicode_1BYTE_DATA(prefix), (size_t)prefix_length);
    for (int i = 15; i >= 0; i--) {
        out[prefix_length + i] = (Py_UCS1)digits[commit_log_offset & 0xF];
        commit_log_offset >>= 4;
    }
    return msg_id;
}

/* The MessageExt of one decoded stored array (a new reference), or NULL with ProtocolError set.
 * `prefixes` caches msg_id_prefix(store_host) for the messages of one body. */
static PyObject *
message_from_fields(PyObject *values, PyObject *prefixes)
{
    if (!PyList_CheckExact(values) || PyList_GET_SIZE(values) != STORED_FIELD_COUNT) {
        protocol_error("a stored message is an array of 13 fields");
        return NULL;
    }
    PyObject **v = ((PyListObject *)values)->ob_item;
    if (!PyUnicode_CheckExact(v[S_TOPIC]) || !PyDict_CheckExact(v[S_PROPERTIES])
            || !PyBytes_CheckExact(v[S_BODY])) {
        protocol_error("stored message has mistyped topic, properties or body");
        return NULL;
    }
    if (!PyLong_CheckExact(v[S_QUEUE_ID]) || !PyLong_CheckExact(v[S_QUEUE_OFFSET])
            || !PyLong_CheckExact(v[S_COMMIT_LOG_OFFSET]) || !PyLong_CheckExact(v[S_FLAG])
            || !PyLong_CheckExact(v[S_SYS_FLAG]) || !PyLong_CheckExact(v[S_BORN_TIMESTAMP])
            || !PyLong_CheckExact(v[S_STORE_TIMESTAMP]) || !PyLong_CheckExact(v[S_RECONSUME_TIMES])
            || !PyUnicode_CheckExact(v[S_BORN_HOST]) || !PyUnicode_CheckExact(v[S_STORE_HOST])) {
        protocol_error("stored message has a mistyped integer or host");
        return NULL;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(v[S_PROPERTIES], &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key) || !PyUnicode_CheckExact(value)) {
            protocol_error("stored message has a property that is not str \xe2\x86\x92 str");
            return NULL;
        }
    }
    PyObject *store_host = v[S_STORE_HOST];
    PyObject *prefix = PyDict_GetItemWithError(prefixes, store_host);     /* borrowed */
    if (prefix == NULL) {
        if (PyErr_Occurred())
            return NULL;
        prefix = PyObject_CallOneArg(state.msg_id_prefix, store_host);
        if (prefix == NULL)
            return NULL;
        int failed = PyDict_SetItem(prefixes, store_host, prefix);
        Py_DECREF(prefix);          /* the dict holds it */
        if (failed < 0)
            return NULL;
    }
    int overflow = 0;
    unsigned long long commit_log_offset = 0;
    long long signed_offset = PyLong_AsLongLongAndOverflow(v[S_COMMIT_LOG_OFFSET], &overflow);
    if (signed_offset == -1 && PyErr_Occurred())
        return NULL;
    if (overflow > 0) {       /* >= 2**63: still valid below 2**64 */
        commit_log_offset = PyLong_AsUnsignedLongLong(v[S_COMMIT_LOG_OFFSET]);
        if (commit_log_offset == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            overflow = -1;
        }
    } else if (overflow == 0 && signed_offset >= 0) {
        commit_log_offset = (unsigned long long)signed_offset;
    } else {
        overflow = -1;
    }
    if (overflow < 0) {
        PyObject *text = PyObject_Str(v[S_COMMIT_LOG_OFFSET]);
        if (text != NULL) {
            PyErr_Format(state.protocol_error, "stored message has a bad commit_log_offset %U", text);
            Py_DECREF(text);
        }
        return NULL;
    }
    if (!PyUnicode_Check(prefix)) {
        PyErr_SetString(PyExc_TypeError, "msg_id_prefix must return str");
        return NULL;
    }
    PyObject *msg_id = msg_id_of(prefix, commit_log_offset);
    if (msg_id == NULL)
        return NULL;
    PyTypeObject *type = state.message_type;
    PyObject *message = type->tp_alloc(type, 0);
    if (message == NULL) {
        Py_DECREF(msg_id);
        return NULL;
    }
    char *base = (char *)message;
    for (int i = 0; i < STORED_FIELD_COUNT; i++)
        *(PyObject **)(base + state.slot_offsets[i]) = Py_NewRef(v[i]);
    *(PyObject **)(base + state.slot_offsets[S_MSG_ID]) = msg_id;
    return message;
}

/* ProtocolError(f"bad message body: {exc}") from exc, for the error now set. */
static void
rewrap_unpack_error(void)
{
    PyObject *type, *exc, *traceback;
    PyErr_Fetch(&type, &exc, &traceback);
    PyErr_NormalizeException(&type, &exc, &traceback);
    if (traceback != NULL && exc != NULL)
        PyException_SetTraceback(exc, traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    if (exc == NULL)
        return;
    PyObject *message = PyUnicode_FromFormat("bad message body: %S", exc);
    PyObject *error = message == NULL ? NULL : PyObject_CallOneArg(state.protocol_error, message);
    Py_XDECREF(message);
    if (error == NULL) {
        Py_DECREF(exc);
        return;
    }
    PyException_SetCause(error, Py_NewRef(exc));
    PyException_SetContext(error, exc);       /* steals exc */
    PyErr_SetObject(state.protocol_error, error);
    Py_DECREF(error);
}

static int
is_unpack_error(void)
{
    return PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_TypeError)
           || PyErr_ExceptionMatches(state.unpack_exception);
}

static PyObject *
decode_message_batch(PyObject *module, PyObject *body)
{
    if (!state.configured) {
        PyErr_SetString(PyExc_RuntimeError, "protocol._speedups.configure() was not called");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(body, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t length = view.len;
    PyBuffer_Release(&view);
    PyObject *messages = NULL, *prefixes = NULL, *unpacker = NULL, *values = NULL, *tell = NULL;
    PyObject *max_buffer = PyLong_FromSsize_t(length > 1 ? length : 1);
    PyObject *kwargs = max_buffer == NULL ? NULL : PyDict_Copy(state.unpacker_kwargs);
    if (kwargs == NULL || PyDict_SetItemString(kwargs, "max_buffer_size", max_buffer) < 0)
        goto error;
    unpacker = PyObject_Call(state.unpacker_type, state.empty_tuple, kwargs);
    if (unpacker == NULL)
        goto error;
    PyObject *fed = PyObject_CallMethod(unpacker, "feed", "O", body);
    if (fed == NULL)
        goto error;
    Py_DECREF(fed);
    messages = PyList_New(0);
    prefixes = PyDict_New();
    if (messages == NULL || prefixes == NULL)
        goto error;
    tell = PyObject_GetAttrString(unpacker, "tell");
    if (tell == NULL)
        goto error;
    Py_ssize_t consumed = 0;      /* the Unpacker's tell() is not reliable after it stops on incomplete data */
    for (;;) {
        values = PyIter_Next(unpacker);
        if (values == NULL) {
            if (PyErr_Occurred()) {
                if (is_unpack_error())
                    rewrap_unpack_error();
                goto error;
            }
            break;
        }
        PyObject *message = message_from_fields(values, prefixes);
        Py_CLEAR(values);
        if (message == NULL) {
            if (is_unpack_error())      /* e.g. msg_id_prefix on a store host with a bad port */
                rewrap_unpack_error();
            goto error;
        }
        int failed = PyList_Append(messages, message);
        Py_DECREF(message);
        if (failed < 0)
            goto error;
        PyObject *told = PyObject_CallNoArgs(tell);
        if (told == NULL)
            goto error;
        consumed = PyLong_AsSsize_t(told);
        Py_DECREF(told);
        if (consumed == -1 && PyErr_Occurred())
            goto error;
    }
    if (consumed != length) {
        PyErr_Format(state.protocol_error, "bad message body: %zd trailing bytes are not a message",
                     length - consumed);
        goto error;
    }
    Py_DECREF(max_buffer);
    Py_DECREF(kwargs);
    Py_DECREF(tell);
    Py_DECREF(unpacker);
    Py_DECREF(prefixes);
    return messages;

error:
    Py_XDECREF(tell);
    Py_XDECREF(values);
    Py_XDECREF(max_buffer);
    Py_XDECREF(kwargs);
    Py_XDECREF(unpacker);
    Py_XDECREF(prefixes);
    Py_XDECREF(messages);
    return NULL;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(message_type, msg_id_prefix, protocol_error): the classes and function to use."},
    {"decode_message_batch", decode_message_batch, METH_O,
     "decode_message_batch(body) -> list[MessageExt]; raises ProtocolError on bad bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "protocol._speedups",
    "Optional C versions of protocol's per-message functions (see protocol/message.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module_def);
}
