# Note [CUDA sources]
# The CUDA backend (src/memory/cuda, offload/cuda, src/dist/cuda) and the GPU tests
# compile and link in every build against the CUDA LibTorch (Note [One LibTorch]); they
# need a GPU only to run, and the GPU tests skip without one.
# pipefb_cuda_sources(<target> SOURCES ... [DEFINES ...]) adds a component's CUDA sources
# to its library, with their DEFINES (USE_C10D_NCCL for ProcessGroupNCCL.hpp), and the
# toolkit's headers (cuda_runtime_api.h, nccl.h).
function(pipefb_cuda_sources tgt)
  cmake_parse_arguments(C "" "" "SOURCES;DEFINES" ${ARGN})
  target_sources(${tgt} PRIVATE ${C_SOURCES})
  if(C_DEFINES)
    set_property(SOURCE ${C_SOURCES} APPEND PROPERTY COMPILE_DEFINITIONS ${C_DEFINES})
  endif()
  target_link_libraries(${tgt} PRIVATE CUDA::cudart)
endfunction()
