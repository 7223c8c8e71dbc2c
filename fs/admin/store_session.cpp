// Opening a store like the daemon does (store_session.hpp).
#include "fs/admin/store_session.hpp"

#include <boost/filesystem/operations.hpp>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <string>

#include "codec/error.hpp"
#include "fs/namespace/log.hpp"

namespace bf = boost::filesystem;

namespace ckpt::fs::admin {

namespace {

// The pid recorded in STORE/lock by its holder (0 if unknown). Only meaningful while the lock is
// held, which is when it is asked.
long holder_pid(const bf::path& dir) {
  std::ifstream in((dir / "lock").string());
  long pid = 0;
  in >> pid;
  return in ? pid : 0;
}

// The holder's command name (/proc/PID/comm), "" if unknown.
std::string holder_command(const bf::path& dir) {
  const long pid = holder_pid(dir);
  if (pid <= 0) return {};
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string comm;
  std::getline(in, comm);
  return comm;
}

}  // namespace

bool is_store_dir(const bf::path& dir) {
  boost::system::error_code ec;
  return bf::is_regular_file(dir / "journal", ec) && bf::is_directory(dir / "objects", ec);
}

store_session::store_session(const bf::path& store_dir, const store_session_options& opt)
    : dir_(bf::absolute(store_dir)),
      scratch_(opt.scratch.empty() ? dir_ : bf::absolute(opt.scratch)) {
  if (!opt.create && !is_store_dir(dir_))
    throw io_error(ENOENT, dir_.string() + " is not a ckptfs store (no journal and objects/)");
  bf::create_directories(dir_ / "objects");
  // A scratch directory that cannot be made is reported by the first file that needs it
  // (staging) or logged (heads); the store itself still opens.
  boost::system::error_code scratch_ec;
  bf::create_directories(staging_dir(), scratch_ec);

  try {
    lock_.emplace(dir_);
  } catch (const io_error& e) {
    if (e.sys_errno() != EWOULDBLOCK) throw;
    // store_lock's message names the store and the holder's pid; say what to do about it. The
    // holder may be an offline ckptctl rather than a daemon: then the advice is to wait.
    const std::string holder = holder_command(dir_);
    if (holder == "ckptctl")
      throw io_error(EWOULDBLOCK, "store " + dir_.string() + " is open offline by another " +
                                      "ckptctl (pid " + std::to_string(holder_pid(dir_)) +
                                      "); wait until it has finished");
    throw io_error(EWOULDBLOCK, std::string(e.what()) +
                                    "; while it runs, manage the store through a path inside "
                                    "its mount instead of the store directory");
  }
  objects_.emplace(dir_ / "objects");
  journal_.emplace(dir_ / "journal");
  content_options content = opt.content;
  if (opt.heads) content.heads_dir = heads_dir().string();
  content_.emplace(*objects_, *journal_, content);
  content_->set_logger([](log_level level, const std::string& m) {
    if (level == log_level::error)
      log_error(m);
    else
      log_info(m);
  });

  fs_config cfg;
  cfg.store_dir = dir_.string();
  cfg.staging_dir = staging_dir().string();
  cfg.buffer_bytes = opt.buffer_bytes;
  cfg.direct_checkpoint_reads = opt.direct_checkpoint_reads;
  cfg.rewrite_factor = opt.rewrite_factor;
  cfg.stream_after = opt.stream_after;
  if (opt.compact_bytes) cfg.compact_bytes = *opt.compact_bytes;
  fs_.emplace(*journal_, *content_, cfg);

  journal_->replay([&](std::span<const std::byte> rec) {
    ++records_;
    if (content_->apply(rec)) return;
    if (!fs_->replay_record(rec)) ++unknown_;
  });
  fs_->replay_done();
  if (unknown_)
    log_error("journal: " + std::to_string(unknown_) + " records of unknown type ignored");
  const auto& tail = journal_->tail();
  if (tail.bytes)
    log_error("journal: " + std::to_string(tail.bytes) + " bytes after offset " +
              std::to_string(tail.offset) +
              " were not intact records and were dropped (a write torn by a crash of the "
              "machine, or damage)" +
              (tail.kept.empty() ? std::string(": all zeros") : "; kept in " + tail.kept));
  if (opt.sweep_unrecorded) sweep_unrecorded(unknown_ == 0 && tail.bytes == 0);
}

void store_session::sweep_unrecorded(bool journal_whole) {
  // An object is written, then recorded; a crash between the two leaves an object no version
  // names (a checkpoint closed without fsync, killed before the journal's next sync: up to a
  // whole keyframe). With every record understood and none dropped, nothing can name it: it
  // goes now rather than wait for `ckptctl gc`. Otherwise a record that names it may be in the
  // dropped tail, or be of a kind this build does not read: kept for gc, which a person runs.
  const auto [count, bytes] = content_->collect_garbage(!journal_whole);
  if (!count) return;
  char size[32];
  std::snprintf(size, sizeof size, "%.1f MiB", double(bytes) / (1 << 20));
  const std::string objects = std::to_string(count) + (count == 1 ? " object (" : " objects (");
  if (journal_whole)
    log_info("removed " + objects + size +
             ") no version records: written just before a crash, their records never synced");
  else
    log_error("kept " + objects + size +
              ") no version records, as the journal was not whole (see above): `ckptctl gc` "
              "removes them");
  unrecorded_ = {count, bytes, journal_whole};
}

store_session::~store_session() {
  if (fs_) {
    try {
      fs_->shutdown();
    } catch (const std::exception& e) {
      log_error(std::string("closing the store: ") + e.what());
    }
  }
}

}  // namespace ckpt::fs::admin
