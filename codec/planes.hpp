#pragma once
// Byte planes of float words, the layout of lossless float blocks (block_codec::float_lossless):
// plane b holds byte b of every element word rotated left by one bit. The fp32/bf16 exponent then
// fills one plane on its own (the only compressible one for trained weights) and the sign joins
// the low mantissa byte. This is a stored format: both functions must keep it bit for bit.
#include <array>
#include <cstddef>
#include <cstdint>

#include "codec/dtype.hpp"

namespace ckpt::codec {

// `planes` receives element_size(t) planes of n bytes each, one after the other.
void to_planes(dtype t, const std::byte* in, std::size_t n, std::uint8_t* planes);

// The inverse: element words from planes given by pointer (a stored plane is read where it lies
// in the payload, not copied first). Only the first element_size(t) pointers are used.
void from_planes(dtype t, const std::array<const std::uint8_t*, 4>& planes, std::size_t n,
                 std::byte* out);

}  // namespace ckpt::codec
