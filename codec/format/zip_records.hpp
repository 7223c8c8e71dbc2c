#pragma once
// Walking a zip archive record by record from its start, as a streaming writer produced it
// (torch's: every record's local header without sizes, a data descriptor after its data). Shared
// by the recognisers that cannot start from the central directory: a DCP shard's archive
// sequence (distcp.cpp) and an archive still being written (torch_stream.cpp). Internal to
// codec/format.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "codec/error.hpp"
#include "codec/format/source.hpp"

namespace ckpt::format::zip_records {

inline constexpr std::uint32_t sig_local = 0x04034b50;
inline constexpr std::uint32_t sig_central = 0x02014b50;
inline constexpr std::uint32_t sig_eocd = 0x06054b50;
inline constexpr std::uint32_t sig_zip64_eocd = 0x06064b50;
inline constexpr std::uint32_t sig_zip64_locator = 0x07064b50;
inline constexpr std::uint32_t sig_descriptor = 0x08074b50;
inline constexpr std::uint16_t flag_descriptor = 0x08;

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Reads what fits of [at, at + n) (less near the end of the source).
inline std::vector<std::byte> read_some(const source& src, std::uint64_t at, std::uint64_t n) {
  if (at >= src.size()) return {};
  return src.read(at, std::min(n, src.size() - at));
}

// The length of the data descriptor right after `size` bytes of data at `data` (16, or 24 with
// zip64 sizes), or 0 if none that names `size` is there.
inline std::uint64_t descriptor_at(const source& src, std::uint64_t data, std::uint64_t size) {
  const auto d = read_some(src, data + size, 24);
  if (d.size() < 16 || load<std::uint32_t>(d.data()) != sig_descriptor) return 0;
  if (d.size() >= 24 && load<std::uint64_t>(d.data() + 8) == size &&
      load<std::uint64_t>(d.data() + 16) == size)
    return 24;
  if (load<std::uint32_t>(d.data() + 8) == size && load<std::uint32_t>(d.data() + 12) == size)
    return 16;
  return 0;
}

// The first descriptor within `max_window` bytes after `data` whose sizes name that distance:
// {data size, descriptor length}. Windows grow 4x from 4 KiB: a small record costs a small read.
// Throws corrupt_error when there is none.
inline std::pair<std::uint64_t, std::uint64_t> search_descriptor(const source& src,
                                                                 std::uint64_t data,
                                                                 std::uint64_t max_window) {
  std::size_t from = 0;
  for (std::uint64_t window = 4096;; window *= 4) {
    window = std::min(window, max_window);
    const auto b = read_some(src, data, window + 24);
    for (std::size_t i = from; i + 16 <= b.size(); ++i) {
      if (load<std::uint32_t>(b.data() + i) != sig_descriptor) continue;
      if (const auto n = descriptor_at(src, data, i)) return {i, n};
    }
    if (window >= max_window || b.size() < window + 24)
      throw corrupt_error("zip: no data descriptor after a record");
    from = b.size() >= 16 ? b.size() - 15 : 0;
  }
}

}  // namespace ckpt::format::zip_records
