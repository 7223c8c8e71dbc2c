#pragma once
// Helpers shared by the codec tests: typed random tensors and element access in fp32.
#include <bit>
#include <cstddef>
#include <cstring>
#include <random>
#include <vector>

#include "codec/dtype.hpp"

namespace ckpt::test {

using codec::dtype;

inline float get_f32(const std::vector<std::byte>& v, dtype t, std::size_t i) {
  if (t == dtype::f32) {
    float f;
    std::memcpy(&f, v.data() + 4 * i, 4);
    return f;
  }
  std::uint16_t h;
  std::memcpy(&h, v.data() + 2 * i, 2);
  return t == dtype::f16 ? codec::f16_to_f32(h) : codec::bf16_to_f32(h);
}

inline void set_f32(std::vector<std::byte>& v, dtype t, std::size_t i, float f) {
  if (t == dtype::f32) {
    std::memcpy(v.data() + 4 * i, &f, 4);
  } else {
    const std::uint16_t h = t == dtype::f16 ? codec::f32_to_f16(f) : codec::f32_to_bf16(f);
    std::memcpy(v.data() + 2 * i, &h, 2);
  }
}

inline std::vector<std::byte> tensor(dtype t, std::size_t n) {
  return std::vector<std::byte>(n * codec::element_size(t));
}

// base ~ N(0, 0.05); cur = base + delta with a heavy-tailed delta (Laplacian scale 1e-3), so that
// every bucket count and both signs occur.
struct pair_data {
  std::vector<std::byte> base, cur;
};
inline pair_data random_pair(dtype t, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> w(0.0f, 0.05f);
  std::exponential_distribution<float> e(1000.0f);
  std::bernoulli_distribution coin(0.5);
  pair_data p{tensor(t, n), tensor(t, n)};
  for (std::size_t i = 0; i < n; ++i) {
    set_f32(p.base, t, i, w(rng));
    const float b = get_f32(p.base, t, i);
    set_f32(p.cur, t, i, b + (coin(rng) ? 1.0f : -1.0f) * e(rng));
  }
  return p;
}

inline std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(rng() & 0x0f);  // small values: compressible
  return v;
}

}  // namespace ckpt::test
