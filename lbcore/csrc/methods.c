/* lbcore._kernel.Plan's methods: the Python side of routing (arguments, keys, the
 * output array, the result), around route.c's rules, which touch no Python object.
 */
#include "plan.h"

#include <string.h>

#define STACK_KEYS 256 /* the hashes of a batch this short stay on the stack */

/* A retry number, as lbcore.plan checks it: a non-negative int or NumPy integer (not a
 * bool); one beyond every endpoint count routes every key to fallback. */
static int parse_attempt(PyObject *o, Py_ssize_t *attempt)
{
    *attempt = 0;
    if (o == NULL)
        return 0;
    PyObject *v;
    if (PyLong_CheckExact(o)) {
        v = o;
        Py_INCREF(v);
    } else if (!PyBool_Check(o) &&
               (PyLong_Check(o) || PyObject_TypeCheck(o, (PyTypeObject *)LB.np_integer))) {
        v = PyNumber_Index(o);
        if (v == NULL)
            return -1;
    } else {
        goto bad;
    }
    int overflow;
    long long a = PyLong_AsLongLongAndOverflow(v, &overflow);
    Py_DECREF(v);
    if (a == -1 && PyErr_Occurred())
        return -1;
    if (overflow < 0 || (!overflow && a < 0))
        goto bad;
    *attempt = overflow ? PY_SSIZE_T_MAX : (Py_ssize_t)a;
    return 0;
bad:
    PyErr_Format(LB.argument_error, "attempt must be a non-negative integer, got %R", o);
    return -1;
}

/* The (keys, attempt=0) or (hashes, attempt=0) of a vectorcall; -1 with an error set. */
static int call_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *sig,
                     Py_ssize_t *attempt)
{
    PyObject *a = nargs == 2 ? args[1] : NULL;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs < 1 || nargs > 2 || nkw > 1 || (nkw && nargs == 2))
        goto bad;
    if (nkw) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, 0);
        if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, "attempt") != 0)
            goto bad;
        a = args[nargs];
    }
    return parse_attempt(a, attempt);
bad:
    PyErr_Format(PyExc_TypeError, "%s takes (keys, attempt=0)", sig);
    return -1;
}

/* Routing with the table's memory under lb_guarded (a table's segment shrunk under the
 * plan cuts the batch short instead of killing the process), and the sequence check
 * after it. A bounded walk's scratch allocated before a fault is not freed: a few bytes
 * per endpoint, once per fault, which only a hostile shrink causes. */
typedef struct {
    const LBPlan *p;
    const uint64_t *h;
    Py_ssize_t n, attempt;
    int32_t *out;
    lb_counts *c;
    int valid;
} route_call;

static void route_call_run(void *x)
{
    route_call *r = (route_call *)x;
    lb_route_hashes(r->p, r->h, r->n, r->out, r->attempt, r->c);
    r->valid = lb_still_valid(r->p);
}

/* 0, or LB_FAULTED (nothing to report yet: the caller raises holding the GIL). */
static int route_guarded(const LBPlan *p, const uint64_t *h, Py_ssize_t n, int32_t *out,
                         Py_ssize_t attempt, lb_counts *c, int *valid)
{
    route_call r = {p, h, n, attempt, out, c, 0};
    if (lb_guarded(route_call_run, &r) == LB_FAULTED)
        return LB_FAULTED;
    *valid = r.valid;
    return 0;
}

/* (indices, fallbacks, moves, valid), and counted after them when it is not -1. */
static PyObject *finish(PyObject *arr, const lb_counts *c, int valid, int counted)
{
    if (c->bad == 2) {
        Py_DECREF(arr);
        return PyErr_NoMemory();
    }
    if (c->bad && valid) {
        Py_DECREF(arr);
        PyErr_SetString(LB.table_error,
                        "ring table holds an entry out of range (damaged, or rewritten while "
                        "it was read)");
        return NULL;
    }
    PyObject *out = PyTuple_New(counted < 0 ? 4 : 5), *fallbacks = NULL, *moves = NULL;
    if (out == NULL || (fallbacks = PyLong_FromSsize_t(c->fallbacks)) == NULL ||
        (moves = PyLong_FromSsize_t(c->moves)) == NULL) {
        Py_XDECREF(out);
        Py_XDECREF(fallbacks);
        Py_DECREF(arr);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, arr);
    PyTuple_SET_ITEM(out, 1, fallbacks);
    PyTuple_SET_ITEM(out, 2, moves);
    PyTuple_SET_ITEM(out, 3, PyBool_FromLong(valid));
    if (counted >= 0)
        PyTuple_SET_ITEM(out, 4, PyBool_FromLong(counted));
    return out;
}

/* Whether anything but the plan's cache can still reach array a: another reference, or
 * a weak one (which would see the array change under it). */
static int reachable(PyObject *a)
{
    if (Py_REFCNT(a) != 1)
        return 1;
    Py_ssize_t off = Py_TYPE(a)->tp_weaklistoffset;
    if (off == 0)
        return 0;
    return off < 0 || *(PyObject **)((char *)a + off) != NULL;
}

/* A writable int32 array of n elements for a routing answer, and its buffer (a new
 * reference). An array the plan returned earlier is handed out again once nothing else
 * refers to it (so no caller ever shares one with another call), and only if it is
 * still a plain 1-D int32 array of that length: NumPy's allocation costs more than
 * routing a key. */
static PyObject *output(LBPlan *p, Py_ssize_t n, Py_buffer *view)
{
    int slot = -1;
    for (int i = 0; i < LB_OUT_CACHE; i++) {
        PyObject *a = p->out_cache[i];
        if (a == NULL || reachable(a)) {
            if (slot < 0 && a == NULL)
                slot = i;
            continue;
        }
        if (slot < 0)
            slot = i;
        if (PyObject_GetBuffer(a, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            PyErr_Clear();
            continue;
        }
        const char *f = view->format == NULL ? "B" : view->format;
        if (*f == '=' || *f == '<' || *f == '@')
            f++;
        if (view->ndim == 1 && view->itemsize == 4 && view->len == n * 4 && strcmp(f, "i") == 0) {
            Py_INCREF(a);
            return a;
        }
        PyBuffer_Release(view);
    }
    PyObject *a = lb_new_array(n, LB.dtype_i32, view);
    if (a != NULL && n <= LB_OUT_CACHE_MAX) {
        if (slot < 0) { /* every kept array is still in use: replace the oldest */
            slot = (int)(p->out_next % LB_OUT_CACHE);
            p->out_next++;
        }
        Py_INCREF(a);
        Py_XSETREF(p->out_cache[slot], a);
    }
    return a;
}

/* The answer array of a batch of keys (a new reference), its counts and validity; NULL
 * with an exception set. */
static PyObject *route_keys(LBPlan *p, PyObject *keys, Py_ssize_t attempt, lb_counts *cp,
                            int *validp)
{
    lb_keys k;
    if (lb_keys_open(&k, keys, NULL, p->max_key_bytes) < 0)
        return NULL;
    Py_ssize_t n = k.n;
    Py_buffer ov;
    PyObject *arr = output(p, n, &ov);
    if (arr == NULL) {
        lb_keys_close(&k);
        return NULL;
    }
    uint64_t stack[STACK_KEYS];
    uint64_t *h = n <= STACK_KEYS ? stack : (uint64_t *)PyMem_RawMalloc((size_t)n * sizeof(uint64_t));
    lb_counts c = {0, 0, 0};
    int rc, valid = 0, faulted = 0;
    int32_t *out = (int32_t *)ov.buf;
    if (h == NULL) {
        PyErr_NoMemory();
        rc = -2;
    } else if (lb_keys_nogil_ok(&k) && n >= LB_NOGIL_MIN) {
        Py_BEGIN_ALLOW_THREADS
        rc = lb_hash_keys(&k, h);
        if (rc == 0)
            faulted = route_guarded(p, h, n, out, attempt, &c, &valid);
        Py_END_ALLOW_THREADS
    } else {
        rc = lb_hash_keys(&k, h);
        if (rc == 0) {
            if (n >= LB_NOGIL_MIN) {
                Py_BEGIN_ALLOW_THREADS
                faulted = route_guarded(p, h, n, out, attempt, &c, &valid);
                Py_END_ALLOW_THREADS
            } else {
                faulted = route_guarded(p, h, n, out, attempt, &c, &valid);
            }
        }
    }
    if (rc == -1)
        lb_keys_raise(&k);
    if (h != stack)
        PyMem_RawFree(h);
    lb_keys_close(&k);
    PyBuffer_Release(&ov);
    if (rc == 0 && faulted)
        rc = lb_raise_fault("Plan.route");
    if (rc < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    *cp = c;
    *validp = valid;
    return arr;
}

/* Plan.route(keys, attempt=0): lbcore.plan.Plan.route itself. */
PyObject *lb_plan_route(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Py_ssize_t attempt;
    if (call_args(args, nargs, kwnames, "route", &attempt) < 0)
        return NULL;
    lb_counts c = {0, 0, 0};
    int valid = 0;
    PyObject *arr = route_keys((LBPlan *)self, args[0], attempt, &c, &valid);
    return arr == NULL ? NULL : finish(arr, &c, valid, -1);
}

/* An 8-byte-word buffer of at least `words` words from `at` on (writable if asked). */
static int words_from(PyObject *o, Py_buffer *v, Py_ssize_t at, Py_ssize_t words, int writable,
                      const char *name)
{
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (v->itemsize != 8 || ((uintptr_t)v->buf & 7) != 0 || at < 0 || at > v->len / 8 - words) {
        PyBuffer_Release(v);
        PyErr_Format(PyExc_IndexError,
                     "route_counted: %s must hold %zd aligned 8-byte words from word %zd", name,
                     words, at);
        return -1;
    }
    return 0;
}

/* Plan.route_counted(keys, attempt, sink, totals): Plan.route, and the batch's decision
 * counts added in the same call to a counter row's decisions, fallbacks and moves
 * cells and to totals[0..2], while the row's matrix is still the current one. sink is
 * (row, cell, control, index, epoch): the row's int64 words, the word of its decisions
 * count, and the control words whose word `index` names the current matrix (`epoch`);
 * None: no row, nothing counted.
 * The adds run holding the GIL, so no other thread of the process writes those cells
 * meanwhile (the recorder's Python steps run between kernel calls, never inside one).
 * A fifth item says whether the counts were added: not for an invalid answer, an empty
 * batch, a matrix that moved, or a fault (the caller counts the slow way then, which
 * follows the matrix or names the shrunk segment). */
PyObject *lb_plan_route_counted(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || (args[2] != Py_None && (!PyTuple_CheckExact(args[2]) ||
                                              PyTuple_GET_SIZE(args[2]) != 5))) {
        PyErr_SetString(PyExc_TypeError, "route_counted(keys, attempt, (row, cell, control, "
                                         "index, epoch) or None, totals)");
        return NULL;
    }
    Py_ssize_t attempt;
    if (parse_attempt(args[1], &attempt) < 0)
        return NULL;
    PyObject *sink = args[2];
    if (sink == Py_None) {
        lb_counts c = {0, 0, 0};
        int valid = 0;
        PyObject *arr = route_keys((LBPlan *)self, args[0], attempt, &c, &valid);
        return arr == NULL ? NULL : finish(arr, &c, valid, 0);
    }
    Py_ssize_t cell = PyLong_AsSsize_t(PyTuple_GET_ITEM(sink, 1));
    Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(sink, 3));
    uint64_t epoch = (uint64_t)PyLong_AsLongLong(PyTuple_GET_ITEM(sink, 4)); /* -1: none */
    if (PyErr_Occurred())
        return NULL;
    Py_buffer rv, cv, tv;
    if (words_from(PyTuple_GET_ITEM(sink, 0), &rv, cell, 3, 1, "the row") < 0)
        return NULL;
    if (words_from(PyTuple_GET_ITEM(sink, 2), &cv, at, 1, 0, "the control words") < 0) {
        PyBuffer_Release(&rv);
        return NULL;
    }
    if (words_from(args[3], &tv, 0, 3, 1, "totals") < 0) {
        PyBuffer_Release(&rv);
        PyBuffer_Release(&cv);
        return NULL;
    }
    lb_counts c = {0, 0, 0};
    int valid = 0, counted = 0;
    PyObject *arr = route_keys((LBPlan *)self, args[0], attempt, &c, &valid);
    Py_ssize_t n = arr == NULL ? 0 : PyObject_Length(arr);
    if (arr != NULL && valid && !c.bad && n > 0 &&
        lb_word_is((const uint64_t *)cv.buf + at, epoch) == 1) {
        const int64_t cells[3] = {cell, cell + 1, cell + 2};
        const int64_t values[3] = {n, c.fallbacks, c.moves};
        const int64_t firsts[3] = {0, 1, 2};
        if (lb_add_cells((uint64_t *)rv.buf, cells, values, 3) == 0) {
            counted = 1;
            /* (Guarded too: the caller's buffer is trusted no more than the row.) */
            (void)lb_add_cells((uint64_t *)tv.buf, firsts, values, 3);
        }
    }
    PyBuffer_Release(&rv);
    PyBuffer_Release(&cv);
    PyBuffer_Release(&tv);
    return arr == NULL ? NULL : finish(arr, &c, valid, counted);
}

/* Plan.route_hashes(hashes, attempt=0): precomputed uint64 key hashes (checked by
 * lbcore.plan). */
PyObject *lb_plan_route_hashes(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    LBPlan *p = (LBPlan *)self;
    Py_ssize_t attempt;
    if (call_args(args, nargs, kwnames, "route_hashes", &attempt) < 0)
        return NULL;
    Py_buffer hv;
    if (PyObject_GetBuffer(args[0], &hv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (hv.itemsize != 8 || hv.len % 8) {
        PyBuffer_Release(&hv);
        PyErr_SetString(PyExc_ValueError, "hashes must be a contiguous uint64 array");
        return NULL;
    }
    Py_ssize_t n = hv.len / 8;
    Py_buffer ov;
    PyObject *arr = output(p, n, &ov);
    if (arr == NULL) {
        PyBuffer_Release(&hv);
        return NULL;
    }
    lb_counts c = {0, 0, 0};
    int valid = 0, faulted;
    const uint64_t *h = (const uint64_t *)hv.buf;
    if (n >= LB_NOGIL_MIN) {
        Py_BEGIN_ALLOW_THREADS
        faulted = route_guarded(p, h, n, (int32_t *)ov.buf, attempt, &c, &valid);
        Py_END_ALLOW_THREADS
    } else {
        faulted = route_guarded(p, h, n, (int32_t *)ov.buf, attempt, &c, &valid);
    }
    PyBuffer_Release(&hv);
    PyBuffer_Release(&ov);
    if (faulted) {
        Py_DECREF(arr);
        lb_raise_fault("Plan.route_hashes");
        return NULL;
    }
    return finish(arr, &c, valid, -1);
}

/* Plan.answers(): the attempt-0 answer and the plain answer for every (view, position). */
PyObject *lb_plan_answers(PyObject *self, PyObject *unused)
{
    (void)unused;
    const LBPlan *p = (const LBPlan *)self;
    Py_ssize_t cells = p->closed ? 0 : p->views * p->size;
    Py_buffer av, pv;
    PyObject *answer_arr = lb_new_array(cells, LB.dtype_i32, &av);
    if (answer_arr == NULL)
        return NULL;
    PyObject *plain_arr = lb_new_array(cells, LB.dtype_i32, &pv);
    if (plain_arr == NULL) {
        PyBuffer_Release(&av);
        Py_DECREF(answer_arr);
        return NULL;
    }
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    lb_answer_all(p, (int32_t *)av.buf, (int32_t *)pv.buf, &bad);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&av);
    PyBuffer_Release(&pv);
    if (bad == 2 || (bad && lb_still_valid(p))) {
        Py_DECREF(answer_arr);
        Py_DECREF(plain_arr);
        if (bad == 2)
            return PyErr_NoMemory();
        PyErr_SetString(LB.table_error, "ring table holds an entry out of range");
        return NULL;
    }
    return Py_BuildValue("(NN)", answer_arr, plain_arr);
}

/* Plan.counter_slots(indices): the counter slot of each routed call (index >= 0) and,
 * if some calls are fallback (-1), the positions of the routed ones. */
PyObject *lb_plan_counter_slots(PyObject *self, PyObject *idx)
{
    const LBPlan *p = (const LBPlan *)self;
    Py_buffer iv;
    if (PyObject_GetBuffer(idx, &iv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    const char *f = iv.format == NULL ? "B" : iv.format;
    if (*f == '=' || *f == '<' || *f == '@')
        f++;
    if (iv.itemsize != 4 || strcmp(f, "i") != 0) {
        PyBuffer_Release(&iv);
        PyErr_SetString(LB.argument_error, "indices must be a contiguous int32 array");
        return NULL;
    }
    const int32_t *in = (const int32_t *)iv.buf;
    Py_ssize_t n = iv.len / 4, routed = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (in[i] < -1 || in[i] >= p->n) {
            PyErr_Format(LB.argument_error, "endpoint index %d at position %zd is not in -1..%zd",
                         in[i], i, p->n - 1);
            PyBuffer_Release(&iv);
            return NULL;
        }
        routed += in[i] >= 0;
    }
    Py_buffer sv, qv;
    PyObject *slots = lb_new_array(routed, LB.dtype_intp, &sv);
    if (slots == NULL) {
        PyBuffer_Release(&iv);
        return NULL;
    }
    PyObject *where = Py_None;
    Py_INCREF(where);
    if (routed != n) {
        Py_DECREF(where);
        where = lb_new_array(routed, LB.dtype_intp, &qv);
        if (where == NULL) {
            PyBuffer_Release(&sv);
            Py_DECREF(slots);
            PyBuffer_Release(&iv);
            return NULL;
        }
    }
    int64_t *s = (int64_t *)sv.buf;
    for (Py_ssize_t i = 0, j = 0; i < n; i++) {
        if (in[i] < 0)
            continue;
        s[j] = p->slots[in[i]];
        if (where != Py_None)
            ((int64_t *)qv.buf)[j] = i;
        j++;
    }
    if (where != Py_None)
        PyBuffer_Release(&qv);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&iv);
    return Py_BuildValue("(NN)", slots, where);
}
