/* Preloaded (LD_PRELOAD) into every process of the sanitizer tests, never part of fsdp.c: a dlclose
 * that leaves the library mapped. Open MPI dlclose()s its plugins (openmpi3/mca_*.so) in MPI_Finalize,
 * before LeakSanitizer looks at the heap; the memory those plugins allocated for themselves then points
 * into code that is no longer mapped, which LeakSanitizer cannot name, so the suppressions of
 * lsan.supp could reach Open MPI's frames only by unwinding every allocation in full through DWARF
 * tables (five times slower on the tokenizer's many small allocations). With the plugins still mapped,
 * the allocating frame names its module and frame-pointer unwinding is enough. Built without the
 * sanitizers, so that uninstrumented processes (python3, mpirun, node) load it too. */
int dlclose(void *handle);

int dlclose(void *handle) {
    (void)handle;
    return 0;
}
