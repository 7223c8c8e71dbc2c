// safetensors: u64 LE header length N, N bytes of JSON, then the data buffer. Every tensor's
// data_offsets are relative to the buffer; the reader (huggingface/safetensors tensor.rs) demands
// that they tile the buffer exactly, and so do we, so a layout never disagrees with the loader.
#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>

#include "codec/error.hpp"
#include "codec/format/recognise.hpp"

namespace ckpt::format {
namespace {

std::optional<element_type> safetensors_type(std::string_view s) {
  struct entry {
    std::string_view name;
    element_type type;
  };
  static constexpr std::array<entry, 17> table{{
      {"F32", element_type::f32},
      {"F16", element_type::f16},
      {"BF16", element_type::bf16},
      {"F64", element_type::f64},
      {"I64", element_type::i64},
      {"I32", element_type::i32},
      {"I16", element_type::i16},
      {"I8", element_type::i8},
      {"U64", element_type::u64},
      {"U32", element_type::u32},
      {"U16", element_type::u16},
      {"U8", element_type::u8},
      {"BOOL", element_type::boolean},
      {"F8_E5M2", element_type::other},
      {"F8_E4M3", element_type::other},
      {"F8_E8M0", element_type::other},
      {"C64", element_type::c64},
  }};
  for (const auto& e : table)
    if (e.name == s) return e.type;
  return std::nullopt;
}

// nlohmann's parser is iterative, but refuse absurd nesting before handing it the text anyway:
// a safetensors header is two levels deep.
void check_nesting(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) throw corrupt_error("safetensors: header nested too deeply");
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
}

std::uint64_t as_u64(const nlohmann::json& j) {
  if (!j.is_number_unsigned()) throw corrupt_error("safetensors: expected an unsigned integer");
  return j.get<std::uint64_t>();
}

}  // namespace

layout recognise_safetensors(const source& src, const recognise_options& opt) {
  const auto size = src.size();
  if (size < 8) throw corrupt_error("safetensors: too short");
  std::array<std::byte, 8> nb{};
  src.read(0, nb);
  std::uint64_t n;
  std::memcpy(&n, nb.data(), 8);
  if (n > opt.max_header_bytes || n > size - 8)
    throw corrupt_error("safetensors: header length beyond the file");
  const auto raw = src.read(8, n);
  const std::string_view text(reinterpret_cast<const char*>(raw.data()), raw.size());
  if (text.empty() || text.front() != '{') throw corrupt_error("safetensors: header is not {...}");
  check_nesting(text, 8);
  const auto header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) throw corrupt_error("safetensors: header is not a JSON object");

  const std::uint64_t buffer_at = 8 + n;
  layout l;
  l.format = file_format::safetensors;
  l.file_size = size;
  for (const auto& [key, v] : header.items()) {
    if (key == "__metadata__") continue;
    if (!v.is_object()) throw corrupt_error("safetensors: tensor entry is not an object");
    const auto dt = v.find("dtype");
    const auto shape = v.find("shape");
    const auto offs = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string() || shape == v.end() || !shape->is_array() ||
        offs == v.end() || !offs->is_array() || offs->size() != 2)
      throw corrupt_error("safetensors: malformed tensor entry '" + key + "'");
    const auto type = safetensors_type(dt->get_ref<const std::string&>());
    if (!type) throw corrupt_error("safetensors: unknown dtype " + dt->get<std::string>());
    tensor_info t;
    t.name = key;
    t.type = *type;
    std::uint64_t numel = 1;
    if (shape->size() > 64) throw corrupt_error("safetensors: too many dimensions");
    for (const auto& d : *shape) {
      const auto x = as_u64(d);
      if (x != 0 && numel > std::numeric_limits<std::uint64_t>::max() / x)
        throw corrupt_error("safetensors: shape overflows");
      numel *= x;
      t.shape.push_back(x);
    }
    const auto begin = as_u64((*offs)[0]), end = as_u64((*offs)[1]);
    if (end < begin || end > size - buffer_at)
      throw corrupt_error("safetensors: data_offsets out of range for '" + key + "'");
    const auto esize = element_size(t.type);
    if (numel > (end - begin) / esize || numel * esize != end - begin)
      throw corrupt_error("safetensors: size disagrees with shape for '" + key + "'");
    t.offset = buffer_at + begin;
    t.length = end - begin;
    t.compress = is_candidate(t.type, t.length, opt);
    l.tensors.push_back(std::move(t));
  }
  // The loader requires the tensors to tile the buffer with no gap and no overlap.
  std::stable_sort(l.tensors.begin(), l.tensors.end(), [](const auto& a, const auto& b) {
    return a.offset < b.offset || (a.offset == b.offset && a.length < b.length);
  });
  std::uint64_t at = buffer_at;
  for (const auto& t : l.tensors) {
    if (t.offset != at) throw corrupt_error("safetensors: tensors do not tile the data buffer");
    at += t.length;
  }
  if (at != size) throw corrupt_error("safetensors: data buffer size disagrees with the file");
  finish_layout(l);
  return l;
}

}  // namespace ckpt::format
