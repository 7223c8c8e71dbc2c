#include "codec/scratch.hpp"

namespace ckpt::codec {
namespace {
// Relaxed: a snapshot for budgets and people, never a synchronisation point.
std::atomic<std::int64_t> total_bytes{0};
std::atomic<std::int64_t> holders{0};
}  // namespace

std::uint64_t scratch_bytes() noexcept {
  const auto v = total_bytes.load(std::memory_order_relaxed);
  return v > 0 ? std::uint64_t(v) : 0;
}

std::uint64_t scratch_threads() noexcept {
  const auto v = holders.load(std::memory_order_relaxed);
  return v > 0 ? std::uint64_t(v) : 0;
}

namespace detail {
void note_scratch(std::int64_t delta_bytes) noexcept {
  // Trivially destructible, so still readable while the thread's buffers are destroyed.
  thread_local std::int64_t mine = 0;
  const bool had = mine > 0;
  mine += delta_bytes;
  total_bytes.fetch_add(delta_bytes, std::memory_order_relaxed);
  if (had != (mine > 0)) holders.fetch_add(had ? -1 : 1, std::memory_order_relaxed);
}
}  // namespace detail

}  // namespace ckpt::codec
