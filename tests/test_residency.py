"""gpu/cuda/residency.py: the fused kernel is refused at start where its grid could not be
resident all at once: a grid over max_cooperative_grid_blocks, a second fused kernel on one
device (in this process or another), a numba-cuda with no cooperative launch. Pure host
logic, checked with stand-ins for compiled kernels: no GPU, no CUDA."""
from __future__ import annotations

import subprocess
import sys

from zerolayer.gpu.cuda import residency


class Compiled:
    """A stand-in for a numba-cuda compiled kernel: its occupancy and its launch flag."""

    def __init__(self, per_sm: int, sms: int = 132):
        self.per_sm, self.sms, self.cooperative = per_sm, sms, False

    def max_cooperative_grid_blocks(self, threads: int) -> int:
        assert threads == 256
        return self.per_sm * self.sms


class NoFlag:
    def max_cooperative_grid_blocks(self, threads: int) -> int:
        return 132


def test_a_grid_over_the_co_resident_limit_is_refused_and_claims_nothing(tmp_path):
    kernels = [Compiled(1), Compiled(0)]  # one variant fits no block at all
    why = residency.reserve(kernels, 132, 256, "GPU-a", str(tmp_path))
    assert isinstance(why, str) and "max_cooperative_grid_blocks 0" in why
    assert not any(k.cooperative for k in kernels)
    why = residency.reserve([Compiled(1, sms=114)], 132, 256, "GPU-a", str(tmp_path))
    assert isinstance(why, str) and "132 blocks is over max_cooperative_grid_blocks 114" in why
    assert list(tmp_path.iterdir()) == []  # nothing claimed


def test_a_fitting_grid_launches_cooperatively_and_claims_the_device(tmp_path):
    kernels = [Compiled(1), Compiled(2)]
    got = residency.reserve(kernels, 132, 256, "GPU-a", str(tmp_path))
    assert isinstance(got, residency.DeviceClaim), got
    assert all(k.cooperative for k in kernels)
    got.release()


def test_a_numba_cuda_without_cooperative_launch_is_refused(tmp_path):
    why = residency.reserve([NoFlag()], 132, 256, "GPU-a", str(tmp_path))
    assert isinstance(why, str) and "no cooperative launch" in why


def test_a_second_fused_kernel_on_one_device_is_refused_until_the_first_goes(tmp_path):
    first = residency.reserve([Compiled(1)], 132, 256, "GPU-a", str(tmp_path))
    assert isinstance(first, residency.DeviceClaim)
    second = residency.reserve([Compiled(1)], 132, 256, "GPU-a", str(tmp_path))
    assert isinstance(second, str) and "another fused step kernel holds device GPU-a" in second
    other = residency.reserve([Compiled(1)], 132, 256, "GPU-b", str(tmp_path))
    assert isinstance(other, residency.DeviceClaim)  # another device is another claim
    first.release()
    again = residency.reserve([Compiled(1)], 132, 256, "GPU-a", str(tmp_path))
    assert isinstance(again, residency.DeviceClaim)
    again.release()
    other.release()


def test_the_claim_holds_against_another_process(tmp_path):
    held = residency.claim_device("GPU-x/1", str(tmp_path))
    assert isinstance(held, residency.DeviceClaim)
    code = ("import sys; from zerolayer.gpu.cuda import residency; "
            "r = residency.claim_device('GPU-x/1', sys.argv[1]); "
            "print('refused' if isinstance(r, str) else 'claimed')")
    run = [sys.executable, "-c", code, str(tmp_path)]
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout.strip() == "refused"
    held.release()
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout.strip() == "claimed"
