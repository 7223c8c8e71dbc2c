#include "codec/format/assemble.hpp"

#include <algorithm>
#include <cstring>

#include "codec/error.hpp"
#include "codec/format/crc32.hpp"

namespace ckpt::format {

served_file::served_file(format::layout l, source original, std::vector<bool> replaced,
                         payload_reader payload)
    : layout_(std::move(l)),
      original_(std::move(original)),
      replaced_(std::move(replaced)),
      payload_(std::move(payload)),
      member_dirty_(layout_.members.size()),
      crc_cache_(layout_.members.size()) {
  if (original_.size() != layout_.file_size)
    throw invalid_argument("served_file: source size differs from the layout");
  replaced_.resize(layout_.tensors.size());
  // Which members contain a replaced payload: members are disjoint, so sort them by offset and
  // look each replaced tensor up.
  std::vector<std::size_t> order(layout_.members.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return layout_.members[a].data_offset < layout_.members[b].data_offset;
  });
  for (std::size_t t = 0; t < layout_.tensors.size(); ++t) {
    if (!replaced_[t]) continue;
    const auto& ti = layout_.tensors[t];
    auto it = std::upper_bound(
        order.begin(), order.end(), ti.offset,
        [&](std::uint64_t v, std::size_t m) { return v < layout_.members[m].data_offset; });
    if (it == order.begin()) continue;
    const auto& m = layout_.members[*std::prev(it)];
    if (ti.offset + ti.length <= m.data_offset + m.data_length)
      member_dirty_[*std::prev(it)] = true;
  }
}

void served_file::read_raw(std::uint64_t offset, std::span<std::byte> out) const {
  const auto& segs = layout_.segments;
  auto it = std::upper_bound(segs.begin(), segs.end(), offset,
                             [](std::uint64_t v, const segment& s) { return v < s.offset; });
  if (it == segs.begin()) throw invalid_argument("served_file: read before the first segment");
  --it;
  std::size_t done = 0;
  while (done < out.size()) {
    if (it == segs.end()) throw invalid_argument("served_file: read beyond the last segment");
    const std::uint64_t at = offset + done;
    const std::uint64_t in_seg = at - it->offset;
    const std::size_t n =
        std::size_t(std::min<std::uint64_t>(out.size() - done, it->length - in_seg));
    const auto dst = out.subspan(done, n);
    if (it->tensor && replaced_[*it->tensor])
      payload_(*it->tensor, in_seg, dst);
    else
      original_.read(at, dst);
    done += n;
    ++it;
  }
}

std::size_t served_file::read(std::uint64_t offset, std::span<std::byte> out) const {
  if (offset >= layout_.file_size) return 0;
  const auto n = std::size_t(std::min<std::uint64_t>(out.size(), layout_.file_size - offset));
  out = out.first(n);
  read_raw(offset, out);
  // Patch the CRC fields that overlap [offset, offset + n).
  const auto& fx = layout_.fixups;
  auto it =
      std::lower_bound(fx.begin(), fx.end(), offset < 3 ? 0 : offset - 3,
                       [](const crc_fixup& f, std::uint64_t v) { return f.field_offset < v; });
  for (; it != fx.end() && it->field_offset < offset + n; ++it) {
    if (it->original == 0 || !member_dirty_[it->member]) continue;
    const std::uint32_t crc = member_crc(it->member);
    std::byte field[4];
    std::memcpy(field, &crc, 4);  // little-endian
    for (std::uint64_t k = 0; k < 4; ++k) {
      const auto pos = it->field_offset + k;
      if (pos >= offset && pos < offset + n) out[std::size_t(pos - offset)] = field[k];
    }
  }
  return n;
}

std::uint32_t served_file::member_crc(std::size_t m) const {
  {
    std::lock_guard lock(*crc_mu_);
    if (crc_cache_.at(m)) return *crc_cache_[m];
  }
  // Computed outside the lock; a racing duplicate computes the same value.
  const auto& mem = layout_.members[m];
  std::vector<std::byte> buf(std::size_t(std::min<std::uint64_t>(mem.data_length, 4u << 20)));
  std::uint32_t crc = 0;
  for (std::uint64_t at = 0; at < mem.data_length;) {
    const auto n = std::size_t(std::min<std::uint64_t>(buf.size(), mem.data_length - at));
    read_raw(mem.data_offset + at, std::span(buf).first(n));
    crc = crc32(crc, std::span(buf).first(n));
    at += n;
  }
  std::lock_guard lock(*crc_mu_);
  crc_cache_[m] = crc;
  return crc;
}

void served_file::set_member_crc(std::size_t m, std::uint32_t crc) {
  std::lock_guard lock(*crc_mu_);
  crc_cache_.at(m) = crc;
}

served_file make_served_file(format::layout l, source original,
                             std::vector<std::vector<std::byte>> replacements) {
  replacements.resize(l.tensors.size());
  std::vector<bool> replaced(l.tensors.size());
  for (std::size_t i = 0; i < l.tensors.size(); ++i) {
    if (replacements[i].empty()) continue;
    if (replacements[i].size() != l.tensors[i].length)
      throw invalid_argument("replacement for '" + l.tensors[i].name + "' has the wrong size");
    replaced[i] = true;
  }
  auto data = std::make_shared<std::vector<std::vector<std::byte>>>(std::move(replacements));
  return served_file(std::move(l), std::move(original), std::move(replaced),
                     [data](std::size_t t, std::uint64_t off, std::span<std::byte> out) {
                       std::memcpy(out.data(), (*data)[t].data() + off, out.size());
                     });
}

}  // namespace ckpt::format
