/* lbcore._kernel: the module. Loaded by lbcore.kernel (CSLB_KERNEL=auto|native). */
#include "plan.h"

#include <limits.h>
#include <sys/types.h>
#include <unistd.h>

lb_state LB;

/* xxh64(data) -> int: XXH64 (seed 0) of a bytes-like object (for tests and tools). */
static PyObject *k_xxh64(PyObject *mod, PyObject *data)
{
    (void)mod;
    Py_buffer v;
    if (PyObject_GetBuffer(data, &v, PyBUF_SIMPLE) < 0)
        return NULL;
    uint64_t h = lb_xxh64(v.buf, (size_t)v.len);
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLongLong(h);
}

/* hash_keys(keys, kind, max_key_bytes) -> uint64 array: lbcore.hash_keys, native. */
static PyObject *k_hash_keys(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "hash_keys(keys, kind, max_key_bytes)");
        return NULL;
    }
    Py_ssize_t max_key_bytes = PyLong_AsSsize_t(args[2]);
    if (max_key_bytes == -1 && PyErr_Occurred())
        return NULL;
    lb_keys k;
    if (lb_keys_open(&k, args[0], args[1], max_key_bytes) < 0)
        return NULL;
    Py_buffer ov;
    PyObject *arr = lb_new_array(k.n, LB.dtype_u64, &ov);
    if (arr == NULL) {
        lb_keys_close(&k);
        return NULL;
    }
    int rc;
    if (lb_keys_nogil_ok(&k) && k.n >= 8192) {
        Py_BEGIN_ALLOW_THREADS
        rc = lb_hash_keys(&k, (uint64_t *)ov.buf);
        Py_END_ALLOW_THREADS
    } else {
        rc = lb_hash_keys(&k, (uint64_t *)ov.buf);
    }
    if (rc < 0)
        lb_keys_raise(&k);
    lb_keys_close(&k);
    PyBuffer_Release(&ov);
    if (rc < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

/* floor(keys, width, buckets, shift) -> int: the C floor of a lookup, for perf/: XXH64 of
 * each fixed-width key of a bytes buffer plus one bucket-table load per key. */
static PyObject *k_floor(PyObject *mod, PyObject *args)
{
    (void)mod;
    Py_buffer kv, bv;
    Py_ssize_t width;
    int shift;
    if (!PyArg_ParseTuple(args, "y*ny*i", &kv, &width, &bv, &shift))
        return NULL;
    if (width < 1 || shift < 32 || shift > 63 || bv.len < (Py_ssize_t)(((uint64_t)1 << (64 - shift)) * 4)) {
        PyBuffer_Release(&kv);
        PyBuffer_Release(&bv);
        PyErr_SetString(PyExc_ValueError, "floor: bad width, shift or table size");
        return NULL;
    }
    const uint8_t *keys = (const uint8_t *)kv.buf;
    const int32_t *table = (const int32_t *)bv.buf;
    Py_ssize_t n = kv.len / width;
    uint64_t sum = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        sum += (uint32_t)table[lb_xxh64(keys + i * width, (size_t)width) >> shift];
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&kv);
    PyBuffer_Release(&bv);
    return PyLong_FromUnsignedLongLong(sum);
}

/* mapped_intact(a, b=None) -> bool: whether the objects behind one or two mappings are
 * still at least as long as mapped, one lseek each. a and b (None: only a) are any
 * objects with int attributes fd (the object's descriptor) and size (bytes mapped):
 * shm's segments, whose per-batch check this is (a touch past a shrunk object's end is
 * SIGBUS); taking the objects spares the caller a Python frame per batch. False as soon
 * as one is shorter, or unsure (a negative descriptor, an lseek error, attributes that
 * are not ints in range): the caller then asks each segment for the verdict. The GIL
 * stays held: lseek on a shared-memory object does not block, and releasing the GIL
 * around it cost as much as the system call. */
static PyObject *str_fd, *str_size; /* interned attribute names, set at import */

static int mapping_intact(PyObject *m)
{
    PyObject *fo = PyObject_GetAttr(m, str_fd);
    if (fo == NULL)
        return -1;
    PyObject *so = PyObject_GetAttr(m, str_size);
    if (so == NULL) {
        Py_DECREF(fo);
        return -1;
    }
    int ok = 0;
    if (PyLong_CheckExact(fo) && PyLong_CheckExact(so)) {
        int o1 = 0, o2 = 0;
        long fd = PyLong_AsLongAndOverflow(fo, &o1);
        long long size = PyLong_AsLongLongAndOverflow(so, &o2);
        if (!o1 && !o2 && fd >= 0 && fd <= INT_MAX && size >= 0) {
            off_t end = lseek((int)fd, 0, SEEK_END);
            ok = end >= 0 && (long long)end >= size;
        }
    }
    Py_DECREF(fo);
    Py_DECREF(so);
    return ok;
}

static PyObject *k_mapped_intact(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "mapped_intact(a, b=None): one or two mappings");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        if (args[i] == Py_None)
            continue;
        int ok = mapping_intact(args[i]);
        if (ok < 0)
            return NULL;
        if (!ok)
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* configure(batch_of): lbcore.kernel hands over lbcore.keys.batch_of once it loaded us. */
static PyObject *k_configure(PyObject *mod, PyObject *batch_of)
{
    (void)mod;
    if (!PyCallable_Check(batch_of)) {
        PyErr_SetString(PyExc_TypeError, "configure(batch_of): a callable");
        return NULL;
    }
    Py_INCREF(batch_of);
    Py_XSETREF(LB.batch_of, batch_of);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", k_configure, METH_O, "configure(batch_of): set by lbcore.kernel"},
    {"xxh64", k_xxh64, METH_O, "xxh64(data) -> int: XXH64, seed 0"},
    {"hash_keys", (PyCFunction)(void (*)(void))k_hash_keys, METH_FASTCALL,
     "hash_keys(keys, kind, max_key_bytes) -> uint64 array (max_key_bytes -1: no limit)"},
    {"scatter_add", (PyCFunction)(void (*)(void))lb_scatter_add, METH_FASTCALL,
     "scatter_add(target, index, values, offsets=None): target[offsets[r] + index[j]] += value"},
    {"scatter_add_routed", (PyCFunction)(void (*)(void))lb_scatter_add_routed, METH_FASTCALL,
     "scatter_add_routed(target, slot_map, endpoints, values, offsets=None) -> routed calls"},
    {"add_calls", (PyCFunction)(void (*)(void))lb_add_calls, METH_FASTCALL,
     "add_calls(target, ended, done, starts, geometry): a batching recorder's step"},
    {"record_newest", (PyCFunction)(void (*)(void))lb_record_newest, METH_FASTCALL,
     "record_newest(sink, slot_map, endpoints, started_ns[, duration_ns, now_ns]) -> routed "
     "calls added in the row's newest bucket, or -1 (the recorder's general path then)"},
    {"words_are", (PyCFunction)(void (*)(void))lb_words_are, METH_FASTCALL,
     "words_are(a, i, x[, b, j, y]) -> 1 if a[i] == x (and b[j] == y), 0 if not, -1 if the "
     "read faulted (shared memory shrunk under it)"},
    {"mapped_intact", (PyCFunction)(void (*)(void))k_mapped_intact, METH_FASTCALL,
     "mapped_intact(a, b=None) -> bool: the objects behind mappings .fd still back .size bytes"},
    {"arc_sums", (PyCFunction)(void (*)(void))lb_arc_sums, METH_FASTCALL,
     "arc_sums(hashes, owners, member, out): out[e, v] += each arc of endpoint e in view v "
     "(member: bool, out: float64, both (endpoints, views))"},
    {"floor", k_floor, METH_VARARGS, "floor(keys, width, buckets, shift) -> int (benchmarks)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "lbcore._kernel",
    "lbcore's native kernel: hashing, routing on a plan, recording (see lbcore.kernel).", -1,
    methods, NULL, NULL, NULL, NULL,
};

static PyObject *attr(const char *module, const char *name)
{
    PyObject *m = PyImport_ImportModule(module);
    if (m == NULL)
        return NULL;
    PyObject *a = PyObject_GetAttrString(m, name);
    Py_DECREF(m);
    return a;
}

/* numpy.dtype(name): an instance, which numpy.empty takes without converting it. */
static PyObject *dtype(const char *name)
{
    PyObject *make = attr("numpy", "dtype");
    if (make == NULL)
        return NULL;
    PyObject *d = PyObject_CallFunction(make, "s", name);
    Py_DECREF(make);
    return d;
}

PyMODINIT_FUNC PyInit__kernel(void)
{
    if (sizeof(Py_ssize_t) != 8) {
        PyErr_SetString(PyExc_ImportError, "lbcore's kernel needs a 64-bit platform");
        return NULL;
    }
    if (!(LB.key_type_error = attr("lbcore.errors", "KeyTypeError")) ||
        !(LB.key_encoding_error = attr("lbcore.errors", "KeyEncodingError")) ||
        !(LB.key_too_long_error = attr("lbcore.errors", "KeyTooLongError")) ||
        !(LB.table_error = attr("lbcore.errors", "TableDataError")) ||
        !(LB.fault_error = attr("lbcore.errors", "MappingFaultError")) ||
        !(LB.np_integer = attr("numpy", "integer")) || !(LB.np_empty = attr("numpy", "empty")) ||
        !(LB.np_ndarray = attr("numpy", "ndarray")) ||
        !(LB.argument_error = attr("lbcore.errors", "ArgumentError")) ||
        !(LB.dtype_i32 = dtype("int32")) || !(LB.dtype_u64 = dtype("uint64")) ||
        !(LB.dtype_u8 = dtype("uint8")) || !(LB.dtype_intp = dtype("int64")) ||
        !(str_fd = PyUnicode_InternFromString("fd")) ||
        !(str_size = PyUnicode_InternFromString("size")))
        return NULL;
    if (PyType_Ready(&LB_PlanType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    Py_INCREF(&LB_PlanType);
    /* lbcore.kernel loads only a module built from the sources it was shipped with. */
    if (PyModule_AddIntConstant(m, "ABI", LB_ABI) < 0 ||
        PyModule_AddObject(m, "Plan", (PyObject *)&LB_PlanType) < 0) {
        Py_DECREF(&LB_PlanType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
