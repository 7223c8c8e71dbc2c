#pragma once
// Stored file contents: every finished file becomes a *version* in the content store. A file the
// recognisers do not know is stored exact (zstd). A recognised checkpoint joins a lineage and is
// stored as a keyframe (lossless) or a delta against the reconstruction of the lineage's previous
// version (LC-Checkpoint). Readers get the served bytes of a version at any offset.
//
// Persistence: put() writes the version's object (durable) and appends a content record to the
// shared journal WITHOUT syncing; the caller appends its own record (the name that now points at
// the version) and calls journal::sync(), which commits both. On replay the daemon hands every
// record to apply(); the ones that are not content records are left to the namespace.
//
// Lifetime: the namespace holds references (ref/unref) for the names that point at a version. A
// version without references stays as a hidden base while a live version depends on it and is
// reclaimed (object removed) when nothing does. No FUSE here.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "codec/format/recognise.hpp"
#include "codec/format/source.hpp"
#include "codec/quantizer.hpp"
#include "codec/tensor_codec.hpp"
#include "fs/content/log_sink.hpp"
#include "fs/content/staged_file.hpp"
#include "fs/content/version_meta.hpp"
#include "fs/store/journal.hpp"
#include "fs/store/object_store.hpp"

namespace ckpt::fs {

// Defaults chosen by the recovery benchmark (tests/bench/recovery.py, docs/benchmarks.md,
// fourth session): the best compression among the settings within 0.2 pp of accuracy (MF: 1% of
// test MSE) after 10 restores: b=3, midrange representatives, per-tensor buckets, optimizer
// state coded like the weights with ratio deltas for nonnegative state (Adam's v; with
// differences lossy Adam moments diverged after early restores), a keyframe every 20 versions.
struct content_options {
  int bits = 3;  // 1..4
  // Bits for the ratio-coded deltas of second moments (is_second_moment, by name: Adam's
  // exp_avg_sq), 1..4; 0: `bits`. Adam's step divides by their square root, and their own
  // estimate is noisy (benchmarks.md, "Fewer bits for Adam's v"). Other ratio-coded tensors
  // (weights that happen to be nonnegative, as a LayerNorm's scale; DCP items no .metadata
  // named, dcp_names.cpp) keep
  // `bits`: one factor, at 1 bit, would move them one way only. With the paper's checkpoint
  // scope the second moments share a ratio table of their own where ratio_bits differs.
  int ratio_bits = 0;
  // Lossy keyframes: the float tensors a lossy lineage codes are rounded to this many mantissa
  // bits (fp32's scale; fp16/bf16 keep min(this, their own)) in keyframes and in frames without
  // a base, each element within 2^-(N+1) of its value (2^-N in the top binade, truncated
  // rather than rounded up to infinity) (codec/mantissa.hpp). 0: exact. Not with
  // `lossless`, nor for optimizer state under exact_optimizer; rekey and rotation rewrites stay
  // exact (a version must keep reading as it did).
  int keyframe_bits = 0;
  // Second-moment state (is_second_moment: Adam's exp_avg_sq) on a lossy chain
  // (keyframe_bits > 0) keeps this many mantissa bits instead: keyframes round it so, and deltas
  // on a rounded chain round what they reconstruct so. Adam divides by its square root, and its
  // deltas already carry several per cent of error (ratio coding; at one ratio bit each element
  // within a factor 2), so bits beyond a few (2: each element within 2^-3) buy nothing but
  // keyframe bytes. 0: keyframe_bits. (The mount's default: fs/fuse/options.hpp.)
  int moment_bits = 0;
  // A slab's bits: `refresh` (a refresh delta, refresh_interval) gives difference slabs
  // codec::max_bits.
  int bits_for(codec::delta_kind k, bool second_moment, bool refresh = false) const noexcept {
    if (refresh && k == codec::delta_kind::difference) return codec::max_bits;
    return k == codec::delta_kind::ratio && second_moment && ratio_bits ? ratio_bits : bits;
  }
  bool lossless = false;  // every checkpoint stored exactly (float-aware lossless)
  // Every N-th version of a lineage is a keyframe. 0 (auto): N = 1 GiB / the size of the
  // version before, within 20..1000 (keyframe_interval_for): a cold read of any version of a
  // file then decodes about 1 GiB of deltas at most, and small checkpoints, whose keyframes were
  // most of their store (22-47% of the recovery benchmark's at 20), keep long chains.
  int keyframe_interval = 20;
  static constexpr int kAutoKeyframeMin = 20, kAutoKeyframeMax = 1000;
  static constexpr std::uint64_t kAutoKeyframeReplay = std::uint64_t(1) << 30;
  int keyframe_interval_for(std::uint64_t size) const noexcept {
    if (keyframe_interval > 0) return keyframe_interval;
    const std::uint64_t n = kAutoKeyframeReplay / std::max<std::uint64_t>(size, 1);
    return int(std::clamp<std::uint64_t>(n, kAutoKeyframeMin, kAutoKeyframeMax));
  }
  // Every N-th delta after a keyframe (a refresh) codes its differences (the weights', SGD's
  // momentum) with codec::max_bits instead of `bits`: the error a chain gathers below the
  // coarser buckets' smallest step goes back down, as a keyframe would take it, for a fraction
  // of a keyframe's bytes. 0: none.
  int refresh_interval = 0;
  std::uint64_t cache_bytes = std::uint64_t(2) << 30;  // reconstructed states and decoded data
  codec::representative rep = codec::representative::midrange;
  codec::bucket_scope scope = codec::bucket_scope::tensor;
  // paper: LC-Checkpoint's coder (one Huffman code word per symbol); grouped: our symbol groups
  // with the best entropy coder per block.
  bool paper_coding = false;
  // Optimizer state (Adam's exp_avg/exp_avg_sq, momentum buffers; see is_optimizer_state) is
  // stored losslessly in every version instead of as a lossy delta.
  bool exact_optimizer = false;
  // Tensors that are nonnegative in both versions (Adam's exp_avg_sq) are coded as relative
  // changes (codec::delta_kind::ratio) instead of differences.
  bool relative = true;
  // A difference slab whose base predicts it worse than zero does (codec::prefer_intra: Adam's
  // first moment, nearly new at every save) is coded as its values (codec::delta_kind::intra),
  // per-tensor tables only. Lossy keyframes follow the head before them, or, with none, code
  // Adam's exp_avg so by its name (tensor_coding.cpp, job_for).
  bool intra = true;
  // Buckets an intra slab keeps, 1 .. 2^bits - 1; 0: 2^bits - 3 (at least 1), and one fewer
  // for a first moment (is_first_moment: Adam's m). Values span fewer octaves than differences
  // from an unrelated base, so fewer buckets reach the error a difference had (the
  // language-model benchmark's Adam m: benchmarks.md, "Adam's first moment coded as values").
  // Adam's m is nearly new at every save and Adam rebuilds it after a restore, so its one
  // bucket fewer cost neither benchmark accuracy (the Adam MLP saved every 10 iterations: 0.8
  // more iterations of rework); SGD's momentum buffer with one fewer did (benchmarks.md,
  // "Adam's m with one bucket fewer").
  int intra_buckets = 0;
  int intra_buckets_for(int bits, bool first_moment = false) const noexcept {
    const int most = (1 << bits) - 1;
    if (intra_buckets) return std::min(intra_buckets, most);
    return std::max(1, most - (first_moment ? 3 : 2));
  }
  // Difference slabs on a uniform grid (codec::select_grid): > 0, step = this times the RMS of
  // the slab's change, each element to the nearest multiple; kAutoGrid: per fp32 slab the grid
  // or the buckets, whichever is estimated to cost fewer bits at the buckets' error
  // (codec::select_difference; the default: more compression than the buckets at their error on
  // every workload of the recovery and language-model benchmarks, benchmarks.md "Grid tables");
  // 0: the paper's buckets. Auto keeps the buckets for f16/bf16 slabs (the estimate models fp32
  // arithmetic: on bf16 steps near its unit it chose grids with 1.2-3x the error), for the
  // paper's coding or scope, and with bits = 1; ratio and intra slabs always do.
  static constexpr double kAutoGrid = -1;
  double grid_step = kAutoGrid;
  // With grid=auto, a weights' difference slab (not optimizer state) whose buckets would leave an
  // error below weight_error times the RMS of its values may take a coarser grid, up to that
  // error and at most grid_error times the buckets' mean square error (codec::error_allowance):
  // where checkpoints come often or training moves slowly (a step small against the weights),
  // the buckets' error is far below what matters and costs bits; where steps are large it is
  // not changed. Not in refreshes, which are there to take the error down. 0 (the default, the
  // mount's too): the buckets' error everywhere. Opt-in: on the recovery benchmark matrix
  // factorisation saved every 10 iterations, at its accuracy limit with the buckets' error,
  // went past it at 2.5% and 1.5% and reached it at 1% (benchmarks.md, "An error allowance
  // for the weights").
  double weight_error = 0;
  double grid_error = 4;
  // The error a weights' difference slab with values `values` may carry (table_for): none
  // beyond the buckets' unless weight_error applies (empty `values`: optimizer state, none).
  codec::error_allowance allowance_for(codec::dtype type, std::span<const std::byte> values,
                                       bool refresh) const noexcept {
    if (!(weight_error > 0) || refresh || type != codec::dtype::f32 || values.empty()) return {};
    return {weight_error * weight_error * codec::sampled_mean_square(type, values), grid_error};
  }
  // Record each frame's block index (chunked cold reads). false only in tests, to write objects
  // as stores from before the index did and check that they still read.
  bool block_index = true;
  // Heads (head_store.hpp): the newest version of each lineage whose compressed tensors make at
  // least head_min bytes is kept as an image of what it reads as, in heads_dir, so that the next
  // delta's base and the usual restore do not replay the chain. Empty heads_dir: no heads.
  std::string heads_dir;
  std::uint64_t head_min = std::uint64_t(64) << 20;
  // Where a lineage's head is its only live file (saved over one path, rotated down to one),
  // its image would be a second full copy of it: false (heads=auto) keeps none there, true
  // (heads=on) keeps one anyway, for restores at a plain directory's speed.
  bool heads_always = false;
  // Float tensors of fewer bytes are stored exactly in every version instead of coded
  // (format::recognise_options::min_compress_bytes): Adam's step counters, loss scales. A
  // tensor's frame, its table and its metadata cost about 100-200 bytes, so below a few hundred
  // bytes coding saves nothing.
  std::uint64_t min_tensor_bytes = 4096;
  format::recognise_options recognise() const {
    format::recognise_options r;
    r.min_compress_bytes = std::max<std::uint64_t>(min_tensor_bytes, 1);
    return r;
  }
  // Content object format written (content_object.hpp). 1 to 3 only in tests: objects as
  // older stores have them (before streamed objects, before compressed metadata, before a
  // delta's metadata was compressed against its base's exact bytes), to check that they still
  // read.
  std::uint32_t object_format = 4;
  // Tests only: called where another thread may run, with the version concerned, to run it
  // there.
  struct hooks {
    // A put after its version is recorded, before the version's head image is adopted.
    std::function<void(std::uint64_t version)> after_record;
    // A stream giving back the head image it retired, before the image's rebuild is queued.
    std::function<void(std::uint64_t version)> before_give_back_rebuild;
  } test_hooks;
};

// Whether grid=auto applies (content_options::grid_step): not under the paper's coding or scope,
// nor with one bit a symbol.
inline bool auto_grid(const content_options& o) noexcept {
  return o.grid_step < 0 && o.bits >= 2 && !o.paper_coding &&
         o.scope == codec::bucket_scope::tensor;
}

// True for tensors whose dict key path names optimizer state: a last component such as exp_avg,
// exp_avg_sq, max_exp_avg_sq, momentum_buffer, square_avg, acc_delta, or a path under an
// "optimizer"/"optim"/"optimizer_state" key.
bool is_optimizer_state(std::string_view tensor_name) noexcept;
// True for an optimizer's running mean of squared gradients by its key's last component:
// exp_avg_sq and max_exp_avg_sq (Adam, AdamW, AMSGrad), square_avg (RMSprop).
bool is_second_moment(std::string_view tensor_name) noexcept;
// True for Adam's (AdamW's) running mean of gradients by its key's last component, exp_avg:
// nearly new at every save a few steps apart, so a lossy keyframe with no earlier head to say
// otherwise codes it as its values. Not SGD's momentum_buffer: coding it so cost LeNet-5
// accuracy (measured in the recovery benchmark; why was not).
bool is_first_moment(std::string_view tensor_name) noexcept;
// True for a DCP shard's positional tensor name, "item<k>/..." (format::distcp's item_name):
// it says where the tensor is in the shard, not what it is.
bool is_position_name(std::string_view tensor_name) noexcept;
// The class `ckptctl stat` reports fidelity by (class_fidelity): "exp_avg" or "exp_avg_sq" (the
// last component), "optimizer (other)" for other optimizer state, else "weights".
std::string tensor_class(std::string_view tensor_name);

// A stored file version. version 0 is the empty file (no object, size 0).
struct content_ref {
  std::uint64_t version = 0;
  std::uint64_t size = 0;  // logical bytes
  bool operator==(const content_ref&) const = default;
};

// Random access to the served bytes of one version. Thread-safe; may be shared by many opens.
class content_reader {
 public:
  virtual ~content_reader() = default;
  virtual std::uint64_t size() const = 0;
  // Like pread: fills min(out.size(), size() - offset) bytes and returns the count. Throws
  // ckpt::corrupt_error when stored data is damaged (the FUSE boundary answers EIO).
  virtual std::size_t read(std::uint64_t offset, std::span<std::byte> out) const = 0;

  // Bytes the reader already holds in memory, to send without copying them first.
  struct view {
    std::shared_ptr<const void> keep;  // keeps `bytes` valid while held
    std::span<const std::byte> bytes;
  };
  // The served bytes [offset, offset + min(len, size() - offset)) if they lie in one piece of
  // memory the reader holds (a reconstructed tensor; no CRC field lies inside a payload), with
  // the same effects as read() of that range; otherwise an empty view (use read()).
  virtual view peek(std::uint64_t /*offset*/, std::size_t /*len*/) const { return {}; }

  // A file descriptor holding exactly the served bytes (a published head image), which the
  // kernel may read on its own (FUSE passthrough), or -1. Valid while the reader lives.
  virtual int backing_fd() const { return -1; }
};

// What `ckptctl stat` shows about one version.
struct version_info {
  std::uint64_t version = 0;
  std::string format;         // "opaque", "torch_zip", ...
  std::string kind;           // "exact", "keyframe", "delta"
  std::uint64_t lineage = 0;  // 0 for exact files
  std::uint64_t base = 0;     // base version of a delta, else 0
  std::uint64_t logical_bytes = 0;
  std::uint64_t stored_bytes = 0;
  std::string path;              // the path it was written at
  std::int64_t created_ns = 0;   // when it was stored (CLOCK_REALTIME); 0 if not recorded
  std::uint64_t refs = 0;        // names pointing at it (0: a hidden base or lineage head)
  std::uint64_t object = 0;      // object id
  std::uint64_t head_bytes = 0;  // disk bytes of its head image (0: none, or not on disk yet)
  // Exact files rewritten in part: the versions whose objects hold blocks it reuses (while it
  // has a name; see docs/format.md, `d`).
  std::vector<std::uint64_t> donors;
};

// What `ckptctl stat` shows beyond version_info: how each tensor is stored.
struct tensor_detail {
  std::string name;
  std::string state_name;  // a DCP shard's tensor: its name in the state dict, when known
  std::string dtype;
  std::uint64_t elements = 0;
  // "delta" / "ratio" / "intra" / "ratio+intra" (a tensor of several slabs, some of each) /
  // "rounded" / "lossless"
  std::string mode;
  std::uint64_t stored_bytes = 0;
  // Relative L2 error of the reconstruction against the tensor as written (codec/fidelity.hpp):
  // 0 for lossless tensors, negative when not recorded (versions from before it was measured).
  double rel_error = -1;
};
// The relative L2 error of a class of tensors (their summed errors over their summed squares):
// "weights" (everything that is not optimizer state), "exp_avg", "exp_avg_sq" (Adam's moments),
// "optimizer (other)" (momentum buffers, ...). Only classes with lossy tensors are listed.
struct class_fidelity {
  std::string name;
  std::uint64_t tensors = 0;
  double rel_error = 0;
};
struct version_detail {
  version_info info;
  coding_params coding;
  std::uint64_t exact_stored_bytes = 0;  // non-tensor bytes (zip framing, pickle, small tensors)
  std::vector<tensor_detail> tensors;
  std::vector<class_fidelity> fidelity;
};

// The JSON the daemon serves as the virtual xattr "user.ckptfs.info" (read by `ckptctl stat`).
std::string to_json(const version_info& info);

class content_store {
 public:
  content_store(store::object_store& objects, store::journal& journal, content_options opt);
  ~content_store();
  content_store(const content_store&) = delete;
  content_store& operator=(const content_store&) = delete;

  // Replay: consumes the record and returns true if it is a content record.
  bool apply(std::span<const std::byte> record);
  // After replay: `live` are the versions the namespace references (each once per name).
  // Versions neither referenced nor needed as a base are reclaimed.
  void replay_done(std::span<const content_ref> live);

  // Stores a finished file's bytes; `path` is its path inside the mount (for lineage matching).
  // Throws ckpt::io_error (ENOSPC, EIO) with nothing committed. The returned version holds one
  // reference for the caller's name.
  content_ref put(std::string_view path, const format::source& data);
  // The same for bytes the filesystem staged (its write buffer). A large checkpoint's staged
  // bytes may be rewritten in place into what the version reads as and kept as its lineage's
  // head image (head_store.hpp): afterwards staged->modified() is true, also when put throws.
  content_ref put(std::string_view path, std::shared_ptr<staged_file> staged);

  // Streaming writes (docs/filesystem.md, "Streaming writes"): a large torch.save file, or a DCP
  // shard (a path ending in .distcp), is encoded while it is written. The filesystem starts a
  // stream over a file being written from its start once its first bytes are there
  // (staged->begin_stream() done by the caller); a thread of the stream's own then reads the
  // archive's records as they arrive (waiting with staged_file::await), picks the base, and codes
  // each tensor against it the moment its bytes are in, writing the frames into the version's
  // object and, with head images, the reconstruction over the staged bytes (the image to be).
  // The lineage is not locked meanwhile, and no working memory is held while it waits: an encode
  // slot is taken per slab.
  //
  // put(path, staged, stream) finishes it (it calls staged->complete_stream()): when the finished
  // file is the archive the stream predicted and nothing it read was rewritten (staged->stale()),
  // only the rest (the last tensors, the exact regions, the record) is left to do; otherwise the
  // stream's work is dropped and the file is stored as put() stores it. A stream that declines
  // (not a torch.save archive, or not a shard of several; compressible tensors below head_min;
  // with heads off, tensors the commit would keep in the cache: no more than half its budget)
  // ends without doing anything. A shard's base is chosen by its path before its lineage
  // signature is known (choose_shard_base), once that many of its tensors' bytes are walked.
  // Destroying an unfinished stream cancels it and waits for its thread; its partial object is
  // removed.
  class stream;
  std::shared_ptr<stream> start_stream(std::string path, std::shared_ptr<staged_file> staged);
  content_ref put(std::string_view path, std::shared_ptr<staged_file> staged,
                  std::shared_ptr<stream> s);

  std::shared_ptr<const content_reader> open(const content_ref& ref);
  // A reader of the version's published head image (its backing_fd() a complete file of the
  // served bytes), or null when the version has none on disk. Cheap: no I/O.
  std::shared_ptr<const content_reader> published_head(const content_ref& ref) const;

  // Objects that a record appended by put() made unnecessary (the superseded lineage head). They
  // may only go once that record is durable: the caller takes them before journal::sync() and
  // hands them to remove_objects() after it succeeded (or after compact()). On a failed sync it
  // hands them back with return_unneeded_objects(), so that the next successful sync or
  // compaction removes them (until then they stay in place: never a dangling reference).
  std::vector<std::uint64_t> take_unneeded_objects();
  void return_unneeded_objects(const std::vector<std::uint64_t>& ids);
  void remove_objects(const std::vector<std::uint64_t>& ids);
  // True when take_unneeded_objects() has something: the flusher then syncs soon.
  bool has_unneeded_objects() const;

  // A name of `ref` moved to `new_path` (a rename of the file or of a directory above it). A
  // lineage forked by a file written under a temporary name (a step directory written as
  // tmpXXXX/ and renamed, DESIGN.md §4) is joined to the lineage it forked from when the new
  // name is that lineage's: the steps of one rank stay one lineage. Joins only when `ref` is
  // its lineage's newest version, every version of that lineage is newer than the other
  // lineage's head, and neither lineage is encoding; otherwise nothing changes. Appends a
  // journal record without sync (a lost join only leaves the fork).
  void renamed(const content_ref& ref, std::string_view new_path);
  void ref(const content_ref& ref);
  void unref(const content_ref& ref);  // may reclaim space (after the caller's journal sync)

  version_info info(const content_ref& ref) const;
  // Whether the version may be read past the kernel page cache: a reconstructed torch checkpoint
  // (its tensors are decoded, and torch.load copies records out rather than mapping them).
  // Formats that readers map shared (safetensors, .npy) are not: before kernel 6.6
  // (FUSE_DIRECT_IO_ALLOW_MMAP) FUSE refuses MAP_SHARED of a direct-I/O file (ENODEV), and
  // mapped readers are served better from the page cache. Cheap: no I/O. False for unknown
  // versions.
  bool direct_read_ok(const content_ref& ref) const;
  // [offset, end) runs of the version that may hold data, ascending; the rest reads as zeros
  // (holes of an exact file). Reads the version's metadata (may do I/O; not under a hot lock).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> data_runs(const content_ref& ref);
  // The version's object payload bytes (what it takes on disk, st_blocks). Cheap: no I/O.
  std::uint64_t stored_bytes(const content_ref& ref) const;
  // Records that recreate the live content state, for journal::compact().
  void snapshot(std::vector<std::vector<std::byte>>& out) const;
  // Drops every cached reconstruction and decoded block (tests: "after the cache is emptied").
  // Head images stay: they are the lineages' newest versions, not a cache of them.
  void drop_caches();
  // Waits until every head image made so far is on disk (tests, benchmarks, shutdown).
  void wait_heads();
  // The version's head image may be changed behind the store's back (a writer of the file shares
  // the kernel's passthrough backing file, fs/fuse/passthrough.hpp): it is no longer read, used
  // as a base or kept across a restart; the version decodes through its chain from now on.
  void discard_head(std::uint64_t version);
  // Where what fails no request goes: routine work at info (a head image rebuilt from its chain,
  // a stream's work redone), what the store could not do as configured at error (a head image
  // not kept on disk).
  void set_logger(log_sink log);

  // What the store holds in memory and on scratch disk right now (`ckptctl status`).
  struct resources {
    std::uint64_t cache_bytes = 0, cache_budget = 0;  // reconstructions, metadata, blocks
    std::uint64_t chunk_bytes = 0, chunk_budget = 0;  // decoded chunks of cold reads
    std::uint64_t encode_slots = 0, encodes_running = 0, encode_memory = 0;
    // The codec's per-thread scratch (codec/scratch.hpp) and the threads holding it; what the
    // coding holds beyond its allowance (encode_memory and scratch_bytes beyond
    // kCodingAllowance), charged to the cache: cache_budget is already less that.
    std::uint64_t scratch_bytes = 0, scratch_threads = 0, coding_charged = 0;
    std::uint64_t heads = 0, heads_on_disk = 0, head_memory = 0, head_disk_bytes = 0;
    // Head images a stream codes against, freed behind it (head_store::retire), and their disk.
    std::uint64_t heads_retired = 0, head_retired_bytes = 0;
    std::uint64_t head_retirements = 0, head_retire_refused = 0;  // since the mount
    // Saves that wrote no head image because their lineage keeps one live file (heads=auto).
    std::uint64_t saves_without_image = 0;
    // Streaming writes: streams running now; since the start, puts that used a stream's work,
    // streams whose work was dropped (the file changed after it was read, or was not what
    // the stream predicted), and streams that declined (left the file to its commit: too small,
    // not an archive they can follow), with the last one's reason.
    std::uint64_t streams_running = 0, streamed_puts = 0, streams_dropped = 0;
    std::uint64_t streams_declined = 0;
    std::string last_declined;
    // Saves of head_min or more a stream follows, now; since the start, streamed saves without
    // an image that kept only part of their reconstruction in the cache, or none: their base
    // had left it while other large saves ran, and the cache had no room beside the others'
    // (the ranks of a job whose checkpoints the cache cannot hold together); and the tensor
    // bytes streams kept there.
    std::uint64_t large_saves = 0, streams_not_kept = 0, streams_kept_bytes = 0;
    std::uint64_t streamed_bytes = 0;  // tensor bytes coded by streams since the start
    // Reconstructions kept in the cache (as the next saves' bases) that were made over their
    // base's buffer, since the start: bytes that needed no fresh memory (keep_whole).
    std::uint64_t kept_in_place_bytes = 0;
    // Cold reads since the start (decode_tally.hpp): chunks decoded into the chunk cache and
    // their bytes, of them decoded before (evicted before their readers were done), single
    // blocks decoded (not cached) for the kernel's reads away from the reader, and the frames
    // decoded for both through base chains.
    std::uint64_t chunks_decoded = 0, chunk_bytes_decoded = 0;
    std::uint64_t chunks_decoded_again = 0, chunk_bytes_decoded_again = 0;
    std::uint64_t stray_blocks_decoded = 0, stray_bytes_decoded = 0;
    std::uint64_t chunk_frames_decoded = 0;
    // Read-ahead decodes queued or running now: while any is, the counts above still move.
    std::uint64_t read_ahead_jobs = 0;
  };
  // Also re-applies what the coding holds beyond its allowance to the cache's budget (the
  // figures are then current).
  resources usage() const;

  // ---- management (fs/admin) ----
  // Every stored version, live or hidden, ascending id (within a lineage: completion order).
  std::vector<version_info> versions() const;
  version_detail detail(const content_ref& ref);
  // Rewrites a delta version as a keyframe holding exactly what it reads as, so that its base
  // chain can be reclaimed. Like put(): the record is appended without sync, and the objects it
  // made unnecessary (its old object, bases nothing else needs) go to take_unneeded_objects().
  // Returns the new object's disk bytes, or 0 if the version was not a delta or no longer
  // exists (nothing done).
  std::uint64_t rekey(std::uint64_t version);
  // Hidden chains worth freeing (docs/filesystem.md, "Rotation"): for each lineage that lost a
  // name since the last call (every lineage after replay), its named deltas whose base chains
  // hold, in versions nothing else needs (up to the next named version or the keyframe), at
  // least `factor` times the bytes of the chain's keyframe (the cost of rewriting it as one,
  // rekey). Rewriting it frees them; each rewrite thus writes at most 1/factor of what it
  // frees. Cheap: no I/O.
  // factor <= 0: none (and the hints are dropped).
  struct chain_rewrite {
    std::uint64_t version = 0;
    std::uint64_t hidden_bytes = 0;    // freed by the rewrite (object bytes)
    std::uint64_t keyframe_bytes = 0;  // the estimate of what it writes
  };
  std::vector<chain_rewrite> chains_to_rewrite(double factor);
  bool has_chain_hints() const;
  // Checks one version: the object's payload checksum, its metadata and references; `deep` also
  // decodes every block and compares each tensor's reconstruction with its recorded digest.
  // Returns "" when sound, else what is wrong. Bases are not checked (the caller walks chains).
  std::string verify(std::uint64_t version, bool deep,
                     const std::function<void(std::uint64_t bytes)>& progress = {});
  // verify(v, true) for each version of a chain, each one's base the version before it (the
  // first one's base is read as reads do). The tensor frames are decoded slab by slab along the
  // chain, each slab of a version on top of the same slab of the version before, just decoded:
  // n versions decode each slab n times, where n calls of verify() decode it up to n²/2 times
  // once a tensor is larger than the cache (each call decodes its base's chain again). Memory:
  // one encode slot's slab set, taken for one slab at a time, and the chain's metadata. Returns a
  // problem per version, in `chain`'s order ("" if sound); a damaged version's successors in the
  // chain are damaged too. `progress` gets the encoded bytes of each slab decoded.
  std::vector<std::string> verify_chain(
      std::span<const std::uint64_t> chain,
      const std::function<void(std::uint64_t bytes)>& progress = {});
  // Objects in the store that no version references and no put is writing: left by a crash
  // between an object's write and its record, or by a failed removal. Removes them unless
  // `dry_run`; returns (count, disk bytes).
  std::pair<std::uint64_t, std::uint64_t> collect_garbage(bool dry_run);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace ckpt::fs
