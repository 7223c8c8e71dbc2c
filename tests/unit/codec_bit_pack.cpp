// Bit-packed byte streams (codec/bit_pack.hpp) and where the entropy layer and lossless float
// blocks use them.
#include <xxhash.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "codec/bit_pack.hpp"
#include "codec/block.hpp"
#include "codec/entropy.hpp"
#include "codec/error.hpp"
#include "codec/mantissa.hpp"
#include "codec/tensor_codec.hpp"

using namespace ckpt::codec;
using ckpt::corrupt_error;
using ckpt::invalid_argument;

namespace {

// Random symbols that agree with `fixed` outside `mask`.
std::vector<std::uint8_t> masked(std::size_t n, std::uint8_t mask, std::uint8_t fixed,
                                 std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> v(n);
  for (auto& x : v) x = std::uint8_t((rng() & mask) | fixed);
  return v;
}

// The payload by its definition: symbol i's masked bits, lowest first, at bit i * k.
std::vector<std::byte> reference(const std::vector<std::uint8_t>& in, std::uint8_t mask,
                                 std::uint8_t fixed) {
  const unsigned k = unsigned(__builtin_popcount(mask));
  std::vector<std::byte> out{std::byte(mask), std::byte(fixed)};
  out.resize(2 + (in.size() * k + 7) / 8);
  std::size_t bit = 0;
  for (auto s : in)
    for (unsigned b = 0; b < 8; ++b)
      if (mask >> b & 1) {
        if (s >> b & 1) out[2 + bit / 8] |= std::byte(1u << (bit % 8));
        ++bit;
      }
  return out;
}

// A block's checksum made valid again after its header was edited (docs/format.md, "Block").
void reseal(std::vector<std::byte>& block) {
  std::uint32_t payload;
  std::memcpy(&payload, block.data() + 12, 4);
  const std::uint64_t sum =
      XXH3_64bits_withSeed(block.data() + 32, payload, XXH3_64bits(block.data(), 24));
  std::memcpy(block.data() + 24, &sum, 8);
}

}  // namespace

TEST_CASE("bit_pack: every mask and length around the 8-symbol step matches the definition",
          "[bit_pack]") {
  for (unsigned mask = 1; mask < 255; ++mask) {
    const auto fixed = std::uint8_t(0xa5 & ~mask);
    for (std::size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 71, 72, 73, 1000, 4099}) {
      INFO("mask=" << mask << " n=" << n);
      const auto in = masked(n, std::uint8_t(mask), fixed, mask * 131 + n);
      std::vector<std::byte> enc;
      bit_pack::encode(in, {std::uint8_t(mask), fixed}, enc);
      REQUIRE(enc == reference(in, std::uint8_t(mask), fixed));
      REQUIRE(enc.size() == bit_pack::payload_size(n, std::uint8_t(mask)));
      std::vector<std::uint8_t> out(n, 0x5a);
      bit_pack::decode(enc, out);
      REQUIRE(out == in);
    }
  }
}

TEST_CASE("bit_pack: layout_of names the bits that differ and the others' value", "[bit_pack]") {
  byte_histogram h{};
  h[0x81] = 3;
  h[0x85] = 1;
  h[0xc1] = 2;
  const auto l = bit_pack::layout_of(h);
  CHECK(l.mask == 0x44);
  CHECK(l.fixed == 0x81);
  byte_histogram one{};
  one[7] = 5;
  CHECK(bit_pack::layout_of(one).mask == 0);
  CHECK(bit_pack::layout_of(byte_histogram{}).mask == 0);
}

TEST_CASE("bit_pack: bad masks, sizes and padding are refused", "[bit_pack]") {
  const auto in = masked(13, 0x0f, 0x30, 1);
  std::vector<std::byte> enc;
  CHECK_THROWS_AS(bit_pack::encode(in, {0x00, 0x00}, enc), invalid_argument);
  CHECK_THROWS_AS(bit_pack::encode(in, {0xff, 0x00}, enc), invalid_argument);
  CHECK_THROWS_AS(bit_pack::encode(in, {0x0f, 0x31}, enc), invalid_argument);
  bit_pack::encode(in, {0x0f, 0x30}, enc);  // 2 + 7 bytes: 4 padding bits
  std::vector<std::uint8_t> out(13);
  auto bad = enc;
  bad[0] = std::byte(0xff);
  CHECK_THROWS_AS(bit_pack::decode(bad, out), corrupt_error);
  bad = enc;
  bad[1] = std::byte(0x31);  // a fixed bit inside the mask
  CHECK_THROWS_AS(bit_pack::decode(bad, out), corrupt_error);
  bad = enc;
  bad.back() |= std::byte(0x80);
  CHECK_THROWS_AS(bit_pack::decode(bad, out), corrupt_error);
  bad = enc;
  bad.pop_back();
  CHECK_THROWS_AS(bit_pack::decode(bad, out), corrupt_error);
  bad = enc;
  bad.push_back(std::byte(0));
  CHECK_THROWS_AS(bit_pack::decode(bad, out), corrupt_error);
  CHECK_THROWS_AS(bit_pack::decode(std::span(enc).first(1), out), corrupt_error);
  std::vector<std::uint8_t> longer(15);  // 60 bits: one byte more than the payload holds
  CHECK_THROWS_AS(bit_pack::decode(enc, longer), corrupt_error);
}

TEST_CASE("entropy: packed only where allowed, under the best policy, and when it is smaller",
          "[bit_pack][entropy]") {
  // Two symbols differing in one bit, as plane 0 of floats rounded to 12 bits holds them.
  const auto signs = masked(100000, 0x01, 0x00, 2);
  std::vector<std::byte> a, b, c;
  CHECK(encode_bytes(signs, entropy_policy::best, a, nullptr, packing::allowed) ==
        entropy_mode::packed);
  CHECK(a.size() == 1 + 2 + 100000 / 8);
  CHECK(encode_bytes(signs, entropy_policy::best, b) != entropy_mode::packed);
  CHECK(encode_bytes(signs, entropy_policy::huffman_only, c, nullptr, packing::allowed) ==
        entropy_mode::huffman);
  std::vector<std::uint8_t> out(signs.size());
  decode_bytes(a, out, packing::allowed);
  CHECK(out == signs);
  // Skewed symbols within a mask still go to a coder that saves more than 1/32 of packing.
  std::vector<std::uint8_t> skewed(100000, 0x10);
  for (std::size_t i = 0; i < skewed.size(); i += 50) skewed[i] = 0xf0;
  std::vector<std::byte> d;
  CHECK(encode_bytes(skewed, entropy_policy::best, d, nullptr, packing::allowed) !=
        entropy_mode::packed);
  // Three symbols: packing (2 + 1 byte) is larger than storing them (3 bytes + nothing).
  const std::vector<std::uint8_t> tiny{1, 3, 1};
  std::vector<std::byte> e;
  CHECK(encode_bytes(tiny, entropy_policy::best, e, nullptr, packing::allowed) !=
        entropy_mode::packed);
}

TEST_CASE("lossless blocks of a rounded tensor pack their planes as version 3", "[bit_pack]") {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> w(0.0f, 0.02f);
  std::vector<float> x(300000);
  for (auto& f : x) f = w(rng);
  std::vector<std::byte> raw(x.size() * 4), rounded(raw.size());
  std::memcpy(raw.data(), x.data(), raw.size());
  round_mantissa(dtype::f32, raw, rounded, 12);

  const auto enc = encode_exact(dtype::f32, rounded);
  const auto h = read_block_header(enc, false);
  CHECK(h.codec == block_codec::float_lossless);
  CHECK(h.packed_planes);
  CHECK(std::to_integer<int>(enc[4]) == block_format_version_packed);
  std::vector<std::byte> back(rounded.size());
  decode(enc, {}, back);
  CHECK(back == rounded);
  // 1 sign bit + 4 of the second plane's bits + the third plane stored + the exponent coded.
  CHECK(double(enc.size()) * 8 / double(x.size()) < 16.0);

  // Unrounded: no plane has fixed bits, nothing is packed, the block stays version 1.
  const auto plain = encode_exact(dtype::f32, raw);
  CHECK(std::to_integer<int>(plain[4]) == block_format_version);
  CHECK_FALSE(read_block_header(plain, false).packed_planes);
}

TEST_CASE("a packed plane in a block of another version is refused", "[bit_pack][corruption]") {
  std::vector<std::byte> rounded(4 * 5000);
  std::mt19937_64 rng(4);
  for (std::size_t i = 0; i < 5000; ++i) {
    const std::uint32_t word = std::uint32_t(rng()) & 0xbffff800u;  // 12 mantissa bits
    std::memcpy(rounded.data() + 4 * i, &word, 4);
  }
  auto enc = encode_exact(dtype::f32, rounded);
  REQUIRE(read_block_header(enc, false).packed_planes);
  std::vector<std::byte> back(rounded.size());
  // Version 1 with the same payload and a valid checksum (what an old writer could never
  // produce): refused, a packed plane means version 3.
  auto v1 = enc;
  v1[4] = std::byte(block_format_version);
  reseal(v1);
  CHECK_THROWS_WITH(decode(v1, {}, back), Catch::Contains("packed stream not allowed"));
  reseal(enc);  // unchanged: still decodes
  decode(enc, {}, back);
  CHECK(back == rounded);
  // Version 3 is for lossless float blocks with flags 0: another codec, or flags, are refused.
  auto zstd = enc;
  zstd[5] = std::byte(block_codec::zstd);
  zstd[6] = std::byte(dtype::bytes);
  CHECK_THROWS_WITH(read_block_header(zstd, false), Catch::Contains("version 3"));
  auto flags = enc;
  flags[7] = std::byte(12);
  CHECK_THROWS_WITH(read_block_header(flags, false), Catch::Contains("bad flags"));
}

TEST_CASE("a packed stream is refused where the caller does not allow one", "[bit_pack][entropy]") {
  const auto signs = masked(4096, 0x01, 0x00, 5);
  std::vector<std::byte> enc;
  REQUIRE(encode_bytes(signs, entropy_policy::best, enc, nullptr, packing::allowed) ==
          entropy_mode::packed);
  std::vector<std::uint8_t> out(signs.size());
  CHECK_THROWS_AS(decode_bytes(enc, out), corrupt_error);  // lossy group streams, version 1 planes
  decode_bytes(enc, out, packing::allowed);
  CHECK(out == signs);
}
