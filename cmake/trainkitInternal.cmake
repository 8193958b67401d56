# trainkitInternal.cmake - flags for trainkit's own binaries (tests, examples, benchmarks).
# Nothing here reaches trainkit::trainkit or its consumers.

# -fno-sanitize-recover: a UBSan finding fails the test instead of printing and exiting 0.
set(TRAINKIT_SANITIZE_FLAGS
  -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)

# trainkit_internal_target(<target> [SANITIZE])
#   Always: -Wall -Wextra; with TRAINKIT_WERROR also -Werror.
#   SANITIZE: with TRAINKIT_SANITIZE, compile and link with TRAINKIT_SANITIZE_FLAGS.
function(trainkit_internal_target target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "SANITIZE" "" "")
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    return()
  endif()
  target_compile_options(${target} PRIVATE -Wall -Wextra $<$<BOOL:${TRAINKIT_WERROR}>:-Werror>)
  if(arg_SANITIZE AND TRAINKIT_SANITIZE)
    target_compile_options(${target} PRIVATE ${TRAINKIT_SANITIZE_FLAGS})
    # GCC's flow analysis sees the sanitizers' instrumentation and reports -Wmaybe-uninitialized
    # inside libstdc++ (std::function, <regex> in Catch2's main) that a normal build does not; the
    # non-sanitized build (build-test/) keeps the warning as an error.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      target_compile_options(${target} PRIVATE -Wno-maybe-uninitialized)
    endif()
    target_link_options(${target} PRIVATE ${TRAINKIT_SANITIZE_FLAGS})
  endif()
endfunction()
