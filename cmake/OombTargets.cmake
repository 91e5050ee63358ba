# Helpers that give every project target the same compile options.

# oomb_target_options(<target>): warnings as errors and the include root. Third-party headers
# (LibTorch, gRPC, ...) come from imported targets and are treated as system headers.
function(oomb_target_options target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${OOMB_WERROR}>>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall --expt-relaxed-constexpr -lineinfo>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${OOMB_WERROR}>>:-Werror=all-warnings>)
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
endfunction()

# oomb_add_test(<name> SOURCES ... LIBS ... LABEL unit|integration|gpu [TIMEOUT s]): a GoogleTest
# binary registered with ctest through gtest_discover_tests, each of its tests carrying the
# label, but for its Gpu tests (below). (One label a test: gtest_discover_tests flattens
# list-valued properties.)
# Test processes read OOMB_SOURCE_DIR / OOMB_BINARY_DIR from compile definitions; the test
# command (scripts/test.sh) sets OMP_NUM_THREADS=1 because ctest runs tests in parallel.
function(oomb_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT;LABEL" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  oomb_target_options(${name})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE OOMB_TEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                             OOMB_TEST_BINARY_DIR="${PROJECT_BINARY_DIR}")
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  if(NOT T_LABEL MATCHES "^(unit|integration|gpu)$")
    message(FATAL_ERROR "oomb_add_test(${name}): LABEL must be unit, integration or gpu")
  endif()
  # A test whose suite or name says Gpu (SwapGpuTest.*) is labelled gpu whatever its binary's
  # label: it skips without a CUDA device, and the test command (scripts/ctest_report.py) lets
  # only gpu-labelled tests skip.
  if(T_LABEL STREQUAL "gpu")
    gtest_discover_tests(${name} PROPERTIES LABELS gpu TIMEOUT ${T_TIMEOUT} DISCOVERY_TIMEOUT 120)
  else()
    gtest_discover_tests(${name} TEST_FILTER "-*Gpu*" PROPERTIES LABELS ${T_LABEL} TIMEOUT ${T_TIMEOUT}
                         DISCOVERY_TIMEOUT 120)
    gtest_discover_tests(${name} TEST_FILTER "*Gpu*" PROPERTIES LABELS gpu TIMEOUT ${T_TIMEOUT} DISCOVERY_TIMEOUT 120)
  endif()
endfunction()

# LibTorch's libtorch.so exports its own copy of std::filesystem (from another GCC), and a
# binary whose first DT_NEEDED library is libtorch binds std::filesystem calls to that copy,
# which crashes (seen: std::filesystem::remove_all jumping to address 0). Naming libstdc++
# before every other library makes the dynamic linker resolve them in the system libstdc++.
add_link_options("LINKER:--push-state,--no-as-needed,-lstdc++,--pop-state")

# LibTorch's headers dominate the build (about a minute per precompiled copy on 2 cores), so two
# targets precompile cmake/torch_pch.h and every other target reuses one of their copies:
# oomb_kernels' for the position-independent libraries (oomb_use_torch) and oomb_torch_pch_host's
# (kernels/CMakeLists.txt) for executables (oomb_use_torch_pch). -Winvalid-pch with -Werror makes
# a copy that does not match a target's flags a build error, never a silent slow path.

# oomb_use_torch(<target> [PUBLIC|PRIVATE]): links LibTorch (default PUBLIC) into a library,
# compiled position-independent, with the shared precompiled LibTorch header. Use PRIVATE for
# anything gRPC code links (see worker/CMakeLists.txt).
function(oomb_use_torch target)
  set(scope PUBLIC)
  if(ARGC GREATER 1)
    set(scope ${ARGV1})
  endif()
  target_link_libraries(${target} ${scope} ${TORCH_LIBRARIES})
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  if(target STREQUAL "oomb_kernels")
    target_precompile_headers(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${PROJECT_SOURCE_DIR}/cmake/torch_pch.h>)
  else()
    target_precompile_headers(${target} REUSE_FROM oomb_kernels)
  endif()
  if(OOMB_HAVE_CUDA)
    target_compile_definitions(${target} PUBLIC OOMB_HAVE_CUDA=1)
  endif()
endfunction()

# oomb_use_torch_pch(<target>): an executable that includes LibTorch reuses the shared precompiled
# header (link LibTorch or a library that does as usual).
function(oomb_use_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM oomb_torch_pch_host)
endfunction()
