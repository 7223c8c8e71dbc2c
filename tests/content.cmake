# Content store tests: their own executable, because they need the store library.
if(TARGET ckpt_content AND TARGET ckpt_store)
  file(GLOB content_test_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/content/*.cpp)
  add_executable(content_tests ${content_test_sources})
  target_link_libraries(content_tests PRIVATE ckpt_content ckpt_namespace Catch2::Catch2 Boost::filesystem
    nlohmann_json::nlohmann_json)
  catch_discover_tests(content_tests EXTRA_ARGS --warn NoTests)
  # The same check pinned to one core (a daemon under taskset or a cpuset): the first of the
  # cores this test may run on.
  find_program(TASKSET taskset)
  if(TASKSET)
    add_test(NAME content.pools_on_one_pinned_core
             COMMAND sh -c "core=$(${TASKSET} -pc $$ | sed 's/.*: *//; s/[,-].*//'); exec ${TASKSET} -c \"$core\" \"$0\" \"$1\""
                     $<TARGET_FILE:content_tests>
                     "thread limits: pools are sized from the cores the process may run on")
  endif()
endif()
