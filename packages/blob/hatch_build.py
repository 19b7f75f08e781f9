"""Hatchling build hook: compile this package's Cython modules in place.

Kept per package (an sdist must carry its own hook). The built extensions are
listed as artifacts by their in-place path so wheels and editable installs both
pick them up.
"""
from __future__ import annotations

import os
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CythonBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version, build_data):
        import numpy
        from Cython.Build import cythonize
        from setuptools import Distribution, Extension
        from setuptools.command.build_ext import build_ext

        root = Path(self.root)
        pyx_files = sorted((root / "src").rglob("*.pyx"))
        if not pyx_files:
            return
        extensions = []
        for pyx in pyx_files:
            rel = pyx.relative_to(root / "src").with_suffix("")
            extensions.append(Extension(
                ".".join(rel.parts), [str(pyx.relative_to(root))],
                include_dirs=[numpy.get_include()],
                extra_compile_args=["-O3", "-fopenmp"],
                extra_link_args=["-fopenmp"],
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            ))
        cwd = os.getcwd()
        os.chdir(root)
        try:
            modules = cythonize(extensions, language_level=3, quiet=True,
                                compiler_directives={"boundscheck": False, "wraparound": False,
                                                     "cdivision": True})
            dist = Distribution({"ext_modules": modules, "package_dir": {"": "src"}})
            cmd = build_ext(dist)
            cmd.inplace = True
            cmd.build_lib = "src"
            cmd.ensure_finalized()
            cmd.run()
        finally:
            os.chdir(cwd)
        artifacts = []
        for pyx in pyx_files:
            for so in pyx.parent.glob(pyx.stem + ".*.so"):
                artifacts.append(str(so.relative_to(root)))
        build_data["artifacts"].extend(artifacts)
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
