#include "fs/content/decode_tally.hpp"

namespace ckpt::fs {

decode_tally::decode_tally() : recent_(std::make_unique<std::atomic<std::uint64_t>[]>(kSlots)) {}

void decode_tally::chunk(std::uint64_t fingerprint, std::uint64_t bytes) noexcept {
  constexpr auto relaxed = std::memory_order_relaxed;
  chunks_.fetch_add(1, relaxed);
  chunk_bytes_.fetch_add(bytes, relaxed);
  // The low bits pick the slot, so the stored tag is the whole fingerprint with bit 0 set: an
  // empty slot (0) never matches.
  const std::uint64_t tag = fingerprint | 1;
  if (recent_[(fingerprint >> 1) & (kSlots - 1)].exchange(tag, relaxed) == tag) {
    again_.fetch_add(1, relaxed);
    again_bytes_.fetch_add(bytes, relaxed);
  }
}

void decode_tally::stray(std::uint64_t bytes) noexcept {
  strays_.fetch_add(1, std::memory_order_relaxed);
  stray_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

decode_tally::counts decode_tally::get() const noexcept {
  constexpr auto relaxed = std::memory_order_relaxed;
  counts c;
  c.chunks = chunks_.load(relaxed);
  c.chunk_bytes = chunk_bytes_.load(relaxed);
  c.again = again_.load(relaxed);
  c.again_bytes = again_bytes_.load(relaxed);
  c.strays = strays_.load(relaxed);
  c.stray_bytes = stray_bytes_.load(relaxed);
  c.frames = frames_.load(relaxed);
  return c;
}

}  // namespace ckpt::fs
