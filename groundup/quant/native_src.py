"""The C++ source of groundup's native CPU kernels (quant/native.py builds and loads it; the docstring there
says what each op computes and why). Only ATen's core headers are included, not <torch/extension.h>
(which pulls in all of libtorch's and pybind11's headers): a build then takes seconds, not half a minute."""

SOURCE = r"""#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <algorithm>
#include <vector>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace {
constexpr int64_t NR = 4;  // output channels per tile

// One SIMD vector of floats: AVX-512 (16 lanes) or AVX2 + FMA (8 lanes); VW = 0: scalar loops only.
#if defined(__AVX512F__)
constexpr int64_t VW = 16;
typedef __m512 vf;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf vset(float s) { return _mm512_set1_ps(s); }
inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
inline vf _add4(vf a, vf b, vf c, vf d) { return _mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)); }
inline vf vi8(const int8_t* p) {  // 16 int8 -> 16 floats
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline void vu4(const uint8_t* p, vf& lo, vf& hi) {  // 16 bytes -> their low and high nibbles
  __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  lo = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)));
  hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int64_t VW = 8;
typedef __m256 vf;
inline vf vzero() { return _mm256_setzero_ps(); }
inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf vset(float s) { return _mm256_set1_ps(s); }
inline float vsum(vf v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline vf _add4(vf a, vf b, vf c, vf d) { return _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)); }
inline vf vi8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline void vu4(const uint8_t* p, vf& lo, vf& hi) {
  __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  lo = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
  hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}
#else
constexpr int64_t VW = 0;  // scalar loops only; these stand-ins are never called
typedef float vf;
inline vf vzero() { return 0.f; }
inline vf vload(const float* p) { return *p; }
inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
inline vf vset(float s) { return s; }
inline float vsum(vf v) { return v; }
inline vf _add4(vf a, vf b, vf c, vf d) { return a + b + c + d; }
inline vf vi8(const int8_t* p) { return float(*p); }
inline void vu4(const uint8_t* p, vf& lo, vf& hi) { lo = float(*p & 15); hi = float(*p >> 4); }
#endif

// y[m, n0 + i] = sum_k x[m, k] w[i, k] over a dequantized tile w (nr x K), MR rows of x at a time.
template <int MR>
void tile_block(const float* x, const float* w, float* y, int64_t m0, int64_t K, int64_t N, int64_t n0) {
  if constexpr (VW > 0) {
    vf acc[MR][NR];
    for (int r = 0; r < MR; r++)
      for (int i = 0; i < NR; i++) acc[r][i] = vzero();
    for (int64_t k = 0; k < K; k += VW) {
      vf wv[NR];
      for (int i = 0; i < NR; i++) wv[i] = vload(w + i * K + k);
      for (int r = 0; r < MR; r++) {
        vf xv = vload(x + (m0 + r) * K + k);
        for (int i = 0; i < NR; i++) acc[r][i] = vfma(xv, wv[i], acc[r][i]);
      }
    }
    for (int r = 0; r < MR; r++)
      for (int i = 0; i < NR; i++) y[(m0 + r) * N + n0 + i] = vsum(acc[r][i]);
  }
}

void tile_rows(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t nr) {
  int64_t m = 0;
  if (VW > 0 && nr == NR && K % (VW > 0 ? VW : 1) == 0) {
    constexpr int MR = VW == 16 ? 4 : 2;
    for (; m + MR <= M; m += MR) tile_block<MR>(x, w, y, m, K, N, n0);
    for (; m < M; m++) tile_block<1>(x, w, y, m, K, N, n0);
    return;
  }
  for (; m < M; m++)
    for (int64_t i = 0; i < nr; i++) {
      float acc = 0.f;
      for (int64_t k = 0; k < K; k++) acc += x[m * K + k] * w[i * K + k];
      y[m * N + n0 + i] = acc;
    }
}

at::Tensor check_x(const at::Tensor& x, int64_t K, const char* op) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.size(1) == K, op, ": x must be float32 (M, ", K, ")");
  return x.contiguous();
}

at::Tensor int8_mm(const at::Tensor& x_, const at::Tensor& q_, const at::Tensor& s_) {
  TORCH_CHECK(q_.dim() == 2 && q_.scalar_type() == at::kChar, "int8_mm: qweight must be int8 (N, K)");
  TORCH_CHECK(s_.scalar_type() == at::kFloat && s_.numel() == q_.size(0), "int8_mm: scales must be float32 (N,)");
  const int64_t N = q_.size(0), K = q_.size(1);
  at::Tensor x = check_x(x_, K, "int8_mm"), q = q_.contiguous(), s = s_.contiguous();
  const int64_t M = x.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* sp = s.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t tiles = (N + NR - 1) / NR;
  at::parallel_for(0, tiles, 16, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf;
    for (int64_t t = t0; t < t1; t++) {
      const int64_t n0 = t * NR, nr = std::min(NR, N - n0);
      if constexpr (VW > 0) {
        if (M == 1 && K % (4 * VW) == 0) {  // one row at a time, converted in registers (a single stream)
          for (int64_t n = n0; n < n0 + nr; n++) {
            const int8_t* qn = qp + n * K;
            vf a0 = vzero(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t k = 0; k < K; k += 4 * VW) {
              a0 = vfma(vload(xp + k), vi8(qn + k), a0);
              a1 = vfma(vload(xp + k + VW), vi8(qn + k + VW), a1);
              a2 = vfma(vload(xp + k + 2 * VW), vi8(qn + k + 2 * VW), a2);
              a3 = vfma(vload(xp + k + 3 * VW), vi8(qn + k + 3 * VW), a3);
            }
            yp[n] = vsum(_add4(a0, a1, a2, a3)) * sp[n];
          }
          continue;
        }
        if (M == 1 && nr == NR && K % VW == 0) {  // convert in registers, multiply at once
          vf a[NR];
          for (int i = 0; i < NR; i++) a[i] = vzero();
          for (int64_t k = 0; k < K; k += VW) {
            vf xv = vload(xp + k);
            for (int i = 0; i < NR; i++) a[i] = vfma(xv, vi8(qp + (n0 + i) * K + k), a[i]);
          }
          for (int i = 0; i < NR; i++) yp[n0 + i] = vsum(a[i]) * sp[n0 + i];
          continue;
        }
      }
      buf.resize(NR * K);
      for (int64_t i = 0; i < nr; i++) {
        const int8_t* qi = qp + (n0 + i) * K;
        const float si = sp[n0 + i];
        for (int64_t k = 0; k < K; k++) buf[i * K + k] = float(qi[k]) * si;
      }
      tile_rows(xp, buf.data(), yp, M, K, N, n0, nr);
    }
  });
  return y;
}

at::Tensor int4_mm(const at::Tensor& x_, const at::Tensor& p_, const at::Tensor& s_, const at::Tensor& z_,
                   int64_t g) {
  TORCH_CHECK(p_.dim() == 2 && p_.scalar_type() == at::kByte, "int4_mm: qweight must be uint8 (N, K/2)");
  const int64_t N = p_.size(0), K = 2 * p_.size(1), G = K / g, h = g / 2;
  TORCH_CHECK(g % 32 == 0 && K % g == 0, "int4_mm: group size must be a multiple of 32 dividing K");
  TORCH_CHECK(s_.scalar_type() == at::kFloat && s_.numel() == N * G, "int4_mm: scales must be float32 (N, K/g)");
  TORCH_CHECK(z_.scalar_type() == at::kByte && z_.numel() == N * G, "int4_mm: zeros must be uint8 (N, K/g)");
  at::Tensor x = check_x(x_, K, "int4_mm"), p = p_.contiguous(), s = s_.contiguous(), z = z_.contiguous();
  const int64_t M = x.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const uint8_t* pp = p.data_ptr<uint8_t>();
  const float* sp = s.data_ptr<float>();
  const uint8_t* zp = z.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  std::vector<float> xs(G);  // the activations' group sums (M = 1): the zero points' share
  if (M == 1)
    for (int64_t gi = 0; gi < G; gi++) {
      float acc = 0.f;
      for (int64_t k = gi * g; k < (gi + 1) * g; k++) acc += xp[k];
      xs[gi] = acc;
    }
  const int64_t tiles = (N + NR - 1) / NR;
  at::parallel_for(0, tiles, 16, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf;
    for (int64_t t = t0; t < t1; t++) {
      const int64_t n0 = t * NR, nr = std::min(NR, N - n0);
      if constexpr (VW > 0) {
        if (M == 1 && h % VW == 0) {  // one row at a time (a single stream)
          for (int64_t n = n0; n < n0 + nr; n++) {
            const uint8_t* pn = pp + n * (K / 2);
            vf a0 = vzero(), a1 = a0;
            float zterm = 0.f;
            for (int64_t gi = 0; gi < G; gi++) {
              const float* xl = xp + gi * g;
              vf d0 = vzero(), d1 = d0;
              for (int64_t j = 0; j < h; j += VW) {
                vf lo, hi;
                vu4(pn + gi * h + j, lo, hi);
                d0 = vfma(vload(xl + j), lo, d0);
                d1 = vfma(vload(xl + h + j), hi, d1);
              }
              const float si = sp[n * G + gi];
              a0 = vfma(d0, vset(si), a0);
              a1 = vfma(d1, vset(si), a1);
              zterm += si * float(zp[n * G + gi]) * xs[gi];
            }
            yp[n] = vsum(_add4(a0, a1, vzero(), vzero())) - zterm;
          }
          continue;
        }
        if (M == 1 && nr == NR && h % VW == 0) {
          vf acc[NR];
          float zterm[NR] = {0.f, 0.f, 0.f, 0.f};
          for (int i = 0; i < NR; i++) acc[i] = vzero();
          for (int64_t gi = 0; gi < G; gi++) {
            const float* xl = xp + gi * g;
            vf d[NR];
            for (int i = 0; i < NR; i++) d[i] = vzero();
            for (int64_t j = 0; j < h; j += VW) {
              vf vl = vload(xl + j), vh = vload(xl + h + j);
              for (int i = 0; i < NR; i++) {
                vf lo, hi;
                vu4(pp + (n0 + i) * (K / 2) + gi * h + j, lo, hi);
                d[i] = vfma(vh, hi, vfma(vl, lo, d[i]));
              }
            }
            for (int i = 0; i < NR; i++) {
              const float si = sp[(n0 + i) * G + gi];
              acc[i] = vfma(d[i], vset(si), acc[i]);
              zterm[i] += si * float(zp[(n0 + i) * G + gi]) * xs[gi];
            }
          }
          for (int i = 0; i < NR; i++) yp[n0 + i] = vsum(acc[i]) - zterm[i];
          continue;
        }
      }
      buf.resize(NR * K);
      for (int64_t i = 0; i < nr; i++) {
        const int64_t n = n0 + i;
        for (int64_t gi = 0; gi < G; gi++) {
          const float si = sp[n * G + gi], zi = float(zp[n * G + gi]);
          const uint8_t* b = pp + n * (K / 2) + gi * h;
          float* w = buf.data() + i * K + gi * g;
          for (int64_t j = 0; j < h; j++) {
            w[j] = (float(b[j] & 15) - zi) * si;
            w[h + j] = (float(b[j] >> 4) - zi) * si;
          }
        }
      }
      tile_rows(xp, buf.data(), yp, M, K, N, n0, nr);
    }
  });
  return y;
}
// w = dequantize(int4 p (N, K/2), s, z (N, K/g)) as float32 (N, K): for many rows, where BLAS over the float
// weight beats reading the integers once per row tile (prefill, training's backward pass).
at::Tensor int4_dequant(const at::Tensor& p_, const at::Tensor& s_, const at::Tensor& z_, int64_t g) {
  TORCH_CHECK(p_.dim() == 2 && p_.scalar_type() == at::kByte, "int4_dequant: qweight must be uint8 (N, K/2)");
  const int64_t N = p_.size(0), K = 2 * p_.size(1);
  TORCH_CHECK(g > 0 && g % 2 == 0 && K % g == 0, "int4_dequant: group size must be even and divide K");
  const int64_t G = K / g, h = g / 2;
  TORCH_CHECK(s_.scalar_type() == at::kFloat && s_.numel() == N * G, "int4_dequant: scales must be float32 (N, K/g)");
  TORCH_CHECK(z_.scalar_type() == at::kByte && z_.numel() == N * G, "int4_dequant: zeros must be uint8 (N, K/g)");
  at::Tensor p = p_.contiguous(), s = s_.contiguous(), z = z_.contiguous();
  at::Tensor w = at::empty({N, K}, s.options());
  const uint8_t* pp = p.data_ptr<uint8_t>();
  const float* sp = s.data_ptr<float>();
  const uint8_t* zp = z.data_ptr<uint8_t>();
  float* wp = w.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++)
      for (int64_t gi = 0; gi < G; gi++) {
        const float si = sp[n * G + gi], zi = float(zp[n * G + gi]);
        const uint8_t* b = pp + n * (K / 2) + gi * h;
        float* o = wp + n * K + gi * g;
        for (int64_t j = 0; j < h; j++) {  // (q - z) * s, bit for bit formats.dequantize_int4
          o[j] = (float(b[j] & 15) - zi) * si;
          o[h + j] = (float(b[j] >> 4) - zi) * si;
        }
      }
  });
  return w;
}
}  // namespace

TORCH_LIBRARY(groundup_quant, m) {
  m.def("int8_mm(Tensor x, Tensor qweight, Tensor scales) -> Tensor");
  m.def("int4_mm(Tensor x, Tensor qweight, Tensor scales, Tensor zeros, int group_size) -> Tensor");
  m.def("int4_dequant(Tensor qweight, Tensor scales, Tensor zeros, int group_size) -> Tensor");
}
TORCH_LIBRARY_IMPL(groundup_quant, CPU, m) {
  m.impl("int8_mm", &int8_mm);
  m.impl("int4_mm", &int4_mm);
  m.impl("int4_dequant", &int4_dequant);
}
"""
