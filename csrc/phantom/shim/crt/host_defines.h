/* The few host-compiler definitions the CUDA runtime headers expect from
 * crt/host_defines.h. pip's CUDA runtime wheel ships cuda_runtime_api.h but
 * not crt/ (that comes with the compiler package), so the fake supplies what
 * a plain C compile of the headers needs. The include path lists the wheel's
 * headers first: where a wheel does ship crt/, its own file wins.
 */
#ifndef __HOST_DEFINES_H__
#define __HOST_DEFINES_H__

#define CUDARTAPI
#define CUDARTAPI_CDECL
#define __host__
#define __device__
#define __global__
#define __shared__
#define __constant__
#define __managed__
#define __device_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define __cudart_builtin__
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __no_return__ __attribute__((noreturn))
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(n) __align__(n)
#define __thread__ __thread
#define __import__
#define __export__
#define __cdecl
#define __annotate__(a)
#define __location__(a)
#define __specialization_static

#endif
