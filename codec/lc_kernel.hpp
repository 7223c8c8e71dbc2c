#pragma once
// The per-element LC kernels: choosing symbols while writing the reconstruction (encoder), and
// rebuilding the reconstruction from symbols (decoder). Both reconstruct through reconstruct.hpp.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "codec/dtype.hpp"
#include "codec/quantizer.hpp"

namespace ckpt::codec {

// For each element: delta d = delta_of<q.kind>(cur, base) in fp32; candidate symbol from the
// table; the symbol is kept iff fl32|ũ - u| < fl32|u - base| (strict: IEEE rounding is monotone,
// so this implies the exact inequality, and it also drops symbols that would not move the
// element). Writes one symbol
// per byte to `symbols` and the reconstruction to `recon`. Elements with a non-finite delta get
// symbol 0 and their exact value, and their indices are appended to `escapes` (ascending).
// round_bits > 0 (below the dtype's mantissa bits): the candidate, the element left at its base
// and an escaped element are each rounded to that many mantissa bits (round_word), and the
// candidate is judged rounded; the decoder rounds what it reconstructs the same way.
void lc_encode_symbols(dtype t, const std::byte* cur, const std::byte* base, std::size_t n,
                       const quant_table& q, int round_bits, std::byte* recon,
                       std::uint8_t* symbols, std::vector<std::uint32_t>& escapes);

// Packs k symbols of `bits` bits per byte (symbol j of a group at bit j*bits); the last group is
// padded with symbol 0. `symbols` must have 8 readable bytes past n.
void pack_groups(const std::uint8_t* symbols, std::size_t n, int bits, int k, std::uint8_t* groups);

// out[i] = reconstruct<t, kind>(base[i], rep[symbol i]) with symbols unpacked from groups, each
// rounded to round_bits mantissa bits (round_word) when round_bits > 0. `rep` holds
// 1 << max_bits floats whatever `bits` is (the vector kernel loads them all).
void lc_decode_symbols(dtype t, delta_kind kind, const std::byte* base, std::size_t n,
                       const std::uint8_t* groups, int bits, int k, const float* rep,
                       int round_bits, std::byte* out);

}  // namespace ckpt::codec
