"""Silent wrong results in model weights (issue 31): every model directory we write carries the
checksums of its files (``recallm_files.json``) and only finite weights; ``--check`` verifies both
(a truncated, empty or NaN ``model.safetensors`` is one line naming the file or the tensor), a
loader refuses them the same way, and SFT refuses to write a ``final`` whose weights are not finite
(a diverged run, or one started from NaN weights) instead of exiting 0."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from recallm.errors import RecallmError
from recallm.io import MANIFEST_FILE


def _create(monkeypatch, capsys, args: list[str]) -> tuple[object, list[str]]:
    from recallm.cli.create_model import main

    monkeypatch.setattr(sys, "argv", ["recallm-create-model", *args])
    with pytest.raises(SystemExit) as exc:
        sys.exit(main(args))
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return exc.value.code, err


def _nan_weights(model_dir: Path, keep_manifest: bool = False) -> str:
    """Put a NaN into one tensor of ``model_dir`` (a diverged save); returns the tensor's name."""
    from safetensors.torch import load_file, save_file

    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    name = sorted(n for n, t in tensors.items() if t.is_floating_point())[-1]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(path), metadata={"format": "pt"})
    if not keep_manifest:
        (model_dir / MANIFEST_FILE).unlink(missing_ok=True)
    return name


DAMAGE = {
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), r"model\.safetensors"),
    "empty": (lambda p: p.write_bytes(b""), r"model\.safetensors"),
    "garbage": (lambda p: p.write_bytes(b"\x00" * 64), r"model\.safetensors"),
}


@pytest.fixture
def model_copy(tiny_dir, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_dir, tmp_path / "model"))


def test_created_model_carries_a_manifest_and_checks(tiny_dir, monkeypatch, capsys):
    from recallm.io import verify_manifest

    assert verify_manifest(tiny_dir)
    code, err = _create(monkeypatch, capsys, ["--check", str(tiny_dir)])
    assert code == 0 and not err


@pytest.mark.parametrize("keep_manifest", [True, False], ids=["manifest", "no-manifest"])
@pytest.mark.parametrize("case", list(DAMAGE))
def test_check_fails_damaged_weights(model_copy, monkeypatch, capsys, case, keep_manifest):
    damage, pattern = DAMAGE[case]
    damage(model_copy / "model.safetensors")
    if not keep_manifest:
        (model_copy / MANIFEST_FILE).unlink()
    code, err = _create(monkeypatch, capsys, ["--check", str(model_copy)])
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert "Traceback" not in err[0] and __import__("re").search(pattern, err[0]), err


def test_check_fails_nan_weights_naming_the_tensor(model_copy, monkeypatch, capsys):
    name = _nan_weights(model_copy)
    code, err = _create(monkeypatch, capsys, ["--check", str(model_copy)])
    assert code == 2 and len(err) == 1 and name in err[0] and "non-finite" in err[0], err


def test_check_fails_weights_changed_since_save(model_copy, monkeypatch, capsys):
    """Finite, readable, but not what was written: the manifest's CRC-32 finds it."""
    _nan_weights(model_copy, keep_manifest=True)
    code, err = _create(monkeypatch, capsys, ["--check", str(model_copy)])
    assert code == 2 and len(err) == 1 and "model.safetensors changed since it was written" in err[0], err


@pytest.mark.parametrize("case", ["truncated", "empty", "nan"])
def test_loaders_refuse_damaged_weights_in_one_line(model_copy, case):
    from recallm.modeling import load_causal_lm

    if case == "nan":
        name = _nan_weights(model_copy)
        pattern = rf"non-finite values .*tensor {name}"
    else:
        DAMAGE[case][0](model_copy / "model.safetensors")
        (model_copy / MANIFEST_FILE).unlink()  # no checksum to catch it: the loader itself must
        pattern = r"model\.safetensors|cannot load model"
    with pytest.raises(RecallmError, match=pattern) as exc:
        load_causal_lm(model_copy)
    assert "\n" not in str(exc.value)


def test_create_from_a_damaged_base_is_one_line(model_copy, tmp_path, monkeypatch, capsys):
    (model_copy / "model.safetensors").write_bytes(b"")
    code, err = _create(monkeypatch, capsys, ["--base", str(model_copy), "--out", str(tmp_path / "out")])
    assert code == 2 and len(err) == 1 and "model.safetensors has 0 bytes" in err[0], err
    assert not (tmp_path / "out").exists()


def test_tiny_honours_yarn_factor(tmp_path, monkeypatch, capsys):
    code, _ = _create(monkeypatch, capsys, ["--tiny", "--out", str(tmp_path / "m"), "--yarn-factor", "4"])
    assert code == 0
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    rope = config.get("rope_parameters") or config.get("rope_scaling")
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0, rope
    assert config["max_position_embeddings"] == 4 * rope["original_max_position_embeddings"]


@pytest.mark.parametrize("value", ["nan", "inf", "-2", "1", "1e23"])
def test_yarn_factor_out_of_range_is_one_line(tmp_path, monkeypatch, capsys, value):
    code, err = _create(monkeypatch, capsys, ["--tiny", "--out", str(tmp_path / "m"), f"--yarn-factor={value}"])
    assert code == 2 and len(err) == 1 and "--yarn-factor must be a number in (1, 64]" in err[0], err
    assert not (tmp_path / "m").exists()


# ------------------------------------------------------------------------------------------- SFT
def _sft_cfg(tmp_path: Path, data: Path, init: Path) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from recallm.paths import config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(
            "sft",
            overrides=[
                f"train_file={data}",
                "val_file=null",
                f"out_dir={tmp_path / 'run'}",
                f"model.path={init}",
                "stage=full",
                f"init_from={init}",
                "sft.global_batch_size=2",
                "sft.per_device_batch_size=2",
                "sft.save_steps=100",
                "sft.eval.steps=1000",
                "sft.eval.recall_prompts=0",
                "max_steps=2",
            ],
        )
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory, tiny_dir) -> Path:
    from data_gen.generate import run_schedule, schedule_from_config

    root = tmp_path_factory.mktemp("sftdata")
    mix = {
        "seed": 0,
        "train": {
            "lengths": [192, 256],
            "entries": [{"task": "kv_retrieval", "count": 4, "params": {"key_type": "toy", "value_type": "toy"}}],
        },
        "sft": {"count": 4, "val_fraction": 0.0},
    }
    run_schedule(schedule_from_config(mix), root, tiny_dir, workers=1, progress=False)
    return root / "sft" / "train.jsonl"


def test_sft_from_nan_weights_is_refused(model_copy, tmp_path, sft_data):
    from recallm.sft.train import run_sft

    name = _nan_weights(model_copy)
    with pytest.raises(RecallmError, match=rf"non-finite values \(NaN or inf\) in tensor {name}"):
        run_sft(_sft_cfg(tmp_path, sft_data, model_copy))
    assert not (tmp_path / "run" / "full" / "final").exists()


def test_sft_that_diverges_writes_no_final(tiny_dir, tmp_path, sft_data):
    """The weights turn NaN during training (as an exploding update does): no ``final``, one line."""
    import torch
    from transformers import TrainerCallback

    from recallm.sft.train import run_sft

    class Diverge(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            with torch.no_grad():
                model.get_output_embeddings().weight.fill_(float("nan"))

    with pytest.raises(RecallmError, match=r"the model after 2 steps .*diverged.* non-finite values .* tensor \S+"):
        run_sft({**_sft_cfg(tmp_path, sft_data, tiny_dir), "_callbacks": [Diverge()]})
    stage = tmp_path / "run" / "full"
    assert not (stage / "final").exists() and not (stage / ".final.tmp").exists()
