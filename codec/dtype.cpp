#include "codec/dtype.hpp"

namespace ckpt::codec {

std::optional<dtype> parse_dtype(std::string_view s) noexcept {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::bytes})
    if (s == name(t)) return t;
  return std::nullopt;
}

}  // namespace ckpt::codec
