"""Imports point down the layers only: readers -> tables -> views -> rules -> findings -> outputs.

Every import in tracekit/, parsers/ and rules/ (module level or inside a function, where the CLI
keeps its heavy ones) is checked against LAYERS. tracekit.parsers and tracekit.rules live outside
tracekit/ (package-dir), which import-linter's package walk does not follow, so the check reads
the files itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Highest first. A module may import from its own layer and from any layer below it; names joined
# by "|" share a layer and must not import each other.
LAYERS = [
    "tracekit.cli",
    "tracekit.agent",
    "tracekit.cluster",  # map/reduce over ranks: runs the Python API's ingest and analysis on each chunk
    "tracekit.api",
    "tracekit.render",
    "tracekit.compare",
    "tracekit.rules",
    "tracekit.engine",
    "tracekit.findings",
    "tracekit.ingest",
    "tracekit.parsers",
    "tracekit.db",
    "tracekit.compression",  # raises InputError: just above the bottom layer
    "tracekit.producers | tracekit.errors | tracekit.units | tracekit.tempfiles",
]
# The package root only carries the version and the lazy `tracekit.open`; anything may import it.
ANYONE = {"tracekit"}


def _modules():
    for base, prefix in (
        (ROOT / "tracekit", "tracekit"),
        (ROOT / "parsers", "tracekit.parsers"),
        (ROOT / "rules", "tracekit.rules"),
    ):
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join([prefix, *parts]), path


def _layer_of(module: str) -> tuple[int, str] | None:
    for level, spec in enumerate(LAYERS):
        for name in (s.strip() for s in spec.split("|")):
            if module == name or module.startswith(name + "."):
                return level, name
    return None


def _imports(module: str, path: Path):
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:  # `from tracekit import db` imports the module tracekit.db
                yield node.lineno, f"{target}.{alias.name}"


def test_every_module_has_a_layer():
    assert [m for m, _ in _modules() if m not in ANYONE and _layer_of(m) is None] == []


def test_imports_point_down_the_layers():
    broken = []
    for module, path in _modules():
        if module in ANYONE:
            continue
        level, own = _layer_of(module)
        for line, target in _imports(module, path):
            if not target.startswith("tracekit.") or target in ANYONE:
                continue
            found = _layer_of(target)
            if found is None:
                continue  # `from tracekit.x import name`: the module form is checked on its own
            target_level, target_layer = found
            if target_level < level or (target_level == level and target_layer != own):
                broken.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {target}")
    assert broken == []


def test_the_check_sees_an_upward_import(tmp_path):
    """The checker itself: a low layer importing a high one is caught."""
    fake = tmp_path / "m.py"
    fake.write_text("def f():\n    from tracekit.cli import main\n")
    targets = [t for _, t in _imports("tracekit.db.fake", fake)]
    assert "tracekit.cli" in targets
    assert _layer_of("tracekit.cli")[0] < _layer_of("tracekit.db.fake")[0]
