// content_store::verify_chain: `ckptctl verify --deep` along a chain of deltas. Each tensor is
// followed through the chain as a track (a frame, the frame of the next version coded against
// it, and so on), and decoded slab by slab across the track: a slab of every version of the
// track, each on top of the one decoded just before it, then the next slab. So each slab of each
// version is decoded once, from two slab buffers, and a version's digest is built up as its
// slabs come. verify() of one version instead reads its base through the read path, which
// decodes the base's chain again wherever the cache no longer holds it: once per slab for
// tensors larger than the cache.
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "codec/error.hpp"
#include "fs/content/content_impl.hpp"

namespace ckpt::fs {

namespace {

struct chain_link {
  version_rec rec;
  std::shared_ptr<const cache_item> item;
  bool walkable = false;  // checked, unchanged since, every frame block-indexed
};

using frame_at = std::pair<std::size_t, std::size_t>;  // (position in the chain, frame index)

}  // namespace

std::vector<std::string> content_store::verify_chain(
    std::span<const std::uint64_t> chain, const std::function<void(std::uint64_t)>& progress) {
  auto& m = *impl_;
  const std::size_t n = chain.size();
  std::vector<std::string> problems(n);
  std::vector<chain_link> links(n);

  // Each version's own checks (objects, metadata, references, exact regions decoded), then the
  // record and metadata the walk decodes. A version rewritten meanwhile (its object is not the
  // one checked), or with frames from before block indexes, is verified on its own, and the
  // tracks go around it. The metadata of the whole chain is held until the walk is done.
  for (std::size_t i = 0; i < n; ++i) {
    chain_link& l = links[i];
    try {
      l.rec = m.get(chain[i]);
    } catch (const std::exception&) {
    }
    problems[i] = m.verify_version(chain[i], true, false, {});
    if (!problems[i].empty()) continue;
    try {
      const std::uint64_t checked = l.rec.obj.id;
      l.rec = m.get(chain[i]);
      l.item = m.meta_of(chain[i]);
      l.walkable = l.rec.obj.id == checked && l.item->obj_id == checked;
      for (const auto& f : l.item->meta->tensors) l.walkable = l.walkable && !f.blocks.empty();
    } catch (const std::exception&) {
      l.walkable = false;
    }
    if (!l.walkable) problems[i] = m.verify_version(chain[i], true, true, {});
  }
  const auto frame = [&](frame_at a) -> const tensor_frame& {
    return links[a.first].item->meta->tensors[a.second];
  };
  const auto tensor = [&](frame_at a) -> const format::tensor_info& {
    return links[a.first].item->meta->layout.tensors.at(frame(a).tensor);
  };

  // A version's frames coded against each tensor of the version before: the tracks' next steps.
  std::vector<std::unordered_map<std::size_t, std::vector<std::size_t>>> successors(n);
  std::vector<std::vector<bool>> taken(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!links[i].walkable) continue;
    const auto& frames = links[i].item->meta->tensors;
    taken[i].assign(frames.size(), false);
    if (i == 0 || !links[i - 1].walkable || links[i].rec.base != chain[i - 1]) continue;
    for (std::size_t k = frames.size(); k-- > 0;)
      if (decodes_from_base(frames[k], tensor({i, k}).length))
        successors[i][frames[k].base_tensor].push_back(k);  // popped from the back: lowest first
  }

  const auto base_damaged = [&](std::size_t i) {
    return i > 0 && !problems[i - 1].empty() && links[i].rec.base == chain[i - 1];
  };
  const auto damaged_base_text = [&](std::size_t i) {
    return "its base version " + std::to_string(chain[i - 1]) + " is damaged";
  };
  // The tracks, from the versions' own checks.
  struct track {
    std::vector<frame_at> frames;
    impl::frame_slabs geometry;
  };
  std::vector<track> tracks;
  for (std::size_t i = 0; i < n; ++i) {
    if (base_damaged(i)) {  // also two or more versions past the damage: nothing to decode
      problems[i] = damaged_base_text(i);
      continue;
    }
    if (!links[i].walkable || !problems[i].empty()) continue;
    for (std::size_t k = 0; k < taken[i].size(); ++k) {
      if (taken[i][k]) continue;
      taken[i][k] = true;
      track tr{{{i, k}}, impl::slabs_of(frame({i, k}), tensor({i, k}))};
      if (!tr.geometry.problem.empty()) {
        problems[i] = tr.geometry.problem;
        continue;
      }
      // The same slab geometry and length all along, else the next version's frame starts a
      // track of its own (reading its base as reads do).
      for (std::size_t j = i + 1; j < n && problems[j].empty(); ++j) {
        auto it = successors[j].find(frame(tr.frames.back()).tensor);
        if (it == successors[j].end() || it->second.empty()) break;
        const frame_at next{j, it->second.back()};
        const auto g = impl::slabs_of(frame(next), tensor(next));
        if (!g.problem.empty() || g.block_bytes != tr.geometry.block_bytes ||
            g.per_slab != tr.geometry.per_slab || tensor(next).length != tensor({i, k}).length)
          break;
        it->second.pop_back();
        taken[j][next.second] = true;
        tr.frames.push_back(next);
      }
      tracks.push_back(std::move(tr));
    }
  }

  // One track at a time, holding an encode slot for one slab across it at a time, so that on a
  // live mount a put's encode gets the slot in between. (Tracks are independent and could be
  // decoded on several threads: a second one gained 3–10% on the 2-core VM, where the walk
  // reads its objects from the disk at about 0.45 GB/s and decodes faster; benchmarks.md,
  // "verify --deep along the chain".)
  // A version's first problem is the one reported.
  const auto note = [&](std::size_t j, std::string text) {
    if (problems[j].empty()) problems[j] = std::move(text);
  };
  const auto walk = [&](const track& tr) {
    const std::uint64_t length = tensor(tr.frames[0]).length;
    const std::uint64_t slab_bytes = tr.geometry.per_slab * tr.geometry.block_bytes;
    std::vector<XXH3_state_t> digests;
    std::size_t alive = tr.frames.size();  // a failure ends the track there
    try {
      digests.resize(tr.frames.size());
      for (auto& d : digests) XXH3_64bits_reset(&d);
      impl::read_guard guard(m);
      std::shared_ptr<const cache_item> base_whole;
      for (std::uint64_t at = 0, b0 = 0; at < length && alive > 0;
           at += slab_bytes, b0 += tr.geometry.per_slab) {
        const encode_slots::lease slot = m.acquire_slot();
        encode_slots::slabs& slab = slot.get();
        const std::size_t bytes = std::size_t(std::min(slab_bytes, length - at));
        std::span<std::byte> below(slab.base.data(), bytes), out(slab.recon.data(), bytes);
        std::uint64_t decoded = 0;
        for (std::size_t t = 0; t < alive; ++t) {
          const std::size_t j = tr.frames[t].first;
          const tensor_frame& f = frame(tr.frames[t]);
          const std::size_t b1 = std::min<std::size_t>(b0 + tr.geometry.per_slab, f.blocks.size());
          try {
            auto bad =
                m.read_indexed_blocks(*links[j].item, f, tensor(tr.frames[t]), b0, b1, slab.enc);
            if (!bad.empty()) {
              note(j, std::move(bad));
              alive = t;
              break;
            }
            if (t > 0) {
              codec::decode(slab.enc, below, out);
            } else if (decodes_from_base(f, length)) {
              m.read_recon_slab(links[j].rec.base, f.base_tensor, at, below, base_whole);
              codec::decode(slab.enc, below, out);
            } else {
              codec::decode(slab.enc, {}, out);
            }
          } catch (const std::exception& e) {
            note(j, e.what());
            alive = t;
            break;
          }
          XXH3_64bits_update(&digests[t], out.data(), out.size());
          std::swap(below, out);  // this version's slab is the next one's base
          decoded += slab.enc.size();
        }
        if (progress) progress(decoded);
      }
    } catch (const std::exception& e) {  // its digests, the slot or the guard: not verified
      note(tr.frames[0].first, e.what());
      alive = 0;
    }
    for (std::size_t t = 0; t < alive; ++t) {
      const tensor_frame& f = frame(tr.frames[t]);
      if (f.digest && XXH3_64bits_digest(&digests[t]) != f.digest)
        note(tr.frames[t].first,
             "tensor '" + tensor(tr.frames[t]).name + "' does not decode to its recorded digest");
    }
  };
  for (const auto& tr : tracks) walk(tr);

  // A damaged version's dependents decode on top of it: damaged too, whatever else they hold
  // (as verify's callers report them).
  for (std::size_t i = 1; i < n; ++i)
    if (base_damaged(i)) problems[i] = damaged_base_text(i);
  return problems;
}

}  // namespace ckpt::fs
