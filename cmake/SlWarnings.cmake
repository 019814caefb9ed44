# Picky warnings for our own targets (not for third-party code). Mirrors curl's PickyWarnings.
set(SL_WARNING_FLAGS
    -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 -Wvla
    -Wconversion -Wno-sign-conversion -Wpointer-arith -Wcast-qual -Wundef)
if(SL_WERROR)
  list(APPEND SL_WARNING_FLAGS -Werror)
endif()

# sl_target_warnings(target): apply the flags above to one of our targets.
function(sl_target_warnings target)
  target_compile_options(${target} PRIVATE ${SL_WARNING_FLAGS})
endfunction()
