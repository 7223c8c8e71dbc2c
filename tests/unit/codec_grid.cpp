// Grid tables (select_grid): differences quantised to the nearest multiple of a step set from the
// slab's RMS change. Tested: the table itself, that every element takes the nearest
// representative (the vector and scalar encoders alike, every dtype, rounded blocks too), the
// closed loop and the half-step bound, that blocks decode as ordinary LC blocks, and that it
// spends fewer bits than the paper's buckets at no more error on weight-like deltas.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>

#include "codec/block.hpp"
#include "codec/error.hpp"
#include "codec/mantissa.hpp"
#include "codec/tensor_codec.hpp"
#include "codec_test_util.hpp"

using namespace ckpt::codec;
using namespace ckpt::test;

namespace {

struct coded {
  std::vector<std::byte> frame, recon, out;
  quant_table table;
};

// The pair coded with `table` (its bits), decoded back into `out`.
coded code_with(const pair_data& p, dtype t, const quant_table& table, int round_bits = 0) {
  const delta_input in{t, p.cur, p.base};
  coded c;
  c.table = table;
  c.recon.resize(p.cur.size());
  lossy_params lp;
  lp.bits = table.bits;
  lp.rep = representative::midrange;
  lp.round_bits = round_bits;
  c.frame = encode_delta(in, c.table, lp, c.recon, 1u << 16);
  c.out.resize(p.cur.size());
  decode(c.frame, p.base, c.out);
  return c;
}

coded code(const pair_data& p, dtype t, int bits, double step, int round_bits = 0) {
  const delta_input in{t, p.cur, p.base};
  const auto stats = gather_stats(std::span(&in, 1), true, delta_kind::difference);
  return code_with(p, t,
                   step > 0 ? select_grid(stats, bits, step)
                            : select_buckets(stats, bits, representative::midrange),
                   round_bits);
}

double rms_delta(const pair_data& p, dtype t) {
  double s = 0;
  const std::size_t n = p.cur.size() / element_size(t);
  for (std::size_t i = 0; i < n; ++i) {
    const double d = double(get_f32(p.cur, t, i)) - double(get_f32(p.base, t, i));
    s += d * d;
  }
  return std::sqrt(s / double(n));
}

// `v` as the dtype holds it (rounded to nearest by set_f32).
float as_dtype(dtype t, float v) {
  auto one = tensor(t, 1);
  set_f32(one, t, 0, v);
  return get_f32(one, t, 0);
}

}  // namespace

TEST_CASE("grid: representatives are multiples of step times the RMS change", "[grid]") {
  const auto p = random_pair(dtype::f32, 100000, 3);
  const delta_input in{dtype::f32, p.cur, p.base};
  const auto stats = gather_stats(std::span(&in, 1), false, delta_kind::difference);
  const double rms = rms_delta(p, dtype::f32);
  for (int bits : {2, 3, 4}) {
    for (double step : {0.5, 1.0, 2.0}) {
      CAPTURE(bits, step);
      const auto q = select_grid(stats, bits, step);
      const int levels = (1 << (bits - 1)) - 1;
      REQUIRE(q.grid == 2 * levels);
      const double d = q.rep[1];
      // Bucket statistics estimate the RMS within the spread of a binade.
      CHECK(d / (step * rms) == Approx(1.0).epsilon(0.1));
      for (int j = 1; j <= levels; ++j) {  // j·Δ rounded once from the unrounded Δ: 1 ulp
        CHECK(q.rep[2 * j - 1] == Approx(j * d).epsilon(1e-7));
        CHECK(q.rep[2 * j] == -q.rep[2 * j - 1]);
      }
      CHECK(std::signbit(q.rep[0]));
      for (int i = 0; i + 1 < q.grid; ++i) CHECK(q.midpoint[i] < q.midpoint[i + 1]);
      for (int i = 0; i <= q.grid; ++i)
        if (i < q.grid) {
          CHECK(q.rep[q.grid_symbol[i]] < q.midpoint[i]);
          CHECK(q.rep[q.grid_symbol[i + 1]] > q.midpoint[i]);
        }
    }
  }
  // Statistics merged from two halves give the same table (thread counts cannot change it).
  const std::size_t half = p.cur.size() / 2;
  const delta_input a{dtype::f32, std::span(p.cur).first(half), std::span(p.base).first(half)};
  const delta_input b{dtype::f32, std::span(p.cur).subspan(half), std::span(p.base).subspan(half)};
  auto merged = gather_stats(std::span(&a, 1), false, delta_kind::difference);
  merged.merge(gather_stats(std::span(&b, 1), false, delta_kind::difference));
  const auto q1 = select_grid(stats, 3, 1.0), q2 = select_grid(merged, 3, 1.0);
  CHECK(q1.rep == q2.rep);
  CHECK(q1.midpoint == q2.midpoint);
}

TEST_CASE("grid: bad parameters are refused, a slab that did not change gets no symbols",
          "[grid]") {
  const auto p = random_pair(dtype::f32, 1000, 4);
  const delta_input in{dtype::f32, p.cur, p.base};
  const auto stats = gather_stats(std::span(&in, 1), false, delta_kind::difference);
  CHECK_THROWS_AS(select_grid(stats, 1, 1.0), ckpt::invalid_argument);
  CHECK_THROWS_AS(select_grid(stats, 5, 1.0), ckpt::invalid_argument);
  CHECK_THROWS_AS(select_grid(stats, 3, 0.0), ckpt::invalid_argument);
  CHECK_THROWS_AS(select_grid(stats, 3, -1.0), ckpt::invalid_argument);
  CHECK_THROWS_AS(select_grid(stats, 3, std::nan("")), ckpt::invalid_argument);
  const delta_input same{dtype::f32, p.base, p.base};
  const auto q =
      select_grid(gather_stats(std::span(&same, 1), false, delta_kind::difference), 3, 1.0);
  CHECK(q.grid == 0);
  pair_data unchanged{p.base, p.base};
  const auto c = code(unchanged, dtype::f32, 3, 1.0);
  CHECK(c.out == p.base);
}

TEST_CASE("grid: every element takes its nearest representative, within half a step", "[grid]") {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    for (int bits : {2, 3, 4}) {
      for (int round_bits : {0, 5}) {
        CAPTURE(name(t), bits, round_bits);
        // 1003 elements: the vector encoder's groups of eight and the scalar tail.
        auto p = random_pair(t, 1003, 10 + bits);
        // A rounded block's base has the bits it keeps (a rounded lineage's reconstruction).
        if (round_bits) round_mantissa(t, std::vector<std::byte>(p.base), p.base, round_bits);
        const auto c = code(p, t, bits, 1.0, round_bits);
        REQUIRE(c.table.grid > 0);
        CHECK(c.out == c.recon);  // decodes as the encoder reconstructed
        const int levels = (1 << (bits - 1)) - 1;
        const float step = c.table.rep[1];
        int moved = 0;
        for (std::size_t i = 0; i < 1003; ++i) {
          const float u = get_f32(p.cur, t, i), b = get_f32(p.base, t, i);
          const float got = get_f32(c.out, t, i);
          // The closed loop: never further than the base.
          CHECK(std::fabs(got - u) <= std::fabs(u - b));
          if (round_bits) continue;  // rounding moves candidates off the grid
          // At least as close as any representative the element could have taken (give or
          // take the dtype's unit: f16 and bf16 round the candidate after choosing it).
          const float unit = std::fabs(u) * (t == dtype::f32   ? 0.0f
                                             : t == dtype::f16 ? 0x1p-10f
                                                               : 0x1p-7f);
          for (int s = 0; s <= 2 * levels; ++s) {
            const float cand = as_dtype(t, b + c.table.rep[s]);
            CHECK(std::fabs(got - u) <= std::fabs(cand - u) * (1 + 1e-6f) + unit);
          }
          const float d = u - b;
          const float ulp = std::fabs(u) * (t == dtype::f32 ? 1e-7f : 1e-2f);
          if (std::fabs(d) <= (levels + 0.5f) * step)
            CHECK(std::fabs(got - u) <= 0.5f * step * (1 + 1e-5f) + ulp);
          moved += got != b;
        }
        if (!round_bits) CHECK(moved > 1003 / 3);
      }
    }
  }
}

namespace {

// Weights after a step of Gaussian deltas (light tails: the paper's buckets of the three largest
// binades a sign leave the bulk at the base) or of deltas whose scale spans six octaves from
// element to element (heavy tails: a grid step fit to the RMS skips the small ones).
pair_data stepped(std::size_t n, bool heavy, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> w(0.0f, 0.05f), g(0.0f, 1e-3f);
  std::uniform_real_distribution<float> octave(-3.0f, 3.0f);
  pair_data p{tensor(dtype::f32, n), tensor(dtype::f32, n)};
  for (std::size_t i = 0; i < n; ++i) {
    const float b = w(rng);
    set_f32(p.base, dtype::f32, i, b);
    set_f32(p.cur, dtype::f32, i, b + g(rng) * (heavy ? std::exp2(octave(rng)) : 1.0f));
  }
  return p;
}

double mse(const pair_data& p, const std::vector<std::byte>& r) {
  double e = 0;
  const std::size_t n = p.cur.size() / 4;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = double(get_f32(r, dtype::f32, i)) - double(get_f32(p.cur, dtype::f32, i));
    e += d * d;
  }
  return e / double(n);
}

}  // namespace

TEST_CASE("grid: estimates follow what coding measures", "[grid]") {
  for (bool heavy : {false, true}) {
    const auto p = stepped(200000, heavy, 21);
    const delta_input in{dtype::f32, p.cur, p.base};
    const auto stats = gather_stats(std::span(&in, 1), true, delta_kind::difference);
    for (double step : {0.0, 0.5, 1.0, 2.0}) {
      CAPTURE(heavy, step);
      const auto c = code(p, dtype::f32, 3, step);
      const auto est = estimate_coding(stats, c.table);
      const double bits = 8.0 * double(c.frame.size()) / 200000.0;
      // Within 5% of the error; the bits leave out the entropy coder's overhead and the table.
      CHECK(est.mse == Approx(mse(p, c.out)).epsilon(0.05));
      CHECK(est.bits <= bits);
      CHECK(est.bits >= 0.88 * bits);
    }
  }
  const auto p = stepped(1000, false, 22);
  const delta_input in{dtype::f32, p.cur, p.base};
  quant_table ratio = select_buckets(gather_stats(std::span(&in, 1), true, delta_kind::ratio), 3,
                                     representative::midrange, delta_kind::ratio);
  CHECK_THROWS_AS(estimate_coding(gather_stats(std::span(&in, 1), true, delta_kind::ratio), ratio),
                  ckpt::invalid_argument);
}

TEST_CASE("grid: a larger error bound takes a coarser grid with fewer bits", "[grid]") {
  for (bool heavy : {false, true}) {
    CAPTURE(heavy);
    const auto p = stepped(200000, heavy, 35);
    const delta_input in{dtype::f32, p.cur, p.base};
    const auto stats = gather_stats(std::span(&in, 1), true, delta_kind::difference);
    const auto buckets = code(p, dtype::f32, 3, 0.0);
    std::size_t bytes_before = buckets.frame.size();
    for (double scale : {1.0, 2.0, 4.0}) {
      CAPTURE(scale);
      const auto table =
          select_difference(stats, 3, representative::midrange, error_allowance{1e30, scale});
      REQUIRE(table.grid != 0);
      const coded c = code_with(p, dtype::f32, table);
      CAPTURE(c.frame.size(), bytes_before, mse(p, c.recon), mse(p, buckets.out));
      // Each doubling of the bound is about half a bit an element fewer (a step sqrt(2) times
      // larger), within the bound it names (the estimate's, checked here on the coded slab with
      // 10% of slack for the estimate's model of the tails).
      CHECK(double(c.frame.size()) < 0.97 * double(bytes_before));
      CHECK(mse(p, c.recon) <= 1.1 * scale * mse(p, buckets.out));
      if (scale > 1) CHECK(mse(p, c.recon) > 0.5 * scale * mse(p, buckets.out));
      bytes_before = c.frame.size();
    }
  }
}

TEST_CASE("grid: an error allowance is the floor within the buckets' error and the cap", "[grid]") {
  CHECK(error_allowance{}.bound(2.0) == 2.0);
  CHECK(error_allowance{1.0, 4}.bound(2.0) == 2.0);  // a floor below the buckets' error
  CHECK(error_allowance{5.0, 4}.bound(2.0) == 5.0);
  CHECK(error_allowance{50.0, 4}.bound(2.0) == 8.0);  // the cap
  CHECK(error_allowance{50.0, 1}.bound(2.0) == 2.0);
  CHECK(error_allowance{50.0, 4}.bound(0.0) == 0.0);
  // A slab's mean square from its sample: exact on a constant, finite values only, every dtype.
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    CAPTURE(name(t));
    auto v = tensor(t, 100000);
    for (std::size_t i = 0; i < 100000; ++i) set_f32(v, t, i, i % 2 ? 0.5f : -0.5f);
    CHECK(sampled_mean_square(t, v) == Approx(0.25));
    set_f32(v, t, 3, std::numeric_limits<float>::infinity());
    CHECK(sampled_mean_square(t, v) == Approx(0.25));
  }
  CHECK(sampled_mean_square(dtype::bytes, std::vector<std::byte>(64)) == 0);
  CHECK(sampled_mean_square(dtype::f32, {}) == 0);
  // The floor where it binds: the grid's error rises to it, not past it, with fewer bytes.
  const auto p = stepped(200000, false, 36);
  const delta_input in{dtype::f32, p.cur, p.base};
  const auto stats = gather_stats(std::span(&in, 1), true, delta_kind::difference);
  const auto buckets = code(p, dtype::f32, 3, 0.0);
  const double floor = 2.5 * mse(p, buckets.out);
  const auto table =
      select_difference(stats, 3, representative::midrange, error_allowance{floor, 4});
  REQUIRE(table.grid != 0);
  const coded c = code_with(p, dtype::f32, table);
  CAPTURE(c.frame.size(), buckets.frame.size(), mse(p, c.recon), floor);
  CHECK(mse(p, c.recon) <= 1.1 * floor);
  CHECK(mse(p, c.recon) > 0.5 * floor);
  CHECK(double(c.frame.size()) < 0.8 * double(buckets.frame.size()));
}

TEST_CASE("grid: select_difference takes the grid where it saves bits at the buckets' error",
          "[grid]") {
  for (bool heavy : {false, true}) {
    CAPTURE(heavy);
    const auto p = stepped(200000, heavy, 31);
    const delta_input in{dtype::f32, p.cur, p.base};
    const auto stats = gather_stats(std::span(&in, 1), true, delta_kind::difference);
    const auto chosen = select_difference(stats, 3, representative::midrange);
    const auto buckets = code(p, dtype::f32, 3, 0.0);
    const coded c = code_with(p, dtype::f32, chosen);
    CAPTURE(c.frame.size(), buckets.frame.size(), mse(p, c.recon), mse(p, buckets.out));
    // Measured: a grid in both, 12% (Gaussian) and 8% (heavy tails) fewer bytes at 2% less error.
    CHECK(chosen.grid != 0);
    CHECK(double(c.frame.size()) < (heavy ? 0.95 : 0.9) * double(buckets.frame.size()));
    CHECK(mse(p, c.recon) <= mse(p, buckets.out));
  }
  // Below kGridMinElements the choice is not worth its time: the buckets.
  {
    const auto few = stepped(kGridMinElements - 1, false, 34);
    const delta_input in{dtype::f32, few.cur, few.base};
    CHECK(select_difference(gather_stats(std::span(&in, 1), true), 3, representative::midrange)
              .grid == 0);
  }
  // One bit a symbol is the buckets' alone.
  const auto p = stepped(10000, false, 32);
  const delta_input in{dtype::f32, p.cur, p.base};
  CHECK(select_difference(gather_stats(std::span(&in, 1), true, delta_kind::difference), 1,
                          representative::midrange)
            .grid == 0);
}
