"""Builds the native CPU ops in csrc/ (pybind11 through torch's cpp_extension, with ninja).

If the build cannot run (no compiler, no torch at build time), the package still installs and the ops fall
back to their torch references; ``actfirst.kernels.dispatch`` says so once at run time.
"""

import glob
import os

from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that never fails the install: a failed native build leaves the torch fallback in place."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure means: fall back
            print(f"actfirst: native ops not built ({exc}); the torch fallback will be used")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            print(f"actfirst: native op {ext.name} not built ({exc}); the torch fallback will be used")


def native_extensions():
    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")))
    if not sources or os.environ.get("ACTFIRST_NO_NATIVE") == "1":
        return [], {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print("actfirst: torch is not importable at build time; native ops skipped (torch fallback)")
        return [], {}

    class Build(OptionalBuildExt, BuildExtension):
        pass

    ext = CppExtension(
        "actfirst._C",
        sources,
        extra_compile_args=["-O3", "-fopenmp", "-march=native", "-fno-math-errno", "-fno-trapping-math"],
        extra_link_args=["-fopenmp"],
    )
    return [ext], {"build_ext": Build.with_options(use_ninja=True)}


# Every package under actfirst/ (the benchmark packages actfirst.envs.<name> included), and kernels/ installed as
# actfirst.kernels (pyproject.toml's package-dir), never as a top-level "kernels".
packages = find_packages(include=["actfirst", "actfirst.*"]) + ["actfirst.kernels"]
ext_modules, cmdclass = native_extensions()
setup(packages=packages, ext_modules=ext_modules, cmdclass=cmdclass)
