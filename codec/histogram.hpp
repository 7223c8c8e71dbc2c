#pragma once
// Byte histograms. Four sub-histograms break the store-to-load dependency when one value
// dominates, which is the normal case for quantized deltas.
#include <array>
#include <cstdint>
#include <span>

namespace ckpt::codec {

using byte_histogram = std::array<std::uint32_t, 256>;

inline byte_histogram histogram(std::span<const std::uint8_t> in) {
  std::array<std::array<std::uint32_t, 256>, 4> h{};
  std::size_t i = 0;
  for (; i + 4 <= in.size(); i += 4) {
    ++h[0][in[i]];
    ++h[1][in[i + 1]];
    ++h[2][in[i + 2]];
    ++h[3][in[i + 3]];
  }
  for (; i < in.size(); ++i) ++h[0][in[i]];
  byte_histogram out{};
  for (int s = 0; s < 256; ++s) out[s] = h[0][s] + h[1][s] + h[2][s] + h[3][s];
  return out;
}

}  // namespace ckpt::codec
