"""Silencing transformers while probe builds or loads a model.

transformers and huggingface_hub report on every load: progress bars, advice on
unused weights, deprecation warnings.  None of it is meant for probe's user, who
gets probe's own one-line messages instead.  This module depends on nothing of
probe's, so both the loaders (:mod:`probe.loading`) and the memory estimates
(:mod:`probe.requests.memory`, which builds models on the meta device) can use it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings


@contextlib.contextmanager
def quiet():
    """Silence transformers' progress bars and advice while loading."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
