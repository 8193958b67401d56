// trainkit/core/error.hpp - the exceptions every component throws, and the one check macro.
#pragma once

#include <sstream>    // std::ostringstream: messages are built from shapes and values
#include <stdexcept>  // std::runtime_error
#include <string>
#include <string_view>

namespace trainkit {

/// Base of every exception trainkit throws. Messages name the op, the shapes and the values.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Shapes that do not fit together (broadcasting, matmul, reshape, concat...).
class shape_error : public error {
 public:
  using error::error;
};

/// A value out of its domain: a class index >= number of classes, a negative rate...
class value_error : public error {
 public:
  using error::error;
};

/// An index outside a dimension.
class index_error : public error {
 public:
  using error::error;
};

/// A file that cannot be read, is truncated, or does not have the expected format.
class io_error : public error {
 public:
  using error::error;
};

/// Misuse of the API in a way the types could not prevent (backward twice without retain_graph...).
class usage_error : public error {
 public:
  using error::error;
};

/// A device or library call (CUDA, cuBLAS, NCCL, MPI) that failed.
class runtime_failure : public error {
 public:
  using error::error;
};

namespace detail {
template <class E>
[[noreturn]] inline void throw_error(std::string_view where, const std::string& what) {
  throw E(std::string(where) + ": " + what);
}
}  // namespace detail

}  // namespace trainkit

/// TRAINKIT_CHECK(cond, error_type, "op" , message << streamed << values);
/// Throws error_type("op: message") when cond is false. The message is built only on failure.
#define TRAINKIT_CHECK(cond, error_type, op, msg)                             \
  do {                                                                        \
    if (!(cond)) [[unlikely]] {                                               \
      std::ostringstream trainkit_check_os_;                                  \
      trainkit_check_os_ << msg;                                              \
      ::trainkit::detail::throw_error<error_type>(op, trainkit_check_os_.str()); \
    }                                                                         \
  } while (0)
