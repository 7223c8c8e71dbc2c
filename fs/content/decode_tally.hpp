#pragma once
// How much decoding cold reads cost, for `ckptctl status`: chunks decoded into the chunk cache
// and their bytes; of them, chunks decoded before (among the ones remembered, below): evicted
// before their reader was done with them (read-ahead decoding what the reader did not want yet,
// or a chunk cache too small for the readers), or read again later by another load; single
// blocks decoded, not cached, for the kernel's reads away from the reader; and the frames
// decoded through base chains for both (one per version of the chain that was not cached), and
// for bases read a slab at a time without a head image or a cached tensor (a delta's encode,
// verify of one version).
//
// "Before" is within memory: the tally remembers the last chunks decoded in a direct-mapped
// table of kSlots fingerprints (512 KiB), so a repeat whose slot another chunk took since is not
// counted. A measurement of read-ahead and cache sizing, not an audit; two distinct chunks whose
// fingerprints differ only in bit 0 would count as a repeat. Lock-free: read-ahead workers and
// FUSE threads record concurrently.
#include <atomic>
#include <cstdint>
#include <memory>

namespace ckpt::fs {

class decode_tally {
 public:
  static constexpr std::size_t kSlots = std::size_t(1) << 16;

  struct counts {
    std::uint64_t chunks = 0, chunk_bytes = 0;  // decoded into the chunk cache
    std::uint64_t again = 0, again_bytes = 0;   // of them, decoded before (still remembered)
    std::uint64_t strays = 0, stray_bytes = 0;  // blocks decoded for reads away from the reader
    std::uint64_t frames = 0;  // frame decodes, a chunk (or block) of each version of a chain
  };

  decode_tally();
  // A chunk of `bytes` was decoded; `fingerprint` identifies it (a hash of its cache key).
  void chunk(std::uint64_t fingerprint, std::uint64_t bytes) noexcept;
  // Blocks of `bytes` decoded, not cached, for a read away from the reader.
  void stray(std::uint64_t bytes) noexcept;
  void frames(std::uint64_t n) noexcept { frames_.fetch_add(n, std::memory_order_relaxed); }
  counts get() const noexcept;

 private:
  std::unique_ptr<std::atomic<std::uint64_t>[]> recent_;  // fingerprint | 1; 0: empty
  std::atomic<std::uint64_t> chunks_{0}, chunk_bytes_{0}, again_{0}, again_bytes_{0};
  std::atomic<std::uint64_t> strays_{0}, stray_bytes_{0}, frames_{0};
};

}  // namespace ckpt::fs
