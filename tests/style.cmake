# Style: the sources as .clang-format says (the check a reviewer would run by hand).
add_test(NAME style.clang_format
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/style/clang_format.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(style.clang_format PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
