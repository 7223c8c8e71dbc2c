// Encoded bytes and reconstructions are identical whatever the number of threads, for difference,
// ratio and intra deltas, and grid tables.
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "codec/tensor_codec.hpp"
#include "codec_test_util.hpp"

using namespace ckpt::codec;
using namespace ckpt::test;

namespace {

struct output {
  std::vector<std::vector<std::byte>> frames;
  std::vector<std::byte> recon;
  std::vector<delta_kind> kinds;
  bool operator==(const output&) const = default;
};

// A nonnegative pair (|x| of a random one): coded with ratio deltas when relative is allowed.
pair_data nonnegative_pair(dtype t, std::size_t n, std::uint64_t seed) {
  pair_data p = random_pair(t, n, seed);
  for (std::size_t i = 0; i < n; ++i) {
    set_f32(p.base, t, i, std::fabs(get_f32(p.base, t, i)));
    set_f32(p.cur, t, i, std::fabs(get_f32(p.cur, t, i)));
  }
  return p;
}

// Gaussian steps: light tails, where select_difference takes a grid.
pair_data gaussian_pair(dtype t, std::size_t n, std::uint64_t seed) {
  pair_data p = random_pair(t, n, seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, 1e-3f);
  for (std::size_t i = 0; i < n; ++i) set_f32(p.cur, t, i, get_f32(p.base, t, i) + g(rng));
  return p;
}

output encode_all(int threads, dtype t, representative rep, bucket_scope scope, int round_bits) {
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, std::size_t(threads));
  tbb::task_arena arena(threads);
  output o;
  arena.execute([&] {
    const auto a = random_pair(t, 300001, 1), b = random_pair(t, 77777, 2);
    const auto c = nonnegative_pair(t, 200003, 3);
    // Values unrelated to their base (two independent tensors): intra with per-tensor tables.
    const auto d1 = random_pair(t, 100003, 4), d2 = random_pair(t, 100003, 5);
    const delta_input in[] = {
        {t, a.cur, a.base}, {t, b.cur, b.base}, {t, c.cur, c.base}, {t, d1.cur, d2.cur}};
    const auto tables = plan_tables(in, 3, rep, scope, /*relative=*/true, /*intra=*/true);
    for (int i = 0; i < 4; ++i) {
      o.kinds.push_back(tables[i].kind);
      auto recon = tensor(t, in[i].cur.size() / element_size(t));
      o.frames.push_back(encode_delta(in[i], tables[i],
                                      {3, 0, rep, entropy_policy::best, round_bits}, recon, 65536));
      o.recon.insert(o.recon.end(), recon.begin(), recon.end());
    }
    // The grid or the buckets by estimate (select_difference), from statistics gathered on
    // every thread there is.
    const auto e = gaussian_pair(t, 200001, 6);
    const delta_input steps{t, e.cur, e.base};
    const auto grid = select_difference(gather_stats(std::span(&steps, 1), true), 3, rep);
    o.kinds.push_back(grid.grid ? delta_kind::intra : delta_kind::ratio);  // a marker: grid or not
    auto recon = tensor(t, e.cur.size() / element_size(t));
    o.frames.push_back(
        encode_delta(steps, grid, {3, 0, rep, entropy_policy::best, round_bits}, recon, 65536));
    o.recon.insert(o.recon.end(), recon.begin(), recon.end());
    o.frames.push_back(encode_exact(t, a.cur, 65536));
  });
  return o;
}

}  // namespace

TEST_CASE("identical bytes with 1, 2 and 8 threads", "[determinism]") {
  for (dtype t : {dtype::f32, dtype::bf16}) {
    for (auto rep : {representative::mean, representative::midrange}) {
      for (auto scope : {bucket_scope::checkpoint, bucket_scope::tensor}) {
        // Unrounded, and rounding the reconstruction (lossy_params::round_bits).
        for (int round_bits : {0, t == dtype::f32 ? 12 : 5}) {
          const auto one = encode_all(1, t, rep, scope, round_bits);
          REQUIRE(one.frames.at(0).size() > 0);
          REQUIRE(one.kinds == std::vector{delta_kind::difference, delta_kind::difference,
                                           delta_kind::ratio,
                                           scope == bucket_scope::tensor ? delta_kind::intra
                                                                         : delta_kind::difference,
                                           one.kinds.back()});
          if (t == dtype::f32) REQUIRE(one.kinds.back() == delta_kind::intra);  // a grid
          REQUIRE(encode_all(2, t, rep, scope, round_bits) == one);
          REQUIRE(encode_all(8, t, rep, scope, round_bits) == one);
        }
      }
    }
  }
}
