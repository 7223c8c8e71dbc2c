// The weights' error allowance (content_options::weight_error, grid_error): with grid=auto a
// difference slab whose buckets would leave less error than weight_error times the RMS of its
// values takes a coarser grid, up to that error and at most grid_error times the buckets' mean
// square error; slabs whose steps are large against their values keep the buckets' error, and
// refreshes keep theirs.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "codec/format/source.hpp"
#include "content_test_util.hpp"

using namespace ckpt;
using namespace ckpt::test;

namespace {

struct chain_result {
  std::uint64_t delta_tensor_bytes = 0;  // the weights' frames
  std::uint64_t momentum_bytes = 0;      // the optimizer state's frames
  double worst_error = 0;                // relative L2 of the weights, over the deltas
  std::vector<double> errors;            // the weights' error, delta by delta
  std::vector<fs::coding_params> coding;
  bool closed_loop = true;  // every element: |read - written| <= |written - previous read|
};

// Eight versions of a weight tensor and an SGD momentum buffer of the same size (N(0, 0.05),
// steps of `step_scale` x N(0, 1e-3)), the refreshes every `refresh_interval`-th delta or none.
chain_result run_chain(double weight_error, float step_scale, int refresh_interval) {
  temp_dir d;
  fs::content_options opt;
  opt.bits = 3;
  opt.keyframe_bits = 12;
  opt.keyframe_interval = 0;
  opt.refresh_interval = refresh_interval;
  opt.intra = false;  // the momentum buffer as differences, where the allowance could reach it
  opt.weight_error = weight_error;
  opt.grid_error = 4;
  std::mt19937_64 rng(41);
  drifting_weights w(60'000, rng), m(60'000, rng);
  chain_result r;
  opened s(d.path, opt);
  std::vector<float> previous;
  for (int v = 0; v < 8; ++v) {
    w.step(rng, step_scale);
    m.step(rng, step_scale);
    const bytes file =
        safetensors({{"layer.weight", w.values}, {"optimizer.state.0.momentum_buffer", m.values}});
    const auto ref = s.content.put("run/model.safetensors", format::memory_source(file));
    const auto detail = s.content.detail(ref);
    REQUIRE(detail.info.kind == (v == 0 ? "keyframe" : "delta"));
    const bytes served = read_all(s.content, ref);
    const std::size_t at = file.size() - 8 * w.size();
    const auto now = floats_at(served, at, w.size());
    if (v > 0) {
      REQUIRE(detail.tensors.size() == 2);
      for (const auto& t : detail.tensors)
        (t.name == "layer.weight" ? r.delta_tensor_bytes : r.momentum_bytes) += t.stored_bytes;
      r.coding.push_back(detail.coding);
      r.errors.push_back(rel_l2(now, w.values));
      r.worst_error = std::max(r.worst_error, r.errors.back());
      for (std::size_t i = 0; i < w.size(); ++i)
        r.closed_loop &= std::fabs(double(now[i]) - w[i]) <= std::fabs(double(w[i]) - previous[i]);
    }
    previous = now;
  }
  return r;
}

}  // namespace

TEST_CASE(
    "weight_error: small steps take a coarser grid up to the allowance, large ones keep "
    "the buckets' error",
    "[content][weight_error]") {
  // Steps of 2% of the weights' RMS: the buckets leave about 0.8%.
  const auto off = run_chain(0, 1.0f, 0);
  const auto on = run_chain(0.025, 1.0f, 0);
  CAPTURE(off.delta_tensor_bytes, on.delta_tensor_bytes, off.worst_error, on.worst_error);
  CHECK(double(on.delta_tensor_bytes) < 0.85 * double(off.delta_tensor_bytes));
  CHECK(on.worst_error > off.worst_error);
  // At most twice the buckets' RMS error (grid_error 4), and never past the allowance.
  CHECK(on.worst_error <= 2.2 * off.worst_error);
  CHECK(on.worst_error <= 0.025);
  CHECK(on.closed_loop);
  // Optimizer state keeps the buckets' error: the allowance is the weights'.
  CHECK(on.momentum_bytes == off.momentum_bytes);
  for (const auto& c : on.coding) {
    CHECK(c.weight_error == 0.025);
    CHECK(c.grid_error == 4);
  }
  for (const auto& c : off.coding) CHECK(c.weight_error == 0);

  // Steps of 40% of the weights' RMS: the buckets' error is already above 2.5%, nothing changes.
  const auto big_off = run_chain(0, 20.0f, 0);
  const auto big_on = run_chain(0.025, 20.0f, 0);
  CAPTURE(big_off.delta_tensor_bytes, big_on.delta_tensor_bytes, big_off.worst_error);
  CHECK(big_off.worst_error > 0.025);
  CHECK(big_on.delta_tensor_bytes == big_off.delta_tensor_bytes);
  CHECK(big_on.worst_error == big_off.worst_error);
}

TEST_CASE("weight_error: a refresh keeps the buckets' error at its bits",
          "[content][weight_error]") {
  const auto off = run_chain(0, 1.0f, 4);
  const auto on = run_chain(0.025, 1.0f, 4);
  REQUIRE(on.coding.size() == 7);
  double on_refresh = 0, off_refresh = 0, on_other = 0, off_other = 0;
  for (std::size_t i = 0; i < on.coding.size(); ++i) {
    INFO("delta " << i + 1);
    const bool refresh = (i + 1) % 4 == 0;
    CHECK(on.coding[i].refresh_bits == (refresh ? codec::max_bits : 0));
    CHECK(on.coding[i].weight_error == (refresh ? 0 : 0.025));
    (refresh ? on_refresh : on_other) += on.errors[i];
    (refresh ? off_refresh : off_other) += off.errors[i];
  }
  CAPTURE(on_refresh, off_refresh, on_other / 6, off_other / 6);
  // The other deltas take about twice the error; the refresh ends near where it ends without the
  // allowance (its base, the delta before, is coarser: a little above).
  CHECK(on_other > 1.6 * off_other);
  CHECK(on_refresh < 1.3 * off_refresh);
  CHECK(on.closed_loop);
  CHECK(on.delta_tensor_bytes < off.delta_tensor_bytes);
}
