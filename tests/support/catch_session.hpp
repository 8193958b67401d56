// tests/support/catch_session.hpp - the Catch2 session of tests/catch_session.cpp, for the mains that
// do something before or after it (MPI, the CUDA device check): Catch2's implementation is then
// compiled once for the suite rather than in each of them.
#pragma once

namespace trainkit_test {

/// Catch::Session().run(argc, argv): the number of failed test cases (at most 255).
int run_catch_session(int argc, char** argv);

}  // namespace trainkit_test
