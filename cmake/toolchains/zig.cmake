# Builds with zig's clang (the PyPI package `ziglang`) for a chosen architecture and glibc version: the library then
# needs no glibc symbol newer than the target's, whatever glibc the build machine has, and zig's libc++, libc++abi
# and libunwind are linked in statically. This is how the wheels are built (scripts/build-wheel):
#
#   cmake -S . -B build/zig -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/zig.cmake \
#         -DORT_RMSNORM_ZIG_TARGET=x86_64-linux-gnu.2.28 [-DORT_RMSNORM_ZIG=/path/to/zig]
#
# ORT_RMSNORM_ZIG_TARGET: <arch>-linux-gnu.<glibc>, arch x86_64 or aarch64 (default x86_64-linux-gnu.2.28).
# ORT_RMSNORM_ZIG: the zig executable (default: `zig` on PATH, else the one python3's ziglang package ships).
# Test executables of a foreign architecture run through qemu-user when it is installed (CMAKE_CROSSCOMPILING_EMULATOR
# with ORT_RMSNORM_QEMU_ROOT, default /usr/<arch>-linux-gnu, as the library root).
set(ORT_RMSNORM_ZIG_TARGET "x86_64-linux-gnu.2.28" CACHE STRING "zig target: <arch>-linux-gnu.<glibc version>")
set(ORT_RMSNORM_ZIG "" CACHE FILEPATH "The zig executable")
# try_compile projects (check_cxx_compiler_flag) read this file again: hand them the same choices.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES ORT_RMSNORM_ZIG_TARGET ORT_RMSNORM_ZIG ORT_RMSNORM_QEMU_ROOT)

if(NOT ORT_RMSNORM_ZIG_TARGET MATCHES "^(x86_64|aarch64)-linux-gnu\\.2\\.[0-9]+$")
  message(FATAL_ERROR "ORT_RMSNORM_ZIG_TARGET=${ORT_RMSNORM_ZIG_TARGET}: expected x86_64-linux-gnu.2.N or "
    "aarch64-linux-gnu.2.N (the architecture and the oldest glibc the binaries must run on)")
endif()
string(REGEX MATCH "^[a-z0-9_]+" _zig_arch "${ORT_RMSNORM_ZIG_TARGET}")

if(NOT ORT_RMSNORM_ZIG)
  find_program(_zig_on_path zig)
  if(_zig_on_path)
    set(ORT_RMSNORM_ZIG ${_zig_on_path})
  else()
    execute_process(COMMAND python3 -c "import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), 'zig'))"
      OUTPUT_VARIABLE _zig_from_python OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_zig_from_python AND EXISTS "${_zig_from_python}")
      set(ORT_RMSNORM_ZIG ${_zig_from_python})
    endif()
  endif()
  if(NOT ORT_RMSNORM_ZIG)
    message(FATAL_ERROR "zig not found: pip install ziglang, or pass -DORT_RMSNORM_ZIG=<zig executable>")
  endif()
  set(ORT_RMSNORM_ZIG ${ORT_RMSNORM_ZIG} CACHE FILEPATH "The zig executable" FORCE)
endif()

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR ${_zig_arch})
set(CMAKE_C_COMPILER ${ORT_RMSNORM_ZIG} cc -target ${ORT_RMSNORM_ZIG_TARGET})
set(CMAKE_CXX_COMPILER ${ORT_RMSNORM_ZIG} c++ -target ${ORT_RMSNORM_ZIG_TARGET})
# zig ships llvm-ar and llvm-ranlib as subcommands; CMake's archive rules take a command line.
set(CMAKE_C_ARCHIVE_CREATE "${ORT_RMSNORM_ZIG} ar qc <TARGET> <LINK_FLAGS> <OBJECTS>")
set(CMAKE_CXX_ARCHIVE_CREATE "${ORT_RMSNORM_ZIG} ar qc <TARGET> <LINK_FLAGS> <OBJECTS>")
set(CMAKE_C_ARCHIVE_APPEND "${ORT_RMSNORM_ZIG} ar q <TARGET> <LINK_FLAGS> <OBJECTS>")
set(CMAKE_CXX_ARCHIVE_APPEND "${ORT_RMSNORM_ZIG} ar q <TARGET> <LINK_FLAGS> <OBJECTS>")
set(CMAKE_C_ARCHIVE_FINISH "${ORT_RMSNORM_ZIG} ranlib <TARGET>")
set(CMAKE_CXX_ARCHIVE_FINISH "${ORT_RMSNORM_ZIG} ranlib <TARGET>")

# zig's C++ runtime comes with its debug information; release builds leave it out (the symbol table stays).
set(CMAKE_SHARED_LINKER_FLAGS_RELEASE_INIT "-Wl,--strip-debug")
set(CMAKE_EXE_LINKER_FLAGS_RELEASE_INIT "-Wl,--strip-debug")
# zig always links its C++ runtime statically; GCC's flags for that would only draw "unused argument" warnings.
set(ORT_RMSNORM_STATIC_RUNTIME_FLAGS "" CACHE STRING "Link flags that link the C++ runtime into the library" FORCE)

execute_process(COMMAND uname -m OUTPUT_VARIABLE _host_arch OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _host_arch STREQUAL _zig_arch)
  set(ORT_RMSNORM_QEMU_ROOT "/usr/${_zig_arch}-linux-gnu" CACHE PATH "Library root for qemu-user (-L)")
  find_program(_zig_qemu NAMES qemu-${_zig_arch} qemu-${_zig_arch}-static)
  if(_zig_qemu)
    set(CMAKE_CROSSCOMPILING_EMULATOR ${_zig_qemu} -L ${ORT_RMSNORM_QEMU_ROOT})
  endif()
endif()
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
