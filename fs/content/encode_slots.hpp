#pragma once
// The working memory of the write path. A version is encoded a slab at a time (content_impl.hpp,
// kSlabBytes): the slab of the file being stored, the same slab of its base, the reconstruction
// and the slab's encoding. A fixed number of such sets exist, one per encode that may run at once;
// a put waits for a free one. So the write path's memory is count x ~4 slabs, whatever the sizes
// of the files and the number of writers (DESIGN.md §9 invariant 7). Sets are kept once made:
// on the benchmark VM fresh pages cost as much to fault in as the encoding itself.
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "fs/store/page_buffer.hpp"

namespace ckpt::fs {

class encode_slots {
 public:
  struct slabs {
    store::page_buffer cur, base, recon;
    std::vector<std::byte> enc;  // cleared, never shrunk, between uses
  };

  // How many sets a machine with `cores` gets: one per core, at least 2 (a stream and a commit
  // at once), at most kMaxSets. A set used once stays resident, about 5.5 slabs (88 MiB with
  // 16 MiB slabs: three buffers and an encoding that grew), and the sets live in the 512 MiB
  // the memory budget allows besides cache= and buffer= (DESIGN.md §9 invariant 7): one per
  // core would be 8 GiB on a 96-core node. The codec spreads each slab's blocks over the cores,
  // so a few sets keep a large machine busy.
  static constexpr std::size_t kMaxSets = 3;
  static std::size_t count_for(unsigned cores) noexcept {
    return std::clamp<std::size_t>(cores, 2, kMaxSets);
  }

  encode_slots(std::size_t count, std::size_t slab_bytes);
  encode_slots(const encode_slots&) = delete;
  encode_slots& operator=(const encode_slots&) = delete;

  // One set, held until destruction; blocks while every set is in use.
  class lease {
   public:
    lease(lease&& o) noexcept : owner_(o.owner_), index_(o.index_) { o.owner_ = nullptr; }
    lease& operator=(lease&&) = delete;
    ~lease();
    slabs& get() const;

   private:
    friend class encode_slots;
    lease(encode_slots* owner, std::size_t index) : owner_(owner), index_(index) {}
    encode_slots* owner_;
    std::size_t index_;
  };
  lease acquire();

  std::size_t count() const noexcept { return sets_.size(); }
  std::size_t in_use() const;
  std::uint64_t resident_bytes() const;  // memory the sets made so far hold

 private:
  void give_back(std::size_t index);
  const std::size_t slab_bytes_;
  mutable std::mutex mu_;
  std::condition_variable free_cv_;
  std::vector<slabs> sets_;
  std::vector<bool> busy_;
  std::vector<std::size_t> enc_capacity_;  // as of the set's last release (a busy set's grows)
};

}  // namespace ckpt::fs
