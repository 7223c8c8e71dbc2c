// The read path: open() and the reader of one version. Exact files are served from their zstd
// blocks; checkpoints through served-file assembly with the reconstructed tensors, decoded a chunk
// of blocks at a time through their base chains, ahead of the reader by background workers.
#include <algorithm>
#include <cstring>

#include "codec/error.hpp"
#include "codec/format/assemble.hpp"
#include "codec/format/read_order.hpp"
#include "codec/scratch.hpp"
#include "fs/content/content_impl.hpp"
#include "fs/content/content_object.hpp"
#include "fs/content/read_ahead.hpp"

#include <tbb/task_arena.h>

namespace ckpt::fs {

namespace {

// The per-thread buffer frames are read into (direct I/O) before they are decoded, counted with
// the codec's per-thread scratch (codec/scratch.hpp): every thread that reads frames keeps one
// for its life, so it stays within a chunk's frame; larger frames are read into their own.
constexpr std::uint64_t kFrameScratchMax = kChunkBlocks * codec::default_block_bytes;
struct frame_scratch {
  byte_buffer buf;
  codec::scratch_account account;
  void note() noexcept { account.set(buf.capacity()); }
};

// What warm_base_metas asks the disk for ahead of a cold chain (object_store::prefetch): objects
// up to this size whole, larger ones their metadata trailer's last this many bytes.
constexpr std::uint64_t kPrefetchTail = std::uint64_t(1) << 20;

// Runs `decode` of a frame whose metadata says it needs no base (a keyframe's frame, or a delta's
// whose every slab was coded as values): a block in it that needs one is damage in the store
// (EIO), not a caller's mistake (EINVAL).
template <class Decode>
void decode_stored(bool without_base, Decode decode) {
  try {
    decode();
  } catch (const invalid_argument& e) {
    if (!without_base) throw;
    throw corrupt_error(
        std::string("content: a frame without a base has a block that needs one (") + e.what() +
        ")");
  }
}

}  // namespace

using bytes = std::vector<std::byte>;

void content_store::impl::prefetch(std::vector<prefetch_job> jobs) {
  if (jobs.empty()) return;
  {
    std::lock_guard lock(prefetch_mu);
    for (auto& j : jobs) {
      if (prefetch_queue.size() >= kPrefetchQueueMax) break;
      prefetch_queue.push_back(std::move(j));
      prefetch_jobs.fetch_add(1);
    }
  }
  prefetch_cv.notify_all();
}

void content_store::impl::prefetch_loop(std::stop_token stop) {
  for (;;) {
    prefetch_job job;
    {
      std::unique_lock lock(prefetch_mu);
      if (!prefetch_cv.wait(lock, stop, [&] { return !prefetch_queue.empty(); })) return;
      job = std::move(prefetch_queue.front());
      prefetch_queue.pop_front();
    }
    struct done {
      std::atomic<std::uint64_t>& jobs;
      ~done() { jobs.fetch_sub(1); }
    } const counted{prefetch_jobs};
    if (job.alive.expired()) continue;  // its reader is gone
    try {
      if (job.chunk == whole_tensor)
        tensor_recon(job.version, job.tensor);
      else if (!cache.get({job.version, k_tensor, job.tensor}))  // not already whole
        chunk_recon(job.version, job.tensor, job.chunk, job.bytes, false);
    } catch (...) {
      // The reader's own request reports the error; a version may also have been reclaimed.
    }
    charge_coding();
  }
}

std::shared_ptr<const cache_item> content_store::impl::meta_of(std::uint64_t v) {
  read_guard guard(*this);
  const version_rec r = get_for_read(v);
  // Keyed by object: a rewritten version's new metadata never meets its old object.
  return cache.get_or_load({v, k_meta, r.obj.id}, [&] {
    // A delta's metadata may be compressed against its base's inline exact bytes, which no
    // rewrite of the base changes (content_object.hpp). Held until the header is read.
    std::shared_ptr<const cache_item> base_meta;
    const metadata_dictionary dictionary = [&]() -> std::span<const std::byte> {
      // A base is always an older version: a record that says otherwise is damage, and the
      // loads below must not wait on themselves.
      if (!r.base || r.base >= v)
        throw corrupt_error("content: version " + std::to_string(v) +
                            " names a metadata dictionary but no older base");
      warm_base_metas(r.base);
      base_meta = meta_of(r.base);
      return base_meta->meta->inline_exact;
    };
    content_header h = read_content_header(objects, r.obj, dictionary);
    auto item = std::make_shared<cache_item>();
    item->meta = std::move(h.meta);
    item->frame_at.assign(item->meta->layout.tensors.size(), 0);
    for (std::size_t i = 0; i < item->meta->tensors.size(); ++i)
      item->frame_at[item->meta->tensors[i].tensor] = std::uint32_t(i + 1);
    item->data_base = h.data_base;
    item->data_bytes = h.data_bytes;
    item->obj_id = r.obj.id;
    item->base = r.base;
    return std::pair{
        std::shared_ptr<const cache_item>(item),
        // meta_bytes counts the inline exact bytes, which are held once.
        std::uint64_t((h.meta_bytes -
                       std::min<std::uint64_t>(h.meta_bytes, item->meta->inline_exact.size())) *
                          4 +
                      256 + item->meta->inline_exact.size())};
  });
}

void content_store::impl::warm_base_metas(std::uint64_t base) {
  // The uncached versions from `base` down its chain, then loaded oldest first: each finds its
  // own base's metadata cached, so a cold chain of any length is read one level deep, not by
  // recursion as deep as the chain (keyframe_interval goes to 10^6).
  std::vector<std::uint64_t> cold;
  std::vector<store::object_id> objs;
  for (std::uint64_t b = base; b;) {
    const version_rec br = get_for_read(b);
    if (cache.get({b, k_meta, br.obj.id})) break;
    cold.push_back(b);
    objs.push_back(br.obj.id);
    if (br.base >= b) break;  // damage: meta_of says so when it comes to it
    b = br.base;
  }
  // The disk reads them all at once while the loop below inflates them one by one (a small
  // checkpoint's chain runs to 1000 versions: keyframe_interval=auto). Small objects whole: the
  // frames a cold read decodes next are in them too.
  if (objs.size() > 1) objects.prefetch(objs, kPrefetchTail);
  for (auto it = cold.rbegin(); it != cold.rend(); ++it) meta_of(*it);
}

byte_buffer content_store::impl::read_data(std::uint64_t v, const cache_item& m, std::uint64_t at,
                                           std::uint64_t len) {
  byte_buffer out(len);
  (void)v;
  objects.read(m.obj_id, m.data_base + at, out);
  return out;
}

std::shared_ptr<const cache_item> content_store::impl::exact_block(std::uint64_t v,
                                                                   std::size_t region,
                                                                   std::size_t block) {
  read_guard guard(*this);
  return cache.get_or_load({v, k_block, (std::uint64_t(region) << 32) | block}, [&] {
    auto m = meta_of(v);
    const exact_region& r = m->meta->exact.at(region);
    const std::uint64_t begin = r.blocks.at(block);
    const std::uint64_t end = block + 1 < r.blocks.size() ? r.blocks[block + 1] : r.encoded_bytes;
    if (end < begin) throw corrupt_error("content: block index");
    // A reused block lives in its donor's object (exact_extents.cpp).
    const auto owner = r.src ? meta_of(r.src) : m;
    const byte_buffer enc = read_data(r.src ? r.src : v, *owner, r.data_at + begin, end - begin);
    const std::uint64_t first = std::uint64_t(block) * r.block_bytes;
    auto item = std::make_shared<cache_item>();
    item->data = byte_buffer(std::min<std::uint64_t>(r.block_bytes, r.length - first));
    codec::decode(enc, {}, item->data);
    return std::pair{std::shared_ptr<const cache_item>(item), std::uint64_t(item->data.size())};
  });
}

// Reads bytes of the exact regions. A checkpoint's regions cover every byte that is not a coded
// tensor, so a read outside them is damage; an exact file's gaps are holes and read as zeros.
void content_store::impl::read_exact(std::uint64_t v, const version_meta& meta,
                                     std::uint64_t offset, std::span<std::byte> out) {
  const auto& regions = meta.exact;
  const bool holes = meta.kind == version_kind::exact;
  auto it = std::upper_bound(regions.begin(), regions.end(), offset,
                             [](std::uint64_t o, const exact_region& r) { return o < r.offset; });
  while (!out.empty()) {
    const bool inside =
        it != regions.begin() && offset < std::prev(it)->offset + std::prev(it)->length;
    if (!inside) {
      if (!holes) throw corrupt_error("content: read outside stored regions");
      // A hole up to the next region (or the end of the read).
      const std::uint64_t next = it == regions.end() ? UINT64_MAX : it->offset;
      const std::size_t n = std::size_t(std::min<std::uint64_t>(out.size(), next - offset));
      std::memset(out.data(), 0, n);
      out = out.subspan(n);
      offset += n;
      if (it != regions.end() && it->offset <= offset) ++it;  // into the region: `it` is past it
      continue;
    }
    const exact_region& r = *std::prev(it);
    const std::size_t ri = std::size_t(std::prev(it) - regions.begin());
    const std::uint64_t in_region = offset - r.offset;
    if (meta.exact_inline) {  // in the metadata (decode_meta checked that it tiles the bytes)
      const std::size_t n = std::size_t(std::min<std::uint64_t>(out.size(), r.length - in_region));
      std::memcpy(out.data(), meta.inline_exact.data() + r.data_at + in_region, n);
      out = out.subspan(n);
      offset += n;
      if (it != regions.end() && it->offset <= offset) ++it;
      continue;
    }
    const std::size_t block = std::size_t(in_region / r.block_bytes);
    const std::uint64_t in_block = in_region % r.block_bytes;
    const auto b = exact_block(v, ri, block);
    const std::size_t n =
        std::size_t(std::min<std::uint64_t>(out.size(), b->data.size() - in_block));
    std::memcpy(out.data(), b->data.data() + in_block, n);
    out = out.subspan(n);
    offset += n;
    // Past this region: `it` moves on only if the next region starts here (else a hole does).
    if (it != regions.end() && it->offset <= offset) ++it;
  }
}

// The reconstruction of tensor `t` (index into the version's layout) of version v, decoding
// the chain back to its keyframe when the cache no longer has the base.
std::shared_ptr<const cache_item> content_store::impl::tensor_recon(std::uint64_t v,
                                                                    std::size_t t) {
  read_guard guard(*this);  // the whole chain decode
  return cache.get_or_load({v, k_tensor, t}, [&] {
    auto item = std::make_shared<cache_item>();
    item->data = materialize(v, t);
    const std::uint64_t bytes = item->data.size();
    return std::pair{std::shared_ptr<const cache_item>(item), bytes};
  });
}

// The reconstruction of tensor t of version v in a buffer the caller owns. A chain whose base is
// not cached is decoded into one buffer, every delta applied in place (each element is read
// and written at the same index), instead of a fresh buffer per link: fresh pages cost the
// kernel more to fault in and zero than the decoding itself.
byte_buffer content_store::impl::materialize(std::uint64_t v, std::size_t t) {
  if (auto c = cache.get({v, k_tensor, t})) {
    byte_buffer copy(c->data.size());
    std::memcpy(copy.data(), c->data.data(), copy.size());
    return copy;
  }
  auto m = meta_of(v);
  const tensor_frame* f = frame_of(*m, t);
  if (!f) throw corrupt_error("content: tensor has no frame");
  const std::uint64_t length = m->meta->layout.tensors.at(t).length;
  // An indexed chain is decoded a chunk at a time into the one output buffer: the frames are
  // read a chunk at a time too, so the per-thread scratch stays a chunk's size instead of
  // growing to the largest frame ever read (and staying there).
  if (const std::uint64_t cb = chain_chunk_bytes(v, t)) {
    byte_buffer whole(length);
    for (std::uint64_t at = 0, c = 0; at < length; at += cb, ++c)
      decode_chunk_into(v, t, std::size_t(c),
                        std::span<std::byte>(whole).subspan(at, std::min(cb, length - at)), true);
    return whole;
  }
  byte_buffer out;
  std::shared_ptr<const cache_item> cached_base;
  const bool from_base = decodes_from_base(*f, length);
  if (from_base) {
    const std::uint64_t base_id = m->base;
    cached_base = cache.get({base_id, k_tensor, f->base_tensor});
    out = cached_base ? byte_buffer(length) : materialize(base_id, f->base_tensor);
    if ((cached_base ? cached_base->data.size() : out.size()) != length)
      throw corrupt_error("content: base size mismatch");
  } else {
    out = byte_buffer(length);
  }
  // Read the frame only now: the recursion above reuses the same per-thread scratch. After a
  // remount frames are cold: the disk writes them into the scratch without a page-cache copy.
  // A frame larger than a chunk's gets a buffer of its own, freed after its decode.
  thread_local frame_scratch scratch;
  byte_buffer own;
  const std::span<const std::byte> enc =
      objects.read_uncached(m->obj_id, m->data_base + f->data_at, f->encoded_bytes,
                            f->encoded_bytes <= kFrameScratchMax ? scratch.buf : own);
  scratch.note();
  if (from_base) {
    codec::decode(enc,
                  cached_base ? std::span<const std::byte>(cached_base->data)
                              : std::span<const std::byte>(out),
                  out);
  } else {
    decode_stored(true, [&] { codec::decode(enc, {}, out); });
  }
  return out;
}

// Chunk c of tensor t of version v (payload bytes [c * chunk_bytes, ...) of a frame with a
// block index), decoded through its chain a chunk at a time.
// `parallel`: decode the chunk's blocks on oneTBB's workers (a reader waiting for it) or on the
// calling thread alone (the read-ahead workers, which already run one decode per core).
std::shared_ptr<const cache_item> content_store::impl::chunk_recon(std::uint64_t v, std::size_t t,
                                                                   std::size_t c,
                                                                   std::uint64_t bytes,
                                                                   bool parallel) {
  read_guard guard(*this);  // the whole chain decode
  const cache_key key{v, k_chunk, chunk_index(t, c)};
  return chunks.get_or_load(key, [&] {
    decodes.chunk(cache_key_hash{}(key), bytes);
    auto item = std::make_shared<cache_item>();
    item->home = chunk_pool;  // also when decoding throws
    item->data = chunk_pool->take(bytes);
    decodes.frames(decode_chunk_into(v, t, c, item->data, parallel));
    const std::uint64_t charged = item->data.capacity();
    return std::pair{std::shared_ptr<const cache_item>(item), charged};
  });
}

// Blocks [b0, b1) of tensor t of version v, decoded through the chain into `out` and not
// cached: for reads the kernel makes away from the reader (read_ahead::expects), whose chunk is
// usually evicted before the reader gets there, or was read already.
void content_store::impl::stray_blocks(std::uint64_t v, std::size_t t, std::size_t b0,
                                       std::size_t b1, std::span<std::byte> out) {
  read_guard guard(*this);  // the whole chain decode
  decodes.stray(out.size());
  decodes.frames(decode_blocks_into(v, t, b0, b1, out, false));
}

// Decodes chunk c of tensor t of version v into `out` (exactly the chunk's bytes).
std::size_t content_store::impl::decode_chunk_into(std::uint64_t v, std::size_t t, std::size_t c,
                                                   std::span<std::byte> out, bool parallel) {
  return decode_blocks_into(v, t, c * kChunkBlocks, (c + 1) * kChunkBlocks, out, parallel);
}

// Decodes blocks [b0, b1) of tensor t of version v (b1 clamped to the frame's blocks) into `out`
// (exactly their bytes). The base comes from the caches when they have it (the whole tensor, or
// the chunk holding these blocks); otherwise a base with the same block geometry is decoded into
// `out` and the delta applied in place, and any other base (a version written before block
// indexes) is reconstructed whole.
std::size_t content_store::impl::decode_blocks_into(std::uint64_t v, std::size_t t, std::size_t b0,
                                                    std::size_t b1, std::span<std::byte> out,
                                                    bool parallel) {
  const auto m = meta_of(v);
  const tensor_frame* f = frame_of(*m, t);
  if (!f || f->blocks.empty()) throw corrupt_error("content: tensor has no block index");
  const std::uint64_t length = m->meta->layout.tensors.at(t).length;
  const std::uint64_t block = std::uint64_t(f->block_elements) * codec::element_size(f->type);
  b1 = std::min(b1, f->blocks.size());
  const std::uint64_t begin = b0 * block;
  if (b0 >= b1 || begin >= length || out.size() != std::min(b1 * block, length) - begin)
    throw corrupt_error("content: blocks outside their tensor");
  const std::size_t c = b0 / kChunkBlocks;  // the chunk holding them (b1 is in it too)
  if (b1 > (c + 1) * kChunkBlocks) throw corrupt_error("content: blocks span two chunks");

  std::shared_ptr<const cache_item> held;  // keeps a cached base alive while it is read
  std::span<const std::byte> base;
  std::size_t frames = 1;
  if (decodes_from_base(*f, length)) {
    const std::uint64_t base_id = m->base;
    const auto bm = meta_of(base_id);
    const tensor_frame* bf = frame_of(*bm, f->base_tensor);
    const bool same_geometry = bf && !bf->blocks.empty() && bf->type == f->type &&
                               bf->block_elements == f->block_elements &&
                               bm->meta->layout.tensors.at(f->base_tensor).length == length;
    if ((held = cache.get({base_id, k_tensor, f->base_tensor}))) {
      if (held->data.size() != length) throw corrupt_error("content: base size mismatch");
      base = std::span<const std::byte>(held->data).subspan(begin, out.size());
    } else if (same_geometry &&
               (held = chunks.get({base_id, k_chunk, chunk_index(f->base_tensor, c)}))) {
      const std::uint64_t chunk_at = c * kChunkBlocks * block, at = begin - chunk_at;
      if (held->data.size() != std::min(chunk_at + kChunkBlocks * block, length) - chunk_at)
        throw corrupt_error("content: base size mismatch");
      base = std::span<const std::byte>(held->data).subspan(at, out.size());
    } else if (same_geometry) {
      frames += decode_blocks_into(base_id, f->base_tensor, b0, b1, out, parallel);
      base = out;
    } else {
      held = tensor_recon(base_id, f->base_tensor);
      if (held->data.size() != length) throw corrupt_error("content: base size mismatch");
      base = std::span<const std::byte>(held->data).subspan(begin, out.size());
    }
  }
  // Read the frame's blocks only now: the recursion above reuses the same per-thread scratch.
  const std::uint64_t from = f->blocks[b0];
  const std::uint64_t to = b1 < f->blocks.size() ? f->blocks[b1] : f->encoded_bytes;
  thread_local frame_scratch scratch;  // a chunk's blocks: at most about kFrameScratchMax
  const std::span<const std::byte> enc =
      objects.read_uncached(m->obj_id, m->data_base + f->data_at + from, to - from, scratch.buf);
  scratch.note();
  decode_stored(base.empty(), [&] {
    if (parallel) {
      // Isolated: while it waits for its blocks, this thread must not take other work of the
      // arena (a save's base read decodes into the same thread_local scratch that `enc` is in).
      tbb::this_task_arena::isolate([&] { codec::decode(enc, base, out); });
    } else {
      codec::decode_here(enc, base, out);
    }
  });
  return frames;
}

// Bytes per chunk for tensor t of version v when its whole chain can be decoded a chunk at a
// time (every frame down to the keyframe has a block index of the same geometry), else 0: a
// chunk over a base without an index would decode that whole base for every chunk.
std::uint64_t content_store::impl::chain_chunk_bytes(std::uint64_t v, std::size_t t) {
  std::shared_ptr<const cache_item> m = meta_of(v);
  const tensor_frame* f = frame_of(*m, t);
  if (!f) return 0;
  const std::uint64_t cb = chunk_bytes(*f);
  for (std::size_t depth = 0;
       cb && decodes_from_base(*f, m->meta->layout.tensors.at(f->tensor).length); ++depth) {
    if (depth > 1'000'000) throw corrupt_error("content: base chain does not end");
    m = meta_of(m->base);
    const tensor_frame* b = frame_of(*m, f->base_tensor);
    if (!b || b->type != f->type || chunk_bytes(*b) != cb) return 0;
    f = b;
  }
  return cb;
}

// Serves one version: exact files straight from their regions, checkpoints through served-file
// assembly with the reconstructed tensors and the stored member CRCs.
class content_store::impl::reader final : public content_reader {
 public:
  reader(content_store::impl& s, std::uint64_t v, std::shared_ptr<const cache_item> meta)
      : store_(s), version_(v), meta_(std::move(meta)) {
    const version_meta& m = *meta_->meta;
    if (m.kind == version_kind::exact) return;
    replaced_.assign(m.layout.tensors.size(), false);
    for (const auto& f : m.tensors) replaced_[f.tensor] = true;
    const std::vector<bool>& replaced = replaced_;
    format::source original(m.size, [this](std::uint64_t off, std::span<std::byte> out) {
      store_.read_exact(version_, *meta_->meta, off, out);
    });
    // The units of decoding: chunks of tensors with a block index, whole tensors otherwise.
    chunk_bytes_.assign(m.layout.tensors.size(), 0);
    first_unit_.assign(m.layout.tensors.size(), 0);
    std::vector<std::vector<std::size_t>> units_of(m.layout.tensors.size());
    bool chunked = false;
    for (std::size_t t = 0; t < replaced.size(); ++t) {
      const std::uint64_t len = m.layout.tensors[t].length;
      if (!replaced[t]) {
        // Not decoded, but a place the reader can be: read-ahead must know that the kernel's
        // read-ahead past it touches what follows it in the file, not where the reader goes.
        first_unit_[t] = units_.size();
        units_of[t].push_back(units_.size());
        units_.push_back({t, stored_tensor, len});
        continue;
      }
      std::uint64_t cb = 0;
      try {
        cb = store_.chain_chunk_bytes(version_, t);
      } catch (const std::exception&) {
        // A damaged or missing link: decoded whole, and the read reports the error.
      }
      chunk_bytes_[t] = cb;
      first_unit_[t] = units_.size();
      chunked |= cb != 0;
      const std::size_t n = cb ? std::size_t((len + cb - 1) / cb) : 1;
      for (std::size_t c = 0; c < n; ++c) {
        units_of[t].push_back(units_.size());
        units_.push_back({t, cb ? c : whole_tensor, cb ? std::min(cb, len - c * cb) : len});
      }
    }
    // Decode ahead in the order the reader is expected to go, among the reconstructed tensors
    // (the others are in the orders as places the reader can be).
    std::vector<std::size_t> predicted, file_order, by_offset;
    std::vector<std::uint64_t> length;
    std::vector<bool> stored;
    for (const auto& u : units_) {
      length.push_back(u.bytes);
      stored.push_back(u.chunk == stored_tensor);
    }
    for (auto t : format::read_order(m.layout))
      predicted.insert(predicted.end(), units_of[t].begin(), units_of[t].end());
    for (std::size_t t = 0; t < replaced.size(); ++t) by_offset.push_back(t);
    std::sort(by_offset.begin(), by_offset.end(), [&](std::size_t a, std::size_t b) {
      return m.layout.tensors[a].offset < m.layout.tensors[b].offset;
    });
    for (auto t : by_offset)
      file_order.insert(file_order.end(), units_of[t].begin(), units_of[t].end());
    for (auto t : by_offset) tensor_starts_.emplace_back(m.layout.tensors[t].offset, t);
    const bool zip = m.layout.format == format::file_format::torch_zip ||
                     m.layout.format == format::file_format::npz;
    ahead_.emplace(std::move(predicted), std::move(file_order), std::move(length),
                   chunked ? store_.chunk_read_ahead_bytes() : store_.read_ahead_bytes(), zip,
                   impl::kStrayBytes, std::move(stored));
    served_.emplace(
        m.layout, original, replaced,
        [this](std::size_t t, std::uint64_t off, std::span<std::byte> out) { fill(t, off, out); });
    for (const auto& [member, crc] : m.member_crcs) served_->set_member_crc(member, crc);
  }

  // A reader pins its version: a read in flight must not lose its data because the file was
  // rewritten and the old version's last name released meanwhile. Last in the constructor, so
  // that a constructor that throws leaves no pin behind.
  void pin() {
    std::lock_guard lock(store_.mu);
    auto it = store_.versions.find(version_);
    if (it == store_.versions.end() || it->second.donors_released)
      throw corrupt_error("content: version was reclaimed");
    ++it->second.refs;
    pinned_ = true;
  }

  ~reader() override {
    try {
      std::uint64_t drop_image = 0;
      {
        // Into `unneeded`, removed after the next journal sync: what made this version or its
        // chain unnecessary (a rekey, a new head) may not be durable yet.
        std::lock_guard lock(store_.mu);
        auto it = store_.versions.find(version_);
        if (!pinned_ || it == store_.versions.end() || it->second.refs == 0) return;
        // This pin held the version after its last name went (a save over the file while this
        // reader was open): the lineage may have just come down to one live file.
        if (--it->second.refs == 0) drop_image = store_.image_unpaid(it->second.lineage);
        store_.collect(version_, store_.unneeded);
      }
      if (drop_image) store_.heads->drop(drop_image);
    } catch (...) {
      // Leftover objects are garbage for gc, never a dangling reference.
    }
  }
  reader(const reader&) = delete;
  reader& operator=(const reader&) = delete;

  std::uint64_t size() const override { return meta_->meta->size; }

  std::size_t read(std::uint64_t offset, std::span<std::byte> out) const override {
    if (offset >= size()) return 0;
    const std::size_t n = std::size_t(std::min<std::uint64_t>(out.size(), size() - offset));
    if (served_) {
      // A reader that starts at the beginning will most likely read the whole file: start
      // decoding its first tensors while it reads the headers.
      if (offset == 0) queue(ahead_->start());
      touch_stored(offset);
      return served_->read(offset, out.first(n));
    }
    store_.read_exact(version_, *meta_->meta, offset, out.first(n));
    return n;
  }

  view peek(std::uint64_t offset, std::size_t len) const override {
    if (!served_ || offset >= size()) return {};
    len = std::size_t(std::min<std::uint64_t>(len, size() - offset));
    const auto& segs = meta_->meta->layout.segments;
    auto it =
        std::upper_bound(segs.begin(), segs.end(), offset,
                         [](std::uint64_t o, const format::segment& s) { return o < s.offset; });
    if (it == segs.begin()) return {};
    --it;
    if (!it->tensor || !replaced_[*it->tensor]) return {};
    const std::uint64_t in_seg = offset - it->offset;
    if (in_seg + len > it->length) return {};
    const std::size_t t = *it->tensor;
    // Read-ahead follows the reader also through tensors served from the cache.
    queue(ahead_->touch(unit_at(t, in_seg)));
    const std::uint64_t cb = chunk_bytes_[t];
    // The whole tensor when the cache has it, or when it is decoded whole anyway.
    if (auto w = cb ? store_.cache.get({version_, k_tensor, t}) : store_.tensor_recon(version_, t))
      return {w, std::span<const std::byte>(w->data.data() + in_seg, len)};
    const std::size_t c = std::size_t(in_seg / cb);
    const std::size_t ui = unit_at(t, in_seg);
    if (in_seg % cb + len > units_[ui].bytes) return {};  // spans two: read()
    if (is_stray(t, c, ui, in_seg % cb, len)) return {};  // read() decodes a block for it
    auto r = chunk(t, c);
    const std::span<const std::byte> bytes(r->data.data() + in_seg % cb, len);
    return {std::move(r), bytes};
  }

 private:
  // A read at file offset `offset` of a tensor stored as it is (or of the zip header before it)
  // tells read-ahead where the reader is; reads of decoded tensors do so in fill() and peek().
  void touch_stored(std::uint64_t offset) const {
    auto it = std::upper_bound(tensor_starts_.begin(), tensor_starts_.end(),
                               std::pair{offset, ~std::size_t(0)});
    if (it != tensor_starts_.begin()) {
      const auto& [start, t] = *std::prev(it);
      if (offset < start + meta_->meta->layout.tensors[t].length) it = std::prev(it);
    }
    if (it == tensor_starts_.end() || replaced_[it->second]) return;
    queue(ahead_->touch(first_unit_[it->second]));
  }

  // The unit holding byte `off` of tensor t's payload.
  std::size_t unit_at(std::size_t t, std::uint64_t off) const {
    const std::uint64_t cb = chunk_bytes_[t];
    return first_unit_[t] + (cb ? std::size_t(off / cb) : 0);
  }

  // Bytes [off, off + out.size()) of tensor t's reconstruction: from the whole tensor when the
  // cache has it (a version just written, or read warm), else chunk by chunk. Each unit is
  // queued for read-ahead before (perhaps) waiting for it, also when it is cached.
  void fill(std::size_t t, std::uint64_t off, std::span<std::byte> out) const {
    const std::uint64_t cb = chunk_bytes_[t];
    if (!cb) {
      queue(ahead_->touch(unit_at(t, off)));
      const auto r = store_.tensor_recon(version_, t);  // from the cache when it is there
      std::memcpy(out.data(), r->data.data() + off, out.size());
      return;
    }
    while (!out.empty()) {
      const std::size_t c = std::size_t(off / cb);
      const std::size_t ui = unit_at(t, off);
      const unit& u = units_.at(ui);
      queue(ahead_->touch(ui));
      std::shared_ptr<const cache_item> r = store_.cache.get({version_, k_tensor, t});
      if (r) {  // the whole tensor: no chunk needed
        std::memcpy(out.data(), r->data.data() + off, out.size());
        return;
      }
      const std::size_t n = std::size_t(std::min<std::uint64_t>(out.size(), u.bytes - off % cb));
      if (!stray(t, c, ui, off % cb, out.first(n))) {
        r = chunk(t, c);
        std::memcpy(out.data(), r->data.data() + off % cb, n);
      }
      out = out.subspan(n);
      off += n;
    }
  }

  // Serves `out` (bytes from `at` of chunk c of tensor t, unit ui) with one block decoded for it,
  // if it is a read the kernel makes away from the reader: a few pages (its read-ahead past a
  // record, at most kStrayReadBytes) of a chunk of several blocks that read-ahead did not
  // expect the reader at and nobody has decoded or is decoding. torch.load reads records in
  // storage-key order, not file order, so the chunk such a read falls in was mostly read before
  // or is read much later: decoding it whole (4 MiB for a few pages) decoded most chunks at the
  // start of a large tensor twice under small caches (fs.cold_reads). False: read it as usual.
  bool stray(std::size_t t, std::size_t c, std::size_t ui, std::uint64_t at,
             std::span<std::byte> out) const {
    if (!is_stray(t, c, ui, at, out.size())) return false;
    const std::uint64_t tag = stray_tag(t, c, at);
    if (last_stray_.exchange(tag) == tag) return false;  // decoded last time: read the chunk
    const std::uint64_t block = chunk_bytes_[t] / kChunkBlocks;
    const unit& u = units_[ui];
    const std::uint64_t b = at / block;
    thread_local std::vector<std::byte> decoded;  // one block per FUSE thread, reused
    decoded.resize(std::size_t(std::min(block, u.bytes - b * block)));
    const std::size_t first = c * kChunkBlocks + std::size_t(b);
    store_.stray_blocks(version_, t, first, first + 1, decoded);
    std::memcpy(out.data(), decoded.data() + (at - b * block), out.size());
    return true;
  }
  static constexpr std::uint64_t kStrayReadBytes = 256u << 10;
  // Each block once: a second read of the block the last such read decoded (the kernel reading
  // on in pieces, or a reader working through the chunk in small reads behind its place) reads
  // the chunk, which is then cached.
  bool is_stray(std::size_t t, std::size_t c, std::size_t ui, std::uint64_t at,
                std::size_t len) const {
    const std::uint64_t block = chunk_bytes_[t] / kChunkBlocks;
    if (!block || units_[ui].bytes <= block || len > kStrayReadBytes || len == 0) return false;
    if (at / block != (at + len - 1) / block) return false;
    if (ahead_->expects(ui) || store_.chunks.present({version_, k_chunk, chunk_index(t, c)}))
      return false;
    return last_stray_.load() != stray_tag(t, c, at);
  }
  std::uint64_t stray_tag(std::size_t t, std::size_t c, std::uint64_t at) const {
    const std::uint64_t block = chunk_bytes_[t] / kChunkBlocks;
    return ((std::uint64_t(t) << 32) | (c * kChunkBlocks + at / block)) + 1;
  }
  mutable std::atomic<std::uint64_t> last_stray_{0};  // the last block stray() decoded (a tag)

  // Chunk c of tensor t, decoded now if no worker has it (in parallel: the reader is waiting).
  std::shared_ptr<const cache_item> chunk(std::size_t t, std::size_t c) const {
    const unit& u = units_.at(first_unit_[t] + c);
    auto r = store_.chunk_recon(version_, t, c, u.bytes, true);
    if (r->data.size() != u.bytes) throw corrupt_error("content: chunk of an unexpected size");
    return r;
  }

  void queue(const std::vector<std::size_t>& next) const {
    std::vector<prefetch_job> jobs;
    for (auto i : next) {
      const unit& u = units_[i];
      if (u.chunk != stored_tensor) jobs.push_back({version_, u.tensor, u.chunk, u.bytes, alive_});
    }
    store_.prefetch(std::move(jobs));
  }

  content_store::impl& store_;
  std::uint64_t version_;
  std::shared_ptr<const cache_item> meta_;
  std::optional<format::served_file> served_;
  std::vector<bool> replaced_;  // tensors served reconstructed
  // Units of decoding and read-ahead: chunk `chunk` of `tensor`, or the whole tensor.
  struct unit {
    std::size_t tensor;
    std::size_t chunk;  // whole_tensor for a tensor without a block index, or stored_tensor
    std::uint64_t bytes;
  };
  // A tensor served as it is stored: a unit of read-ahead's orders, never decoded.
  static constexpr std::size_t stored_tensor = whole_tensor - 1;
  std::vector<unit> units_;
  std::vector<std::pair<std::uint64_t, std::size_t>> tensor_starts_;  // (offset, tensor), sorted
  std::vector<std::size_t> first_unit_;                               // per tensor: its first unit
  std::vector<std::uint64_t> chunk_bytes_;  // per tensor: bytes per chunk, 0 = decoded whole
  mutable std::optional<read_ahead> ahead_;
  // Prefetch jobs hold it weakly: they are dropped once the last handle on this reader is gone.
  std::shared_ptr<const void> alive_ = std::make_shared<int>(0);
  bool pinned_ = false;
};

namespace {

class empty_reader final : public content_reader {
 public:
  std::uint64_t size() const override { return 0; }
  std::size_t read(std::uint64_t, std::span<std::byte>) const override { return 0; }
};

// A lineage's newest version, served from its head image: the bytes are already what it reads
// as, so nothing is decoded. Holding the image keeps it readable after the lineage moves on.
class head_reader final : public content_reader {
 public:
  explicit head_reader(std::shared_ptr<const head_image> image) : image_(std::move(image)) {}
  std::uint64_t size() const override { return image_->size(); }
  std::size_t read(std::uint64_t offset, std::span<std::byte> out) const override {
    if (offset >= size()) return 0;
    const std::size_t n = std::size_t(std::min<std::uint64_t>(out.size(), size() - offset));
    image_->read(offset, out.first(n));
    return n;
  }
  int backing_fd() const override { return image_->published_fd(); }

 private:
  std::shared_ptr<const head_image> image_;
};

}  // namespace

std::shared_ptr<const content_reader> content_store::published_head(const content_ref& ref) const {
  if (!impl_->heads || !ref.version) return nullptr;
  auto h = impl_->heads->get(ref.version);
  if (!h || h->published_fd() < 0) return nullptr;
  return std::make_shared<head_reader>(std::move(h));
}

void content_store::impl::rebuild_head(std::uint64_t v, std::uint64_t checksum,
                                       std::uint64_t size) noexcept {
  // Tensors are within the file: a file under head_min needs no look at its metadata, which
  // for a delta means its chain's (content format 4), at every start.
  if (!heads || size < opt.head_min) return;
  try {
    const auto m = meta_of(v);
    std::uint64_t tensor_bytes = 0;
    for (const auto& f : m->meta->tensors)
      tensor_bytes += m->meta->layout.tensors.at(f.tensor).length;
    if (tensor_bytes < opt.head_min) return;
    auto r = std::make_shared<reader>(*this, v, m);
    r->pin();  // while the job exists
    heads->rebuild(v, checksum, size, [r](std::uint64_t off, std::span<std::byte> out) {
      if (r->read(off, out) != out.size()) throw corrupt_error("content: a version read short");
    });
  } catch (const std::exception&) {
    // A damaged version (its reads report it), or no memory for the job: it decodes.
  }
}

std::shared_ptr<const content_reader> content_store::open(const content_ref& ref) {
  if (ref.version == 0) return std::make_shared<empty_reader>();
  if (impl_->heads)
    if (auto h = impl_->heads->get(ref.version)) return std::make_shared<head_reader>(std::move(h));
  auto r = std::make_shared<impl::reader>(*impl_, ref.version, impl_->meta_of(ref.version));
  r->pin();
  return r;
}

bool content_store::direct_read_ok(const content_ref& ref) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->versions.find(ref.version);
  return it != impl_->versions.end() && it->second.kind != version_kind::exact &&
         it->second.format == format::name(format::file_format::torch_zip);
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> content_store::data_runs(
    const content_ref& ref) {
  if (!ref.version || !ref.size) return {};
  const auto m = impl_->meta_of(ref.version);
  if (m->meta->kind != version_kind::exact) return {{0, ref.size}};
  std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;
  for (const auto& r : m->meta->exact)
    if (r.length) runs.emplace_back(r.offset, r.offset + r.length);
  return runs;
}

std::uint64_t content_store::stored_bytes(const content_ref& ref) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->versions.find(ref.version);
  return it == impl_->versions.end() ? 0 : it->second.obj.size;
}

}  // namespace ckpt::fs
