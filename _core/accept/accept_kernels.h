/* Probability-row check and residual draw of the acceptance kernels (_core/accept.pyx),
 * written once for float and double.
 *
 * specfsm_check_rows_{f32,f64}(p, n, v, atol, &row, &col, &value): SPECFSM_OK, or what the
 * first bad row holds (SPECFSM_NONFINITE, SPECFSM_NEGATIVE, SPECFSM_BADSUM) and where;
 * the codes are specfsm.accept._checks.PROB_OK, PROB_NONFINITE, ... (its prob_error words them).
 * specfsm_pick_{f32,f64}(p, q, v, x, u, scratch): the token drawn from max(0, p - q).
 */
#ifndef SPECFSM_ACCEPT_KERNELS_H
#define SPECFSM_ACCEPT_KERNELS_H

#include <Python.h>

/* Row check: the row is summed in 8 independent lanes (vectorisable, no
   reassociation needed) and scanned for negatives; a row whose sum is not within
   atol of 1 (NaN and inf make it so) or that holds a negative entry is rescanned
   to name the first bad entry.

   Residual draw: r_j = max(0, p_j - q_j) (q one-hot on x when q is NULL; p alone
   when use_p). Groups of 8 entries are summed as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))
   (zeros past the end); the group sums are added in order; the token is the first
   entry whose running sum, walked from the group start, exceeds u * total. The twin
   performs the same float64 operations in the same order. */
#include <float.h>
#include <math.h>
#if defined(__SSE2__)
#include <emmintrin.h>
/* d > 0 ? d : 0 without a branch (MAXSD returns its second operand for NaN and
   for equal zeros, exactly the conditional's result). */
static inline double specfsm_pos(double d) {
    return _mm_cvtsd_f64(_mm_max_sd(_mm_set_sd(d), _mm_setzero_pd()));
}
/* Eight running sums, lane l holding x[l], x[l + 8], ... (j < v8, a multiple of 8),
   and whether any entry is negative; SSE2 vectors of two doubles where available. */
static inline void specfsm_lanes_f32(const float* x, Py_ssize_t v8, double* acc, int* neg) {
    __m128d a0 = _mm_setzero_pd(), a1 = _mm_setzero_pd();
    __m128d a2 = _mm_setzero_pd(), a3 = _mm_setzero_pd();
    __m128 ng = _mm_setzero_ps();
    const __m128 z = _mm_setzero_ps();
    for (Py_ssize_t j = 0; j < v8; j += 8) {
        __m128 x0 = _mm_loadu_ps(x + j), x1 = _mm_loadu_ps(x + j + 4);
        a0 = _mm_add_pd(a0, _mm_cvtps_pd(x0));
        a1 = _mm_add_pd(a1, _mm_cvtps_pd(_mm_movehl_ps(x0, x0)));
        a2 = _mm_add_pd(a2, _mm_cvtps_pd(x1));
        a3 = _mm_add_pd(a3, _mm_cvtps_pd(_mm_movehl_ps(x1, x1)));
        ng = _mm_or_ps(ng, _mm_or_ps(_mm_cmplt_ps(x0, z), _mm_cmplt_ps(x1, z)));
    }
    _mm_storeu_pd(acc, a0); _mm_storeu_pd(acc + 2, a1);
    _mm_storeu_pd(acc + 4, a2); _mm_storeu_pd(acc + 6, a3);
    *neg = _mm_movemask_ps(ng) != 0;
}
static inline void specfsm_lanes_f64(const double* x, Py_ssize_t v8, double* acc, int* neg) {
    __m128d a0 = _mm_setzero_pd(), a1 = _mm_setzero_pd();
    __m128d a2 = _mm_setzero_pd(), a3 = _mm_setzero_pd();
    __m128d ng = _mm_setzero_pd();
    const __m128d z = _mm_setzero_pd();
    for (Py_ssize_t j = 0; j < v8; j += 8) {
        __m128d x0 = _mm_loadu_pd(x + j), x1 = _mm_loadu_pd(x + j + 2);
        __m128d x2 = _mm_loadu_pd(x + j + 4), x3 = _mm_loadu_pd(x + j + 6);
        a0 = _mm_add_pd(a0, x0); a1 = _mm_add_pd(a1, x1);
        a2 = _mm_add_pd(a2, x2); a3 = _mm_add_pd(a3, x3);
        ng = _mm_or_pd(ng, _mm_or_pd(_mm_or_pd(_mm_cmplt_pd(x0, z), _mm_cmplt_pd(x1, z)),
                                     _mm_or_pd(_mm_cmplt_pd(x2, z), _mm_cmplt_pd(x3, z))));
    }
    _mm_storeu_pd(acc, a0); _mm_storeu_pd(acc + 2, a1);
    _mm_storeu_pd(acc + 4, a2); _mm_storeu_pd(acc + 6, a3);
    *neg = _mm_movemask_pd(ng) != 0;
}
#else
static inline double specfsm_pos(double d) { return d > 0.0 ? d : 0.0; }
#define SPECFSM_LANES(T, SUF)                                                        \
static inline void specfsm_lanes_##SUF(const T* x, Py_ssize_t v8, double* acc, int* neg) { \
    int n = 0;                                                                        \
    for (int l = 0; l < 8; l++) acc[l] = 0.0;                                         \
    for (Py_ssize_t j = 0; j < v8; j += 8)                                            \
        for (int l = 0; l < 8; l++) { double y = (double)x[j + l]; acc[l] += y; n |= (y < 0.0); } \
    *neg = n;                                                                         \
}
SPECFSM_LANES(float, f32)
SPECFSM_LANES(double, f64)
#endif

#define SPECFSM_OK 0
#define SPECFSM_NONFINITE 1
#define SPECFSM_NEGATIVE 2
#define SPECFSM_BADSUM 3

#define SPECFSM_DEFINE(T, SUF)                                                       \
static int specfsm_check_rows_##SUF(const T* p, Py_ssize_t n, Py_ssize_t v,          \
                                    double atol, Py_ssize_t* row, Py_ssize_t* col,   \
                                    double* value) {                                  \
    for (Py_ssize_t r = 0; r < n; r++) {                                              \
        const T* x = p + r * v;                                                       \
        double acc[8];                                                                \
        int ng;                                                                       \
        Py_ssize_t j = v - (v % 8);                                                   \
        specfsm_lanes_##SUF(x, j, acc, &ng);                                          \
        for (; j < v; j++) {                                                          \
            double y = (double)x[j];                                                  \
            acc[0] += y;                                                              \
            ng |= (y < 0.0);                                                          \
        }                                                                             \
        double s = ((acc[0] + acc[1]) + (acc[2] + acc[3]))                            \
                 + ((acc[4] + acc[5]) + (acc[6] + acc[7]));                           \
        if (ng || !(fabs(s - 1.0) <= atol)) {                                         \
            for (j = 0; j < v; j++) {                                                 \
                double y = (double)x[j];                                              \
                if (!(y >= 0.0 && y <= DBL_MAX)) {                                    \
                    *row = r; *col = j; *value = y;                                   \
                    return y < 0.0 ? SPECFSM_NEGATIVE : SPECFSM_NONFINITE;            \
                }                                                                     \
            }                                                                         \
            *row = r; *col = 0; *value = s;                                           \
            return SPECFSM_BADSUM;                                                    \
        }                                                                             \
    }                                                                                 \
    return SPECFSM_OK;                                                                \
}                                                                                     \
                                                                                      \
static inline double specfsm_res_##SUF(const T* p, const T* q, Py_ssize_t j,          \
                                       Py_ssize_t x, int use_p) {                     \
    double d;                                                                         \
    if (use_p) d = (double)p[j];                                                      \
    else if (q) d = (double)p[j] - (double)q[j];                                      \
    else if (j == x) d = (double)p[j] - 1.0;                                          \
    else d = (double)p[j];                                                            \
    return specfsm_pos(d);                                                            \
}                                                                                     \
                                                                                      \
static double specfsm_group_##SUF(const T* p, const T* q, Py_ssize_t v, Py_ssize_t g, \
                                  Py_ssize_t x, int use_p) {                          \
    double r[8];                                                                      \
    Py_ssize_t j0 = g * 8;                                                            \
    if (j0 + 8 <= v && (use_p || q || x < j0 || x >= j0 + 8)) {                       \
        if (q && !use_p) {                                                            \
            for (int l = 0; l < 8; l++) {                                             \
                double d = (double)p[j0 + l] - (double)q[j0 + l];                     \
                r[l] = specfsm_pos(d);                                                \
            }                                                                         \
        } else {                                                                      \
            for (int l = 0; l < 8; l++) {                                             \
                double d = (double)p[j0 + l];                                         \
                r[l] = specfsm_pos(d);                                                \
            }                                                                         \
        }                                                                             \
    } else {                                                                          \
        for (int l = 0; l < 8; l++)                                                   \
            r[l] = (j0 + l < v) ? specfsm_res_##SUF(p, q, j0 + l, x, use_p) : 0.0;    \
    }                                                                                 \
    return ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));         \
}                                                                                     \
                                                                                      \
static Py_ssize_t specfsm_pick_##SUF(const T* p, const T* q, Py_ssize_t v,            \
                                     Py_ssize_t x, double u, double* scratch) {       \
    Py_ssize_t ng = (v + 7) / 8;                                                      \
    for (int use_p = 0; use_p < 2; use_p++) {                                         \
        double total = 0.0;                                                           \
        for (Py_ssize_t g = 0; g < ng; g++) {                                         \
            double gs = specfsm_group_##SUF(p, q, v, g, x, use_p);                    \
            scratch[g] = gs;                                                          \
            total += gs;                                                              \
        }                                                                             \
        if (!(total > 0.0)) continue;                                                 \
        double t = u * total, run = 0.0;                                              \
        for (Py_ssize_t g = 0; g < ng; g++) {                                         \
            double next = run + scratch[g];                                           \
            if (next > t) {                                                           \
                double a = run;                                                       \
                Py_ssize_t last = -1;                                                 \
                for (Py_ssize_t j = g * 8; j < g * 8 + 8 && j < v; j++) {             \
                    double rj = specfsm_res_##SUF(p, q, j, x, use_p);                 \
                    if (rj > 0.0) last = j;                                           \
                    a += rj;                                                          \
                    if (a > t) return j;                                              \
                }                                                                     \
                return last;                                                          \
            }                                                                         \
            run = next;                                                               \
        }                                                                             \
        for (Py_ssize_t j = v - 1; j >= 0; j--)                                       \
            if (specfsm_res_##SUF(p, q, j, x, use_p) > 0.0) return j;                 \
    }                                                                                 \
    return x;                                                                         \
}

SPECFSM_DEFINE(float, f32)
SPECFSM_DEFINE(double, f64)

#endif
