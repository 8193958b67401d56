// tests/catch_main.cpp - main() of the test executables: Catch2's session (tests/catch_session.cpp).
#include "support/catch_session.hpp"

int main(int argc, char** argv) { return trainkit_test::run_catch_session(argc, argv); }
