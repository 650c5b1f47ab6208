"""`recallm-score`: score a JSONL file of responses with the composite reward, offline.

    recallm-score input=rollouts.jsonl [output=scored.jsonl] [reward.categories.icl.tau=0.9 ...]

Writes one breakdown per input line (same order, atomically: a temporary file of this run's own
renamed at the end, its checksum recorded; a second run writing the same output meanwhile is
refused, and so is an output that is the input; ``output=/dev/null`` discards them, and a FIFO some process reads
is written in place: any other special file is refused) and prints the mean of every component per category. ``ground_truth`` may be a mapping or
its JSON string (the way ``recallm-data`` stores it); a bad line stops the run with one line
naming it and its problem, and the output is not written.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path

from omegaconf import DictConfig

from recallm.cli.common import hydra_command
from recallm.errors import RecallmError, cli_errors
from recallm.io import (
    atomic_path,
    check_in_file,
    check_out_file,
    check_output_unlocked,
    iter_jsonl,
    lock_output,
    record_files,
)

log = logging.getLogger(__name__)


def score_file(input_path: Path, output_path: Path, reward_cfg) -> dict[str, dict[str, float]]:
    """Score every line of ``input_path`` into ``output_path``; return per-category means."""
    from tqdm import tqdm

    from rewards import load_reward_config, score_response
    from rewards.config import as_ground_truth

    config = load_reward_config(reward_cfg)
    if not input_path.is_file():
        raise RecallmError(f"input file {input_path} does not exist")
    _check_distinct(input_path, output_path)
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[str, int] = defaultdict(int)
    # one writer per output file (a second run with the same output= is refused, not interleaved);
    # a temporary name of this run's own, renamed over the output only when every line is scored
    # (output=/dev/null or a FIFO some process reads: written in place, no lock or manifest beside it)
    with lock_output(output_path, "recallm-score"), atomic_path(output_path, sink=True) as tmp, tmp.open("w") as out:
        rows = iter_jsonl(input_path, "input")
        for number, row in tqdm(rows, desc="scoring", unit="resp", disable=None):  # (a bar on a terminal)
            try:
                if not isinstance(row, dict):
                    raise RecallmError(f"expected a JSON object, got {type(row).__name__}")
                # the data stores ground truth as a JSON string (one parquet schema for every category)
                ground_truth = as_ground_truth(row["ground_truth"])
                breakdown = score_response(
                    row["response"],
                    ground_truth,
                    prompt_text=row.get("prompt_text"),
                    n_tokens=row.get("n_tokens"),
                    data_source=row.get("data_source"),
                    config=config,
                )
            except RecursionError:
                raise RecallmError(f"{input_path}:{number}: JSON nested too deeply") from None
            except KeyError as exc:
                raise RecallmError(f"{input_path}:{number}: missing field {exc.args[0]!r}") from exc
            except (RecallmError, ValueError, TypeError) as exc:
                raise RecallmError(f"{input_path}:{number}: {exc}") from exc
            category = str(ground_truth.get("category"))
            values = breakdown.as_dict()
            out.write(json.dumps({"line": number, "category": category, **values}) + "\n")
            counts[category] += 1
            for key, value in values.items():
                sums[category][key] += value
        if not counts:
            raise RecallmError(f"input {input_path} holds no responses (an empty file)")
    record_files(output_path.parent, [output_path.name])  # its checksum, verified where it is read
    return {cat: {k: v / counts[cat] for k, v in vals.items()} | {"count": counts[cat]} for cat, vals in sums.items()}


def _check_distinct(input_path: Path, output_path: Path) -> None:
    if output_path.resolve() == input_path.resolve():
        raise RecallmError(f"output {output_path} is the input file: it would overwrite the rollouts; choose another output")


def _output(cfg) -> Path:
    input_path = Path(str(cfg.input))
    return Path(str(cfg.output)) if cfg.output else input_path.with_name(input_path.stem + ".scored.jsonl")


def check(cfg: DictConfig) -> None:
    """The command's settings, before anything is written (``recallm.cli.common``)."""
    from omegaconf import OmegaConf

    if OmegaConf.is_missing(cfg, "input"):
        raise RecallmError("input=<file.jsonl> is required")
    check_in_file(str(cfg.input), "input", kind="jsonl")
    if cfg.output is not None:
        check_out_file(str(cfg.output), "output", sink=True)  # /dev/null discards the lines (the means print)
    _check_distinct(Path(str(cfg.input)), _output(cfg))
    check_output_unlocked(_output(cfg))


@cli_errors
def run(cfg: DictConfig) -> None:
    from omegaconf import OmegaConf

    if OmegaConf.is_missing(cfg, "input"):  # (a line with Hydra's own flags is not prechecked)
        raise RecallmError("input=<file.jsonl> is required")
    input_path, output_path = Path(str(cfg.input)), _output(cfg)
    means = score_file(input_path, output_path, cfg.reward)
    keys = ("count", "score", "format", "answer", "recall", "recall_overlap", "used_recall", "n_spans")
    print(f"{'category':22}" + "".join(f"{k:>15}" for k in keys))
    for category in sorted(means):
        m = means[category]
        print(f"{category:22}" + "".join(f"{m[k]:>15.4g}" for k in keys))
    print(f"wrote {output_path}")


main = hydra_command("score", run, check=check)


if __name__ == "__main__":
    main()
