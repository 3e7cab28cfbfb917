// One query a row against a KV cache, float32, AVX2 + FMA: the attention of a CPU decode step (a draft step, a
// plain decode step). Compiled, inductor's fused reduction for it took ~48 us a layer at 320 cached columns (2
// threads, the embedded pair's 3 kv heads x 3 queries x 64), a third of the layer's int4 weight time; this one
// keeps a query in registers, scores four columns per pass, and runs a polynomial exp. Built into the same
// extension as `cpu_matvec.cpp` (`specbench.models.cpu_matvec.available`).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

namespace {

constexpr int64_t MAX_HEAD_DIM = 128;  // a query's 16 registers of 8 floats

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

// out[b, h] = softmax_c(scale * q[b, h] . key[b, h / r, c] + mask[b, c]) @ value[b, h / r, c]
// q [B, H, 1, d] (H = G r: r query heads per key/value head, as transformers orders them); key, value [B, G, C, d]
// (views of a longer cache are read in place); mask [B, 1, 1, C] additive (any finite value, the dtype's min where
// masked) or none. Returns [B, 1, H, d]. q and the mask come as transformers has them, not as views of them: inductor
// could not re-lay-out such a view with the column count a symbol of the graph.
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
  for (const auto* t : {&q, &key, &value})
    TORCH_CHECK(t->scalar_type() == at::kFloat, "specbench::one_query_attention: float32 tensors are required, got ",
                t->scalar_type());
  const bool masked = mask.has_value() && mask->defined();
  if (masked)
    TORCH_CHECK(mask->scalar_type() == at::kFloat && mask->dim() == 4 && mask->size(0) == B && mask->size(1) == 1 &&
                    mask->size(2) == 1 && mask->size(3) == C,
                "specbench::one_query_attention: mask must be float32 [B, 1, 1, C], got ", mask->sizes(), " ",
                mask->scalar_type());
  // Any layout is read (the op is `flexible_layout`: inductor passes the cache's views as they are); only a last
  // dim that is not contiguous is copied.
  const at::Tensor qc = q.contiguous();
  const at::Tensor keys_in = key.stride(3) == 1 ? key : key.contiguous();
  const at::Tensor values_in = value.stride(3) == 1 ? value : value.contiguous();
  const at::Tensor mask_in = !masked ? at::Tensor() : mask->stride(3) == 1 ? *mask : mask->contiguous();
  at::Tensor out = at::empty({B, 1, H, D}, q.options());
  const float* qp = qc.data_ptr<float>();
  const float* kp = keys_in.data_ptr<float>();
  const float* vp = values_in.data_ptr<float>();
  const float* mp = masked ? mask_in.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  const int64_t vecs = D / 8, k_row = keys_in.stride(2), v_row = values_in.stride(2);
  const float sc = static_cast<float>(scale);
  // one task per query head: the embedded pair's 9 split over 2 threads 5 / 4
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(C);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / H, g = (t % H) / R;
      const float* keys = kp + b * keys_in.stride(0) + g * keys_in.stride(1);
      const float* values = vp + b * values_in.stride(0) + g * values_in.stride(1);
      const float* row_mask = masked ? mp + b * mask_in.stride(0) : nullptr;
      __m256 qv[MAX_HEAD_DIM / 8];
      for (int64_t j = 0; j < vecs; ++j) qv[j] = _mm256_mul_ps(_mm256_loadu_ps(qp + t * D + 8 * j), _mm256_set1_ps(sc));
      int64_t c = 0;
      for (; c + 4 <= C; c += 4) {  // four columns a pass: four FMA chains, one horizontal sum for all four
        const float* k0 = keys + c * k_row;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t j = 0; j < vecs; ++j) {
          a0 = _mm256_fmadd_ps(qv[j], _mm256_loadu_ps(k0 + 8 * j), a0);
          a1 = _mm256_fmadd_ps(qv[j], _mm256_loadu_ps(k0 + k_row + 8 * j), a1);
          a2 = _mm256_fmadd_ps(qv[j], _mm256_loadu_ps(k0 + 2 * k_row + 8 * j), a2);
          a3 = _mm256_fmadd_ps(qv[j], _mm256_loadu_ps(k0 + 3 * k_row + 8 * j), a3);
        }
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        __m128 four = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        if (row_mask) four = _mm_add_ps(four, _mm_loadu_ps(row_mask + c));
        _mm_storeu_ps(s.data() + c, four);
      }
      for (; c < C; ++c) {
        __m256 a = _mm256_setzero_ps();
        for (int64_t j = 0; j < vecs; ++j) a = _mm256_fmadd_ps(qv[j], _mm256_loadu_ps(keys + c * k_row + 8 * j), a);
        s[c] = horizontal_sum(a) + (row_mask ? row_mask[c] : 0.f);
      }
      const float top = *std::max_element(s.begin(), s.end());
      const __m256 top8 = _mm256_set1_ps(top);
      __m256 total8 = _mm256_setzero_ps();
      for (c = 0; c + 8 <= C; c += 8) {
        const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s.data() + c), top8));
        _mm256_storeu_ps(s.data() + c, e);
        total8 = _mm256_add_ps(total8, e);
      }
      float total = horizontal_sum(total8);
      for (; c < C; ++c) total += (s[c] = std::exp(s[c] - top));
      __m256 acc[MAX_HEAD_DIM / 8];
      for (int64_t j = 0; j < vecs; ++j) acc[j] = _mm256_setzero_ps();
      for (c = 0; c < C; ++c) {
        const __m256 w = _mm256_set1_ps(s[c]);
        const float* v = values + c * v_row;
        for (int64_t j = 0; j < vecs; ++j) acc[j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8 * j), acc[j]);
      }
      const __m256 inv = _mm256_set1_ps(1.f / total);
      for (int64_t j = 0; j < vecs; ++j) _mm256_storeu_ps(op + t * D + 8 * j, _mm256_mul_ps(acc[j], inv));
    }
  });
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
