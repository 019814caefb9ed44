# sluice-produce integration test (tests/integration/test_produce.c, registered by the glob in
# CMakeLists.txt) runs the real binary, so it must be built first; and sl-test-topic, the
# topic create/delete helper that bench/produce.sh uses (auto-create is off on our broker).
if(TARGET test_produce AND TARGET sluice-produce)
  add_dependencies(test_produce sluice-produce)
endif()

add_executable(sl-test-topic ${CMAKE_CURRENT_LIST_DIR}/topic_tool.c)
target_link_libraries(sl-test-topic PRIVATE PkgConfig::RDKAFKA)
sl_target_warnings(sl-test-topic)
