/* Decimal strings of 64-bit integers, as integer keys are hashed (lbcore.keys: an int is
 * its decimal string, "-" for negatives): written out for hashing as bytes, or hashed
 * straight from registers. Built in registers because written to memory two digits at a
 * time and read back as 8-byte lanes, a string costs a store-forwarding stall per lane,
 * twice the arithmetic's time. */
#ifndef LBCORE_DECIMAL_H
#define LBCORE_DECIMAL_H

#include <stdint.h>
#include <string.h>

#include "xxh64.h"

static const char DIGITS2[201] = "00010203040506070809101112131415161718192021222324"
                                 "25262728293031323334353637383940414243444546474849"
                                 "50515253545556575859606162636465666768697071727374"
                                 "75767778798081828384858687888990919293949596979899";

/* Writes the decimal string of m ending at end; returns its start. Eight digits at a
 * time in 32-bit arithmetic, two at a time from a table. */
static inline char *format_u64(char *end, uint64_t m)
{
    char *p = end;
    while (m >= 100000000u) {
        uint32_t low = (uint32_t)(m % 100000000u);
        m /= 100000000u;
        for (int j = 0; j < 4; j++) {
            uint32_t r = low % 100;
            low /= 100;
            p -= 2;
            memcpy(p, DIGITS2 + 2 * r, 2);
        }
    }
    uint32_t v = (uint32_t)m;
    while (v >= 100) {
        uint32_t r = v % 100;
        v /= 100;
        p -= 2;
        memcpy(p, DIGITS2 + 2 * r, 2);
    }
    if (v >= 10) {
        p -= 2;
        memcpy(p, DIGITS2 + 2 * v, 2);
    } else {
        *--p = (char)('0' + v);
    }
    return p;
}

/* Eight ASCII digits of v < 10**8, zero-padded, first digit in the lowest byte. */
static inline uint64_t digits8(uint32_t v)
{
    uint32_t hi = v / 10000, lo = v % 10000;
    uint16_t a, b, c, d;
    memcpy(&a, DIGITS2 + 2 * (hi / 100), 2);
    memcpy(&b, DIGITS2 + 2 * (hi % 100), 2);
    memcpy(&c, DIGITS2 + 2 * (lo / 100), 2);
    memcpy(&d, DIGITS2 + 2 * (lo % 100), 2);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    a = __builtin_bswap16(a), b = __builtin_bswap16(b), c = __builtin_bswap16(c), d = __builtin_bswap16(d);
#endif
    return (uint64_t)a | (uint64_t)b << 16 | (uint64_t)c << 32 | (uint64_t)d << 48;
}

/* The 8 bytes at byte offset o of the little-endian words w[0..3]. */
static inline uint64_t lane_at(const uint64_t *w, int o)
{
    int q = o >> 3, r = (o & 7) * 8;
    return r ? (w[q] >> r) | (w[q + 1] << (64 - r)) : w[q];
}

static const uint64_t POW10[20] = {1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL,
    10000000ULL, 100000000ULL, 1000000000ULL, 10000000000ULL, 100000000000ULL,
    1000000000000ULL, 10000000000000ULL, 100000000000000ULL, 1000000000000000ULL,
    10000000000000000ULL, 100000000000000000ULL, 1000000000000000000ULL,
    10000000000000000000ULL};

/* XXH64 of the decimal string of (neg ? -m : m); *length gets its length. */
static inline uint64_t xxh64_decimal(uint64_t m, int neg, int *length)
{
    /* Digits: from the bit length (1233 / 4096 ~ log10(2)), corrected by one compare. */
    int t10 = (64 - __builtin_clzll(m | 1)) * 1233 >> 12;
    int digits = t10 + 1 - (m < POW10[t10]);
    if (digits < 1)
        digits = 1;
    uint64_t w[4] = {0x3030303030303030ULL, 0x3030303030303030ULL, 0, 0};
    if (m >= 100000000u) {
        uint64_t t = m / 100000000u;
        if (t >= 100000000u)
            w[0] = digits8((uint32_t)(t / 100000000u));
        w[1] = digits8((uint32_t)(t % 100000000u));
    }
    w[2] = digits8((uint32_t)(m % 100000000u));
    int len = digits + neg, o = 24 - len;
    if (neg) { /* the padding zero before the first digit becomes the sign */
        int q = o >> 3, r = (o & 7) * 8;
        w[q] = (w[q] & ~((uint64_t)0xFF << r)) | ((uint64_t)'-' << r);
    }
    *length = len;
    uint64_t h = XXH_P5 + (uint64_t)len;
    int rem = len;
    for (; rem >= 8; rem -= 8, o += 8) {
        h ^= xxh_round(0, lane_at(w, o));
        h = xxh_rotl(h, 27) * XXH_P1 + XXH_P4;
    }
    uint64_t tail = lane_at(w, o);
    if (rem >= 4) {
        h ^= (tail & 0xFFFFFFFFu) * XXH_P1;
        h = xxh_rotl(h, 23) * XXH_P2 + XXH_P3;
        tail >>= 32;
        rem -= 4;
    }
    for (; rem > 0; rem--, tail >>= 8) {
        h ^= (tail & 0xFF) * XXH_P5;
        h = xxh_rotl(h, 11) * XXH_P1;
    }
    h ^= h >> 33;
    h *= XXH_P2;
    h ^= h >> 29;
    h *= XXH_P3;
    return h ^ (h >> 32);
}

#endif
