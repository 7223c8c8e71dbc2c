#pragma once
// Order-0 rANS over byte symbols with four interleaved 32-bit states (byte-wise renormalisation,
// 15-bit probabilities). This is the mode for extreme skew: where one group value dominates,
// Huffman is stuck at >= 1 bit per group while rANS gets within a few percent of the entropy.
//
// Payload layout (the caller stores the symbol count):
//   u8 number of present symbols - 1 | per present symbol: u8 symbol, u16 frequency (sum 2^15) |
//   u32 stream size | stream (4 initial states, then renormalisation bytes, read forward)
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/histogram.hpp"

namespace ckpt::codec::rans {

inline constexpr int scale_bits = 15;

// Frequencies summing to 2^scale_bits, every present symbol at least 1.
std::array<std::uint32_t, 256> normalize(const byte_histogram& counts);

// Estimated bits of the stream for these counts and frequencies (excluding the table).
double cost_bits(const byte_histogram& counts, const std::array<std::uint32_t, 256>& freqs);

void encode(std::span<const std::uint8_t> symbols, const std::array<std::uint32_t, 256>& freqs,
            std::vector<std::byte>& out);

// Decodes exactly out.size() symbols; throws corrupt_error on an invalid table or a stream that
// ends early, never reads outside `in`.
void decode(std::span<const std::byte> in, std::span<std::uint8_t> out);

}  // namespace ckpt::codec::rans
