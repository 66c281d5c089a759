"""The settings tree: every knob of a kforge run, with its default.

Each section is its own small model that forbids unknown keys, so a typo in a preset, a YAML file,
an environment variable or a ``key.sub=value`` argument is an error rather than a silently ignored
value. Layering (defaults < preset < --config < KFORGE_* env < CLI overrides) lives in ``loader.py``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from kforge.config.losses import loss_rule
from kforge.config.reward_order import order_problem


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    """The policy model (base weights) and how it is loaded."""

    name: str = Field("Qwen/Qwen2.5-Coder-7B-Instruct", description="HF model id or local folder")
    gguf_file: str | None = Field(None, description="GGUF file inside `name` (dequantised on load)")
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = "bfloat16"
    load_in_4bit: bool = Field(False, description="QLoRA: 4-bit base through bitsandbytes")
    chat_template: str | None = Field(None, description="Jinja chat template overriding the tokenizer's")
    trust_remote_code: bool = False
    max_model_len: int = Field(16384, gt=0, description="prompt + response token limit")
    gradient_checkpointing: bool = True
    # 1.0 stays the default: `auto` is an estimate fitted to a few measurements of one shape (learner/recompute.py).
    recompute_share: float | Literal["auto"] = Field(1.0, description="share of decoder layers that recompute "
                                                     "activations in backward when gradient_checkpointing is on "
                                                     "(lower: faster, more memory); auto = the least that the "
                                                     "learner GPU's memory is estimated to allow")
    checkpoint: str | None = Field(None, description="adapter folder or run checkpoint to start from")

    @field_validator("recompute_share", mode="before")
    @classmethod
    def _share_or_auto(cls, value: object) -> object:
        if value == "auto":
            return value
        try:
            share = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            share = float("nan")
        if isinstance(value, bool) or not 0.0 <= share <= 1.0:  # nan fails too
            raise ValueError(f"{value!r} is neither a share of the decoder layers from 0 to 1 nor auto "
                             "(chosen by the learner GPU's memory)")
        return share


class LoraConfig(Section):
    rank: int = Field(32, gt=0)
    alpha: int = Field(64, gt=0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] | str = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="module names to adapt, or one string as PEFT takes it: 'all-linear' or a regex matched "
                    "against each module's full name")


class DatasetConfig(Section):
    """Which problems, how they are split and batched."""

    source: str = Field(
        "builtin",
        description="builtin | kernelbench (KERNELBENCH_ROOT, an installed kernelbench package, or the cache of "
        "`kforge problems fetch kernelbench`) | hf | path to a .jsonl file or a KernelBench checkout",
    )
    level: list[int] = Field(default_factory=lambda: [1], description="KernelBench level(s)")
    start_problem: int | None = Field(None, description="first problem id (inclusive)")
    end_problem: int | None = Field(None, description="last problem id (inclusive)")
    problems: list[str] = Field(default_factory=list, description="explicit problem names or LEVEL/ID keys")
    backend: Literal["triton", "cuda"] = "triton"
    batch_size: int = Field(8, gt=0, description="problems per training step")
    group_size: int = Field(16, gt=0, description="trajectories per problem (the GRPO group)")
    epochs: int = Field(1, gt=0)
    shuffle: bool = True
    seed: int = 0
    test_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    prompt_option: Literal["zero_shot", "one_shot", "few_shot", "raicl", "compact"] = Field(
        "one_shot", description="compact = short instructions + an answer skeleton, no examples (small models, CPU)"
    )
    rag_index_path: str | None = Field(None, description="FAISS index folder for prompt_option=raicl")
    raicl_k: int = Field(3, ge=0)


class EpisodeConfig(Section):
    """Multi-turn refinement: how long an episode runs and when it stops."""

    mode: Literal["single_turn", "multi_turn"] = "multi_turn"
    max_turns: int = Field(4, gt=0)
    gamma: float = Field(0.4, ge=0.0, le=1.0, description="discount of later turn scores")
    early_stop_on_correct: bool = True
    speedup_threshold: float | None = Field(None, description="keep refining correct kernels until this speedup")
    thinking: bool = Field(False, description="ask for <think>...</think> before the kernel")
    context_budget_tokens: int = Field(12288, gt=0, description="prompt budget; oldest attempts dropped first")
    keep_thinking: bool = Field(False, description="show the latest attempt's <think> text in the next prompt")
    max_failed_turns: int = Field(0, ge=0, description="stop a trajectory after this many failed turns in a row; 0 = off")


class RolloutConfig(Section):
    backend: Literal["auto", "vllm", "hf"] = "auto"
    max_tokens: int = Field(4096, gt=0, description="max new tokens per turn")
    temperature: float = Field(0.9, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, description="-1 = off")
    gpu_memory_utilization: float = Field(0.5, gt=0.0, le=1.0)
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    sleep_between_phases: bool = Field(True, description="sleep the engine while the learner shares its GPU")
    mode: Literal["step", "continuous"] = Field(
        "step", description="step: a step's rollouts all end before its learner step (one step ahead with "
        "max_staleness=1); continuous: each GRPO group (one problem x group_size chains) joins a learner batch "
        "once all its chains stopped, the learner takes the first dataset.batch_size completed groups (oldest "
        "start version first) and a new group starts as soon as admission allows (max_staleness, "
        "max_groups_in_flight). On a split placement generation goes on while the learner trains; colocated "
        "(or on a CPU) engine calls pause during the learner's step (the engines sleep) while evaluations go on")
    max_staleness: int = Field(0, ge=0, validate_default=True, description="policy versions rollouts may lag; 0 = "
                               "on-policy, 1 = the next "
                               "step's rollouts run during the learner's step (on GPUs split from the learner's); "
                               "continuous mode: the bound of its admission (1 or more), a completed group "
                               "older than it when the learner takes it is dropped")
    max_groups_in_flight: int = Field(0, ge=0, description="continuous mode: groups started and not yet complete "
                                      "at once; 0 = 2 x dataset.batch_size")

    @field_validator("max_staleness")
    @classmethod
    def _one_step_ahead(cls, value: int, info: ValidationInfo) -> int:
        if info.data.get("mode") == "continuous":
            if value < 1:
                raise ValueError("continuous mode needs rollout.max_staleness=1 or more (0 would wait for every group: "
                                 "that is rollout.mode=step)")
            return value
        if value > 1:  # the trainer starts at most one step ahead, so a larger lag would never happen
            raise ValueError(f"{value} is more than kforge does: rollouts run at most one step ahead of the learner; "
                             "use 0 (on-policy) or 1 (pipelined), or rollout.mode=continuous")
        return value

    @property
    def pipelined(self) -> bool:
        """The next step's rollouts start while the learner trains (step mode, max_staleness=1): the planner
        splits the GPUs for it. Continuous mode takes the plan an on-policy run gets."""
        return self.mode == "step" and self.max_staleness >= 1

    hf_batch_size: int = Field(8, gt=0, description="prompts per generate() call of the hf backend")
    request_timeout_s: float = Field(1800.0, gt=0.0, description="deadline of one call to the rollout engine "
                                     "(a generation queued behind a whole step's others, an adapter load)")


class RewardConfig(Section):
    """Turn score = sum of weighted components (each logged on its own)."""

    format_weight: float = 0.1
    compile_weight: float = 0.1
    correctness_weight: float = 1.0
    speed_weight: float = 1.0
    length_weight: float = 0.0
    thinking_weight: float = 0.0
    speed_form: Literal["capped", "log", "kevin", "threshold"] = "capped"
    speed_cap: float = Field(3.0, gt=0.0, description="upper bound of speedup-1 in the capped form")
    speed_threshold: float = Field(1.2, gt=0.0, description="threshold form: speed reward 1 from this speedup on (Fast@p)")
    partial_credit: float = Field(
        0.25, ge=0.0, lt=1.0, description="incorrect kernels earn this x trials passed / trials of the correctness weight"
    )
    flagged_penalty: float = Field(-1.0, le=0.0, description="whole score of a flagged (reward-hacking) kernel")
    coverage_scaled_speed: bool = Field(
        False, description="multiply a positive speed reward by verdict.coverage (not measured = unscaled)"
    )
    length_target_tokens: int = Field(2048, gt=0, description="responses shorter than this lose nothing")


class LearnerConfig(Section):
    loss_fn: Literal["importance_sampling", "ppo", "grpo", "dr_grpo", "nll"] = Field(
        "dr_grpo", description="nll = -advantage x log-prob, no ratio (what `kforge sft` trains with, advantage 1)")
    learning_rate: float = Field(2e-5, ge=0.0, description="0 = a control run that never moves the weights")
    weight_decay: float = 0.0
    warmup_steps: int = Field(5, ge=0)
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    grad_clip: float = Field(0.05, gt=0.0)
    num_substeps: int = Field(1, gt=0, description="optimiser steps per batch")
    micro_batch_tokens: int = Field(16384, gt=0, description="token budget of one micro-batch: real tokens of "
                                    "a packed row, or rows x longest row when padded")
    pack: bool = Field(True, description="packed micro-batches: whole samples one after another in one row, "
                       "position_ids restarting per sample, attention per sample (variable-length on a GPU); "
                       "false = left-padded rows")
    logprob_chunk: int = Field(1024, ge=0, description="response positions per chunk of the LM head and "
                               "log-softmax, recomputed in backward (never all [tokens, vocab] logits at once); "
                               "0 = full logits")
    bf16_autocast: bool = Field(False, description="learner forward/backward under bf16 autocast (LoRA matmuls "
                                "in bf16 on bf16 inputs, fp32 adapter weights and AdamW state); for GPUs")
    loss_aggregation: Literal["token_mean", "sequence_mean"] = "token_mean"
    advantage_baseline: Literal["mean", "leave_one_out"] = "mean"
    normalize_std: bool | None = Field(None, description="None = by loss: grpo yes, dr_grpo no")
    remove_constant_reward_groups: bool = True
    shuffle_advantages: bool = Field(False, description="control run: permute each step's advantages across all "
                                     "its samples before the update (same step sizes, no tie to the reward)")
    drop_truncated: bool = Field(False, description="leave responses cut at rollout.max_tokens out of the loss "
                                 "(they still count in their group's advantage baseline)")
    clip_low: float = Field(0.2, ge=0.0)
    clip_high: float = Field(0.28, ge=0.0)
    is_clip: float = Field(2.0, gt=0.0, description="truncated importance-sampling cap C")
    kl_coef: float = Field(0.0, ge=0.0)
    kl_discount: float = Field(1.0, ge=0.0, le=1.0, description="discount of the later tokens' log ratios "
                               "subtracted from a token's advantage (1: the sequence KL's exact gradient with k2)")
    kl_estimator: Literal["k2", "k3"] = Field("k2", description="KL penalty as a loss: k2 (with kl_discount=1 "
                                              "its gradient is the sequence KL's) or k3 (low variance, biased)")
    entropy_coef: float = Field(0.0, ge=0.0, description="entropy bonus weight (0.001 in the seed recipe)")
    mismatch_reject_ratio: float | None = Field(
        None, gt=1.0, description="drop sequences whose geometric-mean rollout/learner ratio is outside [1/x, x]"
    )
    mismatch_token_veto: float | None = Field(
        None, gt=0.0, lt=1.0, description="drop sequences with any token's rollout/learner ratio below this"
    )
    min_coverage: float | None = Field(
        None, ge=0.0, le=1.0, description="reject samples whose measured kernel coverage is below this"
    )
    call_timeout_s: float = Field(1800.0, gt=0.0, description="deadline of one call to the learner process (a step)")

    @field_validator("kl_estimator", mode="before")
    @classmethod
    def _no_k1(cls, value: object) -> object:
        if value == "k1":
            raise ValueError("k1 cannot be a KL loss: its expected gradient is 0, it regularises nothing; "
                             "use k2 (exact with learner.kl_discount=1) or k3")
        return value


class EvaluatorConfig(Section):
    num_correct_trials: int = Field(5, gt=0)
    measure_performance: bool = True
    timing_trials: int = Field(100, gt=0)
    warmup_trials: int = Field(3, ge=0)
    atol_fp32: float = 1e-4
    rtol_fp32: float = 1e-4
    atol_half: float = 1e-2
    rtol_half: float = 1e-2
    compile_timeout_s: float = Field(180.0, gt=0.0)
    run_timeout_s: float = Field(120.0, gt=0.0)
    workers_per_gpu: int = Field(2, gt=0, description="correctness children per eval GPU")
    cpu_workers: int = Field(2, gt=0, description="children on a machine without a GPU")
    build_workers: int = Field(4, gt=0, description="parallel CUDA compiles")
    baseline: Literal["eager", "compile"] = "eager"
    baseline_file: str | None = Field(None, description="KernelBench baseline JSON instead of timing it here")
    memory_limit_gb: float = Field(32.0, gt=0.0, description="RLIMIT_DATA of a candidate child")
    sandbox_restrict_reads: bool = Field(
        True, description="Landlock: children read only system and Python folders (not home folders, not kforge's caches)"
    )
    timing_timeout_s: float = Field(300.0, gt=0.0, description="budget of the whole timing stage of one candidate")
    cpu_timing_calls: int = Field(3, gt=0, description="timed calls on a machine without a GPU (protocol only)")
    timing_output_gb: float = Field(64.0, gt=0.0, description="outputs all timed calls of one candidate may copy "
                                    "out for the parent to read: problems with bigger outputs get fewer timed calls "
                                    "(at least 5)")
    sample_points: int = Field(64, gt=0, description="output values per timed call that the parent checks")
    full_compare_mb: float = Field(256.0, gt=0.0, description="trial outputs up to this size are compared whole; "
                                   "larger ones (multi-GB KernelBench outputs) at compare_points positions")
    compare_points: int = Field(1 << 20, gt=0, description="random positions compared per large output, besides "
                                "its first and last 4096 values")
    coverage: bool = Field(False, description="profile every correct candidate's share of GPU time in its own "
                           "kernels (one timed call under the profiler: ~6 s of profiler start-up per candidate on "
                           "an H100). Off, only a candidate whose outputs PyTorch finished is profiled (the judge "
                           "needs its share); `kforge train` turns it on when reward.coverage_scaled_speed or "
                           "learner.min_coverage uses it")
    timing_budget_s: float = Field(1.0, gt=0.0, description="a candidate's timed calls stop once they took this long "
                                   "(after at least 20, or all when fewer are planned): a kernel of milliseconds "
                                   "is timed in about this, a sub-millisecond one runs all its calls sooner")
    timing_ratio: float = Field(2.0, ge=1.0, description="flag timing_inconsistent when the parent's clock says "
                                "the calls took more than this times what the child reported; a speedup never "
                                "exceeds this times what the parent's clock allows")
    startups_per_gpu: int = Field(0, ge=0, description="children of one GPU that may be starting at once (fork to "
                                  "READY: CUDA context, imports, model); 0: no limit. Contexts are made one at a "
                                  "time by the driver, and a timer waits for every start-up under way")
    timing_rechecks: int = Field(2, ge=1, description="paired re-measures beside a trusted twin before a timing "
                                 "flag (recheck.py): the flag stands only when every one shows it; each costs a "
                                 "fresh reference child and 16 pairs of calls, made only for a candidate already "
                                 "found inconsistent")
    timing_slack_ms: float = Field(0.15, ge=0.0, description="per-call allowance added to that comparison (plus "
                                   "half the reference's per-call overhead): the resolution of the parent's clock")
    inputs_reuse: int = Field(1, ge=1, description="evaluations of one problem that share one draw of trial, decoy "
                              "and timing inputs (the parent draws them; 1: every evaluation its own). Each draw "
                              "costs one run of the reference on the new inputs; its timing is drawn once")
    pids_max: int = Field(1024, gt=0, description="cgroup pids.max of a child (threads included)")
    static_checks: bool = Field(True, description="reject sources that use what no kernel needs (off only to "
                                "test the layers below)")
    audit_hook: bool = Field(True, description="in-child audit hook (off only to test the layers below)")
    verdict_timeout_s: float = Field(3600.0, gt=0.0, description="deadline of one verdict from its submission "
                                     "(queueing included): past it the eval pool is taken as stuck")
    reference_retry_s: float = Field(60.0, ge=0.0, description="a failed reference is computed again after this "
                                     "back-off (doubling per failure, up to 64x), never kept for the whole run")


class LogConfig(Section):
    runs_dir: str = "runs"
    run_name: str | None = None
    save_every: int = Field(10, ge=0)
    eval_every: int = Field(0, ge=0, description="held-out eval cadence in steps; 0 = off")
    tensorboard: bool = True
    tb_histograms_every: int = Field(10, ge=0)
    per_level_metrics: bool = Field(False, description="reward and correctness per KernelBench level")
    samples_max_mb: float = Field(16.0, ge=0.0, description="cap of one step's transcript (samples/step_N.jsonl); 0 = off")
    stall_warn_s: float = Field(120.0, gt=0.0, description="say which stage waits on what when nothing in it "
                                "has moved for this long")
    wandb_project: str | None = None
    wandb_name: str | None = None


class PlacementConfig(Section):
    """GPU indices (after CUDA_VISIBLE_DEVICES); empty = let the planner choose."""

    rollout: list[int] = Field(default_factory=list)
    learner: list[int] = Field(default_factory=list)
    eval: list[int] = Field(default_factory=list)
    allow_cpu: bool = Field(False, description="start a config that wants a GPU (kernel timing) on a machine "
                            "without one: nothing is timed, and a 7B model trains on the CPU for days")

    def chosen(self) -> dict[str, list[int]]:
        """The roles given GPUs, for the planner."""
        return {role: ids for role in ("rollout", "learner", "eval") if (ids := getattr(self, role))}


class KforgeConfig(BaseModel):
    """The whole resolved configuration of one run. A plain model: the KFORGE_* environment is read by the
    loader alone (one parser for every layer), never by constructing this class."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    preset: str | None = Field(None, description="name of the preset this config started from")
    max_steps: int | None = Field(None, gt=0, description="stop after this many steps")

    model: ModelConfig = Field(default_factory=ModelConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    episode: EpisodeConfig = Field(default_factory=EpisodeConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    evaluator: EvaluatorConfig = Field(default_factory=EvaluatorConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)

    @model_validator(mode="after")
    def _reward_order(self) -> "KforgeConfig":
        """Refuse reward weights that let an incorrect kernel outrank a correct one, at resolve time
        (before any model is loaded); reported at `reward` through the loader's one-line error."""
        problem = order_problem(self.reward, self.episode.thinking)
        if problem is not None:
            error = PydanticCustomError("reward_order", problem)
            raise ValidationError.from_exception_data(
                type(self).__name__, [InitErrorDetails(type=error, loc=("reward",), input=self.reward.model_dump())]
            )
        return self

    @model_validator(mode="after")
    def _clipped_when_stale(self) -> "KforgeConfig":
        """Samples two or more versions behind need the clipped, importance-corrected loss (ppo, grpo, dr_grpo):
        a loss without the clip moves the policy by an unbounded step on them."""
        loss = self.learner.loss_fn
        if self.rollout.max_staleness >= 2 and loss_rule(loss).surrogate != "clipped":
            error = PydanticCustomError("stale_unclipped", f"{loss} has no clipped importance ratio, which samples "
                                        f"rollout.max_staleness={self.rollout.max_staleness} versions behind need: "
                                        "use ppo, grpo or dr_grpo, or rollout.max_staleness=1")
            raise ValidationError.from_exception_data(
                type(self).__name__, [InitErrorDetails(type=error, loc=("learner", "loss_fn"), input=loss)])
        return self

    @property
    def turns(self) -> int:
        """Turns an episode may take: 1 in single-turn mode."""
        return 1 if self.episode.mode == "single_turn" else self.episode.max_turns
