// tests/catch_session.cpp - Catch2's implementation, compiled once into trainkit_catch for every
// test executable (its main() comes from catch_main.cpp, tests/mpi/main.cpp or
// tests/cuda/catch_main.cpp, which call run_catch_session).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/catch_session.hpp"

int trainkit_test::run_catch_session(int argc, char** argv) { return Catch::Session().run(argc, argv); }
