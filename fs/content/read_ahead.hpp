#pragma once
// What to decode ahead of one reader of one stored checkpoint version. Reconstructing a tensor
// after a remount means reading its frames from disk and decoding its chain; a reader that asks
// for it only when it gets there waits for all of that. read_ahead follows the reader through the
// tensors and names the ones to queue for background decoding, up to a byte budget ahead of it.
//
// Two candidate orders: the predicted read order (format::read_order: torch.load's storage-key
// order) and file order (cp, sha256sum, tar: front to back). The reader's own steps pick between
// them. Not every read is the reader's own step, though: the kernel reads ahead of it past the
// end of a tensor into what follows it in the file, and FUSE threads serve a large read's pieces
// concurrently, so they arrive out of order. Queuing read-ahead at such reads queued the wrong
// tensors, and they pushed the right ones out of the chunk cache before their reader came (half
// the chunks of a 1 GiB keyframe load were decoded twice). So, following the predicted order:
//   - a read of the next decoded tensor in predicted order moves the reader's place there;
//   - a read at most `stray_bytes` behind the place, or less than `stray_bytes` past it along
//     file order, queues nothing (served out of order; the kernel's read-ahead);
//   - a read further ahead in predicted order, within what is queued, moves the place there;
//   - a step along file order farther than `stray_bytes` switches to file order;
//   - anything else is a jump: the predicted order is followed from there, one tensor ahead
//     until the reader takes a step in it.
// Following file order, a step to the predicted successor that is not also the file-order one
// switches back; any other read follows file order from where it is.
//
// Pure bookkeeping (no I/O, no store); thread-safe: FUSE threads of one open file call it
// concurrently.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace ckpt::fs {

class read_ahead {
 public:
  // `predicted` and `file_order` hold the same tensor indices (the tensors worth decoding ahead);
  // `length[t]` is tensor t's size in bytes for every index that appears in them. `ahead_bytes`
  // bounds how far ahead of the reader tensors are queued (at least one is, whatever its size).
  // `tail_early`: the reader reads the end of the file right after its start (zip readers find
  // the central directory there, and the page they read holds the end of the last payload).
  // `stray_bytes`: how far the kernel's reads stray from the reader's own (0: none do).
  // `stored_tensors[t]`: tensor t is read but never decoded (served as it is stored): a place the
  // reader can be, never queued, costing nothing of the budget, and skipped by the orders' steps
  // (its reads may never reach the store: the page cache may hold it).
  read_ahead(std::vector<std::size_t> predicted, std::vector<std::size_t> file_order,
             std::vector<std::uint64_t> length, std::uint64_t ahead_bytes, bool tail_early = false,
             std::uint64_t stray_bytes = 0, std::vector<bool> stored_tensors = {});

  // The reader opened the file and reads from its start: the first decoded tensor in predicted
  // order, then (tail_early) the last one in file order, then the next in predicted order up to
  // the budget. Returns them once (later calls return nothing).
  std::vector<std::size_t> start();

  // The reader is reading tensor t (called for every read of its bytes; cheap when t is the
  // tensor of the previous call). Returns the tensors to queue now, in the order they will be
  // needed; each is returned at most once until the reader reads it. Indices that are not in the
  // orders are ignored.
  std::vector<std::size_t> touch(std::size_t t);

  bool following_file_order() const;

  // Whether the reader is at tensor t or is expected there: the place the last touch() left it
  // (any tensor while it follows file order or before its first step), or queued for it and not
  // read by it yet. A read of any other tensor is the kernel's, ahead of or behind the reader:
  // worth serving, not worth decoding more than it asks for.
  bool expects(std::size_t t) const;

 private:
  static constexpr std::size_t none = ~std::size_t(0);
  // Queues what is not queued yet among the decoded tensors of `order` from position `from`
  // covering `budget` bytes (at least one tensor); `*last` gets the last position looked at.
  std::vector<std::size_t> queue_after(const std::vector<std::size_t>& order, std::size_t from,
                                       std::size_t* last = nullptr) {
    return queue_after(order, from, last, ahead_bytes_);
  }
  std::vector<std::size_t> queue_after(const std::vector<std::size_t>& order, std::size_t from,
                                       std::size_t* last, std::uint64_t budget);
  std::vector<std::size_t> follow_predicted(std::size_t t, bool jump = false);
  // The next decoded tensor after t in `order`, or none.
  std::size_t successor(const std::vector<std::size_t>& order, const std::vector<std::size_t>& pos,
                        std::size_t t) const;
  bool stored(std::size_t t) const { return t < stored_.size() && stored_[t]; }

  const std::vector<std::size_t> predicted_, file_;
  const std::vector<std::uint64_t> length_;
  const std::uint64_t ahead_bytes_;
  const bool tail_early_;
  const std::uint64_t stray_bytes_;
  const std::vector<bool> stored_;
  std::size_t tail_ = none;                            // the last decoded tensor in file order
  std::vector<std::size_t> pos_predicted_, pos_file_;  // tensor index -> position, or none
  std::vector<std::uint64_t> bytes_predicted_, bytes_file_;  // bytes before each position
  std::atomic<std::size_t> last_{none};                      // fast path: same tensor again
  mutable std::mutex mu_;
  std::vector<bool> queued_;  // queued and not yet read
  bool file_mode_ = false;
  bool started_ = false;
  // Following the predicted order: the reader's place, and the last position queued after it.
  std::size_t place_ = none, horizon_ = 0;
};

}  // namespace ckpt::fs
