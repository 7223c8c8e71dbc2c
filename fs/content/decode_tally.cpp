#include "fs/content/decode_tally.hpp"

namespace ckpt::fs {

decode_tally::decode_tally() : recent_(std::make_unique<std::atomic<std::uint64_t>[]>(kSlots)) {}

void decode_tally::chunk(std::uint64_t fingerprint) noexcept {
  chunks_.fetch_add(1, std::memory_order_relaxed);
  // The low bits pick the slot, so the stored tag is the whole fingerprint with bit 0 set: an
  // empty slot (0) never matches.
  const std::uint64_t tag = fingerprint | 1;
  const std::uint64_t was =
      recent_[(fingerprint >> 1) & (kSlots - 1)].exchange(tag, std::memory_order_relaxed);
  if (was == tag) again_.fetch_add(1, std::memory_order_relaxed);
}

decode_tally::counts decode_tally::get() const noexcept {
  return {chunks_.load(std::memory_order_relaxed), again_.load(std::memory_order_relaxed),
          frames_.load(std::memory_order_relaxed)};
}

}  // namespace ckpt::fs
