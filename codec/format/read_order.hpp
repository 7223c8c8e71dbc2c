#pragma once
// The order in which a typical reader consumes the tensors of a recognised checkpoint, so that a
// read path can decode ahead of it.
//
// torch.load unpickles data.pkl and reads each storage when the pickle first names it, which is
// the numeric order of the record keys (torch.save numbers storages 0, 1, 2, ... as it pickles
// them). torch.save writes the records sorted as strings (data/0, data/1, data/10, data/11, ...,
// data/2), so after the second storage file order and read order part ways: reading ahead in file
// order decodes the wrong tensors. Every other format (safetensors, npy, npz) is predicted to be
// read in file order.
#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

#include "codec/format/layout.hpp"

namespace ckpt::format {

// Every index of l.tensors exactly once, in predicted read order. torch zips: tensors whose zip
// record name ends in a decimal key ("archive/data/17") first, by key; the rest after them in
// file order. Other formats: file order (by offset).
std::vector<std::size_t> read_order(const layout& l);

// The decimal storage key of a torch record name ("archive/data/17" -> 17); nothing for a name
// whose last path component is not all digits (or is too long to be a key).
std::optional<std::uint64_t> storage_key(std::string_view record_name) noexcept;

}  // namespace ckpt::format
