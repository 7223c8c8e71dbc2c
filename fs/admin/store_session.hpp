#pragma once
// A store opened the way the daemon opens it, for whoever needs the whole stack without FUSE:
// the daemon itself (fs/fuse/main.cpp) and ckptctl's offline mode. Construction takes the store
// lock, opens the object store and the journal, builds the content store and the filesystem, and
// replays the journal (content records to the content store, the rest to the namespace); the
// destructor finishes pending commits and syncs the journal (filesystem::shutdown) before the
// lock goes.
//
// Store layout used here: STORE/lock, STORE/journal, STORE/objects/, SCRATCH/staging/,
// SCRATCH/heads/ (SCRATCH is STORE unless the daemon was given another).
#include <cstdint>
#include <optional>
#include <string>

#include <boost/filesystem/path.hpp>

#include "fs/content/content_store.hpp"
#include "fs/namespace/filesystem.hpp"
#include "fs/store/journal.hpp"
#include "fs/store/object_store.hpp"
#include "fs/store/store_lock.hpp"

namespace ckpt::fs::admin {

struct store_session_options {
  content_options content;
  std::uint64_t buffer_bytes = std::uint64_t(1) << 30;  // fs_config::buffer_bytes
  std::optional<std::uint64_t> compact_bytes;           // fs_config::compact_bytes if set
  bool direct_checkpoint_reads = true;                  // fs_config::direct_checkpoint_reads
  // fs_config::rewrite_factor: the daemon's (-o reclaim); tools leave chains to ckptctl prune.
  double rewrite_factor = 0;
  // fs_config::stream_after: the daemon's (-o stream); 0 for tools (they write no files).
  std::uint64_t stream_after = 0;
  // Staging files and head images go to SCRATCH/staging and SCRATCH/heads (empty: the store).
  std::string scratch;
  // Head images (content_options::heads_dir). The daemon's choice; ckptctl's offline mode
  // leaves them off and does not touch them (the next daemon checks what it finds).
  bool heads = false;
  // true (the daemon): a missing store directory is created. false (tools): the directory must
  // already be a store (is_store_dir), else ckpt::io_error(ENOENT) — a typo must not create an
  // empty store.
  bool create = true;
  // true (the daemon): after the replay, objects no version records (written just before a
  // crash, their records never synced) are removed, when the journal was whole and every record
  // understood; else counted and logged for `ckptctl gc`. Tools leave them to gc (an offline
  // `ls` or `verify` changes nothing a person may want to look at).
  bool sweep_unrecorded = false;
};

// True when `dir` looks like a ckptfs store: it has a `journal` file and an `objects/` directory.
bool is_store_dir(const boost::filesystem::path& dir);

class store_session {
 public:
  // Throws ckpt::io_error(EWOULDBLOCK) when a daemon (or another tool) holds the store: the
  // message names the holder's pid and says to go through the mount instead. Other errors as
  // thrown by the store (a damaged journal: ckpt::corrupt_error).
  store_session(const boost::filesystem::path& store_dir, const store_session_options& opt);
  ~store_session();  // fs().shutdown(): pending commits finished, journal synced
  store_session(const store_session&) = delete;
  store_session& operator=(const store_session&) = delete;

  const boost::filesystem::path& store_dir() const { return dir_; }
  // SCRATCH (the store unless store_session_options::scratch named another directory), and
  // SCRATCH/staging and SCRATCH/heads under it.
  const boost::filesystem::path& scratch_dir() const { return scratch_; }
  boost::filesystem::path staging_dir() const { return scratch_ / "staging"; }
  boost::filesystem::path heads_dir() const { return scratch_ / "heads"; }
  filesystem& fs() { return *fs_; }
  content_store& content() { return *content_; }
  store::object_store& objects() { return *objects_; }
  store::journal& journal() { return *journal_; }

  // Replay statistics, for the daemon's log.
  std::uint64_t replayed_records() const { return records_; }
  std::uint64_t unknown_records() const { return unknown_; }
  // What the sweep of unrecorded objects found (store_session_options::sweep_unrecorded):
  // `removed` false when they were only counted (the journal not whole).
  struct unrecorded {
    std::uint64_t objects = 0, bytes = 0;
    bool removed = false;
  };
  const unrecorded& unrecorded_objects() const { return unrecorded_; }

 private:
  boost::filesystem::path dir_;
  boost::filesystem::path scratch_;
  // Construction order is dependency order; members are destroyed in reverse (the filesystem
  // before the content store it commits into, the lock last).
  std::optional<store::store_lock> lock_;
  std::optional<store::object_store> objects_;
  std::optional<store::journal> journal_;
  std::optional<content_store> content_;
  std::optional<filesystem> fs_;
  std::uint64_t records_ = 0, unknown_ = 0;
  unrecorded unrecorded_;
  void sweep_unrecorded(bool journal_whole);
};

}  // namespace ckpt::fs::admin
