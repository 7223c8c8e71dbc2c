#pragma once
// Heads (DESIGN.md §12): the newest reconstruction of each large checkpoint lineage, kept as an
// image of the bytes its newest version reads as, so that neither the next delta's base nor the
// usual restore replays keyframe + deltas.
//
// An image is born from the version's staged bytes, which the write path rewrote in place into
// the served bytes (staged_file.hpp), and is readable at once. A background worker then
// *publishes* it: the bytes still in memory go into the staging file, the file is fdatasync'ed,
// and only then linked as HEADS/<version>-<object checksum>.head. So a name always holds a
// complete image of exactly that version's object (the checksum tells a version id reused after
// a crash from the one the image was made for). A published image can be handed to the kernel
// (FUSE passthrough) and is found again after a restart.
//
// Images are a cache of what the chain decodes to: never journaled, never fsync'ed into a
// directory, rebuilt when missing (a crash before publication, a lost scratch disk). They cost
// one file of the checkpoint's full size per lineage with a head; that space counts in every
// ratio we publish (ckptctl ls, README).
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fs/content/log_sink.hpp"
#include "fs/content/staged_file.hpp"

namespace ckpt::fs {

class head_image {
 public:
  head_image(std::uint64_t version, std::uint64_t checksum, std::shared_ptr<staged_file> bytes);
  head_image(const head_image&) = delete;
  head_image& operator=(const head_image&) = delete;

  std::uint64_t version() const noexcept { return version_; }
  std::uint64_t checksum() const noexcept { return checksum_.load(); }  // of the version's object
  std::uint64_t size() const noexcept { return size_; }
  // All of [offset, offset + out.size()) (inside size()). Thread-safe. Throws io_error.
  void read(std::uint64_t offset, std::span<std::byte> out) const;
  // The image's file once it is published (complete, synced, named), else -1. Stays valid while
  // the image lives, also after drop() unlinked its name.
  int published_fd() const;
  std::uint64_t memory_bytes() const;

  // read(), or false (nothing read) when part of the range was released (head_store::release).
  bool read_kept(std::uint64_t offset, std::span<std::byte> out) const;
  // Disk bytes released (whole blocks), punched or about to be.
  std::uint64_t released_bytes() const;

 private:
  friend class head_store;
  bool overlaps_released(std::uint64_t offset, std::uint64_t n) const;  // mu_ held
  // Marks the range released (reads of it are refused from now on) and returns the whole blocks
  // of it not marked before, [first, last), to punch; empty for an unpublished image.
  std::pair<std::uint64_t, std::uint64_t> mark_released(std::uint64_t offset, std::uint64_t n);
  void punch(std::uint64_t first, std::uint64_t last);  // frees the blocks: no lock needed
  // The worker; throws io_error. `wanted` is asked before the copy and again before the name
  // is made: an image dropped meanwhile is never named (false: not published, fd stays -1).
  bool publish(int dir_fd, const std::string& name, const std::function<bool()>& wanted);

  const std::uint64_t version_;
  std::atomic<std::uint64_t> checksum_;  // changes when the version's object is rewritten
  const std::uint64_t size_;
  mutable std::shared_mutex mu_;  // shared: reads; exclusive: state changes of bytes_
  std::shared_ptr<staged_file> bytes_;
  int fd_ = -1;                                      // owned by bytes_; set once published
  std::map<std::uint64_t, std::uint64_t> released_;  // start -> end, coalesced
  std::atomic<bool> punch_failed_{false};            // the filesystem cannot punch holes
};

class head_store {
 public:
  // `dir` is created if missing. Throws io_error when it cannot be used.
  explicit head_store(std::string dir);
  // stop(), then closes the directory.
  ~head_store();
  // Stops the worker and the releaser once they have done what is queued (images published,
  // rebuilds cut short, releases done). Idempotent; afterwards nothing runs in the background.
  // The content store calls it first as it goes, while everything a rebuild reads through lives.
  void stop() noexcept;
  head_store(const head_store&) = delete;
  head_store& operator=(const head_store&) = delete;

  // After replay: `heads` maps each lineage head's version to (object checksum, logical size).
  // Images in the directory that match one are kept as published heads; every other file there
  // (older heads, leftovers) is removed.
  struct expected {
    std::uint64_t checksum = 0;
    std::uint64_t size = 0;
  };
  void scan(const std::map<std::uint64_t, expected>& heads);

  std::shared_ptr<const head_image> get(std::uint64_t version) const;
  // The staged bytes of a version just committed (rewritten into what it reads as) become its
  // head; published in the background. Replaces an image of the same version.
  void adopt(std::uint64_t version, std::uint64_t checksum, std::shared_ptr<staged_file> bytes);
  // The version's object was rewritten with the same served bytes (a rekey): its image takes
  // the new object's checksum, and its file the matching name, so that a restart keeps it
  // instead of rebuilding it. Where the rename fails the image is rebuilt after a restart.
  void rechecksum(std::uint64_t version, std::uint64_t checksum);
  // Takes the image of `version` out of service for a stream that codes the lineage's next
  // version against it, if nothing else holds it (no open file, reader, publication or
  // rebuild): its name is removed, durably, before anything is released from it (a crash must
  // not leave a name on an image with holes), and get() no longer finds it; reads of the version
  // decode through the chain meanwhile. An image still waiting for its publication is retired
  // unpublished: it is never written out (the save supersedes it), and nothing is released from
  // it (its bytes are the write buffer's). Null when it is being published or is in use: the
  // stream then reads it as get() gives it, and the save needs both images' space as before.
  std::shared_ptr<head_image> retire(std::uint64_t version);
  // The stream is done with a retired image: its file is closed in the background. True when
  // the version is still a head with no image and none being rebuilt (the stream's work was
  // dropped, or stored elsewhere): the caller then rebuild()s it. An image retired before its
  // publication is whole: it becomes the head's image again instead (false).
  bool unretire(std::shared_ptr<head_image> image);
  // On a retired image, whose one user is the stream coding the next version against it: once
  // that stream has read [offset, offset + n), it goes, so that a lineage's save needs about one
  // image of scratch space, not the old image beside the new one. Reads of the range fail from
  // now on (read() throws io_error, read_kept() returns false: nothing ever reads the zeros a
  // hole holds); its whole filesystem blocks are punched out on the releaser thread (freeing
  // blocks costs about 0.25 s a GiB on ext4 here, kept off the save's path). A file system that
  // cannot punch holes keeps the blocks. Nothing happens to an image retired unpublished.
  void release(const std::shared_ptr<head_image>& image, std::uint64_t offset, std::uint64_t n);
  // The version is no longer a head: its name goes (readers holding the image keep reading),
  // and its file is closed in the background.
  void drop(std::uint64_t version);
  // A head found missing at startup (a crash before its image was published, a store written
  // with heads off or before they existed, a lost scratch disk): the worker writes its image
  // from `read` (the version's served bytes, decoded through its chain) after the pending
  // publications, and keeps it if the version is still a head by then.
  using byte_reader = std::function<void(std::uint64_t offset, std::span<std::byte> out)>;
  void rebuild(std::uint64_t version, std::uint64_t checksum, std::uint64_t size, byte_reader read);

  // The image files a head store left in `dir`: version -> file size, for every name of the
  // form <version>-<checksum>.head. Read-only (nothing is removed or checked against the
  // store): `ckptctl ls` offline, where no head store runs, counts their disk bytes. A missing or
  // unreadable directory has none.
  static std::map<std::uint64_t, std::uint64_t> files_in(const std::string& dir);

  struct stats {
    std::uint64_t images = 0, published = 0;
    std::uint64_t memory_bytes = 0;  // write-buffer memory still held by unpublished images
    std::uint64_t disk_bytes = 0;    // logical bytes of the images (files are not sparse)
    // Images retired for a stream and not yet closed, and the disk bytes they still hold.
    std::uint64_t retired = 0, retired_disk_bytes = 0;
    // Since the start: images retired, and retire() calls that found the image being published or
    // held elsewhere (those saves kept it whole beside theirs).
    std::uint64_t retirements = 0, retire_refused = 0;
  };
  stats stat() const;
  const std::string& dir() const noexcept { return dir_; }
  // Waits until every image adopted so far is published or failed, and every dropped one
  // released (tests, shutdown).
  void wait_published();
  // Called with a message when publishing fails (the image stays readable from memory and the
  // staging file; it is just not kept across a restart).
  void set_log(log_sink log) { log_ = std::move(log); }

 private:
  void worker(std::stop_token stop);
  static std::string file_name(std::uint64_t version, std::uint64_t checksum);

  const std::string dir_;
  int dir_fd_ = -1;
  mutable std::mutex mu_;
  std::condition_variable_any cv_;
  std::map<std::uint64_t, std::shared_ptr<head_image>> images_;
  std::deque<std::shared_ptr<head_image>> to_publish_;
  struct rebuild_job {
    std::uint64_t version = 0, checksum = 0, size = 0;
    byte_reader read;
  };
  std::deque<rebuild_job> to_rebuild_;
  std::set<std::uint64_t> wanted_;  // versions that are heads (adopted or to be rebuilt)
  std::vector<std::weak_ptr<head_image>> retired_;  // handed out by retire(), for stat()
  std::uint64_t retirements_ = 0, retire_refused_ = 0;
  void run_rebuild(rebuild_job& job);
  std::uint64_t publishing_ = 0;  // images the worker holds right now
  // Dropped images whose last reference the store held: released by their own thread, because
  // closing the last descriptor of an unlinked head image frees its blocks in the closing
  // thread (0.5 s for 2 GiB on ext4, measured), and drop() runs on the commit, i.e. fsync, path.
  // Not the publish worker: it may be busy writing the new head for a second or more.
  void releaser(std::stop_token stop);
  std::deque<std::shared_ptr<head_image>> to_release_;
  struct punch_job {
    std::shared_ptr<head_image> image;
    std::uint64_t first = 0, last = 0;
  };
  std::deque<punch_job> to_punch_;  // release(): on the releaser thread as well
  std::uint64_t releasing_ = 0;     // images the releaser holds right now
  log_sink log_;
  std::jthread releaser_;
  std::jthread worker_;  // last: stopped and joined before the rest goes
};

}  // namespace ckpt::fs
