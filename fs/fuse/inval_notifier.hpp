#pragma once
// Kernel page-cache invalidations (fuse_lowlevel_notify_inval_inode) sent from a thread of
// their own. The call can block in the kernel on a page lock held by an in-flight FUSE_READ of
// the same file; if the thread that finished a commit made it, a read waiting for that file's
// next commit (queued behind it in the commit pool) would never be answered: a deadlock seen
// with six processes rewriting and reading the same five files. Here commits only queue the
// inode; duplicates are coalesced. post() after close() is a no-op.
#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 314
#endif
#include <fuse_lowlevel.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <stop_token>
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

  void post(fuse_ino_t ino) {
    {
      std::lock_guard lk(mu_);
      if (stopped_ || !queued_.insert(ino).second) return;
      queue_.push_back(ino);
    }
    cv_.notify_one();
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
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run(std::stop_token stop) {
    for (;;) {
      fuse_ino_t ino;
      {
        std::unique_lock lk(mu_);
        if (!cv_.wait(lk, stop, [&] { return !queue_.empty(); })) return;
        ino = queue_.front();
        queue_.pop_front();
        queued_.erase(ino);
        if (stopped_) return;
      }
      // -ENOENT (the kernel forgot the inode) and -ENOTCONN (unmounting) are harmless.
      fuse_lowlevel_notify_inval_inode(se_, ino, 0, 0);
    }
  }

  fuse_session* se_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::deque<fuse_ino_t> queue_;
  std::unordered_set<fuse_ino_t> queued_;
  bool stopped_ = false;
  std::jthread thread_;  // last: joined before the members it uses go away
};

}  // namespace ckpt::fs::fuse
