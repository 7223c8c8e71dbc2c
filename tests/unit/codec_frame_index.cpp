// The block index of a frame: a run of whole blocks, cut out with the index, decodes to exactly
// the same bytes as the matching slice of the whole frame (what a reader decoding only the blocks
// it needs relies on); frames whose blocks do not tile evenly are refused.
#include <catch2/catch.hpp>

#include "codec/error.hpp"
#include "codec/tensor_codec.hpp"
#include "codec_test_util.hpp"

using namespace ckpt::codec;
using namespace ckpt::test;

namespace {

constexpr std::size_t kBlockBytes = 16384;

// Decodes blocks [b0, b1) alone and compares with the whole frame's decode.
void check_runs(const std::vector<std::byte>& frame, const frame_index& fi, dtype t,
                std::span<const std::byte> base, const std::vector<std::byte>& whole) {
  const std::size_t es = element_size(t), n = whole.size() / es;
  const std::size_t nb = fi.offsets.size();
  for (std::size_t b0 = 0; b0 < nb; ++b0) {
    for (std::size_t b1 = b0 + 1; b1 <= nb; b1 += 2) {
      const std::size_t e0 = b0 * fi.block_elements;
      const std::size_t e1 = std::min(n, b1 * fi.block_elements);
      const std::size_t at = fi.offsets[b0], end = b1 < nb ? fi.offsets[b1] : frame.size();
      std::vector<std::byte> out((e1 - e0) * es);
      // decode_here (the calling thread alone) on every other run: the same bytes.
      const auto run = std::span(frame).subspan(at, end - at);
      const auto run_base = base.empty() ? base : base.subspan(e0 * es, (e1 - e0) * es);
      if (b0 % 2)
        decode_here(run, run_base, out);
      else
        decode(run, run_base, out);
      INFO("blocks " << b0 << ".." << b1);
      REQUIRE(std::equal(out.begin(), out.end(), whole.begin() + std::ptrdiff_t(e0 * es)));
    }
  }
}

}  // namespace

TEST_CASE("frame index: runs of blocks decode like slices of the whole frame", "[frame_index]") {
  for (dtype t : {dtype::f32, dtype::bf16}) {
    for (std::size_t n : {std::size_t(1), std::size_t(4096), std::size_t(70001)}) {
      INFO("dtype=" << name(t) << " n=" << n);
      const auto p = random_pair(t, n, n + 3);
      const std::size_t per = kBlockBytes / element_size(t);

      const auto exact = encode_exact(t, p.cur, kBlockBytes);
      const auto fe = index_frame(exact);
      REQUIRE(fe.block_elements == std::min(per, n));
      REQUIRE(fe.offsets.size() == (n + per - 1) / per);
      REQUIRE(fe.offsets.front() == 0);
      auto whole = tensor(t, n);
      decode(exact, {}, whole);
      check_runs(exact, fe, t, {}, whole);

      const delta_input in{t, p.cur, p.base};
      const auto q =
          plan_tables(std::span(&in, 1), 3, representative::mean, bucket_scope::tensor)[0];
      auto recon = tensor(t, n);
      const auto delta = encode_delta(in, q, lossy_params{}, recon, kBlockBytes);
      const auto fd = index_frame(delta);
      REQUIRE(fd.offsets.size() == fe.offsets.size());
      REQUIRE(fd.block_elements == fe.block_elements);
      check_runs(delta, fd, t, p.base, recon);
    }
  }
}

TEST_CASE("frame index: an empty frame has no blocks", "[frame_index]") {
  const auto fi = index_frame({});
  REQUIRE(fi.offsets.empty());
}

TEST_CASE("frame index: uneven or damaged frames are refused", "[frame_index]") {
  const auto a = random_pair(dtype::f32, 1000, 1), b = random_pair(dtype::f32, 5000, 2);
  const auto small = encode_exact(dtype::f32, a.cur, 4000);  // 1 block of 1000
  const auto big = encode_exact(dtype::f32, b.cur, 8000);    // 2000, 2000, 1000
  REQUIRE(index_frame(big).offsets.size() == 3);
  // A short block before a longer one: the index could not locate elements by arithmetic.
  std::vector<std::byte> uneven = small;
  uneven.insert(uneven.end(), big.begin(), big.end());
  REQUIRE_THROWS_AS(index_frame(uneven), ckpt::corrupt_error);
  // A short block in the middle.
  std::vector<std::byte> middle = big;
  middle.insert(middle.end(), small.begin(), small.end());
  REQUIRE_THROWS_AS(index_frame(middle), ckpt::corrupt_error);
  // Truncated and garbage frames.
  REQUIRE_THROWS_AS(index_frame(std::span(big).first(big.size() - 1)), ckpt::corrupt_error);
  std::vector<std::byte> garbage(64, std::byte{0x5a});
  REQUIRE_THROWS_AS(index_frame(garbage), ckpt::corrupt_error);
}
