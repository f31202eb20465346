"""meta-llama/llama's reference code building its Transformer on the GPU, as
example.py (LLaMA 1, e6145a0) and llama/generation.py's Llama.build (Llama 2,
3805003) do: the checkpoint torch.load'ed to the CPU (none here: the weights are
never read on a phantom), the default tensor type set to torch.cuda.HalfTensor,
Transformer(model_args) built, in llama/model.py's order: the token embedding,
then per layer wq, wk, wv, wo, the KV caches zeros(max_batch_size, max_seq_len,
n_local_kv_heads, head_dim), w1, w2, w3 and two RMSNorms, then the final norm,
the output projection and freqs_cis. fairscale's parallel layers at model
parallel size 1 allocate one (out, in) weight each and initialise it in place
(init_method = identity), which nn.Parameter(torch.empty(...)) does here. At a
model parallel size N > 1 (--model-parallel, one process per checkpoint shard)
each rank holds its slice (column-parallel wq, wk, wv, w1, w3 and output: out/N
rows; row-parallel wo and w2: in/N columns; the embedding: dim/N columns; the
caches: n_heads/N heads), and fairscale's _initialize_affine_weight builds every
slice from a full-size master weight it makes with torch.empty under the default
tensor type (so on the GPU), copies its slice out of, and drops: those
temporaries are made here too. Only rank 0's allocations are made: every rank
allocates the same.
Then, at model parallel size 1, a prompt of --prompt-len tokens through the
model; at N > 1 the run ends after the build with an error that says so (a
rank's forward needs the all-gathers between the ranks, not rebuilt).

    python llama_reference.py --dim 4096 --n-layers 32 --n-heads 32 --max-seq-len 128 --max-batch-size 4
"""
import argparse

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


MODEL_PARALLEL = 1


def weight(out_features, in_features, split=0):
    """A parallel layer's slice on this rank: split 0 cuts the output rows (column
    parallel), split 1 the input columns (row parallel, and the embedding's dim)."""
    n = MODEL_PARALLEL
    if (out_features, in_features)[split] % n:
        raise SystemExit(f"llama_reference.py: {(out_features, in_features)[split]} does not divide by "
                         f"--model-parallel {n} (fairscale asserts it too)")
    shape = (out_features // n, in_features) if split == 0 else (out_features, in_features // n)
    param = nn.Parameter(torch.empty(*shape))
    if n > 1:  # fairscale's master weight, on the default tensor type's device, then dropped
        master = torch.empty(out_features, in_features, dtype=param.dtype, requires_grad=False)
        with torch.no_grad():
            param.copy_(master.narrow(split, 0, shape[split]))
        del master
    return param


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.head_dim = a.dim // a.n_heads
        n_kv = a.n_kv_heads or a.n_heads
        self.wq = weight(a.n_heads * self.head_dim, a.dim)
        self.wk = weight(n_kv * self.head_dim, a.dim)
        self.wv = weight(n_kv * self.head_dim, a.dim)
        self.wo = weight(a.dim, a.n_heads * self.head_dim, split=1)
        self.n_heads, self.n_kv = a.n_heads // MODEL_PARALLEL, n_kv // MODEL_PARALLEL
        self.cache_k = torch.zeros((a.max_batch_size, a.max_seq_len, self.n_kv, self.head_dim)).cuda()
        self.cache_v = torch.zeros((a.max_batch_size, a.max_seq_len, self.n_kv, self.head_dim)).cuda()
        hidden = int(2 * 4 * a.dim / 3)
        if a.ffn_dim_multiplier is not None:
            hidden = int(a.ffn_dim_multiplier * hidden)
        hidden = a.multiple_of * ((hidden + a.multiple_of - 1) // a.multiple_of)
        self.w1 = weight(hidden, a.dim)
        self.w2 = weight(a.dim, hidden, split=1)
        self.w3 = weight(hidden, a.dim)
        self.attention_norm = RMSNorm(a.dim, a.norm_eps)
        self.ffn_norm = RMSNorm(a.dim, a.norm_eps)

    def forward(self, x, start_pos):
        b, s, _ = x.shape
        h = self.attention_norm(x)
        q = (h @ self.wq.t()).view(b, s, self.n_heads, self.head_dim)
        k = (h @ self.wk.t()).view(b, s, self.n_kv, self.head_dim)
        v = (h @ self.wv.t()).view(b, s, self.n_kv, self.head_dim)
        self.cache_k[:b, start_pos:start_pos + s] = k
        self.cache_v[:b, start_pos:start_pos + s] = v
        keys = self.cache_k[:b, :start_pos + s].repeat_interleave(self.n_heads // self.n_kv, 2)
        values = self.cache_v[:b, :start_pos + s].repeat_interleave(self.n_heads // self.n_kv, 2)
        scores = torch.matmul(q.transpose(1, 2), keys.permute(0, 2, 3, 1)) / self.head_dim ** 0.5
        scores = torch.softmax(scores.float(), dim=-1).type_as(q)
        out = torch.matmul(scores, values.transpose(1, 2)).transpose(1, 2).reshape(b, s, -1)
        x = x + out @ self.wo.t()
        h = self.ffn_norm(x)
        return x + (torch.nn.functional.silu(h @ self.w1.t()) * (h @ self.w3.t())) @ self.w2.t()


class Transformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok_embeddings = weight(a.vocab_size, a.dim, split=1)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.n_layers))
        self.norm = RMSNorm(a.dim, a.norm_eps)
        self.output = weight(a.vocab_size, a.dim)
        head_dim = a.dim // a.n_heads
        freqs = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
        t = torch.arange(a.max_seq_len * 2, device=freqs.device)
        freqs = torch.outer(t, freqs).float()
        self.freqs_cis = torch.polar(torch.ones_like(freqs), freqs)

    @torch.inference_mode()
    def forward(self, tokens, start_pos):
        h = self.tok_embeddings[tokens]
        for layer in self.layers:
            h = layer(h, start_pos)
        return (self.norm(h)[:, -1, :] @ self.output.t()).float()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--n-layers", type=int, default=32)
    p.add_argument("--n-heads", type=int, default=32)
    p.add_argument("--n-kv-heads", type=int, default=None)
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--multiple-of", type=int, default=256)
    p.add_argument("--ffn-dim-multiplier", type=float, default=None)
    p.add_argument("--norm-eps", type=float, default=1e-6)
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument("--model-parallel", type=int, default=1, help="processes (checkpoint shards); rank 0 is built")
    a = p.parse_args()
    global MODEL_PARALLEL
    MODEL_PARALLEL = a.model_parallel
    torch.cuda.set_device(0)
    torch.set_default_tensor_type(torch.cuda.HalfTensor)
    model = Transformer(a)
    torch.set_default_tensor_type(torch.FloatTensor)
    if MODEL_PARALLEL > 1:
        raise SystemExit("llama_reference.py: built; a prompt through a model-parallel rank is not rebuilt "
                         "(its all-gathers between the ranks)")
    tokens = torch.randint(0, a.vocab_size, (a.max_batch_size, a.prompt_len), device="cuda")
    model(tokens, 0)


if __name__ == "__main__":
    main()
