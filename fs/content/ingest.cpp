// The write path: a finished file becomes a version. put() recognises the file, picks the base
// (the lineage's head), encodes exact regions and tensor frames, writes the object and appends
// the version's record.
#include <array>
#include <chrono>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "codec/error.hpp"
#include "codec/format/assemble.hpp"
#include "codec/format/recognise.hpp"
#include "fs/content/content_impl.hpp"
#include "fs/content/data_area.hpp"
#include "fs/content/lineage_key.hpp"

namespace ckpt::fs {

using bytes = std::vector<std::byte>;

// Appends the exact coding of src[offset, offset + length) to `area` as a region, a chunk of
// input at a time. A region longer than spill_bytes goes to the spill file chunk by chunk, so
// memory holds one chunk of it, never the whole encoding.
exact_region content_store::impl::put_exact_region(const format::source& src, std::uint64_t offset,
                                                   std::uint64_t length, data_area& area) const {
  const bool spill = !opt.spill_dir.empty() && length > opt.spill_bytes;
  bytes data;
  exact_region r;
  r.offset = offset;
  r.length = length;
  r.data_at = area.size;
  r.block_bytes = std::uint32_t(kExactBlock);
  std::uint64_t spilled = 0;  // encoded bytes of this region already in the spill file
  bytes chunk;
  for (std::uint64_t at = 0; at < length; at += kExactChunk) {
    const std::uint64_t n = std::min<std::uint64_t>(kExactChunk, length - at);
    chunk.resize(n);
    src.read(offset + at, chunk);
    std::size_t pos = data.size();
    codec::encode_exact_into(codec::dtype::bytes, chunk, data, kExactBlock);
    while (pos < data.size()) {
      r.blocks.push_back(spilled + pos);
      pos += codec::read_block_header(std::span(data).subspan(pos)).total_size();
    }
    if (spill) {
      area.add_spilled(opt.spill_dir, data);
      spilled += data.size();
      data.clear();
    }
  }
  r.encoded_bytes = spilled + data.size();
  if (!spill) area.add(std::move(data));
  return r;
}

// Appends `len` encoded bytes of object `obj` at `at` to `area` (prune's rewrite copies exact
// regions and lossless frames as they are): through the spill file when `may_spill` and longer
// than spill_bytes. Returns their offset in the area.
std::uint64_t content_store::impl::copy_encoded(std::uint64_t obj, std::uint64_t at,
                                                std::uint64_t len, bool may_spill,
                                                data_area& area) const {
  const std::uint64_t pos = area.size;
  if (!may_spill || opt.spill_dir.empty() || len <= opt.spill_bytes) {
    bytes b(len);
    objects.read(obj, at, b);
    area.add(std::move(b));
    return pos;
  }
  bytes b;
  for (std::uint64_t done = 0; done < len; done += b.size()) {
    b.resize(std::min<std::uint64_t>(kExactChunk, len - done));
    objects.read(obj, at + done, b);
    area.add_spilled(opt.spill_dir, b);
  }
  return pos;
}

content_ref content_store::put(std::string_view path, const format::source& src) {
  auto& m = *impl_;
  const std::uint64_t size = src.size();
  if (size == 0) return {};
  format::layout layout = format::recognise(src);
  bool checkpoint = false;
  for (const auto& t : layout.tensors) checkpoint |= t.compress;

  std::uint64_t id = 0, lineage_id = 0, base_id = 0, since = 0;
  std::shared_ptr<std::mutex> encode_mu;
  if (checkpoint) {
    std::lock_guard lock(m.mu);
    const std::uint64_t sig = lineage_signature(layout);
    const std::string key = lineage_path_key(path);
    // A path key that has a lineage continues it; a new one gets its lineage at once (in memory;
    // its record goes with its first version), so that two first puts of one path key meet in
    // the same lineage: the second waits for the first and deltas against it.
    for (const auto& [lid, l] : m.lineages)
      if (l.signature == sig && l.path_key == key) lineage_id = lid;
    if (!lineage_id) {
      lineage_rec l;
      l.id = lineage_id = m.next_lineage++;
      l.signature = sig;
      l.path_key = key;
      l.journaled = false;
      m.lineages.emplace(lineage_id, std::move(l));
    }
    encode_mu = m.lineages.at(lineage_id).encode_mu;
  }
  // One encode at a time per lineage: the next version's base is this one's reconstruction.
  std::unique_lock<std::mutex> lineage_lock;
  if (encode_mu) lineage_lock = std::unique_lock(*encode_mu);
  if (checkpoint) {
    std::lock_guard lock(m.mu);
    const auto& l = m.lineages.at(lineage_id);
    base_id = l.head;
    if (base_id && !m.versions.count(base_id)) base_id = 0;
    since = m.deltas_since_keyframe(base_id);
    if (!l.head) {
      // A lineage's first version: content matching another lineage (a renamed run, temp files
      // with random names) starts from the most recently extended matching head instead of a
      // keyframe.
      const lineage_rec* donor = nullptr;
      for (const auto& [lid, o] : m.lineages)
        if (lid != lineage_id && o.signature == l.signature && o.head && m.versions.count(o.head) &&
            (!donor || o.head > donor->head))
          donor = &o;
      if (donor) {
        base_id = donor->head;
        since = m.deltas_since_keyframe(base_id);
      }
    }
  }
  const bool keyframe = checkpoint && (m.opt.lossless || !base_id ||
                                       since + 1 >= std::uint64_t(m.opt.keyframe_interval));
  if (keyframe) base_id = 0;
  // Pin the base as a dependent from now on: another lineage's head (a forked lineage's base)
  // may move on meanwhile and must not be reclaimed under us. Released if this put fails.
  if (base_id) {
    std::lock_guard lock(m.mu);
    auto it = m.versions.find(base_id);
    if (it == m.versions.end()) {
      base_id = 0;
    } else {
      ++it->second.dependents;
    }
  }
  struct unpin {
    impl& m;
    std::uint64_t base;
    bool armed = true;
    ~unpin() {
      if (!armed || !base) return;
      std::lock_guard lock(m.mu);
      auto it = m.versions.find(base);
      if (it == m.versions.end()) return;
      --it->second.dependents;
      // Into `unneeded`: what made the base unnecessary (a newer head) may not be durable yet.
      m.collect(base, m.unneeded);
    }
  } base_pin{m, base_id};

  version_meta meta;
  meta.size = size;
  meta.created_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  data_area data;
  std::vector<std::shared_ptr<const cache_item>> recons(layout.tensors.size());
  if (!checkpoint) {
    meta.kind = version_kind::exact;
    meta.layout = format::opaque_layout(size, layout.note);
    meta.exact.push_back(m.put_exact_region(src, 0, size, data));
  } else {
    meta.kind = keyframe ? version_kind::keyframe : version_kind::delta;
    meta.bits = keyframe ? 0 : m.opt.bits;
    if (!keyframe) {
      meta.coding.bits = m.opt.bits;
      meta.coding.group = m.opt.paper_coding ? 1 : codec::default_group(m.opt.bits);
      meta.coding.rep = std::string(codec::name(m.opt.rep));
      meta.coding.scope = m.opt.scope == codec::bucket_scope::tensor ? "tensor" : "checkpoint";
      meta.coding.coder = m.opt.paper_coding ? "paper" : "grouped";
      meta.coding.exact_optimizer = m.opt.exact_optimizer;
      meta.coding.relative = m.opt.relative;
    }
    // Exact regions: maximal runs of segments that are not compressed tensors.
    std::uint64_t run_start = 0, run_len = 0;
    for (const auto& s : layout.segments) {
      const bool lossy = s.tensor && layout.tensors[*s.tensor].compress;
      if (lossy) {
        if (run_len) meta.exact.push_back(m.put_exact_region(src, run_start, run_len, data));
        run_start = s.offset + s.length;
        run_len = 0;
      } else {
        if (!run_len) run_start = s.offset;
        run_len += s.length;
      }
    }
    if (run_len) meta.exact.push_back(m.put_exact_region(src, run_start, run_len, data));

    std::shared_ptr<const cache_item> base_meta;
    std::unordered_map<std::string, std::size_t> base_by_name;
    if (base_id) {
      base_meta = m.meta_of(base_id);
      const auto& bl = base_meta->meta->layout;
      for (const auto& f : base_meta->meta->tensors)
        base_by_name[bl.tensors[f.tensor].name] = f.tensor;
    }
    // Tensor by tensor, so that memory holds the write buffer, one tensor's copy and the
    // reconstructions (base tensors leave the cache as their successors arrive). Checkpoint-wide
    // buckets need one statistics pass over every delta first.
    struct job {
      std::size_t tensor;
      codec::dtype type;
      std::optional<std::size_t> base_tensor;
      codec::delta_kind kind = codec::delta_kind::difference;
    };
    std::vector<job> jobs;
    for (std::size_t i = 0; i < layout.tensors.size(); ++i) {
      const auto& t = layout.tensors[i];
      if (!t.compress) continue;
      job j{i, *format::codec_dtype(t.type), std::nullopt};
      if (base_meta && !(m.opt.exact_optimizer && is_optimizer_state(t.name))) {
        if (auto b = base_by_name.find(t.name); b != base_by_name.end()) {
          const auto& bt = base_meta->meta->layout.tensors[b->second];
          if (bt.type == t.type && bt.length == t.length) j.base_tensor = b->second;
        }
      }
      jobs.push_back(j);
    }
    const bool range = m.opt.rep == codec::representative::midrange;
    // Checkpoint scope: one table per delta kind, shared by the tensors of that kind.
    std::optional<std::array<codec::quant_table, 2>> shared_tables;
    if (m.opt.scope == codec::bucket_scope::checkpoint && base_meta) {
      std::array<codec::delta_stats, 2> all;
      for (auto& j : jobs) {
        if (!j.base_tensor) continue;
        const auto& t = layout.tensors[j.tensor];
        const bytes cur = src.read(t.offset, t.length);
        const auto base = m.tensor_recon(base_id, *j.base_tensor);
        const codec::delta_input in{j.type, cur, base->data};
        j.kind = codec::choose_kind(in, m.opt.relative);
        all[int(j.kind)].merge(codec::gather_stats(std::span(&in, 1), range, j.kind));
      }
      shared_tables = {
          codec::select_buckets(all[0], m.opt.bits, m.opt.rep, codec::delta_kind::difference),
          codec::select_buckets(all[1], m.opt.bits, m.opt.rep, codec::delta_kind::ratio)};
    }
    for (const auto& j : jobs) {
      const auto& t = layout.tensors[j.tensor];
      byte_buffer cur(t.length);
      src.read(t.offset, cur);
      tensor_frame f;
      f.tensor = j.tensor;
      f.type = j.type;
      f.data_at = data.size;
      bytes frame;
      auto recon = std::make_shared<cache_item>();
      if (j.base_tensor) {
        const auto base = m.tensor_recon(base_id, *j.base_tensor);
        const codec::delta_input in{j.type, cur, base->data};
        codec::quant_table table;
        if (shared_tables) {
          table = (*shared_tables)[int(j.kind)];
        } else {
          const auto kind = codec::choose_kind(in, m.opt.relative);
          table = codec::select_buckets(codec::gather_stats(std::span(&in, 1), range, kind),
                                        m.opt.bits, m.opt.rep, kind);
        }
        f.mode = tensor_mode::delta;
        f.ratio = table.kind == codec::delta_kind::ratio;
        f.base_tensor = *j.base_tensor;
        recon->data = byte_buffer(cur.size());
        const codec::lossy_params params{
            m.opt.bits, meta.coding.group, m.opt.rep,
            m.opt.paper_coding ? codec::entropy_policy::huffman_only : codec::entropy_policy::best};
        codec::encode_delta_into(in, table, params, recon->data, frame);
        // The superseded base is the likeliest eviction victim; readers of the old version
        // decode it again from its own chain.
        m.cache.erase({base_id, k_tensor, *j.base_tensor});
      } else {
        f.mode = tensor_mode::lossless;
        codec::encode_exact_into(j.type, cur, frame);
        recon->data = std::move(cur);
      }
      f.encoded_bytes = frame.size();
      if (m.opt.block_index) set_block_index(f, frame);
      f.digest = XXH3_64bits(recon->data.data(), recon->data.size());
      data.add(std::move(frame));
      meta.tensors.push_back(f);
      recons[j.tensor] = recon;
    }
    // The served CRC of every rewritten zip member, computed now while the payloads are here.
    if (!layout.fixups.empty()) {
      std::vector<bool> replaced(layout.tensors.size());
      for (std::size_t i = 0; i < replaced.size(); ++i) replaced[i] = recons[i] != nullptr;
      format::served_file sf(layout, src, replaced,
                             [&](std::size_t t, std::uint64_t off, std::span<std::byte> out) {
                               std::memcpy(out.data(), recons[t]->data.data() + off, out.size());
                             });
      std::vector<bool> done(layout.members.size());
      for (const auto& fx : layout.fixups) {
        if (done[fx.member]) continue;
        done[fx.member] = true;
        meta.member_crcs.push_back({fx.member, sf.member_crc(fx.member)});
      }
    }
    meta.layout = std::move(layout);
  }

  std::shared_lock object_gate(m.object_gate);  // until the record names the object
  const store::object_ref obj = write_object(m.objects, meta, data, m.opt.object_format);
  data = {};

  version_rec r;
  r.obj = obj;
  r.size = size;
  r.kind = meta.kind;
  r.format = std::string(format::name(meta.layout.format));
  r.lineage = lineage_id;
  r.base = base_id;
  r.path = std::string(path);
  r.since_keyframe = keyframe ? 0 : since + 1;
  r.created_ns = meta.created_ns;
  r.refs = 1;
  {
    std::lock_guard lock(m.mu);
    // The id is taken here, under the lineage's encode lock: within a lineage, ids follow
    // completion order, which is what replay (and a compacted snapshot) takes the head from.
    id = m.next_version++;
    r.id = id;
    if (lineage_id) {
      auto& l = m.lineages.at(lineage_id);
      if (!l.journaled) {
        m.journal.append(to_bytes(impl::lineage_json(l)));
        l.journaled = true;
      }
    }
    m.journal.append(to_bytes(impl::version_json(r)));
    base_pin.armed = false;  // the pin becomes the new version's dependency on its base
    std::uint64_t old_head = 0;
    if (lineage_id) {
      auto& l = m.lineages.at(lineage_id);
      old_head = l.head;
      l.head = id;
      l.since_keyframe = r.since_keyframe;
    }
    m.versions.emplace(id, std::move(r));
    // A superseded head that nothing else needs goes only after this record is durable.
    if (old_head) m.collect(old_head, m.unneeded);
  }
  // The reconstructions are the next version's bases and the likely next reads.
  for (std::size_t i = 0; i < recons.size(); ++i)
    if (recons[i]) m.cache.put({id, k_tensor, i}, recons[i], recons[i]->data.size());
  return {id, size};
}

}  // namespace ckpt::fs
