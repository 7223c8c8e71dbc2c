#include "codec/format/zip.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#include "codec/byte_io.hpp"
#include "codec/error.hpp"

namespace ckpt::format {
namespace {

using codec::byte_reader;

constexpr std::uint32_t sig_local = 0x04034b50;
constexpr std::uint32_t sig_central = 0x02014b50;
constexpr std::uint32_t sig_eocd = 0x06054b50;
constexpr std::uint32_t sig_zip64_eocd = 0x06064b50;
constexpr std::uint32_t sig_zip64_locator = 0x07064b50;
constexpr std::uint32_t sig_descriptor = 0x08074b50;
constexpr std::size_t eocd_size = 22;
constexpr std::size_t locator_size = 20;
constexpr std::size_t zip64_eocd_size = 56;
constexpr std::size_t central_size = 46;
constexpr std::size_t local_size = 30;

std::uint32_t load_u32(const std::byte* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

struct end_records {
  std::uint64_t entries = 0;
  std::uint64_t cd_size = 0;
  std::uint64_t cd_offset = 0;
  std::uint64_t cd_limit = 0;  // the central directory must end at or before this offset
};

end_records read_end_records(const source& src, std::uint32_t max_comment) {
  const std::uint64_t size = src.size();
  if (size < eocd_size) throw corrupt_error("zip: too short for an end record");
  // The classic end record is the last 22 bytes plus an optional comment of up to 64 KiB.
  const std::uint64_t window =
      std::min<std::uint64_t>(size, eocd_size + std::min<std::uint32_t>(max_comment, 0xffff));
  const auto tail = src.read(size - window, window);
  std::optional<std::uint64_t> eocd_at;
  for (std::uint64_t i = window - eocd_size + 1; i-- > 0;) {
    if (load_u32(tail.data() + i) != sig_eocd) continue;
    std::uint16_t comment;
    std::memcpy(&comment, tail.data() + i + 20, 2);
    if (i + eocd_size + comment == window) {
      eocd_at = size - window + i;
      break;
    }
  }
  if (!eocd_at) throw corrupt_error("zip: no end-of-central-directory record");
  byte_reader r(std::span<const std::byte>(tail).subspan(*eocd_at - (size - window), eocd_size));
  r.get<std::uint32_t>();
  const auto disk = r.get<std::uint16_t>();
  const auto cd_disk = r.get<std::uint16_t>();
  const auto entries_here = r.get<std::uint16_t>();
  const auto entries = r.get<std::uint16_t>();
  const auto cd_size = r.get<std::uint32_t>();
  const auto cd_offset = r.get<std::uint32_t>();
  if (disk != 0 || cd_disk != 0 || entries_here != entries)
    throw corrupt_error("zip: multi-disk archives are not supported");
  end_records e{entries, cd_size, cd_offset, *eocd_at};

  if (*eocd_at >= locator_size) {
    const auto loc = src.read(*eocd_at - locator_size, locator_size);
    if (load_u32(loc.data()) == sig_zip64_locator) {
      byte_reader lr(loc);
      lr.get<std::uint32_t>();
      const auto z_disk = lr.get<std::uint32_t>();
      const auto z_at = lr.get<std::uint64_t>();
      const auto disks = lr.get<std::uint32_t>();
      if (z_disk != 0 || disks > 1) throw corrupt_error("zip64: multi-disk archive");
      if (z_at > *eocd_at - locator_size || *eocd_at - locator_size - z_at < zip64_eocd_size)
        throw corrupt_error("zip64: end record offset out of range");
      const auto rec = src.read(z_at, zip64_eocd_size);
      byte_reader zr(rec);
      if (zr.get<std::uint32_t>() != sig_zip64_eocd) throw corrupt_error("zip64: bad end record");
      zr.get<std::uint64_t>();  // record size
      zr.get<std::uint16_t>();  // made by
      zr.get<std::uint16_t>();  // needed
      const auto d = zr.get<std::uint32_t>();
      const auto cdd = zr.get<std::uint32_t>();
      const auto n_here = zr.get<std::uint64_t>();
      const auto n = zr.get<std::uint64_t>();
      if (d != 0 || cdd != 0 || n_here != n) throw corrupt_error("zip64: multi-disk archive");
      e.entries = n;
      e.cd_size = zr.get<std::uint64_t>();
      e.cd_offset = zr.get<std::uint64_t>();
      e.cd_limit = z_at;
    }
  }
  if (e.cd_offset > e.cd_limit || e.cd_size > e.cd_limit - e.cd_offset)
    throw corrupt_error("zip: central directory out of range");
  return e;
}

// Applies a zip64 extended-information extra field (id 1) to the values that overflowed.
void apply_zip64_extra(std::span<const std::byte> extra, std::uint64_t& usize, std::uint64_t& csize,
                       std::uint64_t& lho, bool need_u, bool need_c, bool need_o) {
  byte_reader r(extra);
  while (r.remaining() >= 4) {
    const auto id = r.get<std::uint16_t>();
    const auto len = r.get<std::uint16_t>();
    const auto body = r.get_bytes(len);
    if (id != 1) continue;
    byte_reader b(body);
    if (need_u) usize = b.get<std::uint64_t>(), need_u = false;
    if (need_c) csize = b.get<std::uint64_t>(), need_c = false;
    if (need_o) lho = b.get<std::uint64_t>(), need_o = false;
    break;
  }
  if (need_u || need_c || need_o) throw corrupt_error("zip64: missing extended information");
}

}  // namespace

bool looks_like_zip(const source& src) {
  if (src.size() < 4) return false;
  std::array<std::byte, 4> m{};
  src.read(0, m);
  return load_u32(m.data()) == sig_local;
}

zip_directory read_zip_directory(const source& src, const zip_limits& limits) {
  const auto end = read_end_records(src, limits.max_comment);
  if (end.entries > limits.max_entries) throw corrupt_error("zip: too many entries");
  if (end.cd_size > limits.max_cd_bytes) throw corrupt_error("zip: central directory too large");
  if (end.entries * central_size > end.cd_size)
    throw corrupt_error("zip: central directory too small for its entries");
  const auto cd = src.read(end.cd_offset, end.cd_size);
  zip_directory dir;
  dir.cd_offset = end.cd_offset;
  dir.cd_size = end.cd_size;
  dir.entries.reserve(end.entries);
  byte_reader r(cd);
  for (std::uint64_t i = 0; i < end.entries; ++i) {
    const std::uint64_t entry_at = end.cd_offset + r.position();
    if (r.get<std::uint32_t>() != sig_central) throw corrupt_error("zip: bad central entry");
    zip_entry e;
    r.get<std::uint16_t>();  // made by
    r.get<std::uint16_t>();  // needed
    e.flags = r.get<std::uint16_t>();
    e.method = r.get<std::uint16_t>();
    r.get<std::uint32_t>();  // time, date
    e.cd_crc_field = entry_at + 16;
    e.crc = r.get<std::uint32_t>();
    const auto csize32 = r.get<std::uint32_t>();
    const auto usize32 = r.get<std::uint32_t>();
    const auto nlen = r.get<std::uint16_t>();
    const auto xlen = r.get<std::uint16_t>();
    const auto clen = r.get<std::uint16_t>();
    const auto disk = r.get<std::uint16_t>();
    r.get<std::uint16_t>();  // internal attributes
    r.get<std::uint32_t>();  // external attributes
    const auto lho32 = r.get<std::uint32_t>();
    const auto name = r.get_bytes(nlen);
    const auto extra = r.get_bytes(xlen);
    r.get_bytes(clen);
    e.name.assign(reinterpret_cast<const char*>(name.data()), name.size());
    e.compressed_size = csize32;
    e.size = usize32;
    e.local_header_offset = lho32;
    const bool need_u = usize32 == 0xffffffffu, need_c = csize32 == 0xffffffffu,
               need_o = lho32 == 0xffffffffu;
    if (need_u || need_c || need_o || disk == 0xffff)
      apply_zip64_extra(extra, e.size, e.compressed_size, e.local_header_offset, need_u, need_c,
                        need_o);
    else if (disk != 0)
      throw corrupt_error("zip: member on another disk");
    if (e.flags & 1) throw corrupt_error("zip: encrypted member");
    if (e.method == 0 && e.compressed_size != e.size)
      throw corrupt_error("zip: stored member with different sizes");
    dir.entries.push_back(std::move(e));
  }

  // Local headers: names must match, data and descriptors must fit before the next header.
  std::vector<std::size_t> order(dir.entries.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return dir.entries[a].local_header_offset < dir.entries[b].local_header_offset;
  });
  std::uint64_t at = 0;  // end of the previous member (header, data, descriptor)
  for (const auto idx : order) {
    auto& e = dir.entries[idx];
    if (e.local_header_offset < at) throw corrupt_error("zip: members overlap");
    if (e.local_header_offset > end.cd_offset || end.cd_offset - e.local_header_offset < local_size)
      throw corrupt_error("zip: local header out of range");
    const auto hdr = src.read(e.local_header_offset, local_size);
    byte_reader h(hdr);
    if (h.get<std::uint32_t>() != sig_local) throw corrupt_error("zip: bad local header");
    h.get<std::uint16_t>();  // needed
    h.get<std::uint16_t>();  // flags
    const auto method = h.get<std::uint16_t>();
    h.get<std::uint32_t>();  // time, date
    e.local_crc_field = e.local_header_offset + 14;
    e.local_crc = h.get<std::uint32_t>();
    h.get<std::uint32_t>();
    h.get<std::uint32_t>();
    const auto nlen = h.get<std::uint16_t>();
    const auto xlen = h.get<std::uint16_t>();
    if (method != e.method) throw corrupt_error("zip: local and central methods differ");
    const std::uint64_t name_at = e.local_header_offset + local_size;
    if (nlen != e.name.size() || name_at + nlen + xlen > end.cd_offset)
      throw corrupt_error("zip: local header name or extra out of range");
    const auto lname = src.read(name_at, nlen);
    if (std::memcmp(lname.data(), e.name.data(), nlen) != 0)
      throw corrupt_error("zip: local and central names differ");
    e.data_offset = name_at + nlen + xlen;
    if (e.compressed_size > end.cd_offset - e.data_offset)
      throw corrupt_error("zip: member data out of range");
    at = e.data_offset + e.compressed_size;
    if ((e.flags & 8) != 0) {
      // Data descriptor: optional signature, CRC, then 4- or 8-byte sizes.
      const auto avail = std::min<std::uint64_t>(24, end.cd_offset - at);
      if (avail < 12) throw corrupt_error("zip: data descriptor out of range");
      const auto d = src.read(at, avail);
      const bool signed_desc = load_u32(d.data()) == sig_descriptor && avail >= 16;
      const std::uint64_t crc_at = at + (signed_desc ? 4 : 0);
      if (load_u32(d.data() + (signed_desc ? 4 : 0)) != e.crc)
        throw corrupt_error("zip: data descriptor CRC disagrees with central directory");
      e.descriptor_crc_field = crc_at;
      at = crc_at + 12;  // at least CRC + two 4-byte sizes
    } else if (e.local_crc != e.crc) {
      throw corrupt_error("zip: local CRC disagrees with central directory");
    }
  }
  if (at > end.cd_offset) throw corrupt_error("zip: member runs into the central directory");
  return dir;
}

}  // namespace ckpt::format
