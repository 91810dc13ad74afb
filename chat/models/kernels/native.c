/* turncache's two CPU kernels, built and loaded by chat/models/kernels/native.py (read its docstring first).
 *
 * tc_int8_linear       y = dequant(quant(x) . W^T) (+ bias): the same arithmetic as chat.models.hf.fast_paths.int8_linear,
 *                      bit for bit, reading each weight byte once for up to 8 rows.
 * tc_attention         every sequence's query tokens over its own K/V rows (causal, optionally within a window),
 *                      in one call: decode steps and prefill chunks; each query token computed the same way in any
 *                      call, so a position's result does not depend on the chunking. K/V rows in float32 or float16
 *                      (per sequence; float16 is read into float32, and new rows are rounded to nearest even as
 *                      torch rounds them).
 *
 * Both need AVX-512 (F, BW) and VNNI; tc_supported() says whether this CPU has them. Work is split over OpenMP
 * threads (the caller's team: torch's own libgomp, which the loader shares by soname), and every output element is
 * computed by one thread in a fixed order, so results do not depend on the number of threads or of rows.
 * Compiled without FMA contraction: every multiply and add rounds as written.
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))

int tc_abi_version(void) { return 7; }

/* One sequence's row of tc_attention's table: the record chat/models/kernels/native.py declares as AttentionRow (a
 * ctypes.Structure with these fields in this order). tc_attention_row_layout tells the Python side its size and
 * field offsets, which a test compares with the Structure's; the ABI version above changes with it. */
typedef struct {
    int64_t keys;              /* address (bytes) of the first visible key row, head 0 */
    int64_t key_head_stride;   /* elements between two K/V heads' key rows */
    int64_t key_row_stride;    /* elements between two key rows */
    int64_t values;            /* likewise for the values */
    int64_t value_head_stride;
    int64_t value_row_stride;
    int64_t rows;              /* visible rows, the sequence's query tokens being the last ones */
    int64_t new_key;           /* 0, or (one query token) where head 0 of its new key lies (float32) */
    int64_t new_value;         /* likewise for its new value */
    int64_t queries;           /* query tokens */
    int64_t first;             /* first query token in q and out */
    int64_t half;              /* 1: K/V rows are float16; 0: float32 */
} tc_attention_row;

#define ROW_FIELDS 12

/* out[0] = sizeof(tc_attention_row), out[1 + i] = offset of field i; returns how many values it wrote (at most n). */
int64_t tc_attention_row_layout(int64_t *out, int64_t n) {
    const int64_t layout[1 + ROW_FIELDS] = {
        sizeof(tc_attention_row),
        offsetof(tc_attention_row, keys),
        offsetof(tc_attention_row, key_head_stride),
        offsetof(tc_attention_row, key_row_stride),
        offsetof(tc_attention_row, values),
        offsetof(tc_attention_row, value_head_stride),
        offsetof(tc_attention_row, value_row_stride),
        offsetof(tc_attention_row, rows),
        offsetof(tc_attention_row, new_key),
        offsetof(tc_attention_row, new_value),
        offsetof(tc_attention_row, queries),
        offsetof(tc_attention_row, first),
        offsetof(tc_attention_row, half),
    };
    int64_t count = n < 1 + ROW_FIELDS ? n : 1 + ROW_FIELDS;
    for (int64_t i = 0; i < count; i++) out[i] = layout[i];
    return count;
}

int tc_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
}

static inline __mmask16 float_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

/* ------------------------------------------------------------------ int8 linear */

/* The weight is packed for VNNI: output channels in blocks of 16 (the lanes of a vector), the input dimension in
 * groups of 4 bytes (what one lane's dot-product step takes). Block b holds, for group g, channel c and byte e:
 *     packed[((b * groups + g) * 16 + c) * 4 + e] = w[16 b + c][4 g + e]
 * with channels padded with zeros to a multiple of PAIR (32) and the input to a multiple of 4 (groups = k4 / 4).
 * One activation row then meets 16 channels per instruction, with no horizontal sums at the end. */
#define LANES 16
#define PAIR 32      /* channels per task: two blocks */
#define MAX_ROWS 8   /* activation rows per pass over a pair of blocks (2 x 8 accumulators stay in registers) */
#define PREFETCH 2048 /* bytes ahead of each block's stream to prefetch: over 113 MB of weights, 2.1 -> 1.5 ms for one
                         row and 3.8 -> 2.3 ms for eight (the hardware prefetcher alone lags behind two streams) */

int64_t tc_int8_packed_size(int64_t n, int64_t k) {
    return ((n + PAIR - 1) / PAIR) * PAIR * ((k + 3) / 4) * 4;
}

/* Fill packed (tc_int8_packed_size(n, k) bytes) from w: int8 [n, k] with row stride ldw. */
void tc_int8_pack(int64_t n, int64_t k, const int8_t *w, int64_t ldw, int8_t *packed) {
    int64_t groups = (k + 3) / 4, blocks = ((n + PAIR - 1) / PAIR) * (PAIR / LANES);
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t g = 0; g < groups; g++)
            for (int64_t c = 0; c < LANES; c++)
                for (int64_t e = 0; e < 4; e++) {
                    int64_t j = b * LANES + c, p = 4 * g + e;
                    packed[((b * groups + g) * LANES + c) * 4 + e] = j < n && p < k ? w[j * ldw + p] : 0;
                }
}

/* Each row of x scaled so that its absolute maximum is 127, rounded half to even (what torch's round_ does), stored
 * plus 128 as unsigned bytes (VNNI multiplies unsigned by signed bytes), rows k4 bytes apart (padding: 128, which
 * meets zero weights). amax gets each row's maximum, clamped to 1e-12 as torch's clamp_min_ does. */
TARGET static void quantize_rows(int64_t m, int64_t k, int64_t k4, const float *x, int64_t ldx, uint8_t *xq,
                                 float *amax) {
    const __m512 most = _mm512_set1_ps(127.0f);
    const __m512i bias = _mm512_set1_epi32(128);
    for (int64_t i = 0; i < m; i++) {
        const float *row = x + i * ldx;
        __m512 top = _mm512_setzero_ps();
        for (int64_t p = 0; p < k; p += 16)
            top = _mm512_max_ps(top, _mm512_abs_ps(_mm512_maskz_loadu_ps(float_mask(k - p), row + p)));
        float a = _mm512_reduce_max_ps(top);
        a = a > 1e-12f ? a : 1e-12f;
        amax[i] = a;
        const __m512 divisor = _mm512_set1_ps(a);
        uint8_t *dst = xq + i * k4;
        for (int64_t p = 0; p < k; p += 16) {
            __mmask16 mk = float_mask(k - p);
            __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(mk, row + p), divisor);
            v = _mm512_roundscale_ps(_mm512_mul_ps(v, most), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            /* |v| <= 127; NaN (a broken activation) converts to INT_MIN, whose low byte plus 128 is 128: zero */
            __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(v), bias);
            _mm512_mask_cvtepi32_storeu_epi8(dst + p, mk, q);
        }
        for (int64_t p = k; p < k4; p++) dst[p] = 128;
    }
}

/* One pair of blocks (channels j0 .. j0 + 31) for R activation rows: the exact sums of q(x) . w, as int32 lanes. R is
 * a constant in each instance, so the accumulators stay in registers. */
#define PAIR_ROWS(R)                                                                                                 \
    TARGET static void pair_##R(int64_t groups, const int8_t *b0, const int8_t *b1, const uint8_t *xr, int64_t k4, \
                                __m512i sums[MAX_ROWS][2]) {                                                         \
        __m512i lo[R], hi[R];                                                                                        \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm512_setzero_si512();                 \
        for (int64_t g = 0; g < groups; g++) {                                                                       \
            _mm_prefetch((const char *)(b0 + g * 64 + PREFETCH), _MM_HINT_T0);                                     \
            _mm_prefetch((const char *)(b1 + g * 64 + PREFETCH), _MM_HINT_T0);                                     \
            __m512i w0 = _mm512_loadu_si512(b0 + g * 64), w1 = _mm512_loadu_si512(b1 + g * 64);                     \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                                    \
                int32_t four;                                                                                        \
                memcpy(&four, xr + r * k4 + 4 * g, 4);                                                               \
                __m512i xv = _mm512_set1_epi32(four);                                                                \
                lo[r] = _mm512_dpbusd_epi32(lo[r], xv, w0);                                                          \
                hi[r] = _mm512_dpbusd_epi32(hi[r], xv, w1);                                                          \
            }                                                                                                        \
        }                                                                                                            \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) sums[r][0] = lo[r], sums[r][1] = hi[r];                 \
    }
PAIR_ROWS(1)
PAIR_ROWS(2)
PAIR_ROWS(3)
PAIR_ROWS(4)
PAIR_ROWS(5)
PAIR_ROWS(6)
PAIR_ROWS(7)
PAIR_ROWS(8)

typedef void (*pair_fn)(int64_t, const int8_t *, const int8_t *, const uint8_t *, int64_t, __m512i[MAX_ROWS][2]);

/* out[i, j] = ((float)(sum_p q(x)[i, p] * w[j, p]) * amax[i]) * step[j] (+ bias[j]) for i < m, j < n: the
 * arithmetic of chat.models.hf.fast_paths.int8_linear. packed: tc_int8_pack of w; wsum[j] = sum_p w[j, p] (the
 * correction for the +128 bias of the bytes); x: float [m, k] with row stride ldx; out: [m, n] with row stride ldo.
 * Returns 0, or -1 if scratch memory could not be had. */
TARGET int tc_int8_linear(int64_t m, int64_t k, int64_t n, const float *x, int64_t ldx, const int8_t *packed,
                          const int32_t *wsum, const float *step, const float *bias, float *out, int64_t ldo) {
    static const pair_fn by_rows[MAX_ROWS] = {pair_1, pair_2, pair_3, pair_4, pair_5, pair_6, pair_7, pair_8};
    if (m <= 0 || n <= 0) return 0;
    int64_t groups = (k + 3) / 4, k4 = 4 * groups;
    uint8_t *xq = malloc((size_t)(m * (k4 > 0 ? k4 : 4)));
    float *amax = malloc((size_t)m * sizeof(float));
    if (!xq || !amax) {
        free(xq);
        free(amax);
        return -1;
    }
    quantize_rows(m, k, k4, x, ldx, xq, amax);
    int64_t pairs = (n + PAIR - 1) / PAIR;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < pairs; t++) {
        const int8_t *b0 = packed + (2 * t) * groups * 64, *b1 = b0 + groups * 64;
        for (int64_t i0 = 0; i0 < m; i0 += MAX_ROWS) {
            int rows = m - i0 < MAX_ROWS ? (int)(m - i0) : MAX_ROWS;
            __m512i sums[MAX_ROWS][2];
            by_rows[rows - 1](groups, b0, b1, xq + i0 * k4, k4, sums);
            for (int h = 0; h < 2; h++) {
                int64_t j = t * PAIR + h * LANES;
                if (j >= n) break;
                __mmask16 live = n - j >= LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1u);
                __m512i correction = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(live, wsum + j), 7); /* 128 sum w */
                __m512 scale = _mm512_maskz_loadu_ps(live, step + j);
                __m512 shift = bias ? _mm512_maskz_loadu_ps(live, bias + j) : _mm512_setzero_ps();
                for (int r = 0; r < rows; r++) {
                    __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(sums[r][h], correction));
                    v = _mm512_mul_ps(v, _mm512_set1_ps(amax[i0 + r]));
                    v = _mm512_mul_ps(v, scale);
                    if (bias) v = _mm512_add_ps(v, shift);
                    _mm512_mask_storeu_ps(out + (i0 + r) * ldo + j, live, v);
                }
            }
        }
    }
    free(xq);
    free(amax);
    return 0;
}

/* ------------------------------------------------------------------ attention */

#define V_CHUNKS 4   /* output vectors (of 16 floats) accumulated per pass over the V rows */
#define QUERY_TILE 4 /* query heads accumulated per pass over the V rows */

/* exp(x) for x <= 0 (scores minus their maximum): Cody-Waite reduction and a degree-6 polynomial (cephes' expf),
 * within 2 ulp; 0 below -87.3. */
TARGET static inline __m512 exp_nonpositive(__m512 x) {
    __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_GE_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}

/* Up to 16 K/V elements from element index i of a row (float32, or float16 when half), as float32. Half is a constant
 * at every call site once attend is inlined into its two instances. */
#define INLINE static inline __attribute__((always_inline))

TARGET INLINE __m512 kv_load(const void *row, int64_t i, __mmask16 mk, int half) {
    if (half) { /* a masked 32-lane load of which the low 16 lanes are used: no lane outside the mask is read */
        __m512i h = _mm512_maskz_loadu_epi16((__mmask32)mk, (const uint16_t *)row + i);
        return _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    }
    return _mm512_maskz_loadu_ps(mk, (const float *)row + i);
}

/* Copy n floats into a K/V row: as they are, or rounded to float16 (nearest even, as torch's conversion rounds). */
TARGET static void kv_store(void *row, const float *x, int64_t n, int half) {
    if (!half) {
        memcpy(row, x, (size_t)n * sizeof(float));
        return;
    }
    for (int64_t p = 0; p < n; p += 16) {
        __mmask16 mk = float_mask(n - p);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(mk, x + p), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm512_mask_storeu_epi16((uint16_t *)row + p, (__mmask32)mk, _mm512_castsi256_si512(h));
    }
}

TARGET INLINE float dot(const float *a, const void *b, int64_t d, int half) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t p = 0; p < d; p += 16) {
        __mmask16 mk = float_mask(d - p);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, a + p), kv_load(b, p, mk, half), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* The sums of the 16 vectors, as one vector (lane i: the sum of v[i]), in a fixed order of additions. */
TARGET static inline __m512 sum16(__m512 v[16]) {
    __m512 pairs[8], quads[4];
    for (int i = 0; i < 8; i++) /* per 128-bit lane: [a0 + a2, b0 + b2, a1 + a3, b1 + b3] */
        pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                                 _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) /* per 128-bit lane: [a, b, c, d] summed over the lane */
        quads[i] = _mm512_add_ps(_mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 low = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 high = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(low, high, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The dot products of a (d floats) with 16 rows (row i at element i * stride of rows), as one vector. */
TARGET INLINE __m512 dot16(const float *a, const void *rows, int64_t stride, int64_t d, int half) {
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t p = 0; p < d; p += 16) {
        __mmask16 mk = float_mask(d - p);
        __m512 av = _mm512_maskz_loadu_ps(mk, a + p);
        for (int i = 0; i < 16; i++) acc[i] = _mm512_fmadd_ps(av, kv_load(rows, i * stride + p, mk, half), acc[i]);
    }
    return sum16(acc);
}

/* Softmax over scores[0..len) in place: exp(s - max) / sum. */
TARGET static void softmax(float *scores, int64_t len) {
    float top = -INFINITY;
    for (int64_t r = 0; r < len; r++) top = scores[r] > top ? scores[r] : top;
    __m512 shift = _mm512_set1_ps(top);
    __m512 total = _mm512_setzero_ps();
    for (int64_t r = 0; r < len; r += 16) {
        __mmask16 mk = float_mask(len - r);
        __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, scores + r), shift));
        e = _mm512_maskz_mov_ps(mk, e);
        _mm512_mask_storeu_ps(scores + r, mk, e);
        total = _mm512_add_ps(total, e);
    }
    __m512 inverse = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(total));
    for (int64_t r = 0; r < len; r += 16) {
        __mmask16 mk = float_mask(len - r);
        _mm512_mask_storeu_ps(scores + r, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, scores + r), inverse));
    }
}

/* One query token (group heads sharing K/V head h) over rows [lo, hi) of its sequence: the group's outputs. K and V
 * are float32 rows, or float16 when half (strides in elements). */
TARGET INLINE void attend(const float *qh, int64_t group, int64_t d, int64_t dv, const void *K, int64_t k_rows,
                          const void *V, int64_t v_rows, int64_t lo, int64_t hi, float softcap, float *scores, float *o,
                          int64_t o_heads, int half) {
    const int64_t size = half ? 2 : 4; /* bytes per element */
    const char *k_bytes = K, *v_bytes = V;
    int64_t len = hi - lo, r = 0;
    for (; r + 16 <= len; r += 16) { /* sixteen rows at a time: their scores come out as one vector */
        const char *rows16 = k_bytes + (lo + r) * k_rows * size;
        /* the rows come from memory (a step streams the weights through the caches between two visits): fetch the
         * next K rows, and the V rows for the weighted sum below */
        for (int64_t i = 0; i < 16; i++) {
            if (r + 16 + i < len)
                for (int64_t p = 0; p < d * size; p += 64)
                    _mm_prefetch(rows16 + (16 + i) * k_rows * size + p, _MM_HINT_T0);
            for (int64_t p = 0; p < dv * size; p += 64)
                _mm_prefetch(v_bytes + (lo + r + i) * v_rows * size + p, _MM_HINT_T0);
        }
        for (int64_t j = 0; j < group; j++)
            _mm512_storeu_ps(scores + j * len + r, dot16(qh + j * d, rows16, k_rows, d, half));
    }
    for (; r < len; r++) {
        const char *row = k_bytes + (lo + r) * k_rows * size;
        for (int64_t j = 0; j < group; j++) scores[j * len + r] = dot(qh + j * d, row, d, half);
    }
    for (int64_t j = 0; j < group; j++) {
        float *sj = scores + j * len;
        if (softcap > 0.0f)
            for (int64_t r = 0; r < len; r++) sj[r] = tanhf(sj[r] / softcap) * softcap;
        softmax(sj, len);
    }
    for (int64_t j0 = 0; j0 < group; j0 += QUERY_TILE) { /* up to QUERY_TILE heads share each V row they read */
        const float *sj[QUERY_TILE];
        for (int jj = 0; jj < QUERY_TILE; jj++) sj[jj] = scores + (j0 + jj < group ? j0 + jj : group - 1) * len;
        for (int64_t p0 = 0; p0 < dv; p0 += 16 * V_CHUNKS) { /* up to V_CHUNKS vectors of the output at once */
            __m512 acc[QUERY_TILE][V_CHUNKS];
            __mmask16 mk[V_CHUNKS];
            for (int c = 0; c < V_CHUNKS; c++) {
                mk[c] = p0 + 16 * c < dv ? float_mask(dv - p0 - 16 * c) : 0;
                for (int jj = 0; jj < QUERY_TILE; jj++) acc[jj][c] = _mm512_setzero_ps();
            }
            for (int64_t r = 0; r < len; r++) {
                const char *row = v_bytes + ((lo + r) * v_rows + p0) * size;
                __m512 values[V_CHUNKS];
                for (int c = 0; c < V_CHUNKS; c++) values[c] = kv_load(row, 16 * c, mk[c], half);
                for (int jj = 0; jj < QUERY_TILE; jj++) {
                    __m512 weight = _mm512_set1_ps(sj[jj][r]);
                    for (int c = 0; c < V_CHUNKS; c++) acc[jj][c] = _mm512_fmadd_ps(weight, values[c], acc[jj][c]);
                }
            }
            for (int jj = 0; jj < QUERY_TILE && j0 + jj < group; jj++)
                for (int c = 0; c < V_CHUNKS; c++)
                    _mm512_mask_storeu_ps(o + (j0 + jj) * o_heads + p0 + 16 * c, mk[c], acc[jj][c]);
        }
    }
}

/* Attention of the query tokens of n sequences, each over its own K/V rows, described by table[0 .. n) (see
 * tc_attention_row; chat/models/kernels/native.py checks every row before it comes here). Sequence s has e->queries query
 * tokens, tokens e->first .. e->first + e->queries - 1 of q ([tokens, heads, d], already multiplied by the attention
 * scale) and of out ([tokens, heads, dv]), both contiguous; heads = kv_heads * group, query head h reading K/V head
 * h / group. Its queries are its last e->queries positions: the i-th sees the rows up to its own, rows - queries + i,
 * and if window > 0 only the window rows ending there; a lone query token sees all its rows (a sliding layer hands a
 * decode step only its window). If e->new_key is not 0 (a one-token sequence), head j of its new key (d floats at
 * new_key + j * new_k_heads) is first copied into its last row (rounded to float16, nearest even, if half), and
 * likewise its new value. softcap <= 0: none. Returns 0, or -1 if scratch memory could not be had.
 */
TARGET int tc_attention(int64_t n, int64_t kv_heads, int64_t group, int64_t d, int64_t dv, const float *q,
                        const tc_attention_row *table, int64_t window, float softcap, float *out, int64_t new_k_heads,
                        int64_t new_v_heads) {
    int64_t heads = kv_heads * group, longest = 1, tasks = 0; /* tasks: one per query token and K/V head */
    for (int64_t s = 0; s < n; s++) {
        const tc_attention_row *e = table + s;
        longest = e->rows > longest ? e->rows : longest;
        tasks += e->queries * kv_heads;
        if (e->new_key) /* before any task reads the rows: a one-token sequence's task is its only reader */
            for (int64_t h = 0; h < kv_heads; h++) {
                int64_t size = e->half ? 2 : 4;
                char *K = (char *)(intptr_t)e->keys + (h * e->key_head_stride + (e->rows - 1) * e->key_row_stride) * size;
                char *V =
                    (char *)(intptr_t)e->values + (h * e->value_head_stride + (e->rows - 1) * e->value_row_stride) * size;
                kv_store(K, (const float *)(intptr_t)e->new_key + h * new_k_heads, d, (int)e->half);
                kv_store(V, (const float *)(intptr_t)e->new_value + h * new_v_heads, dv, (int)e->half);
            }
    }
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *scores = malloc((size_t)(group * longest) * sizeof(float));
        if (!scores) failed = 1;
        int64_t s = 0, before = 0; /* the sequence of the current task, and the tasks of the sequences before it */
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; task++) {
            if (!scores) continue;
            if (task < before) s = 0, before = 0; /* tasks come in increasing order within a thread */
            while (task >= before + table[s].queries * kv_heads) {
                before += table[s].queries * kv_heads;
                s++;
            }
            const tc_attention_row *e = table + s;
            int64_t local = task - before, i = local / kv_heads, h = local % kv_heads;
            int64_t own = e->rows - e->queries + i;
            int64_t lo = window > 0 && e->queries > 1 && own + 1 > window ? own + 1 - window : 0;
            int64_t token = e->first + i, size = e->half ? 2 : 4;
            const float *qh = q + (token * heads + h * group) * d;
            float *o = out + (token * heads + h * group) * dv;
            const char *K = (const char *)(intptr_t)e->keys + h * e->key_head_stride * size;
            const char *V = (const char *)(intptr_t)e->values + h * e->value_head_stride * size;
            if (e->half) /* two instances of attend, each with its element type fixed */
                attend(qh, group, d, dv, K, e->key_row_stride, V, e->value_row_stride, lo, own + 1, softcap, scores, o,
                       dv, 1);
            else
                attend(qh, group, d, dv, K, e->key_row_stride, V, e->value_row_stride, lo, own + 1, softcap, scores, o,
                       dv, 0);
        }
        free(scores);
    }
    return failed ? -1 : 0;
}
