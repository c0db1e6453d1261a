/* arc_sums: each view's arcs of the newest ring, per endpoint, in one pass over the ring.
 *
 * B1's expected shares (lbcore.zones.view_arcs) weigh, per view, each endpoint's share
 * of the hash space when keys walk on to the view's endpoints: an eligible node answers
 * the arc from the view's previous eligible node (exclusive) to itself, wrapping once
 * around the ring. The NumPy reference (lbcore.zones._arc_sums) gathers, diffs and
 * bins once per view; here every view is summed in the same pass over the nodes, in the
 * same order (node order, the uint64 arc converted to double, added to its owner's
 * cell), so the sums are the reference's to the bit.
 *
 * The ring's arrays are usually views of a shared-memory table: the pass runs under
 * lb_guarded, and every owner is checked against the endpoint count before it indexes
 * anything (a damaged or rewritten table raises TableDataError, never reads out of
 * bounds).
 */
#include "kernel.h"

#include <stdlib.h>
#include <string.h>

/* Rings from this many nodes on are summed without the GIL. */
#define ARCS_NOGIL_MIN 65536

typedef struct {
    const uint64_t *hashes;
    const int32_t *owners;
    const uint8_t *member; /* (endpoints, views): endpoint e is eligible in view v */
    Py_ssize_t nodes, n, views;
    uint64_t *prev;        /* per view: the hash of its previous eligible node */
    int64_t *count;        /* per view: its eligible nodes */
    int32_t *last;         /* per view: the owner of its last eligible node (-1: none) */
    double *out;           /* (endpoints, views): an endpoint's cells in one cache line */
    Py_ssize_t bad;        /* a node whose owner is out of range, or -1 */
    int32_t bad_owner;     /* its owner */
} arcs_call;

/* Every owner read from the ring is checked before it indexes anything; the first bad
 * one is kept for the error message. */
static inline int owner_ok(arcs_call *a, Py_ssize_t i, int32_t o)
{
    if (o >= 0 && o < a->n)
        return 1;
    a->bad = i;
    a->bad_owner = o;
    return 0;
}

static void arcs_run(void *x)
{
    arcs_call *a = (arcs_call *)x;
    const Py_ssize_t V = a->views, nodes = a->nodes;
    const uint64_t *hashes = a->hashes;
    const int32_t *owners = a->owners;
    const uint8_t *member = a->member;
    uint64_t *prev = a->prev;
    int64_t *count = a->count;
    int32_t *last = a->last;
    double *out = a->out;
    /* A view's first eligible node answers from its last one: found from the end. */
    Py_ssize_t missing = V;
    for (Py_ssize_t i = nodes - 1; i >= 0 && missing > 0; i--) {
        /* One load of shared memory per node (LOAD_RELAXED): a plain read would let the
         * compiler read the owner again after its check. */
        const int32_t o = LOAD_RELAXED(&owners[i]);
        if (UNLIKELY(!owner_ok(a, i, o)))
            return;
        const uint8_t *m = member + (size_t)o * (size_t)V;
        for (Py_ssize_t v = 0; v < V; v++) {
            if (m[v] && last[v] < 0) {
                last[v] = o;
                prev[v] = LOAD_RELAXED(&hashes[i]);
                missing--;
            }
        }
    }
    /* Without branches on membership (about every other node is a view's, at random):
     * a node adds 0.0 to the views it is not in, which leaves a sum of arcs as it is. */
    for (Py_ssize_t i = 0; i < nodes; i++) {
        const int32_t o = LOAD_RELAXED(&owners[i]);
        if (UNLIKELY(!owner_ok(a, i, o)))
            return;
        const uint8_t *m = member + (size_t)o * (size_t)V;
        const uint64_t h = LOAD_RELAXED(&hashes[i]);
        for (Py_ssize_t v = 0; v < V; v++) {
            const uint64_t in = m[v] != 0, keep = in - 1; /* all ones when not in */
            /* The arc wraps once around the ring in uint64; masked to 0 when not in, so
             * the conversion's sign test stays predictable. */
            out[o * V + v] += (double)((h - prev[v]) & ~keep);
            prev[v] = (prev[v] & keep) | (h & ~keep);
            count[v] += (int64_t)in;
        }
    }
    /* A view of one node: that node answers the whole ring. A writer may have rewritten
     * the ring between the passes, so that the backward one found no node of a view the
     * forward one counts once: no owner then, and nothing to write (the sums of a
     * rewritten ring are void: its reader finds the table rewritten). Not taken in the
     * forward pass: a store per node and view there makes the pass several times slower. */
    for (Py_ssize_t v = 0; v < V; v++)
        if (count[v] == 1 && last[v] >= 0)
            out[last[v] * V + v] = 18446744073709551616.0; /* 2**64 */
}

/* A C-contiguous NumPy buffer of `size`-byte items of one of `formats` (native order), or -1. */
static int take(PyObject *obj, Py_buffer *v, const char *name, const char *formats,
                Py_ssize_t size, int writable)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (!PyObject_TypeCheck(obj, (PyTypeObject *)LB.np_ndarray) ||
        PyObject_GetBuffer(obj, v, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "arc_sums: %s must be a C-contiguous%s NumPy array", name,
                     writable ? " writable" : "");
        return -1;
    }
    const char *f = v->format == NULL ? "B" : v->format;
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    if (v->itemsize != size || f[0] == '\0' || f[1] != '\0' || strchr(formats, f[0]) == NULL) {
        PyErr_Format(PyExc_TypeError, "arc_sums: %s has items of format %s (%zd bytes)", name,
                     v->format == NULL ? "B" : v->format, v->itemsize);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

/* arc_sums(hashes, owners, member, out): out[e, v] += each arc of endpoint e in view v. */
PyObject *lb_arc_sums(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "arc_sums(hashes, owners, member, out)");
        return NULL;
    }
    Py_buffer hv = {0}, ov = {0}, mv = {0}, outv = {0};
    PyObject *result = NULL;
    void *scratch = NULL;
    if (take(args[0], &hv, "hashes", "QL", 8, 0) < 0)
        return NULL;
    if (take(args[1], &ov, "owners", "il", 4, 0) < 0)
        goto done;
    if (take(args[2], &mv, "member", "?B", 1, 0) < 0)
        goto done;
    if (take(args[3], &outv, "out", "d", 8, 1) < 0)
        goto done;
    {
        const Py_ssize_t nodes = hv.len / 8;
        if (ov.len / 4 != nodes || mv.ndim != 2 || outv.ndim != 2 ||
            mv.shape[0] != outv.shape[0] || mv.shape[1] != outv.shape[1]) {
            PyErr_SetString(PyExc_ValueError,
                            "arc_sums: one owner per hash, member and out both (endpoints, "
                            "views)");
            goto done;
        }
        const Py_ssize_t n = mv.shape[0], views = mv.shape[1];
        if (views == 0 || n == 0 || nodes == 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        scratch = calloc((size_t)views, sizeof(uint64_t) + sizeof(int64_t) + sizeof(int32_t));
        if (scratch == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        arcs_call a = {
            .hashes = (const uint64_t *)hv.buf,
            .owners = (const int32_t *)ov.buf,
            .member = (const uint8_t *)mv.buf,
            .nodes = nodes,
            .n = n,
            .views = views,
            .prev = (uint64_t *)scratch,
            .count = (int64_t *)((uint64_t *)scratch + views),
            .last = (int32_t *)((int64_t *)((uint64_t *)scratch + views) + views),
            .out = (double *)outv.buf,
            .bad = -1,
        };
        for (Py_ssize_t v = 0; v < views; v++)
            a.last[v] = -1;
        int faulted;
        if (nodes >= ARCS_NOGIL_MIN) {
            /* Buffers held, nothing of Python's touched: other threads route meanwhile. */
            Py_BEGIN_ALLOW_THREADS
            faulted = lb_guarded(arcs_run, &a) == LB_FAULTED;
            Py_END_ALLOW_THREADS
        } else {
            faulted = lb_guarded(arcs_run, &a) == LB_FAULTED;
        }
        if (faulted) {
            lb_raise_fault("arc_sums");
            goto done;
        }
        if (a.bad >= 0) {
            PyErr_Format(LB.table_error,
                         "ring node %zd has owner %d: not one of the %zd endpoints (the ring "
                         "arrays are damaged or were rewritten)",
                         a.bad, (int)a.bad_owner, n);
            goto done;
        }
        result = Py_NewRef(Py_None);
    }
done:
    free(scratch);
    if (outv.obj != NULL)
        PyBuffer_Release(&outv);
    if (mv.obj != NULL)
        PyBuffer_Release(&mv);
    if (ov.obj != NULL)
        PyBuffer_Release(&ov);
    if (hv.obj != NULL)
        PyBuffer_Release(&hv);
    return result;
}
