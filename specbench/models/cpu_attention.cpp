// One query a row against a KV cache, float32 or bf16 (read as float32, summed in float32), AVX2 + FMA, and for bf16
// an AVX-512 BF16 form: the attention of a CPU decode step (a draft step, a plain decode step). Compiled, inductor's
// fused reduction for it took ~48 us a layer at 320 cached columns in float32 (2 threads, the embedded pair's 3 kv
// heads x 3 queries x 64) and ~40 in bf16 (analysis/fast_path_one_query_attention_bf16_cpu_amx/); this one keeps a
// query in registers and runs a polynomial exp. Built into the same extension as `cpu_matvec.cpp`
// (`specbench.models.cpu_matvec.available`).
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

namespace {

constexpr int64_t MAX_HEAD_DIM = 128;  // a query's 16 registers of 8 floats
constexpr int64_t PREFETCH_COLUMNS = 16;  // how far ahead both forms fetch key and value rows (32 did no better)

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
  const float top = *std::max_element(s, s + C);
  const __m256 top8 = _mm256_set1_ps(top);
  __m256 total8 = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= C; c += 8) {
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

// The checked operands as the kernels read them: T for q, key, value and out, M for the mask (none: null).
template <typename T, typename M>
struct Operands {
  const T *q, *key, *value;
  const M* mask;
  T* out;
  int64_t H, R, D, C;
  const int64_t *k_stride, *v_stride;
  int64_t m_stride;
  float scale;
};

// One query head (task t) with AVX2 + FMA, s [C] its scratch: four columns a pass, four FMA chains, one horizontal sum
// for all four.
template <typename T, typename M>
void head_avx2(const Operands<T, M>& o, int64_t t, float* s) {
  const int64_t vecs = o.D / 8, k_row = o.k_stride[2], v_row = o.v_stride[2], C = o.C;
  const int64_t b = t / o.H, g = (t % o.H) / o.R;
  const T* keys = o.key + b * o.k_stride[0] + g * o.k_stride[1];
  const T* values = o.value + b * o.v_stride[0] + g * o.v_stride[1];
  const M* row_mask = o.mask ? o.mask + b * o.m_stride : nullptr;
  __m256 qv[MAX_HEAD_DIM / 8];
  for (int64_t j = 0; j < vecs; ++j) qv[j] = _mm256_mul_ps(load8(o.q + t * o.D + 8 * j), _mm256_set1_ps(o.scale));
  int64_t c = 0;
  for (; c + 4 <= C; c += 4) {
    const T* k0 = keys + c * k_row;
    for (int64_t i = 0; i < 4; ++i)  // as in `head_avx512`
      for (int64_t at = 0; at < o.D * static_cast<int64_t>(sizeof(T)); at += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(k0 + (PREFETCH_COLUMNS + i) * k_row) + at, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(values + (c + PREFETCH_COLUMNS + i) * v_row) + at, _MM_HINT_T1);
      }
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t j = 0; j < vecs; ++j) {
      a0 = _mm256_fmadd_ps(qv[j], load8(k0 + 8 * j), a0);
      a1 = _mm256_fmadd_ps(qv[j], load8(k0 + k_row + 8 * j), a1);
      a2 = _mm256_fmadd_ps(qv[j], load8(k0 + 2 * k_row + 8 * j), a2);
      a3 = _mm256_fmadd_ps(qv[j], load8(k0 + 3 * k_row + 8 * j), a3);
    }
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m128 four = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    if (row_mask) four = _mm_add_ps(four, load4(row_mask + c));
    _mm_storeu_ps(s + c, four);
  }
  for (; c < C; ++c) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t j = 0; j < vecs; ++j) a = _mm256_fmadd_ps(qv[j], load8(keys + c * k_row + 8 * j), a);
    s[c] = horizontal_sum(a) + (row_mask ? static_cast<float>(row_mask[c]) : 0.f);
  }
  const float total = exponentiate(s, C);
  __m256 acc[MAX_HEAD_DIM / 8];
  for (int64_t j = 0; j < vecs; ++j) acc[j] = _mm256_setzero_ps();
  for (c = 0; c < C; ++c) {
    const __m256 w = _mm256_set1_ps(s[c]);
    const T* v = values + c * v_row;
    for (int64_t j = 0; j < vecs; ++j) acc[j] = _mm256_fmadd_ps(w, load8(v + 8 * j), acc[j]);
  }
  const __m256 inv = _mm256_set1_ps(1.f / total);
  for (int64_t j = 0; j < vecs; ++j) store8(o.out + t * o.D + 8 * j, _mm256_mul_ps(acc[j], inv));
}

// bf16 on AVX-512 BF16: a score is two `vdpbf16ps` over the query's and the column's bf16 pairs (exact products,
// float32 sums), a value row 16 lanes a load; about a third of the AVX2 form's instructions a column. d a multiple of
// 32. Same task, same softmax as `head_avx2`.
template <typename M>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void head_avx512(const Operands<c10::BFloat16, M>& o,
                                                                         int64_t t, float* s) {
  const int64_t pairs = o.D / 32, lanes = o.D / 16, k_row = o.k_stride[2], v_row = o.v_stride[2], C = o.C;
  const int64_t b = t / o.H, g = (t % o.H) / o.R;
  const c10::BFloat16* keys = o.key + b * o.k_stride[0] + g * o.k_stride[1];
  const c10::BFloat16* values = o.value + b * o.v_stride[0] + g * o.v_stride[1];
  const M* row_mask = o.mask ? o.mask + b * o.m_stride : nullptr;
  __m512bh qv[MAX_HEAD_DIM / 32];
  for (int64_t j = 0; j < pairs; ++j) qv[j] = (__m512bh)_mm512_loadu_si512(o.q + t * o.D + 32 * j);
  for (int64_t c = 0; c < C; ++c) {
    const c10::BFloat16* k = keys + c * k_row;
    for (int64_t at = 0; at < 2 * o.D; at += 64) {  // the cache comes from memory, behind a layer's weights
      _mm_prefetch(reinterpret_cast<const char*>(k + PREFETCH_COLUMNS * k_row) + at, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(values + (c + PREFETCH_COLUMNS) * v_row) + at, _MM_HINT_T1);
    }
    __m512 a = _mm512_setzero_ps();
    for (int64_t j = 0; j < pairs; ++j) a = _mm512_dpbf16_ps(a, qv[j], (__m512bh)_mm512_loadu_si512(k + 32 * j));
    s[c] = _mm512_reduce_add_ps(a) * o.scale + (row_mask ? static_cast<float>(row_mask[c]) : 0.f);
  }
  const float total = exponentiate(s, C);
  __m512 acc[MAX_HEAD_DIM / 16];
  for (int64_t j = 0; j < lanes; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t c = 0; c < C; ++c) {
    const __m512 w = _mm512_set1_ps(s[c]);
    const c10::BFloat16* v = values + c * v_row;
    for (int64_t j = 0; j < lanes; ++j) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 16 * j));
      acc[j] = _mm512_fmadd_ps(w, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16)), acc[j]);
    }
  }
  const __m512 inv = _mm512_set1_ps(1.f / total);
  alignas(64) float f[16];
  for (int64_t j = 0; j < lanes; ++j) {
    _mm512_store_ps(f, _mm512_mul_ps(acc[j], inv));
    for (int i = 0; i < 16; ++i) o.out[t * o.D + 16 * j + i] = c10::BFloat16(f[i]);
  }
}

// Every query head, one task each (the embedded pair's 9 split over 2 threads 5 / 4), in the form this CPU and
// torch's kernel level allow: AVX-512 BF16 for bf16 with d a multiple of 32, else AVX2. The head forms are functions
// of their own because a target attribute does not reach into a lambda.
template <typename T, typename M>
void attend(const Operands<T, M>& o, int64_t tasks) {
  void (*head)(const Operands<T, M>&, int64_t, float*) = head_avx2<T, M>;
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    static const bool avx512 = specbench_aten_allows_avx512() && specbench_cpu_has_avx512_bf16();
    if (avx512 && o.D % 32 == 0) head = head_avx512<M>;
  }
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(o.C);
    for (int64_t t = begin; t < end; ++t) head(o, t, s.data());
  });
}

// `attend` over the tensors as `one_query_attention` checked them; the mask, if any, in float32 or T.
template <typename T>
void attend(const at::Tensor& q, const at::Tensor& key, const at::Tensor& value, const at::Tensor& mask,
            at::Tensor& out, int64_t R, float scale) {
  const auto operands = [&](const auto* m) {
    using M = std::remove_const_t<std::remove_pointer_t<decltype(m)>>;
    return Operands<T, M>{q.data_ptr<T>(), key.data_ptr<T>(), value.data_ptr<T>(), m, out.data_ptr<T>(), q.size(1),
                          R, q.size(3), key.size(2), key.strides().data(), value.strides().data(),
                          m ? mask.stride(0) : 0, scale};
  };
  if (mask.defined() && mask.scalar_type() == at::kFloat)
    attend(operands(mask.const_data_ptr<float>()), q.size(0) * q.size(1));
  else
    attend(operands(mask.defined() ? mask.const_data_ptr<T>() : nullptr), q.size(0) * q.size(1));
}

// out[b, h] = softmax_c(scale * q[b, h] . key[b, h / r, c] + mask[b, c]) @ value[b, h / r, c]
// q [B, H, 1, d] (H = G r: r query heads per key/value head, as transformers orders them); key, value [B, G, C, d]
// (views of a longer cache are read in place), all float32 or all bf16; mask [B, 1, 1, C] additive (any finite value,
// the dtype's min where masked), float32 or q's dtype, or none. Returns [B, 1, H, d] in q's dtype. q and the mask come
// as transformers has them, not as views of them: inductor could not re-lay-out such a view with the column count a
// symbol of the graph.
at::Tensor one_query_attention(const at::Tensor& q, const at::Tensor& key, const at::Tensor& value,
                               const std::optional<at::Tensor>& mask, double scale) {
  TORCH_CHECK(q.dim() == 4 && q.size(2) == 1 && key.dim() == 4 && value.dim() == 4,
              "specbench::one_query_attention: q, key and value must be [B, H, 1, d] and [B, G, C, d], got ", q.sizes(),
              ", ", key.sizes(), ", ", value.sizes());
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), G = key.size(1), C = key.size(2);
  TORCH_CHECK(G >= 1 && H % G == 0, "specbench::one_query_attention: ", H, " query heads do not group over ", G,
              " key/value heads");
  const int64_t R = H / G;
  TORCH_CHECK(D % 8 == 0 && D <= MAX_HEAD_DIM, "specbench::one_query_attention: head dim ", D,
              ": a multiple of 8 up to ", MAX_HEAD_DIM, " is required");
  TORCH_CHECK(key.sizes() == value.sizes() && key.size(0) == B && key.size(3) == D && C >= 1,
              "specbench::one_query_attention: key ", key.sizes(), " and value ", value.sizes(), " do not fit q ", q.sizes());
  const auto dtype = q.scalar_type();
  TORCH_CHECK((dtype == at::kFloat || dtype == at::kBFloat16) && key.scalar_type() == dtype &&
                  value.scalar_type() == dtype,
              "specbench::one_query_attention: q, key and value must all be float32 or all bfloat16, got ", dtype, ", ",
              key.scalar_type(), ", ", value.scalar_type());
  const bool masked = mask.has_value() && mask->defined();
  if (masked)
    TORCH_CHECK((mask->scalar_type() == at::kFloat || mask->scalar_type() == dtype) && mask->dim() == 4 &&
                    mask->size(0) == B && mask->size(1) == 1 && mask->size(2) == 1 && mask->size(3) == C,
                "specbench::one_query_attention: mask must be float32 or q's dtype, [B, 1, 1, C], got ", mask->sizes(),
                " ", mask->scalar_type());
  // Any layout is read (the op is `flexible_layout`: inductor passes the cache's views as they are); only a last
  // dim that is not contiguous is copied.
  const at::Tensor qc = q.contiguous();
  const at::Tensor keys_in = key.stride(3) == 1 ? key : key.contiguous();
  const at::Tensor values_in = value.stride(3) == 1 ? value : value.contiguous();
  const at::Tensor mask_in = !masked ? at::Tensor() : mask->stride(3) == 1 ? *mask : mask->contiguous();
  at::Tensor out = at::empty({B, 1, H, D}, q.options());
  if (dtype == at::kFloat)
    attend<float>(qc, keys_in, values_in, mask_in, out, R, static_cast<float>(scale));
  else
    attend<c10::BFloat16>(qc, keys_in, values_in, mask_in, out, R, static_cast<float>(scale));
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specbench, m) {
  // flexible_layout: inductor's default for a custom op pins its inputs' strides, which it cannot do for a cache view
  // whose column count is a symbol of the graph (`static_kv`); this kernel reads any strides.
  m.def("one_query_attention(Tensor q, Tensor key, Tensor value, Tensor? mask, float scale) -> Tensor",
        {at::Tag::flexible_layout});
}

TORCH_LIBRARY_IMPL(specbench, CPU, m) { m.impl("one_query_attention", &one_query_attention); }
