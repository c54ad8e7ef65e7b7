"""A stand-in for the parts of torch that frameworks._time_torch uses on a GPU, so its CUDA-graph
paths run on a CPU: kernels are Python callables that advance a virtual clock by a cost of their
own, a CUDAGraph records the kernels launched while capturing and replays them, events read the
clock. Install it with monkeypatch.setitem(sys.modules, "torch", FakeTorch()).

A kernel's cost may depend on the kernel that ran before it (what programmatic dependent launch
changes on a GPU): kernel(tag, cost) where cost is a number or cost(previous_tag) -> seconds.

A host that queues work late: with late_left = N, the next N spin kernels end before the host
queues what follows them; the first kernel after such a spin starts host_delay seconds late, and
the event recorded right after that spin reports itself done (Event.query()).

A GPU that catches up with the host: with spin_covers = N, the host queues N samples (flushes)
after a spin kernel without one of its own before the GPU has run everything queued; the next such
sample is then late as above, and every event recorded before it has fired. spins counts the spin
kernels.
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
        self.fake.stamp += 1
        self.stamp = self.fake.stamp

    def query(self):
        return self.done or self.stamp <= self.fake.fired_upto

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
    def __init__(self, fake):
        self.fake = fake

    def sum(self):
        f = self.fake
        if not f.spun and f.lead is not None:     # a sample queued behind the samples before it
            f.lead -= 1
            f.late_sample = f.delay_due = f.lead < 0
            if f.late_sample:
                f.fired_upto = f.stamp
        elif not f.spun:
            f.late_sample = False
        f.spun = False
        f.launch("flush", 0.0)


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
        f.spins += 1
        f.spun = True
        f.lead = f.spin_covers
        f.late_sample = f.delay_due = f.late_left > 0
        f.late_left -= f.late_sample
        if f.late_sample:
            f.fired_upto = f.stamp

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
        self.spin_covers = None   # samples queued without a spin before the GPU catches up (None: never)
        self.lead = None          # of those, still to queue
        self.spun = False         # a spin kernel was queued since the last flush
        self.spins = 0
        self.stamp = 0            # events recorded so far
        self.fired_upto = 0       # events up to this stamp have fired
        self.cuda = _Cuda(self)

    def device(self, device):
        return device

    def empty(self, n, dtype=None, device=None):
        return _Flush(self)

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
