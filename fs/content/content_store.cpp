#include "fs/content/content_store.hpp"

#include "codec/xxh3.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <shared_mutex>
#include <stop_token>
#include <thread>
#include <unordered_map>
#include <utility>

#include "cache/lru_cache.hpp"
#include "codec/block.hpp"
#include "codec/error.hpp"
#include "codec/format/assemble.hpp"
#include "codec/format/read_order.hpp"
#include "codec/format/recognise.hpp"
#include "fs/content/buffer_pool.hpp"
#include "fs/content/lineage_key.hpp"
#include "fs/content/read_ahead.hpp"
#include "fs/content/spill_file.hpp"
#include "fs/content/version_meta.hpp"

namespace ckpt::fs {
namespace {

using nlohmann::json;
using bytes = std::vector<std::byte>;

constexpr std::size_t kExactBlock = codec::default_block_bytes;
constexpr std::size_t kExactChunk = 16 * kExactBlock;  // read this much of a region at a time

enum : std::uint32_t { k_meta = 1, k_block = 2, k_tensor = 3, k_chunk = 4 };

// A cold read decodes tensors a chunk of this many codec blocks (4 MiB of payload at the default
// block size) at a time, when the version has a block index: torch.load's first bytes then wait
// for one chunk instead of a whole tensor, and the chunks live in a few recycled buffers instead
// of a tensor's worth of fresh memory.
constexpr std::size_t kChunkBlocks = 4;
constexpr std::uint64_t chunk_index(std::size_t tensor, std::size_t chunk) {
  return (std::uint64_t(tensor) << 32) | chunk;
}

struct cache_key {
  std::uint64_t version;
  std::uint32_t kind;
  std::uint64_t index;
  bool operator==(const cache_key&) const = default;
};
struct cache_key_hash {
  std::size_t operator()(const cache_key& k) const noexcept {
    const std::uint64_t v[3] = {k.version, k.kind, k.index};
    return XXH3_64bits(v, sizeof v);
  }
};

// A byte buffer that is never zero-filled: decode targets and object reads overwrite every byte,
// and zeroing (and faulting in) a gigabyte first cost as much as decoding it. Page-aligned, so a
// frame can be read into it with O_DIRECT.
using byte_buffer = store::page_buffer;

// What the cache holds: parsed metadata (with where the data area starts) or decoded bytes.
struct cache_item {
  std::shared_ptr<const version_meta> meta;
  std::uint64_t data_base = 0;
  // Metadata items: the object it was parsed from and the version's base, taken together from
  // one record, so that a decode never mixes a rewritten version's old and new state.
  std::uint64_t obj_id = 0;
  std::uint64_t base = 0;
  std::vector<std::uint32_t> frame_at;  // metadata items: tensor index -> frame index + 1, 0 none
  byte_buffer data;
  // Decoded chunks: the pool their buffer goes back to when the last holder lets go.
  std::shared_ptr<buffer_pool> home;

  cache_item() = default;
  cache_item(const cache_item&) = delete;
  cache_item& operator=(const cache_item&) = delete;
  ~cache_item() {
    if (home) home->give(std::move(data));
  }
};

// The frame of tensor t in a version (a metadata item), or nullptr when t is not a frame.
const tensor_frame* frame_of(const cache_item& m, std::size_t t) {
  if (t >= m.frame_at.size() || !m.frame_at[t]) return nullptr;
  return &m.meta->tensors[m.frame_at[t] - 1];
}

// Payload bytes per chunk of a frame with a block index; 0 without one (decoded whole).
std::uint64_t chunk_bytes(const tensor_frame& f) {
  if (f.blocks.empty()) return 0;
  return std::uint64_t(kChunkBlocks) * f.block_elements * codec::element_size(f.type);
}

void set_block_index(tensor_frame& f, std::span<const std::byte> frame) {
  auto fi = codec::index_frame(frame);
  f.block_elements = fi.block_elements;
  f.blocks = std::move(fi.offsets);
}

bytes to_bytes(const json& j) {
  const auto v = json::to_cbor(j);
  return {reinterpret_cast<const std::byte*>(v.data()),
          reinterpret_cast<const std::byte*>(v.data() + v.size())};
}

// The encoded data area of a version, as separately allocated chunks (one per exact region or
// tensor frame): growing one vector to the size of a keyframe would transiently need twice that.
// The object store writes the chunks as pieces without copying them. Exact regions larger than
// content_options::spill_bytes go to a spill file instead (spill_file.hpp); a piece is then a
// range of that file.
struct data_area {
  struct piece {
    bytes memory;
    std::uint64_t spill_at = 0, spill_len = 0;  // spill_len > 0: the range of `spill`
  };
  std::vector<piece> pieces;
  std::unique_ptr<spill_file> spill;
  std::uint64_t size = 0;

  void add(bytes&& b) {
    size += b.size();
    pieces.push_back({std::move(b)});
  }
  // Appends to the spill file (created in `dir` on first use); consecutive appends extend one
  // piece.
  void add_spilled(const std::string& dir, std::span<const std::byte> b) {
    if (b.empty()) return;
    if (!spill) spill = std::make_unique<spill_file>(dir);
    const std::uint64_t at = spill->append(b);
    if (!pieces.empty() && pieces.back().spill_len &&
        pieces.back().spill_at + pieces.back().spill_len == at)
      pieces.back().spill_len += b.size();
    else
      pieces.push_back({{}, at, b.size()});
    size += b.size();
  }
};

// Writes a content object: prefix | meta | data area (durable when it returns).
store::object_ref write_object(store::object_store& objects, const version_meta& meta,
                               const data_area& data) {
  const bytes meta_bytes = encode_meta(meta);
  std::byte prefix[content_prefix_size];
  const std::uint32_t magic = content_magic, fmt = content_format_version;
  const std::uint64_t meta_len = meta_bytes.size();
  const std::uint64_t meta_sum = XXH3_64bits(meta_bytes.data(), meta_bytes.size());
  std::memcpy(prefix, &magic, 4);
  std::memcpy(prefix + 4, &fmt, 4);
  std::memcpy(prefix + 8, &meta_len, 8);
  std::memcpy(prefix + 16, &meta_sum, 8);
  std::optional<spill_file::mapping> spilled;
  if (data.spill) spilled.emplace(*data.spill);
  std::vector<std::span<const std::byte>> pieces{prefix, meta_bytes};
  for (const auto& p : data.pieces)
    pieces.push_back(p.spill_len ? spilled->bytes().subspan(p.spill_at, p.spill_len)
                                 : std::span<const std::byte>(p.memory));
  return objects.put(pieces);
}

}  // namespace

struct version_rec {
  std::uint64_t id = 0;
  store::object_ref obj;
  std::uint64_t size = 0;
  version_kind kind = version_kind::exact;
  std::string format;
  std::uint64_t lineage = 0;
  std::uint64_t base = 0;
  std::string path;
  std::uint64_t since_keyframe = 0;
  std::int64_t created_ns = 0;   // CLOCK_REALTIME when it was stored
  std::uint64_t refs = 0;        // names pointing at it
  std::uint64_t dependents = 0;  // live versions whose base it is
};

struct lineage_rec {
  std::uint64_t id = 0;
  std::uint64_t signature = 0;
  std::string path_key;
  std::uint64_t head = 0;
  std::uint64_t since_keyframe = 0;
  bool journaled = true;  // its record is in the journal (a new lineage's goes with its first put)
  std::shared_ptr<std::mutex> encode_mu = std::make_shared<std::mutex>();
};

struct content_store::impl {
  store::object_store& objects;
  store::journal& journal;
  content_options opt;
  mutable std::mutex mu;  // versions, lineages, counters
  std::map<std::uint64_t, version_rec> versions;
  std::map<std::uint64_t, lineage_rec> lineages;
  std::uint64_t next_version = 1, next_lineage = 1;
  std::uint64_t max_object = 0;         // largest object id any replayed record names
  std::vector<std::uint64_t> unneeded;  // objects to remove once the records are durable
  std::vector<std::uint64_t> replaced;  // replay: objects of rewritten versions (rekey)
  // Reclaimed versions whose objects are not removed yet: a decode that started before the
  // reclaim may still walk their chain (see read_guard).
  std::map<std::uint64_t, version_rec> graveyard;

  // Object removal waits for the decodes that might still read the objects. Every read of
  // object data runs under a read_guard, which registers the epoch it started in; a removal is
  // tagged with a new epoch and carried out once no guard from an earlier epoch is active.
  // Nothing ever waits: removals are deferred, never blocking.
  std::mutex epoch_mu;
  std::uint64_t epoch = 0;
  std::multiset<std::uint64_t> active_epochs;
  std::vector<std::pair<std::uint64_t, std::vector<std::uint64_t>>> deferred;  // tag, objects
  std::set<std::uint64_t> removing;  // handed out for removal, not removed yet (gc keeps them)

  class read_guard {
   public:
    explicit read_guard(impl& m) : m_(m) {
      std::lock_guard lock(m_.epoch_mu);
      at_ = m_.active_epochs.insert(m_.epoch);
    }
    ~read_guard() {
      {
        std::lock_guard lock(m_.epoch_mu);
        m_.active_epochs.erase(at_);
      }
      m_.drain();
    }
    read_guard(const read_guard&) = delete;
    read_guard& operator=(const read_guard&) = delete;

   private:
    impl& m_;
    std::multiset<std::uint64_t>::iterator at_;
  };
  // Shared by every writer between its object's write and its record's append (put, rekey);
  // exclusive for garbage collection, which must not take a fresh object for garbage.
  std::shared_mutex object_gate;
  cache::lru_cache<cache_key, cache_item, cache_key_hash> cache;
  std::shared_ptr<buffer_pool> chunk_pool;
  cache::lru_cache<cache_key, cache_item, cache_key_hash> chunks;

  class reader;

  // Read-ahead of reconstructed tensors: each reader names the tensors it will need next
  // (read_ahead: predicted order, a byte budget ahead) and background workers decode them, so
  // that object reads and decoding overlap with the kernel copying the current tensor out
  // (torch.load after a remount). A worker reads a frame (blocking on the disk) and then decodes
  // it; one worker more than there are cores keeps every core decoding while one waits for the
  // disk (with one a core, a cold load left the two cores here 40-50% idle).
  // A job carries its reader's liveness token and is dropped once the reader is gone.
  struct prefetch_job {
    std::uint64_t version;
    std::size_t tensor;
    std::size_t chunk;    // whole_tensor: the whole tensor
    std::uint64_t bytes;  // of the chunk
    std::weak_ptr<const void> alive;
  };
  static constexpr std::size_t whole_tensor = ~std::size_t(0);
  static std::size_t prefetch_workers() {
    return std::clamp<std::size_t>(std::thread::hardware_concurrency() + 1, 3, 17);
  }
  static constexpr std::size_t kPrefetchQueueMax = 64;  // across readers; extra jobs are dropped
  std::mutex prefetch_mu;
  std::condition_variable_any prefetch_cv;  // waits are stop_token-aware: no lost wakeup
  std::deque<prefetch_job> prefetch_queue;
  std::vector<std::jthread> prefetchers;  // last member: stopped and joined before what they use

  // Decoded chunks of cold reads: a small cache carved out of cache=, its buffers recycled.
  static std::uint64_t chunk_budget(std::uint64_t cache_bytes) {
    return std::min(std::clamp<std::uint64_t>(cache_bytes / 8, 16u << 20, 128u << 20),
                    cache_bytes / 2);
  }
  impl(store::object_store& o, store::journal& j, content_options op)
      : objects(o),
        journal(j),
        opt(op),
        cache(op.cache_bytes - std::min(op.cache_bytes, chunk_budget(op.cache_bytes))),
        chunk_pool(std::make_shared<buffer_pool>(
            kChunkBlocks * codec::default_block_bytes,
            chunk_budget(op.cache_bytes) / (kChunkBlocks * codec::default_block_bytes) +
                prefetch_workers() + 4)),
        chunks(chunk_budget(op.cache_bytes)) {
    for (std::size_t i = 0, n = prefetch_workers(); i < n; ++i)
      prefetchers.emplace_back([this](std::stop_token stop) { prefetch_loop(stop); });
  }

  // How far ahead of a reader tensors are decoded: a quarter of the cache, so that read-ahead
  // for one file cannot push out what its reader is about to read.
  std::uint64_t read_ahead_bytes() const { return opt.cache_bytes / 4; }
  // Chunked: a third of the chunk cache, so that chunks decoded ahead are not evicted before
  // their reader arrives.
  std::uint64_t chunk_read_ahead_bytes() const { return chunks.budget() / 3; }

  void prefetch(std::vector<prefetch_job> jobs) {
    if (jobs.empty()) return;
    {
      std::lock_guard lock(prefetch_mu);
      for (auto& j : jobs) {
        if (prefetch_queue.size() >= kPrefetchQueueMax) break;
        prefetch_queue.push_back(std::move(j));
      }
    }
    prefetch_cv.notify_all();
  }

  void prefetch_loop(std::stop_token stop) {
    for (;;) {
      prefetch_job job;
      {
        std::unique_lock lock(prefetch_mu);
        if (!prefetch_cv.wait(lock, stop, [&] { return !prefetch_queue.empty(); })) return;
        job = std::move(prefetch_queue.front());
        prefetch_queue.pop_front();
      }
      if (job.alive.expired()) continue;  // its reader is gone
      try {
        if (job.chunk == whole_tensor)
          tensor_recon(job.version, job.tensor);
        else if (!cache.get({job.version, k_tensor, job.tensor}))  // not already whole
          chunk_recon(job.version, job.tensor, job.chunk, job.bytes, false);
      } catch (...) {
        // The reader's own request reports the error; a version may also have been reclaimed.
      }
    }
  }

  version_rec get(std::uint64_t v) const {
    std::lock_guard lock(mu);
    auto it = versions.find(v);
    if (it == versions.end()) throw corrupt_error("content: unknown version " + std::to_string(v));
    return it->second;
  }

  // For decoding: also a reclaimed version whose object is still there (see graveyard).
  version_rec get_for_read(std::uint64_t v) const {
    std::lock_guard lock(mu);
    if (auto it = versions.find(v); it != versions.end()) return it->second;
    if (auto it = graveyard.find(v); it != graveyard.end()) return it->second;
    throw corrupt_error("content: unknown version " + std::to_string(v));
  }

  // --- reading -------------------------------------------------------------------------------

  std::shared_ptr<const cache_item> meta_of(std::uint64_t v) {
    read_guard guard(*this);
    const version_rec r = get_for_read(v);
    // Keyed by object: a rewritten version's new metadata never meets its old object.
    return cache.get_or_load({v, k_meta, r.obj.id}, [&] {
      std::byte prefix[content_prefix_size];
      objects.read(r.obj.id, 0, prefix);
      std::uint32_t magic, version;
      std::uint64_t meta_len, meta_sum;
      std::memcpy(&magic, prefix, 4);
      std::memcpy(&version, prefix + 4, 4);
      std::memcpy(&meta_len, prefix + 8, 8);
      std::memcpy(&meta_sum, prefix + 16, 8);
      if (magic != content_magic) throw corrupt_error("content: bad object magic");
      if (version != content_format_version)
        throw error(errc::unsupported, "content: object format " + std::to_string(version));
      if (meta_len > r.obj.size - content_prefix_size) throw corrupt_error("content: meta length");
      bytes meta(meta_len);
      objects.read(r.obj.id, content_prefix_size, meta);
      if (XXH3_64bits(meta.data(), meta.size()) != meta_sum)
        throw corrupt_error("content: metadata checksum mismatch in version " + std::to_string(v));
      auto item = std::make_shared<cache_item>();
      item->meta = std::make_shared<const version_meta>(decode_meta(meta));
      item->frame_at.assign(item->meta->layout.tensors.size(), 0);
      for (std::size_t i = 0; i < item->meta->tensors.size(); ++i)
        item->frame_at[item->meta->tensors[i].tensor] = std::uint32_t(i + 1);
      item->data_base = content_prefix_size + meta_len;
      item->obj_id = r.obj.id;
      item->base = r.base;
      return std::pair{std::shared_ptr<const cache_item>(item), std::uint64_t(meta_len * 4 + 256)};
    });
  }

  byte_buffer read_data(std::uint64_t v, const cache_item& m, std::uint64_t at, std::uint64_t len) {
    byte_buffer out(len);
    (void)v;
    objects.read(m.obj_id, m.data_base + at, out);
    return out;
  }

  std::shared_ptr<const cache_item> exact_block(std::uint64_t v, std::size_t region,
                                                std::size_t block) {
    read_guard guard(*this);
    return cache.get_or_load({v, k_block, (std::uint64_t(region) << 32) | block}, [&] {
      auto m = meta_of(v);
      const exact_region& r = m->meta->exact.at(region);
      const std::uint64_t begin = r.blocks.at(block);
      const std::uint64_t end = block + 1 < r.blocks.size() ? r.blocks[block + 1] : r.encoded_bytes;
      if (end < begin) throw corrupt_error("content: block index");
      const byte_buffer enc = read_data(v, *m, r.data_at + begin, end - begin);
      const std::uint64_t first = std::uint64_t(block) * r.block_bytes;
      auto item = std::make_shared<cache_item>();
      item->data = byte_buffer(std::min<std::uint64_t>(r.block_bytes, r.length - first));
      codec::decode(enc, {}, item->data);
      return std::pair{std::shared_ptr<const cache_item>(item), std::uint64_t(item->data.size())};
    });
  }

  // Reads bytes of the exact regions; every byte of [offset, offset + out.size()) must be in one.
  void read_exact(std::uint64_t v, const version_meta& meta, std::uint64_t offset,
                  std::span<std::byte> out) {
    const auto& regions = meta.exact;
    auto it = std::upper_bound(regions.begin(), regions.end(), offset,
                               [](std::uint64_t o, const exact_region& r) { return o < r.offset; });
    while (!out.empty()) {
      if (it == regions.begin()) throw corrupt_error("content: read outside stored regions");
      const exact_region& r = *std::prev(it);
      if (offset >= r.offset + r.length)
        throw corrupt_error("content: read outside stored regions");
      const std::size_t ri = std::size_t(std::prev(it) - regions.begin());
      const std::uint64_t in_region = offset - r.offset;
      const std::size_t block = std::size_t(in_region / r.block_bytes);
      const std::uint64_t in_block = in_region % r.block_bytes;
      const auto b = exact_block(v, ri, block);
      const std::size_t n =
          std::size_t(std::min<std::uint64_t>(out.size(), b->data.size() - in_block));
      std::memcpy(out.data(), b->data.data() + in_block, n);
      out = out.subspan(n);
      offset += n;
      if (offset >= r.offset + r.length) ++it;
    }
  }

  // The reconstruction of tensor `t` (index into the version's layout) of version v, decoding
  // the chain back to its keyframe when the cache no longer has the base.
  std::shared_ptr<const cache_item> tensor_recon(std::uint64_t v, std::size_t t) {
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
  byte_buffer materialize(std::uint64_t v, std::size_t t) {
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
    if (f->mode == tensor_mode::delta) {
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
    thread_local byte_buffer scratch;
    const std::span<const std::byte> enc =
        objects.read_uncached(m->obj_id, m->data_base + f->data_at, f->encoded_bytes, scratch);
    if (f->mode == tensor_mode::delta) {
      codec::decode(enc,
                    cached_base ? std::span<const std::byte>(cached_base->data)
                                : std::span<const std::byte>(out),
                    out);
    } else {
      codec::decode(enc, {}, out);
    }
    return out;
  }

  // Chunk c of tensor t of version v (payload bytes [c * chunk_bytes, ...) of a frame with a
  // block index), decoded through its chain a chunk at a time.
  // `parallel`: decode the chunk's blocks on oneTBB's workers (a reader waiting for it) or on the
  // calling thread alone (the read-ahead workers, which already run one decode per core).
  std::shared_ptr<const cache_item> chunk_recon(std::uint64_t v, std::size_t t, std::size_t c,
                                                std::uint64_t bytes, bool parallel) {
    read_guard guard(*this);  // the whole chain decode
    return chunks.get_or_load({v, k_chunk, chunk_index(t, c)}, [&] {
      auto item = std::make_shared<cache_item>();
      item->home = chunk_pool;  // also when decoding throws
      item->data = chunk_pool->take(bytes);
      decode_chunk_into(v, t, c, item->data, parallel);
      const std::uint64_t charged = item->data.capacity();
      return std::pair{std::shared_ptr<const cache_item>(item), charged};
    });
  }

  // Decodes chunk c of tensor t of version v into `out` (exactly the chunk's bytes). The base
  // chunk comes from the caches when they have it; otherwise a base with the same block geometry
  // is decoded into `out` and the delta applied in place, and any other base (a version written
  // before block indexes) is reconstructed whole.
  void decode_chunk_into(std::uint64_t v, std::size_t t, std::size_t c, std::span<std::byte> out,
                         bool parallel) {
    const auto m = meta_of(v);
    const tensor_frame* f = frame_of(*m, t);
    if (!f || f->blocks.empty()) throw corrupt_error("content: tensor has no block index");
    const std::uint64_t length = m->meta->layout.tensors.at(t).length;
    const std::uint64_t cb = chunk_bytes(*f), begin = std::uint64_t(c) * cb;
    const std::size_t b0 = c * kChunkBlocks;
    if (b0 >= f->blocks.size() || begin >= length || out.size() != std::min(cb, length - begin))
      throw corrupt_error("content: chunk outside its tensor");
    const std::size_t b1 = std::min(b0 + kChunkBlocks, f->blocks.size());

    std::shared_ptr<const cache_item> held;  // keeps a cached base alive while it is read
    std::span<const std::byte> base;
    if (f->mode == tensor_mode::delta) {
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
        if (held->data.size() != out.size()) throw corrupt_error("content: base size mismatch");
        base = held->data;
      } else if (same_geometry) {
        decode_chunk_into(base_id, f->base_tensor, c, out, parallel);
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
    thread_local byte_buffer scratch;
    const std::span<const std::byte> enc =
        objects.read_uncached(m->obj_id, m->data_base + f->data_at + from, to - from, scratch);
    if (parallel)
      codec::decode(enc, base, out);
    else
      codec::decode_here(enc, base, out);
  }

  // Bytes per chunk for tensor t of version v when its whole chain can be decoded a chunk at a
  // time (every frame down to the keyframe has a block index of the same geometry), else 0: a
  // chunk over a base without an index would decode that whole base for every chunk.
  std::uint64_t chain_chunk_bytes(std::uint64_t v, std::size_t t) {
    std::shared_ptr<const cache_item> m = meta_of(v);
    const tensor_frame* f = frame_of(*m, t);
    if (!f) return 0;
    const std::uint64_t cb = chunk_bytes(*f);
    for (std::size_t depth = 0; cb && f->mode == tensor_mode::delta; ++depth) {
      if (depth > 1'000'000) throw corrupt_error("content: base chain does not end");
      m = meta_of(m->base);
      const tensor_frame* b = frame_of(*m, f->base_tensor);
      if (!b || b->type != f->type || chunk_bytes(*b) != cb) return 0;
      f = b;
    }
    return cb;
  }

  // --- reclaiming ----------------------------------------------------------------------------

  // Deltas between v and the keyframe its chain ends in (0 for a keyframe or none); caller holds
  // mu. Counted on the chain, not taken from the records' counters: a rekey turns a version
  // inside a chain into a keyframe without rewriting the records of the versions above it.
  std::uint64_t deltas_since_keyframe(std::uint64_t v) const {
    std::uint64_t n = 0;
    for (auto it = versions.find(v); it != versions.end() && it->second.kind == version_kind::delta;
         it = versions.find(it->second.base))
      if (++n > versions.size()) throw corrupt_error("content: base chain does not end");
    return n;
  }

  bool is_head(const version_rec& r) const {
    if (!r.lineage) return false;
    auto it = lineages.find(r.lineage);
    return it != lineages.end() && it->second.head == r.id;
  }

  // Removes versions that nothing needs any more; caller holds mu. Returns objects to delete.
  void collect(std::uint64_t v, std::vector<std::uint64_t>& objects_to_remove) {
    while (v) {
      auto it = versions.find(v);
      if (it == versions.end()) return;
      const version_rec& r = it->second;
      if (r.refs || r.dependents || is_head(r)) return;
      objects_to_remove.push_back(r.obj.id);
      const std::uint64_t base = r.base;
      graveyard.insert_or_assign(v, r);
      versions.erase(it);
      if (!base) return;
      auto b = versions.find(base);
      if (b == versions.end()) return;
      --b->second.dependents;
      v = base;
    }
  }

  // Removes objects once no decode that started before this call can read them (see
  // read_guard). The ids must be in `removing` (take_unneeded) or otherwise unreferenced.
  void remove_objects(const std::vector<std::uint64_t>& ids) {
    if (ids.empty()) return;
    {
      std::lock_guard lock(epoch_mu);
      deferred.emplace_back(++epoch, ids);
    }
    drain();
  }

  // Carries out the deferred removals no active guard can still need.
  void drain() {
    std::vector<std::uint64_t> ready;
    {
      std::lock_guard lock(epoch_mu);
      if (deferred.empty()) return;
      const std::uint64_t oldest = active_epochs.empty() ? UINT64_MAX : *active_epochs.begin();
      auto keep = std::stable_partition(deferred.begin(), deferred.end(),
                                        [&](const auto& d) { return d.first > oldest; });
      for (auto it = keep; it != deferred.end(); ++it)
        ready.insert(ready.end(), it->second.begin(), it->second.end());
      deferred.erase(keep, deferred.end());
    }
    if (ready.empty()) return;
    for (auto id : ready) {
      try {
        objects.remove(id);
      } catch (...) {
        // Left for gc: an unreferenced object is garbage, never a dangling reference.
      }
    }
    std::lock_guard lock(mu);
    const std::set<std::uint64_t> gone(ready.begin(), ready.end());
    for (auto id : ready) removing.erase(id);
    std::erase_if(graveyard, [&](const auto& g) { return gone.count(g.second.obj.id) != 0; });
  }

  // --- records -------------------------------------------------------------------------------

  static json version_json(const version_rec& r) {
    return {{"t", "c.v"},           {"v", r.id},   {"o", r.obj.id},    {"os", r.obj.size},
            {"oc", r.obj.checksum}, {"z", r.size}, {"k", int(r.kind)}, {"f", r.format},
            {"l", r.lineage},       {"b", r.base}, {"p", r.path},      {"q", r.since_keyframe},
            {"ct", r.created_ns}};
  }
  static json lineage_json(const lineage_rec& l) {
    return {{"t", "c.l"}, {"l", l.id}, {"s", l.signature}, {"pk", l.path_key}};
  }

  void apply_version(const json& j) {
    version_rec r;
    r.id = j.at("v").get<std::uint64_t>();
    r.obj = {j.at("o").get<std::uint64_t>(), j.at("os").get<std::uint64_t>(),
             j.at("oc").get<std::uint64_t>()};
    r.size = j.at("z").get<std::uint64_t>();
    r.kind = version_kind(j.at("k").get<int>());
    r.format = j.at("f").get<std::string>();
    r.lineage = j.at("l").get<std::uint64_t>();
    r.base = j.at("b").get<std::uint64_t>();
    r.path = j.at("p").get<std::string>();
    r.since_keyframe = j.at("q").get<std::uint64_t>();
    r.created_ns = j.value("ct", std::int64_t(0));
    next_version = std::max(next_version, r.id + 1);
    max_object = std::max(max_object, r.obj.id);
    if (r.lineage) {
      auto& l = lineages[r.lineage];
      if (r.id >= l.head) {  // a rewritten older version (rekey) does not move the head back
        l.head = r.id;
        l.since_keyframe = r.since_keyframe;
      }
    }
    if (auto old = versions.find(r.id); old != versions.end() && old->second.obj.id != r.obj.id)
      replaced.push_back(old->second.obj.id);
    versions[r.id] = std::move(r);
  }

  // --- writing -------------------------------------------------------------------------------

  // Appends the exact coding of src[offset, offset + length) to `area` as a region, a chunk of
  // input at a time. A region longer than spill_bytes goes to the spill file chunk by chunk, so
  // memory holds one chunk of it, never the whole encoding.
  exact_region put_exact_region(const format::source& src, std::uint64_t offset,
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
  std::uint64_t copy_encoded(std::uint64_t obj, std::uint64_t at, std::uint64_t len, bool may_spill,
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
};

content_store::content_store(store::object_store& objects, store::journal& journal,
                             content_options opt)
    : impl_(std::make_unique<impl>(objects, journal, opt)) {
  if (opt.bits < 1 || opt.bits > codec::max_bits) throw invalid_argument("bits must be 1..4");
  if (opt.keyframe_interval < 1) throw invalid_argument("keyframe_interval must be >= 1");
}

content_store::~content_store() = default;

bool content_store::apply(std::span<const std::byte> record) {
  json j;
  try {
    j = json::from_cbor(reinterpret_cast<const std::uint8_t*>(record.data()),
                        reinterpret_cast<const std::uint8_t*>(record.data() + record.size()));
  } catch (const json::exception&) {
    return false;
  }
  if (!j.is_object() || !j.contains("t") || !j["t"].is_string()) return false;
  const auto t = j["t"].get<std::string>();
  if (t.rfind("c.", 0) != 0) return false;
  std::lock_guard lock(impl_->mu);
  try {
    if (t == "c.v") {
      impl_->apply_version(j);
    } else if (t == "c.l") {
      auto& l = impl_->lineages[j.at("l").get<std::uint64_t>()];
      l.id = j.at("l").get<std::uint64_t>();
      l.signature = j.at("s").get<std::uint64_t>();
      l.path_key = j.at("pk").get<std::string>();
      impl_->next_lineage = std::max(impl_->next_lineage, l.id + 1);
    } else {
      throw corrupt_error("content: unknown record " + t);
    }
  } catch (const json::exception& e) {
    throw corrupt_error(std::string("content: bad record: ") + e.what());
  }
  return true;
}

void content_store::replay_done(std::span<const content_ref> live) {
  // Records of reclaimed versions stay in the journal until it is compacted, and their objects
  // are removed again at every replay: their ids must never name a new object.
  impl_->objects.reserve_through(impl_->max_object);
  std::vector<std::uint64_t> doomed;
  {
    std::lock_guard lock(impl_->mu);
    auto& vs = impl_->versions;
    for (auto& [id, r] : vs) r.refs = r.dependents = 0;
    for (const auto& ref : live)
      if (auto it = vs.find(ref.version); it != vs.end()) ++it->second.refs;
    for (auto& [id, r] : vs)
      if (r.base)
        if (auto b = vs.find(r.base); b != vs.end()) ++b->second.dependents;
    // Newest first: a delta's reclaim lowers its base's dependents before the base is looked at.
    std::vector<std::uint64_t> ids;
    for (auto& [id, r] : vs) ids.push_back(id);
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) impl_->collect(*it, doomed);
    // A rewritten version's old object: its new record is durable (we just replayed it).
    std::set<std::uint64_t> in_use;
    for (const auto& [id, r] : vs) in_use.insert(r.obj.id);
    for (auto o : impl_->replaced)
      if (!in_use.count(o)) doomed.push_back(o);
    impl_->replaced.clear();
  }
  impl_->remove_objects(doomed);
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
  const store::object_ref obj = write_object(m.objects, meta, data);
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
      if (!replaced[t]) continue;
      const std::uint64_t len = m.layout.tensors[t].length;
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
    // Decode ahead in the order the reader is expected to go, among the reconstructed tensors.
    std::vector<std::size_t> predicted, file_order, by_offset;
    std::vector<std::uint64_t> length;
    for (const auto& u : units_) length.push_back(u.bytes);
    for (auto t : format::read_order(m.layout))
      if (replaced[t]) predicted.insert(predicted.end(), units_of[t].begin(), units_of[t].end());
    for (std::size_t t = 0; t < replaced.size(); ++t)
      if (replaced[t]) by_offset.push_back(t);
    std::sort(by_offset.begin(), by_offset.end(), [&](std::size_t a, std::size_t b) {
      return m.layout.tensors[a].offset < m.layout.tensors[b].offset;
    });
    for (auto t : by_offset)
      file_order.insert(file_order.end(), units_of[t].begin(), units_of[t].end());
    const bool zip = m.layout.format == format::file_format::torch_zip ||
                     m.layout.format == format::file_format::npz;
    ahead_.emplace(std::move(predicted), std::move(file_order), std::move(length),
                   chunked ? store_.chunk_read_ahead_bytes() : store_.read_ahead_bytes(), zip);
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
    if (it == store_.versions.end()) throw corrupt_error("content: version was reclaimed");
    ++it->second.refs;
    pinned_ = true;
  }

  ~reader() override {
    try {
      // Into `unneeded`, removed after the next journal sync: what made this version or its
      // chain unnecessary (a rekey, a new head) may not be durable yet.
      std::lock_guard lock(store_.mu);
      auto it = store_.versions.find(version_);
      if (!pinned_ || it == store_.versions.end() || it->second.refs == 0) return;
      --it->second.refs;
      store_.collect(version_, store_.unneeded);
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
    if (in_seg % cb + len > units_[unit_at(t, in_seg)].bytes) return {};  // spans two: read()
    auto r = chunk(t, c);
    const std::span<const std::byte> bytes(r->data.data() + in_seg % cb, len);
    return {std::move(r), bytes};
  }

 private:
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
      r = chunk(t, c);
      const std::size_t n = std::size_t(std::min<std::uint64_t>(out.size(), u.bytes - off % cb));
      std::memcpy(out.data(), r->data.data() + off % cb, n);
      out = out.subspan(n);
      off += n;
    }
  }

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
      jobs.push_back({version_, u.tensor, u.chunk, u.bytes, alive_});
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
    std::size_t chunk;  // whole_tensor for a tensor without a block index
    std::uint64_t bytes;
  };
  std::vector<unit> units_;
  std::vector<std::size_t> first_unit_;     // per tensor: its first unit
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

}  // namespace

std::shared_ptr<const content_reader> content_store::open(const content_ref& ref) {
  if (ref.version == 0) return std::make_shared<empty_reader>();
  auto r = std::make_shared<impl::reader>(*impl_, ref.version, impl_->meta_of(ref.version));
  r->pin();
  return r;
}

std::vector<std::uint64_t> content_store::take_unneeded_objects() {
  std::lock_guard lock(impl_->mu);
  impl_->removing.insert(impl_->unneeded.begin(), impl_->unneeded.end());
  return std::exchange(impl_->unneeded, {});
}

void content_store::return_unneeded_objects(const std::vector<std::uint64_t>& ids) {
  std::lock_guard lock(impl_->mu);
  for (auto id : ids) impl_->removing.erase(id);
  impl_->unneeded.insert(impl_->unneeded.end(), ids.begin(), ids.end());
}

bool content_store::has_unneeded_objects() const {
  std::lock_guard lock(impl_->mu);
  return !impl_->unneeded.empty();
}

void content_store::remove_objects(const std::vector<std::uint64_t>& ids) {
  impl_->remove_objects(ids);
}

void content_store::ref(const content_ref& ref) {
  if (!ref.version) return;
  std::lock_guard lock(impl_->mu);
  auto it = impl_->versions.find(ref.version);
  if (it != impl_->versions.end()) ++it->second.refs;
}

void content_store::unref(const content_ref& ref) {
  if (!ref.version) return;
  std::lock_guard lock(impl_->mu);
  auto it = impl_->versions.find(ref.version);
  if (it == impl_->versions.end() || it->second.refs == 0) return;
  --it->second.refs;
  // Removed after the next journal sync: collecting a base chain may also take a superseded
  // head whose successor's record is not durable yet.
  impl_->collect(ref.version, impl_->unneeded);
}

bool content_store::direct_read_ok(const content_ref& ref) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->versions.find(ref.version);
  return it != impl_->versions.end() && it->second.kind != version_kind::exact &&
         it->second.format == format::name(format::file_format::torch_zip);
}

version_info content_store::info(const content_ref& ref) const {
  version_info i;
  if (!ref.version) {
    i.format = "empty";
    i.kind = "exact";
    return i;
  }
  const version_rec r = impl_->get(ref.version);
  i.version = r.id;
  i.format = r.format;
  i.kind = std::string(name(r.kind));
  i.lineage = r.lineage;
  i.base = r.base;
  i.logical_bytes = r.size;
  i.stored_bytes = impl_->objects.disk_bytes(r.obj.id);
  i.path = r.path;
  i.created_ns = r.created_ns;
  i.refs = r.refs;
  i.object = r.obj.id;
  return i;
}

void content_store::snapshot(std::vector<std::vector<std::byte>>& out) const {
  std::lock_guard lock(impl_->mu);
  for (const auto& [id, l] : impl_->lineages)
    if (l.journaled) out.push_back(to_bytes(impl::lineage_json(l)));
  for (const auto& [id, r] : impl_->versions) out.push_back(to_bytes(impl::version_json(r)));
}

bool is_optimizer_state(std::string_view name) noexcept {
  static constexpr std::array<std::string_view, 7> buffers = {
      "exp_avg",    "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer",
      "square_avg", "acc_delta",  "exp_inf"};
  static constexpr std::array<std::string_view, 5> roots = {
      "optimizer", "optim", "optimizer_state", "optimizer_states", "optimizer_state_dict"};
  const auto dot = name.find('.');
  const std::string_view first = name.substr(0, dot);
  for (auto r : roots)
    if (first == r) return true;
  const auto last_dot = name.rfind('.');
  const std::string_view last =
      last_dot == std::string_view::npos ? name : name.substr(last_dot + 1);
  for (auto b : buffers)
    if (last == b) return true;
  return false;
}

std::string to_json(const version_info& i) {
  return json{
      {"version", i.version},           {"format", i.format}, {"kind", i.kind},
      {"lineage", i.lineage},           {"base", i.base},     {"logical_bytes", i.logical_bytes},
      {"stored_bytes", i.stored_bytes}, {"path", i.path}}
      .dump();
}

void content_store::drop_caches() {
  impl_->cache.clear();
  impl_->chunks.clear();
}

// ---- management -------------------------------------------------------------------------------

std::vector<version_info> content_store::versions() const {
  std::vector<std::uint64_t> ids;
  {
    std::lock_guard lock(impl_->mu);
    for (const auto& [id, r] : impl_->versions) ids.push_back(id);
  }
  std::vector<version_info> out;
  out.reserve(ids.size());
  for (auto id : ids) {
    try {
      out.push_back(info({id, 0}));
    } catch (const corrupt_error&) {
      // reclaimed meanwhile
    }
  }
  return out;
}

version_detail content_store::detail(const content_ref& ref) {
  version_detail d;
  d.info = info(ref);
  if (!ref.version) return d;
  const auto m = impl_->meta_of(ref.version);
  const version_meta& meta = *m->meta;
  d.coding = meta.coding;
  if (!d.coding.bits && meta.bits) d.coding.bits = meta.bits;  // written before coding_params
  for (const auto& r : meta.exact) d.exact_stored_bytes += r.encoded_bytes;
  for (const auto& f : meta.tensors) {
    const auto& t = meta.layout.tensors.at(f.tensor);
    d.tensors.push_back({t.name, std::string(format::name(t.type)), t.elements(),
                         f.mode != tensor_mode::delta ? "lossless"
                         : f.ratio                    ? "ratio"
                                                      : "delta",
                         f.encoded_bytes});
  }
  return d;
}

std::uint64_t content_store::rekey(std::uint64_t v) {
  auto& m = *impl_;
  version_rec r = m.get(v);
  if (r.kind != version_kind::delta) return 0;
  // No put into this lineage meanwhile (it would read the chain we are changing), and one
  // rekey of a version at a time.
  std::shared_ptr<std::mutex> encode_mu;
  {
    std::lock_guard lock(m.mu);
    if (auto l = m.lineages.find(r.lineage); l != m.lineages.end()) encode_mu = l->second.encode_mu;
  }
  std::unique_lock<std::mutex> lineage_lock;
  if (encode_mu) lineage_lock = std::unique_lock(*encode_mu);
  r = m.get(v);
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
  data_area data;
  // Exact regions and lossless frames are copied encoded; deltas become lossless frames of
  // their reconstruction, which is what the version reads as.
  // Tensor frames stay in memory (set_block_index reads them; the write path holds them in
  // memory too); exact regions may spill.
  auto copy_encoded = [&](std::uint64_t at, std::uint64_t len, bool may_spill) {
    return m.copy_encoded(old->obj_id, old->data_base + at, len, may_spill, data);
  };
  for (exact_region x : om.exact) {
    x.data_at = copy_encoded(x.data_at, x.encoded_bytes, true);
    meta.exact.push_back(std::move(x));
  }
  for (tensor_frame f : om.tensors) {
    if (f.mode == tensor_mode::lossless) {
      f.data_at = copy_encoded(f.data_at, f.encoded_bytes, false);
      if (m.opt.block_index) set_block_index(f, data.pieces.back().memory);  // older: get one
    } else {
      const auto recon = m.tensor_recon(v, f.tensor);
      if (f.digest && XXH3_64bits(recon->data.data(), recon->data.size()) != f.digest)
        throw corrupt_error("content: version " + std::to_string(v) +
                            " does not match its digest; not rewritten");
      bytes frame;
      codec::encode_exact_into(f.type, recon->data, frame);
      f.mode = tensor_mode::lossless;
      f.base_tensor = 0;
      f.data_at = data.size;
      f.encoded_bytes = frame.size();
      if (m.opt.block_index) set_block_index(f, frame);
      data.add(std::move(frame));
    }
    meta.tensors.push_back(f);
  }

  std::shared_lock object_gate(m.object_gate);
  const store::object_ref obj = write_object(m.objects, meta, data);
  data = {};
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
  // the same bytes and stays cached.
  return m.objects.disk_bytes(obj.id);
}

std::string content_store::verify(std::uint64_t v, bool deep,
                                  const std::function<void(std::uint64_t)>& progress) {
  auto& m = *impl_;
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
    if (item->obj_id != r.obj.id) return verify(v, deep, progress);  // rewritten meanwhile
    const version_meta& meta = *item->meta;
    const std::uint64_t area = r.obj.size - item->data_base;
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
    for (const auto& x : meta.exact)
      if (x.data_at + x.encoded_bytes > area) return "an exact region lies outside the object";
    for (const auto& f : meta.tensors) {
      if (f.data_at + f.encoded_bytes > area) return "a tensor frame lies outside the object";
      if (f.mode == tensor_mode::delta &&
          (!base_meta || f.base_tensor >= base_meta->meta->layout.tensors.size()))
        return "a delta frame names a base tensor that does not exist";
    }
    if (!deep) return {};
    for (std::size_t ri = 0; ri < meta.exact.size(); ++ri) {
      const auto& x = meta.exact[ri];
      const bytes enc = [&] {
        bytes b(x.encoded_bytes);
        m.objects.read(item->obj_id, item->data_base + x.data_at, b);
        return b;
      }();
      std::uint64_t decoded = 0;
      for (std::size_t b = 0; b < x.blocks.size(); ++b) {
        const std::uint64_t begin = x.blocks[b];
        const std::uint64_t end = b + 1 < x.blocks.size() ? x.blocks[b + 1] : x.encoded_bytes;
        if (end < begin || end > enc.size()) return "an exact region's block index is damaged";
        byte_buffer out(std::min<std::uint64_t>(x.block_bytes, x.length - decoded));
        codec::decode(std::span(enc).subspan(begin, end - begin), {}, out);
        decoded += out.size();
      }
      if (decoded != x.length) return "an exact region decodes to the wrong length";
    }
    for (const auto& f : meta.tensors) {
      // Decode this version's frame from disk, on top of the base's reconstruction (cached,
      // or decoded from its own chain).
      const std::uint64_t length = meta.layout.tensors.at(f.tensor).length;
      byte_buffer enc(f.encoded_bytes);
      m.objects.read(item->obj_id, item->data_base + f.data_at, enc);
      if (!f.blocks.empty()) {
        // A block index that is well-formed but wrong would serve shifted blocks whose own
        // checksums pass: compare it with the frame's headers.
        const auto fi = codec::index_frame(enc);
        if (fi.block_elements != f.block_elements || fi.offsets != f.blocks)
          return "tensor '" + meta.layout.tensors.at(f.tensor).name +
                 "' has a block index that does not match its frame";
      }
      byte_buffer out(length);
      if (f.mode == tensor_mode::delta) {
        const auto base = m.tensor_recon(r.base, f.base_tensor);
        if (base->data.size() != length) return "a delta frame's base has another size";
        codec::decode(enc, base->data, out);
      } else {
        codec::decode(enc, {}, out);
      }
      if (f.digest && XXH3_64bits(out.data(), out.size()) != f.digest)
        return "tensor '" + meta.layout.tensors.at(f.tensor).name +
               "' does not decode to its recorded digest";
      // The next version in the chain decodes on top of this one.
      auto item_out = std::make_shared<cache_item>();
      item_out->data = std::move(out);
      m.cache.put({v, k_tensor, f.tensor}, item_out, length);
    }
  } catch (const std::exception& e) {
    return e.what();
  }
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
