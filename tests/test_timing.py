"""How decoding is timed (core.timing): the clock waits for the device the model is on."""

import torch

from specviz.core.timing import Clock


def test_the_clock_waits_for_the_models_own_gpu(monkeypatch):
    # `--device cuda:1` must time cuda:1's queue: a bare torch.cuda.synchronize() waits for the
    # current device (cuda:0), which returns while cuda:1 is still computing.
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    clock = Clock(torch.device("cuda", 1))
    clock()
    assert waited == [torch.device("cuda", 1)]
    assert clock.name == "wall clock, device-synchronised"

