// runtime/layer_check_main.cpp: the program of the layer checks
// (modar_layer_check_<floor>, runtime/CMakeLists.txt).  Each links one floor's
// library whole (every object file, used or not) with only the floors that
// floor declares, so a call from a lower floor into a higher one is an
// undefined reference at link time.  Built, never run.
int main() {
  return 0;
}
