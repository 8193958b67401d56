// trainkit/precompiled_definitions.hpp - the definitions behind TRAINKIT_PRECOMPILED. Include it
// in exactly one source file of a program whose other files are compiled with
// -DTRAINKIT_PRECOMPILED (the CMake target trainkit::precompiled is that file, compiled once):
//
//   // trainkit_precompiled.cpp
//   #include <trainkit/precompiled_definitions.hpp>
//
// It explicitly instantiates what trainkit/precompiled.hpp lists, so that every other file only
// declares it. (The same pattern as Boost.Asio's separate compilation.)
#pragma once

#ifndef TRAINKIT_PRECOMPILED_DEFINITIONS
#define TRAINKIT_PRECOMPILED_DEFINITIONS 1
#endif
#include "trainkit/trainkit.hpp"  // IWYU pragma: export
