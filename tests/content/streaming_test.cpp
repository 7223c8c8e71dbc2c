// The streaming write path (fs/content/ingest.cpp): versions are encoded into their objects a
// slab at a time. A checkpoint much larger than the cache is stored, delta-coded and rewritten
// as a keyframe (prune's rekey) while the process's peak memory stays within the cache and the
// encode slots (DESIGN.md §9 invariant 7); tensors larger than a slab and exact regions spanning
// many chunks read back exactly as they were served when written.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <random>

#include "codec/format/source.hpp"
#include "codec/xxh3.hpp"
#include "content_test_util.hpp"

using namespace ckpt;
using namespace ckpt::test;

namespace {

// The process's peak resident set (VmHWM), and a reset of it to the current RSS.
std::uint64_t peak_rss() {
  std::ifstream f("/proc/self/status");
  std::string key;
  std::uint64_t kib = 0;
  while (f >> key) {
    if (key == "VmHWM:") {
      f >> kib;
      return kib << 10;
    }
    std::getline(f, key);
  }
  return 0;
}
std::uint64_t current_rss() {
  std::ifstream f("/proc/self/statm");
  std::uint64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * 4096;
}
void reset_peak_rss() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

// A safetensors file of `tensors` fp32 tensors of `n` elements each, written to `path` a chunk at
// a time (never whole in memory): tensor t holds sin(i * 1e-3 + t) * 0.05 + step * 1e-3 * cos(i).
void write_safetensors(const bfs::path& path, int tensors, std::size_t n, int step) {
  nlohmann::json h = nlohmann::json::object();
  std::uint64_t at = 0;
  for (int t = 0; t < tensors; ++t) {
    h["t" + std::to_string(t)] = {
        {"dtype", "F32"}, {"shape", {n}}, {"data_offsets", {at, at + 4 * n}}};
    at += 4 * n;
  }
  std::string js = h.dump();
  while ((8 + js.size()) % 8) js += ' ';
  std::ofstream f(path.string(), std::ios::binary);
  const std::uint64_t len = js.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.write(js.data(), std::streamsize(js.size()));
  std::vector<float> chunk(1 << 20);
  for (int t = 0; t < tensors; ++t)
    for (std::size_t i = 0; i < n; i += chunk.size()) {
      const std::size_t k = std::min(chunk.size(), n - i);
      for (std::size_t j = 0; j < k; ++j)
        chunk[j] = float(std::sin(double(i + j) * 1e-3 + t) * 0.05 +
                         step * 1e-3 * std::cos(double(i + j)));
      f.write(reinterpret_cast<const char*>(chunk.data()), std::streamsize(4 * k));
    }
  REQUIRE(f.good());
}

// XXH3 of everything a version reads as, read `buf.size()` bytes at a time.
std::uint64_t digest_of(fs::content_store& c, const fs::content_ref& ref, bytes& buf) {
  auto r = c.open(ref);
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  for (std::uint64_t at = 0; at < r->size(); at += buf.size()) {
    const std::size_t k = r->read(at, buf);
    XXH3_64bits_update(&st, buf.data(), k);
  }
  return XXH3_64bits_digest(&st);
}

float value(int t, std::size_t i, int step) {
  return float(std::sin(double(i) * 1e-3 + t) * 0.05 + step * 1e-3 * std::cos(double(i)));
}

}  // namespace

TEST_CASE("a checkpoint far larger than the cache streams through put and rekey in bounded memory",
          "[content][streaming]") {
  temp_dir d;
  fs::content_options opt;
  opt.cache_bytes = std::uint64_t(64) << 20;
  opened s(d.path, opt);
  const int tensors = 4;
  const std::size_t n = std::size_t(32) << 20;  // 128 MiB per tensor, 512 MiB in all
  std::vector<fs::content_ref> refs;
  for (int step = 0; step < 2; ++step) {
    const bfs::path file = d.path / ("step_" + std::to_string(step) + ".safetensors");
    write_safetensors(file, tensors, n, step);
    const format::source src = format::file_source(file.string());
    reset_peak_rss();  // then the baseline: the peak since the reset is at least that
    const std::uint64_t before = current_rss();
    refs.push_back(s.content.put("run/step_" + std::to_string(step) + ".safetensors", src));
    const std::uint64_t grew = peak_rss() - before;
    INFO("version " << step << ": peak RSS grew by " << (grew >> 20) << " MiB");
    // The encode slots (2+ sets of 3 x 16 MiB slabs and an encoding), the base read-ahead
    // (2 units of 2 x 16 MiB), the object writer's 8 MiB, the cache (64 MiB) and the codec's
    // per-thread scratch: far below the file's
    // 512 MiB, which the whole-tensor write path needed three times over.
    CHECK(grew < (std::uint64_t(240) << 20));
    CHECK(s.content.info(refs.back()).kind == (step == 0 ? "keyframe" : "delta"));
    bfs::remove(file);
  }
  s.journal.sync();
  // What v2 reads as: within the closed-loop bound of the values it was written with.
  s.content.drop_caches();
  bytes served(std::size_t(4) << 20);
  {
    auto r = s.content.open(refs[1]);
    const std::uint64_t hdr = r->size() - std::uint64_t(4) * tensors * n;
    for (int t = 0; t < tensors; ++t)
      for (std::size_t i : {std::size_t(0), n / 3, n - served.size() / 4}) {
        REQUIRE(r->read(hdr + 4 * (std::uint64_t(t) * n + i), served) == served.size());
        const float* f = reinterpret_cast<const float*>(served.data());
        for (std::size_t j = 0; j < served.size() / 4; j += 997) {
          const float want = value(t, i + j, 1), was = value(t, i + j, 0);
          REQUIRE(std::fabs(double(f[j]) - want) <= std::fabs(double(want) - was) + 1e-7);
        }
      }
  }
  // prune's rewrite of v2 as a keyframe: also a slab at a time; it reads the same afterwards.
  const std::uint64_t digest_before = digest_of(s.content, refs[1], served);
  reset_peak_rss();
  const std::uint64_t before = current_rss();
  CHECK(s.content.rekey(refs[1].version) > 0);
  const std::uint64_t grew = peak_rss() - before;
  INFO("rekey: peak RSS grew by " << (grew >> 20) << " MiB");
  CHECK(grew < (std::uint64_t(240) << 20));
  CHECK(s.content.info(refs[1]).kind == "keyframe");
  s.content.drop_caches();
  CHECK(digest_of(s.content, refs[1], served) == digest_before);
  CHECK(s.content.verify(refs[1].version, true, {}).empty());
}

TEST_CASE("tensors larger than a slab, and exact regions of many chunks, read back as written",
          "[content][streaming]") {
  temp_dir d;
  fs::content_options opt;
  opt.keyframe_interval = 10;
  std::mt19937_64 rng(17);
  drifting_weights big(11'000'000, rng), small(1000, rng);  // 44 MB: two slabs and a part
  std::vector<fs::content_ref> refs;
  std::vector<bytes> served;
  bytes random_file(std::size_t(70) << 20);  // an exact file of five read chunks and a part
  for (auto& b : random_file) b = std::byte(rng());
  fs::content_ref exact;
  {
    opened s(d.path, opt);
    exact = s.content.put("data.bin", format::memory_source(random_file));
    for (int v = 0; v < 3; ++v) {
      big.step(rng);
      small.step(rng);
      const bytes file = safetensors({{"big", big.values}, {"small", small.values}});
      refs.push_back(s.content.put("run/step_" + std::to_string(v) + ".safetensors",
                                   format::memory_source(file)));
      served.push_back(read_all(s.content, refs.back()));
      if (v > 0) {
        REQUIRE(s.content.info(refs.back()).kind == "delta");
        // Every element within the closed-loop bound: the error is at most its own delta.
        const std::size_t hdr = file.size() - 4 * (big.size() + small.size());
        const float* now = reinterpret_cast<const float*>(served.back().data() + hdr);
        const float* prev = reinterpret_cast<const float*>(served[std::size_t(v) - 1].data() + hdr);
        for (std::size_t i = 0; i < big.size(); ++i)
          REQUIRE(std::fabs(double(now[i]) - big[i]) <= std::fabs(double(big[i]) - prev[i]));
      }
    }
    s.journal.sync();
  }
  std::vector<fs::content_ref> live = refs;
  live.push_back(exact);
  opened s(d.path, opt, live);
  for (std::size_t v = 0; v < refs.size(); ++v) {
    INFO("version " << v);
    REQUIRE(read_all(s.content, refs[v]) == served[v]);
    REQUIRE(s.content.verify(refs[v].version, true, {}).empty());
  }
  REQUIRE(read_all(s.content, exact) == random_file);
  REQUIRE(s.content.verify(exact.version, true, {}).empty());
}
