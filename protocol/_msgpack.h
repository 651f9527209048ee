/* protocol/_msgpack.h: the msgpack reading and writing shared by rocketq's C modules
 * (protocol/_speedups.c, broker/store/_records.c). Static functions, included by each. */

#ifndef ROCKETQ_MSGPACK_H
#define ROCKETQ_MSGPACK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* -- msgpack reading ------------------------------------------------------------------------------
 *
 * mp_read decodes one value of the types rocketq's headers and messages use (nil, bools, ints,
 * floats, str, bin, arrays, maps) as msgpack.unpackb(raw=False, strict_map_key=False) would: the
 * same objects, str map keys interned. Anything else (an ext type, a byte msgpack never writes,
 * invalid UTF-8, a length past the end, nesting deeper than MP_MAX_DEPTH, an unhashable key) makes
 * it give up with MP_FALLBACK and no exception set: the caller then asks msgpack itself, which
 * decodes it or raises its own error. So results and errors are msgpack's by construction. */

#define MP_MAX_DEPTH 64
static int MP_FALLBACK_MARK __attribute__((unused));
#define MP_FALLBACK ((PyObject *)&MP_FALLBACK_MARK)

typedef struct {
    const unsigned char *p, *end;
} mp_reader;

static inline int
mp_take(mp_reader *r, Py_ssize_t n, const unsigned char **out)
{
    if (r->end - r->p < n)
        return -1;
    *out = r->p;
    r->p += n;
    return 0;
}

static inline uint64_t
mp_be(const unsigned char *p, int n)
{
    uint64_t value = 0;
    for (int i = 0; i < n; i++)
        value = (value << 8) | p[i];
    return value;
}

static inline PyObject *mp_read(mp_reader *r, int depth);

/* A container or string length of `n` bytes, or -1 when the input ends first. */
static inline Py_ssize_t
mp_length(mp_reader *r, int n)
{
    const unsigned char *b;
    if (mp_take(r, n, &b) < 0)
        return -1;
    return (Py_ssize_t)mp_be(b, n);
}

static inline PyObject *
mp_str(mp_reader *r, Py_ssize_t n)
{
    const unsigned char *b;
    if (n < 0 || mp_take(r, n, &b) < 0)
        return MP_FALLBACK;
    PyObject *text = PyUnicode_DecodeUTF8((const char *)b, n, NULL);
    if (text == NULL) {            /* msgpack raises its own UnicodeDecodeError */
        PyErr_Clear();
        return MP_FALLBACK;
    }
    return text;
}

static inline PyObject *
mp_bin(mp_reader *r, Py_ssize_t n)
{
    const unsigned char *b;
    if (n < 0 || mp_take(r, n, &b) < 0)
        return MP_FALLBACK;
    return PyBytes_FromStringAndSize((const char *)b, n);
}

static inline PyObject *
mp_array(mp_reader *r, Py_ssize_t n, int depth)
{
    if (n < 0 || n > r->end - r->p || depth >= MP_MAX_DEPTH)
        return MP_FALLBACK;
    PyObject *list = PyList_New(n);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = mp_read(r, depth + 1);
        if (item == NULL || item == MP_FALLBACK) {
            Py_DECREF(list);
            return item;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

/* dict[key] = value, taking both references; -1 with an exception (the dict is the caller's). */
static inline int
mp_dict_put(PyObject *dict, PyObject *key, PyObject *value)
{
    int failed = PyDict_SetItem(dict, key, value);
    Py_DECREF(key);
    Py_DECREF(value);
    return failed;
}

/* The str map keys seen last, by their bytes: a header's dozen keys (and a message's property
 * names) recur in every frame, and decoding and interning each cost ~400 instructions, a lookup
 * here ~60. Direct-mapped, MP_KEY_SLOTS slots, each an interned str (a reference) and its UTF-8 bytes;
 * keys of 1..MP_KEY_MAX bytes written as fixstr. Only touched with the GIL held (every caller
 * makes Python objects). One cache per C module including this header. */
#define MP_KEY_SLOTS 256
#define MP_KEY_MAX 31
typedef struct {
    PyObject *str;
    unsigned char length;
    unsigned char bytes[MP_KEY_MAX];
} mp_key_slot;
static mp_key_slot mp_key_cache[MP_KEY_SLOTS];

static inline mp_key_slot *
mp_key_slot_of(const unsigned char *b, Py_ssize_t n)
{
    uint32_t hash = 2166136261u;                    /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++)
        hash = (hash ^ b[i]) * 16777619u;
    return &mp_key_cache[(hash ^ (hash >> 16)) & (MP_KEY_SLOTS - 1)];
}

/* An interned str map key (a new reference), MP_FALLBACK or NULL as mp_read. */
static inline PyObject *
mp_key(mp_reader *r, int depth)
{
    if (r->p < r->end && *r->p >= 0xA1 && *r->p <= 0xA0 + MP_KEY_MAX) {
        Py_ssize_t n = *r->p & 0x1F;
        if (r->end - r->p > n) {
            const unsigned char *b = r->p + 1;
            mp_key_slot *slot = mp_key_slot_of(b, n);
            if (slot->str != NULL && slot->length == n && memcmp(slot->bytes, b, (size_t)n) == 0) {
                r->p += 1 + n;
                Py_INCREF(slot->str);
                return slot->str;
            }
            r->p += 1;
            PyObject *key = mp_str(r, n);
            if (key == NULL || key == MP_FALLBACK)
                return key;
            PyUnicode_InternInPlace(&key);
            Py_INCREF(key);
            Py_XSETREF(slot->str, key);
            slot->length = (unsigned char)n;
            memcpy(slot->bytes, b, (size_t)n);
            return key;
        }
    }
    PyObject *key = mp_read(r, depth + 1);
    if (key != NULL && key != MP_FALLBACK && PyUnicode_CheckExact(key))
        PyUnicode_InternInPlace(&key);
    return key;
}

static inline PyObject *
mp_map(mp_reader *r, Py_ssize_t n, int depth)
{
    if (n < 0 || n > (r->end - r->p) / 2 || depth >= MP_MAX_DEPTH)
        return MP_FALLBACK;
    PyObject *dict = _PyDict_NewPresized(n);
    if (dict == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = mp_key(r, depth);
        if (key == NULL || key == MP_FALLBACK) {
            Py_DECREF(dict);
            return key;
        }
        if (!PyUnicode_CheckExact(key) && !PyLong_CheckExact(key) && !PyBytes_CheckExact(key) && key != Py_None
                && !PyBool_Check(key) && !PyFloat_CheckExact(key)) {
            Py_DECREF(key);          /* a list or dict key: msgpack's own TypeError */
            Py_DECREF(dict);
            return MP_FALLBACK;
        }
        PyObject *value = mp_read(r, depth + 1);
        if (value == NULL || value == MP_FALLBACK) {
            Py_DECREF(key);
            Py_DECREF(dict);
            return value;
        }
        if (mp_dict_put(dict, key, value) < 0) {
            Py_DECREF(dict);
            return NULL;
        }
    }
    return dict;
}

static inline PyObject *
mp_read(mp_reader *r, int depth)
{
    const unsigned char *b;
    if (mp_take(r, 1, &b) < 0)
        return MP_FALLBACK;
    unsigned char tag = b[0];
    if (tag <= 0x7F)
        return PyLong_FromLong(tag);
    if (tag >= 0xE0)
        return PyLong_FromLong((long)(signed char)tag);
    if (tag >= 0xA0 && tag <= 0xBF)
        return mp_str(r, tag & 0x1F);
    if (tag >= 0x90 && tag <= 0x9F)
        return mp_array(r, tag & 0x0F, depth);
    if (tag >= 0x80 && tag <= 0x8F)
        return mp_map(r, tag & 0x0F, depth);
    switch (tag) {
    case 0xC0:
        Py_RETURN_NONE;
    case 0xC2:
        Py_RETURN_FALSE;
    case 0xC3:
        Py_RETURN_TRUE;
    case 0xC4: case 0xC5: case 0xC6:
        return mp_bin(r, mp_length(r, 1 << (tag - 0xC4)));
    case 0xCA: {
        if (mp_take(r, 4, &b) < 0)
            return MP_FALLBACK;
        uint32_t bits = (uint32_t)mp_be(b, 4);
        float value;
        memcpy(&value, &bits, 4);
        return PyFloat_FromDouble((double)value);
    }
    case 0xCB: {
        if (mp_take(r, 8, &b) < 0)
            return MP_FALLBACK;
        uint64_t bits = mp_be(b, 8);
        double value;
        memcpy(&value, &bits, 8);
        return PyFloat_FromDouble(value);
    }
    case 0xCC: case 0xCD: case 0xCE: case 0xCF: {
        int n = 1 << (tag - 0xCC);
        if (mp_take(r, n, &b) < 0)
            return MP_FALLBACK;
        return PyLong_FromUnsignedLongLong(mp_be(b, n));
    }
    case 0xD0: case 0xD1: case 0xD2: case 0xD3: {
        int n = 1 << (tag - 0xD0);
        if (mp_take(r, n, &b) < 0)
            return MP_FALLBACK;
        uint64_t bits = mp_be(b, n);
        int shift = 64 - 8 * n;
        return PyLong_FromLongLong((long long)(bits << shift) >> shift);
    }
    case 0xD9: case 0xDA: case 0xDB:
        return mp_str(r, mp_length(r, 1 << (tag - 0xD9)));
    case 0xDC: case 0xDD:
        return mp_array(r, mp_length(r, 2 << (tag - 0xDC)), depth);
    case 0xDE: case 0xDF:
        return mp_map(r, mp_length(r, 2 << (tag - 0xDE)), depth);
    default:                        /* ext types, 0xC1 */
        return MP_FALLBACK;
    }
}

/* unpackb(data) when the whole buffer is one value of the types above; else MP_FALLBACK (no
 * exception) or NULL (an exception, e.g. out of memory). */
static inline PyObject *
mp_read_all(const unsigned char *data, Py_ssize_t length)
{
    mp_reader reader = {data, data + length};
    PyObject *value = mp_read(&reader, 0);
    if (value == NULL || value == MP_FALLBACK)
        return value;
    if (reader.p != reader.end) {       /* msgpack's ExtraData */
        Py_DECREF(value);
        return MP_FALLBACK;
    }
    return value;
}

/* -- msgpack writing, as msgpack's Packer(use_bin_type=True) writes these types --------------- */

static inline unsigned char *
put_be(unsigned char *out, uint64_t value, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--) {
        out[i] = (unsigned char)(value & 0xFF);
        value >>= 8;
    }
    return out + bytes;
}

/* An int the way msgpack packs it; NULL (nothing written) when it is not a 64-bit int. */
static inline unsigned char *
put_int(unsigned char *out, PyObject *number)
{
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(number, &overflow);
    if (value == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    if (overflow > 0) {
        unsigned long long big = PyLong_AsUnsignedLongLong(number);
        if (big == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return NULL;
        }
        *out++ = 0xCF;
        return put_be(out, big, 8);
    }
    if (overflow < 0)
        return NULL;
    if (value >= 0) {
        if (value < 0x80) {
            *out++ = (unsigned char)value;
            return out;
        }
        if (value <= 0xFF) {
            *out++ = 0xCC;
            return put_be(out, (uint64_t)value, 1);
        }
        if (value <= 0xFFFF) {
            *out++ = 0xCD;
            return put_be(out, (uint64_t)value, 2);
        }
        if (value <= 0xFFFFFFFFLL) {
            *out++ = 0xCE;
            return put_be(out, (uint64_t)value, 4);
        }
        *out++ = 0xCF;
        return put_be(out, (uint64_t)value, 8);
    }
    if (value >= -0x20) {
        *out++ = (unsigned char)(value & 0xFF);
        return out;
    }
    if (value >= -0x80) {
        *out++ = 0xD0;
        return put_be(out, (uint64_t)value, 1);
    }
    if (value >= -0x8000) {
        *out++ = 0xD1;
        return put_be(out, (uint64_t)value, 2);
    }
    if (value >= -0x80000000LL) {
        *out++ = 0xD2;
        return put_be(out, (uint64_t)value, 4);
    }
    *out++ = 0xD3;
    return put_be(out, (uint64_t)value, 8);
}

/* A str, bin or map header: the one-byte fix form up to `fix_max` (tag `fix_tag | length`, none
 * for bin), else the 8-, 16- or 32-bit length form (tags `tag8`, `tag8 + 1`, `tag8 + 2`; no 8-bit
 * form for maps), as msgpack's Packer(use_bin_type=True) chooses them. */
static inline unsigned char *
put_sized_header(unsigned char *out, Py_ssize_t length, int fix_tag, Py_ssize_t fix_max, int tag8, int has8)
{
    if (length <= fix_max) {
        *out++ = (unsigned char)(fix_tag | length);
        return out;
    }
    if (has8 && length <= 0xFF) {
        *out++ = (unsigned char)tag8;
        return put_be(out, (uint64_t)length, 1);
    }
    if (length <= 0xFFFF) {
        *out++ = (unsigned char)(tag8 + 1);
        return put_be(out, (uint64_t)length, 2);
    }
    *out++ = (unsigned char)(tag8 + 2);
    return put_be(out, (uint64_t)length, 4);
}

static inline unsigned char *
put_str_header(unsigned char *out, Py_ssize_t length)
{
    return put_sized_header(out, length, 0xA0, 0x1F, 0xD9, 1);
}

static inline unsigned char *
put_key(unsigned char *out, const char *key)
{
    size_t length = strlen(key);
    *out++ = (unsigned char)(0xA0 | length);
    memcpy(out, key, length);
    return out + length;
}


static inline unsigned char *
put_bin_header(unsigned char *out, Py_ssize_t length)
{
    return put_sized_header(out, length, 0, -1, 0xC4, 1);
}

static inline unsigned char *
put_map_header(unsigned char *out, Py_ssize_t count)
{
    return put_sized_header(out, count, 0x80, 0x0F, 0xDD, 0);     /* map16 0xDE, map32 0xDF */
}

#endif
