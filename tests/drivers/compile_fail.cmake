# compile_fail.cmake - a compile-fail test: the source must not compile, for the expected reason.
#
#   cmake -DCOMPILER=<c++> -DSOURCE=<file.cpp> "-DFLAGS=<flag>|<flag>|..." -P compile_fail.cmake
#
# The first line of SOURCE is `// expect: <regex>` (CMake regex syntax: no \d or \s; use [0-9], [ ]).
# The compiler must exit nonzero and its output must match <regex>. If SOURCE mentions
# TRAINKIT_SHOULD_FAIL, it must first compile cleanly without that macro defined.
foreach(var IN ITEMS COMPILER SOURCE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "compile_fail.cmake: -D${var}=... is required")
  endif()
endforeach()
string(REPLACE "|" ";" flags "${FLAGS}")

file(READ "${SOURCE}" text)
string(REGEX MATCH "^[^\n]*" first_line "${text}")
if(NOT first_line MATCHES "^[ \t]*//[ \t]*expect:[ \t]*(.*[^ \t\r])[ \t\r]*$")
  message(FATAL_ERROR "${SOURCE}: the first line must be `// expect: <regex of the expected diagnostic>`")
endif()
set(expect "${CMAKE_MATCH_1}")

# Plain ASCII diagnostics, no colour codes: the regex should not depend on the locale or a terminal.
set(ENV{LC_ALL} C)
set(ENV{LANG} C)
set(base_cmd "${COMPILER}" ${flags} -fsyntax-only -fdiagnostics-color=never)

string(FIND "${text}" "TRAINKIT_SHOULD_FAIL" has_control)
if(NOT has_control EQUAL -1)
  execute_process(COMMAND ${base_cmd} "${SOURCE}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "control build (without TRAINKIT_SHOULD_FAIL) of ${SOURCE} must compile, "
                        "but it failed:\n${out}${err}")
  endif()
  list(APPEND base_cmd -DTRAINKIT_SHOULD_FAIL)
endif()

execute_process(COMMAND ${base_cmd} "${SOURCE}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must not (expected a diagnostic matching: ${expect})")
endif()
if(NOT "${out}${err}" MATCHES "${expect}")
  message(FATAL_ERROR "${SOURCE} failed to compile, but not with a diagnostic matching\n  ${expect}\n"
                      "compiler output:\n${out}${err}")
endif()
message(STATUS "${SOURCE}: does not compile, as expected (matched: ${expect})")
