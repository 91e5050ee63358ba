// A floor under explicitly requested thread stack sizes, for the whole oombd process.
//
// glibc puts a thread's static TLS at the top of its stack, and pthread_create fails with
// EINVAL when a requested stack cannot hold it. LibTorch and the CUDA libraries it loads bring
// ~190 KiB of static TLS (libcublasLt alone 92 KiB), while CivetWeb, the HTTP server under
// prometheus-cpp's Exposer (/metrics), asks for 100 KiB stacks (Debian builds it with
// USE_STACK_SIZE=102400) and offers no option to change that: every /metrics thread failed to
// start. This definition, exported from the executable (oombd's link options), takes
// precedence over glibc's for every library and raises requests below 1 MiB to 1 MiB. Stacks
// are reserved address space, committed as used, so the floor costs no memory.
#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using Fn = int (*)(pthread_attr_t*, size_t);
  static const Fn real = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  constexpr size_t kFloor = size_t{1} << 20;
  return real(attr, size < kFloor ? kFloor : size);
}
