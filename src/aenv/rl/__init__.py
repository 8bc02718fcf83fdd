"""aenv's RL plane, the trainer's side: `from aenv.rl import RL` (docs/rl.md).

Nothing here imports the node (`aenv.rl.server` is the node's side)."""

from aenv.rl.client import RL, Background, Evaluation, File, Group, Lease, Member, RLError, Setup

__all__ = ["RL", "Background", "Evaluation", "File", "Group", "Lease", "Member", "RLError", "Setup"]
