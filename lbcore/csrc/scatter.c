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
 *
 * A recorder calls this once per fan-out start and end, so what a call costs besides
 * its cells matters: positional arguments only (no keyword parsing), and the few
 * offsets and per-offset values may come as a tuple of ints (no buffer to request).
 * A fan-out of many calls over few slots is added per slot, not per call.
 */
#include "kernel.h"

#include <stdlib.h>
#include <string.h>

#define MAX_TUPLE 16 /* offsets or values given as a tuple: at most this many */

/* A C-contiguous buffer of int64 words (an array, or a memoryview of one: its buffer
 * costs less to take); -1 with TypeError otherwise. */
static int take_words(PyObject *obj, Py_buffer *v, const char *name, int writable)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
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

static int take_i64(PyObject *obj, Py_buffer *v, const char *name, int writable)
{
    if (!PyObject_TypeCheck(obj, (PyTypeObject *)LB.np_ndarray)) {
        PyErr_Format(PyExc_TypeError, "scatter_add: %s must be a contiguous int64 array", name);
        return -1;
    }
    return take_words(obj, v, name, writable);
}

/* An int64 array or a tuple of ints: into *out (pointing at the buffer, or at buf[] for
 * a tuple), its length into *n. A tuple item that is not an int (bool excluded) or does
 * not fit int64 is refused with TypeError / OverflowError. */
static int take_i64s(PyObject *obj, Py_buffer *v, int64_t *buf, const int64_t **out,
                     Py_ssize_t *n, const char *name)
{
    if (PyTuple_CheckExact(obj)) {
        Py_ssize_t k = PyTuple_GET_SIZE(obj);
        if (k > MAX_TUPLE) {
            PyErr_Format(PyExc_ValueError, "scatter_add: %s as a tuple holds at most %d ints",
                         name, MAX_TUPLE);
            return -1;
        }
        for (Py_ssize_t i = 0; i < k; i++) {
            PyObject *item = PyTuple_GET_ITEM(obj, i);
            if (!PyLong_Check(item) || PyBool_Check(item)) {
                PyErr_Format(PyExc_TypeError, "scatter_add: %s must be a contiguous int64 array",
                             name);
                return -1;
            }
            long long x = PyLong_AsLongLong(item);
            if (x == -1 && PyErr_Occurred())
                return -1;
            buf[i] = (int64_t)x;
        }
        *out = buf;
        *n = k;
        return 0;
    }
    if (take_i64(obj, v, name, 0) < 0)
        return -1;
    *out = (const int64_t *)v->buf;
    *n = v->len / 8;
    return 0;
}

/* What one call adds: one value for every cell (scalar), or an int64 array / tuple of
 * values, at each offset (one offset, 0, without). Shared by both entry points so
 * that they parse, bound and add alike. */
typedef struct {
    Py_buffer vv, ov;
    int64_t vbuf[MAX_TUPLE], obuf[MAX_TUPLE];
    const int64_t *values, *offsets;
    Py_ssize_t nv, k;
    int64_t constant;
    int scalar;
} addends;

static int take_addends(PyObject *values_o, PyObject *offsets_o, addends *a)
{
    a->k = 1;
    a->scalar = PyLong_Check(values_o) && !PyBool_Check(values_o);
    if (a->scalar) {
        a->constant = PyLong_AsLongLong(values_o);
        if (a->constant == -1 && PyErr_Occurred())
            return -1;
    } else if (take_i64s(values_o, &a->vv, a->vbuf, &a->values, &a->nv, "values") < 0) {
        return -1;
    }
    if (offsets_o != Py_None &&
        take_i64s(offsets_o, &a->ov, a->obuf, &a->offsets, &a->k, "offsets") < 0)
        return -1;
    return 0;
}

static void release_addends(addends *a)
{
    if (a->vv.obj != NULL)
        PyBuffer_Release(&a->vv);
    if (a->ov.obj != NULL)
        PyBuffer_Release(&a->ov);
}

static inline int64_t offset_at(const addends *a, Py_ssize_t r)
{
    return a->offsets != NULL ? a->offsets[r] : 0;
}

/* The value of every cell at offset r (scalar, or one value per offset). */
static inline uint64_t add_at(const addends *a, Py_ssize_t r)
{
    return a->scalar ? (uint64_t)a->constant : (uint64_t)a->values[r];
}

/* Whether off + lo .. off + hi all lie in 0 .. cells - 1, computed without overflow. */
static inline int cells_fit(int64_t off, int64_t lo, int64_t hi, Py_ssize_t cells)
{
    return lo >= 0 && off >= 0 && hi < cells && off < cells - hi;
}

/* count[x] calls in slot x (x in 0 .. hi, every cell checked): count x value per slot
 * and offset. The caller places the fences. */
static void add_counted(uint64_t *t, const addends *a, const uint64_t *count, int64_t hi)
{
    for (Py_ssize_t r = 0; r < a->k; r++) {
        uint64_t *row = t + offset_at(a, r);
        uint64_t add = add_at(a, r);
        for (int64_t x = 0; x <= hi; x++) {
            if (count[x]) {
                uint64_t *c = row + x;
                STORE_RELAXED(c, LOAD_RELAXED(c) + count[x] * add);
            }
        }
    }
}

/* The writes of scatter_add, under lb_guarded (the target is usually shared memory). */
typedef struct {
    uint64_t *t;
    const addends *a;
    const int64_t *index;
    Py_ssize_t n;
    int uniform;           /* one value per offset */
    const uint64_t *count; /* calls per slot (uniform only), or NULL */
    int64_t hi;
} scatter_call;

static void scatter_run(void *x)
{
    const scatter_call *sc = (const scatter_call *)x;
    const addends *a = sc->a;
    FENCE_RELEASE();
    if (sc->count != NULL) {
        add_counted(sc->t, a, sc->count, sc->hi);
        FENCE_RELEASE();
        return;
    }
    for (Py_ssize_t r = 0; r < a->k; r++) {
        uint64_t *row = sc->t + offset_at(a, r);
        if (sc->uniform) {
            uint64_t add = add_at(a, r);
            for (Py_ssize_t j = 0; j < sc->n; j++) {
                uint64_t *c = row + sc->index[j];
                STORE_RELAXED(c, LOAD_RELAXED(c) + add);
            }
        } else {
            const int64_t *v = a->values + r * sc->n;
            for (Py_ssize_t j = 0; j < sc->n; j++) {
                uint64_t *c = row + sc->index[j];
                STORE_RELAXED(c, LOAD_RELAXED(c) + (uint64_t)v[j]);
            }
        }
    }
    FENCE_RELEASE();
}

int lb_add_cells(uint64_t *target, const int64_t *cells, const int64_t *values, Py_ssize_t n)
{
    addends a = {.k = 1, .values = values, .nv = n};
    scatter_call sc = {target, &a, cells, n, 0, NULL, -1};
    return lb_guarded(scatter_run, &sc);
}

PyObject *lb_scatter_add(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    if (nargs < 3 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "scatter_add(target, index, values, offsets=None)");
        return NULL;
    }
    Py_buffer tv = {0}, iv = {0};
    addends a = {.k = 1};
    PyObject *result = NULL;
    if (take_i64(args[0], &tv, "target", 1) < 0)
        return NULL;
    if (take_i64(args[1], &iv, "index", 0) < 0)
        goto done;
    if (take_addends(args[2], nargs == 4 ? args[3] : Py_None, &a) < 0)
        goto done;
    const Py_ssize_t k = a.k, nv = a.nv;
    Py_ssize_t cells = tv.len / 8, n = iv.len / 8;
    const int64_t *index = (const int64_t *)iv.buf;
    /* values: one for all, one per offset (with offsets), or one per (offset, index). */
    int per_row = !a.scalar && a.offsets != NULL && nv == k && !(nv == k * n && n == 1);
    if (!a.scalar && !per_row && nv != k * n) {
        PyErr_Format(PyExc_ValueError,
                     "scatter_add: %zd values for %zd indices and %zd offset(s); expected one, one "
                     "per offset or one per (offset, index)",
                     nv, n, k);
        goto done;
    }
    /* Every cell is in range iff every index is >= 0 and, per offset, the offset is >= 0
     * and offset + the largest index is below the cell count: one pass over the indices,
     * then one check per offset (the first bad cell is then found for the message). */
    int64_t hi = -1, lo = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t x = index[j];
        hi = x > hi ? x : hi;
        lo = x < lo ? x : lo;
    }
    for (Py_ssize_t r = 0; r < k; r++) {
        int64_t off = offset_at(&a, r);
        if (n == 0 || cells_fit(off, lo, hi, cells))
            continue;
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
        /* Many calls over few slots, one value per offset (a long fan-out's start and
         * end): count the calls per slot once, then add count x value per slot and
         * offset, instead of one addition per call and offset. The same sums. */
        uint64_t *count = NULL;
        if ((a.scalar || per_row) && k > 1 && n > 2 * (hi + 1) && hi < (1 << 16))
            count = (uint64_t *)calloc((size_t)hi + 1, sizeof(uint64_t));
        if (count != NULL)
            for (Py_ssize_t j = 0; j < n; j++)
                count[index[j]]++;
        scatter_call sc = {(uint64_t *)tv.buf, &a, index, n, a.scalar || per_row, count, hi};
        int faulted = lb_guarded(scatter_run, &sc) == LB_FAULTED;
        free(count);
        if (faulted) {
            lb_raise_fault("scatter_add");
            goto done;
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    if (tv.obj != NULL)
        PyBuffer_Release(&tv);
    if (iv.obj != NULL)
        PyBuffer_Release(&iv);
    release_addends(&a);
    return result;
}

/* scatter_add_routed(target, slot_map, endpoints, values, offsets=None) -> routed calls.
 *
 * A fan-out's start or end in one call: endpoint indices as routed (-1: fallback, not
 * recorded) are mapped to counter slots through slot_map (a plan's private copy) and
 * target[offsets[r] + slot_map[endpoints[j]]] += values[r] for every routed call. What
 * the tracker would otherwise do in three (the slots of the routed calls, a new array,
 * then scatter_add). Every endpoint is checked against the map and every mapped cell
 * against the target before the first is written; the same ordering as scatter_add. */
static int take_endpoints(PyObject *obj, Py_buffer *v, int *wide)
{
    if (!PyObject_TypeCheck(obj, (PyTypeObject *)LB.np_ndarray) ||
        PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError,
                        "scatter_add_routed: endpoints must be a contiguous int32 or int64 array");
        return -1;
    }
    const char *f = v->format == NULL ? "B" : v->format;
    if (*f == '=' || *f == '<' || *f == '@')
        f++;
    int ok32 = v->itemsize == 4 && (strcmp(f, "i") == 0 || (strcmp(f, "l") == 0 && sizeof(long) == 4));
    int ok64 = v->itemsize == 8 && f[0] != '\0' && f[1] == '\0' &&
               (f[0] == 'q' || f[0] == 'n' || (f[0] == 'l' && sizeof(long) == 8));
    if (!ok32 && !ok64) {
        PyBuffer_Release(v);
        PyErr_SetString(PyExc_TypeError,
                        "scatter_add_routed: endpoints must be a contiguous int32 or int64 array");
        return -1;
    }
    *wide = ok64;
    return 0;
}

static inline int64_t endpoint_at(const void *buf, int wide, Py_ssize_t j)
{
    return wide ? ((const int64_t *)buf)[j] : (int64_t)((const int32_t *)buf)[j];
}

/* The writes of scatter_add_routed, under lb_guarded. */
typedef struct {
    uint64_t *t;
    const addends *a;
    const int64_t *map;
    const void *endpoints;
    int wide;
    Py_ssize_t n;
    const uint64_t *count; /* calls per slot, or NULL */
    int64_t hi;
} routed_call;

static void routed_run(void *x)
{
    const routed_call *rc = (const routed_call *)x;
    const addends *a = rc->a;
    FENCE_RELEASE();
    if (rc->count != NULL) {
        add_counted(rc->t, a, rc->count, rc->hi);
    } else {
        for (Py_ssize_t r = 0; r < a->k; r++) {
            uint64_t *row = rc->t + offset_at(a, r);
            uint64_t add = add_at(a, r);
            for (Py_ssize_t j = 0; j < rc->n; j++) {
                int64_t e = endpoint_at(rc->endpoints, rc->wide, j);
                if (e < 0)
                    continue;
                uint64_t *c = row + rc->map[e];
                STORE_RELAXED(c, LOAD_RELAXED(c) + add);
            }
        }
    }
    FENCE_RELEASE();
}

/* The checks and writes of scatter_add_routed (values checked already): 0 with the
 * routed calls in *routedp, ROUTED_ERROR with an exception set (nothing added), or
 * ROUTED_FAULTED (a fault cut the writes short; no exception set). columns >= 0: every
 * mapped slot must also be below it (ROUTED_ERROR otherwise). */
#define ROUTED_ERROR 1
#define ROUTED_FAULTED 2
static int add_routed(const Py_buffer *tv, const Py_buffer *mv, const Py_buffer *ev, int wide,
                      const addends *a, int64_t columns, Py_ssize_t *routedp)
{
    Py_ssize_t routed = 0;
    Py_ssize_t cells = tv->len / 8, n = ev->len / ev->itemsize, eps = mv->len / 8;
    const int64_t *map = (const int64_t *)mv->buf;
    /* One pass: every endpoint in -1 .. eps - 1, the routed calls' slot range. */
    int64_t hi = -1, lo = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t e = endpoint_at(ev->buf, wide, j);
        if (e == -1)
            continue;
        if (e < -1 || e >= eps) {
            PyErr_Format(PyExc_IndexError,
                         "scatter_add_routed: endpoint %lld at position %zd is not in -1..%zd; "
                         "nothing was added",
                         (long long)e, j, eps - 1);
            return ROUTED_ERROR;
        }
        int64_t x = map[e];
        hi = x > hi ? x : hi;
        lo = x < lo ? x : lo;
        routed++;
    }
    if (columns >= 0 && hi >= columns) {
        PyErr_Format(PyExc_IndexError, "slot %lld is not below the row's %lld columns",
                     (long long)hi, (long long)columns);
        return ROUTED_ERROR;
    }
    for (Py_ssize_t r = 0; routed && r < a->k; r++) {
        int64_t off = offset_at(a, r);
        if (cells_fit(off, lo, hi, cells))
            continue;
        int64_t bad = lo < 0 ? lo : hi;
        PyErr_Format(PyExc_IndexError,
                     "scatter_add_routed: cell %lld (offset %lld + slot %lld) is outside the "
                     "target's %zd cells; nothing was added",
                     (long long)((uint64_t)off + (uint64_t)bad), (long long)off, (long long)bad,
                     cells);
        return ROUTED_ERROR;
    }
    if (routed) {
        /* Many calls over few slots (a long fan-out): count the calls per slot once, then
         * add count x value per slot and offset. The same sums. */
        uint64_t *count = NULL;
        if (a->k > 1 && routed > 2 * (hi + 1) && hi < (1 << 16))
            count = (uint64_t *)calloc((size_t)hi + 1, sizeof(uint64_t));
        if (count != NULL)
            for (Py_ssize_t j = 0; j < n; j++) {
                int64_t e = endpoint_at(ev->buf, wide, j);
                if (e >= 0)
                    count[map[e]]++;
            }
        routed_call rc = {(uint64_t *)tv->buf, a, map, ev->buf, wide, n, count, hi};
        int faulted = lb_guarded(routed_run, &rc) == LB_FAULTED;
        free(count);
        if (faulted)
            return ROUTED_FAULTED;
    }
    *routedp = routed;
    return 0;
}

PyObject *lb_scatter_add_routed(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    if (nargs < 4 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError,
                        "scatter_add_routed(target, slot_map, endpoints, values, offsets=None)");
        return NULL;
    }
    Py_buffer tv = {0}, mv = {0}, ev = {0};
    addends a = {.k = 1};
    Py_ssize_t routed = 0;
    PyObject *result = NULL;
    int wide = 0;
    if (take_i64(args[0], &tv, "target", 1) < 0)
        return NULL;
    if (take_i64(args[1], &mv, "slot_map", 0) < 0)
        goto done;
    if (take_endpoints(args[2], &ev, &wide) < 0)
        goto done;
    if (take_addends(args[3], nargs == 5 ? args[4] : Py_None, &a) < 0)
        goto done;
    const Py_ssize_t k = a.k;
    if (!a.scalar && a.nv != k) {
        PyErr_Format(PyExc_ValueError,
                     "scatter_add_routed: %zd values for %zd offset(s); expected one, or one "
                     "per offset",
                     a.nv, k);
        goto done;
    }
    int rc = add_routed(&tv, &mv, &ev, wide, &a, -1, &routed);
    if (rc == ROUTED_FAULTED)
        lb_raise_fault("scatter_add_routed");
    if (rc != 0)
        goto done;
    result = PyLong_FromSsize_t(routed);
done:
    if (tv.obj != NULL)
        PyBuffer_Release(&tv);
    if (mv.obj != NULL)
        PyBuffer_Release(&mv);
    if (ev.obj != NULL)
        PyBuffer_Release(&ev);
    release_addends(&a);
    return result;
}

/* record_newest(sink, slot_map, endpoints, started_ns[, duration_ns, now_ns]) -> calls.
 *
 * A fan-out's start (four arguments) or end (six) through a plan's slot map, when it
 * falls in the counter row's newest bucket: the cells a recorder's start or end adds
 * there, in this one call (no Python frame, no second call for the epoch check). sink
 * is the recorder's (row, control, index, epoch, columns, lo, hi, start offsets, end
 * offsets) for its newest bucket [lo, hi) ns. A start adds 1 in flight and its offset
 * into the bucket; an end that started in the bucket takes it out again and adds its
 * busy time, one completion, its latency and one request. Returns the routed calls
 * added, or -1 with nothing added and no error set when the recorder's general path
 * must do it: another bucket, a matrix that moved, anything out of range (that path
 * says what), or a fault. Holds the GIL; the caller holds the row's lock (a rotation
 * changes the bucket). */
static int sink_int(PyObject *sink, Py_ssize_t i, int64_t *out)
{
    PyObject *o = PyTuple_GET_ITEM(sink, i);
    if (!PyLong_CheckExact(o))
        return -1;
    long long x = PyLong_AsLongLong(o);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)x;
    return 0;
}

PyObject *lb_record_newest(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    if ((nargs != 4 && nargs != 6) || !PyTuple_CheckExact(args[0]) ||
        PyTuple_GET_SIZE(args[0]) != 9) {
        PyErr_SetString(PyExc_TypeError, "record_newest(sink, slot_map, endpoints, started_ns"
                                         "[, duration_ns, now_ns])");
        return NULL;
    }
    PyObject *sink = args[0];
    int64_t index, epoch, columns, lo, hi, started, duration = 0, now = 0;
    Py_buffer tv = {0}, cv = {0}, mv = {0}, ev = {0};
    addends a = {.k = 1};
    Py_ssize_t routed = -1;
    int wide = 0, end = nargs == 6;
    if (sink_int(sink, 2, &index) < 0 || sink_int(sink, 3, &epoch) < 0 ||
        sink_int(sink, 4, &columns) < 0 || sink_int(sink, 5, &lo) < 0 ||
        sink_int(sink, 6, &hi) < 0 || !PyLong_CheckExact(args[3]))
        goto done;
    started = PyLong_AsLongLong(args[3]);
    if (end) {
        if (!PyLong_CheckExact(args[4]) || !PyLong_CheckExact(args[5]))
            goto done;
        duration = PyLong_AsLongLong(args[4]);
        now = PyLong_AsLongLong(args[5]);
    }
    if (PyErr_Occurred() || started < lo || duration < 0 ||
        (end ? now < lo || now >= hi : started >= hi))
        goto done;
    if (take_i64s(PyTuple_GET_ITEM(sink, end ? 8 : 7), &a.ov, a.obuf, &a.offsets, &a.k,
                  "offsets") < 0 ||
        a.k != (end ? 6 : 2))
        goto done;
    /* The cells of a start, and of an end of a call that started in this bucket. */
    const int64_t start_values[2] = {1, started - lo};
    const int64_t end_values[6] = {-1, lo - started, duration, 1, duration, 1};
    a.values = end ? end_values : start_values;
    a.nv = a.k;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(sink, 1), &cv, PyBUF_C_CONTIGUOUS) < 0 ||
        cv.itemsize != 8 || ((uintptr_t)cv.buf & 7) != 0 || index < 0 || index >= cv.len / 8 ||
        lb_word_is((const uint64_t *)cv.buf + index, (uint64_t)epoch) != 1)
        goto done;
    /* The row and the slot map: memoryviews, as the recorder and a snapshot pass them. */
    if (take_words(PyTuple_GET_ITEM(sink, 0), &tv, "target", 1) < 0 ||
        take_words(args[1], &mv, "slot_map", 0) < 0 || take_endpoints(args[2], &ev, &wide) < 0 ||
        (((uintptr_t)tv.buf | (uintptr_t)mv.buf) & 7) != 0)
        goto done;
    Py_ssize_t added = 0;
    if (add_routed(&tv, &mv, &ev, wide, &a, columns, &added) == 0)
        routed = added;
done:
    PyErr_Clear();
    if (tv.obj != NULL)
        PyBuffer_Release(&tv);
    if (cv.obj != NULL)
        PyBuffer_Release(&cv);
    if (mv.obj != NULL)
        PyBuffer_Release(&mv);
    if (ev.obj != NULL)
        PyBuffer_Release(&ev);
    release_addends(&a);
    return PyLong_FromSsize_t(routed);
}
