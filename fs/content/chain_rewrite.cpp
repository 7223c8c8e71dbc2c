// Rotation that frees space by itself (DESIGN.md §9, docs/filesystem.md "Rotation"): which
// hidden base chains are worth freeing by rewriting the named delta above them as a keyframe
// (rekey, retention.cpp). The filesystem's rewriter thread asks after deletions.
#include <algorithm>

#include "codec/mantissa.hpp"
#include "fs/content/content_impl.hpp"

namespace ckpt::fs {
namespace {

// What rewriting `named` as a keyframe will cost, from the keyframe `key` of its chain. A rekey
// codes the version's reconstruction exactly: each mantissa bit it has beyond the keyframe's is
// noise to the coder (counted as if every byte were fp32, an overestimate for anything else),
// never more than the file's logical size. On a lossy keyframe the deltas round to its bits,
// so the usual estimate is the keyframe itself. A version recorded before its bits were
// (rounded_bits -1) is taken as unrounded, and such a keyframe as rounded to what the mount
// rounds to now (what that store's keyframes were rounded to, unless the option changed since).
// Elements the keyframe held as values but the named version does not (it codes them as
// differences, so the rewrite codes them exactly) add their exact cost, counted as fp32 of
// the named version's bits with a sign and about 4 bits of exponent.
std::uint64_t rewrite_cost(const version_rec& named, const version_rec& key, int keyframe_bits) {
  constexpr int all = codec::mantissa_bits(codec::dtype::f32);
  const int named_bits = named.rounded_bits > 0 ? named.rounded_bits : all;
  const int key_bits = key.rounded_bits > 0    ? key.rounded_bits
                       : key.rounded_bits == 0 ? all
                       : keyframe_bits > 0     ? std::min(keyframe_bits, all)
                                               : all;
  const std::uint64_t recoded = key.values_elements > 0 && named.values_elements >= 0 &&
                                        named.values_elements < key.values_elements
                                    ? std::uint64_t(key.values_elements - named.values_elements) *
                                          std::uint64_t(named_bits + 5) / 8
                                    : 0;
  const std::uint64_t base = key.obj.size + recoded;
  if (named_bits <= key_bits) return std::min(std::max(named.size, key.obj.size), base);
  return std::max(
      key.obj.size,
      std::min(named.size, base + named.size * std::uint64_t(named_bits - key_bits) / 32));
}

}  // namespace

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
          keyframe = rewrite_cost(named, r, m.opt.keyframe_bits);
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
