/* protocol._speedups: optional C versions of pure functions on the per-message path.
 *
 * Each function here has a pure-Python twin that is its reference: the same result for every
 * input, the same exception type and message (tests/protocol/test_speedups.py and
 * tests/broker/test_batch_decode.py check both on generated, malformed and mutated input).
 * protocol/native.py says when these are used (built, and RQ_PURE_PYTHON not set); an install
 * without a C compiler runs the twins. Bytes are read by the small msgpack reader of _msgpack.h,
 * which hands anything but the plain types (or anything malformed) to msgpack itself, so values
 * and errors stay msgpack's.
 *
 * decode_message_batch(body) -> list[MessageExt]
 *     The messages of a pull body (PROTOCOL.md "Messages in a body"), each stored array turned
 *     into a MessageExt with its slots written directly (protocol/message.py
 *     decode_message_batch_py and message_from_fields). A body the reader gives up on goes through
 *     msgpack's Unpacker as the twin does. configure(message_type, msg_id_prefix, protocol_error)
 *     first: the MessageExt class, the cached prefix function and the exception class.
 *
 * decode_frames(buffer, max_frame_bytes) -> (list[RemotingCommand], consumed)
 *     The whole frames at the start of `buffer` (PROTOCOL.md "Frame"), as protocol/frame.py
 *     decode_frames_py finds them: the lengths checked with the same FrameErrors, a well-formed
 *     header taken as it is (anything else is handed to protocol.frame._check_header, which names
 *     what is wrong), each body copied out.
 *
 * frame_bytes(command, max_body_bytes) -> bytes | None
 *     The whole frame of a command (protocol.frame.encode_frame's buffers joined) whose body is
 *     bytes, a bytearray, a byte memoryview or a list of those, of at most `max_body_bytes` in
 *     all: the six header keys written here (int fields may be IntEnums, as msgpack packs them),
 *     `ext` packed by msgpack's Packer, byte for byte what msgpack writes for the whole map. None
 *     for anything else (the Python version handles it, and raises what it raises).
 *     configure_frames(command_type, frame_error, check_header) before the frame functions: the
 *     RemotingCommand class, FrameError and protocol.frame._check_header.
 *
 * read_batch_body(raw, max_messages, max_body_bytes) -> (items, body_bytes) | None
 *     A plainly well-formed SEND_BATCH_MESSAGE body; None sends it to the broker's checks
 *     (broker/processors/send_message.py decode_batch_py), which name what is wrong.
 *
 * offset_msg_ids(prefix, commit_log_offsets) -> list[str] | None
 *     The offset message ids of a batch (protocol/message.py offset_msg_ids_py): `prefix` (16
 *     ASCII hex digits, `msg_id_prefix`) and each offset as 16 upper-case hex digits. None for
 *     anything else (another prefix, an offset outside 0..2**64-1, not a list of ints): the twin
 *     then makes them. *
 * canonical_bytes(scheme, code, fields, skip_key, digest) -> bytes | None
 *     The bytes a request signature covers (protocol/signing.py canonical_bytes_py): the msgpack
 *     array [scheme, code, ext, digest] with `fields` minus `skip_key` as `ext`, the keys of every
 *     map sorted, packed as msgpack's Packer(use_bin_type=True) packs them. None for anything
 *     but str keys and plain values (str, int, bool, None, float, bytes, dict, list, tuple) up to
 *     32 levels deep: the twin then packs it (and raises what it raises).
 *
 * sign_fields(fields, code, body, access_key, timestamp_ms, nonce, key) -> bool
 * signature_matches(code, fields, body, key) -> bool | None
 *     A request's signature in one call (protocol/signing.py sign_py and verify_py): the body's
 *     SHA-256, the canonical bytes and HMAC-SHA256 under `key` (the pads' states cached for the
 *     last key), the four auth fields set / the claimed signature compared in constant time.
 *     False / None for what canonical_bytes does not take, a body other than a buffer or a list or
 *     tuple of buffers, or a key other than bytes: the twin then does it. SHA-256 is libcrypto's
 *     (found with dlopen at configure_signing(scheme, access_key, timestamp, nonce, signature),
 *     which returns False when there is none: then only the twins run).
 *
 * check_signed(code, fields, body, users) -> user | str | None
 *     The first steps of auth/authenticate.py Authenticator.authenticate (its twin,
 *     `authenticate_py`): the auth fields read and their types checked, the user found with
 *     `users(access_key)`, its `signing_key` checked against the signature as signature_matches
 *     does. The user, or the reason it fails ("no credentials", "malformed", "unknown user", "bad
 *     signature"); None where signature_matches would hand it to the twin. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <dlfcn.h>
#include "_msgpack.h"
#include <stdint.h>
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
    /* frames */
    PyTypeObject *command_type;       /* RemotingCommand */
    PyObject *frame_error;            /* protocol.errors.FrameError */
    PyObject *check_header;           /* protocol.frame._check_header */
    PyObject *unpackb;                /* msgpack.unpackb */
    PyObject *unpackb_kwargs;         /* raw=False, strict_map_key=False */
    PyObject *pack;                   /* msgpack.Packer(use_bin_type=True).pack */
    PyObject *key_code, *key_opaque, *key_flag, *key_version, *key_remark, *key_ext;
    Py_ssize_t command_offsets[7];
    int frames_configured;
    Py_ssize_t slot_offsets[SLOT_COUNT];
    int configured;
} module_state;

static module_state state;

/* A shared empty tuple (a new-style call's empty positional arguments). */
static PyObject *
state_empty_tuple(void)
{
    if (state.empty_tuple == NULL)
        state.empty_tuple = PyTuple_New(0);
    return state.empty_tuple;
}

/* `msgpack.<name>` (a new reference), or NULL with the import or attribute error set. */
static PyObject *
msgpack_attr(const char *name)
{
    PyObject *msgpack = PyImport_ImportModule("msgpack");
    if (msgpack == NULL)
        return NULL;
    PyObject *attr = PyObject_GetAttrString(msgpack, name);
    Py_DECREF(msgpack);
    return attr;
}

/* The byte offset of each of `type`'s slots into `offsets`; -1 with TypeError unless every name
 * in slot_names is an object slot of `type` (a `@dataclass(slots=True)` class). */
static int
find_slot_offsets(PyTypeObject *type, const char **names, int count, Py_ssize_t *offsets)
{
    for (int i = 0; i < count; i++) {
        PyObject *descr = PyObject_GetAttrString((PyObject *)type, names[i]);
        if (descr == NULL) {
            PyErr_Format(PyExc_TypeError, "%s has no slot %s", type->tp_name, names[i]);
            return -1;
        }
        if (!PyObject_TypeCheck(descr, &PyMemberDescr_Type)) {
            Py_DECREF(descr);
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, names[i]);
            return -1;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type != T_OBJECT_EX) {
            Py_DECREF(descr);
            PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", type->tp_name, names[i]);
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
    if (find_slot_offsets((PyTypeObject *)message_type, slot_names, SLOT_COUNT, offsets) < 0)
        return NULL;
    PyObject *unpacker_type = msgpack_attr("Unpacker");
    PyObject *unpack_exception = unpacker_type == NULL ? NULL : msgpack_attr("UnpackException");
    PyObject *kwargs = unpack_exception == NULL ? NULL : Py_BuildValue(
        "{s:O,s:O,s:O}", "raw", Py_False, "use_list", Py_True, "strict_map_key", Py_False);
    if (kwargs == NULL || state_empty_tuple() == NULL) {
        Py_XDECREF(unpacker_type);
        Py_XDECREF(unpack_exception);
        Py_XDECREF(kwargs);
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

static PyObject *decode_with_unpacker(PyObject *body, Py_ssize_t length);

/* The messages of `data` read by mp_read; MP_FALLBACK (no exception) when anything in it is not
 * plainly well formed (msgpack's Unpacker then decides, see decode_with_unpacker). */
static PyObject *
decode_plain(const unsigned char *data, Py_ssize_t length)
{
    PyObject *messages = PyList_New(0), *prefixes = PyDict_New();
    if (messages == NULL || prefixes == NULL)
        goto error;
    mp_reader reader = {data, data + length};
    while (reader.p < reader.end) {
        PyObject *values = mp_read(&reader, 0);
        if (values == NULL)
            goto error;
        if (values == MP_FALLBACK)
            goto fallback;
        PyObject *message = message_from_fields(values, prefixes);
        Py_DECREF(values);
        if (message == NULL) {
            PyErr_Clear();           /* the Unpacker path raises it, the way the twin does */
            goto fallback;
        }
        int failed = PyList_Append(messages, message);
        Py_DECREF(message);
        if (failed < 0)
            goto error;
    }
    Py_DECREF(prefixes);
    return messages;

fallback:
    Py_DECREF(messages);
    Py_DECREF(prefixes);
    return MP_FALLBACK;

error:
    Py_XDECREF(messages);
    Py_XDECREF(prefixes);
    return NULL;
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
    PyObject *messages = decode_plain(view.buf, length);
    PyBuffer_Release(&view);
    if (messages != MP_FALLBACK)
        return messages;
    return decode_with_unpacker(body, length);
}

/* decode_message_batch through msgpack's Unpacker: every body the plain reader gives up on. */
static PyObject *
decode_with_unpacker(PyObject *body, Py_ssize_t length)
{
    PyObject *messages = NULL, *prefixes = NULL, *unpacker = NULL, *values = NULL, *tell = NULL;
    PyObject *max_buffer = PyLong_FromSsize_t(length > 1 ? length : 1);
    PyObject *kwargs = max_buffer == NULL ? NULL : PyDict_Copy(state.unpacker_kwargs);
    if (kwargs == NULL || PyDict_SetItemString(kwargs, "max_buffer_size", max_buffer) < 0)
        goto error;
    unpacker = PyObject_Call(state.unpacker_type, state_empty_tuple(), kwargs);
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

/* -- frames ------------------------------------------------------------------------------------ */

enum { C_CODE, C_OPAQUE, C_FLAG, C_REMARK, C_FIELDS, C_BODY, C_VERSION, COMMAND_SLOTS };
static const char *command_slot_names[COMMAND_SLOTS] = {
    "code", "opaque", "flag", "remark", "fields", "body", "version",
};

#define COMMAND_SLOT(obj, i) (*(PyObject **)((char *)(obj) + state.command_offsets[i]))

static PyObject *
configure_frames(PyObject *module, PyObject *args)
{
    PyObject *command_type, *frame_error, *check_header;
    if (!PyArg_ParseTuple(args, "O!OO:configure_frames", &PyType_Type, &command_type, &frame_error,
                          &check_header))
        return NULL;
    Py_ssize_t offsets[COMMAND_SLOTS];
    if (find_slot_offsets((PyTypeObject *)command_type, command_slot_names, COMMAND_SLOTS, offsets) < 0)
        return NULL;
    PyObject *unpackb = msgpack_attr("unpackb");
    PyObject *packer_type = unpackb == NULL ? NULL : msgpack_attr("Packer");
    PyObject *packer = NULL, *pack = NULL, *kwargs = NULL, *packer_kwargs = NULL;
    if (unpackb != NULL && packer_type != NULL) {
        packer_kwargs = Py_BuildValue("{s:O}", "use_bin_type", Py_True);
        packer = packer_kwargs == NULL ? NULL : PyObject_Call(packer_type, state_empty_tuple(), packer_kwargs);
        pack = packer == NULL ? NULL : PyObject_GetAttrString(packer, "pack");
        kwargs = Py_BuildValue("{s:O,s:O}", "raw", Py_False, "strict_map_key", Py_False);
    }
    Py_XDECREF(packer_type);
    Py_XDECREF(packer);
    Py_XDECREF(packer_kwargs);
    if (unpackb == NULL || pack == NULL || kwargs == NULL) {
        Py_XDECREF(unpackb);
        Py_XDECREF(pack);
        Py_XDECREF(kwargs);
        return NULL;
    }
    PyObject **keys[6] = {&state.key_code, &state.key_opaque, &state.key_flag, &state.key_version,
                          &state.key_remark, &state.key_ext};
    const char *key_names[6] = {"code", "opaque", "flag", "version", "remark", "ext"};
    for (int i = 0; i < 6; i++) {
        if (*keys[i] == NULL && (*keys[i] = PyUnicode_InternFromString(key_names[i])) == NULL) {
            Py_DECREF(unpackb);
            Py_DECREF(pack);
            Py_DECREF(kwargs);
            return NULL;
        }
    }
    memcpy(state.command_offsets, offsets, sizeof offsets);
    Py_XSETREF(state.command_type, (PyTypeObject *)Py_NewRef(command_type));
    Py_XSETREF(state.frame_error, Py_NewRef(frame_error));
    Py_XSETREF(state.check_header, Py_NewRef(check_header));
    Py_XSETREF(state.unpackb, unpackb);
    Py_XSETREF(state.unpackb_kwargs, kwargs);
    Py_XSETREF(state.pack, pack);
    state.frames_configured = 1;
    Py_RETURN_NONE;
}

static uint32_t
read_u32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* (code, opaque, flag, version, remark, ext) of a header map as new references in `out`, or -1
 * with FrameError set: the well-formed map checked here, anything else by _check_header. */
static int
header_fields(PyObject *header, PyObject **out)
{
    if (PyDict_CheckExact(header)) {
        PyObject *code = PyDict_GetItemWithError(header, state.key_code);
        PyObject *opaque = code == NULL ? NULL : PyDict_GetItemWithError(header, state.key_opaque);
        PyObject *flag = opaque == NULL ? NULL : PyDict_GetItemWithError(header, state.key_flag);
        PyObject *version = opaque == NULL ? NULL : PyDict_GetItemWithError(header, state.key_version);
        PyObject *remark = opaque == NULL ? NULL : PyDict_GetItemWithError(header, state.key_remark);
        PyObject *ext = opaque == NULL ? NULL : PyDict_GetItemWithError(header, state.key_ext);
        if (PyErr_Occurred())
            return -1;
        if (code != NULL && opaque != NULL && PyLong_CheckExact(code) && PyLong_CheckExact(opaque)
                && (flag == NULL || PyLong_CheckExact(flag)) && (version == NULL || PyLong_CheckExact(version))
                && (remark == NULL || remark == Py_None || PyUnicode_CheckExact(remark))
                && ext != NULL && PyDict_CheckExact(ext)) {
            Py_ssize_t pos = 0;
            PyObject *key, *value;
            int string_keys = 1;
            while (PyDict_Next(ext, &pos, &key, &value)) {
                if (!PyUnicode_CheckExact(key)) {
                    string_keys = 0;
                    break;
                }
            }
            if (string_keys) {
                out[0] = Py_NewRef(code);
                out[1] = Py_NewRef(opaque);
                out[2] = flag != NULL ? Py_NewRef(flag) : PyLong_FromLong(0);
                out[3] = version != NULL ? Py_NewRef(version) : PyLong_FromLong(1);
                out[4] = Py_NewRef(remark != NULL ? remark : Py_None);
                out[5] = Py_NewRef(ext);
                return 0;
            }
        }
    }
    PyObject *fields = PyObject_CallOneArg(state.check_header, header);
    if (fields == NULL)
        return -1;
    if (!PyTuple_CheckExact(fields) || PyTuple_GET_SIZE(fields) != 6) {
        Py_DECREF(fields);
        PyErr_SetString(PyExc_TypeError, "_check_header must return a 6-tuple");
        return -1;
    }
    for (int i = 0; i < 6; i++)
        out[i] = Py_NewRef(PyTuple_GET_ITEM(fields, i));
    Py_DECREF(fields);
    return 0;
}

/* A RemotingCommand of one frame's header bytes and body bytes (a new reference), or NULL. */
static PyObject *
command_of(const unsigned char *header_bytes, Py_ssize_t header_length, const unsigned char *body_bytes,
           Py_ssize_t body_length)
{
    PyObject *header = mp_read_all(header_bytes, header_length);
    if (header == MP_FALLBACK) {           /* msgpack decides: the same value, or its error */
        PyObject *view = PyMemoryView_FromMemory((char *)header_bytes, header_length, PyBUF_READ);
        if (view == NULL)
            return NULL;
        PyObject *args = PyTuple_Pack(1, view);
        Py_DECREF(view);
        if (args == NULL)
            return NULL;
        header = PyObject_Call(state.unpackb, args, state.unpackb_kwargs);
        Py_DECREF(args);
    }
    if (header == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;
        /* msgpack raises many types on garbage; all mean "not a header" (raised from None) */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyErr_NormalizeException(&type, &value, &traceback);
        const char *name = _PyType_Name((PyTypeObject *)type);
        PyObject *message = PyUnicode_FromFormat("header is not valid msgpack: %s", name);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        if (message == NULL)
            return NULL;
        PyObject *error = PyObject_CallOneArg(state.frame_error, message);
        Py_DECREF(message);
        if (error == NULL)
            return NULL;
        PyException_SetCause(error, NULL);
        ((PyBaseExceptionObject *)error)->suppress_context = 1;
        PyErr_SetObject(state.frame_error, error);
        Py_DECREF(error);
        return NULL;
    }
    PyObject *fields[6];
    int failed = header_fields(header, fields);
    Py_DECREF(header);
    if (failed < 0)
        return NULL;
    PyObject *body = PyBytes_FromStringAndSize((const char *)body_bytes, body_length);
    if (body == NULL) {
        for (int i = 0; i < 6; i++)
            Py_DECREF(fields[i]);
        return NULL;
    }
    PyTypeObject *type = state.command_type;
    PyObject *command = type->tp_alloc(type, 0);
    if (command == NULL) {
        for (int i = 0; i < 6; i++)
            Py_DECREF(fields[i]);
        Py_DECREF(body);
        return NULL;
    }
    COMMAND_SLOT(command, C_CODE) = fields[0];
    COMMAND_SLOT(command, C_OPAQUE) = fields[1];
    COMMAND_SLOT(command, C_FLAG) = fields[2];
    COMMAND_SLOT(command, C_VERSION) = fields[3];
    COMMAND_SLOT(command, C_REMARK) = fields[4];
    COMMAND_SLOT(command, C_FIELDS) = fields[5];
    COMMAND_SLOT(command, C_BODY) = body;
    return command;
}

static PyObject *
decode_frames(PyObject *module, PyObject *args)
{
    PyObject *buffer;
    long long max_frame_bytes;
    Py_ssize_t max_commands = 0;            /* 0: every whole frame */
    if (!PyArg_ParseTuple(args, "OL|n:decode_frames", &buffer, &max_frame_bytes, &max_commands))
        return NULL;
    if (!state.frames_configured) {
        PyErr_SetString(PyExc_RuntimeError, "protocol._speedups.configure_frames() was not called");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *data = view.buf;
    Py_ssize_t end = view.len, pos = 0;
    PyObject *commands = PyList_New(0);
    if (commands == NULL)
        goto error;
    while (end - pos >= 8 && (max_commands <= 0 || PyList_GET_SIZE(commands) < max_commands)) {
        uint32_t frame_length = read_u32(data + pos), header_length = read_u32(data + pos + 4);
        if (frame_length < 4) {
            PyErr_Format(state.frame_error, "frame_length %u is below 4", frame_length);
            goto error;
        }
        if ((long long)frame_length > max_frame_bytes) {
            PyErr_Format(state.frame_error, "frame of %u bytes exceeds max_frame_bytes %lld", frame_length,
                         max_frame_bytes);
            goto error;
        }
        if (header_length > frame_length - 4) {
            PyErr_Format(state.frame_error, "header_length %u exceeds the frame (%u)", header_length, frame_length);
            goto error;
        }
        if (end - pos < 4 + (Py_ssize_t)frame_length)
            break;
        Py_ssize_t header_start = pos + 8, body_start = header_start + header_length;
        Py_ssize_t frame_end = pos + 4 + frame_length;
        PyObject *command = command_of(data + header_start, header_length, data + body_start,
                                       frame_end - body_start);
        if (command == NULL)
            goto error;
        int failed = PyList_Append(commands, command);
        Py_DECREF(command);
        if (failed < 0)
            goto error;
        pos = frame_end;
    }
    PyBuffer_Release(&view);
    PyObject *result = Py_BuildValue("(Nn)", commands, pos);
    return result;

error:
    PyBuffer_Release(&view);
    Py_XDECREF(commands);
    return NULL;
}

/* An int header field: an int or an int subclass (an IntEnum code) but not a bool, as msgpack
 * packs them. */
static int
header_int(PyObject *value)
{
    return value != NULL && PyLong_Check(value) && !PyBool_Check(value);
}

/* The total size of a body (bytes, bytearray, a contiguous byte memoryview, or a list or tuple of
 * those), or -1 when it is anything else. */
static Py_ssize_t
body_size(PyObject *body)
{
    if (PyBytes_CheckExact(body))
        return PyBytes_GET_SIZE(body);
    if (PyByteArray_CheckExact(body))
        return PyByteArray_GET_SIZE(body);
    if (PyMemoryView_Check(body)) {       /* through the buffer API: a released view is refused */
        Py_buffer view;
        if (PyObject_GetBuffer(body, &view, PyBUF_ND) < 0) {
            PyErr_Clear();
            return -1;
        }
        Py_ssize_t length = view.itemsize == 1 && PyBuffer_IsContiguous(&view, 'C') ? view.len : -1;
        PyBuffer_Release(&view);
        return length;
    }
    if (PyList_CheckExact(body) || PyTuple_CheckExact(body)) {
        Py_ssize_t total = 0, count = PySequence_Fast_GET_SIZE(body);
        PyObject **items = PySequence_Fast_ITEMS(body);
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *item = items[i];
            if (PyList_CheckExact(item) || PyTuple_CheckExact(item))
                return -1;
            Py_ssize_t size = body_size(item);
            if (size < 0)
                return -1;
            total += size;
        }
        return total;
    }
    return -1;
}

static unsigned char *
put_body(unsigned char *out, PyObject *body)
{
    if (PyBytes_CheckExact(body)) {
        memcpy(out, PyBytes_AS_STRING(body), (size_t)PyBytes_GET_SIZE(body));
        return out + PyBytes_GET_SIZE(body);
    }
    if (PyByteArray_CheckExact(body)) {
        memcpy(out, PyByteArray_AS_STRING(body), (size_t)PyByteArray_GET_SIZE(body));
        return out + PyByteArray_GET_SIZE(body);
    }
    if (PyMemoryView_Check(body)) {
        Py_buffer view;
        if (PyObject_GetBuffer(body, &view, PyBUF_ND) < 0)
            return NULL;
        memcpy(out, view.buf, (size_t)view.len);
        PyBuffer_Release(&view);
        return out + view.len;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(body);
    PyObject **items = PySequence_Fast_ITEMS(body);
    for (Py_ssize_t i = 0; i < count && out != NULL; i++)
        out = put_body(out, items[i]);
    return out;
}

static PyObject *
frame_bytes(PyObject *module, PyObject *args)
{
    PyObject *command;
    Py_ssize_t max_body_bytes;
    if (!PyArg_ParseTuple(args, "On:frame_bytes", &command, &max_body_bytes))
        return NULL;
    if (!state.frames_configured || Py_TYPE(command) != state.command_type)
        Py_RETURN_NONE;
    PyObject *code = COMMAND_SLOT(command, C_CODE), *opaque = COMMAND_SLOT(command, C_OPAQUE);
    PyObject *flag = COMMAND_SLOT(command, C_FLAG), *version = COMMAND_SLOT(command, C_VERSION);
    PyObject *remark = COMMAND_SLOT(command, C_REMARK), *ext = COMMAND_SLOT(command, C_FIELDS);
    PyObject *body = COMMAND_SLOT(command, C_BODY);
    if (!header_int(code) || !header_int(opaque) || !header_int(flag) || !header_int(version)
            || remark == NULL || ext == NULL || body == NULL
            || (remark != Py_None && !PyUnicode_CheckExact(remark)))
        Py_RETURN_NONE;
    Py_ssize_t body_length = body_size(body);
    if (body_length < 0 || body_length > max_body_bytes)
        Py_RETURN_NONE;
    const char *remark_utf8 = NULL;
    Py_ssize_t remark_length = 0;
    if (remark != Py_None) {
        remark_utf8 = PyUnicode_AsUTF8AndSize(remark, &remark_length);
        if (remark_utf8 == NULL) {       /* e.g. lone surrogates: msgpack's own error, from Python */
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        if (remark_length > 0xFFFFFFFFLL)
            Py_RETURN_NONE;
    }
    PyObject *packed_ext = PyObject_CallOneArg(state.pack, ext);
    if (packed_ext == NULL) {            /* unpackable ext: the Python version raises the same */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (!PyBytes_Check(packed_ext)) {
        Py_DECREF(packed_ext);
        Py_RETURN_NONE;
    }
    Py_ssize_t ext_length = PyBytes_GET_SIZE(packed_ext);
    /* 1 map + 6 keys (5+7+5+8+7+4) + 4 ints (<= 9 each) + remark (<= 5 + n) + ext */
    Py_ssize_t bound = 8 + 1 + 36 + 4 * 9 + 5 + remark_length + ext_length + body_length;
    PyObject *frame = PyBytes_FromStringAndSize(NULL, bound);
    if (frame == NULL) {
        Py_DECREF(packed_ext);
        return NULL;
    }
    unsigned char *start = (unsigned char *)PyBytes_AS_STRING(frame), *out = start + 8;
    *out++ = 0x86;
    out = put_key(out, "code");
    if ((out = put_int(out, code)) == NULL)
        goto fallback;
    out = put_key(out, "opaque");
    if ((out = put_int(out, opaque)) == NULL)
        goto fallback;
    out = put_key(out, "flag");
    if ((out = put_int(out, flag)) == NULL)
        goto fallback;
    out = put_key(out, "version");
    if ((out = put_int(out, version)) == NULL)
        goto fallback;
    out = put_key(out, "remark");
    if (remark == Py_None) {
        *out++ = 0xC0;
    } else {
        out = put_str_header(out, remark_length);
        memcpy(out, remark_utf8, (size_t)remark_length);
        out += remark_length;
    }
    out = put_key(out, "ext");
    memcpy(out, PyBytes_AS_STRING(packed_ext), (size_t)ext_length);
    out += ext_length;
    Py_DECREF(packed_ext);
    packed_ext = NULL;
    Py_ssize_t header_length = out - (start + 8);
    if (body_size(body) != body_length || (out = put_body(out, body)) == NULL) {
        PyErr_Clear();              /* a body changed by the ext's packing: the Python version */
        Py_DECREF(frame);
        Py_RETURN_NONE;
    }
    put_be(start, (uint64_t)(4 + header_length + body_length), 4);
    put_be(start + 4, (uint64_t)header_length, 4);
    if (_PyBytes_Resize(&frame, out - start) < 0)
        return NULL;
    return frame;

fallback:
    Py_XDECREF(packed_ext);
    Py_DECREF(frame);
    Py_RETURN_NONE;
}

/* -- batch bodies ---------------------------------------------------------------------------- */

static PyObject *key_delay;     /* "DELAY" */
static PyObject *key_timer[3];  /* "TIMER_DELIVER_MS", "TIMER_DELAY_MS", "TIMER_DELAY_SEC" */

/* The UTF-8 length of a str (ASCII: its length), or -1 (no exception set) when it has none. */
static Py_ssize_t
utf8_length(PyObject *text)
{
    if (PyUnicode_IS_ASCII(text))
        return PyUnicode_GET_LENGTH(text);
    Py_ssize_t size;
    if (PyUnicode_AsUTF8AndSize(text, &size) == NULL) {   /* (a lone surrogate) */
        PyErr_Clear();
        return -1;
    }
    return size;
}

/* read_batch_body(raw, max_messages, max_message_bytes[, max_properties_bytes=32767]) ->
 * (items, body_bytes) | None: a SEND_BATCH_MESSAGE body (an array of [properties, flag, body])
 * when it is plainly well formed: 1..max_messages items, each a list of a dict of str to str
 * without DELAY or a TIMER_* key whose size as RocketMQ's properties string (UTF-8 key and value, 2 separators an
 * entry) is at most max_properties_bytes, an int (not a bool) within int32, and bytes that with
 * the properties make at most max_message_bytes. None for anything else: the broker's Python
 * check then names what is wrong (broker/processors/send_message.py decode_batch_py). */
static PyObject *
read_batch_body(PyObject *module, PyObject *args)
{
    Py_buffer raw;
    Py_ssize_t max_messages, max_body_bytes, max_properties_bytes = 32767;
    if (!PyArg_ParseTuple(args, "y*nn|n:read_batch_body", &raw, &max_messages, &max_body_bytes,
                          &max_properties_bytes))
        return NULL;
    if (key_delay == NULL && (key_delay = PyUnicode_InternFromString("DELAY")) == NULL) {
        PyBuffer_Release(&raw);
        return NULL;
    }
    if (key_timer[0] == NULL) {
        static const char *names[3] = {"TIMER_DELIVER_MS", "TIMER_DELAY_MS", "TIMER_DELAY_SEC"};
        for (int k = 0; k < 3; k++) {
            if ((key_timer[k] = PyUnicode_InternFromString(names[k])) == NULL) {
                PyBuffer_Release(&raw);
                return NULL;
            }
        }
    }
    PyObject *value = mp_read_all(raw.buf, raw.len);
    PyBuffer_Release(&raw);
    if (value == NULL)
        return NULL;
    if (value == MP_FALLBACK)
        Py_RETURN_NONE;
    Py_ssize_t count = PyList_CheckExact(value) ? PyList_GET_SIZE(value) : 0;
    if (count == 0 || count > max_messages)
        goto fallback;
    long long body_bytes = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(value, i);
        if (!PyList_CheckExact(item) || PyList_GET_SIZE(item) != 3)
            goto fallback;
        PyObject *properties = PyList_GET_ITEM(item, 0), *flag = PyList_GET_ITEM(item, 1);
        PyObject *body = PyList_GET_ITEM(item, 2);
        if (!PyDict_CheckExact(properties) || !PyLong_CheckExact(flag) || !PyBytes_CheckExact(body)
                || PyBytes_GET_SIZE(body) > max_body_bytes)
            goto fallback;
        int overflow;
        long long flag_value = PyLong_AsLongLongAndOverflow(flag, &overflow);
        if (overflow || flag_value < INT32_MIN || flag_value > INT32_MAX)
            goto fallback;
        Py_ssize_t pos = 0, properties_bytes = 0;
        PyObject *key, *text;
        while (PyDict_Next(properties, &pos, &key, &text)) {
            if (!PyUnicode_CheckExact(key) || !PyUnicode_CheckExact(text))
                goto fallback;
            Py_ssize_t key_bytes = utf8_length(key), text_bytes = utf8_length(text);
            if (key_bytes < 0 || text_bytes < 0)
                goto fallback;
            properties_bytes += key_bytes + text_bytes + 2;
            if (properties_bytes > max_properties_bytes)
                goto fallback;
        }
        if (PyBytes_GET_SIZE(body) > max_body_bytes - properties_bytes)
            goto fallback;
        int delayed = PyDict_Contains(properties, key_delay);
        for (int k = 0; k < 3 && delayed == 0; k++)
            delayed = PyDict_Contains(properties, key_timer[k]);
        if (delayed != 0) {
            if (delayed < 0)
                PyErr_Clear();
            goto fallback;
        }
        body_bytes += PyBytes_GET_SIZE(body);
    }
    return Py_BuildValue("(NL)", value, body_bytes);

fallback:
    Py_DECREF(value);
    Py_RETURN_NONE;
}

/* -- the usual single send ---------------------------------------------------------------- */

/* ext keys and property names `usual_send` reads (interned at its first call) */
static const char *const send_names[13] = {
    "topic", "queue_id", "producer_group", "flag", "born_timestamp", "reconsume_times", "properties",
    "max_reconsume_times", "DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_MS", "TIMER_DELAY_SEC", "DEDUP"};
static PyObject *send_keys[13];

/* The value of an exact int within lo..hi into *out: 1, 0 when it is not (no exception). */
static int
int_within(PyObject *value, long long lo, long long hi, long long *out)
{
    if (!PyLong_CheckExact(value))
        return 0;
    int overflow = 0;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (number == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = number;
    return lo <= number && number <= hi;
}

/* usual_send(fields, body, max_properties_bytes, max_message_bytes)
 *     -> (topic, queue_id, producer_group, flag, born_timestamp, reconsume_times, properties) | None
 *
 * The twin of broker/processors/usual_send.py's `usual_send_py` (its reference; the processor
 * tests and `make fuzz-twins` run both): a SEND_MESSAGE's ext map (`fields`, a dict) and body
 * when they are the usual send: topic and producer_group str, queue_id int, flag int32,
 * born_timestamp 0..int64 max, reconsume_times 0..int32 max (those three default to 0 when
 * absent), max_reconsume_times absent, None or int32, properties a dict of str to str with no DELAY,
 * TIMER_DELIVER_MS, TIMER_DELAY_MS, TIMER_DELAY_SEC or DEDUP key, body bytes, and 4 bytes a
 * character and 2 an entry of the properties within max_properties_bytes, and with the body
 * within max_message_bytes ("plainly within": the exact UTF-8 size is never larger). Ints are
 * exact ints (a bool is not one). None for anything else: the processor's typed path then checks
 * field by field and raises the protocol's errors. */
static PyObject *
usual_send(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "usual_send takes 4 arguments");
        return NULL;
    }
    Py_ssize_t max_properties_bytes = PyLong_AsSsize_t(args[2]);
    if (max_properties_bytes == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t max_message_bytes = PyLong_AsSsize_t(args[3]);
    if (max_message_bytes == -1 && PyErr_Occurred())
        return NULL;
    if (send_keys[0] == NULL) {
        for (int k = 0; k < 13; k++) {
            if ((send_keys[k] = PyUnicode_InternFromString(send_names[k])) == NULL)
                return NULL;
        }
    }
    PyObject *fields = args[0], *body = args[1];
    if (!PyDict_CheckExact(fields) || !PyBytes_CheckExact(body))
        Py_RETURN_NONE;
    PyObject *value[8];
    for (int k = 0; k < 8; k++) {
        value[k] = PyDict_GetItemWithError(fields, send_keys[k]);     /* borrowed */
        if (value[k] == NULL && PyErr_Occurred())
            return NULL;
    }
    PyObject *zero = NULL;
    long long number;
    PyObject *topic = value[0], *queue_id = value[1], *group = value[2], *properties = value[6];
    if (topic == NULL || !PyUnicode_CheckExact(topic) || queue_id == NULL || !PyLong_CheckExact(queue_id)
            || group == NULL || !PyUnicode_CheckExact(group) || properties == NULL || !PyDict_CheckExact(properties))
        Py_RETURN_NONE;
    if ((value[3] != NULL && !int_within(value[3], INT32_MIN, INT32_MAX, &number))
            || (value[4] != NULL && !int_within(value[4], 0, INT64_MAX, &number))
            || (value[5] != NULL && !int_within(value[5], 0, INT32_MAX, &number))
            || (value[7] != NULL && value[7] != Py_None && !int_within(value[7], INT32_MIN, INT32_MAX, &number)))
        Py_RETURN_NONE;
    for (int k = 8; k < 13; k++) {
        int found = PyDict_Contains(properties, send_keys[k]);
        if (found < 0)
            return NULL;
        if (found)
            Py_RETURN_NONE;
    }
    Py_ssize_t pos = 0;
    long long characters = 0;
    PyObject *key, *text;
    while (PyDict_Next(properties, &pos, &key, &text)) {
        if (!PyUnicode_CheckExact(key) || !PyUnicode_CheckExact(text))
            Py_RETURN_NONE;
        characters += PyUnicode_GET_LENGTH(key) + PyUnicode_GET_LENGTH(text);
    }
    long long size = 4 * characters + 2 * (long long)PyDict_GET_SIZE(properties);
    if (size > max_properties_bytes || (long long)PyBytes_GET_SIZE(body) + size > max_message_bytes)
        Py_RETURN_NONE;
    if ((value[3] == NULL || value[4] == NULL || value[5] == NULL) && (zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    PyObject *result = PyTuple_Pack(7, topic, queue_id, group, value[3] ? value[3] : zero,
                                    value[4] ? value[4] : zero, value[5] ? value[5] : zero, properties);
    Py_XDECREF(zero);
    return result;
}

static PyObject *key_msg_id, *key_queue_id, *key_queue_offset;

/* send_response(opaque, msg_id_prefix, commit_log_offset, queue_id, queue_offset) -> RemotingCommand | None
 *
 * The twin of broker/processors/usual_send.py's `send_response_py` (its reference): a stored
 * send's SUCCESS response, built as `decode_frames` builds commands (no dataclass __init__, no
 * format call): code 0 (SUCCESS), the request's opaque, flag FLAG_RESPONSE (1), no remark, ext
 * {"msg_id": msg_id_prefix + f"{commit_log_offset:016X}", "queue_id": queue_id, "queue_offset":
 * queue_offset} (in that order: the frame's bytes follow it), body b"", version 1. None (nothing
 * built) when `configure_frames` was not called, msg_id_prefix is not a str or commit_log_offset
 * not an int within 0..2**64-1: the twin builds it then. */
static PyObject *
send_response(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "send_response takes 5 arguments");
        return NULL;
    }
    PyObject *prefix = args[1], *commit_log_offset = args[2];
    if (!state.frames_configured || !PyUnicode_CheckExact(prefix) || !PyLong_CheckExact(commit_log_offset))
        Py_RETURN_NONE;
    unsigned long long offset = PyLong_AsUnsignedLongLong(commit_log_offset);
    if (offset == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return NULL;
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (key_msg_id == NULL) {
        if ((key_msg_id = PyUnicode_InternFromString("msg_id")) == NULL
                || (key_queue_id = PyUnicode_InternFromString("queue_id")) == NULL
                || (key_queue_offset = PyUnicode_InternFromString("queue_offset")) == NULL) {
            Py_CLEAR(key_msg_id);
            Py_CLEAR(key_queue_id);
            return NULL;
        }
    }
    PyObject *msg_id = msg_id_of(prefix, offset);
    if (msg_id == NULL)
        return NULL;
    PyObject *fields = PyDict_New();
    if (fields == NULL || PyDict_SetItem(fields, key_msg_id, msg_id) < 0
            || PyDict_SetItem(fields, key_queue_id, args[3]) < 0
            || PyDict_SetItem(fields, key_queue_offset, args[4]) < 0) {
        Py_DECREF(msg_id);
        Py_XDECREF(fields);
        return NULL;
    }
    Py_DECREF(msg_id);
    PyObject *code = PyLong_FromLong(0), *flag = PyLong_FromLong(1), *version = PyLong_FromLong(1);
    PyObject *body = PyBytes_FromStringAndSize(NULL, 0);
    PyTypeObject *type = state.command_type;
    PyObject *command = (code == NULL || flag == NULL || version == NULL || body == NULL) ? NULL
                        : type->tp_alloc(type, 0);
    if (command == NULL) {
        Py_XDECREF(code);
        Py_XDECREF(flag);
        Py_XDECREF(version);
        Py_XDECREF(body);
        Py_DECREF(fields);
        return NULL;
    }
    COMMAND_SLOT(command, C_CODE) = code;
    COMMAND_SLOT(command, C_OPAQUE) = Py_NewRef(args[0]);
    COMMAND_SLOT(command, C_FLAG) = flag;
    COMMAND_SLOT(command, C_VERSION) = version;
    COMMAND_SLOT(command, C_REMARK) = Py_NewRef(Py_None);
    COMMAND_SLOT(command, C_FIELDS) = fields;
    COMMAND_SLOT(command, C_BODY) = body;
    return command;
}

static PyObject *
offset_msg_ids(PyObject *module, PyObject *args)
{
    static const char digits[] = "0123456789ABCDEF";
    PyObject *prefix, *offsets;
    if (!PyArg_ParseTuple(args, "UO!:offset_msg_ids", &prefix, &PyList_Type, &offsets))
        return NULL;
    if (PyUnicode_GET_LENGTH(prefix) != 16 || !PyUnicode_IS_COMPACT_ASCII(prefix))
        Py_RETURN_NONE;
    const char *head = (const char *)PyUnicode_DATA(prefix);
    Py_ssize_t count = PyList_GET_SIZE(offsets);
    PyObject *ids = PyList_New(count);
    if (ids == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(offsets, i);
        if (!PyLong_CheckExact(item))
            goto fallback;
        unsigned long long offset = PyLong_AsUnsignedLongLong(item);
        if (offset == (unsigned long long)-1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
                Py_DECREF(ids);
                return NULL;
            }
            PyErr_Clear();                   /* negative or past 64 bits */
            goto fallback;
        }
        PyObject *id = PyUnicode_New(32, 127);
        if (id == NULL) {
            Py_DECREF(ids);
            return NULL;
        }
        char *out = (char *)PyUnicode_DATA(id);
        memcpy(out, head, 16);
        for (int d = 15; d >= 0; d--) {
            out[16 + d] = digits[offset & 0xF];
            offset >>= 4;
        }
        PyList_SET_ITEM(ids, i, id);
    }
    return ids;

fallback:
    Py_DECREF(ids);
    Py_RETURN_NONE;
}

/* -- canonical_bytes: what a request signature covers (protocol/signing.py) ---------------------- */

typedef struct {
    unsigned char *data;
    Py_ssize_t length, capacity;
} growbuf;

#define CANONICAL_MAX_DEPTH 32

/* Room for `more` bytes after the end; -1 (MemoryError set) when there is none. */
static int
grow(growbuf *buf, Py_ssize_t more)
{
    if (buf->length + more <= buf->capacity)
        return 0;
    Py_ssize_t capacity = buf->capacity ? buf->capacity : 512;
    while (capacity < buf->length + more)
        capacity *= 2;
    unsigned char *data = PyMem_Realloc(buf->data, (size_t)capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    buf->data = data;
    buf->capacity = capacity;
    return 0;
}

/* Each writer returns 0 (written), 1 (not a plain value: the twin packs it) or -1 (an error set). */
static int canonical_value(growbuf *buf, PyObject *value, int depth);

static int
canonical_str(growbuf *buf, PyObject *text)
{
    Py_ssize_t length;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &length);
    if (utf8 == NULL) {          /* lone surrogates: msgpack's own error, from the twin */
        PyErr_Clear();
        return 1;
    }
    if (grow(buf, length + 5) < 0)
        return -1;
    unsigned char *out = put_str_header(buf->data + buf->length, length);
    memcpy(out, utf8, (size_t)length);
    buf->length = (out - buf->data) + length;
    return 0;
}

/* canonical_map for a dict of more than CANONICAL_SMALL_MAP items: its keys listed and sorted by Python. */
static int
canonical_large_map(growbuf *buf, PyObject *map, PyObject *skip, int depth)
{
    PyObject *keys = PyDict_Keys(map);
    if (keys == NULL)
        return -1;
    int result = 1;
    Py_ssize_t count = PyList_GET_SIZE(keys), kept = count;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (!PyUnicode_CheckExact(key))
            goto done;
        if (skip != NULL && PyUnicode_Compare(key, skip) == 0)
            kept--;
    }
    if (PyList_Sort(keys) < 0) {
        result = -1;
        goto done;
    }
    if (grow(buf, 5) < 0) {
        result = -1;
        goto done;
    }
    buf->length = put_map_header(buf->data + buf->length, kept) - buf->data;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (skip != NULL && PyUnicode_Compare(key, skip) == 0)
            continue;
        PyObject *value = PyDict_GetItemWithError(map, key);
        if (value == NULL) {
            result = PyErr_Occurred() ? -1 : 1;
            goto done;
        }
        int written = canonical_str(buf, key);
        if (written == 0)
            written = canonical_value(buf, value, depth + 1);
        if (written != 0) {
            result = written;
            goto done;
        }
    }
    result = 0;
done:
    Py_DECREF(keys);
    return result;
}

#define CANONICAL_SMALL_MAP 32

typedef struct {
    const char *utf8;
    Py_ssize_t length;
    PyObject *value;
} map_item;

/* -1, 0 or 1 as a's UTF-8 bytes sort before, as or after b's (UTF-8's byte order is code point order). */
static int
compare_utf8(const char *a, Py_ssize_t a_length, const char *b, Py_ssize_t b_length)
{
    int order = memcmp(a, b, (size_t)(a_length < b_length ? a_length : b_length));
    return order != 0 ? order : (a_length > b_length) - (a_length < b_length);
}

/* A dict with its str keys sorted by code point (as Python sorts str), without `skip` (NULL: none).
 * Up to CANONICAL_SMALL_MAP items (every request's ext) sorted here by insertion, on their UTF-8
 * bytes; no Python code runs meanwhile, so the borrowed keys and values stay. */
static int
canonical_map(growbuf *buf, PyObject *map, PyObject *skip, int depth)
{
    if (PyDict_GET_SIZE(map) > CANONICAL_SMALL_MAP)
        return canonical_large_map(buf, map, skip, depth);
    const char *skip_utf8 = NULL;
    Py_ssize_t skip_length = 0;
    if (skip != NULL && (skip_utf8 = PyUnicode_AsUTF8AndSize(skip, &skip_length)) == NULL)
        return -1;
    map_item items[CANONICAL_SMALL_MAP];
    Py_ssize_t position = 0, kept = 0;
    PyObject *key, *value;
    while (PyDict_Next(map, &position, &key, &value)) {
        if (!PyUnicode_CheckExact(key))
            return 1;
        Py_ssize_t length;
        const char *utf8 = PyUnicode_AsUTF8AndSize(key, &length);
        if (utf8 == NULL) {          /* lone surrogates: msgpack's own error, from the twin */
            PyErr_Clear();
            return 1;
        }
        if (skip_utf8 != NULL && length == skip_length && memcmp(utf8, skip_utf8, (size_t)length) == 0)
            continue;
        if (kept == CANONICAL_SMALL_MAP)     /* (cannot happen: the size was checked) */
            return 1;
        Py_ssize_t at = kept++;
        while (at > 0 && compare_utf8(items[at - 1].utf8, items[at - 1].length, utf8, length) > 0) {
            items[at] = items[at - 1];
            at--;
        }
        items[at] = (map_item){utf8, length, value};
    }
    if (grow(buf, 5) < 0)
        return -1;
    buf->length = put_map_header(buf->data + buf->length, kept) - buf->data;
    for (Py_ssize_t i = 0; i < kept; i++) {
        if (grow(buf, items[i].length + 5) < 0)
            return -1;
        unsigned char *out = put_str_header(buf->data + buf->length, items[i].length);
        memcpy(out, items[i].utf8, (size_t)items[i].length);
        buf->length = (out - buf->data) + items[i].length;
        int written = canonical_value(buf, items[i].value, depth + 1);
        if (written != 0)
            return written;
    }
    return 0;
}

static int
canonical_value(growbuf *buf, PyObject *value, int depth)
{
    if (depth > CANONICAL_MAX_DEPTH)
        return 1;
    if (PyUnicode_CheckExact(value))
        return canonical_str(buf, value);
    if (grow(buf, 9) < 0)
        return -1;
    unsigned char *out = buf->data + buf->length;
    if (value == Py_True || value == Py_False || value == Py_None) {
        *out++ = value == Py_None ? 0xC0 : value == Py_True ? 0xC3 : 0xC2;
    } else if (PyLong_CheckExact(value)) {
        out = put_int(out, value);
        if (out == NULL)
            return 1;
    } else if (PyFloat_CheckExact(value)) {
        double number = PyFloat_AS_DOUBLE(value);
        uint64_t bits;
        memcpy(&bits, &number, sizeof bits);
        *out++ = 0xCB;
        out = put_be(out, bits, 8);
    } else if (PyBytes_CheckExact(value)) {
        Py_ssize_t length = PyBytes_GET_SIZE(value);
        if (grow(buf, length + 5) < 0)
            return -1;
        out = put_bin_header(buf->data + buf->length, length);
        memcpy(out, PyBytes_AS_STRING(value), (size_t)length);
        out += length;
    } else if (PyDict_CheckExact(value)) {
        return canonical_map(buf, value, NULL, depth);
    } else if (PyList_CheckExact(value) || PyTuple_CheckExact(value)) {
        Py_ssize_t count = PySequence_Fast_GET_SIZE(value);
        buf->length = put_sized_header(out, count, 0x90, 0x0F, 0xDB, 0) - buf->data;
        for (Py_ssize_t i = 0; i < count; i++) {   /* (an item could change the list: re-read it) */
            if (i >= PySequence_Fast_GET_SIZE(value))
                return 1;
            int written = canonical_value(buf, PySequence_Fast_GET_ITEM(value, i), depth + 1);
            if (written != 0)
                return written;
        }
        return 0;
    } else {
        return 1;
    }
    buf->length = out - buf->data;
    return 0;
}

/* The canonical bytes into `buf`: 0, 1 (the twin packs it) or -1 (an error set). */
static int
canonical_into(growbuf *buf, PyObject *scheme, PyObject *code, PyObject *fields, PyObject *skip, PyObject *digest)
{
    if (!PyDict_CheckExact(fields) || !PyLong_CheckExact(code))
        return 1;
    int written = grow(buf, 1) < 0 ? -1 : 0;
    if (written == 0) {
        buf->data[buf->length++] = 0x94;
        written = canonical_str(buf, scheme);
    }
    if (written == 0)
        written = canonical_value(buf, code, 0);
    if (written == 0)
        written = canonical_map(buf, fields, skip, 0);
    if (written == 0)
        written = canonical_value(buf, digest, 0);
    return written;
}

static PyObject *
canonical_bytes(PyObject *module, PyObject *args)
{
    PyObject *scheme, *code, *fields, *skip, *digest;
    if (!PyArg_ParseTuple(args, "UOOUS:canonical_bytes", &scheme, &code, &fields, &skip, &digest))
        return NULL;
    growbuf buf = {NULL, 0, 0};
    int written = canonical_into(&buf, scheme, code, fields, skip, digest);
    PyObject *result = NULL;
    if (written == 0)
        result = PyBytes_FromStringAndSize((const char *)buf.data, buf.length);
    else if (written > 0)
        result = Py_NewRef(Py_None);
    PyMem_Free(buf.data);
    return result;
}

/* -- sign_fields, signature_matches: a request's whole signature in one call (protocol/signing.py) - */

/* OpenSSL's SHA256_CTX (its public, stable layout), with room to spare; the functions are found at
 * configure_signing in the libcrypto CPython's hashlib loaded (no headers or link needed). */
typedef struct {
    unsigned int h[8], Nl, Nh, data[16], num, md_len;
    unsigned char spare[64];
} sha256_ctx;
typedef int (*sha256_init_function)(sha256_ctx *);
typedef int (*sha256_update_function)(sha256_ctx *, const void *, size_t);
typedef int (*sha256_final_function)(unsigned char *, sha256_ctx *);
static sha256_init_function sha256_init;
static sha256_update_function sha256_update;
static sha256_final_function sha256_final;

/* configure_signing's: the scheme and the four auth field names. */
static PyObject *sig_scheme, *sig_access_key, *sig_timestamp, *sig_nonce, *sig_signature;

/* The SHA-256 states after the last key's ipad and opad blocks (RFC 2104), copied for each
 * signature; a client signs with one key, a broker mostly sees a few. (The GIL guards them.) */
static unsigned char pads_key[64];
static Py_ssize_t pads_key_length = -1;
static sha256_ctx pads_inner, pads_outer;

static PyObject *
configure_signing(PyObject *module, PyObject *args)
{
    PyObject *scheme, *access_key, *timestamp, *nonce, *signature;
    if (!PyArg_ParseTuple(args, "UUUUU:configure_signing", &scheme, &access_key, &timestamp, &nonce, &signature))
        return NULL;
    if (sha256_final == NULL) {
        static const char *const libraries[] = {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so"};
        for (size_t i = 0; i < sizeof libraries / sizeof *libraries && sha256_final == NULL; i++) {
            void *library = dlopen(libraries[i], RTLD_NOW | RTLD_LOCAL);
            if (library == NULL)
                continue;
            sha256_init = (sha256_init_function)dlsym(library, "SHA256_Init");
            sha256_update = (sha256_update_function)dlsym(library, "SHA256_Update");
            sha256_final = (sha256_final_function)dlsym(library, "SHA256_Final");
            if (sha256_init == NULL || sha256_update == NULL)
                sha256_final = NULL;
        }
    }
    Py_XSETREF(sig_scheme, Py_NewRef(scheme));
    Py_XSETREF(sig_access_key, Py_NewRef(access_key));
    Py_XSETREF(sig_timestamp, Py_NewRef(timestamp));
    Py_XSETREF(sig_nonce, Py_NewRef(nonce));
    Py_XSETREF(sig_signature, Py_NewRef(signature));
    pads_key_length = -1;
    return PyBool_FromLong(sha256_final != NULL);
}

/* Hash one body part: 0, or 1 when it is not a plain contiguous buffer (the twin digests it). */
static int
digest_part(sha256_ctx *ctx, PyObject *part)
{
    if (!PyBytes_CheckExact(part) && !PyByteArray_CheckExact(part) && !PyMemoryView_Check(part))
        return 1;
    Py_buffer view;
    if (PyObject_GetBuffer(part, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return 1;
    }
    sha256_update(ctx, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return 0;
}

/* The body's SHA-256 digest into `digest`, as signing.py's _digest: 0, or 1 (the twin digests it). */
static int
body_digest(PyObject *body, unsigned char digest[32])
{
    sha256_ctx ctx;
    sha256_init(&ctx);
    if (PyList_CheckExact(body) || PyTuple_CheckExact(body)) {
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(body); i++)
            if (digest_part(&ctx, PySequence_Fast_GET_ITEM(body, i)) != 0)
                return 1;
    } else if (digest_part(&ctx, body) != 0) {
        return 1;
    }
    sha256_final(digest, &ctx);
    return 0;
}

static void
load_pads(const unsigned char *key, Py_ssize_t length)
{
    if (length == pads_key_length && memcmp(key, pads_key, (size_t)length) == 0)
        return;
    unsigned char block[64] = {0}, inner[64], outer[64];
    if (length > 64) {
        sha256_ctx ctx;
        sha256_init(&ctx);
        sha256_update(&ctx, key, (size_t)length);
        sha256_final(block, &ctx);
    } else {
        memcpy(block, key, (size_t)length);
    }
    for (int i = 0; i < 64; i++) {
        inner[i] = block[i] ^ 0x36;
        outer[i] = block[i] ^ 0x5C;
    }
    sha256_init(&pads_inner);
    sha256_update(&pads_inner, inner, 64);
    sha256_init(&pads_outer);
    sha256_update(&pads_outer, outer, 64);
    pads_key_length = length <= 64 ? length : -1;
    if (length <= 64)
        memcpy(pads_key, key, (size_t)length);
}

/* The signature of (code, fields, body) under `key` (bytes): 0 with `hex` (64 lower-case hex
 * digits) written, 1 (the twin signs: not plain values, another body or key type) or -1 (an error set). */
static int
signature_hex(PyObject *code, PyObject *fields, PyObject *body, PyObject *key, char hex[64])
{
    if (sha256_final == NULL || !PyBytes_CheckExact(key) || !PyDict_CheckExact(fields) || !PyLong_CheckExact(code))
        return 1;
    unsigned char digest[32];
    if (body_digest(body, digest) != 0)
        return 1;
    PyObject *digest_bytes = PyBytes_FromStringAndSize((const char *)digest, 32);
    if (digest_bytes == NULL)
        return -1;
    growbuf buf = {NULL, 0, 0};
    int written = canonical_into(&buf, sig_scheme, code, fields, sig_signature, digest_bytes);
    Py_DECREF(digest_bytes);
    if (written == 0) {
        load_pads((const unsigned char *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
        sha256_ctx ctx = pads_inner;
        sha256_update(&ctx, buf.data, (size_t)buf.length);
        sha256_final(digest, &ctx);
        ctx = pads_outer;
        sha256_update(&ctx, digest, 32);
        sha256_final(digest, &ctx);
        static const char digits[] = "0123456789abcdef";
        for (int i = 0; i < 32; i++) {
            hex[2 * i] = digits[digest[i] >> 4];
            hex[2 * i + 1] = digits[digest[i] & 15];
        }
    }
    PyMem_Free(buf.data);
    return written;
}

static PyObject *
sign_fields(PyObject *module, PyObject *args)
{
    PyObject *fields, *code, *body, *access_key, *timestamp_ms, *nonce, *key;
    if (!PyArg_ParseTuple(args, "O!OOOOOO:sign_fields", &PyDict_Type, &fields, &code, &body, &access_key,
                          &timestamp_ms, &nonce, &key))
        return NULL;
    if (sig_scheme == NULL || sha256_final == NULL)
        Py_RETURN_FALSE;
    if (PyDict_SetItem(fields, sig_access_key, access_key) < 0 || PyDict_SetItem(fields, sig_timestamp,
            timestamp_ms) < 0 || PyDict_SetItem(fields, sig_nonce, nonce) < 0)
        return NULL;
    int present = PyDict_Contains(fields, sig_signature);
    if (present < 0 || (present && PyDict_DelItem(fields, sig_signature) < 0))
        return NULL;
    char hex[64];
    int written = signature_hex(code, fields, body, key, hex);
    if (written < 0)
        return NULL;
    if (written > 0)
        Py_RETURN_FALSE;
    PyObject *text = PyUnicode_FromStringAndSize(hex, 64);
    if (text == NULL)
        return NULL;
    int stored = PyDict_SetItem(fields, sig_signature, text);
    Py_DECREF(text);
    if (stored < 0)
        return NULL;
    Py_RETURN_TRUE;
}

/* Does fields' auth_signature sign (code, fields, body) under `key`? 1 yes, 0 no (also: missing, not
 * 64 ASCII characters), 2 (the twin decides: a str subclass, or what signature_hex hands over) or
 * -1 (an error set). */
static int
claimed_matches(PyObject *code, PyObject *fields, PyObject *body, PyObject *key)
{
    PyObject *claimed = PyDict_GetItemWithError(fields, sig_signature);
    if (claimed == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyUnicode_CheckExact(claimed))
        return PyUnicode_Check(claimed) ? 2 : 0;
    if (PyUnicode_GET_LENGTH(claimed) != 64 || !PyUnicode_IS_ASCII(claimed))
        return 0;
    Py_INCREF(claimed);
    char hex[64];
    int written = signature_hex(code, fields, body, key, hex);
    int matched = written < 0 ? -1 : 2;
    if (written == 0) {
        const unsigned char *given = PyUnicode_1BYTE_DATA(claimed);
        unsigned char difference = 0;
        for (int i = 0; i < 64; i++)         /* constant time, as hmac.compare_digest */
            difference |= (unsigned char)((unsigned char)hex[i] ^ given[i]);
        matched = difference == 0;
    }
    Py_DECREF(claimed);
    return matched;
}

static PyObject *
signature_matches(PyObject *module, PyObject *args)
{
    PyObject *code, *fields, *body, *key;
    if (!PyArg_ParseTuple(args, "OOOO:signature_matches", &code, &fields, &body, &key))
        return NULL;
    if (sig_scheme == NULL || sha256_final == NULL || !PyDict_CheckExact(fields))
        Py_RETURN_NONE;
    int matched = claimed_matches(code, fields, body, key);
    if (matched < 0)
        return NULL;
    if (matched == 2)
        Py_RETURN_NONE;
    return PyBool_FromLong(matched);
}

/* Reasons check_signed gives (auth/authenticate.py AuthenticationFailed.reason). */
static PyObject *
reason(const char *text)
{
    return PyUnicode_FromString(text);
}

static PyObject *
check_signed(PyObject *module, PyObject *args)
{
    PyObject *code, *fields, *body, *users;
    if (!PyArg_ParseTuple(args, "OOOO:check_signed", &code, &fields, &body, &users))
        return NULL;
    if (sig_scheme == NULL || sha256_final == NULL || !PyDict_CheckExact(fields))
        Py_RETURN_NONE;
    PyObject *username = PyDict_GetItemWithError(fields, sig_access_key), *timestamp, *nonce;
    if (username == NULL || username == Py_None)
        return PyErr_Occurred() ? NULL : reason("no credentials");
    if ((timestamp = PyDict_GetItemWithError(fields, sig_timestamp)) == NULL && PyErr_Occurred())
        return NULL;
    if ((nonce = PyDict_GetItemWithError(fields, sig_nonce)) == NULL && PyErr_Occurred())
        return NULL;
    if (!PyUnicode_Check(username) || timestamp == NULL || !PyLong_CheckExact(timestamp) || nonce == NULL
            || !PyUnicode_Check(nonce) || PyUnicode_GET_LENGTH(nonce) < 8 || PyUnicode_GET_LENGTH(nonce) > 64)
        return reason("malformed");
    Py_INCREF(username);
    PyObject *user = PyObject_CallOneArg(users, username);
    Py_DECREF(username);
    if (user == NULL)
        return NULL;
    if (user == Py_None) {
        Py_DECREF(user);
        return reason("unknown user");
    }
    PyObject *key = PyObject_GetAttrString(user, "signing_key");
    if (key == NULL) {
        Py_DECREF(user);
        return NULL;
    }
    int matched = claimed_matches(code, fields, body, key);
    Py_DECREF(key);
    if (matched == 1)
        return user;
    Py_DECREF(user);
    if (matched < 0)
        return NULL;
    if (matched == 2)
        Py_RETURN_NONE;
    return reason("bad signature");
}

static PyMethodDef methods[] = {
    {"send_response", (PyCFunction)(void (*)(void))send_response, METH_FASTCALL,
     "send_response(opaque, msg_id_prefix, commit_log_offset, queue_id, queue_offset) -> RemotingCommand | None: "
     "a stored send's SUCCESS response (see broker/processors/usual_send.py)."},
    {"usual_send", (PyCFunction)(void (*)(void))usual_send, METH_FASTCALL,
     "usual_send(fields, body, max_properties_bytes, max_message_bytes) -> (topic, queue_id, producer_group, "
     "flag, born_timestamp, reconsume_times, properties) | None: the usual SEND_MESSAGE's fields "
     "(see broker/processors/usual_send.py)."},
    {"read_batch_body", read_batch_body, METH_VARARGS,
     "read_batch_body(raw, max_messages, max_message_bytes[, max_properties_bytes]) -> (items, body_bytes) | None."},
    {"offset_msg_ids", offset_msg_ids, METH_VARARGS,
     "offset_msg_ids(prefix, commit_log_offsets) -> list[str] | None: a batch's offset message ids."},
    {"configure_frames", configure_frames, METH_VARARGS,
     "configure_frames(command_type, frame_error, check_header): the frame functions' classes."},
    {"decode_frames", decode_frames, METH_VARARGS,
     "decode_frames(buffer, max_frame_bytes[, max_commands]) -> (commands, consumed); raises FrameError."},
    {"frame_bytes", frame_bytes, METH_VARARGS,
     "frame_bytes(command, max_body_bytes) -> bytes of the whole frame, or None when the Python "
     "version must encode it."},
    {"configure", configure, METH_VARARGS,
     "configure(message_type, msg_id_prefix, protocol_error): the classes and function to use."},
    {"canonical_bytes", canonical_bytes, METH_VARARGS,
     "canonical_bytes(scheme, code, fields, skip_key, digest) -> bytes | None: what a signature covers."},
    {"configure_signing", configure_signing, METH_VARARGS,
     "configure_signing(scheme, access_key, timestamp, nonce, signature) -> bool: the field names; False when no "
     "libcrypto SHA-256 was found (sign_fields and signature_matches then leave it to the twins)."},
    {"sign_fields", sign_fields, METH_VARARGS,
     "sign_fields(fields, code, body, access_key, timestamp_ms, nonce, key) -> bool: signed "
     "in place (False: the twin must sign)."},
    {"signature_matches", signature_matches, METH_VARARGS,
     "signature_matches(code, fields, body, key) -> bool | None: None when the twin must check."},
    {"check_signed", check_signed, METH_VARARGS,
     "check_signed(code, fields, body, users) -> user | str | None: the signer, why not, or None (the twin decides)."},
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
