// NumPy .npy (format 1.0: u16 header length; 2.0 and 3.0: u32, 3.0 allowing UTF-8) and .npz.
// The header is a Python dict literal, e.g. {'descr': '<f4', 'fortran_order': False,
// 'shape': (3, 4), }, padded with spaces and a newline; it is parsed here by a tiny literal
// parser that accepts exactly strings, True/False and tuples of integers.
#include "codec/format/npy.hpp"

#include <array>
#include <charconv>
#include <cstring>
#include <limits>
#include <string_view>

#include "codec/error.hpp"

namespace ckpt::format {
namespace {

class literal_parser {
 public:
  explicit literal_parser(std::string_view s) : s_(s) {}

  void ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t')) ++pos_;
  }
  bool eat(char c) {
    ws();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) throw corrupt_error(std::string("npy: expected '") + c + "'");
  }
  bool at(char c) {
    ws();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  std::string_view string() {
    ws();
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"'))
      throw corrupt_error("npy: expected a string");
    const char q = s_[pos_++];
    const auto end = s_.find(q, pos_);
    if (end == std::string_view::npos) throw corrupt_error("npy: unterminated string");
    const auto out = s_.substr(pos_, end - pos_);
    if (out.find('\\') != std::string_view::npos) throw corrupt_error("npy: escaped string");
    pos_ = end + 1;
    return out;
  }
  bool boolean() {
    ws();
    if (s_.substr(pos_).starts_with("True")) return pos_ += 4, true;
    if (s_.substr(pos_).starts_with("False")) return pos_ += 5, false;
    throw corrupt_error("npy: expected True or False");
  }
  std::uint64_t integer() {
    ws();
    std::uint64_t v = 0;
    const auto r = std::from_chars(s_.data() + pos_, s_.data() + s_.size(), v);
    if (r.ec != std::errc()) throw corrupt_error("npy: expected an integer");
    pos_ = std::size_t(r.ptr - s_.data());
    if (pos_ < s_.size() && s_[pos_] == 'L') ++pos_;  // Python 2 long
    return v;
  }
  std::vector<std::uint64_t> int_tuple() {
    expect('(');
    std::vector<std::uint64_t> out;
    while (!eat(')')) {
      if (out.size() >= 64) throw corrupt_error("npy: too many dimensions");
      out.push_back(integer());
      if (!eat(',')) {
        expect(')');
        break;
      }
    }
    return out;
  }
  bool done() {
    ws();
    return pos_ == s_.size();
  }

 private:
  std::string_view s_;
  std::size_t pos_ = 0;
};

element_type parse_descr(std::string_view d) {
  if (d.size() < 3) throw corrupt_error("npy: unsupported descr");
  const char order = d[0];
  const auto code = d.substr(1);
  struct entry {
    std::string_view code;
    element_type type;
  };
  static constexpr std::array<entry, 13> table{{{"f4", element_type::f32},
                                                {"f2", element_type::f16},
                                                {"f8", element_type::f64},
                                                {"c8", element_type::c64},
                                                {"c16", element_type::c128},
                                                {"i8", element_type::i64},
                                                {"i4", element_type::i32},
                                                {"i2", element_type::i16},
                                                {"i1", element_type::i8},
                                                {"u8", element_type::u64},
                                                {"u4", element_type::u32},
                                                {"u2", element_type::u16},
                                                {"u1", element_type::u8}}};
  element_type t = element_type::other;
  bool found = false;
  if (code == "b1") t = element_type::boolean, found = true;
  for (const auto& e : table)
    if (e.code == code) t = e.type, found = true;
  if (!found) throw corrupt_error("npy: unsupported descr '" + std::string(d) + "'");
  if (order == '>' && element_size(t) > 1) throw corrupt_error("npy: big-endian data");
  if (order != '<' && order != '|' && order != '=' && order != '>')
    throw corrupt_error("npy: bad byte order");
  return t;
}

}  // namespace

npy_header parse_npy_header(const source& src, std::uint64_t max_header_bytes) {
  if (src.size() < 10) throw corrupt_error("npy: too short");
  std::array<std::byte, 12> pre{};
  src.read(0, std::span(pre).first(std::min<std::uint64_t>(12, src.size())));
  if (std::memcmp(pre.data(), "\x93NUMPY", 6) != 0) throw corrupt_error("npy: bad magic");
  const auto major = std::to_integer<int>(pre[6]);
  std::uint64_t hlen = 0, hstart = 0;
  if (major == 1) {
    std::uint16_t n;
    std::memcpy(&n, pre.data() + 8, 2);
    hlen = n, hstart = 10;
  } else if (major == 2 || major == 3) {
    if (src.size() < 12) throw corrupt_error("npy: too short");
    std::uint32_t n;
    std::memcpy(&n, pre.data() + 8, 4);
    hlen = n, hstart = 12;
  } else {
    throw corrupt_error("npy: unknown format version " + std::to_string(major));
  }
  if (hlen > max_header_bytes || hlen > src.size() - hstart)
    throw corrupt_error("npy: header length beyond the file");
  const auto raw = src.read(hstart, hlen);
  literal_parser p(std::string_view(reinterpret_cast<const char*>(raw.data()), raw.size()));
  npy_header h;
  bool have_descr = false, have_order = false, have_shape = false;
  p.expect('{');
  while (!p.eat('}')) {
    const auto key = p.string();
    p.expect(':');
    if (key == "descr") {
      if (!p.at('\'') && !p.at('"')) throw corrupt_error("npy: structured dtype");
      h.type = parse_descr(p.string());
      have_descr = true;
    } else if (key == "fortran_order") {
      h.fortran_order = p.boolean();
      have_order = true;
    } else if (key == "shape") {
      h.shape = p.int_tuple();
      have_shape = true;
    } else {
      throw corrupt_error("npy: unknown header key");
    }
    if (!p.eat(',')) {
      p.expect('}');
      break;
    }
  }
  if (!p.done()) throw corrupt_error("npy: trailing bytes in header");
  if (!have_descr || !have_order || !have_shape) throw corrupt_error("npy: incomplete header");
  std::uint64_t numel = 1;
  for (const auto d : h.shape) {
    if (d != 0 && numel > std::numeric_limits<std::uint64_t>::max() / d)
      throw corrupt_error("npy: shape overflows");
    numel *= d;
  }
  const auto esize = element_size(h.type);
  if (numel > std::numeric_limits<std::uint64_t>::max() / esize)
    throw corrupt_error("npy: size overflows");
  h.data_offset = hstart + hlen;
  h.data_length = numel * esize;
  if (h.data_length != src.size() - h.data_offset)
    throw corrupt_error("npy: data length disagrees with the file size");
  return h;
}

layout recognise_npy(const source& src, const recognise_options& opt) {
  const auto h = parse_npy_header(src, opt.max_header_bytes);
  layout l;
  l.format = file_format::npy;
  l.file_size = src.size();
  l.note = h.fortran_order ? "fortran order" : "C order";
  tensor_info t;
  t.name = "array";
  t.type = h.type;
  t.shape = h.shape;
  t.offset = h.data_offset;
  t.length = h.data_length;
  t.compress = is_candidate(t.type, t.length, opt);
  l.tensors.push_back(std::move(t));
  finish_layout(l);
  return l;
}

layout recognise_npz(const source& src, const zip_directory& dir, const recognise_options& opt) {
  layout l;
  l.format = file_format::npz;
  l.file_size = src.size();
  std::size_t deflated = 0;
  for (const auto& e : dir.entries) {
    if (e.method != 0) {
      ++deflated;
      continue;
    }
    npy_header h;
    try {
      h = parse_npy_header(src.slice(e.data_offset, e.size), opt.max_header_bytes);
    } catch (const corrupt_error&) {
      continue;  // an object array or other unmodelled member: opaque
    }
    tensor_info t;
    t.name = e.name.substr(0, e.name.size() - 4);
    t.type = h.type;
    t.shape = h.shape;
    t.offset = e.data_offset + h.data_offset;
    t.length = h.data_length;
    t.compress = is_candidate(t.type, t.length, opt);
    if (t.length > 0) {
      const auto m = l.members.size();
      l.members.push_back({e.name, e.data_offset, e.size, e.crc});
      l.fixups.push_back({e.local_crc_field, m, e.local_crc});
      l.fixups.push_back({e.cd_crc_field, m, e.crc});
      if (e.descriptor_crc_field) l.fixups.push_back({*e.descriptor_crc_field, m, e.crc});
    }
    l.tensors.push_back(std::move(t));
  }
  if (deflated) l.note = std::to_string(deflated) + " deflated member(s) kept opaque";
  finish_layout(l);
  return l;
}

}  // namespace ckpt::format
