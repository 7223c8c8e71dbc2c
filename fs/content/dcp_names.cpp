// DCP shards' state-dict names (docs/filesystem.md, "DCP shards' names"). A shard's archives hold
// each tensor without its name (torch.save(tensor)): the store names them by position
// ("item<k>/data/0"), and DCP writes the names to the .metadata beside the shards once all of
// them are written. When that file is stored its items go to the shards' versions (in memory);
// the next step's shard, coded against such a version, gives each tensor at the same position
// (same dtype and shape) that version's name for it, and records it (tensor_info::state_name),
// so that the names survive a restart and pass along the lineage even without a .metadata.
// What the names change: which tensors are second moments (ratio_bits, moment_bits), which are
// optimizer state (optimizer=exact), and the classes `ckptctl stat` reports.
#include <algorithm>

#include "fs/content/content_impl.hpp"

namespace ckpt::fs {
namespace {

constexpr std::uint64_t kMaxMetadataBytes = std::uint64_t(64) << 20;
// Items waiting for their shard's version: at most this many paths and bytes.
constexpr std::size_t kMaxPending = 4096;
constexpr std::uint64_t kMaxPendingBytes = std::uint64_t(64) << 20;

std::uint64_t bytes_of(const std::vector<format::dcp_storage_item>& items) {
  std::uint64_t n = 0;
  for (const auto& i : items) n += sizeof i + i.fqn.size() + i.relative_path.size();
  return n;
}

}  // namespace

void content_store::impl::note_dcp_metadata(std::string_view path,
                                            const format::source& src) noexcept {
  const auto slash = path.rfind('/');
  const std::string_view dir = slash == std::string_view::npos ? "" : path.substr(0, slash + 1);
  const std::string_view file = path.substr(dir.size());
  if ((file != ".metadata" && file != ".metadata.tmp") || src.size() > kMaxMetadataBytes ||
      src.size() < 2)
    return;
  try {
    std::vector<std::byte> bytes(src.size());
    src.read(0, bytes);
    if (bytes[0] != std::byte{0x80}) return;  // not a pickle (protocol 2+): someone else's file
    using items_t = std::vector<format::dcp_storage_item>;
    std::map<std::string, items_t> by_file;
    auto items = format::read_dcp_metadata(bytes, opt.recognise().pickle);
    if (!items) return;  // another program's .metadata
    for (auto& item : *items)
      by_file[std::string(dir) + item.relative_path].push_back(std::move(item));
    std::vector<std::pair<std::string, std::shared_ptr<const items_t>>> files;
    for (auto& [file_path, file_items] : by_file) {
      std::sort(file_items.begin(), file_items.end(),
                [](const auto& a, const auto& b) { return a.offset < b.offset; });
      files.emplace_back(file_path, std::make_shared<const items_t>(std::move(file_items)));
    }
    std::lock_guard lock(mu);
    std::map<std::string, std::uint64_t> newest;
    for (const auto& [id, r] : versions)
      if (r.lineage && by_file.count(r.path)) newest[r.path] = id;  // ids ascend
    for (auto& [file_path, shared] : files) {
      take_pending_dcp(file_path);  // superseded by these
      if (const auto v = newest.find(file_path); v != newest.end()) {
        versions.at(v->second).dcp_items = std::move(shared);
        continue;
      }
      // A shard still being stored (closed without fsync): its version takes them when it is
      // recorded (record_version). The oldest waiting go first.
      const std::uint64_t bytes = bytes_of(*shared);
      if (bytes > kMaxPendingBytes) continue;
      while (!pending_dcp_order.empty() && (pending_dcp_items.size() >= kMaxPending ||
                                            pending_dcp_bytes + bytes > kMaxPendingBytes)) {
        const std::string oldest = pending_dcp_order.begin()->second;
        pending_dcp_order.erase(pending_dcp_order.begin());
        take_pending_dcp(oldest);
      }
      pending_dcp_bytes += bytes;
      pending_dcp_order.emplace(++pending_dcp_seq, file_path);
      pending_dcp_items[file_path] = {pending_dcp_seq, bytes, std::move(shared)};
    }
  } catch (const std::exception& e) {
    try {
      if (log)
        log(log_level::error, "DCP metadata " + std::string(path) + " not read (" + e.what() +
                                  "): its shards' tensors keep positional names");
    } catch (...) {
      // Nowhere to say it: the file is stored, its shards keep positional names.
    }
  }
}

std::shared_ptr<const std::vector<format::dcp_storage_item>> content_store::impl::take_pending_dcp(
    const std::string& path) {
  const auto p = pending_dcp_items.find(path);
  if (p == pending_dcp_items.end()) return nullptr;
  auto items = std::move(p->second.items);
  pending_dcp_bytes -= p->second.bytes;
  pending_dcp_order.erase(p->second.seq);
  pending_dcp_items.erase(p);
  return items;
}

content_store::impl::shard_names content_store::impl::shard_names_of(std::uint64_t version) {
  shard_names n;
  if (!version) return n;
  std::shared_ptr<const std::vector<format::dcp_storage_item>> items;
  {
    std::lock_guard lock(mu);
    const auto v = versions.find(version);
    if (v == versions.end()) return n;
    items = v->second.dcp_items;
  }
  try {
    n.meta = meta_of(version);
  } catch (const std::exception&) {
    return {};  // reclaimed meanwhile: no names
  }
  for (const auto& t : n.meta->meta->layout.tensors) {
    std::string_view name = t.state_name;
    if (items) {
      // The item whose bytes hold the tensor's payload.
      auto it = std::upper_bound(items->begin(), items->end(), t.offset,
                                 [](std::uint64_t off, const auto& i) { return off < i.offset; });
      if (it != items->begin() &&
          t.offset + t.length <= std::prev(it)->offset + std::prev(it)->length)
        name = std::prev(it)->fqn;
    }
    if (!name.empty()) n.names.emplace(t.name, name);
  }
  if (!n.names.empty()) n.by_name = tensors_by_name(*n.meta);
  return n;
}

void content_store::impl::name_shard_tensor(format::tensor_info& t, shard_names& n) const {
  if (n.names.empty()) return;
  // From the first tensor the version does not hold at its position on, positions name other
  // tensors (a changed model): nothing more is named.
  if (!shard_tensor_in(t, *n.meta, n.by_name)) {
    n.names.clear();
    return;
  }
  if (const auto it = n.names.find(t.name); it != n.names.end()) t.state_name = it->second;
}

}  // namespace ckpt::fs
