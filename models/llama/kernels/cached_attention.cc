// o (B, T, H, Dh) = softmax(q k^T * scale, masked) v over one layer of a stacked KV cache: the
// attention of a KV-cached pass of T query rows on the CPU (jaxspec's "panels" decode layout,
// models/llama/attention.py; docs/performance.md "Attention in one call").
//
// Inputs: q (B, T, H, Dh) float32 (after RoPE); the whole cache, keys (L, B, K, S, Dh) and values
// (L, B, K, Dh, S) (models/llama/modeling.py KVCache), read in place at layer `layer` (an int32
// scalar), so no slice of the cache is copied; mask (B, T, S) bool (true: the query row sees
// that slot); scale, the scores' factor (Dh^-1/2). Head h reads key/value head h / (H / K).
//
// XLA:CPU runs this attention as a dozen small ops a layer (two batched dots, a slice copy of
// each cache, the softmax's passes), whose dispatch costs more than the arithmetic at one to a
// few dozen rows: about 3.7 ms of a 15 ms one-token step of SmolLM2-135M and 11 of a 36 ms
// 9-row pass (2-core AMD EPYC). Here one call does a layer.
//
// A row's result depends only on its q and on the cache slots its mask lets it see, never on
// the number of rows, the cache size S, or the thread: the scores are chains over d in order;
// the softmax's max and sum run over the seen slots in ascending order; the output sums its
// weights times the values in vector lanes assigned by absolute slot index (lane = slot mod the
// vector width), with every chunk of slots the row does not see skipped (its weights are exact
// zeros), then adds the lanes in a fixed order. So a verification pass's row equals the
// one-token step at the same place bit for bit. A row that sees no slot gets the values' mean
// over all S slots (what a softmax over all-masked scores gives).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
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

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
typedef float vf __attribute__((vector_size(kLanes * 4)));
typedef int32_t vi __attribute__((vector_size(kLanes * 4)));
// slots per score group (reduce8) and the alignment of a row's span of slots: a multiple of
// kLanes, so the weights' lanes are assigned by absolute slot index
constexpr int64_t kAlign = 16;
// output features per pass over the weighted values
constexpr int kDBlock = 8;

inline vf loadv(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void storev(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }

inline vf splat(float x) { return vf{} + x; }

inline float lanes_sum(vf v) {  // a fixed order
  float s = 0.0f;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

// The sums of 8 vectors' lanes, each by a fixed tree over its own lanes.
inline void reduce8(const vf* a, float* out) {
#if defined(__AVX512F__)
  __m256 h[8];
  for (int i = 0; i < 8; ++i) {
    const __m512 z = reinterpret_cast<const __m512&>(a[i]);
    const __m256 upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z), 1));
    h[i] = _mm256_add_ps(_mm512_castps512_ps256(z), upper);  // AVX-512F only (no DQ needed)
  }
#elif defined(__AVX__)
  const __m256* h = reinterpret_cast<const __m256*>(a);
#endif
#if defined(__AVX__)
  const __m256 t0 = _mm256_hadd_ps(h[0], h[1]), t1 = _mm256_hadd_ps(h[2], h[3]);
  const __m256 t2 = _mm256_hadd_ps(h[4], h[5]), t3 = _mm256_hadd_ps(h[6], h[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  const __m256 r = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                                 _mm256_permute2f128_ps(u0, u1, 0x31));
  _mm256_storeu_ps(out, r);
#else
  for (int i = 0; i < 8; ++i) out[i] = lanes_sum(a[i]);
#endif
}

// exp(x) lane by lane (Cody-Waite reduction by ln 2, degree-6 polynomial on [-ln2/2, ln2/2]):
// about 1 ulp; exactly 0 below -87 (so -inf, an unseen slot, weighs exactly 0).
inline vf vexp(vf x) {
  const vf magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const vf n = (x * splat(1.44269504088896341f) + magic) - magic;
  vf r = x - n * splat(0.693359375f);
  r = r - n * splat(-2.12194440e-4f);
  vf p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  const vf y = p * (r * r) + r + splat(1.0f);
  const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  vf two_n;
  std::memcpy(&two_n, &e, sizeof(e));
  const vi keep = x >= splat(-87.0f);
  vf out = y * two_n;
  vi bits;
  std::memcpy(&bits, &out, sizeof(bits));
  bits &= keep;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

struct Job {
  const float* q;
  const float* kc;  // this layer's keys, (B, K, S, Dh)
  const float* vc;  // this layer's values, (B, K, Dh, S)
  const bool* mask;
  float* o;
  int64_t B, T, H, K, S, Dh;
  float scale;
  int64_t tasks;  // (b, key/value head, block of kRowBlock query rows)
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

// The scores of slots [s0, s0 + 8) (those < S; the rest are left unset) for query qv. The
// loops over the 8 slots have a constant count, so their accumulators stay in registers.
inline void scores8(const float* qv, const float* keys, int64_t s0, int64_t S, int64_t Dh,
                    float scale, const float* zeros, float* w) {
  const int64_t n = std::min<int64_t>(8, S - s0);
  const float* kp[8];
  for (int i = 0; i < 8; ++i) kp[i] = i < n ? keys + (s0 + i) * Dh : zeros;
  vf acc[8] = {};
  const int64_t dv = Dh / kLanes * kLanes;
  for (int64_t d = 0; d < dv; d += kLanes) {
    const vf qd = loadv(qv + d);
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) acc[i] += qd * loadv(kp[i] + d);
  }
  alignas(64) float sums[8];
  reduce8(acc, sums);
  for (int64_t i = 0; i < n; ++i) {
    float s = sums[i];
    for (int64_t d = dv; d < Dh; ++d) s += qv[d] * kp[i][d];
    w[s0 + i] = s * scale;
  }
}

// out[i] = the lanes' sum of sum_s w[s] v_i[s] over slots [lo, hi) for the kDBlock value rows
// vp[i] (slots past S - 1 read as zeros; w is zero there).
inline void weigh_block(const float* ws, const float* const* vp, int64_t lo, int64_t hi,
                        int64_t S, float* vtail, float* out) {
  vf acc[kDBlock] = {};
  const int64_t full = std::min(hi, S / kLanes * kLanes);
  for (int64_t s = lo; s < full; s += kLanes) {
    const vf wv = loadv(ws + s);
#pragma GCC unroll 8
    for (int i = 0; i < kDBlock; ++i) acc[i] += wv * loadv(vp[i] + s);
  }
  if (full < std::min(hi, S)) {  // the partial vector at slot `full`
    const vf wv = loadv(ws + full);
    for (int i = 0; i < kDBlock; ++i) {
      std::memset(vtail, 0, kLanes * sizeof(float));
      std::memcpy(vtail, vp[i] + full, (S - full) * sizeof(float));
      acc[i] += wv * loadv(vtail);
    }
  }
  for (int i = 0; i < kDBlock; ++i) out[i] = lanes_sum(acc[i]);
}

// One query row (b, t), every head. w: the row's weights by absolute slot (kAlign-padded).
// The softmax of row scores ws over its span [lo, hi) (kAlign-aligned), in place: slots the
// mask m hides (and slots past S - 1) weigh exactly 0; lanes by absolute slot for the sum.
void softmax_span(float* ws, const bool* m, int64_t lo, int64_t hi, int64_t S) {
  for (int64_t s = lo; s < hi; ++s)
    if (s >= S || !m[s]) ws[s] = -INFINITY;
  vf mx = splat(-INFINITY);
  for (int64_t s = lo; s < hi; s += kLanes) {
    const vf x = loadv(ws + s);
    mx = x > mx ? x : mx;
  }
  float mxs = mx[0];
  for (int i = 1; i < kLanes; ++i) mxs = std::max(mxs, mx[i]);
  vf sum = {};
  for (int64_t s = lo; s < hi; s += kLanes) {
    const vf e = vexp(loadv(ws + s) - splat(mxs));
    storev(ws + s, e);
    sum += e;
  }
  const vf total = splat(lanes_sum(sum));
  for (int64_t s = lo; s < hi; s += kLanes) storev(ws + s, loadv(ws + s) / total);
}

// Rows per task: a task's query rows (rows x the H / K heads of one key/value head) share each
// block of keys and values while it is in the L1 cache.
constexpr int64_t kRowBlock = 4;

struct Scratch {
  std::vector<float> w;  // (kRowBlock * G, padded S): each query's weights by absolute slot
  std::vector<float> zeros, vtail;
  std::vector<int64_t> lo, hi;
};

// One task: batch row b, key/value head kh, query rows [t0, t0 + kRowBlock) of every head of
// that group. Each query's result is computed as if alone (see the file's header).
void run_task(const Job& j, int64_t task, Scratch& sc) {
  const int64_t S = j.S, Dh = j.Dh, G = j.H / j.K;
  const int64_t blocks = (j.T + kRowBlock - 1) / kRowBlock;
  const int64_t b = task / (j.K * blocks), kh = task / blocks % j.K;
  const int64_t t0 = task % blocks * kRowBlock, nt = std::min(kRowBlock, j.T - t0);
  const int64_t padded = (S + kAlign - 1) / kAlign * kAlign;
  const float* keys = j.kc + (b * j.K + kh) * S * Dh;
  const float* vals = j.vc + (b * j.K + kh) * Dh * S;
  bool live[kRowBlock];
  int64_t first = padded, last = 0;  // the union of the rows' spans
  for (int64_t i = 0; i < nt; ++i) {
    const bool* m = j.mask + (b * j.T + t0 + i) * S;
    int64_t lo = 0, hi = S;  // the span of seen slots, widened to kAlign boundaries
    while (lo < S && !m[lo]) ++lo;
    while (hi > lo && !m[hi - 1]) --hi;
    live[i] = lo < S;
    if (!live[i]) {  // a row that sees nothing: uniform weights over every slot
      lo = 0, hi = S;
      for (int64_t g = 0; g < G; ++g) {
        float* ws = sc.w.data() + (i * G + g) * padded;
        std::fill(ws, ws + padded, 0.0f);
        std::fill(ws, ws + S, 1.0f / static_cast<float>(S));
      }
    }
    sc.lo[i] = lo / kAlign * kAlign;
    sc.hi[i] = (hi + kAlign - 1) / kAlign * kAlign;
    first = std::min(first, sc.lo[i]);
    last = std::max(last, sc.hi[i]);
  }
  auto row_mask = [&](int64_t i) { return j.mask + (b * j.T + t0 + i) * S; };
  // scores: each block of 8 keys is read by every query of the task from L1
  for (int64_t s0 = first; s0 < std::min(last, S); s0 += 8)
    for (int64_t i = 0; i < nt; ++i) {
      if (!live[i] || s0 < sc.lo[i] || s0 >= sc.hi[i]) continue;
      for (int64_t g = 0; g < G; ++g) {
        const float* qv = j.q + ((b * j.T + t0 + i) * j.H + kh * G + g) * Dh;
        scores8(qv, keys, s0, S, Dh, j.scale, sc.zeros.data(),
                sc.w.data() + (i * G + g) * padded);
      }
    }
  for (int64_t i = 0; i < nt; ++i)
    if (live[i])
      for (int64_t g = 0; g < G; ++g)
        softmax_span(sc.w.data() + (i * G + g) * padded, row_mask(i), sc.lo[i], sc.hi[i], S);
  // weighted values: each block of kDBlock value rows is read by every query from L1
  const float* vp[kDBlock];
  float part[kDBlock];
  for (int64_t d0 = 0; d0 < Dh; d0 += kDBlock) {  // rows past Dh - 1: a zero row, unused
    const int64_t nd = std::min<int64_t>(kDBlock, Dh - d0);
    for (int64_t r = 0; r < kDBlock; ++r) vp[r] = r < nd ? vals + (d0 + r) * S : sc.zeros.data();
    for (int64_t i = 0; i < nt; ++i)
      for (int64_t g = 0; g < G; ++g) {
        weigh_block(sc.w.data() + (i * G + g) * padded, vp, sc.lo[i], sc.hi[i], S,
                    sc.vtail.data(), part);
        float* out = j.o + ((b * j.T + t0 + i) * j.H + kh * G + g) * Dh;
        std::copy(part, part + nd, out + d0);
      }
  }
}

void work(Job& j) {
  const int64_t G = j.H / j.K, padded = (j.S + kAlign - 1) / kAlign * kAlign;
  Scratch sc;
  sc.w.assign(kRowBlock * G * padded, 0.0f);
  sc.zeros.assign(std::max(j.S, j.Dh), 0.0f);
  sc.vtail.assign(kLanes, 0.0f);
  sc.lo.assign(kRowBlock, 0);
  sc.hi.assign(kRowBlock, 0);
  for (;;) {
    const int64_t task = j.next.fetch_add(1, std::memory_order_relaxed);
    if (task >= j.tasks) return;
    run_task(j, task, sc);
    j.done.fetch_add(1, std::memory_order_release);
  }
}

// Below this many multiply-adds (scores and weighted values, every slot counted) the call runs
// on the calling thread alone: waking a helper costs more than it saves.
constexpr int64_t kThreadFmas = int64_t{1} << 17;

ffi::Error Attention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> kc,
                     ffi::Buffer<ffi::F32> vc, ffi::Buffer<ffi::S32> layer,
                     ffi::Buffer<ffi::PRED> mask, ffi::ResultBuffer<ffi::F32> o, float scale) {
  const auto qd = q.dimensions(), kd = kc.dimensions(), vd = vc.dimensions(),
             md = mask.dimensions();
  if (qd.size() != 4 || kd.size() != 5 || vd.size() != 5 || md.size() != 3) {
    return ffi::Error::InvalidArgument(
        "cached_attention: expects q (B, T, H, Dh), keys (L, B, K, S, Dh), values "
        "(L, B, K, Dh, S) and mask (B, T, S)");
  }
  const int64_t B = qd[0], T = qd[1], H = qd[2], Dh = qd[3];
  const int64_t L = kd[0], K = kd[2], S = kd[3];
  if (kd[1] != B || kd[4] != Dh || vd[0] != L || vd[1] != B || vd[2] != K || vd[3] != Dh ||
      vd[4] != S || md[0] != B || md[1] != T || md[2] != S || K == 0 || H % K != 0) {
    return ffi::Error::InvalidArgument(
        "cached_attention: q, keys, values and mask disagree in B, T, heads, Dh or S");
  }
  const int32_t li = *layer.typed_data();
  if (li < 0 || li >= L) {
    return ffi::Error::InvalidArgument("cached_attention: layer index outside the cache");
  }
  auto job = std::make_shared<Job>();
  job->q = q.typed_data();
  job->kc = kc.typed_data() + li * B * K * S * Dh;
  job->vc = vc.typed_data() + li * B * K * Dh * S;
  job->mask = mask.typed_data();
  job->o = o->typed_data();
  job->B = B;
  job->T = T;
  job->H = H;
  job->K = K;
  job->S = S;
  job->Dh = Dh;
  job->scale = scale;
  job->tasks = B * K * ((T + kRowBlock - 1) / kRowBlock);
  const bool big = 2 * B * T * H * S * Dh >= kThreadFmas;
  const int64_t helpers = big ? std::min<int64_t>(pool.num_threads(), job->tasks) - 1 : 0;
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([job] { work(*job); });
  work(*job);
  while (job->done.load(std::memory_order_acquire) < job->tasks) PAUSE();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxspecCachedAttention, Attention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale"));
