# Note [One LibTorch]
# pipefb builds against exactly one PyTorch: torch==2.11.0 from PyPI, a CUDA 13.0 build,
# the same as on the GPU hosts. Its wheel carries LibTorch (headers, libtorch_cpu,
# libtorch_cuda, libc10_cuda, its CMake config); CMake finds it through
# torch.utils.cmake_prefix_path of PIPEFB_PYTHON, the python3 that imports it.
#  * PIPEFB_PYTHON (cache variable or environment variable): scripts/setup makes a venv
#    (PIPEFB_VENV, default ~/.cache/pipefb/venv-torch-2.11.0) and passes its python; a
#    user who already has torch 2.11 points the build at that python instead.
#  * The version is checked here, so a wrong torch fails at configure time with one line.
#  * The wheel is a CUDA build, so find_package(Torch) needs the CUDA toolkit
#    (/usr/local/cuda, or CUDAToolkit_ROOT). The CUDA backend compiles and links in every
#    build; it needs no GPU and no driver until it runs.
#  * Every program starts on a machine without a GPU driver: nothing links the driver
#    stub (libcuda.so), so no binary needs libcuda.so.1 (no_gpu_test). libtorch_cuda
#    stays a DT_NEEDED of every Torch target (--no-as-needed): it registers CUDA with ATen
#    when it is loaded, and nothing of ours references a symbol of it directly.
#  * fmt: the wheel carries fmt 12 headers (LibTorch uses it header-only) in the same folder
#    as its own headers; spdlog is Debian's, compiled against Debian's fmt 9. A folder
#    holding only a link to Debian's fmt goes first on the include path, so every
#    translation unit sees one fmt, Debian's (the few c10d and c10 headers that include
#    fmt compile against it too).
#  * gloo: ProcessGroupGloo.hpp includes gloo's headers, which the wheel does not ship;
#    they come from Debian's libgloo-dev (Note [Gloo headers] in src/dist/CMakeLists.txt).
set(PIPEFB_TORCH_VERSION 2.11.0)

set(_pipefb_default_python "$ENV{HOME}/.cache/pipefb/venv-torch-${PIPEFB_TORCH_VERSION}/bin/python")
if(DEFINED ENV{PIPEFB_VENV} AND NOT "$ENV{PIPEFB_VENV}" STREQUAL "")
  set(_pipefb_default_python "$ENV{PIPEFB_VENV}/bin/python")
endif()
if(DEFINED ENV{PIPEFB_PYTHON} AND NOT "$ENV{PIPEFB_PYTHON}" STREQUAL "")
  set(_pipefb_default_python "$ENV{PIPEFB_PYTHON}")
endif()
set(PIPEFB_PYTHON "${_pipefb_default_python}" CACHE FILEPATH
    "python3 whose torch ${PIPEFB_TORCH_VERSION} pipefb builds against (Note [One LibTorch])")

execute_process(
  COMMAND "${PIPEFB_PYTHON}" -c
          "import torch; print(torch.__version__); print(torch.utils.cmake_prefix_path); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _pipefb_torch_out ERROR_VARIABLE _pipefb_torch_err RESULT_VARIABLE _pipefb_torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _pipefb_torch_rc EQUAL 0)
  message(FATAL_ERROR "PIPEFB_PYTHON=${PIPEFB_PYTHON} cannot import torch; run scripts/setup, or "
                      "set PIPEFB_PYTHON to a python3 that has torch==${PIPEFB_TORCH_VERSION}")
endif()
string(REPLACE "\n" ";" _pipefb_torch_out "${_pipefb_torch_out}")
list(GET _pipefb_torch_out 0 PIPEFB_PY_TORCH_VERSION)
list(GET _pipefb_torch_out 1 PIPEFB_TORCH_PREFIX)
list(LENGTH _pipefb_torch_out _n)
set(PIPEFB_TORCH_CUDA_VERSION "")
if(_n GREATER 2)
  list(GET _pipefb_torch_out 2 PIPEFB_TORCH_CUDA_VERSION)
endif()
string(REGEX MATCH "^[0-9]+\\.[0-9]+\\.[0-9]+" _pipefb_torch_release "${PIPEFB_PY_TORCH_VERSION}")
if(NOT _pipefb_torch_release VERSION_EQUAL PIPEFB_TORCH_VERSION)
  message(FATAL_ERROR "PIPEFB_PYTHON=${PIPEFB_PYTHON} has torch ${PIPEFB_PY_TORCH_VERSION}; pipefb "
                      "builds against torch==${PIPEFB_TORCH_VERSION} only: run scripts/setup, or set "
                      "PIPEFB_PYTHON to a python3 with torch==${PIPEFB_TORCH_VERSION}")
endif()
if(PIPEFB_TORCH_CUDA_VERSION STREQUAL "")
  message(FATAL_ERROR "PIPEFB_PYTHON=${PIPEFB_PYTHON} has torch ${PIPEFB_PY_TORCH_VERSION}, a CPU-only "
                      "build; pipefb needs the CUDA build (pip install torch==${PIPEFB_TORCH_VERSION} "
                      "from PyPI), whose GPU path links on machines without a GPU")
endif()

if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda)
  set(CUDAToolkit_ROOT /usr/local/cuda)
endif()
find_package(CUDAToolkit QUIET)
if(NOT CUDAToolkit_FOUND)
  message(FATAL_ERROR "torch ${PIPEFB_PY_TORCH_VERSION} is a CUDA ${PIPEFB_TORCH_CUDA_VERSION} build and "
                      "its CMake config needs the CUDA toolkit: install it into /usr/local/cuda or set "
                      "CUDAToolkit_ROOT")
endif()

# The wheel's libraries before any other LibTorch on the system paths (an old Debian
# libtorch-dev, say): TorchConfig's find_library searches the system before its own lib/.
get_filename_component(PIPEFB_TORCH_ROOT "${PIPEFB_TORCH_PREFIX}/../.." ABSOLUTE)
list(PREPEND CMAKE_PREFIX_PATH "${PIPEFB_TORCH_PREFIX}")
list(PREPEND CMAKE_LIBRARY_PATH "${PIPEFB_TORCH_ROOT}/lib")
find_package(Torch REQUIRED)
foreach(_lib ${TORCH_LIBRARY} ${C10_CUDA_LIBRARY})
  if(NOT _lib MATCHES "^${PIPEFB_TORCH_ROOT}/")
    message(FATAL_ERROR "find_package(Torch) took ${_lib}, not the wheel's own library under "
                        "${PIPEFB_TORCH_ROOT}/lib")
  endif()
endforeach()
if(NOT TORCH_CUDA_LIBRARIES)
  message(FATAL_ERROR "torch ${PIPEFB_PY_TORCH_VERSION} at ${PIPEFB_TORCH_PREFIX}: its CMake config has "
                      "no CUDA libraries; pipefb needs the CUDA build of torch==${PIPEFB_TORCH_VERSION}")
endif()
message(STATUS "pipefb: LibTorch ${Torch_VERSION} (CUDA ${PIPEFB_TORCH_CUDA_VERSION}) from ${PIPEFB_PYTHON}; "
               "CUDA toolkit ${CUDAToolkit_VERSION}")

# No binary may need the driver (libcuda.so.1): drop the stub LibTorch's config links.
if(TARGET caffe2::cuda)
  set_property(TARGET caffe2::cuda PROPERTY INTERFACE_LINK_LIBRARIES "")
endif()
# pipefb calls no NVRTC: LibTorch loads its own when it compiles a kernel at run time, so
# the toolkit's libnvrtc need not be found at run time either.
list(FILTER TORCH_LIBRARIES EXCLUDE REGEX "stubs/libcuda\\.so$|CUDA::cuda_driver|libnvrtc\\.so")
add_link_options(LINKER:--no-as-needed)
# The wheel's libtorch.so carries and exports a few libstdc++ symbols of its own (its
# toolchain's libstdc++_nonshared: std::filesystem among them), and its
# std::filesystem::remove_all crashes when called from here. The system libstdc++ is
# made the first library every binary needs, so every std:: symbol binds to it
# (no_gpu_test).
add_link_options(-lstdc++)

# One fmt in every translation unit: Debian's (see above).
set(PIPEFB_FMT_DIR ${PROJECT_BINARY_DIR}/fmt-include)
find_path(PIPEFB_SYSTEM_FMT fmt/format.h PATHS /usr/include NO_DEFAULT_PATH)
if(NOT PIPEFB_SYSTEM_FMT)
  message(FATAL_ERROR "Debian's fmt headers (libfmt-dev) are missing: run scripts/setup")
endif()
file(MAKE_DIRECTORY ${PIPEFB_FMT_DIR})
file(CREATE_LINK ${PIPEFB_SYSTEM_FMT}/fmt ${PIPEFB_FMT_DIR}/fmt SYMBOLIC)
include_directories(BEFORE ${PIPEFB_FMT_DIR})

# build/pipefb-python: runs the python of this build's torch, for the Python references
# (tests and experiments call it; Note [One LibTorch]).
file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/pipefb-python
     CONTENT "#!/bin/sh\n# Generated by cmake/Torch.cmake: the python3 of torch ${PIPEFB_PY_TORCH_VERSION}.\nexec \"${PIPEFB_PYTHON}\" \"$@\"\n")
file(CHMOD ${PROJECT_BINARY_DIR}/pipefb-python
     PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
add_compile_definitions(PIPEFB_PYTHON="${PROJECT_BINARY_DIR}/pipefb-python")
