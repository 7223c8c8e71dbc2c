#pragma once
// LC-Checkpoint quantisation (DESIGN.md §2 items 2-4): every delta element falls in a bucket keyed
// by (sign, binary exponent); the 2^b - 1 buckets of largest magnitude survive (ranked across both
// signs); every other element becomes the zero symbol. Each survivor decodes to one representative.
//
// Deltas are differences (the paper) or ratios (relative changes, for tensors that are never
// negative, such as Adam's second moment). Their values span many octaves and grow from zero, so
// the few buckets of the largest differences leave the small elements stale at a fraction of
// their value, and Adam's step m / sqrt(v) blows up after a restore (DESIGN.md §2 item 4). Ratio
// buckets put every element's relative change on one scale.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "codec/dtype.hpp"
#include "codec/reconstruct.hpp"

namespace ckpt::codec {

enum class representative : std::uint8_t {
  mean = 0,  // arithmetic mean of the bucket's members (public re-implementations; min L2 error)
  midrange = 1,  // (max + min) / 2 (the paper's wording; min worst-case error)
};
std::string_view name(representative r) noexcept;
std::string_view name(delta_kind k) noexcept;

inline constexpr int max_bits = 4;
inline constexpr int key_count = 512;  // sign bit + 8 exponent bits of the fp32 delta

// Per-key statistics of fp32 deltas. Sums are of integer mantissas, so they are exact and do not
// depend on the order of accumulation: any split over threads gives the same table.
struct delta_stats {
  std::array<std::uint64_t, key_count> count{};
  std::array<std::uint64_t, key_count> mantissa_sum{};
  std::array<std::uint32_t, key_count> mantissa_min;
  std::array<std::uint32_t, key_count> mantissa_max{};
  delta_stats() { mantissa_min.fill(0xffffffffu); }
  void merge(const delta_stats& o);
};

// Adds the deltas (delta_of<kind>, in fp32) of n elements of type t. `track_range` also keeps
// min/max mantissas (needed by the midrange representative only; it costs time).
void accumulate(delta_stats& s, dtype t, const std::byte* cur, const std::byte* base, std::size_t n,
                bool track_range, delta_kind kind = delta_kind::difference);

// The decoding table: symbol -> representative, and fp32-delta key -> symbol (the encoder's
// map; for ratios, a key that did not survive maps to the next smaller surviving bucket of its
// sign, for differences to the zero symbol, as in the paper).
struct quant_table {
  int bits = 0;
  delta_kind kind = delta_kind::difference;
  // What reconstruct<T, kind> applies to the base: the bucket's difference, or for ratios the
  // factor 1 + r̄. rep[0] is the identity for every float, so the zero symbol reconstructs the
  // base bit for bit: -0.0f for differences (x + -0 = x, also for x = -0), 1.0f for ratios.
  std::array<float, 1 << max_bits> rep{};
  std::array<std::uint8_t, key_count> symbol_of_key{};
  // A grid table (select_grid) instead maps each delta to its nearest representative: `grid`
  // midpoints between the representatives sorted ascending (the zero symbol's among them), and
  // grid_symbol[i] the symbol of the i-th smallest. 0: a bucket table, symbol_of_key applies.
  int grid = 0;
  std::array<float, (1 << max_bits) - 1> midpoint{};
  std::array<std::uint8_t, 1 << max_bits> grid_symbol{};
  int symbols() const { return 1 << bits; }
  // A grid table's symbol for the delta d: the nearest representative's (ties go up).
  unsigned nearest(float d) const {
    int i = 0;
    while (i < grid && d >= midpoint[std::size_t(i)]) ++i;
    return grid_symbol[std::size_t(i)];
  }
};

// `buckets`: how many survive, at most (and by default) 2^bits - 1; symbols beyond them stay
// unused (their representative is 0, or the factor 1).
quant_table select_buckets(const delta_stats& s, int bits, representative r,
                           delta_kind kind = delta_kind::difference, int buckets = 0);

// A uniform grid for differences: representatives ±j·Δ for j = 1 .. 2^(bits-1) - 1 with
// Δ = step · (RMS of the deltas, estimated from the key statistics), each element taking the
// nearest (an entropy-coded uniform quantiser). Against the paper's buckets it spends fewer bits
// at the same error on weight deltas, whose bulk the largest-magnitude buckets skip. The table
// is an ordinary one to decoders. Needs bits >= 2; deltas that are all zero get no symbols.
quant_table select_grid(const delta_stats& s, int bits, double step);

// Estimated cost of coding the differences behind `s` with table `q` (a bucket or a grid table):
// the order-0 entropy of the symbols in bits per element and the mean squared error, assuming the
// deltas of each key spread over its binade with an exponential density of the key's mean
// mantissa, in fp32 arithmetic (the closed loop included: an element whose symbol would not bring
// it closer stays at its base). It does not model candidates rounded to f16/bf16 or to fewer
// mantissa bits: near the unit of those, the measured error can be well above the estimate.
struct coding_estimate {
  double bits = 0;
  double mse = 0;
};
coding_estimate estimate_coding(const delta_stats& s, const quant_table& q);

// The table for a difference slab: the grid (select_grid) at the step whose estimated error is at
// most the buckets' with the fewest estimated bits, when that is 2% fewer than the buckets';
// otherwise the buckets (select_buckets). The error stays where the buckets put it; the grid
// wins where the buckets of the largest binades leave the bulk of the deltas at their base.
// bits = 1, and deltas of fewer than kGridMinElements elements, always get the buckets.
inline constexpr std::uint64_t kGridMinElements = std::uint64_t(1) << 12;
//
// `allow` lets the grid's estimated error grow past the buckets' where the slab's values make it
// small: up to floor_mse (an error the caller accepts whatever the buckets would make, e.g. a
// fraction of the values' own mean square), at most max_scale times the buckets' mean square
// error. The defaults keep the buckets' error.
struct error_allowance {
  double floor_mse = 0;
  double max_scale = 1;
  // The mean square error the grid may reach where the buckets make `buckets_mse`.
  double bound(double buckets_mse) const noexcept {
    if (!(buckets_mse > 0) || !(floor_mse > buckets_mse) || !(max_scale > 1)) return buckets_mse;
    return std::min(floor_mse, max_scale * buckets_mse);
  }
};
quant_table select_difference(const delta_stats& s, int bits, representative r,
                              const error_allowance& allow = {});

// The mean square of a float slab's finite values, from a fixed sample of it (every 8th run of
// 1024 elements, in order, so the result does not depend on threads): what
// error_allowance::floor_mse is a fraction of. 0 for an empty slab or a non-float dtype.
double sampled_mean_square(dtype t, std::span<const std::byte> values) noexcept;

// True when every element is >= 0 and not NaN (a tensor that ratio deltas may code; -0.0 counts).
bool nonnegative(dtype t, std::span<const std::byte> data) noexcept;

}  // namespace ckpt::codec
