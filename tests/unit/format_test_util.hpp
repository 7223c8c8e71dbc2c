#pragma once
// Builders for the format unit tests: hand-made pickles, zip archives laid out like torch.save's
// (stored members, 64-byte aligned payloads, data descriptors, zip64 end records) and npy headers.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "codec/format/crc32.hpp"
#include "codec/format/layout.hpp"

namespace ckpt::format::test {

inline std::vector<std::byte> bytes_of(std::string_view s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

template <class T>
void put(std::vector<std::byte>& out, T v) {
  const auto at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}
inline void put_str(std::vector<std::byte>& out, std::string_view s) {
  const auto b = bytes_of(s);
  out.insert(out.end(), b.begin(), b.end());
}
template <class T>
T get(const std::vector<std::byte>& in, std::uint64_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  return v;
}

// Emits pickle opcodes (protocol 2 unless told otherwise).
struct pickle_writer {
  std::vector<std::byte> out;
  pickle_writer& op(char c) { return put(out, c), *this; }
  pickle_writer& raw(std::string_view s) { return put_str(out, s), *this; }
  pickle_writer& proto(int v) { return op('\x80').op(char(v)); }
  pickle_writer& str(std::string_view s) {  // BINUNICODE
    op('X');
    put(out, std::uint32_t(s.size()));
    return raw(s);
  }
  pickle_writer& short_str(std::string_view s) {  // SHORT_BINUNICODE (protocol 4)
    op('\x8c');
    put(out, std::uint8_t(s.size()));
    return raw(s);
  }
  pickle_writer& global(std::string_view m, std::string_view n) {
    return op('c').raw(m).raw("\n").raw(n).raw("\n");
  }
  pickle_writer& integer(std::int32_t v) {
    op('J');
    put(out, v);
    return *this;
  }
  pickle_writer& binput(std::uint8_t i) { return op('q').op(char(i)); }
  pickle_writer& binget(std::uint8_t i) { return op('h').op(char(i)); }
  pickle_writer& stop() { return op('.'); }
  // A tensor as torch 1.13 pickles it: _rebuild_tensor_v2(persid(storage), off, size, stride,
  // False, OrderedDict()). Globals are written in full each time (memo use is tested apart).
  pickle_writer& tensor(std::string_view key, std::string_view type, std::int32_t numel,
                        std::int32_t offset, std::vector<std::int32_t> size,
                        std::vector<std::int32_t> stride) {
    global("torch._utils", "_rebuild_tensor_v2");
    op('(');
    op('(').str("storage").global("torch", type).str(key).str("cpu").integer(numel).op('t');
    op('Q');
    integer(offset);
    op('(');
    for (auto s : size) integer(s);
    op('t');
    op('(');
    for (auto s : stride) integer(s);
    op('t');
    op('\x89');
    global("collections", "OrderedDict").op(')').op('R');
    return op('t').op('R');
  }
};

// Writes a zip the way miniz does for torch.save (or, with descriptors off, like Python's
// zipfile after np.savez's seek-back): stored members, optional 64-byte payload alignment.
struct zip_writer {
  struct member {
    std::string name;
    std::uint32_t crc;
    std::uint64_t size, lho;
    std::uint16_t flags;
  };
  std::vector<std::byte> out;
  std::vector<member> members;
  bool zero_crc = false;  // write every CRC as 0 (torch's compute_crc32=False)

  std::uint64_t add(const std::string& name, const std::vector<std::byte>& data,
                    bool descriptor = true, bool align = true) {
    const std::uint32_t crc = zero_crc ? 0 : crc32(0, data);
    const std::uint16_t flags = descriptor && !data.empty() ? 0x0808 : 0x0800;
    const std::uint64_t lho = out.size();
    std::uint16_t pad = 0;
    if (align) pad = std::uint16_t((64 - (lho + 30 + name.size() + 4) % 64) % 64);
    put(out, std::uint32_t(0x04034b50));
    put(out, std::uint16_t(0));
    put(out, flags);
    put(out, std::uint16_t(0));  // stored
    put(out, std::uint32_t(0));  // time, date
    put(out, std::uint32_t(flags & 8 ? 0 : crc));
    put(out, std::uint32_t(flags & 8 ? 0 : data.size()));
    put(out, std::uint32_t(flags & 8 ? 0 : data.size()));
    put(out, std::uint16_t(name.size()));
    put(out, std::uint16_t(align ? 4 + pad : 0));
    put_str(out, name);
    if (align) {
      put(out, std::uint16_t(0x4246));
      put(out, pad);
      out.insert(out.end(), pad, std::byte('Z'));
    }
    const std::uint64_t data_at = out.size();
    out.insert(out.end(), data.begin(), data.end());
    if (flags & 8) {
      put(out, std::uint32_t(0x08074b50));
      put(out, crc);
      put(out, std::uint32_t(data.size()));
      put(out, std::uint32_t(data.size()));
    }
    members.push_back({name, crc, data.size(), lho, flags});
    return data_at;
  }

  // Central directory, zip64 end record and locator, classic end record.
  std::vector<std::byte> finish() {
    const std::uint64_t cd_at = out.size();
    for (const auto& m : members) {
      put(out, std::uint32_t(0x02014b50));
      put(out, std::uint16_t(0));
      put(out, std::uint16_t(0));
      put(out, m.flags);
      put(out, std::uint16_t(0));
      put(out, std::uint32_t(0));
      put(out, m.crc);
      put(out, std::uint32_t(m.size));
      put(out, std::uint32_t(m.size));
      put(out, std::uint16_t(m.name.size()));
      put(out, std::uint16_t(0));
      put(out, std::uint16_t(0));
      put(out, std::uint16_t(0));
      put(out, std::uint16_t(0));
      put(out, std::uint32_t(0));
      put(out, std::uint32_t(m.lho));
      put_str(out, m.name);
    }
    const std::uint64_t cd_size = out.size() - cd_at, z_at = out.size();
    put(out, std::uint32_t(0x06064b50));
    put(out, std::uint64_t(44));
    put(out, std::uint16_t(0x031e));
    put(out, std::uint16_t(45));
    put(out, std::uint32_t(0));
    put(out, std::uint32_t(0));
    put(out, std::uint64_t(members.size()));
    put(out, std::uint64_t(members.size()));
    put(out, cd_size);
    put(out, cd_at);
    put(out, std::uint32_t(0x07064b50));
    put(out, std::uint32_t(0));
    put(out, z_at);
    put(out, std::uint32_t(1));
    put(out, std::uint32_t(0x06054b50));
    put(out, std::uint32_t(0));
    put(out, std::uint16_t(members.size()));
    put(out, std::uint16_t(members.size()));
    put(out, std::uint32_t(cd_size));
    put(out, std::uint32_t(cd_at));
    put(out, std::uint16_t(0));
    return out;
  }
};

// A .npy file of the given format version holding `data`.
inline std::vector<std::byte> npy_file(std::string_view header_dict,
                                       const std::vector<std::byte>& data, int version = 1) {
  std::string h(header_dict);
  const std::size_t pre = version == 1 ? 10 : 12;
  while ((pre + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::vector<std::byte> out = bytes_of("\x93NUMPY");
  put(out, std::uint8_t(version));
  put(out, std::uint8_t(0));
  if (version == 1)
    put(out, std::uint16_t(h.size()));
  else
    put(out, std::uint32_t(h.size()));
  put_str(out, h);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

inline std::vector<std::byte> f32_bytes(std::size_t n, float base) {
  std::vector<std::byte> out(n * 4);
  for (std::size_t i = 0; i < n; ++i) {
    const float v = base + float(i);
    std::memcpy(out.data() + 4 * i, &v, 4);
  }
  return out;
}

// What a streaming walker found against what recognise() finds in the finished file: the same
// tensors, in the same order, with every field a stream relies on.
inline void check_same_tensors(const std::vector<tensor_info>& found,
                               const std::vector<tensor_info>& recognised) {
  REQUIRE(found.size() == recognised.size());
  for (std::size_t i = 0; i < found.size(); ++i) {
    INFO("tensor " << i);
    CHECK(found[i].name == recognised[i].name);
    CHECK(found[i].offset == recognised[i].offset);
    CHECK(found[i].length == recognised[i].length);
    CHECK(found[i].type == recognised[i].type);
    CHECK(found[i].shape == recognised[i].shape);
    CHECK(found[i].compress == recognised[i].compress);
  }
}

}  // namespace ckpt::format::test
