// A few query rows a sequence against a KV cache, float32 or bf16 (read as float32, summed in float32): the attention of
// a CPU decode step (one row: a draft step, a plain decode step) and of a verify (γ + 1 rows). This file checks the
// operands, picks a form (`resolve`), splits the rows into slices of a key/value head's and runs the AVX2 + FMA form;
// the bf16 forms, AVX-512 BF16 and AMX, are `cpu_attention_bf16.cpp`'s. Compiled, inductor's fused reduction for one
// row took ~48 us a layer at 320 cached columns in float32 (2 threads, the embedded pair's 3 kv heads x 3 queries x
// 64) and ~40 in bf16 (analysis/fast_path_one_query_attention_bf16_cpu_amx/), and a verify's bmm + softmax 2.6 ms of
// a 5-row target step, 1.4 on AMX here (analysis/fast_path_verify_attention_cpu_amx/). The AVX2 form takes a slice's
// rows together: ~17% shorter than one row at a time at 5 rows, ~22% at 7 (analysis/attention_avx2_rows_cpu_avx512/).
// Built into the same extension as `cpu_matvec.cpp` (`specbench.models.cpu_matvec.available`).
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>
#include <vector>

bool specbench_aten_allows_avx512();   // cpu_bf16.cpp: torch's kernel level is AVX-512 (ATEN_CPU_CAPABILITY)
bool specbench_cpu_has_avx512_bf16();  // cpu_bf16.cpp
bool specbench_amx_bf16();             // cpu_bf16.cpp
void specbench_attention_bf16(int64_t n, const c10::BFloat16* const* q, const void* const* mask, bool mask_float,
                              c10::BFloat16* const* out, const c10::BFloat16* keys, int64_t k_row,
                              const c10::BFloat16* values, int64_t v_row, int64_t C, int64_t D, float scale, bool amx,
                              float* s);  // cpu_attention_bf16.cpp

namespace {

constexpr int64_t MAX_HEAD_DIM = 128;  // a query's 16 registers of 8 floats
constexpr int64_t MAX_QUERY_ROWS = 16;  // past this (a prefill) a GEMM's reuse wins: callers take bmm
constexpr int64_t MAX_SLICE = 16;  // query rows a task at most: an AMX tile's
constexpr int64_t PREFETCH_COLUMNS = 16;  // how far ahead both forms fetch key and value rows (32 did no better)
enum Isa : int64_t { AUTO = 0, AVX2 = 1, AVX512_BF16 = 2, AMX_BF16 = 3 };  // the op's `isa` argument

// The form an `isa` runs: AUTO takes the best this CPU and torch's kernel level (ATEN_CPU_CAPABILITY) allow for the
// operands, AMX over AVX-512 BF16 over AVX2; the bf16 forms take bf16 with d a multiple of 32.
Isa resolve(int64_t isa, bool bf16, int64_t D) {
  TORCH_CHECK(isa >= AUTO && isa <= AMX_BF16, "specbench::cache_attention: isa ", isa,
              " is not one of 0 (auto), 1 (avx2), 2 (avx512_bf16), 3 (amx_bf16)");
  const bool wide = bf16 && D % 32 == 0;
  if (isa == AUTO) {
    if (!wide || !specbench_aten_allows_avx512() || !specbench_cpu_has_avx512_bf16()) return AVX2;
    return specbench_amx_bf16() ? AMX_BF16 : AVX512_BF16;
  }
  if (isa != AVX2) {
    TORCH_CHECK(wide, "specbench::cache_attention: isa ", isa, " takes bf16 with a head dim a multiple of 32");
    TORCH_CHECK(specbench_cpu_has_avx512_bf16() && (isa == AVX512_BF16 || specbench_amx_bf16()), "specbench::cache_attention: isa ",
                isa, " asked on a CPU without it");
  }
  return static_cast<Isa>(isa);
}


// Also in cpu_matvec.cpp: torch's JIT build decides to rebuild from the listed sources' contents only, so a shared
// header, once edited, would leave a stale extension in place.
inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(_mm_hadd_ps(s, s));
}

// e^x for x <= 0 (scores less their max): 2^n * p(r), Cephes' expf polynomial, relative error ~1e-7; below -87
// it returns e^-87 (~1e-38), which a softmax sum cannot tell from 0.
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // x - n ln 2, in two parts
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

// s[c] = e^(s[c] - max s) in place; returns their sum (a softmax's denominator).
inline float exponentiate(float* s, int64_t C) {
  __m256 top4[4] = {_mm256_set1_ps(s[0]), top4[0], top4[0], top4[0]};  // four chains: a max takes 4 cycles
  int64_t c = 0;
  for (; c + 32 <= C; c += 32)
    for (int i = 0; i < 4; ++i) top4[i] = _mm256_max_ps(top4[i], _mm256_loadu_ps(s + c + 8 * i));
  for (; c + 8 <= C; c += 8) top4[0] = _mm256_max_ps(top4[0], _mm256_loadu_ps(s + c));
  const __m256 m8 = _mm256_max_ps(_mm256_max_ps(top4[0], top4[1]), _mm256_max_ps(top4[2], top4[3]));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  float top = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
  for (; c < C; ++c) top = std::max(top, s[c]);
  const __m256 top8 = _mm256_set1_ps(top);
  __m256 total8 = _mm256_setzero_ps();
  for (c = 0; c + 8 <= C; c += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + c), top8));
    _mm256_storeu_ps(s + c, e);
    total8 = _mm256_add_ps(total8, e);
  }
  float total = horizontal_sum(total8);
  for (; c < C; ++c) total += (s[c] = std::exp(s[c] - top));
  return total;
}

// Eight (four) values as float32: bf16 is the top half of a float32's bits.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline __m128 load4(const float* p) { return _mm_loadu_ps(p); }
inline __m128 load4(const c10::BFloat16* p) {
  return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), 16));
}
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(c10::BFloat16* p, __m256 v) {  // round to nearest even, as torch's conversion does
  alignas(32) float f[8];
  _mm256_store_ps(f, v);
  for (int i = 0; i < 8; ++i) p[i] = c10::BFloat16(f[i]);
}

// One query row's pointers: its query [D], its head's keys and values (rows k_row / v_row apart), its mask row [C]
// (none: null), its output [D].
template <typename T, typename M>
struct Row {
  const T *q, *keys, *values;
  const M* mask;
  T* out;
};

// The checked operands as the kernels read them: T for q, key, value and out, M for the mask (none: null).
template <typename T, typename M>
struct Operands {
  const T *q, *key, *value;
  const M* mask;
  T* out;
  int64_t G, R, K, D, C;  // key/value heads, query heads a key/value head, query rows, head dim, columns
  const int64_t *k_stride, *v_stride;
  int64_t m_stride, m_row_stride;
  float scale;

  // Row j (of R·K, j = r·K + i) of key/value head g of sequence b: query row i of head g·R + r. q is contiguous
  // [B, H, K, D], so a group's rows are neighbours in it; out is [B, K, H, D].
  Row<T, M> row(int64_t b, int64_t g, int64_t j) const {
    const int64_t i = j % K, h = g * R + j / K;
    return {q + ((b * G + g) * R * K + j) * D, key + b * k_stride[0] + g * k_stride[1],
            value + b * v_stride[0] + g * v_stride[1], mask ? mask + b * m_stride + i * m_row_stride : nullptr,
            out + ((b * K + i) * G * R + h) * D};
  }
};

// AVX2 + FMA scores of P query rows (P = 1 or 2; q: their queries, pre-scaled, in float32) at every column, masked,
// into out[p] [C]: four columns a pass, one FMA chain a row and column over the head dim, one horizontal sum for the
// four. Each key vector is loaded and converted once for the P rows. `first`: the first pass over the keys, which
// fetches them (and the values) ahead from memory.
template <int P, typename T, typename M>
void scores_avx2(const Operands<T, M>& o, const T* keys, const T* values, const float* const* q, const M* const* mask,
                 float* const* out, bool first) {
  const int64_t vecs = o.D / 8, k_row = o.k_stride[2], v_row = o.v_stride[2], C = o.C;
  int64_t c = 0;
  for (; c + 4 <= C; c += 4) {
    const T* k0 = keys + c * k_row;
    if (first)
      for (int64_t i = 0; i < 4; ++i)  // the cache comes from memory, behind a layer's weights (32 did no better)
        for (int64_t at = 0; at < o.D * static_cast<int64_t>(sizeof(T)); at += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(k0 + (PREFETCH_COLUMNS + i) * k_row) + at, _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(values + (c + PREFETCH_COLUMNS + i) * v_row) + at, _MM_HINT_T1);
        }
    __m256 a[P][4];
    for (int p = 0; p < P; ++p) a[p][0] = a[p][1] = a[p][2] = a[p][3] = _mm256_setzero_ps();
    for (int64_t j = 0; j < vecs; ++j) {
      const __m256 k[4] = {load8(k0 + 8 * j), load8(k0 + k_row + 8 * j), load8(k0 + 2 * k_row + 8 * j),
                           load8(k0 + 3 * k_row + 8 * j)};
      for (int p = 0; p < P; ++p) {
        const __m256 qv = _mm256_loadu_ps(q[p] + 8 * j);
        for (int i = 0; i < 4; ++i) a[p][i] = _mm256_fmadd_ps(qv, k[i], a[p][i]);
      }
    }
    for (int p = 0; p < P; ++p) {
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[p][0], a[p][1]), _mm256_hadd_ps(a[p][2], a[p][3]));
      __m128 four = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
      if (mask[p]) four = _mm_add_ps(four, load4(mask[p] + c));
      _mm_storeu_ps(out[p] + c, four);
    }
  }
  for (; c < C; ++c)
    for (int p = 0; p < P; ++p) {
      __m256 a = _mm256_setzero_ps();
      for (int64_t j = 0; j < vecs; ++j)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(q[p] + 8 * j), load8(keys + c * k_row + 8 * j), a);
      out[p][c] = horizontal_sum(a) + (mask[p] ? static_cast<float>(mask[p][c]) : 0.f);
    }
}

// out[p][8 d0 ..] = inv[p] Σ_c w[p][c] v[c] for ROWS rows and LANES vectors of 8 dims from vector d0 on: each value
// vector is loaded and converted once for the ROWS rows (at 3 x 4, the 12 sums and 4 values fill the 16 ymm
// registers and each row's broadcast weight takes one more: the compiler reloads one).
template <int ROWS, int LANES, typename T>
void values_avx2(const T* values, int64_t v_row, int64_t C, int64_t d0, const float* const* w, const float* inv,
                 T* const* out) {
  __m256 acc[ROWS][LANES];
  for (int r = 0; r < ROWS; ++r)
    for (int l = 0; l < LANES; ++l) acc[r][l] = _mm256_setzero_ps();
  for (int64_t c = 0; c < C; ++c) {
    __m256 v[LANES];
    for (int l = 0; l < LANES; ++l) v[l] = load8(values + c * v_row + 8 * (d0 + l));
    for (int r = 0; r < ROWS; ++r) {
      const __m256 wr = _mm256_set1_ps(w[r][c]);
      for (int l = 0; l < LANES; ++l) acc[r][l] = _mm256_fmadd_ps(wr, v[l], acc[r][l]);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int l = 0; l < LANES; ++l) store8(out[r] + 8 * (d0 + l), _mm256_mul_ps(acc[r][l], _mm256_set1_ps(inv[r])));
}

// AVX2 + FMA rows [j0, j1) of key/value head g of sequence b, together (a verify's R·K rows of a head read each key
// and value once for several rows, not once a row): scores two rows at a time, weighted values three rows and 32
// dims at a time. Every sum runs in the order a row alone would run it, so a row's result does not depend on the
// rows beside it. s [n (C + 1)] scratch.
template <typename T, typename M>
void rows_avx2(const Operands<T, M>& o, int64_t b, int64_t g, int64_t j0, int64_t j1, float* s) {
  constexpr int VALUE_ROWS = 3, VALUE_LANES = 4;
  const int64_t n = j1 - j0, vecs = o.D / 8, C = o.C;
  alignas(32) float q[MAX_SLICE][MAX_HEAD_DIM];
  const float* qs[MAX_SLICE];
  const M* mask[MAX_SLICE];
  float* scores[MAX_SLICE];
  T* out[MAX_SLICE];
  for (int64_t r = 0; r < n; ++r) {
    const Row<T, M> row = o.row(b, g, j0 + r);
    for (int64_t j = 0; j < vecs; ++j)
      _mm256_store_ps(q[r] + 8 * j, _mm256_mul_ps(load8(row.q + 8 * j), _mm256_set1_ps(o.scale)));
    qs[r] = q[r], mask[r] = row.mask, scores[r] = s + r * C, out[r] = row.out;
  }
  const Row<T, M> head = o.row(b, g, j0);  // the head's keys and values, every row's
  int64_t r = 0;
  for (; r + 2 <= n; r += 2) scores_avx2<2>(o, head.keys, head.values, qs + r, mask + r, scores + r, r == 0);
  if (r < n) scores_avx2<1>(o, head.keys, head.values, qs + r, mask + r, scores + r, r == 0);
  float* inv = s + n * C;
  for (r = 0; r < n; ++r) inv[r] = 1.f / exponentiate(scores[r], C);
  using Values = void (*)(const T*, int64_t, int64_t, int64_t, const float* const*, const float*, T* const*);
  constexpr Values forms[VALUE_ROWS][VALUE_LANES] = {
      {values_avx2<1, 1, T>, values_avx2<1, 2, T>, values_avx2<1, 3, T>, values_avx2<1, 4, T>},
      {values_avx2<2, 1, T>, values_avx2<2, 2, T>, values_avx2<2, 3, T>, values_avx2<2, 4, T>},
      {values_avx2<3, 1, T>, values_avx2<3, 2, T>, values_avx2<3, 3, T>, values_avx2<3, 4, T>}};
  for (r = 0; r < n; r += VALUE_ROWS) {
    const int64_t rows = std::min<int64_t>(VALUE_ROWS, n - r);
    for (int64_t d0 = 0; d0 < vecs; d0 += VALUE_LANES)
      forms[rows - 1][std::min<int64_t>(VALUE_LANES, vecs - d0) - 1](head.values, o.v_stride[2], C, d0, scores + r,
                                                                      inv + r, out + r);
  }
}

// bf16 rows [j0, j1) of key/value head g of sequence b, together, on AVX-512 BF16 or AMX (`cpu_attention_bf16.cpp`).
template <typename M, bool AMX>
void rows_bf16(const Operands<c10::BFloat16, M>& o, int64_t b, int64_t g, int64_t j0, int64_t j1, float* s) {
  const c10::BFloat16* q[MAX_SLICE];
  const void* mask[MAX_SLICE];
  c10::BFloat16* out[MAX_SLICE];
  for (int64_t r = 0; r < j1 - j0; ++r) {
    const Row<c10::BFloat16, M> row = o.row(b, g, j0 + r);
    q[r] = row.q, mask[r] = row.mask, out[r] = row.out;
  }
  const Row<c10::BFloat16, M> first = o.row(b, g, j0);  // the head's keys and values, every row's
  specbench_attention_bf16(j1 - j0, q, mask, std::is_same_v<M, float>, out, first.keys, o.k_stride[2], first.values,
                           o.v_stride[2], o.C, o.D, o.scale, AMX, s);
}

// Every query row, in slices of a key/value head's R·K rows: enough slices a head that every thread has work (the
// embedded pair's 3 heads over 2 threads: two slices a head, 5 / 4 rows a thread at one row, 23 / 22 at five), at most
// 16 rows a slice (an AMX tile's), the rows of a slice one thread's. The forms are functions of their own because a
// target attribute does not reach into a lambda.
template <typename T, typename M>
void attend(const Operands<T, M>& o, int64_t B, Isa isa) {
  using Slice = void (*)(const Operands<T, M>&, int64_t, int64_t, int64_t, int64_t, float*);
  Slice rows = rows_avx2<T, M>;
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (isa == AVX512_BF16) rows = rows_bf16<M, false>;
    if (isa == AMX_BF16) rows = rows_bf16<M, true>;
  }
  const int64_t heads = B * o.G, n = o.R * o.K;
  const int64_t whole = (n + MAX_SLICE - 1) / MAX_SLICE;
  // AMX scores and pairs values for 16 rows at the cost of one: a head is one task there, split no further
  const int64_t slices =
      isa == AMX_BF16 ? whole : std::min(n, std::max((2 * at::get_num_threads() + heads - 1) / heads, whole));
  const int64_t most = (n + slices - 1) / slices;
  at::parallel_for(0, heads * slices, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(most * (o.C + 1));
    for (int64_t t = begin; t < end; ++t) {
      const int64_t head = t / slices, part = t % slices;
      rows(o, head / o.G, head % o.G, part * n / slices, (part + 1) * n / slices, s.data());
    }
  });
}

// `attend` over the tensors as `cache_attention` checked them; the mask, if any, in float32 or T.
template <typename T>
void attend(const at::Tensor& q, const at::Tensor& key, const at::Tensor& value, const at::Tensor& mask,
            at::Tensor& out, int64_t R, float scale, Isa isa) {
  const auto operands = [&](const auto* m) {
    using M = std::remove_const_t<std::remove_pointer_t<decltype(m)>>;
    return Operands<T, M>{q.data_ptr<T>(), key.data_ptr<T>(), value.data_ptr<T>(), m, out.data_ptr<T>(), key.size(1),
                          R, q.size(2), q.size(3), key.size(2), key.strides().data(), value.strides().data(),
                          m ? mask.stride(0) : 0, m ? mask.stride(2) : 0, scale};
  };
  if (mask.defined() && mask.scalar_type() == at::kFloat)
    attend(operands(mask.const_data_ptr<float>()), q.size(0), isa);
  else
    attend(operands(mask.defined() ? mask.const_data_ptr<T>() : nullptr), q.size(0), isa);
}

// out[b, i, h] = softmax_c(scale * q[b, h, i] . key[b, h / r, c] + mask[b, 0, i, c]) @ value[b, h / r, c]
// q [B, H, k, d], k <= MAX_QUERY_ROWS (H = G r: r query heads per key/value head, as transformers orders them); key,
// value [B, G, C, d] (views of a longer cache are read in place), all float32 or all bf16; mask [B, 1, k, C] additive
// (any finite value, the dtype's min where masked: a verify's causal rows are its to give), float32 or q's dtype, or
// none. Returns [B, k, H, d] in q's dtype. q and the mask come as transformers has them, not as views of them:
// inductor could not re-lay-out such a view with the column count a symbol of the graph.
at::Tensor cache_attention(const at::Tensor& q, const at::Tensor& key, const at::Tensor& value,
                           const std::optional<at::Tensor>& mask, double scale, int64_t isa) {
  TORCH_CHECK(q.dim() == 4 && key.dim() == 4 && value.dim() == 4,
              "specbench::cache_attention: q, key and value must be [B, H, k, d] and [B, G, C, d], got ", q.sizes(),
              ", ", key.sizes(), ", ", value.sizes());
  const int64_t B = q.size(0), H = q.size(1), K = q.size(2), D = q.size(3), G = key.size(1), C = key.size(2);
  TORCH_CHECK(K >= 1 && K <= MAX_QUERY_ROWS, "specbench::cache_attention: ", K, " query rows: 1 to ", MAX_QUERY_ROWS,
              " are allowed");
  TORCH_CHECK(G >= 1 && H % G == 0, "specbench::cache_attention: ", H, " query heads do not group over ", G,
              " key/value heads");
  const int64_t R = H / G;
  TORCH_CHECK(D % 8 == 0 && D <= MAX_HEAD_DIM, "specbench::cache_attention: head dim ", D,
              ": a multiple of 8 up to ", MAX_HEAD_DIM, " is required");
  TORCH_CHECK(key.sizes() == value.sizes() && key.size(0) == B && key.size(3) == D && C >= 1,
              "specbench::cache_attention: key ", key.sizes(), " and value ", value.sizes(), " do not fit q ", q.sizes());
  const auto dtype = q.scalar_type();
  TORCH_CHECK((dtype == at::kFloat || dtype == at::kBFloat16) && key.scalar_type() == dtype &&
                  value.scalar_type() == dtype,
              "specbench::cache_attention: q, key and value must all be float32 or all bfloat16, got ", dtype, ", ",
              key.scalar_type(), ", ", value.scalar_type());
  const bool masked = mask.has_value() && mask->defined();
  if (masked)
    TORCH_CHECK((mask->scalar_type() == at::kFloat || mask->scalar_type() == dtype) && mask->dim() == 4 &&
                    mask->size(0) == B && mask->size(1) == 1 && mask->size(2) == K && mask->size(3) == C,
                "specbench::cache_attention: mask must be float32 or q's dtype, [B, 1, k, C], got ", mask->sizes(), " ",
                mask->scalar_type());
  // Any layout is read (the op is `flexible_layout`: inductor passes the cache's views as they are); only a last
  // dim that is not contiguous is copied.
  const at::Tensor qc = q.contiguous();
  const at::Tensor keys_in = key.stride(3) == 1 ? key : key.contiguous();
  const at::Tensor values_in = value.stride(3) == 1 ? value : value.contiguous();
  const at::Tensor mask_in = !masked ? at::Tensor() : mask->stride(3) == 1 ? *mask : mask->contiguous();
  const Isa form = resolve(isa, dtype == at::kBFloat16, D);
  at::Tensor out = at::empty({B, K, H, D}, q.options());
  if (dtype == at::kFloat)
    attend<float>(qc, keys_in, values_in, mask_in, out, R, static_cast<float>(scale), form);
  else
    attend<c10::BFloat16>(qc, keys_in, values_in, mask_in, out, R, static_cast<float>(scale), form);
  return out;
}

// The form `cache_attention` runs for `isa` on these operands (an error where it cannot).
int64_t cache_attention_isa(int64_t isa, bool bf16, int64_t head_dim) { return resolve(isa, bf16, head_dim); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(specbench, m) {
  // flexible_layout: inductor's default for a custom op pins its inputs' strides, which it cannot do for a cache view
  // whose column count is a symbol of the graph (`static_kv`); this kernel reads any strides.
  m.def("cache_attention(Tensor q, Tensor key, Tensor value, Tensor? mask, float scale, int isa=0) -> Tensor",
        {at::Tag::flexible_layout});
  m.def("cache_attention_isa(int isa, bool bf16, int head_dim) -> int", &cache_attention_isa);
}

TORCH_LIBRARY_IMPL(specbench, CPU, m) { m.impl("cache_attention", &cache_attention); }
