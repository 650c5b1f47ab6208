"""`recallm-score`: score a JSONL file of responses with the composite reward, offline.

    recallm-score input=rollouts.jsonl [output=scored.jsonl] [reward.categories.icl.tau=0.9 ...]

Writes one breakdown per input line (same order, atomically: a temporary file renamed at the
end) and prints the mean of every component per category. ``ground_truth`` may be a mapping or
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
from recallm.io import check_in_file, check_out_file, replace

log = logging.getLogger(__name__)


def score_file(input_path: Path, output_path: Path, reward_cfg) -> dict[str, dict[str, float]]:
    """Score every line of ``input_path`` into ``output_path``; return per-category means."""
    from tqdm import tqdm

    from rewards import load_reward_config, score_response
    from rewards.config import as_ground_truth

    config = load_reward_config(reward_cfg)
    if not input_path.is_file():
        raise RecallmError(f"input file {input_path} does not exist")
    lines = input_path.read_text().splitlines()
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[str, int] = defaultdict(int)
    tmp = output_path.with_name(output_path.name + ".tmp")
    output_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tmp.open("w") as out:
            for number, line in enumerate(tqdm(lines, desc="scoring", unit="resp", disable=len(lines) < 200), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
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
                except json.JSONDecodeError as exc:
                    raise RecallmError(f"{input_path}:{number}: not valid JSON ({exc.msg})") from exc
                except RecursionError:
                    raise RecallmError(f"{input_path}:{number}: JSON nested too deeply") from None
                except KeyError as exc:
                    raise RecallmError(f"{input_path}:{number}: missing field {exc.args[0]!r}") from exc
                except (RecallmError, ValueError) as exc:
                    raise RecallmError(f"{input_path}:{number}: {exc}") from exc
                category = str(ground_truth.get("category"))
                values = breakdown.as_dict()
                out.write(json.dumps({"line": number, "category": category, **values}) + "\n")
                counts[category] += 1
                for key, value in values.items():
                    sums[category][key] += value
        replace(tmp, output_path)
    finally:
        tmp.unlink(missing_ok=True)
    return {cat: {k: v / counts[cat] for k, v in vals.items()} | {"count": counts[cat]} for cat, vals in sums.items()}


def check(cfg: DictConfig) -> None:
    """The command's settings, before anything is written (``recallm.cli.common``)."""
    from omegaconf import OmegaConf

    if OmegaConf.is_missing(cfg, "input"):
        raise RecallmError("input=<file.jsonl> is required")
    check_in_file(str(cfg.input), "input", kind="jsonl")
    if cfg.output is not None:
        check_out_file(str(cfg.output), "output")


@cli_errors
def run(cfg: DictConfig) -> None:
    from omegaconf import OmegaConf

    if OmegaConf.is_missing(cfg, "input"):  # (a line with Hydra's own flags is not prechecked)
        raise RecallmError("input=<file.jsonl> is required")
    input_path = Path(cfg.input)
    output_path = Path(cfg.output) if cfg.output else input_path.with_name(input_path.stem + ".scored.jsonl")
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
