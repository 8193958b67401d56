// What a test expects a call to throw: the message of the trainkit::error, to match its words.
#pragma once

#include <string>

#include "trainkit/core/error.hpp"

namespace trainkit::test {

/// What f throws as a trainkit::error, or "no error".
template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const trainkit::error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace trainkit::test
