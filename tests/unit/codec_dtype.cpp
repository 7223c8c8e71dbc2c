// Exactness of the 16-bit float conversions that every lossy reconstruction goes through.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>

#include "codec/dtype.hpp"

using namespace ckpt::codec;

TEST_CASE("f16 -> f32 -> f16 is the identity for every non-NaN half", "[dtype]") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(std::uint16_t(h));
    if (std::isnan(f)) {
      REQUIRE((h & 0x7c00) == 0x7c00);
      REQUIRE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    REQUIRE(f32_to_f16(f) == h);
    // Our decode agrees with the compiler's own binary16 type.
    REQUIRE(f == float(std::bit_cast<_Float16>(std::uint16_t(h))));
  }
}

TEST_CASE("f32 -> f16 rounds to nearest even like the hardware conversion", "[dtype]") {
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    const float f = std::bit_cast<float>(std::uint32_t(rng()));
    if (std::isnan(f)) continue;
    const _Float16 ref = _Float16(f);
    REQUIRE(f32_to_f16(f) == std::bit_cast<std::uint16_t>(ref));
  }
  REQUIRE(f32_to_f16(65519.0f) == 0x7bff);  // rounds down to max half
  REQUIRE(f32_to_f16(65520.0f) == 0x7c00);  // rounds to Inf
  REQUIRE(f32_to_f16(-0.0f) == 0x8000);
}

TEST_CASE("f32 -> bf16 rounds to the nearest representable value, ties to even", "[dtype]") {
  std::mt19937 rng(9);
  for (int i = 0; i < 2000000; ++i) {
    const std::uint32_t x = rng();
    const float f = std::bit_cast<float>(x);
    if (!std::isfinite(f)) continue;
    const std::uint16_t r = f32_to_bf16(f);
    const double lo = bf16_to_f32(std::uint16_t(x >> 16));
    // Next magnitude up; past the largest finite bf16 that is 2^128, where RNE overflows to Inf.
    const std::uint16_t up = std::uint16_t((x >> 16) + 1);
    const bool overflow = (up & 0x7fff) == 0x7f80;
    const double hi = overflow ? std::copysign(std::ldexp(1.0, 128), double(f)) : bf16_to_f32(up);
    const double got = bf16_to_f32(r);
    const double dlo = std::fabs(double(f) - lo), dhi = std::fabs(double(f) - hi);
    if (dlo < dhi) REQUIRE(got == lo);
    if (dhi < dlo) REQUIRE(got == (overflow ? double(bf16_to_f32(up)) : hi));
    if (dlo == dhi) REQUIRE((r & 1) == 0);
  }
  REQUIRE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  REQUIRE(f32_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
}
