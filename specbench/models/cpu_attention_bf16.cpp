// specbench::cache_attention's bf16 forms (`cpu_attention.cpp` checks the operands, picks the form, splits the work):
// AVX-512 BF16 (`vdpbf16ps` scores, float32 weights) and AMX (scores and the value product on tiles), a slice of up to
// 16 query rows sharing a key/value head at a time. A 5-row verify's attention on the embedded pair (640 columns, 2
// threads, hot) takes 28 us on AMX, 60 on AVX-512 BF16, 121 on AVX2; the AMX form made a compiled target verify step
// 10% shorter than bmm + softmax did (analysis/fast_path_verify_attention_cpu_amx/). Functions of their own (target
// attributes), in a file of their own.
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

void specbench_load_tiles(int count);  // cpu_bf16.cpp: tiles 0 .. count - 1 of 16 rows x 64 bytes

namespace {

// A slice as `cpu_attention.cpp` hands it over: n query rows' query [D], mask row [C] (none: null) and output [D]
// pointers, and their key/value head's keys and values (rows k_row / v_row elements apart).
template <typename M>
struct Slice {
  const c10::BFloat16* const* q;
  const M* const* mask;
  c10::BFloat16* const* out;
  const c10::BFloat16 *keys, *values;
  int64_t k_row, v_row, C, D, n;
  float scale;
};

#define SPECBENCH_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16")))
#define SPECBENCH_AMX __attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16,amx-tile,amx-bf16")))

// Lane n of the result: the sum of a[n]'s 16 lanes. Pairs, then quads within each 128-bit lane, then across lanes:
// ~3 instructions a column where `_mm512_reduce_add_ps` takes ~8.
SPECBENCH_AVX512 inline __m512 sum_each(const __m512 (&a)[16]) {
  __m512 pair[8], quad[4];
  for (int n = 0; n < 8; ++n)  // per 128-bit lane: a[2n], a[2n+1], a[2n], a[2n+1]
    pair[n] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * n], a[2 * n + 1]), _mm512_unpackhi_ps(a[2 * n], a[2 * n + 1]));
  for (int n = 0; n < 4; ++n) {  // per 128-bit lane: a[4n] .. a[4n + 3]
    const __m512d x = _mm512_castps_pd(pair[2 * n]), y = _mm512_castps_pd(pair[2 * n + 1]);
    quad[n] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 h0 = _mm512_add_ps(_mm512_shuffle_f32x4(quad[0], quad[1], 0x88), _mm512_shuffle_f32x4(quad[0], quad[1], 0xdd));
  const __m512 h1 = _mm512_add_ps(_mm512_shuffle_f32x4(quad[2], quad[3], 0x88), _mm512_shuffle_f32x4(quad[2], quad[3], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(h0, h1, 0x88), _mm512_shuffle_f32x4(h0, h1, 0xdd));
}

SPECBENCH_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
SPECBENCH_AVX512 inline __m512 load16(const c10::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// `exponentiate` 16 lanes a step for the AVX-512 forms; the same polynomial, 2^n applied by `vscalefps`.
SPECBENCH_AVX512 inline float exponentiate16(float* s, int64_t C) {
  __m512 top0 = _mm512_set1_ps(s[0]), top1 = top0;  // two chains: a max takes 4 cycles
  int64_t c = 0;
  for (; c + 32 <= C; c += 32)
    top0 = _mm512_max_ps(top0, _mm512_loadu_ps(s + c)), top1 = _mm512_max_ps(top1, _mm512_loadu_ps(s + c + 16));
  for (; c < C; c += 16) {
    const __mmask16 in = C - c >= 16 ? 0xffff : (1u << (C - c)) - 1;
    top0 = _mm512_mask_max_ps(top0, in, top0, _mm512_maskz_loadu_ps(in, s + c));
  }
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(_mm512_max_ps(top0, top1)));
  __m512 total = _mm512_setzero_ps();
  for (c = 0; c < C; c += 16) {
    const __mmask16 in = C - c >= 16 ? 0xffff : (1u << (C - c)) - 1;
    const __m512 x = _mm512_max_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(in, s + c), top), _mm512_set1_ps(-87.f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    for (const float k : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
      p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(k));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    const __m512 e = _mm512_scalef_ps(p, n);
    _mm512_mask_storeu_ps(s + c, in, e);
    total = _mm512_mask_add_ps(total, in, total, e);
  }
  return _mm512_reduce_add_ps(total);
}

// Scores of a slice's n query rows at every column, scaled and masked, into s[r C + c], on AVX-512 BF16: 16 columns at a time, each a `vdpbf16ps` chain (exact products, float32 sums) per
// 32 dims, summed by `sum_each`. A key row is read from cache once a query row. PAIRS = D / 32.
template <typename M, int PAIRS>
SPECBENCH_AVX512 void scores_dpbf16(const Slice<M>& o, float* s) {
  const int64_t k_row = o.k_row, v_row = o.v_row, C = o.C, n = o.n;
  const __m512 scale = _mm512_set1_ps(o.scale);
  int64_t c = 0;
  for (; c + 16 <= C; c += 16) {
    for (int64_t at = 0; at < 2 * o.D; at += 64)  // the cache comes from memory, behind a layer's weights
      for (int64_t m = 0; m < 16; ++m) {
        _mm_prefetch(reinterpret_cast<const char*>(o.keys + (c + 16 + m) * k_row) + at, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(o.values + (c + 16 + m) * v_row) + at, _MM_HINT_T1);
      }
    for (int64_t r = 0; r < n; ++r) {
      __m512bh qv[PAIRS];
      for (int p = 0; p < PAIRS; ++p) qv[p] = (__m512bh)_mm512_loadu_si512(o.q[r] + 32 * p);
      __m512 a[16];
      for (int m = 0; m < 16; ++m) {
        const c10::BFloat16* k = o.keys + (c + m) * k_row;
        a[m] = _mm512_dpbf16_ps(_mm512_setzero_ps(), qv[0], (__m512bh)_mm512_loadu_si512(k));
        for (int p = 1; p < PAIRS; ++p) a[m] = _mm512_dpbf16_ps(a[m], qv[p], (__m512bh)_mm512_loadu_si512(k + 32 * p));
      }
      __m512 scores = _mm512_mul_ps(sum_each(a), scale);
      if (o.mask[r]) scores = _mm512_add_ps(scores, load16(o.mask[r] + c));
      _mm512_storeu_ps(s + r * C + c, scores);
    }
  }
  for (; c < C; ++c)
    for (int64_t r = 0; r < n; ++r) {
      __m512 a = _mm512_setzero_ps();
      for (int p = 0; p < PAIRS; ++p)
        a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(o.q[r] + 32 * p),
                             (__m512bh)_mm512_loadu_si512(o.keys + c * k_row + 32 * p));
      s[r * C + c] = _mm512_reduce_add_ps(a) * o.scale + (o.mask[r] ? static_cast<float>(o.mask[r][c]) : 0.f);
    }
}

// `scores_dpbf16` on AMX: one `tdpbf16ps` per 16 columns and 32 dims scores every query row of the slice (n <= 16) at
// once, where the dpbf16 form runs a chain and a reduction per row. Tile 0 is the scores transposed, [16 columns][16
// query rows] in float32; tile 1 a block of 16 key rows, loaded from the cache in place; tiles 2.. the queries as
// the B operand, [16 dim pairs][16 query rows] of bf16 pairs (rows past n zero). Products exact, sums in float32,
// as the dpbf16 form's.
template <typename M, int PAIRS>
SPECBENCH_AMX void scores_amx(const Slice<M>& o, float* s) {
  const int64_t C = o.C, D = o.D, n = o.n;
  alignas(64) uint32_t queries[PAIRS][16][16] = {};  // [32 dims][dim pair][query row]: a query's dims two at a time
  for (int64_t r = 0; r < n; ++r) {
    const auto* q = reinterpret_cast<const uint32_t*>(o.q[r]);
    for (int p = 0; p < 16 * PAIRS; ++p) queries[p / 16][p % 16][r] = q[p];
  }
  alignas(64) float block[16 * 16];                       // tile 0 stored: column m's scores at 16 m
  alignas(64) c10::BFloat16 last[16 * 128];  // a last block of fewer than 16 columns (d <= 128), zero past them
  const __m512i across = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(16));
  const __m512 scale = _mm512_set1_ps(o.scale);
  specbench_load_tiles(2 + PAIRS);
  asm volatile("" ::: "memory");  // `queries` written before the tile loads read it: their asm names no memory
  _tile_loadd(2, queries[0], 64);
  if constexpr (PAIRS > 1) _tile_loadd(3, queries[1], 64);
  if constexpr (PAIRS > 2) _tile_loadd(4, queries[2], 64);
  if constexpr (PAIRS > 3) _tile_loadd(5, queries[3], 64);
  for (int64_t c = 0; c < C; c += 16) {
    const int64_t cols = std::min<int64_t>(16, C - c);
    const c10::BFloat16* keys = o.keys + c * o.k_row;
    int64_t stride = 2 * o.k_row;
    if (cols < 16) {
      for (int64_t m = 0; m < cols; ++m) std::copy(keys + m * o.k_row, keys + m * o.k_row + D, last + m * D);
      std::fill(last + cols * D, last + 16 * D, c10::BFloat16(0.f));
      keys = last, stride = 2 * D;
      asm volatile("" ::: "memory");
    }
    for (int64_t at = 0; at < 2 * D; at += 64)  // the next block, as the dpbf16 form fetches
      for (int64_t m = 0; m < 16; ++m) {
        _mm_prefetch(reinterpret_cast<const char*>(o.keys + (c + 16 + m) * o.k_row) + at, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(o.values + (c + 16 + m) * o.v_row) + at, _MM_HINT_T1);
      }
    _tile_zero(0);
    _tile_loadd(1, keys, stride);
    _tile_dpbf16ps(0, 1, 2);
    if constexpr (PAIRS > 1) {
      _tile_loadd(1, keys + 32, stride);
      _tile_dpbf16ps(0, 1, 3);
    }
    if constexpr (PAIRS > 2) {
      _tile_loadd(1, keys + 64, stride);
      _tile_dpbf16ps(0, 1, 4);
    }
    if constexpr (PAIRS > 3) {
      _tile_loadd(1, keys + 96, stride);
      _tile_dpbf16ps(0, 1, 5);
    }
    _tile_stored(0, block, 64);
    for (int64_t r = 0; r < n; ++r) {
      const M* mask = o.mask[r];
      const __m512 scores = _mm512_mul_ps(_mm512_i32gather_ps(across, block + r, 4), scale);
      if (cols == 16) {
        _mm512_storeu_ps(s + r * C + c, mask ? _mm512_add_ps(scores, load16(mask + c)) : scores);
      } else {
        alignas(64) float part[16];
        _mm512_store_ps(part, scores);
        for (int64_t m = 0; m < cols; ++m) s[r * C + c + m] = part[m] + (mask ? static_cast<float>(mask[c + m]) : 0.f);
      }
    }
  }
  _tile_release();
}

// The weighted values of a slice's n rows on AMX: out[r] = Σ_c p[r, c] v[c] · inv[r], p = s[r C + c] rounded to bf16
// (as eager's attention rounds its float32 softmax before the value product), products exact, sums in float32. Tiles
// 0-3: the sums, [16 rows][16 dims] in float32, 64 dims a pass; tile 4: the weights of 32 columns, [16 rows][32] (rows
// past n zero); tile 5: the B operand, [16 column pairs][16 dims, both columns' values]. `unpacklo/hi_epi16` pair two
// value rows 128 bits at a time, so a tile's 16 dims are {0-3, 8-11, 16-19, 24-27} or {4-7, 12-15, ...} of 32; the
// output puts them back in order.
template <typename M, int PAIRS>
SPECBENCH_AMX void values_amx(const Slice<M>& o, const float* s, const float* inv) {
  const int64_t C = o.C, n = o.n, v_row = o.v_row;
  const c10::BFloat16* values = o.values;
  alignas(64) c10::BFloat16 weights[16][32] = {};
  alignas(64) uint32_t paired[4][16][16];  // [32 dims' low / high half, twice][column pair][dim]
  alignas(64) float sums[4][16][16];        // tiles 0-3 stored
  const __m512i low = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);  // dims 0-15
  const __m512i high = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  specbench_load_tiles(6);
  for (int block = 0; block < PAIRS; block += 2) {  // 32 dims a block, two a pass
    const int blocks = std::min(2, PAIRS - block);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t c0 = 0; c0 < C; c0 += 32) {
      const int64_t cols = std::min<int64_t>(32, C - c0);
      for (int64_t r = 0; r < n; ++r) {
        const float* p = s + r * C + c0;
        if (cols == 32)
          _mm512_store_si512(weights[r], (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p)));
        else
          for (int64_t m = 0; m < 32; ++m) weights[r][m] = c10::BFloat16(m < cols ? p[m] : 0.f);
      }
      for (int64_t pair = 0; pair < 16; ++pair) {
        const int64_t c = c0 + 2 * pair;
        for (int h = 0; h < blocks; ++h) {
          const c10::BFloat16* v = values + c * v_row + 32 * (block + h);
          const __m512i x = c < C ? _mm512_loadu_si512(v) : _mm512_setzero_si512();
          const __m512i y = c + 1 < C ? _mm512_loadu_si512(v + v_row) : _mm512_setzero_si512();
          _mm512_store_si512(paired[2 * h][pair], _mm512_unpacklo_epi16(x, y));
          _mm512_store_si512(paired[2 * h + 1][pair], _mm512_unpackhi_epi16(x, y));
        }
      }
      asm volatile("" ::: "memory");  // the buffers written before the tile loads read them
      _tile_loadd(4, weights, 64);
      _tile_loadd(5, paired[0], 64);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(5, paired[1], 64);
      _tile_dpbf16ps(1, 4, 5);
      if (blocks == 2) {
        _tile_loadd(5, paired[2], 64);
        _tile_dpbf16ps(2, 4, 5);
        _tile_loadd(5, paired[3], 64);
        _tile_dpbf16ps(3, 4, 5);
      }
    }
    _tile_stored(0, sums[0], 64);
    _tile_stored(1, sums[1], 64);
    _tile_stored(2, sums[2], 64);
    _tile_stored(3, sums[3], 64);
    for (int64_t r = 0; r < n; ++r) {
      c10::BFloat16* out = o.out[r] + 32 * block;
      const __m512 scale = _mm512_set1_ps(inv[r]);
      for (int h = 0; h < blocks; ++h) {
        const __m512 x = _mm512_load_ps(sums[2 * h][r]), y = _mm512_load_ps(sums[2 * h + 1][r]);
        const __m512 first = _mm512_mul_ps(_mm512_permutex2var_ps(x, low, y), scale);
        const __m512 second = _mm512_mul_ps(_mm512_permutex2var_ps(x, high, y), scale);
        _mm512_storeu_si512(out + 32 * h, (__m512i)_mm512_cvtne2ps_pbh(second, first));  // nearest even, as torch's
      }
    }
  }
  _tile_release();
}

// A slice's rows on AVX-512 BF16, or AMX, together: every key and value row is read once for all of them, not once a
// row (a verify's R·K rows of a head: 15 for the embedded pair at γ = 4). On AVX-512, weighted values ROWS rows at a
// time, a value row converted once for them, the weights in float32. s [n (C + 1)] scratch.
template <typename M, int PAIRS, bool AMX>
SPECBENCH_AVX512 void rows(const Slice<M>& o, float* s) {
  constexpr int LANES = 2 * PAIRS, ROWS = LANES <= 4 ? 16 / LANES : 2;  // ROWS · LANES accumulators in registers
  const int64_t v_row = o.v_row, C = o.C, n = o.n;
  const c10::BFloat16* values = o.values;
  if constexpr (AMX)
    scores_amx<M, PAIRS>(o, s);
  else
    scores_dpbf16<M, PAIRS>(o, s);
  float* inv = s + n * C;  // [n], past the scores
  for (int64_t r = 0; r < n; ++r) inv[r] = 1.f / exponentiate16(s + r * C, C);
  if constexpr (AMX) {
    values_amx<M, PAIRS>(o, s, inv);
    return;
  }
  for (int64_t r0 = 0; r0 < n; r0 += ROWS) {
    const int64_t count = std::min<int64_t>(ROWS, n - r0);
    __m512 acc[ROWS][LANES];
    for (int r = 0; r < ROWS; ++r)
      for (int l = 0; l < LANES; ++l) acc[r][l] = _mm512_setzero_ps();
    for (int64_t c = 0; c < C; ++c) {
      __m512 v[LANES];
      for (int l = 0; l < LANES; ++l) v[l] = load16(values + c * v_row + 16 * l);
      for (int r = 0; r < ROWS; ++r) {
        if (r == count) break;
        const __m512 w = _mm512_set1_ps(s[(r0 + r) * C + c]);
        for (int l = 0; l < LANES; ++l) acc[r][l] = _mm512_fmadd_ps(w, v[l], acc[r][l]);
      }
    }
    for (int64_t r = 0; r < count; ++r) {
      c10::BFloat16* out = o.out[r0 + r];
      const __m512 scale_r = _mm512_set1_ps(inv[r0 + r]);
      for (int l = 0; l < LANES; ++l)  // round to nearest even, as torch's conversion does
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * l),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(acc[r][l], scale_r)));
    }
  }
}


template <typename M, bool AMX>
void dispatch(const Slice<M>& o, float* s) {
  constexpr void (*forms[])(const Slice<M>&, float*) = {rows<M, 1, AMX>, rows<M, 2, AMX>, rows<M, 3, AMX>,
                                                          rows<M, 4, AMX>};
  forms[o.D / 32 - 1](o, s);
}

}  // namespace

// One slice (n <= 16, D a multiple of 32 up to 128) on AMX or AVX-512 BF16; masks float32 or bf16; s [n (C + 1)].
void specbench_attention_bf16(int64_t n, const c10::BFloat16* const* q, const void* const* mask, bool mask_float,
                              c10::BFloat16* const* out, const c10::BFloat16* keys, int64_t k_row,
                              const c10::BFloat16* values, int64_t v_row, int64_t C, int64_t D, float scale, bool amx,
                              float* s) {
  if (mask_float) {
    const Slice<float> o{q, reinterpret_cast<const float* const*>(mask), out, keys, values, k_row, v_row, C, D, n, scale};
    amx ? dispatch<float, true>(o, s) : dispatch<float, false>(o, s);
  } else {
    const Slice<c10::BFloat16> o{q,      reinterpret_cast<const c10::BFloat16* const*>(mask), out, keys, values, k_row,
                                 v_row,  C, D, n, scale};
    amx ? dispatch<c10::BFloat16, true>(o, s) : dispatch<c10::BFloat16, false>(o, s);
  }
}
