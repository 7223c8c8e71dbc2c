// The byte planes of lossless float blocks are a stored format: to_planes and from_planes against
// the format's definition (plane b holds byte b of each word rotated left by one bit), for every
// bit pattern class and every length around the vector step (8 words).
#include <array>
#include <bit>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "codec/planes.hpp"

using namespace ckpt::codec;

namespace {

template <class W>
void check(dtype t, std::size_t n, std::mt19937_64& rng) {
  constexpr std::size_t es = sizeof(W);
  std::vector<W> words(n);
  for (auto& w : words) w = W(rng());
  if (n > 2) {  // the extremes: the rotation moves the sign and the top bits across planes
    words[0] = W(~W(0));
    words[n / 2] = W(W(1) << (8 * es - 1));
  }
  std::vector<std::uint8_t> want(n * es);
  for (std::size_t i = 0; i < n; ++i) {
    const W r = std::rotl(words[i], 1);
    for (std::size_t b = 0; b < es; ++b) want[b * n + i] = std::uint8_t(r >> (8 * b));
  }
  std::vector<std::uint8_t> got(n * es + 1, 0x5a);  // a guard byte past the planes
  to_planes(t, reinterpret_cast<const std::byte*>(words.data()), n, got.data());
  INFO("dtype " << int(t) << " n " << n);
  REQUIRE(std::vector<std::uint8_t>(got.begin(), got.end() - 1) == want);
  REQUIRE(got.back() == 0x5a);
  // Back from planes held apart (as stored planes are read in place).
  std::vector<std::vector<std::uint8_t>> apart(es);
  std::array<const std::uint8_t*, 4> p{};
  for (std::size_t b = 0; b < es; ++b) {
    apart[b].assign(want.begin() + std::ptrdiff_t(b * n),
                    want.begin() + std::ptrdiff_t((b + 1) * n));
    p[b] = apart[b].data();
  }
  std::vector<W> back(n + 1, W(0x5a5a));
  from_planes(t, p, n, reinterpret_cast<std::byte*>(back.data()));
  // memcmp of an empty vector's data() (null) is undefined even for 0 bytes (UBSan).
  REQUIRE((n == 0 || std::memcmp(back.data(), words.data(), n * es) == 0));
  REQUIRE(back[n] == W(0x5a5a));
}

}  // namespace

TEST_CASE("planes: to_planes and from_planes follow the stored layout", "[planes]") {
  std::mt19937_64 rng(5);
  for (std::size_t n : {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 1000, 4099}) {
    check<std::uint32_t>(dtype::f32, n, rng);
    check<std::uint16_t>(dtype::bf16, n, rng);
    check<std::uint16_t>(dtype::f16, n, rng);
  }
}
