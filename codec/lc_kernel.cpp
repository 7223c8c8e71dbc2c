#include "codec/lc_kernel.hpp"

#include <bit>
#include <cmath>
#include <cstring>

#include "codec/error.hpp"
#include "codec/mantissa.hpp"
#include "codec/reconstruct.hpp"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace ckpt::codec {
namespace {

// Ratio tensors promise more than the closed-loop bound: every element reads back within a
// factor 2 of its value. An element the table cannot bring that close (a second moment that
// grew a millionfold from near zero in the first steps) is escaped, stored exactly.
inline bool within_factor_2(float got, float want) {
  return got >= want * 0.5f && got <= want * 2.0f;
}

// Storage bits of an element rounded with `drop` low mantissa bits gone (0: unchanged).
template <dtype T>
typename element<T>::storage rounded(typename element<T>::storage v, int drop) {
  if (drop <= 0) return v;
  if constexpr (T == dtype::f32) {
    return std::bit_cast<float>(round_word(std::bit_cast<std::uint32_t>(v), drop, 0x7f800000u));
  } else {
    return round_word(v, drop, std::uint16_t(T == dtype::f16 ? 0x7c00u : 0x7f80u));
  }
}

// Mantissa bits a rounding to round_bits drops (0: none); refuses what a block cannot say.
int dropped_bits(dtype t, int round_bits) {
  if (round_bits < 0 || round_bits >= mantissa_bits(t))
    throw invalid_argument("codec: round_bits must be 0 or below the dtype's mantissa bits");
  return round_bits ? mantissa_bits(t) - round_bits : 0;
}

template <dtype T, delta_kind K>
void encode_scalar(const std::byte* cur_b, const std::byte* base_b, std::size_t first,
                   std::size_t last, const quant_table& q, int drop, std::byte* recon_b,
                   std::uint8_t* symbols, std::vector<std::uint32_t>& escapes) {
  using E = element<T>;
  using S = typename E::storage;
  const S* cur = reinterpret_cast<const S*>(cur_b);
  const S* base = reinterpret_cast<const S*>(base_b);
  S* recon = reinterpret_cast<S*>(recon_b);
  for (std::size_t i = first; i < last; ++i) {
    const float c = E::to_f32(cur[i]), b = E::to_f32(base[i]);
    const float d = delta_of<K>(c, b);
    const std::uint32_t db = std::bit_cast<std::uint32_t>(d);
    if ((db & 0x7f800000u) == 0x7f800000u) {
      escapes.push_back(std::uint32_t(i));
      recon[i] = rounded<T>(cur[i], drop);
      symbols[i] = 0;
      continue;
    }
    const unsigned s = q.grid ? q.nearest(d) : q.symbol_of_key[db >> 23];
    const S cand = rounded<T>(reconstruct<T, K>(base[i], q.rep[s]), drop);
    const S stay = rounded<T>(base[i], drop);
    const bool keep = std::fabs(E::to_f32(cand) - c) < std::fabs(c - b);
    if constexpr (K == delta_kind::ratio) {
      if (!within_factor_2(E::to_f32(keep ? cand : stay), c)) {
        escapes.push_back(std::uint32_t(i));
        recon[i] = rounded<T>(cur[i], drop);
        symbols[i] = 0;
        continue;
      }
    }
    recon[i] = keep ? cand : stay;
    symbols[i] = std::uint8_t(keep ? s : 0);
  }
}

#if defined(__AVX2__)
// round_word on eight fp32 at once (drop >= 1).
inline __m256 round8(__m256 v, __m128i drop, __m256i half_less_one, __m256i keep_mask) {
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srl_epi32(x, drop), _mm256_set1_epi32(1));
  const __m256i trunc = _mm256_and_si256(x, keep_mask);
  __m256i r =
      _mm256_and_si256(_mm256_add_epi32(x, _mm256_add_epi32(half_less_one, lsb)), keep_mask);
  r = _mm256_blendv_epi8(r, trunc, _mm256_cmpeq_epi32(_mm256_and_si256(r, exp_mask), exp_mask));
  r = _mm256_blendv_epi8(r, x, _mm256_cmpeq_epi32(_mm256_and_si256(x, exp_mask), exp_mask));
  return _mm256_castsi256_ps(r);
}

// fp32 encoder, eight elements at a time. The surviving keys are at most 15, so the key ->
// (symbol, representative) lookup is a chain of compares and blends instead of gathers.
// An element with a non-finite delta (or, for ratios, one the table cannot bring within a factor
// 2) is escaped in the vector registers too, with encode_scalar's result.
// Same arithmetic as encode_scalar<f32, K> (IEEE add, sub, mul and div are exact-rounded in
// both; the rounding is round_word's integer arithmetic), so the two agree bit for bit.
template <delta_kind K, bool Round>
void encode_f32_avx2(const float* cur, const float* base, std::size_t n, const quant_table& q,
                     int drop, float* recon, std::uint8_t* symbols,
                     std::vector<std::uint32_t>& escapes) {
  const __m128i drop_v = _mm_cvtsi32_si128(Round ? drop : 0);
  const __m256i half_less_one = _mm256_set1_epi32(Round ? (1 << (drop - 1)) - 1 : 0);
  const __m256i keep_mask = _mm256_set1_epi32(Round ? ~((1 << drop) - 1) : -1);
  // Up to 15 mapped keys (the surviving buckets): a compare chain. More (ratio tables map the
  // buckets that did not survive too): two gathers, key -> symbol -> representative.
  int ns = 0;
  std::int32_t keys[15], syms[15];
  float reps[15];
  alignas(32) std::int32_t sym_of_key[key_count];
  for (int key = 0; key < key_count && !q.grid; ++key) {
    const int s = q.symbol_of_key[key];
    sym_of_key[key] = s;
    if (s == 0) continue;
    if (ns < 15) {
      keys[ns] = key;
      syms[ns] = s;
      reps[ns] = q.rep[s];
    }
    ++ns;
  }
  const bool gather = ns > 15;
  const __m256 rep_lo = _mm256_loadu_ps(q.rep.data()), rep_hi = _mm256_loadu_ps(q.rep.data() + 8);
  const bool sixteen = q.bits == 4;
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 half = _mm256_set1_ps(0.5f), two = _mm256_set1_ps(2.0f);
  const __m256 all_ones = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  const __m256 identity = K == delta_kind::ratio ? one : _mm256_set1_ps(-0.0f);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 c = _mm256_loadu_ps(cur + i), b = _mm256_loadu_ps(base + i);
    __m256 d;
    if constexpr (K == delta_kind::difference) {
      d = _mm256_sub_ps(c, b);
    } else {  // c / b - 1, and exactly 0 where c == b (also 0 / 0)
      d = _mm256_sub_ps(_mm256_div_ps(c, b), one);
      d = _mm256_andnot_ps(_mm256_cmp_ps(c, b, _CMP_EQ_OQ), d);
    }
    const __m256i di = _mm256_castps_si256(d);
    __m256i bad = _mm256_cmpeq_epi32(_mm256_and_si256(di, exp_mask), exp_mask);
    const __m256i key = _mm256_srli_epi32(di, 23);
    __m256i s = _mm256_setzero_si256();
    __m256 rv = identity;
    if (q.grid) {  // the midpoints ascending: the last one d reaches names the symbol
      s = _mm256_set1_epi32(q.grid_symbol[0]);
      rv = _mm256_set1_ps(q.rep[q.grid_symbol[0]]);
      for (int j = 0; j < q.grid; ++j) {
        const __m256 m = _mm256_cmp_ps(d, _mm256_set1_ps(q.midpoint[std::size_t(j)]), _CMP_GE_OQ);
        const unsigned sj = q.grid_symbol[std::size_t(j) + 1];
        s = _mm256_blendv_epi8(s, _mm256_set1_epi32(int(sj)), _mm256_castps_si256(m));
        rv = _mm256_blendv_ps(rv, _mm256_set1_ps(q.rep[sj]), m);
      }
    } else if (gather) {
      // key -> symbol by a gather; symbol -> representative by a register permute (two for
      // 16 symbols, as the decoder's), not a second gather. rep[0] is the identity.
      s = _mm256_i32gather_epi32(sym_of_key, key, 4);
      rv = _mm256_permutevar8x32_ps(rep_lo, s);
      if (sixteen)
        rv = _mm256_blendv_ps(rv, _mm256_permutevar8x32_ps(rep_hi, s),
                              _mm256_castsi256_ps(_mm256_slli_epi32(s, 28)));
    } else {
      for (int j = 0; j < ns; ++j) {
        const __m256i m = _mm256_cmpeq_epi32(key, _mm256_set1_epi32(keys[j]));
        s = _mm256_blendv_epi8(s, _mm256_set1_epi32(syms[j]), m);
        rv = _mm256_blendv_ps(rv, _mm256_set1_ps(reps[j]), _mm256_castsi256_ps(m));
      }
    }
    __m256 cand = K == delta_kind::difference ? _mm256_add_ps(b, rv) : _mm256_mul_ps(b, rv);
    __m256 stay = b;
    if constexpr (Round) {
      cand = round8(cand, drop_v, half_less_one, keep_mask);
      stay = round8(b, drop_v, half_less_one, keep_mask);
    }
    const __m256 err = _mm256_and_ps(_mm256_sub_ps(cand, c), abs_mask);
    const __m256 lim = _mm256_and_ps(_mm256_sub_ps(c, b), abs_mask);
    const __m256 keep = _mm256_cmp_ps(err, lim, _CMP_LT_OQ);
    __m256 res = _mm256_blendv_ps(stay, cand, keep);
    if constexpr (K == delta_kind::ratio) {  // within_factor_2, else an escape
      const __m256 ok = _mm256_and_ps(_mm256_cmp_ps(res, _mm256_mul_ps(c, half), _CMP_GE_OQ),
                                      _mm256_cmp_ps(res, _mm256_mul_ps(c, two), _CMP_LE_OQ));
      bad = _mm256_or_si256(bad, _mm256_castps_si256(_mm256_xor_ps(ok, all_ones)));
    }
    s = _mm256_and_si256(s, _mm256_castps_si256(keep));
    if (!_mm256_testz_si256(bad, bad)) {
      // Escapes, as encode_scalar makes them: the value itself (rounded as every element is),
      // the zero symbol, the index in ascending order. Redoing the eight elements in
      // encode_scalar cost more than the vector path itself with 3% of Adam's v escaped.
      const __m256 badf = _mm256_castsi256_ps(bad);
      __m256 exact = c;
      if constexpr (Round) exact = round8(c, drop_v, half_less_one, keep_mask);
      res = _mm256_blendv_ps(res, exact, badf);
      s = _mm256_andnot_si256(bad, s);
      for (unsigned m = unsigned(_mm256_movemask_ps(badf)); m; m &= m - 1)
        escapes.push_back(std::uint32_t(i + std::size_t(std::countr_zero(m))));
    }
    _mm256_storeu_ps(recon + i, res);
    const __m256i p16 = _mm256_packus_epi32(s, s);
    const __m256i p8 = _mm256_packus_epi16(p16, p16);
    const std::uint32_t lo = std::uint32_t(_mm_cvtsi128_si32(_mm256_castsi256_si128(p8)));
    const std::uint32_t hi = std::uint32_t(_mm_cvtsi128_si32(_mm256_extracti128_si256(p8, 1)));
    std::memcpy(symbols + i, &lo, 4);
    std::memcpy(symbols + i + 4, &hi, 4);
  }
}
#endif

// Round: every element rounded with `drop` bits gone, in the same pass (instantiated for the
// fp32 vector path only, so that every other decode compiles exactly as without rounding; those
// round in a second pass, lc_decode_symbols).
template <dtype T, delta_kind D, int K, bool Round = false>
void decode_groups(const std::byte* base_b, std::size_t n, const std::uint8_t* groups, int bits,
                   int k_runtime, const float* rep, int drop, std::byte* out_b) {
  using S = typename element<T>::storage;
  const S* base = reinterpret_cast<const S*>(base_b);
  S* out = reinterpret_cast<S*>(out_b);
  const int k = K ? K : k_runtime;
  const unsigned mask = (1u << bits) - 1;
#if defined(__AVX2__)
  constexpr bool vector = T == dtype::f32 && (K == 2 || K == 4 || K == 8);
#else
  constexpr bool vector = false;
#endif
  // One lookup per group gives its k representatives: a fixed output stride of k elements. The
  // vector kernel needs no table (its last few groups take their symbols apart one by one);
  // building it cost a 1 MiB block under 1% of its decode.
  alignas(32) float table[vector ? 1 : 256][8];
  if constexpr (!vector)
    for (unsigned g = 0; g < 256; ++g)
      for (int j = 0; j < 8; ++j) table[g][j] = j < k ? rep[(g >> (j * bits)) & mask] : 0.0f;
  const auto rep_of = [&](std::uint8_t group, int j) -> float {
    if constexpr (vector) return rep[(unsigned(group) >> (j * bits)) & mask];
    return table[group][j];
  };
  const std::size_t full = n / k;
  std::size_t g = 0;
#if defined(__AVX2__)
  // fp32 with 2, 4 or 8 symbols a group (b = 3, 4; b = 2; b = 1, Adam's v at ratio_bits=1):
  // eight elements per step. Their symbols are shifted out of the step's group bytes lane by
  // lane and pick their representatives by a register permute (two for 16 of them), which beat
  // loading rows of the table; the same IEEE add/mul as reconstruct.
  if constexpr (vector) {
    const __m128i drop_v = _mm_cvtsi32_si128(drop);
    const __m256i half_less_one = _mm256_set1_epi32(drop ? (1 << (drop - 1)) - 1 : 0);
    const __m256i keep_mask = _mm256_set1_epi32(drop ? ~((1 << drop) - 1) : -1);
    const float* b = reinterpret_cast<const float*>(base_b);
    float* o = reinterpret_cast<float*>(out_b);
    alignas(32) std::int32_t shift[8];
    for (int j = 0; j < 8; ++j) shift[j] = (j / K) * 8 + (j % K) * bits;
    const __m256i shifts = _mm256_load_si256(reinterpret_cast<const __m256i*>(shift));
    const __m256i symbol_mask = _mm256_set1_epi32(int(mask));
    const __m256 rep_lo = _mm256_loadu_ps(rep), rep_hi = _mm256_loadu_ps(rep + 8);
    const bool sixteen = bits == 4;
    for (; g + 8 / K <= full; g += 8 / K) {
      std::uint32_t word = 0;
      std::memcpy(&word, groups + g, 8 / K);
      const __m256i idx =
          _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(word)), shifts), symbol_mask);
      __m256 r = _mm256_permutevar8x32_ps(rep_lo, idx);
      if (sixteen)  // symbols 8..15 from the upper eight, chosen by the symbol's bit 3
        r = _mm256_blendv_ps(r, _mm256_permutevar8x32_ps(rep_hi, idx),
                             _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
      const __m256 x = _mm256_loadu_ps(b + g * K);
      __m256 v = D == delta_kind::difference ? _mm256_add_ps(x, r) : _mm256_mul_ps(x, r);
      if constexpr (Round) v = round8(v, drop_v, half_less_one, keep_mask);
      _mm256_storeu_ps(o + g * K, v);
    }
  }
#endif
  for (; g < full; ++g) {
    const std::uint8_t grp = groups[g];
    S* o = out + g * k;
    const S* bs = base + g * k;
    if constexpr (K != 0) {
      for (int j = 0; j < K; ++j)
        o[j] = rounded<T>(reconstruct<T, D>(bs[j], rep_of(grp, j)), Round ? drop : 0);
    } else {
      for (int j = 0; j < k; ++j)
        o[j] = rounded<T>(reconstruct<T, D>(bs[j], rep_of(grp, j)), Round ? drop : 0);
    }
  }
  for (std::size_t i = full * k; i < n; ++i)
    out[i] = rounded<T>(reconstruct<T, D>(base[i], rep_of(groups[full], int(i - full * k))),
                        Round ? drop : 0);
}

// K symbols a group with every element rounded by `drop` bits: in the kernel's registers for
// fp32 (returns true), else left to the caller's second pass (returns false).
template <dtype T, delta_kind D, int K>
bool decode_fused(const std::byte* base, std::size_t n, const std::uint8_t* groups, int bits, int k,
                  const float* rep, int drop, std::byte* out) {
  if constexpr (T == dtype::f32 && (K == 2 || K == 4 || K == 8)) {
    if (drop) {
      decode_groups<T, D, K, true>(base, n, groups, bits, k, rep, drop, out);
      return true;
    }
  }
  decode_groups<T, D, K>(base, n, groups, bits, k, rep, 0, out);
  return false;
}

// Returns whether the elements came out rounded (fp32 with 2, 4 or 8 symbols a group, the
// mount's coding); the caller rounds the others in a second pass.
template <dtype T, delta_kind D>
bool decode_k(const std::byte* base, std::size_t n, const std::uint8_t* groups, int bits, int k,
              const float* rep, int drop, std::byte* out) {
  switch (k) {
    case 1:
      return decode_fused<T, D, 1>(base, n, groups, bits, k, rep, drop, out);
    case 2:
      return decode_fused<T, D, 2>(base, n, groups, bits, k, rep, drop, out);
    case 4:
      return decode_fused<T, D, 4>(base, n, groups, bits, k, rep, drop, out);
    case 8:
      return decode_fused<T, D, 8>(base, n, groups, bits, k, rep, drop, out);
    default:
      return decode_fused<T, D, 0>(base, n, groups, bits, k, rep, drop, out);
  }
}

template <dtype T>
bool decode_dispatch(delta_kind kind, const std::byte* base, std::size_t n,
                     const std::uint8_t* groups, int bits, int k, const float* rep, int drop,
                     std::byte* out) {
  if (kind == delta_kind::ratio)
    return decode_k<T, delta_kind::ratio>(base, n, groups, bits, k, rep, drop, out);
  return decode_k<T, delta_kind::difference>(base, n, groups, bits, k, rep, drop, out);
}

template <dtype T>
void encode_any(const std::byte* cur, const std::byte* base, std::size_t first, std::size_t last,
                const quant_table& q, int drop, std::byte* recon, std::uint8_t* symbols,
                std::vector<std::uint32_t>& escapes) {
  if (q.kind == delta_kind::ratio)
    encode_scalar<T, delta_kind::ratio>(cur, base, first, last, q, drop, recon, symbols, escapes);
  else
    encode_scalar<T, delta_kind::difference>(cur, base, first, last, q, drop, recon, symbols,
                                             escapes);
}

}  // namespace

void lc_encode_symbols(dtype t, const std::byte* cur, const std::byte* base, std::size_t n,
                       const quant_table& q, int round_bits, std::byte* recon,
                       std::uint8_t* symbols, std::vector<std::uint32_t>& escapes) {
  if (!is_float(t)) throw invalid_argument("codec: lossy coding needs a float dtype");
  const int drop = dropped_bits(t, round_bits);
  switch (t) {
    case dtype::f32: {
#if defined(__AVX2__)
      const std::size_t vec = n / 8 * 8;
      auto* c = reinterpret_cast<const float*>(cur);
      auto* b = reinterpret_cast<const float*>(base);
      auto* r = reinterpret_cast<float*>(recon);
      const bool ratio = q.kind == delta_kind::ratio;
      if (ratio && drop)
        encode_f32_avx2<delta_kind::ratio, true>(c, b, vec, q, drop, r, symbols, escapes);
      else if (ratio)
        encode_f32_avx2<delta_kind::ratio, false>(c, b, vec, q, 0, r, symbols, escapes);
      else if (drop)
        encode_f32_avx2<delta_kind::difference, true>(c, b, vec, q, drop, r, symbols, escapes);
      else
        encode_f32_avx2<delta_kind::difference, false>(c, b, vec, q, 0, r, symbols, escapes);
      encode_any<dtype::f32>(cur, base, vec, n, q, drop, recon, symbols, escapes);
#else
      encode_any<dtype::f32>(cur, base, 0, n, q, drop, recon, symbols, escapes);
#endif
      return;
    }
    case dtype::f16:
      return encode_any<dtype::f16>(cur, base, 0, n, q, drop, recon, symbols, escapes);
    case dtype::bf16:
      return encode_any<dtype::bf16>(cur, base, 0, n, q, drop, recon, symbols, escapes);
    case dtype::bytes:
      break;
  }
  throw invalid_argument("codec: lossy coding needs a float dtype");
}

void pack_groups(const std::uint8_t* symbols, std::size_t n, int bits, int k,
                 std::uint8_t* groups) {
  const std::size_t full = n / k;
  std::size_t g = 0;
#if defined(__AVX2__)
  // The default groups (k = 2, 4, 8 with k * bits <= 8), 32 symbols a step: a multiply-add of
  // byte pairs by (1, 2^bits) puts s0 + s1 << bits in a 16-bit lane, a second one of 16-bit pairs
  // by (1, 2^(2 bits)) four symbols in a 32-bit lane; one bit a symbol is a byte mask. Every sum
  // is below 256 (symbols < 2^bits), so the saturating packs do not clip. Same bits as the loop.
  const __m256i pair_mul = _mm256_set1_epi16(std::int16_t(1 | (1 << (8 + bits))));
  const __m256i quad_mul = _mm256_set1_epi32(1 | (1 << (16 + 2 * bits)));
  if (k == 2 || (k == 4 && bits <= 2) || (k == 8 && bits == 1)) {
    for (; (g + 32 / k) <= full; g += 32 / std::size_t(k)) {
      const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(symbols + g * k));
      if (k == 8) {
        const std::uint32_t m = std::uint32_t(_mm256_movemask_epi8(_mm256_slli_epi16(s, 7)));
        std::memcpy(groups + g, &m, 4);
        continue;
      }
      __m256i v = _mm256_maddubs_epi16(s, pair_mul);
      if (k == 4) {
        v = _mm256_madd_epi16(v, quad_mul);
        v = _mm256_packus_epi32(v, v);
      }
      v = _mm256_packus_epi16(v, v);
      // Each 128-bit lane now starts with its own groups: 8 bytes (k = 2) or 4 (k = 4).
      const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
      if (k == 2) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(groups + g), _mm_unpacklo_epi64(lo, hi));
      } else {
        const std::uint64_t both = std::uint32_t(_mm_cvtsi128_si32(lo)) |
                                   std::uint64_t(std::uint32_t(_mm_cvtsi128_si32(hi))) << 32;
        std::memcpy(groups + g, &both, 8);
      }
    }
  }
#endif
  // Byte j of an 8-byte load holds symbol j; shifting it right by j*(8-bits) lands it at bit
  // j*bits of the low byte, and no other byte reaches the low byte while k*bits <= 8.
  const unsigned step = 8 - bits;
  for (; g < full; ++g) {
    std::uint64_t x;
    std::memcpy(&x, symbols + g * k, 8);
    std::uint64_t v = 0;
    for (int j = 0; j < k; ++j) v |= x >> (j * step);
    groups[g] = std::uint8_t(v);
  }
  if (full * k < n) {
    unsigned v = 0;
    for (std::size_t i = full * k; i < n; ++i) v |= unsigned(symbols[i]) << ((i - full * k) * bits);
    groups[full] = std::uint8_t(v);
  }
}

void lc_decode_symbols(dtype t, delta_kind kind, const std::byte* base, std::size_t n,
                       const std::uint8_t* groups, int bits, int k, const float* rep,
                       int round_bits, std::byte* out) {
  if (!is_float(t)) throw invalid_argument("codec: lossy coding needs a float dtype");
  const int drop = dropped_bits(t, round_bits);
  bool done = false;
  switch (t) {
    case dtype::f32:
      done = decode_dispatch<dtype::f32>(kind, base, n, groups, bits, k, rep, drop, out);
      break;
    case dtype::f16:
      done = decode_dispatch<dtype::f16>(kind, base, n, groups, bits, k, rep, drop, out);
      break;
    case dtype::bf16:
      done = decode_dispatch<dtype::bf16>(kind, base, n, groups, bits, k, rep, drop, out);
      break;
    case dtype::bytes:
      throw invalid_argument("codec: lossy coding needs a float dtype");
  }
  if (round_bits && !done) {
    const std::span<std::byte> all(out, n * element_size(t));
    round_mantissa(t, all, all, round_bits);
  }
}

}  // namespace ckpt::codec
