#pragma once
// How far a reconstruction is from the tensor it codes, for `ckptctl stat`: the relative L2 error
// sqrt(sum (recon - cur)^2 / sum cur^2) of a tensor, or of a class of tensors (all weights, all
// of Adam's exp_avg, ...) from the sums of its tensors. Measured by the write path as it codes,
// so the numbers are of the version as stored, against the bytes that were written.
#include <cstdint>
#include <span>

#include "codec/dtype.hpp"

namespace ckpt::codec {

struct error_sums {
  double err = 0;  // sum over elements of (recon - cur)^2
  double ref = 0;  // sum over elements of cur^2
  void merge(const error_sums& o) noexcept {
    err += o.err;
    ref += o.ref;
  }
  // sqrt(err / ref); 0 when both are 0 (an all-zero tensor stored exactly).
  double relative() const noexcept;
};

// Over every element of a float slab (in parallel, summed in a fixed order: the result does not
// depend on the thread count). Elements that are NaN or infinite in either are skipped. Throws
// invalid_argument for a non-float dtype or spans of different or partial sizes.
error_sums measure_error(dtype t, std::span<const std::byte> cur, std::span<const std::byte> recon);
// The same sums on the calling thread, for a caller that is parallel already (the encoder measures
// each block right after coding it, while the block is in the core's cache).
error_sums measure_error_serial(dtype t, std::span<const std::byte> cur,
                                std::span<const std::byte> recon);

}  // namespace ckpt::codec
