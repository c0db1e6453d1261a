/* add_calls: a batching recorder's step (many calls' ends and starts) in one call.
 *
 * shm owns the row protocol: it rotates the row's bucket columns, follows grown
 * counters and holds the row's lock; it hands over the row, the calls as its own
 * Python lists, and the row's geometry as it stands after rotating. This adds what
 * each call means to the row, the same cells Recorder.record_end and record_start
 * add: an ended call leaves the in-flight count of its start bucket (or of open_old),
 * its busy time is spread over the buckets held that it overlaps, and unless cut
 * short it counts as completed, with its latency and failure kind, in the bucket it
 * ended in (clipped to the held ones); a call still out enters the in-flight count
 * of its start bucket. Everything is read and checked first (types, slots, kinds,
 * times, the geometry against the row): on any error nothing is added. Then the ends
 * are written, a release fence, then the starts: a reader never sees a call in
 * flight that is not. No Python code runs meanwhile (exact reads of ints, lists and a
 * dict), and the GIL stays held.
 */
#include "kernel.h"

#include <stdlib.h>

#define TIME_LIMIT ((int64_t)1 << 62) /* times in 0 .. 2^62 ns: no overflow below */

enum {
    G_BUCKET_NS, G_BUCKETS, G_COLUMNS, G_NEWEST, G_KINDS, G_OPEN, G_OPEN_SUM, G_OPEN_OLD,
    G_BUSY, G_COMPLETED, G_LATENCY, G_REQUESTS, G_FAILURES, G_FAILURES_TOTAL, G_KIND,
    G_KIND_TOTAL, G_N
};

static int take_int(PyObject *o, int64_t *out, const char *what)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "add_calls: %s must be ints", what);
        return -1;
    }
    long long x = PyLong_AsLongLong(o);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)x;
    return 0;
}

/* Python-style floor division and modulo for b > 0 (times are >= 0, periods may not). */
static inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static inline int64_t floor_mod(int64_t a, int64_t b) { return a - floor_div(a, b) * b; }

typedef struct {
    int64_t *cell;
    int64_t *val;
    Py_ssize_t n, cap;
} adds;

static int push(adds *a, int64_t cell, int64_t v)
{
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? 2 * a->cap : 64;
        int64_t *c = (int64_t *)realloc(a->cell, (size_t)cap * sizeof(int64_t));
        if (c == NULL)
            return -1;
        a->cell = c;
        int64_t *v2 = (int64_t *)realloc(a->val, (size_t)cap * sizeof(int64_t));
        if (v2 == NULL)
            return -1;
        a->val = v2;
        a->cap = cap;
    }
    a->cell[a->n] = cell;
    a->val[a->n] = v;
    a->n++;
    return 0;
}

typedef struct {
    uint64_t *t;
    const adds *ends, *starts;
} adds_call;

static void write_adds(uint64_t *t, const adds *a)
{
    FENCE_RELEASE();
    for (Py_ssize_t i = 0; i < a->n; i++) {
        uint64_t *c = t + a->cell[i];
        STORE_RELAXED(c, LOAD_RELAXED(c) + (uint64_t)a->val[i]);
    }
    FENCE_RELEASE();
}

/* Ends before starts, under lb_guarded (the row is shared memory). */
static void adds_run(void *x)
{
    const adds_call *c = (const adds_call *)x;
    write_adds(c->t, c->ends);
    write_adds(c->t, c->starts);
}

/* A slot of the row's columns, or ArgumentError. */
static inline int check_slot(int64_t s, int64_t cols)
{
    if (s >= 0 && s < cols)
        return 0;
    PyErr_Format(LB.argument_error, "add_calls: endpoint slots must be in 0..%lld, got %lld",
                 (long long)(cols - 1), (long long)s);
    return -1;
}

/* n calls in slot s that started at st enter (n > 0) or leave (n < 0) the in-flight
 * count of their start bucket, with the start's offset into it, or of open_old when
 * that bucket is no longer held. Non-zero if out of memory. */
static inline int push_open(adds *a, const int64_t *g, int64_t s, int64_t st, int64_t n)
{
    const int64_t b = g[G_BUCKET_NS], k = g[G_BUCKETS], cols = g[G_COLUMNS];
    const int64_t q = st / b;
    if (q < g[G_NEWEST] - k + 1)
        return push(a, g[G_OPEN_OLD] + s, n);
    int64_t j = floor_mod(q, k) * cols + s;
    return push(a, g[G_OPEN] + j, n) | push(a, g[G_OPEN_SUM] + j, n * (st - q * b));
}

/* The cells of one list of ended calls (flat slot, start, end, kind). */
static int ends_of(PyObject *flat, int opened, const int64_t *g, adds *a)
{
    if (!PyList_CheckExact(flat) || PyList_GET_SIZE(flat) % 4) {
        PyErr_SetString(PyExc_TypeError,
                        "add_calls: ends must be a list of 4 ints per call (slot, start, end, kind)");
        return -1;
    }
    const int64_t b = g[G_BUCKET_NS], k = g[G_BUCKETS], cols = g[G_COLUMNS];
    const int64_t newest = g[G_NEWEST], oldest = newest - k + 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(flat); i += 4) {
        int64_t s, st, end, kind;
        if (take_int(PyList_GET_ITEM(flat, i), &s, "slots") < 0 ||
            take_int(PyList_GET_ITEM(flat, i + 1), &st, "times") < 0 ||
            take_int(PyList_GET_ITEM(flat, i + 2), &end, "times") < 0 ||
            take_int(PyList_GET_ITEM(flat, i + 3), &kind, "kinds") < 0)
            return -1;
        if (check_slot(s, cols) < 0)
            return -1;
        if (kind < -1 || kind > g[G_KINDS]) {
            PyErr_Format(LB.argument_error,
                         "add_calls: failure kinds must be -1 (cut), 0 or 1..%lld, got %lld",
                         (long long)g[G_KINDS], (long long)kind);
            return -1;
        }
        if (st < 0 || st >= TIME_LIMIT || end < 0 || end >= TIME_LIMIT) {
            PyErr_Format(LB.argument_error, "add_calls: call times must be in 0..2**62 ns, got "
                         "%lld..%lld", (long long)st, (long long)end);
            return -1;
        }
        int64_t d = end > st ? end - st : 0;
        end = st + d;
        int64_t qs = st / b;
        int ok = 0;
        if (kind >= 0)
            ok |= push(a, g[G_REQUESTS] + s, 1);
        if (opened) {
            ok |= push_open(a, g, s, st, -1);
        }
        int64_t last = end > 0 ? (end - 1) / b : -1;
        if (last > newest)
            last = newest;
        for (int64_t q = qs > oldest ? qs : oldest; q <= last; q++) {
            int64_t lo = st > q * b ? st : q * b, hi = end < (q + 1) * b ? end : (q + 1) * b;
            if (hi > lo)
                ok |= push(a, g[G_BUSY] + floor_mod(q, k) * cols + s, hi - lo);
        }
        if (kind >= 0) {
            int64_t qe = end / b;
            qe = qe < oldest ? oldest : (qe > newest ? newest : qe);
            int64_t jb = floor_mod(qe, k), j = jb * cols + s;
            ok |= push(a, g[G_COMPLETED] + j, 1);
            ok |= push(a, g[G_LATENCY] + j, d);
            if (kind > 0) {
                ok |= push(a, g[G_FAILURES] + j, 1);
                ok |= push(a, g[G_FAILURES_TOTAL] + s, 1);
                ok |= push(a, g[G_KIND] + ((kind - 1) * k + jb) * cols + s, 1);
                ok |= push(a, g[G_KIND_TOTAL] + (kind - 1) * cols + s, 1);
            }
        }
        if (ok) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* The cells of the calls still out: {(slot, start): calls}. */
static int starts_of(PyObject *starts, const int64_t *g, adds *a)
{
    if (!PyDict_CheckExact(starts)) {
        PyErr_SetString(PyExc_TypeError, "add_calls: starts must be a dict {(slot, start): calls}");
        return -1;
    }
    const int64_t cols = g[G_COLUMNS];
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(starts, &pos, &key, &value)) {
        int64_t s, t, n;
        if (!PyTuple_CheckExact(key) || PyTuple_GET_SIZE(key) != 2) {
            PyErr_SetString(PyExc_TypeError,
                            "add_calls: starts must be a dict {(slot, start): calls}");
            return -1;
        }
        if (take_int(PyTuple_GET_ITEM(key, 0), &s, "slots") < 0 ||
            take_int(PyTuple_GET_ITEM(key, 1), &t, "times") < 0 ||
            take_int(value, &n, "call counts") < 0)
            return -1;
        if (check_slot(s, cols) < 0)
            return -1;
        if (t < 0 || t >= TIME_LIMIT || n < 0 || n > (1 << 30)) {
            PyErr_Format(LB.argument_error,
                         "add_calls: start times must be in 0..2**62 ns and call counts in "
                         "0..2**30, got %lld and %lld", (long long)t, (long long)n);
            return -1;
        }
        if (push_open(a, g, s, t, n)) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* Every cell a valid call can name is inside the row, checked once per step. */
static int check_geometry(const int64_t *g, Py_ssize_t cells)
{
    const int64_t b = g[G_BUCKET_NS], k = g[G_BUCKETS], cols = g[G_COLUMNS], nk = g[G_KINDS];
    if (b <= 0 || k <= 0 || k > (1 << 16) || cols <= 0 || cols > (1 << 24) || nk < 0 ||
        nk > 64 || g[G_NEWEST] < 0 || g[G_NEWEST] >= TIME_LIMIT)
        goto bad;
    const int64_t span[][2] = {
        {g[G_OPEN], k * cols},      {g[G_OPEN_SUM], k * cols},   {g[G_OPEN_OLD], cols},
        {g[G_BUSY], k * cols},      {g[G_COMPLETED], k * cols},  {g[G_LATENCY], k * cols},
        {g[G_REQUESTS], cols},      {g[G_FAILURES], k * cols},   {g[G_FAILURES_TOTAL], cols},
        {g[G_KIND], nk * k * cols}, {g[G_KIND_TOTAL], nk * cols},
    };
    for (size_t i = 0; i < sizeof span / sizeof span[0]; i++)
        if (span[i][0] < 0 || span[i][0] > cells || span[i][1] > cells - span[i][0])
            goto bad;
    return 0;
bad:
    PyErr_Format(LB.argument_error,
                 "add_calls: the row's geometry does not fit its %zd words", cells);
    return -1;
}

PyObject *lb_add_calls(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "add_calls(target, ended, done, starts, geometry)");
        return NULL;
    }
    PyObject *geo = args[4];
    int64_t g[G_N];
    if (!PyTuple_CheckExact(geo) || PyTuple_GET_SIZE(geo) != G_N) {
        PyErr_Format(PyExc_TypeError, "add_calls: geometry must be a tuple of %d ints", G_N);
        return NULL;
    }
    for (int i = 0; i < G_N; i++)
        if (take_int(PyTuple_GET_ITEM(geo, i), &g[i], "geometry entries") < 0)
            return NULL;
    Py_buffer tv = {0};
    if (!PyObject_TypeCheck(args[0], (PyTypeObject *)LB.np_ndarray) ||
        PyObject_GetBuffer(args[0], &tv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "add_calls: target must be a writable contiguous int64 array");
        return NULL;
    }
    PyObject *result = NULL;
    adds ends = {0}, starts = {0};
    const char *f = tv.format == NULL ? "B" : tv.format;
    if (*f == '=' || *f == '<' || *f == '@')
        f++;
    if (tv.itemsize != 8 || f[0] == '\0' || f[1] != '\0' ||
        !(f[0] == 'q' || f[0] == 'n' || (f[0] == 'l' && sizeof(long) == 8))) {
        PyErr_SetString(PyExc_TypeError, "add_calls: target must be a writable contiguous int64 array");
        goto done;
    }
    if (check_geometry(g, tv.len / 8) < 0 || ends_of(args[1], 1, g, &ends) < 0 ||
        ends_of(args[2], 0, g, &ends) < 0 || starts_of(args[3], g, &starts) < 0)
        goto done;
    adds_call call = {(uint64_t *)tv.buf, &ends, &starts};
    if (lb_guarded(adds_run, &call) == LB_FAULTED) {
        lb_raise_fault("add_calls");
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    free(ends.cell);
    free(ends.val);
    free(starts.cell);
    free(starts.val);
    PyBuffer_Release(&tv);
    return result;
}
