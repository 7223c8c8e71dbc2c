#pragma once
// The escapes of a lossy block (elements stored as they read back, not by a symbol) in their
// coded form, block format version 4 (docs/format.md, "Coded escapes"): the gaps between
// ascending indices as LEB128 bytes and the values as the byte planes of lossless float blocks
// (planes.hpp), each an entropy stream. Escaped elements are rare and scattered (a second moment
// the table cannot bring within a factor 2 of its value), and on a rounded chain carry few
// mantissa bits: coded, an escape cost a quarter of the plain list's 4 + element size bytes on the
// transformer's v (docs/benchmarks.md, "Coded escapes and one bit for Adam's v").
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/byte_io.hpp"
#include "codec/dtype.hpp"
#include "codec/entropy.hpp"

namespace ckpt::codec {

// Appends the coded section for `indices` (ascending, distinct) whose values are `values`
// (indices.size() elements of t, one after the other): a u32 count of gap bytes, then a u32
// length before each entropy stream (the gaps, then each value plane). Returns its size.
std::size_t put_coded_escapes(dtype t, std::span<const std::uint32_t> indices,
                              std::span<const std::byte> values, entropy_policy policy,
                              std::vector<std::byte>& out);

// Reads what put_coded_escapes wrote for `count` (at least 1) escapes of a block of n elements:
// indices ascending and below n, values count elements of t. Anything that does not add up
// exactly (no escapes, a gap stream too long or short, a gap over 5 bytes or not in its shortest
// form, an index past n, a cut stream) throws corrupt_error.
void get_coded_escapes(byte_reader& r, dtype t, std::size_t n, std::size_t count,
                       std::vector<std::uint32_t>& indices, std::vector<std::byte>& values);

}  // namespace ckpt::codec
