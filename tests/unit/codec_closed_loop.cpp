// DESIGN.md §9 invariant 3 over a chain of 50 versions: each version is coded against the
// reconstruction of the previous one, so its error is exactly its own quantisation error
// |ũ_t - u_t| = |δ_t - δ̃_t| (δ_t = u_t - ũ_{t-1}, δ̃_t = ũ_t - ũ_{t-1}), bounded by |δ_t|, and it
// does not grow with the chain.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "codec/tensor_codec.hpp"
#include "codec_test_util.hpp"

using namespace ckpt::codec;
using namespace ckpt::test;

TEST_CASE("closed loop: errors are per-version and never accumulate", "[closed-loop]") {
  for (dtype t : {dtype::f32, dtype::bf16}) {
    for (int bits : {2, 3}) {
      const std::size_t n = 20000;
      std::mt19937_64 rng(bits * 7 + int(t));
      std::normal_distribution<float> w(0.0f, 0.05f), step(0.0f, 1e-3f);
      std::vector<float> u(n);  // the true training state, never quantised
      for (auto& x : u) x = w(rng);
      auto recon_prev = tensor(t, n);  // ũ_0: the keyframe is exact
      for (std::size_t i = 0; i < n; ++i) set_f32(recon_prev, t, i, u[i]);
      for (std::size_t i = 0; i < n; ++i) u[i] = get_f32(recon_prev, t, i);

      std::vector<double> max_err;
      for (int version = 1; version <= 50; ++version) {
        auto cur = tensor(t, n);
        for (std::size_t i = 0; i < n; ++i) {
          // Drift plus noise, like SGD: some parameters move every step, most move little.
          u[i] += step(rng) * (i % 10 == 0 ? 10.0f : 1.0f);
          set_f32(cur, t, i, u[i]);
          u[i] = get_f32(cur, t, i);  // the true state as the dtype stores it
        }
        const delta_input in{t, cur, recon_prev};
        const auto q =
            plan_tables(std::span(&in, 1), bits, representative::mean, bucket_scope::tensor)[0];
        auto recon = tensor(t, n), decoded = tensor(t, n);
        const auto frame = encode_delta(in, q, {bits, 0}, recon);
        decode(frame, recon_prev, decoded);
        REQUIRE(decoded == recon);
        double worst = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const double ut = u[i], prev = get_f32(recon_prev, t, i), now = get_f32(recon, t, i);
          const double delta = ut - prev, applied = now - prev;
          const double err = std::fabs(now - ut);
          INFO("version " << version << " element " << i);
          REQUIRE(err == std::fabs(delta - applied));
          REQUIRE(err <= std::fabs(delta));
          worst = std::max(worst, err);
        }
        max_err.push_back(worst);
        recon_prev = recon;
      }
      // No growth: the worst error late in the chain is of the order of the early one. An open
      // loop (delta against u_{t-1}) would sum 50 dropped deltas instead.
      const double early = *std::max_element(max_err.begin(), max_err.begin() + 10);
      const double late = *std::max_element(max_err.end() - 10, max_err.end());
      INFO("dtype " << name(t) << " bits " << bits << " early " << early << " late " << late);
      REQUIRE(late <= 2.0 * early);
    }
  }
}
