#include "codec/quantizer.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "codec/error.hpp"

namespace ckpt::codec {

std::string_view name(representative r) noexcept {
  return r == representative::mean ? "mean" : "midrange";
}

void delta_stats::merge(const delta_stats& o) {
  for (int k = 0; k < key_count; ++k) {
    count[k] += o.count[k];
    mantissa_sum[k] += o.mantissa_sum[k];
    mantissa_min[k] = std::min(mantissa_min[k], o.mantissa_min[k]);
    mantissa_max[k] = std::max(mantissa_max[k], o.mantissa_max[k]);
  }
}

namespace {

template <class Load>
void accumulate_with(delta_stats& s, std::size_t n, bool track_range, Load load) {
  if (!track_range) {
    // Two interleaved tables keep consecutive equal keys from serialising on one counter.
    delta_stats t;
    std::size_t i = 0;
    for (; i + 2 <= n; i += 2) {
      const auto [c0, b0] = load(i);
      const auto [c1, b1] = load(i + 1);
      const std::uint32_t d0 = std::bit_cast<std::uint32_t>(c0 - b0);
      const std::uint32_t d1 = std::bit_cast<std::uint32_t>(c1 - b1);
      ++s.count[d0 >> 23];
      s.mantissa_sum[d0 >> 23] += d0 & 0x7fffffu;
      ++t.count[d1 >> 23];
      t.mantissa_sum[d1 >> 23] += d1 & 0x7fffffu;
    }
    for (; i < n; ++i) {
      const auto [c, b] = load(i);
      const std::uint32_t d = std::bit_cast<std::uint32_t>(c - b);
      ++s.count[d >> 23];
      s.mantissa_sum[d >> 23] += d & 0x7fffffu;
    }
    for (int k = 0; k < key_count; ++k) {
      s.count[k] += t.count[k];
      s.mantissa_sum[k] += t.mantissa_sum[k];
    }
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto [c, b] = load(i);
    const std::uint32_t d = std::bit_cast<std::uint32_t>(c - b);
    const std::uint32_t k = d >> 23, m = d & 0x7fffffu;
    ++s.count[k];
    s.mantissa_sum[k] += m;
    s.mantissa_min[k] = std::min(s.mantissa_min[k], m);
    s.mantissa_max[k] = std::max(s.mantissa_max[k], m);
  }
}

// |value| of a float with biased exponent e (1..254) and mantissa bits m, exactly, in double.
double magnitude(int e, double m) { return std::ldexp(1.0 + m / 8388608.0, e - 127); }

}  // namespace

void accumulate(delta_stats& s, dtype t, const std::byte* cur, const std::byte* base, std::size_t n,
                bool track_range) {
  switch (t) {
    case dtype::f32: {
      auto c = reinterpret_cast<const float*>(cur);
      auto b = reinterpret_cast<const float*>(base);
      accumulate_with(s, n, track_range, [&](std::size_t i) { return std::pair{c[i], b[i]}; });
      return;
    }
    case dtype::f16: {
      auto c = reinterpret_cast<const std::uint16_t*>(cur);
      auto b = reinterpret_cast<const std::uint16_t*>(base);
      accumulate_with(s, n, track_range,
                      [&](std::size_t i) { return std::pair{f16_to_f32(c[i]), f16_to_f32(b[i])}; });
      return;
    }
    case dtype::bf16: {
      auto c = reinterpret_cast<const std::uint16_t*>(cur);
      auto b = reinterpret_cast<const std::uint16_t*>(base);
      accumulate_with(s, n, track_range, [&](std::size_t i) {
        return std::pair{bf16_to_f32(c[i]), bf16_to_f32(b[i])};
      });
      return;
    }
    case dtype::bytes: break;
  }
  throw invalid_argument("quantizer: only float tensors have deltas");
}

quant_table select_buckets(const delta_stats& s, int bits, representative r) {
  if (bits < 1 || bits > max_bits) throw invalid_argument("quantizer: bits must be 1..4");
  struct candidate {
    int key;
    float rep;
  };
  std::vector<candidate> cands;
  for (int key = 0; key < key_count; ++key) {
    const int e = key & 0xff;
    // Exponent 0 (zeros, subnormals below 1.2e-38) is never worth a symbol; 255 is non-finite
    // and goes through the exact escape instead.
    if (e == 0 || e == 255 || s.count[key] == 0) continue;
    double mag;
    if (r == representative::mean) {
      mag = magnitude(e, double(s.mantissa_sum[key]) / double(s.count[key]));
    } else {
      mag = 0.5 * (magnitude(e, s.mantissa_min[key]) + magnitude(e, s.mantissa_max[key]));
    }
    const float rep = float(key & 0x100 ? -mag : mag);
    cands.push_back({key, rep});
  }
  // Largest magnitude first; equal magnitudes by key, so the table is fully determined.
  std::sort(cands.begin(), cands.end(), [](const candidate& a, const candidate& b) {
    const float ma = std::fabs(a.rep), mb = std::fabs(b.rep);
    return ma != mb ? ma > mb : a.key < b.key;
  });
  quant_table q;
  q.bits = bits;
  q.rep.fill(0.0f);
  q.rep[0] = -0.0f;
  const int keep = std::min<int>(int(cands.size()), (1 << bits) - 1);
  for (int i = 0; i < keep; ++i) {
    q.rep[i + 1] = cands[i].rep;
    q.symbol_of_key[cands[i].key] = std::uint8_t(i + 1);
  }
  return q;
}

}  // namespace ckpt::codec
