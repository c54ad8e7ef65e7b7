"""Checked by `mypy --strict` in CI (.ci/stubtest), never run: the stubs give the result types
the README promises."""
import numpy as np
import numpy.typing as npt

import ewkern

x = np.ones(8, np.float32)
a: npt.NDArray[np.float32] = np.zeros(8, np.float32)
r1: npt.NDArray[np.float64] = ewkern.add(x, x)            # numpy in, numpy out
arr: ewkern.Array = ewkern.asarray(x, device="cpu")
r2: ewkern.Array = ewkern.mul_const(arr, 2.0)               # Array in, Array out
r3: ewkern.Array = ewkern.add(x, x, out=arr)                # out= comes back
r4: npt.NDArray[np.float32] = ewkern.axpby(x, x, 2.0, 3.0, out=a)
r5: ewkern.Array = ewkern.fill(arr, 1.0)
r6: npt.NDArray[np.float64] = ewkern.rmse(x.reshape(2, 4), x.reshape(2, 4), axis=1)
shape: tuple[int, ...] = arr.shape
names: list[str] = ewkern.variants("add", device="cpu")
plan: ewkern.Plan = ewkern._C.prepare(ewkern.add, arr, arr)
times: list[float] = ewkern._C.time_plans([plan], samples=3)
info: dict[str, object] = ewkern.device_info("cpu")
s: ewkern.Stream | None = ewkern.current_stream()
with ewkern.stream(None):
    pass
