# Finds every third-party package. Order matters: LibTorch's config defines a placeholder
# protobuf::libprotobuf target when none exists, so Protobuf and gRPC come first
# (docs/CONVENTIONS.md §1).
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)

if(OOMB_BUILD_SERVICE)
  find_package(Protobuf REQUIRED)
  find_package(gRPC CONFIG REQUIRED)
  find_package(OpenSSL REQUIRED)  # SHA-256 of bearer tokens (server/auth.cc)
  find_program(OOMB_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
  find_package(prometheus-cpp CONFIG REQUIRED)
  find_package(SQLiteCpp REQUIRED)
  find_package(CLI11 CONFIG REQUIRED)
  pkg_check_modules(SYSTEMD IMPORTED_TARGET libsystemd)
  pkg_check_modules(PQXX REQUIRED IMPORTED_TARGET libpqxx)  # store.backend: postgres (fleet mode)
endif()

# LibTorch from the PyPI wheel torch==2.11.0 in the setup script's virtual environment, whose
# python (with transformers, peft, ...) also runs the Python reference tests.
set(OOMB_VENV "$ENV{OOMB_VENV}")
if(NOT OOMB_VENV)
  set(OOMB_VENV "$ENV{HOME}/.cache/oomb/venv")
endif()
if(EXISTS "${OOMB_VENV}/bin/python")
  set(OOMB_PYTHON "${OOMB_VENV}/bin/python")
endif()
if(NOT Torch_DIR)
  foreach(py "${OOMB_VENV}/bin/python" python3)
    execute_process(COMMAND ${py} -c "import torch, os; print(os.path.join(torch.utils.cmake_prefix_path, 'Torch'))"
                    OUTPUT_VARIABLE _torch_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                    RESULT_VARIABLE _rc)
    if(_rc EQUAL 0 AND EXISTS "${_torch_dir}")
      set(Torch_DIR "${_torch_dir}" CACHE PATH "LibTorch CMake package")
      break()
    endif()
  endforeach()
endif()
# The wheel's CUDA libraries come from its nvidia-* dependency wheels; the toolkit's copies
# are used for compiling only.
if(OOMB_HAVE_CUDA)
  set(CUDAToolkit_ROOT /usr/local/cuda CACHE PATH "")
  # LibTorch's CMake derives its own nvcc flags from this list (it ignores
  # CMAKE_CUDA_ARCHITECTURES); keep both to Hopper.
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "")
endif()
find_package(Torch REQUIRED)
get_filename_component(OOMB_TORCH_LIB_DIR "${TORCH_LIBRARY}" DIRECTORY)
message(STATUS "LibTorch ${Torch_VERSION} at ${OOMB_TORCH_LIB_DIR}")

find_package(absl CONFIG REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
find_package(ZLIB REQUIRED)

if(OOMB_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
