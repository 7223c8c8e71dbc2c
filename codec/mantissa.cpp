#include "codec/mantissa.hpp"

#include <cstdint>
#include <cstring>

#include "codec/error.hpp"

namespace ckpt::codec {
namespace {

// On the bit pattern: adding half a kept unit (less one, plus the kept lsb: ties to even) carries
// into the exponent exactly when the rounded magnitude needs it, because IEEE magnitudes are
// ordered like their bit patterns.
template <typename U>
void round_words(const std::byte* in, std::byte* out, std::size_t n, int drop, U exp_mask) {
  const U low = U((U(1) << drop) - 1), half = U(U(1) << (drop - 1));
  for (std::size_t i = 0; i < n; ++i) {
    U x;
    std::memcpy(&x, in + i * sizeof(U), sizeof(U));
    if ((x & exp_mask) != exp_mask) {  // finite
      const U lsb = U((x >> drop) & 1u);
      U r = U(U(x + U(half - 1u + lsb)) & U(~low));
      if ((r & exp_mask) == exp_mask) r = U(x & U(~low));  // would overflow to Inf: truncate
      x = r;
    }
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
