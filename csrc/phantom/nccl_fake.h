/* What the NCCL stand-in's files share (nccl_comm.c, nccl_coll.c;
 * README.md, "NCCL"): the communicator, its checks, the last error. */
#ifndef VG_NCCL_FAKE_H
#define VG_NCCL_FAKE_H

#include <stddef.h>
#include <stdint.h>

/* nccl.h includes cuda_fp8.h, whose CUDA 12 version does not preprocess
 * as C (cuda_fp8.hpp); nothing of it is needed here. */
#ifndef __CUDA_FP8_H__
#define __CUDA_FP8_H__
#endif

/* nccl.h declares ncclGroupStart() and ncclGroupEnd() without a prototype. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

/* ... and with one, for the definitions. */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

/* What newer NCCLs have (2.30's prototypes), written whatever the headers
 * say: where the real library lacks one, nccl_gen.py leaves it out of the
 * version script (a local function). The calls whose types only newer
 * headers have are compiled with them (#ifdef NCCL_REVOKE_DEFAULT,
 * NCCL_SUSPEND_MEM). */
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId);
/* 2.19 to 2.27's, for an older header (torch 2.1 to 2.7 ship NCCL 2.18 to 2.26) */
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId *commIds, ncclConfig_t *config);
ncclResult_t ncclMemAlloc(void **ptr, size_t size);
ncclResult_t ncclMemFree(void *ptr);
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle);
#ifdef NCCL_WIN_COLL_SYMMETRIC /* windows: NCCL 2.27 and later */
ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void **outUserPtr);
#endif

/* NCCL_CONFIG_INITIALIZER's magic (NCCL_API_MAGIC from 2.28 on). */
#define VGNC_API_MAGIC 0xcafebeefu

#define VGNC_MAGIC 0x6e63636cu      /* "nccl": a live communicator */
#define VGNC_REG_MAGIC 0x6e637267u  /* "ncrg": a registration handle */
#define VGNC_WIN_MAGIC 0x6e63776eu  /* "ncwn": a window */

/* A communicator: who it is, nothing it could move. */
struct ncclComm {
    uint32_t magic;
    int nranks, rank, device;
    int blocking;            /* the config's; 1 when none said */
    int finalized;           /* ncclCommFinalize was called */
    int revoked;             /* ncclCommRevoke was called */
    int suspended;           /* ncclCommSuspend, until ncclCommResume */
    int redops;              /* ncclRedOpCreatePreMulSum's so far */
    unsigned char redop_live[64]; /* which of them are not destroyed */
    unsigned char id[NCCL_UNIQUE_ID_BYTES];
};

/* Sets the last error (ncclGetLastError) to "<fmt>" and returns `code`. */
ncclResult_t vgnc_fail(ncclResult_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* ncclSuccess for a live communicator; else ncclInvalidArgument, the last
 * error "<what> : comm argument is NULL" as the real library's. */
ncclResult_t vgnc_check_comm(ncclComm_t comm, const char *what);
/* Bytes of `count` elements of `type`; 0 for an unknown type, and
 * SIZE_MAX past what a size_t holds. */
size_t vgnc_bytes(size_t count, size_t times, ncclDataType_t type);
void vgnc_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void vgnc_count_collective(void);

#endif
