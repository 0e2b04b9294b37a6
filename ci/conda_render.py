"""conda-build's rendering of recipe/meta.yaml, done offline for ci/check_recipe.py: the variants
of conda_build_config.yaml (zip_keys advance together), Jinja2 with the functions and context
names conda-build gives recipes (StrictUndefined: an unknown name is an error), then the line
selectors (``# [expr]``) per variant and platform, then PyYAML. conda-build itself needs a
reachable channel even to render (it solves to apply run_exports); this needs jinja2 and pyyaml.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from pathlib import Path

import jinja2
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
PKG_HASH = "h0123abc"  # conda-build's final PKG_HASH: "h" + 7 hex digits of the variant's hash


class CheckError(Exception):
    """The recipe cannot be rendered or checked at all."""



# conda-build's selector pattern (conda_build/metadata.py): "content  # [expr]"; the "#" is optional.
SELECTOR = re.compile(r"(.+?)\s*(#.*)?\[([^\[\]]+)\](?(2)[^\(\)]*)$")


def selector_namespace(platform: str, variant: dict[str, str]) -> dict[str, object]:
    arch = platform.split("-", 1)[1]
    python = variant.get("python", "3.12")
    ns: dict[str, object] = {
        "linux": platform.startswith("linux-"), "osx": platform.startswith("osx-"),
        "win": platform.startswith("win-"), "unix": not platform.startswith("win-"),
        "linux64": platform == "linux-64", "linux32": platform == "linux-32",
        "x86": arch in ("32", "64"), "x86_64": arch == "64", "aarch64": arch == "aarch64",
        "arm64": arch == "arm64", "ppc64le": arch == "ppc64le", "s390x": arch == "s390x",
        "armv7l": arch == "armv7l", "target_platform": platform, "build_platform": platform,
        "py": int("".join(python.split(".")[:2])), "py3k": python.startswith("3."),
        "py2k": python.startswith("2."), "os": os, "environ": dict(os.environ),
    }
    ns.update(variant)
    return ns


def apply_selectors(text: str, namespace: dict[str, object], where: str) -> str:
    """conda-build's select_lines: comment lines drop out, a line with a selector stays (without it)
    when the selector is true, every other line stays."""
    kept = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.rstrip()
        if not line or line.lstrip().startswith("#"):
            kept.append("")
            continue
        trailing_quote = line[-1] if line[-1] in ("'", '"') else ""
        match = SELECTOR.match(line) if "[" in line and "]" in line else None
        if not match:
            kept.append(line)
            continue
        content, expression = match.group(1), match.group(3)
        try:
            selected = eval(expression, {"__builtins__": {}}, dict(namespace))  # noqa: S307
        except Exception as error:
            raise CheckError(f"{where}:{number}: selector [{expression}] fails: {error}") from None
        if selected:
            kept.append(content + trailing_quote)
    return "\n".join(kept) + "\n"


def expand_variants(config: dict) -> list[dict[str, str]]:
    """conda-build's matrix: zip_keys groups advance together, everything else is a product."""
    zip_keys = config.get("zip_keys") or []
    if zip_keys and isinstance(zip_keys[0], str):
        zip_keys = [zip_keys]
    keys = {k: v for k, v in config.items() if k not in ("zip_keys", "pin_run_as_build", "extend_keys")}
    for name, values in keys.items():
        if not isinstance(values, list) or not values:
            raise CheckError(f"conda_build_config.yaml: {name} must be a non-empty list")
    axes: list[list[dict[str, str]]] = []
    zipped: set[str] = set()
    for group in zip_keys:
        missing = [k for k in group if k not in keys]
        if missing:
            raise CheckError(f"conda_build_config.yaml: zip_keys names {missing}, which have no values")
        lengths = {k: len(keys[k]) for k in group}
        if len(set(lengths.values())) != 1:
            raise CheckError(f"conda_build_config.yaml: zipped keys differ in length: {lengths}")
        axes.append([{k: str(keys[k][i]) for k in group} for i in range(len(keys[group[0]]))])
        zipped.update(group)
    for name, values in keys.items():
        if name not in zipped:
            axes.append([{name: str(value)} for value in values])
    variants = []
    for combination in itertools.product(*axes):
        variant: dict[str, str] = {}
        for part in combination:
            variant.update(part)
        variants.append(variant)
    return variants


def jinja_context(recipe: Path, source: Path, platform: str, variant: dict[str, str]) -> dict:
    python = variant.get("python", "3.12")
    conda_py = "".join(python.split(".")[:2])

    def compiler(language: str) -> str:
        name = variant.get(f"{language}_compiler", {"c": "gcc", "cxx": "gxx", "fortran": "gfortran"}.get(language))
        if not name:
            raise CheckError(f"compiler('{language}'): no {language}_compiler in the variant")
        version = variant.get(f"{language}_compiler_version")
        return f"{name}_{platform}" + (f" {version}" if version else "")

    def stdlib(language: str) -> str:
        name = variant.get(f"{language}_stdlib", "sysroot")
        version = variant.get(f"{language}_stdlib_version")
        return f"{name}_{platform}" + (f" {version}" if version else "")

    def resolve(load_file: str, from_recipe_dir: bool) -> Path:
        return (recipe if from_recipe_dir else source) / load_file

    def load_file_regex(load_file, regex_pattern, from_recipe_dir=False, recipe_dir=None,
                        permit_undefined_jinja=True):
        path = resolve(load_file, from_recipe_dir)
        if not path.is_file():
            return None  # conda-build's answer too; the recipe's .group() then fails the render
        return re.search(regex_pattern, path.read_text())

    def load_file_data(filename, *args, from_recipe_dir=False, recipe_dir=None, permit_undefined_jinja=True,
                       **kwargs):
        path = resolve(filename, from_recipe_dir)
        text = path.read_text()
        if path.suffix == ".toml":
            return tomllib.loads(text)
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)

    def refuse(name):
        def function(*args, **kwargs):
            raise CheckError(f"{name}() needs a solved host environment; this offline check does not "
                             "implement it (state the run bounds explicitly, or extend ci/check_recipe.py)")
        return function

    context = dict(variant)
    context.update(
        compiler=compiler, stdlib=stdlib, load_file_regex=load_file_regex, load_file_data=load_file_data,
        load_setup_py_data=refuse("load_setup_py_data"), pin_compatible=refuse("pin_compatible"),
        pin_subpackage=refuse("pin_subpackage"), environ=dict(os.environ), os=os,
        target_platform=platform, build_platform=platform, CONDA_PY=conda_py, PY_VER=python,
        PYTHON="$PYTHON", PKG_HASH=PKG_HASH, RECIPE_DIR=str(recipe), SRC_DIR=str(source),
    )
    return context


_templates: dict[tuple[str, int], jinja2.Template] = {}


def template(recipe: Path) -> jinja2.Template:
    path = recipe / "meta.yaml"
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _templates:
        environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
        try:
            _templates[key] = environment.from_string(path.read_text())
        except jinja2.TemplateError as error:
            raise CheckError(f"meta.yaml: Jinja fails: {error}") from None
    return _templates[key]


def render(recipe: Path, source: Path, platform: str, variant: dict[str, str]) -> dict:
    try:
        text = template(recipe).render(jinja_context(recipe, source, platform, variant))
    except jinja2.TemplateError as error:
        raise CheckError(f"meta.yaml: Jinja fails: {error}") from None
    except (AttributeError, TypeError) as error:  # e.g. load_file_regex found nothing: None.group(1)
        raise CheckError(f"meta.yaml: Jinja fails: {error}") from None
    text = apply_selectors(text, selector_namespace(platform, variant), "meta.yaml")
    try:
        data = yaml.load(text, Loader=YAML_LOADER)  # noqa: S506 (a safe loader)
    except yaml.YAMLError as error:
        raise CheckError(f"meta.yaml: rendered text is not YAML: {error}") from None
    if not isinstance(data, dict):
        raise CheckError("meta.yaml: rendered text is not a mapping")
    return data
