#pragma once
// Which stored version a new checkpoint continues (DESIGN.md §4): files match by content
// signature (ordered tensor names, dtypes, shapes) and, to break ties, by path with step-like
// numbers stripped. Numbers that name a rank or a shard are kept: they are separate lineages.
#include <cstdint>
#include <span>
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

// Tensors that identify a checkpoint: compressible ones of at least this many bytes (what was
// compressible before -o min_tensor existed), or every compressible one where none is that
// large. Smaller ones are left out so that min_tensor, which decides whether they are coded,
// does not change a checkpoint's identity: a store written before, or a mount with another
// min_tensor, continues its lineages instead of starting each with a keyframe.
inline constexpr std::uint64_t identity_min_bytes = 4096;
bool identifies(const format::tensor_info& t, bool has_large) noexcept;
// Whether any compressible tensor has identity_min_bytes or more.
bool has_large_tensor(std::span<const format::tensor_info> tensors) noexcept;

// XXH3-64 over the ordered (name, type, shape) of the tensors that identify the checkpoint
// (identifies()); 0 if there are none.
std::uint64_t lineage_signature(const format::layout& l);

}  // namespace ckpt::fs
