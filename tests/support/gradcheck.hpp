// tests/support/gradcheck.hpp - central finite differences against autograd, in double, plus the
// input makers the op tests share (seeded random tensors, non-contiguous views).
//
//   std::mt19937 rng(7);
//   auto x = tk_test::random_tensor({3, 4}, rng);
//   auto r = tk_test::gradcheck([](const auto& v) { return tanh(v[0]); }, {x});
//   INFO(r.message); REQUIRE(r.ok);
//
// A non-scalar output is reduced by a fixed random projection L = sum(out * R): backward is run
// with grad = R, and the numerical side evaluates L at x +- h.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "trainkit/trainkit.hpp"

namespace tk_test {

using trainkit::index_t;
using trainkit::shape;
using dtensor = trainkit::tensor<double>;
using dvar = trainkit::autograd::var<double>;

/// Uniform values in [lo, hi) from a seeded std::mt19937 (never the library's Philox generator:
/// test inputs must not move when the generator changes).
template <class T = double>
trainkit::tensor<T> random_tensor(const shape& s, std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(static_cast<std::size_t>(trainkit::numel(s)));
  for (auto& e : v) e = static_cast<T>(u(rng));
  return trainkit::tensor<T>::from_vector(v, s);
}

/// Integer class indices in [0, classes).
inline trainkit::tensor<std::int64_t> random_indices(const shape& s, std::int64_t classes, std::mt19937& rng) {
  std::uniform_int_distribution<std::int64_t> u(0, classes - 1);
  std::vector<std::int64_t> v(static_cast<std::size_t>(trainkit::numel(s)));
  for (auto& e : v) e = u(rng);
  return trainkit::tensor<std::int64_t>::from_vector(v, s);
}

/// How a test input is laid out in memory.
enum class layout {
  contiguous,  ///< dense row-major
  strided,     ///< every other element of a tensor twice as long in the last dim (slice step 2)
  transposed,  ///< the transpose of a dense tensor with the last two dims swapped
};

inline const char* to_string(layout l) {
  switch (l) {
    case layout::contiguous: return "contiguous";
    case layout::strided: return "strided";
    case layout::transposed: return "transposed";
  }
  return "?";
}

/// The same values as t, laid out as l (a view into a bigger or permuted buffer).
template <class T>
trainkit::tensor<T> with_layout(const trainkit::tensor<T>& t, layout l) {
  if (l == layout::contiguous || t.dim() == 0) return t.contiguous();
  if (l == layout::strided) {
    shape big = t.sizes();
    big.back() *= 2;
    auto b = trainkit::tensor<T>::full(big, T(-777));  // garbage between the elements
    auto v = b.slice(-1, 0, big.back(), 2);
    trainkit::copy_(v, t);
    return v;
  }
  if (t.dim() < 2) return with_layout(t, layout::strided);
  auto b = t.transpose(-1, -2).contiguous();
  return b.transpose(-1, -2);
}

/// Storage offsets of every element of t in row-major index order.
template <class T>
std::vector<index_t> element_offsets(const trainkit::tensor<T>& t) {
  std::vector<index_t> out;
  const index_t n = t.numel();
  out.reserve(static_cast<std::size_t>(n));
  std::vector<index_t> idx(t.dim(), 0);
  for (index_t k = 0; k < n; ++k) {
    index_t off = 0;
    for (std::size_t d = 0; d < t.dim(); ++d) off += idx[d] * t.strides()[d];
    out.push_back(off);
    for (std::size_t d = t.dim(); d-- > 0;) {
      if (++idx[d] < t.sizes()[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

/// "[i, j, k]" of the k-th element in row-major order of sizes s.
inline std::string index_string(const shape& s, index_t k) {
  std::vector<index_t> idx(s.size());
  for (std::size_t d = s.size(); d-- > 0;) {
    idx[d] = k % s[d];
    k /= s[d];
  }
  return trainkit::to_string(idx);
}

struct gradcheck_options {
  double h = 1e-6;
  double rtol = 1e-5;
  double atol = 1e-5;
  unsigned seed = 12345;          ///< seed of the projection R
  std::size_t max_report = 8;     ///< mismatches listed in the message
};

struct gradcheck_result {
  bool ok = true;
  std::string message;
};

using var_fn = std::function<dvar(const std::vector<dvar>&)>;

/// Compares the gradients autograd gives for every input in `inputs` (each a leaf that needs_grad
/// grad unless needs_grad[i] is false) with central differences of L = sum(f(x) * R).
inline gradcheck_result gradcheck(const var_fn& f, std::vector<dtensor> inputs, gradcheck_options o = {},
                                  std::vector<bool> needs_grad = {}) {
  gradcheck_result res;
  std::ostringstream msg;
  msg.precision(10);
  if (needs_grad.empty()) needs_grad.assign(inputs.size(), true);
  std::vector<dvar> vars;
  for (std::size_t i = 0; i < inputs.size(); ++i) vars.emplace_back(inputs[i], bool(needs_grad[i]));

  // Analytic side.
  dvar out = f(vars);
  std::mt19937 rng(o.seed);
  const dtensor proj = random_tensor(out.sizes(), rng, 0.5, 1.5);
  auto value_of = [&]() {
    trainkit::autograd::no_grad ng;
    const auto y = f(vars).value().contiguous();
    const auto p = proj.contiguous();
    double s = 0;
    for (index_t k = 0; k < y.numel(); ++k) s += y.data()[k] * p.data()[k];
    return s;
  };
  out.backward(proj);

  // Numerical side, element by element, perturbing the input views in place.
  std::size_t reported = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!needs_grad[i]) continue;
    const auto& g = vars[i].grad();
    if (!g.defined()) {
      if (inputs[i].numel() == 0) continue;
      res.ok = false;
      msg << "input " << i << " of sizes " << trainkit::to_string(inputs[i].sizes()) << ": no gradient\n";
      continue;
    }
    if (g.sizes() != inputs[i].sizes()) {
      res.ok = false;
      msg << "input " << i << ": gradient of sizes " << trainkit::to_string(g.sizes()) << " for sizes "
          << trainkit::to_string(inputs[i].sizes()) << "\n";
      continue;
    }
    const auto gc = g.contiguous();
    const auto offs = element_offsets(inputs[i]);
    double* base = inputs[i].storage_ptr()->data();
    double worst = 0;
    for (std::size_t k = 0; k < offs.size(); ++k) {
      double& e = base[offs[k]];
      const double x0 = e;
      e = x0 + o.h;
      const double up = value_of();
      e = x0 - o.h;
      const double down = value_of();
      e = x0;
      const double num = (up - down) / (2 * o.h), ana = gc.data()[k];
      const double err = std::abs(num - ana), tol = o.atol + o.rtol * std::abs(num);
      worst = std::max(worst, err / tol);
      if (!(err <= tol)) {
        res.ok = false;
        if (reported++ < o.max_report)
          msg << "input " << i << " of sizes " << trainkit::to_string(inputs[i].sizes()) << " element "
              << index_string(inputs[i].sizes(), index_t(k)) << ": analytic " << ana << ", numerical " << num
              << ", |diff| " << err << " > tol " << tol << "\n";
      }
    }
    msg << "input " << i << ": worst |diff| / tol = " << worst << "\n";
  }
  res.message = msg.str();
  return res;
}

/// Largest |a - b| over all elements; the sizes must agree.
template <class T>
double max_abs_diff(const trainkit::tensor<T>& a, const trainkit::tensor<T>& b) {
  if (a.sizes() != b.sizes()) return INFINITY;
  const auto va = a.to_vector(), vb = b.to_vector();
  double m = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    const double d = std::abs(double(va[i]) - double(vb[i]));
    if (d != d) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace tk_test

/// REQUIRE that autograd matches finite differences; prints the mismatches otherwise.
#define TK_REQUIRE_GRADCHECK(...)              \
  do {                                         \
    const auto tk_gc_ = ::tk_test::gradcheck(__VA_ARGS__); \
    INFO(tk_gc_.message);                      \
    REQUIRE(tk_gc_.ok);                        \
  } while (0)

/// REQUIRE that two tensors have the same sizes and agree to within tol everywhere.
#define TK_REQUIRE_CLOSE(a, b, tol)                                                             \
  do {                                                                                           \
    const auto tk_a_ = (a);                                                                      \
    const auto tk_b_ = (b);                                                                      \
    INFO("sizes " << ::trainkit::to_string(tk_a_.sizes()) << " vs " << ::trainkit::to_string(tk_b_.sizes()) \
                  << ", max |diff| " << ::tk_test::max_abs_diff(tk_a_, tk_b_));                  \
    REQUIRE(::tk_test::max_abs_diff(tk_a_, tk_b_) <= (tol));                                     \
  } while (0)
