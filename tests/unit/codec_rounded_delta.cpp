// Deltas that round their reconstruction (lossy_params::round_bits): what the decoder returns is
// what the encoder assumed, every element has the kept mantissa bits, the closed loop
// |ũ - u| <= |u - ũ_prev| still holds over a chain on a rounded keyframe (the base has N bits,
// and the nearest N-bit value is never farther than it), the vector and scalar encoders agree
// element for element, specials stay specials, and the header says so in a way older decoders
// refuse.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "codec/block.hpp"
#include "codec/error.hpp"
#include "codec/lc_kernel.hpp"
#include "codec/mantissa.hpp"
#include "codec/tensor_codec.hpp"
#include "codec_test_util.hpp"

using namespace ckpt::codec;
using namespace ckpt::test;

namespace {

std::vector<std::byte> rounded(dtype t, const std::vector<std::byte>& v, int keep) {
  std::vector<std::byte> out(v.size());
  round_mantissa(t, v, out, keep);
  return out;
}

lossy_params rounding(int bits, int round_bits) {
  return {bits, 0, representative::mean, entropy_policy::best, round_bits};
}

}  // namespace

TEST_CASE("rounded deltas: a chain on a rounded keyframe keeps N bits and the closed loop",
          "[rounded]") {
  for (int keep : {12, 8}) {
    for (bool ratio : {false, true}) {  // weights, and a positive tensor like Adam's v
      const std::size_t n = 30011;      // not a multiple of 8: the vector and scalar paths
      std::mt19937_64 rng(std::uint64_t(keep * 2 + ratio));
      // Steps of about 2^-10 of a weight: above the rounding unit at both widths.
      std::normal_distribution<float> w(0.0f, 0.05f), step(0.0f, keep == 8 ? 2e-3f : 1e-4f);
      std::vector<float> u(n);
      for (auto& x : u) x = ratio ? std::fabs(w(rng)) * 1e-3f + 1e-9f : w(rng);
      auto prev = tensor(dtype::f32, n);
      std::memcpy(prev.data(), u.data(), 4 * n);
      prev = rounded(dtype::f32, prev, keep);  // the lossy keyframe
      std::vector<double> worst;
      for (int version = 1; version <= 30; ++version) {
        auto cur = tensor(dtype::f32, n);
        for (std::size_t i = 0; i < n; ++i) {
          u[i] = ratio ? u[i] * (1.0f + 20 * step(rng)) : u[i] + step(rng) * (i % 10 ? 1 : 10);
          set_f32(cur, dtype::f32, i, u[i]);
        }
        const delta_input in{dtype::f32, cur, prev};
        const auto q =
            plan_tables(std::span(&in, 1), 3, representative::mean, bucket_scope::tensor, ratio)[0];
        REQUIRE((q.kind == delta_kind::ratio) == ratio);
        auto recon = tensor(dtype::f32, n), decoded = tensor(dtype::f32, n);
        const auto frame = encode_delta(in, q, rounding(3, keep), recon, 16384);
        decode(frame, prev, decoded);
        REQUIRE(decoded == recon);
        REQUIRE(rounded(dtype::f32, recon, keep) == recon);  // N bits, every element
        double w_err = 0;
        std::size_t moved = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const double ut = get_f32(cur, dtype::f32, i), b = get_f32(prev, dtype::f32, i);
          const double now = get_f32(recon, dtype::f32, i);
          const double bound = std::fabs(ut - b);
          INFO("keep " << keep << " ratio " << ratio << " version " << version << " element " << i);
          REQUIRE(std::fabs(now - ut) <= bound);
          w_err = std::max(w_err, std::fabs(now - ut) / std::max(1e-30, std::fabs(ut)));
          moved += now != b;
        }
        // Rounding leaves the deltas their work: about as many elements move as without it.
        auto unrounded = tensor(dtype::f32, n);
        encode_delta(in, q, rounding(3, 0), unrounded, 16384);
        std::size_t moved_unrounded = 0;
        for (std::size_t i = 0; i < n; ++i)
          moved_unrounded += get_f32(unrounded, dtype::f32, i) != get_f32(prev, dtype::f32, i);
        INFO("keep " << keep << " ratio " << ratio << " version " << version << " moved " << moved
                     << " of " << moved_unrounded);
        REQUIRE(moved_unrounded > n / 20);
        REQUIRE(double(moved) >= 0.9 * double(moved_unrounded));
        worst.push_back(w_err);
        prev = recon;
      }
      // No accumulation along the chain: late versions are no worse than early ones.
      const double early = *std::max_element(worst.begin(), worst.begin() + 10);
      const double late = *std::max_element(worst.end() - 10, worst.end());
      INFO("keep " << keep << " ratio " << ratio << " early " << early << " late " << late);
      REQUIRE(late <= 2.0 * early);
    }
  }
}

TEST_CASE("rounded deltas: specials, the top binade, escapes and the raw fallback",
          "[rounded][edge]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> base_v = {0.0f, -0.0f,  1.0f,    FLT_MAX, -FLT_MAX, 1e-40f,
                                     2.5f, -3.75f, 1e-3f,   inf,     0.5f,     FLT_MAX,
                                     1.0f, 100.0f, -0.125f, 7.0f,    0.0f};
  const std::vector<float> cur_v = {1e-38f,  0.0f,     1.0001f,  FLT_MAX,  -3.4e38f, 2e-40f,
                                    nan,     -3.7501f, 1.1e-3f,  1.0f,     inf,      3.3e38f,
                                    0.9999f, 100.5f,   -0.1251f, 7.00001f, -2.0f};
  const std::size_t n = base_v.size();
  auto base = tensor(dtype::f32, n), cur = tensor(dtype::f32, n);
  std::memcpy(base.data(), base_v.data(), 4 * n);
  std::memcpy(cur.data(), cur_v.data(), 4 * n);
  base = rounded(dtype::f32, base, 12);
  const delta_input in{dtype::f32, cur, base};
  const auto q = plan_tables(std::span(&in, 1), 3, representative::mean, bucket_scope::tensor)[0];
  auto recon = tensor(dtype::f32, n), out = tensor(dtype::f32, n);
  const auto frame = encode_delta(in, q, rounding(3, 12), recon);
  decode(frame, base, out);
  REQUIRE(std::memcmp(out.data(), recon.data(), out.size()) == 0);  // NaN bits included
  REQUIRE(std::memcmp(rounded(dtype::f32, recon, 12).data(), recon.data(), recon.size()) == 0);
  for (std::size_t i = 0; i < n; ++i) {
    const float r = get_f32(recon, dtype::f32, i), c = cur_v[i];
    INFO("element " << i << " cur " << c << " recon " << r);
    if (std::isnan(c)) {
      CHECK(std::isnan(r));
    } else if (std::isinf(c) || std::isinf(get_f32(base, dtype::f32, i))) {
      CHECK(r == get_f32(rounded(dtype::f32, cur, 12), dtype::f32, i));  // escaped, rounded
    } else {
      CHECK(std::isfinite(r));
    }
  }
  // A block too small to shrink falls back to a raw block: of the rounded elements.
  std::vector<float> few_v = {0.123456789f, -7.654321f, 3.3333333f};
  auto few = tensor(dtype::f32, 3), few_base = tensor(dtype::f32, 3);
  std::memcpy(few.data(), few_v.data(), 12);
  const delta_input tiny{dtype::f32, few, few_base};
  const auto qt =
      plan_tables(std::span(&tiny, 1), 3, representative::mean, bucket_scope::tensor)[0];
  auto recon_t = tensor(dtype::f32, 3), out_t = tensor(dtype::f32, 3);
  const auto raw = encode_delta(tiny, qt, rounding(3, 12), recon_t);
  REQUIRE(read_block_header(raw).codec == block_codec::raw);
  decode(raw, few_base, out_t);
  REQUIRE(out_t == recon_t);
  REQUIRE(recon_t == rounded(dtype::f32, few, 12));
  REQUIRE(recon_t != few);
}

TEST_CASE("rounded deltas: version 2 headers, refused values and refused parameters", "[rounded]") {
  const auto p = random_pair(dtype::f32, 5000, 4);
  const delta_input in{dtype::f32, p.cur, p.base};
  const auto q = plan_tables(std::span(&in, 1), 3, representative::mean, bucket_scope::tensor)[0];
  auto recon = tensor(dtype::f32, 5000);
  const auto plain = encode_delta(in, q, rounding(3, 0), recon);
  const auto round12 = encode_delta(in, q, rounding(3, 12), recon);
  CHECK(std::uint8_t(plain[4]) == block_format_version);
  CHECK(std::uint8_t(plain[7]) == 0);
  CHECK(std::uint8_t(round12[4]) == block_format_version_rounded);
  CHECK(std::uint8_t(round12[7]) == 12);
  CHECK(read_block_header(round12).round_bits == 12);
  CHECK(read_block_header(plain).round_bits == 0);
  // A decoder that knows only version 1 refuses the block as unsupported, not as corrupt data;
  // this one refuses versions it does not know the same way.
  auto future = round12;
  future[4] = std::byte(3);
  CHECK_THROWS_AS(read_block_header(future), ckpt::error);
  // Rounding of 0 bits, or of all the dtype's mantissa bits, does not exist in a header.
  for (int bad : {0, 23, 24, 255}) {
    auto b = round12;
    b[7] = std::byte(bad);
    CHECK_THROWS_AS(read_block_header(b), ckpt::corrupt_error);
  }
  // Only lossy blocks round.
  auto exact = encode_exact(dtype::f32, p.cur);
  exact[4] = std::byte(block_format_version_rounded);
  exact[7] = std::byte(12);
  CHECK_THROWS_AS(read_block_header(exact), ckpt::corrupt_error);
  // The encoder refuses rounding it cannot express.
  CHECK_THROWS_AS(encode_delta(in, q, rounding(3, 23), recon), ckpt::invalid_argument);
  CHECK_THROWS_AS(encode_delta(in, q, rounding(3, -1), recon), ckpt::invalid_argument);
  const auto h = random_pair(dtype::bf16, 1000, 5);
  const delta_input hin{dtype::bf16, h.cur, h.base};
  const auto hq = plan_tables(std::span(&hin, 1), 3, representative::mean, bucket_scope::tensor)[0];
  auto hrecon = tensor(dtype::bf16, 1000);
  CHECK_THROWS_AS(encode_delta(hin, hq, rounding(3, 7), hrecon), ckpt::invalid_argument);
  CHECK_NOTHROW(encode_delta(hin, hq, rounding(3, 4), hrecon));
  CHECK(rounded(dtype::bf16, hrecon, 4) == hrecon);
}

TEST_CASE("rounded deltas: the vector encoder agrees with the scalar one element for element",
          "[rounded][edge]") {
  // One call over n elements (eight at a time where the CPU has AVX2) against n calls of one
  // element (the scalar path), on values that reach the top binade (where rounding up would
  // overflow and truncates instead), subnormals, zeros, bases with and without N bits, and
  // escapes (non-finite values, ratios beyond a factor 2), which the vector path makes itself.
  std::mt19937_64 rng(77);
  std::uniform_int_distribution<std::uint32_t> any;
  std::normal_distribution<float> w(0.0f, 1.0f);
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::bit_cast<float>(0x7fc01234u), std::bit_cast<float>(0xffa00001u)};
  for (int keep : {12, 5, 1, 0}) {
    for (bool ratio : {false, true}) {
      const std::size_t n = 4096 + 3;
      auto cur = tensor(dtype::f32, n), base = tensor(dtype::f32, n);
      for (std::size_t i = 0; i < n; ++i) {
        float b, c;
        switch (i % 37 == 11 ? 4 : i % 4) {
          case 4:  // a non-finite value in the base, the current version or both (ratio
                   // tensors are nonnegative: +inf alone)
            b = i % 3 == 1 ? w(rng) * 0.05f : specials[ratio ? 0 : (i / 37) % 4];
            c = i % 3 == 2 ? w(rng) * 0.05f : specials[ratio ? 0 : (i / 37 + 1) % 4];
            break;
          case 0:  // the top binade, steps that round up into it or past it
            b = std::nextafter(FLT_MAX, 0.0f) * (1.0f - std::fabs(w(rng)) * 1e-3f);
            c = FLT_MAX * (1.0f - std::fabs(w(rng)) * 1e-4f);
            break;
          case 1:  // any bit pattern that is finite
            do {
              b = std::bit_cast<float>(any(rng));
              c = std::bit_cast<float>(any(rng));
            } while (!std::isfinite(b) || !std::isfinite(c));
            break;
          case 2:  // subnormals and zeros
            b = std::ldexp(w(rng), -135);
            c = i % 8 == 2 ? -0.0f : std::ldexp(w(rng), -140);
            break;
          default:  // ordinary weights and small steps
            b = w(rng) * 0.05f;
            c = b + w(rng) * 1e-3f;
        }
        if (ratio) b = std::fabs(b), c = std::fabs(c);
        set_f32(base, dtype::f32, i, b);
        set_f32(cur, dtype::f32, i, c);
      }
      const delta_input in{dtype::f32, cur, base};
      // 1, 3 and 4 bits: a ratio table maps more than 15 keys here, so the vector path looks
      // symbols up by a gather and representatives by one permute, or two for 16 symbols.
      for (int bits : {1, 3, 4}) {
        const auto q = plan_tables(std::span(&in, 1), bits, representative::mean,
                                   bucket_scope::tensor, ratio)[0];
        REQUIRE((q.kind == delta_kind::ratio) == ratio);
        auto recon = tensor(dtype::f32, n), one_recon = tensor(dtype::f32, n);
        std::vector<std::uint8_t> symbols(n + 8), one_symbols(n + 8);
        std::vector<std::uint32_t> escapes, one_escapes, e;
        lc_encode_symbols(dtype::f32, cur.data(), base.data(), n, q, keep, recon.data(),
                          symbols.data(), escapes);
        for (std::size_t i = 0; i < n; ++i) {
          e.clear();
          lc_encode_symbols(dtype::f32, cur.data() + 4 * i, base.data() + 4 * i, 1, q, keep,
                            one_recon.data() + 4 * i, one_symbols.data() + i, e);
          if (!e.empty()) one_escapes.push_back(std::uint32_t(i));
        }
        INFO("keep " << keep << " ratio " << ratio << " bits " << bits);
        CHECK(std::memcmp(recon.data(), one_recon.data(), recon.size()) == 0);
        CHECK(
            std::equal(symbols.begin(), symbols.begin() + std::ptrdiff_t(n), one_symbols.begin()));
        CHECK(escapes == one_escapes);
        std::size_t specials_in = 0;
        for (std::size_t i = 0; i < n; ++i)
          specials_in += !std::isfinite(get_f32(cur, dtype::f32, i)) ||
                         !std::isfinite(get_f32(base, dtype::f32, i));
        CHECK(specials_in > n / 40);
        // Every element whose delta is not finite is an escape, in both paths (for ratios
        // c == b == inf is a zero change, not an escape).
        std::size_t nonfinite = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const float c = get_f32(cur, dtype::f32, i), b = get_f32(base, dtype::f32, i);
          const float d = ratio ? (c == b ? 0.0f : c / b - 1.0f) : c - b;
          if (std::isfinite(d)) continue;
          ++nonfinite;
          INFO("element " << i << ": " << c << " against " << b);
          CHECK(std::binary_search(escapes.begin(), escapes.end(), std::uint32_t(i)));
        }
        CHECK(nonfinite > n / 80);
        if (keep) CHECK(rounded(dtype::f32, recon, keep) == recon);
      }
    }
  }
}

TEST_CASE("rounded deltas: f16 and bf16 chains decode to the reconstruction", "[rounded]") {
  for (auto [t, keep] : {std::pair{dtype::f16, 6}, std::pair{dtype::bf16, 4}}) {
    for (bool ratio : {false, true}) {
      const std::size_t n = 20011;
      auto p = random_pair(t, n, 5 + std::uint64_t(keep));
      if (ratio)
        for (std::size_t i = 0; i < n; ++i) {
          set_f32(p.base, t, i, std::fabs(get_f32(p.base, t, i)));
          set_f32(p.cur, t, i, std::fabs(get_f32(p.cur, t, i)));
        }
      auto prev = rounded(t, p.base, keep);
      for (int version = 0; version < 5; ++version) {
        const delta_input in{t, p.cur, prev};
        const auto q =
            plan_tables(std::span(&in, 1), 3, representative::mean, bucket_scope::tensor, ratio)[0];
        auto recon = tensor(t, n), decoded = tensor(t, n);
        decode(encode_delta(in, q, rounding(3, keep), recon, 8192), prev, decoded);
        INFO(name(t) << " ratio " << ratio << " version " << version);
        REQUIRE(decoded == recon);
        REQUIRE(rounded(t, recon, keep) == recon);
        for (std::size_t i = 0; i < n; ++i) {
          const double u = get_f32(p.cur, t, i), b = get_f32(prev, t, i);
          REQUIRE(std::fabs(double(get_f32(recon, t, i)) - u) <= std::fabs(u - b));
        }
        prev = recon;
      }
    }
  }
}

TEST_CASE("rounded deltas: every bits and group decode to the reconstruction", "[rounded]") {
  // The decoder rounds in its kernel for fp32 with 2, 4 or 8 symbols a group (vector or scalar;
  // the vector kernel picks representatives by a register permute, two for 4 bits) and in a
  // second pass otherwise: both must give the encoder's reconstruction, for every group geometry.
  for (auto [t, keep] : {std::pair{dtype::f32, 12}, std::pair{dtype::f32, 3},
                         std::pair{dtype::bf16, 4}, std::pair{dtype::f16, 7}}) {
    for (int bits = 1; bits <= 4; ++bits) {
      for (int group : {0, 1, 2, 3, 4, 8}) {
        if (group * bits > 8) continue;
        for (bool ratio : {false, true}) {
          const std::size_t n = 9001;
          auto p = random_pair(t, n, std::uint64_t(bits * 10 + group));
          if (ratio)
            for (std::size_t i = 0; i < n; ++i) {
              set_f32(p.base, t, i, std::fabs(get_f32(p.base, t, i)));
              set_f32(p.cur, t, i, std::fabs(get_f32(p.cur, t, i)));
            }
          const auto base = rounded(t, p.base, keep);
          const delta_input in{t, p.cur, base};
          const auto q = plan_tables(std::span(&in, 1), bits, representative::mean,
                                     bucket_scope::tensor, ratio)[0];
          auto recon = tensor(t, n), decoded = tensor(t, n);
          const lossy_params lp{bits, group, representative::mean, entropy_policy::best, keep};
          decode(encode_delta(in, q, lp, recon, 4096), base, decoded);
          INFO(name(t) << " keep " << keep << " bits " << bits << " group " << group << " ratio "
                       << ratio);
          REQUIRE(decoded == recon);
          REQUIRE(rounded(t, recon, keep) == recon);
        }
      }
    }
  }
}
