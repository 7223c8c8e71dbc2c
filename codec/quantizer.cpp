#include "codec/quantizer.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "codec/error.hpp"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace ckpt::codec {

std::string_view name(representative r) noexcept {
  return r == representative::mean ? "mean" : "midrange";
}

std::string_view name(delta_kind k) noexcept {
  switch (k) {
    case delta_kind::difference:
      return "difference";
    case delta_kind::ratio:
      return "ratio";
    case delta_kind::intra:
      return "intra";
  }
  return "?";
}

void delta_stats::merge(const delta_stats& o) {
  for (int k = 0; k < key_count; ++k) {
    count[k] += o.count[k];
    mantissa_sum[k] += o.mantissa_sum[k];
    mantissa_min[k] = std::min(mantissa_min[k], o.mantissa_min[k]);
    mantissa_max[k] = std::max(mantissa_max[k], o.mantissa_max[k]);
  }
}

namespace {

// One bin of an accumulation lane: count and mantissa sum packed in one word (a single
// read-modify-write for both), and the mantissa extremes. The sum field holds 40 bits: a lane is
// flushed into the 64-bit totals before any bin can receive 2^17 mantissas of 23 bits.
struct lane_bin {
  std::uint64_t packed = 0;  // count << 40 | sum
  std::uint32_t min = 0xffffffffu, max = 0;
};
constexpr int sum_bits = 40;
constexpr std::uint64_t one_count = std::uint64_t(1) << sum_bits;

// `fill(at, m, d)` writes the fp32 deltas (delta_of<K>, as bits) of elements at..at+m-1 to d.
template <delta_kind K, class Fill>
void accumulate_with(delta_stats& s, std::size_t n, bool track_range, Fill fill) {
  // Four interleaved lanes, each a table of bins: deltas crowd into a few keys, so with one
  // table every element waited for the previous one's read-modify-writes of the same bin
  // (measured 0.4 GB/s a core with extremes on real Adam deltas). Integer sums, min and max
  // merge exactly in any order: the result does not depend on the interleaving. The lanes' tables
  // are 8 KiB plus 80 bytes apart: at exactly 8 KiB the same key's bins in two lanes alias in
  // the low 12 address bits, and the CPU stalls loads behind unrelated stores (unpadded, four
  // lanes took 1.3-1.4 ns an element against 1.1-1.2, eight lanes 3.3-3.8 ns).
  constexpr std::size_t lanes = 4;
  constexpr std::size_t flush_every = lanes << 17;
  constexpr std::size_t stride = key_count + 5;
  std::vector<lane_bin> bins(lanes * stride);
  auto flush = [&] {
    for (std::size_t l = 0; l < lanes; ++l)
      for (int k = 0; k < key_count; ++k) {
        lane_bin& b = bins[l * stride + std::size_t(k)];
        s.count[k] += b.packed >> sum_bits;
        s.mantissa_sum[k] += b.packed & (one_count - 1);
        if (track_range) {
          s.mantissa_min[k] = std::min(s.mantissa_min[k], b.min);
          s.mantissa_max[k] = std::max(s.mantissa_max[k], b.max);
        }
        b = lane_bin{};
      }
  };
  auto run = [&]<bool Range>(std::size_t start, std::size_t end) {
    auto update = [&](lane_bin* table, std::uint32_t d) {
      lane_bin& b = table[d >> 23];
      const std::uint32_t m = d & 0x7fffffu;
      b.packed += one_count + m;
      if constexpr (Range) {
        // Branches, not min/max: after a bin's first few members a new extreme is rare, and a
        // predicted branch keeps the extremes out of each element's stores (with the padding
        // above, 1.1-1.2 ns an element instead of 1.4-1.5 on the 2-core AMD EPYC VM).
        if (m < b.min) [[unlikely]]
          b.min = m;
        if (m > b.max) [[unlikely]]
          b.max = m;
      }
    };
    // The deltas of a block first (eight at a time where fill() is vectorised), then the bins.
    constexpr std::size_t block = 256;
    alignas(32) std::uint32_t d[block];
    for (std::size_t at = start; at < end; at += block) {
      const std::size_t m = std::min(block, end - at);
      fill(at, m, d);
      std::size_t j = 0;
      for (; j + lanes <= m; j += lanes)
        for (std::size_t l = 0; l < lanes; ++l) update(bins.data() + l * stride, d[j + l]);
      for (; j < m; ++j) update(bins.data(), d[j]);
    }
  };
  for (std::size_t start = 0; start < n; start += flush_every) {
    const std::size_t end = std::min(n, start + flush_every);
    if (track_range)
      run.template operator()<true>(start, end);
    else
      run.template operator()<false>(start, end);
    flush();
  }
}

// |value| of a float with biased exponent e (1..254) and mantissa bits m, exactly, in double.
double magnitude(int e, double m) {
  return std::ldexp(1.0 + m / 8388608.0, e - 127);
}

// fill() for accumulate_with from a per-element load(i) -> (cur, base) in fp32.
template <delta_kind K, class Load>
auto per_element(Load load) {
  return [load](std::size_t at, std::size_t m, std::uint32_t* d) {
    for (std::size_t j = 0; j < m; ++j) {
      const auto [c, b] = load(at + j);
      d[j] = std::bit_cast<std::uint32_t>(delta_of<K>(c, b));
    }
  };
}

// fp32 deltas eight at a time: GCC leaves per_element's loop scalar (the ratio's c == b case is
// control flow, and it did not vectorise the difference either). The same IEEE sub and div as
// delta_of, and +0 where c == b for ratios, so the bits are delta_of's.
template <delta_kind K>
auto f32_deltas(const float* c, const float* b) {
  return [c, b](std::size_t at, std::size_t m, std::uint32_t* d) {
    std::size_t j = 0;
#if defined(__AVX2__)
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; j + 8 <= m; j += 8) {
      const __m256 cv = _mm256_loadu_ps(c + at + j), bv = _mm256_loadu_ps(b + at + j);
      __m256 dv;
      if constexpr (K == delta_kind::difference) {
        dv = _mm256_sub_ps(cv, bv);
      } else {
        dv = _mm256_sub_ps(_mm256_div_ps(cv, bv), one);
        dv = _mm256_andnot_ps(_mm256_cmp_ps(cv, bv, _CMP_EQ_OQ), dv);
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(d + j), _mm256_castps_si256(dv));
    }
#endif
    for (; j < m; ++j) d[j] = std::bit_cast<std::uint32_t>(delta_of<K>(c[at + j], b[at + j]));
  };
}

template <delta_kind K>
void accumulate_kind(delta_stats& s, dtype t, const std::byte* cur, const std::byte* base,
                     std::size_t n, bool track_range) {
  switch (t) {
    case dtype::f32: {
      auto c = reinterpret_cast<const float*>(cur);
      auto b = reinterpret_cast<const float*>(base);
      accumulate_with<K>(s, n, track_range, f32_deltas<K>(c, b));
      return;
    }
    case dtype::f16: {
      auto c = reinterpret_cast<const std::uint16_t*>(cur);
      auto b = reinterpret_cast<const std::uint16_t*>(base);
      accumulate_with<K>(s, n, track_range, per_element<K>([c, b](std::size_t i) {
                           return std::pair{f16_to_f32(c[i]), f16_to_f32(b[i])};
                         }));
      return;
    }
    case dtype::bf16: {
      auto c = reinterpret_cast<const std::uint16_t*>(cur);
      auto b = reinterpret_cast<const std::uint16_t*>(base);
      accumulate_with<K>(s, n, track_range, per_element<K>([c, b](std::size_t i) {
                           return std::pair{bf16_to_f32(c[i]), bf16_to_f32(b[i])};
                         }));
      return;
    }
    case dtype::bytes:
      break;
  }
  throw invalid_argument("quantizer: only float tensors have deltas");
}

}  // namespace

void accumulate(delta_stats& s, dtype t, const std::byte* cur, const std::byte* base, std::size_t n,
                bool track_range, delta_kind kind) {
  if (kind == delta_kind::ratio) {
    accumulate_kind<delta_kind::ratio>(s, t, cur, base, n, track_range);
  } else if (kind == delta_kind::difference) {
    accumulate_kind<delta_kind::difference>(s, t, cur, base, n, track_range);
  } else {
    // Intra: differences from zero_base(), a piece of its size at a time (callers' ranges are
    // as large as the thread pool hands out). Integer sums: the pieces change nothing.
    const std::size_t es = element_size(t), piece = zero_base_bytes / es;
    for (std::size_t at = 0; at < n; at += piece)
      accumulate_kind<delta_kind::difference>(s, t, cur + at * es, zero_base(),
                                              std::min(piece, n - at), track_range);
  }
}

namespace {

// Every element's sign bit clear (or the value -0.0) and none a NaN. Branch-free within a chunk;
// the first chunk holding a negative value ends the scan, so a signed tensor (the usual case on
// the write path) costs one chunk, not a pass over the tensor. Adam's v is scanned whole: GCC
// left the portable loop scalar (AVX2 has no unsigned compare), 7x the cost of a copy, so AVX2
// builds run signed compares of x ^ sign (> 0 iff x > sign unsigned) in registers.
template <class U>
bool nonnegative_bits(const U* v, std::size_t n, U sign, U inf) {
  constexpr std::size_t chunk = 4096;
  const U abs_mask = U(sign - 1);
  for (std::size_t at = 0; at < n; at += chunk) {
    const std::size_t end = std::min(n, at + chunk);
    std::size_t i = at;
    unsigned bad = 0;
#if defined(__AVX2__)
    constexpr std::size_t per = 32 / sizeof(U);
    const bool wide = sizeof(U) == 4;
    const __m256i sign_v = wide ? _mm256_set1_epi32(int(sign)) : _mm256_set1_epi16(short(sign));
    const __m256i abs_v =
        wide ? _mm256_set1_epi32(int(abs_mask)) : _mm256_set1_epi16(short(abs_mask));
    const __m256i inf_v = wide ? _mm256_set1_epi32(int(inf)) : _mm256_set1_epi16(short(inf));
    const __m256i zero = _mm256_setzero_si256();
    __m256i acc = zero;
    for (; i + per <= end; i += per) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i));
      const __m256i flipped = _mm256_xor_si256(x, sign_v), magnitude = _mm256_and_si256(x, abs_v);
      acc = _mm256_or_si256(
          acc, wide ? _mm256_cmpgt_epi32(flipped, zero) : _mm256_cmpgt_epi16(flipped, zero));
      acc = _mm256_or_si256(
          acc, wide ? _mm256_cmpgt_epi32(magnitude, inf_v) : _mm256_cmpgt_epi16(magnitude, inf_v));
    }
    bad = !_mm256_testz_si256(acc, acc);
#endif
    for (; i < end; ++i) {
      const U x = v[i];
      bad |= unsigned((x > sign) | (U(x & abs_mask) > inf));
    }
    if (bad) return false;
  }
  return true;
}

}  // namespace

bool nonnegative(dtype t, std::span<const std::byte> data) noexcept {
  switch (t) {
    case dtype::f32:
      return nonnegative_bits(reinterpret_cast<const std::uint32_t*>(data.data()), data.size() / 4,
                              std::uint32_t(0x80000000u), std::uint32_t(0x7f800000u));
    case dtype::f16:
    case dtype::bf16:
      return nonnegative_bits(reinterpret_cast<const std::uint16_t*>(data.data()), data.size() / 2,
                              std::uint16_t(0x8000),
                              std::uint16_t(t == dtype::f16 ? 0x7c00 : 0x7f80));
    case dtype::bytes:
      break;
  }
  return false;
}

quant_table select_buckets(const delta_stats& s, int bits, representative r, delta_kind kind,
                           int buckets) {
  if (bits < 1 || bits > max_bits) throw invalid_argument("quantizer: bits must be 1..4");
  struct candidate {
    int key;
    float rep;
    double priority;
  };
  std::vector<candidate> cands;
  for (int key = 0; key < key_count; ++key) {
    const int e = key & 0xff;
    // Exponent 0 (zeros, subnormals below 1.2e-38) is never worth a symbol; 255 is non-finite
    // and goes through the exact escape instead.
    if (e == 0 || e == 255 || s.count[key] == 0) continue;
    double mag;
    if (r == representative::mean) {
      mag = magnitude(e, double(s.mantissa_sum[key]) / double(s.count[key]));
    } else {
      mag = 0.5 * (magnitude(e, s.mantissa_min[key]) + magnitude(e, s.mantissa_max[key]));
    }
    const float rep = float(key & 0x100 ? -mag : mag);
    // Differences: the paper's priority, largest magnitude first. Ratios: the most log-error
    // removed, count * |log2(1 + r)|. By magnitude alone, a tensor whose ratios span 2^-10..2^40
    // (Adam's v growing from near zero in the first steps) would spend every symbol on the few
    // elements that grew a billionfold and leave the many that grew 4x stale. Only the encoder
    // ranks (the table is stored), so libm's log2 does not affect what decoders compute.
    const double priority = kind == delta_kind::ratio
                                ? double(s.count[key]) * std::fabs(std::log2(1.0 + double(rep)))
                                : std::fabs(double(rep));
    cands.push_back({key, rep, priority});
  }
  // Highest priority first; ties by key, so the table is fully determined.
  std::sort(cands.begin(), cands.end(), [](const candidate& a, const candidate& b) {
    return a.priority != b.priority ? a.priority > b.priority : a.key < b.key;
  });
  quant_table q;
  q.bits = bits;
  q.kind = kind;
  const bool ratio = kind == delta_kind::ratio;
  q.rep.fill(ratio ? 1.0f : 0.0f);
  q.rep[0] = ratio ? 1.0f : -0.0f;
  const int most = buckets > 0 ? std::min(buckets, (1 << bits) - 1) : (1 << bits) - 1;
  const int keep = std::min<int>(int(cands.size()), most);
  for (int i = 0; i < keep; ++i) {
    // The factor is rounded once, here; the encoder checks every element against it.
    q.rep[i + 1] = ratio ? float(1.0 + double(cands[i].rep)) : cands[i].rep;
    q.symbol_of_key[cands[i].key] = std::uint8_t(i + 1);
  }
  if (ratio) {
    // A ratio bucket that did not survive takes the surviving bucket of its sign with the
    // largest magnitude below its own: that factor lies between 1 and the element's, so it
    // moves the element strictly closer (where the zero symbol would leave it at the base).
    // The paper's differences keep zero for them. The map is the encoder's alone: decoders
    // see symbols, not keys.
    for (int sign : {0, 0x100}) {
      std::uint8_t below = 0;
      for (int e = 1; e < 255; ++e) {
        const int key = sign | e;
        if (q.symbol_of_key[key] != 0)
          below = q.symbol_of_key[key];
        else if (s.count[key] != 0)
          q.symbol_of_key[key] = below;
      }
    }
  }
  return q;
}

quant_table select_grid(const delta_stats& s, int bits, double step) {
  if (bits < 2 || bits > max_bits) throw invalid_argument("quantizer: a grid needs bits 2..4");
  if (!(step > 0) || !std::isfinite(step)) throw invalid_argument("quantizer: bad grid step");
  quant_table q;
  q.bits = bits;
  q.kind = delta_kind::difference;
  q.rep.fill(0.0f);
  q.rep[0] = -0.0f;
  // Mean square from the buckets' mean magnitudes (within a bucket the spread is under a factor
  // 2, so this is close; exact integer sums keep it independent of threads). Non-finite deltas
  // are escapes and count for nothing.
  double sum_sq = 0, count = 0;
  for (int key = 0; key < key_count; ++key) {
    const int e = key & 0xff;
    if (e == 255 || s.count[key] == 0) continue;
    count += double(s.count[key]);
    if (e == 0) continue;
    const double mag = magnitude(e, double(s.mantissa_sum[key]) / double(s.count[key]));
    sum_sq += double(s.count[key]) * mag * mag;
  }
  const double delta = count > 0 ? step * std::sqrt(sum_sq / count) : 0.0;
  const float d = float(delta);
  if (!(d > 0) || !std::isnormal(d) || !std::isfinite(float(delta * (1 << bits)))) return q;
  const int levels = (1 << (bits - 1)) - 1;
  std::vector<std::pair<float, std::uint8_t>> sorted{{-0.0f, 0}};
  for (int j = 1; j <= levels; ++j) {
    const float v = float(double(j) * delta);
    q.rep[2 * j - 1] = v;
    q.rep[2 * j] = -v;
    sorted.emplace_back(v, std::uint8_t(2 * j - 1));
    sorted.emplace_back(-v, std::uint8_t(2 * j));
  }
  std::sort(sorted.begin(), sorted.end());
  q.grid = int(sorted.size()) - 1;
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    q.grid_symbol[i] = sorted[i].second;
    if (i + 1 < sorted.size())
      q.midpoint[i] = float(0.5 * (double(sorted[i].first) + double(sorted[i + 1].first)));
  }
  return q;
}

namespace {

// The l for which exp(-l t) on [0, 1) has mean `mean` (clamped to what |l| <= 60 reaches). The
// mean falls with l: 1/l - 1/(e^l - 1), 1/2 at l = 0.
double decay_for_mean(double mean) {
  auto mean_of = [](double l) {
    return std::fabs(l) < 1e-6 ? 0.5 - l / 12 : 1 / l - 1 / std::expm1(l);
  };
  double lo = -60, hi = 60;
  for (int i = 0; i < 24; ++i) {  // to 120 / 2^24: far below what 8 points resolve
    const double mid = 0.5 * (lo + hi);
    (mean_of(mid) > mean ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// The deltas behind a key, as estimate_coding models them: `points` values spread over the
// key's binade, each with its share of the key's count.
constexpr int kPoints = 8;
struct key_model {
  int key;
  double count;
  std::array<double, kPoints> share;  // sums to count
};

std::vector<key_model> model_of(const delta_stats& s, double& total, double& zeros) {
  std::vector<key_model> keys;
  total = zeros = 0;
  for (int key = 0; key < key_count; ++key) {
    const int e = key & 0xff;
    if (e == 255 || s.count[key] == 0) continue;
    const double count = double(s.count[key]);
    total += count;
    if (e == 0) {  // zeros and subnormals: the zero symbol, no error to speak of
      zeros += count;
      continue;
    }
    // Density exp(-l t) on the mantissa fraction t in [0, 1) with the key's mean (a tail falls
    // steeply within its binade, a bulk barely does).
    const double l = decay_for_mean(double(s.mantissa_sum[key]) / count / 8388608.0);
    key_model k{key, count, {}};
    double norm = 0;
    for (int i = 0; i < kPoints; ++i)
      norm += k.share[i] = std::exp(-l * ((i + 0.5) / kPoints - 0.5));
    for (auto& w : k.share) w *= count / norm;
    keys.push_back(k);
  }
  return keys;
}

coding_estimate estimate_with(const std::vector<key_model>& keys, double total, double zeros,
                              const quant_table& q) {
  std::array<double, 1 << max_bits> weight{};
  weight[0] = zeros;
  double sq = 0;
  for (const auto& k : keys) {
    const int e = k.key & 0xff;
    const unsigned bucket_symbol = q.symbol_of_key[k.key];
    for (int i = 0; i < kPoints; ++i) {
      const double mag = std::ldexp(1.0 + (i + 0.5) / kPoints, e - 127);
      const float x = float(k.key & 0x100 ? -mag : mag);
      const unsigned sym = q.grid ? q.nearest(x) : bucket_symbol;
      const double err = double(x) - double(q.rep[sym]), c = k.share[i];
      if (sym != 0 && std::fabs(err) < std::fabs(double(x))) {
        weight[sym] += c;
        sq += c * err * err;
      } else {
        weight[0] += c;
        sq += c * double(x) * double(x);
      }
    }
  }
  coding_estimate r;
  if (total <= 0) return r;
  for (double w : weight)
    if (w > 0) r.bits -= w / total * std::log2(w / total);
  r.mse = sq / total;
  return r;
}

}  // namespace

coding_estimate estimate_coding(const delta_stats& s, const quant_table& q) {
  if (q.kind != delta_kind::difference)
    throw invalid_argument("quantizer: estimates are for difference tables");
  double total, zeros;
  const auto keys = model_of(s, total, zeros);
  return estimate_with(keys, total, zeros, q);
}

quant_table select_difference(const delta_stats& s, int bits, representative r,
                              const error_allowance& allow) {
  quant_table buckets = select_buckets(s, bits, r, delta_kind::difference);
  if (bits < 2) return buckets;
  // Fewer deltas than this keep the buckets: the choice (about 0.1 ms) would cost several times
  // what coding them does, for a few bytes.
  std::uint64_t n = 0;
  for (auto c : s.count) n += c;
  if (n < kGridMinElements) return buckets;
  double total, zeros;
  const auto keys = model_of(s, total, zeros);  // once: the same deltas for every table
  const coding_estimate b = estimate_with(keys, total, zeros, buckets);
  if (b.bits <= 0) return buckets;
  // The bits fall as the step grows, and the error grows with it past the smallest steps
  // (where clipping at the outermost level dominates): the cheapest grid within the buckets'
  // error is at the largest step that keeps it. Down from 4 times the RMS half an octave at a
  // time to the first step within it (none below 1/4: the buckets), then halving the interval to
  // the step above five times.
  quant_table best = buckets;
  const double best_bits = b.bits * 0.98;
  const double allowed_mse = allow.bound(b.mse);
  auto within = [&](double step, bool take) {
    const quant_table g = select_grid(s, bits, step);
    if (!g.grid) return false;
    const coding_estimate e = estimate_with(keys, total, zeros, g);
    if (e.mse > allowed_mse) return false;
    if (take && e.bits < best_bits) best = g;
    return true;
  };
  double lo = 0, hi = 4.0 * std::exp2(0.5);
  for (double step = 4.0; step >= 0.25; step *= std::exp2(-0.5)) {
    if (within(step, false)) {
      lo = step;
      break;
    }
    hi = step;
  }
  if (lo == 0) return buckets;
  for (int i = 0; i < 5; ++i) {
    const double mid = std::sqrt(lo * hi);
    (within(mid, false) ? lo : hi) = mid;
  }
  within(lo, true);
  return best;
}

double sampled_mean_square(dtype t, std::span<const std::byte> values) noexcept {
  if (!is_float(t)) return 0;
  constexpr std::size_t run = 1024, every = 8;
  const std::size_t n = values.size() / element_size(t);
  double sum = 0;
  std::size_t count = 0;
  for (std::size_t first = 0; first < n; first += run * every) {
    const std::size_t last = std::min(n, first + run);
    for (std::size_t i = first; i < last; ++i) {
      const double v = load_f32(t, values.data() + i * element_size(t));
      if (!std::isfinite(v)) continue;
      sum += v * v;
      ++count;
    }
  }
  return count ? sum / double(count) : 0;
}

}  // namespace ckpt::codec
