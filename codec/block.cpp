#include "codec/block.hpp"

#include <zstd.h>
#include "codec/xxh3.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "codec/byte_io.hpp"
#include "codec/error.hpp"
#include "codec/escapes.hpp"
#include "codec/huffman.hpp"
#include "codec/lc_kernel.hpp"
#include "codec/mantissa.hpp"
#include "codec/planes.hpp"
#include "codec/scratch.hpp"

namespace ckpt::codec {

std::string_view name(block_codec c) noexcept {
  switch (c) {
    case block_codec::raw:
      return "raw";
    case block_codec::lc_delta:
      return "lc_delta";
    case block_codec::lc_ratio:
      return "lc_ratio";
    case block_codec::lc_intra:
      return "lc_intra";
    case block_codec::float_lossless:
      return "float_lossless";
    case block_codec::zstd:
      return "zstd";
  }
  return "?";
}

int default_group(int bits) noexcept {
  switch (bits) {
    case 1:
      return 8;
    case 2:
      return 4;
    default:
      return 2;
  }
}

namespace {

constexpr std::size_t kChecksumAt = 24;

std::uint64_t block_checksum(std::span<const std::byte> header24,
                             std::span<const std::byte> payload) {
  return XXH3_64bits_withSeed(payload.data(), payload.size(),
                              XXH3_64bits(header24.data(), header24.size()));
}

// Header fields in order; the checksum goes last and covers header[0, 24) and the payload.
std::size_t begin_block(std::vector<std::byte>& out, const block_header& h) {
  byte_writer w(out);
  const std::size_t at = w.size();
  w.put<std::uint32_t>(block_magic);
  w.put<std::uint8_t>(h.round_bits ? block_format_version_rounded : block_format_version);
  w.put<std::uint8_t>(std::uint8_t(h.codec));
  w.put<std::uint8_t>(std::uint8_t(h.type));
  w.put<std::uint8_t>(h.round_bits);  // version 1: flags, reserved (0)
  w.put<std::uint32_t>(h.elements);
  w.put<std::uint32_t>(0);  // payload size, set by end_block
  w.put<std::uint8_t>(h.bits);
  w.put<std::uint8_t>(h.group);
  w.put<std::uint8_t>(std::uint8_t(h.rep));
  w.put<std::uint8_t>(std::uint8_t(h.policy));
  w.put<std::uint32_t>(0);  // reserved
  w.put<std::uint64_t>(0);  // checksum
  return at;
}

void end_block(std::vector<std::byte>& out, std::size_t at) {
  const std::size_t payload = out.size() - at - block_header_size;
  const auto size32 = std::uint32_t(payload);
  std::memcpy(out.data() + at + 12, &size32, 4);
  const auto all = std::span<const std::byte>(out).subspan(at);
  const std::uint64_t sum = block_checksum(all.first(kChecksumAt), all.subspan(block_header_size));
  std::memcpy(out.data() + at + kChecksumAt, &sum, 8);
}

void put_raw_block(dtype t, const std::byte* data, std::size_t n, std::vector<std::byte>& out) {
  block_header h;
  h.codec = block_codec::raw;
  h.type = t;
  h.elements = std::uint32_t(n);
  const std::size_t at = begin_block(out, h);
  out.insert(out.end(), data, data + n * element_size(t));
  end_block(out, at);
}

// Mantissa planes of trained floats are nearly uniform; a 1-in-16 sample tells so without a full
// histogram pass.
bool plane_looks_incompressible(std::span<const std::uint8_t> plane) {
  if (plane.size() < 4096) return false;
  byte_histogram h{};
  std::size_t samples = 0;
  for (std::size_t i = 0; i < plane.size(); i += 16, ++samples) ++h[plane[i]];
  double bits = 0;
  for (auto c : h)
    if (c) bits -= double(c) * std::log2(double(c) / double(samples));
  return bits > 7.8 * double(samples);
}

}  // namespace

void encode_delta_block(dtype t, const std::byte* cur, const std::byte* base, std::size_t n,
                        const quant_table& q, const lossy_params& p, std::byte* recon,
                        std::vector<std::byte>& out) {
  const int k = p.group ? p.group : default_group(p.bits);
  if (p.bits != q.bits) throw invalid_argument("codec: table and parameters disagree on bits");
  if (k < 1 || k * p.bits > 8) throw invalid_argument("codec: group * bits must be <= 8");
  const std::size_t esize = element_size(t);
  const std::size_t ngroups = (n + k - 1) / k;
  if (!is_float(t)) throw invalid_argument("codec: lossy coding needs a float dtype");
  if (n * esize > max_block_bytes)
    throw invalid_argument("codec: block larger than max_block_bytes");
  thread_local scratch_vector<std::uint8_t> symbols, groups;
  thread_local scratch_vector<std::uint32_t> escapes;
  symbols.resize(n + 8);
  groups.resize(ngroups);
  escapes.clear();
  static_assert(zero_base_bytes >= max_block_bytes);
  if (q.kind == delta_kind::intra) base = zero_base();  // n * esize <= max_block_bytes: checked
  lc_encode_symbols(t, cur, base, n, q, p.round_bits, recon, symbols.data(), escapes);
  pack_groups(symbols.data(), n, p.bits, k, groups.data());

  block_header h;
  h.codec = q.kind == delta_kind::ratio   ? block_codec::lc_ratio
            : q.kind == delta_kind::intra ? block_codec::lc_intra
                                          : block_codec::lc_delta;
  h.type = t;
  h.elements = std::uint32_t(n);
  h.bits = std::uint8_t(p.bits);
  h.group = std::uint8_t(k);
  h.rep = p.rep;
  h.policy = p.policy;
  h.round_bits = std::uint8_t(p.round_bits);
  const std::size_t at = begin_block(out, h);
  byte_writer w(out);
  for (int s = 1; s < (1 << p.bits); ++s) w.put<float>(q.rep[s]);
  w.put<std::uint32_t>(std::uint32_t(escapes.size()));
  // What an escape reads as: the element itself, rounded where the block rounds.
  // Coded (version 4) where that is smaller than the plain list of indices and values.
  escapes.note();  // grown by lc_encode_symbols
  thread_local scratch_vector<std::byte> values;
  values.resize(escapes.size() * esize);
  for (std::size_t e = 0; e < escapes.size(); ++e)
    std::memcpy(values.data() + e * esize, recon + std::size_t(escapes[e]) * esize, esize);
  const std::size_t list_at = out.size();
  const bool coded = !escapes.empty() && put_coded_escapes(t, escapes, values, p.policy, out) <
                                             escapes.size() * (4 + esize);
  if (!coded) {
    out.resize(list_at);
    for (auto i : escapes) w.put<std::uint32_t>(i);
    w.put_bytes(values);
  }
  encode_bytes(groups, p.policy, out);
  if (out.size() - at - block_header_size >= n * esize) {  // did not shrink: store the elements
    out.resize(at);
    if (p.round_bits)
      round_mantissa(t, std::span(cur, n * esize), std::span(recon, n * esize), p.round_bits);
    else
      std::memcpy(recon, cur, n * esize);
    put_raw_block(t, recon, n, out);
    return;
  }
  if (coded) out[at + 4] = std::byte(block_format_version_coded_escapes);
  end_block(out, at);
}

void encode_exact_block(dtype t, const std::byte* data, std::size_t n,
                        std::vector<std::byte>& out) {
  const std::size_t esize = element_size(t);
  const std::size_t bytes = n * esize;
  // Worst case is the raw fallback; reserving it avoids regrowing the output block by block.
  out.reserve(out.size() + 2 * block_header_size + bytes + 8 * esize);
  block_header h;
  h.type = t;
  h.elements = std::uint32_t(n);
  std::size_t at;
  if (t == dtype::bytes) {
    h.codec = block_codec::zstd;
    at = begin_block(out, h);
    const std::size_t bound = ZSTD_compressBound(bytes);
    const std::size_t payload_at = out.size();
    out.resize(payload_at + bound);
    const std::size_t z = ZSTD_compress(out.data() + payload_at, bound, data, bytes, 3);
    if (ZSTD_isError(z)) throw error(errc::io, std::string("zstd: ") + ZSTD_getErrorName(z));
    out.resize(payload_at + z);
  } else {
    h.codec = block_codec::float_lossless;
    at = begin_block(out, h);
    thread_local scratch_vector<std::uint8_t> planes;
    planes.resize(bytes);
    to_planes(t, data, n, planes.data());
    byte_writer w(out);
    bool packed = false;
    for (std::size_t pl = 0; pl < esize; ++pl) {
      const auto plane = std::span<const std::uint8_t>(planes).subspan(pl * n, n);
      const std::size_t len_at = w.skip(4);
      if (plane_looks_incompressible(plane)) {
        out.push_back(std::byte(entropy_mode::stored));
        out.insert(out.end(), reinterpret_cast<const std::byte*>(plane.data()),
                   reinterpret_cast<const std::byte*>(plane.data() + n));
      } else {
        packed |= encode_bytes(plane, entropy_policy::best, out, nullptr, packing::allowed) ==
                  entropy_mode::packed;
      }
      w.put_at<std::uint32_t>(len_at, std::uint32_t(out.size() - len_at - 4));
    }
    if (packed) out[at + 4] = std::byte(block_format_version_packed);
  }
  if (out.size() - at - block_header_size >= bytes) {
    out.resize(at);
    put_raw_block(t, data, n, out);
    return;
  }
  end_block(out, at);
}

block_header read_block_header(std::span<const std::byte> in, bool whole_block) {
  byte_reader r(in);
  if (r.get<std::uint32_t>() != block_magic) throw corrupt_error("block: bad magic");
  const auto version = r.get<std::uint8_t>();
  if (version != block_format_version && version != block_format_version_rounded &&
      version != block_format_version_packed && version != block_format_version_coded_escapes)
    throw error(errc::unsupported, "block: format version " + std::to_string(version));
  block_header h;
  const auto codec = r.get<std::uint8_t>();
  const auto type = r.get<std::uint8_t>();
  const auto flags = r.get<std::uint8_t>();
  if (codec > std::uint8_t(block_codec::lc_intra)) throw corrupt_error("block: unknown codec");
  if (type > std::uint8_t(dtype::bytes)) throw corrupt_error("block: unknown dtype");
  h.codec = block_codec(codec);
  h.type = dtype(type);
  h.elements = r.get<std::uint32_t>();
  h.payload_size = r.get<std::uint32_t>();
  h.bits = r.get<std::uint8_t>();
  h.group = r.get<std::uint8_t>();
  const auto rep = r.get<std::uint8_t>();
  const auto policy = r.get<std::uint8_t>();
  if (rep > 1 || policy > 1) throw corrupt_error("block: bad lossy parameters");
  h.rep = representative(rep);
  h.policy = entropy_policy(policy);
  if (std::uint64_t(h.elements) * element_size(h.type) > max_block_bytes)
    throw corrupt_error("block: element count too large");
  if (is_lossy(h.codec) &&
      (h.bits < 1 || h.bits > max_bits || h.group < 1 || h.bits * h.group > 8 || !is_float(h.type)))
    throw corrupt_error("block: bad lossy parameters");
  // Versions 1 and 3 always wrote 0 here: anything else is damage, not a rounding to ignore.
  const bool rounds =
      version == block_format_version_rounded || version == block_format_version_coded_escapes;
  if (!rounds && flags != 0) throw corrupt_error("block: bad flags");
  if (version == block_format_version_coded_escapes && !is_lossy(h.codec))
    throw corrupt_error("block: version 4 is for lossy blocks");
  if (rounds && flags) {
    if (!is_lossy(h.codec) || flags >= mantissa_bits(h.type))
      throw corrupt_error("block: bad rounding");
    h.round_bits = flags;
  } else if (version == block_format_version_rounded) {
    throw corrupt_error("block: bad rounding");
  }
  h.coded_escapes = version == block_format_version_coded_escapes;
  if (h.codec == block_codec::float_lossless && !is_float(h.type))
    throw corrupt_error("block: lossless float block of non-float type");
  if (version == block_format_version_packed && h.codec != block_codec::float_lossless)
    throw corrupt_error("block: version 3 is for lossless float blocks");
  h.packed_planes = version == block_format_version_packed;
  if (whole_block && h.total_size() > in.size()) throw corrupt_error("block: truncated");
  return h;
}

void decode_block(std::span<const std::byte> in, const std::byte* base, std::byte* out) {
  const block_header h = read_block_header(in);
  const auto header = in.first(block_header_size);
  const auto payload = in.subspan(block_header_size, h.payload_size);
  std::uint64_t stored;
  std::memcpy(&stored, header.data() + kChecksumAt, 8);
  if (stored != block_checksum(header.first(kChecksumAt), payload))
    throw corrupt_error("block: checksum mismatch");

  const std::size_t n = h.elements, esize = element_size(h.type);
  byte_reader r(payload);
  switch (h.codec) {
    case block_codec::raw: {
      if (payload.size() != n * esize) throw corrupt_error("block: raw size mismatch");
      if (n) std::memcpy(out, payload.data(), n * esize);
      return;
    }
    case block_codec::zstd: {
      const std::size_t z = ZSTD_decompress(out, n * esize, payload.data(), payload.size());
      if (ZSTD_isError(z) || z != n * esize) throw corrupt_error("block: zstd payload");
      return;
    }
    case block_codec::float_lossless: {
      thread_local scratch_vector<std::uint8_t> planes;
      planes.resize(n * esize);
      std::array<const std::uint8_t*, 4> src{};
      for (std::size_t pl = 0; pl < esize; ++pl) {
        const auto len = r.get<std::uint32_t>();
        const auto coded = r.get_bytes(len);
        if (!coded.empty() && coded[0] == std::byte(entropy_mode::stored) &&
            coded.size() == n + 1) {
          src[pl] = reinterpret_cast<const std::uint8_t*>(coded.data() + 1);
        } else {
          decode_bytes(coded, std::span(planes.data() + pl * n, n),
                       h.packed_planes ? packing::allowed : packing::off);
          src[pl] = planes.data() + pl * n;
        }
      }
      if (r.remaining()) throw corrupt_error("block: trailing bytes");
      from_planes(h.type, src, n, out);
      return;
    }
    case block_codec::lc_delta:
    case block_codec::lc_ratio:
    case block_codec::lc_intra: {
      if (h.codec == block_codec::lc_intra) base = zero_base();
      if (!base) throw invalid_argument("block: delta block decoded without its base");
      const delta_kind kind =
          h.codec == block_codec::lc_ratio ? delta_kind::ratio : delta_kind::difference;
      std::array<float, 1 << max_bits> rep{};
      rep[0] = kind == delta_kind::ratio ? 1.0f : -0.0f;
      for (int s = 1; s < (1 << h.bits); ++s) rep[s] = r.get<float>();
      const auto nesc = r.get<std::uint32_t>();
      if (nesc > n) throw corrupt_error("block: too many escapes");
      thread_local scratch_vector<std::uint32_t> indices;
      thread_local scratch_vector<std::byte> values;
      if (h.coded_escapes) {
        get_coded_escapes(r, h.type, n, nesc, indices, values);
        indices.note();
        values.note();
      } else {
        const auto idx_bytes = r.get_bytes(std::size_t(nesc) * 4);
        const auto val_bytes = r.get_bytes(std::size_t(nesc) * esize);
        indices.resize(nesc);
        if (nesc) std::memcpy(indices.data(), idx_bytes.data(), std::size_t(nesc) * 4);
        values.assign(val_bytes.begin(), val_bytes.end());
      }
      thread_local scratch_vector<std::uint8_t> groups;
      groups.resize((n + h.group - 1) / h.group);
      decode_bytes(r.get_bytes(r.remaining()), groups);
      lc_decode_symbols(h.type, kind, base, n, groups.data(), h.bits, h.group, rep.data(),
                        h.round_bits, out);
      for (std::size_t e = 0; e < nesc; ++e) {
        const std::uint32_t i = indices[e];
        if (i >= n) throw corrupt_error("block: escape index out of range");
        std::memcpy(out + std::size_t(i) * esize, values.data() + e * esize, esize);
      }
      return;
    }
  }
  throw corrupt_error("block: unknown codec");
}

}  // namespace ckpt::codec
