/* lbcore._kernel: the module. Loaded by lbcore.kernel (CSLB_KERNEL=auto|native). */
#include "plan.h"

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
        !(LB.np_integer = attr("numpy", "integer")) || !(LB.np_empty = attr("numpy", "empty")) ||
        !(LB.np_ndarray = attr("numpy", "ndarray")) ||
        !(LB.argument_error = attr("lbcore.errors", "ArgumentError")) ||
        !(LB.dtype_i32 = dtype("int32")) || !(LB.dtype_u64 = dtype("uint64")) ||
        !(LB.dtype_u8 = dtype("uint8")) || !(LB.dtype_intp = dtype("int64")))
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
