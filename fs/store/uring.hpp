#pragma once
// io_uring plumbing for the object store: one ring per writing thread (created on first use,
// owned by a thread_local RAII holder, recreated in a forked child because a ring's memory is
// shared with the parent), and one operation built on it: write a sequence of byte ranges
// contiguously into a file, then fdatasync it. Internal to fs/store/.
#include <cstddef>
#include <cstdint>
#include <span>

namespace ckpt::store::detail {

// Writes the concatenation of `segments` at file offset `offset` of `fd`, then fdatasyncs the
// file (IORING_FSYNC_DATASYNC, submitted only after every write completed: io_uring gives no
// ordering between queued operations). Writes are batched (several iovecs per SQE, several SQEs
// per submission); short writes and -EAGAIN are resubmitted. Any write or fsync error is final
// (fsyncgate: never retry an fsync): it throws ckpt::io_error with the errno after every
// submitted operation has completed, so the caller's buffers are no longer in use.
// The caller's buffers must stay valid until the call returns (they do: it is synchronous).
// If the kernel refuses io_uring (ENOSYS, or EPERM under a seccomp filter or
// kernel.io_uring_disabled), falls back to pwritev + fdatasync with the same contract.
void write_and_datasync(int fd, std::span<const std::span<const std::byte>> segments,
                        std::uint64_t offset);

// True if this thread's writes go through io_uring (false after the pwritev fallback engaged).
bool uring_available();

}  // namespace ckpt::store::detail
