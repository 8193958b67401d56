# tests/drivers/packaging_tests.cmake - CTest tests for the packaging and the API docs, included at the
# end of tests/CMakeLists.txt. Each runs a script that also works on its own (see its header):
#
#   package_conan_create  scripts/conan-create.sh <build>/package-conan    label "package"
#                         `conan create` (default, with_mpi, and with_cuda where CUDA is installed)
#                         in an isolated, offline CONAN_HOME; test_package/ (a Debug build)
#                         trains a tiny model.
#                         Skipped (77) when conan is not installed (pip install conan).
#   package_vcpkg_port    scripts/vcpkg-port-check.sh <build>/package-vcpkg label "package"
#                         ports/trainkit/portfile.cmake's steps with plain CMake, then
#                         find_package and pkg-config consumers of the vcpkg-style prefix.
#   docs_doxygen          scripts/docs.sh <build>/docs                    label "docs"
#                         doxygen docs/Doxyfile with zero warnings. Skipped (77) without doxygen.
#
# Run them alone: ctest --test-dir <build> -L package   /   ctest --test-dir <build> -L docs

set(_trainkit_scripts "${PROJECT_SOURCE_DIR}/scripts")

# test_package/ in Debug: the package is header-only (one package id for every build type), and a
# -O0 consumer with asserts on compiles in 16 s where Release (-O3) took 33 s, three times per run.
add_test(NAME package_conan_create
  COMMAND bash "${_trainkit_scripts}/conan-create.sh" "${PROJECT_BINARY_DIR}/package-conan" -- -s build_type=Debug)
set_tests_properties(package_conan_create PROPERTIES
  LABELS package
  TIMEOUT 1800
  SKIP_RETURN_CODE 77)

add_test(NAME package_vcpkg_port
  COMMAND bash "${_trainkit_scripts}/vcpkg-port-check.sh" "${PROJECT_BINARY_DIR}/package-vcpkg")
set_tests_properties(package_vcpkg_port PROPERTIES
  LABELS package
  TIMEOUT 900
  ENVIRONMENT "CXX=${CMAKE_CXX_COMPILER}")

add_test(NAME docs_doxygen
  COMMAND bash "${_trainkit_scripts}/docs.sh" "${PROJECT_BINARY_DIR}/docs")
set_tests_properties(docs_doxygen PROPERTIES
  LABELS docs
  TIMEOUT 600
  SKIP_RETURN_CODE 77)

unset(_trainkit_scripts)
