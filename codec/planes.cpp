// codec::to_planes / from_planes (planes.hpp).
#include "codec/planes.hpp"

#include <bit>

namespace ckpt::codec {

// Memory-bound as they are: an AVX2 version (eight words a step) measured no change in a keyframe's
// save or load (its 14% of a keyframe load's CPU is the planes' and the output's cache misses).
void to_planes(dtype t, const std::byte* in, std::size_t n, std::uint8_t* planes) {
  if (t == dtype::f32) {
    const auto* w = reinterpret_cast<const std::uint32_t*>(in);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t r = std::rotl(w[i], 1);
      planes[i] = std::uint8_t(r);
      planes[n + i] = std::uint8_t(r >> 8);
      planes[2 * n + i] = std::uint8_t(r >> 16);
      planes[3 * n + i] = std::uint8_t(r >> 24);
    }
  } else {
    const auto* w = reinterpret_cast<const std::uint16_t*>(in);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t r = std::rotl(w[i], 1);
      planes[i] = std::uint8_t(r);
      planes[n + i] = std::uint8_t(r >> 8);
    }
  }
}

void from_planes(dtype t, const std::array<const std::uint8_t*, 4>& p, std::size_t n,
                 std::byte* out) {
  if (t == dtype::f32) {
    auto* w = reinterpret_cast<std::uint32_t*>(out);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t r = std::uint32_t(p[0][i]) | std::uint32_t(p[1][i]) << 8 |
                              std::uint32_t(p[2][i]) << 16 | std::uint32_t(p[3][i]) << 24;
      w[i] = std::rotr(r, 1);
    }
  } else {
    auto* w = reinterpret_cast<std::uint16_t*>(out);
    for (std::size_t i = 0; i < n; ++i) w[i] = std::rotr(std::uint16_t(p[0][i] | p[1][i] << 8), 1);
  }
}

}  // namespace ckpt::codec
