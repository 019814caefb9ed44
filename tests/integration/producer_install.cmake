# producer_install (label component: no services): libsluice_producer installed into a temp
# prefix, the example producer/examples built against the installed copy with pkg-config and
# with find_package(SluiceProducer), shared and static, and run; exports checked
# (producer_install.sh). In sanitizer builds the installed library is instrumented, so the
# examples get the same -fsanitize flags (cmake/SlSanitize.cmake).
set(_sl_install_san "")
if(SL_SANITIZE)
  set(_sl_install_san "-fsanitize=${SL_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all")
elseif(SL_FUZZ)
  set(_sl_install_san "-fsanitize=address,undefined -fno-omit-frame-pointer")
endif()
add_test(NAME producer_install
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/producer_install.sh ${CMAKE_SOURCE_DIR}
                 ${CMAKE_BINARY_DIR} ${CMAKE_C_COMPILER} ${PROJECT_VERSION}
                 $<TARGET_PROPERTY:sluice_producer_shared,SOVERSION> ${CMAKE_INSTALL_LIBDIR}
                 "${_sl_install_san}")
math(EXPR _t "300 * ${SL_TEST_TIMEOUT_MULT}")
set_tests_properties(producer_install PROPERTIES LABELS component TIMEOUT ${_t})
