"""codegeex-fastertransformer's api.py putting CodeGeeX's weights on the GPU, with
the program's own weights class (--code: its tree at the report's commit):
CODEGEEXWeights built as CODEGEEX builds it, then what CODEGEEX.load ends with,
self.cuda(): every tensor of the class's lists (w, then weight, then scale) made
contiguous and moved to the GPU in list order. load() first reads the checkpoint
on the CPU and reshapes each tensor into the list slot the class made for it, so
the slots' order and shapes are what reaches the GPU; the class's own placeholders
(zeros on the host) stand in for the checkpoint's values. The FasterTransformer op
and the MPI process group CODEGEEX also sets up allocate nothing on the GPU
before that and are not built.

    python codegeex_ft_load.py --code DIR --layer-num 40 --head-num 40 --size-per-head 128 --data-type fp16
"""
import argparse
import sys

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--code", required=True, help="the repository's tree at the report's commit")
    p.add_argument("--layer-num", type=int, default=40)
    p.add_argument("--head-num", type=int, default=40)
    p.add_argument("--size-per-head", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=52224)
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--tensor-para-size", type=int, default=1)
    p.add_argument("--pipeline-para-size", type=int, default=1)
    p.add_argument("--data-type", choices=("fp16", "int8"), default="fp16")
    a = p.parse_args()
    sys.path.insert(0, a.code)
    from examples.pytorch.codegeex.utils.codegeex import CODEGEEXWeights

    weights = CODEGEEXWeights(a.head_num, a.size_per_head, a.layer_num, a.vocab_size, a.max_seq_len,
                              a.tensor_para_size, a.pipeline_para_size, a.data_type)
    torch.cuda.set_device(0)
    weights._map(lambda w: w.contiguous().cuda(0))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
