#include "codec/format/crc32.hpp"

namespace ckpt::format {
namespace {

// A 32x32 matrix over GF(2), as 32 column vectors: column n is the image of bit n.
using gf2_matrix = std::uint32_t[32];

std::uint32_t apply(const gf2_matrix m, std::uint32_t v) noexcept {
  std::uint32_t out = 0;
  for (int n = 0; v; ++n, v >>= 1)
    if (v & 1) out ^= m[n];
  return out;
}

void square(gf2_matrix out, const gf2_matrix m) noexcept {
  for (int n = 0; n < 32; ++n) out[n] = apply(m, m[n]);
}

}  // namespace

std::uint32_t crc32_combine(std::uint32_t crc1, std::uint32_t crc2, std::uint64_t len2) noexcept {
  if (len2 == 0) return crc1;
  // One zero bit shifts the (reflected) register right and folds the polynomial 0xedb88320 in
  // when bit 0 falls out. Squaring gives two, four, eight... zero bits; the first useful power
  // is one zero byte.
  gf2_matrix odd, even;
  odd[0] = 0xedb88320u;
  for (int n = 1; n < 32; ++n) odd[n] = 1u << (n - 1);
  square(even, odd);  // two zero bits
  square(odd, even);  // four
  // Walk the bits of len2 (in bytes): each step squares the operator (8, 16, 32... zero bits).
  for (;;) {
    square(even, odd);
    if (len2 & 1) crc1 = apply(even, crc1);
    len2 >>= 1;
    if (!len2) break;
    square(odd, even);
    if (len2 & 1) crc1 = apply(odd, crc1);
    len2 >>= 1;
    if (!len2) break;
  }
  return crc1 ^ crc2;
}

}  // namespace ckpt::format
