#pragma once
// Bit packing of byte symbols that agree outside a mask: each symbol is stored as its masked bits
// alone (k = popcount(mask) bits, in mask order from the lowest), LSB-first one after the other.
// It decodes at memory speed (one BMI2 pdep per eight symbols) where a Huffman code of the same
// near-uniform symbols decodes several times slower, and costs no more bits when the symbols are
// near-uniform over the mask: the entropy layer takes it for the byte planes of floats that a
// lossy keyframe's rounding left with fixed bits (at 12 bits: the plane of the sign and 7 zero
// mantissa bits, and the next one with 4 zero bits).
//
// Payload layout (the caller stores the symbol count n):
//   u8 mask (1 .. 7 bits set) | u8 fixed (the bits outside the mask) | ceil(n·k/8) bytes of
//   packed bits, the unused high bits of the last byte zero
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/histogram.hpp"

namespace ckpt::codec::bit_pack {

// The bits in which the present symbols of `counts` differ (mask) and the value of all the others
// (fixed). mask is 0 for one present symbol or none.
struct layout {
  std::uint8_t mask = 0;
  std::uint8_t fixed = 0;
};
layout layout_of(const byte_histogram& counts);

// Payload bytes of n symbols under `mask`, the two header bytes included.
std::size_t payload_size(std::size_t n, std::uint8_t mask);

// Appends the payload. Every symbol must satisfy (s & ~l.mask) == l.fixed, with 1 .. 7 bits in
// l.mask (throws invalid_argument otherwise).
void encode(std::span<const std::uint8_t> symbols, layout l, std::vector<std::byte>& out);

// Decodes exactly out.size() symbols from the whole of `in`. Throws corrupt_error on a bad mask,
// a size that does not match, or set padding bits.
void decode(std::span<const std::byte> in, std::span<std::uint8_t> out);

}  // namespace ckpt::codec::bit_pack
