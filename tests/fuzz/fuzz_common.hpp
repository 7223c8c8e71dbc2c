#pragma once
// Shared by the fuzz targets: whatever a recogniser returns must satisfy the layout contract and
// assemble (unreplaced: the identical bytes; replaced: without error).
#include <cstdlib>
#include <cstring>
#include <vector>

#include "codec/format/assemble.hpp"
#include "codec/format/layout.hpp"

namespace ckpt::format::fuzz {

inline void exercise(const layout& l, const source& src, std::span<const std::byte> bytes) {
  validate(l);
  if (l.file_size != bytes.size()) std::abort();
  std::vector<std::byte> out(bytes.size());
  if (make_served_file(l, src, {}).read(0, out) != out.size()) std::abort();
  if (!out.empty() && std::memcmp(out.data(), bytes.data(), out.size()) != 0) std::abort();
  std::vector<std::vector<std::byte>> rep(l.tensors.size());
  for (std::size_t i = 0; i < l.tensors.size(); ++i)
    if (l.tensors[i].compress && l.tensors[i].length < (1u << 20))
      rep[i].assign(l.tensors[i].length, std::byte(0x5a));
  make_served_file(l, src, std::move(rep)).read(0, out);
}

}  // namespace ckpt::format::fuzz
