#pragma once
// The encoded data area of a version on its way into its content object.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "fs/content/spill_file.hpp"
#include "fs/content/version_meta.hpp"
#include "fs/store/object_store.hpp"

namespace ckpt::fs {

// The data area as separately allocated chunks (one per exact region or tensor frame): growing
// one vector to the size of a keyframe would transiently need twice that. The object store writes
// the chunks as pieces without copying them. Exact regions larger than
// content_options::spill_bytes go to a spill file instead (spill_file.hpp); a piece is then a
// range of that file.
struct data_area {
  struct piece {
    std::vector<std::byte> memory;
    std::uint64_t spill_at = 0, spill_len = 0;  // spill_len > 0: the range of `spill`
  };
  std::vector<piece> pieces;
  std::unique_ptr<spill_file> spill;
  std::uint64_t size = 0;

  void add(std::vector<std::byte>&& b);
  // Appends to the spill file (created in `dir` on first use); consecutive appends extend one
  // piece.
  void add_spilled(const std::string& dir, std::span<const std::byte> b);
};

// Writes a content object: prefix | meta | data area (durable when it returns).
store::object_ref write_object(store::object_store& objects, const version_meta& meta,
                               const data_area& data, std::uint32_t format);

}  // namespace ckpt::fs
