#pragma once
// Tensor-level coding: a tensor becomes a sequence of independent blocks of ~block_bytes input,
// encoded and decoded in parallel on oneTBB workers. The output is bit-identical for any number
// of threads: blocks are cut by size alone and the bucket statistics are exact integers.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "codec/block.hpp"
#include "codec/dtype.hpp"
#include "codec/fidelity.hpp"
#include "codec/quantizer.hpp"

namespace ckpt::codec {

inline constexpr std::size_t default_block_bytes = 1u << 20;

// Which elements share one set of buckets: the paper buckets the whole checkpoint at once;
// per-tensor buckets keep small-delta state (Adam's v) from being dropped forever.
enum class bucket_scope : std::uint8_t { checkpoint = 0, tensor = 1 };
std::string_view name(bucket_scope s) noexcept;

// A float tensor and the reconstruction of its previous version (same dtype and length).
struct delta_input {
  dtype type;
  std::span<const std::byte> cur;
  std::span<const std::byte> base;
};

// How an input's deltas are taken: ratios when `relative` is allowed and the tensor and its base
// are both nonnegative (Adam's second moment, Adagrad sums), differences otherwise. Ratio coding
// keeps such state positive and within a bounded factor of its value (quantizer.hpp).
delta_kind choose_kind(const delta_input& in, bool relative);

// True when the base predicts the tensor worse than zero does: the sum of squared differences
// from the base exceeds the sum of squares, over a fixed sample (16 consecutive elements of every
// 251, so the choice is deterministic and costs about a sixteenth of a pass; non-finite samples
// make it false). Such a tensor is better coded as delta_kind::intra, its values quantised
// directly: the buckets then span the values instead of value minus base, which is wider. Adam's
// first moment saved every dozen steps or more is the case (sum of squared differences 1.5-2.5x
// the sum of squares, tests/bench/lm_run.py); weights, whose deltas are small, never are.
bool prefer_intra(const delta_input& in);

// Bucket statistics of the deltas of all inputs (in parallel; exact, so order-independent).
// Merge the results of several calls with delta_stats::merge, then select_buckets().
delta_stats gather_stats(std::span<const delta_input> inputs, bool track_range,
                         delta_kind kind = delta_kind::difference);

// One table per input: per tensor, or one table shared by all inputs of a kind (checkpoint
// scope). Each input's kind is choose_kind(input, relative); with `intra` and per-tensor tables,
// a difference input that prefer_intra() is coded as intra instead.
std::vector<quant_table> plan_tables(std::span<const delta_input> inputs, int bits,
                                     representative rep, bucket_scope scope, bool relative = false,
                                     bool intra = false);

// Lossy: the delta of `cur` against `base`, quantised with `q`. `recon` (same size as cur)
// receives exactly what decode() will return; it is the base of the next version.
std::vector<std::byte> encode_delta(const delta_input& in, const quant_table& q,
                                    const lossy_params& p, std::span<std::byte> recon,
                                    std::size_t block_bytes = default_block_bytes);

// Exact: float-aware for float types, zstd for bytes.
std::vector<std::byte> encode_exact(dtype t, std::span<const std::byte> data,
                                    std::size_t block_bytes = default_block_bytes);

// The same, appending to `out`: callers that code many tensors reuse one buffer instead of
// faulting in fresh pages for every frame (that costs more than the coding itself).
// With `error`, also adds how far recon is from cur (measure_error's sums, block by block in
// order: the same whatever the thread count), measured as each block is coded.
void encode_delta_into(const delta_input& in, const quant_table& q, const lossy_params& p,
                       std::span<std::byte> recon, std::vector<std::byte>& out,
                       std::size_t block_bytes = default_block_bytes, error_sums* error = nullptr);
void encode_exact_into(dtype t, std::span<const std::byte> data, std::vector<std::byte>& out,
                       std::size_t block_bytes = default_block_bytes);

struct frame_info {
  std::size_t elements = 0;
  std::size_t blocks = 0;
  bool needs_base = false;  // contains lossy blocks
};
// Walks the block headers (no checksums): sizes and kinds, or corrupt_error.
frame_info inspect(std::span<const std::byte> encoded);

// Where each block of a frame starts, so that a reader can decode a few blocks of a large tensor
// without reading the rest: every block but the last holds `block_elements` elements (encoders
// cut by size alone), so block b covers elements [b * block_elements, ...). A run of whole blocks
// is itself a frame: decode() takes it with the matching slices of base and out.
struct frame_index {
  std::uint32_t block_elements = 0;
  std::vector<std::uint64_t> offsets;  // of each block, from the frame's start
};
// Walks the block headers (no checksums). Throws corrupt_error unless the blocks tile the frame
// with equal element counts, the last one no larger.
frame_index index_frame(std::span<const std::byte> encoded);

// Decodes a whole frame into `out` (exactly the frame's elements). `base` is required when the
// frame has lossy blocks and must then be as long as `out`. Throws corrupt_error.
void decode(std::span<const std::byte> encoded, std::span<const std::byte> base,
            std::span<std::byte> out);

// The same on the calling thread alone: for callers that already run one decode per core (the
// read-ahead workers), where oneTBB's workers would only spin and switch.
void decode_here(std::span<const std::byte> encoded, std::span<const std::byte> base,
                 std::span<std::byte> out);

}  // namespace ckpt::codec
