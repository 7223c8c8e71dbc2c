#pragma once
// Recognising a torch.distributed.checkpoint shard while it is written (streaming writes,
// fs/content/stream_ingest.cpp): the byte items, then torch archives back to back
// (recognise_archive_sequence). Each archive is walked by a torch_zip_walker over its slice;
// when its storages are found, its end is found as the recogniser finds it (its records'
// headers again, its central directory, its end records) and the next archive is looked for
// where it ends. What the walker returns is a prediction: the commit recognises the finished
// file and uses only what agrees with it.
//
// The source is a file being written: a read blocks until its bytes are there, and a read past
// the end of the finished file returns zeros for the bytes past the end (the walker cannot know
// the size before the file is finished, and headers read past the end then match nothing).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "codec/format/layout.hpp"
#include "codec/format/recognise.hpp"
#include "codec/format/source.hpp"
#include "codec/format/torch_stream.hpp"

namespace ckpt::format {

class distcp_walker {
 public:
  distcp_walker(const source& src, const recognise_options& opt);
  ~distcp_walker();
  distcp_walker(const distcp_walker&) = delete;
  distcp_walker& operator=(const distcp_walker&) = delete;

  // The next tensor of the shard, named and placed as recognise() does (item_name, file
  // offsets), once its record's local header is written. Nothing once the shard ends, or where
  // the rest of it cannot be followed (opaque to the recogniser too). Never throws for what the
  // file holds; a read's errors (a cancelled stream) pass through. A file whose only archive is
  // the whole file is a torch.save file to the recogniser, not a shard: the walker cannot know
  // that before the file ends, and returns that archive's tensors as a shard's.
  std::optional<tensor_info> next();

  // Archives found so far, and whether every storage each archive's data.pkl named was found
  // and every archive it walked was ended (false: the commit's layout will not match).
  std::size_t archives() const noexcept { return archives_; }
  bool complete() const noexcept { return complete_; }

 private:
  // Starts walking the archive at `at`; one it cannot follow is skipped (at_ moves past it, or
  // to nothing where it cannot be ended).
  void open_archive(std::uint64_t at);
  void close_archive();
  void find_next(std::uint64_t from);

  const source& src_;
  recognise_options opt_;
  std::optional<std::uint64_t> at_;  // the current (or next) archive's start; none: the end
  std::size_t archives_ = 0;
  bool complete_ = true;
  std::optional<source> slice_;               // the current archive, its offsets from its start
  std::unique_ptr<torch_zip_walker> walker_;  // reads slice_ (declared after it)
  std::size_t found_ = 0;                     // of walker_'s predicted tensors
};

}  // namespace ckpt::format
