"""The PEP 517 build backend of stridedfa: scikit-build-core, plus the choice of CUDA major.

A build is tied to one CUDA major (cudnn-frontend branches on CUDART_VERSION), so one source tree
builds two distributions, ``stridedfa-cu13`` and ``stridedfa-cu12`` (import name ``stridedfa`` for
both). The major is chosen at build time in one way: the environment variable

    STRIDEDFA_CUDA_MAJOR=13   (the default)   or   STRIDEDFA_CUDA_MAJOR=12

It decides (1) the header packages added to the build requirements, (2) the distribution name and
the runtime dependencies (cuDNN and CUDA runtime wheels of that major), and (3) which headers
cmake/locate_build_headers.py hands to CMake (it checks their CUDART_VERSION). pyproject.toml
describes the default, cu13; for cu12 its name and dependencies are rewritten for the duration of
the build and restored afterwards (PEP 621 allows no dynamic name).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess

from scikit_build_core import build as _scikit_build

ENV = "STRIDEDFA_CUDA_MAJOR"
DEFAULT_MAJOR = "13"

# What differs between the majors. "dependencies" maps pyproject.toml's cu13 line to the cu12 one.
MAJORS = {
    "13": {
        "name": "stridedfa-cu13",
        # Header-only use: CUDA 13 wheels put every component under nvidia/cu13/include.
        "build_requires": [
            "nvidia-cudnn-cu13==9.28.1.4",
            "nvidia-cuda-runtime==13.0.*",
            "nvidia-cuda-crt==13.0.*",
            "nvidia-cuda-cccl==13.0.*",
            "nvidia-cuda-nvrtc==13.0.*",
        ],
        "dependencies": {},
    },
    "12": {
        "name": "stridedfa-cu12",
        # CUDA 12 wheels lay headers out per component (nvidia/cuda_runtime/include, ...); the crt
        # headers ship with nvcc's wheel. cuDNN: the newest 9.x with CUDA 12 wheels.
        "build_requires": [
            "nvidia-cudnn-cu12==9.28.0.42",
            "nvidia-cuda-runtime-cu12==12.9.*",
            "nvidia-cuda-nvcc-cu12==12.9.*",
            "nvidia-cuda-cccl-cu12==12.9.*",
            "nvidia-cuda-nvrtc-cu12==12.9.*",
        ],
        "dependencies": {
            '"nvidia-cudnn-cu13>=9.13,<10"': '"nvidia-cudnn-cu12>=9.10,<10"',
            '"nvidia-cuda-runtime>=13.0,<14"': '"nvidia-cuda-runtime-cu12>=12.2,<13"',
            '"Environment :: GPU :: NVIDIA CUDA :: 13"': '"Environment :: GPU :: NVIDIA CUDA :: 12"',
        },
    },
}


def cuda_major() -> str:
    major = os.environ.get(ENV, DEFAULT_MAJOR).strip()
    if major not in MAJORS:
        raise ValueError(f"{ENV}={major!r}: stridedfa builds for CUDA major {' or '.join(sorted(MAJORS))}")
    return major


@contextlib.contextmanager
def _pyproject_for_major():
    """pyproject.toml with the chosen major's name and dependencies while the build runs."""
    major = cuda_major()
    os.environ[ENV] = major  # for cmake/locate_build_headers.py, run by CMake in this process tree
    if major == DEFAULT_MAJOR:
        yield
        return
    path = pathlib.Path("pyproject.toml")
    original = path.read_text()
    text = original.replace(f'name = "{MAJORS[DEFAULT_MAJOR]["name"]}"', f'name = "{MAJORS[major]["name"]}"', 1)
    for old, new in MAJORS[major]["dependencies"].items():
        if old not in text:
            raise RuntimeError(f"pyproject.toml no longer lists {old}; update build_backend/stridedfa_build.py")
        text = text.replace(old, new)
    if text == original or f'name = "{MAJORS[major]["name"]}"' not in text:
        raise RuntimeError("could not set the distribution name in pyproject.toml")
    path.write_text(text)
    try:
        yield
    finally:
        path.write_text(original)


COMMIT_ENV, DIRTY_ENV = "STRIDEDFA_BUILD_COMMIT", "STRIDEDFA_BUILD_DIRTY"


def _record_provenance() -> None:
    """The commit a build is made from, and whether tracked files differ from it, for CMake to
    write into the package (stridedfa/_build_info.py; stridedfa.info()["build"]). Read from git
    in a checkout; a build from an sdist or another tree keeps what the environment says, else
    "unknown". Runs before pyproject.toml is rewritten for another CUDA major."""
    if COMMIT_ENV in os.environ:
        return
    commit, dirty = "unknown", "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        run = dict(capture_output=True, text=True, timeout=30, check=True)
        commit = subprocess.run(["git", "rev-parse", "HEAD"], **run).stdout.strip() or "unknown"
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], **run).stdout
        dirty = "true" if status.strip() else "false"
    os.environ[COMMIT_ENV] = commit
    os.environ.setdefault(DIRTY_ENV, dirty)


def _requires(base: list[str]) -> list[str]:
    return [*base, *MAJORS[cuda_major()]["build_requires"]]


def _settings(config_settings):
    """A build folder per CUDA major: objects compiled against one major's headers must never be
    reused for the other (scikit-build-core keeps build/ between builds)."""
    settings = dict(config_settings or {})
    settings.setdefault("build-dir", f"build/{{wheel_tag}}-cu{cuda_major()}")
    return settings


def get_requires_for_build_wheel(config_settings=None):
    with _pyproject_for_major():
        return _requires(_scikit_build.get_requires_for_build_wheel(config_settings))


def get_requires_for_build_sdist(config_settings=None):
    with _pyproject_for_major():
        return _scikit_build.get_requires_for_build_sdist(config_settings)


def get_requires_for_build_editable(config_settings=None):
    with _pyproject_for_major():
        return _requires(_scikit_build.get_requires_for_build_editable(config_settings))


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    with _pyproject_for_major():
        return _scikit_build.prepare_metadata_for_build_wheel(metadata_directory, _settings(config_settings))


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    with _pyproject_for_major():
        return _scikit_build.prepare_metadata_for_build_editable(metadata_directory, _settings(config_settings))


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _record_provenance()
    with _pyproject_for_major():
        return _scikit_build.build_wheel(wheel_directory, _settings(config_settings), metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _record_provenance()
    with _pyproject_for_major():
        return _scikit_build.build_editable(wheel_directory, _settings(config_settings), metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    # The sdist keeps pyproject.toml's default (cu13) metadata; building a wheel from it with
    # STRIDEDFA_CUDA_MAJOR=12 gives the cu12 wheel, exactly as from the source tree.
    return _scikit_build.build_sdist(sdist_directory, config_settings)
