// libFuzzer target: recognise_safetensors() on arbitrary bytes (tests/fuzz/build_and_run.sh).
#include "codec/error.hpp"
#include "codec/format/recognise.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ckpt::format;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  const auto src = memory_source(bytes);
  recognise_options opt;
  opt.min_compress_bytes = 0;
  opt.pickle.max_nodes = 1u << 16;  // keep single inputs fast; the limits logic is the same
  try {
    fuzz::exercise(recognise_safetensors(src, opt), src, bytes);
  } catch (const ckpt::corrupt_error&) {
    // a clean refusal
  }
  fuzz::exercise(recognise(src, opt), src, bytes);  // the entry point never throws on content
  return 0;
}
