// How long a lineage's chains run and which deltas refresh it (content_options::keyframe_interval,
// refresh_interval): keyframe_interval=0 (auto) sizes the interval by the checkpoint, so small
// checkpoints keep one keyframe for up to 1000 versions; every refresh_interval-th delta codes
// its differences with codec::max_bits, which takes the error the chain gathered back down.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "codec/format/source.hpp"
#include "codec/quantizer.hpp"
#include "content_test_util.hpp"

using namespace ckpt;
using namespace ckpt::test;

TEST_CASE("keyframe_interval auto: 1 GiB over the checkpoint's size within 20..1000",
          "[content][chain]") {
  fs::content_options opt;
  opt.keyframe_interval = 0;
  CHECK(opt.keyframe_interval_for(std::uint64_t(32) << 10) == 1000);
  CHECK(opt.keyframe_interval_for(std::uint64_t(1) << 20) == 1000);
  CHECK(opt.keyframe_interval_for(std::uint64_t(2) << 20) == 512);
  CHECK(opt.keyframe_interval_for(std::uint64_t(10) << 20) == 102);
  CHECK(opt.keyframe_interval_for(std::uint64_t(51) << 20) == 20);
  CHECK(opt.keyframe_interval_for(std::uint64_t(4) << 30) == 20);
  CHECK(opt.keyframe_interval_for(0) == 1000);
  opt.keyframe_interval = 7;  // a fixed interval whatever the size
  CHECK(opt.keyframe_interval_for(std::uint64_t(32) << 10) == 7);
  CHECK(opt.keyframe_interval_for(std::uint64_t(4) << 30) == 7);
}

TEST_CASE(
    "a small checkpoint's chain: no keyframe at 20 with auto, refreshes every N-th delta "
    "with fewer errors, the same bytes after a restart",
    "[content][chain]") {
  temp_dir d;
  fs::content_options opt;
  opt.bits = 3;
  opt.keyframe_bits = 12;
  opt.keyframe_interval = 0;  // auto
  opt.refresh_interval = 4;
  std::mt19937_64 rng(37);
  drifting_weights w(40'000, rng);
  std::vector<fs::content_ref> refs;
  std::vector<bytes> served;
  double refresh_err = 0, other_err = 0;
  int refreshes = 0, others = 0;
  {
    opened s(d.path, opt);
    for (int v = 0; v < 26; ++v) {
      w.step(rng);
      const bytes file = safetensors({{"layer.weight", w.values}});
      const auto ref = s.content.put("run/model.safetensors", format::memory_source(file));
      refs.push_back(ref);
      served.push_back(read_all(s.content, ref));
      INFO("version " << v);
      const auto detail = s.content.detail(ref);
      // 160 KiB: the auto interval is 1000, so version 20 is a delta too.
      REQUIRE(detail.info.kind == (v == 0 ? "keyframe" : "delta"));
      if (v == 0) continue;
      REQUIRE(detail.info.lineage == s.content.info(refs.front()).lineage);
      const bool refresh = v % 4 == 0;
      CHECK(detail.coding.refresh_bits == (refresh ? codec::max_bits : 0));
      const std::size_t hdr = file.size() - 4 * w.size();
      const double err = rel_l2(floats_at(served.back(), hdr, w.size()), w.values);
      (refresh ? refresh_err : other_err) += err;
      ++(refresh ? refreshes : others);
      // The closed loop's bound holds for refreshes as for any delta.
      const auto prev = floats_at(served[served.size() - 2], hdr, w.size());
      const auto now = floats_at(served.back(), hdr, w.size());
      bool within = true;
      for (std::size_t i = 0; i < w.size(); ++i)
        within &= std::fabs(double(now[i]) - w[i]) <= std::fabs(double(w[i]) - prev[i]);
      REQUIRE(within);
    }
    s.journal.sync();
  }
  REQUIRE(refreshes == 6);
  // More bits a changed element: a refresh ends further below the chain's error.
  CHECK(refresh_err / refreshes < 0.8 * (other_err / others));  // 0.64 measured
  // Reopened with the caches cold: every version decodes through the one keyframe as it read.
  opened s(d.path, opt, refs);
  for (std::size_t v = 0; v < refs.size(); ++v) REQUIRE(read_all(s.content, refs[v]) == served[v]);
}

TEST_CASE(
    "a fixed keyframe_interval still makes keyframes of small checkpoints, and refreshes "
    "need per-tensor tables, our coder, no fixed grid step and fewer bits than codec::max_bits",
    "[content][chain]") {
  struct variant {
    const char* name;
    int interval, bits;
    codec::bucket_scope scope;
    bool paper;
    double grid;
    bool refreshes;
  };
  const auto tensor = codec::bucket_scope::tensor;
  for (const variant& c :
       {variant{"fixed 5", 5, 3, tensor, false, fs::content_options{}.grid_step, true},
        variant{"checkpoint tables", 5, 3, codec::bucket_scope::checkpoint, false, 0, false},
        variant{"paper coding", 5, 3, tensor, true, 0, false},
        variant{"fixed grid step", 5, 3, tensor, false, 1.0, false},
        variant{"bits 4", 5, 4, tensor, false, fs::content_options{}.grid_step, false}}) {
    SECTION(c.name) {
      temp_dir d;
      fs::content_options opt;
      opt.bits = c.bits;
      opt.scope = c.scope;
      opt.paper_coding = c.paper;
      opt.grid_step = c.grid;
      opt.keyframe_interval = c.interval;
      opt.refresh_interval = 2;
      std::mt19937_64 rng(38);
      drifting_weights w(20'000, rng);
      opened s(d.path, opt);
      for (int v = 0; v < 8; ++v) {
        w.step(rng);
        const auto ref = s.content.put("run/model.safetensors",
                                       format::memory_source(safetensors({{"w", w.values}})));
        const auto detail = s.content.detail(ref);
        INFO("version " << v);
        const int since = v % c.interval;  // deltas since the keyframe
        REQUIRE(detail.info.kind == (since == 0 ? "keyframe" : "delta"));
        CHECK(detail.coding.refresh_bits ==
              (c.refreshes && since && since % 2 == 0 ? codec::max_bits : 0));
      }
    }
  }
}
