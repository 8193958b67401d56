// tests/io/test_state.cpp - save_state/load_state for every kind of component (module with
// buffers, SGD and Adam, schedules, generators, batch iterators, loss scalers, compression
// residuals, plain structs), the mismatch errors, training_state, the preemption guard (signals
// from outside, never run on a computing thread), the snapshot timer and resumable_run.
#include <catch2/catch.hpp>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "io/io_test_util.hpp"
#include "trainkit/amp/loss_scaler.hpp"
#include "trainkit/core/seed.hpp"
#include "trainkit/compression/codecs.hpp"
#include "trainkit/io/io.hpp"
#include "trainkit/trainkit.hpp"

using namespace trainkit;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

std::shared_ptr<nn::sequential<float>> make_net(std::uint64_t seed, index_t hidden = 5) {
  generator g(seed);
  return nn::make_sequential(std::make_shared<nn::linear<float>>(3, hidden, true, g),
                             std::make_shared<nn::batch_norm1d<float>>(hidden),
                             std::make_shared<nn::relu<float>>(),
                             std::make_shared<nn::linear<float>>(hidden, 2, true, g));
}

bool same_state(const nn::module<float>& a, const nn::module<float>& b) {
  auto sa = a.state_dict(), sb = b.state_dict();
  if (sa.size() != sb.size()) return false;
  for (std::size_t i = 0; i < sa.size(); ++i)
    if (sa[i].first != sb[i].first || sa[i].second.to_vector() != sb[i].second.to_vector()) return false;
  return true;
}

void train_a_bit(nn::module<float>& net, optim::sgd<float>& opt, int steps) {
  generator g(99);
  for (int i = 0; i < steps; ++i) {
    auto x = tensor<float>::empty({4, 3});
    fill_normal(g, x.data(), 12, 0.0f, 1.0f);
    auto y = net.forward(var<float>(x));
    auto loss = autograd::mean(y * y);
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}

/// A user's own state struct, with an enum, a bool and a nested struct.
enum class phase : std::uint8_t { warmup = 1, main = 2 };
struct inner {
  double best = 0.0;
  std::int32_t patience = 0;
};
struct user_state {
  std::uint64_t seed = 0;
  phase ph = phase::warmup;
  bool done = false;
  inner in;
  std::string tag;
};

}  // namespace

TEST_CASE("modules, optimizers and schedules round trip through save_state", "[io][state]") {
  auto net = make_net(1);
  optim::sgd<float> opt(net->parameters(), {.lr = 0.05, .momentum = 0.9});
  train_a_bit(*net, opt, 3);
  optim::cyclic_lr sched({.base_lr = 0.01, .max_lr = 0.1, .step_size_up = 4});
  for (int i = 0; i < 5; ++i) sched.step(opt);

  io::snapshot snap;
  io::save_state(snap, "model", *net);
  io::save_state(snap, "optimizer", opt);
  io::save_state(snap, "schedule", sched);
  const auto dir = io_test::fresh_dir("state_roundtrip");
  snap.write(dir / "s.tks");
  const io::snapshot back = io::snapshot::read(dir / "s.tks");
  // The buffers of batch norm are in the model section.
  REQUIRE(back.section("model").contains("1.running_mean"));
  REQUIRE(back.section("model").contains("1.num_batches_tracked"));
  REQUIRE(back.section("optimizer").get_int("step") == 3);
  REQUIRE(back.section("optimizer").get_real("momentum") == 0.9);
  REQUIRE(back.section("schedule").get_int("step") == 5);

  auto net2 = make_net(2);
  REQUIRE(!same_state(*net, *net2));
  optim::sgd<float> opt2(net2->parameters(), {.lr = 1.0});
  optim::cyclic_lr sched2({.base_lr = 0.01, .max_lr = 0.1, .step_size_up = 4});
  io::load_state(back, "model", *net2);
  io::load_state(back, "optimizer", opt2);
  io::load_state(back, "schedule", sched2);
  REQUIRE(same_state(*net, *net2));
  REQUIRE(opt2.lr() == opt.lr());
  REQUIRE(opt2.get_state().step == 3);
  REQUIRE(opt2.get_state().params[0].momentum_buffer.to_vector() ==
          opt.get_state().params[0].momentum_buffer.to_vector());
  REQUIRE(sched2.current_step() == 5);

  // Both continue identically.
  train_a_bit(*net, opt, 2);
  train_a_bit(*net2, opt2, 2);
  REQUIRE(same_state(*net, *net2));

  // Adam too (counters per parameter).
  optim::adamw<float> a1(net->parameters(), {.lr = 1e-3});
  for (auto& p : net->parameters()) p.set_grad(tensor<float>::ones(p.sizes()));
  a1.step();
  io::snapshot sa;
  io::save_state(sa, "opt", a1);
  REQUIRE(sa.section("opt").get_int("0.step") == 1);
  optim::adamw<float> a2(net2->parameters(), {.lr = 5.0});
  io::load_state(sa, "opt", a2);
  REQUIRE(a2.lr() == 1e-3);
  REQUIRE(a2.state_dict().tensors.size() == a1.state_dict().tensors.size());
}

TEST_CASE("loading into a different model names the record and the file", "[io][state]") {
  const auto dir = io_test::fresh_dir("state_mismatch");
  auto net = make_net(1, 5);
  io::snapshot snap;
  io::save_state(snap, "model", *net);
  snap.write(dir / "s.tks");
  const auto back = io::snapshot::read(dir / "s.tks");

  auto wider = make_net(1, 6);
  const auto before = wider->state_dict()[0].second.to_vector();
  REQUIRE_THROWS_WITH(io::load_state(back, "model", *wider),
                      Contains("record '0.weight' of section 'model'") &&
                          Contains((dir / "s.tks").string()) &&
                          Contains("has shape [5, 3], expected [6, 3]"));
  REQUIRE(wider->state_dict()[0].second.to_vector() == before);  // untouched

  auto deeper = nn::make_sequential(
      std::make_shared<nn::linear<float>>(3, 5), std::make_shared<nn::batch_norm1d<float>>(5),
      std::make_shared<nn::relu<float>>(), std::make_shared<nn::linear<float>>(5, 2),
      std::make_shared<nn::linear<float>>(2, 2));
  REQUIRE_THROWS_WITH(io::load_state(back, "model", *deeper), Contains("no record '4.weight'"));
  auto shallower = nn::make_sequential(std::make_shared<nn::linear<float>>(3, 5),
                                       std::make_shared<nn::batch_norm1d<float>>(5));
  REQUIRE_THROWS_WITH(io::load_state(back, "model", *shallower),
                      Contains("record(s) the object does not have") && Contains("'3.weight'"));
  REQUIRE_THROWS_WITH(io::load_state(back, "optimizer", *net), Contains("no section 'optimizer'"));

  // A float64 model from a float32 snapshot: the dtype is named.
  auto dnet = nn::make_sequential(std::make_shared<nn::linear<double>>(3, 5));
  REQUIRE_THROWS_WITH(io::load_state(back, "model", *dnet),
                      Contains("float32") && Contains("read as float64"));
}

TEST_CASE("value states: generators, batch iterators, scalers, plain structs", "[io][state]") {
  io::snapshot snap;
  generator g(7);
  g.reserve(1000);
  io::save_state(snap, "rng", g);
  REQUIRE(snap.section("rng").names() == std::vector<std::string>{"seed", "offset"});

  auto x = tensor<float>::zeros({10, 2});
  auto y = tensor<std::int64_t>::zeros({10});
  data::batch_iterator<float> it(x, y, 3, true, 42);
  it.set_epoch(2);
  (void)it.next();
  io::save_state(snap, "batches", it);

  amp::dynamic_scaling scaler({.init_scale = 1024.0, .growth_interval = 10});
  scaler.set_state({.scale = 512.0, .growth_tracker = 7});
  io::save_state(snap, "scaler", scaler);
  amp::no_scaling none;
  io::save_state(snap, "none", none);
  REQUIRE(snap.section("none").empty());

  user_state u{.seed = ~std::uint64_t(0),
               .ph = phase::main,
               .done = true,
               .in = {.best = 0.25, .patience = -3},
               .tag = "x"};
  io::save_state(snap, "user", u);
  REQUIRE(snap.section("user").names() == std::vector<std::string>{"0", "1", "2", "3.0", "3.1", "4"});
  std::int64_t counter = 17;
  io::save_state(snap, "counter", counter);

  const auto back = io::snapshot::from_bytes(snap.to_bytes(), "mem");
  generator g2;
  io::load_state(back, "rng", g2);
  REQUIRE(g2.get_state() == g.get_state());
  data::batch_iterator<float> it2(x, y, 3, true, 0);
  io::load_state(back, "batches", it2);
  REQUIRE(it2.get_state() == it.get_state());
  REQUIRE(it2.order() == it.order());
  amp::dynamic_scaling scaler2({.init_scale = 1024.0, .growth_interval = 10});
  io::load_state(back, "scaler", scaler2);
  REQUIRE(scaler2.get_state() == scaler.get_state());
  io::load_state(back, "none", none);
  user_state u2;
  io::load_state(back, "user", u2);
  REQUIRE(u2.seed == u.seed);
  REQUIRE(u2.ph == phase::main);
  REQUIRE(u2.done);
  REQUIRE(u2.in.best == 0.25);
  REQUIRE(u2.in.patience == -3);
  REQUIRE(u2.tag == "x");
  std::int64_t c2 = 0;
  io::load_state(back, "counter", c2);
  REQUIRE(c2 == 17);

  // A scaler snapshot whose growth tracker does not fit the options is refused by the scaler.
  amp::dynamic_scaling short_interval({.growth_interval = 5});
  REQUIRE_THROWS_AS(io::load_state(back, "scaler", short_interval), value_error);
  // The wrong kind of section.
  REQUIRE_THROWS_WITH(io::load_state(back, "rng", it2), Contains("no record '0'"));
}

TEST_CASE("compression residuals round trip", "[io][state]") {
  compression::int8 comp;
  float* w = comp.feedback().worker(0, 256);
  for (int i = 0; i < 256; ++i) w[i] = 0.001f * static_cast<float>(i);
  float* s = comp.feedback().server(1, 128);
  s[3] = -2.0f;
  io::snapshot snap;
  io::save_state(snap, "compression", comp);
  REQUIRE(snap.section("compression").names() == std::vector<std::string>{"worker.0", "server.1"});
  compression::int8 comp2;
  io::load_state(io::snapshot::from_bytes(snap.to_bytes()), "compression", comp2);
  REQUIRE(comp2.state().size() == 2);
  REQUIRE(comp2.feedback().worker(0, 256)[255] == w[255]);
  REQUIRE(comp2.feedback().server(1, 128)[3] == -2.0f);
}

TEST_CASE("training_state captures and restores everything, default generator included", "[io][state]") {
  set_seed(5);
  auto net = make_net(3);
  optim::sgd<float> opt(net->parameters(), {.lr = 0.1, .momentum = 0.5});
  optim::warmup_cosine_lr sched({.base_lr = 0.1, .warmup_steps = 2, .total_steps = 20});
  generator aug(11);
  io::training_state st;
  st.add("model", *net).add("optimizer", opt).add("schedule", sched).add_generator("augment", aug);
  REQUIRE(st.sections() == std::vector<std::string>{"progress", "rng.default", "model", "optimizer",
                                                    "schedule", "rng.augment"});
  REQUIRE_THROWS_AS(st.add("model", *net), usage_error);
  REQUIRE_THROWS_AS(st.add("progress", aug), usage_error);

  train_a_bit(*net, opt, 2);
  sched.step(opt);
  aug.reserve(40);
  default_generator().reserve(8);
  st.progress() = {.step = 2, .epoch = 1};
  const auto snap = st.capture();
  const auto saved_default = default_generator().get_state();
  REQUIRE(snap.section("meta").get_string("library").starts_with("trainkit "));

  // Move everything on, then restore.
  train_a_bit(*net, opt, 3);
  sched.step(opt);
  aug.reserve(4);
  default_generator().reserve(100);
  st.progress() = {};
  st.restore(io::snapshot::from_bytes(snap.to_bytes(), "mem"));
  REQUIRE(st.progress() == io::run_progress{.step = 2, .epoch = 1});
  REQUIRE(default_generator().get_state() == saved_default);
  REQUIRE(aug.offset() == 10);
  REQUIRE(sched.current_step() == 1);
  REQUIRE(opt.get_state().step == 2);

  io::snapshot partial;
  io::save_state(partial, "progress", st.progress());
  REQUIRE_THROWS_WITH(st.restore(partial), Contains("lacks section(s) 'rng.default', 'model'"));
}

TEST_CASE("a snapshot carries the CPU kernel routes; a resume on the same kind of machine takes them",
          "[io][state][route]") {
  // The run that writes the snapshot measured one shape (oneDNN faster); the resumed run is on a
  // fresh machine of the same kind (an empty route file) where its own timing would say otherwise.
  using backend::detail::route_table;
  const std::string dir = std::string(TRAINKIT_TEST_TMP_DIR) + "/";
  std::filesystem::remove(dir + "routes-writer.tsv");
  std::filesystem::remove(dir + "routes-resumer.tsv");
  struct restore_table {
    ~restore_table() { route_table::get().use_file(""); }
  } restore;
  route_table::get().use_file(dir + "routes-writer.tsv");
  int runs = 0;
  CHECK(route_table::get().choose("k-snapshot", [&](bool onednn) {
    ++runs;
    std::this_thread::sleep_for(std::chrono::milliseconds(onednn ? 1 : 5));
    return true;
  }));
  set_seed(5);
  auto net = make_net(3);
  io::training_state st;
  st.add("model", *net);
  const auto bytes = st.capture().to_bytes();
  const auto snap = io::snapshot::from_bytes(bytes, "mem");
  CHECK(snap.section("meta").get_string("cpu_routes").find("k-snapshot\tonednn\t") != std::string::npos);
  CHECK(snap.section("meta").get_string("cpu_machine") == route_table::machine());

  auto slow_onednn = [&](bool onednn) {
    ++runs;
    std::this_thread::sleep_for(std::chrono::milliseconds(onednn ? 5 : 1));
    return true;
  };
  route_table::get().use_file(dir + "routes-resumer.tsv");
  st.restore(snap);
  runs = 0;
  CHECK(route_table::get().choose("k-snapshot", slow_onednn));  // the snapshot's choice, not measured
  CHECK(runs == 0);

  // Written on another kind of machine: the routes are not taken; this machine measures its own.
  io::snapshot foreign;
  for (const auto& name : snap.section_names()) {
    if (name != "meta") {
      foreign.add_section_copy(snap.section(name));
      continue;
    }
    auto& meta = foreign.add_section("meta");
    meta.put_string("library", snap.section("meta").get_string("library"));
    meta.put_string("cpu_machine", "CPU: another; flags: avx2");
    meta.put_string("cpu_routes", snap.section("meta").get_string("cpu_routes"));
  }
  route_table::get().use_file("off");
  st.restore(foreign);
  CHECK_FALSE(route_table::get().choose("k-snapshot", slow_onednn));
  CHECK(runs == 8);
}

TEST_CASE("preemption_guard turns SIGTERM into a flag and restores the previous handler",
          "[io][preemption]") {
  static volatile std::sig_atomic_t previous_called = 0;
  auto previous = +[](int) { previous_called = 1; };
  struct sigaction sa {};
  sa.sa_handler = previous;
  sigemptyset(&sa.sa_mask);
  struct sigaction before {};
  REQUIRE(::sigaction(SIGTERM, &sa, &before) == 0);
  // Signals come from outside the thread, as a launcher's or a scheduler's do (kill to the process):
  // the handler runs on trainkit's own thread, so the flag is set asynchronously.
  auto arrives = [](auto&& seen) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!seen() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return seen();
  };
  auto blocked_here = [](int sig) {
    sigset_t now;
    pthread_sigmask(SIG_BLOCK, nullptr, &now);
    return sigismember(&now, sig) == 1;
  };
  REQUIRE_FALSE(blocked_here(SIGTERM));
  {
    io::preemption_guard guard;
    REQUIRE(!guard.requested());
    REQUIRE_THROWS_AS(io::preemption_guard(), usage_error);
    // Never handled on this thread (it may be inside a oneDNN kernel, whose stack pointer can
    // point into the heap), nor on a thread it starts.
    CHECK(blocked_here(SIGTERM));
    CHECK(blocked_here(SIGINT));
    bool in_child_thread = false;
    std::thread([&] { in_child_thread = blocked_here(SIGTERM); }).join();
    CHECK(in_child_thread);
    ::kill(::getpid(), SIGTERM);
    REQUIRE(arrives([&] { return guard.requested(); }));
    REQUIRE(guard.signal() == SIGTERM);
    REQUIRE(previous_called == 0);
    guard.clear();
    ::kill(::getpid(), SIGINT);
    REQUIRE(arrives([&] { return guard.signal() == SIGINT; }));
  }
  // The previous handler and this thread's mask are back.
  CHECK_FALSE(blocked_here(SIGTERM));
  ::kill(::getpid(), SIGTERM);
  REQUIRE(arrives([&] { return previous_called == 1; }));
  ::sigaction(SIGTERM, &before, nullptr);
  // A new guard after the first one is fine.
  io::preemption_guard again;
  REQUIRE(!again.requested());
}

TEST_CASE("preemption_guard: a stop signal never interrupts a oneDNN GEMM (whose kernel may point rsp into the heap)",
          "[io][preemption]") {
#if TRAINKIT_HAS_ONEDNN
  // oneDNN's generated f32 GEMM kernels (its fp32 matmul on CPUs without AVX-512) move the stack
  // pointer into the heap while they run (oneDNN issue 4845): a handler run on that thread wrote its
  // frame there - on an AVX2-only EPYC a loop like this one aborted within 0.05 s ("corrupted size
  // vs. prev_size"), and so did the Slurm requeue test's ranks. Signals come from another thread,
  // to the process, as a launcher's do; the heap is in use between the GEMMs.
  io::preemption_guard guard;
  const index_t n = 256;  // 128 and 192 ran on kernels that keep rsp; 256 did not
  const std::vector<float> a(std::size_t(n * n), 1.0f), b(std::size_t(n * n), 0.5f);
  std::vector<float> c(std::size_t(n * n));
  std::atomic<bool> done{false};
  std::atomic<int> sent{0};
  std::thread sender([&] {
    while (!done) {
      ::kill(::getpid(), SIGTERM);
      ++sent;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  bool ran = true;
  int wrong = 0;
  for (int i = 0; i < 400 && ran; ++i) {
    ran = backend::onednn_gemm<float>(false, false, n, n, n, 1.0, a.data(), n, b.data(), n, 0.0, c.data(), n);
    auto churn = std::make_unique<std::vector<char>>(std::size_t(100 + (i * 13) % 5000));
    wrong += c[0] != 0.5f * float(n) || c.back() != 0.5f * float(n);
  }
  done = true;
  sender.join();
  if (!ran) {
    WARN("skipped: oneDNN has no fp32 matmul here");
    return;
  }
  CHECK(wrong == 0);
  CHECK(sent.load() > 100);
  CHECK(guard.requested());
#else
  WARN("skipped: built without oneDNN");
#endif
}

TEST_CASE("snapshot_timer: every N steps or M seconds", "[io][preemption]") {
  io::snapshot_timer t({.every_steps = 3});
  REQUIRE(!t.due(1));
  REQUIRE(!t.due(2));
  REQUIRE(t.due(3));
  t.saved(3);
  REQUIRE(!t.due(3));
  REQUIRE(t.due(6));
  io::snapshot_timer never;
  REQUIRE(!never.due(1000));
  io::snapshot_timer by_time({.every_seconds = 1e-9});
  REQUIRE(by_time.due(1));
  REQUIRE_THROWS_AS(io::snapshot_timer({.every_steps = -1}), value_error);
}

TEST_CASE("resumable_run: periodic snapshots, stop on request, resume", "[io][resumable]") {
  const auto dir = io_test::fresh_dir("resumable_run");
  std::vector<std::string> log;
  generator g(1);
  {
    io::resumable_run run({.dir = dir.string(),
                           .resume = io::resume_mode::if_present,
                           .every_steps = 4,
                           .keep_last = 2,
                           .log = [&](std::string_view m) { log.emplace_back(m); }});
    run.track("g", g);
    REQUIRE(!run.resume());  // nothing there yet
    REQUIRE_THAT(log.back(), Contains("starting from scratch"));
    for (int i = 0; i < 10; ++i) {
      g.reserve(4);
      REQUIRE(!run.step_done());
    }
    REQUIRE(run.step() == 10);
    REQUIRE(run.manager()->list().size() == 2);  // steps 4 and 8
    REQUIRE(run.manager()->latest()->step == 8);
    g.reserve(4);
    run.request_stop();
    REQUIRE(run.step_done());  // writes step 11 and says stop
    REQUIRE(run.manager()->latest()->step == 11);
    REQUIRE_THAT(log.back(), Contains("stop requested"));
    run.finish();  // already saved: nothing new
    REQUIRE(run.manager()->list().size() == 2);
  }
  generator g2(1);
  io::resumable_run run2(
      {.dir = dir.string(), .resume = io::resume_mode::required, .log = [&](std::string_view m) { log.emplace_back(m); }});
  run2.track("g", g2);
  REQUIRE(run2.resume());
  REQUIRE(run2.step() == 11);
  REQUIRE(g2.offset() == 11);
  REQUIRE_THAT(log.back(), Contains("resumed from") && Contains("step 11"));

  // Disabled (no directory): only counts.
  io::resumable_run off({});
  REQUIRE(!off.enabled());
  REQUIRE(!off.resume());
  REQUIRE(!off.step_done());
  REQUIRE(off.step() == 1);
  REQUIRE(!off.save());
}

namespace {
// A resumable_run over one generator, logging into `log`.
io::resumable_run_options guard_options(const fs::path& dir, io::resume_mode mode, std::vector<std::string>& log,
                                        std::vector<std::pair<std::string, std::string>> config = {}) {
  return {.dir = dir.string(),
          .resume = mode,
          .config = std::move(config),
          .handle_signals = false,
          .log = [&log](std::string_view m) { log.emplace_back(m); }};
}
// Writes the snapshot of step `steps` of a run over generator g.
void write_run(const fs::path& dir, int steps, std::vector<std::pair<std::string, std::string>> config = {}) {
  std::vector<std::string> log;
  generator g(1);
  io::resumable_run run(guard_options(dir, io::resume_mode::off, log, std::move(config)));
  run.track("g", g);
  for (int i = 0; i < steps; ++i) {
    g.reserve(1);
    run.step_done();
  }
  run.save();
}
void damage(const fs::path& file) {  // flips a byte in the middle: the checksum no longer matches
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(fs::file_size(file) / 2));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(fs::file_size(file) / 2));
  f.write(&c, 1);
}
}  // namespace

TEST_CASE("--resume (required) needs a usable snapshot; auto starts from scratch", "[io][resumable][guard]") {
  std::vector<std::string> log;
  generator g(1);
  SECTION("a mistyped directory") {
    const auto dir = io_test::fresh_dir("guard_missing") / "typo";
    io::resumable_run run(guard_options(dir, io::resume_mode::required, log));
    run.track("g", g);
    REQUIRE_THROWS_MATCHES(run.resume(), io_error,
                           Catch::Matchers::Predicate<io_error>([&](const io_error& e) {
                             const std::string m = e.what();
                             return m.find("no usable snapshot in '" + dir.string() + "'") != std::string::npos &&
                                    m.find("did not exist") != std::string::npos &&
                                    m.find("--resume auto") != std::string::npos;
                           }));
    REQUIRE(g.offset() == 0);
    REQUIRE(!fs::exists(dir));  // nothing created: a retry or --resume auto does not find an empty one
  }
  SECTION("an empty directory, auto") {
    const auto dir = io_test::fresh_dir("guard_empty_auto");
    io::resumable_run run(guard_options(dir, io::resume_mode::if_present, log));
    run.track("g", g);
    REQUIRE(!run.resume());
    REQUIRE_THAT(log.back(), Contains("starting from scratch"));
  }
}

TEST_CASE("a damaged newest snapshot is kept aside, never overwritten", "[io][resumable][guard]") {
  std::vector<std::string> log;
  SECTION("the only snapshot damaged: required is an error naming why, auto starts over") {
    const auto dir = io_test::fresh_dir("guard_damaged_only");
    write_run(dir, 5);
    const fs::path file = dir / "snapshot-000000000005.tks";
    REQUIRE(fs::exists(file));
    damage(file);
    {
      generator g(1);
      io::resumable_run run(guard_options(dir, io::resume_mode::required, log));
      run.track("g", g);
      REQUIRE_THROWS_WITH(run.resume(), Contains("no usable snapshot") && Contains("rejected:") &&
                                            Contains("snapshot-000000000005.tks"));
    }
    REQUIRE(!fs::exists(file));
    const fs::path aside = dir / "snapshot-000000000005.tks.damaged";
    REQUIRE(fs::exists(aside));
    const auto damaged_size = fs::file_size(aside);
    // auto: from scratch, and the new step-5 snapshot lands beside the damaged file.
    write_run(dir, 5);
    REQUIRE(fs::exists(file));
    REQUIRE(fs::exists(aside));
    REQUIRE(fs::file_size(aside) == damaged_size);
  }
  SECTION("a damaged newest file among good ones: fall back, set it aside") {
    const auto dir = io_test::fresh_dir("guard_damaged_newest");
    write_run(dir, 3);
    write_run(dir, 6);
    damage(dir / "snapshot-000000000006.tks");
    generator g(1);
    io::resumable_run run(guard_options(dir, io::resume_mode::required, log));
    run.track("g", g);
    REQUIRE(run.resume());
    REQUIRE(run.step() == 3);
    REQUIRE(g.offset() == 3);
    REQUIRE(fs::exists(dir / "snapshot-000000000006.tks.damaged"));
    REQUIRE(!fs::exists(dir / "snapshot-000000000006.tks"));
    // A second damaged file of the same name gets its own suffix.
    write_run(dir, 6);
    damage(dir / "snapshot-000000000006.tks");
    generator g2(1);
    io::resumable_run run2(guard_options(dir, io::resume_mode::if_present, log));
    run2.track("g", g2);
    REQUIRE(run2.resume());
    REQUIRE(fs::exists(dir / "snapshot-000000000006.tks.damaged.1"));
  }
}

TEST_CASE("a resume whose trajectory settings differ says how", "[io][resumable][guard]") {
  const auto dir = io_test::fresh_dir("guard_config");
  write_run(dir, 4, {{"batch", "128"}, {"seed", "1"}, {"world_size", "2"}});
  std::vector<std::string> log;
  SECTION("the same settings resume quietly") {
    generator g(1);
    io::resumable_run run(
        guard_options(dir, io::resume_mode::required, log, {{"batch", "128"}, {"seed", "1"}, {"world_size", "2"}}));
    run.track("g", g);
    REQUIRE(run.resume());
    REQUIRE(g.offset() == 4);
  }
  SECTION("required: an error naming every difference, nothing restored") {
    generator g(1);
    io::resumable_run run(
        guard_options(dir, io::resume_mode::required, log, {{"batch", "64"}, {"seed", "1"}, {"compression", "int8"}}));
    run.track("g", g);
    REQUIRE_THROWS_AS(run.resume(), value_error);
    try {
      run.resume();
    } catch (const value_error& e) {
      const std::string m = e.what();
      CHECK_THAT(m, Contains("batch: snapshot '128', now '64'"));
      CHECK_THAT(m, Contains("compression: not recorded in the snapshot, now 'int8'"));
      CHECK_THAT(m, Contains("world_size: snapshot '2', not set now"));
      CHECK_THAT(m, !Contains("seed"));
    }
    REQUIRE(g.offset() == 0);
    REQUIRE(run.step() == 0);
  }
  SECTION("auto: a warning naming the difference, then the resume") {
    generator g(1);
    io::resumable_run run(
        guard_options(dir, io::resume_mode::if_present, log, {{"batch", "64"}, {"seed", "1"}, {"world_size", "2"}}));
    run.track("g", g);
    REQUIRE(run.resume());
    REQUIRE(g.offset() == 4);
    bool warned = false;
    for (const auto& l : log) warned = warned || (l.find("warning") != std::string::npos &&
                                                  l.find("batch: snapshot '128', now '64'") != std::string::npos);
    REQUIRE(warned);
  }
}

TEST_CASE("the data component's sampler and loader resume through save_state", "[io][state][data]") {
  STATIC_REQUIRE(io::snapshottable<data::distributed_sampler>);
  data::distributed_sampler s(50, {.num_replicas = 2, .rank = 1, .seed = 3});
  s.set_epoch(2);
  s.skip(7);
  io::snapshot snap;
  io::save_state(snap, "sampler", s);
  data::distributed_sampler s2(50, {.num_replicas = 2, .rank = 1, .seed = 3});
  io::load_state(io::snapshot::from_bytes(snap.to_bytes()), "sampler", s2);
  REQUIRE(s2.get_state() == s.get_state());
  REQUIRE(s2.indices() == s.indices());

  // A loader resumed mid-epoch hands out the batches the original would have.
  auto x = tensor<float>::empty({40, 3});
  for (index_t i = 0; i < 120; ++i) x.data()[i] = static_cast<float>(i);
  auto y = tensor<std::int64_t>::zeros({40});
  data::tensor_dataset ds(x, y);
  data::distributed_sampler sa(40, {.seed = 5});
  data::data_loader loader(ds, sa, {.batch_size = 6, .num_workers = 2});
  loader.set_epoch(1);
  (void)loader.next();
  (void)loader.next();
  io::snapshot ls;
  io::save_state(ls, "loader", loader);
  const auto expected = loader.next().x.to_vector();
  data::distributed_sampler sb(40, {.seed = 5});
  data::data_loader resumed(ds, sb, {.batch_size = 6, .num_workers = 1});
  io::load_state(ls, "loader", resumed);
  REQUIRE(resumed.next().x.to_vector() == expected);
}
