"""GRPO of the RLM root through verl's multi-turn agent loop (issue 17, item 12): the agent loop
driven by a scripted LLM server (its masks, log-probs, sub-calls and reward), the launcher's data
and wiring, and (slow) two real ``verl.trainer.main_ppo`` steps of the tiny model on this CPU with
a checkpoint, then a resumed third step."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recallm.errors import RecallmError
from tests import REPO_ROOT
from tests.grpo_runs import step_metrics
from tests.rlm_helpers import isolation_override

ROOMY = ("data.max_response_length=1024", "recallm.rlm.rlm.root_max_new_tokens=200")
REPLIES = [
    "```repl\nr = llm_query('what is the number?')\nprint('GOT', r)\n```",
    "<think>\nthe sub-model found it</think>FINAL_VAR(r)",
]


def compose(tmp_path, tiny_dir, *overrides):
    from recallm.grpo.app import compose as compose_grpo

    return compose_grpo(
        [
            f"recallm.rlm.out_dir={tmp_path / 'out'}",
            f"actor_rollout_ref.model.path={tiny_dir}",
            isolation_override("recallm.rlm.rlm.isolation"),
            *overrides,
        ],
        config_name="rlm_train",
    )


class ScriptedServer:
    """verl's LLM server client, scripted: root turns get ``REPLIES`` in order, sub-calls (request
    ids ``rlm-sub-...``) get the number. Records every request."""

    def __init__(self, tokenizer, replies, sub_answer="4242"):
        self.tokenizer, self.replies, self.sub_answer = tokenizer, list(replies), sub_answer
        self.requests: list[tuple[str, list[int], dict]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.requests.append((request_id, list(prompt_ids), dict(sampling_params)))
        if request_id.startswith("rlm-sub-"):
            text = self.sub_answer
        else:
            text = self.replies.pop(0) if self.replies else "still thinking"
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][: sampling_params.get("max_tokens", 1 << 20)]
        if len(ids) < sampling_params.get("max_tokens", 1 << 20):
            ids = ids + [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))


def _run(cfg, server, tokenizer, sampling, kwargs):
    """Build the agent loop inside the event loop (as verl's worker does) and run one rollout."""

    async def go():
        return await _agent_loop(cfg, server, tokenizer).run(sampling, **kwargs)

    return asyncio.run(go())


def _agent_loop(cfg, server, tokenizer):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from recallm.rlm.agent_loop import RLMAgentLoop

    return RLMAgentLoop(
        trainer_config=DictConfigWrap(cfg),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data),
    )


def _row_kwargs(context, query, reference, task="s_niah"):
    return {
        "raw_prompt": [],
        "extra_info": {
            "rlm": {
                "task": task,
                "task_id": f"{task}/test/0",
                "query": query,
                "context_json": json.dumps(context),
                "reference_json": json.dumps(reference),
            }
        },
    }


def test_the_agent_loop_trains_on_the_root_and_masks_the_repl(tmp_path, tiny_dir):
    """Two root turns (code with a sub-call, then FINAL_VAR): the root's tokens are trained with
    their rollout log-probs, the observation between them is masked (and verl's policy loss has no
    gradient there), the sub-call went to the server but is in no trajectory, and the reward is
    the task's score."""
    from recallm.tokens import load_tokenizer

    tokenizer = load_tokenizer(tiny_dir)
    cfg = compose(tmp_path, tiny_dir, f"recallm.rlm.trajectory_dir={tmp_path / 'traj'}", *ROOMY)
    server = ScriptedServer(tokenizer, REPLIES)
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    kwargs = _row_kwargs("the magic number is hidden here", "What is the magic number?", {"value": "4242"})
    out = _run(cfg, server, tokenizer, sampling, kwargs)

    assert out.reward_score == 1.0 and out.extra_fields["rlm_outcome"] == "final"
    mask, response = out.response_mask, out.response_ids
    assert len(mask) == len(response) == len(out.response_logprobs)
    # segments of the mask: root turn 1 (1s), the REPL observation (0s), root turn 2 (1s)
    runs = [(mask[0], 1)]
    for m in mask[1:]:
        runs[-1] = (runs[-1][0], runs[-1][1] + 1) if m == runs[-1][0] else runs.append((m, 1)) or runs[-1]
    assert [m for m, _ in runs] == [1, 0, 1]
    first, observed = runs[0][1], runs[1][1]
    assert tokenizer.decode(response[:first]).startswith("```repl\nr = llm_query(")
    observation = tokenizer.decode(response[first : first + observed])
    assert "GOT 4242" in observation and "What is the magic number?" in observation  # output + the reminder
    assert all(lp == -0.5 for lp, m in zip(out.response_logprobs, mask, strict=True) if m)
    assert all(lp == 0.0 for lp, m in zip(out.response_logprobs, mask, strict=True) if not m)
    roots = [r for r in server.requests if not r[0].startswith("rlm-sub-")]
    subs = [r for r in server.requests if r[0].startswith("rlm-sub-")]
    assert len(roots) == 2 and len(subs) == 1
    assert roots[1][1] == out.prompt_ids + response[: first + observed]  # turn 2 read turn 1 and the observation
    sub_prompt = tokenizer.decode(subs[0][1])
    assert "what is the number?" in sub_prompt and sub_prompt not in tokenizer.decode(response)
    extra = out.extra_fields["reward_extra_info"]
    assert extra["rlm_masked_tokens"] == observed and extra["rlm_subcalls"] == 1 and extra["rlm_correct"] == 1.0
    trajectories = list((tmp_path / "traj").glob("*.jsonl"))
    assert len(trajectories) == 1 and '"event": "subcall"' in trajectories[0].read_text()
    _loss_ignores_the_masked_tokens(cfg, out)


def _loss_ignores_the_masked_tokens(cfg, out) -> None:
    """The mask the agent loop writes is the one verl's policy loss aggregates with: the gradient
    of the loss is zero on every masked (REPL) token and not on the root's own."""
    import torch
    from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn
    from verl.utils.config import omega_conf_to_dataclass

    mask = torch.tensor([out.response_mask], dtype=torch.float32)
    old = torch.tensor([out.response_logprobs])
    log_prob = (old + 0.1).clone().requires_grad_(True)
    loss_fn = get_policy_loss_fn(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)
    actor_cfg = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    pg_loss, *_ = loss_fn(old_log_prob=old, log_prob=log_prob, advantages=torch.ones_like(old), response_mask=mask,
                          loss_agg_mode="token-mean", config=actor_cfg)  # fmt: skip
    if isinstance(pg_loss, dict):
        pg_loss = pg_loss["pg_loss"]
    pg_loss.backward()
    grad = log_prob.grad[0]
    hidden = mask[0] == 0
    assert hidden.any() and torch.all(grad[hidden] == 0) and torch.all(grad[~hidden] != 0)
    assert agg_loss(loss_mat=torch.ones_like(old), loss_mask=mask, loss_agg_mode="token-mean") == 1


def test_a_rollout_out_of_response_length_is_scored_on_its_stored_answer(tmp_path, tiny_dir):
    from recallm.tokens import load_tokenizer

    tokenizer = load_tokenizer(tiny_dir)
    cfg = compose(tmp_path, tiny_dir, "data.max_response_length=40", "recallm.rlm.rlm.root_max_new_tokens=30")
    replies = ["```repl\nanswer = '4242'\nprint(len(context))\n```"] + ["```repl\nx = 1\n```"] * 5
    out = _run(cfg, ScriptedServer(tokenizer, replies), tokenizer, {"temperature": 1.0, "logprobs": True},
               _row_kwargs("c", "q?", {"value": "4242"}))  # fmt: skip
    assert len(out.response_ids) == 40 and out.extra_fields["rlm_outcome"] == "budget_exhausted"
    assert out.reward_score == 1.0  # the stored `answer` was scored


def test_the_launcher_writes_the_data_and_wires_verl(tmp_path, tiny_dir, tiny_base_dir):
    import pyarrow.parquet as pq

    from recallm.rlm.train import AGENT_LOOPS, prepare, prepare_data

    cfg = compose(tmp_path, tiny_dir, "recallm.rlm.data.train.per_cell=2")
    paths = prepare_data(cfg)
    env = prepare(cfg)
    rows = pq.read_table(paths["train"]).to_pylist()
    assert [r["extra_info"]["rlm"]["task"] for r in rows] == ["s_niah", "s_niah", "mrcr", "mrcr"]
    row = rows[2]
    assert row["agent_name"] == "rlm" and row["prompt"][0]["role"] == "system"
    assert json.loads(row["extra_info"]["rlm"]["context_json"])[0]["role"] == "user"  # a conversation
    assert json.loads(row["reward_model"]["ground_truth"])["kind"] == "mrcr"
    assert cfg.data.train_files == paths["train"] and cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "rlm"
    registry = Path(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    from omegaconf import OmegaConf

    assert OmegaConf.to_container(OmegaConf.load(registry)) == AGENT_LOOPS
    modules = env["VERL_USE_EXTERNAL_MODULES"].split(",")
    assert modules[0] == "recallm.grpo.cpu.plugin" and "recallm.rlm.worker_hooks" in modules
    assert cfg.actor_rollout_ref.model.external_lib == "recallm.modeling"  # a RecaLLM model: masked log-probs
    assert cfg.recallm.reward_manager is False

    import copy

    def variant(base, **updates):
        out = copy.deepcopy(base)
        for key, value in updates.items():
            OmegaConf.update(out, key, value, force_add=True)
        return out

    fresh = compose(tmp_path, tiny_dir)
    with pytest.raises(RecallmError, match="more than data.max_prompt_length=100"):
        prepare_data(variant(fresh, **{"data.max_prompt_length": 100}))
    with pytest.raises(RecallmError, match="recallm.rlm.rlm.max_depth must be in"):
        prepare_data(variant(fresh, **{"recallm.rlm.rlm.max_depth": 7}))
    with pytest.raises(RecallmError, match="plain model without recall tokens: set recallm.recall_constrained=false"):
        prepare(variant(fresh, **{"actor_rollout_ref.model.path": str(tiny_base_dir)}))
    plain = variant(fresh, **{"actor_rollout_ref.model.path": str(tiny_base_dir), "recallm.recall_constrained": False})
    env = prepare(plain)
    assert "recallm.rlm.worker_hooks" in env["VERL_USE_EXTERNAL_MODULES"] and not plain.actor_rollout_ref.model.external_lib


def test_rlm_training_takes_every_platform_and_guard_of_grpos_launch(tmp_path, tiny_dir):
    """One launch: the vLLM-on-CPU platform and grpo's checks apply to recallm-rlm train as to recallm-grpo."""
    from recallm.grpo.app import problems
    from recallm.rlm.train import prepare

    cfg = compose(tmp_path, tiny_dir, "grpo/platform=vllm_cpu", "data.train_files=x.parquet")
    env = prepare(cfg)
    r = cfg.actor_rollout_ref.rollout
    assert r.name == "vllm" and r.enable_sleep_mode is False and r.dtype == "float32"
    assert (
        env["RECALLM_VLLM_CPU"] == "1"
        and "recallm.recall.vllm:RecallLogitsProcessorV1" in r.engine_kwargs.vllm.logits_processors
    )
    assert cfg.actor_rollout_ref.model.override_config.recall_constrained is True
    cfg = compose(tmp_path, tiny_dir, "data.train_files=x.parquet", "actor_rollout_ref.rollout.name=vllm")
    prepare(cfg)
    assert any("on the cpu platform, whose rollout is hf_cpu: use grpo/platform=vllm_cpu" in p for p in problems(cfg))


def test_the_command_composes_once(tmp_path, tiny_dir, monkeypatch, capsys):
    """``recallm-rlm train --print-config``: one Hydra composition, then grpo's launch (prepare, check)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from recallm.cli.rlm import main

    calls = []
    original = ConfigLoaderImpl.load_configuration

    def counted(self, *args, **kwargs):
        calls.append(kwargs.get("config_name", args[0] if args else None))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", counted)
    main(["train", f"recallm.rlm.out_dir={tmp_path / 'out'}", f"actor_rollout_ref.model.path={tiny_dir}",
          "--print-config"])  # fmt: skip
    assert calls == ["rlm_train"]
    assert "default_agent_loop: rlm" in capsys.readouterr().out


def test_the_paper_recipe_composes(tmp_path, tiny_dir):
    cfg = compose(tmp_path, tiny_dir, "rlm_train=mrcr_qwen3_4b")
    arr, rlm = cfg.actor_rollout_ref, cfg.recallm.rlm
    assert (cfg.data.train_batch_size, arr.rollout.n, rlm.rlm.root_max_new_tokens, rlm.rlm.max_iterations) == (
        128,
        4,
        4096,
        20,
    )
    assert cfg.trainer.total_training_steps == 150 and cfg.trainer.test_freq == 50 and cfg.trainer.val_before_train
    assert list(rlm.data.train.lengths) == ["32K", "64K"] and rlm.data.train.needles == 2
    assert list(rlm.data.val.lengths) == ["512K", "1M"] and rlm.data.val.needles == 8
    assert arr.rollout.name == "vllm" and cfg.recallm.platform == "gpu" and not cfg.recallm.recall_constrained


# --- two real GRPO steps on this CPU, then a resumed third ---------------------------------------------


def _train(args: list[str], cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    import signal

    from recallm.grpo.cpu import cpu_env

    env = {**os.environ, **cpu_env(), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-c", "import sys; from recallm.cli.rlm import main; sys.argv[0] = 'recallm-rlm'; main()",
           "train", *args]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"verl did not finish in {timeout}s:\n{out[-6000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


@pytest.mark.slow
@pytest.mark.heavy
def test_two_grpo_steps_of_the_tiny_root_on_cpu_then_resume(tmp_path, tiny_dir):
    ckpt, rollouts = tmp_path / "ckpt", tmp_path / "rollouts"
    common = [
        f"actor_rollout_ref.model.path={tiny_dir}",
        f"recallm.rlm.out_dir={tmp_path / 'out'}",
        f"recallm.rlm.trajectory_dir={tmp_path / 'traj'}",
        isolation_override("recallm.rlm.rlm.isolation"),
        f"trainer.default_local_dir={ckpt}",
        f"trainer.rollout_data_dir={rollouts}",
        "trainer.project_name=recallm_test",
        "recallm.console=full",  # verl's step lines on stdout (step_metrics reads them)
    ]
    first = _train(common, tmp_path)
    assert first.returncode == 0, first.stdout[-8000:]
    metrics = step_metrics(first.stdout)
    assert sorted(metrics) == [1, 2], first.stdout[-4000:]
    for m in metrics.values():
        assert m["rlm/response_tokens/trained"] > 0 and m["rlm/response_tokens/masked"] > 0  # REPL output masked
        assert m["rlm/turns"] >= 1
    assert (ckpt / "global_step_2" / "actor").is_dir()
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    trajectories = list((tmp_path / "traj").glob("*.jsonl"))
    assert len(trajectories) == 4  # 2 steps x 1 prompt x 2 rollouts, each a root trajectory with its REPL
    dumped = [json.loads(line) for line in (rollouts / "1.jsonl").read_text().splitlines()]
    assert len(dumped) == 2 and all("Your REPL variables are kept" in row["output"] or "nothing printed" in
                                    row["output"] or "neither a ```repl" in row["output"] for row in dumped)  # fmt: skip

    resumed = _train([*common, "trainer.total_training_steps=3"], tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-8000:]
    assert sorted(step_metrics(resumed.stdout)) == [3]  # steps 1-2 were restored, not redone
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"


def test_the_slurm_file_launches_recallm_rlm_train():
    slurm = REPO_ROOT / "slurm" / "rlm_train.sbatch"
    env = {**os.environ, "RECALLM_DRY_RUN": "1", "SLURM_GPUS_ON_NODE": "8", "RECALLM_REPO": str(slurm.parents[1])}
    out = subprocess.run(
        ["bash", str(slurm), "rlm_train=mrcr_qwen3_4b"], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0].endswith("recallm-rlm") and out[1:] == [
        "train",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=8",
        "trainer.resume_mode=auto",
        "rlm_train=mrcr_qwen3_4b",
    ]
