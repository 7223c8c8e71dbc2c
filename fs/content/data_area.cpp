#include "fs/content/data_area.hpp"

#include <cstring>
#include <optional>

#include "codec/xxh3.hpp"

namespace ckpt::fs {

void data_area::add(std::vector<std::byte>&& b) {
  size += b.size();
  pieces.push_back({std::move(b)});
}

void data_area::add_spilled(const std::string& dir, std::span<const std::byte> b) {
  if (b.empty()) return;
  if (!spill) spill = std::make_unique<spill_file>(dir);
  const std::uint64_t at = spill->append(b);
  if (!pieces.empty() && pieces.back().spill_len &&
      pieces.back().spill_at + pieces.back().spill_len == at)
    pieces.back().spill_len += b.size();
  else
    pieces.push_back({{}, at, b.size()});
  size += b.size();
}

store::object_ref write_object(store::object_store& objects, const version_meta& meta,
                               const data_area& data) {
  const std::vector<std::byte> meta_bytes = encode_meta(meta);
  std::byte prefix[content_prefix_size];
  const std::uint32_t magic = content_magic, fmt = content_format_version;
  const std::uint64_t meta_len = meta_bytes.size();
  const std::uint64_t meta_sum = XXH3_64bits(meta_bytes.data(), meta_bytes.size());
  std::memcpy(prefix, &magic, 4);
  std::memcpy(prefix + 4, &fmt, 4);
  std::memcpy(prefix + 8, &meta_len, 8);
  std::memcpy(prefix + 16, &meta_sum, 8);
  std::optional<spill_file::mapping> spilled;
  if (data.spill) spilled.emplace(*data.spill);
  std::vector<std::span<const std::byte>> pieces{prefix, meta_bytes};
  for (const auto& p : data.pieces)
    pieces.push_back(p.spill_len ? spilled->bytes().subspan(p.spill_at, p.spill_len)
                                 : std::span<const std::byte>(p.memory));
  return objects.put(pieces);
}

}  // namespace ckpt::fs
