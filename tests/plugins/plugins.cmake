# The suite's test plugins (tests/plugins/*.cpp), built with attn_add_plugin (bench/plugin/plugin.cmake) into
# ${CMAKE_BINARY_DIR}/plugins, for tests/test_plugins.cpp:
#   plugin_good          plugin_good_exact, a correct exact variant (forward, causal, grouped-query heads);
#   plugin_hostile       plugin_throws, plugin_nan, plugin_oob (writes past the end of O);
#   plugin_clash         a variant named naive (a built-in name);
#   plugin_needs_input   needs_alibi_slopes, needing an input no default path supplies (tests/defaults);
#   plugin_wrong_abi     only a marker claiming ABI 999 (NO_ENTRY);
#   plugin_not_a_plugin  a plain shared library (NO_ENTRY).
set(ATTN_TEST_PLUGINS plugin_good plugin_hostile plugin_clash plugin_needs_input)
set(ATTN_TEST_PLUGINS_NO_ENTRY plugin_wrong_abi plugin_not_a_plugin)
foreach(name ${ATTN_TEST_PLUGINS})
  attn_add_plugin(${name} SOURCES ${CMAKE_SOURCE_DIR}/tests/plugins/${name}.cpp)
endforeach()
foreach(name ${ATTN_TEST_PLUGINS_NO_ENTRY})
  attn_add_plugin(${name} NO_ENTRY SOURCES ${CMAKE_SOURCE_DIR}/tests/plugins/${name}.cpp)
endforeach()
if(TARGET attn_tests)
  add_dependencies(attn_tests ${ATTN_TEST_PLUGINS} ${ATTN_TEST_PLUGINS_NO_ENTRY})
  target_compile_definitions(attn_tests PRIVATE ATTN_TEST_PLUGIN_DIR="${CMAKE_BINARY_DIR}/plugins")
  # The Google Benchmark driver (absent from the sanitizer builds: its test skips there).
  if(TARGET attnbench_gbench)
    add_dependencies(attn_tests attnbench_gbench)
    target_compile_definitions(attn_tests PRIVATE ATTNBENCH_GBENCH_EXE="$<TARGET_FILE:attnbench_gbench>")
  endif()
endif()

# Every default path over every variant, the built-ins and plugin_good's (tests/defaults/test_default_paths.py),
# and its self-test: plugin_needs_input's variant, which needs an input no default supplies, must fail it.
if(ATTN_BUILD_TESTS)
  set(ATTN_DEFAULT_PATHS ${CMAKE_SOURCE_DIR}/tests/defaults/test_default_paths.py --attnbench $<TARGET_FILE:attnbench>)
  if(TARGET attnbench_gbench)
    list(APPEND ATTN_DEFAULT_PATHS --gbench $<TARGET_FILE:attnbench_gbench>)
  endif()
  add_test(NAME defaults.every_variant COMMAND /usr/bin/python3 ${ATTN_DEFAULT_PATHS} --plugin $<TARGET_FILE:plugin_good>)
  add_test(NAME defaults.self_test COMMAND /usr/bin/python3 ${ATTN_DEFAULT_PATHS}
                                           --plugin $<TARGET_FILE:plugin_needs_input> --expect-failure needs_alibi_slopes)
  set_tests_properties(defaults.every_variant defaults.self_test PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900)
endif()
