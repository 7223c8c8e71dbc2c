// Exact files as extents: a file the recognisers do not know is stored as its data runs (holes
// are not stored), and a new version of a file that was opened over an exact version and changed
// in part reuses that version's encoded blocks where the bytes did not change. The reused blocks
// stay in the older version's object; the new version names it as a donor and keeps it alive
// (version_rec::donors, exact_region::src).
//
// Space is bounded by refusing poor donors: a version is reused only if the blocks taken from it
// make at least half of its data area. Otherwise its unchanged blocks are encoded again into the
// new object, once, and the old object can go when nothing else needs it. So a file rewritten
// piece by piece never keeps alive objects that are mostly dead, and each byte is re-encoded at
// most once per halving of its donor.
#include <map>
#include <set>

#include "fs/content/content_impl.hpp"

namespace ckpt::fs {
namespace {

using runs_t = std::vector<std::pair<std::uint64_t, std::uint64_t>>;

// The base's blocks whose bytes lie wholly inside an unchanged range, one region per block, keyed
// by file offset; each names the object that holds it (the base, or the base's own donor).
std::map<std::uint64_t, exact_region> reusable_blocks(const version_meta& base,
                                                      std::uint64_t base_version,
                                                      const runs_t& unchanged) {
  std::map<std::uint64_t, exact_region> out;
  auto range = unchanged.begin();
  for (const exact_region& r : base.exact) {
    if (r.block_bytes == 0) continue;
    for (std::size_t k = 0; k < r.blocks.size(); ++k) {
      const std::uint64_t from = r.offset + std::uint64_t(k) * r.block_bytes;
      const std::uint64_t to = std::min(from + r.block_bytes, r.offset + r.length);
      while (range != unchanged.end() && range->second <= from) ++range;
      if (range == unchanged.end()) return out;
      if (from < range->first || to > range->second) continue;
      const std::uint64_t end = k + 1 < r.blocks.size() ? r.blocks[k + 1] : r.encoded_bytes;
      if (end <= r.blocks[k]) continue;  // damaged index: encode the bytes again instead
      exact_region b;
      b.offset = from;
      b.length = to - from;
      b.data_at = r.data_at + r.blocks[k];
      b.block_bytes = r.block_bytes;
      b.blocks = {0};
      b.encoded_bytes = end - r.blocks[k];
      b.src = r.src ? r.src : base_version;
      out.emplace(from, std::move(b));
    }
  }
  return out;
}

// Appends reused block `b` to the regions, growing the last one when `b` continues it in the
// same object (whole blocks only, so the block index stays uniform).
void append_block(std::vector<exact_region>& regions, const exact_region& b) {
  if (!regions.empty()) {
    exact_region& last = regions.back();
    if (last.src == b.src && last.block_bytes == b.block_bytes &&
        last.offset + last.length == b.offset && last.length % last.block_bytes == 0 &&
        last.data_at + last.encoded_bytes == b.data_at) {
      last.blocks.push_back(last.encoded_bytes);
      last.length += b.length;
      last.encoded_bytes += b.encoded_bytes;
      return;
    }
  }
  regions.push_back(b);
}

}  // namespace

std::vector<std::uint64_t> content_store::impl::write_exact_file(const format::source& src,
                                                                 const staged_file* staged,
                                                                 version_meta& meta,
                                                                 content_object_writer& out,
                                                                 std::vector<std::byte>& enc) {
  const runs_t runs = staged ? staged->data_runs() : runs_t{{0, src.size()}};
  std::map<std::uint64_t, exact_region> reuse;
  if (staged) {
    const staged_file::unchanged_ranges u = staged->unchanged();
    if (u.version && !u.ranges.empty()) {
      std::shared_ptr<const cache_item> base;
      try {
        base = meta_of(u.version);  // pinned by the staged file's reader
      } catch (const corrupt_error&) {
        // Unreadable: the bytes are encoded again (reading them will report the damage).
      }
      if (base && base->meta->kind == version_kind::exact)
        reuse = reusable_blocks(*base->meta, u.version, u.ranges);
    }
  }
  // Poor donors are refused (see the top of this file).
  std::map<std::uint64_t, std::uint64_t> used;
  for (const auto& [at, b] : reuse) used[b.src] += b.encoded_bytes;
  std::set<std::uint64_t> refused;
  for (const auto& [donor, bytes] : used) {
    try {
      if (2 * bytes < meta_of(donor)->data_bytes) refused.insert(donor);
    } catch (const corrupt_error&) {
      refused.insert(donor);
    }
  }
  std::erase_if(reuse, [&](const auto& e) { return refused.count(e.second.src) != 0; });

  std::set<std::uint64_t> donors;
  for (const auto& [from, to] : runs) {
    std::uint64_t fresh = from;  // start of bytes not yet stored
    for (auto it = reuse.lower_bound(from); it != reuse.end() && it->first < to; ++it) {
      const exact_region& b = it->second;
      if (b.offset < fresh || b.offset + b.length > to) continue;
      if (b.offset > fresh)
        meta.exact.push_back(write_exact_region(src, fresh, b.offset - fresh, out, enc));
      append_block(meta.exact, b);
      donors.insert(b.src);
      fresh = b.offset + b.length;
    }
    if (to > fresh) meta.exact.push_back(write_exact_region(src, fresh, to - fresh, out, enc));
  }
  return {donors.begin(), donors.end()};
}

}  // namespace ckpt::fs
