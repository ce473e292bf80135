"""One thread: fbgemm's int8 products with weights scaled per tensor or per output feature,
the fixed-scale (row by row) op against the dynamic (per batch) one, at decoding shapes."""
import time, warnings, torch
warnings.simplefilter("ignore")
torch.set_num_threads(1)
torch.manual_seed(0)
Q = torch.ops.quantized

def bench(fn, reps=200):
    for _ in range(20): fn()
    best = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps): fn()
        best.append((time.perf_counter() - t) / reps * 1e6)
    return min(best)

print("rows   in   out | static/chan static/tensor | dynamic/chan dynamic/tensor (us, best of 3)")
for rows, k, n in [(280, 256, 256), (280, 256, 768), (280, 256, 1024), (280, 1024, 256), (280, 256, 8000), (40, 256, 1024)]:
    w = torch.randn(n, k) / k ** 0.5
    x = torch.randn(rows, k); xs = x / x.abs().amax(1, keepdim=True)
    chan = Q.linear_prepack(torch.quantize_per_channel(w, (w.abs().amax(1).double() / 127), torch.zeros(n, dtype=torch.long), 0, torch.qint8), None)
    tens = Q.linear_prepack(torch.quantize_per_tensor(w, float(w.abs().max() / 127), 0, torch.qint8), None)
    with torch.inference_mode():
        r = [bench(lambda: Q.linear_with_input_q_dq_qweight_dq_output_fp32(xs, 1 / 63, 64, p)) for p in (chan, tens)]
        r += [bench(lambda: Q.linear_dynamic(x, p, True)) for p in (chan, tens)]
    print(f"{rows:4d} {k:4d} {n:5d} | {r[0]:10.1f} {r[1]:12.1f} | {r[2]:11.1f} {r[3]:13.1f}")
