// Lossy and exact round trips through whole tensor frames: every size class, bits, group size
// and dtype. Decoding returns exactly the encoder's reconstruction, and no element moves away
// from its target: |ũ - u| <= |u - base|.
#include <catch2/catch.hpp>
#include <cmath>

#include "codec/tensor_codec.hpp"
#include "codec_test_util.hpp"

using namespace ckpt::codec;
using namespace ckpt::test;

namespace {

const std::size_t kSizes[] = {0, 1, 2, 7, 33, 1000, 4097, 70001};
constexpr std::size_t kSmallBlocks = 16384;  // so that 70001 elements span several blocks

void check_bound(const pair_data& p, const std::vector<std::byte>& recon, dtype t, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const double u = get_f32(p.cur, t, i), b = get_f32(p.base, t, i), r = get_f32(recon, t, i);
    INFO("element " << i << " u=" << u << " base=" << b << " recon=" << r);
    REQUIRE(std::fabs(r - u) <= std::fabs(u - b));
  }
}

}  // namespace

TEST_CASE("lossy round trip: every dtype, bits, group, representative and size", "[roundtrip]") {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    for (std::size_t n : kSizes) {
      const auto p = random_pair(t, n, n + 17 * int(t));
      const delta_input in{t, p.cur, p.base};
      for (int bits = 1; bits <= 4; ++bits) {
        for (int k = 1; k * bits <= 8; ++k) {
          for (auto rep : {representative::mean, representative::midrange}) {
            INFO("dtype=" << name(t) << " n=" << n << " bits=" << bits << " k=" << k
                          << " rep=" << name(rep));
            const auto q = plan_tables(std::span(&in, 1), bits, rep, bucket_scope::tensor)[0];
            auto recon = tensor(t, n), out = tensor(t, n);
            const lossy_params lp{bits, k, rep,
                                  k == 1 ? entropy_policy::huffman_only : entropy_policy::best};
            const auto frame = encode_delta(in, q, lp, recon, kSmallBlocks);
            decode(frame, p.base, out);
            REQUIRE(out == recon);
            check_bound(p, recon, t, n);
            REQUIRE(inspect(frame).elements == n);
          }
        }
      }
    }
  }
}

TEST_CASE("exact round trip: float planes and bytes, bit for bit", "[roundtrip]") {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    for (std::size_t n : kSizes) {
      const auto p = random_pair(t, n, n);
      auto out = tensor(t, n);
      const auto frame = encode_exact(t, p.cur, kSmallBlocks);
      decode(frame, {}, out);
      REQUIRE(out == p.cur);
      if (n >= 4096 && t != dtype::f16) REQUIRE(frame.size() < p.cur.size());  // exponent coded
    }
  }
  for (std::size_t n : kSizes) {
    const auto data = random_bytes(n, n);
    std::vector<std::byte> out(n);
    const auto frame = encode_exact(dtype::bytes, data, kSmallBlocks);
    decode(frame, {}, out);
    REQUIRE(out == data);
  }
}

TEST_CASE("a block that does not shrink is stored raw", "[roundtrip]") {
  std::mt19937 rng(3);
  std::vector<std::byte> noise(4 * 5000);
  for (auto& b : noise) b = std::byte(rng());
  const auto frame = encode_exact(dtype::f32, noise);
  REQUIRE(read_block_header(frame).codec == block_codec::raw);
  REQUIRE(frame.size() == noise.size() + block_header_size);
  std::vector<std::byte> out(noise.size());
  decode(frame, {}, out);
  REQUIRE(out == noise);
}

TEST_CASE("whole-checkpoint scope shares one table, per-tensor scope does not", "[roundtrip]") {
  // Two tensors whose deltas differ by six orders of magnitude (weights vs Adam's v).
  const auto big = random_pair(dtype::f32, 5000, 1);
  auto small = random_pair(dtype::f32, 5000, 2);
  for (std::size_t i = 0; i < 5000; ++i) {
    const float b = get_f32(small.base, dtype::f32, i);
    const float u = get_f32(small.cur, dtype::f32, i);
    set_f32(small.cur, dtype::f32, i, b + (u - b) * 1e-6f);
  }
  const delta_input in[] = {{dtype::f32, big.cur, big.base}, {dtype::f32, small.cur, small.base}};
  const auto whole = plan_tables(in, 3, representative::mean, bucket_scope::checkpoint);
  const auto each = plan_tables(in, 3, representative::mean, bucket_scope::tensor);
  REQUIRE(whole[0].rep == whole[1].rep);
  REQUIRE(each[0].rep != each[1].rep);
  auto recon = tensor(dtype::f32, 5000);
  // With the shared table the small tensor's deltas are all dropped; with its own they are not.
  encode_delta(in[1], whole[1], {3, 2}, recon);
  REQUIRE(recon == small.base);
  encode_delta(in[1], each[1], {3, 2}, recon);
  REQUIRE(recon != small.base);
}
