/* Every function the fake implements (rather than stubs), by its documented
 * name, with whether a sticky error reaches it: X(name, sticky).
 *
 * The list gives each function a counter and a fault slot that tests
 * address by name (vg_fakecuda_fail_call("cudaMalloc", ...)). A function
 * added to the fake is added here too: FAKE_ENTER(name) does not compile
 * otherwise. The names are only ever pasted or stringified, so a header
 * macro that renames the ABI symbol (cuMemAlloc -> cuMemAlloc_v2) does not
 * touch them.
 *
 * Sticky 0: device queries and selection, which a real GPU still answers
 * after an illegal memory access.
 */
#ifndef VGFC_APIS_H
#define VGFC_APIS_H

#define VGFC_RUNTIME_APIS(X)                                                     \
    X(cudaGetDeviceCount, 0)                                                     \
    X(cudaGetDevice, 0)                                                          \
    X(cudaSetDevice, 0)                                                          \
    X(cudaGetDeviceProperties, 0)                                                \
    X(cudaDeviceGetAttribute, 0)                                                 \
    X(cudaDeviceGetPCIBusId, 0)                                                  \
    X(cudaDeviceGetStreamPriorityRange, 0)                                       \
    X(cudaDeviceCanAccessPeer, 0)                                                \
    X(cudaDriverGetVersion, 0)                                                   \
    X(cudaRuntimeGetVersion, 0)                                                  \
    X(cudaDeviceEnablePeerAccess, 1)                                             \
    X(cudaDeviceSynchronize, 1)                                                  \
    X(cudaGetLastError, 1)                                                       \
    X(cudaPeekAtLastError, 1)                                                    \
    X(cudaMalloc, 1)                                                             \
    X(cudaFree, 1)                                                               \
    X(cudaMallocAsync, 1)                                                        \
    X(cudaFreeAsync, 1)                                                          \
    X(cudaMallocHost, 1)                                                         \
    X(cudaHostAlloc, 1)                                                          \
    X(cudaFreeHost, 1)                                                           \
    X(cudaHostRegister, 1)                                                       \
    X(cudaHostUnregister, 1)                                                     \
    X(cudaMallocManaged, 1)                                                      \
    X(cudaMemPrefetchAsync, 1)                                                   \
    X(cudaMemPrefetchAsync_v2, 1)                                                \
    X(cudaMemAdvise, 1)                                                          \
    X(cudaMemAdvise_v2, 1)                                                       \
    X(cudaMemGetInfo, 1)                                                         \
    X(cudaPointerGetAttributes, 1)                                               \
    X(cudaMemcpy, 1)                                                             \
    X(cudaMemcpyAsync, 1)                                                        \
    X(cudaMemcpy2D, 1)                                                           \
    X(cudaMemcpy2DAsync, 1)                                                      \
    X(cudaMemcpyPeerAsync, 1)                                                    \
    X(cudaMemset, 1)                                                             \
    X(cudaMemsetAsync, 1)                                                        \
    X(cudaStreamCreate, 1)                                                       \
    X(cudaStreamCreateWithFlags, 1)                                              \
    X(cudaStreamCreateWithPriority, 1)                                           \
    X(cudaStreamDestroy, 1)                                                      \
    X(cudaStreamQuery, 1)                                                        \
    X(cudaStreamSynchronize, 1)                                                  \
    X(cudaStreamWaitEvent, 1)                                                    \
    X(cudaStreamGetPriority, 1)                                                  \
    X(cudaStreamGetFlags, 1)                                                     \
    X(cudaStreamGetDevice, 1)                                                    \
    X(cudaStreamIsCapturing, 1)                                                  \
    X(cudaStreamGetCaptureInfo, 1)                                               \
    X(cudaThreadExchangeStreamCaptureMode, 0)                                    \
    X(cudaStreamBeginCapture, 1)                                                 \
    X(cudaStreamBeginCaptureToGraph, 1)                                          \
    X(cudaStreamEndCapture, 1)                                                   \
    X(cudaStreamUpdateCaptureDependencies, 1)                                    \
    X(cudaGraphCreate, 1)                                                        \
    X(cudaGraphDestroy, 1)                                                       \
    X(cudaGraphGetNodes, 1)                                                      \
    X(cudaGraphNodeGetType, 1)                                                   \
    X(cudaGraphNodeGetDependencies, 1)                                           \
    X(cudaGraphAddNode, 1)                                                       \
    X(cudaGraphRetainUserObject, 1)                                              \
    X(cudaGraphReleaseUserObject, 1)                                             \
    X(cudaGraphInstantiate, 1)                                                   \
    X(cudaGraphInstantiateWithFlags, 1)                                          \
    X(cudaGraphExecGetFlags, 1)                                                  \
    X(cudaGraphExecDestroy, 1)                                                   \
    X(cudaGraphUpload, 1)                                                        \
    X(cudaGraphLaunch, 1)                                                        \
    X(cudaUserObjectCreate, 1)                                                   \
    X(cudaUserObjectRetain, 1)                                                   \
    X(cudaUserObjectRelease, 1)                                                  \
    X(cudaDeviceGetGraphMemAttribute, 1)                                         \
    X(cudaDeviceSetGraphMemAttribute, 1)                                         \
    X(cudaDeviceGraphMemTrim, 1)                                                 \
    X(cudaEventCreate, 1)                                                        \
    X(cudaEventCreateWithFlags, 1)                                               \
    X(cudaEventDestroy, 1)                                                       \
    X(cudaEventRecord, 1)                                                        \
    X(cudaEventRecordWithFlags, 1)                                               \
    X(cudaEventQuery, 1)                                                         \
    X(cudaEventSynchronize, 1)                                                   \
    X(cudaEventElapsedTime, 1)                                                   \
    X(cudaGetDriverEntryPoint, 0)                                                \
    X(cudaGetDriverEntryPointByVersion, 0)                                       \
    X(__cudaLaunchKernel, 1)                                                     \
    X(cudaLaunchKernel, 1)                                                       \
    X(cudaLaunchKernelExC, 1)                                                    \
    X(cudaLaunchCooperativeKernel, 1)                                            \
    X(cudaLaunchHostFunc, 1)                                                     \
    X(cudaStreamAddCallback, 1)                                                  \
    X(cudaFuncGetAttributes, 1)                                                  \
    X(cudaFuncSetAttribute, 1)                                                   \
    X(cudaKernelSetAttributeForDevice, 1)                                        \
    X(cudaOccupancyMaxActiveBlocksPerMultiprocessor, 1)                          \
    X(cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, 1)                 \
    X(cudaMemcpyToSymbol, 1)

#define VGFC_DRIVER_APIS(X)                                                      \
    X(cuInit, 0)                                                                 \
    X(cuDriverGetVersion, 0)                                                     \
    X(cuDeviceGet, 0)                                                            \
    X(cuDeviceGetCount, 0)                                                       \
    X(cuDeviceGetName, 0)                                                        \
    X(cuDeviceGetUuid, 0)                                                        \
    X(cuDeviceTotalMem, 0)                                                       \
    X(cuDeviceGetAttribute, 0)                                                   \
    X(cuDeviceComputeCapability, 0)                                              \
    X(cuDeviceGetPCIBusId, 0)                                                    \
    X(cuDevicePrimaryCtxGetState, 0)                                             \
    X(cuDevicePrimaryCtxRetain, 0)                                               \
    X(cuDevicePrimaryCtxRelease, 0)                                              \
    X(cuCtxGetCurrent, 0)                                                        \
    X(cuCtxSetCurrent, 0)                                                        \
    X(cuCtxPushCurrent, 0)                                                       \
    X(cuCtxPopCurrent, 0)                                                        \
    X(cuCtxGetDevice, 0)                                                         \
    X(cuCtxSynchronize, 1)                                                       \
    X(cuMemGetInfo, 1)                                                           \
    X(cuMemAlloc, 1)                                                             \
    X(cuMemFree, 1)                                                              \
    X(cuMemGetAddressRange, 1)                                                   \
    X(cuMemsetD8, 1)                                                             \
    X(cuMemsetD32Async, 1)                                                       \
    X(cuStreamWriteValue32, 1)                                                   \
    X(cuPointerGetAttribute, 1)                                                  \
    X(cuMemGetAllocationGranularity, 0)                                          \
    X(cuMemAddressReserve, 1)                                                    \
    X(cuMemAddressFree, 1)                                                       \
    X(cuMemCreate, 1)                                                            \
    X(cuMemRelease, 1)                                                           \
    X(cuMemMap, 1)                                                               \
    X(cuMemUnmap, 1)                                                             \
    X(cuMemSetAccess, 1)                                                         \
    X(cuMemRetainAllocationHandle, 1)                                            \
    X(cuMemGetAllocationPropertiesFromHandle, 1)                                 \
    X(cuModuleLoad, 1)                                                           \
    X(cuModuleLoadData, 1)                                                       \
    X(cuModuleLoadDataEx, 1)                                                     \
    X(cuModuleUnload, 1)                                                         \
    X(cuModuleGetFunction, 1)                                                    \
    X(cuFuncGetAttribute, 1)                                                     \
    X(cuFuncSetAttribute, 1)                                                     \
    X(cuFuncSetCacheConfig, 1)                                                   \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, 1)                            \
    X(cuLaunchKernel, 1)                                                         \
    X(cuLaunchKernelEx, 1)                                                       \
    X(cuLaunchCooperativeKernel, 1)                                              \
    X(cuLinkCreate, 1)                                                           \
    X(cuLinkAddData, 1)                                                          \
    X(cuLinkComplete, 1)                                                         \
    X(cuLinkDestroy, 1)

enum vgfc_api {
#define VGFC_API_ENUM(name, sticky) VGFC_API_##name,
    VGFC_RUNTIME_APIS(VGFC_API_ENUM)
    VGFC_DRIVER_APIS(VGFC_API_ENUM)
#undef VGFC_API_ENUM
    VGFC_API_COUNT
};

#endif
