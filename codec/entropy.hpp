#pragma once
// Entropy coding of a byte-symbol stream, the mode chosen per stream by estimated size:
// stored, constant (one distinct symbol), bit-packed (the symbols agree outside a mask; where the
// caller allows it), canonical Huffman (4 streams) or rANS (4 states). Under
// entropy_policy::best a coded mode must save at least 1/32 of the stored (or packed) size: a
// stream that barely shrinks is stored, because decoding it would cost as much as one that
// shrinks a lot.
//
// Layout: u8 mode | mode payload. The symbol count is stored by the caller.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "codec/histogram.hpp"

namespace ckpt::codec {

enum class entropy_mode : std::uint8_t {
  stored = 0,
  constant = 1,
  huffman = 2,
  rans = 3,
  packed = 4,  // since 2026-11-27, in lossless float blocks of version 3 only (docs/format.md)
};

enum class entropy_policy : std::uint8_t {
  best,          // smallest of all modes
  huffman_only,  // LC-Checkpoint's own coder: one Huffman code word per symbol, >= 1 bit each
};

std::string_view name(entropy_mode m) noexcept;

// Whether encode_bytes may choose entropy_mode::packed (only under entropy_policy::best), and
// decode_bytes accept it: where the block says so to older readers (block.hpp:
// block_format_version_packed).
enum class packing : bool { off, allowed };

// Appends the coded stream to `out` and returns the mode used. `hist` must be the histogram of
// `in` when given (callers that already have it save a pass).
entropy_mode encode_bytes(std::span<const std::uint8_t> in, entropy_policy policy,
                          std::vector<std::byte>& out, const byte_histogram* hist = nullptr,
                          packing pack = packing::off);

// Decodes exactly out.size() symbols from the whole of `in`. Throws corrupt_error, also for a
// packed stream where `pack` does not allow one.
void decode_bytes(std::span<const std::byte> in, std::span<std::uint8_t> out,
                  packing pack = packing::off);

}  // namespace ckpt::codec
