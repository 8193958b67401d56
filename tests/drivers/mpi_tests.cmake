# tests/drivers/mpi_tests.cmake - the multi-process tests of tests/mpi/, included by tests/CMakeLists.txt
# (it uses trainkit_add_test_executable from there). Does nothing while tests/mpi/ holds no .cpp file.
#
#   tests/mpi/test_<name>.cpp -> in executable test_mpi (with tests/mpi/main.cpp: MPI init, the
#     shared world communicator, Catch2's session, the ranks' results combined; the files compiled
#     as one translation unit), linked with trainkit::mpi (MPI::MPI_CXX).
#   Each file is registered once per rank count in TRAINKIT_MPI_NP as test_mpi_<name>_np<N> (label "mpi"):
#     ${MPIEXEC_EXECUTABLE} -np N [--allow-run-as-root --oversubscribe] test_mpi -# "[#test_<name>]~[.]"
#   (the two OpenMPI flags only when mpiexec is OpenMPI's) - except the fault tests (test_fault*.cpp,
#   not Catch2 tests: their own executable and main()), registered below with the runs they need
#   (labels "mpi;fault").
# No MPI found: a note, and no tests.
set(TRAINKIT_MPI_NP "2;3;4" CACHE STRING "Rank counts each tests/mpi test runs with")
if(TRAINKIT_MPI_NP STREQUAL "2;4")  # the first default, before odd world sizes were required
  set(TRAINKIT_MPI_NP "2;3;4" CACHE STRING "Rank counts each tests/mpi test runs with" FORCE)
endif()
set(TRAINKIT_MPIEXEC_EXTRA_FLAGS "" CACHE STRING "Extra mpiexec flags for tests/mpi (e.g. --mca btl self,vader)")

file(GLOB trainkit_mpi_sources CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/mpi/*.cpp")
list(SORT trainkit_mpi_sources)
if(NOT trainkit_mpi_sources)
  return()
endif()
if(NOT TARGET trainkit::mpi OR NOT MPIEXEC_EXECUTABLE)
  message(STATUS "trainkit: MPI not found; tests/mpi/*.cpp are not built (Debian: libopenmpi-dev openmpi-bin)")
  return()
endif()

execute_process(COMMAND "${MPIEXEC_EXECUTABLE}" --version
  OUTPUT_VARIABLE trainkit_mpiexec_version ERROR_VARIABLE trainkit_mpiexec_version
  RESULT_VARIABLE trainkit_mpiexec_rc)
set(trainkit_mpi_is_openmpi OFF)
set(trainkit_mpiexec_flags ${TRAINKIT_MPIEXEC_EXTRA_FLAGS})
if(trainkit_mpiexec_version MATCHES "Open MPI|OpenRTE")
  set(trainkit_mpi_is_openmpi ON)
  list(PREPEND trainkit_mpiexec_flags --allow-run-as-root --oversubscribe)
endif()

# OpenMPI's own allocations are reported by LeakSanitizer at exit; our leaks are caught by the
# thread_group tests, which run the same code paths above the transport.
set(trainkit_mpi_test_env "ASAN_OPTIONS=detect_leaks=0")

list(FILTER trainkit_mpi_sources EXCLUDE REGEX "/main\\.cpp$")
set(trainkit_mpi_catch_sources "")
foreach(source IN LISTS trainkit_mpi_sources)
  get_filename_component(stem "${source}" NAME_WE)
  if(NOT stem MATCHES "^test_fault")
    list(APPEND trainkit_mpi_catch_sources "${source}")
  endif()
endforeach()
if(trainkit_mpi_catch_sources)
  trainkit_add_test_executable(test_mpi "${CMAKE_CURRENT_SOURCE_DIR}/mpi/main.cpp" ${trainkit_mpi_catch_sources} OWN_MAIN)
  target_link_libraries(test_mpi PRIVATE trainkit::mpi)
endif()

foreach(source IN LISTS trainkit_mpi_sources)
  get_filename_component(stem "${source}" NAME_WE)
  string(REGEX REPLACE "^test_" "" short "${stem}")
  set(name "test_mpi_${short}")

  if(short MATCHES "^fault")
    trainkit_add_test_executable(${name} "${source}" OWN_MAIN)
    target_link_libraries(${name} PRIVATE trainkit::mpi)
    # A rank dies (or stalls) mid-way: the job is judged by the survivors' output, under a hard time
    # limit (tests/drivers/trainkit_mpi_run.cmake); mpirun's exit code says nothing useful here.
    if(NOT trainkit_mpi_is_openmpi)
      message(STATUS "trainkit: ${name} needs OpenMPI's mpirun (--enable-recovery); not registered")
      continue()
    endif()
    set(run_script "${PROJECT_SOURCE_DIR}/tests/drivers/trainkit_mpi_run.cmake")
    # Every survivor names the failed rank, its host and pid (the probe after the timeout).
    set(named ".*rank 2 \\(host [^,]+, pid [0-9]+\\) did not answer within [0-9]+ ms - dead or stalled")
    set(survivors "rank 0: dist_error at iteration [0-9]+ after${named}|rank 1: dist_error at iteration [0-9]+ after${named}")
    foreach(mode IN ITEMS kill stall transport split)
      # --enable-recovery: mpirun keeps the job alive when a rank dies, so the survivors must find out
      # by themselves (our timeout); without it mpirun kills them all about 1 s later (test below).
      set(args -np 3 ${trainkit_mpiexec_flags} --enable-recovery $<TARGET_FILE:${name}> ${mode})
      list(JOIN args "|" args)
      set(expect "${survivors}")
      if(mode STREQUAL "split")  # world ranks in the names, rank 0 the writer by the world's probe
        set(expect "rank 0: dist_error at iteration [0-9]+ after${named}.*this is rank 0 .*lowest surviving rank 0|rank 1: dist_error at iteration [0-9]+ after${named}.*this is rank 1 .*lowest surviving rank 0")
      endif()
      if(mode STREQUAL "transport")  # and the snapshot writer is rank 0 on both
        set(expect "rank 0: dist_error at iteration [0-9]+ after${named}.*lowest surviving rank 0|rank 1: dist_error at iteration [0-9]+ after${named}.*lowest surviving rank 0")
      endif()
      add_test(NAME ${name}_${mode}_np3
        COMMAND "${CMAKE_COMMAND}" "-DMPIEXEC=${MPIEXEC_EXECUTABLE}" "-DARGS=${args}" -DLIMIT=60
                "-DEXPECT=${expect}" -DREJECT=FAIL -P "${run_script}"
        WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}")
      set_tests_properties(${name}_${mode}_np3 PROPERTIES LABELS "mpi;fault" PROCESSORS 3 TIMEOUT 120
                           ENVIRONMENT "${trainkit_mpi_test_env}")
    endforeach()
    # Plain mpirun: OpenMPI tears the job down itself when a rank dies on a signal. Bounded, no hang.
    set(args -np 3 ${trainkit_mpiexec_flags} $<TARGET_FILE:${name}> kill)
    list(JOIN args "|" args)
    add_test(NAME ${name}_mpirun_abort_np3
      COMMAND "${CMAKE_COMMAND}" "-DMPIEXEC=${MPIEXEC_EXECUTABLE}" "-DARGS=${args}" -DLIMIT=60
              "-DEXPECT=rank 2: raise\\(SIGKILL\\)|exited on signal 9" -DREJECT=FAIL -P "${run_script}"
      WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}")
    set_tests_properties(${name}_mpirun_abort_np3 PROPERTIES LABELS "mpi;fault" PROCESSORS 3 TIMEOUT 120
                         ENVIRONMENT "${trainkit_mpi_test_env}")
    continue()
  endif()

  foreach(np IN LISTS TRAINKIT_MPI_NP)
    add_test(NAME ${name}_np${np}
      COMMAND "${MPIEXEC_EXECUTABLE}" ${MPIEXEC_NUMPROC_FLAG} ${np} ${trainkit_mpiexec_flags}
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_mpi> ${MPIEXEC_POSTFLAGS} "-#" -w NoTests "[#${stem}]~[.]"
      WORKING_DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}")
    set_tests_properties(${name}_np${np} PROPERTIES LABELS mpi PROCESSORS ${np} TIMEOUT 600
                         ENVIRONMENT "${trainkit_mpi_test_env}")
  endforeach()
endforeach()
