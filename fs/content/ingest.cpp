// The write path: a finished file becomes a version. put() recognises the file (headers only),
// picks the base (the lineage's head), and streams the version into its object: exact regions a
// chunk at a time, then each compressed tensor a slab at a time (the slab of the file, the same
// slab of the base's reconstruction, the new reconstruction and its encoding; encode_slots.hpp).
// Neither the file, its encoding nor its reconstruction is ever whole in memory. The version's
// record is appended last.
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

namespace {

// The table a slab coded as `kind` gets: for differences a uniform grid when the mount fixes its
// step (the buckets where the step is not usable: every change zero or beyond fp32), the grid or
// the buckets by estimate with grid=auto (content_options::grid_step), else the buckets, fewer
// of them for intra slabs (fewer still for a first moment: content_options::intra_buckets).
// `type`: the slab's dtype, or nullopt for a table shared by tensors. `second_moment`: ratio
// tables have ratio_bits (content_options::ratio_bits). `values`: a weights' slab (not optimizer
// state), which the weights' error allowance applies to; empty: none.
codec::quant_table table_for(const content_options& opt, const codec::delta_stats& s,
                             codec::delta_kind kind, std::optional<codec::dtype> type,
                             bool second_moment, bool first_moment, bool refresh = false,
                             std::span<const std::byte> values = {}) {
  const int bits = opt.bits_for(kind, second_moment, refresh);
  const auto buckets = [&] {
    return codec::select_buckets(
        s, bits, opt.rep, kind,
        kind == codec::delta_kind::intra ? opt.intra_buckets_for(bits, first_moment) : 0);
  };
  if (kind == codec::delta_kind::difference && opt.grid_step > 0 && bits >= 2) {
    auto g = codec::select_grid(s, bits, opt.grid_step);
    return g.grid ? g : buckets();
  }
  if (kind == codec::delta_kind::difference && auto_grid(opt) && type == codec::dtype::f32)
    return codec::select_difference(s, bits, opt.rep, opt.allowance_for(*type, values, refresh));
  return buckets();
}

}  // namespace

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

std::size_t content_store::impl::shared_slot(codec::delta_kind kind, bool second_moment,
                                             const content_options& opt) noexcept {
  if (kind != codec::delta_kind::ratio) return std::size_t(kind);
  return second_moment && opt.bits_for(kind, true) != opt.bits_for(kind, false) ? 2 : 1;
}

content_store::impl::tensor_result content_store::impl::encode_tensor(
    const format::source& src, const format::tensor_info& t, const tensor_job& j,
    std::uint64_t base_id, const shared_tables_t* shared_tables, const codec::lossy_params& params,
    const slab_source& slabs, content_object_writer& out,
    const std::function<void(std::uint64_t, std::span<const std::byte>)>& recon_sink,
    std::span<std::byte> recon_into) {
  tensor_result res;
  tensor_frame& f = res.frame;
  f.tensor = j.tensor;
  f.type = j.type;
  f.data_at = out.data_size();
  f.mode = j.base_tensor ? tensor_mode::delta : tensor_mode::lossless;
  f.base_tensor = j.base_tensor.value_or(0);
  XXH3_state_t digest;
  XXH3_64bits_reset(&digest);
  const bool range = opt.rep == codec::representative::midrange;
  // A base kept whole in the cache (the save before kept its reconstruction there) is coded
  // against where it is: no copy of each slab, and nothing to read ahead. The same bytes as its
  // head image, where it has one.
  std::shared_ptr<const cache_item> base_whole;
  if (j.base_tensor) base_whole = cache.get({base_id, k_tensor, *j.base_tensor});
  const bool base_in_memory = base_whole != nullptr;
  if (base_in_memory && base_whole->data.size() != t.length)
    throw corrupt_error("content: base size mismatch");
  if (!recon_into.empty() && recon_into.size() != t.length)
    throw std::logic_error("encode_tensor: recon_into is not the tensor's length");
  std::uint64_t frame_at = 0;
  // Read-ahead of the base (below). Declared after what its reads use: the lease waits for a
  // read in flight before it goes.
  std::optional<base_prefetch::lease> ahead =
      j.base_tensor && !base_in_memory && t.length > kSlabBytes ? base_ahead.try_acquire()
                                                                : std::nullopt;
  // The tensor's base, until its first slab shows the base unrelated to it (below).
  std::optional<std::size_t> base_tensor = j.base_tensor;
  for (std::uint64_t s = 0; s < t.length; s += kSlabBytes) {
    const std::size_t n = std::size_t(std::min<std::uint64_t>(kSlabBytes, t.length - s));
    // A stream waits for the slab's bytes before it takes working memory.
    if (slabs.wait && !slabs.wait(t.offset + s + n))
      throw io_error(ECANCELED, "content: the streamed file changed or went");
    std::optional<encode_slots::lease> lease;
    if (!slabs.fixed) lease.emplace(acquire_slot());
    encode_slots::slabs& slab = slabs.fixed ? *slabs.fixed : lease->get();
    const std::span<std::byte> cur(slab.cur.data(), n);
    const std::uint64_t index = s / kSlabBytes;
    const std::span<std::byte> base_buf(ahead ? (*ahead)->buffer(index) : slab.base.data(), n);
    std::span<const std::byte> base = base_buf;
    if (base_in_memory) {
      if (base_tensor) base = std::span<const std::byte>(base_whole->data).subspan(s, n);
      src.read(t.offset + s, cur);
    } else if (ahead && (*ahead)->in_flight()) {  // read while the previous slab was coded
      src.read(t.offset + s, cur);
      (*ahead)->wait();
    } else if (base_tensor) {
      // The slab and its base at once: the base is read from the disk (a published head image,
      // by direct I/O) or decoded, while the slab is copied out of the staged file.
      tbb::task_group g;
      g.run([&] {
        read_recon_slab(base_id, *base_tensor, s, base_buf, base_whole, slabs.retired.get());
      });
      src.read(t.offset + s, cur);
      g.wait();
    } else {
      src.read(t.offset + s, cur);
    }
    std::span<const std::byte> recon = cur;
    // Where a coded slab's reconstruction is made.
    const auto recon_target = [&](std::uint64_t at, std::size_t len) {
      return recon_into.empty() ? std::span<std::byte>(slab.recon.data(), len)
                                : recon_into.subspan(at, len);
    };
    slab.enc.clear();
    // A keyframe's tensor coded as its values (j.values) is intra against zeros: no base
    // needed to read it.
    const codec::delta_input in{j.type, cur, j.values ? std::span(codec::zero_base(), n) : base};
    codec::delta_kind kind = codec::delta_kind::intra;
    // A weights' slab its base predicts worse than zero does is not a change of what the base
    // holds: another model's tensor (a lineage's first version started from a look-alike
    // lineage's head), a layer initialised anew, another model saved over the path. A delta's
    // error scales with its change, so coded against that base, or as values, it would read
    // back with an error as large as its values (59% on two unrelated 4 MiB matrices): it is
    // stored as a keyframe stores it (`as_keyframe`), and when that is the first slab, so is the
    // whole tensor: a frame without a base, which reads without decoding the base's chain.
    // Adam's m (coded as values by design) and tensors whose role is unknown are still coded as
    // values.
    bool as_keyframe = false;
    if (base_tensor && !j.values) {
      kind = codec::choose_kind(in, opt.relative);
      if (kind == codec::delta_kind::difference && codec::prefer_intra(in)) {
        if (j.weights && j.named)
          as_keyframe = true;
        else if (opt.intra && !shared_tables)
          kind = codec::delta_kind::intra;
      }
    }
    if (as_keyframe && s == 0) {
      base_tensor.reset();
      ahead.reset();
      f.mode = tensor_mode::lossless;
      f.base_tensor = 0;
    }
    if (ahead && s + n < t.length) {
      // The next slab's base while this one is coded, into the buffer that held the base of
      // the slab before this one (done).
      const std::uint64_t next = s + n;
      const std::span<std::byte> into(
          (*ahead)->buffer(index + 1),
          std::size_t(std::min<std::uint64_t>(kSlabBytes, t.length - next)));
      (*ahead)->start([this, &base_whole, &j, base_id, next, into, retired = slabs.retired.get()] {
        read_recon_slab(base_id, *j.base_tensor, next, into, base_whole, retired);
      });
    }
    if ((base_tensor || j.values) && !as_keyframe) {
      // Per slab, unless the paper's whole-checkpoint scope shares one table per kind: a table
      // for every 16 MiB of a tensor (the tensor's own for smaller ones) follows large tensors
      // whose parts move differently (DeepSpeed's flat partitions hold every layer).
      const codec::quant_table table =
          shared_tables && !j.values
              ? (*shared_tables)[shared_slot(kind, j.second_moment, opt)]
              : table_for(
                    opt, codec::gather_stats(std::span(&in, 1), range, kind), kind, j.type,
                    j.second_moment, j.first_moment, j.refresh,
                    j.weights ? std::span<const std::byte>(cur) : std::span<const std::byte>());
      res.any_ratio |= table.kind == codec::delta_kind::ratio;
      res.intra_slabs += table.kind == codec::delta_kind::intra;
      res.grid_slabs += table.grid != 0;
      const std::span<std::byte> out_recon = recon_target(s, n);
      codec::lossy_params p = params_for(params, table.kind, j.second_moment, j.refresh);
      p.round_bits = j.keep_bits;
      if (!f.error) f.error.emplace();
      codec::encode_delta_into(in, table, p, out_recon, slab.enc, codec::default_block_bytes,
                               &*f.error);
      recon = out_recon;
    } else if (j.keep_bits) {
      const std::span<std::byte> out_recon = recon_target(s, n);
      codec::round_mantissa(j.type, cur, out_recon, j.keep_bits);
      codec::encode_exact_into(j.type, out_recon, slab.enc);
      recon = out_recon;
      if (!f.error) f.error.emplace();
      f.error->merge(codec::measure_error(j.type, cur, recon));
    } else {
      codec::encode_exact_into(j.type, cur, slab.enc);
      if (as_keyframe && base_tensor) {  // exact in a delta frame: counts in the frame's error
        if (!f.error) f.error.emplace();
        f.error->merge(codec::measure_error(j.type, cur, cur));
      }
    }
    {
      // The digests on another core while this thread appends the encoding and then hands the
      // reconstruction to the sink: one core was idle through these passes (a stream thread
      // spent 40% of its time in them). The append stays on this thread (the object writer's
      // ring takes submissions from one thread), and the sink runs only after it succeeded.
      tbb::task_group g;
      g.run([&] { XXH3_64bits_update(&digest, recon.data(), recon.size()); });
      g.run([&] { res.crc = format::crc32(res.crc, recon); });
      if (opt.block_index) index_slab(f, slab.enc, frame_at);
      out.append(slab.enc);
      frame_at += slab.enc.size();
      if (recon_sink) recon_sink(s, recon);
      g.wait();
    }
    // The base's slab is coded against: its blocks go (a read-ahead of the next is not in it).
    if (slabs.retired && j.base_tensor && slabs.retired->version() == base_id)
      heads->release(slabs.retired,
                     meta_of(base_id)->meta->layout.tensors.at(*j.base_tensor).offset + s, n);
    charge_coding();  // the slab's encoding, read-ahead units and scratch may have grown
  }
  f.encoded_bytes = frame_at;
  f.digest = XXH3_64bits_digest(&digest);
  f.ratio = res.any_ratio;
  f.intra_slabs = res.intra_slabs;
  f.grid_slabs = res.grid_slabs;
  f.rounded = j.keep_bits != 0;
  f.round_bits = j.keep_bits && j.keep_bits != opt.keyframe_bits ? j.keep_bits : 0;
  return res;
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

void content_store::impl::start_coding(version_meta& meta, const base_choice& c) const {
  const bool keyframe = c.keyframe;
  meta.kind = keyframe ? version_kind::keyframe : version_kind::delta;
  meta.bits = keyframe ? 0 : opt.bits;
  if (keyframe) return;
  meta.coding.bits = opt.bits;
  meta.coding.group = opt.paper_coding ? 1 : codec::default_group(opt.bits);
  meta.coding.rep = std::string(codec::name(opt.rep));
  meta.coding.scope = opt.scope == codec::bucket_scope::tensor ? "tensor" : "checkpoint";
  meta.coding.coder = opt.paper_coding ? "paper" : "grouped";
  meta.coding.exact_optimizer = opt.exact_optimizer;
  meta.coding.relative = opt.relative;
  meta.coding.ratio_bits = opt.ratio_bits && opt.ratio_bits != opt.bits ? opt.ratio_bits : 0;
  char step[32];
  std::snprintf(step, sizeof step, "%g", opt.grid_step);
  meta.coding.grid = auto_grid(opt) ? "auto" : opt.grid_step > 0 && opt.bits >= 2 ? step : "off";
  meta.coding.refresh_bits = c.refresh ? codec::max_bits : 0;
  if (auto_grid(opt) && opt.weight_error > 0 && !c.refresh) {
    meta.coding.weight_error = opt.weight_error;
    meta.coding.grid_error = opt.grid_error;
  }
}

void content_store::impl::note_rounding(version_meta& meta) const {
  meta.coding.keyframe_bits = 0;
  for (const auto& f : meta.tensors)
    if (f.rounded) meta.coding.keyframe_bits = opt.keyframe_bits;
}

int rounded_bits_of(const version_meta& meta) {
  // kb is set only where a frame was rounded. Frames that cost the same in a keyframe and in a
  // rewrite do not count: lossless ones that were not rounded (kept exact on purpose, e.g.
  // optimizer=exact; a rewrite copies them as they are) and deltas of a dtype with no more
  // mantissa bits than kb (bf16, f16 at kb 12: never rounded anywhere).
  const int kb = meta.coding.keyframe_bits;
  if (kb <= 0) return 0;
  for (const auto& f : meta.tensors)
    if (f.mode == tensor_mode::delta && !f.rounded && codec::mantissa_bits(f.type) > kb) return 0;
  return kb;
}

std::int64_t values_elements_of(const version_meta& meta) {
  std::int64_t n = 0;
  for (const auto& f : meta.tensors) {
    const std::uint64_t length = meta.layout.tensors.at(f.tensor).length;
    const bool values = f.mode == tensor_mode::delta
                            ? length > 0 && f.intra_slabs == slab_count(length)
                            : f.intra_slabs > 0;  // a keyframe's frame: values, all or nothing
    const std::size_t es = codec::element_size(f.type);
    if (values && es) n += std::int64_t(length / es);
  }
  return n;
}

content_store::impl::kept_whole content_store::impl::keep_whole(const cache_key& key,
                                                                std::uint64_t length,
                                                                std::optional<cache_key> base) {
  if (base) (void)cache.get(*base);
  kept_whole k;
  auto item = std::make_shared<cache_item>();
  k.pin = cache.put_pinned(key, item, length);
  if (!k.pin) return k;
  try {
    item->data = byte_buffer(length);  // charged first: the cache made room for it
  } catch (...) {
    cache.erase(key);  // never an empty item under a tensor's key
    throw;
  }
  k.item = std::move(item);
  return k;
}

std::shared_ptr<const cache_item> content_store::impl::previous_meta(const base_choice& c) {
  // Only lossy keyframes (keyframe_bits): keyframe_bits=0 promises exact ones.
  if (!c.previous || opt.lossless || !opt.intra || !opt.keyframe_bits) return nullptr;
  try {
    return meta_of(c.previous);
  } catch (const std::exception&) {
    return nullptr;  // reclaimed meanwhile: the keyframe is coded without the hint
  }
}

content_store::impl::tensor_job content_store::impl::job_for(
    std::size_t index, const format::tensor_info& t, const cache_item* base_meta,
    const std::unordered_map<std::string, std::size_t>& base_by_name, const cache_item* previous,
    const std::unordered_map<std::string, std::size_t>* previous_by_name) const {
  tensor_job j{index, *format::codec_dtype(t.type), base_tensor_for(t, base_meta, base_by_name)};
  // By what the tensor is: a DCP shard's tensor by its state-dict name (dcp_names.cpp).
  const std::string& role = t.role();
  if (opt.exact_optimizer && is_optimizer_state(role)) j.base_tensor.reset();
  j.second_moment = is_second_moment(role);
  j.first_moment = is_first_moment(role);
  j.weights = !is_optimizer_state(role);
  j.named = !t.state_name.empty() || !is_position_name(t.name);
  const int kb = opt.keyframe_bits;
  // Second moments keep fewer bits on a lossy chain (content_options::moment_bits).
  const int keep = kb && opt.moment_bits && j.second_moment ? std::min(kb, opt.moment_bits) : kb;
  if (!kb || opt.lossless || (opt.exact_optimizer && is_optimizer_state(role)) ||
      kb >= codec::mantissa_bits(j.type))
    return j;
  if (!j.base_tensor) {
    j.keep_bits = keep;  // a lossy keyframe: the frame without a base is rounded
    // ... or coded as values, where the head before it coded every slab of it so, or, with no
    // such head (a lineage's first version, a tensor new to it), where its name says it is a
    // first moment: the deltas after it would code it as values again.
    std::optional<bool> hinted;
    if (previous && previous_by_name) {
      if (const auto p = base_tensor_for(t, previous, *previous_by_name)) {
        const tensor_frame* f = frame_of(*previous, *p);
        hinted = f && f->intra_slabs == slab_count(t.length);
      }
    }
    // Not with the paper's whole-checkpoint tables (scope=checkpoint): its deltas never code
    // values, so the keyframe would be the only lossy m of the chain. Not with
    // keyframe_interval=1: no delta ever says what the tensor is, and every version would
    // follow the first.
    j.values = hinted ? *hinted
                      : opt.intra && opt.scope == codec::bucket_scope::tensor &&
                            opt.keyframe_interval != 1 && is_first_moment(role);
    return j;
  }
  // A delta on a base that has at most kb mantissa bits (a rounded frame of a version written
  // with kb or fewer) rounds its reconstruction too: every version of the chain then has kb
  // bits, and rotation's rewrite of one as a keyframe costs what a lossy keyframe costs.
  // The base frame's own bits where fewer than its version's (moment_bits): rounding to fewer
  // than the base has would move the elements the delta leaves at their base, so never below.
  const version_meta& bm = *base_meta->meta;
  const std::size_t at =
      *j.base_tensor < base_meta->frame_at.size() ? base_meta->frame_at[*j.base_tensor] : 0;
  if (at && bm.tensors[at - 1].rounded && bm.coding.keyframe_bits > 0) {
    const tensor_frame& bf = bm.tensors[at - 1];
    const int base_bits = bf.round_bits ? bf.round_bits : bm.coding.keyframe_bits;
    if (base_bits <= kb) j.keep_bits = std::max(keep, base_bits);
    // A second moment whose base kept more bits than moment_bits starts its own frame here,
    // rounded to moment_bits, instead of carrying those bits to the next keyframe: a DCP shard's
    // first keyframe, stored before the .metadata that names its tensors (dcp_names.cpp), or a
    // chain written with a larger moment_bits. A frame without a base, as in a keyframe: it
    // costs a few bits a float once, where every ratio delta on the wider chain cost more (the
    // language model as DCP shards: benchmarks.md, "v's bits at the first delta that names it").
    if (j.second_moment && keep < base_bits) {
      j.base_tensor.reset();
      j.keep_bits = keep;
    }
  }
  return j;
}

codec::lossy_params content_store::impl::params_for(codec::lossy_params p, codec::delta_kind kind,
                                                    bool second_moment, bool refresh) const {
  const int bits = opt.bits_for(kind, second_moment, refresh);
  if (bits != p.bits) {
    p.bits = bits;
    if (p.group != 1) p.group = codec::default_group(bits);  // 1: the paper's coder keeps it
  }
  return p;
}

codec::lossy_params content_store::impl::coding_params_of(const version_meta& meta) const {
  return {opt.bits, meta.coding.group ? meta.coding.group : codec::default_group(opt.bits), opt.rep,
          opt.paper_coding ? codec::entropy_policy::huffman_only : codec::entropy_policy::best};
}

std::optional<std::size_t> content_store::impl::base_tensor_for(
    const format::tensor_info& t, const cache_item* base_meta,
    const std::unordered_map<std::string, std::size_t>& base_by_name) const {
  if (!base_meta || (opt.exact_optimizer && is_optimizer_state(t.name))) return std::nullopt;
  const auto b = base_by_name.find(t.name);
  if (b == base_by_name.end()) return std::nullopt;
  const auto& bt = base_meta->meta->layout.tensors[b->second];
  if (bt.type != t.type || bt.length != t.length) return std::nullopt;
  return b->second;
}

std::unordered_map<std::string, std::size_t> content_store::impl::tensors_by_name(
    const cache_item& meta) {
  std::unordered_map<std::string, std::size_t> by_name;
  const auto& l = meta.meta->layout;
  for (const auto& f : meta.meta->tensors) by_name[l.tensors[f.tensor].name] = f.tensor;
  return by_name;
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
      tensor_result r =
          m.encode_tensor(src, t, j, base_id, shared_tables ? &*shared_tables : nullptr, params,
                          slab_source{&slab, {}, {}}, out, sink, keep.target());
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
