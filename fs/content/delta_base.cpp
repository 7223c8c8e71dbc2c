// A new version's base: the lineage a file continues (by path and tensor signature, or a DCP
// shard's rank), the head it deltas against or a keyframe instead (keyframe_interval, refreshes),
// the pin that keeps that base while it is coded, and the bytes of the base's reconstruction a
// slab at a time (from the retired head image, the live one, the cache, or its chain).
#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <utility>

#include "codec/error.hpp"
#include "fs/content/content_impl.hpp"
#include "fs/content/lineage_key.hpp"

namespace ckpt::fs {

void content_store::impl::read_recon_slab(std::uint64_t base, std::size_t tensor,
                                          std::uint64_t offset, std::span<std::byte> out,
                                          std::shared_ptr<const cache_item>& whole,
                                          const head_image* retired) {
  // The whole chain decode under one guard: a stream holds its lineage's lock only while it
  // picks its base, so a rekey in the chain (rotation) may commit meanwhile and free the
  // versions below it; their objects stay until this decode is done.
  read_guard guard(*this);
  if (retired && !whole && retired->version() == base &&
      retired->read_kept(meta_of(base)->meta->layout.tensors.at(tensor).offset + offset, out))
    return;  // else released already (a base tensor read twice): decoded below
  if (heads && !whole) {
    if (const auto h = heads->get(base)) {  // the lineage head: no decoding at all
      h->read(meta_of(base)->meta->layout.tensors.at(tensor).offset + offset, out);
      return;
    }
  }
  if (!whole) whole = cache.get({base, k_tensor, tensor});
  if (!whole) {
    // Decoded through the base's chain a chunk at a time, when every link has a block index;
    // slabs are whole chunks, except a tensor's last.
    const std::uint64_t cb = chain_chunk_bytes(base, tensor);
    if (cb && offset % cb == 0) {
      for (std::uint64_t at = 0; at < out.size(); at += cb)
        decodes.frames(
            decode_chunk_into(base, tensor, std::size_t((offset + at) / cb),
                              out.subspan(at, std::min<std::uint64_t>(cb, out.size() - at)), true));
      return;
    }
    whole = tensor_recon(base, tensor);  // versions from before block indexes
  }
  if (offset + out.size() > whole->data.size()) throw corrupt_error("content: base size mismatch");
  std::memcpy(out.data(), whole->data.data() + offset, out.size());
}

std::uint64_t content_store::impl::lineage_for(std::string_view path, std::uint64_t sig) {
  // A path key that has a lineage continues it; a new one gets its lineage at once (in memory;
  // its record goes with its first version), so that two first puts of one path key meet in the
  // same lineage: the second waits for the first and deltas against it.
  const std::string key = lineage_path_key(path);
  std::uint64_t id = 0;
  for (const auto& [lid, l] : lineages)
    if (l.signature == sig && l.path_key == key) id = lid;
  if (id) return id;
  lineage_rec l;
  l.id = id = next_lineage++;
  l.signature = sig;
  l.path_key = key;
  l.journaled = false;
  lineages.emplace(id, std::move(l));
  return id;
}

std::unique_lock<std::mutex> content_store::impl::lock_lineage(std::string_view path,
                                                               std::uint64_t sig,
                                                               std::uint64_t& lineage_id) {
  auto& m = *this;
  // One encode at a time per lineage: the next version's base is this one's reconstruction. A
  // lineage chosen here may be joined into another (renamed()) before its lock is ours: then
  // the choice is made again.
  for (;;) {
    std::shared_ptr<std::mutex> encode_mu;
    {
      std::lock_guard lock(m.mu);
      lineage_id = m.lineage_for(path, sig);
      encode_mu = m.lineages.at(lineage_id).encode_mu;
    }
    std::unique_lock lineage_lock(*encode_mu);
    std::lock_guard lock(m.mu);
    if (m.lineages.count(lineage_id)) return lineage_lock;
  }
}

content_store::impl::base_choice content_store::impl::choose_base(std::uint64_t lineage_id) {
  auto& m = *this;
  std::lock_guard lock(m.mu);
  base_choice c;
  const auto& l = m.lineages.at(lineage_id);
  c.base = l.head;
  if (c.base && !m.versions.count(c.base)) c.base = 0;
  c.since = m.deltas_since_keyframe(c.base);
  if (!l.head) {
    // A lineage's first version: content matching another lineage (a renamed run, temp files
    // with random names, a step directory written under a temporary name) starts from a
    // matching head instead of a keyframe; never from another rank's or shard's (their rows
    // differ: a delta against them would be a lossy first version). Of several, the one whose
    // path key begins with the longest part of this one's (`run/last.pt.tmp` from `run/last.pt`,
    // rather than from another run of the same model saved a moment later elsewhere, whose
    // weights it would store as a keyframe's: encode_tensor), then the most recently extended.
    const std::string ranks = lineage_rank_tokens(l.path_key);
    const auto shared = [&](const std::string& key) {
      return std::size_t(std::ranges::mismatch(key, l.path_key).in1 - key.begin());
    };
    const lineage_rec* donor = nullptr;
    std::size_t donor_shared = 0;
    for (const auto& [lid, o] : m.lineages) {
      if (lid == lineage_id || o.signature != l.signature || !o.head || !m.versions.count(o.head) ||
          lineage_rank_tokens(o.path_key) != ranks)
        continue;
      const std::size_t n = shared(o.path_key);
      if (!donor || n > donor_shared || (n == donor_shared && o.head > donor->head)) {
        donor = &o;
        donor_shared = n;
      }
    }
    if (donor) {
      c.base = donor->head;
      c.since = m.deltas_since_keyframe(c.base);
    }
  }
  settle_choice(c);
  return c;
}

void content_store::impl::settle_choice(base_choice& c) {
  if (const auto b = versions.find(c.base); b != versions.end() && b->second.lineage)
    if (const auto l = lineages.find(current_lineage(b->second.lineage)); l != lineages.end())
      c.image = !l->second.single;
  c.keyframe = opt.lossless || !c.base ||
               c.since + 1 >= std::uint64_t(opt.keyframe_interval_for(versions.at(c.base).size));
  if (c.keyframe) c.previous = std::exchange(c.base, 0);
  // Not with the paper's coder or its whole-checkpoint tables (shared by every tensor at `bits`),
  // nor where `bits` is already codec::max_bits, nor with a fixed grid step (grid=STEP): its
  // grid at more bits only adds outer levels, and the changes under half a step, the error a
  // refresh is for, would stay where they are.
  c.refresh = !c.keyframe && opt.refresh_interval > 0 && opt.bits < codec::max_bits &&
              opt.scope == codec::bucket_scope::tensor && !opt.paper_coding &&
              !(opt.grid_step > 0) && (c.since + 1) % std::uint64_t(opt.refresh_interval) == 0;
  // Pinned as a dependent from now on: another lineage's head (a forked lineage's base), or with
  // a stream this lineage's own, may move on meanwhile and must not be reclaimed under us.
  if (c.base) ++versions.at(c.base).dependents;
}

bool content_store::impl::shard_tensor_in(
    const format::tensor_info& t, const cache_item& base,
    const std::unordered_map<std::string, std::size_t>& base_by_name) const {
  const auto b = base_tensor_for(t, &base, base_by_name);
  return b && base.meta->layout.tensors[*b].shape == t.shape;
}

content_store::impl::base_choice content_store::impl::choose_shard_base(
    std::string_view path, std::span<const format::tensor_info> found) {
  // Candidates, best first: lineages of the path key, then of the same rank tokens; the newest
  // head first within each.
  struct candidate {
    bool same_key;
    std::uint64_t head, lineage;
    std::shared_ptr<std::mutex> encode_mu;
  };
  std::vector<candidate> candidates;
  {
    std::lock_guard lock(mu);
    const std::string key = lineage_path_key(path);
    const std::string ranks = lineage_rank_tokens(key);
    for (const auto& [lid, l] : lineages) {
      const bool same_key = l.path_key == key;
      // A lineage of the key without a head yet: its first put is running (a step closed
      // without fsync); waited for below.
      if (!same_key && (!l.head || !versions.count(l.head))) continue;
      if (same_key || (!ranks.empty() && lineage_rank_tokens(l.path_key) == ranks))
        candidates.push_back({same_key, l.head, lid, l.encode_mu});
    }
  }
  std::sort(candidates.begin(), candidates.end(), [](const candidate& a, const candidate& b) {
    return std::pair(a.same_key, a.head) > std::pair(b.same_key, b.head);
  });
  constexpr std::size_t max_candidates = 8;  // each costs a metadata read when not cached
  if (candidates.size() > max_candidates) candidates.resize(max_candidates);
  for (const auto& c : candidates) {
    // A put of the key's lineage running now (a step closed without fsync, still being
    // stored) moves its head on: waited for, as a put of the lineage waits for it. Not for
    // the rank's other lineages (other runs' saves, which would only hold this one up).
    if (c.same_key) {
      const std::lock_guard wait(*c.encode_mu);
    }
    std::uint64_t head = 0;
    {
      std::lock_guard lock(mu);
      // A lineage joined into another meanwhile (a rename): the one it went into.
      const auto l = lineages.find(current_lineage(c.lineage));
      if (l == lineages.end() || !versions.count(l->second.head)) continue;
      head = l->second.head;
    }
    std::shared_ptr<const cache_item> meta;
    try {
      meta = meta_of(head);
    } catch (const std::exception&) {
      continue;  // reclaimed meanwhile
    }
    const auto by_name = tensors_by_name(*meta);
    // The tensors that identify a checkpoint (lineage_key.hpp): a small one without a frame in
    // a head written under another min_tensor is coded without a base, not a reason for a
    // keyframe.
    const bool large = has_large_tensor(found);
    const bool agrees = std::all_of(found.begin(), found.end(), [&](const format::tensor_info& t) {
      return !identifies(t, large) || shard_tensor_in(t, *meta, by_name);
    });
    if (!agrees) continue;
    std::lock_guard lock(mu);
    if (!versions.count(head)) continue;
    base_choice choice{head, deltas_since_keyframe(head), false};
    settle_choice(choice);
    return choice;
  }
  std::lock_guard lock(mu);
  base_choice choice;
  settle_choice(choice);
  return choice;
}

content_store::impl::base_pin::~base_pin() {
  if (!armed || !base) return;
  std::lock_guard lock(m.mu);
  auto it = m.versions.find(base);
  if (it == m.versions.end()) return;
  --it->second.dependents;
  // Into `unneeded`: what made the base unnecessary (a newer head) may not be durable yet.
  m.collect(base, m.unneeded);
}

}  // namespace ckpt::fs
