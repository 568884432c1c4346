"""Installs tunesvc-capture.pth beside the packages, which pyproject.toml alone cannot do.

The .pth file runs at every interpreter start and does nothing unless $TUNESVC_CAPTURE is set
(see _tunesvc_capture.py). A wheel carries it at its root (build_py); an editable install
(PEP 660) gets it in the editable wheel's root, beside setuptools' own __editable__ .pth.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "tunesvc-capture.pth"
HERE = Path(__file__).parent


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(str(HERE / PTH), str(Path(self.build_lib, PTH)), preserve_mode=0)


cmdclass: dict[str, type] = {"build_py": BuildPyWithPth}

try:
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # setuptools without PEP 660: editable installs run build_py in place
    pass
else:

    class EditableWheelWithPth(editable_wheel):
        def _install_namespaces(self, installation_dir, pth_prefix):
            super()._install_namespaces(installation_dir, pth_prefix)
            shutil.copy(HERE / PTH, Path(installation_dir, PTH))

    cmdclass["editable_wheel"] = EditableWheelWithPth

setup(cmdclass=cmdclass)
