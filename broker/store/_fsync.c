/* broker.store._fsync: the SYNC_FLUSH fsync thread as a C thread that never takes the GIL.
 *
 * The pure-Python FsyncThread (broker/store/fsync_thread.py) needs the GIL to wake up, to call
 * fdatasync and again to hand its result to the loop, so each round waits for the event loop to
 * let go of the GIL twice, and its Python steps run cold after every sleep. This thread only runs
 * C: it waits on a condition variable, opens, fdatasyncs and closes the round's files, queues
 * (target, seconds, errno), and writes one byte to a pipe the loop watches (`loop.add_reader`);
 * the loop then calls `take()`. Same rounds as the Python thread: a request replaces one not yet
 * taken (the newer covers the older), and a round is followed at once by a back-to-back round up
 * to the log's newer end (`note_end`) while the log grows inside the round's last file.
 *
 * FsyncWorker(wakeup_fd, segment_bytes)
 *   .start()                              start the thread
 *   .request(target, paths)               fdatasync `paths` (bytes) to cover the log up to `target`
 *   .note_end(end)                        the log's write position now (for back-to-back rounds)
 *   .take() -> [(target, seconds, errno)] finished rounds in order; seconds < 0: covered by an
 *                                         earlier round (no fsync of its own); errno 0: success
 *   .stop(timeout_ms) -> bool             finish the round under way or asked for, take no
 *                                         other, join; False when the thread is still in an
 *                                         fsync at the timeout
 *   .inject(delay_ms, errno)              tests: every later fsync first sleeps `delay_ms`, then
 *                                         fails with `errno` unless it is 0 (a slow or broken disk)
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int64_t target;
    double seconds;
    int error;
} round_result;

typedef struct {
    PyObject_HEAD
    pthread_t thread;
    pthread_mutex_t mutex;
    pthread_cond_t wake;
    int started, stopping, running;
    int wakeup_fd;
    int64_t segment_bytes;
    /* the request not yet taken (under mutex) */
    int has_request;
    int64_t request_target;
    char **request_paths;
    Py_ssize_t request_count;
    /* the log's end as last noted by the loop (under mutex) */
    int64_t end;
    int64_t synced;                   /* thread only: every byte before it is covered */
    /* finished rounds (under mutex) */
    round_result *results;
    Py_ssize_t result_count, result_capacity;
    /* tests: a slow or failing disk (under mutex) */
    int inject_delay_ms, inject_errno;
} FsyncWorker;

static void
free_paths(char **paths, Py_ssize_t count)
{
    if (paths == NULL)
        return;
    for (Py_ssize_t i = 0; i < count; i++)
        free(paths[i]);
    free(paths);
}

static double
now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* 0, or the errno of the first file that could not be opened or fdatasynced. */
static int
sync_paths(FsyncWorker *self, char **paths, Py_ssize_t count)
{
    pthread_mutex_lock(&self->mutex);
    int delay_ms = self->inject_delay_ms, injected = self->inject_errno;
    pthread_mutex_unlock(&self->mutex);
    if (delay_ms > 0) {
        struct timespec pause = {delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L};
        while (nanosleep(&pause, &pause) < 0 && errno == EINTR) {
        }
    }
    if (injected)
        return injected;
    for (Py_ssize_t i = 0; i < count; i++) {
        int fd;
        do {
            fd = open(paths[i], O_RDWR | O_CLOEXEC);
        } while (fd < 0 && errno == EINTR);
        if (fd < 0)
            return errno;
        int failed = fdatasync(fd);
        int error = failed < 0 ? errno : 0;
        close(fd);
        if (error)
            return error;
    }
    return 0;
}

/* Queue a finished round and wake the loop (under no lock). */
static void
report(FsyncWorker *self, int64_t target, double seconds, int error)
{
    pthread_mutex_lock(&self->mutex);
    if (self->result_count == self->result_capacity) {
        Py_ssize_t capacity = self->result_capacity ? self->result_capacity * 2 : 16;
        round_result *grown = realloc(self->results, (size_t)capacity * sizeof(round_result));
        if (grown == NULL) {            /* keep the newest result only: it covers the older ones */
            self->result_count = 0;
            if (self->result_capacity == 0) {
                pthread_mutex_unlock(&self->mutex);
                return;
            }
        } else {
            self->results = grown;
            self->result_capacity = capacity;
        }
    }
    self->results[self->result_count++] = (round_result){target, seconds, error};
    pthread_mutex_unlock(&self->mutex);
    char byte = 1;
    ssize_t written;
    do {
        written = write(self->wakeup_fd, &byte, 1);
    } while (written < 0 && errno == EINTR);
    /* EAGAIN: the pipe is full of earlier wake-ups; the loop takes every result at once */
}

static void *
run(void *arg)
{
    FsyncWorker *self = arg;
    for (;;) {
        pthread_mutex_lock(&self->mutex);
        while (!self->has_request && !self->stopping)
            pthread_cond_wait(&self->wake, &self->mutex);
        if (!self->has_request) {            /* stopping; a round asked for is still done */
            self->running = 0;
            pthread_mutex_unlock(&self->mutex);
            return NULL;
        }
        int64_t target = self->request_target;
        char **paths = self->request_paths;
        Py_ssize_t count = self->request_count;
        self->has_request = 0;
        self->request_paths = NULL;
        self->request_count = 0;
        pthread_mutex_unlock(&self->mutex);

        for (;;) {
            double seconds = -1.0;
            int error = 0;
            if (target > self->synced) {      /* else an earlier back-to-back round covered it */
                double started = now_seconds();
                error = sync_paths(self, paths, count);
                seconds = now_seconds() - started;
                if (!error)
                    self->synced = target;
            }
            report(self, target, seconds, error);
            if (error)
                break;
            /* back to back: the log grew inside this round's last file and nothing else waits */
            pthread_mutex_lock(&self->mutex);
            int64_t end = self->end, size = self->segment_bytes;
            int again = end > target && !self->stopping && !self->has_request
                        && (end - 1) / size == (target - 1) / size;
            pthread_mutex_unlock(&self->mutex);
            if (!again)
                break;
            target = end;
            if (count > 1) {                  /* keep the last file only */
                for (Py_ssize_t i = 0; i < count - 1; i++)
                    free(paths[i]);
                memmove(paths, paths + count - 1, sizeof(char *));
                count = 1;
            }
        }
        free_paths(paths, count);
    }
}

static int
worker_init(FsyncWorker *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"wakeup_fd", "segment_bytes", NULL};
    int wakeup_fd;
    long long segment_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iL:FsyncWorker", names, &wakeup_fd, &segment_bytes))
        return -1;
    if (segment_bytes <= 0) {
        PyErr_SetString(PyExc_ValueError, "segment_bytes must be positive");
        return -1;
    }
    if (self->started) {
        PyErr_SetString(PyExc_RuntimeError, "FsyncWorker is already started");
        return -1;
    }
    self->wakeup_fd = wakeup_fd;
    self->segment_bytes = segment_bytes;
    return 0;
}

static PyObject *
worker_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    FsyncWorker *self = (FsyncWorker *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    pthread_mutex_init(&self->mutex, NULL);
    pthread_cond_init(&self->wake, NULL);
    self->wakeup_fd = -1;
    return (PyObject *)self;
}

static void
worker_dealloc(FsyncWorker *self)
{
    if (self->started) {
        /* never joined (stop() not called or timed out): the thread may still use this object,
         * so it is left allocated (as a hung daemon thread is left behind) */
        pthread_mutex_lock(&self->mutex);
        self->stopping = 1;
        pthread_cond_signal(&self->wake);
        int running = self->running;
        pthread_mutex_unlock(&self->mutex);
        if (running)
            return;
        pthread_join(self->thread, NULL);
    }
    free_paths(self->request_paths, self->request_count);
    free(self->results);
    pthread_mutex_destroy(&self->mutex);
    pthread_cond_destroy(&self->wake);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
worker_start(FsyncWorker *self, PyObject *unused)
{
    if (self->started) {
        PyErr_SetString(PyExc_RuntimeError, "FsyncWorker is already started");
        return NULL;
    }
    if (self->wakeup_fd < 0) {
        PyErr_SetString(PyExc_RuntimeError, "FsyncWorker was not initialised");
        return NULL;
    }
    self->running = 1;
    int failed = pthread_create(&self->thread, NULL, run, self);
    if (failed) {
        self->running = 0;
        errno = failed;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    self->started = 1;
    Py_RETURN_NONE;
}

static PyObject *
worker_request(FsyncWorker *self, PyObject *args)
{
    long long target;
    PyObject *paths;
    if (!PyArg_ParseTuple(args, "LO:request", &target, &paths))
        return NULL;
    PyObject *sequence = PySequence_Fast(paths, "paths must be a sequence of bytes");
    if (sequence == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(sequence);
    char **copies = calloc((size_t)(count ? count : 1), sizeof(char *));
    if (copies == NULL) {
        Py_DECREF(sequence);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(sequence, i);
        char *path;
        Py_ssize_t length;
        if (!PyBytes_Check(item) || PyBytes_AsStringAndSize(item, &path, &length) < 0
                || (Py_ssize_t)strlen(path) != length) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "paths must be bytes without NUL");
            free_paths(copies, i);
            Py_DECREF(sequence);
            return NULL;
        }
        copies[i] = strdup(path);
        if (copies[i] == NULL) {
            free_paths(copies, i);
            Py_DECREF(sequence);
            return PyErr_NoMemory();
        }
    }
    Py_DECREF(sequence);
    pthread_mutex_lock(&self->mutex);
    char **replaced = self->request_paths;
    Py_ssize_t replaced_count = self->request_count;
    self->request_paths = copies;
    self->request_count = count;
    self->request_target = target;
    self->has_request = 1;
    pthread_cond_signal(&self->wake);
    pthread_mutex_unlock(&self->mutex);
    free_paths(replaced, replaced_count);
    Py_RETURN_NONE;
}

static PyObject *
worker_note_end(FsyncWorker *self, PyObject *arg)
{
    long long end = PyLong_AsLongLong(arg);
    if (end == -1 && PyErr_Occurred())
        return NULL;
    pthread_mutex_lock(&self->mutex);
    if (end > self->end)
        self->end = end;
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

static PyObject *
worker_take(FsyncWorker *self, PyObject *unused)
{
    pthread_mutex_lock(&self->mutex);
    Py_ssize_t count = self->result_count;
    round_result local[64];
    round_result *copy = count <= 64 ? local : malloc((size_t)count * sizeof(round_result));
    if (copy == NULL) {
        pthread_mutex_unlock(&self->mutex);
        return PyErr_NoMemory();
    }
    if (count > 0)      /* (results may be NULL while empty: memcpy's pointers must not be) */
        memcpy(copy, self->results, (size_t)count * sizeof(round_result));
    self->result_count = 0;
    pthread_mutex_unlock(&self->mutex);
    PyObject *list = PyList_New(count);
    for (Py_ssize_t i = 0; list != NULL && i < count; i++) {
        PyObject *item = Py_BuildValue("(Ldi)", (long long)copy[i].target, copy[i].seconds, copy[i].error);
        if (item == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, item);
    }
    if (copy != local)
        free(copy);
    return list;
}

static PyObject *
worker_stop(FsyncWorker *self, PyObject *args)
{
    int timeout_ms;
    if (!PyArg_ParseTuple(args, "i:stop", &timeout_ms))
        return NULL;
    if (!self->started)
        Py_RETURN_TRUE;
    pthread_mutex_lock(&self->mutex);
    self->stopping = 1;
    pthread_cond_signal(&self->wake);
    pthread_mutex_unlock(&self->mutex);
    int joined = 0;
    Py_BEGIN_ALLOW_THREADS
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec += 1;
        deadline.tv_nsec -= 1000000000L;
    }
    joined = pthread_timedjoin_np(self->thread, NULL, &deadline) == 0;
    Py_END_ALLOW_THREADS
    if (!joined)
        Py_RETURN_FALSE;
    self->started = 0;
    Py_RETURN_TRUE;
}

static PyObject *
worker_inject(FsyncWorker *self, PyObject *args)
{
    int delay_ms, error;
    if (!PyArg_ParseTuple(args, "ii:inject", &delay_ms, &error))
        return NULL;
    pthread_mutex_lock(&self->mutex);
    self->inject_delay_ms = delay_ms;
    self->inject_errno = error;
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

static PyMethodDef worker_methods[] = {
    {"start", (PyCFunction)worker_start, METH_NOARGS, "Start the thread."},
    {"request", (PyCFunction)worker_request, METH_VARARGS,
     "request(target, paths): fdatasync `paths` (bytes) next, covering the log up to `target`."},
    {"note_end", (PyCFunction)worker_note_end, METH_O, "note_end(end): the log's write position now."},
    {"take", (PyCFunction)worker_take, METH_NOARGS,
     "take() -> [(target, seconds, errno)]: the rounds finished since the last call, in order."},
    {"stop", (PyCFunction)worker_stop, METH_VARARGS,
     "stop(timeout_ms) -> bool: end the thread after the round under way; False if it did not."},
    {"inject", (PyCFunction)worker_inject, METH_VARARGS,
     "inject(delay_ms, errno): tests only, a slow (delay) or failing (errno != 0) disk."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FsyncWorkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "broker.store._fsync.FsyncWorker",
    .tp_basicsize = sizeof(FsyncWorker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The SYNC_FLUSH fsync thread in C (see the module docstring).",
    .tp_new = worker_new,
    .tp_init = (initproc)worker_init,
    .tp_dealloc = (destructor)worker_dealloc,
    .tp_methods = worker_methods,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "broker.store._fsync",
    "The SYNC_FLUSH fsync thread in C, never taking the GIL (see broker/store/fsync_thread.py).", -1, NULL,
};

PyMODINIT_FUNC
PyInit__fsync(void)
{
    if (PyType_Ready(&FsyncWorkerType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "FsyncWorker", (PyObject *)&FsyncWorkerType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
