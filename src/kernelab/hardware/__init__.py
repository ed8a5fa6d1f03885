"""Device facts: datasheet peaks, occupancy limits, device detection. Imports nothing of ours."""

from kernelab.hardware.devices import DEVICES, DeviceInfo, DeviceSpec, detect, lookup
from kernelab.hardware.occupancy import LIMITS, Occupancy, occupancy

__all__ = [
    "DEVICES",
    "LIMITS",
    "DeviceInfo",
    "DeviceSpec",
    "Occupancy",
    "detect",
    "lookup",
    "occupancy",
]
