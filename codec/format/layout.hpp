#pragma once
// The layout of a recognised checkpoint file: what a recogniser returns and what served-file
// assembly consumes. Contract: `segments` tile [0, file_size) in order without gaps or overlaps;
// every tensor with a non-zero length is exactly one tensor segment; every CRC field lies in an
// opaque segment; a zip member's covered range contains no CRC field. recognise() only ever
// returns layouts that passed validate(), so consumers may rely on this without re-checking.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "codec/dtype.hpp"

namespace ckpt::format {

// distcp: a torch.distributed.checkpoint shard, torch.save archives back to back after byte
// items (recognise_archive_sequence).
enum class file_format : std::uint8_t { opaque, torch_zip, safetensors, npy, npz, distcp };
std::string_view name(file_format f) noexcept;

// Element types found in checkpoint files. Only f32/f16/bf16 can be compressed; every other type
// is kept byte-exact. `other` is a type the format names but this build does not model
// (quantised storages, float8, structured numpy dtypes): exact, element size 1.
enum class element_type : std::uint8_t {
  f32,
  f16,
  bf16,
  f64,
  c64,
  c128,
  i64,
  i32,
  i16,
  i8,
  u64,
  u32,
  u16,
  u8,
  boolean,
  other
};
std::string_view name(element_type t) noexcept;
std::size_t element_size(element_type t) noexcept;
// The codec's dtype for a compressible type, nothing for an exact one.
std::optional<codec::dtype> codec_dtype(element_type t) noexcept;

// One tensor payload: a contiguous run of elements in the file. For torch zips this is a storage
// (views and tied weights share it and are listed in `aliases`).
struct tensor_info {
  std::string name;                  // dict key path ("model.0.weight", "state.3.exp_avg")
  std::vector<std::string> aliases;  // other names that view the same payload (torch only)
  element_type type = element_type::u8;
  std::vector<std::uint64_t> shape;  // declared shape; for a shared storage its element count
  std::uint64_t offset = 0;          // absolute byte offset of the payload in the file
  std::uint64_t length = 0;          // bytes = element count * element size
  bool compress = false;             // candidate for lossy compression (float type, big enough)
  // Its fully qualified name in the state dict where `name` is only a position (a DCP shard's
  // "item<k>/...", named by the .metadata beside an earlier step: fs/content/dcp_names.cpp);
  // empty otherwise. Recognisers never set it.
  std::string state_name;
  // The name that says what the tensor is (Adam's exp_avg_sq, ...): state_name, else name.
  const std::string& role() const noexcept { return state_name.empty() ? name : state_name; }
  std::uint64_t elements() const noexcept { return length / element_size(type); }
};

struct segment {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::optional<std::size_t> tensor;  // index into layout::tensors; empty for opaque bytes
};

// A stored zip member whose CRC-32 covers bytes that may contain payloads.
struct zip_member {
  std::string name;
  std::uint64_t data_offset = 0;  // first byte covered by the CRC
  std::uint64_t data_length = 0;
  std::uint32_t crc = 0;  // as written in the central directory
};

// A 4-byte little-endian CRC-32 field whose served value depends on member `member`'s bytes.
// Rule: a field written as 0 stays 0 (CRC disabled by the writer, or a local header followed by
// a data descriptor); otherwise, if any payload inside the member is replaced, it is served as
// the CRC-32 of the member's served bytes.
struct crc_fixup {
  std::uint64_t field_offset = 0;
  std::size_t member = 0;
  std::uint32_t original = 0;
};

struct layout {
  file_format format = file_format::opaque;
  std::uint64_t file_size = 0;
  std::vector<segment> segments;
  std::vector<tensor_info> tensors;  // in file order
  std::vector<zip_member> members;
  std::vector<crc_fixup> fixups;  // sorted by field_offset
  std::string note;               // why a file is opaque, or format details ("protocol 2")

  std::uint64_t opaque_bytes() const noexcept;
  std::uint64_t tensor_bytes(bool compress) const noexcept;
};

// A layout with one opaque segment covering the whole file.
layout opaque_layout(std::uint64_t file_size, std::string why = {});

// Sorts tensors by offset and fixups by field, builds the segments, and checks the contract
// above. Throws corrupt_error when the pieces overlap or leave the file.
void finish_layout(layout& l);

// Checks the contract of a finished layout; throws corrupt_error on the first violation.
void validate(const layout& l);

}  // namespace ckpt::format
