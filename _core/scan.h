/* Backward search for one token id, the inner loop of n-gram lookup.
 *
 * find_last_eq_*(p, lo, hi, v): the largest e in [lo, hi] with p[e] == v, or -1.
 * Blocks of SCAN_BLOCK entries are tested with a branch-free OR of comparisons, which
 * compilers turn into SIMD compares; only a block with a hit is walked entry by entry.
 * On x86-64 GCC, an AVX2 clone is picked at load time where the CPU has it.
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

#define SPECFSM_DEFINE_FIND_LAST(NAME, T)                                        \
    SPECFSM_CLONES static ptrdiff_t NAME(const T *p, ptrdiff_t lo, ptrdiff_t hi, T v) \
    {                                                                            \
        ptrdiff_t e = hi;                                                        \
        while (e - (SCAN_BLOCK - 1) >= lo) {                                     \
            const T *b = p + (e - (SCAN_BLOCK - 1));                             \
            int hit = 0;                                                         \
            for (int k = 0; k < SCAN_BLOCK; k++)                                 \
                hit |= (b[k] == v);                                              \
            if (hit) {                                                           \
                for (int k = SCAN_BLOCK - 1; k >= 0; k--)                        \
                    if (b[k] == v)                                               \
                        return e - (SCAN_BLOCK - 1) + k;                         \
            }                                                                    \
            e -= SCAN_BLOCK;                                                     \
        }                                                                        \
        for (; e >= lo; e--)                                                     \
            if (p[e] == v)                                                       \
                return e;                                                        \
        return -1;                                                               \
    }

SPECFSM_DEFINE_FIND_LAST(specfsm_find_last_i32, int32_t)
SPECFSM_DEFINE_FIND_LAST(specfsm_find_last_i64, int64_t)

#endif
