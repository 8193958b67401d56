// Tests of trainkit/core/threads.hpp: how TRAINKIT_THREAD_DEFAULTS() reads the environment it is
// handed and how thread_defaults() reports what is in effect. (The re-execution itself, which only
// a whole program can show, is tested by the examples: example_thread_defaults*.)
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include <trainkit/core/threads.hpp>

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
        m("TRAINKIT_THREAD_DEFAULTS_SET", "OMP_WAIT_POLICY"), l("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
    const trainkit::thread_settings t = trainkit::thread_defaults();
    CHECK(t.cores == cores);
    CHECK(t.local_ranks == 2);
    CHECK(t.threads == 3);
    CHECK(t.passive);
    CHECK(t.passive_set_here);
    CHECK_FALSE(t.threads_set_here);
  }
  {
    scoped_env n("OMP_NUM_THREADS", nullptr), w("OMP_WAIT_POLICY", "active"),
        m("TRAINKIT_THREAD_DEFAULTS_SET", nullptr), l("OMPI_COMM_WORLD_LOCAL_SIZE", nullptr),
        l2("MPI_LOCALNRANKS", nullptr), l3("SLURM_NTASKS_PER_NODE", nullptr);
    const trainkit::thread_settings t = trainkit::thread_defaults();
    CHECK(t.local_ranks == 1);
    CHECK(t.threads == 0);
    CHECK_FALSE(t.passive);
    CHECK_FALSE(t.passive_set_here);
    CHECK_FALSE(t.threads_set_here);
  }
}
