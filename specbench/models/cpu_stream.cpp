// The read-bandwidth probes that floor the weight kernels: a plain sum of a buffer (`stream_sum`), or of tensors
// where they lie (`stream_read`: a model's own weights). Both split their bytes across all of torch's threads as
// cpu_bf16.cpp's matvec does, each thread reading one contiguous run; AVX-512 where the matvec's path is.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

int64_t specbench_bf16_resolve(int64_t isa);  // cpu_bf16.cpp: 1 AVX2, 2 AVX-512-BF16, 3 AMX (0 asks for auto)

namespace {

constexpr int64_t AVX2 = 1;

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(_mm_hadd_ps(s, s));
}

// The read probe: the sum of a float32 buffer, each thread one contiguous part with 4 independent sums of one
// vector width (AVX-512 where the matvec's path is), partial sums added at the end.
float sum_avx2(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += p[i];
  return s;
}

__attribute__((target("avx512f"))) float sum_avx512(const float* p, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  return s + sum_avx2(p + i, n - i);
}

// Both read probes' split: spans (pointer, count) laid end to end, each of torch's threads summing one contiguous
// run of them (`sum` over each piece of a span it covers), the threads' sums added at the end.
template <typename T, typename E, typename Sum>
T sum_split(const std::vector<std::pair<const E*, int64_t>>& spans, Sum sum) {
  int64_t total = 0;
  for (const auto& span : spans) total += span.second;
  const int threads = at::get_num_threads();
  std::vector<T> partial(threads, T(0));
  const int64_t chunk = (total + threads - 1) / threads;
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t lo = std::min(total, t * chunk), hi = std::min(total, lo + chunk);
      int64_t start = 0;  // of the span below, in the spans laid end to end
      for (const auto& [p, n] : spans) {
        const int64_t from = std::max(lo, start), to = std::min(hi, start + n);
        if (from < to) partial[t] += sum(p + (from - start), to - from);
        start += n;
        if (start >= hi) break;
      }
    }
  });
  T s = T(0);
  for (T v : partial) s += v;
  return s;
}

at::Tensor stream_sum(const at::Tensor& buffer, int64_t isa_arg) {
  TORCH_CHECK(buffer.scalar_type() == at::kFloat && buffer.is_contiguous() && buffer.device().is_cpu(),
              "stream_sum: a contiguous float32 CPU tensor; got ", buffer.scalar_type());
  const int64_t isa = specbench_bf16_resolve(isa_arg);
  const std::vector<std::pair<const float*, int64_t>> spans{{buffer.data_ptr<float>(), buffer.numel()}};
  const float s = sum_split<float>(
      spans, [isa](const float* p, int64_t n) { return isa != AVX2 ? sum_avx512(p, n) : sum_avx2(p, n); });
  return at::scalar_tensor(s, buffer.options());
}

// The read probe over tensors in place (a model's own weights, where they lie in memory): their bytes as 32-bit
// words, summed as integers (any bits: no float special cases or denormal assists), one parallel region for all of
// them (`sum_split`); a tensor's last nbytes % 4 bytes are left out.
// Returns the words' sum mod 2^32, so the reads cannot be optimised away.
uint32_t words_avx2(const uint32_t* p, int64_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_epi32(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi32(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a2 = _mm256_add_epi32(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 16)));
    a3 = _mm256_add_epi32(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 24)));
  }
  alignas(32) uint32_t lanes[8];
  const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3));
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
  uint32_t s = 0;
  for (uint32_t v : lanes) s += v;
  for (; i < n; ++i) s += p[i];
  return s;
}

__attribute__((target("avx512f"))) uint32_t words_avx512(const uint32_t* p, int64_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm512_add_epi32(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_add_epi32(a1, _mm512_loadu_si512(p + i + 16));
    a2 = _mm512_add_epi32(a2, _mm512_loadu_si512(p + i + 32));
    a3 = _mm512_add_epi32(a3, _mm512_loadu_si512(p + i + 48));
  }
  const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3));
  const uint32_t s = static_cast<uint32_t>(_mm512_reduce_add_epi32(sum));
  return s + words_avx2(p + i, n - i);
}

at::Tensor stream_read(at::TensorList buffers, int64_t isa_arg) {
  const int64_t isa = specbench_bf16_resolve(isa_arg);
  std::vector<std::pair<const uint32_t*, int64_t>> spans;  // (words, count), in order
  for (const at::Tensor& b : buffers) {
    TORCH_CHECK(b.device().is_cpu() && b.is_contiguous(), "stream_read: contiguous CPU tensors; got one on ",
                b.device(), b.is_contiguous() ? "" : ", not contiguous");
    const int64_t words = b.numel() * static_cast<int64_t>(b.element_size()) / 4;
    if (words > 0) spans.emplace_back(static_cast<const uint32_t*>(b.const_data_ptr()), words);
  }
  const uint32_t s = sum_split<uint32_t>(
      spans, [isa](const uint32_t* p, int64_t n) { return isa != AVX2 ? words_avx512(p, n) : words_avx2(p, n); });
  return at::scalar_tensor(static_cast<int64_t>(s), at::TensorOptions().dtype(at::kLong));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specbench, m) {
  m.def("stream_sum(Tensor buffer, int isa=0) -> Tensor");
  m.def("stream_read(Tensor[] buffers, int isa=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(specbench, CPU, m) {
  m.impl("stream_sum", &stream_sum);
  m.impl("stream_read", &stream_read);
}
