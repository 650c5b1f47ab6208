"""The RL toolbox's pieces that run without Ray: GSPO's sequence ratio and verl's loss aggregations on
masked log-probs computed by hand; DAPO's dynamic sampling (the group selection, the shared data loader,
the filter-and-refill of a real ``DataProto`` through a stand-in rollout); the training-health monitor."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch

from recallm.grpo import dynamic_sampling as ds
from recallm.grpo.health import (
    HealthMonitor,
    Unhealthy,
    exhausted_resume,
    summary_part,
    unhealthy_by,
    warning_text,
)
from recallm.grpo.settings import HealthSettings
from recallm.recall.mask import allowed_positions, apply_recall_mask

START, END = 5, 6
V = 8
PROMPT = [1, 2, 3, 1, 4]
# response 1: a token, a span "1 2" closed by END, a token; response 2: a span "1 4" whose context ends there
RESPONSES = [[7, START, 1, 2, END, 0], [START, 1, 4, END, 0, 0]]
VALID = [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]
# the allowed set of each response token, by hand (None: outside a span, no mask). The searchable context is the
# prompt plus what was generated before the span's start token; inside a span, the tokens that continue an
# occurrence of the span so far in it, plus END
ALLOWED = [
    [None, None, {1, 2, 3, 4, 7, END}, {2, 4, END}, {3, END}, None],
    [None, {1, 2, 3, 4, END}, {2, 4, END}, {END}, None, None],
]


def _logits(seed: int, noise: float = 0.0, base=None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, len(PROMPT) + 6, V, generator=g) * 2.0
    return logits if base is None else base + noise * logits


def _by_hand(logits: torch.Tensor, masked: bool) -> np.ndarray:
    """Each response token's log-prob, the renormalisation over its allowed set written out."""
    out = np.zeros((2, 6))
    for b, response in enumerate(RESPONSES):
        for j, token in enumerate(response):
            row = logits[b, len(PROMPT) + j - 1].double().numpy()  # the logits that predict response token j
            allowed = ALLOWED[b][j] if masked else None
            support = sorted(allowed) if allowed is not None else range(V)
            out[b, j] = row[token] - math.log(sum(math.exp(row[v]) for v in support))
    return out


def _masked_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """What the masked actor computes: the recall mask on the logits (recallm.recall.mask), then log-softmax."""
    ids = torch.tensor([PROMPT + r for r in RESPONSES])
    masked = apply_recall_mask(logits.clone(), ids, START, END)
    log_probs = torch.log_softmax(masked, dim=-1)[:, len(PROMPT) - 1 : -1]
    return log_probs.gather(-1, ids[:, len(PROMPT) :, None]).squeeze(-1)


def test_the_recall_mask_allows_what_the_hand_computation_says():
    ids = np.array([PROMPT + r for r in RESPONSES])
    found = allowed_positions(ids, START, END, vocab_size=V).as_dict()
    for b in range(2):
        for j, allowed in enumerate(ALLOWED[b]):
            if not VALID[b][j]:
                continue
            position = len(PROMPT) + j - 1  # the row that predicts response token j
            assert set(found.get((b, position), set())) == (allowed or set()), (b, j)


def _agg(losses: np.ndarray, mask: np.ndarray, mode: str) -> float:
    """verl's five loss aggregations, written out (one data-parallel rank)."""
    lengths = mask.sum(axis=1)
    if mode == "token-mean":
        return float((losses * mask).sum() / mask.sum())
    if mode == "token-sum":
        return float((losses * mask).sum())
    if mode == "seq-mean-token-mean":
        return float(np.mean((losses * mask).sum(axis=1) / lengths))
    if mode == "seq-mean-token-sum":
        return float(np.mean((losses * mask).sum(axis=1)))
    if mode == "seq-mean-token-sum-norm":
        return float(np.mean((losses * mask).sum(axis=1)) / mask.shape[1])
    raise AssertionError(mode)


MODES = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("mode", MODES)
def test_gspo_sequence_ratio_uses_masked_log_probs_on_both_sides(mode):
    """GSPO's loss from verl, fed the masked actor's log-probs for the old and the current policy, equals the
    hand computation: per response s_i = exp(mean_t(log pi_new - log pi_old)) over masked log-probs,
    clipped to [1 - 3e-4, 1 + 4e-4], times -A_i, aggregated as ``mode``. With one side unmasked the ratio
    is another number: inside spans the two distributions differ."""
    from verl.trainer.ppo.core_algos import compute_policy_loss_gspo
    from verl.workers.config import ActorConfig

    old_logits = _logits(0)
    new_logits = _logits(1, noise=0.05, base=old_logits)
    old, new = _masked_log_probs(old_logits), _masked_log_probs(new_logits)
    hand_old, hand_new = _by_hand(old_logits, True), _by_hand(new_logits, True)
    mask = np.array(VALID, dtype=np.float64)
    assert np.allclose(old.double().numpy() * mask, hand_old * mask, atol=1e-5)
    assert np.allclose(new.double().numpy() * mask, hand_new * mask, atol=1e-5)
    assert hand_new[1, 3] == pytest.approx(0.0, abs=1e-12)  # END forced (a context that ends): probability 1

    advantages = np.array([[1.0] * 6, [-1.0] * 6])
    low, high = 3e-4, 4e-4
    ratio = np.exp(((hand_new - hand_old) * mask).sum(axis=1) / mask.sum(axis=1))
    assert abs(ratio[0] - 1) > high and abs(ratio[1] - 1) > high  # the clip range matters on both
    losses = np.maximum(-advantages * ratio[:, None], -advantages * np.clip(ratio, 1 - low, 1 + high)[:, None])
    expected = _agg(losses, mask, mode)

    config = ActorConfig(strategy="fsdp", ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2, rollout_n=2,
                         clip_ratio_low=low, clip_ratio_high=high, loss_agg_mode=mode)  # fmt: skip
    loss, metrics = compute_policy_loss_gspo(
        old.float(), new.float(), torch.tensor(advantages).float(), torch.tensor(mask).float(), mode, config
    )
    assert float(loss) == pytest.approx(expected, rel=1e-4)
    assert metrics["actor/ppo_kl"] == pytest.approx(float(((hand_old - hand_new) * mask).sum() / mask.sum()), abs=1e-5)

    unmasked_old = _by_hand(old_logits, False)  # the rollout's side without the mask: another ratio
    ratio_split = np.exp(((hand_new - unmasked_old) * mask).sum(axis=1) / mask.sum(axis=1))
    assert not np.allclose(ratio_split, ratio, rtol=1e-3)


@pytest.mark.parametrize("mode", MODES)
def test_token_ratio_and_each_aggregation_on_masked_log_probs(mode):
    """verl's vanilla PPO-clip loss (GRPO's, DAPO's with clip-higher) on the same masked log-probs: the
    token ratio exp(log pi_new - log pi_old) clipped to [1 - 0.2, 1 + 0.28], dual-clipped at 3 for negative
    advantages, aggregated as ``mode``."""
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    from verl.workers.config import ActorConfig

    old_logits = _logits(2)
    new_logits = _logits(3, noise=0.3, base=old_logits)
    hand_old, hand_new = _by_hand(old_logits, True), _by_hand(new_logits, True)
    mask = np.array(VALID, dtype=np.float64)
    advantages = np.array([[0.7] * 6, [-1.3] * 6])
    ratio = np.exp(hand_new - hand_old)
    clipped = np.maximum(-advantages * ratio, -advantages * np.clip(ratio, 1 - 0.2, 1 + 0.28))
    losses = np.where(advantages < 0, np.minimum(clipped, -advantages * 3.0), clipped)
    config = ActorConfig(strategy="fsdp", ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2, rollout_n=2,
                         clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=mode)  # fmt: skip
    loss, _ = compute_policy_loss_vanilla(
        _masked_log_probs(old_logits).float(),
        _masked_log_probs(new_logits).float(),
        torch.tensor(advantages).float(),
        torch.tensor(mask).float(),
        mode,
        config,
    )
    assert float(loss) == pytest.approx(_agg(losses, mask, mode), rel=1e-4)


# ------------------------------------------------------------------------------- dynamic sampling
def test_group_selection_drops_equal_groups_and_refills_in_order():
    a = (["a", "a", "b", "b", "c", "c"], [1.0, 1.0, 0.0, 1.0, 0.5, 0.5 + 1e-9])  # a, c: zero variance
    b = (["d", "d", "e", "e", "f", "f"], [0.2, 0.3, 0.0, 0.0, 1.0, 0.0])  # e: zero variance
    sel = ds.plan_selection([a, b], want=3)
    assert sel.rows == [[2, 3], [0, 1, 4, 5]]  # b, then d and f from the refill
    assert (sel.generated, sel.zero_variance, sel.kept, sel.surplus, sel.padded, sel.dropped) == (6, 3, 3, 0, 0, 3)
    short = ds.plan_selection([a], want=3)  # the bound reached: the batch completed with dropped groups
    assert short.rows == [[2, 3, 0, 1, 4, 5]] and (short.padded, short.dropped, short.kept) == (2, 0, 1)
    more = ds.plan_selection([b, a], want=1)
    assert more.rows == [[0, 1], []] and more.surplus == 2
    assert ds.zero_variance([0.3, 0.3 + 5e-7]) and not ds.zero_variance([0.3, 0.3 + 5e-6])
    assert ds.groups_of(["x", "y", "x"]) == {"x": [0, 2], "y": [1]}


def test_refill_loader_shares_the_epochs_iterator():
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = ds.RefillLoader(StatefulDataLoader(list(range(10)), batch_size=2))
    assert len(loader) == 5 and loader.take() is None  # no epoch started yet
    seen = []
    for batch in loader:
        seen.append(batch.tolist())
        if len(seen) == 1:
            assert loader.take().tolist() == [2, 3]  # the refill takes the epoch's next batch
    assert seen == [[0, 1], [4, 5], [6, 7], [8, 9]] and loader.take() is None
    state = loader.state_dict()  # delegated: the checkpoint records what the epoch consumed
    assert state and isinstance(state, dict)


class _Rollout:
    """A stand-in for verl's agent loop: per prompt index, the rewards of its n responses."""

    def __init__(self, rewards: dict[int, list[float]]):
        self.rewards = rewards
        self.calls = 0

    def generate_sequences(self, gen_batch):
        from verl import DataProto

        self.calls += 1
        index = list(gen_batch.non_tensor_batch["index"])
        seen: dict[int, int] = {}
        scores = torch.zeros(len(index), 3)
        for row, i in enumerate(index):
            k = seen.get(i, 0)
            seen[i] = k + 1
            scores[row, -1] = self.rewards[int(i)][k]
        out = DataProto.from_single_dict(
            {
                "responses": torch.full((len(index), 3), 4),
                "attention_mask": torch.ones(len(index), 5, dtype=torch.long),
                "response_mask": torch.ones(len(index), 3, dtype=torch.long),
                "rm_scores": scores,
            }
        )
        out.meta_info = {"timing": {"gen": 0.1}, "reward_extra_keys": []}
        return out


def _batch_dict(indices: list[int]) -> dict:
    n = len(indices)
    return {
        "dummy_tensor": torch.zeros(n, 1, dtype=torch.uint8),
        "index": np.array(indices),
        "raw_prompt": np.array([[{"role": "user", "content": f"q{i}"}] for i in indices] + [None], dtype=object)[:-1],
        "data_source": np.array(["toy"] * n, dtype=object),
        "reward_model": np.array([{"ground_truth": str(i)} for i in indices], dtype=object),
        "extra_info": np.array([{} for _ in indices], dtype=object),
    }


class _Trainer:
    """The parts of verl's RayPPOTrainer that a refill uses (its own ``_get_gen_batch``)."""

    def __init__(self, batches, rewards, *, bound=4, frees=False):
        from omegaconf import OmegaConf
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer

        self._get_gen_batch = RayPPOTrainer._get_gen_batch.__get__(self)
        self.config = OmegaConf.create(
            {
                "algorithm": {"filter_groups": {"enable": True, "metric": "reward", "max_num_gen_batches": bound}},
                "actor_rollout_ref": {"rollout": {"n": 2, "temperature": 1.0, "free_cache_engine": frees}},
                "trainer": {"balance_batch": True},
            }
        )
        self.train_dataloader = ds.RefillLoader(batches)
        self.global_steps = 7
        self.use_rm = False
        self.async_rollout_manager = _Rollout(rewards)
        self.syncs, self.sleeps, self.balanced = [], 0, 0
        trainer = self

        class _Checkpoints:
            def update_weights(self, step):
                trainer.syncs.append(step)

            def sleep_replicas(self):
                trainer.sleeps += 1

        self.checkpoint_manager = _Checkpoints()

    def _balance_batch(self, batch, metrics):
        self.balanced += 1


def _step_batch(trainer, batch_dict):
    """The step's batch as verl's loop has it when it calls extract_reward (generated, scored)."""
    return ds._generate(trainer, batch_dict)


@pytest.mark.parametrize("frees", [False, True])
def test_fill_drops_equal_groups_and_refills_from_the_same_epoch(frees):
    rewards = {i: [1.0, 1.0] for i in range(12)}  # every group equal ...
    rewards.update({1: [0.0, 1.0], 5: [0.2, 0.4], 6: [1.0, 0.0], 9: [0.5, 0.0]})  # ... but these
    batches = [_batch_dict([0, 1, 2]), _batch_dict([3, 4, 5]), _batch_dict([6, 7, 8]), _batch_dict([9, 10, 11])]
    trainer = _Trainer(batches, rewards, frees=frees)
    epoch = iter(trainer.train_dataloader)
    batch = _step_batch(trainer, next(epoch))
    trainer.syncs, trainer.sleeps = [], 0
    metrics, parts = ds.fill(trainer, batch)
    assert len(batch) == 3 * 2  # data.train_batch_size x n, as every other setting was checked against
    kept = sorted({int(rm["ground_truth"]) for rm in batch.non_tensor_batch["reward_model"]})
    assert kept == [1, 5, 6]  # the first three prompts whose rewards differ
    assert metrics["dynamic_sampling/generated_groups"] == 9 and metrics["dynamic_sampling/dropped_groups"] == 6
    assert metrics["dynamic_sampling/gen_batches"] == 3 and metrics["dynamic_sampling/padded_groups"] == 0
    assert [len(u) for u, _ in parts] == [6, 6, 6]
    assert trainer.async_rollout_manager.calls == 3 and trainer.balanced == 1
    assert batch.meta_info["global_token_num"] == [5] * 6
    uids = batch.non_tensor_batch["uid"]
    for i in range(0, 6, 2):
        assert uids[i] == uids[i + 1]  # each group whole
    assert [int(i) for i in next(epoch)["index"]] == [9, 10, 11]  # the refills were the epoch's own batches
    assert trainer.syncs == ([7, 7] if frees else []) and trainer.sleeps == (2 if frees else 0)


def test_fill_stops_at_the_bound_and_completes_the_batch_with_dropped_groups():
    rewards = {i: [1.0, 1.0] for i in range(9)}
    rewards[4] = [0.0, 1.0]
    batches = [_batch_dict([0, 1, 2]), _batch_dict([3, 4, 5]), _batch_dict([6, 7, 8])]
    trainer = _Trainer(batches, rewards, bound=2)
    epoch = iter(trainer.train_dataloader)
    batch = _step_batch(trainer, next(epoch))
    metrics, _ = ds.fill(trainer, batch)
    assert len(batch) == 6 and metrics["dynamic_sampling/gen_batches"] == 2
    assert metrics["dynamic_sampling/padded_groups"] == 2 and metrics["dynamic_sampling/dropped_groups"] == 3
    assert sorted(int(rm["ground_truth"]) for rm in batch.non_tensor_batch["reward_model"])[::2] == [0, 1, 4]


def test_fill_names_a_metric_the_reward_does_not_return():
    trainer = _Trainer([_batch_dict([0, 1])], {0: [1.0, 0.0], 1: [0.0, 0.0]})
    trainer.config.algorithm.filter_groups.metric = "acc"
    batch = _step_batch(trainer, next(iter(trainer.train_dataloader)))
    with pytest.raises(RuntimeError, match="filter_groups.metric='acc': the reward returns no such value"):
        ds.fill(trainer, batch)


# ------------------------------------------------------------------------------------ health
def _monitor(**settings):
    return HealthMonitor(HealthSettings(**settings), recall=True, max_response_length=32)


def test_health_checks_fire_on_their_thresholds():
    monitor = _monitor(zero_variance_share=0.8, clipped_share=0.5, logprob_gap=0.1)
    quiet = {
        "recallm/health/zero_variance_share": 0.8,
        "recallm/health/generated_groups": 10,
        "response_length/clip_ratio": 0.5,
        "recallm/recall_usage": 0.25,
        "recallm/logprob_gap_in_spans": 0.1,
    }
    metrics, warnings = monitor.observe(1, quiet)
    assert warnings == [] and metrics["recallm/health/warnings"] == 0
    assert summary_part({**quiet, **metrics}) == "health ok"
    loud = {**quiet, "recallm/health/zero_variance_share": 0.9, "response_length/clip_ratio": 0.75,
            "recallm/logprob_gap_in_spans": 0.84}  # fmt: skip
    metrics, warnings = monitor.observe(2, loud)
    assert len(warnings) == 3 and metrics["recallm/health/warnings"] == 3
    assert warnings[0].startswith("step 2: 90% of the prompt groups (9 of 10) gave every response the same reward")
    assert "75% of the responses hit the generation cap data.max_response_length=32" in warnings[1]
    assert "differ by 0.84 on average inside recall spans (recallm.health.logprob_gap=0.1)" in warnings[2]
    assert summary_part({**loud, **metrics}) == "health: zero_variance, clipped, logprob_gap"
    assert warning_text(warnings[1]).startswith("[recallm health] warning: step 2: 75%")
    assert summary_part({"critic/score/mean": 0.1}) is None


def test_with_one_step_off_the_span_gap_is_checked_above_the_lags_own():
    lagged = HealthMonitor(HealthSettings(logprob_gap=0.1), sync_carries_previous_update=True)
    lag = {"recallm/logprob_gap_in_spans": 0.18, "recallm/logprob_gap_outside_spans": 0.21}  # the policy's change
    assert lagged.observe(2, lag)[1] == []
    split = {"recallm/logprob_gap_in_spans": 2.5, "recallm/logprob_gap_outside_spans": 0.21}  # a mask on one side
    warnings = lagged.observe(3, split)[1]
    assert len(warnings) == 1 and "differ by 2.5 on average inside recall spans (0.21 outside them" in warnings[0]
    assert len(_monitor(logprob_gap=0.1).observe(2, lag)[1]) == 1  # synchronous: no lag to allow for


def test_no_span_patience_counts_steps_in_a_row():
    monitor = _monitor(span_patience=3)
    said = [monitor.observe(step, {"recallm/recall_usage": usage})[1] for step, usage in enumerate([0, 0, 0.5, 0, 0, 0], 1)]
    assert [len(w) for w in said] == [0, 0, 0, 0, 0, 1]
    assert said[-1][0].startswith("step 6: no response opened a recall span for 3 steps")
    plain = HealthMonitor(HealthSettings(span_patience=1), recall=False)
    assert plain.observe(1, {"recallm/recall_usage": 0.0})[1] == []  # not a recall run


def test_adapter_liveness_compares_the_probe_with_the_update_its_sync_carried():
    monitor = _monitor()
    assert monitor.observe(1, {"actor/grad_norm": 0.5, "actor/lr": 1e-4})[1] == []  # (no probe to compare yet)
    warnings = monitor.observe(2, {"actor/grad_norm": 0.4, "actor/lr": 1e-4, "recallm/health/rollout_probe_change": 0.0})[1]
    assert len(warnings) == 1 and "do not reach the rollout" in warnings[0]
    ok = monitor.observe(3, {"actor/grad_norm": 0.4, "actor/lr": 1e-4, "recallm/health/rollout_probe_change": 0.02})
    assert ok[1] == [] and ok[0]["recallm/health/adapter_live"] == 0.0
    frozen = monitor.observe(4, {"actor/grad_norm": 0.4, "actor/lr": 0.0, "recallm/health/rollout_probe_change": 0.0})
    assert frozen[1] == []  # no learning rate: nothing to carry
    # one-step-off: the sync of step k carries step k-1's update
    lagged = HealthMonitor(HealthSettings(), sync_carries_previous_update=True)
    lagged.observe(1, {"actor/grad_norm": 0.0, "actor/lr": 1e-4})
    assert lagged.observe(2, {"actor/grad_norm": 0.3, "actor/lr": 1e-4, "recallm/health/rollout_probe_change": 0.0})[1] == []
    assert len(lagged.observe(3, {"actor/grad_norm": 0.3, "recallm/health/rollout_probe_change": 0.0})[1]) == 1


def test_exhausted_resume_and_the_strict_stop():
    assert exhausted_resume(0, 10, 1) is None and exhausted_resume(9, 10, 1) is None
    why = exhausted_resume(20, 10, 2)
    assert why.startswith("resumed at step 20: the data is used up (trainer.total_epochs=2 epochs of 10 steps")
    stop = Unhealthy(4, ["step 4: a", "step 4: b"])
    assert str(stop) == "training stopped by recallm.health.strict=true after step 4: step 4: a (and 1 more)"
    again = pickle.loads(pickle.dumps(stop))
    assert (again.step, again.warnings) == (4, ["step 4: a", "step 4: b"])

    class RayError(Exception):  # how Ray carries an actor's exception: as `cause`
        def __init__(self, cause):
            super().__init__("ray")
            self.cause = cause

    assert unhealthy_by(RayError(stop)) is stop and unhealthy_by(RayError(ValueError("x"))) is None

    class RayTaskErrorUnhealthy(RayError, Unhealthy):  # Ray's dual class: its message is Ray's traceback
        def __init__(self):
            Exception.__init__(self, "ray::TaskRunner.run() ...\nTraceback ...")
            self.cause, self.step, self.warnings = None, 4, ["step 4: a"]

    dual = RayTaskErrorUnhealthy()
    assert str(unhealthy_by(dual)) == "training stopped by recallm.health.strict=true after step 4: step 4: a"
