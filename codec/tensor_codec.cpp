#include "codec/tensor_codec.hpp"

#include <tbb/blocked_range.h>
#include <tbb/combinable.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <string>
#include <utility>

#include "codec/error.hpp"
#include "codec/scratch.hpp"

namespace ckpt::codec {

std::string_view name(bucket_scope s) noexcept {
  return s == bucket_scope::checkpoint ? "checkpoint" : "tensor";
}

namespace {

std::size_t elements_per_block(dtype t, std::size_t block_bytes) {
  const std::size_t n = block_bytes / element_size(t);
  if (n == 0 || block_bytes > max_block_bytes)
    throw invalid_argument("codec: block size out of range");
  return n;
}

void append_all(std::vector<std::vector<std::byte>>& parts, std::vector<std::byte>& out) {
  std::size_t total = out.size();
  for (auto& p : parts) total += p.size();
  out.reserve(total);
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
}

void check_pair(const delta_input& in) {
  if (!is_float(in.type)) throw invalid_argument("codec: deltas need a float dtype");
  if (in.cur.size() != in.base.size())
    throw invalid_argument("codec: base and tensor differ in size");
  if (in.cur.size() % element_size(in.type)) throw invalid_argument("codec: partial element");
}

// nonnegative() over a large slab in pieces on every core: Adam's v is positive throughout, so
// its scan is a full pass over the slab and its base, which sat between the parallel parts.
bool nonnegative_parallel(dtype t, std::span<const std::byte> d) {
  constexpr std::size_t piece = std::size_t(256) << 10;  // a multiple of every element size
  if (d.size() <= 4 * piece) return nonnegative(t, d);
  std::atomic<bool> ok{true};
  tbb::parallel_for(std::size_t(0), (d.size() + piece - 1) / piece, [&](std::size_t i) {
    if (!ok.load(std::memory_order_relaxed)) return;
    const std::size_t at = i * piece;
    if (!nonnegative(t, d.subspan(at, std::min(piece, d.size() - at))))
      ok.store(false, std::memory_order_relaxed);
  });
  return ok.load();
}

}  // namespace

delta_kind choose_kind(const delta_input& in, bool relative) {
  check_pair(in);
  return relative && nonnegative_parallel(in.type, in.cur) && nonnegative_parallel(in.type, in.base)
             ? delta_kind::ratio
             : delta_kind::difference;
}

namespace {

template <class ToF32, class Prefetch>
bool prefer_intra_with(std::size_t n, ToF32 at, Prefetch prefetch) {
  // A prime stride: rows of a power-of-two length would otherwise sample the same columns of
  // every row.
  constexpr std::size_t stride = 251, run = 16;
  double diff = 0, value = 0;
  for (std::size_t i = 0; i < n; i += stride) {
    // Callers look at a slab with this first (the write path: a slab fresh from its writer),
    // so the runs come from memory, a kilobyte apart; asking for the run eight ahead hides
    // their latency.
    if (i + 8 * stride < n) prefetch(i + 8 * stride, std::min(n, i + 8 * stride + run) - 1);
    const std::size_t end = std::min(n, i + run);
    for (std::size_t j = i; j < end; ++j) {
      const auto [c, b] = at(j);
      const double d = double(c) - double(b);
      diff += d * d;
      value += double(c) * double(c);
    }
  }
  return std::isfinite(diff) && std::isfinite(value) && diff > value;
}

}  // namespace

bool prefer_intra(const delta_input& in) {
  check_pair(in);
  const std::size_t n = in.cur.size() / element_size(in.type);
  switch (in.type) {
    case dtype::f32: {
      auto c = reinterpret_cast<const float*>(in.cur.data());
      auto b = reinterpret_cast<const float*>(in.base.data());
      return prefer_intra_with(
          n,
          [c, b](std::size_t i) {
            return std::pair{c[i], b[i]};
          },
          [c, b](std::size_t first, std::size_t last) {
            for (const float* p : {c + first, c + last, b + first, b + last}) __builtin_prefetch(p);
          });
    }
    case dtype::f16:
    case dtype::bf16: {
      auto c = reinterpret_cast<const std::uint16_t*>(in.cur.data());
      auto b = reinterpret_cast<const std::uint16_t*>(in.base.data());
      const bool half = in.type == dtype::f16;
      return prefer_intra_with(
          n,
          [c, b, half](std::size_t i) {
            return half ? std::pair{f16_to_f32(c[i]), f16_to_f32(b[i])}
                        : std::pair{bf16_to_f32(c[i]), bf16_to_f32(b[i])};
          },
          [c, b](std::size_t first, std::size_t last) {
            for (const std::uint16_t* p : {c + first, c + last, b + first, b + last})
              __builtin_prefetch(p);
          });
    }
    case dtype::bytes:
      break;
  }
  return false;
}

delta_stats gather_stats(std::span<const delta_input> inputs, bool track_range, delta_kind kind) {
  constexpr std::size_t chunk = 1u << 16;
  // Integer statistics merge in any order to the same result, so thread-local partials are safe.
  tbb::combinable<delta_stats> partial;
  for (const auto& in : inputs) {
    check_pair(in);
    const std::size_t es = element_size(in.type), n = in.cur.size() / es;
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, chunk), [&](const auto& r) {
      accumulate(partial.local(), in.type, in.cur.data() + r.begin() * es,
                 in.base.data() + r.begin() * es, r.size(), track_range, kind);
    });
  }
  delta_stats all;
  partial.combine_each([&](const delta_stats& s) { all.merge(s); });
  return all;
}

std::vector<quant_table> plan_tables(std::span<const delta_input> inputs, int bits,
                                     representative rep, bucket_scope scope, bool relative,
                                     bool intra) {
  const bool range = rep == representative::midrange;
  std::vector<delta_kind> kinds;
  for (const auto& in : inputs) {
    delta_kind k = choose_kind(in, relative);
    if (intra && scope == bucket_scope::tensor && k == delta_kind::difference && prefer_intra(in))
      k = delta_kind::intra;
    kinds.push_back(k);
  }
  std::vector<quant_table> out;
  if (scope == bucket_scope::checkpoint) {
    std::array<delta_stats, 2> all;
    for (std::size_t i = 0; i < inputs.size(); ++i)
      all[int(kinds[i])].merge(gather_stats(inputs.subspan(i, 1), range, kinds[i]));
    const std::array<quant_table, 2> shared{
        select_buckets(all[0], bits, rep, delta_kind::difference),
        select_buckets(all[1], bits, rep, delta_kind::ratio)};
    for (auto k : kinds) out.push_back(shared[int(k)]);
  } else {
    for (std::size_t i = 0; i < inputs.size(); ++i)
      out.push_back(
          select_buckets(gather_stats(inputs.subspan(i, 1), range, kinds[i]), bits, rep, kinds[i]));
  }
  return out;
}

void encode_delta_into(const delta_input& in, const quant_table& q, const lossy_params& p,
                       std::span<std::byte> recon, std::vector<std::byte>& out,
                       std::size_t block_bytes, error_sums* error) {
  check_pair(in);
  if (recon.size() != in.cur.size()) throw invalid_argument("codec: recon buffer size");
  const std::size_t es = element_size(in.type), n = in.cur.size() / es;
  const std::size_t per = elements_per_block(in.type, block_bytes);
  const std::size_t nblocks = (n + per - 1) / per;
  std::vector<std::vector<std::byte>> parts(nblocks);
  std::vector<error_sums> errors(error ? nblocks : 0);
  tbb::parallel_for(std::size_t(0), nblocks, [&](std::size_t b) {
    const std::size_t first = b * per, cnt = std::min(per, n - first);
    encode_delta_block(in.type, in.cur.data() + first * es, in.base.data() + first * es, cnt, q, p,
                       recon.data() + first * es, parts[b]);
    if (error)
      errors[b] = measure_error_serial(in.type, in.cur.subspan(first * es, cnt * es),
                                       recon.subspan(first * es, cnt * es));
  });
  for (const auto& e : errors) error->merge(e);
  append_all(parts, out);
}

void encode_exact_into(dtype t, std::span<const std::byte> data, std::vector<std::byte>& out,
                       std::size_t block_bytes) {
  const std::size_t es = element_size(t);
  if (data.size() % es) throw invalid_argument("codec: partial element");
  const std::size_t n = data.size() / es;
  const std::size_t per = elements_per_block(t, block_bytes);
  const std::size_t nblocks = (n + per - 1) / per;
  std::vector<std::vector<std::byte>> parts(nblocks);
  tbb::parallel_for(std::size_t(0), nblocks, [&](std::size_t b) {
    const std::size_t first = b * per, cnt = std::min(per, n - first);
    // Encode into reused scratch sized for the worst case; keep the exact bytes.
    thread_local scratch_vector<std::byte> scratch;
    scratch.clear();
    encode_exact_block(t, data.data() + first * es, cnt, scratch);
    scratch.note();
    parts[b].assign(scratch.begin(), scratch.end());
  });
  append_all(parts, out);
}

std::vector<std::byte> encode_delta(const delta_input& in, const quant_table& q,
                                    const lossy_params& p, std::span<std::byte> recon,
                                    std::size_t block_bytes) {
  std::vector<std::byte> out;
  encode_delta_into(in, q, p, recon, out, block_bytes);
  return out;
}

std::vector<std::byte> encode_exact(dtype t, std::span<const std::byte> data,
                                    std::size_t block_bytes) {
  std::vector<std::byte> out;
  encode_exact_into(t, data, out, block_bytes);
  return out;
}

frame_info inspect(std::span<const std::byte> encoded) {
  frame_info f;
  std::size_t at = 0;
  while (at < encoded.size()) {
    const block_header h = read_block_header(encoded.subspan(at));
    f.elements += h.elements;
    f.blocks += 1;
    f.needs_base |= needs_base(h.codec);
    at += h.total_size();
  }
  return f;
}

frame_index index_frame(std::span<const std::byte> encoded) {
  frame_index fi;
  std::size_t at = 0;
  std::uint32_t last = 0;
  while (at < encoded.size()) {
    const block_header h = read_block_header(encoded.subspan(at));
    if (fi.offsets.empty())
      fi.block_elements = h.elements;
    else if (last != fi.block_elements)
      throw corrupt_error("frame: a block before the last is shorter than the first");
    if (h.elements == 0 || h.elements > fi.block_elements)
      throw corrupt_error("frame: uneven block sizes");
    last = h.elements;
    fi.offsets.push_back(at);
    at += h.total_size();
  }
  return fi;
}

namespace {

void decode_frame(std::span<const std::byte> encoded, std::span<const std::byte> base,
                  std::span<std::byte> out, bool parallel) {
  struct piece {
    std::size_t at, out_at;
  };
  std::vector<piece> pieces;
  std::size_t at = 0, out_at = 0;
  bool lossy = false;
  while (at < encoded.size()) {
    const block_header h = read_block_header(encoded.subspan(at));
    const std::size_t bytes = std::size_t(h.elements) * element_size(h.type);
    if (bytes > out.size() - out_at) throw corrupt_error("frame: more elements than expected");
    lossy |= needs_base(h.codec);
    pieces.push_back({at, out_at});
    at += h.total_size();
    out_at += bytes;
  }
  if (out_at != out.size())
    throw corrupt_error("frame: " + std::to_string(out_at) + " bytes, expected " +
                        std::to_string(out.size()));
  if (lossy && base.size() != out.size())
    throw invalid_argument("frame: lossy frame needs a base of the same size");
  auto one = [&](std::size_t i) {
    const piece& p = pieces[i];
    decode_block(encoded.subspan(p.at), lossy ? base.data() + p.out_at : nullptr,
                 out.data() + p.out_at);
  };
  if (parallel)
    tbb::parallel_for(std::size_t(0), pieces.size(), one);
  else
    for (std::size_t i = 0; i < pieces.size(); ++i) one(i);
}

}  // namespace

void decode(std::span<const std::byte> encoded, std::span<const std::byte> base,
            std::span<std::byte> out) {
  decode_frame(encoded, base, out, true);
}

void decode_here(std::span<const std::byte> encoded, std::span<const std::byte> base,
                 std::span<std::byte> out) {
  decode_frame(encoded, base, out, false);
}

}  // namespace ckpt::codec
