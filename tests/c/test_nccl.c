/* The NCCL stand-in's own test (csrc/phantom/nccl_*.c), linked against it
 * and the fake runtime and driver: two devices of 1 GiB and 512 MiB. Every
 * hand-written entry point is called, with good arguments and with each
 * bad one the real library refuses (NULL or destroyed communicator, rank,
 * root or peer outside it, NULL out-pointer, unknown type or operator, a
 * count that overflows or overruns its buffer, memory of another device),
 * with the real library's codes; collectives complete at once and move
 * nothing; the generated stubs refuse and say so once. Built against an
 * older NCCL (CUDA 12's 2.27), what it lacks is left out: the calls newer
 * headers declare (#ifdef), and the functions the stand-in writes but
 * does not export there (found with dlsym, else skipped).
 *
 *   make test-fakecuda               all of it (test-fakecuda-san: sanitized)
 *   build/fakecuda/test_nccl coll    the tests whose name contains "coll"
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fakecuda.h"
#include "harness.h"
#include "rerun.h"
#include "nccl_fake.h"

#define MiB (1ull << 20)
#define OK ncclSuccess
#define ARG ncclInvalidArgument
#define USAGE ncclInvalidUsage

long vg_phantom_nccl_live_comms(void);
long vg_phantom_nccl_live_handles(void);
long vg_phantom_nccl_collectives(void);
long vg_phantom_nccl_unsupported_calls(void);

/* The stand-in's functions that an older NCCL lacks: NULL there. */
typedef ncclResult_t (*alltoall_fn)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*rooted_fn)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*comm_id_fn)(ncclComm_t, ncclUniqueId *);
typedef ncclResult_t (*win_ptr_fn)(ncclComm_t, ncclWindow_t, void **);
static alltoall_fn alltoall;
static rooted_fn gather, scatter;
static comm_id_fn comm_unique_id;
static win_ptr_fn win_user_ptr;

static void find_newer(void)
{
    alltoall = (alltoall_fn)dlsym(RTLD_DEFAULT, "ncclAlltoAll");
    gather = (rooted_fn)dlsym(RTLD_DEFAULT, "ncclGather");
    scatter = (rooted_fn)dlsym(RTLD_DEFAULT, "ncclScatter");
    comm_unique_id = (comm_id_fn)dlsym(RTLD_DEFAULT, "ncclCommGetUniqueId");
    win_user_ptr = (win_ptr_fn)dlsym(RTLD_DEFAULT, "ncclWinGetUserPtr");
}

/* `fn`(...) where the library has it, else `absent`. */
#define IF_HAS(fn, absent, ...) ((fn) ? (fn)(__VA_ARGS__) : (absent))

/* 4096 bytes on device 0 (dev_a, dev_b), on device 1 (dev_c), and host
 * memory. */
static void *dev_a, *dev_b, *dev_c;
static char host_buf[4096];

static ncclComm_t rank_of(int rank, int nranks, int device)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    cudaSetDevice(device);
    if (ncclGetUniqueId(&id) != OK || ncclCommInitRank(&comm, nranks, id, rank) != OK)
        return NULL;
    return comm;
}

static int last_error_has(const char *text)
{
    return strstr(ncclGetLastError(NULL), text) != NULL;
}

/* ---- versions, errors, ids ---------------------------------------------- */

static void test_versions_and_errors(void)
{
    int version = 0;
    CHECK_EQ(ncclGetVersion(&version), OK);
    CHECK_EQ(version, NCCL_VERSION_CODE);
    CHECK_EQ(ncclGetVersion(NULL), ARG);
    CHECK(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0);
    CHECK(strcmp(ncclGetErrorString(ncclInvalidArgument),
                 "invalid argument (run with NCCL_DEBUG=WARN for details)") == 0);
    CHECK(strcmp(ncclGetErrorString(ncclInvalidUsage), "invalid usage (run with NCCL_DEBUG=WARN for details)") == 0);
    CHECK(strcmp(ncclGetErrorString(ncclInProgress), "NCCL operation in progress") == 0);
    /* ncclTimeout from 2.28 on; before, 8 is ncclNumResults. */
    CHECK(strcmp(ncclGetErrorString((ncclResult_t)8), ncclNumResults > 8 ? "timeout" : "unknown result code") == 0);
    for (int r = ncclSuccess; r < ncclNumResults; r++)
        CHECK(strcmp(ncclGetErrorString((ncclResult_t)r), "unknown result code") != 0);
    CHECK(strcmp(ncclGetErrorString(ncclNumResults), "unknown result code") == 0);
    CHECK(strcmp(ncclGetErrorString((ncclResult_t)-1), "unknown result code") == 0);
    int count;
    CHECK_EQ(ncclCommCount(NULL, &count), ARG);
    CHECK(strcmp(ncclGetLastError(NULL), "CommCount : comm argument is NULL") == 0);
}

static void test_unique_id(void)
{
    ncclUniqueId a, b;
    CHECK_EQ(ncclGetUniqueId(NULL), ARG);
    CHECK(last_error_has("GetUniqueId : out argument is NULL"));
    CHECK_EQ(ncclGetUniqueId(&a), OK);
    CHECK_EQ(ncclGetUniqueId(&b), OK);
    CHECK(memcmp(&a, &b, sizeof a) != 0);
}

/* ---- communicators ------------------------------------------------------ */

static void test_init_rank(void)
{
    long live = vg_phantom_nccl_live_comms();
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    ncclComm_t comm = (ncclComm_t)1;
    cudaSetDevice(1);
    CHECK_EQ(ncclCommInitRank(&comm, 2, id, 1), OK);
    CHECK(comm != NULL);
    int count = 0, device = -1, rank = -1;
    CHECK_EQ(ncclCommCount(comm, &count), OK);
    CHECK_EQ(ncclCommCuDevice(comm, &device), OK);
    CHECK_EQ(ncclCommUserRank(comm, &rank), OK);
    CHECK_EQ(count, 2);
    CHECK_EQ(device, 1);
    CHECK_EQ(rank, 1);
    CHECK_EQ(vg_phantom_nccl_live_comms(), live + 1);
    CHECK_EQ(ncclCommCount(comm, NULL), ARG);
    CHECK(last_error_has("CommCount : count argument is NULL"));
    CHECK_EQ(ncclCommCuDevice(comm, NULL), ARG);
    CHECK_EQ(ncclCommUserRank(comm, NULL), ARG);
    CHECK_EQ(ncclCommCuDevice(NULL, &device), ARG);
    CHECK_EQ(ncclCommUserRank(NULL, &rank), ARG);
    CHECK_EQ(ncclCommDestroy(comm), OK);
    CHECK_EQ(vg_phantom_nccl_live_comms(), live);

    /* Bad ranks and sizes: nothing made, *comm NULL. */
    comm = (ncclComm_t)1;
    CHECK_EQ(ncclCommInitRank(&comm, 2, id, 2), ARG);
    CHECK(comm == NULL);
    CHECK(last_error_has("Invalid rank requested : 2/2"));
    CHECK_EQ(ncclCommInitRank(&comm, 2, id, -1), ARG);
    CHECK_EQ(ncclCommInitRank(&comm, 0, id, 0), ARG);
    CHECK_EQ(ncclCommInitRank(NULL, 2, id, 0), ARG);
    CHECK(last_error_has("newcomm argument is NULL"));
    CHECK_EQ(vg_phantom_nccl_live_comms(), live);

    /* A config: NCCL_CONFIG_INITIALIZER's, nonblocking, completes at once;
     * one not made by the initializer is refused. */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    CHECK_EQ(ncclCommInitRankConfig(&comm, 4, id, 3, &config), OK);
    ncclResult_t async = ncclInProgress;
    CHECK_EQ(ncclCommGetAsyncError(comm, &async), OK);
    CHECK_EQ(async, OK);
    CHECK_EQ(ncclCommGetAsyncError(comm, NULL), ARG);
    CHECK_EQ(ncclCommGetAsyncError(NULL, &async), ARG);
    CHECK(last_error_has("ncclGetAsyncError : comm argument is NULL"));
    CHECK_EQ(ncclCommDestroy(comm), OK);
    ncclConfig_t raw;
    memset(&raw, 0, sizeof raw);
    CHECK_EQ(ncclCommInitRankConfig(&comm, 2, id, 0, &raw), ARG);
    CHECK(comm == NULL);
    CHECK_EQ(ncclCommInitRankConfig(&comm, 2, id, 0, NULL), OK);
    CHECK_EQ(ncclCommAbort(comm), OK);

    /* Scalable: several ids, one rank. */
    ncclUniqueId ids[2];
    ncclGetUniqueId(&ids[0]);
    ncclGetUniqueId(&ids[1]);
    CHECK_EQ(ncclCommInitRankScalable(&comm, 8, 5, 2, ids, NULL), OK);
    CHECK_EQ(ncclCommUserRank(comm, &rank), OK);
    CHECK_EQ(rank, 5);
    CHECK_EQ(ncclCommDestroy(comm), OK);
    CHECK_EQ(ncclCommInitRankScalable(&comm, 8, 5, 0, ids, NULL), ARG);
    CHECK_EQ(ncclCommInitRankScalable(&comm, 8, 8, 2, ids, NULL), ARG);
    CHECK_EQ(vg_phantom_nccl_live_comms(), live);
}

static void test_init_all(void)
{
    long live = vg_phantom_nccl_live_comms();
    ncclComm_t comms[2] = {NULL, NULL};
    CHECK_EQ(ncclCommInitAll(comms, 2, NULL), OK);
    for (int i = 0; i < 2; i++) {
        int rank, device, count;
        CHECK_EQ(ncclCommUserRank(comms[i], &rank), OK);
        CHECK_EQ(ncclCommCuDevice(comms[i], &device), OK);
        CHECK_EQ(ncclCommCount(comms[i], &count), OK);
        CHECK_EQ(rank, i);
        CHECK_EQ(device, i);
        CHECK_EQ(count, 2);
        CHECK_EQ(ncclCommDestroy(comms[i]), OK);
    }
    int swapped[2] = {1, 0};
    CHECK_EQ(ncclCommInitAll(comms, 2, swapped), OK);
    int device;
    CHECK_EQ(ncclCommCuDevice(comms[0], &device), OK);
    CHECK_EQ(device, 1);
    CHECK_EQ(ncclCommDestroy(comms[0]), OK);
    CHECK_EQ(ncclCommDestroy(comms[1]), OK);
    int twice[2] = {0, 0}, missing[1] = {5};
    CHECK_EQ(ncclCommInitAll(comms, 2, twice), USAGE);
    CHECK(last_error_has("Duplicate device 0"));
    CHECK_EQ(ncclCommInitAll(comms, 1, missing), ARG);
    CHECK_EQ(ncclCommInitAll(comms, 3, NULL), ARG); /* two devices */
    CHECK_EQ(ncclCommInitAll(comms, 0, NULL), ARG);
    CHECK(last_error_has("Invalid device count requested : 0"));
    CHECK_EQ(ncclCommInitAll(NULL, 2, NULL), ARG);
    CHECK_EQ(vg_phantom_nccl_live_comms(), live);
}

static void test_split_and_shrink(void)
{
    ncclComm_t parent = rank_of(2, 4, 0), child = (ncclComm_t)1;
    CHECK(parent != NULL);
    CHECK_EQ(ncclCommSplit(parent, 1, 7, &child, NULL), OK);
    int rank, count;
    CHECK_EQ(ncclCommUserRank(child, &rank), OK);
    CHECK_EQ(ncclCommCount(child, &count), OK);
    CHECK_EQ(rank, 2); /* the others' colors are not known: the parent's */
    CHECK_EQ(count, 4);
    CHECK_EQ(ncclCommDestroy(child), OK);
    child = (ncclComm_t)1;
    CHECK_EQ(ncclCommSplit(parent, NCCL_SPLIT_NOCOLOR, 0, &child, NULL), OK);
    CHECK(child == NULL);
    CHECK_EQ(ncclCommSplit(parent, -5, 0, &child, NULL), ARG);
    CHECK_EQ(ncclCommSplit(parent, 0, 0, NULL, NULL), ARG);
    CHECK_EQ(ncclCommSplit(NULL, 0, 0, &child, NULL), ARG);
    CHECK(last_error_has("CommSplit : comm argument is NULL"));

    int exclude[3] = {0, 3, 0};
    CHECK_EQ(ncclCommShrink(parent, exclude, 3, &child, NULL, NCCL_SHRINK_DEFAULT), OK);
    CHECK_EQ(ncclCommUserRank(child, &rank), OK);
    CHECK_EQ(ncclCommCount(child, &count), OK);
    CHECK_EQ(rank, 1);
    CHECK_EQ(count, 2);
    CHECK_EQ(ncclCommDestroy(child), OK);
    int self[1] = {2}, outside[1] = {4};
    CHECK_EQ(ncclCommShrink(parent, self, 1, &child, NULL, 0), ARG);
    CHECK_EQ(ncclCommShrink(parent, outside, 1, &child, NULL, 0), ARG);
    CHECK_EQ(ncclCommShrink(parent, NULL, 1, &child, NULL, 0), ARG);
    CHECK_EQ(ncclCommShrink(parent, exclude, 1, &child, NULL, 0x10), ARG);
    CHECK_EQ(ncclCommShrink(NULL, exclude, 1, &child, NULL, 0), ARG);

    ncclUniqueId id;
    CHECK_EQ(IF_HAS(comm_unique_id, OK, parent, &id), OK);
    CHECK_EQ(IF_HAS(comm_unique_id, ARG, NULL, &id), ARG);
    CHECK_EQ(ncclCommDestroy(parent), OK);
}

static void test_lifecycle(void)
{
    CHECK_EQ(ncclCommDestroy(NULL), OK);
    CHECK_EQ(ncclCommAbort(NULL), OK);
    CHECK_EQ(ncclCommFinalize(NULL), OK);
    ncclComm_t comm = rank_of(0, 2, 0);
    CHECK(comm != NULL);
#ifdef NCCL_SUSPEND_MEM
    CHECK_EQ(ncclCommSuspend(comm, 0), OK);
    uint64_t value = 9;
    CHECK_EQ(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &value), OK);
    CHECK_EQ(value, 1);
    CHECK_EQ(ncclCommResume(comm), OK);
    CHECK_EQ(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &value), OK);
    CHECK_EQ(value, 0);
    CHECK_EQ(ncclCommMemStats(comm, ncclStatGpuMemTotal, &value), OK);
    CHECK_EQ(value, 0); /* no VG_PHANTOM_NCCL_COMM */
    CHECK_EQ(ncclCommMemStats(comm, ncclStatGpuMemTotal, NULL), ARG);
    CHECK_EQ(ncclCommMemStats(comm, (ncclCommMemStat_t)99, &value), ARG);
    CHECK_EQ(ncclCommMemStats(NULL, ncclStatGpuMemTotal, &value), ARG);
    CHECK_EQ(ncclCommSuspend(NULL, 0), ARG);
    CHECK_EQ(ncclCommResume(NULL), ARG);
#endif
    CHECK_EQ(ncclCommFinalize(comm), OK);
    CHECK_EQ(ncclAllReduce(dev_a, dev_a, 16, ncclFloat, ncclSum, comm, NULL), USAGE);
    CHECK_EQ(ncclCommDestroy(comm), OK);

#ifdef NCCL_REVOKE_DEFAULT
    comm = rank_of(0, 2, 0);
    CHECK_EQ(ncclCommRevoke(comm, 1), ARG);
    CHECK_EQ(ncclCommRevoke(NULL, 0), ARG);
    CHECK_EQ(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT), OK);
    CHECK_EQ(ncclAllReduce(dev_a, dev_a, 16, ncclFloat, ncclSum, comm, NULL), USAGE);
    CHECK(last_error_has("revoked"));
    CHECK_EQ(ncclCommAbort(comm), OK);
#endif
}

/* ---- collectives -------------------------------------------------------- */

static void test_collectives(void)
{
    ncclComm_t comm = rank_of(0, 2, 0);
    CHECK(comm != NULL);
    long before = vg_phantom_nccl_collectives();
    cudaStream_t s = NULL;
    /* 4096 bytes: 1024 floats, 2 ranks. */
    CHECK_EQ(ncclAllReduce(dev_a, dev_b, 1024, ncclFloat, ncclSum, comm, s), OK);
    CHECK_EQ(ncclAllReduce(dev_a, dev_a, 2048, ncclHalf, ncclAvg, comm, s), OK);
    CHECK_EQ(ncclBroadcast(dev_a, dev_b, 512, ncclDouble, 1, comm, s), OK);
    CHECK_EQ(ncclBroadcast(NULL, dev_b, 512, ncclDouble, 1, comm, s), OK); /* not the root */
    CHECK_EQ(ncclBcast(dev_a, 4096, ncclUint8, 0, comm, s), OK);
    CHECK_EQ(ncclReduce(dev_a, dev_b, 1024, ncclInt32, ncclMax, 0, comm, s), OK);
    CHECK_EQ(ncclReduce(dev_a, NULL, 1024, ncclInt32, ncclMin, 1, comm, s), OK);
    CHECK_EQ(ncclAllGather(dev_a, dev_b, 512, ncclFloat, comm, s), OK);
    CHECK_EQ(ncclReduceScatter(dev_a, dev_b, 512, ncclFloat, ncclProd, comm, s), OK);
    CHECK_EQ(IF_HAS(alltoall, OK, dev_a, dev_b, 256, ncclInt64, comm, s), OK);
    CHECK_EQ(IF_HAS(gather, OK, dev_a, dev_b, 512, ncclBfloat16, 0, comm, s), OK);
    CHECK_EQ(IF_HAS(scatter, OK, dev_a, dev_b, 512, ncclBfloat16, 0, comm, s), OK);
    CHECK_EQ(ncclSend(dev_a, 4096, ncclFloat8e4m3, 1, comm, s), OK);
    CHECK_EQ(ncclRecv(dev_b, 4096, ncclFloat8e5m2, 1, comm, s), OK);
    CHECK_EQ(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, comm, s), OK); /* nothing to check */
    long done = 12 + (alltoall != NULL) + (gather != NULL) + (scatter != NULL);
    CHECK_EQ(vg_phantom_nccl_collectives(), before + done);

    /* Bad communicator, type, operator, root, peer. */
    CHECK_EQ(ncclAllReduce(dev_a, dev_b, 16, ncclFloat, ncclSum, NULL, s), ARG);
    CHECK(strcmp(ncclGetLastError(NULL), "AllReduce : comm argument is NULL") == 0);
    CHECK_EQ(ncclSend(dev_a, 16, ncclFloat, 1, NULL, s), ARG);
    CHECK(strcmp(ncclGetLastError(NULL), "Send : comm argument is NULL") == 0);
    CHECK_EQ(ncclAllReduce(dev_a, dev_b, 16, ncclNumTypes, ncclSum, comm, s), ARG);
    CHECK_EQ(ncclAllReduce(dev_a, dev_b, 16, (ncclDataType_t)-1, ncclSum, comm, s), ARG);
    CHECK_EQ(ncclAllReduce(dev_a, dev_b, 16, ncclFloat, ncclNumOps, comm, s), ARG);
    CHECK_EQ(ncclReduceScatter(dev_a, dev_b, 16, ncclFloat, (ncclRedOp_t)-1, comm, s), ARG);
    CHECK_EQ(ncclBroadcast(dev_a, dev_b, 16, ncclFloat, 2, comm, s), ARG);
    CHECK_EQ(ncclBcast(dev_a, 16, ncclFloat, -1, comm, s), ARG);
    CHECK_EQ(ncclReduce(dev_a, dev_b, 16, ncclFloat, ncclSum, 2, comm, s), ARG);
    CHECK_EQ(IF_HAS(gather, ARG, dev_a, dev_b, 16, ncclFloat, 2, comm, s), ARG);
    CHECK_EQ(IF_HAS(scatter, ARG, dev_a, dev_b, 16, ncclFloat, 2, comm, s), ARG);
    CHECK_EQ(ncclSend(dev_a, 16, ncclFloat, 2, comm, s), ARG);
    CHECK_EQ(ncclRecv(dev_b, 16, ncclFloat, -1, comm, s), ARG);

    /* Counts: past the buffer, past what a size_t holds. */
    CHECK_EQ(ncclAllReduce(dev_a, dev_b, 1025, ncclFloat, ncclSum, comm, s), ARG);
    CHECK(last_error_has("is not device memory of device 0"));
    CHECK_EQ(ncclAllReduce(dev_a, dev_b, SIZE_MAX / 2, ncclFloat, ncclSum, comm, s), ARG);
    CHECK(last_error_has("overflows"));
    CHECK_EQ(ncclAllGather(dev_a, dev_b, 513, ncclFloat, comm, s), ARG);        /* recv 2 x 513 */
    CHECK_EQ(ncclAllGather(dev_a, dev_b, SIZE_MAX / 2 + 1, ncclUint8, comm, s), ARG);
    CHECK_EQ(ncclReduceScatter(dev_a, dev_b, 513, ncclFloat, ncclSum, comm, s), ARG); /* send 2 x 513 */
    CHECK_EQ(IF_HAS(alltoall, ARG, dev_a, dev_b, 257, ncclInt64, comm, s), ARG);
    CHECK_EQ(IF_HAS(gather, ARG, dev_a, dev_b, 513, ncclFloat, 0, comm, s), ARG);
    CHECK_EQ(IF_HAS(scatter, ARG, dev_a, dev_b, 513, ncclFloat, 0, comm, s), ARG);
    CHECK_EQ(ncclSend(dev_a, 4097, ncclUint8, 1, comm, s), ARG);
    CHECK_EQ(ncclRecv(dev_b, 4097, ncclUint8, 1, comm, s), ARG);

    /* Buffers: NULL, host memory, another device's memory. */
    CHECK_EQ(ncclAllReduce(NULL, dev_b, 16, ncclFloat, ncclSum, comm, s), ARG);
    CHECK(last_error_has("sendbuff argument is NULL"));
    CHECK_EQ(ncclAllReduce(dev_a, NULL, 16, ncclFloat, ncclSum, comm, s), ARG);
    CHECK_EQ(ncclAllReduce(host_buf, dev_b, 16, ncclFloat, ncclSum, comm, s), ARG);
    CHECK_EQ(ncclAllReduce(dev_a, dev_c, 16, ncclFloat, ncclSum, comm, s), ARG);
    CHECK_EQ(ncclBroadcast(NULL, dev_b, 16, ncclFloat, 0, comm, s), ARG); /* the root's */
    CHECK_EQ(ncclReduce(dev_a, NULL, 16, ncclFloat, ncclSum, 0, comm, s), ARG);
    CHECK_EQ(vg_phantom_nccl_collectives(), before + done);

    /* A sticky error on the device fails the launch. */
    vg_fakecuda_set_sticky_error(700);
    CHECK_EQ(ncclAllReduce(dev_a, dev_b, 16, ncclFloat, ncclSum, comm, s), ncclUnhandledCudaError);
    ncclComm_t other = NULL;
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    CHECK_EQ(ncclCommInitRank(&other, 2, id, 1), ncclUnhandledCudaError);
    vg_fakecuda_reset();
    CHECK_EQ(ncclAllReduce(dev_a, dev_b, 16, ncclFloat, ncclSum, comm, s), OK);
    CHECK_EQ(ncclCommDestroy(comm), OK);
}

static void test_groups(void)
{
    CHECK_EQ(ncclGroupEnd(), USAGE);
    CHECK(strcmp(ncclGetLastError(NULL), "ncclGroupEnd: not in a group call.") == 0);
    ncclComm_t comm = rank_of(1, 2, 0);
    CHECK_EQ(ncclGroupStart(), OK);
    CHECK_EQ(ncclGroupStart(), OK);
    CHECK_EQ(ncclSend(dev_a, 16, ncclFloat, 0, comm, NULL), OK);
    CHECK_EQ(ncclRecv(dev_b, 16, ncclFloat, 0, comm, NULL), OK);
    CHECK_EQ(ncclGroupEnd(), OK);
    CHECK_EQ(ncclGroupEnd(), OK);
    CHECK_EQ(ncclGroupEnd(), USAGE);
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    CHECK_EQ(ncclGroupStart(), OK);
    CHECK_EQ(ncclGroupSimulateEnd(&sim), OK);
    CHECK(sim.estimatedTime == 0.0f);
    CHECK_EQ(ncclGroupSimulateEnd(&sim), USAGE); /* not in a group */
    ncclSimInfo_t raw;
    memset(&raw, 0, sizeof raw);
    CHECK_EQ(ncclGroupStart(), OK);
    CHECK_EQ(ncclGroupSimulateEnd(&raw), ARG);
    CHECK_EQ(ncclGroupSimulateEnd(NULL), OK);
    CHECK_EQ(ncclCommDestroy(comm), OK);
}

static void test_redops(void)
{
    ncclComm_t comm = rank_of(0, 2, 0);
    float scalar = 0.5f;
    ncclRedOp_t op = ncclSum, op2 = ncclSum;
    CHECK_EQ(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm), OK);
    CHECK_EQ(op, ncclNumOps);
    CHECK_EQ(ncclRedOpCreatePreMulSum(&op2, dev_a, ncclFloat, ncclScalarDevice, comm), OK);
    CHECK_EQ(op2, ncclNumOps + 1);
    CHECK_EQ(ncclAllReduce(dev_a, dev_b, 16, ncclFloat, op, comm, NULL), OK);
    CHECK_EQ(ncclRedOpDestroy(op, comm), OK);
    CHECK_EQ(ncclAllReduce(dev_a, dev_b, 16, ncclFloat, op, comm, NULL), ARG);
    CHECK_EQ(ncclRedOpDestroy(op, comm), ARG);
    CHECK_EQ(ncclReduceScatter(dev_a, dev_b, 16, ncclFloat, op2, comm, NULL), OK);
    CHECK_EQ(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm), OK);
    CHECK_EQ(op, ncclNumOps); /* reused */
    CHECK_EQ(ncclRedOpDestroy(ncclSum, comm), ARG);
    CHECK(last_error_has("operator is a NCCL builtin."));
    CHECK_EQ(ncclRedOpDestroy(op2, NULL), ARG);
    CHECK_EQ(ncclRedOpCreatePreMulSum(&op, host_buf, ncclFloat, ncclScalarDevice, comm), ARG);
    CHECK_EQ(ncclRedOpCreatePreMulSum(&op, &scalar, ncclNumTypes, ncclScalarHostImmediate, comm), ARG);
    CHECK_EQ(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, (ncclScalarResidence_t)7, comm), ARG);
    CHECK_EQ(ncclRedOpCreatePreMulSum(NULL, &scalar, ncclFloat, ncclScalarHostImmediate, comm), ARG);
    CHECK_EQ(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, NULL), ARG);
    CHECK_EQ(ncclCommDestroy(comm), OK);
}

/* ---- memory ------------------------------------------------------------- */

static void test_memory(void)
{
    cudaSetDevice(1);
    long long before = vg_fakecuda_bytes_in_use(1);
    long mallocs = vg_fakecuda_malloc_calls();
    void *p = NULL;
    CHECK_EQ(ncclMemAlloc(&p, 100), OK);
    CHECK(p != NULL);
    CHECK_EQ(vg_fakecuda_bytes_in_use(1) - before, 2 * MiB); /* its granularity */
    CHECK_EQ(vg_fakecuda_malloc_calls(), mallocs + 1);        /* the runtime's cudaMalloc */
    CHECK_EQ(ncclMemFree(p), OK);
    CHECK_EQ(vg_fakecuda_bytes_in_use(1), before);
    CHECK_EQ(ncclMemAlloc(NULL, 100), ARG);
    CHECK_EQ(ncclMemAlloc(&p, 0), ARG);
    CHECK_EQ(ncclMemAlloc(&p, SIZE_MAX), ARG);
    CHECK_EQ(ncclMemAlloc(&p, 600 * MiB), ncclUnhandledCudaError); /* device 1 has 512 MiB */
    CHECK(p == NULL);
    CHECK_EQ(ncclMemFree(NULL), OK);
    CHECK_EQ(ncclMemFree(host_buf), ncclUnhandledCudaError);

    ncclComm_t comm = rank_of(0, 2, 0);
    long handles = vg_phantom_nccl_live_handles();
    void *handle = NULL;
    CHECK_EQ(ncclCommRegister(comm, dev_a, 4096, &handle), OK);
    CHECK(handle != NULL);
    CHECK_EQ(vg_phantom_nccl_live_handles(), handles + 1);
    CHECK_EQ(ncclCommDeregister(comm, handle), OK);
    CHECK_EQ(vg_phantom_nccl_live_handles(), handles);
    CHECK_EQ(ncclCommRegister(comm, dev_a, 4097, &handle), ARG);
    CHECK_EQ(ncclCommRegister(comm, dev_c, 16, &handle), ARG); /* device 1's */
    CHECK_EQ(ncclCommRegister(comm, host_buf, 16, &handle), ARG);
    CHECK_EQ(ncclCommRegister(comm, dev_a, 16, NULL), ARG);
    CHECK_EQ(ncclCommRegister(NULL, dev_a, 16, &handle), ARG);
    CHECK(last_error_has("ncclCommRegister : comm argument is NULL"));
    CHECK_EQ(ncclCommDeregister(NULL, handle), ARG);
    CHECK_EQ(ncclCommDeregister(comm, host_buf), ARG);
    CHECK_EQ(ncclCommDeregister(comm, NULL), ARG);

    ncclWindow_t win = NULL;
    void *user = NULL;
    CHECK_EQ(ncclCommWindowRegister(comm, dev_b, 4096, &win, NCCL_WIN_COLL_SYMMETRIC), OK);
    user = dev_b;
    CHECK_EQ(IF_HAS(win_user_ptr, OK, comm, win, &user), OK);
    CHECK(user == dev_b);
    CHECK_EQ(IF_HAS(win_user_ptr, ARG, comm, win, NULL), ARG);
    CHECK_EQ(IF_HAS(win_user_ptr, ARG, NULL, win, &user), ARG);
    CHECK_EQ(ncclCommDeregister(comm, win), ARG); /* a window, not a registration */
    CHECK_EQ(ncclCommWindowDeregister(comm, win), OK);
    CHECK_EQ(ncclCommWindowRegister(comm, dev_b, 16, &win, 0x100), ARG);
    CHECK_EQ(ncclCommWindowRegister(comm, dev_b, 16, NULL, 0), ARG);
    CHECK_EQ(ncclCommWindowRegister(comm, host_buf, 16, &win, 0), ARG);
    CHECK_EQ(ncclCommWindowRegister(NULL, dev_b, 16, &win, 0), ARG);
    CHECK_EQ(ncclCommWindowDeregister(comm, NULL), ARG);
    CHECK_EQ(ncclCommWindowDeregister(NULL, NULL), ARG);
    CHECK_EQ(vg_phantom_nccl_live_handles(), handles);
    CHECK_EQ(ncclCommDestroy(comm), OK);
}

/* ---- stubs ------------------------------------------------------------- */

/* A function the stand-in does not model refuses with ncclInvalidUsage, is
 * counted with the fake's other stubs, and names itself on stderr once. */
static void test_stubs(void)
{
    typedef ncclResult_t (*param_bind_fn)(void *, const char *);
    param_bind_fn param_bind = (param_bind_fn)dlsym(RTLD_DEFAULT, "ncclParamBind");
    if (!param_bind) { /* an NCCL before 2.30: the stand-in writes all it has */
        printf("     (no ncclParamBind: no stub to call)\n");
        return;
    }
    vg_fakecuda_reset();
    long before = vg_phantom_nccl_unsupported_calls();
    fflush(stderr);
    FILE *capture = tmpfile();
    CHECK(capture != NULL);
    int saved = dup(2);
    dup2(fileno(capture), 2);
    ncclResult_t first = param_bind(NULL, "x");
    ncclResult_t second = param_bind(NULL, "x");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    CHECK_EQ(first, USAGE);
    CHECK_EQ(second, USAGE);
    CHECK_EQ(vg_phantom_nccl_unsupported_calls(), before + 2);
    CHECK_EQ(vg_fakecuda_unsupported_calls(), 2);
    CHECK(strcmp(vg_fakecuda_last_unsupported(), "ncclParamBind") == 0);
    CHECK(last_error_has("ncclParamBind is not implemented"));
    char text[1024] = {0};
    rewind(capture);
    size_t n = fread(text, 1, sizeof text - 1, capture);
    fclose(capture);
    CHECK(n > 0);
    const char *one = strstr(text, "vramguard NCCL stand-in: ncclParamBind is not implemented");
    CHECK(one != NULL);
    CHECK(strstr(one + strlen("vramguard NCCL stand-in: ncclParamBind"), "ncclParamBind") == NULL); /* once */
}

/* ---- other configurations, in a child process -------------------------- */

/* VG_PHANTOM_NCCL_COMM: a communicator's device memory, taken at init and
 * given back at destroy; on a phantom, the stand-in names itself once. */
static int child(const char *what)
{
    cudaSetDevice(0);
    long long before = vg_fakecuda_bytes_in_use(0);
    ncclComm_t a = rank_of(0, 2, 0), b = rank_of(1, 2, 0);
    if (!a || !b)
        return 2;
    long long held = vg_fakecuda_bytes_in_use(0) - before;
    uint64_t total = (uint64_t)held / 2;
#ifdef NCCL_SUSPEND_MEM
    if (ncclCommMemStats(a, ncclStatGpuMemTotal, &total) != OK)
        return 3;
#endif
    if (ncclAllReduce(dev_a, dev_a, 16, ncclFloat, ncclSum, a, NULL) != OK)
        return 4;
    if (ncclCommDestroy(a) != OK || ncclCommDestroy(b) != OK || vg_fakecuda_bytes_in_use(0) != before)
        return 5;
    if (strcmp(what, "--knob") == 0)
        return held == (long long)(64 * MiB) && total == 32 * MiB ? 0 : 6;
    return held == 0 ? 0 : 7;
}

static void test_other_configurations(void)
{
    CHECK_EQ(rerun("VG_PHANTOM_NCCL_COMM=32MiB", "--knob"), 0);
    CHECK(rerun("VG_PHANTOM_NCCL_COMM=lots", "--knob 2>/dev/null") >= 128);
    char out[256];
    snprintf(out, sizeof out, "/tmp/vg_test_nccl_%d.txt", (int)getpid());
    char redirect[512];
    snprintf(redirect, sizeof redirect, "--phantom 2>%s", out);
    CHECK_EQ(rerun("VG_FAKECUDA_PHANTOM=1", redirect), 0);
    FILE *f = fopen(out, "r");
    CHECK(f != NULL);
    char text[2048] = {0};
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    unlink(out);
    CHECK(n > 0);
    const char *one = strstr(text, "NCCL is vramguard's stand-in (rank 0 of 2 on device 0)");
    CHECK(one != NULL);
    CHECK(strstr(one + strlen("NCCL is vramguard's stand-in"), "stand-in") == NULL); /* once per process */
}

int main(int argc, char **argv)
{
    /* Before the first CUDA call, which reads them. */
    setenv("VG_FAKECUDA_DEVICES", "2", 1);
    setenv("VG_FAKECUDA_MEM", "1GiB,512MiB", 1);
    cudaSetDevice(1);
    cudaMalloc(&dev_c, 4096);
    cudaSetDevice(0);
    cudaMalloc(&dev_a, 4096);
    cudaMalloc(&dev_b, 4096);
    find_newer();
    if (argc > 1 && strncmp(argv[1], "--", 2) == 0)
        return child(argv[1]);
    static const harness_test tests[] = {
        {"versions_and_errors", test_versions_and_errors},
        {"unique_id", test_unique_id},
        {"init_rank", test_init_rank},
        {"init_all", test_init_all},
        {"split_and_shrink", test_split_and_shrink},
        {"lifecycle", test_lifecycle},
        {"collectives", test_collectives},
        {"groups", test_groups},
        {"redops", test_redops},
        {"memory", test_memory},
        {"stubs", test_stubs},
        {"other_configurations", test_other_configurations},
    };
    return harness_run(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
