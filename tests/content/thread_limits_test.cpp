// thread_limits.hpp: the pools whose threads keep codec scratch stop growing with the cores, and
// what the coding holds beyond its allowance is charged to the cache, so the memory budget holds
// on any machine (DESIGN.md §9 invariant 7).
#include <sched.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <random>
#include <thread>

#include "codec/block.hpp"
#include "codec/scratch.hpp"
#include "content_test_util.hpp"
#include "fs/content/content_impl.hpp"
#include "fs/content/thread_limits.hpp"
#include "fs/namespace/memory_budget.hpp"

using namespace ckpt;
using namespace ckpt::test;

TEST_CASE("thread limits: every pool that codes is capped, whatever the cores",
          "[content][threads]") {
  CHECK(fs::codec_threads_for(0) == 1);  // hardware_concurrency() may not know
  CHECK(fs::codec_threads_for(2) == 2);
  CHECK(fs::codec_threads_for(96) == fs::kMaxCodecThreads);
  CHECK(fs::prefetch_workers_for(0) == 3);
  CHECK(fs::prefetch_workers_for(2) == 3);
  CHECK(fs::prefetch_workers_for(4) == 5);
  CHECK(fs::prefetch_workers_for(256) == fs::kMaxPrefetchWorkers);
  // The fixed allowance beside cache= and buffer= at the caps: what the coding may hold before
  // the cache pays for it, the read-ahead workers' spare chunk buffers beyond the 2-core
  // machine's (three workers), and the rest measured on that machine with eight ranks saving or
  // restoring at once (up to ~190 MiB besides the counted pools, spare buffers included:
  // docs/benchmarks.md).
  const std::uint64_t chunk = fs::kChunkBlocks * codec::default_block_bytes;
  const std::uint64_t measured_rest = std::uint64_t(190) << 20;
  const std::uint64_t at_caps =
      fs::kCodingAllowance + (fs::kMaxPrefetchWorkers - 3) * chunk + measured_rest;
  INFO("at the caps " << (at_caps >> 20) << " MiB");
  CHECK(at_caps <= fs::daemon_overhead_bytes);
  // Two encode sets (5.5 slabs each once used) and the base read-ahead (two units of a slab and
  // its reconstruction) fit in the coding's allowance: a 2-core machine lends the cache nothing
  // for them.
  CHECK(2 * 11 * fs::kSlabBytes / 2 + 2 * 2 * fs::kSlabBytes < fs::kCodingAllowance);
}

TEST_CASE("thread limits: pools are sized from the cores the process may run on",
          "[content][threads]") {
  // A daemon pinned to some cores (taskset, a cpuset) sizes every pool from those, not from the
  // machine's count. Run under `taskset -c 0` this compares 1 with the machine's cores.
  cpu_set_t mask;
  CPU_ZERO(&mask);
  REQUIRE(::sched_getaffinity(0, sizeof mask, &mask) == 0);
  const auto cores = std::size_t(CPU_COUNT(&mask));
  CHECK(fs::usable_cores() == cores);
  // What an open store gives the codec's loops: from those cores.
  temp_dir d;
  opened s(d.path, {});
  CHECK(tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism) ==
        fs::codec_threads_for(cores));
}

TEST_CASE("thread limits: coding memory beyond its allowance is taken from the cache",
          "[content][threads]") {
  temp_dir d;
  fs::content_options opt;
  opt.cache_bytes = std::uint64_t(512) << 20;
  opened s(d.path, opt);
  const auto idle = s.content.usage();
  REQUIRE(idle.coding_charged == 0);
  const std::uint64_t full_budget = idle.cache_budget;

  // Threads that each coded a block keep its scratch until they exit: as many as it takes to
  // pass the allowance, held until the checks are done (released on any exit from this scope).
  constexpr std::size_t n = codec::default_block_bytes / 4;
  std::vector<float> values(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> g;
  for (auto& v : values) v = g(rng);
  std::atomic<std::size_t> ready{0};
  std::atomic<bool> release{false};
  std::vector<std::jthread> holders;
  struct releaser {
    std::atomic<bool>& flag;
    ~releaser() {
      flag = true;
      flag.notify_all();
    }
  } releasing{release};  // destroyed before holders: they exit, then are joined
  while (codec::scratch_bytes() <= fs::kCodingAllowance + (std::uint64_t(32) << 20) &&
         holders.size() < 1000) {
    holders.emplace_back([&] {
      std::vector<std::byte> enc;
      std::vector<float> out(n);
      codec::encode_exact_block(codec::dtype::f32,
                                reinterpret_cast<const std::byte*>(values.data()), n, enc);
      codec::decode_block(enc, nullptr, reinterpret_cast<std::byte*>(out.data()));
      ++ready;
      ready.notify_all();
      release.wait(false);
    });
    for (std::size_t r = ready; r < holders.size(); r = ready) ready.wait(r);
  }
  const auto busy = s.content.usage();
  const std::uint64_t held = busy.encode_memory + codec::scratch_bytes();
  INFO("scratch " << (busy.scratch_bytes >> 20) << " MiB in " << busy.scratch_threads
                  << " threads; encode sets " << (busy.encode_memory >> 20) << " MiB");
  REQUIRE(held > fs::kCodingAllowance);
  CHECK(busy.scratch_bytes == codec::scratch_bytes());
  CHECK(busy.coding_charged == held - fs::kCodingAllowance);
  CHECK(busy.cache_budget == full_budget - busy.coding_charged);
  release = true;
  release.notify_all();
  holders.clear();  // joined: their scratch is freed

  const auto after = s.content.usage();
  CHECK(after.coding_charged == 0);
  CHECK(after.cache_budget == full_budget);
}
