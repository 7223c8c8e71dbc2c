// libFuzzer target: recognise_safetensors() on arbitrary bytes (tests/fuzz/build_and_run.sh).
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return ckpt::format::fuzz::run(data, size, [](const auto& src, const auto& opt) {
    return ckpt::format::recognise_safetensors(src, opt);
  });
}
