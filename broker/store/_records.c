/* broker.store._records: the commit-log records of a batch, encoded in C, its consume-queue units
 * written (`write_units`) and its messages' keys indexed (`KeyRing`), below `encode_run`.
 *
 * encode_run(head, messages, start, first_queue_offset, position, limit, crc32)
 *     -> (data, commit_log_offsets, sizes) | None
 *
 * The twin of broker/store/message_store.py's `encode_run_py` (its reference; the store tests run
 * both and compare the bytes): messages[start:] appended one after another from commit-log offset
 * `position`, each a record of broker/store/record.py (u32be total_size, u32be crc32(payload),
 * payload) whose payload is the stored message of protocol/message.py (a 13-field msgpack array,
 * byte for byte what msgpack's Packer(use_bin_type=True) writes):
 *
 *     [topic, queue_id, first_queue_offset + i, commit_log_offset, flag, sys_flag, born_timestamp,
 *      born_host, store_timestamp, store_host, reconsume_times, properties, body]
 *
 * `head` is (topic, queue_id, sys_flag, born_timestamp, born_host, store_timestamp, store_host,
 * reconsume_times); each message is (properties, flag, body). Encoding stops before the first
 * record that would end past `limit` (the end of the current commit-log file): the caller rolls to
 * the next file and calls again from there. `crc32` is zlib.crc32, called only when zlib's C
 * function could not be found at import (each record's CRC is then a Python call, 3 µs more for a
 * batch of 32). None when anything is not of the usual types (str topic and hosts, 64-bit ints, a
 * dict of str to str, bytes body): the Python twin then encodes the run, and raises what msgpack
 * raises.
 *
 * write_record(buffer, relative, limit, head, queue_offset, commit_log_offset, message, crc32)
 *     -> total_size | 0 | None
 *
 * One such record written straight into a commit-log file's map (the one-message send path; the
 * twin is record.py's `write_record_py`): see its comment below.
 *
 * read_stored(buffer, relative, limit, base, max_count, crc32) -> [entry, ...]
 *
 * The usual records of a commit-log file read back for reput (record.py's `read_stored_py`). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include "../../protocol/_msgpack.h"

#define HEADER_BYTES 8

typedef struct {
    unsigned char *data;
    Py_ssize_t length, capacity;
    unsigned char *stack;       /* a caller's stack buffer `data` starts as (NULL: none): never freed */
} out_buffer;

static int
reserve(out_buffer *out, Py_ssize_t more)
{
    if (out->length + more <= out->capacity)
        return 0;
    Py_ssize_t capacity = out->capacity ? out->capacity : 4096;
    while (capacity < out->length + more)
        capacity *= 2;
    unsigned char *grown;
    if (out->data != NULL && out->data == out->stack) {
        grown = PyMem_Malloc((size_t)capacity);
        if (grown != NULL)
            memcpy(grown, out->data, (size_t)out->length);
    } else {
        grown = PyMem_Realloc(out->data, (size_t)capacity);
    }
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    out->data = grown;
    out->capacity = capacity;
    return 0;
}

/* The UTF-8 of a str, or NULL (no exception) when it cannot be encoded (msgpack's own error). */
static const char *
utf8_of(PyObject *text, Py_ssize_t *length)
{
    if (!PyUnicode_CheckExact(text))
        return NULL;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, length);
    if (utf8 == NULL)
        PyErr_Clear();
    return utf8;
}

static int
is_int(PyObject *value)
{
    return PyLong_CheckExact(value);
}

/* zlib's crc32, found at import in the libz that CPython's zlib module uses (no headers or link
 * flags needed to build): NULL when it cannot be found, and the `crc32` callable is used. */
typedef unsigned long (*crc32_function)(unsigned long crc, const unsigned char *data, unsigned int length);
static crc32_function zlib_crc32 = NULL;

/* One record at the end of `out`; 1 when it was written, 0 when it is not of the usual types
 * (nothing written), -1 with an exception. */
static int
put_record(out_buffer *out, PyObject **head, PyObject *queue_offset, PyObject *commit_log_offset,
           PyObject *message, PyObject *crc32)
{
    if (!(PyTuple_CheckExact(message) || PyList_CheckExact(message)) || PySequence_Fast_GET_SIZE(message) != 3)
        return 0;
    PyObject **item = PySequence_Fast_ITEMS(message);
    PyObject *properties = item[0], *flag = item[1], *body = item[2];
    if (!PyDict_CheckExact(properties) || !is_int(flag) || !PyBytes_CheckExact(body))
        return 0;
    Py_ssize_t topic_length, born_host_length, store_host_length;
    const char *topic = utf8_of(head[0], &topic_length);
    const char *born_host = utf8_of(head[4], &born_host_length);
    const char *store_host = utf8_of(head[6], &store_host_length);
    if (topic == NULL || born_host == NULL || store_host == NULL)
        return 0;
    Py_ssize_t body_length = PyBytes_GET_SIZE(body);
    Py_ssize_t bound = HEADER_BYTES + 1 + 5 * 3 + topic_length + born_host_length + store_host_length
                       + 8 * 9 + 5 + 5 + body_length;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(properties, &pos, &key, &value)) {
        Py_ssize_t key_length, value_length;
        if (utf8_of(key, &key_length) == NULL || utf8_of(value, &value_length) == NULL)
            return 0;
        bound += 10 + key_length + value_length;
    }
    if (reserve(out, bound) < 0)
        return -1;
    unsigned char *start = out->data + out->length, *p = start + HEADER_BYTES;
    *p++ = 0x9D;                                       /* an array of 13 */
    p = put_str_header(p, topic_length);
    memcpy(p, topic, (size_t)topic_length);
    p += topic_length;
    PyObject *ints[6] = {head[1], queue_offset, commit_log_offset, flag, head[2], head[3]};
    for (int i = 0; i < 6; i++) {
        if (!is_int(ints[i]) || (p = put_int(p, ints[i])) == NULL)
            return 0;
    }
    p = put_str_header(p, born_host_length);
    memcpy(p, born_host, (size_t)born_host_length);
    p += born_host_length;
    if (!is_int(head[5]) || (p = put_int(p, head[5])) == NULL)
        return 0;
    p = put_str_header(p, store_host_length);
    memcpy(p, store_host, (size_t)store_host_length);
    p += store_host_length;
    if (!is_int(head[7]) || (p = put_int(p, head[7])) == NULL)
        return 0;
    p = put_map_header(p, PyDict_GET_SIZE(properties));
    pos = 0;
    while (PyDict_Next(properties, &pos, &key, &value)) {
        Py_ssize_t key_length, value_length;
        const char *key_utf8 = utf8_of(key, &key_length), *value_utf8 = utf8_of(value, &value_length);
        p = put_str_header(p, key_length);
        memcpy(p, key_utf8, (size_t)key_length);
        p += key_length;
        p = put_str_header(p, value_length);
        memcpy(p, value_utf8, (size_t)value_length);
        p += value_length;
    }
    p = put_bin_header(p, body_length);
    memcpy(p, PyBytes_AS_STRING(body), (size_t)body_length);
    p += body_length;
    Py_ssize_t total = p - start;
    unsigned long crc_value;
    if (zlib_crc32 != NULL && total - HEADER_BYTES <= 0x7FFFFFFF) {
        crc_value = zlib_crc32(0, start + HEADER_BYTES, (unsigned int)(total - HEADER_BYTES));
    } else {
        PyObject *payload = PyMemoryView_FromMemory((char *)start + HEADER_BYTES, total - HEADER_BYTES,
                                                    PyBUF_READ);
        if (payload == NULL)
            return -1;
        PyObject *crc = PyObject_CallOneArg(crc32, payload);
        Py_DECREF(payload);
        if (crc == NULL)
            return -1;
        crc_value = PyLong_AsUnsignedLong(crc);
        Py_DECREF(crc);
        if (crc_value == (unsigned long)-1 && PyErr_Occurred())
            return -1;
    }
    put_be(start, (uint64_t)total, 4);
    put_be(start + 4, (uint64_t)crc_value, 4);
    out->length += total;
    return 1;
}

static PyObject *
encode_run(PyObject *module, PyObject *args)
{
    PyObject *head, *messages, *crc32;
    Py_ssize_t start;
    long long first_queue_offset, position, limit;
    if (!PyArg_ParseTuple(args, "O!O!nLLLO:encode_run", &PyTuple_Type, &head, &PyList_Type, &messages, &start,
                          &first_queue_offset, &position, &limit, &crc32))
        return NULL;
    if (PyTuple_GET_SIZE(head) != 8 || start < 0)
        Py_RETURN_NONE;
    PyObject **fields = &PyTuple_GET_ITEM(head, 0);
    out_buffer out = {NULL, 0, 0, NULL};
    PyObject *offsets = PyList_New(0), *sizes = PyList_New(0), *result = NULL;
    if (offsets == NULL || sizes == NULL)
        goto done;
    Py_ssize_t count = PyList_GET_SIZE(messages);
    for (Py_ssize_t index = start; index < count; index++) {
        PyObject *queue_offset = PyLong_FromLongLong(first_queue_offset + index);
        PyObject *commit_log_offset = queue_offset == NULL ? NULL : PyLong_FromLongLong(position);
        if (commit_log_offset == NULL) {
            Py_XDECREF(queue_offset);
            goto done;
        }
        Py_ssize_t before = out.length;
        int written = put_record(&out, fields, queue_offset, commit_log_offset,
                                 PyList_GET_ITEM(messages, index), crc32);
        Py_DECREF(queue_offset);
        if (written <= 0) {
            Py_DECREF(commit_log_offset);
            if (written == 0)
                result = Py_NewRef(Py_None);
            goto done;
        }
        Py_ssize_t total = out.length - before;
        if (position + total > limit) {          /* not in this file: the caller rolls */
            Py_DECREF(commit_log_offset);
            out.length = before;
            break;
        }
        PyObject *size = PyLong_FromSsize_t(total);
        int failed = size == NULL || PyList_Append(offsets, commit_log_offset) < 0 || PyList_Append(sizes, size) < 0;
        Py_DECREF(commit_log_offset);
        Py_XDECREF(size);
        if (failed)
            goto done;
        position += total;
    }
    PyObject *data = PyBytes_FromStringAndSize((const char *)out.data, out.length);
    if (data != NULL)
        result = Py_BuildValue("(NOO)", data, offsets, sizes);

done:
    PyMem_Free(out.data);
    Py_XDECREF(offsets);
    Py_XDECREF(sizes);
    return result;
}

/* write_record(buffer, relative, limit, head, queue_offset, commit_log_offset, message, crc32)
 *     -> total_size | 0 | None
 *
 * The one-message send path's record (broker/store/record.py `write_record_py`, its twin): the
 * record `encode_run` would encode for [message] at `commit_log_offset` with queue offset
 * `queue_offset`, written straight into the writable `buffer` (a commit-log file's mmap) at
 * `relative`, with no payload bytes object, header struct or slice assignment in Python. Returns
 * the record's total size; 0 when it would end past `limit` (nothing written: the caller rolls to
 * the next file); None when anything is not of the usual types (as `encode_run`), or `relative`
 * and `limit` do not lie within the buffer (relative <= limit <= len(buffer)): nothing written,
 * the twin does it. */
static PyObject *
write_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "write_record takes 8 arguments");
        return NULL;
    }
    Py_ssize_t relative = PyLong_AsSsize_t(args[1]);
    if (relative == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    PyObject *head = args[3], *queue_offset = args[4], *commit_log_offset = args[5];
    if (!PyTuple_CheckExact(head) || PyTuple_GET_SIZE(head) != 8 || !is_int(queue_offset)
            || !is_int(commit_log_offset))
        Py_RETURN_NONE;
    Py_buffer buffer;
    if (PyObject_GetBuffer(args[0], &buffer, PyBUF_WRITABLE) < 0)
        return NULL;
    PyObject *result = NULL;
    if (relative < 0 || relative > limit || limit > buffer.len) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    unsigned char local[1024];
    out_buffer out = {local, 0, sizeof(local), local};
    int written = put_record(&out, &PyTuple_GET_ITEM(head, 0), queue_offset, commit_log_offset, args[6], args[7]);
    if (written > 0) {
        if (out.length <= limit - relative) {
            memcpy((unsigned char *)buffer.buf + relative, out.data, (size_t)out.length);
            result = PyLong_FromSsize_t(out.length);
        } else {
            result = PyLong_FromLong(0);
        }
    } else if (written == 0) {
        result = Py_NewRef(Py_None);
    }
    if (out.data != local)
        PyMem_Free(out.data);
done:
    PyBuffer_Release(&buffer);
    return result;
}

/* KeyRing(capacity): the key index's table (broker/store/key_index.py; the twin `KeyRingPy` there is
 * its reference: the key-index tests and `make fuzz-twins` drive both and compare every answer).
 *
 * A fixed ring of `capacity` items (key hash, commit_log_offset, stored_ms), each also linked to
 * the previous item of its hash bucket; the item added `capacity` items ago is overwritten, so the
 * oldest entries are forgotten first and the memory is fixed (32 bytes an item and 8 a bucket,
 * allocated zeroed and touched only as used), with no Python object per entry. This is RocketMQ's
 * IndexFile (hash slots, items linked to the previous of their slot) kept in memory as a ring.
 * A key is its hash (`key_hash`: Python's str hash of the key, keyed per process, mixed with the
 * prefix's), so a query can return a message of another key whose hash is the same (2**-64 a
 * pair): the caller checks the messages it reads.
 *
 *   add(prefix, key, commit_log_offset, stored_ms): one entry (offset in 0..2**63-1, else ValueError)
 *   add_run(prefix, properties, units, start, stored_ms) -> (stop, added): from message `start` on,
 *       each message is indexed under `prefix + word` for each distinct word of its KEYS property
 *       (`str.split()`, in order of first appearance), then under `prefix + UNIQ_KEY` for a non-empty
 *       UNIQ_KEY that is not one of those words, with commit_log_offset item 0 of `units[i]` (a tuple);
 *       a message with neither is skipped. Stops at the first message that is anything else
 *       (properties not a dict, KEYS or UNIQ_KEY not a str, a unit not a tuple whose item 0 is an int
 *       in 0..2**63-1) and returns its index (len(properties) when none is) and the entries added
 *       before it: the caller indexes that one in Python and calls again after it.
 *   query(prefix, key, max_num, begin_ms, end_ms) -> [commit_log_offset, ...]: newest first, at most
 *       max_num, stored within [begin_ms, end_ms] (end_ms <= 0: no upper bound).
 *   len(ring): the entries held (min(added, capacity)). */

typedef struct {
    uint64_t hash;
    uint64_t offset;
    int64_t stored_ms;
    uint64_t prev;              /* 1 + the sequence number of the bucket's previous item; 0: none */
} ring_item;

typedef struct {
    PyObject_HEAD
    uint64_t capacity;          /* 0: nothing is kept */
    uint64_t mask;              /* buckets - 1 (buckets: a power of two ≥ capacity) */
    uint64_t next;              /* entries ever added: the sequence number of the next one */
    ring_item *items;           /* item of sequence number s at s % capacity */
    uint64_t *heads;            /* per bucket: 1 + the sequence number of its newest item; 0: none */
} KeyRing;

#define MAX_RING_CAPACITY (1ULL << 36)

static uint64_t
mix_hash(Py_hash_t prefix_hash, Py_hash_t key_hash)
{
    uint64_t x = ((uint64_t)prefix_hash * 0x9E3779B97F4A7C15ULL) ^ (uint64_t)key_hash;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 32;
    return x;
}

static void
ring_insert(KeyRing *ring, uint64_t hash, uint64_t offset, int64_t stored_ms)
{
    if (ring->capacity == 0)
        return;
    uint64_t seq = ring->next++;
    ring_item *item = &ring->items[seq % ring->capacity];
    uint64_t *head = &ring->heads[hash & ring->mask];
    item->hash = hash;
    item->offset = offset;
    item->stored_ms = stored_ms;
    item->prev = *head;
    *head = seq + 1;
}

/* `key` (a str) indexed under prefix: 0, or -1 with an exception set. */
static int
ring_add_key(KeyRing *ring, Py_hash_t prefix_hash, PyObject *key, uint64_t offset, int64_t stored_ms)
{
    Py_hash_t key_hash = PyObject_Hash(key);
    if (key_hash == -1)
        return -1;
    ring_insert(ring, mix_hash(prefix_hash, key_hash), offset, stored_ms);
    return 0;
}

static int
KeyRing_init(KeyRing *self, PyObject *args, PyObject *kwds)
{
    long long capacity;
    static char *names[] = {"capacity", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "L:KeyRing", names, &capacity))
        return -1;
    if (capacity < 0 || (unsigned long long)capacity > MAX_RING_CAPACITY) {
        PyErr_Format(PyExc_ValueError, "a key ring holds 0 to %llu entries, not %lld", MAX_RING_CAPACITY, capacity);
        return -1;
    }
    if (self->items != NULL || self->heads != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a KeyRing is initialised once");
        return -1;
    }
    uint64_t buckets = 1;
    while (buckets < (uint64_t)capacity)
        buckets <<= 1;
    if (capacity > 0) {
        self->items = PyMem_RawCalloc((size_t)capacity, sizeof(ring_item));
        self->heads = PyMem_RawCalloc((size_t)buckets, sizeof(uint64_t));
        if (self->items == NULL || self->heads == NULL) {
            PyMem_RawFree(self->items);
            PyMem_RawFree(self->heads);
            self->items = NULL;
            self->heads = NULL;
            PyErr_NoMemory();
            return -1;
        }
    }
    self->capacity = (uint64_t)capacity;
    self->mask = buckets - 1;
    self->next = 0;
    return 0;
}

static void
KeyRing_dealloc(KeyRing *self)
{
    PyMem_RawFree(self->items);
    PyMem_RawFree(self->heads);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t
KeyRing_len(KeyRing *self)
{
    return (Py_ssize_t)(self->next < self->capacity ? self->next : self->capacity);
}

/* A commit-log offset in 0..2**63-1: 1; out of range or not an exact int: 0; -1 with an exception. */
static int
usual_offset(PyObject *value, uint64_t *offset)
{
    if (!PyLong_CheckExact(value))
        return 0;
    int overflow = 0;
    long long parsed = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (parsed == -1 && PyErr_Occurred())
        return -1;
    if (overflow || parsed < 0)
        return 0;
    *offset = (uint64_t)parsed;
    return 1;
}

static PyObject *
KeyRing_add(KeyRing *self, PyObject *args)
{
    PyObject *prefix, *key, *offset_value;
    long long stored_ms;
    uint64_t offset;
    if (!PyArg_ParseTuple(args, "UUOL:add", &prefix, &key, &offset_value, &stored_ms))
        return NULL;
    int usual = usual_offset(offset_value, &offset);
    if (usual < 0)
        return NULL;
    if (!usual) {
        PyErr_SetString(PyExc_ValueError, "commit_log_offset must be an int in 0..2**63-1");
        return NULL;
    }
    Py_hash_t prefix_hash = PyObject_Hash(prefix);
    if (prefix_hash == -1 || ring_add_key(self, prefix_hash, key, offset, stored_ms) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* One message's KEYS words (a str) and UNIQ_KEY (NULL or a non-empty str) indexed: the number of
 * entries added, or -1 with an exception set. Words are deduplicated through a set (one word, the
 * usual KEYS, needs none), so a KEYS of many words costs linear time. */
static Py_ssize_t
add_words(KeyRing *ring, Py_hash_t prefix_hash, PyObject *words, PyObject *uniq, uint64_t offset, int64_t stored_ms)
{
    PyObject *split = PyUnicode_Split(words, NULL, -1);
    if (split == NULL)
        return -1;
    Py_ssize_t count = PyList_GET_SIZE(split), indexed = -1, added = 0;
    PyObject *seen = NULL;
    if (count == 1) {
        PyObject *word = PyList_GET_ITEM(split, 0);
        int same = uniq != NULL ? PyUnicode_Compare(word, uniq) == 0 : 0;
        if (PyErr_Occurred() || ring_add_key(ring, prefix_hash, word, offset, stored_ms) < 0
                || (uniq != NULL && !same && ring_add_key(ring, prefix_hash, uniq, offset, stored_ms) < 0))
            goto done;
        indexed = 1 + (uniq != NULL && !same);
        goto done;
    }
    seen = PySet_New(NULL);
    if (seen == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *word = PyList_GET_ITEM(split, i);
        int known = PySet_Contains(seen, word);
        if (known < 0 || (!known && (PySet_Add(seen, word) < 0
                                     || ring_add_key(ring, prefix_hash, word, offset, stored_ms) < 0)))
            goto done;
        added += !known;
    }
    if (uniq != NULL) {
        int known = PySet_Contains(seen, uniq);
        if (known < 0 || (!known && ring_add_key(ring, prefix_hash, uniq, offset, stored_ms) < 0))
            goto done;
        added += !known;
    }
    indexed = added;
done:
    Py_DECREF(split);
    Py_XDECREF(seen);
    return indexed;
}

static PyObject *
KeyRing_add_run(KeyRing *self, PyObject *args)
{
    PyObject *prefix, *properties, *units;
    Py_ssize_t start, added = 0;
    long long stored_ms;
    static PyObject *uniq_name = NULL, *keys_name = NULL;
    if (!PyArg_ParseTuple(args, "UO!O!nL:add_run", &prefix, &PyList_Type, &properties, &PyList_Type, &units,
                          &start, &stored_ms))
        return NULL;
    if (uniq_name == NULL) {
        uniq_name = PyUnicode_InternFromString("UNIQ_KEY");
        keys_name = PyUnicode_InternFromString("KEYS");
        if (uniq_name == NULL || keys_name == NULL)
            return NULL;
    }
    Py_hash_t prefix_hash = PyObject_Hash(prefix);
    if (prefix_hash == -1)
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(properties);
    if (PyList_GET_SIZE(units) < count)
        count = PyList_GET_SIZE(units);
    Py_ssize_t index = start < 0 ? 0 : start;
    for (; index < count; index++) {
        PyObject *props = PyList_GET_ITEM(properties, index), *unit = PyList_GET_ITEM(units, index);
        if (!PyDict_CheckExact(props) || !PyTuple_CheckExact(unit) || PyTuple_GET_SIZE(unit) < 1
                || !PyLong_CheckExact(PyTuple_GET_ITEM(unit, 0)))
            break;
        PyObject *uniq = PyDict_GetItemWithError(props, uniq_name);      /* borrowed */
        if (uniq == NULL && PyErr_Occurred())
            return NULL;
        PyObject *words = PyDict_GetItemWithError(props, keys_name);     /* borrowed */
        if (words == NULL && PyErr_Occurred())
            return NULL;
        if ((uniq != NULL && !PyUnicode_CheckExact(uniq)) || (words != NULL && !PyUnicode_CheckExact(words)))
            break;
        if (uniq != NULL && PyUnicode_GET_LENGTH(uniq) == 0)
            uniq = NULL;
        if (words != NULL && PyUnicode_GET_LENGTH(words) == 0)
            words = NULL;
        if (uniq == NULL && words == NULL)
            continue;                            /* nothing to index */
        uint64_t offset;
        int usual = usual_offset(PyTuple_GET_ITEM(unit, 0), &offset);
        if (usual < 0)
            return NULL;
        if (!usual)
            break;
        Py_ssize_t more = words != NULL ? add_words(self, prefix_hash, words, uniq, offset, stored_ms)
                          : ring_add_key(self, prefix_hash, uniq, offset, stored_ms) < 0 ? -1 : 1;
        if (more < 0)
            return NULL;
        added += more;
    }
    return Py_BuildValue("(nn)", index, added);
}

static PyObject *
KeyRing_query(KeyRing *self, PyObject *args)
{
    PyObject *prefix, *key;
    Py_ssize_t max_num;
    long long begin_ms = 0, end_ms = 0;
    if (!PyArg_ParseTuple(args, "UUn|LL:query", &prefix, &key, &max_num, &begin_ms, &end_ms))
        return NULL;
    Py_hash_t prefix_hash = PyObject_Hash(prefix), key_hash = PyObject_Hash(key);
    if (prefix_hash == -1 || key_hash == -1)
        return NULL;
    PyObject *found = PyList_New(0);
    if (found == NULL || max_num <= 0 || self->capacity == 0)
        return found;
    uint64_t hash = mix_hash(prefix_hash, key_hash);
    uint64_t oldest = self->next > self->capacity ? self->next - self->capacity : 0;
    uint64_t link = self->heads[hash & self->mask];
    while (link != 0 && link - 1 >= oldest) {      /* a link older than the ring's oldest item is gone */
        ring_item *item = &self->items[(link - 1) % self->capacity];
        if (item->hash == hash && item->stored_ms >= begin_ms && (end_ms <= 0 || item->stored_ms <= end_ms)) {
            PyObject *offset = PyLong_FromUnsignedLongLong(item->offset);
            int failed = offset == NULL || PyList_Append(found, offset) < 0;
            Py_XDECREF(offset);
            if (failed) {
                Py_DECREF(found);
                return NULL;
            }
            if (PyList_GET_SIZE(found) >= max_num)
                break;
        }
        link = item->prev;
    }
    return found;
}

static PyMethodDef KeyRing_methods[] = {
    {"add", (PyCFunction)KeyRing_add, METH_VARARGS,
     "add(prefix, key, commit_log_offset, stored_ms): one entry under prefix + key."},
    {"add_run", (PyCFunction)KeyRing_add_run, METH_VARARGS,
     "add_run(prefix, properties, units, start, stored_ms) -> (stop, added): a batch's messages indexed by "
     "KEYS words and UNIQ_KEY (see broker/store/key_index.py KeyRingPy)."},
    {"query", (PyCFunction)KeyRing_query, METH_VARARGS,
     "query(prefix, key, max_num, begin_ms=0, end_ms=0) -> [commit_log_offset, ...], newest first."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods KeyRing_as_sequence = {
    .sq_length = (lenfunc)KeyRing_len,
};

static PyTypeObject KeyRing_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "broker.store._records.KeyRing",
    .tp_basicsize = sizeof(KeyRing),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "KeyRing(capacity): the key index's fixed ring of (key hash, commit_log_offset, stored_ms) "
              "(see broker/store/key_index.py KeyRingPy, its twin).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)KeyRing_init,
    .tp_dealloc = (destructor)KeyRing_dealloc,
    .tp_methods = KeyRing_methods,
    .tp_as_sequence = &KeyRing_as_sequence,
};

/* write_units(buffer, position, units) -> bool
 *
 * The twin of broker/store/consume_queue.py's `write_units_py` (its reference; the consume-queue
 * tests run both and compare the bytes): each unit (commit_log_offset, size, tags_code) of `units`
 * written as a consume-queue unit (`>QIq`, 20 bytes) one after another from byte `position` of
 * the writable `buffer` (a file's map). False, with nothing written, for the twin to write them
 * (and raise what struct raises) when they do not fit or a unit is not a tuple of three ints in
 * the unit's ranges: every unit is converted before the first byte is written, as struct's
 * pack_into checks every value before it writes. */

#define UNIT_BYTES 20
#define STACK_UNITS 64

static void
put_be_bytes(unsigned char *out, uint64_t value, int width)
{
    for (int i = width - 1; i >= 0; i--) {
        out[i] = (unsigned char)(value & 0xFF);
        value >>= 8;
    }
}

/* The units of `units` converted into `out` (count * UNIT_BYTES); 1, 0 when one is unusual (no
 * exception), -1 with an exception other than an OverflowError. */
static int
convert_units(PyObject *units, Py_ssize_t count, unsigned char *out)
{
    for (Py_ssize_t i = 0; i < count; i++, out += UNIT_BYTES) {
        PyObject *unit = PyList_GET_ITEM(units, i);
        if (!PyTuple_CheckExact(unit) || PyTuple_GET_SIZE(unit) != 3)
            return 0;
        PyObject *offset_obj = PyTuple_GET_ITEM(unit, 0), *size_obj = PyTuple_GET_ITEM(unit, 1),
                 *code_obj = PyTuple_GET_ITEM(unit, 2);
        if (!PyLong_CheckExact(offset_obj) || !PyLong_CheckExact(size_obj) || !PyLong_CheckExact(code_obj))
            return 0;
        unsigned long long offset = PyLong_AsUnsignedLongLong(offset_obj);
        if (offset == (unsigned long long)-1 && PyErr_Occurred())
            goto unusual;
        unsigned long long size = PyLong_AsUnsignedLongLong(size_obj);
        if ((size == (unsigned long long)-1 && PyErr_Occurred()) || size > 0xFFFFFFFFULL)
            goto unusual;
        int overflow = 0;
        long long code = PyLong_AsLongLongAndOverflow(code_obj, &overflow);
        if (overflow || (code == -1 && PyErr_Occurred()))
            goto unusual;
        put_be_bytes(out, offset, 8);
        put_be_bytes(out + 8, size, 4);
        put_be_bytes(out + 12, (uint64_t)code, 8);
    }
    return 1;

unusual:
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();                       /* negative or too large: struct says which */
    }
    return 0;
}

static PyObject *
write_units(PyObject *module, PyObject *args)
{
    Py_buffer buffer;
    Py_ssize_t position;
    PyObject *units;
    if (!PyArg_ParseTuple(args, "w*nO!:write_units", &buffer, &position, &PyList_Type, &units))
        return NULL;
    int converted = 0;
    Py_ssize_t count = PyList_GET_SIZE(units);
    if (position >= 0 && position <= buffer.len && count <= (buffer.len - position) / UNIT_BYTES) {
        unsigned char local[STACK_UNITS * UNIT_BYTES];
        unsigned char *staged = count <= STACK_UNITS ? local : PyMem_Malloc((size_t)count * UNIT_BYTES);
        if (staged == NULL) {
            PyBuffer_Release(&buffer);
            return PyErr_NoMemory();
        }
        converted = convert_units(units, count, staged);
        if (converted > 0 && count > 0)
            memcpy((unsigned char *)buffer.buf + position, staged, (size_t)count * UNIT_BYTES);
        if (staged != local)
            PyMem_Free(staged);
    }
    PyBuffer_Release(&buffer);
    if (converted < 0)
        return NULL;
    return Py_NewRef(converted > 0 ? Py_True : Py_False);
}

/* read_stored(buffer, relative, limit, base, max_count, crc32) -> [entry, ...]
 *
 * The twin of broker/store/record.py's `read_stored_py` (its reference; the store tests and
 * `make fuzz-twins` run both and compare): reput's reading of records back from a commit-log file
 * (a slave dispatching what it copied, a restart rebuilding), with no Python per record. From
 * `relative` on, each record of `buffer` (a commit-log file's mmap) that is intact (as
 * `record_size_at`: a total size of at least 9 that ends at or before `limit`, a matching CRC) and a
 * usual stored message (a fixarray of 13, str topic and hosts, ints where protocol/message.py has
 * ints, a dict of str to str properties, a bin body ending the payload) gives the entry
 *
 *     (base + position, total_size, topic, queue_id, queue_offset, store_timestamp, properties)
 *
 * Stops at the first record that is not both (a zero tail, a damaged or an unusual record: the
 * caller looks at it in Python), at `limit`, or after `max_count` entries. ValueError unless
 * 0 <= relative <= limit <= len(buffer). */

#define STORED_FIELDS 13
#define STR_CACHE_SLOTS 32
#define STR_CACHE_MAX 48

/* The short strings (topics, property names, tags) one `read_stored` call decoded, so a string
 * recurring in the records it reads (a run's topic, every message's "TAGS" and its usual value) is
 * decoded once: a slot holds where its bytes lie in the buffer and the str made of them. */
typedef struct {
    const unsigned char *bytes[STR_CACHE_SLOTS];
    Py_ssize_t length[STR_CACHE_SLOTS];
    PyObject *text[STR_CACHE_SLOTS];
} str_cache;

static void
str_cache_clear(str_cache *cache)
{
    for (int i = 0; i < STR_CACHE_SLOTS; i++)
        Py_CLEAR(cache->text[i]);
}

/* A str header at `r` (fixstr, str8/16/32): the length, its bytes at *out; -1 when it is none. */
static Py_ssize_t
str_header(mp_reader *r, const unsigned char **out)
{
    if (r->p >= r->end)
        return -1;
    unsigned char tag = *r->p;
    Py_ssize_t n;
    r->p++;
    if (tag >= 0xA0 && tag <= 0xBF)
        n = tag & 0x1F;
    else if (tag >= 0xD9 && tag <= 0xDB)
        n = mp_length(r, 1 << (tag - 0xD9));
    else
        return -1;
    if (n < 0 || mp_take(r, n, out) < 0)
        return -1;
    return n;
}

/* The str at `r`, through `cache` (`key`: interned, as msgpack interns map keys); MP_FALLBACK when
 * it is no str or no valid UTF-8 (the record is then unusual, as for msgpack's UnicodeDecodeError). */
static PyObject *
cached_str(mp_reader *r, str_cache *cache, int key)
{
    const unsigned char *b;
    Py_ssize_t n = str_header(r, &b);
    if (n < 0)
        return MP_FALLBACK;
    int slot = -1;
    if (n <= STR_CACHE_MAX) {
        slot = (int)(((size_t)n * 31u + (n ? b[0] * 7u + b[n - 1] : 0u) + (n > 2 ? b[n / 2] : 0u))
                     % STR_CACHE_SLOTS);
        if (cache->text[slot] != NULL && cache->length[slot] == n && memcmp(cache->bytes[slot], b, (size_t)n) == 0)
            return Py_NewRef(cache->text[slot]);
    }
    PyObject *text = PyUnicode_DecodeUTF8((const char *)b, n, NULL);
    if (text == NULL) {
        PyErr_Clear();
        return MP_FALLBACK;
    }
    if (key)
        PyUnicode_InternInPlace(&text);
    if (slot >= 0) {
        Py_XSETREF(cache->text[slot], Py_NewRef(text));
        cache->bytes[slot] = b;
        cache->length[slot] = n;
    }
    return text;
}

/* Past the str or int at `r` without making it: 1, or 0 when it is not one (an int: any msgpack
 * int, which msgpack decodes to an int; a str: valid UTF-8, as msgpack decodes it). */
static int
skip_field(mp_reader *r, char kind)
{
    if (kind == 's') {
        const unsigned char *b;
        Py_ssize_t n = str_header(r, &b);
        if (n < 0)
            return 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (b[i] >= 0x80) {                 /* not ASCII: decode to check, as msgpack would */
                PyObject *text = PyUnicode_DecodeUTF8((const char *)b, n, NULL);
                if (text == NULL) {
                    PyErr_Clear();
                    return 0;
                }
                Py_DECREF(text);
                break;
            }
        }
        return 1;
    }
    if (r->p >= r->end)
        return 0;
    unsigned char tag = *r->p++;
    if (tag <= 0x7F || tag >= 0xE0)
        return 1;
    const unsigned char *b;
    if (tag >= 0xCC && tag <= 0xCF)
        return mp_take(r, 1 << (tag - 0xCC), &b) == 0;
    if (tag >= 0xD0 && tag <= 0xD3)
        return mp_take(r, 1 << (tag - 0xD0), &b) == 0;
    return 0;
}

/* The properties map at `r` (a map of str to str; keys interned, strings through `cache`); None
 * when it is not one, NULL with an exception. */
static PyObject *
read_properties(mp_reader *r, str_cache *cache)
{
    if (r->p >= r->end)
        return Py_NewRef(Py_None);
    unsigned char tag = *r->p++;
    Py_ssize_t n;
    if (tag >= 0x80 && tag <= 0x8F)
        n = tag & 0x0F;
    else if (tag == 0xDE || tag == 0xDF)
        n = mp_length(r, 2 << (tag - 0xDE));
    else
        return Py_NewRef(Py_None);
    if (n < 0 || n > (r->end - r->p) / 2)
        return Py_NewRef(Py_None);
    PyObject *dict = _PyDict_NewPresized(n);
    if (dict == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = cached_str(r, cache, 1);
        if (key == MP_FALLBACK) {
            Py_DECREF(dict);
            return Py_NewRef(Py_None);
        }
        PyObject *value = cached_str(r, cache, 0);
        if (value == MP_FALLBACK) {
            Py_DECREF(key);
            Py_DECREF(dict);
            return Py_NewRef(Py_None);
        }
        if (mp_dict_put(dict, key, value) < 0) {
            Py_DECREF(dict);
            return NULL;
        }
    }
    return dict;
}

/* The entry of the record whose payload is `payload`; None when it is not a usual stored message,
 * NULL with an exception. Only the fields the entry holds become objects: the others are checked
 * for their type and passed over. */
static PyObject *
stored_entry(const unsigned char *payload, Py_ssize_t length, long long commit_log_offset, Py_ssize_t total,
             str_cache *cache)
{
    mp_reader r = {payload, payload + length};
    if (length < 1 || *r.p++ != (0x90 | STORED_FIELDS))
        return Py_NewRef(Py_None);
    /* field 0 the topic, 1 queue_id, 2 queue_offset, 8 store_timestamp, 11 the properties: kept */
    static const char kinds[STORED_FIELDS - 1] = {'s', 'i', 'i', 'i', 'i', 'i', 'i', 's', 'i', 's', 'i', 'd'};
    PyObject *kept[STORED_FIELDS - 1] = {NULL};
    PyObject *entry = NULL;
    int usual = 1;
    for (int i = 0; i < STORED_FIELDS - 1 && usual; i++) {
        PyObject *value;
        if (i == 0) {
            value = cached_str(&r, cache, 0);
        } else if (i == 11) {
            value = read_properties(&r, cache);
            if (value == Py_None) {
                Py_DECREF(value);
                value = MP_FALLBACK;
            }
        } else if (i == 1 || i == 2 || i == 8) {
            value = mp_read(&r, 0);
            if (value != NULL && value != MP_FALLBACK && !PyLong_CheckExact(value)) {
                Py_DECREF(value);
                value = MP_FALLBACK;
            }
        } else {
            usual = skip_field(&r, kinds[i]);
            continue;
        }
        if (value == NULL)
            goto done;
        if (value == MP_FALLBACK) {
            usual = 0;
            break;
        }
        kept[i] = value;
    }
    if (usual) {                    /* the body: a bin that ends the payload exactly */
        Py_ssize_t left = r.end - r.p, header, body_length;
        unsigned char tag = left > 0 ? r.p[0] : 0;
        if (tag == 0xC4 || tag == 0xC5 || tag == 0xC6) {
            header = 1 + (1 << (tag - 0xC4));
            body_length = left >= header ? (Py_ssize_t)mp_be(r.p + 1, (int)(header - 1)) : -1;
            usual = body_length >= 0 && body_length == left - header;
        } else {
            usual = 0;
        }
    }
    if (!usual) {
        entry = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *offset = PyLong_FromLongLong(commit_log_offset);
    PyObject *size = offset != NULL ? PyLong_FromSsize_t(total) : NULL;
    if (size == NULL) {
        Py_XDECREF(offset);
        goto done;
    }
    entry = PyTuple_New(7);
    if (entry == NULL) {
        Py_DECREF(offset);
        Py_DECREF(size);
        goto done;
    }
    PyTuple_SET_ITEM(entry, 0, offset);                 /* the tuple takes these references */
    PyTuple_SET_ITEM(entry, 1, size);
    int at = 2;
    for (int i = 0; i < STORED_FIELDS - 1; i++) {
        if (kept[i] != NULL) {
            PyTuple_SET_ITEM(entry, at++, kept[i]);
            kept[i] = NULL;
        }
    }
done:
    for (int i = 0; i < STORED_FIELDS - 1; i++)
        Py_XDECREF(kept[i]);
    return entry;
}

static PyObject *
read_stored(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "read_stored takes 6 arguments");
        return NULL;
    }
    Py_ssize_t relative = PyLong_AsSsize_t(args[1]), limit, max_count;
    if (relative == -1 && PyErr_Occurred())
        return NULL;
    limit = PyLong_AsSsize_t(args[2]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    long long base = PyLong_AsLongLong(args[3]);
    if (base == -1 && PyErr_Occurred())
        return NULL;
    max_count = PyLong_AsSsize_t(args[4]);
    if (max_count == -1 && PyErr_Occurred())
        return NULL;
    PyObject *crc32 = args[5];
    Py_buffer buffer;
    if (PyObject_GetBuffer(args[0], &buffer, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *entries = NULL;
    if (relative < 0 || relative > limit || limit > buffer.len) {
        PyErr_SetString(PyExc_ValueError, "read_stored: relative and limit must lie within the buffer");
        goto done;
    }
    entries = PyList_New(0);
    str_cache cache = {{NULL}, {0}, {NULL}};
    const unsigned char *data = buffer.buf;
    Py_ssize_t position = relative;
    while (entries != NULL && PyList_GET_SIZE(entries) < max_count && limit - position >= HEADER_BYTES) {
        Py_ssize_t total = (Py_ssize_t)mp_be(data + position, 4);
        unsigned long expected = (unsigned long)mp_be(data + position + 4, 4), crc_value;
        if (total < HEADER_BYTES + 1 || total > limit - position)
            break;                                  /* a zero tail, or damaged */
        const unsigned char *payload = data + position + HEADER_BYTES;
        Py_ssize_t length = total - HEADER_BYTES;
        if (zlib_crc32 != NULL && length <= 0x7FFFFFFF) {
            crc_value = zlib_crc32(0, payload, (unsigned int)length);
        } else {
            PyObject *bytes = PyBytes_FromStringAndSize((const char *)payload, length);
            PyObject *crc = bytes != NULL ? PyObject_CallOneArg(crc32, bytes) : NULL;
            Py_XDECREF(bytes);
            crc_value = crc != NULL ? PyLong_AsUnsignedLong(crc) : 0;
            Py_XDECREF(crc);
            if (PyErr_Occurred()) {
                Py_CLEAR(entries);
                break;
            }
        }
        if ((crc_value & 0xFFFFFFFFUL) != expected)
            break;
        PyObject *entry = stored_entry(payload, length, base + position, total, &cache);
        if (entry == NULL) {
            Py_CLEAR(entries);
            break;
        }
        if (entry == Py_None) {
            Py_DECREF(entry);
            break;
        }
        int failed = PyList_Append(entries, entry);
        Py_DECREF(entry);
        if (failed < 0)
            Py_CLEAR(entries);
        position += total;
    }
    str_cache_clear(&cache);
done:
    PyBuffer_Release(&buffer);
    return entries;
}

static PyMethodDef methods[] = {
    {"encode_run", encode_run, METH_VARARGS,
     "encode_run(head, messages, start, first_queue_offset, position, limit, crc32) -> "
     "(data, commit_log_offsets, sizes) | None (see the module docstring)."},
    {"write_record", (PyCFunction)(void (*)(void))write_record, METH_FASTCALL,
     "write_record(buffer, relative, limit, head, queue_offset, commit_log_offset, message, crc32) -> "
     "total_size | 0 | None: one record written into a commit-log file (see broker/store/record.py)."},
    {"write_units", write_units, METH_VARARGS,
     "write_units(buffer, position, units) -> bool: a run of consume-queue units written at `position` "
     "(see broker/store/consume_queue.py)."},
    {"read_stored", (PyCFunction)(void (*)(void))read_stored, METH_FASTCALL,
     "read_stored(buffer, relative, limit, base, max_count, crc32) -> [(commit_log_offset, total_size, topic, "
     "queue_id, queue_offset, store_timestamp, properties), ...]: the usual records read back (see "
     "broker/store/record.py read_stored_py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "broker.store._records",
    "A batch's commit-log records encoded in C (see broker/store/record.py encode_run_py), its consume-"
    "queue units written (consume_queue.py write_units_py) and its keys indexed (key_index.py "
    "KeyRingPy).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__records(void)
{
    void *libz = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
    if (libz != NULL)
        zlib_crc32 = (crc32_function)dlsym(libz, "crc32");
    if (PyType_Ready(&KeyRing_Type) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module != NULL && (PyModule_AddIntConstant(module, "c_crc32", zlib_crc32 != NULL) < 0
                           || PyModule_AddObjectRef(module, "KeyRing", (PyObject *)&KeyRing_Type) < 0))
        Py_CLEAR(module);
    return module;
}
