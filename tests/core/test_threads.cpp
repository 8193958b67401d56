// Tests of trainkit/core/threads.hpp: how TRAINKIT_THREAD_DEFAULTS() reads the environment it is
// handed and how thread_defaults() reports what is in effect. (The re-execution itself, which only
// a whole program can show, is tested by the examples: example_thread_defaults*.) And of
// trainkit/core/wait_governor.hpp: its decision, its pressure figures, the modes the environment
// allows, and that its throttle really shortens libgomp's idle spin (measured as the CPU time an
// idle worker burns after a region).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <trainkit/core/threads.hpp>
#include <trainkit/core/wait_governor.hpp>

namespace {

// setenv for the scope of a test, put back afterwards.
class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~scoped_env() {
    if (had_) ::setenv(name_.c_str(), old_.c_str(), 1);
    else ::unsetenv(name_.c_str());
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

}  // namespace

TEST_CASE("env_lookup matches whole names in an environment block", "[threads]") {
  using trainkit::detail::env_lookup;
  char a[] = "OMP_NUM_THREADS_X=9", b[] = "OMP_NUM_THREADS=4", c[] = "EMPTY=";
  char* env[] = {a, b, c, nullptr};
  CHECK(std::string(env_lookup(env, "OMP_NUM_THREADS")) == "4");  // not the longer name before it
  CHECK(std::string(env_lookup(env, "EMPTY")).empty());
  CHECK(env_lookup(env, "OMP_NUM") == nullptr);                    // a prefix is not a name
  CHECK(env_lookup(env, "OMP_WAIT_POLICY") == nullptr);
  CHECK(env_lookup(nullptr, "OMP_NUM_THREADS") == nullptr);
}

TEST_CASE("only plain positive integers count as a thread or rank count", "[threads]") {
  using trainkit::detail::positive_int;
  CHECK(positive_int("4") == 4);
  CHECK(positive_int("1") == 1);
  CHECK(positive_int("0") == 0);
  CHECK(positive_int("-2") == 0);
  CHECK(positive_int("4,2") == 0);  // OpenMP's nested list: not a plain number
  CHECK(positive_int("two") == 0);
  CHECK(positive_int("") == 0);
  CHECK(positive_int(nullptr) == 0);
}

TEST_CASE("local ranks come from the launcher: Open MPI, then MPICH, then Slurm", "[threads]") {
  using trainkit::detail::launcher_local_ranks;
  char ompi[] = "OMPI_COMM_WORLD_LOCAL_SIZE=4", mpich[] = "MPI_LOCALNRANKS=3", slurm[] = "SLURM_NTASKS_PER_NODE=2";
  char bad[] = "OMPI_COMM_WORLD_LOCAL_SIZE=x";
  char* all[] = {slurm, mpich, ompi, nullptr};
  char* mpich_slurm[] = {slurm, mpich, nullptr};
  char* only_slurm[] = {slurm, nullptr};
  char* broken[] = {bad, nullptr};
  char* none[] = {nullptr};
  CHECK(launcher_local_ranks(all) == 4);
  CHECK(launcher_local_ranks(mpich_slurm) == 3);
  CHECK(launcher_local_ranks(only_slurm) == 2);
  CHECK(launcher_local_ranks(broken) == 1);
  CHECK(launcher_local_ranks(none) == 1);
}

TEST_CASE("thread_defaults reports the environment in effect and what trainkit added", "[threads]") {
  const int cores = trainkit::detail::affinity_cores();
  REQUIRE(cores >= 1);
  {
    scoped_env n("OMP_NUM_THREADS", "3"), w("OMP_WAIT_POLICY", "PASSIVE"),
        m("TRAINKIT_THREAD_DEFAULTS_SET", "OMP_NUM_THREADS"), l("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
    const trainkit::thread_settings t = trainkit::thread_defaults();
    CHECK(t.cores == cores);
    CHECK(t.local_ranks == 2);
    CHECK(t.threads == 3);
    CHECK(t.passive);
    CHECK(t.threads_set_here);
  }
  {
    scoped_env n("OMP_NUM_THREADS", nullptr), w("OMP_WAIT_POLICY", "active"),
        m("TRAINKIT_THREAD_DEFAULTS_SET", nullptr), l("OMPI_COMM_WORLD_LOCAL_SIZE", nullptr),
        l2("MPI_LOCALNRANKS", nullptr), l3("SLURM_NTASKS_PER_NODE", nullptr);
    const trainkit::thread_settings t = trainkit::thread_defaults();
    CHECK(t.local_ranks == 1);
    CHECK(t.threads == 0);
    CHECK_FALSE(t.passive);
    CHECK_FALSE(t.threads_set_here);
  }
}

// --- the wait governor -------------------------------------------------------------------------

TEST_CASE("wait governor: one hot window throttles, three calm ones in a row end it", "[threads][wait]") {
  trainkit::detail::wait_decider d;
  CHECK_FALSE(d.update(0.05));
  CHECK_FALSE(d.update(0.15));  // at the threshold: not above it
  CHECK(d.update(0.5));
  CHECK(d.update(0.10));        // between off and on: stays, and the calm count starts over
  CHECK(d.update(0.01));
  CHECK(d.update(0.01));
  CHECK(d.update(0.12));        // not calm: start over
  CHECK(d.update(0.01));
  CHECK(d.update(0.01));
  CHECK_FALSE(d.update(0.01));  // the third calm window in a row
  CHECK_FALSE(d.update(0.14));
}

TEST_CASE("wait governor: PSI totals are read from the 'some' line", "[threads][wait]") {
  using trainkit::detail::cpu_pressure_meter;
  char path[] = "/tmp/trainkit_psi_XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  const std::string text = "some avg10=7.40 avg60=12.71 avg300=9.46 total=2090268475\n"
                           "full avg10=0.00 avg60=0.00 avg300=0.00 total=17\n";
  REQUIRE(::write(fd, text.data(), text.size()) == ssize_t(text.size()));
  ::close(fd);
  CHECK(cpu_pressure_meter::psi_total(path) == 2090268475LL);
  std::remove(path);
  CHECK(cpu_pressure_meter::psi_total(path) == -1);  // gone: unreadable, not zero
  cpu_pressure_meter m;
  INFO("pressure source: " << m.source());
  m.begin();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  m.sample();
  const double p = m.end();
  CHECK(p >= 0);
  CHECK(p <= 1);
}

TEST_CASE("wait governor: the user's OpenMP variables and TRAINKIT_WAIT choose the mode", "[threads][wait]") {
  using trainkit::wait_mode;
  using trainkit::detail::governed_mode;
  std::string why;
  {
    scoped_env p("OMP_WAIT_POLICY", "active"), g("GOMP_SPINCOUNT", nullptr), w("TRAINKIT_WAIT", "sleep");
    CHECK(governed_mode(why) == wait_mode::runtime);  // the user's policy wins over TRAINKIT_WAIT
    CHECK(why == "OMP_WAIT_POLICY is set");
  }
  {
    scoped_env p("OMP_WAIT_POLICY", nullptr), g("GOMP_SPINCOUNT", "1000"), w("TRAINKIT_WAIT", nullptr);
    CHECK(governed_mode(why) == wait_mode::runtime);
    CHECK(why == "GOMP_SPINCOUNT is set");
  }
  scoped_env p("OMP_WAIT_POLICY", nullptr), g("GOMP_SPINCOUNT", nullptr);
  {
    scoped_env w("TRAINKIT_WAIT", nullptr);
    CHECK(governed_mode(why) == wait_mode::adaptive);
  }
  {
    scoped_env w("TRAINKIT_WAIT", "spin");
    CHECK(governed_mode(why) == wait_mode::spin);
    CHECK(why == "TRAINKIT_WAIT=spin");
  }
  {
    scoped_env w("TRAINKIT_WAIT", "sleep");
    CHECK(governed_mode(why) == wait_mode::sleep);
  }
  {
    scoped_env w("TRAINKIT_WAIT", "sometimes");  // named on stderr, the default kept
    CHECK(governed_mode(why) == wait_mode::adaptive);
  }
}

#if TRAINKIT_HAS_OPENMP
namespace {
double process_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

/// Mean CPU time (ms) the process burns in the 20 ms after a parallel region while its master
/// sleeps: the idle workers' spin.
double idle_worker_spin_ms() {
  std::atomic<int> sink{0};
  double sum = 0;
  constexpr int rounds = 20;
  for (int r = 0; r < rounds; ++r) {
#pragma omp parallel
    sink.fetch_add(1, std::memory_order_relaxed);
    const double c0 = process_cpu_seconds();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    sum += process_cpu_seconds() - c0;
  }
  return 1e3 * sum / rounds;
}
}  // namespace

TEST_CASE("wait governor: throttling shortens the idle workers' spin, and ends with it", "[threads][wait]") {
  using trainkit::wait_mode;
  std::string why;
  if (trainkit::detail::governed_mode(why) == wait_mode::runtime || omp_get_max_threads() < 2) {
    WARN("skipped: the wait is not trainkit's to govern here (" << why << ", " << omp_get_max_threads() << " threads)");
    return;
  }
  // The process's own governor must not throttle behind the test's back: ctest sets TRAINKIT_WAIT=spin.
  REQUIRE(trainkit::wait_policy().mode == wait_mode::spin);
  const double spinning = idle_worker_spin_ms();
  double throttled = 0;
  {
    trainkit::detail::wait_governor g(wait_mode::sleep);
    CHECK(g.status().sleeping);
    throttled = idle_worker_spin_ms();
  }
  const double after = idle_worker_spin_ms();
  INFO("idle workers' CPU per 20 ms after a region: spinning " << spinning << " ms, throttled " << throttled
                                                              << " ms, after the holder left " << after << " ms");
  // libgomp's throttled spin is 1000 pauses (tens of microseconds); its default about 300,000.
  CHECK(throttled < 0.5);
  if (spinning < 1.0 || after < 1.0) {
    WARN("the spinning worker got too little CPU here to tell the two apart (" << spinning << " / " << after << " ms)");
  } else {
    CHECK(throttled < spinning / 4);
    CHECK(throttled < after / 4);
  }
}

#endif  // TRAINKIT_HAS_OPENMP

TEST_CASE("wait governor: busy threads beyond the CPUs make the adaptive governor throttle", "[threads][wait]") {
  using trainkit::wait_mode;
  std::string why;
  if (trainkit::detail::governed_mode(why) == wait_mode::runtime) {
    WARN("skipped: " << why);
    return;
  }
  trainkit::detail::wait_governor g(wait_mode::adaptive);
  std::atomic<bool> stop{false};
  std::vector<std::thread> hog;
  const int n = 2 * trainkit::detail::affinity_cores() + 1;
  for (int i = 0; i < n; ++i)
    hog.emplace_back([&stop] {
      volatile unsigned x = 0;
      while (!stop.load(std::memory_order_relaxed)) x = x + 1;
    });
  bool slept = false;
  for (int i = 0; i < 50 && !slept; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    slept = g.status().sleeping;
  }
  stop = true;
  for (auto& t : hog) t.join();
  INFO("pressure " << g.status().pressure << " from " << g.status().reason);
  CHECK(slept);
  // Back to spinning once the hog is gone - unless other processes keep the CPUs busy (ctest -j).
  bool spinning = false;
  for (int i = 0; i < 30 && !spinning; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    spinning = !g.status().sleeping;
  }
  if (!spinning) WARN("still throttled 3 s after the hog stopped (pressure " << g.status().pressure << "): a busy machine");
  CHECK(g.status().switches >= 1);
}
