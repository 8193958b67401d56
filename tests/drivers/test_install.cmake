# test_install.cmake - package tests: consume trainkit the way a user does.
#
#   cmake -DMODE=<install|find_package|pkg_config|add_subdirectory> -DSOURCE_DIR=<trainkit source>
#         -DBUILD_DIR=<trainkit build> -DWORK_DIR=<scratch> -DPREFIX=<install prefix>
#         -DPKGCONFIG_DIR=<prefix>/<libdir>/pkgconfig -DGENERATOR=<gen> -DCXX_COMPILER=<c++>
#         -DEXPECTED_VERSION=<x.y.z> [-DPKG_CONFIG=<pkg-config>] -P test_install.cmake
#
# install:          cmake --install BUILD_DIR --prefix PREFIX (fresh prefix each time)
# find_package:     configure, build and run tests/consumer with CMAKE_PREFIX_PATH=PREFIX
# pkg_config:       compile tests/consumer/main.cpp with `pkg-config --cflags --libs trainkit`
# add_subdirectory: tests/consumer with add_subdirectory(SOURCE_DIR)
# The consumer prints "trainkit <TRAINKIT_VERSION_*>"; it must equal the project VERSION.
foreach(var IN ITEMS MODE SOURCE_DIR BUILD_DIR WORK_DIR PREFIX EXPECTED_VERSION)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "test_install.cmake: -D${var}=... is required")
  endif()
endforeach()

set(consumer_src "${SOURCE_DIR}/tests/consumer")

function(run_checked what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmdline)
    message(FATAL_ERROR "${what} failed (exit ${rc}):\n  ${cmdline}\n${out}${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

function(run_consumer exe)
  run_checked("running the consumer" "${exe}")
  message(STATUS "consumer says: ${last_output}")
  string(REPLACE "." "\\." version_re "${EXPECTED_VERSION}")
  if(NOT last_output MATCHES "^trainkit ${version_re}( |\n|$)")
    message(FATAL_ERROR "consumer output does not start with 'trainkit ${EXPECTED_VERSION}' "
                        "(TRAINKIT_VERSION_* in config.hpp must match project(VERSION)):\n${last_output}")
  endif()
  # oneDNN reaches the consumer whichever way it is consumed (the CMake target, pkg-config).
  if(EXPECT_ONEDNN AND NOT last_output MATCHES "onednn on")
    message(FATAL_ERROR "the consumer was built without TRAINKIT_HAS_ONEDNN, but this trainkit was "
                        "configured with oneDNN (${MODE}):\n${last_output}")
  endif()
endfunction()

function(build_cmake_consumer build_dir)
  file(REMOVE_RECURSE "${build_dir}")
  set(gen_args "")
  if(DEFINED GENERATOR AND NOT GENERATOR STREQUAL "")
    set(gen_args -G "${GENERATOR}")
  endif()
  set(cxx_args "")
  if(DEFINED CXX_COMPILER AND NOT CXX_COMPILER STREQUAL "")
    set(cxx_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
  endif()
  run_checked("configuring tests/consumer (${MODE})"
    "${CMAKE_COMMAND}" -S "${consumer_src}" -B "${build_dir}" ${gen_args} ${cxx_args}
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF ${ARGN})
  message(STATUS "${last_output}")
  run_checked("building tests/consumer (${MODE})" "${CMAKE_COMMAND}" --build "${build_dir}")
  run_consumer("${build_dir}/trainkit_consumer")
  list(FIND ARGN "-DTRAINKIT_CONSUMER_PRECOMPILED=OFF" no_precompiled)
  if(no_precompiled EQUAL -1)
    run_checked("running the trainkit::precompiled consumer" "${build_dir}/trainkit_consumer_precompiled")
    message(STATUS "precompiled consumer says: ${last_output}")
  endif()
endfunction()

if(MODE STREQUAL "install")
  file(REMOVE_RECURSE "${PREFIX}")
  run_checked("cmake --install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}")
  foreach(f IN ITEMS include/trainkit/config.hpp)
    if(NOT EXISTS "${PREFIX}/${f}")
      message(FATAL_ERROR "install is missing ${PREFIX}/${f}")
    endif()
  endforeach()
  file(GLOB_RECURSE configs "${PREFIX}/*/trainkitConfig.cmake")
  file(GLOB_RECURSE pcs "${PREFIX}/*/trainkit.pc")
  if(NOT configs OR NOT pcs)
    message(FATAL_ERROR "install is missing trainkitConfig.cmake or trainkit.pc under ${PREFIX}")
  endif()
  message(STATUS "installed to ${PREFIX}")

elseif(MODE STREQUAL "find_package")
  build_cmake_consumer("${WORK_DIR}/find_package"
    "-DCMAKE_PREFIX_PATH=${PREFIX}"
    "-DTRAINKIT_CONSUMER_EXPECT_PREFIX=${PREFIX}"
    "-DTRAINKIT_CONSUMER_EXPECT_VERSION=${EXPECTED_VERSION}")

elseif(MODE STREQUAL "add_subdirectory")
  build_cmake_consumer("${WORK_DIR}/add_subdirectory"
    "-DTRAINKIT_CONSUMER_SOURCE_DIR=${SOURCE_DIR}" "-DTRAINKIT_CONSUMER_PRECOMPILED=OFF")

elseif(MODE STREQUAL "pkg_config")
  if(NOT DEFINED PKG_CONFIG OR NOT DEFINED PKGCONFIG_DIR)
    message(FATAL_ERROR "pkg_config mode needs -DPKG_CONFIG=... and -DPKGCONFIG_DIR=...")
  endif()
  set(ENV{PKG_CONFIG_PATH} "${PKGCONFIG_DIR}")
  run_checked("pkg-config --modversion trainkit" "${PKG_CONFIG}" --modversion trainkit)
  string(STRIP "${last_output}" pc_version)
  if(NOT pc_version STREQUAL EXPECTED_VERSION)
    message(FATAL_ERROR "pkg-config reports trainkit ${pc_version}, expected ${EXPECTED_VERSION}")
  endif()
  run_checked("pkg-config --cflags --libs trainkit" "${PKG_CONFIG}" --cflags --libs trainkit)
  string(STRIP "${last_output}" pc_flags)
  message(STATUS "pkg-config --cflags --libs trainkit: ${pc_flags}")
  separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
  # The headers must come from the install, not the source tree.
  file(REAL_PATH "${PREFIX}" real_prefix)
  set(found_prefix FALSE)
  foreach(flag IN LISTS pc_flags)
    if(flag MATCHES "^-I(.*)$")
      file(REAL_PATH "${CMAKE_MATCH_1}" dir)
      if(dir MATCHES "^${real_prefix}/")
        set(found_prefix TRUE)
      endif()
    endif()
  endforeach()
  if(NOT found_prefix)
    message(FATAL_ERROR "pkg-config's -I flags do not point into ${PREFIX}: ${pc_flags}")
  endif()
  set(out_dir "${WORK_DIR}/pkg_config")
  file(REMOVE_RECURSE "${out_dir}")
  file(MAKE_DIRECTORY "${out_dir}")
  if(NOT DEFINED CXX_COMPILER OR CXX_COMPILER STREQUAL "")
    set(CXX_COMPILER c++)
  endif()
  run_checked("compiling tests/consumer/main.cpp with pkg-config flags"
    "${CXX_COMPILER}" -std=c++20 "${consumer_src}/main.cpp" -o "${out_dir}/trainkit_consumer" ${pc_flags})
  run_consumer("${out_dir}/trainkit_consumer")

else()
  message(FATAL_ERROR "test_install.cmake: unknown MODE '${MODE}'")
endif()
