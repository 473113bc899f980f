"""The nodes of a job, for node-affine plans (:mod:`.affinity`): :class:`Nodes`, and
:func:`resolve_nodes`, which reads them from the launcher's environment at an entry point."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

from ..errors import ConfigError


@dataclass(frozen=True)
class Nodes:
    """``count`` nodes of ``ranks_per_node`` ranks each; rank ``r`` is on node ``r // ranks_per_node``."""

    count: int
    ranks_per_node: int

    def __post_init__(self) -> None:
        for name in ("count", "ranks_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ConfigError(f"nodes: {name} must be a positive integer, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.count * self.ranks_per_node

    def node_of(self, rank: int) -> int:
        """The node of ``rank``."""
        return rank // self.ranks_per_node


def ranks_per_node(env: Mapping[str, str]) -> Optional[int]:
    """Training processes per node as the launcher says: ``LOCAL_WORLD_SIZE`` (torchrun), else
    ``SLURM_NTASKS_PER_NODE`` (srun; its first number), else None."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        text = env.get(name, "").split("(", 1)[0].split(",", 1)[0]
        if text.strip().isdigit() and int(text) > 0:
            return int(text)
    return None


def resolve_nodes(rank: int, world_size: int, env: Mapping[str, str], nodes: Optional[int] = None) -> Nodes:
    """The :class:`Nodes` of a job, at an entry point: ``nodes`` given (the world split in that
    many), else from the launcher's environment (``LOCAL_WORLD_SIZE``, ``SLURM_NTASKS_PER_NODE``;
    none: one node). The node the launcher names for this rank (``GROUP_RANK``, ``SLURM_NODEID``)
    must be the one the block placement gives it, else a :class:`ConfigError`."""
    if nodes is not None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1 or world_size % nodes:
            raise ConfigError(f"nodes must be a positive integer dividing the world size {world_size}, got {nodes!r}")
        layout = Nodes(nodes, world_size // nodes)
    else:
        per = ranks_per_node(env)
        if per is None:
            return Nodes(1, world_size)
        if world_size % per:
            raise ConfigError(f"{world_size} ranks are not whole nodes of {per} ranks (LOCAL_WORLD_SIZE / "
                              "SLURM_NTASKS_PER_NODE)", hint="node-affine plans need the same number of ranks on "
                                                            "every node")
        layout = Nodes(world_size // per, per)
    for name in ("GROUP_RANK", "SLURM_NODEID"):
        if name in env:
            try:
                named = int(env[name])
            except ValueError:
                raise ConfigError(f"{name} is not an integer: {env[name]!r}") from None
            if named != layout.node_of(rank):
                raise ConfigError(f"rank {rank} runs on node {named} ({name}), but node-affine plans place it on node "
                                  f"{layout.node_of(rank)} (ranks {layout.ranks_per_node} to a node, in blocks)",
                                  hint="start ranks in blocks per node (torchrun does; srun --distribution=block)")
            break
    return layout


__all__ = ["Nodes", "ranks_per_node", "resolve_nodes"]
