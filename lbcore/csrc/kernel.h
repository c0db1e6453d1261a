/* lbcore's native kernel: declarations shared by its translation units.
 *
 * The kernel sees only buffers and Python key objects. Everything it reads from a
 * buffer that may live in shared memory (ring hashes, owners, bucket tables, guard
 * words) is read once into a local with a relaxed atomic load, checked against the
 * bounds the plan validated, and only then used: a writer rewriting the buffer under
 * us can make the answer wrong (the guard then says so), never make us read or write
 * out of bounds.
 */
#ifndef LBCORE_KERNEL_H
#define LBCORE_KERNEL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#if !defined(__GNUC__) && !defined(__clang__)
#error "lbcore's kernel needs GCC or Clang (__atomic builtins, the C11 memory model)"
#endif

/* The interface version lbcore.kernel expects (bump on any change of the Python API). */
#define LB_ABI 8

/* C11 memory-model operations through the compiler's __atomic builtins (the same
 * semantics as <stdatomic.h>, available in C99 mode). */
#define LOAD_RELAXED(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE_RELAXED(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define FENCE_ACQUIRE() __atomic_thread_fence(__ATOMIC_ACQUIRE)
#define FENCE_RELEASE() __atomic_thread_fence(__ATOMIC_RELEASE)
#define PREFETCH(p) __builtin_prefetch((p), 0, 1)
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- xxh64.h: XXH64, seed 0, from the xxHash specification ---------------------- */
#include "xxh64.h"
/* MurmurHash3's fmix64 of h ^ salt: the per-purpose second draw of a key. */
static inline uint64_t lb_mix64(uint64_t h, uint64_t salt)
{
    uint64_t x = h ^ salt;
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDULL;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ULL;
    return x ^ (x >> 33);
}

/* ---- keys.c: turning a batch of keys into hashes -------------------------------- */

/* Array kinds the Python side hands over (contiguous, native byte order, 1-D). */
enum lb_array_kind { LB_INT = 'i', LB_UINT = 'u', LB_BYTES = 'S', LB_UCS4 = 'U' };

typedef struct {
    PyObject *seq;      /* a list or tuple (borrowed from the caller), or NULL */
    PyObject *owned;    /* a batch converted by lbcore.keys.batch_of (owned), or NULL */
    Py_buffer view;     /* an array's buffer when seq is NULL */
    int kind;           /* enum lb_array_kind for arrays */
    Py_ssize_t itemsize;
    Py_ssize_t n;
    Py_ssize_t max_key_bytes; /* -1: no limit */
    /* The error lb_hash_keys found, for lb_keys_raise. */
    int err;
    Py_ssize_t err_index, err_detail, err_code;
} lb_keys;

/* Opens a batch: a list/tuple, or (array, kind, itemsize). Returns 0 or -1 with an
 * exception set. lb_keys_close releases what it holds. */
int lb_keys_open(lb_keys *k, PyObject *keys, PyObject *kind, Py_ssize_t max_key_bytes);
void lb_keys_close(lb_keys *k);
/* Hashes every key into out[0 .. k->n). Objects are read with the GIL held; arrays
 * may be hashed without it (nogil != 0: the caller released the GIL; any error is then
 * raised by lb_keys_raise after the caller reacquired it). Returns 0, or -1 with an
 * exception set (or, with nogil, pending for lb_keys_raise). */
int lb_hash_keys(lb_keys *k, uint64_t *out);
/* Raises the error lb_hash_keys returned -1 for (call it holding the GIL). */
int lb_keys_raise(lb_keys *k);
/* Whether hashing this batch touches no Python object (an array). */
static inline int lb_keys_nogil_ok(const lb_keys *k) { return k->seq == NULL; }

/* Module state the key code needs: exception types and NumPy's integer scalar type. */
typedef struct {
    PyObject *key_type_error;
    PyObject *key_encoding_error;
    PyObject *key_too_long_error;
    PyObject *table_error;
    PyObject *fault_error;  /* lbcore.errors.MappingFaultError */
    PyObject *np_integer;   /* numpy.integer, for NumPy integer scalars in a list */
    PyObject *np_empty;     /* numpy.empty */
    PyObject *np_ndarray;   /* numpy.ndarray */
    PyObject *argument_error;
    PyObject *batch_of;     /* lbcore.keys.batch_of: any other batch to a list or array */
    PyObject *dtype_i32, *dtype_u64, *dtype_u8, *dtype_intp;
} lb_state;
extern lb_state LB;

/* A fresh 1-D NumPy array of n elements of dtype (a new reference), and its buffer. */
PyObject *lb_new_array(Py_ssize_t n, PyObject *dtype, Py_buffer *view);

/* ---- plan.c / route.c ------------------------------------------------------------- */
extern PyTypeObject LB_PlanType;
PyObject *lb_plan_route(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames);
PyObject *lb_plan_route_hashes(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames);
PyObject *lb_plan_route_counted(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *lb_plan_answers(PyObject *self, PyObject *unused);
PyObject *lb_plan_counter_slots(PyObject *self, PyObject *idx);

/* ---- scatter.c -------------------------------------------------------------------- */
PyObject *lb_scatter_add(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);
PyObject *lb_scatter_add_routed(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);
PyObject *lb_record_newest(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);
/* target[cells[j]] += values[j] for j < n, cells checked by the caller, with scatter_add's
 * fences, under lb_guarded: 0 or LB_FAULTED. Call it holding the GIL (the row's one
 * writer is this process, its threads serialized by the GIL or the row's lock). */
int lb_add_cells(uint64_t *target, const int64_t *cells, const int64_t *values, Py_ssize_t n);

/* ---- guard.c: touches of shared memory that a shrunk object cuts short ------------ */
#define LB_FAULTED (-1)
typedef void (*lb_guarded_fn)(void *ctx);
/* Runs fn(ctx); 0, or LB_FAULTED if a SIGBUS on this thread cut it short (fn must then
 * leave nothing to undo: no allocation, no reference, no lock taken inside). Callable
 * with or without the GIL. */
int lb_guarded(lb_guarded_fn fn, void *ctx);
/* Raises lbcore.errors.MappingFaultError naming what faulted; returns -1. */
int lb_raise_fault(const char *what);
PyObject *lb_words_are(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);
/* Whether *a == x (an acquire load under lb_guarded): 1, 0 or LB_FAULTED. */
int lb_word_is(const uint64_t *a, uint64_t x);

/* ---- arcs.c: each view's arcs of a ring (B1's expected shares) --------------------- */
PyObject *lb_arc_sums(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

/* ---- calls.c ---------------------------------------------------------------------- */
PyObject *lb_add_calls(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

#endif
