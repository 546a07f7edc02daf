/* Search for one token id, the inner loop of n-gram lookup, in either direction.
 *
 * specfsm_find_{i32,i64}(p, lo, hi, v, backward): the largest e in [lo, hi] with
 * p[e] == v when backward is nonzero, else the smallest; -1 when there is none.
 * specfsm_find_last_* and specfsm_find_first_* name the two directions;
 * specfsm_find_last_pair_* searches back for two consecutive ids.
 *
 * Blocks of SCAN_BLOCK entries are tested with a branch-free OR of comparisons, which
 * compilers turn into SIMD compares; only a block with a hit is walked entry by entry.
 * On x86-64 GCC, an AVX2 clone is picked at load time where the CPU has it. One
 * primitive serves both directions: the direction is one predictable branch per block.
 */
#ifndef SPECFSM_SCAN_H
#define SPECFSM_SCAN_H

#include <stddef.h>
#include <stdint.h>

#define SCAN_BLOCK 64

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define SPECFSM_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SPECFSM_CLONES
#endif

#define SPECFSM_DEFINE_FIND(NAME, T)                                                  \
    SPECFSM_CLONES static ptrdiff_t NAME(const T *p, ptrdiff_t lo, ptrdiff_t hi, T v, \
                                         int backward)                                \
    {                                                                                 \
        while (hi - (SCAN_BLOCK - 1) >= lo) {                                         \
            const ptrdiff_t start = backward ? hi - (SCAN_BLOCK - 1) : lo;            \
            const T *b = p + start;                                                   \
            int hit = 0;                                                              \
            for (int k = 0; k < SCAN_BLOCK; k++)                                      \
                hit |= (b[k] == v);                                                   \
            if (hit) {                                                                \
                if (backward) {                                                       \
                    for (int k = SCAN_BLOCK - 1; k >= 0; k--)                         \
                        if (b[k] == v)                                                \
                            return start + k;                                         \
                } else {                                                              \
                    for (int k = 0; k < SCAN_BLOCK; k++)                              \
                        if (b[k] == v)                                                \
                            return start + k;                                         \
                }                                                                     \
            }                                                                         \
            if (backward)                                                             \
                hi -= SCAN_BLOCK;                                                     \
            else                                                                      \
                lo += SCAN_BLOCK;                                                     \
        }                                                                             \
        if (backward) {                                                               \
            for (; hi >= lo; hi--)                                                    \
                if (p[hi] == v)                                                       \
                    return hi;                                                        \
        } else {                                                                      \
            for (; lo <= hi; lo++)                                                    \
                if (p[lo] == v)                                                       \
                    return lo;                                                        \
        }                                                                             \
        return -1;                                                                    \
    }

SPECFSM_DEFINE_FIND(specfsm_find_i32, int32_t)
SPECFSM_DEFINE_FIND(specfsm_find_i64, int64_t)

/* specfsm_find_last_pair_{i32,i64}(p, lo, hi, u, v): the largest e in [lo, hi] with
 * p[e - 1] == u and p[e] == v, or -1; lo must be at least 1. The same blocks, each
 * tested for the pair: where v alone is common (a space, a comma) a search for it
 * stops at nearly every block, and one for the pair rarely does. */
#define SPECFSM_DEFINE_FIND_PAIR(NAME, T)                                             \
    SPECFSM_CLONES static ptrdiff_t NAME(const T *p, ptrdiff_t lo, ptrdiff_t hi, T u, \
                                         T v)                                         \
    {                                                                                 \
        while (hi - (SCAN_BLOCK - 1) >= lo) {                                         \
            const ptrdiff_t start = hi - (SCAN_BLOCK - 1);                            \
            const T *b = p + start;                                                   \
            int hit = 0;                                                              \
            for (int k = 0; k < SCAN_BLOCK; k++)                                      \
                hit |= (b[k] == v) & (b[k - 1] == u);                                 \
            if (hit) {                                                                \
                for (int k = SCAN_BLOCK - 1; k >= 0; k--)                             \
                    if (b[k] == v && b[k - 1] == u)                                   \
                        return start + k;                                             \
            }                                                                         \
            hi -= SCAN_BLOCK;                                                         \
        }                                                                             \
        for (; hi >= lo; hi--)                                                        \
            if (p[hi] == v && p[hi - 1] == u)                                         \
                return hi;                                                            \
        return -1;                                                                    \
    }

SPECFSM_DEFINE_FIND_PAIR(specfsm_find_last_pair_i32, int32_t)
SPECFSM_DEFINE_FIND_PAIR(specfsm_find_last_pair_i64, int64_t)

static inline ptrdiff_t specfsm_find_last_i32(const int32_t *p, ptrdiff_t lo, ptrdiff_t hi, int32_t v)
{
    return specfsm_find_i32(p, lo, hi, v, 1);
}

static inline ptrdiff_t specfsm_find_last_i64(const int64_t *p, ptrdiff_t lo, ptrdiff_t hi, int64_t v)
{
    return specfsm_find_i64(p, lo, hi, v, 1);
}

static inline ptrdiff_t specfsm_find_first_i32(const int32_t *p, ptrdiff_t lo, ptrdiff_t hi, int32_t v)
{
    return specfsm_find_i32(p, lo, hi, v, 0);
}

static inline ptrdiff_t specfsm_find_first_i64(const int64_t *p, ptrdiff_t lo, ptrdiff_t hi, int64_t v)
{
    return specfsm_find_i64(p, lo, hi, v, 0);
}

#endif
