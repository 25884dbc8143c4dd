# Fails when a Backend op takes more than three tensors as positional arguments: such an op
# takes an argument struct, filled with designated initializers at the call, so that two
# same-shaped tensors (dw and db, mean and rstd) cannot be swapped unnoticed. Run with
# -DHEADER=<backend.h>; every `virtual` declaration in it is checked.
file(READ "${HEADER}" text)
# A ;-free copy: the declarations end at their semicolon.
string(REPLACE ";" "@" text "${text}")
string(REGEX MATCHALL "virtual[^@{]*[@{]" declarations "${text}")
set(problems "")
foreach(declaration IN LISTS declarations)
  string(REGEX MATCHALL "Tensor&" tensors "${declaration}")
  list(LENGTH tensors count)
  if(count GREATER 3)
    string(REGEX MATCH "[a-z_0-9]+\\(" name "${declaration}")
    string(APPEND problems "\n  ${name}...) takes ${count} tensors: give it an argument struct (see MatmulBwd in backend.h)")
  endif()
endforeach()
if(problems)
  message(FATAL_ERROR "llmtrain: ${HEADER}: ops with more than three positional tensors:${problems}")
endif()
list(LENGTH declarations checked)
message(STATUS "llmtrain: ${checked} declarations of ${HEADER} take at most three positional tensors")
