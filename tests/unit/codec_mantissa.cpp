// codec/mantissa: rounding a float tensor to fewer mantissa bits (lossy keyframes).
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "codec/error.hpp"
#include "codec/mantissa.hpp"

using namespace ckpt::codec;

namespace {

std::vector<float> rounded(const std::vector<float>& in, int keep) {
  std::vector<float> out(in.size());
  round_mantissa(dtype::f32, std::as_bytes(std::span(in)), std::as_writable_bytes(std::span(out)),
                 keep);
  return out;
}

// Round to nearest, ties to even, with `keep` mantissa bits, in double arithmetic (the current
// rounding mode is to nearest even): the reference for normal fp32 values.
float reference(float x, int keep) {
  int e = 0;
  std::frexp(double(x), &e);  // |x| = f * 2^e, f in [0.5, 1)
  const double unit = std::ldexp(1.0, e - 1 - keep);
  return float(std::nearbyint(double(x) / unit) * unit);
}

}  // namespace

TEST_CASE("round_mantissa: fp32 normals round to nearest even within 2^-(keep+1)", "[codec]") {
  std::mt19937 rng(3);
  std::uniform_int_distribution<std::uint32_t> bits;
  std::vector<float> in;
  while (in.size() < 200000) {
    const float x = std::bit_cast<float>(bits(rng));
    if (std::isnormal(x) && std::fabs(x) < 1e38f) in.push_back(x);
  }
  // Ties: exactly half a kept unit above a kept value.
  in.push_back(1.0f + std::ldexp(1.0f, -9));  // keep 8: tie between 1 and 1 + 2^-8, goes to 1
  in.push_back(1.0f + 3 * std::ldexp(1.0f, -9));
  for (int keep : {1, 4, 7, 8, 12, 16, 22}) {
    CAPTURE(keep);
    const auto out = rounded(in, keep);
    const std::uint32_t low = (std::uint32_t(1) << (23 - keep)) - 1;
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      REQUIRE((std::bit_cast<std::uint32_t>(out[i]) & low) == 0);
      REQUIRE(std::signbit(out[i]) == std::signbit(in[i]));
      REQUIRE(std::fabs(double(out[i]) - in[i]) <= std::ldexp(std::fabs(double(in[i])), -keep - 1));
      mismatches += out[i] != reference(in[i], keep);
    }
    CHECK(mismatches == 0);
  }
  const auto t8 = rounded({1.0f + std::ldexp(1.0f, -9), 1.0f + 3 * std::ldexp(1.0f, -9)}, 8);
  CHECK(t8[0] == 1.0f);                         // tie to even (down)
  CHECK(t8[1] == 1.0f + std::ldexp(1.0f, -7));  // tie to even (up)
}

TEST_CASE("round_mantissa: special values, overflow, subnormals, in place", "[codec]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float big = std::numeric_limits<float>::max();
  const float nan_payload = std::bit_cast<float>(0x7fc12345u);
  const float sub = std::numeric_limits<float>::denorm_min() * 12345;
  std::vector<float> in{0.0f, -0.0f, inf, -inf, nan_payload, big, -big, sub, -sub};
  const auto out = rounded(in, 7);
  CHECK(std::bit_cast<std::uint32_t>(out[0]) == 0u);
  CHECK(std::bit_cast<std::uint32_t>(out[1]) == 0x80000000u);
  CHECK(out[2] == inf);
  CHECK(out[3] == -inf);
  CHECK(std::bit_cast<std::uint32_t>(out[4]) == 0x7fc12345u);  // payload untouched
  CHECK(std::isfinite(out[5]));                                // would round up to Inf
  CHECK(out[5] <= big);
  CHECK(out[6] == -out[5]);
  // A subnormal moves by at most half of the kept unit (2^-149 * 2^(23-7) / 2).
  CHECK(std::fabs(double(out[7]) - sub) <= std::ldexp(1.0, -149 + 16 - 1));
  CHECK(out[8] == -out[7]);
  std::vector<float> same = in;
  round_mantissa(dtype::f32, std::as_bytes(std::span(same)),
                 std::as_writable_bytes(std::span(same)), 7);
  CHECK(std::memcmp(same.data(), out.data(), same.size() * 4) == 0);
  // keep >= 23: a copy.
  const auto all = rounded(in, 23);
  CHECK(std::memcmp(all.data(), in.data(), in.size() * 4) == 0);
}

TEST_CASE("round_mantissa: every fp16 and bf16 pattern", "[codec]") {
  for (dtype t : {dtype::f16, dtype::bf16}) {
    CAPTURE(int(t));
    const int man = mantissa_bits(t);
    const std::uint16_t exp_mask = t == dtype::f16 ? 0x7c00 : 0x7f80;
    std::vector<std::uint16_t> in(65536), out(65536);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = std::uint16_t(i);
    for (int keep = 1; keep < man; ++keep) {
      CAPTURE(keep);
      round_mantissa(t, std::as_bytes(std::span(in)), std::as_writable_bytes(std::span(out)), keep);
      const auto to_f32 = [t](std::uint16_t h) {
        return t == dtype::f16 ? f16_to_f32(h) : bf16_to_f32(h);
      };
      for (std::size_t i = 0; i < in.size(); ++i) {
        const std::uint16_t x = in[i], y = out[i];
        if ((x & exp_mask) == exp_mask) {  // Inf and NaN, payload included
          REQUIRE(y == x);
          continue;
        }
        REQUIRE((y & exp_mask) != exp_mask);  // finite stays finite
        REQUIRE((y & ((1u << (man - keep)) - 1)) == 0);
        REQUIRE((y & 0x8000) == (x & 0x8000));
        const double a = to_f32(x), b = to_f32(y);
        // Normal values: nearest, ties to even, unless that overflows (then truncated).
        const double top = t == dtype::f16 ? 65504.0 : double(std::numeric_limits<float>::max());
        if ((x & exp_mask) != 0 && std::fabs(double(reference(float(a), keep))) <= top)
          REQUIRE(b == double(reference(float(a), keep)));
        if ((x & exp_mask) != 0 && (y & exp_mask) != exp_mask && std::fabs(b) >= std::fabs(a))
          REQUIRE(std::fabs(b - a) <= std::ldexp(std::fabs(a), -keep - 1));
        else if ((x & exp_mask) != 0)  // rounded down, or truncated at the top
          REQUIRE(std::fabs(b - a) <= std::ldexp(std::fabs(a), -keep));
      }
    }
  }
}

TEST_CASE("round_mantissa: bad arguments are refused", "[codec]") {
  std::vector<std::byte> four(4), two(2), three(3);
  CHECK_THROWS_AS(round_mantissa(dtype::bytes, four, four, 4), ckpt::invalid_argument);
  CHECK_THROWS_AS(round_mantissa(dtype::f32, four, four, 0), ckpt::invalid_argument);
  CHECK_THROWS_AS(round_mantissa(dtype::f32, four, two, 4), ckpt::invalid_argument);
  CHECK_THROWS_AS(round_mantissa(dtype::f16, three, three, 4), ckpt::invalid_argument);
}
