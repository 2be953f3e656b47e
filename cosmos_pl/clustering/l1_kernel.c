/* Pairwise L1 distances between the rows of a float32 matrix: the hot loop of COSMOS's client distances
 * (Section 4.1), d(i, j) = sum_k |x[i, k] - x[j, k]| over the flattened [n * M] pseudo-labels.
 *
 * The work is N^2/2 * n * M absolute differences (1.25e11 at N = 500, |U| = 10,000, M = 100), so the loop is
 * blocked for the caches: the columns are taken in chunks that keep all N rows' slices in L2/L3, and each tile
 * of 2 x 4 rows keeps 8 running sums in registers (AVX2 when the compiler targets it, plain C otherwise).
 * Every pair is summed by one thread in a fixed order: the result does not depend on the thread count.
 * Compiled on first use by cosmos_pl/clustering/native.py; without a C compiler the same sums run in torch.
 */
#include <math.h>
#include <stdint.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define KC 1024 /* columns per chunk: N * KC * 4 bytes stay in cache (2 MB at N = 500) */
#define BI 2
#define BJ 4

static void tile(const float *x, int64_t n, int64_t d, int64_t i0, int64_t j0, int64_t k0, int64_t k1,
                 double *out) {
    const float *a[BI], *b[BJ];
    for (int r = 0; r < BI; r++) a[r] = x + (i0 + r < n ? i0 + r : n - 1) * d; /* clamp: rows past n are ignored */
    for (int c = 0; c < BJ; c++) b[c] = x + (j0 + c < n ? j0 + c : n - 1) * d;
    float acc[BI][BJ] = {{0}};
    int64_t k = k0;
#ifdef __AVX2__
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 s[BI][BJ];
    for (int r = 0; r < BI; r++)
        for (int c = 0; c < BJ; c++) s[r][c] = _mm256_setzero_ps();
    for (; k + 8 <= k1; k += 8) {
        __m256 va0 = _mm256_loadu_ps(a[0] + k), va1 = _mm256_loadu_ps(a[1] + k);
        for (int c = 0; c < BJ; c++) {
            __m256 vb = _mm256_loadu_ps(b[c] + k);
            s[0][c] = _mm256_add_ps(s[0][c], _mm256_andnot_ps(sign, _mm256_sub_ps(va0, vb)));
            s[1][c] = _mm256_add_ps(s[1][c], _mm256_andnot_ps(sign, _mm256_sub_ps(va1, vb)));
        }
    }
    for (int r = 0; r < BI; r++)
        for (int c = 0; c < BJ; c++) {
            float lanes[8];
            _mm256_storeu_ps(lanes, s[r][c]);
            for (int l = 0; l < 8; l++) acc[r][c] += lanes[l];
        }
#endif
    for (; k < k1; k++)
        for (int r = 0; r < BI; r++)
            for (int c = 0; c < BJ; c++) acc[r][c] += fabsf(a[r][k] - b[c][k]);
    for (int r = 0; r < BI; r++)
        for (int c = 0; c < BJ; c++) {
            int64_t i = i0 + r, j = j0 + c;
            if (i < n && j < n && j > i) out[i * n + j] += (double)acc[r][c];
        }
}

/* out: [n, n] float64, zero on entry; on return its upper triangle (j > i) holds the sums. */
void cosmos_l1_upper(const float *x, int64_t n, int64_t d, double *out) {
    int64_t blocks = (n + BI - 1) / BI;
    for (int64_t k0 = 0; k0 < d; k0 += KC) {
        int64_t k1 = k0 + KC < d ? k0 + KC : d;
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t ib = 0; ib < blocks; ib++) {
            int64_t i0 = ib * BI;
            for (int64_t j0 = i0; j0 < n; j0 += BJ) tile(x, n, d, i0, j0, k0, k1, out);
        }
    }
}
