"""The NVIDIA GPUs the PCI bus lists, read from sysfs: what NVML's count is checked against.

A GPU that fell off the bus or failed to initialise before the agent started is simply absent
from NVML's enumeration; the PCI bus still lists its function (gpud's `gpu-counts` compares
the two the same way). A GPU is a function of vendor 0x10de whose class is a 3D controller
(0x0302, data-centre GPUs) or a VGA controller (0x0300); NVSwitches (0x0680, bridge) are not,
and neither is a GPU bound to another driver than `nvidia` (vfio-pci passes it to a VM). A GPU
bound to no driver counts: that is how one that failed to initialise looks.
"""

from __future__ import annotations

import pathlib

NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = frozenset({0x0302, 0x0300})
"""PCI base class and subclass: 3D controller, VGA-compatible controller."""


def nvidia_gpus(root: pathlib.Path) -> tuple[str, ...] | None:
    """The PCI addresses (`0000:18:00.0`) of the NVIDIA GPUs under `root`; None if unreadable.

    `root` is `/sys/bus/pci/devices` on a node (a setting, so tests point it at a fixture
    directory): one entry per function, each with `vendor` (`0x10de`) and `class`
    (`0x030200`) files.
    """
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return None
    found: list[str] = []
    for entry in entries:
        try:
            vendor = int((entry / "vendor").read_text().strip(), 16)
            klass = int((entry / "class").read_text().strip(), 16)
        except (OSError, ValueError):
            continue
        if vendor != NVIDIA_VENDOR or (klass >> 8) not in GPU_CLASSES:
            continue
        driver = entry / "driver"
        if driver.is_symlink() and driver.resolve().name != "nvidia":
            # Bound to another driver on purpose (vfio-pci for a VM): not NVML's to list.
            continue
        found.append(entry.name)
    return tuple(found)
