"""Step 3 of the GRPO launch (``recallm.grpo.app``), **check** (:func:`problems`, :func:`validate`), before Ray
starts: the platform and the rollout agree; nothing would bypass, split or mismatch the recall mask; batch sizes
divide; token caps cover the longest sequence; the overlong penalty can be reached; the evaluated checkpoint is
kept; data files exist and the reward can score their rows. Each check yields its problems as one-line messages
naming the key; then verl's own ``validate_config``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from recallm.errors import RecallmError
from recallm.grpo.checkpoints import check_run_dir
from recallm.grpo.prepare import _data_dir, _overlong_buffer, _round_up, data_lengths_of
from recallm.grpo.ranges import check_ranges
from recallm.grpo.settings import settings_of

__all__ = [
    "Check",
    "CHECKS",
    "problems",
    "validate",
    "length_warnings",
    "FLASH_VARLEN_ATTENTION",
    "MASKED_STRATEGIES",
    "RECALL_ROLLOUTS",
]

RECALL_ROLLOUTS = ("vllm", "hf_cpu")
#: verl training backends that build the Hugging Face model (so the masked ``recallm_<base>``
#: classes run): FSDP1 and FSDP2. megatron, veomni, torchtitan, automodel and fsdp_turbo build
#: their own models, which know nothing of the recall mask.
MASKED_STRATEGIES = ("fsdp", "fsdp2")
#: Attention implementations that keep packed sequences (``use_remove_padding=true``: one row,
#: boundaries at ``position_ids`` resets) apart: flash attention's varlen kernels. ``sdpa`` and
#: ``eager`` attend across the boundary.
FLASH_VARLEN_ATTENTION = (
    "flash_attention_2",
    "flash_attention_3",
    "kernels-community/flash-attn",
    "kernels-community/flash-attn2",
    "kernels-community/flash-attn3",
    "kernels-community/vllm-flash-attn3",
)
#: verl's default when ``model.override_config.attn_implementation`` is unset (``HFModelConfig``).
VERL_DEFAULT_ATTENTION = "flash_attention_2"


#: one check of :func:`problems`: yields one-line messages, each naming the key and what would work
Check = Callable[[DictConfig], Iterable[str]]


def _check_platform(cfg: DictConfig) -> Iterator[str]:
    """The platform group's rollout and device, as the launcher prepares for them."""
    rm = settings_of(cfg)
    name, device = cfg.actor_rollout_ref.rollout.name, OmegaConf.select(cfg, "trainer.device", default=None)
    rollout = {"cpu": "hf_cpu", "vllm_cpu": "vllm"}.get(rm.platform)
    if rollout and name != rollout:
        other = {"hf_cpu": "cpu", "vllm": "vllm_cpu"}.get(name)
        hint = f"use grpo/platform={other}" if other else f"use actor_rollout_ref.rollout.name={rollout}"
        yield f"actor_rollout_ref.rollout.name={name} on the {rm.platform} platform, whose rollout is {rollout}: {hint}"
    if rm.cpu and device != "cpu":
        yield f"trainer.device={device} on the {rm.platform} platform: choose the platform with grpo/platform=NAME"
    if rm.platform == "gpu" and (name == "hf_cpu" or device == "cpu"):
        what = "actor_rollout_ref.rollout.name=hf_cpu" if name == "hf_cpu" else "trainer.device=cpu"
        yield f"{what} needs the CPU plugin: use grpo/platform=cpu"


def _check_mask_is_kept(cfg: DictConfig) -> Iterator[str]:
    """What would bypass, split or mismatch the recall mask of the actor and the reference."""
    arr = cfg.actor_rollout_ref
    for role in ("actor_rollout_ref.model", "critic.model"):
        if OmegaConf.select(cfg, f"{role}.use_fused_kernels", default=False):
            yield f"{role}.use_fused_kernels=true bypasses the logits, so the recall mask would not apply"
    for role in ("actor", "ref"):
        # the deprecated top-level key (copied into fsdp_config by verl) and the one the engine reads
        for key in (
            f"actor_rollout_ref.{role}.ulysses_sequence_parallel_size",
            f"actor_rollout_ref.{role}.fsdp_config.ulysses_sequence_parallel_size",
        ):
            sp = OmegaConf.select(cfg, key, default=1) or 1
            if int(sp) != 1:
                yield (
                    f"{key}={sp}: a sequence split across ranks loses the searchable context of its recall spans "
                    "(verbatim tokens would get ~-1e4 log-probs); use 1"
                )
        strategy = OmegaConf.select(cfg, f"actor_rollout_ref.{role}.strategy", default=None)
        if strategy not in MASKED_STRATEGIES:
            yield (
                f"actor_rollout_ref.{role}.strategy={strategy}: only {' / '.join(MASKED_STRATEGIES)} build the "
                "Hugging Face model that applies the recall mask"
            )
    if arr.model.get("use_remove_padding", False):
        attn = OmegaConf.select(cfg, "actor_rollout_ref.model.override_config.attn_implementation", default=None)
        attn = attn or VERL_DEFAULT_ATTENTION
        if attn not in FLASH_VARLEN_ATTENTION:
            yield (
                f"actor_rollout_ref.model.use_remove_padding=true with attn_implementation={attn}: packed sequences "
                f"would attend to each other; use flash attention ({', '.join(FLASH_VARLEN_ATTENTION[:2])}) or "
                "use_remove_padding=false"
            )
    mode = arr.rollout.get("logprobs_mode", "processed_logprobs")
    if mode != "processed_logprobs":
        yield (
            f"actor_rollout_ref.rollout.logprobs_mode={mode}: the rollout's log-probs must be the processed ones "
            "(after the recall mask), as the masked actor computes them; use processed_logprobs"
        )


def _check_rollout(cfg: DictConfig) -> Iterator[str]:
    arr = cfg.actor_rollout_ref
    if settings_of(cfg).recall_constrained and arr.rollout.name not in RECALL_ROLLOUTS:
        yield (
            f"rollout {arr.rollout.name!r} has no recall logits processor (use one of {', '.join(RECALL_ROLLOUTS)}, "
            "or recallm.recall_constrained=false for the unconstrained ablation)"
        )
    if settings_of(cfg).recall_constrained and arr.rollout.name == "vllm":
        engine = (arr.rollout.get("engine_kwargs") or {}).get("vllm") or {}
        mtp = arr.rollout.get("mtp")
        if engine.get("speculative_config") is not None or (mtp and mtp.get("enable") and mtp.get("enable_rollout")):
            key = "engine_kwargs.vllm.speculative_config" if engine.get("speculative_config") is not None else "mtp"
            yield (
                f"actor_rollout_ref.rollout.{key}: vLLM 0.24 refuses custom logits processors with speculative "
                "decoding, so the recall constraint cannot run with it (drop it, or recallm.recall_constrained=false "
                "for the unconstrained ablation; docs/guide/generation.md)"
            )
    n = int(arr.rollout.n)
    if n < 2:
        yield f"GRPO needs at least 2 rollouts per prompt (actor_rollout_ref.rollout.n={n})"


def _check_engines(cfg: DictConfig) -> Iterator[str]:
    """verl's vLLM rollout on a verl/vLLM pair the test tiers run (``recallm.engines``; vLLM not installed
    where the run is launched: its rollout servers check when they load the recall processor)."""
    if cfg.actor_rollout_ref.rollout.name != "vllm":
        return
    from recallm.engines import UntestedEngines, check_engines

    try:
        check_engines("grpo")
    except UntestedEngines as exc:
        yield str(exc)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _near(value: int, allowed: list[int]) -> int:
    """The largest allowed value not above ``value`` (a batch no larger than the one asked for), else the
    smallest allowed."""
    below = [a for a in allowed if a <= value]
    return max(below) if below else min(allowed, default=1)


def _check_batches(cfg: DictConfig) -> Iterator[str]:
    """Batch sizes that divide: into mini batches, micro batches, devices (verl asserts some of these
    inside a Ray worker). Each problem names its key and a value that divides."""
    if int(cfg.trainer.n_gpus_per_node) * int(cfg.trainer.nnodes) < 1:
        return  # no device to divide over: recallm.grpo.ranges names the key
    arr = cfg.actor_rollout_ref
    n = int(arr.rollout.n)
    train_batch, mini = int(cfg.data.train_batch_size), int(arr.actor.ppo_mini_batch_size)
    if not (mini >= 1 and train_batch % mini == 0):
        yield (
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} must divide data.train_batch_size={train_batch}: "
            f"use actor_rollout_ref.actor.ppo_mini_batch_size={_near(mini, _divisors(train_batch))}"
        )
    gpus = int(cfg.trainer.n_gpus_per_node) * int(cfg.trainer.nnodes)
    micro = arr.actor.get("ppo_micro_batch_size_per_gpu")
    if micro and not arr.actor.get("use_dynamic_bsz", False) and (mini * n) % (int(micro) * gpus) != 0:
        per_device = mini * n // gpus if (mini * n) % gpus == 0 else 0
        fix = (
            f"use actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={_near(int(micro), _divisors(per_device))}"
            if per_device
            else "change ppo_mini_batch_size or rollout.n"
        )
        yield (
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}: a mini batch of ppo_mini_batch_size x "
            f"rollout.n = {mini * n} responses on {gpus} device(s) does not split into micro batches of {micro}; {fix}"
        )
    if (train_batch * n) % gpus != 0:
        yield (
            f"data.train_batch_size={train_batch} x actor_rollout_ref.rollout.n={n} = {train_batch * n} responses per "
            f"step do not divide over trainer.n_gpus_per_node x trainer.nnodes = {gpus} device(s)"
        )
        return
    per_device = train_batch * n // max(gpus, 1)
    for role in ("rollout", "ref"):  # verl's compute_log_prob asserts it, inside a Ray worker
        lp_micro = arr[role].get("log_prob_micro_batch_size_per_gpu")
        if lp_micro and not arr[role].get("log_prob_use_dynamic_bsz", False) and per_device % int(lp_micro) != 0:
            yield (
                f"actor_rollout_ref.{role}.log_prob_micro_batch_size_per_gpu={lp_micro}: {per_device} responses per "
                f"device (data.train_batch_size x rollout.n / devices) do not split into micro batches of {lp_micro}; "
                f"use actor_rollout_ref.{role}.log_prob_micro_batch_size_per_gpu="
                f"{_near(int(lp_micro), _divisors(per_device))}"
            )


def _check_data_lengths(cfg: DictConfig) -> Iterator[str]:
    """Token caps left null that could not be derived from the data (:func:`data_lengths`): what to set."""
    folder = _data_dir(cfg)
    where = f"{folder}/summary.json" if folder else "the data's summary.json (one data.train_files)"
    for key, what in (("max_prompt_length", "the longest training prompt"), ("max_response_length", "the longest SFT trace")):
        if cfg.data.get(key) is None:
            yield (
                f"data.{key} is null and {where} does not give {what}: set data.{key}=<tokens> (or run recallm-data "
                "again: it writes the lengths into the summary)"
            )


def length_warnings(cfg: DictConfig) -> Iterator[str]:
    """The token caps against the data's own lengths (``data_gen.generate.data_lengths`` of the training
    file's directory), said before the run: prompts longer than ``data.max_prompt_length`` are dropped
    (verl's ``filter_overlong_prompts``); SFT traces longer than ``data.max_response_length`` less the overlong
    buffer are responses the model was taught to write that would be penalised or cut. Warnings, not
    refusals: a short cap is how a CPU smoke run stays short; each names the value that fits the data."""
    folder = _data_dir(cfg)
    found = data_lengths_of(folder) if folder else {}
    prompt, response = cfg.data.get("max_prompt_length"), cfg.data.get("max_response_length")
    where = f"{folder}/summary.json"
    if prompt is not None and "prompt_max" in found and found["prompt_max"] > int(prompt):
        yield (
            f"data.max_prompt_length={prompt} is shorter than the longest training prompt ({found['prompt_max']} "
            f"tokens, {where}): longer prompts are dropped; data.max_prompt_length={_round_up(found['prompt_max'])} "
            "keeps them all"
        )
    buffer = _overlong_buffer(cfg)
    if response is not None and "completion_max" in found and found["completion_max"] > int(response) - buffer:
        room = int(response) - buffer
        most = "most of " if found.get("completion_median", 0) > room else "some of "
        penalty = f" less the overlong buffer {buffer} (recallm.reward.overlong.buffer)" if buffer else ""
        yield (
            f"data.max_response_length={response}{penalty} leaves {room} tokens: {most}the SFT traces are longer "
            f"(median {found.get('completion_median', '?')}, longest {found['completion_max']} tokens, {where}), so the "
            f"responses the model was taught to write are {'penalised or ' if buffer else ''}cut; "
            f"data.max_response_length={_round_up(found['completion_max'] + buffer)} fits them"
        )


def _check_lengths(cfg: DictConfig) -> Iterator[str]:
    """Context length of the rollout engine and the dynamic-batching token caps vs the longest sequence."""
    arr = cfg.actor_rollout_ref
    if cfg.data.get("max_prompt_length") is None or cfg.data.get("max_response_length") is None:
        return  # _check_data_lengths names it
    longest = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
    max_model_len = arr.rollout.get("max_model_len")
    if max_model_len is not None and int(max_model_len) < longest:
        yield (
            f"actor_rollout_ref.rollout.max_model_len={max_model_len} is shorter than data.max_prompt_length + "
            f"data.max_response_length = {longest}"
        )
    caps = []
    if arr.actor.get("use_dynamic_bsz", False):
        caps.append("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    for role in ("ref", "rollout"):
        if arr[role].get("log_prob_use_dynamic_bsz", False):
            caps.append(f"actor_rollout_ref.{role}.log_prob_max_token_len_per_gpu")
    for key in caps:
        cap = int(OmegaConf.select(cfg, key))
        if cap < longest:
            yield (
                f"{key}={cap} is below the longest sequence (data.max_prompt_length + data.max_response_length = "
                f"{longest}): one sequence would not fit in a micro batch"
            )


def _check_reward(cfg: DictConfig) -> Iterator[str]:
    """The reward table, and DAPO's overlong shaping against the generation cap: the penalty ends at
    ``data.max_response_length`` and starts ``recallm.reward.overlong.buffer`` tokens before it."""
    rm = settings_of(cfg)
    if not rm.reward_manager:
        return
    overlong = rm.reward.get("overlong") or {}
    if cfg.data.get("max_response_length") is None:
        return  # _check_data_lengths names it
    cap = int(cfg.data.max_response_length)
    end, buffer = overlong.get("max_response_length"), overlong.get("buffer")
    if end != cap:
        yield (
            f"recallm.reward.overlong.max_response_length={end}: in a GRPO run the overlong penalty ends at the "
            f"generation cap, data.max_response_length={cap}; set that (the penalty starts "
            "recallm.reward.overlong.buffer tokens before it)"
        )
        return
    if overlong.get("enable") and isinstance(buffer, int) and not 1 <= buffer <= cap:
        why = (
            f"the overlong penalty would start at the generation cap data.max_response_length={cap}, which no "
            "response passes"
            if buffer < 1
            else f"longer than the generation cap data.max_response_length={cap}"
        )
        yield f"recallm.reward.overlong.buffer={buffer}: {why}; use 1 to {cap}, or recallm.reward.overlong.enable=false"
        return
    from rewards import load_reward_config

    try:
        load_reward_config(rm.reward)
    except RecallmError as exc:
        yield f"recallm.{exc}" if str(exc).startswith("reward") else f"recallm.reward: {exc}"


def _check_eval_step(cfg: DictConfig) -> Iterator[str]:
    """``recallm.eval_step``: the checkpoint the paper evaluates must be saved and kept."""
    step = settings_of(cfg).eval_step
    if step is None:
        return
    t = cfg.trainer
    step, total, freq = int(step), int(t.total_training_steps or 0), int(t.save_freq)
    if not 0 < step <= total:
        yield f"recallm.eval_step={step} must be within trainer.total_training_steps={total}"
        return
    if not (freq > 0 and (step % freq == 0 or step == total)):
        yield f"recallm.eval_step={step} is not saved with trainer.save_freq={freq}"
        return
    keep = t.get("max_actor_ckpt_to_keep")
    if keep is not None:
        later = (total // freq) - (step // freq)  # checkpoints saved after it
        if int(keep) <= later:
            yield (
                f"trainer.max_actor_ckpt_to_keep={keep} would delete the step-{step} checkpoint (recallm.eval_step) "
                f"before step {total}; use null or more than {later}"
            )


def _check_checkpoints(cfg: DictConfig) -> Iterator[str]:
    """On GPUs, checkpoints go outside the source checkout (a paper-scale save is ~100 GB), and the
    retention keeps the newest saves resumable."""
    rm = settings_of(cfg)
    if rm.platform == "gpu":
        from recallm.paths import CONFIG_DIR

        checkout = CONFIG_DIR.parent.resolve()
        where = Path(str(cfg.trainer.default_local_dir)).expanduser().resolve()
        if (checkout / "pyproject.toml").is_file() and where.is_relative_to(checkout):
            yield (
                f"trainer.default_local_dir={where} is inside the source checkout {checkout}: a paper-scale "
                "checkpoint is ~100 GB; set it to your run directory outside it (e.g. /scratch/$USER/grpo-qwen)"
            )
    keep = cfg.trainer.get("max_actor_ckpt_to_keep")
    if rm.keep_checkpoints and keep is not None:
        yield (
            f"trainer.max_actor_ckpt_to_keep={keep} with recallm.keep_checkpoints={rm.keep_checkpoints}: choose one "
            "(recallm.keep_checkpoints also holds across requeues and keeps recallm.eval_step)"
        )


def _check_data(cfg: DictConfig) -> Iterator[str]:
    """The data files exist, and the reward can score every row's ground truth (``recallm.check_data``)."""
    rm = settings_of(cfg)
    files = []
    for key in ("data.train_files", "data.val_files"):
        value = OmegaConf.select(cfg, key, default=None)
        files += [value] if isinstance(value, str) else list(value or [])
    files = list(dict.fromkeys(str(file) for file in files))  # train and val may name the same file
    missing = [file for file in files if not Path(file).is_file()]
    for file in missing:
        yield f"data file {file} does not exist; generate it with `recallm-data`"
    if missing or not (rm.reward_manager and rm.check_data):
        return
    from data_gen.io import read_records
    from rewards import check_rows, load_reward_config

    try:
        reward = load_reward_config(rm.reward)
    except RecallmError:
        return  # _check_reward says why
    for file in files:
        try:
            check_rows(read_records(file), reward)
        except RecallmError as exc:
            yield f"{file}: {exc}"


#: the checks of :func:`problems`, in order
CHECKS: tuple[Check, ...] = (
    _check_platform,
    _check_mask_is_kept,
    _check_rollout,
    _check_engines,
    _check_batches,
    _check_lengths,
    _check_data_lengths,
    _check_reward,
    _check_eval_step,
    _check_checkpoints,
    _check_data,
    check_ranges,
    check_run_dir,
)


def problems(cfg: DictConfig, checks: Iterable[Check] = CHECKS) -> list[str]:
    """Every problem RecaLLM's checks find in a prepared config, each one line naming its key (empty: none)."""
    import functools

    from recallm.errors import collect

    return collect(*(functools.partial(check, cfg) for check in checks))


def validate(cfg: DictConfig) -> None:
    """RecaLLM's checks (:data:`CHECKS`), then verl's ``validate_config`` — all before Ray starts.

    Raises ``recallm.errors.Problems`` (every problem found, one line each; the CLI prints them all) for: a platform whose rollout or device
    was changed; fused kernels; Ulysses sequence parallelism (any of the four keys, actor and
    reference); a training backend other than FSDP/FSDP2; packed sequences without flash attention;
    rollout log-probs other than the processed ones; a rollout without the recall processor; a vLLM rollout
    on an untested verl/vLLM pair (``recallm.engines``); fewer
    than 2 rollouts; batch sizes that do not divide; a rollout context or dynamic-batching token cap
    below the longest sequence; a reward table that does not read, or an overlong penalty that ends
    elsewhere than the generation cap or cannot be reached; an evaluated checkpoint
    (``recallm.eval_step``) that would not be saved or kept; missing data files and rows the reward
    cannot score; and whatever verl's own ``validate_config`` rejects.
    """
    from recallm.errors import raise_problems

    raise_problems(problems(cfg))
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    try:
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    except (AssertionError, ValueError) as exc:
        raise RecallmError(
            f"verl rejects the config: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc
