"""The paper's trained toy experiments: a small post-LN attention network, its paths, the tasks.

``model`` (the network and its restricted forward), ``tasks`` (data
generators), ``train`` (training and path evaluation).  The analyses that
combine them into Datasets live in ``probe.analyses.toy``.
"""

from .model import ToyConfig, ToySAN

__all__ = ["ToyConfig", "ToySAN"]
