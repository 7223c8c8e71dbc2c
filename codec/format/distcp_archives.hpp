#pragma once
// The archive walking shared by the DCP shard recogniser (distcp.cpp) and the DCP stream walker
// (distcp_stream.cpp): where a torch archive starts and where it ends, read from headers only,
// and the names a shard's tensors take. Internal to the format library.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "codec/format/recognise.hpp"
#include "codec/format/source.hpp"

namespace ckpt::format::distcp {

// Past this many archives the rest of a shard is opaque.
constexpr std::size_t max_archives = std::size_t(1) << 20;

// Whether a torch archive starts at `at`: a local header (no data descriptor) whose name is
// "<prefix>/data.pkl" with a prefix without slashes.
bool archive_starts_at(const source& src, std::uint64_t at);

// The first archive start in [from, from + 1 MiB), if any.
std::optional<std::uint64_t> find_archive(const source& src, std::uint64_t from);

// The end of the zip archive that starts at `at`, from its local records, central directory and
// end records. Throws corrupt_error if anything does not line up (a cut or damaged archive).
std::uint64_t archive_end(const source& src, std::uint64_t at, const recognise_options& opt);

// The name the shard's k-th archive (counting every archive found, tensors or not) gives a
// tensor it names `name`: "item<k>/<name>", so that a shard's tensors stay apart and match the
// same item of the previous step's shard.
std::string item_name(std::size_t k, std::string_view name);

}  // namespace ckpt::format::distcp
