#include "codec/reconstruct.hpp"

namespace ckpt::codec {
namespace {

// Zero-initialised and never written. Not const: a const array could go to .rodata, 64 MiB in
// the binary; in .bss untouched pages read as the kernel's shared zero page.
alignas(4096) std::byte zeros[zero_base_bytes];

}  // namespace

const std::byte* zero_base() noexcept {
  return zeros;
}

}  // namespace ckpt::codec
