"""The host probes' loop timing (scripts/host_step_probe.py, scripts/rmsnorm_host_probe.py)."""
import time


def loop_us(f, sync, warm=100, rounds=9, calls=200):
    """Per round, the mean host time of a call in a loop of `calls` calls with no synchronize inside
    (where the device keeps up: the host's cost), in us, after `warm` calls; sync() between rounds."""
    for _ in range(warm):
        f()
    sync()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        t1 = time.perf_counter()
        sync()
        out.append((t1 - t0) / calls * 1e6)
    return out
