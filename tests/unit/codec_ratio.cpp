// Ratio deltas (delta_kind::ratio, block codec lc_ratio): nonnegative tensors coded as relative
// changes. What they are for is tested against differences on the same data: Adam-like second
// moments spanning many octaves stay within a small factor of their value.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>

#include "codec/block.hpp"
#include "codec/error.hpp"
#include "codec/tensor_codec.hpp"
#include "codec_test_util.hpp"

using namespace ckpt::codec;
using namespace ckpt::test;

namespace {

// base log-uniform over 1e-12..1e-2 (a second moment's spread), cur = base * 2^U(-1, 6): most
// elements grow, some shrink, as v does in the first steps of training. Element 0 has no base
// (0 -> positive: the exact escape), element 1 stays zero.
pair_data second_moments(dtype t, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> lg(std::log(1e-12), std::log(1e-2));
  std::uniform_real_distribution<double> growth(-1.0, 6.0);
  pair_data p{tensor(t, n), tensor(t, n)};
  for (std::size_t i = 0; i < n; ++i) {
    set_f32(p.base, t, i, float(std::exp(lg(rng))));
    set_f32(p.cur, t, i, get_f32(p.base, t, i) * float(std::exp2(growth(rng))));
  }
  set_f32(p.base, t, 0, 0.0f);
  set_f32(p.cur, t, 0, 3e-5f);
  set_f32(p.base, t, 1, 0.0f);
  set_f32(p.cur, t, 1, 0.0f);
  return p;
}

struct coded {
  std::vector<std::byte> frame, recon, out;
  quant_table table;
};

coded code(const pair_data& p, dtype t, int bits, bool relative) {
  const delta_input in{t, p.cur, p.base};
  coded c;
  c.table =
      plan_tables(std::span(&in, 1), bits, representative::mean, bucket_scope::tensor, relative)[0];
  c.recon.resize(p.cur.size());
  lossy_params lp;
  lp.bits = bits;
  c.frame = encode_delta(in, c.table, lp, c.recon, 1u << 16);
  c.out.resize(p.cur.size());
  decode(c.frame, p.base, c.out);
  return c;
}

// Fraction of elements read back more than a factor 2 away from their value.
double off_by_2x(const pair_data& p, const std::vector<std::byte>& r, dtype t, std::size_t n) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float u = get_f32(p.cur, t, i), v = get_f32(r, t, i);
    if (v < u / 2 || v > u * 2) ++bad;
  }
  return double(bad) / double(n);
}

}  // namespace

TEST_CASE("ratio: chosen only for tensors nonnegative in both versions", "[ratio]") {
  auto p = second_moments(dtype::f32, 4096, 1);
  const delta_input in{dtype::f32, p.cur, p.base};
  CHECK(choose_kind(in, true) == delta_kind::ratio);
  CHECK(choose_kind(in, false) == delta_kind::difference);
  set_f32(p.cur, dtype::f32, 7, -0.0f);  // -0.0 is not negative
  CHECK(choose_kind(in, true) == delta_kind::ratio);
  set_f32(p.base, dtype::f32, 9, -1e-20f);
  CHECK(choose_kind(in, true) == delta_kind::difference);
  set_f32(p.base, dtype::f32, 9, 1e-20f);
  set_f32(p.cur, dtype::f32, 11, std::numeric_limits<float>::quiet_NaN());
  CHECK(choose_kind(in, true) == delta_kind::difference);
  set_f32(p.cur, dtype::f32, 11, std::numeric_limits<float>::infinity());
  CHECK(choose_kind(in, true) == delta_kind::ratio);  // +inf is nonnegative; it is escaped
  for (dtype t : {dtype::f16, dtype::bf16}) {
    auto q = second_moments(t, 1000, 2);
    const delta_input qi{t, q.cur, q.base};
    CHECK(choose_kind(qi, true) == delta_kind::ratio);
    set_f32(q.cur, t, 5, -2.0f);
    CHECK(choose_kind(qi, true) == delta_kind::difference);
  }
}

TEST_CASE("ratio: decode equals the encoder's reconstruction, and the error bound holds",
          "[ratio]") {
  const std::size_t n = 100000;
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    const auto p = second_moments(t, n, 3);
    for (int bits = 1; bits <= 4; ++bits) {
      CAPTURE(name(t), bits);
      const coded c = code(p, t, bits, true);
      REQUIRE(c.table.kind == delta_kind::ratio);
      REQUIRE(c.table.rep[0] == 1.0f);
      // With one or two buckets so many elements need escapes that a block may not shrink;
      // it is then stored raw (exact).
      const block_codec kind = read_block_header(c.frame).codec;
      CHECK((kind == block_codec::lc_ratio || (bits <= 2 && kind == block_codec::raw)));
      REQUIRE(c.out == c.recon);
      bool bound = true, nonneg = true;
      for (std::size_t i = 0; i < n; ++i) {
        const float u = get_f32(p.cur, t, i), b = get_f32(p.base, t, i), r = get_f32(c.out, t, i);
        bound &= std::fabs(r - u) <= std::fabs(u - b);
        nonneg &= r >= 0.0f;
      }
      CHECK(bound);
      CHECK(nonneg);
      CHECK(off_by_2x(p, c.out, t, n) == 0.0);  // what escapes cannot place, they store exactly
      CHECK(get_f32(c.out, t, 0) == get_f32(p.cur, t, 0));  // no base: escaped exactly
      CHECK(get_f32(c.out, t, 1) == 0.0f);                  // 0 -> 0 is no change, not an escape
    }
  }
}

TEST_CASE("ratio: exact factors reproduce the tensor exactly", "[ratio]") {
  // Half the elements double and half halve: two buckets whose means are exactly 1 and -0.5,
  // factors 2 and 0.5, and multiplying by a power of two is exact.
  const std::size_t n = 5000;
  pair_data p{tensor(dtype::f32, n), tensor(dtype::f32, n)};
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<float> v(1e-6f, 1.0f);
  for (std::size_t i = 0; i < n; ++i) {
    const float b = v(rng);
    set_f32(p.base, dtype::f32, i, b);
    set_f32(p.cur, dtype::f32, i, i % 2 ? b * 2 : b * 0.5f);
  }
  const coded c = code(p, dtype::f32, 2, true);
  CHECK(c.out == p.cur);
}

TEST_CASE("ratio: second moments stay within a factor 2 where differences leave them stale",
          "[ratio]") {
  // Few escapes are needed: the buckets place nearly every element themselves.
  const std::size_t n = 200000;
  const auto p = second_moments(dtype::f32, n, 5);
  for (int bits : {3, 4}) {
    CAPTURE(bits);
    const coded ratio = code(p, dtype::f32, bits, true);
    CHECK(off_by_2x(p, ratio.out, dtype::f32, n) == 0.0);
    CHECK(ratio.frame.size() < n * 4 / 6);
    const double diff_off = off_by_2x(p, code(p, dtype::f32, bits, false).out, dtype::f32, n);
    CHECK(diff_off > 0.2);
  }
}

TEST_CASE("ratio: growth beyond the table's reach is escaped, not left stale", "[ratio]") {
  // One bucket (bits=1) for ratios spread over 2^0..2^30: the elements its factor cannot bring
  // within 2x are stored exactly.
  const std::size_t n = 50000;
  pair_data p{tensor(dtype::f32, n), tensor(dtype::f32, n)};
  std::mt19937_64 rng(10);
  std::uniform_real_distribution<double> growth(0.0, 30.0);
  for (std::size_t i = 0; i < n; ++i) {
    set_f32(p.base, dtype::f32, i, 1e-12f);
    set_f32(p.cur, dtype::f32, i, float(1e-12 * std::exp2(growth(rng))));
  }
  const coded c = code(p, dtype::f32, 1, true);
  CHECK(c.out == c.recon);
  CHECK(off_by_2x(p, c.out, dtype::f32, n) == 0.0);
  std::size_t exact = 0;
  for (std::size_t i = 0; i < n; ++i)
    exact += get_f32(c.out, dtype::f32, i) == get_f32(p.cur, dtype::f32, i);
  CHECK(exact > n / 2);  // most needed the escape
}

TEST_CASE("ratio: checkpoint scope shares one table per kind", "[ratio]") {
  const auto v = second_moments(dtype::f32, 20000, 6);
  const auto w = random_pair(dtype::f32, 20000, 7);
  const auto v2 = second_moments(dtype::f32, 20000, 8);
  const std::vector<delta_input> in{
      {dtype::f32, v.cur, v.base}, {dtype::f32, w.cur, w.base}, {dtype::f32, v2.cur, v2.base}};
  const auto tables = plan_tables(in, 3, representative::mean, bucket_scope::checkpoint, true);
  REQUIRE(tables.size() == 3);
  CHECK(tables[0].kind == delta_kind::ratio);
  CHECK(tables[1].kind == delta_kind::difference);
  CHECK(tables[2].kind == delta_kind::ratio);
  CHECK(tables[0].rep == tables[2].rep);
  CHECK(tables[0].rep != tables[1].rep);
  const auto off = plan_tables(in, 3, representative::mean, bucket_scope::checkpoint, false);
  for (const auto& q : off) CHECK(q.kind == delta_kind::difference);
}

TEST_CASE("ratio: damaged blocks and missing bases are refused", "[ratio]") {
  const auto p = second_moments(dtype::f32, 30000, 9);
  const coded c = code(p, dtype::f32, 3, true);
  std::vector<std::byte> out(p.cur.size());
  CHECK_THROWS_AS(decode(c.frame, {}, out), ckpt::invalid_argument);
  auto bad = c.frame;
  bad[block_header_size + 5] ^= std::byte{0x10};
  CHECK_THROWS_AS(decode(bad, p.base, out), ckpt::corrupt_error);
  auto unknown = c.frame;
  unknown[5] = std::byte{6};  // codec id past lc_intra
  CHECK_THROWS_AS(read_block_header(unknown), ckpt::corrupt_error);
  CHECK(inspect(c.frame).needs_base);
}

TEST_CASE("ratio: the sign scan of a large slab (in pieces on every core) sees every element",
          "[ratio]") {
  const std::size_t n = (std::size_t(4) << 20) / 4 + 3;  // 4 MiB and a partial last piece
  for (dtype t : {dtype::f32, dtype::bf16}) {
    auto p = second_moments(t, n, 3);
    const delta_input in{t, p.cur, p.base};
    REQUIRE(choose_kind(in, true) == delta_kind::ratio);
    for (std::size_t at : {std::size_t(0), n / 2 + 1, n - 1}) {
      INFO("negative element at " << at);
      set_f32(p.cur, t, at, -1.0f);
      CHECK(choose_kind(in, true) == delta_kind::difference);
      set_f32(p.cur, t, at, 1.0f);
      set_f32(p.base, t, at, std::numeric_limits<float>::quiet_NaN());
      CHECK(choose_kind(in, true) == delta_kind::difference);
      set_f32(p.base, t, at, 1.0f);
      CHECK(choose_kind(in, true) == delta_kind::ratio);
    }
  }
}
