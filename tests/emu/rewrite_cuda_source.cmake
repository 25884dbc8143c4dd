# Copies a CUDA source (kernels/*.cu, *.cuh, *.h) for the emulated build (tests/emu), with the
# two constructs host C++ cannot express rewritten:
#   kernel<T><<<grid, block, smem, stream>>>(args)  ->  ::emu::launch(::emu::cfg("kernel", grid, block, smem, stream),
#                                                         EMU_KERNEL_ADDRESS(kernel<T>), [](auto&&... a) { kernel<T>(a...); }, args)
#   __shared__ T name[N];                             ->  auto& name = ::emu::static_shared<T[N]>([] {});
#   extern __shared__ __align__(A) T name[];          ->  T* const name = static_cast<T*>(::emu::dynamic_shared());
# Usage: cmake -DINPUT=<source> -DOUTPUT=<copy> -P rewrite_cuda_source.cmake
file(READ "${INPUT}" text)
set(ws "[ \t\r\n]")
set(id "[A-Za-z_][A-Za-z_0-9]*")
string(REGEX REPLACE "(${id})((<[^;<>]*>)?)${ws}*<<<([^;]*)>>>${ws}*\\("
       "::emu::launch(::emu::cfg(\"\\1\", \\4), EMU_KERNEL_ADDRESS(\\1\\2), [](auto&&... emu_args) { \\1\\2(emu_args...); }, " text "${text}")
string(REGEX REPLACE "extern${ws}+__shared__${ws}+(__align__\\([0-9]+\\)${ws}+)?([A-Za-z_][A-Za-z_0-9: ]*[A-Za-z_0-9]|[A-Za-z_])${ws}+(${id})${ws}*\\[${ws}*\\]${ws}*;"
       "\\2* const \\3 = static_cast<\\2*>(::emu::dynamic_shared());" text "${text}")
string(REGEX REPLACE "__shared__${ws}+([A-Za-z_][A-Za-z_0-9:<>, ]*[A-Za-z_0-9>]|[A-Za-z_])${ws}+(${id})((\\[[^];]+\\])+)${ws}*;"
       "auto& \\2 = ::emu::static_shared<\\1\\3>([] {});" text "${text}")
if(text MATCHES "<<<|>>>|__shared__")
  message(FATAL_ERROR "${INPUT}: a kernel launch or __shared__ declaration the emulation's rewrite does not recognize")
endif()
file(WRITE "${OUTPUT}.tmp" "// Generated from ${INPUT} for the CUDA emulation (tests/emu/rewrite_cuda_source.cmake).\n#line 1 \"${INPUT}\"\n${text}")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
