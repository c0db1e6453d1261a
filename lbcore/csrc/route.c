/* Routing hashes on a plan: position, view, gate, answer, counts (no Python object is
 * touched here: methods.c is the Python side).
 *
 * The rules are lbcore's NumPy reference (lbcore/numpy_kernel.py), key for key:
 *
 * * position: the first ring node whose hash is >= the key's, wrapped past the last;
 *   a bucket table on the hash's top bits answers most keys with one load;
 * * view: the ring (N-ring fade-in) or candidate level (Skipper's fade-in) the key's
 *   second draw picks; the walk runs on the newest ring, stepping over endpoints the
 *   view does not hold (ring k is the newest ring without the nodes of later tiers);
 *   with a zone, a local key (a third draw) takes that view's zone part, the view
 *   restricted to local endpoints, and spills back to the view when bounded load finds
 *   its zone answer over its bar;
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

/* Whether key h is local (zone affinity): its zone draw is under the plan's share. */
static inline int zone_local(const LBPlan *p, uint64_t h)
{
    return p->zone_saturated || lb_mix64(h, p->zone_salt) < p->zone_threshold;
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

/* Routes a block of m <= BLK hashes. Its table loads are issued together, a stage at a
 * time, so their latencies overlap: the bucket entries, then the node hashes of
 * one-node buckets and the owners, then the answers. */
static void route_block(const LBPlan *p, const uint64_t *h, Py_ssize_t m, int32_t *out,
                        Py_ssize_t attempt, walk_scratch *ws, lb_counts *c)
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
        int32_t plain, r;
        Py_ssize_t q = position(p, entry[i], k, &bad);
        Py_ssize_t v = view_of(p, k);
        if (p->zone_views && zone_local(p, k) && p->listed_count[v + p->zone_views] > attempt) {
            r = answer(p, v + p->zone_views, q, attempt, ws, &plain, &bad);
            /* B1: an attempt-0 zone answer over its pod's bar spills to the global view
             * (plain stays the zone's: the spill counts as a move). */
            if (attempt == 0 && p->bounded && r >= 0 && !p->under[r]) {
                int32_t global_plain;
                r = answer(p, v, q, 0, ws, &global_plain, &bad);
            }
        } else {
            r = answer(p, v, q, attempt, ws, &plain, &bad);
        }
        out[i] = r;
        fallbacks += r < 0;
        moves += r >= 0 && r != plain;
    }
    c->fallbacks += fallbacks;
    c->moves += moves;
    if (bad > c->bad)
        c->bad = bad;
}

void lb_route_hashes(const LBPlan *p, const uint64_t *h, Py_ssize_t n, int32_t *out,
                         Py_ssize_t attempt, lb_counts *c)
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

int lb_still_valid(const LBPlan *p)
{
    if (!p->has_guard)
        return 1;
    FENCE_ACQUIRE();
    return LOAD_RELAXED(&p->guard_words[p->guard_index]) == p->guard_expected;
}

void lb_answer_all(const LBPlan *p, int32_t *answer_out, int32_t *plain, int *bad)
{
    walk_scratch ws;
    memset(&ws, 0, sizeof ws);
    ws.n = p->n;
    for (Py_ssize_t v = 0; v < (p->closed ? 0 : p->views); v++)
        for (Py_ssize_t q = 0; q < p->size; q++)
            answer_out[v * p->size + q] = answer(p, v, q, 0, &ws, &plain[v * p->size + q], bad);
    PyMem_RawFree(ws.seen);
}
