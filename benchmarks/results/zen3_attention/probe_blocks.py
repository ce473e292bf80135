import torch, sys
torch.set_num_threads(int(sys.argv[1]))
g = torch.Generator().manual_seed(0)
def up(n, m): return -(-n // m) * m
for block in (8, 16, 32, 64):
    bad = tot = 0
    for D in (16, 32, 64, 128):
        for own in list(range(1, 40, 3)) + [44, 63, 64, 65, 100, 127, 130]:
            for extra in (1, 7, 20, 64, 150):
                padded = own + extra
                A, Bn = up(own, block), up(padded, block)
                q = torch.randn(2, 3, 4, D, generator=g)
                k, v = (torch.randn(2, 3, Bn, D, generator=g) for _ in range(2))
                ma = torch.zeros(A, dtype=torch.bool); ma[:own] = True
                mb = torch.zeros(Bn, dtype=torch.bool); mb[:own] = True
                with torch.no_grad():
                    def att(k, v, m):
                        s = (q * D ** -0.5) @ k.transpose(-1, -2)
                        return s.masked_fill(~m, float("-inf")).softmax(-1) @ v
                    a = att(k[:, :, :A], v[:, :, :A], ma); b = att(k, v, mb)
                tot += 1; bad += not torch.equal(a, b)
                if not torch.equal(a, b) and block == 64: print("  ", D, own, padded, A, Bn, (a-b).abs().max().item())
    print("block", block, "differing", bad, "of", tot, flush=True)
