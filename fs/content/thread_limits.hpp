#pragma once
// How many threads the content store's pools get on a machine of `cores` cores, and the part of
// the daemon's fixed allowance the write path's working memory may take. None of it grows with
// the cores without bound: every thread that ever codes or decodes a block keeps the codec's
// per-thread scratch (codec/scratch.hpp, 2-4.5 MiB at 1 MiB blocks, measured) until it exits, and
// the daemon's memory outside cache= and buffer= is a fixed 512 MiB (DESIGN.md §9 invariant 7).
// With oneTBB's defaults a 96-core node had 95 codec workers, and up to 17 read-ahead workers.
//
// What the coding holds (the encode sets, the base read-ahead, the codec's scratch) beyond
// kCodingAllowance is charged to the cache: its budget shrinks by that much, so the bound holds
// whatever the thread count. The allowance is what a 2-core machine holds at most (two sets),
// so nothing is charged there; a node at every cap gives up to ~250 MiB of cache=.
#include <tbb/info.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace ckpt::fs {

// The cores this process may run on: oneTBB's count, which honours the CPU affinity mask
// (taskset, a scheduler's cpuset), where std::thread::hardware_concurrency() counts the machine's.
// Every pool below is sized from it, so a pinned daemon sizes them all alike.
inline std::size_t usable_cores() noexcept {
  return std::size_t(std::max(1, tbb::info::default_concurrency()));
}

// oneTBB workers for the codec's parallel loops, counting the thread that calls in. The codec
// splits a 16 MiB slab into 16 blocks, so more threads than that would not speed one slab up;
// sixteen cores code about 16 GB/s, beyond the disks this writes to.
inline constexpr std::size_t kMaxCodecThreads = 16;
constexpr std::size_t codec_threads_for(std::size_t cores) noexcept {
  return std::clamp<std::size_t>(cores, 1, kMaxCodecThreads);
}

// Read-ahead workers (content_impl.hpp: one more than the cores keeps every core decoding while
// one waits for the disk). Each decodes whole blocks on its own thread, about 1 GB/s.
inline constexpr std::size_t kMaxPrefetchWorkers = 9;
constexpr std::size_t prefetch_workers_for(std::size_t cores) noexcept {
  return std::clamp<std::size_t>(cores + 1, 3, kMaxPrefetchWorkers);
}

// Files coded while they are written (content_store::start_stream), at once. Each holds a thread
// (with codec scratch once it codes) and an object writer (two 4 MiB buffers) until its commit:
// ~12 MiB. Eight are what a node's ranks save at once, measured (the rest of the allowance
// below); more files at once are stored by their commits (commit_threads of them at a time).
inline constexpr std::size_t kMaxStreams = 8;

// The encode sets, the base read-ahead and the codec's scratch the fixed allowance covers; more
// is taken from cache=. Two sets (88 MiB each once used) and the base read-ahead (64 MiB) are
// 240 MiB; the rest is scratch (11-22 MiB on the 2-core VM with eight ranks saving or restoring
// at once, docs/benchmarks.md). The remaining 256 MiB of the allowance is for everything else
// (code, stacks, object writers, the read-ahead workers' spare chunk buffers, the allocator):
// up to ~190 MiB measured there.
inline constexpr std::uint64_t kCodingAllowance = std::uint64_t(256) << 20;

}  // namespace ckpt::fs
