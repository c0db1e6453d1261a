/* lbcore._kernel.Plan: the buffers of one routing plan, checked once when it is built.
 *
 * lbcore.plan builds every array; this type only holds them (a buffer export keeps a
 * shared-memory mapping alive while the plan exists) and checks that each has the
 * dtype and length the routing code indexes it with. Values inside the ring arrays
 * are checked where they are read (route.c).
 */
#include "plan.h"

#include <string.h>

/* Whether a buffer's struct-module format is one element of the given kind and size. */
static int format_is(const Py_buffer *v, char kind, Py_ssize_t itemsize)
{
    const char *f = v->format == NULL ? "B" : v->format;
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    else if (*f == '>' || *f == '!')
        f++;
#endif
    if (f[0] == '\0' || f[1] != '\0' || v->itemsize != itemsize)
        return 0;
    char c = f[0];
    switch (kind) {
    case 'u':
        if (itemsize == 1)
            return c == 'B' || c == '?';
        if (itemsize == 8)
            return c == 'Q' || (c == 'L' && sizeof(long) == 8) || c == 'N';
        return 0;
    case 'i':
        if (itemsize == 4)
            return c == 'i' || (c == 'l' && sizeof(long) == 4);
        if (itemsize == 8)
            return c == 'q' || (c == 'l' && sizeof(long) == 8) || c == 'n';
        return 0;
    case 'f':
        return itemsize == 8 && c == 'd';
    default:
        return 0;
    }
}

/* Acquires a C-contiguous buffer of count elements (count < 0: any) of kind/itemsize. */
static int take(PyObject *obj, Py_buffer *v, char kind, Py_ssize_t itemsize, Py_ssize_t count,
                const char *name)
{
    if (obj == NULL || obj == Py_None) {
        PyErr_Format(PyExc_ValueError, "plan: %s is missing", name);
        return -1;
    }
    if (PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *what = kind == 'u' ? "unsigned" : kind == 'i' ? "signed" : "float";
    if (!format_is(v, kind, itemsize)) {
        PyErr_Format(PyExc_ValueError, "plan: %s must be %s %zd-byte items, got format %s", name,
                     what, itemsize, v->format == NULL ? "B" : v->format);
        PyBuffer_Release(v);
        return -1;
    }
    if (count >= 0 && v->len != count * itemsize) {
        PyErr_Format(PyExc_ValueError, "plan: %s has %zd items, expected %zd", name,
                     v->len / itemsize, count);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static void release(Py_buffer *v)
{
    if (v->obj != NULL)
        PyBuffer_Release(v);
}

/* Back to the state tp_new left: no buffer held, nothing allocated, not ready. */
static void plan_clear(LBPlan *self)
{
    Py_buffer *all[] = {&self->hashes_v, &self->owners_v, &self->buckets_v, &self->eligible_v,
                        &self->good_v, &self->listed_count_v, &self->eligible_count_v,
                        &self->single_v, &self->loads_v, &self->thresholds_v,
                        &self->saturated_v, &self->slots_v, &self->guard_v, &self->under_v};
    self->ready = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        release(all[i]);
    PyMem_Free(self->state);
    for (int i = 0; i < LB_OUT_CACHE; i++)
        Py_CLEAR(self->out_cache[i]);
    /* Zero every field after the object header (tp_new's state), buffers included. */
    memset((char *)self + sizeof(PyObject), 0, sizeof(LBPlan) - sizeof(PyObject));
}

static void plan_dealloc(LBPlan *self)
{
    plan_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The ST_* byte of every (view, endpoint): two loads tell the routing loop that a key
 * keeps its first endpoint or takes the next node's, so only the others take the walk
 * (route.c). Views with fewer than two candidates answer no key that way: their rule is
 * not the walk. */
static int build_state(LBPlan *self)
{
    Py_ssize_t cells = self->views * self->n;
    self->state = (uint8_t *)PyMem_Malloc(cells ? (size_t)cells : 1);
    if (self->state == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t v = 0; v < self->views; v++) {
        int walks = self->listed_count[v] >= 2 && self->eligible_count[v] >= 1;
        /* The walk past an endpoint over the bar may take a second one. */
        int second = self->bounded && self->max_hops != 1 && self->eligible_count[v] >= 2;
        for (Py_ssize_t e = v * self->n; e < (v + 1) * self->n; e++) {
            int eligible = self->eligible[e] != 0;
            int keep = walks && eligible && (!self->bounded || self->good[e] != 0);
            int next = walks && !keep && (!eligible || second);
            self->state[e] = (uint8_t)(eligible * ST_ELIGIBLE + keep * ST_KEEP + next * ST_NEXT);
        }
    }
    return 0;
}

static int plan_build(LBPlan *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"hashes", "owners", "buckets", "n", "views", "eligible", "good",
                            "listed_count", "eligible_count", "single", "loads", "bounded",
                            "max_hops", "choice", "fixed_view", "choice_salt", "thresholds",
                            "saturated", "gate", "gate_salt", "gate_threshold", "slots",
                            "n_slots", "guard", "closed", "max_key_bytes", "zone_views",
                            "zone_salt", "zone_threshold", "zone_saturated", "under", NULL};
    PyObject *hashes, *owners, *buckets, *eligible, *good, *listed, *elig_count, *single;
    PyObject *loads, *thresholds, *saturated, *slots, *guard, *under;
    Py_ssize_t n, views, max_hops, fixed_view, max_key_bytes, zone_views;
    int bounded, choice, gate, closed, zone_saturated;
    unsigned long long choice_salt, gate_salt, gate_threshold, zone_salt, zone_threshold;
    long long n_slots;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "$OOOnnOOOOOOpninKOOiKKOLOpnnKKpO", names, &hashes, &owners, &buckets,
            &n, &views, &eligible, &good, &listed, &elig_count, &single, &loads, &bounded,
            &max_hops, &choice, &fixed_view, &choice_salt, &thresholds, &saturated, &gate,
            &gate_salt, &gate_threshold, &slots, &n_slots, &guard, &closed, &max_key_bytes,
            &zone_views, &zone_salt, &zone_threshold, &zone_saturated, &under))
        return -1;
    if (n < 0 || views < 1 || max_hops < 0 || n_slots < 0 || fixed_view < 0 ||
        fixed_view >= views || choice < CHOICE_FIXED || choice > CHOICE_SKIPPER ||
        gate < GATE_ALL || gate > GATE_PARTIAL || zone_views < 0 ||
        (zone_views > 0 && (views != 2 * zone_views || fixed_view >= zone_views))) {
        PyErr_SetString(PyExc_ValueError, "plan: a count or mode is out of range");
        return -1;
    }
    self->n = n;
    self->views = views;
    self->bounded = bounded;
    self->max_hops = max_hops;
    self->choice = choice;
    self->fixed_view = fixed_view;
    self->choice_salt = choice_salt;
    self->gate = gate;
    self->gate_salt = gate_salt;
    self->gate_threshold = gate_threshold;
    self->n_slots = n_slots;
    self->closed = closed || gate == GATE_NONE || n == 0;
    self->max_key_bytes = max_key_bytes;
    self->zone_views = zone_views;
    self->zone_salt = zone_salt;
    self->zone_threshold = zone_threshold;
    self->zone_saturated = zone_saturated;
    if (take(slots, &self->slots_v, 'i', 8, n, "slots") < 0)
        return -1;
    self->slots = (const int64_t *)self->slots_v.buf;
    for (Py_ssize_t e = 0; e < n; e++) {
        if (self->slots[e] < 0 || self->slots[e] >= n_slots) {
            PyErr_Format(PyExc_ValueError, "plan: counter slot %lld of endpoint %zd is not in 0..%lld",
                         (long long)self->slots[e], e, (long long)n_slots - 1);
            return -1;
        }
    }
    if (guard != Py_None) {
        PyObject *words;
        unsigned long long expected;
        if (!PyArg_ParseTuple(guard, "OnK", &words, &self->guard_index, &expected))
            return -1;
        if (take(words, &self->guard_v, 'u', 8, -1, "guard words") < 0)
            return -1;
        if (self->guard_index < 0 || self->guard_index >= self->guard_v.len / 8) {
            PyErr_SetString(PyExc_ValueError, "plan: guard index out of range");
            return -1;
        }
        self->guard_words = (const uint64_t *)self->guard_v.buf;
        self->guard_expected = expected;
        self->has_guard = 1;
    }
    if (self->closed)
        return 0; /* nothing else is read */
    if (take(hashes, &self->hashes_v, 'u', 8, -1, "ring hashes") < 0 ||
        take(owners, &self->owners_v, 'i', 4, self->hashes_v.len / 8, "ring owners") < 0 ||
        take(buckets, &self->buckets_v, 'i', 4, -1, "bucket table") < 0)
        return -1;
    self->size = self->hashes_v.len / 8;
    Py_ssize_t nb = self->buckets_v.len / 4;
    int bits = 0;
    while (bits < 40 && ((Py_ssize_t)1 << bits) < nb)
        bits++;
    if (self->size < 1 || bits < 1 || bits > 32 || ((Py_ssize_t)1 << bits) != nb) {
        PyErr_Format(PyExc_ValueError, "plan: a ring of %zd nodes with a bucket table of %zd entries",
                     self->size, nb);
        return -1;
    }
    self->shift = 64 - bits;
    self->hashes = (const uint64_t *)self->hashes_v.buf;
    self->owners = (const int32_t *)self->owners_v.buf;
    self->buckets = (const int32_t *)self->buckets_v.buf;
    if (take(eligible, &self->eligible_v, 'u', 1, views * n, "eligible") < 0 ||
        take(listed, &self->listed_count_v, 'i', 8, views, "listed_count") < 0 ||
        take(elig_count, &self->eligible_count_v, 'i', 8, views, "eligible_count") < 0 ||
        take(single, &self->single_v, 'i', 4, views, "single") < 0)
        return -1;
    self->eligible = (const uint8_t *)self->eligible_v.buf;
    self->listed_count = (const int64_t *)self->listed_count_v.buf;
    self->eligible_count = (const int64_t *)self->eligible_count_v.buf;
    self->single = (const int32_t *)self->single_v.buf;
    for (Py_ssize_t v = 0; v < views; v++) {
        int32_t s = self->single[v];
        if (s < -1 || s >= n || self->listed_count[v] < 0 || self->eligible_count[v] < 0) {
            PyErr_SetString(PyExc_ValueError, "plan: a view's counts are out of range");
            return -1;
        }
    }
    if (bounded) {
        if (take(good, &self->good_v, 'u', 1, views * n, "good") < 0 ||
            take(loads, &self->loads_v, 'f', 8, n, "loads") < 0)
            return -1;
        self->good = (const uint8_t *)self->good_v.buf;
        self->loads = (const double *)self->loads_v.buf;
        if (zone_views > 0) {
            if (take(under, &self->under_v, 'u', 1, n, "under") < 0)
                return -1;
            self->under = (const uint8_t *)self->under_v.buf;
        }
    }
    if (take(thresholds, &self->thresholds_v, 'u', 8, -1, "thresholds") < 0)
        return -1;
    self->nthresholds = self->thresholds_v.len / 8;
    if (take(saturated, &self->saturated_v, 'u', 1, self->nthresholds, "saturated") < 0)
        return -1;
    self->thresholds = (const uint64_t *)self->thresholds_v.buf;
    self->saturated = (const uint8_t *)self->saturated_v.buf;
    /* Every view a key can choose must exist: N-ring picks 0..nthresholds, Skipper's
     * levels 0..nthresholds as well (global views; a zone part is that plus zone_views). */
    if (choice != CHOICE_FIXED && self->nthresholds >= (zone_views ? zone_views : views)) {
        PyErr_SetString(PyExc_ValueError, "plan: more fade thresholds than views");
        return -1;
    }
    return build_state(self);
}

/* A plan is built once: a second __init__ of a built plan fails and leaves it as it
 * was; one that fails part-way releases what it took, so the plan is as tp_new left it
 * (not ready: every method refuses it) and may be built again. */
static int plan_init(LBPlan *self, PyObject *args, PyObject *kw)
{
    if (self->ready) {
        PyErr_SetString(PyExc_TypeError, "lbcore._kernel.Plan: a plan is built once");
        return -1;
    }
    plan_clear(self);
    if (plan_build(self, args, kw) < 0) {
        plan_clear(self);
        return -1;
    }
    self->ready = 1;
    return 0;
}

/* Whether the plan is built; else ValueError (an object made by Plan.__new__ alone, or
 * whose __init__ failed, holds no tables). */
static int ready(PyObject *self)
{
    if (((LBPlan *)self)->ready)
        return 1;
    PyErr_SetString(PyExc_ValueError,
                    "lbcore._kernel.Plan: plan not built (its __init__ did not complete)");
    return 0;
}

static PyObject *plan_route(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    return ready(self) ? lb_plan_route(self, args, nargs, kwnames) : NULL;
}

static PyObject *plan_route_hashes(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    return ready(self) ? lb_plan_route_hashes(self, args, nargs, kwnames) : NULL;
}

static PyObject *plan_route_counted(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return ready(self) ? lb_plan_route_counted(self, args, nargs) : NULL;
}

static PyObject *plan_answers(PyObject *self, PyObject *unused)
{
    return ready(self) ? lb_plan_answers(self, unused) : NULL;
}

static PyObject *plan_counter_slots(PyObject *self, PyObject *idx)
{
    return ready(self) ? lb_plan_counter_slots(self, idx) : NULL;
}

static PyMethodDef plan_methods[] = {
    {"route", (PyCFunction)(void (*)(void))plan_route, METH_FASTCALL | METH_KEYWORDS,
     "route($self, keys, attempt=0)\n--\n\n"
     "Route a batch: (indices, fallbacks, moves, valid); see lbcore.Plan.route."},
    {"route_hashes", (PyCFunction)(void (*)(void))plan_route_hashes,
     METH_FASTCALL | METH_KEYWORDS,
     "route_hashes($self, hashes, attempt=0)\n--\n\n"
     "Route precomputed uint64 key hashes: (indices, fallbacks, moves, valid)."},
    {"route_counted", (PyCFunction)(void (*)(void))plan_route_counted, METH_FASTCALL,
     "route_counted($self, keys, attempt, sink, totals)\n--\n\n"
     "route, and its decision counts added to a counter row: (indices, fallbacks, moves, "
     "valid, counted)."},
    {"answers", (PyCFunction)plan_answers, METH_NOARGS,
     "answers() -> (answer, plain): int32 arrays of views x ring positions, attempt 0"},
    {"counter_slots", (PyCFunction)plan_counter_slots, METH_O,
     "counter_slots(indices) -> (slots of the routed calls, their positions or None)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject LB_PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lbcore._kernel.Plan",
    .tp_basicsize = sizeof(LBPlan),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The native side of lbcore.plan.Plan (built by it; not for direct use).",
    .tp_methods = plan_methods,
    .tp_init = (initproc)plan_init,
    .tp_new = PyType_GenericNew,
};
