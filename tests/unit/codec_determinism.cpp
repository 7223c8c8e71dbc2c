// Encoded bytes and reconstructions are identical whatever the number of threads.
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <catch2/catch.hpp>

#include "codec/tensor_codec.hpp"
#include "codec_test_util.hpp"

using namespace ckpt::codec;
using namespace ckpt::test;

namespace {

struct output {
  std::vector<std::vector<std::byte>> frames;
  std::vector<std::byte> recon;
  bool operator==(const output&) const = default;
};

output encode_all(int threads, dtype t, representative rep, bucket_scope scope) {
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, std::size_t(threads));
  tbb::task_arena arena(threads);
  output o;
  arena.execute([&] {
    const auto a = random_pair(t, 300001, 1), b = random_pair(t, 77777, 2);
    const delta_input in[] = {{t, a.cur, a.base}, {t, b.cur, b.base}};
    const auto tables = plan_tables(in, 3, rep, scope);
    for (int i = 0; i < 2; ++i) {
      auto recon = tensor(t, in[i].cur.size() / element_size(t));
      o.frames.push_back(encode_delta(in[i], tables[i], {3, 0, rep}, recon, 65536));
      o.recon.insert(o.recon.end(), recon.begin(), recon.end());
    }
    o.frames.push_back(encode_exact(t, a.cur, 65536));
  });
  return o;
}

}  // namespace

TEST_CASE("identical bytes with 1, 2 and 8 threads", "[determinism]") {
  for (dtype t : {dtype::f32, dtype::bf16}) {
    for (auto rep : {representative::mean, representative::midrange}) {
      for (auto scope : {bucket_scope::checkpoint, bucket_scope::tensor}) {
        const auto one = encode_all(1, t, rep, scope);
        REQUIRE(one.frames.at(0).size() > 0);
        REQUIRE(encode_all(2, t, rep, scope) == one);
        REQUIRE(encode_all(8, t, rep, scope) == one);
      }
    }
  }
}
