#include "codec/entropy.hpp"

#include <cstring>

#include "codec/bit_pack.hpp"
#include "codec/byte_io.hpp"
#include "codec/error.hpp"
#include "codec/huffman.hpp"
#include "codec/rans.hpp"

namespace ckpt::codec {

std::string_view name(entropy_mode m) noexcept {
  switch (m) {
    case entropy_mode::stored:
      return "stored";
    case entropy_mode::constant:
      return "constant";
    case entropy_mode::huffman:
      return "huffman";
    case entropy_mode::rans:
      return "rans";
    case entropy_mode::packed:
      return "packed";
  }
  return "?";
}

entropy_mode encode_bytes(std::span<const std::uint8_t> in, entropy_policy policy,
                          std::vector<std::byte>& out, const byte_histogram* hist, packing pack) {
  byte_histogram own;
  if (!hist) {
    own = histogram(in);
    hist = &own;
  }
  byte_histogram counts = *hist;
  int distinct = 0, only = 0;
  for (int s = 0; s < 256; ++s)
    if (counts[s]) ++distinct, only = s;

  const std::uint64_t stored_bits = std::uint64_t(in.size()) * 8;
  if (distinct == 0) {
    out.push_back(std::byte(entropy_mode::stored));
    return entropy_mode::stored;
  }
  if (distinct == 1 && policy == entropy_policy::best) {
    out.push_back(std::byte(entropy_mode::constant));
    out.push_back(std::byte(only));
    return entropy_mode::constant;
  }
  if (distinct == 1) counts[only == 0 ? 1 : 0] = 1;  // the paper's coder still spends 1 bit each

  const auto lengths = huffman::code_lengths(counts);
  const std::uint64_t huff_bits = huffman::cost_bits(*hist, lengths) + 8 * (128 + 13);
  double rans_bits = 1e300;
  std::array<std::uint32_t, 256> freqs{};
  if (policy == entropy_policy::best) {
    freqs = rans::normalize(counts);
    rans_bits = rans::cost_bits(counts, freqs) + 8 * (3.0 * distinct + 5 + 16);
  }

  // Bits in which the symbols differ: packing them alone decodes at memory speed (in a keyframe
  // rounded to 12 bits: plane 0, the sign beside 7 zero mantissa bits, 1 bit; plane 1, 4).
  const bit_pack::layout packed = bit_pack::layout_of(*hist);
  const std::uint64_t packed_bits = 8 * bit_pack::payload_size(in.size(), packed.mask);
  const bool can_pack = pack == packing::allowed && policy == entropy_policy::best &&
                        packed.mask != 0 && packed.mask != 0xff && packed_bits < stored_bits;
  const std::uint64_t plain_bits = can_pack ? packed_bits : stored_bits;

  // A coded stream must save at least 1/32 of the stored (or packed) size to be worth its decode
  // time: the low mantissa planes of floats save under 1% (7.97 bits per byte for Gaussian
  // weights) yet would cost as much to decode as the exponent plane, which saves 60-70%.
  const double worth = double(plain_bits) * (1.0 - 1.0 / 32);
  if (policy == entropy_policy::best && worth <= rans_bits && worth <= double(huff_bits)) {
    if (can_pack) {
      out.push_back(std::byte(entropy_mode::packed));
      bit_pack::encode(in, packed, out);
      return entropy_mode::packed;
    }
    out.push_back(std::byte(entropy_mode::stored));
    out.insert(out.end(), reinterpret_cast<const std::byte*>(in.data()),
               reinterpret_cast<const std::byte*>(in.data() + in.size()));
    return entropy_mode::stored;
  }
  // rANS decodes a few times slower than Huffman on dense alphabets; take it only where it
  // saves more than 3% (under extreme skew it saves 3-20x).
  if (rans_bits < 0.97 * double(huff_bits)) {
    out.push_back(std::byte(entropy_mode::rans));
    rans::encode(in, freqs, out);
    return entropy_mode::rans;
  }
  out.push_back(std::byte(entropy_mode::huffman));
  huffman::encode(in, lengths, out);
  return entropy_mode::huffman;
}

void decode_bytes(std::span<const std::byte> in, std::span<std::uint8_t> out, packing pack) {
  if (in.empty()) throw corrupt_error("entropy: empty stream");
  const auto mode = entropy_mode(std::to_integer<std::uint8_t>(in[0]));
  const auto body = in.subspan(1);
  switch (mode) {
    case entropy_mode::stored:
      if (body.size() != out.size()) throw corrupt_error("entropy: stored length mismatch");
      if (!out.empty()) std::memcpy(out.data(), body.data(), out.size());
      return;
    case entropy_mode::constant:
      if (body.size() != 1) throw corrupt_error("entropy: constant length mismatch");
      std::memset(out.data(), std::to_integer<int>(body[0]), out.size());
      return;
    case entropy_mode::huffman:
      huffman::decode(body, out);
      return;
    case entropy_mode::rans:
      rans::decode(body, out);
      return;
    case entropy_mode::packed:
      if (pack != packing::allowed) throw corrupt_error("entropy: packed stream not allowed here");
      bit_pack::decode(body, out);
      return;
  }
  throw corrupt_error("entropy: unknown mode " + std::to_string(int(mode)));
}

}  // namespace ckpt::codec
