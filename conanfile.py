# conanfile.py - Conan 2 recipe for trainkit (header-only).
#
#   conan profile detect            # once
#   conan create .                  # packages the headers and runs test_package/ (offline: no requirements)
#   conan create . -o "trainkit/*:with_mpi=True"
#
# Consumers: requires("trainkit/0.1.0"), generators CMakeDeps + CMakeToolchain, then
#   find_package(trainkit CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE trainkit::trainkit)     # + trainkit::mpi, trainkit::cuda
#
# trainkit's dependencies are *system* packages (no Conan requirements): OpenBLAS with its CBLAS
# header, zlib, the compiler's OpenMP runtime, and with the options MPI (with_mpi) and the CUDA
# toolkit with cuDNN and NCCL (with_cuda). system_requirements() checks the Debian/Ubuntu packages
# (or installs them with tools.system.package_manager:mode=install); package_info() locates them
# (pkg-config where there is a .pc file) and hands their include directories, libraries and flags
# to the consumers.
#
# Targets (CMakeDeps), mirroring trainkit's own CMake package:
#   trainkit::trainkit   headers + CBLAS (OpenBLAS) + zlib + OpenMP (-fopenmp) + threads; C++20
#   trainkit::mpi        with_mpi:  trainkit::trainkit + MPI (C API; the MPI-2 C++ bindings skipped)
#   trainkit::cuda       with_cuda: trainkit::trainkit + cudart, cuBLAS(Lt), cuDNN, NCCL + nvcc flags
#   trainkit::all        every component above that is enabled
import glob
import os
import re
import shutil

from conan import ConanFile
from conan.errors import ConanException, ConanInvalidConfiguration
from conan.tools.files import copy, load, save
from conan.tools.gnu import PkgConfig
from conan.tools.layout import basic_layout
from conan.tools.system.package_manager import Apt

required_conan_version = ">=2.0"

# Installed into the package and included by the CMake config that CMakeDeps generates (a "build
# module"): what CMakeDeps cannot express through cpp_info.
_CMAKE_MODULE = """\
# conan-trainkit-properties.cmake - written by trainkit's conanfile.py, included by the CMake
# config that CMakeDeps generates for trainkit.
# trainkit needs C++20, as trainkit's own CMake package says with
# target_compile_features(trainkit INTERFACE cxx_std_20): a consumer whose toolchain sets an older
# CMAKE_CXX_STANDARD (Conan's compiler.cppstd) still compiles the headers as C++20.
if(TARGET trainkit::trainkit)
  set_property(TARGET trainkit::trainkit APPEND PROPERTY INTERFACE_COMPILE_FEATURES cxx_std_20)
endif()
# The nvcc flags of trainkit's own trainkit::cuda target (see the top CMakeLists.txt). C++20 in
# device code: cuda_std_20 where CMake knows nvcc's flag for it (CMake >= 3.26 with nvcc 12+, and
# CUDA enabled before find_package), else -std=c++20 by hand unless the project set
# CMAKE_CUDA_STANDARD itself.
if(TARGET trainkit::cuda)
  if(DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set_property(TARGET trainkit::cuda APPEND PROPERTY INTERFACE_COMPILE_FEATURES cuda_std_20)
  elseif(NOT DEFINED CMAKE_CUDA_STANDARD)
    set_property(TARGET trainkit::cuda APPEND PROPERTY INTERFACE_COMPILE_OPTIONS "$<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>")
  endif()
  set_property(TARGET trainkit::cuda APPEND PROPERTY INTERFACE_COMPILE_OPTIONS
    "$<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr;--extended-lambda;-diag-suppress=3189;-Xcompiler=-fopenmp>")
endif()
"""

# Directories the linker and the loader search anyway: no -L / rpath for them.
_DEFAULT_LIB_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib")


class TrainkitConan(ConanFile):
    name = "trainkit"
    description = "Header-only C++20 library for data-parallel deep-learning training"
    license = "Apache-2.0"
    topics = ("deep-learning", "training", "autograd", "header-only", "mpi", "cuda")
    package_type = "header-library"  # Conan 2's name for header-only
    settings = "os", "arch", "compiler", "build_type"
    options = {
        "with_cuda": [True, False],
        "with_mpi": [True, False],
    }
    default_options = {
        "with_cuda": False,
        "with_mpi": False,
    }
    exports_sources = "include/*", "tools/trainkit-run", "LICENSE"
    no_copy_source = True

    _cmake_module = os.path.join("lib", "cmake", "conan-trainkit-properties.cmake")

    def set_version(self):
        # The version is the CMake project's (project(trainkit VERSION x.y.z)).
        if self.version:
            return
        text = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
        match = re.search(r"project\(\s*trainkit\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)", text)
        if not match:
            raise ConanException("trainkit: no project(trainkit VERSION x.y.z) in CMakeLists.txt")
        self.version = match.group(1)

    def layout(self):
        basic_layout(self, src_folder=".")

    def package_id(self):
        # The same headers whatever the settings and options; the options only change package_info().
        self.info.clear()

    def validate(self):
        if self.settings.get_safe("os") not in (None, "Linux"):
            raise ConanInvalidConfiguration(
                f"{self.ref}: only Linux is supported (GCC or Clang with OpenMP, OpenBLAS, zlib from the system)")
        if self.settings.get_safe("compiler") not in (None, "gcc", "clang"):
            raise ConanInvalidConfiguration(f"{self.ref}: needs GCC or Clang (-fopenmp)")
        cppstd = self.settings.get_safe("compiler.cppstd")
        if cppstd and int(re.sub(r"^gnu", "", cppstd)) < 20:
            # Not an error: CMake consumers get cxx_std_20 from trainkit::trainkit (see _CMAKE_MODULE).
            self.output.warning(
                f"compiler.cppstd={cppstd}: trainkit needs C++20. CMake targets that link trainkit::trainkit "
                "are compiled as C++20 anyway; other build systems need -s compiler.cppstd=20.")

    def system_requirements(self):
        # Debian/Ubuntu package names. With the default tools.system.package_manager:mode=check,
        # Conan only checks (dpkg-query) that they are installed and, if one is not, fails with
        # "System requirements: '...' are missing"; mode=install installs them.
        apt = Apt(self)
        apt.install(["libopenblas-dev", "zlib1g-dev"], update=False, check=True)
        if self.options.with_mpi:
            apt.install(["libopenmpi-dev"], update=False, check=True)
        # OpenMP: libgomp comes with g++ (libgcc-*-dev); Clang needs libomp-dev. CUDA, cuDNN and
        # NCCL come from NVIDIA's installers or repositories: not checked here.

    def package(self):
        copy(self, "LICENSE", src=self.source_folder, dst=os.path.join(self.package_folder, "licenses"))
        copy(self, "*.hpp", src=os.path.join(self.source_folder, "include"),
             dst=os.path.join(self.package_folder, "include"))
        copy(self, "*.cuh", src=os.path.join(self.source_folder, "include"),
             dst=os.path.join(self.package_folder, "include"))
        save(self, os.path.join(self.package_folder, self._cmake_module), _CMAKE_MODULE)
        # The launcher (docs/ddp.md, "Launching"): a Python 3 script, installed executable.
        copy(self, "trainkit-run", src=os.path.join(self.source_folder, "tools"),
             dst=os.path.join(self.package_folder, "bin"))
        os.chmod(os.path.join(self.package_folder, "bin", "trainkit-run"), 0o755)

    # ---------------------------------------------------------------------------------------------
    # Locating the system dependencies (package_info() runs on the consumer's machine).

    def _pkg_config(self, names):
        """The first of `names` that pkg-config knows, as a PkgConfig object; None if none."""
        executable = self.conf.get("tools.gnu:pkg_config", default="pkg-config")
        if not shutil.which(executable):
            return None
        for name in names:
            pc = PkgConfig(self, name)
            try:
                pc.provides  # runs pkg-config --print-provides: raises if the .pc file is missing
            except ConanException:
                continue
            return pc
        return None

    def _rpath_flags(self, libdirs):
        # Debian keeps OpenBLAS's variants in /usr/lib/<arch>/openblas-{openmp,pthread}/; the loader
        # would otherwise pick whatever update-alternatives chose for libopenblas.so.0, not the one
        # linked (and whose cblas.h was compiled against). trainkit's own CMake build gets the same
        # through CMake's RUNPATH.
        return [f"-Wl,-rpath,{d}" for d in libdirs if os.path.normpath(d) not in self._default_lib_dirs()]

    @staticmethod
    def _default_lib_dirs():
        dirs = set(_DEFAULT_LIB_DIRS)
        for pattern in ("/usr/lib/*-linux-gnu*", "/lib/*-linux-gnu*"):
            dirs.update(os.path.normpath(d) for d in glob.glob(pattern) if os.path.isdir(d))
        return dirs

    def _openblas(self):
        """(include dirs, lib dirs) of OpenBLAS: its openblas.pc when that names a directory with
        cblas.h (Debian: the variant libopenblas-dev installed), else the usual places."""
        pc = self._pkg_config(["openblas"])
        if pc is not None:
            includedirs = [os.path.normpath(d) for d in pc.includedirs
                           if os.path.isfile(os.path.join(d, "cblas.h"))]
            if includedirs:
                return includedirs, [os.path.normpath(d) for d in pc.libdirs]
        for variant in ("openblas-openmp", "openblas-pthread", "openblas-serial"):
            for header in sorted(glob.glob(f"/usr/include/*/{variant}/cblas.h")):
                arch = os.path.basename(os.path.dirname(os.path.dirname(header)))
                libdir = f"/usr/lib/{arch}/{variant}"
                if os.path.isdir(libdir):
                    return [os.path.dirname(header)], [libdir]
        for incdir in ("/usr/include/openblas", "/usr/local/include/openblas", "/usr/local/include", "/usr/include"):
            if os.path.isfile(os.path.join(incdir, "cblas.h")):
                return [incdir], []
        raise ConanException(
            "trainkit: cblas.h of OpenBLAS not found (Debian/Ubuntu: apt-get install libopenblas-dev)")

    def _cuda_root(self):
        for var in ("CUDA_PATH", "CUDA_HOME", "CUDAToolkit_ROOT"):
            root = os.environ.get(var)
            if root and os.path.isdir(root):
                return root
        return "/usr/local/cuda"

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "trainkit")
        self.cpp_info.set_property("cmake_target_name", "trainkit::all")
        self.cpp_info.set_property("pkg_config_name", "trainkit-all")
        self.cpp_info.set_property("cmake_build_modules", [self._cmake_module])
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.includedirs = []

        # trainkit::trainkit - the CPU library.
        core = self.cpp_info.components["trainkit"]
        core.set_property("cmake_target_name", "trainkit::trainkit")
        core.set_property("pkg_config_name", "trainkit")
        blas_includedirs, blas_libdirs = self._openblas()
        core.includedirs = ["include"] + blas_includedirs
        core.libdirs = [d for d in blas_libdirs if os.path.normpath(d) not in self._default_lib_dirs()]
        # bin/trainkit-run, the launcher. A header-only package is not a run requirement by
        # default: consumers that start jobs from Conan's environment write
        # requires("trainkit/x.y.z", run=True) and find it on the PATH of `conanrun`.
        core.bindirs = ["bin"]
        self.runenv_info.prepend_path("PATH", os.path.join(self.package_folder, "bin"))
        core.system_libs = ["openblas", "z"]
        # OpenMP and threads are compiler flags with GCC and Clang, at compile and at link time.
        core.cxxflags = ["-fopenmp", "-pthread"]
        link = ["-fopenmp", "-pthread"] + self._rpath_flags(core.libdirs)
        core.sharedlinkflags = list(link)
        core.exelinkflags = list(link)

        # trainkit::mpi - <trainkit/dist/mpi.hpp>.
        if self.options.with_mpi:
            mpi = self.cpp_info.components["mpi"]
            mpi.set_property("cmake_target_name", "trainkit::mpi")
            mpi.set_property("pkg_config_name", "trainkit-mpi")
            mpi.requires = ["trainkit"]
            mpi.bindirs = []
            pc = self._pkg_config(["mpi-c", "ompi-c", "mpich"])
            if pc is None:
                raise ConanException(
                    "trainkit: with_mpi=True but no mpi-c/ompi-c/mpich .pc file found "
                    "(Debian/Ubuntu: apt-get install libopenmpi-dev)")
            mpi.includedirs = pc.includedirs
            mpi.libdirs = pc.libdirs
            mpi.system_libs = pc.libs
            mpi.cxxflags = pc.cflags
            mpi.sharedlinkflags = pc.linkflags
            mpi.exelinkflags = pc.linkflags
            # trainkit uses MPI's C API; the deprecated C++ bindings would only add warnings.
            mpi.defines = pc.defines + ["OMPI_SKIP_MPICXX=1", "MPICH_SKIP_MPICXX=1"]

        # trainkit::cuda - .cu files that include <trainkit/cuda.cuh>.
        if self.options.with_cuda:
            root = self._cuda_root()
            cuda = self.cpp_info.components["cuda"]
            cuda.set_property("cmake_target_name", "trainkit::cuda")
            cuda.set_property("pkg_config_name", "trainkit-cuda")
            cuda.requires = ["trainkit"]
            cuda.bindirs = []
            cuda.includedirs = [os.path.join(root, "include")]
            cuda.libdirs = [d for d in (os.path.join(root, "lib64"), os.path.join(root, "lib"))
                            if os.path.isdir(d)]
            # cuDNN and NCCL outside the toolkit (e.g. the nvidia-cudnn/nvidia-nccl wheels).
            for var in ("CUDNN_ROOT", "NCCL_ROOT"):
                extra = os.environ.get(var)
                if extra:
                    cuda.includedirs.append(os.path.join(extra, "include"))
                    cuda.libdirs.append(os.path.join(extra, "lib"))
            cuda.system_libs = ["cudart", "cublas", "cublasLt", "cudnn", "nccl"]
            # The package's trainkit::cuda includes NCCL (CMake's own build splits it into trainkit::nccl).
            cuda.defines = ["TRAINKIT_HAS_NCCL=1"]
            cuda.sharedlinkflags = self._rpath_flags(cuda.libdirs)
            cuda.exelinkflags = self._rpath_flags(cuda.libdirs)
