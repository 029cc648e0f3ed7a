# Sanitizer and fuzzing builds (CI: scripts/sanitize.sh).  Included by the
# root CMakeLists.txt before any target is created, so the flags reach every
# library, test and tool of the tree.
#
#   MODAR_SANITIZE=ON  AddressSanitizer + UndefinedBehaviorSanitizer on all C++
#                      (GCC or Clang; any UB aborts: -fno-sanitize-recover=all).
#   MODAR_FUZZ=ON      Clang only: libFuzzer targets tests/fuzz (modar_fuzz_*),
#                      and coverage instrumentation (-fsanitize=fuzzer-no-link)
#                      of the libraries they exercise.  Implies MODAR_SANITIZE.
# Both are for the CPU build: the CUDA backend is not instrumented.
option(MODAR_SANITIZE "Build with AddressSanitizer + UndefinedBehaviorSanitizer" OFF)
option(MODAR_FUZZ "Build the libFuzzer targets of tests/fuzz (Clang)" OFF)

if(MODAR_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "MODAR_FUZZ needs Clang (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++ (Debian: clang libclang-rt-dev)")
  endif()
  set(MODAR_SANITIZE ON CACHE BOOL "" FORCE)
endif()

if(MODAR_SANITIZE)
  if(MODAR_CUDA)
    message(FATAL_ERROR "MODAR_SANITIZE / MODAR_FUZZ instrument the CPU build: add -DMODAR_CUDA=OFF")
  endif()
  set(_modar_san -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    list(APPEND _modar_san -gline-tables-only)  # file:line in reports, small objects
  else()
    list(APPEND _modar_san -g1)
  endif()
  if(MODAR_FUZZ)
    list(APPEND _modar_san -fsanitize=fuzzer-no-link)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_modar_san}>")
  add_link_options(-fsanitize=address,undefined)
endif()
