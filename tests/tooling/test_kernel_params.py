"""The core's hand-written PTX kernels (cpp/src/ragged_offsets.ptx.inc) and their launches
(cpp/src/ragged.cpp) agree on every parameter: how many, in which order, and how wide. cuLaunchKernel
reads each kernel's parameters from the launch's `void* params[]` by the kernel's own list, so a
parameter added on one side only, or an `unsigned int` where the kernel reads a `.u64`, is read as
garbage on the GPU -- and no CPU test would notice. This reads both sources and compares them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PTX = ROOT / "cpp" / "src" / "ragged_offsets.ptx.inc"
LAUNCHES = ROOT / "cpp" / "src" / "ragged.cpp"
HEADER = ROOT / "cpp" / "include" / "stridedfa" / "ragged.hpp"

# Widths in bits of the C++ types the launches declare their parameters with.
CPP_BITS = {"unsigned long long": 64, "long long": 64, "uint64_t": 64, "int64_t": 64, "unsigned int": 32,
            "unsigned": 32, "int": 32, "uint32_t": 32, "int32_t": 32, "float": 32}
DECLARATION = re.compile(r"^\s*(unsigned long long|long long|uint64_t|int64_t|unsigned int|unsigned|uint32_t|int32_t|"
                         r"int|float)\s+([^;()]*[^;]*);", re.M)


def kernel_params() -> dict[str, list[tuple[str, int]]]:
    """Each .entry's parameters as (name, bytes)."""
    text = PTX.read_text()
    kernels = {}
    for name, body in re.findall(r"\.visible \.entry (\w+)\((.*?)\)\s*\{", text, re.S):
        params = []
        for line in body.split(","):
            scalar = re.search(r"\.param \.[usbf](\d+) (\w+)", line)
            array = re.search(r"\.param \.align \d+ \.b8 (\w+)\[(\d+)\]", line)
            if array:
                params.append((array.group(1), int(array.group(2))))
            elif scalar:
                params.append((scalar.group(2), int(scalar.group(1)) // 8))
        kernels[name] = params
    return kernels


def split_top_level(text: str) -> list[str]:
    """`text` cut at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += c in "([{"
        depth -= c in ")]}"
        if c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def constants() -> dict[str, int]:
    return {name: int(value) for name, value in
            re.findall(r"constexpr int (\w+) = (\d+);", HEADER.read_text())}


def launches() -> dict[str, list[tuple[str, int]]]:
    """Each launch's `params` as (name, bytes), keyed by the kernel it launches."""
    text = LAUNCHES.read_text()
    entry_of = dict(re.findall(r'module_get_function\(&k\.(\w+), module, "(\w+)"\)', text))
    sizes = constants()
    result = {}
    for member, body in re.findall(r"CUfunction kernel = kernels\(device\)\.(\w+);(.*?)void\* params\[\] = \{",
                                   text, re.S):
        listed = re.search(re.escape(body) + r"void\* params\[\] = \{(.*?)\};", text, re.S).group(1)
        declared = {}
        for type_name, rest in DECLARATION.findall(body):
            for item in split_top_level(rest):
                name = re.match(r"(\w+)", item).group(1)
                count = re.match(r"\w+\[(\w+)\]", item)
                items = 1 if count is None else int(sizes.get(count.group(1), count.group(1)))
                declared[name] = CPP_BITS[type_name] // 8 * items
        params = []
        for entry in split_top_level(listed):
            name = entry.lstrip("&")
            assert name in declared, f"{entry_of[member]}: launch parameter {name} has no declaration ragged.cpp reads"
            params.append((name, declared[name]))
        result[entry_of[member]] = params
    return result


def test_every_kernel_is_launched_and_every_launch_has_a_kernel():
    assert set(launches()) == set(kernel_params())


@pytest.mark.parametrize("kernel", sorted(kernel_params()))
def test_launch_parameters_match_the_kernels_list(kernel):
    expected = kernel_params()[kernel]
    given = launches()[kernel]
    assert len(given) == len(expected), (
        f"{kernel}: the kernel takes {len(expected)} parameters, its launch passes {len(given)}:\n"
        f"  kernel: {[n for n, _ in expected]}\n  launch: {[n for n, _ in given]}")
    for position, ((kernel_name, kernel_bytes), (launch_name, launch_bytes)) in enumerate(zip(expected, given)):
        assert kernel_bytes == launch_bytes, (
            f"{kernel}: parameter {position} is {kernel_bytes} bytes ({kernel_name}) in the kernel, "
            f"{launch_bytes} ({launch_name}) at the launch")
