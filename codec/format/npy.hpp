#pragma once
// NumPy .npy headers (format versions 1-3) and .npz archives of them.
#include <cstdint>
#include <vector>

#include "codec/format/layout.hpp"
#include "codec/format/recognise.hpp"
#include "codec/format/source.hpp"
#include "codec/format/zip.hpp"

namespace ckpt::format {

struct npy_header {
  element_type type = element_type::u8;
  std::vector<std::uint64_t> shape;
  bool fortran_order = false;
  std::uint64_t data_offset = 0;  // relative to the start of the .npy
  std::uint64_t data_length = 0;  // elements * element size
};

// Parses the magic, version and header dict of the .npy that `src` holds. Throws corrupt_error
// for anything it does not model exactly (big-endian, object or structured dtypes, bad syntax).
npy_header parse_npy_header(const source& src, std::uint64_t max_header_bytes);

// Stored members become tensors; deflated members stay opaque.
layout recognise_npz(const source& src, const zip_directory& dir, const recognise_options& opt);

}  // namespace ckpt::format
