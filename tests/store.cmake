# Store library (fs/store/): its unit tests (tests/unit/store_*.cpp) live in unit_tests.
if(TARGET ckpt_store)
  target_link_libraries(unit_tests PRIVATE ckpt_store)
endif()
