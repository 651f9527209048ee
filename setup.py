"""Build configuration beyond pyproject.toml: the optional C module `protocol._speedups`.

`optional=True`: where it cannot be compiled (no C compiler or Python headers), the install goes on
without it and rocketq runs its pure-Python twins (protocol/message.py picks at import)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("protocol._speedups", ["protocol/_speedups.c"], optional=True)])
