#pragma once
// Content objects: the object payload of one stored version (docs/format.md, "Content objects").
//
// Format 4, written since 2026-11-28 (format 3 with a dictionary):
//   prefix (24: magic "CKCV", u32 version 4, 16 reserved zero bytes) | data area |
//   metadata (one zstd frame of the CBOR, its content size recorded, compressed with the
//   dictionary as zstd's prefix) | trailer (40: u64 length of the zstd frame, u64 XXH3-64 of
//   it, u64 length of the dictionary, u64 XXH3-64 of the dictionary, u32 0, u32 magic "CKCM")
// The dictionary is empty (length 0) or a delta's base's inline exact bytes
// (version_meta::inline_exact): the zip records and pickle of the file before, which the
// metadata repeats nearly byte for byte. Those bytes are part of what the base reads as, so no
// rewrite of the base (rekey, rotation) changes them. A small model's delta metadata took
// 1122 bytes alone (docs/benchmarks.md, "A delta's metadata against its base's bytes").
// Format 3 (written before; read, never written unless asked): format 4 without the dictionary,
// its trailer 24 bytes (u64 length, u64 XXH3-64, u32 0, u32 magic).
// The metadata names every tensor and zip member of the file and is nearly the same from one
// version to the next; uncompressed it was 5-15% of a small model's delta (docs/benchmarks.md).
// Format 2 (read, never written unless asked): format 3 with the CBOR as it is.
// The data area (codec frames and exact regions, each block with its own checksum) goes first, as
// it is encoded; the metadata that indexes it follows once it is complete, so neither the
// version's encoding nor its metadata's offsets have to be known up front.
// Format 1 (stores written before; read, never written):
//   prefix (24: magic, u32 version 1, u64 metadata length, u64 XXH3-64 of it) | metadata | data.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "fs/content/version_meta.hpp"
#include "fs/store/object_store.hpp"

namespace ckpt::fs {

inline constexpr std::uint32_t content_magic = 0x5643'4b43;          // "CKCV"
inline constexpr std::uint32_t content_trailer_magic = 0x4d43'4b43;  // "CKCM"
inline constexpr std::uint32_t content_format_version = 4;
inline constexpr std::size_t content_prefix_size = 24;
inline constexpr std::size_t content_trailer_size = 24;     // formats 2 and 3
inline constexpr std::size_t content_trailer_v4_size = 40;  // format 4

// Streams one version's content object into the object store.
class content_object_writer {
 public:
  // Starts the object (writes the prefix). Throws io_error. `format` 1 and 2 exist for tests
  // only (objects as older stores have them); format 1's data area is held in memory until
  // finish.
  explicit content_object_writer(store::object_store& objects,
                                 std::uint32_t format = content_format_version);

  // Offset in the data area of the next appended byte (what version_meta records as data_at).
  std::uint64_t data_size() const noexcept;
  // Appends data-area bytes (copied). Throws io_error (ENOSPC, EIO).
  void append(std::span<const std::byte> bytes);
  // Appends the metadata and the trailer and commits the object (durable when it returns).
  // `dictionary` (format 4 only; ignored before): the base's inline exact bytes, which a reader
  // must give read_content_header again.
  store::object_ref finish(const version_meta& meta, std::span<const std::byte> dictionary = {});

 private:
  store::object_writer writer_;
  std::uint32_t format_;
  std::vector<std::byte> v1_data_;  // format 1 only
};

// The largest metadata a reader inflates: a 100 GB shard's block index is about 1 MiB of CBOR;
// a damaged frame that claims more is refused before anything is allocated.
inline constexpr std::uint64_t max_metadata_bytes = std::uint64_t(1) << 30;

// Formats 3 and 4's metadata: one zstd frame of the CBOR with its content size, compressed with
// `dictionary` as zstd's prefix where it is not empty. inflate_metadata throws corrupt_error
// (naming `what`) for a frame without a content size, one that claims more than `max_bytes`,
// or one that does not decompress to exactly that size with `dictionary`.
std::vector<std::byte> compress_metadata(std::span<const std::byte> cbor,
                                         std::span<const std::byte> dictionary = {});
std::vector<std::byte> inflate_metadata(std::span<const std::byte> frame, const std::string& what,
                                        std::uint64_t max_bytes = max_metadata_bytes,
                                        std::span<const std::byte> dictionary = {});

// A content object's metadata and where its data area starts in the payload.
struct content_header {
  std::shared_ptr<const version_meta> meta;
  std::uint64_t data_base = 0;   // payload offset of data area byte 0
  std::uint64_t data_bytes = 0;  // length of the data area
  std::uint64_t meta_bytes = 0;  // size of the decoded (CBOR) metadata (cache accounting)
};

// The dictionary a format-4 object's metadata was compressed with: called only for an object
// whose trailer names one, and its bytes must stay valid until read_content_header returns.
using metadata_dictionary = std::function<std::span<const std::byte>()>;

// Reads and checks the metadata of object `obj` (any format). corrupt_error on damage (a
// dictionary that is not the one the trailer names included, or none where one is needed),
// error(unsupported) for a format version this build does not know.
content_header read_content_header(const store::object_store& objects, const store::object_ref& obj,
                                   const metadata_dictionary& dictionary = {});

}  // namespace ckpt::fs
