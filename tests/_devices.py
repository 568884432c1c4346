"""Devices the tests fabricate: GPU models this CPU machine does not have."""

from __future__ import annotations

import dataclasses

from tunesvc.device import Device

#: an H100 SXM as tune.db.example's sweeps saw it
H100 = Device(
    kind="cuda",
    name="NVIDIA H100 80GB HBM3",
    capability="9.0",
    sm_count=132,
    memory_bytes=80 << 30,
    max_shared_memory=232448,
    max_num_regs=65536,
    driver="580.00",
    cuda="13.0",
    torch="2.11.0",
    triton="3.6.0",
)
#: its sibling: the same architecture and SM count, another model
H200 = dataclasses.replace(H100, name="NVIDIA H200", memory_bytes=141 << 30)
