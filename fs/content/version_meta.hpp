#pragma once
// The metadata of every content object: how the stored bytes map back to the file. Where it sits
// in the object (after the data area since format 2, before it in format 1) is content_object's
// business; the byte layout is documented in docs/format.md ("Content objects").
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "codec/dtype.hpp"
#include "codec/fidelity.hpp"
#include "codec/format/layout.hpp"

namespace ckpt::fs {

// A run of file bytes stored exactly (zstd blocks of `block_bytes` input each).
struct exact_region {
  std::uint64_t offset = 0;  // in the file
  std::uint64_t length = 0;
  std::uint64_t data_at = 0;  // in the data area
  std::uint32_t block_bytes = 0;
  std::vector<std::uint64_t> blocks;  // encoded offset of each block, relative to data_at
  std::uint64_t encoded_bytes = 0;
  // 0: the blocks are in this version's object. Else the version whose object holds them (an
  // exact file rewritten in part reuses the unchanged blocks of the version it was opened over;
  // always the owner itself, never a version that reuses them in turn). data_at is then in that
  // version's data area, and this version keeps it alive (version_rec::donors).
  std::uint64_t src = 0;
};

enum class tensor_mode : std::uint8_t { lossless = 0, delta = 1 };

// A compressed tensor payload: a codec frame in the data area.
struct tensor_frame {
  std::size_t tensor = 0;  // index into layout.tensors
  codec::dtype type = codec::dtype::f32;
  tensor_mode mode = tensor_mode::lossless;
  std::size_t base_tensor = 0;  // index into the base version's layout.tensors (delta only)
  std::uint64_t data_at = 0;
  std::uint64_t encoded_bytes = 0;
  // XXH3-64 of the reconstructed payload (what a reader gets), checked by `ckptctl verify
  // --deep`. 0 = not recorded.
  std::uint64_t digest = 0;
  // Block index (codec::index_frame): block b starts at data_at + blocks[b] and holds elements
  // [b * block_elements, ...). Lets a cold read decode only the blocks it needs. Empty in
  // versions written before the index existed; those are decoded a whole tensor at a time.
  std::uint32_t block_elements = 0;
  std::vector<std::uint64_t> blocks;
  // A delta coded as ratios (codec::delta_kind::ratio; informational: the blocks say so too).
  bool ratio = false;
  // How many of the frame's 16 MiB slabs were coded as values (codec::delta_kind::intra;
  // informational as `ratio`, and a keyframe's hint: a tensor whose every slab was is coded so
  // in the next keyframe too).
  std::uint32_t intra_slabs = 0;
  // Delta frames: how far the reconstruction is from the tensor as written (codec/fidelity.hpp),
  // for `ckptctl stat`. Absent in versions written before it was measured, and for lossless
  // frames (exact).
  std::optional<codec::error_sums> error;
  // What the frame reads as has at most coding.keyframe_bits mantissa bits per float
  // (content_options::keyframe_bits): a lossy keyframe's tensor rounded before exact coding, a
  // delta whose blocks round their reconstruction, or a rekeyed frame of either. The next
  // delta against it rounds too. A rekeyed unrounded delta's frame is not rounded: it keeps
  // its error (it reads as the delta did) but its values have every mantissa bit.
  bool rounded = false;
  // A rounded frame's mantissa bits when fewer than its version's coding.keyframe_bits (second
  // moments under content_options::moment_bits); 0: those. A delta on it rounds to no fewer
  // (rounding the elements it leaves at their base would move them).
  int round_bits = 0;
  // How many of the frame's slabs coded their differences on a uniform grid instead of buckets
  // (codec::select_grid; informational as `ratio`).
  std::uint32_t grid_slabs = 0;
};

// The lossy coding parameters a delta version was written with (for stat and the docs).
struct coding_params {
  int bits = 0;       // 0 for versions without lossy frames
  int group = 0;      // symbols per entropy-coded group (1 = paper)
  std::string rep;    // "mean" / "midrange"
  std::string scope;  // "tensor" / "checkpoint"
  std::string coder;  // "grouped" / "paper"
  bool exact_optimizer = false;
  bool relative = false;  // nonnegative tensors coded as ratios (absent before: false)
  // The mount's ratio_bits (second moments' ratio deltas; before 2026-11-27 every ratio delta)
  // when not `bits` (absent: 0, the same). Informational: each block names its own bits.
  int ratio_bits = 0;
  int keyframe_bits = 0;  // mantissa bits of lossy keyframes' float tensors (absent: 0, exact)
  std::string grid;       // difference tables: "auto", "off" or the step (absent: "", the buckets)
  // A refresh (content_options::refresh_interval): its difference frames' bits, more than
  // `bits` (absent: 0, not a refresh). Informational: each block names its own bits.
  int refresh_bits = 0;
  // The mount's weight_error and grid_error (content_options) in a delta coded with them: with
  // grid=auto, not a refresh (absent: 0, the buckets' error). Informational: the allowance
  // itself is per slab (fp32 weights' slabs of at least codec::kGridMinElements), and each
  // block names its own table.
  double weight_error = 0;
  double grid_error = 0;
};

enum class version_kind : std::uint8_t { exact = 0, keyframe = 1, delta = 2 };
std::string_view name(version_kind k) noexcept;

struct version_meta {
  std::uint64_t size = 0;
  version_kind kind = version_kind::exact;
  format::layout layout;  // opaque layout for exact files
  std::vector<exact_region> exact;
  // A checkpoint's exact bytes held in the metadata itself (docs/format.md, "exact_inline"):
  // the regions' bytes back to back, in region order (each region's data_at is its place
  // here; no blocks). Compressed with the metadata, whose zip and pickle names they repeat,
  // instead of region by region: a DCP shard's hundreds of small archive headers cost a few
  // bytes each. Empty with exact_inline false: the regions are blocks in the data area.
  bool exact_inline = false;
  std::vector<std::byte> inline_exact;
  std::vector<tensor_frame> tensors;
  std::vector<std::pair<std::size_t, std::uint32_t>>
      member_crcs;  // served CRC per rewritten member
  int bits = 0;     // lossy parameters, for stat
  coding_params coding;
  std::int64_t created_ns = 0;  // CLOCK_REALTIME when the version was stored
};

std::vector<std::byte> encode_meta(const version_meta& m);
version_meta decode_meta(std::span<const std::byte> cbor);  // throws corrupt_error

}  // namespace ckpt::fs
