"""Quick GPU check of rmse auto on the small-batch shapes (bandwidth, rotate, CUDA graph)."""
import math, statistics
import numpy as np
import ewkern as ek
L2 = ek.device_info()["l2_bytes"]
print("| shape | GB/s | max rel err |\n| --- | --- | --- |")
for shape in [(65536, 64), (4096, 1024), (1024, 4096), (16384, 256), (16, 1 << 20)]:
    nbytes = 8 * math.prod(shape)
    sets = max(2, math.ceil(4 * L2 / nbytes))
    rng = np.random.default_rng(0)
    a0, b0 = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    A = [ek.asarray(a0, device="cuda:0") for _ in range(sets)]
    B = [ek.asarray(b0, device="cuda:0") for _ in range(sets)]
    want = np.sqrt(np.mean((a0.astype(np.float64) - b0) ** 2, axis=1))
    err = float(np.max(np.abs(ek.rmse(A[0], B[0]).numpy() - want) / want))
    t = ek._C.time_plans([ek._C.prepare(ek.rmse, A[i], B[i]) for i in range(sets)], launches=20 * sets, samples=15)
    print(f"| {shape[0]}x{shape[1]} | {nbytes / statistics.median(t) / 1e9:.0f} | {err:.1e} |", flush=True)
