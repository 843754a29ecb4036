# Note [CUDA sources]
# The CUDA backend (src/memory/cuda, offload/cuda, src/dist/cuda; issue 17) needs a
# LibTorch built with CUDA.
#  * Against one (-DCMAKE_PREFIX_PATH=<python3 -c 'import torch;
#    print(torch.utils.cmake_prefix_path)'>, README.md "On a GPU host"),
#    pipefb_cuda_sources() adds the files to their component's library and every target
#    sees PIPEFB_TORCH_CUDA=1.
#  * Against Debian's CPU LibTorch 1.13 they cannot link (no libtorch_cuda), so they are
#    type-checked: the target cuda_typecheck (part of `all`, so a CUDA source that stops
#    compiling fails the build) runs `g++ -std=c++17 -fsyntax-only` over one generated
#    translation unit that includes them all (one parse of the LibTorch headers, ~20 s;
#    a depfile re-runs it only when one of them or a header they use changes). Debian
#    ships c10/cuda/*, ATen/cuda/* and c10d/ProcessGroupNCCL.hpp but not the generated
#    c10/cuda/impl/cuda_cmake_macros.h; a stand-in holding `#pragma once` replaces it. The
#    CUDA toolkit's headers (cuda_runtime_api.h, nccl.h) come from /usr/local/cuda.
#    Sources given DEFINES (USE_C10D_NCCL for ProcessGroupNCCL.hpp) get them here too.
set(PIPEFB_TORCH_CUDA OFF)
if(TORCH_CUDA_LIBRARIES)
  set(PIPEFB_TORCH_CUDA ON)
  add_compile_definitions(PIPEFB_TORCH_CUDA=1)
  message(STATUS "pipefb: LibTorch ${Torch_VERSION} has CUDA; the CUDA backend is built")
else()
  message(STATUS "pipefb: LibTorch ${Torch_VERSION} is CPU-only; the CUDA backend is type-checked (cuda_typecheck)")
endif()

# pipefb_cuda_sources(<target> SOURCES ... [DEFINES ...]): CUDA LibTorch sources of a component.
function(pipefb_cuda_sources tgt)
  cmake_parse_arguments(C "" "" "SOURCES;DEFINES" ${ARGN})
  if(PIPEFB_TORCH_CUDA)
    target_sources(${tgt} PRIVATE ${C_SOURCES})
    if(C_DEFINES)
      set_property(SOURCE ${C_SOURCES} APPEND PROPERTY COMPILE_DEFINITIONS ${C_DEFINES})
    endif()
  else()
    foreach(s ${C_SOURCES})
      get_filename_component(abs ${s} ABSOLUTE)
      set_property(GLOBAL APPEND PROPERTY PIPEFB_CUDA_TYPECHECK_SOURCES ${abs})
    endforeach()
    set_property(GLOBAL APPEND PROPERTY PIPEFB_CUDA_TYPECHECK_DEFINES ${C_DEFINES})
  endif()
endfunction()

# The cuda_typecheck target, after every component registered its sources.
function(pipefb_cuda_typecheck)
  get_property(srcs GLOBAL PROPERTY PIPEFB_CUDA_TYPECHECK_SOURCES)
  get_property(defs GLOBAL PROPERTY PIPEFB_CUDA_TYPECHECK_DEFINES)
  if(PIPEFB_TORCH_CUDA OR NOT srcs)
    return()
  endif()
  if(NOT EXISTS ${PIPEFB_CUDA_ROOT}/include/cuda_runtime_api.h)
    message(WARNING "pipefb: no CUDA toolkit in ${PIPEFB_CUDA_ROOT}: the CUDA sources are not type-checked")
    return()
  endif()
  set(dir ${PROJECT_BINARY_DIR}/cuda_typecheck)
  file(CONFIGURE OUTPUT ${dir}/include/c10/cuda/impl/cuda_cmake_macros.h
       CONTENT "#pragma once\n// Stand-in for the header a CUDA LibTorch build generates (Note [CUDA sources]).\n")
  set(unity "// Generated (Note [CUDA sources]): every CUDA source, type-checked together.\n")
  foreach(s ${srcs})
    string(APPEND unity "#include \"${s}\"\n")
  endforeach()
  file(CONFIGURE OUTPUT ${dir}/unity.cpp CONTENT "${unity}")
  list(REMOVE_DUPLICATES defs)
  set(flags -std=c++17 -fsyntax-only ${PIPEFB_TORCH_FLAGS} -Wall -Wextra -Wno-unused-parameter
      -Werror=switch -DPIPEFB_TORCH_CUDA=1 "-DPIPEFB_SOURCE_DIR=\"${PROJECT_SOURCE_DIR}\""
      "-DPIPEFB_BINARY_DIR=\"${PROJECT_BINARY_DIR}\"")
  foreach(d ${defs})
    list(APPEND flags -D${d})
  endforeach()
  list(APPEND flags -I${dir}/include -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/tests)
  foreach(i ${TORCH_INCLUDE_DIRS} ${PIPEFB_CUDA_ROOT}/include)
    if(NOT i IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)  # -isystem /usr/include breaks libstdc++
      list(APPEND flags -isystem ${i})
    endif()
  endforeach()
  # Ninja matches the depfile's target by its path relative to the build folder.
  file(RELATIVE_PATH stamp ${PROJECT_BINARY_DIR} ${dir}/unity.stamp)
  add_custom_command(
    OUTPUT ${dir}/unity.stamp
    COMMAND ${CMAKE_CXX_COMPILER} ${flags} -MD -MT ${stamp} -MF ${dir}/unity.d ${dir}/unity.cpp
    COMMAND ${CMAKE_COMMAND} -E touch ${dir}/unity.stamp
    DEPENDS ${dir}/unity.cpp ${srcs}
    DEPFILE ${dir}/unity.d
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
    COMMENT "Type-checking the CUDA sources against LibTorch ${Torch_VERSION} (Note [CUDA sources])"
    VERBATIM)
  add_custom_target(cuda_typecheck ALL DEPENDS ${dir}/unity.stamp)
endfunction()
