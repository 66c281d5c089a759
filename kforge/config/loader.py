"""Config layering: field defaults < preset YAML < --config YAML < KFORGE_* environment < key.sub=value.

Each layer is read into a plain nested dict first, so that an unknown or invalid key can be reported
with the layer it came from and the closest valid key, and so that ``config show`` can say which layer
set every value. The merged dict is then validated once by the schema model; the environment is read here
only (the schema itself never looks at it).
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml
from pydantic import BaseModel, ValidationError

from kforge.config.schema import KforgeConfig
from kforge.errors import UserError

ENV_PREFIX = "KFORGE_"
# Environment variables with the prefix that are not config keys (read elsewhere in kforge).
# KFORGE_ROLE is set by kforge itself in the processes it serves (learner, rollout worker). KFORGE_KERNELBENCH and
# KFORGE_BENCH_ROOT are the benches' (bench/common.py), exported in a shell that runs kforge commands too.
RESERVED_ENV = {"KFORGE_CACHE_DIR", "KFORGE_PRESETS_DIR", "KFORGE_ROLE", "KFORGE_CPU_BF16", "KFORGE_KERNELBENCH",
                "KFORGE_BENCH_ROOT"}


class ConfigError(UserError):
    """A bad config key or value; the message is one line meant for the user."""


@dataclass
class Layer:
    name: str
    data: dict[str, Any]


@dataclass
class ResolvedConfig:
    config: KforgeConfig
    layers: list[Layer] = field(default_factory=list)

    def origin(self, dotted: str) -> str:
        """The highest layer that set this leaf key, or 'default'."""
        for layer in reversed(self.layers):
            if _has_path(layer.data, dotted.split(".")):
                return layer.name
        return "default"

    def derive(self, origin: str, values: dict[str, Any]) -> "ResolvedConfig":
        """This config with `values` (nested like a layer) on top as one more layer named `origin`: a value
        derived from the others (the model's own context, a generated run name) is recorded, with where it
        came from, before anything reads or writes the config; the config itself is never edited."""
        if not values:
            return self
        layer = Layer(origin, values)
        _check_keys(layer)
        try:
            config = KforgeConfig.model_validate(deep_merge(self.config.model_dump(), values))
        except ValidationError as exc:
            raise ConfigError(f"{origin}: {exc.errors()[0]['msg']}") from None
        return ResolvedConfig(config, [*self.layers, layer])


def presets_dir() -> Path:
    """`KFORGE_PRESETS_DIR`, else the presets shipped in the package (`kforge/presets`, a link to the
    top-level `presets/` of a checkout), else that top-level folder itself."""
    env = os.environ.get("KFORGE_PRESETS_DIR")
    if env:
        return Path(env)
    package = Path(__file__).resolve().parent.parent
    inside = package / "presets"
    return inside if inside.is_dir() else package.parent / "presets"


def preset_names() -> list[str]:
    return sorted(p.stem for p in presets_dir().glob("*.yaml"))


def read_yaml(path: Path, what: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{what}: file {path} not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{what}: {path} is a folder; give a YAML file (e.g. kforge config show --yaml > my.yaml)") from None
    except (UnicodeDecodeError, ValueError):
        raise ConfigError(f"{what}: {path} is not a text file; give a YAML file") from None
    except OSError as exc:  # no rights to read it, an I/O error: the file named, not a traceback
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{what}: {path}{where} is not valid YAML; fix the syntax there") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: {path} must hold a mapping of keys, not {type(data).__name__}")
    return data


def parse_scalar(text: str, path: list[str] | None = None) -> object:
    """Values on the command line and in the environment are YAML scalars or flow lists, except for a text
    field (`path` names the key): there the text is kept as written, so `log.run_name=20250101` or
    `model.name=yes` stay text instead of becoming a number, a date or a boolean. `null` still clears it."""
    if path is not None and _is_text_field(path) and text.strip() not in ("null", "~"):
        return text
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def _is_text_field(path: list[str]) -> bool:
    model = _model_at(path[:-1])
    info = model.model_fields.get(path[-1]) if model is not None else None
    if info is None:
        return False
    ann = info.annotation
    options = typing.get_args(ann) if typing.get_origin(ann) in (typing.Union, types.UnionType) else (ann,)
    if any(typing.get_origin(option) is list for option in options):
        return False  # text or a list (lora.target_modules): YAML tells `[a,b]` from `all-linear`
    for option in options:
        if option is str:
            return True
        if typing.get_origin(option) is typing.Literal and all(isinstance(a, str) for a in typing.get_args(option)):
            return True
    return False


def set_path(tree: dict[str, Any], path: list[str], value: object) -> None:
    node = tree
    for key in path[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"key {'.'.join(path)}: {key} is a value, not a section")
    node[path[-1]] = value


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not key.sub=value (e.g. dataset.batch_size=8)")
        path = key.split(".")
        set_path(tree, path, parse_scalar(value, path))
    return tree


def env_layer(environ: Mapping[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in RESERVED_ENV:
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX):].split("__")]
        set_path(tree, path, parse_scalar(value, path))
    return tree


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _has_path(tree: dict[str, Any], path: list[str]) -> bool:
    node: Any = tree
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def _model_at(path: list[str]) -> type[BaseModel] | None:
    model: type[BaseModel] = KforgeConfig
    for key in path:
        info = model.model_fields.get(key)
        ann = info.annotation if info else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


def key_description(dotted: str) -> str:
    """What a config key means: its field's description ("" when it has none)."""
    path = dotted.split(".")
    model = _model_at(path[:-1]) if len(path) > 1 else KforgeConfig
    info = model.model_fields.get(path[-1]) if model is not None else None
    return (info.description or "") if info is not None else ""


def _env_name(dotted: str) -> str:
    return ENV_PREFIX + dotted.upper().replace(".", "__")


def _check_keys(layer: Layer) -> None:
    """Reject unknown keys, naming the layer and the closest valid key."""

    def walk(node: dict[str, Any], path: list[str]) -> None:
        model = _model_at(path)
        if model is None:
            return
        for key, value in node.items():
            if key not in model.model_fields:
                dotted = ".".join(path + [key])
                candidates = [".".join(path + [k]) for k in model.model_fields]
                # Also match a misplaced leaf against every section (e.g. `batch_size` at top level).
                candidates += [f"{s}.{k}" for s, m in _sections() for k in m.model_fields]
                # A short form of a key of the same section first (`lr` of learning_rate, `bs` of batch_size):
                # by spelling alone `learner.lr` is closer to `learner.pack` than to `learner.learning_rate`.
                close = [c for c in candidates[:len(model.model_fields)] if _abbreviates(key, c.rsplit(".", 1)[-1])][:1]
                close = close or difflib.get_close_matches(dotted, candidates, n=1, cutoff=0.5)
                if not close:
                    close = difflib.get_close_matches(key, [c.rsplit(".", 1)[-1] for c in candidates], n=1)
                    close = [c for c in candidates if close and c.endswith("." + close[0])][:1] or close
                env = layer.name == "env"  # said in the form the user wrote it
                hint = f"; did you mean {_env_name(close[0]) if env else close[0]}?" if close else ""
                shown = _env_name(dotted) if env else dotted
                raise ConfigError(f"unknown config key {shown} (from {layer.name}){hint}")
            if isinstance(value, dict):
                walk(value, path + [key])

    walk(layer.data, [])


def _abbreviates(short: str, name: str) -> bool:
    """`short` is the initials of `name`'s words (lr: learning_rate) or, at 3 letters or more, its start."""
    words = [w for w in name.split("_") if w]
    return len(short) > 1 and short != name and (short == "".join(w[0] for w in words)
                                                 or (len(short) >= 3 and name.startswith(short)))


def _sections() -> list[tuple[str, type[BaseModel]]]:
    return [(name, m) for name in KforgeConfig.model_fields if (m := _model_at([name])) is not None]


def resolve(
    preset: str | None = None,
    config_file: str | Path | None = None,
    overrides: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
    config_name: str = "--config",
) -> ResolvedConfig:
    """Build the run config from all layers; raises ConfigError with a one-line message. `config_name` is what
    the file's layer is called in those messages: a run's own config.yaml is not a --config the user gave."""
    layers: list[Layer] = []
    if preset and ("/" in preset or preset.endswith((".yaml", ".yml"))):  # a preset file of the user's
        path = Path(preset).expanduser()
        path = path if path.suffix else path.with_suffix(".yaml")
        if not path.is_file():
            raise ConfigError(f"preset file {path} not found; give a preset name ({', '.join(preset_names())}) "
                              "or a YAML file")
        data = read_yaml(path, f"preset {preset}")
        data.setdefault("preset", preset)
        layers.append(Layer(f"preset {preset}", data))
    elif preset:
        path = presets_dir() / f"{preset}.yaml"
        if not path.exists():
            names = preset_names()
            close = difflib.get_close_matches(preset, names, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; presets: {', '.join(names)}"
            raise ConfigError(f"unknown preset {preset!r}{hint}")
        data = read_yaml(path, f"preset {preset}")
        data.setdefault("preset", preset)
        layers.append(Layer(f"preset {preset}", data))
    if config_file:
        layers.append(Layer(f"{config_name} {config_file}", read_yaml(Path(config_file), config_name)))
    layers.append(Layer("env", env_layer(os.environ if environ is None else environ)))
    layers.append(Layer("command line", parse_overrides(overrides)))

    merged: dict[str, Any] = {}
    for layer in layers:
        _check_keys(layer)
        merged = deep_merge(merged, layer.data)
    try:
        # Validate the merged layers only; the env was already read into its own layer above.
        config = KforgeConfig.model_validate(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        dotted = ".".join(str(p) for p in err["loc"] if not isinstance(p, int))
        resolved = ResolvedConfig(KforgeConfig.model_construct(), layers)
        origin = resolved.origin(dotted) if dotted else "config"
        raise ConfigError(f"invalid value for {dotted} (from {origin}): {err['msg']}") from None
    return ResolvedConfig(config, layers)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def config_changes(before: KforgeConfig, after: ResolvedConfig) -> dict[str, dict[str, Any]]:
    """Every leaf whose value differs, with its old and new value and the layer that set the new one."""
    old, new = flatten(before.model_dump(mode="json")), flatten(after.config.model_dump(mode="json"))
    return {key: {"from": old.get(key), "to": new.get(key), "by": after.origin(key)}
            for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)}


def to_yaml(config: KforgeConfig) -> str:
    """A YAML file that `--config` accepts back unchanged."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def changes_from_preset(config: KforgeConfig) -> dict[str, Any] | None:
    """The keys whose value in `config` is not its preset's (defaults < preset, no environment): what a
    `--config` file, KFORGE_* variables or overrides changed. None when the preset is not found here."""
    try:
        base = resolve(config.preset, environ={}).config
    except ConfigError:
        return None
    ours, theirs = flatten(config.model_dump(mode="json")), flatten(base.model_dump(mode="json"))
    return {key: value for key, value in ours.items() if key not in theirs or theirs[key] != value}
