"""Build of lbcore's native kernel (``lbcore._kernel``); everything else is in pyproject.toml.

The extension is optional: where no C compiler works the install still succeeds and
lbcore routes on its NumPy kernel (``lbcore.kernel_name() == "numpy"``, with one warning
at import naming the reason). The usual ``CC``, ``CFLAGS`` and ``LDFLAGS`` apply (CI
builds a sanitizer copy with ``-fsanitize=address,undefined`` in both).
"""

from setuptools import Extension, setup

SOURCES = [
    "keys.c",
    "plan.c",
    "route.c",
    "methods.c",
    "scatter.c",
    "calls.c",
    "guard.c",
    "arcs.c",
    "module.c",
]

setup(
    ext_modules=[
        Extension(
            "lbcore._kernel",
            sources=[f"lbcore/csrc/{s}" for s in SOURCES],
            depends=[
                "lbcore/csrc/decimal.h",
                "lbcore/csrc/kernel.h",
                "lbcore/csrc/plan.h",
                "lbcore/csrc/xxh64.h",
            ],
            # Portable code generation (no -march=native: wheels and copies run elsewhere).
            extra_compile_args=["-std=c99", "-O2", "-Wall", "-Wextra", "-Werror"],
            optional=True,
        )
    ]
)
