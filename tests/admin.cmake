# Management operations (fs/admin): their own executable, on a real store in a temp dir.
if(TARGET ckpt_admin)
  add_executable(admin_tests ${CMAKE_CURRENT_SOURCE_DIR}/admin/admin_service_test.cpp)
  target_link_libraries(admin_tests PRIVATE ckpt_admin Catch2::Catch2 Boost::filesystem
    nlohmann_json::nlohmann_json)
  catch_discover_tests(admin_tests EXTRA_ARGS --warn NoTests)
endif()
