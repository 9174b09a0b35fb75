"""docs/adding-a-family.md followed from scratch: its worked example (Starcoder2) is removed
from copies of the registry and of the tiny configs in a temporary folder, added back from
the page's own code blocks, and run through every check the page names.

What the page says a family is (an entry, a tiny config, a reference entry, nothing else)
is what this test uses: the copies are imported as modules of their own, the copied entry
replaces the registered one for the test, and the checks are the library's and the tests'
own (the entry against the modules, the identities, the hooks against the independent
surgery, the path decomposition's reconstruction, ``probe check``).
"""

from __future__ import annotations

import copy
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import probe
from probe.analyses import paths
from probe.cli.app import app
from probe.models import ADAPTERS, SpecAdapter
from probe.models.conformance import check_entry
from probe.surgery.ablate import PRESETS
from probe.surgery.self_test import identities
from tests.reference.attention import register as register_reference_attention
from tests.reference.layers import reference_hidden_states

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "adding-a-family.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), re.S)


def _page_entry() -> str:
    """The entry the page adds: the item of its ``FAMILIES = (...)`` block."""
    [block] = [b for b in _blocks("py") if b.startswith("FAMILIES = (")]
    body = block.split("    ...,\n", 1)[1].rsplit("\n)", 1)[0]
    return body.rstrip() + "\n"


def _page_tiny_config() -> str:
    [block] = [b for b in _blocks("py") if b.startswith('"starcoder2": (')]
    return block


def _import(path: Path, name: str, package: str | None = None):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if package is not None:
        module.__package__ = package
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """(the copied registry's module, the copied tiny configs' module), Starcoder2 added
    back from the page."""
    folder = tmp_path_factory.mktemp("adding-a-family")
    registry = (ROOT / "probe" / "models" / "families.py").read_text()
    registry, removed = re.subn(
        r'\n    # The worked example[^\n]*\n    decoder\(\n        "starcoder2".*?\n    \),\n',
        "\n",
        registry,
        flags=re.S,
    )
    assert removed == 1, "the registry's Starcoder2 entry was not found to remove"
    end = registry.index("\n)\n\n#: model_type -> why probe refuses it")
    registry = registry[:end] + "\n" + _page_entry().rstrip("\n") + registry[end:]
    (folder / "families_copy.py").write_text(registry)
    tiny = (ROOT / "tests" / "reference" / "tiny.py").read_text()
    tiny, removed = re.subn(r'\n    "starcoder2": \([^\n]*\),', "", tiny)
    assert removed == 1, "the tiny configs' Starcoder2 line was not found to remove"
    at = tiny.index("TINY_CONFIGS: dict[str, tuple[str, dict]] = {\n") + len(
        "TINY_CONFIGS: dict[str, tuple[str, dict]] = {\n"
    )
    tiny = tiny[:at] + "    " + _page_tiny_config().strip() + "\n" + tiny[at:]
    (folder / "tiny_copy.py").write_text(tiny)
    families = _import(folder / "families_copy.py", "probe.models.families_copy", "probe.models")
    configs = _import(folder / "tiny_copy.py", "tiny_copy")
    return families, configs


@pytest.fixture
def starcoder2(copies, monkeypatch, tmp_path):
    """The tiny Starcoder2 of the copied configs, with the copied entry registered."""
    families, configs = copies
    [entry] = [f for f in families.FAMILIES if f.name == "starcoder2"]
    monkeypatch.setitem(ADAPTERS, "starcoder2", SpecAdapter(entry))
    monkeypatch.setenv("PROBE_CACHE_DIR", str(tmp_path / "cache"))
    return entry, configs.tiny_spec_model("starcoder2")


def test_the_page_adds_back_the_entry_and_the_config_the_registry_has(copies):
    families, configs = copies
    [entry] = [f for f in families.FAMILIES if f.name == "starcoder2"]
    assert entry == ADAPTERS["starcoder2"].spec
    from tests.reference.tiny import TINY_CONFIGS

    assert configs.TINY_CONFIGS["starcoder2"] == TINY_CONFIGS["starcoder2"]


def test_the_added_family_passes_every_check(starcoder2, tmp_path):
    entry, model = starcoder2
    check_entry(entry, model)
    probed = probe.wrap(model)
    found = identities(probed)
    assert [i.error for i in found] == [""] * len(found)
    eps = torch.finfo(torch.float64).eps
    # A few float64 roundings, or the identity's own stated bound (probe's attention
    # against the model's own, whose softmax runs in float32: probe.surgery.core_check).
    assert all(i.max_diff <= max(4 * eps * i.scale, i.bound) for i in found), found
    # The hooks against the independent surgery, with padding, for the four variants.
    ids = torch.randint(3, 80, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    reference = copy.deepcopy(model)
    if entry.float32_softmax:  # probe keeps float64 in the softmax; so does the reference
        reference.config._attn_implementation = register_reference_attention()
    for name in ("SAN", "SAN+MLP", "SAN+skip", "transformer"):
        ablation = PRESETS[name]
        got = probe.hidden_states(probed, ids, ablation, attention_mask=mask)
        want = reference_hidden_states(
            reference,
            {"input_ids": ids, "attention_mask": mask, "use_cache": False},
            attn_skip=ablation.attn_skip,
            mlp=ablation.mlp,
        )
        for g, w in zip(got, want, strict=True):
            real = mask.bool()
            assert torch.equal(g[real], w[real]), name
    # The path decomposition reconstructs its run (it refuses otherwise).
    ds = paths.decompose(probed, init="pretrained", sequences=2, tokens=6)
    assert float(ds["reconstruction_error"].max()) < 1e-6
    # ... and `probe check` on a folder of it says so.
    folder = tmp_path / "tiny-starcoder2"
    model.save_pretrained(folder)
    result = CliRunner().invoke(app, ["check", str(folder)])
    assert result.exit_code == 0, result.output
    assert "all identities hold" in result.stdout
