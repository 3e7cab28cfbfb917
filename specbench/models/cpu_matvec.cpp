// Weight-only int8 and int4 products for a CPU decode step (a few rows against a large weight), AVX2 + FMA.
//
// torch has no fast path for these with float32 activations on AVX2 CPUs: its int8 kernel takes bf16 only
// and its int4 kernel runs compute-bound there, so a quantized draft cost more than the fp32 target. Here
// each row of x is quantized to int8 per block of 32 (one float scale per block, as llama.cpp's Q8_0), so
// a block's dot product is one maddubs + madd pair and the step streams its weights at memory speed. The
// rounding only changes what the draft proposes; the target verifies every token. int8 also takes bf16 activations
// (a bf16 W8A16 draft: torch's int8 kernel streamed it at about half this one's rate) and has an AVX-512 VNNI path.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

bool specbench_aten_allows_avx512();  // cpu_bf16.cpp: torch's kernel level is AVX-512 (ATEN_CPU_CAPABILITY)

namespace {

constexpr int64_t BLOCK = 32;            // input channels per activation scale (an int4 weight group: 1, 2, 4... of them)
constexpr int64_t PREFETCH_BYTES = 8192;  // how far ahead on the weight stream to prefetch (into L2)
constexpr int64_t GRAIN = 16;             // output rows per parallel chunk, at least

struct QuantizedRows {  // x [M, K] as int8 per block: q [M, K], scale [M, K/32], sum of q [M, K/32]
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<float> sum;
};

inline float horizontal_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline int32_t horizontal_sum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(_mm_hadd_ps(s, s));
}

// Rounds as std::nearbyint does (to nearest, ties to even), 8 lanes at a time: the scalar loop it replaced
// cost 1-3 us a call, as much as streaming a k/v projection's weights.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {  // 8 bf16 -> 8 fp32: the bits moved to the high half
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

// x float32 or bf16 (read as it is: a W8A16 layer's bf16 rows are not copied to float32 first)
template <typename T>
QuantizedRows quantize_rows(const T* x, int64_t rows, int64_t k) {
  const int64_t blocks = k / BLOCK;
  QuantizedRows out{std::vector<int8_t>(rows * k), std::vector<float>(rows * blocks), std::vector<float>(rows * blocks)};
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i lane_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the packs' per-lane interleave
  for (int64_t b = 0; b < rows * blocks; ++b) {
    const T* src = x + b * BLOCK;
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = load8(src + 8 * i);
    const __m256 m01 = _mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask));
    const __m256 m23 = _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask));
    const float amax = horizontal_max(_mm256_max_ps(m01, m23));
    const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    __m256i q[4];
    for (int i = 0; i < 4; ++i)
      q[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q.data() + b * BLOCK), _mm256_permutevar8x32_epi32(packed, lane_order));
    out.scale[b] = amax / 127.f;
    const __m256i total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    out.sum[b] = static_cast<float>(horizontal_sum(total));
  }
  return out;
}

// The weight stream is prefetched into L2, 8 KB ahead: a plain AVX2 read loop over 96 MB ran at 22 GB/s
// with no prefetch and 27 GB/s with this one (AMX Xeon, 2 threads); prefetched into L1 it slowed past 2 KB.
inline void prefetch(const void* p, const void* end) {
  if (p < end) _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1);
}

// One block of 32: sum_i x[i] * w[i] as 8 int32 lanes, converted. maddubs multiplies unsigned by
// signed bytes, so x's sign moves onto w.
inline __m256 int8_block_dot(const int8_t* w, const int8_t* x, __m256i ones) {
  const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(wv, xv));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
}

inline __m256 int4_block_dot(__m256i q, const int8_t* x, __m256i ones) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), ones));
}

void check_x(const at::Tensor& x, int64_t k, const char* op, bool bf16_too = false) {
  const bool dtype_ok = x.scalar_type() == at::kFloat || (bf16_too && x.scalar_type() == at::kBFloat16);
  TORCH_CHECK(x.dim() == 2 && dtype_ok && x.is_contiguous(), op, ": x must be a contiguous ",
              bf16_too ? "float32 or bfloat16" : "float32", " [rows, in_features] tensor, got ", x.sizes(), " ",
              x.scalar_type());
  TORCH_CHECK(x.size(1) == k && k % BLOCK == 0, op, ": x has ", x.size(1), " columns, the weight ", k,
              " (a multiple of ", BLOCK, " is required)");
}

// AVX-512 VNNI where the CPU has it and torch's kernel level is AVX-512 (ATEN_CPU_CAPABILITY=avx2 forces the
// AVX2 path, as it does torch's); the function carries its own target attribute, so the extension still loads on
// any AVX2 machine.
bool use_vnni() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vnni") && specbench_aten_allows_avx512();
  return yes;
}

// A W8A16 layer's per-channel scales and its output, in float32 or bf16 (its activations' dtype), read and written
// as they are: three dtype conversions a call cost a draft step a sixth of its time (scripts/profile_step.py).
struct Scales {
  const float* f32;
  const c10::BFloat16* bf16;
  float operator[](int64_t n) const { return f32 ? f32[n] : static_cast<float>(bf16[n]); }
};
struct Out {
  float* f32;
  c10::BFloat16* bf16;
  void store(int64_t i, float v) const {
    if (f32)
      f32[i] = v;
    else
      bf16[i] = c10::BFloat16(v);
  }
};

// x's int8 rows as the VNNI path reads them, per 64 bytes (two blocks): |q| as unsigned bytes and a bit per byte
// where q < 0 (vpdpbusd multiplies unsigned by signed bytes, so x's sign moves onto w), and each int32 lane's block
// scale (lanes 0-7: the first block, 8-15: the second). Rows padded to whole 64 bytes with zeros.
struct VnniRows {
  int64_t chunks;
  __mmask64 tail;  // the bytes of the last chunk that are in the row
  std::vector<uint8_t> mag;   // [M, chunks * 64]
  std::vector<uint64_t> neg;  // [M, chunks]
  std::vector<float> lanes;   // [M, chunks * 16]
};

__attribute__((target("avx512f,avx512bw"))) VnniRows vnni_rows(const QuantizedRows& xq, int64_t rows, int64_t k) {
  const int64_t chunks = (k + 63) / 64, blocks = k / BLOCK;
  const __mmask64 tail = (k % 64) ? ((1ull << (k % 64)) - 1) : ~0ull;
  VnniRows v{chunks, tail, std::vector<uint8_t>(rows * chunks * 64, 0), std::vector<uint64_t>(rows * chunks, 0),
             std::vector<float>(rows * chunks * 16, 0.f)};
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t c = 0; c < chunks; ++c) {
      const __m512i q = _mm512_maskz_loadu_epi8(c + 1 == chunks ? tail : ~0ull, xq.q.data() + m * k + c * 64);
      _mm512_storeu_si512(v.mag.data() + (m * chunks + c) * 64, _mm512_abs_epi8(q));  // |q| <= 127: no overflow
      v.neg[m * chunks + c] = _mm512_movepi8_mask(q);
    }
    for (int64_t b = 0; b < blocks; ++b)
      std::fill_n(v.lanes.data() + m * chunks * 16 + b * 8, 8, xq.scale[m * blocks + b]);
  }
  return v;
}

// R activation rows against weight rows [begin, end): per 64 weight bytes one vpdpbusd a row into fresh int32
// lanes (4 products each, exact), converted and scaled by the lanes' block scales into fp32 sums.
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void int8_rows_vnni(
    const int8_t* w, const int8_t* w_end, int64_t k, int64_t begin, int64_t end, int64_t n_out, const VnniRows& xv,
    int64_t m0, const Scales& s, const Out& out) {
  const int64_t chunks = xv.chunks;
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t n = begin; n < end; ++n) {
    const int8_t* row = w + n * k;
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
      prefetch(row + c * 64 + PREFETCH_BYTES, w_end);
      const __m512i wv = _mm512_maskz_loadu_epi8(c + 1 == chunks ? xv.tail : ~0ull, row + c * 64);
      for (int r = 0; r < R; ++r) {
        const int64_t m = m0 + r;
        const __m512i signed_w = _mm512_mask_sub_epi8(wv, xv.neg[m * chunks + c], zero, wv);
        const __m512i mag = _mm512_loadu_si512(xv.mag.data() + (m * chunks + c) * 64);
        const __m512i dot = _mm512_dpbusd_epi32(zero, mag, signed_w);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_loadu_ps(xv.lanes.data() + (m * chunks + c) * 16),
                                 acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) out.store((m0 + r) * n_out + n, _mm512_reduce_add_ps(acc[r]) * s[n]);
  }
}

constexpr int64_t VNNI_TILE = 4;  // activation rows per pass over the weight on the VNNI path

void int8_vnni(const int8_t* w, int64_t n_out, int64_t k, const QuantizedRows& xq, int64_t rows, const Scales& s,
               const Out& out) {
  const VnniRows xv = vnni_rows(xq, rows, k);
  const int8_t* w_end = w + n_out * k;
  at::parallel_for(0, n_out, GRAIN, [&](int64_t begin, int64_t end) {
    for (int64_t m0 = 0; m0 < rows; m0 += VNNI_TILE) {
      switch (std::min(VNNI_TILE, rows - m0)) {
        case 1: int8_rows_vnni<1>(w, w_end, k, begin, end, n_out, xv, m0, s, out); break;
        case 2: int8_rows_vnni<2>(w, w_end, k, begin, end, n_out, xv, m0, s, out); break;
        case 3: int8_rows_vnni<3>(w, w_end, k, begin, end, n_out, xv, m0, s, out); break;
        default: int8_rows_vnni<4>(w, w_end, k, begin, end, n_out, xv, m0, s, out); break;
      }
    }
  });
}

// y[m, n] = scale[n] * sum_k x[m, k] * weight[n, k]; weight int8 [N, K]; x float32 or bfloat16 and scale float32
// or x's dtype (a W8A16 layer's), y in x's dtype.
at::Tensor int8_matvec(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale) {
  const int64_t rows = x.size(0), n_out = weight.size(0), k = weight.size(1), blocks = k / BLOCK;
  check_x(x, k, "specbench::int8_matvec", /*bf16_too=*/true);
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.is_contiguous() && scale.is_contiguous() &&
                  (scale.scalar_type() == at::kFloat || scale.scalar_type() == x.scalar_type()) &&
                  scale.numel() == n_out,
              "specbench::int8_matvec: weight must be contiguous int8 [N, K] and scale float32 or x's dtype [N]");
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const QuantizedRows xq = bf16 ? quantize_rows(x.data_ptr<c10::BFloat16>(), rows, k)
                                : quantize_rows(x.data_ptr<float>(), rows, k);
  auto y = at::empty({rows, n_out}, x.options());
  const int8_t* w = weight.data_ptr<int8_t>();
  const int8_t* w_end = w + n_out * k;
  const bool scale_f32 = scale.scalar_type() == at::kFloat;
  const Scales s{scale_f32 ? scale.data_ptr<float>() : nullptr,
                 scale_f32 ? nullptr : scale.data_ptr<c10::BFloat16>()};
  const Out out{bf16 ? nullptr : y.data_ptr<float>(), bf16 ? y.data_ptr<c10::BFloat16>() : nullptr};
  if (use_vnni()) {
    int8_vnni(w, n_out, k, xq, rows, s, out);
    return y;
  }
  const __m256i ones = _mm256_set1_epi16(1);
  at::parallel_for(0, n_out, GRAIN, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int8_t* row = w + n * k;
      for (int64_t m = 0; m < rows; ++m) {
        const int8_t* xr = xq.q.data() + m * k;
        const float* xs = xq.scale.data() + m * blocks;
        // two accumulators: one FMA chain would wait on its own latency every block
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        int64_t b = 0;
        for (; b + 1 < blocks; b += 2) {
          if (m == 0) prefetch(row + b * BLOCK + PREFETCH_BYTES, w_end);
          acc0 = _mm256_fmadd_ps(int8_block_dot(row + b * BLOCK, xr + b * BLOCK, ones), _mm256_broadcast_ss(xs + b), acc0);
          acc1 = _mm256_fmadd_ps(int8_block_dot(row + (b + 1) * BLOCK, xr + (b + 1) * BLOCK, ones),
                                 _mm256_broadcast_ss(xs + b + 1), acc1);
        }
        if (b < blocks)
          acc0 = _mm256_fmadd_ps(int8_block_dot(row + b * BLOCK, xr + b * BLOCK, ones), _mm256_broadcast_ss(xs + b), acc0);
        out.store(m * n_out + n, horizontal_sum(_mm256_add_ps(acc0, acc1)) * s[n]);
      }
    }
  });
  return y;
}

// x's int8 blocks in the order the int4 kernel reads them: per pair of blocks (b, b + 1), 64 bytes: first the
// bytes that meet the low nibbles, then those that meet the high ones, in 4-byte groups alternating between the
// two blocks (b's 0-3, b+1's 0-3, b's 4-7, ...); an odd last block stays as it is. `pack_nibbles` lays the
// weights out the same way, so one maddubs covers two blocks with no permute, and the madd's 8 lanes alternate
// b, b + 1: their two scales are one 8-byte broadcast.
std::vector<int8_t> pair_order(const std::vector<int8_t>& q, int64_t rows, int64_t k) {
  std::vector<int8_t> out(q.size());
  const int64_t blocks = k / BLOCK;
  for (int64_t m = 0; m < rows; ++m) {
    const int8_t* src = q.data() + m * k;
    int8_t* dst = out.data() + m * k;
    int64_t b = 0;
    for (; b + 1 < blocks; b += 2, src += 2 * BLOCK, dst += 2 * BLOCK)
      for (int half = 0; half < 2; ++half)      // low nibbles' x, then high nibbles'
        for (int g = 0; g < 4; ++g)             // 4-byte group within the half block
          for (int c = 0; c < 2; ++c)           // block b, then b + 1
            std::memcpy(dst + 32 * half + 8 * g + 4 * c, src + BLOCK * c + 16 * half + 4 * g, 4);
    if (b < blocks) std::memcpy(dst, src, BLOCK);
  }
  return out;
}

// One weight row of the int4 product against TILE activation rows (x in `pair_order`, d [TILE, blocks]: x's block
// scale times the weight group's): out[t] = sum_b d[t, b] * (q[b] . x[t, b]). Each 32-byte pair of nibble blocks is
// loaded and unpacked once for all TILE rows: the unpack is a third of a row's instructions, so 2 rows (a batch, or
// a draft's own catch-up of two tokens) cost ~1.6x one row when each unpacked its own. Two accumulators a row up
// to 2 rows, so consecutive FMAs never wait on each other; the rows themselves are independent chains beyond that.
template <int TILE>
inline void int4_row(const uint8_t* row, const uint8_t* w_end, const int8_t* x, int64_t k, const float* d,
                     int64_t blocks, bool lead, float* out) {
  constexpr int SPLIT = TILE <= 2 ? 2 : 1;
  const __m256i ones = _mm256_set1_epi16(1), mask = _mm256_set1_epi8(0x0F);
  __m256 acc[TILE][SPLIT];
  for (int t = 0; t < TILE; ++t)
    for (int s = 0; s < SPLIT; ++s) acc[t][s] = _mm256_setzero_ps();
  // 32 bytes: blocks b and b + 1; 8 int32 lanes alternating b, b + 1, scaled by (d[b], d[b + 1]) repeated
  auto pair_fma = [&](int64_t b, int s) {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * BLOCK / 2));
    const __m256i low4 = _mm256_and_si256(packed, mask);
    const __m256i high4 = _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask);
    for (int t = 0; t < TILE; ++t) {
      const int8_t* xt = x + t * k + b * BLOCK;
      const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt));
      const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xt + 32));
      // int16 sums of 4 products of 0..15 by -127..127: at most 7620, no saturation
      const __m256i sums = _mm256_add_epi16(_mm256_maddubs_epi16(low4, xa), _mm256_maddubs_epi16(high4, xb));
      const __m256 scales = _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(d + t * blocks + b)));
      acc[t][s] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(sums, ones)), scales, acc[t][s]);
    }
  };
  int64_t b = 0;
  for (; b + 3 < blocks; b += 4) {
    if (lead) prefetch(row + b * BLOCK / 2 + PREFETCH_BYTES, w_end);
    pair_fma(b, 0);
    pair_fma(b + 2, SPLIT - 1);
  }
  if (b + 1 < blocks) {
    pair_fma(b, 0);
    b += 2;
  }
  if (b < blocks) {  // an odd last block: byte i holds q[i] low and q[16 + i] high
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * BLOCK / 2));
    const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), mask);
    for (int t = 0; t < TILE; ++t)
      acc[t][0] = _mm256_fmadd_ps(int4_block_dot(q, x + t * k + b * BLOCK, ones), _mm256_broadcast_ss(d + t * blocks + b),
                                  acc[t][0]);
  }
  for (int t = 0; t < TILE; ++t) out[t] = horizontal_sum(SPLIT == 2 ? _mm256_add_ps(acc[t][0], acc[t][SPLIT - 1]) : acc[t][0]);
}

constexpr int64_t SCALES_AHEAD = 16;  // rows ahead to prefetch an int4 weight's group scales and low ends
constexpr int64_t ROW_TILE = 4;  // activation rows a weight row is unpacked for at once (16 AVX2 registers)

// y[m, n] = sum_k x[m, k] * (q[n, k] * scale[n, k / G] + low[n, k / G]), q in 0..15, G the weight group: 32 times
// the smallest power of two `per` with ceil(K / 32 / per) = scale's columns (a last group may be shorter, as GPTQ's
// where K is not a multiple of G). nibbles uint8 [N, K / 2] in `pack_nibbles`' order (per pair of blocks as
// `pair_order`; an odd last block: byte i holds q[i] low and q[16 + i] high).
at::Tensor int4_matvec(const at::Tensor& x, const at::Tensor& nibbles, const at::Tensor& scale, const at::Tensor& low) {
  const int64_t rows = x.size(0), n_out = nibbles.size(0), k = nibbles.size(1) * 2, blocks = k / BLOCK;
  check_x(x, k, "specbench::int4_matvec");
  TORCH_CHECK(nibbles.scalar_type() == at::kByte && nibbles.is_contiguous(),
              "specbench::int4_matvec: nibbles must be contiguous uint8 [N, K/2]");
  const int64_t groups = scale.dim() == 2 ? scale.size(1) : 0;
  int64_t per = 1;  // activation blocks per weight group
  while (groups > 0 && (blocks + per - 1) / per > groups) per *= 2;
  for (const auto* t : {&scale, &low})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 && t->size(0) == n_out &&
                    t->size(1) == groups && groups > 0 && (blocks + per - 1) / per == groups,
                "specbench::int4_matvec: scale and low must be contiguous float32 [N, ceil(K/G)], G 32 times a power "
                "of two; got ", scale.sizes(), " and ", low.sizes(), " for K = ", k);
  const QuantizedRows xq = quantize_rows(x.data_ptr<float>(), rows, k);
  const std::vector<int8_t> xo = pair_order(xq.q, rows, k);
  // per row and weight group: x's block scales times block sums, summed over the group's blocks (what the group's
  // low end adds)
  std::vector<float> x_low(rows * groups, 0.f);
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t b = 0; b < blocks; ++b) x_low[m * groups + b / per] += xq.scale[m * blocks + b] * xq.sum[m * blocks + b];
  auto y = at::empty({rows, n_out}, x.options());
  const uint8_t* w = nibbles.data_ptr<uint8_t>();
  const uint8_t* w_end = w + n_out * (k / 2);
  const float* sc = scale.data_ptr<float>();
  const float* lo = low.data_ptr<float>();
  float* out = y.data_ptr<float>();
  at::parallel_for(0, n_out, GRAIN, [&](int64_t begin, int64_t end) {
    std::vector<float> d(ROW_TILE * blocks);  // per tile row and block: x's scale times the weight group's
    float offset[ROW_TILE], dots[ROW_TILE];
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* row = w + n * (k / 2);
      const float* row_scale = sc + n * groups;
      const float* row_low = lo + n * groups;
      // the group scales and low ends are two more streams, read first thing in a row: fetched 16 rows ahead, a
      // pass over a draft's 80 MB of int4 weights after a 1 GB read took 3.6 ms against 3.8 (median of 37)
      prefetch(row_scale + SCALES_AHEAD * groups, sc + n_out * groups);
      prefetch(row_low + SCALES_AHEAD * groups, lo + n_out * groups);
      for (int64_t m0 = 0; m0 < rows; m0 += ROW_TILE) {
        const int64_t tile = std::min(ROW_TILE, rows - m0);
        for (int64_t t = 0; t < tile; ++t) {
          const float* xs = xq.scale.data() + (m0 + t) * blocks;
          const float* xl = x_low.data() + (m0 + t) * groups;
          float* dt = d.data() + t * blocks;
          // the groups' low ends: sum_g low[n, g] * x_low[g], 8 groups a step, out of the nibble loop
          __m256 lows = _mm256_setzero_ps();
          int64_t g = 0;
          for (; g + 8 <= groups; g += 8)
            lows = _mm256_fmadd_ps(_mm256_loadu_ps(row_low + g), _mm256_loadu_ps(xl + g), lows);
          offset[t] = horizontal_sum(lows);
          for (; g < groups; ++g) offset[t] += row_low[g] * xl[g];
          if (per == 1) {  // a scale per block: 8 blocks a step
            int64_t b = 0;
            for (; b + 8 <= blocks; b += 8)
              _mm256_storeu_ps(dt + b, _mm256_mul_ps(_mm256_loadu_ps(xs + b), _mm256_loadu_ps(row_scale + b)));
            for (; b < blocks; ++b) dt[b] = xs[b] * row_scale[b];
          } else {
            for (int64_t b = 0; b < blocks; ++b) dt[b] = xs[b] * row_scale[b / per];
          }
        }
        const int8_t* xt = xo.data() + m0 * k;
        const bool lead = m0 == 0;  // the first tile prefetches the weight stream
        switch (tile) {
          case 1: int4_row<1>(row, w_end, xt, k, d.data(), blocks, lead, dots); break;
          case 2: int4_row<2>(row, w_end, xt, k, d.data(), blocks, lead, dots); break;
          case 3: int4_row<3>(row, w_end, xt, k, d.data(), blocks, lead, dots); break;
          default: int4_row<4>(row, w_end, xt, k, d.data(), blocks, lead, dots); break;
        }
        for (int64_t t = 0; t < tile; ++t) out[(m0 + t) * n_out + n] = dots[t] + offset[t];
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
