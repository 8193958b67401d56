// tests/backend/test_measured_route.cpp - kernel routes measured per shape (backend/cpu/measured_route.hpp):
// the faster route wins, the choice goes to the route file and the next process reads it instead
// of measuring, processes that meet a shape together measure it once and agree, a torn line is
// measured again; the GEMM and the convolution passes measured at their first call give exactly
// the bits of the route they chose (beta's C survives the trials), and so do the fp32 attention's
// forward and backward (each measured apart); forced routes and small problems measure nothing.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "trainkit/backend/cpu/attention.hpp"
#include "trainkit/backend/cpu/blas.hpp"
#include "trainkit/backend/cpu/im2col.hpp"
#include "trainkit/backend/cpu/measured_route.hpp"
#include "support/values.hpp"  // random_floats

namespace backend = trainkit::backend;
using trainkit::index_t;
using backend::detail::route_table;
using trainkit::test::random_floats;

namespace {

/// A fresh route file for one test (removed first), and the table switched to it; the table goes
/// back to the environment's file at the end.
struct fresh_route_file {
  std::string path;
  explicit fresh_route_file(const char* name) : path(std::string(TRAINKIT_TEST_TMP_DIR) + "/" + name) {
    std::remove(path.c_str());
    route_table::get().use_file(path);
  }
  ~fresh_route_file() { route_table::get().use_file(""); }
};

std::string read_route_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// A trial whose built-in route takes `builtin_ms` and oneDNN's `onednn_ms`, counting its runs.
struct sleepy_trial_m {
  int builtin_ms, onednn_ms;
  int runs = 0;
  bool operator()(bool onednn) {
    ++runs;
    std::this_thread::sleep_for(std::chrono::milliseconds(onednn ? onednn_ms : builtin_ms));
    return true;
  }
};

bool find_measured(const std::string& key, backend::route_choice& out) {
  for (auto& c : backend::measured_routes())
    if (c.key == key) {
      out = c;
      return true;
    }
  return false;
}


struct measured_gemm_route {
  backend::cpu_gemm_route saved = backend::get_cpu_gemm_route();
  explicit measured_gemm_route(backend::cpu_gemm_route r) { backend::set_cpu_gemm_route(r); }
  ~measured_gemm_route() { backend::set_cpu_gemm_route(saved); }
};
struct measured_conv_route {
  backend::cpu_conv_route saved = backend::get_cpu_conv_route();
  explicit measured_conv_route(backend::cpu_conv_route r) { backend::set_cpu_conv_route(r); }
  ~measured_conv_route() { backend::set_cpu_conv_route(saved); }
};

}  // namespace

TEST_CASE("the faster route wins, is written down, and the next process reads it", "[route]") {
  fresh_route_file file("routes-basic.tsv");
  auto& table = route_table::get();

  sleepy_trial_m slow_builtin{6, 1};
  CHECK(table.choose("k-onednn", slow_builtin));
  CHECK(slow_builtin.runs == 8);  // one warm-up run of each, then three rounds of both
  sleepy_trial_m slow_onednn{1, 6};
  CHECK_FALSE(table.choose("k-builtin", slow_onednn));
  sleepy_trial_m again{6, 1};
  CHECK(table.choose("k-onednn", again));
  CHECK(again.runs == 0);  // this process's table

  const std::string text = read_route_file(file.path);
  INFO(text);
  CHECK(text.find("k-onednn\tonednn\t") != std::string::npos);
  CHECK(text.find("k-builtin\tbuiltin\t") != std::string::npos);

  // Another process (the table started over on the same file) reads both without measuring, even
  // where its own timings would now say otherwise.
  table.use_file(file.path);
  sleepy_trial_m reversed{1, 6};
  CHECK(table.choose("k-onednn", reversed));
  CHECK_FALSE(table.choose("k-builtin", reversed));
  CHECK(reversed.runs == 0);
}

TEST_CASE("a near tie is measured three rounds more", "[route]") {
  fresh_route_file file("routes-tie.tsv");
  sleepy_trial_m tie{20, 20};  // long enough that sleep jitter stays under 10 %
  route_table::get().choose("k-tie", tie);
  CHECK(tie.runs == 14);  // the warm-ups, then six rounds of both
}

TEST_CASE("the route file's machine names the core OpenBLAS chose its kernels for", "[route]") {
  // OPENBLAS_CORETYPE=Haswell on an AVX-512 CPU gives OpenBLAS an AVX2 machine's sgemm: choices
  // measured against its AVX-512 kernels must not be taken there (another file, another key).
  const std::string m = route_table::machine();
  CHECK(m.find(std::string("|OpenBLAS ") + openblas_get_corename()) != std::string::npos);
  CHECK(m.find(backend::cpu_features::describe()) == 0);
}

TEST_CASE("a route oneDNN cannot run is never chosen", "[route]") {
  fresh_route_file file("routes-unsupported.tsv");
  int runs = 0;
  CHECK_FALSE(route_table::get().choose("k-no-kernel", [&](bool onednn) {
    ++runs;
    return !onednn;  // oneDNN has no kernel for it
  }));
  CHECK(runs == 5);  // the failed oneDNN run, the built-in warm-up and three built-in rounds
}

TEST_CASE("a torn or foreign line in the route file is measured again, not trusted", "[route]") {
  fresh_route_file file("routes-torn.tsv");
  {
    std::ofstream out(file.path);
    out << "k-garbage\tmaybe\t1\t2\n"  // not a route
        << "k-good\tonednn\t10.0\t5.0\n"
        << "k-torn\tonednn";  // the writer died inside its write: no newline
  }
  route_table::get().use_file(file.path);
  sleepy_trial_m t{1, 6};
  CHECK(route_table::get().choose("k-good", t));
  CHECK(t.runs == 0);
  CHECK_FALSE(route_table::get().choose("k-garbage", t));
  CHECK(t.runs == 8);
  CHECK_FALSE(route_table::get().choose("k-torn", t));
  CHECK(t.runs == 16);
}

TEST_CASE("processes that meet a shape together measure it once and agree", "[route]") {
  // Two processes whose own timings disagree (each finds the other route faster) ask for one key
  // at once: the file's lock lets one measure; the other waits and reads its choice.
  fresh_route_file file("routes-shared.tsv");
  constexpr int procs = 2;
  int fds[procs][2];
  pid_t pids[procs];
  for (int p = 0; p < procs; ++p) {
    REQUIRE(::pipe(fds[p]) == 0);
    pids[p] = ::fork();
    REQUIRE(pids[p] >= 0);
    if (pids[p] == 0) {
      route_table::get().use_file(file.path);
      sleepy_trial_m t{p == 0 ? 20 : 2, p == 0 ? 2 : 20};
      const bool onednn = route_table::get().choose("k-shared", t);
      char msg[32];
      const int n = std::snprintf(msg, sizeof msg, "%d %d", int(onednn), t.runs);
      (void)!::write(fds[p][1], msg, std::size_t(n));
      ::_exit(0);
    }
    ::close(fds[p][1]);
  }
  int choice[procs], runs[procs];
  for (int p = 0; p < procs; ++p) {
    char buf[32] = {};
    REQUIRE(::read(fds[p][0], buf, sizeof buf - 1) > 0);
    ::close(fds[p][0]);
    int status = 0;
    ::waitpid(pids[p], &status, 0);
    CHECK(WIFEXITED(status));
    REQUIRE(std::sscanf(buf, "%d %d", &choice[p], &runs[p]) == 2);
  }
  CHECK(choice[0] == choice[1]);
  CHECK(runs[0] + runs[1] == 8);  // exactly one of them measured
  const std::string text = read_route_file(file.path);
  CHECK(std::count(text.begin(), text.end(), '\n') == 1);
}

#if TRAINKIT_HAS_ONEDNN

TEST_CASE("a GEMM measured at its first call gives the bits of the route it chose", "[route][gemm]") {
  fresh_route_file file("routes-gemm.tsv");
  measured_gemm_route automatic(backend::cpu_gemm_route::automatic);
  using cpu_blas = backend::blas<trainkit::cpu>;
  // 96 x 160 x 80 (2^20.2 multiply-adds, measured), C with a padded leading dimension, beta != 0:
  // the trials must not add into the caller's C.
  const index_t m = 96, n = 160, k = 80, ldc = 168;
  const auto a = random_floats(std::size_t(m * k), 1), b = random_floats(std::size_t(k * n), 2);
  const auto c0 = random_floats(std::size_t(m * ldc), 3);
  REQUIRE(cpu_blas::route_of<float>(m, n, k) == cpu_blas::gemm_choice::measured);
  auto c = c0;
  cpu_blas::gemm<float>(false, false, m, n, k, 1.0, a.data(), k, b.data(), n, 0.5, c.data(), ldc);
  backend::route_choice chosen;
  REQUIRE(find_measured("gemm f32 NN m96 n160 k80 lda80 ldb160 ldc168 beta1 t" +
                          std::to_string(backend::detail::route_threads()),
                      chosen));
  CAPTURE(chosen.onednn, chosen.builtin_us, chosen.onednn_us);
  CHECK(chosen.builtin_us > 0);
  CHECK(chosen.onednn_us > 0);
  auto forced = c0;
  {
    measured_gemm_route route(chosen.onednn ? backend::cpu_gemm_route::onednn : backend::cpu_gemm_route::openblas);
    cpu_blas::gemm<float>(false, false, m, n, k, 1.0, a.data(), k, b.data(), n, 0.5, forced.data(), ldc);
  }
  CHECK(std::memcmp(c.data(), forced.data(), c.size() * sizeof(float)) == 0);
  // The second call takes the recorded route without measuring: the same bits again.
  auto again = c0;
  cpu_blas::gemm<float>(false, false, m, n, k, 1.0, a.data(), k, b.data(), n, 0.5, again.data(), ldc);
  CHECK(std::memcmp(again.data(), forced.data(), c.size() * sizeof(float)) == 0);
}

TEST_CASE("convolution passes measured at their first call give the bits of the route they chose",
          "[route][conv]") {
  fresh_route_file file("routes-conv.tsv");
  measured_conv_route automatic(backend::cpu_conv_route::automatic);
  using conv = backend::convolution<trainkit::cpu>;
  backend::conv2d_geometry g;
  g.channels = 8, g.height = g.width = 16, g.kernel_h = g.kernel_w = 3, g.pad_h = g.pad_w = 1;
  g.out_h = g.out_w = 16;
  const index_t batch = 8, out = 16;  // 8 * 72 * 256 * 16 = 2^21.2 multiply-adds per pass
  const auto x = random_floats(std::size_t(batch * g.image_size()), 4);
  const auto w = random_floats(std::size_t(out * g.col_rows()), 5);
  const auto bias = random_floats(std::size_t(out), 6);
  const auto gy = random_floats(std::size_t(batch * out * g.col_cols()), 7);
  const std::size_t ny = gy.size(), nx = x.size(), nw = w.size();

  auto run = [&](std::vector<float>& y, std::vector<float>& gx, std::vector<float>& gw) {
    y.assign(ny, 0.f), gx.assign(nx, 0.f), gw.assign(nw, 0.f);
    conv::forward<float>(g, 1, batch, out, x.data(), w.data(), bias.data(), y.data());
    conv::backward_input<float>(g, 1, batch, out, gy.data(), w.data(), gx.data());
    conv::backward_weight<float>(g, 1, batch, out, gy.data(), x.data(), gw.data());
  };
  std::vector<float> y, gx, gw;
  run(y, gx, gw);
  const auto choices = backend::measured_routes();
  REQUIRE(choices.size() == 3);  // forward (with bias), backward-data, backward-weights
  const std::string tail = " f32 n8 c8 h16 w16 o16 g1 k3x3 s1x1 p1x1 d1x1 b";
  const std::string threads = " t" + std::to_string(backend::detail::route_threads());
  backend::route_choice fwd, data, weights;
  REQUIRE(find_measured("conv_fwd" + tail + "1" + threads, fwd));
  REQUIRE(find_measured("conv_bwd_data" + tail + "0" + threads, data));
  REQUIRE(find_measured("conv_bwd_weights" + tail + "0" + threads, weights));

  // Each pass again under the route it chose, forced: the same bits.
  auto forced = [&](const backend::route_choice& c) {
    return c.onednn ? backend::cpu_conv_route::onednn : backend::cpu_conv_route::im2col;
  };
  std::vector<float> y2(ny), gx2(nx), gw2(nw);
  {
    measured_conv_route r(forced(fwd));
    conv::forward<float>(g, 1, batch, out, x.data(), w.data(), bias.data(), y2.data());
  }
  {
    measured_conv_route r(forced(data));
    conv::backward_input<float>(g, 1, batch, out, gy.data(), w.data(), gx2.data());
  }
  {
    measured_conv_route r(forced(weights));
    conv::backward_weight<float>(g, 1, batch, out, gy.data(), x.data(), gw2.data());
  }
  CAPTURE(fwd.onednn, data.onednn, weights.onednn);
  CHECK(std::memcmp(y.data(), y2.data(), ny * sizeof(float)) == 0);
  CHECK(std::memcmp(gx.data(), gx2.data(), nx * sizeof(float)) == 0);
  CHECK(std::memcmp(gw.data(), gw2.data(), nw * sizeof(float)) == 0);

  // And again under the automatic route, now from the table.
  std::vector<float> y3, gx3, gw3;
  run(y3, gx3, gw3);
  CHECK(backend::measured_routes().size() == 3);
  CHECK(std::memcmp(y.data(), y3.data(), ny * sizeof(float)) == 0);
  CHECK(std::memcmp(gx.data(), gx3.data(), nx * sizeof(float)) == 0);
  CHECK(std::memcmp(gw.data(), gw3.data(), nw * sizeof(float)) == 0);
}

TEST_CASE("small kernels, parallel regions and forced routes measure nothing", "[route]") {
  fresh_route_file file("routes-none.tsv");
  using cpu_blas = backend::blas<trainkit::cpu>;
  using conv = backend::convolution<trainkit::cpu>;
  const auto a = random_floats(256 * 256, 1);
  std::vector<float> c(256 * 256);
  {
    measured_gemm_route automatic(backend::cpu_gemm_route::automatic);
    cpu_blas::gemm<float>(false, false, 32, 32, 32, 1.0, a.data(), 32, a.data(), 32, 0.0, c.data(), 32);  // 2^15
  }
  for (auto r : {backend::cpu_gemm_route::openblas, backend::cpu_gemm_route::onednn}) {
    measured_gemm_route forced(r);
    cpu_blas::gemm<float>(false, false, 256, 256, 256, 1.0, a.data(), 256, a.data(), 256, 0.0, c.data(), 256);
  }
  backend::conv2d_geometry g;
  g.channels = 2, g.height = g.width = 8, g.kernel_h = g.kernel_w = 3, g.out_h = g.out_w = 6;
  std::vector<float> y(2 * 4 * 36);
  {
    measured_conv_route automatic(backend::cpu_conv_route::automatic);
    conv::forward<float>(g, 1, 2, 4, a.data(), a.data(), nullptr, y.data());  // 2^13.4
  }
  for (auto r : {backend::cpu_conv_route::im2col, backend::cpu_conv_route::onednn}) {
    measured_conv_route forced(r);
    conv::forward<float>(g, 1, 2, 4, a.data(), a.data(), nullptr, y.data());
  }
  CHECK(backend::measured_routes().empty());
  CHECK(read_route_file(file.path).empty());
}

TEST_CASE("fp32 attention passes measured at their first call give the bits of the route they chose",
          "[route][attention]") {
  fresh_route_file file("routes-attention.tsv");
  measured_gemm_route automatic(backend::cpu_gemm_route::automatic);
  using attn = backend::attention<trainkit::cpu>;
  // [2, 3, 200, 32] (2^22 multiply-adds: measured), causal, 200 tokens: partial tiles on both routes
  // (64 x 64; 128 x 256).
  backend::attention_problem p;
  p.batch = 2, p.heads = 3, p.tq = p.tk = 200, p.d = p.dv = 32, p.scale = 0.17, p.causal = true;
  const index_t n = p.batch * p.heads * p.tq * p.d, rows = p.batch * p.heads * p.tq;
  const auto q = random_floats(std::size_t(n), 11), k = random_floats(std::size_t(n), 12),
             v = random_floats(std::size_t(n), 13), g = random_floats(std::size_t(n), 14);
  auto view = [&](const float* x) { return backend::attention_view<const float>{x, p.heads * p.tq * p.d, p.tq * p.d, p.d}; };
  auto out_view = [&](float* x) { return backend::attention_view<float>{x, p.heads * p.tq * p.d, p.tq * p.d, p.d}; };
  struct result {
    std::vector<float> out, lse, dq, dk, dv;
  };
  auto empty_result = [&] {
    const std::vector<float> z(std::size_t(n), 0.f);
    return result{z, std::vector<float>(std::size_t(rows)), z, z, z};
  };
  auto run = [&] {
    result r = empty_result();
    attn::forward<void, float, float>(p, view(q.data()), view(k.data()), view(v.data()), {},
                                      out_view(r.out.data()), r.lse.data());
    attn::backward<void, float, float>(p, view(q.data()), view(k.data()), view(v.data()), {}, view(r.out.data()),
                                       r.lse.data(), view(g.data()), out_view(r.dq.data()), out_view(r.dk.data()),
                                       out_view(r.dv.data()));
    return r;
  };
  const result first = run();
  const std::string tail =
      " b2 h3 tq200 tk200 d32 dv32 c1 m0 r0 ld32,32,32 t" + std::to_string(backend::detail::route_threads());
  backend::route_choice fwd, bwd;
  REQUIRE(find_measured("sdpa fp32 forward" + tail, fwd));
  REQUIRE(find_measured("sdpa fp32 backward" + tail, bwd));
  CHECK(backend::measured_routes().size() == 2);
  CAPTURE(fwd.onednn, fwd.builtin_us, fwd.onednn_us, bwd.onednn, bwd.builtin_us, bwd.onednn_us);
  CHECK(fwd.builtin_us > 0);
  CHECK(fwd.onednn_us > 0);

  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  // Both passes forced onto the routes they chose: the same bits (a forward on one route and a
  // backward on the other is what the choices may make, so force them pass by pass).
  auto forced = [](const backend::route_choice& c) {
    return c.onednn ? backend::cpu_gemm_route::onednn : backend::cpu_gemm_route::openblas;
  };
  result again = empty_result();
  {
    measured_gemm_route r(forced(fwd));
    attn::forward<void, float, float>(p, view(q.data()), view(k.data()), view(v.data()), {},
                                      out_view(again.out.data()), again.lse.data());
  }
  {
    measured_gemm_route r(forced(bwd));
    attn::backward<void, float, float>(p, view(q.data()), view(k.data()), view(v.data()), {}, view(again.out.data()),
                                       again.lse.data(), view(g.data()), out_view(again.dq.data()),
                                       out_view(again.dk.data()), out_view(again.dv.data()));
  }
  CHECK(same(first.out, again.out));
  CHECK(same(first.lse, again.lse));
  CHECK(same(first.dq, again.dq));
  CHECK(same(first.dk, again.dk));
  CHECK(same(first.dv, again.dv));

  // The two routes agree to fp32 rounding (they sum in another order).
  result other = empty_result();
  {
    measured_gemm_route r(fwd.onednn ? backend::cpu_gemm_route::openblas : backend::cpu_gemm_route::onednn);
    attn::forward<void, float, float>(p, view(q.data()), view(k.data()), view(v.data()), {},
                                      {other.out.data(), p.heads * p.tq * p.d, p.tq * p.d, p.d}, other.lse.data());
  }
  float worst = 0;
  for (index_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(first.out[std::size_t(i)] - other.out[std::size_t(i)]));
  CHECK(worst < 1e-5f);

  // Later calls take the recorded choices: the same bits, nothing measured again.
  const result third = run();
  CHECK(backend::measured_routes().size() == 2);
  CHECK(same(first.out, third.out));
  CHECK(same(first.dq, third.dq));
  CHECK(same(first.dk, third.dk));
  CHECK(same(first.dv, third.dv));
  CHECK(read_route_file(file.path).find("sdpa fp32 backward" + tail) != std::string::npos);

  // A small problem (2^16 multiply-adds) is not measured.
  backend::attention_problem small = p;
  small.batch = small.heads = 1, small.tq = small.tk = 32;
  std::vector<float> so(32 * 32), sl(32);
  attn::forward<void, float, float>(small, view(q.data()), view(k.data()), view(v.data()), {}, {so.data(), 32 * 32, 32 * 32, 32},
                                    sl.data());
  CHECK(backend::measured_routes().size() == 2);
}

#endif  // TRAINKIT_HAS_ONEDNN
