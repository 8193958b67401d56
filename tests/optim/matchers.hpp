// tests/optim/matchers.hpp - a Catch2 matcher for exception messages that contain given parts:
//   CHECK_THROWS_MATCHES(expr, value_error, what_contains({"nesterov", "dampening = 0.1"}));
#pragma once

#include <catch2/catch.hpp>
#include <exception>
#include <initializer_list>
#include <string>
#include <vector>

namespace tk_test {

class what_contains_matcher : public Catch::MatcherBase<std::exception> {
 public:
  explicit what_contains_matcher(std::vector<std::string> parts) : parts_(std::move(parts)) {}
  bool match(const std::exception& e) const override {
    const std::string what = e.what();
    for (const auto& p : parts_)
      if (what.find(p) == std::string::npos) return false;
    return true;
  }
  std::string describe() const override {
    std::string r = "message contains";
    for (const auto& p : parts_) r += " \"" + p + "\"";
    return r;
  }

 private:
  std::vector<std::string> parts_;
};

inline what_contains_matcher what_contains(std::initializer_list<std::string> parts) {
  return what_contains_matcher(std::vector<std::string>(parts));
}

}  // namespace tk_test
