// y (R, N) = x (R, K) @ W for a float32 matrix W (K, N) packed in 16-column panels,
// wp (N / 16, K, 16): wp[t, k, c] = W[k, 16 t + c] (models/llama/panels.py).
//
// An XLA FFI custom call for the CPU (jaxspec's "panels" weight layout, docs/performance.md
// "Verification passes on the CPU: the panel kernel"). Each panel is read from memory as one
// contiguous K x 64-byte stream and multiplied into up to ROWS input rows held in vector
// registers (on AVX2, past 6 rows (5 for Q4_1), one half of the panel per pass: the second
// half's read hits the cache), so a few-row product (a speculative decoder's K + 1 verification rows)
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
// The same Q4_1 panels hold GGUF Q4_K and Q4_0 tensors: a Q4_K sub-block of 32 rows is
// float32(d * q) + m with float32 d = d_s * sc and m = -dmin_s * mn, d * q exact (pack_q4 finds
// d and m from the values and checks them bit for bit).
//
// Q8 panels (JaxspecPanelMatmulQ8, JaxspecPanelMatmulQ816): likewise for a matrix whose every
// Block-row block of a column is float32(d * q) with float32 d and int8 q: Block 32 for GGUF
// Q8_0 (e.g. SmolLM2's tied token embedding, the LM head) and Q5_0 tensors, Block 16 for
// the sub-blocks of Q6_K ones. A panel is K / Block blocks of 64 + 16 Block bytes: d (16
// float32), then Block rows of 16 int8 codes. The kernel rebuilds each weight as q * d, the
// same float32 product, so the products are again those of the float32 panels bit for bit
// (a weight -0.0 comes back +0.0, which no chain from +0 can see), from 1.125 / 1.25 bytes a
// weight.
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
#include <string>
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

// A panel row of 16 floats is one native vector on AVX-512 and two on AVX2 (kParts). The
// accumulators are arrays of native vectors: GCC keeps a 64-byte generic vector that the CPU
// lacks in memory and shuffles it through the stack on every multiply-add (about 4x slower on an
// AVX2 CPU). Each lane still runs its own chain, so the products are the same bits on either.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
constexpr int kParts = kPanel / kLanes;
typedef float vf __attribute__((vector_size(kLanes * 4)));
typedef int32_t vi __attribute__((vector_size(kLanes * 4)));

// Rows per pass over a panel, and how many vector accumulators fit in registers beside the
// weights: with more than kAcc of them (M rows x kParts), a pass runs the panel's parts one after
// the other (the part of a panel a pass reads again stays in cache).
#if defined(__AVX512F__)
constexpr int kRows = 16;  // 16 accumulators of one zmm register each
constexpr int kRowsQ4 = 16;
constexpr int kAcc = 16;
constexpr int kAccQ4 = 16;
#else
constexpr int kRows = 12;   // AVX2: 12 ymm accumulators, the panel row and the broadcast input
constexpr int kRowsQ4 = 10;  // and the scales and rebuilt weights
constexpr int kAcc = 12;
constexpr int kAccQ4 = 10;
#endif

// Parts of a panel row run together in one pass for M rows.
template <int M, int Acc>
constexpr int kGroup = M * kParts <= Acc ? kParts : 1;

inline vf loadv(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void storev(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }

// M rows (xt: k-major, xt[k * M + m]) times one panel (K x 16) -> y rows, columns 16 t ...
template <int M>
inline void panel_rows(const float* __restrict xt, int64_t K, const float* __restrict panel,
                       float* __restrict y, int64_t ldy) {
  constexpr int G = kGroup<M, kAcc>;
  for (int p0 = 0; p0 < kParts; p0 += G) {
    vf acc[M][G];
    for (int m = 0; m < M; ++m)
      for (int g = 0; g < G; ++g) acc[m][g] = vf{};
    for (int64_t k = 0; k < K; ++k) {
      vf w[G];
      for (int g = 0; g < G; ++g) w[g] = loadv(panel + k * kPanel + (p0 + g) * kLanes);
      const float* xk = xt + k * M;
      for (int m = 0; m < M; ++m)
        for (int g = 0; g < G; ++g) acc[m][g] += xk[m] * w[g];
    }
    for (int m = 0; m < M; ++m)
      for (int g = 0; g < G; ++g) storev(y + m * ldy + (p0 + g) * kLanes, acc[m][g]);
  }
}

constexpr int64_t kQ4Block = 32;                       // rows of W per scale block
constexpr int64_t kQ4Bytes = 2 * 64 + kQ4Block / 2 * 16;  // d, m, then the codes: 384 bytes

// kLanes bytes (uint8: zero-extended, int8: sign-extended) -> kLanes int32 lanes, one
// vpmovzxbd / vpmovsxbd (GCC's generic conversion goes byte by byte).
template <typename B>
inline vi widen(const B* p) {
  constexpr bool kSigned = std::is_signed<B>::value;
  vi q;
#if defined(__AVX512F__)
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m512i v = kSigned ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
  std::memcpy(&q, &v, sizeof(q));
#elif defined(__AVX2__)
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m256i v = kSigned ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
  std::memcpy(&q, &v, sizeof(q));
#else
  for (int i = 0; i < kLanes; ++i) q[i] = p[i];
#endif
  return q;
}

// M rows times one Q4_1 panel (K / 32 blocks of kQ4Bytes) -> y rows; the same chains as
// panel_rows over the float32 weights fma(q, d, m).
template <int M>
inline void q4_panel_rows(const float* __restrict xt, int64_t K, const uint8_t* __restrict panel,
                          float* __restrict y, int64_t ldy) {
  constexpr int G = kGroup<M, kAccQ4>;
  for (int p0 = 0; p0 < kParts; p0 += G) {
    vf acc[M][G];
    for (int m = 0; m < M; ++m)
      for (int g = 0; g < G; ++g) acc[m][g] = vf{};
    for (int64_t b = 0; b < K / kQ4Block; ++b) {
      const uint8_t* blk = panel + b * kQ4Bytes;
      const float* scales = reinterpret_cast<const float*>(blk);
      const uint8_t* codes = blk + 128;
      const float* xb = xt + b * kQ4Block * M;
      for (int64_t i = 0; i < kQ4Block / 2; ++i) {
        const float* x0 = xb + 2 * i * M;
        for (int g = 0; g < G; ++g) {
          const int64_t c = (p0 + g) * kLanes;
          const vf d = loadv(scales + c);
          const vf mn = loadv(scales + kPanel + c);
          const vi q = widen(codes + i * 16 + c);
          const vf w0 = __builtin_convertvector(q & 15, vf) * d + mn;
          const vf w1 = __builtin_convertvector(q >> 4, vf) * d + mn;
          for (int m = 0; m < M; ++m) acc[m][g] += x0[m] * w0;
          for (int m = 0; m < M; ++m) acc[m][g] += x0[M + m] * w1;
        }
      }
    }
    for (int m = 0; m < M; ++m)
      for (int g = 0; g < G; ++g) storev(y + m * ldy + (p0 + g) * kLanes, acc[m][g]);
  }
}

// Bytes of one Q8 panel block of Block rows: d (16 float32), then Block rows of 16 int8 codes
// (576 for Q8_0's 32 rows, 320 for the 16-row blocks of a Q6_K tensor).
template <int64_t Block>
constexpr int64_t kQ8Bytes = 64 + Block * 16;

// M rows times one Q8 panel (K / Block blocks of kQ8Bytes<Block>) -> y rows; the same chains as
// panel_rows over the float32 weights q * d.
template <int M, int64_t Block>
inline void q8_panel_rows(const float* __restrict xt, int64_t K, const int8_t* __restrict panel,
                          float* __restrict y, int64_t ldy) {
  constexpr int G = kGroup<M, kAcc>;
  for (int p0 = 0; p0 < kParts; p0 += G) {
    vf acc[M][G];
    for (int m = 0; m < M; ++m)
      for (int g = 0; g < G; ++g) acc[m][g] = vf{};
    for (int64_t b = 0; b < K / Block; ++b) {
      const int8_t* blk = panel + b * kQ8Bytes<Block>;
      const float* scales = reinterpret_cast<const float*>(blk);
      const int8_t* codes = blk + 64;
      const float* xb = xt + b * Block * M;
      for (int64_t k = 0; k < Block; ++k) {
        const float* x0 = xb + k * M;
        for (int g = 0; g < G; ++g) {
          const int64_t c = (p0 + g) * kLanes;
          const vf w = __builtin_convertvector(widen(codes + k * 16 + c), vf) * loadv(scales + c);
          for (int m = 0; m < M; ++m) acc[m][g] += x0[m] * w;
        }
      }
    }
    for (int m = 0; m < M; ++m)
      for (int g = 0; g < G; ++g) storev(y + m * ldy + (p0 + g) * kLanes, acc[m][g]);
  }
}

template <typename W>
using PanelFn = void (*)(const float*, int64_t, const W*, float*, int64_t);

// The kernels of one weight format by row count: table<F>()[m - 1] runs m rows.
template <typename F, int... Ms>
constexpr std::array<PanelFn<typename F::W>, sizeof...(Ms)> table(
    std::integer_sequence<int, Ms...>) {
  return {&F::template rows_fn<Ms + 1>...};
}

// How the three weight formats are read: the buffer dtype, rows per pass over a panel, the
// kernel, a panel's size in W's, and the K its buffer's dimensions hold (-1: a wrong shape).
struct F32Panels {
  using W = float;
  static constexpr ffi::DataType kType = ffi::F32;
  static constexpr int rows = kRows;
  static constexpr const char* kExpects = "float32 panels (N / 16, K, 16)";
  template <int M>
  static void rows_fn(const float* xt, int64_t K, const W* p, float* y, int64_t ldy) {
    panel_rows<M>(xt, K, p, y, ldy);
  }
  static int64_t panel_size(int64_t K) { return K * kPanel; }
  static int64_t k_of(ffi::Span<const int64_t> wd) { return wd[2] == kPanel ? wd[1] : -1; }
};

struct Q4Panels {
  using W = uint8_t;
  static constexpr ffi::DataType kType = ffi::U8;
  static constexpr int rows = kRowsQ4;
  static constexpr const char* kExpects = "Q4_1 panels (N / 16, K / 32, 384)";
  template <int M>
  static void rows_fn(const float* xt, int64_t K, const W* p, float* y, int64_t ldy) {
    q4_panel_rows<M>(xt, K, p, y, ldy);
  }
  static int64_t panel_size(int64_t K) { return K / kQ4Block * kQ4Bytes; }
  static int64_t k_of(ffi::Span<const int64_t> wd) {
    return wd[2] == kQ4Bytes ? wd[1] * kQ4Block : -1;
  }
};

// Q8_0 panels (Block 32) and the 16-row-block Q8 panels of Q6_K tensors (Block 16).
template <int64_t Block>
struct Q8Panels {
  using W = int8_t;
  static constexpr ffi::DataType kType = ffi::S8;
  static constexpr int rows = kRows;
  static constexpr const char* kExpects =
      Block == 32 ? "Q8_0 panels (N / 16, K / 32, 576)" : "Q8 panels (N / 16, K / 16, 320)";
  template <int M>
  static void rows_fn(const float* xt, int64_t K, const W* p, float* y, int64_t ldy) {
    q8_panel_rows<M, Block>(xt, K, p, y, ldy);
  }
  static int64_t panel_size(int64_t K) { return K / Block * kQ8Bytes<Block>; }
  static int64_t k_of(ffi::Span<const int64_t> wd) {
    return wd[2] == kQ8Bytes<Block> ? wd[1] * Block : -1;
  }
};
using Q8_0Panels = Q8Panels<32>;
using Q8_16Panels = Q8Panels<16>;

template <typename F>
const auto kTable = table<F>(std::make_integer_sequence<int, F::rows>{});

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
    kTable<F>[m - 1](j.xt + r0 * j.K, j.K, panel, j.y + r0 * j.N + t * kPanel, j.N);
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

// y (R, N) = x (R, K) @ W for W in panels of format F, after checking the shapes.
template <typename F>
ffi::Error Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<F::kType> wp,
                  ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto wd = wp.dimensions();
  if (xd.size() != 2 || wd.size() != 3 || F::k_of(wd) != xd[1]) {
    return ffi::Error::InvalidArgument(std::string("panel_matmul: expects x (R, K) and ") +
                                       F::kExpects + " with the same K");
  }
  product<F>(pool, x.typed_data(), wp.typed_data(), y->typed_data(), xd[0], xd[1], wd[0]);
  return ffi::Error::Success();
}

}  // namespace

#define JAXSPEC_PANEL_HANDLER(name, format)                                    \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, Matmul<format>,                          \
                                ffi::Ffi::Bind()                               \
                                    .Ctx<ffi::ThreadPool>()                    \
                                    .Arg<ffi::Buffer<ffi::F32>>()              \
                                    .Arg<ffi::Buffer<format::kType>>()         \
                                    .Ret<ffi::Buffer<ffi::F32>>())

JAXSPEC_PANEL_HANDLER(JaxspecPanelMatmul, F32Panels);
JAXSPEC_PANEL_HANDLER(JaxspecPanelMatmulQ4, Q4Panels);
JAXSPEC_PANEL_HANDLER(JaxspecPanelMatmulQ8, Q8_0Panels);
JAXSPEC_PANEL_HANDLER(JaxspecPanelMatmulQ816, Q8_16Panels);
