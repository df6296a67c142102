"""Build step (setuptools ``build_py``): ship the scenario files inside the wheel.

The repository's top-level ``scenarios/`` folder stays the source of truth; building a
wheel (or installing from an sdist) copies every ``scenarios/*.toml`` into
``fedmem/_scenarios/`` of the build, where ``fedmem.cli`` finds them when the package
is installed without the repository. Wired up in ``pyproject.toml``
(``[tool.setuptools.cmdclass]``); the sdist carries this file and the folder
(``MANIFEST.in``). Not part of the installed package.
"""

from pathlib import Path

from setuptools.command.build_py import build_py

SOURCE = Path(__file__).resolve().parent / "scenarios"


class BuildPyWithScenarios(build_py):
    def run(self):
        super().run()
        files = sorted(SOURCE.glob("*.toml"))
        if not files:
            raise RuntimeError(f"scenarios/ must hold the scenario files to package. Found none in {SOURCE}.")
        target = Path(self.build_lib) / "fedmem" / "_scenarios"
        self.mkpath(str(target))
        for f in files:
            self.copy_file(str(f), str(target / f.name))
