#pragma once
// Element types the codec understands, and exact conversions between the 16-bit float formats and
// fp32 (the codec does all arithmetic in fp32). The conversions are written out bit by bit so the
// encoder and the decoder round identically on every machine and with every compiler flag.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace ckpt::codec {

enum class dtype : std::uint8_t { f32 = 0, f16 = 1, bf16 = 2, bytes = 3 };

constexpr std::size_t element_size(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return 4;
    case dtype::f16:
    case dtype::bf16:
      return 2;
    case dtype::bytes:
      return 1;
  }
  return 1;
}

constexpr bool is_float(dtype t) noexcept {
  return t != dtype::bytes;
}

constexpr std::string_view name(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return "f32";
    case dtype::f16:
      return "f16";
    case dtype::bf16:
      return "bf16";
    case dtype::bytes:
      return "bytes";
  }
  return "?";
}

std::optional<dtype> parse_dtype(std::string_view s) noexcept;

// IEEE binary16 -> binary32, exact for every input (NaN payloads are kept in the high bits).
constexpr float f16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1f;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: normalise
    int e = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (std::uint32_t(e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// binary32 -> binary16, round to nearest even; overflow gives +-Inf, NaN stays NaN (quiet).
constexpr std::uint16_t f32_to_f16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = std::uint16_t((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // Inf or NaN
    if (ax == 0x7f800000u) return sign | 0x7c00u;
    return sign | 0x7e00u | std::uint16_t((ax >> 13) & 0x3ffu);
  }
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: Inf
  if (ax >= 0x38800000u) {                       // normal half
    const std::uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
    return sign | std::uint16_t((r - 0x38000000u) >> 13);
  }
  if (ax < 0x33000000u) return sign;  // below half the smallest subnormal: +-0
  // subnormal half: shift the implicit-one mantissa into place, round to nearest even.
  const std::uint32_t e = ax >> 23;
  const std::uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126 - e;  // 14..24
  const std::uint32_t half = 1u << (shift - 1);
  const std::uint32_t rest = m & ((1u << shift) - 1);
  std::uint32_t q = m >> shift;
  if (rest > half || (rest == half && (q & 1u))) ++q;
  return sign | std::uint16_t(q);
}

constexpr float bf16_to_f32(std::uint16_t h) noexcept {
  return std::bit_cast<float>(std::uint32_t(h) << 16);
}

// Element i of a float tensor's bytes, widened to binary32 (0 for dtype::bytes). For loops that
// look at any float dtype outside the coders' vector kernels.
inline float load_f32(dtype t, const std::byte* p) noexcept {
  switch (t) {
    case dtype::f32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case dtype::f16:
    case dtype::bf16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return t == dtype::f16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
    default:
      return 0;
  }
}

// binary32 -> bfloat16, round to nearest even; NaN stays NaN (quiet), never rounds to Inf.
constexpr std::uint16_t f32_to_bf16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((x >> 16) | 0x40u);
  return std::uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace ckpt::codec
