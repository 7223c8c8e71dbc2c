// fs::filesystem, management: the namespace as ckptctl sees it (paths and their versions),
// removal of names by path, and rewriting a version as a keyframe under the same gate as puts.
#include <mutex>
#include <shared_mutex>

#include "codec/error.hpp"
#include "fs/namespace/fail.hpp"
#include "fs/namespace/filesystem.hpp"
#include "fs/namespace/log.hpp"

namespace ckpt::fs {
namespace {

std::vector<std::string_view> components(std::string_view path) {
  std::vector<std::string_view> out;
  while (!path.empty()) {
    const auto slash = path.find('/');
    const auto part = path.substr(0, slash);
    if (!part.empty() && part != ".") out.push_back(part);
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return out;
}

}  // namespace

std::vector<filesystem::named_file> filesystem::regular_files() {
  std::lock_guard lk(mu_);
  std::vector<named_file> out;
  // Depth first, names in directory order; directories are a tree (no hard links to them).
  std::vector<std::pair<ino_t, std::string>> stack{{root_ino, ""}};
  while (!stack.empty()) {
    auto [dir, prefix] = std::move(stack.back());
    stack.pop_back();
    const inode* d = tree_.find(dir);
    if (!d) continue;
    for (const auto& [name, child] : d->entries) {
      const inode* c = tree_.find(child);
      if (!c) continue;
      std::string path = prefix.empty() ? name : prefix + "/" + name;
      if (c->is_dir()) {
        stack.emplace_back(child, std::move(path));
      } else if (c->is_reg()) {
        out.push_back({std::move(path), child, c->content});
      }
    }
  }
  return out;
}

ino_t filesystem::resolve(std::string_view path) {
  std::lock_guard lk(mu_);
  ino_t cur = root_ino;
  for (auto part : components(path)) {
    const inode& d = tree_.get(cur);
    if (!d.is_dir()) fail(ENOTDIR, "not a directory in " + std::string(path));
    if (part == "..") {
      cur = d.parent ? d.parent : root_ino;
      continue;
    }
    const ino_t c = tree_.child(cur, part);
    if (!c) fail(ENOENT, "no such file: " + std::string(path));
    cur = c;
  }
  return cur;
}

bool filesystem::remove_if(std::string_view path, const content_ref& expected) {
  auto parts = components(path);
  if (parts.empty()) fail(EISDIR, "cannot remove the root");
  const std::string name(parts.back());
  std::string parent_path;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) parent_path += std::string(parts[i]) + "/";
  const ino_t parent = resolve(parent_path);
  ino_t child = 0;
  {
    std::lock_guard lk(mu_);
    child = tree_.child(parent, name);
    if (!child) return false;
    const inode& n = tree_.get(child);
    if (!n.is_reg() || !(n.content == expected)) return false;
    if (auto it = rt_.find(child); it != rt_.end() && (it->second.pending || it->second.dirty))
      return false;  // being written: its next version is not ours to remove
    journal_ok();
    append(tree_.remove(parent, name, false, now()));
    maybe_drop(child);
  }
  if (entry_removed_) entry_removed_(parent, child, name);
  return true;
}

std::uint64_t filesystem::rekey(std::uint64_t version) {
  std::uint64_t bytes = 0;
  {
    std::shared_lock gate(put_gate_);  // a compaction snapshot must not miss the record
    bytes = content_.rekey(version);
  }
  sync_journal();  // durable, then the superseded objects go
  return bytes;
}

// Rotation: deletions through the mount (rm, rmtree, overwrite, rename over) leave versions that
// only later versions' chains need; content_store::chains_to_rewrite says which chains are worth
// freeing and this rewrites the delta above each. Looks once per sync interval, after the
// deletions' unrefs (which follow their journal sync) have been made.
void filesystem::rewriter(std::stop_token stop) {
  std::unique_lock lk(rewriter_mu_);
  while (!stop.stop_requested()) {
    rewriter_cv_.wait_for(lk, stop, cfg_.sync_interval, [] { return false; });
    if (stop.stop_requested()) break;
    lk.unlock();
    chain_rewriting_ = true;
    try {
      for (const auto& c : content_.chains_to_rewrite(cfg_.rewrite_factor)) {
        if (stop.stop_requested()) break;
        try {
          const std::uint64_t written = rekey(c.version);
          if (!written) continue;
          ++chain_rewrites_;
          chain_rewrite_bytes_ += written;
          chain_freed_bytes_ += c.hidden_bytes;
          log_info("rotation: version " + std::to_string(c.version) + " rewritten as a keyframe (" +
                   std::to_string(written) + " bytes written), freeing the " +
                   std::to_string(c.hidden_bytes) + " bytes of hidden versions below it");
        } catch (const corrupt_error& e) {
          // Damaged (verify reports it) or rewritten meanwhile: left as it is.
          log_error("rotation: version " + std::to_string(c.version) +
                    " not rewritten: " + e.what());
        }
      }
    } catch (const std::exception& e) {
      log_error(std::string("rotation: ") + e.what());  // ENOSPC, EIO: again at the next deletion
    }
    chain_rewriting_ = false;
    lk.lock();
  }
}

}  // namespace ckpt::fs
