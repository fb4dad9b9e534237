# Plugins (issue #29; README "Benchmark your own attention"): out-of-tree variants in shared libraries that
# attnbench loads with dlopen (common/interface/plugin_loader.hpp).
#
# A plugin binds to the symbols of the program that loads it (the registry, the shared kernels) instead of
# linking a copy of attnbench's library: one registry, one set of kernels, and no second copy of a static
# object. So every host exports its symbols (ENABLE_EXPORTS) and links all of attn_common (whole archive):
# a helper no built-in code calls is still there for a plugin that does.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

target_link_libraries(attn_common PUBLIC ${CMAKE_DL_LIBS})
# The loader says which attnbench a refused plugin was built against, and which this is.
set_property(SOURCE ${CMAKE_SOURCE_DIR}/common/interface/plugin_loader.cpp APPEND PROPERTY COMPILE_DEFINITIONS
             ATTN_PROJECT_VERSION="${PROJECT_VERSION}")
set(ATTN_BUILT_AGAINST "${PROJECT_VERSION} (${ATTN_GIT_COMMIT})")

function(attn_plugin_host target)
  if(TARGET ${target})
    set_target_properties(${target} PROPERTIES ENABLE_EXPORTS ON)
    target_link_options(${target} PRIVATE "LINKER:--whole-archive" $<TARGET_FILE:attn_common>
                        "LINKER:--no-whole-archive")
  endif()
endfunction()
foreach(host attnbench attnbench_gbench attn_tests attnbench_python)
  attn_plugin_host(${host})
endforeach()

# attn_add_plugin(NAME SOURCES a.cpp ...): a plugin built inside this tree (the suite's test plugins), the
# way attnbench_add_variant builds one outside it (bench/plugin/attnbenchConfig.cmake.in), with this build's
# flags (so the sanitizer builds instrument it too). The library lands in ${CMAKE_BINARY_DIR}/plugins.
function(attn_add_plugin name)
  cmake_parse_arguments(ARG "NO_ENTRY" "" "SOURCES" ${ARGN})
  set(sources ${ARG_SOURCES})
  if(NOT ARG_NO_ENTRY)
    set(entry ${CMAKE_BINARY_DIR}/plugins/${name}_entry.cpp)
    file(WRITE ${entry}.in "#include \"common/interface/plugin_entry.hpp\"\n")
    configure_file(${entry}.in ${entry} COPYONLY)
    list(APPEND sources ${entry})
  endif()
  add_library(${name} MODULE ${sources})
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR})
  target_compile_definitions(${name} PRIVATE ATTNBENCH_PLUGIN=1 ATTNBENCH_BUILT_AGAINST="${ATTN_BUILT_AGAINST}")
  target_link_libraries(${name} PRIVATE attn_options nlohmann_json::nlohmann_json Eigen3::Eigen)
  set_target_properties(${name} PROPERTIES PREFIX "lib" LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/plugins)
endfunction()

# --- cmake --install: the programs, the headers a variant compiles against, the CMake package ------------
install(TARGETS attnbench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET attnbench_gbench)
  install(TARGETS attnbench_gbench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
# Every header under common/ (the interface, the shared kernels and helpers a variant may call), at the
# include paths variants use ("common/interface/attention.hpp").
install(DIRECTORY ${CMAKE_SOURCE_DIR}/common DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/attnbench
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h")
set(ATTN_PACKAGE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/attnbench)
configure_package_config_file(${CMAKE_SOURCE_DIR}/bench/plugin/attnbenchConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/package/attnbenchConfig.cmake
                              INSTALL_DESTINATION ${ATTN_PACKAGE_DIR}
                              PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_BINDIR)
# A plugin and the attnbench that loads it must share the plugin ABI, which the loader checks; the package
# version only has to be the same release series.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/package/attnbenchConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/package/attnbenchConfig.cmake
              ${CMAKE_BINARY_DIR}/package/attnbenchConfigVersion.cmake DESTINATION ${ATTN_PACKAGE_DIR})
# The plotting scripts, so a plugin's author draws REPORT.md without this source tree:
#   /usr/bin/python3 <prefix>/share/attnbench/scripts/plot.py RESULTS_DIR
install(FILES ${CMAKE_SOURCE_DIR}/scripts/plot.py DESTINATION ${CMAKE_INSTALL_DATADIR}/attnbench/scripts
        PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/scripts/plotlib DESTINATION ${CMAKE_INSTALL_DATADIR}/attnbench/scripts
        PATTERN "__pycache__" EXCLUDE)
# plotlib/lra.py reads the LRA paper's table and plotlib/styles.py the pinned styles from ../../configs, as in
# this tree.
install(FILES ${CMAKE_SOURCE_DIR}/configs/lra_table2.json ${CMAKE_SOURCE_DIR}/configs/plot_styles.json
        DESTINATION ${CMAKE_INSTALL_DATADIR}/attnbench/configs)

# --- tests: the example as a user builds it, and the suite's own test plugins ----------------------------
if(ATTN_BUILD_TESTS)
  add_test(NAME plugin.example
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/plugins/example_install.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(plugin.example PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900)
  include(${CMAKE_SOURCE_DIR}/tests/plugins/plugins.cmake)
endif()
