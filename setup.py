"""The build step pyproject.toml cannot say: the files a site installs beside the code
(``lua/``, ``daemon/``, kept at the repository's top) go into the package as
``bbstage/share/`` (read through ``bbstage.sitefiles.path``)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHARED = ("lua", "daemon")


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        for name in SHARED:
            source = Path(name)
            if not source.is_dir():
                raise SystemExit(f"setup.py: no {source.resolve()}: build from a checkout or sdist")
            target = Path(self.build_lib, "bbstage", "share", name)
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.luac", "__pycache__"))


setup(cmdclass={"build_py": BuildPy})
