"""Enums for the seed's closed sets. GraphQL names map one to one to the REST strings
(`METAL_HOST` = `metal-host`); each value's description is the seed's meaning."""

from __future__ import annotations

from enum import Enum

import strawberry


@strawberry.enum(description="What a pool's machines are and who runs them (`class`).")
class PoolClass(Enum):
    METAL_HOST = strawberry.enum_value("metal-host", description="Bare-metal hosts.")
    METAL_DEDICATED = strawberry.enum_value(
        "metal-dedicated", description="Bare-metal machines dedicated to one tenant."
    )
    VPS_HOST = strawberry.enum_value("vps-host", description="Hosts that run virtual servers.")
    PROVIDER = strawberry.enum_value(
        "provider",
        description="Capacity rented from a provider account; needs providerAccountId and "
        "agent NONE.",
    )


@strawberry.enum(description="How a pool's GPUs are shared (`sharing`); default EXCLUSIVE.")
class Sharing(Enum):
    EXCLUSIVE = strawberry.enum_value("exclusive", description="Whole GPUs, one booking each.")
    MIG = strawberry.enum_value(
        "mig", description="GPUs split into MIG instances (the gpu.mig resource)."
    )
    TIMESLICE = strawberry.enum_value(
        "timeslice", description="GPUs time-sliced into shared slots (the gpu.slot resource)."
    )
    MPS = strawberry.enum_value(
        "mps", description="GPUs shared through CUDA MPS slots (the gpu.slot resource)."
    )


@strawberry.enum(description="The node agent a pool's machines run (`agent`).")
class Agent(Enum):
    BCD = strawberry.enum_value("bcd", description="The Better Compute daemon; the default.")
    NONE = strawberry.enum_value(
        "none", description="No agent; the default and only choice for provider pools."
    )


@strawberry.enum(description="Whether a reservation still holds its bookings.")
class ReservationState(Enum):
    ACTIVE = strawberry.enum_value("active", description="Booked against quota and capacity.")
    ENDED = strawberry.enum_value("ended", description="Released; its bookings were returned.")
