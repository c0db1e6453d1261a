/* Keys: from a list, tuple or array of product IDs to their XXH64 hashes.
 *
 * The rules are lbcore.keys' (the reference, lbcore.keys.hash_each): a str is hashed as
 * its UTF-8 bytes, bytes-like as is, an integer as its decimal string (so 123 and "123"
 * route alike; an int subclass or NumPy integer scalar by its stored value, not its
 * __index__), a NumPy S array without trailing NUL padding, a U array as UTF-8 of its
 * code points without trailing NULs. Errors are the reference's too: keys are judged in
 * order and the first bad one (wrong type, not Unicode, too long) is reported.
 */
#include "kernel.h"
#include "decimal.h"

#include <stdio.h>
#include <string.h>

/* lbcore.keys._REPR_SAFE_BITS: ints of at most this many bits have at most 600 digits. */
#define LB_REPR_SAFE_BITS 1993

enum { ERR_NONE, ERR_SET, ERR_TYPE, ERR_ENCODING, ERR_TOO_LONG };

typedef struct {
    int err;
    Py_ssize_t index;     /* the key the error names */
    Py_ssize_t detail;    /* ERR_ENCODING: character; ERR_TOO_LONG: its length */
    Py_ssize_t code;      /* ERR_ENCODING: the code point */
    PyObject *bad;        /* ERR_TYPE: the key (borrowed) */
    /* Scratch for UTF-8 of non-ASCII strings and decimal strings of huge ints. */
    uint8_t *scratch;
    size_t scratch_size;
} hash_state;

static int raise_pending(const hash_state *st, const lb_keys *k)
{
    switch (st->err) {
    case ERR_TYPE: {
        PyObject *name = PyType_GetName(Py_TYPE(st->bad));
        if (name == NULL)
            return -1;
        PyErr_Format(LB.key_type_error,
                     "key %zd has type %U; expected str, bytes or int (a product ID: str is "
                     "hashed as UTF-8, int as its decimal string)",
                     st->index, name);
        Py_DECREF(name);
        return -1;
    }
    case ERR_ENCODING:
        if (st->code >= 0xD800 && st->code <= 0xDFFF) /* str.encode's own words */
            PyErr_Format(LB.key_encoding_error,
                         "key %zd is not valid Unicode and cannot be encoded as UTF-8: surrogates "
                         "not allowed at character %zd",
                         st->index, st->detail);
        else {
            char hex[24]; /* PyErr_Format has no upper-case hex */
            snprintf(hex, sizeof hex, "0x%llX", (unsigned long long)(size_t)st->code);
            PyErr_Format(LB.key_encoding_error,
                         "key %zd is not valid Unicode and cannot be encoded as UTF-8: code point "
                         "%s beyond U+10FFFF at character %zd",
                         st->index, hex, st->detail);
        }
        return -1;
    case ERR_TOO_LONG:
        PyErr_Format(LB.key_too_long_error,
                     "key %zd is %zd bytes long; keys may be at most %zd bytes", st->index,
                     st->detail, k->max_key_bytes);
        return -1;
    default:
        return -1; /* ERR_SET: the exception is set already */
    }
}

static uint8_t *scratch(hash_state *st, size_t need)
{
    if (need > st->scratch_size) {
        size_t size = need < 256 ? 256 : need;
        uint8_t *p = (uint8_t *)PyMem_RawRealloc(st->scratch, size);
        if (p == NULL)
            return NULL;
        st->scratch = p;
        st->scratch_size = size;
    }
    return st->scratch;
}

/* Key i of len bytes: 1 if it is within the limit, else 0 with the error set. */
static inline int length_ok(hash_state *st, const lb_keys *k, Py_ssize_t i, Py_ssize_t len)
{
    if (k->max_key_bytes < 0 || len <= k->max_key_bytes)
        return 1;
    st->err = ERR_TOO_LONG;
    st->index = i;
    st->detail = len;
    return 0;
}

/* A Python exception is set: returns -1 with the state saying so. */
static int python_error(hash_state *st)
{
    st->err = ERR_SET;
    return -1;
}


static inline int hash_decimal(hash_state *st, const lb_keys *k, Py_ssize_t i, uint64_t m,
                               int negative, uint64_t *out)
{
    int len;
    uint64_t h = xxh64_decimal(m, negative, &len);
    if (!length_ok(st, k, i, len))
        return -1;
    *out = h;
    return 0;
}

/* A Python int (any size; exact int or subclass, by value). Returns 0, or -1 with
 * st->err set. */
static int hash_pylong(hash_state *st, const lb_keys *k, Py_ssize_t i, PyObject *o, uint64_t *out)
{
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred())
        return python_error(st);
    if (!overflow) {
        uint64_t m = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
        return hash_decimal(st, k, i, m, v < 0, out);
    }
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(o);
        if (!(u == (unsigned long long)-1 && PyErr_Occurred()))
            return hash_decimal(st, k, i, (uint64_t)u, 0, out);
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return python_error(st);
        PyErr_Clear();
    }
    /* Beyond 64 bits: int.__repr__, as the reference formats it, while it is short enough
     * for every setting of Python's limit on digits (640 at the least). Longer ones go to
     * lbcore.keys.decimal_key, which measures them before it formats them and formats
     * them past that limit: the key's length, or its bytes. */
    size_t bits = _PyLong_NumBits(o);
    if (bits == (size_t)-1 && PyErr_Occurred())
        return python_error(st);
    PyObject *text;
    int rc = 0;
    if (bits <= LB_REPR_SAFE_BITS) {
        text = PyLong_Type.tp_repr(o);
        if (text == NULL)
            return python_error(st);
        Py_ssize_t len = PyUnicode_GET_LENGTH(text);
        if (length_ok(st, k, i, len))
            *out = lb_xxh64(PyUnicode_1BYTE_DATA(text), (size_t)len);
        else
            rc = -1;
        Py_DECREF(text);
        return rc;
    }
    PyObject *keys = PyImport_ImportModule("lbcore.keys");
    if (keys == NULL)
        return python_error(st);
    PyObject *limit = k->max_key_bytes < 0 ? Py_NewRef(Py_None) : PyLong_FromSsize_t(k->max_key_bytes);
    text = limit == NULL ? NULL : PyObject_CallMethod(keys, "decimal_key", "OO", o, limit);
    Py_XDECREF(limit);
    Py_DECREF(keys);
    if (text == NULL)
        return python_error(st);
    if (PyBytes_Check(text)) {
        Py_ssize_t len = PyBytes_GET_SIZE(text);
        if (length_ok(st, k, i, len))
            *out = lb_xxh64(PyBytes_AS_STRING(text), (size_t)len);
        else
            rc = -1;
    } else { /* too long: its length */
        Py_ssize_t len = PyLong_AsSsize_t(text);
        if (len == -1 && PyErr_Occurred()) {
            rc = python_error(st);
        } else if (length_ok(st, k, i, len)) {
            PyErr_SetString(PyExc_SystemError, "decimal_key gave the length of a key that fits");
            rc = python_error(st);
        } else {
            rc = -1; /* too long: length_ok set the error */
        }
    }
    Py_DECREF(text);
    return rc;
}

/* A NumPy integer scalar's own value: its NumPy type's int(), not a subclass's
 * __index__ or __int__ (the value a NumPy scalar holds is the key, as in an array). */
static PyObject *numpy_scalar_value(PyObject *o)
{
    PyTypeObject *t = Py_TYPE(o);
    while (t != NULL && (t->tp_flags & Py_TPFLAGS_HEAPTYPE))
        t = t->tp_base; /* NumPy's scalar types are static; subclasses are heap types */
    if (t == NULL || t->tp_as_number == NULL || t->tp_as_number->nb_int == NULL) {
        PyErr_Format(PyExc_TypeError, "%R has no NumPy integer base type", (PyObject *)Py_TYPE(o));
        return NULL;
    }
    PyObject *v = t->tp_as_number->nb_int(o);
    if (v != NULL && !PyLong_Check(v)) {
        Py_DECREF(v);
        PyErr_SetString(PyExc_TypeError, "a NumPy integer's int() is not an int");
        return NULL;
    }
    return v;
}

/* ---- str: UTF-8 straight from the string's storage --------------------------------- */

/* UTF-8 of n code points of the given kind into dst; returns its length, or -1 with
 * *bad set to the index of the first surrogate or value beyond U+10FFFF. */
static Py_ssize_t utf8_encode(int kind, const void *data, Py_ssize_t n, uint8_t *dst,
                              Py_ssize_t *bad)
{
    uint8_t *p = dst;
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, j);
        if (c < 0x80) {
            *p++ = (uint8_t)c;
        } else if (c < 0x800) {
            *p++ = (uint8_t)(0xC0 | (c >> 6));
            *p++ = (uint8_t)(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            if (c >= 0xD800 && c <= 0xDFFF) {
                *bad = j;
                return -1;
            }
            *p++ = (uint8_t)(0xE0 | (c >> 12));
            *p++ = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
            *p++ = (uint8_t)(0x80 | (c & 0x3F));
        } else if (c <= 0x10FFFF) {
            *p++ = (uint8_t)(0xF0 | (c >> 18));
            *p++ = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
            *p++ = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
            *p++ = (uint8_t)(0x80 | (c & 0x3F));
        } else { /* not a code point (only an array of raw UCS4 can hold one) */
            *bad = j;
            return -1;
        }
    }
    return (Py_ssize_t)(p - dst);
}

static int hash_ucs(hash_state *st, const lb_keys *k, Py_ssize_t i, int kind, const void *data,
                    Py_ssize_t n, uint64_t *out)
{
    uint8_t *dst = scratch(st, (size_t)n * 4 + 1);
    if (dst == NULL) {
        PyErr_NoMemory();
        st->err = ERR_SET;
        return -1;
    }
    Py_ssize_t bad = 0;
    Py_ssize_t len = utf8_encode(kind, data, n, dst, &bad);
    if (len < 0) {
        st->err = ERR_ENCODING;
        st->index = i;
        st->detail = bad;
        st->code = (Py_ssize_t)PyUnicode_READ(kind, data, bad);
        return -1;
    }
    if (!length_ok(st, k, i, len))
        return -1;
    *out = lb_xxh64(dst, (size_t)len);
    return 0;
}

/* One key object. Returns 0, or -1 with st->err set. */
static int hash_object(hash_state *st, const lb_keys *k, Py_ssize_t i, PyObject *o, uint64_t *out)
{
    if (PyUnicode_Check(o)) {
#if PY_VERSION_HEX < 0x030C0000
        if (PyUnicode_READY(o) < 0) {
            st->err = ERR_SET;
            return -1;
        }
#endif
        Py_ssize_t n = PyUnicode_GET_LENGTH(o);
        if (PyUnicode_IS_ASCII(o)) { /* UTF-8 is the string's own storage: no copy */
            if (!length_ok(st, k, i, n))
                return -1;
            *out = lb_xxh64(PyUnicode_1BYTE_DATA(o), (size_t)n);
            return 0;
        }
        return hash_ucs(st, k, i, PyUnicode_KIND(o), PyUnicode_DATA(o), n, out);
    }
    if (PyBytes_Check(o)) {
        Py_ssize_t n = PyBytes_GET_SIZE(o);
        if (!length_ok(st, k, i, n))
            return -1;
        *out = lb_xxh64(PyBytes_AS_STRING(o), (size_t)n);
        return 0;
    }
    if (PyLong_Check(o)) {
        if (PyBool_Check(o))
            goto wrong_type;
        return hash_pylong(st, k, i, o, out);
    }
    if (PyByteArray_Check(o)) {
        Py_ssize_t n = PyByteArray_GET_SIZE(o);
        if (!length_ok(st, k, i, n))
            return -1;
        *out = lb_xxh64(PyByteArray_AS_STRING(o), (size_t)n);
        return 0;
    }
    if (PyMemoryView_Check(o)) {
        /* bytes(view): its bytes in C order. A contiguous view is read in place. */
        Py_buffer v;
        int ok;
        if (PyObject_GetBuffer(o, &v, PyBUF_SIMPLE) == 0) {
            ok = length_ok(st, k, i, v.len);
            if (ok)
                *out = lb_xxh64(v.buf, (size_t)v.len);
            PyBuffer_Release(&v);
            return ok ? 0 : -1;
        }
        PyErr_Clear();
        PyObject *b = PyBytes_FromObject(o);
        if (b == NULL)
            return python_error(st);
        Py_ssize_t n = PyBytes_GET_SIZE(b);
        ok = length_ok(st, k, i, n);
        if (ok)
            *out = lb_xxh64(PyBytes_AS_STRING(b), (size_t)n);
        Py_DECREF(b);
        return ok ? 0 : -1;
    }
    if (LB.np_integer != NULL && PyObject_TypeCheck(o, (PyTypeObject *)LB.np_integer)) {
        PyObject *v = numpy_scalar_value(o);
        if (v == NULL)
            return python_error(st);
        int rc = hash_pylong(st, k, i, v, out);
        Py_DECREF(v);
        return rc;
    }
wrong_type:
    st->err = ERR_TYPE;
    st->index = i;
    st->bad = o;
    return -1;
}

/* ---- arrays ----------------------------------------------------------------------- */

static int hash_array_key(hash_state *st, const lb_keys *k, Py_ssize_t i, uint64_t *out)
{
    const uint8_t *item = (const uint8_t *)k->view.buf + i * k->itemsize;
    Py_ssize_t w = k->itemsize;
    switch (k->kind) {
    case LB_INT: {
        int64_t v;
        switch (w) {
        case 1: { int8_t x; memcpy(&x, item, 1); v = x; break; }
        case 2: { int16_t x; memcpy(&x, item, 2); v = x; break; }
        case 4: { int32_t x; memcpy(&x, item, 4); v = x; break; }
        default: memcpy(&v, item, 8); break;
        }
        return hash_decimal(st, k, i, v < 0 ? 0 - (uint64_t)v : (uint64_t)v, v < 0, out);
    }
    case LB_UINT: {
        uint64_t v;
        switch (w) {
        case 1: { uint8_t x; memcpy(&x, item, 1); v = x; break; }
        case 2: { uint16_t x; memcpy(&x, item, 2); v = x; break; }
        case 4: { uint32_t x; memcpy(&x, item, 4); v = x; break; }
        default: memcpy(&v, item, 8); break;
        }
        return hash_decimal(st, k, i, v, 0, out);
    }
    case LB_BYTES: { /* trailing NULs are NumPy's padding */
        Py_ssize_t len = w;
        while (len > 0 && item[len - 1] == 0)
            len--;
        if (!length_ok(st, k, i, len))
            return -1;
        *out = lb_xxh64(item, (size_t)len);
        return 0;
    }
    default: { /* LB_UCS4 */
        Py_ssize_t n = w / 4;
        uint32_t last;
        while (n > 0 && (memcpy(&last, item + 4 * (n - 1), 4), last == 0))
            n--;
        Py_ssize_t j = 0;
        uint32_t c = 0;
        while (j < n && (memcpy(&c, item + 4 * j, 4), c < 0x80))
            j++;
        if (j == n) { /* ASCII: one byte per code point */
            uint8_t *dst = scratch(st, (size_t)n + 1);
            if (dst == NULL) {
                st->err = ERR_SET; /* (set by the caller once it holds the GIL) */
                st->index = -1;
                return -1;
            }
            for (j = 0; j < n; j++) {
                memcpy(&c, item + 4 * j, 4);
                dst[j] = (uint8_t)c;
            }
            if (!length_ok(st, k, i, n))
                return -1;
            *out = lb_xxh64(dst, (size_t)n);
            return 0;
        }
        /* UCS4 items may be unaligned in a buffer: copy them to aligned scratch. */
        uint8_t *tmp = scratch(st, (size_t)n * 8 + 1);
        if (tmp == NULL) {
            st->err = ERR_SET;
            st->index = -1;
            return -1;
        }
        Py_UCS4 *cps = (Py_UCS4 *)(void *)(tmp + (size_t)n * 4);
        memcpy(cps, item, (size_t)n * 4);
        Py_ssize_t bad = 0;
        Py_ssize_t len = utf8_encode(PyUnicode_4BYTE_KIND, cps, n, tmp, &bad);
        if (len < 0) {
            st->err = ERR_ENCODING;
            st->index = i;
            st->detail = bad;
            st->code = (Py_ssize_t)cps[bad];
            return -1;
        }
        if (!length_ok(st, k, i, len))
            return -1;
        *out = lb_xxh64(tmp, (size_t)len);
        return 0;
    }
    }
}

/* Keys [a, b) of a list or tuple. */
static int hash_seq_range(hash_state *st, lb_keys *k, Py_ssize_t a, Py_ssize_t b, uint64_t *out)
{
    PyObject *seq = k->seq;
    int is_list = PyList_Check(seq);
    PyObject **items = is_list ? ((PyListObject *)seq)->ob_item : ((PyTupleObject *)seq)->ob_item;
    for (Py_ssize_t i = a; i < b; i++) {
        PyObject *o = items[i];
        if (i + 4 < b)
            PREFETCH(items[i + 4]); /* the key objects are scattered: load them early */
        /* The common key, an ASCII str: its storage is its UTF-8; nothing here runs
         * Python code, so the list cannot change under us. */
        if (LIKELY(PyUnicode_CheckExact(o) && PyUnicode_IS_COMPACT_ASCII(o))) {
            Py_ssize_t len = PyUnicode_GET_LENGTH(o);
            if (UNLIKELY(!length_ok(st, k, i, len)))
                return -1;
            out[i] = lb_xxh64(PyUnicode_1BYTE_DATA(o), (size_t)len);
            continue;
        }
        /* Any other key may run Python code (an integer's __index__, a buffer export):
         * hold it, and fetch the next items afresh from a list of unchanged size. */
        Py_INCREF(o);
        int rc = hash_object(st, k, i, o, out + i);
        if (rc < 0 && st->err == ERR_TYPE) {
            raise_pending(st, k); /* names the key while we still hold it */
            st->err = ERR_SET;
        }
        Py_DECREF(o);
        if (rc < 0)
            return -1;
        Py_ssize_t size = is_list ? PyList_GET_SIZE(seq) : PyTuple_GET_SIZE(seq);
        if (size != k->n) {
            PyErr_SetString(PyExc_RuntimeError, "the batch of keys changed size while it was hashed");
            st->err = ERR_SET;
            return -1;
        }
        items = is_list ? ((PyListObject *)seq)->ob_item : ((PyTupleObject *)seq)->ob_item;
    }
    return 0;
}

/* Integer arrays: one loop per item type (decimal strings: decimal.h). Keys are formatted
 * a group at a time and then hashed: the hash's 8-byte loads of digits stored a moment
 * before would each wait for the stores to drain. */
#define GROUP 64

#define INT_RANGE(T, SIGNED)                                                                    \
    for (Py_ssize_t g = a; g < b; g += GROUP) {                                                 \
        Py_ssize_t e = g + GROUP < b ? g + GROUP : b;                                           \
        char text[GROUP][24];                                                                   \
        uint8_t start[GROUP];                                                                   \
        for (Py_ssize_t i = g; i < e; i++) {                                                    \
            T x;                                                                                \
            memcpy(&x, base + i * (Py_ssize_t)sizeof(T), sizeof(T));                            \
            char *end = text[i - g] + 24, *p;                                                   \
            if (SIGNED) {                                                                       \
                int64_t v = (int64_t)x;                                                         \
                p = format_u64(end, v < 0 ? 0 - (uint64_t)v : (uint64_t)v);                     \
                if (v < 0)                                                                      \
                    *--p = '-';                                                                 \
            } else {                                                                            \
                p = format_u64(end, (uint64_t)x);                                               \
            }                                                                                   \
            start[i - g] = (uint8_t)(p - text[i - g]);                                          \
        }                                                                                       \
        for (Py_ssize_t i = g; i < e; i++) {                                                    \
            Py_ssize_t len = 24 - start[i - g];                                                 \
            if (!unchecked && !length_ok(st, k, i, len))                                        \
                return -1;                                                                      \
            out[i] = lb_xxh64(text[i - g] + start[i - g], (size_t)len);                         \
        }                                                                                       \
    }

static int hash_int_range(hash_state *st, lb_keys *k, Py_ssize_t a, Py_ssize_t b, uint64_t *out)
{
    const uint8_t *base = (const uint8_t *)k->view.buf;
    int unchecked = k->max_key_bytes < 0 || k->max_key_bytes >= 20;
    if (k->kind == LB_INT) {
        switch (k->itemsize) {
        case 1: INT_RANGE(int8_t, 1) break;
        case 2: INT_RANGE(int16_t, 1) break;
        case 4: INT_RANGE(int32_t, 1) break;
        default: INT_RANGE(int64_t, 1) break;
        }
    } else {
        switch (k->itemsize) {
        case 1: INT_RANGE(uint8_t, 0) break;
        case 2: INT_RANGE(uint16_t, 0) break;
        case 4: INT_RANGE(uint32_t, 0) break;
        default: INT_RANGE(uint64_t, 0) break;
        }
    }
    return 0;
}

int lb_hash_keys(lb_keys *k, uint64_t *out)
{
    hash_state st;
    memset(&st, 0, sizeof st);
    Py_ssize_t n = k->n;
    int rc = 0;
    if (k->seq != NULL) {
        rc = hash_seq_range(&st, k, 0, n, out);
    } else if (k->kind == LB_INT || k->kind == LB_UINT) {
        rc = hash_int_range(&st, k, 0, n, out);
    } else {
        for (Py_ssize_t i = 0; i < n && rc == 0; i++)
            rc = hash_array_key(&st, k, i, out + i);
    }
    PyMem_RawFree(st.scratch);
    if (rc == 0)
        return 0;
    /* Arrays may have been hashed without the GIL: the pending error is raised by
     * lb_keys_raise, called with it. */
    k->err = st.err;
    k->err_index = st.index;
    k->err_detail = st.detail;
    k->err_code = st.code;
    return -1;
}

int lb_keys_raise(lb_keys *k)
{
    if (k->err == ERR_SET) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    hash_state st;
    memset(&st, 0, sizeof st);
    st.err = k->err;
    st.index = k->err_index;
    st.detail = k->err_detail;
    st.code = k->err_code;
    return raise_pending(&st, k);
}

/* ---- opening a batch ----------------------------------------------------------------- */

/* A 1-D C-contiguous native-order NumPy array of integers, S or U: its kind, read off
 * the buffer's format (0: anything else, for lbcore.keys.batch_of to sort out). */
static int array_kind(const Py_buffer *v)
{
    if (v->ndim != 1 || v->format == NULL || v->itemsize < 1)
        return 0;
    const char *f = v->format;
    if (*f == '=' || *f == '<' || *f == '@')
        f++;
    if (f[0] != '\0' && f[1] == '\0') {
        switch (f[0]) {
        case 'b': case 'h': case 'i': case 'l': case 'q': case 'n':
            return v->itemsize <= 8 ? LB_INT : 0;
        case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N':
            return v->itemsize <= 8 ? LB_UINT : 0;
        default:
            return 0;
        }
    }
    while (*f >= '0' && *f <= '9')
        f++;
    if (f[0] == 's' && f[1] == '\0')
        return LB_BYTES;
    if (f[0] == 'w' && f[1] == '\0' && v->itemsize % 4 == 0)
        return LB_UCS4;
    return 0;
}

int lb_keys_open(lb_keys *k, PyObject *keys, PyObject *kind, Py_ssize_t max_key_bytes)
{
    memset(k, 0, sizeof *k);
    k->max_key_bytes = max_key_bytes;
    if (kind == NULL || kind == Py_None) {
        if (PyList_Check(keys) || PyTuple_Check(keys)) {
            k->seq = keys;
            k->n = PyList_Check(keys) ? PyList_GET_SIZE(keys) : PyTuple_GET_SIZE(keys);
            return 0;
        }
        /* Plain arrays only: a subclass (a masked array above all) is batch_of's to
         * judge, so both kernels read the same keys or raise the same error. */
        if (Py_IS_TYPE(keys, (PyTypeObject *)LB.np_ndarray)) {
            if (PyObject_GetBuffer(keys, &k->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
                int code = array_kind(&k->view);
                if (code && k->view.len > 0) {
                    k->kind = code;
                    k->itemsize = k->view.itemsize;
                    k->n = k->view.len / k->itemsize;
                    return 0;
                }
                PyBuffer_Release(&k->view);
            } else {
                PyErr_Clear();
            }
        }
        /* Anything else: lbcore.keys.batch_of gives a list or a plain array (or the
         * reference's error). */
        PyObject *pair = PyObject_CallOneArg(LB.batch_of, keys);
        if (pair == NULL)
            return -1;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            (PyTuple_GET_ITEM(pair, 1) == Py_None && !PyList_Check(PyTuple_GET_ITEM(pair, 0)) &&
             !PyTuple_Check(PyTuple_GET_ITEM(pair, 0)))) {
            Py_DECREF(pair);
            PyErr_SetString(PyExc_TypeError, "batch_of must return (list, None) or (array, kind)");
            return -1;
        }
        int rc = lb_keys_open(k, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1), max_key_bytes);
        if (rc == 0) {
            k->owned = PyTuple_GET_ITEM(pair, 0); /* keep the converted batch alive */
            Py_INCREF(k->owned);
        }
        Py_DECREF(pair);
        return rc;
    }
    /* kind: (kind character, itemsize) as the Python side read it off the dtype. */
    int code;
    Py_ssize_t itemsize;
    if (!PyArg_ParseTuple(kind, "Cn", &code, &itemsize))
        return -1;
    int ok = 0;
    if (code == LB_INT || code == LB_UINT)
        ok = itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8;
    else if (code == LB_BYTES)
        ok = itemsize >= 0;
    else if (code == LB_UCS4)
        ok = itemsize >= 0 && itemsize % 4 == 0;
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "unsupported key array kind %c with itemsize %zd", code, itemsize);
        return -1;
    }
    if (PyObject_GetBuffer(keys, &k->view, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    k->kind = code;
    k->itemsize = itemsize;
    if (itemsize == 0) {
        PyBuffer_Release(&k->view);
        PyErr_SetString(PyExc_ValueError, "key arrays of itemsize 0 are passed as a list");
        return -1;
    }
    if (k->view.len % itemsize != 0) {
        PyBuffer_Release(&k->view);
        PyErr_Format(PyExc_ValueError, "key buffer of %zd bytes is not a whole number of %zd-byte items",
                     k->view.len, itemsize);
        return -1;
    }
    k->n = k->view.len / itemsize;
    return 0;
}

void lb_keys_close(lb_keys *k)
{
    if (k->seq == NULL && k->view.obj != NULL)
        PyBuffer_Release(&k->view);
    k->view.obj = NULL;
    Py_CLEAR(k->owned);
}

PyObject *lb_new_array(Py_ssize_t n, PyObject *dtype, Py_buffer *view)
{
    PyObject *size = PyLong_FromSsize_t(n);
    if (size == NULL)
        return NULL;
    PyObject *args[2] = {size, dtype};
    PyObject *arr = PyObject_Vectorcall(LB.np_empty, args, 2, NULL);
    Py_DECREF(size);
    if (arr == NULL)
        return NULL;
    if (PyObject_GetBuffer(arr, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}
