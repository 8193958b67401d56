#!/usr/bin/env bash
# scripts/vcpkg-port-check.sh [WORK_DIR] - check the vcpkg overlay port (ports/trainkit/) without
# vcpkg: do what portfile.cmake does with plain CMake, then consume the result as a vcpkg user would.
#
#   scripts/vcpkg-port-check.sh                  # WORK_DIR: a temporary directory, removed afterwards
#   scripts/vcpkg-port-check.sh build/vcpkg-check
#   TRAINKIT_VCPKG_FEATURES=mpi scripts/vcpkg-port-check.sh    # as `vcpkg install trainkit[mpi]`
#
# Steps (the options, CONFIG_PATH and feature names are read from ports/trainkit/portfile.cmake,
# so the check follows the portfile):
#   1. vcpkg_cmake_configure   cmake -G Ninja with the portfile's OPTIONS and feature options,
#                              CMAKE_INSTALL_PREFIX=WORK/packages/trainkit_x64-linux, and the
#                              CMAKE_INSTALL_*DIR vcpkg passes
#   2. vcpkg_cmake_install     cmake --build --target install
#   3. vcpkg_cmake_config_fixup(CONFIG_PATH lib/cmake/trainkit): the files to share/trainkit, the
#                              _IMPORT_PREFIX / PACKAGE_PREFIX_DIR depth corrected, lib/cmake removed
#   4. vcpkg_fixup_pkgconfig   prefix=${pcfiledir}/../.., no absolute package paths
#   5. usage and copyright     share/trainkit/usage, share/trainkit/copyright (LICENSE)
#   6. the files vcpkg expects exist, nothing refers to the packages directory; vcpkg.json's
#      version is the CMake project's
#   7. "vcpkg install": the package tree is copied to WORK/installed/x64-linux (another place: the
#      install must be relocatable), then tests/consumer is built with
#      find_package(trainkit CONFIG REQUIRED) against it and run, and tests/consumer/main.cpp is
#      compiled with `pkg-config --cflags --libs trainkit` and run.
# The dependencies (OpenBLAS, zlib, OpenMP, MPI) come from the system here, not from vcpkg ports.
#
# Exit status 0 when every step passed; anything else is a failure (the failing step is named).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
port="$root/ports/trainkit"
portfile="$port/portfile.cmake"

work="${1:-}"
cleanup=""
if [[ -z "$work" ]]; then
  work="$(mktemp -d "${TMPDIR:-/tmp}/trainkit-vcpkg.XXXXXX")"
  cleanup="$work"
  trap 'rm -rf "$cleanup"' EXIT
fi
mkdir -p "$work"
work="$(cd "$work" && pwd)"

fail() {
  echo "vcpkg-port-check: FAILED: $*" >&2
  exit 1
}
step() { echo "== vcpkg-port-check: $*"; }
run() {
  echo "+ $*"
  "$@" || fail "$* (exit $?)"
}

for f in "$port/vcpkg.json" "$portfile" "$port/usage" "$root/LICENSE"; do
  [[ -f "$f" ]] || fail "missing $f"
done

# ---------------------------------------------------------------------------------------------------
# What the portfile says.
mapfile -t port_options < <(sed -nE 's/^[[:space:]]+(-DTRAINKIT_[A-Z_]+=[A-Za-z0-9]+)[[:space:]]*$/\1/p' "$portfile")
config_path="$(sed -nE 's/.*vcpkg_cmake_config_fixup\(CONFIG_PATH[[:space:]]+([^ )]+)\).*/\1/p' "$portfile")"
# vcpkg_check_features: "    <feature> <CMAKE_OPTION>" lines.
mapfile -t feature_map < <(sed -nE '/vcpkg_check_features/,/^\)/s/^[[:space:]]+([a-z0-9-]+)[[:space:]]+(TRAINKIT_[A-Z_]+)[[:space:]]*$/\1 \2/p' "$portfile")
((${#port_options[@]} > 0)) || fail "no -DTRAINKIT_...=... OPTIONS found in $portfile"
[[ -n "$config_path" ]] || fail "no vcpkg_cmake_config_fixup(CONFIG_PATH ...) in $portfile"
((${#feature_map[@]} > 0)) || fail "no vcpkg_check_features FEATURES in $portfile"

version="$(sed -nE 's/^[[:space:]]*VERSION[[:space:]]+([0-9]+\.[0-9]+\.[0-9]+).*/\1/p' "$root/CMakeLists.txt" | head -n1)"
port_version="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' "$port/vcpkg.json" 2>/dev/null ||
  sed -nE 's/^[[:space:]]*"version"[[:space:]]*:[[:space:]]*"([^"]+)".*/\1/p' "$port/vcpkg.json")"
[[ -n "$version" ]] || fail "no project VERSION in CMakeLists.txt"
[[ "$port_version" == "$version" ]] ||
  fail "ports/trainkit/vcpkg.json has version '$port_version', the CMake project $version"

# Features -> ON/OFF options, as vcpkg_check_features(OUT_FEATURE_OPTIONS ...) gives them.
features="${TRAINKIT_VCPKG_FEATURES:-}"
requested=" ${features//,/ } "
feature_options=()
for entry in "${feature_map[@]}"; do
  feature="${entry%% *}"
  option="${entry##* }"
  if [[ "$requested" == *" $feature "* ]]; then
    feature_options+=("-D$option=ON")
  else
    feature_options+=("-D$option=OFF")
  fi
done

triplet="x64-linux"
build="$work/buildtrees/trainkit/$triplet-rel"
packages="$work/packages/trainkit_$triplet"
installed="$work/installed/$triplet"
rm -rf "$work/buildtrees" "$work/packages" "$work/installed" "$work/consumer"

generator=()
if command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)
fi

# ---------------------------------------------------------------------------------------------------
step "1. vcpkg_cmake_configure: ${port_options[*]} ${feature_options[*]}"
run cmake -S "$root" -B "$build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_INSTALL_PREFIX=$packages" \
  -DCMAKE_INSTALL_LIBDIR:STRING=lib \
  -DCMAKE_INSTALL_BINDIR:STRING=bin \
  -DCMAKE_EXPORT_NO_PACKAGE_REGISTRY=ON \
  -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON \
  -DCMAKE_FIND_PACKAGE_NO_SYSTEM_PACKAGE_REGISTRY=ON \
  -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
  "${port_options[@]}" "${feature_options[@]}"

step "2. vcpkg_cmake_install"
run cmake --build "$build" --target install

# ---------------------------------------------------------------------------------------------------
step "3. vcpkg_cmake_config_fixup(CONFIG_PATH $config_path)"
[[ -d "$packages/$config_path" ]] || fail "the install has no $config_path (the portfile's CONFIG_PATH)"
fixup="$work/config_fixup.cmake"
cat >"$fixup" <<'CMAKE'
# The release-only part of vcpkg_cmake_config_fixup (ports/vcpkg-cmake-config), for CONFIG_PATH.
set(release_share "${PACKAGES}/share/${PORT}")
set(release_config "${PACKAGES}/${CONFIG_PATH}")
file(GLOB files "${release_config}/*")
file(COPY ${files} DESTINATION "${release_share}")
file(REMOVE_RECURSE "${release_config}")
get_filename_component(parent "${release_config}" DIRECTORY)
get_filename_component(parent_name "${parent}" NAME)
string(TOLOWER "${parent_name}" parent_name)
if(parent_name STREQUAL "cmake")
  file(REMOVE_RECURSE "${parent}")
endif()
file(GLOB_RECURSE main_cmakes "${release_share}/*.cmake")
foreach(main_cmake IN LISTS main_cmakes)
  file(READ "${main_cmake}" contents)
  string(REGEX REPLACE
[[get_filename_component\(_IMPORT_PREFIX "\${CMAKE_CURRENT_LIST_FILE}" PATH\)(
get_filename_component\(_IMPORT_PREFIX "\${_IMPORT_PREFIX}" PATH\))*]]
[[get_filename_component(_IMPORT_PREFIX "${CMAKE_CURRENT_LIST_FILE}" PATH)
get_filename_component(_IMPORT_PREFIX "${_IMPORT_PREFIX}" PATH)
get_filename_component(_IMPORT_PREFIX "${_IMPORT_PREFIX}" PATH)]]
    contents "${contents}")
  string(REGEX REPLACE
[[get_filename_component\(PACKAGE_PREFIX_DIR "\${CMAKE_CURRENT_LIST_DIR}/\.\./(\.\./)*" ABSOLUTE\)]]
[[get_filename_component(PACKAGE_PREFIX_DIR "${CMAKE_CURRENT_LIST_DIR}/../../" ABSOLUTE)]]
    contents "${contents}")
  file(TO_CMAKE_PATH "${PACKAGES}" packages_dir)
  string(REPLACE "${packages_dir}" [[${_IMPORT_PREFIX}]] contents "${contents}")
  file(WRITE "${main_cmake}" "${contents}")
endforeach()
CMAKE
run cmake "-DPACKAGES=$packages" -DPORT=trainkit "-DCONFIG_PATH=$config_path" -P "$fixup"

step "4. vcpkg_fixup_pkgconfig"
shopt -s nullglob
pcs=("$packages"/lib/pkgconfig/*.pc "$packages"/share/pkgconfig/*.pc)
shopt -u nullglob
((${#pcs[@]} > 0)) || fail "no .pc file installed under lib/pkgconfig or share/pkgconfig"
for pc in "${pcs[@]}"; do
  grep -qE '^prefix=\$\{pcfiledir\}/\.\./\.\.$' "$pc" ||
    fail "$pc: prefix is not \${pcfiledir}/../.. (vcpkg_fixup_pkgconfig would rewrite it): $(grep '^prefix=' "$pc")"
  sed -i "s|$packages|\${prefix}|g" "$pc"
done

step "4b. vcpkg_copy_tools(TOOL_NAMES trainkit-run AUTO_CLEAN)"
[[ -x "$packages/bin/trainkit-run" ]] || fail "the install has no bin/trainkit-run"
run mkdir -p "$packages/tools/trainkit"
run mv "$packages/bin/trainkit-run" "$packages/tools/trainkit/"
rmdir "$packages/bin" 2>/dev/null || fail "bin/ holds more than trainkit-run: $(ls "$packages/bin")"

step "5. usage and copyright"
run install -m 644 "$port/usage" "$packages/share/trainkit/usage"
run install -m 644 "$root/LICENSE" "$packages/share/trainkit/copyright"

# ---------------------------------------------------------------------------------------------------
step "6. the package tree"
(cd "$packages" && find . -type f | sort | grep -v '^./include/trainkit/' || true)
echo "   + $(find "$packages/include/trainkit" -type f | wc -l) headers under include/trainkit/"
for f in include/trainkit/trainkit.hpp include/trainkit/config.hpp \
  share/trainkit/trainkitConfig.cmake share/trainkit/trainkitConfigVersion.cmake \
  share/trainkit/trainkitTargets.cmake share/trainkit/trainkitCBLAS.cmake \
  share/trainkit/usage share/trainkit/copyright lib/pkgconfig/trainkit.pc tools/trainkit/trainkit-run; do
  [[ -f "$packages/$f" ]] || fail "the package lacks $f"
done
for d in lib/cmake debug bin; do
  [[ ! -e "$packages/$d" ]] || fail "the package still has $d/"
done
if grep -rlF "$packages" "$packages" >/dev/null 2>&1; then
  grep -rnF "$packages" "$packages" | head -5 >&2
  fail "files refer to the packages directory (not relocatable)"
fi
if [[ "$requested" == *" mpi "* ]]; then
  grep -q 'trainkit::mpi' "$packages/share/trainkit/trainkitTargets.cmake" ||
    fail "feature mpi: trainkitTargets.cmake does not define trainkit::mpi"
fi

# ---------------------------------------------------------------------------------------------------
step "7. install to $installed and consume it"
mkdir -p "$installed"
run cp -a "$packages/." "$installed/"

consumer_out() {
  local exe="$1" out
  out="$("$exe")" || fail "$exe exited with $?: $out"
  echo "$out"
  [[ "$(head -n1 <<<"$out")" == "trainkit $version" ]] || fail "$exe: first line is not 'trainkit $version'"
}

echo "-- find_package(trainkit CONFIG REQUIRED) with CMAKE_PREFIX_PATH=$installed"
run cmake -S "$root/tests/consumer" -B "$work/consumer/find_package" "${generator[@]}" \
  "-DCMAKE_PREFIX_PATH=$installed" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  "-DTRAINKIT_CONSUMER_EXPECT_PREFIX=$installed" \
  "-DTRAINKIT_CONSUMER_EXPECT_VERSION=$version"
run cmake --build "$work/consumer/find_package"
consumer_out "$work/consumer/find_package/trainkit_consumer"

if command -v pkg-config >/dev/null 2>&1; then
  echo "-- pkg-config with PKG_CONFIG_PATH=$installed/lib/pkgconfig"
  export PKG_CONFIG_PATH="$installed/lib/pkgconfig"
  pc_version="$(pkg-config --modversion trainkit)" || fail "pkg-config --modversion trainkit"
  [[ "$pc_version" == "$version" ]] || fail "pkg-config says trainkit $pc_version, expected $version"
  flags="$(pkg-config --cflags --libs trainkit)" || fail "pkg-config --cflags --libs trainkit"
  echo "   pkg-config --cflags --libs trainkit: $flags"
  inc_ok=0
  for flag in $flags; do
    if [[ "$flag" == -I* ]] && [[ "$(realpath -m "${flag#-I}")" == "$(realpath -m "$installed/include")" ]]; then
      inc_ok=1
    fi
  done
  ((inc_ok)) || fail "none of pkg-config's -I flags is $installed/include"
  mkdir -p "$work/consumer/pkg_config"
  # shellcheck disable=SC2086 # the flags are words
  run "${CXX:-c++}" -std=c++20 "$root/tests/consumer/main.cpp" -o "$work/consumer/pkg_config/trainkit_consumer" $flags
  consumer_out "$work/consumer/pkg_config/trainkit_consumer"
else
  echo "-- pkg-config not installed: the pkg-config consumer was not tried"
fi

echo "vcpkg-port-check: OK (features: ${TRAINKIT_VCPKG_FEATURES:-none})"
