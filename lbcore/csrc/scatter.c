/* scatter_add: the recording primitive of shm's counter rows.
 *
 * Adds values to cells of an int64 buffer (a worker's own counter row, which other
 * processes read): target[offsets[r] + index[j]] += value(r, j). Every cell is checked
 * before the first is written, so a bad index records nothing. The caller owns the row
 * (one writer per row, threads of a process serialized by its lock), so each cell is a
 * plain load and store; they are atomic (a reader never sees a torn word) and ordered
 * after every earlier store of this thread and before every later one by release fences
 * (arm64 would otherwise let a reader see a count before the bucket stamp it belongs
 * to). The GIL stays held: no other thread of ours writes the row meanwhile.
 */
#include "kernel.h"

#include <string.h>

static int take_i64(PyObject *obj, Py_buffer *v, const char *name, int writable)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (!PyObject_TypeCheck(obj, (PyTypeObject *)LB.np_ndarray)) {
        PyErr_Format(PyExc_TypeError, "scatter_add: %s must be a contiguous int64 array", name);
        return -1;
    }
    if (PyObject_GetBuffer(obj, v, flags) < 0) {
        int readonly = writable && PyObject_CheckBuffer(obj);
        PyErr_Clear();
        if (readonly && PyObject_GetBuffer(obj, v, flags & ~PyBUF_WRITABLE) == 0) {
            PyBuffer_Release(v);
            PyErr_Format(PyExc_TypeError, "scatter_add: %s must be writable", name);
        } else {
            PyErr_Format(PyExc_TypeError, "scatter_add: %s must be a contiguous int64 array", name);
        }
        return -1;
    }
    const char *f = v->format == NULL ? "B" : v->format;
    if (*f == '=' || *f == '<' || *f == '@')
        f++;
    int ok = v->itemsize == 8 && f[0] != '\0' && f[1] == '\0' &&
             (f[0] == 'q' || f[0] == 'n' || (f[0] == 'l' && sizeof(long) == 8));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "scatter_add: %s must be a contiguous int64 array", name);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

PyObject *lb_scatter_add(PyObject *mod, PyObject *args, PyObject *kwargs)
{
    (void)mod;
    static char *names[] = {"target", "index", "values", "offsets", NULL};
    PyObject *target_o, *index_o, *values_o, *offsets_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|O", names, &target_o, &index_o, &values_o,
                                     &offsets_o))
        return NULL;
    Py_buffer tv = {0}, iv = {0}, vv = {0}, ov = {0};
    PyObject *result = NULL;
    int64_t constant = 0;
    int scalar = PyLong_Check(values_o) && !PyBool_Check(values_o);
    if (take_i64(target_o, &tv, "target", 1) < 0)
        return NULL;
    if (take_i64(index_o, &iv, "index", 0) < 0)
        goto done;
    if (scalar) {
        constant = PyLong_AsLongLong(values_o);
        if (constant == -1 && PyErr_Occurred())
            goto done;
    } else if (take_i64(values_o, &vv, "values", 0) < 0) {
        goto done;
    }
    if (offsets_o != Py_None && take_i64(offsets_o, &ov, "offsets", 0) < 0)
        goto done;
    Py_ssize_t cells = tv.len / 8, n = iv.len / 8;
    Py_ssize_t k = ov.obj != NULL ? ov.len / 8 : 1;
    const int64_t *index = (const int64_t *)iv.buf;
    const int64_t *offsets = (const int64_t *)ov.buf;
    const int64_t *values = (const int64_t *)vv.buf;
    Py_ssize_t nv = scalar ? 0 : vv.len / 8;
    /* values: one for all, one per offset (with offsets), or one per (offset, index). */
    int per_row = !scalar && ov.obj != NULL && nv == k && !(nv == k * n && n == 1);
    if (!scalar && !per_row && nv != k * n) {
        PyErr_Format(PyExc_ValueError,
                     "scatter_add: %zd values for %zd indices and %zd offset(s); expected one, one "
                     "per offset or one per (offset, index)",
                     nv, n, k);
        goto done;
    }
    for (Py_ssize_t r = 0; r < k; r++) {
        int64_t off = offsets != NULL ? offsets[r] : 0;
        for (Py_ssize_t j = 0; j < n; j++) {
            int64_t cell = (int64_t)((uint64_t)off + (uint64_t)index[j]);
            if (off < 0 || index[j] < 0 || cell < 0 || cell >= cells) {
                PyErr_Format(PyExc_IndexError,
                             "scatter_add: index %lld (offset %lld + %lld at position %zd) is outside "
                             "the target's %zd cells; nothing was added",
                             (long long)cell, (long long)off, (long long)index[j], j, cells);
                goto done;
            }
        }
    }
    {
        uint64_t *t = (uint64_t *)tv.buf;
        FENCE_RELEASE();
        for (Py_ssize_t r = 0; r < k; r++) {
            int64_t off = offsets != NULL ? offsets[r] : 0;
            for (Py_ssize_t j = 0; j < n; j++) {
                uint64_t add = scalar ? (uint64_t)constant
                               : per_row ? (uint64_t)values[r]
                                         : (uint64_t)values[r * n + j];
                uint64_t *c = t + off + index[j];
                STORE_RELAXED(c, LOAD_RELAXED(c) + add);
            }
        }
        FENCE_RELEASE();
    }
    result = Py_None;
    Py_INCREF(result);
done:
    if (tv.obj != NULL)
        PyBuffer_Release(&tv);
    if (iv.obj != NULL)
        PyBuffer_Release(&iv);
    if (vv.obj != NULL)
        PyBuffer_Release(&vv);
    if (ov.obj != NULL)
        PyBuffer_Release(&ov);
    return result;
}
