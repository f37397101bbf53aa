// Around code that uses AVX-512 intrinsics with masks: GCC 12 reports its own headers'
// _mm512_undefined_*() merge sources as uninitialised once they are inlined (GCC bug 105593, fixed
// in 13), which -Werror turns into a failed build. Clang knows only -Wuninitialized.
//   SPRITETORCH_AVX512_DIAGNOSTICS_BEGIN  ...AVX-512 code...  SPRITETORCH_AVX512_DIAGNOSTICS_END
#pragma once

#if defined(__clang__)
#define SPRITETORCH_AVX512_DIAGNOSTICS_BEGIN \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#else
#define SPRITETORCH_AVX512_DIAGNOSTICS_BEGIN                                           \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#endif
#define SPRITETORCH_AVX512_DIAGNOSTICS_END _Pragma("GCC diagnostic pop")
