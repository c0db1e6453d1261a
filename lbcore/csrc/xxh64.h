/* XXH64 with seed 0, written from the xxHash specification (Yann Collet,
 * doc/xxhash_spec.md, "XXH64 algorithm description"): Skipper hashes keys and ring
 * nodes with it (Go's xxhash.Sum64String), so these must be exactly its values. */
#ifndef LBCORE_XXH64_H
#define LBCORE_XXH64_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define XXH_P1 11400714785074694791ULL
#define XXH_P2 14029467366897019727ULL
#define XXH_P3 1609587929392839161ULL
#define XXH_P4 9650029242287828579ULL
#define XXH_P5 2870177450012600261ULL

static inline uint64_t xxh_rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/* The specification reads lanes little-endian whatever the CPU. */
static inline uint64_t xxh_read64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint64_t xxh_read32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t xxh_round(uint64_t acc, uint64_t lane)
{
    acc += lane * XXH_P2;
    return xxh_rotl(acc, 31) * XXH_P1;
}

static inline uint64_t xxh_merge(uint64_t acc, uint64_t v)
{
    acc ^= xxh_round(0, v);
    return acc * XXH_P1 + XXH_P4;
}

/* Inline: it runs once per key, and the key loops want it folded in. */
static inline uint64_t lb_xxh64(const void *data, size_t len)
{
    const uint8_t *p = (const uint8_t *)data;
    const uint8_t *end = p + len;
    uint64_t h;
    if (len >= 32) {
        /* Step 1-2: four accumulators over 32-byte stripes. */
        uint64_t v1 = XXH_P1 + XXH_P2, v2 = XXH_P2, v3 = 0, v4 = 0 - XXH_P1;
        const uint8_t *limit = end - 32;
        do {
            v1 = xxh_round(v1, xxh_read64(p));
            v2 = xxh_round(v2, xxh_read64(p + 8));
            v3 = xxh_round(v3, xxh_read64(p + 16));
            v4 = xxh_round(v4, xxh_read64(p + 24));
            p += 32;
        } while (p <= limit);
        /* Step 3: convergence. */
        h = xxh_rotl(v1, 1) + xxh_rotl(v2, 7) + xxh_rotl(v3, 12) + xxh_rotl(v4, 18);
        h = xxh_merge(h, v1);
        h = xxh_merge(h, v2);
        h = xxh_merge(h, v3);
        h = xxh_merge(h, v4);
    } else {
        h = XXH_P5; /* seed 0 */
    }
    /* Step 4: the length. */
    h += (uint64_t)len;
    /* Step 5: the remaining 8-byte lanes, a 4-byte lane, single bytes. */
    while (end - p >= 8) {
        h ^= xxh_round(0, xxh_read64(p));
        h = xxh_rotl(h, 27) * XXH_P1 + XXH_P4;
        p += 8;
    }
    if (end - p >= 4) {
        h ^= xxh_read32(p) * XXH_P1;
        h = xxh_rotl(h, 23) * XXH_P2 + XXH_P3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p) * XXH_P5;
        h = xxh_rotl(h, 11) * XXH_P1;
        p++;
    }
    /* Step 6: avalanche. */
    h ^= h >> 33;
    h *= XXH_P2;
    h ^= h >> 29;
    h *= XXH_P3;
    h ^= h >> 32;
    return h;
}

#endif
