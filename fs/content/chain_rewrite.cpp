// Rotation that frees space by itself (DESIGN.md §9, docs/filesystem.md "Rotation"): which
// hidden base chains are worth freeing by rewriting the named delta above them as a keyframe
// (rekey, retention.cpp). The filesystem's rewriter thread asks after deletions.
#include <algorithm>

#include "fs/content/content_impl.hpp"

namespace ckpt::fs {

void content_store::impl::hint_chain(std::uint64_t v) {
  auto it = versions.find(v);
  if (it != versions.end() && it->second.lineage && !it->second.refs)
    chain_hints.insert(it->second.lineage);
}

bool content_store::has_chain_hints() const {
  std::lock_guard lock(impl_->mu);
  return !impl_->chain_hints.empty();
}

std::vector<content_store::chain_rewrite> content_store::chains_to_rewrite(double factor) {
  auto& m = *impl_;
  std::vector<chain_rewrite> out;
  std::lock_guard lock(m.mu);
  if (factor <= 0) {
    m.chain_hints.clear();
    return out;
  }
  for (const std::uint64_t lid : m.chain_hints) {
    // Every named delta of the lineage with a run of hidden versions below it that only it needs
    // (the oldest named version's whole chain, or the versions between a kept "best" checkpoint
    // and the newer ones kept above it): rewriting it frees that run.
    for (const auto& [id, named] : m.versions) {
      if (named.lineage != lid || !named.refs || named.kind != version_kind::delta) continue;
      std::uint64_t hidden = 0, keyframe = 0;
      bool freeable = true;  // the walk has only met versions the rewrite frees
      for (auto b = m.versions.find(named.base); b != m.versions.end();
           b = m.versions.find(b->second.base)) {
        const version_rec& r = b->second;
        freeable = freeable && !r.refs && r.dependents == 1 && r.donors.empty() && !m.is_head(r);
        if (freeable) hidden += r.obj.size;
        if (r.kind != version_kind::delta) {
          // What the rewrite will cost: a keyframe of this lineage. A rekey codes the
          // version's reconstruction exactly; deltas on a rounded (lossy) keyframe round theirs
          // to the same bits, and deltas on an exact keyframe do not round, so in both cases the
          // rewrite costs about what the chain's keyframe cost. (A chain whose deltas were
          // coded before deltas rounded, on a rounded keyframe, is underestimated: its rewrite
          // costs up to the dropped mantissa bits more.)
          keyframe = r.obj.size;
          break;
        }
      }
      if (keyframe && hidden >= factor * double(keyframe))
        out.push_back({named.id, hidden, keyframe});
    }
  }
  // A lineage not worth it now is looked at again after its next deletion.
  m.chain_hints.clear();
  return out;
}

}  // namespace ckpt::fs
