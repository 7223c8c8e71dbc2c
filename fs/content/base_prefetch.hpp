#pragma once
// Read-ahead of a delta tensor's base on the write path (tensor_coding.cpp): while a tensor's 16
// MiB slab is coded, the base of its next slab is read. A unit is two slab buffers (the slab being
// coded uses one, the read in flight fills the other) and the thread that runs the reads: the
// base usually comes from a published head image by direct I/O, so that thread waits for the
// disk rather than taking a core from the coding, and its per-thread scratch (the direct-I/O
// bounce buffer, decode scratch) is made once, not per slab. A fixed, small number of units
// exist: their memory (units x 2 slabs, made on first use and kept) counts in the daemon's
// 512 MiB beyond cache= and buffer= (DESIGN.md §9 invariant 7). An encode that finds no unit
// free reads its bases in turn, as without read-ahead.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "fs/store/page_buffer.hpp"

namespace ckpt::fs {

class base_prefetch {
 public:
  class unit {
   public:
    explicit unit(std::size_t slab_bytes);  // throws std::bad_alloc
    ~unit();                                // waits for a read in flight, stops the thread
    unit(const unit&) = delete;
    unit& operator=(const unit&) = delete;

    // The buffer for a tensor's slab `index`: slabs alternate between the two.
    std::byte* buffer(std::uint64_t index) noexcept;
    // Runs `read` on the unit's thread. Precondition: no read in flight (wait() since the last).
    void start(std::function<void()> read);
    // Until the read started last is done; rethrows what it threw. No-op when none is in flight.
    void wait();
    bool in_flight() const noexcept { return started_; }
    std::uint64_t resident_bytes() const noexcept;

   private:
    void run(std::stop_token stop);
    store::page_buffer a_, b_;
    std::mutex mu_;
    std::condition_variable_any cv_;
    std::function<void()> job_;  // set by start(), cleared by the thread when done
    std::exception_ptr error_;
    bool started_ = false;  // only the owner's thread touches it
    std::jthread thread_;   // last: stopped and joined before the rest goes
  };

  // Returns a unit to the pool when destroyed, after waiting for its read in flight.
  class lease {
   public:
    lease(lease&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)), index_(o.index_) {}
    lease& operator=(lease&&) = delete;
    ~lease();
    unit& operator*() const noexcept;
    unit* operator->() const noexcept { return &**this; }

   private:
    friend class base_prefetch;
    lease(base_prefetch* owner, std::size_t index) : owner_(owner), index_(index) {}
    base_prefetch* owner_;
    std::size_t index_;
  };

  base_prefetch(std::size_t units, std::size_t slab_bytes);
  base_prefetch(const base_prefetch&) = delete;
  base_prefetch& operator=(const base_prefetch&) = delete;

  // A free unit, made on first use; none when every unit is taken or its memory cannot be had
  // (never waits, never throws: read-ahead is optional).
  std::optional<lease> try_acquire() noexcept;
  std::size_t units() const noexcept { return units_.size(); }
  std::uint64_t resident_bytes() const;

 private:
  const std::size_t slab_bytes_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<unit>> units_;  // null until first used
  std::vector<bool> busy_;
};

}  // namespace ckpt::fs
