"""Shared fixtures: tiny random models of every family, saved as local folders.

Hub weights cannot be downloaded here, so every loading path is exercised on
folders written by ``save_pretrained``.  HF_HUB_OFFLINE keeps the tests from
probing the network.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# ``make test`` runs the suite in two pytest-xdist workers, one a core.  Each worker (and
# every probe process a test starts, which inherits this) then computes on one thread:
# two workers of two OpenMP threads each on two cores would make every parallel region
# wait for a descheduled thread.  Tests of the thread count set theirs explicitly.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")
# The self-test's memory of passed checks (probe.surgery.self_test.verify): one fresh folder per test
# session, so no run depends on what an earlier one (or the user's ~/.cache) remembered.
os.environ["PROBE_CACHE_DIR"] = __import__("tempfile").mkdtemp(prefix="probe-cache-")

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.reference.tiny import FAMILIES, tiny_model  # noqa: E402

SLOW = os.environ.get("PROBE_SLOW", "0") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    if SLOW:
        return
    skip = pytest.mark.skip(reason="slow check; set PROBE_SLOW=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_folders(tmp_path_factory) -> dict[str, str]:
    """family -> a save_pretrained folder of a tiny random model (float32, no tokenizer)."""
    root = tmp_path_factory.mktemp("tiny")
    folders = {}
    for family in FAMILIES:
        folder = root / f"tiny-{family}"
        tiny_model(family, seed=1, dtype=torch.float32).save_pretrained(folder)
        folders[family] = str(folder)
    return folders


@pytest.fixture(scope="session")
def minilm_tokenizer():
    from transformers import AutoTokenizer

    from probe.loading import minilm_path

    return AutoTokenizer.from_pretrained(minilm_path())


@pytest.fixture(scope="session")
def tiny_bert_with_tokenizer(tmp_path_factory, minilm_tokenizer) -> str:
    """A tiny BERT over the real bert-base-uncased vocabulary, saved with its tokenizer."""
    from transformers import BertConfig, BertModel

    folder = tmp_path_factory.mktemp("tok") / "tiny-bert-tok"
    config = BertConfig(
        vocab_size=minilm_tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=256,
    )
    torch.manual_seed(3)
    BertModel(config).save_pretrained(folder)
    minilm_tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def tiny_family_folder(tmp_path_factory):
    """family -> a save_pretrained folder of its tiny random model (float32), made on demand."""
    from tests.reference.tiny import tiny_spec_model

    root = tmp_path_factory.mktemp("tiny-families")
    made: dict[str, str] = {}

    def folder(family: str) -> str:
        if family not in made:
            path = root / f"tiny-{family}"
            tiny_spec_model(family, seed=1, dtype=torch.float32).save_pretrained(path)
            made[family] = str(path)
        return made[family]

    return folder


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    """Inputs good and hostile for every kind of value (tests/cli_world.py): (root, pools).

    ``PROBE_WORLD=DIR`` keeps the world in DIR across runs (build_world skips what is
    there), so a long fuzz split over many pytest runs builds it once.
    """
    from tests.cli_world import build_world

    kept = os.environ.get("PROBE_WORLD")
    root = Path(kept) if kept else tmp_path_factory.mktemp("world")
    return root, build_world(root)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> str:
    """A local HuggingFace cache of ``probe-test/tiny-gpt2``: revisions step1 and step2 (two
    tiny GPT-2s of one config, other seeds) and main, which is step1's commit; read offline."""
    import huggingface_hub.constants

    from probe.loading import hub

    repo = tmp_path / "models--probe-test--tiny-gpt2"
    (repo / "refs").mkdir(parents=True)
    for seed, revision in enumerate(("step1", "step2")):
        commit = f"{seed + 1:040x}"
        (repo / "refs" / revision).write_text(commit)
        tiny_model("gpt2", seed=seed).save_pretrained(repo / "snapshots" / commit)
    (repo / "refs" / "main").write_text(f"{1:040x}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: False)
    return "probe-test/tiny-gpt2"
