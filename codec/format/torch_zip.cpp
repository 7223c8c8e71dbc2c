// torch.save zip archives (PyTorch >= 1.6). The central directory gives every record's offset;
// data.pkl, scanned without execution, gives each data/<key> record's storage type and element
// count. A record whose size disagrees with its storage, or that is not stored uncompressed, stays
// opaque. Record order is never assumed: 1.13 (data.pkl, data/<k> lexicographic, version), 2.x
// (byteorder, .data/serialization_id) and newest (.format_version, .storage_alignment) all work
// because only names are matched.
#include <string_view>
#include <unordered_map>

#include "codec/error.hpp"
#include "codec/format/npy.hpp"
#include "codec/format/recognise.hpp"

namespace ckpt::format {
namespace {

struct storage_type {
  std::string_view name;
  element_type type;
};

// Storage classes (torch/storage.py, torch/__init__.py); UntypedStorage counts bytes.
constexpr storage_type storage_types[] = {
    {"FloatStorage", element_type::f32},
    {"HalfStorage", element_type::f16},
    {"BFloat16Storage", element_type::bf16},
    {"DoubleStorage", element_type::f64},
    {"LongStorage", element_type::i64},
    {"IntStorage", element_type::i32},
    {"ShortStorage", element_type::i16},
    {"CharStorage", element_type::i8},
    {"ByteStorage", element_type::u8},
    {"BoolStorage", element_type::boolean},
    {"ComplexFloatStorage", element_type::c64},
    {"ComplexDoubleStorage", element_type::c128},
    {"UInt16Storage", element_type::u16},
    {"UInt32Storage", element_type::u32},
    {"UInt64Storage", element_type::u64},
    {"UntypedStorage", element_type::u8},
    {"QInt8Storage", element_type::i8},
    {"QUInt8Storage", element_type::u8},
    {"QInt32Storage", element_type::i32},
    {"QUInt4x2Storage", element_type::u8},
    {"QUInt2x4Storage", element_type::u8},
    {"Float8_e5m2Storage", element_type::other},
    {"Float8_e4m3fnStorage", element_type::other},
};

std::string entry_prefix(const zip_directory& dir) {
  const auto& first = dir.entries.front().name;
  const auto slash = first.find('/');
  if (slash == std::string::npos) throw corrupt_error("torch zip: no archive prefix");
  return first.substr(0, slash + 1);
}

void add_member_fixups(layout& l, const zip_entry& e) {
  const auto m = l.members.size();
  l.members.push_back({e.name, e.data_offset, e.compressed_size, e.crc});
  l.fixups.push_back({e.local_crc_field, m, e.local_crc});
  l.fixups.push_back({e.cd_crc_field, m, e.crc});
  if (e.descriptor_crc_field) l.fixups.push_back({*e.descriptor_crc_field, m, e.crc});
}

layout recognise_torch(const source& src, const zip_directory& dir, const std::string& prefix,
                       const zip_entry& pkl, const recognise_options& opt) {
  if (pkl.method != 0) throw corrupt_error("torch zip: data.pkl is compressed");
  if (pkl.size > opt.pickle.max_bytes) throw corrupt_error("torch zip: data.pkl too large");
  const auto pickle = src.read(pkl.data_offset, pkl.size);
  const auto scan = scan_torch_pickle(pickle, opt.pickle);

  std::unordered_map<std::string_view, std::size_t> by_key;
  for (std::size_t i = 0; i < scan.storages.size(); ++i) by_key.emplace(scan.storages[i].key, i);

  layout l;
  l.format = file_format::torch_zip;
  l.file_size = src.size();
  l.note = "pickle protocol " + std::to_string(scan.protocol) + ", prefix " + prefix;
  const std::string data_dir = prefix + "data/";
  for (const auto& e : dir.entries) {
    if (e.name == prefix + "byteorder") {
      if (e.method != 0 || e.size > 16) throw corrupt_error("torch zip: odd byteorder record");
      const auto b = src.read(e.data_offset, e.size);
      if (std::string_view(reinterpret_cast<const char*>(b.data()), b.size()) != "little")
        throw corrupt_error("torch zip: big-endian payloads are kept opaque");
      continue;
    }
    if (!e.name.starts_with(data_dir)) continue;
    const auto it = by_key.find(std::string_view(e.name).substr(data_dir.size()));
    if (it == by_key.end()) continue;  // a record data.pkl does not name: opaque
    const auto& s = scan.storages[it->second];
    const auto type = storage_element(s.type_name);
    if (!type || e.method != 0) continue;
    const auto esize = element_size(*type);
    if (s.numel > e.size / esize || s.numel * esize != e.size) continue;  // disagrees: opaque
    tensor_info t;
    t.name = s.names.empty() ? e.name.substr(prefix.size()) : s.names.front();
    if (s.names.size() > 1) t.aliases.assign(s.names.begin() + 1, s.names.end());
    t.type = *type;
    t.shape = s.shape.empty() ? std::vector<std::uint64_t>{s.numel} : s.shape;
    t.offset = e.data_offset;
    t.length = e.size;
    t.compress = is_candidate(t.type, t.length, opt);
    if (t.length > 0) add_member_fixups(l, e);
    l.tensors.push_back(std::move(t));
  }
  finish_layout(l);
  return l;
}

}  // namespace

std::optional<element_type> storage_element(std::string_view type_name) {
  for (const auto& s : storage_types)
    if (s.name == type_name) return s.type;
  return std::nullopt;
}

layout recognise_zip(const source& src, const recognise_options& opt) {
  const auto dir = read_zip_directory(src, opt.zip);
  if (dir.entries.empty()) throw corrupt_error("zip: empty archive");
  const auto slash = dir.entries.front().name.find('/');
  if (slash != std::string::npos) {
    const auto prefix = entry_prefix(dir);
    const zip_entry* pkl = nullptr;
    bool all_prefixed = true;
    for (const auto& e : dir.entries) {
      if (!e.name.starts_with(prefix)) all_prefixed = false;
      if (e.name == prefix + "data.pkl") pkl = &e;
    }
    if (pkl && all_prefixed) return recognise_torch(src, dir, prefix, *pkl, opt);
  }
  bool all_npy = true;
  for (const auto& e : dir.entries) all_npy = all_npy && e.name.ends_with(".npy");
  if (all_npy) return recognise_npz(src, dir, opt);
  throw corrupt_error("zip archive that is neither torch.save nor npz");
}

}  // namespace ckpt::format
