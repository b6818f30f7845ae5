// Row-exact W4A8 product for CPU (models/w4a8.py builds and loads this file; the arithmetic is described there).
//
// Weights: blocks of 8 outputs x 32 inputs (one group), 160 bytes each, laid out [N/8][K/32][160]:
//   bytes 0..127: 4 chunks of 32 bytes; chunk c, byte o*4+j holds output o's weights at k = 32g + 8c + j (low
//   nibble) and 32g + 8c + 4 + j (high nibble), j = 0..3, each an unsigned 0..15;
//   bytes 128..143: the 8 outputs' group scales, 144..159: their group offsets (IEEE half).
// Rows: int8 in [-127, 127] in groups of 32, each group of each row by its own max |x| (scale xs = max|x| / 127).
// y[m, n] = sum over groups g, in order, of (dot_g * (s[n,g] * xs[m,g]) + o[n,g] * xsum[m,g]) (+ bias[n]), where
// dot_g is the exact int32 sum of q * xq over the group and xsum[m,g] = xs[m,g] * (the group's sum of xq). Every row runs the same operations whatever the other rows are,
// and the AVX2 path and the plain loop give the same bits (exact integer sums, then the same float operations in the
// same order; built with -ffp-contract=off).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(W4A8_PLAIN)
#include <immintrin.h>
#define W4A8_AVX2 1
#endif

namespace {

constexpr int64_t kOut = 8, kGroup = 32, kBlock = 160, kTile = 32;  // kTile: rows per pass over the weights

float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) { man <<= 1; --exp; }
      bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// One row: xq (padded to kp with zeros), each group's scale, and each group's sum times its scale.
void quantize_row(const float* x, int64_t k, int64_t kp, int8_t* xq, float* xs, float* xsum) {
  for (int64_t g = 0; g < kp / kGroup; ++g) {
    const int64_t a = g * kGroup, b = std::min(k, a + kGroup);
    float amax = 0.f;
    for (int64_t i = a; i < b; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    int32_t sum = 0;
    for (int64_t i = a; i < a + kGroup; ++i) {  // clamped: a NaN or inf gives defined (meaningless) values
      xq[i] = i < b ? static_cast<int8_t>(std::fmin(std::fmax(std::nearbyint(x[i] * inv), -127.f), 127.f)) : 0;
      sum += xq[i];
    }
    xs[g] = amax / 127.f;
    xsum[g] = static_cast<float>(sum) * xs[g];
  }
}

// acc[m][o] over the groups of one block row of outputs, rows [m0, m1).
void block_rows(const uint8_t* w, int64_t groups, const int8_t* xq, int64_t kp, const float* xs, const float* xsum,
                int64_t m0, int64_t m1, float* acc) {
  const int64_t rows = m1 - m0;
#ifdef W4A8_AVX2
  for (int64_t r = 0; r < rows; ++r) _mm256_storeu_ps(acc + r * kOut, _mm256_setzero_ps());
  const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < groups; ++g, w += kBlock) {
    // one stream from memory: asking 16 groups ahead reads it ~20 % faster than the hardware prefetcher alone
    for (int line = 0; line < kBlock; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(w + 16 * kBlock + line), _MM_HINT_T0);
    __m256i q[8];
    for (int c = 0; c < 4; ++c) {
      __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * c));
      q[2 * c] = _mm256_and_si256(b, low);
      q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
    }
    const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 128)));
    const __m256 o = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 144)));
    for (int64_t r = 0; r < rows; ++r) {
      const int8_t* xr = xq + (m0 + r) * kp + g * kGroup;
      // 16 products of <= 15 * 127 per int16 lane: |sum| <= 30480 < 32767, no saturation
      __m256i d = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        int32_t lo, hi;
        std::memcpy(&lo, xr + 8 * c, 4);
        std::memcpy(&hi, xr + 8 * c + 4, 4);
        d = _mm256_add_epi16(d, _mm256_maddubs_epi16(q[2 * c], _mm256_set1_epi32(lo)));
        d = _mm256_add_epi16(d, _mm256_maddubs_epi16(q[2 * c + 1], _mm256_set1_epi32(hi)));
      }
      const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(d, ones));
      const int64_t at = (m0 + r) * (kp / kGroup) + g;
      __m256 a = _mm256_loadu_ps(acc + r * kOut);
      a = _mm256_fmadd_ps(dot, _mm256_mul_ps(s, _mm256_set1_ps(xs[at])), a);
      a = _mm256_fmadd_ps(o, _mm256_set1_ps(xsum[at]), a);
      _mm256_storeu_ps(acc + r * kOut, a);
    }
  }
#else
  for (int64_t i = 0; i < rows * kOut; ++i) acc[i] = 0.f;
  for (int64_t g = 0; g < groups; ++g, w += kBlock) {
    uint16_t hs[16];
    std::memcpy(hs, w + 128, 32);
    for (int64_t r = 0; r < rows; ++r) {
      const int8_t* xr = xq + (m0 + r) * kp + g * kGroup;
      const int64_t at = (m0 + r) * (kp / kGroup) + g;
      for (int64_t n = 0; n < kOut; ++n) {
        int32_t dot = 0;
        for (int c = 0; c < 4; ++c)
          for (int j = 0; j < 4; ++j) {
            const uint8_t b = w[32 * c + 4 * n + j];
            dot += (b & 0x0f) * xr[8 * c + j] + (b >> 4) * xr[8 * c + 4 + j];
          }
        float a = acc[r * kOut + n];
        a = std::fma(static_cast<float>(dot), half_to_float(hs[n]) * xs[at], a);
        a = std::fma(half_to_float(hs[8 + n]), xsum[at], a);
        acc[r * kOut + n] = a;
      }
    }
  }
#endif
}

void check_packed(const at::Tensor& packed, int64_t n, int64_t k) {
  TORCH_CHECK(packed.dtype() == at::kByte && packed.is_contiguous() && packed.dim() == 3, "w4a8: bad packed weight");
  TORCH_CHECK(packed.size(0) * kOut >= n && packed.size(1) * kGroup >= k && packed.size(2) == kBlock,
              "w4a8: packed weight does not match n, k");
}

// float [M, K] -> (int8 [M, Kp], float [M, Kp/32] group scales, float [M, Kp/32] scaled group sums)
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x_, int64_t kp) {
  TORCH_CHECK(x_.dim() == 2 && x_.dtype() == at::kFloat, "w4a8: rows must be float32 [M, K]");
  at::Tensor x = x_.contiguous();
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(kp >= k && kp % kGroup == 0, "w4a8: bad padded K");
  at::Tensor xq = at::empty({m, kp}, x.options().dtype(at::kChar));
  at::Tensor xs = at::empty({m, kp / kGroup}, x.options());
  at::Tensor xsum = at::empty({m, kp / kGroup}, x.options());
  for (int64_t r = 0; r < m; ++r)
    quantize_row(x.data_ptr<float>() + r * k, k, kp, xq.data_ptr<int8_t>() + r * kp,
                 xs.data_ptr<float>() + r * (kp / kGroup),
                 xsum.data_ptr<float>() + r * (kp / kGroup));
  return {xq, xs, xsum};
}

at::Tensor mm_quantized(const at::Tensor& xq, const at::Tensor& xs, const at::Tensor& xsum, const at::Tensor& packed,
                        int64_t n, const c10::optional<at::Tensor>& bias) {
  const int64_t m = xq.size(0), kp = xq.size(1), groups = packed.size(1), blocks = packed.size(0);
  check_packed(packed, n, 1);
  TORCH_CHECK(xq.dtype() == at::kChar && xq.is_contiguous() && kp == groups * kGroup, "w4a8: bad rows");
  TORCH_CHECK(xs.dtype() == at::kFloat && xs.is_contiguous() && xs.numel() == m * groups, "w4a8: bad scales");
  TORCH_CHECK(xsum.dtype() == at::kFloat && xsum.is_contiguous() && xsum.numel() == m * groups, "w4a8: bad sums");
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.dtype() == at::kFloat && b.numel() == n, "w4a8: bad bias");
  }
  at::Tensor y = at::empty({m, n}, xs.options());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const int8_t* q = xq.data_ptr<int8_t>();
  const float *s = xs.data_ptr<float>(), *sums = xsum.data_ptr<float>();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  float* out = y.data_ptr<float>();
  // each output is made by one thread with the same operations whatever the split: threads do not change bits
  at::parallel_for(0, blocks, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(kTile * kOut);
    for (int64_t m0 = 0; m0 < m; m0 += kTile) {
      const int64_t m1 = std::min(m, m0 + kTile);
      for (int64_t nb = begin; nb < end; ++nb) {
        block_rows(w + nb * groups * kBlock, groups, q, kp, s, sums, m0, m1, acc.data());
        const int64_t n0 = nb * kOut, cols = std::min(kOut, n - n0);
        for (int64_t r = m0; r < m1; ++r)
          for (int64_t c = 0; c < cols; ++c) {
            const float v = acc[(r - m0) * kOut + c];
            out[r * n + n0 + c] = bp ? v + bp[n0 + c] : v;
          }
      }
    }
  });
  return y;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, const c10::optional<at::Tensor>& bias) {
  auto [xq, xs, xsum] = quantize_rows(x, packed.size(1) * kGroup);
  return mm_quantized(xq, xs, xsum, packed, n, bias);
}

bool avx2() {
#ifdef W4A8_AVX2
  return true;
#else
  return false;
#endif
}

}  // namespace

TORCH_LIBRARY(multispec_w4a8, m) {
  m.def("quantize_rows(Tensor x, int kp) -> (Tensor, Tensor, Tensor)", &quantize_rows);
  m.def("mm_quantized(Tensor xq, Tensor xs, Tensor xsum, Tensor packed, int n, Tensor? bias) -> Tensor",
        &mm_quantized);
  m.def("linear(Tensor x, Tensor packed, int n, Tensor? bias) -> Tensor", &linear);
  m.def("avx2() -> bool", &avx2);
}
