// Bulk storage-precision conversions (half.hpp).
#include "common/interface/half.hpp"

#include <tbb/parallel_for.h>

namespace attn {

namespace {
constexpr int64_t kGrain = int64_t{1} << 16;
template <class F>
void for_chunks(int64_t n, F&& f) {
  if (n <= kGrain) {
    f(int64_t{0}, n);
    return;
  }
  tbb::parallel_for(int64_t{0}, (n + kGrain - 1) / kGrain, [&](int64_t c) {
    const int64_t a = c * kGrain;
    f(a, std::min(n, a + kGrain));
  });
}
}  // namespace

void round_tensor(DType t, const float* x, int64_t n, uint16_t* out) {
  if (t == DType::bf16)
    for_chunks(n, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) out[i] = bf16_from_float(x[i]);
    });
  else
    for_chunks(n, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) out[i] = fp16_from_float(x[i]);
    });
}

void widen_tensor(DType t, const uint16_t* x, int64_t n, float* out) {
  if (t == DType::bf16)
    for_chunks(n, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) out[i] = bf16_to_float(x[i]);
    });
  else
    for_chunks(n, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) out[i] = fp16_to_float(x[i]);
    });
}

std::vector<float> rounded_values(DType t, const float* x, int64_t n) {
  std::vector<float> out(x, x + n);
  if (t == DType::fp32) return out;
  for_chunks(n, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) out[i] = widen(t, round_to(t, x[i]));
  });
  return out;
}

Problem WideInputs::as_fp32(const Problem& p) {
  Problem f = p;
  f.dtype = DType::fp32;
  return f;
}

WideInputs::WideInputs(const Problem& p, const AttentionInputs& in) : in_(in) {
  if (p.dtype == DType::fp32) return;
  check_inputs(p, in, /*needs_out=*/false);
  auto w = [&](const uint16_t* x, int64_t n, std::vector<float>& out) {
    out.resize(static_cast<std::size_t>(n));
    widen_tensor(p.dtype, x, n, out.data());
    return out.data();
  };
  in_.q = w(in.q16, p.q_elements(), q_);
  in_.k = w(in.k16, p.kv_elements(), k_);
  in_.v = w(in.v16, p.v_elements(), v_);
  in_.q16 = in_.k16 = in_.v16 = nullptr;
}

StoredInputs::StoredInputs(const Problem& p, const AttentionInputs& in) : in_(in) {
  if (p.dtype == DType::fp32) return;
  check_inputs(WideInputs::as_fp32(p), in, /*needs_out=*/false);
  auto r = [&](const float* x, int64_t n, std::vector<uint16_t>& out) {
    out.resize(static_cast<std::size_t>(n));
    round_tensor(p.dtype, x, n, out.data());
    return out.data();
  };
  in_.q16 = r(in.q, p.q_elements(), q_);
  in_.k16 = r(in.k, p.kv_elements(), k_);
  in_.v16 = r(in.v, p.v_elements(), v_);
  in_.q = in_.k = in_.v = nullptr;
}

}  // namespace attn
