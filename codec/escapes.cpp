#include "codec/escapes.hpp"

#include <array>

#include "codec/error.hpp"
#include "codec/planes.hpp"
#include "codec/scratch.hpp"

namespace ckpt::codec {

namespace {
constexpr std::size_t kMaxGapBytes = 5;  // LEB128 of a u32
}

std::size_t put_coded_escapes(dtype t, std::span<const std::uint32_t> indices,
                              std::span<const std::byte> values, entropy_policy policy,
                              std::vector<std::byte>& out) {
  const std::size_t esize = element_size(t), e = indices.size(), at = out.size();
  if (values.size() != e * esize) throw invalid_argument("escapes: values and indices disagree");
  thread_local scratch_vector<std::uint8_t> gaps, planes;
  gaps.clear();
  std::uint64_t next = 0;
  for (const auto i : indices) {
    if (i < next) throw invalid_argument("escapes: indices must ascend");
    auto g = std::uint32_t(i - next);
    next = std::uint64_t(i) + 1;
    for (; g >= 0x80; g >>= 7) gaps.push_back(std::uint8_t(g | 0x80));
    gaps.push_back(std::uint8_t(g));
  }
  byte_writer w(out);
  w.put<std::uint32_t>(std::uint32_t(gaps.size()));
  std::size_t len_at = w.skip(4);
  encode_bytes(gaps, policy, out);
  w.put_at<std::uint32_t>(len_at, std::uint32_t(out.size() - len_at - 4));
  planes.resize(e * esize);
  to_planes(t, values.data(), e, planes.data());
  for (std::size_t pl = 0; pl < esize; ++pl) {
    len_at = w.skip(4);
    encode_bytes(std::span<const std::uint8_t>(planes).subspan(pl * e, e), policy, out);
    w.put_at<std::uint32_t>(len_at, std::uint32_t(out.size() - len_at - 4));
  }
  return out.size() - at;
}

void get_coded_escapes(byte_reader& r, dtype t, std::size_t n, std::size_t count,
                       std::vector<std::uint32_t>& indices, std::vector<std::byte>& values) {
  const std::size_t esize = element_size(t);
  if (count == 0) throw corrupt_error("block: coded escapes without escapes");
  const auto ngaps = r.get<std::uint32_t>();
  if (ngaps < count || ngaps > kMaxGapBytes * count) throw corrupt_error("block: bad escape gaps");
  thread_local scratch_vector<std::uint8_t> gaps, planes;
  gaps.resize(ngaps);
  decode_bytes(r.get_bytes(r.get<std::uint32_t>()), gaps);
  indices.clear();
  std::uint64_t next = 0;
  std::size_t pos = 0;
  for (std::size_t k = 0; k < count; ++k) {
    std::uint64_t g = 0;
    for (int shift = 0;; shift += 7) {
      if (pos == ngaps || shift > 28) throw corrupt_error("block: bad escape gaps");
      const std::uint8_t b = gaps[pos++];
      g |= std::uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) {
        if (b == 0 && shift) throw corrupt_error("block: bad escape gaps");  // overlong
        break;
      }
    }
    next += g;
    if (next >= n) throw corrupt_error("block: escape index out of range");
    indices.push_back(std::uint32_t(next++));
  }
  if (pos != ngaps) throw corrupt_error("block: bad escape gaps");
  planes.resize(count * esize);
  std::array<const std::uint8_t*, 4> src{};
  for (std::size_t pl = 0; pl < esize; ++pl) {
    decode_bytes(r.get_bytes(r.get<std::uint32_t>()), std::span(planes.data() + pl * count, count));
    src[pl] = planes.data() + pl * count;
  }
  values.resize(count * esize);
  from_planes(t, src, count, values.data());
}

}  // namespace ckpt::codec
