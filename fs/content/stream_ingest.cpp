// Streaming writes (content_store.hpp, "Streaming writes"): a torch.save file encoded while it is
// written. The stream's thread walks the archive's records as they arrive
// (format::torch_zip_walker), picks the base once data.pkl is in, and codes each tensor the moment
// its bytes are written: the frames go into the version's object, and with head images the
// reconstruction over the staged bytes (the image to be). At the commit (put with the stream) the
// same thread recognises the finished file, checks that it is the archive it walked and that
// nothing it read was rewritten, and then only writes the exact regions and the record: the object
// is written by one thread from start to end (its writer's io_uring accepts one submitter).
// Anything else drops the stream's work: the file is stored as an ordinary put stores it.
//
// A DCP shard (`*.distcp`) is walked archive by archive (format::distcp_walker). Its lineage
// signature needs every tensor, so its base is picked by its path once head_min of its tensors
// are walked (choose_shard_base, which must hold all of them), and its lineage at the commit.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "codec/error.hpp"
#include "codec/format/distcp_stream.hpp"
#include "codec/format/recognise.hpp"
#include "codec/format/torch_stream.hpp"
#include "fs/content/content_impl.hpp"
#include "fs/content/content_object.hpp"
#include "fs/content/lineage_key.hpp"

namespace ckpt::fs {

// What a stream has done so far. The thread writes it; the commit reads it after joining.
class content_store::stream {
 public:
  stream(impl& m, std::string path, std::shared_ptr<staged_file> staged)
      : m_(m),
        path_(std::move(path)),
        distcp_(path_.ends_with(".distcp")),
        staged_(std::move(staged)),
        cache_key_(impl::kStreamCacheKeys | m.stream_cache_keys.fetch_add(1)) {}
  ~stream() {
    stop();
    if (large_) m_.large_saves.fetch_sub(1);
    m_.give_back_image(base_image_);  // put() gave it back already, unless it never ran
    // Reconstructions kept for a version that was not recorded (finish_stream moved the others).
    for (const std::size_t i : retained_) m_.cache.erase({cache_key_, k_tensor, i});
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;

  void stop() {
    if (!thread_.joinable()) return;
    staged_->cancel_stream();
    thread_.join();
  }

  impl& m_;
  const std::string path_;
  const bool distcp_;  // a DCP shard (format::distcp_walker), else one torch.save archive
  const std::shared_ptr<staged_file> staged_;
  std::string commit_path_;  // put()'s path, set before it completes the stream
  // Results, valid once the thread is joined.
  std::string declined_;  // why the stream did nothing (not a case for streaming)
  std::string dropped_;   // why its work was dropped
  std::optional<content_ref> stored_;
  bool walked_ = false;  // every storage record data.pkl named was found and coded
  // Counted in impl::large_saves from when its file is known to make head_min until the stream
  // goes (after the commit): set by the thread, read by the destructor after the join.
  bool large_ = false;
  std::uint64_t lineage_id_ = 0;
  std::uint64_t signature_ = 0;  // of the predicted layout: what chose the lineage
  impl::base_choice bc_;
  std::optional<impl::base_pin> pin_;
  // The base's head image, retired for this stream (head_store::retire): read by it alone and
  // released behind it. Given back by put() once the version is stored (give_back_image).
  std::shared_ptr<head_image> base_image_;
  // Without an image, whole tensors' reconstructions are kept in the cache as a commit keeps
  // them (the next save's base), under this key until the version has its id; by found_ index.
  const std::uint64_t cache_key_;
  std::vector<std::size_t> retained_;
  version_meta meta_;
  std::optional<content_object_writer> out_;
  std::vector<format::tensor_info> found_;                   // the storage records in file order
  std::vector<std::optional<impl::tensor_result>> results_;  // per found_: coded tensors
  std::jthread thread_;                                      // last: started once the rest exists
};

namespace {

constexpr std::uint64_t kUnknownSize = std::uint64_t(1) << 62;  // a stream's file is growing
constexpr std::uint64_t kEverything = ~std::uint64_t(0);        // settle(): the whole file

bool same_tensor(const format::tensor_info& a, const format::tensor_info& b) {
  return a.name == b.name && a.type == b.type && a.shape == b.shape && a.offset == b.offset &&
         a.length == b.length && a.compress == b.compress;
}

}  // namespace

void content_store::impl::run_stream(stream& s) {
  staged_file& staged = *s.staged_;
  try {
    // The walk waits for each header; a tensor's slabs are waited for by encode_tensor before it
    // takes an encode slot, and then read without waiting (never waiting with a slot held).
    const format::source src(kUnknownSize, [&staged](std::uint64_t off, std::span<std::byte> out) {
      if (!staged.await(off + out.size()))
        throw io_error(ECANCELED, "content: the streamed file changed or went");
      staged.read_fully(off, out);
    });
    // A DCP shard's walk looks for the next archive past the end of the last one, which it
    // cannot know is the last before the file is finished: there, what lies past the end reads
    // as zeros (distcp_walker's contract).
    const format::source padded(
        kUnknownSize, [&staged](std::uint64_t off, std::span<std::byte> out) {
          if (staged.await(off + out.size())) return staged.read_fully(off, out);
          if (staged.stale() || !staged.await_complete())
            throw io_error(ECANCELED, "content: the streamed file changed or went");
          const std::uint64_t size = staged.size();
          const std::size_t n =
              off < size ? std::size_t(std::min<std::uint64_t>(out.size(), size - off)) : 0;
          if (n) staged.read_fully(off, out.first(n));
          std::fill(out.begin() + std::ptrdiff_t(n), out.end(), std::byte{0});
        });
    const format::source data(kUnknownSize, [&staged](std::uint64_t off, std::span<std::byte> out) {
      staged.read_fully(off, out);
    });
    // Checkpoints of head_min or more are followed (put()'s rule for making an image), with
    // head images or without.
    const std::uint64_t least = opt.head_min;
    const char* const too_small = "smaller than head_min";
    if (opt.scope != codec::bucket_scope::tensor) {
      s.declined_ = "checkpoint-scope buckets need every tensor first";
      return;
    }
    std::optional<format::torch_zip_walker> walk;
    std::optional<format::distcp_walker> shard;
    std::optional<format::tensor_info> t;
    std::vector<format::tensor_info> held;  // a shard's first tensors, walked before coding
    std::size_t held_next = 0;
    std::uint64_t compressible = 0;  // of the shard's tensors walked so far
    if (s.distcp_) {
      // Its archives one after the other; the lineage (by signature) is known at the commit.
      // Its size is known only at its end: its tensors are walked, not coded, until they make
      // `least` (a smaller shard is left to the commit, as a smaller torch.save file is). The
      // base is then chosen to agree with every compressible tensor walked so far (DCP writes
      // them largest or smallest first, by writer thread count and device). Bytes written
      // meanwhile wait in the write buffer, spilled past its budget, as they would for the
      // commit.
      // Counted as a large save from its start: its size shows only as its tensors are walked,
      // and the ranks saving with it must see it before they look at their bases (a shard that
      // turns out smaller counts until its commit).
      s.large_ = true;
      large_saves.fetch_add(1);
      shard.emplace(padded, opt.recognise());
      while (compressible == 0 || compressible < least) {
        auto u = shard->next();
        if (!u) {
          s.declined_ = compressible ? too_small : "no compressible tensors";
          return;
        }
        if (u->compress) compressible += u->length;
        held.push_back(std::move(*u));
      }
      s.bc_ = choose_shard_base(s.path_, held);
      t = held[held_next++];
    } else {
      walk.emplace(src, opt.recognise());
      if (walk->predicted_bytes(true) < least) {
        s.declined_ = too_small;
        return;
      }
      s.large_ = true;
      large_saves.fetch_add(1);
      // The first record tells the order of the rest: the layout's tensor order, which the
      // lineage signature follows.
      const auto k = walk->next();
      if (!k) {
        s.declined_ = "no storage records";
        return;
      }
      t = walk->predicted()[*k];
      format::layout predicted;
      for (const std::size_t i : walk->record_order())
        predicted.tensors.push_back(walk->predicted()[i]);
      const std::uint64_t sig = lineage_signature(predicted);
      s.signature_ = sig;
      {
        // The lineage lock only while the base is picked: a stream waits for its writer, and a
        // put of the same lineage must not wait for that. Its id is taken at the commit.
        const auto lock = lock_lineage(s.path_, sig, s.lineage_id_);
        s.bc_ = choose_base(s.lineage_id_);
      }
    }
    s.pin_.emplace(*this, s.bc_.base);
    // Without an image (head images off, or a lineage that keeps one file: lineage_rec::single)
    // the reconstruction's other home is the cache, as at a commit: a checkpoint whose
    // compressible bytes fit in half of it keeps its tensors there whole (put()'s rule), the
    // next save's base, read without decoding the chain. A shard's size is known only at its
    // end: its tensors are kept while they fit. Where this save's own base is not in the cache
    // (or it has none: a keyframe) while other large saves run (the ranks of one job saving at
    // once, whose reconstructions may not fit in it together), it keeps a tensor only where the
    // cache has room for it as it is (room_only): pushing out another rank's base would only
    // move the decode through a chain from this rank to that one, at the cost of a copy of
    // every byte. So the ranks share the cache: each save frees its base's tensors as it codes
    // against them, and those saving next to it take the room. To see the ranks that started
    // with it, that is looked at once head_min of the file is written. A base gone while
    // nothing else saves (pushed out by reads, or by a run that has ended) does not keep the
    // lineage out of the cache.
    const bool image = heads && s.bc_.image;
    const bool retain = !image && !(walk && walk->predicted_bytes(true) > cache.budget() / 2);
    bool room_only = false, short_of_room = false;
    if (retain && (!s.bc_.base || !base_in_cache(s.bc_.base))) {
      (void)staged.await(opt.head_min);  // false: the file ended or changed; decided as it is
      room_only = large_saves.load() >= 2;
    }
    std::uint64_t retain_left = retain ? cache.budget() / 2 : 0;
    if (heads && s.bc_.base) s.base_image_ = heads->retire(s.bc_.base);
    const auto next = [&]() -> std::optional<format::tensor_info> {
      if (held_next < held.size()) return held[held_next++];
      if (shard) return shard->next();
      const auto k = walk->next();
      if (!k) return std::nullopt;
      return walk->predicted()[*k];
    };
    start_coding(s.meta_, s.bc_);
    s.out_.emplace(objects, opt.object_format);
    std::shared_ptr<const cache_item> base_meta;
    std::unordered_map<std::string, std::size_t> base_by_name;
    if (s.bc_.base) {
      base_meta = meta_of(s.bc_.base);
      base_by_name = tensors_by_name(*base_meta);
    }
    std::shared_ptr<const cache_item> previous = previous_meta(s.bc_);
    std::unordered_map<std::string, std::size_t> previous_by_name;
    if (previous) previous_by_name = tensors_by_name(*previous);
    const codec::lossy_params params = coding_params_of(s.meta_);
    const slab_source slabs{nullptr, [&staged](std::uint64_t end) { return staged.await(end); },
                            s.base_image_};
    shard_names names;
    if (shard) names = shard_names_of(s.bc_.base ? s.bc_.base : s.bc_.previous);
    for (; t; t = next()) {
      if (shard && t->compress) name_shard_tensor(*t, names);
      const std::size_t index = s.found_.size();
      s.found_.push_back(*t);
      s.results_.emplace_back();
      if (!t->compress) {
        staged.settle(t->offset + t->length);  // kept exact: only the commit reads it
        continue;
      }
      // A shard's tensors are named by position ("item<k>/..."): from the first one its base
      // does not hold with the same dtype and shape on, the shard is no longer the base's
      // model (a changed one), and the rest is coded without a base.
      if (shard && base_meta && !shard_tensor_in(*t, *base_meta, base_by_name)) {
        base_meta.reset();
        base_by_name.clear();
        if (log)
          log(log_level::info,
              "DCP shard " + s.path_ + ": tensor " + t->name +
                  " is not in its base; the rest of the shard is coded without a base");
      }
      // Likewise for a keyframe's hint from the head before it: names are positions.
      if (shard && previous && !shard_tensor_in(*t, *previous, previous_by_name)) {
        previous.reset();
        previous_by_name.clear();
      }
      tensor_job j =
          job_for(index, *t, base_meta.get(), base_by_name, previous.get(), &previous_by_name);
      j.refresh = s.bc_.refresh;
      // Tensors over kRetainTensorMax are never kept whole (put()'s rule); past half the cache
      // (a shard found larger) none from then on.
      if (t->length > retain_left) retain_left = 0;
      // Nothing reads the stream's key but finish_stream.
      kept_whole keep;
      if (retain_left && t->length <= kRetainTensorMax) {
        retain_left -= t->length;
        if (!room_only || cache.bytes() + t->length <= cache.budget())
          keep = keep_whole({s.cache_key_, k_tensor, index}, t->length,
                            j.base_tensor
                                ? std::optional<cache_key>({s.bc_.base, k_tensor, *j.base_tensor})
                                : std::nullopt);
        if (keep.item) {
          s.retained_.push_back(index);
          streams_kept_bytes.fetch_add(t->length);
        } else {
          short_of_room = true;
        }
      }
      // The reconstruction replaces the written bytes only where they become the head image.
      const auto sink = [&](std::uint64_t off, std::span<const std::byte> recon) {
        keep.fill(off, recon);
        if (image && j.rewrites()) staged.overwrite(t->offset + off, recon);
        staged.settle(t->offset + off + recon.size());
      };
      s.results_.back() = encode_tensor(data, *t, j, s.bc_.base, nullptr, params, slabs, *s.out_,
                                        sink, keep.target(), keep.base_here, keep.base_held);
      if (j.base_tensor) cache.erase({s.bc_.base, k_tensor, *j.base_tensor});
      streamed_bytes.fetch_add(t->length);
    }
    if (short_of_room) streams_not_kept.fetch_add(1);
    s.walked_ = shard ? shard->complete() : s.found_.size() == walk->predicted().size();
    // The rest waits for the commit; nothing here reads the buffer before it.
    staged.settle(kEverything);
    if (!staged.await_complete()) {
      s.dropped_ = "the file was not stored";
    } else if (staged.stale()) {
      s.dropped_ = "bytes it had read were rewritten";
    } else if (!s.walked_) {
      s.dropped_ = "records data.pkl names are missing, or an archive could not be ended";
    } else {
      s.stored_ = finish_stream(s, s.commit_path_, s.dropped_);
    }
  } catch (const std::exception& e) {
    // Nothing coded yet (not an archive it can follow, or cut short before its first tensor):
    // declined, the commit stores the file as put() does. Otherwise the work is dropped.
    if (!s.out_)
      s.declined_ = e.what();
    else
      s.dropped_ = e.what();
  }
  if (s.stored_) return;
  // Not stored: the unfinished object goes (on this thread, which wrote it), and the pin.
  s.out_.reset();
  s.pin_.reset();
}

bool content_store::impl::base_in_cache(std::uint64_t base) {
  if (!base) return true;  // a keyframe: no base to miss
  std::uint64_t total = 0, cached = 0;
  const auto& tensors = meta_of(base)->meta->layout.tensors;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].compress || tensors[i].length > kRetainTensorMax) continue;
    total += tensors[i].length;
    if (cache.present({base, k_tensor, i})) cached += tensors[i].length;
  }
  return cached >= total - total / 8;  // most of it: a few tensors evicted do not count
}

void content_store::impl::give_back_image(std::shared_ptr<head_image>& image) noexcept {
  if (!image || !heads) return;
  const std::uint64_t v = image->version();
  if (!heads->unretire(std::move(image))) return;
  std::uint64_t checksum = 0, size = 0;
  {
    std::lock_guard lock(mu);
    const auto it = versions.find(v);
    if (it == versions.end()) return;
    checksum = it->second.obj.checksum;
    size = it->second.size;
  }
  if (log)
    log(log_level::info,
        "head image of version " + std::to_string(v) +
            " is rebuilt from its chain: the save that read it was not stored as its next version");
  if (opt.test_hooks.before_give_back_rebuild) opt.test_hooks.before_give_back_rebuild(v);
  rebuild_head(v, checksum, size);
  // A save that recorded a newer head meanwhile dropped v before this queued its rebuild, or
  // the lineage's last other file went (unref() found no image to drop): asked again now that
  // the job exists, whichever ran first, the image of a version that is no longer its
  // lineage's head, or of a lineage known to keep one file (lineage_rec::single), goes.
  bool stale = false;
  {
    std::lock_guard lock(mu);
    const auto it = versions.find(v);
    stale = it == versions.end() || !is_head(it->second);
    if (!stale && !opt.heads_always)
      if (const auto l = lineages.find(it->second.lineage); l != lineages.end())
        stale = l->second.single;
  }
  if (stale) heads->drop(v);
}

std::optional<content_ref> content_store::impl::finish_stream(stream& s, std::string_view path,
                                                              std::string& why) {
  staged_file& staged = *s.staged_;
  const format::source src(staged.size(), [&staged](std::uint64_t off, std::span<std::byte> out) {
    staged.read_fully(off, out);
  });
  format::layout layout = format::recognise(src, opt.recognise());
  keep_straddling_tensors_exact(layout);
  const auto expected = s.distcp_ ? format::file_format::distcp : format::file_format::torch_zip;
  if (layout.format != expected) {
    why = s.distcp_ ? "the finished file is not a DCP shard of torch archives"
                    : "the finished file is not one torch.save archive";
    return std::nullopt;
  }
  if (layout.tensors.size() != s.found_.size()) {
    why = "the finished archive holds other records than the stream read";
    return std::nullopt;
  }
  for (std::size_t i = 0; i < layout.tensors.size(); ++i) {
    if (!same_tensor(layout.tensors[i], s.found_[i])) {
      why = "tensor " + layout.tensors[i].name + " is not where the stream read it";
      return std::nullopt;
    }
    layout.tensors[i].state_name = s.found_[i].state_name;  // what the stream coded it as
  }

  // The lineage was chosen by the signature of the predicted record order. If the archive came
  // in another order, a keyframe's work is redone if it changed nothing in the buffer; a delta's
  // (with or without head images) and a lossy keyframe's that rounded the buffer are kept (a
  // delta's base, matched by tensor name, is a valid base) and recorded in the lineage of the
  // real signature, where the next put of this file looks for it.
  // A DCP shard's lineage is known only now: its base was chosen by its path.
  const std::uint64_t real_signature = lineage_signature(layout);
  if (s.distcp_) {
    bool other_layout = false;
    {
      std::lock_guard lock(mu);
      s.lineage_id_ = lineage_for(s.path_, real_signature);
      const auto b = versions.find(s.bc_.base);
      if (b != versions.end()) {
        const auto l = lineages.find(current_lineage(b->second.lineage));
        other_layout = l != lineages.end() && l->second.signature != real_signature;
      }
    }
    // Every tensor it coded against the base had its name (its position), dtype and shape
    // there; a base of another signature still means another layout (tensors added or gone,
    // where a commit would have stored a keyframe): said in the log.
    if (other_layout && log)
      log(log_level::info, "DCP shard " + s.path_ + " was coded against version " +
                               std::to_string(s.bc_.base) +
                               ", whose layout differs from the finished shard's");
  } else if (real_signature != s.signature_) {
    if (s.meta_.kind != version_kind::delta && !staged.modified()) {
      why = "its records came in another order than predicted";
      return std::nullopt;
    }
    std::lock_guard lock(mu);
    s.lineage_id_ = lineage_for(s.path_, real_signature);
  }

  version_meta meta = std::move(s.meta_);
  meta.size = src.size();
  meta.created_ns = now_ns();
  content_object_writer& out = *s.out_;
  {
    // Working memory for the rest, given back before the lineage lock is taken (a put takes
    // them in the other order).
    const encode_slots::lease slot = acquire_slot();
    encode_slots::slabs& slab = slot.get();
    write_exact_regions(src, layout, meta, out, slab.enc);
    std::vector<std::uint32_t> tensor_crc(layout.tensors.size());
    std::vector<bool> replaced(layout.tensors.size());
    for (std::size_t i = 0; i < s.results_.size(); ++i) {
      if (!s.results_[i]) continue;
      tensor_crc[i] = s.results_[i]->crc;
      replaced[i] = true;
      meta.tensors.push_back(s.results_[i]->frame);
    }
    note_rounding(meta);
    member_crcs(meta, layout, tensor_crc, replaced, src,
                std::span<std::byte>(slab.cur.data(), kSlabBytes),
                heads && s.bc_.image ? &staged : nullptr);
  }
  meta.layout = std::move(layout);

  // The record under the lineage's lock, as a put's: ids follow completion order. The lineage
  // may have been joined into another meanwhile (renamed()): the version goes where it went.
  std::unique_lock<std::mutex> lineage_lock;
  for (;;) {
    std::shared_ptr<std::mutex> encode_mu;
    {
      std::lock_guard lock(mu);
      s.lineage_id_ = current_lineage(s.lineage_id_);
      const auto it = lineages.find(s.lineage_id_);
      if (it == lineages.end()) {
        why = "its lineage is gone";
        return std::nullopt;
      }
      encode_mu = it->second.encode_mu;
    }
    lineage_lock = std::unique_lock(*encode_mu);
    std::lock_guard lock(mu);
    if (lineages.count(s.lineage_id_)) break;
    lineage_lock.unlock();
  }
  const content_ref ref = record_version(path, std::move(meta), out, 0, s.lineage_id_, s.bc_,
                                         *s.pin_, {}, heads && s.bc_.image ? s.staged_ : nullptr);
  // The kept reconstructions under the version's id (those the cache has not evicted already).
  for (const std::size_t i : s.retained_)
    if (auto item = cache.get({s.cache_key_, k_tensor, i})) {
      const std::uint64_t n = s.found_[i].length;
      cache.erase({s.cache_key_, k_tensor, i});
      cache.put({ref.version, k_tensor, i}, std::move(item), n);
    }
  s.retained_.clear();
  return ref;
}

std::shared_ptr<content_store::stream> content_store::start_stream(
    std::string path, std::shared_ptr<staged_file> staged) {
  auto s = std::make_shared<stream>(*impl_, std::move(path), std::move(staged));
  // Each stream holds a thread (with the codec's scratch once it codes) and an object writer's
  // buffers for as long as its file is written: their number is capped (thread_limits.hpp).
  // A file past the cap is stored by its commit, as one that is not streamed.
  std::uint64_t running = impl_->streams_running.load();
  do {
    if (running >= kMaxStreams) {
      s->declined_ = std::to_string(kMaxStreams) + " files were being streamed already";
      s->staged_->settle(kEverything);  // nothing reads it before the commit: never wait for it
      return s;
    }
  } while (!impl_->streams_running.compare_exchange_weak(running, running + 1));
  try {
    s->thread_ = std::jthread([m = impl_.get(), raw = s.get()] {
      m->run_stream(*raw);
      // Declined, dropped or done: the stream reads nothing more before the commit, so its
      // writer must not wait for it to make room (write_buffer::wait_for_room).
      raw->staged_->settle(kEverything);
      m->streams_running.fetch_sub(1);
    });
  } catch (...) {
    impl_->streams_running.fetch_sub(1);
    throw;
  }
  return s;
}

content_ref content_store::put(std::string_view path, std::shared_ptr<staged_file> staged,
                               std::shared_ptr<stream> s) {
  if (!s || s->staged_ != staged) return put(path, std::move(staged));
  if (s->thread_.joinable()) {
    s->commit_path_ = std::string(path);  // read by the thread once the stream is complete
    staged->complete_stream();
    s->thread_.join();
  }
  staged->end_stream();
  // The base's image, if the stream retired it, once this put has recorded (or failed to record)
  // the version that supersedes it.
  struct give_back {
    impl& m;
    stream& s;
    ~give_back() { m.give_back_image(s.base_image_); }
  } const give_back_after{*impl_, *s};
  if (s->stored_) {
    impl_->streamed_puts.fetch_add(1);
    // Renamed while it was written: the lineage was chosen by the old name; the version joins
    // the new name's lineage as a commit renamed after the fact does.
    // Best effort, as renamed() is: the version is stored whatever happens here.
    if (lineage_path_key(path) != lineage_path_key(s->path_)) {
      try {
        renamed(*s->stored_, path);
      } catch (const std::exception& e) {
        if (impl_->log)
          impl_->log(log_level::error, "lineage of " + std::string(path) +
                                           " not joined after its rename: " + e.what());
      }
    }
    return *s->stored_;
  }
  if (!s->declined_.empty()) {
    impl_->streams_declined.fetch_add(1);
    std::lock_guard lock(impl_->declined_mu);
    impl_->last_declined = s->declined_;
  } else {
    impl_->streams_dropped.fetch_add(1);
    if (impl_->log)
      impl_->log(log_level::info, "streamed encode of " + std::string(path) + " dropped (" +
                                      s->dropped_ + "); storing the finished file instead");
  }
  return put(path, std::move(staged));
}

}  // namespace ckpt::fs
