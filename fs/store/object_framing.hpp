#pragma once
// The framing of object files, shared by the object store's reader (object_store.cpp) and its
// streaming writer (object_writer.cpp). Byte layout: docs/format.md ("Objects"). Internal to
// fs/store/.
#include <array>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <string>

#include "codec/xxh3.hpp"
#include "fs/store/object_store.hpp"
#include "fs/store/posix.hpp"

namespace ckpt::store::detail {

inline constexpr std::uint32_t header_magic = 0x424f4b43;  // "CKOB"
inline constexpr std::uint32_t footer_magic = 0x454f4b43;  // "CKOE"
inline constexpr std::uint16_t format_version = 1;
inline constexpr std::size_t header_size = 32;
inline constexpr std::size_t footer_size = 32;
inline constexpr std::size_t framing_size = header_size + footer_size;

// The object directory and the id counter, shared by an object_store and its writers.
struct object_dir {
  unique_fd dir_fd;
  std::string dir;                    // for messages
  std::atomic<object_id> next_id{1};  // 0 is never used: object_ref{} means "no object"
};

inline std::string object_name(object_id id) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016" PRIx64 ".obj", id);
  return buf;
}

inline std::string hex_id(object_id id) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, id);
  return buf;
}

inline std::array<std::byte, header_size> make_header(object_id id, std::uint64_t size) {
  std::array<std::byte, header_size> h{};
  put_u32(&h[0], header_magic);
  put_u16(&h[4], format_version);
  put_u16(&h[6], header_size);
  put_u64(&h[8], id);
  put_u64(&h[16], size);
  put_u64(&h[24], XXH3_64bits(h.data(), 24));
  return h;
}

inline std::array<std::byte, footer_size> make_footer(object_id id, std::uint64_t size,
                                                      std::uint64_t checksum) {
  std::array<std::byte, footer_size> f{};
  put_u64(&f[0], size);
  put_u64(&f[8], checksum);
  put_u64(&f[16], id);
  put_u32(&f[24], static_cast<std::uint32_t>(XXH3_64bits(f.data(), 24)));
  put_u32(&f[28], footer_magic);
  return f;
}

// Renames `from` to `to` in `dfd` unless `to` exists (returns EEXIST then), else 0 or an errno.
// renameat2(RENAME_NOREPLACE) where the filesystem has it (ext4, xfs, btrfs, tmpfs); else
// link + unlink, which also fails atomically on an existing name; else (no hard links, e.g. some
// FUSE or SMB mounts) a check followed by a plain rename.
int rename_noreplace(int dfd, const std::string& from, const std::string& to);

}  // namespace ckpt::store::detail
