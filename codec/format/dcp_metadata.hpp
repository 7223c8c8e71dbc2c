#pragma once
// A torch.distributed.checkpoint `.metadata` (reference/scale.md §2): the pickle of a Metadata
// dataclass whose storage_data maps each item's MetadataIndex (its fully qualified name in the
// state dict) to a _StorageInfo (the shard file, and the item's offset and length in it). Shards
// carry no tensor names; this is where they are. Read without executing anything
// (load_pickle_graph).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "codec/format/pickle_scan.hpp"

namespace ckpt::format {

struct dcp_storage_item {
  std::string fqn;            // "optimizer.state.layers.0.w.exp_avg_sq"
  std::string relative_path;  // "__0_0.distcp", relative to the .metadata's directory
  std::uint64_t offset = 0;   // the item's bytes in that file: one torch.save archive
  std::uint64_t length = 0;   //   for a tensor item, raw bytes for a byte item
};

// Every item of storage_data with a plain byte range, in pickle order. Items stored through
// stream transforms (a non-empty transform_descriptors, torch 2.8+) are left out: their bytes
// are not an archive. nullopt when the pickle is not of a class named Metadata (another
// program's .metadata). Throws corrupt_error when the pickle is malformed or over `limits`, or a
// Metadata lacks a storage_data dict of MetadataIndex -> _StorageInfo states.
std::optional<std::vector<dcp_storage_item>> read_dcp_metadata(std::span<const std::byte> pickle,
                                                               const pickle_limits& limits = {});

}  // namespace ckpt::format
