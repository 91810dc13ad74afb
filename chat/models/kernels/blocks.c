/* turncache's kernels for weights kept in a GGUF file's own block formats (chat/models/kernels/block_matrices.py packs them;
 * read its docstring first). Built and loaded like native.c, as a library of its own.
 *
 * Every quantized type (Q4_0 ... Q8_0, Q2_K ... Q6_K, IQ4_NL, IQ4_XS) is repacked at load into one layout:
 * unsigned quants u (4 or 8 bits) with one float32 scale s and offset o per output channel and sub-block of 16 or 32
 * inputs, the weight being w = s * u + o, exactly the value the file's own dequantization gives (one rounding, an
 * FMA; see the Python docstring for why it is exact and how each type maps). The offset is either stored or
 * -bias * s for a fixed bias (Q4_0: 8, Q8_0 / Q5_0 / IQ4: 128, Q6_K: 32, Q3_K: 4). F16 and BF16 tensors have a
 * layout and a weight-only kernel of their own (tc_blocks_half_linear, at the end).
 *
 * Layout: output channels in blocks of 16 (the lanes of a vector); for each block, its tiles of 32 inputs in order.
 * A tile holds the quants, then ns (= 32 / sub) vectors of 16 scales, then (if stored) ns vectors of 16 offsets:
 *   4 bits: 4 groups g of 64 bytes, byte [g][c][e] = u[c][8g + e] | u[c][8g + 4 + e] << 4
 *   8 bits: 8 groups g of 64 bytes, byte [g][c][e] = u[c][4g + e]
 * so that one 64-byte load gives, for each channel lane, 4 consecutive inputs (what a VNNI step takes).
 *
 * tc_blocks_linear computes y = x . W^T (+ bias) in one of three ways (mode):
 *   mode 0  weight-only: each weight expanded to float32 in registers (w = fma(s, u, o)) and multiplied with the
 *           float32 activations; the weights are the file's, exactly.
 *   mode 1  activations quantized per row and 32-block to int8 (scale max|x| / 127, rounded to nearest even),
 *           integer dot products with VNNI (u8 x s8) per sub-block, then scaled: llama.cpp's design.
 *   mode 2  the same with int16 activations (scale max|x| / 32767) and 16-bit VNNI dot products (vpdpwssd): the
 *           activations' rounding 256 times finer than mode 1's, at twice its integer work.
 *           (Q16_ROWS: one kernel per quant width, sub-block and number of rows, activations laid out per tile)
 * Each output element is computed by one thread in a fixed order whatever the number of rows or threads, so a row's
 * result in a batch equals its result alone. Compiled without FMA contraction, like native.c.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define MAX_ROWS 8    /* activation rows per pass over a block's tiles (their accumulators stay in registers) */
#define F32_ROWS_MAX 4 /* the same for the weight-only design (three accumulators a row) */
#define F32_MAX_ROWS 4 /* the same for the weight-only design (three accumulators a row) */
#define PREFETCH 2048 /* bytes ahead of a block's stream to prefetch (1024 -> 2048: gguf-q16 ~3% faster, cold) */

int tc_blocks_abi_version(void) { return 3; }

int tc_blocks_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
}

/* Bytes of one tile (16 channels x 32 inputs). */
int64_t tc_blocks_tile_bytes(int bits, int ns, int off) { return (int64_t)bits * 64 + (int64_t)ns * 64 * (1 + off); }

/* The scales and offsets of a tile's ns sub-blocks (with ns = 1 the second pair repeats the first). */
TARGET static inline void tile_scales(const uint8_t *t, int quant_bytes, int ns, int off, float bias_value, __m512 s[2],
                                      __m512 o[2]) {
    const float *sc = (const float *)(t + quant_bytes);
    for (int h = 0; h < 2; h++) {
        int at = ns == 2 ? h : 0;
        s[h] = _mm512_loadu_ps(sc + 16 * at);
        o[h] = off ? _mm512_loadu_ps(sc + 16 * (ns + at)) : _mm512_mul_ps(s[h], _mm512_set1_ps(-bias_value));
    }
}

/* Byte e of each 32-bit lane, zero-extended (the shuffle indexes bytes within each 128-bit lane). */
TARGET static inline __m512i lane_byte(__m512i v, int e) {
    const __m512i dword = _mm512_set_epi32(12, 8, 4, 0, 12, 8, 4, 0, 12, 8, 4, 0, 12, 8, 4, 0);
    return _mm512_shuffle_epi8(v, _mm512_add_epi32(dword, _mm512_set1_epi32((int)(0x80808000u | (unsigned)e))));
}

/* ------------------------------------------------------------------ weight-only (float32 products) */

/* Per sub-block h of a tile: a += s * (p0 + p1) + o * xsum, where p0 and p1 are the float32 dot products of the
 * activations with the quants u (two independent chains: the low and high nibbles, or even and odd groups) and xsum
 * the activations' sum over the sub-block (xs[r * nj * ns + j * ns + h], summed in a fixed order by sum_blocks):
 * the exact weights s * u + o, applied per sub-block. */
#define F32_ROWS(BITS, R)                                                                                            \
    TARGET static void f32_##BITS##_##R(int64_t nj, const uint8_t *blk, int64_t tile, int ns, int off, float bv,     \
                                        const float *x, int64_t ldx, const float *xs, __m512 acc[MAX_ROWS]) {       \
        __m512 a[R];                                                                                                 \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) a[r] = _mm512_setzero_ps();                             \
        const __m512i nibble = _mm512_set1_epi8(0x0F);                                                              \
        for (int64_t j = 0; j < nj; j++) {                                                                           \
            const uint8_t *t = blk + j * tile;                                                                       \
            for (int64_t p = 0; p < tile; p += 64) _mm_prefetch((const char *)(t + PREFETCH + p), _MM_HINT_T0);      \
            __m512 s[2], o[2];                                                                                       \
            tile_scales(t, BITS * 64, ns, off, bv, s, o);                                                            \
            const float *xj = x + 32 * j;                                                                            \
            for (int h = 0; h < ns; h++) {                                                                           \
                __m512 p0[R], p1[R];                                                                                 \
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) p0[r] = p1[r] = _mm512_setzero_ps();            \
                if (BITS == 4) {                                                                                     \
                    _Pragma("GCC unroll 4") for (int g = h * 4 / ns; g < (h + 1) * 4 / ns; g++) {                    \
                        __m512i v = _mm512_loadu_si512(t + 64 * g);                                                  \
                        __m512i lo = _mm512_and_si512(v, nibble);                                                    \
                        __m512i hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), nibble);                              \
                        _Pragma("GCC unroll 4") for (int e = 0; e < 4; e++) {                                        \
                            __m512 wl = _mm512_cvtepi32_ps(lane_byte(lo, e));                                        \
                            __m512 wh = _mm512_cvtepi32_ps(lane_byte(hi, e));                                        \
                            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                    \
                                p0[r] = _mm512_fmadd_ps(_mm512_set1_ps(xj[r * ldx + 8 * g + e]), wl, p0[r]);         \
                                p1[r] = _mm512_fmadd_ps(_mm512_set1_ps(xj[r * ldx + 8 * g + 4 + e]), wh, p1[r]);     \
                            }                                                                                        \
                        }                                                                                            \
                    }                                                                                                \
                } else {                                                                                             \
                    _Pragma("GCC unroll 8") for (int g = h * 8 / ns; g < (h + 1) * 8 / ns; g += 2) {                 \
                        __m512i v0 = _mm512_loadu_si512(t + 64 * g), v1 = _mm512_loadu_si512(t + 64 * g + 64);       \
                        _Pragma("GCC unroll 4") for (int e = 0; e < 4; e++) {                                        \
                            __m512 w0 = _mm512_cvtepi32_ps(lane_byte(v0, e));                                        \
                            __m512 w1 = _mm512_cvtepi32_ps(lane_byte(v1, e));                                        \
                            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                    \
                                p0[r] = _mm512_fmadd_ps(_mm512_set1_ps(xj[r * ldx + 4 * g + e]), w0, p0[r]);         \
                                p1[r] = _mm512_fmadd_ps(_mm512_set1_ps(xj[r * ldx + 4 * g + 4 + e]), w1, p1[r]);     \
                            }                                                                                        \
                        }                                                                                            \
                    }                                                                                                \
                }                                                                                                    \
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                                \
                    a[r] = _mm512_fmadd_ps(s[h], _mm512_add_ps(p0[r], p1[r]), a[r]);                                 \
                    a[r] = _mm512_fmadd_ps(o[h], _mm512_set1_ps(xs[(r * nj + j) * ns + h]), a[r]);                   \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = a[r];                                          \
    }

/* ------------------------------------------------------------------ int8 activations (VNNI) */

/* xq: int8 activations, rows kq bytes apart; dx[r * nj + j]: row r's scale of input block j; xs[r * nj * ns + j * ns
 * + h]: dx times the sum of its quants over sub-block h of block j (what the offsets multiply). */
#define Q8_ROWS(BITS, R)                                                                                             \
    TARGET static void q8_##BITS##_##R(int64_t nj, const uint8_t *blk, int64_t tile, int ns, int off, float bv,      \
                                       const int8_t *xq, int64_t kq, const float *dx, const float *xs,              \
                                       __m512 acc[MAX_ROWS]) {                                                       \
        __m512 a[R];                                                                                                 \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) a[r] = _mm512_setzero_ps();                             \
        const __m512i nibble = _mm512_set1_epi8(0x0F);                                                              \
        for (int64_t j = 0; j < nj; j++) {                                                                           \
            const uint8_t *t = blk + j * tile;                                                                       \
            for (int64_t p = 0; p < tile; p += 64) _mm_prefetch((const char *)(t + PREFETCH + p), _MM_HINT_T0);      \
            __m512 s[2], o[2];                                                                                       \
            tile_scales(t, BITS * 64, ns, off, bv, s, o);                                                            \
            for (int h = 0; h < ns; h++) {                                                                           \
                __m512i sum[R], sum1[R]; /* two chains (exact integer sums: their order does not matter) */          \
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) sum[r] = sum1[r] = _mm512_setzero_si512();      \
                int groups = BITS / ns; /* groups of 64 bytes in this sub-block (a tile has BITS of them) */                               \
                for (int g = h * groups; g < (h + 1) * groups; g++) {                                                \
                    __m512i v = _mm512_loadu_si512(t + 64 * g);                                                      \
                    if (BITS == 4) {                                                                                 \
                        __m512i lo = _mm512_and_si512(v, nibble);                                                    \
                        __m512i hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), nibble);                              \
                        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                        \
                            int32_t x0, x1;                                                                          \
                            memcpy(&x0, xq + r * kq + 32 * j + 8 * g, 4);                                            \
                            memcpy(&x1, xq + r * kq + 32 * j + 8 * g + 4, 4);                                        \
                            sum[r] = _mm512_dpbusd_epi32(sum[r], lo, _mm512_set1_epi32(x0));                         \
                            sum1[r] = _mm512_dpbusd_epi32(sum1[r], hi, _mm512_set1_epi32(x1));                       \
                        }                                                                                            \
                    } else {                                                                                         \
                        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                        \
                            int32_t x0;                                                                              \
                            memcpy(&x0, xq + r * kq + 32 * j + 4 * g, 4);                                            \
                            if (g & 1)                                                                               \
                                sum1[r] = _mm512_dpbusd_epi32(sum1[r], v, _mm512_set1_epi32(x0));                    \
                            else                                                                                     \
                                sum[r] = _mm512_dpbusd_epi32(sum[r], v, _mm512_set1_epi32(x0));                      \
                        }                                                                                            \
                    }                                                                                                \
                }                                                                                                    \
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                                \
                    __m512 scale = _mm512_mul_ps(s[h], _mm512_set1_ps(dx[r * nj + j]));                              \
                    __m512i total = _mm512_add_epi32(sum[r], sum1[r]);                                               \
                    a[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), scale, a[r]);                                  \
                    a[r] = _mm512_fmadd_ps(o[h], _mm512_set1_ps(xs[(r * nj + j) * ns + h]), a[r]);                   \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = a[r];                                          \
    }

/* ------------------------------------------------------------------ int16 activations (VNNI, 16-bit) */

/* The activations quantized per row and 32-block to int16 (scale max|x| / 32767), stored in pair order (inputs
 * 0, 2, 1, 3 of every 4) so that a 32-bit broadcast meets the two 16-bit weights a lane holds after the split below,
 * and laid out per pass of R rows tile by tile: xt[(j * R + r) * 16 + i] is row r's i-th pair of input block j, so a
 * tile's activations of all R rows are 1 KiB at one place (broadcast from memory at fixed displacements, no pointer
 * per row); dx[j * R + r] and xs[(j * R + r) * NS + h] likewise. The weights' words come from one load per 64 bytes:
 *   4 bits: (v >> 0, 8, 4, 12) & 0x000F000F give the words (u0, u2), (u1, u3), (u4, u6), (u5, u7) of inputs 8g..
 *   8 bits: (v >> 0, 8) & 0x00FF00FF give (u0, u2), (u1, u3) of inputs 4g..
 * vpdpwssd sums both products of each word pair into the lane: exact integer sums, so their order does not matter;
 * with more than 4 rows one chain a row (the rows are the independent chains; no spills at 8 rows), with fewer two.
 * The float arithmetic after each sub-block is that of the other designs: a += total * (s * dx), a += o * xs. */
#define Q16_ROWS(BITS, NS, R)                                                                                        \
    TARGET static void q16_##BITS##_##NS##_##R(int64_t nj, const uint8_t *blk, int64_t tile, int off, float bv,      \
                                               const int32_t *xt, const float *dx, const float *xs,                 \
                                               __m512 acc[MAX_ROWS]) {                                               \
        enum { CHAINS = R <= 4 ? 2 : 1, GROUPS = BITS / NS }; /* groups of 64 bytes a sub-block */                  \
        __m512 a[R];                                                                                                 \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) a[r] = _mm512_setzero_ps();                             \
        const __m512i mask = _mm512_set1_epi32(BITS == 4 ? 0x000F000F : 0x00FF00FF);                                \
        for (int64_t j = 0; j < nj; j++) {                                                                           \
            const uint8_t *t = blk + j * tile;                                                                       \
            for (int64_t p = 0; p < tile; p += 64) _mm_prefetch((const char *)(t + PREFETCH + p), _MM_HINT_T0);      \
            __m512 s[2], o[2];                                                                                       \
            tile_scales(t, BITS * 64, NS, off, bv, s, o);                                                            \
            const int32_t *xj = xt + j * R * 16;                                                                     \
            _Pragma("GCC unroll 2") for (int h = 0; h < NS; h++) {                                                   \
                __m512i sum[R], sum1[R];                                                                             \
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) sum[r] = sum1[r] = _mm512_setzero_si512();      \
                _Pragma("GCC unroll 8") for (int g = h * GROUPS; g < (h + 1) * GROUPS; g++) {                        \
                    __m512i v = _mm512_loadu_si512(t + 64 * g);                                                      \
                    if (BITS == 4) {                                                                                 \
                        __m512i w0 = _mm512_and_si512(v, mask);                                                      \
                        __m512i w1 = _mm512_and_si512(_mm512_srli_epi32(v, 8), mask);                                \
                        __m512i w2 = _mm512_and_si512(_mm512_srli_epi32(v, 4), mask);                                \
                        __m512i w3 = _mm512_and_si512(_mm512_srli_epi32(v, 12), mask);                               \
                        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                        \
                            const int32_t *xr = xj + r * 16 + 4 * g;                                                 \
                            sum[r] = _mm512_dpwssd_epi32(sum[r], w0, _mm512_set1_epi32(xr[0]));                      \
                            sum[r] = _mm512_dpwssd_epi32(sum[r], w1, _mm512_set1_epi32(xr[1]));                      \
                            if (CHAINS == 2) {                                                                       \
                                sum1[r] = _mm512_dpwssd_epi32(sum1[r], w2, _mm512_set1_epi32(xr[2]));                \
                                sum1[r] = _mm512_dpwssd_epi32(sum1[r], w3, _mm512_set1_epi32(xr[3]));                \
                            } else {                                                                                 \
                                sum[r] = _mm512_dpwssd_epi32(sum[r], w2, _mm512_set1_epi32(xr[2]));                  \
                                sum[r] = _mm512_dpwssd_epi32(sum[r], w3, _mm512_set1_epi32(xr[3]));                  \
                            }                                                                                        \
                        }                                                                                            \
                    } else {                                                                                         \
                        __m512i w0 = _mm512_and_si512(v, mask);                                                      \
                        __m512i w1 = _mm512_and_si512(_mm512_srli_epi32(v, 8), mask);                                \
                        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                        \
                            const int32_t *xr = xj + r * 16 + 2 * g;                                                 \
                            if (CHAINS == 2 && (g & 1)) {                                                            \
                                sum1[r] = _mm512_dpwssd_epi32(sum1[r], w0, _mm512_set1_epi32(xr[0]));                \
                                sum1[r] = _mm512_dpwssd_epi32(sum1[r], w1, _mm512_set1_epi32(xr[1]));                \
                            } else {                                                                                 \
                                sum[r] = _mm512_dpwssd_epi32(sum[r], w0, _mm512_set1_epi32(xr[0]));                  \
                                sum[r] = _mm512_dpwssd_epi32(sum[r], w1, _mm512_set1_epi32(xr[1]));                  \
                            }                                                                                        \
                        }                                                                                            \
                    }                                                                                                \
                }                                                                                                    \
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                                \
                    __m512 scale = _mm512_mul_ps(s[h], _mm512_set1_ps(dx[j * R + r]));                               \
                    __m512i total = CHAINS == 2 ? _mm512_add_epi32(sum[r], sum1[r]) : sum[r];                        \
                    a[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), scale, a[r]);                                  \
                    a[r] = _mm512_fmadd_ps(o[h], _mm512_set1_ps(xs[(j * R + r) * NS + h]), a[r]);                    \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = a[r];                                          \
    }

#define INSTANCES(M) M(4, 1) M(4, 2) M(4, 3) M(4, 4) M(4, 5) M(4, 6) M(4, 7) M(4, 8) \
                     M(8, 1) M(8, 2) M(8, 3) M(8, 4) M(8, 5) M(8, 6) M(8, 7) M(8, 8)
F32_ROWS(4, 1) F32_ROWS(4, 2) F32_ROWS(4, 3) F32_ROWS(4, 4)
F32_ROWS(8, 1) F32_ROWS(8, 2) F32_ROWS(8, 3) F32_ROWS(8, 4)
INSTANCES(Q8_ROWS)
#define Q16_INSTANCES(BITS, NS)                                                                                      \
    Q16_ROWS(BITS, NS, 1) Q16_ROWS(BITS, NS, 2) Q16_ROWS(BITS, NS, 3) Q16_ROWS(BITS, NS, 4)                          \
    Q16_ROWS(BITS, NS, 5) Q16_ROWS(BITS, NS, 6) Q16_ROWS(BITS, NS, 7) Q16_ROWS(BITS, NS, 8)
Q16_INSTANCES(4, 1) Q16_INSTANCES(4, 2) Q16_INSTANCES(8, 1) Q16_INSTANCES(8, 2)

typedef void (*f32_fn)(int64_t, const uint8_t *, int64_t, int, int, float, const float *, int64_t, const float *,
                       __m512[MAX_ROWS]);
typedef void (*q8_fn)(int64_t, const uint8_t *, int64_t, int, int, float, const int8_t *, int64_t, const float *,
                      const float *, __m512[MAX_ROWS]);
static const f32_fn F32[2][F32_MAX_ROWS] = {{f32_4_1, f32_4_2, f32_4_3, f32_4_4}, {f32_8_1, f32_8_2, f32_8_3, f32_8_4}};
typedef void (*q16_fn)(int64_t, const uint8_t *, int64_t, int, float, const int32_t *, const float *, const float *,
                       __m512[MAX_ROWS]);
#define Q16_BY_ROWS(BITS, NS)                                                                                        \
    {q16_##BITS##_##NS##_1, q16_##BITS##_##NS##_2, q16_##BITS##_##NS##_3, q16_##BITS##_##NS##_4,                    \
     q16_##BITS##_##NS##_5, q16_##BITS##_##NS##_6, q16_##BITS##_##NS##_7, q16_##BITS##_##NS##_8}
static const q16_fn Q16[2][2][MAX_ROWS] = {{Q16_BY_ROWS(4, 1), Q16_BY_ROWS(4, 2)},
                                           {Q16_BY_ROWS(8, 1), Q16_BY_ROWS(8, 2)}};
static const q8_fn Q8[2][MAX_ROWS] = {{q8_4_1, q8_4_2, q8_4_3, q8_4_4, q8_4_5, q8_4_6, q8_4_7, q8_4_8},
                                      {q8_8_1, q8_8_2, q8_8_3, q8_8_4, q8_8_5, q8_8_6, q8_8_7, q8_8_8}};

/* Row i of x in 32-blocks: dx = max|x| / 127 (0 for a block of zeros), q = x / dx rounded to nearest even, and
 * xs = dx * (sum of q over each sub-block of sub inputs). */
TARGET static void quantize_blocks(int64_t k, const float *row, int ns, int8_t *q, float *dx, float *xs) {
    for (int64_t j = 0; j < k / 32; j++) {
        __m512 v0 = _mm512_loadu_ps(row + 32 * j), v1 = _mm512_loadu_ps(row + 32 * j + 16);
        float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float d = top / 127.0f;
        __m512i q0 = _mm512_setzero_si512(), q1 = _mm512_setzero_si512();
        if (d > 0.0f) {
            __m512 dv = _mm512_set1_ps(d);
            const int round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            q0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_div_ps(v0, dv), round));
            q1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_div_ps(v1, dv), round));
        }
        _mm512_mask_cvtepi32_storeu_epi8(q + 32 * j, 0xFFFF, q0);
        _mm512_mask_cvtepi32_storeu_epi8(q + 32 * j + 16, 0xFFFF, q1);
        dx[j] = d;
        if (ns == 1) {
            xs[j] = d * (float)(_mm512_reduce_add_epi32(q0) + _mm512_reduce_add_epi32(q1));
        } else {
            xs[2 * j] = d * (float)_mm512_reduce_add_epi32(q0);
            xs[2 * j + 1] = d * (float)_mm512_reduce_add_epi32(q1);
        }
    }
}

/* A row of x in 32-blocks, to int16: dx = max|x| / 32767 (0 for a block of zeros), q = x / dx rounded to nearest
 * even, stored in pair order (0, 2, 1, 3 of every 4 inputs), and xs = dx * (sum of q over each sub-block); block j's
 * quants at q + j * step (step >= 16 words of 32 bits), its dx at dx[j * step / 16] and its xs at
 * xs[j * step / 16 * ns] (the layout of a pass of step / 16 rows: see Q16_ROWS). */
TARGET static void quantize_blocks16(int64_t k, const float *row, int ns, int32_t *q, int64_t step, float *dx,
                                     float *xs) {
    const __m512i order = _mm512_set_epi32(15, 13, 14, 12, 11, 9, 10, 8, 7, 5, 6, 4, 3, 1, 2, 0);
    int64_t rows = step / 16;
    for (int64_t j = 0; j < k / 32; j++) {
        __m512 v0 = _mm512_loadu_ps(row + 32 * j), v1 = _mm512_loadu_ps(row + 32 * j + 16);
        float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float d = top / 32767.0f;
        __m512i q0 = _mm512_setzero_si512(), q1 = _mm512_setzero_si512();
        if (d > 0.0f) {
            __m512 dv = _mm512_set1_ps(d);
            const int round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            q0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_div_ps(v0, dv), round));
            q1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_div_ps(v1, dv), round));
        }
        int32_t *qj = q + j * step;
        _mm256_storeu_si256((__m256i *)qj, _mm512_cvtepi32_epi16(_mm512_permutexvar_epi32(order, q0)));
        _mm256_storeu_si256((__m256i *)(qj + 8), _mm512_cvtepi32_epi16(_mm512_permutexvar_epi32(order, q1)));
        dx[j * rows] = d;
        if (ns == 1) {
            xs[j * rows] = d * (float)(_mm512_reduce_add_epi32(q0) + _mm512_reduce_add_epi32(q1));
        } else {
            xs[2 * j * rows] = d * (float)_mm512_reduce_add_epi32(q0);
            xs[2 * j * rows + 1] = d * (float)_mm512_reduce_add_epi32(q1);
        }
    }
}

/* Row i of x: its sum over each sub-block of 32 / ns inputs, in a fixed order (what the offsets multiply). */
TARGET static void sum_blocks(int64_t k, const float *row, int ns, float *xs) {
    for (int64_t j = 0; j < k / 32; j++) {
        __m512 v0 = _mm512_loadu_ps(row + 32 * j), v1 = _mm512_loadu_ps(row + 32 * j + 16);
        if (ns == 1) {
            xs[j] = _mm512_reduce_add_ps(_mm512_add_ps(v0, v1));
        } else {
            xs[2 * j] = _mm512_reduce_add_ps(v0);
            xs[2 * j + 1] = _mm512_reduce_add_ps(v1);
        }
    }
}

/* out[i, c] = sum_p x[i, p] * w[c, p] (+ bias[c]) for i < m, c < n, over the packed weights (layout above: bits,
 * ns, off and bias_value describe them); mode picks the design. x: float [m, k] with row stride ldx, k a multiple of
 * 32; out: [m, n] with row stride ldo. Returns 0, or -1 if scratch memory could not be had. */
TARGET int tc_blocks_linear(int64_t m, int64_t k, int64_t n, const float *x, int64_t ldx, const uint8_t *packed,
                            int bits, int ns, int off, float bias_value, int mode, const float *bias, float *out,
                            int64_t ldo) {
    int q8 = mode == 1, q16 = mode == 2;
    if (m <= 0 || n <= 0) return 0;
    int64_t nj = k / 32, tile = tc_blocks_tile_bytes(bits, ns, off), blocks = (n + 15) / 16;
    int which = bits == 8, most = q8 || q16 ? MAX_ROWS : F32_MAX_ROWS;
    int8_t *xq = NULL;
    int32_t *xq16 = NULL; /* int16 pairs, laid out per pass of rows (Q16_ROWS) */
    float *dx = NULL, *xs = NULL;
    xs = malloc((size_t)(m * nj * ns) * sizeof(float));
    if (q8) xq = malloc((size_t)(m * k));
    if (q16) xq16 = malloc((size_t)(m * k) * sizeof(int16_t));
    if (q8 || q16) dx = malloc((size_t)(m * nj) * sizeof(float));
    if (!xs || (q8 && !xq) || (q16 && !xq16) || ((q8 || q16) && !dx)) {
        free(xq);
        free(xq16);
        free(dx);
        free(xs);
        return -1;
    }
    for (int64_t i = 0; i < m; i++) {
        if (q8)
            quantize_blocks(k, x + i * ldx, ns, xq + i * k, dx + i * nj, xs + i * nj * ns);
        else if (q16) { /* row r of the pass from row i0 (R rows): the layout of Q16_ROWS */
            int64_t i0 = i - i % MAX_ROWS, rows = m - i0 < MAX_ROWS ? m - i0 : MAX_ROWS, r = i - i0;
            quantize_blocks16(k, x + i * ldx, ns, xq16 + i0 * k / 2 + r * 16, rows * 16, dx + i0 * nj + r,
                              xs + (i0 * nj + r) * ns);
        }
        else
            sum_blocks(k, x + i * ldx, ns, xs + i * nj * ns);
    }
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *blk = packed + b * nj * tile;
        int64_t c0 = 16 * b;
        __mmask16 live = n - c0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - c0)) - 1u);
        __m512 shift = bias ? _mm512_maskz_loadu_ps(live, bias + c0) : _mm512_setzero_ps();
        for (int64_t i0 = 0; i0 < m; i0 += most) {
            int rows = m - i0 < most ? (int)(m - i0) : most;
            __m512 acc[MAX_ROWS];
            if (q8)
                Q8[which][rows - 1](nj, blk, tile, ns, off, bias_value, xq + i0 * k, k, dx + i0 * nj,
                                    xs + i0 * nj * ns, acc);
            else if (q16)
                Q16[which][ns == 2][rows - 1](nj, blk, tile, off, bias_value, xq16 + i0 * k / 2, dx + i0 * nj,
                                              xs + i0 * nj * ns, acc);
            else
                F32[which][rows - 1](nj, blk, tile, ns, off, bias_value, x + i0 * ldx, ldx, xs + i0 * nj * ns, acc);
            for (int r = 0; r < rows; r++) {
                __m512 v = bias ? _mm512_add_ps(acc[r], shift) : acc[r];
                _mm512_mask_storeu_ps(out + (i0 + r) * ldo + c0, live, v);
            }
        }
    }
    free(xq);
    free(xq16);
    free(dx);
    free(xs);
    return 0;
}

/* ------------------------------------------------------------------ 16-bit float weights (F16, BF16) */

/* Layout: output channels in blocks of 16 (the last padded with zeros), each block its k inputs in order, 16
 * channel values (32 bytes) per input. Weight-only: each value widened to float32 (exact) and multiplied with the
 * float32 activations, two chains per row (even and odd inputs) whatever the number of rows, so a row's result is
 * the same in any batch. */
#define HALF_ROWS(BF, R)                                                                                             \
    TARGET static void half_##BF##_##R(int64_t k, const uint16_t *blk, const float *x, int64_t ldx,                \
                                       __m512 acc[MAX_ROWS]) {                                                       \
        __m512 a0[R], a1[R];                                                                                         \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm512_setzero_ps();                    \
        int64_t p = 0;                                                                                               \
        for (; p + 2 <= k; p += 2) {                                                                                 \
            const uint16_t *w = blk + p * 16;                                                                        \
            _mm_prefetch((const char *)w + PREFETCH, _MM_HINT_T0);                                                   \
            __m256i h0 = _mm256_loadu_si256((const __m256i *)w), h1 = _mm256_loadu_si256((const __m256i *)(w + 16)); \
            __m512 w0, w1;                                                                                           \
            if (BF) {                                                                                                \
                w0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h0), 16));                          \
                w1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h1), 16));                          \
            } else {                                                                                                 \
                w0 = _mm512_cvtph_ps(h0);                                                                            \
                w1 = _mm512_cvtph_ps(h1);                                                                            \
            }                                                                                                        \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                                    \
                a0[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + p]), w0, a0[r]);                                  \
                a1[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + p + 1]), w1, a1[r]);                              \
            }                                                                                                        \
        }                                                                                                            \
        if (p < k) {                                                                                                 \
            __m256i h0 = _mm256_loadu_si256((const __m256i *)(blk + p * 16));                                        \
            __m512 w0 = BF ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h0), 16))                   \
                           : _mm512_cvtph_ps(h0);                                                                    \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                                      \
                a0[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + p]), w0, a0[r]);                                  \
        }                                                                                                            \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = _mm512_add_ps(a0[r], a1[r]);                   \
    }

#define HALF_INSTANCES(BF) HALF_ROWS(BF, 1) HALF_ROWS(BF, 2) HALF_ROWS(BF, 3) HALF_ROWS(BF, 4) \
                           HALF_ROWS(BF, 5) HALF_ROWS(BF, 6) HALF_ROWS(BF, 7) HALF_ROWS(BF, 8)
HALF_INSTANCES(0) HALF_INSTANCES(1)
typedef void (*half_fn)(int64_t, const uint16_t *, const float *, int64_t, __m512[MAX_ROWS]);
static const half_fn HALF[2][MAX_ROWS] = {{half_0_1, half_0_2, half_0_3, half_0_4, half_0_5, half_0_6, half_0_7, half_0_8},
                                          {half_1_1, half_1_2, half_1_3, half_1_4, half_1_5, half_1_6, half_1_7, half_1_8}};

/* out[i, c] = sum_p x[i, p] * w[c, p] (+ bias[c]) for the 16-bit float weights packed as above (bf16: BF16, else
 * F16); x: float [m, k] with row stride ldx; out: [m, n] with row stride ldo. Returns 0. */
TARGET int tc_blocks_half_linear(int64_t m, int64_t k, int64_t n, const float *x, int64_t ldx, const uint8_t *packed,
                                 int bf16, const float *bias, float *out, int64_t ldo) {
    if (m <= 0 || n <= 0) return 0;
    int64_t blocks = (n + 15) / 16;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const uint16_t *blk = (const uint16_t *)packed + b * k * 16;
        int64_t c0 = 16 * b;
        __mmask16 live = n - c0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - c0)) - 1u);
        __m512 shift = bias ? _mm512_maskz_loadu_ps(live, bias + c0) : _mm512_setzero_ps();
        for (int64_t i0 = 0; i0 < m; i0 += MAX_ROWS) {
            int rows = m - i0 < MAX_ROWS ? (int)(m - i0) : MAX_ROWS;
            __m512 acc[MAX_ROWS];
            HALF[bf16 != 0][rows - 1](k, blk, x + i0 * ldx, ldx, acc);
            for (int r = 0; r < rows; r++) {
                __m512 v = bias ? _mm512_add_ps(acc[r], shift) : acc[r];
                _mm512_mask_storeu_ps(out + (i0 + r) * ldo + c0, live, v);
            }
        }
    }
    return 0;
}
