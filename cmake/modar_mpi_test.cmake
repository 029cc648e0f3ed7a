# modar_add_mpi_test(<name> <ranks> <command> [args...]): a ctest test that runs
# <command> under mpirun with <ranks> processes, for the multi-process tests
# (communicator, parallel steps).  Without MPI in the build the test is still
# registered and reports "skipped" with a one-line reason (ctest's
# SKIP_RETURN_CODE), so a CPU-only build without Open MPI stays green and says
# why.
#
# mpirun flags: --allow-run-as-root (CI runs as root), --oversubscribe (more
# ranks than the 2 cores here), --bind-to none (oversubscribed ranks must not
# share one core each), --mca btl self,vader (shared memory; no network probing
# in a sandbox).  OMP_NUM_THREADS=1 per rank.  ASAN_OPTIONS turns
# LeakSanitizer off for these processes in the sanitizer build: Open MPI keeps
# allocations until exit from plugins it has unloaded by then, so LSan cannot
# even name their module to suppress them (AddressSanitizer and UBSan still
# check everything).  MODAR_MPI_TEST_ENVIRONMENT holds the same settings for
# tests that start mpirun themselves.
set(MODAR_MPI_TEST_ENVIRONMENT
    "OMP_NUM_THREADS=1;ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:check_initialization_order=1:strict_init_order=1")
function(modar_add_mpi_test name ranks)
  if(MODAR_HAVE_MPI AND MPIEXEC_EXECUTABLE)
    add_test(NAME ${name}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} --allow-run-as-root
                     --oversubscribe --bind-to none --mca btl self,vader ${ARGN})
    set_tests_properties(${name} PROPERTIES
      LABELS "comm;mpi" TIMEOUT 120 PROCESSORS 2
      ENVIRONMENT "${MODAR_MPI_TEST_ENVIRONMENT}")
  else()
    add_test(NAME ${name}
             COMMAND ${CMAKE_COMMAND} -E echo "skipped: this build has no MPI (MODAR_MPI=OFF or no Open MPI found; install libopenmpi-dev openmpi-bin)")
    set_tests_properties(${name} PROPERTIES LABELS "comm;mpi" SKIP_REGULAR_EXPRESSION "skipped: ")
  endif()
endfunction()
