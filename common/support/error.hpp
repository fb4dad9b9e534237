// Error types. A UsageError is the user's to fix (a bad option, file or config value): its message names
// the option/field/file, the value and what is allowed, and the CLI turns it into exit code 2.
#pragma once
#include <stdexcept>
#include <string>

namespace attn {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A combination a variant cannot run (a capability it lacks, a workspace over budget). Reported as SKIPPED.
class NotSupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace attn
