"""models.yaml -> validated, frozen presets.

Validation happens once, when the file is read, so a typo fails before any model loads and
the message names the preset and the key. Model sources are plain strings in the file:

    bundled:NAME            a model shipped with a Python package (works offline)
    /abs/path/model.gguf    a GGUF file (relative paths start with ./ or ../ or ~)
    ./some/folder           a local save_pretrained folder (starts with /, ./, ../ or ~)
    owner/name              a Hugging Face hub repo id
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import LoadError
from ..policy import DRAFT_LENGTH_BOUNDS
from ..sampling import SamplingParams

# The presets file: the repo top's models.yaml (the one source, edited there); an installed package
# (`pip install .`) carries a copy beside this module, written by setup.py's build step.
PACKAGED_CONFIG = Path(__file__).resolve().parent / "models.yaml"
REPO_CONFIG = Path(__file__).resolve().parents[2] / "models.yaml"
AUTO = "auto"  # the reserved preset name that picks a preset for this machine
CUSTOM = "custom"  # the preset --target/--draft/--eagle build (its name in the app's menu and the API)

DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("4bit", "8bit", "none")
# Every drafter: its name (models.yaml, the API, the CLI: a contract) and its label (the app's menu).
DRAFTER_LABELS = {"model": "draft model", "prompt_lookup": "prompt lookup", "eagle": "EAGLE head", "hybrid": "hybrid",
                  "medusa": "Medusa heads", "layer_skip": "self-speculative (layer skip)",
                  "retrieval": "retrieval (the target's own replies)", "none": "none"}
DRAFTERS = tuple(DRAFTER_LABELS)
CPU_WEIGHTS = ("fp32", "gguf")  # on CPU: dequantised fp32 (prepacked) | the GGUF's own 4-bit blocks
GGUF_KINDS = ("gguf", "bundled")  # sources that are a GGUF file
BUNDLED_PREFIX = "bundled:"
_LOCAL_PREFIXES = ("/", "./", "../", "~")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ConfigError(ValueError):
    """An invalid models.yaml. The message is one line naming the file, preset and key."""


@dataclass(frozen=True)
class ModelSpec:
    """Where one model's weights come from."""

    kind: str  # "hub" | "local" | "gguf" | "bundled"
    location: str  # repo id, absolute path, or bundled model name
    label: str  # as written in the file, for messages

    @property
    def offline(self) -> bool:
        return self.kind != "hub"


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    target: ModelSpec
    draft: ModelSpec | None
    eagle: ModelSpec | None  # an EAGLE-3 head for the target (drafters eagle and hybrid)
    dtype: str
    draft_quantization: str
    drafter: str
    draft_length: int
    adaptive: bool
    memory_gb: float
    download_gb: float
    requires_gpu: bool
    gated: bool
    trust_remote_code: bool
    compile: bool | str  # true | false | "auto" (compiled static cache on CUDA, eager on CPU)
    cpu_weights: str = "fp32"  # "fp32" | "gguf" (the target's GGUF blocks on int4 kernels, CPU only)
    medusa: ModelSpec | None = None  # Medusa heads for the target (drafter medusa)
    retrieval: ModelSpec | None = None  # a datastore of the target's own replies (drafter retrieval)
    # The target's own sampling defaults (temperature / top_p / top_k), for a model whose files
    # carry none: they go into its generation_config, which the API reads for fields a request omits.
    sampling: tuple[tuple[str, float], ...] = ()

    @property
    def offline(self) -> bool:
        """True when no model of this preset comes from the hub."""
        return all(spec is None or spec.offline for spec in (self.target, self.draft, self.eagle, self.medusa,
                                                             self.retrieval))

    def needs(self) -> str:
        """What running it takes, in a few words (for `presets` listings and the UI)."""
        parts = ["offline" if self.offline else f"download {self.download_gb:g} GB"]
        where = "GPU" if self.requires_gpu else "RAM"
        parts.append(f"{where} {self.memory_gb:g} GB")
        if self.gated:
            parts.append("gated: request access on the hub")
        if self.trust_remote_code:
            parts.append("runs code shipped with the model")
        return ", ".join(parts)


@dataclass(frozen=True)
class PresetFile:
    path: Path
    presets: dict[str, Preset]
    auto_fallback: str  # the preset `auto` picks when no GPU preset can run

    def find(self, name: str) -> Preset:
        """The preset called `name`; LoadError (one line, listing the names) if there is none."""
        if name not in self.presets:
            raise LoadError(f"unknown preset '{name}'; available: {', '.join([AUTO, *self.presets])}")
        return self.presets[name]


# key -> (accepted types, default; _REQUIRED when the key must be present)
_REQUIRED = object()
_PRESET_KEYS: dict[str, tuple[tuple[type, ...], Any]] = {
    "description": ((str,), _REQUIRED),
    "target": ((str,), _REQUIRED),
    "draft": ((str, type(None)), None),
    "eagle": ((str, type(None)), None),
    "medusa": ((str, type(None)), None),
    "retrieval": ((str, type(None)), None),
    "dtype": ((str,), "auto"),
    "draft_quantization": ((str,), "none"),
    "drafter": ((str,), _REQUIRED),
    "draft_length": ((int,), 5),
    "adaptive": ((bool,), True),
    "memory_gb": ((int, float), _REQUIRED),
    "download_gb": ((int, float), 0.0),
    "requires_gpu": ((bool,), False),
    "gated": ((bool,), False),
    "trust_remote_code": ((bool,), False),
    "compile": ((bool, str), "auto"),
    "cpu_weights": ((str,), "fp32"),
    "sampling": ((dict, type(None)), None),
}
_CHOICES = {"dtype": DTYPES, "draft_quantization": QUANTIZATIONS, "drafter": DRAFTERS, "compile": ("auto",),
            "cpu_weights": CPU_WEIGHTS}
_TOP_KEYS = ("auto_fallback", "presets")


def default_config() -> Path:
    """The models.yaml used without --config: the installed package's copy, else the repo top's."""
    return PACKAGED_CONFIG if PACKAGED_CONFIG.is_file() else REPO_CONFIG


def load_presets(path: str | Path | PresetFile | None = None) -> dict[str, Preset]:
    """The presets of a models.yaml (default: default_config()), by name, in file order."""
    return load_config(path).presets


def load_config(path: str | Path | PresetFile | None = None) -> PresetFile:
    """Read and validate a models.yaml; raise ConfigError on the first problem. A PresetFile
    (one with a custom preset added, see with_custom_preset) is returned as it is."""
    if isinstance(path, PresetFile):
        return path
    path = Path(path).expanduser().resolve() if path is not None else default_config()
    raw = _read_yaml(path)
    where = str(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the top level must be a mapping with keys {', '.join(_TOP_KEYS)}")
    _check_keys(raw, _TOP_KEYS, _TOP_KEYS, where)
    if not isinstance(raw["presets"], dict) or not raw["presets"]:
        raise ConfigError(f"{where}: key 'presets' must map preset names to settings")
    presets = {
        str(name): _parse_preset(str(name), body, path.parent, f"{where}: preset '{name}'")
        for name, body in raw["presets"].items()
    }
    fallback = _check_fallback(raw["auto_fallback"], presets, where)
    return PresetFile(path=path, presets=presets, auto_fallback=fallback)


def parse_model_source(text: str, base_dir: Path) -> ModelSpec:
    """Classify a model source string (see the module docstring); raise ValueError if unusable."""
    text = text.strip()
    if text.startswith(BUNDLED_PREFIX):
        name = text[len(BUNDLED_PREFIX) :]
        if not name:
            raise ValueError("'bundled:' needs a model name")
        return ModelSpec("bundled", name, text)
    if text.startswith(_LOCAL_PREFIXES) or text.endswith(".gguf"):
        path = Path(text).expanduser()
        path = (path if path.is_absolute() else base_dir / path).resolve()
        return ModelSpec("gguf" if text.endswith(".gguf") else "local", str(path), text)
    if _HUB_ID.match(text):
        return ModelSpec("hub", text, text)
    raise ValueError(
        f"'{text}' is neither a hub repo id (owner/name), a local path (starting with /, ./, ../ or ~), "
        "a .gguf file nor bundled:NAME"
    )


# The model flags of the CLI's generate and the app (--target ...) and their help: a model of one's own,
# no models.yaml needed. A new drafter's model source goes here too.
MODEL_FLAGS = {
    "target": "the model to run: a hub id (owner/name), a local model folder or a .gguf file; replaces --preset",
    "draft": "a draft model for --target (the same forms); it must use the target's tokenizer",
    "eagle": "an EAGLE-3 head for --target: a hub id or a local folder",
    "medusa": "Medusa heads for --target (Medusa's format): a hub id or a local folder",
    "retrieval": "a datastore of --target's own replies (python -m specdec_core.train_retrieval): a local folder",
}


def config_with_models(config_path, preset: str, models: dict[str, str | None]) -> tuple[PresetFile, str]:
    """(presets, the preset to load) for a command line: the models.yaml's, plus the custom preset
    where `models` ({"target": ..., "draft": ..., "eagle": ...}, from the flags) names any.
    ConfigError (one line) for flags that don't go together or a path that names nothing."""
    config = load_config(config_path)
    given = {key: text for key, text in models.items() if text}
    if not given:
        return config, preset
    if "target" not in given:
        raise ConfigError(f"--{next(iter(given))} needs --target (the model it helps), or use a --preset")
    if preset != AUTO:
        raise ConfigError(f"--preset {preset} and --target both name the models: give only one of them")
    return with_custom_preset(config, **given), CUSTOM


def with_custom_preset(config: PresetFile, target: str, draft: str | None = None,
                       eagle: str | None = None, medusa: str | None = None, retrieval: str | None = None) -> PresetFile:
    """`config` plus the preset CUSTOM built from --target/--draft/--eagle/--medusa/--retrieval (each a hub
    id, a local model folder or a .gguf file), validated as a models.yaml preset is. Its default drafter is
    the EAGLE head if given, else the Medusa heads, else the draft model, else the retrieval datastore,
    else prompt lookup; a GGUF target runs on its own 4-bit
    blocks on CPU, as the offline preset does. ConfigError (one line naming the flag) for a source
    that is not there."""
    given = {"target": target, "draft": draft, "eagle": eagle, "medusa": medusa, "retrieval": retrieval}
    sources = {key: _flag_source(key, text) for key, text in given.items() if text}
    drafter = ("eagle" if eagle else "medusa" if medusa else "model" if draft else "retrieval" if retrieval
               else "prompt_lookup")
    body = {
        "description": ", ".join(_short_name(key, text) for key, text in sources.items()),
        **sources,
        "drafter": drafter,
        "memory_gb": 0,  # unknown until loaded; only `auto` reads it, and it never picks this preset
        "cpu_weights": "gguf" if sources["target"].endswith(".gguf") else "fp32",
    }
    preset = _parse_preset(CUSTOM, body, Path.cwd(), "the command line")
    return PresetFile(path=config.path, presets={CUSTOM: preset, **config.presets}, auto_fallback=config.auto_fallback)


def menu_label(preset: Preset) -> str:
    """The custom preset as menus show it: its short model names (a models.yaml preset: its name)."""
    return f"{CUSTOM} ({preset.description})" if preset.name == CUSTOM else preset.name


def _flag_source(key: str, text: str) -> str:
    """A flag's model source as models.yaml would spell it; ConfigError when a path names nothing.
    Anything on disk is a path (as transformers reads it), even one written like a hub id owner/name."""
    path = Path(text).expanduser()
    if not text.startswith(BUNDLED_PREFIX) and (path.exists() or text.startswith(_LOCAL_PREFIXES) or text.endswith(".gguf")):
        what = "a .gguf file, a model folder with a config.json, or a hub id owner/name"
        if not path.exists():
            raise ConfigError(f"--{key} {text}: no such file or folder: give {what}")
        if path.is_file() and path.suffix != ".gguf":
            raise ConfigError(f"--{key} {text}: not a .gguf file: give {what}")
        if path.is_dir() and not (path / "config.json").is_file():
            raise ConfigError(f"--{key} {text}: the folder has no config.json: give {what}")
        return str(path.resolve())
    try:
        parse_model_source(text, Path.cwd())
    except ValueError as error:
        raise ConfigError(f"--{key}: {error}") from None
    return text


def _short_name(key: str, source: str) -> str:
    """`SmolLM2-135M-Instruct.Q4_1`, `draft Qwen2.5-0.5B-Instruct`: the last part of a path or hub id."""
    name = source.removeprefix(BUNDLED_PREFIX).rstrip("/").rsplit("/", 1)[-1].removesuffix(".gguf")
    return name if key == "target" else f"{key} {name}"


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the preset file ({error.strerror or error})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}: invalid YAML{at}: {problem}") from None


def _check_keys(raw: dict, allowed, required, where: str) -> None:
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key '{key}' (allowed: {', '.join(allowed)})")
    for key in required:
        if key not in raw:
            raise ConfigError(f"{where}: missing key '{key}'")


def _parse_preset(name: str, body: Any, base_dir: Path, where: str) -> Preset:
    if name == AUTO:
        raise ConfigError(f"{where}: the name '{AUTO}' is reserved for automatic selection")
    if not isinstance(body, dict):
        raise ConfigError(f"{where}: must be a mapping of settings, got {type(body).__name__}")
    required = [key for key, (_, default) in _PRESET_KEYS.items() if default is _REQUIRED]
    _check_keys(body, _PRESET_KEYS, required, where)
    values = {key: _typed_value(body, key, where) for key in _PRESET_KEYS}
    values["target"] = _model_source(values["target"], base_dir, where, "target")
    for key in ("draft", "eagle", "medusa", "retrieval"):
        if values[key] is not None:
            values[key] = _model_source(values[key], base_dir, where, key)
    _check_consistency(values, where)
    values["sampling"] = _sampling_defaults(values["sampling"], where)
    return Preset(name=name, **values)


def _typed_value(body: dict, key: str, where: str) -> Any:
    types, default = _PRESET_KEYS[key]
    if key not in body:
        return default
    value = body[key]
    # YAML booleans are ints to Python: `draft_length: true` must not pass as 1.
    wrong_bool = isinstance(value, bool) and bool not in types
    if wrong_bool or not isinstance(value, types):
        expected = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise ConfigError(f"{where}: key '{key}' must be {expected}, got {value!r}")
    if key in _CHOICES and isinstance(value, str) and value not in _CHOICES[key]:  # compile may be a bool
        raise ConfigError(f"{where}: key '{key}' must be one of {', '.join(_CHOICES[key])}, got {value!r}")
    if isinstance(value, float) or (isinstance(value, int) and float in types):
        value = float(value)
    return value


def _model_source(text: str, base_dir: Path, where: str, key: str) -> ModelSpec:
    try:
        return parse_model_source(text, base_dir)
    except ValueError as error:
        raise ConfigError(f"{where}: key '{key}': {error}") from None


def _check_consistency(values: dict, where: str) -> None:
    if values["drafter"] == "model" and values["draft"] is None:
        raise ConfigError(f"{where}: key 'drafter' is 'model' but the preset has no 'draft'")
    if values["drafter"] == "eagle" and values["eagle"] is None:
        raise ConfigError(f"{where}: key 'drafter' is 'eagle' but the preset has no 'eagle' head source")
    if values["drafter"] == "medusa" and values["medusa"] is None:
        raise ConfigError(f"{where}: key 'drafter' is 'medusa' but the preset has no 'medusa' heads source")
    if values["drafter"] == "retrieval" and values["retrieval"] is None:
        raise ConfigError(f"{where}: key 'drafter' is 'retrieval' but the preset has no 'retrieval' datastore")
    if values["drafter"] == "hybrid" and values["eagle"] is None and values["draft"] is None:
        raise ConfigError(f"{where}: key 'drafter' is 'hybrid' but the preset has neither an 'eagle' head nor a 'draft'")
    lowest, highest = DRAFT_LENGTH_BOUNDS
    if not lowest <= values["draft_length"] <= highest:
        raise ConfigError(f"{where}: key 'draft_length' must be between {lowest} and {highest}, "
                          f"got {values['draft_length']}")
    if values["cpu_weights"] == "gguf" and values["target"].kind not in GGUF_KINDS:
        raise ConfigError(
            f"{where}: key 'cpu_weights' is 'gguf' but the target is not a GGUF file or bundled model: "
            "use cpu_weights: fp32"
        )
    for key in ("memory_gb", "download_gb"):
        if not (math.isfinite(values[key]) and values[key] >= 0):
            raise ConfigError(f"{where}: key '{key}' must be a finite number >= 0, got {values[key]:g}")


SAMPLING_KEYS = ("temperature", "top_p", "top_k")


def _sampling_defaults(mapping: dict | None, where: str) -> tuple[tuple[str, float], ...]:
    """The `sampling` key as (name, value) pairs, checked by the rules sampling itself applies."""
    mapping = mapping or {}
    unknown = [name for name in mapping if name not in SAMPLING_KEYS]
    if unknown:
        raise ConfigError(f"{where}: key 'sampling' may set {', '.join(SAMPLING_KEYS)}, got {unknown[0]!r}")
    if any(isinstance(value, bool) or not isinstance(value, (int, float)) for value in mapping.values()):
        raise ConfigError(f"{where}: key 'sampling' takes numbers, got {mapping!r}")
    try:
        SamplingParams(**mapping)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{where}: key 'sampling': {error}") from None
    return tuple(mapping.items())


def _check_fallback(value: Any, presets: dict[str, Preset], where: str) -> str:
    if not isinstance(value, str) or value not in presets:
        raise ConfigError(
            f"{where}: key 'auto_fallback' must name a preset ({', '.join(presets)}), got {value!r}"
        )
    if presets[value].requires_gpu:
        raise ConfigError(f"{where}: key 'auto_fallback' must name a preset that runs without a GPU")
    return value
