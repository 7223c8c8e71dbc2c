// The content store through its public API, on a real object store and journal in a temp dir:
// exact files, a lineage of safetensors checkpoints (keyframes, deltas, the error bound, exact
// small tensors), stability of the served bytes across cache drops and reopen, hidden bases.
#define CATCH_CONFIG_MAIN
#include <boost/filesystem.hpp>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "codec/error.hpp"
#include "codec/format/source.hpp"
#include "content_test_util.hpp"
#include "fs/content/content_store.hpp"
#include "fs/store/journal.hpp"
#include "fs/store/object_store.hpp"

namespace bfs = boost::filesystem;
using namespace ckpt;
using bytes = std::vector<std::byte>;
using namespace ckpt::test;

namespace {

// What fs::filesystem does at a journal sync: objects made unnecessary by the synced records go
// after the sync.
void sync_journal(opened& s) {
  const auto unneeded = s.content.take_unneeded_objects();
  s.journal.sync();
  s.content.remove_objects(unneeded);
}

// Elements read back further from their value than zero is: the bound of tensors coded as
// their values (intra).
std::size_t beyond_value(const std::vector<float>& got, const std::vector<float>& want) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    n += std::fabs(got[i] - want[i]) > std::fabs(want[i]);
  return n;
}

void flip(const bfs::path& p, std::uint64_t at) {
  std::FILE* f = std::fopen(p.c_str(), "r+b");
  REQUIRE(f);
  std::fseek(f, long(at), SEEK_SET);
  const int c = std::fgetc(f);
  std::fseek(f, long(at), SEEK_SET);
  std::fputc(c ^ 0x10, f);
  std::fclose(f);
}

}  // namespace

TEST_CASE("exact files read back byte for byte at any offset", "[content]") {
  temp_dir d;
  opened s(d.path, {});
  std::mt19937_64 rng(1);
  for (std::size_t n : {0ul, 1ul, 4096ul, (1ul << 20) + 1, 5ul << 20}) {
    bytes data(n);
    for (auto& b : data) b = std::byte(rng() % 7);  // compressible
    const auto ref = s.content.put("notes/file.bin", format::memory_source(data));
    REQUIRE(ref.size == n);
    REQUIRE(read_all(s.content, ref) == data);
    auto reader = s.content.open(ref);
    for (int i = 0; i < 50 && n; ++i) {
      const std::uint64_t off = rng() % n, len = std::min<std::uint64_t>(rng() % 300000, n - off);
      bytes part(len);
      REQUIRE(reader->read(off, part) == len);
      REQUIRE(std::equal(part.begin(), part.end(), data.begin() + off));
    }
    if (n) REQUIRE(s.content.info(ref).kind == "exact");
  }
}

TEST_CASE("a lineage of checkpoints: keyframes, deltas, error bound, exact small tensors",
          "[content]") {
  temp_dir d;
  fs::content_options opt;
  opt.bits = 3;
  opt.keyframe_interval = 5;
  std::vector<fs::content_ref> refs;
  std::vector<bytes> served;
  std::mt19937_64 rng(2);
  drifting_weights big(20000, rng), mid(3000, rng), small(10, rng);  // small: under 4 KiB: exact
  {
    opened s(d.path, opt);
    for (int v = 0; v < 12; ++v) {
      big.step(rng);
      mid.step(rng, 10.0f);
      small.step(rng);
      const bytes file = safetensors(
          {{"layer.weight", big.values}, {"layer.bias", mid.values}, {"step", small.values}});
      const auto ref = s.content.put("run/step_" + std::to_string(v) + ".safetensors",
                                     format::memory_source(file));
      refs.push_back(ref);
      const auto info = s.content.info(ref);
      INFO("version " << v);
      REQUIRE(info.format == "safetensors");
      REQUIRE(info.kind == (v % 5 == 0 ? "keyframe" : "delta"));
      REQUIRE(info.lineage == s.content.info(refs.front()).lineage);
      const bytes out = read_all(s.content, ref);
      REQUIRE(out.size() == file.size());
      // Header bytes identical; the small tensor exact; big tensors within the bound.
      const std::size_t hdr = file.size() - 4 * (big.size() + mid.size() + small.size());
      REQUIRE(std::equal(out.begin(), out.begin() + hdr, file.begin()));
      REQUIRE(floats_at(out, hdr + 4 * (big.size() + mid.size()), small.size()) == small.values);
      if (v % 5 == 0) {
        REQUIRE(out == file);  // keyframes are lossless
      } else {
        const auto prev = floats_at(served.back(), hdr, big.size());
        const auto now = floats_at(out, hdr, big.size());
        for (std::size_t i = 0; i < big.size(); ++i)
          REQUIRE(std::fabs(double(now[i]) - big[i]) <= std::fabs(double(big[i]) - prev[i]));
        REQUIRE(s.content.info(ref).stored_bytes * 5 < file.size());
      }
      served.push_back(out);
    }
    // The same bytes after the caches are emptied (the chain is decoded from the keyframe).
    s.content.drop_caches();
    for (std::size_t v = 0; v < refs.size(); ++v)
      REQUIRE(read_all(s.content, refs[v]) == served[v]);
    // Deleting versions (names gone) keeps the ones later versions depend on.
    for (std::size_t v = 0; v + 1 < refs.size(); ++v) s.content.unref(refs[v]);
    s.content.drop_caches();
    REQUIRE(read_all(s.content, refs.back()) == served.back());
    s.journal.sync();
  }
  // Reopen: only the last version is still named.
  opened s(d.path, opt, {refs.back()});
  REQUIRE(read_all(s.content, refs.back()) == served.back());
  // The next version continues the lineage after reopen (a delta against the replayed head).
  big.step(rng);
  const bytes file = safetensors(
      {{"layer.weight", big.values}, {"layer.bias", mid.values}, {"step", small.values}});
  const auto next = s.content.put("run/step_99.safetensors", format::memory_source(file));
  REQUIRE(s.content.info(next).kind == "delta");
  REQUIRE(s.content.info(next).base == refs.back().version);
}

TEST_CASE("lossless option stores every checkpoint exactly", "[content]") {
  temp_dir d;
  fs::content_options opt;
  opt.lossless = true;
  opened s(d.path, opt);
  std::vector<float> a(5000, 0.5f);
  for (int v = 0; v < 3; ++v) {
    a[v] += 1.0f;
    const bytes file = safetensors({{"a", a}});
    const auto ref = s.content.put("x.safetensors", format::memory_source(file));
    REQUIRE(read_all(s.content, ref) == file);
    REQUIRE(s.content.info(ref).kind == "keyframe");
  }
}

// Issue 13: with -o lossless the daemon's memory grew by one checkpoint per version until cache=
// was full. A small checkpoint's reconstruction stays in the cache as the next version's base;
// a delta drops its base's as it is coded, but a keyframe (every version with lossless, every
// keyframe_interval-th otherwise) left the head it superseded there.
TEST_CASE("a superseded head leaves the cache also when its successor is a keyframe", "[content]") {
  const bool lossless = GENERATE(true, false);
  temp_dir d;
  fs::content_options opt;
  opt.lossless = lossless;
  opt.keyframe_interval = 2;  // lossy: every other version a keyframe
  opt.cache_bytes = std::uint64_t(256) << 20;
  opened s(d.path, opt);
  std::mt19937_64 rng(5);
  drifting_weights a(1 << 18, rng), b(1 << 18, rng);  // 2 MiB of tensors a version
  const std::uint64_t tensor_bytes = 4 * (a.size() + b.size());
  for (int v = 0; v < 12; ++v) {
    a.step(rng);
    b.step(rng);
    const bytes file = safetensors({{"a", a.values}, {"b", b.values}});
    const auto ref = s.content.put("run/step.safetensors", format::memory_source(file));
    INFO("lossless " << lossless << ", version " << v + 1 << ": " << s.content.info(ref).kind);
    // The newest reconstruction (and small metadata), not one per version.
    CHECK(s.content.usage().cache_bytes < tensor_bytes + tensor_bytes / 2);
  }
}

TEST_CASE("the reconstructions a save keeps read as the store decodes its version", "[content]") {
  temp_dir d;
  fs::content_options opt;
  opt.cache_bytes = std::uint64_t(256) << 20;
  opened s(d.path, opt);
  std::mt19937_64 rng(17);
  std::vector<drifting_weights> w;
  for (int i = 0; i < 4; ++i) w.emplace_back(1 << 18, rng);
  std::vector<fs::content_ref> refs;
  for (int v = 0; v < 4; ++v) {
    for (auto& t : w) t.step(rng);
    refs.push_back(s.content.put(
        "run/step.safetensors",
        format::memory_source(safetensors(
            {{"a", w[0].values}, {"b", w[1].values}, {"c", w[2].values}, {"d", w[3].values}}))));
  }
  // The newest read from what its save kept in the cache (the next save's base), then from its
  // chain: a base that differs from the stored version would make every later delta wrong.
  CHECK(s.content.usage().cache_bytes >= 4 * 4 * w[0].size());
  const bytes cached = read_all(s.content, refs.back());
  s.content.drop_caches();
  CHECK(s.content.usage().cache_bytes == 0);
  CHECK(read_all(s.content, refs.back()) == cached);
}

TEST_CASE("a version whose object cannot be committed leaves nothing in the cache", "[content]") {
  temp_dir d;
  fs::content_options opt;
  opt.cache_bytes = std::uint64_t(256) << 20;
  opened s(d.path, opt);
  std::mt19937_64 rng(11);
  drifting_weights a(1 << 18, rng), b(1 << 18, rng);  // 2 MiB of tensors a version
  const std::uint64_t tensor_bytes = 4 * (a.size() + b.size());
  const bytes v1 = safetensors({{"a", a.values}, {"b", b.values}});
  const auto r1 = s.content.put("run/step.safetensors", format::memory_source(v1));
  a.step(rng);
  b.step(rng);
  const bytes v2 = safetensors({{"a", a.values}, {"b", b.values}});
  // The last tensor's bytes are read after the others were coded and kept in the cache: the
  // object being written loses its temporary file then, so its commit (the rename) fails.
  const format::source failing(v2.size(), [&](std::uint64_t off, std::span<std::byte> out) {
    std::memcpy(out.data(), v2.data() + off, out.size());
    if (off + out.size() == v2.size() && off > 0)
      for (const auto& e : bfs::directory_iterator(d.path / "objects"))
        if (e.path().extension() == ".tmp") bfs::remove(e.path());
  });
  CHECK_THROWS(s.content.put("run/step.safetensors", failing));
  // The failed version's reconstructions went with it (its base's had already left as it was
  // coded): the cache holds metadata only.
  CHECK(s.content.usage().cache_bytes < tensor_bytes / 4);
  // The lineage goes on from the version that was recorded.
  const auto r3 = s.content.put("run/step.safetensors", format::memory_source(v2));
  CHECK(s.content.info(r3).kind == "delta");
  CHECK(read_all(s.content, r1) == v1);
  CHECK(read_all(s.content, r3).size() == v2.size());
}

TEST_CASE("a damaged object makes that version fail cleanly, others still read", "[content]") {
  temp_dir d;
  opened s(d.path, {});
  bytes a(100000, std::byte(1)), b(100000, std::byte(2));
  const auto ra = s.content.put("a", format::memory_source(a));
  const auto rb = s.content.put("b", format::memory_source(b));
  s.content.drop_caches();
  // Flip one byte in the middle of a's object file (the first object written).
  const auto ids = s.objects.list();
  REQUIRE(ids.size() == 2);
  const bfs::path victim = object_file(d.path, ids.front());
  REQUIRE(bfs::exists(victim));
  // Every byte of the object matters: flip each position in turn (restoring it after).
  const auto size = bfs::file_size(victim);
  for (std::uint64_t at = 0; at < size; at += std::max<std::uint64_t>(1, size / 64)) {
    flip(victim, at);
    s.content.drop_caches();
    INFO("flipped byte " << at << " of " << size);
    REQUIRE_THROWS_AS(read_all(s.content, ra), ckpt::error);
    REQUIRE(read_all(s.content, rb) == b);
    flip(victim, at);
  }
  s.content.drop_caches();
  REQUIRE(read_all(s.content, ra) == a);
}

TEST_CASE("checkpoint-wide buckets (the paper's scope) round-trip within the bound", "[content]") {
  temp_dir d;
  fs::content_options opt;
  opt.scope = codec::bucket_scope::checkpoint;
  opt.bits = 2;
  opened s(d.path, opt);
  std::mt19937_64 rng(5);
  drifting_weights a(30000, rng), b(8000, rng);
  bytes prev;
  for (int v = 0; v < 4; ++v) {
    a.step(rng);
    b.step(rng, 1e-3f);  // far smaller deltas: dropped by shared buckets
    const bytes file = safetensors({{"a", a.values}, {"b", b.values}});
    const auto ref = s.content.put("m.safetensors", format::memory_source(file));
    const bytes out = read_all(s.content, ref);
    if (v > 0) {
      REQUIRE(s.content.info(ref).kind == "delta");
      const std::size_t hdr = file.size() - 4 * (a.size() + b.size());
      const auto now = floats_at(out, hdr, a.size()), before = floats_at(prev, hdr, a.size());
      for (std::size_t i = 0; i < a.size(); ++i)
        REQUIRE(std::fabs(double(now[i]) - a[i]) <= std::fabs(double(a[i]) - before[i]));
      // b's deltas are 1000x smaller than a's: with one table for the checkpoint they are dropped.
      REQUIRE(floats_at(out, hdr + 4 * a.size(), b.size()) ==
              floats_at(prev, hdr + 4 * a.size(), b.size()));
    }
    prev = out;
  }
}

#include "fs/content/lineage_key.hpp"

TEST_CASE("path keys strip steps and keep ranks and shards", "[content]") {
  using fs::lineage_path_key;
  CHECK(lineage_path_key("run/step_500.pt") == "run/step_#.pt");
  CHECK(lineage_path_key("run/step_500.pt") == lineage_path_key("run/step_7.pt"));
  CHECK(lineage_path_key("out/checkpoint-500/optimizer.pt") == "out/checkpoint-#/optimizer.pt");
  CHECK(lineage_path_key("lightning/epoch=3-step=500.ckpt") == "lightning/epoch=#-step=#.ckpt");
  CHECK(lineage_path_key("ckpt/rank_3/step_40.pt") == "ckpt/rank_3/step_#.pt");
  CHECK(lineage_path_key("ds/global_step10/mp_rank_03_model_states.pt") ==
        "ds/global_step#/mp_rank_03_model_states.pt");
  CHECK(lineage_path_key("hf/model-00001-of-00004.safetensors") ==
        "hf/model-00001-of-00004.safetensors");
  CHECK(lineage_path_key("dcp/step_9/__0_1.distcp") == "dcp/step_#/__0_1.distcp");
  CHECK(lineage_path_key("ckpt/rank_3/x.pt") != lineage_path_key("ckpt/rank_4/x.pt"));
  CHECK(lineage_path_key("run-pl/tmp.ckpt.part") == "run-pl/tmp.ckpt.part");
}

TEST_CASE("a new path with the content of an existing lineage forks it with a delta", "[content]") {
  temp_dir d;
  opened s(d.path, {});
  std::vector<float> a(20000, 0.25f);
  const bytes f1 = safetensors({{"w", a}});
  const auto r1 = s.content.put("run/step_1.safetensors", format::memory_source(f1));
  a[3] += 0.5f;
  const bytes f2 = safetensors({{"w", a}});
  const auto r2 = s.content.put("elsewhere/last.safetensors", format::memory_source(f2));
  const auto r3 = s.content.put("run/step_2.safetensors", format::memory_source(f2));
  const auto i1 = s.content.info(r1), i2 = s.content.info(r2), i3 = s.content.info(r3);
  CHECK(i2.lineage != i1.lineage);  // its own lineage...
  CHECK(i2.kind == "delta");        // ...starting from the other one's head
  CHECK(i2.base == r1.version);
  CHECK(i3.lineage == i1.lineage);  // the original path continues its own chain
  CHECK(i3.base == r1.version);
}

TEST_CASE("weights a look-alike lineage's head does not predict are stored as a keyframe would",
          "[content]") {
  // Two models of one architecture, two runs: the second run's first version starts from the
  // first run's head (a new path matching its lineage), but holds another model. Coded against
  // that head, or as values, its weights would read back with an error as large as they are
  // (59% before this guard); they are stored as a lossy keyframe stores them, each element
  // within 2^-13 of its value. The run's next version, a step on, is a delta again.
  temp_dir d;
  fs::content_options opt;
  opt.keyframe_bits = 12;
  opened s(d.path, opt);
  std::mt19937_64 rng(41);
  std::normal_distribution<float> w(0.0f, 0.05f), step(0.0f, 1e-4f);
  std::vector<float> a(70000), b(70000);
  for (auto& x : a) x = w(rng);
  for (auto& x : b) x = w(rng);
  const auto ra =
      s.content.put("runA/ckpt.safetensors", format::memory_source(safetensors({{"w", a}})));
  const bytes fb = safetensors({{"w", b}});
  const auto rb = s.content.put("runB/ckpt.safetensors", format::memory_source(fb));
  REQUIRE(s.content.info(rb).kind == "delta");  // the fork, as before
  REQUIRE(s.content.info(rb).base == ra.version);
  const auto got = floats_at(read_all(s.content, rb), fb.size() - 4 * b.size(), b.size());
  std::size_t off = 0;
  for (std::size_t i = 0; i < b.size(); ++i)
    off += std::fabs(double(got[i]) - b[i]) > std::ldexp(std::fabs(double(b[i])), -13);
  CHECK(off == 0);
  CHECK(s.content.detail(rb).tensors.at(0).rel_error < 1e-4);
  CHECK(s.content.detail(rb).tensors.at(0).mode == "rounded");  // a frame without a base
  for (auto& x : b) x += step(rng);
  const bytes fb2 = safetensors({{"w", b}});
  const auto rb2 = s.content.put("runB/ckpt.safetensors", format::memory_source(fb2));
  REQUIRE(s.content.info(rb2).kind == "delta");
  CHECK(s.content.info(rb2).base == rb.version);
  CHECK(s.content.detail(rb2).tensors.at(0).stored_bytes * 4 <
        s.content.detail(rb).tensors.at(0).stored_bytes);
  // A first moment by its name (Adam's m, coded as values by design) is not affected: the same
  // unrelated values under "exp_avg" are coded as values.
  fs::content_options o2 = opt;
  o2.exact_optimizer = false;
  temp_dir d2;
  opened s2(d2.path, o2);
  s2.content.put("runA/opt.safetensors",
                 format::memory_source(safetensors({{"state.0.exp_avg", a}})));
  const auto rm = s2.content.put("runB/opt.safetensors",
                                 format::memory_source(safetensors({{"state.0.exp_avg", b}})));
  REQUIRE(s2.content.info(rm).kind == "delta");
  CHECK(s2.content.detail(rm).tensors.at(0).mode == "intra");
}

TEST_CASE("a new path forks the matching lineage its path is nearest to, then the newest",
          "[content]") {
  // Two runs of one architecture, a/ and b/. A save through a temporary name in b/ (a safe
  // save: b/x.safetensors.tmp, renamed over b/x.safetensors) starts from b/x's head, not from
  // a's or b/z's, extended after it; a new path sharing nothing with them starts from the
  // newest.
  temp_dir d;
  opened s(d.path, {});
  std::mt19937_64 rng(43);
  std::normal_distribution<float> w(0.0f, 0.05f);
  std::vector<float> a(20000), b(20000);
  for (auto& x : a) x = w(rng);
  for (auto& x : b) x = w(rng);
  const auto put = [&](const std::string& path, const std::vector<float>& v) {
    return s.content.put(path, format::memory_source(safetensors({{"w", v}})));
  };
  put("a/x.safetensors", a);
  const auto rb = put("b/x.safetensors", b);
  a[7] += 0.01f;
  const auto ra = put("a/x.safetensors", a);  // a's head is now the newest
  std::vector<float> z(b);
  z[9] += 0.5f;
  const auto rz = put("b/z.safetensors", z);  // a fork in b/, newer still
  REQUIRE(s.content.info(rz).base == rb.version);
  b[7] += 0.01f;
  const auto tmp = put("b/x.safetensors.tmp", b);
  CHECK(s.content.info(tmp).base == rb.version);
  CHECK(s.content.detail(tmp).tensors.at(0).mode != "rounded");  // a delta on its own run
  const auto other = put("c/y.safetensors", a);
  CHECK(s.content.info(other).base == tmp.version);  // the newest head (ra's came before it)
  CHECK(ra.version < tmp.version);
}

TEST_CASE("another rank's or shard's lineage is never a new lineage's base", "[content]") {
  using fs::lineage_rank_tokens;
  CHECK(lineage_rank_tokens("run/step_5.pt").empty());
  CHECK(lineage_rank_tokens("dcp/step_9/__3_0.distcp") ==
        lineage_rank_tokens("tmp_x/__3_0.distcp"));
  CHECK(lineage_rank_tokens("dcp/step_9/__3_0.distcp") !=
        lineage_rank_tokens("dcp/step_9/__2_0.distcp"));
  CHECK(lineage_rank_tokens("ckpt/rank_3/s.pt") != lineage_rank_tokens("ckpt/rank_4/s.pt"));
  temp_dir d;
  opened s(d.path, {});
  std::vector<float> a(20000, 0.25f);
  const bytes f1 = safetensors({{"w", a}});
  const auto r0 = s.content.put("dcp/step_1/__0_0.distcp", format::memory_source(f1));
  a[3] += 0.5f;
  const bytes f2 = safetensors({{"w", a}});
  // Rank 1's first shard has rank 0's tensor names and shapes: still a keyframe of its own.
  const auto r1 = s.content.put("dcp/step_1/__1_0.distcp", format::memory_source(f2));
  CHECK(s.content.info(r1).kind == "keyframe");
  CHECK(s.content.info(r1).lineage != s.content.info(r0).lineage);
  // The same rank under a step directory's temporary name continues from its own head.
  const auto r2 = s.content.put("dcp/.tmp-step_2/__0_0.distcp", format::memory_source(f2));
  CHECK(s.content.info(r2).kind == "delta");
  CHECK(s.content.info(r2).base == r0.version);
}

TEST_CASE("a fork written under a temporary name joins its lineage when renamed into it",
          "[content]") {
  temp_dir d;
  std::uint64_t rank0 = 0, joined = 0;
  {
    opened s(d.path, {});
    std::vector<float> a(20000, 0.25f);
    const auto r0 =
        s.content.put("dcp/step_1/__0_0.distcp", format::memory_source(safetensors({{"w", a}})));
    const auto q0 =
        s.content.put("dcp/step_1/__1_0.distcp", format::memory_source(safetensors({{"w", a}})));
    rank0 = s.content.info(r0).lineage;
    a[3] += 0.5f;
    const auto r1 =
        s.content.put("dcp/tmpab12/__0_0.distcp", format::memory_source(safetensors({{"w", a}})));
    REQUIRE(s.content.info(r1).lineage != rank0);  // forked from rank 0's head...
    REQUIRE(s.content.info(r1).base == r0.version);
    s.content.renamed(r0, "dcp/old/__0_0.distcp");  // a name no lineage has: no change
    CHECK(s.content.info(r0).lineage == rank0);
    s.content.renamed(r1, "dcp/step_2/__1_0.distcp");  // another rank's name: never joined
    CHECK(s.content.info(r1).lineage != rank0);
    CHECK(s.content.info(r1).lineage != s.content.info(q0).lineage);
    s.content.renamed(r1, "dcp/step_2/__0_0.distcp");  // ...and joined under its step name
    CHECK(s.content.info(r1).lineage == rank0);
    CHECK(s.content.info(r0).lineage == rank0);
    // The next temporary step continues from the joined head, and joins as well.
    a[5] += 0.5f;
    const auto r2 =
        s.content.put("dcp/tmpcd34/__0_0.distcp", format::memory_source(safetensors({{"w", a}})));
    CHECK(s.content.info(r2).base == r1.version);
    s.content.renamed(r2, "dcp/step_3/__0_0.distcp");
    CHECK(s.content.info(r2).lineage == rank0);
    // A name that keys no lineage, and a rename back to the fork's own key: no change.
    a[6] += 0.5f;
    const auto r3 =
        s.content.put("dcp/tmpef56/__0_0.distcp", format::memory_source(safetensors({{"w", a}})));
    const auto fork = s.content.info(r3).lineage;
    s.content.renamed(r3, "elsewhere/__0_0.distcp");
    CHECK(s.content.info(r3).lineage == fork);
    s.content.renamed(r3, "dcp/tmpef56/__0_0.distcp");
    CHECK(s.content.info(r3).lineage == fork);
    s.content.renamed(r3, "dcp/step_4/__0_0.distcp");
    CHECK(s.content.info(r3).lineage == rank0);
    joined = r3.version;
  }
  opened s(d.path, {}, {});  // the join is journaled
  CHECK(s.content.info({joined, 0}).lineage == rank0);
  std::vector<float> a(20000, 0.25f);
  a[3] = a[5] = a[6] = 0.75f;
  a[9] = 1.0f;
  const auto next =
      s.content.put("dcp/step_5/__0_0.distcp", format::memory_source(safetensors({{"w", a}})));
  CHECK(s.content.info(next).lineage == rank0);
  CHECK(s.content.info(next).base == joined);
}

TEST_CASE("two first puts of one new path at once make one lineage, and survive a restart",
          "[content]") {
  temp_dir d;
  std::uint64_t lineage = 0;
  {
    opened s(d.path, {});
    std::vector<float> a(400000, 0.25f), b = a;
    b[7] = 1.0f;
    const bytes fa = safetensors({{"w", a}}), fb = safetensors({{"w", b}});
    fs::content_ref ra, rb;
    std::thread t([&] { ra = s.content.put("run/last.safetensors", format::memory_source(fa)); });
    rb = s.content.put("run/last.safetensors", format::memory_source(fb));
    t.join();
    const auto ia = s.content.info(ra), ib = s.content.info(rb);
    CHECK(ia.lineage == ib.lineage);
    const auto& second = ia.version > ib.version ? ia : ib;
    const auto& first = ia.version > ib.version ? ib : ia;
    CHECK(first.kind == "keyframe");
    CHECK(second.kind == "delta");
    CHECK(second.base == first.version);
    lineage = ia.lineage;
  }
  opened s(d.path, {}, {});
  const auto next =
      s.content.put("run/last.safetensors",
                    format::memory_source(safetensors({{"w", std::vector<float>(400000, 0.5f)}})));
  CHECK(s.content.info(next).lineage == lineage);
}

TEST_CASE("an open reader pins its version until it is destroyed", "[content]") {
  temp_dir d;
  opened s(d.path, {});
  const std::string text(300000, 'q');
  const bytes data(reinterpret_cast<const std::byte*>(text.data()),
                   reinterpret_cast<const std::byte*>(text.data() + text.size()));
  const auto ref = s.content.put("notes/file.bin", format::memory_source(data));
  auto reader = s.content.open(ref);
  s.content.unref(ref);  // its last name goes while the read is in flight
  s.content.drop_caches();
  bytes out(data.size());
  CHECK(reader->read(0, out) == out.size());
  CHECK(out == data);
  const auto object = s.content.info(ref).object;
  CHECK(s.objects.disk_bytes(object) > 0);
  reader.reset();
  CHECK_THROWS_AS(s.content.info(ref), corrupt_error);  // reclaimed with the last pin...
  CHECK(s.objects.disk_bytes(object) > 0);              // ...its object goes after a sync
  sync_journal(s);
  CHECK(s.objects.disk_bytes(object) == 0);
  CHECK_THROWS_AS(s.content.info(ref), corrupt_error);
}

TEST_CASE("object ids are not reused after reclaimed versions (their records outlive them)",
          "[content]") {
  // Open 1: a file is stored, then deleted: its object is removed, its record stays.
  temp_dir d;
  const bytes a(50000, std::byte(1)), b(60000, std::byte(2));
  {
    opened s(d.path, {});
    const auto ra = s.content.put("a", format::memory_source(a));
    s.journal.sync();
    s.content.unref(ra);
    sync_journal(s);
    REQUIRE(s.objects.list().empty());
  }
  // Open 2: no object is left on disk; the next object must not take the old id.
  fs::content_ref rb;
  {
    opened s(d.path, {});
    rb = s.content.put("b", format::memory_source(b));
    s.journal.sync();
  }
  // Open 3: replay reclaims the deleted version again; b must survive it.
  opened s(d.path, {}, {rb});
  REQUIRE(read_all(s.content, rb) == b);
}

TEST_CASE("keyframes follow the chain after a rekey turned a version inside it into one",
          "[content]") {
  temp_dir d;
  fs::content_options opt;
  opt.bits = 3;
  opt.keyframe_interval = 4;
  std::mt19937_64 rng(9);
  drifting_weights big(50000, rng);
  std::vector<fs::content_ref> refs;
  auto put = [&](opened& s) {
    big.step(rng);
    refs.push_back(s.content.put("run/step_" + std::to_string(refs.size()) + ".safetensors",
                                 format::memory_source(safetensors({{"w", big.values}}))));
    return s.content.info(refs.back()).kind;
  };
  {
    opened s(d.path, opt);
    REQUIRE(put(s) == "keyframe");                  // v0
    REQUIRE(put(s) == "delta");                     // v1
    REQUIRE(put(s) == "delta");                     // v2: two deltas above v0
    REQUIRE(s.content.rekey(refs[1].version) > 0);  // v1 becomes a keyframe: v2 is one above it
    // The interval counts from v1 now: v3 and v4 are deltas (2 and 3 above v1), v5 a keyframe.
    // Counting from v0 would make v4 the keyframe.
    REQUIRE(put(s) == "delta");  // v3
    s.journal.sync();
  }
  // After a restart too: the records of v2 and v3 still carry the counters from before the rekey.
  opened s(d.path, opt, refs);
  REQUIRE(put(s) == "delta");     // v4
  REQUIRE(put(s) == "keyframe");  // v5
}

TEST_CASE("nonnegative tensors are stored as ratios (relative=on), within 2x of their value",
          "[content]") {
  for (auto scope : {codec::bucket_scope::tensor, codec::bucket_scope::checkpoint}) {
    for (bool relative : {true, false}) {
      CAPTURE(int(scope), relative);
      temp_dir d;
      fs::content_options opt;
      opt.scope = scope;
      opt.relative = relative;
      opt.exact_optimizer = false;  // "exp_avg_sq" names optimizer state
      opened s(d.path, opt);
      std::mt19937_64 rng(11);
      std::normal_distribution<float> w(0.0f, 0.05f), step(0.0f, 1e-3f);
      std::uniform_real_distribution<double> lg(std::log(1e-12), std::log(1e-3)), grow(-1, 4);
      std::vector<float> a(70000), v(20000);
      for (auto& x : a) x = w(rng);
      for (auto& x : v) x = float(std::exp(lg(rng)));
      for (int ver = 0; ver < 3; ++ver) {
        for (auto& x : a) x += step(rng);
        for (auto& x : v) x = float(x * std::exp2(grow(rng)));  // grows, as v early in training
        const bytes file = safetensors({{"w", a}, {"exp_avg_sq", v}});
        const auto ref = s.content.put("opt.safetensors", format::memory_source(file));
        if (ver == 0) continue;
        REQUIRE(s.content.info(ref).kind == "delta");
        const auto detail = s.content.detail(ref);
        REQUIRE(detail.tensors.size() == 2);
        // Gaussian steps: a grid (grid=auto, the default) per tensor; the paper's scope keeps the
        // paper's buckets.
        CHECK(detail.tensors[0].mode == (scope == codec::bucket_scope::tensor ? "grid" : "delta"));
        CHECK(detail.tensors[1].mode == (relative ? "ratio" : "delta"));
        const bytes out = read_all(s.content, ref);
        const auto got = floats_at(out, file.size() - 4 * v.size(), v.size());
        std::size_t far = 0;
        for (std::size_t i = 0; i < v.size(); ++i) far += got[i] < v[i] / 2 || got[i] > v[i] * 2;
        if (relative)
          CHECK(far == 0);
        else
          CHECK(far > v.size() / 10);  // differences leave the small ones behind
      }
    }
  }
}

TEST_CASE("ratio_bits codes second moments' ratio deltas with their own bits and nothing else",
          "[content]") {
  // Two stores fed the same versions, one with ratio_bits=1: the weights' frames come out the
  // same (a nonnegative norm scale, coded as ratios, included: ratio_bits is for second moments
  // by name), exp_avg_sq is smaller with one bit and still within 2x of its value element by
  // element, and each read back is the reconstruction the closed loop promises.
  for (auto scope : {codec::bucket_scope::tensor, codec::bucket_scope::checkpoint}) {
    CAPTURE(int(scope));
    temp_dir d3, d1;
    fs::content_options opt;
    opt.scope = scope;
    opt.exact_optimizer = false;
    opened s3(d3.path, opt);
    opt.ratio_bits = 1;
    opened s1(d1.path, opt);
    std::mt19937_64 rng(5);
    std::normal_distribution<float> w(0.0f, 0.05f), step(0.0f, 1e-3f);
    std::uniform_real_distribution<double> lg(std::log(1e-12), std::log(1e-3)), grow(-0.5, 1);
    std::vector<float> a(20000), g(20000), v(20000);
    for (auto& x : a) x = w(rng);
    for (auto& x : g) x = 1.0f + w(rng);
    for (auto& x : v) x = float(std::exp(lg(rng)));
    for (int ver = 0; ver < 3; ++ver) {
      for (auto& x : a) x += step(rng);
      for (auto& x : g) x += step(rng);
      for (auto& x : v) x = float(x * std::exp2(grow(rng)));
      const bytes file = safetensors({{"w", a}, {"norm.weight", g}, {"exp_avg_sq", v}});
      const auto r3 = s3.content.put("opt.safetensors", format::memory_source(file));
      const auto r1 = s1.content.put("opt.safetensors", format::memory_source(file));
      if (ver == 0) continue;
      const auto d3d = s3.content.detail(r3), d1d = s1.content.detail(r1);
      REQUIRE(d1d.tensors.size() == 3);
      CHECK(d1d.tensors[1].mode == "ratio");
      CHECK(d1d.tensors[2].mode == "ratio");
      CHECK(d1d.coding.bits == 3);
      CHECK(d1d.coding.ratio_bits == 1);
      CHECK(d3d.coding.ratio_bits == 0);
      const bytes out3 = read_all(s3.content, r3), out1 = read_all(s1.content, r1);
      const auto at_v = file.size() - 4 * v.size(), at_g = at_v - 4 * g.size();
      if (scope == codec::bucket_scope::tensor) {
        CHECK(d1d.tensors[0].stored_bytes == d3d.tensors[0].stored_bytes);
        CHECK(d1d.tensors[1].stored_bytes == d3d.tensors[1].stored_bytes);
        CHECK(floats_at(out1, at_g, g.size()) == floats_at(out3, at_g, g.size()));
      } else {
        // One ratio table for the norm's scale alone, where the other store's also saw v: 3
        // bits either way, not the second moments' 1 (which would halve it).
        CHECK(d1d.tensors[0].stored_bytes == d3d.tensors[0].stored_bytes);
        CHECK(d1d.tensors[1].stored_bytes * 5 >= d3d.tensors[1].stored_bytes * 4);
      }
      CHECK(d1d.tensors[2].stored_bytes < d3d.tensors[2].stored_bytes);
      CHECK(floats_at(out1, at_g - 4 * a.size(), a.size()) ==
            floats_at(out3, at_g - 4 * a.size(), a.size()));
      const auto got = floats_at(out1, at_v, v.size());
      std::size_t far = 0;
      for (std::size_t i = 0; i < v.size(); ++i) far += got[i] < v[i] / 2 || got[i] > v[i] * 2;
      CHECK(far == 0);
    }
  }
}

TEST_CASE("journal feature records: known ones are taken, unknown ones refuse the store",
          "[content]") {
  temp_dir d;
  opened s(d.path, {});
  auto record = [](const nlohmann::json& j) {
    const auto v = nlohmann::json::to_cbor(j);
    std::vector<std::byte> b(v.size());
    std::memcpy(b.data(), v.data(), v.size());
    return b;
  };
  CHECK(s.content.apply(record({{"t", "c.f"}, {"f", "shared_extents"}})));
  CHECK_THROWS_AS(s.content.apply(record({{"t", "c.f"}, {"f", "from_the_future"}})), corrupt_error);
  // A join naming lineages the journal never had is damage, not a crash.
  CHECK_THROWS_AS(s.content.apply(record({{"t", "c.j"}, {"l", 77}, {"into", 78}})), corrupt_error);
}

namespace {

// `saves` versions of one checkpoint (200k floats, every element moving a little each time, as
// weights do), stored as run/step_<i>.safetensors: a keyframe and deltas much smaller than it.
std::vector<fs::content_ref> training_run(fs::content_store& content, int saves, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> w(200000);
  for (auto& x : w) x = n(rng);
  std::vector<fs::content_ref> refs;
  for (int i = 0; i < saves; ++i) {
    for (auto& x : w) x += 0.01f * n(rng);
    refs.push_back(content.put("run/step_" + std::to_string(i) + ".safetensors",
                               format::memory_source(safetensors({{"w", w}}))));
  }
  return refs;
}

}  // namespace

TEST_CASE("rotation: a hidden chain is worth rewriting once it holds factor x a keyframe",
          "[content]") {
  temp_dir d;
  opened s(d.path, {});
  const auto refs = training_run(s.content, 14, 5);
  REQUIRE(s.content.info(refs[0]).kind == "keyframe");
  const std::uint64_t key = s.content.info(refs[0]).stored_bytes;
  const std::uint64_t delta = s.content.info(refs[1]).stored_bytes;
  REQUIRE(delta * 4 < key);  // the case rotation is about: deltas much smaller
  // Nothing deleted: nothing to look at.
  CHECK(!s.content.has_chain_hints());
  CHECK(s.content.chains_to_rewrite(1.25).empty());
  // The keyframe's name goes: hidden 1x a keyframe, below 1.25x: not yet (hint consumed).
  s.content.unref(refs[0]);
  CHECK(s.content.has_chain_hints());
  CHECK(s.content.chains_to_rewrite(1.25).empty());
  CHECK(!s.content.has_chain_hints());
  // More deletions: once keyframe + deltas >= 1.25 x keyframe, the oldest named delta is named.
  std::size_t first_named = 1;
  std::vector<fs::content_store::chain_rewrite> todo;
  while (todo.empty() && first_named < 12) {
    s.content.unref(refs[first_named++]);
    todo = s.content.chains_to_rewrite(1.25);
  }
  INFO("keyframe " << key << " delta " << delta << " named from " << first_named);
  REQUIRE(todo.size() == 1);
  CHECK(todo[0].version == refs[first_named].version);
  CHECK(todo[0].keyframe_bytes > 0);
  CHECK(double(todo[0].hidden_bytes) >= 1.25 * double(todo[0].keyframe_bytes));
  CHECK(double(todo[0].hidden_bytes) < 1.25 * double(todo[0].keyframe_bytes) + 2.0 * delta);
  // factor 0 turns it off (and forgets the hints).
  s.content.unref(refs[first_named]);
  CHECK(s.content.chains_to_rewrite(0).empty());
  CHECK(!s.content.has_chain_hints());
  // The rewrite frees the chain below it: nothing older than it is left.
  const std::uint64_t target = refs[first_named + 1].version;
  CHECK(s.content.rekey(target) > 0);
  CHECK(s.content.info(refs[first_named + 1]).kind == "keyframe");
  for (const auto& v : s.content.versions()) CHECK(v.version >= target);
}

TEST_CASE("rotation: hidden versions between a kept best checkpoint and newer ones are freed too",
          "[content]") {
  temp_dir d;
  opened s(d.path, {});
  const auto refs = training_run(s.content, 20, 6);
  REQUIRE(s.content.info(refs[0]).kind == "keyframe");
  // Kept: the keyframe (a "best" checkpoint) and the two newest; the run between goes. Its
  // deltas (not a keyframe: that stays) must outweigh the keyframe the rewrite costs.
  for (int i = 1; i < 18; ++i) s.content.unref(refs[i]);
  const auto todo = s.content.chains_to_rewrite(1.25);
  REQUIRE(todo.size() == 1);
  CHECK(todo[0].version == refs[18].version);  // the oldest named delta above the hidden run
  REQUIRE(s.content.rekey(todo[0].version) > 0);
  for (const auto& v : s.content.versions()) CHECK(v.refs > 0);  // the run is gone
  CHECK(s.content.versions().size() == 3);
}

// Drops the keyframe and the delta after it (refs[0], refs[1]) and returns rotation's estimate of
// rewriting the delta above them (refs[2]) as a keyframe: the one chain it offers.
namespace {
std::uint64_t estimate_without_first_two(fs::content_store& c,
                                         const std::vector<fs::content_ref>& refs) {
  c.unref(refs[0]);
  c.unref(refs[1]);
  const auto todo = c.chains_to_rewrite(1e-9);
  REQUIRE(todo.size() == 1);
  REQUIRE(todo[0].version == refs[2].version);
  return todo[0].keyframe_bytes;
}
}  // namespace

TEST_CASE("rotation: a rewrite's estimate follows the mantissa bits of its chain",
          "[content][heads]") {
  // The keyframe written under one keyframe_bits, the deltas after a remount under another:
  // deltas round only on a base with no more bits than they keep (8 -> 8, 8 -> 12), and the
  // estimate of rewriting the oldest named delta is the keyframe where its bits are the
  // keyframe's, more where they are not; never much below what the rewrite then writes.
  for (auto [first_kb, later_kb] : {std::pair{8, 8}, {0, 8}, {8, 12}, {12, 8}}) {
    INFO("keyframe_bits " << first_kb << " then " << later_kb);
    temp_dir d;
    fs::content_options opt;
    opt.keyframe_bits = first_kb;
    std::mt19937 rng(9);
    std::normal_distribution<float> n(0, 1);
    std::vector<float> w(200000);
    for (auto& x : w) x = n(rng);
    auto put = [&](fs::content_store& c, int i) {
      for (auto& x : w) x += 0.01f * n(rng);
      return c.put("run/step_" + std::to_string(i) + ".safetensors",
                   format::memory_source(safetensors({{"w", w}})));
    };
    std::vector<fs::content_ref> refs;
    {
      opened s(d.path, opt);
      refs.push_back(put(s.content, 0));
      s.journal.sync();
    }
    opt.keyframe_bits = later_kb;
    opened s(d.path, opt, refs);
    for (int i = 1; i < 4; ++i) refs.push_back(put(s.content, i));
    const int delta_bits = s.content.detail(refs[2]).coding.keyframe_bits;
    CHECK(delta_bits == (first_kb && first_kb <= later_kb ? later_kb : 0));
    const auto key = s.content.info(refs[0]);
    REQUIRE(key.kind == "keyframe");
    const std::uint64_t est = estimate_without_first_two(s.content, refs);
    const std::uint64_t logical = s.content.info(refs[2]).logical_bytes;
    // (stored_bytes and the object's size differ by its framing: 1 KiB is plenty.)
    const std::uint64_t want =
        delta_bits == first_kb || (!delta_bits && !first_kb)
            ? key.stored_bytes    // the same bits as the keyframe
            : key.stored_bytes +  // more: the keyframe plus the extra bits' noise
                  logical * std::uint64_t((delta_bits ? delta_bits : 23) - first_kb) / 32;
    CHECK(double(est) == Approx(double(want)).margin(1024));
    REQUIRE(s.content.rekey(refs[2].version) > 0);
    const std::uint64_t wrote = s.content.info(refs[2]).stored_bytes;
    CHECK(double(wrote) <= 1.15 * double(est));
  }
}

TEST_CASE("rotation: a rewrite's estimate counts what its keyframe held as values and it will not",
          "[content][heads]") {
  // A lineage's first keyframe codes exp_avg as values by its name. Saved often, exp_avg moves
  // little and the deltas code it as a difference, so rewriting one as a keyframe codes it
  // exactly: the estimate must count that (it once was the keyframe's size alone, under half of
  // what the rewrite wrote). Saved rarely, exp_avg is new each time and the deltas code it as
  // values too: the rewrite copies it and the estimate stays the keyframe's size. Both survive
  // a reopen.
  for (const bool often : {true, false}) {
    INFO((often ? "exp_avg moving little" : "exp_avg new at every version"));
    temp_dir d;
    fs::content_options opt;
    opt.keyframe_bits = 12;
    std::mt19937_64 rng(41);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> w(100000), m(100000);
    for (auto& x : w) x = n(rng);
    for (auto& x : m) x = 1e-3f * n(rng);
    auto put = [&](fs::content_store& c) {
      for (auto& x : w) x += 0.01f * n(rng);
      for (auto& x : m) x = often ? x + 1e-5f * n(rng) : 1e-3f * n(rng);
      return c.put("opt.safetensors",
                   format::memory_source(safetensors({{"w", w}, {"state.0.exp_avg", m}})));
    };
    std::vector<fs::content_ref> refs;
    {
      opened s(d.path, opt);
      for (int i = 0; i < 4; ++i) refs.push_back(put(s.content));
      REQUIRE(s.content.detail(refs[0]).tensors.at(1).mode == "intra");
      const bool m_values = s.content.detail(refs[2]).tensors.at(1).mode == "intra";
      REQUIRE(m_values == !often);
      s.journal.sync();
    }
    opened s(d.path, opt, refs);  // the estimate from what the journal recorded
    const auto key = s.content.info(refs[0]);
    const std::uint64_t est = estimate_without_first_two(s.content, refs);
    if (!often) CHECK(double(est) == Approx(double(key.stored_bytes)).margin(1024));
    if (often) CHECK(est > key.stored_bytes + m.size());  // m at 12 bits: about 2 bytes each
    REQUIRE(s.content.rekey(refs[2].version) > 0);
    const std::uint64_t wrote = s.content.info(refs[2]).stored_bytes;
    CHECK(double(wrote) <= 1.15 * double(est));
    CHECK(double(wrote) >= 0.7 * double(est));
  }
}

TEST_CASE("a tensor its base does not predict (Adam's m) is coded as values with intra=on",
          "[content]") {
  // Stores fed the same versions, intra on (the default), on keeping every bucket, and off: the
  // weights' frames come out the same; the first moment, new at every version, is coded as
  // values: fewer bytes by default, less error with as many buckets as a delta has, no element
  // further from its value than zero is, and read back as the reconstruction.
  temp_dir don, dall, doff;
  fs::content_options opt;
  opt.exact_optimizer = false;  // "exp_avg" names optimizer state
  opened on(don.path, opt);
  opt.intra_buckets = 7;
  opened all(dall.path, opt);
  opt.intra = false;
  opened off(doff.path, opt);
  std::mt19937_64 rng(12);
  std::normal_distribution<float> w(0.0f, 0.05f), step(0.0f, 1e-3f);
  std::exponential_distribution<float> mag(1000.0f);
  std::bernoulli_distribution coin(0.5);
  std::vector<float> a(70000), m(70000);
  for (auto& x : a) x = w(rng);
  for (int ver = 0; ver < 4; ++ver) {
    for (auto& x : a) x += step(rng);
    for (auto& x : m) x = 0.2f * x + (coin(rng) ? 1.0f : -1.0f) * mag(rng);
    const bytes file = safetensors({{"w", a}, {"exp_avg", m}});
    const auto ron = on.content.put("opt.safetensors", format::memory_source(file));
    const auto roff = off.content.put("opt.safetensors", format::memory_source(file));
    const auto rall = all.content.put("opt.safetensors", format::memory_source(file));
    if (ver == 0) continue;
    const auto don_d = on.content.detail(ron), doff_d = off.content.detail(roff);
    REQUIRE(don_d.tensors.size() == 2);
    CHECK(don_d.tensors[0].mode == "grid");
    CHECK(don_d.tensors[1].mode == "intra");
    CHECK(doff_d.tensors[1].mode == "grid");  // as a difference, on a grid (grid=auto)
    CHECK(don_d.tensors[0].stored_bytes == doff_d.tensors[0].stored_bytes);
    CHECK(don_d.tensors[1].stored_bytes < doff_d.tensors[1].stored_bytes * 3 / 4);
    const bytes out = read_all(on.content, ron);
    const auto at_m = file.size() - 4 * m.size();
    const auto got = floats_at(out, at_m, m.size());
    CHECK(beyond_value(got, m) == 0);
    // What the store measured is what was read.
    double e = 0, r = 0;
    for (std::size_t i = 0; i < m.size(); ++i) {
      e += double(got[i] - m[i]) * double(got[i] - m[i]);
      r += double(m[i]) * double(m[i]);
    }
    CHECK(don_d.tensors[1].rel_error == Approx(std::sqrt(e / r)).epsilon(1e-6));
    CHECK(all.content.detail(rall).tensors[1].rel_error < doff_d.tensors[1].rel_error);
  }
}

TEST_CASE("a first moment's intra slabs keep one bucket fewer than other tensors' by default",
          "[content]") {
  // The same values under Adam's name (exp_avg) and SGD's (momentum_buffer), new at every
  // version so that both are coded as values: by default Adam's m keeps 2^bits - 4 buckets and
  // the momentum buffer 2^bits - 3; with intra_buckets set both keep that many.
  temp_dir ddef, dfive;
  fs::content_options opt;
  opt.exact_optimizer = false;
  opened def(ddef.path, opt);
  opt.intra_buckets = 5;
  opened five(dfive.path, opt);
  std::mt19937_64 rng(17);
  std::exponential_distribution<float> mag(1000.0f);
  std::bernoulli_distribution coin(0.5);
  std::vector<float> m(70000);
  for (int ver = 0; ver < 3; ++ver) {
    for (auto& x : m) x = 0.2f * x + (coin(rng) ? 1.0f : -1.0f) * mag(rng);
    const bytes file = safetensors({{"state.0.exp_avg", m}, {"state.1.momentum_buffer", m}});
    const auto rd = def.content.put("opt.safetensors", format::memory_source(file));
    const auto rf = five.content.put("opt.safetensors", format::memory_source(file));
    if (ver == 0) continue;
    const auto dd = def.content.detail(rd), df = five.content.detail(rf);
    REQUIRE(dd.tensors.size() == 2);
    const auto& [adam, sgd] = std::tie(dd.tensors[0], dd.tensors[1]);
    REQUIRE(adam.name.find("exp_avg") != std::string::npos);
    CHECK(adam.mode == "intra");
    CHECK(sgd.mode == "intra");
    // Fewer buckets: fewer bytes, more error, still no element further than zero is.
    CHECK(adam.stored_bytes < sgd.stored_bytes);
    CHECK(adam.rel_error > sgd.rel_error);
    const bytes out = read_all(def.content, rd);
    CHECK(beyond_value(floats_at(out, file.size() - 8 * m.size(), m.size()), m) == 0);
    // The momentum buffer is what the explicit 5 gives both.
    for (const auto& t : df.tensors) {
      CHECK(t.stored_bytes == sgd.stored_bytes);
      CHECK(t.rel_error == Approx(sgd.rel_error).epsilon(1e-9));
    }
  }
}

TEST_CASE("weights' differences on a grid with grid=auto: fewer bytes at the buckets' error",
          "[content]") {
  // Weights taking Gaussian steps, fed to stores with grid off (the buckets), auto and a fixed
  // step: auto codes them on a grid (mode "grid") in fewer bytes with no more error, every
  // element within the closed loop's bound of what its base read back as.
  temp_dir doff, dauto, dstep;
  fs::content_options opt;
  opt.grid_step = 0;
  opened off(doff.path, opt);
  opt.grid_step = fs::content_options::kAutoGrid;
  opened automatic(dauto.path, opt);
  opt.grid_step = 1.0;
  opened fixed(dstep.path, opt);
  std::mt19937_64 rng(13);
  std::normal_distribution<float> w(0.0f, 0.05f), step(0.0f, 1e-3f);
  std::vector<float> a(70000), prev_read;
  for (auto& x : a) x = w(rng);
  std::uint64_t bytes_off = 0, bytes_auto = 0;
  for (int ver = 0; ver < 5; ++ver) {
    for (auto& x : a) x += step(rng);
    const bytes file = safetensors({{"w", a}});
    const auto roff = off.content.put("w.safetensors", format::memory_source(file));
    const auto rauto = automatic.content.put("w.safetensors", format::memory_source(file));
    const auto rstep = fixed.content.put("w.safetensors", format::memory_source(file));
    const auto got =
        floats_at(read_all(automatic.content, rauto), file.size() - 4 * a.size(), a.size());
    if (ver > 0) {
      const auto doff_d = off.content.detail(roff), dauto_d = automatic.content.detail(rauto);
      CHECK(doff_d.tensors.at(0).mode == "delta");
      CHECK(dauto_d.tensors.at(0).mode == "grid");
      CHECK(fixed.content.detail(rstep).tensors.at(0).mode == "grid");
      bytes_off += doff_d.tensors[0].stored_bytes;
      bytes_auto += dauto_d.tensors[0].stored_bytes;
      CHECK(dauto_d.tensors[0].rel_error <= doff_d.tensors[0].rel_error * 1.02);
      std::size_t outside = 0;
      double e = 0, r = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        outside += std::fabs(double(got[i]) - a[i]) > std::fabs(double(a[i]) - prev_read[i]);
        e += (double(got[i]) - a[i]) * (double(got[i]) - a[i]);
        r += double(a[i]) * a[i];
      }
      CHECK(outside == 0);
      CHECK(dauto_d.tensors[0].rel_error == Approx(std::sqrt(e / r)).epsilon(1e-6));
    }
    prev_read = got;
  }
  CHECK(double(bytes_auto) < 0.9 * double(bytes_off));
}

TEST_CASE("grid=auto keeps the buckets where its estimate does not hold", "[content]") {
  // bf16 weights (the estimate models fp32: near bf16's unit a grid's candidates round back to
  // the base), the paper's coding, and a fixed step on a tensor that did not change (no step to
  // take): the buckets, mode "delta".
  std::mt19937_64 rng(14);
  std::normal_distribution<float> w(0.0f, 0.05f), step(0.0f, 1e-3f);
  std::vector<float> a(70000);
  for (auto& x : a) x = w(rng);
  fs::content_options paper;
  paper.paper_coding = true;
  fs::content_options fixed;
  fixed.grid_step = 1.0;
  struct store_case {
    const char* what;
    fs::content_options opt;
    bool bf16, changes;
  };
  for (const auto& c : {store_case{"bf16", {}, true, true}, store_case{"paper", paper, false, true},
                        store_case{"unchanged", fixed, false, false}}) {
    INFO(c.what);
    temp_dir d;
    opened s(d.path, c.opt);
    auto b = a;
    for (int ver = 0; ver < 3; ++ver) {
      if (c.changes)
        for (auto& x : b) x += step(rng);
      const bytes file = safetensors({{"w", b}}, c.bf16);
      const auto ref = s.content.put("w.safetensors", format::memory_source(file));
      if (ver == 0) continue;
      REQUIRE(s.content.info(ref).kind == "delta");
      CHECK(s.content.detail(ref).tensors.at(0).mode == "delta");
      if (!c.changes) CHECK(read_all(s.content, ref) == file);
    }
  }
}

TEST_CASE("a tensor of several slabs codes each its own way: values, differences, ratios",
          "[content]") {
  // 48 MiB of fp32 in one tensor, three 16 MiB slabs: the first new at every version (intra),
  // the second moving a little (a difference), the third nonnegative (ratios). The frame mixes
  // the three block codecs; every element reads back within its slab's bound, also in pieces.
  temp_dir d;
  fs::content_options opt;
  opt.exact_optimizer = false;
  opened s(d.path, opt);
  const std::size_t slab = std::size_t(4) << 20, n = 3 * slab;
  std::mt19937_64 rng(21);
  std::normal_distribution<float> w(0.0f, 0.05f), step(0.0f, 1e-3f);
  std::vector<float> x(n), prev_read;
  for (auto& v : x) v = w(rng);
  for (std::size_t i = 2 * slab; i < n; ++i) x[i] = std::fabs(x[i]) + 1e-3f;
  for (int ver = 0; ver < 3; ++ver) {
    for (std::size_t i = 0; i < slab; ++i) x[i] = w(rng);  // new values
    for (std::size_t i = slab; i < 2 * slab; ++i) x[i] += step(rng);
    for (std::size_t i = 2 * slab; i < n; ++i) x[i] = std::fabs(x[i] + step(rng));
    const bytes file = safetensors({{"exp_avg", x}});
    const auto ref = s.content.put("mixed.safetensors", format::memory_source(file));
    const bytes out = read_all(s.content, ref);
    const auto got = floats_at(out, file.size() - 4 * n, n);
    if (ver > 0) {
      REQUIRE(s.content.info(ref).kind == "delta");
      CHECK(s.content.detail(ref).tensors.at(0).mode == "ratio+intra");
      std::array<std::size_t, 3> outside{};
      for (std::size_t i = 0; i < n; ++i) {
        const double e = std::fabs(double(got[i]) - x[i]);
        const double bound =
            i < slab ? std::fabs(double(x[i])) : std::fabs(double(x[i]) - prev_read[i]);
        outside[i / slab] += e > bound;
      }
      CHECK(outside == std::array<std::size_t, 3>{});
      // A piece across the slab boundaries reads as the whole does.
      const std::uint64_t at = file.size() - 4 * n + 4 * (slab - 1000);
      bytes piece(4 * (slab + 2000));
      REQUIRE(s.content.open(ref)->read(at, piece) == piece.size());
      CHECK(std::equal(piece.begin(), piece.end(), out.begin() + std::ptrdiff_t(at)));
    }
    prev_read = got;
  }
}

TEST_CASE("a keyframe codes as values what its previous head coded as values", "[content]") {
  // keyframe_interval=3: versions 0 and 3 are keyframes. "m" (SGD's momentum buffer: optimizer
  // state whose name does not say it is coded as values) is new at every version: version 2
  // coded it as values, so the keyframe codes it so too (mode intra, a fraction of version 0's
  // bytes, within |u|, read back the same after a reopen); the weights stay rounded.
  temp_dir d;
  fs::content_options opt;
  opt.exact_optimizer = false;
  opt.keyframe_interval = 3;
  opt.keyframe_bits = 12;
  std::mt19937_64 rng(31);
  std::normal_distribution<float> w(0.0f, 0.05f), step(0.0f, 1e-3f);
  std::exponential_distribution<float> mag(1000.0f);
  std::bernoulli_distribution coin(0.5);
  std::vector<float> a(40000), m(40000);
  for (auto& x : a) x = w(rng);
  std::vector<fs::content_ref> refs;
  std::vector<bytes> files, before(5);
  {
    opened s(d.path, opt);
    for (int ver = 0; ver < 5; ++ver) {
      for (auto& x : a) x += step(rng);
      for (auto& x : m) x = 0.2f * x + (coin(rng) ? 1.0f : -1.0f) * mag(rng);
      files.push_back(safetensors({{"w", a}, {"state.0.momentum_buffer", m}}));
      refs.push_back(s.content.put("opt.safetensors", format::memory_source(files.back())));
    }
    const auto k0 = s.content.detail(refs[0]), k3 = s.content.detail(refs[3]);
    REQUIRE(s.content.info(refs[3]).kind == "keyframe");
    CHECK(k0.tensors[1].mode == "rounded");  // no head before it, no name: nothing to follow
    CHECK(k3.tensors[0].mode == "rounded");
    CHECK(k3.tensors[1].mode == "intra");
    CHECK(k3.tensors[1].stored_bytes * 4 < k0.tensors[1].stored_bytes);
    CHECK(s.content.detail(refs[4]).tensors[1].mode == "intra");
    const bytes out = read_all(s.content, refs[3]);
    const auto u = floats_at(files[3], files[3].size() - 4 * m.size(), m.size());
    const auto got = floats_at(out, files[3].size() - 4 * m.size(), m.size());
    CHECK(beyond_value(got, u) == 0);
    CHECK(k3.tensors[1].rel_error > 0.1);  // lossy, as a delta's m is
    for (std::size_t v = 3; v < 5; ++v) before[v] = read_all(s.content, refs[v]);
    // A rewrite of delta 4 as a keyframe (rotation's rekey) keeps its values frame as it is:
    // the same bytes read, about the same size, no base needed.
    const auto m4 = s.content.detail(refs[4]).tensors[1].stored_bytes;
    REQUIRE(s.content.rekey(refs[4].version) > 0);
    REQUIRE(s.content.info(refs[4]).kind == "keyframe");
    const auto r4 = s.content.detail(refs[4]).tensors[1];
    CHECK(r4.mode == "intra");
    CHECK(r4.stored_bytes <= m4 + 4096);
    CHECK(read_all(s.content, refs[4]) == before[4]);
  }
  opened again(d.path, opt, refs);
  for (std::size_t v = 3; v < 5; ++v) {
    opened& s = again;
    const bytes out = read_all(s.content, refs[v]);
    CHECK(out == before[v]);
    const auto got = floats_at(out, files[v].size() - 4 * m.size(), m.size());
    const auto u = floats_at(files[v], files[v].size() - 4 * m.size(), m.size());
    CHECK(beyond_value(got, u) == 0);
  }
}

TEST_CASE("a lineage's first keyframe codes a first moment as values by its name", "[content]") {
  // No head before version 0: the names decide. exp_avg (Adam's m) is coded as values (mode intra,
  // within |u|, under 4 bits per element where rounding to 12 bits costs over 12), "m" and the
  // weights are rounded. A head that coded exp_avg as a difference (a slowly moving one, saved
  // often) outweighs the name at the next keyframe. With intra=off, exact keyframes, the paper's
  // whole-checkpoint tables or keyframe_interval=1 the name changes nothing.
  std::mt19937_64 rng(32);
  std::normal_distribution<float> w(0.0f, 0.05f), step(0.0f, 1e-3f);
  std::exponential_distribution<float> mag(1000.0f);
  std::bernoulli_distribution coin(0.5);
  const std::size_t n = 40000;
  std::vector<float> a(n), m(n);
  for (auto& x : a) x = w(rng);
  for (auto& x : m) x = (coin(rng) ? 1.0f : -1.0f) * mag(rng);
  auto file = [&] {
    return safetensors(
        {{"w", a}, {"state.0.exp_avg", m}, {"state.1.momentum_buffer", m}, {"m", m}});
  };
  auto mode_of = [](const auto& det, std::string_view name) {
    for (const auto& t : det.tensors)
      if (t.name == name) return t;
    FAIL("no tensor " << name);
    return det.tensors.front();
  };
  SECTION("defaults of the mount: lossy keyframes, intra on") {
    temp_dir d;
    fs::content_options opt;
    opt.keyframe_interval = 3;
    opt.keyframe_bits = 12;
    opened s(d.path, opt);
    const bytes f0 = file();
    const auto r0 = s.content.put("opt.safetensors", format::memory_source(f0));
    const auto k0 = s.content.detail(r0);
    CHECK(mode_of(k0, "w").mode == "rounded");
    CHECK(mode_of(k0, "m").mode == "rounded");
    CHECK(mode_of(k0, "state.1.momentum_buffer").mode == "rounded");  // SGD's: its base predicts it
    const auto t = mode_of(k0, "state.0.exp_avg");
    CHECK(t.mode == "intra");
    CHECK(t.stored_bytes * 8 < 4 * n);
    CHECK(t.rel_error > 0.1);  // lossy, as a delta's m is
    CHECK(mode_of(k0, "m").stored_bytes * 8 > 12 * n);
    // exp_avg's bytes: the tensors are laid out in order, three of n floats after it.
    const std::size_t at = f0.size() - 4 * n * 3;
    CHECK(beyond_value(floats_at(read_all(s.content, r0), at, n), floats_at(f0, at, n)) == 0);
    // exp_avg moving slowly now (a save every step): the deltas code it as a difference, and
    // the keyframe at version 3 follows them, not the name.
    std::vector<fs::content_ref> refs{r0};
    for (int ver = 1; ver < 4; ++ver) {
      for (auto& x : a) x += step(rng);
      for (auto& x : m) x *= 1.001f;
      refs.push_back(s.content.put("opt.safetensors", format::memory_source(file())));
    }
    REQUIRE(s.content.info(refs[3]).kind == "keyframe");
    CHECK(mode_of(s.content.detail(refs[2]), "state.0.exp_avg").mode != "intra");
    CHECK(mode_of(s.content.detail(refs[3]), "state.0.exp_avg").mode == "rounded");
  }
  SECTION("where the name changes nothing") {
    // intra=off; exact keyframes; the paper's whole-checkpoint tables, whose deltas never code
    // values; keyframe_interval=1, where no delta ever says what the tensor is.
    for (const char* what : {"intra=off", "keyframe_bits=0", "scope=checkpoint", "interval 1"}) {
      INFO(what);
      const std::string_view w = what;
      temp_dir d;
      fs::content_options opt;
      opt.keyframe_bits = w == "keyframe_bits=0" ? 0 : 12;
      opt.intra = w != "intra=off";
      if (w == "scope=checkpoint") opt.scope = codec::bucket_scope::checkpoint;
      if (w == "interval 1") opt.keyframe_interval = 1;
      opened s(d.path, opt);
      const auto k0 =
          s.content.detail(s.content.put("opt.safetensors", format::memory_source(file())));
      const char* want = w == "keyframe_bits=0" ? "lossless" : "rounded";
      CHECK(mode_of(k0, "state.0.exp_avg").mode == want);
      CHECK(mode_of(k0, "state.1.momentum_buffer").mode == want);
    }
  }
}

TEST_CASE("a lower min_tensor continues a lineage: small tensors are coded, not a new identity",
          "[content]") {
  temp_dir d;
  fs::content_options opt;  // min_tensor 4 KiB: the 1 KiB bias is stored exactly
  std::mt19937_64 rng(61);
  drifting_weights w(50'000, rng), b(256, rng);
  auto file = [&] {
    w.step(rng);
    b.step(rng);
    return safetensors({{"w", w.values}, {"b", b.values}});
  };
  std::vector<fs::content_ref> refs;
  {
    opened s(d.path, opt);
    for (int k = 0; k < 2; ++k)
      refs.push_back(s.content.put("run/step_" + std::to_string(k) + ".safetensors",
                                   format::memory_source(file())));
    CHECK(s.content.detail(refs.back()).tensors.size() == 1);  // w only
    s.journal.sync();
  }
  opt.min_tensor_bytes = 256;
  opened s(d.path, opt, refs);
  const auto r = s.content.put("run/step_2.safetensors", format::memory_source(file()));
  const auto i = s.content.info(r);
  CHECK(i.kind == "delta");
  CHECK(i.lineage == s.content.info(refs.front()).lineage);
  CHECK(i.base == refs.back().version);
  const auto det = s.content.detail(r);
  REQUIRE(det.tensors.size() == 2);  // b is coded now (without a base: its first frame)
  CHECK(std::any_of(det.tensors.begin(), det.tensors.end(),
                    [](const auto& t) { return t.name == "b" && t.mode == "lossless"; }));
  const auto next = s.content.put("run/step_3.safetensors", format::memory_source(file()));
  for (const auto& t : s.content.detail(next).tensors) CHECK(t.mode != "lossless");
}
