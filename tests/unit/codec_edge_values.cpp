// Edge values (DESIGN.md §9 invariant 6): exact coding keeps every bit; lossy coding carries
// non-finite elements exactly through the escape and never produces a non-finite value from
// finite inputs.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "codec/tensor_codec.hpp"
#include "codec_test_util.hpp"

using namespace ckpt::codec;
using namespace ckpt::test;

namespace {

std::vector<float> specials() {
  using L = std::numeric_limits<float>;
  return {0.0f,
          -0.0f,
          L::denorm_min(),
          -L::denorm_min(),
          1e-40f,
          L::min(),
          L::max(),
          -L::max(),
          L::lowest(),
          L::infinity(),
          -L::infinity(),
          L::quiet_NaN(),
          std::bit_cast<float>(0x7fc12345u),  // NaN payloads
          std::bit_cast<float>(0xffa00001u),  // signalling NaN
          std::bit_cast<float>(0x7f800001u),
          1.0f,
          -1.0f,
          3.14159f};
}

}  // namespace

TEST_CASE("exact coding keeps every special value bit for bit", "[edge]") {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    auto data = tensor(t, 0);
    // Raw bit patterns so that 16-bit NaN payloads are the test's own, not conversions.
    std::mt19937 rng(1);
    const auto sp = specials();
    const std::size_t n = 6000;
    data = tensor(t, n);
    for (std::size_t i = 0; i < n; ++i) {
      if (t == dtype::f32) {
        const float f = sp[i % sp.size()];
        std::memcpy(data.data() + 4 * i, &f, 4);
      } else {
        const std::uint16_t pat[] = {0x0000,
                                     0x8000,
                                     0x0001,
                                     0x8001,
                                     0x7c00,
                                     0xfc00,
                                     0x7e01,
                                     0x7d55,
                                     0xff81,
                                     0x7f80,
                                     0x7bff,
                                     0x3c00,
                                     std::uint16_t(rng())};
        std::memcpy(data.data() + 2 * i, &pat[i % 13], 2);
      }
    }
    auto out = tensor(t, n);
    decode(encode_exact(t, data), {}, out);
    REQUIRE(out == data);
  }
}

TEST_CASE("lossy coding: specials exact via escapes, finite stays finite", "[edge]") {
  const auto sp = specials();
  const std::size_t n = sp.size() * sp.size();
  auto base = tensor(dtype::f32, n), cur = tensor(dtype::f32, n);
  // Every (base, cur) combination of specials, plus ordinary values around them.
  for (std::size_t i = 0; i < sp.size(); ++i)
    for (std::size_t j = 0; j < sp.size(); ++j) {
      std::memcpy(base.data() + 4 * (i * sp.size() + j), &sp[i], 4);
      std::memcpy(cur.data() + 4 * (i * sp.size() + j), &sp[j], 4);
    }
  for (int bits = 1; bits <= 4; ++bits) {
    const delta_input in{dtype::f32, cur, base};
    const auto q =
        plan_tables(std::span(&in, 1), bits, representative::mean, bucket_scope::tensor)[0];
    auto recon = tensor(dtype::f32, n), out = tensor(dtype::f32, n);
    decode(encode_delta(in, q, {bits, 0}, recon), base, out);
    REQUIRE(out == recon);
    for (std::size_t i = 0; i < n; ++i) {
      float u, b, r;
      std::memcpy(&u, cur.data() + 4 * i, 4);
      std::memcpy(&b, base.data() + 4 * i, 4);
      std::memcpy(&r, recon.data() + 4 * i, 4);
      INFO("base " << b << " cur " << u << " recon " << r);
      if (!std::isfinite(u) || !std::isfinite(b) || !std::isfinite(u - b)) {
        REQUIRE(std::memcmp(&u, &r, 4) == 0);  // escaped: exact, NaN payload included
      } else {
        REQUIRE(std::isfinite(r));
        REQUIRE(std::fabs(double(r) - u) <= std::fabs(double(u) - b));
      }
    }
  }
}

TEST_CASE("all-zero deltas and constant tensors cost almost nothing and are exact", "[edge]") {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    const std::size_t n = 1 << 18;
    auto p = random_pair(t, n, 4);
    const delta_input same{t, p.base, p.base};
    const auto q =
        plan_tables(std::span(&same, 1), 2, representative::mean, bucket_scope::tensor)[0];
    auto recon = tensor(t, n), out = tensor(t, n);
    const auto frame = encode_delta(same, q, {2, 0}, recon);
    REQUIRE(recon == p.base);
    decode(frame, p.base, out);
    REQUIRE(out == p.base);
    REQUIRE(frame.size() < 200);  // a constant stream per block

    auto constant = tensor(t, n);
    for (std::size_t i = 0; i < n; ++i) set_f32(constant, t, i, 0.125f);
    const auto ef = encode_exact(t, constant);
    REQUIRE(ef.size() < 300);
    decode(ef, {}, out);
    REQUIRE(out == constant);
  }
}

TEST_CASE("signed zeros and denormal deltas stay within the bound", "[edge]") {
  const std::size_t n = 1000;
  auto base = tensor(dtype::f32, n), cur = tensor(dtype::f32, n);
  for (std::size_t i = 0; i < n; ++i) {
    set_f32(base, dtype::f32, i, i % 2 ? 0.0f : -0.0f);
    set_f32(cur, dtype::f32, i,
            i % 3 ? -0.0f : std::numeric_limits<float>::denorm_min() * float(i));
  }
  const delta_input in{dtype::f32, cur, base};
  const auto q = plan_tables(std::span(&in, 1), 3, representative::mean, bucket_scope::tensor)[0];
  auto recon = tensor(dtype::f32, n), out = tensor(dtype::f32, n);
  decode(encode_delta(in, q, {3, 0}, recon), base, out);
  REQUIRE(out == recon);
  for (std::size_t i = 0; i < n; ++i) {
    const double u = get_f32(cur, dtype::f32, i), r = get_f32(recon, dtype::f32, i);
    REQUIRE(std::fabs(r - u) <= std::fabs(u - get_f32(base, dtype::f32, i)));
  }
}
