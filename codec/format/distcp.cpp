// torch.distributed.checkpoint shards (`__R_F.distcp`, FileSystemWriter): the rank's byte items,
// raw, then every tensor as its own complete torch.save archive, back to back, each archive's
// offsets relative to its own start (reference/scale.md §2). Recognised as a sequence of torch zip
// archives found by walking headers: a local header whose name ends in /data.pkl starts one; its
// local records, central directory and end records say where it ends, and the next one starts
// there. Each archive is recognised as a torch zip in its own slice and its layout shifted into
// the file; what lies before, between and after the archives (byte items, anything else) is
// opaque. No pickle is executed and nothing but headers is read: the first archive is searched
// for in the first scan_bytes of the file, a gap after an archive in the next scan_bytes, and a
// file with its archives back to back reads a few hundred bytes per archive.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>

#include "codec/error.hpp"
#include "codec/format/distcp_archives.hpp"
#include "codec/format/recognise.hpp"
#include "codec/format/zip_records.hpp"

namespace ckpt::format {
namespace distcp {

using namespace zip_records;
namespace {
constexpr std::uint64_t scan_bytes = 1u << 20;  // searched for an archive's start
constexpr std::string_view pkl_suffix = "/data.pkl";
}  // namespace

bool archive_starts_at(const source& src, std::uint64_t at) {
  const auto h = read_some(src, at, 30 + 256);
  if (h.size() < 30 || load<std::uint32_t>(h.data()) != sig_local) return false;
  const auto name_len = load<std::uint16_t>(h.data() + 26);
  if (name_len <= pkl_suffix.size() || 30 + std::size_t(name_len) > h.size()) return false;
  const std::string_view name(reinterpret_cast<const char*>(h.data() + 30), name_len);
  return name.ends_with(pkl_suffix) &&
         name.substr(0, name.size() - pkl_suffix.size()).find('/') == std::string_view::npos;
}

std::optional<std::uint64_t> find_archive(const source& src, std::uint64_t from) {
  const std::uint64_t end = std::min(src.size(), from + scan_bytes);
  // Windows grow 4x from 4 KiB to 1 MiB: byte items of a few KiB cost a few KiB of reading.
  std::uint64_t window = 4096;
  for (std::uint64_t at = from; at < end;
       at += window - 3, window = std::min(window * 4, std::uint64_t(1) << 20)) {
    const auto b = read_some(src, at, std::min(window, end - at));
    if (b.size() < 4) break;
    for (std::size_t i = 0; i + 4 <= b.size(); ++i)
      if (load<std::uint32_t>(b.data() + i) == sig_local && archive_starts_at(src, at + i))
        return at + i;
    if (b.size() < window) break;
  }
  return std::nullopt;
}

// archive_end walks the local records, then the central directory and end records. torch's
// writer streams: every record is followed by a data descriptor and its local header has no
// sizes. The sizes come from elsewhere: data.pkl ends at the descriptor found after it (its
// pickle names every storage with its element count), a data/<key> record is its storage's
// bytes, and the other records (version, byteorder, ...) are small. Every size is checked
// against the descriptor that follows.
std::uint64_t archive_end(const source& src, std::uint64_t at, const recognise_options& opt) {
  std::uint64_t p = at;
  std::uint64_t entries = 0;
  std::unordered_map<std::string, std::uint64_t> storage_bytes;  // "data/<key>" -> bytes
  auto header = [&](std::size_t n) {
    auto h = read_some(src, p, n);
    if (h.size() < 4) throw corrupt_error("distcp: archive cut short");
    return h;
  };
  auto descriptor_at = [&](std::uint64_t data, std::uint64_t size) {
    return zip_records::descriptor_at(src, data, size);
  };
  auto search_descriptor = [&](std::uint64_t data, std::uint64_t max_window) {
    return zip_records::search_descriptor(src, data, max_window);
  };
  std::string prefix;
  for (;;) {
    const auto h = header(30 + 512);
    const auto sig = load<std::uint32_t>(h.data());
    if (sig == sig_central) break;
    if (sig != sig_local || h.size() < 30) throw corrupt_error("distcp: expected a local header");
    if (++entries > opt.zip.max_entries) throw corrupt_error("distcp: too many records");
    const auto flags = load<std::uint16_t>(h.data() + 6);
    const auto name_len = load<std::uint16_t>(h.data() + 26);
    const auto extra_len = load<std::uint16_t>(h.data() + 28);
    if (30 + std::size_t(name_len) > h.size()) throw corrupt_error("distcp: name too long");
    const std::string name(reinterpret_cast<const char*>(h.data() + 30), name_len);
    const std::uint64_t data = p + 30 + name_len + extra_len;
    std::uint64_t size = load<std::uint32_t>(h.data() + 18), desc = 0;
    if (entries == 1) {
      if (!name.ends_with(pkl_suffix)) throw corrupt_error("distcp: data.pkl is not first");
      prefix = name.substr(0, name.size() - pkl_suffix.size() + 1);  // "archive/"
    } else if (!name.starts_with(prefix)) {
      throw corrupt_error("distcp: a record outside the archive's prefix");
    }
    if (!(flags & 0x08)) {
      if (size == 0xffffffffu) throw corrupt_error("distcp: zip64 sizes in a local header");
    } else if (entries == 1) {
      std::tie(size, desc) = search_descriptor(data, opt.pickle.max_bytes);
      const auto pickle = src.read(data, size);
      for (const auto& st : scan_torch_pickle(pickle, opt.pickle).storages) {
        const auto type = storage_element(st.type_name);
        if (type) storage_bytes["data/" + st.key] = st.numel * element_size(*type);
      }
    } else if (auto it = storage_bytes.find(name.substr(prefix.size()));
               it != storage_bytes.end()) {
      size = it->second;
      desc = descriptor_at(data, size);
      if (!desc) throw corrupt_error("distcp: a storage record's size disagrees with data.pkl");
    } else {
      std::tie(size, desc) = search_descriptor(data, 64u << 10);  // version, byteorder, ...
    }
    const std::uint64_t next = data + size + desc;
    if (next < p || next > src.size()) throw corrupt_error("distcp: a record runs past the end");
    p = next;
  }
  // Central directory.
  std::uint64_t central = 0;
  for (;;) {
    const auto h = header(46);
    if (load<std::uint32_t>(h.data()) != sig_central) break;
    if (h.size() < 46 || ++central > entries) throw corrupt_error("distcp: bad central directory");
    p += 46 + std::uint64_t(load<std::uint16_t>(h.data() + 28)) +
         load<std::uint16_t>(h.data() + 30) + load<std::uint16_t>(h.data() + 32);
  }
  if (central != entries) throw corrupt_error("distcp: central directory and records disagree");
  // End records: zip64 end record and locator (optional), then the classic end record.
  auto h = header(56);
  if (load<std::uint32_t>(h.data()) == sig_zip64_eocd) {
    if (h.size() < 12) throw corrupt_error("distcp: zip64 end record cut short");
    const auto rest = load<std::uint64_t>(h.data() + 4);
    if (rest > (1u << 20)) throw corrupt_error("distcp: zip64 end record too large");
    p += 12 + rest;
    h = header(20);
    if (load<std::uint32_t>(h.data()) != sig_zip64_locator || h.size() < 20)
      throw corrupt_error("distcp: zip64 locator missing");
    p += 20;
    h = header(22);
  }
  if (load<std::uint32_t>(h.data()) != sig_eocd || h.size() < 22)
    throw corrupt_error("distcp: end record missing");
  p += 22 + std::uint64_t(load<std::uint16_t>(h.data() + 20));
  if (p > src.size()) throw corrupt_error("distcp: end record runs past the end");
  return p;
}

std::string item_name(std::size_t k, std::string_view name) {
  std::string out = "item";
  out.append(std::to_string(k)).append(1, '/').append(name);
  return out;
}

}  // namespace distcp

namespace {

using namespace distcp;

// Moves one archive's layout (recognised in its slice) to file offsets `at` on, naming its
// tensors by item_name (a bare tensor's archive names it "data/0").
void append_archive(layout& out, layout&& a, std::uint64_t at, std::size_t k) {
  const std::size_t member_base = out.members.size();
  for (auto& t : a.tensors) {
    t.offset += at;
    t.name = item_name(k, t.name);
    for (auto& alias : t.aliases) alias = item_name(k, alias);
    out.tensors.push_back(std::move(t));
  }
  for (auto& m : a.members) {
    m.data_offset += at;
    out.members.push_back(std::move(m));
  }
  for (auto& f : a.fixups) {
    f.field_offset += at;
    f.member += member_base;
    out.fixups.push_back(f);
  }
}

}  // namespace

std::optional<layout> recognise_archive_sequence(const source& src, const recognise_options& opt) {
  const std::uint64_t size = src.size();
  layout out;
  out.format = file_format::distcp;
  out.file_size = size;
  std::size_t archives = 0, torch_archives = 0;
  std::uint64_t leading = 0;  // bytes before the first archive (the byte items)
  std::optional<std::uint64_t> at = archive_starts_at(src, 0) ? 0 : find_archive(src, 0);
  if (at) leading = *at;
  std::string stopped;
  while (at && *at < size) {
    if (++archives > max_archives) {
      stopped = "too many archives";
      break;
    }
    std::uint64_t end = 0;
    try {
      end = archive_end(src, *at, opt);
    } catch (const corrupt_error& e) {
      stopped = e.what();  // the rest of the file is opaque
      break;
    }
    if (*at == 0 && end == size) return std::nullopt;  // one archive: an ordinary torch.save
    try {
      // archive_end found its end record where the slice ends (torch writes no comment): the
      // directory reader need not read a 64 KiB tail window looking for it.
      recognise_options sub = opt;
      sub.zip.max_comment = 0;
      layout a = recognise_zip(src.slice(*at, end - *at), sub);
      if (a.format == file_format::torch_zip) {
        append_archive(out, std::move(a), *at, archives - 1);
        ++torch_archives;
      }
    } catch (const corrupt_error&) {
      // Not a torch archive after all: its bytes stay opaque.
    }
    if (end == size) break;
    at = archive_starts_at(src, end) ? std::optional(end) : find_archive(src, end);
  }
  if (torch_archives == 0) return std::nullopt;
  out.note = std::to_string(torch_archives) + " torch archives after " + std::to_string(leading) +
             " bytes of byte items" + (stopped.empty() ? "" : "; then opaque: " + stopped);
  finish_layout(out);
  return out;
}

}  // namespace ckpt::format
