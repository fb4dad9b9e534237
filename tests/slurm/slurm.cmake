# Sharded sweeps on a real one-node Slurm (ctest label slurm): tests/slurm/test_sharded_sweep.sh starts
# scripts/slurm/local-cluster (root, Debian's slurm-wlm and munge), submits configs/smoke.json as 4 array tasks
# with scripts/slurm/submit, cancels a task of a second submission and resubmits it; it exits 77 (skipped)
# without root or the Slurm binaries. RUN_SERIAL: its tasks calibrate and time on the machine's cores.
if(ATTN_BUILD_TESTS)
  add_test(NAME slurm.sharded_sweep
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/slurm/test_sharded_sweep.sh $<TARGET_FILE:attnbench>
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(slurm.sharded_sweep PROPERTIES LABELS slurm TIMEOUT 300 SKIP_RETURN_CODE 77
                                                      RUN_SERIAL TRUE)
endif()
