"""In-tree build backend: setuptools' own, except that a regular (non-editable) wheel is refused.

The project's layout is a clone: `configs/` (hydra) beside the packages, and a top-level `recipe` package
whose name verl 0.9.1 also ships as a namespace folder in site-packages. A wheel would leave the configs
behind and pour `recipe/*.py` into verl's folder, so only the editable install from a clone is supported.
"""

from setuptools.build_meta import *  # noqa: F401,F403  (every hook setuptools provides, unchanged)

REFUSAL = (
    "gapo-recipe is installed from a clone with an editable install only: `git clone ...; cd gapo-recipe; "
    "pip install -e .` (GPU clusters: `make install-gpu`). A regular wheel would not carry configs/ and would mix "
    "its `recipe` package into verl's own `recipe/` folder in site-packages."
)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    raise RuntimeError(REFUSAL)


def build_sdist(sdist_directory, config_settings=None):
    raise RuntimeError(REFUSAL)


