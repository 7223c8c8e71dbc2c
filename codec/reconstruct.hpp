#pragma once
// THE reconstruction: ũ_t = to_dtype(ũ_{t-1} + rep[symbol]) for differences, and
// ũ_t = to_dtype(ũ_{t-1} * rep[symbol]) for ratios (rep holds the factor 1 + r̄), computed in
// fp32. Encoder and decoder both call these and nothing else, so a version reads back exactly
// as the encoder assumed when it coded the next delta (DESIGN.md §2 item 6). Compiled with
// -ffp-contract=off.
#include <cstddef>
#include <cstdint>

#include "codec/dtype.hpp"

namespace ckpt::codec {

// Element access per dtype: fp32 values for arithmetic, storage bits for output.
template <dtype T>
struct element;

template <>
struct element<dtype::f32> {
  using storage = float;
  static float to_f32(float v) { return v; }
  static float from_f32(float v) { return v; }
};
template <>
struct element<dtype::f16> {
  using storage = std::uint16_t;
  static float to_f32(std::uint16_t v) { return f16_to_f32(v); }
  static std::uint16_t from_f32(float v) { return f32_to_f16(v); }
};
template <>
struct element<dtype::bf16> {
  using storage = std::uint16_t;
  static float to_f32(std::uint16_t v) { return bf16_to_f32(v); }
  static std::uint16_t from_f32(float v) { return f32_to_bf16(v); }
};

// What a delta is (quantizer.hpp): difference d = u - ũ_prev, or ratio d = u / ũ_prev - 1, the
// relative change. A ratio is non-finite when ũ_prev = 0 and u != 0 (the element then goes through
// the exact escape); 0 / 0 counts as no change. `intra` is a difference against zero instead of
// the base: for a tensor its base does not predict (Adam's first moment, which a checkpoint
// interval of β1-decay replaces almost entirely), coding the value itself halves what the
// buckets must span. The kernels code it as a difference on a zero base (zero_base()).
enum class delta_kind : std::uint8_t { difference = 0, ratio = 1, intra = 2 };

// zero_base_bytes of zeros, never written: the base of intra blocks (at least a block's input) and
// of their statistics. It lives in .bss, so reading it maps the kernel's shared zero page and
// costs no memory.
inline constexpr std::size_t zero_base_bytes = std::size_t(64) << 20;
const std::byte* zero_base() noexcept;

// Intra is a difference on zero_base(): these take the kernels' kinds only.
template <delta_kind K>
inline float delta_of(float cur, float base) {
  static_assert(K != delta_kind::intra, "intra codes as a difference on zero_base()");
  if constexpr (K == delta_kind::difference) {
    return cur - base;
  } else {
    return cur == base ? 0.0f : cur / base - 1.0f;
  }
}

template <dtype T, delta_kind K = delta_kind::difference>
inline typename element<T>::storage reconstruct(typename element<T>::storage base, float rep) {
  static_assert(K != delta_kind::intra, "intra codes as a difference on zero_base()");
  if constexpr (K == delta_kind::difference) {
    return element<T>::from_f32(element<T>::to_f32(base) + rep);
  } else {
    return element<T>::from_f32(element<T>::to_f32(base) * rep);
  }
}

}  // namespace ckpt::codec
