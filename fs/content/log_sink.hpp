#pragma once
// Where the content store reports what fails no request. The library writes nothing itself:
// the daemon routes each message to its log at the message's level, tests may collect them.
#include <functional>
#include <string>

namespace ckpt::fs {

enum class log_level {
  info,   // routine work a user may want to see (a head image rebuilt, a stream's work redone)
  error,  // something the store could not do as configured (an image not kept, a rename lost)
};
using log_sink = std::function<void(log_level, const std::string&)>;

}  // namespace ckpt::fs
