#include "codec/huffman.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>

#include "codec/byte_io.hpp"
#include "codec/error.hpp"
#include "codec/scratch.hpp"

namespace ckpt::codec::huffman {
namespace {

constexpr int kStreams = 4;
constexpr int kTableBits = max_code_length;
constexpr std::size_t kSlack = 16;  // encoders store 8 bytes at a time; decoders load 8

inline void store64(std::uint8_t* p, std::uint64_t v) {
  std::memcpy(p, &v, 8);
}
inline std::uint64_t load64(const std::uint8_t* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Plain Huffman lengths by the two-queue method over (count, symbol)-sorted leaves; ties are
// broken by symbol so the result is deterministic.
std::array<std::uint8_t, 256> unlimited_lengths(const std::array<std::uint64_t, 256>& counts) {
  struct node {
    std::uint64_t weight;
    int parent;
  };
  std::vector<int> leaves;
  for (int s = 0; s < 256; ++s)
    if (counts[s]) leaves.push_back(s);
  std::stable_sort(leaves.begin(), leaves.end(),
                   [&](int a, int b) { return counts[a] < counts[b]; });
  const int n = int(leaves.size());
  std::vector<node> nodes(2 * n - 1);
  for (int i = 0; i < n; ++i) nodes[i] = {counts[leaves[i]], -1};
  int leaf = 0, inner = n, next = n;
  auto pick = [&]() {
    if (leaf < n && (inner >= next || nodes[leaf].weight <= nodes[inner].weight)) return leaf++;
    return inner++;
  };
  while (next < 2 * n - 1) {
    const int a = pick(), b = pick();
    nodes[next] = {nodes[a].weight + nodes[b].weight, -1};
    nodes[a].parent = nodes[b].parent = next;
    ++next;
  }
  std::vector<int> depth(2 * n - 1, 0);
  for (int i = 2 * n - 3; i >= 0; --i) depth[i] = depth[nodes[i].parent] + 1;
  std::array<std::uint8_t, 256> len{};
  for (int i = 0; i < n; ++i) len[leaves[i]] = std::uint8_t(std::min(depth[i], 255));
  return len;
}

struct canonical {
  std::array<std::uint16_t, 256> code{};  // bit-reversed, ready for an LSB-first stream
  std::array<std::uint8_t, 256> len{};
};

// Canonical codes from lengths. Returns false unless the lengths form a complete prefix code
// (Kraft sum exactly 1) within the length limit: anything else is a corrupt table.
bool assign_codes(const std::array<std::uint8_t, 256>& len, canonical& c) {
  std::array<int, kTableBits + 1> per_len{};
  int used = 0;
  for (int s = 0; s < 256; ++s) {
    if (len[s] > kTableBits) return false;
    if (len[s]) ++per_len[len[s]], ++used;
  }
  if (used < 2) return false;
  std::uint32_t kraft = 0;
  for (int l = 1; l <= kTableBits; ++l) kraft += std::uint32_t(per_len[l]) << (kTableBits - l);
  if (kraft != (1u << kTableBits)) return false;
  std::array<std::uint32_t, kTableBits + 2> next{};
  std::uint32_t code = 0;
  for (int l = 1; l <= kTableBits; ++l) {
    code = (code + per_len[l - 1]) << 1;
    next[l] = code;
  }
  for (int s = 0; s < 256; ++s) {
    const int l = len[s];
    if (!l) continue;
    const std::uint32_t v = next[l]++;
    std::uint32_t r = 0;
    for (int b = 0; b < l; ++b) r |= ((v >> b) & 1u) << (l - 1 - b);
    c.code[s] = std::uint16_t(r);
    c.len[s] = std::uint8_t(l);
  }
  return true;
}

std::size_t stream_count(std::size_t n, int s) {
  return (n + kStreams - 1 - s) / kStreams;
}

// Decoding tables of one code, kept per thread for the last code decoded and reused when the
// next stream has the same code lengths (a quarter of the streams in `ckptctl bench codec
// --data`; fewer in a cold load, where a thread alternates keyframe and delta blocks). Building
// them takes about 6 us, against about 100 us to decode a block's 256K-symbol exponent plane.
// (A 12-bit table yielding up to four symbols a lookup decoded 15% faster but took 23 us to
// build: no gain on blocks.)
constexpr std::uint32_t kTableMask = (1u << kTableBits) - 1;
constexpr unsigned kMultiSymbols = 3;
struct decode_tables {
  std::array<std::uint8_t, 256> len{};
  bool valid = false;
  // Entry: symbol in the low byte, code length above it.
  std::array<std::uint16_t, 1u << kTableBits> single;
  // One lookup of 11 bits yields every whole code in them, up to three; exponent planes of
  // floats average under 3 bits a code, so most lookups yield three. Entry: symbols in bytes
  // 0-2, their count in bits 24-25, their total length in bits 26-31.
  std::array<std::uint32_t, 1u << kTableBits> multi;
};

const decode_tables& tables_for(const std::array<std::uint8_t, 256>& len) {
  thread_local std::unique_ptr<decode_tables> t = std::make_unique<decode_tables>();
  if (t->valid && t->len == len) return *t;
  t->valid = false;
  canonical c;
  if (!assign_codes(len, c)) throw corrupt_error("huffman: invalid code lengths");
  auto& table = t->single;
  for (int s = 0; s < 256; ++s) {
    if (!c.len[s]) continue;
    const unsigned step = 1u << c.len[s];
    for (unsigned j = c.code[s]; j < (1u << kTableBits); j += step)
      table[j] = std::uint16_t(s | (c.len[s] << 8));
  }
  for (unsigned j = 0; j < (1u << kTableBits); ++j) {
    std::uint32_t syms = 0;
    unsigned count = 0, used = 0, rest = j;
    while (count < kMultiSymbols) {
      const std::uint16_t e = table[rest & kTableMask];
      const unsigned l = e >> 8;
      if (used + l > unsigned(kTableBits)) break;
      syms |= std::uint32_t(e & 0xff) << (8 * count);
      ++count;
      used += l;
      rest >>= l;
    }
    t->multi[j] = syms | count << 24 | used << 26;
  }
  t->len = len;
  t->valid = true;
  return *t;
}

}  // namespace

std::array<std::uint8_t, 256> code_lengths(const byte_histogram& counts) {
  std::array<std::uint64_t, 256> c{};
  for (int s = 0; s < 256; ++s) c[s] = counts[s];
  // Flattening the counts until the tree fits the limit costs a fraction of a percent against
  // optimal length-limited codes (package-merge) on our skewed alphabets, and is far simpler.
  for (;;) {
    auto len = unlimited_lengths(c);
    if (*std::max_element(len.begin(), len.end()) <= kTableBits) return len;
    for (auto& v : c)
      if (v) v = (v >> 1) | 1;
  }
}

std::uint64_t cost_bits(const byte_histogram& counts,
                        const std::array<std::uint8_t, 256>& lengths) {
  std::uint64_t bits = 0;
  for (int s = 0; s < 256; ++s) bits += std::uint64_t(counts[s]) * lengths[s];
  return bits;
}

void encode(std::span<const std::uint8_t> symbols, const std::array<std::uint8_t, 256>& lengths,
            std::vector<std::byte>& out) {
  canonical c;
  if (!assign_codes(lengths, c)) throw invalid_argument("huffman: invalid code lengths");
  int alphabet = 256;
  while (alphabet > 1 && lengths[alphabet - 1] == 0) --alphabet;
  byte_writer w(out);
  w.put<std::uint8_t>(std::uint8_t(alphabet - 1));
  for (int s = 0; s < alphabet; s += 2)
    w.put<std::uint8_t>(std::uint8_t(lengths[s] | ((s + 1 < 256 ? lengths[s + 1] : 0) << 4)));
  const std::size_t sizes_at = w.skip(4 * (kStreams - 1));

  const std::size_t n = symbols.size();
  // The four streams are written in one loop (independent dependency chains run in parallel)
  // into scratch regions that are never zero-filled, sized for the worst case of 11 bits a
  // symbol, then appended at their real sizes.
  thread_local scratch_buffer scratch;
  const std::size_t region = (stream_count(n, 0) * kTableBits + 7) / 8 + kSlack;
  std::uint8_t* const regions = scratch.get(region * kStreams);
  std::array<std::uint8_t*, kStreams> p;
  std::array<std::uint64_t, kStreams> acc{};
  std::array<unsigned, kStreams> nb{};
  for (int s = 0; s < kStreams; ++s) p[s] = regions + s * region;
  auto flush = [&](int s) {
    store64(p[s], acc[s]);
    p[s] += nb[s] >> 3;
    acc[s] >>= nb[s] & 56;
    nb[s] &= 7;
  };
  auto add = [&](int s, std::uint8_t sym) {
    acc[s] |= std::uint64_t(c.code[sym]) << nb[s];
    nb[s] += c.len[sym];
  };
  // Four codes of at most 11 bits fit beside the <= 7 pending bits: one store per four symbols.
  std::size_t i = 0;
  for (; i + 4 * kStreams <= n; i += 4 * kStreams) {
    for (int s = 0; s < kStreams; ++s) {
      add(s, symbols[i + s]);
      add(s, symbols[i + kStreams + s]);
      add(s, symbols[i + 2 * kStreams + s]);
      add(s, symbols[i + 3 * kStreams + s]);
      flush(s);
    }
  }
  for (; i < n; ++i) {
    add(int(i % kStreams), symbols[i]);
    flush(int(i % kStreams));
  }
  for (int s = 0; s < kStreams; ++s) {
    store64(p[s], acc[s]);
    p[s] += (nb[s] + 7) >> 3;
    std::uint8_t* const begin = regions + s * region;
    const std::size_t written = std::size_t(p[s] - begin);
    w.put_bytes(std::as_bytes(std::span(begin, written)));
    if (s < kStreams - 1) w.put_at<std::uint32_t>(sizes_at + 4 * s, std::uint32_t(written));
  }
}

void decode(std::span<const std::byte> in, std::span<std::uint8_t> out) {
  byte_reader r(in);
  const int alphabet = r.get<std::uint8_t>() + 1;
  std::array<std::uint8_t, 256> len{};
  auto packed = r.get_bytes((alphabet + 1) / 2);
  for (int s = 0; s < alphabet; ++s)
    len[s] = (std::to_integer<std::uint8_t>(packed[s / 2]) >> (4 * (s & 1))) & 15;
  const decode_tables& t = tables_for(len);
  const auto& table = t.single;
  const auto& multi = t.multi;

  std::array<std::uint32_t, kStreams> size{};
  for (int s = 0; s < kStreams - 1; ++s) size[s] = r.get<std::uint32_t>();
  const std::uint64_t head = std::uint64_t(size[0]) + size[1] + size[2];
  if (head > r.remaining()) throw corrupt_error("huffman: stream sizes exceed payload");
  size[3] = std::uint32_t(r.remaining() - head);

  // Each stream is copied behind zero padding so that 8-byte loads never leave the buffer; the
  // copy is of compressed bytes, a small fraction of the output.
  thread_local scratch_vector<std::uint8_t> scratch;
  std::size_t total = 0;
  for (auto sz : size) total += sz + kSlack;
  if (scratch.size() < total) scratch.resize(total);
  std::array<const std::uint8_t*, kStreams> ptr, end;
  {
    std::size_t at = 0;
    for (int s = 0; s < kStreams; ++s) {
      auto bytes = r.get_bytes(size[s]);
      std::memcpy(scratch.data() + at, bytes.data(), bytes.size());
      std::memset(scratch.data() + at + size[s], 0, kSlack);
      ptr[s] = scratch.data() + at;
      end[s] = ptr[s] + size[s];
      at += size[s] + kSlack;
    }
  }
  std::array<std::uint64_t, kStreams> bb{};
  std::array<unsigned, kStreams> bc{};
  const std::size_t n = out.size();
  auto refill = [&](int s) {
    // A valid stream never has its read pointer more than 8 bytes past its end.
    if (ptr[s] > end[s] + 8) throw corrupt_error("huffman: stream overrun");
    bb[s] |= load64(ptr[s]) << bc[s];
    ptr[s] += (63 - bc[s]) >> 3;
    bc[s] |= 56;
  };
  // Stream s holds the symbols at s, s + 4, s + 8, ...: op[s] is where its next one goes.
  std::uint8_t* const o = out.data();
  std::array<std::uint8_t*, kStreams> op{};
  for (int s = 0; s < kStreams; ++s) op[s] = o + s;
  // 56 valid bits cover five lookups of at most 11 bits: refill once per five lookups a stream.
  // A lookup writes three symbols whatever it decoded (the extra ones are overwritten by later
  // lookups), so the loop runs while every stream has room for fifteen: its next index plus
  // 14 steps of 4 is still below n. Only op is live across lookups (no per-stream counts):
  // with 4 streams of bit buffer, bit count and position, more would spill registers.
  constexpr std::size_t kLookups = 5, kMost = 3 * kLookups;
  if (n > kStreams * (kMost - 1)) {
    const std::uint8_t* const limit = o + (n - kStreams * (kMost - 1));
    while (std::max({op[0], op[1], op[2], op[3]}) < limit) {
      for (int s = 0; s < kStreams; ++s) refill(s);
      for (std::size_t t = 0; t < kLookups; ++t) {
        for (int s = 0; s < kStreams; ++s) {
          const std::uint32_t e = multi[bb[s] & kTableMask];
          std::uint8_t* const d = op[s];
          d[0] = std::uint8_t(e);
          d[kStreams] = std::uint8_t(e >> 8);
          d[2 * kStreams] = std::uint8_t(e >> 16);
          const unsigned len = e >> 26;
          bb[s] >>= len;
          bc[s] -= len;
          op[s] += kStreams * ((e >> 24) & 3);
        }
      }
    }
  }
  std::array<std::size_t, kStreams> pos{};
  for (int s = 0; s < kStreams; ++s) pos[s] = std::size_t(op[s] - o);
  std::array<std::size_t, kStreams> left{};
  for (int s = 0; s < kStreams; ++s)
    left[s] = pos[s] < n ? (n - pos[s] + kStreams - 1) / kStreams : 0;
  for (int s = 0; s < kStreams; ++s) {
    for (; left[s]; --left[s], pos[s] += kStreams) {
      if (bc[s] < unsigned(kTableBits)) refill(s);
      const std::uint16_t e = table[bb[s] & kTableMask];
      const unsigned l = e >> 8;
      bb[s] >>= l;
      bc[s] -= l;
      o[pos[s]] = std::uint8_t(e);
    }
  }
  // Bits consumed must lie within each stream (the unconsumed remainder of bc is lookahead).
  for (int s = 0; s < kStreams; ++s) {
    const std::uint64_t loaded_bits = std::uint64_t(ptr[s] - (end[s] - size[s])) * 8;
    if (loaded_bits - bc[s] > std::uint64_t(size[s]) * 8)
      throw corrupt_error("huffman: stream " + std::to_string(s) + " shorter than its symbols");
  }
}

}  // namespace ckpt::codec::huffman
