#pragma once
// Recognisers: turn a finished file into a layout (layout.hpp) by reading only its headers,
// directories and (for torch) data.pkl. recognise() is the entry point the filesystem uses; the
// per-format functions are exposed for tests and fuzzers.
#include <cstdint>
#include <optional>
#include <string_view>

#include "codec/format/layout.hpp"
#include "codec/format/pickle_scan.hpp"
#include "codec/format/source.hpp"
#include "codec/format/zip.hpp"

namespace ckpt::format {

struct recognise_options {
  // Float payloads smaller than this stay exact (Adam's step, BatchNorm counters, loss scales).
  std::uint64_t min_compress_bytes = 4096;
  std::uint64_t max_header_bytes = 100u << 20;  // safetensors JSON, npy header dict
  pickle_limits pickle;
  zip_limits zip;
};

// Never fails on content: a file that is not a recognised checkpoint, or is malformed, truncated
// or inconsistent, comes back as one opaque segment with the reason in `note`. Only an I/O error
// of the source (ckpt::error with errc::io) propagates.
layout recognise(const source& src, const recognise_options& opt = {});

// Each throws corrupt_error when the file is not of that format or is malformed. The returned
// layout is finished and validated.
layout recognise_zip(const source& src, const recognise_options& opt);  // torch zip or npz
layout recognise_safetensors(const source& src, const recognise_options& opt);
layout recognise_npy(const source& src, const recognise_options& opt);
// A torch.distributed.checkpoint shard (distcp.cpp): torch.save archives back to back, after
// byte items. Nothing when the file holds no torch archive, or exactly one that is the whole
// file (an ordinary torch.save: recognise_zip's). Never throws on content: a cut or damaged
// archive and whatever follows it are opaque.
std::optional<layout> recognise_archive_sequence(const source& src, const recognise_options& opt);

// The element type of a torch storage class ("FloatStorage" -> f32), nothing if unknown.
std::optional<element_type> storage_element(std::string_view type_name);

// Whether a payload of this type and size is a compression candidate.
bool is_candidate(element_type t, std::uint64_t bytes, const recognise_options& opt) noexcept;

}  // namespace ckpt::format
