// tests/catch_main.cpp - Catch2's main(), compiled once into trainkit_catch_main for every test.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
