# The suite's test plugins (tests/plugins/*.cpp), built with attn_add_plugin (bench/plugin/plugin.cmake) into
# ${CMAKE_BINARY_DIR}/plugins, for tests/test_plugins.cpp.
