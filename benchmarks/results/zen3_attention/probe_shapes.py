import torch
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
for D in (16, 64):
  for own, padded in ((5, 9), (5, 8), (8, 16), (23, 70), (44, 65), (60, 200), (64, 128), (44, 64)):
    q = torch.randn(3, 4, 2, D, generator=g)
    k, v = (torch.randn(3, 4, padded, D, generator=g) for _ in range(2))
    with torch.no_grad():
        sa = q @ k[:, :, :own].transpose(-1, -2); sb = q @ k.transpose(-1, -2)
        s_eq = torch.equal(sa, sb[..., :own])
        m = torch.zeros(padded, dtype=torch.bool); m[:own] = True
        pa = sa.softmax(-1); pb = sb.masked_fill(~m, float("-inf")).softmax(-1)
        p_eq = torch.equal(pa, pb[..., :own])
        pb2 = sa.new_zeros(sb.shape); pb2[..., :own] = pa  # same probs, padded with zeros
        oa = pa @ v[:, :, :own]; ob = pb2 @ v
        print(D, own, padded, "scores", s_eq, "probs", p_eq, "P@V", torch.equal(oa, ob))
