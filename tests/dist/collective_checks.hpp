// tests/dist/collective_checks.hpp - the collective checks every communicator model must pass.
// Each check runs one collective on a rank and verifies that rank's result; it returns "" or a
// description of the first wrong element. No Catch2 macro here: thread_group runs the checks on its
// rank threads (Catch2's assertions are not thread-safe), so callers CHECK the returned strings.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "trainkit/dist/concepts.hpp"

namespace trainkit_test::dist {

using trainkit::bfloat16;
using trainkit::half;
using trainkit::dist::reduce_op;

inline constexpr std::size_t lengths[] = {0, 1, 7, 1000, 1001};
inline constexpr reduce_op all_ops[] = {reduce_op::sum, reduce_op::avg, reduce_op::max, reduce_op::min};

// Small integers: every element type holds them and their sums over 4 ranks exactly, so any
// reduction order gives the same answer and the expected values are plain integer arithmetic.
template <class T>
int value(int rank, std::size_t i) {
  const int v = static_cast<int>((static_cast<std::size_t>(rank) * 7 + i * 3) % 5);
  return std::is_unsigned_v<T> ? v : v - 2;
}

template <class T>
double as_double(T x) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
    return static_cast<double>(static_cast<float>(x));
  else
    return static_cast<double>(x);
}

template <class T>
std::vector<T> rank_values(int rank, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(value<T>(rank, i));
  return v;
}

// op over the ranks of value(r, i); avg rounds like the element type (integers truncate).
template <class T>
double expected_reduce(reduce_op op, int p, std::size_t i) {
  int acc = value<T>(0, i);
  for (int r = 1; r < p; ++r) {
    const int v = value<T>(r, i);
    if (op == reduce_op::sum || op == reduce_op::avg) acc += v;
    if (op == reduce_op::max) acc = std::max(acc, v);
    if (op == reduce_op::min) acc = std::min(acc, v);
  }
  if (op != reduce_op::avg) return acc;
  if constexpr (std::is_integral_v<T>)
    return static_cast<double>(acc / p);
  else
    return as_double(static_cast<T>(static_cast<double>(acc) / p));
}

template <class T>
double tolerance(double expected) {
  const double scale = std::max(1.0, std::abs(expected));
  if constexpr (std::is_same_v<T, half>)
    return 1e-3 * scale;
  else if constexpr (std::is_same_v<T, bfloat16>)
    return 8e-3 * scale;
  else if constexpr (std::is_same_v<T, float>)
    return 1e-6 * scale;
  else if constexpr (std::is_same_v<T, double>)
    return 1e-12 * scale;
  else
    return 0.0;
}

template <class T>
std::string mismatch(const char* what, int rank, std::size_t n, std::size_t i, double got, double want) {
  std::ostringstream os;
  os << what << " (" << trainkit::dtype_name<T>() << ", n " << n << ") on rank " << rank << ": element " << i
     << " is " << got << ", expected " << want;
  return os.str();
}

template <class T, trainkit::dist::communicator C>
std::string check_allreduce(C& g, std::size_t n, reduce_op op) {
  auto v = rank_values<T>(g.rank(), n);
  g.allreduce(v.data(), n, op).wait();
  for (std::size_t i = 0; i < n; ++i) {
    const double e = expected_reduce<T>(op, g.size(), i);
    if (std::abs(as_double(v[i]) - e) > tolerance<T>(e))
      return mismatch<T>(("allreduce " + std::string(to_string(op))).c_str(), g.rank(), n, i, as_double(v[i]),
                         e);
  }
  return {};
}

template <class T, trainkit::dist::communicator C>
std::string check_broadcast(C& g, std::size_t n, int root) {
  auto v = rank_values<T>(g.rank(), n);
  g.broadcast(v.data(), n, root).wait();
  const auto want = rank_values<T>(root, n);
  for (std::size_t i = 0; i < n; ++i)
    if (!(v[i] == want[i]))
      return mismatch<T>("broadcast", g.rank(), n, i, as_double(v[i]), as_double(want[i]));
  return {};
}

template <class T, trainkit::dist::communicator C>
std::string check_allgather(C& g, std::size_t n) {
  const auto p = static_cast<std::size_t>(g.size());
  const auto in = rank_values<T>(g.rank(), n);
  std::vector<T> out(p * n, static_cast<T>(9));
  g.allgather(in.data(), n, out.data()).wait();
  for (std::size_t j = 0; j < p; ++j) {
    const auto want = rank_values<T>(static_cast<int>(j), n);
    for (std::size_t i = 0; i < n; ++i)
      if (!(out[j * n + i] == want[i]))
        return mismatch<T>("allgather", g.rank(), n, j * n + i, as_double(out[j * n + i]),
                           as_double(want[i]));
  }
  return {};
}

template <class T, trainkit::dist::communicator C>
std::string check_reduce_scatter(C& g, std::size_t n, reduce_op op) {
  const auto p = static_cast<std::size_t>(g.size());
  const auto r = static_cast<std::size_t>(g.rank());
  const auto in = rank_values<T>(g.rank(), p * n);
  std::vector<T> out(n, static_cast<T>(9));
  g.reduce_scatter(in.data(), out.data(), n, op).wait();
  for (std::size_t i = 0; i < n; ++i) {
    const double e = expected_reduce<T>(op, g.size(), r * n + i);
    if (std::abs(as_double(out[i]) - e) > tolerance<T>(e))
      return mismatch<T>(("reduce_scatter " + std::string(to_string(op))).c_str(), g.rank(), n, i,
                         as_double(out[i]), e);
  }
  return {};
}

template <class T, trainkit::dist::communicator C>
std::string check_alltoall(C& g, std::size_t n) {
  const auto p = static_cast<std::size_t>(g.size());
  const auto r = static_cast<std::size_t>(g.rank());
  const auto in = rank_values<T>(g.rank(), p * n);
  std::vector<T> out(p * n, static_cast<T>(9));
  g.alltoall(in.data(), out.data(), n).wait();
  for (std::size_t j = 0; j < p; ++j) {
    const auto src = rank_values<T>(static_cast<int>(j), p * n);  // out chunk j = chunk r of rank j's input
    for (std::size_t i = 0; i < n; ++i)
      if (!(out[j * n + i] == src[r * n + i]))
        return mismatch<T>("alltoall", g.rank(), n, j * n + i, as_double(out[j * n + i]),
                           as_double(src[r * n + i]));
  }
  return {};
}

// Many collectives issued back to back on separate buffers, then waited (in order or last first):
// every result must be right, whatever the order of the waits.
template <class C>
std::string check_back_to_back(C& g, bool reverse_wait, int k = 40, std::size_t n = 257) {
  std::vector<std::vector<std::int64_t>> sums(static_cast<std::size_t>(k), std::vector<std::int64_t>(n));
  std::vector<std::vector<std::int64_t>> casts(static_cast<std::size_t>(k), std::vector<std::int64_t>(n));
  std::vector<trainkit::dist::work> works;
  for (int c = 0; c < k; ++c) {
    auto& s = sums[static_cast<std::size_t>(c)];
    auto& b = casts[static_cast<std::size_t>(c)];
    for (std::size_t i = 0; i < n; ++i) {
      s[i] = c * 1000 + g.rank() + static_cast<std::int64_t>(i);
      b[i] = g.rank() * 100 + c;
    }
    works.push_back(g.allreduce(s.data(), n, reduce_op::max));
    works.push_back(g.broadcast(b.data(), n, c % g.size()));
    if (c % 5 == 0) works.push_back(g.barrier());
  }
  if (reverse_wait)
    for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
  else
    for (auto& w : works) w.wait();
  for (int c = 0; c < k; ++c)
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t want_s = c * 1000 + (g.size() - 1) + static_cast<std::int64_t>(i);
      const std::int64_t want_b = (c % g.size()) * 100 + c;
      if (sums[static_cast<std::size_t>(c)][i] != want_s || casts[static_cast<std::size_t>(c)][i] != want_b) {
        std::ostringstream os;
        os << "back-to-back collective #" << c << " element " << i << " on rank " << g.rank() << ": max "
           << sums[static_cast<std::size_t>(c)][i] << " (want " << want_s << "), broadcast "
           << casts[static_cast<std::size_t>(c)][i] << " (want " << want_b << ")";
        return os.str();
      }
    }
  return {};
}

}  // namespace trainkit_test::dist
