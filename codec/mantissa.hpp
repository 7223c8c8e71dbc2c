#pragma once
// Lossy keyframes (docs/codec.md, "Lossy keyframes"): a float tensor rounded to fewer mantissa
// bits, then coded exactly. The bits dropped become zero byte planes, which the float-aware exact
// coder stores for almost nothing, so the keyframe shrinks by about the bits dropped and decoders
// need nothing new: what they read back is the rounded tensor.
#include <cstddef>
#include <span>

#include "codec/dtype.hpp"

namespace ckpt::codec {

// Mantissa bits of a float dtype: 23 (f32), 10 (f16), 7 (bf16).
constexpr int mantissa_bits(dtype t) noexcept {
  return t == dtype::f32 ? 23 : t == dtype::f16 ? 10 : t == dtype::bf16 ? 7 : 0;
}

// out = in with each element rounded to the nearest value with `keep` mantissa bits (ties to
// even); keep >= the dtype's mantissa bits copies. Guarantees, element by element: NaN (payload
// included) and +-Inf unchanged; finite stays finite (where rounding up would overflow, the
// value is truncated instead, and moves by at most 2^-keep); sign kept, so 0 and -0 are
// unchanged; any other normal value moves by at most 2^-(keep+1) of its magnitude, a subnormal
// by at most half the kept unit. `in` and `out`
// may be the same span. Throws invalid_argument for a non-float dtype, keep < 1, spans of
// different sizes or a size that is not a whole number of elements.
void round_mantissa(dtype t, std::span<const std::byte> in, std::span<std::byte> out, int keep);

}  // namespace ckpt::codec
