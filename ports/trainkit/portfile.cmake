# portfile.cmake - vcpkg overlay port for trainkit (header-only).
#
#   VCPKG_TRAINKIT_SOURCE=/path/to/trainkit vcpkg install trainkit --overlay-ports=/path/to/trainkit/ports
#   VCPKG_TRAINKIT_SOURCE=/path/to/trainkit vcpkg install "trainkit[mpi]" --overlay-ports=/path/to/trainkit/ports
#
# The sources: the local checkout named by the environment variable VCPKG_TRAINKIT_SOURCE, else a
# GitHub release (see the placeholders below). Where vcpkg builds ports in a cleaned environment,
# let the variable through with VCPKG_KEEP_ENV_VARS=VCPKG_TRAINKIT_SOURCE. vcpkg's binary cache
# does not see changes of the checkout: reinstall with --no-binarycaching after editing it.
# scripts/vcpkg-port-check.sh repeats these steps with plain CMake and checks the result.
set(VCPKG_BUILD_TYPE release)  # header-only: one configuration is enough

if(DEFINED ENV{VCPKG_TRAINKIT_SOURCE} AND EXISTS "$ENV{VCPKG_TRAINKIT_SOURCE}/CMakeLists.txt")
  file(TO_CMAKE_PATH "$ENV{VCPKG_TRAINKIT_SOURCE}" SOURCE_PATH)
  message(STATUS "trainkit: sources from VCPKG_TRAINKIT_SOURCE=${SOURCE_PATH}")
else()
  # PLACEHOLDERS: REPO is not a published repository, and SHA512 must be replaced by the real
  # hash of the release archive (vcpkg prints it on the first failed download). Until then, use
  # VCPKG_TRAINKIT_SOURCE.
  vcpkg_from_github(
    OUT_SOURCE_PATH SOURCE_PATH
    REPO trainkit/trainkit
    REF "v${VERSION}"
    SHA512 0
    HEAD_REF main
  )
endif()

vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
  FEATURES
    cuda TRAINKIT_CUDA
    mpi  TRAINKIT_MPI
)

vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    ${FEATURE_OPTIONS}
    -DTRAINKIT_BUILD_TESTS=OFF
    -DTRAINKIT_BUILD_EXAMPLES=OFF
    -DTRAINKIT_BUILD_BENCHMARKS=OFF
)

vcpkg_cmake_install()

# The project installs its CMake package to lib/cmake/trainkit (install(EXPORT ... DESTINATION
# ${CMAKE_INSTALL_LIBDIR}/cmake/trainkit)); vcpkg wants it in share/trainkit.
vcpkg_cmake_config_fixup(CONFIG_PATH lib/cmake/trainkit)
# lib/pkgconfig/trainkit.pc (prefix=${pcfiledir}/../..: relocatable already).
vcpkg_fixup_pkgconfig()
# bin/trainkit-run (the job launcher, a Python script) goes where vcpkg keeps a port's tools.
vcpkg_copy_tools(TOOL_NAMES trainkit-run AUTO_CLEAN)

file(REMOVE_RECURSE
  "${CURRENT_PACKAGES_DIR}/debug/include"
  "${CURRENT_PACKAGES_DIR}/debug/share"
  "${CURRENT_PACKAGES_DIR}/debug"
)

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
