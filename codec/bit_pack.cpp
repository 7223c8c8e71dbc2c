// codec::bit_pack (bit_pack.hpp).
#include "codec/bit_pack.hpp"

#include <array>
#include <bit>
#include <cstring>
#include <string>

#include "codec/error.hpp"

#if defined(__BMI2__)
#include <immintrin.h>
#endif

namespace ckpt::codec::bit_pack {

namespace {

constexpr std::uint64_t kEveryByte = 0x0101010101010101ull;

// Scalar pext / pdep on one byte: the loops the BMI2 instructions replace.
std::uint8_t extract(std::uint8_t s, std::uint8_t mask) {
  std::uint8_t v = 0;
  for (unsigned bit = 0, at = 0; bit < 8; ++bit)
    if (mask >> bit & 1) v = std::uint8_t(v | ((s >> bit & 1) << at++));
  return v;
}
std::uint8_t deposit(std::uint8_t v, std::uint8_t mask) {
  std::uint8_t s = 0;
  for (unsigned bit = 0, at = 0; bit < 8; ++bit)
    if (mask >> bit & 1) s = std::uint8_t(s | ((v >> at++ & 1) << bit));
  return s;
}

std::uint64_t load64(const std::uint8_t* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace

layout layout_of(const byte_histogram& counts) {
  std::uint8_t any = 0, all = 0xff;
  bool present = false;
  for (int s = 0; s < 256; ++s) {
    if (!counts[s]) continue;
    present = true;
    any = std::uint8_t(any | s);
    all = std::uint8_t(all & s);
  }
  if (!present) return {};
  return {std::uint8_t(any ^ all), all};
}

std::size_t payload_size(std::size_t n, std::uint8_t mask) {
  return 2 + (n * std::size_t(std::popcount(mask)) + 7) / 8;
}

void encode(std::span<const std::uint8_t> symbols, layout l, std::vector<std::byte>& out) {
  const unsigned k = unsigned(std::popcount(l.mask));
  if (k < 1 || k > 7 || (l.fixed & l.mask))
    throw invalid_argument("bit_pack: mask must have 1 to 7 bits, outside the fixed bits");
  const std::size_t n = symbols.size();
  const std::size_t at = out.size();
  const std::size_t size = payload_size(n, l.mask);
  // Eight symbols become k whole bytes, stored 8 bytes at a time: room for the last store.
  out.resize(at + size + 8);
  auto* const begin = reinterpret_cast<std::uint8_t*>(out.data() + at);
  begin[0] = l.mask;
  begin[1] = l.fixed;
  std::uint8_t* dst = begin + 2;
  const std::uint8_t* const src = symbols.data();
  std::array<std::uint8_t, 256> ext;
  for (int s = 0; s < 256; ++s) ext[s] = extract(std::uint8_t(s), l.mask);
  std::size_t i = 0;
#if defined(__BMI2__)
  const std::uint64_t mask8 = kEveryByte * l.mask;
  for (; i + 8 <= n; i += 8, dst += k) {
    const std::uint64_t p = _pext_u64(load64(src + i), mask8);
    std::memcpy(dst, &p, 8);
  }
#else
  for (; i + 8 <= n; i += 8, dst += k) {
    std::uint64_t p = 0;
    for (unsigned j = 0; j < 8; ++j) p |= std::uint64_t(ext[src[i + j]]) << (j * k);
    std::memcpy(dst, &p, 8);
  }
#endif
  std::uint64_t acc = 0;  // under 8 symbols of at most 7 bits remain
  unsigned nb = 0;
  for (; i < n; ++i, nb += k) acc |= std::uint64_t(ext[src[i]]) << nb;
  std::memcpy(dst, &acc, 8);
  out.resize(at + size);
}

void decode(std::span<const std::byte> in, std::span<std::uint8_t> out) {
  if (in.size() < 2) throw corrupt_error("bit_pack: truncated header");
  const auto mask = std::to_integer<std::uint8_t>(in[0]);
  const auto fixed = std::to_integer<std::uint8_t>(in[1]);
  const unsigned k = unsigned(std::popcount(mask));
  if (k < 1 || k > 7 || (fixed & mask)) throw corrupt_error("bit_pack: bad mask");
  const std::size_t n = out.size();
  if (in.size() != payload_size(n, mask))
    throw corrupt_error("bit_pack: " + std::to_string(in.size()) + " bytes for " +
                        std::to_string(n) + " symbols");
  const auto* const src = reinterpret_cast<const std::uint8_t*>(in.data()) + 2;
  const std::size_t bytes = in.size() - 2;
  if (const unsigned tail_bits = unsigned(n * k % 8); tail_bits && src[bytes - 1] >> tail_bits)
    throw corrupt_error("bit_pack: padding bits set");

  std::array<std::uint8_t, 128> dep;
  for (unsigned v = 0; v < (1u << k); ++v)
    dep[v] = std::uint8_t(deposit(std::uint8_t(v), mask) | fixed);
  std::uint8_t* const o = out.data();
  std::size_t i = 0, at = 0;
  // Whole groups of eight symbols (k bytes) while an 8-byte load stays inside the payload.
#if defined(__BMI2__)
  const std::uint64_t mask8 = kEveryByte * mask, fixed8 = kEveryByte * fixed;
  for (; i + 8 <= n && at + 8 <= bytes; i += 8, at += k) {
    const std::uint64_t w = _pdep_u64(load64(src + at), mask8) | fixed8;
    std::memcpy(o + i, &w, 8);
  }
#else
  const std::uint64_t low = (1u << k) - 1;
  for (; i + 8 <= n && at + 8 <= bytes; i += 8, at += k) {
    const std::uint64_t v = load64(src + at);
    for (unsigned j = 0; j < 8; ++j) o[i + j] = dep[(v >> (j * k)) & low];
  }
#endif
  // The rest (fewer than 8 + k bytes) from a zero-padded copy, a symbol at a time.
  std::array<std::uint8_t, 24> tail{};
  std::memcpy(tail.data(), src + at, bytes - at);
  for (std::size_t bit = 0; i < n; ++i, bit += k) {
    const unsigned two = unsigned(tail[bit / 8]) | unsigned(tail[bit / 8 + 1]) << 8;
    o[i] = dep[(two >> (bit % 8)) & ((1u << k) - 1)];
  }
}

}  // namespace ckpt::codec::bit_pack
