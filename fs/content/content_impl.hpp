#pragma once
// The content store's shared state and the map of where each part of it lives. Private to
// fs/content: only the content store's own .cpp files include it. The store is one object
// (content_store::impl); its work is split along the path data takes:
//
//   ingest.cpp            put(): recognise, write the object (exact regions, then each tensor),
//                         record the version
//   delta_base.cpp        the base a version gets: lineage, head or keyframe, its pin, and the
//                         base's reconstruction read a slab at a time
//   tensor_coding.cpp     each tensor's coding: its job (base, values, bits kept), each slab's
//                         table, encode_tensor() (a tensor into the object a slab at a time)
//   stream_ingest.cpp     streams: put()'s work done while the file is still being written
//   read_path.cpp         open() and the reader: metadata, exact blocks, chunked chain decoding,
//                         read-ahead workers
//   lineage_registry.cpp  versions and lineages: journal records, replay, references, info
//   reclaim.cpp           what nothing needs any more: reclaiming versions, deferred removal of
//                         objects that a decode in flight may still read
//   retention.cpp         management: rekey (prune's rewrite), verify, garbage collection
//   content_object.cpp    the object of one version: streamed data area, metadata trailer
//   encode_slots.cpp      the write path's working memory: a fixed number of slab sets
//   base_prefetch.cpp     read-ahead of a delta tensor's next base slab, while a slab is coded
//   dcp_names.cpp         DCP shards' state-dict names, from the .metadata beside them
//   content_store.cpp     construction and the small public helpers
#include <tbb/global_control.h>
#include <tbb/info.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <shared_mutex>
#include <span>
#include <stop_token>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/lru_cache.hpp"
#include "codec/error.hpp"
#include "codec/format/dcp_metadata.hpp"
#include "codec/tensor_codec.hpp"
#include "codec/xxh3.hpp"
#include "fs/content/base_prefetch.hpp"
#include "fs/content/buffer_pool.hpp"
#include "fs/content/content_store.hpp"
#include "fs/content/decode_tally.hpp"
#include "fs/content/encode_slots.hpp"
#include "fs/content/head_store.hpp"
#include "fs/content/thread_limits.hpp"
#include "fs/content/version_meta.hpp"
#include "fs/store/page_buffer.hpp"

namespace ckpt::fs {

class content_object_writer;

inline constexpr std::size_t kExactBlock = codec::default_block_bytes;
// A checkpoint whose exact bytes (zip records, pickles, small tensors) total at most this many
// keeps them in its metadata (version_meta::exact_inline).
inline constexpr std::uint64_t kInlineExactMax = std::uint64_t(4) << 20;
inline constexpr std::size_t kExactChunk =
    16 * kExactBlock;  // read this much of a region at a time

// The write path's unit: a tensor is read, delta-coded and written this many bytes at a time (16
// codec blocks, 4 read chunks), with its own bucket table (per-tensor scope: a table per slab of
// a larger tensor). Each encode running at once holds ~4 slabs (encode_slots.hpp).
inline constexpr std::size_t kSlabBytes = 16 * codec::default_block_bytes;
// How many slabs a tensor of `length` bytes is coded in (a frame's intra_slabs counts of them).
inline std::uint64_t slab_count(std::uint64_t length) {
  return (length + kSlabBytes - 1) / kSlabBytes;
}
// Whether a frame of a tensor of `length` bytes is decoded from its base: a delta frame, unless
// every slab of it was coded as values (intra blocks need no base: its chain ends there, as at
// a keyframe, and a cold read of Adam's m decodes one frame, not the chain).
inline bool decodes_from_base(const tensor_frame& f, std::uint64_t length) {
  return f.mode == tensor_mode::delta && !(length > 0 && f.intra_slabs == slab_count(length));
}
// A small checkpoint's reconstruction stays in the cache a whole tensor at a time, tensors up to
// this size: the transient overshoot while one is made is at most this.
inline constexpr std::uint64_t kRetainTensorMax = std::uint64_t(64) << 20;

// Kinds of cache entries.
enum : std::uint32_t { k_meta = 1, k_block = 2, k_tensor = 3, k_chunk = 4 };

// A cold read decodes tensors a chunk of this many codec blocks (4 MiB of payload at the default
// block size) at a time, when the version has a block index: torch.load's first bytes then wait
// for one chunk instead of a whole tensor, and the chunks live in a few recycled buffers instead
// of a tensor's worth of fresh memory.
inline constexpr std::size_t kChunkBlocks = 4;
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
  std::uint64_t data_base = 0;   // metadata items: payload offset of the data area
  std::uint64_t data_bytes = 0;  // metadata items: its length
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
inline const tensor_frame* frame_of(const cache_item& m, std::size_t t) {
  if (t >= m.frame_at.size() || !m.frame_at[t]) return nullptr;
  return &m.meta->tensors[m.frame_at[t] - 1];
}

// Payload bytes per chunk of a frame with a block index; 0 without one (decoded whole).
inline std::uint64_t chunk_bytes(const tensor_frame& f) {
  if (f.blocks.empty()) return 0;
  return std::uint64_t(kChunkBlocks) * f.block_elements * codec::element_size(f.type);
}

// Appends the blocks of one slab's encoding, which starts `frame_at` bytes into the frame, to the
// frame's block index. Blocks are cut by size alone, so every block but a tensor's last holds the
// same number of elements, across slabs too.
inline void index_slab(tensor_frame& f, std::span<const std::byte> enc, std::uint64_t frame_at) {
  const codec::frame_index fi = codec::index_frame(enc);
  if (f.blocks.empty()) f.block_elements = fi.block_elements;
  if (fi.block_elements != f.block_elements)
    throw corrupt_error("content: a slab's blocks differ in size from the frame's");
  for (auto o : fi.offsets) f.blocks.push_back(frame_at + o);
}

// A replaced tensor that straddles a zip member's boundary would change bytes the member's CRC
// covers without the member being rewritten whole: such a tensor is stored exact. Recognised
// files never have one; a hostile file might.
void keep_straddling_tensors_exact(format::layout& l);

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
                             std::span<const std::byte> values = {});

inline std::int64_t now_ns() {  // CLOCK_REALTIME, as version records keep it
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline std::vector<std::byte> to_bytes(const nlohmann::json& j) {
  const auto v = nlohmann::json::to_cbor(j);
  return {reinterpret_cast<const std::byte*>(v.data()),
          reinterpret_cast<const std::byte*>(v.data() + v.size())};
}

// Journal feature records (c.f): written once, before the first record that needs the feature.
// Versions that reuse other versions' blocks (version_rec::donors): a daemon that does not
// count donors would reclaim them and lose the blocks.
inline constexpr std::string_view kFeatureSharedExtents = "shared_extents";

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
  std::uint64_t dependents = 0;  // live versions whose base or donor it is
  // Exact files: versions whose objects hold some of this version's blocks (exact_region::src).
  // Each counts this version among its dependents while this version has a name (refs): a
  // version kept only as a donor itself is never read whole, so its own donors can go (collect
  // releases them; donors_released then refuses readers).
  std::vector<std::uint64_t> donors;
  bool donors_released = false;
  // Mantissa bits the version's rounded frames read back with (a lossy keyframe, the rounded
  // deltas on its chain, their rekeys: rounded_bits_of); 0: none rounded, or a delta frame that
  // could have been kept all its bits; -1: unknown (recorded before it was). What rotation's
  // estimate of a rewrite's cost goes by (chain_rewrite.cpp).
  int rounded_bits = -1;
  // Float elements the version holds in frames coded as values (a keyframe's intra frames, a
  // delta's frames intra in every slab; values_elements_of): a rekey copies those and codes
  // every other frame exactly, so a rewrite costs more than its keyframe by what it codes exactly
  // that the keyframe held as values (a lineage's first keyframe codes Adam's m as values by its
  // name, while a run saved every step codes m as differences). -1: unknown (recorded before).
  std::int64_t values_elements = -1;
  // A DCP shard: the items the .metadata beside it names in it, by offset (dcp_names.cpp). In
  // memory only: the names its tensors take reach the versions coded against it, whose
  // metadata records them (tensor_info::state_name).
  std::shared_ptr<const std::vector<format::dcp_storage_item>> dcp_items;
};
// rounded_bits of a version's metadata (see version_rec).
int rounded_bits_of(const version_meta& meta);
// values_elements of a version's metadata (see version_rec).
std::int64_t values_elements_of(const version_meta& meta);

struct lineage_rec {
  std::uint64_t id = 0;
  std::uint64_t signature = 0;
  std::string path_key;
  std::uint64_t head = 0;
  std::uint64_t since_keyframe = 0;
  bool journaled = true;  // its record is in the journal (a new lineage's goes with its first put)
  // heads=auto: the last head of this lineage lost its image because it was the lineage's only
  // live file (saved over, or rotated down to one). Its next save writes no reconstruction into
  // its staged bytes, as with heads=off, instead of a head image the save's rotation would drop:
  // a run that keeps one checkpoint writes each save once. Cleared by a commit that finds a file
  // of the lineage live besides the new version and the one it supersedes (the rotation after
  // a save deletes that one); that head's image is then rebuilt from its chain. Not journaled:
  // found again at startup from the live files (replay_done).
  bool single = false;
  std::shared_ptr<std::mutex> encode_mu = std::make_shared<std::mutex>();
};

struct content_store::impl {
  // Bounds oneTBB's workers for the codec's loops (thread_limits.hpp); process-wide while any
  // store lives (oneTBB applies the smallest of the live limits).
  // (oneTBB's own count: the process's CPU affinity, never 0.)
  tbb::global_control codec_threads{tbb::global_control::max_allowed_parallelism,
                                    codec_threads_for(usable_cores())};
  store::object_store& objects;
  store::journal& journal;
  content_options opt;
  mutable std::mutex mu;  // versions, lineages, counters
  std::map<std::uint64_t, version_rec> versions;
  std::map<std::uint64_t, lineage_rec> lineages;
  std::uint64_t next_version = 1, next_lineage = 1;
  bool shared_extents = false;          // the journal holds the shared_extents feature record
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
  // .metadata items for shard paths with no version yet (a shard closed without fsync, still
  // being stored): taken by the version recorded at that path. Bounded in entries and bytes,
  // the oldest going first (dcp_names.cpp).
  struct pending_items {
    std::uint64_t seq = 0;  // arrival order
    std::uint64_t bytes = 0;
    std::shared_ptr<const std::vector<format::dcp_storage_item>> items;
  };
  std::map<std::string, pending_items> pending_dcp_items;
  std::map<std::uint64_t, std::string> pending_dcp_order;  // seq -> path: the oldest first
  std::uint64_t pending_dcp_seq = 0, pending_dcp_bytes = 0;
  // Takes path's pending items out (null if none).
  std::shared_ptr<const std::vector<format::dcp_storage_item>> take_pending_dcp(
      const std::string& path);

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
  // The write path's working memory (puts and rekeys wait for a set).
  encode_slots slots;
  // Bases read ahead while a slab is coded (base_prefetch.hpp): two units, whatever the cores
  // (64 MiB at most); an encode without one reads its bases in turn.
  base_prefetch base_ahead;
  // Head images of large lineages (null: heads off, or their directory unusable: heads_error).
  std::unique_ptr<head_store> heads;
  std::string heads_error;

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
  static std::size_t prefetch_workers() { return prefetch_workers_for(usable_cores()); }
  static constexpr std::size_t kPrefetchQueueMax = 64;  // across readers; extra jobs are dropped
  std::mutex prefetch_mu;
  std::condition_variable_any prefetch_cv;  // waits are stop_token-aware: no lost wakeup
  std::deque<prefetch_job> prefetch_queue;
  std::atomic<std::uint64_t> prefetch_jobs{0};  // queued or running (status: reads settled)
  // What cold reads decode (ckptctl status); before `prefetchers`, whose workers record in it.
  decode_tally decodes;
  std::vector<std::jthread> prefetchers;  // last member: stopped and joined before what they use

  // Charges what the coding holds (encode sets, base read-ahead, the codec's per-thread
  // scratch) beyond kCodingAllowance to the cache: its budget shrinks by that much
  // (thread_limits.hpp). Cheap; called when an encode takes its set, after each slab it codes,
  // after each read-ahead job, and by usage().
  void charge_coding();
  std::mutex charge_mu;  // one charge at a time: a later one never applies an older figure
  // An encode set (waits for one), charged first: every encode starts here.
  encode_slots::lease acquire_slot() {
    encode_slots::lease l = slots.acquire();
    charge_coding();  // the set may have just been made
    return l;
  }

  // Decoded chunks of cold reads: a small cache carved out of cache=, its buffers recycled.
  static std::uint64_t chunk_budget(std::uint64_t cache_bytes) {
    return std::min(std::clamp<std::uint64_t>(cache_bytes / 8, 16u << 20, 128u << 20),
                    cache_bytes / 2);
  }
  impl(store::object_store& o, store::journal& j, content_options op);
  // Stops the head store's threads (their rebuilds read through this store: the read-ahead,
  // the decode counters) and then the read-ahead workers (they charge the coding under
  // charge_mu), before any member goes.
  ~impl();

  // How far ahead of a reader tensors are decoded: a quarter of the cache, so that read-ahead
  // for one file cannot push out what its reader is about to read.
  std::uint64_t read_ahead_bytes() const { return opt.cache_bytes / 4; }
  // Chunked: a third of the chunk cache, so that chunks decoded ahead are not evicted before
  // their reader arrives.
  std::uint64_t chunk_read_ahead_bytes() const { return chunks.budget() / 3; }
  // How far the kernel's reads of a file stray from its reader's own (read_ahead.hpp): more than
  // it reads ahead (128 KiB by default: read_ahead_kb of the mount's bdi) and than a large read's
  // 1 MiB pieces that FUSE threads serve at once.
  static constexpr std::uint64_t kStrayBytes = 8u << 20;

  // ---- read_path.cpp ----
  void prefetch(std::vector<prefetch_job> jobs);
  void prefetch_loop(std::stop_token stop);
  std::shared_ptr<const cache_item> meta_of(std::uint64_t v);
  // Loads the metadata of `base` and of the uncached versions below it on its chain, oldest
  // first (a format-4 delta's metadata needs its base's: read_path.cpp).
  void warm_base_metas(std::uint64_t base);
  byte_buffer read_data(std::uint64_t v, const cache_item& m, std::uint64_t at, std::uint64_t len);
  std::shared_ptr<const cache_item> exact_block(std::uint64_t v, std::size_t region,
                                                std::size_t block);
  void read_exact(std::uint64_t v, const version_meta& meta, std::uint64_t offset,
                  std::span<std::byte> out);
  std::shared_ptr<const cache_item> tensor_recon(std::uint64_t v, std::size_t t);
  byte_buffer materialize(std::uint64_t v, std::size_t t);
  std::shared_ptr<const cache_item> chunk_recon(std::uint64_t v, std::size_t t, std::size_t c,
                                                std::uint64_t bytes, bool parallel);
  // Both return the frames they decoded (one per version of the chain not found cached).
  std::size_t decode_chunk_into(std::uint64_t v, std::size_t t, std::size_t c,
                                std::span<std::byte> out, bool parallel);
  std::size_t decode_blocks_into(std::uint64_t v, std::size_t t, std::size_t b0, std::size_t b1,
                                 std::span<std::byte> out, bool parallel);
  void stray_blocks(std::uint64_t v, std::size_t t, std::size_t b0, std::size_t b1,
                    std::span<std::byte> out);
  std::uint64_t chain_chunk_bytes(std::uint64_t v, std::size_t t);

  // ---- retention.cpp, verify_chain.cpp ----
  // content_store::verify; without `frames`, --deep stops before the tensor frames (the exact
  // regions are decoded), which verify_chain decodes along the chain.
  std::string verify_version(std::uint64_t v, bool deep, bool frames,
                             const std::function<void(std::uint64_t)>& progress);
  // A frame's slabs as verify decodes them (per_slab blocks of block_bytes each; a slab is
  // kSlabBytes where the block size divides it), or what is wrong with its block index.
  struct frame_slabs {
    std::uint64_t block_bytes = 0;
    std::size_t per_slab = 0;
    std::string problem;
  };
  static frame_slabs slabs_of(const tensor_frame& f, const format::tensor_info& t);
  // Reads blocks [b0, b1) of frame `f` (of tensor `t`, in the object of `item`) into `enc`,
  // checked against the frame's block index; returns what is wrong, or "".
  std::string read_indexed_blocks(const cache_item& item, const tensor_frame& f,
                                  const format::tensor_info& t, std::size_t b0, std::size_t b1,
                                  std::vector<std::byte>& enc);

  // ---- lineage_registry.cpp (callers hold mu where noted) ----
  version_rec get(std::uint64_t v) const;
  version_rec get_for_read(std::uint64_t v) const;
  std::uint64_t deltas_since_keyframe(std::uint64_t v) const;  // mu held
  bool is_head(const version_rec& r) const;                    // mu held
  // Whether lineage `lineage`'s head image is worth its disk: some other version of the lineage
  // has a name (mu held), other than `besides` where given. With the head as its only live file
  // the image is a second full copy of it, and the store holds more than a plain directory
  // would ("Keeping one checkpoint").
  bool image_pays(std::uint64_t lineage, std::uint64_t head, std::uint64_t besides = 0) const;
  // A version of `lineage` lost its last name or pin (mu held): its head, when the head's image
  // no longer pays (image_pays) under heads=auto, marked lineage_rec::single; else 0. The caller
  // drops that image outside mu (head_store takes its own lock). Every path that lets refs reach
  // 0 asks, or an image outlives the reason for it (a reader's pin released last, an unref()
  // that ran before the image it should drop was adopted).
  std::uint64_t image_unpaid(std::uint64_t lineage);
  static nlohmann::json version_json(const version_rec& r);
  static nlohmann::json lineage_json(const lineage_rec& l);
  void apply_version(const nlohmann::json& j);                         // mu held
  std::uint64_t join_lineage(std::uint64_t from, std::uint64_t into);  // mu held (renamed())
  // Lineages joined into others (join_lineage), so that a stream that chose one before finds
  // where its versions went (mu held). In memory only: a stream does not outlive the daemon.
  std::map<std::uint64_t, std::uint64_t> joined_into;
  std::uint64_t current_lineage(std::uint64_t id) const {  // mu held
    for (auto it = joined_into.find(id); it != joined_into.end(); it = joined_into.find(id))
      id = it->second;
    return id;
  }
  static nlohmann::json join_json(std::uint64_t from, std::uint64_t into);
  static nlohmann::json feature_json(std::string_view feature);

  // ---- chain_rewrite.cpp ----
  // Lineages that lost a name since chains_to_rewrite() last looked (mu held).
  std::set<std::uint64_t> chain_hints;
  void hint_chain(std::uint64_t v);  // v lost its last name; mu held

  // ---- reclaim.cpp ----
  void collect(std::uint64_t v, std::vector<std::uint64_t>& objects_to_remove);  // mu held
  void remove_objects(const std::vector<std::uint64_t>& ids);
  void drain();

  // ---- ingest.cpp, delta_base.cpp, tensor_coding.cpp ----
  // A whole tensor's reconstruction as a save makes it (the next save's base), charged to the
  // cache under `key` before it is filled and pinned there until the filler lets go (the pin),
  // so that the cache makes room first and never pushes it out half-filled, uncounted. Empty
  // (no item) when the cache cannot take `length` bytes beside what other fillers pin.
  struct kept_whole {
    std::shared_ptr<cache_item> item;
    decltype(cache)::pin pin;
    // The item holds the base tensor's buffer, taken over from the cache: the encode reads each
    // base slab from target() and makes its reconstruction over it (encode_tensor's
    // base_in_recon). No fresh pages to fault in, and no room for a second copy of the tensor.
    bool base_here = false;
    // The base tensor taken out of the cache but not made the item's (keep_whole): the encode
    // reads it here (encode_tensor's base_held).
    std::shared_ptr<const cache_item> base_held;
    // Where encode_tensor makes the reconstruction (empty when nothing is kept).
    std::span<std::byte> target() const {
      return item ? std::span<std::byte>(item->data) : std::span<std::byte>();
    }
    void fill(std::uint64_t off, std::span<const std::byte> recon) const {
      if (item && item->data.data() + off != recon.data())  // not made in place
        std::memcpy(item->data.data() + off, recon.data(), recon.size());
    }
  };
  // `base`: the cached base tensor the encode reads. Where the cache is its only holder (no
  // reader has it) and it has the tensor's length, its buffer becomes the item's (base_here);
  // otherwise it is made the most recently used first, so that the room made is not that base.
  kept_whole keep_whole(const cache_key& key, std::uint64_t length,
                        std::optional<cache_key> base = std::nullopt);
  // content_store::put; `staged` (may be null) may become the version's head image.
  content_ref put(std::string_view path, const format::source& src,
                  std::shared_ptr<staged_file> staged);
  // The lineage of a checkpoint with signature `sig` at `path`, made (in memory) if there is
  // none (mu held).
  std::uint64_t lineage_for(std::string_view path, std::uint64_t sig);
  // The same, with its encode lock held.
  std::unique_lock<std::mutex> lock_lineage(std::string_view path, std::uint64_t sig,
                                            std::uint64_t& lineage_id);
  // What the next version of a lineage is coded against: its head, or for a lineage's first
  // version another lineage's (a fork); none for a keyframe. The base is pinned (a dependent)
  // until a base_pin lets go of it or the version's record takes it over.
  struct base_choice {
    std::uint64_t base = 0;
    std::uint64_t since = 0;  // deltas since the keyframe, up to the base
    bool keyframe = false;
    bool refresh = false;  // a delta at codec::max_bits (content_options::refresh_interval)
    // A keyframe's lineage head, the base it would have had (not pinned, only its record is
    // read): the tensors that head coded as values are coded so in the keyframe too.
    std::uint64_t previous = 0;
    // The new version's reconstruction goes into its staged bytes, which become its head image;
    // not where the base's lineage keeps one file (lineage_rec::single).
    bool image = true;
  };
  // The record of c.previous, or null (none, it went meanwhile, or keyframes are exact).
  std::shared_ptr<const cache_item> previous_meta(const base_choice& c);
  base_choice choose_base(std::uint64_t lineage_id);
  // A DCP shard's stream picks its base before the shard's tensors (its lineage signature) are
  // all known, from the tensors walked so far: the newest head of its path key's lineages,
  // else (a step written under another name) of the lineages with its rank tokens, that holds
  // every compressible tensor of `found` under its name with its dtype and shape; none for a
  // keyframe (also past keyframe_interval). Waits for a put of the path key's lineages
  // running now. Pinned as choose_base's.
  base_choice choose_shard_base(std::string_view path, std::span<const format::tensor_info> found);
  // Whether a shard's tensor is in `base` under its name with its dtype and shape (a shard's
  // names are positions: a changed model's tensor may come under a name of another shape).
  bool shard_tensor_in(const format::tensor_info& t, const cache_item& base,
                       const std::unordered_map<std::string, std::size_t>& base_by_name) const;
  void settle_choice(base_choice& c);  // keyframe or delta, an image or not, the pin (mu held)
  struct base_pin {
    impl& m;
    std::uint64_t base;
    bool armed = true;
    ~base_pin();
  };
  // Coding parameters of a new checkpoint version (meta.kind, bits, coding).
  void start_coding(version_meta& meta, const base_choice& c) const;
  codec::lossy_params coding_params_of(const version_meta& meta) const;
  // meta.coding.keyframe_bits: set when one of its frames was rounded, else 0.
  void note_rounding(version_meta& meta) const;
  // `p` for a slab coded as `kind`: second moments' ratio deltas may have their own bits
  // (ratio_bits), as their tables do (table_for, shared_slot).
  codec::lossy_params params_for(codec::lossy_params p, codec::delta_kind kind, bool second_moment,
                                 bool refresh = false) const;
  static std::unordered_map<std::string, std::size_t> tensors_by_name(const cache_item& meta);
  // The base tensor `t` is coded against: the base's tensor of the same name, type and size.
  std::optional<std::size_t> base_tensor_for(
      const format::tensor_info& t, const cache_item* base_meta,
      const std::unordered_map<std::string, std::size_t>& base_by_name) const;
  // Writes every run of the layout that is not a compressed tensor as exact regions.
  void write_exact_regions(const format::source& src, const format::layout& layout,
                           version_meta& meta, content_object_writer& out,
                           std::vector<std::byte>& enc) const;
  // meta.member_crcs: the served CRC of each zip member with a rewritten payload; with `head`,
  // also written into its CRC fields (the staged bytes becoming the head image).
  void member_crcs(version_meta& meta, const format::layout& layout,
                   const std::vector<std::uint32_t>& tensor_crc, const std::vector<bool>& replaced,
                   const format::source& src, std::span<std::byte> scratch,
                   staged_file* head) const;
  // Finishes the object and appends the version's record; the lineage's head moves to it and
  // `head` (if any) becomes its head image. id 0: taken now.
  content_ref record_version(std::string_view path, version_meta meta, content_object_writer& out,
                             std::uint64_t id, std::uint64_t lineage_id, const base_choice& bc,
                             base_pin& pin, std::vector<std::uint64_t> donors,
                             std::shared_ptr<staged_file> head);
  // ---- dcp_names.cpp ----
  // A stored file at `path` named .metadata or .metadata.tmp: if it is DCP's Metadata pickle,
  // its items go to the newest version of each shard it names (or wait for it). Never throws:
  // the file is stored already, and a shard without names is only coded as before.
  void note_dcp_metadata(std::string_view path, const format::source& src) noexcept;
  // The state-dict names the tensors of a version hold (from its .metadata's items, else as
  // recorded in its metadata), for naming the shard coded against it.
  struct shard_names {
    std::shared_ptr<const cache_item> meta;
    std::unordered_map<std::string, std::size_t> by_name;
    std::unordered_map<std::string, std::string> names;  // tensor name -> state-dict name
  };
  shard_names shard_names_of(std::uint64_t version);
  // Sets t.state_name to the name of the version's tensor at t's position, when it has one
  // and the same dtype and shape. Call in file order: from the first compressible tensor the
  // version does not hold so, `n` names nothing more (a changed model's positions).
  void name_shard_tensor(format::tensor_info& t, shard_names& n) const;

  // One compressed tensor of a put: what to code it against.
  struct tensor_job {
    std::size_t tensor;
    codec::dtype type;
    std::optional<std::size_t> base_tensor;  // a delta against this tensor of the base version
    // The frame's floats read back with this many mantissa bits (0: all of them): without a
    // base, rounded before exact coding (a lossy keyframe); a delta's blocks round what they
    // reconstruct (codec::lossy_params::round_bits).
    int keep_bits = 0;
    // A keyframe's tensor coded lossily as its values (codec::delta_kind::intra, decoded without
    // a base), as the previous head coded it or, with no head to follow, as a first moment by
    // its name (is_first_moment): Adam's m, nearly new at every save, costs a keyframe what it
    // costs a delta instead of 12 mantissa bits.
    bool values = false;
    // Adam's second moment by name (is_second_moment): its ratio deltas get ratio_bits.
    bool second_moment = false;
    // Adam's first moment by name (is_first_moment): its intra slabs keep one bucket fewer
    // (content_options::intra_buckets).
    bool first_moment = false;
    // Difference slabs (which have a base) coded with codec::max_bits (base_choice::refresh).
    bool refresh = false;
    // Not optimizer state (is_optimizer_state): the weights' error allowance applies
    // (content_options::weight_error). With `named`: a slab its base predicts worse than zero
    // does is stored as a keyframe stores it, not coded as values (encode_tensor).
    bool weights = false;
    // The role is the tensor's own name, not a DCP shard's position ("item<k>/...") that no
    // .metadata has named yet: what it is, and so `weights`, is known.
    bool named = true;
    // The frame reads back other than the bytes written: its reconstruction goes to the head.
    bool rewrites() const noexcept { return base_tensor || keep_bits || values; }
  };
  // The job of coding layout tensor `index`: its base tensor (base_tensor_for) and, without
  // one, the mantissa bits a lossy keyframe rounds it to.
  // With a keyframe's `previous` record (previous_meta), a tensor it coded as values is coded
  // so again (tensor_job::values).
  tensor_job job_for(
      std::size_t index, const format::tensor_info& t, const cache_item* base_meta,
      const std::unordered_map<std::string, std::size_t>& base_by_name,
      const cache_item* previous = nullptr,
      const std::unordered_map<std::string, std::size_t>* previous_by_name = nullptr) const;
  struct tensor_result {
    tensor_frame frame;
    std::uint32_t crc = 0;  // CRC-32 of the reconstruction (zip members are rewritten with it)
    bool any_ratio = false;
    std::uint32_t intra_slabs = 0, grid_slabs = 0;
  };
  // Where encode_tensor's working memory comes from: a put's one set, or (a stream) a set per
  // slab, taken once wait() says the slab's bytes are written (false: stop, io_error ECANCELED).
  struct slab_source {
    encode_slots::slabs* fixed = nullptr;
    std::function<bool(std::uint64_t end)> wait;
    // The base's head image, retired for this stream (head_store::retire): read from it, and
    // each base slab released from it once coded.
    std::shared_ptr<head_image> retired;
  };
  exact_region write_exact_region(const format::source& src, std::uint64_t offset,
                                  std::uint64_t length, content_object_writer& out,
                                  std::vector<std::byte>& enc) const;
  // ---- exact_extents.cpp ----
  // Stores an exact file's data into meta.exact and `out`: only its data runs (holes cost
  // nothing), reusing in place the encoded blocks of the version it was opened over where its
  // bytes are unchanged (staged_file::unchanged), so a small change to a large file costs about
  // the chunks it touched. Returns the donors: the versions whose objects hold reused blocks.
  std::vector<std::uint64_t> write_exact_file(const format::source& src, const staged_file* staged,
                                              version_meta& meta, content_object_writer& out,
                                              std::vector<std::byte>& enc);
  // Streams one tensor into `out` a slab at a time; `recon_sink` sees each slab's
  // reconstruction (offset in the tensor, bytes). `recon_into` (empty, or the tensor's length):
  // where the coded slabs' reconstructions are made, instead of the slab's scratch (a
  // reconstruction kept whole in the cache: no copy of it); the sink still sees every slab.
  // Checkpoint scope's tables, shared by every slab of their kind: differences, ratios, and
  // second moments' ratios (ratio_bits; the ratio table itself where its bits are the same).
  using shared_tables_t = std::array<codec::quant_table, 3>;
  static std::size_t shared_slot(codec::delta_kind kind, bool second_moment,
                                 const content_options& opt) noexcept;
  tensor_result encode_tensor(
      const format::source& src, const format::tensor_info& t, const tensor_job& j,
      std::uint64_t base_id, const shared_tables_t* shared_tables,
      const codec::lossy_params& params, const slab_source& slabs, content_object_writer& out,
      const std::function<void(std::uint64_t, std::span<const std::byte>)>& recon_sink,
      std::span<std::byte> recon_into = {}, bool base_in_recon = false,
      std::shared_ptr<const cache_item> base_held = nullptr);
  // Bytes [offset, offset + out.size()) of the reconstruction of tensor t of version v: from the
  // cached whole tensor, else decoded through its chain a chunk at a time (offset a multiple of
  // the chunk size), else (versions without block index) from a whole-tensor decode. `whole`
  // carries a whole tensor from one call to the next.
  // `retired`: v's retired head image (slab_source::retired), read where it still holds the bytes.
  // Queues the head image of a lineage head that has none to be written from its chain
  // (head_store::rebuild), when its tensors make head_min; a damaged version is left to its
  // reads, which decode.
  void rebuild_head(std::uint64_t v, std::uint64_t checksum, std::uint64_t size) noexcept;
  void read_recon_slab(std::uint64_t v, std::size_t t, std::uint64_t offset,
                       std::span<std::byte> out, std::shared_ptr<const cache_item>& whole,
                       const head_image* retired = nullptr);

  // ---- stream_ingest.cpp ----
  void run_stream(content_store::stream& s);  // the stream's thread
  // A stream's retired base image (head_store::retire) back to the head store, once the
  // stream's version is stored or given up; rebuilt when its version is still a head without
  // an image (the stream's file was not stored as its successor).
  void give_back_image(std::shared_ptr<head_image>& image) noexcept;
  // Whether most of `base`'s tensors that a save keeps whole in the cache are there now (not a
  // use of them); true for 0 (no base). Throws what meta_of() throws.
  bool base_in_cache(std::uint64_t base);
  // The commit of a stream whose work is good: exact regions, CRCs, the record. Nothing (and
  // `why`) when the finished file is not what the stream walked.
  std::optional<content_ref> finish_stream(content_store::stream& s, std::string_view path,
                                           std::string& why);
  std::atomic<std::uint64_t> streams_running{0}, streamed_puts{0}, streams_dropped{0};
  std::atomic<std::uint64_t> saves_without_image{0};  // base_choice::image false, since the start
  std::atomic<std::uint64_t> streams_declined{0};
  // Cache keys of streams' kept reconstructions before their version has an id: version ids
  // never reach this bit.
  static constexpr std::uint64_t kStreamCacheKeys = std::uint64_t(1) << 63;
  std::atomic<std::uint64_t> stream_cache_keys{0};
  // Streams of files of head_min or more, alive now (from when the stream knows the size until
  // after the commit): the large saves in progress.
  std::atomic<std::uint32_t> large_saves{0};
  std::atomic<std::uint64_t> streams_not_kept{0};     // usage::streams_not_kept
  std::atomic<std::uint64_t> streams_kept_bytes{0};   // usage::streams_kept_bytes
  std::atomic<std::uint64_t> kept_in_place_bytes{0};  // usage::kept_in_place_bytes
  std::atomic<std::uint64_t> streamed_bytes{0};       // tensor bytes coded by streams
  mutable std::mutex declined_mu;
  std::string last_declined;  // why the last declined stream declined (declined_mu)
  log_sink log;               // set_logger's

  // ---- retention.cpp ----
  // Appends `len` encoded bytes at data-area offset `at` of the version `from` (a metadata
  // item) to `out`, a slab at a time; with `index`, block by block, recording each block's
  // offset in index->blocks (a frame from before block indexes gets one).
  void copy_encoded(const cache_item& from, std::uint64_t at, std::uint64_t len,
                    content_object_writer& out, encode_slots::slabs& slab,
                    tensor_frame* index) const;
};

}  // namespace ckpt::fs
