// Journal (fs/store/journal.hpp): replay order, torn tails at every byte of the last record,
// a damaged middle record (what replay drops is reported and kept aside), durability of sync()
// across a process exit, atomic compaction (and a crashed compaction's leftover), and a failed sync
// poisoning the journal (ENOSPC on tmpfs).
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "codec/error.hpp"
#include "fs/store/journal.hpp"
#include "store_test_util.hpp"

using namespace ckpt;
using namespace ckpt::store;
using records = std::vector<std::vector<std::byte>>;

namespace {

std::vector<std::byte> rec(const std::string& s) {
  auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

records replay_all(journal& j) {
  records out;
  j.replay([&](std::span<const std::byte> r) { out.emplace_back(r.begin(), r.end()); });
  return out;
}

records read_journal(const boost::filesystem::path& file) {
  journal j(file);
  return replay_all(j);
}

// A new journal at `file` holding `rs`, synced and closed.
void write_journal(const boost::filesystem::path& file, const records& rs) {
  journal j(file);
  replay_all(j);
  for (auto& r : rs) j.append(r);
  j.sync();
}

records sample(int n) {
  records rs;
  for (int i = 0; i < n; ++i)
    rs.push_back(ckpt::test::random_bytes(static_cast<std::size_t>(i * 37 % 300), i));
  return rs;
}

constexpr std::uint64_t journal_header = 16, record_header = 8;

std::vector<std::byte> file_bytes(const boost::filesystem::path& file) {
  std::ifstream in(file.string(), std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

std::vector<std::byte> range(const boost::filesystem::path& file, std::uint64_t from,
                             std::uint64_t to) {
  const auto all = file_bytes(file);
  return {all.begin() + std::ptrdiff_t(from), all.begin() + std::ptrdiff_t(to)};
}

bool all_zero(const boost::filesystem::path& file, std::uint64_t from, std::uint64_t to) {
  for (const std::byte b : range(file, from, to))
    if (b != std::byte{0}) return false;
  return true;
}

}  // namespace

TEST_CASE("journal: records replay in append order, including empty ones", "[store]") {
  test::temp_dir tmp;
  const auto file = tmp.path() / "journal";
  const records rs = sample(200);
  {
    journal j(file);
    CHECK(replay_all(j).empty());
    CHECK(j.size_bytes() == journal_header);
    for (auto& r : rs) j.append(r);
    j.sync();
    std::uint64_t expect = journal_header;
    for (auto& r : rs) expect += record_header + r.size();
    CHECK(j.size_bytes() == expect);
    CHECK(boost::filesystem::file_size(file) == expect);
    CHECK_THROWS_AS(replay_all(j), ckpt::error);  // only once
  }
  CHECK(read_journal(file) == rs);
  journal j(file);
  CHECK_THROWS_AS(j.append(rs[1]), ckpt::error);  // before replay
}

TEST_CASE("journal: appends from several threads keep each thread's order", "[store]") {
  test::temp_dir tmp;
  const auto file = tmp.path() / "journal";
  {
    journal j(file);
    replay_all(j);
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&, t] {
        for (int i = 0; i < 200; ++i) {
          j.append(rec(std::to_string(t) + ":" + std::to_string(i)));
          if (i % 20 == 0) j.sync();
        }
      });
    for (auto& t : ts) t.join();
    j.sync();
  }
  std::vector<int> next(4, 0);
  auto rs = read_journal(file);
  CHECK(rs.size() == 800);
  for (auto& r : rs) {
    std::string s(reinterpret_cast<const char*>(r.data()), r.size());
    int t = std::stoi(s.substr(0, s.find(':')));
    CHECK(std::stoi(s.substr(s.find(':') + 1)) == next[t]++);
  }
}

TEST_CASE("journal: a torn tail at every byte of the last record is dropped", "[store]") {
  test::temp_dir tmp;
  const auto good = tmp.path() / "good";
  const records rs = sample(4);  // record 3 has 111 bytes
  write_journal(good, rs);
  const std::uint64_t full = boost::filesystem::file_size(good);
  const std::uint64_t last_start = full - record_header - rs.back().size();
  const records prefix(rs.begin(), rs.end() - 1);
  const auto extra = rec("after the tear");
  for (std::uint64_t cut = last_start; cut < full; ++cut) {
    INFO("cut at " << cut);
    const auto file = tmp.path() / "torn";
    boost::filesystem::copy_file(good, file, boost::filesystem::copy_options::overwrite_existing);
    test::truncate_file(file, cut);
    {
      journal j(file);
      CHECK(replay_all(j) == prefix);
      CHECK(boost::filesystem::file_size(file) == last_start);  // truncated
      CHECK(j.size_bytes() == last_start);
      CHECK(j.tail().offset == (cut > last_start ? last_start : 0));
      CHECK(j.tail().bytes == cut - last_start);
      CHECK(j.tail().kept.empty() == (cut == last_start || all_zero(good, last_start, cut)));
      if (!j.tail().kept.empty()) CHECK(file_bytes(j.tail().kept) == range(good, last_start, cut));
      j.append(extra);
      j.sync();
    }
    records expect = prefix;
    expect.push_back(extra);
    CHECK(read_journal(file) == expect);
  }
}

TEST_CASE("journal: a flipped bit in a middle record stops replay there", "[store]") {
  test::temp_dir tmp;
  const auto file = tmp.path() / "journal";
  const records rs = sample(10);
  write_journal(file, rs);
  std::uint64_t start5 = journal_header;
  for (int i = 0; i < 5; ++i) start5 += record_header + rs[i].size();
  SECTION("in the payload") {
    test::flip_bit(file, start5 + record_header + 7, 5);
  }
  SECTION("in the length") {
    test::flip_bit(file, start5 + 1, 0);
  }
  SECTION("in the checksum") {
    test::flip_bit(file, start5 + 5, 2);
  }
  const records prefix(rs.begin(), rs.begin() + 5);
  const std::uint64_t size = boost::filesystem::file_size(file);
  const std::vector<std::byte> after = range(file, start5, size);
  {
    journal j(file);
    CHECK(replay_all(j) == prefix);
    CHECK(boost::filesystem::file_size(file) == start5);
    // Every record after the damaged one is dropped, and kept aside first, whole.
    CHECK(j.tail().offset == start5);
    CHECK(j.tail().bytes == size - start5);
    REQUIRE_FALSE(j.tail().kept.empty());
    CHECK(file_bytes(j.tail().kept) == after);
    j.append(rs[9]);
    j.sync();
  }
  records expect = prefix;
  expect.push_back(rs[9]);
  CHECK(read_journal(file) == expect);
}

TEST_CASE("journal: a tail of zeros (a block allocated, never written) is dropped, not kept",
          "[store]") {
  test::temp_dir tmp;
  const auto file = tmp.path() / "journal";
  const records rs = sample(3);
  write_journal(file, rs);
  const std::uint64_t size = boost::filesystem::file_size(file);
  {
    std::ofstream out(file.string(), std::ios::binary | std::ios::app);
    out << std::string(4096, '\0');
  }
  journal j(file);
  CHECK(replay_all(j) == rs);
  CHECK(j.tail().offset == size);
  CHECK(j.tail().bytes == 4096);
  CHECK(j.tail().kept.empty());
  CHECK(boost::filesystem::file_size(file) == size);
}

TEST_CASE("journal: a damaged header is refused, not truncated away", "[store]") {
  test::temp_dir tmp;
  const auto file = tmp.path() / "journal";
  {
    journal j(file);
    replay_all(j);
    j.append(rec("x"));
    j.sync();
  }
  const auto size = boost::filesystem::file_size(file);
  test::flip_bit(file, 2);
  journal j(file);
  CHECK_THROWS_AS(replay_all(j), corrupt_error);
  CHECK(boost::filesystem::file_size(file) == size);
}

TEST_CASE("journal: synced records survive the process, unsynced ones are not promised",
          "[store]") {
  test::temp_dir tmp;
  const auto file = tmp.path() / "journal";
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 1;
    try {
      auto* j = new journal(file);  // never destroyed: the child dies without cleanup
      replay_all(*j);
      j->append(rec("one"));
      j->append(rec("two"));
      j->sync();
      j->append(rec("unsynced"));
      rc = 0;
    } catch (...) {
    }
    ::_exit(rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  CHECK(read_journal(file) == records{rec("one"), rec("two")});
}

TEST_CASE("journal: compact replaces the content atomically", "[store]") {
  test::temp_dir tmp;
  const auto file = tmp.path() / "journal";
  const records history = sample(100), snapshot = sample(3);
  {
    journal j(file);
    replay_all(j);
    for (auto& r : history) j.append(r);
    j.sync();
    const auto before = j.size_bytes();
    j.append(rec("superseded by the snapshot"));
    j.compact(snapshot);
    CHECK(j.size_bytes() < before);
    CHECK(j.size_bytes() == boost::filesystem::file_size(file));
    j.append(rec("after"));
    j.sync();
  }
  records expect = snapshot;
  expect.push_back(rec("after"));
  CHECK(read_journal(file) == expect);
  CHECK_FALSE(boost::filesystem::exists(file.string() + ".tmp"));

  // A compaction that crashed before its rename leaves a tmp file: ignored and removed.
  {
    std::FILE* f = std::fopen((file.string() + ".tmp").c_str(), "w");
    std::fputs("half a compaction", f);
    std::fclose(f);
  }
  CHECK(read_journal(file) == expect);
  CHECK_FALSE(boost::filesystem::exists(file.string() + ".tmp"));

  // Compacting to nothing leaves a valid empty journal.
  {
    journal j(file);
    replay_all(j);
    j.compact({});
  }
  CHECK(read_journal(file).empty());
}

TEST_CASE("journal: a two-step compaction keeps the records appended after its cut", "[store]") {
  test::temp_dir tmp;
  const auto file = tmp.path() / "journal";
  const records snapshot = sample(3);
  {
    journal j(file);
    replay_all(j);
    for (auto& r : sample(50)) j.append(r);
    j.sync();
    j.append(rec("before the cut: in the snapshot"));
    auto cut = j.begin_compact();
    j.append(rec("after the cut 1"));  // appends do not wait for the compaction
    // sync() does: a record made durable in the old file would vanish with it.
    std::atomic<bool> synced{false};
    std::thread t([&] {
      j.sync();
      synced = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK_FALSE(synced);
    j.finish_compact(std::move(cut), snapshot);
    t.join();
    CHECK(synced);
    j.append(rec("after the cut 2"));
    CHECK(j.size_bytes() > boost::filesystem::file_size(file));  // "2" is still pending
    j.sync();
    CHECK(j.size_bytes() == boost::filesystem::file_size(file));
    CHECK_THROWS_AS(j.finish_compact(journal::compaction{}, snapshot), ckpt::invalid_argument);
  }
  records expect = snapshot;
  expect.push_back(rec("after the cut 1"));
  expect.push_back(rec("after the cut 2"));
  CHECK(read_journal(file) == expect);
}

TEST_CASE("journal: a failed sync poisons it until a compaction rewrites it", "[store]") {
  test::tmpfs_mount fs("1m");
  if (!fs.ok()) {
    WARN("skipped: " << fs.reason());
    return;
  }
  const auto file = fs.path() / "journal";
  journal j(file);
  replay_all(j);
  j.append(rec("durable"));
  j.sync();
  test::fill_fs(fs.path(), 0);
  j.append(ckpt::test::random_bytes(64 * 1024, 1));
  int err = 0;
  try {
    j.sync();
  } catch (const io_error& e) {
    err = e.sys_errno();
  }
  CHECK(err == ENOSPC);
  CHECK_THROWS_AS(j.append(rec("refused")), io_error);
  CHECK_THROWS_AS(j.sync(), io_error);
  // Recovery: with room again, a full rewrite from the caller's state is a known state.
  boost::filesystem::remove(fs.path() / "filler");
  j.compact({rec("durable"), rec("state")});
  j.append(rec("again"));
  j.sync();
  CHECK(read_journal(file) == records{rec("durable"), rec("state"), rec("again")});
}
