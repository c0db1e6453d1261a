/* The native side of lbcore.plan.Plan: its buffers, validated once when it is built. */
#ifndef LBCORE_PLAN_H
#define LBCORE_PLAN_H

#include "kernel.h"

enum { CHOICE_FIXED = 0, CHOICE_NRING = 1, CHOICE_SKIPPER = 2 };
enum { GATE_ALL = 0, GATE_NONE = 1, GATE_PARTIAL = 2 };
/* Per (view, endpoint). ST_ELIGIBLE: the walk may stop there. In a view with two
 * candidates or more (else neither is set), for a key at attempt 0 whose first endpoint
 * it is: ST_KEEP, the key keeps it (eligible and under the bar, or just eligible without
 * bounded load); ST_NEXT, the key gets the next node's endpoint if that one has ST_KEEP
 * (the skip rule steps over this one, or the walk past it may take a second endpoint). */
enum { ST_ELIGIBLE = 1, ST_KEEP = 2, ST_NEXT = 4 };
/* Output arrays a plan keeps for reuse (see route.c), and the longest one kept. */
#define LB_OUT_CACHE 4
#define LB_OUT_CACHE_MAX 65536

typedef struct {
    PyObject_HEAD
    /* The newest ring (may be views of shared memory: read with LOAD_RELAXED). */
    Py_buffer hashes_v, owners_v, buckets_v;
    const uint64_t *hashes;
    const int32_t *owners;
    const int32_t *buckets;
    Py_ssize_t size;      /* ring positions, >= 1 unless closed */
    int shift;            /* 64 - bucket bits */
    Py_ssize_t n;         /* endpoints */
    /* Views: one per ring (N-ring), per candidate level (Skipper fade-in), or one.
     * Plan-private memory, built by lbcore.plan; checked for shape here. */
    Py_ssize_t views;
    Py_buffer eligible_v, good_v, listed_count_v, eligible_count_v, single_v, loads_v;
    const uint8_t *eligible;        /* views x n: the walk may stop here */
    const uint8_t *good;            /* views x n: eligible and under the bar */
    const int64_t *listed_count;    /* per view: candidates Skipper counts */
    const int64_t *eligible_count;  /* per view: endpoints the walk may stop at */
    const int32_t *single;          /* per view: the one candidate, or -1 */
    const double *loads;            /* n: for the least loaded endpoint a capped walk saw */
    uint8_t *state;                 /* views x n: ST_* bits (plan-owned, PyMem) */
    int bounded;
    Py_ssize_t max_hops;            /* 0: Skipper's full lap */
    /* Which view a key uses. */
    int choice;
    Py_ssize_t fixed_view;
    uint64_t choice_salt;
    Py_buffer thresholds_v, saturated_v;
    const uint64_t *thresholds;
    const uint8_t *saturated;       /* the threshold is 2**64 */
    Py_ssize_t nthresholds;
    /* Zone affinity: views zone_views.. are the zone parts of views 0..zone_views-1
     * (0: no zone). A key is local iff zone_saturated or mix64(h, zone_salt) <
     * zone_threshold; a local key uses its view's zone part while that holds more
     * candidates than the attempt. under (n, with bounded load): the endpoint is at or
     * under its own bar; a local key's attempt-0 zone answer that is not spills to its
     * global view. */
    Py_ssize_t zone_views;
    uint64_t zone_salt, zone_threshold;
    int zone_saturated;
    Py_buffer under_v;
    const uint8_t *under;
    /* The rollout gate. */
    int gate;
    uint64_t gate_salt, gate_threshold;
    /* Endpoint index -> counter slot. */
    Py_buffer slots_v;
    const int64_t *slots;
    int64_t n_slots;
    /* Sequence check: words[guard_index] == guard_expected while the table is valid. */
    Py_buffer guard_v;
    const uint64_t *guard_words;
    Py_ssize_t guard_index;
    uint64_t guard_expected;
    int has_guard;
    int closed;                     /* every key is fallback */
    int ready;                      /* set last by a successful __init__: methods check it */
    Py_ssize_t max_key_bytes;
    /* Index arrays returned earlier, reused once nothing else refers to them. */
    PyObject *out_cache[LB_OUT_CACHE];
    unsigned out_next;
} LBPlan;

/* ---- route.c: the rules, on buffers only (callable without the GIL) --------------- */

/* Batches at least this long are routed without the GIL (arrays are hashed without it
 * too). */
#define LB_NOGIL_MIN 8192

typedef struct {
    Py_ssize_t fallbacks, moves;
    int bad; /* 1: a table entry out of range; 2: out of memory */
} lb_counts;

/* Routes hashes h[0..n) into out, adding to *c. */
void lb_route_hashes(const LBPlan *p, const uint64_t *h, Py_ssize_t n, int32_t *out,
                     Py_ssize_t attempt, lb_counts *c);
/* The attempt-0 answer and plain answer of every (view, position), views x size each. */
void lb_answer_all(const LBPlan *p, int32_t *answer, int32_t *plain, int *bad);
/* After routing: whether the sequence check still holds (acquire: the table reads
 * before it happen before it). */
int lb_still_valid(const LBPlan *p);

#endif
