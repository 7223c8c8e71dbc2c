// Head images (fs/content/head_store.hpp): the staged bytes of a large checkpoint, rewritten in
// place by the write path, must be exactly what the version reads as through its chain (tensor
// payloads and zip CRC fields included), serve reads and bases, be published to the heads
// directory, be found again after a restart, and stale files there must go.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <random>

#include "codec/error.hpp"
#include "codec/format/crc32.hpp"
#include "codec/format/recognise.hpp"
#include "codec/format/source.hpp"
#include "codec/mantissa.hpp"
#include "content_test_util.hpp"
#include "fs/content/head_store.hpp"
#include "tests/unit/format_test_util.hpp"

using namespace ckpt;
using namespace ckpt::test;

namespace {

// Staged bytes as the filesystem's write buffer holds them, here all in memory until the head
// store asks for a backing file (an unlinked O_TMPFILE, as the write buffer's staging file).
class memory_staged final : public fs::staged_file {
 public:
  memory_staged(bytes b, std::string dir) : bytes_(std::move(b)), size_(bytes_.size()), dir_(dir) {}
  ~memory_staged() override {
    if (fd_ >= 0) ::close(fd_);
  }
  std::uint64_t size() const override { return size_; }
  void read_fully(std::uint64_t off, std::span<std::byte> out) const override {
    // No Catch macros here: the write path reads bases on threads of its own, and Catch2 is not
    // thread-safe. A failure throws, and fails the put that reads.
    if (in_file_) {
      if (::pread(fd_, out.data(), out.size(), off_t(off)) != ssize_t(out.size()))
        throw ckpt::io_error(EIO, "memory_staged: short read");
      return;
    }
    std::memcpy(out.data(), bytes_.data() + off, out.size());
  }
  void overwrite(std::uint64_t off, std::span<const std::byte> data) override {
    modified_ = true;
    std::memcpy(bytes_.data() + off, data.data(), data.size());
  }
  bool modified() const override { return modified_; }
  int backing_file() override {
    if (fd_ < 0) fd_ = ::open(dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd_ < 0) throw ckpt::io_error(errno, "O_TMPFILE");
    return fd_;
  }
  void copy_memory_to_file() const override {  // on the head store's worker thread
    if (::pwrite(fd_, bytes_.data(), bytes_.size(), 0) != ssize_t(bytes_.size()))
      throw ckpt::io_error(EIO, "memory_staged: short write");
  }
  void drop_memory() override {
    in_file_ = true;
    bytes_ = {};
  }
  std::uint64_t memory_bytes() const override { return bytes_.size(); }

 private:
  bytes bytes_;
  std::uint64_t size_;
  std::string dir_;
  int fd_ = -1;
  bool in_file_ = false, modified_ = false;
};

// Head images in DIR/heads for every checkpoint of 1 MiB of tensors or more.
fs::content_options heads_options(const temp_dir& d) {
  fs::content_options opt;
  opt.heads_dir = (d.path / "heads").string();
  opt.head_min = 1 << 20;
  return opt;
}

// A torch.save-like zip: data.pkl, two float storages of n elements and an int64 one, CRCs set.
bytes torch_like(const std::vector<float>& a, const std::vector<float>& b) {
  using namespace ckpt::format::test;
  pickle_writer p;
  p.proto(2).op('}').op('(');
  p.str("a").tensor("0", "FloatStorage", std::int32_t(a.size()), 0, {std::int32_t(a.size())}, {1});
  p.str("b").tensor("1", "FloatStorage", std::int32_t(b.size()), 0, {std::int32_t(b.size())}, {1});
  p.str("step").tensor("2", "LongStorage", 1, 0, {}, {});
  p.op('u').stop();
  zip_writer z;
  z.add("ckpt/data.pkl", p.out);
  auto floats = [](const std::vector<float>& v) {
    bytes out(4 * v.size());
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  };
  z.add("ckpt/data/0", floats(a));
  z.add("ckpt/data/1", floats(b));
  bytes one(8);
  one[0] = std::byte(7);
  z.add("ckpt/data/2", one);
  z.add("ckpt/version", bytes_of("3\n"));
  return z.finish();
}

// A checkpoint of two drifting tensors (2.4 MB), a training step further at each next(): its
// bytes staged as the write buffer stages them.
struct drifting_checkpoint {
  std::mt19937_64 rng;
  drifting_weights a, b;
  std::string heads_dir;
  drifting_checkpoint(std::uint64_t seed, std::string dir)
      : rng(seed), a(600'000, rng), b(1000, rng), heads_dir(std::move(dir)) {}
  std::shared_ptr<memory_staged> next() {
    a.step(rng);
    b.step(rng);
    return std::make_shared<memory_staged>(torch_like(a.values, b.values), heads_dir);
  }
};

// Every CRC the served zip names matches its member's served bytes (what torch.load checks).
void check_crcs(const bytes& served) {
  const auto l = format::recognise(format::memory_source(served));
  REQUIRE(l.format == format::file_format::torch_zip);
  REQUIRE(!l.members.empty());
  for (const auto& fx : l.fixups) {
    const auto& m = l.members.at(fx.member);
    const std::uint32_t want =
        format::crc32(0, std::span(served).subspan(m.data_offset, m.data_length));
    std::uint32_t field;
    std::memcpy(&field, served.data() + fx.field_offset, 4);
    INFO("member " << m.name);
    CHECK((field == 0 || field == want));
  }
}

}  // namespace

TEST_CASE("head images read exactly as the chain decodes, and are kept across a restart",
          "[content][heads]") {
  temp_dir d;
  fs::content_options opt = heads_options(d);
  opt.keyframe_interval = 20;
  std::mt19937_64 rng(31);
  drifting_weights a(700'000, rng), b(300'000, rng);  // 4 MiB in all: a head image each version
  std::vector<fs::content_ref> refs;
  std::vector<bytes> served;
  {
    opened s(d.path, opt);
    for (int v = 0; v < 4; ++v) {
      a.step(rng);
      b.step(rng);
      const bytes file = torch_like(a.values, b.values);
      auto staged = std::make_shared<memory_staged>(file, opt.heads_dir);
      refs.push_back(s.content.put("run/step_" + std::to_string(v) + ".pt", staged));
      // A keyframe is stored losslessly: its staged bytes already are what it reads as.
      CHECK(staged->modified() == (v > 0));
      s.content.wait_heads();
      const auto head = s.content.published_head(refs.back());
      REQUIRE(head);
      REQUIRE(head->backing_fd() >= 0);
      CHECK(s.content.info(refs.back()).head_bytes == file.size());
      // The previous version is no longer a head.
      if (v > 0) CHECK_FALSE(s.content.published_head(refs[std::size_t(v) - 1]));
      served.push_back(read_all(s.content, refs.back()));  // from the head image
      check_crcs(served.back());
      // The image file holds exactly those bytes.
      bytes from_file(served.back().size());
      REQUIRE(::pread(head->backing_fd(), from_file.data(), from_file.size(), 0) ==
              ssize_t(from_file.size()));
      CHECK(from_file == served.back());
    }
    s.journal.sync();
  }
  // The same versions decoded through their chains (no head images): the same bytes.
  {
    fs::content_options plain = opt;
    plain.heads_dir.clear();
    opened s(d.path, plain, refs);
    for (std::size_t v = 0; v < refs.size(); ++v) {
      INFO("version " << v);
      CHECK_FALSE(s.content.published_head(refs[v]));
      REQUIRE(read_all(s.content, refs[v]) == served[v]);
    }
  }
  // A restart finds the newest version's image again; files that are not a current head go.
  {
    std::ofstream(opt.heads_dir + "/junk.tmp") << "x";
    std::ofstream(opt.heads_dir + "/00000000000000ff-0000000000000001.head") << "stale";
    opened s(d.path, opt, refs);
    const auto head = s.content.published_head(refs.back());
    REQUIRE(head);
    CHECK(read_all(s.content, refs.back()) == served.back());
    std::size_t files = 0;
    for (const auto& e : bfs::directory_iterator(opt.heads_dir)) {
      ++files;
      CHECK(e.path().extension() == ".head");
    }
    CHECK(files == 1);
    // The next version takes its base from the image, and becomes the head in turn.
    a.step(rng);
    b.step(rng);
    const bytes file = torch_like(a.values, b.values);
    const auto r =
        s.content.put("run/step_9.pt", std::make_shared<memory_staged>(file, opt.heads_dir));
    CHECK(s.content.info(r).kind == "delta");
    s.content.wait_heads();
    REQUIRE(s.content.published_head(r));
    const bytes newest = read_all(s.content, r);
    check_crcs(newest);
    s.content.drop_caches();
    fs::content_options plain = opt;
    plain.heads_dir.clear();
    s.journal.sync();
    std::vector<fs::content_ref> live = refs;
    live.push_back(r);
    opened chain(d.path, plain, live);
    CHECK(read_all(chain.content, r) == newest);
  }
}

TEST_CASE("small checkpoints get no head image, and a put from a plain source none either",
          "[content][heads]") {
  temp_dir d;
  fs::content_options opt;
  opt.heads_dir = (d.path / "heads").string();
  opt.head_min = 64 << 20;
  opened s(d.path, opt);
  std::mt19937_64 rng(5);
  drifting_weights a(100'000, rng), b(100, rng);
  const bytes file = torch_like(a.values, b.values);
  auto staged = std::make_shared<memory_staged>(file, opt.heads_dir);
  const auto r1 = s.content.put("m.pt", staged);
  s.content.wait_heads();
  CHECK_FALSE(s.content.published_head(r1));
  CHECK_FALSE(staged->modified());
  opt.head_min = 0;
  const auto r2 = s.content.put("n.pt", format::memory_source(file));  // nothing to keep
  s.content.wait_heads();
  CHECK_FALSE(s.content.published_head(r2));
}

TEST_CASE("an unusable heads directory is logged as an error, and versions decode their chains",
          "[content][heads]") {
  temp_dir d;
  fs::content_options opt;
  opt.heads_dir = (d.path / "not-a-dir" / "heads").string();
  opt.head_min = 1 << 20;
  std::ofstream(d.path / "not-a-dir") << "a file where the scratch directory should be";
  opened s(d.path, opt);
  log_lines log;
  s.content.set_logger(log.sink());  // the problem was found at open: reported now
  CHECK(log.count(fs::log_level::error, "head images are off") == 1);
  std::mt19937_64 rng(9);
  drifting_weights a(500'000, rng), b(1000, rng);
  std::vector<fs::content_ref> refs;
  std::vector<bytes> served;
  for (int v = 0; v < 2; ++v) {
    a.step(rng);
    b.step(rng);
    const bytes file = torch_like(a.values, b.values);
    refs.push_back(
        s.content.put("run/ckpt.pt", std::make_shared<memory_staged>(file, d.path.string())));
    served.push_back(read_all(s.content, refs.back()));
  }
  s.content.wait_heads();
  CHECK(s.content.info(refs[1]).kind == "delta");
  CHECK_FALSE(s.content.published_head(refs[1]));
  s.content.drop_caches();
  CHECK(read_all(s.content, refs[1]) == served[1]);
  CHECK(log.count(fs::log_level::error) == 1);  // said once
}

TEST_CASE("a missing head image is rebuilt from the chain at startup", "[content][heads]") {
  temp_dir d;
  fs::content_options opt = heads_options(d);
  std::mt19937_64 rng(77);
  drifting_weights a(500'000, rng), b(200'000, rng);
  std::vector<fs::content_ref> refs;
  bytes newest;
  {
    // Written with heads off (a store from before them, or a crash before publication).
    fs::content_options off = opt;
    off.heads_dir.clear();
    opened s(d.path, off);
    for (int v = 0; v < 3; ++v) {
      a.step(rng);
      b.step(rng);
      const bytes file = torch_like(a.values, b.values);
      refs.push_back(s.content.put("run/step_" + std::to_string(v) + ".pt",
                                   std::make_shared<memory_staged>(file, d.path.string())));
    }
    newest = read_all(s.content, refs.back());
    s.journal.sync();
  }
  // Closed while the startup's rebuild runs or waits (a daemon that fails right after its
  // replay): the store stops its rebuilds before anything they read through goes.
  for (int i = 0; i < 3; ++i) opened(d.path, opt, refs);
  opened s(d.path, opt, refs);
  s.content.wait_heads();
  const auto head = s.content.published_head(refs.back());
  REQUIRE(head);
  CHECK(read_all(s.content, refs.back()) == newest);
  bytes from_file(newest.size());
  REQUIRE(::pread(head->backing_fd(), from_file.data(), from_file.size(), 0) ==
          ssize_t(from_file.size()));
  CHECK(from_file == newest);
  CHECK_FALSE(s.content.published_head(refs.front()));  // only heads get images
}

TEST_CASE("a lineage whose only live file is its head keeps no image, across a restart too",
          "[content][heads]") {
  // Saving over one file (or rotating down to one checkpoint): the image would be a second
  // full copy of the one live file. It goes when the last other live file does; the head reads
  // through its chain, its next save takes its base from there, and a restart rebuilds nothing.
  temp_dir d;
  fs::content_options opt = heads_options(d);
  drifting_checkpoint ckpt(41, opt.heads_dir);
  auto save = [&](opened& s, const std::string& path) { return s.content.put(path, ckpt.next()); };
  const auto files = [&] { return fs::head_store::files_in(opt.heads_dir).size(); };
  fs::content_ref v1, v2, v3, v4;
  bytes served3;
  {
    opened s(d.path, opt);
    v1 = save(s, "run/last.pt");
    s.content.wait_heads();
    CHECK(s.content.published_head(v1));  // a lineage's first file: nothing to compare with
    v2 = save(s, "run/last.pt");
    s.content.unref(v1);  // saved over: v2 is the only live file
    s.content.wait_heads();
    CHECK_FALSE(s.content.published_head(v2));
    CHECK(files() == 0);
    // Saved over with the name truncated at open (torch.save over one last.pt): v2 loses its
    // name before v3 exists, and v3 gets no image at its commit.
    s.content.unref(v2);
    v3 = save(s, "run/last.pt");  // its base read through the chain
    CHECK(s.content.info(v3).kind == "delta");
    CHECK(s.content.info(v3).base == v2.version);
    CHECK_FALSE(s.content.published_head(v3));
    s.content.wait_heads();
    CHECK_FALSE(s.content.published_head(v3));
    CHECK(files() == 0);
    served3 = read_all(s.content, v3);
    s.journal.sync();
  }
  {
    opened s(d.path, opt, std::vector<fs::content_ref>{v3});
    s.content.wait_heads();
    CHECK_FALSE(s.content.published_head(v3));  // not rebuilt
    CHECK(files() == 0);
    CHECK(read_all(s.content, v3) == served3);
    // The next save while v3 keeps its name (kept beside it, say as checkpoint-3). The startup
    // found the lineage keeping one file: v4's save writes no image, and v3 may still be
    // rotated away right after it (save_total_limit=1), so none is made yet.
    v4 = save(s, "run/last.pt");
    CHECK(s.content.usage().saves_without_image == 1);
    s.content.wait_heads();
    CHECK(s.content.info(v4).base == v3.version);
    CHECK_FALSE(s.content.published_head(v4));
    // v3 still lives at the next save's commit: the lineage keeps more than one file, and the
    // new head's image pays again (rebuilt from its chain, as its save wrote none).
    const fs::content_ref v5 = save(s, "run/last.pt");
    CHECK(s.content.usage().saves_without_image == 2);
    s.content.wait_heads();
    CHECK(s.content.published_head(v5));
    CHECK(files() == 1);
    s.content.unref(v3);  // v4 still lives: the image stays
    s.content.wait_heads();
    CHECK(s.content.published_head(v5));
    // Rotated down to one file: the image goes at once.
    s.content.unref(v4);
    s.content.wait_heads();
    CHECK_FALSE(s.content.published_head(v5));
    CHECK(files() == 0);
  }
}

TEST_CASE("a reader's pin let go keeps the image of a lineage's only file", "[content][heads]") {
  // A handle reading a version pins it (ref) and lets go after the next journal sync (unref):
  // no file lost its name, and a lineage's first version keeps its image. Losing its name
  // drops it (the image would be all that is left of a removed file).
  temp_dir d;
  fs::content_options opt = heads_options(d);
  drifting_checkpoint ckpt(43, opt.heads_dir);
  opened s(d.path, opt);
  const fs::content_ref v1 = s.content.put("run/last.pt", ckpt.next());
  s.content.wait_heads();
  REQUIRE(s.content.published_head(v1));
  s.content.ref(v1);  // a reader's handle
  s.content.unref(v1);
  s.content.wait_heads();
  CHECK(s.content.published_head(v1));
  CHECK(fs::head_store::files_in(opt.heads_dir).size() == 1);
  s.content.unref(v1);  // removed
  s.content.wait_heads();
  CHECK_FALSE(s.content.published_head(v1));
  CHECK(fs::head_store::files_in(opt.heads_dir).empty());
}

// Releases `next` (a file's name going, as the file system does after a journal sync on
// another thread) inside the next put, between its record and its head image's adoption.
struct unref_after_record {
  fs::content_store* store = nullptr;  // set once the store is open
  fs::content_ref next;
  int done = 0;
  void install(fs::content_options& opt) {
    opt.test_hooks.after_record = [this](std::uint64_t) {
      if (!next.version) return;
      store->unref(std::exchange(next, {}));
      ++done;
    };
  }
};

TEST_CASE("the old file's name going while its successor is recorded drops the new image",
          "[content][heads]") {
  // The file system unrefs the superseded version after the journal sync that follows the new
  // version's commit, on another thread: possibly between the record and the image's adoption,
  // when there is no image yet to drop. The lineage keeps one file all the same.
  temp_dir d;
  fs::content_options opt = heads_options(d);
  drifting_checkpoint ckpt(44, opt.heads_dir);
  unref_after_record unref;
  unref.install(opt);
  opened s(d.path, opt);
  unref.store = &s.content;
  const fs::content_ref v1 = s.content.put("run/last.pt", ckpt.next());
  s.content.wait_heads();
  REQUIRE(s.content.published_head(v1));
  unref.next = v1;
  const fs::content_ref v2 = s.content.put("run/last.pt", ckpt.next());
  REQUIRE(unref.done == 1);
  REQUIRE(s.content.info(v2).kind == "delta");
  s.content.wait_heads();
  CHECK_FALSE(s.content.published_head(v2));
  CHECK(fs::head_store::files_in(opt.heads_dir).empty());
  // And the lineage is known to keep one file: the next save makes no image.
  s.content.put("run/last.pt", ckpt.next());
  CHECK(s.content.usage().saves_without_image == 1);
}

TEST_CASE("a fork joined into a lineage whose other files are gone keeps no image",
          "[content][heads]") {
  // torch.save to a temporary directory, renamed over the last one (which went first): the
  // fork's first version kept its image as any lineage's first file does; joined, it is the
  // lineage's only live file.
  temp_dir d;
  fs::content_options opt = heads_options(d);
  drifting_checkpoint ckpt(46, opt.heads_dir);
  unref_after_record unref;
  unref.install(opt);
  opened s(d.path, opt);
  unref.store = &s.content;
  const fs::content_ref v1 = s.content.put("run/step_1/model.pt", ckpt.next());
  // The old directory removed while the fork was saved (its base chosen with v1 alive).
  unref.next = v1;
  const fs::content_ref v2 = s.content.put("run/tmpab12/model.pt", ckpt.next());
  REQUIRE(unref.done == 1);
  REQUIRE(s.content.info(v2).lineage != s.content.info(v1).lineage);  // a fork
  s.content.wait_heads();
  REQUIRE(s.content.published_head(v2));  // a lineage's first file
  s.content.renamed(v2, "run/step_2/model.pt");
  REQUIRE(s.content.info(v2).lineage == s.content.info(v1).lineage);  // joined
  s.content.wait_heads();
  CHECK_FALSE(s.content.published_head(v2));
  CHECK(fs::head_store::files_in(opt.heads_dir).empty());
}

TEST_CASE("a reader of the superseded version let go last drops the head's image",
          "[content][heads]") {
  // A reader that opened the old version before a save over its file holds it past the
  // release of its name: when that reader goes, the lineage is down to one live file.
  temp_dir d;
  fs::content_options opt = heads_options(d);
  drifting_checkpoint ckpt(45, opt.heads_dir);
  opened s(d.path, opt);
  const fs::content_ref v1 = s.content.put("run/last.pt", ckpt.next());
  const fs::content_ref v2 = s.content.put("run/last.pt", ckpt.next());
  s.content.wait_heads();
  REQUIRE(s.content.published_head(v2));  // v1 still has its name
  auto reader = s.content.open(v1);       // no image: decodes, and pins v1
  s.content.unref(v1);                    // its name goes; the reader still holds it
  s.content.wait_heads();
  CHECK(s.content.published_head(v2));
  CHECK(reader->size() == s.content.info(v1).logical_bytes);
  reader.reset();
  s.content.wait_heads();
  CHECK_FALSE(s.content.published_head(v2));
  CHECK(fs::head_store::files_in(opt.heads_dir).empty());
}

TEST_CASE("a lineage that keeps one file writes no reconstruction for an image it would drop",
          "[content][heads]") {
  // HF's save_total_limit=1: each save comes beside the last, which is deleted after it. The
  // new head's image would be dropped at that deletion; once the lineage showed it keeps one
  // file, its saves write no reconstruction into their staged bytes (as with heads=off). When
  // another file of the lineage lives at a commit, the image is made from the chain instead.
  temp_dir d;
  fs::content_options opt = heads_options(d);
  drifting_checkpoint ckpt(42, opt.heads_dir);
  opened s(d.path, opt);
  std::shared_ptr<memory_staged> staged;
  auto save = [&](const std::string& path) {
    staged = ckpt.next();
    return s.content.put(path, staged);
  };
  const auto without = [&] { return s.content.usage().saves_without_image; };
  const fs::content_ref v1 = save("run/checkpoint-1/model.pt");
  const fs::content_ref v2 = save("run/checkpoint-2/model.pt");
  REQUIRE(s.content.info(v2).kind == "delta");
  CHECK(staged->modified());  // v1 still has its name: v2's staged bytes become its image
  s.content.unref(v1);        // rotated away: v2 is the only live file, its image goes
  s.content.wait_heads();
  CHECK_FALSE(s.content.published_head(v2));
  CHECK(without() == 0);

  const fs::content_ref v3 = save("run/checkpoint-3/model.pt");
  CHECK(s.content.info(v3).kind == "delta");
  CHECK(s.content.info(v3).base == v2.version);
  CHECK_FALSE(staged->modified());  // no image will be kept: the written bytes stay as written
  CHECK(without() == 1);
  const bytes served3 = read_all(s.content, v3);
  s.content.unref(v2);
  s.content.wait_heads();
  CHECK_FALSE(s.content.published_head(v3));
  CHECK(read_all(s.content, v3) == served3);

  // The run starts keeping two checkpoints: v3 is not rotated away after v4's save. At v4's
  // commit that cannot be told from a rotation still to come, at v5's it can: v5's image is
  // made from its chain, since its save wrote none.
  const fs::content_ref v4 = save("run/checkpoint-4/model.pt");
  CHECK_FALSE(staged->modified());
  CHECK(without() == 2);
  s.content.wait_heads();
  CHECK_FALSE(s.content.published_head(v4));
  const fs::content_ref v5 = save("run/checkpoint-5/model.pt");
  CHECK_FALSE(staged->modified());
  CHECK(without() == 3);
  s.content.wait_heads();
  CHECK(s.content.published_head(v5));
  const bytes served5 = read_all(s.content, v5);
  s.content.discard_head(v5.version);  // the same bytes through the chain
  CHECK(read_all(s.content, v5) == served5);
  s.content.unref(v3);
  // The lineage keeps two files now: the next save makes its image as it is written.
  const fs::content_ref v6 = save("run/checkpoint-6/model.pt");
  CHECK(staged->modified());
  CHECK(without() == 3);
  (void)v6;
}

TEST_CASE("a rekeyed head keeps its image across a restart (renamed to the new checksum)",
          "[content][heads]") {
  temp_dir d;
  fs::content_options opt = heads_options(d);
  std::mt19937_64 rng(32);
  drifting_weights a(700'000, rng), b(300'000, rng);
  fs::content_ref head, first;
  bytes served;
  {
    opened s(d.path, opt);
    for (int v = 0; v < 3; ++v) {
      a.step(rng);
      b.step(rng);
      auto staged = std::make_shared<memory_staged>(torch_like(a.values, b.values), opt.heads_dir);
      const auto r = s.content.put("run/last.pt", staged);
      if (v == 0) first = r;
      // Overwritten but the first: a lineage whose only live file is its head keeps no image.
      if (v == 1) s.content.unref(r);
      head = r;
    }
    s.content.wait_heads();
    REQUIRE(s.content.info(head).kind == "delta");
    REQUIRE(s.content.published_head(head));
    const std::uint64_t before = s.content.info(head).object;
    REQUIRE(s.content.rekey(head.version) > 0);  // as the rotation rewriter does
    CHECK(s.content.info(head).kind == "keyframe");
    CHECK(s.content.info(head).object != before);
    served = read_all(s.content, head);
    s.journal.sync();
    std::size_t files = 0;
    for (const auto& e : bfs::directory_iterator(opt.heads_dir)) {
      ++files;
      (void)e;
    }
    CHECK(files == 1);
  }
  opened s(d.path, opt, std::vector<fs::content_ref>{first, head});
  // Found at startup, not queued for a rebuild from the chain.
  const auto image = s.content.published_head(head);
  REQUIRE(image);
  CHECK(read_all(s.content, head) == served);
}

namespace {
std::vector<float> rounded(const std::vector<float>& v, int keep) {
  std::vector<float> out(v.size());
  codec::round_mantissa(codec::dtype::f32, std::as_bytes(std::span(v)),
                        std::as_writable_bytes(std::span(out)), keep);
  return out;
}

// The float32 tensors of a served torch-like file, in layout order.
std::vector<std::vector<float>> float_tensors(const bytes& served) {
  const auto l = format::recognise(format::memory_source(served));
  std::vector<std::vector<float>> out;
  for (const auto& t : l.tensors)
    if (t.type == format::element_type::f32)
      out.push_back(floats_at(served, std::size_t(t.offset), std::size_t(t.length / 4)));
  return out;
}

bool has_bits(const std::vector<float>& v, int keep) {
  return rounded(v, keep) == v;
}
}  // namespace

TEST_CASE("lossy keyframes read as the rounded tensors: head image, chain, restart, rekey",
          "[content][heads]") {
  temp_dir d, exact_dir;
  fs::content_options opt;
  opt.heads_dir = (d.path / "heads").string();
  opt.head_min = 1 << 20;
  opt.keyframe_bits = 8;
  fs::content_options exact_opt = opt;
  exact_opt.heads_dir = (exact_dir.path / "heads").string();
  exact_opt.keyframe_bits = 0;
  std::mt19937_64 rng(41);
  drifting_weights a(700'000, rng), b(300'000, rng);
  std::vector<fs::content_ref> refs;
  std::vector<bytes> served;
  {
    opened s(d.path, opt), e(exact_dir.path, exact_opt);
    for (int v = 0; v < 3; ++v) {
      a.step(rng);
      b.step(rng);
      const bytes file = torch_like(a.values, b.values);
      auto staged = std::make_shared<memory_staged>(file, opt.heads_dir);
      refs.push_back(s.content.put("run/step_" + std::to_string(v) + ".pt", staged));
      const auto exact_ref =
          e.content.put("run/step_" + std::to_string(v) + ".pt", format::memory_source(file));
      s.content.wait_heads();
      REQUIRE(s.content.published_head(refs.back()));
      served.push_back(read_all(s.content, refs.back()));
      check_crcs(served.back());
      const auto detail = s.content.detail(refs.back());
      CHECK(detail.coding.keyframe_bits == 8);
      // Every version of the chain reads as floats of 8 mantissa bits: the keyframe is rounded,
      // the deltas on it round what they reconstruct (the exact store's deltas do not).
      const auto tensors = float_tensors(served.back());
      REQUIRE(tensors.size() == 2);
      for (const auto& t : tensors) CHECK(has_bits(t, 8));
      const auto exact_tensors = float_tensors(read_all(e.content, exact_ref));
      CHECK_FALSE(has_bits(exact_tensors[0], 8));
      if (v == 0) {
        CHECK(s.content.info(refs.back()).kind == "keyframe");
        // The keyframe is the tensors rounded to 8 mantissa bits, CRCs and all, and the staged
        // bytes (the head image) were rewritten to it.
        CHECK(staged->modified());
        CHECK(served.back() == torch_like(rounded(a.values, 8), rounded(b.values, 8)));
        CHECK(double(s.content.info(refs.back()).stored_bytes) <
              0.75 * double(e.content.info(exact_ref).stored_bytes));
        std::size_t rounded_frames = 0;
        for (const auto& t : detail.tensors) {
          if (t.mode != "rounded") continue;
          ++rounded_frames;
          CHECK(t.rel_error > 0);
          CHECK(t.rel_error <= std::ldexp(1.0, -9));
        }
        CHECK(rounded_frames == 2);
        for (const auto& t : e.content.detail(exact_ref).tensors) CHECK(t.mode == "lossless");
      } else {
        CHECK(s.content.info(refs.back()).kind == "delta");
        CHECK(e.content.info(exact_ref).kind == "delta");
        for (const auto& t : detail.tensors) CHECK((t.mode == "delta" || t.mode == "grid"));
        CHECK(e.content.detail(exact_ref).coding.keyframe_bits == 0);
        // The closed loop with rounding: each element within max(|u - prev|, 2^-9 |u|).
        const auto prev = float_tensors(served[served.size() - 2]);
        const std::vector<float>* written[] = {&a.values, &b.values};
        std::size_t outside = 0;
        for (std::size_t k = 0; k < 2; ++k)
          for (std::size_t i = 0; i < tensors[k].size(); ++i) {
            const double u = (*written[k])[i];
            const double bound = std::max(std::fabs(u - prev[k][i]), std::ldexp(std::fabs(u), -9));
            outside += std::fabs(double(tensors[k][i]) - u) > bound;
          }
        CHECK(outside == 0);
      }
    }
    s.journal.sync();
  }
  // Decoded through the chain (no head images), after a restart: the same bytes.
  fs::content_options plain = opt;
  plain.heads_dir.clear();
  {
    opened s(d.path, plain, refs);
    for (std::size_t v = 0; v < refs.size(); ++v)
      REQUIRE(read_all(s.content, refs[v]) == served[v]);
    // A rekey rewrites the newest delta as a keyframe of exactly what it reads as: its floats
    // have the 8 bits the deltas kept, so it costs what the lossy keyframe cost, not the
    // exact keyframe's size (what rotation's rewrites pay; chain_rewrite.cpp estimates so).
    const double keyframe_bytes = double(s.content.info(refs[0]).stored_bytes);
    REQUIRE(s.content.rekey(refs[2].version) > 0);
    CHECK(s.content.info(refs[2]).kind == "keyframe");
    const auto rekeyed = s.content.detail(refs[2]);
    CHECK(rekeyed.coding.keyframe_bits == 8);
    for (const auto& t : rekeyed.tensors) CHECK(t.mode == "rounded");
    CHECK(double(s.content.info(refs[2]).stored_bytes) < 1.1 * keyframe_bytes);
    CHECK(read_all(s.content, refs[2]) == served[2]);
    s.content.drop_caches();
    CHECK(read_all(s.content, refs[2]) == served[2]);
  }
}

TEST_CASE("a delta on an exact keyframe keeps every bit under a later keyframe_bits",
          "[content][heads]") {
  temp_dir d;
  fs::content_options opt;
  std::mt19937_64 rng(47);
  drifting_weights a(70'000, rng), b(30'000, rng);
  std::vector<fs::content_ref> refs;
  {
    opened s(d.path, opt);  // keyframe_bits = 0: an exact keyframe
    refs.push_back(
        s.content.put("run/x.pt", format::memory_source(torch_like(a.values, b.values))));
    s.journal.sync();
  }
  opt.keyframe_bits = 8;
  opened s(d.path, opt, refs);
  a.step(rng);
  b.step(rng);
  const auto r = s.content.put("run/x.pt", format::memory_source(torch_like(a.values, b.values)));
  REQUIRE(s.content.info(r).kind == "delta");
  // Its base has every mantissa bit: rounding the elements left at the base would move them,
  // so the delta does not round (the closed loop holds as without keyframe_bits).
  CHECK(s.content.detail(r).coding.keyframe_bits == 0);
  for (const auto& t : s.content.detail(r).tensors) CHECK((t.mode == "delta" || t.mode == "grid"));
  const auto tensors = float_tensors(read_all(s.content, r));
  REQUIRE(tensors.size() == 2);
  CHECK_FALSE(has_bits(tensors[0], 8));
}

TEST_CASE("keyframe_bits leaves lossless stores and exact optimizer state exact",
          "[content][heads]") {
  std::mt19937_64 rng(43);
  drifting_weights a(70'000, rng), b(30'000, rng);
  const bytes file = torch_like(a.values, b.values);
  {
    temp_dir d;
    fs::content_options opt;
    opt.keyframe_bits = 8;
    opt.lossless = true;
    opened s(d.path, opt);
    const auto r = s.content.put("run/x.pt", format::memory_source(file));
    CHECK(read_all(s.content, r) == file);
    CHECK(s.content.detail(r).coding.keyframe_bits == 0);
  }
  {
    temp_dir d;
    fs::content_options opt;
    opt.keyframe_bits = 8;
    opt.exact_optimizer = true;
    opened s(d.path, opt);
    const bytes sf = safetensors({{"w", a.values}, {"exp_avg", b.values}});
    const auto r = s.content.put("run/opt.safetensors", format::memory_source(sf));
    const bytes out = read_all(s.content, r);
    const auto at_b = sf.size() - 4 * b.size();
    CHECK(floats_at(out, at_b, b.size()) == b.values);  // optimizer state: exact
    CHECK(floats_at(out, at_b - 4 * a.size(), a.size()) == rounded(a.values, 8));
  }
}

namespace {

// A staged file whose destruction (the close of a dropped head image) blocks until the test
// opens a gate, or 10 s pass.
struct close_gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false, closed = false;
};

class gated_staged final : public fs::staged_file {
 public:
  gated_staged(std::shared_ptr<close_gate> g, std::string dir)
      : gate_(std::move(g)), dir_(std::move(dir)) {}
  ~gated_staged() override {
    std::unique_lock lock(gate_->mu);
    gate_->cv.wait_for(lock, std::chrono::seconds(10), [&] { return gate_->open; });
    if (fd_ >= 0) ::close(fd_);
    gate_->closed = true;
  }
  std::uint64_t size() const override { return 4096; }
  void read_fully(std::uint64_t, std::span<std::byte> out) const override {
    std::memset(out.data(), 0, out.size());
  }
  void overwrite(std::uint64_t, std::span<const std::byte>) override {}
  bool modified() const override { return false; }
  int backing_file() override {
    if (fd_ < 0) fd_ = ::open(dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd_ < 0 || ::ftruncate(fd_, 4096) != 0) throw ckpt::io_error(errno, "O_TMPFILE");
    return fd_;
  }
  void copy_memory_to_file() const override {}
  void drop_memory() override {}
  std::uint64_t memory_bytes() const override { return 0; }

 private:
  std::shared_ptr<close_gate> gate_;
  std::string dir_;
  int fd_ = -1;
};

}  // namespace

TEST_CASE("a dropped head image is closed off the dropping thread, and wait_published waits for it",
          "[content][heads]") {
  // drop() runs on the commit path (the superseded head of a lineage): closing an unlinked
  // multi-GiB image there frees its blocks before the fsync returns.
  temp_dir d;
  const std::string dir = (d.path / "heads").string();
  fs::head_store heads(dir);
  auto gate = std::make_shared<close_gate>();
  heads.adopt(1, 42, std::make_shared<gated_staged>(gate, dir));
  heads.wait_published();
  REQUIRE(heads.stat().published == 1);
  heads.drop(1);  // returns while the image's destruction waits at the gate
  {
    std::lock_guard lock(gate->mu);
    CHECK_FALSE(gate->closed);
    gate->open = true;
  }
  gate->cv.notify_all();
  heads.wait_published();
  std::lock_guard lock(gate->mu);
  CHECK(gate->closed);
  CHECK(heads.stat().images == 0);
}

TEST_CASE("a rebuild job dropped before it ran lets go of what it holds outside the lock",
          "[content][heads]") {
  // A job's reader pins its version; let go as the last pin, the content store asks to drop
  // the lineage's image (its unref rule), i.e. calls drop() again: a deadlock if the job was
  // destroyed under the head store's lock.
  temp_dir d;
  const std::string dir = (d.path / "heads").string();
  fs::head_store heads(dir);
  std::promise<void> go;
  std::shared_future<void> released = go.get_future().share();
  std::atomic<bool> started{false};
  // The worker busy with a first job until released: the second stays queued.
  heads.rebuild(1, 11, 4096, [&started, released](std::uint64_t, std::span<std::byte> out) {
    started = true;
    released.wait();
    std::fill(out.begin(), out.end(), std::byte{1});
  });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  int dropped_from_job = 0;
  std::shared_ptr<void> pin(nullptr, [&](void*) {
    heads.drop(3);
    ++dropped_from_job;
  });
  heads.rebuild(2, 22, 4096, [pin](std::uint64_t, std::span<std::byte>) {});
  pin.reset();
  heads.drop(2);  // destroys the queued job, and with it the last `pin`
  CHECK(dropped_from_job == 1);
  go.set_value();
  heads.wait_published();
  const auto files = fs::head_store::files_in(dir);
  CHECK(files.count(1) == 1);
  CHECK(files.count(2) == 0);
}

TEST_CASE("a retired head image: only when nothing holds it, nameless, its released blocks freed",
          "[content][heads]") {
  // A stream coding a lineage's next version retires its base's image (head_store::retire) and
  // releases each slab it has read, so that the save does not need the old image's space beside
  // the new one's. Nothing else may read what is released.
  temp_dir d;
  const std::string dir = (d.path / "heads").string();
  fs::head_store heads(dir);
  std::mt19937_64 rng(5);
  bytes b(std::size_t(1) << 20);
  for (auto& x : b) x = std::byte(rng());
  heads.adopt(1, 42, std::make_shared<memory_staged>(b, dir));
  heads.wait_published();
  REQUIRE(fs::head_store::files_in(dir).size() == 1);
  {
    const auto held = heads.get(1);  // an open file or a reader holds it
    CHECK(heads.retire(1) == nullptr);
    CHECK(heads.get(1) == held);
  }
  CHECK(heads.retire(7) == nullptr);  // no image
  CHECK(heads.stat().retire_refused == 1);
  auto r = heads.retire(1);
  REQUIRE(r);
  CHECK(heads.get(1) == nullptr);
  CHECK(fs::head_store::files_in(dir).empty());  // a restart rebuilds it, never reads holes
  CHECK(heads.stat().images == 0);
  const int fd = r->published_fd();
  REQUIRE(fd >= 0);
  struct stat before;
  REQUIRE(::fstat(fd, &before) == 0);
  // [12 KiB + 100, 36 KiB + 100): the whole blocks inside it, 16..36 KiB, are punched.
  heads.release(r, 12288 + 100, 24576);
  heads.release(r, 36864 + 100, 4096);  // adjacent: one range, 36..40 KiB freed too
  CHECK(r->released_bytes() == 24576);
  heads.wait_published();            // the punches, on the releaser thread
  CHECK(heads.stat().retired == 1);  // what the save still holds of it: status shows it
  CHECK(heads.stat().retirements == 1);
  CHECK(heads.stat().retired_disk_bytes == b.size() - 24576);
  struct stat after;
  REQUIRE(::fstat(fd, &after) == 0);
  CHECK(after.st_size == before.st_size);
  CHECK(std::uint64_t(before.st_blocks - after.st_blocks) * 512 == 24576);
  bytes got(8192);
  CHECK_FALSE(r->read_kept(8192, got));  // ends inside the released range
  CHECK_FALSE(r->read_kept(40000, got));
  CHECK_THROWS_AS(r->read(20000, got), ckpt::io_error);
  REQUIRE(r->read_kept(0, std::span(got).first(12288 + 100 - 8192)));
  REQUIRE(r->read_kept(41060, got));  // past both
  CHECK(std::equal(got.begin(), got.end(), b.begin() + 41060));
  // Given back while its version is still a head: the caller is told to rebuild it.
  CHECK(heads.unretire(std::move(r)));
  heads.wait_published();
  CHECK(heads.stat().retired == 0);
  // Given back after its lineage moved on (drop): nothing to rebuild.
  heads.adopt(2, 43, std::make_shared<memory_staged>(b, dir));
  heads.wait_published();
  auto r2 = heads.retire(2);
  REQUIRE(r2);
  heads.drop(2);
  CHECK_FALSE(heads.unretire(std::move(r2)));
  heads.wait_published();
  CHECK(fs::head_store::files_in(dir).empty());
}

namespace {
// memory_staged whose publication (copy_memory_to_file, on the head store's worker) waits for a
// gate, so that a test can hold the worker busy.
class slow_publish final : public fs::staged_file {
 public:
  slow_publish(std::shared_ptr<close_gate> g, bytes b, std::string dir)
      : gate_(std::move(g)), inner_(std::move(b), std::move(dir)) {}
  std::uint64_t size() const override { return inner_.size(); }
  void read_fully(std::uint64_t off, std::span<std::byte> out) const override {
    inner_.read_fully(off, out);
  }
  void overwrite(std::uint64_t off, std::span<const std::byte> d) override {
    inner_.overwrite(off, d);
  }
  bool modified() const override { return inner_.modified(); }
  int backing_file() override { return inner_.backing_file(); }
  void copy_memory_to_file() const override {
    {
      std::unique_lock lock(gate_->mu);
      gate_->closed = true;  // here: publishing
      gate_->cv.notify_all();
      gate_->cv.wait_for(lock, std::chrono::seconds(10), [&] { return gate_->open; });
    }
    inner_.copy_memory_to_file();
  }
  void drop_memory() override { inner_.drop_memory(); }
  std::uint64_t memory_bytes() const override { return inner_.memory_bytes(); }

 private:
  std::shared_ptr<close_gate> gate_;
  memory_staged inner_;
};
}  // namespace

TEST_CASE("an image being published is not retired, one waiting for it is and is never written",
          "[content][heads]") {
  temp_dir d;
  const std::string dir = (d.path / "heads").string();
  fs::head_store heads(dir);
  bytes b(std::size_t(256) << 10, std::byte(9));
  auto gate = std::make_shared<close_gate>();
  heads.adopt(1, 41, std::make_shared<slow_publish>(gate, b, dir));
  {
    std::unique_lock lock(gate->mu);  // the worker is in image 1's publication
    REQUIRE(gate->cv.wait_for(lock, std::chrono::seconds(10), [&] { return gate->closed; }));
  }
  heads.adopt(2, 42, std::make_shared<memory_staged>(b, dir));  // queued behind it
  CHECK(heads.retire(1) == nullptr);
  auto r = heads.retire(2);
  REQUIRE(r);
  CHECK(r->published_fd() < 0);
  bytes got(4096);
  CHECK(r->read_kept(8192, got));
  heads.release(r, 0, b.size());  // unpublished: its bytes are memory, nothing is punched
  CHECK(r->released_bytes() == 0);
  {
    std::lock_guard lock(gate->mu);
    gate->open = true;
  }
  gate->cv.notify_all();
  heads.wait_published();
  CHECK(r->published_fd() < 0);  // never published: the save supersedes it
  const auto files = fs::head_store::files_in(dir);
  CHECK(files.size() == 1);
  CHECK(files.count(1) == 1);
  CHECK(heads.stat().retirements == 1);
  CHECK(heads.stat().retire_refused == 1);
  // Still a head, and whole: its image again (no rebuild), published now.
  CHECK_FALSE(heads.unretire(std::move(r)));
  heads.wait_published();
  REQUIRE(heads.get(2));
  CHECK(heads.get(2)->published_fd() >= 0);
  CHECK(fs::head_store::files_in(dir).count(2) == 1);
}

namespace {
// Adam's v: positive, over several octaves, each step a decay and a fresh square.
struct second_moment {
  std::vector<float> values;
  std::uniform_real_distribution<double> lg{std::log(1e-10), std::log(1e-4)}, u01{0, 1};
  second_moment(std::size_t n, std::mt19937_64& rng) : values(n) {
    for (auto& x : values) x = float(std::exp(lg(rng)));
  }
  void step(std::mt19937_64& rng) {
    for (auto& x : values) x = float(0.95 * x + 0.05 * std::exp(lg(rng)) * u01(rng));
  }
};
}  // namespace

TEST_CASE(
    "moment_bits: second moments keep fewer mantissa bits on a lossy chain, weights keep "
    "keyframe_bits",
    "[content][heads]") {
  std::mt19937_64 rng(53);
  drifting_weights w(60'000, rng);
  second_moment sm(40'000, rng);
  const std::vector<float>& v = sm.values;
  for (const int mb : {0, 6}) {
    INFO("moment_bits " << mb);
    temp_dir d;
    fs::content_options opt;
    opt.keyframe_bits = 12;
    opt.moment_bits = mb;
    opened s(d.path, opt);
    const int want_v = mb ? mb : 12;
    std::vector<float> prev_v;
    for (int k = 0; k < 4; ++k) {
      w.step(rng);
      sm.step(rng);
      const bytes sf = safetensors({{"model.w", w.values}, {"state.0.exp_avg_sq", v}});
      const auto r = s.content.put("run/opt.safetensors", format::memory_source(sf));
      CHECK(s.content.info(r).kind == (k == 0 ? "keyframe" : "delta"));
      const bytes out = read_all(s.content, r);
      const auto got_w = floats_at(out, sf.size() - 4 * (v.size() + w.size()), w.size());
      const auto got_v = floats_at(out, sf.size() - 4 * v.size(), v.size());
      // v has want_v bits in every version (and uses them); the weights 12, not 6.
      CHECK(has_bits(got_v, want_v));
      CHECK_FALSE(has_bits(got_v, want_v - 2));
      CHECK(has_bits(got_w, 12));
      CHECK_FALSE(has_bits(got_w, 6));
      if (mb == 0) CHECK_FALSE(has_bits(got_v, 6));
      std::size_t outside = 0;
      for (std::size_t i = 0; i < v.size(); ++i) {
        const double u = v[i], g = got_v[i];
        if (k == 0) {
          // The keyframe: rounding alone, within 2^-(bits+1) of each value.
          outside += std::fabs(g - u) > std::ldexp(u, -(want_v + 1));
        } else {
          // The closed loop with rounding, and never beyond a factor 2 (ratio coding).
          const double bound = std::max(std::fabs(u - prev_v[i]), std::ldexp(u, -want_v));
          outside += std::fabs(g - u) > bound || g < 0.5 * u || g > 2 * u;
        }
      }
      CHECK(outside == 0);
      prev_v = got_v;
    }
  }
}

TEST_CASE("is_second_moment names the running means of squared gradients", "[content]") {
  for (const char* yes :
       {"state.0.exp_avg_sq", "exp_avg_sq", "optimizer.state.fc.weight.exp_avg_sq",
        "state.3.max_exp_avg_sq", "state.1.square_avg"})
    CHECK(fs::is_second_moment(yes));
  for (const char* no : {"state.0.exp_avg", "model.exp_avg_sq.weight", "exp_avg_sq_x", "step",
                         "state.0.momentum_buffer", "", "."})
    CHECK_FALSE(fs::is_second_moment(no));
}

TEST_CASE(
    "moment_bits set on a chain whose second moments have more bits: the first delta starts v's "
    "own frame at moment_bits and the deltas after it keep them",
    "[content][heads]") {
  std::mt19937_64 rng(59);
  drifting_weights w(50'000, rng);
  second_moment sm(30'000, rng);
  const std::vector<float>& v = sm.values;
  auto next = [&] {
    w.step(rng);
    sm.step(rng);
    return safetensors({{"model.w", w.values}, {"state.0.exp_avg_sq", v}});
  };
  temp_dir d;
  fs::content_options opt;
  opt.keyframe_bits = 12;
  opt.keyframe_interval = 4;
  std::vector<fs::content_ref> refs;
  std::vector<float> prev;
  auto v_of = [&](const bytes& out) { return floats_at(out, out.size() - 4 * v.size(), v.size()); };
  {
    opened s(d.path, opt);  // moment_bits = 0: v keeps 12 bits
    refs.push_back(s.content.put("run/o.safetensors", format::memory_source(next())));
    prev = v_of(read_all(s.content, refs.back()));
    CHECK_FALSE(has_bits(prev, 6));
    s.journal.sync();
  }
  opt.moment_bits = 6;
  opened s(d.path, opt, refs);
  std::uint64_t first_delta = 0, second_delta = 0;
  for (int k = 1; k < 5; ++k) {
    const bytes sf = next();
    refs.push_back(s.content.put("run/o.safetensors", format::memory_source(sf)));
    const auto got = v_of(read_all(s.content, refs.back()));
    const auto info = s.content.info(refs.back());
    CHECK(info.kind == (k < 4 ? "delta" : "keyframe"));
    INFO("version " << k);
    // Every version after the remount has 6 bits in v (and uses them).
    CHECK(has_bits(got, 6));
    CHECK_FALSE(has_bits(got, 4));
    std::size_t outside = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double u = v[i], g = got[i];
      if (k == 1 || k == 4) {
        // A frame of its own, rounded: within 2^-7 of each value, whatever the base held.
        outside += std::fabs(g - u) > std::ldexp(u, -7);
      } else {
        // On the 6-bit frame: the closed loop with rounding.
        outside += std::fabs(g - u) > std::max(std::fabs(u - prev[i]), std::ldexp(u, -6));
      }
    }
    CHECK(outside == 0);
    if (k == 1) first_delta = info.stored_bytes;
    if (k == 2) second_delta = info.stored_bytes;
    prev = got;
  }
  // The weights stay deltas in the version that re-keys v: it costs less than a keyframe would.
  CHECK(first_delta < s.content.info(refs.back()).stored_bytes);
  CHECK(second_delta < first_delta);
}
