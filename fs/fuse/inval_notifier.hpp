#pragma once
// Kernel cache invalidations sent from a thread of their own: page-cache invalidations of files
// (fuse_lowlevel_notify_inval_inode) and deletions of directory entries removed behind the
// kernel's back (fuse_lowlevel_notify_delete: `ckptctl rm/prune` through the control socket).
//
// Why a thread: these calls can block in the kernel. notify_inval_inode waits for a page lock
// held by an in-flight FUSE_READ of the same file; if the thread that finished a commit made it,
// a read waiting for that file's next commit (queued behind it in the commit pool) would never be
// answered: a deadlock seen with six processes rewriting and reading the same five files.
// notify_delete takes the parent directory's inode lock, which a lookup or readdir in that
// directory holds while it waits for the daemon; a caller holding the filesystem's lock (which
// that request needs to be answered) would deadlock the same way. Here callers only queue;
// duplicate inode invalidations are coalesced. post*() after close() are no-ops.
//
// flush() lets a caller that holds no lock wait until everything it queued has reached the
// kernel: the control socket answers `ckptctl rm` only once the removed names are gone from the
// kernel's dentry cache, so a pruned file disappears from the mount at once.
#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 314
#endif
#include <fuse_lowlevel.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_set>

namespace ckpt::fs::fuse {

class inval_notifier {
 public:
  explicit inval_notifier(fuse_session* se)
      : se_(se), thread_([this](std::stop_token stop) { run(stop); }) {}
  ~inval_notifier() {
    close();
    join();
  }
  inval_notifier(const inval_notifier&) = delete;
  inval_notifier& operator=(const inval_notifier&) = delete;

  // The kernel's cached pages and attributes of `ino` are stale.
  void post(fuse_ino_t ino) {
    {
      std::lock_guard lk(mu_);
      if (stopped_ || !queued_.insert(ino).second) return;
      queue_.push_back({ino, 0, {}});
      ++posted_;
    }
    cv_.notify_one();
  }

  // The entry `name` in directory `parent`, which named `child`, was removed.
  void post_delete(fuse_ino_t parent, fuse_ino_t child, std::string_view name) {
    {
      std::lock_guard lk(mu_);
      if (stopped_) return;
      queue_.push_back({child, parent, std::string(name)});
      ++posted_;
    }
    cv_.notify_one();
  }

  // Waits until every notification queued before this call was sent to the kernel, the notifier
  // was closed, or `timeout` passed (a call stuck in the kernel must not hold a client forever).
  // Returns false on timeout. Must not be called from a FUSE request handler.
  bool flush(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock lk(mu_);
    const std::uint64_t target = posted_;
    return done_cv_.wait_for(lk, timeout, [&] { return stopped_ || done_ >= target; });
  }

  // Shutdown is two steps. close() when the session loop has ended: no new kernel call starts
  // (the device fd is about to be closed; a later call could write into a reused fd number).
  // join() after the unmount closed the device: a call blocked in the kernel on a page lock of
  // a read that will never be answered returns once the connection is gone.
  void close() {
    {
      std::lock_guard lk(mu_);
      stopped_ = true;
    }
    thread_.request_stop();
    done_cv_.notify_all();
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct item {
    fuse_ino_t ino;     // the inode to invalidate, or the removed entry's child
    fuse_ino_t parent;  // 0: an inode invalidation; else the removed entry's directory
    std::string name;
  };

  void run(std::stop_token stop) {
    for (;;) {
      item it;
      {
        std::unique_lock lk(mu_);
        if (!cv_.wait(lk, stop, [&] { return !queue_.empty(); })) return;
        it = std::move(queue_.front());
        queue_.pop_front();
        if (it.parent == 0) queued_.erase(it.ino);
        if (stopped_) return;
      }
      // -ENOENT (the kernel forgot the inode or the name) and -ENOTCONN (unmounting) are
      // harmless: there is nothing cached to drop.
      if (it.parent == 0)
        fuse_lowlevel_notify_inval_inode(se_, it.ino, 0, 0);
      else
        fuse_lowlevel_notify_delete(se_, it.parent, it.ino, it.name.data(), it.name.size());
      {
        std::lock_guard lk(mu_);
        ++done_;
      }
      done_cv_.notify_all();
    }
  }

  fuse_session* se_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::condition_variable done_cv_;  // done_ advanced, or closed
  std::deque<item> queue_;
  std::unordered_set<fuse_ino_t> queued_;  // inode invalidations in queue_
  std::uint64_t posted_ = 0, done_ = 0;    // notifications queued / sent, ever
  bool stopped_ = false;
  std::jthread thread_;  // last: joined before the members it uses go away
};

}  // namespace ckpt::fs::fuse
