// Retention and management: rekey (prune's rewrite of the oldest kept delta as a keyframe),
// verify (checksums, metadata, optionally a full decode against the recorded digests) and garbage
// collection of objects nothing references.
#include <cstring>
#include <map>

#include "codec/error.hpp"
#include "fs/content/content_impl.hpp"
#include "fs/content/content_object.hpp"

namespace ckpt::fs {

using bytes = std::vector<std::byte>;

std::uint64_t content_store::rekey(std::uint64_t v) {
  auto& m = *impl_;
  // No put into this lineage meanwhile (it would read the chain we are changing), and one
  // rekey of a version at a time. The lineage may be joined into another (renamed()) before
  // its lock is ours: then the version's lineage is looked up again.
  version_rec r;
  std::shared_ptr<std::mutex> encode_mu;
  std::unique_lock<std::mutex> lineage_lock;
  for (;;) {
    {
      std::lock_guard lock(m.mu);
      auto it = m.versions.find(v);
      if (it == m.versions.end()) return 0;  // reclaimed meanwhile: nothing to rewrite
      r = it->second;
      if (r.kind != version_kind::delta) return 0;
      auto l = m.lineages.find(r.lineage);
      encode_mu = l != m.lineages.end() ? l->second.encode_mu : nullptr;
    }
    if (!encode_mu) break;
    lineage_lock = std::unique_lock(*encode_mu);
    std::lock_guard lock(m.mu);
    auto it = m.versions.find(v);
    if (it == m.versions.end()) return 0;
    auto l = m.lineages.find(it->second.lineage);
    if (l != m.lineages.end() && l->second.encode_mu == encode_mu) {
      r = it->second;
      break;
    }
    lineage_lock.unlock();
  }
  if (r.kind != version_kind::delta) return 0;

  impl::read_guard guard(m);  // the old object is read until the new one is written
  const auto old = m.meta_of(v);
  if (old->obj_id != r.obj.id) throw corrupt_error("content: version changed during rekey");
  const version_meta& om = *old->meta;
  version_meta meta;
  meta.size = om.size;
  meta.kind = version_kind::keyframe;
  meta.layout = om.layout;
  meta.member_crcs = om.member_crcs;
  meta.created_ns = om.created_ns;
  // Streamed like a put: exact regions and lossless frames are copied encoded, a chunk at a
  // time; deltas become lossless frames of their reconstruction (what the version reads as),
  // decoded and re-encoded a slab at a time.
  const encode_slots::lease slot = m.acquire_slot();
  encode_slots::slabs& slab = slot.get();
  content_object_writer out(m.objects, m.opt.object_format);
  meta.exact_inline = om.exact_inline;
  meta.inline_exact = om.inline_exact;
  for (exact_region x : om.exact) {
    if (om.exact_inline) {  // in the metadata, which goes with it
      meta.exact.push_back(std::move(x));
      continue;
    }
    const std::uint64_t at = out.data_size();
    m.copy_encoded(*old, x.data_at, x.encoded_bytes, out, slab, nullptr);
    x.data_at = at;
    meta.exact.push_back(std::move(x));
  }
  for (tensor_frame f : om.tensors) {
    const std::uint64_t at = out.data_size();
    // A delta frame coded as values in every slab needs no base: its blocks (lc_intra, or raw)
    // are copied, as a keyframe would code that tensor, not recoded exactly at many times the
    // size (rotation's rewrite estimate counts on a rewrite costing about a keyframe).
    const bool values = f.mode == tensor_mode::delta &&
                        f.intra_slabs == slab_count(om.layout.tensors.at(f.tensor).length);
    if (f.mode == tensor_mode::lossless || values) {
      // Frames from before block indexes get one (the copy walks their block headers).
      m.copy_encoded(*old, f.data_at, f.encoded_bytes, out, slab,
                     m.opt.block_index && f.blocks.empty() ? &f : nullptr);
      f.data_at = at;
      f.mode = tensor_mode::lossless;
      f.base_tensor = 0;
    } else {
      const std::uint64_t length = om.layout.tensors.at(f.tensor).length;
      XXH3_state_t digest;
      XXH3_64bits_reset(&digest);
      std::shared_ptr<const cache_item> whole;
      std::uint64_t frame_at = 0;
      f.blocks.clear();
      f.block_elements = 0;
      for (std::uint64_t s = 0; s < length; s += kSlabBytes) {
        const std::size_t n = std::size_t(std::min<std::uint64_t>(kSlabBytes, length - s));
        const std::span<std::byte> recon(slab.recon.data(), n);
        m.read_recon_slab(v, f.tensor, s, recon, whole);
        XXH3_64bits_update(&digest, recon.data(), n);
        slab.enc.clear();
        codec::encode_exact_into(f.type, recon, slab.enc);
        if (m.opt.block_index) index_slab(f, slab.enc, frame_at);
        out.append(slab.enc);
        frame_at += slab.enc.size();
      }
      if (f.digest && XXH3_64bits_digest(&digest) != f.digest)
        throw corrupt_error("content: version " + std::to_string(v) +
                            " does not match its digest; not rewritten");
      f.mode = tensor_mode::lossless;
      f.ratio = false;
      f.intra_slabs = 0;
      f.grid_slabs = 0;
      f.base_tensor = 0;
      f.data_at = at;
      f.encoded_bytes = frame_at;
    }
    // A rounded delta's reconstruction has the bits its blocks kept: so does its keyframe.
    if (f.rounded) meta.coding.keyframe_bits = om.coding.keyframe_bits;
    meta.tensors.push_back(f);
  }

  std::shared_lock object_gate(m.object_gate);
  const store::object_ref obj = out.finish(meta);
  {
    std::lock_guard lock(m.mu);
    auto it = m.versions.find(v);
    if (it == m.versions.end()) {  // reclaimed while we wrote (its names went meanwhile)
      m.unneeded.push_back(obj.id);
      return 0;
    }
    version_rec& cur = it->second;
    if (cur.obj.id != old->obj_id) {  // rewritten meanwhile: ours is not needed
      m.unneeded.push_back(obj.id);
      return 0;
    }
    const std::uint64_t old_obj = cur.obj.id, old_base = cur.base;
    cur.obj = obj;
    cur.kind = version_kind::keyframe;
    cur.base = 0;
    cur.since_keyframe = 0;
    if (m.is_head(cur)) m.lineages.at(cur.lineage).since_keyframe = 0;
    m.journal.append(to_bytes(impl::version_json(cur)));
    m.unneeded.push_back(old_obj);
    if (auto b = m.versions.find(old_base); b != m.versions.end()) {
      --b->second.dependents;
      m.collect(old_base, m.unneeded);
    }
  }
  // Readers see the new object from now on (metadata is cached by object); decoded data is
  // the same bytes and stays cached, and so does a head image (renamed to the new checksum).
  if (m.heads) m.heads->rechecksum(v, obj.checksum);
  return m.objects.disk_bytes(obj.id);
}

void content_store::impl::copy_encoded(const cache_item& from, std::uint64_t at, std::uint64_t len,
                                       content_object_writer& out, encode_slots::slabs& slab,
                                       tensor_frame* index) const {
  if (!index) {
    for (std::uint64_t done = 0; done < len;) {
      const std::size_t n = std::size_t(std::min<std::uint64_t>(kSlabBytes, len - done));
      const std::span<std::byte> buf(slab.cur.data(), n);
      objects.read(from.obj_id, from.data_base + at + done, buf);
      out.append(buf);
      done += n;
    }
    return;
  }
  // Block by block, recording where each starts: a frame is its blocks end to end.
  index->blocks.clear();
  index->block_elements = 0;
  std::byte header[codec::block_header_size];
  for (std::uint64_t pos = 0; pos < len;) {
    if (len - pos < sizeof header) throw corrupt_error("content: a frame ends inside a block");
    objects.read(from.obj_id, from.data_base + at + pos, header);
    const codec::block_header h = codec::read_block_header(header, /*whole_block=*/false);
    if (h.total_size() > len - pos || h.total_size() > slab.cur.capacity())
      throw corrupt_error("content: a block runs past its frame");
    const std::span<std::byte> block(slab.cur.data(), h.total_size());
    objects.read(from.obj_id, from.data_base + at + pos, block);
    if (index->blocks.empty()) index->block_elements = h.elements;
    index->blocks.push_back(pos);
    out.append(block);
    pos += h.total_size();
  }
}

std::string content_store::verify(std::uint64_t v, bool deep,
                                  const std::function<void(std::uint64_t)>& progress) {
  return impl_->verify_version(v, deep, deep, progress);
}

std::string content_store::impl::verify_version(
    std::uint64_t v, bool deep, bool frames, const std::function<void(std::uint64_t)>& progress) {
  auto& m = *this;
  version_rec r;
  try {
    r = m.get(v);
  } catch (const corrupt_error&) {
    return "version " + std::to_string(v) + " is not in the store";
  }
  impl::read_guard guard(m);
  try {
    m.objects.verify(r.obj);
  } catch (const std::exception& e) {
    return "object " + std::to_string(r.obj.id) + ": " + e.what();
  }
  if (progress) progress(r.obj.size);
  try {
    // Parse the metadata from disk (a cached copy would hide damage).
    m.cache.erase({v, k_meta, r.obj.id});
    const auto item = m.meta_of(v);
    if (item->obj_id != r.obj.id) return verify_version(v, deep, frames, progress);  // rewritten
    const version_meta& meta = *item->meta;
    const std::uint64_t area = item->data_bytes;
    if (meta.size != r.size) return "metadata size differs from the record";
    std::shared_ptr<const cache_item> base_meta;
    if (r.base) {
      {
        std::lock_guard lock(m.mu);
        if (!m.versions.count(r.base))
          return "base version " + std::to_string(r.base) + " is missing";
      }
      base_meta = m.meta_of(r.base);
    }
    // Reused regions lie in their donors' objects (exact_extents.cpp): each donor must exist,
    // unless the version is only a donor itself (no name: its own donors were released and it
    // is never read whole), when only its own regions are checked.
    std::map<std::uint64_t, std::shared_ptr<const cache_item>> donor_meta;
    // Inline regions are checked with the metadata (its checksum, decode_meta's tiling).
    std::vector<exact_region> regions;
    for (const auto& x : meta.exact)
      if (!meta.exact_inline && (!x.src || !r.donors_released)) regions.push_back(x);
    bool released_meanwhile = false;
    for (const auto& x : regions) {
      if (!x.src) continue;
      {
        std::lock_guard lock(m.mu);
        if (!m.versions.count(x.src)) {
          // The version lost its last name while this ran (collect() released its donors, and
          // one went): it is a donor only now, whose own regions are all that is read. Checked
          // again with the record as it is now (donors are released once: one more run at most).
          const auto self = m.versions.find(v);
          if (self == m.versions.end() || !self->second.donors_released || r.donors_released)
            return "donor version " + std::to_string(x.src) + " is missing";
          released_meanwhile = true;
        }
      }
      if (released_meanwhile) break;
      if (!donor_meta.count(x.src)) donor_meta[x.src] = m.meta_of(x.src);
    }
    if (released_meanwhile) return verify_version(v, deep, frames, progress);
    const auto owner = [&](const exact_region& x) { return x.src ? donor_meta.at(x.src) : item; };
    for (const auto& x : regions)
      if (x.data_at + x.encoded_bytes > owner(x)->data_bytes)
        return "an exact region lies outside the object";
    for (const auto& f : meta.tensors) {
      if (f.data_at + f.encoded_bytes > area) return "a tensor frame lies outside the object";
      if (f.mode == tensor_mode::delta &&
          (!base_meta || f.base_tensor >= base_meta->meta->layout.tensors.size()))
        return "a delta frame names a base tensor that does not exist";
    }
    if (!deep) return {};
    // Block by block and slab by slab: verifying a 100 GB version holds what a put holds.
    const encode_slots::lease slot = m.acquire_slot();
    encode_slots::slabs& slab = slot.get();
    for (const auto& x : regions) {
      std::uint64_t decoded = 0;
      for (std::size_t b = 0; b < x.blocks.size(); ++b) {
        const std::uint64_t begin = x.blocks[b];
        const std::uint64_t end = b + 1 < x.blocks.size() ? x.blocks[b + 1] : x.encoded_bytes;
        const std::uint64_t want = std::min<std::uint64_t>(x.block_bytes, x.length - decoded);
        if (end < begin || end > x.encoded_bytes || end - begin > kSlabBytes || want > kSlabBytes)
          return "an exact region's block index is damaged";
        const std::span<std::byte> enc(slab.cur.data(), std::size_t(end - begin));
        m.objects.read(owner(x)->obj_id, owner(x)->data_base + x.data_at + begin, enc);
        codec::decode(enc, {}, std::span<std::byte>(slab.recon.data(), std::size_t(want)));
        decoded += want;
      }
      if (decoded != x.length) return "an exact region decodes to the wrong length";
    }
    if (!frames) return {};
    for (const auto& f : meta.tensors) {
      const auto& t = meta.layout.tensors.at(f.tensor);
      if (f.blocks.empty()) {
        // Frames from before block indexes: decoded whole, as they are read.
        byte_buffer enc(f.encoded_bytes);
        m.objects.read(item->obj_id, item->data_base + f.data_at, enc);
        byte_buffer out(t.length);
        if (decodes_from_base(f, t.length)) {  // as reads decode it
          const auto base = m.tensor_recon(r.base, f.base_tensor);
          if (base->data.size() != t.length) return "a delta frame's base has another size";
          codec::decode(enc, base->data, out);
        } else {
          codec::decode(enc, {}, out);
        }
        if (f.digest && XXH3_64bits(out.data(), out.size()) != f.digest)
          return "tensor '" + t.name + "' does not decode to its recorded digest";
        continue;
      }
      // Decode this version's blocks from disk a slab at a time, on top of the same slab of the
      // base's reconstruction (its head image, the cache, or its own chain), into one digest.
      const auto geometry = slabs_of(f, t);
      if (!geometry.problem.empty()) return geometry.problem;
      const std::uint64_t block_bytes = geometry.block_bytes;
      const std::size_t per_slab = geometry.per_slab;
      XXH3_state_t digest;
      XXH3_64bits_reset(&digest);
      std::shared_ptr<const cache_item> base_whole;
      for (std::size_t b0 = 0; b0 < f.blocks.size(); b0 += per_slab) {
        const std::size_t b1 = std::min(b0 + per_slab, f.blocks.size());
        const std::uint64_t at = b0 * block_bytes;
        const std::size_t n =
            std::size_t(std::min<std::uint64_t>(t.length - at, (b1 - b0) * block_bytes));
        if (auto bad = m.read_indexed_blocks(*item, f, t, b0, b1, slab.enc); !bad.empty())
          return bad;
        const std::span<std::byte> out(slab.recon.data(), n);
        if (decodes_from_base(f, t.length)) {  // as reads decode it
          const std::span<std::byte> base(slab.base.data(), n);
          m.read_recon_slab(r.base, f.base_tensor, at, base, base_whole);
          codec::decode(slab.enc, base, out);
        } else {
          codec::decode(slab.enc, {}, out);
        }
        XXH3_64bits_update(&digest, out.data(), out.size());
      }
      if (f.digest && XXH3_64bits_digest(&digest) != f.digest)
        return "tensor '" + t.name + "' does not decode to its recorded digest";
      if (t.length <= kSlabBytes) {
        // The next version in the chain decodes on top of this one (larger tensors decode their
        // bases again slab by slab: bounded memory before speed).
        auto whole = std::make_shared<cache_item>();
        whole->data = byte_buffer(t.length);
        std::memcpy(whole->data.data(), slab.recon.data(), t.length);
        m.cache.put({v, k_tensor, f.tensor}, whole, t.length);
      }
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

content_store::impl::frame_slabs content_store::impl::slabs_of(const tensor_frame& f,
                                                               const format::tensor_info& t) {
  frame_slabs g;
  g.block_bytes = std::uint64_t(f.block_elements) * codec::element_size(f.type);
  if (!g.block_bytes) {
    g.problem = "tensor '" + t.name + "' has an empty block index";
    return g;
  }
  g.per_slab = std::size_t(std::max<std::uint64_t>(1, kSlabBytes / g.block_bytes));
  if (g.per_slab * g.block_bytes > kSlabBytes ||
      f.blocks.size() != (t.length + g.block_bytes - 1) / g.block_bytes)
    g.problem = "tensor '" + t.name + "' has a block index that does not match its size";
  return g;
}

std::string content_store::impl::read_indexed_blocks(const cache_item& item, const tensor_frame& f,
                                                     const format::tensor_info& t, std::size_t b0,
                                                     std::size_t b1, std::vector<std::byte>& enc) {
  const std::uint64_t from = f.blocks[b0];
  const std::uint64_t to = b1 < f.blocks.size() ? f.blocks[b1] : f.encoded_bytes;
  if (to < from || to > f.encoded_bytes)
    return "tensor '" + t.name + "' has a block index that does not match its frame";
  enc.resize(std::size_t(to - from));
  objects.read(item.obj_id, item.data_base + f.data_at + from, enc);
  // A block index that is well-formed but wrong would serve shifted blocks whose own checksums
  // pass: compare it with the blocks' headers.
  const auto fi = codec::index_frame(enc);
  bool same = fi.block_elements == f.block_elements && fi.offsets.size() == b1 - b0;
  for (std::size_t i = 0; same && i < fi.offsets.size(); ++i)
    same = fi.offsets[i] + from == f.blocks[b0 + i];
  if (!same) return "tensor '" + t.name + "' has a block index that does not match its frame";
  return {};
}

std::pair<std::uint64_t, std::uint64_t> content_store::collect_garbage(bool dry_run) {
  auto& m = *impl_;
  std::unique_lock gate(m.object_gate);  // no object between its write and its record
  std::set<std::uint64_t> keep;
  {
    std::lock_guard lock(m.mu);
    for (const auto& [id, r] : m.versions) keep.insert(r.obj.id);
    // Removed after the next journal sync, or taken by a sync in progress: until that sync is
    // durable the journal on disk may still name them.
    keep.insert(m.unneeded.begin(), m.unneeded.end());
    keep.insert(m.removing.begin(), m.removing.end());
    for (const auto& [id, r] : m.graveyard) keep.insert(r.obj.id);
  }
  std::uint64_t count = 0, bytes_freed = 0;
  for (auto id : m.objects.list()) {
    if (keep.count(id)) continue;
    ++count;
    bytes_freed += m.objects.disk_bytes(id);
    if (!dry_run) m.objects.remove(id);
  }
  return {count, bytes_freed};
}

}  // namespace ckpt::fs
