# Cross compiling for 64-bit Arm Linux with Debian's cross compiler (apt-get install g++-aarch64-linux-gnu).
# Test executables run through qemu-user (apt-get install qemu-user) with the cross sysroot as library root, so
# `ctest` and CMake's try_run work on an x86-64 build machine.
#
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(_triple aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${_triple}-gcc)
set(CMAKE_CXX_COMPILER ${_triple}-g++)

# Debian installs the target's libc and libstdc++ under /usr/aarch64-linux-gnu.
set(_sysroot /usr/${_triple})
set(CMAKE_FIND_ROOT_PATH ${_sysroot})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# Headers: onnxruntime's are target-independent and live in the source tree or wherever -DORT_INCLUDE_DIR points.
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)

find_program(_qemu NAMES qemu-${CMAKE_SYSTEM_PROCESSOR} qemu-${CMAKE_SYSTEM_PROCESSOR}-static)
if(_qemu)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${_qemu} -L ${_sysroot})
endif()
