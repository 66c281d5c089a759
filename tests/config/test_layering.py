"""Config layering: defaults < preset < --config < env < command line; strict keys; YAML round trip."""

import subprocess
import sys

import pytest
import yaml

from kforge.config.loader import ConfigError, parse_overrides, preset_names, resolve, to_yaml
from kforge.config.schema import KforgeConfig


def test_presets_exist_and_validate(clean_env):
    assert {"tiny", "kevin", "raicl", "default"} <= set(preset_names())
    for name in preset_names():
        cfg = resolve(name).config
        assert cfg.preset == name


def test_kevin_preset_means_kevin(clean_env):
    cfg = resolve("kevin").config
    assert cfg.episode.mode == "multi_turn" and cfg.episode.max_turns == 4
    assert cfg.episode.gamma == pytest.approx(0.4)
    assert cfg.dataset.group_size == 16
    assert cfg.reward.thinking_weight == 0.0 and not cfg.episode.thinking


def test_each_layer_overrides_the_one_below(tmp_path, clean_env):
    default = KforgeConfig().learner.learning_rate
    preset = resolve("tiny")
    assert preset.config.learner.learning_rate != default
    assert preset.origin("learner.learning_rate") == "preset tiny"

    cfg_file = tmp_path / "my.yaml"
    cfg_file.write_text("learner:\n  learning_rate: 0.5\ndataset:\n  group_size: 5\n")
    r = resolve("tiny", cfg_file)
    assert r.config.learner.learning_rate == 0.5
    assert r.config.dataset.batch_size == 2  # from the preset, kept by the deep merge
    assert r.origin("learner.learning_rate").startswith("--config")

    env = {"KFORGE_LEARNER__LEARNING_RATE": "0.25"}
    r = resolve("tiny", cfg_file, environ=env)
    assert r.config.learner.learning_rate == 0.25
    assert r.config.dataset.group_size == 5
    assert r.origin("learner.learning_rate") == "env"

    r = resolve("tiny", cfg_file, ["learner.learning_rate=0.125"], environ=env)
    assert r.config.learner.learning_rate == 0.125
    assert r.origin("learner.learning_rate") == "command line"
    assert r.origin("lora.dropout") == "default"


def test_env_nesting_and_types(clean_env):
    env = {"KFORGE_DATASET__LEVEL": "[1, 3]", "KFORGE_EPISODE__THINKING": "true", "KFORGE_MAX_STEPS": "7"}
    cfg = resolve("tiny", environ=env).config
    assert cfg.dataset.level == [1, 3]
    assert cfg.episode.thinking is True
    assert cfg.max_steps == 7


def test_process_environment_is_read(clean_env):
    clean_env.setenv("KFORGE_DATASET__GROUP_SIZE", "3")
    assert resolve("tiny").config.dataset.group_size == 3


def test_dot_overrides_lists_and_booleans(clean_env):
    cfg = resolve(
        "tiny",
        overrides=["dataset.level=[1,2]", "episode.early_stop_on_correct=false", "lora.target_modules=[q_proj,k_proj]",
                   "episode.speedup_threshold=1.5", "model.name=/models/x"],
    ).config
    assert cfg.dataset.level == [1, 2]
    assert cfg.episode.early_stop_on_correct is False
    assert cfg.lora.target_modules == ["q_proj", "k_proj"]
    assert cfg.episode.speedup_threshold == 1.5
    assert cfg.model.name == "/models/x"


@pytest.mark.parametrize(
    "kwargs, key, layer, hint",
    [
        ({"overrides": ["dataset.batchsize=3"]}, "dataset.batchsize", "command line", "dataset.batch_size"),
        ({"overrides": ["group_size=3"]}, "group_size", "command line", "dataset.group_size"),
        ({"environ": {"KFORGE_LEARNER__LEARNIN_RATE": "1"}}, "KFORGE_LEARNER__LEARNIN_RATE", "env",
         "KFORGE_LEARNER__LEARNING_RATE"),  # the suggestion in the form the key was given
    ],
)
def test_unknown_keys_name_key_layer_and_suggestion(kwargs, key, layer, hint, clean_env):
    with pytest.raises(ConfigError) as info:
        resolve("tiny", **kwargs)
    msg = str(info.value)
    assert key in msg and f"from {layer}" in msg and hint in msg
    assert "\n" not in msg


def test_unknown_key_in_config_file(tmp_path, clean_env):
    f = tmp_path / "bad.yaml"
    f.write_text("rollout:\n  temprature: 0.5\n")
    with pytest.raises(ConfigError, match=r"rollout.temprature .*from --config .*rollout.temperature"):
        resolve("tiny", f)


def test_invalid_value_names_key_and_layer(clean_env):
    with pytest.raises(ConfigError, match=r"dataset.batch_size \(from command line\)"):
        resolve("tiny", overrides=["dataset.batch_size=-1"])
    with pytest.raises(ConfigError, match=r"episode.mode"):
        resolve("tiny", overrides=["episode.mode=three_turn"])


def test_a_staleness_the_trainer_never_reaches_is_refused_in_one_line(clean_env):
    """Rollouts run at most one step ahead of the learner: max_staleness=2 used to be accepted and act as 1."""
    assert resolve("tiny", overrides=["rollout.max_staleness=1"]).config.rollout.max_staleness == 1
    with pytest.raises(ConfigError, match=r"rollout.max_staleness \(from command line\).*use 0 \(on-policy\) or 1") as info:
        resolve("tiny", overrides=["rollout.max_staleness=2"])
    assert "\n" not in str(info.value)


def test_unknown_preset_and_bad_override_syntax(clean_env):
    with pytest.raises(ConfigError, match="did you mean tiny"):
        resolve("tinyy")
    with pytest.raises(ConfigError, match="key.sub=value"):
        parse_overrides(["dataset.batch_size"])


def test_yaml_round_trip(tmp_path, clean_env):
    cfg = resolve("kevin", overrides=["dataset.level=[2]", "episode.speedup_threshold=1.2"]).config
    f = tmp_path / "round.yaml"
    f.write_text(to_yaml(cfg))
    again = resolve(None, f).config
    assert again == cfg
    assert yaml.safe_load(to_yaml(again)) == yaml.safe_load(f.read_text())


def _kforge(*args, env=None):
    return subprocess.run([sys.executable, "-m", "kforge", *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.slow  # `kforge config` processes
def test_cli_config_show_and_errors(tmp_path, clean_env):
    out = _kforge("config", "show", "--preset", "tiny", "--yaml", "dataset.batch_size=3")
    assert out.returncode == 0, out.stderr
    f = tmp_path / "c.yaml"
    f.write_text(out.stdout)
    back = _kforge("config", "show", "--config", str(f), "--yaml")
    assert back.stdout == out.stdout
    bad = _kforge("config", "show", "--preset", "tiny", "dataset.bach_size=3")
    assert bad.returncode == 2
    assert "dataset.bach_size" in bad.stderr and "dataset.batch_size" in bad.stderr
    table = _kforge("config", "show", "--preset", "kevin", "episode.gamma=0.5")
    assert table.returncode == 0 and "command line" in table.stdout and "preset kevin" in table.stdout


def test_a_preset_longer_than_the_model_context_is_capped_in_one_line(tmp_path):
    from transformers import LlamaConfig

    from kforge.modelio import fit_context

    LlamaConfig(max_position_embeddings=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                num_attention_heads=4, vocab_size=128).save_pretrained(tmp_path)
    resolved = resolve(overrides=[f"model.name={tmp_path}", "model.max_model_len=16384", "rollout.max_tokens=1024"])
    said: list[str] = []
    fitted = fit_context(resolved, said.append)
    cfg = fitted.config
    assert cfg.model.max_model_len == 2048 and cfg.episode.context_budget_tokens == 1024
    assert len(said) == 1 and "longer than" in said[0] and "(2048)" in said[0]
    # a layer of its own, saying where the values came from; the resolved config it came from is unchanged
    assert fitted.origin("model.max_model_len") == fitted.origin("episode.context_budget_tokens") \
        == f"{tmp_path}'s context (2048)"
    assert fitted.origin("model.name") == "command line" and resolved.config.model.max_model_len == 16384
    said.clear()
    assert fit_context(fitted, said.append) is fitted and said == []  # fits now: nothing to say
