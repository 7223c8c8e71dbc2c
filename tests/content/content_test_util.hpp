#pragma once
// Shared by the content store tests: a temporary store directory, a store opened on it as the
// daemon opens one (objects, journal, replay, content store), safetensors files built in memory,
// a drifting two-tensor model, and whole-version reads.
#include <algorithm>
#include <boost/filesystem.hpp>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "codec/dtype.hpp"
#include "fs/content/content_store.hpp"
#include "fs/store/journal.hpp"
#include "fs/store/object_store.hpp"

namespace ckpt::test {

namespace bfs = boost::filesystem;
using bytes = std::vector<std::byte>;

struct temp_dir {
  bfs::path path = bfs::temp_directory_path() / bfs::unique_path("ckptfs-content-%%%%-%%%%");
  temp_dir() { bfs::create_directories(path); }
  ~temp_dir() { bfs::remove_all(path); }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

// The file of object `id` in the store at `store` (object_store's `%016llx.obj`).
inline bfs::path object_file(const bfs::path& store, std::uint64_t id) {
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.obj", static_cast<unsigned long long>(id));
  return store / "objects" / name;
}

// A store opened on a directory, as the daemon does: objects, journal, replay, content store.
struct opened {
  store::object_store objects;
  store::journal journal;
  fs::content_store content;
  opened(const bfs::path& dir, fs::content_options opt, std::vector<fs::content_ref> live = {})
      : objects(dir / "objects"), journal(dir / "journal"), content(objects, journal, opt) {
    journal.replay([&](std::span<const std::byte> r) { REQUIRE(content.apply(r)); });
    content.replay_done(live);
  }
};

// What a content store logged (set_logger), for tests that check what it reports and at which
// level. Thread-safe: head images publish and rebuild on their own threads.
struct log_lines {
  std::mutex mu;
  std::vector<std::pair<fs::log_level, std::string>> lines;
  fs::log_sink sink() {
    return [this](fs::log_level level, const std::string& m) {
      std::lock_guard lock(mu);
      lines.emplace_back(level, m);
    };
  }
  // How many lines at `level` contain `text` ("" : every line at the level).
  std::size_t count(fs::log_level level, const std::string& text = "") {
    std::lock_guard lock(mu);
    return std::size_t(std::count_if(lines.begin(), lines.end(), [&](const auto& l) {
      return l.first == level && l.second.find(text) != std::string::npos;
    }));
  }
};

// What filesystem::sync_journal does: objects a record made unnecessary are removed once the
// journal holding that record is synced.
inline void sync_like_fs(opened& s) {
  auto un = s.content.take_unneeded_objects();
  s.journal.sync();
  s.content.remove_objects(un);
}

// n floats of a file's bytes from `offset`.
inline std::vector<float> floats_at(const bytes& file, std::size_t offset, std::size_t n) {
  std::vector<float> v(n);
  std::memcpy(v.data(), file.data() + offset, 4 * n);
  return v;
}

// A safetensors file: header JSON padded to 8 bytes, then the tensors' bytes in order; F32, or
// BF16 with each float rounded to nearest, ties to even.
inline bytes safetensors(const std::vector<std::pair<std::string, std::vector<float>>>& tensors,
                         bool bf16 = false) {
  const std::size_t es = bf16 ? 2 : 4;
  nlohmann::json h = nlohmann::json::object();
  std::uint64_t at = 0;
  for (const auto& [name, v] : tensors) {
    h[name] = {{"dtype", bf16 ? "BF16" : "F32"},
               {"shape", {v.size()}},
               {"data_offsets", {at, at + es * v.size()}}};
    at += es * v.size();
  }
  std::string js = h.dump();
  while ((8 + js.size()) % 8) js += ' ';
  bytes out(8 + js.size() + at);
  const std::uint64_t n = js.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, js.data(), js.size());
  std::size_t p = 8 + js.size();
  for (const auto& [name, v] : tensors)
    for (float f : v) {
      if (bf16) {
        const std::uint16_t h = codec::f32_to_bf16(f);
        std::memcpy(out.data() + p, &h, 2);
      } else {
        std::memcpy(out.data() + p, &f, 4);
      }
      p += es;
    }
  return out;
}

// A weight vector that drifts like a trained layer's: values from N(0, 0.05), and each step()
// adds N(0, 1e-3) x scale to every one. The generator is the test's, shared by its tensors.
// Relative L2 distance of two float vectors: sqrt(sum (got - want)^2 / sum want^2).
inline double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

struct drifting_weights {
  std::vector<float> values;
  drifting_weights(std::size_t n, std::mt19937_64& rng) : values(n) {
    std::normal_distribution<float> w(0.0f, 0.05f);
    for (auto& x : values) x = w(rng);
  }
  void step(std::mt19937_64& rng, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, 1e-3f);
    for (auto& x : values) x += scale * d(rng);
  }
  std::size_t size() const { return values.size(); }
  float operator[](std::size_t i) const { return values[i]; }
};

// A training-like sequence: two tensors "w" and "v" whose weights drift a little each step.
struct trainer {
  std::mt19937 rng{7};
  std::vector<float> w, v;
  explicit trainer(std::size_t n = 200000) : w(n), v(n / 2) {
    std::normal_distribution<float> d(0, 1);
    for (auto& x : w) x = d(rng);
    for (auto& x : v) x = d(rng);
  }
  bytes step() {
    std::normal_distribution<float> d(0, 1e-3f);
    for (auto& x : w) x += d(rng);
    for (auto& x : v) x += d(rng);
    return safetensors({{"w", w}, {"v", v}});
  }
};

inline bytes read_all(fs::content_store& c, const fs::content_ref& r) {
  auto reader = c.open(r);
  bytes out(reader->size());
  if (reader->read(0, out) != out.size()) throw std::runtime_error("short read");
  return out;
}

}  // namespace ckpt::test
