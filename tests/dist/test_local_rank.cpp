// dist::local_rank / local_device: the launcher variables in their order, bad values named.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "trainkit/dist/local_rank.hpp"

namespace {
struct clean_env {
  clean_env() { clear(); }
  ~clean_env() { clear(); }
  static void clear() {
    for (auto name : trainkit::dist::local_rank_variables) unsetenv(std::string(name).c_str());
  }
};
}  // namespace

TEST_CASE("local_rank reads Open MPI, Slurm, torchrun and Hydra variables in that order", "[dist]") {
  clean_env env;
  CHECK_FALSE(trainkit::dist::local_rank().has_value());
  setenv("MPI_LOCALRANKID", "5", 1);
  CHECK(trainkit::dist::local_rank() == 5);
  setenv("LOCAL_RANK", "4", 1);
  CHECK(trainkit::dist::local_rank() == 4);
  setenv("SLURM_LOCALID", "3", 1);
  CHECK(trainkit::dist::local_rank() == 3);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1);
  CHECK(trainkit::dist::local_rank() == 2);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "two", 1);
  REQUIRE_THROWS_WITH(trainkit::dist::local_rank(), Catch::Contains("OMPI_COMM_WORLD_LOCAL_RANK='two'"));
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "-1", 1);
  REQUIRE_THROWS_AS(trainkit::dist::local_rank(), trainkit::usage_error);
}

TEST_CASE("local_device spreads local ranks over the devices", "[dist]") {
  CHECK(trainkit::dist::local_device(0, 8) == 0);
  CHECK(trainkit::dist::local_device(7, 8) == 7);
  CHECK(trainkit::dist::local_device(9, 8) == 1);
  REQUIRE_THROWS_AS(trainkit::dist::local_device(0, 0), trainkit::usage_error);
}
