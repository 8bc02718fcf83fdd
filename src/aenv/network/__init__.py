"""aenv network plane: per-sandbox network slots.

A slot is a network namespace holding the guest's tap (`tap0`, same addresses and MACs in
every slot) and reached from the host through a veth with a unique 198.18.x.y /30; TCP to
the slot address is DNAT-ed to the guest. The guest can start no connection unless its
sandbox's egress policy (`egress.py`) opens some destinations.
"""

from aenv.network.addressing import (
    GATEWAY_ADDR,
    GUEST_ADDR,
    GUEST_MAC,
    GUEST_NETMASK,
    GUEST_PREFIXLEN,
    TAP_MAC,
    TAP_NAME,
    SlotNaming,
    guest_ip_cmdline,
)
from aenv.network.egress import EgressPolicy, EgressPolicyError
from aenv.network.pool import (
    SlotPool,
    SlotPoolError,
    SlotPoolExhausted,
    default_uid_for_index,
    list_owned,
    reclaim_orphans,
)
from aenv.network.slot import (
    Slot,
    create_slot,
    destroy_slot,
    open_slot_tap,
    reset_slot,
    set_egress,
    slot_for,
)

__all__ = [
    "GATEWAY_ADDR",
    "GUEST_ADDR",
    "GUEST_MAC",
    "GUEST_NETMASK",
    "GUEST_PREFIXLEN",
    "TAP_MAC",
    "TAP_NAME",
    "EgressPolicy",
    "EgressPolicyError",
    "Slot",
    "SlotNaming",
    "SlotPool",
    "SlotPoolError",
    "SlotPoolExhausted",
    "create_slot",
    "default_uid_for_index",
    "destroy_slot",
    "guest_ip_cmdline",
    "list_owned",
    "open_slot_tap",
    "reclaim_orphans",
    "reset_slot",
    "set_egress",
    "slot_for",
]
