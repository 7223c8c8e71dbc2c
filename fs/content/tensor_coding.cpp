// How a version's tensors are coded: the job each tensor gets (its base tensor, delta or values,
// the bits it keeps), the table each slab gets, and encode_tensor(), which streams one tensor
// into the object a slab at a time with its reconstruction, digests and CRC.
#include <tbb/task_group.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <utility>

#include "codec/error.hpp"
#include "codec/fidelity.hpp"
#include "codec/format/crc32.hpp"
#include "codec/mantissa.hpp"
#include "fs/content/content_impl.hpp"
#include "fs/content/content_object.hpp"
#include "fs/content/lineage_key.hpp"

namespace ckpt::fs {

codec::quant_table table_for(const content_options& opt, const codec::delta_stats& s,
                             codec::delta_kind kind, std::optional<codec::dtype> type,
                             bool second_moment, bool first_moment, bool refresh,
                             std::span<const std::byte> values) {
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
    std::span<std::byte> recon_into, bool base_in_recon,
    std::shared_ptr<const cache_item> base_held) {
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
  // With base_in_recon the base is already where the reconstruction goes (kept_whole::base_here):
  // each element is read before it is overwritten, slab by slab, as the codec's kernels do.
  std::shared_ptr<const cache_item> base_whole;
  if (j.base_tensor && !base_in_recon)
    base_whole = base_held ? std::move(base_held) : cache.get({base_id, k_tensor, *j.base_tensor});
  const std::span<const std::byte> base_bytes =
      base_in_recon ? std::span<const std::byte>(recon_into)
      : base_whole  ? std::span<const std::byte>(base_whole->data)
                    : std::span<const std::byte>();
  const bool base_in_memory = j.base_tensor && (base_in_recon || base_whole);
  if (base_in_memory && base_bytes.size() != t.length)
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
      if (base_tensor) base = base_bytes.subspan(s, n);
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
  // The base's buffer, where nothing but the cache holds the base: out of the cache first (its
  // charge goes), so no reader can get it while the encode overwrites it, then into the new item.
  // Tensor items are made non-const (keep_whole, tensor_recon, rekey) and this is their only
  // holder: moving the buffer out of one is sound. One that cannot give its buffer (a pooled
  // chunk, another length: never a tensor item), or whose new item the cache refuses (pinned
  // fillers hold its budget; putting the base back would be refused alike), is not put back:
  // the encode reads it from base_held, and after the tensor it would have left the cache anyway.
  kept_whole k;
  std::shared_ptr<const cache_item> donor = base ? cache.take_unshared(*base) : nullptr;
  if (donor && (donor->home || donor->data.size() != length)) k.base_held = std::move(donor);
  if (base && !donor && !k.base_held) (void)cache.get(*base);
  auto item = std::make_shared<cache_item>();
  k.pin = cache.put_pinned(key, item, length);
  if (!k.pin) {
    if (donor) k.base_held = std::move(donor);
    return k;
  }
  if (donor) {
    item->data = std::move(const_cast<cache_item&>(*donor).data);
    k.base_here = true;
    kept_in_place_bytes.fetch_add(length, std::memory_order_relaxed);
    k.item = std::move(item);
    return k;
  }
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

}  // namespace ckpt::fs
