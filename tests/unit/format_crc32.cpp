// crc32_combine (codec/format/crc32.hpp): the CRC of a concatenation from the CRCs of its parts,
// for every split of random data, lengths from 0 to several MiB (the write path combines a
// tensor's CRC with the bytes around it into a zip member's CRC).
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "codec/format/crc32.hpp"

using namespace ckpt::format;

TEST_CASE("crc32_combine equals the CRC of the concatenation", "[format][crc]") {
  std::mt19937_64 rng(9);
  std::vector<std::byte> data((5u << 20) + 17);
  for (auto& b : data) b = std::byte(rng());
  const std::uint32_t whole = crc32(0, data);
  for (std::size_t cut : {std::size_t(0), std::size_t(1), std::size_t(3), std::size_t(4096),
                          std::size_t(1) << 20, data.size() - 1, data.size()}) {
    const auto a = std::span(data).first(cut), b = std::span(data).subspan(cut);
    INFO("cut at " << cut);
    CHECK(crc32_combine(crc32(0, a), crc32(0, b), b.size()) == whole);
  }
  // Three parts, combined left to right, as the write path does member by member.
  const auto p1 = std::span(data).first(1000), p2 = std::span(data).subspan(1000, 3u << 20),
             p3 = std::span(data).subspan(1000 + (3u << 20));
  std::uint32_t crc = crc32_combine(crc32(0, p1), crc32(0, p2), p2.size());
  crc = crc32_combine(crc, crc32(0, p3), p3.size());
  CHECK(crc == whole);
  CHECK(crc32_combine(0x12345678u, 0, 0) == 0x12345678u);
}
