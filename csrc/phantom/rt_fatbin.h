/* Which architectures each registered kernel was compiled for
 * (rt_fatbin.c): what cudaFuncGetAttributes reports; and which library
 * registered it, whose launches are counted. */
#ifndef VGFC_RT_FATBIN_H
#define VGFC_RT_FATBIN_H

#include "rt.h"

typedef struct rt_fatbin rt_fatbin;

/* A registered fat binary (nvcc's wrapper around it) and the architectures
 * it holds; NULL only without memory. */
rt_fatbin *rt_fatbin_register(const void *wrapper);

/* The kernel whose host stub is `stub` is in `fatbin`. */
void rt_fatbin_add_kernel(rt_fatbin *fatbin, const void *stub);

/* The binaryVersion and ptxVersion a device of compute capability
 * major.minor reports for the kernel at `stub`: its newest SASS the device
 * runs, else the device's own with the newest PTX it can compile; the
 * device's own for a kernel not registered. 0, or
 * cudaErrorNoKernelImageForDevice when the kernel has no code it runs. */
int rt_fatbin_versions(const void *stub, int major, int minor, int *binary, int *ptx);

/* A launch of the kernel at `stub`: counted for the library that
 * registered it (nothing for a kernel no fat binary registered). */
void rt_fatbin_count_launch(const void *stub);

#endif
