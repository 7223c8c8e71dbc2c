#pragma once
// Lossy keyframes (docs/codec.md, "Lossy keyframes"): a float tensor rounded to fewer mantissa
// bits, then coded exactly. The bits dropped become zero byte planes, which the float-aware exact
// coder stores for almost nothing, so the keyframe shrinks by about the bits dropped and decoders
// need nothing new: what they read back is the rounded tensor.
#include <cstddef>
#include <cstdint>
#include <span>

#include "codec/dtype.hpp"

namespace ckpt::codec {

// Mantissa bits of a float dtype: 23 (f32), 10 (f16), 7 (bf16).
constexpr int mantissa_bits(dtype t) noexcept {
  return t == dtype::f32 ? 23 : t == dtype::f16 ? 10 : t == dtype::bf16 ? 7 : 0;
}

// One element of round_mantissa on its bit pattern: `drop` (1 .. mantissa bits) low bits rounded
// away. Adding half a dropped unit (less one, plus the kept lsb: ties to even) carries into the
// exponent exactly when the rounded magnitude needs it, because IEEE magnitudes are ordered like
// their bit patterns. Used element by element where a coder rounds what it reconstructs.
template <typename U>
constexpr U round_word(U x, int drop, U exp_mask) noexcept {
  if ((x & exp_mask) == exp_mask) return x;  // NaN and Inf unchanged
  const U low = U((U(1) << drop) - 1), half = U(U(1) << (drop - 1));
  const U lsb = U((x >> drop) & 1u);
  const U r = U(U(x + U(half - 1u + lsb)) & U(~low));
  return (r & exp_mask) == exp_mask ? U(x & U(~low)) : r;  // would overflow to Inf: truncate
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
