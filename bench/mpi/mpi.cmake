# attnbench_mpi: exact ring attention over MPI (bench/mpi/ring.hpp), built when OpenMPI (or another MPI) is
# found; its tests (tests/mpi, ctest label mpi) run it under mpirun. Included by the top-level CMakeLists.txt.
# Sanitizer and fuzzing builds leave it out: OpenMPI's libraries are not instrumented and report leaks and
# races of their own under ASan / TSan.
if(ATTN_SANITIZE OR ATTN_FUZZ)
  message(STATUS "attnbench: no attnbench_mpi in sanitizer / fuzzing builds")
  return()
endif()
find_package(MPI COMPONENTS CXX)
if(NOT MPI_CXX_FOUND)
  message(STATUS "attnbench: no attnbench_mpi (MPI not found: apt-get install libopenmpi-dev openmpi-bin)")
  return()
endif()

add_executable(attnbench_mpi ${CMAKE_SOURCE_DIR}/bench/mpi/main.cpp ${CMAKE_SOURCE_DIR}/bench/mpi/ring.cpp
                             ${CMAKE_SOURCE_DIR}/bench/mpi/npy_stream.cpp ${CMAKE_SOURCE_DIR}/bench/mpi/sweep.cpp)
target_link_libraries(attnbench_mpi PRIVATE attn_bench attn_variants MPI::MPI_CXX)

if(ATTN_BUILD_TESTS)
  # The driver starts mpirun itself (-np 1..4) with the flags a root CI container needs (--allow-run-as-root,
  # --oversubscribe: 4 ranks on 2 cores) and plm isolated (no ssh on one node). Every mpirun is under a
  # timeout, so a hang fails the test instead of stalling ctest.
  find_program(ATTN_MPIEXEC NAMES mpirun mpiexec HINTS ${MPIEXEC_EXECUTABLE})
  set(ATTN_MPI_TEST_ENV OMPI_MCA_plm=isolated OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
                        OMPI_MCA_rmaps_base_oversubscribe=1)
  foreach(part accuracy errors fault sweep)
    add_test(NAME mpi.${part}
             COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/mpi/test_ring.py ${part}
                     --mpi $<TARGET_FILE:attnbench_mpi> --attnbench $<TARGET_FILE:attnbench> --mpirun ${ATTN_MPIEXEC}
             WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
    set_tests_properties(mpi.${part} PROPERTIES LABELS mpi TIMEOUT 300 SKIP_RETURN_CODE 77
                                                ENVIRONMENT "${ATTN_MPI_TEST_ENV}")
  endforeach()
endif()
