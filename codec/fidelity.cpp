// codec::measure_error (fidelity.hpp).
#include "codec/fidelity.hpp"

#include <tbb/parallel_for.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "codec/error.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace ckpt::codec {
namespace {

error_sums piece_sums(dtype t, const std::byte* cur, const std::byte* recon, std::size_t n) {
  const std::size_t es = element_size(t);
  error_sums s;
  for (std::size_t i = 0; i < n; ++i) {
    const double u = load_f32(t, cur + i * es), r = load_f32(t, recon + i * es);
    if (!std::isfinite(u) || !std::isfinite(r)) continue;
    s.err += (r - u) * (r - u);
    s.ref += u * u;
  }
  return s;
}

// f32, the common case, without a branch per element: the write path measures every slab it
// codes. A piece with a NaN or infinity (the sums stop being finite) is summed again above.
// The lanes are summed in a fixed order, so the result depends on the build's instruction set
// only, never on the thread count.
error_sums piece_sums_f32(const std::byte* cur, const std::byte* recon, std::size_t n) {
  std::size_t i = 0;
  error_sums s;
#if defined(__AVX2__) && defined(__FMA__)
  // In registers: the portable loop below went through the stack (its arrays) and stalled on
  // store forwarding, which made it cost more than the quantisation it measures (perf of a
  // 4 GiB delta save: 11% of the daemon's CPU).
  __m256d err[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
  __m256d ref[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
  const auto* u = reinterpret_cast<const float*>(cur);
  const auto* r = reinterpret_cast<const float*>(recon);
  for (; i + 16 <= n; i += 16) {
    for (int h = 0; h < 4; ++h) {
      const __m256d ud = _mm256_cvtps_pd(_mm_loadu_ps(u + i + 4 * h));
      const __m256d rd = _mm256_cvtps_pd(_mm_loadu_ps(r + i + 4 * h));
      const __m256d d = _mm256_sub_pd(rd, ud);
      err[h] = _mm256_fmadd_pd(d, d, err[h]);
      ref[h] = _mm256_fmadd_pd(ud, ud, ref[h]);
    }
  }
  alignas(32) double e[4], f[4];
  for (int h = 0; h < 4; ++h) {
    _mm256_store_pd(e, err[h]);
    _mm256_store_pd(f, ref[h]);
    for (int k = 0; k < 4; ++k) s.merge({e[k], f[k]});
  }
#else
  constexpr std::size_t lanes = 8;
  double err[lanes] = {}, ref[lanes] = {};
  float u[lanes], r[lanes];
  for (; i + lanes <= n; i += lanes) {
    std::memcpy(u, cur + i * 4, sizeof u);
    std::memcpy(r, recon + i * 4, sizeof r);
    for (std::size_t k = 0; k < lanes; ++k) {
      const double d = double(r[k]) - double(u[k]);
      err[k] += d * d;
      ref[k] += double(u[k]) * double(u[k]);
    }
  }
  for (std::size_t k = 0; k < lanes; ++k) s.merge({err[k], ref[k]});
#endif
  s.merge(piece_sums(dtype::f32, cur + i * 4, recon + i * 4, n - i));
  if (!std::isfinite(s.err) || !std::isfinite(s.ref)) return piece_sums(dtype::f32, cur, recon, n);
  return s;
}

}  // namespace

double error_sums::relative() const noexcept {
  if (err == 0) return 0;
  return ref > 0 ? std::sqrt(err / ref) : INFINITY;
}

namespace {

void check_spans(dtype t, std::span<const std::byte> cur, std::span<const std::byte> recon) {
  if (!is_float(t)) throw invalid_argument("codec: fidelity of a non-float tensor");
  if (cur.size() != recon.size() || cur.size() % element_size(t))
    throw invalid_argument("codec: fidelity of spans that differ in size");
}

constexpr std::size_t kPiece = std::size_t(1) << 16;  // elements summed together, then merged

error_sums piece_at(dtype t, std::span<const std::byte> cur, std::span<const std::byte> recon,
                    std::size_t i) {
  const std::size_t es = element_size(t), n = cur.size() / es;
  const std::size_t first = i * kPiece, cnt = std::min(kPiece, n - first);
  return t == dtype::f32 ? piece_sums_f32(cur.data() + first * es, recon.data() + first * es, cnt)
                         : piece_sums(t, cur.data() + first * es, recon.data() + first * es, cnt);
}

}  // namespace

error_sums measure_error(dtype t, std::span<const std::byte> cur,
                         std::span<const std::byte> recon) {
  check_spans(t, cur, recon);
  const std::size_t pieces = (cur.size() / element_size(t) + kPiece - 1) / kPiece;
  std::vector<error_sums> part(pieces);
  tbb::parallel_for(std::size_t(0), pieces,
                    [&](std::size_t i) { part[i] = piece_at(t, cur, recon, i); });
  error_sums all;
  for (const auto& p : part) all.merge(p);
  return all;
}

error_sums measure_error_serial(dtype t, std::span<const std::byte> cur,
                                std::span<const std::byte> recon) {
  check_spans(t, cur, recon);
  const std::size_t pieces = (cur.size() / element_size(t) + kPiece - 1) / kPiece;
  error_sums all;
  for (std::size_t i = 0; i < pieces; ++i) all.merge(piece_at(t, cur, recon, i));
  return all;
}

}  // namespace ckpt::codec
