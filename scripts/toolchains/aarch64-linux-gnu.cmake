# CMake toolchain for an aarch64 (arm64) cross build on Debian 12 x86-64, used by scripts/cross-test aarch64.
# Compiler: g++-aarch64-linux-gnu. Libraries: Debian multiarch :arm64 packages, which install under
# /usr/lib/aarch64-linux-gnu and /usr/include/aarch64-linux-gnu beside the amd64 ones; header-only
# dependencies (Eigen, nlohmann-json, CLI11, Catch2, Highway's headers) are shared between architectures.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(PKG_CONFIG_EXECUTABLE aarch64-linux-gnu-pkg-config)

# Search only the aarch64 multiarch folders for libraries and package configs (<prefix>/lib/aarch64-linux-gnu),
# never the x86-64 ones; tools (cmake, python, git) are the build machine's.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# Run target programs (ctest, try_run) under user-mode qemu. binfmt_misc is not assumed. The prefix is "/":
# the :arm64 libc6 package puts ld-linux-aarch64.so.1 and libc in /lib/aarch64-linux-gnu, where the other
# :arm64 libraries are. (-L /usr/aarch64-linux-gnu, the cross toolchain's own glibc, hung in qemu here.)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /)
