"""A stand-in for the parts of torch that frameworks._time_torch uses on a GPU, so its CUDA-graph
paths run on a CPU: kernels are Python callables that advance a virtual clock by a cost of their
own, a CUDAGraph records the kernels launched while capturing and replays them, events read the
clock. Install it with monkeypatch.setitem(sys.modules, "torch", FakeTorch()).

A kernel's cost may depend on the kernel that ran before it (what programmatic dependent launch
changes on a GPU): kernel(tag, cost) where cost is a number or cost(previous_tag) -> seconds.

A host that queues work late: with late_left = N, the next N spin kernels end before the host
queues what follows them; the first kernel after such a spin starts host_delay seconds late, and
the event recorded right after that spin reports itself done (Event.query()).
"""

import contextlib


class _Stream:
    def wait_stream(self, other):
        pass


class _Event:
    def __init__(self, fake, enable_timing=False):
        self.fake = fake
        self.t = None

    def record(self):
        self.t = self.fake.clock
        self.done = self.fake.late_sample

    def query(self):
        return self.done

    def synchronize(self):
        self.fake.event_waits += 1

    def elapsed_time(self, end):   # milliseconds, as torch's
        return (end.t - self.t) * 1e3


class _Graph:
    def __init__(self, fake):
        self.fake = fake
        self.kernels = []

    def replay(self):
        self.fake.graph_replays += 1
        for k in self.kernels:
            k()


class _Flush:
    def __init__(self, fake, n=0):
        self.fake = fake
        self.n = n

    def numel(self):
        return self.n

    def sum(self):
        self.fake.launch("flush", 0.0)


class _Cuda:
    def __init__(self, fake):
        self.fake = fake

    def is_available(self):
        return True

    def device(self, device):
        return contextlib.nullcontext()

    def stream(self, stream):
        return contextlib.nullcontext()

    def Stream(self):
        return _Stream()

    def current_stream(self):
        return _Stream()

    def synchronize(self):
        pass

    def empty_cache(self):
        pass

    def mem_get_info(self, index=0):
        raise RuntimeError("fake torch: no device memory")

    def _sleep(self, cycles):
        f = self.fake
        f.sleeps.append(cycles)
        f.late_sample = f.delay_due = f.late_left > 0
        f.late_left -= f.late_sample

    def Event(self, enable_timing=False):
        return _Event(self.fake, enable_timing)

    def CUDAGraph(self):
        return _Graph(self.fake)

    @contextlib.contextmanager
    def graph(self, g):
        if self.fake.refuse_capture:
            raise RuntimeError("fake torch: capture refused")
        self.fake.capturing = g
        try:
            yield
        finally:
            self.fake.capturing = None


class FakeTorch:
    """The module: torch.device, torch.empty (the flush buffer), torch.float32, torch.cuda."""
    float32 = "float32"

    def __init__(self):
        self.clock = 0.0          # seconds
        self.previous = None      # tag of the kernel that ran last
        self.capturing = None     # the graph being captured
        self.refuse_capture = False
        self.graph_replays = 0
        self.ran = []             # tags of the kernels run, in order
        self.late_left = 0        # spin kernels still to end before the host queues the next work
        self.late_sample = False  # the last spin ended before the work after it was queued
        self.delay_due = False    # the next kernel starts host_delay late
        self.host_delay = 50e-6
        self.sleeps = []          # the spin kernels' cycles, in order
        self.event_waits = 0      # Event.synchronize() calls
        self.cuda = _Cuda(self)

    def device(self, device):
        return device

    def empty(self, n, dtype=None, device=None):
        return _Flush(self, n)

    def mul(self, a, b, out=None):
        """the kernel that TimingConfig.single_between "mul" queues after each single launch"""
        self.launch("mul", 5e-6)

    def launch(self, tag, cost):
        """Run a kernel now: advance the clock by its cost after the previous kernel (and by the
        host's delay when it is the first after a spin that ended before it was queued)."""
        if self.delay_due and tag != "flush":
            self.clock += self.host_delay
            self.delay_due = False
        self.clock += cost(self.previous) if callable(cost) else cost
        self.previous = tag
        self.ran.append(tag)

    def kernel(self, tag, cost):
        """A zero-argument call that launches one kernel (recorded instead while capturing)."""
        def call():
            if self.capturing is not None:
                self.capturing.kernels.append(lambda: self.launch(tag, cost))
            else:
                self.launch(tag, cost)
        return call
