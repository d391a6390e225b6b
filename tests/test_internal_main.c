/* test_internal_main.c — build/test_internal: `test_internal dp | tp | fp8_train | moe [ARGS]`
   runs one of the four tests that tests/us_impl.c compiles inside the implementation's object
   (see tests/test_internal.c). */
int us_test_internal_main(int argc, char **argv);

int main(int argc, char **argv) { return us_test_internal_main(argc, argv); }
