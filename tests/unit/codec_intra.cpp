// Intra slabs (delta_kind::intra, block codec lc_intra): a tensor its base predicts worse than
// zero does is coded as its quantised values. Tested: when it is chosen, that its blocks decode
// without (and regardless of) a base, its error bound, and that it beats a difference on the data
// it is chosen for.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <iterator>
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

// A first moment saved after many steps: the new value is barely related to the old one (both
// Laplacian of scale 1e-3, correlation 0.2), so the difference spans more than the value.
pair_data fresh_pair(dtype t, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<float> e(1000.0f);
  std::bernoulli_distribution coin(0.5);
  auto laplace = [&] { return (coin(rng) ? 1.0f : -1.0f) * e(rng); };
  pair_data p{tensor(t, n), tensor(t, n)};
  for (std::size_t i = 0; i < n; ++i) {
    const float b = laplace();
    set_f32(p.base, t, i, b);
    set_f32(p.cur, t, i, 0.2f * b + laplace());
  }
  return p;
}

struct coded {
  std::vector<std::byte> frame, recon, out;
  quant_table table;
};

coded code(const pair_data& p, dtype t, int bits, bool intra, int buckets = 0, int round_bits = 0) {
  const delta_input in{t, p.cur, p.base};
  coded c;
  const delta_kind kind = intra && prefer_intra(in) ? delta_kind::intra : delta_kind::difference;
  c.table = select_buckets(gather_stats(std::span(&in, 1), true, kind), bits,
                           representative::midrange, kind, buckets);
  c.recon.resize(p.cur.size());
  lossy_params lp;
  lp.bits = bits;
  lp.rep = representative::midrange;
  lp.round_bits = round_bits;
  c.frame = encode_delta(in, c.table, lp, c.recon, 1u << 16);
  c.out.resize(p.cur.size());
  decode(c.frame, p.base, c.out);
  return c;
}

double relative_error(const pair_data& p, const std::vector<std::byte>& r, dtype t) {
  double e = 0, s = 0;
  for (std::size_t i = 0; i < p.cur.size() / element_size(t); ++i) {
    const double u = get_f32(p.cur, t, i), d = double(get_f32(r, t, i)) - u;
    e += d * d;
    s += u * u;
  }
  return std::sqrt(e / s);
}

}  // namespace

TEST_CASE("intra: chosen where the base predicts worse than zero, never for small deltas",
          "[intra]") {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    CAPTURE(name(t));
    auto fresh = fresh_pair(t, 50000, 1);
    const auto small = random_pair(t, 50000, 2);  // weights: deltas 1/50 of the values
    CHECK(prefer_intra({t, fresh.cur, fresh.base}));
    CHECK_FALSE(prefer_intra({t, small.cur, small.base}));
    CHECK_FALSE(prefer_intra({t, fresh.cur, fresh.cur}));  // unchanged
    // A non-finite sampled element (the first of the sample) makes the choice a difference.
    set_f32(fresh.cur, t, 3, std::numeric_limits<float>::quiet_NaN());
    CHECK_FALSE(prefer_intra({t, fresh.cur, fresh.base}));
  }
  const auto fresh = fresh_pair(dtype::f32, 20000, 3), small = random_pair(dtype::f32, 20000, 4);
  const std::vector<delta_input> in{{dtype::f32, fresh.cur, fresh.base},
                                    {dtype::f32, small.cur, small.base}};
  const auto tables = plan_tables(in, 3, representative::mean, bucket_scope::tensor, true, true);
  CHECK(tables[0].kind == delta_kind::intra);
  CHECK(tables[1].kind == delta_kind::difference);
  for (const auto& q : plan_tables(in, 3, representative::mean, bucket_scope::tensor, true, false))
    CHECK(q.kind == delta_kind::difference);
  // The paper's whole-checkpoint tables are shared per kind: no intra there.
  for (const auto& q :
       plan_tables(in, 3, representative::mean, bucket_scope::checkpoint, true, true))
    CHECK(q.kind == delta_kind::difference);
}

TEST_CASE("intra: blocks decode to the encoder's reconstruction without a base, within |u|",
          "[intra]") {
  const std::size_t n = 100000;
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    const auto p = fresh_pair(t, n, 5);
    for (int bits = 1; bits <= 4; ++bits) {
      CAPTURE(name(t), bits);
      const coded c = code(p, t, bits, true);
      REQUIRE(c.table.kind == delta_kind::intra);
      CHECK(read_block_header(c.frame).codec == block_codec::lc_intra);
      REQUIRE(c.out == c.recon);
      CHECK_FALSE(inspect(c.frame).needs_base);
      // No base, or any other base: the same values.
      std::vector<std::byte> alone(p.cur.size()), other(p.cur.size());
      decode(c.frame, {}, alone);
      CHECK(alone == c.recon);
      decode(c.frame, p.cur, other);
      CHECK(other == c.recon);
      // The closed loop is against zero: no element further from its value than 0 is.
      bool bound = true;
      for (std::size_t i = 0; i < n; ++i) {
        const float u = get_f32(p.cur, t, i), r = get_f32(c.out, t, i);
        bound &= std::fabs(r - u) <= std::fabs(u);
      }
      CHECK(bound);
    }
  }
}

TEST_CASE("intra: less error than a difference at the same bits on fresh values", "[intra]") {
  const std::size_t n = 200000;
  const auto p = fresh_pair(dtype::f32, n, 6);
  for (int bits : {2, 3, 4}) {
    CAPTURE(bits);
    const coded intra = code(p, dtype::f32, bits, true), diff = code(p, dtype::f32, bits, false);
    REQUIRE(diff.table.kind == delta_kind::difference);
    CHECK(relative_error(p, intra.out, dtype::f32) <
          0.95 * relative_error(p, diff.out, dtype::f32));
  }
}

TEST_CASE("intra: fewer buckets leave symbols unused and cost fewer bytes", "[intra]") {
  const auto p = fresh_pair(dtype::f32, 200000, 7);
  const coded all = code(p, dtype::f32, 3, true), six = code(p, dtype::f32, 3, true, 6);
  CHECK(all.table.rep[7] != 0.0f);
  CHECK(six.table.rep[7] == 0.0f);
  CHECK(six.out == six.recon);
  CHECK(six.frame.size() < all.frame.size());
  CHECK(relative_error(p, six.out, dtype::f32) > relative_error(p, all.out, dtype::f32));
}

TEST_CASE("intra: rounded blocks keep N mantissa bits", "[intra]") {
  const std::size_t n = 50000;
  const auto p = fresh_pair(dtype::f32, n, 8);
  const coded c = code(p, dtype::f32, 3, true, 0, 12);
  CHECK(read_block_header(c.frame).round_bits == 12);
  CHECK(c.out == c.recon);
  std::vector<std::byte> again(c.out.size());
  round_mantissa(dtype::f32, c.out, again, 12);
  CHECK(again == c.out);
}

TEST_CASE("intra: damaged blocks and unknown codecs are refused", "[intra]") {
  const auto p = fresh_pair(dtype::f32, 30000, 9);
  const coded c = code(p, dtype::f32, 3, true);
  std::vector<std::byte> out(p.cur.size());
  auto bad = c.frame;
  bad[block_header_size + 5] ^= std::byte{0x10};
  CHECK_THROWS_AS(decode(bad, {}, out), ckpt::corrupt_error);
  auto unknown = c.frame;
  unknown[5] = std::byte{6};  // codec id past lc_intra
  CHECK_THROWS_AS(read_block_header(unknown), ckpt::corrupt_error);
}

TEST_CASE("intra: specials exact via escapes, finite values within |u|, whatever the base",
          "[intra]") {
  // Intra blocks ignore the base, so non-finite or huge bases change nothing; non-finite values
  // are escaped (stored exactly, NaN payload included); zeros, signed zeros, denormals and the
  // largest floats stay finite and within |u|.
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {
      0.0f,    -0.0f,    1e-45f, -1e-45f, 1e-38f,
      3.4e38f, -3.4e38f, inf,    -inf,    std::numeric_limits<float>::quiet_NaN(),
      1e-3f,   -2e-3f,   0.5f,   -0.25f};
  const std::size_t n = 4096;
  auto cur = tensor(dtype::f32, n), base = tensor(dtype::f32, n);
  std::mt19937_64 rng(13);
  std::normal_distribution<float> v(0.0f, 1e-3f);
  for (std::size_t i = 0; i < n; ++i) {
    set_f32(cur, dtype::f32, i, i % 7 ? v(rng) : specials[(i / 7) % std::size(specials)]);
    set_f32(base, dtype::f32, i, i % 5 ? 1e30f : std::numeric_limits<float>::quiet_NaN());
  }
  const delta_input in{dtype::f32, cur, base};
  for (int bits = 1; bits <= 4; ++bits) {
    CAPTURE(bits);
    const auto q = select_buckets(gather_stats(std::span(&in, 1), false, delta_kind::intra), bits,
                                  representative::mean, delta_kind::intra);
    auto recon = tensor(dtype::f32, n), out = tensor(dtype::f32, n);
    const auto frame = encode_delta(in, q, {bits, 0}, recon);
    decode(frame, {}, out);
    REQUIRE(out == recon);
    for (std::size_t i = 0; i < n; ++i) {
      const float u = get_f32(cur, dtype::f32, i), r = get_f32(out, dtype::f32, i);
      INFO("cur " << u << " recon " << r);
      if (!std::isfinite(u)) {
        REQUIRE(std::memcmp(cur.data() + 4 * i, out.data() + 4 * i, 4) == 0);
      } else {
        REQUIRE(std::isfinite(r));
        REQUIRE(std::fabs(double(r) - u) <= std::fabs(double(u)));
      }
    }
  }
}
