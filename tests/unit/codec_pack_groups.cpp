// pack_groups against a bit-by-bit reference: every group shape a block header allows, lengths
// around the vector step (32 symbols) and its tails.
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <vector>

#include "codec/lc_kernel.hpp"

using namespace ckpt::codec;

namespace {

// Symbol j of group g at bit j * bits of byte g; the last group padded with symbol 0.
std::vector<std::uint8_t> reference_pack(const std::vector<std::uint8_t>& s, std::size_t n,
                                         int bits, int k) {
  std::vector<std::uint8_t> out((n + k - 1) / k, 0);
  for (std::size_t i = 0; i < n; ++i) out[i / k] |= std::uint8_t(s[i] << ((i % k) * bits));
  return out;
}

}  // namespace

TEST_CASE("pack_groups: every bits and group size, every length near the vector step",
          "[lc_kernel]") {
  std::mt19937 rng(7);
  for (int bits = 1; bits <= 4; ++bits) {
    for (int k = 1; k * bits <= 8; ++k) {
      for (std::size_t n : {0, 1, 7, 31, 32, 33, 63, 64, 65, 95, 127, 128, 129, 255, 1000, 4099}) {
        std::vector<std::uint8_t> s(n + 8, 0);  // 8 readable bytes past n, as the contract says
        std::uniform_int_distribution<int> sym(0, (1 << bits) - 1);
        for (std::size_t i = 0; i < n; ++i) s[i] = std::uint8_t(sym(rng));
        const auto want = reference_pack(s, n, bits, k);
        std::vector<std::uint8_t> got(want.size() + 1, 0xa5);  // a guard byte past the groups
        pack_groups(s.data(), n, bits, k, got.data());
        INFO("bits " << bits << " k " << k << " n " << n);
        REQUIRE(std::vector<std::uint8_t>(got.begin(), got.end() - 1) == want);
        REQUIRE(got.back() == 0xa5);
      }
    }
  }
}

TEST_CASE("pack_groups: the largest symbols set every bit of their groups", "[lc_kernel]") {
  for (int bits = 1; bits <= 4; ++bits) {
    const int k = 8 / bits;
    std::vector<std::uint8_t> s(256 + 8, std::uint8_t((1 << bits) - 1));
    std::vector<std::uint8_t> got(256 / k);
    pack_groups(s.data(), 256, bits, k, got.data());
    for (auto g : got) REQUIRE(g == (1 << (k * bits)) - 1);
  }
}
