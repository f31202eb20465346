"""The program the remedies are checked on, card against phantom
(tests/gpu/remedies_on_card.py): a small GPT in plain PyTorch, fp32,
foreach AdamW, its blocks in a ModuleList (the tier's test program).

    python tests/gpu/remedy_program.py 16      # batch 16
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 8, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, seq):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main():
    batch, seq, d, layers, vocab = int(sys.argv[1]), 512, 512, 8, 16384
    torch.manual_seed(0)
    model = GPT(vocab, d, layers, seq).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        idx = torch.randint(0, vocab, (batch, seq), device="cuda")
        F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
