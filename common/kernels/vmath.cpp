// The row kernels of common/kernels/vmath.hpp, compiled once per SIMD target (Highway foreach_target) and
// dispatched to the target selected in common/kernels/simd.hpp. Tails shorter than a vector go through a
// padded stack buffer, never a masked load past the end of the row.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "common/kernels/vmath.cpp"
// clang-format off
#include <hwy/foreach_target.h>  // must come first: it re-includes this file once per target
// clang-format on
#include "common/kernels/vmath.hpp"

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/kernels/simd-inl.hpp"

// The per-target functions live in attn::N_<TARGET> (not attn::simd::...) so that the public functions in
// namespace attn can dispatch to them by their plain names, which is also what HWY_COMPILE_ONLY_STATIC
// (ATTN_NATIVE=ON) resolves them by.
HWY_BEFORE_NAMESPACE();
namespace attn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using simd::HWY_NAMESPACE::DF;
using simd::HWY_NAMESPACE::Exp2;
using simd::HWY_NAMESPACE::kPadLanes;
using simd::HWY_NAMESPACE::TanhKeepNaN;

// Applies `op` (a vector -> vector function) over [0, n): full vectors in place, the tail through a buffer
// padded with `pad`.
template <class Op>
HWY_INLINE void map_row(const float* src, float* dst, int64_t n, float pad, Op op) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  for (; j + N <= n; j += N) hn::StoreU(op(hn::LoadU(d, src + j)), d, dst + j);
  if (j < n) {
    HWY_ALIGN float buf[kPadLanes];
    std::fill(buf, buf + kPadLanes, pad);
    std::copy(src + j, src + n, buf);
    hn::Store(op(hn::Load(d, buf)), d, buf);
    std::copy(buf, buf + (n - j), dst + j);
  }
}

float RowMax(const float* x, int64_t n) {
  // max() drops a NaN operand or keeps it depending on the target and the operand order, so NaN is tracked
  // apart: a row of NaN scores (a NaN query) next to masked -inf entries must not come out as -inf, the mark
  // of a fully masked row.
  const DF d;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  auto vm = hn::Set(d, neg_inf);
  auto nan = hn::Zero(d);  // lanes become nonzero (all ones) once a NaN was seen
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  for (; j + N <= n; j += N) {
    const auto v = hn::LoadU(d, x + j);
    nan = hn::Or(nan, hn::VecFromMask(d, hn::IsNaN(v)));
    vm = hn::Max(vm, v);
  }
  // Reduced through memory, not MaxOfLanes: Highway 1.0.3's emu128 MaxOfLanes starts from -FLT_MAX and so
  // turns an all -inf row (fully masked) into -FLT_MAX.
  HWY_ALIGN float lanes[kPadLanes];
  hn::Store(vm, d, lanes);
  float m = lanes[0];
  for (int64_t i = 1; i < N; ++i) m = std::max(m, lanes[i]);
  bool any_nan = !hn::AllTrue(d, hn::Eq(nan, hn::Zero(d)));
  for (; j < n; ++j) {
    any_nan = any_nan || std::isnan(x[j]);
    m = std::max(m, x[j]);
  }
  return any_nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

float ExpSubSum(float* x, int64_t n, float m) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto vm = hn::Set(d, m), log2e = hn::Set(d, 1.4426950408889634f);
  auto sum0 = hn::Zero(d), sum1 = hn::Zero(d);  // two chains, so the adds do not serialise on latency
  int64_t j = 0;
  for (; j + 2 * N <= n; j += 2 * N) {
    const auto e0 = Exp2(d, hn::Mul(hn::Sub(hn::LoadU(d, x + j), vm), log2e));
    const auto e1 = Exp2(d, hn::Mul(hn::Sub(hn::LoadU(d, x + j + N), vm), log2e));
    hn::StoreU(e0, d, x + j);
    hn::StoreU(e1, d, x + j + N);
    sum0 = hn::Add(sum0, e0);
    sum1 = hn::Add(sum1, e1);
  }
  // The rest (fewer than 2 vectors) through a buffer padded with -inf, whose exp is exactly 0.
  for (; j < n; j += N) {
    HWY_ALIGN float buf[kPadLanes];
    const int64_t count = std::min(N, n - j);
    std::fill(buf, buf + kPadLanes, -std::numeric_limits<float>::infinity());
    std::copy(x + j, x + j + count, buf);
    const auto e = Exp2(d, hn::Mul(hn::Sub(hn::Load(d, buf), vm), log2e));
    hn::Store(e, d, buf);
    std::copy(buf, buf + count, x + j);
    sum1 = hn::Add(sum1, e);
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(sum0, sum1)));
}

void GatheredDots(const float* HWY_RESTRICT q, const float* HWY_RESTRICT rows, int64_t ld, int64_t d,
                  const int32_t* HWY_RESTRICT idx, int64_t n, float scale, float* HWY_RESTRICT s) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), dv = d / N * N;
  for (int64_t j = 0; j < n; ++j) {
    const float* r = rows + static_cast<int64_t>(idx[j]) * ld;
    auto a0 = hn::Zero(df), a1 = hn::Zero(df);  // two chains: even and odd vectors
    int64_t e = 0;
    for (; e + 2 * N <= dv; e += 2 * N) {
      a0 = hn::MulAdd(hn::LoadU(df, q + e), hn::LoadU(df, r + e), a0);
      a1 = hn::MulAdd(hn::LoadU(df, q + e + N), hn::LoadU(df, r + e + N), a1);
    }
    if (e < dv) a0 = hn::MulAdd(hn::LoadU(df, q + e), hn::LoadU(df, r + e), a0);
    float tail = 0.0f;
    for (int64_t c = dv; c < d; ++c) tail += q[c] * r[c];
    s[j] = scale * (hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1))) + tail);
  }
}

void GatheredAxpy(const float* HWY_RESTRICT w, const float* HWY_RESTRICT rows, int64_t ld, int64_t d,
                  const int32_t* HWY_RESTRICT idx, int64_t n, float* HWY_RESTRICT out) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), dv = d / N * N;
  // Four vectors of the output at a time stay in registers across every selected row.
  int64_t e = 0;
  for (; e + 4 * N <= dv; e += 4 * N) {
    auto o0 = hn::LoadU(df, out + e), o1 = hn::LoadU(df, out + e + N), o2 = hn::LoadU(df, out + e + 2 * N),
         o3 = hn::LoadU(df, out + e + 3 * N);
    for (int64_t j = 0; j < n; ++j) {
      const float* r = rows + static_cast<int64_t>(idx[j]) * ld + e;
      const auto wj = hn::Set(df, w[j]);
      o0 = hn::MulAdd(wj, hn::LoadU(df, r), o0);
      o1 = hn::MulAdd(wj, hn::LoadU(df, r + N), o1);
      o2 = hn::MulAdd(wj, hn::LoadU(df, r + 2 * N), o2);
      o3 = hn::MulAdd(wj, hn::LoadU(df, r + 3 * N), o3);
    }
    hn::StoreU(o0, df, out + e);
    hn::StoreU(o1, df, out + e + N);
    hn::StoreU(o2, df, out + e + 2 * N);
    hn::StoreU(o3, df, out + e + 3 * N);
  }
  for (; e < dv; e += N) {
    auto o = hn::LoadU(df, out + e);
    for (int64_t j = 0; j < n; ++j)
      o = hn::MulAdd(hn::Set(df, w[j]), hn::LoadU(df, rows + static_cast<int64_t>(idx[j]) * ld + e), o);
    hn::StoreU(o, df, out + e);
  }
  for (int64_t c = dv; c < d; ++c) {
    float acc = out[c];
    for (int64_t j = 0; j < n; ++j) acc += w[j] * rows[static_cast<int64_t>(idx[j]) * ld + c];
    out[c] = acc;
  }
}

void ScaleRow(float* x, int64_t n, float s) {
  const DF d;
  // Lambdas capture scalars only: SVE vectors are sizeless types, which a lambda cannot capture.
  map_row(x, x, n, 0.0f, [d, s](auto v) { return hn::Mul(v, hn::Set(d, s)); });
}

void Exp2Array(const float* x, float* y, int64_t n) {
  const DF d;
  map_row(x, y, n, 0.0f, [d](auto v) { return Exp2(d, v); });
}

void EluPlusOne(const float* src, float* dst, int64_t n) {
  const DF d;
  map_row(src, dst, n, 0.0f, [d](auto x) {
    const auto zero = hn::Zero(d), one = hn::Set(d, 1.0f);
    const auto positive = hn::Gt(x, zero);
    // Highway's Exp would turn NaN into a finite value (and converts it to an integer, undefined for NaN):
    // NaN lanes compute exp(0) and keep x at the end.
    const auto nan = hn::IsNaN(x);
    const auto below = hn::Exp(d, hn::IfThenZeroElse(hn::Or(positive, nan), x));
    return hn::IfThenElse(nan, x, hn::IfThenElse(positive, hn::Add(x, one), below));
  });
}

void Relu(const float* src, float* dst, int64_t n) {
  const DF d;
  // Zero where x <= 0; NaN (not <= 0) passes through, so a NaN input is not hidden.
  map_row(src, dst, n, 0.0f, [d](auto x) { return hn::IfThenZeroElse(hn::Le(x, hn::Zero(d)), x); });
}

// x = cap * tanh(x / cap) in place (logit soft-capping); -inf becomes -cap (tanh saturates), NaN stays NaN.
void Softcap(float* x, int64_t n, float cap) {
  const DF d;
  const auto c = hn::Set(d, cap), inv = hn::Set(d, 1.0f / cap);
  map_row(x, x, n, 0.0f, [&](auto v) { return hn::Mul(c, TanhKeepNaN(d, hn::Mul(v, inv))); });
}

}  // namespace attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
HWY_EXPORT(GatheredDots);
HWY_EXPORT(GatheredAxpy);
HWY_EXPORT(RowMax);
HWY_EXPORT(Softcap);
HWY_EXPORT(ExpSubSum);
HWY_EXPORT(ScaleRow);
HWY_EXPORT(Exp2Array);
HWY_EXPORT(EluPlusOne);
HWY_EXPORT(Relu);

float row_max(const float* x, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(RowMax)(x, n);
}
void gathered_dots(const float* q, const float* rows, int64_t ld, int64_t d, const int32_t* idx, int64_t n,
                   float scale, float* s) {
  HWY_DYNAMIC_DISPATCH(GatheredDots)(q, rows, ld, d, idx, n, scale, s);
}
void gathered_axpy(const float* w, const float* rows, int64_t ld, int64_t d, const int32_t* idx, int64_t n,
                   float* out) {
  HWY_DYNAMIC_DISPATCH(GatheredAxpy)(w, rows, ld, d, idx, n, out);
}
float exp_sub_sum(float* x, int64_t n, float m) {
  return HWY_DYNAMIC_DISPATCH(ExpSubSum)(x, n, m);
}
void scale_row(float* x, int64_t n, float s) {
  HWY_DYNAMIC_DISPATCH(ScaleRow)(x, n, s);
}
void exp2_array(const float* x, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(Exp2Array)(x, y, n);
}
void elu_plus_one(const float* src, float* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(EluPlusOne)(src, dst, n);
}
void relu(const float* src, float* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(Relu)(src, dst, n);
}
void softcap(float* x, int64_t n, float cap) {
  HWY_DYNAMIC_DISPATCH(Softcap)(x, n, cap);
}
}  // namespace attn
#endif  // HWY_ONCE
