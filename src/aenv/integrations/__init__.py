"""Trainer adapters over `aenv.rl` (docs/rl.md): each imports its trainer's package, so each
module is imported only by that trainer (`aenv.integrations.harbor`, ...). Nothing here
imports the node."""
