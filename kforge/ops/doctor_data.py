"""`kforge doctor`: the model, the problems, the RAG index and the disk."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import urllib.error
import urllib.request
from pathlib import Path

from kforge.config.schema import KforgeConfig
from kforge.ops.doctor_base import GIB, CheckResult
from kforge.policy.prompts import PROMPT_OPTIONS

# --------------------------------------------------------------------------------------------- model


def _hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_cached(repo_id: str) -> str | None:
    """The local snapshot folder when the model's config and weights are in the Hugging Face cache."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(repo_id, "config.json")
    if not isinstance(found, str):
        return None
    snap = Path(found).parent
    if any(snap.glob("*.safetensors")) or any(snap.glob("*.bin")) or any(snap.glob("*.gguf")):
        return str(snap)
    return None


def hub_head(repo_id: str, timeout_s: float = 5.0) -> tuple[int | None, str]:
    """HTTP status of the model's config.json on the hub (None when unreachable)."""
    url = f"{_hub_endpoint()}/{repo_id}/resolve/main/config.json"
    req = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, url
    except urllib.error.HTTPError as exc:
        return exc.code, url
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return None, f"{url}: {getattr(exc, 'reason', exc)}"


def check_model(cfg: KforgeConfig, hub_timeout_s: float = 5.0) -> list[CheckResult]:
    from kforge.modelio import ModelLoadError, cache_root, resolve_model

    name = cfg.model.name
    rows = []
    try:
        ref = resolve_model(name, cfg.model.gguf_file, dense=False)  # dense=False: no 15 s GGUF conversion here
    except ModelLoadError as exc:
        return [CheckResult("model", "fail", str(exc).split("; run")[0], _fix_of(str(exc)))]
    folder = Path(os.path.expanduser(ref.path))
    if name.startswith("pkg:") or folder.is_dir():
        if ref.gguf_file:
            gguf = folder / ref.gguf_file
            if not gguf.is_file():
                return [CheckResult("model", "fail", f"{name}: no GGUF file {gguf}",
                                    "set model.gguf_file to a file in the folder")]
            cached = any((cache_root() / "models").glob(f"{gguf.stem}-*/config.json"))
            rows.append(CheckResult("model", "pass", f"{name}: {gguf} ({gguf.stat().st_size / 2**20:.0f} MiB GGUF; "
                                    + ("dense copy cached" if cached else "first run converts it to a dense copy, ~15 s")
                                    + ")"))
        elif (folder / "config.json").is_file() and (any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))):
            rows.append(CheckResult("model", "pass", f"local folder {folder}"))
        else:
            rows.append(CheckResult("model", "fail", f"{folder} has no config.json with weights (*.safetensors)",
                                    "point model.name at a Hugging Face model folder, a hub id, or pkg:<package>"))
    elif name.startswith(("/", "./", "../", "~")) or name.count("/") > 1:
        rows.append(CheckResult("model", "fail", f"model.name {name!r}: no such folder, and not a hub id (org/name)",
                                "give a local model folder, a hub id like Qwen/Qwen2.5-Coder-7B-Instruct, or pkg:<package>"))
    else:
        from kforge.problems.hub import hub_unreachable

        snap = hub_cached(name)
        unreachable = hub_unreachable()  # asked once per process: train's loads then skip the hub's retries
        if snap:
            rows.append(CheckResult("model", "pass", f"{name}: in the local Hugging Face cache ({snap})"))
        elif unreachable:
            rows.append(CheckResult("model", "fail", f"{name}: not in the Hugging Face cache and {unreachable}",
                                    f"download it first (`hf download {name}`) or point model.name at a local folder"))
        else:
            code, where = hub_head(name, hub_timeout_s)
            if code is not None and code < 400:
                rows.append(CheckResult("model", "pass", f"{name}: reachable on the hub (downloaded on first use)"))
            elif code in (401, 403):
                rows.append(CheckResult("model", "warn", f"{name}: the hub answered {code} (gated, private or misspelt)",
                                        "accept the licence on the model page and log in (`hf auth login`), "
                                        "or check the id"))
            elif code == 404:
                rows.append(CheckResult("model", "fail", f"{name}: not found on the hub", "check model.name"))
            else:
                rows.append(CheckResult("model", "fail", f"{name}: the hub did not answer ({where}); not cached either",
                                        f"on a machine with internet: `hf download {name}`, or use a local folder"))
    if cfg.model.checkpoint:
        ck = Path(cfg.model.checkpoint)
        found = ck.is_dir() and (any(ck.rglob("adapter_config.json")))
        rows.append(CheckResult("model checkpoint", "pass" if found else "fail",
                                f"{ck}" + ("" if found else ": no adapter_config.json in it"),
                                "" if found else "point model.checkpoint at an adapter folder or a run checkpoint"))
    return rows


def _fix_of(message: str) -> str:
    m = re.search(r"run `([^`]+)`", message)
    return m.group(1) if m else "check model.name"


# ------------------------------------------------------------------------------------ problems, RAG, disk


def check_problems(cfg: KforgeConfig) -> list[CheckResult]:
    from kforge.problems import problems_from_config, split_problems

    ds = cfg.dataset
    try:
        problems = problems_from_config(ds)
        train, test = split_problems(problems, ds.test_fraction, ds.seed)
    except Exception as exc:  # ProblemSourceError and whatever a broken source raises: a run could not start
        return [CheckResult("problems", "fail", f"source {ds.source!r}: {exc}",
                            f"`kforge problems ls --source {ds.source}` shows what it holds; fix dataset.source/level")]
    if not train:
        return [CheckResult("problems", "fail", f"{len(problems)} problems but the training split is empty",
                            "lower dataset.test_fraction or select more problems")]
    return [CheckResult("problems", "pass", f"{len(problems)} from {ds.source!r} level {list(ds.level)}: "
                        f"{len(train)} train, {len(test)} held out")]


def _embedder_dim(folder: Path) -> int | None:
    """The output size of a sentence-transformers folder, read from its module configs (no model load)."""
    dim = None
    try:
        modules = json.loads((folder / "modules.json").read_text())
    except (OSError, json.JSONDecodeError):
        modules = []
    for mod in modules:
        cfg_file = folder / mod.get("path", "") / "config.json"
        try:
            conf = json.loads(cfg_file.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if mod.get("type", "").endswith("Pooling"):
            dim = conf.get("word_embedding_dimension", dim)
        elif mod.get("type", "").endswith("Dense"):
            dim = conf.get("out_features", dim)
    return dim


def _embedder_folder(name: str) -> Path | None:
    if name.startswith("pkg:"):
        spec = importlib.util.find_spec(name[4:])
        if spec is None or not spec.submodule_search_locations:
            return None
        base = Path(list(spec.submodule_search_locations)[0])
        return base / "model" if (base / "model").is_dir() else base
    if Path(name).is_dir():
        return Path(name)
    snap = hub_cached(name) if name.count("/") == 1 else None
    return Path(snap) if snap else None


def check_rag(cfg: KforgeConfig) -> list[CheckResult]:
    ds = cfg.dataset
    if not PROMPT_OPTIONS[ds.prompt_option].retrieves:
        return [CheckResult("rag index", "pass", f"not used (prompt_option={ds.prompt_option})")]
    build = f"kforge rag build --backend {ds.backend}"
    if not ds.rag_index_path:
        return [CheckResult("rag index", "fail", "prompt_option=raicl but dataset.rag_index_path is not set",
                            f"{build}, then set dataset.rag_index_path to its folder")]
    folder = Path(ds.rag_index_path)
    if not folder.is_dir():
        return [CheckResult("rag index", "fail", f"no index folder {folder} (relative to {Path.cwd()})",
                            f"{build} (or set dataset.rag_index_path to an existing index)")]
    from kforge.rag.errors import RagError
    from kforge.rag.manifest import embedder_of, leak_guard, read_manifest, read_raw

    try:  # read once: the leak guard is read from it, and then what it says of the index
        raw = read_raw(folder)
    except RagError as exc:
        return [CheckResult("rag index", "fail", str(exc), f"rebuild it: {build}")]
    rows = check_rag_leak(cfg, leak_guard(raw))  # first: an index that leaks is refused whatever else
    try:
        embedder, dim = embedder_of(read_manifest(folder, raw))
    except RagError as exc:
        return rows + [CheckResult("rag index", "fail", str(exc), f"rebuild it: {build}")]
    try:
        import kforge.rag as rag

        if not hasattr(rag, "load_retriever"):
            rows.append(CheckResult("rag code", "fail", "kforge.rag has no load_retriever in this install",
                                    "update kforge; RA-ICL prompts are not available in this version"))
    except ImportError as exc:
        rows.append(CheckResult("rag code", "fail", f"kforge.rag does not import: {exc}", "pip install 'kforge[rag]'"))
    index_files = sorted(folder.glob("*.faiss")) or sorted(folder.glob("index*"))
    if not index_files:
        return rows + [CheckResult("rag index", "fail", f"{folder}: manifest but no *.faiss index file", f"rebuild: {build}")]
    index_dim, count = None, None
    if importlib.util.find_spec("faiss") is not None:
        try:
            import faiss

            index = faiss.read_index(str(index_files[0]))
            index_dim, count = int(index.d), int(index.ntotal)
        except Exception as exc:  # a corrupt or foreign file
            return rows + [CheckResult("rag index", "fail", f"{index_files[0]}: faiss cannot read it: {exc}",
                                       f"rebuild: {build}")]
    emb_folder = _embedder_folder(str(embedder)) if embedder else None
    emb_dim = _embedder_dim(emb_folder) if emb_folder else None
    problems = []
    if embedder and emb_folder is None:
        problems.append(f"embedder {embedder} is not available locally")
    if dim is not None and index_dim is not None and dim != index_dim:
        problems.append(f"manifest dim {dim} != index dim {index_dim}")
    if emb_dim is not None and (index_dim or dim) is not None and emb_dim != (index_dim or dim):
        problems.append(f"embedder {embedder} gives {emb_dim}-d vectors, index holds {index_dim or dim}-d")
    detail = f"{folder}: {count if count is not None else '?'} vectors, dim {index_dim or dim or '?'}, embedder {embedder or '?'}"
    if problems:
        rows.append(CheckResult("rag index", "fail", detail + "; " + "; ".join(problems),
                                f"rebuild with the embedder you use: {build}"))
    else:
        rows.append(CheckResult("rag index", "pass", detail))
    return rows


def check_rag_leak(cfg: KforgeConfig, guard: dict | None) -> list[CheckResult]:
    """An RA-ICL index must leave out this run's held-out problems, or its examples could hand the answers of
    the very problems the run is measured on to the prompts. `guard`: the index manifest's leak guard."""
    from kforge.problems import ProblemSourceError, problems_from_config, split_problems

    ds = cfg.dataset
    if guard is None:
        return []  # an index from before the leak guard recorded anything
    try:
        held_out = split_problems(problems_from_config(ds), ds.test_fraction, ds.seed)[1]
    except (ValueError, OSError, ProblemSourceError):
        return []
    missing = sorted({p.key for p in held_out} - set(guard.get("protected") or []))
    if not missing:
        return [CheckResult("rag leak guard", "pass", f"the index leaves out all {len(held_out)} held-out problems")]
    return [CheckResult("rag leak guard", "fail",
                        f"RAG index {ds.rag_index_path} does not leave out {len(missing)} of this run's "
                        f"{len(held_out)} held-out problems (e.g. {', '.join(missing[:3])})",
                        f"rebuild it for this config: kforge rag build --preset {cfg.preset or 'default'} "
                        f"--out {ds.rag_index_path}")]


def _existing_parent(path: Path) -> Path:
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(runs_dir: Path, fail_below_gib: float = 1.0, warn_below_gib: float = 10.0) -> list[CheckResult]:
    where = _existing_parent(Path(runs_dir))
    free = shutil.disk_usage(where).free / GIB  # whether it can be written is the pre-flight's folder row
    detail = f"{free:.1f} GiB free at {where} (runs go to {runs_dir})"
    if free < fail_below_gib:
        return [CheckResult("disk", "fail", detail,
                            f"free space or choose another log.runs_dir (needs >= {fail_below_gib:g} GiB)")]
    if free < warn_below_gib:
        return [CheckResult("disk", "warn", detail, f"checkpoints and merged exports of big models need more than "
                            f"{warn_below_gib:g} GiB; free space or choose another log.runs_dir")]
    return [CheckResult("disk", "pass", detail)]
