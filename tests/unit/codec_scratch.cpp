// codec/scratch.hpp: the codec's per-thread working memory is counted while its thread lives, the
// count covers what the codec actually allocates, and one thread's is a few MiB at 1 MiB blocks
// (what fs/content/thread_limits.hpp multiplies by its thread counts).
#include <malloc.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "codec/block.hpp"
#include "codec/quantizer.hpp"
#include "codec/scratch.hpp"
#include "codec/tensor_codec.hpp"

using namespace ckpt::codec;

namespace {

// Heap bytes in use, arenas and mmapped chunks together (every thread's arenas).
std::uint64_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return std::uint64_t(m.uordblks) + std::uint64_t(m.hblkhd);
}

struct scratch_seen {
  std::uint64_t before = 0, during = 0, threads_during = 0;
  std::uint64_t heap_growth = 0;
};

// On a fresh thread: one block of each kind the daemon codes (lossless, weight delta, Adam's v
// as ratios), encoded and decoded on that thread alone (the block functions, not oneTBB loops).
scratch_seen code_blocks_on_a_new_thread() {
  constexpr std::size_t n = default_block_bytes / 4;
  std::vector<float> base(n), cur(n), vb(n), v(n), out(n), recon(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f), step(0.0f, 1e-3f);
  for (std::size_t i = 0; i < n; ++i) {
    base[i] = g(rng);
    cur[i] = base[i] + step(rng);
    vb[i] = 1e-6f * std::fabs(base[i]) + 1e-12f;
    v[i] = vb[i] * (1.0f + std::fabs(step(rng)) * 50.0f);
  }
  auto bytes = [](const std::vector<float>& x) { return std::as_bytes(std::span(x)); };
  const delta_input w{dtype::f32, bytes(cur), bytes(base)};
  const delta_input r{dtype::f32, bytes(v), bytes(vb)};
  const quant_table wq = select_buckets(gather_stats({&w, 1}, false), 3, representative::mean);
  const quant_table rq = select_buckets(gather_stats({&r, 1}, false, delta_kind::ratio), 3,
                                        representative::mean, delta_kind::ratio);
  scratch_seen seen;
  std::thread t([&] {
    seen.before = scratch_bytes();
    const std::uint64_t heap0 = heap_in_use();
    std::vector<std::byte> enc;
    enc.reserve(2 * default_block_bytes);  // the caller's output: not scratch
    const std::uint64_t heap1 = heap_in_use();
    encode_exact_block(dtype::f32, reinterpret_cast<const std::byte*>(cur.data()), n, enc);
    decode_block(enc, nullptr, reinterpret_cast<std::byte*>(out.data()));
    enc.clear();
    const lossy_params p{3, 0, representative::mean, entropy_policy::best, 0};
    encode_delta_block(dtype::f32, reinterpret_cast<const std::byte*>(cur.data()),
                       reinterpret_cast<const std::byte*>(base.data()), n, wq, p,
                       reinterpret_cast<std::byte*>(recon.data()), enc);
    decode_block(enc, reinterpret_cast<const std::byte*>(base.data()),
                 reinterpret_cast<std::byte*>(out.data()));
    enc.clear();
    encode_delta_block(dtype::f32, reinterpret_cast<const std::byte*>(v.data()),
                       reinterpret_cast<const std::byte*>(vb.data()), n, rq, p,
                       reinterpret_cast<std::byte*>(recon.data()), enc);
    decode_block(enc, reinterpret_cast<const std::byte*>(vb.data()),
                 reinterpret_cast<std::byte*>(out.data()));
    seen.during = scratch_bytes();
    seen.threads_during = scratch_threads();
    const std::uint64_t heap2 = heap_in_use();
    seen.heap_growth = heap2 - heap0 - (heap1 - heap0);
  });
  t.join();
  return seen;
}

}  // namespace

TEST_CASE("codec scratch: counted while its thread lives, released when it exits",
          "[codec][scratch]") {
  const std::uint64_t threads_before = scratch_threads();
  const scratch_seen s = code_blocks_on_a_new_thread();
  const std::uint64_t held = s.during - s.before;
  INFO("thread's scratch " << held << " bytes; heap growth " << s.heap_growth);
  // At least the byte planes of a lossless block (one byte per input byte).
  CHECK(held >= default_block_bytes);
  CHECK(s.threads_during == threads_before + 1);
  // Gone with its thread.
  CHECK(scratch_bytes() == s.before);
  CHECK(scratch_threads() == threads_before);
}

TEST_CASE("codec scratch: the count covers what the thread allocated, a few MiB a thread",
          "[codec][scratch]") {
  const scratch_seen s = code_blocks_on_a_new_thread();
  const std::uint64_t held = s.during - s.before;
  INFO("thread's scratch " << held << " bytes; heap growth " << s.heap_growth);
  // Everything the blocks left allocated on the thread is counted scratch (the rest: small
  // tables and the allocator's own bookkeeping).
  CHECK(held + (std::uint64_t(256) << 10) >= s.heap_growth);
  // The per-thread figure fs/content/thread_limits.hpp budgets with (measured ~3.5 MiB).
  CHECK(held <= std::uint64_t(6) << 20);
}
