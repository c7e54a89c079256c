"""The package as a user installs it: `pip install .` and `pip install -e .` into a fresh venv give
the commands `specdec` (the CLI, `python -m specdec_core`) and `specdec-app` (the app, `python app.py`).

Offline: the venv sees the system's packages (torch and the rest are not reinstalled), pip installs
with --no-deps and builds with the system's setuptools (--no-build-isolation), from a copy of the
source so the checkout gets no build/ or egg-info folders.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "models.yaml", "heads", "specdec_core",
           "specdec_app")


def _app_modules() -> set[str]:
    """The app's top-level modules: app.py and the app_*.py beside it."""
    return {path.stem for path in REPO.glob("app*.py")}


def _source_copy(folder: Path) -> Path:
    folder.mkdir()
    for name in [*SOURCES, *(f"{module}.py" for module in _app_modules())]:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, folder / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, folder / name)
    return folder


def _venv_with(tmp_path: Path, *install: str) -> Path:
    """A fresh venv (seeing the system's site-packages) with `pip install --no-deps *install` run in it;
    the folder of its commands."""
    venv = tmp_path / "venv"
    # without a pip of its own: ensurepip would also put its old setuptools in the venv, in front of
    # the system's (which builds wheels without the `wheel` package); the system's pip installs into it
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=120)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", "--no-deps",
                           "--no-build-isolation", "--quiet", *install], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return bin_dir


def _run(bin_dir: Path, command: str, *args: str, cwd: Path) -> str:
    """`command *args` run from `cwd` (not the checkout, so nothing is imported from it): its stdout."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([str(bin_dir / command), *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _help(bin_dir: Path, command: str, cwd: Path) -> str:
    return _run(bin_dir, command, "--help", cwd=cwd)


@pytest.mark.parametrize("editable", [False, True], ids=["pip install .", "pip install -e ."])
def test_pip_install_gives_the_specdec_and_specdec_app_commands(tmp_path, editable):
    source = _source_copy(tmp_path / "source")
    bin_dir = _venv_with(tmp_path, *(["-e", str(source)] if editable else [str(source)]))
    if not editable:  # the installed copy must serve on its own
        shutil.rmtree(source)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cli = _help(bin_dir, "specdec", elsewhere)
    assert "presets" in cli and "generate" in cli
    assert cli.startswith("usage: specdec ") and "python -m" not in cli  # the command's own name
    generate = _run(bin_dir, "specdec", "generate", "--help", cwd=elsewhere)
    assert generate.startswith("usage: specdec generate") and "--target" in generate
    app = _help(bin_dir, "specdec-app", elsewhere)
    assert "--preset" in app and "--api-key" in app and "Chat with a local model" in app and "--target" in app
    # the presets file: the installed copy of models.yaml (its source copy is gone), or the checkout's
    presets = _run(bin_dir, "specdec", "presets", cwd=elsewhere)
    assert "smollm2-135m-local" in presets and "qwen2.5-7b" in presets
    where = _run(bin_dir, "python", "-c", "from specdec_core.presets.config import default_config as d, load_presets as l; "
                 "print(d()); print(l()['smollm2-135m-local'].eagle.location)", cwd=elsewhere).split()
    config, head = Path(where[0]), Path(where[1])
    home = source if editable else bin_dir.parent  # the checkout's file, or the venv's copy
    assert config.is_relative_to(home) and config.name == "models.yaml"
    assert head == config.parent / "heads" / "smollm2-135m-eagle3" and (head / "config.json").is_file()


def test_the_declared_dependencies_are_requirements_txts():
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    listed = [line.strip() for line in (REPO / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.lstrip().startswith("#")]
    assert declared == listed


def test_every_app_module_is_installed():
    """app.py lives at the repo top, the UI in specdec_app/: pyproject lists the module by name
    (py-modules) and finds the packages, so a new top-level module must be added there, or
    `specdec-app` fails to import it once installed."""
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(setuptools["py-modules"]) == _app_modules()
    assert "specdec_app*" in setuptools["packages"]["find"]["include"]
