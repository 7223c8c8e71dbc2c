// Coded escapes (block format version 4, codec/escapes.hpp): the section round-trips indices and
// values bit for bit for every float dtype and every gap length, refuses sections that do not add
// up, and lossy blocks use it exactly where it is smaller than the plain list.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "codec/block.hpp"
#include "codec/error.hpp"
#include "codec/escapes.hpp"
#include "codec/tensor_codec.hpp"
#include "codec_test_util.hpp"

using namespace ckpt::codec;
using namespace ckpt::test;

namespace {

struct section {
  std::vector<std::uint32_t> indices;
  std::vector<std::byte> values;
};

// Indices whose gaps need 1 to 5 LEB128 bytes, at both ends of a block of n elements, with
// values that include specials (NaN with a payload, infinities, a denormal, -0).
section awkward(dtype t, std::size_t n) {
  section s;
  for (std::uint64_t i : std::initializer_list<std::uint64_t>{0, 1, 2, 130, 20000, 3000000,
                                                              400000000, std::uint64_t(n) - 1})
    if (i < n && (s.indices.empty() || i > s.indices.back())) s.indices.push_back(std::uint32_t(i));
  const std::size_t esize = element_size(t);
  s.values.resize(s.indices.size() * esize);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            -0.0f,
                            1.5e-7f,
                            65000.0f,
                            3.0f};
  for (std::size_t k = 0; k < s.indices.size(); ++k) {
    std::vector<std::byte> one(esize);
    set_f32(one, t, 0, specials[k % std::size(specials)]);
    std::memcpy(s.values.data() + k * esize, one.data(), esize);
  }
  return s;
}

section read_back(const std::vector<std::byte>& bytes, dtype t, std::size_t n, std::size_t count) {
  section s;
  byte_reader r(bytes);
  get_coded_escapes(r, t, n, count, s.indices, s.values);
  CHECK(r.remaining() == 0);
  return s;
}

// Second moments whose growth one factor cannot follow (2^0..2^30): most elements escape.
pair_data wild_growth(std::size_t n, std::uint64_t seed) {
  pair_data p{tensor(dtype::f32, n), tensor(dtype::f32, n)};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> growth(0.0, 30.0);
  for (std::size_t i = 0; i < n; ++i) {
    set_f32(p.base, dtype::f32, i, 1e-12f);
    set_f32(p.cur, dtype::f32, i, float(1e-12 * std::exp2(growth(rng))));
  }
  return p;
}

struct block_result {
  std::vector<std::byte> frame, recon, out;
};

block_result ratio_block(const pair_data& p, int bits, int round_bits) {
  const delta_input in{dtype::f32, p.cur, p.base};
  const auto q =
      plan_tables(std::span(&in, 1), bits, representative::mean, bucket_scope::tensor, true)[0];
  REQUIRE(q.kind == delta_kind::ratio);
  block_result b;
  b.recon.resize(p.cur.size());
  lossy_params lp;
  lp.bits = bits;
  lp.round_bits = round_bits;
  b.frame = encode_delta(in, q, lp, b.recon, 1u << 20);
  b.out.resize(p.cur.size());
  decode(b.frame, p.base, b.out);
  return b;
}

std::size_t escaped(const pair_data& p, const std::vector<std::byte>& r) {
  std::size_t e = 0;
  for (std::size_t i = 0; i < p.cur.size() / 4; ++i)
    e += get_f32(r, dtype::f32, i) == get_f32(p.cur, dtype::f32, i);
  return e;
}

}  // namespace

TEST_CASE("escapes: the coded section round-trips indices and values bit for bit", "[escapes]") {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    for (std::size_t n : {std::size_t(1), std::size_t(200), std::size_t(1) << 32}) {
      INFO(int(t) << " n " << n);
      const auto s = awkward(t, n);
      for (auto policy : {entropy_policy::best, entropy_policy::huffman_only}) {
        std::vector<std::byte> bytes;
        const std::size_t size = put_coded_escapes(t, s.indices, s.values, policy, bytes);
        CHECK(size == bytes.size());
        const auto got = read_back(bytes, t, n, s.indices.size());
        CHECK(got.indices == s.indices);
        CHECK(got.values == s.values);  // NaN payloads and -0 included
      }
    }
  }
  // Many escapes: one every 1..300 elements.
  std::mt19937_64 rng(3);
  section s;
  std::uint32_t at = 0;
  for (int k = 0; k < 5000; ++k) {
    at += 1 + std::uint32_t(rng() % 300);
    s.indices.push_back(at);
  }
  const auto p = random_pair(dtype::f32, s.indices.size(), 4);
  s.values = p.cur;
  std::vector<std::byte> bytes;
  put_coded_escapes(dtype::f32, s.indices, s.values, entropy_policy::best, bytes);
  const auto got = read_back(bytes, dtype::f32, std::size_t(at) + 1, s.indices.size());
  CHECK(got.indices == s.indices);
  CHECK(got.values == s.values);
  CHECK(bytes.size() < s.indices.size() * 8);  // smaller than the plain list
}

TEST_CASE("escapes: indices that do not ascend are refused when writing", "[escapes]") {
  std::vector<std::byte> bytes;
  const std::vector<std::uint32_t> down{5, 3};
  const std::vector<std::byte> values(8);
  CHECK_THROWS_AS(put_coded_escapes(dtype::f32, down, values, entropy_policy::best, bytes),
                  ckpt::invalid_argument);
  const std::vector<std::uint32_t> twice{3, 3};
  CHECK_THROWS_AS(put_coded_escapes(dtype::f32, twice, values, entropy_policy::best, bytes),
                  ckpt::invalid_argument);
  const std::vector<std::uint32_t> one{3};
  CHECK_THROWS_AS(put_coded_escapes(dtype::f32, one, values, entropy_policy::best, bytes),
                  ckpt::invalid_argument);  // two values for one index
}

TEST_CASE("escapes: sections that do not add up are refused as damage", "[escapes]") {
  const dtype t = dtype::f32;
  const std::size_t n = std::size_t(1) << 32;
  const auto s = awkward(t, n);
  const std::size_t count = s.indices.size();
  // A section written by hand: the gap bytes and values_of zeros in each value plane, every
  // stream stored as it is.
  auto handmade = [](const std::vector<std::uint8_t>& gaps, std::size_t values_of) {
    std::vector<std::byte> out;
    byte_writer w(out);
    auto stored = [&](std::span<const std::uint8_t> bytes) {
      w.put<std::uint32_t>(std::uint32_t(bytes.size() + 1));
      w.put<std::uint8_t>(std::uint8_t(entropy_mode::stored));
      for (auto b : bytes) w.put<std::uint8_t>(b);
    };
    w.put<std::uint32_t>(std::uint32_t(gaps.size()));
    stored(gaps);
    const std::vector<std::uint8_t> zeros(values_of);
    for (int plane = 0; plane < 4; ++plane) stored(zeros);
    return out;
  };
  auto refuses = [&](const std::vector<std::byte>& bytes, std::size_t cnt, std::size_t nn) {
    byte_reader r(bytes);
    std::vector<std::uint32_t> ix;
    std::vector<std::byte> vals;
    CHECK_THROWS_AS(get_coded_escapes(r, t, nn, cnt, ix, vals), ckpt::corrupt_error);
  };
  {
    const auto ok = handmade({0, 0, 0}, 3);
    section got;
    byte_reader r(ok);
    get_coded_escapes(r, t, 10, 3, got.indices, got.values);
    CHECK(got.indices == std::vector<std::uint32_t>{0, 1, 2});  // the hand-made section is valid
  }
  refuses(handmade({0, 0}, 3), 3, 10);        // fewer gap bytes than escapes
  refuses(handmade({0, 0, 0, 0}, 3), 3, 10);  // a gap byte left over
  refuses(handmade({0, 0, 0x80}, 3), 3, 10);  // the last gap cut inside its LEB128
  refuses(handmade({0, 0, 7}, 3), 3, 9);      // index 9 of 9 elements
  refuses(handmade({0x80, 0x80, 0x80, 0x80, 0x80, 0}, 1), 1, 10);  // a gap of six bytes
  // ... also where the gap bytes would allow it (two escapes, ten bytes)
  refuses(handmade({0x81, 0x80, 0x80, 0x80, 0x80, 0x01, 0, 0, 0, 0}, 2), 2, 10);
  refuses(handmade({0x80, 0x00, 0}, 2), 2, 10);                   // gap 0 written in two bytes
  refuses(handmade({}, 0), 0, 10);                                // version 4 without escapes
  refuses(handmade(std::vector<std::uint8_t>(16, 0), 3), 3, 10);  // over 5 bytes an escape
  {
    std::vector<std::byte> bytes;
    put_coded_escapes(t, s.indices, s.values, entropy_policy::best, bytes);
    for (std::size_t cut = 0; cut < bytes.size(); cut += 3)
      refuses(std::vector<std::byte>(bytes.begin(), bytes.begin() + cut), count, n);
    refuses(bytes, count, n - 1);  // the last index is n - 1 of the real block
  }
}

TEST_CASE("escapes: ratio blocks with many escapes code them (version 4), decoding exactly",
          "[escapes]") {
  const auto p = wild_growth(60000, 11);
  for (int round_bits : {0, 6}) {
    INFO("round_bits " << round_bits);
    const auto b = ratio_block(p, 1, round_bits);
    REQUIRE(b.frame.size() > block_header_size);
    CHECK(int(b.frame[4]) == block_format_version_coded_escapes);
    CHECK(int(b.frame[7]) == round_bits);
    CHECK(b.out == b.recon);  // the decoder reads what the encoder reconstructed
    const auto h = read_block_header(b.frame);
    CHECK(h.coded_escapes);
    CHECK(int(h.round_bits) == round_bits);
    if (!round_bits) {
      const std::size_t e = escaped(p, b.out);
      REQUIRE(e > p.cur.size() / 8);  // most needed the escape ...
      CHECK(b.frame.size() < e * 8);  // ... and cost less than the plain list's 8 bytes each
    }
  }
}

TEST_CASE("escapes: a block with one escape keeps the plain list (version 1 or 2)", "[escapes]") {
  // Ratios the table follows, but element 0 grows from zero: the one exact escape.
  const std::size_t n = 40000;
  pair_data p{tensor(dtype::f32, n), tensor(dtype::f32, n)};
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> growth(-0.2, 0.2);
  for (std::size_t i = 0; i < n; ++i) {
    set_f32(p.base, dtype::f32, i, 1e-6f);
    set_f32(p.cur, dtype::f32, i, float(1e-6 * std::exp2(growth(rng))));
  }
  set_f32(p.base, dtype::f32, 0, 0.0f);
  set_f32(p.cur, dtype::f32, 0, 2e-6f);
  for (int round_bits : {0, 12}) {
    const auto b = ratio_block(p, 3, round_bits);
    CHECK(int(b.frame[4]) == (round_bits ? block_format_version_rounded : block_format_version));
    CHECK(b.out == b.recon);
    // Escaped: the value itself, rounded where the block rounds.
    CHECK(std::fabs(get_f32(b.out, dtype::f32, 0) - 2e-6f) <= 2e-6f * 0x1p-13f);
  }
}

TEST_CASE("escapes: version 4 is refused on blocks that are not lossy and with bad rounding",
          "[escapes]") {
  const auto p = wild_growth(20000, 12);
  auto b = ratio_block(p, 1, 0);
  REQUIRE(int(b.frame[4]) == block_format_version_coded_escapes);
  {
    auto bad = b.frame;
    bad[7] = std::byte(23);  // fp32 has 23 mantissa bits: nothing to round
    CHECK_THROWS_AS(read_block_header(bad), ckpt::corrupt_error);
  }
  const auto exact = encode_exact(dtype::f32, p.cur);
  auto bad = exact;
  bad[4] = std::byte(block_format_version_coded_escapes);
  CHECK_THROWS_AS(read_block_header(bad), ckpt::corrupt_error);
  // A newer version than this reader knows is refused as unsupported, not as damage.
  auto newer = b.frame;
  newer[4] = std::byte(5);
  CHECK_THROWS_AS(read_block_header(newer), ckpt::error);
}
