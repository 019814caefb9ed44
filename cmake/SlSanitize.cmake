# -DSL_SANITIZE=address,undefined adds the sanitizers to every compile and link, with
# -fno-sanitize-recover=all so a UBSan finding fails the test that hit it.
if(SL_SANITIZE)
  set(_san -fsanitize=${SL_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_compile_options(${_san})
  add_link_options(${_san})
  message(STATUS "sanitizers: ${SL_SANITIZE}")
endif()

# Fuzzing: the library is compiled with fuzzer-no-link so coverage reaches it; only the
# harness links -fsanitize=fuzzer (see tests/fuzz/CMakeLists.txt).
if(SL_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "SL_FUZZ=ON needs clang (CC=clang)")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
