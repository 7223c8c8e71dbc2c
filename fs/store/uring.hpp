#pragma once
// io_uring plumbing for the object store's writers: a small queue of asynchronous writes of whole
// buffers, so that a writer encodes its next piece while the previous one goes to the disk.
// Internal to fs/store/.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace ckpt::store::detail {

// Writes of caller-owned buffers at given file offsets, at most `depth` in flight, through a ring
// this object owns (one writer, one thread at a time; a ring is never shared across fork()).
// Contract:
// - a submitted buffer must stay valid and unchanged until the queue has waited for it:
//   wait_all(), the destructor, or a submit() that needed its slot (the oldest write);
// - short writes and -EAGAIN are resubmitted; the first error is final: it is thrown by the next
//   submit() or wait_all(), after every write in flight completed (so no buffer is still in use
//   when the caller unwinds);
// - no ordering between writes in flight, and no fsync here: the caller syncs after wait_all().
// When the kernel refuses io_uring (ENOSYS, or EPERM under seccomp or io_uring_disabled), writes
// are synchronous pwrites with the same contract.
class write_queue {
 public:
  explicit write_queue(unsigned depth = 4);
  ~write_queue();
  write_queue(const write_queue&) = delete;
  write_queue& operator=(const write_queue&) = delete;

  void submit(int fd, std::span<const std::byte> data, std::uint64_t offset);
  void wait_all();
  bool asynchronous() const noexcept;  // false: the pwrite fallback is in use

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// True if io_uring can be used by this process (a probe ring is set up and torn down).
bool uring_available();

}  // namespace ckpt::store::detail
