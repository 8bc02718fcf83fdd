"""aenv's RL plane, the trainer's side: `from aenv.rl import RL` (docs/rl.md).

Nothing here imports the node (`aenv.rl.server` is the node's side). `GymEnv` needs
gymnasium, imported when it is first used."""

from aenv.rl.client import (
    RL,
    Background,
    Evaluation,
    File,
    Group,
    Lease,
    Member,
    RLError,
    Setup,
)


def __getattr__(name: str) -> object:
    if name == "GymEnv":
        from aenv.rl.gym import GymEnv

        return GymEnv
    raise AttributeError(name)


__all__ = ["RL", "Background", "Evaluation", "File", "Group", "GymEnv", "Lease", "Member",
           "RLError", "Setup"]  # fmt: skip
