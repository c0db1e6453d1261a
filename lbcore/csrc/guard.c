/* Reads and writes of shared memory that survive the object being shrunk under them.
 *
 * A POSIX shared-memory object another process truncates faults (SIGBUS) on the next
 * touch of its mapping past the new end. Probing each object's size before each touch
 * (an lseek) costs a system call per segment per step and still leaves a window between
 * the probe and the touch. Instead, the kernel's touches of shared memory run inside
 * lb_guarded: a SIGBUS raised on the thread while it is inside makes lb_guarded return
 * LB_FAULTED (the step cut short), and the caller asks each segment for the verdict the
 * slow way. No system call on the way in or out: the jump buffer does not save the
 * signal mask (the handler runs with SA_NODEFER, so the mask is the same before and
 * after the jump).
 *
 * The handler is installed on the first guarded call of the process, not at import, so
 * that a faulthandler enabled at start-up (python -X faulthandler, pytest) is installed
 * before it: a SIGBUS outside every guard goes on to the handler that was there before
 * (faulthandler's traceback, then the default action), or to the default action. A
 * faulthandler enabled after the first guarded call takes the signal first: a guarded
 * fault then prints its traceback before faulthandler hands the signal back to us and
 * the step is cut short all the same.
 */
#include "kernel.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

typedef struct lb_guard {
    sigjmp_buf env;
    struct lb_guard *prev;
} lb_guard;

/* Initial-exec TLS: a plain thread-pointer-relative load, safe in a signal handler. */
static __thread lb_guard *volatile guard_cur __attribute__((tls_model("initial-exec")));

static struct sigaction prev_bus;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static volatile int installed;

/* A fault of this thread's own access, or the signal handed back by a faulthandler
 * that saw it first (raise: tkill from this process); never one another process sent,
 * which could arrive inside an allocation a jump must not leave. */
static int own_fault(const siginfo_t *info)
{
    if (info == NULL)
        return 0;
    return info->si_code > 0 || (info->si_code == SI_TKILL && info->si_pid == getpid());
}

static void on_sigbus(int sig, siginfo_t *info, void *uctx)
{
    lb_guard *g = guard_cur;
    if (g != NULL && own_fault(info)) {
        guard_cur = g->prev;
        siglongjmp(g->env, 1);
    }
    /* Not ours: what was there before us. */
    if (prev_bus.sa_flags & SA_SIGINFO) {
        if (prev_bus.sa_sigaction != NULL) {
            prev_bus.sa_sigaction(sig, info, uctx);
            return;
        }
    } else if (prev_bus.sa_handler == SIG_IGN) {
        return;
    } else if (prev_bus.sa_handler != SIG_DFL && prev_bus.sa_handler != NULL) {
        prev_bus.sa_handler(sig);
        return;
    }
    /* The default action (terminate, core): with SA_NODEFER the signal raised here is
     * delivered at once; a fault would also repeat on return. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, NULL);
    raise(SIGBUS);
}

static void install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    if (sigaction(SIGBUS, &sa, &prev_bus) == 0)
        installed = 1;
}

int lb_guarded(lb_guarded_fn fn, void *ctx)
{
    pthread_once(&install_once, install);
    if (UNLIKELY(!installed))
        return LB_FAULTED; /* no handler: the caller's slow path probes sizes instead */
    lb_guard g;
    g.prev = guard_cur;
    if (sigsetjmp(g.env, 0) != 0)
        return LB_FAULTED; /* (the handler restored guard_cur) */
    guard_cur = &g;
    /* Compiler barriers: no access of fn may move out of the guarded stretch. */
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    fn(ctx);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    guard_cur = g.prev;
    return 0;
}

int lb_raise_fault(const char *what)
{
    PyErr_Format(LB.fault_error,
                 "%s: shared memory faulted under the access (the object behind the mapping "
                 "was shrunk by another process); nothing more was read or written",
                 what);
    return -1;
}

/* ---- words_are: the per-batch "is this still the current one" check ---------------- */

typedef struct {
    const uint64_t *a, *b;
    uint64_t x, y;
    int same;
} words_ctx;

static void compare_words(void *p)
{
    words_ctx *c = (words_ctx *)p;
    /* Acquire: what the caller reads after a match happens after these loads. */
    int same = __atomic_load_n(c->a, __ATOMIC_ACQUIRE) == c->x;
    if (same && c->b != NULL)
        same = __atomic_load_n(c->b, __ATOMIC_ACQUIRE) == c->y;
    c->same = same;
}

int lb_word_is(const uint64_t *a, uint64_t x)
{
    words_ctx c = {a, NULL, x, 0, 0};
    return lb_guarded(compare_words, &c) == LB_FAULTED ? LB_FAULTED : c.same;
}

/* One uint64 word of a buffer (a memoryview cast to 'Q' or a uint64/int64 array),
 * its index checked. */
static int word_at(PyObject *buf, PyObject *index, Py_buffer *v, const uint64_t **out)
{
    Py_ssize_t i = PyLong_AsSsize_t(index);
    if (i == -1 && PyErr_Occurred())
        return -1;
    if (PyObject_GetBuffer(buf, v, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (v->itemsize != 8 || ((uintptr_t)v->buf & 7) != 0 || i < 0 || i >= v->len / 8) {
        PyBuffer_Release(v);
        PyErr_Format(PyExc_IndexError,
                     "words_are: word %zd of an aligned buffer of 8-byte words is required", i);
        return -1;
    }
    *out = (const uint64_t *)v->buf + i;
    return 0;
}

static int take_u64(PyObject *o, uint64_t *out)
{
    unsigned long long x = PyLong_AsUnsignedLongLong(o);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        /* A negative expected value never matches a word: compare it as all ones. */
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        int overflow;
        long long s = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (s == -1 && PyErr_Occurred())
            return -1;
        x = (unsigned long long)s;
    }
    *out = (uint64_t)x;
    return 0;
}

PyObject *lb_words_are(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    if (nargs != 3 && nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "words_are(a, i, x[, b, j, y])");
        return NULL;
    }
    Py_buffer av = {0}, bv = {0};
    words_ctx c = {NULL, NULL, 0, 0, 0};
    PyObject *result = NULL;
    if (take_u64(args[2], &c.x) < 0 || (nargs == 6 && take_u64(args[5], &c.y) < 0))
        return NULL;
    if (word_at(args[0], args[1], &av, &c.a) < 0)
        return NULL;
    if (nargs == 6 && word_at(args[3], args[4], &bv, &c.b) < 0)
        goto done;
    result = PyLong_FromLong(lb_guarded(compare_words, &c) == LB_FAULTED ? -1 : c.same);
done:
    PyBuffer_Release(&av);
    if (bv.obj != NULL)
        PyBuffer_Release(&bv);
    return result;
}
