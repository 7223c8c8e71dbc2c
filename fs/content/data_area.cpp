#include "fs/content/data_area.hpp"

#include <cstring>
#include <optional>

#include "fs/content/content_object.hpp"

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
                               const data_area& data, std::uint32_t format) {
  std::optional<spill_file::mapping> spilled;
  if (data.spill) spilled.emplace(*data.spill);
  content_object_writer out(objects, format);
  for (const auto& p : data.pieces)
    out.append(p.spill_len ? spilled->bytes().subspan(p.spill_at, p.spill_len)
                           : std::span<const std::byte>(p.memory));
  return out.finish(meta);
}

}  // namespace ckpt::fs
