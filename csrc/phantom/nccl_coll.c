/* NCCL stand-in (README.md, "NCCL"): collectives, point-to-point and
 * reduction operators. Each checks its arguments as the real library does
 * (communicator, data type, operator, root or peer, count) and that every
 * buffer it would read or write lies in device memory of the
 * communicator's device for the extent the call gives it, then completes at
 * once and computes nothing: on a phantom GPU there is no data, and the
 * kernels the real one enqueues on `stream` would be no-ops there too. A
 * sticky error on the device fails them with ncclUnhandledCudaError, as a
 * launch after an illegal address would.
 */
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "core.h"
#include "fakecuda.h"
#include "nccl_fake.h"

enum { NO_ROOT = -1 };

static ncclResult_t check_type(ncclDataType_t type, const char *what)
{
    if ((int)type < 0 || type >= ncclNumTypes)
        return vgnc_fail(ncclInvalidArgument, "%s : invalid type %d", what, (int)type);
    return ncclSuccess;
}

static ncclResult_t check_op(ncclComm_t comm, ncclRedOp_t op, const char *what)
{
    int k = (int)op - (int)ncclNumOps;
    if ((int)op < 0 || (k >= 0 && (k >= comm->redops || k >= (int)sizeof comm->redop_live || !comm->redop_live[k])))
        return vgnc_fail(ncclInvalidArgument, "%s : invalid reduction operation %d", what, (int)op);
    return ncclSuccess;
}

static ncclResult_t check_rank(ncclComm_t comm, int rank, const char *what, const char *name)
{
    if (rank < 0 || rank >= comm->nranks)
        return vgnc_fail(ncclInvalidArgument, "%s : invalid %s %d (nranks %d)", what, name, rank, comm->nranks);
    return ncclSuccess;
}

/* `count` x `times` elements at `buf`, on the communicator's device. */
static ncclResult_t check_buffer(ncclComm_t comm, const void *buf, size_t count, size_t times,
                                 ncclDataType_t type, const char *what, const char *name)
{
    size_t bytes = vgnc_bytes(count, times, type);
    if (bytes == SIZE_MAX)
        return vgnc_fail(ncclInvalidArgument, "%s : count %zu x %zu overflows", what, count, times);
    if (bytes == 0)
        return ncclSuccess;
    if (!buf)
        return vgnc_fail(ncclInvalidArgument, "%s : %s argument is NULL", what, name);
    if (vgfc_mem_check_device(buf, bytes, comm->device) != 0)
        return vgnc_fail(ncclInvalidArgument, "%s : %s %p (%zu bytes) is not device memory of device %d", what,
                         name, buf, bytes, comm->device);
    return ncclSuccess;
}

/* What every collective and point-to-point call checks before its buffers. */
static ncclResult_t check_call(ncclComm_t comm, ncclDataType_t type, const char *what)
{
    ncclResult_t r = vgnc_check_comm(comm, what);
    if (r != ncclSuccess)
        return r;
    if (comm->revoked || comm->finalized)
        return vgnc_fail(ncclInvalidUsage, "%s : the communicator is %s", what,
                         comm->revoked ? "revoked" : "finalized");
    return check_type(type, what);
}

/* The "launch": nothing moves; a sticky error fails it. */
static ncclResult_t launch(ncclComm_t comm, size_t count, const char *what, cudaStream_t stream)
{
    int sticky = vg_fakecuda_sticky_error();
    if (sticky)
        return vgnc_fail(ncclUnhandledCudaError, "%s : Cuda failure %d (a sticky error on the device)", what, sticky);
    vgnc_trace("%s: %zu elements, rank %d of %d, stream %p", what, count, comm->rank, comm->nranks, (void *)stream);
    vgnc_count_collective();
    return ncclSuccess;
}

#define TRY(call)                                                                \
    do {                                                                         \
        ncclResult_t try_ = (call);                                              \
        if (try_ != ncclSuccess)                                                 \
            return try_;                                                         \
    } while (0)

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    const char *what = "AllReduce";
    TRY(check_call(comm, datatype, what));
    TRY(check_op(comm, op, what));
    TRY(check_buffer(comm, sendbuff, count, 1, datatype, what, "sendbuff"));
    TRY(check_buffer(comm, recvbuff, count, 1, datatype, what, "recvbuff"));
    return launch(comm, count, what, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream)
{
    const char *what = "Broadcast";
    TRY(check_call(comm, datatype, what));
    TRY(check_rank(comm, root, what, "root"));
    if (comm->rank == root)
        TRY(check_buffer(comm, sendbuff, count, 1, datatype, what, "sendbuff"));
    TRY(check_buffer(comm, recvbuff, count, 1, datatype, what, "recvbuff"));
    return launch(comm, count, what, stream);
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream)
{
    const char *what = "Bcast";
    TRY(check_call(comm, datatype, what));
    TRY(check_rank(comm, root, what, "root"));
    TRY(check_buffer(comm, buff, count, 1, datatype, what, "buff"));
    return launch(comm, count, what, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    const char *what = "Reduce";
    TRY(check_call(comm, datatype, what));
    TRY(check_op(comm, op, what));
    TRY(check_rank(comm, root, what, "root"));
    TRY(check_buffer(comm, sendbuff, count, 1, datatype, what, "sendbuff"));
    if (comm->rank == root)
        TRY(check_buffer(comm, recvbuff, count, 1, datatype, what, "recvbuff"));
    return launch(comm, count, what, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream)
{
    const char *what = "AllGather";
    TRY(check_call(comm, datatype, what));
    TRY(check_buffer(comm, sendbuff, sendcount, 1, datatype, what, "sendbuff"));
    TRY(check_buffer(comm, recvbuff, sendcount, (size_t)comm->nranks, datatype, what, "recvbuff"));
    return launch(comm, sendcount, what, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    const char *what = "ReduceScatter";
    TRY(check_call(comm, datatype, what));
    TRY(check_op(comm, op, what));
    TRY(check_buffer(comm, sendbuff, recvcount, (size_t)comm->nranks, datatype, what, "sendbuff"));
    TRY(check_buffer(comm, recvbuff, recvcount, 1, datatype, what, "recvbuff"));
    return launch(comm, recvcount, what, stream);
}

ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream)
{
    const char *what = "AlltoAll";
    TRY(check_call(comm, datatype, what));
    TRY(check_buffer(comm, sendbuff, count, (size_t)comm->nranks, datatype, what, "sendbuff"));
    TRY(check_buffer(comm, recvbuff, count, (size_t)comm->nranks, datatype, what, "recvbuff"));
    return launch(comm, count, what, stream);
}

ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream)
{
    const char *what = "Gather";
    TRY(check_call(comm, datatype, what));
    TRY(check_rank(comm, root, what, "root"));
    TRY(check_buffer(comm, sendbuff, count, 1, datatype, what, "sendbuff"));
    if (comm->rank == root)
        TRY(check_buffer(comm, recvbuff, count, (size_t)comm->nranks, datatype, what, "recvbuff"));
    return launch(comm, count, what, stream);
}

ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream)
{
    const char *what = "Scatter";
    TRY(check_call(comm, datatype, what));
    TRY(check_rank(comm, root, what, "root"));
    if (comm->rank == root)
        TRY(check_buffer(comm, sendbuff, count, (size_t)comm->nranks, datatype, what, "sendbuff"));
    TRY(check_buffer(comm, recvbuff, count, 1, datatype, what, "recvbuff"));
    return launch(comm, count, what, stream);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    const char *what = "Send";
    TRY(check_call(comm, datatype, what));
    TRY(check_rank(comm, peer, what, "peer"));
    TRY(check_buffer(comm, sendbuff, count, 1, datatype, what, "sendbuff"));
    return launch(comm, count, what, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    const char *what = "Recv";
    TRY(check_call(comm, datatype, what));
    TRY(check_rank(comm, peer, what, "peer"));
    TRY(check_buffer(comm, recvbuff, count, 1, datatype, what, "recvbuff"));
    return launch(comm, count, what, stream);
}

/* A communicator's own operators: ncclNumOps, ncclNumOps + 1, ... */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm)
{
    const char *what = "ncclRedOpCreatePreMulSum";
    TRY(vgnc_check_comm(comm, what));
    if (!op || !scalar)
        return vgnc_fail(ncclInvalidArgument, "%s : op or scalar argument is NULL", what);
    TRY(check_type(datatype, what));
    if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
        return vgnc_fail(ncclInvalidArgument, "%s : invalid residence %d", what, (int)residence);
    if (residence == ncclScalarDevice && vgfc_mem_check_device(scalar, vgnc_bytes(1, 1, datatype), comm->device))
        return vgnc_fail(ncclInvalidArgument, "%s : scalar %p is not device memory of device %d", what, scalar,
                         comm->device);
    int k = 0;
    while (k < comm->redops && comm->redop_live[k])
        k++;
    if (k >= (int)sizeof comm->redop_live)
        return vgnc_fail(ncclInvalidUsage, "%s : too many reduction operators (%d)", what, k);
    comm->redop_live[k] = 1;
    if (k == comm->redops)
        comm->redops++;
    *op = (ncclRedOp_t)((int)ncclNumOps + k);
    return ncclSuccess;
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    const char *what = "ncclRedOpDestroy";
    if ((int)op >= 0 && (int)op < (int)ncclNumOps)
        return vgnc_fail(ncclInvalidArgument, "%s : operator is a NCCL builtin.", what);
    TRY(vgnc_check_comm(comm, what));
    int k = (int)op - (int)ncclNumOps;
    if (k < 0 || k >= comm->redops || !comm->redop_live[k])
        return vgnc_fail(ncclInvalidArgument, "%s : operator %d was not created by this communicator", what,
                         (int)op);
    comm->redop_live[k] = 0;
    return ncclSuccess;
}
