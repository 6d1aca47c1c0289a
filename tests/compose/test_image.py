"""compose/Dockerfile: the image holds every package that ``pip install .`` installs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_image_copies_every_package_the_project_installs() -> None:
    """Each package of pyproject's ``packages.find`` include is COPYed before ``pip install .``
    (a package left out installs nothing, and ``orga`` fails in every container)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in include}
    dockerfile = (REPO / "compose" / "Dockerfile").read_text()
    before_install = dockerfile.split("RUN pip install .", 1)[0]
    copied = set(re.findall(r"^COPY (\w+) \./\1$", before_install, flags=re.MULTILINE))
    assert packages <= copied, (
        f"compose/Dockerfile does not COPY {sorted(packages - copied)} before `pip install .`: "
        f"add `COPY NAME ./NAME` for each (it copies {sorted(copied)})"
    )
