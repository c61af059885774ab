"""Every size the domain accepts has a bound; this is where they are written down.

The GraphQL cost model (schema/limits.py) counts list fields by these same numbers, so a
query's estimated cost is an upper bound on what it can return, not a guess.
"""

from __future__ import annotations

from typing import Final

# Resources in one quota map (ownerQuota, an offer's quota, a reservation's resources),
# and quota rows one tenant may hold on one pool across all its offers.
MAX_RESOURCES: Final = 16
# Offers on one pool, the owner's own included.
MAX_OFFERS_PER_POOL: Final = 100
# Capacity rows of one pool: gpu, plus gpu.mig or gpu.slot (app/capacity/rollup.py).
MAX_CAPACITY_ROWS: Final = 3
# Tenants losing access and reservations one dry run lists (unoffer, archive); past it
# the impact is cut there and says `truncated: true`.
MAX_IMPACT_ITEMS: Final = 100
