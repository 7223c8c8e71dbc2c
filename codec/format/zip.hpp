#pragma once
// A read-only walker of a zip archive's directory: end records (classic and zip64), the central
// directory, each member's local header and data descriptor. It reads only these structures,
// never member data, and checks everything it reads for consistency (names, CRC copies, ranges,
// no overlap) so that the torch and npz recognisers can trust the offsets it returns.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "codec/format/source.hpp"

namespace ckpt::format {

struct zip_entry {
  std::string name;
  std::uint16_t flags = 0;
  std::uint16_t method = 0;  // 0 stored, 8 deflated, ...
  std::uint32_t crc = 0;     // from the central directory
  std::uint64_t compressed_size = 0;
  std::uint64_t size = 0;
  std::uint64_t local_header_offset = 0;
  std::uint64_t data_offset = 0;  // first byte of the (compressed) data
  // Absolute offsets and values of every copy of the CRC in the file.
  std::uint64_t cd_crc_field = 0;
  std::uint64_t local_crc_field = 0;
  std::uint32_t local_crc = 0;
  std::optional<std::uint64_t> descriptor_crc_field;
};

struct zip_directory {
  std::vector<zip_entry> entries;  // in central-directory order
  std::uint64_t cd_offset = 0;
  std::uint64_t cd_size = 0;
};

struct zip_limits {
  std::uint64_t max_entries = 1u << 20;
  std::uint64_t max_cd_bytes = 256u << 20;
  // The end record is searched for in the last 22 + max_comment bytes (a zip comment is at most
  // 64 KiB; archives known to have none need not read that much).
  std::uint32_t max_comment = 0xffff;
};

// True if the file starts with a local file header signature.
bool looks_like_zip(const source& src);

// Throws corrupt_error on anything malformed, inconsistent or beyond the limits.
zip_directory read_zip_directory(const source& src, const zip_limits& limits = {});

}  // namespace ckpt::format
