#pragma once
// Shared by the fuzz targets: whatever a recogniser returns must satisfy the layout contract and
// assemble (unreplaced: the identical bytes; replaced: without error).
#include <cstdlib>
#include <cstring>
#include <vector>

#include "codec/error.hpp"
#include "codec/format/assemble.hpp"
#include "codec/format/layout.hpp"
#include "codec/format/recognise.hpp"

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

// One fuzz input: the given recogniser may refuse cleanly (corrupt_error) or return a layout that
// must hold; the public entry point must never throw on content.
template <class Recogniser>
int run(const std::uint8_t* data, std::size_t size, Recogniser recognise_one) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  const auto src = memory_source(bytes);
  recognise_options opt;
  opt.min_compress_bytes = 0;
  opt.pickle.max_nodes = 1u << 16;  // keep single inputs fast; the limits logic is the same
  try {
    exercise(recognise_one(src, opt), src, bytes);
  } catch (const ckpt::corrupt_error&) {
    // a clean refusal
  }
  exercise(recognise(src, opt), src, bytes);
  return 0;
}

}  // namespace ckpt::format::fuzz
