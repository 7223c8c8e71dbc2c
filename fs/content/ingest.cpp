// The write path: a finished file becomes a version. put() recognises the file (headers only),
// picks the base (the lineage's head: delta_base.cpp), and streams the version into its object:
// exact regions a chunk at a time, then each compressed tensor a slab at a time (the slab of the
// file, the same slab of the base's reconstruction, the new reconstruction and its encoding;
// encode_slots.hpp, tensor_coding.cpp). Neither the file, its encoding nor its reconstruction is
// ever whole in memory. The version's record is appended last (record_version).
#include <tbb/task_group.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <utility>

#include "codec/error.hpp"
#include "codec/fidelity.hpp"
#include "codec/format/crc32.hpp"
#include "codec/format/recognise.hpp"
#include "codec/mantissa.hpp"
#include "fs/content/content_impl.hpp"
#include "fs/content/content_object.hpp"
#include "fs/content/lineage_key.hpp"

namespace ckpt::fs {

using bytes = std::vector<std::byte>;

void keep_straddling_tensors_exact(format::layout& l) {
  for (auto& t : l.tensors) {
    if (!t.compress) continue;
    for (const auto& mem : l.members) {
      const std::uint64_t a = mem.data_offset, b = mem.data_offset + mem.data_length;
      const bool overlaps = t.offset < b && a < t.offset + t.length;
      const bool inside = t.offset >= a && t.offset + t.length <= b;
      if (overlaps && !inside) t.compress = false;
    }
  }
}

exact_region content_store::impl::write_exact_region(const format::source& src,
                                                     std::uint64_t offset, std::uint64_t length,
                                                     content_object_writer& out,
                                                     std::vector<std::byte>& enc) const {
  exact_region r;
  r.offset = offset;
  r.length = length;
  r.data_at = out.data_size();
  r.block_bytes = std::uint32_t(kExactBlock);
  bytes chunk;
  std::uint64_t written = 0;  // encoded bytes of this region so far
  for (std::uint64_t at = 0; at < length; at += kExactChunk) {
    chunk.resize(std::size_t(std::min<std::uint64_t>(kExactChunk, length - at)));
    src.read(offset + at, chunk);
    enc.clear();
    codec::encode_exact_into(codec::dtype::bytes, chunk, enc, kExactBlock);
    for (std::size_t pos = 0; pos < enc.size();) {
      r.blocks.push_back(written + pos);
      pos += codec::read_block_header(std::span(enc).subspan(pos)).total_size();
    }
    out.append(enc);
    written += enc.size();
  }
  r.encoded_bytes = written;
  return r;
}

content_ref content_store::put(std::string_view path, const format::source& src) {
  return impl_->put(path, src, nullptr);
}

content_ref content_store::put(std::string_view path, std::shared_ptr<staged_file> staged) {
  const staged_file& bytes = *staged;
  const format::source src(bytes.size(), [&bytes](std::uint64_t off, std::span<std::byte> out) {
    bytes.read_fully(off, out);
  });
  return impl_->put(path, src, std::move(staged));
}

void content_store::impl::write_exact_regions(const format::source& src,
                                              const format::layout& layout, version_meta& meta,
                                              content_object_writer& out,
                                              std::vector<std::byte>& enc) const {
  // Maximal runs of segments that are not compressed tensors.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;  // offset, length
  std::uint64_t run_start = 0, run_len = 0, total = 0;
  for (const auto& s : layout.segments) {
    const bool lossy = s.tensor && layout.tensors[*s.tensor].compress;
    if (lossy) {
      if (run_len) runs.emplace_back(run_start, run_len);
      run_start = s.offset + s.length;
      run_len = 0;
    } else {
      if (!run_len) run_start = s.offset;
      run_len += s.length;
    }
  }
  if (run_len) runs.emplace_back(run_start, run_len);
  for (const auto& [off, len] : runs) total += len;
  // Few enough bytes: into the metadata, compressed with it as one stream (version_meta's
  // exact_inline). Else block by block into the data area, each read alone.
  if (total <= kInlineExactMax) {
    meta.exact_inline = true;
    meta.inline_exact.resize(std::size_t(total));
    std::uint64_t at = 0;
    for (const auto& [off, len] : runs) {
      src.read(off, std::span(meta.inline_exact).subspan(std::size_t(at), std::size_t(len)));
      exact_region r;
      r.offset = off;
      r.length = len;
      r.data_at = at;
      meta.exact.push_back(std::move(r));
      at += len;
    }
    return;
  }
  for (const auto& [off, len] : runs)
    meta.exact.push_back(write_exact_region(src, off, len, out, enc));
}

void content_store::impl::member_crcs(version_meta& meta, const format::layout& layout,
                                      const std::vector<std::uint32_t>& tensor_crc,
                                      const std::vector<bool>& replaced, const format::source& src,
                                      std::span<std::byte> scratch, staged_file* head) const {
  // The served CRC of every zip member holding a rewritten payload: the member's bytes in
  // order, opaque ones read from the file, each reconstructed tensor's CRC folded in whole.
  std::vector<bool> done(layout.members.size());
  for (const auto& fx : layout.fixups) {
    if (done[fx.member]) continue;
    done[fx.member] = true;
    const auto& mem = layout.members[fx.member];
    const std::uint64_t end = mem.data_offset + mem.data_length;
    std::uint32_t crc = 0;
    bool dirty = false;
    auto it =
        std::upper_bound(layout.segments.begin(), layout.segments.end(), mem.data_offset,
                         [](std::uint64_t v, const format::segment& s) { return v < s.offset; });
    if (it != layout.segments.begin()) --it;
    for (std::uint64_t at = mem.data_offset; at < end; ++it) {
      const std::uint64_t seg_end = it->offset + it->length;
      const std::uint64_t n = std::min(seg_end, end) - at;
      if (it->tensor && replaced[*it->tensor]) {  // whole: straddlers were kept exact
        crc = format::crc32_combine(crc, tensor_crc[*it->tensor], n);
        dirty = true;
      } else {
        for (std::uint64_t done_bytes = 0; done_bytes < n;) {
          const std::size_t k =
              std::size_t(std::min<std::uint64_t>(scratch.size(), n - done_bytes));
          const std::span<std::byte> buf = scratch.first(k);
          src.read(at + done_bytes, buf);
          crc = format::crc32(crc, buf);
          done_bytes += k;
        }
      }
      at += n;
    }
    if (dirty) meta.member_crcs.push_back({fx.member, crc});
  }
  if (!head) return;
  // The CRC fields the served file rewrites (a field written as 0 stays 0).
  for (const auto& fx : layout.fixups) {
    if (fx.original == 0) continue;
    for (const auto& [member, crc] : meta.member_crcs) {
      if (member != fx.member || crc == fx.original) continue;  // lossless: unchanged
      std::byte field[4];
      std::memcpy(field, &crc, 4);  // little-endian
      head->overwrite(fx.field_offset, field);
    }
  }
}

content_ref content_store::impl::put(std::string_view path, const format::source& src,
                                     std::shared_ptr<staged_file> staged) {
  auto& m = *this;
  const std::uint64_t size = src.size();
  if (size == 0) return {};
  format::layout layout = format::recognise(src, opt.recognise());
  keep_straddling_tensors_exact(layout);
  bool checkpoint = false;
  for (const auto& t : layout.tensors) checkpoint |= t.compress;

  std::uint64_t id = 0, lineage_id = 0;
  base_choice bc;
  bool make_head = false;
  std::unique_lock<std::mutex> lineage_lock;
  if (checkpoint) {
    lineage_lock = m.lock_lineage(path, lineage_signature(layout), lineage_id);
    {
      // The id is taken under the lineage's encode lock: within a lineage, ids follow
      // completion order, which is what replay (and a compacted snapshot) takes the head from.
      // Taken now, so that reconstructions can go into the cache under it while they are made
      // (the id is not visible to any reader before the record is appended).
      std::lock_guard lock(m.mu);
      id = m.next_version++;
    }
    bc = m.choose_base(lineage_id);
  }
  base_pin pin{*this, bc.base};  // released if this put fails
  const std::uint64_t base_id = bc.base;
  // Reconstructions kept in the cache under the new id go if the version is not recorded after
  // all (an error anywhere before its record, the object's commit included): nobody could read
  // them, and they would hold the cache until evicted.
  struct unrecorded_keeps {
    impl& m;
    std::uint64_t id;
    std::vector<std::size_t> tensors;
    bool recorded = false;
    ~unrecorded_keeps() {
      if (!recorded)
        for (const std::size_t i : tensors) m.cache.erase({id, k_tensor, i});
    }
  } kept{m, id, {}};

  // The working memory: taken after the lineage lock (a put waiting for its lineage holds none).
  const encode_slots::lease slot = m.acquire_slot();
  encode_slots::slabs& slab = slot.get();

  version_meta meta;
  meta.size = size;
  meta.created_ns = now_ns();
  content_object_writer out(m.objects, m.opt.object_format);
  std::vector<std::uint64_t> donors;  // exact files: versions holding reused blocks
  if (!checkpoint) {
    meta.kind = version_kind::exact;
    meta.layout = format::opaque_layout(size, layout.note);
    donors = m.write_exact_file(src, staged.get(), meta, out, slab.enc);
  } else {
    m.start_coding(meta, bc);
    m.write_exact_regions(src, layout, meta, out, slab.enc);

    std::shared_ptr<const cache_item> base_meta;
    std::unordered_map<std::string, std::size_t> base_by_name;
    if (base_id) {
      base_meta = m.meta_of(base_id);
      base_by_name = tensors_by_name(*base_meta);
    }
    const std::shared_ptr<const cache_item> previous = m.previous_meta(bc);
    std::unordered_map<std::string, std::size_t> previous_by_name;
    if (previous) previous_by_name = tensors_by_name(*previous);
    if (layout.format == format::file_format::distcp) {
      shard_names names = m.shard_names_of(base_id ? base_id : bc.previous);
      for (auto& t : layout.tensors)
        if (t.compress) m.name_shard_tensor(t, names);
    }
    std::vector<tensor_job> jobs;
    std::uint64_t tensor_bytes = 0;
    for (std::size_t i = 0; i < layout.tensors.size(); ++i) {
      const auto& t = layout.tensors[i];
      if (!t.compress) continue;
      jobs.push_back(
          m.job_for(i, t, base_meta.get(), base_by_name, previous.get(), &previous_by_name));
      jobs.back().refresh = bc.refresh;
      tensor_bytes += t.length;
    }
    // Checkpoint scope: one table per delta kind, shared by the tensors of that kind (second
    // moments' ratios apart when ratio_bits differs); one statistics pass over every slab of
    // every delta first.
    std::optional<shared_tables_t> shared_tables;
    if (m.opt.scope == codec::bucket_scope::checkpoint && base_meta) {
      const bool range = m.opt.rep == codec::representative::midrange;
      std::array<codec::delta_stats, 3> all;
      for (const auto& j : jobs) {
        if (!j.base_tensor) continue;
        const auto& t = layout.tensors[j.tensor];
        std::shared_ptr<const cache_item> whole;
        for (std::uint64_t s = 0; s < t.length; s += kSlabBytes) {
          const std::size_t n = std::size_t(std::min<std::uint64_t>(kSlabBytes, t.length - s));
          const std::span<std::byte> cur(slab.cur.data(), n), base(slab.base.data(), n);
          src.read(t.offset + s, cur);
          m.read_recon_slab(base_id, *j.base_tensor, s, base, whole);
          const codec::delta_input in{j.type, cur, base};
          const auto kind = codec::choose_kind(in, m.opt.relative);
          all[shared_slot(kind, j.second_moment, m.opt)].merge(
              codec::gather_stats(std::span(&in, 1), range, kind));
        }
      }
      shared_tables = {
          table_for(m.opt, all[0], codec::delta_kind::difference, std::nullopt, false, false),
          table_for(m.opt, all[1], codec::delta_kind::ratio, std::nullopt, false, false),
          table_for(m.opt, all[2], codec::delta_kind::ratio, std::nullopt, true, false)};
    }
    const codec::lossy_params params = m.coding_params_of(meta);
    // A large checkpoint's staged bytes become its head image: each delta tensor's payload is
    // overwritten with its reconstruction as it is made (a lossless one already is its own), the
    // CRC fields below. Small checkpoints instead keep their reconstruction in the cache, a
    // whole tensor at a time: it is the next version's base and the likeliest next read.
    make_head = m.heads && staged && tensor_bytes >= m.opt.head_min && bc.image;
    const bool retain = !make_head && tensor_bytes <= m.cache.budget() / 2;
    std::vector<std::uint32_t> tensor_crc(layout.tensors.size());
    std::vector<bool> replaced(layout.tensors.size());
    kept.tensors.reserve(jobs.size());  // no allocation between a keep and its note
    for (const auto& j : jobs) {
      const auto& t = layout.tensors[j.tensor];
      // Nobody reads the version before its record exists.
      impl::kept_whole keep;
      if (retain && t.length <= kRetainTensorMax) {
        keep = m.keep_whole({id, k_tensor, j.tensor}, t.length,
                            j.base_tensor
                                ? std::optional<cache_key>({base_id, k_tensor, *j.base_tensor})
                                : std::nullopt);
        if (keep.item) kept.tensors.push_back(j.tensor);
      }
      const auto sink = [&](std::uint64_t off, std::span<const std::byte> recon) {
        keep.fill(off, recon);
        if (make_head && j.rewrites()) staged->overwrite(t.offset + off, recon);
      };
      tensor_result r = m.encode_tensor(
          src, t, j, base_id, shared_tables ? &*shared_tables : nullptr, params,
          slab_source{&slab, {}, {}}, out, sink, keep.target(), keep.base_here, keep.base_held);
      // The superseded base is the likeliest eviction victim; readers of the old version
      // decode it again from its own chain.
      if (j.base_tensor) m.cache.erase({base_id, k_tensor, *j.base_tensor});
      tensor_crc[j.tensor] = r.crc;
      replaced[j.tensor] = true;
      meta.tensors.push_back(r.frame);
    }
    m.note_rounding(meta);
    m.member_crcs(meta, layout, tensor_crc, replaced, src,
                  std::span<std::byte>(slab.cur.data(), kSlabBytes),
                  make_head ? staged.get() : nullptr);
    meta.layout = std::move(layout);
  }
  const content_ref ref =
      m.record_version(path, std::move(meta), out, id, lineage_id, bc, pin, std::move(donors),
                       make_head ? std::move(staged) : nullptr);
  kept.recorded = true;
  if (!checkpoint) m.note_dcp_metadata(path, src);
  return ref;
}

content_ref content_store::impl::record_version(std::string_view path, version_meta meta,
                                                content_object_writer& out, std::uint64_t id,
                                                std::uint64_t lineage_id, const base_choice& bc,
                                                base_pin& pin, std::vector<std::uint64_t> donors,
                                                std::shared_ptr<staged_file> head) {
  auto& m = *this;
  // A delta's metadata is compressed against its base's inline exact bytes (the zip records
  // and pickle it repeats nearly byte for byte; content_object.hpp). The pin keeps the base.
  std::shared_ptr<const cache_item> base_meta;
  std::span<const std::byte> dictionary;
  if (meta.kind == version_kind::delta && bc.base && meta.exact_inline) {
    base_meta = m.meta_of(bc.base);
    dictionary = base_meta->meta->inline_exact;
  }
  std::shared_lock object_gate(m.object_gate);  // until the record names the object
  const store::object_ref obj = out.finish(meta, dictionary);

  std::uint64_t superseded = 0;
  bool rebuild = false;
  version_rec r;
  r.obj = obj;
  r.size = meta.size;
  r.kind = meta.kind;
  r.format = std::string(format::name(meta.layout.format));
  r.lineage = lineage_id;
  r.base = bc.base;
  r.path = std::string(path);
  r.since_keyframe = bc.keyframe ? 0 : bc.since + 1;
  r.created_ns = meta.created_ns;
  r.refs = 1;
  r.donors = donors;
  r.rounded_bits = rounded_bits_of(meta);
  r.values_elements = values_elements_of(meta);
  // An image found not wanted under mu is let go after it: its staged bytes may hold a reader
  // of the base, whose pin let go takes mu.
  std::shared_ptr<staged_file> unwanted_head;
  {
    std::lock_guard lock(m.mu);
    // The donors are pinned by the staged file's reader (of the version it was opened over, which
    // in turn depends on its own donors): they exist. They become this version's dependencies.
    for (const std::uint64_t d : donors)
      if (!m.versions.count(d)) throw corrupt_error("content: a donor version vanished");
    if (!id) id = m.next_version++;  // exact files: no lineage, no order to keep
    r.id = id;
    if (lineage_id) {
      auto& l = m.lineages.at(lineage_id);
      if (!l.journaled) {
        m.journal.append(to_bytes(lineage_json(l)));
        l.journaled = true;
      }
    }
    if (!r.donors.empty() && !m.shared_extents) {
      m.journal.append(to_bytes(feature_json(kFeatureSharedExtents)));
      m.shared_extents = true;
    }
    m.journal.append(to_bytes(version_json(r)));
    pin.armed = false;  // the pin becomes the new version's dependency on its base
    std::uint64_t old_head = 0;
    if (lineage_id) {
      auto& l = m.lineages.at(lineage_id);
      old_head = l.head;
      l.head = id;
      l.since_keyframe = r.since_keyframe;
    }
    if (lineage_id) r.dcp_items = m.take_pending_dcp(r.path);
    m.versions.emplace(id, std::move(r));
    if (lineage_id && m.heads && !bc.image) ++m.saves_without_image;
    for (const std::uint64_t d : donors) ++m.versions.at(d).dependents;
    // A superseded head that nothing else needs goes only after this record is durable.
    if (old_head) m.collect(old_head, m.unneeded);
    superseded = old_head;
    // A save over the lineage's only live file (its name truncated at open: `torch.save` over
    // one last.pt) leaves this version the only one: no image (image_pays). Where the old file
    // still has its name here (a tmp file renamed over it next), unref() drops the image then.
    // Either way the lineage's next saves make no image (lineage_rec::single).
    if (lineage_id && m.heads && !m.opt.heads_always && meta.size >= m.opt.head_min) {
      auto& l = m.lineages.at(lineage_id);
      if (bc.image) {
        if (old_head && !m.image_pays(lineage_id, id)) {
          unwanted_head = std::move(head);
          l.single = true;
        }
      } else if (m.image_pays(lineage_id, id, old_head)) {
        // Saved without an image, and a file older than the one this save supersedes (which a
        // rotation right after the save deletes: save_total_limit=1) still lives: the lineage
        // keeps more than one file now. Its image is made from the chain, after this record.
        l.single = false;
        rebuild = true;
      }
    }
  }
  const bool imaged = head || rebuild;
  if (m.opt.test_hooks.after_record) m.opt.test_hooks.after_record(id);
  if (head) m.heads->adopt(id, obj.checksum, std::move(head));
  if (rebuild) m.rebuild_head(id, obj.checksum, meta.size);
  // The superseded file's unref() may have run between the record and the adoption above (the
  // file system commits the new name, syncs the journal and unrefs the old version on other
  // threads): its drop found no image yet. Asked again now that the image exists, whichever ran
  // first, an image that does not pay goes.
  if (imaged && superseded) {
    std::uint64_t drop_image = 0;
    {
      std::lock_guard lock(m.mu);
      drop_image = m.image_unpaid(lineage_id);
    }
    if (drop_image) m.heads->drop(drop_image);
  }
  // The previous head's image goes: its version now decodes through its chain like any other.
  if (superseded && m.heads) m.heads->drop(superseded);
  // Its reconstruction leaves the cache too. A delta dropped its base's tensor by tensor above;
  // a keyframe (every version with -o lossless, every keyframe_interval-th otherwise) was not
  // coded against the head it supersedes, which would otherwise stay, one checkpoint per
  // version, until cache= is full. The versions of a lineage have the same tensors (its
  // signature), so this version's tensor indices are the superseded head's.
  if (superseded)
    for (std::size_t i = 0; i < meta.layout.tensors.size(); ++i)
      m.cache.erase({superseded, k_tensor, i});
  return {id, meta.size};
}

}  // namespace ckpt::fs
