#pragma once
// One independently decodable block: a fixed 32-byte header, a payload, and an XXH3-64 checksum
// over both. Tensors are cut into blocks of about block_bytes of input; blocks are encoded and
// decoded in parallel. The byte layout is specified in docs/format.md ("Blocks").
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "codec/dtype.hpp"
#include "codec/entropy.hpp"
#include "codec/quantizer.hpp"

namespace ckpt::codec {

inline constexpr std::uint32_t block_magic = 0x31424b43;  // "CKB1"
inline constexpr std::uint8_t block_format_version = 1;
// Lossy blocks whose reconstruction is rounded (lossy_params::round_bits) are version 2, so that
// a decoder from before rounding refuses them instead of returning unrounded values.
inline constexpr std::uint8_t block_format_version_rounded = 2;
// Lossless float blocks with a bit-packed plane (entropy_mode::packed) are version 3, so that a
// decoder from before packing refuses them as a newer format instead of as damage.
inline constexpr std::uint8_t block_format_version_packed = 3;
// Lossy blocks whose escapes are entropy-coded (index gaps and value planes, docs/format.md) are
// version 4, byte 7 the rounding bits or 0, so that a decoder from before refuses them as a newer
// format. Written only where that is smaller than the plain escape list.
inline constexpr std::uint8_t block_format_version_coded_escapes = 4;
inline constexpr std::size_t block_header_size = 32;
inline constexpr std::size_t max_block_bytes = 64u << 20;  // refuse larger on decode

enum class block_codec : std::uint8_t {
  raw = 0,             // payload is the input bytes (nothing else shrank it)
  lc_delta = 1,        // quantised delta against a base (lossy)
  float_lossless = 2,  // exponent/mantissa byte planes, each entropy-coded (exact)
  zstd = 3,            // non-float bytes (exact)
  lc_ratio = 4,        // quantised relative change against a base (lossy; delta_kind::ratio)
  lc_intra = 5,        // quantised values, as lc_delta on a zero base (lossy; delta_kind::intra)
};
std::string_view name(block_codec c) noexcept;
constexpr bool is_lossy(block_codec c) noexcept {
  return c == block_codec::lc_delta || c == block_codec::lc_ratio || c == block_codec::lc_intra;
}
// Blocks that decode against the previous version's reconstruction (lc_intra does not).
constexpr bool needs_base(block_codec c) noexcept {
  return c == block_codec::lc_delta || c == block_codec::lc_ratio;
}

// Parameters of the lossy coder. group = LC symbols packed per entropy-coded byte (k); 0 picks
// the default for `bits`. The paper's mode is group = 1 with entropy_policy::huffman_only.
struct lossy_params {
  int bits = 3;
  int group = 0;
  representative rep = representative::mean;
  entropy_policy policy = entropy_policy::best;
  // Every reconstructed element rounded to this many mantissa bits (nearest even, as
  // round_mantissa), 0 for none; 1 .. the dtype's mantissa bits - 1. With a base whose values
  // all have at most this many bits (a lossy keyframe, or a version coded so), every version of
  // the chain has them too, and a rewrite of any of them as a keyframe is as cheap as a lossy
  // keyframe. With such a base the closed loop |ũ - u| <= |u - ũ_prev| still holds for every
  // element (escapes and blocks stored raw hold the value rounded to nearest, which no N-bit
  // base is closer than). With a base that has more bits, an element left at its base moves by
  // the rounding: callers round only on bases that have the bits.
  int round_bits = 0;
};
int default_group(int bits) noexcept;  // 8, 4, 2, 2 for bits 1..4

struct block_header {
  block_codec codec{};
  dtype type{};
  std::uint32_t elements = 0;
  std::uint32_t payload_size = 0;
  std::uint8_t bits = 0, group = 0;
  representative rep{};
  entropy_policy policy{};
  std::uint8_t round_bits = 0;  // lossy blocks of version 2 or 4 (byte 7), else 0
  bool packed_planes = false;   // version 3: lossless planes may be bit-packed
  bool coded_escapes = false;   // version 4: a lossy block's escapes are entropy-coded
  std::size_t total_size() const { return block_header_size + payload_size; }
};

// Reads and validates a header (magic, version, enumerations, sizes within `in`); the checksum is
// checked by decode_block. Throws corrupt_error. whole_block = false: `in` may hold the header
// alone (block_header_size bytes), as when walking blocks on disk; the payload is not required.
block_header read_block_header(std::span<const std::byte> in, bool whole_block = true);

// Appends one lossy block of n elements. `recon` (n elements of type t) receives exactly what
// decode_block will return for it.
void encode_delta_block(dtype t, const std::byte* cur, const std::byte* base, std::size_t n,
                        const quant_table& q, const lossy_params& p, std::byte* recon,
                        std::vector<std::byte>& out);

// Appends one exact block: byte planes for float types, zstd for bytes, raw when neither shrinks.
void encode_exact_block(dtype t, const std::byte* data, std::size_t n, std::vector<std::byte>& out);

// Decodes the block at the start of `in` into `out` (header.elements elements). `base` is needed
// by lossy blocks only. Verifies the checksum first; throws corrupt_error on any mismatch.
void decode_block(std::span<const std::byte> in, const std::byte* base, std::byte* out);

}  // namespace ckpt::codec
