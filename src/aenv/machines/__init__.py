"""aenv machines plane: the VM lifecycle (restore, pause tiers, fork, pools, adoption) and the
node's client of the guest agent, behind `api.Runtime`."""
