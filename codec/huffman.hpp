#pragma once
// Canonical, length-limited Huffman coding of byte symbols over four interleaved LSB-first
// bitstreams (symbol i goes to stream i % 4), decoded with one 2^11-entry table lookup per
// symbol. Used with k quantized LC symbols packed into each byte (grouped mode), with one LC
// symbol per byte (the paper's mode) and on the byte planes of lossless floats.
//
// Payload layout (the caller stores the symbol count):
//   u8 alphabet-1 | code lengths, 4 bits each, ceil(alphabet/2) bytes | u32 size of streams 0..2 |
//   stream 0 | stream 1 | stream 2 | stream 3
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/histogram.hpp"

namespace ckpt::codec::huffman {

inline constexpr int max_code_length = 11;

// Code lengths for the given counts, every length <= max_code_length, 0 for absent symbols.
// Needs at least two symbols with non-zero count (one symbol is the entropy layer's constant mode).
std::array<std::uint8_t, 256> code_lengths(const byte_histogram& counts);

// Bits the payload's streams take with these lengths (excluding the table), for mode selection.
std::uint64_t cost_bits(const byte_histogram& counts, const std::array<std::uint8_t, 256>& lengths);

void encode(std::span<const std::uint8_t> symbols, const std::array<std::uint8_t, 256>& lengths,
            std::vector<std::byte>& out);

// Decodes exactly out.size() symbols. Throws corrupt_error on an invalid table or streams that
// are too short; never reads outside `in`.
void decode(std::span<const std::byte> in, std::span<std::uint8_t> out);

}  // namespace ckpt::codec::huffman
