// The byte entropy coders: Huffman (4 streams, length-limited), rANS, and the per-stream choice.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <span>

#include <sys/mman.h>
#include <unistd.h>

#include "codec/entropy.hpp"
#include "codec/error.hpp"
#include "codec/huffman.hpp"
#include "codec/rans.hpp"

using namespace ckpt::codec;

namespace {

std::vector<std::uint8_t> skewed(std::size_t n, double p0, int alphabet, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution zero(p0);
  std::uniform_int_distribution<int> other(1, alphabet - 1);
  std::vector<std::uint8_t> v(n);
  for (auto& x : v) x = zero(rng) ? 0 : std::uint8_t(other(rng));
  return v;
}

std::vector<std::uint8_t> round_trip(const std::vector<std::uint8_t>& in, entropy_policy p,
                                     entropy_mode* used = nullptr, std::size_t* size = nullptr) {
  std::vector<std::byte> enc;
  const auto m = encode_bytes(in, p, enc);
  if (used) *used = m;
  if (size) *size = enc.size();
  std::vector<std::uint8_t> out(in.size());
  decode_bytes(enc, out);
  return out;
}

// A copy of `bytes` that ends where an inaccessible page begins, so that a read past its end
// faults (the test binary runs without a sanitizer in CI).
class guarded_bytes {
 public:
  explicit guarded_bytes(std::span<const std::byte> bytes) : size_(bytes.size()) {
    const std::size_t page = std::size_t(sysconf(_SC_PAGESIZE));
    const std::size_t pages = (size_ + page - 1) / page;
    mapped_ = (pages + 1) * page;
    void* m = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(m != MAP_FAILED);
    base_ = static_cast<std::byte*>(m);
    REQUIRE(mprotect(base_ + pages * page, page, PROT_NONE) == 0);
    data_ = base_ + pages * page - size_;
    if (size_) std::memcpy(data_, bytes.data(), size_);
  }
  guarded_bytes(const guarded_bytes&) = delete;
  guarded_bytes& operator=(const guarded_bytes&) = delete;
  ~guarded_bytes() { munmap(base_, mapped_); }
  std::span<const std::byte> span() const { return {data_, size_}; }

 private:
  std::size_t size_, mapped_ = 0;
  std::byte* base_ = nullptr;
  std::byte* data_ = nullptr;
};

}  // namespace

TEST_CASE("entropy round trips over sizes, skews and alphabets", "[entropy]") {
  // 55-80: around where huffman::decode's multi-symbol loop starts and hands over to the tail.
  for (std::size_t n : {0,  1,  2,  3,  4,  5,  19, 20, 21, 55, 56,  57,   58,    59,    60,
                        61, 62, 63, 64, 65, 66, 67, 76, 77, 80, 255, 4096, 65537, 300000}) {
    for (double p0 : {0.0, 0.5, 0.9, 0.99, 0.9999}) {
      for (int alphabet : {2, 8, 64, 256}) {
        const auto in = skewed(n, p0, alphabet, n * 31 + alphabet);
        for (auto pol : {entropy_policy::best, entropy_policy::huffman_only}) {
          INFO("n=" << n << " p0=" << p0 << " alphabet=" << alphabet << " policy=" << int(pol));
          REQUIRE(round_trip(in, pol) == in);
        }
      }
    }
  }
}

TEST_CASE("huffman and rans each round-trip when forced", "[entropy]") {
  // Skewed enough that most lookups of the Huffman decoder yield three symbols.
  const auto in = skewed(100003, 0.95, 16, 5);
  const auto h = histogram(in);
  std::vector<std::byte> a, b;
  huffman::encode(in, huffman::code_lengths(h), a);
  rans::encode(in, rans::normalize(h), b);
  std::vector<std::uint8_t> out(in.size());
  huffman::decode(a, out);
  REQUIRE(out == in);
  std::fill(out.begin(), out.end(), 0);
  rans::decode(b, out);
  REQUIRE(out == in);
}

TEST_CASE("huffman code lengths respect the limit for Fibonacci counts", "[entropy]") {
  byte_histogram h{};
  std::uint32_t a = 1, b = 1;
  for (int s = 0; s < 40; ++s) {
    h[s] = a;
    const auto c = a + b;
    a = b;
    b = std::min<std::uint32_t>(c, 1u << 30);
  }
  const auto len = huffman::code_lengths(h);
  for (int s = 0; s < 40; ++s) {
    REQUIRE(len[s] >= 1);
    REQUIRE(len[s] <= huffman::max_code_length);
  }
  std::vector<std::uint8_t> in;
  for (int s = 0; s < 40; ++s) in.insert(in.end(), std::min<std::uint32_t>(h[s], 5000), s);
  std::vector<std::byte> enc;
  huffman::encode(in, len, enc);
  std::vector<std::uint8_t> out(in.size());
  huffman::decode(enc, out);
  REQUIRE(out == in);
}

TEST_CASE("mode choice: constant for one symbol, rans under extreme skew", "[entropy]") {
  entropy_mode m;
  std::size_t size;
  const std::vector<std::uint8_t> zeros(100000, 0);
  REQUIRE(round_trip(zeros, entropy_policy::best, &m, &size) == zeros);
  REQUIRE(m == entropy_mode::constant);
  REQUIRE(size == 2);

  const auto sparse = skewed(1 << 18, 0.999, 256, 3);
  REQUIRE(round_trip(sparse, entropy_policy::best, &m, &size) == sparse);
  REQUIRE(m == entropy_mode::rans);
  REQUIRE(size * 8 < sparse.size() / 10);  // far below Huffman's 1 bit per symbol

  std::mt19937 rng(1);
  std::vector<std::uint8_t> noise(100000);
  for (auto& x : noise) x = std::uint8_t(rng());
  REQUIRE(round_trip(noise, entropy_policy::best, &m, &size) == noise);
  REQUIRE(m == entropy_mode::stored);
}

TEST_CASE("the paper policy never goes below one bit per symbol", "[entropy]") {
  for (double p0 : {0.9, 0.999, 1.0}) {
    const auto in = skewed(1 << 16, p0, 4, 11);
    entropy_mode m;
    std::size_t size;
    REQUIRE(round_trip(in, entropy_policy::huffman_only, &m, &size) == in);
    REQUIRE(m == entropy_mode::huffman);
    REQUIRE(size * 8 >= in.size());
  }
}

TEST_CASE("truncated or damaged entropy streams are refused without crashing", "[entropy]") {
  const auto in = skewed(20000, 0.97, 256, 8);
  for (auto pol : {entropy_policy::best, entropy_policy::huffman_only}) {
    std::vector<std::byte> enc;
    encode_bytes(in, pol, enc);
    std::vector<std::uint8_t> out(in.size());
    for (std::size_t cut = 0; cut < enc.size(); cut += 1 + cut / 8) {
      auto part = std::span<const std::byte>(enc).first(cut);
      try {
        decode_bytes(part, out);
        // A truncation may only "succeed" if it cut nothing the decoder needed; never silently.
        FAIL("truncated stream at " << cut << " of " << enc.size() << " decoded");
      } catch (const ckpt::corrupt_error&) {
      }
    }
    // Random damage must either throw corrupt_error or decode to something (the block checksum
    // catches that case); it must never crash or read out of bounds.
    std::mt19937 rng(4);
    for (int i = 0; i < 300; ++i) {
      auto bad = enc;
      bad[rng() % bad.size()] ^= std::byte(1u << (rng() % 8));
      try {
        decode_bytes(bad, out);
      } catch (const ckpt::corrupt_error&) {
      }
    }
  }
}

TEST_CASE("rans: a stream cut short or damaged is refused, never read past", "[entropy]") {
  // The decoder's fast loops read up to two bytes a step without bounds checks while eight
  // remain: every cut of the stream (its length field rewritten, so that the payload parses)
  // must end in corrupt_error, from the checked tail, not in a read past the stream (each ends
  // at an inaccessible page: such a read faults). Rare symbols (frequency 1) make steps that
  // take two bytes at once. Under 3/4 bit a symbol the decoder takes its branching loop (the
  // first two), above it the selecting one (the last two; 0.9 over 256 symbols has frequencies
  // near 13, so two-byte steps are common).
  for (auto [p0, alphabet] :
       {std::pair{0.97, 256}, std::pair{0.9999, 256}, std::pair{0.5, 4}, std::pair{0.9, 256}}) {
    const auto in = skewed(30000, p0, alphabet, 12);
    std::vector<std::byte> enc;
    rans::encode(in, rans::normalize(histogram(in)), enc);
    const std::size_t table = 1 + 3 * (std::size_t(std::to_integer<int>(enc[0])) + 1);
    std::uint32_t len;
    std::memcpy(&len, enc.data() + table, 4);
    REQUIRE(table + 4 + len == enc.size());
    std::vector<std::uint8_t> out(in.size());
    rans::decode(enc, out);
    REQUIRE(out == in);
    for (std::uint32_t cut = 0; cut < len; cut += 1 + cut / 16) {
      INFO("p0 " << p0 << " cut " << cut << " of " << len);
      // The shortened stream in a buffer of its own size, as a block's payload would hold it.
      std::vector<std::byte> part(enc.begin(), enc.begin() + std::ptrdiff_t(table + 4 + cut));
      std::memcpy(part.data() + table, &cut, 4);
      const guarded_bytes guarded(part);
      REQUIRE_THROWS_AS(rans::decode(guarded.span(), out), ckpt::corrupt_error);
    }
    std::mt19937 rng(9);
    for (int i = 0; i < 200; ++i) {
      auto bad = enc;
      const std::size_t at = table + 4 + rng() % len;
      bad[at] ^= std::byte(1u << (rng() % 8));
      // A flip in the stream either throws or decodes to other symbols (the block checksum
      // catches those); a flip in the first state's bytes may leave it below its range.
      const guarded_bytes guarded(bad);
      try {
        rans::decode(guarded.span(), out);
      } catch (const ckpt::corrupt_error&) {
      }
    }
  }
}

TEST_CASE("mode choice: a stream that saves under 1/32 is stored, 1/16 is coded", "[entropy]") {
  // 128 symbols equally likely: 7 bits each, 12.5% saved -> coded. 240 of 256 equally likely:
  // log2(240) = 7.91 bits, 1.2% saved -> stored (a float's low mantissa planes look like this).
  std::mt19937 rng(7);
  entropy_mode m;
  std::size_t size;
  std::vector<std::uint8_t> half(200000), most(200000);
  for (auto& x : half) x = std::uint8_t(rng() % 128);
  for (auto& x : most) x = std::uint8_t(rng() % 240);
  REQUIRE(round_trip(half, entropy_policy::best, &m, &size) == half);
  REQUIRE(m != entropy_mode::stored);
  REQUIRE(size < half.size() * 15 / 16);
  REQUIRE(round_trip(most, entropy_policy::best, &m, &size) == most);
  REQUIRE(m == entropy_mode::stored);
  // The paper's policy has no stored mode: it still codes.
  REQUIRE(round_trip(most, entropy_policy::huffman_only, &m, &size) == most);
  REQUIRE(m == entropy_mode::huffman);
}
