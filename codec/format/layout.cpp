#include "codec/format/layout.hpp"

#include <algorithm>
#include <iterator>
#include <utility>

#include "codec/error.hpp"

namespace ckpt::format {

std::string_view name(file_format f) noexcept {
  switch (f) {
    case file_format::opaque:
      return "opaque";
    case file_format::torch_zip:
      return "torch_zip";
    case file_format::safetensors:
      return "safetensors";
    case file_format::npy:
      return "npy";
    case file_format::npz:
      return "npz";
    case file_format::distcp:
      return "distcp";
  }
  return "?";
}

std::string_view name(element_type t) noexcept {
  switch (t) {
    case element_type::f32:
      return "f32";
    case element_type::f16:
      return "f16";
    case element_type::bf16:
      return "bf16";
    case element_type::f64:
      return "f64";
    case element_type::c64:
      return "c64";
    case element_type::c128:
      return "c128";
    case element_type::i64:
      return "i64";
    case element_type::i32:
      return "i32";
    case element_type::i16:
      return "i16";
    case element_type::i8:
      return "i8";
    case element_type::u64:
      return "u64";
    case element_type::u32:
      return "u32";
    case element_type::u16:
      return "u16";
    case element_type::u8:
      return "u8";
    case element_type::boolean:
      return "bool";
    case element_type::other:
      return "other";
  }
  return "?";
}

std::size_t element_size(element_type t) noexcept {
  switch (t) {
    case element_type::f64:
    case element_type::c64:
    case element_type::i64:
    case element_type::u64:
      return 8;
    case element_type::c128:
      return 16;
    case element_type::f32:
    case element_type::i32:
    case element_type::u32:
      return 4;
    case element_type::f16:
    case element_type::bf16:
    case element_type::i16:
    case element_type::u16:
      return 2;
    case element_type::i8:
    case element_type::u8:
    case element_type::boolean:
    case element_type::other:
      return 1;
  }
  return 1;
}

std::optional<codec::dtype> codec_dtype(element_type t) noexcept {
  switch (t) {
    case element_type::f32:
      return codec::dtype::f32;
    case element_type::f16:
      return codec::dtype::f16;
    case element_type::bf16:
      return codec::dtype::bf16;
    default:
      return std::nullopt;
  }
}

std::uint64_t layout::opaque_bytes() const noexcept {
  std::uint64_t n = 0;
  for (const auto& s : segments)
    if (!s.tensor) n += s.length;
  return n;
}

std::uint64_t layout::tensor_bytes(bool compress) const noexcept {
  std::uint64_t n = 0;
  for (const auto& t : tensors)
    if (t.compress == compress) n += t.length;
  return n;
}

layout opaque_layout(std::uint64_t file_size, std::string why) {
  layout l;
  l.file_size = file_size;
  if (file_size > 0) l.segments.push_back({0, file_size, std::nullopt});
  l.note = std::move(why);
  return l;
}

void finish_layout(layout& l) {
  std::stable_sort(l.tensors.begin(), l.tensors.end(),
                   [](const tensor_info& a, const tensor_info& b) { return a.offset < b.offset; });
  std::sort(l.fixups.begin(), l.fixups.end(),
            [](const crc_fixup& a, const crc_fixup& b) { return a.field_offset < b.field_offset; });
  l.segments.clear();
  std::uint64_t at = 0;
  for (std::size_t i = 0; i < l.tensors.size(); ++i) {
    const auto& t = l.tensors[i];
    if (t.offset > l.file_size || t.length > l.file_size - t.offset)
      throw corrupt_error("tensor '" + t.name + "' lies beyond the end of the file");
    if (t.length % element_size(t.type) != 0)
      throw corrupt_error("tensor '" + t.name + "' is not a whole number of elements");
    if (t.length == 0) continue;
    if (t.offset < at) throw corrupt_error("tensor '" + t.name + "' overlaps the previous one");
    if (t.offset > at) l.segments.push_back({at, t.offset - at, std::nullopt});
    l.segments.push_back({t.offset, t.length, i});
    at = t.offset + t.length;
  }
  if (at < l.file_size) l.segments.push_back({at, l.file_size - at, std::nullopt});
  validate(l);
}

void validate(const layout& l) {
  std::uint64_t at = 0;
  std::size_t tensor_segments = 0;
  for (const auto& s : l.segments) {
    if (s.offset != at || s.length == 0) throw corrupt_error("segments do not tile the file");
    if (s.length > l.file_size - at) throw corrupt_error("segment beyond end of file");
    if (s.tensor) {
      if (*s.tensor >= l.tensors.size()) throw corrupt_error("segment names a missing tensor");
      const auto& t = l.tensors[*s.tensor];
      if (t.offset != s.offset || t.length != s.length)
        throw corrupt_error("tensor segment disagrees with its tensor");
      ++tensor_segments;
    }
    at += s.length;
  }
  if (at != l.file_size) throw corrupt_error("segments do not cover the file");
  const auto nonempty = std::count_if(l.tensors.begin(), l.tensors.end(),
                                      [](const tensor_info& t) { return t.length > 0; });
  if (std::size_t(nonempty) != tensor_segments)
    throw corrupt_error("a tensor has no segment, or two");
  for (const auto& m : l.members)
    if (m.data_offset > l.file_size || m.data_length > l.file_size - m.data_offset)
      throw corrupt_error("zip member '" + m.name + "' beyond end of file");
  // Members' covered ranges, sorted, must not overlap (a zip stores each member once).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> covered;
  for (const auto& m : l.members)
    if (m.data_length > 0) covered.emplace_back(m.data_offset, m.data_offset + m.data_length);
  std::sort(covered.begin(), covered.end());
  for (std::size_t i = 1; i < covered.size(); ++i)
    if (covered[i].first < covered[i - 1].second) throw corrupt_error("zip members overlap");
  std::uint64_t prev_end = 0;
  for (const auto& f : l.fixups) {
    if (f.member >= l.members.size()) throw corrupt_error("CRC fix-up names a missing member");
    if (f.field_offset > l.file_size || 4 > l.file_size - f.field_offset)
      throw corrupt_error("CRC field beyond end of file");
    if (f.field_offset < prev_end) throw corrupt_error("CRC fields overlap");
    prev_end = f.field_offset + 4;
    // Inside an opaque segment: find the segment holding the field's first byte.
    auto it = std::upper_bound(l.segments.begin(), l.segments.end(), f.field_offset,
                               [](std::uint64_t v, const segment& s) { return v < s.offset; });
    if (it == l.segments.begin()) throw corrupt_error("CRC field before the first segment");
    --it;
    if (it->tensor || f.field_offset + 4 > it->offset + it->length)
      throw corrupt_error("CRC field overlaps a tensor payload");
    auto c = std::upper_bound(covered.begin(), covered.end(),
                              std::pair{f.field_offset + 4, std::uint64_t(0)});
    if (c != covered.begin() && std::prev(c)->second > f.field_offset)
      throw corrupt_error("CRC field inside a member's covered bytes");
  }
}

}  // namespace ckpt::format
