#include "codec/mantissa.hpp"

#include <cstdint>
#include <cstring>

#include "codec/error.hpp"

namespace ckpt::codec {
namespace {

template <typename U>
void round_words(const std::byte* in, std::byte* out, std::size_t n, int drop, U exp_mask) {
  for (std::size_t i = 0; i < n; ++i) {
    U x;
    std::memcpy(&x, in + i * sizeof(U), sizeof(U));
    x = round_word(x, drop, exp_mask);
    std::memcpy(out + i * sizeof(U), &x, sizeof(U));
  }
}

}  // namespace

void round_mantissa(dtype t, std::span<const std::byte> in, std::span<std::byte> out, int keep) {
  if (!is_float(t)) throw invalid_argument("codec: mantissa rounding needs a float dtype");
  if (keep < 1) throw invalid_argument("codec: mantissa rounding keeps at least 1 bit");
  const std::size_t es = element_size(t);
  if (in.size() != out.size() || in.size() % es)
    throw invalid_argument("codec: mantissa rounding spans differ or hold partial elements");
  const int drop = mantissa_bits(t) - keep;
  if (drop <= 0) {
    if (in.data() != out.data()) std::memmove(out.data(), in.data(), in.size());
    return;
  }
  const std::size_t n = in.size() / es;
  if (t == dtype::f32)
    round_words<std::uint32_t>(in.data(), out.data(), n, drop, 0x7f800000u);
  else
    round_words<std::uint16_t>(in.data(), out.data(), n, drop,
                               std::uint16_t(t == dtype::f16 ? 0x7c00u : 0x7f80u));
}

}  // namespace ckpt::codec
