#pragma once
// Recognising a torch.save archive while it is still being written (streaming writes,
// fs/content/stream_ingest.cpp). torch's writer emits data.pkl first and then one record per
// storage, each a local header without sizes (a data descriptor follows the data) and the
// storage's bytes, keys sorted as strings. The walker parses data.pkl as soon as its record is
// complete, predicts the tensors from it, and learns each storage record's data offset from its
// local header as the records arrive. Reads go through a source whose reads may block until the
// bytes are written (its size may be a bound, not the file's size); nothing past a record's
// header is read before the walk reaches it.
//
// What the walker finds is a prediction. The finished file is recognised again (recognise()) and
// only tensors that agree with it are used: the walker never has to be right, only consistent
// with recognise_zip where the archive is what torch writes.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "codec/format/layout.hpp"
#include "codec/format/recognise.hpp"
#include "codec/format/source.hpp"

namespace ckpt::format {

class torch_zip_walker {
 public:
  // Reads the first record (data.pkl) and scans it. Throws corrupt_error when the file does not
  // start like torch's writer's output: a local header "<prefix>/data.pkl" (prefix without
  // slashes), stored, followed by its data descriptor; or when data.pkl names a storage of a
  // type this build does not know (its record's size is unknown).
  torch_zip_walker(const source& src, const recognise_options& opt);

  // Every storage data.pkl names with a known element type, as recognise_zip would make it a
  // tensor (name, aliases, type, shape, length, compress), in the order data.pkl names them;
  // offsets are 0 until next() finds the record.
  const std::vector<tensor_info>& predicted() const noexcept { return predicted_; }
  // The order the records will come in (indices into predicted()), known once next() found the
  // first one: torch up to 2.3 writes the storages with their keys sorted as strings ("0", "1",
  // "10", "2"; 2.1-2.3 a byteorder record first); archives with a .format_version record
  // before them (torch 2.4 on) in the order data.pkl names them. A guess, checked by the commit.
  std::vector<std::size_t> record_order() const;
  std::uint64_t predicted_bytes(bool compress) const noexcept;
  const std::string& prefix() const noexcept { return prefix_; }

  // Walks to the next storage record (reading its local header; blocks while it is not
  // written) and returns its index in predicted(), with the offset set. Other records (version,
  // byteorder, ...) are skipped. Nothing once every predicted tensor was found or the central
  // directory starts. Throws corrupt_error when a record does not fit the prediction (a
  // compressed record, a big-endian byteorder, a descriptor that disagrees).
  std::optional<std::size_t> next();

 private:
  const source& src_;
  recognise_options opt_;
  std::string prefix_;
  std::vector<tensor_info> predicted_;
  std::vector<std::string> keys_;  // record name under prefix_ of each predicted tensor
  std::unordered_map<std::string, std::size_t> by_key_;  // keys_ -> index
  std::vector<bool> found_;
  std::size_t remaining_ = 0;
  std::uint64_t at_ = 0;  // the next record's local header
  std::uint64_t records_ = 0;
  bool format_version_ = false;  // a .format_version record came before the storages
  bool descriptor_due_ = false;  // at_ is the data descriptor of the last storage record,
  std::uint64_t due_size_ = 0;   // whose data size is this
};

}  // namespace ckpt::format
