// Reads the PyTorch reference files written by tests/reference/generate.py.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "trainkit/trainkit.hpp"

namespace trainkit::test {

#ifndef TRAINKIT_TEST_DATA_DIR
#define TRAINKIT_TEST_DATA_DIR "tests/data"
#endif

/// Every tensor of one reference file by name (float32; integer tensors hold exact small ints).
class reference {
 public:
  explicit reference(const std::string& file) {
    const std::string path = std::string(TRAINKIT_TEST_DATA_DIR) + "/../reference/" + file;
    std::ifstream in(path);
    if (!in) throw io_error("reference: cannot open " + path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream ls(line);
      std::string name;
      std::size_t nd;
      ls >> name >> nd;
      shape dims(nd);
      for (auto& d : dims) ls >> d;
      std::vector<float> v(static_cast<std::size_t>(numel(dims)));
      for (auto& x : v) ls >> x;
      if (!ls) throw io_error("reference: malformed line for " + name + " in " + path);
      t_.emplace(name, tensor<float>::from_vector(v, dims));
    }
  }
  const tensor<float>& operator[](const std::string& name) const {
    auto it = t_.find(name);
    if (it == t_.end()) throw value_error("reference: no tensor named " + name);
    return it->second;
  }
  bool has(const std::string& name) const { return t_.count(name) != 0; }
  tensor<std::int64_t> indices(const std::string& name) const { return cast<std::int64_t>((*this)[name]); }

 private:
  std::map<std::string, tensor<float>> t_;
};

/// Elementwise |a - b| <= atol + rtol |b|, with the first failing element in the message.
inline void require_close(const tensor<float>& got, const tensor<float>& want, const std::string& what,
                          double rtol = 1e-4, double atol = 1e-5) {
  INFO(what << ": sizes " << to_string(got.sizes()) << " vs reference " << to_string(want.sizes()));
  REQUIRE(got.sizes() == want.sizes());
  auto g = got.to_vector(), w = want.to_vector();
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double err = std::abs(double(g[i]) - w[i]) - (atol + rtol * std::abs(double(w[i])));
    if (err > worst || std::isnan(g[i])) {
      worst = std::isnan(g[i]) ? INFINITY : err;
      at = i;
    }
  }
  INFO(what << ": element " << at << " is " << (g.empty() ? 0.f : g[at]) << ", reference "
            << (w.empty() ? 0.f : w[at]));
  REQUIRE(worst <= 0);
}

}  // namespace trainkit::test
