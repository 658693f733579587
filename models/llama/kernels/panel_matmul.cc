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

using PanelFn = void (*)(const float*, int64_t, const float*, float*, int64_t);

template <int... Ms>
constexpr std::array<PanelFn, sizeof...(Ms)> table(std::integer_sequence<int, Ms...>) {
  return {&panel_rows<Ms + 1>...};
}

const auto kByRows = table(std::make_integer_sequence<int, kRows>{});

struct Job {
  const float* xt;  // the row chunks, each k-major
  const float* wp;
  float* y;
  int64_t R, K, N, panels;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

void run_panel(const Job& j, int64_t t) {
  const float* panel = j.wp + t * j.K * kPanel;
  for (int64_t r0 = 0; r0 < j.R; r0 += kRows) {
    const int64_t m = std::min<int64_t>(kRows, j.R - r0);
    kByRows[m - 1](j.xt + r0 * j.K, j.K, panel, j.y + r0 * j.N + t * kPanel, j.N);
  }
}

void work(Job& j) {
  for (;;) {
    const int64_t t = j.next.fetch_add(1, std::memory_order_relaxed);
    if (t >= j.panels) return;
    run_panel(j, t);
    j.done.fetch_add(1, std::memory_order_release);
  }
}

ffi::Error PanelMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> wp,
                       ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto wd = wp.dimensions();
  if (xd.size() != 2 || wd.size() != 3 || wd[2] != kPanel || wd[1] != xd[1]) {
    return ffi::Error::InvalidArgument(
        "panel_matmul: expects x (R, K) and panels (N / 16, K, 16) with the same K");
  }
  const int64_t R = xd[0], K = xd[1], panels = wd[0], N = panels * kPanel;
  // x transposed per chunk of kRows rows: chunk c holds rows c*kRows.. as xt[k * m + i]
  std::vector<float> xt(static_cast<size_t>(R * K));
  const float* xs = x.typed_data();
  for (int64_t r0 = 0; r0 < R; r0 += kRows) {
    const int64_t m = std::min<int64_t>(kRows, R - r0);
    float* dst = xt.data() + r0 * K;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t k = 0; k < K; ++k) dst[k * m + i] = xs[(r0 + i) * K + k];
  }
  auto job = std::make_shared<Job>();
  job->xt = xt.data();
  job->wp = wp.typed_data();
  job->y = y->typed_data();
  job->R = R;
  job->K = K;
  job->N = N;
  job->panels = panels;
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), panels) - 1;
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([job] { work(*job); });
  work(*job);
  while (job->done.load(std::memory_order_acquire) < panels) PAUSE();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecPanelMatmul, PanelMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
