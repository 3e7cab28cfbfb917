// Weight-only int8 and int4 products for a CPU decode step (a few rows against a large weight), AVX2 + FMA.
//
// torch has no fast path for these with float32 activations on AVX2 CPUs: its int8 kernel takes bf16 only
// and its int4 kernel runs compute-bound there, so a quantized draft cost more than the fp32 target. Here
// each row of x is quantized to int8 per block of 32 (one float scale per block, as llama.cpp's Q8_0), so
// a block's dot product is one maddubs + madd pair and the step streams its weights at memory speed. The
// rounding only changes what the draft proposes; the target verifies every token.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr int64_t BLOCK = 32;            // input channels per activation scale (and per int4 weight group)
constexpr int64_t PREFETCH_BYTES = 1024;  // how far ahead on the weight stream to prefetch
constexpr int64_t GRAIN = 16;             // output rows per parallel chunk, at least

struct QuantizedRows {  // x [M, K] as int8 per block: q [M, K], scale [M, K/32], sum of q [M, K/32]
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<float> sum;
};

QuantizedRows quantize_rows(const float* x, int64_t rows, int64_t k) {
  const int64_t blocks = k / BLOCK;
  QuantizedRows out{std::vector<int8_t>(rows * k), std::vector<float>(rows * blocks), std::vector<float>(rows * blocks)};
  for (int64_t b = 0; b < rows * blocks; ++b) {
    const float* src = x + b * BLOCK;
    float amax = 0.f;
    for (int64_t i = 0; i < BLOCK; ++i) amax = std::max(amax, std::fabs(src[i]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    int32_t total = 0;
    for (int64_t i = 0; i < BLOCK; ++i) {
      const auto v = static_cast<int8_t>(std::nearbyint(src[i] * inv));
      out.q[b * BLOCK + i] = v;
      total += v;
    }
    out.scale[b] = amax / 127.f;
    out.sum[b] = static_cast<float>(total);
  }
  return out;
}

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

void check_x(const at::Tensor& x, int64_t k, const char* op) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), op,
              ": x must be a contiguous float32 [rows, in_features] tensor, got ", x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(x.size(1) == k && k % BLOCK == 0, op, ": x has ", x.size(1), " columns, the weight ", k,
              " (a multiple of ", BLOCK, " is required)");
}

// y[m, n] = scale[n] * sum_k x[m, k] * weight[n, k]; weight int8 [N, K], scale float32 [N]
at::Tensor int8_matvec(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale) {
  const int64_t rows = x.size(0), n_out = weight.size(0), k = weight.size(1), blocks = k / BLOCK;
  check_x(x, k, "specbench::int8_matvec");
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.is_contiguous() && scale.scalar_type() == at::kFloat &&
                  scale.is_contiguous() && scale.numel() == n_out,
              "specbench::int8_matvec: weight must be contiguous int8 [N, K] and scale float32 [N]");
  const QuantizedRows xq = quantize_rows(x.data_ptr<float>(), rows, k);
  auto y = at::empty({rows, n_out}, x.options());
  const int8_t* w = weight.data_ptr<int8_t>();
  const float* s = scale.data_ptr<float>();
  float* out = y.data_ptr<float>();
  const __m256i ones = _mm256_set1_epi16(1);
  at::parallel_for(0, n_out, GRAIN, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int8_t* row = w + n * k;
      for (int64_t m = 0; m < rows; ++m) {
        const int8_t* xr = xq.q.data() + m * k;
        const float* xs = xq.scale.data() + m * blocks;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < blocks; ++b) {
          if (m == 0 && (b & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(row + b * BLOCK + PREFETCH_BYTES), _MM_HINT_T0);
          const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * BLOCK));
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + b * BLOCK));
          // maddubs multiplies unsigned by signed bytes: move x's sign onto w
          const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(wv, xv));
          const __m256 dots = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
          acc = _mm256_fmadd_ps(dots, _mm256_set1_ps(xs[b]), acc);
        }
        out[m * n_out + n] = horizontal_sum(acc) * s[n];
      }
    }
  });
  return y;
}

// y[m, n] = sum_k x[m, k] * (q[n, k] * scale[n, k / 32] + low[n, k / 32]), q in 0..15. nibbles uint8
// [N, K / 2]: byte 16 b + i of a row holds q[32 b + i] (low nibble) and q[32 b + 16 + i] (high nibble).
at::Tensor int4_matvec(const at::Tensor& x, const at::Tensor& nibbles, const at::Tensor& scale, const at::Tensor& low) {
  const int64_t rows = x.size(0), n_out = nibbles.size(0), k = nibbles.size(1) * 2, blocks = k / BLOCK;
  check_x(x, k, "specbench::int4_matvec");
  TORCH_CHECK(nibbles.scalar_type() == at::kByte && nibbles.is_contiguous(),
              "specbench::int4_matvec: nibbles must be contiguous uint8 [N, K/2]");
  for (const auto* t : {&scale, &low})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 && t->size(0) == n_out &&
                    t->size(1) == blocks,
                "specbench::int4_matvec: scale and low must be contiguous float32 [N, K/32]");
  const QuantizedRows xq = quantize_rows(x.data_ptr<float>(), rows, k);
  auto y = at::empty({rows, n_out}, x.options());
  const uint8_t* w = nibbles.data_ptr<uint8_t>();
  const float* sc = scale.data_ptr<float>();
  const float* lo = low.data_ptr<float>();
  float* out = y.data_ptr<float>();
  const __m256i ones = _mm256_set1_epi16(1), mask = _mm256_set1_epi8(0x0F);
  at::parallel_for(0, n_out, GRAIN, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* row = w + n * (k / 2);
      const float* row_scale = sc + n * blocks;
      const float* row_low = lo + n * blocks;
      for (int64_t m = 0; m < rows; ++m) {
        const int8_t* xr = xq.q.data() + m * k;
        const float* xs = xq.scale.data() + m * blocks;
        const float* xsum = xq.sum.data() + m * blocks;
        __m256 acc = _mm256_setzero_ps();
        float offset = 0.f;  // sum_b low[n, b] * (x's block sum): the groups' zero points
        for (int64_t b = 0; b < blocks; ++b) {
          if (m == 0 && (b & 3) == 0) _mm_prefetch(reinterpret_cast<const char*>(row + b * BLOCK / 2 + PREFETCH_BYTES), _MM_HINT_T0);
          const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * BLOCK / 2));
          const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), mask);
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + b * BLOCK));
          const __m256 dots = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), ones));
          acc = _mm256_fmadd_ps(dots, _mm256_set1_ps(xs[b] * row_scale[b]), acc);
          offset += row_low[b] * xs[b] * xsum[b];
        }
        out[m * n_out + n] = horizontal_sum(acc) + offset;
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(specbench, m) {
  m.def("int8_matvec(Tensor x, Tensor weight, Tensor scale) -> Tensor");
  m.def("int4_matvec(Tensor x, Tensor nibbles, Tensor scale, Tensor low) -> Tensor");
}

TORCH_LIBRARY_IMPL(specbench, CPU, m) {
  m.impl("int8_matvec", &int8_matvec);
  m.impl("int4_matvec", &int4_matvec);
}
