// decode_tally: chunks decoded, repeats among the ones it still remembers, frames.
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "fs/content/decode_tally.hpp"

using ckpt::fs::decode_tally;

TEST_CASE("decode_tally counts chunks and the ones decoded before", "[content][tally]") {
  decode_tally t;
  REQUIRE(t.get().chunks == 0);
  REQUIRE(t.get().again == 0);
  for (std::uint64_t k = 1; k <= 100; ++k) t.chunk(k * 0x9e3779b97f4a7c15ull, 10);
  REQUIRE(t.get().chunks == 100);
  REQUIRE(t.get().again == 0);
  t.chunk(7 * 0x9e3779b97f4a7c15ull, 10);
  t.chunk(7 * 0x9e3779b97f4a7c15ull, 10);
  t.chunk(100 * 0x9e3779b97f4a7c15ull, 10);
  REQUIRE(t.get().chunks == 103);
  REQUIRE(t.get().again == 3);
  CHECK(t.get().chunk_bytes == 1030);
  CHECK(t.get().again_bytes == 30);
  t.stray(1 << 20);
  CHECK(t.get().strays == 1);
  CHECK(t.get().stray_bytes == 1 << 20);
  CHECK(t.get().chunks == 103);
  t.frames(1);
  t.frames(2);
  REQUIRE(t.get().frames == 3);
}

TEST_CASE("decode_tally tells fingerprints that share a slot apart", "[content][tally]") {
  decode_tally t;
  // Equal in the bits that pick the slot, different above them: the second takes the first's
  // slot, so the first is no longer remembered, and neither counts as a repeat.
  const std::uint64_t a = 0x1234, b = a | (std::uint64_t(1) << 40);
  t.chunk(a, 1);
  t.chunk(b, 1);
  REQUIRE(t.get().again == 0);
  t.chunk(a, 1);  // forgotten: b took its slot
  REQUIRE(t.get().again == 0);
  t.chunk(a, 1);
  REQUIRE(t.get().again == 1);
  // Fingerprints that differ only in bit 0 (the tag bit) are one chunk to the tally.
  t.chunk(0x5000, 1);
  t.chunk(0x5001, 1);
  REQUIRE(t.get().again == 2);
  // Zero is a fingerprint like any other (the empty slot never matches it).
  decode_tally z;
  z.chunk(0, 1);
  REQUIRE(z.get().again == 0);
  z.chunk(0, 1);
  REQUIRE(z.get().again == 1);
}

TEST_CASE("decode_tally counts every record of concurrent threads", "[content][tally]") {
  decode_tally t;
  constexpr int threads = 4, per = 20000;
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; ++i)
    ts.emplace_back([&t, i] {
      for (int k = 0; k < per; ++k) {
        t.chunk((std::uint64_t(i) << 32 | std::uint64_t(k)) << 1, 1);
        t.frames(1);
      }
    });
  for (auto& th : ts) th.join();
  REQUIRE(t.get().chunks == std::uint64_t(threads) * per);
  REQUIRE(t.get().frames == std::uint64_t(threads) * per);
}
