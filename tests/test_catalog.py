"""The presets that ship (`catalog.list_presets`): the cross-tokenizer pairs, the one offered only
when the optional Gemma package is installed (found without importing it), and their models named
so that they resolve with no network."""

import importlib.util
import json
import sys

import pytest

from specviz import catalog
from specviz.errors import SpecvizError
from specviz.models.sources import BUILTINS, resolve_source
from specviz.settings import parse_draft

GEMMA_PACKAGE = BUILTINS["gemma-3-270m"].module
GEMMA_PAIR = "Gemma-3-270M drafted by SmolLM2-135M (offline, cross-tokenizer)"


def with_gemma(monkeypatch, present: bool):
    """`importlib.util.find_spec` as if the Gemma package were (not) installed."""
    real = importlib.util.find_spec

    def find_spec(name, *args):
        if name == GEMMA_PACKAGE:
            return real(name, *args) if present else None
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.skipif(importlib.util.find_spec(GEMMA_PACKAGE) is None, reason="the Gemma package is not installed")
def test_the_offline_cross_tokenizer_pair_is_offered_when_gemma_is_installed(monkeypatch):
    imported_before = GEMMA_PACKAGE in sys.modules
    presets = {p["name"]: p for p in catalog.list_presets()}
    pair = presets[GEMMA_PAIR]
    assert (pair["target"], pair["draft"], pair["offline"]) == ("gemma-3-270m", "SmolLM2-135M-Instruct", True)
    # Both are the built-in models: no hub access, and nothing was imported to find the package.
    assert resolve_source(pair["target"]).kind == resolve_source(pair["draft"]).kind == "builtin"
    assert (GEMMA_PACKAGE in sys.modules) == imported_before


def test_without_the_gemma_package_its_pair_is_not_offered(monkeypatch):
    with_gemma(monkeypatch, present=False)
    names = [p["name"] for p in catalog.list_presets()]
    assert GEMMA_PAIR not in names
    # Nor its prompt-lookup preset: a Space's visitor could not install the package (docs/models.md says how).
    assert "Gemma-3-270M + prompt lookup" not in names and "SmolLM2-135M + prompt lookup" in names


def test_hub_pairs_of_the_universal_assisted_generation_kind_resolve_offline():
    across = [p for p in catalog.list_presets() if "cross-tokenizer" in p["name"] and not p["offline"]]
    assert {(p["target"], p["draft"]) for p in across} == {
        ("microsoft/Phi-3-medium-128k-instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
        ("microsoft/Phi-3.5-mini-instruct", "SmolLM2-135M-Instruct")}
    for preset in across:
        assert resolve_source(preset["target"]).kind == "hub"          # a hub id, nothing fetched to say so
        assert resolve_source(preset["draft"]).kind in ("hub", "builtin")
        assert parse_draft(preset["draft"]).kind == "model"
        # A small model of another family: the target has no small sibling with its tokenizer.
        target, draft = (resolve_source(name).name.split("-")[0] for name in (preset["target"], preset["draft"]))
        assert target != draft


def test_a_preset_requiring_a_dotted_name_is_refused(tmp_path):
    path = tmp_path / "presets.json"
    preset = dict(name="x", target="a/b", draft="ngram", description="", offline=False, k=4, notes="")
    path.write_text(json.dumps([dict(preset, requires="some.module")]))
    with pytest.raises(SpecvizError, match="must name a top-level package"):
        catalog.list_presets(path)
    path.write_text(json.dumps([dict(preset, requires="no_such_package_here"), dict(preset, name="y")]))
    assert [p["name"] for p in catalog.list_presets(path)] == ["y"]
