"""SFT's DeepSpeed files are generated from one source and differ only in the device's keys."""

from __future__ import annotations

import json

from recallm.paths import CONFIG_DIR
from recallm.sft.deepspeed_config import DEVICE_KEYS, FILES, render, zero2


def _leaves(tree, prefix=()):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _leaves(value, (*prefix, key))
    else:
        yield prefix, tree


def test_the_committed_files_are_what_the_source_generates():
    for name, device in FILES.items():
        text = (CONFIG_DIR / "deepspeed" / name).read_text()
        assert text == render(device), f"configs/deepspeed/{name}: run python -m recallm.sft.deepspeed_config"


def test_gpu_and_cpu_differ_only_in_the_device_keys():
    gpu, cpu = dict(_leaves(zero2("gpu"))), dict(_leaves(zero2("cpu")))
    assert gpu.keys() == cpu.keys()
    differ = {key for key in gpu if gpu[key] != cpu[key]}
    assert differ == set(DEVICE_KEYS)
    # the structure the CPU tests exercise: the optimizer offloaded to the host with DeepSpeed's CPU Adam
    for config in (zero2("gpu"), zero2("cpu")):
        assert config["zero_optimization"]["stage"] == 2
        assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
        assert config["optimizer"]["type"] == "AdamW"
    assert json.loads((CONFIG_DIR / "deepspeed" / "zero2.json").read_text())["zero_optimization"]["overlap_comm"]
