"""The cache's tiers: where an entry's state is held."""

from __future__ import annotations

DEVICE = "device"  # tensors on the device the model runs on
HOST = "host"  # tensors in CPU memory (the offload tier)
DISK = "disk"  # files only (the optional disk tier)
TIERS = (DEVICE, HOST, DISK)
MEMORY_TIERS = (DEVICE, HOST)
