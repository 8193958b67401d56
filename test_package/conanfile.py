# test_package/conanfile.py - run by `conan create .`: builds and runs a small trainkit program
# against the package just created, through CMakeDeps' find_package(trainkit CONFIG REQUIRED).
import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout


class TrainkitTestConan(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    test_type = "explicit"

    def requirements(self):
        # run=True: the package's bin/ (trainkit-run) on the PATH of the `conanrun` environment.
        self.requires(self.tested_reference_str, run=True)

    def layout(self):
        cmake_layout(self)

    def generate(self):
        CMakeDeps(self).generate()
        tc = CMakeToolchain(self)
        trainkit = self.dependencies["trainkit"]
        tc.cache_variables["TRAINKIT_TEST_MPI"] = bool(trainkit.options.with_mpi)
        tc.cache_variables["TRAINKIT_TEST_CUDA"] = bool(trainkit.options.with_cuda)
        tc.generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def test(self):
        if not can_run(self):
            return
        self.run(os.path.join(self.cpp.build.bindir, "test_package"), env="conanrun")
        # The launcher the package ships, from the consumer's run environment.
        self.run("trainkit-run --help", env="conanrun")
        trainkit = self.dependencies["trainkit"]
        if trainkit.options.with_mpi:
            # A singleton MPI process (no mpirun): MPI_Init, one allreduce over one rank.
            self.run(os.path.join(self.cpp.build.bindir, "test_package_mpi"), env="conanrun")
            # The same program as a 2-rank job, started by the packaged trainkit-run on mpirun.
            root = " --allow-run-as-root" if hasattr(os, "geteuid") and os.geteuid() == 0 else ""
            self.run(f"trainkit-run -np 2 --oversubscribe{root} -- "
                     + os.path.join(self.cpp.build.bindir, "test_package_mpi"), env="conanrun")
        if trainkit.options.with_cuda:
            # Links the CUDA libraries and reports their versions; needs no GPU.
            self.run(os.path.join(self.cpp.build.bindir, "test_package_cuda"), env="conanrun")
            self.run(os.path.join(self.cpp.build.bindir, "test_package_cu"), env="conanrun")
