# trainkit_mpi_run.cmake - runs an MPI job under a hard time limit and judges it by its output.
# cmake -DMPIEXEC=<mpirun> "-DARGS=<arg>|<arg>|..." [-DLIMIT=<s>] "-DEXPECT=<regex>|<regex>..."
#       ["-DREJECT=<regex>"] -P trainkit_mpi_run.cmake
# Passes when the job ends within LIMIT seconds (default 60) and its combined output matches every
# EXPECT regex and not REJECT; the job's exit code is ignored (a job that loses a rank fails, by
# design). Used by the fault tests of tests/mpi, whose survivors print what they observed.
if(NOT DEFINED LIMIT)
  set(LIMIT 60)
endif()
string(REPLACE "|" ";" args "${ARGS}")
string(REPLACE "|" ";" expects "${EXPECT}")
find_program(TIMEOUT_EXECUTABLE timeout)  # coreutils: SIGTERM (mpirun forwards it to the ranks), then SIGKILL
if(TIMEOUT_EXECUTABLE)
  set(cmd "${TIMEOUT_EXECUTABLE}" -k 10 ${LIMIT} "${MPIEXEC}" ${args})
else()
  set(cmd "${MPIEXEC}" ${args})
endif()
string(REPLACE ";" " " shown "${cmd}")
message(STATUS "running: ${shown}")
string(TIMESTAMP t0 "%s")
math(EXPR hard "${LIMIT} + 30")
execute_process(COMMAND ${cmd} OUTPUT_VARIABLE out ERROR_VARIABLE out RESULT_VARIABLE rc TIMEOUT ${hard})
string(TIMESTAMP t1 "%s")
math(EXPR took "${t1} - ${t0}")
message("---- output (exit ${rc}, ${took} s) ----\n${out}---- end ----")
if(rc STREQUAL "124" OR rc MATCHES "timeout|Timeout" OR took GREATER_EQUAL LIMIT)
  message(FATAL_ERROR "the job did not end within ${LIMIT} s: a hang")
endif()
foreach(re IN LISTS expects)
  if(NOT out MATCHES "${re}")
    message(FATAL_ERROR "expected output matching '${re}' is missing")
  endif()
endforeach()
if(DEFINED REJECT AND NOT REJECT STREQUAL "" AND out MATCHES "${REJECT}")
  message(FATAL_ERROR "output matches '${REJECT}'")
endif()
message(STATUS "passed in ${took} s")
