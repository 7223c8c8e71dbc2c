// Bucket statistics and priority promotion against a direct computation.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <tuple>
#include <vector>

#include "codec/error.hpp"
#include "codec/quantizer.hpp"
#include "codec_test_util.hpp"

using namespace ckpt::codec;
using namespace ckpt::test;

TEST_CASE("buckets: the 2^b-1 largest survive across both signs, reps are mean or midrange",
          "[quantizer]") {
  const std::size_t n = 50000;
  const auto p = random_pair(dtype::f32, n, 99);
  // Direct computation in double, keyed by (sign, frexp exponent).
  std::map<int, std::vector<double>> members;
  for (std::size_t i = 0; i < n; ++i) {
    const float d = get_f32(p.cur, dtype::f32, i) - get_f32(p.base, dtype::f32, i);
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(d);
    const int e = (bits >> 23) & 0xff;
    if (e == 0) continue;
    members[int(bits >> 23)].push_back(d);
  }
  for (auto rep : {representative::mean, representative::midrange}) {
    delta_stats s;
    accumulate(s, dtype::f32, p.cur.data(), p.base.data(), n, rep == representative::midrange);
    for (int bits = 1; bits <= 4; ++bits) {
      const auto q = select_buckets(s, bits, rep);
      REQUIRE(q.rep[0] == 0.0f);
      REQUIRE(std::signbit(q.rep[0]));
      std::vector<std::pair<double, int>> expect;  // (|rep|, key)
      std::map<int, double> rep_of;
      for (auto& [key, v] : members) {
        double r;
        if (rep == representative::mean) {
          r = 0;
          for (double x : v) r += x;
          r /= double(v.size());
        } else {
          const auto [lo, hi] = std::minmax_element(
              v.begin(), v.end(), [](double a, double b) { return std::fabs(a) < std::fabs(b); });
          r = (*lo + *hi) / 2;
        }
        rep_of[key] = r;
        expect.push_back({std::fabs(r), key});
      }
      std::sort(expect.begin(), expect.end(), [](auto a, auto b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
      });
      const int keep = (1 << bits) - 1;
      for (int i = 0; i < keep; ++i) {
        const int key = expect[i].second;
        const int sym = q.symbol_of_key[key];
        REQUIRE(sym >= 1);
        REQUIRE(q.rep[sym] == Approx(rep_of[key]).epsilon(1e-6));
      }
      for (std::size_t i = keep; i < expect.size(); ++i)
        REQUIRE(q.symbol_of_key[expect[i].second] == 0);
      // Both signs occur among the survivors at b >= 2 (deltas are symmetric).
      if (bits >= 2) {
        bool pos = false, neg = false;
        for (int sym = 1; sym <= keep; ++sym) (q.rep[sym] > 0 ? pos : neg) = true;
        REQUIRE((pos && neg));
      }
    }
  }
}

TEST_CASE("stats merge in any order to the same table", "[quantizer]") {
  const auto p = random_pair(dtype::bf16, 30001, 5);
  delta_stats whole, a, b;
  accumulate(whole, dtype::bf16, p.cur.data(), p.base.data(), 30001, true);
  accumulate(a, dtype::bf16, p.cur.data(), p.base.data(), 12345, true);
  accumulate(b, dtype::bf16, p.cur.data() + 2 * 12345, p.base.data() + 2 * 12345, 30001 - 12345,
             true);
  b.merge(a);
  REQUIRE(b.count == whole.count);
  REQUIRE(b.mantissa_sum == whole.mantissa_sum);
  REQUIRE(b.mantissa_min == whole.mantissa_min);
  REQUIRE(b.mantissa_max == whole.mantissa_max);
}

TEST_CASE("bits outside 1..4 are refused", "[quantizer]") {
  delta_stats s;
  REQUIRE_THROWS_AS(select_buckets(s, 0, representative::mean), ckpt::invalid_argument);
  REQUIRE_THROWS_AS(select_buckets(s, 5, representative::mean), ckpt::invalid_argument);
}

TEST_CASE("stats equal a plain per-element reference, across lane flushes and kinds",
          "[quantizer]") {
  // Interleaved lanes with packed counters are flushed every 2^19 elements: cross that, with
  // deltas crowded into one key (the case the lanes exist for) and spread over many.
  std::mt19937_64 rng(11);
  const std::size_t n = (std::size_t(1) << 20) + 4099;
  for (const auto kind : {delta_kind::difference, delta_kind::ratio}) {
    for (const bool crowded : {true, false}) {
      std::vector<float> base(n), cur(n);
      std::normal_distribution<float> w(0.0f, 0.05f);
      std::uniform_real_distribution<float> u(0.999f, 1.001f);
      for (std::size_t i = 0; i < n; ++i) {
        base[i] = kind == delta_kind::ratio ? std::abs(w(rng)) + 1e-3f : w(rng);
        cur[i] = crowded ? base[i] + 1e-4f : base[i] * u(rng) + (i % 7 == 0 ? w(rng) : 0.0f);
      }
      // Edge pairs throughout (vector lanes and the scalar tail alike): equal values (0 / 0
      // and -0 / +0 included), infinities, NaN, subnormals; their deltas land in keys 0 and 255.
      const float inf = std::numeric_limits<float>::infinity();
      const float nan = std::numeric_limits<float>::quiet_NaN();
      const float sub = std::numeric_limits<float>::denorm_min();
      const std::pair<float, float> edges[] = {{0.0f, 0.0f}, {-0.0f, 0.0f}, {0.5f, 0.5f},
                                               {inf, 1.0f},  {1.0f, 0.0f},  {nan, 1.0f},
                                               {inf, inf},   {sub, 1.0f},   {3 * sub, sub}};
      for (std::size_t i = 5, e = 0; i < n; i += 97, ++e)
        std::tie(cur[i], base[i]) = edges[e % std::size(edges)];
      delta_stats ref;
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t d = std::bit_cast<std::uint32_t>(
            kind == delta_kind::ratio ? delta_of<delta_kind::ratio>(cur[i], base[i])
                                      : delta_of<delta_kind::difference>(cur[i], base[i]));
        const std::uint32_t k = d >> 23, m = d & 0x7fffffu;
        ++ref.count[k];
        ref.mantissa_sum[k] += m;
        ref.mantissa_min[k] = std::min(ref.mantissa_min[k], m);
        ref.mantissa_max[k] = std::max(ref.mantissa_max[k], m);
      }
      for (const bool range : {false, true}) {
        delta_stats s;
        accumulate(s, dtype::f32, reinterpret_cast<const std::byte*>(cur.data()),
                   reinterpret_cast<const std::byte*>(base.data()), n, range, kind);
        INFO("kind " << int(kind) << " crowded " << crowded << " range " << range);
        CHECK(s.count == ref.count);
        CHECK(s.mantissa_sum == ref.mantissa_sum);
        if (range) {
          CHECK(s.mantissa_min == ref.mantissa_min);
          CHECK(s.mantissa_max == ref.mantissa_max);
        }
      }
    }
  }
}

TEST_CASE("nonnegative: every bit pattern class at every lane, tail and chunk position",
          "[quantizer]") {
  // (storage bits, nonnegative?) per dtype: the values that sit on either side of each test.
  struct probe {
    std::uint32_t bits;
    bool ok;
  };
  const std::vector<probe> f32 = {
      {0x00000000u, true},  {0x80000000u, true},   // +0, -0
      {0x00000001u, true},  {0x7f7fffffu, true},   // smallest subnormal, largest finite
      {0x7f800000u, true},                         // +inf
      {0x80000001u, false}, {0xbf800000u, false},  // -subnormal, -1
      {0xff800000u, false},                        // -inf
      {0x7f800001u, false}, {0x7fc00000u, false}, {0xffc00000u, false}};  // NaNs
  const std::vector<probe> f16 = {{0x0000, true},  {0x8000, true},  {0x0001, true},
                                  {0x7bff, true},  {0x7c00, true},  {0x8001, false},
                                  {0xbc00, false}, {0xfc00, false}, {0x7c01, false},
                                  {0x7e00, false}, {0xfe00, false}};
  const std::vector<probe> bf16 = {{0x0000, true},  {0x8000, true},  {0x0001, true},
                                   {0x7f7f, true},  {0x7f80, true},  {0x8001, false},
                                   {0xbf80, false}, {0xff80, false}, {0x7f81, false},
                                   {0x7fc0, false}, {0xffc0, false}};
  auto run = [](dtype t, const std::vector<probe>& probes, auto word) {
    using W = decltype(word);
    for (std::size_t n : {1, 15, 16, 17, 33, 4095, 4096, 4097, 9000}) {
      std::vector<W> v(n, W(0x3f));  // a small positive value everywhere else
      auto bytes = [&] { return std::as_bytes(std::span(v)); };
      REQUIRE(nonnegative(t, bytes()));
      for (std::size_t at : {std::size_t(0), n / 2, n - 1, std::min<std::size_t>(n - 1, 4096)}) {
        for (const probe& p : probes) {
          v[at] = W(p.bits);
          CAPTURE(name(t), n, at, p.bits);
          REQUIRE(nonnegative(t, bytes()) == p.ok);
          v[at] = W(0x3f);
        }
      }
    }
  };
  run(dtype::f32, f32, std::uint32_t{});
  run(dtype::f16, f16, std::uint16_t{});
  run(dtype::bf16, bf16, std::uint16_t{});
}
