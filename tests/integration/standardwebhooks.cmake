# standardwebhooks_official_verify (design invariant 7): signatures made by our C signer
# (sl_sign_vector, from sign_vector.c) must verify with the OFFICIAL `standardwebhooks` PyPI
# package, taken from the venv that scripts/setup.sh creates. No stack needed; a missing
# package is a failure ("run scripts/setup.sh"), never a skip.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_executable(sl_sign_vector ${CMAKE_CURRENT_LIST_DIR}/sign_vector.c)
target_link_libraries(sl_sign_vector PRIVATE sluice_common)
sl_target_warnings(sl_sign_vector)
add_test(NAME standardwebhooks_official_verify
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/verify_standardwebhooks.py
                 --signer $<TARGET_FILE:sl_sign_vector>)
math(EXPR _sl_swh_timeout "120 * ${SL_TEST_TIMEOUT_MULT}")
set_tests_properties(standardwebhooks_official_verify PROPERTIES
                     LABELS integration TIMEOUT ${_sl_swh_timeout})
