"""setuptools' build step, for what pyproject.toml can't say: the presets file.

models.yaml stays at the repo top, its one source: `python app.py` and `python -m specdec_core`
read it there, and users edit it there. A built package (`pip install .`, a wheel) gets a copy as
specdec_core/presets/models.yaml, with the EAGLE head it names (heads/, relative to the file),
which the installed package reads instead (config.default_config). An editable install
(`pip install -e .`) gets no copy: it reads the repo top's file, as the checkout does.
"""

from setuptools import setup
from setuptools.command.build_py import build_py

PRESETS_FILES = ("models.yaml", "heads")  # repo top -> specdec_core/presets/ in the built package


class BuildWithPresets(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for name in PRESETS_FILES:
            built = f"{self.build_lib}/specdec_core/presets/{name}"
            if name.endswith(".yaml"):
                self.copy_file(name, built)
            else:
                self.copy_tree(name, built)


setup(cmdclass={"build_py": BuildWithPresets})
