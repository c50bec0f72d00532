// Always-on invariant checks. `ATOLL_CHECK(cond) << "context"` throws atl::CheckError with
// file:line, the failed condition and the streamed context; never compiled out, so it is safe
// to use on values that came from disk or the network. Environment failures (a corrupt file,
// a lost peer) use the typed exceptions of core/errors.h instead.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace atl {

class CheckError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// Collects the streamed context and throws when the full expression ends.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* what) {
    msg_ << file << ":" << line << ": check failed: " << what;
  }
  template <typename V>
  CheckFailure& operator<<(const V& v) {
    if (!has_context_) msg_ << ": ";
    has_context_ = true;
    msg_ << v;
    return *this;
  }
  ~CheckFailure() noexcept(false) { throw CheckError(msg_.str()); }

 private:
  std::ostringstream msg_;
  bool has_context_ = false;
};

}  // namespace atl

#define ATOLL_CHECK(cond) \
  if (cond) {             \
  } else                  \
    ::atl::CheckFailure(__FILE__, __LINE__, #cond)

// Binary forms print both operands.
#define ATOLL_CHECK_OP(a, op, b)                                                              \
  if ((a)op(b)) {                                                                             \
  } else                                                                                      \
    ::atl::CheckFailure(__FILE__, __LINE__, #a " " #op " " #b) << "(" << (a) << " vs " << (b) \
                                                                 << ") "
#define ATOLL_CHECK_EQ(a, b) ATOLL_CHECK_OP(a, ==, b)
#define ATOLL_CHECK_NE(a, b) ATOLL_CHECK_OP(a, !=, b)
#define ATOLL_CHECK_LT(a, b) ATOLL_CHECK_OP(a, <, b)
#define ATOLL_CHECK_LE(a, b) ATOLL_CHECK_OP(a, <=, b)
#define ATOLL_CHECK_GT(a, b) ATOLL_CHECK_OP(a, >, b)
#define ATOLL_CHECK_GE(a, b) ATOLL_CHECK_OP(a, >=, b)
