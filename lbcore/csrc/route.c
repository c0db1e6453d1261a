/* Routing a batch on a plan: hash, position, view, gate, answer, counts.
 *
 * The rules are lbcore's NumPy reference (lbcore/numpy_kernel.py), key for key:
 *
 * * position: the first ring node whose hash is >= the key's, wrapped past the last;
 *   a bucket table on the hash's top bits answers most keys with one load;
 * * view: the ring (N-ring fade-in) or candidate level (Skipper's fade-in) the key's
 *   second draw picks; the walk runs on the newest ring, stepping over endpoints the
 *   view does not hold (ring k is the newest ring without the nodes of later tiers);
 * * answer: Skipper's skip rule, then bounded load (the first endpoint under the bar;
 *   with a hop cap, the least loaded of the distinct endpoints visited), and for a
 *   retry (attempt a) the next distinct endpoint, never one of earlier attempts.
 *
 * Keys go through in blocks, each in stages (route_block) so that the table loads of
 * a block's keys are in flight together rather than one key's chain after another's;
 * a key whose first endpoint is under the bar, or whose next one is (ST_KEEP and
 * ST_NEXT, plan.h), is answered at once, and only the others walk.
 */
#include "plan.h"

#include <math.h>
#include <string.h>

#define BLK 256          /* keys per block: scratch stays on the stack */
#define NOGIL_MIN 8192   /* batches at least this long route without the GIL */

/* Per-call scratch of the distinct walks: a stamp per endpoint, no clearing per key. */
typedef struct {
    uint32_t *seen, *excluded;
    uint32_t seen_stamp, excluded_stamp;
    Py_ssize_t n;
    int failed; /* out of memory */
} walk_scratch;

static int scratch_ready(walk_scratch *ws)
{
    if (ws->seen != NULL)
        return 1;
    if (ws->failed)
        return 0;
    ws->seen = (uint32_t *)PyMem_RawCalloc((size_t)(ws->n ? ws->n : 1), 2 * sizeof(uint32_t));
    if (ws->seen == NULL) {
        ws->failed = 1;
        return 0;
    }
    ws->excluded = ws->seen + ws->n;
    return 1;
}

static inline uint32_t next_stamp(walk_scratch *ws, uint32_t *stamp, uint32_t *marks)
{
    if (++*stamp == 0) { /* wrapped: forget every old mark */
        memset(marks, 0, (size_t)ws->n * sizeof(uint32_t));
        *stamp = 1;
    }
    return *stamp;
}

/* The endpoint at ring position q; *bad if the (shared-memory) owner is out of range. */
static inline int32_t owner_at(const LBPlan *p, Py_ssize_t q, int *bad)
{
    int32_t e = LOAD_RELAXED(&p->owners[q]);
    if (UNLIKELY((uint32_t)e >= (uint32_t)p->n)) {
        *bad = 1;
        return 0;
    }
    return e;
}

static inline Py_ssize_t next_pos(const LBPlan *p, Py_ssize_t q) { return q + 1 == p->size ? 0 : q + 1; }

/* Ring position of hash h, whose bucket-table entry is e: the first node with hash
 * >= h, wrapped to 0 past the end. */
static inline Py_ssize_t position(const LBPlan *p, int32_t e, uint64_t h, int *bad)
{
    Py_ssize_t size = p->size;
    if (LIKELY(e >= 0)) { /* no node in the bucket: its answer is stored */
        if (UNLIKELY(e >= size)) {
            *bad = 1;
            return 0;
        }
        return e;
    }
    if (e <= -2) { /* one node at q: h goes there or to the next node */
        Py_ssize_t q = -(Py_ssize_t)e - 2;
        if (UNLIKELY(q >= size)) {
            *bad = 1;
            return 0;
        }
        q += h > LOAD_RELAXED(&p->hashes[q]);
        return q == size ? 0 : q;
    }
    Py_ssize_t lo = 0, hi = size; /* several nodes: binary search */
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (LOAD_RELAXED(&p->hashes[mid]) < h)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo == size ? 0 : lo;
}

/* The view key h uses. */
static inline Py_ssize_t view_of(const LBPlan *p, uint64_t h)
{
    if (p->choice == CHOICE_FIXED)
        return p->fixed_view;
    uint64_t m = lb_mix64(h, p->choice_salt);
    Py_ssize_t v = 0;
    if (p->choice == CHOICE_NRING) {
        /* The newest ring whose share is above the draw (u < s, in integers). */
        for (Py_ssize_t k = 0; k < p->nthresholds; k++)
            if (p->saturated[k] || m < p->thresholds[k])
                v = k + 1;
    } else {
        /* Skipper: the number of candidate levels at or below the draw. */
        for (Py_ssize_t j = 0; j < p->nthresholds; j++)
            v += !p->saturated[j] && m >= p->thresholds[j];
    }
    return v;
}

/* The walk over distinct endpoints from position s: the first under the bar, else the
 * least loaded of the first `width` distinct ones visited (-1: none visited). With
 * `exclude`, endpoints marked excluded are stepped over and not counted. S is the
 * view's row of ST_* bytes (ST_KEEP: under the bar). */
static int32_t walk_distinct(const LBPlan *p, const uint8_t *S, Py_ssize_t s, int64_t width,
                             walk_scratch *ws, int exclude, int *bad)
{
    if (!scratch_ready(ws)) {
        *bad = 2;
        return -1;
    }
    uint32_t stamp = next_stamp(ws, &ws->seen_stamp, ws->seen);
    uint32_t ex = ws->excluded_stamp;
    int64_t nseen = 0;
    int32_t best = -1;
    double best_load = INFINITY;
    Py_ssize_t q = s;
    for (Py_ssize_t step = 0; step < p->size; step++) {
        if (step)
            q = next_pos(p, q);
        int32_t f = owner_at(p, q, bad);
        if (!(S[f] & ST_ELIGIBLE) || ws->seen[f] == stamp || (exclude && ws->excluded[f] == ex))
            continue;
        if (S[f] & ST_KEEP)
            return f;
        if (p->loads[f] < best_load) { /* strictly: the first seen among equals */
            best = f;
            best_load = p->loads[f];
        }
        ws->seen[f] = stamp;
        if (++nseen >= width)
            break;
    }
    return best;
}

/* walk_distinct without exclusions, usually without its bookkeeping: an endpoint under
 * the bar met within the first `width` eligible positions is within the first `width`
 * distinct endpoints as well, so it is the walk's answer; only a key that meets
 * `width` eligible positions over the bar first needs the count of distinct ones. */
static int32_t walk_first(const LBPlan *p, const uint8_t *S, Py_ssize_t s, int64_t width,
                          walk_scratch *ws, int *bad)
{
    int64_t left = width;
    Py_ssize_t q = s;
    for (Py_ssize_t step = 0; step < p->size; step++) {
        int32_t f = owner_at(p, q, bad);
        uint8_t st = S[f];
        if (st & ST_KEEP)
            return f;
        if ((st & ST_ELIGIBLE) && --left == 0)
            break;
        q = next_pos(p, q);
    }
    return walk_distinct(p, S, s, width, ws, 0, bad);
}

/* From position s, the attempt-th next distinct eligible endpoint (plain retries). */
static int32_t advance_distinct(const LBPlan *p, const uint8_t *S, Py_ssize_t s, Py_ssize_t attempt,
                                walk_scratch *ws, int *bad)
{
    if (!scratch_ready(ws)) {
        *bad = 2;
        return -1;
    }
    uint32_t stamp = next_stamp(ws, &ws->seen_stamp, ws->seen);
    ws->seen[owner_at(p, s, bad)] = stamp;
    Py_ssize_t found = 1, q = s;
    for (Py_ssize_t step = 0; step < p->size; step++) {
        q = next_pos(p, q);
        int32_t f = owner_at(p, q, bad);
        if ((S[f] & ST_ELIGIBLE) && ws->seen[f] != stamp) {
            ws->seen[f] = stamp;
            if (++found > attempt)
                return f;
        }
    }
    return owner_at(p, q, bad);
}

/* answer() for every key that does not keep its first endpoint e (at position q0). */
static int32_t __attribute__((noinline))
answer_walk(const LBPlan *p, Py_ssize_t v, Py_ssize_t q0, int32_t e, Py_ssize_t attempt,
            walk_scratch *ws, int32_t *plain, int *bad)
{
    int64_t listed = p->listed_count[v], eligible = p->eligible_count[v];
    if (listed == 0 || attempt >= eligible) {
        *plain = -1;
        return -1;
    }
    if (listed == 1 && attempt == 0) { /* Skipper's Apply: one candidate left */
        *plain = p->single[v];
        return p->single[v];
    }
    const uint8_t *S = p->state + v * p->n;
    /* Skipper's skip rule: the walk starts on an endpoint the view holds. */
    Py_ssize_t s = q0, steps = 0;
    while (!(S[e] & ST_ELIGIBLE)) {
        if (++steps >= p->size) { /* the ring holds none of them: damaged */
            *bad = 1;
            *plain = -1;
            return -1;
        }
        s = next_pos(p, s);
        e = owner_at(p, s, bad);
    }
    *plain = attempt == 0 ? e : advance_distinct(p, S, s, attempt, ws, bad);
    if (!p->bounded)
        return *plain;
    int64_t width = p->max_hops ? p->max_hops : p->size;
    if (width > eligible)
        width = eligible;
    if (width < 1)
        width = 1;
    int32_t chosen;
    if (S[e] & ST_KEEP) {
        chosen = e;
    } else if (p->max_hops == 0) {
        /* Skipper's walk: the first endpoint under the bar within one lap, else stay. */
        chosen = e;
        Py_ssize_t q = s;
        for (Py_ssize_t step = 1; step < p->size; step++) {
            q = next_pos(p, q);
            int32_t f = owner_at(p, q, bad);
            if (S[f] & ST_KEEP) {
                chosen = f;
                break;
            }
        }
    } else {
        chosen = walk_first(p, S, s, width, ws, bad);
    }
    if (attempt == 0)
        return chosen;
    if (!scratch_ready(ws)) {
        *bad = 2;
        return -1;
    }
    uint32_t ex = next_stamp(ws, &ws->excluded_stamp, ws->excluded);
    for (Py_ssize_t a = 1; a <= attempt; a++) {
        if (chosen >= 0)
            ws->excluded[chosen] = ex;
        chosen = walk_distinct(p, S, s, width, ws, 1, bad);
    }
    return chosen;
}

/* The answer for a key at ring position q0 in view v; *plain gets the answer without
 * bounded load (for counting moves). Most keys keep the endpoint at their position or
 * take the next node's: the two state bytes say which, selected without a branch (a
 * mispredicted one per key over the bar cost more than the walk), and only the rest
 * walk. */
static inline int32_t answer(const LBPlan *p, Py_ssize_t v, Py_ssize_t q0, Py_ssize_t attempt,
                             walk_scratch *ws, int32_t *plain, int *bad)
{
    const uint8_t *S = p->state + v * p->n;
    int32_t e = owner_at(p, q0, bad), e1 = owner_at(p, next_pos(p, q0), bad);
    unsigned s0 = S[e], s1 = S[e1];
    /* (Bit arithmetic, not && and ||: those compile to branches.) */
    unsigned first = (s0 / ST_KEEP) & 1, second = (s0 / ST_NEXT) & (s1 / ST_KEEP) & 1;
    int32_t r = first ? e : e1, pl = s0 & ST_ELIGIBLE ? e : e1;
    if (LIKELY(attempt == 0 && (first | second))) {
        *plain = pl;
        return r;
    }
    return answer_walk(p, v, q0, e, attempt, ws, plain, bad);
}

typedef struct {
    Py_ssize_t fallbacks, moves;
    int bad; /* 1: a table entry out of range; 2: out of memory */
} counts;

/* Routes a block of m <= BLK hashes. Its table loads are issued together, a stage at a
 * time, so their latencies overlap: the bucket entries, then the node hashes of
 * one-node buckets and the owners, then the answers. */
static void route_block(const LBPlan *p, const uint64_t *h, Py_ssize_t m, int32_t *out,
                        Py_ssize_t attempt, walk_scratch *ws, counts *c)
{
    int32_t entry[BLK];
    const int shift = p->shift;
    const Py_ssize_t size = p->size;
    for (Py_ssize_t i = 0; i < m; i++)
        PREFETCH(&p->buckets[h[i] >> shift]);
    for (Py_ssize_t i = 0; i < m; i++) {
        int32_t e = LOAD_RELAXED(&p->buckets[h[i] >> shift]);
        entry[i] = e;
        Py_ssize_t q = e >= 0 ? e : -(Py_ssize_t)e - 2;
        if (q >= 0 && q < size) { /* (hints only: checked again where they are used) */
            PREFETCH(&p->owners[q]);
            if (e < 0)
                PREFETCH(&p->hashes[q]);
        }
    }
    /* Counts and the damage flag in locals: stores through c could alias the plan's
     * fields, which the loop would then reload for every key. */
    Py_ssize_t fallbacks = 0, moves = 0;
    int bad = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        uint64_t k = h[i];
        if (p->gate == GATE_PARTIAL && !(lb_mix64(k, p->gate_salt) < p->gate_threshold)) {
            out[i] = -1;
            fallbacks++;
            continue;
        }
        int32_t plain;
        Py_ssize_t q = position(p, entry[i], k, &bad);
        int32_t r = answer(p, view_of(p, k), q, attempt, ws, &plain, &bad);
        out[i] = r;
        fallbacks += r < 0;
        moves += r >= 0 && r != plain;
    }
    c->fallbacks += fallbacks;
    c->moves += moves;
    if (bad > c->bad)
        c->bad = bad;
}

/* Routes hashes h[0..n) into out: no Python object is touched (runs without the GIL). */
static void route_hashes(const LBPlan *p, const uint64_t *h, Py_ssize_t n, int32_t *out,
                         Py_ssize_t attempt, counts *c)
{
    if (p->closed) {
        for (Py_ssize_t i = 0; i < n; i++)
            out[i] = -1;
        c->fallbacks = n;
        return;
    }
    walk_scratch ws;
    memset(&ws, 0, sizeof ws);
    ws.n = p->n;
    for (Py_ssize_t base = 0; base < n; base += BLK)
        route_block(p, h + base, n - base < BLK ? n - base : BLK, out + base, attempt, &ws, c);
    PyMem_RawFree(ws.seen);
}

/* After routing: the sequence check (acquire: our reads of the table happen before it). */
static int still_valid(const LBPlan *p)
{
    if (!p->has_guard)
        return 1;
    FENCE_ACQUIRE();
    return LOAD_RELAXED(&p->guard_words[p->guard_index]) == p->guard_expected;
}

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

static PyObject *finish(const LBPlan *p, PyObject *arr, const counts *c)
{
    int valid = still_valid(p);
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
    PyObject *out = PyTuple_New(4), *fallbacks = NULL, *moves = NULL;
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

/* Plan.route(keys, attempt=0): lbcore.plan.Plan.route itself. */
PyObject *lb_plan_route(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    LBPlan *p = (LBPlan *)self;
    Py_ssize_t attempt;
    if (call_args(args, nargs, kwnames, "route", &attempt) < 0)
        return NULL;
    lb_keys k;
    if (lb_keys_open(&k, args[0], NULL, p->max_key_bytes) < 0)
        return NULL;
    Py_ssize_t n = k.n;
    Py_buffer ov;
    PyObject *arr = output(p, n, &ov);
    if (arr == NULL) {
        lb_keys_close(&k);
        return NULL;
    }
    uint64_t stack[BLK];
    uint64_t *h = n <= BLK ? stack : (uint64_t *)PyMem_RawMalloc((size_t)n * sizeof(uint64_t));
    counts c = {0, 0, 0};
    int rc;
    if (h == NULL) {
        PyErr_NoMemory();
        rc = -2;
    } else if (lb_keys_nogil_ok(&k) && n >= NOGIL_MIN) {
        Py_BEGIN_ALLOW_THREADS
        rc = lb_hash_keys(&k, h);
        if (rc == 0)
            route_hashes(p, h, n, (int32_t *)ov.buf, attempt, &c);
        Py_END_ALLOW_THREADS
    } else {
        rc = lb_hash_keys(&k, h);
        if (rc == 0) {
            if (n >= NOGIL_MIN) {
                Py_BEGIN_ALLOW_THREADS
                route_hashes(p, h, n, (int32_t *)ov.buf, attempt, &c);
                Py_END_ALLOW_THREADS
            } else {
                route_hashes(p, h, n, (int32_t *)ov.buf, attempt, &c);
            }
        }
    }
    if (rc == -1)
        lb_keys_raise(&k);
    if (h != stack)
        PyMem_RawFree(h);
    lb_keys_close(&k);
    PyBuffer_Release(&ov);
    if (rc < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return finish(p, arr, &c);
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
    counts c = {0, 0, 0};
    if (n >= NOGIL_MIN) {
        Py_BEGIN_ALLOW_THREADS
        route_hashes(p, (const uint64_t *)hv.buf, n, (int32_t *)ov.buf, attempt, &c);
        Py_END_ALLOW_THREADS
    } else {
        route_hashes(p, (const uint64_t *)hv.buf, n, (int32_t *)ov.buf, attempt, &c);
    }
    PyBuffer_Release(&hv);
    PyBuffer_Release(&ov);
    return finish(p, arr, &c);
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
    int32_t *a = (int32_t *)av.buf, *pl = (int32_t *)pv.buf;
    walk_scratch ws;
    memset(&ws, 0, sizeof ws);
    ws.n = p->n;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t v = 0; v < (p->closed ? 0 : p->views); v++)
        for (Py_ssize_t q = 0; q < p->size; q++)
            a[v * p->size + q] = answer(p, v, q, 0, &ws, &pl[v * p->size + q], &bad);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(ws.seen);
    PyBuffer_Release(&av);
    PyBuffer_Release(&pv);
    if (bad == 2 || (bad && still_valid(p))) {
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
