#pragma once
// Which stored version a new checkpoint continues (DESIGN.md §4): files match by content
// signature (ordered tensor names, dtypes, shapes) and, to break ties, by path with step-like
// numbers stripped. Numbers that name a rank or a shard are kept: they are separate lineages.
#include <cstdint>
#include <string>
#include <string_view>

#include "codec/format/layout.hpp"

namespace ckpt::fs {

// "run1/checkpoint-500/optimizer.pt" -> "run1/checkpoint-#/optimizer.pt";
// "ckpt/rank_3/step_40.pt" -> "ckpt/rank_3/step_#.pt"; "model-00001-of-00004.safetensors" and
// "__0_1.distcp" keep their numbers.
std::string lineage_path_key(std::string_view path);

// The rank and shard tokens a path key keeps ("rank_3", "__3_0", "00001-of-00004"), in order;
// empty for a path without any. Two paths with different tokens are different ranks or shards
// of one save: never each other's base, even when their tensors match.
std::string lineage_rank_tokens(std::string_view path);

// XXH3-64 over the ordered (name, type, shape) of the compressible tensors; 0 if there are none.
std::uint64_t lineage_signature(const format::layout& l);

}  // namespace ckpt::fs
