// y (R, N) = x (R, K) @ W for a float32 matrix W (K, N) packed in 16-column panels,
// wp (N / 16, K, 16): wp[t, k, c] = W[k, 16 t + c] (models/llama/panels.py).
//
// An XLA FFI custom call for the CPU (jaxspec's "panels" weight layout, docs/performance.md
// "Verification passes on the CPU: the panel kernel"). Each panel is read once from memory,
// as one contiguous K x 64-byte stream, and multiplied into up to ROWS input rows held in
// vector registers, so a few-row product (a speculative decoder's K + 1 verification rows)
// streams the weights once, like a one-row matrix-vector product. XLA:CPU's own small-row
// matrix-matrix kernels stream the same products at a third to a half of that rate.
//
// Every output element is one chain of fused multiply-adds over k = 0 .. K-1, whatever the
// number of rows, the row's place among them, or the thread that runs its panel: a row's
// result is bit-for-bit the same in a one-row step and in a many-row pass.
//
// Q4_1 panels (JaxspecPanelMatmulQ4): the same product for a matrix whose every 32-row block of
// a column is exactly d * q + m with float16 d, m and 4-bit q (a GGUF Q4_1 tensor dequantized to
// float32; models/llama/panels.py pack_q4 checks it bit for bit). A panel is K / 32 blocks of
// 384 bytes: d (16 float32), m (16 float32), then 16 pairs of rows as 16 bytes each (row 2 i in
// the low nibbles, row 2 i + 1 in the high ones). The kernel rebuilds each weight as
// fma(q, d, m), which equals float32(d * q) + m because d * q is exact in float32, so it
// multiplies exactly the float32 matrix, in the same chain order: its results are bit-for-bit
// those of the float32 panels, from 0.75 bytes a weight instead of 4.
//
// Q8_0 panels (JaxspecPanelMatmulQ8): likewise for a matrix whose every 32-row block of a
// column is d * q with float16 d and int8 q (a GGUF Q8_0 tensor, e.g. SmolLM2's tied token
// embedding, the LM head). A panel is K / 32 blocks of 576 bytes: d (16 float32), then 32 rows
// of 16 int8 codes. d * q is exact in float32, so the products are again those of the float32
// panels bit for bit, from 1.125 bytes a weight.
//
// Threads: the panels are shared out through an atomic counter between the calling thread and
// tasks scheduled on XLA's intra-op thread pool (xla::ffi::ThreadPool). The caller works
// through the panels too and then waits only for panels other threads already took, so a task
// that starts late finds nothing left and no schedule can deadlock.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define PAUSE() _mm_pause()
#else
#define PAUSE() ((void)0)
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanel = 16;
typedef float v16 __attribute__((vector_size(64)));

#if defined(__AVX512F__)
constexpr int kRows = 16;  // 16 accumulators of one zmm register each
#else
constexpr int kRows = 6;  // AVX2: a 16-float vector is two ymm registers
#endif

inline v16 load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store16(float* p, v16 v) { std::memcpy(p, &v, sizeof(v)); }

// M rows (xt: k-major, xt[k * M + m]) times one panel (K x 16) -> y rows, columns 16 t ...
template <int M>
inline void panel_rows(const float* __restrict xt, int64_t K, const float* __restrict panel,
                       float* __restrict y, int64_t ldy) {
  v16 acc[M];
  for (int m = 0; m < M; ++m) acc[m] = v16{};
  for (int64_t k = 0; k < K; ++k) {
    const v16 w = load16(panel + k * kPanel);
    const float* xk = xt + k * M;
    for (int m = 0; m < M; ++m) acc[m] += xk[m] * w;
  }
  for (int m = 0; m < M; ++m) store16(y + m * ldy, acc[m]);
}

constexpr int64_t kQ4Block = 32;                       // rows of W per scale block
constexpr int64_t kQ4Bytes = 2 * 64 + kQ4Block / 2 * 16;  // d, m, then the codes: 384 bytes
typedef int32_t i16 __attribute__((vector_size(64)));

#if defined(__AVX512F__)
constexpr int kRowsQ4 = 16;
#else
constexpr int kRowsQ4 = 4;  // AVX2: the rebuilt weights and scales take registers too
#endif

// 16 bytes (uint8: zero-extended, int8: sign-extended) -> 16 int32 lanes, one vpmovzxbd /
// vpmovsxbd (GCC's generic conversion goes byte by byte).
template <typename B>
inline i16 widen16(const B* p) {
  constexpr bool kSigned = std::is_signed<B>::value;
  i16 q;
#if defined(__AVX512F__)
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m512i v = kSigned ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
  std::memcpy(&q, &v, sizeof(q));
#elif defined(__AVX2__)
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i b2 = _mm_srli_si128(b, 8);
  const __m256i lo = kSigned ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
  const __m256i hi = kSigned ? _mm256_cvtepi8_epi32(b2) : _mm256_cvtepu8_epi32(b2);
  std::memcpy(&q, &lo, 32);
  std::memcpy(reinterpret_cast<char*>(&q) + 32, &hi, 32);
#else
  for (int i = 0; i < 16; ++i) q[i] = p[i];
#endif
  return q;
}

// M rows times one Q4_1 panel (K / 32 blocks of kQ4Bytes) -> y rows; the same chains as
// panel_rows over the float32 weights fma(q, d, m).
template <int M>
inline void q4_panel_rows(const float* __restrict xt, int64_t K, const uint8_t* __restrict panel,
                          float* __restrict y, int64_t ldy) {
  v16 acc[M];
  for (int m = 0; m < M; ++m) acc[m] = v16{};
  for (int64_t b = 0; b < K / kQ4Block; ++b) {
    const uint8_t* blk = panel + b * kQ4Bytes;
    const v16 d = load16(reinterpret_cast<const float*>(blk));
    const v16 mn = load16(reinterpret_cast<const float*>(blk + 64));
    const uint8_t* codes = blk + 128;
    const float* xb = xt + b * kQ4Block * M;
    for (int64_t i = 0; i < kQ4Block / 2; ++i) {
      const i16 q = widen16(codes + i * 16);
      const v16 w0 = __builtin_convertvector(q & 15, v16) * d + mn;
      const v16 w1 = __builtin_convertvector(q >> 4, v16) * d + mn;
      const float* x0 = xb + 2 * i * M;
      for (int m = 0; m < M; ++m) acc[m] += x0[m] * w0;
      for (int m = 0; m < M; ++m) acc[m] += x0[M + m] * w1;
    }
  }
  for (int m = 0; m < M; ++m) store16(y + m * ldy, acc[m]);
}

constexpr int64_t kQ8Bytes = 64 + kQ4Block * 16;  // d, then the codes: 576 bytes

// M rows times one Q8_0 panel (K / 32 blocks of kQ8Bytes) -> y rows; the same chains as
// panel_rows over the float32 weights q * d.
template <int M>
inline void q8_panel_rows(const float* __restrict xt, int64_t K, const int8_t* __restrict panel,
                          float* __restrict y, int64_t ldy) {
  v16 acc[M];
  for (int m = 0; m < M; ++m) acc[m] = v16{};
  for (int64_t b = 0; b < K / kQ4Block; ++b) {
    const int8_t* blk = panel + b * kQ8Bytes;
    const v16 d = load16(reinterpret_cast<const float*>(blk));
    const int8_t* codes = blk + 64;
    const float* xb = xt + b * kQ4Block * M;
    for (int64_t k = 0; k < kQ4Block; ++k) {
      const v16 w = __builtin_convertvector(widen16(codes + k * 16), v16) * d;
      const float* x0 = xb + k * M;
      for (int m = 0; m < M; ++m) acc[m] += x0[m] * w;
    }
  }
  for (int m = 0; m < M; ++m) store16(y + m * ldy, acc[m]);
}

template <typename W>
using PanelFn = void (*)(const float*, int64_t, const W*, float*, int64_t);

template <int... Ms>
constexpr std::array<PanelFn<float>, sizeof...(Ms)> table(std::integer_sequence<int, Ms...>) {
  return {&panel_rows<Ms + 1>...};
}

template <int... Ms>
constexpr std::array<PanelFn<uint8_t>, sizeof...(Ms)> table_q4(std::integer_sequence<int, Ms...>) {
  return {&q4_panel_rows<Ms + 1>...};
}

template <int... Ms>
constexpr std::array<PanelFn<int8_t>, sizeof...(Ms)> table_q8(std::integer_sequence<int, Ms...>) {
  return {&q8_panel_rows<Ms + 1>...};
}

const auto kByRows = table(std::make_integer_sequence<int, kRows>{});
const auto kByRowsQ4 = table_q4(std::make_integer_sequence<int, kRowsQ4>{});
const auto kByRowsQ8 = table_q8(std::make_integer_sequence<int, kRowsQ4>{});

// How the two weight formats are read: rows per call, the kernels, a panel's size in W's.
struct F32Panels {
  using W = float;
  static constexpr int rows = kRows;
  static const PanelFn<float>* fns() { return kByRows.data(); }
  static int64_t panel_size(int64_t K) { return K * kPanel; }
};

struct Q4Panels {
  using W = uint8_t;
  static constexpr int rows = kRowsQ4;
  static const PanelFn<uint8_t>* fns() { return kByRowsQ4.data(); }
  static int64_t panel_size(int64_t K) { return K / kQ4Block * kQ4Bytes; }
};

struct Q8Panels {
  using W = int8_t;
  static constexpr int rows = kRowsQ4;
  static const PanelFn<int8_t>* fns() { return kByRowsQ8.data(); }
  static int64_t panel_size(int64_t K) { return K / kQ4Block * kQ8Bytes; }
};

template <typename F>
struct Job {
  const float* xt;  // the row chunks, each k-major
  const typename F::W* wp;
  float* y;
  int64_t R, K, N, panels;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

template <typename F>
void run_panel(const Job<F>& j, int64_t t) {
  const typename F::W* panel = j.wp + t * F::panel_size(j.K);
  for (int64_t r0 = 0; r0 < j.R; r0 += F::rows) {
    const int64_t m = std::min<int64_t>(F::rows, j.R - r0);
    F::fns()[m - 1](j.xt + r0 * j.K, j.K, panel, j.y + r0 * j.N + t * kPanel, j.N);
  }
}

template <typename F>
void work(Job<F>& j) {
  for (;;) {
    const int64_t t = j.next.fetch_add(1, std::memory_order_relaxed);
    if (t >= j.panels) return;
    run_panel(j, t);
    j.done.fetch_add(1, std::memory_order_release);
  }
}

// y (R, N) = x (R, K) @ W for N / 16 panels of F's format at wp.
template <typename F>
void product(ffi::ThreadPool& pool, const float* xs, const typename F::W* wp, float* y,
             int64_t R, int64_t K, int64_t panels) {
  // x transposed per chunk of F::rows rows: chunk c holds rows c*rows.. as xt[k * m + i]
  std::vector<float> xt(static_cast<size_t>(R * K));
  for (int64_t r0 = 0; r0 < R; r0 += F::rows) {
    const int64_t m = std::min<int64_t>(F::rows, R - r0);
    float* dst = xt.data() + r0 * K;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t k = 0; k < K; ++k) dst[k * m + i] = xs[(r0 + i) * K + k];
  }
  auto job = std::make_shared<Job<F>>();
  job->xt = xt.data();
  job->wp = wp;
  job->y = y;
  job->R = R;
  job->K = K;
  job->N = panels * kPanel;
  job->panels = panels;
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), panels) - 1;
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([job] { work(*job); });
  work(*job);
  while (job->done.load(std::memory_order_acquire) < panels) PAUSE();
}

ffi::Error PanelMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> wp,
                       ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto wd = wp.dimensions();
  if (xd.size() != 2 || wd.size() != 3 || wd[2] != kPanel || wd[1] != xd[1]) {
    return ffi::Error::InvalidArgument(
        "panel_matmul: expects x (R, K) and panels (N / 16, K, 16) with the same K");
  }
  product<F32Panels>(pool, x.typed_data(), wp.typed_data(), y->typed_data(), xd[0], xd[1],
                     wd[0]);
  return ffi::Error::Success();
}

ffi::Error PanelMatmulQ4(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> wq,
                         ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto wd = wq.dimensions();
  if (xd.size() != 2 || wd.size() != 3 || wd[2] != kQ4Bytes || wd[1] * kQ4Block != xd[1]) {
    return ffi::Error::InvalidArgument(
        "panel_matmul_q4: expects x (R, K) and Q4_1 panels (N / 16, K / 32, 384)");
  }
  product<Q4Panels>(pool, x.typed_data(), wq.typed_data(), y->typed_data(), xd[0], xd[1],
                    wd[0]);
  return ffi::Error::Success();
}

ffi::Error PanelMatmulQ8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> wq,
                         ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto wd = wq.dimensions();
  if (xd.size() != 2 || wd.size() != 3 || wd[2] != kQ8Bytes || wd[1] * kQ4Block != xd[1]) {
    return ffi::Error::InvalidArgument(
        "panel_matmul_q8: expects x (R, K) and Q8_0 panels (N / 16, K / 32, 576)");
  }
  product<Q8Panels>(pool, x.typed_data(), wq.typed_data(), y->typed_data(), xd[0], xd[1],
                    wd[0]);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecPanelMatmul, PanelMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecPanelMatmulQ4, PanelMatmulQ4,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecPanelMatmulQ8, PanelMatmulQ8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
