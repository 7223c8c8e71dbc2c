// Decoding refuses damaged blocks with a typed error: every single-bit flip is caught by the
// checksum, truncation by the lengths, and lying headers or payloads with a re-sealed checksum
// by the structural checks, without crashing or reading out of bounds.
#include <xxhash.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>

#include "codec/block.hpp"
#include "codec/error.hpp"
#include "codec/tensor_codec.hpp"
#include "codec_test_util.hpp"

using namespace ckpt::codec;
using namespace ckpt::test;

namespace {

struct sample {
  std::string what;
  std::vector<std::byte> frame, base;
  std::size_t out_bytes;
};

std::vector<sample> samples() {
  std::vector<sample> s;
  const auto p = random_pair(dtype::f32, 3000, 1);
  const delta_input in{dtype::f32, p.cur, p.base};
  auto recon = tensor(dtype::f32, 3000);
  for (auto [bits, k, pol] :
       {std::tuple{2, 4, entropy_policy::best}, std::tuple{3, 2, entropy_policy::best},
        std::tuple{3, 1, entropy_policy::huffman_only}}) {
    const auto q =
        plan_tables(std::span(&in, 1), bits, representative::mean, bucket_scope::tensor)[0];
    s.push_back({"lc b" + std::to_string(bits) + " k" + std::to_string(k),
                 encode_delta(in, q, {bits, k, representative::mean, pol}, recon), p.base,
                 p.cur.size()});
  }
  {
    const auto q = plan_tables(std::span(&in, 1), 3, representative::mean, bucket_scope::tensor)[0];
    s.push_back({"lc b3 k2 rounded to 12 bits",
                 encode_delta(in, q, {3, 2, representative::mean, entropy_policy::best, 12}, recon),
                 p.base, p.cur.size()});
  }
  {
    const auto q = select_grid(gather_stats(std::span(&in, 1), false), 3, 1.0);
    REQUIRE(q.grid == 6);
    s.push_back({"lc grid b3 k2", encode_delta(in, q, {3, 2}, recon), p.base, p.cur.size()});
  }
  {
    // Second moments whose growth one factor cannot follow: most elements escape, coded
    // (block version 4).
    pair_data v{tensor(dtype::f32, 3000), tensor(dtype::f32, 3000)};
    std::mt19937_64 rng(7);
    for (std::size_t i = 0; i < 3000; ++i) {
      set_f32(v.base, dtype::f32, i, 1e-12f);
      set_f32(v.cur, dtype::f32, i, float(1e-12 * std::exp2(double(rng() % 30))));
    }
    const delta_input vin{dtype::f32, v.cur, v.base};
    const auto q =
        plan_tables(std::span(&vin, 1), 1, representative::mean, bucket_scope::tensor, true)[0];
    auto frame = encode_delta(vin, q, {1, 8}, recon);
    REQUIRE(int(frame[4]) == block_format_version_coded_escapes);
    s.push_back({"lc ratio b1 with coded escapes", std::move(frame), v.base, v.cur.size()});
  }
  {
    // Values unrelated to their base: an intra block (decoded without one).
    const auto other = random_pair(dtype::f32, 3000, 4);
    const delta_input fresh{dtype::f32, p.cur, other.cur};
    const auto q = plan_tables(std::span(&fresh, 1), 3, representative::mean, bucket_scope::tensor,
                               false, true)[0];
    REQUIRE(q.kind == delta_kind::intra);
    s.push_back({"lc intra b3 k2", encode_delta(fresh, q, {3, 2}, recon), {}, p.cur.size()});
  }
  s.push_back({"lossless f32", encode_exact(dtype::f32, p.cur), {}, p.cur.size()});
  const auto h = random_pair(dtype::f16, 3000, 2);
  s.push_back({"lossless f16", encode_exact(dtype::f16, h.cur), {}, h.cur.size()});
  const auto bytes = random_bytes(5000, 3);
  s.push_back({"zstd bytes", encode_exact(dtype::bytes, bytes), {}, bytes.size()});
  return s;
}

void reseal(std::vector<std::byte>& block) {
  std::uint32_t payload;
  std::memcpy(&payload, block.data() + 12, 4);
  const std::size_t avail = block.size() - block_header_size;
  const std::size_t len = std::min<std::size_t>(payload, avail);
  const std::uint64_t sum =
      XXH3_64bits_withSeed(block.data() + block_header_size, len, XXH3_64bits(block.data(), 24));
  std::memcpy(block.data() + 24, &sum, 8);
}

}  // namespace

TEST_CASE("every single-bit flip in a block is detected", "[corruption]") {
  for (const auto& s : samples()) {
    INFO(s.what << " (" << s.frame.size() << " bytes)");
    std::vector<std::byte> out(s.out_bytes);
    decode(s.frame, s.base, out);  // intact: fine
    for (std::size_t bit = 0; bit < s.frame.size() * 8; ++bit) {
      auto bad = s.frame;
      bad[bit / 8] ^= std::byte(1u << (bit % 8));
      INFO("bit " << bit);
      REQUIRE_THROWS_AS(decode(bad, s.base, out), ckpt::error);
    }
  }
}

TEST_CASE("truncated frames are refused", "[corruption]") {
  for (const auto& s : samples()) {
    INFO(s.what);
    std::vector<std::byte> out(s.out_bytes);
    for (std::size_t cut = 0; cut < s.frame.size(); ++cut) {
      auto part = std::span<const std::byte>(s.frame).first(cut);
      REQUIRE_THROWS_AS(decode(part, s.base, out), ckpt::corrupt_error);
    }
  }
}

TEST_CASE("lying headers and payloads with a valid checksum are refused cleanly", "[corruption]") {
  std::mt19937 rng(12);
  for (const auto& s : samples()) {
    INFO(s.what);
    std::vector<std::byte> out(s.out_bytes);
    // Header fields: version, codec, dtype, rounding, element count, payload size, bits, group.
    for (std::size_t at : {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16, 17, 18, 19}) {
      for (int v : {0, 1, 2, 3, 7, 9, 0x7f, 0xff}) {
        auto bad = s.frame;
        bad[at] = std::byte(v);
        reseal(bad);
        try {
          decode(bad, s.base, out);
        } catch (const ckpt::error&) {
        }
      }
    }
    // Random payload damage behind a valid checksum: decodes to something or refuses.
    for (int i = 0; i < 2000; ++i) {
      auto bad = s.frame;
      const int flips = 1 + int(rng() % 4);
      for (int f = 0; f < flips; ++f) {
        const std::size_t at = block_header_size + rng() % (bad.size() - block_header_size);
        bad[at] = std::byte(rng());
      }
      reseal(bad);
      try {
        decode(bad, s.base, out);
      } catch (const ckpt::error&) {
      }
    }
  }
  // A frame that claims more elements than the caller's buffer holds.
  const auto s = samples().front();
  std::vector<std::byte> small(s.out_bytes - 4);
  REQUIRE_THROWS_AS(decode(s.frame, std::span(s.base).first(small.size()), small),
                    ckpt::corrupt_error);
}
