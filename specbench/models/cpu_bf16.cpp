// bf16 weights streamed once per step for a few activation rows (a decode step: 1 row; a verify: gamma + 1), their
// bytes split across all of torch's threads (at::parallel_for), each thread reading one contiguous run, the way
// ggml's mul_mat splits weight rows. The read probes that floor it are in cpu_stream.cpp.
// ISA paths, picked per call: AMX (passes of 2+ activation rows as tile products), AVX-512-BF16 (vdpbf16ps: bf16 x
// bf16 products summed in fp32) and AVX2 + FMA
// (bf16 -> fp32 by a 16-bit shift). The AVX-512 functions carry their own target attribute, so the extension is
// still built with -mavx2 only and loads on any AVX2 machine. Built into the same extension as `cpu_matvec.cpp`
// (`specbench.models.cpu_matvec.available`).
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>
#include <ATen/cpu/Utils.h>
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

// Whether torch's kernel level is AVX-512: its switch ATEN_CPU_CAPABILITY read as torch reads it (unset: the best the
// CPU has), since torch does not export its level to extensions. Outside the anonymous namespace: cpu_matvec.cpp's
// int8 kernel follows the same switch.
bool specbench_aten_allows_avx512() {
  static const bool allowed = [] {
    const char* level = std::getenv("ATEN_CPU_CAPABILITY");
    return level == nullptr || *level == '\0' || std::string(level).rfind("avx512", 0) == 0;
  }();
  return allowed;
}

// Whether the CPU has AVX-512 BF16 (and the F/BW it builds on); cpu_attention.cpp's bf16 form asks too.
bool specbench_cpu_has_avx512_bf16() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512bf16");
  return has;
}

// Whether this CPU has AMX BF16 (cpuid 7.0 EDX bits 22, 24) and Linux lets this process use the tile state
// (`at::cpu::init_amx` asks, once); cpu_attention.cpp's AMX form asks too.
bool specbench_amx_bf16() {
  static const bool ok = [] {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) && (d >> 24 & 1) && at::cpu::init_amx();
  }();
  return ok;
}

namespace {

constexpr int64_t MAX_ROWS = 8;  // activation rows per pass over the weights; more rows make more passes
constexpr int64_t GRAIN = 16;    // output features per thread at least (a tiny layer runs on one thread)
enum Isa : int64_t { AUTO = 0, AVX2 = 1, AVX512_BF16 = 2, AMX_BF16 = 3 };

// AUTO follows torch's kernel level: ATEN_CPU_CAPABILITY=avx2 (or default) forces the AVX2 path, as it does torch's;
// at AVX-512, AMX where the CPU has it. AMX_BF16 runs passes of 2 or more rows on tiles, one row as AVX512_BF16.
Isa resolve(int64_t isa) {
  TORCH_CHECK(isa >= AUTO && isa <= AMX_BF16, "specbench bf16 kernels: isa ", isa,
              " is not one of 0 (auto), 1 (avx2), 2 (avx512_bf16), 3 (amx_bf16)");
  if (isa == AVX512_BF16 || isa == AMX_BF16) {
    TORCH_CHECK(specbench_cpu_has_avx512_bf16() && (isa == AVX512_BF16 || specbench_amx_bf16()),
                "specbench bf16 kernels: isa ", isa, isa == AMX_BF16 ? " (amx_bf16)" : " (avx512_bf16)",
                " asked on a CPU without it");
    return static_cast<Isa>(isa);
  }
  if (isa == AVX2) return AVX2;
  if (!specbench_aten_allows_avx512() || !specbench_cpu_has_avx512_bf16()) return AVX2;
  return specbench_amx_bf16() ? AMX_BF16 : AVX512_BF16;
}

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(_mm_hadd_ps(s, s));
}

inline float bf16_value(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// 8 bf16 -> 8 fp32: the bits moved to the high half.
inline __m256 load8_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

// n bf16 -> fp32 (exact: the bits moved to the high half).
void widen_bf16(const uint16_t* p, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, load8_bf16(p + i));
  for (; i < n; ++i) out[i] = bf16_value(p[i]);
}

// The weight stream is prefetched into L2 this far ahead. Each thread reads its rows one after another, front to
// back: interleaving 4 rows per pass (the kernel before) streamed at about half the rate on K = 576
// (analysis/bf16_matvec_cpu_avx512).
constexpr int64_t PREFETCH_BYTES = 4096;

inline void prefetch_l2(const uint16_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p) + PREFETCH_BYTES, _MM_HINT_T1); }

// AVX2: R activation rows (fp32, [R, K]) against weight rows [begin, end) of w [N, K]; out[r * N + n] in fp32.
template <int R, typename Out>
void rows_avx2(const float* x, const uint16_t* w, int64_t K, int64_t begin, int64_t end, int64_t N, Out* out) {
  const int64_t K32 = K / 32 * 32;
  for (int64_t n = begin; n < end; ++n) {
    const uint16_t* wn = w + n * K;
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K32; k += 32) {  // one cache line of weights a step
      prefetch_l2(wn + k);
      for (int h = 0; h < 32; h += 16) {
        const __m256 w0 = load8_bf16(wn + k + h), w1 = load8_bf16(wn + k + h + 8);
        for (int r = 0; r < R; ++r) {
          acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * K + k + h), acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * K + k + h + 8), acc[r][1]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      float s = hsum256(_mm256_add_ps(acc[r][0], acc[r][1]));
      for (int64_t k = K32; k < K; ++k) s += bf16_value(wn[k]) * x[r * K + k];
      out[r * N + n] = Out(s);
    }
  }
}

// AVX2, 2 to 6 activation rows: two weight rows a pass, so each activation load feeds two FMAs (R x 2 sums, 2
// weights and 1 activation fit the 16 ymm registers up to R = 6); an odd last row takes `rows_avx2`.
template <int R, typename Out>
void row_pairs_avx2(const float* x, const uint16_t* w, int64_t K, int64_t begin, int64_t end, int64_t N, Out* out) {
  static_assert(R >= 2 && R <= 6, "R x 2 sums + 3 must fit 16 ymm registers");
  const int64_t K32 = K / 32 * 32;
  int64_t n = begin;
  for (; n + 2 <= end; n += 2) {
    const uint16_t* w0 = w + n * K;
    const uint16_t* w1 = w0 + K;
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K32; k += 32) {
      prefetch_l2(w0 + k);
      prefetch_l2(w1 + k);
      for (int h = 0; h < 32; h += 8) {
        const __m256 a = load8_bf16(w0 + k + h), b = load8_bf16(w1 + k + h);
        for (int r = 0; r < R; ++r) {
          __m256 xv = _mm256_loadu_ps(x + r * K + k + h);
          // held in a register for both FMAs: folded into each as a memory operand (gcc's choice), the x loads
          // doubled and the load ports, not the FMAs, set the pace (analysis/avx2_verify_cpu_avx512/)
          asm("" : "+x"(xv));
          acc[r][0] = _mm256_fmadd_ps(a, xv, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(b, xv, acc[r][1]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      float s0 = hsum256(acc[r][0]), s1 = hsum256(acc[r][1]);
      for (int64_t k = K32; k < K; ++k) {
        s0 += bf16_value(w0[k]) * x[r * K + k];
        s1 += bf16_value(w1[k]) * x[r * K + k];
      }
      out[r * N + n] = Out(s0);
      out[r * N + n + 1] = Out(s1);
    }
  }
  if (n < end) rows_avx2<R>(x, w, K, n, end, N, out);
}

// AVX-512-BF16: R activation rows (bf16, [R, K]) against weight rows [begin, end) of w; fp32 sums of exact
// products, two independent sums per row to hide vdpbf16ps' latency.
template <int R, typename Out>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void rows_avx512(const uint16_t* x, const uint16_t* w,
                                                                        int64_t K, int64_t begin, int64_t end,
                                                                        int64_t N, Out* out) {
  const int64_t K64 = K / 64 * 64, K32 = K / 32 * 32;
  const __mmask32 tail = (__mmask32)((1ull << (K - K32)) - 1);
  for (int64_t n = begin; n < end; ++n) {
    const uint16_t* wn = w + n * K;
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K64; k += 64) {
      prefetch_l2(wn + k);
      prefetch_l2(wn + k + 32);
      const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wn + k), w1 = (__m512bh)_mm512_loadu_si512(wn + k + 32);
      for (int r = 0; r < R; ++r) {
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], w0, (__m512bh)_mm512_loadu_si512(x + r * K + k));
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], w1, (__m512bh)_mm512_loadu_si512(x + r * K + k + 32));
      }
    }
    if (K64 < K32) {
      const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wn + K64);
      for (int r = 0; r < R; ++r)
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], w0, (__m512bh)_mm512_loadu_si512(x + r * K + K64));
    }
    if (K32 < K) {
      const __m512bh w0 = (__m512bh)_mm512_maskz_loadu_epi16(tail, wn + K32);
      for (int r = 0; r < R; ++r)
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], w0, (__m512bh)_mm512_maskz_loadu_epi16(tail, x + r * K + K32));
    }
    for (int r = 0; r < R; ++r) out[r * N + n] = Out(_mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1])));
  }
}

}  // namespace

// Loads this thread's AMX configuration: tiles 0 .. count - 1 of 16 rows x 64 bytes (palette 1), the one shape every
// specbench tile takes; cpu_attention_bf16.cpp's forms load theirs here too.
__attribute__((target("amx-tile"))) void specbench_load_tiles(int count) {
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } config;
  for (int t = 0; t < count; ++t) config.colsb[t] = 64, config.rows[t] = 16;
  asm volatile("" : : "r"(&config) : "memory");  // all 64 bytes stored: the intrinsic's asm names only the first 8
  _tile_loadconfig(&config);
}

namespace {

// AMX: R activation rows against weight rows [begin, end), multiples of 16, K a multiple of 32. out^T = w · x^T:
// a block of 16 weight rows is tile A, loaded in place 32 columns at a time (the hardware prefetcher follows the
// 16 rows; software prefetch a block or some columns ahead made it 5-30% slower:
// analysis/fast_path_amx_matvec_cpu_amx/); x^T [K / 32][16 pairs][16 rows] (`pack_rows`) is the B operand; one
// `tdpbf16ps` per 32 columns does what 2 R `vdpbf16ps` and R reductions do in `rows_avx512`. Exact products, fp32
// sums.
template <typename Out>
__attribute__((target("avx512f,avx512bw,avx512bf16,amx-tile,amx-bf16"))) void rows_amx(
    const uint32_t* xt, int R, const uint16_t* w, int64_t K, int64_t begin, int64_t end, int64_t N, Out* out) {
  alignas(64) float block[16 * 16];  // tile 0 stored: [weight row][activation row]
  const __m512i across = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(16));
  specbench_load_tiles(3);
  for (int64_t n0 = begin; n0 < end; n0 += 16) {
    _tile_zero(0);
    for (int64_t k = 0; k < K; k += 32) {
      _tile_loadd(1, w + n0 * K + k, 2 * K);
      _tile_loadd(2, xt + k * 8, 64);
      _tile_dpbf16ps(0, 1, 2);
    }
    _tile_stored(0, block, 64);
    for (int r = 0; r < R; ++r) {
      const __m512 v = _mm512_i32gather_ps(across, block + r, 4);
      if constexpr (std::is_same_v<Out, float>)
        _mm512_storeu_ps(out + r * N + n0, v);
      else
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * N + n0), (__m256i)_mm512_cvtneps_pbh(v));
    }
  }
  _tile_release();
}

// x [R, K] bf16 as AMX's B operand: [K / 32][16 column pairs][16 rows] of bf16 pairs, rows past R zero.
std::vector<uint32_t> pack_rows(const uint16_t* x, int R, int64_t K) {
  std::vector<uint32_t> xt(K * 8, 0u);
  for (int r = 0; r < R; ++r) {
    const auto* pairs = reinterpret_cast<const uint32_t*>(x + r * K);
    for (int64_t p = 0; p < K / 2; ++p) xt[(p / 16) * 256 + (p % 16) * 16 + r] = pairs[p];
  }
  return xt;
}

template <int R, typename Out>
void run_rows(Isa isa, const float* xf, const uint16_t* xb, const uint16_t* w, int64_t K, int64_t N, Out* out) {
  // Blocks of 16 weight rows, the last N % 16 as AVX-512. Under 512 rows (a k or v projection alone) the tile set-up
  // cost more than it saved (analysis/fast_path_amx_matvec_cpu_amx/).
  if (isa == AMX_BF16 && R >= 2 && K % 32 == 0 && N >= 512) {
    const std::vector<uint32_t> xt = pack_rows(xb, R, K);
    const int64_t blocks = N / 16;
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      rows_amx<Out>(xt.data(), R, w, K, 16 * begin, 16 * end, N, out);
    });
    if (blocks * 16 < N) rows_avx512<R>(xb, w, K, blocks * 16, N, N, out);
    return;
  }
  at::parallel_for(0, N, GRAIN, [&](int64_t begin, int64_t end) {
    if (isa != AVX2)
      rows_avx512<R>(xb, w, K, begin, end, N, out);
    else if constexpr (R >= 2 && R <= 6)
      row_pairs_avx2<R>(xf, w, K, begin, end, N, out);
    else
      rows_avx2<R>(xf, w, K, begin, end, N, out);
  });
}

template <typename Out>
using RowsFn = void (*)(Isa, const float*, const uint16_t*, const uint16_t*, int64_t, int64_t, Out*);
template <typename Out>
constexpr RowsFn<Out> ROWS[MAX_ROWS] = {run_rows<1, Out>, run_rows<2, Out>, run_rows<3, Out>, run_rows<4, Out>,
                                        run_rows<5, Out>, run_rows<6, Out>, run_rows<7, Out>, run_rows<8, Out>};

// x [M, K] bf16 or fp32 @ weight [N, K] bf16 .T (+ bias [N]) -> [M, N] in x's dtype. isa: 0 auto, 1 AVX2, 2 AVX-512, 3 AMX.
at::Tensor bf16_matvec(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       int64_t isa_arg) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "bf16_matvec: x [M, K] and weight [N, K] with one K; got x ", x.sizes(), ", weight ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16, "bf16_matvec: weight dtype ", weight.scalar_type(),
              "; allowed: bfloat16");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, "bf16_matvec: x dtype ",
              x.scalar_type(), "; allowed: bfloat16, float32");
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu() && weight.is_contiguous(),
              "bf16_matvec: CPU tensors and a contiguous weight");
  const Isa isa = resolve(isa_arg);
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  const auto* w = reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>());
  // Each path reads the activations in its own type: one conversion per call (ggml converts them once too). bf16
  // rows for the AVX2 path are widened here, a pass of rows at a time, not by torch: its conversion and the tensor
  // it allocates cost ~3 us a call, 121 calls a step (analysis/profile_step_cpu_avx512_avx2_path/).
  const bool widen = isa == AVX2 && x.scalar_type() == at::kBFloat16;
  const at::Tensor xs = widen ? x.contiguous() : x.to(isa != AVX2 ? at::kBFloat16 : at::kFloat).contiguous();
  thread_local std::vector<float> wide;  // the caller's, kept: no allocation a call
  const auto pass = static_cast<size_t>(std::min(MAX_ROWS, M) * K);  // floats of one pass of rows
  if (widen && wide.size() < pass) wide.resize(pass);
  // bf16 rows without a bias get their bf16 result written directly (a conversion a call was a visible share of
  // the small k/v layers' time); otherwise fp32 sums, the bias added, then x's dtype.
  const bool direct = x.scalar_type() == at::kBFloat16 && !bias.has_value();
  at::Tensor out = at::empty({M, N}, x.options().dtype(direct ? at::kBFloat16 : at::kFloat));
  for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS) {
    const int64_t rows = std::min(MAX_ROWS, M - m0);
    const float* xf = nullptr;
    if (widen) {
      widen_bf16(reinterpret_cast<const uint16_t*>(xs.data_ptr<at::BFloat16>()) + m0 * K, rows * K, wide.data());
      xf = wide.data();
    } else if (isa == AVX2) {
      xf = xs.data_ptr<float>() + m0 * K;
    }
    const uint16_t* xb = isa != AVX2
                             ? reinterpret_cast<const uint16_t*>(xs.data_ptr<at::BFloat16>()) + m0 * K
                             : nullptr;
    if (direct)
      ROWS<c10::BFloat16>[rows - 1](isa, xf, xb, w, K, N, out.data_ptr<at::BFloat16>() + m0 * N);
    else
      ROWS<float>[rows - 1](isa, xf, xb, w, K, N, out.data_ptr<float>() + m0 * N);
  }
  if (direct) return out;
  if (bias.has_value()) out.add_(bias->to(at::kFloat));
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace

// The path `isa` (0 auto) resolves to, checked as the matvec checks it: the `bf16_isa` op, and cpu_stream.cpp's read
// probes' path.
int64_t specbench_bf16_resolve(int64_t isa) { return resolve(isa); }

TORCH_LIBRARY_FRAGMENT(specbench, m) {
  m.def("bf16_matvec(Tensor x, Tensor weight, Tensor? bias, int isa=0) -> Tensor");
  m.def("bf16_isa(int isa=0) -> int", &specbench_bf16_resolve);
}

TORCH_LIBRARY_IMPL(specbench, CPU, m) {
  m.impl("bf16_matvec", &bf16_matvec);
}
