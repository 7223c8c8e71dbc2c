// codec::measure_error: the sums behind `ckptctl stat`'s error column, for every float dtype,
// independent of the thread count, skipping NaN and infinity, refusing what it cannot measure.
#include <tbb/global_control.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "codec/dtype.hpp"
#include "codec/error.hpp"
#include "codec/fidelity.hpp"
#include "codec/quantizer.hpp"
#include "codec/tensor_codec.hpp"

using namespace ckpt::codec;

namespace {

std::vector<std::byte> f32s(const std::vector<float>& v) {
  std::vector<std::byte> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

TEST_CASE("fidelity: sums and relative error of f32, f16 and bf16", "[codec][fidelity]") {
  const auto cur = f32s({3, 4, 0, 0}), recon = f32s({3, 4, 0.5f, -0.5f});
  const error_sums s = measure_error(dtype::f32, cur, recon);
  CHECK(s.err == 0.5);
  CHECK(s.ref == 25.0);
  CHECK(s.relative() == Approx(std::sqrt(0.5 / 25.0)));
  for (const dtype t : {dtype::f16, dtype::bf16}) {
    std::vector<std::uint16_t> a, b;
    for (float x : {3.0f, 4.0f, 0.0f, 0.0f})
      a.push_back(t == dtype::f16 ? f32_to_f16(x) : f32_to_bf16(x));
    for (float x : {3.0f, 4.0f, 0.5f, -0.5f})
      b.push_back(t == dtype::f16 ? f32_to_f16(x) : f32_to_bf16(x));
    const auto e = measure_error(t, std::as_bytes(std::span(a)), std::as_bytes(std::span(b)));
    CHECK(e.err == 0.5);
    CHECK(e.ref == 25.0);
  }
  CHECK(measure_error(dtype::f32, cur, cur).relative() == 0);
  CHECK(error_sums{}.relative() == 0);
  CHECK(std::isinf(error_sums{1, 0}.relative()));
}

TEST_CASE("fidelity: NaN and infinite elements are skipped", "[codec][fidelity]") {
  const float nan = std::nanf(""), inf = INFINITY;
  // Long enough for the vectorised path, with the odd values inside it and in the tail.
  std::vector<float> u(100, 1.0f), r(100, 1.5f);
  u[3] = nan;
  r[50] = inf;
  u[99] = -inf;
  const error_sums s = measure_error(dtype::f32, f32s(u), f32s(r));
  CHECK(s.err == Approx(97 * 0.25));
  CHECK(s.ref == Approx(97.0));
}

TEST_CASE("fidelity: the same sums whatever the thread count", "[codec][fidelity]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> u(3'000'001), r(u.size());
  for (std::size_t i = 0; i < u.size(); ++i) {
    u[i] = d(rng);
    r[i] = u[i] + 0.01f * d(rng);
  }
  const auto cu = f32s(u), cr = f32s(r);
  error_sums one, many;
  {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 1);
    one = measure_error(dtype::f32, cu, cr);
  }
  many = measure_error(dtype::f32, cu, cr);
  CHECK(one.err == many.err);  // bitwise: summed in a fixed order
  CHECK(one.ref == many.ref);
  CHECK(one.relative() == Approx(0.01).epsilon(0.02));
}

TEST_CASE("fidelity: refuses what it cannot measure", "[codec][fidelity]") {
  const auto a = f32s({1, 2}), b = f32s({1});
  CHECK_THROWS_AS(measure_error(dtype::f32, a, b), ckpt::invalid_argument);
  CHECK_THROWS_AS(measure_error(dtype::bytes, a, a), ckpt::invalid_argument);
  CHECK_THROWS_AS(measure_error(dtype::f32, std::span(a).first(5), std::span(a).first(5)),
                  ckpt::invalid_argument);
}

TEST_CASE("fidelity: a non-finite element in a piece's tail is skipped too", "[codec][fidelity]") {
  std::vector<float> u(21, 2.0f), r(21, 2.5f);  // 16 in the 8-wide part, 5 in the tail
  u[20] = std::nanf("");
  r[19] = INFINITY;
  const error_sums s = measure_error(dtype::f32, f32s(u), f32s(r));
  CHECK(s.err == Approx(19 * 0.25));
  CHECK(s.ref == Approx(19 * 4.0));
}

TEST_CASE("fidelity: the encoder's own sums are measure_error's, whatever the thread count",
          "[codec][fidelity]") {
  std::mt19937 rng(8);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> base(700'001), cur(base.size());  // several blocks and a partial one
  for (std::size_t i = 0; i < base.size(); ++i) {
    base[i] = d(rng);
    cur[i] = base[i] + 0.01f * d(rng);
  }
  const auto cb = f32s(base), cc = f32s(cur);
  const delta_input in{dtype::f32, cc, cb};
  const quant_table q =
      select_buckets(gather_stats(std::span(&in, 1), false, delta_kind::difference), 3,
                     representative::mean, delta_kind::difference);
  auto run = [&](int threads) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    std::vector<std::byte> recon(cc.size()), out;
    error_sums e;
    encode_delta_into(in, q, lossy_params{}, recon, out, default_block_bytes, &e);
    return std::pair{e, measure_error(dtype::f32, cc, recon)};
  };
  const auto [one, one_ref] = run(1);
  const auto [many, many_ref] = run(4);
  CHECK(one.err == many.err);  // bitwise
  CHECK(one.ref == many.ref);
  CHECK(one.err == Approx(one_ref.err).epsilon(1e-12));
  CHECK(one.ref == Approx(one_ref.ref).epsilon(1e-12));
  CHECK(one.err > 0);
}
